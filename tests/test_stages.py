"""The staged entry point (``aot.stages``): options resolved once, the model exported
once, each stage a method; ``aot.compile`` and the CLI go through it."""

import pytest
import torch

import aot
from aot.stage_names import EMIT
from aot.stages import Options, export


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def test_every_stage_from_one_export(tmp_path):
    torch.manual_seed(0)
    m, x = Small().eval(), torch.randn(1, 3, 16, 16)
    exported = export(m, (x,), options=Options.resolve(placement="coverage"))
    assert "torch.aten.conv2d" in exported.emit("torch")
    assert "func.func @main" in exported.emit("partitioned")
    vmfb = exported.emit("vmfb")
    assert isinstance(vmfb, bytes) and len(vmfb) > 1000
    art = exported.compile()
    assert art.manifest["policy"]["placement"] == "coverage" and not art.manifest["kernel_calls"]
    cm = aot.CompiledModule(art)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
    assert EMIT == ("torch", "partitioned", "stablehlo", "vmfb")


def test_options_are_checked_once_with_clear_errors():
    with pytest.raises(aot.UnsupportedOp, match="placement"):
        Options.resolve(placement="fastest")
    with pytest.raises(aot.AotError):
        Options.resolve(target="tpu")
    opts = Options.resolve(fallback="all")
    assert opts.import_options.pt2e_integer_ops is False and opts.policy.fallback == "all"
    exported = export(Small().eval(), torch.randn(1, 3, 8, 8), options=opts)
    with pytest.raises(aot.UnsupportedOp, match="no stage 'llvm'"):
        exported.emit("llvm")
