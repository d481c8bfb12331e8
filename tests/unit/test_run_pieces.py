"""The small pieces the training loop and the evaluation paths share (icrl.run.evaluate's summaries,
icrl.run.reporting, the loop's lazy loader, icrl.parallel.Replicas): summaries over rollouts, phase timing, when
rows are due."""

from __future__ import annotations

import json
import time

import pytest
import torch

from icrl.config import ExperimentConfig
from icrl.device import resolve_device
from icrl.parallel import Replicas
from icrl.run.build import LazyLoader
from icrl.run.evaluate import (
    SUM_KEYS,
    TASK_METRIC_PREFIXES,
    add_task_sums,
    group_rollouts,
    metrics_from_task_sums,
    rollout_sums,
    summarize_episodes,
    task_metrics,
    task_sums,
    train_stats,
    train_stats_all_ranks,
)
from icrl.run.reporting import Timer, due, eval_table, report_epoch, row_head, scalars
from icrl.types import EpisodeStats, task_key


def ep(env, rollout, index, ret, success=None, length=5, task=None):
    return EpisodeStats(env_index=env, rollout_id=rollout, episode_index=index, ret=ret, length=length, success=success,
                        task=task)


# Two rollouts: env 0 has a 3-episode rollout (reported out of order), env 1 a single-episode one.
EPISODES = [ep(0, 0, 1, 2.0, 0.0), ep(1, 0, 0, 10.0, 1.0), ep(0, 0, 0, 1.0, 0.0), ep(0, 0, 2, 3.0, 1.0)]


def test_summaries_average_over_rollouts_not_episodes():
    groups = group_rollouts(EPISODES)
    assert sorted([e.episode_index for e in g] for g in groups) == [[0], [0, 1, 2]]
    s = summarize_episodes(EPISODES)
    # rollout returns 1 + 2 + 3 = 6 and 10; an average over episodes would give 4.0
    assert s["return_mean"] == pytest.approx(8.0) and s["rollouts"] == 2
    assert s["success_rate"] == pytest.approx(1.0)  # each rollout's last episode succeeded
    assert s["return_by_episode"] == pytest.approx([5.5, 2.0, 3.0])
    assert summarize_episodes([]) == {"return_mean": None, "success_rate": None, "rollouts": 0}


def test_sums_give_the_same_means_as_the_summary():
    sums = rollout_sums(EPISODES)
    assert sums == {"rollouts": 2, "return_sum": 16.0, "success_n": 2, "success_sum": 2.0}
    one = Replicas(torch.device("cpu"))
    every = train_stats_all_ranks(EPISODES, one)
    assert every["return_mean"] == pytest.approx(8.0) and every["success_rate"] == pytest.approx(1.0)
    assert train_stats(EPISODES, one) == summarize_episodes(EPISODES)  # one process: the summary itself
    assert train_stats_all_ranks([], one) == {"return_mean": None, "success_rate": None}


# Multi-task: three rollouts of task "a" (one of 2 episodes, one whose episodes name it only at the end), one of "b"
# (no success reported), one that names no task.
TASKS = [ep(0, 0, 0, 1.0, 0.0, task="a"), ep(0, 0, 1, 2.0, 1.0, task="a"), ep(1, 0, 0, 5.0, 0.0, task=None),
         ep(1, 0, 1, 1.0, 0.0, task="a"), ep(0, 1, 0, -1.0, task="b"), ep(2, 0, 0, 7.0, 1.0)]


def test_per_task_metrics_average_each_tasks_rollouts():
    s = summarize_episodes(TASKS)
    assert s["return_mean"] == pytest.approx((3 + 6 - 1 + 7) / 4) and s["rollouts"] == 4  # as before
    per_task = {k: v for k, v in s.items() if k.startswith(TASK_METRIC_PREFIXES)}
    assert per_task == {"return/a": pytest.approx(4.5), "success/a": pytest.approx(0.5), "rollouts/a": 2,
                        "return/b": pytest.approx(-1.0), "rollouts/b": 1}  # b reports no success: no key
    assert list(per_task) == sorted(per_task, key=lambda k: (k.split("/")[1], TASK_METRIC_PREFIXES.index(
        k.split("/")[0] + "/")))  # task by task, in name order
    assert not any(k.startswith(TASK_METRIC_PREFIXES) for k in summarize_episodes(EPISODES))  # no task: no keys
    assert train_stats(TASKS, Replicas(torch.device("cpu")))["return/a"] == pytest.approx(4.5)
    # a metrics backend logs an eval row's per-task keys under eval/, a train row's keep train/
    assert scalars({"kind": "eval", "return/a": 4.5, "time/eval_s": 1.0}) == {"eval/return/a": 4.5, "time/eval_s": 1.0}
    assert scalars({"kind": "train", "train/return/a": 4.5}) == {"train/return/a": 4.5}


