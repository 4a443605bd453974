"""`aot bench --quick` runs and writes its outputs (never a timed assertion)."""

import json

import pytest
import torch

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
        assert r["skipped"] is None and r["median_ms"] > 0 and len(r["samples_ms"]) >= 5
        assert r["p10_ms"] <= r["median_ms"] <= r["p90_ms"] and r["speed_vs_eager"] > 0
    # IREE alone cannot run the custom op: a skipped row with the reason, not a crash
    assert "UnsupportedOp" in rows[("custom_op", "iree-default")]["skipped"]
    assert rows[("custom_op", "aot")]["kernel_calls_per_run"] == 1
    assert data["machine"]["cores"] >= 1 and data["machine"]["cpu"]
    md = (tmp_path / "bench.md").read_text()
    assert "| resnet18_b1 | aot (" in md and "speed vs eager" in md
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_unknown_model(tmp_path):
    with pytest.raises(SystemExit, match="unknown benchmark model"):
        cli.main(["bench", "--models", "nope", "--out", str(tmp_path)])


def test_bench_peers_on_a_small_model(tmp_path, monkeypatch):
    """Each installed peer runs and gives eager's answer; a missing one is a skipped row
    naming its package; the summary compares aot with the fastest correct peer."""
    import torch

    from aot.bench import driver, suite

    def small():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        return m.eval(), (torch.randn(2, 32),)
    monkeypatch.setitem(suite.BENCH_MODELS, "tiny", small)
    systems = ["eager", "onnxruntime", "openvino", "aot"]
    # in process: the worker processes of the default layout build models by name and
    # would not see this one
    rows = driver.run_suite(["tiny"], systems, runs=3, warmup=1, target="cpu", log=lambda s: None,
                           in_process=True)
    by = {r.system: r for r in rows}
    for s in systems:
        r = by[s]
        if r.skipped:  # only a missing package may skip a peer here
            assert s in ("onnxruntime", "openvino") and "not installed" in r.skipped
            continue
        assert r.rel_err is not None and r.rel_err <= suite.REL_TOL, (s, r.rel_err)
        assert len(r.samples_ms) >= 3 and r.median_ms > 0
    md = suite.markdown(rows, suite.machine_info("cpu"), 3)
    assert "fastest peer" in md and "| tiny | aot (" in md and by["aot"].choice


def test_bench_model_and_system_sets():
    from aot.bench import suite
    assert suite.expand(["zoo_b1"], suite.MODEL_SETS)[:2] == ["resnet18_b1", "resnet50_b1"]
    assert "bert_base_b8" in suite.expand(["zoo"], suite.MODEL_SETS)
    assert suite.expand(["peers", "aot-coverage"], suite.SYSTEM_SETS) == [
        "eager", "eager-heap", "inductor-freezing", "aotinductor", "onnxruntime", "openvino", "aot",
        "aot-coverage"]
    assert all(m in suite.BENCH_MODELS for m in suite.MODEL_SETS["zoo"])


def test_rel_err_of_mismatched_outputs_is_infinite():
    import torch

    from aot.bench import suite
    assert suite._rel_err(torch.ones(3), torch.ones(4)) == float("inf")
    assert suite._rel_err((torch.ones(3),), (torch.ones(3), torch.ones(3))) == float("inf")
    assert suite._rel_err(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0])) == 0.5


def test_zoo_models_give_nonzero_outputs():
    """A model whose output is all zeros (torchvision's ViT head is zero-initialised)
    would make the bench's correctness check against eager compare zeros."""
    pytest.importorskip("torchvision")
    from aot.models.zoo import vision_model

    for name in ("vit_b_16", "mobilenet_v3_small"):
        m, (x,) = vision_model(name)
        with torch.no_grad():
            y = m(x)
        assert y.abs().max() > 1e-4 and y.std() > 0, name  # MobileNetV3: ~7e-3


def test_outputs_are_written_after_each_model(tmp_path):
    """An interrupted long run keeps the models it finished."""
    from aot.bench import driver

    seen = []
    rows = driver.run_suite(["custom_op", "bert"], ["eager"], runs=2, warmup=1, target="cpu",
                           log=lambda msg: None, on_model=lambda rs: seen.append(
                               [r.model for r in rs]))
    assert seen == [["custom_op"], ["custom_op", "bert"]]
    assert all(r.median_ms > 0 for r in rows)


def test_bench_generate_writes_its_table(tmp_path, capsys):
    """``aot bench --generate``: each system in its own process, the tokens compared with
    the first system's (eager twice here: the aot path is tests/e2e/test_causal_lm.py)."""
    pytest.importorskip("transformers")
    assert cli.main(["bench", "--generate", "4:3", "--models", "llama_tiny", "--systems",
                     "eager,eager", "--runs", "2", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "generate.md").read_text()
    assert "model llama_tiny, prompt 4, 3 new tokens" in md
    rows = [r for r in md.splitlines() if r.startswith("| eager |")]
    assert len(rows) == 1 and rows[0].endswith("| yes |")  # one row per system name
    for bad in ("4", "4:1", "x:3"):
        with pytest.raises(SystemExit, match="PROMPT:NEW"):
            cli.main(["bench", "--generate", bad, "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="no generation system"):
        cli.main(["bench", "--generate", "4:3", "--systems", "onnxruntime",
                  "--out", str(tmp_path)])
