"""Random ops run in ATen on torch's generator: under the same seed an artifact draws
exactly what eager draws (issue 35), whatever the placement of the ops around them."""

import pytest
import torch

import aot
from aot.partition.iree_faults import RANDOM_REASON


class Random(torch.nn.Module):
    def forward(self, x, probs):
        a = torch.nn.functional.dropout(x, 0.3, training=True) * 2 + 1  # dropout in training
        b = torch.bernoulli(torch.sigmoid(x))
        c = torch.multinomial(probs, 5, replacement=True)
        d = torch.randn_like(x) + torch.rand(4, 64)
        # uniform's schema names an operand ``from``, a Python keyword
        e = torch.ops.aten.uniform(x, -2.0, 3.0) * 2
        return a, b, c, torch.tanh(d), e


RANDOM_OPS = {"aten.native_dropout.default", "aten.bernoulli.default",
              "aten.multinomial.default", "aten.randn_like.default", "aten.rand.default",
              "aten.uniform.default"}


@pytest.mark.parametrize("placement", ["auto", "coverage"])
def test_random_ops_draw_what_eager_draws(placement):
    torch.manual_seed(0)
    x, probs = torch.randn(4, 64), torch.softmax(torch.randn(3, 10), -1)
    m = Random()
    cm = aot.compile(m, (x, probs), placement=placement)
    if placement == "coverage":  # the ops around them compiled, the random ones in ATen
        where = {p["op"]: (p["where"], p["reason"]) for p in cm.manifest.placements}
        assert where["aten.tanh.default"][0] == "compiled"
        for op in RANDOM_OPS:
            assert where[op] == ("kernel_call", RANDOM_REASON), op
    for seed in (3, 11):
        torch.manual_seed(seed)
        got = cm(x, probs)
        torch.manual_seed(seed)
        want = m(x, probs)
        # bit-exact: the same draws, and the arithmetic around them is eager's (ATen),
        # or IREE's tanh, within float32 rounding
        for g, w in zip(got[:3], want[:3]):
            assert torch.equal(g, w)
        torch.testing.assert_close(got[3], want[3], rtol=1e-6, atol=1e-6)
        assert torch.equal(got[4], want[4])
    # and the next call draws anew, as eager does
    torch.manual_seed(3)
    first, second = cm(x, probs)[0], cm(x, probs)[0]
    assert not torch.equal(first, second)


def test_compiling_leaves_the_callers_rng_state_as_it_was():
    """Measuring the candidates runs the random ops in ATen: on torch's generator, whose
    state the compile restores."""
    torch.manual_seed(5)
    x, probs = torch.randn(4, 64), torch.softmax(torch.randn(3, 10), -1)
    state = torch.get_rng_state()
    aot.compile(Random(), (x, probs))
    assert torch.equal(torch.get_rng_state(), state)
