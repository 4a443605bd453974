"""Cost-based placement: is ATen's kernel faster than IREE's code for this op, here?

For each distinct signature of a *heavy* op (one with a FLOP formula above
``MIN_FLOPS``: convolutions, matmuls, linears), both are measured on this
machine with random data of the op's shapes: the ATen kernel (oneDNN, MKL,
cuDNN) called directly, and the op compiled alone by IREE with the target's
flags and run through the IREE runtime. The op becomes a kernel call when ATen
wins by more than the cost of crossing the boundary twice. Measurements are
cached on disk per machine (CPU model, cores, threads), IREE version, target
and flags, like coverage verdicts: measured once, not guessed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import platform
from dataclasses import dataclass

import iree.runtime as rt
import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.node import map_aggregate

from .coverage import _probe_graph
from .signatures import op_signature
from .disk_cache import JsonCache
from ..importer.dynamic import hint
from .. import timing
from ..progress import step
from ..toolchain.targets import Target
from ..toolchain.iree_compile import try_compile
from ..toolchain.linalg_kernels import expand, named_kernels
from ..importer.fx_import import import_graph
from ..forms.compiled_forms import FORMS, apply as apply_forms
from ..runtime.device import get_device, torch_to_buffer_view
from ..fallback.quantized_ops import PREPACKED
from ..fallback.prepack import (_CONV_ARGS, mkl_linear_available, available,
                               onednn_linear_available, onednn_linear_weight)
from ..fallback.prepack import VERSION as PREPACK

__all__ = ["Cost", "CostCache", "LocalCosts", "measure_aten", "measure_nodes", "measure_packed",
           "measure_decomposed", "start_prefetch", "Prefetch", "MIN_FLOPS", "CROSSING_MS", "HANDOFF_MS", "handoff_ms", "Floor",
           "compiled_floor"]
log = logging.getLogger(__name__)

MIN_FLOPS = 2_000_000       # below this an op is too small to be worth measuring or moving
CROSSING_MS = 0.03          # two CPU boundary crossings, rounded up (benchmarks/boundary_cost.py)
# A heavy kernel call between compiled dispatches on IREE's CPU task workers costs more
# than its crossings: torch's OpenMP team spins after the op on the cores IREE's workers
# need next (``aot.partition.threads``). On few cores that costs a fraction of a
# millisecond per kernel call even with the call on one thread, more than a heavy op
# usually saves by running in ATen (``benchmarks/thread_budget.py`` measures it).
HANDOFF_MS = 0.5
_RUNS = 7
# an op whose warm-up call takes this long is timed _RUNS_LONG times: its median is
# steady with fewer calls, and a slow decomposition's calls add up over dozens of signatures
_LONG_MS = 5.0
_RUNS_LONG = 3


@dataclass(frozen=True)
class Cost:
    """An op's median times alone: ATen's kernel, IREE's code, and (CPU linears and
    convolutions) the prepacked kernel the ``aten-prepacked`` region runs
    (``aot.fallback.prepack``; None where not measured)."""
    aten_ms: float | None
    iree_ms: float | None
    packed_ms: float | None = None

    @property
    def aten_wins(self) -> bool:
        return (self.aten_ms is not None and self.iree_ms is not None
                and self.aten_ms + CROSSING_MS < self.iree_ms)

    @property
    def saving_ms(self) -> float | None:
        """What ATen's kernel saves over IREE's code, crossings paid, where it wins."""
        return self.iree_ms - self.aten_ms - CROSSING_MS if self.aten_wins else None

    def reason(self) -> str:
        return (f"{MEASURED_FASTER}: {self.aten_ms:.3f} ms vs IREE {self.iree_ms:.3f} ms "
                "(measured on this machine)")


def handoff_ms(target: Target) -> float:
    """What a heavy kernel call between compiled dispatches costs beyond its crossings
    on ``target``: ``HANDOFF_MS`` on IREE's CPU task workers, else 0 (not measured)."""
    return HANDOFF_MS if target.driver == "local-task" else 0.0


@dataclass(frozen=True)
class Floor:
    """What the heavy ops measured alone (``measure_nodes``) take, summed over a
    program's heavy nodes: ``compiled_ms``, the least any plan that compiles the
    program can spend on them (each op IREE's code, or ATen's kernel plus its hand-off
    where that is less); ``aten_ms``, ATen's kernels alone; ``ops``, how many.

    ``any_executor_ms`` is ``compiled_ms`` without the hand-offs (what a plan running its
    kernel calls on the calling thread spends at least), and ``packed_ms`` the least
    the prepacked ATen region spends: each linear and convolution at the faster of its
    plain and prepacked kernel, a matrix product nothing (the region may fuse it into
    one attention kernel), every other heavy op at ATen's time."""
    compiled_ms: float
    aten_ms: float
    ops: int
    any_executor_ms: float = 0.0
    packed_ms: float = 0.0


