"""Inputs in any strided layout give eager's answer; strict_layout refuses them.

A module compiled from contiguous examples is given channels-last, transposed,
offset and expanded tensors, on the compiled (+ kernel call), all-fallback,
prepacked (pinned by a plan) and default (measured region) paths: the outputs are
eager's within float32 rtol 1e-5 / atol 1e-5. Under ``fallback="all"`` they are
bit-exact with eager on the input converted to the compiled layout (which is what
the module runs); eager on the channels-last tensor itself may round one ulp
differently (oneDNN picks another convolution kernel for NHWC). Each conversion
is counted and warned about once; ``strict_layout=True`` makes it an
``InputMismatch``; a non-strided layout is an ``InputMismatch`` naming it.

A row-major input whose data is not 64-byte aligned (``x[1:]``, ``torch.frombuffer``
at an offset, ``np.frombuffer``), which IREE cannot import, is copied into an aligned
buffer and counted, under ``strict_layout`` too; an aligned one is not copied. A
kernel call's result that is a view at an unaligned offset is copied likewise. Compiled
code is compared with eager within float32 rtol 1e-5 / atol 1e-5, ATen-only paths
bit-exact.
"""

import warnings

import numpy as np
import pytest
import torch

import aot
from aot.fallback import onednn_graph
from aot.fallback.executor import ExecOptions
from aot.runtime.module import CompiledModule
from aot.tuning.regions import _with_executor
import aot.fallback.executor as executor
from aot.runtime.device import ALIGN, _copy_at_aligned_offset, aligned_copy

# the copies of unaligned inputs warn (once per module): asserted where it matters
pytestmark = pytest.mark.filterwarnings("ignore:.*not 64-byte aligned:UserWarning")


