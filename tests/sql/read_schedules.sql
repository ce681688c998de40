SELECT sqla_jobs_schedule.name, sqla_jobs_schedule.spec, sqla_jobs_schedule.last_tick_at, sqla_jobs_schedule.paused_at, clock_timestamp() AS now 
FROM sqla_jobs_schedule 
WHERE sqla_jobs_schedule.name = any(%(names)s::TEXT[])
