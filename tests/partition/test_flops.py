"""FLOP counts of graph nodes (``aot.partition.flops``): torch's formulas, counted once per
static op signature."""

import torch

from aot.partition import flops


def _graph(m, *args, dynamic_shapes=None):
    ep = torch.export.export(m, args, dynamic_shapes=dynamic_shapes).run_decompositions({})
    return [n for n in ep.graph.nodes if n.op == "call_function"]


def test_counts_match_torch_and_repeat_from_the_signature(monkeypatch):
    m = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3),
                            torch.nn.Conv2d(16, 16, 3, padding=1)).eval()
    x = torch.randn(2, 8, 12, 12)
    convs = [n for n in _graph(m, x) if "conv" in str(n.target)]
    monkeypatch.setattr(flops, "_COUNTS", {})
    counts = [flops.node_flops(n) for n in convs]
    # 2 * N * Cout * Hout * Wout * Cin * kh * kw
    assert counts == [2 * 2 * 16 * 10 * 10 * 8 * 9, 2 * 2 * 16 * 8 * 8 * 16 * 9,
                      2 * 2 * 16 * 8 * 8 * 16 * 9]
    assert len(flops._COUNTS) == 3  # the two 16-channel convs differ in padding

    ran = []
    monkeypatch.setattr(flops, "_count", lambda *a: ran.append(a) or 0)
    assert [flops.node_flops(n) for n in convs] == counts and ran == []


def test_ops_without_a_formula_and_dynamic_sizes():
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
    x = torch.randn(3, 8)
    nodes = _graph(m, x, dynamic_shapes=({0: torch.export.Dim("b", min=2)},))
    by_op = {str(n.target): n for n in nodes}
    assert flops.node_flops(by_op["aten.relu.default"]) is None
    before = dict(flops._COUNTS)
    assert flops.node_flops(by_op["aten.linear.default"]) == 2 * 3 * 8 * 4  # at the example
    assert flops._COUNTS == before  # a symbolic size is never a cache key
