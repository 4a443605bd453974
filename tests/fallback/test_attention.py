"""Attention as one kernel (``aot.fallback.attention``) against a float64 softmax.

Tolerance: float32 sums in another order and an exponential of relative error
1.6e-7; on these sizes the error stays under 1e-6 of the largest result (6e-7 to 8e-7
measured on T5's, ViT's and MobileViT's shapes), checked as
``atol = 4e-6 * max|result|``."""

import math

import pytest
import torch

from aot.fallback import attention

pytestmark = pytest.mark.skipif(not attention.available(),
                                reason="no C compiler here to build the attention kernel")


def _reference(q, k, v, mask, scale):
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    if mask is not None:
        s = s + mask.double()
    return torch.softmax(s, -1) @ v.double()


def _run(q, k, v, mask=None, scale=None):
    """``q``, ``k``, ``v``: [b, h, rows, d] with the last dimension dense (any other
    strides); ``mask`` broadcast to the scores."""
    b, h, l, d = q.shape
    s, dv = k.shape[2], v.shape[3]
    scale = d ** -0.5 if scale is None else scale
    att = attention.Attention(b, h, l, s, d, dv, scale)
    o = torch.full((b, h, l, dv), float("nan"))
    ms = None if mask is None else tuple(mask.expand(b, h, l, s).stride())
    att.strides(q.stride()[:3], k.stride()[:3], v.stride()[:3], o.stride()[:3], ms)
    att.bind(torch.full((att.work(),), float("nan")))  # all of it written before read
    att(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
        None if mask is None else mask.data_ptr())
    return o, _reference(q, k, v, mask, scale)


def _close(got, want):
    torch.testing.assert_close(got, want.float(), rtol=0,
                               atol=4e-6 * float(want.abs().nan_to_num(0.0).max()),
                               equal_nan=True)


@pytest.mark.parametrize("b,h,l,s,d,dv", [(1, 8, 128, 128, 64, 64), (4, 4, 256, 256, 36, 36),
                                          (1, 12, 197, 197, 64, 64), (2, 3, 5, 7, 20, 36),
                                          (1, 1, 1, 1, 1, 1), (3, 2, 33, 17, 16, 48)])
def test_matches_a_float64_softmax(b, h, l, s, d, dv):
    torch.manual_seed(b * 100 + l)
    # heads interleaved in the rows, as after a view and transpose of one projection
    q = torch.randn(b, l, h, d).transpose(1, 2)
    k = torch.randn(b, h, s, d)
    v = torch.randn(b, s, h, dv).transpose(1, 2)
    o, want = _run(q, k, v)
    _close(o, want)


@pytest.mark.parametrize("shape", [(1, 4, 9, 11), (2, 1, 1, 11), (1, 1, 9, 11), (2, 4, 1, 11)],
                         ids=["per-head", "per-batch", "shared", "per-key-row"])
def test_masks_broadcast_to_the_scores(shape):
    torch.manual_seed(3)
    q, k, v = torch.randn(2, 4, 9, 24), torch.randn(2, 4, 11, 24), torch.randn(2, 4, 11, 40)
    mask = torch.randn(shape) * 3
    o, want = _run(q, k, v, mask, scale=0.3)
    _close(o, want)


def test_a_causal_mask_and_a_row_masked_whole():
    torch.manual_seed(4)
    q, k, v = torch.randn(1, 2, 10, 16), torch.randn(1, 2, 10, 16), torch.randn(1, 2, 10, 16)
    mask = torch.zeros(10, 10).masked_fill(~torch.ones(10, 10, dtype=torch.bool).tril(),
                                           -math.inf)
    o, want = _run(q, k, v, mask)
    _close(o, want)
    mask[4] = -math.inf  # softmax of a row of -inf only: NaN, as torch's
    o, want = _run(q, k, v, mask)
    assert o[0, :, 4].isnan().all() and want[0, :, 4].isnan().all()
    assert o.isnan().sum() == 2 * 16
    _close(o, want)


def test_a_nan_in_a_query_makes_its_row_nan_only():
    torch.manual_seed(5)
    q, k, v = torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 32)
    q[0, 1, 7, 3] = math.nan
    o, _ = _run(q, k, v)
    nan = o.isnan()
    assert nan[0, 1, 7].all() and nan.sum() == 32


def test_the_portable_code_without_avx512_agrees(monkeypatch):
    monkeypatch.setattr(attention, "_lib", lambda: attention._build(
        ("-O3", "-mno-avx512f", "-Wno-psabi", "-fopenmp")))
    torch.manual_seed(6)
    q, k, v = torch.randn(2, 3, 21, 20), torch.randn(2, 3, 19, 20), torch.randn(2, 3, 19, 36)
    mask = torch.randn(1, 3, 21, 19)
    o, want = _run(q, k, v, mask)
    _close(o, want)
    test_a_causal_mask_and_a_row_masked_whole()


def test_an_empty_attention_is_refused():
    with pytest.raises(ValueError, match="has nothing to do"):
        attention.Attention(1, 2, 0, 4, 8, 8, 1.0)


def test_scores_far_below_the_rows_largest_weigh_exactly_nothing():
    # exp(-87) and less is 0, never a denormal: a causal mask's -inf, and finite scores
    # 90 below the row's largest
    torch.manual_seed(7)
    q, k, v = torch.zeros(1, 1, 2, 16), torch.zeros(1, 1, 3, 16), torch.randn(1, 1, 3, 16)
    mask = torch.tensor([[0.0, -90.0, -math.inf], [-86.0, 0.0, -200.0]])
    o, want = _run(q, k, v, mask)
    _close(o, want)
    torch.testing.assert_close(o[0, 0, 0], v[0, 0, 0], rtol=0, atol=0)
