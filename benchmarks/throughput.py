"""End-to-end throughput of icrl's two hot loops, learner and acting, plus model FLOP utilisation.

(a) Learner: `Learner.update` on real `Batch`es sampled (make_loader) from a DiskReplay filled with
    synthetic T-Maze-like rollouts longer than the window. Agent for the T-Maze spaces with the library's
    heads (4 critics, 7 discounts, 2-layer MLPs of --head-hidden 256 units). `--dtype bf16` sets
    `OptimConfig.dtype="bf16"` (the library's autocast of the forward and losses), `--compile` sets
    `OptimConfig.compile`. Reports updates/s,
    a forward / backward / optimiser split and the peak memory of the timed updates (CPU: peak RSS above
    the RSS before them, VmHWM reset via /proc/self/clear_refs; CUDA: max_memory_allocated).
(b) Acting: env steps/s of the whole collection loop, `Collector.collect` with `AgentPolicy(greedy=False)`
    + `Exploration` on parallel Passive T-Mazes of corridor length = seq-len (so rollouts are long and the
    KV cache fills), split into policy / env / collector-bookkeeping time. For contrast, a policy that
    recomputes the whole context each step (`RecomputePolicy`, below: keeps every env's last seq-len
    timesteps and calls `agent(ts)` on them).
(c) MFU: FLOPs of one update counted with `torch.utils.flop_counter.FlopCounterMode` (matmuls, convs and
    SDPA; causal SDPA is counted as full) against the measured peak of a big `torch.mm` loop, fp32 and bf16.

    python benchmarks/throughput.py                         # the reference settings, fp32
    python benchmarks/throughput.py --dtype bf16 --threads 1 --profile

The LAST line printed is one JSON object (also written to benchmarks/results/throughput/throughput_<tag>.json).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import platform
import pstats
import resource
import statistics
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch

from icrl.agent.exploration import Exploration
from icrl.agent.learner import Learner
from icrl.agent.model import Agent, AgentPolicy
from icrl.config import ExperimentConfig, ExploreConfig, LossConfig, ModelConfig
from icrl.data import DiskReplay, make_loader
from icrl.envs import Collector, make_vector_env, make_wrapped_env
from icrl.nets.popart import ema_update_
from icrl.types import ActionSpec, Rollout, Timesteps

RESULTS = Path(__file__).parent / "results" / "throughput"


# ------------------------------------------------------------------------------------------------ helpers
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


SDPA_BACKEND = "default"  # --sdpa: which scaled_dot_product_attention kernel the learner may use


@contextmanager
def autocast_ctx(device: torch.device, dtype: str):
    """Pins the SDPA backend of the learner when --sdpa asks for one (an experiment: no library change
    needed). The precision is the library's now (`OptimConfig.dtype`), so `dtype` is unused here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"math": [SDPBackend.MATH], "flash": [SDPBackend.FLASH_ATTENTION],
                "efficient": [SDPBackend.EFFICIENT_ATTENTION]}  # fmt: skip
    kern = sdpa_kernel(backends[SDPA_BACKEND]) if SDPA_BACKEND in backends else nullcontext()
    with kern:
        yield


