"""``aot_q``: quantized ops on integer tensors with static quantization parameters.

Eager-mode quantized models (packed weights, ``quint8`` tensors) cannot be
exported, and IREE knows no quantized dtypes. The importer
(``aot.importer.quantized``) rewrites them into these ops, whose activations are
the *integer representation* (``uint8``) of the quantized tensors and whose
quantization parameters are static operands. Each op has:

- an ATen implementation (here) that rebuilds the real quantized tensors and
  calls ATen's quantized kernels: a kernel call into it is bit-exact with eager;
- a decomposition into integer arithmetic (``aot.importer.decompositions``)
  that IREE compiles: int8 x int8 -> int32 accumulation and requantization.

``QUANT_OPERANDS`` says which tensor operands and results are quantized and
where their parameters are, so the partitioner can give kernel-call operands
full ``quint8`` TorchTensor specs (the executor then hands ATen real quantized
tensors and takes the results apart again). ``PREPACKED`` builds per-call-site
kernels that pack constant weights once instead of on every call, with the
engine recorded at compile.

**The engine is part of the artifact.** ATen's quantized kernels round differently
per engine (x86/fbgemm, oneDNN, qnnpack), and so do the decompositions
(``aot.importer.int8_decompositions`` follows qnnpack's int32 bias and centered
mean). ``compile_engine`` records ``torch.backends.quantized.engine`` as it is when
a program with ``aot_q`` ops is compiled (the manifest's ``executor`` entry); the
decompositions are traced under it, weights are packed with it, and every call of
the artifact runs its kernel calls under it (``pinned_engine``), whatever the
global engine is at load or call time. To deploy on oneDNN's kernels, set
``torch.backends.quantized.engine = "onednn"`` before compiling.

Activations are ``quint8`` (the x86/fbgemm/qnnpack default), weights ``qint8``
per-tensor or per-channel (``axis = -1`` means per-tensor).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from dataclasses import dataclass

import torch

__all__ = ["NAMESPACE", "QUANT_OPERANDS", "PREPACKED", "IMPLS", "FLOAT_MATH_IMPLS", "UNARY",
           "QuantOperands", "Unary", "packing_engine_available", "compile_engine",
           "pinned_engine", "requantizing_kernel", "onednn_combines_scales", "float_math",
           "cpu_has", "saturates"]

NAMESPACE = "aot_q"
_lib = torch.library.Library(NAMESPACE, "DEF")

_CONV = ("conv2d(Tensor x, Tensor w, Tensor w_scales, Tensor w_zero_points, int axis, "
         "Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, "
         "float x_scale, int x_zero_point, float out_scale, int out_zero_point, bool relu) -> Tensor")
_LINEAR = ("linear(Tensor x, Tensor w, Tensor w_scales, Tensor w_zero_points, int axis, "
           "Tensor? bias, float x_scale, int x_zero_point, float out_scale, int out_zero_point, "
           "bool relu) -> Tensor")
_SCHEMAS = [
    "quantize(Tensor x, float scale, int zero_point) -> Tensor",
    "dequantize(Tensor x, float scale, int zero_point) -> Tensor",
    _CONV, _LINEAR,
    "add(Tensor a, float a_scale, int a_zero_point, Tensor b, float b_scale, int b_zero_point, "
    "float out_scale, int out_zero_point, bool relu) -> Tensor",
    "cat(Tensor[] xs, float[] scales, int[] zero_points, int dim, float out_scale, "
    "int out_zero_point) -> Tensor",
    "max_pool2d(Tensor x, float scale, int zero_point, int[] kernel_size, int[] stride, "
    "int[] padding, int[] dilation, bool ceil_mode) -> Tensor",
    "adaptive_avg_pool2d(Tensor x, float scale, int zero_point, int[] output_size) -> Tensor",
    "mul(Tensor a, float a_scale, int a_zero_point, Tensor b, float b_scale, int b_zero_point, "
    "float out_scale, int out_zero_point, bool relu) -> Tensor",
    "mean(Tensor x, float scale, int zero_point, int[] dim, bool keepdim, float out_scale, "
    "int out_zero_point) -> Tensor",
    "avg_pool2d(Tensor x, float scale, int zero_point, int[] kernel_size, int[] stride, "
    "int[] padding, bool ceil_mode, bool count_include_pad, int? divisor_override, "
    "float out_scale, int out_zero_point) -> Tensor",
]
for _s in _SCHEMAS:
    _lib.define(_s)


@dataclass(frozen=True)
class Unary:
    """An elementwise op on one quantized tensor: ``name(x, scale, zero_point, *params,
    out_scale, out_zero_point)``.

    ``params``: the schema of its extra float operands; ``aten``: ATen's quantized
    kernel (a quantized tensor, the params, the output qparams -> a quantized tensor);
    ``real``: the same function on real numbers (what the compiled form computes
    between a dequantize and a quantize).
    """

    params: str
    aten: object
    real: object


_F = torch.nn.functional
UNARY: dict[str, Unary] = {
    "relu": Unary("", lambda q, s, z: torch.relu(q), _F.relu),
    "hardtanh": Unary(", float min_val, float max_val",
                      lambda q, lo, hi, s, z: _F.hardtanh(q, lo, hi), _F.hardtanh),
    "hardswish": Unary("", lambda q, s, z: torch.ops.quantized.hardswish(q, s, z), _F.hardswish),
    "hardsigmoid": Unary("", lambda q, s, z: _F.hardsigmoid(q), _F.hardsigmoid),
    "sigmoid": Unary("", lambda q, s, z: torch.sigmoid(q), torch.sigmoid),
    "tanh": Unary("", lambda q, s, z: torch.tanh(q), torch.tanh),
    "leaky_relu": Unary(", float negative_slope",
                        lambda q, a, s, z: _F.leaky_relu(q, a), _F.leaky_relu),
    "gelu": Unary("", lambda q, s, z: _F.gelu(q), _F.gelu),
}
for _name, _u in UNARY.items():
    _lib.define(f"{_name}(Tensor x, float scale, int zero_point{_u.params}, float out_scale, "
                "int out_zero_point) -> Tensor")


@dataclass(frozen=True)
class QuantOperands:
    """Quantized tensor operands (name -> its scale/zero-point operand names; for a
    ``Tensor[]`` operand, list operands with one entry per element) and result."""

    inputs: dict[str, tuple[str, str]]
    result: tuple[str, str] | None


QUANT_OPERANDS: dict[str, QuantOperands] = {
    "aot_q::quantize": QuantOperands({}, ("scale", "zero_point")),
    "aot_q::dequantize": QuantOperands({"x": ("scale", "zero_point")}, None),
    "aot_q::conv2d": QuantOperands({"x": ("x_scale", "x_zero_point")},
                                   ("out_scale", "out_zero_point")),
    "aot_q::linear": QuantOperands({"x": ("x_scale", "x_zero_point")},
                                   ("out_scale", "out_zero_point")),
    "aot_q::add": QuantOperands({"a": ("a_scale", "a_zero_point"),
                                 "b": ("b_scale", "b_zero_point")},
                                ("out_scale", "out_zero_point")),
    "aot_q::max_pool2d": QuantOperands({"x": ("scale", "zero_point")}, ("scale", "zero_point")),
    "aot_q::adaptive_avg_pool2d": QuantOperands({"x": ("scale", "zero_point")},
                                                ("scale", "zero_point")),
    "aot_q::cat": QuantOperands({"xs": ("scales", "zero_points")},  # per element
                                ("out_scale", "out_zero_point")),
    "aot_q::mul": QuantOperands({"a": ("a_scale", "a_zero_point"),
                                 "b": ("b_scale", "b_zero_point")},
                                ("out_scale", "out_zero_point")),
    **{f"aot_q::{name}": QuantOperands({"x": ("scale", "zero_point")},
                                       ("out_scale", "out_zero_point"))
       for name in ("mean", "avg_pool2d", *UNARY)},
}


# --- ATen implementations: real quantized tensors in, ATen's quantized kernels ------------

def _q(x: torch.Tensor, scale: float, zp: int) -> torch.Tensor:
    """``uint8`` storage -> ``quint8`` tensor; a quantized tensor passes through."""
    if x.is_quantized:
        return x
    return torch._make_per_tensor_quantized_tensor(x, scale, zp)


def _out(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Hand back what came in: a quantized tensor, or its integer representation."""
    return result if like.is_quantized else result.int_repr()


