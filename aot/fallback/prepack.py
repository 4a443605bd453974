"""Prepacked CPU kernels for ATen regions: weights packed once, ReLU and residual adds fused.

Eager PyTorch hands oneDNN an unpacked weight on every convolution and runs the
ReLU and the residual ``add`` that follow as separate passes over memory. A
compiled region knows its weights are constants and sees its whole graph, so
on the CPU (``ExecOptions(prepack=True)``) it can do what eager cannot:

- a convolution with a constant 4-D weight runs as
  ``mkldnn._convolution_pointwise`` on a weight reordered once, at its first
  call, into oneDNN's blocked layout (input and output NHWC: in channels-last
  groups, and in row-major groups where convolutions feed one another, as in
  LeViT's stem, the last one's result copied back to row-major);
- an activation reading only such a convolution's result is fused into it as a
  oneDNN post-op (``relu``, ``hardtanh`` (ReLU6), ``hardswish``, ``hardsigmoid``,
  ``silu``, ``sigmoid``, ``tanh``, ``gelu``, ``leaky_relu``: ``_POST_OPS``),
  and so is an ``add`` of another tensor (``alpha=1``) with an optional ``relu``
  after it (``_convolution_pointwise.binary``; oneDNN fuses no other activation
  after the add): the chain runs
  as one kernel at the position of its last op, the skipped slots stay empty
  (nothing else reads them);
- a 1x1 convolution of a 1x1 input (squeeze-excitation's two convolutions on the
  pooled vector) runs as ``addmm`` on a transposed weight, its activation after it:
  oneDNN's fixed cost per call dwarfs such a matrix-vector product, which ``addmm``
  does several times faster;
- a float32 ``linear`` with a constant 2-D weight runs as oneDNN's
  ``mkldnn._linear_pointwise``, an activation reading only its result fused as a
  post-op (as after a convolution). On an AMD Zen 5 it runs 2.1-2.3x faster than
  ``F.linear`` and MKL's packed weight from a 128x768x768 product up (MKL takes its
  AVX2 path on AMD CPUs: 190-200 GFLOP/s on two cores, oneDNN 430-460), and 1.3x on
  small ones (8x512x512). A linear whose signature (``linear_signature``) the
  artifact lists in ``ExecOptions.mkl_linears`` runs on MKL's ``mkl._mkl_linear``
  instead, on a weight packed once for its static batch size, its activation in
  place after it: on an Intel Xeon MKL is faster on most products
  (``aot.tuning.linear_kernels`` times both per machine at compile). Where this
  torch has no oneDNN linear, every linear of a static batch runs on MKL's;
- likewise a 1x1 convolution (stride 1, no padding, one group, static shape) on
  channels-last data is a linear over its pixels: where the artifact lists its
  signature (``conv1x1_signature``) it runs on MKL's packed weight (``MklConv1x1``),
  the residual add and activation in place after it (on the Xeon, MobileNetV2's
  49x960x160 takes 114 us there against oneDNN's 182);
- attention written out as ``softmax(q @ k.transpose(-2, -1) / c + bias) @ v`` (the
  division optional, or a multiplication; the bias optional, a tensor broadcast to
  the scores, such as LeViT's per-head position biases; ``k^T`` made by any op, such
  as LeViT's permute) runs as one ``scaled_dot_product_attention`` (ATen's fused CPU
  kernel, the bias as its additive mask), when nothing else reads the intermediates.

Values change by rounding only (oneDNN and MKL accumulate in another order);
the region candidate that uses this is chosen only where it measured faster
(``aot.tuning.regions``). Where this torch build lacks the kernels, the plain
ops run.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

from .spec import KernelCallSpec, StaticArg, TensorArg
from .static_values import decode

__all__ = ["available", "plan_fusions", "linear_signature", "linear_shape",
           "conv1x1_signature", "mkl_linear_available", "OneDnnLinear", "PackedLinear",
           "PackedConv", "MklConv1x1", "DEFERRED", "VERSION"]

# what the prepacked executor fuses; part of the region decisions' cache key, so a
# decision measured on an older executor is measured again (2: activation post-ops,
# 3: matrix-vector convolutions, 4: oneDNN linears on dynamic inputs, 5: oneDNN linears
# on every input, activations fused, 6: linears measured faster on MKL run there,
# 7: so do 1x1 convolutions)
VERSION = 7

DEFERRED = object()  # a member whose result is computed later, by its chain's last op
_CONV_ARGS = {  # op -> positions of (stride, padding, dilation, groups), None if not packable
    "aten::conv2d": (3, 4, 5, 6),
    "aten::convolution": (3, 4, 5, 8),
}


def available() -> bool:
    """oneDNN's pointwise convolution and MKL's packed linear are in this torch build."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_convolution_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_convolution_weight"))


