"""A sampled subset of the OpInfo coverage run (``benchmarks/opinfo_coverage.py``).

The corpus is torch's own ``op_db``, not ours: each case is an op's first CPU
sample in one dtype, as a one-op model, compiled with ``fallback="auto"`` and
``"all"`` and compared with eager, outputs and inputs, by ``run_case``'s rules
(integers and bools exact, ``"all"`` bit-exact, float32 rtol 1e-4 / atol 1e-5
and float64 rtol 1e-7 / atol 1e-9 under ``"auto"``, NaN patterns equal). The ops
are chosen to hit every class of issue 13 (no tensor inputs, float64, in-place
updates, non-tensor outputs, data-dependent shapes, storage-dependent ops,
expanded results, the smaller defects), what the full run found later (sparse
inputs, ``torch.Size`` outputs, ops IREE lowers wrong: ``aot.partition.iree_faults``)
plus plain ops of each family.
"""

import pytest

from benchmarks.opinfo_coverage import MODES, cases, run_case

_OPS = (
    "ones|arange|eye|full|tril_indices|scalar_tensor|"                       # no tensor inputs
    "double|softmax.with_dtype|cumsum|"                                      # float64
    "index_put|index_add|scatter_add|fill|zero_|"                            # in-place / scatter
    "item|allclose|"                                                         # non-tensor outputs
    "nonzero|masked_select|unique|argwhere|"                                 # data-dependent
    "as_strided|diagonal|expand|expand_as|"                                  # storage, expand
    "signbit|max.reduction_with_dim|nn.functional.scaled_dot_product_attention|"  # smaller
    "broadcast_shapes|geometric|nn.functional.instance_norm|sparse.mm.reduce|"      # found by the run
    "sort|topk|masked_fill|logcumsumexp|cfloat|rad2deg|"                     # IREE faults
    "add|mul|matmul|sum|mean|where|gather|cat|nn.functional.conv2d|nn.functional.layer_norm")
CASES = [c for c in cases(f"^({_OPS})$") if c[2] in ("float32", "float64", "int64", "bool")]


def test_the_sample_covers_every_class():
    names = {c[1].name for c in CASES}
    for op in ("ones", "double", "index_put", "item", "nonzero", "as_strided", "signbit",
               "sort", "masked_fill", "sparse.mm"):
        assert op in names
    assert len(CASES) >= 60


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_opinfo_sample(case, mode):
    _, op, dtype, k = case
    row = run_case(op, dtype, k, mode)
    assert row["status"] in ("passed", "not captured", "no sample", "eager failed"), row
