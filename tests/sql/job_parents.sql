SELECT sqla_jobs_dependency.parent_id AS id, sqla_jobs_dependency.run_anyway, sqla_jobs_job.kind, sqla_jobs_job.state, sqla_jobs_outcome.outcome 
FROM sqla_jobs_dependency LEFT OUTER JOIN sqla_jobs_job ON sqla_jobs_job.id = sqla_jobs_dependency.parent_id LEFT OUTER JOIN sqla_jobs_outcome ON sqla_jobs_outcome.id = sqla_jobs_dependency.parent_id 
WHERE sqla_jobs_dependency.child_id = %(id)s::BIGINT ORDER BY sqla_jobs_dependency.parent_id 
 LIMIT %(limit)s::BIGINT
