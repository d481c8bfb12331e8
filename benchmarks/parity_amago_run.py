"""Run an unmodified official AMAGO example script and report its learning curve as JSON lines.

Runs *inside the official AMAGO's virtualenv* (see `benchmarks/parity.py --setup-amago`); it imports nothing
from icrl. Usage: `python parity_amago_run.py EXAMPLE.py [example args...]`.

From outside (no AMAGO source edits) it wraps `Experiment.collect_new_training_data`, `evaluate_val` and
`train_step` with timers and prints one `PARITY {json}` line per evaluation:
`{"env_steps": ..., "updates": ..., "wall_s": ..., "eval_s": ..., "return": ...}`, where env steps count the
training steps collected before the evaluation (all parallel actors), `eval_s` the seconds spent in
evaluations so far, and `return` is the official "Average Total Return (Across All Env Names)"; `tasks` maps each
env name to its "Average Total Return in <name>" (one name for a single-task env) and `specials` holds the env's
own logged averages ("Average Episode 0 Success in <name>" for Meta-Frozen-Lake's attempts). The wall
clock starts when this script starts, as `icrl train`'s does.
"""

import json
import runpy
import sys
import time

T0 = time.time()

from amago.experiment import Experiment  # noqa: E402  (the clock includes the import, as for icrl)

PER_TASK = "Average Total Return in "
STATE = {"env_steps": 0, "updates": 0, "eval_s": 0.0}
_collect, _val, _train = Experiment.collect_new_training_data, Experiment.evaluate_val, Experiment.train_step


def collect(self):
    _collect(self)
    STATE["env_steps"] += self.train_timesteps_per_epoch * self.parallel_actors


def val(self):
    t_val = time.time()
    captured = {}
    orig_log = self.log

    def log(metrics, key):
        if key == "val":
            captured.update(metrics)
        return orig_log(metrics, key)

    self.log = log
    try:
        _val(self)
    finally:
        del self.log
    ret = captured.get("Average Total Return (Across All Env Names)")
    STATE["eval_s"] += time.time() - t_val
    row = {"env_steps": STATE["env_steps"], "updates": STATE["updates"], "wall_s": round(time.time() - T0, 2),
           "eval_s": round(STATE["eval_s"], 2), "return": None if ret is None else float(ret),
           "tasks": {k[len(PER_TASK):]: float(v) for k, v in captured.items() if k.startswith(PER_TASK)},
           "specials": {k: float(v) for k, v in captured.items()
                        if k.startswith("Average ") and " in " in k and not k.startswith(PER_TASK)}}
    print("PARITY " + json.dumps(row), flush=True)


def train_step(self, batch, log_step):
    out = _train(self, batch, log_step)
    STATE["updates"] += 1
    return out


Experiment.collect_new_training_data = collect
Experiment.evaluate_val = val
Experiment.train_step = train_step

script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
