"""The subcommands of `icrl`: one frozen dataclass per subcommand, whose docstring'd fields are its flags (tyro)
and whose `run()` does the work. Heavy imports (torch, envs, plotting) happen inside `run`, so parsing and
`--help` stay fast and a usage error never waits for them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from icrl.cli.errors import INPUT_ERRORS, check_ranges, fail, fail_input, run_stoppable
from icrl.config import ConfigError, ExperimentConfig
from icrl.config.bounds import MAX_PARALLEL_ENVS, MAX_ROLLOUTS
from icrl.config.errors import first_line

RunDir = Annotated[str, tyro.conf.arg(metavar="RUN_DIR")]
"""A run directory (written by `icrl train` / `icrl learn`), given as the first positional argument."""
FlatConfig = Annotated[ExperimentConfig, tyro.conf.arg(name="")]
ConfigFile = Annotated[str | None, tyro.conf.arg(name="config", metavar="FILE")]
PresetName = Annotated[str | None, tyro.conf.arg(metavar="NAME")]
"""`--config FILE`: a config.json to start from (read before the full parse, as `--preset`)."""
"""Every field of the config as a flag without its group prefix (`--d-model`, not `--model.d-model`)."""


@dataclass(frozen=True)
class RunEnvFlags:
    """The env to act in. A run directory is data, so the env it names is built only when it is a built-in task
    or a registered Gymnasium id, unless the user names one (`--env`) or opts in (`--trust-run-env`)."""

    env: str | None = None
    """Env to act in instead of the run's (any `icrl train --env` form, e.g. package.module:factory for an
    env the run cannot rebuild)."""
    env_kwargs: Annotated[str | None, tyro.conf.arg(metavar="JSON")] = None
    """Env kwargs instead of the run's."""
    trust_run_env: bool = False
    """Build the run's env even when its config.json names code (module:factory)."""

    def override(self):
        from icrl.envs.user import EnvOverride

        return EnvOverride(env=self.env, env_kwargs=self.env_kwargs, trust_run_env=self.trust_run_env)


@dataclass(frozen=True)
class Train:
    """Train an agent: collect, store, sample, update, evaluate, checkpoint (RUN_DIR/config.json records every
    value). `--preset NAME` starts from a preset; the other flags apply on top of it."""

    preset: PresetName = None
    """Start from this preset (icrl.config.presets: tmaze, cue_recall, goal_grid, multitask, control); the flags
    apply on top of it."""
    config_file: ConfigFile = None
    """Start from this config.json (or a run directory's), e.g. another run's, the flags applying on top; its
    run dir and --resume are not taken, so the new run gets its own folder."""
    trust_run_env: bool = False
    """With --config: build the env the file names even when it is code to import and call (module:factory)."""
    config: FlatConfig = field(default_factory=ExperimentConfig)

    def run(self) -> None:
        cfg = _validated(self.config)
        import icrl  # the public entry point, as a Python user calls it

        run_stoppable(icrl.train, cfg, log_dir=cfg.run.run_dir)


@dataclass(frozen=True)
class Learn:
    """Asynchronous learner: trains on the rollouts `icrl collect` processes store in RUN_DIR, throttled to at
    most --utd updates per env step stored, publishing its weights every --publish-every updates. Takes every
    `icrl train` flag (and `--preset NAME`) except --run-dir."""

    run_dir: tyro.conf.Positional[RunDir]
    """The run directory shared with the collectors (created, or continued with --resume)."""
    preset: PresetName = None
    """Start from this preset (icrl.config.presets: tmaze, cue_recall, goal_grid, multitask, control); the flags
    apply on top of it."""
    config_file: ConfigFile = None
    """Start from this config.json (or a run directory's), e.g. another run's, the flags applying on top; its
    run dir and --resume are not taken, so the new run gets its own folder."""
    trust_run_env: bool = False
    """With --config: build the env the file names even when it is code to import and call (module:factory)."""
    config: FlatConfig = field(default_factory=ExperimentConfig)

    def run(self) -> None:
        cfg = _validated(self.config.replace(run_dir=self.run_dir))
        from icrl.asynchronous.collect import StopFlag
        from icrl.asynchronous.learn import learn
        from icrl.run.checkpoint import CheckpointError

        try:
            learn(cfg, stop=StopFlag())
        except INPUT_ERRORS + (CheckpointError,) as e:
            fail_input(e, self.run_dir)


