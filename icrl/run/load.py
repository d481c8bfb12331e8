"""Loading a run: its config, weights and env spaces from a run directory, a checkpoint or a weights file, and the
one-file export `icrl.load` reads back.

`load_run` is the one run loader (`icrl.load`, `icrl eval`, `icrl video`): it rebuilds the agent exactly as
training does (`icrl.agent.model.build_agent`) and loads the weights of a checkpoint (`resolve_weights`).

Sharing a trained policy as one file: `icrl export RUN_DIR out.zip` writes it (`export`), `icrl.load("out.zip")`
reads it back (`unpacked`: in a process without the env, as a run directory). The zip holds only data: the
weights in safetensors (never a pickle: the optimiser state of checkpoints, which `torch.load` would read, stays
behind), config.json, spaces.json, metrics.jsonl, eval.json and the plot, flat, plus `icrl_export.json` (the icrl
version and each file's SHA-256). An archive is hostile input: reading one refuses member names that leave the
archive (`../x`, `/etc/x`, `C:\\x`, folders), members larger than their limit (checked while reading, not trusting
the sizes the zip claims: a zip bomb stops at the limit), files whose hash differs from the manifest, and takes
nothing but the files named here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from icrl.agent.model import build_agent
from icrl.config import ExperimentConfig
from icrl.config.errors import flag
from icrl.envs.make import make_run_envs
from icrl.envs.user import EnvOverride, run_env_config
from icrl.fileio import OutsideRunDirError, atomic_path, check_inside

if TYPE_CHECKING:
    from icrl.agent.model import Agent


WEIGHTS = "agent.safetensors"


class RunDirError(ValueError):
    """A run directory, checkpoint or weights file that cannot be used; the message says what is wrong."""


def load_config(run_dir: str | Path, name: str = "config.json") -> ExperimentConfig:
    """A run's config (RUN_DIR/config.json, or the file `name` in that folder), checked as the flags are."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory; pass a run directory written by `icrl train`")
    path = run_dir / name
    if not path.is_file():
        raise RunDirError(f"{run_dir} has no {name}; pass a run directory written by `icrl train`")
    try:  # values checked like flags: a hand-edited config.json fails here, in one line, not deep in a build
        return ExperimentConfig.from_json(path.read_text(encoding="utf-8")).validate(check_device=False)
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise RunDirError(f"{path} is not a valid icrl config ({e})") from e


def resolve_weights(run_dir: str | Path, checkpoint: str | Path | None = None) -> Path:
    """The weights file to load.

    `checkpoint`: a checkpoint folder holding agent.safetensors, a .safetensors file, or a folder name
    inside RUN_DIR/checkpoints (`ckpt-000010`). Without it: the latest checkpoint named by
    RUN_DIR/checkpoints/latest if there is one, else the final weights RUN_DIR/agent.safetensors.
    """
    run_dir = Path(run_dir)
    if checkpoint is not None:
        candidates = [Path(checkpoint), run_dir / "checkpoints" / str(checkpoint)]
        for c in candidates:
            if c.is_file():
                return c
            if c.is_dir():
                if (c / WEIGHTS).is_file():
                    return c / WEIGHTS
                raise RunDirError(f"checkpoint folder {c} has no {WEIGHTS}")
        raise RunDirError(f"checkpoint {checkpoint} does not exist (a checkpoint folder or a .safetensors file)")
    pointer = run_dir / "checkpoints" / "latest"
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8", errors="replace").strip()
        path = run_dir / "checkpoints" / name / WEIGHTS
        # the pointer names one folder of checkpoints/ (the checkpoint module writes `ckpt-NNNNNN`): a path
        # leading elsewhere (`../../other_run/...`, a symlink out) would load, or export, another run's weights
        plain = name and "/" not in name and "\\" not in name and name not in (".", "..")
        if plain and path.is_file() and _inside(run_dir, path):
            return path
    if (run_dir / WEIGHTS).is_file():
        return run_dir / WEIGHTS
    raise RunDirError(
        f"{run_dir} has no weights: neither {WEIGHTS} nor a checkpoint in checkpoints/ (is the run finished?)"
    )


def _inside(run_dir: Path, path: Path) -> bool:
    try:
        check_inside(run_dir, path)
    except OutsideRunDirError:
        return False
    return True