def _proc_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset VmHWM (peak RSS) to the current RSS (Linux >= 4.0). False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@contextmanager
def peak_memory(device: torch.device, out: dict):
    """Peak memory used by the block above what was held before it, in MiB, into out."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        yield
        torch.cuda.synchronize(device)
        out["peak_mem_mib"] = (torch.cuda.max_memory_allocated(device) - before) / 2**20
        out["peak_mem_total_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        out["peak_mem_method"] = "torch.cuda.max_memory_allocated - memory_allocated before"
        return
    reset = _reset_peak_rss()
    rss0 = _proc_status_kb("VmRSS")
    maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    yield
    if reset and rss0 is not None:
        hwm = _proc_status_kb("VmHWM")
        out["peak_mem_mib"] = (hwm - rss0) / 1024
        out["peak_mem_total_mib"] = hwm / 1024
        out["peak_mem_method"] = "VmHWM (reset before) - VmRSS before, /proc/self/status"
    else:
        maxrss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out["peak_mem_mib"] = (maxrss1 - maxrss0) / 1024  # 0 if the old peak was not exceeded
        out["peak_mem_total_mib"] = maxrss1 / 1024
        out["peak_mem_method"] = "ru_maxrss delta (a lower bound: the lifetime peak cannot be reset)"


def load_avg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# ------------------------------------------------------------------------------------------- data / agent
SPEC = ActionSpec("discrete", 4)


def synthetic_tmaze_rollout(T: int, rng: np.random.Generator) -> Rollout:
    """A T-Maze-like rollout of T actions (T + 1 timesteps): cue at t=0, corridor, junction at the end."""
    obs = np.zeros((T + 1, 4), np.float32)  # [cue_up, cue_down, in_corridor, at_junction]
    obs[0, rng.integers(2)] = 1.0
    obs[:-1, 2] = 1.0
    obs[-1, 3] = 1.0
    action = rng.integers(4, size=T)
    reward = np.where(action == 3, 0.0, -1.0 / T).astype(np.float32)
    reward[-1] = float(rng.integers(2))
    prev_action = np.zeros((T + 1, 4), np.float32)
    prev_action[1:] = SPEC.to_vector(action)
    reset = np.zeros(T + 1, bool)
    reset[0] = True
    terminated = np.zeros(T, bool)
    terminated[-1] = True
    return Rollout(
        obs={"obs": obs},
        prev_action=prev_action,
        prev_reward=np.concatenate([[0.0], reward]).astype(np.float32),
        time=np.arange(T + 1, dtype=np.int64),
        reset=reset,
        action=action.astype(np.int64),
        reward=reward,
        terminated=terminated,
        truncated=np.zeros(T, bool),
    )


def build(args: argparse.Namespace, device: torch.device):
    """Config, agent (T-Maze spaces), learner."""
    cfg = ExperimentConfig(
        model=ModelConfig(
            traj_encoder=args.traj_encoder,
            d_model=args.d_model,
            layers=args.layers,
            heads=args.heads,
            max_seq_len=args.seq_len,
            head_hidden=args.head_hidden,
        ),
        loss=LossConfig(),  # library defaults: 4 critics, 7 discounts
    ).replace(batch_size=args.batch_size, seed=0, threads=args.threads, dtype=args.dtype, compile=args.compile)
    env = make_wrapped_env("tmaze", {"length": args.seq_len})
    spec = ActionSpec.from_space(env.action_space)
    torch.manual_seed(0)
    agent = Agent(env.observation_space["obs"], spec, cfg.model, cfg.loss).to(device)
    env.close()
    return cfg, spec, agent, Learner(agent, cfg, device)


# ----------------------------------------------------------------------------------------------- learner
def update_with_breakdown(learner: Learner, batch, device: torch.device) -> dict[str, float]:
    """`Learner.update`'s steps with timers between them (same calls, same order as icrl/agent/learner.py)."""
    agent, cfg = learner.agent, learner.cfg
    sync(device)
    t0 = time.perf_counter()
    agent.train()
    batch = batch.to(device, non_blocking=True)
    agent.tstep_encoder.update_normalization(batch.inputs, batch.mask)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=learner.autocast_enabled):
        loss, metrics, y, valid = learner.compute_loss(agent, batch, cfg.loss, learner.generator)
    sync(device)
    t1 = time.perf_counter()
    learner.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    sync(device)
    t2 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(agent.online_parameters(), cfg.optim.grad_clip)
    learner.optimizer.step()
    learner.scheduler.step()
    with torch.no_grad():
        agent.popart.update_(y, valid, [agent.critic, agent.target_critic])
        ema_update_(agent.target_actor, agent.actor, cfg.loss.tau)
        ema_update_(agent.target_critic, agent.critic, cfg.loss.tau)
    agent.refresh_acting_weights()
    learner.updates += 1
    sync(device)
    t3 = time.perf_counter()
    return {"forward_s": t1 - t0, "backward_s": t2 - t1, "optim_s": t3 - t2}


