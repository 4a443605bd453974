"""``aot.toolchain.iree_compile``: a compile runs without IREE's per-pass IR checks,
gives the bytes the checked compile gives, and a failing one is run again with the
checks so its diagnostics are the checked ones."""

import torch

import aot
from aot.toolchain import iree_compile
from aot.toolchain.targets import get_target


class _Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.conv(x)).mean(dim=(2, 3))
        return torch.softmax(self.fc(y), dim=-1)


def _calls(monkeypatch) -> list[tuple]:
    """Each compile's extra flags and outcome, in order."""
    seen, real = [], iree_compile._compile_once

    def spy(asm, target, input_type, extra):
        vmfb, diag = real(asm, target, input_type, extra)
        seen.append((extra, vmfb, diag))
        return vmfb, diag
    monkeypatch.setattr(iree_compile, "_compile_once", spy)
    return seen


def test_a_compile_skips_the_checks_and_gives_the_checked_bytes(monkeypatch, tmp_path):
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    seen = _calls(monkeypatch)
    m, x = _Small().eval(), torch.randn(1, 3, 8, 8)
    cm = aot.compile(m, (x,), placement="coverage")
    torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-6)
    assert seen and all(extra == iree_compile._UNCHECKED and vmfb for extra, vmfb, _ in seen)
    # the same input compiled with the checks: the same module, byte for byte
    target = get_target("cpu")
    unchecked = iree_compile._compile_once(_MLIR, target, "torch", iree_compile._UNCHECKED)[0]
    checked = iree_compile._compile_once(_MLIR, target, "torch", ())[0]
    assert unchecked is not None and unchecked == checked


_MLIR = """
func.func @main(%a: !torch.vtensor<[4,8],f32>, %b: !torch.vtensor<[8,3],f32>) -> !torch.vtensor<[4,3],f32> {
  %0 = torch.aten.mm %a, %b : !torch.vtensor<[4,8],f32>, !torch.vtensor<[8,3],f32> -> !torch.vtensor<[4,3],f32>
  %1 = torch.aten.relu %0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[4,3],f32>
  return %1 : !torch.vtensor<[4,3],f32>
}
"""


def test_a_failing_compile_runs_again_with_the_checks(monkeypatch):
    seen = _calls(monkeypatch)
    bad = _MLIR.replace("-> !torch.vtensor<[4,3],f32>\n  %1", "-> !torch.vtensor<[4,5],f32>\n  %1")
    vmfb, diag = iree_compile.try_compile(bad, get_target("cpu"))
    assert vmfb is None
    assert [extra for extra, _, _ in seen] == [iree_compile._UNCHECKED, ()]
    assert diag == seen[-1][2] and "error" in diag


def test_a_target_that_names_the_checks_compiles_once_as_it_says(monkeypatch):
    seen = _calls(monkeypatch)
    target = get_target("cpu", extra_flags=("--verify=true",))
    vmfb, diag = iree_compile.try_compile(_MLIR, target)
    assert vmfb is not None and [extra for extra, _, _ in seen] == [()]
