SELECT count(*) AS count_1 
FROM pg_catalog.pg_trigger 
WHERE pg_catalog.pg_trigger.tgrelid = CAST(%(job_table)s::VARCHAR AS REGCLASS) AND pg_catalog.pg_trigger.tginitdeferred IS true
