"""An application whose handler takes a Session, for ``sqla-jobs worker --sessionmaker``: the
maker's ``info`` marks the sessions as the application's own."""

from __future__ import annotations

import os

from pydantic import BaseModel
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from sqla_jobs import JobContext, Jobs
from sqla_jobs.db.urls import sqlalchemy_url

jobs = Jobs()
# No connection until a handler runs: the test process imports this for its models only.
engine = create_engine(sqlalchemy_url(os.environ.get("DATABASE_URL", "postgresql://localhost/x")))
maker = sessionmaker(engine, info={"app": "session_app"})
not_a_maker = 42


class Note(BaseModel):
    text: str


@jobs.kind("note", Note)
def note(payload: Note, ctx: JobContext, session: Session) -> None:
    session.execute(
        text("INSERT INTO app_note (job_id, text, origin) VALUES (:id, :text, :origin)"),
        {"id": ctx.job_id, "text": payload.text, "origin": session.info.get("app", "default")},
    )
