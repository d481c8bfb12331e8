"""`icrl export` of a run to a zip and `icrl.load` of that zip: what is packed (never a file from outside the run
dir), and a zip that is damaged, oversized or names paths leaving the archive is refused in one line."""

from pathlib import Path

import pytest

import icrl

from helpers import cli, tiny


def test_export_and_load_a_zip(in_tmp, capsys):
    import zipfile

    import torch

    icrl.train(tiny("runs/x"))
    assert cli("export", "runs/x", "shared/x.zip") == 0
    names = set(zipfile.ZipFile(in_tmp / "shared/x.zip").namelist())
    assert names == {"agent.safetensors", "config.json", "plan.json", "spaces.json", "metrics.jsonl",
                     "learning_curve.png", "icrl_export.json"}  # no pickle: no optimiser state, no replay
    a, b = icrl.load("runs/x"), icrl.load("shared/x.zip")
    assert all(torch.equal(p, q) for p, q in zip(a.agent.state_dict().values(), b.agent.state_dict().values()))
    assert icrl.evaluate(b, n_episodes=2)["returns"] == icrl.evaluate(a, n_episodes=2)["returns"]
    capsys.readouterr()
    assert cli("export", "runs/x", "shared/x.zip") == 2 and "--overwrite" in capsys.readouterr().err


def test_export_packs_no_file_from_outside_the_run_dir(in_tmp, capsys):
    """A symlinked metrics.jsonl (or plot) would put an outside file into the zip to share, and a checkpoints/latest
    naming another run's checkpoint would export that run's weights: refused / not followed."""
    import json
    import zipfile

    icrl.train(tiny("runs/x"))
    icrl.train(tiny("runs/other", checkpoint_every=1))
    secret = in_tmp / "secret.txt"
    secret.write_text("not for sharing")
    metrics = in_tmp / "runs/x/metrics.jsonl"
    kept = metrics.read_text()
    metrics.unlink()
    metrics.symlink_to(secret)
    capsys.readouterr()
    assert cli("export", "runs/x", "x.zip") == 2 and "leads outside" in capsys.readouterr().err
    assert not (in_tmp / "x.zip").exists()
    metrics.unlink()
    metrics.write_text(kept)
    latest = in_tmp / "runs/x/checkpoints/latest"
    latest.parent.mkdir(exist_ok=True)
    other = sorted(p.name for p in (in_tmp / "runs/other/checkpoints").iterdir() if p.name.startswith("ckpt"))[-1]
    latest.write_text(f"../../other/checkpoints/{other}\n")
    assert cli("export", "runs/x", "x.zip") == 0
    manifest = json.loads(zipfile.ZipFile(in_tmp / "x.zip").read("icrl_export.json"))
    assert manifest["weights"] == str(Path("runs/x/agent.safetensors"))  # its own final weights, not the other run's


@pytest.mark.parametrize("member", ["../evil.txt", "/tmp/evil.txt", "sub/config.json", "..\\evil.txt"])
def test_a_zip_with_paths_leaving_the_archive_is_refused(in_tmp, member):
    import zipfile

    from icrl.run.load import RunDirError

    icrl.train(tiny("runs/x"))
    assert cli("export", "runs/x", "x.zip") == 0
    with zipfile.ZipFile(in_tmp / "x.zip", "a") as z:
        z.writestr(member, "gotcha")
    with pytest.raises(RunDirError, match="outside the archive"):
        icrl.load("x.zip")
    assert not (in_tmp.parent / "evil.txt").exists()


def test_an_oversized_member_is_refused(in_tmp, monkeypatch):
    from icrl.run import load
    from icrl.run.load import RunDirError

    icrl.train(tiny("runs/x"))
    assert cli("export", "runs/x", "x.zip") == 0
    monkeypatch.setattr(load, "MAX_OTHER_BYTES", 100)  # config.json is larger
    with pytest.raises(RunDirError, match="limit"):
        icrl.load("x.zip")


def _rewrite_zip(src: Path, dst: Path, change) -> None:
    """A copy of the zip `src` with each member's (ZipInfo, bytes) passed through `change`, members stored."""
    import zipfile

    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as b:
        for info in a.infolist():
            name, data = change(info.filename, a.read(info))
            b.writestr(zipfile.ZipInfo(name, info.date_time), data)