def _weight(w, w_scales, w_zps, axis):
    if w.is_quantized:
        return w
    if axis < 0:
        return torch._make_per_tensor_quantized_tensor(w, float(w_scales[0]), int(w_zps[0]))
    return torch._make_per_channel_quantized_tensor(w, w_scales.double(), w_zps.long(), axis)


def _conv_pack(w, w_scales, w_zps, axis, bias, stride, padding, dilation, groups):
    return torch.ops.quantized.conv2d_prepack(_weight(w, w_scales, w_zps, axis), bias,
                                              stride, padding, dilation, groups)


def _conv_run(packed, x, x_scale, x_zp, out_scale, out_zp, relu):
    op = torch.ops.quantized.conv2d_relu if relu else torch.ops.quantized.conv2d
    return _out(op(_q(x, x_scale, x_zp), packed, out_scale, out_zp), x)


def _conv2d(x, w, w_scales, w_zps, axis, bias, stride, padding, dilation, groups,
            x_scale, x_zp, out_scale, out_zp, relu, float_math=False):
    if (float_math or _FLOAT_MATH.get()) and saturates(x):
        return _conv_reference(_conv2d_f32_pack(w, w_scales, w_zps, axis, bias), x, stride,
                               padding, dilation, groups, x_scale, x_zp, out_scale, out_zp,
                               relu)
    packed = _conv_pack(w, w_scales, w_zps, axis, bias, stride, padding, dilation, groups)
    return _conv_run(packed, x, x_scale, x_zp, out_scale, out_zp, relu)


