"""Ops IREE compiles but gets wrong: they run in ATen whatever the probe says.

A probe (``coverage``) says whether IREE *lowers* an op, not whether its code
means what eager means. Each rule here is a wrong answer measured on IREE 3.13
by ``benchmarks/opinfo_coverage.py`` (torch's OpInfo samples against eager), kept
with the measurement that found it. ``iree_fault`` gives the reason an op must
run in ATen, or None; the partitioner places such an op as a kernel call and
does not decompose it (its decomposition, compiled, is what was wrong). Remove a
rule when a newer IREE passes its OpInfo samples.
"""

from __future__ import annotations

import torch

__all__ = ["STABLEHLO_WRONG_LOWERINGS", "WRITES_IN_PLACE", "F64_INEXACT", "ORDER_OPS", "WRONG_LOWERINGS", "FLOAT_WRONG",
           "RANDOM_REASON", "iree_fault"]

# Ops IREE lowers to an update in place of their first operand (destination-passing
# scatters and sorts). IREE 3.13 does that in place even when the operand is a model
# input, a buffer it imported from the caller: the caller's tensor is overwritten
# (index_put, scatter_add, sort, topk) or the call fails with PERMISSION_DENIED
# (select_scatter). Such an op on a model input's storage runs in ATen.
WRITES_IN_PLACE = {f"aten::{n}" for n in (
    "index_put", "_unsafe_index_put", "index_add", "index_copy", "index_fill", "index_reduce",
    "scatter", "scatter_add", "scatter_reduce", "masked_scatter", "put", "select_scatter",
    "slice_scatter", "diagonal_scatter", "as_strided_scatter",
    "_unsafe_masked_index_put_accumulate", "sort", "topk", "argsort", "msort", "kthvalue")}
_IN_PLACE_REASON = ("IREE 3.13 would write its result into the caller's input buffer "
                    "(an in-place update of memory it imported)")

# copies IREE folds away, so an in-place op lands in the copied input's buffer
_FOLDED_COPIES = {"aten::clone", "aten::alias", "aten::_to_copy", "aten::lift_fresh_copy",
                  "aten::contiguous", "aten::copy"}

# Ops IREE lowers in float64 with a lower internal precision: in f64 they run in
# ATen. SDPA is 2.6e-6 off eager (relative); rad2deg 8.4e-7 (a float32 constant).
F64_INEXACT = {"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
               "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::rad2deg"}

# Sorting ops: IREE's sort is not stable (indices differ from eager's on ties, common
# in integers and bools) and compares i1 as signed (a bool sort puts True first).
# They run in ATen on integers and bools, and wherever their indices are used.
ORDER_OPS = {"aten::sort", "aten::topk", "aten::argsort", "aten::msort", "aten::kthvalue"}

# Ops torch-mlir lowers to StableHLO with another meaning than eager's: on this path
# they run in ATen whatever the probe says (``iree_faults.iree_fault``). Each rule is a
# wrong answer measured with torch-mlir 20261001 (tests/backend/test_stablehlo.py).
STABLEHLO_WRONG_LOWERINGS = {
    # remainder(-7, 3): eager 2 (the divisor's sign), StableHLO's remainder -1 (fmod)
    "aten::remainder": "torch-mlir lowers it to stablehlo.remainder, which takes the "
                       "dividend's sign (fmod), not the divisor's",
}

