"""Asynchronous training (DESIGN §9): `icrl learn` (`learn`) trains on the rollouts that any number of
`icrl collect` processes (`collect`) store, talking only through files in the run directory."""
