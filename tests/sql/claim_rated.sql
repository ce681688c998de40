WITH room AS MATERIALIZED 
(SELECT sqla_jobs_rate_limiter.rate_key AS rate_key, limits.allowed - (SELECT count(*) AS count_1 
FROM unnest(sqla_jobs_rate_limiter.starts) AS logged(s) 
WHERE logged.s > now() - limits.per_s * interval '1 second') AS room 
FROM sqla_jobs_rate_limiter JOIN unnest(%(kinds)s::TEXT[], %(limits)s::INTEGER[], %(pers)s::FLOAT[]) AS limits(kind, allowed, per_s) ON split_part(sqla_jobs_rate_limiter.rate_key, ' ', 1) = limits.kind 
WHERE sqla_jobs_rate_limiter.rate_key = any(%(keys)s::TEXT[])), 
lined AS MATERIALIZED 
(SELECT under.id AS id, under.rate_key AS rate_key, under.concurrency_key AS concurrency_key, under.concurrency_limit AS concurrency_limit, under.priority AS priority, under.run_at AS run_at, room.room AS room, row_number() OVER (PARTITION BY under.concurrency_key ORDER BY under.priority, under.run_at, under.id) AS in_key 
FROM room JOIN LATERAL (SELECT sqla_jobs_job.id AS id, sqla_jobs_job.rate_key AS rate_key, sqla_jobs_job.concurrency_key AS concurrency_key, sqla_jobs_job.concurrency_limit AS concurrency_limit, sqla_jobs_job.priority AS priority, sqla_jobs_job.run_at AS run_at 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.rate_key IS NOT NULL AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND sqla_jobs_job.rate_key = room.rate_key AND sqla_jobs_job.run_at <= now() AND (sqla_jobs_job.crashes = %(crashes_1)s::INTEGER OR %(crashed_ok)s AND sqla_jobs_job.crashes + %(crashes_2)s::INTEGER < sqla_jobs_job.max_crashes OR %(last_life_ok)s) AND (sqla_jobs_job.concurrency_key IS NULL OR sqla_jobs_job.concurrency_key = any(%(concurrency_keys)s::TEXT[])) AND NOT (EXISTS (SELECT 1 
FROM sqla_jobs_queue 
WHERE sqla_jobs_queue.queue = %(queue)s::VARCHAR AND sqla_jobs_queue.paused_at IS NOT NULL)) ORDER BY sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id 
 LIMIT %(limit)s::BIGINT) AS under ON true 
WHERE room.room > %(room_1)s::INTEGER), 
running AS MATERIALIZED 
(SELECT sqla_jobs_job.concurrency_key AS concurrency_key, count(*) AS n 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'running' AND sqla_jobs_job.concurrency_key = any(%(concurrency_keys)s::TEXT[]) GROUP BY sqla_jobs_job.concurrency_key), 
claimed AS 
(UPDATE sqla_jobs_job SET state='running', attempts=(sqla_jobs_job.attempts + %(attempts_1)s::INTEGER), lease_token=(SELECT gen_random_uuid() AS gen_random_uuid_1), lease_expires_at=(now() + %(lease)s), locked_by=%(worker)s::VARCHAR WHERE sqla_jobs_job.id = any(array((SELECT ranked.id 
FROM (SELECT fits.id AS id, fits.rate_key AS rate_key, fits.concurrency_key AS concurrency_key, fits.concurrency_limit AS concurrency_limit, fits.priority AS priority, fits.run_at AS run_at, fits.room AS room, fits.in_key AS in_key, row_number() OVER (PARTITION BY fits.rate_key ORDER BY fits.priority, fits.run_at, fits.id) AS in_limiter 
FROM (SELECT lined.id AS id, lined.rate_key AS rate_key, lined.concurrency_key AS concurrency_key, lined.concurrency_limit AS concurrency_limit, lined.priority AS priority, lined.run_at AS run_at, lined.room AS room, lined.in_key AS in_key 
FROM lined LEFT OUTER JOIN running ON running.concurrency_key = lined.concurrency_key 
WHERE lined.concurrency_key IS NULL OR lined.in_key <= lined.concurrency_limit - coalesce(running.n, %(coalesce_1)s::INTEGER)) AS fits) AS ranked 
WHERE ranked.in_limiter <= ranked.room ORDER BY ranked.priority, ranked.run_at, ranked.id 
 LIMIT %(limit)s::BIGINT))) AND sqla_jobs_job.state = 'pending' RETURNING sqla_jobs_job.id, sqla_jobs_job.queue, sqla_jobs_job.kind, sqla_jobs_job.payload, sqla_jobs_job.priority, sqla_jobs_job.attempts, sqla_jobs_job.max_attempts, sqla_jobs_job.crashes, sqla_jobs_job.max_crashes, sqla_jobs_job.interruptions, sqla_jobs_job.lease_token, sqla_jobs_job.created_at, sqla_jobs_job.concurrency_key, sqla_jobs_job.steps, sqla_jobs_job.run_at)
 SELECT claimed.id, claimed.queue, claimed.kind, claimed.payload, claimed.priority, claimed.attempts, claimed.max_attempts, claimed.crashes, claimed.max_crashes, claimed.interruptions, claimed.lease_token, CAST(date_part('epoch', claimed.created_at) * 1000000 AS BIGINT) AS created_us, claimed.concurrency_key, claimed.steps 
FROM claimed ORDER BY claimed.priority, claimed.run_at, claimed.id
