"""One training run (DESIGN §8): the epoch loop (`loop.train`) and the pieces it and the asynchronous and
evaluation paths share: the run directory, checkpoints, evaluation, logging, plots and data parallelism."""
