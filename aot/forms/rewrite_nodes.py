"""How the compiled forms (``compiled_forms``) write the nodes that replace an op.

Every node a rewrite emits carries the replaced op's source location (its
``stack_trace`` and ``nn_module_stack``), so an error or a report about it names the
user's line, and its ``val`` (the fake tensor the partitioner reads shapes from).

A rewrite of many nodes works out their values on ``shadow`` tensors (the meta
device: a shape function in C++) instead of the fake tensors themselves (each op
through FakeTensorMode's Python dispatch, a fraction of a millisecond each): a rewrite
emitting many nodes per op, over a network of many such ops, would spend seconds of
a compile there. ``emit_node`` makes the node's fake tensor.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..importer.dynamic import is_symbolic_value

__all__ = ["source_meta", "emit_node", "shadow"]


_FAKE = "_fake_like"  # the key of ``keep`` holding the replaced op's fake value


def source_meta(node: torch.fx.Node) -> dict:
    """The metadata of ``node`` that names its place in the user's model."""
    keep = {k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")}
    if isinstance(node.meta.get("val"), FakeTensor):
        keep[_FAKE] = node.meta["val"]
    return keep


def shadow(val):
    """A meta tensor of ``val``'s sizes, strides and dtype to compute values on (a fake
    tensor with symbolic sizes, or anything else, as it is)."""
    if not isinstance(val, FakeTensor) or is_symbolic_value(val):
        return val
    return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta")


def emit_node(g: torch.fx.Graph, op, args: tuple, val, keep: dict) -> torch.fx.Node:
    """A call of ``op`` on ``args`` in ``g``, with value ``val`` (a ``shadow`` becomes a
    fake tensor of the replaced op's mode and device) and the metadata ``keep``
    (``source_meta`` of the op it replaces)."""
    n = g.call_function(op, args)
    meta = {k: v for k, v in keep.items() if k != _FAKE}
    like = keep.get(_FAKE)
    if like is not None and isinstance(val, torch.Tensor) and not isinstance(val, FakeTensor) \
            and val.device.type == "meta":
        val = like.fake_mode.fake_tensor_converter.from_meta_and_device(
            like.fake_mode, val, like.device)
    n.meta = {**meta, "val": val}
    return n
