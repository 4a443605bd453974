"""A traced ATen group run as a list of oneDNN primitives, each one C call per run.

Input: the group's TorchScript trace (``onednn_graph.FusedGraph`` makes it, and its
rewrites apply), whose values carry their shapes and strides. Output: ``Program``, a
flat list of steps over numbered value slots:

- a convolution (2-D, any groups, stride, padding or dilation) or a linear on
  float32 with constant weights, and a matrix product of two tensors (or of a tensor
  and a constant; batches broadcast), becomes one oneDNN primitive with the
  elementwise ops and binary ops that follow it (its only reader each time, the
  result's shape unchanged) fused as post-ops: an activation, a residual add, a scale,
  a mask or bias added to attention scores (a linear on dense operands is one product
  over its rows; where oneDNN would run it on its generic GEMM it runs as a 1x1
  convolution over its rows where that is timed faster: ``_LINEAR_AS_CONV``; else as
  MKL's packed GEMM with its bias and post-ops as one primitive after it, where that
  is timed faster: ``_MKL_LINEARS``);
- ``scaled_dot_product_attention`` (no dropout; no mask, a causal one, a constant or a
  tensor mask) becomes three: the scaled scores with the mask fused, a softmax in
  place, the product with the values;
- an elementwise op (ReLU, hardswish, hardsigmoid, SiLU, sigmoid, tanh, GELU,
  hardtanh/clamp, a power, a (reciprocal) square root, exp, negation, arithmetic with
  a number), a broadcasting add/mul/sub/div (one operand may be a constant), a
  softmax, a layer norm over the last dimension, a mean (over the image as a pooling,
  else as a reduction), max or average pooling, a layout copy becomes a primitive of
  its own;
- a batch-1 image times per-channel scales made per call (squeeze-excitation), read
  only by a 1x1 convolution, is not made where scaling the convolution's weights
  costs less (``_WEIGHT_SCALE_COST``): a reorder with scales writes them each call;
- a network's first convolution (a few input channels: ``_STEM_CHANNELS``) reads the
  image as it comes and writes the layout oneDNN picks, reordered to NHWC after;
- a view op (view, reshape, permute, transpose, split, unbind, ...) of buffers the
  program keeps is made once, here, and costs nothing per call;
- every other node runs as its ATen op (``torch.ops.aten.<name>`` on the slots'
  tensors, each laid out as traced), and a node whose operands are all constants is
  computed once, here.

A primitive for which oneDNN has only its reference kernel, or no kernel, is tried as
its ops one by one, and what is still left runs in ATen.

Weights are reordered once into the layout each primitive prefers. Every primitive's
result lives in a buffer allocated here, once, and shared with later results once the
value is dead (the smallest free buffer that holds it; values an ATen op reads keep
theirs, as it may return a view of them), so one call allocates nothing but its
outputs, and the working set stays near the size of the live values. A result
that is a view of such a buffer is copied out (the next call would overwrite it).
A call binds the group's inputs (copied to the traced layout where they arrive in
another) and runs the steps in order under a lock (the buffers are the program's); a
stretch of primitives that read and write only the program's own buffers is one step,
a C loop over them (``native_loop``, where a C compiler is at hand).

Values change by rounding only (oneDNN orders sums its own way). Building raises
``ValueError`` for what it cannot run (a dtype or rank outside what the trace showed);
the caller then runs the group as it was.
"""

from __future__ import annotations

import functools
import math
import threading

import torch

from . import dnnl_api as D
from . import attention, depthwise, mkl_gemm, native_loop, rms_norm, winograd

__all__ = ["Program", "build"]

_ELTWISE = {  # aten op -> (oneDNN algorithm, alpha, beta)
    "aten::relu": ("relu", 0.0, 0.0),
    "aten::hardswish": ("hardswish", 1.0 / 6.0, 0.5),
    "aten::hardsigmoid": ("hardsigmoid", 1.0 / 6.0, 0.5),
    "aten::silu": ("swish", 1.0, 0.0),
    "aten::sigmoid": ("logistic", 0.0, 0.0),
    "aten::tanh": ("tanh", 0.0, 0.0),
}
_UNARY = {  # more elementwise ops as oneDNN's: (algorithm, alpha, beta)
    "aten::rsqrt": ("pow", 1.0, -0.5),
    "aten::sqrt": ("sqrt", 0.0, 0.0),
    "aten::exp": ("exp", 0.0, 0.0),
    "aten::neg": ("linear", -1.0, 0.0),
    "aten::abs": ("abs", 0.0, 0.0),
    "aten::mish": ("mish", 0.0, 0.0),
}
_BINARY = {"aten::add": "add", "aten::mul": "mul", "aten::sub": "sub", "aten::div": "div"}
_COMMUTES = ("add", "mul")
# ops whose results are views of their operands: over buffers fixed for the program's
# life, their results are fixed too (made once, when the program is built)
_VIEWS = frozenset(f"aten::{k}" for k in (
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "unsqueeze", "squeeze",
    "select", "slice", "split", "split_with_sizes", "unbind", "chunk", "expand", "narrow",
    "flatten", "unflatten", "view_as", "reshape_as", "expand_as", "movedim", "alias"))
_INF = float("inf")
# a 1x1 convolution's weights are scaled per input channel (a reorder with scales, per
# call) in place of its input, where that is cheaper: measured with oneDNN 3.2 on a
# Xeon, a weight so reordered costs about 16 times an input element multiplied
_WEIGHT_SCALE_COST = 16
# a convolution from an image of this many channels or fewer (a network's first) to
# at most _STEM_OUT channels reads the image as it comes and writes the layout oneDNN
# picks, reordered to NHWC after. Measured alone on a Xeon against reordering the image
# to NHWC first (both with their reorders): 1.7x faster for 3 -> 16 channels, 1.1x for
# 3 -> 32, the same for 3 -> 64 (a 7x7 kernel)
_STEM_CHANNELS, _STEM_OUT = 4, 16
# a linear whose matrix product oneDNN would run on its generic GEMM (``gemm:jit``: on
# AVX2, oneDNN 3.2 has no packed matmul kernel) may run as a 1x1 convolution over its
# rows, where oneDNN packs the weights (``brgconv_1x1``). Measured alone on a 2-core AMD
# Zen 3 (AVX2), against the matmul: 197x768x3072 8.2 ms against 14.7, 197x3072x768 7.8
# against 9.0, 49x960x160 0.142 against 0.149 (ViT-B/16's program 329 ms against 574);
# but 128x3072x768 twice the matmul's time. So the two are timed on random data when the
# program is built, once per shape and process (``_FORMS_TIMED``), and the faster kept.
# The matmul implementations so tried:
_LINEAR_AS_CONV = ("gemm",)
_TIME_LINEAR_FORMS = True  # off: the convolution wherever oneDNN has a packed kernel
_FORMS_TIMED: dict[tuple, bool] = {}  # (rows, in, out, bias, post-ops) -> conv faster
_FORM_ROUNDS, _FORM_BLOCK_MS = 5, 5.0
# bytes of distinct weights a timed form cycles through, in at most _FORM_COPIES
# copies: in a model, weights come from memory or the last-level cache. With 16 MB (8
# copies) oneDNN's and MKL's products of T5-small's linears timed within 3%; with 64 MB,
# as in its program (0.93 ms for the 128x512x2048 product), MKL 4-8% faster
_FORM_WEIGHT_SET, _FORM_COPIES = 64 << 20, 32
# a linear over its rows may run as MKL's packed GEMM (in torch's library:
# ``mkl_gemm``) with its bias and post-ops as one primitive after it, where that is
# timed faster than oneDNN's product, once per shape and process. On a 2-core Xeon with
# AVX-512, twelve 197x768x3072 products with distinct weights: 2.36 ms against
# oneDNN's 2.72 (ViT-B/16's MLP).
_MKL_LINEARS = True
# x * a row's factor * a feature's, where oneDNN has only its reference kernel for the
# two fused, is tried as x * the feature's * the row's (``_emit_or_split``)
_SWAP_PRODUCTS = True
# where the two are within this fraction of each other, oneDNN's product is kept: the
# difference is in the timing's noise, and one primitive with its post-ops fused reads
# its result once (DeiT-tiny and LeViT-128 ran 2-3% slower with MKL's products picked
# by under 1%)
_MKL_MARGIN = 0.03
_MKL_TIMED: dict[tuple, bool] = {}  # _form_key -> MKL faster
# a stretch of primitives with their memory at fixed addresses runs as one call into a
# C loop (``native_loop``): 1.5-1.9 us of host time less per primitive on a 2-core Xeon
# (EfficientNet-B0's 114: 5.50 ms a call against 5.33; MobileBERT's 455: 25.6 against 24.7)
_NATIVE_LOOP = True
# a 3x3 convolution (stride 1, padding 1, channels in multiples of 16) with ReLU and
# residual adds after it may run as Winograd F(4x4, 3x3) (``winograd``), where that is
# timed faster than oneDNN's convolution, once per shape and process. On a 2-core Xeon
# with AVX-512, ResNet18's 128@28 0.37 ms against 0.62
_WINOGRAD = True
_WINOGRAD_TIMED: dict[tuple, bool] = {}  # (n, in, h, w, out, bias, ops) -> Winograd faster
# a depthwise convolution (3x3 or 5x5, stride 1 or 2) with its activation may run as
# C of our own (``depthwise``), and a mean over its image planned right after it then
# comes from the rows' sums as they are written, where that is timed faster than
# oneDNN's convolution (and its pooling), once per shape and process. On a 2-core Xeon
# with AVX-512, EfficientNet-B0's 32@112 with its SiLU and mean 0.091 ms against 0.181,
# its 12 shapes 0.73 ms against 1.12
_DEPTHWISE = True
_DEPTHWISE_TIMED: dict[tuple, bool] = {}  # (n, c, h, w, k, stride, bias, act, pooled) -> ours
# an attention may run as one kernel of our own (``attention``: each block of query
# rows' scores stay in cache) instead of three primitives over the whole scores
# buffer, where that is timed faster, once per shape and process
_ATTENTION = True
_ATTENTION_TIMED: dict[tuple, bool] = {}  # (b, h, l, s, d, dv, mask) -> ours faster
# ``x * rsqrt(mean(x^2, -1) + eps)`` (times a weight: T5's and Llama's norms) runs as
# one kernel of ours (``rms_norm``) instead of three primitives: on a 2-core Xeon,
# T5-small's 128 x 512 0.055 ms as primitives
_RMS_NORM = True


class _Node:
    """What lowering needs of a TorchScript node."""

    def __init__(self, node):
        self.node, self.kind = node, node.kind()
        self.ins = list(node.inputs())
        self.outs = list(node.outputs())


def _const(v):
    n = v.node()
    if n.kind() == "prim::Constant":
        return True, v.toIValue()
    return False, None


def _tensor_type(v):
    t = v.type()
    if not isinstance(t, torch._C.TensorType) or t.sizes() is None or t.strides() is None:
        return None
    return t


class _Reference(Exception):
    """oneDNN has only its reference (slow, scalar) kernel for a primitive."""


class _Copy:
    """A value made here: another layout of a traced value."""

    def __init__(self, of):
        self.of = of


class _Const:
    """A constant tensor read by a primitive (kept by the program)."""

    def __init__(self, t: torch.Tensor):
        self.t = t


class _Type:
    """The traced type's queries, for values made here."""

    def __init__(self, shape, strides):
        self._shape, self._strides = list(shape), list(strides)

    def sizes(self):
        return self._shape

    def strides(self):
        return self._strides

    def dim(self):
        return len(self._shape)

    def scalarType(self):  # noqa: N802  (TorchScript's spelling)
        return "Float"


def _dense(shape, order) -> tuple:
    """The strides of a dense tensor of ``shape`` whose dimensions nest in ``order``
    (outermost first)."""
    want, acc = [0] * len(shape), 1
    for d in reversed(order):
        want[d] = acc
        acc *= shape[d]
    return tuple(want)


def _canonical(shape, strides) -> tuple:
    """``strides`` with those of size-1 dimensions made what a dense layout of the same
    dimension order gives them: the layout is the same, and oneDNN recognises it (an
    NHWC tensor with a 1x1 image otherwise reads as an odd layout, served by reference
    kernels). Strides of a layout that is not dense are kept."""
    shape, strides = tuple(shape), tuple(strides)
    orders = [tuple(range(len(shape)))]
    if len(shape) == 4:
        orders.insert(0, (0, 2, 3, 1))
    for order in orders:
        want = _dense(shape, order)
        if all(shape[d] == 1 or strides[d] == want[d] for d in range(len(shape))):
            return tuple(want)
    return strides