def run_spaces(cfg: ExperimentConfig) -> tuple[Any, Any]:
    """The env's own (observation space, action space) for a run without RUN_DIR/spaces.json (older icrl): the
    env of `cfg` is built once to read them (check it with `run_env_config` first)."""

    venv = make_run_envs(cfg.env, 1)
    try:  # get_attr: the SyncVectorEnv make_run_envs builds has it; the VectorEnv base class does not
        return (venv.get_attr("env_observation_space")[0],  # type: ignore[attr-defined]
                venv.get_attr("env_action_space")[0])  # type: ignore[attr-defined]
    finally:
        venv.close()


def load_weights(agent: Agent, path: Path, device: str | torch.device = "cpu") -> None:
    """Load a weights file into `agent` strictly; RunDirError (one line) when it is unreadable or does not fit."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    try:
        missing, unexpected = load_model(agent, str(path), strict=False, device=str(device))
    except (SafetensorError, OSError) as e:
        raise RunDirError(f"cannot read weights {path}: {e}") from e
    except RuntimeError as e:  # shape mismatch
        first = str(e).strip().splitlines()[-1].strip()
        raise RunDirError(f"weights {path} do not fit the run's config: {first}; "
                          f"pick others with {flag('checkpoint')}") from e
    if missing or unexpected:
        names = ", ".join(sorted([*missing, *unexpected])[:3])
        raise RunDirError(f"weights {path} do not fit the run's config (missing or unexpected: {names}...)")
    from icrl.guards import nonfinite_tensors

    bad = nonfinite_tensors(agent)  # a policy acting on NaN weights would return action 0, silently
    if bad:
        raise RunDirError(f"weights {path} hold NaN or inf in {len(bad)} tensor(s) (first: {bad[0]}); pick a "
                          f"finite checkpoint with {flag('checkpoint')} (icrl.load: a checkpoint folder)")
    agent.refresh_acting_weights()  # acting multiplies by σReparam snapshots: of these weights, not earlier ones
    agent.eval()


def _checkpoint_extra(folder: Path) -> tuple[ExperimentConfig, tuple[Any, Any] | None]:
    """(config, spaces or None) that `icrl train` stores in a checkpoint's state.json."""
    from icrl.spaces_json import read_spaces_record

    state_file = folder / "state.json"
    try:
        extra = json.loads(state_file.read_text(encoding="utf-8")).get("extra", {})
        cfg = ExperimentConfig.from_json(json.dumps(extra["config"])).validate(check_device=False)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise RunDirError(f"{state_file} holds no readable run config ({e})") from e
    return cfg, read_spaces_record(extra["spaces"], str(state_file)) if "spaces" in extra else None


def find_run(path: Path, checkpoint: str | Path | None = None) -> tuple[ExperimentConfig, Path, tuple | None]:
    """(config, weights file, the env's spaces or None) of a run directory (its latest weights, or
    `checkpoint`'s: `resolve_weights`), a checkpoint folder (RUN_DIR/checkpoints/ckpt-N) or a weights file in
    either. The spaces come from RUN_DIR/spaces.json, else from the checkpoint's state.json."""
    from icrl.spaces_json import read_spaces

    folder, weights = (path.parent, path) if path.is_file() else (path, None)
    if (folder / "config.json").is_file():  # a run directory
        cfg = load_config(folder)  # first: a config that cannot work is the error to report, not missing weights
        weights = weights or resolve_weights(folder, checkpoint)
        try:
            spaces = read_spaces(folder)
        except ValueError as e:
            raise RunDirError(str(e)) from e
        if spaces is None and (weights.parent / "state.json").is_file():  # its checkpoint has them too
            spaces = _checkpoint_extra(weights.parent)[1]
        return cfg, weights, spaces
    if (folder / "state.json").is_file():  # a checkpoint folder: RUN_DIR/checkpoints/ckpt-N
        cfg, spaces = _checkpoint_extra(folder)
        if spaces is None:
            spaces = read_spaces(folder.parent.parent)
        return cfg, weights or resolve_weights(folder.parent.parent, folder), spaces
    raise RunDirError(f"{path} is neither a run directory (config.json), a checkpoint folder (state.json) nor a "
                      "weights file in one")