def _linear_pack(w, w_scales, w_zps, axis, bias):
    return torch.ops.quantized.linear_prepack(_weight(w, w_scales, w_zps, axis), bias)


def _linear_run(packed, x, x_scale, x_zp, out_scale, out_zp, relu):
    op = torch.ops.quantized.linear_relu if relu else torch.ops.quantized.linear
    return _out(op(_q(x, x_scale, x_zp), packed, out_scale, out_zp), x)


def _linear(x, w, w_scales, w_zps, axis, bias, x_scale, x_zp, out_scale, out_zp, relu,
            float_math=False):
    if (float_math or _FLOAT_MATH.get()) and saturates(x):
        return _linear_reference(_conv2d_f32_pack(w, w_scales, w_zps, axis, bias), x, x_scale,
                                 x_zp, out_scale, out_zp, relu)
    return _linear_run(_linear_pack(w, w_scales, w_zps, axis, bias), x, x_scale, x_zp,
                       out_scale, out_zp, relu)


# --- where ATen's int8 kernels saturate ----------------------------------------------------
# fbgemm's and oneDNN's u8 x s8 kernels on a CPU without VNNI multiply with ``vpmaddubsw``,
# which sums each pair of products in int16 and saturates: an activation above 127 beside
# a weight near -128 or 127 overflows it (a convolution of full-range activations can be
# off by tens of thousands in the accumulator). What is right depends on
# what the program means. An eager-mode quantized model *is* ATen's kernels (its x86
# qconfig keeps activations to 7 bits, but a value past the calibrated range reaches
# 255 in eager too): its kernel calls stay ATen's, bit-exact with eager. A PT2E program
# means its converted model's float math on the dequantized values (``float_math``, the
# manifest's ``executor.int8_float_math``): there a call whose activation holds a value
# above 127 computes that math (bit-exact with the converted model), others ATen's kernel.

