SELECT sqla_jobs_rate_limiter.rate_key, sqla_jobs_rate_limiter.allowed, CAST(EXTRACT(epoch FROM sqla_jobs_rate_limiter.per) AS FLOAT) AS per_seconds, (SELECT count(*) AS count_1 
FROM unnest(sqla_jobs_rate_limiter.starts) AS logged(s) 
WHERE logged.s > now() - sqla_jobs_rate_limiter.per) AS used, CAST(greatest(CASE WHEN ((SELECT count(*) AS count_1 
FROM unnest(sqla_jobs_rate_limiter.starts) AS logged(s) 
WHERE logged.s > now() - sqla_jobs_rate_limiter.per) >= sqla_jobs_rate_limiter.allowed) THEN EXTRACT(epoch FROM (sqla_jobs_rate_limiter.starts[sqla_jobs_rate_limiter.allowed] + sqla_jobs_rate_limiter.per) - now()) ELSE %(param_1)s::INTEGER END, %(greatest_1)s::INTEGER) AS FLOAT) AS next_in, sqla_jobs_rate_limiter.starts[%(starts_1)s::INTEGER] AS latest 
FROM sqla_jobs_rate_limiter 
WHERE sqla_jobs_rate_limiter.allowed IS NOT NULL ORDER BY sqla_jobs_rate_limiter.rate_key
