SELECT sqla_jobs_job.id 
FROM sqla_jobs_job, unnest(%(ids)s::BIGINT[], %(tokens)s::UUID[]) AS held(id, token) 
WHERE sqla_jobs_job.id = held.id AND sqla_jobs_job.lease_token = held.token
