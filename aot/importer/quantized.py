"""Eager-mode quantized models -> exportable modules on integer tensors.

``torch.export`` cannot capture converted eager-mode quantized models (their
packed weights are TorchScript objects), and IREE knows no quantized dtypes. So
before export we rewrite a *copy* of the model: every quantized module becomes
a module calling an ``aot_q`` op (``aot.fallback.quantized_ops``) on the integer
representation of its input, with its weights unpacked once (int8 values,
scales, zero points, axis) and every quantization parameter static.

Static parameters come from the model itself: a quantized module's output
parameters are fixed at ``convert`` time, and the parameters of its *input*
are recorded by running the original model once on the example inputs. Then
the rewritten model is run on the same inputs and must reproduce the original
bit for bit; anything it does not model (a functional op on a quantized tensor
that changes values) is caught there and refused, never silently wrong.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree

from ..errors import UnsupportedOp
from ..fallback import quantized_ops  # noqa: F401  (registers torch.ops.aot_q)
from ..torch_tensor import TorchTensor

__all__ = ["is_eager_quantized", "rewrite_eager_quantized", "QuantizedBoundary"]

_Q_PREFIXES = ("torch.ao.nn.quantized", "torch.ao.nn.intrinsic.quantized",
               "torch.nn.quantized", "torch.nn.intrinsic.quantized")
_PASS_THROUGH = (torch.nn.Identity, torch.nn.Flatten, torch.nn.Dropout)
aot_q = torch.ops.aot_q


def _is_quantized_module(m: torch.nn.Module) -> bool:
    mod = type(m).__module__
    return mod.startswith(_Q_PREFIXES) and "dynamic" not in mod


def is_eager_quantized(model: torch.nn.Module) -> bool:
    """True for models made by eager-mode ``torch.ao.quantization.convert``."""
    return any(_is_quantized_module(m) for m in model.modules())


@dataclass(frozen=True)
class QuantizedBoundary:
    """What the rewrite changed at the model boundary: TorchTensor specs of the original."""

    inputs: tuple       # per flat input leaf: TorchTensor (quantized ones keep qparams)
    outputs: tuple      # per flat output leaf: TorchTensor of the original output


def _qp(t) -> tuple[float, int] | None:
    if isinstance(t, torch.Tensor) and t.is_quantized:
        if t.qscheme() not in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            raise UnsupportedOp(f"activation quantization scheme {t.qscheme()} is not supported "
                                "(per-tensor affine quint8 activations are)")
        if t.dtype != torch.quint8:
            raise UnsupportedOp(f"activation dtype {t.dtype} is not supported (quint8 is)")
        return float(t.q_scale()), int(t.q_zero_point())
    return None


class _Recorder:
    """Input qparams of every module (and QFunctional method) seen in one eager run."""

    def __init__(self, model: torch.nn.Module):
        self.seen: dict[str, list] = {}
        self._handles = []
        self._patched = []
        for path, m in model.named_modules():
            if isinstance(m, torch.ao.nn.quantized.QFunctional):
                for meth in ("add", "add_relu", "cat", "mul", "mul_relu", "add_scalar",
                             "mul_scalar", "matmul"):
                    self._wrap(m, path, meth)
            elif _is_quantized_module(m) or not list(m.children()):
                self._handles.append(m.register_forward_pre_hook(
                    lambda mod, a, _p=path: self._note(_p, a)))

    def _note(self, key: str, args) -> None:
        first = args[0] if args else None
        if isinstance(first, (list, tuple)):
            qps = tuple(_qp(x) for x in first)
        else:
            qps = tuple(_qp(a) for a in args if isinstance(a, torch.Tensor))
        prev = self.seen.setdefault(key, [])
        if prev and prev[0] != qps:
            raise UnsupportedOp(f"module {key!r} is called with inputs of different quantization "
                                f"parameters ({prev[0]} and {qps}); give each call its own module")
        prev.append(qps)

    def _wrap(self, m, path, meth):
        orig = getattr(m, meth, None)
        if orig is None:
            return

        def wrapped(*args, **kwargs):
            self._note(f"{path}.{meth}", args)
            return orig(*args, **kwargs)
        setattr(m, meth, wrapped)
        self._patched.append((m, meth))

    def close(self):
        for h in self._handles:
            h.remove()
        for m, meth in self._patched:
            delattr(m, meth)  # back to the class method


# --- integer modules --------------------------------------------------------------------

def _unpack_weight(w: torch.Tensor, path: str):
    qs = w.qscheme()
    if qs in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        return (w.int_repr(), torch.tensor([w.q_scale()], dtype=torch.float32),
                torch.tensor([w.q_zero_point()], dtype=torch.int64), -1)
    if qs in (torch.per_channel_affine, torch.per_channel_symmetric):
        return (w.int_repr(), w.q_per_channel_scales().float(),
                w.q_per_channel_zero_points().long(), int(w.q_per_channel_axis()))
    raise UnsupportedOp(f"weight quantization scheme {qs} of {path!r} is not supported "
                        "(per-tensor and per-channel affine qint8 are); keep this module in "
                        "float or use a supported qconfig")


class _WeightedInt(torch.nn.Module):
    def __init__(self, mod, path, x_qp, relu):
        super().__init__()
        w, scales, zps, self.axis = _unpack_weight(mod.weight(), path)
        if mod.weight().dtype != torch.qint8:
            raise UnsupportedOp(f"weight dtype {mod.weight().dtype} of {path!r} is not supported "
                                "(qint8 is)")
        self.register_buffer("w", w)
        self.register_buffer("w_scales", scales)
        self.register_buffer("w_zero_points", zps)
        b = mod.bias()
        self.register_buffer("b", None if b is None else b.detach().float())
        self.x_scale, self.x_zp = x_qp
        self.out_scale, self.out_zp = float(mod.scale), int(mod.zero_point)
        self.relu = relu


class IntConv2d(_WeightedInt):
    def __init__(self, mod, path, x_qp, relu):
        super().__init__(mod, path, x_qp, relu)
        if mod.padding_mode != "zeros":
            raise UnsupportedOp(f"padding_mode={mod.padding_mode!r} of {path!r} is not supported")
        self.conv = (list(mod.stride), list(mod.padding), list(mod.dilation), int(mod.groups))

    def forward(self, x):
        return aot_q.conv2d(x, self.w, self.w_scales, self.w_zero_points, self.axis, self.b,
                            *self.conv, self.x_scale, self.x_zp, self.out_scale, self.out_zp,
                            self.relu)


class IntLinear(_WeightedInt):
    def forward(self, x):
        return aot_q.linear(x, self.w, self.w_scales, self.w_zero_points, self.axis, self.b,
                            self.x_scale, self.x_zp, self.out_scale, self.out_zp, self.relu)


class IntQuantize(torch.nn.Module):
    def __init__(self, mod, path):
        super().__init__()
        if mod.dtype != torch.quint8:
            raise UnsupportedOp(f"{path!r} quantizes to {mod.dtype}; quint8 activations are "
                                "supported")
        self.scale, self.zp = float(mod.scale), int(mod.zero_point)

    def forward(self, x):
        return aot_q.quantize(x, self.scale, self.zp)


class IntDeQuantize(torch.nn.Module):
    def __init__(self, x_qp):
        super().__init__()
        self.scale, self.zp = x_qp

    def forward(self, x):
        return aot_q.dequantize(x, self.scale, self.zp)


class IntMaxPool2d(torch.nn.Module):
    def __init__(self, mod, x_qp):
        super().__init__()
        pair = torch.nn.modules.utils._pair
        self.qp = x_qp
        self.args = (list(pair(mod.kernel_size)), list(pair(mod.stride or mod.kernel_size)),
                     list(pair(mod.padding)), list(pair(mod.dilation)), bool(mod.ceil_mode))

    def forward(self, x):
        return aot_q.max_pool2d(x, *self.qp, *self.args)


class IntAdaptiveAvgPool2d(torch.nn.Module):
    def __init__(self, mod, x_qp):
        super().__init__()
        size = torch.nn.modules.utils._pair(mod.output_size)
        if any(s is None for s in size):
            raise UnsupportedOp("AdaptiveAvgPool2d with a None output size is not supported "
                                "on quantized tensors")
        self.qp, self.size = x_qp, list(size)

    def forward(self, x):
        return aot_q.adaptive_avg_pool2d(x, *self.qp, self.size)


class IntFunctional(torch.nn.Module):
    """Stands in for ``QFunctional``: ``add``, ``add_relu`` and ``cat`` on integer tensors."""

    def __init__(self, mod, path, seen):
        super().__init__()
        self.path, self.seen = path, seen
        self.out = (float(mod.scale), int(mod.zero_point))

    def _in(self, meth):
        qps = self.seen.get(f"{self.path}.{meth}")
        if not qps:
            raise UnsupportedOp(f"QFunctional {self.path!r}.{meth} was not called in the example "
                                "run, so its input quantization parameters are unknown")
        return qps[0]

    def add(self, a, b):
        (sa, za), (sb, zb) = self._in("add")
        return aot_q.add(a, sa, za, b, sb, zb, *self.out, False)

    def add_relu(self, a, b):
        (sa, za), (sb, zb) = self._in("add_relu")
        return aot_q.add(a, sa, za, b, sb, zb, *self.out, True)

    def cat(self, xs, dim=0):
        qps = self._in("cat")
        return aot_q.cat(list(xs), [q[0] for q in qps], [q[1] for q in qps], dim, *self.out)

    def __getattr__(self, name):
        if name in ("mul", "mul_relu", "add_scalar", "mul_scalar", "matmul"):
            raise UnsupportedOp(f"QFunctional.{name} (at {self.path!r}) is not supported yet; "
                                "add, add_relu and cat are")
        return super().__getattr__(name)


class NotCalled(torch.nn.Module):
    """Stands in for a quantized module the example run never called (its packed
    weights cannot be exported, and its input's qparams are unknown)."""

    def __init__(self, path, mod):
        super().__init__()
        self.path, self.kind = path, f"{type(mod).__module__}.{type(mod).__name__}"

    def forward(self, *args, **kwargs):
        raise UnsupportedOp(f"quantized module {self.path!r} ({self.kind}) was not called in "
                            "the example run, so its input quantization parameters are "
                            "unknown; give example inputs that reach it")


def _replacement(path, m, seen):
    import torch.ao.nn.intrinsic.quantized as nniq
    import torch.ao.nn.quantized as nnq

    qps = seen.get(path, [()])[0]
    x_qp = qps[0] if qps else None
    if isinstance(m, nnq.QFunctional):
        return IntFunctional(m, path, seen)
    if isinstance(m, nnq.Quantize):
        return IntQuantize(m, path)
    if isinstance(m, nnq.DeQuantize):
        return IntDeQuantize(x_qp) if x_qp else torch.nn.Identity()
    if x_qp is None and not _is_quantized_module(m):
        return None  # float module on float data: untouched
    if path not in seen and _is_quantized_module(m):
        return NotCalled(path, m)  # forward never calls it: no input qparams to model
    if type(m) in (nniq.ConvReLU2d, nnq.Conv2d):
        return IntConv2d(m, path, x_qp, relu=isinstance(m, nniq.ConvReLU2d))
    if type(m) in (nniq.LinearReLU, nnq.Linear):
        return IntLinear(m, path, x_qp, relu=isinstance(m, nniq.LinearReLU))
    if isinstance(m, torch.nn.MaxPool2d) and x_qp:
        return IntMaxPool2d(m, x_qp)
    if isinstance(m, torch.nn.AdaptiveAvgPool2d) and x_qp:
        return IntAdaptiveAvgPool2d(m, x_qp)
    if isinstance(m, _PASS_THROUGH):
        return None
    raise UnsupportedOp(f"module {path!r} ({type(m).__module__}.{type(m).__name__}) runs on "
                        "quantized tensors and is not supported by the quantized importer; "
                        "supported: Quantize, DeQuantize, (Quantized)Conv2d(+ReLU), "
                        "Linear(+ReLU), QFunctional add/add_relu/cat, MaxPool2d, "
                        "AdaptiveAvgPool2d, Identity, Flatten, Dropout")


def _set(root: torch.nn.Module, path: str, new: torch.nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, new)


def _to_storage(tree):
    return pytree.tree_map(lambda t: t.int_repr() if isinstance(t, torch.Tensor)
                           and t.is_quantized else t, tree)


def rewrite_eager_quantized(model: torch.nn.Module, args: tuple, kwargs: dict):
    """Rewrite a converted eager-quantized model for export.

    Returns:
        ``(int_model, int_args, int_kwargs, boundary)``: the rewritten copy, the
        example inputs as integer storage, and the original boundary specs.
    Raises:
        UnsupportedOp: a module, scheme or dtype the rewrite does not model, or
            the rewritten model does not reproduce the original bit for bit.
    """
    with torch.no_grad():
        rec = _Recorder(model)
        try:
            ref = model(*args, **kwargs)
        finally:
            rec.close()
        int_model = copy.deepcopy(model)
        replaced: list[str] = []
        for path, m in list(int_model.named_modules()):
            if not path or any(path.startswith(r + ".") for r in replaced):
                continue  # the root, or inside a module already replaced
            new = _replacement(path, m, rec.seen)
            if new is not None:
                _set(int_model, path, new)
                replaced.append(path)
        int_args, int_kwargs = _to_storage(args), _to_storage(kwargs)
        try:
            got = int_model(*int_args, **int_kwargs)
        except Exception as e:  # an op the rewrite does not model, applied to integers
            raise UnsupportedOp(
                f"the rewritten quantized model fails on the example inputs ({type(e).__name__}: "
                f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}): the model applies an "
                "operation to quantized tensors that the quantized importer does not model") from e
    ref_leaves, got_leaves = pytree.tree_leaves(ref), pytree.tree_leaves(got)
    for i, (r, g) in enumerate(zip(ref_leaves, got_leaves)):
        want = r.int_repr() if r.is_quantized else r
        if want.dtype != g.dtype or not torch.equal(want, g):
            raise UnsupportedOp(
                f"output {i} of the rewritten quantized model differs from the original on the "
                "example inputs: the model applies an operation to quantized tensors that the "
                "quantized importer does not model (e.g. a functional relu/add outside "
                "QFunctional); refusing rather than returning wrong results")
    inputs = tuple(TorchTensor.from_tensor(t) if isinstance(t, torch.Tensor) else None
                   for t in pytree.tree_leaves((args, kwargs)))
    outputs = tuple(TorchTensor.from_tensor(r) for r in ref_leaves)
    return int_model, int_args, int_kwargs, QuantizedBoundary(inputs, outputs)

