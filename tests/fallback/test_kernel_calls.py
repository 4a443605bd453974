"""The fallback executor: several results, strided results, errors inside ATen, the static contract."""

import math

import iree.runtime as rt
import pytest
import torch

import aot
from aot.fallback import static_values
from aot.reporting import kernel_call_ops

_lib = torch.library.Library("aot_test", "FRAGMENT")
_lib.define("fail_if_negative(Tensor x) -> Tensor")
_lib.define("twice(Tensor x) -> Tensor")


def _fail_if_negative(x):
    if (x < 0).any():
        raise ValueError("negative input")
    return x.sqrt()


_lib.impl("fail_if_negative", _fail_if_negative, "CompositeExplicitAutograd")
_lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
torch.library.register_fake("aot_test::fail_if_negative", lambda x: torch.empty_like(x), lib=_lib)
torch.library.register_fake("aot_test::twice", lambda x: torch.empty_like(x), lib=_lib)


class MultiResult(torch.nn.Module):
    def forward(self, x):
        v, i = torch.topk(x, 3, dim=-1)
        return v * 2, i, x.t()


def test_several_and_strided_results():
    m = MultiResult().eval()
    x = torch.randn(4, 8)
    cm = aot.compile(m, (x,), fallback_ops=["aten.topk", "aten.t", "aten.permute"])
    calls = {k["op"] for k in kernel_call_ops(cm.manifest)}
    assert "aten::topk" in calls
    out, ref = cm(x), m(x)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # The transpose output comes back with eager's strides.
    assert out[2].stride() == ref[2].stride()


class UsesCustom(torch.nn.Module):
    def forward(self, x):
        return torch.ops.aot_test.fail_if_negative(x + 1) * 3


def test_error_inside_kernel_call_names_op():
    cm = aot.compile(UsesCustom(), (torch.rand(5),))
    good = torch.rand(5)
    torch.testing.assert_close(cm(good), ((good + 1).sqrt() * 3), rtol=1e-6, atol=1e-6)
    with pytest.raises(aot.KernelCallFailed, match=r"aot_test.fail_if_negative.default.*negative input") as e:
        cm(torch.full((5,), -5.0))
    assert isinstance(e.value.__cause__, ValueError)
    assert "test_kernel_calls.py" in str(e.value)  # the user's source line
    # The module keeps working after the failure.
    torch.testing.assert_close(cm(good), ((good + 1).sqrt() * 3), rtol=1e-6, atol=1e-6)


class TwoCustom(torch.nn.Module):
    def forward(self, x):
        y = torch.ops.aot_test.twice(x)
        return torch.ops.aot_test.twice(y.relu())


def test_fallback_none_lists_every_uncovered_op():
    with pytest.raises(aot.UnsupportedOp) as e:
        aot.compile(TwoCustom(), (torch.randn(3),), fallback="none")
    msg = str(e.value)
    assert "2 op(s) are not covered" in msg
    assert msg.count("aot_test.twice.default at") == 2
    assert "test_kernel_calls.py" in msg


def test_custom_op_auto_runs_as_kernel_call():
    m = TwoCustom()
    x = torch.randn(3)
    cm = aot.compile(m, (x,), placement="coverage")  # per op, not measured as a region
    torch.testing.assert_close(cm(x), m(x), rtol=0, atol=0)
    kc = [p for p in cm.manifest["placements"] if p["where"] == "kernel_call"]
    assert [p["op"] for p in kc] == ["aot_test.twice.default"] * 2
    assert all("torch.operator" in p["reason"] for p in kc)
    assert cm.kernel_call_count == 2


@pytest.mark.parametrize("value", [
    1, -3, 2.5, float("inf"), float("-inf"), True, None, "tanh", [1, 2, [3]], (4, 5),
    torch.float16, torch.int64, torch.device("cpu"), torch.channels_last, torch.strided,
])
def test_static_value_round_trip(value):
    import json
    enc = json.loads(json.dumps(static_values.encode(value)))
    assert static_values.decode(enc) == value
    assert type(static_values.decode(enc)) is type(value)


