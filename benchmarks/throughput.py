"""End-to-end throughput of icrl's two hot loops, learner and acting, plus model FLOP utilisation.

(a) Learner: `Learner.update` on real `Batch`es sampled (make_loader) from a DiskReplay filled with
    synthetic T-Maze-like rollouts longer than the window. Agent for the T-Maze spaces with the library's
    heads (4 critics, 7 discounts, 2-layer MLPs of --head-hidden 256 units). `--dtype bf16` sets
    `OptimConfig.dtype="bf16"` (the library's autocast of the forward and losses); `OptimConfig.compile` is
    always set explicitly (`--compile`: True, else False; never the library's automatic None). Reports
    updates/s, a forward / backward / optimiser split and the peak memory of the timed updates (CPU: peak RSS
    above the RSS before them, VmHWM reset via /proc/self/clear_refs after malloc_trim; CUDA:
    max_memory_allocated).
(b) Acting: env steps/s of the whole collection loop, `Collector.collect` with `AgentPolicy(greedy=False)`
    + `Exploration` on parallel Passive T-Mazes of corridor length = seq-len (so rollouts are long and the
    KV cache fills), split into policy / env / collector-bookkeeping time. For contrast, a policy that
    recomputes the whole context each step (`RecomputePolicy`, below: keeps every env's last seq-len
    timesteps and calls `agent(ts)` on them).
(c) MFU: FLOPs of one update counted with `torch.utils.flop_counter.FlopCounterMode` (matmuls, convs and
    SDPA; causal SDPA is counted as full) against the measured peak of a big `torch.mm` loop, fp32 and bf16
    (both measured at the run's thread count).

One shape (the reference settings cited in docs/results.md):

    python benchmarks/throughput.py                         # d128 x 256, batch 24, fp32, 2 threads
    python benchmarks/throughput.py --dtype bf16 --threads 1 --profile

Sweeps: any of --preset / --shapes / --seq-lens / --d-models / --dtypes / --compile-modes / --envs runs every
combination in one invocation. Learner cells are d_model x context x dtype x compile (first-call seconds,
i.e. compiling where on, reported apart from the median of the later calls; GFLOP/s and MFU against both
measured peaks), acting cells are d_model x context x envs (one whole rollout per env by default). A cell
whose memory estimate exceeds --mem-fraction of MemAvailable or whose time estimate exceeds
--max-cell-seconds (after trimming its timed updates) is skipped and recorded as such, as are the longer
contexts of its line. `--dry-run` prints the cells and estimates only.

    python benchmarks/throughput.py --preset issue18                     # issue 18's reference shapes
    python benchmarks/throughput.py --preset issue18 --dry-run           # its plan and runtime estimate
    python benchmarks/throughput.py --seq-lens 256 512 1024 2048 4096 --dtypes fp32 bf16 --compile-modes off on \
        --envs 8 32 128 --updates 5 --breakdown-updates 1 --max-seconds 2400   # context sweep at d128, batch 24

`--preset issue18` = `--shapes 128x256 64x501 64x1001 --dtypes fp32 bf16 --compile-modes off on --envs 8 32 128
--batch-size 24 --layers 2 --heads 4 --head-hidden 256 --threads 2 --updates 5 --warmup 2 --breakdown-updates 1
--max-cell-seconds 150 --max-seconds 1200` (explicit flags override it).

The LAST line printed is one JSON object (also written to benchmarks/results/throughput/throughput_<tag>.json;
a sweep also writes throughput_<tag>.md, the table it prints, and throughput_<tag>.png).
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import functools
import gc
import io
import itertools
import json
import math
import os
import platform
import pstats
import resource
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch

from icrl.agent.exploration import Exploration
from icrl.agent.learner import Learner
from icrl.agent.learner import compute_loss as eager_compute_loss
from icrl.agent.losses import redq_members
from icrl.agent.model import Agent, AgentPolicy
from icrl.config import ExperimentConfig, ExploreConfig, LossConfig, ModelConfig, resolve
from icrl.data import DiskReplay, make_loader
from icrl.envs import Collector, make_vector_env, make_wrapped_env
from icrl.nets.ema import ema_update_
from icrl.types import ActionSpec, Rollout, Timesteps

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repo root, for `from benchmarks import`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import throughput_plan as plan  # noqa: E402

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


def trim_heap() -> None:
    """Return freed heap memory to the OS (glibc malloc_trim), so a peak measured as VmHWM above the RSS
    before a block counts what the block allocates rather than hiding it in memory freed earlier."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def mem_available_mib(device: torch.device) -> float:
    """MemAvailable (CPU, /proc/meminfo) or the free memory of the CUDA device, in MiB."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] / 2**20
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("inf")


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
    ).replace(batch_size=args.batch_size, seed=0, threads=args.threads, dtype=args.dtype, compile=bool(args.compile))
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
    members = redq_members(agent.target_critic.num_critics, cfg.loss.redq_subset, learner.generator)
    agent.tstep_encoder.update_normalization(batch.inputs, batch.mask)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=learner.autocast_enabled):
        loss, metrics, y, valid = learner.compute_loss(agent, batch, cfg.loss, members=members)
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


def sample_batches(args, spec, tmp: Path, n_batches: int) -> tuple[list, float]:
    """n_batches real `Batch`es of args.batch_size x args.seq_len from a DiskReplay of synthetic T-Maze
    rollouts longer than the window, sampled up front (the loops time the learner alone), and the seconds
    per batch the sampling took."""
    rng = np.random.default_rng(0)
    replay = DiskReplay(tmp / f"replay_{args.seq_len}", capacity_timesteps=10**9)
    for _ in range(args.num_rollouts):
        replay.write(synthetic_tmaze_rollout(int(args.seq_len + rng.integers(0, args.seq_len + 1)), rng))
    loader = make_loader(
        replay.root, batch_size=args.batch_size, max_seq_len=args.seq_len, action_spec=spec, seed=0, num_workers=0
    )
    t0 = time.perf_counter()
    batches = [next(loader) for _ in range(n_batches)]
    sample_s = (time.perf_counter() - t0) / n_batches
    loader.close()
    return batches, sample_s


def bench_learner(args, cfg, spec, agent, learner, device, tmp: Path) -> tuple[dict, list]:
    batches, sample_s = sample_batches(args, spec, tmp, args.warmup + args.updates + 2 * args.breakdown_updates + 2)
    it = iter(batches)

    out: dict = {"sample_ms_per_batch": sample_s * 1e3}
    ok, err = True, None
    try:
        with autocast_ctx(device, args.dtype):
            for _ in range(args.warmup):
                m = learner.update(next(it))
            sync(device)
            with peak_memory(device, out):
                times, m = timed_updates(learner, it, args.updates, device, budget_s=math.inf)
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
    compiled = learner.loss_module.compute_loss
    learner.loss_module.compute_loss = eager_compute_loss  # inductor's kernels are no aten ops to count
    try:
        with autocast_ctx(device, dtype), counter:  # the update's step run eagerly: a replay dispatches no op
            learner._step(batch.to(device, learner_only=True))
    finally:
        learner.loss_module.compute_loss = compiled
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
    venv = make_vector_env("tmaze", {"length": args.seq_len}, args.parallel_envs, native=args.env_impl == "batched")
    collector = Collector(venv, spec, seed=0)
    explore = resolve(ExperimentConfig(explore=ExploreConfig(eps_anneal_steps=100_000))).explore  # as measured before
    exploration = Exploration(explore, spec, args.parallel_envs, seed=0)
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


# ---------------------------------------------------------------------------------------- one shape (a-c)
def single_tag(args, device: torch.device) -> str:
    return args.tag or (
        f"{device.type}_{args.traj_encoder}_d{args.d_model}_l{args.layers}_h{args.heads}_b{args.batch_size}x"
        f"{args.seq_len}_e{args.parallel_envs}_t{args.threads}"
        + ("" if args.act_threads in (None, args.threads) else f"_at{args.act_threads}")
        + f"_{args.dtype}"
        + ("" if args.sdpa == "default" else f"_sdpa-{args.sdpa}")
        + ("_compiled" if args.compile else "")
    )


def machine_info(args, device: torch.device, tag: str) -> dict:
    return {
        "tag": tag,
        "settings": {k: v for k, v in vars(args).items()},
        "device": str(device),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "nproc": os.cpu_count(),
        "load_avg_start": load_avg(),
    }


def measure_peaks(device: torch.device, n: int, seconds: float) -> dict[str, float]:
    """Best torch.mm FLOP/s, fp32 and bf16, at the current thread count."""
    return {k: matmul_peak(v, device, n, seconds) for k, v in {"fp32": torch.float32, "bf16": torch.bfloat16}.items()}


def single_mfu(args, result: dict, learner, batch, device) -> None:
    fl = count_update_flops(learner, batch, device, args.dtype)
    result.update(fl)
    peaks = measure_peaks(device, args.peak_n, args.peak_seconds)
    result["matmul_peak_flops"] = peaks
    d = args.d_model
    result["model_gemm_flops"] = {  # B*L tokens through the d -> 4d MLP layer
        k: model_gemm_rate(v, device, args.batch_size * args.seq_len, d, 4 * d, 0.5)
        for k, v in {"fp32": torch.float32, "bf16": torch.bfloat16}.items()
    }
    achieved = fl["flops_per_update"] * result["learner_updates_per_s"]
    result["achieved_flops"] = achieved
    result["mfu"] = achieved / peaks[args.dtype]
    result["mfu_vs_fp32_peak"] = achieved / peaks["fp32"]
    result["mfu_vs_bf16_peak"] = achieved / peaks["bf16"]
    print(f"flops/update {fl['flops_per_update'] / 1e9:.1f} GFLOP, achieved {achieved / 1e9:.1f} GFLOP/s; "
          f"mm peak fp32 {peaks['fp32'] / 1e9:.0f}, bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s; "
          f"MFU {100 * result['mfu']:.1f}% of the {args.dtype} peak", flush=True)  # fmt: skip


def single_learner(args, result, built, device, tmp: Path, profile_text: list) -> None:
    cfg, spec, agent, learner = built
    lr, spare = bench_learner(args, cfg, spec, agent, learner, device, tmp)
    result.update(lr)
    print(f"learner [{args.dtype}]: " + (
        f"{lr['learner_updates_per_s']:.3f} updates/s ({lr['learner_s_per_update_mean']:.3f} s mean, "
        f"{lr['learner_s_per_update_min']:.3f} s min), peak mem +{lr.get('peak_mem_mib', float('nan')):.0f} MiB, "
        f"breakdown {json.dumps({k: round(v, 3) for k, v in lr.get('learner_breakdown_s', {}).items()})}"
        if lr.get("learner_updates_per_s") else f"FAILED: {lr['learner_error']}"), flush=True)  # fmt: skip
    if lr["learner_ok"] and spare:
        single_mfu(args, result, learner, spare[0], device)
        if args.profile:
            profile_text.append("== torch.profiler, one learner update ==\n"
                                + torch_profile_update(learner, spare[1], device, args.dtype))  # fmt: skip


def single_acting(args, result, built, device, profile_text: list) -> None:
    cfg, spec, agent, _ = built
    torch.set_num_threads(args.act_threads or args.threads)
    result["act_threads"] = torch.get_num_threads()
    steps = 2000 if args.act_steps is None else args.act_steps
    kv = bench_acting(args, cfg, spec, agent, device, recompute=False, steps=steps, profile=False)
    result["act_env_steps_per_s"] = kv["env_steps_per_s"]
    result["acting_kv"] = kv
    print(f"acting (KV cache, {args.parallel_envs} envs): {kv['env_steps_per_s']:.0f} env steps/s; "
          f"policy {100 * kv['frac_policy']:.0f}%, env {100 * kv['frac_env_step']:.0f}%, "
          f"collector {100 * kv['frac_collector']:.0f}%; "
          f"us/vector step {json.dumps({k: round(v) for k, v in kv['us_per_vector_step'].items()})}",
          flush=True)  # fmt: skip
    rsteps = steps if args.recompute_steps is None else args.recompute_steps
    if rsteps > 0:
        rc = bench_acting(args, cfg, spec, agent, device, recompute=True, steps=rsteps)
        result["act_recompute_env_steps_per_s"] = rc["env_steps_per_s"]
        result["acting_recompute"] = rc
        print(f"acting (recompute whole context): {rc['env_steps_per_s']:.0f} env steps/s "
              f"(KV cache is {kv['env_steps_per_s'] / rc['env_steps_per_s']:.1f}x faster)", flush=True)  # fmt: skip
    if args.profile:
        prof = bench_acting(args, cfg, spec, agent, device, recompute=False, steps=steps, profile=True)
        profile_text.append("== cProfile, acting loop (KV cache), by tottime ==\n" + prof.pop("_cprofile"))


def run_single(args, device: torch.device) -> None:
    """The one-shape measurement (a)-(c) of the module docstring; the JSON as the last line."""
    tag = single_tag(args, device)
    result = machine_info(args, device, tag)
    built = build(args, device)
    result["parameters_online"] = sum(p.numel() for p in built[2].online_parameters())
    result["parameters_total"] = sum(p.numel() for p in built[2].parameters())
    profile_text: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_learner:
            single_learner(args, result, built, device, Path(tmp), profile_text)
        if not args.skip_acting:
            single_acting(args, result, built, device, profile_text)
    result.setdefault("learner_updates_per_s", None)
    result.setdefault("act_env_steps_per_s", None)
    result["load_avg_end"] = load_avg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if profile_text:
        (RESULTS / f"throughput_{tag}_profile.txt").write_text("\n\n".join(profile_text))
        print("\n\n".join(profile_text))
    (RESULTS / f"throughput_{tag}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


# ------------------------------------------------------------------------------------------------ sweeps
class Calibration:
    """What the cells measured so far tell the estimates of the next ones: the measured / analytic ratio of
    steady-state peak memory (the largest seen of the dtype, else of any; 1 before any), the analytic-FLOP
    rate of the last cell of each (dtype, compile) (else the slowest seen, else `prior_eff` of the fp32 mm
    peak), the compile time of the last compiled cell, and the measured / prior ratio of acting's time."""

    def __init__(self, peaks: dict[str, float], net: plan.Net, sdpa: str, prior_eff: float = 0.25,
                 compile_s: float = 60.0) -> None:  # fmt: skip
        self.net, self.sdpa, self.prior = net, sdpa, prior_eff * peaks["fp32"]
        self.mem_ratio: dict[str, float] = {}
        self.rate: dict[tuple[str, bool], float] = {}
        self.compile_s = compile_s
        self.act_ratio: float | None = None

    def seconds_per_update(self, cell: dict) -> float:
        rate = self.rate.get((cell["dtype"], cell["compile"])) or (min(self.rate.values()) if self.rate else self.prior)
        return plan.update_flops(cell["d_model"], cell["seq_len"], self.net) / rate

    def mib(self, cell: dict) -> float:
        est = plan.update_mib(cell["d_model"], cell["seq_len"], self.net, cell["dtype"], self.sdpa)
        return est * self.mem_ratio.get(cell["dtype"], max(self.mem_ratio.values(), default=1.0))

    def learn(self, cell: dict, out: dict) -> None:
        if out.get("status") != "ok":
            return
        self.rate[(cell["dtype"], cell["compile"])] = (
            plan.update_flops(cell["d_model"], cell["seq_len"], self.net) / out["s_per_update_median"])
        if (out.get("peak_mib") or 0.0) > 0:  # steady state: the first call holds one-off allocations too
            est = plan.update_mib(cell["d_model"], cell["seq_len"], self.net, cell["dtype"], self.sdpa)
            self.mem_ratio[cell["dtype"]] = max(self.mem_ratio.get(cell["dtype"], 0.0), out["peak_mib"] / est)
        if cell["compile"] and out.get("compiled"):
            self.compile_s = max(0.0, out["first_call_s"] - out["s_per_update_median"])