def onednn_linear_available() -> bool:
    """This torch has oneDNN's linear (``mkldnn._linear_pointwise``)."""
    return hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_linear_weight(w: torch.Tensor, batch: int | None):
    """``w`` reordered once into oneDNN's layout for ``batch`` input rows, or ``w`` as
    written where the rows are not static (None) or this torch has no reorder."""
    if batch is None or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return w
    return torch.ops.mkldnn._reorder_linear_weight(w, batch)


def mkl_linear_available() -> bool:
    """This torch has MKL's linear on a packed weight (``mkl._mkl_linear``)."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops, "mkl") \
        and hasattr(torch.ops.mkl, "_mkl_linear")


def _tensor_operand(spec: KernelCallSpec, name: str) -> TensorArg | None:
    return next((o for o in spec.operands if isinstance(o, TensorArg) and o.name == name), None)


def _static(spec: KernelCallSpec, name: str, default=None):
    o = next((o for o in spec.operands if o.name == name), None)
    return o.value if isinstance(o, StaticArg) else default


class PackedConv:
    """conv [+ add] [+ activation] as one oneDNN kernel on a weight packed at the first call.

    ``post_op``: the activation fused after it (``_post_op``), or None. ``row_major``:
    the result is copied row-major (in a row-major group, for readers other than
    packed convolutions); else it is channels-last.
    """

    def __init__(self, conv, post_op: PostOp | None, other_slot: int | None, input_shape,
                 row_major: bool = False):
        self.conv, self.other_slot, self.row_major = conv, other_slot, row_major
        self.unary, self.scalars, self.algorithm, _ = post_op or _NO_POST_OP
        s, p, d, g = _CONV_ARGS[conv.spec.op]
        a = conv.args
        self.stride, self.padding, self.dilation = list(a[s]), list(a[p]), list(a[d])
        self.groups, self.input_shape = int(a[g]), list(input_shape)
        self.packed = None
        self.spec = conv.spec  # named in a KernelCallFailed
        # the env slots a call reads (the group's code drops a slot after its last reader)
        self.reads = conv.slots() + (() if other_slot is None else (other_slot,))
        self.post_op = post_op
        self.signature = conv1x1_signature(conv.spec, post_op, other_slot is not None)

    def __call__(self, env: list) -> torch.Tensor:
        args, _ = self.conv.bind(env)
        x, w, b = args[0].contiguous(memory_format=torch.channels_last), args[1], args[2]
        if self.packed is None:
            # a symbolic input shape (a dynamic artifact) packs for the first call's
            # sizes; oneDNN reorders it again itself where another size wants another layout
            shape = (list(x.shape) if any(isinstance(d, str) for d in self.input_shape)
                     else self.input_shape)
            self.packed = torch.ops.mkldnn._reorder_convolution_weight(
                w, self.padding, self.stride, self.dilation, self.groups, shape)
        if self.other_slot is None:
            y = torch.ops.mkldnn._convolution_pointwise(
                x, self.packed, b, self.padding, self.stride, self.dilation, self.groups,
                self.unary, self.scalars, self.algorithm)
        else:
            other = env[self.other_slot].contiguous(memory_format=torch.channels_last)
            y = torch.ops.mkldnn._convolution_pointwise.binary(
                x, other, self.packed, b, self.padding, self.stride, self.dilation,
                self.groups, "add", 1.0, None if self.unary == "none" else self.unary, [], "")
        return y.contiguous() if self.row_major else y


class MklConv1x1(PackedConv):
    """A 1x1 convolution [+ add] [+ activation] (``conv1x1_signature``) as MKL's
    ``linear`` over the pixels of its channels-last input, on a weight packed once for
    their number; the add and the activation in place after it."""

    def __call__(self, env: list) -> torch.Tensor:
        args, _ = self.conv.bind(env)
        x, w, b = args[0].contiguous(memory_format=torch.channels_last), args[1], args[2]
        n, c, h, wd = x.shape
        rows = n * h * wd
        if self.packed is None:
            self.weight = w.reshape(w.shape[0], c)
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, rows)
        y = torch.ops.mkl._mkl_linear(x.permute(0, 2, 3, 1).reshape(rows, c), self.packed,
                                      self.weight, b, rows)
        if self.other_slot is not None:
            other = env[self.other_slot].contiguous(memory_format=torch.channels_last)
            y.add_(other.permute(0, 2, 3, 1).reshape(rows, -1))
        if self.post_op is not None:
            y = self.post_op.apply(y, self.post_op.scalars, self.post_op.algorithm)
        y = y.view(n, h, wd, -1).permute(0, 3, 1, 2)
        return y.contiguous() if self.row_major else y


def conv1x1_shape(spec: KernelCallSpec) -> tuple[int, int, int, int, int, bool] | None:
    """``(n, c, h, w, out channels, bias)`` of a float32 1x1 convolution with stride 1,
    no padding, one group and a static input: a linear over its pixels; else None."""
    if spec.op not in _CONV_ARGS:
        return None
    x, w = _tensor_operand(spec, "input"), _tensor_operand(spec, "weight")
    if x is None or w is None or x.spec.is_symbolic or tuple(w.spec.shape[2:]) != (1, 1):
        return None
    s, p, d, g = (decode(_static(spec, name))
                  for name in ("stride", "padding", "dilation", "groups"))
    if not (isinstance(s, (list, tuple)) and isinstance(p, (list, tuple))
            and isinstance(d, (list, tuple))):
        return None
    if any(int(v) != 1 for v in s) or any(int(v) != 0 for v in p) \
            or any(int(v) != 1 for v in d) or g != 1:
        return None
    n, c, h, wd = (int(v) for v in x.spec.shape)
    return n, c, h, wd, int(w.spec.shape[0]), _tensor_operand(spec, "bias") is not None


def conv1x1_signature(spec: KernelCallSpec, post_op: PostOp | None, add: bool) -> str | None:
    """What a 1x1 convolution's kernel choice depends on, as ``linear_signature`` says
    it for a linear (``conv1x1:3136x24x144+bias+add+relu``); None where it is no linear
    over its pixels (``conv1x1_shape``)."""
    shape = conv1x1_shape(spec)
    if shape is None:
        return None
    n, c, h, wd, o, bias = shape
    sig = f"conv1x1:{n * h * wd}x{c}x{o}" + ("+bias" if bias else "") + ("+add" if add else "")
    return sig + _post_op_suffix(post_op)


class MatvecConv:
    """A 1x1 convolution of a 1x1 input [+ activation] as ``addmm`` on a weight
    transposed once: the same products, without oneDNN's fixed cost per call."""

    def __init__(self, conv, post_op: PostOp | None):
        self.conv = conv
        self.unary, self.scalars, self.algorithm, self.act = post_op or _NO_POST_OP
        self.weight_t = None
        self.spec = conv.spec
        self.reads = conv.slots()

    def __call__(self, env: list) -> torch.Tensor:
        args, _ = self.conv.bind(env)
        x, w, b = args[0], args[1], args[2]
        if self.weight_t is None:
            self.weight_t = w.reshape(w.shape[0], w.shape[1]).t().contiguous()
        x2 = x.reshape(x.shape[0], x.shape[1])
        y = torch.mm(x2, self.weight_t) if b is None else torch.addmm(b, x2, self.weight_t)
        if self.act is not None:
            y = self.act(y, self.scalars, self.algorithm)
        return y.view(y.shape[0], y.shape[1], 1, 1)


