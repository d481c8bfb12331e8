"""Asynchronous training (docs/design.md §8): `icrl learn` (`learn.learn`) trains on the rollouts that any
number of `icrl collect` processes (`collect.collect`) store, talking only through files in the run directory
(`protocol`)."""
