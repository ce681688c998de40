DELETE FROM sqla_jobs_throughput WHERE sqla_jobs_throughput.minute < now() - %(older_than_us)s::BIGINT * interval '1 microsecond'
