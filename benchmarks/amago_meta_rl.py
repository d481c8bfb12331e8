"""The official AMAGO on the meta-RL rows of `benchmarks/parity.py`: Meta-Frozen-Lake and the Bernoulli bandit.

Runs *inside the official AMAGO's virtualenv* (see `benchmarks/parity.py --setup-amago`), started through
`parity_amago_run.py`, which prints one `PARITY {json}` line per evaluation. The official example for
Meta-Frozen-Lake (`examples/00_meta_frozen_lake.py`) fixes its model (width 128, 3 layers), its parallel actors
(32) and its update ratio (1,000 updates per epoch) in code, so it cannot run at the harness's settings; this
script is that example with those values taken from the command line (the official `add_common_cli` flags)
and everything else kept: the agent's τ 0.004, the one-layer timestep encoder (hidden 128, output 64, inputs
not normalised), ε-greedy from 1.0 to 0.05 with a randomised ε per actor. The ε anneal comes in as a flag
(`--eps_anneal`), set by the harness to icrl's so that both explore alike at a CPU budget (the example's
1,000,000 steps per actor would leave ε near 1 for the whole run).

- `--env meta_frozen_lake`: the official `MetaFrozenLake` (a random 5x5 lake per rollout, `--k_episodes`
  attempts of `size**2` steps each, success by attempt logged as "Episode k Success").
- `--env bandit`: icrl's `BernoulliBandit`, loaded from `icrl/envs/tasks/bandit.py` by path (the module
  imports only numpy and Gymnasium), so both libraries play the very same task. Nothing else from icrl is
  imported.
"""

import importlib.util
from argparse import ArgumentParser
from pathlib import Path

from amago import cli_utils
from amago.envs import AMAGOEnv
from amago.envs.builtin.toy_gym import MetaFrozenLake

BANDIT = Path(__file__).resolve().parent.parent / "icrl" / "envs" / "tasks" / "bandit.py"


def bandit_class():
    spec = importlib.util.spec_from_file_location("icrl_task_bandit", BANDIT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BernoulliBandit


if __name__ == "__main__":
    parser = ArgumentParser()
    cli_utils.add_common_cli(parser)
    parser.add_argument("--env", choices=["meta_frozen_lake", "bandit"], required=True)
    parser.add_argument("--lake_size", type=int, default=5)
    parser.add_argument("--k_episodes", type=int, default=3)
    parser.add_argument("--arms", type=int, default=2)
    parser.add_argument("--horizon", type=int, default=50)
    parser.add_argument("--max_seq_len", type=int, required=True)
    parser.add_argument("--eps_anneal", type=int, required=True)
    parser.add_argument("--val_steps", type=int, required=True)
    args = parser.parse_args()

    if args.env == "meta_frozen_lake":
        lake = dict(size=args.lake_size, k_episodes=args.k_episodes)
        rollout = MetaFrozenLake(**lake).max_episode_steps * args.k_episodes
        name = f"meta_frozen_lake_k{args.k_episodes}_{args.lake_size}x{args.lake_size}"
        make_env = lambda: AMAGOEnv(MetaFrozenLake(**lake), env_name=name)  # noqa: E731
    else:
        Bandit = bandit_class()
        rollout = args.horizon
        make_env = lambda: AMAGOEnv(Bandit(arms=args.arms, horizon=args.horizon), env_name="bandit")  # noqa: E731

    config = {}
    traj_encoder_type = cli_utils.switch_traj_encoder(
        config, arch=args.traj_encoder, memory_size=args.memory_size, layers=args.memory_layers
    )
    tstep_encoder_type = cli_utils.switch_tstep_encoder(
        config, arch="ff", n_layers=1, d_hidden=128, d_output=64, normalize_inputs=False
    )
    exploration_type = cli_utils.switch_exploration(
        config, strategy="egreedy", eps_start=1.0, eps_end=0.05, steps_anneal=args.eps_anneal, randomize_eps=True
    )
    agent_type = cli_utils.switch_agent(config, "agent", tau=0.004)
    cli_utils.use_config(config, args.configs)

    experiment = cli_utils.create_experiment_from_cli(
        args,
        make_train_env=make_env,
        make_val_env=make_env,
        max_seq_len=args.max_seq_len,
        traj_save_len=rollout,
        group_name=args.run_name,
        run_name=args.run_name,
        tstep_encoder_type=tstep_encoder_type,
        traj_encoder_type=traj_encoder_type,
        exploration_wrapper_type=exploration_type,
        agent_type=agent_type,
        val_timesteps_per_epoch=args.val_steps,
    )
    experiment = cli_utils.switch_async_mode(experiment, args.mode)
    experiment.start()
    experiment.learn()
    experiment.delete_buffer_from_disk()
