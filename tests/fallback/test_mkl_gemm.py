"""MKL's packed GEMM through torch's own library (``aot.fallback.mkl_gemm``), against
``torch.nn.functional.linear``. Tolerance: MKL sums in its own order (rtol 1e-5,
atol 1e-5 on these sizes)."""

import pytest
import torch

from aot.fallback import mkl_gemm

pytestmark = pytest.mark.skipif(not mkl_gemm.available(),
                                reason="this torch build exports no MKL packed GEMM")


@pytest.mark.parametrize("rows,k,n", [(1, 8, 5), (7, 32, 96), (197, 64, 48)])
def test_the_packed_product_writes_x_times_w_transposed_into_the_given_buffer(rows, k, n):
    torch.manual_seed(rows + k + n)
    x, w = torch.randn(rows, k), torch.randn(n, k)
    packed = mkl_gemm.Packed(w, rows)
    out = torch.full((rows, n), float("nan"))
    packed.product(x.data_ptr(), out.data_ptr())
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-5)
    w.zero_()  # the weight was copied into MKL's layout: the product does not read it
    again = torch.empty(rows, n)
    packed.product(x.data_ptr(), again.data_ptr())
    assert torch.equal(again, out)


def test_a_weight_that_is_not_a_float32_matrix_is_refused():
    with pytest.raises(ValueError, match="float32"):
        mkl_gemm.Packed(torch.randn(4, 3, dtype=torch.float64), 2)
    with pytest.raises(ValueError, match=r"\[n, k\]"):
        mkl_gemm.Packed(torch.randn(4), 2)
