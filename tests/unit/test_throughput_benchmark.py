"""benchmarks/throughput.py's pure helpers (benchmarks/throughput_plan.py): the --preset issue18 expansion, the
analytic FLOP and memory estimates, the update planning and the markdown report, on tiny inputs (nothing timed)."""

import pytest

from benchmarks import throughput
from benchmarks import throughput_plan as plan


def test_preset_issue18_expands_to_the_reference_shapes():
    args = throughput.parse_args(["--preset", "issue18"])
    assert throughput.is_sweep(args) and args.threads == 2 and args.batch_size == 24 and args.head_hidden == 256
    assert args.updates == 5 and args.warmup == 2 and args.max_seconds == 1200  # the ~20-minute budget
    net, cells, acting = throughput.sweep_plan(args)
    shapes = [(c["d_model"], c["seq_len"]) for c in cells]
    assert list(dict.fromkeys(shapes)) == [(128, 256), (64, 501), (64, 1001)]
    assert len(cells) == 3 * 2 * 2 and {(c["dtype"], c["compile"]) for c in cells} == {
        ("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)}
    assert [a["envs"] for a in acting] == [8, 32, 128] * 3 and net.layers == 2 and net.heads == 4


def test_explicit_flags_override_the_preset_and_single_shape_stays_single():
    args = throughput.parse_args(["--preset", "issue18", "--threads", "1", "--compile-modes", "off"])
    assert args.threads == 1 and {c["compile"] for c in throughput.sweep_plan(args)[1]} == {False}
    single = throughput.parse_args(["--seq-len", "32"])
    assert not throughput.is_sweep(single) and single.compile is False


def test_sweep_shapes_sort_contexts_and_parse():
    assert plan.sweep_shapes(None, None, [512, 256], 128, 99) == [(128, 256), (128, 512)]
    assert plan.sweep_shapes(["64x501"], None, None, 128, 256) == [(64, 501)]
    with pytest.raises(ValueError):
        plan.parse_shape("64by501")


def test_estimates_grow_with_context_and_shrink_with_bf16():
    net = plan.Net()
    f1, f2 = plan.update_flops(64, 501, net), plan.update_flops(64, 1001, net)
    assert 2 * f1 < f2 < 3 * f1  # tokens double, attention per token doubles too
    m = [plan.update_mib(64, n, net) for n in (256, 512, 1024)]
    assert m[0] < m[1] < m[2] and plan.update_mib(64, 1024, net, "bf16") < m[2]
    assert plan.update_mib(64, 4096, net, sdpa="math") > 2 * plan.update_mib(64, 4096, net)  # the L^2 matrices


def test_plan_updates_trims_then_skips():
    assert plan.plan_updates(1.0, 5, 2, 1, budget_s=100) == (5, 2)
    assert plan.plan_updates(10.0, 5, 2, 1, budget_s=70) == (4, 1)
    assert plan.plan_updates(10.0, 5, 2, 1, budget_s=40) is None
    assert plan.plan_updates(1.0, 5, 2, 1, budget_s=100, extra_s=95) is None


def test_runtime_estimate_and_markdown_table():
    net = plan.Net(batch=2, head_hidden=8)
    cells = plan.expand_cells([(8, 4)], ["fp32"], ["off", "on"])
    acting = plan.expand_acting([(8, 4)], [2])
    est = plan.estimate_runtime_s(cells, acting, net, 1e9, 5, 2, 1, compile_s=10.0)
    assert 10 < est < 30
    ok = dict(cells[0], status="ok", first_call_s=1.0, s_per_update_median=0.5, timed_updates=5, updates_per_s=2.0,
              breakdown_s={"forward_s": 0.2, "backward_s": 0.25, "optim_s": 0.05}, peak_mib=12.0,
              gflop_per_update=0.1, gflops=0.2, mfu_vs_fp32_peak=0.5, mfu_vs_bf16_peak=0.1)
    skipped = dict(cells[1], status="skipped: over 150 s estimate")
    act_skipped = dict(acting[0], status="skipped: over 150 s estimate (400 s)")
    act = dict(acting[0], status="ok", env_steps_per_s=1234.0, frac_policy=0.7, frac_env_step=0.2,
               frac_collector=0.1, us_per_vector_step={"policy": 700.0, "env_step": 200.0, "collector": 100.0})
    md = plan.markdown_tables({"tag": "t", "matmul_peak_flops": {"fp32": 1e11, "bf16": 4e11},
                               "learner_cells": [ok, skipped], "acting_cells": [act, act_skipped]})
    rows = [line for line in md.splitlines() if line.startswith("| 8 |")]
    assert len(rows) == 4 and "0.500 (5)" in rows[0] and "50.0 | 10.0" in rows[0]
    assert "skipped: over 150 s" in rows[1] and "1,234" in rows[2]
    assert rows[0].count("|") == rows[1].count("|") == 14  # a skipped row keeps the table's 13 columns
    assert rows[2].count("|") == rows[3].count("|") == 10  # 9 columns: the env implementation is one
    assert "| batched |" in rows[2]  # expand_acting's default: the batched envs make_vector_env builds


def test_calibration_scales_the_estimates_by_what_the_cells_measured():
    net = plan.Net(batch=2, head_hidden=8)
    calib = throughput.Calibration({"fp32": 1e10, "bf16": 4e10}, net, "default")
    cell = {"d_model": 8, "seq_len": 16, "dtype": "fp32", "compile": False}
    prior_s, prior_mib = calib.seconds_per_update(cell), calib.mib(cell)
    calib.learn(cell, {"status": "ok", "s_per_update_median": 2 * prior_s, "peak_mib": 3 * prior_mib,
                       "first_call_s": 1.0})  # fmt: skip
    longer = dict(cell, seq_len=32)
    assert calib.seconds_per_update(cell) == pytest.approx(2 * prior_s)
    assert calib.mib(longer) == pytest.approx(3 * plan.update_mib(8, 32, net))
    assert calib.mib(dict(longer, dtype="bf16")) == pytest.approx(3 * plan.update_mib(8, 32, net, "bf16"))
    calib.learn(dict(cell, compile=True), {"status": "ok", "s_per_update_median": 1.0, "first_call_s": 31.0,
                                           "compiled": True})  # fmt: skip
    assert calib.compile_s == pytest.approx(30.0)
