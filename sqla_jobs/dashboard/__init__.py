"""The web dashboard of sqla-jobs: queues, jobs, dead and running jobs, live workers and the last
hour's throughput, with retry, delete, cancel, pause and resume.

An ASGI app (Starlette, Jinja2): ``sqla-jobs dashboard`` serves it, and :func:`create_app` makes
one to mount in an application of your own. Needs the extra: ``pip install 'sqla-jobs[dashboard]'``.
Nothing else in the package imports this one.
"""

from __future__ import annotations

from sqla_jobs.dashboard._app import create_app

__all__ = ["create_app"]