def _matvec_conv(conv) -> bool:
    """A 1x1, ungrouped, unpadded convolution whose input is 1x1 (its output too)."""
    x, w = _tensor_operand(conv.spec, "input"), _tensor_operand(conv.spec, "weight")
    _, padding, _, groups = _CONV_ARGS[conv.spec.op]
    return (tuple(x.spec.shape[2:]) == (1, 1) and tuple(w.spec.shape[2:]) == (1, 1)
            and int(conv.args[groups]) == 1 and all(int(v) == 0 for v in conv.args[padding]))


class PackedLinear:
    """``linear`` [+ activation] on an MKL weight packed once for the static batch size,
    the activation applied in place after it (MKL fuses none)."""

    def __init__(self, linear, batch: int, post_op: PostOp | None = None):
        self.linear, self.batch, self.packed = linear, batch, None
        self.spec, self.post_op = linear.spec, post_op
        self.signature = linear_signature(linear.spec, batch, post_op)
        self.reads = linear.slots()

    def __call__(self, env: list) -> torch.Tensor:
        args, _ = self.linear.bind(env)
        x, w = args[0], args[1]
        b = args[2] if len(args) > 2 else None
        if self.packed is None:
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(w, self.batch)
        y = torch.ops.mkl._mkl_linear(x, self.packed, w, b, self.batch)
        if self.post_op is not None:
            y = self.post_op.apply(y, self.post_op.scalars, self.post_op.algorithm)
        return y