_FLOAT_MATH = contextvars.ContextVar("aot_q_float_math", default=False)


@contextlib.contextmanager
def float_math():
    """Within the block, ``torch.ops.aot_q.conv2d``/``linear`` called through the
    dispatcher mean a PT2E program's float math where ATen's kernel saturates (as its
    kernel calls do): running a rewritten PT2E graph eagerly gives its converted
    model's values."""
    token = _FLOAT_MATH.set(True)
    try:
        yield
    finally:
        _FLOAT_MATH.reset(token)


def saturates(x: torch.Tensor) -> bool:
    """ATen's kernel under the current engine would saturate on ``x``'s integers here."""
    if torch.backends.quantized.engine == "qnnpack" or cpu_has("avx512_vnni"):
        return False
    return bool((x.int_repr() if x.is_quantized else x).max() > 127) if x.numel() else False


@functools.cache
def cpu_has(flag: str) -> bool:
    """``flag`` among the CPU's (Linux ``/proc/cpuinfo``; elsewhere: unknown, False)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and flag in line.split() for line in f)
    except OSError:
        return False


def _requantized(y: torch.Tensor, like: torch.Tensor, scale: float, zp: int,
                 relu: bool) -> torch.Tensor:
    """A float result quantized as ``quantized_decomposed.quantize_per_tensor`` does
    (multiplying by the reciprocal scale), to ``like``'s form (quantized, or uint8)."""
    if relu:
        y = torch.relu(y)
    q = torch.clamp(torch.round(y * (1.0 / scale)) + zp, 0, 255).to(torch.uint8)
    return torch._make_per_tensor_quantized_tensor(q, scale, zp) if like.is_quantized else q


def _conv_reference(packed_f32, x, stride, padding, dilation, groups, x_scale, x_zp,
                    out_scale, out_zp, relu):
    y = _conv2d_f32_run(packed_f32, x, stride, padding, dilation, groups, x_scale, x_zp)
    return _requantized(y, x, out_scale, out_zp, relu)


def _linear_reference(packed_f32, x, x_scale, x_zp, out_scale, out_zp, relu):
    return _requantized(_linear_f32_run(packed_f32, x, x_scale, x_zp), x, out_scale, out_zp,
                        relu)


def _quantize(x, scale, zp):
    return torch.quantize_per_tensor(x, scale, zp, torch.quint8).int_repr()


def _dequantize(x, scale, zp):
    return _q(x, scale, zp).dequantize()


def _add(a, sa, za, b, sb, zb, so, zo, relu):
    op = torch.ops.quantized.add_relu if relu else torch.ops.quantized.add
    return _out(op(_q(a, sa, za), _q(b, sb, zb), so, zo), a)


def _mul(a, sa, za, b, sb, zb, so, zo, relu):
    op = torch.ops.quantized.mul_relu if relu else torch.ops.quantized.mul
    return _out(op(_q(a, sa, za), _q(b, sb, zb), so, zo), a)


def _with_qparams(y: torch.Tensor, scale: float, zp: int) -> torch.Tensor:
    """``y`` requantized to ``(scale, zp)`` where ATen chose other parameters (a kernel
    call replays what eager did, so they agree whenever the model is replayed)."""
    if y.q_scale() == scale and y.q_zero_point() == zp:
        return y
    return torch.quantize_per_tensor(y.dequantize(), scale, zp, torch.quint8)


def _mean(x, scale, zp, dim, keepdim, so, zo):
    return _out(_with_qparams(torch.mean(_q(x, scale, zp), dim, keepdim), so, zo), x)


def _avg_pool2d(x, scale, zp, kernel_size, stride, padding, ceil_mode, count_include_pad,
                divisor_override, so, zo):
    y = torch.nn.functional.avg_pool2d(_q(x, scale, zp), kernel_size, stride or None, padding,
                                       ceil_mode, count_include_pad, divisor_override)
    return _out(_with_qparams(y, so, zo), x)


