WITH seq AS MATERIALIZED 
(SELECT CAST(pg_get_serial_sequence(%(table)s::VARCHAR, 'id') AS REGCLASS) AS seq)
 SELECT (SELECT array_agg(nextval(seq.seq)) AS array_agg_1 
FROM seq JOIN generate_series(1, %(n)s::BIGINT) AS anon_1(i) ON true 
WHERE has_sequence_privilege(seq.seq, 'USAGE, UPDATE')) AS ids, coalesce(%(run_at)s::TIMESTAMP WITH TIME ZONE, now() + %(delay_us)s::BIGINT * interval '1 microsecond') AS run_at