def cell_args(args, **over) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **over})


def cell_plan(args, cell: dict, calib: Calibration, device, stopped: dict, left_s: float = math.inf
              ) -> tuple[tuple[int, int] | None, str]:  # fmt: skip
    """(timed updates, warm-up) for a learner cell, or None and why it is skipped: a shorter context of the
    same d_model x dtype x compile was skipped, its memory estimate is over --mem-fraction of what is
    available, or its time estimate is over --max-cell-seconds (or the left_s seconds left of --max-seconds)
    even with fewer updates."""
    key = (cell["d_model"], cell["dtype"], cell["compile"])
    if key in stopped and stopped[key] <= cell["seq_len"]:
        return None, f"skipped: context {stopped[key]} of this line was skipped"
    est_mib, avail = calib.mib(cell), mem_available_mib(device)
    if est_mib > args.mem_fraction * avail:
        return None, (f"skipped: over {est_mib / 1024:.3g} GiB estimate "
                      f"({100 * args.mem_fraction:.3g}% of {avail / 1024:.1f} GiB available)")  # fmt: skip
    est_s = calib.seconds_per_update(cell)
    extra = calib.compile_s if cell["compile"] else 0.0
    budget = min(args.max_cell_seconds, left_s)
    p = plan.plan_updates(est_s, args.updates, args.warmup, args.breakdown_updates, budget, extra)
    if p is None:
        if budget < args.max_cell_seconds:
            return None, f"skipped: {max(budget, 0):.3g} s left of --max-seconds ({est_s:.3g} s per update)"
        return None, f"skipped: over {budget:.3g} s estimate ({est_s:.3g} s per update)"
    return p, "ok"


