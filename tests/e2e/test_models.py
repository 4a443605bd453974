"""The bundled models against eager PyTorch (issue #2: ResNet18, BERT, custom op, unlowerable op)."""

import pytest
import torch

import aot
from aot.tuning.regions import choice
from aot import models


def _kernel_calls(cm):
    return [p for p in cm.manifest["placements"] if p["where"] == "kernel_call"]


@pytest.mark.slow
def test_resnet18_compiles_fully_and_matches_eager():
    model, ex = models.get("resnet18")
    cm = aot.compile(model, ex, placement="coverage")
    with torch.no_grad():
        ref = model(*ex)
    # fp32 convolutions in a different summation order (IREE vs oneDNN) over
    # 20 layers: differences of ~1e-5 relative; 1e-4 leaves margin.
    torch.testing.assert_close(cm(*ex), ref, rtol=1e-4, atol=1e-4)
    assert _kernel_calls(cm) == []


@pytest.mark.slow
def test_resnet18_default_placement_is_measured_and_matches_eager():
    """Default: batch norm folded into the convs; convs run where they measured faster."""
    model, ex = models.get("resnet18")
    cm = aot.compile(model, ex)
    with torch.no_grad():
        ref = model(*ex)
    # folded batch norm changes rounding of the weights (~1e-7 relative) too
    torch.testing.assert_close(cm(*ex), ref, rtol=1e-4, atol=1e-4)
    ops = {p["op"] for p in cm.manifest["placements"]}
    assert "aten._native_batch_norm_legit_no_training.default" not in ops  # folded
    _check_region_or_per_op(cm, lambda p: p["op"] == "aten.conv2d.default"
                            and p["reason"].startswith("ATen is faster here"))


def _check_region_or_per_op(cm, per_op_kernel_call):
    """Placements follow the measured region choice: one ATen region, or per-op costs."""
    region = cm.manifest["region"]
    if region["chosen"] in ("iree", "iree-sync"):
        for p in _kernel_calls(cm):
            assert per_op_kernel_call(p), p
    elif region["chosen"] in ("iree-tiled", "iree-coverage"):
        # partitioned as placement="coverage": kernel calls only for ops IREE does not
        # cover, and the placements describe the artifact that runs
        assert not any(p["reason"].startswith("ATen is faster here") for p in _kernel_calls(cm))
        assert bool(_kernel_calls(cm)) == bool(cm.manifest["kernel_calls"])
    else:
        assert all(p["reason"].startswith(f"one ATen region ({region['chosen']})")
                   for p in cm.manifest["placements"])


def test_resnet18_state_dict_matches_torchvision():
    tv = pytest.importorskip("torchvision")
    ours, (x,) = models.get("resnet18")
    theirs = tv.models.resnet18().eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), ours(x), rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("fallback", ["auto", "all"])
def test_bert(fallback):
    model, ex = models.get("bert")
    cm = aot.compile(model, ex, fallback=fallback)
    with torch.no_grad():
        ref = model(*ex)
    if fallback == "all":
        torch.testing.assert_close(cm(*ex), ref, rtol=0, atol=0)
    else:
        # Layer norm / softmax / matmul reassociation in fp32: 1e-4 absolute.
        torch.testing.assert_close(cm(*ex), ref, rtol=1e-4, atol=1e-4)
        _check_region_or_per_op(cm, lambda p: p["reason"].startswith("ATen is faster here"))


@pytest.mark.parametrize("name,op", [("custom_op", "aot_models.scaled_tanh.default"),
                                     ("unlowerable", "aten.special_i0.default")])
@pytest.mark.parametrize("fallback", ["auto", "all"])
def test_models_with_uncovered_ops(name, op, fallback):
    model, ex = models.get(name)
    # per op (the default also measures whole ATen regions: see the next test)
    cm = aot.compile(model, ex, fallback=fallback, placement="coverage")
    with torch.no_grad():
        ref = model(*ex)
    tol = dict(rtol=0, atol=0) if fallback == "all" else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cm(*ex), ref, **tol)
    kc = _kernel_calls(cm)
    assert op in {p["op"] for p in kc}
    if fallback == "auto":
        assert [p["op"] for p in kc] == [op]
        assert "does not know this op" in kc[0]["reason"]
        assert f"models/{name}.py" in kc[0]["location"]
        text = cm.report()
        assert op in text and f"models/{name}.py" in text


@pytest.mark.parametrize("name", ["custom_op", "unlowerable"])
def test_default_measures_programs_with_kernel_calls_as_regions(name):
    """A program with kernel calls is timed per op (both CPU drivers) and as one ATen region."""
    model, ex = models.get(name)
    cm = aot.compile(model, ex)
    region = cm.manifest["region"]
    assert {"iree", "iree-sync", "aten"} <= set(region["candidates_ms"])
    assert region["chosen"] == choice(region)  # the fastest beyond the noise
    _check_region_or_per_op(cm, lambda p: "does not know this op" in p["reason"])
    assert "region placement, measured end to end" in cm.report()
    with torch.no_grad():
        torch.testing.assert_close(cm(*ex), model(*ex), rtol=1e-5, atol=1e-5)
