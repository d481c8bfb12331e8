"""Where a run's folder goes: without --run-dir each run gets a folder of its own (never one already used), a
preset's folder gives way to the next free name, and a named run dir that holds a run is refused unless resumed."""

import json
from pathlib import Path

import pytest

import icrl
from icrl.config import ConfigError

from helpers import TINY, cli, tiny


def test_default_run_dirs_never_collide(in_tmp):
    """The README's snippet (a notebook cell) run twice, and a second seed: each run gets its own folder."""
    first = icrl.train(tiny())
    again = icrl.train(tiny())
    seed1 = icrl.train(tiny(seed=1))
    dirs = [Path(r["run_dir"]) for r in (first, again, seed1)]
    assert len(set(dirs)) == 3 and all(d.parent == Path("runs") and (in_tmp / d / "agent.safetensors").is_file()
                                      for d in dirs)
    assert dirs[0].name.startswith("tmaze-0-") and dirs[2].name.startswith("tmaze-1-")
    assert json.loads((in_tmp / dirs[1] / "config.json").read_text())["run"]["run_dir"] == str(dirs[1])


def test_a_named_run_dir_that_holds_a_run_is_refused_in_the_readers_words(in_tmp, capsys):
    icrl.train(tiny("runs/mine"))
    with pytest.raises(ConfigError, match=r"resume=True") as e:  # Python words in Python
        icrl.train(tiny("runs/mine"))
    assert "--resume" not in str(e.value)
    with pytest.raises(ConfigError, match="run_dir"):  # nothing to resume when no run is named
        icrl.train(tiny(resume=True))
    capsys.readouterr()
    code = cli("train", "--env", "tmaze", "--env-kwargs", '{"length": 3}', "--run-dir", "runs/mine",
               "--total-env-steps", "64", "--steps-per-epoch", "32", "--parallel-envs", "2")
    err = capsys.readouterr().err
    assert code == 2 and "pass --resume" in err and "resume=True" not in err


def test_a_presets_folder_gives_way_when_it_holds_a_run(in_tmp):
    """`icrl train --preset tmaze` twice: runs/tmaze20, then runs/tmaze20-2; naming it is still refused."""
    assert cli("train", "--preset", "tmaze", *TINY) == 0
    assert cli("train", "--preset", "tmaze", *TINY) == 0
    assert ((in_tmp / "runs/tmaze20/agent.safetensors").is_file()
            and (in_tmp / "runs/tmaze20-2/agent.safetensors").is_file())
    assert cli("train", "--preset", "tmaze", "--run-dir", "runs/tmaze20", *TINY) == 2