def compiled_floor(nodes: list[torch.fx.Node], target: Target,
                   cache: CostCache | LocalCosts) -> Floor | None:
    """The ``Floor`` of ``nodes`` (the heavy ones) from their cached costs, or None where
    none has one. A node without a measured cost adds nothing: the floor stays a floor."""
    handoff, compiled, unhanded, aten, packed, ops = handoff_ms(target), 0.0, 0.0, 0.0, 0.0, 0
    for n in nodes:
        c = cache.get(op_signature(n))
        if c is None or c.aten_ms is None:
            continue
        called = c.aten_ms + CROSSING_MS
        compiled += called + handoff if c.iree_ms is None else min(c.iree_ms, called + handoff)
        unhanded += called if c.iree_ms is None else min(c.iree_ms, called)
        aten += c.aten_ms
        if n.target in _PACKED_OPS:
            packed += 0.0 if c.packed_ms is None else min(c.packed_ms, c.aten_ms)
        elif n.target not in _FUSABLE_PRODUCTS:
            packed += c.aten_ms
        ops += 1
    return Floor(compiled, aten, ops, unhanded, packed) if ops else None


_aten = torch.ops.aten
# the ops the prepacked region runs on packed weights, and the matrix products it may
# fuse into one attention kernel (``aot.fallback.prepack``)
_PACKED_OPS = {_aten.linear.default, _aten.conv2d.default, _aten.convolution.default}
_FUSABLE_PRODUCTS = {_aten.matmul.default, _aten.bmm.default, _aten.mm.default,
                     _aten.baddbmm.default, _aten.addmm.default}


# how the reason of a placement decided by measurement begins
MEASURED_FASTER = "ATen is faster here"