def timed_updates(learner, it, n: int, device, budget_s: float) -> tuple[list[float], dict]:
    """n timed `Learner.update`s; stops early (after 2) once budget_s is spent."""
    times, m, start = [], {}, time.perf_counter()
    for _ in range(n):
        b = next(it)
        sync(device)
        t = time.perf_counter()
        m = learner.update(b)
        sync(device)
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget_s and len(times) >= 2:
            break
    return times, m


def learner_cell(args, cell: dict, updates_warmup: tuple[int, int], batches: list, device, budget_s: float) -> dict:
    """One cell: a fresh agent and learner; the first call (compiling, where on) timed alone, warm-up, then
    the timed updates under the peak-memory probe, then the forward / backward / optimiser split."""
    updates, warmup = updates_warmup
    a = cell_args(args, d_model=cell["d_model"], seq_len=cell["seq_len"], dtype=cell["dtype"], compile=cell["compile"])
    torch._dynamo.reset()
    trim_heap()
    t_cell = time.perf_counter()
    _, _, _, learner = build(a, device)
    it = itertools.cycle(batches)
    out: dict = {"planned_updates": updates, "warmup_updates": warmup}
    with autocast_ctx(device, cell["dtype"]):
        first: dict = {}
        with peak_memory(device, first):
            t = time.perf_counter()
            learner.update(next(it))
            sync(device)
            out["first_call_s"] = time.perf_counter() - t
        out["first_call_peak_mib"] = first["peak_mem_mib"]
        out["compiled"] = bool(cell["compile"]) and learner.compute_loss is not eager_compute_loss
        for _ in range(warmup):
            learner.update(next(it))
        sync(device)
        trim_heap()
        mem: dict = {}
        with peak_memory(device, mem):
            left = budget_s - (time.perf_counter() - t_cell)
            times, m = timed_updates(learner, it, updates, device, left)
        parts = [update_with_breakdown(learner, next(it), device) for _ in range(args.breakdown_updates)]
    med = statistics.median(times)
    out.update(
        status="ok", timed_updates=len(times), s_per_update_median=med, s_per_update_mean=statistics.fmean(times),
        s_per_update_min=min(times), updates_per_s=1 / med, first_call_minus_median_s=out["first_call_s"] - med,
        peak_mib=mem["peak_mem_mib"], peak_total_mib=mem["peak_mem_total_mib"], peak_mem_method=mem["peak_mem_method"],
        breakdown_s={k: statistics.median(p[k] for p in parts) for k in parts[0]} if parts else None,
        final_loss=float(m["loss"]), cell_s=time.perf_counter() - t_cell,
    )  # fmt: skip
    return out


