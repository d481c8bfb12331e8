import json
import os
import subprocess
import sys
import time

import pytest

import icrl
from icrl.cli import _preset_arg
from icrl.config import ExperimentConfig
from icrl.config.presets import PRESETS

from helpers import cli, run_icrl, tiny


def test_preset_arg_forms():
    assert _preset_arg(["--a", "1", "--preset", "tmaze", "--b"]) == ("tmaze", {})
    assert _preset_arg(["--preset=cue_recall"]) == ("cue_recall", {})
    assert _preset_arg(["RUN_DIR", "--seed", "3", "--help"]) == (None, {})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_configs(name):
    cfg = PRESETS[name]().validate()
    assert json.loads(cfg.to_json())["env"]["env"]


def test_preset_with_flags_on_top(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "icrl", "train", "--preset", "tmaze", "--env-kwargs", '{"length": 3}',
         "--total-env-steps", "32", "--steps-per-epoch", "16", "--parallel-envs", "2", "--updates-per-epoch", "1",
         "--eval-rollouts", "2", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["env"]["env_kwargs"] == '{"length": 3}' and cfg["model"]["d_model"] == 32  # preset kept, flag applied
    assert cfg["schedule"]["total_env_steps"] == 32


def test_unknown_preset_and_command_exit_2():
    for args in (["train", "--preset", "nope"], ["frobnicate"]):
        out = run_icrl(*args)
        assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1


def test_envs_lists_builtin_tasks():
    out = run_icrl("envs")
    assert out.returncode == 0 and "tmaze" in out.stdout and "cue_recall" in out.stdout


def test_wandb_backend_logs_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is an optional back-end (pip install wandb)")
    from icrl.run.reporting import make_loggers

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = make_loggers(tmp_path, ("wandb",), {"seed": 0})
    log.write({"kind": "train", "env_steps": 10, "train/loss": 1.5})
    log.write({"kind": "eval", "env_steps": 10, "return_mean": 0.5})
    log.close()
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2


def test_learn_takes_the_asynchronous_group(tmp_path, monkeypatch):
    """`icrl learn --utd --publish-every --max-lead` reach `learn` in the config's asynchronous group (what
    config.json records for the collectors); a bad value exits 2."""
    import icrl.asynchronous.learn as learn_module
    from icrl.cli import main

    seen: dict = {}
    monkeypatch.setattr(learn_module, "learn", lambda cfg, **kw: seen.update(learn=kw, cfg=cfg))
    run = tmp_path / "run"
    main(["learn", str(run), "--utd", "0.5", "--publish-every", "3", "--max-lead", "7", "--device", "cpu"])
    a = seen["cfg"].asynchronous
    assert (a.utd, a.publish_every, a.max_lead) == (0.5, 3, 7) and seen["cfg"].run.run_dir == str(run)
    with pytest.raises(SystemExit) as stop:
        main(["learn", str(run), "--publish-every", "0"])
    assert stop.value.code == 2


# ------------------------------------------------------------------ icrl collect --max-lead, the real collector
# T-Maze of length 1: every rollout is one 2-step episode, and a round (steps_per_epoch = 8 over 2 env copies)
# ends exactly at rollout ends, so a collector's stored env steps are its env steps, 8 per round.
ROUND = 8
UTD = 0.5


class _Stop:
    """The collector's stop flag (a StopFlag without signal handlers), set by the test's learner."""

    signal: str | None = None

    def __bool__(self) -> bool:
        return self.signal is not None


class _Learner:
    """The learner's side of the asynchronous protocol, driven by the collector's waits instead of a clock:
    `icrl.asynchronous.collect` calls `sleep` only while it pauses for newer weights, so each call is one
    look at a paused collector. At each new pause it records (published updates, stored env steps), then
    publishes `updates` more updates, or stops the collector after `pauses` pauses."""

    def __init__(self, run, agent, pauses: int, updates: int) -> None:
        from icrl.asynchronous.protocol import AsyncPaths

        self.paths, self.agent, self.pauses_left, self.step = AsyncPaths(run), agent, pauses, updates
        self.updates, self.seen, self.stop, self.sleeps = 0, [], _Stop(), 0
        self.paths.make_collectors_dir()  # async/, where the weights are published
        self.publish()

    def publish(self) -> None:
        from icrl.asynchronous.protocol import publish_weights

        before = self.paths.weights.stat().st_mtime_ns if self.paths.weights.exists() else None
        publish_weights(self.agent, self.paths, self.updates, UTD)
        after = self.paths.weights.stat()
        if after.st_mtime_ns == before:  # collectors reload on an mtime change: two publishes in one clock tick
            os.utime(self.paths.weights, ns=(after.st_atime_ns, before + 1))

    def stored(self) -> int:
        from icrl.data import list_rollout_files

        return sum(f.num_timesteps - 1 for f in list_rollout_files(self.paths.replay / "fifo"))

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        assert self.sleeps < 100, f"the collector stayed paused after {self.seen}: it never took the new weights"
        pause = (self.updates, self.stored())
        if self.seen and self.seen[-1] == pause:  # the same pause, looked at again
            return
        self.seen.append(pause)
        self.pauses_left -= 1
        if self.pauses_left == 0:
            self.stop.signal = "the test"
        else:
            self.updates += self.step
            self.publish()


def _async_run(tmp_path, name: str, max_lead: int | None, monkeypatch, pauses: int = 2, updates: int = 8):
    """A run directory as `icrl learn` leaves it for collectors (config.json, published weights after 0
    updates at utd 0.5), and the learner that answers the collector's pauses."""
    import types

    import icrl.asynchronous.collect as collect_module
    from icrl.agent.model import build_agent
    from icrl.envs.make import make_run_envs
    from icrl.envs.wrapper import agent_obs_space
    from icrl.run.build import with_task_defaults
    from icrl.types import ActionSpec

    run = tmp_path / name
    cfg = with_task_defaults(ExperimentConfig().replace(
        env="tmaze", env_kwargs='{"length": 1}', parallel_envs=2, d_model=16, layers=1, heads=2, max_seq_len=8,
        max_time=16, head_hidden=16, head_layers=1, num_critics=2, steps_per_epoch=ROUND, total_env_steps=200,
        max_lead=max_lead, run_dir=str(run), device="cpu"))
    run.mkdir()
    (run / "config.json").write_text(cfg.to_json())
    venv = make_run_envs(cfg.env, 1)
    agent = build_agent(cfg, agent_obs_space(venv), ActionSpec.from_space(venv.single_action_space), "cpu")
    venv.close()
    learner = _Learner(run, agent, pauses, updates)
    fake_time = types.SimpleNamespace(sleep=learner.sleep, time=time.time, monotonic=time.monotonic)
    monkeypatch.setattr(collect_module, "time", fake_time)
    monkeypatch.setattr(collect_module, "StopFlag", lambda: learner.stop)  # no signal handlers in pytest
    return run, learner


def _counters(run, collector_id: int = 0) -> dict:
    return json.loads((run / "async" / "collectors" / f"{collector_id}.json").read_text())


@pytest.mark.parametrize(("flag", "lead"), [(None, 12), ("4", 4)])
def test_collect_pauses_max_lead_steps_ahead_of_the_published_updates(tmp_path, monkeypatch, flag, lead):
    """What --max-lead promises: a collector stores no round once the stored env steps exceed the learner's
    published updates / utd by more than max_lead, so it is never more than max_lead + one round ahead; it
    waits with the weights it has and goes on when newer ones allow. Without the flag it takes the run's
    max_lead from config.json (12 here); the flag wins over it."""
    from icrl.cli import main

    run, learner = _async_run(tmp_path, "run", 12, monkeypatch)
    main(["collect", str(run), *([] if flag is None else ["--max-lead", flag])])
    assert len(learner.seen) == 2, learner.seen
    for updates, stored in learner.seen:  # paused once ahead, not before and not later than the next round
        assert updates / UTD + lead < stored <= updates / UTD + lead + ROUND, (learner.seen, lead)
    assert learner.seen[1][1] > learner.seen[0][1]  # the newer weights let it collect again
    counters = _counters(run)
    assert counters["stored_env_steps"] == learner.seen[-1][1] and counters["state"] == "stopped by the test"
    assert counters["weights_updates"] == learner.seen[-1][0]  # it acted with the weights that allowed the round


def test_collect_without_max_lead_never_waits_for_the_learner(tmp_path, monkeypatch):
    """Unset in config.json and on the command line: the collector runs free of the learner's updates, here
    until --max-env-steps, far beyond any lead (the learner stays at 0 updates: a pause would fail the test)."""
    from icrl.cli import main

    run, learner = _async_run(tmp_path, "run", None, monkeypatch, pauses=1)
    main(["collect", str(run), "--max-env-steps", str(6 * ROUND)])
    assert learner.sleeps == 0 and learner.seen == []
    counters = _counters(run)
    assert counters["stored_env_steps"] == learner.stored() == 6 * ROUND and counters["state"] == "finished"


def _help(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "icrl", *args], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "120"})
    assert out.returncode == 0 and not out.stderr, out.stderr
    return out.stdout


