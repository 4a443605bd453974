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
"""

import warnings

import pytest
import torch

import aot


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


@pytest.fixture(scope="module", params=["coverage", "all", "prepacked", "default"])
def compiled(request):
    torch.manual_seed(0)
    m = ConvI0().eval()
    kw = {"coverage": dict(placement="coverage"), "all": dict(fallback="all"),
          "prepacked": dict(plan={"region": "aten-prepacked"}),  # oneDNN, NHWC groups
          "default": {}}[request.param]
    return request.param, m, aot.compile(m, (X,), **kw)


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
