"""Networks: timestep encoder -> trajectory encoder -> actor / critic heads (docs/design.md §3)."""

from icrl.nets.squash import symlog
from icrl.nets.traj import (
    FFTrajEncoder,
    GRUTrajEncoder,
    LSTMTrajEncoder,
    RNNTrajEncoder,
    TrajEncoder,
    make_traj_encoder,
)
from icrl.nets.transformer import KVCache, SigmaReparamLinear, TransformerTrajEncoder
from icrl.nets.tstep import ImpalaCNN, NatureCNN, RunningNorm, TimestepEncoder

__all__ = [
    "FFTrajEncoder",
    "GRUTrajEncoder",
    "ImpalaCNN",
    "KVCache",
    "LSTMTrajEncoder",
    "NatureCNN",
    "RNNTrajEncoder",
    "RunningNorm",
    "SigmaReparamLinear",
    "TimestepEncoder",
    "TrajEncoder",
    "TransformerTrajEncoder",
    "make_traj_encoder",
    "symlog",
]