def _unary(name: str):
    aten = UNARY[name].aten

    def impl(x, scale, zp, *rest):
        *params, so, zo = rest
        return _out(_with_qparams(aten(_q(x, scale, zp), *params, so, zo), so, zo), x)
    impl.__name__ = f"_{name}"
    return impl


def _cat(xs, scales, zps, dim, so, zo):
    qs = [_q(x, s, z) for x, s, z in zip(xs, scales, zps)]
    return _out(torch.ops.quantized.cat(qs, dim, so, zo), xs[0])


def _max_pool2d(x, scale, zp, kernel_size, stride, padding, dilation, ceil_mode):
    return _out(torch.nn.functional.max_pool2d(_q(x, scale, zp), kernel_size, stride or None,
                                               padding, dilation, ceil_mode), x)


def _adaptive_avg_pool2d(x, scale, zp, output_size):
    return _out(torch.nn.functional.adaptive_avg_pool2d(_q(x, scale, zp), output_size), x)


# op name -> its ATen implementation; the executor calls these directly (the
# dispatcher's trip into a Python kernel costs more than some of the ops)
IMPLS = {"quantize": _quantize, "dequantize": _dequantize, "conv2d": _conv2d,
         "linear": _linear, "add": _add, "mul": _mul, "cat": _cat, "max_pool2d": _max_pool2d,
         "adaptive_avg_pool2d": _adaptive_avg_pool2d, "mean": _mean, "avg_pool2d": _avg_pool2d,
         **{name: _unary(name) for name in UNARY}}
for _name, _fn in IMPLS.items():
    _lib.impl(_name, _fn, "CompositeExplicitAutograd")
# a PT2E program's conv2d/linear kernel calls (``float_math``)
FLOAT_MATH_IMPLS = {"conv2d": functools.partial(_conv2d, float_math=True),
                    "linear": functools.partial(_linear, float_math=True)}


# --- fake implementations: shapes and dtypes for export ---------------------------------

def _u8(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=torch.uint8, device=t.device)


def _fake_conv2d(x, w, w_scales, w_zps, axis, bias, stride, padding, dilation, groups, *_):
    y = torch.nn.functional.conv2d(x.float(), w.float(), None, stride, padding, dilation, groups)
    return _u8(y)


def _fake_linear(x, w, *_):
    return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=torch.uint8)


def _fake_cat(xs, scales, zps, dim, *_):
    return _u8(torch.cat([x.float() for x in xs], dim))


def _fake_max_pool2d(x, scale, zp, kernel_size, stride, padding, dilation, ceil_mode):
    return _u8(torch.nn.functional.max_pool2d(x.float(), kernel_size, stride or None, padding,
                                              dilation, ceil_mode))


def _fake_adaptive_avg_pool2d(x, scale, zp, output_size):
    return _u8(torch.nn.functional.adaptive_avg_pool2d(x.float(), output_size))


def _fake_mul(a, sa, za, b, *_):
    return a.new_empty(torch.broadcast_shapes(a.shape, b.shape), dtype=torch.uint8)


def _fake_mean(x, scale, zp, dim, keepdim, *_):
    return _u8(torch.mean(x.float(), dim, keepdim))


def _fake_avg_pool2d(x, scale, zp, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, *_):
    return _u8(torch.nn.functional.avg_pool2d(x.float(), kernel_size, stride or None, padding,
                                              ceil_mode, count_include_pad, divisor_override))


_FAKES = {
    "quantize": lambda x, s, z: _u8(x),
    "dequantize": lambda x, s, z: torch.empty(x.shape, dtype=torch.float32, device=x.device),
    "conv2d": _fake_conv2d, "linear": _fake_linear,
    "add": lambda a, *_: _u8(a), "cat": _fake_cat, "max_pool2d": _fake_max_pool2d,
    "adaptive_avg_pool2d": _fake_adaptive_avg_pool2d, "mul": _fake_mul, "mean": _fake_mean,
    "avg_pool2d": _fake_avg_pool2d, **{name: (lambda x, *_: _u8(x)) for name in UNARY},
}
for _name, _fn in _FAKES.items():
    torch.library.register_fake(f"{NAMESPACE}::{_name}", _fn, lib=_lib)


