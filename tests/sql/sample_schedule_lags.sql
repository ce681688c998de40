SELECT sqla_jobs_schedule.name, greatest(date_part('epoch', now() - sqla_jobs_schedule.next_tick_at), 0) AS lag 
FROM sqla_jobs_schedule 
WHERE sqla_jobs_schedule.paused_at IS NULL AND sqla_jobs_schedule.next_tick_at IS NOT NULL ORDER BY sqla_jobs_schedule.name