def _flip_in_member(path: Path, member: str, offset: int = 10) -> None:
    """Flip one byte of a stored member's data in place (its CRC then fails)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = int.from_bytes(raw[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(raw[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    raw[start + offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def _set_header_field(path: Path, member: str, field: str, value: int) -> None:
    """Set `flags` (encryption bit) or `method` (compression) of a member in its local and central headers."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member)
    raw = bytearray(path.read_bytes())
    local = info.header_offset + (6 if field == "flags" else 8)
    raw[local:local + 2] = value.to_bytes(2, "little")
    central = raw.find(b"PK\x01\x02")  # the first central directory header
    while central != -1:
        n = int.from_bytes(raw[central + 28:central + 30], "little")
        if raw[central + 46:central + 46 + n].decode() == member:
            at = central + (8 if field == "flags" else 10)
            raw[at:at + 2] = value.to_bytes(2, "little")
            break
        central = raw.find(b"PK\x01\x02", central + 4)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", ["manifest_list", "manifest_deep", "manifest_no_hashes", "crc", "encrypted",
                                    "method", "deflate"])
def test_a_zip_whose_members_cannot_be_read_is_refused_in_one_line(in_tmp, damage):
    """Reading a zip's members (not only opening it) is guarded: a bad manifest, a CRC or deflate error, an
    encrypted member or a compression method zipfile cannot read is one RunDirError, never a traceback."""
    import zipfile

    from icrl.run.load import RunDirError

    icrl.train(tiny("runs/x"))
    assert cli("export", "runs/x", "x.zip") == 0
    bad = in_tmp / "bad.zip"
    if damage.startswith("manifest"):
        body = {"manifest_list": b"[]", "manifest_deep": b"[" * 100_000 + b"]" * 100_000,
                "manifest_no_hashes": b'{"sha256": 3}'}[damage]
        _rewrite_zip(in_tmp / "x.zip", bad, lambda n, d: (n, body if n == "icrl_export.json" else d))
    elif damage == "deflate":
        with zipfile.ZipFile(in_tmp / "x.zip") as a, zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as b:
            for info in a.infolist():
                b.writestr(info.filename, a.read(info))
        with zipfile.ZipFile(bad) as z:
            size = z.getinfo("config.json").compress_size
        _flip_in_member(bad, "config.json", offset=size // 2)
    else:
        _rewrite_zip(in_tmp / "x.zip", bad, lambda n, d: (n, d))
        if damage == "crc":
            _flip_in_member(bad, "config.json")
        else:
            _set_header_field(bad, "config.json", "flags" if damage == "encrypted" else "method",
                              1 if damage == "encrypted" else 99)
    with pytest.raises(RunDirError, match=r"bad\.zip") as e:
        icrl.load("bad.zip")
    assert "\n" not in str(e.value)


def test_export_packs_no_checkpoint_named_from_outside_the_run_dir(in_tmp, capsys):
    """`--checkpoint PATH` outside the run dir (another run's weights, any file) is refused as a symlink is: the zip
    shares this run only. A checkpoint of the run's own, by name or path, is packed."""
    icrl.train(tiny("runs/x", checkpoint_every=1))
    icrl.train(tiny("runs/other", checkpoint_every=1))
    theirs = sorted((in_tmp / "runs/other/checkpoints").glob("ckpt-*"))[-1]
    capsys.readouterr()
    for outside in (theirs, theirs / "agent.safetensors"):
        assert cli("export", "runs/x", "x.zip", "--checkpoint", str(outside)) == 2
        err = capsys.readouterr().err
        assert "leads outside" in err and "--checkpoint ckpt-" in err and len(err.strip().splitlines()) == 1, err
        assert not (in_tmp / "x.zip").exists()
    own = sorted((in_tmp / "runs/x/checkpoints").glob("ckpt-*"))[-1]
    assert cli("export", "runs/x", "x.zip", "--checkpoint", own.name) == 0
    assert cli("export", "runs/x", "y.zip", "--checkpoint", str(own)) == 0