class OneDnnLinear:
    """``linear`` [+ activation] through oneDNN (``mkldnn._linear_pointwise``), the
    activation fused as a post-op (``_post_op``). ``batch``: the input's rows where its
    size is static, for a weight reordered once into oneDNN's layout for them at the
    first call (5% faster on a 197x768x3072 product, 25% on 8x512x512); None for a
    dynamic input, whose weight oneDNN reorders as each call needs."""

    def __init__(self, linear, post_op: PostOp | None = None, batch: int | None = None):
        self.linear, self.spec, self.batch, self.packed = linear, linear.spec, batch, None
        self.post_op = post_op
        self.unary, self.scalars, self.algorithm, _ = post_op or _NO_POST_OP
        self.signature = linear_signature(linear.spec, batch, post_op)
        self.reads = linear.slots()

    def __call__(self, env: list) -> torch.Tensor:
        args, _ = self.linear.bind(env)
        b = args[2] if len(args) > 2 else None
        if self.packed is None:
            self.packed = onednn_linear_weight(args[1], self.batch)
        return torch.ops.mkldnn._linear_pointwise(args[0], self.packed, b, self.unary,
                                                  self.scalars, self.algorithm)


class FusedAttention:
    """``softmax(q @ k^T * scale [+ bias]) @ v`` as ATen's fused CPU attention kernel
    (flash attention), the bias as its additive mask. ``k_transposed``: slot ``k``
    holds ``k^T`` (read as its transposed view). ``scaling``: the op and constant that
    scale the scores (``("div", 8.0)``), or None.

    Where ATen would not run the fused kernel on a call's operands (``v``'s head size
    differs from ``q``'s, as in LeViT; a ``k`` not unit-stride in its last dimension)
    its scaled-dot-product-attention falls back to unfused math, about twice as slow
    as the written-out ops on 2 cores: then the ops as written run instead."""

    def __init__(self, spec: KernelCallSpec, q: int, k: int, v: int, scaling: tuple | None,
                 k_transposed: bool = False, bias: int | None = None):
        self.spec, self.q, self.k, self.v, self.scaling = spec, q, k, v, scaling
        self.scale = 1.0 if scaling is None else \
            1.0 / scaling[1] if scaling[0] == "div" else float(scaling[1])
        self.k_transposed, self.bias = k_transposed, bias
        self.reads = (q, k, v) + (() if bias is None else (bias,))

    def __call__(self, env: list) -> torch.Tensor:
        q, v = env[self.q], env[self.v]
        k = env[self.k].transpose(-2, -1) if self.k_transposed else env[self.k]
        mask = None if self.bias is None else env[self.bias]
        if mask is not None and mask.dim() < 4:  # the fused kernel takes 4-D masks only
            mask = mask.view((1,) * (4 - mask.dim()) + tuple(mask.shape))
        if torch._fused_sdp_choice(q, k, v, mask, 0.0, False, scale=self.scale) == _SDP_MATH:
            return self._as_written(q, k, v, mask)
        out = torch.ops.aten.scaled_dot_product_attention.default(
            q, k, v, mask, 0.0, False, scale=self.scale)
        return out.contiguous()  # readers expect the matmul's dense result

    def _as_written(self, q, k, v, mask):
        s = torch.matmul(q, k.transpose(-2, -1))
        if self.scaling is not None:
            s = s / self.scaling[1] if self.scaling[0] == "div" else s * self.scaling[1]
        if mask is not None:
            s = s + mask
        return torch.matmul(torch.softmax(s, -1), v)


