"""`icrl` command line: `icrl train ...`, `icrl eval RUN_DIR`, `icrl envs`, `icrl plot RUN_DIR ...`, the
asynchronous pair `icrl learn RUN_DIR ...` / `icrl collect RUN_DIR ...` (icrl.asynchronous) and
`icrl export-minari RUN_DIR DATASET_ID`.

Every subcommand is a dataclass of `icrl.cli.commands` parsed by tyro, one union of subcommands. Flags of
`icrl train` (and `icrl learn`) are the fields of `ExperimentConfig` without their group prefixes: `--env`,
`--d-model`, `--seed`... A config, env or run-dir error prints one line `icrl: error: ...` on stderr and exits
with code 2 (no traceback), writing nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union

from icrl.cli.commands import COMMANDS, Learn, Train, with_config
from icrl.cli.errors import fail, stopped_in_one_line, tyro_error_line

__all__ = ["USAGE", "main", "parse", "tyro_error_line"]

USAGE = """usage: icrl {train,eval,envs,plot,export,learn,collect,export-minari} ... | icrl --version

  icrl train [--preset NAME | --config FILE] [--env NAME] ...       train an agent (icrl train --help)
  icrl eval RUN_DIR [--checkpoint PATH] [--rollouts N] [--seed S]   evaluation of a run's weights
            [--parallel-envs N] [--device D] [--video N]            (table on screen, RUN_DIR/eval.json)
            [--env NAME] [--env-kwargs JSON] [--trust-run-env]      the env to act in (default: the run's)
  icrl envs [FAMILY]                                                list the built-in tasks (or a family's)
  icrl plot RUN_DIR [RUN_DIR ...] [--out FILE] [--x env_steps|wall_time]
                                                                    learning curves (seeds grouped)
  icrl learn RUN_DIR [--utd R] [--publish-every N] [train flags]    asynchronous learner (writes config.json)
  icrl collect RUN_DIR [--collector-id K] [--device D]              asynchronous collector (any number)
            [--max-env-steps N] [--max-lead STEPS] [--wait S]
            [--env NAME] [--env-kwargs JSON] [--trust-run-env]      (eval, collect, export-minari: a run's
                                                                    module:factory env runs only if asked)
  icrl export RUN_DIR OUT.zip [--checkpoint PATH] [--overwrite]  share a run: weights, config, spaces,
                                                                    metrics, plot (icrl.load("OUT.zip"))
  icrl export-minari RUN_DIR DATASET_ID [--folder fifo|protected|all] [--overwrite]
                                                                    a run's rollouts as a local Minari dataset
"""


@dataclass(frozen=True)
class _StartOnly:
    """The flags read before the full parse (see `_start_args`)."""

    preset: str | None = None
    config: str | None = None
    env_kwargs: str = "{}"
    env: str | None = None
    trust_run_env: bool = False
    run_dir: str | None = None
    resume: bool = False


def _start_args(argv: list[str], prog: str = "icrl train") -> tuple[str | None, str | None, dict[str, Any], bool]:
    """`--preset NAME`, `--config FILE` and the `--env-kwargs` among a subcommand's arguments (tyro, the rest
    ignored): the preset or file must be known before the full parse, because it supplies the flags' defaults,
    and a preset is built for the env kwargs given (icrl.config.presets.preset_config). Bad JSON is left to
    the full parse. The last value: whether the user chose the env (`--env`) or trusts the file's
    (`--trust-run-env`)."""
    import json

    import tyro

    with _tyro_errors(prog):
        known, _ = tyro.cli(_StartOnly, args=argv, return_unknown_args=True, add_help=False)
    if known.preset is not None and known.config is not None:
        fail(f"{prog}: pass --preset or --config, not both (the flags on top apply to either)")
    try:
        kwargs = json.loads(known.env_kwargs)
    except (ValueError, RecursionError):  # the full parse says what is wrong with it, in one line
        kwargs = {}
    trusted = known.env is not None or known.trust_run_env
    config = known.config
    if config is None and known.preset is None and known.resume:
        config = _resumed_config(known.run_dir if prog == "icrl train" else _positional(argv))
    return known.preset, config, kwargs if isinstance(kwargs, dict) else {}, trusted


def _positional(argv: list[str]) -> str | None:
    """`icrl learn`'s run dir: its first argument."""
    return argv[0] if argv and not argv[0].startswith("-") else None


def _resumed_config(run_dir: str | None) -> str | None:
    """`--resume` without --config or --preset starts from the run's own config.json (the flags given apply on
    top, so only what they change differs from the run), when there is one."""
    if run_dir is None or not (Path(run_dir) / "config.json").is_file():
        return None
    return run_dir


def _preset_arg(argv: list[str], prog: str = "icrl train") -> tuple[str | None, dict[str, Any]]:
    """`--preset NAME` and the `--env-kwargs` among a subcommand's arguments (`_start_args`)."""
    preset, _, kwargs, _ = _start_args(argv, prog)
    return preset, kwargs


def _start_config(preset: str | None, config_file: str | None, env_kwargs: dict[str, Any] | None = None,
                  trusted: bool = False) -> Any:
    """The config the flags apply on top of: a preset's (built for `env_kwargs`), a config.json's (a run's,
    e.g. someone else's: its run dir and --resume are not taken, so the new run gets its own folder), or the
    library defaults. A config file is data, as a run directory is (icrl.envs.user): one that names code to
    import and call as its env (`module:factory`) is refused unless the user names the env (`--env`) or
    trusts the file (`--trust-run-env`)."""
    from icrl.config import ConfigError, ExperimentConfig
    from icrl.config.presets import preset_config

    if preset is not None:
        try:
            return preset_config(preset, env_kwargs)
        except ConfigError as e:
            fail(str(e))
    if config_file is None:
        return ExperimentConfig()
    from icrl.run.load import RunDirError, load_config

    path = Path(config_file)
    try:
        if not path.exists():
            raise RunDirError(f"--config {path} does not exist; pass a config.json or a run directory")
        cfg = load_config(path) if path.is_dir() else load_config(path.parent, path.name)
    except RunDirError as e:
        fail(str(e))
    from icrl.envs.user import is_safe_env_name

    if not trusted and not is_safe_env_name(cfg.env.env):
        fail(f"the config {path} names the env {cfg.env.env!r}, code that icrl would import and call; a config file is "
             f"data, so icrl does not run it: pass --env {cfg.env.env} to build it anyway (or --trust-run-env), or "
             "--env NAME for another env")
    return cfg.replace(run_dir=None, resume=False)


def _subcommands(preset: str | None, config_file: str | None = None, env_kwargs: dict[str, Any] | None = None,
                 trusted: bool = False) -> Any:
    """The union of every subcommand for tyro, `train` and `learn` defaulting to the config of `preset` or
    `config_file` (`_start_config`)."""
    import tyro

    cfg = _start_config(preset, config_file, env_kwargs, trusted)
    defaults: dict[type, Any] = {cls: with_config(cls, cfg, preset, config_file) for cls in (Train, Learn)}
    members = [
        Annotated[cls, tyro.conf.subcommand(name, default=defaults.get(cls, tyro.MISSING_NONPROP))]
        for name, cls in COMMANDS.items()
    ]
    return Union[tuple(members)]  # noqa: UP007 - a runtime union of Annotated members


@contextlib.contextmanager
def _tyro_errors(prog: str):
    """Capture tyro's output on stderr: its usage errors (boxes of many lines) become one line, exit 2."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            yield
    except SystemExit as e:
        if e.code not in (0, None):
            fail(tyro_error_line(errors.getvalue(), prog))
        sys.stderr.write(errors.getvalue())
        raise
    sys.stderr.write(errors.getvalue())


def parse(argv: list[str]):
    """The subcommand instance `argv` (without the program name) asks for; usage errors exit 2 in one line."""
    import tyro

    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        fail(f"unknown command {command!r}; choose one of {', '.join(COMMANDS)}")
    if command == "learn" and any(a == "--run-dir" or a.startswith("--run-dir=") for a in rest):
        fail("icrl learn: the run dir is the first argument; drop --run-dir")
    preset, config_file, env_kwargs, trusted = (_start_args(rest, f"icrl {command}") if command in ("train", "learn")
                                                else (None, None, {}, False))
    if {"-h", "--help", "--help-all"} & set(rest):  # one renderer for every command's help (icrl.cli.help)
        from icrl.cli.help import command_help, train_help

        cls = COMMANDS[command]
        if command in ("train", "learn"):
            print(train_help(command, cls, _start_config(preset, config_file, env_kwargs, trusted),
                             skip=("run_dir",) if command == "learn" else (), full="--help-all" in rest), end="")
        else:
            print(command_help(command, cls), end="")
        raise SystemExit(0)
    union = _subcommands(preset, config_file, env_kwargs, trusted)
    with _tyro_errors(f"icrl {command}"):
        args = tyro.cli(union, args=argv, prog="icrl", config=(tyro.conf.OmitArgPrefixes,))
    named = any(a == "--run-dir" or a.startswith("--run-dir=") for a in rest)
    if command == "train" and preset is not None and not named and not args.config.run.resume:
        args = dataclasses.replace(args, config=args.config.replace(run_dir=_fresh(args.config.run.run_dir)))
    return args


def _fresh(run_dir: str | None) -> str | None:
    """A preset's run dir (e.g. runs/tmaze20), or the first of runs/tmaze20-2, -3, ... that holds no run: a
    default never collides with an earlier run (a run dir the user names still does, unless --resume)."""
    from icrl.run.rundir import holds_run

    if run_dir is None or not holds_run(Path(run_dir)):
        return run_dir
    n = 2
    while holds_run(Path(f"{run_dir}-{n}")):
        n += 1
    return f"{run_dir}-{n}"


def show_icrl_warnings_in_one_line() -> None:
    """icrl's own warnings (their text starts with "icrl:", e.g. bf16 on a CPU that emulates it) print as the
    one line they are, without Python's file:line prefix and source line; other warnings print as usual."""
    default = warnings.showwarning
    if getattr(default, "__name__", "") == "show_icrl_warning":  # main() ran before in this process
        return

    def show_icrl_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                          file: Any = None, line: str | None = None) -> None:
        if str(message).startswith("icrl:"):
            print(str(message), file=file if file is not None else sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    warnings.showwarning = show_icrl_warning


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    if argv[0] in ("-V", "--version"):
        from icrl import __version__

        print(f"icrl {__version__}")
        return
    from icrl.config.errors import speak_again, speak_cli

    show_icrl_warnings_in_one_line()
    token = speak_cli()  # errors name flags (--resume), not Python arguments (resume=True)
    try:
        with stopped_in_one_line(argv[0]):  # Ctrl-C / SIGTERM at any moment: one line, exit 130 / 143
            parse(argv).run()
    except BrokenPipeError:  # `icrl train --help-all | head`: the reader left; say nothing more (Python's docs' recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    finally:
        speak_again(token)


if __name__ == "__main__":
    main()
