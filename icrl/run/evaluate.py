"""Evaluate a finished (or running) run: load its config and weights, act greedily, summarise.

`evaluate` is the greedy evaluation every path runs (`eval_row`: the training-time one, seeded by the epoch);
`load_run` is the one run loader (`icrl.load`, `icrl eval`): it rebuilds the agent exactly as training does
(`icrl.run.components.build_agent`) and loads the weights of a checkpoint; `evaluate_run` evaluates them and `write_eval` stores the result in RUN_DIR/eval.json
atomically (`icrl.run.reporting.eval_table` prints it). Used by `icrl train`, `icrl learn` and `icrl eval RUN_DIR`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from icrl.config import ExperimentConfig
from icrl.envs.user import EnvOverride, run_env_config
from icrl.fileio import OutsideRunDirError, check_inside, write_text_atomic

if TYPE_CHECKING:
    from icrl.agent.model import Agent

WEIGHTS = "agent.safetensors"


def evaluate(agent: Any, collector: Any, num_rollouts: int, device: torch.device, seed: int,
             max_steps: int | None = None, greedy: bool = True) -> dict:
    """Rollouts of the policy (greedy, or sampled from it with `greedy=False`) summarised over rollouts
    (`summarize_episodes`); `max_steps` caps a rollout's length (episodes that never end), with a warning,
    so an evaluation always ends."""
    from icrl.run.episodes import summarize_episodes

    return summarize_episodes(evaluation_episodes(agent, collector, num_rollouts, device, seed, max_steps, greedy))


def evaluation_episodes(agent: Any, collector: Any, num_rollouts: int, device: torch.device, seed: int,
                        max_steps: int | None = None, greedy: bool = True) -> list:
    """The episodes of `evaluate`'s rollouts (icrl.types.EpisodeStats), before they are summarised."""
    from icrl.agent.model import AgentPolicy
    from icrl.run.loggers import say

    policy = AgentPolicy(agent, collector.num_envs, greedy=greedy, device=device)
    _, episodes = collector.collect_rollouts(policy, num_rollouts, seed=seed, max_steps=max_steps)
    if collector.capped_rollouts:
        say(f"icrl: warning: evaluation stopped at {max_steps:,} steps per rollout; {collector.capped_rollouts} "
            "rollout(s) had not ended and count as they stood (raise --eval-max-steps to let them finish)")
    return episodes


def play(agent: Any, venv: Any, device: torch.device, rollouts: int, *, seed: int, max_steps: int | None,
         deterministic: bool = True) -> dict[str, Any]:
    """Evaluate `agent` in `venv` (icrl's wrapped vector env) over exactly `rollouts` rollouts: the summary, and each
    rollout's return, success and length (`returns`, `successes`, `lengths`; `tasks` where the env names them). `icrl eval` and
    `icrl.evaluate` both call this, with the same seeds, so they agree on the same weights and env."""
    from icrl.envs import Collector
    from icrl.run.episodes import group_rollouts, rollout_task, summarize_episodes
    from icrl.seeding import derive_seed
    from icrl.types import ActionSpec

    collector = Collector(venv, ActionSpec.from_space(venv.single_action_space), seed=derive_seed(seed, "eval-cli"))
    episodes = evaluation_episodes(agent, collector, rollouts, device, derive_seed(seed, "eval-cli", "rollouts"),
                                   max_steps, greedy=deterministic)
    # every env played ceil(rollouts / N) rollouts: keep exactly `rollouts`, the first ones of each env first
    groups = sorted(group_rollouts(episodes), key=lambda r: (r[0].rollout_id, r[0].env_index))[:rollouts]
    episodes = [e for r in groups for e in r]
    tasks = [rollout_task(r) for r in groups]  # multi-task envs: each rollout's task (info["task"])
    return {**summarize_episodes(episodes), "returns": [float(sum(e.ret for e in r)) for r in groups],
            "successes": [r[-1].success for r in groups], "lengths": [int(sum(e.length for e in r)) for r in groups],
            **({"tasks": tasks} if any(t is not None for t in tasks) else {})}


