"""Static checks that keep the code base's shape: the training loop as a leaf that nothing else imports, layers that
import only downwards, no import circle, and a layout (docs/layout.md) that names every module that exists. Sizes are
not checked: a module holds one concept as long as the concept needs (docs/layout.md)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "icrl"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_nothing_imports_from_the_training_loop():
    """The loop composes the pieces; the evaluation and API paths share those pieces, not it. Only its two entry
    points import it: `icrl.train` (icrl/__init__.py; the CLI calls `icrl.train` too) and the asynchronous
    learner, which runs the same loop on the collectors' files."""
    entry_points = {"icrl", "icrl.asynchronous.learn"}
    sources = [*MODULES, *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "examples").glob("*.py")]
    offenders = [
        str(p.relative_to(ROOT)) for p in sources
        if _name(p) not in entry_points and any(m.startswith("icrl.run.loop") for m in _imports(p))
    ]
    assert not offenders, f"these import from icrl.run.loop: {offenders}; import the shared piece instead"


# The layers, lowest first (docs/design.md §8, docs/layout.md): a module may import its own layer and those
# below it, never one above. "base" holds the format and config modules every layer reads; the package root
# counts as base because it only maps public names to modules lazily (`from icrl import __version__`).
LAYERS = ["base", "envs", "data", "nets", "agent", "run", "asynchronous", "api", "cli"]
LAYER_OF = {
    "icrl": "base", "icrl.types": "base", "icrl.guards": "base", "icrl.fileio": "base", "icrl.dicts": "base",
    "icrl.seeding": "base", "icrl.config": "base", "icrl.device": "base", "icrl.parallel": "base",
    "icrl.envs": "envs", "icrl.spaces_json": "envs",  # the env's spaces as JSON, read through the env wrapper
    "icrl.data": "data", "icrl.nets": "nets", "icrl.agent": "agent", "icrl.run": "run",
    "icrl.asynchronous": "asynchronous", "icrl.policy": "api", "icrl.cli": "cli", "icrl.__main__": "cli",
}


def _layer(module: str) -> str | None:
    """The layer of an icrl module (the longest prefix in LAYER_OF), None for other packages."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYER_OF:
            return LAYER_OF[".".join(parts[:n])]
    return None


def _icrl_imports(path: Path) -> set[str]:
    """Every icrl module `path` imports, at the top or inside a function (a deferred import is a dependency)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m == "icrl" or m.startswith("icrl.")}


def test_every_module_has_a_layer():
    unplaced = [_name(p) for p in MODULES if _layer(_name(p)) is None or _name(p) == "icrl.__init__"]
    assert not unplaced, f"place these modules in a layer (LAYER_OF): {unplaced}"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_imports_a_higher_layer(path):
    """envs -> data -> nets -> agent -> run -> asynchronous -> api -> cli: a lower layer never imports a higher one
    (the learner names the collectives it needs as a Protocol instead of importing the run layer)."""
    own = LAYERS.index(_layer(_name(path)))
    upward = sorted(m for m in _icrl_imports(path) if LAYERS.index(_layer(m)) > own)
    assert not upward, f"{_name(path)} (layer {LAYERS[own]}) imports a higher layer: {upward}"


def _module_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports (deferred and annotation-only imports too: each is a
    dependency; `from pkg import mod` names mod)."""
    paths = {_name(p): p for p in MODULES if _name(p).startswith(package)}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{a.name}" for a in node.names} & paths.keys()
                deps |= subs or {node.module}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        graph[name] = (deps & paths.keys()) - {name}
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (its modules in order, the first repeated at the end), or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        for dep in sorted(graph[module]):
            found = visit(dep, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    return next((c for m in sorted(graph) if (c := visit(m, [])) is not None), None)


def test_no_package_has_an_import_circle():
    """icrl imports one way, in every package and across them: the registry imports the batched task modules,
    which import only their base module icrl.envs.batched; the config's checks (icrl.config.validation) read the
    config's data (groups.py), not experiment.py, which runs them. A circle would make import order matter."""
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check finds one
    circle = _circle(_module_graph("icrl"))
    assert circle is None, f"import circle: {' -> '.join(circle or [])}"