def test_static_nan_round_trip():
    assert math.isnan(static_values.decode(static_values.encode(float("nan"))))


def test_static_unrepresentable_is_rejected():
    with pytest.raises(TypeError, match="cannot record a static value of type object"):
        static_values.encode(object())


class RuntimeScalars(torch.nn.Module):
    """``.item()`` values are only known at run time: they cross kernel calls as scalars."""

    def forward(self, x, n, s):
        k = n.item()          # SymInt
        f = s.item()          # SymFloat
        y = torch.special.i0(x * k)   # i0 is not lowered by IREE: a kernel call
        return y + f, torch.full((2,), k, dtype=torch.int64) * 3


@pytest.mark.parametrize("mode", ["auto", "all"])
def test_runtime_scalars_cross_kernel_calls(mode):
    m = RuntimeScalars().eval()
    x, n, s = torch.randn(4, 5), torch.tensor(3), torch.tensor(0.25)
    # mul.Tensor forced out: its SymInt operand becomes a host-function scalar.
    cm = aot.compile(m, (x, n, s), fallback=mode, fallback_ops=["aten.mul.Tensor"])
    kinds = [o["scalar_kind"] for k in kernel_call_ops(cm.manifest)
             for o in k["operands"] if o["kind"] == "scalar"]
    assert "i" in kinds
    if mode == "all":  # item itself runs in ATen and hands back a scalar result
        assert any(k["result_kinds"] in ("i", "f") for k in kernel_call_ops(cm.manifest))
    # Values differ from the example: the result must follow them, not the baked example.
    for n2, s2 in [(torch.tensor(3), torch.tensor(0.25)), (torch.tensor(-2), torch.tensor(1.5))]:
        out, ref = cm(x, n2, s2), m(x, n2, s2)
        if mode == "all":
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
        else:  # f crosses compiled code as f32 (IREE demotes f64): fp32 tolerance
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_runtime_scalar_list_operand_runs_as_one_aten_region():
    class M(torch.nn.Module):
        def forward(self, x, n):
            return torch.roll(x, shifts=[n.item()])  # int[] holding a run-time value

    # a kernel call cannot record a list holding a run-time value: the whole program
    # runs in ATen (the host program), following the run-time value, bit-exact
    cm = aot.compile(M(), (torch.randn(3), torch.tensor(2)), fallback="all")
    assert "host_program" in cm.manifest and "aten.roll" in cm.manifest["host_program"]["reason"]
    x = torch.randn(3)
    for n in (1, 3, -2):
        torch.testing.assert_close(cm(x, torch.tensor(n)), M()(x, torch.tensor(n)), rtol=0, atol=0)


def test_data_dependent_output_shape_runs_with_its_run_time_shape():
    class M(torch.nn.Module):
        def forward(self, x, n):
            k = n.item()
            torch._check(k > 0)
            return torch.zeros(k, 2) + x.sum()

    cm = aot.compile(M(), (torch.randn(3), torch.tensor(2)))
    x = torch.randn(3)
    for n in (2, 5):  # the output's shape follows the data
        torch.testing.assert_close(cm(x, torch.tensor(n)), M()(x, torch.tensor(n)), rtol=0, atol=0)
    with pytest.raises(aot.UnsupportedOp, match="shape only known at run time"):
        aot.compile(M(), (torch.randn(3), torch.tensor(2)), fallback="none")


class Neighbours(torch.nn.Module):
    """Three uncovered ops in a row, one result also read by compiled code in between."""

    def forward(self, x):
        a = torch.special.i0(x)          # not lowered by IREE 3.13
        b = a * 2                        # compiled; reads a group member's result
        c = torch.special.i0(a + 0.0)    # ... but a+0.0 is compiled: breaks the run
        d = torch.special.i1(torch.special.i0(c))
        return b, d


