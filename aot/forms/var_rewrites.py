"""Compiled variance, standard deviation and layer norm in two passes: the mean, then the
squared deviations from it.

IREE 3.13 computes ``var`` / ``std`` (and ``layer_norm``'s variance) in one pass (the mean of the squares less the
square of the mean), which cancels catastrophically where the mean is large against
the spread: for float32 values a few units wide around 1e4 the result can be wholly
wrong, where ATen's is exact to float32 rounding. Two passes are the textbook stable
form: the deviations are small, so their squares sum without cancelling. IREE's
float32 sums themselves lose digits on large values, so both passes run on the
values less each slice's first element (the shifted-data form: the variance does not
change, and the values summed are about the spread). Half-precision inputs are
widened to float32 first, as ATen accumulates them.
"""

from __future__ import annotations

import math

import torch

from .rewrite_nodes import emit_node as _emit, shadow, source_meta

__all__ = ["variance_two_pass", "layer_norm_two_pass"]

aten = torch.ops.aten
# op -> takes the root; the ``.dim`` overloads (``x.var([2, 3])``) say ``unbiased``
_OPS = {aten.var.correction: False, aten.std.correction: True,
        aten.var.dim: False, aten.std.dim: True}
_UNBIASED = (aten.var.dim, aten.std.dim)


def _deviations(g: torch.fx.Graph, x: torch.fx.Node, xv, dims: list, keep: dict, env: dict):
    """``(dev, dev value, sq, sq value)``: each value's deviation from its slice's mean
    over ``dims`` and its square, in float32 for half inputs. Both passes run on the
    values less each slice's first element: the values summed are then about the
    spread, not the mean (IREE's float32 sums lose digits on large values)."""
    cur, val = env[x], shadow(xv)
    if val.dtype in (torch.float16, torch.bfloat16):
        val = val.to(torch.float32)
        cur = _emit(g, aten._to_copy.default, (cur,), val, keep)
        cur.kwargs = {"dtype": torch.float32}
    k_cur, k_val = cur, val
    for d in dims:
        k_val = k_val.narrow(d, 0, 1)
        k_cur = _emit(g, aten.slice.Tensor, (k_cur, d, 0, 1), k_val, keep)
    val = val - k_val
    cur = _emit(g, aten.sub.Tensor, (cur, k_cur), val, keep)
    mean_v = val.mean(dims, keepdim=True)
    mean = _emit(g, aten.mean.dim, (cur, dims, True), mean_v, keep)
    dev_v = val - mean_v
    dev = _emit(g, aten.sub.Tensor, (cur, mean), dev_v, keep)
    sq_v = dev_v * dev_v
    sq = _emit(g, aten.mul.Tensor, (dev, dev), sq_v, keep)
    return dev, dev_v, sq, sq_v


def variance_two_pass(node: torch.fx.Node, g: torch.fx.Graph, env: dict
                      ) -> torch.fx.Node | None:
    """For a compiled ``var`` / ``std`` (``.correction``) of a floating tensor: emit it
    into ``g`` as the sum of squared deviations from the mean over ``n - correction``
    (and its square root), operands through ``env``; return the result node, or None."""
    if node.op != "call_function" or node.target not in _OPS:
        return None
    x = node.args[0]
    xv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    out = node.meta.get("val")
    if xv is None or not isinstance(out, torch.Tensor) or not xv.dtype.is_floating_point:
        return None
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if node.target in _UNBIASED:  # (self, dim, unbiased=True, keepdim=False)
        unbiased = node.args[2] if len(node.args) > 2 else node.kwargs.get("unbiased", True)
        correction = 1 if unbiased else 0
        keepdim = bool(node.args[3] if len(node.args) > 3 else node.kwargs.get("keepdim", False))
    else:
        correction = node.kwargs.get("correction")
        correction = 1 if correction is None else correction
        keepdim = bool(node.kwargs.get("keepdim", False))
    dims = list(range(xv.dim())) if not dim else sorted({d % max(xv.dim(), 1) for d in dim})
    n = math.prod(int(xv.shape[d]) for d in dims) if xv.dim() else 1
    keep = source_meta(node)
    _, _, sq, sq_v = _deviations(g, x, xv, dims, keep, env)
    s_v = sq_v.sum(dims, keepdim=keepdim)
    s = _emit(g, aten.sum.dim_IntList, (sq, dims, keepdim), s_v, keep)
    d = max(n - correction, 0)  # torch divides by zero here too: inf or nan
    v_v = s_v / d
    y = _emit(g, aten.div.Scalar, (s, d), v_v, keep)
    if _OPS[node.target]:
        y = _emit(g, aten.sqrt.default, (y,), v_v.sqrt(), keep)
    if out.dtype != v_v.dtype:
        y = _emit(g, aten._to_copy.default, (y,), out, keep)
        y.kwargs = {"dtype": out.dtype}
    y.meta = {**dict(node.meta), "val": out}
    return y


def layer_norm_two_pass(node: torch.fx.Node, g: torch.fx.Graph, env: dict
                        ) -> torch.fx.Node | None:
    """For a compiled ``layer_norm`` of a floating tensor: emit it into ``g`` with its
    mean and variance in two passes over the values less each slice's first element, as
    ``variance_two_pass`` (IREE's own lowering takes the variance in one pass, which
    cancels where the mean is large: values near 1e4 normalised to garbage). Half
    inputs are widened to float32 first and the result narrowed, as ATen computes."""
    if node.op != "call_function" or node.target is not aten.layer_norm.default:
        return None
    names = ("input", "normalized_shape", "weight", "bias", "eps")
    a = dict(zip(names, node.args))
    a.update({k: v for k, v in node.kwargs.items() if k in names})
    x, out = a["input"], node.meta.get("val")
    xv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if xv is None or not isinstance(out, torch.Tensor) or not xv.dtype.is_floating_point:
        return None
    eps = float(a.get("eps", 1e-5) if a.get("eps") is not None else 1e-5)
    dims = list(range(xv.dim() - len(a["normalized_shape"]), xv.dim()))
    keep = source_meta(node)
    dev, dev_v, sq, sq_v = _deviations(g, x, xv, dims, keep, env)
    var_v = sq_v.mean(dims, keepdim=True)
    var = _emit(g, aten.mean.dim, (sq, dims, True), var_v, keep)
    var_v = var_v + eps
    var = _emit(g, aten.add.Scalar, (var, eps), var_v, keep)
    r_v = var_v.rsqrt()
    r = _emit(g, aten.rsqrt.default, (var,), r_v, keep)
    y_v = dev_v * r_v
    y = _emit(g, aten.mul.Tensor, (dev, r), y_v, keep)
    for name, op in (("weight", aten.mul.Tensor), ("bias", aten.add.Tensor)):
        p = a.get(name)
        if p is not None:
            pv = shadow(p.meta["val"]).to(y_v.dtype)
            pc = env[p]
            if p.meta["val"].dtype != y_v.dtype:
                pc = _emit(g, aten._to_copy.default, (pc,), pv, keep)
                pc.kwargs = {"dtype": y_v.dtype}
            y_v = y_v * pv if name == "weight" else y_v + pv
            y = _emit(g, op, (y, pc), y_v, keep)
    if out.dtype != y_v.dtype:
        y = _emit(g, aten._to_copy.default, (y,), out, keep)
        y.kwargs = {"dtype": out.dtype}
    y.meta = {**dict(node.meta), "val": out}
    return y
