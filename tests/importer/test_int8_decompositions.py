"""Compiled int8, op by op: each ``aot_q`` decomposition against ATen's quantized kernel,
bit for bit, under each engine (evaluated eagerly; what IREE compiles of them is
checked end to end in ``tests/e2e/test_quantized_zoo.py``).

Most requantization formulas agree on all but a few outputs per million: the ones
whose float32 value lands on or next to a tie. So each rounding detail has a case
built to sit on such an output (found in torchvision's quantized models and in random
sweeps), where the formula before the fix gave one step more; and a random sweep
over convolution shapes, linears and adds guards the rest.
"""

import warnings

import numpy as np
import pytest
import torch

from aot.fallback.quantized_ops import cpu_has
from aot.importer import int8_decompositions as d

VNNI = cpu_has("avx512_vnni")  # where ATen's x86/oneDNN int8 kernels sum in int32

warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated")


@pytest.fixture(autouse=True)
def restore_engine():
    engine = torch.backends.quantized.engine
    yield
    torch.backends.quantized.engine = engine


def _engine(name: str):
    if name not in torch.backends.quantized.supported_engines:
        pytest.skip(f"engine {name} not in this torch build")
    torch.backends.quantized.engine = name


def _conv_1x1(xs, ws, sx, zx, w_scale, bias, so, zo, *, per_channel=True, relu=False):
    """ATen's and the decomposition's output of a 1x1 convolution with one output
    channel, over a 4x4 image of the same pixel ``xs``: ``sum((xs - zx) * ws)``."""
    c = len(xs)
    w = torch.tensor(ws, dtype=torch.int8).reshape(1, c, 1, 1)
    scales = torch.tensor([w_scale], dtype=torch.double)
    zps = torch.zeros(1, dtype=torch.long)
    qw = (torch._make_per_channel_quantized_tensor(w, scales, zps, 0) if per_channel
          else torch._make_per_tensor_quantized_tensor(w, w_scale, 0))
    x = torch.tensor(xs, dtype=torch.uint8).reshape(1, c, 1, 1).expand(1, c, 4, 4).contiguous()
    packed = torch.ops.quantized.conv2d_prepack(qw, torch.tensor([bias]), [1, 1], [0, 0], [1, 1], 1)
    kernel = torch.ops.quantized.conv2d_relu if relu else torch.ops.quantized.conv2d
    want = kernel(torch._make_per_tensor_quantized_tensor(x, sx, zx), packed, so, zo).int_repr()
    got = d._conv2d(x, w, scales, zps, 0, torch.tensor([bias]), [1, 1], [0, 0], [1, 1], 1,
                    sx, zx, so, zo, relu)
    return got, want


@pytest.mark.parametrize("xs,ws,sx,zx,sw,bias,so,zo,want", [
    # (acc * sx') * sw + b lands on 115.5 exactly with sw' = 1 / float32(1 / sw)
    ([255, 255, 196, 1], [-127, -127, -127, -30], 0.020976270078546494, 0,
     0.0016260292118276843, 0.5228604674339294, 0.22055267521432875, 127, 115),
    # ... and one float32 step above 146.5
    ([255, 255, 255, 49, 8], [127, 127, 127, 127, 107], 0.029549902794888935, 7,
     0.001793287276132525, -0.7588325142860413, 0.2212950920137151, 126, 146),
])
@pytest.mark.skipif(not VNNI, reason="oneDNN's int8 kernel on a CPU without AVX512-VNNI sums "
                    "uint8 x int8 pairs in int16 and saturates on these 8-bit activations; the "
                    "decomposition follows the exact int32 sum it computes with VNNI")
