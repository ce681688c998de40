UPDATE sqla_jobs_schedule SET kind=%(schedule_kind)s::VARCHAR, spec=%(schedule_spec)s::VARCHAR, last_tick_at=%(tick)s::TIMESTAMP WITH TIME ZONE, next_tick_at=%(next_tick)s::TIMESTAMP WITH TIME ZONE, seen_at=now(), updated_at=now() WHERE sqla_jobs_schedule.name = (SELECT sqla_jobs_schedule.name 
FROM sqla_jobs_schedule 
WHERE sqla_jobs_schedule.name = %(schedule_name)s::VARCHAR AND sqla_jobs_schedule.last_tick_at IS NOT DISTINCT FROM %(prev)s::TIMESTAMP WITH TIME ZONE AND sqla_jobs_schedule.paused_at IS NULL FOR UPDATE SKIP LOCKED) RETURNING sqla_jobs_schedule.name