def eval_row(agent: Any, collector: Any, cfg: ExperimentConfig, device: torch.device, *, epoch: int,
             env_steps: int, updates: int, start: float) -> dict:
    """The metrics row of one greedy evaluation (seeded by the epoch, so every run meets the same tasks)."""
    from icrl.run.reporting import row_head
    from icrl.run.timer import Timer
    from icrl.seeding import derive_seed

    timer = Timer()
    with timer("eval"):
        stats = evaluate(agent, collector, cfg.eval.eval_rollouts, device,
                         seed=derive_seed(cfg.run.seed, "eval", epoch), max_steps=cfg.eval.eval_max_steps)
    return {**row_head("eval", epoch, env_steps, updates, start), "time/eval_s": timer["eval"], **stats}


class RunDirError(ValueError):
    """A run directory, checkpoint or weights file that cannot be used; the message says what is wrong."""


def load_config(run_dir: str | Path, name: str = "config.json") -> ExperimentConfig:
    """A run's config (RUN_DIR/config.json, or the file `name` in that folder), checked as the flags are."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory; pass a run directory written by `icrl train`")
    path = run_dir / name
    if not path.is_file():
        raise RunDirError(f"{run_dir} has no {name}; pass a run directory written by `icrl train`")
    try:  # values checked like flags: a hand-edited config.json fails here, in one line, not deep in a build
        return ExperimentConfig.from_json(path.read_text(encoding="utf-8")).validate(check_device=False)
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise RunDirError(f"{path} is not a valid icrl config ({e})") from e


def resolve_weights(run_dir: str | Path, checkpoint: str | Path | None = None) -> Path:
    """The weights file to load.

    `checkpoint`: a checkpoint folder holding agent.safetensors, a .safetensors file, or a folder name
    inside RUN_DIR/checkpoints (`ckpt-000010`). Without it: the latest checkpoint named by
    RUN_DIR/checkpoints/latest if there is one, else the final weights RUN_DIR/agent.safetensors.
    """
    run_dir = Path(run_dir)
    if checkpoint is not None:
        candidates = [Path(checkpoint), run_dir / "checkpoints" / str(checkpoint)]
        for c in candidates:
            if c.is_file():
                return c
            if c.is_dir():
                if (c / WEIGHTS).is_file():
                    return c / WEIGHTS
                raise RunDirError(f"checkpoint folder {c} has no {WEIGHTS}")
        raise RunDirError(f"checkpoint {checkpoint} does not exist (a checkpoint folder or a .safetensors file)")
    pointer = run_dir / "checkpoints" / "latest"
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8", errors="replace").strip()
        path = run_dir / "checkpoints" / name / WEIGHTS
        # the pointer names one folder of checkpoints/ (the checkpoint module writes `ckpt-NNNNNN`): a path
        # leading elsewhere (`../../other_run/...`, a symlink out) would load, or export, another run's weights
        plain = name and "/" not in name and "\\" not in name and name not in (".", "..")
        if plain and path.is_file() and _inside(run_dir, path):
            return path
    if (run_dir / WEIGHTS).is_file():
        return run_dir / WEIGHTS
    raise RunDirError(
        f"{run_dir} has no weights: neither {WEIGHTS} nor a checkpoint in checkpoints/ (is the run finished?)"
    )


def run_spaces(cfg: ExperimentConfig) -> tuple[Any, Any]:
    """The env's own (observation space, action space) for a run without RUN_DIR/spaces.json (older icrl): the
    env of `cfg` is built once to read them (check it with `run_env_config` first)."""
    from icrl.run.components import make_run_envs

    venv = make_run_envs(cfg.env, 1)
    try:  # get_attr: the SyncVectorEnv make_run_envs builds has it; the VectorEnv base class does not
        return (venv.get_attr("env_observation_space")[0],  # type: ignore[attr-defined]
                venv.get_attr("env_action_space")[0])  # type: ignore[attr-defined]
    finally:
        venv.close()


def load_weights(agent: Agent, path: Path, device: str | torch.device = "cpu") -> None:
    """Load a weights file into `agent` strictly; RunDirError (one line) when it is unreadable or does not fit."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    try:
        missing, unexpected = load_model(agent, str(path), strict=False, device=str(device))
    except (SafetensorError, OSError) as e:
        raise RunDirError(f"cannot read weights {path}: {e}") from e
    except RuntimeError as e:  # shape mismatch
        first = str(e).strip().splitlines()[-1].strip()
        raise RunDirError(f"weights {path} do not fit the run's config: {first}; pick others with --checkpoint") from e
    if missing or unexpected:
        names = ", ".join(sorted([*missing, *unexpected])[:3])
        raise RunDirError(f"weights {path} do not fit the run's config (missing or unexpected: {names}...)")
    from icrl.guards import nonfinite_tensors

    bad = nonfinite_tensors(agent)  # a policy acting on NaN weights would return action 0, silently
    if bad:
        raise RunDirError(f"weights {path} hold NaN or inf in {len(bad)} tensor(s) (first: {bad[0]}); pick a "
                          "finite checkpoint with --checkpoint (icrl.load: a checkpoint folder)")
    agent.refresh_acting_weights()  # acting multiplies by σReparam snapshots: of these weights, not earlier ones
    agent.eval()