_SDP_MATH = 0  # torch._fused_sdp_choice's answer for the unfused math path


def _packable_conv(spec: KernelCallSpec) -> bool:
    if spec.op not in _CONV_ARGS or spec.overload not in ("default", ""):
        return False
    x, w = _tensor_operand(spec, "input"), _tensor_operand(spec, "weight")
    b = _tensor_operand(spec, "bias")
    if x is None or w is None or not w.constant or len(w.spec.shape) != 4 \
            or len(x.spec.shape) != 4 or x.spec.dtype != "float32" or w.spec.dtype != "float32":
        return False
    if b is not None and not b.constant:
        return False
    if spec.op == "aten::convolution" and _static(spec, "transposed", True):
        return False
    padding = _static(spec, "padding")
    return not isinstance(padding, str)  # conv2d.padding ("same"/"valid") is not packed


def _packable_linear(spec: KernelCallSpec) -> bool:
    if spec.op != "aten::linear" or not mkl_linear_available():
        return False
    x, w = _tensor_operand(spec, "input"), _tensor_operand(spec, "weight")
    b = _tensor_operand(spec, "bias")
    return (x is not None and w is not None and w.constant and len(w.spec.shape) == 2
            and not x.spec.is_symbolic  # MKL packs for one batch size
            and x.spec.dtype == "float32" and w.spec.dtype == "float32"
            and (b is None or b.constant))


def _onednn_linear(spec: KernelCallSpec) -> bool:
    """A float32 ``linear`` on a constant 2-D weight, where this torch has oneDNN's."""
    if spec.op != "aten::linear" or not onednn_linear_available():
        return False
    x, w = _tensor_operand(spec, "input"), _tensor_operand(spec, "weight")
    b = _tensor_operand(spec, "bias")
    return (x is not None and w is not None and w.constant
            and len(w.spec.shape) == 2 and x.spec.dtype == w.spec.dtype == "float32"
            and (b is None or (b.constant and b.spec.dtype == "float32")))


def linear_shape(spec: KernelCallSpec) -> tuple[int, int, bool]:
    """A linear's ``(in features, out features, has a bias)``."""
    n, k = (int(d) for d in _tensor_operand(spec, "weight").spec.shape)
    return k, n, _tensor_operand(spec, "bias") is not None


def linear_signature(spec: KernelCallSpec, batch: int | None, post_op: PostOp | None) -> str:
    """What a prepacked linear's kernel choice depends on: ``rows x in x out``, the bias
    and the fused activation with its scalars (``16x384x768+bias+gelu/tanh``); the rows
    are ``?`` where the batch is dynamic."""
    k, n, bias = linear_shape(spec)
    sig = f"{'?' if batch is None else batch}x{k}x{n}" + ("+bias" if bias else "")
    return sig + _post_op_suffix(post_op)


def _post_op_suffix(post_op: PostOp | None) -> str:
    if post_op is None:
        return ""
    return f"+{post_op.attr}" + "".join(f",{v:g}" for v in post_op.scalars) \
        + (f"/{post_op.algorithm}" if post_op.algorithm else "")