def test_per_task_sums_add_up_over_ranks_and_collectors():
    """Data-parallel ranks and asynchronous collectors report sums, not means: the per-task metrics of the sums
    of two halves equal those of the whole (a task one part never met counts zero there)."""
    halves = [TASKS[:2], TASKS[2:]]  # rank 0 met only task a's first rollout; rank 1 the rest
    whole = task_metrics(TASKS)
    assert metrics_from_task_sums(add_task_sums(*(task_sums(h) for h in halves))) == pytest.approx(whole)
    assert task_sums(EPISODES) == {} and metrics_from_task_sums({}) == {}
    # an epoch's share of running totals: what was added since the start
    start, now = task_sums(halves[0]), add_task_sums(task_sums(halves[0]), task_sums(halves[1]))
    assert add_task_sums(now, start, sign=-1.0) == task_sums(halves[1])

    class TwoRanks(Replicas):  # this process is rank 0; rank 1 holds the other half
        world_size = 2

        def sum(self, values):
            other = rollout_sums(halves[1])
            return [v + other[k] for v, k in zip(values, SUM_KEYS)]

        def gather_json(self, value):
            return [value, json.loads(json.dumps(task_sums(halves[1])))]

    stats = train_stats(halves[0], TwoRanks(torch.device("cpu")))
    assert stats["return_mean"] == pytest.approx(summarize_episodes(TASKS)["return_mean"])
    assert {k: v for k, v in stats.items() if k.startswith(TASK_METRIC_PREFIXES)} == pytest.approx(whole)
    assert Replicas(torch.device("cpu")).gather_json({"a": [1, 2.5]}) == [{"a": [1, 2.5]}]


def test_task_names_become_safe_metric_keys():
    assert task_key("RepeatFirstEasy") == "RepeatFirstEasy" and task_key("reach-v3") == "reach-v3"
    assert task_key("go to/the red ball!") == "go_to_the_red_ball_" and task_key(3) == "3"
    assert task_key("x" * 100) == "x" * 64 and task_key(None) is None and task_key("") is None
    assert EpisodeStats(0, 0, 0, 1.0, 1, None) == EpisodeStats(0, 0, 0, 1.0, 1, None, task=None)  # optional field


def test_eval_table_shows_one_row_per_task():
    from rich.console import Console

    result = {"run_dir": "r", "env": "popgym_multi", "env_kwargs": {}, "weights": "w", "seed": 0,
              **summarize_episodes(TASKS)}
    tables = eval_table(result)
    assert len(tables) == 3  # summary, adaptation curve (2-episode rollouts), by task
    console = Console(width=120, record=True)
    console.print(tables[-1])
    lines = [line for line in console.export_text().splitlines() if line.strip().startswith("│")]
    assert len(lines) == 2  # the rows of tasks a and b
    assert lines[0].split() == ["│", "a", "│", "2", "│", "+4.500", "│", "0.50", "│"] and "n/a" in lines[1]
    plain = {k: v for k, v in result.items() if not k.startswith(TASK_METRIC_PREFIXES)}
    assert len(eval_table(plain)) == 2  # no task: no table


def test_single_process_replicas_decide_alone():
    one = Replicas(torch.device("cpu"))
    assert one.all_ready(True) and not one.all_ready(False)
    assert one.average({"loss": 0.5}) == {"loss": 0.5}
    assert one.checkpoint_record(torch.nn.Linear(2, 2)) == {}
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_timer_sums_each_phase_over_its_blocks():
    now = [0.0]  # a fake clock: the sums are exact, whatever the machine's load
    timer = Timer(clock=lambda: now[0])
    for step in (0.25, 0.5):
        with timer("a"):
            now[0] += step
        now[0] += 10.0  # time outside any block counts for no phase
    with pytest.raises(RuntimeError), timer("b"):  # an error still counts the phase's time
        now[0] += 2.0
        raise RuntimeError
    assert timer["a"] == 0.75 and timer["b"] == 2.0
    assert timer["never"] == 0.0


class Log:
    def __init__(self):
        self.rows = []

    def write(self, row):
        self.rows.append(row)

    def close(self):
        pass


