"""icrl: in-context reinforcement learning with long-context Transformers (AMAGO)."""
