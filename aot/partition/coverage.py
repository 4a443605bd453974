"""Coverage by measurement: does IREE lower this op, for this target?

Each distinct op signature (op, operand dtypes/shapes, static operands) is
probe-compiled once as a one-op function, and the verdict is cached on disk
keyed by IREE version, target and flags. Unknown signatures are first compiled
together in one module (one compiler run when all lower, the common case);
only when that fails is each compiled alone to find the culprits.

A compile that places by coverage (``assumes_coverage``) does not probe its ATen ops
first: it assumes they lower (``Assumed``), and the program's own compile is their
probe. When it compiles, the verdicts are cached; when it fails, the compile probes
them and partitions again. Each op's code is then generated once on a cold compile,
not once to probe and again in the program.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
import torch.fx
from torch.fx.node import map_aggregate

from .._mlir import new_context
from ..importer.fx_import import import_graph
from .disk_cache import JsonCache
from .signatures import op_signature
from ..toolchain.iree_compile import first_error, try_compile
from ..progress import step
from ..toolchain.targets import Target
from ..toolchain.tiling_flags import untiled

__all__ = ["Verdict", "CoverageCache", "Assumed", "assumes_coverage", "op_signature",
           "probe_nodes"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    covered: bool
    reason: str = ""


class CoverageCache(JsonCache):
    """Verdicts on disk, one JSON file per IREE version, target and flags.

    The data-tiling flags of a tiled variant (``tiling``) do not count: whether IREE
    lowers an op is the plain target's verdict (a tiled compile that fails anyway
    drops its variant), so the variant's partition probes nothing again (a deep
    network's dozens of signatures, seconds of a cold compile).
    """

    def __init__(self, target: Target, directory: str | None = None):
        super().__init__("coverage", untiled(target), directory=directory)

    def get(self, sig: str) -> Verdict | None:
        d = self.data.get(sig)
        return Verdict(d["covered"], d.get("reason", "")) if d else None

    def put_all(self, verdicts: dict[str, Verdict]) -> None:
        self.update({k: {"covered": v.covered, "reason": v.reason} for k, v in verdicts.items()})


ASSUMED = "assumed to lower: the program's compile is its probe"


@functools.lru_cache(maxsize=None)
def in_torch_dialect(op: torch._ops.OpOverload) -> bool:
    """The Torch dialect defines an op for ``op`` (the name the FX importer gives it,
    ``torch.<namespace>.<name>[.<overload>]``); the importer emits any other as a generic
    ``torch.operator``."""
    schema = op._schema
    name = "torch." + schema.name.replace("::", ".")
    if schema.overload_name:
        name += "." + schema.overload_name
    return _dialect_context().is_registered_operation(name)


@functools.lru_cache(maxsize=1)
def _dialect_context():
    return new_context()


def assumes_coverage(target: Target, policy) -> bool:
    """A compile that may assume its unprobed ATen ops lower (``Assumed``): one that
    moves the ops IREE fails on to ATen (``fallback="auto"``) through the Torch
    input (StableHLO has its own recovery)."""
    return policy.fallback == "auto" and target.via == "torch"


class Assumed:
    """Op signatures assumed covered, not probed, in a program's partition: ATen ops
    the cache has no verdict for and the Torch dialect defines (not other namespaces:
    quantized and custom ops are probed, since IREE does not know most of them and a
    decomposition may exist; nor ATen ops the importer can only emit as a generic
    ``torch.operator``, such as ``_native_batch_norm_legit_no_training``, which IREE's
    lowering rarely knows: a program failing on one would probe every op it assumed).

    ``sigs`` maps each to the names of its nodes; ``confirm`` caches the verdicts of
    those whose every node the compiled program holds.
    """

    def __init__(self):
        self.sigs: dict[str, set[str]] = {}

    def takes(self, node: torch.fx.Node) -> bool:
        return isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "aten" \
            and in_torch_dialect(node.target)

    def add(self, sig: str, node: torch.fx.Node) -> Verdict:
        self.sigs.setdefault(sig, set()).add(node.name)
        return Verdict(True, ASSUMED)

    def confirm(self, placements, target: Target) -> None:
        """The program with ``placements`` compiled: its compiled ops lower."""
        compiled = {pl.node for pl in placements if pl.where == "compiled"}
        CoverageCache(target).put_all({s: Verdict(True) for s, names in self.sigs.items()
                                       if names <= compiled})
        self.sigs = {}


def _probe_graph(node: torch.fx.Node) -> torch.fx.Graph:
    g = torch.fx.Graph()

    def operand(a):
        if not isinstance(a, torch.fx.Node):
            return a
        val = a.meta.get("val")
        if isinstance(val, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
            p = g.placeholder(f"arg{len(g.nodes)}")
            p.meta["val"] = val
            return p
        return val

    args = map_aggregate(node.args, operand)
    kwargs = map_aggregate(node.kwargs, operand)
    new = g.call_function(node.target, args, kwargs)
    new.meta = dict(node.meta)
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        outs = []
        for i, v in enumerate(val):
            if isinstance(v, torch.Tensor):
                gi = g.call_function(__import__("operator").getitem, (new, i))
                gi.meta["val"] = v
                outs.append(gi)
        g.output(tuple(outs))
    else:
        g.output(new)
    return g


def _compile_probes(nodes: dict[str, torch.fx.Node], target: Target) -> str:
    """Compile the one-op functions of ``nodes`` together; '' on success."""
    module = None
    try:
        for i, node in enumerate(nodes.values()):
            module = import_graph(_probe_graph(node), func_name=f"probe{i}", module=module)
    except Exception as e:  # the importer rejecting an op is a verdict too
        return f"FX importer: {type(e).__name__}: {e}"
    _, diag = try_compile(str(module), target)
    return diag


def _bisect(todo: dict[str, torch.fx.Node], target: Target, out: dict[str, Verdict]) -> None:
    """Compile ``todo`` together; on failure split in halves until the culprits are alone."""
    diag = _compile_probes(todo, target)
    if not diag:
        out.update({s: Verdict(True) for s in todo})
    elif len(todo) == 1:
        out.update({s: Verdict(False, _reason(diag)) for s in todo})
    else:
        items = list(todo.items())
        half = len(items) // 2
        _bisect(dict(items[:half]), target, out)
        _bisect(dict(items[half:]), target, out)


UNKNOWN_OP = "IREE's torch lowering does not know this op (left as torch.operator)"


def _unknown(node: torch.fx.Node) -> str | None:
    """The verdict's reason, without compiling, for an op outside ATen's namespace that
    the importer leaves as a generic ``torch.operator`` (a custom op, our quantized
    ``aot_q`` ops): IREE's torch lowering has no pattern for it, so every compile of it
    fails; None for any other op (probed by compiling)."""
    op = node.target
    if not isinstance(op, torch._ops.OpOverload) or op.namespace in ("aten", "prims"):
        return None
    try:
        text = str(import_graph(_probe_graph(node), func_name="probe"))
    except Exception as e:  # the importer rejecting an op is a verdict too
        return f"FX importer: {type(e).__name__}: {e}"
    return UNKNOWN_OP if f'torch.operator "torch.{op.namespace}.' in text else None


def _reason(diag: str) -> str:
    err = first_error(diag)
    if "torch.operator" in err and "illegal" in err:
        return UNKNOWN_OP
    err = err.split(": %")[0].split(" loc(")[0]
    return err if len(err) < 200 else err[:197] + "..."


def probe_nodes(nodes: list[torch.fx.Node], target: Target,
                cache: CoverageCache, compiled=None, assume: Assumed | None = None
                ) -> dict[str, Verdict]:
    """Verdict per signature for ``nodes`` (cached ones are not compiled again).

    ``assume``: the signatures it takes are assumed covered instead of probed.

    ``compiled``: a module of some of these signatures' one-op functions (as the
    partitioner compiles them) compiling beside the probe, with ``sigs`` and ``covered()``
    (``cost.Prefetch``: the heavy ops' cost measurement). Its signatures are left out of
    the probe and covered when it compiles, probed as the others when it does not: in a
    convolution network the heavy ops are most of the probe's compile time."""
    sigs: dict[str, torch.fx.Node] = {}
    for n in nodes:
        sigs.setdefault(op_signature(n), n)
    verdicts = {s: cache.get(s) for s in sigs}
    todo = {s: n for s, n in sigs.items() if verdicts[s] is None}
    if assume is not None:
        for n in nodes:
            s = op_signature(n)
            if s in todo and assume.takes(n) and (compiled is None or s not in compiled.sigs):
                verdicts[s] = assume.add(s, n)
        todo = {s: n for s, n in todo.items() if verdicts[s] is None}
    if todo:
        log.info("probing %d op signatures for %s", len(todo), target.name)
        step("probing which of %d op signatures IREE lowers for %s (once per machine, "
             "then cached)", len(todo), target.name)
        fresh: dict[str, Verdict] = {}
        for s, n in list(todo.items()):
            reason = _unknown(n)
            if reason is not None:
                fresh[s] = Verdict(False, reason)
                del todo[s]
        aside = {s: n for s, n in todo.items() if compiled is not None and s in compiled.sigs}
        if len(aside) < len(todo):
            _bisect({s: n for s, n in todo.items() if s not in aside}, target, fresh)
        if aside:
            covered = compiled.covered()
            fresh.update({s: Verdict(True) for s in aside if s in covered})
            if len(covered & set(aside)) < len(aside):
                _bisect({s: n for s, n in aside.items() if s not in covered}, target, fresh)
        cache.put_all(fresh)
        verdicts.update(fresh)
    return verdicts  # type: ignore[return-value]
