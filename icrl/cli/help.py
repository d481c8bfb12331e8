"""`icrl train --help` and `icrl learn --help` on one screen: the flags a user needs first (each with the first
sentence of its description and its default), then every other flag by group, names only. `--help-all` prints
tyro's full help: every flag with its whole description, grouped as the config is (icrl.config).

Why not tyro's help alone: it lists ~110 flags in config order, so `--seed`, `--device` and `--run-dir` come
after 500 lines of loss and exploration knobs a first run never touches."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import shutil
import textwrap
import types
import typing
from typing import Any

from icrl.config import ExperimentConfig
from icrl.config.presets import PRESETS
from icrl.config.resolve import resolve

COMMON = ("env", "env_kwargs", "total_env_steps", "seed", "device", "run_dir", "resume", "parallel_envs",
          "max_seq_len", "d_model", "eval_every", "threads")
"""Field names of the flags shown first, in this order (any group of ExperimentConfig)."""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field: its docstring} of a dataclass whose fields carry a string literal below them (as tyro reads them)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, below in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(below, ast.Expr)
                and isinstance(below.value, ast.Constant) and isinstance(below.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(below.value.value)
    return docs


def first_sentence(doc: str) -> str:
    text = " ".join(doc.split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)\. ", text)
    return text if end is None else text[:end.start() + 1]


def flag(name: str, value: Any) -> str:
    """The flag of a field as tyro spells it without group prefixes (OmitArgPrefixes)."""
    dashed = name.replace("_", "-")
    return f"--{dashed}/--no-{dashed}" if isinstance(value, bool) and value else f"--{dashed}"


def metavar(cls: type, name: str) -> str:
    hint = typing.get_type_hints(cls)[name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None: the X
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is typing.Literal:
        return "{" + ",".join(map(str, typing.get_args(hint))) + "}"
    if typing.get_origin(hint) in (tuple, list):
        return "X [X ...]"
    return "" if hint is bool else {int: "N", float: "X"}.get(hint, "STR")


def _fields(cfg: ExperimentConfig) -> dict[str, tuple[str, type, Any]]:
    """{field name: (group, group class, value)} over every group of `cfg`."""
    out = {}
    for group in dataclasses.fields(cfg):
        part = getattr(cfg, group.name)
        for f in dataclasses.fields(part):
            out[f.name] = (group.name, type(part), getattr(part, f.name))
    return out


def short_help(command: str, description: str, cfg: ExperimentConfig, skip: tuple[str, ...] = ()) -> str:
    """The one-screen help of `icrl COMMAND` (train or learn) whose defaults are `cfg` (a preset's or a file's)."""
    width = min(shutil.get_terminal_size((100, 24)).columns, 100)
    fields = {k: v for k, v in _fields(cfg).items() if k not in skip}
    positional = " RUN_DIR" if "run_dir" in skip else ""
    lines = [f"usage: icrl {command}{positional} [--preset NAME | --config FILE] [FLAGS]   (every flag described: "
             f"icrl {command} --help-all)", "", textwrap.fill(" ".join(description.split()), width), "",
             "start from:"]
    starts = [("--preset NAME", f"a preset: {', '.join(PRESETS)}; the flags apply on top of it"),
              ("--config FILE", "a config.json (or a run directory's); the flags apply on top of it"),
              ("--trust-run-env", "with --config: build an env the file names as code (module:factory)")]
    common = []
    resolved = _fields(resolve(cfg))  # what an unset field becomes where the task recommends nothing
    for name in COMMON:
        if name in fields:
            group, cls, value = fields[name]
            text = first_sentence(field_docs(cls).get(name, ""))
            default = value if value is not None else (
                "unset" if resolved[name][2] is None else f"the task's, else {resolved[name][2]}")
            common.append((f"{flag(name, value)} {metavar(cls, name)}".rstrip(), f"{text} (default: {default})"))
    pad = max(len(f) for f, _ in starts + common) + 2
    for title, rows in (("", starts), ("common flags:", common)):
        if title:
            lines += ["", title]
        for name, text in rows:
            lines += _wrap(text, width, "  " + name.ljust(pad), " " * (pad + 2))
    lines += ["", "every other flag, by group (`--help-all` describes each):"]
    groups: dict[str, list[str]] = {}
    for name, (group, _, value) in fields.items():
        if name not in COMMON:
            groups.setdefault(group, []).append(flag(name, value))
    for group, names in groups.items():
        lines += _wrap(" ".join(names), width, f"  {group + ':':14s}", " " * 16)
    return "\n".join(lines) + "\n"


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False,
                         break_long_words=False)
