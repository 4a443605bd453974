"""The PT2E rewrite (``aot.importer.pt2e``) on hand-written Q/DQ graphs: what becomes an
``aot_q`` op, what stays as it is, and that the values do not change (no torchao needed)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from aot.fallback.quantized_ops import float_math
from aot.importer import ImportOptions, import_model

pytest.importorskip("torch.ao.quantization.fx._decomposed")
qd = torch.ops.quantized_decomposed
RANGES = {torch.uint8: (0, 255), torch.int8: (-128, 127)}


class ConvQDQ(torch.nn.Module):
    """quantize, dequantize -> conv2d (per-channel int8 weight) -> act -> quantize, dequantize."""

    def __init__(self, act=None, dtype=torch.uint8, qrange=None, axis=0, zx=3):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("w", torch.randint(-128, 128, (4, 3, 3, 3), generator=g,
                                                dtype=torch.int8))
        n = 4 if axis == 0 else 3
        self.register_buffer("ws", torch.rand(n, generator=g) * 0.01 + 0.001)
        self.register_buffer("wz", torch.zeros(n, dtype=torch.int64))
        self.bias = torch.nn.Parameter(torch.randn(4, generator=g))
        self.act, self.dtype, self.axis, self.zx = act, dtype, axis, zx
        self.qrange = qrange or RANGES[dtype]

    def _qdq(self, x, scale, zp):
        q = qd.quantize_per_tensor(x, scale, zp, *self.qrange, self.dtype)
        return qd.dequantize_per_tensor(q, scale, zp, *self.qrange, self.dtype)

    def forward(self, x):
        w = qd.dequantize_per_channel(self.w, self.ws, self.wz, self.axis, -128, 127, torch.int8)
        y = F.conv2d(self._qdq(x, 0.02, self.zx), w, self.bias, padding=1)
        if self.act is not None:
            y = self.act(y)
        return self._qdq(y, 0.05, self.zx + 2)


def _ops(m, x, **options):
    imported = import_model(m, (x,), options=ImportOptions(**options))
    return Counter(str(n.target) for n in imported.exported.graph.nodes
                   if n.op == "call_function"), imported


def _node(imported, target):
    return next(n for n in imported.exported.graph.nodes if n.target == target)


def _within_one_step(imported, m, x, step=0.05):
    with float_math():  # the aot_q ops as a PT2E program means them (saturation-free)
        out = imported.exported.module()(x)
    ref = m(x)
    assert float((out - ref).abs().max()) <= step * (1 + 1e-4)


@pytest.mark.parametrize("act,relu", [(None, False), (torch.relu, True)])
def test_conv_relu_quantize_becomes_one_int8_conv(act, relu):
    m, x = ConvQDQ(act).eval(), torch.randn(2, 3, 8, 8)
    ops, imported = _ops(m, x)
    assert ops["aot_q.conv2d.default"] == 1 and not ops["aten.conv2d.default"]
    assert not any(o.startswith("quantized_decomposed") for o in ops), ops
    conv = _node(imported, torch.ops.aot_q.conv2d.default)
    assert conv.args[-1] is relu and conv.args[-5:-1] == (0.02, 3, 0.05, 5)
    _within_one_step(imported, m, x)


def test_hardtanh_is_a_clamp_on_the_integers():
    m, x = ConvQDQ(lambda y: F.hardtanh(y, 0.0, 6.0)).eval(), torch.randn(2, 3, 8, 8) * 4
    ops, imported = _ops(m, x)
    assert ops["aot_q.conv2d.default"] == 1 and ops["aten.clamp.default"] == 1
    clamp = _node(imported, torch.ops.aten.clamp.default)
    assert clamp.args[1:] == (None, 125)  # relu at the zero point (the op's flag), q(6.0) = 120 + 5
    _within_one_step(imported, m, x)


def test_int8_activations_are_stored_as_uint8_shifted_by_128():
    m, x = ConvQDQ(torch.relu, dtype=torch.int8, zx=-7).eval(), torch.randn(2, 3, 8, 8)
    _, imported = _ops(m, x)
    conv = _node(imported, torch.ops.aot_q.conv2d.default)
    assert conv.args[-5:] == (0.02, 121, 0.05, 123, True)
    _within_one_step(imported, m, x)


def test_a_float_result_becomes_conv2d_f32_with_the_converted_models_values():
    class M(ConvQDQ):
        def forward(self, x):
            w = qd.dequantize_per_channel(self.w, self.ws, self.wz, 0, -128, 127, torch.int8)
            return F.conv2d(self._qdq(x, 0.02, 3), w, self.bias, padding=1) + 1

    m, x = M().eval(), torch.randn(2, 3, 8, 8)
    ops, imported = _ops(m, x)
    assert ops["aot_q.conv2d_f32.default"] == 1
    torch.testing.assert_close(imported.exported.module()(x), m(x), rtol=0, atol=0)


@pytest.mark.parametrize("case", ["restricted range", "weight axis 1"])
def test_patterns_it_cannot_map_exactly_stay_as_they_are(case):
    m = ConvQDQ(qrange=(0, 127)) if case == "restricted range" else ConvQDQ(axis=1)
    x = torch.randn(2, 3, 8, 8)
    ops, imported = _ops(m.eval(), x)
    assert ops["aten.conv2d.default"] == 1 and not ops["aot_q.conv2d.default"]
    if case == "restricted range":  # aot_q ops clamp to [0, 255]: the Q/DQ pairs stay
        assert ops["quantized_decomposed.quantize_per_tensor.default"] == 2
    torch.testing.assert_close(imported.exported.module()(x), m(x), rtol=0, atol=0)


def test_off_under_the_option_fallback_all_sets():
    m, x = ConvQDQ(torch.relu).eval(), torch.randn(2, 3, 8, 8)
    ops, _ = _ops(m, x, pt2e_integer_ops=False)
    assert ops["aten.conv2d.default"] == 1 and not ops["aot_q.conv2d.default"]
