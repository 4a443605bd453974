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
"""

from __future__ import annotations

import logging
import platform
import threading
import warnings
from typing import Callable

import torch

__all__ = ["available", "FusedGraph", "WARM_CALLS", "disagreement"]
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


def _pool_whole_maps(graph) -> None:
    """``adaptive_avg_pool2d`` to 1x1 (squeeze-excitation, a classifier's pooling) of a
    map whose size the trace recorded, as ``avg_pool2d`` over the whole map, which oneDNN
    Graph takes into its partitions (the adaptive one it leaves to ATen, between them)."""
    for node in list(graph.nodes()):
        if node.kind() != "aten::adaptive_avg_pool2d":
            continue
        x, size = list(node.inputs())
        if _int_list(size) != [1, 1]:
            continue
        sizes = x.type().sizes() if isinstance(x.type(), torch._C.TensorType) else None
        if not sizes or len(sizes) != 4 or any(not isinstance(d, int) for d in sizes):
            continue
        graph.setInsertPoint(node)
        kernel = graph.insertConstant(list(sizes[2:]))
        pool = graph.create("aten::avg_pool2d",
                            [x, kernel, kernel, graph.insertConstant([0, 0]),
                             graph.insertConstant(False), graph.insertConstant(True),
                             graph.insertConstant(None)], 1)
        graph.insertNode(pool)
        pool.output().setType(node.output().type())
        node.output().replaceAllUsesWith(pool.output())
        node.destroy()


def _int_list(value) -> list | None:
    node = value.node()
    if node.kind() == "prim::Constant":
        v = value.toIValue()
        return list(v) if isinstance(v, (list, tuple)) else None
    if node.kind() == "prim::ListConstruct" and all(
            i.node().kind() == "prim::Constant" for i in node.inputs()):
        return [i.toIValue() for i in node.inputs()]
    return None


class FusedGraph:
    """A group's members traced into one TorchScript function for oneDNN Graph to fuse.

    ``run``: the group's plain members (operands in slot order, constants included,
    results out). ``constants``: per operand slot, the host-held constant or None for
    an operand that crosses per call. ``name``: the group, for the log.
    """

    def __init__(self, run: Callable[[list], list], constants: list, name: str):
        self.run, self.constants, self.name = run, list(constants), name
        self.traced = None  # the TorchScript function, once traced
        self.failed: str | None = None  # why the trace was dropped

    def _operands(self, crossing) -> list:
        it = iter(crossing)
        return [next(it) if c is None else c for c in self.constants]

    def _body(self, *crossing):
        return tuple(self.run(self._operands(crossing)))

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
        out = traced(*crossing)
        return list(out) if isinstance(out, tuple) else [out]

    def _trace(self, crossing: list) -> None:
        was = torch._C._jit_llga_enabled()
        torch._C._jit_set_llga_enabled(True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.jit's deprecation notices
                # a value read out of a tensor would be baked into the trace: drop it
                warnings.simplefilter("error", torch.jit.TracerWarning)
                seen = []

                def body(*xs):
                    out = self._body(*xs)
                    seen.append(out)
                    return out

                traced = torch.jit.trace(body, tuple(crossing), check_trace=False)
                _spell_out_pool_strides(traced.graph)
                _pool_whole_maps(traced.graph)
                for _ in range(WARM_CALLS):  # fused here, with the switch on
                    fused = traced(*crossing)
            why = disagreement(seen[-1], fused if isinstance(fused, tuple) else (fused,))
            if why is not None:
                raise ValueError(f"the fused graph disagrees with the kernel calls: {why}")
            self.traced = traced
        except Exception as e:  # noqa: BLE001  (any failure: the plain members run)
            while e.__context__ is not None and not isinstance(e, torch.jit.TracerWarning):
                e = e.__context__  # a warning raised inside a C call surfaces wrapped
            self.failed = f"{type(e).__name__}: {str(e)[:300]}"
            log.info("%s: not run as a oneDNN graph (%s); its kernel calls run as they are",
                     self.name, self.failed)
        finally:
            torch._C._jit_set_llga_enabled(was)