def test_rows_are_due_every_n_epochs_and_at_the_last(capsys):
    assert [e for e in range(1, 8) if due(e, 3, 7)] == [3, 6, 7]
    cfg = ExperimentConfig().replace(eval_every=2, log_every=100)
    log, evals, seen = Log(), [], []
    last = None
    for epoch in range(1, 4):
        row = row_head("train", epoch, 10 * epoch, epoch, time.perf_counter())
        last = report_epoch(log, row, cfg, epoch=epoch, num_epochs=3, last_eval=last,
                            evaluate=lambda epoch=epoch: evals.append(epoch) or {"kind": "eval", "epoch": epoch,
                                                                                 "return_mean": 1.0},
                            progress=lambda row, ev: seen.append((row["epoch"], ev and ev["epoch"])))
    assert evals == [2, 3]
    assert [(r["kind"], r["epoch"]) for r in log.rows] == [("train", 1), ("train", 2), ("eval", 2), ("train", 3),
                                                            ("eval", 3)]
    assert seen == [(1, None), (2, 2), (3, 3)]  # the progress line shows the latest evaluation
    printed = capsys.readouterr().out
    assert "epoch    3" in printed and "epoch    2" not in printed  # log_every 100: only the last epoch
    head = row_head("eval", 4, 100, 7, time.perf_counter() - 5.0)
    assert list(head) == ["kind", "epoch", "env_steps", "updates", "wall_time"] and head["wall_time"] >= 5.0


def test_lazy_loader_opens_once_and_only_when_asked():
    opened = []

    class Fake:
        refreshed = closed = 0

        def refresh(self):
            self.refreshed += 1

        def close(self):
            self.closed += 1

    batches = LazyLoader(lambda: opened.append(1) or Fake())
    batches.refresh()
    batches.close()  # nothing opened yet: both are no-ops
    assert opened == []
    loader = batches.get()
    assert batches.get() is loader and opened == [1]
    batches.refresh()
    batches.close()
    assert (loader.refreshed, loader.closed) == (1, 1)


def test_the_async_learner_sums_each_collectors_per_task_counters(tmp_path):
    """Each collector's counter file carries its running per-task sums; the learner's view adds them up (a
    collector that met no task, or an older counter file without them, adds nothing)."""
    from icrl.asynchronous.protocol import AsyncPaths, RunCounters, write_counters

    paths = AsyncPaths(tmp_path)
    paths.make_collectors_dir()
    halves = [TASKS[:2], TASKS[2:]]
    for k, half in enumerate(halves):
        write_counters(paths, k, {"env_steps": 8, **rollout_sums(half), "tasks": task_sums(half)})
    write_counters(paths, 2, {"env_steps": 8, **rollout_sums([])})
    counts = RunCounters(paths).read()
    assert metrics_from_task_sums(counts.tasks) == pytest.approx(task_metrics(TASKS))


@pytest.mark.parametrize("forged", [
    {"env_steps": 10**15, "stored_env_steps": 10**15},  # would end the run at once
    {"env_steps": "lots"}, {"env_steps": -5}, {"env_steps": True}, {"env_steps": 8, "stored_env_steps": 9},
    {"env_steps": 8, "return_sum": float("inf")}, {"env_steps": 8, "return_sum": "x"},
    {"env_steps": 8, "tasks": [1]}, {"env_steps": 8, "tasks": {"a": {"rollouts": "x"}}}, [1, 2], "text",
])
def test_a_counters_file_that_cannot_be_a_collectors_is_ignored_and_said_once(tmp_path, forged, capsys):
    """A forged or damaged async/collectors/N.json neither ends the run (1e15 env steps) nor stops the learner
    and the collectors with a traceback: it is left out of the sums, said once; a collector asked to continue it
    refuses in one line."""
    from icrl.asynchronous.protocol import AsyncPaths, RunCounters, read_own_counters, write_counters
    from icrl.config import ConfigError

    paths = AsyncPaths(tmp_path)
    paths.make_collectors_dir()
    write_counters(paths, 0, {"env_steps": 800, "stored_env_steps": 760, "stored_rollouts": 4, "rollouts": 4})
    paths.counter(1).write_text(json.dumps(forged))
    for _ in range(2):
        counts = RunCounters(paths, limit=100_000).read()
        assert (counts.env_steps, counts.stored_env_steps, counts.rollouts) == (800, 760, 4)
    assert capsys.readouterr().out.count("ignoring") == 1
    with pytest.raises(ConfigError, match="move it away"):
        read_own_counters(paths, 1, limit=100_000)
    assert read_own_counters(paths, 0, limit=100_000)["env_steps"] == 800


