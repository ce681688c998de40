"""The one-line message an action leaves for the page it redirects to ("retried 1 job: 4", or
why nothing changed): a signed cookie, read and cleared by the next page. Never the URL, which
ends up in logs and histories; signed, so that nothing but this app can make it say anything.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Literal

from starlette.requests import Request
from starlette.responses import Response

from sqla_jobs.dashboard._csrf import cookie_path

COOKIE = "sqla_jobs_flash"
#: Longer messages are cut: a cookie holds 4 KB at most.
MAX_CHARS = 1500
Level = Literal["ok", "error"]


@dataclass(frozen=True)
class Flash:
    """A message for the next page: ``ok`` (what changed) or ``error`` (why nothing did)."""

    level: Level
    text: str


class Flashes:
    """Writes and reads the flash cookie of one app, signed under its ``secret``."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _sign(self, data: bytes) -> str:
        return hmac.new(self._secret, b"flash:" + data, hashlib.sha256).hexdigest()

    def put(self, request: Request, response: Response, flash: Flash) -> None:
        """Leave ``flash`` for the next page."""
        text = flash.text if len(flash.text) <= MAX_CHARS else flash.text[: MAX_CHARS - 3] + "..."
        data = json.dumps({"level": flash.level, "text": text}).encode()
        value = base64.urlsafe_b64encode(data).decode().rstrip("=") + "." + self._sign(data)
        response.set_cookie(
            COOKIE,
            value,
            path=cookie_path(request),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def read(self, request: Request) -> Flash | None:
        """The message left for this page, if any and if this app signed it."""
        value = request.cookies.get(COOKIE)
        if value is None:
            return None
        encoded, _, signature = value.partition(".")
        try:
            data = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        except (binascii.Error, ValueError):
            return None
        if not hmac.compare_digest(signature, self._sign(data)):
            return None
        try:
            decoded = json.loads(data)
            level, text = decoded["level"], decoded["text"]
        except (ValueError, KeyError, TypeError):
            return None
        if level not in ("ok", "error") or not isinstance(text, str):
            return None
        return Flash(level, text)

    def clear(self, request: Request, response: Response) -> None:
        """Clear the message once a page has shown it (or found it unreadable)."""
        if COOKIE in request.cookies:
            response.delete_cookie(COOKIE, path=cookie_path(request))
