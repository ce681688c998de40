"""What every page shares: the app's settings and connections, the Jinja2 environment
(autoescaped: a job's error or meta is shown as text, never as markup), links that hold under
the path the app is mounted at, the CSRF token of its forms and the flash message of the last
action."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.requests import Request
from starlette.responses import HTMLResponse

from sqla_jobs.dashboard._csrf import FIELD, Csrf
from sqla_jobs.dashboard._flash import Flashes
from sqla_jobs.dashboard._replica import Reads
from sqla_jobs.jobs import Jobs
from sqla_jobs.observe.stats import _age

#: The pages of the navigation bar: (key, path, label).
NAV = (
    ("queues", "/", "Queues"),
    ("jobs", "/jobs", "Jobs"),
    ("dead", "/jobs?state=dead", "Dead"),
    ("running", "/jobs?state=running", "Running"),
    ("workers", "/workers", "Workers"),
    ("throughput", "/throughput", "Throughput"),
)


def environment() -> Environment:
    """The templates, autoescaped whatever their name, strict about undefined names."""
    env = Environment(
        loader=PackageLoader("sqla_jobs.dashboard", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["clock"] = clock
    env.filters["age"] = lambda value: _age(value) if value is not None else "-"
    env.filters["seconds"] = seconds
    env.filters["as_json"] = lambda value: json.dumps(value, indent=2, default=str)
    env.filters["segment"] = lambda value: quote(str(value), safe="")
    return env


def clock(value: datetime | None) -> str:
    """A time in UTC, to the second, as the CLI prints it; ``-`` for none."""
    if value is None:
        return "-"
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def seconds(value: float | None) -> str:
    """A duration in seconds, short (``850ms``, ``3.2s``, ``4.1m``); ``-`` for none."""
    return "-" if value is None else _age(timedelta(seconds=value))


@dataclass
class Dashboard:
    """One dashboard app: its settings, its database, its templates and its secrets."""

    engine: Engine
    jobs: Jobs
    read_only: bool
    show_payload: bool
    title: str
    csrf: Csrf
    flashes: Flashes
    templates: Environment
    #: Whether the app made the engine (and disposes of it at shutdown).
    owns_engine: bool
    #: Where the pages read: the read URL's engine, or ``engine`` (actions always use ``engine``).
    reads: Reads
    #: Whether the app made the read URL's engine (and disposes of it at shutdown).
    owns_replica: bool = False

    def session(self) -> Session:
        """A Session on the dashboard's engine, the primary (the caller opens its transaction);
        what it loaded stays readable after the commit, for the template. Pages read through
        :attr:`reads` instead."""
        return Session(self.engine, expire_on_commit=False)

    def page(
        self,
        request: Request,
        template: str,
        context: Mapping[str, Any],
        *,
        status: int = 200,
        nav: str | None = None,
    ) -> HTMLResponse:
        """``template`` rendered with ``context`` and what every page shows."""
        flash = self.flashes.read(request)
        token = None
        nonce, new = self.csrf.nonce(request)
        if not self.read_only:
            token = self.csrf.token(nonce)
        html = self.templates.get_template(template).render(
            {
                **context,
                "title": self.title,
                "read_only": self.read_only,
                "nav": NAV,
                "current": nav,
                "flash": flash,
                "csrf_field": FIELD,
                "csrf_token": token,
                "here": here(request),
                "source": getattr(request.state, "source", None),
                "link": lambda path, **query: link(request, path, **query),
            }
        )
        response = HTMLResponse(html, status_code=status)
        self.flashes.clear(request, response)
        self.reads.settle(request, response)
        if token is not None and new:
            self.csrf.set_cookie(request, response, nonce)
        return response


def root(request: Request) -> str:
    """The path the app is mounted at ("" at the top)."""
    return str(request.scope.get("root_path") or "").rstrip("/")


def link(request: Request, path: str, **query: object) -> str:
    """``path`` of this app (with ``query``, empty values left out) under its mount point."""
    params = {k: v for k, v in query.items() if v is not None and v != ""}
    separator = "&" if "?" in path else "?"
    return root(request) + path + (separator + urlencode(params) if params else "")


def here(request: Request) -> str:
    """This page's path and query within the app: where an action redirects back to."""
    path = str(request.scope["path"])
    prefix = root(request)
    # Starlette >= 0.33 keeps the mount point in "path"; older versions strip it.
    if prefix and (path == prefix or path.startswith(prefix + "/")):
        path = path[len(prefix) :] or "/"
    query = request.url.query
    return path + ("?" + query if query else "")
