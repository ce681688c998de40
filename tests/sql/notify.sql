SELECT pg_notify(%(channel)s::VARCHAR, %(queue)s::VARCHAR) AS pg_notify_1
