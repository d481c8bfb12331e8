"""The built-in tasks, one module per family; `icrl.envs.make.BUILTIN_ENVS` names them."""
