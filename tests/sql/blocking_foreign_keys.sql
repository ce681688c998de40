SELECT count(*) AS count_1 
FROM pg_catalog.pg_constraint 
WHERE pg_catalog.pg_constraint.contype = %(contype_1)s::VARCHAR AND pg_catalog.pg_constraint.confrelid = CAST(%(job_table)s::VARCHAR AS REGCLASS) AND pg_catalog.pg_constraint.confdeltype IN (__[POSTCOMPILE_confdeltype_1])
