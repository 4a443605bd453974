"""Compiled integer negation as a subtraction from zero.

IREE 3.13 lowers ``neg`` of an integer tensor through floating point: values past
2**24 (int32) or 2**53 (int64) lose their low bits, and ``-(2**63 - 1)`` comes back as
``-2**63`` (the issue 35 corpus: 4 of 16 int64 edge values wrong). ``0 - x`` in the
integer type is what eager computes, wrapping at the minimum as it does.
"""

from __future__ import annotations

import torch

from .rewrite_nodes import emit_node, source_meta

__all__ = ["negation_exact"]

aten = torch.ops.aten


def negation_exact(node: torch.fx.Node, g: torch.fx.Graph, env: dict) -> torch.fx.Node | None:
    """For a compiled ``neg`` of an integer tensor: emit ``0 - x`` into ``g``; else None."""
    if node.op != "call_function" or node.target is not aten.neg.default:
        return None
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor) or out.dtype.is_floating_point or out.is_complex() \
            or out.dtype == torch.bool:
        return None
    y = emit_node(g, aten.rsub.Scalar, (env[node.args[0]], 0), out, source_meta(node))
    y.meta = {**dict(node.meta), "val": out}
    return y
