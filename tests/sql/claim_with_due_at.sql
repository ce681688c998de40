WITH claimed AS 
(UPDATE sqla_jobs_job SET state='running', attempts=(sqla_jobs_job.attempts + %(attempts_1)s::INTEGER), lease_token=(SELECT gen_random_uuid() AS gen_random_uuid_1), lease_expires_at=(now() + %(lease)s), locked_by=%(worker)s::VARCHAR WHERE sqla_jobs_job.id = any(array((WITH RECURSIVE priorities(priority, run_at, due) AS 
((SELECT sqla_jobs_job.priority AS priority, sqla_jobs_job.run_at AS run_at, sqla_jobs_job.run_at <= now() AS due 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND NOT (EXISTS (SELECT 1 
FROM sqla_jobs_queue 
WHERE sqla_jobs_queue.queue = %(queue)s::VARCHAR AND sqla_jobs_queue.paused_at IS NOT NULL)) ORDER BY sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT 1) UNION ALL SELECT after.priority AS priority, after.run_at AS run_at, after.due AS due 
FROM priorities JOIN LATERAL (SELECT sqla_jobs_job.priority AS priority, sqla_jobs_job.run_at AS run_at, sqla_jobs_job.run_at <= now() AS due 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND sqla_jobs_job.priority > priorities.priority ORDER BY sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT 1) AS after ON true)
 SELECT under.id 
FROM priorities JOIN LATERAL (SELECT sqla_jobs_job.id AS id 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND sqla_jobs_job.rate_key IS NULL AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND sqla_jobs_job.priority = priorities.priority AND sqla_jobs_job.run_at <= now() AND (sqla_jobs_job.crashes = %(crashes_1)s::INTEGER OR %(crashed_ok)s AND sqla_jobs_job.crashes + %(crashes_2)s::INTEGER < sqla_jobs_job.max_crashes OR %(last_life_ok)s) ORDER BY sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT %(limit)s::BIGINT FOR UPDATE SKIP LOCKED) AS under ON true 
 LIMIT %(limit)s::BIGINT))) RETURNING sqla_jobs_job.id, sqla_jobs_job.queue, sqla_jobs_job.kind, sqla_jobs_job.payload, sqla_jobs_job.priority, sqla_jobs_job.attempts, sqla_jobs_job.max_attempts, sqla_jobs_job.crashes, sqla_jobs_job.max_crashes, sqla_jobs_job.interruptions, sqla_jobs_job.lease_token, sqla_jobs_job.created_at, sqla_jobs_job.concurrency_key, sqla_jobs_job.steps, sqla_jobs_job.run_at)
 SELECT claimed.id, claimed.queue, claimed.kind, claimed.payload, claimed.priority, claimed.attempts, claimed.max_attempts, claimed.crashes, claimed.max_crashes, claimed.interruptions, claimed.lease_token, CAST(date_part('epoch', claimed.created_at) * 1000000 AS BIGINT) AS created_us, claimed.concurrency_key, claimed.steps, %(monotonic_us)s::BIGINT - CAST(date_part('epoch', now() - claimed.run_at) * 1000000 AS BIGINT) AS due_us 
FROM claimed ORDER BY claimed.priority, claimed.run_at, claimed.id
