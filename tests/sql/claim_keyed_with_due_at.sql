WITH ranked AS MATERIALIZED 
(SELECT sqla_jobs_job.id AS id, sqla_jobs_job.concurrency_key AS concurrency_key, sqla_jobs_job.concurrency_limit AS concurrency_limit, sqla_jobs_job.priority AS priority, sqla_jobs_job.run_at AS run_at, row_number() OVER (PARTITION BY sqla_jobs_job.concurrency_key ORDER BY sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id) AS rank 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key = any(%(keys)s::TEXT[]) AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND sqla_jobs_job.run_at <= now() AND NOT (EXISTS (SELECT 1 
FROM sqla_jobs_queue 
WHERE sqla_jobs_queue.queue = %(queue)s::VARCHAR AND sqla_jobs_queue.paused_at IS NOT NULL)) AND (sqla_jobs_job.crashes = %(crashes_1)s::INTEGER OR %(crashed_ok)s AND sqla_jobs_job.crashes + %(crashes_2)s::INTEGER < sqla_jobs_job.max_crashes OR %(last_life_ok)s)), 
running AS MATERIALIZED 
(SELECT sqla_jobs_job.concurrency_key AS concurrency_key, count(*) AS n 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'running' AND sqla_jobs_job.concurrency_key = any(%(keys)s::TEXT[]) GROUP BY sqla_jobs_job.concurrency_key), 
claimed AS 
(UPDATE sqla_jobs_job SET state='running', attempts=(sqla_jobs_job.attempts + %(attempts_1)s::INTEGER), lease_token=(SELECT gen_random_uuid() AS gen_random_uuid_1), lease_expires_at=(now() + %(lease)s), locked_by=%(worker)s::VARCHAR WHERE sqla_jobs_job.id = any(array((SELECT ranked.id 
FROM ranked LEFT OUTER JOIN running ON running.concurrency_key = ranked.concurrency_key 
WHERE ranked.rank <= ranked.concurrency_limit - coalesce(running.n, %(coalesce_1)s::INTEGER) ORDER BY ranked.priority, ranked.run_at, ranked.id 
 LIMIT %(limit)s::BIGINT))) AND sqla_jobs_job.state = 'pending' RETURNING sqla_jobs_job.id, sqla_jobs_job.queue, sqla_jobs_job.kind, sqla_jobs_job.payload, sqla_jobs_job.priority, sqla_jobs_job.attempts, sqla_jobs_job.max_attempts, sqla_jobs_job.crashes, sqla_jobs_job.max_crashes, sqla_jobs_job.interruptions, sqla_jobs_job.lease_token, sqla_jobs_job.created_at, sqla_jobs_job.concurrency_key, sqla_jobs_job.steps, sqla_jobs_job.run_at)
 SELECT claimed.id, claimed.queue, claimed.kind, claimed.payload, claimed.priority, claimed.attempts, claimed.max_attempts, claimed.crashes, claimed.max_crashes, claimed.interruptions, claimed.lease_token, claimed.created_at, claimed.concurrency_key, claimed.steps, %(monotonic)s - date_part('epoch', now() - claimed.run_at) AS due_at 
FROM claimed ORDER BY claimed.priority, claimed.run_at, claimed.id
