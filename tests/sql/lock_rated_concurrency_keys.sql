WITH concurrency_keys AS MATERIALIZED 
(SELECT DISTINCT firsts.concurrency_key AS concurrency_key 
FROM unnest(%(keys)s::TEXT[]) AS wanted(key) JOIN LATERAL (SELECT sqla_jobs_job.concurrency_key AS concurrency_key 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.rate_key IS NOT NULL AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND sqla_jobs_job.rate_key = wanted.key AND sqla_jobs_job.run_at <= now() AND sqla_jobs_job.concurrency_key IS NOT NULL ORDER BY sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT %(scan)s::BIGINT) AS firsts ON true)
 SELECT concurrency_keys.concurrency_key 
FROM concurrency_keys 
WHERE pg_try_advisory_xact_lock(-1196525586, hashtext(concurrency_keys.concurrency_key))
