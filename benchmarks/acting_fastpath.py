"""Prototype: how fast could acting be? A frozen, module-free acting step vs `AgentPolicy`.

Evidence for the acting-loop proposals in the throughput report. `FrozenActor` snapshots the agent's
weights once per collection phase (they cannot change while collecting): σReparam layers are folded into
plain effective weights, the actor keeps only the policy discount's output rows, and one step is a flat
sequence of tensor ops (no nn.Module calls, no train/eval toggling, no per-call σ recomputation). The
attention reads the whole W-slot ring with a mask so every shape is static, which lets `torch.compile`
fuse the step. Outputs are checked against the library's step (`traj_encoder.step` + `actor`).

    python benchmarks/acting_fastpath.py --envs 8 32 --compile

Prints a table; the last line is one JSON object (also written to benchmarks/results/acting_fastpath.json).
Covers the default model (transformer, vector observations, discrete actions) only.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from icrl.agent import Agent, AgentPolicy
from icrl.config import ExperimentConfig, ExploreConfig, ModelConfig
from icrl.envs import Collector, make_vector_env, make_wrapped_env
from icrl.exploration import Exploration
from icrl.types import ActionSpec, Timesteps

SLOPE = 0.01  # LeakyReLU slope used everywhere in icrl's nets


def _ln(m) -> tuple[torch.Tensor, torch.Tensor, float]:
    return m.weight.detach().clone(), m.bias.detach().clone(), m.eps


class FrozenActor:
    """A snapshot of `agent` for acting; `refresh(agent)` after every learner phase."""

    def __init__(self, agent: Agent, num_envs: int):
        self.N = num_envs
        self.refresh(agent)
        enc = agent.traj_encoder
        L, H, W, dh = enc.n_layers, enc.heads, enc.context_len, enc.d_model // enc.heads
        self.k = torch.zeros(L, num_envs, H, W, dh)
        self.v = torch.zeros(L, num_envs, H, W, dh)
        self.count = torch.zeros(num_envs, dtype=torch.long)
        self.rows = torch.arange(num_envs)
        self.slots = torch.arange(W)
        self.W, self.H, self.dh, self.L = W, H, dh, L

    @torch.no_grad()
    def refresh(self, agent: Agent) -> None:
        te, enc = agent.tstep_encoder, agent.traj_encoder
        assert not te.image_keys and te.goal_embedder is None, "prototype: vector observations only"
        self.vector_keys = list(te.vector_keys)
        n = te.obs_norm
        self.obs_mean = n.mean.clone()
        self.obs_inv_std = 1.0 / torch.sqrt(n.var + n.eps)
        self.obs_clip = float(n.clip)
        self.time_freqs, self.max_time = te.time_freqs.clone(), te.max_time
        m = te.mlp
        self.t_w1, self.t_b1 = m[0].weight.clone(), m[0].bias.clone()
        self.t_ln1 = _ln(m[1])
        self.t_w2, self.t_b2 = m[3].weight.clone(), m[3].bias.clone()
        self.t_ln2 = _ln(m[4])
        self.inp_w, self.inp_b = enc.inp.weight.clone(), enc.inp.bias.clone()
        assert enc.time_emb.kind == "learned", "prototype: learned time embedding only"
        self.time_table, self.enc_max_time = enc.time_emb.table.weight.clone(), enc.time_emb.max_time

        def eff(lin):  # σReparam folded: gamma / sigma(W) * W, frozen for the whole collection phase
            w = lin.effective_weight() if hasattr(lin, "effective_weight") else lin.weight
            return w.detach().clone(), None if lin.bias is None else lin.bias.detach().clone()

        self.blocks = []
        for b in enc.blocks:
            self.blocks.append({
                "ln_attn": _ln(b.ln_attn), "qkv": eff(b.attn.qkv), "proj": eff(b.attn.proj),
                "ln_attn_out": _ln(b.ln_attn_out), "ln_mlp": _ln(b.ln_mlp), "fc": eff(b.mlp.fc),
                "norm": _ln(b.mlp.norm), "mlp_proj": eff(b.mlp.proj),
            })  # fmt: skip
        self.ln_f = _ln(enc.ln_f)
        net, G, A = agent.actor.net, agent.actor.num_gammas, agent.spec.dim
        self.a_w1, self.a_b1, self.a_ln1 = net[0].weight.clone(), net[0].bias.clone(), _ln(net[1])
        self.a_w2, self.a_b2, self.a_ln2 = net[3].weight.clone(), net[3].bias.clone(), _ln(net[4])
        rows = slice((G - 1) * A, G * A)  # only the policy discount's logits are needed to act
        self.a_w3, self.a_b3 = net[6].weight[rows].clone(), net[6].bias[rows].clone()

    # ---------------------------------------------------------------------------------- the pure step
    def state_fn(self, vec, prev_action, prev_reward, time, reset, k, v, count):
        """-> s [N, d]; writes this step's K/V into the ring (k, v [L, N, H, W, dh]) in place."""
        N = vec.shape[0]
        x = ((vec - self.obs_mean) * self.obs_inv_std).clamp(-self.obs_clip, self.obs_clip)
        t = time.float().unsqueeze(-1)
        ang = t * self.time_freqs
        r = torch.sign(prev_reward) * torch.log1p(prev_reward.abs())
        feats = torch.cat([x, prev_action, r.unsqueeze(-1), t.clamp(0, self.max_time) / self.max_time,
                           ang.sin(), ang.cos(), reset.float().unsqueeze(-1)], dim=-1).to(self.t_w1.dtype)  # fmt: skip
        h = F.leaky_relu(F.layer_norm(F.linear(feats, self.t_w1, self.t_b1), self.t_b1.shape, *self.t_ln1), SLOPE)
        h = F.layer_norm(F.linear(h, self.t_w2, self.t_b2), self.t_b2.shape, *self.t_ln2)
        h = F.linear(h, self.inp_w, self.inp_b) + F.embedding(time.clamp(0, self.enc_max_time), self.time_table)
        d = h.shape[-1]
        slot = count % self.W
        valid = self.slots[None, :] < (count + 1).clamp(max=self.W)[:, None]  # [N, W]
        bias = torch.where(valid, 0.0, float("-inf")).to(h.dtype)[:, None, :]  # [N, 1, W]
        rows = torch.arange(N)
        for layer, p in enumerate(self.blocks):
            a = F.layer_norm(h, (d,), *p["ln_attn"])
            q, kk, vv = F.linear(a, p["qkv"][0]).view(N, 3, self.H, self.dh).unbind(1)  # [N, H, dh]
            k[layer, rows, :, slot] = kk
            v[layer, rows, :, slot] = vv
            scores = torch.einsum("nhd,nhwd->nhw", q, k[layer]) * (self.dh**-0.5) + bias
            y = torch.einsum("nhw,nhwd->nhd", scores.softmax(-1), v[layer]).reshape(N, d)
            h = h + F.layer_norm(F.linear(y, *p["proj"]), (d,), *p["ln_attn_out"])
            m = F.leaky_relu(F.linear(F.layer_norm(h, (d,), *p["ln_mlp"]), *p["fc"]), SLOPE)
            h = h + F.linear(F.layer_norm(m, m.shape[-1:], *p["norm"]), *p["mlp_proj"])
        return F.layer_norm(h, (d,), *self.ln_f)

    def logits_fn(self, s):
        h = F.leaky_relu(F.layer_norm(F.linear(s, self.a_w1, self.a_b1), self.a_b1.shape, *self.a_ln1), SLOPE)
        h = F.leaky_relu(F.layer_norm(F.linear(h, self.a_w2, self.a_b2), self.a_b2.shape, *self.a_ln2), SLOPE)
        return F.linear(h, self.a_w3, self.a_b3)  # [N, A]

    def act_fn(self, vec, prev_action, prev_reward, time, reset, k, v, count, u):
        s = self.state_fn(vec, prev_action, prev_reward, time, reset, k, v, count)
        logits = self.logits_fn(s)
        gumbel = -torch.log(-torch.log(u))
        return (logits.log_softmax(-1) + gumbel).argmax(-1)