def add_mfu(out: dict, flops: int, peaks: dict[str, float]) -> None:
    """Achieved GFLOP/s (FlopCounterMode FLOPs of one update / median seconds) and MFU against both peaks."""
    achieved = flops / out["s_per_update_median"]
    out.update(flops_per_update=flops, gflop_per_update=flops / 1e9, gflops=achieved / 1e9,
               mfu_vs_fp32_peak=achieved / peaks["fp32"], mfu_vs_bf16_peak=achieved / peaks["bf16"])  # fmt: skip


def shape_setup(args, cell: dict, device, tmp: Path) -> dict:
    """Batches of one (d_model, context), sampled once for all its cells (4 distinct ones, cycled), and the
    FlopCounterMode FLOPs of one eager update on them (the same maths whatever the dtype or compile)."""
    a = cell_args(args, d_model=cell["d_model"], seq_len=cell["seq_len"], dtype=cell["dtype"], compile=False)
    _, spec, _, learner = build(a, device)
    batches, sample_s = sample_batches(a, spec, tmp, 4)
    fl = count_update_flops(learner, batches[0], device, cell["dtype"])
    del learner
    return {"batches": batches, "sample_ms_per_batch": 1e3 * sample_s, **fl}


def print_cell(c: dict) -> None:
    name = f"d{c['d_model']} x {c['seq_len']} {c['dtype']} compile {'on' if c['compile'] else 'off'}"
    if c["compile"] and c.get("compiled") is False:
        name += " (compile failed: ran eager)"
    if c["status"] != "ok":
        print(f"learner {name}: {c['status']}", flush=True)
        return
    print(f"learner {name}: first call {c['first_call_s']:.2f} s, median {c['s_per_update_median']:.3f} s/update "
          f"({c['timed_updates']}), peak +{c['peak_mib']:.0f} MiB, {c.get('gflops', float('nan')):.1f} GFLOP/s, "
          f"MFU {100 * c.get('mfu_vs_fp32_peak', float('nan')):.1f}% fp32 / "
          f"{100 * c.get('mfu_vs_bf16_peak', float('nan')):.1f}% bf16 peak", flush=True)  # fmt: skip


