WITH RECURSIVE heads(rate_key, priority, run_at, id, due) AS 
((SELECT sqla_jobs_job.rate_key AS rate_key, sqla_jobs_job.priority AS priority, sqla_jobs_job.run_at AS run_at, sqla_jobs_job.id AS id, sqla_jobs_job.run_at <= now() AS due 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.rate_key IS NOT NULL AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND (split_part(sqla_jobs_job.rate_key, ' ', 1) = any(%(kinds)s::TEXT[])) AND NOT (EXISTS (SELECT 1 
FROM sqla_jobs_queue 
WHERE sqla_jobs_queue.queue = %(queue)s::VARCHAR AND sqla_jobs_queue.paused_at IS NOT NULL)) ORDER BY sqla_jobs_job.rate_key, sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT 1) UNION ALL SELECT after.rate_key AS rate_key, after.priority AS priority, after.run_at AS run_at, after.id AS id, after.due AS due 
FROM heads JOIN LATERAL (SELECT sqla_jobs_job.rate_key AS rate_key, sqla_jobs_job.priority AS priority, sqla_jobs_job.run_at AS run_at, sqla_jobs_job.id AS id, sqla_jobs_job.run_at <= now() AS due 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.rate_key IS NOT NULL AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND (split_part(sqla_jobs_job.rate_key, ' ', 1) = any(%(kinds)s::TEXT[])) AND (sqla_jobs_job.rate_key, sqla_jobs_job.priority) > (heads.rate_key, CASE WHEN heads.due THEN CAST(32767 AS SMALLINT) ELSE heads.priority END) ORDER BY sqla_jobs_job.rate_key, sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT 1) AS after ON true), 
candidates AS MATERIALIZED 
(SELECT heads.rate_key AS rate_key 
FROM heads 
WHERE heads.due ORDER BY heads.priority, heads.run_at, heads.id 
 LIMIT %(scan)s::BIGINT)
 SELECT candidates.rate_key, held.rate_key IS NOT NULL AS held, EXISTS (SELECT * 
FROM sqla_jobs_rate_limiter 
WHERE sqla_jobs_rate_limiter.rate_key = candidates.rate_key) AS known 
FROM candidates LEFT OUTER JOIN LATERAL (SELECT sqla_jobs_rate_limiter.rate_key AS rate_key 
FROM sqla_jobs_rate_limiter 
WHERE sqla_jobs_rate_limiter.rate_key = candidates.rate_key FOR UPDATE SKIP LOCKED) AS held ON true
