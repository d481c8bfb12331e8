"""MazeRunner and Package Delivery: the goal-conditioned contract (docs/CONTRACTS.md), hidden tasks, rules."""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from icrl.envs import Collector, RandomPolicy, make_env, make_vector_env
from icrl.envs.tasks.goal_grid import GoalGrid
from icrl.envs.tasks.instruction import InstructionProgress
from icrl.envs.tasks.mazerunner import DOWN, LEFT, MOVES, RIGHT, STAY, UP, MazeRunner, carve_maze
from icrl.envs.tasks.package_delivery import NO_OP, TURN_LEFT, TURN_RIGHT, PackageDelivery
from icrl.types import ActionSpec

FORWARD = 0


# ------------------------------------------------------------------------------------------------ helpers
def bfs_moves(walls: np.ndarray, src: tuple[int, int], dst: tuple[int, int]) -> list[int]:
    """Moves (before any action permutation) of a shortest path through open cells."""
    prev: dict = {src: None}
    queue = deque([src])
    while queue:
        cell = queue.popleft()
        if cell == dst:
            break
        for m in (LEFT, UP, RIGHT, DOWN):
            nxt = (cell[0] + MOVES[m][0], cell[1] + MOVES[m][1])
            if not walls[nxt] and nxt not in prev:
                prev[nxt] = (cell, m)
                queue.append(nxt)
    moves, cell = [], dst
    while prev[cell] is not None:
        cell, m = prev[cell]
        moves.append(m)
    return moves[::-1]


def open_maze(size: int) -> np.ndarray:
    """A hand-built maze: wall border, everything inside open (walls placed by the tests)."""
    walls = np.zeros((size, size), dtype=bool)
    walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
    return walls


def set_maze(env: MazeRunner, walls: np.ndarray, goals: list[tuple[int, int]]) -> dict:
    """Install a hand-built task and start an episode of it."""
    env.set_tasks(np.array([0]), walls[None], np.array([goals]), env.action_map[:1].copy())
    obs, info = env.reset(options={"new_task": False})
    return obs


def cell(env: MazeRunner) -> tuple[int, int]:
    """The one copy's cell."""
    return int(env._pos[0, 0]), int(env._pos[0, 1])


def goals_of(env: MazeRunner) -> list[tuple[int, int]]:
    """The one copy's goal cells, in order."""
    return [(int(r), int(c)) for r, c in env.goals[0]]


def play(env: gym.Env, actions: list[int]) -> list[tuple]:
    steps = []
    for a in actions:
        steps.append(env.step(a))
        if steps[-1][2] or steps[-1][3]:
            break
    return steps


def relabel_rewards(goal0: np.ndarray, achieved: np.ndarray) -> tuple[np.ndarray, bool]:
    """The rewards of the relabeler's rule (`InstructionProgress`) for the first goal observation and the
    achieved record [T+1, K], and whether the instruction was completed."""
    progress = InstructionProgress([int(g) for g in goal0 if g > 0], len(goal0))
    rewards = [progress.update([int(t) for t in row if t > 0]) for row in achieved[1:]]
    return np.array(rewards, np.float32), progress.done


# --------------------------------------------------------------------------------------------- MazeRunner
def test_mazerunner_spaces_metadata_and_checker():
    env = MazeRunner()
    assert env.size == 15 and env.num_goals == 3 and env.time_limit == 400
    assert MazeRunner(size=11).time_limit == 250
    assert env.metadata["goal_vocab"] == 225 and env.metadata["achieved_slots"] == 1
    assert env.action_space == gym.spaces.Discrete(5)
    goal_space = env.observation_space["goal"]
    assert goal_space.dtype == np.int64 and goal_space.shape == (3,) and goal_space.high.max() == 225
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs) and info == {"achieved": []}
    assert list(obs["goal"]) == [r * 15 + c + 1 for r, c in goals_of(env)]
    assert MazeRunner(size=9).walls.shape == (1, 9, 9)  # one copy's maze
    check_env(MazeRunner(size=7, num_goals=2), skip_render_check=True)
    check_env(MazeRunner(size=9, randomized_actions=True), skip_render_check=True)


@pytest.mark.parametrize(
    "kwargs", [{"size": 8}, {"size": 3}, {"size": 5, "num_goals": 7}, {"num_goals": 0}, {"time_limit": 0}]
)
def test_mazerunner_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="MazeRunner"):
        MazeRunner(**kwargs)


