WITH RECURSIVE heads(queue, priority) AS 
((SELECT sqla_jobs_job.queue AS queue, sqla_jobs_job.priority AS priority 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL ORDER BY sqla_jobs_job.queue, sqla_jobs_job.priority 
 LIMIT %(param_1)s::INTEGER) UNION ALL SELECT next.queue AS queue, next.priority AS priority 
FROM heads JOIN LATERAL (SELECT sqla_jobs_job.queue AS queue, sqla_jobs_job.priority AS priority 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL AND (sqla_jobs_job.queue, sqla_jobs_job.priority) > (heads.queue, heads.priority) ORDER BY sqla_jobs_job.queue, sqla_jobs_job.priority 
 LIMIT %(param_2)s::INTEGER) AS next ON true)
 SELECT heads.queue, 'scheduled' AS state, least(CAST(sum(under.jobs) AS BIGINT), %(least_1)s::INTEGER) AS jobs, NULL AS anon_1 
FROM heads JOIN LATERAL (SELECT count(*) AS jobs 
FROM LATERAL (SELECT 1 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue = heads.queue AND sqla_jobs_job.priority = heads.priority AND sqla_jobs_job.run_at > now() 
 LIMIT %(param_3)s::INTEGER) AS capped) AS under ON true GROUP BY heads.queue UNION ALL SELECT sqla_jobs_job.queue, 'scheduled', count(*) FILTER (WHERE sqla_jobs_job.run_at > now()) AS anon_2, NULL AS anon_1 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NOT NULL AND sqla_jobs_job.rate_key IS NULL GROUP BY sqla_jobs_job.queue UNION ALL SELECT sqla_jobs_job.queue, 'scheduled', count(*) FILTER (WHERE sqla_jobs_job.run_at > now()) AS anon_3, NULL AS anon_1 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.rate_key IS NOT NULL GROUP BY sqla_jobs_job.queue
