"""Compiled integer floor division (``aot.forms.int_division``): bit-exact with eager at
the edges of every integer dtype, where a lowering through floating point is not."""

import pytest
import torch

import aot


class Div(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, a, b):
        return self.fn(a, b)


def _compiled(fn, a, b, all_compiled=True):
    cm = aot.compile(Div(fn), (a, b), placement="coverage")
    assert not all_compiled or not cm.manifest["kernel_calls"]  # compiled, not in ATen
    return cm


_EDGES = {
    torch.int64: [9223372036854775806, -9223372036854775807, 2 ** 53 + 1, -(2 ** 53) - 1,
                  1073741824, -3, 7, -7, 0, 1],
    torch.int32: [2147483646, -2147483647, 16777217, -16777217, 715827883, -3, 7, -7, 0, 1],
    torch.int16: [32767, -32767, 255, -256, -3, 7, -7, 0, 1, 2],
}
_DIVISORS = {torch.int64: [1073741824, -1073741824, 3, -3, 2 ** 40 + 7, -1, 1, 9223372036854775807],
             torch.int32: [3, -3, 7, 65536, -65537, 1, -1, 2147483647],
             torch.int16: [3, -3, 7, 255, -256, 1, -1, 32767]}


@pytest.mark.parametrize("dtype", list(_EDGES))
@pytest.mark.parametrize("form", ["div_floor", "floor_divide"])
def test_floor_division_of_edge_values_is_eager_bit_for_bit(dtype, form):
    fn = ((lambda a, b: torch.div(a, b, rounding_mode="floor")) if form == "div_floor"
          else torch.floor_divide)
    a = torch.tensor(_EDGES[dtype], dtype=dtype).repeat_interleave(len(_DIVISORS[dtype]))
    b = torch.tensor(_DIVISORS[dtype], dtype=dtype).repeat(len(_EDGES[dtype]))
    cm = _compiled(fn, a, b)
    assert torch.equal(cm(a, b), fn(a, b))
    assert torch.equal(cm(b, a.clamp(min=1)), fn(b, a.clamp(min=1)))  # small by large


def test_every_int8_pair_and_a_scalar_divisor_of_either_sign():
    """All 256 x 255 int8 pairs (the quotient -128 // -1 overflows, as in ATen, and is left
    out; IREE 3.13 does not lower int8 division: part of it runs in ATen); then a
    Python-number divisor, positive and negative, on int64 extremes."""
    a = torch.arange(-128, 128, dtype=torch.int8).repeat_interleave(255)
    b = torch.tensor([d for d in range(-128, 128) if d], dtype=torch.int8).repeat(256)
    keep = ~((a == -128) & (b == -1))
    a, b = a[keep], b[keep]
    fn = lambda x, y: torch.div(x, y, rounding_mode="floor")  # noqa: E731
    assert torch.equal(_compiled(fn, a, b, all_compiled=False)(a, b), fn(a, b))
    big = torch.tensor(_EDGES[torch.int64])
    for d in (1073741824, -1073741824, 3, -7):
        scalar = (lambda d: lambda x, _: torch.div(x, d, rounding_mode="floor"))(d)
        assert torch.equal(_compiled(scalar, big, big)(big, big), big.div(d, rounding_mode="floor"))


def test_a_dynamic_batch_keeps_the_exact_form():
    """The rewrite takes sizes that follow a symbol: exact at the example and other sizes."""
    fn = lambda x, y: torch.div(x, y, rounding_mode="floor")  # noqa: E731
    a = torch.tensor([9223372036854775806, -9223372036854775807, -3, 7])
    b = torch.tensor([1073741824, 3, 2, -2])
    n = torch.export.Dim("n", min=2)
    cm = aot.compile(Div(fn), (a, b), dynamic_shapes={"a": {0: n}, "b": {0: n}},
                     placement="coverage")
    assert not cm.manifest["kernel_calls"]
    for k in (1, 3):
        assert torch.equal(cm(a.repeat(k), b.repeat(k)), fn(a.repeat(k), b.repeat(k)))
