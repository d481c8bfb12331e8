"""One training run (docs/design.md §8): the epoch loop (`loop.train`, called as `icrl.train`) and the pieces it,
the asynchronous learner and collectors and the evaluation tools share: building a run and its learning phase
(`components`), the run directory, its lock and resuming (`rundir`), checkpoints (`checkpoint`), evaluation and
episode summaries (`evaluate`), loading a run and exporting it (`load`), metrics, logging and progress lines
(`reporting`), final weights, plots and videos (`artifacts`) and the user's hooks (`callbacks`). Nothing imports
the loop module but `icrl` itself and the command line."""
