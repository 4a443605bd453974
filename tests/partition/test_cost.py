"""Per-op cost measurement: every unmeasured signature's IREE side in one compiler run."""

import threading

import pytest

import torch

from aot.partition import cost
from aot.toolchain import iree_compile
from aot.partition.cost import CostCache, measure_nodes
from aot.toolchain.targets import get_target


class TwoConvs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 16, 1)
        self.c = torch.nn.Linear(16, 32)

    def forward(self, x):
        return self.c(self.b(self.a(x)).mean((2, 3)))


def _heavy_nodes():
    ep = torch.export.export(TwoConvs().eval(), (torch.randn(1, 8, 16, 16),))
    return [n for n in ep.graph.nodes if n.op == "call_function"
            and n.target in (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)]


def test_signatures_are_measured_in_one_compile_and_cached(tmp_path, monkeypatch):
    target = get_target("cpu")
    runs = []
    real = iree_compile.try_compile
    monkeypatch.setattr(cost, "try_compile", lambda *a, **k: runs.append(1) or real(*a, **k))
    nodes = _heavy_nodes()
    assert len(nodes) == 3
    got = measure_nodes(nodes, target, CostCache(target, directory=str(tmp_path)))
    assert len(runs) == 1 and len(got) == 3
    for c in got.values():
        assert c.aten_ms > 0 and c.iree_ms > 0
    # a second measurement reads the cache: no compile, the same numbers
    again = measure_nodes(nodes, target, CostCache(target, directory=str(tmp_path)))
    assert len(runs) == 1 and again == got


def test_a_module_that_does_not_compile_falls_back_to_one_compile_per_op(tmp_path, monkeypatch):
    target = get_target("cpu")
    real = iree_compile.try_compile
    calls = []

    def fails_together(text, tgt, *a, **k):  # the batch fails; each op alone compiles
        calls.append(text.count("func.func @op"))
        return (None, "error: simulated") if text.count("func.func @op") > 1 else real(text, tgt, *a, **k)
    monkeypatch.setattr(cost, "try_compile", fails_together)
    got = measure_nodes(_heavy_nodes(), target, CostCache(target, directory=str(tmp_path)))
    assert calls == [3, 1, 1, 1]
    assert all(c.iree_ms and c.iree_ms > 0 for c in got.values())
    assert cost.Cost(None, None) not in got.values()


def test_a_prefetch_compiles_while_coverage_is_probed_and_is_timed_after(tmp_path, monkeypatch):
    """``start_prefetch`` compiles the IREE side in the background; ``measure_nodes``
    then times from that module (no second compile) and agrees in kind with a plain
    measurement; a signature the prefetch left out is compiled as before."""
    target = get_target("cpu")
    runs = []
    real = iree_compile.try_compile
    monkeypatch.setattr(cost, "try_compile",
                        lambda text, *a, **k: runs.append(text.count("func.func @op"))
                        or real(text, *a, **k))
    nodes = _heavy_nodes()
    cache = CostCache(target, directory=str(tmp_path))
    prefetch = cost.start_prefetch(nodes[:2], target, cache)  # the linear left out
    got = measure_nodes(nodes, target, cache, prefetch)
    assert sorted(runs) == [1, 1, 1]  # the prefetch's two modules, then the linear alone
    assert len(got) == 3 and all(c.aten_ms > 0 and c.iree_ms > 0 for c in got.values())
    # measured: nothing left to prefetch
    assert cost.start_prefetch(nodes, target, CostCache(target, directory=str(tmp_path))) is None


def test_a_prefetch_that_fails_leaves_the_measurement_as_it_was(tmp_path, monkeypatch):
    target = get_target("cpu")
    real = iree_compile.try_compile
    calls = []

    def fails_first(text, tgt, *a, **k):  # the prefetch's modules fail (an op IREE rejects)
        prefetching = threading.current_thread().name.startswith("aot-cost")
        calls.append((prefetching, text.count("func.func @op")))
        return (None, "error: simulated") if prefetching else real(text, tgt, *a, **k)
    monkeypatch.setattr(cost, "try_compile", fails_first)
    nodes = _heavy_nodes()
    cache = CostCache(target, directory=str(tmp_path))
    got = measure_nodes(nodes, target, cache, cost.start_prefetch(nodes, target, cache))
    assert sorted(calls) == [(False, 3), (True, 1), (True, 2)]
    assert len(got) == 3 and all(c.iree_ms and c.iree_ms > 0 for c in got.values())


