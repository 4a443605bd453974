"""Winograd F(4x4, 3x3) convolutions (``aot.fallback.winograd``) against a float64
``conv2d``.

Tolerance: the transforms add rounding the direct convolution does not have; on these
sizes the error stays under 1e-5 of the largest result (4e-6 to 8e-6 measured on
ResNet18's layers), checked as ``atol = 2e-5 * max|result|``."""

import pytest
import torch

from aot.fallback import winograd

pytestmark = pytest.mark.skipif(not winograd.available(),
                                reason="no C compiler here to build the Winograd transforms")


def _run(n, c, k, h, w, ops, bias=True, seed=0):
    torch.manual_seed(seed)
    x, wt = torch.randn(n, c, h, w), torch.randn(k, c, 3, 3) / (9 * c) ** 0.5
    b = torch.randn(k) if bias else None
    res = torch.randn(n, k, h, w)
    conv = winograd.Conv(n, h, w, wt, b, ops)
    nv, nm = conv.work()
    conv.bind(torch.empty(nv), torch.empty(nm))
    nhwc = lambda t: t.permute(0, 2, 3, 1).contiguous()  # noqa: E731
    xl, rl, y = nhwc(x), nhwc(res), torch.empty(n, h, w, k)
    for q, o in enumerate(ops):
        if o == "add":
            conv.operands[q] = rl.data_ptr()
    conv(xl.data_ptr(), y.data_ptr())
    want = torch.nn.functional.conv2d(x.double(), wt.double(),
                                      None if b is None else b.double(), padding=1)
    for o in ops:
        want = torch.relu(want) if o == "relu" else want + res.double()
    return y.permute(0, 3, 1, 2), want.float()


@pytest.mark.parametrize("n,c,k,h,w", [(1, 64, 64, 56, 56), (2, 16, 32, 9, 13),
                                       (1, 32, 16, 7, 7), (3, 16, 16, 4, 5), (1, 16, 48, 1, 1)])
@pytest.mark.parametrize("ops", [(), ("relu",), ("add", "relu"), ("relu", "add")])
def test_winograd_matches_the_convolution(n, c, k, h, w, ops):
    got, want = _run(n, c, k, h, w, ops)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * float(want.abs().max()))


def test_without_bias_and_nan_through_relu():
    got, want = _run(1, 16, 16, 8, 8, ("relu",), bias=False)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * float(want.abs().max()))
    # a NaN in the image makes NaN wherever the convolution's would, and further: the
    # whole 4x4 tile of results whose 6x6 window holds it (the transforms mix the
    # window), not the tiles beyond
    conv = winograd.Conv(1, 8, 8, torch.ones(16, 16, 3, 3), None, ["relu"])
    conv.bind(*[torch.empty(s) for s in conv.work()])
    x, y = torch.zeros(1, 8, 8, 16), torch.empty(1, 8, 8, 16)
    x[0, 1, 1, 0] = float("nan")
    conv(x.data_ptr(), y.data_ptr())
    direct = torch.relu(torch.nn.functional.conv2d(x.permute(0, 3, 1, 2),
                                                   torch.ones(16, 16, 3, 3), padding=1))
    assert y.permute(0, 3, 1, 2)[direct.isnan()].isnan().all()
    assert y[0, :4, :4].isnan().all() and not y[0, 4:, 4:].isnan().any()


def test_weights_it_cannot_take_are_refused():
    assert not winograd.fits((16, 16, 5, 5)) and not winograd.fits((16, 12, 3, 3))
    with pytest.raises(ValueError, match="3x3 with channels in multiples of 16"):
        winograd.Conv(1, 8, 8, torch.randn(16, 8, 3, 3), None, [])
