"""How the compiled forms (``compiled_forms``) write the nodes that replace an op.

Every node a rewrite emits carries the replaced op's source location (its
``stack_trace`` and ``nn_module_stack``), so an error or a report about it names the
user's line, and its ``val`` (the fake tensor the partitioner reads shapes from).
"""

from __future__ import annotations

import torch

__all__ = ["source_meta", "emit_node"]


def source_meta(node: torch.fx.Node) -> dict:
    """The metadata of ``node`` that names its place in the user's model."""
    return {k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")}


def emit_node(g: torch.fx.Graph, op, args: tuple, val, keep: dict) -> torch.fx.Node:
    """A call of ``op`` on ``args`` in ``g``, with value ``val`` and the metadata ``keep``
    (``source_meta`` of the op it replaces)."""
    n = g.call_function(op, args)
    n.meta = {**keep, "val": val}
    return n
