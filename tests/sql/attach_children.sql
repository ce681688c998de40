INSERT INTO sqla_jobs_dependency (parent_id, child_id, run_anyway) SELECT parent.p, child.c, %(run_anyway)s AS anon_1 
FROM unnest(%(children)s::BIGINT[]) AS child(c) JOIN unnest(%(parents)s::BIGINT[]) AS parent(p) ON true ORDER BY child.c, parent.p
