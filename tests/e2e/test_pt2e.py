"""PT2E-quantized models (torchao) against torchao's converted model (issue 17).

Each model is quantized with ``prepare_pt2e``/``convert_pt2e`` (``aot/models/pt2e.py``),
calibrated on generated data, compiled, and compared with the converted model:

- ``fallback="all"``: the converted graph's own ops, in ATen: bit-exact;
- ``fallback_ops=["aot_q", "quantized_decomposed"]``: the rewritten patterns
  (``aot.importer.pt2e``) as kernel calls: ATen's int8 kernels for requantized
  convs/linears, the converted model's own float math for float-result ones;
- ``placement="coverage"``: int8 arithmetic compiled by IREE;
- the default placement (each ``aot_q`` op where it measured faster).

The CNNs return their pooled features, a dequantized int8 tensor, so agreement is
counted in quantization steps there; a float output (logits, the transformer's
residual stream) gets the tolerance of one step of the last quantized activation
carried through the last linear. Where int8 arithmetic is compiled, one requantization
of each op rounds like the converted model's up to float rounding; a value that lands
on a rounding boundary can move one step, and deep models carry such steps on (the
measured numbers are next to each test).
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

import aot
from aot.reporting import kernel_call_ops

pytest.importorskip("torchvision")
pytest.importorskip("torchao")
from aot.models import pt2e  # noqa: E402

warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated")
KERNELS = ["aot_q", "quantized_decomposed"]
MODES = {"default": {}, "coverage": {"placement": "coverage"},
         "kernels": {"fallback_ops": KERNELS}, "all": {"fallback": "all"}}


@functools.cache
def _model(name: str, quantizer: str = "x86", dynamic: bool = False):
    kwargs = {"dynamic": True} if dynamic else {}
    if name == "transformer":
        kwargs["layers"] = 1  # compile time; two layers measure the same
    return getattr(pt2e, name)(quantizer=quantizer, **kwargs)


@functools.cache
def _compiled(name: str, mode: str, quantizer: str = "x86", dynamic: bool = False):
    converted, x = _model(name, quantizer, dynamic)
    return aot.compile(converted, (x,), **MODES[mode])


def _inputs(x: torch.Tensor, n: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [x] + [torch.randn(x.shape, generator=g) for _ in range(n)]


def _dequantize_node(node):
    """The ``dequantize_per_tensor`` a float value comes from (through views, dropout)."""
    while node.target != torch.ops.quantized_decomposed.dequantize_per_tensor.default:
        node = node.args[0]
    return node


def _feature_step(converted) -> float:
    out = next(n for n in converted.graph.nodes if n.op == "output")
    return float(_dequantize_node(out.args[0][0]).args[1])


def _last_linear_step(converted) -> float:
    """One step of the last linear's quantized input, through its weights (max row L1)."""
    lin = [n for n in converted.graph.nodes if n.target == torch.ops.aten.linear.default][-1]
    dq_w = lin.args[1]
    w = dq_w.target(*[getattr(converted, a.target) if getattr(a, "op", None) == "get_attr"
                      else a for a in dq_w.args])
    return float(_dequantize_node(lin.args[0]).args[1]) * float(w.abs().sum(1).max())


def _feature_steps(cm, converted, xs) -> torch.Tensor:
    step = _feature_step(converted)
    return torch.cat([((cm(x)[0] - converted(x)[0]).abs() / step).flatten() for x in xs])


def _check_int8_compiled(cm, weighted: str) -> None:
    """The convs/linears are ``aot_q`` ops decomposed into integer arithmetic
    (``aten.convolution``/``aten.matmul`` on int32), not dequantize + float op; all
    compiled, but for an integer op IREE failed on (kept in ATen, with IREE's reason)."""
    assert {k["op"] for k in kernel_call_ops(cm.manifest)} <= {"aten::convolution"}
    ops = {p["op"] for p in cm.manifest["placements"]}
    assert not any(o.startswith(("quantized_decomposed", "aot_q")) for o in ops), ops
    assert not ops & {"aten.conv2d.default", "aten.linear.default"}, ops
    assert weighted in cm.report()


# --- small models: every mode ---------------------------------------------------------

@pytest.mark.parametrize("quantizer", pt2e.QUANTIZERS)
def test_small_cnn_compiled_int8(quantizer):
    converted, x = _model("small_cnn", quantizer)
    cm = _compiled("small_cnn", "coverage", quantizer)
    _check_int8_compiled(cm, "aten.convolution.default")
    xs = _inputs(x)
    d = _feature_steps(cm, converted, xs)
    # measured (16 samples): x86 99.2% exact, the rest one step; arm (float features
    # after float-result convs) within 1.2e-7
    assert float(d.max()) <= 1 + 1e-4, f"{float(d.max())} steps"
    for xi in xs:
        torch.testing.assert_close(cm(xi)[1], converted(xi)[1], rtol=0,
                                   atol=_last_linear_step(converted))


