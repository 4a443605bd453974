"""TorchTensor: the typed description carried across every boundary.

A ``TorchTensor`` describes a tensor as ATen sees it: dtype, shape, strides (so
memory format), and quantization parameters. It is made at compile time from the
export's fake tensors, stored in the artifact manifest, and checked at run time
on every model input. This module imports torch only, so the runtime can use it
without the compiler, and imports torch lazily: a torch-free runtime
(``aot.runtime.numpy_module``) reads and checks the same descriptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from .errors import InputMismatch
from .symbolic import evaluate, free_symbols, is_input_symbol, to_sympy

if TYPE_CHECKING:
    import torch

__all__ = ["QuantParams", "TorchTensor", "dtype_from_name", "dtype_name"]

# Every dtype name the boundary knows (the boundary takes them all; what compiled
# code can hold is ``aot.partition.outline``'s business). Torch-free, so a manifest is
# read without torch; ``_torch_dtypes`` maps the names this torch build has.
DTYPE_NAMES = (
    "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32",
    "int64", "bool", "complex32", "complex64", "complex128", "uint16", "uint32", "uint64",
    "quint8", "qint8", "qint32", "quint4x2", "quint2x4", "float8_e4m3fn", "float8_e5m2",
    "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
    "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2")
_DTYPE_SET = frozenset(DTYPE_NAMES)
_ITEMSIZE = {"bool": 1, "complex32": 4, "complex64": 8, "complex128": 16, "quint8": 1,
             "qint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1, "bits1x8": 1,
             "bits2x4": 1, "bits4x2": 1, "float4_e2m1fn_x2": 1}


def itemsize(name: str) -> int:
    """Bytes per element of a dtype named in ``DTYPE_NAMES`` (torch-free)."""
    if name in _ITEMSIZE:
        return _ITEMSIZE[name]
    digits = "".join(c for c in name.split("_")[0] if c.isdigit())
    return max(1, int(digits) // 8) if digits else 8
# A quantized tensor crosses into compiled code as its integer representation.
_STORAGE: dict[str, str] = {"quint8": "uint8", "qint8": "int8", "qint32": "int32"}


@lru_cache(maxsize=None)
def _torch_dtypes() -> dict[str, "torch.dtype"]:
    """Forward table over this torch build; the inverse is derived so the two cannot
    drift apart."""
    import torch
    return {n: getattr(torch, n) for n in DTYPE_NAMES
            if isinstance(getattr(torch, n, None), torch.dtype)}


@lru_cache(maxsize=None)
def _torch_names() -> dict["torch.dtype", str]:
    return {v: k for k, v in _torch_dtypes().items()}


def known_dtype_names():
    """The dtype names a manifest may hold here: this torch build's, or every name the
    boundary knows where torch is absent (the torch-free runtime checks its own)."""
    try:
        return _torch_dtypes()
    except ImportError:
        return DTYPE_NAMES


def dtype_name(dtype: torch.dtype) -> str:
    """Stable name of a torch dtype (``torch.float32`` -> ``"float32"``)."""
    try:
        return _torch_names()[dtype]
    except KeyError:
        raise InputMismatch(f"dtype {dtype} is not supported at the boundary; "
                            f"supported: {sorted(_torch_dtypes())}") from None


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_name`."""
    try:
        return _torch_dtypes()[name]
    except KeyError:
        raise InputMismatch(f"unknown dtype name {name!r}; known: "
                            f"{sorted(_torch_dtypes())}") from None


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
    def from_tensor(t: "torch.Tensor") -> "QuantParams | None":
        import torch
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


def _contiguous_strides(shape: tuple) -> tuple:
    """Row-major strides; over symbolic sizes, expressions (``aot.symbolic``)."""
    return _strides_in_order(shape, tuple(range(len(shape) - 1, -1, -1)))


