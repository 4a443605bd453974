"""The table of our own decompositions, keyed by op. ``decompositions`` (float ops) and
``int8_decompositions`` (the ``aot_q`` ops) register into it;
``decompositions.decomposition_for`` reads it."""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["IREE_DECOMPOSITIONS", "register_decomposition"]

IREE_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {}


def register_decomposition(op: torch._ops.OpOverload):
    """Decorator adding ``fn`` as our decomposition of ``op``."""
    def wrap(fn):
        IREE_DECOMPOSITIONS[op] = fn
        return fn
    return wrap
