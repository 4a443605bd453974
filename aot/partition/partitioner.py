"""partition: ImportedProgram -> PartitionedProgram.

Second link of the chain, one step a module, read top to bottom: ``decisions``
places every op (coverage measured, uncovered ops decomposed, costs measured),
``grouping`` joins neighbouring kernel calls into one crossing, and ``kernel_calls``
rewrites the graph, recording a KernelCallSpec per kernel call. The backend
(``aot.backend.lower``) writes the compiled ops in its forms, imports the graph and
outlines the kernel calls into the Torch-dialect module it compiles.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field

import torch
import torch.fx

from ..fallback.spec import KernelCallSpec, lacks_cuda_kernel
from ..importer.fx_import import import_graph, stateless_graph
from ..importer.program import ImportedProgram
from .coverage import CoverageCache
from .decisions import CONTROL_FLOW, decide, op_nodes
from .grouping import Grouping
from .kernel_calls import rewrite_graph, rewrite_subgraph
from .placement import KERNEL_CALL, Placement, PlacementPolicy
from ..toolchain.targets import Target

__all__ = ["PartitionedProgram", "partition", "single_call", "torch_mlir"]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionedProgram:
    """Made by :func:`partition`, read by the backend (``aot.backend.lower``).

    ``graph`` is the program with its kernel calls as ``aot_kc`` ops and its compiled
    ops as written; ``subgraphs`` the graphs of its control flow (a ``while_loop``'s
    condition and body, a ``cond``'s branches) by name, rewritten likewise; ``placements`` has one row per op, in
    graph order; ``kernel_calls[i].key`` names the i-th kernel call.
    """

    imported: ImportedProgram
    target: Target
    policy: PlacementPolicy
    placements: tuple[Placement, ...]
    kernel_calls: tuple[KernelCallSpec, ...]
    producers: dict[str, tuple[str, ...]] | None = None  # op node -> the op nodes it reads
    # weights only kernel calls read, by name: kept beside the module for the host,
    # never passed through IREE (which copies a constant on every call it crosses)
    host_constants: dict[str, torch.Tensor] = field(default_factory=dict)
    # the key of the one kernel call that *is* the program (model inputs in order
    # in, its results out in order), or None: see ``single_call``
    whole_program_call: str | None = None
    graph: torch.fx.Graph | None = field(default=None, compare=False, repr=False)
    subgraphs: dict[str, torch.fx.GraphModule] = field(default_factory=dict, compare=False,
                                                       repr=False)

    def __post_init__(self):
        keys = [k.key for k in self.kernel_calls]
        assert len(set(keys)) == len(keys), "kernel call keys must be unique"
        assert {p.key for p in self.placements if p.where == KERNEL_CALL} == set(keys)


def torch_mlir(imported: ImportedProgram) -> str:
    """The Torch-dialect module of the whole program, before partitioning."""
    return str(import_graph(stateless_graph(imported.exported)))


def partition(imported: ImportedProgram, target: Target,
              policy: PlacementPolicy = PlacementPolicy(),
              cache: CoverageCache | None = None,
              demoted: dict[str, str] | None = None,
              assume=None) -> PartitionedProgram:
    """Place every op and rewrite the ones placed in ATen into kernel calls.

    Args:
        imported: from ``import_model``.
        target: the compile target (coverage is measured per target).
        policy: fallback policy and forced ops.
        cache: coverage verdict cache (default: on disk, per IREE version).
        demoted: node name -> reason, for ops that lower alone but broke the
            whole-program compile (see ``recover``): they become kernel calls.
        assume: ``coverage.Assumed``: ATen ops not yet probed are assumed to lower
            (the caller compiles the program, confirms, or partitions again without).
    Returns:
        PartitionedProgram.
    Raises:
        UnsupportedOp: ``fallback="none"`` and some op is not covered (all are
            listed with their source lines), or an op's operands cannot be
            recorded for a kernel call.
    """
    decisions = decide(imported.exported, target, policy, cache, demoted, assume)
    ep, decided, sizes = decisions.program, decisions.decided, decisions.sizes
    grouping = (Grouping.find(ep, decided, sizes) if policy.group
                else Grouping({}, {}, frozenset(sizes)))
    graph, specs, node_keys, consts = rewrite_graph(ep, decided, sizes, grouping)
    specs = list(specs)
    subgraphs = {}
    for n in op_nodes(ep):
        for i in CONTROL_FLOW.get(n.target, (None, ()))[1]:
            name = n.args[i].target
            subgraphs[name] = rewrite_subgraph(getattr(ep.graph_module, name), decided, specs,
                                               node_keys, consts, n.name)
    whole = single_call(graph)
    on_cpu = set()
    if target.name == "cuda":
        on_cpu = {s.key for s in specs if lacks_cuda_kernel(s)}
        for s in specs:
            if s.key in on_cpu:
                log.warning("%s has no CUDA kernel in ATen: on the GPU it will run on the CPU, "
                            "its operands copied across devices", s.qualified_name)
    note = " [no CUDA kernel in ATen: runs on the CPU, operands copied across devices]"
    placements = tuple(
        Placement(p.node, p.op, p.where,
                  p.reason + (note if node_keys.get(p.node) in on_cpu else ""), p.location,
                  p.flops, node_keys.get(p.node), p.saving_ms)
        for p in decisions.placements)
    producers = {n.name: tuple(a.name for a in n.all_input_nodes if a.op == "call_function")
                 for n in op_nodes(ep)}
    return PartitionedProgram(imported, target, policy, placements, tuple(specs), producers,
                              consts.tensors, None if whole is None else specs[whole].key,
                              graph, subgraphs)


def single_call(graph: torch.fx.Graph) -> int | None:
    """The site of the kernel call that is the whole program, or None.

    True when the graph is ``return call(inputs...)``: one kernel call reading the
    tensor inputs in order and nothing else, its results the outputs in order.
    The module then holds no compiled code, and the runtime may call that host
    function without entering the IREE VM (``CompiledModule``).
    """
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    calls = [n for n in graph.nodes if n.op == "call_function"
             and isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "aot_kc"]
    rest = [n for n in graph.nodes if n.op == "call_function" and n not in calls
            and not (n.target is operator.getitem and n.args[0] in calls)]
    if len(calls) != 1 or rest or list(calls[0].args[:-1]) != inputs:
        return None
    k = calls[0]
    out = next(n for n in graph.nodes if n.op == "output").args[0]
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    val = k.meta.get("val")
    if isinstance(val, (list, tuple)):
        want = [("item", i) for i in range(len(val))]
        got = [("item", o.args[1]) if isinstance(o, torch.fx.Node) and o.target is operator.getitem
               and o.args[0] is k else None for o in outs]
    else:
        want, got = [k], outs
    return k.args[-1] if got == want else None