def test_train_help_all_lists_every_flag_by_group():
    text = _help("train", "--preset", "tmaze", "--help-all")
    for group in ("env:", "model:", "loss:", "asynchronous:"):
        assert f"\n{group}\n" in text
    assert "--d-model N" in text and "(default: 32)" in text  # the preset's value is the default


def _described(text: str) -> str:
    """A help's text with its rows' wrapping undone: what a reader reads as one paragraph per flag."""
    return " ".join(text.split())


@pytest.mark.parametrize("args", [("train", "--help"), ("train", "--help-all"), ("learn", "RUN", "--help-all"),
                                  ("plot", "--help"), ("eval", "--help"), ("collect", "--help"), ("export", "--help"),
                                  ("envs", "--help"), ("export-minari", "--help")])
def test_every_help_has_one_style_and_whole_descriptions(args):
    """One renderer for every command (icrl.cli.help): a usage line, the description, rows of flags; in the full
    helps every field's docstring reads whole (no box, no sentence broken off), and a flag's default is worded
    the same in `--help` and `--help-all`."""
    import dataclasses

    from icrl.cli.commands import COMMANDS
    from icrl.cli.help import field_docs
    from icrl.config import ExperimentConfig

    text = _help(*args)
    assert text.startswith(f"usage: icrl {args[0]}") and "╭" not in text and "│" not in text
    read = _described(text)
    classes = [COMMANDS[args[0]]]
    if args[-1] == "--help-all":
        classes += [type(getattr(ExperimentConfig(), g.name)) for g in dataclasses.fields(ExperimentConfig)]
    if args[-1] == "--help-all" or args[0] not in ("train", "learn"):
        for cls in classes:
            for name, doc in field_docs(cls).items():
                own = cls is COMMANDS[args[0]]
                if not (own and name == "config") and not (name == "run_dir" and (own or args[0] == "learn")):
                    assert _described(doc) in read, (cls.__name__, name)
    if args == ("train", "--help"):
        full = _described(_help("train", "--help-all"))
        for default in ("(default: the task's, else 256)", "(default: tmaze)", "(default: 8)"):
            assert default in read and default in full


