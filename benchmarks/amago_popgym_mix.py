"""The official AMAGO's `MultiTaskAgent` on the POPGym mix of `benchmarks/multitask_scale.py`.

Runs *inside the official AMAGO's virtualenv* and imports nothing from icrl (see `benchmarks/parity.py
--setup-amago`); `multitask_scale.py` starts it through `parity_amago_run.py`, which prints one `PARITY {json}`
line per evaluation with the return per game. The official code ships no such mix (its `MultiDomainPOPGym`
plays 27 games two-shot, with rewards unscaled), so this script builds the one icrl's `popgym_multi` builds:

- each rollout plays one game drawn uniformly from `--names`, one episode, no task id in the observation;
- observations are the official `POPGym` wrapper's (flattened, one-hot, a timer), zero-padded to the widest
  game; actions one `Discrete(max n)`, an id invalid for the current game played as action 0 (icrl's rule);
- every reward of game i is multiplied by `--scales[i]`, the hidden factor;
- the env's `env_name` is the current game, so the official evaluation logs "Average Total Return in <game>".

Everything else follows the official POPGym example (`examples/03_popgym_suite.py`) with its agent switched to
"multitask", except the settings that `multitask_scale.py` makes equal to icrl's run (model size, context,
parallel envs, update ratio, batch, discounts, value bins, learning rate and warm-up, exploration anneal,
reward multiplier), which come in as flags.
"""

from argparse import ArgumentParser

import gymnasium as gym
import numpy as np
from amago import cli_utils
from amago.envs import AMAGOEnv
from amago.envs.builtin.popgym_envs import POPGym


class ScaledPopgymMix(gym.Env):
    def __init__(self, names: list[str], scales: list[float]):
        self.names, self.scales = names, scales
        self.envs = [POPGym(f"popgym-{n}-v0", truncated_is_done=True) for n in names]
        self.obs_dim = max(e.observation_space.shape[0] for e in self.envs)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float32)
        self.action_space = gym.spaces.Discrete(max(e.action_space.n for e in self.envs))
        self.rng = np.random.default_rng()
        self.task = 0

    def _pad(self, obs):
        out = np.zeros(self.obs_dim, np.float32)
        out[: len(obs)] = obs
        return out

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.task = int(self.rng.integers(len(self.envs)))
        obs, info = self.envs[self.task].reset()
        return self._pad(obs), info

    def step(self, action):
        a = int(np.asarray(action).reshape(()))
        if a >= self.envs[self.task].action_space.n:
            a = 0
        obs, reward, terminated, truncated, info = self.envs[self.task].step(a)
        return self._pad(obs), float(reward) * self.scales[self.task], terminated, truncated, info


class ScaledPopgymMixAMAGO(AMAGOEnv):
    def __init__(self, names, scales):
        super().__init__(ScaledPopgymMix(names, scales), env_name="TODO")

    @property
    def env_name(self):
        return self.env.names[self.env.task]


if __name__ == "__main__":
    parser = ArgumentParser()
    cli_utils.add_common_cli(parser)
    parser.add_argument("--names", nargs="+", required=True)
    parser.add_argument("--scales", nargs="+", type=float, required=True)
    parser.add_argument("--max_seq_len", type=int, required=True)
    parser.add_argument("--gammas", nargs="+", type=float, required=True)
    parser.add_argument("--bins", type=int, required=True)
    parser.add_argument("--value_bound", type=float, required=True)
    parser.add_argument("--reward_multiplier", type=float, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--eps_anneal", type=int, required=True)
    parser.add_argument("--tstep_hidden", type=int, required=True)
    parser.add_argument("--val_steps", type=int, required=True)
    args = parser.parse_args()
    assert len(args.names) == len(args.scales)

    config = {
        "amago.nets.actor_critic.NCriticsTwoHot.min_return": -args.value_bound,
        "amago.nets.actor_critic.NCriticsTwoHot.max_return": args.value_bound,
        "amago.nets.actor_critic.NCriticsTwoHot.output_bins": args.bins,
        "binary_filter.threshold": 1e-3,
        "amago.nets.policy_dists.Discrete.clip_prob_high": 1.0,
        "amago.nets.policy_dists.Discrete.clip_prob_low": 1e-6,
        "amago.agent.Multigammas.discrete": args.gammas,
    }
    traj_encoder_type = cli_utils.switch_traj_encoder(
        config, arch=args.traj_encoder, memory_size=args.memory_size, layers=args.memory_layers
    )
    tstep_encoder_type = cli_utils.switch_tstep_encoder(
        config, arch="ff", n_layers=2, d_hidden=args.tstep_hidden, d_output=args.memory_size
    )
    agent_type = cli_utils.switch_agent(config, "multitask", reward_multiplier=args.reward_multiplier, tau=0.003)
    exploration_type = cli_utils.switch_exploration(config, "egreedy", steps_anneal=args.eps_anneal)
    cli_utils.use_config(config, args.configs)

    make_env = lambda: ScaledPopgymMixAMAGO(args.names, args.scales)  # noqa: E731
    experiment = cli_utils.create_experiment_from_cli(
        args,
        make_train_env=make_env,
        make_val_env=make_env,
        max_seq_len=args.max_seq_len,
        traj_save_len=max(args.max_seq_len, 2000),
        group_name=args.run_name,
        run_name=args.run_name,
        tstep_encoder_type=tstep_encoder_type,
        traj_encoder_type=traj_encoder_type,
        exploration_wrapper_type=exploration_type,
        agent_type=agent_type,
        val_timesteps_per_epoch=args.val_steps,
        learning_rate=args.lr,
        grad_clip=1.0,
        lr_warmup_steps=args.warmup,
    )
    experiment = cli_utils.switch_async_mode(experiment, args.mode)
    experiment.start()
    experiment.learn()
    experiment.delete_buffer_from_disk()