class ConvI0(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.special.i0(self.conv(x) * 0.1) + 1


X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
LAYOUTS = {
    "channels_last": lambda: X.contiguous(memory_format=torch.channels_last),
    "transposed": lambda: X.transpose(2, 3).contiguous().transpose(2, 3),
    "offset": lambda: torch.cat([torch.randn(1, 3, 8, 8), X])[1:],
    "expanded": lambda: X[:1].expand(2, 3, 8, 8),
}
CONVERTED = {"channels_last", "transposed", "expanded"}  # an offset view is still row-major


@pytest.fixture(scope="module",
                params=["coverage", "all", "prepacked", "onednn-graph", "default"])
def compiled(request):
    torch.manual_seed(0)
    m = ConvI0().eval()
    kw = {"coverage": dict(placement="coverage"), "all": dict(fallback="all"),
          "prepacked": dict(plan={"region": "aten-prepacked"}),  # oneDNN, NHWC groups
          "onednn-graph": dict(fallback="all"),  # one fused graph (below)
          "default": {}}[request.param]
    if request.param == "onednn-graph" and not onednn_graph.available():
        pytest.skip("this torch build reaches no oneDNN Graph (x86 only)")
    cm = aot.compile(m, (X,), **kw)
    if request.param == "onednn-graph":  # the region as one graph (too small to be raced)
        cm = CompiledModule(_with_executor(cm.artifact, ExecOptions(onednn_graph=True)))
    return request.param, m, cm


def test_any_strided_input_gives_eagers_answer(compiled):
    mode, m, cm = compiled
    tol = dict(rtol=1e-5, atol=1e-5)
    before = cm.layout_conversions
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, make in LAYOUTS.items():
            x = make()
            with torch.no_grad():
                got = cm(x)
                torch.testing.assert_close(got, m(x), **tol)
                if mode == "all":  # the round trip: eager's kernels on the converted input
                    torch.testing.assert_close(got, m(x.contiguous()), rtol=0, atol=0)
    assert cm.layout_conversions - before == len(CONVERTED)
    assert len([w for w in caught if "converted on every such call" in str(w.message)]) <= 1


def test_strict_layout_refuses(compiled):
    _, _, cm = compiled
    cm.strict_layout = True
    try:
        with pytest.raises(aot.InputMismatch, match="memory format mismatch.*channels_last"):
            cm(LAYOUTS["channels_last"]())
        cm(X)  # the compiled layout still runs
    finally:
        cm.strict_layout = False


def test_non_strided_layout_is_named(compiled):
    _, _, cm = compiled
    with pytest.raises(aot.InputMismatch, match="layout mismatch: expected strided, got sparse_coo"):
        cm(X.to_sparse())


TOL = dict(rtol=1e-5, atol=1e-5)


def unaligned(n: int, dtype=torch.float32) -> torch.Tensor:
    """A contiguous ``n``-element tensor whose data is not ``ALIGN``-byte aligned."""
    t = torch.randn(n + 1, generator=torch.Generator().manual_seed(n)).to(dtype)[1:]
    assert t.is_contiguous() and t.data_ptr() % ALIGN
    return t


def unaligned_buffer(nbytes: int) -> tuple[bytearray, int]:
    """A bytearray and an offset into it (a multiple of 4) at which data is unaligned."""
    buf = bytearray(nbytes + ALIGN)
    base = torch.frombuffer(buf, dtype=torch.uint8).data_ptr()
    return buf, next(off for off in (4, 8) if (base + off) % ALIGN)


class Elementwise(torch.nn.Module):
    def forward(self, x):
        return torch.sin(x) * 2 + x


class SinCall(Elementwise):  # sin forced to a kernel call; mul and add compiled
    pass


class SlicedI0(torch.nn.Module):
    """i0 then a slice, both kernel calls: one group whose result is ``t[1:]`` of a
    fresh intermediate (4 bytes into it), the add after it compiled."""

    def forward(self, x):
        return torch.special.i0(x * 0.5)[1:] + 1


@pytest.fixture(scope="module")
def elementwise():
    return Elementwise(), aot.compile(Elementwise(), (torch.randn(16),), placement="coverage")


def test_unaligned_slice_input_is_copied_and_counted(elementwise):
    m, cm = elementwise
    x = unaligned(16)
    before = cm.layout_conversions
    torch.testing.assert_close(cm(x), m(x), **TOL)  # was: InputMismatch, "aligned to 64"
    assert cm.layout_conversions == before + 1


def test_aligned_input_is_not_copied(elementwise, monkeypatch):
    m, cm = elementwise
    x = torch.randn(16)
    assert x.data_ptr() % ALIGN == 0
    copies = []
    monkeypatch.setattr(aot.runtime.module, "aligned_copy",
                        lambda t: copies.append(t) or aligned_copy(t))
    before = cm.layout_conversions
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(cm(x), m(x), **TOL)
    assert cm.layout_conversions == before and not copies


def test_unaligned_input_under_strict_layout_is_copied_too(elementwise):
    """Alignment is no layout the strides show: strict_layout copies (and counts) it."""
    m, cm = elementwise
    cm.strict_layout = True
    try:
        before = cm.layout_conversions
        x = unaligned(16)
        torch.testing.assert_close(cm(x), m(x), **TOL)
        assert cm.layout_conversions == before + 1
    finally:
        cm.strict_layout = False


def test_unaligned_copy_is_warned_about_once():
    cm = aot.compile(Elementwise(), (torch.randn(16),), placement="coverage")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            cm(unaligned(16))
    ours = [w for w in caught if "64-byte aligned" in str(w.message)]
    assert len(ours) == 1 and "copied into an aligned buffer" in str(ours[0].message)
    assert ours[0].filename == __file__  # it points at the caller
    assert cm.layout_conversions == 3


def test_torch_frombuffer_at_an_offset_into_linear():
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 3).eval()
    cm = aot.compile(lin, (torch.randn(4, 6),), placement="coverage")
    buf, off = unaligned_buffer(4 * 24)
    x = torch.frombuffer(buf, dtype=torch.float32, count=24, offset=off).reshape(4, 6)
    x.copy_(torch.randn(4, 6))
    assert x.data_ptr() % ALIGN
    with torch.no_grad():
        torch.testing.assert_close(cm(x), lin(x), **TOL)
    assert cm.layout_conversions == 1


def test_from_numpy_of_unaligned_frombuffer(elementwise):
    m, cm = elementwise
    buf, off = unaligned_buffer(4 * 16)
    a = np.frombuffer(buf, dtype=np.float32, count=16, offset=off)
    a[:] = np.random.default_rng(0).standard_normal(16, np.float32)
    x = torch.from_numpy(a)
    assert x.data_ptr() % ALIGN
    before = cm.layout_conversions
    torch.testing.assert_close(cm(x), m(x), **TOL)
    assert cm.layout_conversions == before + 1


