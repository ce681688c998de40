"""The names the dashboard answers to: every request's ``Host`` must be one of them, and the
origin a browser says a POST came from must be one of them too.

Without it, a web page whose DNS name an attacker rebinds to 127.0.0.1 is, to the browser, the
same origin as the dashboard on this machine: its requests arrive with ``Host: attacker.example``
and a matching ``Origin``. Refusing the Host is what stops them, before authentication or any
route runs. Entries are ``NAME[:PORT]``, compared exactly with the ``Host`` header (lower-cased):
Starlette's ``TrustedHostMiddleware`` drops the port and splits ``[::1]:8000`` at the wrong colon,
so this is a middleware of its own.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from sqla_jobs.errors import ConfigurationError

log = logging.getLogger("sqla_jobs.dashboard")

#: A DNS name without a trailing dot (``localhost.`` is another name to a browser, and a cookie
#: set for it is not the dashboard's), or a dotted IPv4 address.
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")
_ENTRY = re.compile(r"(?P<host>\[[0-9a-f:.]+\]|[^:\[\]]+)(:(?P<port>[0-9]{1,5}))?")
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def host_entry(value: str) -> str:
    """``value`` (``NAME[:PORT]``, an IPv6 address in brackets) as the dashboard compares it
    with a ``Host`` header, or a :class:`ConfigurationError` naming what is wrong with it."""
    entry = value.strip().lower()
    found = _ENTRY.fullmatch(entry)
    problem = None
    if found is None:
        problem = "it is not NAME[:PORT] (an IPv6 address goes in brackets: [::1]:8000)"
    elif found.group("port") is not None and not 0 < int(found.group("port")) < 65536:
        problem = "its port is not 1-65535"
    elif found.group("host").startswith("["):
        try:
            ipaddress.IPv6Address(found.group("host")[1:-1])
        except ValueError:
            problem = "what is in brackets is not an IPv6 address"
    elif not _NAME.fullmatch(found.group("host")):
        problem = "its name is not a DNS name or an IPv4 address (and has no trailing dot)"
    if problem is not None:
        raise ConfigurationError(f"the dashboard's allowed host {value!r} is refused: {problem}")
    return entry


def host_entries(values: Iterable[str]) -> frozenset[str]:
    """:func:`host_entry` of each of ``values``; a :class:`ConfigurationError` if there is none."""
    entries = frozenset(host_entry(v) for v in values)
    if not entries:
        raise ConfigurationError("the dashboard needs at least one allowed host")
    return entries


def foreign_origin(value: str, scheme: str, allowed: frozenset[str]) -> str | None:
    """``value`` (an ``Origin``, or a ``Referer``), reduced to its origin, when it is not one
    of ``allowed`` over the request's ``scheme``; None when it is.

    An ``http`` request accepts an ``https`` origin too: a TLS proxy in front may have ended
    the encryption. An ``https`` request accepts only ``https``.
    """
    if value == "null":  # a sandboxed frame, a file:// page, a redirect across origins
        return value
    parts = urlsplit(value)
    origin_scheme, netloc = parts.scheme.lower(), parts.netloc.lower()
    shown = f"{origin_scheme}://{netloc}"
    schemes = ("https",) if scheme == "https" else ("http", "https")
    if origin_scheme not in schemes or "@" in netloc or netloc not in allowed:
        return shown
    return None


class AllowedHosts:
    """Answers 400, with a short plain-text body, to any HTTP request whose ``Host`` header is
    not one of ``allowed`` (a missing one included); lets the others through untouched."""

    def __init__(self, app: ASGIApp, *, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = next((v for k, v in scope["headers"] if k == b"host"), b"")
        if host.decode("latin-1").lower() in self.allowed:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        log.warning(
            "refused a request for host %r from %s: not an allowed host (--allow-host)",
            host.decode("latin-1")[:100],
            client[0] if client else "-",
            extra={"event": "dashboard_wrong_host"},
        )
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = b"Unknown host: this dashboard does not answer to that name.\n"
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
