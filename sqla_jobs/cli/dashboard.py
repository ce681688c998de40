"""``sqla-jobs dashboard``: serve the web dashboard (:mod:`sqla_jobs.dashboard`) with uvicorn.

Locked by default: it binds 127.0.0.1, and refuses any other address unless every request must
authenticate. The credentials come from the environment only (``SQLA_JOBS_DASHBOARD_USER`` and
``SQLA_JOBS_DASHBOARD_PASSWORD``), never from a flag, since a process's arguments show in ``ps``.
The access log is off: the dashboard logs the actions taken and refused itself.

It answers only to the names it was told (:func:`allowed_hosts`), so a web page whose DNS name
is rebound to this machine gets 400; and it ignores ``X-Forwarded-*`` unless
``--forwarded-allow-ips`` names the proxy, since uvicorn would otherwise trust them from
127.0.0.1, where a rebound page's requests come from too.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import re
import signal
import socket
from typing import Any

from sqla_jobs.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    CLIError,
    add_database_options,
    env,
    prepared_url,
)
from sqla_jobs.cli.reads import add_read_option, read_url, reading_url
from sqla_jobs.db.urls import redact
from sqla_jobs.errors import ConfigurationError
from sqla_jobs.jobs import Jobs

log = logging.getLogger("sqla_jobs.dashboard")

USER_VAR, PASSWORD_VAR = "SQLA_JOBS_DASHBOARD_USER", "SQLA_JOBS_DASHBOARD_PASSWORD"
HOSTS_VAR = "SQLA_JOBS_DASHBOARD_ALLOWED_HOSTS"
EXTRA = "pip install 'sqla-jobs[dashboard]'"
#: A host name the dashboard can take as it is (``gethostname`` may give one it cannot).
_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")


def is_local(host: str) -> bool:
    """Whether binding ``host`` keeps the dashboard on this machine (a loopback address or
    ``localhost``); anything else, ``0.0.0.0`` and ``::`` included, reaches the network."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str, port: int, extra: list[str]) -> list[str]:
    """The names the dashboard bound to ``host``:``port`` answers to: the loopback names with
    the port; the bound name or address when it is not a loopback one (for ``0.0.0.0`` and
    ``::``, this machine's host names); and ``extra`` as given (a proxy's name)."""
    names = ["127.0.0.1", "localhost", "[::1]"]
    if not is_local(host):
        bare = host.strip("[]").lower()
        if bare in ("0.0.0.0", "::", ""):
            found = {socket.gethostname().lower(), socket.getfqdn().lower()}
            names += sorted(n for n in found if _HOST_NAME.fullmatch(n))
            # An address is no name a rebound page can give, so this machine's are safe to add.
            names += [f"[{a}]" if ":" in a else a for a in _addresses(socket.gethostname())]
        else:
            names.append(f"[{bare}]" if ":" in bare else bare)
    # A browser leaves the port out of Host when it is the scheme's default.
    shown = [f"{n}:{port}" for n in names] + (names if port == 80 else [])
    return list(dict.fromkeys([*shown, *(e.strip() for e in extra if e.strip())]))


def _addresses(name: str) -> list[str]:
    """The addresses ``name`` resolves to, loopback ones aside (none if it does not resolve)."""
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    addresses = {str(info[4][0]).partition("%")[0] for info in found}
    return sorted(a for a in addresses if not is_local(a))


def credentials() -> tuple[str, str] | None:
    """The user and password from the environment; None if neither is set, a usage error if one
    is set without the other."""
    user, password = env("DASHBOARD_USER") or "", env("DASHBOARD_PASSWORD") or ""
    if not user and not password:
        return None
    if not user or not password:
        raise CLIError(f"set both {USER_VAR} and {PASSWORD_VAR}, or neither")
    if ":" in user:
        raise CLIError(
            f"{USER_VAR} cannot contain ':' (HTTP Basic separates user and password by it)"
        )
    return user, password


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (0: a free port), or a one-line error."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise CLIError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        # Listening before the URL is announced: a client that reads it can connect at once.
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise CLIError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port"
        ) from None
    return sock


