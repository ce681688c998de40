"""The sqla-jobs benchmark suite: ``python -m bench`` (``--quick`` for a smoke run).

Every figure is measured against a plain psycopg 3 implementation of the design doc's SQL
(:mod:`bench.baseline`) in the same run, on a fresh database per measurement, and reported as a
ratio: the machine is small and shared, so absolute numbers drift while ratios hold.
"""
