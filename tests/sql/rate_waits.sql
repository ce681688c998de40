SELECT sqla_jobs_rate_limiter.rate_key, CAST(EXTRACT(epoch FROM (sqla_jobs_rate_limiter.starts[limits.allowed] + limits.per_s * interval '1 second') - clock_timestamp()) AS FLOAT) AS wait 
FROM sqla_jobs_rate_limiter JOIN unnest(%(kinds)s::TEXT[], %(limits)s::INTEGER[], %(pers)s::FLOAT[]) AS limits(kind, allowed, per_s) ON split_part(sqla_jobs_rate_limiter.rate_key, ' ', 1) = limits.kind 
WHERE sqla_jobs_rate_limiter.rate_key = any(%(keys)s::TEXT[]) AND (SELECT count(*) AS count_1 
FROM unnest(sqla_jobs_rate_limiter.starts) AS logged(s) 
WHERE logged.s > now() - limits.per_s * interval '1 second') >= limits.allowed AND (EXISTS (SELECT * 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.rate_key IS NOT NULL AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND sqla_jobs_job.rate_key = sqla_jobs_rate_limiter.rate_key AND sqla_jobs_job.run_at <= now()))