def _strides_in_order(shape: tuple, order: tuple[int, ...]) -> tuple:
    """Dense strides with ``order[0]`` the fastest-varying dimension."""
    if not any(isinstance(d, str) for d in shape):
        strides, acc = [0] * len(shape), 1
        for d in order:
            strides[d] = acc
            acc *= max(shape[d], 1)
        return tuple(strides)
    import sympy
    strides, acc = [0] * len(shape), sympy.Integer(1)
    for d in order:
        strides[d] = _dim_text(acc)
        acc = acc * to_sympy(shape[d])
    return tuple(strides)


def _dim_text(e):
    """A sympy size as the manifest keeps it: an int, or its expression's text."""
    return int(e) if getattr(e, "is_number", False) else str(e)


def _symbolic_layout(spec: "TorchTensor", expect: tuple) -> bool:
    """Symbolic strides equal to ``expect`` (size-1 dimensions aside)."""
    import sympy
    return all(n == 1 or sympy.simplify(to_sympy(s) - to_sympy(e)) == 0
               for s, e, n in zip(spec.strides, expect, spec.shape))


# Layouts the boundary describes: dense (strided) and torch's sparse formats, named
# as torch names them (``torch.sparse_csr``).
LAYOUT_NAMES = ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
                "sparse_bsc")


@lru_cache(maxsize=None)
def _layout_names() -> dict["torch.layout", str]:
    import torch
    return {getattr(torch, n): n for n in LAYOUT_NAMES}


# row-major and channels-last (NHWC) orders, fastest-varying dimension first
_CHANNELS_LAST = (1, 3, 2, 0)