def run_learner_cells(args, cells: list[dict], calib: Calibration, peaks, device, tmp: Path,
                      deadline: float = math.inf, done: list | None = None, save=None) -> list[dict]:  # fmt: skip
    """Every learner cell in turn, appended to `done` as it ends (and `save()` called: a sweep cut short
    keeps its JSON up to the last cell)."""
    done = [] if done is None else done
    stopped, shape, setup = {}, None, None
    for cell in cells:
        left = deadline - time.perf_counter()
        updates_warmup, status = cell_plan(args, cell, calib, device, stopped, left)
        out = dict(cell, est_s_per_update=calib.seconds_per_update(cell), est_mib=calib.mib(cell))
        if updates_warmup is not None:
            try:
                if shape != (cell["d_model"], cell["seq_len"]):
                    shape, setup = None, None
                    trim_heap()
                    setup = shape_setup(args, cell, device, tmp)
                    shape = (cell["d_model"], cell["seq_len"])
                budget = min(args.max_cell_seconds, deadline - time.perf_counter())
                out.update(learner_cell(args, cell, updates_warmup, setup["batches"], device, budget))
                add_mfu(out, setup["flops_per_update"], peaks)
                out["sample_ms_per_batch"] = setup["sample_ms_per_batch"]
            except Exception as e:  # noqa: BLE001 - a cell that fails (OOM, compile) is a result, not a crash
                status = f"error: {type(e).__name__}: {str(e).strip()[:200]}"
        if out.get("status") != "ok":
            out["status"] = status
            if status.startswith("skipped"):
                key = (cell["d_model"], cell["dtype"], cell["compile"])
                stopped[key] = min(stopped.get(key, cell["seq_len"]), cell["seq_len"])
        calib.learn(cell, out)
        print_cell(out)
        done.append(out)
        if save is not None:
            save()
    torch._dynamo.reset()
    return done


