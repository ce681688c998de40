SELECT now() - xact_start AS age, pid, state, left(query, 100) AS query FROM pg_stat_activity WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid() ORDER BY xact_start LIMIT 1
