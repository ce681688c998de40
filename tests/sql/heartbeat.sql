WITH mine AS MATERIALIZED 
(SELECT sqla_jobs_job.id AS id 
FROM sqla_jobs_job, unnest(%(ids)s::BIGINT[], %(tokens)s::UUID[]) AS held(id, token) 
WHERE sqla_jobs_job.id = held.id AND sqla_jobs_job.lease_token = held.token FOR UPDATE OF sqla_jobs_job SKIP LOCKED)
 UPDATE sqla_jobs_job SET lease_expires_at=(now() + %(lease)s) FROM mine WHERE sqla_jobs_job.id = mine.id RETURNING sqla_jobs_job.id, sqla_jobs_job.cancel_requested_at IS NOT NULL AS anon_1