def test_onednn_convolution_takes_the_weight_scales_as_they_are(xs, ws, sx, zx, sw, bias, so, zo,
                                                                want):
    """oneDNN gets the input and output scales through ideep's reciprocals, the weight
    scales unchanged."""
    _engine("onednn")
    got, aten = _conv_1x1(xs, ws, sx, zx, sw, bias, so, zo)
    assert int(aten.flatten()[0]) == want  # the case still sits where it did
    torch.testing.assert_close(got, aten, rtol=0, atol=0)


@pytest.mark.parametrize("engine", ["x86", "onednn"])
@pytest.mark.parametrize("x_shape,w_shape,groups", [
    ((1, 23, 1, 1), (16, 23, 1, 1), 1),  # small and odd: VNNI's kernel even with AMX
    ((2, 32, 8, 8), (192, 32, 1, 1), 1),  # AMX's where the CPU has it (MobileNetV2's)
    ((1, 32, 16, 16), (48, 32, 3, 3), 1),
    ((1, 16, 8, 8), (16, 1, 3, 3), 16),  # depthwise
    ((8, 64), (32, 64), 1),  # a linear (oneDNN's only under the onednn engine)
], ids=["1x1 small", "1x1", "3x3", "depthwise", "linear"])
@pytest.mark.skipif(not VNNI, reason="oneDNN's int8 kernel on a CPU without AVX512-VNNI "
                    "saturates on 8-bit activations")
def test_onednn_scale_order_follows_the_kernel_onednn_picks(engine, x_shape, w_shape, groups):
    """Every output of these sums to 4277, a tie when requantized: 25.5 with the input
    and weight scales applied one after the other (oneDNN's AVX512-VNNI kernels), one
    float32 step under with their product (its AMX kernels, on the shapes it gives
    them). The decomposition follows whichever kernel this machine runs."""
    _engine(engine)
    from aot.fallback import quantized_ops as q

    o = w_shape[0]
    w = torch.zeros(w_shape, dtype=torch.int8)
    w[(slice(None), 0, *([0] * (len(w_shape) - 2)))] = 91
    x = torch.full(x_shape, 112, dtype=torch.uint8)
    sw = torch.full((o,), q._PROBE_SW, dtype=torch.double)
    zw = torch.zeros(o, dtype=torch.long)
    bias = torch.full((o,), q._PROBE_B)
    qw = torch._make_per_channel_quantized_tensor(w, sw, zw, 0)
    qx = torch._make_per_tensor_quantized_tensor(x, q._PROBE_SX, 65)
    if len(w_shape) == 2:
        want = torch.ops.quantized.linear_relu(qx, torch.ops.quantized.linear_prepack(qw, bias),
                                               q._PROBE_SO, 0)
        got = d._linear(x, w, sw, zw, 0, bias, q._PROBE_SX, 65, q._PROBE_SO, 0, True)
    else:
        packed = torch.ops.quantized.conv2d_prepack(qw, bias, [1, 1], [0, 0], [1, 1], groups)
        want = torch.ops.quantized.conv2d_relu(qx, packed, q._PROBE_SO, 0)
        got = d._conv2d(x, w, sw, zw, 0, bias, [1, 1], [0, 0], [1, 1], groups, q._PROBE_SX, 65,
                        q._PROBE_SO, 0, True)
    assert set(want.int_repr().unique().tolist()) <= {25, 26}  # each output on the tie
    torch.testing.assert_close(got, want.int_repr(), rtol=0, atol=0)


def test_qnnpack_requantization_scale_is_times_the_reciprocal():
    """qnnpack's scale is ``(sw * sx) * float32(1 / so)``; ``(sw * sx) / so`` makes this
    output (GoogLeNet's, per-tensor weights) exactly 55.5 and rounds it to 56."""
    _engine("qnnpack")
    got, aten = _conv_1x1([255] * 7 + [131], [127] * 7 + [53], 0.015765156596899033, 0,
                          0.0020834619645029306, -6.85040283203125, 0.014841113239526749, 0,
                          per_channel=False, relu=True)
    assert int(aten.flatten()[0]) == 55
    torch.testing.assert_close(got, aten, rtol=0, atol=0)


