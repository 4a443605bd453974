"""A group's members as one generated, straight-line Python function.

The executor's interpretive loop pays per member for the loop, a kind test,
``BoundCall.bind`` copying the recorded arguments and filling in the tensors,
and a result-arity test. For an ATen region of small ops (BERT's views, adds
and layer norms take a few microseconds each) that overhead is a visible
share. Like ``torch.fx``'s code generation, this writes the members out once,
at the group's first call:

    def group_7(env):
        env.append(f0(env[1], c0_1, c0_2))        # member 0: a plain call
        env.extend(f1(env[12], c1_1))             # member 1: several results
        env.append(f2(env))                       # member 2: a prepacked kernel
        env.append(None)                          # member 3: absorbed by a fusion
        env[12] = None                            # slot 12 read for the last time
        return [env[14]]

``env`` holds the value slots exactly as the interpretive loop does (group
inputs, then each member's results in turn). Recorded non-tensor operands are
the decoded values ``BoundCall`` holds, bound as globals (the source holds only
names this module makes, slot numbers and int/bool/None literals: nothing read from
a manifest is ever source; keyword names are checked to be identifiers); tensor operands of a
member with quantized operands go through ``adapt`` (quantized tensor or its
integer storage, as the member expects). An exception names its member: the
failing line of the generated code is the member's index.

A slot is dropped (set to None) right after its last reader, as eager drops an
intermediate when its last use returns: the group's peak memory is what is live,
not every intermediate of the call. Holding them all would make each call of a
large region allocate fresh memory and fault its pages in, slower than eager
wherever glibc returns the freed heap between calls (``aot.fallback.heap``).
Readers are the tensor operands of plain calls and the ``reads`` of
steps; a fusion's absorbed members read nothing (their step reads for them). A
group with a step of unknown reads keeps every slot.
"""

from __future__ import annotations

import itertools
import keyword
import linecache
import types

import torch

from ..errors import ArtifactError
from . import static_values
from .bound import _LIST, _SCALAR, _SIZES, _TENSOR, BoundCall

__all__ = ["GroupFunction", "Member"]
_serial = itertools.count()


class Member:
    """One member as the generated code calls it.

    ``call``: the callable for a plain call (bound from ``bound``'s recorded
    operands), or None with ``step`` set: a callable ``step(env) -> result``
    (prepacked kernels, NHWC convolutions), or ``None`` for a member a fusion
    absorbed. ``adapt``: wrap each tensor operand in ``adapt(value, spec)``.
    """

    def __init__(self, bound: BoundCall, call=None, step=None, absorbed: bool = False,
                 adapt=None, slot_specs: dict | None = None, reads=None):
        self.bound, self.call, self.step, self.absorbed = bound, call, step, absorbed
        self.adapt, self.slot_specs = adapt, slot_specs or {}
        # the slots it reads: a plain call's tensor operands; a step's ``reads`` (None:
        # unknown); nothing when absorbed
        self.reads = () if absorbed else bound.slots() if call is not None else (
            reads if reads is not None else getattr(step, "reads", None))


def _several_results(bound: BoundCall) -> bool | None:
    """The op returns a tuple or list (extend), one tensor (append), or unknown (None)."""
    schema = getattr(bound.op, "_schema", None)
    if schema is None:
        return None
    rets = schema.returns
    if len(rets) != 1:
        return len(rets) > 1
    return isinstance(rets[0].type, torch._C.ListType)


def _last_reads(members: list[Member], output_slots) -> dict[int, list[int]]:
    """Member index -> the slots it reads for the last time (none of them an output);
    ``{}`` when a member's reads are unknown."""
    last: dict[int, int] = {}
    for i, m in enumerate(members):
        if m.reads is None:
            return {}
        for s in m.reads:
            last[s] = i
    keep = set(output_slots)
    dead: dict[int, list[int]] = {}
    for s, i in sorted(last.items()):
        if s not in keep:
            dead.setdefault(i, []).append(s)
    return dead