class FastPolicy:
    """Collector policy on a FrozenActor (optionally compiled); exploration as in AgentPolicy."""

    def __init__(self, frozen: FrozenActor, exploration, env_steps, compiled: bool):
        self.f, self.exploration, self.env_steps = frozen, exploration, env_steps
        self.fn = torch.compile(frozen.act_fn, dynamic=False) if compiled else frozen.act_fn

    @torch.no_grad()
    def act(self, ts: Timesteps, new_rollout: np.ndarray) -> np.ndarray:
        f = self.f
        if new_rollout.any():
            f.count[torch.from_numpy(new_rollout)] = 0
            if self.exploration is not None:
                self.exploration.new_rollouts(new_rollout)
        vec = torch.cat([ts.obs[k][:, 0].reshape(f.N, -1).float() for k in f.vector_keys], -1)
        time0 = ts.time[:, 0]
        u = torch.rand(f.N, f.a_b3.shape[0]).clamp_min_(torch.finfo(torch.float32).tiny)
        a = self.fn(vec, ts.prev_action[:, 0], ts.prev_reward[:, 0], time0, ts.reset[:, 0], f.k, f.v, f.count, u)
        f.count += 1
        actions = a.numpy().astype(np.int64)
        if self.exploration is not None:
            actions = self.exploration(actions, self.env_steps(), time0.numpy())
        return actions


