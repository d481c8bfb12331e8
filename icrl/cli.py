"""`icrl` command line: `icrl train ...`, `icrl eval RUN_DIR`, `icrl envs`, `icrl plot RUN_DIR ...`, and the
asynchronous pair `icrl learn RUN_DIR ...` / `icrl collect RUN_DIR ...` (icrl.asynchronous.collect).

Flags of `icrl train` are the fields of `ExperimentConfig` (tyro), without their group prefixes:
`--env`, `--d-model`, `--seed`... A config, env or run-dir error prints one line `icrl: error: ...` on
stderr and exits with code 2 (no traceback), writing nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import signal
import sys

USAGE = """usage: icrl {train,eval,envs,plot,learn,collect,export-minari} ...

  icrl train [--preset NAME] [--env NAME] [--env-kwargs JSON] ...  train an agent (icrl train --help)
  icrl eval RUN_DIR [--checkpoint PATH] [--rollouts N] [--seed S]   greedy evaluation of a run's weights
            [--parallel-envs N] [--device D]                        (table on screen, RUN_DIR/eval.json)
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


class _ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors go through `_fail` (one line, exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        _fail(f"{self.prog}: {message}")


def _fail(message: str) -> None:
    print(f"icrl: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _check_ranges(parser: argparse.ArgumentParser, values: dict[str, tuple[float | None, float]]) -> None:
    """Refuse (one line, exit 2) a flag value below its minimum or not finite, before anything runs."""
    for flag, (value, lo) in values.items():
        if value is not None and not (math.isfinite(value) and value >= lo):
            _fail(f"{parser.prog}: {flag} must be >= {lo}, got {value}")


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


def _add_env_flags(parser: argparse.ArgumentParser) -> None:
    """--env / --env-kwargs / --trust-run-env: a run directory is data, so the env it names is built only when
    it is a built-in task or a registered Gymnasium id, unless the user names one or opts in."""
    parser.add_argument("--env", default=None, help="env to act in instead of the run's (any `icrl train --env` "
                        "form, e.g. package.module:factory for an env the run cannot rebuild)")
    parser.add_argument("--env-kwargs", default=None, metavar="JSON", help="env kwargs instead of the run's")
    parser.add_argument("--trust-run-env", action="store_true",
                        help="build the run's env even when its config.json names code (module:factory)")


def _override(args: argparse.Namespace):
    from icrl.envs.user import EnvOverride

    return EnvOverride(env=args.env, env_kwargs=args.env_kwargs, trust_run_env=args.trust_run_env)


def _parse_config(argv: list[str], prog: str, description: str):
    """An ExperimentConfig from `[--preset NAME] [flags]` (tyro), validated; usage errors exit 2."""
    import tyro

    from icrl.config import ConfigError, ExperimentConfig
    from icrl.config.presets import PRESETS

    default = ExperimentConfig()
    preset, argv = _pop_option(argv, "--preset")
    if preset is not None:
        if preset not in PRESETS:
            _fail(f"unknown preset {preset!r}; choose one of {', '.join(sorted(PRESETS))}")
        default = PRESETS[preset]()
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):  # tyro's usage errors are boxes of many lines
            cfg = tyro.cli(
                ExperimentConfig,
                args=argv,
                default=default,
                prog=prog,
                description=description + " `--preset NAME` starts from a preset (" + ", ".join(sorted(PRESETS)) + ").",
                config=(tyro.conf.OmitArgPrefixes,),
            )
    except SystemExit as e:
        if e.code not in (0, None):
            _fail(tyro_error_line(errors.getvalue(), prog))
        sys.stderr.write(errors.getvalue())
        raise
    sys.stderr.write(errors.getvalue())
    try:
        cfg.validate()
    except ConfigError as e:
        _fail(str(e))
    return cfg


def tyro_error_line(text: str, prog: str) -> str:
    """tyro's usage error (a titled box with help text) as one line: the error itself, the flag it suggests,
    and where the flags are listed."""
    lines = [ln.strip(" \t│╭╮╰╯") for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and set(ln) - set("-─ ")]
    body, suggestion, i = [], None, 1  # lines[0] is the box's title ("Value error", ...)
    while i < len(lines):
        ln = lines[i]
        if ln.startswith(("Argument helptext", "For full helptext")):
            break
        if ln.startswith("Perhaps you meant"):
            suggestion = lines[i + 1].split()[0] if i + 1 < len(lines) else None
            break
        body.append(ln)
        i += 1
    message = (" ".join(body) or (lines[0] if lines else "invalid arguments")).rstrip(".")
    if suggestion:
        message += f" (did you mean {suggestion}?)"
    return f"{message}; see `{prog} --help`"


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class _Stopped(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so `train`'s cleanup runs as it does on Ctrl-C."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped(signal.Signals(signum).name)


def _run_stoppable(fn, *args) -> None:
    """Run `fn`, turning SIGINT / SIGTERM into a one-line stop with the resume hint (exit 130 / 143) and the
    errors bad input causes (configs, env names and kwargs, run dirs, checkpoints, files) into one line, exit 2.
    Checkpoints and rollouts on disk are written atomically, so a stop at any moment loses nothing."""
    from icrl.config import ConfigError
    from icrl.run.checkpoint import CheckpointError

    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        fn(*args)
    except KeyboardInterrupt as e:
        name = "SIGTERM" if isinstance(e, _Stopped) else "SIGINT"
        print(f"icrl: stopped by {name}; every checkpoint written so far is kept: resume with the same command "
              "and --resume", file=sys.stderr)
        raise SystemExit(143 if name == "SIGTERM" else 130) from None
    except (ConfigError, ValueError, ImportError, CheckpointError, OSError) as e:
        _fail(_one_line(e))  # bad env names / kwargs / spaces, a missing extra, an unusable run dir or checkpoint
    finally:
        signal.signal(signal.SIGTERM, previous)


def _train(argv: list[str]) -> None:
    cfg = _parse_config(argv, "icrl train", "Train an agent.")
    from icrl.run.loop import train

    _run_stoppable(train, cfg)


def _learn(argv: list[str]) -> None:
    if argv and argv[0] in ("-h", "--help"):
        argv = ["RUN_DIR", *argv]  # tyro prints the flags
    if not argv or argv[0].startswith("-"):
        _fail("usage: icrl learn RUN_DIR [--utd R] [--publish-every N] [--preset NAME] [train flags]")
    run_dir, rest = argv[0], argv[1:]
    if any(a == "--run-dir" or a.startswith("--run-dir=") for a in rest):
        _fail("icrl learn: the run dir is the first argument; drop --run-dir")
    utd, rest = _pop_option(rest, "--utd")
    publish, rest = _pop_option(rest, "--publish-every")
    try:
        utd_value = None if utd is None else float(utd)
        publish_value = None if publish is None else int(publish)
    except ValueError:
        _fail(f"icrl learn: --utd takes a number, --publish-every an integer (got {utd!r}, {publish!r})")
    if utd_value is not None and not (math.isfinite(utd_value) and utd_value > 0):
        _fail(f"icrl learn: --utd must be a positive number (max updates per env step stored), got {utd}")
    if publish_value is not None and publish_value < 1:
        _fail(f"icrl learn: --publish-every must be >= 1 (updates between weight publications), got {publish}")
    cfg = _parse_config([*rest, "--run-dir", run_dir], "icrl learn RUN_DIR",
                        "Asynchronous learner: trains on the rollouts `icrl collect` processes store in RUN_DIR. "
                        "--utd R: at most R updates per env step stored (default: updates-per-epoch / "
                        "steps-per-epoch); --publish-every N: publish weights every N updates.")
    from icrl.asynchronous.collect import StopFlag
    from icrl.asynchronous.learn import learn
    from icrl.config import ConfigError
    from icrl.run.checkpoint import CheckpointError

    try:
        learn(cfg, utd=utd_value, publish_every=publish_value, stop=StopFlag())
    except (ConfigError, ValueError, ImportError, CheckpointError, OSError) as e:
        _fail(_one_line(e))


def _collect(argv: list[str]) -> None:
    parser = _ArgumentParser(
        prog="icrl collect",
        description="Asynchronous collector: acts with the weights `icrl learn` publishes in RUN_DIR and stores "
        "its rollouts in RUN_DIR/replay, until the run's total env steps are taken or the learner finishes.",
    )
    parser.add_argument("run_dir")
    parser.add_argument("--collector-id", type=int, default=0, help="distinct per collector: seeds and counters")
    parser.add_argument("--device", default="cpu", help="device for acting (default: cpu)")
    parser.add_argument("--max-env-steps", type=int, default=None, help="stop after this many env steps")
    parser.add_argument("--wait", type=float, default=600.0, help="seconds to wait for the learner's files")
    parser.add_argument(
        "--max-lead", type=int, default=None, metavar="STEPS",
        help="pause while the run's env steps exceed the learner's updates / utd by more than STEPS "
        "(default: never pause)",
    )
    _add_env_flags(parser)
    args = parser.parse_args(argv)
    _check_ranges(parser, {"--collector-id": (args.collector_id, 0), "--max-env-steps": (args.max_env_steps, 1),
                           "--wait": (args.wait, 0), "--max-lead": (args.max_lead, 0)})
    from icrl.asynchronous.collect import StopFlag, collect
    from icrl.config import ConfigError

    try:
        collect(args.run_dir, args.collector_id, device=args.device, wait_s=args.wait,
                max_env_steps=args.max_env_steps, max_lead=args.max_lead, stop=StopFlag(), override=_override(args))
    except (ConfigError, ValueError, ImportError, OSError) as e:
        _fail(_one_line(e))


def _export_minari(argv: list[str]) -> None:
    parser = _ArgumentParser(
        prog="icrl export-minari",
        description="Write a run's stored rollouts as a local Minari dataset (under $MINARI_DATASETS_PATH, "
        "default ~/.minari/datasets), in the spaces the agent sees. Multi-episode rollouts become one Minari "
        "episode per inner episode; `icrl train --offline-data DATASET_ID` reads them back as the original "
        "rollouts. Needs `pip install 'icrl[offline]'`.",
    )
    parser.add_argument("run_dir")
    parser.add_argument("dataset_id", help="e.g. icrl/tmaze-expert-v0 ((namespace/)name-vN)")
    parser.add_argument(
        "--folder", default="fifo", choices=("fifo", "protected", "all"),
        help="replay folder to export: fifo (collected rollouts, default), protected (offline data) or all",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset with this id")
    _add_env_flags(parser)  # only runs without spaces.json build their env
    args = parser.parse_args(argv)
    from icrl.data.offline import export_run

    try:
        path, episodes, steps = export_run(args.run_dir, args.dataset_id, folder=args.folder, overwrite=args.overwrite,
                                           override=_override(args))
    except (ValueError, ImportError, OSError) as e:  # bad id, existing id, no rollouts, missing extra
        _fail(str(e).strip().splitlines()[0])
    print(f"{args.dataset_id}: {episodes:,} episodes, {steps:,} steps in {path}")


def _envs(argv: list[str]) -> None:
    import functools

    from icrl.envs.make import BUILTIN_ENVS, ENV_FAMILIES

    if argv:  # `icrl envs FAMILY`: the members of one family (needs its optional package)
        prefix = argv[0].rstrip("/") + "/"
        if len(argv) > 1 or prefix not in ENV_FAMILIES:
            _fail(f"usage: icrl envs [FAMILY]; families: {', '.join(p.rstrip('/') for p in ENV_FAMILIES)}")
        try:
            members = ENV_FAMILIES[prefix].members()
        except ImportError as e:
            _fail(str(e).strip().splitlines()[0])
        print("\n".join(prefix + m for m in members))
        return
    for name, factory in sorted(BUILTIN_ENVS.items()):
        if isinstance(factory, functools.partial):  # one entry of a family, e.g. popgym/<EnvClassName>
            line = f"{factory.func.__name__}({', '.join(map(repr, factory.args))}): see that package's docs"
        else:
            doc = (factory.__doc__ or "").strip().splitlines()
            line = doc[0] if doc else ""
        print(f"{name:<28} {line}")
    for prefix, family in sorted(ENV_FAMILIES.items()):
        print(f"{prefix + '<name>':<28} {family.help}")


def _eval(argv: list[str]) -> None:
    parser = _ArgumentParser(
        prog="icrl eval",
        description="Evaluate a run's weights greedily; prints a table and writes RUN_DIR/eval.json.",
    )
    parser.add_argument("run_dir")
    parser.add_argument(
        "--checkpoint", default=None,
        help="checkpoint folder (or .safetensors file, or a folder name in RUN_DIR/checkpoints); "
        "default: the latest checkpoint, else RUN_DIR/agent.safetensors",
    )
    parser.add_argument("--rollouts", type=int, default=None, help="rollouts to average over (default: the run's)")
    parser.add_argument("--seed", type=int, default=None, help="eval seed (default: the run's seed)")
    parser.add_argument("--parallel-envs", type=int, default=None, help="env copies (default: the run's)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, auto (default: cpu)")
    parser.add_argument(
        "--video", type=int, default=0, metavar="N",
        help="also record N greedy rollouts to RUN_DIR/eval_video.gif (envs that render rgb_array frames)",
    )
    _add_env_flags(parser)
    args = parser.parse_args(argv)
    _check_ranges(parser, {"--rollouts": (args.rollouts, 1), "--seed": (args.seed, 0),
                           "--parallel-envs": (args.parallel_envs, 1), "--video": (args.video, 0)})

    import torch

    from icrl.run.evaluate import eval_table, evaluate_run, load_config, write_eval
    from icrl.run.loggers import console

    try:
        threads = load_config(args.run_dir).run.threads
        if threads > 0:
            torch.set_num_threads(threads)
        result = evaluate_run(
            args.run_dir, args.checkpoint, args.rollouts, args.seed, args.parallel_envs, args.device, _override(args)
        )
    except (ValueError, RuntimeError, ImportError, OSError) as e:  # RunDirError, RunEnvError, env errors, a bad device
        _fail(_one_line(e))
    for table in eval_table(result):
        console.print(table)
    print(write_eval(args.run_dir, result))
    if args.video:
        from icrl.run.video import record_video

        try:
            print(record_video(args.run_dir, args.video, checkpoint=args.checkpoint, override=_override(args)))
        except (ValueError, ImportError) as e:
            _fail(str(e).strip().splitlines()[0])


def _plot(argv: list[str]) -> None:
    from pathlib import Path

    from icrl.run.plot import X_AXES, adaptation_path, plot_adaptation, plot_learning_curves

    parser = _ArgumentParser(prog="icrl plot")
    parser.add_argument("run_dirs", nargs="+")
    parser.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/learning_curve.png of the first run)")
    parser.add_argument("--x", default="env_steps", choices=sorted(X_AXES), help="x axis (default: env_steps)")
    args = parser.parse_args(argv)
    for d in args.run_dirs:
        if not (Path(d) / "metrics.jsonl").is_file():
            _fail(f"{d} has no metrics.jsonl; pass run directories written by `icrl train`")
    out = Path(args.out or Path(args.run_dirs[0]) / "learning_curve.png")
    if out.suffix.lower() != ".png":
        _fail(f"--out {out} must be a .png file")
    print(plot_learning_curves(args.run_dirs, out, x=args.x))
    adaptation = plot_adaptation(args.run_dirs, adaptation_path(out))
    if adaptation is not None:
        print(adaptation)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, rest = argv[0], argv[1:]
    try:
        _dispatch(command, rest)
    except KeyboardInterrupt:  # Ctrl-C in a command without its own stop handling (train and learn have one)
        print(f"icrl: {command} interrupted (SIGINT)", file=sys.stderr)
        raise SystemExit(130) from None


def _dispatch(command: str, rest: list[str]) -> None:
    if command == "train":
        _train(rest)
    elif command == "eval":
        _eval(rest)
    elif command == "envs":
        _envs(rest)
    elif command == "plot":
        _plot(rest)
    elif command == "learn":
        _learn(rest)
    elif command == "collect":
        _collect(rest)
    elif command == "export-minari":
        _export_minari(rest)
    else:
        _fail(f"unknown command {command!r}; choose one of train, eval, envs, plot, learn, collect, export-minari")


if __name__ == "__main__":
    main()
