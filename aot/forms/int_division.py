"""Compiled integer floor division as truncating division and a correction.

IREE 3.13 lowers ``div(a, b, rounding_mode="floor")`` and ``floor_divide`` of integer
tensors through floating point, which holds integers exactly only up to 2**24
(float32) or 2**53 (float64): ``9223372036854775806 // 1073741824`` came out
8589934592, not 8589934591, and int32 ``2147483646 // 3`` 715827904, not 715827882.
Its truncating division and its integer multiply and subtract are exact. So a
compiled floor division of integers is ``q = trunc(a / b)``, ``r = a - q * b``, and
``q - 1`` where ``r`` is nonzero and its sign differs from ``b``'s: the floor of the
quotient by definition, in integer arithmetic only, equal to ATen's for every value
ATen defines (division by zero is an error in ATen and undefined here).
"""

from __future__ import annotations

import torch

from .rewrite_nodes import emit_node as _emit, shadow, source_meta

__all__ = ["floor_division_exact"]

aten = torch.ops.aten
_FLOOR_OPS = {aten.div.Tensor_mode, aten.div.Scalar_mode, aten.floor_divide.default,
              aten.floor_divide.Scalar}


def _val(a):
    return shadow(a.meta.get("val")) if isinstance(a, torch.fx.Node) else a


def _integer_floor_division(n: torch.fx.Node) -> bool:
    if n.op != "call_function" or n.target not in _FLOOR_OPS or len(n.args) < 2 \
            or not isinstance(n.args[0], torch.fx.Node):
        return False
    if n.target in (aten.div.Tensor_mode, aten.div.Scalar_mode) \
            and n.kwargs.get("rounding_mode") != "floor":
        return False
    out = n.meta.get("val")
    return (isinstance(out, torch.Tensor) and not out.dtype.is_floating_point
            and not out.dtype.is_complex and out.dtype != torch.bool
            and not isinstance(n.args[1], float))


def floor_division_exact(node: torch.fx.Node, g: torch.fx.Graph, env: dict
                         ) -> torch.fx.Node | None:
    """For a compiled floor division of integers: emit it into ``g`` as truncating
    division and a correction (module docstring), operands through ``env``; return the
    result node, or None."""
    if not _integer_floor_division(node):
        return None
    keep = source_meta(node)
    a, b = node.args[0], node.args[1]
    av, bv = _val(a), _val(b)
    ea = env[a] if isinstance(a, torch.fx.Node) else a
    eb = env[b] if isinstance(b, torch.fx.Node) else b
    out = node.meta["val"]
    tensor_b = isinstance(b, torch.fx.Node)
    qv = torch.div(av, bv, rounding_mode="trunc")
    q = _emit(g, aten.div.Tensor_mode, (ea, eb), qv, keep)
    q.kwargs = {"rounding_mode": "trunc"}
    pv = qv * bv
    p = _emit(g, aten.mul.Tensor, (q, eb), pv, keep)
    rv = av - pv
    r = _emit(g, aten.sub.Tensor, (ea, p), rv, keep)
    # r and b of opposite signs: r < 0 where b > 0 (a scalar's sign is known here)
    if tensor_b:
        rneg_v, bneg_v = rv < 0, bv < 0
        rneg = _emit(g, aten.lt.Scalar, (r, 0), rneg_v, keep)
        bneg = _emit(g, aten.lt.Scalar, (eb, 0), bneg_v, keep)
        diff_v = rneg_v != bneg_v
        diff = _emit(g, aten.ne.Tensor, (rneg, bneg), diff_v, keep)
    else:
        diff_v = rv > 0 if bv < 0 else rv < 0
        diff = _emit(g, aten.gt.Scalar if bv < 0 else aten.lt.Scalar, (r, 0), diff_v, keep)
    nz_v = rv != 0
    nz = _emit(g, aten.ne.Scalar, (r, 0), nz_v, keep)
    fix_v = nz_v & diff_v
    fix = _emit(g, aten.bitwise_and.Tensor, (nz, diff), fix_v, keep)
    low_v = qv - 1
    low = _emit(g, aten.sub.Scalar, (q, 1), low_v, keep)
    y = _emit(g, aten.where.self, (fix, low, q), out, keep)
    y.meta = {**dict(node.meta), "val": out}
    return y