def machine_key() -> str:
    """This CPU, its core count, torch's threads and version: what a measurement depends on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}|{os.cpu_count()}|{torch.get_num_threads()}|{torch.__version__}"


class CostCache(JsonCache):
    """Measurements on disk, one JSON file per machine, IREE version, target and flags."""

    def __init__(self, target: Target, directory: str | None = None):
        # the compiled forms and the prepacked kernels are part of the key: a
        # measurement of an op's older compiled form (a convolution before
        # ``conv_rewrites``) or older prepacked kernel (MKL's linear) is not reused
        super().__init__("cost", target, key=f"{machine_key()}|{FORMS}|prepack{PREPACK}",
                         directory=directory)

    def get(self, sig: str) -> Cost | None:
        d = self.data.get(sig)
        return Cost(d["aten_ms"], d["iree_ms"], d.get("packed_ms")) if d else None

    def put(self, sig: str, cost: Cost) -> None:
        self.put_all({sig: cost})

    def put_all(self, costs: dict[str, Cost]) -> None:
        self.update({s: {"aten_ms": c.aten_ms, "iree_ms": c.iree_ms, "packed_ms": c.packed_ms}
                     for s, c in costs.items()})


def _real(val, device):
    """Random data for a fake value; a size that follows a symbol at its example value
    (``hint``: asking never fixes the symbol)."""
    if isinstance(val, torch.Tensor):
        shape = [hint(d) for d in val.shape]
        if val.dtype.is_floating_point:
            return torch.rand(shape, dtype=val.dtype, device=device) + 0.5
        if val.dtype in (torch.uint8, torch.int8):
            lo = 0 if val.dtype == torch.uint8 else -127
            return torch.randint(lo, 128, shape, dtype=val.dtype, device=device)
        return torch.zeros(shape, dtype=val.dtype, device=device)
    if isinstance(val, torch.SymInt) and val.node.hint is not None:
        return int(val.node.hint)
    return val


def _median_ms(fn, runs: int = _RUNS) -> float:
    warm = timing.block(fn, 1)[0]  # the warm-up call, timed to size the rest
    return timing.median_ms(fn, runs if warm < _LONG_MS else min(runs, _RUNS_LONG), warmup=0)


def _run_iree_ms(graph: torch.fx.Graph, target: Target, device: str) -> float | None:
    """Compile a stateless one-op graph alone and time it with the IREE runtime."""
    return _run_iree_all([graph], target, device)[0]


def _run_iree_all(graphs: list[torch.fx.Graph], target: Target, device: str) -> list[float | None]:
    """Compile one-op graphs together (one compiler run) and time each with the IREE
    runtime; when the module does not compile, each graph is compiled alone (the
    ones that fail have no time)."""
    vmfb = _compile_all(graphs, target)
    if vmfb is not None:
        return _time_functions(vmfb, dict(enumerate(graphs)), target, device)
    if len(graphs) == 1:
        return [None]
    return [_run_iree_all([g], target, device)[0] for g in graphs]


def _iree_times(graphs: dict[str, torch.fx.Graph], ready: dict[str, tuple], target: Target,
                device: str) -> dict[str, float | None]:
    """``{sig: IREE ms}`` of the compiled ``ready`` ones (``Prefetch.take``) and of
    ``graphs``, compiled here (one module, each alone where that fails)."""
    iree: dict[str, float | None] = {}
    for vmfb in {id(v): v for v, _, _ in ready.values()}.values():  # one module at a time
        part = {sig: (i, g) for sig, (v, i, g) in ready.items() if v is vmfb}
        timed = {i: g for i, g in part.values()}
        iree.update(zip(part, _time_functions(vmfb, timed, target, device)))
    if graphs:
        iree.update(zip(graphs, _run_iree_all(list(graphs.values()), target, device)))
    return iree


def _compile_all(graphs: list[torch.fx.Graph], target: Target) -> bytes | None:
    """The one-op graphs as one module (function ``op<i>`` per graph), compiled; None
    when IREE fails on it."""
    return try_compile(_module_text(graphs), target)[0]


def _module_text(graphs: list[torch.fx.Graph]) -> str:
    module = None
    for i, g in enumerate(graphs):
        module = import_graph(g, func_name=f"op{i}", module=module)
    return str(expand(module))


class Prefetch:
    """The IREE side of the heavy op signatures not yet measured, compiled in the
    background while coverage is probed (``start_prefetch``). The probe leaves these
    signatures out, so each is compiled once instead of twice, and the cost module's
    compile overlaps the probe's instead of following it (``benchmarks/compile_time.py``
    measures the stages). Only the compiles overlap: nothing is timed until both are
    done.

    The signatures are split into ``PARTS`` modules compiled side by side: IREE 3.13
    configures a module's executables one after another, so one module keeps one core
    busy for most of its compile.

    ``take(sigs)`` waits for it and gives ``{sig: (vmfb, function index, graph)}`` for
    those of ``sigs`` it compiled. The probe leaves these signatures to it
    (``covered()``); those of a module that fails (an op IREE does not lower) are
    probed, and the covered ones compiled again for their costs, as without a prefetch.
    """

    PARTS = 2

    def __init__(self, todo: dict[str, torch.fx.Graph], target: Target):
        self.sigs = list(todo)
        parts = _balanced(todo, min(self.PARTS, len(todo)))
        pool = concurrent.futures.ThreadPoolExecutor(len(parts), thread_name_prefix="aot-cost")
        self._parts = []
        for part in parts:
            graphs = [todo[s] for s in part]
            text = _module_text(graphs)  # MLIR on this thread; only the compilers run beside
            self._parts.append((part, graphs,
                                pool.submit(lambda text=text: try_compile(text, target)[0])))
        pool.shutdown(wait=False)  # the threads end with their compiles

    @staticmethod
    def _vmfb(future) -> bytes | None:
        try:
            return future.result()
        except Exception as e:  # best effort: the signatures are compiled as without a prefetch
            log.info("the cost prefetch failed: %s", e)
            return None

    def covered(self) -> set[str]:
        """Wait for the compiles; the signatures of the modules IREE compiled (every
        signature of such a module lowers: ``coverage.probe_nodes`` takes that as their
        verdict)."""
        return {s for part, _, f in self._parts if self._vmfb(f) is not None for s in part}

    def take(self, sigs) -> dict[str, tuple]:
        out = {}
        for part, graphs, future in self._parts:
            vmfb = self._vmfb(future)
            if vmfb is not None:
                out.update((s, (vmfb, i, graphs[i])) for i, s in enumerate(part) if s in sigs)
        return out


def _balanced(todo: dict[str, torch.fx.Graph], n: int) -> list[list[str]]:
    """``todo``'s signatures in ``n`` groups of about equal work (nodes of the compiled
    form: a convolution's im2col slices are most of its executables), largest first."""
    parts: list[list[str]] = [[] for _ in range(n)]
    load = [0] * n
    for s in sorted(todo, key=lambda s: -len(todo[s].nodes)):
        i = load.index(min(load))
        parts[i].append(s)
        load[i] += len(todo[s].nodes)
    return [p for p in parts if p]


