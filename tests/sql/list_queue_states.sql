SELECT sqla_jobs_queue.queue, sqla_jobs_queue.paused_at, sqla_jobs_queue.updated_at 
FROM sqla_jobs_queue ORDER BY sqla_jobs_queue.queue
