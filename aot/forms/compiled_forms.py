"""The forms the partitioner emits for compiled ops that IREE runs badly as written.

Each rewrite computes the op's own arithmetic in ops IREE 3.13 compiles well
(each module says what IREE does with the op as written): convolutions as matmuls or
shifted multiply-adds (``conv_rewrites``), attention as two matmuls around a
softmax (``attention_rewrites``), global average pooling as a mean
(``pool_rewrites``), linear layers on 3-D and 4-D inputs as 2-D ones
(``linear_rewrites``), integer floor division as truncating division and a
correction (``int_division``: IREE's goes through floating point, wrong past 2**24),
variance, standard deviation and layer norm in two passes (``var_rewrites``: IREE's one
pass cancels where the mean is large), reductions of float16/bfloat16 tensors in float32
(``half_rewrites``: IREE accumulates in the half type, which overflows or loses the
total over a long reduction), maximum, minimum and the clamps with NaN selected where an
operand is NaN (``nan_rewrites``: IREE's min/max return the other operand), integer
negation as a subtraction from zero (``int_negation``: IREE's goes through floating point). ``emit`` is the one entry point: the partitioner calls it for
every compiled op, the cost probe for the one-op graphs it times, so both measure
and build the same form.

A portable export (``--emit stablehlo``, ``aot.export_stablehlo``) is for other
consumers than IREE: it keeps the ops as written (``stablehlo.convolution`` for a
convolution), but for the exact rewrites of ops whose usual lowerings lose precision
(``_EXACT``), which are right for every consumer.
"""

from __future__ import annotations

import torch

from ..importer.dynamic import is_symbolic_value
from .attention_rewrites import attention_as_matmuls
from .conv_rewrites import conv_as_matmul, depthwise_as_nhwc, depthwise_as_shifts
from .linear_rewrites import linear_as_2d
from .int_division import floor_division_exact
from .pool_rewrites import global_pool_as_mean
from .var_rewrites import layer_norm_two_pass, variance_two_pass
from .half_rewrites import reductions_in_float
from .nan_rewrites import nan_propagating
from .int_negation import negation_exact

__all__ = ["FORMS", "emit"]

# names the compiled forms; part of the cost cache's key (``cost``), so a measurement
# of an op's older form is not reused
FORMS = ("conv-as-matmul-4+depthwise-nhwc-1+depthwise-as-shifts-3+attention-as-matmuls-2"
         "+global-pool-as-mean-1+linear-as-2d-2+int-floor-division-1+variance-two-pass-1"
         "+half-reductions-in-float-1+nan-propagating-1+int-negation-1+layer-norm-two-pass-1")
_REWRITES = (conv_as_matmul, depthwise_as_shifts, attention_as_matmuls, global_pool_as_mean,
             linear_as_2d, floor_division_exact, variance_two_pass, layer_norm_two_pass,
             reductions_in_float,
             nan_propagating, negation_exact)
# the forms that also take sizes following a dynamic dimension (``dynamic_shapes``)
_SYMBOLIC = (linear_as_2d, floor_division_exact, reductions_in_float, nan_propagating,
             negation_exact)
# the forms that are about exactness, not IREE's speed: a portable export keeps these only
_EXACT = (floor_division_exact, variance_two_pass, layer_norm_two_pass, reductions_in_float)


def emit(node: torch.fx.Node, g: torch.fx.Graph, env: dict, named: bool = False,
         portable: bool = False) -> torch.fx.Node | None:
    """Emit ``node``'s compiled form into ``g`` (operands through ``env``) and return
    its result node; None when ``node`` compiles as it is (the caller copies it).
    ``named``: the target takes ``linalg_kernels`` ops (``named_kernels``).
    ``portable``: for a portable export, only the exact rewrites (``_EXACT``)."""
    if node.op != "call_function":
        return None
    symbolic = _follows_symbols(node)
    if named and not symbolic and not portable:
        new = depthwise_as_nhwc(node, g, env)
        if new is None:
            new = conv_as_matmul(node, g, env, named=True)
        if new is not None:
            return new
    for rewrite in _REWRITES:
        if symbolic and rewrite not in _SYMBOLIC:
            continue  # it reads static sizes: a dynamic dimension keeps the op as written
        if portable and rewrite not in _EXACT:
            continue
        new = rewrite(node, g, env)
        if new is not None:
            return new
    return None


def _follows_symbols(node: torch.fx.Node) -> bool:
    vals = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    return is_symbolic_value(vals)