def load_run(path: str | Path, device: str | torch.device = "cpu", *, checkpoint: str | Path | None = None,
             spaces_of: Callable[[ExperimentConfig], tuple] | None = None) -> tuple[Agent, ExperimentConfig, tuple]:
    """The one run loader (`icrl.load`, `icrl eval`, `icrl video`): (agent with the run's weights, in eval
    mode; config; the env's (observation, action) spaces) of whatever `find_run` takes. The agent is built
    exactly as training builds it (`icrl.agent.model.build_agent`) from the recorded spaces; a run that
    recorded none (older icrl) asks `spaces_of(config)` for them. RunDirError (a ValueError, one line) for a
    missing or broken config, weights file or checkpoint, weights that do not fit, or no spaces to build with.
    """
    from icrl.device import resolve_device
    from icrl.envs.wrapper import agent_obs_space
    from icrl.spaces_json import spaces_wrapper

    cfg, weights, spaces = find_run(Path(path), checkpoint)
    if spaces is None:
        if spaces_of is None:
            raise RunDirError(f"{path} records no env spaces (a run from an older icrl)")
        spaces = spaces_of(cfg)
    dev = resolve_device(device) if isinstance(device, str) else torch.device(device)
    io = spaces_wrapper(*spaces)
    agent = build_agent(cfg, agent_obs_space(io), io.action_spec, dev)
    load_weights(agent, weights, dev)
    return agent, cfg, spaces


def load_agent(
    run_dir: str | Path,
    checkpoint: str | Path | None = None,
    device: str | torch.device = "cpu",
    override: EnvOverride = EnvOverride(),
) -> tuple[Agent, ExperimentConfig]:
    """The agent of a run directory with its trained weights (in eval mode), and the run's config (`load_run`).

    A run without recorded spaces (older icrl) builds its env, which `override` must allow when config.json
    names code (`run_env_config`). Raises RunDirError (a ValueError) with a one-line message for a missing
    config or weights file, a bad checkpoint path, or weights that do not fit the config.
    """
    load_config(run_dir)  # a run directory, not a checkpoint folder: the CLI's RUN_DIR argument
    agent, cfg, _ = load_run(run_dir, device, checkpoint=checkpoint,
                             spaces_of=lambda c: run_spaces(run_env_config(c, run_dir, override)))
    return agent, cfg


