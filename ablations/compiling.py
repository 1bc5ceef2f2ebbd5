"""torch.compile of a model, with room for it in dynamo's cache.

Dynamo keeps at most `recompile_limit` (8) compiled versions of one function, and every model the harness builds
runs the same GPT.forward: in one process that compiles many models (the paired arms and the bench's roofline, a
Hydra multirun's jobs) the ninth distinct architecture on would silently run eager while labelled compiled (a
14-arm `bench only=roofline compile=true` timed its last arms so). Each model compiled here raises the limits by a
few versions (train mode, first-step re-traces), so every model gets as much room as the first.
"""
from __future__ import annotations

import torch

ROOM = 4  # versions of GPT.forward one model may need


def compile_model(model: torch.nn.Module, **kwargs):
    """torch.compile(model, **kwargs), first making room for its versions in dynamo's limits (process-wide)."""
    import torch._dynamo

    cfg = torch._dynamo.config
    cfg.recompile_limit += ROOM
    cfg.accumulated_recompile_limit += ROOM
    return torch.compile(model, **kwargs)