def acting_cell(args, a_cell: dict, calib: Calibration, device, deadline: float = math.inf) -> dict:
    e, n = a_cell["envs"], a_cell["seq_len"]
    steps = plan.acting_steps(e, n, args.act_steps)
    est = (steps + 4 * e) / e * plan.vector_step_s(e, n, a_cell["d_model"]) * (calib.act_ratio or 1.0)
    out = dict(a_cell, env_steps_planned=steps, est_s=est)
    left = deadline - time.perf_counter()
    if est > min(args.max_cell_seconds, left):
        why = f"over {args.max_cell_seconds:.3g} s" if args.max_cell_seconds <= left else \
            f"{max(left, 0):.3g} s left of --max-seconds,"
        print(f"acting d{a_cell['d_model']} x {n}, {e} envs: skipped ({why} estimate {est:.3g} s)", flush=True)
        return dict(out, status=f"skipped: {why} estimate {est:.3g} s")
    a = cell_args(args, d_model=a_cell["d_model"], seq_len=n, parallel_envs=e, dtype="fp32", compile=False,
                  env_impl=a_cell.get("env_impl", "batched"))
    try:
        cfg, spec, agent, _ = build(a, device)
        r = bench_acting(a, cfg, spec, agent, device, recompute=False, steps=steps)
    except Exception as ex:  # noqa: BLE001
        return dict(out, status=f"error: {type(ex).__name__}: {str(ex).strip()[:200]}")
    prior = r["env_steps"] / e * plan.vector_step_s(e, n, a_cell["d_model"])
    calib.act_ratio = max(calib.act_ratio or 0.0, r["seconds"] / prior)
    out.update(r, status="ok")
    print(f"acting d{a_cell['d_model']} x {n}, {e} envs ({a.env_impl}): {r['env_steps_per_s']:.0f} env steps/s; policy "
          f"{100 * r['frac_policy']:.0f}%, env {100 * r['frac_env_step']:.0f}%, collector "
          f"{100 * r['frac_collector']:.0f}%", flush=True)  # fmt: skip
    return out


def save_json(result: dict, tag: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"throughput_{tag}.json").write_text(json.dumps(result, indent=2) + "\n")


def write_report(result: dict, tag: str) -> str:
    save_json(result, tag)
    md = plan.markdown_tables(result)
    (RESULTS / f"throughput_{tag}.md").write_text(md)
    try:
        plan.plot(result, RESULTS / f"throughput_{tag}.png")
    except Exception as e:  # noqa: BLE001 - the measurements matter more than the figure
        print(f"plot failed: {type(e).__name__}: {e}")
    return md


def sweep_plan(args) -> tuple[plan.Net, list[dict], list[dict]]:
    net = plan.Net(batch=args.batch_size, layers=args.layers, heads=args.heads, head_hidden=args.head_hidden)
    shapes = plan.sweep_shapes(args.shapes, args.d_models, args.seq_lens, args.d_model, args.seq_len)
    modes = args.compile_modes or (["on"] if args.compile else ["off"])
    cells = [] if args.skip_learner else plan.expand_cells(shapes, args.dtypes or [args.dtype], modes)
    impls = args.env_impls or [args.env_impl]
    acting = [] if args.skip_acting else plan.expand_acting(shapes, args.envs or [args.parallel_envs], impls)
    return net, cells, acting