def _checkpoint_extra(folder: Path) -> tuple[ExperimentConfig, tuple[Any, Any] | None]:
    """(config, spaces or None) that `icrl train` stores in a checkpoint's state.json."""
    from icrl.spaces_json import read_spaces_record

    state_file = folder / "state.json"
    try:
        extra = json.loads(state_file.read_text(encoding="utf-8")).get("extra", {})
        cfg = ExperimentConfig.from_json(json.dumps(extra["config"])).validate(check_device=False)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise RunDirError(f"{state_file} holds no readable run config ({e})") from e
    return cfg, read_spaces_record(extra["spaces"], str(state_file)) if "spaces" in extra else None


def find_run(path: Path, checkpoint: str | Path | None = None) -> tuple[ExperimentConfig, Path, tuple | None]:
    """(config, weights file, the env's spaces or None) of a run directory (its latest weights, or
    `checkpoint`'s: `resolve_weights`), a checkpoint folder (RUN_DIR/checkpoints/ckpt-N) or a weights file in
    either. The spaces come from RUN_DIR/spaces.json, else from the checkpoint's state.json."""
    from icrl.spaces_json import read_spaces

    folder, weights = (path.parent, path) if path.is_file() else (path, None)
    if (folder / "config.json").is_file():  # a run directory
        cfg = load_config(folder)  # first: a config that cannot work is the error to report, not missing weights
        weights = weights or resolve_weights(folder, checkpoint)
        try:
            spaces = read_spaces(folder)
        except ValueError as e:
            raise RunDirError(str(e)) from e
        if spaces is None and (weights.parent / "state.json").is_file():  # its checkpoint has them too
            spaces = _checkpoint_extra(weights.parent)[1]
        return cfg, weights, spaces
    if (folder / "state.json").is_file():  # a checkpoint folder: RUN_DIR/checkpoints/ckpt-N
        cfg, spaces = _checkpoint_extra(folder)
        if spaces is None:
            spaces = read_spaces(folder.parent.parent)
        return cfg, weights or resolve_weights(folder.parent.parent, folder), spaces
    raise RunDirError(f"{path} is neither a run directory (config.json), a checkpoint folder (state.json) nor a "
                      "weights file in one")


