"""HostProgram: a whole program run by the host in ATen, node by node.

Some programs cannot be held by compiled code at all: a value whose shape
depends on the data (``nonzero``, ``masked_select``, ``unique``), a dtype IREE
has no type for (``complex128``, ``float8``, ``uint16``...), an int/float/bool
result only known at run time (``x.sum().item() > 0``), a buffer the model
updates in place, control flow (``torch.cond``, ``torch.while_loop``), or a program
IREE fails on whichever way it is split. Such a
program is *one ATen region*: the compiler records its functional graph
(``aot.partition.aten_region``) and this module runs it, the same ``torch.ops``
overloads eager runs, on the same values, so results are eager's bit for bit.

The manifest's ``host_program`` entry (JSON, no pickle)::

    {"reason": "...",                      # why the program runs here (the report says it)
     "inputs": [{"node": "x", "user": 0},  # flat user input leaf 0
                {"node": "p", "constant": "c0", "strides": [...]},  # a weight, eager's layout
                {"node": "b", "state": "c1", "buffer": "n", "strides": [...]}],
                                                   # a buffer the model updates
     "nodes": [{"name": "add", "target": "aten::add.Tensor", "args": [...],
                "kwargs": {...}, "location": "model.py:12"}, ...],
     "outputs": [...],                     # every output leaf: mutations, then the user's
     "graphs": {"g0": {"inputs": [{"node": "x", "user": 0}], "nodes": [...],
                       "outputs": [...]}}}    # branches and loop bodies (optional)

Operands follow the non-tensor operand contract (``static_values``), with two
more tags: ``{"node": name}`` (the value an earlier node computed) and
``{"constant": name}`` (a tensor literal, stored as a host-held constant).
Targets are ``ns::op.overload`` for ATen/library ops, or ``py:<name>`` for the
few Python functions export emits on run-time scalars (``operator.add``,
``torch.sym_max``...): only those in ``aot.op_table.PY_NAMES`` can be named, each
behind its guard. Every name is checked there at load, before anything runs.

Control flow: ``hop:cond`` (operands: the predicate, ``{"graph": true}``, ``{"graph":
false}``, the branch operands) runs one of two sub-programs; ``hop:while_loop``
(``{"graph": cond}``, ``{"graph": body}``, the carried values, the additional ones) runs
its body while its condition holds, as ``torch.cond`` / ``torch.while_loop`` do in eager.
A sub-program is a program of ``graphs`` (its inputs are its operands, in order), checked
and loaded with the rest.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ArtifactError, KernelCallFailed
from . import static_values
from ..op_table import check_kwargs, check_py_args, py_function, py_name, py_problem
from .spec import resolve_op

__all__ = ["HostProgram", "py_function_name"]


def py_function_name(fn) -> str | None:
    """The ``py:`` name of a Python function the host program may call, or None."""
    return py_name(fn)


class _Ref:
    """A reference to a value slot, in a decoded operand."""

    __slots__ = ("slot",)

    def __init__(self, slot: int):
        self.slot = slot


def _cond(pred, true_fn: "HostProgram", false_fn: "HostProgram", operands) -> list:
    return (true_fn if bool(pred) else false_fn).run(list(operands))


def _while_loop(cond_fn: "HostProgram", body_fn: "HostProgram", carried, additional) -> tuple:
    values, extra = list(carried), list(additional)
    while bool(cond_fn.run(values + extra)[0]):
        values = body_fn.run(values + extra)
    return tuple(values)


_HOPS = {"hop:cond": (_cond, 4), "hop:while_loop": (_while_loop, 4)}


def _target(name: str, args) -> Any:
    """The callable a node names: a guarded ``py:`` function, or an OpOverload
    (``aot.op_table``). ``args``: its operands, decoded; a ``py:`` node whose operands are
    all recorded values is checked against its guard here, at load."""
    if name in _HOPS:
        fn, n_args = _HOPS[name]
        graphs = [a for a in args if a.__class__ is HostProgram]
        if len(args) != n_args or len(graphs) != 2 or args.index(graphs[0]) != (
                1 if name == "hop:cond" else 0):
            raise ArtifactError(f"host program: {name} takes {n_args} operands, two of them "
                                "graphs", op=name, stage="load")
        return fn
    if name.startswith("py:"):
        why = py_problem(name[3:])
        if why is None and not any(_has_ref(a) for a in args):
            why = check_py_args(name[3:], tuple(args), {})
        if why is not None:
            raise ArtifactError(f"host program: {why}", op=name, stage="load")
        return py_function(name[3:])
    op, _, overload = name.rpartition(".")
    try:
        return resolve_op(op, overload)
    except LookupError as e:
        raise ArtifactError(f"host program: {e}", op=name, stage="load") from None


def _has_ref(a) -> bool:
    return a.__class__ is _Ref or (a.__class__ in (list, tuple) and any(map(_has_ref, a)))


class HostProgram:
    """The ``host_program`` entry of a manifest, ready to run on ``device``.

    Args:
        data: the manifest entry (see the module docstring).
        constants: the artifact's host-held constants, on ``device``.
        device: where the program runs (recorded devices are re-targeted to it).
    Raises:
        ArtifactError: an unknown op or constant, or a malformed entry.
    """

    def __init__(self, data: dict, constants: dict[str, torch.Tensor], device: torch.device,
                 graphs: dict | None = None, _loading: frozenset = frozenset()):
        self.reason = data.get("reason", "")
        graphs = data.get("graphs") or {} if graphs is None else graphs
        programs: dict[str, HostProgram] = {}
        self.device = device
        slots: dict[str, int] = {}
        self.n_slots = 0

        def slot(name: str) -> int:
            if name not in slots:
                slots[name] = self.n_slots
                self.n_slots += 1
            return slots[name]

        def const(name: str) -> torch.Tensor:
            if name not in constants:
                raise ArtifactError(f"host program: constant {name!r} is missing from the "
                                    "artifact")
            return constants[name]

        def operand(a):
            if isinstance(a, dict) and "node" in a:
                if a["node"] not in slots:
                    raise ArtifactError(f"host program reads {a['node']!r} before it is made")
                return _Ref(slots[a["node"]])
            if isinstance(a, dict) and "constant" in a:
                return const(a["constant"])
            if isinstance(a, dict) and len(a) == 1 and "graph" in a:
                name = a["graph"]
                if name not in graphs or name in _loading:
                    raise ArtifactError(f"host program: graph {name!r} is missing or contains "
                                        "itself", stage="load")
                if name not in programs:
                    programs[name] = HostProgram(graphs[name], constants, device, graphs,
                                                 _loading | {name})
                return programs[name]
            if isinstance(a, dict) and len(a) == 1 and next(iter(a)) in ("list", "tuple"):
                (tag, v), = a.items()
                items = [operand(x) for x in v]
                return tuple(items) if tag == "tuple" else items
            try:
                return static_values.decode(a, device=device)
            except (ValueError, KeyError, TypeError) as e:
                raise ArtifactError(f"host program: bad operand {a!r}: {e}") from None

        self.user_slots: list[tuple[int, int]] = []   # (slot, flat input leaf)
        self.fixed: list[tuple[int, torch.Tensor]] = []
        self.state: dict[str, torch.Tensor] = {}       # buffers the program updates, by name
        self.state_slots: list[tuple[int, str]] = []

        def laid_out(t: torch.Tensor, strides) -> torch.Tensor:
            """The constant with eager's strides (stored dense)."""
            if strides is None or tuple(strides) == t.stride():
                return t
            return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)

        for i in data["inputs"]:
            s = slot(i["node"])
            if "user" in i:
                self.user_slots.append((s, int(i["user"])))
            elif "constant" in i:
                self.fixed.append((s, laid_out(const(i["constant"]), i.get("strides"))))
            else:  # a buffer: this module's own copy, updated after every call
                self.state[i["buffer"]] = laid_out(const(i["state"]).clone(), i.get("strides"))
                self.state_slots.append((s, i["buffer"]))
        self.steps = []
        for n in data["nodes"]:
            args = tuple(operand(a) for a in n["args"])
            kwargs = {k: operand(v) for k, v in n["kwargs"].items()}
            fn = _target(n["target"], args)
            if kwargs and n["target"].startswith("py:"):
                raise ArtifactError("host program: a py: function takes no keyword operands",
                                    op=n["target"], stage="load")
            if kwargs:
                why = check_kwargs(fn, kwargs)
                if why is not None:
                    raise ArtifactError(f"host program: {why}", op=n["target"], stage="load")
            self.steps.append((slot(n["name"]), fn, args, kwargs, n["target"], n.get("location")))
        self.outputs = [operand(o) for o in data["outputs"]]
        self.buffer_updates = [(k, m["buffer"]) for k, m in enumerate(data.get("mutations", []))
                               if "buffer" in m]

    def run(self, flat: list) -> list:
        """Every output leaf (mutations first, then the user's) for the flat inputs."""
        env: list = [None] * self.n_slots
        for s, k in self.user_slots:
            env[s] = flat[k]
        for s, t in self.fixed:
            env[s] = t
        for s, name in self.state_slots:
            env[s] = self.state[name]

        def value(a):
            if a.__class__ is _Ref:
                return env[a.slot]
            if a.__class__ in (list, tuple):
                return a.__class__(value(x) for x in a)
            return a
        for s, fn, args, kwargs, name, loc in self.steps:
            try:
                env[s] = fn(*[value(a) for a in args], **{k: value(v) for k, v in kwargs.items()})
            except Exception as e:
                raise KernelCallFailed(f"ATen raised {type(e).__name__}: {e}", op=name,
                                       location=loc) from e
        outs = [value(o) for o in self.outputs]
        for k, name in self.buffer_updates:  # what the model wrote into its buffers
            self.state[name] = outs[k]
        return outs