# Lowerings (or torch decompositions compiled by IREE) measured wrong on OpInfo samples.
WRONG_LOWERINGS = {
    # downsampling 4 -> 3: IREE rounds (i + 0.5) * scale at exact ties differently
    "aten::_upsample_nearest_exact1d": "IREE's index arithmetic rounds exact ties away from "
                                       "eager's (nearest-exact downsampling, 6 of 18 wrong)",
    "aten::_upsample_nearest_exact2d": "IREE's index arithmetic rounds exact ties away from "
                                       "eager's (nearest-exact downsampling)",
    "aten::_upsample_nearest_exact3d": "IREE's index arithmetic rounds exact ties away from "
                                       "eager's (nearest-exact downsampling)",
    # kernel 3, stride 2 (overlapping windows): one element of six lost
    "aten::max_unpool2d": "IREE's max_unpool drops values when kernel and stride differ",
    "aten::max_unpool3d": "IREE's max_unpool drops values when kernel and stride differ",
    "aten::logcumsumexp": "IREE's logcumsumexp returns inf for finite inputs",
    "aten::embedding_bag": "IREE's embedding_bag sums wrong bags (per-sample weights, offsets)",
    "aten::_embedding_bag": "IREE's embedding_bag sums wrong bags (per-sample weights, offsets)",
    "aten::grid_sampler": "IREE's grid_sampler samples wrong pixels (bilinear, zeros padding)",
    "aten::grid_sampler_2d": "IREE's grid_sampler samples wrong pixels (bilinear, zeros padding)",
}


# Lowerings wrong on edge values of floating-point operands (issue 35's corpus): IREE's
# fmod computes through the quotient, so a large one loses the result (float32
# 1e30 fmod 7: off by 2.8e22; 1.1e12 fmod 1e-3 gave -2.4e-7, eager 1.0e-3); ATen's is
# exact, as IEEE fmod is.
FLOAT_WRONG = {"aten::fmod": "IREE's fmod of floats loses the result when the quotient "
                              "is large (1e30 fmod 7 off by 2.8e22); ATen's is exact"}
# the index of a maximum or minimum: eager's is the first NaN's where a slice holds one,
# IREE's skips NaN (argmax of [nan, 1, inf] is 0 in eager, 2 compiled)
_NAN_INDEX = ("IREE's index of the maximum/minimum skips NaN, where eager's is the NaN's "
              "index")
FLOAT_WRONG.update({"aten::argmax": _NAN_INDEX, "aten::argmin": _NAN_INDEX})
_NAN_INDEX_OVERLOADS = {("aten::max", "dim"), ("aten::min", "dim")}  # (values, indices)


# Random ops (``torch.Tag.nondeterministic_seeded``: dropout in training, bernoulli,
# multinomial, rand/randn and their _like forms...): IREE draws from its own generator,
# so a compiled one gives other values than eager under the same ``torch.manual_seed``
# (multinomial's lowering also ran for over 90 s). In ATen they draw from torch's
# generator, in program order: an artifact draws exactly what eager draws.
RANDOM_REASON = ("a random op: ATen draws from torch's generator, so under the same "
                 "torch.manual_seed it draws what eager draws (IREE's generator would not)")


# uint8 (IREE's signless i8) widened inside an op: products, comparisons and sums that
# mix uint8 with another dtype, or reduce it to a wider one, treat 128..255 as negative
# (uint8 128 * int32 3 gave -384, uint8 200 < int32 -5 was True, the int64 sum of
# [0, 1, 127, 128, 200, 255] was -57); uint8 to uint8 (add, clamp, amax) and conversions
# (zero-extended) are right. Such ops run in ATen (the issue 35 corpus found them).
UINT8_REASON = ("IREE 3.13 widens uint8 as signed inside mixed-dtype ops and reductions "
                "(128..255 become negative)")
# conversions (zero-extended) compute nothing on the values; a select (``where``) is
# judged by its values, not its bool condition
_CONVERSIONS = {"aten::_to_copy", "prims::convert_element_type"}


def _widens_uint8(n: torch.fx.Node) -> bool:
    """An ATen op computing on uint8 values alongside, or into, another dtype (our
    quantized ops' decompositions are judged op by op once decomposed)."""
    if n.target.namespace not in ("aten", "prims") or n.target._schema.name in _CONVERSIONS:
        return False
    operands = n.args[1:] if n.target._schema.name == "aten::where" else n.all_input_nodes
    vals = [_val(a) for a in operands] + [n.meta.get("val")]
    dtypes = {v.dtype for x in vals for v in (x if isinstance(x, (list, tuple)) else [x])
              if isinstance(v, torch.Tensor)}
    return torch.uint8 in dtypes and len(dtypes) > 1


def _val(a):
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else a


def _tensor_dtype(a) -> torch.dtype | None:
    v = _val(a)
    return v.dtype if isinstance(v, torch.Tensor) else None


