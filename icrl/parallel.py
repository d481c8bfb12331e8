"""The processes of a run: one, or N data-parallel ranks (docs/design.md §8), on Hugging Face Accelerate.

`Collectives` is what a data-parallel update needs of the processes it runs in (the learner, icrl.agent.learner,
names only this shape); `OneProcess` is the single process, every collective the identity; `Replicas` adds what
the run loop needs (ranks, seeds, barriers, weight hashes), and `_Ranks` is its multi-process form.

`torchrun --nproc_per_node N -m icrl train ...` (or `accelerate launch` on GPUs) starts N copies of the
ordinary `icrl train`. `init_replicas` tells them apart from the launcher's environment variables
(`WORLD_SIZE`, `RANK`, ...); without them it returns the single-process `Replicas` and nothing changes
(accelerate is not even imported).

What the N ranks share and what they do not:

* every rank collects with its own env copies and exploration (seeded from `rank_seed`), writes its
  rollouts into the one shared replay folder (DiskReplay takes several writers) and samples its own
  `batch_size` windows from all ranks' rollouts: the optimiser sees N x batch_size windows per update;
* gradients are averaged by DistributedDataParallel (Accelerate's `prepare`) before the optimiser step,
  so every rank applies the same step to the same weights;
* statistics that buffers accumulate from batches would drift apart if each rank fed its own batch, so
  the learner feeds them the rows of *all* ranks (`gather_rows`, `gather_padded`): PopArt's moments (which
  also rescale the critics' output layers) and the observation RunningNorm see the global batch, identically
  on every rank. EMA targets follow identical online weights; σReparam's power iteration is a function of
  the (identical) weights alone. DDP's per-forward buffer broadcast is therefore switched off;
* rank 0 alone writes the run directory's logs, checkpoints, plots and final weights and evaluates;
  `fingerprints` lets it check, at every checkpoint, that all ranks still hold bit-identical states.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from typing import Any, Protocol

import torch
from torch import nn

from icrl.config import ConfigError
from icrl.device import resolve_device
from icrl.seeding import derive_seed


class Collectives(Protocol):
    """What a data-parallel update needs of the processes it runs in: the collectives the learner calls.
    `Replicas` provides them; the learner names only this shape (docs/design.md §8). One process is
    `OneProcess`: the same update with every collective the identity."""

    world_size: int

    def wrap(self, module: nn.Module) -> nn.Module: ...
    def broadcast_(self, module: nn.Module) -> None: ...
    def max(self, values: list[int]) -> list[int]: ...
    def reduce_sum(self, x: torch.Tensor) -> torch.Tensor: ...
    def gather_rows(self, x: torch.Tensor, max_rows: int) -> torch.Tensor: ...
    def gather_padded(self, x: torch.Tensor, mask: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]: ...


class OneProcess:
    """The `Collectives` of a single process: every collective is the identity (no copy, no host sync), so
    the learner has one update for one process and for N, and one process computes exactly what it would
    without any collective. `Replicas` extends it with what the run loop needs."""

    world_size: int = 1

    def wrap(self, module: nn.Module) -> nn.Module:
        """`module` whose backward averages gradients over the ranks."""
        return module

    def broadcast_(self, module: nn.Module) -> None:
        """Copy rank 0's parameters and buffers into every rank's `module`, in place."""

    def max(self, values: list[int]) -> list[int]:
        """Element-wise maximum of a list of integers over the ranks."""
        return list(values)

    def reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        """`x` summed over the ranks, on its device (no host sync); non-finite if any rank's `x` is."""
        return x

    def gather_rows(self, x: torch.Tensor, max_rows: int) -> torch.Tensor:
        """Concatenate every rank's float rows `x` [N_rank, D] in rank order: [sum N, D]. `max_rows`: the
        largest N_rank (from `max`), so one collective suffices."""
        return x

    def gather_padded(self, x: torch.Tensor, mask: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Concatenate float batches [B, L_rank, ...] and their bool masks [B, L_rank] along B, padded to
        `length` (the largest L_rank, from `max`; padding masked out): [N B, length, ...], [N B, length]."""
        return x, mask


def launched_world_size() -> int:
    """The process count a launcher (torchrun, accelerate launch) announced; 1 without one."""
    return int(os.environ.get("WORLD_SIZE", "1"))


class Replicas(OneProcess):
    """The processes of one data-parallel run and the few collectives the training loop needs.

    The base class is the single process (world size 1): every collective is the identity (the learner's
    own ones come from `OneProcess`), so code written against `Replicas` reads the same in both cases.
    `init_replicas` returns the multi-process subclass under a launcher.
    """

    rank: int = 0
    world_size: int = 1

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @property
    def is_main(self) -> bool:
        """The rank that writes the run directory (logs, checkpoints, plots) and evaluates."""
        return self.rank == 0

    def rank_seed(self, seed: int) -> int:
        """This rank's seed for its envs, exploration and sampler: the run's seed on rank 0."""
        return seed if self.rank == 0 else derive_seed(seed, "rank", self.rank)

    def barrier(self) -> None:
        """Wait until every rank gets here."""

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of a list of numbers over the ranks."""
        return list(values)

    def gather_json(self, value: Any) -> list[Any]:
        """Every rank's JSON-serialisable `value`, in rank order (small data, e.g. per-task sums whose keys
        differ between ranks; sent as JSON text, never pickled)."""
        return [json.loads(json.dumps(value))]

    def all_ready(self, ready: bool) -> bool:
        """True when every rank is `ready`: all ranks update or none, since DDP steps in lockstep."""
        return self.sum([float(ready)])[0] == self.world_size

    def average(self, metrics: dict[str, float]) -> dict[str, float]:
        """`metrics` averaged over the ranks' batches (one process: as they are)."""
        return metrics

    def checkpoint_record(self, module: nn.Module) -> dict[str, object]:
        """What a checkpoint records of the ranks: nothing for one process; see `_Ranks`."""
        return {}

    def fingerprints(self, module: nn.Module) -> list[str]:
        """Every rank's SHA-256 of `module`'s state (parameters and buffers), in rank order; raises
        RuntimeError naming the tensors that differ from rank 0's."""
        return [state_sha256(module)]

    def close(self) -> None:
        """Leave the process group."""


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def tensor_digests(module: nn.Module) -> dict[str, bytes]:
    """SHA-256 (32 bytes) of every state-dict tensor's raw bytes, by name."""
    return {k: hashlib.sha256(_tensor_bytes(v)).digest() for k, v in module.state_dict().items()}


def state_sha256(module: nn.Module) -> str:
    """One hex digest of a module's whole state (names, dtypes, shapes and bytes of every tensor)."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        h.update(_tensor_bytes(tensor))
    return h.hexdigest()


class _Ranks(Replicas):
    """Several processes under a launcher, with Accelerate's process group and device placement."""

    def __init__(self, accelerator) -> None:
        super().__init__(accelerator.device)
        self.accelerator = accelerator
        self.rank = accelerator.process_index
        self.world_size = accelerator.num_processes

    def wrap(self, module: nn.Module) -> nn.Module:
        with warnings.catch_warnings():  # torch >= 2.13 renames broadcast_buffers; accelerate passes the old name
            warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
            return self.accelerator.prepare_model(module)

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()

    @torch.no_grad()
    def broadcast_(self, module: nn.Module) -> None:
        for tensor in module.state_dict().values():
            torch.distributed.broadcast(tensor, src=0)

    def sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def _all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(x) for _ in range(self.world_size)]
        torch.distributed.all_gather(out, x.contiguous())
        return out

    def gather_json(self, value: Any) -> list[Any]:
        data = json.dumps(value).encode("utf-8")
        (longest,) = self.max([len(data)])
        packed = torch.zeros(longest + 8, dtype=torch.uint8, device=self.device)  # 8 bytes of length, then the text
        packed[:8] = torch.frombuffer(bytearray(len(data).to_bytes(8, "little")), dtype=torch.uint8)
        packed[8 : 8 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # JSON text is never empty
        out = []
        for p in self._all_gather(packed):
            raw = p.cpu().numpy().tobytes()
            out.append(json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")].decode("utf-8")))
        return out

    def max(self, values: list[int]) -> list[int]:
        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return t.tolist()

    def reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        t = x.detach().float().clone()  # float32: every back-end sums it; a NaN or inf on any rank stays one
        torch.distributed.all_reduce(t)
        return t

    # Each gather is one collective (collectives cost ~1 ms each on a CPU, more when it is shared): the row
    # count travels in an extra first row, the mask as an extra channel.
    def gather_rows(self, x: torch.Tensor, max_rows: int) -> torch.Tensor:
        packed = x.new_zeros((max_rows + 1, x.shape[1]))  # [1 + max N, D]
        packed[0] = x.shape[0]
        packed[1 : x.shape[0] + 1] = x
        return torch.cat([p[1 : int(p[0, 0]) + 1] for p in self._all_gather(packed)])

    def gather_padded(self, x: torch.Tensor, mask: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        B, L = mask.shape
        packed = x.new_zeros((B, length, x[0, 0].numel() + 1))  # [B, length, prod(...) + 1]
        packed[:, :L, :-1] = x.reshape(B, L, -1)
        packed[:, :L, -1] = mask
        every = torch.cat(self._all_gather(packed))  # [N B, length, prod(...) + 1]
        return every[..., :-1].reshape(-1, length, *x.shape[2:]), every[..., -1] > 0

    def average(self, metrics: dict[str, float]) -> dict[str, float]:
        return dict(zip(metrics, (v / self.world_size for v in self.sum(list(metrics.values())))))

    def checkpoint_record(self, module: nn.Module) -> dict[str, object]:
        """The process count (resuming with another one rescales the per-rank env-step counter) and every
        rank's state hash: computing them raises if the ranks diverged, so a bad state is never saved."""
        return {"world_size": self.world_size, "replica_sha256": self.fingerprints(module)}

    def fingerprints(self, module: nn.Module) -> list[str]:
        digests = tensor_digests(module)  # the same names in the same order on every rank
        mine = torch.tensor([list(d) for d in digests.values()], dtype=torch.uint8, device=self.device)  # [K, 32]
        every = self._all_gather(mine)
        names = list(digests)
        diverged = sorted({names[i] for r in every[1:] for i in (r != every[0]).any(-1).nonzero().flatten().tolist()})
        if diverged:
            raise RuntimeError(
                f"data-parallel ranks hold different states in {len(diverged)} tensors (first: {diverged[:5]}); "
                "this is a bug in icrl's synchronisation, please report it with the command you ran"
            )
        digest = state_sha256(module)
        return [digest] * self.world_size

    def close(self) -> None:
        """Leave the process group (no barrier: on an error the other ranks may never arrive). Accelerate's
        reference to the DDP wrapper is dropped, so the wrapper is freed with the run rather than at
        interpreter shutdown (see agent.learner.LossModule)."""
        if torch.distributed.is_initialized():
            self.accelerator.free_memory()
            torch.distributed.destroy_process_group()


def init_replicas(device_name: str) -> Replicas:
    """`Replicas` for this process: the single process, or (under a launcher) this rank of N.

    Under a launcher each rank takes its own GPU (`device_name` auto/cuda) or the CPU (`cpu`, gloo
    back-end). Needs `pip install 'icrl[distributed]'` (accelerate) then; raises ConfigError without it.
    """
    if launched_world_size() <= 1:
        return Replicas(resolve_device(device_name))
    try:
        from accelerate import Accelerator, DistributedDataParallelKwargs
    except ImportError as e:
        raise ConfigError(
            f"this process was started by a launcher with WORLD_SIZE={launched_world_size()}: data-parallel "
            "training needs Hugging Face Accelerate: pip install 'icrl[distributed]'"
        ) from e
    cpu = device_name == "cpu" or not torch.cuda.is_available()
    # Buffers are kept identical by construction (see the module docstring): no per-forward broadcast.
    # (Without the broadcast DDP also skips syncing buffers at start: the Learner broadcasts the agent.)
    ddp = DistributedDataParallelKwargs(broadcast_buffers=False)
    # Precision is the config's --dtype (the learner's own autocast), whatever `accelerate launch` says.
    return _Ranks(Accelerator(cpu=cpu, mixed_precision="no", kwargs_handlers=[ddp]))
