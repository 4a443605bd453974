"""What each function applied to quantized tensors becomes on their integer storage.

An eager-quantized model is not a list of module types: its ``forward`` applies
functions to ``quint8`` tensors (quantized modules call ``torch.ops.quantized.*``
with packed weights; user code and torchvision call ``F.adaptive_avg_pool2d``,
``torch.flatten``, ``x.mean``, ``torch.cat``, ``F.hardsigmoid``...). The importer
(``aot.importer.quantized``) replays ``forward`` on the integer storage of those
tensors and asks this table what each call becomes:

- a **layout** call (``view``, ``flatten``, ``chunk``, ``transpose``, ``[i]``...)
  rearranges values and keeps the quantization parameters: it runs on the storage
  as it is;
- a **computing** call becomes the ``aot_q`` op that models it
  (``aot.fallback.quantized_ops``), its quantization parameters static: the input's
  from the tracked storage, the output's as eager produced them;
- a **query** (``x.dtype``, ``x.q_scale()``, ``x.is_quantized``) answers what eager
  would have answered.

Names are canonical (``"F.max_pool2d"``, ``"Tensor.mean"``, ``"quantized::conv2d"``,
see :func:`call_name`); a call with no entry is refused by the importer with its
name and the user's source line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import UnsupportedOp
from ..fallback import quantized_ops  # noqa: F401  (defines torch.ops.aot_q)

__all__ = ["Call", "PackedWeight", "call_name", "CREATES_QUANTIZED", "HANDLERS", "LAYOUT",
           "QUERIES"]

aot_q = torch.ops.aot_q
QParams = tuple[float, int]


def call_name(func) -> str:
    """A readable, stable name for what ``__torch_function__`` received."""
    if isinstance(func, torch._ops.OpOverloadPacket):
        return func._qualified_op_name
    if isinstance(func, torch._ops.OpOverload):
        return func._schema.name
    name = getattr(func, "__name__", None) or repr(func)
    if type(func).__name__ == "method-wrapper":  # a property's getter: x.dtype, x.shape
        return f"Tensor.{getattr(func.__self__, '__name__', name)}"
    qual = getattr(func, "__qualname__", "") or ""
    if qual.startswith(("TensorBase.", "Tensor.")):
        return f"Tensor.{name}"
    module = getattr(func, "__module__", None) or ""
    if module in ("torch.nn.functional", "torch._C._nn"):
        return f"F.{name}"
    if module == "torch":
        return f"torch.{name}"
    return f"{module}.{qual or name}" if module else name


@dataclass(frozen=True)
class PackedWeight:
    """Stands in for a packed quantized weight (a TorchScript object export cannot
    capture) in the model's copy; ``key`` names its unpacked tensors.

    ``kind``: ``"conv2d"`` or ``"linear"``; anything else (another packed class, an
    unsupported scheme) says why it was not unpacked, and an op reading it is refused.
    """

    key: str
    kind: str
    params: tuple = ()   # conv2d: (stride, padding, dilation, groups)
    axis: int = -1       # per-channel axis of the weight, -1 per-tensor


class Call:
    """One call being replayed: its arguments on integer storage and what eager did.

    ``qparams(t)``: the quantization parameters of a tracked storage tensor;
    ``out``: the output parameters eager produced, one per quantized result;
    ``weights(p, kind)``: the unpacked ``(w, scales, zero_points, bias)`` of a
    :class:`PackedWeight` of that kind.
    """

    def __init__(self, name: str, qparams: Callable, out: tuple[QParams, ...],
                 weights: Callable):
        self.name, self.qparams, self.out, self.weights = name, qparams, out, weights

    def one_out(self) -> QParams:
        if len(self.out) != 1:
            raise UnsupportedOp(f"{self.name} produced {len(self.out)} quantized results in "
                                "eager; one was expected", op=self.name)
        return self.out[0]


def _pair(v) -> list[int]:
    return list(torch.nn.modules.utils._pair(v))


# --- computing calls ---------------------------------------------------------------------

def _conv(relu: bool):
    def handler(c: Call, qx, packed_weight, output_scale, output_zero_point):
        w, w_scales, w_zps, bias = c.weights(packed_weight, "conv2d")
        return aot_q.conv2d(qx, w, w_scales, w_zps, packed_weight.axis, bias,
                            *packed_weight.params, *c.qparams(qx), float(output_scale),
                            int(output_zero_point), relu)
    return handler


def _linear(relu: bool):
    def handler(c: Call, X, W_prepack, Y_scale_i, Y_zero_point_i):
        w, w_scales, w_zps, bias = c.weights(W_prepack, "linear")
        return aot_q.linear(X, w, w_scales, w_zps, W_prepack.axis, bias, *c.qparams(X),
                            float(Y_scale_i), int(Y_zero_point_i), relu)
    return handler


def _binary(op, relu: bool):
    def handler(c: Call, qa, qb, scale, zero_point):
        if not (isinstance(qa, torch.Tensor) and isinstance(qb, torch.Tensor)):
            raise UnsupportedOp(f"{c.name} with a scalar operand is not supported", op=c.name)
        return op(qa, *c.qparams(qa), qb, *c.qparams(qb), float(scale), int(zero_point), relu)
    return handler


def _cat(c: Call, tensors, dim=0, *rest):
    qps = [c.qparams(t) for t in tensors]
    return aot_q.cat(list(tensors), [s for s, _ in qps], [z for _, z in qps], dim, *c.one_out())


def _quantized_cat(c: Call, qx, dim, scale=None, zero_point=None):
    qps = [c.qparams(t) for t in qx]
    out = c.one_out() if scale is None else (float(scale), int(zero_point))
    return aot_q.cat(list(qx), [s for s, _ in qps], [z for _, z in qps], dim, *out)


def _unary(name: str, params: Callable = lambda *a, **k: ()):
    """``params(*user_args, **user_kwargs)``: the op's extra float operands."""
    op = getattr(aot_q, name)

    def handler(c: Call, x, *args, **kwargs):
        return op(x, *c.qparams(x), *params(*args, **kwargs), *c.one_out())
    return handler


