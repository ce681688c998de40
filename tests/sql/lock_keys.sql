WITH RECURSIVE heads(concurrency_key, priority, run_at, id, due) AS 
((SELECT sqla_jobs_job.concurrency_key AS concurrency_key, sqla_jobs_job.priority AS priority, sqla_jobs_job.run_at AS run_at, sqla_jobs_job.id AS id, sqla_jobs_job.run_at <= now() AS due 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NOT NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND NOT (EXISTS (SELECT 1 
FROM sqla_jobs_queue 
WHERE sqla_jobs_queue.queue = %(queue)s::VARCHAR AND sqla_jobs_queue.paused_at IS NOT NULL)) ORDER BY sqla_jobs_job.concurrency_key, sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT 1) UNION ALL SELECT after.concurrency_key AS concurrency_key, after.priority AS priority, after.run_at AS run_at, after.id AS id, after.due AS due 
FROM heads JOIN LATERAL (SELECT sqla_jobs_job.concurrency_key AS concurrency_key, sqla_jobs_job.priority AS priority, sqla_jobs_job.run_at AS run_at, sqla_jobs_job.id AS id, sqla_jobs_job.run_at <= now() AS due 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NOT NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND (sqla_jobs_job.concurrency_key, sqla_jobs_job.priority) > (heads.concurrency_key, CASE WHEN heads.due THEN CAST(32767 AS SMALLINT) ELSE heads.priority END) ORDER BY sqla_jobs_job.concurrency_key, sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT 1) AS after ON true), 
candidates AS MATERIALIZED 
(SELECT heads.concurrency_key AS concurrency_key 
FROM heads 
WHERE heads.due ORDER BY heads.priority, heads.run_at, heads.id 
 LIMIT %(scan)s::BIGINT)
 SELECT candidates.concurrency_key 
FROM candidates 
WHERE pg_try_advisory_xact_lock(-1196525586, hashtext(candidates.concurrency_key))
