"""``python -m sqla_jobs.cli``: the ``sqla-jobs`` command."""

from __future__ import annotations

import sys

from sqla_jobs.cli.entry import main

sys.exit(main())
