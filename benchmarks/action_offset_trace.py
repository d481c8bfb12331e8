"""`action_offset_probe.py` per update instead of per checkpoint: train exactly as `icrl train ARGS` does and trace,
on the update's own batch, what the acting policy is taught and what it plays.

    python benchmarks/action_offset_trace.py OUT.jsonl train --env ... --run-dir RUN_DIR [any icrl train flag]

Every 5th update (before it) one JSON line: `batch_dq` (Q(·, 1) - Q(·, 0) of the acting discount,
ensemble mean, PopArt units, over the batch's steps with an action), `batch_dq_piw` (the same weighted by
π(0|h) π(1|h): what the critic-driven term's gradient reads), `batch_dq_member_sd` (the standard deviation of
that difference over the critic ensemble's members, averaged over the batch's steps), `batch_p1` (π(1|h)
averaged over those steps) and `data_a1` (the batch's share of action 1). Two-action tasks; a checkpoint's
snapshot can miss what the policy follows between checkpoints (docs/results.md, PositionOnlyCartPoleEasy), this
does not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repo root, for `import icrl`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.action_offset_probe import acting_discount  # noqa: E402
from icrl.types import Batch  # noqa: E402


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] != "train":
        raise SystemExit(__doc__)
    every = 5
    from icrl.agent import learner
    from icrl.cli import main as icrl_main

    step = learner.Learner._step
    count = 0

    def traced(self: learner.Learner, batch: Batch) -> torch.Tensor:
        nonlocal count
        if count % every == 0:
            agent, was_training = self.agent, self.agent.training
            agent.eval()
            with torch.no_grad():
                q_c, p, acted = acting_discount(agent, batch)  # [B, L, C, A], [B, L, A], [B, L]
                q = q_c.mean(-2)  # [B, L, A]: ensemble mean
                if q.shape[-1] != 2:
                    raise SystemExit(f"the trace reads two-action tasks; this one has {q.shape[-1]} actions")
                m = acted.float()  # [B, L]
                w = p[..., 0] * p[..., 1] * m
                dq = q[..., 1] - q[..., 0]
                dq_sd = (q_c[..., 1] - q_c[..., 0]).std(-1)  # [B, L]: how far the members disagree on it
                row = {"update": count, "batch_dq": float((m * dq).sum() / m.sum()),
                       "batch_dq_piw": float((w * dq).sum() / w.sum()),
                       "batch_dq_member_sd": float((m * dq_sd).sum() / m.sum()),
                       "batch_p1": float((m * p[..., 1]).sum() / m.sum()),
                       "data_a1": float((m * batch.action[..., 1].float()).sum() / m.sum())}
            agent.train(was_training)
            out.write(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}) + "\n")
            out.flush()
        count += 1
        return step(self, batch)

    learner.Learner._step = traced  # type: ignore[method-assign]
    with open(sys.argv[1], "w") as out:
        icrl_main(sys.argv[2:])


if __name__ == "__main__":
    main()