def test_numpy_runtime_counts_unaligned_arrays(elementwise, tmp_path):
    m, cm = elementwise
    cm.save(str(tmp_path / "e.aot"))
    n = aot.load(str(tmp_path / "e.aot"), arrays="numpy")
    buf, off = unaligned_buffer(4 * 16)
    a = np.frombuffer(buf, dtype=np.float32, count=16, offset=off)
    a[:] = np.random.default_rng(1).standard_normal(16, np.float32)
    with pytest.warns(UserWarning, match="not 64-byte aligned"):
        got = n(a)
    np.testing.assert_allclose(got, m(torch.from_numpy(a)).numpy(), **TOL)
    assert n.layout_conversions == 1
    n(torch.randn(16).numpy())  # torch's allocation: aligned, not copied
    assert n.layout_conversions == 1


@pytest.mark.parametrize("mode", ["kernel call", "all"])
def test_unaligned_input_with_kernel_calls(mode):
    """A kernel call behind the input: copied (counted) where IREE takes the input;
    a program that is one kernel call runs ATen on it as it is (bit-exact, no copy)."""
    kw = (dict(placement="coverage", fallback_ops=["aten.sin"]) if mode == "kernel call"
          else dict(fallback="all"))
    m = SinCall()
    cm = aot.compile(m, (torch.randn(4, 16),), **kw)
    assert "aten.sin" in cm.report()
    x = unaligned(64).view(4, 16)
    got = cm(x)
    if mode == "all":
        assert torch.equal(got, m(x)) and cm.layout_conversions == 0
    else:
        torch.testing.assert_close(got, m(x), **TOL)
        assert cm.layout_conversions == 1 and cm.kernel_call_count == 1


def test_kernel_call_result_at_an_unaligned_offset_is_copied(monkeypatch):
    m = SlicedI0()
    x = torch.randn(17, generator=torch.Generator().manual_seed(3))
    cm = aot.compile(m, (x,), placement="coverage", fallback_ops=["aten.slice"])
    report = cm.report()
    calls = report[report.index("kernel calls ("):report.index("\ncompiled ops:")]
    assert "aten.slice.Tensor" in calls and "aten.special_i0" in calls, report
    assert len(cm.kernel_calls) == 1 and cm.kernel_calls[0].is_group  # i0 -> slice
    copies = []
    monkeypatch.setattr(executor, "aligned_copy", lambda t: copies.append(
        t.data_ptr() % ALIGN) or aligned_copy(t))
    # was: KernelCallFailed, "imported heap buffer data must be aligned to 64"
    torch.testing.assert_close(cm(x), m(x), **TOL)
    assert copies == [4]  # the view 4 bytes into i0's result
    assert cm.layout_conversions == 0  # (an input: aligned)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int8, torch.bool,
                                   torch.bfloat16, torch.complex64])
@pytest.mark.parametrize("shape", [(3, 5), (), (0, 4)])
def test_aligned_copy_where_the_allocator_does_not_align(dtype, shape, monkeypatch):
    """The fallback: a larger buffer, the copy at its first aligned address."""
    t = torch.randn(shape).to(dtype)
    got = _copy_at_aligned_offset(t)
    assert got.data_ptr() % ALIGN == 0 and got.shape == t.shape and torch.equal(got, t)
    clone = torch.Tensor.clone  # an allocator that never aligns: aligned_copy falls back
    monkeypatch.setattr(torch.Tensor, "clone", lambda self, **kw: torch.empty(
        self.numel() + 1, dtype=self.dtype)[1:].view(self.shape).copy_(self))
    got = aligned_copy(t)
    monkeypatch.setattr(torch.Tensor, "clone", clone)
    assert got.data_ptr() % ALIGN == 0 and torch.equal(got, t) and got.is_contiguous()


@pytest.mark.gpu
def test_unaligned_cuda_input_and_result_are_copied():
    """On CUDA IREE imports any pointer, but its kernels fault on unaligned ones
    (CUDA_ERROR_MISALIGNED_ADDRESS): an unaligned input and a kernel call's unaligned
    view are copied as on the CPU."""
    m = SlicedI0()
    cm = aot.compile(m, (torch.randn(17, device="cuda"),), target="cuda",
                     placement="coverage", fallback_ops=["aten.slice"])
    for off in (0, 1):  # aligned input, unaligned result view; both unaligned
        x = torch.randn(17 + off, device="cuda")[off:]
        torch.testing.assert_close(cm(x), m(x), **TOL)
    assert cm.layout_conversions == 1
