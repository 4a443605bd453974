"""The StableHLO path: ``export_stablehlo`` / ``--emit stablehlo`` and ``via="stablehlo"``.

- Emitted StableHLO has no Torch-dialect op; each op outside StableHLO is a
  ``stablehlo.custom_call`` whose ``backend_config`` is parsed back here into the ATen
  call it stands for, run on the custom call's own operands and compared with eager.
- Compiled through StableHLO: models against eager (float32 rtol 1e-4 / atol 1e-4:
  IREE reassociates sums), bit-exact where every op runs in ATen (the dummy mode, and
  quantized ResNet18 in fallback mode).
"""

import json
import subprocess
import sys
import warnings

import pytest
import torch

import aot
from aot.fallback.bound import BoundCall
from aot.fallback.spec import KernelCallSpec, resolve_op
from aot.toolchain import stablehlo
from aot.partition.decisions import op_nodes

pytestmark = pytest.mark.skipif(not stablehlo.available(),
                                reason="torch-mlir is not installed (pip install 'aot[stablehlo]')")
warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated")

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_op_corpus import CASES  # noqa: E402


class Statics(torch.nn.Module):
    """Non-tensor operands of every kind the contract writes down."""

    def forward(self, x):
        y = torch.nn.functional.layer_norm(x, (16,), eps=1e-3) * float("inf")
        z = torch.clamp(y.to(torch.float64), min=None, max=2.0)
        s = z.sum(dim=[0], keepdim=True, dtype=torch.float32)
        w = x.new_zeros((2, 3), device="cpu").contiguous(memory_format=torch.contiguous_format)
        return s, w, torch.nan_to_num(y, nan=float("nan"), posinf=-1.5)


def _dtype(t: str) -> torch.dtype:
    elem = t.removesuffix(">").split("x")[-1].removeprefix("tensor<")
    return {"f32": torch.float32, "f64": torch.float64, "i64": torch.int64,
            "i1": torch.bool, "i32": torch.int32}[elem]


def test_emitted_custom_calls_parse_back_into_the_aten_calls():
    """Every op forced out: each custom call's record names the op and its static
    operands; rebuilt with the operands it was passed, it computes what eager does."""
    m, x = Statics().eval(), torch.randn(4, 16)
    text = aot.export_stablehlo(m, (x,), fallback="all")
    assert "torch." not in "\n".join(ln for ln in text.splitlines() if "dense_resource" not in ln
                                     and "torch_tensor" not in ln)
    calls = stablehlo.custom_calls(text)
    ep = torch.export.export(m, (x,)).run_decompositions({})
    ops = op_nodes(ep)
    assert [c["target"] for c in calls] == [n.target._schema.name for n in ops]
    # replay the chain: every call's tensor operands are the previous results or x
    values = {n.name: None for n in ops}
    env = {"x": x}
    for node, call in zip(ops, calls):
        spec = KernelCallSpec.from_json(call["config"])
        assert spec.op == call["target"] and spec.location
        op = resolve_op(spec.op, spec.overload)
        assert op is node.target
        tensors = [env[a.name] for a in node.all_input_nodes]
        args, kwargs = BoundCall(spec, op, torch.device("cpu")).bind(tensors)
        got = op(*args, **kwargs)
        want = node.target(*[env[a.name] if isinstance(a, torch.fx.Node) else a for a in node.args],
                           **node.kwargs)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        env[node.name] = values[node.name] = got
        assert [str(t) for t in call["results"]] and _dtype(call["results"][0]) == got.dtype
    statics = [(c["target"], o["name"], o["value"]) for c in calls
               for o in c["config"]["operands"] if o["kind"] == "static"]
    for want in [("aten::layer_norm", "eps", 1e-3), ("aten::layer_norm", "normalized_shape",
                                                     {"list": [16]}),
                 ("aten::mul", "other", {"float": "inf"}), ("aten::clamp", "min", None),
                 ("aten::sum", "dtype", {"dtype": "float32"}),
                 ("aten::new_zeros", "device", {"device": "cpu"}),
                 ("aten::nan_to_num", "nan", {"float": "nan"}),
                 ("aten::nan_to_num", "posinf", -1.5)]:
        assert want in statics, (want, statics)