# --- per-call-site kernels with weights packed once -------------------------------------

def packing_engine_available(engine: str) -> bool:
    """``engine`` (e.g. ``"onednn"``) can pack quantized weights in this torch build."""
    return engine in torch.backends.quantized.supported_engines


def compile_engine(graph) -> str | None:
    """The quantized engine an artifact of ``graph`` (an FX graph) runs under: the
    current one, when the graph has ``aot_q`` ops; None otherwise."""
    for n in graph.nodes:
        if n.op == "call_function" and getattr(n.target, "namespace", None) == NAMESPACE:
            return torch.backends.quantized.engine
    return None


def requantizing_kernel(op: str, groups: int = 1) -> str:
    """Whose requantization ATen's quantized ``op`` (``"conv2d"``, ``"linear"``,
    ``"add"``) runs under the current engine, on this machine: ``"fbgemm"``,
    ``"onednn"``, ``"qnnpack"``, or ``"onednn-if-symmetric"`` (the ``x86`` engine packs
    a convolution for oneDNN when its weight's zero points are all 0, on Linux with
    AVX512-VNNI, groups <= 100; for fbgemm otherwise; linears always for fbgemm). Only
    qnnpack's ``add`` has a requantization of its own (fixed point); the others add
    through real numbers."""
    engine = torch.backends.quantized.engine
    if engine in ("onednn", "qnnpack"):
        return engine
    if engine == "x86" and op == "conv2d" and groups <= 100 and _x86_picks_onednn_here():
        return "onednn-if-symmetric"
    return "fbgemm"


def onednn_combines_scales(x_shape, w_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                           groups: int = 1) -> bool:
    """Whether oneDNN's int8 kernel for this convolution (``w_shape`` 4-d) or linear
    (2-d), under the current engine on this machine, multiplies its int32 accumulator
    by the float32 product of the input and weight scales (its AMX kernels) rather than
    by one scale, then the other (its AVX512-VNNI kernels). oneDNN picks the kernel per
    shape (small or odd-sized products stay on VNNI on a CPU with AMX), so the answer
    is measured on the shape itself: weights with one tap of 91 against inputs of 112
    (zero point 65) sum to 4277 in every output the tap reaches, which the two orders
    requantize to 26 (separately) and 25 (combined) with the scales below."""
    key = (torch.backends.quantized.engine, *(tuple(_hint(d) for d in s) for s in
           (x_shape, w_shape, stride, padding, dilation)), int(groups))
    return _combines_scales(key)


def _hint(d) -> int:
    """A dimension as an int (a symbolic one: its example value)."""
    return d if isinstance(d, int) else int(getattr(d.node, "hint", None) or 1)


_PROBE_SX, _PROBE_SW, _PROBE_B, _PROBE_SO = (0.09267650544643402, 0.0021571461111307144,
                                             -4.471242931458619e-09, 0.03353113681077957)


@functools.cache
def _combines_scales(key) -> bool:
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    _, x_shape, w_shape, stride, padding, dilation, groups = key
    o = w_shape[0]
    # asked while a decomposition is traced: real tensors, nothing recorded
    with unset_fake_temporarily(), disable_proxy_modes_tracing(), torch.no_grad():
        w = torch.zeros(w_shape, dtype=torch.int8)
        w[(slice(None), 0, *([0] * (len(w_shape) - 2)))] = 91
        scales = torch.full((o,), _PROBE_SW, dtype=torch.double)
        qw = torch._make_per_channel_quantized_tensor(w, scales, torch.zeros(o, dtype=torch.long), 0)
        qx = torch._make_per_tensor_quantized_tensor(
            torch.full(x_shape, 112, dtype=torch.uint8), _PROBE_SX, 65)
        bias = torch.full((o,), _PROBE_B)
        if len(w_shape) == 2:
            packed = torch.ops.quantized.linear_prepack(qw, bias)
            out = torch.ops.quantized.linear_relu(qx, packed, _PROBE_SO, 0)
        else:
            packed = torch.ops.quantized.conv2d_prepack(qw, bias, list(stride), list(padding),
                                                        list(dilation), groups)
            out = torch.ops.quantized.conv2d_relu(qx, packed, _PROBE_SO, 0)
        return bool((out.int_repr() == 25).any())


