"""One training run (docs/design.md §8): the algorithm (`loop`: `loop.train` is `icrl.train`) and the pieces it,
the asynchronous learner and collectors and the evaluation tools share: building a run (`build`), where its
rollouts come from (`sources`), its schedule of epochs and updates (`schedule`), what it tells its user (`hints`),
the run directory, its lock and resuming (`rundir`), checkpoints (`checkpoint`), evaluation and episode summaries
(`evaluate`), loading a run and exporting it (`load`), metrics, logging and progress lines (`reporting`), final
weights, plots and videos (`artifacts`) and the user's hooks (`callbacks`). Nothing imports the loop module but
`icrl` itself and the asynchronous learner."""
