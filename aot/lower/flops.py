"""FLOP counts of ops where torch knows a formula (convolutions, matmuls, attention)."""

from __future__ import annotations

import torch
import torch.fx
from torch.fx.node import map_aggregate

__all__ = ["node_flops"]


def node_flops(node: torch.fx.Node) -> int | None:
    """FLOPs of one node from its fake tensors, or None where torch has no formula."""
    from torch.utils.flop_counter import FlopCounterMode
    vals = map_aggregate(node.args, lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a)
    kw = map_aggregate(node.kwargs, lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a)
    fake_mode = torch._guards.detect_fake_mode(vals)
    if fake_mode is None or not isinstance(node.target, torch._ops.OpOverload):
        return None
    try:
        with fake_mode, FlopCounterMode(display=False) as counter:
            node.target(*vals, **kw)
    except Exception:  # a formula is a nicety, never a failure
        return None
    total = counter.get_total_flops()
    return int(total) if total else None
