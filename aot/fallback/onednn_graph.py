"""An ATen group run as one oneDNN Graph program: traced once, fused and compiled by oneDNN.

Each ATen convolution or linear call pays a fixed cost on the host before oneDNN's
kernel starts: ideep describes every tensor, builds the primitive's descriptor and its
attributes, and allocates them, on every call. On a 2 GHz Xeon that is 60-70 us per
convolution, more than the kernel itself for most of a MobileNet's layers (an 8-channel
1x1 convolution of a 1x1 image takes 72 us through ``mkldnn._convolution_pointwise``).
oneDNN's Graph API does that work once: it partitions a graph into fusable pieces
(a convolution with its bias, residual add and activation; a linear with its
activation; pooling), compiles each partition for the shapes seen, keeps constant
weights in its own layout, and passes tensors between partitions in oneDNN's layouts.

PyTorch reaches that API through TorchScript (``torch.jit.enable_onednn_fusion``), so a
group chosen to run this way (``ExecOptions.onednn_graph``) is traced once, on its first
call, into a TorchScript function of its crossing operands, the artifact's constants
captured as the graph's constants (oneDNN packs them once), and called from then on;
TorchScript's executor fuses it on the first calls, which run here with the fusion on.
Tracing runs the group's own kernel calls (the recorded ops and static operands,
nothing read from the artifact becomes code) and keeps their results; the fused graph
then runs on the same operands and must agree with them (``disagreement``). A trace
that would bake a value read out of a tensor (a ``TracerWarning``), that fails, or
whose fused graph disagrees is dropped, and the group runs its plain kernel calls, as
the ``aten`` candidate does.

Values change by rounding only (oneDNN accumulates in another order). The region
candidate using this is chosen only where it measured faster (``aot.tuning.regions``).

With ``primitives=True`` (``ExecOptions.onednn_primitives``) the same trace, rewrites
included, is lowered by ``dnnl_program`` to oneDNN primitives of our own instead of
TorchScript's fuser, under the same agreement check.
"""

from __future__ import annotations

import logging
import platform
import threading
import warnings
from typing import Callable

import torch

__all__ = ["available", "FusedGraph", "WARM_CALLS", "disagreement", "MATRIX_PRODUCTS"]
log = logging.getLogger(__name__)

# calls made with the fusion on right after tracing: TorchScript's profiling executor
# profiles the first and optimizes (fuses) on the next
WARM_CALLS = 3
_LOCK = threading.Lock()  # the fusion switch is process-wide: one trace at a time


