"""Quantized models: the eager-quantized ResNet18 round trip and the TorchTensor boundary.

Two modes against eager quantized PyTorch:
- ATen fallback (every ``aot_q`` op forced to ATen's quantized kernels): bit-exact;
- compiled int8 (`placement="coverage"`): bit-exact too (the decompositions round as
  ATen's kernels do); the default placement picks per op where each runs faster.
"""

import warnings

import pytest
import torch
import torch.ao.quantization as tq

import aot
from aot.reporting import kernel_call_ops

pytest.importorskip("torchvision")
from aot.models.quantized_resnet18 import quantized_resnet18  # noqa: E402

warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated")
AOT_Q_OPS = ["aot_q.quantize", "aot_q.dequantize", "aot_q.conv2d", "aot_q.linear", "aot_q.add",
             "aot_q.cat", "aot_q.max_pool2d", "aot_q.adaptive_avg_pool2d"]


@pytest.fixture(autouse=True)
def restore_engine():
    engine = torch.backends.quantized.engine
    yield
    torch.backends.quantized.engine = engine


@pytest.fixture(scope="module")
def qresnet_x86():
    engine = torch.backends.quantized.engine
    try:
        return quantized_resnet18("x86", batch=2)
    finally:
        torch.backends.quantized.engine = engine


def _inputs(n, batch=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 3, 224, 224, generator=g) for _ in range(n)]


@pytest.mark.parametrize("backend", ["x86", "qnnpack"])
def test_quantized_resnet18_aten_fallback_is_bit_exact(backend):
    if backend not in torch.backends.quantized.supported_engines:
        pytest.skip(f"engine {backend} not in this torch build")
    model, (x,) = quantized_resnet18(backend, batch=2)
    cm = aot.compile(model, (x,), fallback_ops=AOT_Q_OPS)
    for xi in [x, *_inputs(2)]:
        torch.testing.assert_close(cm(xi), model(xi), rtol=0, atol=0)
    ops = {k["op"] for k in kernel_call_ops(cm.manifest)}
    assert {"aot_q::conv2d", "aot_q::add", "aot_q::linear"} <= ops
    # quantized operands are described as quint8 with their qparams; where one crosses
    # the boundary (a group's result here) it crosses as a real quantized tensor
    conv = next(k for k in kernel_call_ops(cm.manifest) if k["op"] == "aot_q::conv2d")
    x = next(o for o in conv["operands"] if o["name"] == "x")
    assert x["spec"]["dtype"] == "quint8" and x["spec"]["qparams"]["scale"] > 0
    assert conv["results"][0]["dtype"] == "quint8"
    crossing = [r for k in cm.manifest["kernel_calls"] for r in k["results"] + k["inputs"]]
    assert any(r["dtype"] == "quint8" and r["qparams"] for r in crossing)
    if backend == "x86":  # per-channel weights
        assert model.conv1.weight().qscheme() == torch.per_channel_affine
    else:
        assert model.conv1.weight().qscheme() == torch.per_tensor_affine


def test_quantized_resnet18_compiled_int8_agrees(qresnet_x86):
    model, (x,) = qresnet_x86
    cm = aot.compile(model, (x,), placement="coverage")  # every aot_q op as integer arithmetic
    placed = {p["op"].split(".")[0] for p in cm.manifest["placements"] if p["where"] == "compiled"}
    assert "aten" in placed and not any(k["op"].startswith("aot_q") for k in kernel_call_ops(cm.manifest))
    for xi in _inputs(8):  # the decompositions round as ATen's kernels do: bit-exact
        torch.testing.assert_close(cm(xi), model(xi), rtol=0, atol=0)


def test_fallback_ops_choose_per_op_and_report_shows_it(qresnet_x86):
    model, (x,) = qresnet_x86
    cm = aot.compile(model, (x,), fallback_ops=["aot_q.add"], placement="coverage")
    calls = {k["op"] for k in kernel_call_ops(cm.manifest)}
    assert calls == {"aot_q::add"}
    rep = cm.report()
    assert "aot_q.add.default" in rep and "forced by fallback_ops" in rep
    assert "aten.convolution" in rep  # the convs were compiled (integer arithmetic)
    ref, out = model(x), cm(x)
    assert ((out - ref).abs() <= 2 * float(model.fc.scale) + 1e-6).float().mean() >= 0.999


def test_quantized_artifact_round_trip(tmp_path, qresnet_x86):
    model, (x,) = qresnet_x86
    cm = aot.compile(model, (x,), fallback_ops=["aot_q.conv2d"])
    path = tmp_path / "q.aot"
    cm.save(str(path))
    cm2 = aot.load(str(path))
    torch.testing.assert_close(cm2(x), cm(x), rtol=0, atol=0)


