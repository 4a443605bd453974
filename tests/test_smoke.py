"""The public API end to end in seconds: compile, call, save, load, report."""

import torch

import aot


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


def test_compile_run_save_load(tmp_path):
    m = Small().eval()
    x = torch.randn(2, 8)
    cm = aot.compile(m, (x,))
    ref = m(x)
    # fp32 matmul in IREE vs oneDNN: summation order differs, hence 1e-5.
    torch.testing.assert_close(cm(x), ref, rtol=1e-5, atol=1e-5)
    path = str(tmp_path / "small.aot")
    cm.save(path)
    cm2 = aot.load(path)
    torch.testing.assert_close(cm2(x), cm(x), rtol=0, atol=0)
    text = aot.report(path)
    assert "ops:" in text and "compiled by IREE" in text
    assert cm.manifest["kernel_calls"] == []


def test_all_fallback_is_bit_exact():
    m = Small().eval()
    x = torch.randn(2, 8)
    cm = aot.compile(m, (x,), fallback="all")
    torch.testing.assert_close(cm(x), m(x), rtol=0, atol=0)
    assert cm.kernel_call_count > 0
    assert all(p["where"] == "kernel_call" for p in cm.manifest["placements"])