@dataclass(frozen=True)
class TorchTensor:
    """dtype, shape, strides and quantization parameters of one tensor.

    A dimension only known at run time (an op whose output shape depends on
    the data, like ``nonzero``) is ``None`` in ``shape``, and the strides are
    then all ``None``: such a tensor never crosses into compiled code (the host
    runs its region, ``aot.partition.aten_region``), and checks accept any size there.

    A dimension or stride that follows a *symbol* of a dynamic artifact
    (``dynamic_shapes``) is an expression over symbols, as text (``"s0"``,
    ``"768*s1"``; ``aot.symbolic``): compiled code sees it as a dynamic dimension,
    and :meth:`bind` gives the static spec of one call once the symbols are bound.

    Made by the importer (model inputs/outputs) and the partitioner (kernel-call
    operands/results); read by the runtime (input checks, output layout) and the
    fallback executor. Frozen: a spec read in one stage never changes under you.
    """

    dtype: str
    shape: tuple[int | str | None, ...]
    strides: tuple[int | str | None, ...]
    qparams: QuantParams | None = None
    layout: str = "strided"

    def __post_init__(self):
        assert self.dtype in _DTYPE_SET, self.dtype
        assert len(self.shape) == len(self.strides), (self.shape, self.strides)
        assert self.layout in LAYOUT_NAMES, self.layout

    @staticmethod
    def from_tensor(t: "torch.Tensor") -> "TorchTensor":
        """Describe a real or fake tensor (a data-dependent dimension becomes ``None``).

        A sparse tensor (``layout`` other than ``"strided"``) has no strides: they
        are all ``None``, and only the host (ATen) ever holds it.
        """
        shape = tuple(_dim(s) for s in t.shape)
        layout = _layout_names().get(t.layout)
        if layout is None:
            raise InputMismatch(f"tensor layout {t.layout} is not supported at the boundary; "
                                f"supported: {sorted(LAYOUT_NAMES)}")
        strides = (tuple(_dim(s) for s in t.stride()) if layout == "strided"
                   else (None,) * len(shape))
        if None in shape or None in strides:
            strides = (None,) * len(shape)
        qp = QuantParams.from_tensor(t) if t.is_quantized and t.device.type != "meta" else None
        return TorchTensor(dtype_name(t.dtype), shape, strides, qp, layout)

    @property
    def is_sparse(self) -> bool:
        """A sparse layout (COO, CSR, CSC, BSR, BSC): ATen holds it, never compiled code."""
        return self.layout != "strided"

    @cached_property
    def torch_dtype(self) -> "torch.dtype":
        return dtype_from_name(self.dtype)

    @property
    def numel(self) -> int | None:
        """Elements; None where a size is symbolic or depends on the data."""
        if self.is_dynamic or self.is_symbolic:
            return None
        return math.prod(self.shape)

    @property
    def is_dynamic(self) -> bool:
        """Some dimension is only known at run time (depends on the data)."""
        return None in self.shape

    @cached_property
    def is_symbolic(self) -> bool:
        """Some dimension or stride follows a symbol of a dynamic artifact."""
        return any(isinstance(d, str) for d in self.shape + self.strides)

    def bind(self, env: dict[str, int]) -> "TorchTensor":
        """The static spec of one call: every symbolic size evaluated with ``env``."""
        if not self.is_symbolic:
            return self
        def value(d):  # a size whose symbols no input bound stays an expression
            return d if d is None or not free_symbols(d) <= env.keys() else evaluate(d, env)
        return TorchTensor(self.dtype, tuple(value(d) for d in self.shape),
                           tuple(value(d) for d in self.strides), self.qparams, self.layout)

    @cached_property
    def is_contiguous(self) -> bool:
        """Row-major dense (size-1 dims may have any stride, as in torch)."""
        if self.is_sparse:
            return False
        if self.is_dynamic:
            return True  # whatever layout ATen gives it
        if self.is_symbolic:
            return _symbolic_layout(self, _contiguous_strides(self.shape))
        expect = _contiguous_strides(self.shape)
        return all(s == e or n <= 1 for s, e, n in zip(self.strides, expect, self.shape))

    @cached_property
    def memory_format(self) -> str:
        if self.is_sparse:
            return self.layout
        if self.is_contiguous:
            return "contiguous"
        if len(self.shape) == 4:
            expect = _strides_in_order(self.shape, _CHANNELS_LAST)
            if self.is_symbolic and _symbolic_layout(self, expect) or not self.is_symbolic \
                    and all(s == e or n <= 1 for s, e, n in zip(self.strides, expect, self.shape)):
                return "channels_last"
        return "strided"

    @property
    def storage_dtype(self) -> str:
        """What compiled code holds: ``uint8`` for ``quint8`` and so on; else the dtype."""
        return _STORAGE.get(self.dtype, self.dtype)

    def to_storage(self, t: "torch.Tensor", name: str = "tensor") -> "torch.Tensor":
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

    def from_storage(self, t: "torch.Tensor") -> "torch.Tensor":
        """Integer buffer -> the quantized tensor ATen expects (no copy of the data)."""
        q = self.qparams
        if q is None:
            return t
        import torch
        if q.scheme == "per_tensor_affine":
            return torch._make_per_tensor_quantized_tensor(t, q.scale, q.zero_point)
        scales = torch.tensor(q.scale, dtype=torch.float64, device=t.device)
        zps = torch.tensor(q.zero_point, dtype=torch.int64, device=t.device)
        return torch._make_per_channel_quantized_tensor(t, scales, zps, q.axis)

    def dense(self) -> "TorchTensor":
        """The same tensor laid out row-major, as compiled code holds it."""
        if self.is_dynamic or self.is_sparse:
            return self
        return TorchTensor(self.dtype, self.shape, _contiguous_strides(self.shape), self.qparams)

    def check(self, t: Any, name: str, strict_layout: bool = True) -> None:
        """Raise :class:`InputMismatch` naming the field if ``t`` does not match.

        Strides are checked by memory format when ``strict_layout``: a
        channels-last input where a contiguous one was compiled for (or the
        reverse) is then an error, not a copy. Without it, any strided tensor of
        the right shape and dtype passes (the caller converts it).
        """
        import torch
        if (isinstance(t, torch.Tensor) and t.layout == torch.strided
                and t.dtype == self.torch_dtype and self.qparams is None
                and t.shape == self.shape and t.stride() == self.strides):
            return  # exactly as compiled (the common case, checked in a few attribute reads)
        if not isinstance(t, torch.Tensor):
            raise InputMismatch(f"{name}: expected a torch.Tensor {self.short()}, "
                                f"got {type(t).__name__}")
        got_layout = _layout_names().get(t.layout, str(t.layout))
        if got_layout != self.layout:
            raise InputMismatch(f"{name}: layout mismatch: expected {self.layout}, "
                                f"got {got_layout}")
        self._check_seen(list(t.shape), str(t.dtype).replace("torch.", ""),
                         lambda: TorchTensor.from_tensor(t), name, strict_layout)

    def check_array(self, a: Any, name: str, strict_layout: bool = True) -> None:
        """:meth:`check` for a numpy array (the torch-free runtime): the same checks
        and messages; strides are counted in elements, as torch counts them."""
        import numpy as np
        if not isinstance(a, np.ndarray):
            raise InputMismatch(f"{name}: expected a numpy.ndarray {self.short()}, "
                                f"got {type(a).__name__}")
        def seen():
            return TorchTensor(self.dtype, tuple(a.shape),
                               tuple(st // max(a.itemsize, 1) for st in a.strides))
        self._check_seen(list(a.shape), "bool" if a.dtype == np.bool_ else str(a.dtype),
                         seen, name, strict_layout)

    def _check_seen(self, shape: list, dtype: str, described, name: str,
                    strict_layout: bool) -> None:
        """Shape, dtype, then (``described()``: the value as a TorchTensor) memory format
        and quantization parameters; the first difference is an InputMismatch."""
        # a None dimension (known only at run time) takes any size
        if len(shape) != len(self.shape) or any(
                d is not None and d != g for d, g in zip(self.shape, shape)):
            raise InputMismatch(f"{name}: shape mismatch: expected {self._dims()}, "
                                f"got {shape}")
        if dtype != self.dtype:
            raise InputMismatch(f"{name}: dtype mismatch: expected {self.dtype}, got {dtype}")
        if self.is_sparse or self.is_dynamic:
            return  # no strides to compare: only the host holds such tensors
        got = described()
        if strict_layout and got.memory_format != self.memory_format:
            raise InputMismatch(f"{name}: memory format mismatch: expected {self.memory_format} "
                                f"(strides {list(self.strides)}), got {got.memory_format} "
                                f"(strides {list(got.strides)}); strict_layout=False "
                                "converts it instead")
        if got.qparams != self.qparams:
            raise InputMismatch(f"{name}: quantization parameters mismatch: expected "
                                f"{self.qparams}, got {got.qparams}")

    def _dims(self) -> str:
        return "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"

    def short(self) -> str:
        if self.is_sparse:
            return f"{self.dtype}{self._dims()}, {self.layout}"
        q = f", {self.qparams.scheme}" if self.qparams else ""
        mf = "" if self.memory_format == "contiguous" else f", {self.memory_format}"
        return f"{self.dtype}{self._dims()}{mf}{q}"

    def to_json(self) -> dict[str, Any]:
        d = {"dtype": self.dtype, "shape": list(self.shape), "strides": list(self.strides),
             "qparams": self.qparams.to_json() if self.qparams else None}
        if self.is_sparse:
            d["layout"] = self.layout
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> "TorchTensor":
        qp = d.get("qparams")
        return TorchTensor(d["dtype"], tuple(d["shape"]), tuple(d["strides"]),
                           QuantParams.from_json(qp) if qp else None,
                           d.get("layout", "strided"))


def _dim(s) -> int | str | None:
    """A size or stride: an int, an expression over the program's symbols (a size that
    follows a ``dynamic_shapes`` dimension), or None when it depends on the data."""
    if isinstance(s, int):
        return s
    expr = s.node.expr
    if expr.is_number:
        return int(expr)
    if not all(is_input_symbol(str(f)) for f in expr.free_symbols):
        return None  # not only input sizes (``s0``): data-dependent (``u0``)
    return str(expr)
