"""ATen groups run as one oneDNN Graph program (``ExecOptions(onednn_graph=True)``)."""

import os
import warnings

import pytest
import torch

import aot
from aot.errors import ArtifactError
from aot.fallback import onednn_graph
from aot.fallback.executor import ExecOptions
from aot.fallback.onednn_graph import FusedGraph
from aot.runtime.module import CompiledModule
from aot.tuning.regions import _with_executor, aten_candidates

pytestmark = pytest.mark.skipif(not onednn_graph.available(),
                                reason="this torch build reaches no oneDNN Graph (x86 only)")


class Net(torch.nn.Module):
    """What oneDNN Graph fuses (convolution + bias + activation, + residual add, a
    depthwise convolution, pooling, a linear + activation) and what it does not
    (squeeze-excitation's pooled scaling, a view), with two results."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = torch.nn.Conv2d(16, 16, 1)
        self.se1 = torch.nn.Conv2d(16, 4, 1)
        self.se2 = torch.nn.Conv2d(4, 16, 1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.nn.functional.hardswish(self.stem(x))
        y = torch.relu(self.pw(torch.relu(self.dw(x))) + x)
        s = torch.sigmoid(self.se2(torch.relu(self.se1(y.mean((2, 3), keepdim=True)))))
        y = torch.nn.functional.max_pool2d(y * s, 2)
        return torch.nn.functional.gelu(self.fc(y.mean((2, 3)))), y


def _graph_module(m, x):
    """``m`` as one ATen region run as a oneDNN graph."""
    allm = aot.compile(m, (x,), fallback="all")
    return CompiledModule(_with_executor(allm.artifact, ExecOptions(onednn_graph=True)))


def _group(cm):
    return cm.host.functions[cm.manifest["kernel_calls"][0]["key"]]


def test_group_runs_as_fused_onednn_graph_and_matches_eager():
    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(1, 3, 32, 32)
    cm = _graph_module(m, x)
    with torch.no_grad():
        for i in range(3):  # the first call traces and fuses; later ones run the graph
            xi = x if i == 0 else torch.randn(1, 3, 32, 32)
            got, ref = cm(xi), m(xi)
            for g, r in zip(got, ref):
                # oneDNN accumulates in another order: float rounding only
                torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    graph = _group(cm).graph
    assert graph.failed is None and graph.traced is not None
    fused = str(graph.traced.graph_for(*[torch.randn(1, 3, 32, 32)]))
    assert "prim::oneDNNFusionGroup" in fused  # oneDNN compiled partitions


def test_onednn_graph_survives_save_and_load(tmp_path):
    torch.manual_seed(1)
    m = Net().eval()
    x = torch.randn(1, 3, 32, 32)
    cm = _graph_module(m, x)
    path = os.path.join(tmp_path, "m.aot")
    cm.save(path)
    loaded = aot.load(path)
    assert loaded.exec_options.onednn_graph
    with torch.no_grad():
        for g, r in zip(loaded(x), m(x)):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    assert _group(loaded).graph.traced is not None


def test_a_trace_that_would_bake_a_tensor_value_is_dropped():
    def run(ops):  # reads a value out of a tensor: a trace would freeze it
        return [ops[0] * float(ops[0].sum()) + ops[1]]

    const = torch.ones(3)
    g = FusedGraph(run, [None, const], "group(test)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and nothing leaks a warning to the caller
        a, b = torch.arange(3.0), torch.full((3,), 2.0)
        assert torch.equal(g([a])[0], a * 3.0 + 1)
        assert g.traced is None and "TracerWarning" in g.failed
        assert torch.equal(g([b])[0], b * 6.0 + 1)  # the plain members, every call


def test_a_trace_restores_the_fusion_switch():
    before = torch._C._jit_llga_enabled()
    g = FusedGraph(lambda ops: [torch.relu(ops[0])], [None], "group(test)")
    x = torch.randn(4)
    assert torch.equal(g([x])[0], torch.relu(x))
    assert g.traced is not None and torch._C._jit_llga_enabled() == before


def test_executor_entry_is_checked_on_load():
    assert ExecOptions.from_json({"onednn_graph": True}).onednn_graph
    assert not ExecOptions.from_json({}).onednn_graph
    assert "onednn_graph" not in ExecOptions().to_json()  # older artifacts unchanged
    with pytest.raises(ArtifactError, match="onednn_graph"):
        ExecOptions.from_json({"onednn_graph": "yes"})


def test_programs_with_enough_kernels_get_the_candidate():
    from aot.stages import export
    from aot.toolchain.targets import get_target
    from aot.passes.prepare import prepare
    from aot.partition.placement import PlacementPolicy
    from aot.tuning.regions import GRAPH_MIN_KERNELS

    def candidates(m):
        imported = export(m.eval(), (torch.randn(1, 3, 32, 32),)).imported
        imported, _ = prepare(imported, PlacementPolicy())
        return aten_candidates(imported, get_target("cpu"))

    torch.manual_seed(2)
    deep = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                               *[torch.nn.Conv2d(8, 8, 3, padding=1)
                                 for _ in range(GRAPH_MIN_KERNELS - 1)])
    cands = candidates(deep)
    assert "aten-onednn-graph" in cands and "aten-prepacked" in cands
    assert cands["aten-onednn-graph"].manifest.executor["onednn_graph"] is True
    # six kernels: the host's cost of six calls is not worth the candidate's compile
    assert "aten-onednn-graph" not in candidates(Net())


def test_a_fused_graph_that_disagrees_with_the_kernel_calls_is_dropped(monkeypatch):
    real_trace = torch.jit.trace

    class Wrong:  # the real trace's graph, another function's results
        def __init__(self, traced):
            self.graph = traced.graph

        def __call__(self, *xs):
            return (torch.relu(xs[0]) + 1e-2,)

    def wrong_trace(fn, inputs, **kw):  # runs the kernel calls, as a trace does
        return Wrong(real_trace(fn, inputs, **kw))

    monkeypatch.setattr(torch.jit, "trace", wrong_trace)
    g = FusedGraph(lambda ops: [torch.relu(ops[0])], [None], "group(test)")
    x = torch.randn(64)
    assert torch.equal(g([x])[0], torch.relu(x))
    assert g.traced is None and "disagrees" in g.failed and "away" in g.failed
    assert torch.equal(g([-x])[0], torch.relu(-x))  # the kernel calls from then on


def test_disagreement_allows_float_rounding_only():
    a = torch.randn(100) * 50
    assert onednn_graph.disagreement((a,), (a * (1 + 1e-6),)) is None
    assert "away" in onednn_graph.disagreement((a,), (a + 1.0,))
    assert "not torch.float32" in onednn_graph.disagreement((a,), (a.double(),))
    assert "results" in onednn_graph.disagreement((a,), (a, a))
    i = torch.arange(5)
    assert onednn_graph.disagreement((i,), (i.clone(),)) is None
    assert "differs" in onednn_graph.disagreement((i,), (i + 1,))
    nan = torch.tensor([float("nan"), 1.0])
    assert onednn_graph.disagreement((nan,), (nan.clone(),)) is None


def test_threads_calling_one_graph_get_their_own_answers():
    import concurrent.futures

    torch.manual_seed(3)
    m = Net().eval()
    cm = _graph_module(m, torch.randn(1, 3, 32, 32))
    xs = [torch.randn(1, 3, 32, 32) for _ in range(8)]
    with torch.no_grad():
        refs = [m(x) for x in xs]

    def run(i):  # the first calls race to trace: one traces, the others wait for it
        with torch.no_grad():
            return [cm(xs[(i + k) % 8]) for k in range(6)]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(4)))
    for i, outs in enumerate(results):
        for k, got in enumerate(outs):
            for g, r in zip(got, refs[(i + k) % 8]):
                torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    assert _group(cm).graph.traced is not None


def test_a_layer_scale_after_a_linear_is_folded_into_it():
    """oneDNN Graph fails to fuse a linear with an elementwise op on a constant (the
    trace would be dropped): the scale and the shift are folded into the linear."""
    aten = torch.ops.aten
    torch.manual_seed(4)
    w, b, gamma, shift = torch.randn(64, 64), torch.randn(64), torch.randn(64), torch.randn(1, 1, 64)

    def block(ops):  # x + gamma * linear(x), then a shift, then the same without a bias
        y = aten.add.Tensor(ops[0], aten.mul.Tensor(aten.linear.default(ops[0], w, b), gamma))
        y = aten.add.Tensor(aten.linear.default(y, w, b), shift)
        return [aten.mul.Tensor(gamma, aten.linear.default(y, w))]

    g = FusedGraph(block, [None], "group(test)")
    x = torch.randn(1, 49, 64)
    with torch.no_grad():
        for xi in (x, torch.randn(1, 49, 64)):
            torch.testing.assert_close(g([xi])[0], block([xi])[0], rtol=1e-4, atol=1e-3)
    assert g.failed is None
    kinds = [n.kind() for n in g.traced.graph.nodes()]
    assert kinds.count("aten::linear") == 3 and "aten::mul" not in kinds


def test_a_constant_added_to_a_product_along_its_rows_is_passed_as_an_input():
    """A position embedding added after a linear cannot be folded into its bias, and
    oneDNN Graph fails to fuse an op on a constant into the product: it is passed to
    the traced graph as an input instead."""
    aten = torch.ops.aten
    torch.manual_seed(5)
    w, b, pos = torch.randn(32, 16), torch.randn(32), torch.randn(1, 10, 32)

    def embed(ops):  # linear + position embedding (a constant slot), then a ReLU
        return [aten.relu.default(aten.add.Tensor(aten.linear.default(ops[0], w, b), ops[1]))]

    g = FusedGraph(embed, [None, pos], "group(test)")
    with torch.no_grad():
        for x in (torch.randn(1, 10, 16), torch.randn(1, 10, 16)):
            torch.testing.assert_close(g([x])[0], embed([x, pos])[0], rtol=1e-4, atol=1e-4)
    assert g.failed is None and g.lifted == (1,) and g.lifted_values[0] is pos
    assert "prim::oneDNNFusionGroup" in str(g.traced.graph_for(torch.randn(1, 10, 16), pos))


def test_a_scale_of_more_dimensions_than_the_linear_is_not_folded():
    aten = torch.ops.aten
    w, gamma = torch.randn(8, 8), torch.randn(1, 1, 1, 8)  # broadcasts [4, 8] to [1, 1, 4, 8]

    def f(ops):
        return [aten.mul.Tensor(aten.linear.default(ops[0], w), gamma)]

    g = FusedGraph(f, [None], "group(test)")
    x = torch.randn(4, 8)
    with torch.no_grad():
        got = g([x])[0]
    assert got.shape == (1, 1, 4, 8)
    torch.testing.assert_close(got, f([x])[0], rtol=1e-5, atol=1e-5)


def test_channels_last_trace_keeps_only_the_layout_copies_that_do_work():
    """Traced channels-last, each op's NHWC conversion is a no-op once every op returns
    NHWC: those are removed (partitions then pass oneDNN's layouts along), except on
    the group's input and before the depthwise convolution (oneDNN Graph would fuse
    it with the convolution before it and run its reference kernel)."""
    torch.manual_seed(6)
    m = Net().eval()
    x = torch.randn(1, 3, 32, 32)
    allm = aot.compile(m, (x,), fallback="all")
    cm = CompiledModule(_with_executor(allm.artifact,
                                       ExecOptions("channels_last", onednn_graph=True)))
    with torch.no_grad():
        for xi in (x, torch.randn(1, 3, 32, 32)):
            for g, r in zip(cm(xi), m(xi)):
                torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    graph = _group(cm).graph
    assert graph.failed is None
    inputs = set(graph.traced.graph.inputs())
    kept = [n for n in graph.traced.graph.nodes() if n.kind() == "aten::contiguous"]
    # the weights' conversions (constants: TorchScript folds them), the input's, and
    # the one before the depthwise convolution
    activations = [n for n in kept if n.inputsAt(0).node().kind() != "prim::Constant"]
    assert len(activations) == 2
    for n in activations:
        users = [u.user for u in n.output().uses()]
        assert n.inputsAt(0) in inputs or any(
            onednn_graph._grouped_convolution(u) for u in users), n


def test_views_that_end_where_they_started_are_dropped_so_the_activation_fuses():
    """A folded normalisation's flatten and unflatten around a linear (LeViT's) end
    oneDNN Graph's fusion of the linear with the activation after them: the chain of
    views is replaced by its start; a view that changes the shape stays."""
    aten = torch.ops.aten
    torch.manual_seed(7)
    w, b, w2 = torch.randn(32, 16), torch.randn(32), torch.randn(8, 32)

    def block(ops):  # linear, flatten, unflatten, hardswish; then a real reshape
        y = aten.view.default(aten.view.default(aten.linear.default(ops[0], w, b), [10, 32]),
                              [1, 10, 32])
        return [aten.view.default(aten.linear.default(aten.hardswish.default(y), w2), [80])]

    g = FusedGraph(block, [None], "group(test)")
    with torch.no_grad():
        for x in (torch.randn(1, 10, 16), torch.randn(1, 10, 16)):
            torch.testing.assert_close(g([x])[0], block([x])[0], rtol=1e-4, atol=1e-4)
    assert g.failed is None
    kinds = [n.kind() for n in g.traced.graph.nodes()]
    assert kinds.count("aten::view") == 1  # the last one: [1, 10, 8] to [80]
    fused = g.traced.graph_for(torch.randn(1, 10, 16))
    groups = [n.g("Subgraph") for n in fused.findAllNodes("prim::oneDNNFusionGroup")]
    assert any({"aten::linear", "aten::hardswish"} <= {k.kind() for k in sub.nodes()}
               for sub in groups)
