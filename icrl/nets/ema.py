"""Target networks: the EMA copies of the online heads (docs/design.md §4). `ema_update_` moves any module's
parameters and floating-point buffers a fraction τ towards another's; the learner moves the target actor and
critics with it after every update.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def ema_update_(target: nn.Module, online: nn.Module, tau: float, apply: torch.Tensor | None = None) -> None:
    """target <- (1 - tau) * target + tau * online, for parameters and floating-point buffers.

    Non-float buffers (counters, masks) are copied. Both modules must have the same structure
    (target is usually `copy.deepcopy(online)`). `apply` (a 0-dim bool tensor): where False, the target
    stays exactly as it is, decided on the device (a skipped update reads nothing back to the host).
    """
    t_params, o_params = list(target.parameters()), list(online.parameters())
    if len(t_params) != len(o_params):
        raise ValueError("ema_update_: target and online modules have different parameter lists")
    t_float, o_float = [p.data for p in t_params], [p.data for p in o_params]
    for tb, ob in zip(target.buffers(), online.buffers(), strict=True):
        if tb.is_floating_point():
            t_float.append(tb)
            o_float.append(ob)
        else:
            tb.copy_(ob)
    if not t_float:
        return
    # Fused multi-tensor kernels: one launch for all tensors instead of one per parameter.
    if apply is None:
        torch._foreach_mul_(t_float, 1.0 - tau)
        torch._foreach_add_(t_float, o_float, alpha=tau)
        return
    new = torch._foreach_mul(t_float, 1.0 - tau)
    torch._foreach_add_(new, o_float, alpha=tau)
    # t (1 - w) + new w with w in {0, 1}: exactly `new` or exactly `t` (both finite: online weights are)
    w = apply.to(t_float[0].dtype)
    torch._foreach_mul_(t_float, 1.0 - w)
    torch._foreach_mul_(new, w)
    torch._foreach_add_(t_float, new)
