"""The forms the IREE backend writes compiled ops in where IREE runs them badly as written.

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
negation as a subtraction from zero (``int_negation``: IREE's goes through floating point).

``emit`` is the one rewrite of one op: ``apply``, the IREE backend's pass over a
partitioned program's graph (``aot.backend.lower``), calls it for every compiled op, the
cost probe for the one-op graphs it times, so both measure and build the same form.

A portable export (``--emit stablehlo``, ``aot.export_stablehlo``) is for other
consumers than IREE: it keeps the ops as written (``stablehlo.convolution`` for a
convolution), but for the exact rewrites of ops whose usual lowerings lose precision
(``_EXACT``), which are right for every consumer.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor

from ..importer.dynamic import is_symbolic_value
from ..importer.fx_import import copy_graph
from .attention_rewrites import attention_as_matmuls
from .conv_rewrites import conv_as_matmul, depthwise_as_nhwc, depthwise_as_shifts
from .linear_rewrites import linear_as_2d
from .int_division import floor_division_exact
from .pool_rewrites import global_pool_as_mean
from .var_rewrites import layer_norm_two_pass, variance_two_pass
from .half_rewrites import reductions_in_float
from .nan_rewrites import nan_propagating
from .int_negation import negation_exact

__all__ = ["FORMS", "emit", "apply"]

# names the compiled forms; part of the cost cache's key (``cost``), so a measurement
# of an op's older form is not reused
FORMS = ("conv-as-matmul-4+depthwise-nhwc-1+depthwise-as-shifts-3+attention-as-matmuls-3"
         "+global-pool-as-mean-1+linear-as-2d-2+int-floor-division-1+variance-two-pass-1"
         "+half-reductions-in-float-1+nan-propagating-1+int-negation-1+layer-norm-two-pass-1")
_REWRITES = (conv_as_matmul, depthwise_as_shifts, attention_as_matmuls, global_pool_as_mean,
             linear_as_2d, floor_division_exact, variance_two_pass, layer_norm_two_pass,
             reductions_in_float,
             nan_propagating, negation_exact)
# the forms that also take sizes following a dynamic dimension (``dynamic_shapes``)
_SYMBOLIC = (linear_as_2d, attention_as_matmuls, floor_division_exact, reductions_in_float, nan_propagating,
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


def apply(graph: torch.fx.Graph, named: bool = False, portable: bool = False
          ) -> torch.fx.Graph:
    """A copy of the partitioned ``graph`` with every compiled op in its form (``emit``);
    kernel calls (``aot_kc`` ops) and ops that compile as they are, copied.

    The partitioned graph holds its weights as tensors (``stateless_graph``), where
    ``emit`` reads operands as nodes with a value: each tensor operand is read as a
    stand-in node whose value is a fake tensor of it (in the fake mode of the op's own
    values) and whose ``env`` entry is the tensor itself, so a form that reorders a
    weight reorders the tensor once, here."""
    scratch = torch.fx.Graph()  # the stand-ins and the ops as ``emit`` reads them
    return copy_graph(graph, lambda node, g, env: None if _is_kernel_call(node) else emit(
        _reading_nodes(node, scratch, env), g, env, named, portable))


def _is_kernel_call(node: torch.fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "aot_kc"


def _reading_nodes(node: torch.fx.Node, scratch: torch.fx.Graph, env: dict) -> torch.fx.Node:
    """``node``, or where an operand is a tensor, a node of ``scratch`` that reads a
    stand-in for it instead (see ``apply``)."""
    if not any(isinstance(a, torch.Tensor) for a in (*node.args, *node.kwargs.values())):
        return node
    mode = _fake_mode(node)

    def stand_in(a):
        if not isinstance(a, torch.Tensor):
            return a
        s = scratch.call_function(torch.ops.aten.alias.default, ())
        s.meta["val"] = mode.from_tensor(a, static_shapes=True) if mode is not None else \
            torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
        env[s] = a
        return s
    read = scratch.call_function(node.target, tuple(stand_in(a) for a in node.args),
                                 {k: stand_in(v) for k, v in node.kwargs.items()})
    read.meta = node.meta
    return read


def _fake_mode(node: torch.fx.Node):
    """The fake mode of ``node``'s values (its operands' values are computed with it)."""
    for v in pytree.tree_leaves([node.meta.get("val")] +
                                [a.meta.get("val") for a in node.all_input_nodes]):
        if isinstance(v, FakeTensor):
            return v.fake_mode
    return None


def _follows_symbols(node: torch.fx.Node) -> bool:
    vals = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    return is_symbolic_value(vals)
