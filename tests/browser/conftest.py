"""The dashboard in a real browser: headless Debian Chromium driven by Selenium, against a real
``sqla-jobs dashboard`` process connected as the operator role of docs/roles.md.

Run by ``nox -s browser`` (which sets ``SQLA_JOBS_BROWSER=1`` and installs Selenium); the default
test run does not even collect these files, so it needs neither Selenium nor a browser.
``SQLA_JOBS_SCREENSHOTS=1`` also writes the screenshots of docs/.
"""

from __future__ import annotations

import os

if os.environ.get("SQLA_JOBS_BROWSER") != "1":
    collect_ignore_glob = ["test_*.py", "_*.py"]
