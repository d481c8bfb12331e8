"""XLand-MiniGrid (xminigrid, JAX): `xland/<env-id>` (icrl/envs/tasks/xland.py) and its vector form
(xland_vector.py). Spaces, seeding, the vector env against the per-copy envs it replaces (the batched tasks'
contract: timesteps, SAME_STEP autoresets, bridge steps, infos), `info["task"]`, the Collector, clear errors and
a tiny `icrl.train` run with `train/return/<task>`. The ruleset benchmarks are downloaded by xminigrid, so the
tests write a three-ruleset benchmark file of their own. All but the missing-extra test need xminigrid; jax
compiles each kernel once per number of copies (~1-3 s), so the tests share a few settings."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from icrl.envs import make_env, make_wrapped_env
from icrl.envs.collect import Collector, RandomPolicy
from icrl.envs.make import make_vector_env
from icrl.envs.tasks.xland_vector import XLandVectorEnv
from icrl.nets.tstep import is_image_space
from icrl.types import ActionSpec

from helpers import assert_missing_extra_reported, assert_same, tiny_run_tasks

REASON = "xminigrid is not installed: pip install 'icrl[jax]'"
XLAND = "xland/XLand-MiniGrid-R1-9x9"
KINDS = {"AgentHold", "AgentNear", "TileNear"}  # the goals of the benchmark file below


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> str:
    """A benchmark file of three rulesets (xminigrid's format), so no test downloads one."""
    pytest.importorskip("xminigrid", reason=REASON)
    import jax.numpy as jnp
    from xminigrid.benchmarks import save_bz2_pickle
    from xminigrid.core.constants import TILES_REGISTRY, Colors, Tiles
    from xminigrid.core.goals import AgentHoldGoal, AgentNearGoal, TileNearGoal
    from xminigrid.core.rules import EmptyRule, TileNearRule

    ball, square = TILES_REGISTRY[Tiles.BALL, Colors.RED], TILES_REGISTRY[Tiles.SQUARE, Colors.GREEN]
    pyramid, empty = TILES_REGISTRY[Tiles.PYRAMID, Colors.BLUE], TILES_REGISTRY[Tiles.EMPTY, Colors.EMPTY]
    goals = [AgentHoldGoal(tile=ball), AgentNearGoal(tile=square), TileNearGoal(tile_a=ball, tile_b=square)]
    rules = [EmptyRule(), EmptyRule(), TileNearRule(tile_a=ball, tile_b=square, prod_tile=pyramid)]
    tiles = [[ball, square], [square, empty], [ball, square]]
    path = str(tmp_path_factory.mktemp("xland") / "three_rulesets")
    save_bz2_pickle({
        "goals": jnp.stack([g.encode() for g in goals]),
        "rules": jnp.stack([r.encode()[None] for r in rules]),
        "init_tiles": jnp.stack([jnp.stack(t) for t in tiles]),
        "num_rules": jnp.ones(3, jnp.int32),
    }, path)  # fmt: skip
    return path


def kw(bench: str, **extra: Any) -> dict[str, Any]:
    return {"benchmark": bench, "split": "all", "max_steps": 10, **extra}  # 10-step episodes: many resets


def test_missing_extra_is_a_clear_error(monkeypatch, capsys):
    assert_missing_extra_reported(monkeypatch, capsys, "xminigrid", [XLAND], "xland", "jax")


def test_spaces_follow_the_official_observation(bench):
    env = make_env(XLAND, kw(bench))
    space = env.observation_space
    assert set(space.spaces) == {"grid", "direction_done", "goal"} and env.action_space.n == 6
    assert space["grid"].shape == (5, 5, 25) and is_image_space(space["grid"])
    assert space["goal"].dtype == np.int64 and space["goal"].shape == (5,)
    obs, info = env.reset(seed=0)
    assert space.contains(obs) and info["task"] in KINDS
    assert set(np.unique(obs["grid"])) <= {0, 255} and (obs["grid"] > 0).sum() == 2 * 25  # one tile, one colour
    assert obs["direction_done"][:4].sum() == 1 and obs["direction_done"][4] == 0 and obs["goal"].min() >= 1
    ids = make_env(XLAND, kw(bench, grid_encoding="ids"))
    assert ids.observation_space["grid"].shape == (5, 5, 2)
    wrapped = make_wrapped_env(XLAND, kw(bench), episodes_per_rollout=2)
    assert set(wrapped.observation_space["obs"].spaces) == {"grid", "direction_done", "goal"}


def test_same_seed_same_play_and_truncation(bench):
    def play(seed: int) -> list:
        env = make_env(XLAND, kw(bench))
        out = [env.reset(seed=seed)]
        for t in range(10):
            out.append(env.step(t % 3))
        return out

    a, b, c = play(3), play(3), play(4)
    for x, y in zip(a, b):
        assert_same(x[0], y[0])
        assert x[1:] == y[1:]
    assert any(not np.array_equal(x[0]["grid"], y[0]["grid"]) for x, y in zip(a, c))
    end = next(t for t, s in enumerate(a[1:], 1) if s[2] or s[3])  # 10-step episodes: step 10 at the latest
    assert a[end][4]["success"] == float(a[end][2]) and all("success" not in s[4] for s in a[1:end])
    assert [s[0]["direction_done"][4] for s in a[: end + 1]] == [0.0] * end + [1.0]  # the official done flag


@pytest.mark.parametrize("rollout", [{}, {"episodes_per_rollout": 3}, {"rollout_horizon": 25}], ids=str)
def test_vector_env_gives_what_the_per_copy_envs_give(bench, rollout):
    n = 4
    ref = make_vector_env(XLAND, kw(bench), n, native=False, **rollout)
    fast = make_vector_env(XLAND, kw(bench), n, **rollout)
    assert isinstance(fast, XLandVectorEnv) and not isinstance(ref, XLandVectorEnv)
    assert fast.single_observation_space == ref.single_observation_space
    rng = np.random.default_rng(0)
    ended, partial, reached = 0, 0, 0
    for seed in (7, None, 11):
        assert_same(ref.reset(seed=seed), fast.reset(seed=seed), f"reset({seed})")
        for step in range(40):
            actions = np.where(rng.random(n) < 0.5, 0, rng.integers(0, 6, n))  # mostly forward: goals reached
            r, f = ref.step(actions), fast.step(actions)
            for part, x, y in zip(("obs", "reward", "terminated", "truncated", "info"), r, f):
                assert_same(x, y, f"seed {seed} step {step} {part}")
            done = r[2] | r[3]
            ended, partial = ended + int(done.sum()), partial + int(0 < done.sum() < n)
            reached += int((r[1] > 0).sum())
    # rollouts ended and were autoreset, some while others went on (the masked reset; with a horizon every
    # rollout ends at once, and an inner episode's goal starts a bridge in one copy), and goals were reached
    assert ended >= n and reached and (partial or "rollout_horizon" in rollout)


def test_collector_rollouts_and_task_names(bench):
    venv = make_vector_env(XLAND, kw(bench), 3, episodes_per_rollout=2)
    spec = ActionSpec.from_space(venv.single_action_space)
    rollouts, stats = Collector(venv, spec, seed=3).collect(RandomPolicy(spec, seed=1), 150)
    assert len(rollouts) >= 3 and all(int(r.reset.sum()) == 2 for r in rollouts)
    assert {s.task for s in stats} <= KINDS and len({s.task for s in stats}) >= 2
    assert {s.episode_index for s in stats} == {0, 1} and {s.success for s in stats} <= {0.0, 1.0}
    by_ruleset = make_vector_env(XLAND, kw(bench, task_name="ruleset"), 2)
    assert set(by_ruleset.reset(seed=0)[1]["task"]) <= {"ruleset0", "ruleset1", "ruleset2"}
    minigrid = make_vector_env("xland/MiniGrid-Empty-5x5", {}, 2)
    assert list(minigrid.reset(seed=0)[1]["task"]) == ["MiniGrid-Empty-5x5"] * 2


def test_bad_kwargs_are_one_line_errors(bench):
    with pytest.raises(ValueError, match=r"Unknown XLand-MiniGrid env .*Did you mean 'XLand-MiniGrid-R1-9x9'"):
        make_env("xland/XLand-MiniGrid-R1-9x8")
    cases = [({"split": "val"}, "split"), ({"grid_encoding": "rgb"}, "grid_encoding"),
             ({"train_fraction": 1.5}, "train_fraction"), ({"max_steps": 0}, "max_steps"),
             ({"task_name": "level"}, "task_name"), ({"benchmark": "tiny-1k"}, "benchmark must be one of")]
    for bad, words in cases:
        with pytest.raises(ValueError, match=words) as e:
            make_env(XLAND, {**kw(bench), **bad})
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="one fixed task"):
        make_env("xland/MiniGrid-Empty-5x5", {"benchmark": bench})
    with pytest.raises(ValueError, match="holds no ruleset"):
        make_env(XLAND, {"benchmark": bench, "train_fraction": 0.9, "split": "test"})


def test_a_benchmark_that_cannot_be_downloaded_says_where_to_put_it(bench, monkeypatch):
    import urllib.error

    import xminigrid

    def offline(name: str) -> None:
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(xminigrid, "load_benchmark", offline)
    with pytest.raises(OSError, match=r"'small-1m' could not be downloaded .*small_1m_v3.*benchmark='/path"):
        make_env(XLAND)  # the default benchmark


def test_a_tiny_run_logs_return_per_task(bench, tmp_path):
    tiny_run_tasks(XLAND, kw(bench), tmp_path / "xland", KINDS)
