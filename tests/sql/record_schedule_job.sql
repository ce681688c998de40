UPDATE sqla_jobs_schedule SET last_job_id=%(last_job)s::BIGINT WHERE sqla_jobs_schedule.name = %(schedule_name)s::VARCHAR RETURNING sqla_jobs_schedule.name
