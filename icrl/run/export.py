"""Sharing a trained policy as one file: `icrl export RUN_DIR out.zip` writes it, `icrl.load("out.zip")` reads
it back (in a process without the env, as a run directory).

The zip holds only data: the weights in safetensors (never a pickle: the optimiser state of checkpoints,
which `torch.load` would read, stays behind), config.json, spaces.json, metrics.jsonl, eval.json and the
plot, flat, plus `icrl_export.json` (the icrl version and each file's SHA-256). An archive is hostile input:
reading one refuses member names that leave the archive (`../x`, `/etc/x`, `C:\\x`, folders), members
larger than their limit (checked while reading, not trusting the sizes the zip claims: a zip bomb stops at
the limit), files whose hash differs from the manifest, and takes nothing but the files named here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from icrl.fileio import OutsideRunDirError, atomic_path, check_inside
from icrl.run.evaluate import RunDirError, resolve_weights

MANIFEST = "icrl_export.json"
WEIGHTS = "agent.safetensors"
REQUIRED = ("config.json", "spaces.json", WEIGHTS)
OPTIONAL = ("metrics.jsonl", "eval.json", "learning_curve.png")
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
        raise RunDirError(f"{out} exists; choose another name or pass --overwrite")
    for name in REQUIRED[:2]:
        if not (run_dir / name).is_file():
            raise RunDirError(f"{run_dir} has no {name}; pass a run directory written by `icrl train`")
    files = {WEIGHTS: resolve_weights(run_dir, checkpoint), **{n: run_dir / n for n in REQUIRED[:2]},
             **{n: run_dir / n for n in OPTIONAL if (run_dir / n).is_file()}}
    for name, path in files.items():  # a symlink in the run dir must not pack a file from elsewhere into a zip to share
        if name != WEIGHTS or checkpoint is None:  # (a checkpoint the user names is theirs, wherever it lies)
            try:
                check_inside(run_dir, path)
            except OutsideRunDirError as e:
                raise RunDirError(f"{path} leads outside {run_dir}: icrl exports only the run directory's own files; "
                                  "replace that symlink by the file, or pass the weights with --checkpoint") from e
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


def _copy_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, archive: Path, dest: Path | None = None) -> tuple[bytes, str]:
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