def _layout_modules(layout: str) -> set[str]:
    """Module paths the layout block (the first code block of docs/layout.md) names: a line starting with
    `icrl/...` sets the package, and every `name.py` on it and on its indented continuation lines is a module of
    that package."""
    block = layout.split("```", 2)[1]
    listed, package = set(), None
    for line in block.splitlines():
        if line and not line[0].isspace():
            first = line.split()[0]
            package = (None if not first.startswith("icrl/") else first if first.endswith("/")
                       else first.rsplit("/", 1)[0] + "/")
            if first.endswith(".py") and package:
                listed.add(first)
        if package is not None:
            listed.update(package + name for name in re.findall(r"(?<![\w/.])([A-Za-z_]\w*\.py)\b", line))
    return listed


def test_readme_layout_names_every_module_and_only_existing_ones():
    listed = _layout_modules((ROOT / "docs" / "layout.md").read_text(encoding="utf-8"))
    existing = {str(p.relative_to(ROOT)) for p in MODULES if not p.name.startswith("__")}
    stale = sorted(listed - existing - {str(p.relative_to(ROOT)) for p in MODULES})
    missing = sorted(existing - listed)
    assert not stale, f"docs/layout.md names modules that do not exist: {stale}"
    assert not missing, f"docs/layout.md does not name: {missing}"


def test_design_citations_name_sections_of_the_design_record():
    """Docstrings cite docs/design.md by section; every cited section exists, and nothing cites a document the
    repository does not hold."""
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^## (\d+)\.", design, flags=re.M))
    sources = [*MODULES, *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "tests").rglob("*.py")]
    cited, stray = set(), []
    for p in sources:
        text = p.read_text(encoding="utf-8")
        cited |= set(re.findall(r"docs/design\.md §(\d+)", text))
        if re.search(r"\bDESIGN §", text) and p.name != "test_code_health.py":
            stray.append(str(p.relative_to(ROOT)))
    assert cited and cited <= sections, f"cited sections missing from docs/design.md: {sorted(cited - sections)}"
    assert not stray, f"these cite a DESIGN document the repository does not hold: {stray}"


# What only the base modules icrl.device (device probing) and icrl.parallel (collectives) define or call.
DEVICE_AND_COLLECTIVE_NAMES = {
    "resolve_device", "use_fused_adam", "cpu_bf16_is_native", "cpu_has_amx", "warn_if_bf16_is_emulated",
    "Collectives", "OneProcess", "Replicas", "init_replicas", "launched_world_size",
}
PROBE_CALLS = ("torch.cpu.get_capabilities", "torch.distributed", "torch.utils._foreach_utils")


@pytest.mark.parametrize("path", [p for p in MODULES if p.parent.name in ("nets", "agent")], ids=_name)
def test_nets_and_agent_leave_device_probing_and_collectives_to_the_base_modules(path):
    """Networks and the learner ask icrl.device what a device can do and run their collectives through
    icrl.parallel's `Collectives`; they define neither (by name) and probe nothing themselves."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    used = {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    used |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    probes = sorted(u for u in used if u.startswith(PROBE_CALLS) or "get_capabilities" in u)
    assert not defined & DEVICE_AND_COLLECTIVE_NAMES, (
        f"{_name(path)} defines {sorted(defined & DEVICE_AND_COLLECTIVE_NAMES)}: "
        "move them to icrl.device or icrl.parallel")
    assert not probes, (f"{_name(path)} probes the device or the process group itself ({probes}): "
                        "ask icrl.device / icrl.parallel")


def test_no_class_name_is_defined_twice():
    """A reader who meets a class name finds one definition (two classes of one name once meant two different
    things)."""
    where: dict[str, list[str]] = {}
    for path in MODULES:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(_name(path))
    twice = {name: places for name, places in where.items() if len(places) > 1}
    assert not twice, f"rename one of each: {twice}"


def test_ruff_is_clean():
    """The lint rules of pyproject.toml ([tool.ruff]: imports sorted, lines at most 120 characters, ...) hold for
    every file, so a finding fails here rather than waiting for someone to run ruff."""
    pytest.importorskip("ruff", reason="ruff is in the dev extra (pip install -e '.[dev]')")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "icrl", "tests", "benchmarks", "examples"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, f"ruff check failed:\n{out.stdout}{out.stderr}"
