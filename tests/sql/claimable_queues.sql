SELECT wanted.queue, coalesce(unkeyed.due OR %(keyed)s AND (EXISTS (WITH RECURSIVE heads(concurrency_key, priority, run_at, id, due) AS 
((SELECT sqla_jobs_job.concurrency_key AS concurrency_key, sqla_jobs_job.priority AS priority, sqla_jobs_job.run_at AS run_at, sqla_jobs_job.id AS id, sqla_jobs_job.run_at <= now() AS due 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NOT NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue = wanted.queue ORDER BY sqla_jobs_job.concurrency_key, sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT 1) UNION ALL SELECT after.concurrency_key AS concurrency_key, after.priority AS priority, after.run_at AS run_at, after.id AS id, after.due AS due 
FROM heads JOIN LATERAL (SELECT sqla_jobs_job.concurrency_key AS concurrency_key, sqla_jobs_job.priority AS priority, sqla_jobs_job.run_at AS run_at, sqla_jobs_job.id AS id, sqla_jobs_job.run_at <= now() AS due 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NOT NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue = wanted.queue AND (sqla_jobs_job.concurrency_key, sqla_jobs_job.priority) > (heads.concurrency_key, CASE WHEN heads.due THEN CAST(32767 AS SMALLINT) ELSE heads.priority END) ORDER BY sqla_jobs_job.concurrency_key, sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT 1) AS after ON true)
 SELECT 1 
FROM heads 
WHERE heads.due)), false) AS due, CAST(EXTRACT(epoch FROM unkeyed.next_at - now()) AS FLOAT) AS wait 
FROM unnest(%(queues)s::TEXT[]) WITH ORDINALITY AS wanted(queue, n) JOIN LATERAL (WITH RECURSIVE priorities(priority, run_at, due) AS 
((SELECT sqla_jobs_job.priority AS priority, sqla_jobs_job.run_at AS run_at, sqla_jobs_job.run_at <= now() AS due 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue = wanted.queue ORDER BY sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT 1) UNION ALL SELECT after.priority AS priority, after.run_at AS run_at, after.due AS due 
FROM priorities JOIN LATERAL (SELECT sqla_jobs_job.priority AS priority, sqla_jobs_job.run_at AS run_at, sqla_jobs_job.run_at <= now() AS due 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue = wanted.queue AND sqla_jobs_job.priority > priorities.priority ORDER BY sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT 1) AS after ON true)
 SELECT bool_or(priorities.due) AS due, min(CASE WHEN priorities.due THEN (SELECT sqla_jobs_job.run_at 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue = wanted.queue AND sqla_jobs_job.priority = priorities.priority AND sqla_jobs_job.run_at > now() ORDER BY sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT 1) ELSE priorities.run_at END) AS next_at 
FROM priorities) AS unkeyed ON true 
WHERE NOT (EXISTS (SELECT 1 
FROM sqla_jobs_queue 
WHERE sqla_jobs_queue.queue = wanted.queue AND sqla_jobs_queue.paused_at IS NOT NULL)) ORDER BY wanted.n
