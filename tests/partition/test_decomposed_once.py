"""A program's decomposition is computed once per set of ops: the per-op partition,
the tiled variant's and every recovery round share it."""

import torch

import aot
from aot.partition import decisions
from aot.importer.decompositions import decomposition_for

aten = torch.ops.aten


class NormThenLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn, self.fc = torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return torch.relu(self.fc(self.bn(x)))


def _ep():
    return torch.export.export(NormThenLinear().eval(), (torch.randn(4, 16),)).run_decompositions({})


def test_the_same_ops_decompose_once_and_other_ops_apart(monkeypatch):
    calls = []
    real = torch.export.ExportedProgram.run_decompositions

    def counted(self, table=None, **kw):
        calls.append(frozenset(table or ()))
        return real(self, table, **kw)
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", counted)
    ep = _ep()
    calls.clear()
    bn = aten._native_batch_norm_legit_no_training.default
    table = {bn: decomposition_for(bn)}
    first = decisions._decomposed(ep, table)
    assert decisions._decomposed(ep, dict(table)) is first and len(calls) == 1
    assert not any(n.target == bn for n in first.graph.nodes)
    other = {aten.relu.default: decomposition_for(aten.relu.default) or (lambda x: x.clamp_min(0))}
    decisions._decomposed(ep, other)
    assert len(calls) == 2
    # another program is another entry
    another = _ep()
    calls.clear()
    decisions._decomposed(another, table)
    assert calls == [frozenset(table)]


def test_a_compile_that_decomposes_gives_eager_s_values(tmp_path, monkeypatch):
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    m = NormThenLinear()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    m, x = m.eval(), torch.randn(4, 16)
    cm = aot.compile(m, (x,))
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)
