"""Compiled maximum, minimum and clamps propagate NaN, as ATen's do.

IREE 3.13 lowers ``maximum``/``minimum`` and the clamps (``clamp``, ``clamp_min``,
``clamp_max``, ``hardtanh``, so ``relu6``) to the floating-point min/max that return
the other operand when one is NaN: ``maximum(nan, 0)`` is 0 and ``clamp(nan, -1, 1)``
is -1, where eager gives NaN. The rewrite keeps the op and selects NaN where an operand
is NaN (``where(isnan(x), x, clamp(x))``; for two tensors, their sum, which is NaN
then): one more select in the same elementwise dispatch.
"""

from __future__ import annotations

import torch

from .rewrite_nodes import emit_node, shadow, source_meta

__all__ = ["nan_propagating"]

aten = torch.ops.aten
# op -> the positions of the operands whose NaN the result carries
_OPS = {aten.maximum.default: (0, 1), aten.minimum.default: (0, 1),
        aten.clamp.default: (0,), aten.clamp.Tensor: (0, 1, 2),
        aten.clamp_min.default: (0,), aten.clamp_max.default: (0,),
        aten.clamp_min.Tensor: (0, 1), aten.clamp_max.Tensor: (0, 1),
        aten.hardtanh.default: (0,), aten.relu6.default: (0,)}


def _val(a):
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else None


def nan_propagating(node: torch.fx.Node, g: torch.fx.Graph, env: dict) -> torch.fx.Node | None:
    """For a compiled ``_OPS`` op with a floating-point result: emit it into ``g`` with
    NaN selected where its operands hold NaN; None for anything else."""
    if node.op != "call_function" or node.target not in _OPS:
        return None
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor) or not out.dtype.is_floating_point:
        return None
    nodes = [node.args[i] for i in _OPS[node.target]
             if i < len(node.args) and isinstance(_val(node.args[i]), torch.Tensor)]
    nodes += [v for k, v in node.kwargs.items()
              if k in ("min", "max") and isinstance(_val(v), torch.Tensor)]
    floats = [a for a in nodes if _val(a).dtype.is_floating_point]
    if not floats:
        return None
    keep = source_meta(node)
    args = tuple(env[a] if isinstance(a, torch.fx.Node) else a for a in node.args)
    y = emit_node(g, node.target, args, shadow(out), keep)
    y.kwargs = {k: env[v] if isinstance(v, torch.fx.Node) else v for k, v in node.kwargs.items()}
    # the NaN to select: the operand itself, or the sum of the operands (NaN where any is)
    nan, nan_v = env[nodes[0]], shadow(_val(nodes[0]))
    for a in nodes[1:]:
        nan_v = nan_v + shadow(_val(a))
        nan = emit_node(g, aten.add.Tensor, (nan, env[a]), nan_v, keep)
    is_v = torch.isnan(nan_v)
    is_nan = emit_node(g, aten.isnan.default, (nan,), is_v, keep)
    if nan_v.dtype != out.dtype:
        nan_v = nan_v.to(out.dtype)
        nan = emit_node(g, aten._to_copy.default, (nan,), nan_v, keep)
        nan.kwargs = {"dtype": out.dtype}
    res_v = torch.where(is_v, nan_v, shadow(out))
    res = emit_node(g, aten.where.self, (is_nan, nan, y), res_v, keep)
    res.meta = {**dict(node.meta), "val": out}
    return res
