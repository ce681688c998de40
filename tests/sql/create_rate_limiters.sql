INSERT INTO sqla_jobs_rate_limiter (rate_key) SELECT anon_1.key 
FROM unnest(%(keys)s::TEXT[]) AS anon_1(key) ORDER BY anon_1.key ON CONFLICT (rate_key) DO NOTHING