def test_weights_only_a_custom_call_reads_are_its_operands():
    m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8)).eval()
    x = torch.randn(2, 16)
    text = aot.export_stablehlo(m, (x,), fallback_ops=["aten.layer_norm"])
    (call,) = stablehlo.custom_calls(text)
    assert call["target"] == "aten::layer_norm"
    assert call["operands"] == ["tensor<2x8xf32>", "tensor<8xf32>", "tensor<8xf32>"]
    spec = KernelCallSpec.from_json(call["config"])
    assert spec.reason == "forced by fallback_ops" and spec.location


def test_cli_emits_stablehlo(tmp_path):
    out = tmp_path / "m.mlir"
    done = subprocess.run([sys.executable, "-m", "aot.cli", "compile", "aot/models/unlowerable.py:unlowerable_model",
                           "--emit", "stablehlo", "-o", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "stablehlo.dot_general" in text and "torch.aten" not in text
    (call,) = stablehlo.custom_calls(text)
    assert call["target"] == "aten::special_i0"


@pytest.mark.parametrize("case", sorted(CASES))
def test_dummy_mode_runs_the_corpus_bit_exact(case):
    """``via="stablehlo", fallback="all"``: every op its own custom call, through
    torch-mlir and IREE, run by the same kernel-call runtime: bit-exact with eager."""
    cls, make = CASES[case]
    torch.manual_seed(0)
    model, args = cls().eval(), make()
    cm = aot.compile(model, args, via="stablehlo", fallback="all")
    n_ops = len(cm.manifest["placements"])
    assert len(cm.manifest["kernel_calls"]) == n_ops and cm.manifest["via"] == "stablehlo"
    with torch.no_grad():
        want = model(*args)
    torch.testing.assert_close(cm(*args), want, rtol=0, atol=0, equal_nan=True)


def test_unlowerable_and_custom_ops_run_in_aten_between_stablehlo_code():
    from aot.models.custom_op import CustomOpModel
    from aot.models.unlowerable import unlowerable_model
    m, (x,) = unlowerable_model()
    torch.manual_seed(0)
    c = CustomOpModel().eval()
    y = torch.randn(3, 32)
    for model, inp, op in [(m, x, "aten.special_i0.default"),
                           (c, y, "aot_models.scaled_tanh.default")]:
        cm = aot.compile(model, (inp,), via="stablehlo", placement="coverage")
        calls = {p["op"]: p for p in cm.manifest["placements"] if p["where"] == "kernel_call"}
        assert set(calls) == {op}
        assert any(p["where"] == "compiled" for p in cm.manifest["placements"])
        torch.testing.assert_close(cm(inp), model(inp), rtol=1e-4, atol=1e-4)
        assert "path: StableHLO" in cm.report()


def test_an_op_torch_mlir_lowers_wrongly_runs_in_aten():
    class Rem(torch.nn.Module):
        def forward(self, i):
            return torch.remainder(i, 3) + i

    i = torch.arange(-7, 7)
    cm = aot.compile(Rem(), (i,), via="stablehlo", placement="coverage")
    (rem,) = [p for p in cm.manifest["placements"] if p["op"] == "aten.remainder.Scalar"]
    assert rem["where"] == "kernel_call" and "divisor's" in rem["reason"]
    torch.testing.assert_close(cm(i), Rem()(i), rtol=0, atol=0)


def test_an_op_without_a_stablehlo_lowering_falls_back_with_torch_mlirs_error():
    """topk: IREE lowers it from the Torch dialect; torch-mlir's StableHLO lowering
    of it fails (chlo.top_k's i32 indices): blamed, run in ATen, the error its reason."""
    class TopK(torch.nn.Module):
        def forward(self, x):
            return torch.topk(x * 2, 3).values.relu()

    x = torch.randn(4, 16)
    by_path = {}
    for via in ("torch", "stablehlo"):
        cm = aot.compile(TopK(), (x,), via=via, placement="coverage")
        by_path[via] = {p["op"]: p for p in cm.manifest["placements"]}
        torch.testing.assert_close(cm(x), TopK()(x), rtol=1e-6, atol=1e-6)
    topk = by_path["stablehlo"]["aten.topk.default"]
    assert topk["where"] == "kernel_call" and "chlo.top_k" in topk["reason"]
    assert by_path["stablehlo"]["aten.mul.Tensor"]["where"] == "compiled"


@pytest.mark.slow
class ConvNet(torch.nn.Module):
    """A 1x1, a 3x3, a strided depthwise 5x5 and a linear layer: each has a form IREE
    runs well (``compiled_forms``), which a portable export must not carry."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 16, 1)
        self.b = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.c = torch.nn.Conv2d(16, 16, 5, stride=2, padding=2, groups=16)
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x):
        y = self.c(torch.relu(self.b(self.a(x))))
        return self.fc(y.mean(dim=(2, 3)))


def test_the_portable_export_keeps_convolutions_as_written():
    """``export_stablehlo`` is for any StableHLO consumer: convolutions stay
    ``stablehlo.convolution`` (not IREE's matmul and multiply-add forms), the linear
    layer one ``dot_general``; nothing is measured, nothing falls back. Compiling
    through StableHLO with IREE still uses IREE's forms, and matches eager."""
    m, x = ConvNet().eval(), torch.randn(1, 8, 16, 16)
    text = aot.export_stablehlo(m, (x,))
    assert text.count("stablehlo.convolution") == 3
    assert text.count("stablehlo.dot_general") == 1 and "custom_call" not in text
    cli = subprocess.run([sys.executable, "-m", "aot.cli", "compile", "resnet18", "--emit",
                          "stablehlo"], capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.count("stablehlo.convolution") == 20  # every convolution of ResNet18
    cm = aot.compile(m, (x,), via="stablehlo", placement="coverage")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)


def test_resnet18_through_stablehlo():
    from aot.models.resnet18 import resnet18
    m, (x,) = resnet18()
    cm = aot.compile(m, (x,), via="stablehlo", placement="coverage")
    assert not cm.manifest["kernel_calls"]
    with torch.no_grad():
        want = m(x)
    torch.testing.assert_close(cm(x), want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_bert_encoder_through_stablehlo():
    from aot.models.bert import bert_encoder
    m, args = bert_encoder(seq=32)
    cm = aot.compile(m, args, via="stablehlo", placement="coverage")
    with torch.no_grad():
        want = m(*args)
    torch.testing.assert_close(cm(*args), want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_quantized_resnet18_fallback_mode_through_stablehlo():
    from aot.models.quantized_resnet18 import quantized_resnet18
    engine = torch.backends.quantized.engine
    try:
        m, (x,) = quantized_resnet18("x86", batch=2)
        cm = aot.compile(m, (x,), via="stablehlo", fallback_ops=["aot_q"], placement="coverage")
    finally:
        torch.backends.quantized.engine = engine
    q = [p for p in cm.manifest["placements"] if p["op"].startswith("aot_q.")]
    assert q and all(p["where"] == "kernel_call" for p in q)
    torch.testing.assert_close(cm(x), m(x), rtol=0, atol=0)


def test_save_and_load_keep_the_path(tmp_path):
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    x = torch.randn(2, 8)
    cm = aot.compile(m, (x,), via="stablehlo", fallback_ops=["aten.gelu"])
    cm.save(tmp_path / "m.aot")
    loaded = aot.load(str(tmp_path / "m.aot"))
    assert loaded.manifest["via"] == "stablehlo"
    torch.testing.assert_close(loaded(x), m(x), rtol=1e-5, atol=1e-5)
    assert json.dumps(loaded.manifest["kernel_calls"][0]["op"]) == '"aten::gelu"'


def test_an_unknown_via_is_a_clear_error():
    with pytest.raises(aot.CompileFailed, match="unknown via 'mhlo'"):
        aot.compile(torch.nn.ReLU(), (torch.randn(2),), via="mhlo")


def test_without_torch_mlir_the_path_is_a_clear_error(monkeypatch):
    for name in [m for m in sys.modules if m.startswith("torch_mlir")] + ["torch_mlir"]:
        monkeypatch.setitem(sys.modules, name, None)  # import torch_mlir... fails
    with pytest.raises(aot.CompileFailed, match=r"pip install 'aot\[stablehlo\]'") as e:
        aot.compile(torch.nn.ReLU(), (torch.randn(2),), via="stablehlo")
    assert e.value.stage == "options"
