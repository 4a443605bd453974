"""Exported dtypes are eager's: a pointwise op whose recorded result dtype differs from
its kernel's is refused at import, naming it (issue 35), never compiled into a silent
wrong dtype; mixed-dtype ops whose records agree compile and match eager."""

import pytest
import torch

import aot
from aot.errors import UnsupportedOp


class ThresholdBackward(torch.nn.Module):
    def forward(self, grad, x):
        return torch.ops.aten.threshold_backward(grad, x, 0.5) + 1


def test_an_op_export_records_in_another_dtype_than_eager_is_refused_by_name():
    grad, x = torch.randint(-5, 5, (4, 8)), torch.randn(4, 8)
    assert ThresholdBackward()(grad, x).dtype == torch.float32  # eager promotes
    with pytest.raises(UnsupportedOp, match=r"threshold_backward.*returns float32 in eager, "
                                            r"but torch.export recorded int64"):
        aot.compile(ThresholdBackward(), (grad, x))
    # with one dtype, as the message says, it compiles and is eager's
    cm = aot.compile(ThresholdBackward(), (grad.float(), x))
    torch.testing.assert_close(cm(grad.float(), x), ThresholdBackward()(grad.float(), x),
                               rtol=0, atol=0)


class Mixed(torch.nn.Module):
    def forward(self, i, f, b):
        return i + f, torch.where(b, f, i), b * f, i < f, torch.maximum(i, f)


@pytest.mark.parametrize("placement", ["auto", "coverage"])
def test_mixed_dtype_ops_whose_records_agree_compile_and_match_eager(placement):
    torch.manual_seed(0)
    i, f = torch.randint(-9, 9, (3, 5)), torch.randn(3, 5)
    b = torch.rand(3, 5) > 0.5
    cm = aot.compile(Mixed(), (i, f, b), placement=placement)
    for got, want in zip(cm(i, f, b), Mixed()(i, f, b)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)
