"""The task registry (icrl.envs.registry) is the one place a built-in task is declared: its kwargs are its env's
signature, its batched form (a task on arrays) takes exactly those, and `icrl envs` and the batched path read it."""

import ast
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from icrl.cli.commands import Envs
from icrl.envs import BUILTIN_ENVS, make_vector_env
from icrl.envs.batched import BatchedTaskEnv
from icrl.envs.registry import ENV_FAMILIES, TASKS, batched_env, has_batched_form

ROOT = Path(__file__).resolve().parents[2]
BATCHED = sorted(name for name, task in TASKS.items() if task.on_arrays)


def test_the_eight_batched_tasks_and_their_families():
    assert BATCHED == sorted(["tmaze", "tmaze_active", "cue_recall", "goal_grid", "mazerunner", "package_delivery",
                              "meta_frozen_lake", "dark_key_door"])
    families = {name: TASKS[name].family for name in BATCHED}
    assert {n for n, f in families.items() if f == "memory"} == {"tmaze", "tmaze_active", "cue_recall"}
    assert {n for n, f in families.items() if f == "goal"} == {"goal_grid", "mazerunner", "package_delivery"}
    assert {n for n, f in families.items() if f == "meta"} == {"meta_frozen_lake", "dark_key_door"}


@pytest.mark.parametrize("name", BATCHED)
def test_a_batched_form_takes_exactly_the_per_copy_kwargs(name):
    """The accepted kwargs are the task's signature's (render_mode aside: a vector env that renders keeps its
    one-copy envs), and the batched form builds with every one of them."""
    task = TASKS[name]
    per_copy = set(inspect.signature(task.make).parameters)
    assert task.kwargs() == per_copy and task.batched_kwargs() == per_copy - {"render_mode"}
    defaults = {k: p.default for k, p in inspect.signature(task.make).parameters.items() if k != "render_mode"}
    venv = batched_env(name, defaults, 2)
    assert isinstance(venv, BatchedTaskEnv) and type(venv.copies) is task.make


@pytest.mark.parametrize("name", [n for n in TASKS if n.startswith("popgym/")][:1] + ["bandit", "crafter"])
def test_a_task_without_a_batched_form_is_built_per_copy(name):
    assert TASKS[name].batched_kwargs() == frozenset() and not has_batched_form(name, {})
    assert batched_env(name, {}, 2) is None


def test_the_batched_path_reads_the_registry():
    assert isinstance(make_vector_env("goal_grid", {"size": 3}, 2), BatchedTaskEnv)
    assert has_batched_form("tmaze", {"length": 3, "horizon": 9}) and not has_batched_form("tmaze", {"seed": 1})
    assert not has_batched_form("tmaze", {"render_mode": "ansi"})  # rendering keeps the per-copy envs
    with pytest.raises(ValueError, match="does not accept the keyword argument 'seed'"):  # the per-copy message
        make_vector_env("tmaze", {"seed": 1}, 2)


def test_icrl_envs_lists_exactly_the_registry(capsys):
    Envs().run()
    lines = capsys.readouterr().out.splitlines()
    listed = [line.split()[0] for line in lines]
    tasks = sorted(n for n in TASKS if not n.startswith("popgym"))
    assert listed[: len(tasks)] == tasks
    assert set(listed[len(tasks):]) == {p + "<name>" for p in ("popgym/", *ENV_FAMILIES)}
    assert all(TASKS[n].summary() in line for n, line in zip(tasks, lines))
    assert dict(BUILTIN_ENVS) == {n: t.make for n, t in TASKS.items()}  # the public name -> factory view


def test_no_other_module_names_the_built_in_tasks_in_a_table():
    """A dict, set, list or tuple of two or more task names outside the registry is a second registry."""
    offenders = []
    for path in sorted((ROOT / "icrl").rglob("*.py")):
        if path.name == "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
            if not isinstance(node, (ast.Dict, ast.Set, ast.List, ast.Tuple)) or items is None:
                continue
            names = [k.value for k in items if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            if len(names) >= 2 and len(names) == len(items) and set(names) <= TASKS.keys():
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"task names listed outside icrl/envs/registry.py: {offenders}"


@pytest.mark.parametrize("name", BATCHED)
def test_a_task_on_arrays_draws_every_mode_it_declares_and_refuses_the_others(name):
    task = TASKS[name]
    modes = task.make.metadata["render_modes"]
    if "render_mode" not in inspect.signature(task.make).parameters:
        assert modes == [] and task.make().render() is None  # no mode to ask for
        return
    for mode in modes:
        env = task.make(render_mode=mode)
        env.reset(seed=0)
        drawn = env.render()
        if mode == "ansi":
            assert isinstance(drawn, str) and "A" in drawn  # the agent is drawn
        else:
            assert isinstance(drawn, np.ndarray) and drawn.dtype == np.uint8 and drawn.ndim == 3 and drawn.shape[2] == 3
    for mode in {"ansi", "rgb_array", "human"} - set(modes):
        with pytest.raises(ValueError, match=re.escape(f"render_mode must be one of {modes!r}")):
            task.make(render_mode=mode)
