"""The CUDA target.

Compiling for CUDA runs everywhere (no device needed); running is marked `gpu`
and skipped with "no CUDA device" where none is present.
"""

import statistics
import time

import pytest
import torch

import aot
from aot import models
from aot.reporting import kernel_call_ops

HAS_CUDA = torch.cuda.is_available()


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)

    def forward(self, x):
        return torch.special.i0(self.lin(x)).relu()  # i0: a kernel call


def test_compile_for_cuda_needs_no_device(tmp_path):
    m, x = Small().eval(), torch.randn(4, 16)
    cm = aot.compile(m, (x,), target="cuda")
    assert cm.manifest["target"] == "cuda" and cm.manifest["driver"] == "cuda"
    assert any(f.startswith("--iree-cuda-target=sm_80") for f in cm.manifest["flags"])
    assert any(k["op"] == "aten::special_i0" for k in kernel_call_ops(cm.manifest))
    path = tmp_path / "small_cuda.aot"
    cm.save(str(path))
    assert path.stat().st_size > 0
    if not HAS_CUDA:  # running it here is the clear error, not a crash
        with pytest.raises(aot.ArtifactError, match="no CUDA device"):
            cm(x)


def test_cuda_flags_are_configurable():
    cm = aot.compile(Small().eval(), (torch.randn(4, 16),), target="cuda",
                     extra_flags=["--iree-cuda-target=sm_86"])
    assert cm.manifest["flags"][-1] == "--iree-cuda-target=sm_86"


@pytest.mark.skipif(HAS_CUDA, reason="checks the error on a machine without CUDA")
def test_loading_cuda_artifact_without_device_is_a_clear_error(tmp_path):
    path = tmp_path / "m.aot"
    aot.compile(Small().eval(), (torch.randn(4, 16),), target="cuda").save(str(path))
    with pytest.raises(aot.ArtifactError, match="no CUDA device"):
        aot.load(str(path))


def _cuda(example):
    return tuple(x.cuda() if isinstance(x, torch.Tensor) else x for x in example)


@pytest.mark.gpu
@pytest.mark.parametrize("name,tol", [("resnet18", 1e-3), ("bert", 1e-3), ("custom_op", 1e-5)])
def test_models_match_eager_cuda(name, tol):
    model, example = models.get(name)
    model, example = model.cuda(), _cuda(example)
    cm = aot.compile(model, example, target="cuda")
    with torch.no_grad():
        ref = model(*example)
    out = cm(*example)
    assert out.device.type == "cuda"
    # fp32 on GPU: TF32-free IREE kernels vs cuDNN/cuBLAS summation orders
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)


@pytest.mark.gpu
def test_cpu_tensor_into_cuda_module_is_a_clear_error():
    m, x = Small().eval().cuda(), torch.randn(4, 16, device="cuda")
    cm = aot.compile(m, (x,), target="cuda")
    with pytest.raises(aot.InputMismatch, match="expected a tensor on cuda"):
        cm(x.cpu())


@pytest.mark.gpu
def test_kernel_call_crossing_cost_on_gpu(capsys):
    # Linear + relu: compiled alone (no crossing) vs relu forced out (one crossing)
    m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval().cuda()
    x = torch.randn(4, 16, device="cuda")
    all_compiled = aot.compile(m, (x,), target="cuda", fallback_ops=[])
    forced = aot.compile(m, (x,), target="cuda", fallback_ops=["aten.relu"])
    assert len(all_compiled.kernel_calls) == 0 and len(forced.kernel_calls) == 1
    torch.testing.assert_close(forced(x), m(x), rtol=1e-5, atol=1e-5)
    times = {"auto": [], "forced": []}
    for _ in range(200):
        for k, f in (("auto", all_compiled), ("forced", forced)):
            torch.cuda.synchronize()
            t = time.perf_counter()
            f(x)
            torch.cuda.synchronize()
            times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    with capsys.disabled():
        print(f"\nGPU crossing: {med['forced'] - med['auto']:.1f} us per extra kernel call "
              f"(module {med['auto']:.1f} us -> {med['forced']:.1f} us, median of 200)")


# an op with a CPU kernel only, as quantized kernels are (torch 2.11 cannot even
# export quantize_per_tensor on a CUDA tensor: "quantized nyi in meta tensors")
_lib = torch.library.Library("aot_test_cpu_only", "DEF")
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", lambda x: x * 2, "CPU")
_lib._register_fake("twice", lambda x: torch.empty_like(x))


@pytest.mark.gpu
def test_op_without_cuda_kernel_falls_back_across_devices_with_warning():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aot_test_cpu_only.twice(x.sin()) + 1

    m, x = M(), torch.randn(8, device="cuda")
    with pytest.warns(UserWarning, match="no CUDA kernel"):
        cm = aot.compile(m, (x,), target="cuda")
    assert "no CUDA kernel in ATen" in cm.report()
    out = cm(x)
    assert out.device.type == "cuda"
    torch.testing.assert_close(out, (x.sin().cpu() * 2 + 1).cuda(), rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_quantize_on_cuda_is_a_clear_error():
    class Q(torch.nn.Module):
        def forward(self, x):
            return torch.quantize_per_tensor(x, 0.1, 3, torch.quint8).dequantize() * 2

    x = torch.randn(8, device="cuda")
    try:
        cm = aot.compile(Q(), (x,), target="cuda", fallback_ops=["aot_q"])
    except aot.ExportFailed as e:  # torch cannot trace it on CUDA: named, not a crash
        assert "Q" in str(e)
        return
    torch.testing.assert_close(cm(x), Q()(x.cpu()).cuda(), rtol=0, atol=0)


@pytest.mark.gpu
def test_cuda_graph_region_matches_eager_on_repeated_calls():
    """A group replayed from a CUDA graph: new inputs each call, results not overwritten."""
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
    x = torch.randn(4, 64, device="cuda")
    cm = aot.compile(m, (x,), target="cuda", fallback="all")
    outs, refs = [], []
    with torch.no_grad():
        for i in range(4):  # call 1 eager, call 2 captures, calls 3-4 replay
            xi = torch.randn(4, 64, device="cuda")
            outs.append(cm(xi))
            refs.append(m(xi))
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
