WITH inserted AS 
(INSERT INTO sqla_jobs_job (queue, kind, payload, priority, run_at, max_attempts, max_crashes, concurrency_key, concurrency_limit, meta, rate_key) VALUES (%(queue)s::VARCHAR, %(kind)s::VARCHAR, CAST(%(payload)s::VARCHAR AS JSONB), %(priority)s::SMALLINT, coalesce(%(run_at)s::TIMESTAMP WITH TIME ZONE, now() + %(delay_us)s::BIGINT * interval '1 microsecond'), %(max_attempts)s::INTEGER, %(max_crashes)s::INTEGER, %(concurrency_key)s::VARCHAR, %(concurrency_limit)s::INTEGER, CAST(%(meta)s::VARCHAR AS JSONB), %(rate_key)s::VARCHAR) RETURNING sqla_jobs_job.id, sqla_jobs_job.run_at, sqla_jobs_job.created_at)
 SELECT inserted.id, inserted.run_at, inserted.created_at 
FROM inserted JOIN (SELECT pg_notify(%(channel)s::VARCHAR, %(queue_name)s::VARCHAR) AS notified) AS wakeup ON true
