"""Asynchronous training (DESIGN §8): collector processes and a learner process share one run directory.

    icrl learn RUN_DIR [--preset ...] [flags]      # writes RUN_DIR/config.json, trains, publishes weights
    icrl collect RUN_DIR --collector-id 0          # any number of these, started and stopped at will
    icrl collect RUN_DIR --collector-id 1

What they share, all through files that are replaced atomically (temp file + os.replace), so no process
ever reads half of one and any of them may be killed at any moment:

* `config.json`: written by the learner; collectors wait for it and build the same envs and agent;
* `replay/`: the DiskReplay; collectors write one file per finished rollout, the learner samples;
* `async/weights.safetensors`: the learner publishes its weights (metadata: the update count) after every
  `publish_every` updates; collectors reload when the file's mtime changes (one stat per round);
* `async/collectors/<id>.json`: each collector's counters (env steps taken, env steps and rollouts stored,
  return sums for the learner's train log), rewritten every round; the learner sums them;
* `async/done`: the learner's finish marker; collectors exit when they see it.

Update-to-data ratio. The learner makes at most `utd` updates per env step *stored* (summed over the
collectors' counters), waiting when it gets ahead: updates <= utd x stored env steps. The default `utd` is
the synchronous run's updates_per_epoch / steps_per_epoch, and the learner stops after
floor(utd x total_env_steps) updates, as many as `icrl train` makes. Collectors stop when the collectors
together have taken total_env_steps; the learner then finishes its remaining updates (only the rollouts
in progress at that moment were never stored). Collectors run free unless given `--max-lead STEPS`: then
they pause while the stored env steps exceed the learner's published updates / utd by more than STEPS, so
data and updates advance together as in `icrl train`, but overlapped. Weights reach a rollout in progress at
the collector's next round: its memory (KV cache) keeps what the older weights computed.

A collector restarted with the same id continues its counters and draws new env seeds. The learner
resumes from its checkpoints with `--resume`, like `icrl train`. SIGTERM / SIGINT stop either process at
its next step: a collector stores its counters (its finished rollouts are already on disk), the learner
writes a checkpoint; both exit with code 0.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import torch
from safetensors import safe_open

from icrl.agent.exploration import Exploration
from icrl.agent.model import Agent, AgentPolicy
from icrl.config import ConfigError, ExperimentConfig
from icrl.data import DiskReplay
from icrl.envs import Collector, make_vector_env
from icrl.envs.user import EnvOverride, run_env_config
from icrl.fileio import write_text_atomic
from icrl.run.loggers import say
from icrl.run.loop import _group_rollouts
from icrl.seeding import derive_seed, seed_everything
from icrl.types import ActionSpec, EpisodeStats


class AsyncPaths:
    """Where the processes of one asynchronous run meet."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.config = self.run_dir / "config.json"
        self.replay = self.run_dir / "replay"
        self.root = self.run_dir / "async"
        self.weights = self.root / "weights.safetensors"
        self.collectors = self.root / "collectors"
        self.done = self.root / "done"

    def counter(self, collector_id: int) -> Path:
        return self.collectors / f"{collector_id}.json"


class StopFlag:
    """Turns SIGTERM and SIGINT into a flag the loops check at every step (main thread only)."""

    def __init__(self) -> None:
        self.signal: str | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal = signal.Signals(signum).name

    def __bool__(self) -> bool:
        return self.signal is not None


