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
from ..fallback import quantized_ops  # noqa: F401  (registers aot_q, a namespace users may name)

__all__ = ["POLICIES", "Placement", "PlacementPolicy", "op_name", "matches_forced"]

POLICIES = ("auto", "all", "none")
PLACEMENTS = ("auto", "coverage")
COMPILED, KERNEL_CALL = "compiled", "kernel_call"


@dataclass(frozen=True)
class PlacementPolicy:
    """What the user asked for; validated at construction."""

    fallback: str = "auto"
    fallback_ops: tuple[str, ...] = ()
    placement: str = "auto"  # "auto": heavy ops go where they measure faster; "coverage"
    group: bool = True       # neighbouring kernel calls run as one crossing
    plan: dict | None = None  # a previous compile's decisions to reuse (``aot.tuning.regions``)

    def __post_init__(self):
        if self.placement not in PLACEMENTS:
            raise UnsupportedOp(f"placement={self.placement!r} is not a placement; choose one of "
                                f"{', '.join(PLACEMENTS)}", stage="options")
        if self.fallback not in POLICIES:
            raise UnsupportedOp(f"fallback={self.fallback!r} is not a policy; choose one of "
                                f"{', '.join(POLICIES)}", stage="options")
        for name in self.fallback_ops:
            if not isinstance(name, str) or not name or " " in name:
                raise UnsupportedOp(f"fallback_ops entry {name!r} should name an op like "
                                    "'aten.layer_norm' or 'aten.add.Tensor', or a whole "
                                    "namespace like 'aot_q'", stage="options")
            if "." not in name and not _is_namespace(name):
                raise UnsupportedOp(f"fallback_ops entry {name!r} is neither an op "
                                    "('aten.layer_norm') nor a registered op namespace",
                                    stage="options")

        if self.plan is not None and (not isinstance(self.plan, dict) or "region" not in self.plan
                                      or not isinstance(self.plan["region"], (str, type(None)))):
            raise UnsupportedOp("plan should be what CompiledModule.plan() returned: an object "
                                "with a 'region' entry (a candidate name or null)",
                                stage="options")

    @staticmethod
    def make(fallback: str, fallback_ops, placement: str = "auto",
             plan: dict | None = None) -> "PlacementPolicy":
        names = []
        for o in fallback_ops or ():
            names.append(str(o).replace("::", ".") if not isinstance(o, str) else o.replace("::", "."))
        return PlacementPolicy(fallback, tuple(names), placement, plan=plan)


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
    # a heavy op in ATen because it measured faster there: what it saves, crossings paid
    saving_ms: float | None = None

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        if d["saving_ms"] is None:
            del d["saving_ms"]
        return d

    @staticmethod
    def from_json(d: dict) -> "Placement":
        return Placement(**d)


def op_name(target) -> str:
    """``torch.ops.aten.add.Tensor`` -> ``aten.add.Tensor``."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    return str(target)


def _is_namespace(name: str) -> bool:
    prefix = name + "::"
    return any(s.name.startswith(prefix) for s in torch._C._jit_get_all_schemas())


def matches_forced(target, forced: tuple[str, ...]) -> bool:
    """``aten.layer_norm`` matches every overload; ``aten.add.Tensor`` only that one;
    a bare namespace (``aot_q``) every op in it."""
    full = op_name(target)
    packet = full.rsplit(".", 1)[0]
    return full in forced or packet in forced or full.split(".", 1)[0] in forced