@pytest.mark.parametrize("mode", ["kernels", "all", "default"])
def test_small_cnn_kernel_calls_and_default(mode):
    converted, x = _model("small_cnn")
    cm = _compiled("small_cnn", mode)
    calls = {k["op"] for k in kernel_call_ops(cm.manifest)}
    if mode == "kernels":
        assert {"aot_q::conv2d", "aot_q::conv2d_f32", "aot_q::max_pool2d",
                "aot_q::linear_f32"} <= calls, calls
    for xi in _inputs(x):
        out, ref = cm(xi), converted(xi)
        if mode == "all":  # the converted graph's own ops: bit-exact
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
        else:  # measured: 99.2% exact, the rest one step (kernels and default)
            d = (out[0] - ref[0]).abs() / _feature_step(converted)
            assert float(d.max()) <= 1 + 1e-4
            torch.testing.assert_close(out[1], ref[1], rtol=0, atol=_last_linear_step(converted))


def test_saved_artifact_runs_the_same(tmp_path):
    """The float-result ops' kernel calls (weights dequantized once) survive save/load."""
    converted, x = _model("small_cnn")
    cm = _compiled("small_cnn", "kernels")
    cm.save(str(tmp_path / "q.aot"))
    loaded = aot.load(str(tmp_path / "q.aot"))
    for a, b in zip(loaded(x), cm(x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# int8 activations compiled: test_small_cnn_compiled_int8[arm] (its head is a linear)
@pytest.mark.parametrize("quantizer,mode", [("x86", "coverage"), ("x86", "kernels"),
                                            ("x86", "all"), ("arm", "kernels"), ("arm", "all")])
def test_transformer(quantizer, mode):
    converted, x = _model("transformer", quantizer)
    cm = _compiled("transformer", mode, quantizer)
    if mode == "coverage":
        _check_int8_compiled(cm, "aten.matmul.default")
    if mode == "kernels":
        calls = {k["op"] for k in kernel_call_ops(cm.manifest)}
        assert {"aot_q::linear", "aot_q::linear_f32"} <= calls, calls
    # measured (16 samples): coverage max 4.8e-7 (float rounding of the float-result
    # linears); kernels and all bit-exact
    atol = 0 if mode == "all" else _last_linear_step(converted)
    for xi in _inputs(x):
        torch.testing.assert_close(cm(xi), converted(xi), rtol=0, atol=atol)


def test_transformer_default_placement():
    converted, x = _model("transformer")
    cm = _compiled("transformer", "default")
    for k in kernel_call_ops(cm.manifest):  # kept in ATen only where ATen measured faster
        assert k["op"].startswith("aot_q::") and "faster" in k["reason"], k
    for xi in _inputs(x):
        torch.testing.assert_close(cm(xi), converted(xi), rtol=0,
                                   atol=_last_linear_step(converted))


@pytest.mark.parametrize("mode", ["default", "coverage"])
def test_dynamic_linear_quantization(mode):
    """choose_qparams at run time: no static pattern to rewrite; the Q/DQ ops run as
    kernel calls and the float linears compile."""
    converted, x = _model("transformer", dynamic=True)
    cm = _compiled("transformer", mode, dynamic=True)
    calls = {k["op"] for k in kernel_call_ops(cm.manifest)}
    assert "quantized_decomposed::choose_qparams" in calls, calls
    for xi in _inputs(x):  # measured: max 2.4e-7 (the float linears compiled)
        torch.testing.assert_close(cm(xi), converted(xi), rtol=1e-5, atol=1e-5)


# --- ResNet18 and MobileNetV2 ----------------------------------------------------------

# Measured over 16 samples (docs/quantization.md, "PT2E"): features within one step, exact, max steps.
# ResNet18: coverage 95.6%, 93.0%, 19; kernels 91.4%, 86.2%, 19.
# MobileNetV2: coverage 94.9%, 94.0%, 34; kernels 84.0%, 83.0%, 59 (ATen's depthwise
# int8 kernel is up to 28 steps off the converted model's math on rare elements).
# Per op, the compiled decompositions round as the converted model does (0 of 1.05M
# MobileNetV2 conv outputs differ); end to end, a float-result conv's rounding (1e-6)
# that lands on a rounding boundary moves a value one step, and these random-weight
# models amplify it: the converted model itself moves by up to 19 (ResNet18) and 137
# (MobileNetV2) steps when its input moves by 1e-5.
CNN_AGREEMENT = {"coverage": 0.9, "kernels": 0.75}


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", [("resnet18", "coverage"), ("resnet18", "kernels"),
                                       ("resnet18", "all"), ("mobilenet_v2", "all")])
def test_cnn(name, mode):
    """(MobileNetV2 under coverage and kernel calls takes 2-3 min to compile cold: its
    figures are in the comment above, measured by hand, not in CI's budget.)"""
    converted, x = _model(name)
    cm = _compiled(name, mode)
    xs = _inputs(x)
    if mode == "all":  # the converted graph's own ops: bit-exact
        for xi in xs:
            torch.testing.assert_close(cm(xi), converted(xi), rtol=0, atol=0)
        return
    if mode == "coverage":
        _check_int8_compiled(cm, "aten.convolution.default")
    else:
        calls = {k["op"] for k in kernel_call_ops(cm.manifest)}
        assert {"aot_q::conv2d", "aot_q::conv2d_f32", "aot_q::linear_f32"} <= calls, calls
    d = _feature_steps(cm, converted, xs)
    assert float((d <= 1 + 1e-4).float().mean()) >= CNN_AGREEMENT[mode]
    top1 = sum(int((cm(xi)[1].argmax(-1) == converted(xi)[1].argmax(-1)).sum()) for xi in xs)
    assert top1 >= 0.75 * len(xs) * x.shape[0]
