"""`aot bench --quick` runs and writes its outputs (never a timed assertion)."""

import json

import pytest

from aot import cli


@pytest.mark.slow
def test_bench_quick_writes_markdown_json_and_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert cli.main(["bench", "--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    rows = {(r["model"], r["system"]): r for r in data["rows"]}
    assert {m for m, _ in rows} == {"resnet18_b1", "custom_op"}
    assert {s for _, s in rows} == {"eager", "iree-default", "aot"}
    for key in [("resnet18_b1", "eager"), ("resnet18_b1", "aot"), ("custom_op", "aot")]:
        r = rows[key]
        assert r["skipped"] is None and r["median_ms"] > 0 and len(r["samples_ms"]) == 5
        assert r["p10_ms"] <= r["median_ms"] <= r["p90_ms"] and r["speed_vs_eager"] > 0
    # IREE alone cannot run the custom op: a skipped row with the reason, not a crash
    assert "UnsupportedOp" in rows[("custom_op", "iree-default")]["skipped"]
    assert rows[("custom_op", "aot")]["kernel_calls_per_run"] == 1
    assert data["machine"]["cores"] >= 1 and data["machine"]["cpu"]
    md = (tmp_path / "bench.md").read_text()
    assert "| resnet18_b1 | aot |" in md and "speed vs eager" in md
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_unknown_model(tmp_path):
    with pytest.raises(SystemExit, match="unknown benchmark model"):
        cli.main(["bench", "--models", "nope", "--out", str(tmp_path)])
