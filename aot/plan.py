"""A compile's decisions as a plan: what ``CompiledModule.plan()`` returns, what
``aot compile --save-plan`` writes and what ``plan=`` / ``--plan`` pin in another compile
(``aot.tuning.regions`` takes the pinned region instead of measuring)."""

from __future__ import annotations

import json

from .errors import UnsupportedOp

__all__ = ["read_plan"]


def read_plan(path: str) -> dict:
    """A plan saved as JSON (``aot compile --save-plan``)."""
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        raise UnsupportedOp(f"cannot read plan {path!r}: {e}", stage="options") from e
    if not isinstance(plan, dict) or "region" not in plan:
        raise UnsupportedOp(f"{path!r} is not a plan (an object with a 'region' entry, as "
                            "CompiledModule.plan() returns)", stage="options")
    return plan