def bench_learner(args, cfg, spec, agent, learner, device, tmp: Path) -> tuple[dict, list]:
    rng = np.random.default_rng(0)
    replay = DiskReplay(tmp / "replay", capacity_timesteps=10**9)
    for _ in range(args.num_rollouts):
        replay.write(synthetic_tmaze_rollout(int(args.seq_len + rng.integers(0, args.seq_len + 1)), rng))
    loader = make_loader(
        replay.root, batch_size=args.batch_size, max_seq_len=args.seq_len, action_spec=spec, seed=0, num_workers=0
    )
    n_batches = args.warmup + args.updates + 2 * args.breakdown_updates + 2
    t0 = time.perf_counter()
    batches = [next(loader) for _ in range(n_batches)]  # sampled up front: the loop times the learner alone
    sample_s = (time.perf_counter() - t0) / n_batches
    loader.close()
    it = iter(batches)

    out: dict = {"sample_ms_per_batch": sample_s * 1e3}
    ok, err = True, None
    try:
        with autocast_ctx(device, args.dtype):
            for _ in range(args.warmup):
                m = learner.update(next(it))
            sync(device)
            times = []
            with peak_memory(device, out):
                for _ in range(args.updates):
                    b = next(it)
                    sync(device)
                    t = time.perf_counter()
                    m = learner.update(b)
                    sync(device)
                    times.append(time.perf_counter() - t)
            loss = float(m["loss"])
            ok = math.isfinite(loss)
            parts = [update_with_breakdown(learner, next(it), device) for _ in range(args.breakdown_updates)]
    except Exception as e:  # noqa: BLE001 - report, do not crash: "does bf16 autocast work?" is a result
        ok, err, times, parts, loss = False, f"{type(e).__name__}: {e}", [], [], float("nan")
    if times:
        out.update(
            learner_s_per_update_mean=statistics.fmean(times),
            learner_s_per_update_median=statistics.median(times),
            learner_s_per_update_min=min(times),
            learner_updates_per_s=len(times) / sum(times),
        )
    if parts:
        out["learner_breakdown_s"] = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
    out.update(learner_ok=ok, learner_error=err, final_loss=loss)
    return out, list(it)


def count_update_flops(learner: Learner, batch, device: torch.device, dtype: str) -> dict:
    from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop, sdpa_flop

    aten = torch.ops.aten
    # torch 2.x has no formula for the CPU flash-attention ops: count them like the CUDA ones (full, not
    # causal-halved, attention; both bmm's of the forward, the five of the backward).
    custom = {}
    for name, fn in [("_scaled_dot_product_flash_attention_for_cpu", sdpa_flop),
                     ("_scaled_dot_product_flash_attention_for_cpu_backward", sdpa_backward_flop)]:  # fmt: skip
        if hasattr(aten, name):
            custom[getattr(aten, name)] = getattr(fn, "__wrapped__", fn)  # the registry holds shape-wrapped ones
    counter = FlopCounterMode(display=False, custom_mapping=custom)
    with autocast_ctx(device, dtype), counter:
        learner.update(batch)
    by_op: dict[str, int] = {}
    for module_counts in [counter.get_flop_counts().get("Global", {})]:
        for op, n in module_counts.items():
            by_op[str(op)] = int(n)
    by_module = {}  # top-level submodules the loss calls (traj/tstep encoder, critic, target critic, ...)
    for mod, counts in counter.get_flop_counts().items():
        if mod != "Global" and mod.count(".") <= 1:
            by_module[mod] = int(sum(counts.values()))
    return {"flops_per_update": int(counter.get_total_flops()), "flops_by_op": by_op, "flops_by_module": by_module}


def matmul_peak(dtype: torch.dtype, device: torch.device, n: int, seconds: float) -> float:
    """Best FLOP/s of an n x n x n torch.mm, over ~`seconds` of repetitions."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    torch.mm(a, b, out=c)
    sync(device)
    best, spent = 0.0, 0.0
    while spent < seconds:
        t = time.perf_counter()
        torch.mm(a, b, out=c)
        sync(device)
        dt = time.perf_counter() - t
        spent += dt
        best = max(best, 2 * n**3 / dt)
    return best


def model_gemm_rate(dtype: torch.dtype, device: torch.device, m: int, k: int, n: int, seconds: float) -> float:
    """FLOP/s of a model-shaped GEMM [m, k] @ [k, n] (e.g. B*L tokens through a d x 4d layer)."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    torch.mm(a, b)
    best, spent = 0.0, 0.0
    while spent < seconds:
        sync(device)
        t = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        dt = time.perf_counter() - t
        spent += dt
        best = max(best, 2 * m * k * n / dt)
    return best


