"""Compiled ops written as one linalg op, for the forms Torch ops cannot spell.

A depthwise convolution runs well in IREE 3.13 only as the named
``linalg.depthwise_conv_2d_nhwc_hwc`` on channels-last operands (its CPU pipeline
decomposes it to 1-D convolutions vectorised along the channels); torch-mlir emits the
NCHW one, which runs several times slower (``conv_rewrites``). So the compiled form
(``conv_rewrites.depthwise_as_nhwc``) permutes the input and the weight to channels-last
in Torch ops and calls ``aot_cc::depthwise_nhwc``, an op with no Torch lowering; the
importer emits it as ``torch.operator "torch.aot_cc.depthwise_nhwc"``, and ``expand``
turns each into a call of a private function holding the named op (IREE inlines it).
The function holds the named op in a ``flow.dispatch.region`` of its own, which keeps
IREE from folding the permutations into the convolution: folded, it becomes a generic
convolution that runs at the NCHW form's speed. (An ``util.optimization_barrier`` would
do the same, but IREE's stream scheduler waits on the host at every barrier: a depthwise
network then makes about two host round trips per convolution, which doubled
MobileNetV3-Small's call on IREE's task workers.)

``aot_cc::im2col`` is a convolution's im2col columns as one copy whose innermost loop
runs along an output row (``conv_rewrites.conv_as_matmul``): torch-mlir's ``unfold`` and
permutation make a copy whose innermost loop runs across the taps, and slices make one
dispatch and one executable per tap.

Like the kernel-call placeholders (``kernel_call_op``), the op exists only between
partitioning and ``expand``; its eager kernel (ATen's convolution) is for shape
inference and tests.
"""

from __future__ import annotations

import torch

from .._mlir import ir
from ..errors import InternalError

__all__ = ["NAMESPACE", "depthwise_nhwc", "expand", "im2col", "named_kernels"]

NAMESPACE = "aot_cc"
_lib = torch.library.Library(NAMESPACE, "FRAGMENT")
_lib.define("depthwise_nhwc(Tensor x, Tensor w, int sh, int sw) -> Tensor")
_lib.define("im2col(Tensor x, int kh, int kw, int sh, int sw) -> Tensor")


def _depthwise_nhwc(x: torch.Tensor, w: torch.Tensor, sh: int, sw: int) -> torch.Tensor:
    """``x`` ``[n, h, w, c]`` (padded already), ``w`` ``[kh, kw, c]``: the depthwise
    convolution's ``[n, ho, wo, c]`` (ATen's kernel, through NCHW)."""
    c = x.shape[3]
    y = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w.permute(2, 0, 1).unsqueeze(1),
                                   None, (sh, sw), 0, 1, c)
    return y.permute(0, 2, 3, 1).contiguous()


_lib.impl("depthwise_nhwc", _depthwise_nhwc, "CompositeExplicitAutograd")
depthwise_nhwc = torch.ops.aot_cc.depthwise_nhwc.default


def _im2col(x: torch.Tensor, kh: int, kw: int, sh: int, sw: int) -> torch.Tensor:
    """``x`` ``[n, c, h, w]`` (padded already): its ``[n, c, kh, kw, ho, wo]`` windows,
    tap ``(i, j)``'s at ``[:, :, i, j]``."""
    return x.unfold(2, kh, sh).unfold(3, kw, sw).permute(0, 1, 4, 5, 2, 3).contiguous()


_lib.impl("im2col", _im2col, "CompositeExplicitAutograd")
im2col = torch.ops.aot_cc.im2col.default

def named_kernels(target) -> bool:
    """Whether the compiled forms for ``target`` may call these ops: IREE's CPU backend
    from the Torch dialect (torch-mlir's StableHLO path cannot carry them; on CUDA they
    are not measured)."""
    return target.backend == "llvm-cpu" and target.via == "torch"


_ELEMENT = {"f32": "f32"}  # operand element types the named op is emitted for


def _int(value) -> int:
    """The integer a ``torch.constant.int`` operand holds."""
    op = value.owner
    if op.name != "torch.constant.int":
        raise InternalError(f"{NAMESPACE}: a size or stride that is not a constant")
    return ir.IntegerAttr(op.attributes["value"]).value


def _builtin(vtensor: str) -> str:
    """``tensor<1x18x18x144xf32>`` for ``!torch.vtensor<[1,18,18,144],f32>``."""
    inner = vtensor.removeprefix("!torch.vtensor<[").removesuffix(">")
    dims, elem = inner.split("],")
    if elem not in _ELEMENT or "?" in dims or "-1" in dims:
        raise InternalError(f"{NAMESPACE} on {vtensor}: not emitted for it")
    return f"tensor<{'x'.join(dims.split(','))}x{_ELEMENT[elem]}>"


