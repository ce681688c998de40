WITH RECURSIVE pending_queues(queue) AS 
(SELECT (SELECT sqla_jobs_job.queue 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL ORDER BY sqla_jobs_job.queue 
 LIMIT 1) AS queue UNION ALL SELECT (SELECT sqla_jobs_job.queue 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue > pending_queues.queue ORDER BY sqla_jobs_job.queue 
 LIMIT 1) AS queue 
FROM pending_queues 
WHERE pending_queues.queue IS NOT NULL), 
keyed_queues(queue) AS 
(SELECT (SELECT sqla_jobs_job.queue 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NOT NULL AND sqla_jobs_job.rate_key IS NULL ORDER BY sqla_jobs_job.queue 
 LIMIT 1) AS queue UNION ALL SELECT (SELECT sqla_jobs_job.queue 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NOT NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue > keyed_queues.queue ORDER BY sqla_jobs_job.queue 
 LIMIT 1) AS queue 
FROM keyed_queues 
WHERE keyed_queues.queue IS NOT NULL), 
rated_queues(queue) AS 
(SELECT (SELECT sqla_jobs_job.queue 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.rate_key IS NOT NULL ORDER BY sqla_jobs_job.queue 
 LIMIT 1) AS queue UNION ALL SELECT (SELECT sqla_jobs_job.queue 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.rate_key IS NOT NULL AND sqla_jobs_job.queue > rated_queues.queue ORDER BY sqla_jobs_job.queue 
 LIMIT 1) AS queue 
FROM rated_queues 
WHERE rated_queues.queue IS NOT NULL)
 SELECT known.queue 
FROM (SELECT pending_queues.queue AS queue 
FROM pending_queues 
WHERE pending_queues.queue IS NOT NULL UNION SELECT keyed_queues.queue AS queue 
FROM keyed_queues 
WHERE keyed_queues.queue IS NOT NULL UNION SELECT rated_queues.queue AS queue 
FROM rated_queues 
WHERE rated_queues.queue IS NOT NULL UNION SELECT sqla_jobs_job.queue AS queue 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'running' UNION SELECT sqla_jobs_throughput.queue AS queue 
FROM sqla_jobs_throughput 
WHERE sqla_jobs_throughput.minute >= now() - interval '7 days' UNION SELECT sqla_jobs_job.queue AS queue 
FROM sqla_jobs_schedule JOIN sqla_jobs_job ON sqla_jobs_job.id = sqla_jobs_schedule.last_job_id UNION SELECT served.queue AS queue 
FROM sqla_jobs_worker JOIN unnest(sqla_jobs_worker.queues) AS served(queue) ON true 
WHERE sqla_jobs_worker.expires_at >= now()) AS known ORDER BY known.queue
