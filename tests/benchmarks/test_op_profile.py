"""``benchmarks/op_profile.py`` sets ONNX Runtime's per-op profile beside aot's (never a
timed assertion: the times are only checked to be consistent with each other)."""

import pytest

from benchmarks import op_profile


def test_op_types_fall_into_coarse_groups():
    cases = {"FusedConv": "convolution", "mkldnn::_convolution_pointwise": "convolution",
             "MatMul": "matmul", "mmt4d_f32": "matmul", "mkldnn::_linear_pointwise": "matmul",
             "Softmax": "attention", "aten::_scaled_dot_product_flash_attention_for_cpu":
             "attention", "LayerNormalization": "normalisation", "reduction_f32":
             "normalisation", "unpack_elementwise_f32_pack": "elementwise", "pack_f32":
             "data movement",
             "Transpose": "data movement", "Add": "elementwise", "HardSigmoid": "elementwise",
             "elementwise_f32": "elementwise", "Shape": "other"}
    assert {op: op_profile.group(op) for op in cases} == cases


def test_the_table_sets_groups_side_by_side():
    ort = {"median_ms": 1.0, "ops_ms": {"FusedConv": 0.6, "Gemm": 0.2},
           "what": "ONNX Runtime"}
    ours = {"median_ms": 2.0, "chosen": "iree-tiled", "what": "aot",
            "ops_ms": {"conv_f32": 0.9, "mmt4d_f32": 0.5, "(between dispatches)": 0.4}}
    t = op_profile.table("m", ort, ours, top=5)
    assert "0.50x ONNX Runtime's speed" in t
    assert "| convolution | 0.600 | 0.900 | +0.300 |" in t
    assert "| between dispatches | 0.000 | 0.400 | +0.400 |" in t
    assert "| matmul | 0.200 | 0.500 | +0.300 |" in t


@pytest.mark.slow
def test_the_bundled_bert_profiles_on_both_sides():
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    ort = op_profile._side("ort", "bert", 5)
    ours = op_profile._side("aot", "bert", 5)
    for side in (ort, ours):
        assert side["median_ms"] > 0 and side["ops_ms"]
        assert all(v >= 0 for v in side["ops_ms"].values())
    assert any(op_profile.group(k) == "matmul" for k in ort["ops_ms"])
