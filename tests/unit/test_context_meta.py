"""``ctx.meta`` without a database: read only when the claim returned it, decoded once, and the
flag a middleware sets to make workers claim it."""

from __future__ import annotations

from typing import Any

import pytest

from sqla_jobs import ConfigurationError, JobContext, Jobs
from sqla_jobs.context import ClaimedJob, ClaimedWithMeta, row_maker

from ._claimed import claimed_job


def with_meta(job: ClaimedJob, meta: Any) -> ClaimedWithMeta:
    """``job`` as a claim with meta returns it: the meta column after ClaimedJob's."""
    made = row_maker(meta=True, timed=False)((*job, meta))
    assert isinstance(made, ClaimedWithMeta)
    return made


def context(job: ClaimedJob) -> JobContext:
    ctx = JobContext.for_job(job, "w1", None)
    ctx._read_meta(job)
    return ctx


def test_a_claim_with_meta_gives_the_context_the_jobs_meta_decoded_once() -> None:
    job = with_meta(claimed_job(7), '{"traceparent": "00-ab", "tenant": "acme"}')
    assert (job.id, job.kind, job.steps) == (7, "k", None), "ClaimedJob's fields are unchanged"
    ctx = context(job)
    assert ctx.meta == {"traceparent": "00-ab", "tenant": "acme"}
    assert ctx.meta is ctx.meta


def test_a_job_without_meta_has_an_empty_one() -> None:
    assert context(with_meta(claimed_job(), None)).meta == {}


def test_meta_the_claim_did_not_return_is_refused_with_what_to_do() -> None:
    ctx = context(claimed_job(3))
    with pytest.raises(ConfigurationError, match=r"job 3 \(k\).*middleware\(fn, meta=True\)"):
        _ = ctx.meta


def test_only_a_middleware_registered_with_meta_makes_workers_read_it() -> None:
    jobs = Jobs()

    async def plain(ctx: JobContext, call_next: Any) -> None:
        await call_next()

    jobs.hooks.middleware(plain)
    assert not jobs.hooks.reads_meta
    jobs.hooks.middleware(plain, meta=True)
    assert jobs.hooks.reads_meta
