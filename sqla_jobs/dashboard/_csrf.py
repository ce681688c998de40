"""Cross-site request forgery: every state-changing request is a POST that carries a token only
a page of this dashboard can have given it.

Double submit, signed: the browser holds a random value in a cookie (HttpOnly, SameSite=Strict,
Secure over https), and each form carries the HMAC of that value under the app's secret. A POST
passes when its form's token is the HMAC of its cookie, compared in constant time. Another site
can make the browser send the cookie but can neither read it nor compute its HMAC; a cookie
planted from a sibling domain is useless without the secret. When the browser says where the
request came from (``Origin``, else ``Referer``), that must be one of the app's allowed hosts
(:mod:`._hosts`), scheme and port included; an app without that list (mounted in an application
that checks hosts itself) compares it with the request's ``Host``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from sqla_jobs.dashboard._hosts import foreign_origin

COOKIE = "sqla_jobs_csrf"
#: The form field that carries the token (never a URL: URLs end up in logs and histories).
FIELD = "csrf_token"
_NONCE = re.compile(r"[A-Za-z0-9_-]{43}")


class Csrf:
    """Issues and checks the tokens of one app, under its ``secret``; POSTs must come from one
    of ``allowed_hosts`` when it is given (see :mod:`._hosts`)."""

    def __init__(self, secret: bytes, allowed_hosts: frozenset[str] | None = None) -> None:
        self._secret = secret
        self._allowed = allowed_hosts

    def token(self, nonce: str) -> str:
        """The form token of the cookie value ``nonce``."""
        return hmac.new(self._secret, b"csrf:" + nonce.encode(), hashlib.sha256).hexdigest()

    def signed(self, nonce: str, purpose: str, *parts: str) -> str:
        """The signature of ``parts`` for ``purpose``, bound to the cookie value ``nonce``: a
        form field the app can check it wrote itself, for this browser, unchanged."""
        message = "\x00".join((purpose, nonce, *parts)).encode()
        return hmac.new(self._secret, b"signed:" + message, hashlib.sha256).hexdigest()

    def verified(self, request: Request, signature: object, purpose: str, *parts: str) -> bool:
        """Whether ``signature`` is :meth:`signed` of ``parts`` under the request's cookie."""
        nonce = request.cookies.get(COOKIE, "")
        if not _NONCE.fullmatch(nonce) or not isinstance(signature, str):
            return False
        expected = self.signed(nonce, purpose, *parts)
        # Bytes: compare_digest refuses a str that is not ASCII, which a forged form can send.
        return secrets.compare_digest(signature.encode(), expected.encode())

    def nonce(self, request: Request) -> tuple[str, bool]:
        """The request's cookie value, or a new one; and whether it is new (to be set)."""
        found = request.cookies.get(COOKIE, "")
        if _NONCE.fullmatch(found):
            return found, False
        return secrets.token_urlsafe(32), True

    def set_cookie(self, request: Request, response: Response, nonce: str) -> None:
        """Give the browser ``nonce``, for the app's own paths only."""
        response.set_cookie(
            COOKIE,
            nonce,
            path=cookie_path(request),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def refusal(self, request: Request, token: object) -> str | None:
        """Why a POST with form token ``token`` is refused, or None if it passes."""
        foreign = self._foreign_origin(request)
        if foreign is not None:
            return f"the request came from another site ({foreign})"
        nonce = request.cookies.get(COOKIE, "")
        if not _NONCE.fullmatch(nonce) or not isinstance(token, str) or not token:
            return "the form has no valid security token"
        if not secrets.compare_digest(token.encode(), self.token(nonce).encode()):
            return "the form's security token does not match"
        return None

    def _foreign_origin(self, request: Request) -> str | None:
        """The origin the browser gave (``Origin`` first, else the ``Referer``) when it is not
        an allowed one; None when it is, or when the browser gave neither."""
        for header in ("origin", "referer"):
            value = request.headers.get(header)
            if value is None:
                continue
            if self._allowed is None:
                return _foreign_to_host(request, value)
            return foreign_origin(value, request.url.scheme, self._allowed)
        return None


def cookie_path(request: Request) -> str:
    """The path the app is served under (where it is mounted), for its cookies."""
    return str(request.scope.get("root_path") or "") or "/"


def _foreign_to_host(request: Request, value: str) -> str | None:
    """``value``'s origin when its host and port are not the request's ``Host``."""
    host = request.headers.get("host", "").lower()
    # "null": a sandboxed frame, a file:// page, a redirect across origins.
    netloc = "" if value == "null" else urlsplit(value).netloc.lower()
    if not host or netloc != host:
        return value if value == "null" else f"{urlsplit(value).scheme}://{netloc}"
    return None