def test_qnnpack_quantizes_the_bias_times_the_reciprocal():
    """qnnpack's int32 bias is ``round(b * float32(1 / (sw * sx)))``; ``b / (sw * sx)``
    is -23871.5 exactly for this ResNet18 output, rounds to even, and puts the output
    at 86.4996 instead of 86.5012."""
    _engine("qnnpack")
    got, aten = _conv_1x1([255, 255, 113, 1], [127, 127, 127, 108], 0.0251371581107378, 0,
                          0.0010208914754912257, -0.6125978231430054, 0.01642305962741375, 0,
                          per_channel=False, relu=True)
    assert int(aten.flatten()[0]) == 87
    torch.testing.assert_close(got, aten, rtol=0, atol=0)


def _add(a, sa, za, b, sb, zb, so, zo, relu, n=256):
    """ATen's and the decomposition's add of ``n`` copies of the pair ``(a, b)``
    (enough for ATen's vectorised loop, which leaves fewer than two vectors over)."""
    qa = torch.full((1, n), a, dtype=torch.uint8)
    qb = torch.full((1, n), b, dtype=torch.uint8)
    kernel = torch.ops.quantized.add_relu if relu else torch.ops.quantized.add
    want = kernel(torch._make_per_tensor_quantized_tensor(qa, sa, za),
                  torch._make_per_tensor_quantized_tensor(qb, sb, zb), so, zo).int_repr()
    return d._add(qa, sa, za, qb, sb, zb, so, zo, relu), want


@pytest.mark.parametrize("engine", ["x86", "fbgemm", "onednn"])
def test_add_dequantizes_with_a_fused_multiply_add(engine):
    """ATen's vectorised add dequantizes ``fma(q, s, float32(-zp * s))``; ``(q - zp) * s``
    puts this ResNet50 output at 131.49998 instead of 131.5 and rounds it to 131."""
    _engine(engine)
    got, aten = _add(103, 0.07259638607501984, 63, 97, 0.06025649979710579, 0,
                     0.06653031706809998, 0, True)
    assert int(aten.flatten()[0]) == 132
    torch.testing.assert_close(got, aten, rtol=0, atol=0)


def test_qnnpack_adds_in_fixed_point():
    """qnnpack's add is integer arithmetic; through real numbers this MobileNetV2
    output is 169, not 168. Broadcast adds are not qnnpack's: real numbers again."""
    _engine("qnnpack")
    got, aten = _add(204, 0.03583195060491562, 130, 121, 0.03293049708008766, 124,
                     0.047715380787849426, 115, False)
    assert int(aten.flatten()[0]) == 168
    torch.testing.assert_close(got, aten, rtol=0, atol=0)
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 256, (2, 64, 8, 8), dtype=torch.uint8, generator=g)
    b = torch.randint(0, 256, (1, 64, 1, 1), dtype=torch.uint8, generator=g)
    want = torch.ops.quantized.add(torch._make_per_tensor_quantized_tensor(a, 0.05, 3),
                                   torch._make_per_tensor_quantized_tensor(b, 0.02, 200),
                                   0.06, 100).int_repr()
    torch.testing.assert_close(d._add(a, 0.05, 3, b, 0.02, 200, 0.06, 100, False), want,
                               rtol=0, atol=0)


def test_qnnpack_add_outside_its_scale_range_is_refused():
    _engine("qnnpack")
    a = torch.zeros(4, dtype=torch.uint8)
    with pytest.raises(d.UnsupportedOp, match=r"2\*\*-14"):
        d._add(a, 1.0, 0, a, 1.0, 0, 1e-3, 0, False)


# kernel size, in channels, out channels, groups, stride, image size (0: a linear)
SHAPES = {"1x1": (1, 64, 64, 1, 1, 24), "3x3": (3, 32, 48, 1, 1, 16),
          "3x3 stride 2": (3, 32, 48, 1, 2, 16), "depthwise": (3, 64, 64, 64, 1, 16),
          "4 groups": (3, 32, 32, 4, 1, 16), "linear": (0, 256, 128, 1, 1, 64)}