@pytest.mark.parametrize("command", ["train", "learn"])
def test_help_shows_the_common_flags_first_and_names_every_flag(command):
    """`--help` fits a screen: the flags a first run needs, described, then every other flag by name."""
    import re

    args = [command, *(["RUN"] if command == "learn" else [])]
    short, full = _help(*args, "--preset", "control", "--help"), _help(*args, "--preset", "control", "--help-all")
    assert len(short.splitlines()) <= 80 and len(full.splitlines()) > 3 * len(short.splitlines())
    flags = {f.split("/")[0] for f in re.findall(r"--[a-z][a-z0-9-]*[a-z0-9]", full)} - {"--help"}
    named = set(re.findall(r"--[a-z][a-z0-9-]*[a-z0-9]", short))
    missing = {f for f in flags - named if not (f.startswith("--no-") and "--" + f[5:] in named)}  # --x: --no-x too
    assert missing == set() and named - flags == {"--help-all"}
    common = short.index("common flags:")
    for f in ("--env ", "--seed ", "--total-env-steps ", "--device "):
        assert common < short.index(f) < short.index("every other flag")
    assert "(default: 50000)" in short  # the preset's budget
    assert "(default: None)" not in short and "(default: the task's, else 256)" in short  # what unset becomes
    assert all(name in short for name in PRESETS)
    assert ("  --run-dir STR" in short) == (command == "train")  # learn: RUN_DIR is its first argument


def test_icrl_warnings_print_as_one_line(capsys, monkeypatch):
    import warnings

    from icrl.cli import show_icrl_warnings_in_one_line

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # restored after the test
    show_icrl_warnings_in_one_line()
    show_icrl_warnings_in_one_line()  # idempotent: main() may run twice in one process
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("icrl: --dtype bf16 on a CPU without bf16 instructions", RuntimeWarning, stacklevel=1)
        warnings.warn("someone else's warning", UserWarning, stacklevel=1)
    err = capsys.readouterr().err
    assert "icrl: --dtype bf16 on a CPU without bf16 instructions\n" in err
    assert "RuntimeWarning" not in err and err.count("icrl:") == 1  # the other one goes to the usual display


def test_cli_version(capsys):
    assert cli("--version") == 0
    assert capsys.readouterr().out.strip() == f"icrl {icrl.__version__}"


def test_envs_lists_popgym_as_a_family(capsys):
    pytest.importorskip("popgym")
    assert cli("envs", "popgym") == 0
    out = capsys.readouterr().out.split()
    assert "popgym/RepeatPreviousEasy" in out and all(n.startswith("popgym/") for n in out)


def test_envs_shows_popgym_without_the_extra(monkeypatch, capsys):
    from icrl.envs import registry

    monkeypatch.setattr(registry, "TASKS", {k: v for k, v in registry.TASKS.items() if "popgym" not in k})
    assert cli("envs") == 0
    out = capsys.readouterr().out
    assert "popgym/<name>" in out and "pip install 'icrl[popgym]'" in out
    assert cli("envs", "popgym") == 2
    assert "pip install 'icrl[popgym]'" in capsys.readouterr().err


def test_train_from_another_runs_config_with_flags_on_top(in_tmp, capsys):
    icrl.train(tiny("runs/theirs"))
    assert cli("train", "--config", "runs/theirs/config.json", "--seed", "5") == 0
    theirs = json.loads((in_tmp / "runs/theirs/config.json").read_text())
    (mine,) = [p for p in (in_tmp / "runs").iterdir() if p.name.startswith("tmaze-5-")]  # a folder of its own
    cfg = json.loads((mine / "config.json").read_text())
    assert cfg["run"]["seed"] == 5 and cfg["run"]["run_dir"] == str(mine.relative_to(in_tmp))
    for group in ("env", "model", "schedule"):
        assert cfg[group] == theirs[group]
    capsys.readouterr()
    assert cli("train", "--config", "nowhere/config.json") == 2
    assert "nowhere/config.json does not exist" in capsys.readouterr().err
    assert cli("train", "--config", "runs/theirs", "--preset", "tmaze") == 2
