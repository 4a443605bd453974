"""FLOP counts of ops where torch knows a formula (convolutions, matmuls, attention)."""

from __future__ import annotations

import contextlib

import torch
import torch.fx
from torch.fx.node import map_aggregate
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from ..importer.dynamic import is_symbolic_value, meta_at_hints
from .signatures import op_signature

__all__ = ["node_flops"]

# counts of static op signatures: a compile asks about each node several times
# (placement, the region and tiling rules), and most models repeat their shapes
_COUNTS: dict[str, int | None] = {}
_MAX_COUNTS = 4096


def _may_count(op: torch._ops.OpOverload) -> bool:
    """Whether running ``op`` can reach a FLOP formula: it has one, or it decomposes into
    other ops (``conv2d`` into ``convolution``). Elementwise ops have none: not run (a
    compile asks about every node, and running each on fake tensors adds up)."""
    return op.overloadpacket in flop_registry or op.has_kernel_for_dispatch_key(
        torch._C.DispatchKey.CompositeImplicitAutograd)


def node_flops(node: torch.fx.Node) -> int | None:
    """FLOPs of one node from its fake tensors, or None where torch has no formula."""
    vals = map_aggregate(node.args, lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a)
    kw = map_aggregate(node.kwargs, lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a)
    fake_mode = torch._guards.detect_fake_mode(vals)
    if fake_mode is None or not isinstance(node.target, torch._ops.OpOverload) \
            or not _may_count(node.target):
        return None
    symbolic = is_symbolic_value(list(torch.utils._pytree.tree_leaves((vals, kw))))
    key = None if symbolic else op_signature(node)
    if key in _COUNTS:
        return _COUNTS[key]
    flops = _count(node.target, vals, kw, fake_mode, symbolic)
    if key is not None:
        if len(_COUNTS) >= _MAX_COUNTS:
            _COUNTS.clear()
        _COUNTS[key] = flops
    return flops


def _count(op, vals, kw, fake_mode, symbolic: bool) -> int | None:
    try:
        if symbolic:
            # a dynamic program: counted at the example's sizes, on meta tensors, so
            # that asking never specializes a symbol (a data-dependent size has no
            # example value: no count)
            vals, kw = map_aggregate((vals, kw), meta_at_hints)
            fake_mode = contextlib.nullcontext()
        with fake_mode, FlopCounterMode(display=False) as counter:
            op(*vals, **kw)
    except Exception:  # a formula is a nicety, never a failure
        return None
    total = counter.get_total_flops()
    return int(total) if total else None