# ------------------------------------------------------------------------------------------------ acting
class RecomputePolicy:
    """Contrast to the KV cache: keep every env's last W timesteps and run `agent(ts)` over all of them
    for every action (right-padded to the longest history; the encoder is causal, so padding after a
    row's last real timestep cannot change that timestep's state). Exploration as in AgentPolicy."""

    def __init__(self, agent: Agent, num_envs: int, window: int, exploration, env_steps, device):
        self.agent, self.W, self.exploration, self.env_steps = agent, window, exploration, env_steps
        self.device = torch.device(device)
        self.hist: Timesteps | None = None
        self.len = torch.zeros(num_envs, dtype=torch.long)
        self.rows = torch.arange(num_envs)

    def _push(self, ts: Timesteps) -> None:
        if self.hist is None:
            def z(x):
                return torch.zeros((x.shape[0], self.W, *x.shape[2:]), dtype=x.dtype, device=self.device)

            self.hist = Timesteps(
                obs={k: z(v) for k, v in ts.obs.items()},
                prev_action=z(ts.prev_action), prev_reward=z(ts.prev_reward), time=z(ts.time), reset=z(ts.reset),
            )  # fmt: skip
        full = self.len >= self.W
        h = self.hist
        leaves = [*h.obs.values(), h.prev_action, h.prev_reward, h.time, h.reset]
        new = [*ts.obs.values(), ts.prev_action, ts.prev_reward, ts.time, ts.reset]
        if bool(full.any()):  # slide the window of full rows by one
            for x in leaves:
                x[full] = torch.roll(x[full], -1, dims=1)
        pos = self.len.clamp(max=self.W - 1)
        for x, v in zip(leaves, new):
            x[self.rows, pos] = v[:, 0].to(x.dtype)
        self.len = (self.len + 1).clamp(max=self.W)

    @torch.inference_mode()
    def act(self, ts: Timesteps, new_rollout: np.ndarray) -> np.ndarray:
        agent = self.agent
        if agent.training:  # the same mode contract as AgentPolicy: eval while acting, the learner restores
            agent.eval()
        if new_rollout.any():
            self.len[torch.as_tensor(new_rollout)] = 0
            if self.exploration is not None:
                self.exploration.new_rollouts(new_rollout)
        ts = ts.to(self.device)
        self._push(ts)
        n = int(self.len.max())
        h = self.hist
        window = Timesteps(
            obs={k: v[:, :n] for k, v in h.obs.items()},
            prev_action=h.prev_action[:, :n], prev_reward=h.prev_reward[:, :n], time=h.time[:, :n],
            reset=h.reset[:, :n],
        )  # fmt: skip
        s = agent(window)[self.rows, self.len - 1]  # [N, d]: each env's latest state
        a_vec = agent.actor.policy(s).sample()  # [N, A]
        actions = agent.spec.from_vector(a_vec.float().cpu().numpy())
        if self.exploration is not None:
            actions = self.exploration(actions, self.env_steps(), ts.time[:, 0].cpu().numpy())
        return actions


class TimedPolicy:
    def __init__(self, policy):
        self.policy, self.seconds = policy, 0.0

    def act(self, ts, new_rollout):
        t = time.perf_counter()
        out = self.policy.act(ts, new_rollout)
        self.seconds += time.perf_counter() - t
        return out


def bench_acting(args, cfg, spec, agent, device, recompute: bool, steps: int, profile: bool = False) -> dict:
    venv = make_vector_env("tmaze", {"length": args.seq_len}, args.parallel_envs)
    collector = Collector(venv, spec, seed=0)
    exploration = Exploration(ExploreConfig(), spec, args.parallel_envs, seed=0)
    env_steps = lambda: collector.total_env_steps  # noqa: E731
    if recompute:
        inner = RecomputePolicy(agent, args.parallel_envs, args.seq_len, exploration, env_steps, device)
    else:
        inner = AgentPolicy(agent, args.parallel_envs, greedy=False, exploration=exploration, env_steps=env_steps,
                            device=device)  # fmt: skip
    policy = TimedPolicy(inner)
    step_s = [0.0]
    raw_step = venv.step

    def timed_step(actions):
        t = time.perf_counter()
        out = raw_step(actions)
        step_s[0] += time.perf_counter() - t
        return out

    venv.step = timed_step  # instance attribute: the collector calls self.venv.step
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if args.act_dtype == "bf16" else nullcontext()
    with ctx:
        collector.collect(policy, 4 * args.parallel_envs)  # warm-up (hard reset, first allocations)
        policy.seconds, step_s[0] = 0.0, 0.0
        start_steps = collector.total_env_steps
        prof = cProfile.Profile() if profile else None
        t = time.perf_counter()
        if prof:
            prof.enable()
        rollouts, _ = collector.collect(policy, steps)
        if prof:
            prof.disable()
        dt = time.perf_counter() - t
    taken = collector.total_env_steps - start_steps
    venv.close()
    out = {
        "env_steps": taken,
        "seconds": dt,
        "env_steps_per_s": taken / dt,
        "rollouts_finished": len(rollouts),
        "mean_rollout_len": float(np.mean([r.num_timesteps - 1 for r in rollouts])) if rollouts else None,
        "frac_policy": policy.seconds / dt,
        "frac_env_step": step_s[0] / dt,
        "frac_collector": max(0.0, 1 - (policy.seconds + step_s[0]) / dt),
        "us_per_vector_step": {
            "policy": 1e6 * policy.seconds / (taken / args.parallel_envs),
            "env_step": 1e6 * step_s[0] / (taken / args.parallel_envs),
            "collector": 1e6 * max(0.0, dt - policy.seconds - step_s[0]) / (taken / args.parallel_envs),
        },
    }
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        out["_cprofile"] = s.getvalue()
    return out