class Program:
    """Steps over slots; ``__call__(inputs) -> outputs`` (tensors)."""

    def __init__(self):
        self.steps: list = []
        self.env: list = []
        self.inputs: list[tuple[int, tuple, tuple]] = []  # slot, shape, strides
        self.outputs: list[int] = []
        self.fresh: dict[int, tuple] = {}  # output slot -> (shape, strides)
        self.lock = threading.Lock()
        self.n_primitives = 0
        self.n_aten = 0
        self.aten_ops: list[str] = []  # the kinds of the nodes run as ATen ops
        self.n_fixed_views = 0  # view ops made once, at build time
        self.n_scaled_weights = 0  # 1x1 convolutions whose weights take a channel scale
        self.n_linears_as_conv = 0  # linears run as 1x1 convolutions (``_LINEAR_AS_CONV``)
        self.n_mkl_linears = 0  # linears run as MKL's packed GEMM (``_MKL_LINEARS``)
        self.n_linears_over_rows = 0  # linears described as one [rows, in] product
        self.n_runs = 0  # stretches of primitives run by one C loop (``_NATIVE_LOOP``)
        self.n_winograd = 0  # 3x3 convolutions run as Winograd F(4x4, 3x3) (``_WINOGRAD``)
        self.n_depthwise = 0  # depthwise convolutions run by ``depthwise`` (``_DEPTHWISE``)
        self.n_pooled = 0  # means over an image taken from its depthwise convolution's rows
        self.n_attention = 0  # attentions run by ``attention`` (``_ATTENTION``)
        self.n_rms_norm = 0  # RMS norms run by ``rms_norm`` (``_RMS_NORM``)
        self.kept_storage: set[int] = set()  # storages the program keeps from call to call

    def primitives(self) -> list:
        """The program's primitives (``dnnl_api.Primitive``), in the order they run."""
        out = []
        for step in self.steps:
            out.extend(step.prims if isinstance(step, native_loop.Run) else
                       [step.prim] if hasattr(step, "prim") else [])
        return out

    def __call__(self, inputs):
        with self.lock:
            env = self.env
            for (slot, shape, strides), x in zip(self.inputs, inputs):
                if tuple(x.shape) != shape:
                    raise ValueError(f"an input of shape {tuple(x.shape)}, traced as {shape}")
                if x.stride() != strides:  # to the layout the primitives were made for
                    y = torch.empty_strided(shape, strides, dtype=x.dtype)
                    y.copy_(x)
                    x = y
                env[slot] = x
            for slot, (shape, strides) in self.fresh.items():
                env[slot] = torch.empty_strided(shape, strides)
            for step in self.steps:
                step(env)
            out = [env[s] for s in self.outputs]
            for i, (s, t) in enumerate(zip(self.outputs, out)):
                if s not in self.fresh and isinstance(t, torch.Tensor) \
                        and t.untyped_storage().data_ptr() in self.kept_storage:
                    out[i] = t.clone()  # a view of a buffer the next call overwrites
            for slot in self.fresh:
                env[slot] = None
            for slot, _, _ in self.inputs:
                env[slot] = None
            return out