def updates_input(n: torch.fx.Node, user_inputs: set) -> bool:
    """``n`` updates a model input's storage in place (through views and copies of it)."""
    if not isinstance(n.target, torch._ops.OpOverload) or \
            n.target._schema.name not in WRITES_IN_PLACE or not n.args:
        return False
    a = n.args[0]
    while isinstance(a, torch.fx.Node) and a.op == "call_function" and \
            isinstance(a.target, torch._ops.OpOverload) and a.args and \
            (a.target._schema.name in _FOLDED_COPIES or (
                a.target._schema.returns and a.target._schema.returns[0].alias_info is not None)):
        a = a.args[0]  # a view (the same storage), or a copy IREE elides
    return isinstance(a, torch.fx.Node) and a.name in user_inputs


def _indices_used(n: torch.fx.Node) -> bool:
    """A sorting op's indices result has a reader (argsort: its only result)."""
    if n.target._schema.name == "aten::argsort":
        return True
    return any(u.target.__name__ == "getitem" and u.args[1] == 1 and u.users
               for u in n.users if u.op == "call_function" and hasattr(u.target, "__name__"))


def _draws(n: torch.fx.Node) -> bool:
    """``n`` draws random numbers: a ``nondeterministic_seeded`` op, unless its
    arguments turn the randomness off (attention with ``dropout_p`` 0, a dropout or
    rrelu with ``train``/``training`` False), as in every inference graph."""
    if torch.Tag.nondeterministic_seeded not in n.target.tags:
        return False
    for i, arg in enumerate(n.target._schema.arguments):
        if arg.name not in ("dropout_p", "train", "training"):
            continue
        v = n.kwargs.get(arg.name, n.args[i] if i < len(n.args) else arg.default_value)
        if v is False or (arg.name == "dropout_p" and v == 0):
            return False
    return True


def _bool_to_complex(n: torch.fx.Node) -> bool:
    """A conversion of a bool tensor to a complex one (IREE gives True as -1 + 0j)."""
    out = _tensor_dtype(n)
    return (out is not None and out.is_complex and bool(n.args)
            and _tensor_dtype(n.args[0]) == torch.bool)


def iree_fault(n: torch.fx.Node, user_inputs: set, via: str = "torch") -> str | None:
    """Why ``n`` must run in ATen although IREE lowers it, or None. ``via="stablehlo"``:
    also the ops torch-mlir lowers to StableHLO wrongly (``STABLEHLO_WRONG_LOWERINGS``)."""
    if not isinstance(n.target, torch._ops.OpOverload):
        return None
    name = n.target._schema.name
    if via == "stablehlo":
        if name in STABLEHLO_WRONG_LOWERINGS:
            return STABLEHLO_WRONG_LOWERINGS[name]
    if updates_input(n, user_inputs):
        return _IN_PLACE_REASON
    if _draws(n):
        return RANDOM_REASON
    if _widens_uint8(n):
        return UINT8_REASON
    if name in F64_INEXACT and any(_tensor_dtype(a) == torch.float64
                                   for a in n.all_input_nodes):
        return "IREE computes it in float64 with a lower internal precision: ATen keeps eager's"
    if name in ORDER_OPS and n.args:
        dt = _tensor_dtype(n.args[0])
        if dt is not None and not dt.is_floating_point:
            return (f"IREE's sort compares {str(dt).replace('torch.', '')} differently from "
                    "eager (unstable on ties; bool as signed)")
        if _indices_used(n):
            return "IREE's sort is not stable: on ties its indices are not eager's"
    if name in WRONG_LOWERINGS:
        return WRONG_LOWERINGS[name]
    floats = any((_tensor_dtype(a) or torch.int8).is_floating_point for a in n.all_input_nodes)
    if name in FLOAT_WRONG and floats:
        return FLOAT_WRONG[name]
    if (name, n.target._overloadname) in _NAN_INDEX_OVERLOADS and floats:
        return _NAN_INDEX
    if _bool_to_complex(n):
        return "IREE converts True to -1 + 0j"
    return None