@functools.cache
def _x86_picks_onednn_here() -> bool:
    """What PyTorch's x86 engine checks before packing a convolution for oneDNN: Linux,
    oneDNN in this build, a CPU with AVX512-VNNI (read from /proc/cpuinfo)."""
    if not sys.platform.startswith("linux") or not torch.backends.mkldnn.is_available():
        return False
    return cpu_has("avx512_vnni")


@contextlib.contextmanager
def pinned_engine(engine: str | None):
    """Run the block under ``engine`` (None, or the current one already: no change)."""
    before = torch.backends.quantized.engine
    if engine is None or engine == before:
        yield
        return
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


class _PrepackedSite:
    """Packs the (constant) weight on the first call, reuses the packing afterwards.

    ``engine``: the quantized engine to pack with (the artifact's; None: the current one).
    """

    _pack = _run = None  # set by subclasses: (weight operands) -> packed; (packed, rest) -> out

    def __init__(self, engine: str | None = None, float_math: bool = False):
        self.packed, self.engine, self.packed_f32 = None, engine, None
        self.float_math = float_math  # a PT2E program's site (``saturates``)

    _reference = None  # requantizing sites: (float packing, x, *rest) -> out (``saturates``)

    def __call__(self, x, w, w_scales, w_zps, axis, bias, *rest):
        if self.float_math and self._reference is not None and saturates(x):
            if self.packed_f32 is None:
                self.packed_f32 = _conv2d_f32_pack(w, w_scales, w_zps, axis, bias)
            return self._reference(self.packed_f32, x, *rest)
        if self.packed is None:
            self.packed = self._pack_with_engine(w, w_scales, w_zps, axis, bias,
                                                 *self._pack_extra(rest))
        return self._run(self.packed, x, *self._run_args(rest))

    @staticmethod
    def _pack_extra(rest):
        return ()  # operands after the bias that packing needs (conv: stride, padding...)

    @staticmethod
    def _run_args(rest):
        return rest  # operands after the bias that the packed kernel takes

    def _pack_with_engine(self, *args):
        with pinned_engine(self.engine):  # the packing keeps its engine's kernel
            return self._pack(*args)


class _ConvSite(_PrepackedSite):
    _pack, _run = staticmethod(_conv_pack), staticmethod(_conv_run)
    _reference = staticmethod(_conv_reference)

    @staticmethod
    def _pack_extra(rest):
        return rest[:4]  # stride, padding, dilation, groups

    @staticmethod
    def _run_args(rest):
        return rest[4:]


class _LinearSite(_PrepackedSite):
    _pack, _run = staticmethod(_linear_pack), staticmethod(_linear_run)
    _reference = staticmethod(_linear_reference)


# op -> (constant operands it needs, factory of a per-site callable)
PREPACKED = {"aot_q::conv2d": (("w", "w_scales", "w_zero_points", "bias"), _ConvSite),
             "aot_q::linear": (("w", "w_scales", "w_zero_points", "bias"), _LinearSite)}


# --- int8 convolution and linear with float results (PT2E) ------------------------------
# A PT2E graph (``aot.importer.pt2e``) often keeps a conv's or linear's result in float:
# it feeds a float add, a layer norm, a softmax. These ops take the integer operands of
# ``conv2d``/``linear`` and return ``acc * x_scale * w_scale + bias`` in float32. Their
# ATen implementation is the converted model's own math, bit for bit: dequantize as
# ``quantized_decomposed`` does, then the float op; the compiled decomposition
# accumulates in int32 (``aot.importer.int8_decompositions``).