class _Builder:
    def __init__(self, graph, lib: D.Lib):
        self.lib = lib
        self.graph = graph
        self.p = Program()
        self.slot: dict = {}  # torch Value -> slot
        self.consts: dict = {}  # torch Value -> Python value (constants, folded)
        self.nodes = [_Node(n) for n in graph.nodes()]
        self.dynamic: set[int] = set()  # slots whose tensor changes per call
        self.outputs = self._graph_outputs()
        self.alias: dict = {}  # a layout no-op's result -> the value it returns
        self.flat: dict[int, torch.Tensor] = {}  # slot -> the buffer under its value
        self.free: list[torch.Tensor] = []  # buffers no live value uses
        self.pinned: set[int] = set()  # slots whose buffer an ATen op's result may view
        self.dies: dict[int, list] = {}  # plan item -> values it reads last
        self.layout: dict = {}  # a primitive's result -> the strides of its buffer
        self.copies: dict = {}  # (a value, strides) -> its copy in that layout (a _Copy)
        self.const_operands: dict = {}  # a constant tensor value -> its _Const
        self.tensor_types: dict = {}  # types of values made here (the copies)
        self.scratch: list = []  # the primitives' scratchpad memory objects
        # a 1x1 convolution node -> (its input before a per-channel scale, the scales,
        # the product node): the product is not made, the weights are scaled instead
        self.scaled_inputs: dict = {}
        self.scratch_bytes = 0
        self.winograd: list = []  # ``winograd.Conv``s, sharing one pair of work buffers
        self.depthwise: list = []  # ``depthwise.Conv``s, sharing one work buffer
        self.attentions: list = []  # ``attention.Attention``s, sharing one work buffer
        self.next_item = None  # the plan item after the one being emitted
        self.pool_from: dict = {}  # a value -> (its depthwise Conv, its step): may pool

    # values -------------------------------------------------------------------
    def _graph_outputs(self):
        outs = list(self.graph.outputs())
        if len(outs) == 1 and outs[0].node().kind() == "prim::TupleConstruct":
            outs = list(outs[0].node().inputs())
        return outs

    def new_slot(self, v) -> int:
        s = len(self.p.env)
        self.p.env.append(None)
        if v is not None:
            self.slot[v] = s
        return s

    def value(self, v):
        """(True, constant) or (False, slot)."""
        v = self.alias.get(v, v)
        if isinstance(v, (_Copy, _Const)):
            return False, self.slot.get(v)
        if v in self.consts:
            return True, self.consts[v]
        ok, c = _const(v)
        if ok:
            return True, c
        return False, self.slot.get(v)  # (no slot yet while planning)

    def tensor_type(self, v):
        if v in self.tensor_types:
            return self.tensor_types[v]
        t = _tensor_type(v)
        if t is None or t.scalarType() != "Float":
            return None
        return t

    # buffers ------------------------------------------------------------------
    def buffer(self, v, strides) -> tuple[int, torch.Tensor | None]:
        """A slot for the result ``v`` of a primitive, laid out as ``strides``: a fresh
        tensor per call for a group output, else a buffer kept from call to call
        (a free one reused where one holds it)."""
        shape = tuple(self.tensor_type(v).sizes())
        strides = tuple(strides)
        self.layout[v] = strides
        s = self.new_slot(v)
        if v in self.outputs:
            self.p.fresh[s] = (shape, strides)
            self.dynamic.add(s)
            return s, None
        need = 1 + sum((d - 1) * st for d, st in zip(shape, strides)) if all(shape) else 1
        fits = [i for i, f in enumerate(self.free) if f.numel() >= need]
        if fits:
            flat = self.free.pop(min(fits, key=lambda i: self.free[i].numel()))
        else:
            flat = torch.empty(need)
        buf = flat.as_strided(shape, strides)
        self.p.kept_storage.add(flat.untyped_storage().data_ptr())
        self.flat[s] = flat
        self.p.env[s] = buf
        return s, buf

    def release(self, index: int) -> None:
        """The buffers of values last read by plan item ``index`` (and of their copies
        in other layouts) become free."""
        for v in self.dies.pop(index, ()):
            for key in [k for k in self.copies if k[0] is v]:
                self._free(self.copies.pop(key))
            self._free(v)

    def _free(self, v) -> None:
        s = self.slot.get(v)
        if s is not None and s in self.flat and s not in self.pinned:
            self.free.append(self.flat.pop(s))

    def memory(self, md, slot: int, args: list, arg: int, handles: list):
        t = self.p.env[slot]
        m = D.Memory(self.lib, md, t.data_ptr() if t is not None else 0)
        args.append((arg, m))
        if slot in self.dynamic:
            handles.append((m.h, slot))
        return m

    def _slot(self, v) -> int:
        return self.slot[self.alias.get(v, v)]

    def strides_of(self, v) -> tuple:
        """The layout of ``v`` as it runs here: a primitive's result as its buffer was
        made, anything else as traced."""
        v = self.alias.get(v, v)
        if v in self.layout:
            return self.layout[v]
        t = self.tensor_type(v)
        return _canonical(t.sizes(), t.strides())

    def md_of_value(self, v, rank: int | None = None):
        """``v``'s memory descriptor, with leading dimensions of size 1 up to ``rank``
        (as broadcasting aligns shapes)."""
        shape, strides = list(self.tensor_type(v).sizes()), list(self.strides_of(v))
        extra = (rank or len(shape)) - len(shape)
        numel = 1
        for d in shape:
            numel *= d
        return self.lib.md([1] * extra + shape, [max(1, numel)] * extra + strides)

    def constant(self, t: torch.Tensor, layout: tuple | None = None) -> _Const:
        """A slot holding the constant tensor ``t``: a dense copy (laid out as
        ``layout`` if given), kept."""
        t = t.detach().reshape(1) if not t.dim() else t.detach().contiguous() \
            if layout is None else torch.empty_strided(t.shape, layout).copy_(t)
        c = _Const(t)
        self.tensor_types[c] = _Type(t.shape, t.stride())
        s = self.new_slot(c)
        self.p.env[s] = t
        self._keep(t)
        return c

    def constant_output(self, t: torch.Tensor) -> int:
        """A slot that holds a fresh copy of ``t`` each call."""
        s = self.new_slot(None)
        self.dynamic.add(s)
        self._keep(t)

        def copy(env, s=s, t=t):
            env[s] = t.clone()
        self.p.steps.append(copy)
        return s

    def batched(self, v, shape: tuple):
        """A constant post-op operand repeated along the batch (oneDNN's products take
        no operand broadcast along their batch of more than one)."""
        if not isinstance(v, _Const) or shape[0] == 1 or len(shape) < 3:
            return v
        t = v.t.reshape((1,) * (len(shape) - v.t.dim()) + tuple(v.t.shape))
        if t.shape[0] != 1:
            return v
        return self.constant(t.expand((shape[0],) + tuple(t.shape[1:])))

    def operand(self, v):
        """``v`` as a primitive's operand: itself where it is made per call, a kept
        constant (``_Const``) where it is a float32 tensor constant."""
        if isinstance(v, (_Copy, _Const)) or self._tensor_operand(v):
            return v
        if v not in self.const_operands:
            c = self._const_tensor(v)
            if c is None:
                raise ValueError(f"{v.debugName()} is not a float32 tensor")
            self.const_operands[v] = self.constant(c)
        return self.const_operands[v]

    def nhwc(self, v):
        """``v`` (4-D) in NHWC: itself, or a copy (a reorder step, once per call)."""
        return self.relayout(v, _dense(tuple(self.tensor_type(v).sizes()), (0, 2, 3, 1)))

    def dense(self, v):
        """``v`` dense, row-major."""
        return self.relayout(v, _dense(tuple(self.tensor_type(v).sizes()),
                                       range(self.tensor_type(v).dim())))

    def traced_layout(self, v):
        """``v`` laid out as traced (as an ATen op reading it expects)."""
        t = self.tensor_type(v)
        if t is None or isinstance(v, (_Copy, _Const)):
            return v
        return self.relayout(v, _canonical(t.sizes(), t.strides()))

    def relayout(self, v, want: tuple):
        """``v`` laid out as ``want``: itself, or a copy a reorder step makes once per
        call (a constant's copy is made here)."""
        shape = tuple(self.tensor_type(v).sizes())
        if self.strides_of(v) == want:
            return v
        if isinstance(v, _Const):
            return self.constant(v.t, want)
        key = (self.alias.get(v, v), want)
        if key in self.copies:
            return self.copies[key]
        copy = _Copy(v)
        self.tensor_types[copy] = self.tensor_type(v)
        src_md = self.md_of_value(v)
        slot, _ = self.buffer(copy, want)
        args, handles = [], []
        self.memory(src_md, self._slot(v), args, D.ARG_SRC, handles)
        self.memory(self.lib.md(shape, want), slot, args, D.ARG_DST, handles)
        attr = D.post_ops(self.lib, [])
        pd = self.lib.reorder(src_md, self.lib.md(shape, want), attr)
        self._scratch(pd, args)
        prim = D.Primitive(self.lib, pd, attr, args, f"a reorder of {shape}")
        self.p.steps.append(_primitive_step(self.lib, prim, handles))
        self.p.n_primitives += 1
        self.copies[key] = copy
        return copy

    # lowering -----------------------------------------------------------------
    def build(self) -> Program:
        for v in self.graph.inputs():
            t = _tensor_type(v)
            if t is None:
                raise ValueError("a group input without a traced shape")
            s = self.new_slot(v)
            self.dynamic.add(s)
            self.p.inputs.append((s, tuple(t.sizes()), tuple(t.strides())))
        plan = self._plan()
        last = {}
        for idx, item in enumerate(plan):
            for v in (item[5] if item[0] == "primitive" else item[2]):
                last[self.alias.get(v, v)] = idx
        for v, idx in last.items():
            if v not in self.outputs:
                self.dies.setdefault(idx, []).append(v)
        for idx, item in enumerate(plan):
            kind = item[0]
            self.next_item = plan[idx + 1] if idx + 1 < len(plan) else None
            if kind == "primitive":
                self._emit_or_split(item)
            else:
                self._emit_aten(item[1])
            self.release(idx)
        for v in self.outputs:
            ok, x = self.value(v)
            if ok:  # computed from constants only: a copy of it each call
                if not isinstance(x, torch.Tensor):
                    raise ValueError("a group output that is a constant, not a tensor")
                x = self.constant_output(x)
            self.p.outputs.append(x)
        if self.scratch:  # one scratch buffer: the steps run one at a time
            buf = torch.empty(self.scratch_bytes // 4 + 16)
            self._keep(buf)
            for m in self.scratch:
                self.lib.set_handle(m.h, buf.data_ptr())
        if self.winograd:  # one pair of work buffers: the steps run one at a time
            works = [conv.work() for conv in self.winograd]
            v = torch.empty(max(nv for nv, _ in works))
            m = torch.empty(max(nm for _, nm in works))
            self._keep(v)
            self._keep(m)
            for conv in self.winograd:
                conv.bind(v, m)
        if self.depthwise:  # one work buffer for the rows' sums, as above
            rows = torch.empty(max(conv.work() for conv in self.depthwise))
            self._keep(rows)
            for conv in self.depthwise:
                conv.bind(rows)
        if self.attentions:  # and one for the attentions
            work = torch.empty(max(att.work() for att in self.attentions))
            self._keep(work)
            for att in self.attentions:
                att.bind(work)
        if _NATIVE_LOOP and native_loop.available():
            self.p.steps = _in_runs(self.lib, self.p.steps)
            self.p.n_runs = sum(isinstance(s, native_loop.Run) for s in self.p.steps)
        return self.p

    def _emit_or_split(self, item) -> None:
        """A planned primitive; where oneDNN has only its reference kernel for it, the
        anchor and each fused op alone (a primitive each, where one is not reference
        code either), else in ATen."""
        try:
            self._emit_primitive(item)
            return
        except _Reference:
            a, posts = item[2], item[3]
            if _SWAP_PRODUCTS and a["kind"] == "binary" and a["alg"] == D.BINARY["mul"] \
                    and len(posts) == 1 \
                    and posts[0][:2] == ("binary", D.BINARY["mul"]):
                # x * a row's factor * a feature's (an RMS norm's scaling): oneDNN 3.2
                # has a kernel for the feature's product with the row's fused, not the
                # other way round
                try:
                    self._emit_primitive(item[:2] + (
                        dict(a, b=posts[0][2], reads=[a["a"], posts[0][2]]),
                        [("binary", a["alg"], a["b"])]) + item[4:])
                    return
                except _Reference:
                    pass
            if "scale" in item[2]:  # the product the weights were to take is made after all
                self._unscale(item[1])
            if not item[6]:
                self._emit_aten(item[1])
                return
        for node in (item[1], *item[6]):
            a = self._anchor(node)
            if a is None:
                self._emit_aten(node)
                continue
            try:
                self._emit_primitive(("primitive", node, a, [], node.outs[0], a["reads"], []))
            except _Reference:
                self._emit_aten(node)

    def _unscale(self, conv: _Node) -> None:
        """The per-channel product ahead of ``conv``, as a step of its own."""
        _, _, mul = self.scaled_inputs.pop(conv.node)
        a = self._anchor(mul)
        try:
            if a is None:
                raise _Reference("no primitive")
            self._emit_primitive(("primitive", mul, a, [], mul.outs[0], a["reads"], []))
        except _Reference:
            self._emit_aten(mul)

    def _users(self, v):
        return [u.user for u in v.uses()]

    def _plan(self):
        """The nodes in order, constants folded, fusions chosen: a list of
        ``("primitive", anchor, fused nodes, post-op specs, out value, reads)`` and
        ``("aten", node, reads)``."""
        fused_into: dict = {}
        plan = []
        done = set()
        # first constants and layout no-ops everywhere: a fusion looks ahead at them
        for n in self.nodes:
            if n.kind == "prim::Constant":
                done.add(n.node)
            elif n.kind == "aten::contiguous" and not self.value(n.ins[0])[0] \
                    and self._same_layout(n.ins[0], n.outs[0]) \
                    and n.outs[0] not in self.outputs:
                self.alias[n.outs[0]] = self.alias.get(n.ins[0], n.ins[0])
                done.add(n.node)
            elif all(_const(v)[0] or v in self.consts for v in n.ins) and n.kind not in (
                    "prim::TupleConstruct",) and n.outs:
                self._fold(n)
                done.add(n.node)
        for n in self.nodes:
            if n.node not in done:
                scaled = self._channel_scale(n)
                if scaled is not None:
                    self.scaled_inputs[scaled[0]] = (scaled[1], scaled[2], n)
                    done.add(n.node)
        for n in self.nodes:
            if n.node in fused_into or n.node in done:
                continue
            rms = self._rms_norm(n)
            if rms is not None:  # five or six nodes as one kernel
                anchor, chain, out = rms
                for u in chain:
                    fused_into[u.node] = n
                plan.append(("primitive", n, anchor, [], out, list(anchor["reads"]), chain))
                continue
            anchor = self._anchor(n)
            if anchor is None:
                plan.append(("aten", n, [v for v in n.ins]))
                continue
            posts, out, reads, chain = [], n.outs[0], list(anchor["reads"]), []
            if anchor["fuses"]:
                while True:
                    users = self._users(out)
                    if len(users) != 1 or out in self.outputs:
                        break
                    if users[0] in fused_into or users[0] in done:  # taken already
                        break
                    u = _Node(users[0])
                    post = self._post_op(u, out)
                    if post is None:
                        break
                    posts.append(post[0])
                    reads.extend(post[1])
                    chain.append(u)
                    fused_into[u.node] = n
                    out = u.outs[0]
            plan.append(("primitive", n, anchor, posts, out, reads, chain))
        # a fused primitive runs where its last fused node stood: reorder so that
        # operands of post-ops made after the anchor exist
        order = []
        pos = {}
        for i, n in enumerate(self.nodes):
            pos[n.node] = i
        keyed = []
        for item in plan:
            if item[0] == "primitive":
                out_node = item[4].node()
                keyed.append((pos.get(out_node, pos[item[1].node]), item))
            else:
                keyed.append((pos[item[1].node], item))
        keyed.sort(key=lambda kv: kv[0])
        for _, item in keyed:
            order.append(item)
        return order

    def _same_layout(self, a, b) -> bool:
        ta, tb = _tensor_type(a), _tensor_type(b)
        return ta is not None and tb is not None and ta.sizes() == tb.sizes() \
            and _canonical(ta.sizes(), ta.strides()) == _canonical(tb.sizes(), tb.strides())

    def _fold(self, n: _Node) -> None:
        """A node of constants computed once."""
        if n.kind == "prim::ListConstruct":
            self.consts[n.outs[0]] = [self.value(v)[1] for v in n.ins]
            return
        if n.kind == "prim::ListUnpack":
            for v, c in zip(n.outs, self.value(n.ins[0])[1]):
                self.consts[v] = c
            return
        fn, kw = _aten_op(n.node)
        args = [self.value(v)[1] for v in n.ins]
        npos = len(args) - len(kw)
        out = fn(*args[:npos], **{a.name: x for a, x in zip(kw, args[npos:])})
        outs = list(out) if isinstance(out, (tuple, list)) and len(n.outs) > 1 else [out]
        for v, o in zip(n.outs, outs):
            self.consts[v] = o

    # anchors: nodes that become a primitive -------------------------------------
    def _anchor(self, n: _Node):
        k = n.kind
        if not n.outs or self.tensor_type(n.outs[0]) is None:
            return None
        if k == "aten::_convolution":
            return self._conv_anchor(n)
        if k == "aten::linear":
            return self._linear_anchor(n)
        if k in _ELTWISE or k in _UNARY or k in ("aten::gelu", "aten::hardtanh", "aten::clamp",
                                                 "aten::pow"):
            e = self._eltwise(n)
            if e is None or not self._tensor_operand(n.ins[0]):
                return None
            return {"kind": "eltwise", "spec": e, "fuses": False, "reads": [n.ins[0]]}
        if k in _BINARY:
            return self._binary_anchor(n)
        if k in ("aten::adaptive_avg_pool2d", "aten::mean"):
            return self._mean_anchor(n)
        if k in ("aten::max_pool2d", "aten::avg_pool2d"):
            return self._pool_anchor(n)
        if k in ("aten::contiguous", "aten::clone") and self._tensor_operand(n.ins[0]):
            return {"kind": "reorder", "fuses": False, "reads": [n.ins[0]]}
        if k in ("aten::matmul", "aten::bmm", "aten::mm"):
            return self._matmul_anchor(n)
        if k in ("aten::softmax", "aten::_softmax"):
            return self._softmax_anchor(n)
        if k == "aten::layer_norm":
            return self._layer_norm_anchor(n)
        if k == "aten::scaled_dot_product_attention":
            return self._attention_anchor(n)
        return None

    def _rms_norm(self, n: _Node):
        """Where ``n`` is ``pow(x, 2)`` starting ``x * rsqrt(mean(x^2, -1, keepdim) +
        eps)``, optionally times a constant weight over the last dimension (either
        side), each step the only user of the one before and no group output: (the
        anchor, the other nodes, the result); else None."""
        if not _RMS_NORM or n.kind != "aten::pow" or not self._tensor_operand(n.ins[0]):
            return None
        x = n.ins[0]
        ok, e = self.value(n.ins[1])
        r = self.tensor_type(x).dim()
        if not ok or isinstance(e, bool) or e != 2 or r < 1 \
                or not all(self.tensor_type(x).sizes()) or not rms_norm.available():
            return None

        def sole(v, kind):  # the only user of v, of this kind
            us = self._users(v)
            if len(us) != 1 or v in self.outputs or us[0].kind() != kind:
                return None
            return _Node(us[0])

        m = sole(n.outs[0], "aten::mean")
        vals = [self.value(v) for v in m.ins[1:]] if m is not None else []
        if m is None or len(vals) < 2 or not all(ok for ok, _ in vals) \
                or [d % r for d in (vals[0][1] or [])] != [r - 1] or vals[1][1] is not True \
                or (len(vals) > 2 and vals[2][1] is not None):
            return None
        add = sole(m.outs[0], "aten::add")
        if add is None or add.ins[0] is not m.outs[0]:
            return None
        (ok1, eps), (ok2, alpha) = self.value(add.ins[1]), (
            self.value(add.ins[2]) if len(add.ins) > 2 else (True, 1))
        if not (ok1 and ok2) or alpha != 1 or isinstance(eps, bool) \
                or not isinstance(eps, (int, float)):
            return None
        q = sole(add.outs[0], "aten::rsqrt")
        p = sole(q.outs[0], "aten::mul") if q is not None else None
        if p is None or len(p.ins) != 2 or {id(v) for v in p.ins} != {id(x), id(q.outs[0])}:
            return None
        chain, out, w = [m, add, q, p], p.outs[0], None
        us = self._users(out)
        if len(us) == 1 and out not in self.outputs and us[0].kind() == "aten::mul":
            u = _Node(us[0])
            if len(u.ins) == 2 and (u.ins[0] is out) != (u.ins[1] is out):
                c = self._const_tensor(u.ins[1] if u.ins[0] is out else u.ins[0])
                if c is not None and c.dim() == 1 \
                        and c.shape[0] == self.tensor_type(x).sizes()[-1]:
                    chain.append(u)
                    out, w = u.outs[0], c
        return ({"kind": "rms_norm", "eps": float(eps), "w": w, "fuses": False,
                 "reads": [x]}, chain, out)

    def _attention_anchor(self, n: _Node):
        """``scaled_dot_product_attention`` without dropout, heads matching, the mask
        (a float or boolean constant, a float tensor, or causal) broadcast to the
        scores."""
        q, k, v, mask = n.ins[:4]
        if not all(self._tensor_operand(x) for x in (q, k, v)):
            return None
        vals = [self.value(x) for x in n.ins[4:]]
        if not all(ok for ok, _ in vals) or len(vals) < 2:
            return None
        dropout, causal = vals[0][1], vals[1][1]
        scale = vals[2][1] if len(vals) > 2 else None
        if dropout != 0 or (len(vals) > 3 and vals[3][1]):
            return None
        tq, tk, tv = (tuple(self.tensor_type(x).sizes()) for x in (q, k, v))
        r = len(tq)
        if not (len(tk) == len(tv) == r and 3 <= r <= 5 and tq[:-2] == tk[:-2] == tv[:-2]
                and tk[-2] == tv[-2] and tq[-1] == tk[-1]):
            return None
        sshape = tq[:-1] + tk[-2:-1]
        ok, m = self.value(mask)
        reads = [q, k, v]
        if ok and m is None:
            spec = None
        elif ok and isinstance(m, torch.Tensor) and m.dtype in (torch.bool, torch.float32):
            spec = m if m.dtype == torch.float32 else \
                torch.zeros(m.shape).masked_fill(~m, -_INF)
        elif self._tensor_operand(mask):
            spec = mask
            reads.append(mask)
        else:
            return None
        if causal:
            if spec is not None:
                return None
            spec = torch.zeros(sshape[-2:]).masked_fill(
                ~torch.ones(sshape[-2:], dtype=torch.bool).tril(), -_INF)
        if spec is not None:
            ms = tuple(spec.shape) if isinstance(spec, torch.Tensor) \
                else tuple(self.tensor_type(spec).sizes())
            if len(ms) > r or any(y not in (1, o) for y, o in zip(reversed(ms),
                                                                  reversed(sshape))):
                return None
        if scale is None:
            scale = tq[-1] ** -0.5
        return {"kind": "attention", "q": q, "k": k, "v": v, "mask": spec,
                "scale": float(scale), "fuses": False, "reads": reads}

    def _const_tensor(self, v) -> torch.Tensor | None:
        ok, c = self.value(v)
        return c if ok and isinstance(c, torch.Tensor) and c.dtype == torch.float32 else None

    def _matmul_anchor(self, n: _Node):
        """A matrix product of a tensor made per call with another (or a constant),
        batch dimensions broadcast."""
        a, b = n.ins[:2]
        if not self._tensor_operand(a):
            return None
        if self._tensor_operand(b):
            tb = tuple(self.tensor_type(b).sizes())
        elif (c := self._const_tensor(b)) is not None:
            tb = tuple(c.shape)
        else:
            return None
        ta, out = tuple(self.tensor_type(a).sizes()), tuple(self.tensor_type(n.outs[0]).sizes())
        if len(ta) != len(out) or not 2 <= len(tb) <= len(ta) <= 5 \
                or ta[:-2] != out[:-2] or ta[-1] != tb[-2] \
                or any(y not in (1, o) for y, o in zip(reversed(tb[:-2]), reversed(out[:-2]))):
            return None
        return {"kind": "matmul", "a": a, "b": b, "fuses": True, "reads": [a, b]}

    def _softmax_anchor(self, n: _Node):
        x = n.ins[0]
        (ok1, dim), (ok2, extra) = self.value(n.ins[1]), self.value(n.ins[2])
        if not (ok1 and ok2) or not isinstance(dim, int) or extra not in (None, False) \
                or not self._tensor_operand(x):
            return None
        return {"kind": "softmax", "axis": dim % self.tensor_type(x).dim(), "fuses": False,
                "reads": [x]}

    def _layer_norm_anchor(self, n: _Node):
        """A layer normalization over the last dimension, its scale and shift constant."""
        x, shape, w, b, eps = n.ins[:5]
        (ok1, shape), (ok2, eps) = self.value(shape), self.value(eps)
        if not (ok1 and ok2) or not self._tensor_operand(x) \
                or list(shape) != list(self.tensor_type(x).sizes())[-1:]:
            return None
        params = []
        for v in (w, b):
            ok, c = self.value(v)
            if not ok or not (c is None or (isinstance(c, torch.Tensor)
                                            and c.dtype == torch.float32 and c.dim() == 1)):
                return None
            params.append(c)
        return {"kind": "layer_norm", "w": params[0], "b": params[1], "eps": float(eps),
                "fuses": False, "reads": [x]}

    def _tensor_operand(self, v) -> bool:
        """A float32 tensor made per call (not a constant) with a traced layout."""
        return not self.value(v)[0] and self.tensor_type(v) is not None

    def _conv_anchor(self, n: _Node):
        x, w, b = n.ins[:3]
        vals = [self.value(v) for v in n.ins[3:]]
        if not all(ok for ok, _ in vals):
            return None
        stride, padding, dilation, transposed, _, groups = [c for _, c in vals[:6]]
        okw, wt = self.value(w)
        okb, bt = self.value(b)
        if transposed or not okw or not isinstance(wt, torch.Tensor) or wt.dim() != 4 \
                or wt.dtype != torch.float32 or not okb \
                or not (bt is None or (isinstance(bt, torch.Tensor)
                                       and bt.dtype == torch.float32)) \
                or not self._tensor_operand(x) or self.tensor_type(x).dim() != 4:
            return None
        anchor = {"kind": "conv", "w": wt, "b": bt, "stride": list(stride),
                  "padding": list(padding), "dilation": list(dilation), "groups": int(groups),
                  "fuses": True, "reads": [x]}
        if n.node in self.scaled_inputs:
            x, scale, _ = self.scaled_inputs[n.node]
            anchor.update(x=x, scale=scale, reads=[x, scale])
        return anchor

    def _channel_scale(self, n: _Node):
        """``(convolution node, x, s)`` where ``n`` multiplies a batch-1 image ``x`` by
        per-channel scales ``s`` (1 x C x 1 x 1, made per call: a squeeze-excitation)
        for a 1x1 convolution alone to read, whose weights (O x C) are cheaper to scale
        than ``x``; else None."""
        if n.kind != "aten::mul" or len(n.ins) != 2 or n.outs[0] in self.outputs:
            return None
        users = self._users(n.outs[0])
        if len(users) != 1 or users[0].kind() != "aten::_convolution":
            return None
        conv = _Node(users[0])
        if conv.ins[0] != n.outs[0]:
            return None
        for x, s in (n.ins, n.ins[::-1]):
            if not (self._tensor_operand(x) and self._tensor_operand(s)):
                return None
            tx, ts = self.tensor_type(x), self.tensor_type(s)
            if tx.dim() != 4 or tx.sizes()[0] != 1 \
                    or tuple(ts.sizes()) != (1, tx.sizes()[1], 1, 1):
                continue
            a = self._conv_anchor(conv)
            if a is None or a["groups"] != 1 or tuple(a["w"].shape[2:]) != (1, 1) \
                    or a["stride"] != [1, 1] or a["padding"] != [0, 0]:
                return None
            h, w = tx.sizes()[2:]
            if a["w"].shape[0] * _WEIGHT_SCALE_COST >= h * w:
                return None
            return conv.node, x, s
        return None

    def _linear_anchor(self, n: _Node):
        x, w, b = n.ins[:3]
        okw, wt = self.value(w)
        okb, bt = self.value(b)
        if not okw or not isinstance(wt, torch.Tensor) or wt.dim() != 2 \
                or wt.dtype != torch.float32 or not okb \
                or not (bt is None or isinstance(bt, torch.Tensor)) \
                or not self._tensor_operand(x):
            return None
        tx = self.tensor_type(x)
        if tx.dim() < 2 or tx.dim() > 4:
            return None
        return {"kind": "linear", "w": wt, "b": bt, "fuses": True, "reads": [x]}

    def _eltwise(self, n: _Node):
        k = n.kind
        if k in _ELTWISE or k in _UNARY:
            name, a, b = _ELTWISE.get(k) or _UNARY[k]
            return D.ELTWISE[name], a, b
        if k == "aten::pow":
            ok, e = self.value(n.ins[1])
            if not ok or isinstance(e, bool) or not isinstance(e, (int, float)):
                return None
            return D.ELTWISE["pow"], 1.0, float(e)
        if k == "aten::gelu":
            ok, approx = self.value(n.ins[1]) if len(n.ins) > 1 else (True, "none")
            if not ok:
                return None
            return D.ELTWISE["gelu_tanh" if approx == "tanh" else "gelu_erf"], 0.0, 0.0
        if k in ("aten::hardtanh", "aten::clamp"):
            (ok1, lo), (ok2, hi) = self.value(n.ins[1]), self.value(n.ins[2])
            if not (ok1 and ok2) or not all(x is None or isinstance(x, (int, float))
                                            for x in (lo, hi)):
                return None
            return (D.ELTWISE["clip"], -_INF if lo is None else float(lo),
                    _INF if hi is None else float(hi))
        return None

    def _scalar_linear(self, n: _Node, v):
        """``v op number`` as oneDNN's ``alpha * x + beta``, or None."""
        k = n.kind
        if k not in _BINARY or n.ins[0] is not v:
            return None
        ok, c = self.value(n.ins[1])
        if not ok or isinstance(c, bool) or not isinstance(c, (int, float)):
            return None
        alpha = 1.0
        if k in ("aten::add", "aten::sub"):
            oka, alpha = self.value(n.ins[2]) if len(n.ins) > 2 else (True, 1)
            if not oka or not isinstance(alpha, (int, float)):
                return None
        c = float(c)
        if k == "aten::add":
            return D.ELTWISE["linear"], 1.0, c * alpha
        if k == "aten::sub":
            return D.ELTWISE["linear"], 1.0, -c * alpha
        if k == "aten::mul":
            return D.ELTWISE["linear"], c, 0.0
        if c == 0.0:
            return None
        return D.ELTWISE["linear"], 1.0 / c, 0.0

    def _binary_operands(self, n: _Node, full=None):
        """(algorithm, full operand, broadcast operand) for a binary op on tensors whose
        result has the full operand's shape (``full`` if given and it can be), the
        other's dimensions (aligned from the last) each equal or 1; or None. The full
        operand is made per call; the other may be a constant (a ``_Const``)."""
        if len(n.ins) > 2:
            ok, alpha = self.value(n.ins[2])
            if not ok or alpha != 1:
                return None
        a, b = n.ins[:2]
        alg = _BINARY[n.kind]
        out = tuple(self.tensor_type(n.outs[0]).sizes())
        if alg in _COMMUTES and (b is full or (full is None and not (
                self._tensor_operand(a) and tuple(self.tensor_type(a).sizes()) == out))):
            a, b = b, a
        if not self._tensor_operand(a) or tuple(self.tensor_type(a).sizes()) != out:
            return None
        if self._tensor_operand(b):
            tb = tuple(self.tensor_type(b).sizes())
        elif (c := self._const_tensor(b)) is not None:
            tb = tuple(c.shape)
        else:
            return None
        if len(tb) > len(out) or any(y not in (1, o) for y, o in zip(reversed(tb),
                                                                     reversed(out))):
            return None
        return alg, a, b

    def _binary_anchor(self, n: _Node):
        lin = self._scalar_linear(n, n.ins[0])
        if lin is not None and self._tensor_operand(n.ins[0]):
            return {"kind": "eltwise", "spec": lin, "fuses": False, "reads": [n.ins[0]]}
        ops = self._binary_operands(n)
        if ops is None:
            return None
        alg, a, b = ops
        return {"kind": "binary", "alg": D.BINARY[alg], "a": a, "b": b, "fuses": True,
                "reads": [a, b]}

    def _mean_anchor(self, n: _Node):
        x = n.ins[0]
        if not self._tensor_operand(x):
            return None
        r = self.tensor_type(x).dim()
        if n.kind == "aten::mean" and r != 4:
            return self._reduce_anchor(n)
        if r != 4:
            return None
        if n.kind == "aten::adaptive_avg_pool2d":
            ok, size = self.value(n.ins[1])
            if not ok or list(size) != [1, 1]:
                return None
        else:
            (ok1, dims), (ok2, keep) = self.value(n.ins[1]), self.value(n.ins[2])
            if not (ok1 and ok2) or keep is not True or dims is None \
                    or sorted(d % 4 for d in dims) != [2, 3] \
                    or (len(n.ins) > 3 and self.value(n.ins[3]) != (True, None)):
                return self._reduce_anchor(n)
        return {"kind": "mean", "fuses": True, "reads": [x]}

    def _reduce_anchor(self, n: _Node):
        """A mean over constant dimensions as a reduction (post-ops fused where the
        reduced dimensions are kept)."""
        x = n.ins[0]
        vals = [self.value(v) for v in n.ins[1:]]
        if len(vals) < 2 or not all(ok for ok, _ in vals) or (len(vals) > 2 and vals[2][1]
                                                            is not None):
            return None
        dims, keep = vals[0][1], vals[1][1]
        r = self.tensor_type(x).dim()
        if not dims or not 2 <= r <= 5 or not isinstance(keep, bool):
            return None
        dims = {d % r for d in dims}
        kept = [1 if d in dims else s for d, s in enumerate(self.tensor_type(x).sizes())]
        return {"kind": "reduce", "kept": kept, "fuses": keep, "reads": [x]}

    def _pool_anchor(self, n: _Node):
        x = n.ins[0]
        if not self._tensor_operand(x) or self.tensor_type(x).dim() != 4:
            return None
        vals = [self.value(v) for v in n.ins[1:]]
        if not all(ok for ok, _ in vals):
            return None
        if n.kind == "aten::max_pool2d":
            kernel, stride, padding, dilation, ceil = [c for _, c in vals[:5]]
            alg = D.POOLING["max"]
        else:
            kernel, stride, padding, ceil, include, divisor = [c for _, c in vals[:6]]
            if divisor is not None or ceil:
                return None
            dilation = [1, 1]
            alg = D.POOLING["avg_include_padding" if include else "avg_exclude_padding"]
        kernel = list(kernel)
        stride = list(stride) or kernel
        return {"kind": "pool", "alg": alg, "kernel": kernel, "stride": stride,
                "padding": list(padding), "dilation": list(dilation), "fuses": True,
                "reads": [x]}

    def _post_op(self, u: _Node, v):
        """The post-op applying node ``u`` to the anchor's result ``v`` (same shape
        out), and the values it reads; or None."""
        if self.tensor_type(u.outs[0]) is None or \
                tuple(self.tensor_type(u.outs[0]).sizes()) != tuple(self.tensor_type(v).sizes()):
            return None
        if u.ins[0] is v and (u.kind in _ELTWISE or u.kind in _UNARY or u.kind in (
                "aten::gelu", "aten::hardtanh", "aten::clamp", "aten::pow")):
            e = self._eltwise(u)
            return (("eltwise",) + e, []) if e is not None else None
        if u.kind in _BINARY:
            lin = self._scalar_linear(u, v)
            if lin is not None:
                return ("eltwise",) + lin, []
            ops = self._binary_operands(u, full=v)
            if ops is None or ops[1] is not v or ops[2] is v:
                return None
            alg, _, other = ops
            return ("binary", D.BINARY[alg], other), [other]
        return None

    # emitting -------------------------------------------------------------------
    def _emit_primitive(self, item) -> None:
        _, n, a, posts, out, _, _ = item
        if a["kind"] == "attention":
            self._emit_attention(a, out)
            return
        if a["kind"] == "rms_norm":
            self._emit_rms_norm(a, out)
            return
        lib = self.lib
        specs, binaries = [], []
        shape = tuple(self.tensor_type(out).sizes())
        rank = len(shape)
        kind = a["kind"]
        stem = False
        if kind == "conv":  # convolutions run NHWC (a reorder first where needed)
            x = a.get("x", n.ins[0])
            tx = self.tensor_type(x)
            stem = a["groups"] == 1 and tx.sizes()[1] <= _STEM_CHANNELS \
                and shape[1] <= _STEM_OUT and not any(
                p[0] != "eltwise" for p in posts) and self.strides_of(x) == _dense(
                tuple(tx.sizes()), range(4))
            if not stem:
                x = self.nhwc(x)
            strides = _dense(shape, (0, 2, 3, 1))
        elif kind in ("linear", "matmul", "softmax", "layer_norm", "reduce"):
            strides = _dense(shape, range(len(shape)))
        elif kind == "reorder":  # the layout the copy was for
            t = self.tensor_type(out)
            strides = _canonical(t.sizes(), t.strides())
        else:  # the first operand's dimension order
            src = self.strides_of(a["a"] if kind == "binary" else a["reads"][0])
            nhwc_src = len(shape) == 4 and src == _dense(
                tuple(self.tensor_type(a["a"] if kind == "binary" else a["reads"][0]).sizes()),
                (0, 2, 3, 1))
            strides = _dense(shape, (0, 2, 3, 1) if nhwc_src else range(len(shape)))
        for p in posts:
            if p[0] == "eltwise":
                specs.append(p)
            else:  # a full-shaped operand laid out as the result is
                other = self.batched(self.operand(p[2]), shape)
                if tuple(self.tensor_type(other).sizes()) == shape:
                    other = self.relayout(other, strides)
                specs.append(("binary", p[1], self.md_of_value(other, rank)))
                binaries.append((len(specs) - 1, other))
        if kind == "mean" and not posts and self._pooled(a["reads"][0], out, strides):
            return
        attr = D.post_ops(lib, specs)
        slot, _ = self.buffer(out, strides)
        args, handles = [], []
        dst_md = lib.md(shape, strides)
        binary_md = None  # a post-op operand's descriptor, where not as its value's
        try:
            if kind == "conv":
                wt, bt = a["w"], a["b"]
                g = a["groups"]
                oc, icg, kh, kw = wt.shape
                wshape = (g, oc // g, icg, kh, kw) if g > 1 else tuple(wt.shape)
                src_md = self.md_of_value(x)
                b_md = None if bt is None else lib.md(bt.shape, bt.stride())
                pad = a["padding"]
                tx, to = self.tensor_type(x), self.tensor_type(out)
                pad_r = _right_padding(tx, to, a["stride"], (kh, kw), a["dilation"], pad)
                pd = lib.convolution(src_md, lib.md_any(wshape), b_md,
                                     lib.md_any(shape) if stem else dst_md, a["stride"],
                                     [d - 1 for d in a["dilation"]], pad, pad_r, attr)
                if not stem and "scale" not in a and self._depthwise(
                        pd, attr, a, x, shape, specs, binaries, slot, src_md, b_md, dst_md,
                        out):
                    return
                if not stem and "scale" not in a and self._winograd(
                        pd, attr, a, x, shape, strides, specs, binaries, slot, src_md, b_md,
                        dst_md):
                    return
                self.memory(src_md, self._slot(x), args, D.ARG_SRC, handles)
                if "scale" not in a:  # (else once the primitive is known to be made)
                    wmem = self._packed_weights(pd, wt.reshape(wshape).contiguous())
                    self._weights_and_bias(args, wmem, bt, b_md)
                what = f"a convolution {tuple(tx.sizes())} -> {tuple(to.sizes())}"
            elif kind == "linear":
                x = n.ins[0]
                wt, bt = a["w"], a["b"]
                tx = self.tensor_type(x)
                r = tx.dim()
                nout, k = wt.shape
                src_md = self.md_of_value(x)
                rows = self._linear_rows(x, shape, strides, binaries)
                if rows is not None:  # one [rows, k] x [k, nout] product
                    n_rows, rows_of = rows

                    def rows_md(o):
                        return lib.md([rows_of(o), nout], [nout, 1])
                    binary_md = rows_md
                    src_md = lib.md([n_rows, k], [k, 1])
                    dst_md = lib.md([n_rows, nout], [nout, 1])
                    lib.d.dnnl_primitive_attr_destroy(attr)
                    attr = _post_ops_with(lib, specs, binaries, binary_md)
                    r = 2
                    self.p.n_linears_over_rows += 1
                w_md = lib.md_any([1] * (r - 2) + [k, nout])
                b_md = None if bt is None else lib.md([1] * (r - 1) + [nout], [nout] * (r - 1) + [1])
                pd = lib.matmul(src_md, w_md, b_md, dst_md, attr)
                as_conv = None if rows is None else self._linear_as_conv(
                    pd, n_rows, k, nout, specs, binaries, rows_of, bt, b_md, src_md, dst_md)
                if as_conv is None and rows is not None and self._mkl_linear(
                        pd, attr, x, wt, bt, n_rows, specs, binaries, binary_md, b_md, src_md,
                        dst_md, slot, rows_of):
                    return
                if as_conv is not None:  # one 1x1 convolution over the rows as pixels
                    lib.d.dnnl_primitive_desc_destroy(pd)
                    lib.d.dnnl_primitive_attr_destroy(attr)
                    pd, attr, src_md, dst_md, b_md, binary_md = as_conv
                    wmem = self._packed_weights(pd, wt.contiguous().reshape(nout, k, 1, 1))
                else:
                    wsrc = wt.t()  # [k, n] view of the [n, k] weight
                    wmem = self._packed_weights(pd, wsrc, shape=[1] * (r - 2) + [k, nout],
                                                strides=[k * nout] * (r - 2) + list(wsrc.stride()))
                self.memory(src_md, self._slot(x), args, D.ARG_SRC, handles)
                self._weights_and_bias(args, wmem, bt, b_md)
                what = f"a linear {tuple(tx.sizes())} x {tuple(wt.shape)}"
            elif kind == "eltwise":
                x = a["reads"][0]
                alg, alpha, beta = a["spec"]
                src_md = self.md_of_value(x)
                pd = lib.eltwise(alg, alpha, beta, src_md, dst_md, attr)
                self.memory(src_md, self._slot(x), args, D.ARG_SRC, handles)
                what = f"{n.kind} on {tuple(self.tensor_type(x).sizes())}"
            elif kind == "binary":
                b = self.operand(a["b"])
                if tuple(self.tensor_type(b).sizes()) == shape:
                    b = self.relayout(b, strides)
                s0, s1 = self.md_of_value(a["a"]), self.md_of_value(b, rank)
                pd = lib.binary(a["alg"], s0, s1, dst_md, attr)
                self.memory(s0, self._slot(a["a"]), args, D.ARG_SRC, handles)
                self.memory(s1, self._slot(b), args, D.ARG_SRC_1, handles)
                what = f"{n.kind} to {tuple(self.tensor_type(out).sizes())}"
            elif kind == "mean":  # an average pooling over the whole image
                x = a["reads"][0]
                src_md = self.md_of_value(x)
                hw = list(self.tensor_type(x).sizes())[2:]
                pd = lib.pooling(D.POOLING["avg_exclude_padding"], src_md, dst_md, [1, 1], hw,
                                 [0, 0], [0, 0], [0, 0], attr)
                self.memory(src_md, self._slot(x), args, D.ARG_SRC, handles)
                what = f"a mean over {tuple(self.tensor_type(x).sizes())}"
            elif kind == "matmul":
                x, w = a["a"], self.operand(a["b"])
                for again in (False, True):  # operands whose batches oneDNN cannot step
                    if again:                # through get dense copies
                        lib.d.dnnl_primitive_desc_destroy(pd)
                        x, w = self.dense(x), self.dense(w)
                    src_md, w_md = self.md_of_value(x), self.md_of_value(w, rank)
                    pd = lib.matmul(src_md, w_md, None, dst_md, attr)
                    if not lib.implementation(pd).startswith("ref"):
                        break
                self.memory(src_md, self._slot(x), args, D.ARG_SRC, handles)
                self.memory(w_md, self._slot(w), args, D.ARG_WEIGHTS, handles)
                what = f"a matrix product {tuple(self.tensor_type(x).sizes())} x " \
                       f"{tuple(self.tensor_type(w).sizes())}"
            elif kind == "reduce":  # the result's memory, described with the dimensions kept
                x = a["reads"][0]
                src_md = self.md_of_value(x)
                kept = a["kept"]
                dst_md = lib.md(kept, _dense(kept, range(len(kept))))
                pd = lib.reduction(D.REDUCTION_MEAN, src_md, dst_md, attr)
                self.memory(src_md, self._slot(x), args, D.ARG_SRC, handles)
                what = f"a mean over {tuple(self.tensor_type(x).sizes())}"
            elif kind == "softmax":
                x = a["reads"][0]
                src_md = self.md_of_value(x)
                pd = lib.softmax(src_md, dst_md, a["axis"], attr)
                self.memory(src_md, self._slot(x), args, D.ARG_SRC, handles)
                what = f"a softmax over {tuple(self.tensor_type(x).sizes())}"
            elif kind == "layer_norm":  # read row-major: the normalized dimension innermost
                x = self.relayout(a["reads"][0], strides)
                src_md = self.md_of_value(x)
                flags = (D.USE_SCALE if a["w"] is not None else 0) | (
                    D.USE_SHIFT if a["b"] is not None else 0)
                pd = lib.layer_norm(src_md, dst_md, a["eps"], flags, attr)
                self.memory(src_md, self._slot(x), args, D.ARG_SRC, handles)
                for arg, c in ((D.ARG_SCALE, a["w"]), (D.ARG_SHIFT, a["b"])):
                    if c is not None:
                        k = self.constant(c)
                        self.memory(self.md_of_value(k), self._slot(k), args, arg, handles)
                what = f"a layer normalization over {tuple(self.tensor_type(x).sizes())}"
            elif kind == "reorder":
                x = a["reads"][0]
                src_md = self.md_of_value(x)
                pd = lib.reorder(src_md, dst_md, attr)
                self.memory(src_md, self._slot(x), args, D.ARG_SRC, handles)
                what = f"a layout copy of {tuple(self.tensor_type(x).sizes())}"
            else:  # pool
                x = a["reads"][0]
                tx, to = self.tensor_type(x), self.tensor_type(out)
                src_md = self.md_of_value(x)
                pad = a["padding"]
                pad_r = _right_padding(tx, to, a["stride"], a["kernel"], a["dilation"], pad)
                pd = lib.pooling(a["alg"], src_md, dst_md, a["stride"], a["kernel"],
                                 [d - 1 for d in a["dilation"]], pad, pad_r, attr)
                self.memory(src_md, self._slot(x), args, D.ARG_SRC, handles)
                what = f"{n.kind} on {tuple(tx.sizes())}"
        except D.DnnlError as e:  # a combination oneDNN does not implement: not used
            self.layout.pop(out, None)
            self.p.fresh.pop(slot, None)
            raise _Reference(str(e)) from e
        if lib.implementation(pd).startswith("ref"):
            lib.d.dnnl_primitive_desc_destroy(pd)
            lib.d.dnnl_primitive_attr_destroy(attr)
            self.layout.pop(out, None)
            self.p.fresh.pop(slot, None)
            raise _Reference(what)
        if kind == "conv" and "scale" in a:
            try:
                wmem = self._scaled_weights(pd, a["w"].contiguous(), a["scale"])
            except D.DnnlError as e:
                lib.d.dnnl_primitive_desc_destroy(pd)
                lib.d.dnnl_primitive_attr_destroy(attr)
                self.layout.pop(out, None)
                self.p.fresh.pop(slot, None)
                raise _Reference(str(e)) from e
            self._weights_and_bias(args, wmem, a["b"], b_md)
        for index, other in binaries:
            md = binary_md(other) if binary_md else self.md_of_value(other, rank)
            self.memory(md, self._slot(other), args, D.post_op_src1(index), handles)
        if stem and not lib.d.dnnl_memory_desc_equal(lib.dst_md(pd).h, dst_md.h):
            self._step_then_reorder(pd, attr, args, handles, what, dst_md, slot)
            return
        self.memory(dst_md, slot, args, D.ARG_DST, handles)
        self._step(pd, attr, args, handles, what)

    def _linear_rows(self, x, shape, strides, binaries):
        """A linear's product over its rows, ``(rows, rows_of)``, where its input and
        result are dense and row-major and each post-op operand is either the result's
        shape (laid out as it) or a row broadcast along the others; ``rows_of`` gives an
        operand's rows (all of them, or the one broadcast). Else None.

        Described with its batch dimensions, oneDNN 3.2 runs a product as one per batch
        element: torchvision's attention projects a ``197 x 1 x 768`` sequence as 197
        products of one row (23 ms against 1.7 as one product of 197 rows, on a 2-core
        Xeon with AVX-512)."""
        if strides != _dense(shape, range(len(shape))):
            return None
        tx = self.tensor_type(x)
        if self.strides_of(x) != _dense(tuple(tx.sizes()), range(tx.dim())):
            return None
        nout = shape[-1]
        rows = 1
        for d in shape[:-1]:
            rows *= d
        if not rows or not nout or not tx.sizes()[-1]:  # an empty product: as traced
            return None
        full = {id(o) for _, o in binaries
                if tuple(self.tensor_type(o).sizes()) == tuple(shape)
                and self.strides_of(o) == strides}
        for _, o in binaries:
            size = tuple(self.tensor_type(o).sizes())
            if id(o) not in full and (size[-1] != nout or any(d != 1 for d in size[:-1])
                                      or self.strides_of(o)[-1] != 1):
                return None

        return rows, lambda o: rows if id(o) in full else 1

    def _linear_as_conv(self, pd, rows, k, nout, specs, binaries, rows_of, bias, bias_md,
                        src_md, dst_md):
        """For a linear run as a product over its rows (``pd`` on ``src_md`` and
        ``dst_md``, its bias described by ``bias_md``, its post-op operands' rows given
        by ``rows_of``: ``_linear_rows``) that oneDNN runs on its generic GEMM (no packed
        kernel for this ISA: ``gemm:jit`` on AVX2 with oneDNN 3.2), the same product as
        a 1x1 convolution over the rows taken as NHWC pixels, where oneDNN has a packed
        (``brgconv``) kernel for that and it is timed faster: ``(pd, attr, src_md,
        dst_md, bias_md, binary_md)``, or None."""
        lib = self.lib
        if not lib.implementation(pd).startswith(_LINEAR_AS_CONV):
            return None

        def pixels(channels, n):  # 1 x channels x n x 1, NHWC
            return lib.md([1, channels, n, 1], [n * channels, 1, channels, channels])

        def binary_md(o):
            return pixels(nout, rows_of(o))

        def row_md(o):
            return lib.md([rows_of(o), nout], [nout, 1])

        others = dict(binaries)
        attr = _post_ops_with(lib, specs, binaries, binary_md)
        c_src, c_dst = pixels(k, rows), pixels(nout, rows)
        b_md = None if bias is None else lib.md([nout], [1])
        try:
            cpd = lib.convolution(c_src, lib.md_any([nout, k, 1, 1]), b_md, c_dst, [1, 1],
                                  [0, 0], [0, 0], [0, 0], attr)
        except D.DnnlError:
            lib.d.dnnl_primitive_attr_destroy(attr)
            return None
        faster = lib.implementation(cpd).startswith("brgconv")
        if faster and _TIME_LINEAR_FORMS:
            key = _form_key(rows, k, nout, bias, specs, lambda i: rows_of(others[i]))
            if key not in _FORMS_TIMED:
                product = [(D.ARG_SRC, src_md), (D.ARG_WEIGHTS, lib.weights_md(pd)),
                           (D.ARG_DST, dst_md)]
                conv = [(D.ARG_SRC, c_src), (D.ARG_WEIGHTS, lib.weights_md(cpd)),
                        (D.ARG_DST, c_dst)]
                if bias is not None:
                    product.append((D.ARG_BIAS, bias_md))
                    conv.append((D.ARG_BIAS, b_md))
                for i, o in binaries:
                    product.append((D.post_op_src1(i), row_md(o)))
                    conv.append((D.post_op_src1(i), binary_md(o)))
                _FORMS_TIMED[key] = _faster(lib, [(cpd, conv), (pd, product)]) == 0
            faster = _FORMS_TIMED[key]
        if not faster:
            lib.d.dnnl_primitive_desc_destroy(cpd)
            lib.d.dnnl_primitive_attr_destroy(attr)
            return None
        self.p.n_linears_as_conv += 1
        return cpd, attr, c_src, c_dst, b_md, binary_md

    def _mkl_linear(self, pd, attr, x, w, bias, rows, specs, binaries, row_md, bias_md,
                    src_md, dst_md, slot, rows_of) -> bool:
        """A linear over its rows (``_linear_rows``; ``pd`` its oneDNN product with
        ``attr``) run as MKL's packed GEMM into ``slot``, then one primitive in place for
        the bias and the post-ops, where that is timed faster than ``pd`` (once per
        shape, post-ops and process: ``_MKL_TIMED``). True where so emitted (``pd`` and
        ``attr`` destroyed), else False (both left as they are)."""
        if not _MKL_LINEARS or not mkl_gemm.available():
            return False
        lib = self.lib
        nout, k = w.shape
        others = dict(binaries)
        key = _form_key(rows, k, nout, bias, specs, lambda i: rows_of(others[i]))
        if _MKL_TIMED.get(key) is False:
            return False
        # the epilogue: the bias added as a broadcast row, the post-ops fused into it
        # (with no bias, the first post-op is the primitive, the others fused)
        ops = [("binary", D.BINARY["add"], None)] if bias is not None else []
        ops += [("binary", p[1], row_md(others[i]), others[i]) if p[0] == "binary" else p
                for i, p in enumerate(specs)]
        epilogue, e_mds = None, []
        if ops:
            first, rest = ops[0], ops[1:]
            eattr = D.post_ops(lib, [o[:3] if o[0] == "binary" else o for o in rest])
            if first[0] == "eltwise":
                epilogue = lib.eltwise(first[1], first[2], first[3], dst_md, dst_md, eattr)
                e_mds.append((D.ARG_SRC, dst_md))
            else:
                src1_md = bias_md if bias is not None else first[2]
                epilogue = lib.binary(first[1], dst_md, src1_md, dst_md, eattr)
                e_mds += [(D.ARG_SRC, dst_md), (D.ARG_SRC_1, src1_md)]
            e_mds.append((D.ARG_DST, dst_md))
            e_mds += [(D.post_op_src1(i), o[2]) for i, o in enumerate(rest) if o[0] == "binary"]
            if lib.implementation(epilogue).startswith("ref"):  # no kernel for it: as is
                lib.d.dnnl_primitive_desc_destroy(epilogue)
                lib.d.dnnl_primitive_attr_destroy(eattr)
                return False
        packed = mkl_gemm.Packed(w, rows)
        if key not in _MKL_TIMED:
            mds = [(D.ARG_SRC, src_md), (D.ARG_WEIGHTS, lib.weights_md(pd)), (D.ARG_DST, dst_md)]
            if bias is not None:
                mds.append((D.ARG_BIAS, bias_md))
            mds += [(D.post_op_src1(i), row_md(o)) for i, o in binaries]
            a, c = torch.rand(rows * k) - 0.5, torch.empty(rows * nout)
            others_packed = [mkl_gemm.Packed(torch.rand(nout, k) - 0.5, rows)
                             for _ in range(_copies(nout * k * 4) - 1)]
            mkl_runs = [_cycle([functools.partial(q.product, a.data_ptr(), c.data_ptr())
                                for q in [packed] + others_packed])]
            if epilogue is not None:
                mkl_runs.append(_timed_primitive(lib, epilogue, e_mds, [a, c]))
            _MKL_TIMED[key] = _fastest([_timed_primitive(lib, pd, mds, []),
                                        lambda runs=mkl_runs: [r() for r in runs]],
                                       [1.0, 1.0 + _MKL_MARGIN]) == 1
            if not _MKL_TIMED[key]:
                if epilogue is not None:
                    lib.d.dnnl_primitive_desc_destroy(epilogue)
                    lib.d.dnnl_primitive_attr_destroy(eattr)
                return False
        lib.d.dnnl_primitive_desc_destroy(pd)
        lib.d.dnnl_primitive_attr_destroy(attr)
        self._keep(packed.buf)
        xs = self._slot(x)
        step = _mkl_step(packed, xs, slot, self.p.env, self.dynamic)
        self.p.steps.append(step)
        self.p.n_mkl_linears += 1
        what = f"a linear {tuple(self.tensor_type(x).sizes())} x {tuple(w.shape)}"
        if epilogue is None:
            return True
        args, handles = [], []
        self.memory(dst_md, slot, args, D.ARG_SRC, handles)
        if bias is not None:
            b = bias.detach().contiguous()
            self._keep(b)
            args.append((D.ARG_SRC_1, D.Memory(lib, bias_md, b.data_ptr())))
        elif ops[0][0] == "binary":
            self.memory(ops[0][2], self._slot(ops[0][3]), args, D.ARG_SRC_1, handles)
        self.memory(dst_md, slot, args, D.ARG_DST, handles)
        for i, o in enumerate(ops[1:]):
            if o[0] == "binary":
                self.memory(o[2], self._slot(o[3]), args, D.post_op_src1(i), handles)
        self._step(epilogue, eattr, args, handles, f"the bias and post-ops of {what}")
        return True

    def _winograd(self, pd, attr, a, x, shape, strides, specs, binaries, slot, src_md,
                  b_md, dst_md) -> bool:
        """A 3x3 convolution (``pd`` with ``attr``) run as Winograd F(4x4, 3x3) into
        ``slot`` (``winograd.Conv``), its post-ops ReLU and residual adds, where that is
        timed faster than ``pd`` (once per shape, post-ops and process:
        ``_WINOGRAD_TIMED``). True where so emitted (``pd`` and ``attr`` destroyed), else
        False (both left as they are)."""
        wt, bt = a["w"], a["b"]
        n, c, h, w = self.tensor_type(x).sizes()
        if not _WINOGRAD or a["groups"] != 1 or not winograd.fits(wt.shape) \
                or list(a["stride"]) != [1, 1] or list(a["dilation"]) != [1, 1] \
                or list(a["padding"]) != [1, 1] or tuple(shape) != (n, wt.shape[0], h, w) \
                or self.strides_of(x) != _dense((n, c, h, w), (0, 2, 3, 1)):
            return False
        others, ops = dict(binaries), []
        for i, p in enumerate(specs):
            if p[0] == "eltwise" and p[1] == D.ELTWISE["relu"] and p[2] == 0:
                ops.append("relu")
            elif p[0] == "binary" and p[1] == D.BINARY["add"] \
                    and tuple(self.tensor_type(others[i]).sizes()) == tuple(shape) \
                    and self.strides_of(others[i]) == strides:
                ops.append("add")
            else:
                return False
        if not winograd.available():
            return False
        lib = self.lib
        key = (n, c, h, w, wt.shape[0], bt is not None, tuple(ops))
        if key not in _WINOGRAD_TIMED:
            mds = [(D.ARG_SRC, src_md), (D.ARG_WEIGHTS, lib.weights_md(pd)), (D.ARG_DST, dst_md)]
            if bt is not None:
                mds.append((D.ARG_BIAS, b_md))
            mds += [(D.post_op_src1(i), specs[i][2]) for i, _ in binaries]
            _WINOGRAD_TIMED[key] = _fastest([_timed_primitive(lib, pd, mds, []),
                                             _timed_winograd(n, h, w, wt, bt, ops)]) == 1
        if not _WINOGRAD_TIMED[key]:
            return False
        lib.d.dnnl_primitive_desc_destroy(pd)
        lib.d.dnnl_primitive_attr_destroy(attr)
        conv = winograd.Conv(n, h, w, wt, bt, ops)  # (the step keeps it alive)
        self.winograd.append(conv)
        xs = self._slot(x)
        reads = [(i, self._slot(others[i])) for i, o in enumerate(ops) if o == "add"]
        operands = conv.operands
        if self.dynamic.isdisjoint([xs, slot] + [s for _, s in reads]):
            for q, s in reads:  # every buffer the program's own: addresses bound once
                operands[q] = self.p.env[s].data_ptr()
            x_ptr, y_ptr = self.p.env[xs].data_ptr(), self.p.env[slot].data_ptr()

            def step(env):
                conv(x_ptr, y_ptr)
        else:
            def step(env):
                for q, s in reads:
                    operands[q] = env[s].data_ptr()
                conv(env[xs].data_ptr(), env[slot].data_ptr())
        step.conv = conv
        self.p.steps.append(step)
        self.p.n_winograd += 1
        return True

    def _depthwise(self, pd, attr, a, x, shape, specs, binaries, slot, src_md, b_md,
                   dst_md, out) -> bool:
        """A depthwise convolution (``pd`` with ``attr``) with its activation run by
        ``depthwise.Conv`` into ``slot``, where that (with the mean over its image, where
        the next plan item is one: ``_pooled``) is timed faster than ``pd`` (and the
        pooling), once per shape and process (``_DEPTHWISE_TIMED``). True where so
        emitted (``pd`` and ``attr`` destroyed), else False (both left as they are)."""
        wt, bt = a["w"], a["b"]
        n, c, h, w = self.tensor_type(x).sizes()
        if not _DEPTHWISE or binaries or a["groups"] != c or tuple(wt.shape[:2]) != (c, 1) \
                or shape[1] != c or self.strides_of(x) != _dense((n, c, h, w), (0, 2, 3, 1)) \
                or not depthwise.fits(wt.shape, a["stride"], a["padding"], a["dilation"]):
            return False
        act = _depthwise_act(specs)
        if act is None or not depthwise.available():
            return False
        lib = self.lib
        nxt = self.next_item
        pooled = nxt is not None and nxt[0] == "primitive" and nxt[2]["kind"] == "mean" \
            and not nxt[3] and nxt[4] not in self.outputs \
            and self.alias.get(nxt[2]["reads"][0], nxt[2]["reads"][0]) is out
        key = (n, c, h, w, wt.shape[-1], a["stride"][0], bt is not None, act, pooled)
        if key not in _DEPTHWISE_TIMED:
            mds = [(D.ARG_SRC, src_md), (D.ARG_WEIGHTS, lib.weights_md(pd)), (D.ARG_DST, dst_md)]
            if bt is not None:
                mds.append((D.ARG_BIAS, b_md))
            theirs = [_timed_primitive(lib, pd, mds, [])]
            if pooled:  # and oneDNN's pooling after it
                mean_md = lib.md((n, c, 1, 1), (c, 1, c, c))
                pattr = D.post_ops(lib, [])
                ppd = lib.pooling(D.POOLING["avg_exclude_padding"], dst_md, mean_md, [1, 1],
                                  list(shape[2:]), [0, 0], [0, 0], [0, 0], pattr)
                theirs.append(_timed_primitive(lib, ppd, [(D.ARG_SRC, dst_md),
                                                          (D.ARG_DST, mean_md)], []))
                lib.d.dnnl_primitive_desc_destroy(ppd)
                lib.d.dnnl_primitive_attr_destroy(pattr)
            _DEPTHWISE_TIMED[key] = _fastest([_sequence(theirs), _timed_depthwise(
                n, h, w, wt, bt, a["stride"][0], act, pooled)]) == 1
        if not _DEPTHWISE_TIMED[key]:
            return False
        lib.d.dnnl_primitive_desc_destroy(pd)
        lib.d.dnnl_primitive_attr_destroy(attr)
        conv = depthwise.Conv(n, h, w, wt, bt, a["stride"][0], *act)
        self.depthwise.append(conv)
        step = self._kernel_step(conv, [self._slot(x), slot],
                                 f"a depthwise convolution {(n, c, h, w)} -> {tuple(shape)}")
        step.conv = conv
        self.p.steps.append(step)
        self.p.n_depthwise += 1
        if pooled:
            self.pool_from[out] = (conv, step)
        return True

    def _kernel_step(self, k, slots: list, what: str):
        """A step running ``k``, a kernel of ours (``point(*addresses)``, ``run()``,
        ``kernel``, ``args``), on the buffers of ``slots``: where every one is the
        program's own, their addresses are set once and the step may join a
        ``native_loop.Run``; else they are read each call."""
        point, run = k.point, k.run
        if self.dynamic.isdisjoint(slots):
            point(*[self.p.env[s].data_ptr() for s in slots])

            def step(env):
                run()
            step.fixed = True
            step.prim = native_loop.Kernel(k.kernel, k.args, what, k)
        else:
            def step(env):
                point(*[env[s].data_ptr() for s in slots])
                run()
        return step

    def _pooled(self, x, out, strides) -> bool:
        """The mean over ``x``'s image into ``out`` written by the depthwise convolution
        whose step is the last so far and made ``x`` (``_depthwise``); False where there
        is none."""
        conv, step = self.pool_from.pop(self.alias.get(x, x), (None, None))
        if conv is None or not self.p.steps or self.p.steps[-1] is not step \
                or out in self.outputs:
            return False
        _, buf = self.buffer(out, strides)
        conv.pool_into(buf.data_ptr())
        self.p.n_pooled += 1
        return True

    def _step_then_reorder(self, pd, attr, args, handles, what, dst_md, slot) -> None:
        """The primitive writing a buffer of its own in the layout it chose, then a
        reorder from there into ``slot`` (laid out as ``dst_md``)."""
        lib = self.lib
        chosen = lib.dst_md(pd)
        buf = torch.empty(chosen.nbytes // 4 + 16)
        self._keep(buf)
        args.append((D.ARG_DST, D.Memory(lib, chosen, buf.data_ptr())))
        rargs, rhandles = [(D.ARG_SRC, D.Memory(lib, chosen, buf.data_ptr()))], []
        self.memory(dst_md, slot, rargs, D.ARG_DST, rhandles)
        rattr = D.post_ops(lib, [])
        rpd = lib.reorder(chosen, dst_md, rattr)
        self._step(pd, attr, args, handles, what)
        self._step(rpd, rattr, rargs, rhandles, f"a reorder of {what}'s result")

    def _step(self, pd, attr, args: list, handles: list, what: str) -> None:
        self._scratch(pd, args)
        prim = D.Primitive(self.lib, pd, attr, args, what)
        self.p.steps.append(_primitive_step(self.lib, prim, handles))
        self.p.n_primitives += 1

    def _emit_attention(self, a, out) -> None:
        """Attention as three primitives: ``q k^T`` (the scale and the mask as post-ops)
        into a scores buffer, a softmax there in place, and the product with ``v``."""
        lib = self.lib
        q, k, v = a["q"], a["k"], a["v"]
        tq, tk = tuple(self.tensor_type(q).sizes()), tuple(self.tensor_type(k).sizes())
        r = len(tq)
        sshape = tq[:-1] + tk[-2:-1]
        sstrides = _dense(sshape, range(r))
        specs, mask = [("eltwise", D.ELTWISE["linear"], a["scale"], 0.0)], None
        if a["mask"] is not None:
            mask = self.operand(a["mask"]) if not isinstance(a["mask"], torch.Tensor) \
                else self.batched(self.constant(a["mask"]), sshape)
            specs.append(("binary", D.BINARY["add"], self.md_of_value(mask, r)))
        s_md = lib.md(sshape, sstrides)
        shape = tuple(self.tensor_type(out).sizes())
        strides = _dense(shape, range(r))
        o_md = lib.md(shape, strides)
        for again in (False, True):  # operands whose batches oneDNN cannot step through
            if again:                # get dense copies
                q, k, v = self.dense(q), self.dense(k), self.dense(v)
            kst = self.strides_of(k)  # k^T: the last two dimensions' strides swapped
            kt_md = lib.md(tk[:-2] + (tk[-1], tk[-2]), kst[:-2] + (kst[-1], kst[-2]))
            q_md, v_md = self.md_of_value(q), self.md_of_value(v)
            made = [(lib.matmul(q_md, kt_md, None, s_md, attr := D.post_ops(lib, specs)),
                     attr)]
            made.append((lib.softmax(s_md, s_md, r - 1, attr := D.post_ops(lib, [])), attr))
            made.append((lib.matmul(s_md, v_md, None, o_md, attr := D.post_ops(lib, [])),
                         attr))
            if not any(lib.implementation(pd).startswith("ref") for pd, _ in made):
                break
            for pd, attr in made:
                lib.d.dnnl_primitive_desc_destroy(pd)
                lib.d.dnnl_primitive_attr_destroy(attr)
        else:
            raise _Reference(f"attention over {tq}")
        if self._attention(a, made, (q, k, v, mask), (q_md, kt_md, v_md, s_md, o_md), out,
                           shape, strides):
            return
        scores = _Copy(None)  # a value made here, dead once the call's product is made
        self.tensor_types[scores] = _Type(sshape, sstrides)
        s_slot, _ = self.buffer(scores, sstrides)
        o_slot, _ = self.buffer(out, strides)
        what = f"attention over {tq}"
        args, handles = [], []
        self.memory(q_md, self._slot(q), args, D.ARG_SRC, handles)
        self.memory(kt_md, self._slot(k), args, D.ARG_WEIGHTS, handles)
        if mask is not None:
            self.memory(self.md_of_value(mask, r), self._slot(mask), args, D.post_op_src1(1),
                        handles)
        self.memory(s_md, s_slot, args, D.ARG_DST, handles)
        self._step(*made[0], args, handles, f"the scores of {what}")
        args, handles = [], []
        self.memory(s_md, s_slot, args, D.ARG_SRC, handles)
        self.memory(s_md, s_slot, args, D.ARG_DST, handles)
        self._step(*made[1], args, handles, f"the softmax of {what}")
        args, handles = [], []
        self.memory(s_md, s_slot, args, D.ARG_SRC, handles)
        self.memory(v_md, self._slot(v), args, D.ARG_WEIGHTS, handles)
        self.memory(o_md, o_slot, args, D.ARG_DST, handles)
        self._step(*made[2], args, handles, f"the weighted sum of {what}")
        self._free(scores)

    def _emit_rms_norm(self, a, out) -> None:
        """An RMS norm (``_rms_norm``) as one ``rms_norm.Norm`` over dense rows."""
        shape = tuple(self.tensor_type(out).sizes())
        strides = _dense(shape, range(len(shape)))
        x = self.relayout(a["reads"][0], strides)
        norm = rms_norm.Norm(math.prod(shape[:-1]), shape[-1], a["eps"], a["w"])
        xs = self._slot(x)
        slot, _ = self.buffer(out, strides)
        step = self._kernel_step(norm, [xs, slot], f"an RMS norm over {shape}")
        step.norm = norm
        self.p.steps.append(step)
        self.p.n_rms_norm += 1

    def _attention(self, a, made, operands, mds, out, shape, strides) -> bool:
        """The attention ``made`` would run (three primitives, with the operands and
        descriptors given) as ``attention.Attention`` into ``out``, where that is timed
        faster (once per shape and process: ``_ATTENTION_TIMED``). True where so emitted
        (the primitives destroyed), else False (left as they are)."""
        q, k, v, mask = operands
        r = len(shape)
        if not _ATTENTION or r not in (3, 4) or not attention.available():
            return False
        sizes = [tuple(self.tensor_type(x).sizes()) for x in (q, k, v)]
        st = [self.strides_of(x) for x in (q, k, v)]
        if any(t[-1] != 1 and z[-1] != 1 for t, z in zip(st, sizes)):
            return False  # (the kernel reads rows dense)

        def bhr(t):  # (batch, head, row) strides
            return tuple(t[:3]) if r == 4 else (t[0], 0, t[1])

        (*bh, l, d), s, dv = sizes[0], sizes[1][-2], sizes[2][-1]
        b, h = bh if r == 4 else (bh[0], 1)
        ms = None
        if mask is not None:
            mz = (1,) * r + tuple(self.tensor_type(mask).sizes())
            mt = (0,) * r + tuple(self.strides_of(mask))
            mt = [0 if z == 1 else t for z, t in zip(mz[-r:], mt[-r:])]
            ms = tuple(mt) if r == 4 else (mt[0], 0, mt[1], mt[2])
        key = (b, h, l, s, d, dv, mask is not None)
        lib = self.lib
        if key not in _ATTENTION_TIMED:
            q_md, kt_md, v_md, s_md, o_md = mds
            first = [(D.ARG_SRC, q_md), (D.ARG_WEIGHTS, kt_md), (D.ARG_DST, s_md)]
            if mask is not None:
                first.append((D.post_op_src1(1), self.md_of_value(mask, r)))
            theirs = _sequence([_timed_primitive(lib, pd, m, []) for (pd, _), m in zip(made, (
                first, [(D.ARG_SRC, s_md), (D.ARG_DST, s_md)],
                [(D.ARG_SRC, s_md), (D.ARG_WEIGHTS, v_md), (D.ARG_DST, o_md)]))])
            ours = _timed_attention((b, h, l, s, d, dv), a["scale"],
                                    [bhr(t) for t in st] + [bhr(_dense(shape, range(r)))],
                                    [q_md, kt_md, v_md, o_md], ms)
            _ATTENTION_TIMED[key] = _fastest([theirs, ours]) == 1
        if not _ATTENTION_TIMED[key]:
            return False
        for pd, attr in made:
            lib.d.dnnl_primitive_desc_destroy(pd)
            lib.d.dnnl_primitive_attr_destroy(attr)
        att = attention.Attention(b, h, l, s, d, dv, a["scale"])
        att.strides(*[bhr(t) for t in st], bhr(strides), ms)
        self.attentions.append(att)
        o_slot, _ = self.buffer(out, strides)
        slots = [self._slot(x) for x in (q, k, v)] + [o_slot] + (
            [self._slot(mask)] if mask is not None else [])
        step = self._kernel_step(att, slots, f"attention over {sizes[0]}")
        step.attention = att
        self.p.steps.append(step)
        self.p.n_attention += 1
        return True

    def _scratch(self, pd, args: list) -> None:
        """The primitive's scratch memory: the program's one buffer, bound once every
        primitive is made."""
        scratch = self.lib.scratchpad_md(pd)
        if scratch is not None and scratch.nbytes:
            m = D.Memory(self.lib, scratch, 0)
            args.append((D.ARG_SCRATCHPAD, m))
            self.scratch.append(m)
            self.scratch_bytes = max(self.scratch_bytes, scratch.nbytes)

    def _scaled_weights(self, pd, w: torch.Tensor, scale):
        """A buffer in the layout ``pd`` wants its weights, and the step (before the
        primitive's) writing ``w`` (O x C x 1 x 1) into it, each input channel times
        its scale in ``scale`` (1 x C x 1 x 1) each call."""
        lib = self.lib
        c = w.shape[1]
        if self.strides_of(scale)[1] != 1:
            scale = self.dense(scale)
        src_md, dst_md = lib.md(w.shape, w.stride()), lib.weights_md(pd)
        attr = D.scaled_source(lib, 1 << 1)
        try:
            rpd = lib.reorder(src_md, dst_md, attr)
        except D.DnnlError:
            lib.d.dnnl_primitive_attr_destroy(attr)
            raise
        self._keep(w)
        buf = torch.empty(dst_md.nbytes // 4 + 16)
        self._keep(buf)
        dst = D.Memory(lib, dst_md, buf.data_ptr())
        args, handles = [(D.ARG_SRC, D.Memory(lib, src_md, w.data_ptr()))], []
        self.memory(lib.md((c,), (1,)), self._slot(scale), args,
                    D.ARG_ATTR_SCALES | D.ARG_SRC, handles)
        args.append((D.ARG_DST, dst))
        self._step(rpd, attr, args, handles, f"scaling {tuple(w.shape)} weights by channel")
        self.p.n_scaled_weights += 1
        return dst

    def _weights_and_bias(self, args: list, wmem, bias, b_md) -> None:
        args.append((D.ARG_WEIGHTS, wmem))
        if bias is not None:
            b = bias.contiguous()
            self._keep(b)
            args.append((D.ARG_BIAS, D.Memory(self.lib, b_md, b.data_ptr())))

    def _keep(self, t: torch.Tensor) -> None:
        self.p.kept_storage.add(t.untyped_storage().data_ptr())
        self.p.__dict__.setdefault("kept", []).append(t)

    def _packed_weights(self, pd, w: torch.Tensor, shape=None, strides=None):
        lib = self.lib
        src_md = lib.md(shape or w.shape, strides or w.stride())
        dst_md = lib.weights_md(pd)
        buf = torch.empty(dst_md.nbytes // 4 + 16)
        self._keep(buf)
        src, dst = D.Memory(lib, src_md, w.data_ptr()), D.Memory(lib, dst_md, buf.data_ptr())
        rpd = lib.reorder(src_md, dst_md)
        D.Primitive(lib, rpd, None, [(D.ARG_SRC, src), (D.ARG_DST, dst)],
                    "reordering weights").run()
        lib.check(lib.d.dnnl_stream_wait(lib.stream), "waiting for a reorder")
        return dst

    def _emit_aten(self, n: _Node) -> None:
        if n.kind == "prim::TupleConstruct":
            return
        ins = [self.traced_layout(v) if self._tensor_operand(v) else v for v in n.ins]
        if n.kind == "prim::ListConstruct":
            for v in ins:  # the list is read later: its tensors keep their buffers
                s = self.slot.get(self.alias.get(v, v))
                if s is not None:
                    self.pinned.add(s)
            parts = [self.value(v) for v in ins]
            s = self.new_slot(n.outs[0])
            self.dynamic.add(s)

            def make(env, parts=parts, s=s):
                env[s] = [env[x] if not ok else x for ok, x in parts]
            self.p.steps.append(make)
            return
        if n.kind == "prim::ListUnpack":
            ok, src = self.value(n.ins[0])
            outs = [self.new_slot(v) for v in n.outs]
            if src not in self.dynamic:  # a list of fixed views
                for s, t in zip(outs, self.p.env[src]):
                    self.p.env[s] = t
                return
            self.dynamic.update(outs)

            def unpack(env, src=src, outs=outs):
                for s, t in zip(outs, env[src]):
                    env[s] = t
            self.p.steps.append(unpack)
            return
        for v in ins:  # its result may be a view of what it reads
            s = self.slot.get(self.alias.get(v, v))
            if s is not None:
                self.pinned.add(s)
        fn, kw = _aten_op(n.node)
        parts = [self.value(v) for v in ins]
        names = [a.name for a in kw] if kw else []
        npos = len(parts) - len(names)
        outs = [self.new_slot(v) for v in n.outs]
        one = len(outs) == 1
        # the layouts the primitives reading these results were made for
        want = [(tuple(t.sizes()), _canonical(t.sizes(), t.strides()))
                if (t := self.tensor_type(v)) is not None else None for v in n.outs]
        if n.kind in _VIEWS and self._fixed_view(fn, parts, names, outs, want):
            self.p.n_fixed_views += 1
            return
        self.dynamic.update(outs)

        def call(env, fn=fn, parts=parts, outs=outs, one=one, npos=npos, names=names,
                 want=want):
            vals = [env[x] if not ok else x for ok, x in parts]
            r = fn(*vals[:npos], **dict(zip(names, vals[npos:]))) if names else fn(*vals)
            for s, t, w in zip(outs, (r,) if one else r, want):
                if w is not None and t.__class__ is torch.Tensor \
                        and _canonical(w[0], t.stride()) != w[1]:
                    t = torch.empty_strided(w[0], w[1], dtype=t.dtype).copy_(t)
                env[s] = t
        self.p.steps.append(call)
        self.p.n_aten += 1
        self.p.aten_ops.append(n.kind)


    def _fixed_view(self, fn, parts, names, outs, want) -> bool:
        """Made here where a view op reads only buffers fixed for the program's life and
        its results are views of them laid out as traced: nothing runs per call."""
        if any(not ok and x in self.dynamic for ok, x in parts):
            return False
        vals = [x if ok else self.p.env[x] for ok, x in parts]
        bases = {v.untyped_storage().data_ptr() for v in vals if isinstance(v, torch.Tensor)}
        npos = len(vals) - len(names)
        r = fn(*vals[:npos], **dict(zip(names, vals[npos:])))
        results = (r,) if len(outs) == 1 else tuple(r)
        for t, w in zip(results, want):
            ts = t if isinstance(t, (list, tuple)) else [t]
            if not all(isinstance(x, torch.Tensor)
                       and x.untyped_storage().data_ptr() in bases for x in ts):
                return False
            if w is not None and (tuple(t.shape) != w[0]
                                  or _canonical(w[0], t.stride()) != w[1]):
                return False
        for s, t in zip(outs, results):
            self.p.env[s] = list(t) if isinstance(t, tuple) else t
        return True


def _right_padding(tx, to, stride, kernel, dilation, pad) -> list[int]:
    """The padding after each spatial dimension that gives the traced output size (more
    than ``pad`` under ``ceil_mode``)."""
    return [(o - 1) * s + (k - 1) * d + 1 - i - p for o, s, k, d, i, p in zip(
        to.sizes()[2:], stride, kernel, dilation, tx.sizes()[2:], pad)]


def _post_ops_with(lib: D.Lib, specs: list, binaries: list, md_of):
    """An attribute with post-ops ``specs``, each binary one's operand (``binaries``:
    ``(index, value)``) described by ``md_of(value)``."""
    others = dict(binaries)
    return D.post_ops(lib, [("binary", p[1], md_of(others[i])) if p[0] == "binary" else p
                            for i, p in enumerate(specs)])


def _form_key(rows, k, nout, bias, specs, operand_rows) -> tuple:
    """What a linear's timed form depends on: its shape, bias and post-ops (a binary
    one's operand by its rows: all of them or one)."""
    return (rows, k, nout, bias is not None,
            tuple(p[:2] + ((operand_rows(i),) if p[0] == "binary" else p[2:])
                  for i, p in enumerate(specs)))


def _copies(weight_bytes: int) -> int:
    """How many copies of a weight a timed form cycles through: in a model, each
    weight comes from memory or the last-level cache, not from the core's own."""
    return max(1, min(_FORM_COPIES, -(-_FORM_WEIGHT_SET // max(1, weight_bytes))))


def _timed_primitive(lib: D.Lib, pd, mds: list, keep: list):
    """A run of a clone of ``pd`` (left as it is) on random data of its own:
    ``mds`` is ``[(argument, md), ...]``; the tensors made go to ``keep``. With
    weights, each run takes the next of ``_copies`` copies of them."""
    w = [md.nbytes for arg, md in mds if arg == D.ARG_WEIGHTS]
    scratch = lib.scratchpad_md(pd)
    shared = {}  # every operand but the weights: the same in each copy, as in a model
    prims = []
    for _ in range(_copies(w[0]) if w else 1):
        args = []
        for arg, md in mds + ([(D.ARG_SCRATCHPAD, scratch)] if scratch is not None
                              and scratch.nbytes else []):
            if arg == D.ARG_WEIGHTS or arg not in shared:
                t = torch.rand(md.nbytes // 4 + 16) - 0.5
                keep.append(t)
                if arg != D.ARG_WEIGHTS:
                    shared[arg] = t
            else:
                t = shared[arg]
            args.append((arg, D.Memory(lib, md, t.data_ptr())))
        prims.append(D.Primitive(lib, lib.clone(pd), None, args, "a timed form").run)
    run = _cycle(prims)
    run.keep = keep  # the operands' tensors live as long as the run
    return run


def _timed_winograd(n, h, w, weight, bias, ops):
    """A run of ``winograd.Conv`` on random data of its own, as ``_timed_primitive``:
    each run takes the next of ``_copies`` copies of the transformed weights."""
    convs = [winograd.Conv(n, h, w, weight if i == 0 else torch.rand_like(weight) - 0.5,
                           bias, ops) for i in range(_copies(weight.numel() * 4 * 4))]
    nv, nm = convs[0].work()
    v, m = torch.empty(nv), torch.empty(nm)
    k, c = weight.shape[:2]
    x, y = torch.rand(n * h * w * c) - 0.5, torch.empty(n * h * w * k)
    operand = torch.rand(n * h * w * k) - 0.5
    for conv in convs:
        conv.bind(v, m)
        for q, o in enumerate(ops):
            if o == "add":
                conv.operands[q] = operand.data_ptr()
    run = _cycle([functools.partial(conv, x.data_ptr(), y.data_ptr()) for conv in convs])
    run.keep = [convs, v, m, x, y, operand]
    return run


def _depthwise_act(specs: list):
    """``(act, lo, hi)`` for ``depthwise.Conv`` applying post-ops ``specs``, or None."""
    if not specs:
        return None, 0.0, 0.0
    if len(specs) != 1 or specs[0][0] != "eltwise":
        return None
    _, alg, alpha, beta = specs[0]
    if alg == D.ELTWISE["swish"] and alpha == 1.0:
        return "silu", 0.0, 0.0
    if alg == D.ELTWISE["relu"] and alpha == 0.0:
        return "clip", 0.0, _INF
    if alg == D.ELTWISE["clip"] and alpha <= beta:
        return "clip", alpha, beta
    if alg == D.ELTWISE["hardswish"] and (alpha, beta) == (1.0 / 6.0, 0.5):
        return "hardswish", 0.0, 0.0
    return None


def _timed_depthwise(n, h, w, weight, bias, stride, act, pooled):
    """A run of ``depthwise.Conv`` on random data of its own, as ``_timed_primitive``."""
    convs = [depthwise.Conv(n, h, w, weight if i == 0 else torch.rand_like(weight) - 0.5,
                            bias, stride, *act)
             for i in range(_copies(weight.numel() * 4))]
    c = weight.shape[0]
    x, y = torch.rand(n * h * w * c) - 0.5, torch.empty(math.prod(convs[0].shape))
    rows, mean = torch.empty(convs[0].work()), torch.empty(n * c)
    for conv in convs:
        conv.bind(rows)
        if pooled:
            conv.pool_into(mean.data_ptr())
    run = _cycle([functools.partial(conv, x.data_ptr(), y.data_ptr()) for conv in convs])
    run.keep = [convs, x, y, rows, mean]
    return run


def _timed_attention(shape, scale, strides, mds, mask_strides):
    """A run of ``attention.Attention`` on random data of its own, its operands laid out
    as the program's (``mds``: q, k^T, v, o)."""
    att = attention.Attention(*shape, scale)
    att.strides(*strides, mask_strides)
    b, h, l, s = shape[:4]
    keep = [torch.rand(md.nbytes // 4 + 16) - 0.5 for md in mds]
    if mask_strides is not None:
        span = 1 + sum((z - 1) * t for z, t in zip((b, h, l, s), mask_strides))
        keep.append(torch.rand(span) - 0.5)
    work = torch.empty(att.work())
    att.bind(work)
    att.point(*[t.data_ptr() for t in keep])
    run = att.run
    run_keep = [att, keep, work]

    def timed():
        run()
    timed.keep = run_keep
    return timed


def _sequence(runs: list):
    """One callable running each of ``runs`` in order."""
    if len(runs) == 1:
        return runs[0]

    def run():
        for r in runs:
            r()
    run.keep = runs
    return run


def _cycle(runs: list):
    """One callable running ``runs`` in turn, one per call."""
    state = [0]

    def run():
        i = state[0]
        state[0] = (i + 1) % len(runs)
        runs[i]()
    return run


def _faster(lib: D.Lib, forms: list) -> int:
    """The index of the fastest of ``forms``, each ``(pd, [(argument, md), ...])`` (the
    primitive descriptor is left as it is), run on random data of their own."""
    keep: list = []
    return _fastest([_timed_primitive(lib, pd, mds, keep) for pd, mds in forms])


def _fastest(runs: list, handicaps: list | None = None) -> int:
    """The index of the fastest of ``runs`` (callables), interleaved: the median of
    ``_FORM_ROUNDS`` blocks of about ``_FORM_BLOCK_MS``, each multiplied by its
    ``handicaps`` factor where given (a form kept only where it wins by a margin)."""
    from .. import timing

    once = max(min(timing.block(r, 1, warm_s=1e-9)[0] for r in runs), 1e-3)
    calls = max(1, min(20, int(_FORM_BLOCK_MS / once)))
    ms = timing.medians(timing.interleaved(dict(enumerate(runs)), _FORM_ROUNDS, calls,
                                           warmup=1))
    if handicaps:
        ms = {i: m * handicaps[i] for i, m in ms.items()}
    return min(ms, key=ms.get)


def _mkl_step(packed, xs: int, os_: int, env: list, dynamic: set):
    """A step running ``packed``'s product from slot ``xs`` into slot ``os_`` (a slot made
    per call is read from the environment each call)."""
    product = packed.product
    if xs in dynamic or os_ in dynamic:
        def step(env):
            product(env[xs].data_ptr(), env[os_].data_ptr())
    else:
        x_ptr, o_ptr = env[xs].data_ptr(), env[os_].data_ptr()

        def step(env):
            product(x_ptr, o_ptr)
    step.packed = packed
    return step


def _in_runs(lib: D.Lib, steps: list) -> list:
    """``steps`` with each stretch of two or more fixed primitives as one
    ``native_loop.Run``."""
    out, stretch = [], []
    for step in steps + [None]:
        if step is not None and getattr(step, "fixed", False):
            stretch.append(step)
            continue
        if len(stretch) > 1:
            out.append(native_loop.Run(lib, [s.prim for s in stretch]))
        else:
            out.extend(stretch)
        stretch = []
        if step is not None:
            out.append(step)
    return out


def _primitive_step(lib: D.Lib, prim: D.Primitive, handles: list):
    execute, stream, h, args, nargs = lib.execute, lib.stream, prim.h, prim.args, prim.n
    set_handle = lib.set_handle
    check = lib.check
    what = prim.what
    if not handles:
        def step(env):
            if execute(h, stream, nargs, args):
                check(1, what)
        step.fixed = True  # its memory at fixed addresses: it may join a ``native_loop.Run``
    else:
        def step(env):
            for mh, s in handles:
                set_handle(mh, env[s].data_ptr())
            if execute(h, stream, nargs, args):
                check(1, what)
    step.prim = prim  # keeps the primitive and its memory objects alive
    return step


def _aten_op(node):
    """The overload a TorchScript node calls, and its keyword-only arguments (the
    node's last inputs, in order)."""
    kind = node.kind()
    if not kind.startswith("aten::"):
        raise ValueError(f"{kind} cannot run outside TorchScript")
    schema = node.schema()
    if schema == "(no schema)":
        raise ValueError(f"{kind} has no schema here")
    schema = torch._C.parse_schema(schema)
    packet = getattr(torch.ops.aten, kind.split("::", 1)[1], None)
    op = getattr(packet, schema.overload_name or "default", None) if packet is not None \
        else None
    if op is None:
        raise ValueError(f"{kind} is not an ATen op of this torch")
    return op, [a for a in schema.arguments if a.kwarg_only]


def build(graph) -> Program:
    """The traced group ``graph`` as a Program (``ValueError`` where it cannot)."""
    lib = D.lib()
    if lib is None:
        raise ValueError("oneDNN's library (the onednn-cpu-gomp package) is not available")
    return _Builder(graph, lib).build()
