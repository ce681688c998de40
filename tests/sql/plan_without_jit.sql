SELECT set_config(%(set_config_2)s::VARCHAR, %(set_config_3)s::VARCHAR, true) AS set_config_1
