"""The ``iree-coverage`` region candidate: a program whose per-op placement put a few ops
in ATen only because each measured faster there is also compiled all in IREE and timed
end to end; the choice gives eager's values (float32 rtol 1e-5 / atol 1e-5)."""

import importlib

import torch

import aot
from aot import models
from aot.partition import cost
from aot.partition.cost import Cost
from aot.tuning.regions import choice


class Block(torch.nn.Module):
    """A squeeze-excitation block: two heavy convolutions and compiled glue."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.b = torch.nn.Conv2d(32, 16, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.a(x))
        s = torch.sigmoid(torch.nn.functional.adaptive_avg_pool2d(y, 1))
        return self.b(y * s)


def _aten_always_wins(monkeypatch, tmp_path):
    """Every measured op measures faster in ATen (the per-op placement demotes both
    convolutions), with fresh caches, and a kernel call priced at its crossings alone (as
    on drivers without a measured hand-off: the variant's condition); the IREE programs
    compiled and measured whatever their measured floor (``regions.aten_far_ahead``)."""
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(Cost, "aten_wins", property(lambda self: True))
    monkeypatch.setattr(cost, "HANDOFF_MS", 0.0)
    monkeypatch.setattr("aot.tuning.regions.FLOOR_MARGIN", float("inf"))


def test_few_measured_kernel_calls_get_an_all_compiled_candidate(monkeypatch, tmp_path):
    _aten_always_wins(monkeypatch, tmp_path)
    torch.manual_seed(0)
    m, x = Block().eval(), torch.randn(1, 16, 24, 24)
    cm = aot.compile(m, (x,))
    region = cm.manifest["region"]
    assert "iree-coverage" in region["candidates_ms"] and "iree" in region["candidates_ms"]
    assert region["chosen"] == choice(region)
    if region["chosen"] == "iree-coverage":  # its own placements: everything compiled
        assert {p["where"] for p in cm.manifest["placements"]} == {"compiled"}
        assert not cm.manifest["kernel_calls"]
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


def test_not_for_many_measured_calls_nor_unsupported_ops(monkeypatch, tmp_path):
    _aten_always_wins(monkeypatch, tmp_path)
    monkeypatch.setattr(importlib.import_module("aot.tuning.compile"), "COVERAGE_MAX_CALLS", 1)
    torch.manual_seed(0)
    m, x = Block().eval(), torch.randn(1, 16, 24, 24)
    assert "iree-coverage" not in aot.compile(m, (x,)).manifest["region"]["candidates_ms"]
    model, ex = models.get("custom_op")  # its kernel call is an op IREE does not know
    region = aot.compile(model, ex).manifest["region"]
    assert "iree-coverage" not in region["candidates_ms"]



def _measured_calls_save(ms, monkeypatch, tmp_path):
    """Both convolutions measure faster in ATen, each saving ``ms`` (crossings paid); the
    IREE program compiled whatever its measured floor."""
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(Cost, "aten_wins", property(lambda self: True))
    monkeypatch.setattr(Cost, "saving_ms", property(lambda self: ms))
    monkeypatch.setattr("aot.tuning.regions.FLOOR_MARGIN", float("inf"))


def _program_compiles(monkeypatch) -> list:
    """IREE runs on the program's bytecode (the per-op program, a variant), recorded
    (the ATen-region candidates' small modules are compiled from text)."""
    from aot.toolchain import iree_compile
    runs, real = [], iree_compile.try_compile
    monkeypatch.setattr(importlib.import_module("aot.tuning.compile"), "try_compile",
                        lambda asm, *a, **k: (runs.append(1) if isinstance(asm, bytes) else None)
                        or real(asm, *a, **k))
    return runs


def test_calls_that_save_less_than_their_hand_offs_leave_every_op_compiled(monkeypatch, tmp_path):
    """On IREE's CPU task workers, kernel calls whose measured savings do not pay for their
    hand-offs to torch's threads (``cost.HANDOFF_MS`` each) are not made: the program is
    compiled once, every op IREE covers compiled, and the placements say why."""
    _measured_calls_save(0.1, monkeypatch, tmp_path)
    torch.manual_seed(0)
    m, x = Block().eval(), torch.randn(1, 16, 24, 24)
    aot.compile(m, (x,))  # (fills the caches: the runs below are the program's own)
    runs = _program_compiles(monkeypatch)
    cm = aot.compile(m, (x,), plan={"region": "iree"})
    assert len(runs) == 1 and not cm.manifest["kernel_calls"]
    convs = [p for p in cm.manifest["placements"] if p["op"] == "aten.conv2d.default"]
    assert len(convs) == 2 and all(p["where"] == "compiled" for p in convs)
    assert all("less than their hand-offs" in p["reason"] for p in convs), convs
    assert cm.manifest["policy"]["placement"] == "auto"
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


def test_calls_that_pay_for_their_hand_offs_stay_with_no_variant(monkeypatch, tmp_path):
    """Each measured call saving more than its hand-off stays a kernel call; no
    all-compiled variant is compiled beside it on IREE's CPU task workers."""
    _measured_calls_save(5.0, monkeypatch, tmp_path)
    torch.manual_seed(0)
    m, x = Block().eval(), torch.randn(1, 16, 24, 24)
    cm = aot.compile(m, (x,))
    cands = cm.manifest["region"]["candidates_ms"]
    assert "iree-one-thread" in cands and "iree-coverage" not in cands  # calls, no variant
    per_op = aot.compile(m, (x,), plan={"region": "iree"}).manifest
    convs = [p for p in per_op["placements"] if p["op"] == "aten.conv2d.default"]
    assert [p["where"] for p in convs] == ["kernel_call"] * 2
    assert all(p["saving_ms"] == 5.0 for p in convs)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)