# ------------------------------------------------------------------------------------------------ checks
@torch.no_grad()
def check_equal(agent: Agent, N: int, steps: int = 300) -> float:
    """Max |s_fast - s_library| over `steps` acting steps (past the window, so the ring wraps)."""
    frozen = FrozenActor(agent, N)
    agent.eval()
    state = agent.traj_encoder.init_state(N, "cpu")
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for t in range(steps):
        ts = Timesteps(
            obs={"obs": torch.rand(N, 1, 4, generator=g)},
            prev_action=F.one_hot(torch.randint(4, (N, 1), generator=g), 4).float(),
            prev_reward=torch.randn(N, 1, generator=g),
            time=torch.full((N, 1), t, dtype=torch.long),
            reset=torch.full((N, 1), t == 0),
        )
        x = agent.tstep_encoder(ts)[:, 0]
        s_ref, state = agent.traj_encoder.step(x, ts.time[:, 0], state)
        s = frozen.state_fn(ts.obs["obs"][:, 0], ts.prev_action[:, 0], ts.prev_reward[:, 0], ts.time[:, 0],
                            ts.reset[:, 0], frozen.k, frozen.v, frozen.count)  # fmt: skip
        frozen.count += 1
        worst = max(worst, (s - s_ref).abs().max().item())
        ref_logits = agent.actor(s_ref[:, None]).logits[:, 0, -1]
        worst = max(worst, (frozen.logits_fn(s).log_softmax(-1) - ref_logits).abs().max().item())
    agent.train()
    return worst


def policy_us(policy, ts: Timesteps, N: int, reps: int) -> float:
    nr = np.zeros(N, bool)
    for _ in range(5):
        policy.act(ts, nr)
    t = time.perf_counter()
    for _ in range(reps):
        policy.act(ts, nr)
    return 1e6 * (time.perf_counter() - t) / reps


def loop_rate(agent, spec, N: int, length: int, kind: str, steps: int) -> dict:
    venv = make_vector_env("tmaze", {"length": length}, N)
    collector = Collector(venv, spec, seed=0)
    expl = Exploration(ExploreConfig(), spec, N, seed=0)
    env_steps = lambda: collector.total_env_steps  # noqa: E731
    if kind == "library":
        policy = AgentPolicy(agent, N, greedy=False, exploration=expl, env_steps=env_steps)
    else:
        policy = FastPolicy(FrozenActor(agent, N), expl, env_steps, compiled=kind == "compiled")
    collector.collect(policy, 4 * N)
    n0, t = collector.total_env_steps, time.perf_counter()
    collector.collect(policy, steps)
    dt = time.perf_counter() - t
    venv.close()
    return {"env_steps_per_s": (collector.total_env_steps - n0) / dt}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", type=int, nargs="+", default=[8, 32])
    p.add_argument("--seq-len", type=int, default=256, help="context W = T-Maze corridor")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--loop-steps", type=int, default=4000)
    p.add_argument("--compile", action="store_true", help="also torch.compile the frozen step")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "acting_fastpath.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()

    env = make_wrapped_env("tmaze", {"length": args.seq_len})
    spec = ActionSpec.from_space(env.action_space)
    cfg = ExperimentConfig(model=ModelConfig(max_seq_len=args.seq_len))
    torch.manual_seed(0)
    agent = Agent(env.observation_space["obs"], spec, cfg.model, cfg.loss)
    with torch.no_grad():  # non-trivial normalisation statistics, so the check covers them
        agent.tstep_encoder.obs_norm.mean.uniform_(-0.5, 0.5)
        agent.tstep_encoder.obs_norm.var.uniform_(0.5, 2.0)
    err = check_equal(agent, 4, steps=args.seq_len + 40)
    print(f"max |fast - library| over states and log-probs: {err:.2e}")

    kinds = ["library", "frozen"] + (["compiled"] if args.compile else [])
    rows = []
    for N in args.envs:
        ts = Timesteps(
            obs={"obs": torch.rand(N, 1, 4)}, prev_action=torch.zeros(N, 1, 4), prev_reward=torch.zeros(N, 1),
            time=torch.full((N, 1), args.seq_len // 2, dtype=torch.long), reset=torch.zeros(N, 1, dtype=torch.bool),
        )  # fmt: skip
        for kind in kinds:
            expl = Exploration(ExploreConfig(), spec, N, seed=0)
            if kind == "library":
                pol = AgentPolicy(agent, N, greedy=False, exploration=expl)
                for _ in range(args.seq_len):  # fill the cache: steady state
                    pol.act(ts, np.zeros(N, bool))
            else:
                t0 = time.perf_counter()
                pol = FastPolicy(FrozenActor(agent, N), expl, lambda: 0, compiled=kind == "compiled")
                pol.f.count.fill_(args.seq_len)
                pol.act(ts, np.zeros(N, bool))
                if kind == "compiled":
                    print(f"compile time ({N} envs): {time.perf_counter() - t0:.0f} s", flush=True)
            us = policy_us(pol, ts, N, args.reps)
            loop = loop_rate(agent, spec, N, args.seq_len, kind, max(args.loop_steps, 4 * N))
            rows.append({"envs": N, "policy": kind, "policy_us_per_vector_step": us,
                         "policy_us_per_env_step": us / N, **loop})  # fmt: skip
            print(f"{N:>3} envs {kind:>9}: policy {us:8.0f} us/vector step ({us / N:6.1f} us/env step); "
                  f"whole loop {loop['env_steps_per_s']:7.0f} env steps/s", flush=True)  # fmt: skip
    report = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "max_abs_err_vs_library": err, "load_avg_start": [round(x, 2) for x in load0],
              "load_avg_end": [round(x, 2) for x in os.getloadavg()], "results": rows}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
