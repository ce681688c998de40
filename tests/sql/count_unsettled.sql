SELECT count(*) AS count_1 
FROM sqla_jobs_outcome 
WHERE sqla_jobs_outcome.unsettled
