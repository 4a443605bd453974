"""Channels-last execution of an ATen region (oneDNN and cuDNN prefer NHWC convolutions).

The compiler asks for ``memory_format="channels_last"`` on a group only when
every member is in :data:`LAYOUT_SAFE` (ops whose result *values* do not
depend on their operands' strides) and it measured faster. The executor then
hands convolutions NHWC activations and weights (constant weights converted
once, not per call) and runs ``view`` as ``reshape`` (viewing an NHWC tensor
with a new shape may need a copy). Only strides change, never values; a result
crossing back to compiled code is made dense as always.
"""

from __future__ import annotations

import torch

__all__ = ["LAYOUT_SAFE", "CONV_OPS", "layout_safe", "has_conv", "ChannelsLast"]

CONV_OPS = frozenset({"aten::convolution", "aten::conv2d"})
_RESHAPE = {"aten::view", "aten::_unsafe_view", "aten::reshape"}
LAYOUT_SAFE = CONV_OPS | _RESHAPE | frozenset(f"aten::{n}" for n in (
    "relu", "relu_", "add", "sub", "mul", "div", "neg", "clamp", "clamp_min", "hardtanh",
    "sigmoid", "silu", "gelu", "tanh", "hardswish", "hardsigmoid", "leaky_relu", "elu",
    "max_pool2d", "max_pool2d_with_indices", "avg_pool2d", "adaptive_avg_pool2d",
    "mean", "sum", "amax", "linear", "addmm", "mm", "matmul", "t", "permute", "transpose",
    "squeeze", "unsqueeze", "flatten", "cat", "clone", "dropout", "expand", "slice",
    "select", "_native_batch_norm_legit_no_training", "batch_norm", "rsqrt", "sqrt",
))


def layout_safe(ops) -> bool:
    """True when every op name (``aten::relu``) is safe to run on NHWC operands."""
    return all(op in LAYOUT_SAFE for op in ops)


def has_conv(ops) -> bool:
    return any(op in CONV_OPS for op in ops)


class ChannelsLast:
    """Per-group NHWC state: constant weights converted once, keyed by their buffer."""

    def __init__(self):
        self._weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @staticmethod
    def op_for(op_name: str, op):
        """``view`` runs as ``reshape``: the same values, a copy where NHWC needs one."""
        return torch.ops.aten.reshape.default if op_name in _RESHAPE else op

    def conv_args(self, args: list, weight_constant: bool) -> list:
        """NHWC input and weight for ``convolution(input, weight, ...)``."""
        x, w = args[0], args[1]
        if x.dim() == 4:
            args[0] = x.contiguous(memory_format=torch.channels_last)
        if w.dim() == 4:
            args[1] = self._weight(w) if weight_constant else \
                w.contiguous(memory_format=torch.channels_last)
        return args

    def _weight(self, w: torch.Tensor) -> torch.Tensor:
        key = w.data_ptr()
        hit = self._weights.get(key)
        if hit is None or hit[0].shape != w.shape:
            # keep the original alive so its address cannot be reused for another weight
            hit = (w, w.contiguous(memory_format=torch.channels_last))
            self._weights[key] = hit
        return hit[1]
