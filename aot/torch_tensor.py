"""TorchTensor: the typed description carried across every boundary.

A ``TorchTensor`` describes a tensor as ATen sees it: dtype, shape, strides (so
memory format), and quantization parameters. It is made at compile time from the
export's fake tensors, stored in the artifact manifest, and checked at run time
on every model input. This module imports torch only, so the runtime can use it
without the compiler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from .errors import InputMismatch

__all__ = ["QuantParams", "TorchTensor", "dtype_from_name", "dtype_name"]

# Forward table; the inverse is derived so the two cannot drift apart.
_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8,
    "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "bool": torch.bool, "complex64": torch.complex64,
    "quint8": torch.quint8, "qint8": torch.qint8, "qint32": torch.qint32,
}
_NAMES: dict[torch.dtype, str] = {v: k for k, v in _DTYPES.items()}
# A quantized tensor crosses into compiled code as its integer representation.
_STORAGE: dict[str, str] = {"quint8": "uint8", "qint8": "int8", "qint32": "int32"}


def dtype_name(dtype: torch.dtype) -> str:
    """Stable name of a torch dtype (``torch.float32`` -> ``"float32"``)."""
    try:
        return _NAMES[dtype]
    except KeyError:
        raise InputMismatch(f"dtype {dtype} is not supported at the boundary; "
                            f"supported: {sorted(_DTYPES)}") from None


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_name`."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise InputMismatch(f"unknown dtype name {name!r}; known: {sorted(_DTYPES)}") from None


@dataclass(frozen=True)
class QuantParams:
    """Quantization parameters of a quantized tensor.

    ``scheme`` is ``"per_tensor_affine"`` (``scale``/``zero_point`` are numbers)
    or ``"per_channel_affine"`` (tuples, one per slice along ``axis``).
    """

    scheme: str
    scale: float | tuple[float, ...]
    zero_point: int | tuple[int, ...]
    axis: int | None = None

    @staticmethod
    def from_tensor(t: torch.Tensor) -> "QuantParams | None":
        if not t.is_quantized:
            return None
        qs = t.qscheme()
        if qs in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            return QuantParams("per_tensor_affine", float(t.q_scale()), int(t.q_zero_point()))
        if qs in (torch.per_channel_affine, torch.per_channel_symmetric):
            return QuantParams("per_channel_affine",
                               tuple(float(s) for s in t.q_per_channel_scales().tolist()),
                               tuple(int(z) for z in t.q_per_channel_zero_points().tolist()),
                               int(t.q_per_channel_axis()))
        raise InputMismatch(f"quantization scheme {qs} is not supported at the boundary")

    def to_json(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "scale": _tuple_or(self.scale),
                "zero_point": _tuple_or(self.zero_point), "axis": self.axis}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "QuantParams":
        return QuantParams(d["scheme"], _untuple(d["scale"]), _untuple(d["zero_point"]), d.get("axis"))


def _tuple_or(v):
    return list(v) if isinstance(v, tuple) else v


def _untuple(v):
    return tuple(v) if isinstance(v, list) else v


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class TorchTensor:
    """dtype, shape, strides and quantization parameters of one tensor.

    Made by the importer (model inputs/outputs) and the partitioner (kernel-call
    operands/results); read by the runtime (input checks, output layout) and the
    fallback executor. Frozen: a spec read in one stage never changes under you.
    """

    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    qparams: QuantParams | None = None

    def __post_init__(self):
        assert self.dtype in _DTYPES, self.dtype
        assert len(self.shape) == len(self.strides), (self.shape, self.strides)

    @staticmethod
    def from_tensor(t: torch.Tensor) -> "TorchTensor":
        """Describe a real or fake tensor (shapes must be static)."""
        try:
            shape = tuple(int(s) for s in t.shape)
            strides = tuple(int(s) for s in t.stride())
        except (TypeError, RuntimeError) as e:
            raise InputMismatch(f"tensor has a dynamic shape {tuple(t.shape)}; only static "
                                "shapes are supported") from e
        qp = QuantParams.from_tensor(t) if t.is_quantized and t.device.type != "meta" else None
        return TorchTensor(dtype_name(t.dtype), shape, strides, qp)

    @cached_property
    def torch_dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @cached_property
    def is_contiguous(self) -> bool:
        """Row-major dense (size-1 dims may have any stride, as in torch)."""
        expect = _contiguous_strides(self.shape)
        return all(s == e or n <= 1 for s, e, n in zip(self.strides, expect, self.shape))

    @cached_property
    def memory_format(self) -> str:
        if self.is_contiguous:
            return "contiguous"
        if len(self.shape) == 4 and _same_layout(self, torch.channels_last):
            return "channels_last"
        return "strided"

    @property
    def storage_dtype(self) -> str:
        """What compiled code holds: ``uint8`` for ``quint8`` and so on; else the dtype."""
        return _STORAGE.get(self.dtype, self.dtype)

    def to_storage(self, t: torch.Tensor, name: str = "tensor") -> torch.Tensor:
        """ATen tensor -> the buffer compiled code sees (quantized: its int_repr).

        Raises InputMismatch when ``t``'s quantization parameters are not the
        ones this spec was compiled with.
        """
        if self.qparams is None:
            return t
        got = QuantParams.from_tensor(t) if t.is_quantized else None
        if got != self.qparams:
            raise InputMismatch(f"{name}: quantization parameters mismatch: expected "
                                f"{self.qparams}, got {got}")
        return t.int_repr()

    def from_storage(self, t: torch.Tensor) -> torch.Tensor:
        """Integer buffer -> the quantized tensor ATen expects (no copy of the data)."""
        q = self.qparams
        if q is None:
            return t
        if q.scheme == "per_tensor_affine":
            return torch._make_per_tensor_quantized_tensor(t, q.scale, q.zero_point)
        scales = torch.tensor(q.scale, dtype=torch.float64, device=t.device)
        zps = torch.tensor(q.zero_point, dtype=torch.int64, device=t.device)
        return torch._make_per_channel_quantized_tensor(t, scales, zps, q.axis)

    def dense(self) -> "TorchTensor":
        """The same tensor laid out row-major, as compiled code holds it."""
        return TorchTensor(self.dtype, self.shape, _contiguous_strides(self.shape), self.qparams)

    def check(self, t: Any, name: str) -> None:
        """Raise :class:`InputMismatch` naming the field if ``t`` does not match.

        Strides are checked by memory format: a channels-last input where a
        contiguous one was compiled for (or the reverse) is an error, not a copy.
        """
        if (isinstance(t, torch.Tensor) and t.dtype == self.torch_dtype and self.qparams is None
                and t.shape == self.shape and t.stride() == self.strides):
            return  # exactly as compiled (the common case, checked in a few attribute reads)
        if not isinstance(t, torch.Tensor):
            raise InputMismatch(f"{name}: expected a torch.Tensor {self.short()}, "
                                f"got {type(t).__name__}")
        if tuple(t.shape) != self.shape:
            raise InputMismatch(f"{name}: shape mismatch: expected {list(self.shape)}, "
                                f"got {list(t.shape)}")
        if t.dtype != self.torch_dtype:
            raise InputMismatch(f"{name}: dtype mismatch: expected {self.dtype}, "
                                f"got {str(t.dtype).replace('torch.', '')}")
        got = TorchTensor.from_tensor(t)
        if got.memory_format != self.memory_format:
            raise InputMismatch(f"{name}: memory format mismatch: expected {self.memory_format} "
                                f"(strides {list(self.strides)}), got {got.memory_format} "
                                f"(strides {list(got.strides)})")
        if got.qparams != self.qparams:
            raise InputMismatch(f"{name}: quantization parameters mismatch: expected "
                                f"{self.qparams}, got {got.qparams}")

    def short(self) -> str:
        q = f", {self.qparams.scheme}" if self.qparams else ""
        mf = "" if self.memory_format == "contiguous" else f", {self.memory_format}"
        return f"{self.dtype}{list(self.shape)}{mf}{q}"

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape), "strides": list(self.strides),
                "qparams": self.qparams.to_json() if self.qparams else None}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "TorchTensor":
        qp = d.get("qparams")
        return TorchTensor(d["dtype"], tuple(d["shape"]), tuple(d["strides"]),
                           QuantParams.from_json(qp) if qp else None)


def _same_layout(spec: TorchTensor, fmt: torch.memory_format) -> bool:
    probe = torch.empty(spec.shape, device="meta").contiguous(memory_format=fmt)
    return all(a == b or n <= 1 for a, b, n in zip(probe.stride(), spec.strides, spec.shape))
