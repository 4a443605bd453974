"""``aot_q`` ops as integer arithmetic IREE compiles (the "compiled int8" mode).

Registered into ``IREE_DECOMPOSITIONS``: the partitioner decomposes an ``aot_q``
op when IREE does not know it (always) unless the user forces it to ATen with
``fallback_ops=["aot_q.conv2d", ...]``. The math is ATen's: activations minus zero
point times int8 weights accumulate in int32; the accumulator is requantized as the
kernel eager runs does it (``quantized_ops.requantizing_kernel``), float steps in
its order and rounded to float32 as there, round half to even, clamped to
``[0, 255]`` (``[zo, 255]`` with a fused ReLU):

- fbgemm (the ``fbgemm`` engine; ``x86`` for linears, grouped convolutions and CPUs
  without AVX512-VNNI): ``round((acc + b / (sx*sw)) * (sx*sw / so)) + zo``;
- oneDNN (the ``onednn`` engine; ``x86`` convolutions with at most 100 groups and
  symmetric weights on AVX512-VNNI CPUs under Linux): ``round(((acc * sx') * sw' + b)
  * (1 / so') + zo)``, where each scale has been through ideep's float32 reciprocal
  and back (``sx' = 1 / float32(1 / sx)``);
- qnnpack: the bias rounded to int32 and added to the accumulator, then
  ``round(acc * ((sx*sw) * (1 / so))) + zo``.

Against ATen's kernels on random inputs, fbgemm and oneDNN linears are bit-exact and
oneDNN convolutions a rare value one step apart (the fbgemm formula alone would leave
many more there). Averages are taken over ``x - zp`` and rounded half
to even as ATen's pooling kernels do; activations without integer arithmetic of
their own go through float32 between a dequantize and a quantize, as ATen's do.

Which engine: ``torch.backends.quantized.engine`` as it is while the program
compiles, the engine the artifact records and runs its kernel calls under
(``aot.fallback.quantized_ops.compile_engine``), so both modes follow one engine.
The kernel choice within ``x86`` is this machine's (the CPU eager runs on here).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import UnsupportedOp
from ..fallback.quantized_ops import (  # (defines torch.ops.aot_q)
    UNARY, onednn_combines_scales, requantizing_kernel)
from .registry import register_decomposition

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
    return _requantize(y * _f32(1.0 / out_scale), out_zero_point, relu)


def _centered(x: torch.Tensor, zp) -> torch.Tensor:
    return x.to(torch.int32) - zp


def _requantized(acc, x_scale, w_scales, w_zero_points, bias, out_scale, out_zero_point,
                 relu, shape, kernel: str, combined: bool = False) -> torch.Tensor:
    """A conv's or linear's int32 accumulator requantized as ATen's ``kernel`` does
    (``quantized_ops.requantizing_kernel``); the float steps in the kernel's order,
    each rounded to float32 as there, so near-ties fall the same way. ``combined``:
    oneDNN's kernel multiplies by the scales' product
    (``quantized_ops.onednn_combines_scales``)."""
    if kernel == "qnnpack":
        # qnnpack quantizes the bias to int32 (ATen's quantize: times float32(1 / scale),
        # not over it) and adds it to the accumulator
        act_w = (w_scales.to(torch.float32) * _f32(x_scale)).reshape(shape)
        if bias is not None:
            acc = acc + torch.round(bias.to(torch.float32).reshape(shape) * (1.0 / act_w)).to(torch.int32)
        # its requantization scale is (sw * sx) * float32(1 / so), one float each
        inv_so = _f32(float(np.float32(1) / np.float32(out_scale)))
        return _requantize(acc.to(torch.float32) * (act_w * inv_so), out_zero_point, relu)
    fbgemm = _fbgemm_requantized(acc, x_scale, w_scales, bias, out_scale, out_zero_point,
                                 relu, shape)
    if kernel == "fbgemm":
        return fbgemm
    onednn = _onednn_requantized(acc, x_scale, w_scales, bias, out_scale, out_zero_point,
                                 relu, shape, combined)
    if kernel == "onednn":
        return onednn
    # "onednn-if-symmetric": x86 packs the weight for oneDNN when its zero points are all 0
    return torch.where((w_zero_points == 0).all(), onednn, fbgemm)


def _fbgemm_requantized(acc, x_scale, w_scales, bias, out_scale, out_zero_point, relu, shape):
    """fbgemm: ``round((acc + b / (sx*sw)) * (sx*sw / so)) + zo``."""
    act_w = (w_scales.to(torch.float32) * _f32(x_scale)).reshape(shape)
    y = acc.to(torch.float32)
    if bias is not None:
        y = y + bias.to(torch.float32).reshape(shape) / act_w
    return _requantize(y * (act_w / _f32(out_scale)), out_zero_point, relu)


def _f32(v: float) -> float:
    """``v`` as the float32 number ATen's kernels compute with. Every float constant of
    a decomposition is one already: IREE 3.13 (through the FX importer) narrows a
    float64 constant to float32 toward zero, not to the nearest (``x * (1 / 0.0371)``
    multiplies by 26.954178 instead of 26.95418, enough to put a few quantized values in
    a million a step off)."""
    return float(np.float32(v))


def _f32_reciprocal_twice(v: float) -> float:
    """``1 / float32(1 / v)`` in float32: a scale after ideep's round trip to oneDNN."""
    return float(np.float32(1) / np.float32(1.0 / v))


