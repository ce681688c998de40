SELECT pg_sleep(least(greatest(EXTRACT(epoch FROM %(until)s::TIMESTAMP WITH TIME ZONE - clock_timestamp()), %(greatest_1)s::INTEGER), %(cap)s)) AS pg_sleep_1
