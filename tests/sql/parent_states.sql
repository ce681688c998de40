SELECT parent.id, sqla_jobs_job.state, sqla_jobs_outcome.outcome 
FROM unnest(%(parents)s::BIGINT[]) AS parent(id) LEFT OUTER JOIN sqla_jobs_job ON sqla_jobs_job.id = parent.id LEFT OUTER JOIN sqla_jobs_outcome ON sqla_jobs_outcome.id = parent.id ORDER BY parent.id
