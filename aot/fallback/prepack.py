"""Prepacked CPU kernels for ATen regions: weights packed once, ReLU and residual adds fused.

Eager PyTorch hands oneDNN an unpacked weight on every convolution and runs the
ReLU and the residual ``add`` that follow as separate passes over memory. A
compiled region knows its weights are constants and sees its whole graph, so
on the CPU (``ExecOptions(prepack=True)``) it can do what eager cannot:

- a convolution with a constant 4-D weight runs as
  ``mkldnn._convolution_pointwise`` on a weight reordered once, at its first
  call, into oneDNN's blocked layout (input and output NHWC, so only in
  channels-last groups);
- a ``relu`` reading only such a convolution's result is fused into it
  (oneDNN post-op), and so is an ``add`` of another tensor (``alpha=1``) with an
  optional ``relu`` after it (``_convolution_pointwise.binary``): the chain runs
  as one kernel at the position of its last op, the skipped slots stay empty
  (nothing else reads them);
- a ``linear`` with a constant 2-D weight runs as ``mkl._mkl_linear`` on a
  weight packed once for its static batch size.

Values change by rounding only (oneDNN and MKL accumulate in another order);
the region candidate that uses this is chosen only where it measured faster
(``aot.lower.regions``). Where this torch build lacks the kernels, the plain
ops run.
"""

from __future__ import annotations

import math

import torch

from .spec import KernelCallSpec, StaticArg, TensorArg, TensorListArg

__all__ = ["available", "plan_fusions", "DEFERRED"]

DEFERRED = object()  # a member whose result is computed later, by its chain's last op
_CONV_ARGS = {  # op -> positions of (stride, padding, dilation, groups), None if not packable
    "aten::conv2d": (3, 4, 5, 6),
    "aten::convolution": (3, 4, 5, 8),
}


