DELETE FROM sqla_jobs_rate_limiter WHERE sqla_jobs_rate_limiter.rate_key = any(array((SELECT sqla_jobs_rate_limiter.rate_key 
FROM sqla_jobs_rate_limiter 
WHERE sqla_jobs_rate_limiter.free_at < now() 
 LIMIT %(limit)s::BIGINT FOR UPDATE SKIP LOCKED))) RETURNING sqla_jobs_rate_limiter.rate_key
