SELECT others.id, others.other, others.holds 
FROM (SELECT sqla_jobs_job.id AS id, holder.id AS other, holder.state = any(holder.unique_states) AS holds 
FROM sqla_jobs_job JOIN sqla_jobs_job AS holder ON holder.unique_key = sqla_jobs_job.unique_key AND holder.state = any(holder.unique_states) AND holder.id != sqla_jobs_job.id 
WHERE sqla_jobs_job.id = any(%(ids)s::BIGINT[]) UNION SELECT sqla_jobs_job.id AS id, holder.id AS other, holder.state = any(holder.unique_states) AS holds 
FROM sqla_jobs_job JOIN sqla_jobs_job AS holder ON holder.unique_key = sqla_jobs_job.unique_key AND holder.id = any(%(ids)s::BIGINT[]) AND holder.id != sqla_jobs_job.id 
WHERE sqla_jobs_job.id = any(%(ids)s::BIGINT[])) AS others ORDER BY others.id, others.other
