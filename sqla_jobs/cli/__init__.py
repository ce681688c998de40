"""The ``sqla-jobs`` command: one module per command group, sharing :mod:`~sqla_jobs.cli.common`
(the one-line errors, the exit codes, the database URL) and :mod:`~sqla_jobs.cli.logfmt` (the log
lines). :func:`main` is the console script's entry point; :func:`build_parser` builds its parser (the docs draw the reference from it).

The top layer: imports anything in the package; nothing in the package imports it.
"""

from __future__ import annotations

from sqla_jobs.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]
