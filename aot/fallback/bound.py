"""BoundCall: one kernel call with its recorded operands decoded once, at load.

Static operands are decoded from the manifest's JSON once; per call only the
run-time tensors and scalars are dropped into their places (a few list stores).
A static operand holding symbolic sizes (a dynamic artifact's ``view`` sizes) is
evaluated per call against ``symbols.env``, the binding the module made from that
call's inputs on this thread (``HostModule.symbols``, an ``aot.symbolic.Binding``).
"""

from __future__ import annotations

import torch

from ..symbolic import Binding
from . import static_values
from .spec import SCALAR_PY, KernelCallSpec, ScalarArg, StaticArg, TensorArg, TensorListArg

__all__ = ["BoundCall"]

_TENSOR, _LIST, _SCALAR, _SIZES = 0, 1, 2, 3


class BoundCall:
    """``op(*args, **kwargs)`` for one spec, static operands decoded at construction."""

    def __init__(self, spec: KernelCallSpec, op, device: torch.device,
                 symbols: Binding | None = None):
        self.spec, self.op = spec, op
        self.symbols = symbols if symbols is not None else Binding()
        self.args: list = []
        self.kwargs: dict = {}
        self.fills: list[tuple] = []  # (position or kwarg name, kind, payload)
        for o in spec.operands:
            where = o.name if o.kwarg_only else len(self.args)
            if isinstance(o, StaticArg):
                value = static_values.decode(o.value, device=device)
                if static_values.has_sym_size(value):
                    self.fills.append((where, _SIZES, value))
            else:
                value = None
                if isinstance(o, TensorArg):
                    self.fills.append((where, _TENSOR, o.index))
                elif isinstance(o, TensorListArg):
                    self.fills.append((where, _LIST, o.indices))
                elif isinstance(o, ScalarArg):
                    self.fills.append((where, _SCALAR, (o.index, SCALAR_PY[o.kind])))
            if o.kwarg_only:
                self.kwargs[o.name] = value
            else:
                self.args.append(value)

    def slots(self) -> tuple[int, ...]:
        """The tensor slots ``bind`` reads."""
        out: list[int] = []
        for _, kind, p in self.fills:
            if kind == _TENSOR:
                out.append(p)
            elif kind == _LIST:
                out.extend(i for i in p if i is not None)
        return tuple(out)

    def bind(self, tensors, scalars=()) -> tuple[list, dict]:
        """``(args, kwargs)`` with ``tensors[i]`` / ``scalars[i]`` in their places."""
        args = self.args.copy()
        kwargs = self.kwargs.copy() if self.kwargs else self.kwargs
        for where, kind, p in self.fills:
            if kind == _TENSOR:
                v = tensors[p]
            elif kind == _LIST:
                v = [None if i is None else tensors[i] for i in p]
            elif kind == _SIZES:
                v = static_values.resolve_sizes(p, self.symbols.env)
            else:
                v = p[1](scalars[p[0]])
            if isinstance(where, int):
                args[where] = v
            else:
                kwargs[where] = v
        return args, kwargs
