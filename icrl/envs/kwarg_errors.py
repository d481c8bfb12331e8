"""Env-constructor errors as one line that names the offending `--env-kwargs` entry.

Why: `--env-kwargs '{"length": null}'` ended in a TypeError traceback from inside the env, and
`'{"length": "abc"}'` in "invalid literal for int()", which does not say which kwarg is wrong. Values are
checked against the factory's defaults before the call (a JSON null, string, list or object where the
default is a number, and so on), and whatever the constructor still raises is turned into a ValueError
that names the kwarg(s) the message mentions, or lists them all.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable

from icrl.config.errors import flag


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (bool, int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def check_kwarg_types(factory: Callable[..., Any], name: str, kwargs: dict[str, Any]) -> None:
    """Raise ValueError naming the first kwarg whose JSON type cannot be that of the parameter's default
    (parameters without a default, or with a None default, are left to the constructor)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # builtins and C callables have no signature
        return
    for key, value in kwargs.items():
        param = params.get(key)
        if param is None or param.default is inspect.Parameter.empty or param.default is None:
            continue
        want, got = _kind(param.default), _kind(value)
        if want in ("number", "string", "list", "object") and want != got:
            raise ValueError(
                f"env {name!r}: {flag('env_kwargs')} {key!r} must be a {want} (its default is "
                f"{json.dumps(param.default, default=str)}), got {json.dumps(value, default=str)}; fix that value"
            )
        exact = _exact_kind_error(param.default, value)
        if exact is not None:
            raise ValueError(
                f"env {name!r}: {flag('env_kwargs')} {key!r} must be {exact} (its default is "
                f"{json.dumps(param.default, default=str)}), got {json.dumps(value, default=str)}; fix that value"
            )


def _exact_kind_error(default: Any, value: Any) -> str | None:
    """What a JSON number must be to stand for `default`'s type, when it does not: an int parameter given 1.5
    or true would run int(1.5) = 1 (or 1) while config.json records 1.5 (or true), so the record would lie.
    A float with an integral value (1e6) is accepted for an int; an int for a float."""
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(default, int) and (isinstance(value, bool) or (isinstance(value, float) and not value.is_integer())):
        return "an integer"
    if isinstance(default, float) and isinstance(value, bool):
        return "a number"
    return None


def explain_constructor_error(name: str, kwargs: dict[str, Any], error: Exception) -> ValueError:
    """A one-line ValueError for an exception the env constructor raised, naming the kwargs it is about."""
    lines = str(error).strip().splitlines()
    msg = lines[0] if lines else type(error).__name__
    named = [k for k, v in kwargs.items() if k in msg or (isinstance(v, str) and repr(v) in msg)]
    if named:
        shown = ", ".join(f"{k}={json.dumps(kwargs[k], default=str)}" for k in named)
        return ValueError(f"env {name!r} rejected {flag('env_kwargs')} {shown}: {msg}; fix that value")
    if kwargs:
        return ValueError(
            f"env {name!r} could not be built with {flag('env_kwargs')} {json.dumps(kwargs, default=str)} "
            f"({type(error).__name__}: {msg}); check these values against the env's parameters"
        )
    return ValueError(f"env {name!r} could not be built ({type(error).__name__}: {msg})")
