"""Input-independent ops are computed once at compile time (aot.passes.fold_constants)."""

import torch

import aot
from aot.passes.fold_constants import fold_constants


class Positions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Embedding(16, 8)
        self.w = torch.nn.Parameter(torch.randn(8, 8))
        self.b = torch.nn.Parameter(torch.randn(1024))

    def forward(self, x):
        pos = self.pos(torch.arange(x.shape[1]))          # folded: arange + embedding
        y = (x + pos) @ (self.w * 0.5).t()                # w * 0.5 folded, its .t() stays
        big = self.b.repeat(512, 1)                       # 2 MiB: stays in the program
        return y, big.sum(0)[: x.shape[1]] + x.sum(-1)


def _ops(ep):
    return [n.target.__name__ for n in ep.graph.nodes if n.op == "call_function"]


def test_folding_keeps_values_bit_exact_and_removes_the_ops():
    torch.manual_seed(0)
    m, x = Positions().eval(), torch.randn(1, 12, 8)
    ep = torch.export.export(m, (x,))
    before = _ops(ep)
    folded, n = fold_constants(ep)
    after = _ops(folded)
    assert n == 3, after
    assert not any(o.startswith(("arange", "embedding")) for o in after), after
    assert sum(o.startswith("mul") for o in after) == 0
    assert any(o.startswith("t.") for o in after)  # a view is never stored
    assert any(o.startswith("repeat") for o in after)  # too large to store
    assert _ops(ep) == before  # the input program is untouched
    for a, b in zip(folded.module()(x), m(x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_compiled_program_with_folded_constants_matches_eager():
    torch.manual_seed(0)
    m, x = Positions().eval(), torch.randn(1, 12, 8)
    cm = aot.compile(m, (x,))
    assert cm.manifest["folded_ops"] == 3
    assert "3 op(s) read only constants" in cm.report()
    with torch.no_grad():
        for a, b in zip(cm(x), m(x)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
    # the bit-exact round-trip mode rewrites nothing
    cm_all = aot.compile(m, (x,), fallback="all")
    assert cm_all.manifest["folded_ops"] == 0
    for a, b in zip(cm_all(x), m(x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_nothing_to_fold_returns_the_program_itself():
    m = torch.nn.Linear(4, 4).eval()
    ep = torch.export.export(m, (torch.randn(2, 4),))
    assert fold_constants(ep) == (ep, 0)
