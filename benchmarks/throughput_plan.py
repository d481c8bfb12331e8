"""Pure helpers of benchmarks/throughput.py's sweeps (no torch, no timing): the presets and the expansion of a
sweep into cells, analytic FLOP / memory / runtime estimates (used to skip cells before they swap or run for
many minutes, and to print the runtime up front), and the report: a markdown table and a plot.

A learner cell is one (d_model, context, dtype, compile) combination; an acting cell one (d_model, context,
number of envs). Estimates are deliberately simple formulas, calibrated during a sweep by the cells already
measured (see throughput.py: `Calibration`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

# The measurements issue 18 asks for: the two reference shapes (d128 x 256; d64 x 501 and 1001), both dtypes,
# compiled and eager, 2 threads, and acting at 8 / 32 / 128 envs on T-Maze with corridor = context. Heads and
# losses are the library defaults (4 critics, 7 discounts) with 256-unit heads (the reference settings).
PRESETS: dict[str, dict] = {
    "issue18": {
        "shapes": ["128x256", "64x501", "64x1001"],
        "dtypes": ["fp32", "bf16"],
        "compile_modes": ["off", "on"],
        "envs": [8, 32, 128],
        "batch_size": 24,
        "layers": 2,
        "heads": 4,
        "head_hidden": 256,
        "threads": 2,
        "updates": 5,
        "warmup": 2,
        "breakdown_updates": 1,
        "max_cell_seconds": 150.0,
        "max_seconds": 1200.0,
    },
}


@dataclass(frozen=True)
class Net:
    """What the estimates need of the model and the batch (library defaults for the losses)."""

    batch: int = 24
    layers: int = 2
    heads: int = 4
    head_hidden: int = 256
    head_layers: int = 2
    critics: int = 4
    gammas: int = 7
    actions: int = 4
    redq_subset: int = 2
    tstep_hidden: int = 128
    obs_dim: int = 4


# -------------------------------------------------------------------------------------------- expansion
def parse_shape(text: str) -> tuple[int, int]:
    """'128x256' -> (d_model 128, context 256)."""
    d, sep, length = text.lower().partition("x")
    if not sep or not d.isdigit() or not length.isdigit() or int(d) < 1 or int(length) < 1:
        raise ValueError(f"a shape is D_MODELxCONTEXT, e.g. 128x256, got {text!r}")
    return int(d), int(length)


def sweep_shapes(shapes, d_models, seq_lens, d_model: int, seq_len: int) -> list[tuple[int, int]]:
    """The (d_model, context) pairs of a sweep: --shapes as given, else --d-models x --seq-lens (each falling
    back to the single --d-model / --seq-len), contexts ascending within a d_model so a sweep stops early."""
    if shapes:
        return [parse_shape(s) if isinstance(s, str) else tuple(s) for s in shapes]
    ds = list(dict.fromkeys(d_models or [d_model]))
    lens = sorted(set(seq_lens or [seq_len]))
    return [(d, n) for d in ds for n in lens]


def expand_cells(shapes, dtypes, compile_modes) -> list[dict]:
    """Learner cells, shape-major (so one replay per shape serves all its dtype x compile cells)."""
    modes = [m in (True, "on") for m in compile_modes]
    return [{"d_model": d, "seq_len": n, "dtype": dt, "compile": c} for d, n in shapes for dt in dtypes for c in modes]


def expand_acting(shapes, envs, impls=("batched",)) -> list[dict]:
    """Acting cells: d_model x context x envs x env implementation ("batched": icrl.envs.batched, what
    make_vector_env builds for T-Maze; "per-copy": a SyncVectorEnv of TimestepWrapper'd envs)."""
    return [{"d_model": d, "seq_len": n, "envs": e, "env_impl": i} for d, n in shapes for e in envs for i in impls]


def acting_steps(envs: int, seq_len: int, act_steps: int | None) -> int:
    """Timed env steps of an acting cell: --act-steps, else one whole T-Maze rollout per env (corridor =
    context: seq_len + 1 steps), so the KV cache is timed at every fill level once."""
    return act_steps if act_steps is not None else envs * (seq_len + 1)


# -------------------------------------------------------------------------------------------- estimates
def head_flops(d: int, net: Net, out: int) -> int:
    """Forward FLOPs per token of one MLP head: d -> H (-> H)* -> out."""
    h = net.head_hidden
    return 2 * (d * h + (net.head_layers - 1) * h * h + h * out)


def update_flops(d_model: int, seq_len: int, net: Net, d_ff: int | None = None) -> float:
    """Matmul FLOPs of one learner update, as FlopCounterMode counts them (attention full, not causal-halved):
    3x the forward of the online parts (encoders, actor, C critics), 1x the target actor and REDQ's critics."""
    d, ff, L = d_model, d_ff or 4 * d_model, seq_len
    tstep = 2 * ((net.obs_dim + net.actions + 1) * net.tstep_hidden + net.tstep_hidden * d)
    layer = 2 * (4 * d * d + 2 * d * ff) + 4 * L * d  # qkv + out projections, feed-forward, QK^T and AV
    ga = net.gammas * net.actions
    actor, critic = head_flops(d, net, ga), head_flops(d, net, ga)
    online = tstep + net.layers * layer + actor + net.critics * critic
    targets = actor + net.redq_subset * critic
    return float(net.batch * L * (3 * online + targets))


def update_mib(d_model: int, seq_len: int, net: Net, dtype: str = "fp32", sdpa: str = "default",
               d_ff: int | None = None) -> float:  # fmt: skip
    """Peak memory of one update in MiB: the activations autograd saves (encoder ~11 d + 2 d_ff per layer; 3 H
    per hidden head layer of the actor and each critic; the G x A outputs a few times), 25% for the backward's
    transients, the L^2 attention matrices only with the math SDPA kernel (flash keeps O(L)), and parameters
    with gradients and AdamW state. bf16 autocast stores most activations in half the bytes (norms stay fp32)."""
    d, ff, h = d_model, d_ff or 4 * d_model, net.head_hidden
    per_token = net.layers * (11 * d + 2 * ff) + (net.critics + 1) * net.head_layers * 3 * h
    per_token += 4 * (net.critics + 1) * net.gammas * net.actions + net.tstep_hidden * 3
    tokens = net.batch * seq_len
    act_bytes = per_token * tokens * (4 if dtype == "fp32" else 2.6) * 1.25
    attn_bytes = 3 * 4 * net.batch * net.heads * seq_len**2 * net.layers if sdpa == "math" else 0
    params = net.layers * (4 * d * d + 2 * d * ff) + (net.critics * 2 + 2) * (d * h + h * h + h * net.gammas * 4)
    return (act_bytes + attn_bytes + 16 * params) / 2**20


def plan_updates(est_s: float, updates: int, warmup: int, breakdown: int, budget_s: float, extra_s: float = 0.0,
                 min_updates: int = 3) -> tuple[int, int] | None:  # fmt: skip
    """(timed updates, warm-up updates) that fit a cell into budget_s, given est_s per update and extra_s of
    one-off cost (compiling): fewer timed updates (down to min_updates) and one warm-up for long contexts;
    None (skip the cell) when even that does not fit."""
    left = budget_s - extra_s - est_s * (1 + breakdown)  # the first call and the breakdown updates
    if est_s * (warmup + updates) <= left:
        return updates, warmup
    n = int(left // est_s) - 1 if est_s > 0 else updates
    if n < min(min_updates, updates):
        return None
    return min(updates, n), min(warmup, 1)


def vector_step_s(envs: int, seq_len: int, d_model: int) -> float:
    """Prior seconds per vector step of acting (KV cache), from the reference CPU measurements (8 envs:
    ~2.5 ms, 64 envs: ~6 ms at d128 x 256, 1 thread), growing with the cache and the width."""
    return (0.002 + 7e-5 * envs) * (1 + seq_len / 1024) * max(1.0, d_model / 128)


def estimate_runtime_s(cells: list[dict], acting: list[dict], net: Net, rate_flops: float, updates: int,
                       warmup: int, breakdown: int, act_steps: int | None = None, compile_s: float = 60.0,
                       budget_s: float = math.inf) -> float:  # fmt: skip
    """Seconds a sweep takes: each learner cell's calls at rate_flops (plus compile_s where compiled, capped
    by the per-cell budget as the sweep caps it), one FLOP count per shape, and each acting cell's vector steps."""
    total = 0.0
    for c in cells:
        est = update_flops(c["d_model"], c["seq_len"], net) / rate_flops
        plan = plan_updates(est, updates, warmup, breakdown, budget_s, compile_s if c["compile"] else 0.0)
        if plan is not None:
            total += est * (1 + breakdown + sum(plan)) + (compile_s if c["compile"] else 0.0)
    shapes = {(c["d_model"], c["seq_len"]) for c in cells}
    total += sum(3 * update_flops(d, n, net) / rate_flops + 2 for d, n in shapes)  # FLOP count + replay fill
    for a in acting:
        steps = acting_steps(a["envs"], a["seq_len"], act_steps) + 4 * a["envs"]
        total += steps / a["envs"] * vector_step_s(a["envs"], a["seq_len"], a["d_model"]) + 1
    return total


# ----------------------------------------------------------------------------------------------- report
def _fmt(x, spec: str = ".3g") -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def learner_row(c: dict) -> str:
    mode = "off" if not c["compile"] else "on" if c.get("compiled", True) else "on (failed: ran eager)"
    name = f"{c['d_model']} | {c['seq_len']} | {c['dtype']} | {mode}"
    if c.get("status", "ok") != "ok":
        return f"| {name} | {c['status']} |" + " |" * 8
    b = c.get("breakdown_s") or {}
    split = "/".join(_fmt(b.get(k), ".2f") for k in ("forward_s", "backward_s", "optim_s")) if b else "—"
    pct = lambda k: _fmt(None if c.get(k) is None else 100 * c[k], ".1f")  # noqa: E731
    return (f"| {name} | {_fmt(c.get('first_call_s'), '.2f')} | {_fmt(c.get('s_per_update_median'), '.3f')} "
            f"({c.get('timed_updates', 0)}) | {_fmt(c.get('updates_per_s'), '.2f')} | {split} | "
            f"{_fmt(c.get('peak_mib'), '.0f')} | {_fmt(c.get('gflop_per_update'), '.1f')} | "
            f"{_fmt(c.get('gflops'), '.1f')} | {pct('mfu_vs_fp32_peak')} | {pct('mfu_vs_bf16_peak')} |")  # fmt: skip


def acting_row(a: dict) -> str:
    name = f"{a['d_model']} | {a['seq_len']} | {a['envs']} | {a.get('env_impl', 'per-copy')}"
    if a.get("status", "ok") != "ok":
        return f"| {name} | {a['status']} | | | | |"
    pct = lambda k: _fmt(100 * a[k], ".0f")  # noqa: E731
    us = a["us_per_vector_step"]
    return (f"| {name} | {_fmt(a['env_steps_per_s'], ',.0f')} | {pct('frac_policy')} | {pct('frac_env_step')} | "
            f"{pct('frac_collector')} | {_fmt(us['policy'], ',.0f')} / {_fmt(us['env_step'], ',.0f')} / "
            f"{_fmt(us['collector'], ',.0f')} |")  # fmt: skip


def markdown_tables(result: dict) -> str:
    """The compact report: one learner row per (d_model, context, dtype, compile), one acting row per envs."""
    peaks = result.get("matmul_peak_flops", {})
    head = [f"# Throughput sweep `{result.get('tag', '')}`", "",
            f"{result.get('device', 'cpu')}, {result.get('torch_threads', '?')} threads, batch "
            f"{result.get('settings', {}).get('batch_size', '?')}; measured torch.mm peak fp32 "
            f"{_fmt(peaks.get('fp32', 0) / 1e9, '.0f')} GFLOP/s, "
            f"bf16 {_fmt(peaks.get('bf16', 0) / 1e9, '.0f')} GFLOP/s. "
            "First call = compile (where on) + first allocations; s/update = median of the timed updates (count).",
            ""]  # fmt: skip
    lines = head + [
        "| d_model | context | dtype | compile | first call s | s/update (n) | updates/s | fwd/bwd/opt s | "
        "peak MiB | GFLOP/update | GFLOP/s | MFU % fp32 peak | MFU % bf16 peak |",
        "|---:|---:|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
        *[learner_row(c) for c in result.get("learner_cells", [])],
    ]
    if result.get("acting_cells"):
        lines += ["", "| d_model | context | envs | envs as | env steps/s | policy % | env % | collector % | "
                  "us per vector step (policy / env / collector) |",
                  "|---:|---:|---:|---|---:|---:|---:|---:|---|",
                  *[acting_row(a) for a in result["acting_cells"]]]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    """updates/s and peak MiB vs context (one line per d_model x dtype x compile); env steps/s vs envs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from icrl.run.artifacts import save_figure  # a PNG with a palette: a third of the bytes

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    series: dict[str, list[dict]] = {}
    for c in result.get("learner_cells", []):
        if c.get("status", "ok") == "ok":
            key = f"d{c['d_model']} {c['dtype']} compile {'on' if c['compile'] else 'off'}"
            series.setdefault(key, []).append(c)
    for key, cs in series.items():
        cs = sorted(cs, key=lambda c: c["seq_len"])
        axes[0].plot([c["seq_len"] for c in cs], [c["updates_per_s"] for c in cs], "o-", label=key)
        axes[1].plot([c["seq_len"] for c in cs], [c.get("peak_mib") or 0 for c in cs], "o-", label=key)
    acting: dict[str, list[dict]] = {}
    for a in result.get("acting_cells", []):
        if a.get("status", "ok") == "ok":
            acting.setdefault(f"d{a['d_model']} x {a['seq_len']} {a.get('env_impl', 'per-copy')}", []).append(a)
    for key, acts in acting.items():
        axes[2].plot([a["envs"] for a in acts], [a["env_steps_per_s"] for a in acts], "o-", label=key)
    titles = [("context", "updates/s", "learner updates/s"), ("context", "peak MiB", "peak memory of an update"),
              ("parallel envs", "env steps/s", "acting (KV cache)")]  # fmt: skip
    for ax, (x, y, t) in zip(axes, titles):
        ax.set(xlabel=x, ylabel=y, title=t)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[2].set_xscale("log", base=2)
    fig.suptitle(f"throughput {result.get('tag', '')}")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)  # closes it
