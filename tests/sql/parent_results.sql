SELECT sqla_jobs_dependency.parent_id, CAST(sqla_jobs_outcome.result AS TEXT) AS result 
FROM sqla_jobs_dependency JOIN sqla_jobs_outcome ON sqla_jobs_outcome.id = sqla_jobs_dependency.parent_id 
WHERE sqla_jobs_dependency.child_id = %(child)s::BIGINT AND sqla_jobs_outcome.result IS NOT NULL ORDER BY sqla_jobs_dependency.parent_id