def print_plan(args, cells: list[dict], acting: list[dict], calib: Calibration) -> None:
    """--dry-run: each cell's prior estimates (seconds per update, MiB) and planned updates; nothing timed."""
    for c in cells:
        est_s, upd = calib.seconds_per_update(c), plan.plan_updates(
            calib.seconds_per_update(c), args.updates, args.warmup, args.breakdown_updates, args.max_cell_seconds,
            calib.compile_s if c["compile"] else 0.0)  # fmt: skip
        print(f"  learner d{c['d_model']} x {c['seq_len']} {c['dtype']} compile {'on' if c['compile'] else 'off'}: "
              f"~{est_s:.2f} s/update, ~{calib.mib(c):.0f} MiB, "
              + (f"{upd[0]} timed after {upd[1]} warm-up" if upd else "skipped (time)"))  # fmt: skip
    for a in acting:
        steps = plan.acting_steps(a["envs"], a["seq_len"], args.act_steps)
        est = (steps + 4 * a["envs"]) / a["envs"] * plan.vector_step_s(a["envs"], a["seq_len"], a["d_model"])
        print(f"  acting d{a['d_model']} x {a['seq_len']}, {a['envs']} envs: {steps} env steps, ~{est:.0f} s")


def run_sweep(args, device: torch.device) -> None:
    """Every learner cell (d_model x context x dtype x compile) and acting cell (x envs) in one invocation:
    one JSON, a markdown table and a plot in benchmarks/results/throughput/."""
    t0 = time.perf_counter()
    tag = args.tag or f"{args.preset or 'sweep'}_{device.type}_t{args.threads}"
    net, cells, acting = sweep_plan(args)
    result = machine_info(args, device, tag)
    result["mem_available_mib_start"] = mem_available_mib(device)
    peaks = measure_peaks(device, args.peak_n, args.peak_seconds)  # at the cells' thread count
    result["matmul_peak_flops"] = peaks
    calib = Calibration(peaks, net, args.sdpa)
    est = plan.estimate_runtime_s(cells, acting, net, calib.prior, args.updates, args.warmup, args.breakdown_updates,
                                  args.act_steps, calib.compile_s, args.max_cell_seconds)  # fmt: skip
    result["estimate_s"] = est
    print(f"sweep {tag}: {len(cells)} learner cells, {len(acting)} acting cells; mm peak fp32 "
          f"{peaks['fp32'] / 1e9:.0f} / bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s; estimated {est / 60:.1f} min "
          f"(per cell at most {args.max_cell_seconds:.0f} s"
          + (f", the sweep at most {args.max_seconds / 60:.3g} min)" if args.max_seconds else ")"),
          flush=True)  # fmt: skip
    if args.dry_run:
        print_plan(args, cells, acting, calib)
        return
    deadline = t0 + (args.max_seconds or math.inf)
    reserve = 2 * sum(plan.acting_steps(a["envs"], a["seq_len"], args.act_steps) / a["envs"]
                  * plan.vector_step_s(a["envs"], a["seq_len"], a["d_model"]) + 1 for a in acting)  # fmt: skip
    save = functools.partial(save_json, result, tag)
    result["learner_cells"], result["acting_cells"] = [], []
    with tempfile.TemporaryDirectory() as tmp:
        run_learner_cells(args, cells, calib, peaks, device, Path(tmp), deadline - reserve, result["learner_cells"],
                          save)
    torch.set_num_threads(args.act_threads or args.threads)
    result["act_threads"] = torch.get_num_threads()
    for a in acting:
        result["acting_cells"].append(acting_cell(args, a, calib, device, deadline))
        save()
    torch.set_num_threads(args.threads)
    result.update(load_avg_end=load_avg(), wall_s=time.perf_counter() - t0)
    md = write_report(result, tag)
    print(f"\n{md}\nwall {result['wall_s'] / 60:.1f} min (estimated {est / 60:.1f}); "
          f"{RESULTS / f'throughput_{tag}'}.{{json,md,png}}")
    print(json.dumps({k: v for k, v in result.items() if k != "settings"}))


