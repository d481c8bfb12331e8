"""Every command's help, in one style (`--help`, `--help-all`, `icrl plot --help`...): a usage line, the command's
description, then each flag as a row: the flag and its value's form, its whole description as one paragraph, and
its default, worded alike everywhere ("the task's, else 256" where a run resolves an unset field).

`icrl train --help` and `icrl learn --help` fit one screen: the flags a user needs first (each with the first
sentence of its description), then every other flag by group, names only; `--help-all` describes every flag,
grouped as the config is (icrl.config). Why not tyro's help: it lists ~110 flags in config order, so `--seed`,
`--device` and `--run-dir` came after 500 lines of loss and exploration knobs a first run never touches, in boxes
that broke descriptions mid-sentence."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import re
import shutil
import textwrap
import types
import typing
from typing import Any

from icrl.config import ExperimentConfig
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


Row = tuple[str, str]
"""(flag with its value's form, description with its default): one line of a help, wrapped."""


def _arg_meta(cls: type, name: str) -> tuple[Any, list[Any]]:
    """The field's type without `Annotated` and its `Annotated` metadata (tyro's markers and arg configs)."""
    hint = typing.get_type_hints(cls, include_extras=True)[name]
    meta: list[Any] = []
    while typing.get_origin(hint) is typing.Annotated:
        meta += list(hint.__metadata__)
        hint = typing.get_args(hint)[0]
    return hint, meta


def _positional(meta: list[Any]) -> bool:
    return any("Positional" in repr(m) for m in meta)


def _arg_option(meta: list[Any], key: str) -> Any:
    """A tyro.conf.arg option (name, metavar) given on the field, else None."""
    return next((getattr(m, key) for m in meta if getattr(m, key, None) is not None), None)


def default_text(value: Any, resolved: Any = None) -> str:
    """A default as every help words it: what an unset field becomes where a run resolves it (the task's
    recommendation, else the library's), "unset" where nothing fills it, and values as they are typed."""
    if value is None:
        return "unset" if resolved is None else f"the task's, else {default_text(resolved)}"
    if isinstance(value, (tuple, list)):
        return " ".join(map(str, value)) if value else "none"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def field_rows(cls: type, values: Any, *, full: bool, resolved: dict[str, Any] | None = None,
               skip: tuple[str, ...] = ()) -> tuple[list[Row], list[Row]]:
    """(positional arguments, flags) of the dataclass `cls` whose defaults are `values` (an instance; None: the
    fields' own), nested dataclass fields flattened (tyro's OmitArgPrefixes): each row's description is the field's
    docstring (`full`) or its first sentence, with its default (unless a command's field words its own)."""
    docs, positional, flags = field_docs(cls), [], []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        hint, meta = _arg_meta(cls, f.name)
        value = getattr(values, f.name) if values is not None else _default(f)
        doc = " ".join(docs.get(f.name, "").split())
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # flags of a nested group, unprefixed
            inner = field_rows(hint, value, full=full, resolved=resolved, skip=skip)
            positional += inner[0]
            flags += ([("", doc)] if doc else []) + inner[1]  # the group's own description, then its flags
            continue
        text = doc if full else first_sentence(doc)
        form = _arg_option(meta, "metavar") or metavar(cls, f.name)
        if _positional(meta):
            positional.append((form, text))
            continue
        name = _arg_option(meta, "name") or f.name
        if values is not None or not re.search(r"\bdefault\b", text):  # a command's field may word its own
            text += f" (default: {default_text(value, (resolved or {}).get(f.name))})"
        flags.append((f"{flag(name, value)} {form}".rstrip(), text.strip()))
    return positional, flags


def _rows_text(rows: list[Row], width: int, pad: int) -> list[str]:
    lines = []
    for name, text in rows:
        if len(name) + 2 > pad:  # a long flag: its description starts on the next line
            lines.append("  " + name)
            lines += _wrap(text, width, " " * (pad + 2), " " * (pad + 2))
        else:
            lines += _wrap(text, width, "  " + name.ljust(pad), " " * (pad + 2))
    return lines


def _width() -> int:
    return min(shutil.get_terminal_size((100, 24)).columns, 100)


def _usage(command: str, cls: type, positional: list[Row], config: bool) -> list[str]:
    starts = " [--preset NAME | --config FILE]" if config else ""
    args = "".join(f" {name}" for name, _ in positional)
    return [f"usage: icrl {command}{args}{starts} [FLAGS]", "", textwrap.fill(" ".join((cls.__doc__ or "").split()),
                                                                               _width())]


PAD = 22
"""The flag column's width: a longer flag puts its description on the next line."""


def command_help(command: str, cls: type) -> str:
    """The help of a command other than train and learn: its arguments and every flag, described."""
    positional, flags = field_rows(cls, None, full=True)
    lines = _usage(command, cls, positional, config=False)
    for title, rows in (("arguments:", positional), ("flags:", flags)):
        if rows:
            lines += ["", title, *_rows_text(rows, _width(), PAD)]
    return "\n".join(lines) + "\n"


def train_help(command: str, cls: type, cfg: ExperimentConfig, skip: tuple[str, ...] = (), full: bool = False) -> str:
    """The help of `icrl COMMAND` (train or learn) whose defaults are `cfg` (a preset's or a file's): one screen
    (the common flags described, the others named by group), or every flag described by group (`full`)."""
    width = _width()
    resolved = {k: v[2] for k, v in _fields(resolve(cfg)).items()}  # what an unset field becomes, task aside
    positional = [("RUN_DIR", "")] if "run_dir" in skip else []
    lines = _usage(command, cls, positional, config=True)
    if not full:
        lines[0] += f"   (every flag described: icrl {command} --help-all)"
    starts = field_rows(cls, None, full=full, skip=("config", "run_dir"))[1]  # --preset, --config, --trust-run-env
    lines += ["", "start from:", *_rows_text(starts, width, PAD)]
    groups: dict[str, list[Row]] = {}
    for part_field in dataclasses.fields(cfg):
        part = getattr(cfg, part_field.name)
        groups[part_field.name] = field_rows(type(part), part, full=full, resolved=resolved, skip=skip)[1]
    if full:
        for name, rows in groups.items():
            if rows:
                lines += ["", f"{name}:", *_rows_text(rows, width, PAD)]
        return "\n".join(lines) + "\n"
    by_flag = {row[0].split(" ")[0].split("/")[0]: row for rows in groups.values() for row in rows}
    common = [by_flag[f"--{name.replace('_', '-')}"] for name in COMMON if f"--{name.replace('_', '-')}" in by_flag]
    lines += ["", "common flags:", *_rows_text(common, width, PAD)]
    lines += ["", "every other flag, by group (`--help-all` describes each):"]
    for name, rows in groups.items():
        others = [flag_text.split(" ")[0] for flag_text, _ in rows if flag_text not in {row[0] for row in common}]
        if others:
            lines += _wrap(" ".join(others), width, f"  {name + ':':14s}", " " * 16)
    return "\n".join(lines) + "\n"


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False,
                         break_long_words=False) or [first.rstrip()]