@dataclass(frozen=True)
class Collect:
    """Asynchronous collector: acts with the weights `icrl learn` publishes in RUN_DIR and stores its rollouts
    in RUN_DIR/replay, until the run's total env steps are taken or the learner finishes. Start any number."""

    run_dir: tyro.conf.Positional[RunDir]
    """The learner's run directory."""
    collector_id: int = 0
    """Distinct per collector: seeds and counters."""
    device: str = "cpu"
    """Device for acting."""
    max_env_steps: int | None = None
    """Stop after this many env steps."""
    wait: float = 600.0
    """Seconds to wait for the learner's files."""
    max_lead: Annotated[int | None, tyro.conf.arg(metavar="STEPS")] = None
    """Pause while the run's env steps exceed the learner's updates / utd by more than STEPS (default: the
    run's --max-lead in its config.json, else never pause)."""
    run_env: RunEnvFlags = field(default_factory=RunEnvFlags)

    def run(self) -> None:
        check_ranges("icrl collect", {"--collector-id": (self.collector_id, 0), "--wait": (self.wait, 0),
                                      "--max-env-steps": (self.max_env_steps, 1), "--max-lead": (self.max_lead, 0)})
        from icrl.asynchronous.collect import StopFlag, collect

        try:
            collect(self.run_dir, self.collector_id, device=self.device, wait_s=self.wait,
                    max_env_steps=self.max_env_steps, max_lead=self.max_lead, stop=StopFlag(),
                    override=self.run_env.override())
        except INPUT_ERRORS as e:
            fail_input(e, self.run_dir)


@dataclass(frozen=True)
class Eval:
    """Evaluate a run's weights greedily; prints a table and writes RUN_DIR/eval.json."""

    run_dir: tyro.conf.Positional[RunDir]
    """The run to evaluate."""
    checkpoint: str | None = None
    """Checkpoint folder (or .safetensors file, or a folder name in RUN_DIR/checkpoints); default: the latest
    checkpoint, else RUN_DIR/agent.safetensors."""
    rollouts: int | None = None
    """Rollouts to average over (default: the run's)."""
    seed: int | None = None
    """Eval seed (default: the run's seed)."""
    parallel_envs: int | None = None
    """Env copies (default: the run's)."""
    device: str = "cpu"
    """cpu, cuda, cuda:1, auto."""
    video: Annotated[int, tyro.conf.arg(metavar="N")] = 0
    """Also record N greedy rollouts to RUN_DIR/eval_video.gif (envs that render rgb_array frames)."""
    run_env: RunEnvFlags = field(default_factory=RunEnvFlags)

    def run(self) -> None:
        check_ranges("icrl eval", {"--rollouts": (self.rollouts, 1, MAX_ROLLOUTS), "--seed": (self.seed, 0, 2**63 - 1),
                                   "--parallel-envs": (self.parallel_envs, 1, MAX_PARALLEL_ENVS),
                                   "--video": (self.video, 0, 1000)})
        import torch

        from icrl.run.evaluate import evaluate_run, write_eval
        from icrl.run.load import load_config
        from icrl.run.reporting import console, eval_table

        override = self.run_env.override()
        try:
            threads = load_config(self.run_dir).run.threads
            if threads > 0:
                torch.set_num_threads(threads)
            result = evaluate_run(self.run_dir, self.checkpoint, self.rollouts, self.seed, self.parallel_envs,
                                  self.device, override)
        except INPUT_ERRORS + (RuntimeError,) as e:  # RunDirError, RunEnvError, env errors, a bad device
            fail_input(e, self.run_dir)
        for table in eval_table(result):
            console.print(table)
        try:
            print(write_eval(self.run_dir, result))
        except OSError as e:  # a read-only run dir (a shared or mounted one): the table above is the result
            fail(f"the evaluation above could not be written to {Path(self.run_dir) / 'eval.json'} "
                 f"({e.strerror or first_line(e)}); the run dir is not writable here: copy it somewhere writable")
        if self.video:
            from icrl.run.artifacts import record_video

            try:
                print(record_video(self.run_dir, self.video, checkpoint=self.checkpoint, override=override))
            except (ValueError, ImportError, OSError) as e:  # OSError: a read-only run dir
                fail(first_line(e))


