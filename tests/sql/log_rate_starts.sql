UPDATE sqla_jobs_rate_limiter SET starts=array((SELECT both_.s 
FROM (SELECT unnest(sqla_jobs_rate_limiter.starts) AS s UNION ALL SELECT now() AS s 
FROM generate_series(1, counts.n)) AS both_ ORDER BY both_.s DESC 
 LIMIT limits.allowed)), allowed=limits.allowed, per=(limits.per_s * interval '1 second'), free_at=(now() + limits.per_s * interval '1 second') FROM (SELECT sqla_jobs_job.rate_key AS rate_key, count(*) AS n 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.id = any(%(ids)s::BIGINT[]) AND sqla_jobs_job.rate_key IS NOT NULL GROUP BY sqla_jobs_job.rate_key) AS counts, unnest(%(kinds)s::TEXT[], %(limits)s::INTEGER[], %(pers)s::FLOAT[]) AS limits(kind, allowed, per_s) WHERE sqla_jobs_rate_limiter.rate_key = counts.rate_key AND split_part(sqla_jobs_rate_limiter.rate_key, ' ', 1) = limits.kind RETURNING sqla_jobs_rate_limiter.rate_key
