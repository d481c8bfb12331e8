"""`icrl` command line: `icrl train ...`, `icrl envs`, `icrl plot RUN_DIR ...`.

Flags of `icrl train` are the fields of `ExperimentConfig` (tyro), without their group prefixes:
`--env`, `--d-model`, `--seed`... A config or env error prints one line and exits with code 2.
"""

from __future__ import annotations

import sys

USAGE = """usage: icrl {train,envs,plot} ...

  icrl train [--preset NAME] [--env NAME] [--env-kwargs JSON] ...  train an agent (icrl train --help)
  icrl envs                                                         list the built-in tasks
  icrl plot RUN_DIR [RUN_DIR ...] [--out FILE]                      learning curves of finished runs
"""


def _fail(message: str) -> None:
    print(f"icrl: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _pop_option(argv: list[str], flag: str) -> tuple[str | None, list[str]]:
    """Remove `flag VALUE` or `flag=VALUE` from argv; returns (VALUE or None, the rest)."""
    rest, value, i = [], None, 0
    while i < len(argv):
        if argv[i] == flag:
            if i + 1 >= len(argv):
                _fail(f"{flag} needs a value")
            value, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith(flag + "="):
            value = argv[i].split("=", 1)[1]
        else:
            rest.append(argv[i])
        i += 1
    return value, rest


def _train(argv: list[str]) -> None:
    import tyro

    from icrl.config import ConfigError, ExperimentConfig

    from icrl.presets import PRESETS

    default = ExperimentConfig()
    preset, argv = _pop_option(argv, "--preset")
    if preset is not None:
        if preset not in PRESETS:
            _fail(f"unknown preset {preset!r}; choose one of {', '.join(sorted(PRESETS))}")
        default = PRESETS[preset]()
    cfg = tyro.cli(
        ExperimentConfig,
        args=argv,
        default=default,
        prog="icrl train",
        description="Train an agent. `--preset NAME` starts from a preset (" + ", ".join(sorted(PRESETS)) + ").",
        config=(tyro.conf.OmitArgPrefixes,),
    )
    try:
        cfg.validate()
    except ConfigError as e:
        _fail(str(e))
    from icrl.train import train

    try:
        train(cfg)
    except (ConfigError, ValueError) as e:  # bad env names / kwargs / spaces surface as ValueError
        _fail(str(e))


def _envs() -> None:
    from icrl.envs.make import BUILTIN_ENVS

    for name, factory in sorted(BUILTIN_ENVS.items()):
        doc = (factory.__doc__ or "").strip().splitlines()
        print(f"{name:<24} {doc[0] if doc else ''}")


def _plot(argv: list[str]) -> None:
    import argparse
    from pathlib import Path

    from icrl.plot import plot_learning_curves

    parser = argparse.ArgumentParser(prog="icrl plot")
    parser.add_argument("run_dirs", nargs="+")
    parser.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/learning_curve.png of the first run)")
    args = parser.parse_args(argv)
    for d in args.run_dirs:
        if not (Path(d) / "metrics.jsonl").is_file():
            _fail(f"{d} has no metrics.jsonl; pass run directories written by `icrl train`")
    out = args.out or str(Path(args.run_dirs[0]) / "learning_curve.png")
    print(plot_learning_curves(args.run_dirs, out))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, rest = argv[0], argv[1:]
    if command == "train":
        _train(rest)
    elif command == "envs":
        _envs()
    elif command == "plot":
        _plot(rest)
    else:
        _fail(f"unknown command {command!r}; choose one of train, envs, plot")


if __name__ == "__main__":
    main()
