"""The ``iree-coverage`` region candidate: a program whose per-op placement put a few ops
in ATen only because each measured faster there is also compiled all in IREE and timed
end to end; the choice gives eager's values (float32 rtol 1e-5 / atol 1e-5)."""

import importlib

import torch

import aot
import models
from aot.lower.cost import Cost
from aot.lower.regions import choice


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
    convolutions), with fresh caches."""
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(Cost, "aten_wins", property(lambda self: True))


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
    monkeypatch.setattr(importlib.import_module("aot.lower.compile"), "COVERAGE_MAX_CALLS", 1)
    torch.manual_seed(0)
    m, x = Block().eval(), torch.randn(1, 16, 24, 24)
    assert "iree-coverage" not in aot.compile(m, (x,)).manifest["region"]["candidates_ms"]
    model, ex = models.get("custom_op")  # its kernel call is an op IREE does not know
    region = aot.compile(model, ex).manifest["region"]
    assert "iree-coverage" not in region["candidates_ms"]
