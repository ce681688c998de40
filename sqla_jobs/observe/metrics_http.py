"""The small HTTP server of a worker's metrics: ``/metrics`` (Prometheus' text format, by
prometheus_client's WSGI app) and ``/healthz``, on a daemon thread of its own. Imported only when
metrics are served.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from sqla_jobs.errors import ConfigurationError

#: (healthy, why), from any thread.
HealthCheck = Callable[[], tuple[bool, str]]


class _Quiet(WSGIRequestHandler):
    # A scrape every few seconds is no news: the worker's log stays for jobs.
    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServer:
    """Serves ``registry`` and ``health`` on ``host``:``port`` (0: a free port) until
    :meth:`close`. Raises :class:`~sqla_jobs.ConfigurationError` if it cannot bind."""

    def __init__(
        self, registry: CollectorRegistry, health: HealthCheck, host: str, port: int
    ) -> None:
        metrics = make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            path = environ.get("PATH_INFO") or "/"
            if path == "/healthz":
                healthy, why = health()
                status = "200 OK" if healthy else "503 Service Unavailable"
                start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
                return [f"{why}\n".encode()]
            if path in ("/metrics", "/"):
                return metrics(environ, start_response)  # type: ignore[no-any-return]
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: try /metrics or /healthz\n"]

        class Server(ThreadingMixIn, WSGIServer):
            daemon_threads = True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        try:
            self._httpd = make_server(host, port, app, Server, _Quiet)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; choose another "
                "--metrics-port (or --metrics-host)"
            ) from None
        #: Where it listens: (host, port), the port chosen by the system when 0 was asked for.
        self.address: tuple[str, int] = tuple(self._httpd.server_address[:2])  # type: ignore[assignment]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="sqla-jobs-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