@dataclass(frozen=True)
class Envs:
    """List the built-in tasks, or the members of one family (`icrl envs popgym`, `icrl envs babyai`; a
    family's optional package must be installed to list its members)."""

    family: tyro.conf.Positional[str | None] = None
    """A family prefix such as popgym, babyai or metaworld."""

    def run(self) -> None:
        from icrl.envs.registry import ENV_FAMILIES, TASKS

        families = {**_popgym_family(TASKS), **ENV_FAMILIES}
        if self.family is not None:
            self._members(families)
            return
        for name, task in sorted(TASKS.items()):  # the registry, exactly (POPGym's ~50 tasks: one line below)
            if not name.startswith("popgym"):
                print(f"{name:<28} {task.summary()}")
        for prefix, family in sorted(families.items()):
            print(f"{prefix + '<name>':<28} {family.help}")

    def _members(self, families: dict) -> None:
        prefix = str(self.family).rstrip("/") + "/"
        if prefix not in families:
            fail(f"usage: icrl envs [FAMILY]; families: {', '.join(sorted(p.rstrip('/') for p in families))}")
        try:
            members = families[prefix].members()
        except ImportError as e:
            fail(first_line(e))
        print("\n".join(prefix + m for m in members))


def _popgym_family(builtin: dict) -> dict:
    """POPGym as a family for `icrl envs`: its tasks are built-in names when the package is installed (listed
    by `icrl envs popgym`); without it the family is still shown, with the pip command."""
    from icrl.envs.make import make_env
    from icrl.envs.registry import EnvFamily

    names = sorted(n.removeprefix("popgym/") for n in builtin if n.startswith("popgym/"))

    def make(member: str, **env_kwargs: Any) -> Any:  # the built-in name; listed here, built by make_env
        return make_env("popgym/" + member, env_kwargs)

    def members() -> list[str]:
        if not names:
            raise ImportError("POPGym tasks need the optional package popgym: pip install 'icrl[popgym]'")
        return names

    state = (f"{len(names)} tasks, and popgym_multi; icrl envs popgym" if names
             else "not installed: pip install 'icrl[popgym]'")
    return {"popgym/": EnvFamily(make, members, f"POPGym memory tasks ({state})")}


@dataclass(frozen=True)
class Plot:
    """Learning curves of one or more runs (seeds of the same config grouped), and the within-rollout
    adaptation curve when the runs' evaluations recorded one."""

    run_dirs: tyro.conf.Positional[Annotated[tuple[str, ...], tyro.conf.arg(metavar="RUN_DIR [RUN_DIR ...]")]]
    """Run directories written by `icrl train`."""
    out: str | None = None
    """PNG path (default: RUN_DIR/learning_curve.png for one run; ./learning_curves.png for several, so no run's
    own plot is overwritten)."""
    x: Literal["env_steps", "wall_time"] = "env_steps"
    """x axis."""

    def run(self) -> None:
        if not self.run_dirs:
            fail("usage: icrl plot RUN_DIR [RUN_DIR ...] [--out FILE] [--x env_steps|wall_time]")
        for d in self.run_dirs:
            if not (Path(d) / "metrics.jsonl").is_file():
                fail(f"{d} has no metrics.jsonl; pass run directories written by `icrl train`")
        from icrl.run.artifacts import MULTI_RUN_PLOT

        one = Path(self.run_dirs[0]) / "learning_curve.png"
        out = Path(self.out or (one if len(set(self.run_dirs)) == 1 else MULTI_RUN_PLOT))
        if out.suffix.lower() != ".png":
            fail(f"--out {out} must be a .png file")
        from icrl.run.artifacts import adaptation_path, plot_adaptation, plot_learning_curves

        title = None
        if out == one:  # the run's own plot: drawn again as the run drew it, with its title
            from icrl.run.load import RunDirError, load_config

            try:
                e = load_config(self.run_dirs[0]).env
                title = f"{e.env} {e.env_kwargs}"
            except (RunDirError, ValueError):  # no readable config: the plot has no title, as before
                title = None
        try:
            print(plot_learning_curves(list(self.run_dirs), out, x=self.x, title=title))
            adaptation = plot_adaptation(list(self.run_dirs), adaptation_path(out))
        except OSError as e:  # a read-only run dir: the plot can go elsewhere
            fail(f"cannot write the plot {out} ({e.strerror or first_line(e)}): pass --out PATH.png somewhere writable")
        if adaptation is not None:
            print(adaptation)