def cmd_dashboard(args: argparse.Namespace) -> int:
    from sqla_jobs.cli import logfmt as _logging

    try:
        _logging.configure(args.log_level, args.log_format)
    except _logging.LoggingSetupError as exc:
        raise CLIError(str(exc)) from None
    auth = credentials()
    if auth is None and not is_local(args.host):
        raise CLIError(
            f"refusing to serve the dashboard on {args.host} without credentials: set "
            f"{USER_VAR} and {PASSWORD_VAR}, or bind 127.0.0.1"
        )
    try:
        import uvicorn

        from sqla_jobs.dashboard import create_app
    except ImportError as exc:
        raise CLIError(f"the dashboard needs its extra ({exc}): {EXTRA}") from None
    url = prepared_url(args)
    replica = read_url(args)
    if replica is not None:
        replica = reading_url(args)
    extra = [*(env("DASHBOARD_ALLOWED_HOSTS") or "").split(","), *args.allow_host]
    sock = listen(args.host, args.port)
    bound = sock.getsockname()[1]
    hosts = allowed_hosts(args.host, bound, extra)
    try:
        app = create_app(
            url,
            jobs=Jobs(schema=args.schema),
            read_only=args.read_only,
            show_payload=args.show_payload,
            credentials=auth,
            allowed_hosts=hosts,
            read_url=replica,
        )
    except ConfigurationError as exc:
        sock.close()
        raise CLIError(str(exc)) from None
    shown = f"[{args.host}]" if ":" in args.host else args.host
    log.info(
        "serving the dashboard on http://%s:%d/%s",
        shown,
        bound,
        " (read-only)" if args.read_only else "",
        extra={"event": "dashboard_started"},
    )
    log.info(
        "answering to hosts %s",
        ",".join(hosts),
        extra={"event": "dashboard_hosts"},
    )
    if replica is not None:
        log.info(
            "pages read from %s; actions write to %s",
            redact(replica),
            redact(url),
            extra={"event": "dashboard_read_url"},
        )
    if auth is not None and not is_local(args.host):
        log.warning(
            "HTTP Basic sends the password with every request in clear text: serve the "
            "dashboard to the network only behind a TLS proxy",
            extra={"event": "dashboard_plain_http"},
        )
        if args.forwarded_allow_ips is None:
            # Failed sign-ins are throttled by client address: behind a proxy every user has the
            # proxy's, so one guesser would lock everyone out.
            log.warning(
                "failed sign-ins are throttled by client address; behind a reverse proxy, pass "
                "--forwarded-allow-ips with its address, or every user shares the proxy's",
                extra={"event": "dashboard_proxy_addresses"},
            )
    config = uvicorn.Config(
        app,
        # Our logging stays as configured; uvicorn's own errors come out through it.
        log_config=None,
        log_level="warning",
        access_log=False,
        server_header=False,
        proxy_headers=args.forwarded_allow_ips is not None,
        forwarded_allow_ips=args.forwarded_allow_ips,
    )
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again under the handler it
    # found: this one makes that a clean exit (0), as a worker's is, rather than death by signal.
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except SystemExit as exc:
        if exc.code not in (None, EXIT_OK):
            return EXIT_ERROR  # uvicorn could not start; it said why
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    return EXIT_OK


def _stopped(signum: int, frame: object) -> None:
    raise SystemExit(EXIT_OK)


def register(sub: Any, epilog: str) -> None:
    """Add ``dashboard`` to the ``sqla-jobs`` sub-commands ``sub``."""
    p = sub.add_parser(
        "dashboard",
        help=f"serve the web dashboard: queues, jobs, workers, throughput ({EXTRA})",
        epilog=epilog,
    )
    add_database_options(p)
    add_read_option(p)
    p.add_argument(
        "--host",
        default=env("DASHBOARD_HOST", "127.0.0.1"),
        help="address to bind (env SQLA_JOBS_DASHBOARD_HOST; default 127.0.0.1, this machine "
        f"only; any other needs {USER_VAR} and {PASSWORD_VAR} in the environment)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=env("DASHBOARD_PORT", "8000"),
        help="port to listen on (env SQLA_JOBS_DASHBOARD_PORT; default 8000; 0: a free one)",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help="also answer to this Host, as browsers send it (a proxy's name; an IPv6 address "
        "in brackets); repeatable (env SQLA_JOBS_DASHBOARD_ALLOWED_HOSTS, comma-separated). "
        "Always answered: 127.0.0.1, localhost and [::1] with the port, and the --host bound; "
        "any other Host gets 400, so a web page rebound to this machine cannot reach it",
    )
    p.add_argument(
        "--forwarded-allow-ips",
        metavar="IPS",
        default=env("DASHBOARD_FORWARDED_ALLOW_IPS"),
        help="trust X-Forwarded-For and X-Forwarded-Proto from these proxy addresses "
        "(comma-separated; env SQLA_JOBS_DASHBOARD_FORWARDED_ALLOW_IPS); default: trusted "
        "from none, the client address is the connection's",
    )
    p.add_argument(
        "--read-only",
        action="store_true",
        help="show no actions and refuse every POST (connect as the reader role of docs/roles.md)",
    )
    p.add_argument(
        "--show-payload",
        action="store_true",
        help="show jobs' payloads and step results (hidden by default: they may hold personal data)",
    )
    p.add_argument(
        "--log-level",
        default=env("LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL (env SQLA_JOBS_LOG_LEVEL; default INFO)",
    )
    p.add_argument(
        "--log-format",
        default=env("LOG_FORMAT", "logfmt"),
        help="logfmt or json (env SQLA_JOBS_LOG_FORMAT; default logfmt)",
    )
    p.set_defaults(func=cmd_dashboard)
