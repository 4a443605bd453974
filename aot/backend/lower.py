"""lower: PartitionedProgram -> LoweredProgram, the Torch-dialect module IREE compiles.

The IREE backend's first step. The partitioned graph's compiled ops are written in the
forms IREE 3.13 runs well (``aot.forms.compiled_forms.apply``: convolutions as matmuls,
attention as two matmuls, ...); the graph is imported into the Torch dialect
(``aot.importer.fx_import``), its kernel calls outlined into calls of host functions
(``aot.partition.outline``), and the ``linalg_kernels`` ops the forms called expanded.
Control flow's graphs (a ``while_loop``'s condition and body, a ``cond``'s branches) get
the same forms and become private functions of the module (``import_graph``).

A portable export (``--emit torch``, ``--emit stablehlo``) is for consumers other than
IREE: ``portable=True`` keeps the ops as written (a convolution stays a convolution)
but for the exact forms, which are right for every consumer, and the weights stay in
the module (no IREE parameters).
"""

from __future__ import annotations

import dataclasses
import functools
import io

import torch

from ..forms import compiled_forms
from ..importer.fx_import import Parameters, import_graph, import_graphs
from ..partition.outline import outline_kernel_calls
from ..partition.partitioner import PartitionedProgram
from ..toolchain.linalg_kernels import expand, named_kernels

__all__ = ["LoweredProgram", "lower", "lower_together"]


@dataclasses.dataclass(frozen=True)
class LoweredProgram(PartitionedProgram):
    """A PartitionedProgram with the module it lowers to, read by
    ``aot.backend.build.compile_program``.

    ``module`` is the outlined Torch-dialect module (kernel calls are ``func.call``s of
    ``aot_kernels.*`` imports), ``mlir`` its text (printed when first read: the weights
    are hex in it, so a large model's text takes seconds to print and as long for
    iree-compile to parse), ``bytecode()`` its MLIR bytecode (the weights as bytes).
    ``graph`` is the graph the module was imported from (compiled ops in their forms);
    ``parameters`` the weights the module reads as IREE parameters, by key
    (``target.parameters``).
    """

    module: object = dataclasses.field(default=None, compare=False, repr=False)
    parameters: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict,
                                                            compare=False, repr=False)

    @functools.cached_property
    def mlir(self) -> str:
        return str(self.module)

    def bytecode(self) -> bytes:
        """The module as MLIR bytecode, which iree-compile reads as it reads the text;
        its diagnostics then point at the ops' own locations, not at lines of ``mlir``
        (``recover.blame`` needs the text)."""
        out = io.BytesIO()
        self.module.operation.write_bytecode(out)
        return out.getvalue()


def lowered_graph(p: PartitionedProgram, portable: bool = False) -> torch.fx.Graph:
    """``p``'s graph with its compiled ops in their forms for ``p.target``."""
    return compiled_forms.apply(p.graph, named_kernels(p.target), portable)


def lower(p: PartitionedProgram, portable: bool = False) -> LoweredProgram:
    """``p`` lowered to the Torch-dialect module for its target (module docstring)."""
    graph = lowered_graph(p, portable)
    named = named_kernels(p.target)
    subgraphs = _loops(graph, {name: _lowered_subgraph(sub, named, portable)
                               for name, sub in p.subgraphs.items()})
    params = Parameters() if p.target.parameters and not portable else None
    module = expand(outline_kernel_calls(import_graph(graph, parameters=params,
                                                      subgraphs=subgraphs),
                                         list(p.kernel_calls)))
    fields = {f.name: getattr(p, f.name) for f in dataclasses.fields(PartitionedProgram)}
    return LoweredProgram(**{**fields, "graph": graph}, module=module,
                          parameters=params.tensors if params is not None else {})


def _lowered_subgraph(gm: torch.fx.GraphModule, named: bool, portable: bool
                      ) -> torch.fx.GraphModule:
    """A control-flow graph with its compiled ops in their forms, the control flow nested
    in it lowered likewise (``_loops``)."""
    new = torch.fx.GraphModule(gm, compiled_forms.apply(gm.graph, named, portable))
    children = {name: _lowered_subgraph(sub, named, portable)
                for name, sub in gm.named_children() if isinstance(sub, torch.fx.GraphModule)}
    for name, sub in _loops(new.graph, children).items():
        setattr(new, name, sub)
    new.recompile()
    return new


def _loops(graph: torch.fx.Graph, subgraphs: dict[str, torch.fx.GraphModule]
           ) -> dict[str, torch.fx.GraphModule]:
    """``subgraphs`` with every ``while_loop`` of ``graph`` carrying its additional inputs
    (the weights and tensors its condition and body read besides the carried values) as
    carried values its body returns unchanged: IREE 3.13's importer makes a loop of the
    carried values only. ``graph``'s loop nodes are rewritten to match, in place."""
    for n in graph.nodes:
        if n.op != "call_function" or n.target is not torch.ops.higher_order.while_loop:
            continue
        cond, body, carried, extra = n.args
        if not extra:
            continue
        body_graph = subgraphs[body.target].graph
        ins = [a for a in body_graph.nodes if a.op == "placeholder"][len(carried):]
        out = next(a for a in body_graph.nodes if a.op == "output")
        out.args = (tuple(out.args[0]) + tuple(ins),)
        subgraphs[body.target].recompile()
        n.args = (cond, body, tuple(carried) + tuple(extra), ())
        n.meta = {**n.meta, "val": tuple(n.meta["val"]) + tuple(a.meta["val"] for a in ins)}
    return subgraphs


def lower_together(programs: dict[str, PartitionedProgram],
                   parameters: Parameters | None = None) -> str:
    """One module with an entry function per program (``{function name: program}``,
    programs without kernel calls); a weight is one constant, read by every function
    (``import_graphs``)."""
    return str(expand(import_graphs({name: lowered_graph(p) for name, p in programs.items()},
                                    parameters)))
