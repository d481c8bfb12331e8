import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from icrl.envs import make_env
from icrl.envs.tasks.recall import CueRecall


@pytest.mark.parametrize("continuous", [True, False])
def test_cue_visible_only_first_and_answer_scored(continuous):
    env = CueRecall(delay=3, continuous=continuous)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=1)
    cue = obs[0]
    assert cue in (-1.0, 1.0) and obs[1] == 1.0 and obs[2] == 0.0
    for _t in range(3):
        obs, r, term, trunc, info = env.step(env.action_space.sample())
        assert r == 0.0 and not term and obs[0] == 0.0 and obs[1] == 0.0
    assert obs[2] == 1.0  # answer now
    right = np.array([cue], np.float32) if continuous else int(cue > 0)
    _, r, term, _, info = env.step(right)
    assert term and r == pytest.approx(1.0) and info["success"] == 1.0
    env.reset(seed=1)
    for _ in range(3):
        env.step(env.action_space.sample())
    wrong = np.array([-cue], np.float32) if continuous else int(cue < 0)
    _, r, term, _, info = env.step(wrong)
    assert term and r == pytest.approx(0.0) and info["success"] == 0.0


def test_continuous_reward_is_graded_and_builtin_name_works():
    env = make_env("cue_recall", {"delay": 0})
    obs, _ = env.reset(seed=0)
    _, r, term, _, info = env.step(np.array([0.0], np.float32))
    assert term and r == pytest.approx(0.5) and info["success"] == 0.0
    with pytest.raises(ValueError, match="delay"):
        CueRecall(delay=-1)
