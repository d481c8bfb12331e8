"""Errors are worded for their reader (icrl.config.errors): the command line names flags (`--env X`), Python
names arguments (`env='X'`). The layer that raises cannot know who called it, so every message outside icrl/cli
spells a setting through `flag` / `setting`, and the CLI switches the wording for the length of one command."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import icrl
from icrl.config import ConfigError
from icrl.config.errors import flag, setting, speak_again, speak_cli
from icrl.envs.user import RunEnvError

from helpers import ROOT, cli, tiny

FLAG = re.compile(r"(?<![\w`-])--[a-z][a-z0-9-]*")
COMMAND = re.compile(r"`?icrl [a-z-]+[^`;)]*`?")  # "icrl eval RUN --env X": an example of a command, a CLI's words


def _is_error(node: ast.AST) -> bool:
    """A `raise` statement, or the construction of an exception (`ValueError(...)`, `ConfigError(...)`)."""
    if isinstance(node, ast.Raise):
        return node.exc is not None
    func = node.func if isinstance(node, ast.Call) else None
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name.endswith("Error")


def literal_flags(path: Path) -> list[tuple[int, str]]:
    """(line, flag) of every flag written literally in a string of an exception `path` raises or builds."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if _is_error(node):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    hits += [(sub.lineno, f) for f in FLAG.findall(COMMAND.sub("", sub.value))]
    return hits


def test_no_message_raised_outside_the_cli_spells_a_flag():
    """A literal `--flag` in a message raised by the library would reach a Python caller as is."""
    found = {str(p.relative_to(ROOT)): hits for p in sorted((ROOT / "icrl").rglob("*.py"))
             if "cli" not in p.relative_to(ROOT / "icrl").parts[:1] and (hits := literal_flags(p))}
    assert not found, f"word these through icrl.config.errors.flag / setting: {found}"


def test_flag_and_setting_speak_the_readers_words():
    assert (flag("run_dir"), setting("resume"), setting("env", "cue_env:Cue"), setting("lr", 0.1)) == (
        "run_dir", "resume=True", "env='cue_env:Cue'", "lr=0.1")
    token = speak_cli()
    try:
        assert (flag("run_dir"), setting("resume"), setting("env", "cue_env:Cue"), setting("lr", 0.1)) == (
            "--run-dir", "--resume", "--env cue_env:Cue", "--lr 0.1")
    finally:
        speak_again(token)


def test_a_bad_config_in_python_names_the_field_not_the_flag(tmp_path):
    with pytest.raises(ConfigError) as e:
        icrl.train(tiny(tmp_path / "run", d_model=15))
    assert "d_model 15 is not divisible by heads 2" in str(e.value) and "--" not in str(e.value)


@pytest.fixture(scope="module")
def user_env_run(tmp_path_factory):
    """A tiny run trained on a user's env named as code, `cue_env:CueRepeat` (its module on sys.path)."""
    root = tmp_path_factory.mktemp("user_env")
    (root / "cue_env.py").write_text("from icrl.envs.tasks.tmaze import TMaze as CueRepeat\n")
    sys.path.insert(0, str(root))
    try:
        icrl.train(tiny(root / "run", env="cue_env:CueRepeat"))
        yield root / "run"
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("cue_env", None)


def test_evaluating_a_run_with_a_users_env_says_what_to_pass_in_python(user_env_run, capsys):
    with pytest.raises(RunEnvError) as e:
        icrl.evaluate(user_env_run, n_episodes=2)
    message = str(e.value)
    assert "env='cue_env:CueRepeat'" in message and "trust_run_env=True" in message, message
    assert "--" not in message, message
    with pytest.raises(RunEnvError) as e:
        icrl.evaluate(icrl.load(user_env_run), n_episodes=2)  # load builds nothing; evaluate words the same way
    assert "--" not in str(e.value) and "trust_run_env=True" in str(e.value)
    # each way out that the message names works
    assert icrl.evaluate(user_env_run, n_episodes=2, trust_run_env=True)["return_mean"] is not None
    assert icrl.evaluate(user_env_run, env="cue_env:CueRepeat", n_episodes=2)["return_mean"] is not None
    # the command line names its flags for the same run, and Python speaks Python again afterwards
    capsys.readouterr()
    assert cli("eval", str(user_env_run), "--rollouts", "2") == 2
    err = capsys.readouterr().err
    assert "--env cue_env:CueRepeat" in err and "--trust-run-env" in err and "env=" not in err, err
    with pytest.raises(RunEnvError, match="trust_run_env=True"):
        icrl.evaluate(user_env_run, n_episodes=2)