def test_the_probe_leaves_the_prefetched_signatures_to_the_prefetch(tmp_path, monkeypatch):
    """The heavy ops compile once, in the prefetch, which is also their coverage verdict;
    when the prefetch fails they are probed like the others."""
    from aot.partition import coverage
    from aot.partition.coverage import CoverageCache, probe_nodes

    target = get_target("cpu")
    probed = []
    real = coverage.try_compile
    monkeypatch.setattr(coverage, "try_compile", lambda text, *a, **k:
                        probed.append(text.count("func.func @probe")) or real(text, *a, **k))
    ep = torch.export.export(TwoConvs().eval(), (torch.randn(1, 8, 16, 16),))
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    heavy = _heavy_nodes()
    prefetch = cost.start_prefetch(heavy, target, CostCache(target, directory=str(tmp_path)))
    verdicts = probe_nodes(nodes, target, CoverageCache(target, directory=str(tmp_path)),
                           prefetch)
    assert probed == [len(verdicts) - 3]  # one probe compile, without the three heavy ops
    assert all(v.covered for v in verdicts.values())

    class Failed:  # a prefetch whose modules IREE rejected
        sigs = prefetch.sigs

        def covered(self):
            return set()
    probed.clear()
    again = probe_nodes(nodes, target, CoverageCache(target, directory=str(tmp_path / "b")),
                        Failed())
    assert probed == [len(again) - 3, 3] and again == verdicts

    class Half(Failed):  # one of its modules compiled: only the other's signatures are probed
        def covered(self):
            return set(prefetch.sigs[:1])
    probed.clear()
    third = probe_nodes(nodes, target, CoverageCache(target, directory=str(tmp_path / "c")),
                        Half())
    assert probed == [len(third) - 3, 2] and third == verdicts


def test_the_prefetch_splits_its_signatures_into_modules_compiled_side_by_side(tmp_path):
    """Each signature is in one module, the modules about equally heavy; every one is
    timed from its own module (the same costs as measured one module per signature)."""
    target = get_target("cpu")
    heavy = _heavy_nodes()
    prefetch = cost.start_prefetch(heavy, target, CostCache(target, directory=str(tmp_path)))
    parts = [part for part, _, _ in prefetch._parts]
    assert len(parts) == 2 and sorted(s for p in parts for s in p) == sorted(prefetch.sigs)
    assert prefetch.covered() == set(prefetch.sigs)
    ready = prefetch.take(set(prefetch.sigs))
    assert len({id(v) for v, _, _ in ready.values()}) == 2
    costs = cost.measure_nodes(heavy, target, CostCache(target, directory=str(tmp_path)),
                               prefetch)
    assert set(costs) == set(prefetch.sigs)
    assert all(c.aten_ms > 0 and c.iree_ms > 0 for c in costs.values())


def test_linears_and_convolutions_are_also_timed_as_the_prepacked_region_runs_them():
    """``cost._packed_ms``: MKL's packed linear and oneDNN's convolution on a reordered
    weight time as real kernels; a convolution of a 1x1 input (``addmm`` in that region)
    and other ops have no prepacked time."""
    from aot.fallback import prepack

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
            self.dw = torch.nn.Conv2d(16, 16, 3, groups=16)
            self.point = torch.nn.Conv2d(16, 4, 1)
            self.fc = torch.nn.Linear(16, 32)

        def forward(self, x):
            y = self.dw(self.conv(x))
            z = self.point(y.mean((2, 3), keepdim=True))
            return self.fc(y.mean((2, 3))), torch.relu(z)
    ep = torch.export.export(M(), (torch.randn(2, 8, 32, 32),))
    times = {n.name: cost._packed_ms(n) for n in ep.graph.nodes if n.op == "call_function"}
    if not prepack.available():
        pytest.skip("this torch build has no oneDNN prepacked kernels")
    assert times["conv2d"] > 0 and times["conv2d_1"] > 0 and times["linear"] > 0
    assert times["conv2d_2"] is None and times["relu"] is None


def test_prepacked_times_are_added_to_measured_costs_only_when_asked(tmp_path, monkeypatch):
    """``measure_packed`` fills in the prepacked time of linears and convolutions whose
    ATen time is cached, once; an op with no cached cost is left alone."""
    from aot.partition.cost import Cost, measure_packed
    from aot.partition.signatures import op_signature
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)
            self.fc = torch.nn.Linear(16, 32)

        def forward(self, x):
            return self.fc(self.conv(x).mean((2, 3)))
    ep = torch.export.export(M(), (torch.randn(2, 8, 16, 16),))
    conv, fc = [n for n in ep.graph.nodes if n.op == "call_function"
                and n.target in cost._PACKED_OPS]
    cache = CostCache(get_target("cpu"))
    cache.put(op_signature(conv), Cost(1.0, 2.0))
    measure_packed([conv, fc], cache)
    got = CostCache(get_target("cpu"))
    if cost._packed_ms(conv) is not None:
        assert got.get(op_signature(conv)).packed_ms > 0
    assert got.get(op_signature(conv)).aten_ms == 1.0
    assert got.get(op_signature(fc)) is None