@pytest.mark.parametrize("size", [5, 7, 9, 15])
def test_mazes_are_perfect(size):
    rng = np.random.default_rng(size)
    for _ in range(20):
        walls = carve_maze(size, rng)
        assert walls[0].all() and walls[-1].all() and walls[:, 0].all() and walls[:, -1].all()
        cells = {tuple(int(x) for x in rc) for rc in np.argwhere(~walls)}
        assert len(cells) == 2 * (size // 2) ** 2 - 1
        edges = sum((r, c + 1) in cells for r, c in cells) + sum((r + 1, c) in cells for r, c in cells)
        assert edges == len(cells) - 1  # a tree: connected (checked next) with no loop
        seen, queue = {next(iter(cells))}, deque([next(iter(cells))])
        while queue:
            r, c = queue.popleft()
            for dr, dc in ((0, 1), (1, 0), (0, -1), (-1, 0)):
                if (r + dr, c + dc) in cells and (r + dr, c + dc) not in seen:
                    seen.add((r + dr, c + dc))
                    queue.append((r + dr, c + dc))
        assert seen == cells


def test_mazerunner_seeding_and_hidden_task():
    a, b = MazeRunner(size=9, randomized_actions=True), MazeRunner(size=9, randomized_actions=True)
    oa, _ = a.reset(seed=3)
    ob, _ = b.reset(seed=3)
    assert (a.walls == b.walls).all() and (a.goals == b.goals).all() and (a.action_map == b.action_map).all()
    actions = np.random.default_rng(0).integers(0, 5, 60)
    for x, y in zip(play(a, actions), play(b, actions)):
        assert (x[0]["obs"] == y[0]["obs"]).all() and x[1:] == y[1:]
    walls, goals, perm = a.walls.copy(), a.goals.copy(), a.action_map.copy()
    obs, _ = a.reset(options={"new_task": False})  # same task, fresh episode
    assert (a.walls == walls).all() and (a.goals == goals).all() and (a.action_map == perm).all()
    assert (obs["goal"] == oa["goal"]).all() and cell(a) == a.start and obs["obs"][-1] == 0.0
    mazes = set()
    for _ in range(5):
        a.reset()  # a new rollout: a new task
        mazes.add((a.walls.tobytes(), a.goals.tobytes()))
    assert len(mazes) == 5 and a.reset(seed=4) and not (a.walls == walls).all()


def test_mazerunner_goals_in_order_rewards_achieved_and_zeroed_slots():
    env = MazeRunner(size=9)
    env.reset(seed=1)
    goals = goals_of(env)
    obs = set_maze(env, env.walls[0], goals)
    tokens = [env.token(g) for g in goals]
    assert list(obs["goal"]) == tokens
    rewards, cells = [], [env.start]
    for i, goal in enumerate(goals):
        moves = bfs_moves(env.walls[0], cells[-1], goal)
        for k, move in enumerate(moves):
            obs, r, term, trunc, info = env.step(move)
            cells.append(cell(env))
            assert info["achieved"] == [env.token(cell(env))]  # every step achieves the cell stood on
            rewards.append(r)
            if k < len(moves) - 1:  # on the way: no reward, slots unchanged
                assert r == 0.0 and not term and "success" not in info
                assert list(obs["goal"]) == [0] * i + tokens[i:]
        assert r == 1.0 and list(obs["goal"]) == [0] * (i + 1) + tokens[i + 1 :]
        assert term == (i == len(goals) - 1) and not trunc
    assert info["success"] == 1.0 and sum(rewards) == len(goals)
    assert [rr for rr in rewards if rr] == [1.0] * 3


def test_mazerunner_out_of_order_goal_pays_nothing():
    env = MazeRunner(size=7, num_goals=2, time_limit=100)
    env.reset(seed=0)
    walls = open_maze(7)  # 5 x 5 open room, start (5, 3)
    set_maze(env, walls, [(1, 3), (3, 3)])
    steps = play(env, [UP, UP])  # onto goal 2 first
    assert [s[1] for s in steps] == [0.0, 0.0] and steps[1][4]["achieved"] == [env.token((3, 3))]
    assert list(steps[-1][0]["goal"]) == [env.token((1, 3)), env.token((3, 3))]
    steps = play(env, [UP, UP, DOWN, DOWN])  # goal 1, then back onto goal 2
    assert [s[1] for s in steps] == [0.0, 1.0, 0.0, 1.0]
    assert list(steps[1][0]["goal"]) == [0, env.token((3, 3))] and list(steps[-1][0]["goal"]) == [0, 0]
    assert steps[-1][2] and steps[-1][4]["success"] == 1.0


def test_mazerunner_walls_block_and_sensors():
    env = MazeRunner(size=7, num_goals=1)
    env.reset(seed=0)
    walls = open_maze(7)
    walls[4, 3] = True  # a wall just north of the start (5, 3)
    obs = set_maze(env, walls, [(1, 1)])
    # row, col, free run west / north / east / south over (size - 2), time
    np.testing.assert_allclose(obs["obs"], [5 / 6, 3 / 6, 2 / 5, 0, 2 / 5, 0, 0], atol=1e-6)
    obs, r, term, trunc, info = env.step(UP)
    assert cell(env) == (5, 3) and info["achieved"] == [env.token((5, 3))] and r == 0.0
    obs, *_ = env.step(DOWN)  # the border
    assert cell(env) == (5, 3) and obs["obs"][-1] == pytest.approx(2 / 100)
    env.step(LEFT)
    obs, *_ = env.step(STAY)
    assert cell(env) == (5, 2)
    np.testing.assert_allclose(obs["obs"][:6], [5 / 6, 2 / 6, 1 / 5, 4 / 5, 3 / 5, 0], atol=1e-6)


def test_mazerunner_time_limit_truncates():
    env = MazeRunner(size=7, num_goals=1, time_limit=5)
    env.reset(seed=0)
    set_maze(env, open_maze(7), [(1, 1)])
    steps = play(env, [STAY] * 10)
    assert len(steps) == 5 and steps[-1][3] and not steps[-1][2] and steps[-1][4]["success"] == 0.0
    assert all(not s[3] and "success" not in s[4] for s in steps[:-1])


def test_mazerunner_randomized_actions_follow_permutation():
    env = MazeRunner(size=7, num_goals=1, randomized_actions=True)
    perms = set()
    for seed in range(6):
        env.reset(seed=seed)
        perms.add(tuple(env.action_map[0].tolist()))
    assert len(perms) > 1
    set_maze(env, open_maze(7), [(1, 1)])
    up = int(np.flatnonzero(env.action_map[0] == UP)[0])
    env.step(up)
    assert cell(env) == (4, 3)


# --------------------------------------------------------------------------------------- Package Delivery
def set_road(env: PackageDelivery, forks: dict[int, int], addresses: list[int], drop: int) -> dict:
    env.set_task(0, forks, addresses, drop)
    obs, _ = env.reset(options={"new_task": False})
    return obs


def forks_of(env: PackageDelivery) -> dict[int, int]:
    """The one copy's forks: cell -> the correct turn."""
    return {c: int(side) for c, side in enumerate(env.forks[0]) if side}


def test_delivery_spaces_metadata_and_checker():
    env = PackageDelivery()
    assert env.metadata["goal_vocab"] == 29 and env.metadata["achieved_slots"] == 1
    assert env.action_space == gym.spaces.Discrete(8)
    space = env.observation_space["goal"]
    assert space.dtype == np.int64 and space.shape == (4,) and space.high.max() == 29
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        assert env.observation_space.contains(obs) and info == {"achieved": []}
        addresses, forks = env.instruction(), forks_of(env)
        k = len(addresses)
        assert 2 <= k <= 4 and addresses == sorted(addresses)
        assert list(obs["goal"]) == addresses + [0] * (4 - k)
        assert not set(addresses) & set(forks) and 3 <= len(forks) <= 6
        assert 0 not in forks
    check_env(PackageDelivery(), skip_render_check=True)
    for bad in (
        {"length": 4},
        {"min_packages": 3, "max_packages": 2},
        {"length": 6, "max_packages": 5},
        {"time_limit": 0},
    ):
        with pytest.raises(ValueError, match="PackageDelivery"):
            PackageDelivery(**bad)


def test_delivery_seeding_and_hidden_task():
    a, b = PackageDelivery(), PackageDelivery()
    a.reset(seed=5)
    b.reset(seed=5)
    assert forks_of(a) == forks_of(b) and a.instruction() == b.instruction() and a.drop_action == b.drop_action
    actions = np.random.default_rng(1).integers(0, 8, 100)
    for x, y in zip(play(a, actions), play(b, actions)):
        assert (x[0]["obs"] == y[0]["obs"]).all() and x[1:] == y[1:]
    task = (forks_of(a), a.instruction(), int(a.drop_action[0]))
    a.reset(options={"new_task": False})
    assert (forks_of(a), a.instruction(), int(a.drop_action[0])) == task
    assert a._pos[0] == 0 and a._packages[0] == 3 * len(task[1])
    tasks = set()
    for _ in range(5):
        a.reset(options={"new_task": True})
        tasks.add((tuple(sorted(forks_of(a).items())), tuple(a.instruction()), int(a.drop_action[0])))
    assert len(tasks) == 5


def test_delivery_rules_rewards_and_achieved():
    env = PackageDelivery(length=10, min_packages=2, max_packages=3, time_limit=100)
    env.reset(seed=0)
    obs = set_road(env, forks={3: TURN_LEFT}, addresses=[2, 5], drop=4)
    assert list(obs["goal"]) == [2, 5, 0] and obs["obs"][1] == pytest.approx(6 / 9)
    steps = play(env, [FORWARD, 6])  # the wrong drop action: back to the depot, nothing delivered
    assert env._pos[0] == 0 and steps[-1][4]["achieved"] == [] and env._packages[0] == 6
    steps = play(env, [4])  # dropping at the depot never delivers
    assert env._pos[0] == 0 and steps[-1][4]["achieved"] == []
    steps = play(env, [FORWARD, FORWARD, 4])  # deliver at address 2
    obs, r, term, trunc, info = steps[-1]
    assert r == 1.0 and info["achieved"] == [2] and list(obs["goal"]) == [0, 5, 0] and not term
    assert env._packages[0] == 5
    steps = play(env, [FORWARD, FORWARD, 4, NO_OP])  # at the fork: forward and drops do nothing
    assert env._pos[0] == 3 and all(s[4]["achieved"] == [] and s[1] == 0 for s in steps)
    assert steps[-1][0]["obs"][2] == 1.0  # "at a fork"
    play(env, [TURN_RIGHT])  # the wrong side
    assert env._pos[0] == 0
    steps = play(env, [FORWARD] * 3 + [TURN_LEFT, 4])  # a delivery to a non-address cell: no reward
    assert env._pos[0] == 4 and steps[-1][4]["achieved"] == [4] and steps[-1][1] == 0.0
    steps = play(env, [FORWARD, 4])
    obs, r, term, trunc, info = steps[-1]
    assert r == 1.0 and term and not trunc and info["success"] == 1.0 and info["achieved"] == [5]
    assert list(obs["goal"]) == [0, 0, 0]


def test_delivery_out_of_order_budget_wrap_and_time_limit():
    env = PackageDelivery(length=10, min_packages=2, max_packages=2, time_limit=40)
    env.reset(seed=0)
    set_road(env, forks={}, addresses=[2, 5], drop=3)
    steps = play(env, [FORWARD] * 5 + [3])  # address 5 before address 2
    assert steps[-1][4]["achieved"] == [5] and steps[-1][1] == 0.0
    assert list(steps[-1][0]["goal"]) == [2, 5]
    play(env, [3] * 5)  # use up the van (6 packages)
    assert env._packages[0] == 0
    steps = play(env, [3])  # an empty van: back to the depot
    assert env._pos[0] == 0 and steps[-1][4]["achieved"] == []
    play(env, [FORWARD] * 9)
    assert env._pos[0] == 9
    play(env, [FORWARD])  # the end of the road wraps to the depot
    assert env._pos[0] == 0
    steps = play(env, [NO_OP] * 100)
    assert env._time[0] == 40 and steps[-1][3] and not steps[-1][2] and steps[-1][4]["success"] == 0.0


def test_render_modes():
    for env in (MazeRunner(size=7, num_goals=2), PackageDelivery()):
        env.render_mode = "ansi"
        env.reset(seed=0)
        text = env.render()
        assert "A" in text and len(text.splitlines()) >= 2
        env.render_mode = "rgb_array"
        frame = env.render()
        assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3
    env = MazeRunner(size=7, num_goals=2, render_mode="ansi")
    env.reset(seed=0)
    assert env.render().splitlines()[5][3] == "A" and "1" in env.render() and "2" in env.render()


# --------------------------------------------------------------------------------- vector env + collector
@pytest.mark.parametrize(
    "name, kwargs",
    [("mazerunner", {"size": 7, "num_goals": 2}), ("package_delivery", {"time_limit": 60}), ("goal_grid", {})],
)
def test_collect_through_vector_env(name, kwargs):
    assert type(make_env(name, kwargs)) in (MazeRunner, PackageDelivery, GoalGrid)
    venv = make_vector_env(name, kwargs, num_envs=2)  # every copy stepped at once (icrl.envs.batched)
    spec = ActionSpec.from_space(venv.single_action_space)
    rollouts, stats = Collector(venv, spec, seed=0).collect_rollouts(RandomPolicy(spec, 0), 4)
    assert len(rollouts) == 4 and len(stats) == 4
    for r in rollouts:
        r.validate()
        goal = r.obs["goal"]  # [T+1, k]
        assert goal.dtype == np.int64 and (goal[0] > 0).any()
        assert r.achieved is not None and r.achieved.shape == (len(r.time), 1)
        assert (r.achieved[0] == -1).all()  # the reset achieves nothing
        if name != "package_delivery":
            assert (r.achieved[1:] > 0).all()  # every step achieves the agent's cell
        rewards, success = relabel_rewards(goal[0], r.achieved)
        np.testing.assert_array_equal(rewards, r.reward)  # the record reproduces the env's rewards
        assert success == bool(r.terminated[-1])
    venv.close()


def test_multi_episode_rollout_keeps_the_task():
    venv = make_vector_env(
        "mazerunner", {"size": 7, "num_goals": 2, "time_limit": 15}, 1, episodes_per_rollout=2
    )  # every copy stepped at once, as for one episode per rollout
    spec = ActionSpec.from_space(venv.single_action_space)
    (rollout,), _ = Collector(venv, spec, seed=0).collect_rollouts(RandomPolicy(spec, 1), 1)
    starts = np.flatnonzero(rollout.reset)
    assert len(starts) == 2
    assert (rollout.obs["goal"][starts[0]] == rollout.obs["goal"][starts[1]]).all()
    venv.close()


class Oracle:
    """Knows each env's hidden task (read from the in-process SyncVectorEnv) and takes a shortest way."""

    def __init__(self, venv: gym.vector.SyncVectorEnv):
        self.envs = [e.unwrapped for e in venv.envs]

    def _action(self, env) -> int:
        current = int(env._current[0])
        if isinstance(env, MazeRunner):
            if current >= env.num_goals:
                return STAY
            move = bfs_moves(env.walls[0], cell(env), goals_of(env)[current])[0]
            return int(np.flatnonzero(env.action_map[0] == move)[0])
        pos, forks, addresses = int(env._pos[0]), forks_of(env), env.instruction()
        if pos in forks:
            return forks[pos]
        if current < len(addresses) and pos == addresses[current]:
            return int(env.drop_action[0])
        return FORWARD

    def act(self, ts, new_rollout):
        return np.array([self._action(e) for e in self.envs], dtype=np.int64)


@pytest.mark.parametrize(
    "name, kwargs",
    [("mazerunner", {"size": 9, "num_goals": 3, "randomized_actions": True}), ("package_delivery", {})],
)
def test_an_oracle_solves_every_task_and_the_record_reproduces_its_rewards(name, kwargs):
    venv = make_vector_env(name, kwargs, num_envs=2, native=False)  # the oracle reads the per-copy tasks
    spec = venv.envs[0].action_spec
    rollouts, stats = Collector(venv, spec, seed=1).collect_rollouts(Oracle(venv), 6)
    assert all(s.success == 1.0 for s in stats)
    for r in rollouts:
        k = int((r.obs["goal"][0] > 0).sum())
        assert r.terminated[-1] and r.reward.sum() == k and (r.obs["goal"][-1] == 0).all()
        rewards, success = relabel_rewards(r.obs["goal"][0], r.achieved)
        np.testing.assert_array_equal(rewards, r.reward)
        assert success
    venv.close()
