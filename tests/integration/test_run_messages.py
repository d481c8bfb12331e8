"""What a run prints as it goes: the progress lines (an evaluation shown only when it is new, the live line within
80 columns), what it rounded of the schedule it was asked for, and why a callback stopped it."""

import json

import icrl

from helpers import Combo, cli, tiny


def test_lines_show_an_evaluation_only_when_it_is_new(in_tmp, capsys):
    icrl.train(tiny("runs/p", total_env_steps=128, eval_every=2))  # 4 epochs, evaluations at 2 and 4
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("epoch")]
    assert [("eval return" in ln) for ln in lines] == [False, True, False, True]


def test_the_live_line_fits_80_columns():
    import io

    from rich.console import Console

    from icrl.run.reporting import progress_bar, progress_line

    row = {"epoch": 123, "env_steps": 49_000, "updates": 12_345, "time/env_steps_per_s": 1234.0,
           "time/updates_per_s": 98.7, "train/return_mean": -0.906}
    bar, task = progress_bar(50_000)
    bar.update(task, completed=49_000, description=progress_line(row, {"return_mean": 0.95}, live=True))
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False, color_system=None).print(bar.make_tasks_table(bar.tasks))
    text = out.getvalue()
    assert "98.7 upd/s" in text and "train -0.91" in text and "eval +0.95" in text and "49000/50000" in text
    assert max(len(ln) for ln in text.splitlines()) <= 80


def test_a_run_says_what_it_rounded_and_why_a_callback_stopped_it(in_tmp, capsys):
    class Enough:
        def on_epoch_end(self, row):
            return row["epoch"] >= 1

    icrl.train(tiny("runs/n", env_kwargs="{}", total_env_steps=70, eval_rollouts=3), env=lambda: Combo(),
               callbacks=[Enough()])  # a user's env: evaluated on the run's 2 copies
    out = capsys.readouterr().out
    assert "plan: 2 epochs x 2 envs x 16 steps = 64 env steps (asked 70: whole epochs" in out
    assert "evaluations run 4 rollouts, not --eval-rollouts 3" in out
    assert "stopping: the callback Enough.on_epoch_end returned True" in out


def test_an_epoch_that_is_not_whole_steps_of_the_envs_is_said(in_tmp, capsys):
    """Each process takes whole vector steps of its envs: 33 env steps per epoch of 2 envs are 34, said once."""
    result = icrl.train(tiny("runs/n", total_env_steps=66, steps_per_epoch=33))
    out = capsys.readouterr().out
    assert "plan: 2 epochs x 2 envs x 17 steps = 68 env steps (asked 66" in out
    assert result["env_steps"] == 68


def test_a_tiny_run_says_one_plan_that_agrees_with_what_it_does(in_tmp, capsys):
    """`icrl train --total-env-steps 10`: one plan line (no separate notes for the single epoch and the rounding),
    whose env steps, envs and steps per env are what the run then takes and what its messages say."""
    import re

    assert cli("train", "--total-env-steps", "10", "--run-dir", "runs/t") == 0
    out = " ".join(capsys.readouterr().out.split())
    plans = re.findall(r"plan: (\d+) epochs? x (\d+) envs x (\d+) steps = ([\d,]+) env steps", out)
    assert len(plans) == 1 and "note:" not in out, out
    epochs, envs, per_env, total = (int(x.replace(",", "")) for x in plans[0])
    rows = [json.loads(line) for line in (in_tmp / "runs/t/metrics.jsonl").read_text().splitlines()]
    assert (epochs, envs * per_env, total) == (1, 16, 16) and rows[-1]["env_steps"] == total
    assert f"within the {per_env} steps each of the {envs} envs" in out
    plan = json.loads((in_tmp / "runs/t/plan.json").read_text())  # what ran, beside what was asked (config.json)
    assert (plan["env_steps"], plan["steps_per_env"], plan["epochs"], plan["cuda_graphs"]) == (16, 2, 1, False)
    assert None not in plan.values() and plan["context"] == 11 and plan["updates_per_epoch"] >= 1