def _function(name: str, x: str, w: str, y: str, sh: int, sw: int) -> str:
    elem = y.rsplit("x", 1)[1].removesuffix(">")
    return f"""func.func private @{name}(%x: {x}, %w: {w}) -> {y} {{
  %r = flow.dispatch.region -> ({y}) {{
    %zero = arith.constant 0.0 : {elem}
    %empty = tensor.empty() : {y}
    %init = linalg.fill ins(%zero : {elem}) outs(%empty : {y}) -> {y}
    %c = linalg.depthwise_conv_2d_nhwc_hwc {{dilations = dense<1> : tensor<2xi64>,
        strides = dense<[{sh}, {sw}]> : tensor<2xi64>}}
        ins(%x, %w : {x}, {w}) outs(%init : {y}) -> {y}
    flow.return %c : {y}
  }}
  return %r : {y}
}}"""


def _im2col_function(name: str, x: str, y: str, sh: int, sw: int) -> str:
    """One copy whose innermost loop runs along an output row: each window is read and
    written contiguously (unstrided), one dispatch where tap-by-tap slices make
    ``kh * kw``, and unlike ``unfold``'s transposing copy, whose innermost loop IREE runs
    across the taps."""
    elem = y.rsplit("x", 1)[1].removesuffix(">")
    ins = f"affine_map<(n, c, i, j, r, s) -> (n, c, r * {sh} + i, s * {sw} + j)>"
    outs = "affine_map<(n, c, i, j, r, s) -> (n, c, i, j, r, s)>"
    return f"""func.func private @{name}(%x: {x}) -> {y} {{
  %empty = tensor.empty() : {y}
  %r = linalg.generic {{indexing_maps = [{ins}, {outs}],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "parallel"]}}
      ins(%x : {x}) outs(%empty : {y}) {{
  ^bb0(%in: {elem}, %out: {elem}):
    linalg.yield %in : {elem}
  }} -> {y}
  return %r : {y}
}}"""


_KERNELS = ("depthwise_nhwc", "im2col")


def _found(module: "ir.Module") -> list:
    names = {f"torch.{NAMESPACE}.{k}" for k in _KERNELS}
    out = []
    for func in module.body.operations:
        for block in func.regions[0].blocks if len(func.regions) else []:
            for op in block.operations:
                if op.operation.name == "torch.operator" and ir.StringAttr(
                        op.operation.attributes["name"]).value in names:
                    out.append(op.operation)
    return out


def _kernel(op) -> tuple[str, list, list[int]]:
    """``(kind, tensor operands, int operands)`` of a placeholder."""
    kind = ir.StringAttr(op.attributes["name"]).value.rsplit(".", 1)[1]
    operands = list(op.operands)
    tensors = operands[:2] if kind == "depthwise_nhwc" else operands[:1]
    ints = [_int(v) for v in operands[len(tensors):]]
    return kind, tensors, ints


def expand(module: "ir.Module") -> "ir.Module":
    """Rewrite ``module`` in place: each ``aot_cc`` placeholder (``depthwise_nhwc``,
    ``im2col``) becomes a call of a private function holding its linalg op (one per
    signature)."""
    ops = _found(module)
    if not ops:
        return module
    made: dict[str, str] = {}
    with module.context, ir.Location.unknown():
        for op in ops:
            kind, tensors, ints = _kernel(op)
            types = [_builtin(str(v.type)) for v in tensors]
            y = _builtin(str(op.results[0].type))
            key = "|".join([kind, *types, y, *map(str, ints)])
            if key not in made:
                made[key] = f"{NAMESPACE}.{kind}_{len(made)}"
                if kind == "depthwise_nhwc":
                    text = _function(made[key], *types, y, *ints)
                else:  # im2col: kh, kw are in the types; the strides are not
                    text = _im2col_function(made[key], types[0], y, *ints[2:])
                fn = ir.Operation.parse(text)
                ir.InsertionPoint.at_block_begin(module.body).insert(fn)
            with ir.InsertionPoint(op), op.location:
                args = [ir.Operation.create("torch_c.to_builtin_tensor", operands=[v],
                                            results=[ir.Type.parse(t)]).result
                        for v, t in zip(tensors, types)]
                call = ir.Operation.create(
                    "func.call", operands=args, results=[ir.Type.parse(y)],
                    attributes={"callee": ir.FlatSymbolRefAttr.get(made[key])})
                out = ir.Operation.create("torch_c.from_builtin_tensor",
                                          operands=[call.results[0]],
                                          results=[op.results[0].type]).result
                op.results[0].replace_all_uses_with(out)
            op.erase()
    return module