def test_evaluations_get_a_copy_per_rollout_only_where_one_env_steps_every_copy():
    from icrl.config import EnvConfig
    from icrl.run.build import MAX_BATCHED_EVAL_ENVS, eval_env_copies

    def cfg(env, kwargs="{}", rollouts=32, envs=8):
        return ExperimentConfig(env=EnvConfig(env=env, env_kwargs=kwargs, parallel_envs=envs)).replace(
            eval_rollouts=rollouts)

    assert eval_env_copies(cfg("tmaze", '{"length": 5}')) == 32  # batched built-in task: a row of arrays per copy
    assert eval_env_copies(cfg("tmaze", rollouts=4)) == 8  # never fewer than the run's envs
    assert eval_env_copies(cfg("tmaze", rollouts=10_000)) == MAX_BATCHED_EVAL_ENVS
    assert eval_env_copies(cfg("CartPole-v1")) == 8  # a copy of a Gymnasium env is an env of its own
    assert eval_env_copies(cfg("tmaze"), factories=[lambda: None]) == 8  # a user's factory: its own copies
    # a family's vector form (xland/) steps every copy at once, unless rendering needs the per-copy envs
    assert eval_env_copies(cfg("xland/XLand-MiniGrid-R1-9x9")) == 32
    assert eval_env_copies(cfg("xland/XLand-MiniGrid-R1-9x9", '{"render_mode": "rgb_array"}')) == 8


def test_the_result_line_says_when_no_evaluation_rollout_ended(monkeypatch, tmp_path):
    """An env whose rollouts outlast --eval-max-steps leaves return_mean None: the run still ends, with a line
    that says so and how to fix it (it raised a TypeError formatting None before)."""
    from icrl.run import artifacts

    lines: list[str] = []
    monkeypatch.setattr(artifacts, "save_weights", lambda agent, path: path)
    monkeypatch.setattr(artifacts, "plot_learning_curves", lambda *a, **k: tmp_path / "plot.png")
    monkeypatch.setattr(artifacts, "say", lines.append)
    row = {"return_mean": None, "success_rate": None, "rollouts": 0, "wall_time": 3.0}
    artifacts.finish_run(tmp_path, None, ExperimentConfig(), row, env_steps=96, updates=2)
    assert "eval return none (no evaluation rollout ended: raise --eval-max-steps)" in lines[-1]
    artifacts.finish_run(tmp_path, None, ExperimentConfig(), {**row, "return_mean": 0.5, "rollouts": 4}, 96, 2)
    assert "eval return +0.500 over 4 rollouts" in lines[-1]


def test_the_critic_reach_hint_names_the_knobs_only_where_the_reach_falls_short(capsys):
    """Pendulum at the defaults (τ 0.003, 1-step returns, 900 updates: ~3 steps of reach in 200-step episodes)
    gets the hint; the control preset's settings, a solved run and a run without episode lengths do not."""
    from icrl.config import ExperimentConfig
    from icrl.run.hints import hint_critic_reach

    pendulum = {"episode_length_mean": 200.0, "success_rate": None, "return_mean": -1345.0}
    assert hint_critic_reach(ExperimentConfig(), 900, pendulum)
    said = capsys.readouterr().out
    assert "~3 steps ahead" in said and "--tau" in said and "--n-step" in said
    control = ExperimentConfig().replace(tau=0.02, n_step=5)
    assert not hint_critic_reach(control, 756, pendulum)
    assert not hint_critic_reach(ExperimentConfig(), 900, {**pendulum, "success_rate": 1.0})
    assert not hint_critic_reach(ExperimentConfig(), 900, {"return_mean": 0.0})
    assert capsys.readouterr().out == ""


def test_evaluation_samples_from_the_policy_where_the_config_says(monkeypatch):
    """--no-eval-greedy: the training-time evaluation samples its actions (as the official AMAGO evaluates), the
    default takes the policy's most likely ones."""
    from icrl.run import evaluate as ev

    seen: list[bool] = []
    monkeypatch.setattr(ev, "evaluate", lambda *a, greedy=True, **k: seen.append(greedy) or {})
    for greedy in (True, False):
        cfg = ExperimentConfig().replace(eval_greedy=greedy)
        ev.eval_row(None, None, cfg, torch.device("cpu"), epoch=1, env_steps=0, updates=0, start=time.time())
    assert seen == [True, False] and ExperimentConfig().eval.eval_greedy