class PostOp(NamedTuple):
    """An activation fused after a convolution: oneDNN's post-op ``attr`` with its
    ``scalars`` and ``algorithm``, and ``apply(y, scalars, algorithm)``, the same
    activation in place in ATen (for ``MatvecConv``, which runs no oneDNN kernel)."""
    attr: str
    scalars: list
    algorithm: str
    apply: Callable | None


_NO_POST_OP = PostOp("none", [], "", None)
_F = torch.nn.functional
# op -> oneDNN post-op attribute, the statics that become its scalars (with their
# defaults), and the activation in place
_POST_OPS = {
    "aten::relu": ("relu", (), lambda y, s, a: torch.relu_(y)),
    "aten::relu_": ("relu", (), lambda y, s, a: torch.relu_(y)),
    "aten::hardtanh": ("hardtanh", (("min_val", -1.0), ("max_val", 1.0)),
                       lambda y, s, a: _F.hardtanh_(y, s[0], s[1])),
    "aten::hardswish": ("hardswish", (), lambda y, s, a: _F.hardswish(y, inplace=True)),
    "aten::hardsigmoid": ("hardsigmoid", (), lambda y, s, a: _F.hardsigmoid(y, inplace=True)),
    "aten::silu": ("swish", (), lambda y, s, a: _F.silu(y, inplace=True)),
    "aten::sigmoid": ("sigmoid", (), lambda y, s, a: torch.sigmoid_(y)),
    "aten::tanh": ("tanh", (), lambda y, s, a: torch.tanh_(y)),
    "aten::leaky_relu": ("leaky_relu", (("negative_slope", 0.01),),
                         lambda y, s, a: _F.leaky_relu_(y, s[0])),
    "aten::gelu": ("gelu", (), lambda y, s, a: _F.gelu(y, approximate=a)),
}


def _post_op(spec: KernelCallSpec) -> PostOp | None:
    """``spec`` as an activation fused after a convolution, or None."""
    entry = _POST_OPS.get(spec.op)
    if entry is None or spec.overload not in ("default", ""):
        return None
    x = _tensor_operand(spec, "self")
    if x is None or x.spec.dtype != "float32":
        return None
    attr, statics, apply = entry
    scalars = [_static(spec, name, default) for name, default in statics]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in scalars):
        return None
    algorithm = ""
    if attr == "gelu":
        algorithm = _static(spec, "approximate", "none")
        if algorithm not in ("none", "tanh"):
            return None
    return PostOp(attr, [float(v) for v in scalars], algorithm, apply)


def _is_plain_add(spec: KernelCallSpec) -> bool:
    if spec.op != "aten::add" or spec.overload != "Tensor":
        return False
    a, b = _tensor_operand(spec, "self"), _tensor_operand(spec, "other")
    return (a is not None and b is not None and a.spec.shape == b.spec.shape
            and a.spec.dtype == b.spec.dtype == "float32" and _static(spec, "alpha", 1) == 1)


