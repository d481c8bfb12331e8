"""How the command line fails and stops: one line `icrl: error: ...` on stderr with exit code 2 for usage, config
and input errors (never a traceback), and a one-line stop with the resume hint on SIGINT / SIGTERM."""

from __future__ import annotations

import contextlib
import math
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from icrl.config.errors import first_line

# The errors bad input causes (configs, env names and kwargs, run dirs, checkpoints, files), as opposed to bugs.
INPUT_ERRORS: tuple[type[BaseException], ...] = (ValueError, ImportError, OSError)


def fail(message: str) -> NoReturn:
    """Print `icrl: error: MESSAGE` on stderr and exit with code 2 (the usage-error convention)."""
    print(f"icrl: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def fail_input(error: BaseException, log_dir: str | None = None) -> NoReturn:
    """`fail` with an input error's first line. When the error carries the user's own traceback (an env that
    raised: EnvError.user_traceback), it is theirs to debug, so it is written to a file (`log_dir`/env_error.txt
    when that folder exists, else the temp folder) and the line names the file."""
    message = first_line(error)
    text = getattr(error, "user_traceback", "")  # icrl.envs.wrapper.EnvError
    if text:
        path = _write_traceback(text, log_dir)
        if path is not None:
            message += f" (the env's traceback: {path})"
    fail(message)


def _write_traceback(text: str, log_dir: str | None) -> str | None:
    """Write an env's traceback to `log_dir`/env_error.txt, never through a symlink or into a FIFO there (it
    would overwrite a file outside the run directory): a fresh temp file instead. None if nothing could be
    written."""
    import os
    import tempfile

    from icrl.fileio import open_regular

    fd, path = None, None
    if log_dir is not None and os.path.isdir(log_dir):
        path = os.path.join(log_dir, "env_error.txt")
        try:
            fd = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError:
            fd = None
    try:
        if fd is None:
            fd, path = tempfile.mkstemp(prefix="icrl-env-error-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        return None
    return path


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


def check_ranges(prog: str, values: dict[str, tuple[float | None, float] | tuple[float | None, float, float]]) -> None:
    """Refuse (one line, exit 2) a flag value outside [minimum, maximum] (the maximum optional) or not finite,
    before anything runs: a count with a few zeros too many would otherwise run for ever without a word."""
    for flag, (value, lo, *hi) in values.items():
        if value is None:
            continue
        if not (math.isfinite(value) and value >= lo):
            fail(f"{prog}: {flag} must be >= {lo}, got {value}")
        if hi and value > hi[0]:
            fail(f"{prog}: {flag} must be <= {hi[0]:,}, got {value:,}")


class _Stopped(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so `train`'s cleanup runs as it does on Ctrl-C."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped(signal.Signals(signum).name)


@contextlib.contextmanager
def stopped_in_one_line(command: str):
    """The whole of a command, from its first line: SIGTERM raises like Ctrl-C (`_Stopped`), and either one
    stops it with one line and exit 143 / 130. Why: parsing and the imports take ~10 s (torch, envs) before
    `run_stoppable` installs its handler, and a SIGTERM there would kill the process with no message."""
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    except KeyboardInterrupt as e:  # a command without its own stop handling (train and learn have one)
        name = "SIGTERM" if isinstance(e, _Stopped) else "SIGINT"
        print(f"icrl: {command} stopped by {name}", file=sys.stderr)
        raise SystemExit(143 if name == "SIGTERM" else 130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _resume_hint(run_dir: str | None) -> str:
    """What a stopped run leaves to resume from, truthfully: its newest checkpoint, or none yet."""
    from icrl.run.checkpoint import list_checkpoints

    found = list_checkpoints(run_dir) if run_dir is not None else []
    if run_dir is not None and not found:
        return (f"it wrote no checkpoint yet ({run_dir}: the first comes after --checkpoint-every epochs or "
                "--checkpoint-seconds), so there is nothing to resume: run the command again")
    if not found:  # the run dir was chosen by icrl: its name was printed at the start
        return ("every checkpoint written so far is kept: resume with --run-dir RUN_DIR --resume (RUN_DIR: the "
                "run dir printed at the start)")
    return f"every checkpoint written so far is kept (newest: {found[-1]}): resume with the same command and --resume"


def run_stoppable(fn: Callable[..., Any], *args: Any, log_dir: str | None = None) -> None:
    """Run `fn`, turning SIGINT / SIGTERM into a one-line stop with the resume hint (exit 130 / 143) and the
    errors bad input causes (configs, env names and kwargs, run dirs, checkpoints, files) into one line, exit 2.
    Checkpoints and rollouts on disk are written atomically, so a stop at any moment loses nothing.
    `log_dir`: where an env's own traceback goes (`fail_input`)."""
    from icrl.run.checkpoint import CheckpointError

    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        fn(*args)
    except KeyboardInterrupt as e:
        name = "SIGTERM" if isinstance(e, _Stopped) else "SIGINT"
        print(f"icrl: stopped by {name}; {_resume_hint(log_dir)}", file=sys.stderr)
        raise SystemExit(143 if name == "SIGTERM" else 130) from None
    except INPUT_ERRORS + (CheckpointError,) as e:  # ConfigError is a ValueError
        fail_input(e, log_dir)
    finally:
        signal.signal(signal.SIGTERM, previous)
