"""The non-tensor operand contract: how static values are written and read.

Every non-tensor operand of a kernel call is recorded at compile time as JSON,
tagged where JSON alone would be ambiguous:

=================  ===========================================
Python value       JSON
=================  ===========================================
int, bool, str     itself
float              itself; ``{"float": "inf"|"-inf"|"nan"}``
complex            ``{"complex": [real, imag]}`` (each a float as above)
None               ``null``
list / tuple       ``{"list": [...]}`` / ``{"tuple": [...]}``
torch.dtype        ``{"dtype": "float32"}``
torch.device       ``{"device": "cpu"}`` (re-targeted at load)
torch.memory_format ``{"memory_format": "channels_last"}``
torch.layout       ``{"layout": "strided"}``
a symbolic size    ``{"size": "s0"}``, ``{"size": "4*s1"}`` (a dynamic artifact only)
=================  ===========================================

A *symbolic size* is an int that follows a ``dynamic_shapes`` dimension (a ``view``
or ``expand`` size, a slice bound, an ``arange`` length): it is recorded as the
expression over the program's symbols (``aot.symbolic``), never as the example's
value, and decodes to a :class:`SymSize` that the kernel call evaluates on every
call with the symbols bound from that call's model inputs.

Anything else (a Python object, a tensor subclass, a callable) cannot be
represented; :func:`encode` raises ``TypeError`` and the partitioner turns that
into ``UnsupportedOp`` naming the op and the source line.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["encode", "decode", "SymSize", "has_sym_size", "resolve_sizes"]


class SymSize:
    """A recorded symbolic size: evaluated per call (``resolve_sizes``)."""

    __slots__ = ("expr",)

    def __init__(self, expr: str):
        self.expr = expr

    def __eq__(self, other):
        return isinstance(other, SymSize) and other.expr == self.expr

    def __hash__(self):
        return hash(self.expr)

    def __repr__(self):
        return f"SymSize({self.expr!r})"


def has_sym_size(value: Any) -> bool:
    if isinstance(value, SymSize):
        return True
    return isinstance(value, (list, tuple)) and any(has_sym_size(v) for v in value)


def resolve_sizes(value: Any, env: dict) -> Any:
    """``value`` with every :class:`SymSize` evaluated against ``env`` (symbol -> int)."""
    if isinstance(value, SymSize):
        from ..symbolic import evaluate
        return evaluate(value.expr, env)
    if isinstance(value, list):
        return [resolve_sizes(v, env) for v in value]
    if isinstance(value, tuple):
        return tuple(resolve_sizes(v, env) for v in value)
    return value

_MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d, "preserve_format": torch.preserve_format,
}
_LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo}


def _name_of(table: dict[str, Any], value: Any) -> str:
    for k, v in table.items():
        if v == value:
            return k
    raise TypeError(f"unsupported value {value!r}")


def encode(value: Any) -> Any:
    """Encode one static value; raises TypeError for what cannot be represented."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, SymSize):
        return {"size": value.expr}
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, complex):
        return {"complex": [encode(value.real), encode(value.imag)]}
    if isinstance(value, (list, tuple)):
        # FX hands us immutable_list/immutable_dict subclasses: tag by base type.
        return {"tuple" if isinstance(value, tuple) else "list": [encode(v) for v in value]}
    if isinstance(value, torch.dtype):
        from ..torch_tensor import dtype_name
        return {"dtype": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.memory_format):
        return {"memory_format": _name_of(_MEMORY_FORMATS, value)}
    if isinstance(value, torch.layout):
        return {"layout": _name_of(_LAYOUTS, value)}
    raise TypeError(f"cannot record a static value of type {type(value).__name__}: {value!r}")


def decode(data: Any, *, device: torch.device | None = None) -> Any:
    """Inverse of :func:`encode`; ``device`` re-targets recorded devices."""
    if not isinstance(data, dict):
        return data
    (tag, v), = data.items()
    if tag == "list":
        return [decode(x, device=device) for x in v]
    if tag == "tuple":
        return tuple(decode(x, device=device) for x in v)
    if tag == "float":
        return float(v)
    if tag == "complex":
        return complex(decode(v[0]), decode(v[1]))
    if tag == "dtype":
        from ..torch_tensor import dtype_from_name
        return dtype_from_name(v)
    if tag == "device":
        return device if device is not None else torch.device(v)
    if tag == "memory_format":
        return _MEMORY_FORMATS[v]
    if tag == "layout":
        return _LAYOUTS[v]
    if tag == "size":
        return SymSize(v)
    raise ValueError(f"unknown static value tag {tag!r}")
