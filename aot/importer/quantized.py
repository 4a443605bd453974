"""Eager-mode quantized models -> exportable modules on integer tensors.

``torch.export`` cannot capture converted eager-mode quantized models (their
packed weights are TorchScript objects), and IREE knows no quantized dtypes. So
before export the model's ``forward`` is replayed on the *integer storage* of
its quantized tensors, and every function it applies to them becomes what
``aot.importer.quantized_calls`` says: the ``aot_q`` op that models it, or the
same layout call on the storage. What counts is what ``forward`` calls on
quantized tensors, whatever module or function issues it, not a list of
module types.

1. **Record.** The original model runs once on the example inputs under a
   ``TorchFunctionMode`` that notes, for every call touching a quantized tensor,
   its name and the quantization parameters of its inputs and results.
2. **Replay.** A copy of the model, its packed weights unpacked once into
   buffers (int8 values, scales, zero points, axis), runs under a second mode that
   tracks which integer tensors stand for quantized ones and maps each call, in
   the recorded order, to its integer form with the recorded (static) parameters.
   ``torch.export`` traces this replay.
3. **Check.** The replay must reproduce the original bit for bit on the example
   inputs (the ``aot_q`` ops' ATen implementations call ATen's quantized
   kernels), or compilation stops with ``UnsupportedOp``: never a wrong answer.
   A call the table does not model is refused with its name, module and the
   user's source line.
"""

from __future__ import annotations

import copy
import functools
import sys
import traceback
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from ..errors import UnsupportedOp
from ..torch_tensor import TorchTensor
from .locations import frame_location
from .quantized_calls import (CREATES_QUANTIZED, HANDLERS, LAYOUT, QUERIES, Call, PackedWeight,
                              call_name)

__all__ = ["is_eager_quantized", "rewrite_eager_quantized", "QuantizedBoundary"]

_Q_PREFIXES = ("torch.ao.nn.quantized", "torch.ao.nn.intrinsic.quantized",
               "torch.nn.quantized", "torch.nn.intrinsic.quantized")
QParams = tuple[float, int]


def _is_quantized_module(m: torch.nn.Module) -> bool:
    return type(m).__module__.startswith(_Q_PREFIXES)


def is_eager_quantized(model: torch.nn.Module) -> bool:
    """True for models made by eager-mode ``torch.ao.quantization.convert``."""
    return any(_is_quantized_module(m) for m in model.modules())


@dataclass(frozen=True)
class QuantizedBoundary:
    """What the rewrite changed at the model boundary: TorchTensor specs of the original."""

    inputs: tuple       # per flat input leaf: TorchTensor (quantized ones keep qparams)
    outputs: tuple      # per flat output leaf: TorchTensor of the original output


