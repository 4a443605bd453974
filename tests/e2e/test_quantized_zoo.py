"""torchvision's quantized zoo, eager-mode quantized, in both modes against eager int8.

One model of each architecture of ``torchvision.models.quantization`` at a small
resolution (``aot/models/quantized_zoo.py``: random weights, batch norms measured and
the model calibrated on generated data), the x86 config, and qnnpack's on three:

- ATen fallback (``fallback_ops=["aot_q"]``): bit-exact with eager int8;
- compiled int8, op by op: every ``aot_q`` op's decomposition (what IREE compiles)
  against ATen's quantized kernel on the model's own activations: bit-exact;
- compiled int8 end to end (``placement="coverage"``, every quantized op integer
  arithmetic compiled by IREE) on ResNet18, MobileNetV3-Large and GoogLeNet (x86)
  and ResNet18 (qnnpack: its fixed-point adds), 100 random inputs: bit-exact.

End to end, random-weight networks amplify a one-step difference (in eager int8
itself, moving one activation of MobileNetV2's first convolution by one step moves
71% of the logits by more than one step: docs/quantization.md), so bit-exact is
the only bar that holds across models: one output per ten million rounded otherwise
than ATen put ResNet50 at 94.7% of logits within one step. The rounding details that
took are tested one by one in ``tests/importer/test_int8_decompositions.py``. The
full-resolution sweep with latencies is a benchmark (``benchmarks/quantized_zoo.py``).
"""

import warnings

import pytest
import torch
import torch.ao.nn.quantized as nnq
from torch.overrides import TorchFunctionMode

import aot
from aot.fallback.quantized_ops import saturates
from aot.importer import int8_decompositions  # noqa: F401  (registers the aot_q ones)
from aot.importer.decompositions import IREE_DECOMPOSITIONS
from aot.importer.quantized import rewrite_eager_quantized
from aot.reporting import kernel_call_ops

pytest.importorskip("torchvision")
from aot.models.quantized_zoo import quantized_model  # noqa: E402

warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated")
warnings.filterwarnings("ignore", message=".*must run observer.*")

# one of each architecture (the ShuffleNetV2 widths and the two ResNeXts share theirs)
SIZES = {"googlenet": 64, "inception_v3": 80, "mobilenet_v2": 64, "mobilenet_v3_large": 64,
         "resnet18": 64, "resnet50": 64, "resnext101_32x8d": 32, "shufflenet_v2_x0_5": 64}


@pytest.fixture(autouse=True)
def restore_engine():
    engine = torch.backends.quantized.engine
    yield
    torch.backends.quantized.engine = engine


def _inputs(like: torch.Tensor, n: int, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(like.shape, generator=g) for _ in range(n)]


def _output_step(model) -> float:
    """The quantization step of the logits: the last quantized linear's output scale."""
    return [m.scale for m in model.modules() if isinstance(m, nnq.Linear)][-1]