# ---------------------------------------------------------------------------------------------- exports
MANIFEST = "icrl_export.json"
REQUIRED = ("config.json", "spaces.json", WEIGHTS)
OPTIONAL = ("plan.json", "metrics.jsonl", "eval.json", "learning_curve.png")
# The most bytes a member may hold once unpacked: weights may be large, the rest is small text or a plot.
MAX_WEIGHTS_BYTES = 4 << 30
MAX_OTHER_BYTES = 64 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export(run_dir: str | Path, out: str | Path, checkpoint: str | Path | None = None,
           overwrite: bool = False) -> Path:
    """Write `out` (.zip): the weights `icrl.load(RUN_DIR)` uses (or `checkpoint`'s), config.json,
    spaces.json and, when present, metrics.jsonl, eval.json and learning_curve.png. RunDirError (one line) for
    a run dir without them, or an `out` that exists (unless `overwrite`)."""
    run_dir, out = Path(run_dir), Path(out)
    if out.suffix.lower() != ".zip":
        raise RunDirError(f"{out}: the export is a .zip file; name it e.g. {out.with_suffix('.zip').name}")
    if out.exists() and not overwrite:
        raise RunDirError(f"{out} exists; choose another name or pass {flag('overwrite')}")
    for name in REQUIRED[:2]:
        if not (run_dir / name).is_file():
            raise RunDirError(f"{run_dir} has no {name}; pass a run directory written by `icrl train`")
    files = {WEIGHTS: resolve_weights(run_dir, checkpoint), **{n: run_dir / n for n in REQUIRED[:2]},
             **{n: run_dir / n for n in OPTIONAL if (run_dir / n).is_file()}}
    # nothing from elsewhere goes into a zip to share: a symlink, or a named checkpoint
    for name, path in files.items():
        try:
            check_inside(run_dir, path)
        except OutsideRunDirError as e:
            fix = (f"name one of its own checkpoints ({flag('checkpoint')} ckpt-NNNNNN)"
                   if name == WEIGHTS and checkpoint is not None
                   else f"replace that symlink by the file, or name another checkpoint with {flag('checkpoint')}")
            raise RunDirError(f"{path} leads outside {run_dir}: icrl exports only the run directory's own files; "
                              f"{fix}") from e
    from icrl import __version__

    manifest = {"format": "icrl-export/1", "icrl_version": __version__, "run_dir": str(run_dir),
                "weights": str(files[WEIGHTS]), "sha256": {n: _sha256(p) for n, p in files.items()}}
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out, fsync=False, suffix=".zip") as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, path in files.items():
            z.write(path, name)
        z.writestr(MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return out


def _check_name(name: str, archive: Path) -> None:
    """Refuse a member name that is not a plain file name inside the archive."""
    bad = (name.startswith(("/", "\\")) or "\\" in name or ".." in name.split("/") or ":" in name
           or "/" in name.rstrip("/"))
    if bad:
        raise RunDirError(f"{archive}: member {name!r} points outside the archive or into a folder; an icrl "
                          "export holds plain files only (refused, nothing extracted)")


def _copy_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, archive: Path,
                 dest: Path | None = None) -> tuple[bytes, str]:
    """(bytes, SHA-256) of a member, refusing more than its limit whatever size the zip header claims; with `dest`
    the bytes go to that file in 1 MiB pieces instead (weights may be large: memory holds one piece at a time)
    and b"" is returned. RunDirError (one line) for a corrupt, encrypted or unreadable member."""
    limit = MAX_WEIGHTS_BYTES if info.filename == WEIGHTS else MAX_OTHER_BYTES
    if info.file_size > limit:
        raise RunDirError(f"{archive}: member {info.filename} claims {info.file_size:,} bytes, over the "
                          f"{limit:,}-byte limit (refused)")
    if info.flag_bits & 0x1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise RunDirError(f"{archive}: member {info.filename} is encrypted or compressed with method "
                          f"{info.compress_type}; an icrl export is an unencrypted zip of stored or deflated files")
    digest, kept, size = hashlib.sha256(), [], 0
    try:
        with z.open(info) as f, (open(dest, "wb") if dest is not None else contextlib.nullcontext()) as out:
            while piece := f.read(1 << 20):
                size += len(piece)
                if size > limit:
                    raise RunDirError(f"{archive}: member {info.filename} unpacks to over {limit:,} bytes (refused)")
                digest.update(piece)
                if out is None:
                    kept.append(piece)
                else:
                    out.write(piece)
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:  # CRC, deflate data, truncation
        raise RunDirError(f"{archive}: member {info.filename} is corrupt ({e}); export the run again") from e
    except OSError as e:  # the temporary folder's disk
        raise RunDirError(f"{archive}: cannot unpack member {info.filename} ({e})") from e
    return b"".join(kept), digest.hexdigest()


@contextlib.contextmanager
def unpacked(archive: str | Path) -> Iterator[Path]:
    """The export `archive` unpacked into a temporary folder laid out as a run directory (removed on exit);
    RunDirError (one line) for anything an icrl export does not hold (see the module docstring)."""
    archive = Path(archive)
    try:
        z = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as e:
        raise RunDirError(f"{archive} is not a readable zip file ({e})") from e
    with z, tempfile.TemporaryDirectory(prefix="icrl-export-") as folder:
        for info in z.infolist():
            _check_name(info.filename, archive)
        members = {i.filename: i for i in z.infolist()}
        missing = [n for n in (*REQUIRED, MANIFEST) if n not in members]
        if missing:
            raise RunDirError(f"{archive} is not an icrl export (no {', '.join(missing)}); make one with `icrl export`")
        text = _copy_member(z, members[MANIFEST], archive)[0]  # its own RunDirError (a ValueError) passes through
        try:
            manifest = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise RunDirError(f"{archive}: {MANIFEST} is not valid JSON ({type(e).__name__})") from e
        hashes = manifest.get("sha256") if isinstance(manifest, dict) else None
        if not isinstance(hashes, dict):
            raise RunDirError(f"{archive}: {MANIFEST} holds no file hashes (not an icrl export's manifest)")
        for name in (*REQUIRED, *OPTIONAL):
            if name in members:
                _, sha = _copy_member(z, members[name], archive, Path(folder) / name)
                if sha != hashes.get(name):
                    raise RunDirError(f"{archive}: {name} does not match the archive's manifest (changed or corrupt)")
        yield Path(folder)
