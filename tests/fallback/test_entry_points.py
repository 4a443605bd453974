"""Every public-binding entry point gives exactly what its OpOverload gives."""

import pytest
import torch

from aot.fallback.entry_points import ENTRIES, entry_point

aten = torch.ops.aten
g = torch.Generator().manual_seed(0)


def r(*shape):
    return torch.randn(*shape, generator=g)


x4, x3, x2, v = r(2, 3, 4, 5), r(2, 4, 6), r(4, 6), r(6)
# (schema name, overload) -> (args as BoundCall passes them: every positional
# operand of the schema, keyword-only ones by name)
SAMPLES = {
    ("aten::add", "Tensor"): ((x2, r(4, 6)), {"alpha": 2}),
    ("aten::sub", "Tensor"): ((x2, 1.5), {"alpha": 1}),
    ("aten::mul", "Tensor"): ((x2, v), {}),
    ("aten::div", "Tensor"): ((x2, 8.0), {}),
    ("aten::layer_norm", "default"): ((x3, [6], v, r(6), 1e-5, False), {}),
    ("aten::native_layer_norm", "default"): ((x3, [6], v, r(6), 1e-5), {}),
    ("aten::relu", "default"): ((x2,), {}),
    ("aten::relu_", "default"): ((x2.clone(),), {}),
    ("aten::embedding", "default"): ((x2, torch.tensor([[0, 3], [2, 1]]), -1, False, False), {}),
    ("aten::permute", "default"): ((x4, [2, 0, 3, 1]), {}),
    ("aten::transpose", "int"): ((x3, -1, -2), {}),
    ("aten::unbind", "int"): ((x3, 1), {}),
    ("aten::clone", "default"): ((x4.transpose(1, 2),), {"memory_format": None}),
    ("aten::reshape", "default"): ((x4.transpose(1, 2), [6, 20]), {}),
    ("aten::t", "default"): ((x2,), {}),
    ("aten::matmul", "default"): ((x3, r(6, 3)), {}),
    ("aten::bmm", "default"): ((x3, r(2, 6, 5)), {}),
    ("aten::mm", "default"): ((x2, r(6, 5)), {}),
    ("aten::addmm", "default"): ((r(5), x2, r(6, 5)), {"beta": 0.5, "alpha": 2}),
    ("aten::cat", "default"): (([x2, r(3, 6)], 0), {}),
    ("aten::flatten", "using_ints"): ((x4, 1, 2), {}),
    ("aten::select", "int"): ((x3, 1, -1), {}),
    ("aten::softmax", "int"): ((x3, -1, None), {}),
    ("aten::_softmax", "default"): ((x3, 1, False), {}),
    ("aten::mean", "dim"): ((x4, [2, 3], True), {"dtype": None}),
    ("aten::squeeze", "dim"): ((r(2, 1, 3), 1), {}),
    ("aten::unsqueeze", "default"): ((x2, 0), {}),
    ("aten::neg", "default"): ((x2,), {}),
    ("aten::rsqrt", "default"): ((x2.abs(),), {}),
    ("aten::sqrt", "default"): ((x2.abs(),), {}),
    ("aten::tanh", "default"): ((x2,), {}),
    ("aten::sigmoid", "default"): ((x2,), {}),
    ("aten::exp", "default"): ((x2,), {}),
    ("aten::max_pool2d", "default"): ((x4, [2, 2], [2, 2], [0, 0], [1, 1], False), {}),
    ("aten::sum", "dim_IntList"): ((x4, [1], False), {"dtype": None}),
    ("aten::dropout", "default"): ((x2, 0.5, False), {}),
    ("aten::erf", "default"): ((x2,), {}),
    ("aten::linear", "default"): ((x3, r(5, 6), r(5)), {}),
    ("aten::gelu", "default"): ((x2,), {"approximate": "tanh"}),
    ("aten::silu", "default"): ((x2,), {}),
    ("aten::hardtanh", "default"): ((x2, -0.5, 0.5), {}),
    ("aten::adaptive_avg_pool2d", "default"): ((x4, [1, 1]), {}),
    ("aten::view", "default"): ((x4, [2, 3, 20]), {}),
    ("aten::expand", "default"): ((r(1, 6), [4, 6]), {"implicit": False}),
}


def test_every_entry_has_a_sample():
    assert set(SAMPLES) == set(ENTRIES)


def _op(name: str, overload: str):
    return getattr(getattr(aten, name.split("::")[1]), overload)


def _same(a, b):
    if isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b)  # unbind: tuple vs list
        for p, q in zip(a, b):
            _same(p, q)
        return
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("key", sorted(ENTRIES), ids=lambda k: f"{k[0]}.{k[1]}")
def test_entry_point_matches_its_overload_bit_exactly(key):
    op = _op(*key)
    fn = entry_point(op)
    assert fn is not op and fn is not getattr(op, "_op", None), "the entry was not mapped"
    args, kwargs = SAMPLES[key]
    copy = lambda t: t.clone() if isinstance(t, torch.Tensor) else t  # noqa: E731
    # in-place ops get fresh copies each
    a1 = [copy(a) for a in args] if key[0].endswith("_") else args
    a2 = [copy(a) for a in args] if key[0].endswith("_") else args
    _same(fn(*a1, **kwargs), op(*a2, **kwargs))


def test_unlisted_overloads_go_through_the_generic_path():
    assert entry_point(aten.add.Scalar) is aten.add.Scalar._op
    f = lambda t: t  # noqa: E731  (a Python kernel is called as it is)
    assert entry_point(f) is f
