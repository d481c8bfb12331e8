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
import io
import sys
from dataclasses import dataclass
from typing import Annotated, Any, Union

from icrl.cli.commands import COMMANDS, Learn, Train, with_config
from icrl.cli.errors import fail, stopped_in_one_line, tyro_error_line

__all__ = ["USAGE", "main", "parse", "tyro_error_line"]

USAGE = """usage: icrl {train,eval,envs,plot,learn,collect,export-minari} ...

  icrl train [--preset NAME] [--env NAME] [--env-kwargs JSON] ...  train an agent (icrl train --help)
  icrl eval RUN_DIR [--checkpoint PATH] [--rollouts N] [--seed S]   greedy evaluation of a run's weights
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
  icrl export-minari RUN_DIR DATASET_ID [--folder fifo|protected|all] [--overwrite]
                                                                    a run's rollouts as a local Minari dataset
"""


@dataclass(frozen=True)
class _PresetOnly:
    """The flags read before the full parse (see `_preset_arg`)."""

    preset: str | None = None
    env_kwargs: str = "{}"


def _preset_arg(argv: list[str], prog: str = "icrl train") -> tuple[str | None, dict[str, Any]]:
    """`--preset NAME` and the `--env-kwargs` among a subcommand's arguments (tyro, the rest ignored): the
    preset must be known before the full parse, because it supplies the flags' defaults, and it is built
    for the env kwargs given (icrl.config.presets.preset_config). Bad JSON is left to the full parse."""
    import json

    import tyro

    with _tyro_errors(prog):
        known, _ = tyro.cli(_PresetOnly, args=argv, return_unknown_args=True, add_help=False)
    try:
        kwargs = json.loads(known.env_kwargs)
    except ValueError:
        kwargs = {}
    return known.preset, kwargs if isinstance(kwargs, dict) else {}


def _subcommands(preset: str | None, env_kwargs: dict[str, Any] | None = None) -> Any:
    """The union of every subcommand for tyro, `train` and `learn` defaulting to `preset`'s config."""
    import tyro

    from icrl.config import ConfigError, ExperimentConfig
    from icrl.config.presets import preset_config

    cfg = ExperimentConfig()
    if preset is not None:
        try:
            cfg = preset_config(preset, env_kwargs)
        except ConfigError as e:
            fail(str(e))
    defaults = {Train: with_config(Train, cfg, preset), Learn: with_config(Learn, cfg, preset)}
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
    preset, env_kwargs = _preset_arg(rest, f"icrl {command}") if command in ("train", "learn") else (None, {})
    union = _subcommands(preset, env_kwargs)
    with _tyro_errors(f"icrl {command}"):
        return tyro.cli(union, args=argv, prog="icrl", config=(tyro.conf.OmitArgPrefixes,))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    with stopped_in_one_line(argv[0]):
        parse(argv).run()


if __name__ == "__main__":
    main()
