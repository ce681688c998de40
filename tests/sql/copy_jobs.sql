COPY sqla_jobs_job (id, queue, kind, payload, priority, max_attempts, max_crashes, concurrency_key, concurrency_limit, meta, rate_key, run_at) FROM STDIN