@dataclass(frozen=True)
class ExportMinari:
    """Write a run's stored rollouts as a local Minari dataset (under $MINARI_DATASETS_PATH, default
    ~/.minari/datasets), in the spaces the agent sees. Multi-episode rollouts become one Minari episode per inner
    episode; `icrl train --offline-data DATASET_ID` reads them back as the original rollouts. Needs
    `pip install 'icrl[offline]'`."""

    run_dir: tyro.conf.Positional[RunDir]
    """The run whose replay is exported."""
    dataset_id: tyro.conf.Positional[Annotated[str, tyro.conf.arg(metavar="DATASET_ID")]]
    """e.g. icrl/tmaze-expert-v0 ((namespace/)name-vN)."""
    folder: Literal["fifo", "protected", "all"] = "fifo"
    """Replay folder to export: fifo (collected rollouts), protected (offline data) or all."""
    overwrite: bool = False
    """Replace an existing dataset with this id."""
    run_env: RunEnvFlags = field(default_factory=RunEnvFlags)
    """Only runs without spaces.json build their env."""

    def run(self) -> None:
        from icrl.data.offline import export_run

        try:
            path, episodes, steps = export_run(self.run_dir, self.dataset_id, folder=self.folder,
                                               overwrite=self.overwrite, override=self.run_env.override())
        except INPUT_ERRORS as e:  # bad id, existing id, no rollouts, missing extra
            fail(first_line(e))
        print(f"{self.dataset_id}: {episodes:,} episodes, {steps:,} steps in {path}")


@dataclass(frozen=True)
class Export:
    """Share a run as one zip: its weights (safetensors), config.json, spaces.json, metrics and plot; no pickle.
    `icrl.load("out.zip")` (or `icrl eval`-like use through Python) reads it back without the env."""

    run_dir: tyro.conf.Positional[RunDir]
    """The run to export."""
    out: tyro.conf.Positional[Annotated[str, tyro.conf.arg(metavar="OUT.zip")]]
    """The zip file to write."""
    checkpoint: str | None = None
    """Weights of this checkpoint (default: the ones `icrl.load(RUN_DIR)` uses: the latest checkpoint, else
    RUN_DIR/agent.safetensors)."""
    overwrite: bool = False
    """Replace OUT.zip when it exists."""

    def run(self) -> None:
        from icrl.run.load import export

        try:
            print(export(self.run_dir, self.out, self.checkpoint, overwrite=self.overwrite))
        except INPUT_ERRORS as e:
            fail(first_line(e))


COMMANDS: dict[str, type] = {
    "train": Train, "learn": Learn, "collect": Collect, "eval": Eval, "envs": Envs, "plot": Plot,
    "export": Export, "export-minari": ExportMinari,
}


def _validated(cfg: ExperimentConfig) -> ExperimentConfig:
    try:
        return cfg.validate()
    except ConfigError as e:
        fail(str(e))




def with_config(command: type, cfg: ExperimentConfig, preset: str | None, config_file: str | None = None):
    """The default instance of `command` (Train or Learn) whose config is `cfg` (a preset's or a file's), its
    positional arguments still required."""
    required = {f.name: tyro.MISSING for f in dataclasses.fields(command) if f.name == "run_dir"}
    return command(**required, preset=preset, config_file=config_file, config=cfg)