def start_prefetch(nodes: list[torch.fx.Node], target: Target, cache: CostCache) -> Prefetch | None:
    """Start compiling the IREE side of ``nodes``' signatures that are neither measured
    nor known uncovered (``Prefetch``); None when there are none."""
    todo: dict[str, torch.fx.Graph] = {}
    for n in nodes:
        sig = op_signature(n)
        if sig in todo or cache.get(sig) is not None:
            continue
        try:
            todo[sig] = _compiled_form(_probe_graph(n), target)
        except Exception as e:  # measured (or not) after probing, as without a prefetch
            log.info("no prefetch for %s: %s", sig, e)
    return Prefetch(todo, target) if todo else None


def _time_functions(vmfb: bytes, graphs: dict[int, torch.fx.Graph], target: Target,
                    device: str) -> list[float]:
    """Time function ``op<i>`` of ``vmfb`` for each ``i, graph`` of ``graphs``."""
    hal = get_device(target.driver)
    instance = rt.VmInstance()
    module = rt.VmModule.copy_buffer(instance, vmfb)
    ctx = rt.VmContext(instance, [rt.create_hal_module(instance, hal), module])
    times = []
    for i, graph in graphs.items():
        fn = module.lookup_function(f"op{i}")
        inputs = [_real(p.meta["val"], device).contiguous()
                  for p in graph.nodes if p.op == "placeholder"]
        arg_list = rt.VmVariantList(len(inputs))
        for j, t in enumerate(inputs):
            arg_list.push_ref(torch_to_buffer_view(hal, t, f"probe input {j}").ref)
        times.append(_median_ms(lambda: ctx.invoke(fn, arg_list, rt.VmVariantList(4))))
    return times


def measure_decomposed(nodes: list[torch.fx.Node], decompositions: dict, target: Target,
                       cache: CostCache) -> dict[torch.fx.Node, Cost]:
    """Per node: its ATen kernel (weights prepacked once, as the executor does) against
    its decomposition (``decompositions[node.target]``) in IREE. The decompositions of
    every signature not in the cache are compiled in one module (one compiler run, not
    one per signature: a quantized ResNet has dozens), each alone only when that fails."""
    device = "cpu" if target.driver.startswith("local") else "cuda"
    out: dict[torch.fx.Node, Cost] = {}
    todo: dict[str, tuple[float, torch.fx.Graph]] = {}
    for n in nodes:
        sig = "decomposed " + op_signature(n)
        cost = cache.get(sig)
        if cost is None and sig not in todo:
            try:
                todo[sig] = _decomposed(n, decompositions[n.target], device)
            except Exception as e:  # best effort: without numbers, decompose as before
                log.info("could not measure %s: %s", sig, e)
                cache.put(sig, Cost(None, None))
    if todo:
        step("measuring %d quantized op signatures in ATen and as IREE code (once per "
             "machine, then cached)", len(todo))
        graphs = {sig: g for sig, (_, g) in todo.items()}
        try:  # compiled in parts side by side (``Prefetch``), the rest one by one
            ready = Prefetch(graphs, target).take(graphs)
            iree = _iree_times({s: g for s, g in graphs.items() if s not in ready}, ready,
                               target, device)
        except Exception as e:  # best effort, as above
            log.info("could not measure the decompositions: %s", e)
            iree = {}
        for sig, (aten_ms, _) in todo.items():
            iree_ms = iree.get(sig)
            cost = Cost(aten_ms, iree_ms) if iree_ms is not None else Cost(None, None)
            log.info("measured %s: ATen %s ms, IREE %s ms", sig, cost.aten_ms, cost.iree_ms)
            cache.put(sig, cost)
    for n in nodes:
        out[n] = cache.get("decomposed " + op_signature(n)) or Cost(None, None)
    return out


