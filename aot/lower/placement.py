"""Placement: decide, per op, whether it runs compiled or as an ATen kernel call.

Policies are just different placement tables (decide, then act: outlining is a
later step). ``fallback`` is one of ``"auto"`` (uncovered ops fall back),
``"all"`` (every op is a kernel call: the round-trip mode), ``"none"`` (refuse
to fall back); ``fallback_ops`` forces the named ops to ATen in any policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UnsupportedOp

__all__ = ["POLICIES", "Placement", "PlacementPolicy", "op_name", "matches_forced"]

POLICIES = ("auto", "all", "none")
COMPILED, KERNEL_CALL = "compiled", "kernel_call"


@dataclass(frozen=True)
class PlacementPolicy:
    """What the user asked for; validated at construction."""

    fallback: str = "auto"
    fallback_ops: tuple[str, ...] = ()

    def __post_init__(self):
        if self.fallback not in POLICIES:
            raise UnsupportedOp(f"fallback={self.fallback!r} is not a policy; choose one of "
                                f"{', '.join(POLICIES)}", stage="options")
        for name in self.fallback_ops:
            if not isinstance(name, str) or "." not in name:
                raise UnsupportedOp(f"fallback_ops entry {name!r} should name an op like "
                                    "'aten.layer_norm' or 'aten.add.Tensor'", stage="options")

    @staticmethod
    def make(fallback: str, fallback_ops) -> "PlacementPolicy":
        names = []
        for o in fallback_ops or ():
            names.append(str(o).replace("::", ".") if not isinstance(o, str) else o.replace("::", "."))
        return PlacementPolicy(fallback, tuple(names))


@dataclass(frozen=True)
class Placement:
    """One op's placement, with the reason and the user's source line."""

    node: str
    op: str
    where: str
    reason: str
    location: str | None
    flops: int | None = None
    key: str | None = None  # the kernel call's host function, when where == kernel_call

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @staticmethod
    def from_json(d: dict) -> "Placement":
        return Placement(**d)


def op_name(target) -> str:
    """``torch.ops.aten.add.Tensor`` -> ``aten.add.Tensor``."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    return str(target)


def matches_forced(target, forced: tuple[str, ...]) -> bool:
    """``aten.layer_norm`` matches every overload; ``aten.add.Tensor`` only that one."""
    full = op_name(target)
    packet = full.rsplit(".", 1)[0]
    return full in forced or packet in forced
