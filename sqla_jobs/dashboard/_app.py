"""The dashboard's ASGI app: its routes, its middleware and its error pages."""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Iterable

from psycopg import errors as pg_errors
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import DBAPIError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sqla_jobs.dashboard._actions import Actions
from sqla_jobs.dashboard._bulk import Bulk
from sqla_jobs.dashboard._csrf import Csrf
from sqla_jobs.dashboard._flash import Flashes
from sqla_jobs.dashboard._hosts import AllowedHosts, host_entries
from sqla_jobs.dashboard._pages import Pages
from sqla_jobs.dashboard._reads import BadRequest
from sqla_jobs.dashboard._render import Dashboard, environment
from sqla_jobs.dashboard._replica import Reads, ReplicaUnavailable
from sqla_jobs.dashboard._security import BasicAuth, SecurityHeaders
from sqla_jobs.db.failover import failover_safe, is_lost
from sqla_jobs.db.replica import ReplicaConflictError
from sqla_jobs.db.urls import hosts_without_primary, redact, sqlalchemy_url
from sqla_jobs.errors import ConfigurationError
from sqla_jobs.jobs import Jobs

log = logging.getLogger("sqla_jobs.dashboard")
_UNDEFINED_TABLE = "42P01"


def create_app(
    url_or_engine: str | Engine,
    *,
    jobs: Jobs | None = None,
    read_only: bool = False,
    show_payload: bool = False,
    credentials: tuple[str, str] | None = None,
    title: str = "sqla-jobs",
    secret: str | bytes | None = None,
    allowed_hosts: Iterable[str] | None = None,
    read_url: str | Engine | None = None,
) -> Starlette:
    """The dashboard as an ASGI app: serve it (``sqla-jobs dashboard``, any ASGI server) or mount
    it in a Starlette or FastAPI application, behind that application's own authentication.

    ``url_or_engine``: a database URL (the app makes its engine, and disposes of it at shutdown)
    or an ``Engine``. Connect as the operator role of docs/roles.md, or as the reader role with
    ``read_only=True``: then no action is shown and every POST is refused (403). ``jobs``: the
    application's ``Jobs`` (for its ``schema``; default ``Jobs()``). Payloads, and the results of
    durable steps, appear only with ``show_payload=True``. ``credentials``: a user and password
    that every request must send (HTTP Basic); leave it None when the application in front
    authenticates. ``secret``: the key of the CSRF tokens and flash cookies; default a random one
    per app, so set one when several processes serve the same dashboard behind a balancer.
    ``allowed_hosts``: the names the app answers to, ``NAME[:PORT]`` exactly as browsers send
    them in ``Host`` (``["127.0.0.1:8000", "localhost:8000", "[::1]:8000"]``, a proxy's
    ``"jobs.example.com"``): any other ``Host`` gets 400 before anything else runs, and a POST
    must come from one of them (``Origin``, scheme and port included). Served on its own, give
    it: without it a web page whose DNS name is rebound to this machine passes for the dashboard.
    None (the default) checks no Host, for an application that mounts it and checks hosts itself.
    ``read_url``: a URL (or an ``Engine``) of a read replica, a hot standby streaming from the
    primary: the pages read there, and every action still writes through ``url_or_engine``. The
    page after an action reads from the primary until the replica has replayed that action; a
    read the replica cancels to replay WAL is run once more, then reported. A URL of the primary
    itself works too. The pages say where they were read (docs/high-availability.md).

    Every state-changing request is a POST with a CSRF token; every response forbids framing,
    scripts and caching. Nothing is logged but the actions taken and refused (never a payload,
    a token or a password).
    """
    if credentials is not None:
        user, password = credentials
        if not user or not password or ":" in user:
            raise ConfigurationError(
                "dashboard credentials need a user (without ':') and a non-empty password"
            )
    hosts = None if allowed_hosts is None else host_entries(allowed_hosts)
    if isinstance(url_or_engine, Engine):
        engine, owns_engine = url_or_engine, False
    else:
        if (warning := hosts_without_primary(url_or_engine)) is not None:
            # The actions write: after a failover they must reach the new primary.
            log.warning("%s", warning, extra={"event": "url_hosts"})
        engine = failover_safe(
            create_engine(sqlalchemy_url(url_or_engine), pool_pre_ping=True, pool_size=4)
        )
        owns_engine = True
    if isinstance(read_url, Engine):
        replica: Engine | None = read_url
        owns_replica = False
        where = redact(read_url.url.render_as_string(hide_password=True))
    elif read_url is not None:
        replica = create_engine(sqlalchemy_url(read_url), pool_pre_ping=True, pool_size=4)
        owns_replica = True
        where = redact(read_url)
    else:
        replica, owns_replica, where = None, False, ""
    if secret is None:
        key = secrets.token_bytes(32)
    else:
        key = secret.encode() if isinstance(secret, str) else secret
        if len(key) < 16:
            raise ConfigurationError("the dashboard's secret must be at least 16 bytes long")
    dash = Dashboard(
        engine=engine,
        # Not `jobs or Jobs()`: a Jobs without kinds (the CLI's) is falsy.
        jobs=jobs if jobs is not None else Jobs(),
        read_only=read_only,
        show_payload=show_payload,
        title=title,
        csrf=Csrf(key, hosts),
        flashes=Flashes(key),
        templates=environment(),
        owns_engine=owns_engine,
        reads=Reads(engine, replica, key, where),
        owns_replica=owns_replica,
    )
    pages, actions = Pages(dash), Actions(dash)
    bulk = Bulk(actions)
    routes = [
        Route("/", pages.queues, name="queues"),
        Route("/jobs", pages.jobs, name="jobs"),
        Route("/jobs/{job_id:int}", pages.job, name="job"),
        Route("/search", pages.search, name="search"),
        Route("/workers", pages.workers, name="workers"),
        Route("/throughput", pages.throughput, name="throughput"),
        Route("/static/{name:str}", pages.static, name="static"),
        # Asked for by browsers unprompted, whatever the pages link to.
        Route("/favicon.ico", pages.static, name="favicon"),
        Route("/jobs/{verb:str}", actions.jobs, methods=["POST"], name="job_action"),
        Route("/jobs/{verb:str}/matching", bulk.matching, methods=["POST"], name="bulk_action"),
        Route(
            "/queues/{queue:str}/{verb:str}", actions.queue, methods=["POST"], name="queue_action"
        ),
    ]
    # SecurityHeaders only adds to responses; the Host check is the first to look at a request.
    middleware = [Middleware(SecurityHeaders)]
    if hosts is not None:
        middleware.append(Middleware(AllowedHosts, allowed=hosts))
    if credentials is not None:
        middleware.append(Middleware(BasicAuth, user=credentials[0], password=credentials[1]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if dash.owns_engine:
            dash.engine.dispose()
        if dash.owns_replica and dash.reads.replica is not None:
            dash.reads.replica.dispose()

    def bad_request(request: Request, exc: Exception) -> Response:
        return dash.page(
            request, "message.html", {"heading": "Bad request", "text": str(exc)}, status=400
        )

    def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return dash.page(
            request,
            "message.html",
            {"heading": exc.detail, "text": "There is no such page here."},
            status=exc.status_code,
        )

    def replica_error(request: Request, exc: Exception) -> Response:
        heading = "Replica unavailable"
        if isinstance(exc, ReplicaConflictError):
            heading = "Read cancelled by the replica"
        log.warning("%s on %s: %s", heading.lower(), request.url.path, exc)
        return dash.page(
            request, "message.html", {"heading": heading, "text": f"{exc}."}, status=503
        )

    def database_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, DBAPIError)
        first = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else "?"
        if is_lost(exc):
            # No primary to talk to (down, failing over, demoted): said on the page, no traceback.
            log.warning("database unavailable on %s: %s", request.url.path, first)
            heading, status = "Database unavailable", 503
            text = (
                f"The dashboard cannot reach the database: {first}. Try again in a moment "
                "(a failover or restart may be under way)."
            )
        elif isinstance(exc.orig, pg_errors.InsufficientPrivilege):
            heading, status = "Permission denied", 403
            text = (
                f"The dashboard's database role may not read this ({first}): grant it the reader "
                "or operator privileges of docs/roles.md."
            )
        elif getattr(exc.orig, "sqlstate", None) == _UNDEFINED_TABLE:
            heading, status = "Not migrated", 503
            text = f"{first}: run sqla-jobs migrate (or alembic upgrade heads)."
        else:
            log.error("database error on %s", request.url.path, exc_info=exc)
            heading, status = "Database error", 500
            text = "The database refused the request; the dashboard's log has the details."
        return dash.page(request, "message.html", {"heading": heading, "text": text}, status=status)

    return Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={
            BadRequest: bad_request,
            HTTPException: http_error,
            DBAPIError: database_error,
            ReplicaUnavailable: replica_error,
            ReplicaConflictError: replica_error,
        },
    )
