"""``benchmarks/dispatch_profile.py`` profiles a compiled model per dispatch (never a timed
assertion: the times are only checked to be consistent with each other)."""

import pytest

from benchmarks import dispatch_profile


def test_a_program_with_kernel_calls_is_refused_naming_them():
    with pytest.raises(SystemExit, match="kernel calls.*scaled_tanh"):
        dispatch_profile.compiled_program("custom_op", "coverage", [])


def test_an_unknown_model_is_refused_naming_the_choices():
    with pytest.raises(SystemExit, match="unknown model 'nope'.*resnet18_b1"):
        dispatch_profile.compiled_program("nope", "coverage", [])


def test_dispatch_kinds_drop_numbers_and_shapes():
    assert dispatch_profile._kind("main$async_dispatch_17_reduction_16x3136_f32") \
        == "reduction_f32"
    assert dispatch_profile._kind("main$async_dispatch_0_slow_memcpy") == "slow_memcpy"


@pytest.mark.slow
def test_the_bundled_bert_profiles_per_dispatch(tmp_path):
    r = dispatch_profile.profile("bert", "coverage", [], calls=3, sources=str(tmp_path))
    assert r["dispatches"] == len(r["slowest"]) > 0 and r["median_ms"] > 0
    assert r["dispatch_ms"] == pytest.approx(sum(d["us"] for d in r["slowest"]) / 1e3)
    assert sum(r["kinds_us"].values()) == pytest.approx(r["dispatch_ms"] * 1e3)
    assert any(p.suffix == ".mlir" for p in tmp_path.iterdir())  # the dispatches' code
    table = dispatch_profile.table(r, top=5)
    assert "dispatches" in table and table.count("| main$") == min(5, r["dispatches"])