def read_counters(paths: AsyncPaths) -> list[dict]:
    """Every collector's latest counters (files being replaced are simply read next time)."""
    out = []
    try:
        names = os.listdir(paths.collectors)
    except FileNotFoundError:
        return out
    for name in names:
        if name.endswith(".json") and not name.startswith("."):
            try:
                out.append(json.loads((paths.collectors / name).read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue
    return out


def rollout_sums(episodes: list[EpisodeStats]) -> dict[str, float]:
    """Sums behind `summarize_episodes`' return and success rate, so the learner can average over rounds."""
    eps = _group_rollouts(episodes)
    succ = [r[-1].success for r in eps if r[-1].success is not None]
    return {"rollouts": len(eps), "return_sum": sum(sum(e.ret for e in r) for r in eps),
            "success_n": len(succ), "success_sum": float(sum(succ))}


def load_weights(agent: Agent, path: Path) -> dict[str, str]:
    """Load a published weights file into `agent`; returns its metadata (`updates`, `utd`)."""
    with safe_open(str(path), framework="pt", device="cpu") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    # safetensors stores tensors shared by two names once: the missing names are aliases, already filled
    _, unexpected = agent.load_state_dict(tensors, strict=False)
    if unexpected:
        raise ConfigError(f"{path} does not fit the run's agent (unexpected {unexpected[:5]}): was config.json changed?")
    agent.refresh_acting_weights()
    return meta


def wait_for(path: Path, wait_s: float, what: str, stop: StopFlag | None = None) -> bool:
    """Poll until `path` exists; False when stopped. Raises ConfigError after `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while not path.exists():
        if stop:
            return False
        if time.monotonic() > deadline:
            raise ConfigError(f"{path} did not appear within {wait_s:.0f} s: start `{what}` for this run dir")
        time.sleep(0.2)
    return True


def collect(run_dir: str | os.PathLike, collector_id: int = 0, *, device: str = "cpu", wait_s: float = 600.0,
            max_env_steps: int | None = None, max_lead: int | None = None, stop: StopFlag | None = None,
            override: EnvOverride | None = None) -> dict:
    """Run one collector until the run's total env steps are taken, the learner finishes, `max_env_steps`
    (this process) are taken, or `stop` is set. Returns its final counters.

    `max_lead`: pause while the run's stored env steps exceed (the published weights' updates / utd) +
    max_lead, i.e. while the collectors are more than `max_lead` env steps ahead of the learner (None: never
    pause). It cannot deadlock with the learner's throttle: the learner waits only while
    stored >= updates / utd, and publishes its weights before it waits.
    """
    paths = AsyncPaths(run_dir)
    learn_cmd = f"icrl learn {paths.run_dir}"
    if not wait_for(paths.config, wait_s, learn_cmd, stop):
        return {}
    # the learner's device may not exist here: the collector acts on its own --device
    cfg = ExperimentConfig.from_json(paths.config.read_text(encoding="utf-8")).validate(check_device=False)
    # config.json is data: its env is built only if it is a built-in / registered one or the user said so
    cfg = run_env_config(cfg, paths.run_dir, override or EnvOverride())
    if not wait_for(paths.weights, wait_s, learn_cmd, stop):
        return {}
    e, t = cfg.env, cfg.train
    path = paths.counter(collector_id)
    counters = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    starts = int(counters.get("starts", 0)) + 1
    seed = derive_seed(t.seed, "collector", collector_id, "start", starts)  # a restart draws new tasks
    seed_everything(seed)
    if t.threads > 0:
        torch.set_num_threads(t.threads)
    dev = torch.device(device)
    venv_kwargs = dict(episodes_per_rollout=e.episodes_per_rollout, rollout_horizon=e.rollout_horizon)
    venv = make_vector_env(e.env, e.kwargs, e.parallel_envs, asynchronous=e.async_envs, **venv_kwargs)
    collector = None
    try:
        spec = ActionSpec.from_space(venv.single_action_space)
        collector = Collector(venv, spec, chunk_len=e.chunk_len, seed=derive_seed(seed, "envs"))
        collector.total_env_steps = int(counters.get("env_steps", 0))
        agent = Agent(venv.single_observation_space["obs"], spec, cfg.model, cfg.loss).to(dev)
        weights_stamp = os.stat(paths.weights).st_mtime_ns
        meta = load_weights(agent, paths.weights)
        replay = DiskReplay(paths.replay, capacity_timesteps=t.replay_capacity, fsync=False)
        exploration = Exploration(cfg.explore, spec, e.parallel_envs, seed=derive_seed(seed, "explore"))
        others = others_stored = 0  # env steps the other collectors have taken / stored (at the last look)

        def run_env_steps() -> int:  # the exploration schedule follows the whole run's env steps
            return others + collector.total_env_steps

        policy = AgentPolicy(agent, e.parallel_envs, greedy=False, exploration=exploration, device=dev,
                             env_steps=lambda: collector.total_env_steps,  # this collector's own env copies
                             sample=cfg.explore.train_actions == "sample")
        counters.update(collector_id=collector_id, starts=starts, pid=os.getpid(), state="collecting")
        for key in ("env_steps", "stored_env_steps", "stored_rollouts", "rollouts", "return_sum", "success_n",
                    "success_sum"):
            counters.setdefault(key, 0)
        paths.collectors.mkdir(parents=True, exist_ok=True)
        start_steps, reloads, waited = collector.total_env_steps, 0, 0.0
        say(f"icrl collect {collector_id}: {e.env} x {e.parallel_envs} envs, weights after {meta.get('updates')} updates")
        while True:
            stamp = os.stat(paths.weights).st_mtime_ns
            if stamp != weights_stamp:  # the learner published new weights
                weights_stamp, meta, reloads = stamp, load_weights(agent, paths.weights), reloads + 1
            rest = [c for c in read_counters(paths) if c.get("collector_id") != collector_id]
            others = sum(int(c.get("env_steps", 0)) for c in rest)
            others_stored = sum(int(c.get("stored_env_steps", 0)) for c in rest)
            if stop or paths.done.exists() or run_env_steps() >= t.total_env_steps or (
                max_env_steps is not None and collector.total_env_steps - start_steps >= max_env_steps
            ):
                break
            if max_lead is not None and "utd" in meta and (
                others_stored + counters["stored_env_steps"] > int(meta["updates"]) / float(meta["utd"]) + max_lead
            ):  # ahead of the learner: wait for newer weights
                time.sleep(0.05)
                waited += 0.05
                continue
            agent.eval()
            episodes: list[EpisodeStats] = []
            round_end = collector.total_env_steps + t.steps_per_epoch
            while collector.total_env_steps < round_end and not stop:  # one vector step at a time
                rollouts, eps = collector.collect(policy, e.parallel_envs)
                for rollout in rollouts:
                    replay.write(rollout)
                    counters["stored_env_steps"] += rollout.num_timesteps - 1  # actions stored
                    counters["stored_rollouts"] += 1
                episodes += eps
            for key, value in rollout_sums(episodes).items():
                counters[key] += value
            counters.update(env_steps=collector.total_env_steps, weights_updates=int(meta.get("updates", 0)),
                            waited_s=round(waited, 2), time=time.time())
            write_text_atomic(path, json.dumps(counters))
    finally:
        venv.close()
        if collector is not None and counters.get("pid") == os.getpid():  # stored rollouts: counted already
            counters.update(env_steps=collector.total_env_steps, time=time.time(),
                            state=f"stopped by {stop.signal}" if stop else "finished")
            write_text_atomic(path, json.dumps(counters))
    say(f"icrl collect {collector_id}: {counters['state']} after {counters['env_steps']:,} env steps "
        f"({counters['stored_rollouts']:,} rollouts stored, {reloads} weight reloads, {waited:.0f} s waiting)")
    return counters
