"""``aot.toolchain.iree_compile``: a large program compiles in two phases (IREE's checks
up to the executables' sources, none in their code generation) to the same bytes as one
checked compile; small programs and user-set phase flags compile in one."""

import torch

import aot.toolchain.iree_compile as ic
from aot.stages import Options, export
from aot.toolchain.targets import get_target


def _program() -> str:
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    return export(m.eval(), (torch.randn(4, 64),),
                  options=Options.resolve(placement="coverage")).emit("partitioned")


def _runs(monkeypatch) -> list:
    seen = []
    run = ic._run

    def spy(src, out, target, input_type, phase):
        seen.append(phase)
        return run(src, out, target, input_type, phase)

    monkeypatch.setattr(ic, "_run", spy)
    return seen


def test_a_large_program_compiles_in_two_phases_to_the_same_bytes(monkeypatch):
    asm, target = _program(), get_target("cpu")
    seen = _runs(monkeypatch)
    monkeypatch.setattr(ic, "SPLIT_MIN_BYTES", 0)
    split, diag = ic.try_compile(asm, target)
    assert split is not None, diag
    assert seen == [(f"--compile-to={ic.SPLIT_AT}", "--mlir-print-debuginfo"),
                    (f"--compile-from={ic.SPLIT_AT}", "--verify=false")]
    monkeypatch.setattr(ic, "SPLIT_MIN_BYTES", 1 << 40)
    whole, diag = ic.try_compile(asm, target)
    assert whole is not None, diag
    assert seen[2:] == [()]
    assert split == whole


def test_phase_flags_the_user_set_keep_one_compile(monkeypatch):
    asm = _program()
    seen = _runs(monkeypatch)
    monkeypatch.setattr(ic, "SPLIT_MIN_BYTES", 0)
    vmfb, diag = ic.try_compile(asm, get_target("cpu", extra_flags=("--verify=true",)))
    assert vmfb is not None, diag
    assert seen == [()]


def test_a_failure_in_the_checked_phase_returns_its_diagnostics(monkeypatch):
    seen = _runs(monkeypatch)
    monkeypatch.setattr(ic, "SPLIT_MIN_BYTES", 0)
    vmfb, diag = ic.try_compile("func.func @main() { %0 = not.an_op : i32 }",
                                get_target("cpu"))
    assert vmfb is None and "error" in diag
    assert len(seen) == 1  # the second phase never ran