def plan_fusions(members: list, n_inputs: int, output_slots, convs: bool,
                 mkl_linears: frozenset = frozenset()) -> dict:
    """Member index -> ``DEFERRED`` or a callable ``f(env) -> result`` replacing it.

    ``members`` are the group's BoundCalls in order; slots ``0..n_inputs-1`` are
    the group's inputs and each member appends its results after them.
    ``convs``: the group runs channels-last, so convolutions may be packed.
    ``mkl_linears``: signatures (``linear_signature``, ``conv1x1_signature``) of
    linears and 1x1 convolutions that run on MKL's packed weight rather than oneDNN's.
    """
    if not available():
        return {}
    specs = [b.spec for b in members]
    slot_of, users, nxt = [], {}, n_inputs  # member -> its first result slot; slot -> readers
    for i, s in enumerate(specs):
        slot_of.append(nxt)
        nxt += max(len(s.results), 1)
        for r in members[i].slots():
            users.setdefault(r, []).append(i)
    outputs = set(output_slots)

    def only_reader(slot: int) -> int | None:
        us = users.get(slot, [])
        return us[0] if len(us) == 1 and slot not in outputs else None

    producer = {}  # slot -> member making it
    for i, s in enumerate(specs):
        for r in range(max(len(s.results), 1)):
            producer[slot_of[i] + r] = i

    plan: dict = {}

    def conv_chain(i: int) -> tuple[list, PostOp | None, int | None]:
        """Conv ``i`` [+ add] [+ activation]: the members fused, the activation, the
        slot of the add's other operand."""
        chain, unary, other = [i], None, None
        j = only_reader(slot_of[i])
        if j is not None and _is_plain_add(specs[j]) and j not in plan:
            a, b = _tensor_operand(specs[j], "self"), _tensor_operand(specs[j], "other")
            other = b.index if a.index == slot_of[i] else a.index
            if other != slot_of[i]:
                chain.append(j)
                j = only_reader(slot_of[j])
            else:
                other = None
        if j is not None and j not in plan:
            unary = _post_op(specs[j])
            if other is not None and unary is not None and unary.attr != "relu":
                unary = None  # oneDNN fuses only a relu after the add
            if unary is not None:
                chain.append(j)
        return chain, unary, other

    # a row-major group packs the convolutions that feed one another (the chain's result
    # read only as the next one's input): between them tensors stay channels-last, and
    # the last one's result is made row-major again. A lone convolution stays ATen's:
    # its two layout copies cost what packing saves
    nhwc_out, chained = set(), set()
    if not convs:
        ends = {i: slot_of[conv_chain(i)[0][-1]] for i, s in enumerate(specs)
                if _packable_conv(s) and not _matvec_conv(members[i])}
        for i, end in ends.items():
            readers = users.get(end, [])
            if readers and end not in outputs and all(
                    j in ends and _tensor_operand(specs[j], "input").index == end
                    and sum(r == end for r in members[j].slots()) == 1 for j in readers):
                nhwc_out.add(end)
                chained.update([i, *readers])

    for i, s in enumerate(specs):
        if i in plan:
            continue
        attention = _match_attention(i, specs, slot_of, producer, only_reader, plan)
        if attention is not None:
            *absorbed, last, fused = attention
            for k in absorbed:
                plan[k] = DEFERRED
            plan[last] = fused
            continue
        if _packable_conv(s) and (convs or i in chained):
            chain, unary, other = conv_chain(i)
            x = _tensor_operand(s, "input")
            for k in chain[:-1]:
                plan[k] = DEFERRED
            if convs and other is None and _matvec_conv(members[i]):
                plan[chain[-1]] = MatvecConv(members[i], unary)
                continue
            on_mkl = conv1x1_signature(s, unary, other is not None) in mkl_linears \
                and mkl_linear_available()
            plan[chain[-1]] = (MklConv1x1 if on_mkl else PackedConv)(
                members[i], unary, other, x.spec.shape,
                row_major=not convs and slot_of[chain[-1]] not in nhwc_out)
        elif _onednn_linear(s):
            x = _tensor_operand(s, "input")
            batch = None if x.spec.is_symbolic else math.prod(x.spec.shape[:-1])
            j = only_reader(slot_of[i])
            unary = _post_op(specs[j]) if j is not None and j not in plan else None
            linear = OneDnnLinear(members[i], unary, batch)
            if batch is not None and linear.signature in mkl_linears and mkl_linear_available():
                linear = PackedLinear(members[i], batch, unary)
            if unary is not None:
                plan[i] = DEFERRED
                plan[j] = linear
            else:
                plan[i] = linear
        elif _packable_linear(s):
            x = _tensor_operand(s, "input")
            plan[i] = PackedLinear(members[i], math.prod(x.spec.shape[:-1]))
    return plan


