"""What every response of the dashboard carries and what every request must show: the security
headers, and HTTP Basic authentication when the dashboard has credentials, its failures logged
and throttled per client address (:mod:`._throttle`).

Both are plain ASGI middleware, so they wrap the static file, the error pages and the 404s as
well as the pages: nothing the app serves escapes them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sqla_jobs.dashboard._throttle import Throttle, client_key

log = logging.getLogger("sqla_jobs.dashboard")

#: Sent with every response. The CSP forbids scripts, inline styles, frames and foreign forms:
#: the pages have none, and an injected one would not run.
HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; "
        b"frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    # Pages show jobs' errors and state: no proxy or browser cache keeps a copy.
    (b"cache-control", b"no-store"),
)
#: Where :class:`BasicAuth` leaves the name of the authenticated user, for the audit log.
USER_KEY = "sqla_jobs.dashboard.user"
REALM = b'Basic realm="sqla-jobs dashboard", charset="UTF-8"'


class SecurityHeaders:
    """Adds :data:`HEADERS` to every HTTP response, replacing any the app set itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": [*kept, *HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def client_address(scope: Scope) -> str:
    """The address the request came from, as the server saw it (``-`` if it does not say)."""
    client = scope.get("client")
    return str(client[0]) if client else "-"


class BasicAuth:
    """Answers 401 with a ``WWW-Authenticate`` challenge to any HTTP request without the right
    user and password (compared in constant time, both of them, whatever the first gave).

    A request that sent credentials and failed is logged (the client address, whether the user
    name was right, a keyed hash of the name: people type passwords there; never the password)
    and counted against its address in ``throttle``; an address over the limit gets 429 with
    ``Retry-After`` and its credentials are not even checked. The first challenge, a request
    without an ``Authorization`` header, is no failure: every browser starts with one.
    """

    def __init__(
        self, app: ASGIApp, *, user: str, password: str, throttle: Throttle | None = None
    ) -> None:
        self.app = app
        self._user = user.encode()
        self._password = password.encode()
        self._throttle = throttle if throttle is not None else Throttle()
        # Per process: lines of one log can be matched, a name cannot be looked up in a table.
        self._hash_key = secrets.token_bytes(16)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = client_address(scope)
        key = client_key(client)
        wait = self._throttle.retry_after(key)
        if wait is not None:
            await _too_many(send, wait)
            return
        header = dict(scope["headers"]).get(b"authorization")
        name, user_ok, ok = self._check(header or b"")
        if not ok:
            if header is not None:
                self._failed(client, key, name, user_ok)
            await _challenge(send)
            return
        scope[USER_KEY] = name.decode(errors="replace")
        await self.app(scope, receive, send)

    def _check(self, header: bytes) -> tuple[bytes, bool, bool]:
        """The user name ``header`` gives (empty if none), whether it is the right one, and
        whether the user and the password both are."""
        scheme, _, encoded = header.partition(b" ")
        if scheme.lower() != b"basic":
            return b"", False, False
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return b"", False, False
        user, sep, password = decoded.partition(b":")
        # Both comparisons always run: which one failed must not show in the time taken.
        user_ok = secrets.compare_digest(user, self._user)
        password_ok = secrets.compare_digest(password, self._password)
        return user, user_ok, bool(sep and user_ok and password_ok)

    def _failed(self, client: str, key: str, name: bytes, user_ok: bool) -> None:
        digest = hmac.new(self._hash_key, name, hashlib.sha256).hexdigest()
        log.warning(
            "failed sign-in from %s: %s (user name hash %s)",
            client,
            "wrong password" if user_ok else "unknown user name",
            digest[:8],
            extra={"event": "dashboard_auth_failed"},
        )
        if self._throttle.failed(key):
            log.warning(
                "refusing sign-ins from %s for %d s: %d failures",
                key,
                self._throttle.window,
                self._throttle.limit,
                extra={"event": "dashboard_auth_throttled"},
            )


async def _challenge(send: Send) -> None:
    await _plain(send, 401, b"Authentication required.\n", [(b"www-authenticate", REALM)])


async def _too_many(send: Send, wait: int) -> None:
    body = f"Too many failed sign-ins from this address: try again in {wait} s.\n".encode()
    await _plain(send, 429, body, [(b"retry-after", str(wait).encode())])


async def _plain(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                *headers,
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
