"""The IREE backend's first pass (``aot.backend.lower``): the partitioned graph keeps the
compiled ops as written; lowering writes them in their compiled forms, or keeps them
(``portable=True``, the exports for other consumers); the forms read the weights the
partitioned graph holds as tensors, and both lowerings compile to eager's values."""

import torch

from aot.backend.build import compile_program
from aot.backend.lower import lower
from aot.importer.program import import_model
from aot.partition.partitioner import partition
from aot.partition.placement import PlacementPolicy
from aot.runtime.module import CompiledModule
from aot.toolchain.targets import get_target


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(4, 8, 1)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x):
        return self.dw(torch.relu(self.a(x)))


def _ops(graph) -> list:
    return [n.target for n in graph.nodes if n.op == "call_function"]


def test_the_partitioned_graph_holds_convolutions_lowering_writes_their_forms():
    torch.manual_seed(0)
    m, x = Net().eval(), torch.randn(1, 4, 9, 9)
    p = partition(import_model(m, (x,)), get_target("cpu"),
                  PlacementPolicy("auto", (), "coverage"))
    conv = torch.ops.aten.conv2d.default
    assert _ops(p.graph).count(conv) == 2 and not hasattr(p, "module")
    ir = lower(p)
    assert conv not in _ops(ir.graph) and "torch.aten.conv2d" not in ir.mlir
    # the weights are tensors in the partitioned graph: the forms read them all the same
    weights = [a for n in p.graph.nodes for a in n.args if isinstance(a, torch.Tensor)]
    assert any(w is m.a.weight or torch.equal(w, m.a.weight) for w in weights)
    portable = lower(p, portable=True)
    assert _ops(portable.graph).count(conv) == 2 and "torch.aten.conv2d" in portable.mlir
    assert _ops(p.graph).count(conv) == 2  # lowering copies; the partition is unchanged
    with torch.no_grad():
        want = m(x)
    for lowered in (ir, portable):
        cm = CompiledModule(compile_program(lowered))
        torch.testing.assert_close(cm(x), want, rtol=1e-5, atol=1e-5)