def _match_attention(i, specs, slot_of, producer, only_reader, plan):
    """``(absorbed members..., last member, FusedAttention)`` when member ``i`` starts one."""
    def arg(spec, name):
        return _tensor_operand(spec, name)

    m1 = specs[i]
    if (m1.op, m1.overload) != ("aten::matmul", "default"):
        return None
    q, kt = arg(m1, "self"), arg(m1, "other")
    if q is None or kt is None:
        return None
    # k^T made by transposing k's last two dimensions: k itself is read (the transpose
    # absorbed where nothing else reads it); any other k^T (LeViT's permute) is read
    # as the transposed view of it
    t, k, k_shape = producer.get(kt.index), kt, tuple(kt.spec.shape[:-2]) + tuple(
        kt.spec.shape[-2:][::-1])
    if t is not None and t not in plan and (specs[t].op, specs[t].overload) == \
            ("aten::transpose", "int"):
        nd = len(kt.spec.shape)
        dims = {d % nd for d in (_static(specs[t], "dim0"), _static(specs[t], "dim1"))
                if isinstance(d, int)}
        if dims == {nd - 2, nd - 1}:
            k = arg(specs[t], "self")
            k_shape = tuple(k.spec.shape)
    chain, scaling, j = [i], None, only_reader(slot_of[i])
    if j is not None and specs[j].op in ("aten::div", "aten::mul") \
            and specs[j].overload == "Tensor":
        c = _static(specs[j], "other")
        if not isinstance(c, (int, float)) or isinstance(c, bool) or c == 0 \
                or arg(specs[j], "self").index != slot_of[i]:
            return None
        scaling = ("div" if specs[j].op == "aten::div" else "mul", c)
        chain.append(j)
        j = only_reader(slot_of[j])
    bias = _attention_bias(specs[j], slot_of[chain[-1]]) if j is not None else None
    if bias is not None:  # the scores plus a bias (LeViT's per-head position biases)
        chain.append(j)
        j = only_reader(slot_of[j])
    if j is None or not _is_last_dim_softmax(specs[j]):
        return None
    chain.append(j)
    j = only_reader(slot_of[j])
    if j is None or (specs[j].op, specs[j].overload) != ("aten::matmul", "default") \
            or arg(specs[j], "self").index != slot_of[chain[-1]]:
        return None
    v = arg(specs[j], "other")
    shapes = [tuple(q.spec.shape), k_shape, tuple(v.spec.shape)]
    if any(len(sh) != 4 for sh in shapes) or len({sh[:-2] for sh in shapes}) != 1 \
            or any(x.spec.dtype != "float32" for x in (q, k, v)) or any(c in plan for c in chain):
        return None
    if k is not kt and only_reader(slot_of[t]) == i:
        chain.insert(0, t)  # the transposed k is read by nothing else
    return (*chain, j, FusedAttention(specs[j], q.index, k.index, v.index, scaling,
                                      k_transposed=k is kt,
                                      bias=None if bias is None else bias.index))


def _attention_bias(spec: KernelCallSpec, scores: int) -> TensorArg | None:
    """The tensor ``spec`` adds to the attention scores in slot ``scores`` (``alpha`` 1,
    float32, of a static shape that broadcasts to theirs), or None."""
    if (spec.op, spec.overload) != ("aten::add", "Tensor") or _static(spec, "alpha", 1) != 1:
        return None
    a, b = _tensor_operand(spec, "self"), _tensor_operand(spec, "other")
    if a is None or b is None or a.index == b.index or scores not in (a.index, b.index):
        return None
    s, bias = (a, b) if a.index == scores else (b, a)
    if bias.spec.dtype != "float32" or s.spec.is_symbolic or bias.spec.is_symbolic:
        return None
    try:
        if torch.broadcast_shapes(tuple(s.spec.shape), tuple(bias.spec.shape)) \
                != tuple(s.spec.shape):
            return None
    except RuntimeError:
        return None
    return bias


def _is_last_dim_softmax(spec: KernelCallSpec) -> bool:
    x = _tensor_operand(spec, "self")
    if x is None or x.spec.dtype != "float32":
        return False
    last = {-1, len(x.spec.shape) - 1}
    if (spec.op, spec.overload) == ("aten::softmax", "int"):
        return _static(spec, "dim") in last and _static(spec, "dtype") is None
    if (spec.op, spec.overload) == ("aten::_softmax", "default"):
        return _static(spec, "dim") in last and not _static(spec, "half_to_float", False)
    return False
