WITH RECURSIVE heads(queue, priority) AS 
((SELECT sqla_jobs_job.queue AS queue, sqla_jobs_job.priority AS priority 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL ORDER BY sqla_jobs_job.queue, sqla_jobs_job.priority 
 LIMIT %(param_1)s::INTEGER) UNION ALL SELECT next.queue AS queue, next.priority AS priority 
FROM heads JOIN LATERAL (SELECT sqla_jobs_job.queue AS queue, sqla_jobs_job.priority AS priority 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL AND (sqla_jobs_job.queue, sqla_jobs_job.priority) > (heads.queue, heads.priority) ORDER BY sqla_jobs_job.queue, sqla_jobs_job.priority 
 LIMIT %(param_2)s::INTEGER) AS next ON true)
 SELECT heads.queue, 'due' AS state, CAST(sum(under.jobs) AS BIGINT) AS jobs, date_part('epoch', now() - min(under.oldest)) AS oldest_due 
FROM heads JOIN LATERAL (SELECT count(*) AS jobs, min(sqla_jobs_job.run_at) AS oldest 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue = heads.queue AND sqla_jobs_job.priority = heads.priority AND sqla_jobs_job.run_at <= now()) AS under ON true GROUP BY heads.queue UNION ALL SELECT sqla_jobs_job.queue, 'due', count(*) FILTER (WHERE sqla_jobs_job.run_at <= now()) AS anon_1, date_part('epoch', now() - (min(sqla_jobs_job.run_at) FILTER (WHERE sqla_jobs_job.run_at <= now()))) AS date_part_1 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NOT NULL AND sqla_jobs_job.rate_key IS NULL GROUP BY sqla_jobs_job.queue UNION ALL SELECT sqla_jobs_job.queue, 'due', count(*) FILTER (WHERE sqla_jobs_job.run_at <= now()) AS anon_2, date_part('epoch', now() - (min(sqla_jobs_job.run_at) FILTER (WHERE sqla_jobs_job.run_at <= now()))) AS date_part_1 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.rate_key IS NOT NULL GROUP BY sqla_jobs_job.queue UNION ALL SELECT sqla_jobs_job.queue, 'rate_limited', count(*) AS count_1, NULL AS anon_3 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.rate_key IS NOT NULL AND sqla_jobs_job.run_at <= now() GROUP BY sqla_jobs_job.queue UNION ALL SELECT sqla_jobs_job.queue, 'running', count(*) AS count_2, NULL AS anon_3 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'running' GROUP BY sqla_jobs_job.queue UNION ALL SELECT sqla_jobs_job.queue, sqla_jobs_job.state, count(*) AS count_3, NULL AS anon_3 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state IN ('completed', 'dead', 'cancelled') GROUP BY sqla_jobs_job.queue, sqla_jobs_job.state
