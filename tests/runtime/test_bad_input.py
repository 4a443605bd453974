"""Bad input gives a clear error naming what was wrong and what was expected (issue #2, item 10)."""

import pytest
import torch

import aot


class TwoIn(torch.nn.Module):
    def forward(self, x, y, scale=2.0):
        return (x + y) * scale


@pytest.fixture(scope="module")
def cm():
    return aot.compile(TwoIn().eval(), (torch.randn(2, 3), torch.randn(2, 3)))


def test_good_call(cm):
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    torch.testing.assert_close(cm(x, y), (x + y) * 2.0, rtol=1e-6, atol=1e-6)


def test_wrong_number_of_inputs(cm):
    with pytest.raises(aot.InputMismatch, match="expected 2 positional input"):
        cm(torch.randn(2, 3))


def test_wrong_shape(cm):
    with pytest.raises(aot.InputMismatch, match=r"args\[1\]: shape mismatch: expected \[2, 3\], got \[3, 3\]"):
        cm(torch.randn(2, 3), torch.randn(3, 3))


def test_wrong_dtype(cm):
    with pytest.raises(aot.InputMismatch, match="dtype mismatch: expected float32, got float64"):
        cm(torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3))


def test_non_tensor_where_tensor_expected(cm):
    with pytest.raises(aot.InputMismatch, match="expected a torch.Tensor float32.*got list"):
        cm([[1.0] * 3] * 2, torch.randn(2, 3))


def test_wrong_memory_format_under_strict_layout(cm):
    x = torch.randn(3, 2).t()  # same shape, transposed strides
    cm.strict_layout = True
    try:
        with pytest.raises(aot.InputMismatch, match="memory format mismatch"):
            cm(x, torch.randn(2, 3))
    finally:
        cm.strict_layout = False


def test_wrong_device(cm):
    meta = torch.empty(2, 3, device="meta")
    with pytest.raises(aot.InputMismatch, match="expected a tensor on cpu"):
        cm(meta, torch.randn(2, 3))


def test_changed_static_value():
    m = TwoIn().eval()
    cm = aot.compile(m, (torch.randn(2, 3), torch.randn(2, 3)), example_kwargs={"scale": 3.0})
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    torch.testing.assert_close(cm(x, y, scale=3.0), m(x, y, scale=3.0), rtol=1e-6, atol=1e-6)
    with pytest.raises(aot.InputMismatch, match="compiled with the value 3.0 here, got 4.0"):
        cm(x, y, scale=4.0)


class DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # Python control flow on data: torch.export cannot capture it
            return x + 1
        return x - 1


def test_model_export_cannot_capture():
    with pytest.raises(aot.ExportFailed, match="torch.export could not capture DataDependent"):
        aot.compile(DataDependent(), (torch.randn(3),))


def test_not_a_module():
    with pytest.raises(aot.ExportFailed, match="must be a torch.nn.Module, got function"):
        aot.compile(lambda x: x, (torch.randn(3),))


def test_bad_policy():
    with pytest.raises(aot.UnsupportedOp, match="fallback='sometimes' is not a policy"):
        aot.compile(TwoIn(), (torch.randn(2), torch.randn(2)), fallback="sometimes")


def test_unknown_target():
    with pytest.raises(aot.CompileFailed, match="unknown target 'tpu'"):
        aot.compile(TwoIn(), (torch.randn(2), torch.randn(2)), target="tpu")


class MutatesInput(torch.nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2


def test_mutating_model_updates_the_callers_tensor():
    cm = aot.compile(MutatesInput(), (torch.randn(3),))
    x = torch.randn(3)
    x_eager = x.clone()
    y = cm(x)
    torch.testing.assert_close(y, MutatesInput()(x_eager), rtol=0, atol=0)
    torch.testing.assert_close(x, x_eager, rtol=0, atol=0)  # updated in place, as eager does
