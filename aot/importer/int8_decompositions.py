"""``aot_q`` ops as integer arithmetic IREE compiles (the "compiled int8" mode).

Registered into ``IREE_DECOMPOSITIONS``: the partitioner decomposes an ``aot_q``
op when IREE does not know it (always) unless the user forces it to ATen with
``fallback_ops=["aot_q.conv2d", ...]``. The math mirrors ATen's x86/fbgemm
kernels: activations minus zero point times int8 weights accumulate in int32;
requantization is ``round((acc + bias / (sx * sw)) * (sx * sw / so)) + zo`` in
float32 with round-half-to-even, clamped to ``[0, 255]`` (``[zo, 255]`` with a
fused ReLU). Results agree with ATen to within one quantization step (ATen
rounds some products in a different order); the tests measure how often.

Where engines round differently (qnnpack's int32 bias and centered mean), the
decompositions follow ``torch.backends.quantized.engine`` as it is while the program
compiles: the engine the artifact records and runs its kernel calls under
(``aot.fallback.quantized_ops.compile_engine``), so both modes follow one engine.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..fallback.quantized_ops import UNARY  # (importing it defines torch.ops.aot_q)
from .decompositions import register_decomposition

__all__: list[str] = []
aot_q = torch.ops.aot_q
_QMAX = 255


def _requantize(y: torch.Tensor, zp: int, relu: bool) -> torch.Tensor:
    # float -> int32 -> uint8: IREE 3.13's llvm-cpu converts float to uint8 with signed
    # saturation (values above 127 become 127) when the conversion shares a dispatch with
    # a transpose, e.g. (x.transpose(1, 2) + 1).to(torch.uint8) on a 4-d tensor
    return (torch.round(y) + zp).clamp(zp if relu else 0, _QMAX).to(torch.int32).to(torch.uint8)


def _through_real(y: torch.Tensor, out_scale, out_zero_point, relu=False) -> torch.Tensor:
    """Quantize a real-valued result: what ATen's quantized kernels compute for ops
    without integer arithmetic of their own (they dequantize, compute, requantize)."""
    return _requantize(y * (1.0 / out_scale), out_zero_point, relu)


def _centered(x: torch.Tensor, zp) -> torch.Tensor:
    return x.to(torch.int32) - zp


def _out_scale(acc, x_scale, w_scales, bias, out_scale, shape):
    act_w = (w_scales.to(torch.float32) * x_scale).reshape(shape)
    if bias is not None and torch.backends.quantized.engine == "qnnpack":
        # qnnpack quantizes the bias to int32 and adds it to the accumulator
        bias_q = torch.round(bias.to(torch.float32).reshape(shape) / act_w).to(torch.int32)
        return (acc + bias_q).to(torch.float32) * (act_w / out_scale)
    y = acc.to(torch.float32)
    if bias is not None:
        y = y + bias.to(torch.float32).reshape(shape) / act_w
    return y * (act_w / out_scale)


@register_decomposition(aot_q.quantize.default)
def _quantize(x, scale, zero_point):
    return _through_real(x, scale, zero_point)


@register_decomposition(aot_q.dequantize.default)
def _dequantize(x, scale, zero_point):
    return (x.to(torch.float32) - zero_point) * scale


@register_decomposition(aot_q.conv2d.default)
def _conv2d(x, w, w_scales, w_zero_points, axis, bias, stride, padding, dilation, groups,
            x_scale, x_zero_point, out_scale, out_zero_point, relu):
    wi = w.to(torch.int32) - w_zero_points.to(torch.int32).reshape(-1, 1, 1, 1)
    if tuple(w.shape[2:]) == (1, 1) and not any(padding) and groups == 1:
        # A 1x1 conv is a matmul over the (subsampled) pixels. Subsample the uint8
        # input before widening it: IREE 3.13's llvm-cpu puts a strided slice of a
        # widened tensor on the stack (megabytes) and fails.
        xs = _centered(x[:, :, ::stride[0], ::stride[1]], x_zero_point)
        n, c, h, wd = xs.shape
        rows = xs.permute(0, 2, 3, 1).reshape(n * h * wd, c)
        acc = torch.matmul(rows, wi.reshape(wi.shape[0], c).t())
        acc = acc.reshape(n, h, wd, -1).permute(0, 3, 1, 2)
    else:
        acc = torch.ops.aten.convolution(_centered(x, x_zero_point), wi, None, stride, padding, dilation, False,
                                         [0, 0], groups)
    y = _out_scale(acc, x_scale, w_scales, bias, out_scale, (1, -1, 1, 1))
    return _requantize(y, out_zero_point, relu)


@register_decomposition(aot_q.linear.default)
def _linear(x, w, w_scales, w_zero_points, axis, bias, x_scale, x_zero_point, out_scale,
            out_zero_point, relu):
    wi = w.to(torch.int32) - w_zero_points.to(torch.int32).reshape(-1, 1)
    xi = _centered(x, x_zero_point)
    acc = torch.matmul(xi.reshape(-1, xi.shape[-1]), wi.t())
    y = _out_scale(acc, x_scale, w_scales, bias, out_scale, (1, -1))
    return _requantize(y, out_zero_point, relu).reshape(*x.shape[:-1], w.shape[0])


@register_decomposition(aot_q.add.default)
def _add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point, relu):
    y = _dequantize(a, a_scale, a_zero_point) + _dequantize(b, b_scale, b_zero_point)
    return _through_real(y, out_scale, out_zero_point, relu)


@register_decomposition(aot_q.mul.default)
def _mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point, relu):
    y = _dequantize(a, a_scale, a_zero_point) * _dequantize(b, b_scale, b_zero_point)
    return _through_real(y, out_scale, out_zero_point, relu)


def _averaged(average, x, scale, zero_point, out_scale, out_zero_point, centered=True):
    """An average of quantized values. With the input's parameters kept (what ATen's
    kernels give unless told otherwise) and ``centered``, it is taken over the integers
    minus the zero point and rounded half to even, as ATen's pooling kernels (and
    qnnpack's mean) do: ties stay ties, never a float a hair off one. Otherwise through
    real numbers (x86's mean). Padding is a real zero (the zero point) either way."""
    same = (float(scale), int(zero_point)) == (float(out_scale), int(out_zero_point))
    if same and centered:
        return _requantize(average(_centered(x, zero_point).to(torch.float32)), zero_point,
                           False)
    return _through_real(average(_dequantize(x, scale, zero_point)), out_scale, out_zero_point)


@register_decomposition(aot_q.mean.default)
def _mean(x, scale, zero_point, dim, keepdim, out_scale, out_zero_point):
    return _averaged(lambda v: torch.mean(v, dim, keepdim), x, scale, zero_point, out_scale,
                     out_zero_point, centered=torch.backends.quantized.engine == "qnnpack")


@register_decomposition(aot_q.avg_pool2d.default)
def _avg_pool2d(x, scale, zero_point, kernel_size, stride, padding, ceil_mode,
                count_include_pad, divisor_override, out_scale, out_zero_point):
    return _averaged(lambda v: F.avg_pool2d(v, kernel_size, stride or None, padding, ceil_mode,
                                            count_include_pad, divisor_override),
                     x, scale, zero_point, out_scale, out_zero_point)


def _register_unary(name: str) -> None:
    real = UNARY[name].real

    def decomposition(x, scale, zero_point, *rest):
        *params, out_scale, out_zero_point = rest
        return _through_real(real(_dequantize(x, scale, zero_point), *params), out_scale,
                             out_zero_point)
    register_decomposition(getattr(aot_q, name).default)(decomposition)


for _name in UNARY:
    _register_unary(_name)


@register_decomposition(aot_q.cat.default)
def _cat(xs, scales, zero_points, dim, out_scale, out_zero_point):
    y = torch.cat([_dequantize(x, s, z) for x, s, z in zip(xs, scales, zero_points)], dim)
    return _through_real(y, out_scale, out_zero_point)


@register_decomposition(aot_q.max_pool2d.default)
def _max_pool2d(x, scale, zero_point, kernel_size, stride, padding, dilation, ceil_mode):
    # max commutes with the (increasing) dequantization: pool the integers themselves
    y = F.max_pool2d(x.to(torch.float32), kernel_size, stride or None, padding, dilation,
                     ceil_mode)
    return y.to(torch.int32).to(torch.uint8)  # see _requantize


@register_decomposition(aot_q.adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(x, scale, zero_point, output_size):
    # over x - zp, as ATen does (a 2x2 pool of ResNet18 at 64x64 ties on every 4th value)
    return _averaged(lambda v: F.adaptive_avg_pool2d(v, output_size), x, scale, zero_point,
                     scale, zero_point)


def _register_pt2e() -> None:
    """PT2E's ``quantized_decomposed`` Q/DQ ops (integer tensors, static qparams)."""
    try:
        import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines the ops)
        qd = torch.ops.quantized_decomposed
        q_t, dq_t = qd.quantize_per_tensor.default, qd.dequantize_per_tensor.default
        dq_c = qd.dequantize_per_channel.default
    except (ImportError, AttributeError, RuntimeError):
        return

    @register_decomposition(q_t)
    def _q_per_tensor(x, scale, zero_point, quant_min, quant_max, dtype):
        y = torch.round(x.to(torch.float32) * (1.0 / scale)) + zero_point
        return y.clamp(quant_min, quant_max).to(torch.int32).to(dtype)  # see _requantize

    @register_decomposition(dq_t)
    def _dq_per_tensor(x, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
        y = (x.to(torch.float32) - zero_point) * scale
        return y if out_dtype is None else y.to(out_dtype)

    @register_decomposition(dq_c)
    def _dq_per_channel(x, scales, zero_points, axis, quant_min, quant_max, dtype, *,
                        out_dtype=None):
        shape = [1] * x.dim()
        shape[axis] = -1
        y = (x.to(torch.float32) - zero_points.reshape(shape).to(torch.float32)) \
            * scales.reshape(shape).to(torch.float32)
        return y if out_dtype is None else y.to(out_dtype)


_register_pt2e()


# --- int8 conv/linear with float results (PT2E: the result feeds a float op) ------------

def _conv_accumulate(x, w, w_zero_points, stride, padding, dilation, groups, x_zero_point):
    """int32 sums of ``(x - zx) * (w - zw)``, computed as ``_conv2d`` computes them."""
    wi = w.to(torch.int32) - w_zero_points.to(torch.int32).reshape(-1, 1, 1, 1)
    if tuple(w.shape[2:]) == (1, 1) and not any(padding) and groups == 1:
        # subsample the uint8 input before widening it (see _conv2d)
        xs = _centered(x[:, :, ::stride[0], ::stride[1]], x_zero_point)
        n, c, h, wd = xs.shape
        acc = torch.matmul(xs.permute(0, 2, 3, 1).reshape(n * h * wd, c),
                           wi.reshape(wi.shape[0], c).t())
        return acc.reshape(n, h, wd, -1).permute(0, 3, 1, 2)
    return torch.ops.aten.convolution(_centered(x, x_zero_point), wi, None, stride, padding,
                                      dilation, False, [0, 0], groups)


def _float_result(acc, x_scale, w_scales, bias, shape):
    """``acc * x_scale * w_scale + bias`` in float32: the dequantized accumulator."""
    y = acc.to(torch.float32) * (w_scales.to(torch.float32) * x_scale).reshape(shape)
    return y if bias is None else y + bias.to(torch.float32).reshape(shape)


@register_decomposition(aot_q.conv2d_f32.default)
def _conv2d_f32(x, w, w_scales, w_zero_points, axis, bias, stride, padding, dilation, groups,
                x_scale, x_zero_point):
    acc = _conv_accumulate(x, w, w_zero_points, stride, padding, dilation, groups, x_zero_point)
    return _float_result(acc, x_scale, w_scales, bias, (1, -1, 1, 1))


@register_decomposition(aot_q.linear_f32.default)
def _linear_f32(x, w, w_scales, w_zero_points, axis, bias, x_scale, x_zero_point):
    wi = w.to(torch.int32) - w_zero_points.to(torch.int32).reshape(-1, 1)
    xi = _centered(x, x_zero_point)
    acc = torch.matmul(xi.reshape(-1, xi.shape[-1]), wi.t())
    y = _float_result(acc, x_scale, w_scales, bias, (1, -1))
    return y.reshape(*x.shape[:-1], w.shape[0])