def load_run(path: str | Path, device: str | torch.device = "cpu", *, checkpoint: str | Path | None = None,
             spaces_of: Callable[[ExperimentConfig], tuple] | None = None) -> tuple[Agent, ExperimentConfig, tuple]:
    """The one run loader (`icrl.load`, `icrl eval`, `icrl video`): (agent with the run's weights, in eval
    mode; config; the env's (observation, action) spaces) of whatever `find_run` takes. The agent is built
    exactly as training builds it (`icrl.run.components.build_agent`) from the recorded spaces; a run that
    recorded none (older icrl) asks `spaces_of(config)` for them. RunDirError (a ValueError, one line) for a
    missing or broken config, weights file or checkpoint, weights that do not fit, or no spaces to build with.
    """
    from icrl.device import resolve_device
    from icrl.envs.wrapper import agent_obs_space
    from icrl.run.components import build_agent
    from icrl.spaces_json import spaces_wrapper

    cfg, weights, spaces = find_run(Path(path), checkpoint)
    if spaces is None:
        if spaces_of is None:
            raise RunDirError(f"{path} records no env spaces (a run from an older icrl)")
        spaces = spaces_of(cfg)
    dev = resolve_device(device) if isinstance(device, str) else torch.device(device)
    io = spaces_wrapper(*spaces)
    agent = build_agent(cfg, agent_obs_space(io), io.action_spec, dev)
    load_weights(agent, weights, dev)
    return agent, cfg, spaces


def load_agent(
    run_dir: str | Path,
    checkpoint: str | Path | None = None,
    device: str | torch.device = "cpu",
    override: EnvOverride = EnvOverride(),
) -> tuple[Agent, ExperimentConfig]:
    """The agent of a run directory with its trained weights (in eval mode), and the run's config (`load_run`).

    A run without recorded spaces (older icrl) builds its env, which `override` must allow when config.json
    names code (`run_env_config`). Raises RunDirError (a ValueError) with a one-line message for a missing
    config or weights file, a bad checkpoint path, or weights that do not fit the config.
    """
    load_config(run_dir)  # a run directory, not a checkpoint folder: the CLI's RUN_DIR argument
    agent, cfg, _ = load_run(run_dir, device, checkpoint=checkpoint,
                             spaces_of=lambda c: run_spaces(run_env_config(c, run_dir, override)))
    return agent, cfg


def check_env_fits(venv, spaces: tuple | None, env_name: str) -> None:
    """RunDirError when the env to act in does not give the observations and actions of the agent's
    `spaces` (the env's (observation, action) spaces it was trained on, e.g. RUN_DIR/spaces.json), as with an
    env chosen with --env instead of the run's; without `spaces` (runs of older icrl) nothing is checked."""
    from icrl.spaces_json import spaces_wrapper
    from icrl.types import ActionSpec

    if spaces is None:
        return
    io = spaces_wrapper(*spaces)
    obs, spec = venv.single_observation_space["obs"], ActionSpec.from_space(venv.single_action_space)
    want_obs, want_spec = io.observation_space["obs"], io.action_spec
    if spec != want_spec or obs != want_obs:
        def show(o, s) -> str:
            return ", ".join(f"{k} {b.dtype}{list(b.shape)}" for k, b in o.spaces.items()) + f"; {s.kind} actions x{s.dim}"

        raise RunDirError(f"env {env_name!r} does not fit the run's agent: it gives {show(obs, spec)}, the agent was "
                          f"trained on {show(want_obs, want_spec)}")