# -------------------------------------------------------------------------------------------------- main
def add_shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-hidden", type=int, default=256, help="actor / critic MLP width (256: the reference "
                   "settings of the first measurements; the library default is now smaller)")  # fmt: skip
    p.add_argument("--traj-encoder", default="transformer", choices=["transformer", "gru", "lstm", "ff"])
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--seq-len", type=int, default=256, help="training window = acting context = T-Maze corridor")
    p.add_argument("--parallel-envs", type=int, default=8)
    p.add_argument("--env-impl", choices=["batched", "per-copy"], default="batched",
                   help="acting's T-Maze: icrl.envs.batched (what make_vector_env builds) or per-copy envs")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--act-threads", type=int, default=None, help="torch threads while acting (default: --threads)")
    p.add_argument("--updates", type=int, default=10, help="timed learner updates")
    p.add_argument("--warmup", type=int, default=2, help="untimed learner updates first")
    p.add_argument("--breakdown-updates", type=int, default=2, help="extra updates timed part by part")
    p.add_argument("--num-rollouts", type=int, default=64, help="synthetic rollouts in the replay")
    p.add_argument("--act-steps", type=int, default=None, help="timed env steps (all envs) of acting (default: "
                   "2000; in a sweep one whole rollout per env, envs x (seq-len + 1))")  # fmt: skip
    p.add_argument("--recompute-steps", type=int, default=None, help="env steps of the recompute contrast "
                   "(default: --act-steps; 0 skips it; never in a sweep)")  # fmt: skip
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="learner update precision")
    p.add_argument("--act-dtype", choices=["fp32", "bf16"], default="fp32", help="acting precision (autocast)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    p.add_argument("--sdpa", default="default", choices=["default", "math", "flash", "efficient"],
                   help="pin the attention kernel of the learner update (experiment)")
    p.add_argument("--peak-n", type=int, default=2048, help="matrix side of the peak-FLOP/s mm loop")
    p.add_argument("--peak-seconds", type=float, default=1.5)
    p.add_argument("--compile", action="store_true", help="OptimConfig.compile=True: torch.compile the loss "
                   "computation (absent: compile=False, never the library's automatic choice)")  # fmt: skip


def add_sweep_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sweeps (any of these runs every combination in one invocation)")
    g.add_argument("--preset", choices=sorted(plan.PRESETS), default=None,
                   help="issue18: the reference shapes of issue 18 (explicit flags override its settings)")
    g.add_argument("--shapes", nargs="+", default=None, metavar="DxL", help="(d_model, context) pairs, e.g. 128x256")
    g.add_argument("--seq-lens", nargs="+", type=int, default=None, help="contexts at --d-model(s)")
    g.add_argument("--d-models", nargs="+", type=int, default=None)
    g.add_argument("--dtypes", nargs="+", choices=["fp32", "bf16"], default=None)
    g.add_argument("--compile-modes", nargs="+", choices=["off", "on"], default=None)
    g.add_argument("--envs", nargs="+", type=int, default=None, help="parallel envs of the acting cells")
    g.add_argument("--env-impls", nargs="+", choices=["batched", "per-copy"], default=None,
                   help="T-Maze as a batched env (icrl.envs.batched, the default) and/or per-copy envs")
    g.add_argument("--max-cell-seconds", type=float, default=300.0, help="skip (record) a cell estimated longer; "
                   "fewer timed updates first")  # fmt: skip
    g.add_argument("--max-seconds", type=float, default=None, help="the whole sweep's budget: cells that would "
                   "end past it are skipped (recorded), acting's estimate kept in reserve")  # fmt: skip
    g.add_argument("--mem-fraction", type=float, default=0.6, help="skip a cell whose memory estimate exceeds this "
                   "fraction of MemAvailable")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_args(p)
    add_sweep_args(p)
    p.add_argument("--dry-run", action="store_true", help="a sweep's cells and estimates only, nothing timed")
    p.add_argument("--skip-learner", action="store_true")
    p.add_argument("--skip-acting", action="store_true")
    p.add_argument("--profile", action="store_true", help="print cProfile (acting) and torch.profiler (update) tops")
    p.add_argument("--tag", default=None, help="results/throughput/throughput_<tag>.json (default: from the settings)")
    pre, _ = p.parse_known_args(argv)
    if pre.preset:
        p.set_defaults(**plan.PRESETS[pre.preset])
    return p.parse_args(argv)


def is_sweep(args: argparse.Namespace) -> bool:
    return any(getattr(args, k) is not None
               for k in ("preset", "shapes", "seq_lens", "d_models", "dtypes", "compile_modes", "envs"))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    global SDPA_BACKEND
    SDPA_BACKEND = args.sdpa
    torch.set_num_threads(args.threads)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    (run_sweep if is_sweep(args) else run_single)(args, device)


if __name__ == "__main__":
    main()