@pytest.mark.parametrize("engine", ["x86", "fbgemm", "onednn", "qnnpack"])
def test_random_convolutions_linears_and_adds_are_bit_exact(engine):
    """Random data over the shapes above, ReLU fused or not, per-channel weights and
    random float64 scales (what observers give is float32-exact; these are not).

    Activations are 7-bit under fbgemm and x86, as their qconfigs make them
    (``reduce_range``): fbgemm's depthwise kernel sums pairs of uint8 x int8 products
    in int16 and saturates (with 8-bit activations, measured: 972 of 16 k outputs off,
    up to 8 steps), which the decompositions do not model; so does oneDNN's on a CPU
    without AVX512-VNNI."""
    _engine(engine)
    x_max = 128 if engine in ("x86", "fbgemm") or (engine == "onednn" and not VNNI) else 256
    rs = np.random.RandomState(0)
    g = torch.Generator().manual_seed(0)
    differing = {}
    for seed in range(2):
        relu = bool(seed)
        for name, (k, c, o, groups, stride, size) in SHAPES.items():
            sx, so = rs.uniform(0.01, 0.03), rs.uniform(0.1, 0.3)
            zx, zo = int(rs.randint(0, 40)), int(rs.randint(60, 140))
            sw = torch.tensor(rs.uniform(0.0005, 0.002, o))
            zw = torch.zeros(o, dtype=torch.long)
            bias = torch.randn(o, generator=g)
            if k == 0:
                w = torch.randint(-127, 128, (o, c), dtype=torch.int8, generator=g)
                x = torch.randint(0, x_max, (size, c), dtype=torch.uint8, generator=g)
                packed = torch.ops.quantized.linear_prepack(
                    torch._make_per_channel_quantized_tensor(w, sw, zw, 0), bias)
                kernel = torch.ops.quantized.linear_relu if relu else torch.ops.quantized.linear
                got = d._linear(x, w, sw, zw, 0, bias, sx, zx, so, zo, relu)
            else:
                w = torch.randint(-127, 128, (o, c // groups, k, k), dtype=torch.int8, generator=g)
                x = torch.randint(0, x_max, (1, c, size, size), dtype=torch.uint8, generator=g)
                packed = torch.ops.quantized.conv2d_prepack(
                    torch._make_per_channel_quantized_tensor(w, sw, zw, 0), bias,
                    [stride] * 2, [k // 2] * 2, [1, 1], groups)
                kernel = torch.ops.quantized.conv2d_relu if relu else torch.ops.quantized.conv2d
                got = d._conv2d(x, w, sw, zw, 0, bias, [stride] * 2, [k // 2] * 2, [1, 1],
                                groups, sx, zx, so, zo, relu)
            want = kernel(torch._make_per_tensor_quantized_tensor(x, sx, zx), packed, so,
                          zo).int_repr()
            differing[name] = differing.get(name, 0) + int((got != want).sum())
        a, b = (torch.randint(0, 256, (2, 32, 16, 16), dtype=torch.uint8, generator=g)
                for _ in range(2))
        sa, sb, so = rs.uniform(0.01, 0.1, 3)
        za, zb, zo = (int(v) for v in rs.randint(0, 200, 3))
        add = torch.ops.quantized.add_relu if relu else torch.ops.quantized.add
        want = add(torch._make_per_tensor_quantized_tensor(a, sa, za),
                   torch._make_per_tensor_quantized_tensor(b, sb, zb), so, zo).int_repr()
        got = d._add(a, sa, za, b, sb, zb, so, zo, relu)
        differing["add"] = differing.get("add", 0) + int((got != want).sum())
    assert not any(differing.values()), differing
