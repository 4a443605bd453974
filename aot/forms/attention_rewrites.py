"""Compiled attention as two batched matmuls around a softmax.

IREE 3.13 lowers ``scaled_dot_product_attention`` to its attention op, which its
CPU backend runs several times slower than the same arithmetic written out as
``bmm -> softmax -> bmm``. The IREE backend writes the written-out form for the
attention it compiles (``attention_as_matmuls``), the cost probe times the same
form. Rewritten: no dropout, not causal, no GQA, no mask, a floating-point
additive mask or a boolean one (False: masked out, as ``-inf``); others keep the op.
``softmax(q k^T * scale + mask) v`` is the definition of the op, so the rewrite is
exact up to summation order. A row masked out everywhere gives zeros, as eager's
(its softmax is taken as all zeros, not ``0/0``); IREE's own attention op gives NaN
there, so a masked attention is always rewritten. Static and dynamic sizes alike (a
dynamic batch or length: IREE's attention op on a dynamic length is slower still).
"""

from __future__ import annotations

import functools
import math

import torch

from ..importer.dynamic import is_symbolic_value
from .rewrite_nodes import emit_node, source_meta

__all__ = ["attention_as_matmuls"]

aten = torch.ops.aten


def _val(a):
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else None


def _plan(n: torch.fx.Node) -> dict | None:
    if n.op != "call_function" or n.target != aten.scaled_dot_product_attention.default:
        return None
    names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    a = dict(zip(names, n.args))
    a.update(n.kwargs)
    q, k, v, mask = (_val(a.get(x)) for x in ("query", "key", "value", "attn_mask"))
    if q is None or k is None or v is None or q.dim() < 3 or len({q.dim(), k.dim(), v.dim()}) != 1:
        return None
    if a.get("dropout_p", 0.0) or a.get("is_causal", False) or a.get("enable_gqa", False):
        return None
    # (sizes that follow a dynamic dimension compare as the same symbol, or not; a
    # comparison torch cannot make raises, caught by ``attention_as_matmuls``)
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2] \
            or q.shape[-1] != k.shape[-1] or not q.dtype.is_floating_point:
        return None
    if a.get("attn_mask") is not None and (mask is None or not (
            mask.dtype.is_floating_point or mask.dtype == torch.bool)):
        return None
    scale = a.get("scale")
    return {"q": a["query"], "k": a["key"], "v": a["value"], "mask": a.get("attn_mask"),
            "scale": float(scale) if scale is not None else 1.0 / math.sqrt(int(q.shape[-1]))}


def attention_as_matmuls(node: torch.fx.Node, g: torch.fx.Graph, env: dict) -> torch.fx.Node | None:
    """Emit a compiled SDPA node into ``g`` as ``bmm(softmax(bmm(q, k^T) * scale [+ mask]), v)``
    (batch dimensions flattened), operands through ``env``; None leaves it as it is.
    Sizes that follow a dynamic dimension (a prompt's length) are read back from the
    operands (``sym_size``), the flattened batch as ``-1``."""
    try:
        plan = _plan(node)
        if plan is None or is_symbolic_value([_val(plan[x]).shape[-1] for x in "qkv"]):
            return None  # the head width must be known
    except Exception:  # noqa: BLE001  (sizes torch cannot read here: left as written)
        return None
    emit = functools.partial(emit_node, g, keep=source_meta(node))

    def size(x, d: int):
        """Dimension ``d`` of operand ``x``: an int, or a ``sym_size`` node where dynamic."""
        n = _val(plan[x]).shape[d]
        return emit(aten.sym_size.int, (env[plan[x]], d), n) if is_symbolic_value(n) else int(n)
    qv, kv, vv = _val(plan["q"]), _val(plan["k"]), _val(plan["v"])
    rank = qv.dim()
    e, ev = int(qv.shape[-1]), int(vv.shape[-1])
    lead = [size("q", d) for d in range(rank - 2)]
    lq, lk = size("q", rank - 2), size("k", rank - 2)
    q3v, k3v, v3v = qv.reshape(-1, qv.shape[-2], e), kv.reshape(-1, kv.shape[-2], e), \
        vv.reshape(-1, vv.shape[-2], ev)
    q3 = emit(aten.reshape.default, (env[plan["q"]], [-1, lq, e]), q3v)
    k3 = emit(aten.reshape.default, (env[plan["k"]], [-1, lk, e]), k3v)
    v3 = emit(aten.reshape.default, (env[plan["v"]], [-1, lk, ev]), v3v)
    ktv = k3v.transpose(1, 2)
    kt = emit(aten.transpose.int, (k3, 1, 2), ktv)
    sv = torch.bmm(q3v, ktv)
    s = emit(aten.bmm.default, (q3, kt), sv)
    s = emit(aten.mul.Tensor, (s, plan["scale"]), sv)
    if plan["mask"] is not None:
        mv = _val(plan["mask"])
        s4v = sv.reshape(*qv.shape[:-2], qv.shape[-2], kv.shape[-2])
        s4 = emit(aten.reshape.default, (s, [*lead, lq, lk]), s4v)
        if mv.dtype == torch.bool:  # False masks out: -inf where it is False
            offv = torch.logical_not(mv)
            off = emit(aten.logical_not.default, (env[plan["mask"]],), offv)
            s4v = s4v.masked_fill(offv, float("-inf"))
            s4 = emit(aten.masked_fill.Scalar, (s4, off, float("-inf")), s4v)
        else:
            s4v = s4v + mv
            s4 = emit(aten.add.Tensor, (s4, env[plan["mask"]]), s4v)
        # a row masked out everywhere (its max -inf) is zeros, as eager's; NaN scores
        # stay NaN (their max is NaN)
        p4v = torch.softmax(s4v, -1)
        p4 = emit(aten._softmax.default, (s4, -1, False), p4v)
        mxv = torch.amax(s4v, -1, keepdim=True)
        mx = emit(aten.amax.default, (s4, [-1], True), mxv)
        deadv = mxv == float("-inf")
        dead = emit(aten.eq.Scalar, (mx, float("-inf")), deadv)
        p4v = torch.where(deadv, 0.0, p4v)
        p4 = emit(aten.where.ScalarSelf, (dead, 0.0, p4), p4v)
        pv = p4v.reshape(-1, qv.shape[-2], kv.shape[-2])
        p = emit(aten.reshape.default, (p4, [-1, lq, lk]), pv)
    else:
        pv = torch.softmax(sv, -1)
        p = emit(aten._softmax.default, (s, -1, False), pv)
    ov = torch.bmm(pv, v3v)
    o = emit(aten.bmm.default, (p, v3), ov)
    out = node.meta["val"]
    y = emit(aten.reshape.default, (o, [*lead, lq, ev]), out)
    y.meta = {**dict(node.meta), "val": out}
    return y
