"""`aot bench`'s process layout: one worker process per system, a coordinator
interleaving them, and a failed, dead or hung worker as a skipped row (never a
timed assertion)."""

import os
import time

import pytest

from aot.bench import isolated, suite


def _quiet(msg):
    pass


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_each_system_runs_in_its_own_worker_process():
    rows = isolated.run_model_isolated("custom_op", ["eager", "aot"], runs=3, warmup=1,
                                       target="cpu", log=_quiet)
    by = {r.system: r for r in rows}
    assert list(by) == ["eager", "aot"]
    for r in rows:
        assert r.skipped is None, r.skipped
        assert len(r.samples_ms) >= 3 and r.median_ms > 0
        assert r.p10_ms <= r.median_ms <= r.p90_ms
        assert r.rel_err is not None and r.rel_err <= suite.REL_TOL, (r.system, r.rel_err)
        assert r.batch == 4 and r.peak_rss_mb is not None
    pids = {r.pid for r in rows}
    assert len(pids) == 2 and os.getpid() not in pids and None not in pids
    assert all(_gone(p) for p in pids)  # stopped after timing
    assert by["aot"].choice and by["aot"].compile_s > 0 and by["eager"].compile_s == 0
    assert by["aot"].kernel_calls_per_run == 1 and by["eager"].kernel_calls_per_run == 0
    assert by["eager"].speed_vs_eager == 1.0
    md = suite.markdown(rows, suite.machine_info("cpu"), 3)
    assert "Each system ran in its own worker process" in md and "p10–p90" in md


def test_a_worker_whose_build_fails_is_a_skipped_row():
    rows = isolated.run_model_isolated("custom_op", ["eager", "aot"], runs=2, warmup=0,
                                       target="cpu", log=_quiet, faults={"aot": "build"})
    by = {r.system: r for r in rows}
    assert by["aot"].skipped == "RuntimeError: injected build failure of aot (test hook)"
    assert by["aot"].median_ms is None and by["aot"].pid not in (None, os.getpid())
    assert by["aot"].batch == 4  # known from the workers that built
    assert by["eager"].skipped is None and len(by["eager"].samples_ms) >= 2


def test_a_worker_that_dies_or_hangs_mid_run_is_a_skipped_row():
    """The coordinator kills a hung worker after the block timeout and goes on."""
    t0 = time.monotonic()
    rows = isolated.run_model_isolated(
        "custom_op", ["eager", "aot", "aot-coverage"], runs=6, warmup=0, target="cpu",
        log=_quiet, faults={"aot": "exit", "aot-coverage": "hang"}, block_timeout_s=3)
    assert time.monotonic() - t0 < 120
    by = {r.system: r for r in rows}
    assert by["aot"].skipped == "worker died while timing (exit code 3)"
    assert by["aot-coverage"].skipped == "worker gave no answer in 3 s while timing; killed"
    for s in ("aot", "aot-coverage"):
        assert by[s].median_ms is None and _gone(by[s].pid)
    assert by["eager"].skipped is None and len(by["eager"].samples_ms) >= 6
    assert by["eager"].p10_ms <= by["eager"].median_ms <= by["eager"].p90_ms


def test_the_header_names_the_process_layout():
    info = suite.machine_info("cpu")
    rows = [suite.Row("m", "eager", "cpu", 1, rel_err=0.0, median_ms=2.0, p10_ms=1.5,
                      p90_ms=3.0, samples_ms=[1.5, 2.0, 3.0], pid=os.getpid() + 1)]
    md = suite.markdown(rows, info, 3)
    assert md.startswith(f"Machine: {info['cpu']}")
    assert "Each system ran in its own worker process" in md
    assert "interleaved round by round" in md and "| 2.00 | 1.50–3.00 | 3 |" in md
    assert "All systems ran in one process" in suite.markdown(rows, {**info, "in_process": True}, 3)


def test_bench_has_an_in_process_flag():
    from aot import cli

    p = cli.build_parser()
    assert p.parse_args(["bench", "--in-process"]).in_process
    assert not p.parse_args(["bench"]).in_process


def test_real_model_sets():
    real = suite.expand(["real"], suite.MODEL_SETS)
    assert real == list(suite.MODEL_SETS["hf"] + suite.MODEL_SETS["timm"])
    assert {"distilbert_b1", "t5_small_enc_b1", "llama_small_b1", "hf_bert_base_b1",
            "timm_mobilevit_s_b1"} <= set(real)
    assert all(m in suite.BENCH_MODELS for m in real)


@pytest.mark.parametrize("name", ["llama_small_b1", "timm_convnext_atto_b1"])
def test_real_models_are_deterministic_and_export(name):
    """Every worker builds the same weights; the model exports and returns one tensor."""
    import torch

    pytest.importorskip("transformers" if "timm" not in name else "timm")
    model, example, _ = suite.load_model(name, "cpu")
    again, example2, _ = suite.load_model(name, "cpu")
    assert isolated._digest(model, example) == isolated._digest(again, example2)
    with torch.no_grad():
        y = model(*example)
        ep = torch.export.export(model, example)
    assert isinstance(y, torch.Tensor) and y.abs().max() > 1e-3
    torch.testing.assert_close(ep.module()(*example), y)
