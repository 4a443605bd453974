"""RMS normalization as one kernel (``aot.fallback.rms_norm``) against float64.

Tolerance: the sum of squares is float32 in another order than ATen's; the results
stay within 1e-6 of the largest (1e-7 measured), checked as ``atol = 2e-6 * max``."""

import math

import pytest
import torch

from aot.fallback import rms_norm

pytestmark = pytest.mark.skipif(not rms_norm.available(),
                                reason="no C compiler here to build the RMS norm kernel")


def _run(x, eps, w=None):
    rows, n = x.numel() // x.shape[-1], x.shape[-1]
    norm = rms_norm.Norm(rows, n, eps, w)
    y = torch.full_like(x, float("nan"))
    norm(x.data_ptr(), y.data_ptr())
    want = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + eps)
    return y, want if w is None else w.double() * want


def _close(got, want):
    torch.testing.assert_close(got, want.float(), rtol=0, equal_nan=True,
                               atol=2e-6 * float(want.abs().nan_to_num(0.0).max()))


@pytest.mark.parametrize("shape", [(128, 512), (1, 7, 100), (3, 1), (2, 3, 4, 33), (1, 4096)])
@pytest.mark.parametrize("weighted", [True, False])
def test_matches_float64(shape, weighted):
    torch.manual_seed(len(shape))
    x = torch.randn(shape) * 3
    w = torch.randn(shape[-1]) if weighted else None
    y, want = _run(x, 1e-6, w)
    _close(y, want)


def test_eps_matters_for_small_rows():
    x = torch.full((2, 20), 1e-4)
    y, want = _run(x, 1e-2)
    _close(y, want)
    assert float(y.abs().max()) < 0.01


def test_a_nan_or_inf_in_a_row_as_torchs():
    # a NaN: the row NaN; an inf: its rsqrt 0, so the row 0 and inf * 0 NaN
    x = torch.randn(4, 40)
    x[1, 5], x[2, 39] = math.nan, math.inf
    y, want = _run(x, 1e-6)
    assert y[1].isnan().all() and y[2, 39].isnan() and (y[2, :39] == 0).all()
    assert not y[[0, 3]].isnan().any()
    _close(y, want)


def test_the_portable_code_without_avx512_agrees(monkeypatch):
    monkeypatch.setattr(rms_norm, "_lib", lambda: rms_norm._build(
        ("-O3", "-mno-avx512f", "-fno-math-errno", "-Wno-psabi", "-fopenmp")))
    x, w = torch.randn(5, 37), torch.randn(37)
    y, want = _run(x, 1e-5, w)
    _close(y, want)


@pytest.mark.parametrize("rows,n,w,match", [(0, 8, None, "nothing to do"),
                                            (2, 8, torch.ones(7), "a weight of shape")])
def test_bad_shapes_are_refused(rows, n, w, match):
    with pytest.raises(ValueError, match=match):
        rms_norm.Norm(rows, n, 1e-6, w)
