"""The built-in tasks, one module per family; `icrl.envs.registry.TASKS` declares them."""
