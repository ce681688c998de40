SELECT sqla_jobs_job.kind, sqla_jobs_job.state, count(*) AS jobs, max(now() - sqla_jobs_job.run_at) FILTER (WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.run_at <= now()) AS oldest_due 
FROM sqla_jobs_job GROUP BY sqla_jobs_job.kind, sqla_jobs_job.state ORDER BY sqla_jobs_job.kind, sqla_jobs_job.state
