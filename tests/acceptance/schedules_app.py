"""The application of the ``sqla-jobs schedules`` acceptance tests, loaded by real processes:
``python -m sqla_jobs.cli schedules tests.acceptance.schedules_app:jobs``.

Two schedules: a daily report at 09:00 in Paris (a cron in a time zone, named apart from its
kind) and an hourly sweep (an interval, named after its kind). Their handlers do nothing: the tests
look at what is enqueued and at ``sqla_jobs_schedule``, never at what runs.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from sqla_jobs import JobContext, Jobs

jobs = Jobs()

#: The declared schedules' names, as ``sqla-jobs schedules`` lists them (sorted).
PARIS_REPORT = "paris-report"
SWEEP = "sweep"


class Report(BaseModel):
    region: str = "eu"


class Sweep(BaseModel):
    older_than_days: int = 30


@jobs.periodic("0 9 * * *", timezone="Europe/Paris", name=PARIS_REPORT)
@jobs.kind("report", Report, queue="reports")
def report(args: Report, ctx: JobContext) -> None:
    """The daily report: nothing to do in the tests."""


@jobs.periodic(every=timedelta(hours=1))
@jobs.kind("sweep", Sweep, queue="maintenance")
def sweep(args: Sweep, ctx: JobContext) -> None:
    """The hourly sweep: nothing to do in the tests."""
