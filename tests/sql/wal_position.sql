SELECT pg_is_in_recovery() AS in_recovery, CAST(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END AS text) AS lsn
