"""The one exception of the config tree, in a module of its own so every other module can import it, and the
wording of a fix (a flag on the command line, an argument in Python)."""

from contextvars import ContextVar, Token


class ConfigError(ValueError):
    """A config value or combination that cannot work; the message names the fields and the fix."""


def first_line(error: BaseException, limit: int | None = None) -> str:
    """The first line of an exception's message (its type when it has none): what a one-line error quotes. `limit`
    caps it (in characters) where the message is someone else's: a user's env may raise with a whole array in it."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return line if limit is None or len(line) <= limit else line[: limit - 3] + "..."


# Who is reading the error: the command line speaks in flags (`--resume`), Python in arguments
# (`resume=True`). The CLI sets this once at its entry (`icrl.cli.main`); everything else is Python.
_CLI_WORDS = ContextVar("icrl_cli_words", default=False)


def speak_cli(on: bool = True) -> Token:
    """Word the errors that name a fix for the command line (`icrl.cli.main`, for the length of one command:
    it resets the returned token, so Python code called later in the same process speaks Python again)."""
    return _CLI_WORDS.set(on)


def speak_again(token: Token) -> None:
    """Undo a `speak_cli`."""
    _CLI_WORDS.reset(token)


def speaks_cli() -> bool:
    """Whether errors are being worded for the command line (inside `icrl.cli.main`)."""
    return _CLI_WORDS.get()


def flag(name: str) -> str:
    """How the reader names setting `name` (a config field or a function's argument): `--run-dir` on the command
    line, `run_dir` in Python."""
    return "--" + name.replace("_", "-") if _CLI_WORDS.get() else name


def setting(name: str, value: object = "") -> str:
    """How the reader sets `name` to `value`: `--run-dir X` on the command line, `run_dir=X` in Python (a string
    value quoted there, as it is typed; no value: a switch, `--resume` / `resume=True`)."""
    if _CLI_WORDS.get():
        return flag(name) + (f" {value}" if value != "" else "")
    if value == "":
        return f"{name}=True"
    return f"{name}={value!r}" if isinstance(value, str) and not value.isupper() else f"{name}={value}"
