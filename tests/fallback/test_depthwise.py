"""Depthwise convolutions with their activation and mean (``aot.fallback.depthwise``)
against a float64 ``conv2d``.

Tolerance: the sums are float32 in another order than oneDNN's, and the SiLU's
exponential and reciprocal are approximations (1.6e-7 relative); on these sizes the
error stays under 1e-6 of the largest result (2e-7 to 4e-7 measured on EfficientNet-B0's
layers), checked as ``atol = 4e-6 * max|result|``."""

import math

import pytest
import torch
import torch.nn.functional as F

from aot.fallback import depthwise

pytestmark = pytest.mark.skipif(not depthwise.available(),
                                reason="no C compiler here to build the depthwise kernel")

ACTS = {None: lambda t: t, "silu": F.silu, "relu": torch.relu,
        "relu6": lambda t: F.hardtanh(t, 0.0, 6.0), "hardswish": F.hardswish}
KERNEL_ACT = {None: (None, 0.0, 0.0), "silu": ("silu", 0.0, 0.0),
              "relu": ("clip", 0.0, math.inf), "relu6": ("clip", 0.0, 6.0),
              "hardswish": ("hardswish", 0.0, 0.0)}


def _run(n, c, h, w, k, s, act, bias=True, pooled=True, x=None, seed=0):
    """(result NCHW, means [n, c] or None, the float64 reference, its means)."""
    torch.manual_seed(seed)
    if x is None:
        x = torch.randn(n, c, h, w) * 2
    wt, b = torch.randn(c, 1, k, k), torch.randn(c) if bias else None
    conv = depthwise.Conv(n, h, w, wt, b, s, *KERNEL_ACT[act])
    conv.bind(torch.full((conv.work(),), float("nan")))  # every sum written before read
    mean = torch.full((n, c), float("nan"))
    if pooled:
        conv.pool_into(mean.data_ptr())
    xl = x.permute(0, 2, 3, 1).contiguous()
    y = torch.full((n,) + conv.shape[2:] + (c,), float("nan"))
    conv(xl.data_ptr(), y.data_ptr())
    want = ACTS[act](F.conv2d(x.double(), wt.double(), None if b is None else b.double(),
                              stride=s, padding=k // 2, groups=c))
    return y.permute(0, 3, 1, 2), mean if pooled else None, want, want.mean((2, 3))


def _close(got, want):
    torch.testing.assert_close(got, want.float(), rtol=0,
                               atol=4e-6 * float(want.abs().max()))


@pytest.mark.parametrize("n,c,h,w", [(1, 32, 112, 112), (2, 48, 9, 13), (3, 16, 4, 5),
                                     (1, 16, 1, 1), (1, 1152, 7, 7), (1, 80, 2, 17),
                                     (1, 16, 3000, 9)])  # (too tall to copy whole)
@pytest.mark.parametrize("k,s", [(3, 1), (3, 2), (5, 1), (5, 2)])
def test_matches_conv2d_with_silu_and_mean(n, c, h, w, k, s):
    y, mean, want, want_mean = _run(n, c, h, w, k, s, "silu")
    assert y.shape == want.shape
    _close(y, want)
    _close(mean, want_mean)


# images up to 16 wide are copied with their padding first, wider ones run row by row
SIZES = pytest.mark.parametrize("h,w", [(11, 10), (6, 21)], ids=["small", "rows"])


@SIZES
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("bias", [True, False])
def test_each_activation_with_and_without_bias(act, bias, h, w):
    y, mean, want, want_mean = _run(2, 64, h, w, 3, 1, act, bias=bias, seed=5)
    _close(y, want)
    _close(mean, want_mean)


@SIZES
def test_without_a_mean_only_the_result_is_written(h, w):
    y, mean, want, _ = _run(1, 32, h, w, 5, 1, "silu", pooled=False)
    _close(y, want)


def test_silu_at_the_extremes_is_as_torchs():
    # exp(-v) beyond float32's range: silu(v) is v (v large) or -0 (v very negative);
    # silu(-inf) = -inf * 0 is NaN in torch too; a NaN stays NaN
    vals = torch.tensor([0.0, 1e-3, -1e-3, 20.0, -20.0, 88.0, -88.0, 95.0, -95.0, 1e4,
                         -1e4, 3e38, -3e38, math.inf, -math.inf, math.nan])
    c, width = 16, 2 * len(vals)
    x = torch.zeros(1, c, 1, width)
    x[0, 0, 0, ::2] = vals  # zeros between: a tap of weight 0 on inf would make a NaN
    # a 3x3 kernel with only its centre tap: the result is the activation of the input
    wt = torch.zeros(c, 1, 3, 3)
    wt[:, :, 1, 1] = 1.0
    conv = depthwise.Conv(1, 1, width, wt, None, 1, "silu")
    xl = x.permute(0, 2, 3, 1).contiguous()
    y = torch.empty(1, 1, width, c)
    conv(xl.data_ptr(), y.data_ptr())
    got, want = y[0, 0, ::2, 0], F.silu(vals)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-30, equal_nan=True)


@SIZES
def test_a_nan_spreads_to_the_results_whose_window_holds_it(h, w):
    x = torch.randn(1, 16, h, w)
    x[0, 3, 4, 4] = math.nan
    y, mean, _, _ = _run(1, 16, h, w, 3, 1, "relu", x=x)
    nan = y.isnan()
    assert nan[0, 3, 3:6, 3:6].all() and nan.sum() == 9
    assert mean[0, 3].isnan() and mean.isnan().sum() == 1


@pytest.mark.parametrize("shape,stride", [((16, 1, 7, 7), 1), ((16, 1, 3, 3), 3),
                                          ((24, 1, 3, 3), 1), ((16, 2, 3, 3), 1),
                                          ((16, 1, 3, 5), 1)])
def test_shapes_it_does_not_take_are_refused(shape, stride):
    assert not depthwise.fits(shape, [stride] * 2, [shape[-1] // 2] * 2, [1, 1])
    with pytest.raises(ValueError, match="not a depthwise convolution this kernel takes"):
        depthwise.Conv(1, 8, 8, torch.zeros(shape), None, stride)


def test_fits_wants_padding_k_over_2_and_no_dilation():
    assert depthwise.fits((16, 1, 5, 5), [2, 2], [2, 2], [1, 1])
    assert not depthwise.fits((16, 1, 5, 5), [2, 2], [1, 1], [1, 1])
    assert not depthwise.fits((16, 1, 3, 3), [1, 1], [1, 1], [2, 2])
    assert not depthwise.fits((16, 1, 3, 3), [1, 2], [1, 1], [1, 1])


@pytest.mark.parametrize("act", ["silu", "relu6", "hardswish"])
def test_the_portable_code_without_avx512_agrees(monkeypatch, act):
    # the source as it compiles for a CPU without AVX-512 (GCC's vectors of 16 floats
    # in narrower registers; the SiLU by a division)
    monkeypatch.setattr(depthwise, "_lib", lambda: depthwise._build(
        ("-O3", "-mno-avx512f", "-Wno-psabi", "-fopenmp")))
    y, mean, want, want_mean = _run(2, 48, 13, 9, 5, 2, act, seed=9)
    _close(y, want)
    _close(mean, want_mean)
    test_silu_at_the_extremes_is_as_torchs()


@SIZES
def test_the_mean_may_go_where_the_image_was(h, w):
    # a program may give the mean the buffer its input dies in: it is written only
    # once every row of every image is read
    torch.manual_seed(11)
    n, c = 2, 64
    x = torch.randn(n, c, h, w)
    wt, b = torch.randn(c, 1, 3, 3), torch.randn(c)
    conv = depthwise.Conv(n, h, w, wt, b, 1, "silu")
    conv.bind(torch.full((conv.work(),), float("nan")))
    xl = x.permute(0, 2, 3, 1).contiguous()
    conv.pool_into(xl.data_ptr())
    y = torch.empty((n,) + conv.shape[2:] + (c,))
    conv(xl.data_ptr(), y.data_ptr())
    want = ACTS["silu"](F.conv2d(x.double(), wt.double(), b.double(), padding=1, groups=c))
    _close(y.permute(0, 3, 1, 2), want)
    _close(xl.flatten()[:n * c].view(n, c), want.mean((2, 3)))
