"""Nested dicts as flat ones: a run's config.json as dotted fields (the resume check, grouping runs in plots)."""

from __future__ import annotations

from typing import Any


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}, "c": 2} -> {"a.b": 1, "c": 2}; keys get `prefix`; values other than dicts stay as they are."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
