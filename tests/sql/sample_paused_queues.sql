SELECT sqla_jobs_queue.queue, 'paused', 1, NULL AS anon_1 
FROM sqla_jobs_queue 
WHERE sqla_jobs_queue.paused_at IS NOT NULL