def _decomposed(node: torch.fx.Node, decomposition, device: str
                ) -> tuple[float, torch.fx.Graph]:
    """``(ATen kernel's median ms, the decomposition traced as a one-op-like graph)``."""
    vals = map_aggregate(node.args, lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a)
    args = map_aggregate(vals, lambda v: _real(v, device))
    op = node.target._schema.name
    kernel = PREPACKED[op][1]() if op in PREPACKED else node.target
    with torch.no_grad():
        aten_ms = _median_ms(lambda: kernel(*args))
    flat, spec = pytree.tree_flatten(args)
    where = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]

    def fn(*tensors):
        full = list(flat)
        for i, t in zip(where, tensors):
            full[i] = t
        return decomposition(*pytree.tree_unflatten(full, spec))
    gm = make_fx(fn, tracing_mode="fake")(*[flat[i] for i in where])
    return aten_ms, gm.graph


def _aten_ms(node: torch.fx.Node, device: str) -> float:
    vals = map_aggregate(node.args, lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a)
    kws = map_aggregate(node.kwargs, lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a)
    args = map_aggregate(vals, lambda v: _real(v, device))
    kwargs = map_aggregate(kws, lambda v: _real(v, device))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def aten():
        node.target(*args, **kwargs)
        sync()
    with torch.no_grad():
        return _median_ms(aten)


class LocalCosts:
    """Costs for one compile, over the machine's cache (``CostCache``): what
    ``measure_aten`` and ``measure_packed`` add is kept here, never on disk, since a
    cached cost with ATen's side alone would stand for an op whose IREE side was never
    measured."""

    def __init__(self, cache: CostCache):
        self.cache, self.mem = cache, {}

    def get(self, sig: str) -> Cost | None:
        return self.mem.get(sig) or self.cache.get(sig)

    def put_all(self, costs: dict[str, Cost]) -> None:
        self.mem.update(costs)


def measure_aten(nodes: list[torch.fx.Node], costs: LocalCosts, target: Target) -> None:
    """ATen's side alone of ``nodes``' signatures that ``costs`` lacks: what the ATen
    regions' floors need (``compiled_floor``), without compiling IREE's side."""
    device = "cpu" if target.driver.startswith("local") else "cuda"
    todo: dict[str, torch.fx.Node] = {}
    for n in nodes:
        sig = op_signature(n)
        if costs.get(sig) is None:
            todo.setdefault(sig, n)
    if not todo:
        return
    step("measuring %d heavy op signatures alone in ATen (for this compile)", len(todo))
    fresh = {}
    for sig, n in todo.items():
        try:
            fresh[sig] = Cost(_aten_ms(n, device), None)
        except Exception as e:  # the floor counts nothing for it
            log.info("could not measure %s in ATen: %s", sig, e)
    costs.put_all(fresh)


def measure_packed(nodes: list[torch.fx.Node], cache: CostCache | LocalCosts) -> None:
    """Add the prepacked time (``_packed_ms``) to the cached costs of ``nodes``' CPU
    linears and convolutions that have an ATen time and no prepacked one yet: measured
    only where a floor needs it (``aot.tuning.regions``: a slow program), not for every
    heavy op."""
    todo: dict[str, torch.fx.Node] = {}
    for n in nodes:
        sig = op_signature(n)
        c = cache.get(sig)
        if n.target in _PACKED_OPS and c is not None and c.aten_ms is not None \
                and c.packed_ms is None:
            todo.setdefault(sig, n)
    if not todo:
        return
    step("measuring %d linears and convolutions prepacked (%s)", len(todo),
         "for this compile" if isinstance(cache, LocalCosts) else
         "once per machine, then cached")
    fresh = {}
    for sig, n in todo.items():
        try:
            ms = _packed_ms(n)
        except Exception as e:  # the floor counts nothing for it
            log.info("could not measure %s prepacked: %s", sig, e)
            continue
        if ms is not None:
            fresh[sig] = dataclasses.replace(cache.get(sig), packed_ms=ms)
    cache.put_all(fresh)


