"""Compiled reductions of half-precision tensors accumulate in float32, as ATen's do.

ATen reduces ``float16`` and ``bfloat16`` tensors (sums, means, norms, softmax, layer
and group norm, cumulative sums and products) in float32 and rounds the result once to
the input's dtype. IREE 3.13 accumulates in the input's own dtype: over a long
reduction a float16 sum overflows (65504 is its largest value: a layer norm over 2 M
elements returns NaN) or loses every digit the running total cannot hold (a mean of
4 M values near 12 was off by 12). The rewrite widens the half operands to float32,
runs the op there, and narrows its result to the dtype the program records: ATen's
arithmetic, up to summation order.
"""

from __future__ import annotations

import torch

from .rewrite_nodes import emit_node, shadow, source_meta

__all__ = ["reductions_in_float"]

aten = torch.ops.aten
_HALF = (torch.float16, torch.bfloat16)
_OPS = {aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default,
        aten._softmax.default, aten._log_softmax.default, aten.softmax.int,
        aten.log_softmax.int, aten.logsumexp.default,
        aten.cumsum.default, aten.prod.default, aten.prod.dim_int,
        aten.linalg_vector_norm.default, aten.layer_norm.default, aten.group_norm.default}


def _val(a):
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else None


def _dtype_given(node: torch.fx.Node) -> bool:
    """The call names its result's dtype (``sum(x, dtype=...)``): left as it is."""
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.name == "dtype":
            v = node.kwargs.get("dtype", node.args[i] if i < len(node.args) else None)
            return v is not None
    return False


def reductions_in_float(node: torch.fx.Node, g: torch.fx.Graph, env: dict
                        ) -> torch.fx.Node | None:
    """For a compiled reduction (``_OPS``) of a float16/bfloat16 tensor with a result of
    the same dtype: emit it into ``g`` on float32 copies of its half operands, its
    result narrowed back; None for anything else."""
    if node.op != "call_function" or node.target not in _OPS or _dtype_given(node):
        return None
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor) or out.dtype not in _HALF:
        return None
    if node.target is aten._softmax.default and node.args[2]:  # half_to_float: already
        return None
    keep = source_meta(node)
    args, vals = [], []
    for a in node.args:
        v = _val(a)
        if isinstance(v, torch.Tensor) and v.dtype in _HALF:
            wide = shadow(v).to(torch.float32)
            n = emit_node(g, aten._to_copy.default, (env[a],), wide, keep)
            n.kwargs = {"dtype": torch.float32}
            args.append(n)
            vals.append(wide)
        elif isinstance(a, torch.fx.Node):
            args.append(env[a])
            vals.append(shadow(v))
        else:
            args.append(a)
            vals.append(a)
    if not any(isinstance(v, torch.Tensor) and v.dtype == torch.float32 for v in vals):
        return None
    kwargs = {k: env[v] if isinstance(v, torch.fx.Node) else v for k, v in node.kwargs.items()}
    wide_out = node.target(*vals, **{k: _val(v) if isinstance(v, torch.fx.Node) else v
                                     for k, v in node.kwargs.items()})
    y = emit_node(g, node.target, tuple(args), wide_out, keep)
    y.kwargs = kwargs
    narrow = emit_node(g, aten._to_copy.default, (y,), out, keep)
    narrow.kwargs = {"dtype": out.dtype}
    narrow.meta = {**dict(node.meta), "val": out}
    return narrow
