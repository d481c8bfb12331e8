"""The steps a GPU captures as CUDA graphs (icrl.agent.graphs), checked on the CPU: they read nothing back to the
host, and their fixed-shape forms compute what the eager ones do.

"Reads nothing back" is checked by running the step under `FakeTensorMode`: every tensor becomes a fake with
shapes but no data, so any `.item()`, `bool(tensor)`, `float(tensor)`, data-dependent shape (boolean indexing,
`nonzero`) or copy to numpy raises. On CUDA each of those would be a host sync, and none can be captured.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from test_agent import KINDS, _experiment, first_timesteps, real_batch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

from icrl.agent import graphs
from icrl.agent import learner as learner_module
from icrl.agent.learner import Learner
from icrl.agent.model import Agent, AgentPolicy
from icrl.config import ModelConfig
from icrl.types import Timesteps

TWOHOT = {"critic_kind": "twohot", "critic_bins": 16, "critic_min_value": -50.0, "critic_max_value": 50.0}


def _learner(kind: str, tmp_path, **cfg_kw):
    batch, obs_space, spec = real_batch(kind, tmp_path / "replay")
    cfg = _experiment(**cfg_kw)
    torch.manual_seed(0)
    agent = Agent(obs_space, spec, cfg.model, cfg.loss)
    return Learner(agent, cfg, torch.device("cpu")), batch


def _staged(monkeypatch) -> None:
    """Learners built after this take the captured path's Python (static buffers, learning rates as tensors)
    on the CPU, with the capture itself replaced by a plain call: what a GPU captures, run eagerly."""
    monkeypatch.setattr(learner_module, "graphs_available", lambda device, wanted: wanted)
    monkeypatch.setattr(graphs.CapturedStep, "__call__", lambda self: self.fn())


def test_fake_mode_catches_a_host_read():
    """The check itself: a host read of a fake tensor (or of a real one used inside the mode) raises."""
    real = torch.ones(3)
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(DataDependentOutputException):
        bool((real * torch.rand(3)).sum() > 0)


@pytest.mark.parametrize(("kind", "kw"), [(k, {}) for k in KINDS] + [("discrete", {"dtype": "bf16"})])
def test_learner_step_reads_nothing_back_to_the_host(kind, kw, tmp_path):
    """Two whole updates (loss, backward, clipping, the guard's verdict, AdamW, PopArt, EMA, metric sums)
    under FakeTensorMode: no host sync anywhere in the update."""
    learner, batch = _learner(kind, tmp_path, **kw)
    with FakeTensorMode(allow_non_fake_inputs=True):
        for _ in range(2):
            out = learner._step(batch)
    assert out.shape == (len(learner._metric_names),)


def test_learner_step_with_a_classification_critic_reads_nothing_back(tmp_path):
    from test_agent import loss_cfg, model_cfg

    from icrl.config import ExperimentConfig

    batch, obs_space, spec = real_batch("discrete", tmp_path / "replay")
    cfg = ExperimentConfig(model=model_cfg(), loss=loss_cfg(**TWOHOT)).replace(lr=1e-3, seed=0, device="cpu")
    learner = Learner(Agent(obs_space, spec, cfg.model, cfg.loss), cfg, torch.device("cpu"))
    learner._step(batch)  # an eager first call, as before a capture (the value bins are built once)
    with FakeTensorMode(allow_non_fake_inputs=True):
        learner._step(batch)


def test_captured_update_path_reads_nothing_back_and_equals_the_eager_update(monkeypatch, tmp_path):
    """The captured path's Python (the batch copied into static [B, context + 1] buffers, padded; learning
    rates read from device tensors) reads nothing back, and over three updates gives the eager update's
    weights, optimiser state and metrics (up to rounding: the padded windows add masked zeros to sums)."""
    eager, batch = _learner("discrete", tmp_path)
    assert batch.shape[1] < eager.cfg.model.context + 1  # the staging pads this batch
    _staged(monkeypatch)
    staged = Learner(copy.deepcopy(eager.agent), eager.cfg, torch.device("cpu"))
    assert staged.graphed and not eager.graphed
    for _ in range(3):
        want = eager.update(batch)
        got = staged.update(batch)
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=k)
    for k, v in eager.agent.state_dict().items():
        torch.testing.assert_close(staged.agent.state_dict()[k], v, rtol=1e-4, atol=1e-5, msg=k)
    assert staged._static is not None and staged._static.shape == (batch.shape[0], eager.cfg.model.context + 1)
    with FakeTensorMode(allow_non_fake_inputs=True):
        staged._graphed_step()
    assert staged.read_metrics().keys() == eager.read_metrics().keys()


def test_captured_update_refuses_a_batch_it_cannot_hold(monkeypatch, tmp_path):
    _staged(monkeypatch)
    learner, batch = _learner("discrete", tmp_path)
    learner.update(batch)
    half = Timesteps(**{f: getattr(batch.inputs, f)[:3] for f in ("prev_action", "prev_reward", "time", "reset")},
                     obs={k: v[:3] for k, v in batch.inputs.obs.items()})
    smaller = type(batch)(inputs=half, **{f: getattr(batch, f)[:3] for f in
                                          ("action", "reward", "terminated", "truncated", "mask", "has_action")})
    with pytest.raises(ValueError, match="does not fit the learner's captured update"):
        learner.update(smaller)


def _policies(kind: str, tmp_path, traj: str = "transformer"):
    batch, obs_space, spec = real_batch(kind, tmp_path / "replay")
    cfg = _experiment()
    model = cfg.model if traj == "transformer" else ModelConfig(**{**cfg.model.__dict__, "traj_encoder": traj})
    torch.manual_seed(0)
    agent = Agent(obs_space, spec, model, cfg.loss)
    N = batch.shape[0]
    agent.eval()  # as `act` leaves it (the tests below call the two step forms directly)
    return agent, batch, AgentPolicy(agent, N, greedy=True, static=True), AgentPolicy(agent, N, greedy=True)


@pytest.mark.parametrize("traj", ["transformer", "ff"])
def test_static_acting_step_reads_nothing_back_to_the_host(traj, tmp_path):
    agent, batch, static, _ = _policies("discrete", tmp_path, traj)
    ts, N = first_timesteps(batch), batch.shape[0]
    static.act(ts, np.ones(N, bool))  # allocates the static inputs; then only the step itself, faked
    static._inputs.load(ts, np.zeros(N, bool))
    with torch.inference_mode(), FakeTensorMode(allow_non_fake_inputs=True):
        for sampled in (True, False):
            out = static._static_step(sampled)
    assert out.shape == (N, agent.spec.dim)


@pytest.mark.parametrize("kind", ["continuous", "discrete"])
def test_static_acting_equals_the_host_books_with_staggered_resets(kind, tmp_path):
    """The fixed-shape acting step (KV books on the device, attention over all W slots, inputs through one
    buffer) acts exactly as the host-books step, over more steps than the context holds (the ring wraps) and
    with envs starting new rollouts at different steps."""
    agent, batch, static, host = _policies(kind, tmp_path)
    _act_side_by_side(static, host, batch, 3 * agent.traj_encoder.context_len, tol=1e-5)
    assert int(static.state.count.max()) > agent.traj_encoder.context_len  # rows outlived the ring


@pytest.mark.parametrize("traj", ["transformer", "ff"])
def test_eager_and_static_acting_run_the_one_step(traj, tmp_path, monkeypatch):
    """Acting has one step function (`AgentPolicy.step`): the eager path calls it on the caller's timesteps,
    the static path (what a GPU captures) on its static buffers; neither has a body of its own."""
    agent, batch, static, host = _policies("discrete", tmp_path, traj)
    calls: list[bool] = []
    one_step = AgentPolicy.step

    def spy(self, ts, new_rollout, sampled):
        calls.append(self.static)
        return one_step(self, ts, new_rollout, sampled)

    monkeypatch.setattr(AgentPolicy, "step", spy)
    ts, N = first_timesteps(batch), batch.shape[0]
    host.act(ts, np.ones(N, bool))
    static.act(ts, np.ones(N, bool))
    assert calls == [False, True]


def _act_side_by_side(static: AgentPolicy, host: AgentPolicy, batch, steps: int, tol: float) -> None:
    """`steps` greedy steps of both policies on the same random timesteps, envs starting new rollouts at random
    steps; their actions agree within `tol`."""
    N, rng = batch.shape[0], np.random.default_rng(0)
    for t in range(steps):
        new = np.ones(N, bool) if t == 0 else rng.random(N) < 0.15
        ts = Timesteps(obs={k: torch.randn(N, 1, *v.shape[2:]) for k, v in batch.inputs.obs.items()},
                       prev_action=batch.inputs.prev_action[:, :1], prev_reward=torch.randn(N, 1),
                       time=torch.from_numpy(rng.integers(0, 40, (N, 1))), reset=torch.zeros(N, 1, dtype=torch.bool))
        with torch.inference_mode():
            a = static._act_static(ts, new, sampled=False)
            b = host._act_eager(ts, new, sampled=False)
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=f"step {t}")


def test_static_acting_sees_new_weights_after_an_update(tmp_path):
    """A replayed acting step runs no Python that would notice stale σReparam snapshots: `act` brings them up
    to date before every step, in place, so the step keeps reading the same memory."""
    agent, batch, static, host = _policies("continuous", tmp_path)
    cfg = _experiment()
    learner = Learner(agent, cfg, torch.device("cpu"))
    ts, N = first_timesteps(batch), batch.shape[0]
    static.act(ts, np.ones(N, bool))
    snapshots = [m._acting_weight for m in agent._sigma_layers()]
    learner.update(batch)
    agent.eval()
    with torch.inference_mode():
        a = static._act_static(ts, np.ones(N, bool), sampled=False)
        b = host._act_eager(ts, np.ones(N, bool), sampled=False)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert all(m._acting_weight is s for m, s in zip(agent._sigma_layers(), snapshots))  # the same memory


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU check runs these)")


def _cuda_learners(tmp_path):
    """Two learners of the same agent on CUDA, captured and eager. REDQ's subset is every critic, so the members'
    random order cannot matter (the two draw from the device generator at different moments)."""
    from test_agent import loss_cfg, model_cfg

    from icrl.config import ExperimentConfig

    batch, obs_space, spec = real_batch("discrete", tmp_path / "replay")
    cfg = ExperimentConfig(model=model_cfg(), loss=loss_cfg(tau=0.25, popart_beta=0.2, redq_subset=3)).replace(
        lr=1e-3, warmup_updates=1, seed=0, device="cuda")
    torch.manual_seed(0)
    agent = Agent(obs_space, spec, cfg.model, cfg.loss).cuda()
    captured = Learner(agent, cfg, torch.device("cuda"))
    eager = Learner(copy.deepcopy(agent), cfg.replace(cuda_graphs=False), torch.device("cuda"))
    return captured, eager, batch


@CUDA
def test_cuda_captured_update_equals_the_eager_update_and_never_syncs(tmp_path):
    captured, eager, batch = _cuda_learners(tmp_path)
    assert captured.graphed and not eager.graphed
    for i in range(6):
        if i == 4:  # captured at the third call: from then on a replay, which must not wait for the device
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            got = captured.update(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        want = eager.update(batch)
        for k in want:
            torch.testing.assert_close(got[k].cpu(), want[k].cpu(), rtol=1e-3, atol=1e-4, msg=f"update {i}: {k}")
    assert captured._captured.captured
    for k, v in eager.agent.state_dict().items():
        torch.testing.assert_close(captured.agent.state_dict()[k], v, rtol=1e-3, atol=1e-4, msg=k)


@CUDA
def test_cuda_eager_update_never_syncs(tmp_path):
    """The same step, uncaptured: no host read on a real device either (the FakeTensorMode tests' claim)."""
    _, eager, batch = _cuda_learners(tmp_path)
    on_device = batch.to("cuda")
    eager.update(on_device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager._step(on_device)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@CUDA
@pytest.mark.parametrize("kind", ["continuous", "discrete"])
def test_cuda_captured_acting_equals_the_host_books(kind, tmp_path):
    batch, obs_space, spec = real_batch(kind, tmp_path / "replay")
    cfg = _experiment()
    torch.manual_seed(0)
    agent = Agent(obs_space, spec, cfg.model, cfg.loss).cuda().eval()
    N = batch.shape[0]
    captured = AgentPolicy(agent, N, greedy=True, device="cuda")
    host = AgentPolicy(agent, N, greedy=True, device="cuda", static=False)
    assert captured.static and captured.graphs and not host.static
    _act_side_by_side(captured, host, batch, 3 * agent.traj_encoder.context_len, tol=1e-4)
    assert captured._steps[False].captured


def test_a_checkpoint_of_another_optimiser_kind_loads_into_the_captured_path(monkeypatch, tmp_path):
    """A run saved with the per-tensor AdamW (its step counters on the host) resumes on the captured path: the
    learner keeps its own fused / capturable choice and moves the counters to the device, so the step runs."""
    saved, batch = _learner("discrete", tmp_path, fused_adam=False)
    saved.update(batch)
    state = saved.state_dict()
    _staged(monkeypatch)
    resumed = Learner(copy.deepcopy(saved.agent), saved.cfg.replace(fused_adam=None), torch.device("cpu"))
    resumed.load_state_dict(state)
    assert all(g["fused"] and g["capturable"] for g in resumed.optimizer.param_groups)
    resumed.update(batch)
    assert resumed.scheduler.last_epoch == 2 and resumed.updates == 2