_lib.define("conv2d_f32(Tensor x, Tensor w, Tensor w_scales, Tensor w_zero_points, int axis, "
            "Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, "
            "float x_scale, int x_zero_point) -> Tensor")
_lib.define("linear_f32(Tensor x, Tensor w, Tensor w_scales, Tensor w_zero_points, int axis, "
            "Tensor? bias, float x_scale, int x_zero_point) -> Tensor")


def _dequantized_x(x, scale, zp):
    """``quantized_decomposed.dequantize_per_tensor``'s arithmetic on the integers."""
    return ((x.int_repr() if x.is_quantized else x).to(torch.float32) - zp) * scale


def _dequantized_w(w, w_scales, w_zps, axis):
    """The float weight, computed as ``quantized_decomposed`` dequantizes it."""
    if w.is_quantized:
        return w.dequantize()
    if axis < 0:
        return (w.to(torch.float32) - int(w_zps[0])) * float(w_scales[0])
    shape = [1] * w.dim()
    shape[axis] = -1
    return ((w - w_zps.reshape(shape)) * w_scales.reshape(shape)).to(torch.float32)


def _conv2d_f32_pack(w, w_scales, w_zps, axis, bias):
    return _dequantized_w(w, w_scales, w_zps, axis), bias


def _conv2d_f32_run(packed, x, stride, padding, dilation, groups, x_scale, x_zp):
    return torch.nn.functional.conv2d(_dequantized_x(x, x_scale, x_zp), packed[0], packed[1],
                                      stride, padding, dilation, groups)


def _conv2d_f32(x, w, w_scales, w_zps, axis, bias, stride, padding, dilation, groups,
                x_scale, x_zp):
    return _conv2d_f32_run(_conv2d_f32_pack(w, w_scales, w_zps, axis, bias), x, stride,
                           padding, dilation, groups, x_scale, x_zp)


def _linear_f32_run(packed, x, x_scale, x_zp):
    return torch.nn.functional.linear(_dequantized_x(x, x_scale, x_zp), packed[0], packed[1])


def _linear_f32(x, w, w_scales, w_zps, axis, bias, x_scale, x_zp):
    return _linear_f32_run(_conv2d_f32_pack(w, w_scales, w_zps, axis, bias), x, x_scale, x_zp)


class _FloatSite(_PrepackedSite):
    """A float-result site: the weight dequantized once, on the first call."""

    _pack = staticmethod(_conv2d_f32_pack)


class _Conv2dF32Site(_FloatSite):
    _run = staticmethod(_conv2d_f32_run)


class _LinearF32Site(_FloatSite):
    _run = staticmethod(_linear_f32_run)


def _fake_conv2d_f32(x, w, w_scales, w_zps, axis, bias, stride, padding, dilation, groups, *_):
    return torch.nn.functional.conv2d(x.float(), w.float(), None, stride, padding, dilation,
                                      groups)


def _fake_linear_f32(x, w, *_):
    return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=torch.float32)


for _name, _fn, _fake in (("conv2d_f32", _conv2d_f32, _fake_conv2d_f32),
                          ("linear_f32", _linear_f32, _fake_linear_f32)):
    IMPLS[_name] = _fn
    _lib.impl(_name, _fn, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{_name}", _fake, lib=_lib)
    QUANT_OPERANDS[f"{NAMESPACE}::{_name}"] = QuantOperands({"x": ("x_scale", "x_zero_point")},
                                                            None)
PREPACKED["aot_q::conv2d_f32"] = (("w", "w_scales", "w_zero_points", "bias"), _Conv2dF32Site)
PREPACKED["aot_q::linear_f32"] = (("w", "w_scales", "w_zero_points", "bias"), _LinearF32Site)