def available() -> bool:
    """oneDNN's pointwise convolution and MKL's packed linear are in this torch build."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_convolution_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_convolution_weight"))


def _mkl_linear_available() -> bool:
    return torch.backends.mkl.is_available() and hasattr(torch.ops, "mkl") \
        and hasattr(torch.ops.mkl, "_mkl_linear")


def _tensor_operand(spec: KernelCallSpec, name: str) -> TensorArg | None:
    return next((o for o in spec.operands if isinstance(o, TensorArg) and o.name == name), None)


def _static(spec: KernelCallSpec, name: str, default=None):
    o = next((o for o in spec.operands if o.name == name), None)
    return o.value if isinstance(o, StaticArg) else default


def _reads(spec: KernelCallSpec) -> list[int]:
    slots = []
    for o in spec.operands:
        if isinstance(o, TensorArg):
            slots.append(o.index)
        elif isinstance(o, TensorListArg):
            slots.extend(i for i in o.indices if i is not None)
    return slots


class PackedConv:
    """conv [+ add] [+ relu] as one oneDNN kernel on a weight packed at the first call."""

    def __init__(self, conv, unary: str, other_slot: int | None, input_shape):
        self.conv, self.unary, self.other_slot = conv, unary, other_slot
        s, p, d, g = _CONV_ARGS[conv.spec.op]
        a = conv.args
        self.stride, self.padding, self.dilation = list(a[s]), list(a[p]), list(a[d])
        self.groups, self.input_shape = int(a[g]), list(input_shape)
        self.packed = None
        self.spec = conv.spec  # named in a KernelCallFailed

    def __call__(self, env: list) -> torch.Tensor:
        args, _ = self.conv.bind(env)
        x, w, b = args[0].contiguous(memory_format=torch.channels_last), args[1], args[2]
        if self.packed is None:
            self.packed = torch.ops.mkldnn._reorder_convolution_weight(
                w, self.padding, self.stride, self.dilation, self.groups, self.input_shape)
        if self.other_slot is None:
            return torch.ops.mkldnn._convolution_pointwise(
                x, self.packed, b, self.padding, self.stride, self.dilation, self.groups,
                self.unary, [], "")
        other = env[self.other_slot].contiguous(memory_format=torch.channels_last)
        return torch.ops.mkldnn._convolution_pointwise.binary(
            x, other, self.packed, b, self.padding, self.stride, self.dilation, self.groups,
            "add", 1.0, None if self.unary == "none" else self.unary, [], "")


class PackedLinear:
    """``linear`` on an MKL weight packed once for the static batch size."""

    def __init__(self, linear, batch: int):
        self.linear, self.batch, self.packed = linear, batch, None
        self.spec = linear.spec

    def __call__(self, env: list) -> torch.Tensor:
        args, _ = self.linear.bind(env)
        x, w = args[0], args[1]
        b = args[2] if len(args) > 2 else None
        if self.packed is None:
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(w, self.batch)
        return torch.ops.mkl._mkl_linear(x, self.packed, w, b, self.batch)


def _packable_conv(spec: KernelCallSpec) -> bool:
    if spec.op not in _CONV_ARGS or spec.overload not in ("default", ""):
        return False
    x, w = _tensor_operand(spec, "input"), _tensor_operand(spec, "weight")
    b = _tensor_operand(spec, "bias")
    if x is None or w is None or not w.constant or len(w.spec.shape) != 4 \
            or len(x.spec.shape) != 4 or x.spec.dtype != "float32" or w.spec.dtype != "float32":
        return False
    if b is not None and not b.constant:
        return False
    if spec.op == "aten::convolution" and _static(spec, "transposed", True):
        return False
    padding = _static(spec, "padding")
    return not isinstance(padding, str)  # conv2d.padding ("same"/"valid") is not packed


def _packable_linear(spec: KernelCallSpec) -> bool:
    if spec.op != "aten::linear" or not _mkl_linear_available():
        return False
    x, w = _tensor_operand(spec, "input"), _tensor_operand(spec, "weight")
    b = _tensor_operand(spec, "bias")
    return (x is not None and w is not None and w.constant and len(w.spec.shape) == 2
            and x.spec.dtype == "float32" and w.spec.dtype == "float32"
            and (b is None or b.constant))


def _is_relu(spec: KernelCallSpec) -> bool:
    return spec.op in ("aten::relu", "aten::relu_")


def _is_plain_add(spec: KernelCallSpec) -> bool:
    if spec.op != "aten::add" or spec.overload != "Tensor":
        return False
    a, b = _tensor_operand(spec, "self"), _tensor_operand(spec, "other")
    return (a is not None and b is not None and a.spec.shape == b.spec.shape
            and a.spec.dtype == b.spec.dtype == "float32" and _static(spec, "alpha", 1) == 1)


def plan_fusions(members: list, n_inputs: int, output_slots, convs: bool) -> dict:
    """Member index -> ``DEFERRED`` or a callable ``f(env) -> result`` replacing it.

    ``members`` are the group's BoundCalls in order; slots ``0..n_inputs-1`` are
    the group's inputs and each member appends its results after them.
    ``convs``: the group runs channels-last, so convolutions may be packed.
    """
    if not available():
        return {}
    specs = [b.spec for b in members]
    slot_of, users, nxt = [], {}, n_inputs  # member -> its first result slot; slot -> readers
    for i, s in enumerate(specs):
        slot_of.append(nxt)
        nxt += max(len(s.results), 1)
        for r in _reads(s):
            users.setdefault(r, []).append(i)
    outputs = set(output_slots)

    def only_reader(slot: int) -> int | None:
        us = users.get(slot, [])
        return us[0] if len(us) == 1 and slot not in outputs else None

    plan: dict = {}
    for i, s in enumerate(specs):
        if i in plan:
            continue
        if convs and _packable_conv(s):
            chain, unary, other = [i], "none", None
            j = only_reader(slot_of[i])
            if j is not None and _is_plain_add(specs[j]) and j not in plan:
                a, b = _tensor_operand(specs[j], "self"), _tensor_operand(specs[j], "other")
                other = b.index if a.index == slot_of[i] else a.index
                if other != slot_of[i]:
                    chain.append(j)
                    j = only_reader(slot_of[j])
                else:
                    other = None
            if j is not None and _is_relu(specs[j]) and j not in plan:
                chain.append(j)
                unary = "relu"
            x = _tensor_operand(s, "input")
            for k in chain[:-1]:
                plan[k] = DEFERRED
            plan[chain[-1]] = PackedConv(members[i], unary, other, x.spec.shape)
        elif _packable_linear(s):
            x = _tensor_operand(s, "input")
            plan[i] = PackedLinear(members[i], math.prod(x.spec.shape[:-1]))
    return plan