def torch_profile_update(learner: Learner, batch, device, dtype: str, rows: int = 25) -> str:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with autocast_ctx(device, dtype), profile(activities=acts) as prof:
        learner.update(batch)
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


# -------------------------------------------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-hidden", type=int, default=256, help="actor / critic MLP width (256: the reference "
                   "settings of the first measurements; the library default is now smaller)")  # fmt: skip
    p.add_argument("--traj-encoder", default="transformer", choices=["transformer", "gru", "lstm", "ff"])
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--seq-len", type=int, default=256, help="training window = acting context = T-Maze corridor")
    p.add_argument("--parallel-envs", type=int, default=8)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--act-threads", type=int, default=None, help="torch threads while acting (default: --threads)")
    p.add_argument("--updates", type=int, default=10, help="timed learner updates")
    p.add_argument("--warmup", type=int, default=2, help="untimed learner updates first")
    p.add_argument("--breakdown-updates", type=int, default=2, help="extra updates timed part by part")
    p.add_argument("--num-rollouts", type=int, default=64, help="synthetic rollouts in the replay")
    p.add_argument("--act-steps", type=int, default=2000, help="timed env steps (all envs) of acting")
    p.add_argument("--recompute-steps", type=int, default=None, help="env steps of the recompute contrast "
                   "(default: --act-steps; 0 skips it)")  # fmt: skip
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="learner update precision")
    p.add_argument("--act-dtype", choices=["fp32", "bf16"], default="fp32", help="acting precision (autocast)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    p.add_argument("--sdpa", default="default", choices=["default", "math", "flash", "efficient"],
                   help="pin the attention kernel of the learner update (experiment)")
    p.add_argument("--peak-n", type=int, default=2048, help="matrix side of the peak-FLOP/s mm loop")
    p.add_argument("--peak-seconds", type=float, default=1.5)
    p.add_argument("--compile", action="store_true", help="OptimConfig.compile: torch.compile the loss computation")
    p.add_argument("--skip-learner", action="store_true")
    p.add_argument("--skip-acting", action="store_true")
    p.add_argument("--profile", action="store_true", help="print cProfile (acting) and torch.profiler (update) tops")
    p.add_argument("--tag", default=None, help="results/throughput/throughput_<tag>.json (default: from the settings)")
    args = p.parse_args()

    global SDPA_BACKEND
    SDPA_BACKEND = args.sdpa
    torch.set_num_threads(args.threads)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    tag = args.tag or (
        f"{device.type}_{args.traj_encoder}_d{args.d_model}_l{args.layers}_h{args.heads}_b{args.batch_size}x"
        f"{args.seq_len}_e{args.parallel_envs}_t{args.threads}"
        + ("" if args.act_threads in (None, args.threads) else f"_at{args.act_threads}")
        + f"_{args.dtype}"
        + ("" if args.sdpa == "default" else f"_sdpa-{args.sdpa}")
        + ("_compiled" if args.compile else "")
    )
    result: dict = {
        "tag": tag,
        "settings": {k: v for k, v in vars(args).items()},
        "device": str(device),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "nproc": os.cpu_count(),
        "load_avg_start": load_avg(),
    }
    cfg, spec, agent, learner = build(args, device)
    result["parameters_online"] = sum(p.numel() for p in agent.online_parameters())
    result["parameters_total"] = sum(p.numel() for p in agent.parameters())
    profile_text = []

    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_learner:
            lr, spare = bench_learner(args, cfg, spec, agent, learner, device, Path(tmp))
            result.update(lr)
            print(f"learner [{args.dtype}]: " + (
                f"{lr['learner_updates_per_s']:.3f} updates/s ({lr['learner_s_per_update_mean']:.3f} s mean, "
                f"{lr['learner_s_per_update_min']:.3f} s min), peak mem +{lr.get('peak_mem_mib', float('nan')):.0f} MiB, "
                f"breakdown {json.dumps({k: round(v, 3) for k, v in lr.get('learner_breakdown_s', {}).items()})}"
                if lr.get("learner_updates_per_s") else f"FAILED: {lr['learner_error']}"), flush=True)  # fmt: skip
            if lr["learner_ok"] and spare:
                fl = count_update_flops(learner, spare[0], device, args.dtype)
                result.update(fl)
                tdt = {"fp32": torch.float32, "bf16": torch.bfloat16}
                peaks = {k: matmul_peak(v, device, args.peak_n, args.peak_seconds) for k, v in tdt.items()}
                result["matmul_peak_flops"] = peaks
                d = args.d_model
                result["model_gemm_flops"] = {  # B*L tokens through the d -> 4d MLP layer
                    k: model_gemm_rate(v, device, args.batch_size * args.seq_len, d, 4 * d, 0.5)
                    for k, v in tdt.items()
                }
                achieved = fl["flops_per_update"] * result["learner_updates_per_s"]
                result["achieved_flops"] = achieved
                result["mfu"] = achieved / peaks[args.dtype]
                result["mfu_vs_fp32_peak"] = achieved / peaks["fp32"]
                result["mfu_vs_bf16_peak"] = achieved / peaks["bf16"]
                print(f"flops/update {fl['flops_per_update'] / 1e9:.1f} GFLOP, achieved {achieved / 1e9:.1f} GFLOP/s; "
                      f"mm peak fp32 {peaks['fp32'] / 1e9:.0f}, bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s; "
                      f"MFU {100 * result['mfu']:.1f}% of the {args.dtype} peak", flush=True)  # fmt: skip
                if args.profile:
                    profile_text.append("== torch.profiler, one learner update ==\n"
                                        + torch_profile_update(learner, spare[1], device, args.dtype))  # fmt: skip

        if not args.skip_acting:
            torch.set_num_threads(args.act_threads or args.threads)
            result["act_threads"] = torch.get_num_threads()
            kv = bench_acting(args, cfg, spec, agent, device, recompute=False, steps=args.act_steps,
                              profile=False)  # fmt: skip
            result["act_env_steps_per_s"] = kv["env_steps_per_s"]
            result["acting_kv"] = kv
            print(f"acting (KV cache, {args.parallel_envs} envs): {kv['env_steps_per_s']:.0f} env steps/s; "
                  f"policy {100 * kv['frac_policy']:.0f}%, env {100 * kv['frac_env_step']:.0f}%, "
                  f"collector {100 * kv['frac_collector']:.0f}%; us/vector step {json.dumps({k: round(v) for k, v in kv['us_per_vector_step'].items()})}",
                  flush=True)  # fmt: skip
            rsteps = args.act_steps if args.recompute_steps is None else args.recompute_steps
            if rsteps > 0:
                rc = bench_acting(args, cfg, spec, agent, device, recompute=True, steps=rsteps)
                result["act_recompute_env_steps_per_s"] = rc["env_steps_per_s"]
                result["acting_recompute"] = rc
                print(f"acting (recompute whole context): {rc['env_steps_per_s']:.0f} env steps/s "
                      f"(KV cache is {kv['env_steps_per_s'] / rc['env_steps_per_s']:.1f}x faster)", flush=True)  # fmt: skip
            if args.profile:
                prof = bench_acting(args, cfg, spec, agent, device, recompute=False, steps=args.act_steps, profile=True)
                profile_text.append("== cProfile, acting loop (KV cache), by tottime ==\n" + prof.pop("_cprofile"))

    result.setdefault("learner_updates_per_s", None)
    result.setdefault("act_env_steps_per_s", None)
    result["load_avg_end"] = load_avg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if profile_text:
        (RESULTS / f"throughput_{tag}_profile.txt").write_text("\n\n".join(profile_text))
        print("\n\n".join(profile_text))
    (RESULTS / f"throughput_{tag}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