def evaluate_agent(agent: Any, cfg: ExperimentConfig, spaces: tuple, device: torch.device, env: Any = None,
                   n_episodes: int = 10, deterministic: bool = True, *, env_kwargs: dict[str, Any] | None = None,
                   seed: int = 0, parallel_envs: int | None = None, max_steps: int | None = None) -> dict[str, Any]:
    """`icrl.evaluate` (icrl.policy.evaluate, which documents the arguments) for an agent of a run with config
    `cfg` trained on the env's `spaces` (observation, action); callbacks evaluate a training agent with it."""
    import dataclasses

    from icrl.envs.user import resolve_env
    from icrl.run.components import make_run_envs

    if n_episodes < 1:
        raise ValueError(f"n_episodes must be >= 1, got {n_episodes}")
    if env is None:
        cfg = run_env_config(cfg, "the policy's run")  # refuses a run env that names code
    src = resolve_env(cfg.env.env if env is None else env)
    if env_kwargs is None:
        env_kwargs = src.env_kwargs or (cfg.env.kwargs if src.name == cfg.env.env else {})
    e = dataclasses.replace(cfg.env, env=src.name, env_kwargs=json.dumps(env_kwargs))
    venv = make_run_envs(e, min(parallel_envs or src.parallel_envs or e.parallel_envs, n_episodes), factories=src.factories)
    try:
        check_env_fits(venv, spaces, src.name)
        return play(agent, venv, device, n_episodes, seed=seed, deterministic=deterministic,
                    max_steps=cfg.eval.eval_max_steps if max_steps is None else max_steps)
    finally:
        venv.close()


def eval_device(device: str) -> torch.device:
    """The torch device `device` names, usable here; RunDirError (one line) otherwise."""
    from icrl.device import resolve_device

    try:
        dev = resolve_device(device)
    except RuntimeError as e:
        raise RunDirError(f"--device {device!r} is not a torch device ({e})") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RunDirError(f"--device {device}: this torch build has no usable CUDA device; use --device cpu")
    return dev


def evaluate_run(
    run_dir: str | Path,
    checkpoint: str | Path | None = None,
    rollouts: int | None = None,
    seed: int | None = None,
    parallel_envs: int | None = None,
    device: str = "cpu",
    override: EnvOverride = EnvOverride(),
) -> dict[str, Any]:
    """Greedy evaluation of a run's weights; returns `icrl.run.episodes.summarize_episodes` plus provenance.

    The env is the run's when config.json names a built-in task or a registered id, else the one `override`
    names (--env) or allows (--trust-run-env): a run directory never makes icrl run code on its own.

    Defaults come from the run's config: its eval_rollouts, parallel_envs and seed (the eval envs are
    seeded with derive_seed(seed, "eval-cli"), apart from the training-time evaluations).
    """
    from icrl.run.components import make_run_envs
    from icrl.seeding import seed_everything
    from icrl.spaces_json import read_spaces

    if rollouts is not None and rollouts < 1:
        raise RunDirError(f"--rollouts must be >= 1, got {rollouts}")
    if parallel_envs is not None and parallel_envs < 1:
        raise RunDirError(f"--parallel-envs must be >= 1, got {parallel_envs}")
    dev = eval_device(device)
    agent, cfg = load_agent(run_dir, checkpoint, dev, override)
    cfg = run_env_config(cfg, run_dir, override)
    e = cfg.env
    seed = cfg.run.seed if seed is None else seed
    rollouts = cfg.eval.eval_rollouts if rollouts is None else rollouts
    n_envs = min(parallel_envs or e.parallel_envs, rollouts)
    seed_everything(seed)
    venv = make_run_envs(e, n_envs)
    try:
        check_env_fits(venv, read_spaces(run_dir), e.env)
        stats = play(agent, venv, dev, rollouts, seed=seed, max_steps=cfg.eval.eval_max_steps)
    finally:
        venv.close()
    return {
        "run_dir": str(run_dir),
        "weights": str(resolve_weights(run_dir, checkpoint)),
        "env": e.env,
        "env_kwargs": e.kwargs,
        "episodes_per_rollout": e.episodes_per_rollout,
        "seed": seed,
        "parallel_envs": n_envs,
        **stats,
    }


def _inside(run_dir: Path, path: Path) -> bool:
    try:
        check_inside(run_dir, path)
    except OutsideRunDirError:
        return False
    return True


def write_json_atomic(path: str | Path, data: Any) -> Path:
    """Write JSON atomically (temp file, fsync, rename over `path`)."""
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n")

def write_eval(run_dir: str | Path, result: dict[str, Any]) -> Path:
    return write_json_atomic(Path(run_dir) / "eval.json", result)