def test_neighbouring_kernel_calls_cross_once():
    m, x = Neighbours().eval(), torch.randn(3, 4)
    cm = aot.compile(m, (x,))
    groups = [k for k in cm.manifest["kernel_calls"] if k["members"]]
    assert groups, cm.report()
    g = groups[-1]
    assert len(g["members"]) >= 2 and g["members"][0]["op"] == "aten::special_i0"
    per_op = len(kernel_call_ops(cm.manifest))
    before = cm.kernel_call_count
    out = cm(x)
    assert cm.kernel_call_count - before == len(cm.manifest["kernel_calls"]) < per_op
    for o, r in zip(out, m(x)):
        torch.testing.assert_close(o, r, rtol=1e-6, atol=1e-6)
    # fallback="all": the whole program is one group, bit-exact, one crossing per run
    cm_all = aot.compile(m, (x,), fallback="all")
    before = cm_all.kernel_call_count
    for o, r in zip(cm_all(x), m(x)):
        torch.testing.assert_close(o, r, rtol=0, atol=0)
    assert cm_all.kernel_call_count - before == 1


def test_error_inside_a_group_names_the_member_that_failed():
    cm = aot.compile(UsesCustom(), (torch.rand(5),), fallback="all")
    group = next(k for k in cm.manifest["kernel_calls"] if k["members"])
    assert [m["op"] for m in group["members"]][1] == "aot_test::fail_if_negative"
    with pytest.raises(aot.KernelCallFailed,
                       match=r"aot_test.fail_if_negative.default.*negative input") as e:
        cm(torch.full((5,), -5.0))
    assert isinstance(e.value.__cause__, ValueError)
    assert "test_kernel_calls.py" in str(e.value)  # the member's source line
    good = torch.rand(5)
    torch.testing.assert_close(cm(good), UsesCustom()(good), rtol=0, atol=0)


class ViewBetweenCompiled(torch.nn.Module):
    def forward(self, x):
        return (x * 2).view(4, 2) + 1


def test_simple_kernel_call_never_hands_back_its_operand_memory():
    """The one-frame entry (one op, one tensor result) copies a result that aliases an operand."""
    from aot.runtime.device import buffer_view_to_torch, torch_to_buffer_view

    m, x = ViewBetweenCompiled(), torch.randn(8)
    cm = aot.compile(m, (x,), fallback_ops=["aten.view"])
    (fn,) = cm.host.functions.values()
    assert fn.simple and fn.spec.op == "aten::view"
    torch.testing.assert_close(cm(x), m(x), rtol=0, atol=0)
    operand = torch.randn(8)
    ref = fn.simple_entry(None, torch_to_buffer_view(cm.device, operand, "x").ref)
    out = buffer_view_to_torch(cm.device, ref.deref(rt.HalBufferView), cm.driver)
    torch.testing.assert_close(out, operand.view(4, 2), rtol=0, atol=0)
    assert out.data_ptr() != operand.data_ptr()
    # an ATen error inside the one-frame entry is a KernelCallFailed naming the op
    fn.call = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
    with pytest.raises(aot.KernelCallFailed, match=r"aten.view.default.*boom"):
        cm(x)


def test_index_with_absent_tensors_as_a_kernel_call(tmp_path):
    """``x[:, idx]`` is ``aten.index(x, [None, idx])``: a ``Tensor?[]`` with a None entry
    the manifest records (and its check accepts) as null."""
    class Pick(torch.nn.Module):
        def forward(self, x, idx):
            return x[:, idx] * 2

    x, idx = torch.randn(3, 5), torch.tensor([4, 0, 2])
    cm = aot.compile(Pick(), (x, idx), fallback_ops=["aten.index"])
    (call,) = [k for k in cm.manifest["kernel_calls"] if k["op"] == "aten::index"]
    assert [o for o in call["operands"] if o["kind"] == "tensor_list"][0]["indices"][0] is None
    cm.save(tmp_path / "pick.aot")
    torch.testing.assert_close(aot.load(str(tmp_path / "pick.aot"))(x, idx), x[:, idx] * 2,
                               rtol=0, atol=0)
