SELECT sqla_jobs_worker.name, sqla_jobs_worker.host, sqla_jobs_worker.pid, sqla_jobs_worker.queues, sqla_jobs_worker.concurrency, sqla_jobs_worker.started_at, sqla_jobs_worker.heartbeat_at, date_part('epoch', now() - sqla_jobs_worker.heartbeat_at) AS heartbeat_age, sqla_jobs_worker.expires_at < now() AS stale 
FROM sqla_jobs_worker ORDER BY sqla_jobs_worker.started_at, sqla_jobs_worker.name
