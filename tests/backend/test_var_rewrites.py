"""Compiled variance and standard deviation in two passes on shifted values
(``aot.forms.var_rewrites``): near eager's where the mean is large against the spread,
which IREE's own lowering cancelled away (100% off). Tolerance: 1e-3 relative to the
float64 variance (IREE's float32 sums of up to 2**18 values; ATen's error is ~1e-7)."""

import pytest
import torch

import aot


class Spread(torch.nn.Module):
    def forward(self, x):
        return (torch.ops.aten.var.correction(x, [2, 3], correction=1),
                torch.std(x, dim=(2, 3), correction=2, keepdim=True), torch.var(x),
                torch.std(x, -1))


@pytest.mark.parametrize("hw,offset", [((64, 64), 1e4), ((512, 512), 100.0), ((7, 5), 1e4)])
def test_large_mean_variances_match_float64(hw, offset):
    torch.manual_seed(0)
    x = torch.rand(1, 2, *hw) + offset
    cm = aot.compile(Spread(), (x,), placement="coverage")
    assert not cm.manifest["kernel_calls"]
    for got, want, exact in zip(cm(x), Spread()(x), Spread()(x.double())):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got.double(), exact, rtol=1e-3, atol=0)


def test_half_precision_is_widened_and_degenerate_reductions_follow_torch():
    x = (torch.rand(2, 3, 16, 16) + 10).half()
    cm = aot.compile(Spread(), (x,), placement="coverage")
    for got, want in zip(cm(x), Spread()(x)):
        assert got.dtype == torch.float16
        torch.testing.assert_close(got, want, rtol=2e-3, atol=1e-4)
    one = torch.rand(2, 3, 1, 1)  # n - correction <= 0: inf or nan, as torch gives
    cm = aot.compile(Spread(), (one,), placement="coverage")
    for got, want in zip(cm(one), Spread()(one)):
        torch.testing.assert_close(got, want, equal_nan=True)
