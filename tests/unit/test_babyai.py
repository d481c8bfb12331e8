"""BabyAI levels: one-hot image / direction / mission-token observations, a vocabulary that covers minigrid's
grammar, seeding, a task (layout + mission) kept within a rollout, success from the BabyAI bot, quiet mission
generation, collection, and the clear error without the extra."""

from __future__ import annotations

import ast
import inspect

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from icrl.envs import Collector, RandomPolicy, TimestepWrapper, make_env, make_vector_env
from icrl.envs.tasks import babyai as bb
from icrl.nets.tstep import is_image_space

from helpers import assert_missing_extra_reported

try:
    import minigrid  # noqa: F401

    SKIP_REASON = ""
except ImportError as e:
    SKIP_REASON = f"minigrid is not installed ({e}): pip install 'icrl[minigrid]'"
requires_minigrid = pytest.mark.skipif(bool(SKIP_REASON), reason=SKIP_REASON or "-")

# go to pick up open put next the a ball box key door object red green blue purple yellow grey
#  1  2   3   4   5   6    7   8 9   10  11  12  13    14   15    16   17    18     19   20
# in front of you behind on your left right and then after
# 21   22  23  24   25   26  27   28    29   30   31   32
KNOWN = {
    "go to the red ball": [1, 2, 8, 15, 10],
    "pick up a key, then open the green door": [3, 4, 9, 12, 31, 5, 8, 16, 13],
    "put the blue box next to a grey object on your left": [6, 8, 17, 11, 7, 2, 9, 20, 14, 26, 27, 28],
    "open the yellow door in front of you after you go to the purple ball behind you": [
        5, 8, 19, 13, 21, 22, 23, 24, 32, 24, 1, 2, 8, 18, 10, 25, 24,
    ],
    "pick up the box on your right and go to a door": [3, 4, 8, 11, 26, 27, 29, 30, 1, 2, 9, 13],
}  # fmt: skip


def test_tokenize_known_missions():
    assert bb.GOAL_VOCAB == 32 and len(set(bb.BABYAI_VOCAB)) == 32
    for mission, tokens in KNOWN.items():
        out = bb.tokenize_mission(mission, 20)
        assert out.dtype == np.int64 and out.shape == (20,)
        assert out[: len(tokens)].tolist() == tokens and not out[len(tokens) :].any()
    with pytest.raises(ValueError, match=r"outside the BabyAI vocabulary: \['reach', 'star'\]"):
        bb.tokenize_mission("reach the star")
    with pytest.raises(ValueError, match="more than max_mission_len=4"):
        bb.tokenize_mission("go to the red ball", 4)


@requires_minigrid
def test_vocabulary_is_minigrids_grammar():
    """Every word the verifier's `surface` methods and word lists can produce is in the vocabulary, and no
    other: scanned from minigrid's source, not sampled."""
    from minigrid.core.constants import COLOR_NAMES
    from minigrid.envs.babyai.core import verifier

    words = set(COLOR_NAMES) | set(verifier.OBJ_TYPES) | set(verifier.LOC_NAMES)
    for node in ast.walk(ast.parse(inspect.getsource(verifier))):
        if isinstance(node, ast.FunctionDef) and node.name == "surface":
            for stmt in ast.walk(node):
                if not isinstance(stmt, ast.stmt) or isinstance(stmt, (ast.Expr, ast.Assert, ast.FunctionDef)):
                    continue  # docstrings and assertion messages are not missions
                for const in ast.iter_child_nodes(stmt):
                    for c in ast.walk(const):
                        if isinstance(c, ast.Constant) and isinstance(c.value, str):
                            words |= set(c.value.replace(",", " ").split())
    assert words == set(bb.BABYAI_VOCAB)


@requires_minigrid
def test_spaces_image_encoding_and_checker():
    env = bb.BabyAI("GoToLocal")
    space = env.observation_space
    assert space["image"] == gym.spaces.Box(0, 255, (7, 7, 20), np.uint8) and is_image_space(space["image"])
    assert space["goal"] == gym.spaces.Box(0, 32, (72,), np.int64) and env.metadata["goal_vocab"] == 32
    assert space["direction"] == gym.spaces.Discrete(4) and env.action_space == gym.spaces.Discrete(7)
    obs, info = env.reset(seed=0)
    assert space.contains(obs) and info["mission"] == env.mission and info["task"] == "GoToLocal"
    assert bb.BabyAI("BabyAI-GoToLocal-v0").level == "GoToLocal"  # the level's name, also from its id
    assert obs["goal"].tolist() == bb.tokenize_mission(env.mission).tolist()
    # the one-hot image decodes back to minigrid's (object, color, state) ids
    raw = env.level_env.unwrapped.gen_obs()["image"]  # [7, 7, 3]
    hot = obs["image"] > 0
    assert set(np.unique(obs["image"])) == {0, 255} and np.all(hot.sum(-1) == 3)
    decoded = np.stack([hot[..., :11].argmax(-1), hot[..., 11:17].argmax(-1), hot[..., 17:].argmax(-1)], -1)
    assert np.array_equal(decoded, raw)
    check_env(bb.BabyAI("GoToLocal", max_mission_len=8), skip_render_check=True)
    # flat: the same one-hot as a float vector (for the MLP / Nature-CNN-free setups)
    flat = bb.BabyAI("GoToLocal", image_encoding="flat")
    fobs, _ = flat.reset(seed=0)
    assert flat.observation_space["image"].shape == (980,) and fobs["image"].dtype == np.float32
    assert np.array_equal(fobs["image"], hot.reshape(-1).astype(np.float32))
    ts, _ = TimestepWrapper(env).reset(seed=0)
    assert ts["obs"]["image"].dtype == np.uint8 and ts["obs"]["goal"].dtype == np.int64
    assert ts["obs"]["direction"].shape == (4,)  # one-hot heading


