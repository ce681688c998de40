SELECT count(*) AS count_1 
FROM sqla_jobs_history 
WHERE sqla_jobs_history.outcome = %(outcome)s::VARCHAR AND sqla_jobs_history.finished_at < now() - %(older_than_us)s::BIGINT * interval '1 microsecond'