def available() -> bool:
    """This torch reaches oneDNN Graph through TorchScript (x86 builds with oneDNN)."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch._C, "_jit_set_llga_enabled")
            and hasattr(torch._C, "_jit_llga_enabled")
            and platform.machine().lower() in ("x86_64", "amd64"))


def disagreement(plain, fused) -> str | None:
    """Why the fused graph's results are not the kernel calls' on the same operands
    (other structure, dtype or shape, or a value further than float rounding can take
    it: 1e-3 of the result's largest magnitude, relative and absolute), or None."""
    if len(plain) != len(fused):
        return f"{len(fused)} results, not {len(plain)}"
    for i, (p, f) in enumerate(zip(plain, fused)):
        if not isinstance(f, torch.Tensor) or f.dtype != p.dtype or f.shape != p.shape:
            return f"result {i} is {getattr(f, 'dtype', type(f).__name__)} " \
                   f"{tuple(getattr(f, 'shape', ()))}, not {p.dtype} {tuple(p.shape)}"
        if not p.is_floating_point():
            if not torch.equal(p, f):
                return f"result {i} differs"
            continue
        scale = float(p.abs().nan_to_num(0.0, 0.0, 0.0).max()) if p.numel() else 0.0
        tol = 1e-3 * max(scale, 1.0)
        if not torch.allclose(f, p, rtol=1e-3, atol=tol, equal_nan=True):
            err = float((f - p).abs().nan_to_num(float("inf")).max())
            return f"result {i} is {err:.3g} away (tolerance {tol:.3g})"
    return None


_POOLS = ("aten::max_pool2d", "aten::avg_pool2d")


def _spell_out_pool_strides(graph) -> None:
    """A pooling's empty stride (ATen's "the kernel size") given as the kernel size:
    oneDNN Graph takes the stride as written and refuses an empty one."""
    for node in graph.nodes():
        if node.kind() not in _POOLS:
            continue
        ins = list(node.inputs())
        stride = ins[2].node()
        if stride.kind() == "prim::ListConstruct" and not list(stride.inputs()):
            node.replaceInput(2, ins[1])
        elif stride.kind() == "prim::Constant" and ins[2].toIValue() == []:
            node.replaceInput(2, ins[1])


def _fold_into_linears(graph) -> None:
    """A constant scale or shift along the features right after a linear with constant
    weights (a layer scale: ``linear(x, W, b) * g``; ``linear(x, W, b) + c``) folded into
    that linear's weight and bias, where nothing else reads the linear's result. oneDNN
    Graph fails to fuse a linear with an elementwise op on a constant (the whole trace
    would be dropped); the folded linear is one kernel, with the same values up to
    float rounding."""
    for node in list(graph.nodes()):
        if node.kind() not in ("aten::mul", "aten::add"):
            continue
        ins = list(node.inputs())
        if node.kind() == "aten::add" and (len(ins) != 3 or _constant(ins[2]) != 1):
            continue  # add's alpha other than 1
        for i in (0, 1):
            lin, c = ins[i].node(), _constant(ins[1 - i])
            if lin.kind() != "aten::linear" or len(ins[i].uses()) != 1 \
                    or not isinstance(c, torch.Tensor) or not c.is_floating_point():
                continue
            x, w, b = list(lin.inputs())
            wt, bt = _constant(w), _constant(b)
            if not isinstance(wt, torch.Tensor) or wt.dim() != 2 or not (
                    bt is None or isinstance(bt, torch.Tensor)):
                continue
            rank = _rank(x)  # a constant of more dimensions would add them to the result
            feat = _features(c, wt.shape[0]) if rank is not None and c.dim() <= rank else None
            if feat is None or feat.dtype != wt.dtype:
                continue
            if node.kind() == "aten::mul":
                wt, bt = wt * feat[:, None], None if bt is None else bt * feat
            else:
                bt = feat.clone() if bt is None else bt + feat
            graph.setInsertPoint(node)
            folded = graph.create("aten::linear", [x, graph.insertConstant(wt),
                                                  graph.insertConstant(bt)], 1)
            graph.insertNode(folded)
            folded.output().setType(node.output().type())
            node.output().replaceAllUsesWith(folded.output())
            node.destroy()
            lin.destroy()
            break


def _drop_layout_copies(graph) -> None:
    """A ``contiguous`` of a value already in that layout removed (the NHWC group's
    per-op conversions, no-ops once every op returns NHWC): between two partitions it
    ends oneDNN Graph's fusion and makes each partition return a plain layout. Kept on
    the group's own inputs (they arrive as the caller has them) and before a grouped
    convolution: oneDNN Graph would fuse the convolution before it with the depthwise
    one into a single partition that runs its reference kernel (3-4 ms a call on
    EfficientNet-B0)."""
    inputs = set(graph.inputs())
    for node in list(graph.nodes()):
        if node.kind() != "aten::contiguous":
            continue
        x, out = node.inputsAt(0), node.output()
        if x in inputs or not _same_layout(x.type(), out.type()) \
                or any(_grouped_convolution(u.user) for u in out.uses()):
            continue
        out.replaceAllUsesWith(x)
        node.destroy()


_VIEWS = ("aten::view", "aten::reshape", "aten::_unsafe_view", "aten::flatten")


def _drop_identity_views(graph) -> None:
    """A chain of views that ends in the shape and strides it started from (a
    normalisation's flatten and unflatten around a linear, left when the normalisation
    was folded into it) replaced by its start: the views end oneDNN Graph's fusion of
    the linear with the activation or residual add after them."""
    for node in list(graph.nodes()):
        if node.kind() not in _VIEWS:
            continue
        out, start = node.output(), node.inputsAt(0)
        while start.node().kind() in _VIEWS and len(start.uses()) == 1:
            start = start.node().inputsAt(0)
        if _same_layout(start.type(), out.type()):
            out.replaceAllUsesWith(start)
    torch._C._jit_pass_dce(graph)


def _same_layout(a, b) -> bool:
    return isinstance(a, torch._C.TensorType) and isinstance(b, torch._C.TensorType) \
        and a.sizes() is not None and a.strides() is not None \
        and a.sizes() == b.sizes() and a.strides() == b.strides()


def _grouped_convolution(node) -> bool:
    if node.kind() != "aten::_convolution":
        return False
    groups = _constant(node.inputsAt(8))
    return not isinstance(groups, int) or groups != 1


# matrix products, as TorchScript and the manifest both name them
MATRIX_PRODUCTS = frozenset({"aten::linear", "aten::matmul", "aten::addmm", "aten::mm",
                             "aten::bmm"})


def _lifted_slots(graph, constants: list) -> tuple[int, ...]:
    """The constant operand slots that an elementwise op applies to a matrix product's
    result (through other elementwise ops: a position embedding added after a linear),
    where no fold applied. oneDNN Graph fails to fuse such an op on a constant into the
    product before it, so these are passed to the traced function as inputs: then it
    fuses them as it fuses an op on any other tensor."""
    slot = {id(c): i for i, c in enumerate(constants) if c is not None}

    def after_product(v, depth=0) -> bool:
        node = v.node()
        if node.kind() in MATRIX_PRODUCTS:
            return True
        return node.kind() in _BINARY and depth < 8 and any(
            after_product(i, depth + 1) for i in list(node.inputs())[:2])

    lifted = set()
    for node in graph.nodes():
        if node.kind() not in _BINARY:
            continue
        ins = list(node.inputs())[:2]
        consts = [_constant(v) for v in ins]
        if not any(isinstance(c, torch.Tensor) and id(c) in slot for c in consts) \
                or not any(after_product(v) for v in ins):
            continue
        lifted.update(slot[id(c)] for c in consts
                      if isinstance(c, torch.Tensor) and id(c) in slot)
    return tuple(sorted(lifted))


_BINARY = ("aten::mul", "aten::add", "aten::sub", "aten::div")


def _constant(value):
    return value.toIValue() if value.node().kind() == "prim::Constant" else _NOT_CONSTANT


_NOT_CONSTANT = object()


def _rank(value) -> int | None:
    t = value.type()
    if not isinstance(t, torch._C.TensorType):
        return None
    return t.dim()


def _features(c: torch.Tensor, n: int) -> torch.Tensor | None:
    """``c`` as a vector over a linear's ``n`` output features, where it broadcasts along
    them alone (shape ``[n]``, ``[1, ..., 1, n]``), else None."""
    if c.dim() == 0 or c.shape[-1] != n or any(d != 1 for d in c.shape[:-1]):
        return None
    return c.reshape(n)


class FusedGraph:
    """A group's members traced into one TorchScript function for oneDNN Graph to fuse.

    ``run``: the group's plain members (operands in slot order, constants included,
    results out). ``constants``: per operand slot, the host-held constant or None for
    an operand that crosses per call. ``name``: the group, for the log.
    """

    def __init__(self, run: Callable[[list], list], constants: list, name: str,
                 primitives: bool = False):
        self.run, self.constants, self.name = run, list(constants), name
        # run the trace as oneDNN primitives of its own (``dnnl_program``), not through
        # TorchScript's oneDNN Graph fuser
        self.primitives = primitives
        self.traced = None  # the TorchScript function, once traced
        self.failed: str | None = None  # why the trace was dropped
        self.n_crossing = sum(c is None for c in self.constants)
        # constant slots passed to the traced function as inputs (``_lifted_slots``)
        self.lifted: tuple[int, ...] = ()
        self.lifted_values: tuple = ()

    def _operands(self, crossing) -> list:
        it = iter(crossing)
        return [next(it) if c is None else c for c in self.constants]

    def _body(self, *xs):
        it, lifted = iter(xs[:self.n_crossing]), dict(zip(self.lifted, xs[self.n_crossing:]))
        return tuple(self.run([next(it) if c is None else lifted.get(i, c)
                               for i, c in enumerate(self.constants)]))

    def __call__(self, crossing: list) -> list:
        traced = self.traced
        if traced is None:
            if self.failed is not None:
                return self.run(self._operands(crossing))
            with _LOCK:
                if self.traced is None and self.failed is None:
                    self._trace(crossing)
            if self.traced is None:
                return self.run(self._operands(crossing))
            traced = self.traced
        out = traced(*crossing, *self.lifted_values)
        return list(out) if isinstance(out, tuple) else [out]

    def _traced(self, crossing: list, lifted: tuple[int, ...]):
        """The members traced with the constant slots ``lifted`` as inputs, rewritten for
        oneDNN Graph; and the results the kernel calls gave while traced."""
        self.lifted = lifted
        seen = []

        def body(*xs):
            out = self._body(*xs)
            seen.append(out)
            return out

        args = (*crossing, *(self.constants[i] for i in lifted))
        traced = torch.jit.trace(body, args, check_trace=False)
        _spell_out_pool_strides(traced.graph)
        _drop_layout_copies(traced.graph)
        _drop_identity_views(traced.graph)
        _fold_into_linears(traced.graph)
        return traced, seen[-1]

    def _trace(self, crossing: list) -> None:
        if self.primitives:
            self._trace_primitives(crossing)
            return
        was = torch._C._jit_llga_enabled()
        torch._C._jit_set_llga_enabled(True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.jit's deprecation notices
                # a value read out of a tensor would be baked into the trace: drop it
                warnings.simplefilter("error", torch.jit.TracerWarning)
                traced, plain = self._traced(crossing, ())
                lifted = _lifted_slots(traced.graph, self.constants)
                if lifted:
                    traced, plain = self._traced(crossing, lifted)
                values = tuple(self.constants[i] for i in lifted)
                for _ in range(WARM_CALLS):  # fused here, with the switch on
                    fused = traced(*crossing, *values)
            why = disagreement(plain, fused if isinstance(fused, tuple) else (fused,))
            if why is not None:
                raise ValueError(f"the fused graph disagrees with the kernel calls: {why}")
            self.lifted_values, self.traced = values, traced
        except Exception as e:  # noqa: BLE001  (any failure: the plain members run)
            self._give_up(e, "a oneDNN graph")
        finally:
            torch._C._jit_set_llga_enabled(was)

    def _give_up(self, e: BaseException, what: str) -> None:
        """The trace is not used; ``failed`` says why."""
        while e.__context__ is not None and not isinstance(e, torch.jit.TracerWarning):
            e = e.__context__  # a warning raised inside a C call surfaces wrapped
        self.failed = f"{type(e).__name__}: {str(e)[:300]}"
        log.info("%s: not run as %s (%s); its kernel calls run as they are",
                 self.name, what, self.failed)

    def _trace_primitives(self, crossing: list) -> None:
        from . import dnnl_program

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                warnings.simplefilter("error", torch.jit.TracerWarning)
                traced, plain = self._traced(crossing, ())
            program = dnnl_program.build(traced.graph)
            fused = program(crossing)
            why = disagreement(plain, fused)
            if why is not None:
                raise ValueError(f"the primitives disagree with the kernel calls: {why}")
            log.info("%s: %d oneDNN primitives, %d ATen ops", self.name,
                     program.n_primitives, program.n_aten)
            self.program = program
            self.lifted_values, self.traced = (), lambda *xs: tuple(program(xs))
        except Exception as e:  # noqa: BLE001  (any failure: the plain members run)
            self._give_up(e, "oneDNN primitives")