def _onednn_requantized(acc, x_scale, w_scales, bias, out_scale, out_zero_point, relu, shape,
                        combined=False):
    """oneDNN, as PyTorch calls it: the input and output scales go to ideep as their
    float32 reciprocals and oneDNN inverts them again; the weight scales go as they
    are, in float32 (inverting them twice too would put a few outputs in ten million a
    step off; as they are, none). Then
    ``((acc * sx) * sw + b) * (1 / so) + zo``, each step in float32, the zero point
    added before rounding; where its kernel combines the scales,
    ``(acc * (sx * sw) + b) * (1 / so) + zo``."""
    sx = _f32_reciprocal_twice(x_scale)
    inv_so = float(np.float32(1) / np.float32(_f32_reciprocal_twice(out_scale)))
    sw = w_scales.to(torch.float32)
    if combined:  # its AMX kernels: one multiply by float32(sx * sw)
        y = _rounded_product(acc.to(torch.float32), sw.reshape(shape) * sx)
    else:
        y = _rounded_product(acc.to(torch.float32) * sx, sw.reshape(shape))
    if bias is not None:
        y = y + bias.to(torch.float32).reshape(shape)
    y = torch.round(_rounded_product(y, inv_so) + float(out_zero_point))
    return y.clamp(out_zero_point if relu else 0, _QMAX).to(torch.int32).to(torch.uint8)


def _rounded_product(a: torch.Tensor, b) -> torch.Tensor:
    """``a * b`` rounded to float32 even where an add follows: IREE's llvm-cpu marks
    float multiplies and adds ``contract``, so ``a * b + c`` becomes one fused
    multiply-add, rounded once (enough to move a few requantized values in a million a
    step).
    A clamp to the finite floats between them changes no value and is not a
    multiply, so nothing is fused across it."""
    return torch.clamp(a * b, -_F32_MAX, _F32_MAX)


_F32_MAX = float(np.finfo(np.float32).max)


@register_decomposition(aot_q.quantize.default)
def _quantize(x, scale, zero_point):
    return _through_real(x, scale, zero_point)


@register_decomposition(aot_q.dequantize.default)
def _dequantize(x, scale, zero_point):
    # rounded as ATen rounds it, even where an add follows (see _rounded_product)
    return _rounded_product(x.to(torch.float32) - zero_point, _f32(scale))


def _conv_accumulate(x, w, w_zero_points, stride, padding, dilation, groups, x_zero_point):
    """int32 sums of ``(x - zx) * (w - zw)``, computed as ``_conv2d`` computes them."""
    wi = w.to(torch.int32) - w_zero_points.to(torch.int32).reshape(-1, 1, 1, 1)
    if tuple(w.shape[2:]) == (1, 1) and not any(padding) and groups == 1:
        # subsample the uint8 input before widening it (IREE 3.13's llvm-cpu puts a
        # strided slice of a widened tensor on the stack, megabytes, and fails)
        xs = _centered(x[:, :, ::stride[0], ::stride[1]], x_zero_point)
        n, c, h, wd = xs.shape
        acc = torch.matmul(xs.permute(0, 2, 3, 1).reshape(n * h * wd, c),
                           wi.reshape(wi.shape[0], c).t())
        return acc.reshape(n, h, wd, -1).permute(0, 3, 1, 2)
    return torch.ops.aten.convolution(_centered(x, x_zero_point), wi, None, stride, padding,
                                      dilation, False, [0, 0], groups)


@register_decomposition(aot_q.conv2d.default)
def _conv2d(x, w, w_scales, w_zero_points, axis, bias, stride, padding, dilation, groups,
            x_scale, x_zero_point, out_scale, out_zero_point, relu):
    acc = _conv_accumulate(x, w, w_zero_points, stride, padding, dilation, groups, x_zero_point)
    kernel = requantizing_kernel("conv2d", groups)
    combined = kernel.startswith("onednn") and onednn_combines_scales(
        x.shape, w.shape, stride, padding, dilation, groups)
    return _requantized(acc, x_scale, w_scales, w_zero_points, bias, out_scale, out_zero_point,
                        relu, (1, -1, 1, 1), kernel, combined)


@register_decomposition(aot_q.linear.default)
def _linear(x, w, w_scales, w_zero_points, axis, bias, x_scale, x_zero_point, out_scale,
            out_zero_point, relu):
    wi = w.to(torch.int32) - w_zero_points.to(torch.int32).reshape(-1, 1)
    xi = _centered(x, x_zero_point)
    acc = torch.matmul(xi.reshape(-1, xi.shape[-1]), wi.t())
    kernel = requantizing_kernel("linear")
    combined = kernel == "onednn" and onednn_combines_scales(x.shape, w.shape)
    y = _requantized(acc, x_scale, w_scales, w_zero_points, bias, out_scale, out_zero_point,
                     relu, (1, -1), kernel, combined)
    return y.reshape(*x.shape[:-1], w.shape[0])


