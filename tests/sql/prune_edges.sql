DELETE FROM sqla_jobs_dependency USING (SELECT sqla_jobs_dependency.parent_id AS parent_id, sqla_jobs_dependency.child_id AS child_id 
FROM sqla_jobs_dependency 
WHERE NOT (EXISTS (SELECT sqla_jobs_job.id 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.id = sqla_jobs_dependency.child_id)) 
 LIMIT %(limit)s::BIGINT) AS gone WHERE sqla_jobs_dependency.parent_id = gone.parent_id AND sqla_jobs_dependency.child_id = gone.child_id RETURNING sqla_jobs_dependency.child_id
