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
current quantized engine (eager's) or with a named one: packed for oneDNN, the
same ``quantized::conv2d`` runs oneDNN's kernel whatever the global engine
(faster on the test machine; results may differ from eager's by one
quantization step, so it is a measured region candidate, not the default).

Activations are ``quint8`` (the x86/fbgemm/qnnpack default), weights ``qint8``
per-tensor or per-channel (``axis = -1`` means per-tensor).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["NAMESPACE", "QUANT_OPERANDS", "PREPACKED", "IMPLS", "QuantOperands",
           "packing_engine_available"]

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
]
for _s in _SCHEMAS:
    _lib.define(_s)


@dataclass(frozen=True)
class QuantOperands:
    """Quantized tensor operands (name -> its scale/zero-point operand names) and result."""

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
            x_scale, x_zp, out_scale, out_zp, relu):
    packed = _conv_pack(w, w_scales, w_zps, axis, bias, stride, padding, dilation, groups)
    return _conv_run(packed, x, x_scale, x_zp, out_scale, out_zp, relu)


def _linear_pack(w, w_scales, w_zps, axis, bias):
    return torch.ops.quantized.linear_prepack(_weight(w, w_scales, w_zps, axis), bias)


def _linear_run(packed, x, x_scale, x_zp, out_scale, out_zp, relu):
    op = torch.ops.quantized.linear_relu if relu else torch.ops.quantized.linear
    return _out(op(_q(x, x_scale, x_zp), packed, out_scale, out_zp), x)


def _linear(x, w, w_scales, w_zps, axis, bias, x_scale, x_zp, out_scale, out_zp, relu):
    return _linear_run(_linear_pack(w, w_scales, w_zps, axis, bias), x, x_scale, x_zp,
                       out_scale, out_zp, relu)


def _quantize(x, scale, zp):
    return torch.quantize_per_tensor(x, scale, zp, torch.quint8).int_repr()


def _dequantize(x, scale, zp):
    return _q(x, scale, zp).dequantize()


def _add(a, sa, za, b, sb, zb, so, zo, relu):
    op = torch.ops.quantized.add_relu if relu else torch.ops.quantized.add
    return _out(op(_q(a, sa, za), _q(b, sb, zb), so, zo), a)


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
          "linear": _linear, "add": _add, "cat": _cat, "max_pool2d": _max_pool2d,
          "adaptive_avg_pool2d": _adaptive_avg_pool2d}
for _name, _fn in IMPLS.items():
    _lib.impl(_name, _fn, "CompositeExplicitAutograd")


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


_FAKES = {
    "quantize": lambda x, s, z: _u8(x),
    "dequantize": lambda x, s, z: torch.empty(x.shape, dtype=torch.float32, device=x.device),
    "conv2d": _fake_conv2d, "linear": _fake_linear,
    "add": lambda a, *_: _u8(a), "cat": _fake_cat, "max_pool2d": _fake_max_pool2d,
    "adaptive_avg_pool2d": _fake_adaptive_avg_pool2d,
}
for _name, _fn in _FAKES.items():
    torch.library.register_fake(f"{NAMESPACE}::{_name}", _fn, lib=_lib)


# --- per-call-site kernels with weights packed once -------------------------------------

def packing_engine_available(engine: str) -> bool:
    """``engine`` (e.g. ``"onednn"``) can pack quantized weights in this torch build."""
    return engine in torch.backends.quantized.supported_engines


class _PrepackedSite:
    """Packs the (constant) weight on the first call, reuses the packing afterwards.

    ``engine``: the quantized engine to pack with (None: the current one, as eager).
    """

    _pack = _run = None  # set by subclasses: (weight operands) -> packed; (packed, rest) -> out

    def __init__(self, engine: str | None = None):
        self.packed, self.engine = None, engine

    def __call__(self, x, w, w_scales, w_zps, axis, bias, *rest):
        if self.packed is None:
            self.packed = self._pack_with_engine(w, w_scales, w_zps, axis, bias,
                                                 *self._pack_extra(rest))
        return self._run(self.packed, x, *self._run_args(rest))

    def _pack_with_engine(self, *args):
        if self.engine is None:
            return self._pack(*args)
        before = torch.backends.quantized.engine
        torch.backends.quantized.engine = self.engine
        try:  # the packed weight keeps its engine's kernel, whatever the engine later
            return self._pack(*args)
        finally:
            torch.backends.quantized.engine = before


class _ConvSite(_PrepackedSite):
    _pack, _run = staticmethod(_conv_pack), staticmethod(_conv_run)

    @staticmethod
    def _pack_extra(rest):
        return rest[:4]  # stride, padding, dilation, groups

    @staticmethod
    def _run_args(rest):
        return rest[4:]


class _LinearSite(_PrepackedSite):
    _pack, _run = staticmethod(_linear_pack), staticmethod(_linear_run)

    @staticmethod
    def _pack_extra(rest):
        return ()

    @staticmethod
    def _run_args(rest):
        return rest


# op -> (constant operands it needs, factory of a per-site callable)
PREPACKED = {"aot_q::conv2d": (("w", "w_scales", "w_zero_points", "bias"), _ConvSite),
             "aot_q::linear": (("w", "w_scales", "w_zero_points", "bias"), _LinearSite)}
