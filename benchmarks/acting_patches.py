"""Evidence for two minimal acting-loop changes (patched in this process only, no library edits):
(1) SigmaReparamLinear caches its effective weight in eval/no-grad mode, keyed on the parameters' version
counters; (2) AgentPolicy switches the agent to eval once per collection phase instead of eval()+train()
on every step. Interleaved runs of the whole collection loop (Collector + AgentPolicy), 1 thread.

    python benchmarks/acting_patches.py 8 64
"""
import time, sys, torch, numpy as np, torch.nn.functional as F
torch.set_num_threads(1)
from icrl.agent import Agent, AgentPolicy
from icrl.config import ExperimentConfig, ExploreConfig
from icrl.envs import make_wrapped_env, make_vector_env, Collector
from icrl.exploration import Exploration
from icrl.types import ActionSpec
from icrl.nets import transformer as tr

orig_forward = tr.SigmaReparamLinear.forward
def cached_forward(self, x):
    if self.training or torch.is_grad_enabled():
        return orig_forward(self, x)
    key = (self.weight._version, self.gamma._version, self.u._version, self.v._version, id(self.weight))
    if getattr(self, "_w_key", None) != key:
        self._w_eff = self.effective_weight().detach()
        self._w_key = key
    return F.linear(x, self._w_eff, self.bias)

class OnceEvalPolicy(AgentPolicy):
    @torch.no_grad()
    def act(self, ts, new_rollout):
        if self.agent.training:
            self.agent.eval()
        train = self.agent.train
        self.agent.train = lambda mode=True: self.agent  # the library's act() restores the mode every step
        self.agent.eval = lambda: self.agent
        try:
            return super().act(ts, new_rollout)
        finally:
            del self.agent.train, self.agent.eval

def run(N, variant, steps=3000, reps=3):
    env = make_wrapped_env("tmaze", {"length": 256}); spec = ActionSpec.from_space(env.action_space)
    cfg = ExperimentConfig(); torch.manual_seed(0)
    agent = Agent(env.observation_space["obs"], spec, cfg.model, cfg.loss)
    tr.SigmaReparamLinear.forward = cached_forward if "cache" in variant else orig_forward
    best = 0
    for _ in range(reps):
        venv = make_vector_env("tmaze", {"length": 256}, N)
        c = Collector(venv, spec, seed=0); ex = Exploration(ExploreConfig(), spec, N, 0)
        cls = OnceEvalPolicy if "once" in variant else AgentPolicy
        pol = cls(agent, N, greedy=False, exploration=ex, env_steps=lambda: c.total_env_steps)
        agent.train()
        c.collect(pol, 4 * N)
        n0 = c.total_env_steps; t = time.perf_counter(); c.collect(pol, max(steps, 4*N)); dt = time.perf_counter() - t
        best = max(best, (c.total_env_steps - n0) / dt); venv.close()
    return best

# correctness: cached forward == original in eval/no_grad
env = make_wrapped_env("tmaze", {"length": 256}); spec = ActionSpec.from_space(env.action_space)
cfg = ExperimentConfig(); agent = Agent(env.observation_space["obs"], spec, cfg.model, cfg.loss).eval()
lin = agent.traj_encoder.blocks[0].mlp.fc; x = torch.randn(8, 128)
with torch.no_grad():
    a = orig_forward(lin, x); b = cached_forward(lin, x)
    lin.weight.add_(0.01); c2 = cached_forward(lin, x); d = orig_forward(lin, x)
print("cache exact:", (a - b).abs().max().item(), "after in-place weight change:", (c2 - d).abs().max().item())
import statistics
for N in [int(n) for n in sys.argv[1:]] or [8, 64]:
    res = {v: [] for v in ["library", "once", "cache", "once+cache"]}
    for rep in range(5):  # interleaved, so slow phases of the shared machine hit every variant
        for v in res:
            res[v].append(run(N, v, steps=max(2000, 40 * N), reps=1))
    for v, xs in res.items():
        print(N, v, f"median {statistics.median(xs):.0f}, best {max(xs):.0f} env steps/s over 5 interleaved runs", flush=True)