def _hardswish_op(c: Call, input, output_scale, output_zero_point):
    return aot_q.hardswish(input, *c.qparams(input), float(output_scale),
                           int(output_zero_point))


def _relu6_op(c: Call, qx, inplace=False):
    return aot_q.hardtanh(qx, *c.qparams(qx), 0.0, 6.0, *c.one_out())


def _dims(x, dim) -> list[int]:
    if dim is None:
        return list(range(x.dim()))
    return [dim] if isinstance(dim, int) else list(dim)


def _mean(c: Call, x, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        raise UnsupportedOp("mean with a dtype on a quantized tensor is not supported", op=c.name)
    return aot_q.mean(x, *c.qparams(x), _dims(x, dim), bool(keepdim), *c.one_out())


def _adaptive_avg_pool2d(c: Call, x, output_size):
    size = [s if s is not None else x.shape[-2 + i] for i, s in enumerate(_pair(output_size))]
    qp = c.qparams(x)
    if c.one_out() != qp:
        raise UnsupportedOp("adaptive_avg_pool2d changed the quantization parameters in eager",
                            op=c.name)
    return aot_q.adaptive_avg_pool2d(x, *qp, size)


def _avg_pool2d(c: Call, x, kernel_size, stride=None, padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    return aot_q.avg_pool2d(x, *c.qparams(x), _pair(kernel_size),
                            _pair(stride) if stride else [], _pair(padding), bool(ceil_mode),
                            bool(count_include_pad), divisor_override, *c.one_out())


def _max_pool2d(c: Call, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                return_indices=False):
    if return_indices:
        raise UnsupportedOp("max_pool2d with return_indices on a quantized tensor is not "
                            "supported", op=c.name)
    qp = c.qparams(x)
    return aot_q.max_pool2d(x, *qp, _pair(kernel_size), _pair(stride) if stride else [],
                            _pair(padding), _pair(dilation), bool(ceil_mode))


def _dequantize(c: Call, x):
    return aot_q.dequantize(x, *c.qparams(x))


def _quantize_per_tensor(c: Call, x, scale, zero_point, dtype):
    if dtype != torch.quint8:
        raise UnsupportedOp(f"quantize_per_tensor to {dtype} is not supported (quint8 is)",
                            op=c.name)
    return aot_q.quantize(x, *c.one_out())  # the parameters eager quantized with


def _int_repr(c: Call, x):
    return x.view(x.shape)  # the storage, as a tensor no longer tracked as quantized


def _dropout(c: Call, x, p=0.5, training=True, inplace=False):
    if training:
        raise UnsupportedOp("dropout in training mode on a quantized tensor", op=c.name)
    return x


def _exact_gelu(approximate: str) -> tuple:
    if approximate != "none":
        raise UnsupportedOp(f"gelu with approximate={approximate!r} on a quantized tensor is "
                            "not supported", op="F.gelu")
    return ()


HANDLERS: dict[str, Callable] = {
    "quantized::conv2d": _conv(False), "quantized::conv2d_relu": _conv(True),
    "quantized::linear": _linear(False), "quantized::linear_relu": _linear(True),
    "quantized::add": _binary(aot_q.add, False), "quantized::add_relu": _binary(aot_q.add, True),
    "quantized::mul": _binary(aot_q.mul, False), "quantized::mul_relu": _binary(aot_q.mul, True),
    "quantized::cat": _quantized_cat, "torch.cat": _cat, "torch.concat": _cat,
    "quantized::hardswish": _hardswish_op, "quantized::relu6": _relu6_op,
    "F.relu": _unary("relu"), "torch.relu": _unary("relu"), "torch.relu_": _unary("relu"),
    "Tensor.relu": _unary("relu"), "Tensor.relu_": _unary("relu"),
    "F.relu6": _unary("hardtanh", lambda inplace=False: (0.0, 6.0)),
    "F.hardtanh": _unary("hardtanh", lambda min_val=-1.0, max_val=1.0, inplace=False:
                         (float(min_val), float(max_val))),
    "F.hardsigmoid": _unary("hardsigmoid"),
    "torch.sigmoid": _unary("sigmoid"), "Tensor.sigmoid": _unary("sigmoid"),
    "torch.tanh": _unary("tanh"), "Tensor.tanh": _unary("tanh"),
    "F.leaky_relu": _unary("leaky_relu", lambda negative_slope=0.01, inplace=False:
                           (float(negative_slope),)),
    "F.gelu": _unary("gelu", lambda approximate="none": _exact_gelu(approximate)),
    "torch.mean": _mean, "Tensor.mean": _mean,
    "F.adaptive_avg_pool2d": _adaptive_avg_pool2d, "F.avg_pool2d": _avg_pool2d,
    "F.max_pool2d": _max_pool2d, "F.max_pool2d_with_indices": _max_pool2d,
    "Tensor.dequantize": _dequantize, "torch.dequantize": _dequantize,
    "torch.quantize_per_tensor": _quantize_per_tensor, "Tensor.int_repr": _int_repr,
    "F.dropout": _dropout, "F.dropout2d": _dropout,
}


# Calls that rearrange values and keep the quantization parameters: run on the storage.
LAYOUT = frozenset({
    *(f"Tensor.{m}" for m in (
        "view", "reshape", "flatten", "permute", "transpose", "contiguous", "squeeze",
        "unsqueeze", "chunk", "split", "narrow", "select", "__getitem__", "expand", "t",
        "clone", "detach", "flip", "unbind", "view_as", "reshape_as", "expand_as", "T", "mT",
        "unflatten", "movedim", "swapaxes", "tensor_split", "split_with_sizes")),
    *(f"torch.{m}" for m in (
        "flatten", "reshape", "permute", "transpose", "squeeze", "unsqueeze", "chunk", "split",
        "narrow", "select", "flip", "unbind", "channel_shuffle", "movedim", "swapaxes", "t",
        "tensor_split", "unflatten", "clone", "detach", "pixel_shuffle", "pixel_unshuffle",
        "native_channel_shuffle")),
    "F.pixel_shuffle", "F.pixel_unshuffle", "F.channel_shuffle",
})

# Quantized tensors made from float ones: replayed even with no tracked input.
CREATES_QUANTIZED = frozenset({"torch.quantize_per_tensor"})

# What eager answers about a quantized tensor, from its tracked parameters.
QUERIES: dict[str, Callable[[QParams], object]] = {
    "Tensor.dtype": lambda qp: torch.quint8,
    "Tensor.is_quantized": lambda qp: True,
    "Tensor.q_scale": lambda qp: qp[0],
    "Tensor.q_zero_point": lambda qp: qp[1],
    "Tensor.qscheme": lambda qp: torch.per_tensor_affine,
}