@register_decomposition(aot_q.add.default)
def _add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point, relu):
    if requantizing_kernel("add") == "qnnpack" and a.shape == b.shape:
        # qnnpack adds same-shaped tensors in fixed point; anything else through real
        # numbers, as ATen does
        return _qnnpack_add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale,
                            out_zero_point, relu)
    # ATen's vectorised add: each input dequantized with one fused multiply-add, the sum
    # times float32(1 / so), rounded half to even
    y = _fused_dequantize(a, a_scale, a_zero_point) + _fused_dequantize(b, b_scale, b_zero_point)
    inv_so = _f32(float(np.float32(1) / np.float32(out_scale)))
    return _requantize(_rounded_product(y, inv_so), out_zero_point, relu)


def _fused_dequantize(x, scale, zero_point):
    """``fma(q, s, float32(-zp * s))``, rounded once, as ATen's vectorised kernels
    dequantize (``Vectorized<quint8>::dequantize`` with the premultiplied zero point;
    the leftover elements of a loop, fewer than two vectors, take ``(q - zp) * s``).
    IREE has no fused multiply-add to ask for, so it is computed exactly in integers:
    with ``s = ms * 2**es`` and ``p = float32(-zp * s) = mp * 2**ep``, ``q * s + p`` is
    ``(q * ms * 2**(es - e) + mp * 2**(ep - e)) * 2**e`` for ``e = min(es, ep)``; one
    int64 to float32 conversion rounds it, the power of two scales it exactly.
    Without it, a rare output of a quantized add lands a step off."""
    s = np.float32(scale)
    p = np.float32(s * np.float32(-int(zero_point)))
    (ms, es), (mp, ep) = (_integer_significand(v) for v in (s, p))
    e = min(es, ep)
    exact = x.to(torch.int64) * (ms << (es - e)) + (mp << (ep - e))
    return exact.to(torch.float32) * float(np.ldexp(np.float32(1), e))


def _integer_significand(v: np.float32) -> tuple[int, int]:
    """``(m, e)`` with ``v == m * 2**e`` exactly, ``m`` an integer (0 for 0)."""
    if v == 0:
        return 0, 0
    mantissa, exponent = np.frexp(np.float32(v))  # v = mantissa * 2**exponent, |mantissa| in [0.5, 1)
    return int(np.ldexp(mantissa, 24)), int(exponent) - 24


def _qnnpack_add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale,
                 out_zero_point, relu):
    """qnnpack's add: each input's scale over the output's, in float32, becomes an
    integer multiplier of about 22 bits, with one shift for both so that the larger
    multiplier lies in [2**21, 2**22); the sum of ``multiplier * (q - zp)`` is shifted
    right, rounding half away from zero. Against ATen under qnnpack it is bit-exact on
    random inputs (computed through real numbers, a few values per million differ)."""
    ratios = [np.float32(np.float32(s) / np.float32(out_scale)) for s in (a_scale, b_scale)]
    exponent = int(np.frexp(max(ratios))[1]) - 1  # max(ratios) = m * 2**exponent, 1 <= m < 2
    shift = 21 - exponent
    if not 13 <= shift <= 31:
        raise UnsupportedOp(
            f"aot_q.add: qnnpack adds only when each input scale over the output scale "
            f"lies in [2**-14, 2**8); these are {float(ratios[0]):g} and {float(ratios[1]):g}")
    a_mul, b_mul = (int(np.rint(np.float32(r * np.float32(2.0 ** shift)))) for r in ratios)
    acc = (a_mul * (a.to(torch.int64) - a_zero_point) + b_mul * (b.to(torch.int64) - b_zero_point))
    unit = 1 << shift
    floor = torch.div(acc, unit, rounding_mode="floor")
    rem = acc - floor * unit - (acc < 0).to(torch.int64)
    q = floor + (rem > (unit - 1) // 2).to(torch.int64) + out_zero_point
    return q.clamp(out_zero_point if relu else 0, _QMAX).to(torch.int32).to(torch.uint8)


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
        y = torch.round(x.to(torch.float32) * _f32(1.0 / scale)) + zero_point
        return y.clamp(quant_min, quant_max).to(torch.int32).to(dtype)  # see _requantize

    @register_decomposition(dq_t)
    def _dq_per_tensor(x, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
        y = (x.to(torch.float32) - zero_point) * _f32(scale)
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

def _float_result(acc, x_scale, w_scales, bias, shape):
    """``acc * x_scale * w_scale + bias`` in float32: the dequantized accumulator."""
    y = acc.to(torch.float32) * (w_scales.to(torch.float32) * _f32(x_scale)).reshape(shape)
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
