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
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..errors import InputMismatch
from ..symbolic import evaluate
from ..torch_tensor import dtype_from_name, dtype_name

if TYPE_CHECKING:  # torch is imported where a torch value is met: the torch-free
    import torch   # runtime decodes a plain artifact's static values too

__all__ = ["encode", "decode", "check_given", "SymSize", "has_sym_size", "resolve_sizes"]


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
        return evaluate(value.expr, env)
    if isinstance(value, list):
        return [resolve_sizes(v, env) for v in value]
    if isinstance(value, tuple):
        return tuple(resolve_sizes(v, env) for v in value)
    return value


@lru_cache(maxsize=None)
def _tables() -> dict[str, dict[str, Any]]:
    """The torch values recorded by name: memory formats and layouts."""
    import torch
    return {"memory_format": {n: getattr(torch, n) for n in (
                "contiguous_format", "channels_last", "channels_last_3d", "preserve_format")},
            "layout": {n: getattr(torch, n) for n in ("strided", "sparse_coo")}}


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
    import torch
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.memory_format):
        return {"memory_format": _name_of(_tables()["memory_format"], value)}
    if isinstance(value, torch.layout):
        return {"layout": _name_of(_tables()["layout"], value)}
    raise TypeError(f"cannot record a static value of type {type(value).__name__}: {value!r}")


def decode(data: Any, *, device: "torch.device | None" = None) -> Any:
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
        return dtype_from_name(v)
    if tag == "device":
        if device is not None:
            return device
        import torch
        return torch.device(v)
    if tag in ("memory_format", "layout"):
        return _tables()[tag][v]
    if tag == "size":
        return SymSize(v)
    raise ValueError(f"unknown static value tag {tag!r}")


def check_given(value: Any, recorded: Any, name: str) -> None:
    """A model input compiled as a static value (``recorded``, as encoded): the caller
    must give that value. Raises InputMismatch naming the input."""
    expected = decode(recorded)
    if value != expected:
        raise InputMismatch(f"{name}: the model was compiled with the value "
                            f"{expected!r} here, got {value!r}; recompile to change it")
