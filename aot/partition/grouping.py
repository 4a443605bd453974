"""grouping: which neighbouring kernel calls run as one crossing.

A maximal run of groupable kernel calls in graph order becomes one group: it is
broken where an op reads a value compiled code makes after the run began, or
where more than 60 values would cross in or out. Ops with run-time scalar
operands or results stay alone. ``kernel_calls`` emits each group as one host
function whose members run in order.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx

from ..importer.dynamic import symbolic_sizes
from .decisions import op_nodes
from .placement import COMPILED, KERNEL_CALL

__all__ = ["Grouping", "n_results", "scalar_kind", "source", "used_outside"]
# values crossing into one group (its placeholder op's operands), kept under
# torch's 64-argument schema limit; the values crossing back are bounded alike
_MAX_GROUP_INPUTS = 60
_MAX_GROUP_OUTPUTS = 60


@dataclass
class Grouping:
    """Neighbouring kernel calls run as one crossing.

    ``group_of`` maps each member to its group (members in graph order);
    ``values`` maps a member, once its group is emitted, to a list with one
    new-graph value per result (None for results nobody outside uses).
    """

    group_of: dict
    values: dict
    skip: frozenset = frozenset()  # size nodes kernel calls record (``decisions``)

    @staticmethod
    def find(ep, decided, skip: frozenset = frozenset()) -> "Grouping":
        """Maximal runs of groupable kernel calls in graph order.

        A kernel call joins the open group unless it reads a value produced by
        a node that is not in the group and comes after the group's first member
        (the group runs at its first member's position, so its inputs must exist
        by then). Ops with run-time scalar operands or results stay alone.
        """
        sig = ep.graph_signature
        held = {*sig.inputs_to_parameters, *sig.inputs_to_buffers,
                *sig.inputs_to_lifted_tensor_constants}  # host-held: do not cross
        groups, cur, after, width = [], [], set(), _Width(held, skip)
        for n in op_nodes(ep):
            if n in skip:
                continue
            if decided.get(n, (COMPILED,))[0] == KERNEL_CALL and _groupable(n):
                deps = {source(a) for a in n.all_input_nodes if a not in skip}
                if cur and not deps & after and width.admits(n):
                    cur.append(n)
                    width.add(n)
                    continue
                if len(cur) > 1:
                    groups.append(cur)
                cur, after, width = [n], set(), _Width(held, skip)
                width.add(n)
            elif cur:
                after.add(n)
        if len(cur) > 1:
            groups.append(cur)
        return Grouping({m: tuple(grp) for grp in groups for m in grp}, {}, skip)


class _Width:
    """The values crossing into and out of an open group, kept exactly as members join.

    In: distinct values read from outside the group, host-held constants not
    counted. Out: member results read by a node outside the group (a later
    member reading a result takes it off the count).
    """

    def __init__(self, held: set, skip: frozenset = frozenset()):
        self.held, self.members, self.skip = held, set(), skip
        self.ins: set = set()
        self.outs: set = set()  # (member, result index)

    def _step(self, n: torch.fx.Node) -> tuple[set, set]:
        members = self.members
        members.add(n)  # tentatively (sets of at most 60 are copied, the members never)
        try:
            ins = self.ins | {a for a in n.all_input_nodes if source(a) not in members
                              and a.name not in self.held and a not in self.skip}
            outs = set(self.outs)
            for a in n.all_input_nodes:
                src = source(a)
                if src is not n and src in members:
                    r = a.args[1] if a is not src else 0
                    if (src, r) in outs and not used_outside(src, r, members | self.skip):
                        outs.discard((src, r))
            outs |= {(n, r) for r in range(n_results(n))
                     if used_outside(n, r, members | self.skip)}
        finally:
            members.discard(n)
        return ins, outs

    def admits(self, n: torch.fx.Node) -> bool:
        ins, outs = self._step(n)
        return len(ins) <= _MAX_GROUP_INPUTS and len(outs) <= _MAX_GROUP_OUTPUTS

    def add(self, n: torch.fx.Node) -> None:
        self.ins, self.outs = self._step(n)
        self.members.add(n)


def source(a: torch.fx.Node) -> torch.fx.Node:
    return a.args[0] if a.op == "call_function" and a.target is operator.getitem else a


def n_results(n: torch.fx.Node) -> int:
    v = n.meta.get("val")
    return len(v) if isinstance(v, (list, tuple)) else 1


def _groupable(n: torch.fx.Node) -> bool:
    if not isinstance(n.target, torch._ops.OpOverload):
        return False
    v = n.meta.get("val")
    vals = list(v) if isinstance(v, (list, tuple)) else [v]
    if not vals or not all(isinstance(x, torch.Tensor) for x in vals):
        return False
    flat = torch.fx.node.map_aggregate((n.args, n.kwargs), lambda a: a)
    nodes = []
    torch.fx.node.map_arg(flat, nodes.append)
    # a size that follows a symbol is recorded, not read (``symbolic_sizes``)
    return not any(scalar_kind(a) and symbolic_sizes(a) is None for a in nodes)


def scalar_kind(a) -> str | None:
    """``i``/``f``/``b`` for an FX node holding a run-time scalar, else None."""
    if not isinstance(a, torch.fx.Node):
        return None
    v = a.meta.get("val")
    if isinstance(v, (torch.SymBool, bool)):
        return "b"
    if isinstance(v, (torch.SymInt, int)):
        return "i"
    if isinstance(v, (torch.SymFloat, float)):
        return "f"
    return None


def used_outside(n: torch.fx.Node, r: int, members: set) -> bool:
    if n_results(n) == 1 and not any(u.target is operator.getitem for u in n.users):
        return any(u not in members for u in n.users)
    return any(u.target is operator.getitem and u.args[1] == r
               and any(w not in members for w in u.users) for u in n.users)
