"""Full-range int8 activations where ATen's int8 kernels saturate (no VNNI): a PT2E
program's ``aot_q`` conv/linear kernel calls (``float_math``) compute its converted
model's float math instead, bit for bit; 7-bit activations keep ATen's kernel, and an
eager-mode quantized model's calls always do (ATen's kernels are what it means)."""

import pytest
import torch

from aot.fallback import quantized_ops as q
from aot.importer.pt2e import _qd

qd = _qd()  # torch's quantized_decomposed ops, as the converted model calls them


@pytest.fixture
def no_vnni(monkeypatch):
    """This machine as one without VNNI under the x86 engine (the saturating case)."""
    monkeypatch.setattr(q, "cpu_has", lambda flag: False)
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "x86"
    yield
    torch.backends.quantized.engine = engine


def _operands(x_max: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, x_max + 1, (2, 16, 9, 9), dtype=torch.uint8, generator=g)
    w = torch.randint(-128, 128, (8, 16, 3, 3), dtype=torch.int8, generator=g)
    w_scales = torch.rand(8, generator=g, dtype=torch.float64) * 0.01 + 0.001
    w_zps = torch.zeros(8, dtype=torch.int64)
    bias = torch.randn(8, generator=g)
    return x, w, w_scales, w_zps, bias


def _converted_conv(x, w, w_scales, w_zps, bias, x_scale, x_zp, out_scale, out_zp, relu):
    """What torchao's converted model runs: dequantize, float conv, quantize."""
    dx = qd.dequantize_per_tensor(x, x_scale, x_zp, 0, 255, torch.uint8)
    dw = qd.dequantize_per_channel(w, w_scales, w_zps, 0, -128, 127, torch.int8)
    y = torch.nn.functional.conv2d(dx, dw, bias, [1, 1], [1, 1], [1, 1], 1)
    if relu:
        y = torch.relu(y)
    return qd.quantize_per_tensor(y, out_scale, out_zp, 0, 255, torch.uint8)


@pytest.mark.parametrize("relu", [False, True])
def test_full_range_conv_is_the_converted_models_math(no_vnni, relu):
    x, w, ws, wz, b = _operands(255)
    args = (x, w, ws, wz, 0, b, [1, 1], [1, 1], [1, 1], 1, 0.05, 3, 0.4, 7, relu)
    assert q.saturates(x)
    want = _converted_conv(x, w, ws, wz, b, 0.05, 3, 0.4, 7, relu)
    assert torch.equal(q.FLOAT_MATH_IMPLS["conv2d"](*args), want)
    site = q.PREPACKED["aot_q::conv2d"][1]("x86", float_math=True)
    for _ in range(2):  # packed once, the float weight reused
        assert torch.equal(site(*args), want)
    # an eager-mode model's call: ATen's kernel, saturated or not, as eager runs it
    eager = q.PREPACKED["aot_q::conv2d"][1]("x86")
    assert torch.equal(eager(*args), q.IMPLS["conv2d"](*args))


def test_full_range_linear_is_the_converted_models_math(no_vnni):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (4, 64), dtype=torch.uint8, generator=g)
    w = torch.randint(-128, 128, (16, 64), dtype=torch.int8, generator=g)
    ws, wz, b = torch.full((16,), 0.02, dtype=torch.float64), torch.zeros(16, dtype=torch.int64), \
        torch.randn(16, generator=g)
    dx = qd.dequantize_per_tensor(x, 0.1, 128, 0, 255, torch.uint8)
    dw = qd.dequantize_per_channel(w, ws, wz, 0, -128, 127, torch.int8)
    want = qd.quantize_per_tensor(torch.nn.functional.linear(dx, dw, b), 0.5, 120, 0, 255,
                                  torch.uint8)
    args = (x, w, ws, wz, 0, b, 0.1, 128, 0.5, 120, False)
    assert torch.equal(q.FLOAT_MATH_IMPLS["linear"](*args), want)
    assert torch.equal(q.PREPACKED["aot_q::linear"][1]("x86", float_math=True)(*args), want)


def test_seven_bit_activations_keep_atens_kernel(no_vnni):
    """Eager-mode x86 qconfigs (``reduce_range``): ATen's kernel, as eager runs it."""
    x, w, ws, wz, b = _operands(127)
    assert not q.saturates(x)
    qx = torch._make_per_tensor_quantized_tensor(x, 0.05, 3)
    qw = torch._make_per_channel_quantized_tensor(w, ws, wz, 0)
    packed = torch.ops.quantized.conv2d_prepack(qw, b, [1, 1], [1, 1], [1, 1], 1)
    want = torch.ops.quantized.conv2d(qx, packed, 0.4, 7).int_repr()
    args = (x, w, ws, wz, 0, b, [1, 1], [1, 1], [1, 1], 1, 0.05, 3, 0.4, 7, False)
    assert torch.equal(q.FLOAT_MATH_IMPLS["conv2d"](*args), want)
    assert torch.equal(q.IMPLS["conv2d"](*args), want)


@pytest.mark.skipif(q.cpu_has("avx512_vnni"), reason="this CPU's int8 kernels do not saturate")
def test_atens_kernel_does_saturate_here():
    """Why the rule exists: on this CPU ATen's x86 kernel is off the exact sum."""
    x, w, ws, wz, b = _operands(255)
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "x86"
    try:
        qx = torch._make_per_tensor_quantized_tensor(x, 1.0, 0)
        qw = torch._make_per_tensor_quantized_tensor(w, 1.0, 0)
        packed = torch.ops.quantized.conv2d_prepack(qw, None, [1, 1], [0, 0], [1, 1], 1)
        got = torch.ops.quantized.conv2d(qx, packed, 1000.0, 0).int_repr().float()
    finally:
        torch.backends.quantized.engine = engine
    exact = (torch.nn.functional.conv2d(x.double(), w.double()) / 1000.0).round().clamp(0, 255)
    assert (got - exact).abs().max() > 1
