"""Acting cost per step: KV cache vs recomputing the whole context (docs/design.md §3).

With the cache, one acting step writes one K/V slot per layer and attends over at most W slots:
O(W) work per step. Recomputing means a full causal forward over the last W timesteps for every
action: O(W^2) attention plus O(W) MLP work. This script times both for the default-size encoder
(d_model 128, 2 layers, 4 heads) with 8 parallel envs, with the cache already full (the steady state of
a long rollout), prints a table and writes benchmarks/results/acting_cost/acting_cost.json.

    python benchmarks/acting_cost.py [--threads 1] [--contexts 256 1024 4096]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from icrl.nets.transformer import TransformerTrajEncoder

D_IN, D_MODEL, LAYERS, HEADS, BATCH = 128, 128, 2, 4, 8


def best_time(fn, reps: int, trials: int = 3) -> float:
    """Best-of-`trials` mean seconds per call over `reps` calls (the machine is shared; the minimum is
    the least disturbed estimate)."""
    fn()  # warm-up
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def measure(context: int) -> dict:
    torch.manual_seed(0)
    enc = TransformerTrajEncoder(D_IN, D_MODEL, LAYERS, HEADS, context_len=context, max_time=10_000).eval()
    x_step = torch.randn(BATCH, D_IN)
    t_step = torch.full((BATCH,), context, dtype=torch.long)

    # A full cache, as after `context` steps of a rollout; every later step costs the same.
    state = enc.init_state(BATCH, "cpu")
    state.kv.normal_()  # keys and values
    state.count.fill_(context)

    x_ctx = torch.randn(BATCH, context, D_IN)
    t_ctx = torch.arange(context).repeat(BATCH, 1)

    def cached_step() -> None:
        enc.step(x_step, t_step, state)

    def recompute_step() -> None:
        enc(x_ctx, t_ctx)[:, -1]  # the whole window again, to act on its last timestep

    with torch.inference_mode():
        cached = best_time(cached_step, reps=max(20, 20_000 // context))
        long = context >= 2048
        recompute = best_time(recompute_step, reps=1 if long else 3, trials=2 if long else 3)
    return {"context": context, "cached_ms": cached * 1e3, "recompute_ms": recompute * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1 avoids oversubscription)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "acting_cost" / "acting_cost.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rows = [measure(c) for c in args.contexts]
    print(f"d_model {D_MODEL}, {LAYERS} layers, {HEADS} heads, batch {BATCH}, {args.threads} thread(s), CPU")
    print(f"{'context':>8} {'KV cache ms/step':>17} {'recompute ms/step':>18} {'speed-up':>9}")
    for r in rows:
        r["speedup"] = r["recompute_ms"] / r["cached_ms"]
        print(f"{r['context']:>8} {r['cached_ms']:>17.3f} {r['recompute_ms']:>18.1f} {r['speedup']:>8.0f}x")
    # Linear growth: the cached step is a fixed overhead plus a per-context-slot cost; the marginal
    # cost per slot between consecutive contexts stays flat, while recomputing's grows with W.
    for a, b in zip(rows[:-1], rows[1:]):
        dc = b["context"] - a["context"]
        cached_us = (b["cached_ms"] - a["cached_ms"]) * 1e3 / dc
        recompute_us = (b["recompute_ms"] - a["recompute_ms"]) * 1e3 / dc
        print(f"marginal cost per extra slot {a['context']}->{b['context']}: cache {cached_us:.3f} us, "
              f"recompute {recompute_us:.1f} us")  # fmt: skip
        b["marginal_us_per_slot_cached"], b["marginal_us_per_slot_recompute"] = cached_us, recompute_us

    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"d_model": D_MODEL, "layers": LAYERS, "heads": HEADS, "batch": BATCH, "threads": args.threads,
            "torch": torch.__version__, "machine": platform.processor() or platform.machine()}  # fmt: skip
    args.out.write_text(json.dumps({"config": meta, "results": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
