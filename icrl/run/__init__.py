"""One training run (docs/design.md §8): the epoch loop (`loop.train`, called as `icrl.train`) and the pieces it,
the asynchronous learner and collectors and the evaluation tools share: building a run (`components`), the run
directory and resuming (`rundir`), episode summaries (`episodes`), the learning phase (`updates`), metrics
rows (`reporting`, `timer`), evaluation (`evaluate`), final outputs (`results`), checkpoints, logging, plots
and data parallelism (`distributed`). Nothing imports the loop module but `icrl` itself and the command line."""
