"""What every response of the dashboard carries and what every request must show: the security
headers, and HTTP Basic authentication when the dashboard has credentials.

Both are plain ASGI middleware, so they wrap the static file, the error pages and the 404s as
well as the pages: nothing the app serves escapes them.
"""

from __future__ import annotations

import base64
import binascii
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


class BasicAuth:
    """Answers 401 with a ``WWW-Authenticate`` challenge to any HTTP request without the right
    user and password (compared in constant time, both of them, whatever the first gave)."""

    def __init__(self, app: ASGIApp, *, user: str, password: str) -> None:
        self.app = app
        self._user = user.encode()
        self._password = password.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        user = self._authenticated(dict(scope["headers"]).get(b"authorization", b""))
        if user is None:
            await _challenge(send)
            return
        scope[USER_KEY] = user
        await self.app(scope, receive, send)

    def _authenticated(self, header: bytes) -> str | None:
        scheme, _, encoded = header.partition(b" ")
        if scheme.lower() != b"basic":
            return None
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        user, sep, password = decoded.partition(b":")
        # Both comparisons always run: which one failed must not show in the time taken.
        user_ok = secrets.compare_digest(user, self._user)
        password_ok = secrets.compare_digest(password, self._password)
        if not (sep and user_ok and password_ok):
            return None
        return user.decode(errors="replace")


async def _challenge(send: Send) -> None:
    body = b"Authentication required.\n"
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"www-authenticate", REALM),
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