class _EveryQuantizedOp(TorchFunctionMode):
    """Runs every ``aot_q`` op of a replay twice: ATen's kernel (what runs) and the
    decomposition IREE compiles, on the same integer inputs; counts disagreements."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, list[int]] = {}  # op -> [elements, differing, worst steps]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = func.default if isinstance(func, torch._ops.OpOverloadPacket) else func
        if str(op) in ("aot_q.conv2d.default", "aot_q.linear.default") and saturates(args[0]):
            # ATen's kernel is not the exact int32 sum here (a CPU without VNNI, an
            # activation past the calibrated 7 bits): the decomposition is; not compared
            self.saturated = getattr(self, "saturated", 0) + 1
            self.seen.setdefault(str(op), [0, 0, 0])
            return out
        if getattr(op, "namespace", None) == "aot_q" and out.dtype == torch.uint8:
            diff = (IREE_DECOMPOSITIONS[op](*args, **(kwargs or {})).int() - out.int()).abs()
            row = self.seen.setdefault(str(op), [0, 0, 0])
            row[0] += diff.numel()
            row[1] += int((diff > 0).sum())
            row[2] = max(row[2], int(diff.max()))
        return out


@pytest.mark.slow
@pytest.mark.parametrize("name,backend", [(n, "x86") for n in SIZES] + [
    (n, "qnnpack") for n in ("googlenet", "mobilenet_v2", "shufflenet_v2_x0_5")])
def test_both_modes(name, backend):
    """ATen fallback bit-exact end to end; compiled int8 op by op, on the model's own
    activations: what IREE compiles for each ``aot_q`` op against ATen's kernel."""
    model, (x,) = quantized_model(name, backend, size=SIZES[name], batch=2)
    inputs = [x, *_inputs(x, 2)]

    cm = aot.compile(model, (x,), fallback_ops=["aot_q"])
    for xi in inputs:
        with torch.no_grad():
            want = model(xi)
        torch.testing.assert_close(cm(xi), want, rtol=0, atol=0)
    ops = {k["op"] for k in kernel_call_ops(cm.manifest)}
    assert {"aot_q::conv2d", "aot_q::linear"} <= ops  # ATen's quantized kernels ran them

    int_model, *_ = rewrite_eager_quantized(model, (x,), {})
    check = _EveryQuantizedOp()
    with torch.no_grad(), check:
        for xi in inputs:
            int_model(xi)
    assert {"aot_q.conv2d.default", "aot_q.linear.default"} <= set(check.seen)
    for op, (elements, differing, worst) in check.seen.items():
        assert differing == 0, f"{op}: {differing} of {elements} elements differ, by up to {worst}"


@pytest.mark.slow
@pytest.mark.parametrize("name,backend", [("resnet18", "x86"), ("mobilenet_v3_large", "x86"),
                                          ("googlenet", "x86"), ("resnet18", "qnnpack")])
def test_compiled_int8_is_bit_exact_end_to_end(name, backend):
    """Compiled int8 (no kernel call left) against eager int8, 100 random inputs, one at
    a time: the same logits, bit for bit (so within one step on 100% and the same
    top-1 on 100 of 100; the issue's bar is 99.9% and 99%)."""
    model, (x,) = quantized_model(name, backend, size=SIZES[name])
    cm = aot.compile(model, (x,), placement="coverage")
    assert not cm.manifest["kernel_calls"], "every quantized op compiled as int8 arithmetic"
    assert cm.manifest["executor"]["quantized_engine"] == backend
    xs = torch.cat(_inputs(x, 100))
    with torch.no_grad():
        want = torch.cat([model(xi[None]) for xi in xs])
    got = torch.cat([cm(xi[None]) for xi in xs])
    steps = (got - want).abs() / _output_step(model)
    assert torch.equal(got, want), (
        f"{(steps > 0).float().mean():.4%} of logits differ, by up to {steps.max():.1f} steps; "
        f"{(steps <= 1.001).float().mean():.4%} within one step")


@pytest.mark.slow
def test_aten_region_keeps_layout_ops_on_quantized_tensors():
    """In one ATen region, ShuffleNetV2's channel shuffles and splits run on the quantized
    intermediates themselves: bit-exact, and no integer-storage copy (``int_repr``) per
    layout op (there were 17 per call, 4% of its time; now 1)."""
    from torch.profiler import ProfilerActivity, profile

    model, (x,) = quantized_model("shufflenet_v2_x0_5", "x86", size=64)
    cm = aot.compile(model, (x,), fallback="all")  # one group: the "aten" region's executor
    assert len(cm.manifest["kernel_calls"]) == 1
    for xi in [x, *_inputs(x, 2)]:
        with torch.no_grad():
            want = model(xi)
        torch.testing.assert_close(cm(xi), want, rtol=0, atol=0)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        cm(x)
    copies = sum(e.count for e in p.key_averages() if e.key == "aten::int_repr")
    assert copies <= 1, f"{copies} int_repr copies in one call"  # measured: 1 (was 17)