def _is_q(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_quantized


def _qparams(t: torch.Tensor, name: str) -> QParams:
    if t.qscheme() not in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        raise UnsupportedOp(f"{name} works on a tensor quantized {t.qscheme()}; per-tensor "
                            "affine quint8 activations are supported", op=name)
    if t.dtype != torch.quint8:
        raise UnsupportedOp(f"{name} works on a {t.dtype} tensor; quint8 activations are "
                            "supported", op=name)
    return float(t.q_scale()), int(t.q_zero_point())


@dataclass(frozen=True)
class _Event:
    name: str
    out: tuple[QParams, ...]   # per quantized result, in order
    where: str | None          # the user's source line


class _Record(TorchFunctionMode):
    """Notes every call of the eager run that reads or makes a quantized tensor."""

    def __init__(self):
        super().__init__()
        self.events: list[_Event] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        results = pytree.tree_leaves(out)
        if not any(isinstance(r, torch.Tensor) for r in results):
            return out  # a query (sizes, dtype, q_scale): replayed from the tracked values
        leaves = pytree.tree_leaves((args, kwargs))
        if any(_is_q(a) or isinstance(a, torch.ScriptObject) for a in leaves) or \
                any(_is_q(r) for r in results):
            name = call_name(func)
            for a in leaves:
                if _is_q(a):
                    _qparams(a, name)
            self.events.append(_Event(name, tuple(_qparams(r, name) for r in results if _is_q(r)),
                                      frame_location(traceback.extract_stack()[:-1])))
        return out


# --- the model's copy: packed weights unpacked ---------------------------------------------

def _unpack_weight(w: torch.Tensor, what: str):
    if w.dtype != torch.qint8:
        raise UnsupportedOp(f"weight dtype {w.dtype} of {what} is not supported (qint8 is)")
    qs = w.qscheme()
    if qs in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        return (w.int_repr(), torch.tensor([w.q_scale()], dtype=torch.float32),
                torch.tensor([w.q_zero_point()], dtype=torch.int64), -1)
    if qs in (torch.per_channel_affine, torch.per_channel_symmetric):
        return (w.int_repr(), w.q_per_channel_scales().float(),
                w.q_per_channel_zero_points().long(), int(w.q_per_channel_axis()))
    raise UnsupportedOp(f"weight quantization scheme {qs} of {what} is not supported "
                        "(per-tensor and per-channel affine qint8 are); keep this module in "
                        "float or use a supported qconfig")


def _unpack(packed: torch.ScriptObject, what: str):
    """``(PackedWeight fields, tensors)`` of one packed weight; never raises: an
    unsupported one says why in its kind, and is refused if an op reads it."""
    cls = packed._type().qualified_name().rsplit(".", 1)[-1]
    qops = torch.ops.quantized
    try:
        if cls == "Conv2dPackedParamsBase":
            if qops.conv2d_transpose(packed):
                return dict(kind="a transposed convolution's weight"), {}
            w, b = qops.conv2d_unpack(packed)
            params = (list(qops.conv2d_stride(packed)), list(qops.conv2d_padding(packed)),
                      list(qops.conv2d_dilation(packed)), int(qops.conv2d_groups(packed)))
            kind = "conv2d" if w.dim() == 4 else f"a {w.dim() - 2}-d convolution's weight"
        elif cls == "LinearPackedParamsBase":
            w, b = qops.linear_unpack(packed)
            params, kind = (), "linear"
        else:
            return dict(kind=f"{cls} (not unpacked)"), {}
        if not w.is_quantized:
            return dict(kind=f"a {w.dtype} weight (dynamic or weight-only quantization)"), {}
        wi, scales, zps, axis = _unpack_weight(w, what)
    except UnsupportedOp as e:
        return dict(kind=str(e)), {}
    tensors = {"w": wi, "scales": scales, "zps": zps}
    if b is not None:
        tensors["b"] = b.detach().float()
    return dict(kind=kind, params=params, axis=axis), tensors


def _prepared_copy(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A copy of ``model`` whose packed weights are :class:`PackedWeight` stand-ins
    (their tensors are buffers of the second module returned) and whose quantized
    modules hold their scalar parameters as Python numbers (``float(self.scale)``
    of a buffer cannot be traced)."""
    model = copy.deepcopy(model)
    weights = torch.nn.Module()
    for path, m in model.named_modules():
        for attr, value in list(vars(m).items()):
            if isinstance(value, torch.ScriptObject):
                key = f"{path}.{attr}".strip(".").replace(".", "__")
                fields, tensors = _unpack(value, f"{path or 'the model'!r}")
                for name, t in tensors.items():
                    weights.register_buffer(f"{key}__{name}", t)
                setattr(m, attr, PackedWeight(key, **fields))
        if _is_quantized_module(m):
            for name, buf in list(m._buffers.items()):
                if buf is not None and buf.numel() == 1 and not buf.is_quantized:
                    del m._buffers[name]
                    setattr(m, name, buf.item())
    return model, weights


# --- the replay ----------------------------------------------------------------------------

class _Replay(TorchFunctionMode):
    """Maps every call on tracked integer tensors to its integer form, in recorded order."""

    def __init__(self, owner: "_Replayer"):
        super().__init__()
        self.owner, self.events, self.pos = owner, owner.events, 0
        self.tracked: dict[int, tuple[torch.Tensor, QParams]] = {}

    def track(self, t: torch.Tensor, qp: QParams) -> None:
        self.tracked[id(t)] = (t, qp)  # the tensor is kept alive, so its id stays its own

    def qparams(self, t) -> QParams:
        entry = self.tracked.get(id(t)) if isinstance(t, torch.Tensor) else None
        if entry is None:
            raise UnsupportedOp("an operand that eager quantized is not a quantized tensor in the "
                                "replay (a quantized and a float tensor mixed in one call?)")
        return entry[1]

    def weights(self, p, kind: str):
        if not isinstance(p, PackedWeight) or p.kind != kind:
            raise UnsupportedOp(f"expected a packed {kind} weight, got "
                                f"{getattr(p, 'kind', type(p).__name__)}")
        buffers = self.owner.weights
        get = lambda n: getattr(buffers, f"{p.key}__{n}", None)  # noqa: E731
        return get("w"), get("scales"), get("zps"), get("b")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = pytree.tree_leaves((args, kwargs))
        tracked = [a for a in leaves if isinstance(a, torch.Tensor) and id(a) in self.tracked]
        packed = any(isinstance(a, PackedWeight) for a in leaves)
        name = call_name(func)
        if not tracked and not packed and name not in CREATES_QUANTIZED:
            return func(*args, **kwargs)
        if tracked and name in QUERIES:
            return QUERIES[name](self.qparams(tracked[0]))
        if name not in HANDLERS and name not in LAYOUT:
            return self._unmodelled(func, name, args, kwargs)
        event = self._next(name)
        call = Call(name, self.qparams, event.out, self.weights)
        try:
            if name in HANDLERS:
                out = HANDLERS[name](call, *args, **kwargs)
            else:
                out = self._layout(call, func, args, kwargs, tracked)
        except UnsupportedOp as e:
            raise self._refusal(name, event.where, str(e)) from None
        results = [r for r in pytree.tree_leaves(out) if isinstance(r, torch.Tensor)]
        if event.out:
            if len(results) != len(event.out):
                raise self._refusal(name, event.where, f"it made {len(event.out)} quantized "
                                    f"results in eager and {len(results)} in the replay")
            for r, qp in zip(results, event.out):
                self.track(r, qp)
        return out

    def _layout(self, call: Call, func, args, kwargs, tracked):
        qps = {self.qparams(t) for t in tracked}
        if len(qps) != 1 or any(qp not in qps for qp in call.out):
            raise UnsupportedOp("it changed the quantization parameters in eager")
        return func(*args, **kwargs)

    def _next(self, name: str) -> _Event:
        if self.pos >= len(self.events) or self.events[self.pos].name != name:
            expected = self.events[self.pos].name if self.pos < len(self.events) else "nothing"
            raise self._refusal(name, None, f"the replay reached {name} where the example run "
                                f"called {expected}: forward's quantized calls must not depend "
                                "on the input values")
        self.pos += 1
        return self.events[self.pos - 1]

    def _unmodelled(self, func, name, args, kwargs):
        try:
            out = func(*args, **kwargs)  # a query of sizes or dims works on the storage
        except Exception:  # noqa: BLE001  (any failure means: not modelled)
            out = None
        else:
            if not any(isinstance(r, torch.Tensor) for r in pytree.tree_leaves(out)):
                return out
        raise self._refusal(name, None, "the quantized importer does not model it (supported: "
                            + ", ".join(sorted(set(HANDLERS) | {"layout calls"})) + ")")

    def _refusal(self, name: str, where: str | None, why: str) -> UnsupportedOp:
        module = self.owner.issuing_module()
        return UnsupportedOp(f"{name} on a quantized tensor or weight{module}: {why}", op=name,
                             location=where or frame_location(traceback.extract_stack()),
                             stage="import")

    def finish(self) -> None:
        if self.pos != len(self.events):
            raise UnsupportedOp(f"the replay of the quantized model stopped after {self.pos} of "
                                f"{len(self.events)} quantized calls (next: "
                                f"{self.events[self.pos].name}): forward's quantized calls must "
                                "not depend on the input values", stage="import")


class _Replayer:
    """What one model's replays share: the recorded calls, the input parameters, the
    unpacked weights and every module's path (for errors)."""

    def __init__(self, model: torch.nn.Module, weights: torch.nn.Module,
                 events: list[_Event], input_qparams: list):
        self.weights, self.events, self.input_qparams = weights, events, input_qparams
        self._paths = {id(m): (p, type(m).__name__) for p, m in model.named_modules()}

    def run(self, forward, args, kwargs):
        replay = _Replay(self)
        for leaf, qp in zip(pytree.tree_leaves((args, kwargs)), self.input_qparams):
            if qp is not None:
                replay.track(leaf, qp)
        with replay:
            out = forward(*args, **kwargs)
        replay.finish()
        return out

    def issuing_module(self) -> str:
        """`` in module 'path' (Type)`` of the innermost module on the Python stack."""
        frame = sys._getframe(1)
        while frame is not None:
            me = frame.f_locals.get("self")
            if isinstance(me, torch.nn.Module) and id(me) in self._paths:
                path, kind = self._paths[id(me)]
                return f" in module {path or '<root>'!r} ({kind})"
            frame = frame.f_back
        return ""


def _integer_model(model: torch.nn.Module, events: list[_Event],
                   input_qparams: list) -> torch.nn.Module:
    """The model's copy whose ``forward`` (same signature, so ``dynamic_shapes`` given
    for the original apply) replays the original's on integer storage."""
    int_model, weights = _prepared_copy(model)
    replayer = _Replayer(int_model, weights, events, input_qparams)
    int_model.add_module("aot_unpacked_weights", weights)
    original = int_model.forward

    @functools.wraps(original)
    def forward(*args, **kwargs):
        return replayer.run(original, args, kwargs)
    int_model.forward = forward
    return int_model


def _to_storage(tree):
    return pytree.tree_map(lambda t: t.int_repr() if _is_q(t) else t, tree)


def rewrite_eager_quantized(model: torch.nn.Module, args: tuple, kwargs: dict):
    """Rewrite a converted eager-quantized model for export.

    Returns:
        ``(int_model, int_args, int_kwargs, boundary)``: the replaying copy, the
        example inputs as integer storage, and the original boundary specs.
    Raises:
        UnsupportedOp: a call, scheme or dtype the replay does not model, or the
            replay does not reproduce the original bit for bit.
    """
    with torch.no_grad():
        record = _Record()
        with record:
            ref = model(*args, **kwargs)
        input_qparams = [_qparams(t, "the model input") if _is_q(t) else None
                         for t in pytree.tree_leaves((args, kwargs))]
        int_model = _integer_model(model, record.events, input_qparams)
        int_args, int_kwargs = _to_storage(args), _to_storage(kwargs)
        try:
            got = int_model(*int_args, **int_kwargs)
        except UnsupportedOp:
            raise
        except Exception as e:  # an op on integers that fails: not modelled
            raise UnsupportedOp(
                f"the replay of the quantized model fails on the example inputs "
                f"({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''})"
                ": the model applies an operation to quantized tensors that the quantized "
                "importer does not model", stage="import") from e
    ref_leaves, got_leaves = pytree.tree_leaves(ref), pytree.tree_leaves(got)
    for i, (r, g) in enumerate(zip(ref_leaves, got_leaves)):
        want = r.int_repr() if _is_q(r) else r
        same = (want.dtype == g.dtype and torch.equal(want, g)) if isinstance(
            r, torch.Tensor) and isinstance(g, torch.Tensor) else want == g
        if not same:
            raise UnsupportedOp(
                f"output {i} of the rewritten quantized model differs from the original on the "
                "example inputs: the model applies an operation to quantized tensors that the "
                "quantized importer does not model exactly; refusing rather than returning "
                "wrong results", stage="import")
    inputs = tuple(TorchTensor.from_tensor(t) if isinstance(t, torch.Tensor) else None
                   for t in pytree.tree_leaves((args, kwargs)))
    outputs = tuple(TorchTensor.from_tensor(r) for r in ref_leaves)
    return int_model, int_args, int_kwargs, QuantizedBoundary(inputs, outputs)