def _run(seed: int, steps: int = 30) -> tuple[list[str], np.ndarray]:
    env = bb.BabyAI("GoToLocal", max_mission_len=8)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    missions, out = [env.mission], [obs["image"].ravel()]
    for _ in range(steps):
        obs, r, term, trunc, _ = env.step(env.action_space.sample())
        out.append(np.append(obs["image"].ravel(), [r, obs["direction"]]))
        if term or trunc:
            obs, _ = env.reset()
            missions.append(env.mission)
    obs, _ = env.reset()
    missions.append(env.mission)
    return missions, np.concatenate(out)


@requires_minigrid
def test_seeding_is_reproducible():
    a, b, c = _run(0), _run(0), _run(1)
    assert a[0] == b[0] and np.array_equal(a[1], b[1])
    assert a[0] != c[0] and not np.array_equal(a[1], c[1])


@requires_minigrid
def test_task_kept_within_rollout_and_redrawn_across():
    env = bb.BabyAI("GoToLocal")
    first, _ = env.reset(seed=0)
    mission, layout = env.mission, env.level_env.unwrapped.grid.encode()
    for _ in range(3):
        for _ in range(4):
            env.step(env.action_space.sample())
        again, _ = env.reset(options={"new_task": False})
        assert env.mission == mission and np.array_equal(env.level_env.unwrapped.grid.encode(), layout)
        assert all(np.array_equal(first[k], again[k]) for k in first)
    missions = set()
    for _ in range(5):
        env.reset()
        missions.add(env.mission)
    assert len(missions) > 1  # a new mission (and layout) per task


@requires_minigrid
def test_success_from_the_bot_and_failure_on_timeout():
    from minigrid.utils.baby_ai_bot import BabyAIBot

    for level in ("GoToObj", "PickupLoc", "GoToSeq"):
        env = bb.BabyAI(level)
        env.reset(seed=0)
        bot = BabyAIBot(env.level_env)
        for _ in range(200):
            _, reward, term, trunc, info = env.step(bot.replan())
            assert info["success"] == float(reward > 0) and info["task"] == level  # the level names the task
            if term or trunc:
                break
        assert term and not trunc and reward > 0 and info["success"] == 1.0, level
    # turning in place never succeeds: the time limit ends the episode with success 0
    env = bb.BabyAI("GoToObj", max_steps=6)
    env.reset(seed=0)
    for t in range(6):
        _, reward, term, trunc, info = env.step(0)
        assert reward == 0.0 and info["success"] == 0.0 and not term and trunc == (t == 5)


@requires_minigrid
def test_mission_generation_is_quiet(capfd):
    raw = gym.make("BabyAI-GoToSeq-v0", disable_env_checker=True)
    raw.reset(seed=1)  # minigrid rejects a few samples for this seed and prints why
    assert "Sampling rejected" in capfd.readouterr().out
    env = bb.BabyAI("GoToSeq")
    env.reset(seed=0)
    env.task_seed = 1  # replay the same task seed through our env
    env.reset(options={"new_task": False})
    assert capfd.readouterr().out == ""
    assert env.mission == raw.unwrapped.mission


@requires_minigrid
def test_every_level_builds_and_tokenizes():
    levels = bb.babyai_levels()
    assert len(levels) == 96 and levels["GoToLocal"] == "BabyAI-GoToLocal-v0"
    assert levels["GoToObjS6"] == "BabyAI-GoToObjS6-v1"  # the latest version
    longest = 0
    for level in levels:
        env = bb.BabyAI(level)
        for seed in range(2):
            obs, _ = env.reset(seed=seed)  # raises on any word outside the vocabulary
            longest = max(longest, int((obs["goal"] > 0).sum()))
        env.close()
    assert 10 < longest <= bb.MAX_MISSION_LEN
    assert isinstance(make_env("babyai/BabyAI-GoToLocal-v0"), bb.BabyAI)  # the registered id works too
    with pytest.raises(ValueError, match="Did you mean 'GoToLocal'"):
        make_env("babyai/GoToLocl")
    with pytest.raises(ValueError, match="image_encoding"):
        make_env("babyai/GoToLocal", {"image_encoding": "rgb"})


@requires_minigrid
def test_rollouts_through_vector_env_and_collector():
    venv = make_vector_env("babyai/GoToLocal", {"max_mission_len": 8, "max_steps": 12}, 2)
    spec = venv.envs[0].action_spec
    rollouts, stats = Collector(venv, spec, seed=0).collect_rollouts(RandomPolicy(spec, seed=0), 4, seed=0)
    assert len(rollouts) == 4 and len(stats) == 4
    for r in rollouts:
        r.validate()
        T = len(r.action)
        assert r.obs["image"].shape == (T + 1, 7, 7, 20) and r.obs["image"].dtype == np.uint8
        assert r.obs["goal"].shape == (T + 1, 8) and r.obs["goal"].dtype == np.int64
        assert (r.obs["goal"] == r.obs["goal"][0]).all() and r.obs["goal"][0, 0] == 1  # "go to ..."
    assert all(s.success == float(s.ret > 0) for s in stats)
    venv.close()


def test_missing_extra_is_a_clear_error(monkeypatch, capsys):
    assert_missing_extra_reported(monkeypatch, capsys, "minigrid", ["babyai/GoToLocal"], "babyai", "minigrid")
