"""The README's "Daily use" commands, run one after another in a fresh folder as a user types them."""

import sys

import pytest

from helpers import ROOT, TINY, cli

MY_PACKAGE = '''
import gymnasium as gym


def make_env(difficulty: int = 1):
    return gym.make("CartPole-v1", max_episode_steps=5 * difficulty)
'''


def readme_daily_use() -> list[list[str]]:
    """The commands of the README's "Daily use" block, comments dropped."""
    import shlex

    block = (ROOT / "README.md").read_text().split("## Daily use", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_readme_daily_use_runs_one_after_another_in_a_fresh_folder(in_tmp, capsys):
    (in_tmp / "my_package").mkdir()
    (in_tmp / "my_package/__init__.py").write_text("")
    (in_tmp / "my_package/envs.py").write_text(MY_PACKAGE)
    commands = readme_daily_use()
    assert len(commands) >= 12 and all(c[0] == "icrl" for c in commands)
    sys.path.insert(0, str(in_tmp))
    try:
        for command in commands:
            args = command[1:]
            if args[:1] == ["train"] and "--help" not in args:  # tiny budgets on top of every flag
                args = [*args, *TINY] + (["--total-env-steps", "96"] if "--resume" in args else [])
            code = cli(*args)
            out = capsys.readouterr()
            assert code == 0, (command, out.err[-2000:])
            assert "already holds" not in out.err, command
    finally:
        sys.path.remove(str(in_tmp))
        sys.modules.pop("my_package.envs", None)
        sys.modules.pop("my_package", None)
    runs = sorted(p.name for p in (in_tmp / "runs").iterdir())
    assert {"demo", "tmaze20", "tmaze50"} <= set(runs)  # presets name their own folders
    assert any(r.startswith("CartPole-v1-0-") for r in runs) and any(r.startswith("tmaze-2-") for r in runs)
    assert (in_tmp / "demo.zip").is_file() and (in_tmp / "runs/demo/eval_video.gif").is_file()


def test_the_gpu_section_names_the_flags_the_machine_and_the_defaults_rule():
    """A GPU user finds what to do from the README: a section linking docs/gpu.md, which names the flags that matter,
    the machine its figures come from, and why the default dtype is what it is; every flag it names exists."""
    import dataclasses
    import re

    from icrl.config import ExperimentConfig

    cfg = ExperimentConfig()
    flags = {"--" + f.name.replace("_", "-") for g in dataclasses.fields(cfg)
             for f in dataclasses.fields(getattr(cfg, g.name))}
    section = (ROOT / "README.md").read_text().split("## On a GPU", 1)[1].split("\n## ", 1)[0]
    assert "docs/gpu.md" in section
    gpu = (ROOT / "docs/gpu.md").read_text()
    for what in ("--device", "--cuda-graphs", "--dtype bf16", "--compile", "--parallel-envs", "H200",
                 "Why the default stays fp32"):
        assert what in gpu, what
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", gpu + section))
    assert named <= flags, named - flags


def test_the_readme_results_table_is_the_committed_parity_record():
    """The README's table is made from benchmarks/results/parity/parity.json (`parity.readme_table`), never copied
    by hand: a cell that disagrees with the record fails here."""
    import json

    from benchmarks import parity

    rows = json.loads((ROOT / "benchmarks/results/parity/parity.json").read_text())["rows"]
    assert parity.readme_table(rows) in (ROOT / "README.md").read_text()


def _slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    import re

    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_results_are_organised_by_topic_and_every_link_into_them_resolves():
    """docs/results.md's headings name topics, not the issues that asked for them, and every `results.md#anchor`
    link in the repository's docs leads to one of its headings."""
    import re

    text = (ROOT / "docs/results.md").read_text()
    headings = re.findall(r"^#+ (.*)$", text, re.M)
    assert not [h for h in headings if re.search(r"\bissue\b", h, re.I)], "name the topic, not the issue"
    anchors = {_slug(h) for h in headings}
    sources = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks/results").glob("*.md")]
    broken = [(p.name, a) for p in sources for a in re.findall(r"results\.md#([\w-]+)", p.read_text())
              if a not in anchors]
    assert not broken, broken
