"""The one exception of the config tree, in a module of its own so every other module can import it, and the
wording of a fix (a flag on the command line, an argument in Python)."""

from contextvars import ContextVar


class ConfigError(ValueError):
    """A config value or combination that cannot work; the message names the fields and the fix."""


# Who is reading the error: the command line speaks in flags (`--resume`), Python in arguments
# (`resume=True`). The CLI sets this once at its entry (`icrl.cli.main`); everything else is Python.
_CLI_WORDS = ContextVar("icrl_cli_words", default=False)


def speak_cli(on: bool = True) -> None:
    """Word the errors that name a fix for the command line (the CLI's entry point calls this)."""
    _CLI_WORDS.set(on)


def setting(name: str, value: str = "") -> str:
    """How the reader sets config field `name`: `--run-dir X` on the command line, `run_dir=X` in Python."""
    if _CLI_WORDS.get():
        return "--" + name.replace("_", "-") + (f" {value}" if value else "")
    return f"{name}={value or 'True'}"