class _QuantizedIO(torch.nn.Module):
    """Quantized tensors in and out (no Quant/DeQuant stubs): conv + add_relu + pool."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.add = torch.ao.nn.quantized.FloatFunctional()
        self.pool = torch.nn.MaxPool2d(2)

    def forward(self, x):
        return self.pool(self.add.add_relu(self.conv(x), x))


def _eager_quantize(m, calibration):
    """x86 eager-mode quantization: prepare, calibrate on ``calibration``, convert."""
    torch.backends.quantized.engine = "x86"
    m = m.eval()
    m.qconfig = tq.get_default_qconfig("x86")
    tq.prepare(m, inplace=True)
    m(calibration)
    tq.convert(m, inplace=True)
    return m


def _quantized_io_model():
    # calibrate: observers see float data; the converted model takes quint8
    m = _eager_quantize(_QuantizedIO(), torch.randn(2, 4, 8, 8))
    xq = torch.quantize_per_tensor(torch.randn(2, 4, 8, 8), 0.05, 10, torch.quint8)
    return m, xq


def test_quantized_inputs_and_outputs_keep_dtype_qparams_and_layout():
    m, xq = _quantized_io_model()
    ref = m(xq)
    cm = aot.compile(m, (xq,), fallback="all")
    out = cm(xq)
    assert out.dtype == torch.quint8 and out.q_scale() == ref.q_scale()
    assert out.q_zero_point() == ref.q_zero_point()
    assert torch.equal(out.int_repr(), ref.int_repr())
    spec = cm.manifest["inputs"][0]
    assert spec["dtype"] == "quint8" and spec["qparams"]["zero_point"] == 10
    # channels-last in gives what eager gives
    xcl = xq.contiguous(memory_format=torch.channels_last)
    ref_cl = m(xcl)
    cm_cl = aot.compile(m, (xcl,), fallback="all")
    out_cl = cm_cl(xcl)
    assert out_cl.stride() == ref_cl.stride() and torch.equal(out_cl.int_repr(), ref_cl.int_repr())


def test_quantized_input_mismatches_are_clear_errors():
    m, xq = _quantized_io_model()
    cm = aot.compile(m, (xq,), fallback="all")
    with pytest.raises(aot.InputMismatch, match="dtype mismatch: expected quint8"):
        cm(xq.dequantize())
    other = torch.quantize_per_tensor(xq.dequantize(), 0.1, 10, torch.quint8)
    with pytest.raises(aot.InputMismatch, match="quantization parameters mismatch"):
        cm(other)


def test_unsupported_quantized_module_is_a_clear_error():
    class Emb(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)

        def forward(self, i):
            return self.emb(i)

    m = Emb().eval()
    m.emb.qconfig = tq.float_qparams_weight_only_qconfig
    tq.prepare(m, inplace=True)
    tq.convert(m, inplace=True)
    with pytest.raises(aot.UnsupportedOp, match="'emb'"):
        aot.compile(m, (torch.tensor([[1, 2, 3]]),))


class _QuantConv(torch.nn.Module):
    """quant -> conv -> dequant, for eager-mode quantization."""

    def __init__(self):
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.dequant(self.conv(self.quant(x)))


def test_functional_op_on_quantized_tensor_is_modelled():
    class M(_QuantConv):
        def forward(self, x):
            y = self.conv(self.quant(x))
            return self.dequant(torch.relu(y))  # quantized relu: clamps at the zero point

    m = _eager_quantize(M(), torch.randn(2, 3, 8, 8))
    assert m.conv.zero_point != 0  # relu on the integers themselves would change nothing
    cm = aot.compile(m, (torch.randn(2, 3, 8, 8),), fallback_ops=["aot_q"])
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(cm(x), m(x), rtol=0, atol=0)
    assert "aot_q.relu" in cm.report()


def test_unmodelled_op_on_quantized_tensor_is_refused_not_wrong():
    class Up(torch.nn.Module):
        def forward(self, y):
            return torch.nn.functional.interpolate(y, scale_factor=2.0, mode="bilinear")

    class M(_QuantConv):
        def __init__(self):
            super().__init__()
            self.up = Up()

        def forward(self, x):
            return self.dequant(self.up(self.conv(self.quant(x))))

    m = _eager_quantize(M(), torch.randn(2, 3, 8, 8))
    with pytest.raises(aot.UnsupportedOp) as e:
        aot.compile(m, (torch.randn(2, 3, 8, 8),))
    msg = str(e.value)
    assert "F.interpolate on a quantized tensor or weight in module 'up' (Up)" in msg
    assert "does not model it" in msg and "test_quantized.py:" in msg  # the user's line


class _QDQ(torch.nn.Module):
    """A Q/DQ graph: quint8 values appear in the export (IREE's importer cannot take them)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        q = torch.quantize_per_tensor(self.lin(x), 0.05, 12, torch.quint8)
        return torch.relu(q.dequantize()) * 2


@pytest.mark.parametrize("mode", ["auto", "all"])
def test_qdq_graph_imports_and_matches_eager(mode):
    m, x = _QDQ().eval(), torch.randn(4, 8)
    cm = aot.compile(m, (x,), fallback=mode)
    ref = m(x)
    if mode == "all":  # ATen's quantize/dequantize: bit-exact
        torch.testing.assert_close(cm(x), ref, rtol=0, atol=0)
    else:  # compiled rounding may differ at ties: at most one step (0.05 * 2)
        torch.testing.assert_close(cm(x), ref, rtol=0, atol=0.1 + 1e-6)
    ops = {p["op"] for p in cm.manifest["placements"]}
    assert not any("quantize_per_tensor" in o for o in ops)


def test_qdq_with_qint8_is_a_clear_error():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.quantize_per_tensor(x, 0.1, 0, torch.qint8).dequantize()

    with pytest.raises(aot.UnsupportedOp, match="quantize_per_tensor to torch.qint8"):
        aot.compile(M(), (torch.randn(3),))


def test_pt2e_quantized_decomposed_ops_compile():
    pytest.importorskip("torch.ao.quantization.fx._decomposed")
    qd = torch.ops.quantized_decomposed

    class M(torch.nn.Module):
        def forward(self, x):
            q = qd.quantize_per_tensor.default(x, 0.02, 3, 0, 255, torch.uint8)
            return qd.dequantize_per_tensor.default(q, 0.02, 3, 0, 255, torch.uint8) + 1

    m, x = M(), torch.randn(2, 16)
    # coverage: what is tested is that they compile (the default placement may measure
    # this tiny program faster as one ATen region, as it did on a 2-core AVX2 EPYC)
    cm = aot.compile(m, (x,), placement="coverage")
    assert not kernel_call_ops(cm.manifest)  # decomposed and compiled
    torch.testing.assert_close(cm(x), m(x), rtol=0, atol=0.02 + 1e-6)
    torch.testing.assert_close(aot.compile(m, (x,), fallback="all")(x), m(x), rtol=0, atol=0)


def test_default_placement_keeps_quantized_convs_where_they_measure_faster(qresnet_x86):
    model, (x,) = qresnet_x86
    cm = aot.compile(model, (x,))
    region = cm.manifest["region"]  # quantized convolutions make the region worth measuring
    # the measured decision: the fastest, unless within the noise of an earlier candidate
    from aot.tuning.regions import choice
    assert region["chosen"] == choice(region)
    if region["chosen"] in ("iree", "iree-sync"):  # per op: each where it measured faster
        for k in kernel_call_ops(cm.manifest):
            assert k["op"].startswith("aot_q::")
            assert k["reason"].startswith("ATen's kernel is faster here")
    else:  # the whole program measured faster as one ATen region
        for p in cm.manifest["placements"]:
            assert p["where"] == "kernel_call" and p["reason"].startswith("one ATen region")
    ref, out = model(x), cm(x)
    assert ((out - ref).abs() <= float(model.fc.scale) + 1e-6).float().mean() >= 0.999


def test_the_artifact_runs_under_the_engine_recorded_at_compile(tmp_path):
    """The engine is part of the artifact: compiled under qnnpack, it answers as eager
    qnnpack does (bit for bit) when the global engine is x86 at call and at load."""
    from aot.artifact import CompiledArtifact
    from aot.runtime.module import CompiledModule

    if "qnnpack" not in torch.backends.quantized.supported_engines:
        pytest.skip("engine qnnpack not in this torch build")
    model, (x,) = quantized_resnet18("qnnpack", batch=2)
    inputs = [x] + _inputs(2)
    with torch.no_grad():
        want = [model(xi) for xi in inputs]
    cm = aot.compile(model, (x,), fallback="all")
    assert cm.manifest["executor"]["quantized_engine"] == "qnnpack"
    assert "under the qnnpack engine" in cm.report()
    path = tmp_path / "qnnpack.aot"
    cm.save(str(path))
    torch.backends.quantized.engine = "x86"
    loaded = aot.load(str(path))
    for m in (cm, loaded):
        for xi, w in zip(inputs, want):
            torch.testing.assert_close(m(xi), w, rtol=0, atol=0)
    assert torch.backends.quantized.engine == "x86"  # calls left the global engine alone
    a = cm.artifact
    bad = CompiledArtifact(a.vmfb, {**a.manifest, "executor": {
        **a.manifest["executor"], "quantized_engine": "no-such-engine"}}, a.constants)
    with pytest.raises(aot.ArtifactError, match="no-such-engine"):
        CompiledModule(bad)


def test_a_quantized_submodule_forward_never_calls_is_left_out():
    class M(_QuantConv):
        def __init__(self):
            super().__init__()
            self.unused = torch.nn.Conv2d(4, 4, 1)  # quantized by convert, never called

    m = _eager_quantize(M(), torch.randn(2, 3, 8, 8))
    cm = aot.compile(m, (torch.randn(2, 3, 8, 8),), fallback_ops=["aot_q"])
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(cm(x), m(x), rtol=0, atol=0)  # int8 kernels: bit-exact
