"""What the CPU kernels' tests share: a call as torch.compile traces it, with the graphs dynamo made."""
from __future__ import annotations

import torch


def traced(fn, *args):
    """fn(*args) through torch.compile with a backend that keeps dynamo's graphs and runs them as traced (no
    inductor: cheap) -> (the result, the set of ops each graph calls). Dynamo's caches are reset before and after,
    so the call is traced here, whatever ran before."""
    graphs = []

    def recording(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm

    torch._dynamo.reset()
    try:
        out = torch.compile(fn, backend=recording)(*args)
    finally:
        torch._dynamo.reset()
    return out, graphs
