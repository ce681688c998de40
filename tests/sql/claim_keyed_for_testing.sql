WITH RECURSIVE running AS MATERIALIZED 
(SELECT sqla_jobs_job.concurrency_key AS concurrency_key, count(*) AS n 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'running' AND sqla_jobs_job.concurrency_key = any(%(keys)s::TEXT[]) GROUP BY sqla_jobs_job.concurrency_key), 
lines(concurrency_key, priority, room) AS 
(SELECT first.concurrency_key AS concurrency_key, first.priority AS priority, least(%(limit)s::BIGINT, first.concurrency_limit - coalesce(running.n, %(coalesce_1)s::INTEGER)) AS room 
FROM unnest(%(keys)s::TEXT[]) AS wanted(key) JOIN LATERAL (SELECT sqla_jobs_job.concurrency_key AS concurrency_key, sqla_jobs_job.priority AS priority, sqla_jobs_job.concurrency_limit AS concurrency_limit 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NOT NULL AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND sqla_jobs_job.concurrency_key = wanted.key AND NOT (EXISTS (SELECT 1 
FROM sqla_jobs_queue 
WHERE sqla_jobs_queue.queue = %(queue)s::VARCHAR AND sqla_jobs_queue.paused_at IS NOT NULL)) ORDER BY sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT 1) AS first ON true LEFT OUTER JOIN running ON running.concurrency_key = first.concurrency_key 
WHERE least(%(limit)s::BIGINT, first.concurrency_limit - coalesce(running.n, %(coalesce_1)s::INTEGER)) > %(least_1)s::INTEGER UNION ALL SELECT after.concurrency_key AS concurrency_key, after.priority AS priority, lines.room AS room 
FROM lines JOIN LATERAL (SELECT sqla_jobs_job.concurrency_key AS concurrency_key, sqla_jobs_job.priority AS priority 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NOT NULL AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND sqla_jobs_job.concurrency_key = lines.concurrency_key AND sqla_jobs_job.priority > lines.priority ORDER BY sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT 1) AS after ON true), 
ranked AS MATERIALIZED 
(SELECT under.id AS id, under.concurrency_key AS concurrency_key, under.concurrency_limit AS concurrency_limit, under.priority AS priority, under.run_at AS run_at, row_number() OVER (PARTITION BY under.concurrency_key ORDER BY under.priority, under.run_at, under.id) AS rank 
FROM lines JOIN LATERAL (SELECT sqla_jobs_job.id AS id, sqla_jobs_job.concurrency_key AS concurrency_key, sqla_jobs_job.concurrency_limit AS concurrency_limit, sqla_jobs_job.priority AS priority, sqla_jobs_job.run_at AS run_at 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NOT NULL AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND sqla_jobs_job.concurrency_key = lines.concurrency_key AND sqla_jobs_job.priority = lines.priority AND (%(delayed)s OR sqla_jobs_job.run_at <= now() + %(ahead_us)s::BIGINT * interval '1 microsecond') AND (%(all_jobs)s OR pg_xact_status((pg_current_xact_id_if_assigned()::text::bigint + (((xmin::text::bigint - pg_current_xact_id_if_assigned()::text::bigint) + 2147483648) & 4294967295) - 2147483648)::text::xid8) = 'in progress') AND (sqla_jobs_job.crashes = %(crashes_1)s::INTEGER OR %(crashed_ok)s AND sqla_jobs_job.crashes + %(crashes_2)s::INTEGER < sqla_jobs_job.max_crashes OR %(last_life_ok)s) ORDER BY sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT lines.room) AS under ON true), 
claimed AS 
(UPDATE sqla_jobs_job SET state='running', attempts=(sqla_jobs_job.attempts + %(attempts_1)s::INTEGER), lease_token=(SELECT gen_random_uuid() AS gen_random_uuid_1), lease_expires_at=(now() + %(lease)s), locked_by=%(worker)s::VARCHAR WHERE sqla_jobs_job.id = any(array((SELECT ranked.id 
FROM ranked LEFT OUTER JOIN running ON running.concurrency_key = ranked.concurrency_key 
WHERE ranked.rank <= ranked.concurrency_limit - coalesce(running.n, %(coalesce_2)s::INTEGER) ORDER BY ranked.priority, ranked.run_at, ranked.id 
 LIMIT %(limit)s::BIGINT))) AND sqla_jobs_job.state = 'pending' RETURNING sqla_jobs_job.id, sqla_jobs_job.queue, sqla_jobs_job.kind, sqla_jobs_job.payload, sqla_jobs_job.priority, sqla_jobs_job.attempts, sqla_jobs_job.max_attempts, sqla_jobs_job.crashes, sqla_jobs_job.max_crashes, sqla_jobs_job.interruptions, sqla_jobs_job.lease_token, sqla_jobs_job.created_at, sqla_jobs_job.concurrency_key, sqla_jobs_job.steps, sqla_jobs_job.run_at)
 SELECT claimed.id, claimed.queue, claimed.kind, claimed.payload, claimed.priority, claimed.attempts, claimed.max_attempts, claimed.crashes, claimed.max_crashes, claimed.interruptions, claimed.lease_token, CAST(date_part('epoch', claimed.created_at) * 1000000 AS BIGINT) AS created_us, claimed.concurrency_key, claimed.steps 
FROM claimed ORDER BY claimed.priority, claimed.run_at, claimed.id
