"""Async handlers of the kind's model."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import BaseModel
from typing_extensions import assert_type

from sqla_jobs import JobContext, Jobs

jobs = Jobs()


class Resize(BaseModel):
    path: str


@jobs.kind("resize", Resize, timeout=60.0, concurrency_key=lambda p: p.path)
async def resize(payload: Resize, ctx: JobContext) -> str:
    await asyncio.sleep(0)
    return payload.path


assert_type(resize, Callable[[Resize, JobContext], Coroutine[Any, Any, str]])
