"""What a device is and what it can do fast: the torch device a `--device` name means, the fused AdamW kernel,
and bf16 matmuls on a CPU.

Probed here, apart from the update (icrl.agent.learner), so the update reads as the method and the probes
can be tested (and monkeypatched) on their own; every layer may ask (the run's setup, `icrl.load`, the learner).
"""

from __future__ import annotations

import warnings

import torch


def resolve_device(name: str) -> torch.device:
    """The torch device a `--device` name means; "auto" picks CUDA when this torch build sees a GPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def use_fused_adam(choice: bool | None, device: torch.device) -> bool:
    """`OptimConfig.fused_adam`, with None resolved to whether torch has the fused AdamW kernel for `device`'s
    type (CPU, CUDA, MPS, ... in recent torch), so an unset choice never fails on a device without it."""
    if choice is not None:
        return choice
    try:  # a private torch helper; without it, fuse on CUDA only (fused CPU AdamW came later than CUDA)
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:
        return device.type == "cuda"
    return device.type in _get_fused_kernels_supported_devices()


# CPU features that multiply bf16 matrices in hardware, per `torch.cpu.get_capabilities()["architecture"]`.
NATIVE_BF16_FEATURES = {"x86_64": ("avx512_bf16", "amx_bf16"), "aarch64": ("bf16", "sve_bf16"),
                        "arm64": ("bf16", "sve_bf16")}


def cpu_bf16_is_native() -> bool | None:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX on x86, BF16 on ARM). Without them
    torch emulates bf16 matmuls: on an AMD EPYC (Zen 3, AVX2 only; torch 2.13, 1 thread) a big torch.mm ran at
    0.18 GFLOP/s in bf16 against 41 in fp32, and a learner update (d128, context 64, batch 24;
    benchmarks/throughput.py) took 5.2 s in bf16 against 0.51 s in fp32. None where torch does not say
    (torch without `torch.cpu.get_capabilities`, another architecture)."""
    get = getattr(torch.cpu, "get_capabilities", None)
    if get is None:
        return None
    caps = get()
    features = NATIVE_BF16_FEATURES.get(str(caps.get("architecture", "")))
    return None if features is None else any(bool(caps.get(f, False)) for f in features)


def cpu_has_amx() -> bool | None:
    """Whether this x86 CPU has AMX bf16 tiles: what makes bf16 matmuls faster than fp32 on a CPU. AVX512-BF16
    alone only converts and takes dot products: on a Xeon with AVX512-BF16 but no AMX (torch 2.13, 1 thread) a big
    torch.mm ran at 39 GFLOP/s in bf16 against 127 in fp32, and a learner update (d64, context 501) took the
    same time in both. None off x86 or where torch does not say."""
    get = getattr(torch.cpu, "get_capabilities", None)
    if get is None:
        return None
    caps = get()
    return bool(caps.get("amx_bf16", False)) if caps.get("architecture") == "x86_64" else None


def warn_if_bf16_is_emulated(dtype: str, device: torch.device) -> bool:
    """Warn (once per run: the learner is built once) when `--dtype bf16` would run on a CPU that emulates
    bf16, or on an x86 CPU without AMX, where it brings no speed; True when it warned. A warning, not a
    refusal: the numbers are still right."""
    if dtype != "bf16" or device.type != "cpu":
        return False
    native = cpu_bf16_is_native()
    if native is False:
        warnings.warn("icrl: --dtype bf16 on a CPU without bf16 instructions (no AVX512-BF16 or AMX): torch emulates "
                      "its matmuls and an update runs ~10x slower than in fp32; pass --dtype fp32 (bf16 pays off on "
                      "CPUs with AMX and on GPUs)", RuntimeWarning, stacklevel=3)
        return True
    if native and cpu_has_amx() is False:
        warnings.warn("icrl: --dtype bf16 on an x86 CPU without AMX: its bf16 matmuls are no faster than fp32 (an "
                      "update measured the same time in both), so bf16 only saves memory here; --dtype fp32 runs as "
                      "fast (bf16 pays off on CPUs with AMX and on GPUs)", RuntimeWarning, stacklevel=3)
        return True
    return False
