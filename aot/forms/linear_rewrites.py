"""Compiled linear layers on inputs of more than two dimensions as 2-D ones.

IREE 3.13 lowers ``linear(x, w, b)`` with ``x`` of shape ``[..., k]`` (three or more
dimensions: a transformer's ``[batch, tokens, width]``, ConvNeXt's channels-last
``[batch, h, w, channels]``) as a batched matmul against the weight broadcast over
every leading index but the last: it copies the weight once per batch row, every
call, and in a large model those copies can take most of a call's time
(``benchmarks/dispatch_profile.py`` shows them as ``elementwise_broadcast_*``
dispatches). As
``reshape(linear(reshape(x, [-1, k]), w, b), [..., n])`` it is one matmul over all
rows against the weight as it is. The rows are the same dot products, so the rewrite
is exact up to summation order.
"""

from __future__ import annotations

import functools
import math

import torch

from ..importer.dynamic import is_symbolic_value
from .rewrite_nodes import emit_node, source_meta

__all__ = ["linear_as_2d"]

aten = torch.ops.aten


def linear_as_2d(node: torch.fx.Node, g: torch.fx.Graph, env: dict) -> torch.fx.Node | None:
    """For a compiled ``aten.linear`` whose input has more than two dimensions: emit it
    into ``g`` as a 2-D linear between two reshapes, operands through ``env``; return
    the result node, or None (the caller copies the node as it is)."""
    if node.op != "call_function" or node.target != aten.linear.default or node.kwargs:
        return None
    x, w = node.args[0], node.args[1]
    b = node.args[2] if len(node.args) > 2 else None
    xv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    wv = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
    out = node.meta.get("val")
    if xv is None or wv is None or out is None or xv.dim() <= 2 or wv.dim() != 2:
        return None
    if is_symbolic_value([wv, xv.shape[-1]]):
        return None  # a dynamic width or weight: left as written
    emit = functools.partial(emit_node, g, keep=source_meta(node))
    k, n = int(xv.shape[-1]), int(wv.shape[0])
    lead = list(xv.shape[:-1])
    if is_symbolic_value(lead):
        # leading sizes that follow a dynamic dimension: -1 rows, and the sizes read back
        # from the input (``sym_size``) to restore them
        rows = -1
        back = [emit(aten.sym_size.int, (env[x], d), s) if is_symbolic_value(s) else int(s)
                for d, s in enumerate(lead)] + [n]
    else:
        rows = math.prod(int(d) for d in lead)
        back = list(out.shape)
    flat = emit(aten.reshape.default, (env[x], [rows, k]), xv.reshape(rows, k))
    mm = emit(aten.linear.default, (flat, env[w], env[b] if b is not None else None),
              out.reshape(rows, n))
    y = emit(aten.reshape.default, (mm, back), out)
    y.meta = {**dict(node.meta), "val": out}
    return y
