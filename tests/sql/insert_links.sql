INSERT INTO order_jobs (order_id, job_id) SELECT pairs.key, sqla_jobs_job.id 
FROM unnest(%(keys)s::BIGINT[], %(ids)s::BIGINT[]) AS pairs(key, id) JOIN sqla_jobs_job ON sqla_jobs_job.id = pairs.id ON CONFLICT DO NOTHING