def _slot(s) -> int:
    """A value slot as the source writes it: an int, nothing else."""
    if s.__class__ is not int:
        raise ArtifactError(f"a kernel call group names slot {str(s)[:40]!r}, not an index",
                            stage="load")
    return s


class GroupFunction:
    """``f(env) -> outputs``: the members of a group, in order, as one Python function."""

    def __init__(self, members: list[Member], output_slots):
        name = f"group_{next(_serial)}"  # a name made here: no manifest text is source
        self.names: dict[str, object] = {"_SEQ": (tuple, list)}
        lines = [f"def {name}(env):"]
        dead = _last_reads(members, output_slots)
        for i, m in enumerate(members):
            stmt = self._statement(i, m)
            if dead.get(i):  # same line: a failing line still names its member
                stmt += "; " + "; ".join(f"env[{_slot(s)}] = None" for s in dead[i])
            lines.append("    " + stmt)
        lines.append("    return [" + ", ".join(f"env[{_slot(s)}]" for s in output_slots) + "]")
        self.source = "\n".join(lines) + "\n"
        self.filename = f"<aot group {name}>"
        # source registered so tracebacks through the generated code show it
        linecache.cache[self.filename] = (len(self.source), None, self.source.splitlines(True),
                                          self.filename)
        code = compile(self.source, self.filename, "exec")
        scope: dict = {}
        exec(code, self.names, scope)
        self.fn: types.FunctionType = scope[name]

    def _statement(self, i: int, m: Member) -> str:
        if m.absorbed:
            return "env.append(None)"
        if m.call is None:
            self.names[f"s{i}"] = m.step
            return f"o = s{i}(env); env.extend(o) if o.__class__ in _SEQ else env.append(o)"
        b = m.bound
        if any(kind == _SCALAR for _, kind, _ in b.fills):
            raise ValueError("a group member has run-time scalar operands")
        if m.adapt is not None:
            self.names["adapt"] = m.adapt
        args = [self._const(i, j, v) for j, v in enumerate(b.args)]
        for k in b.kwargs:  # keyword names become source: identifiers only
            if not (isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k)):
                raise ArtifactError(f"a kernel call's keyword operand {str(k)[:40]!r} is not "
                                    "an identifier", stage="load")
        kwargs = {k: self._const(i, k, v) for k, v in b.kwargs.items()}
        for where, kind, p in b.fills:
            if kind == _TENSOR:
                expr = self._tensor(i, m, p)
            elif kind == _SIZES:  # symbolic sizes: evaluated with this call's binding
                self.names.setdefault("_sizes", static_values.resolve_sizes)
                self.names["_symbols"] = b.symbols
                expr = f"_sizes({self._const(i, where, p)}, _symbols.env)"
            else:
                assert kind == _LIST
                expr = "[" + ", ".join("None" if s is None else self._tensor(i, m, s)
                                       for s in p) + "]"
            if isinstance(where, int):
                args[where] = expr
            else:
                kwargs[where] = expr
        self.names[f"f{i}"] = m.call
        call = f"f{i}(" + ", ".join(args + [f"{k}={v}" for k, v in kwargs.items()]) + ")"
        several = _several_results(b)
        if several is None:
            return f"o = {call}; env.extend(o) if o.__class__ in _SEQ else env.append(o)"
        return f"env.extend({call})" if several else f"env.append({call})"

    def _const(self, i: int, j, value) -> str:
        if value is None or isinstance(value, bool) or (type(value) is int):
            return repr(value)
        name = f"c{i}_{len(self.names)}"  # generated: ``j`` may be a keyword's name
        self.names[name] = value
        return name

    def _tensor(self, i: int, m: Member, slot: int) -> str:
        if m.adapt is None:
            return f"env[{_slot(slot)}]"
        name = f"q{i}_{_slot(slot)}"
        self.names[name] = m.slot_specs.get(slot)
        return f"adapt(env[{slot}], {name})"

    def __call__(self, env: list) -> list:
        return self.fn(env)

    def failing_member(self, tb) -> int | None:
        """The member index whose line raised, from an exception's traceback."""
        line = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == self.filename:
                line = tb.tb_lineno
            tb = tb.tb_next
        return None if line is None else line - 2