def _packed_ms(node: torch.fx.Node) -> float | None:
    """The CPU time of a float32 linear or 2-D convolution as the prepacked region runs
    it (``aot.fallback.prepack``: the faster of oneDNN's linear on a reordered weight and
    MKL's on a packed one, ``aot.tuning.linear_kernels``, MKL's where torch has no oneDNN
    linear; oneDNN's convolution on a reordered weight and a channels-last input), or None
    where it packs no such op (a convolution of a 1x1 input runs as ``addmm`` there)."""
    vals = map_aggregate(node.args, lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a)
    if any(isinstance(v, torch.Tensor) and v.dtype != torch.float32 for v in vals[:3]) \
            or node.kwargs or len(vals) < 2:
        return None
    x, w, b = [_real(v, "cpu") if isinstance(v, torch.Tensor) else v
               for v in (list(vals) + [None])[:3]]
    if node.target is _aten.linear.default and w.dim() == 2 \
            and (onednn_linear_available() or mkl_linear_available()):
        # the region runs the faster of the two kernels it has (linear_kernels)
        batch, kernels = x.numel() // x.shape[-1], []
        if onednn_linear_available():
            reordered = onednn_linear_weight(w, batch)
            kernels.append(lambda: torch.ops.mkldnn._linear_pointwise(
                x, reordered, b, "none", [], ""))
        if mkl_linear_available():
            packed = torch.ops.mkl._mkl_reorder_linear_weight(w, batch)
            kernels.append(lambda: torch.ops.mkl._mkl_linear(x, packed, w, b, batch))
        with torch.no_grad():
            return min(_median_ms(fn) for fn in kernels)
    elif node.target in (_aten.conv2d.default, _aten.convolution.default) and available() \
            and w.dim() == 4 and x.dim() == 4 and tuple(x.shape[2:]) != (1, 1):
        if node.target is _aten.convolution.default and vals[6]:
            return None  # transposed: not packed
        # the operand positions the prepacked region reads (conv2d's defaults where omitted)
        at = _CONV_ARGS[node.target._schema.name]
        default = dict(zip(at, ([1], [0], [1], 1)))
        stride, padding, dilation, groups = (vals[i] if len(vals) > i else default[i]
                                             for i in at)
        if isinstance(padding, str):
            return None
        stride, padding, dilation = ([int(v) for v in a] * (2 if len(a) == 1 else 1)
                                     for a in (stride, padding, dilation))
        x = x.contiguous(memory_format=torch.channels_last)
        packed = torch.ops.mkldnn._reorder_convolution_weight(
            w, padding, stride, dilation, int(groups), list(x.shape))

        def fn():
            torch.ops.mkldnn._convolution_pointwise(x, packed, b, padding, stride, dilation,
                                                    int(groups), "none", [], "")
    else:
        return None
    with torch.no_grad():
        return _median_ms(fn)


def _compiled_form(graph: torch.fx.Graph, target: Target) -> torch.fx.Graph:
    """The one-op graph as the IREE backend compiles it for ``target`` (``compiled_forms``:
    a convolution IREE runs badly becomes a matmul, shifted multiply-adds or a named
    channels-last one, attention two matmuls, a global pool a mean): what IREE's side of
    the comparison runs."""
    return apply_forms(graph, named_kernels(target))


def measure_nodes(nodes: list[torch.fx.Node], target: Target, cache: CostCache,
                  prefetch: Prefetch | None = None) -> dict[str, Cost]:
    """Cost per op signature of ``nodes`` (measured once per machine, then cached).

    The IREE side of every signature not in the cache is compiled in one module
    (one compiler run instead of one per signature, of which a deep CNN has many), or was already,
    by ``prefetch``."""
    device = "cpu" if target.driver.startswith("local") else "cuda"
    out: dict[str, Cost] = {}
    todo: dict[str, torch.fx.Node] = {}
    for n in nodes:
        sig = op_signature(n)
        if sig in out or sig in todo:
            continue
        cost = cache.get(sig)
        if cost is None:
            todo[sig] = n
        else:
            out[sig] = cost
    # the prefetch's compile finishes before anything is timed (even when none is left)
    ready = prefetch.take(todo) if prefetch is not None else {}
    if not todo:
        return out
    step("measuring %d heavy op signatures alone in ATen and IREE (once per machine, "
         "then cached)", len(todo))
    aten, graphs = {}, {}
    for sig, n in todo.items():
        try:
            aten[sig] = _aten_ms(n, device)
            if sig not in ready:
                graphs[sig] = _compiled_form(_probe_graph(n), target)
        except Exception as e:  # measuring is best effort: keep the op compiled
            log.info("could not measure %s: %s", sig, e)
    iree = {}
    try:
        iree = _iree_times(graphs, {s: r for s, r in ready.items() if s in aten}, target, device)
    except Exception as e:
        log.info("could not measure IREE's side of %d ops: %s", len(graphs) + len(ready), e)
    fresh = {}
    for sig in todo:
        cost = Cost(aten.get(sig), iree.get(sig)) if sig in aten else Cost(None, None)
        log.info("measured %s: ATen %s ms, IREE %s ms", sig, cost.aten_ms, cost.iree_ms)
        fresh[sig] = cost
    cache.put_all(fresh)
    out.update(fresh)
    return out
