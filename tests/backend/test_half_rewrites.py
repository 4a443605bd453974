"""Compiled reductions of float16/bfloat16 tensors accumulate in float32 as ATen's do
(issue 35): no overflow to inf or NaN where eager has none, and means, sums, softmax
and cumulative sums within a unit in the last place of eager's."""

import pytest
import torch

import aot


class Reductions(torch.nn.Module):
    def forward(self, x):
        return (x.sum(dim=[2, 3]), x.mean(dim=[2, 3]), torch.softmax(x, -1), x.cumsum(-1),
                torch.nn.functional.layer_norm(x, x.shape[-2:]),
                torch.nn.functional.group_norm(x, 2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_long_half_reductions_are_eagers(dtype):
    torch.manual_seed(0)
    # 512 K values near 12 per channel: a float16 running sum passes 65504 after ~5,500
    x = (torch.rand(1, 2, 512, 1024) * 4 + 10).to(dtype)
    m = Reductions().eval()
    cm = aot.compile(m, (x,), placement="coverage")
    assert all(p["where"] == "compiled" for p in cm.manifest.placements)
    eps = torch.finfo(dtype).eps  # one unit in the last place at 1
    for i, (got, want) in enumerate(zip(cm(x), m(x))):
        assert got.dtype == want.dtype
        assert torch.equal(got.isinf(), want.isinf()) and not got.isnan().any(), i
        finite = ~want.isinf()
        # within one unit in the last place of eager's result (the norms: of their
        # magnitude, about 1-2, as IREE's float32 sums are not ATen's)
        scale = want[finite].float().abs().clamp_min(1.0 if i >= 4 else 0.0)
        err = (got[finite].float() - want[finite].float()).abs()
        assert (err <= 2 * eps * scale + 1e-6).all(), (i, err.max().item())
