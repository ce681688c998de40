SELECT set_config(%(set_config_2)s::VARCHAR, %(timeout)s::VARCHAR, true) AS set_config_1
