"""Plain IREE modules (``aot.export_vmfb``, ``aot compile --emit vmfb``): run by IREE's
own ``iree-run-module`` (from ``iree-base-runtime``) against eager, float32 rtol 1e-4 /
atol 1e-4 (IREE reassociates sums); with the weights in a parameter archive; compiled
for aarch64 and run under qemu; refused, with the ops listed, where kernel calls
remain. Other CPUs (``target="cpu:..."``): named in the manifest, refused at load on a
host that cannot run them."""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import aot

TOOL = shutil.which("iree-run-module") or os.path.join(os.path.dirname(sys.executable),
                                                       "iree-run-module")


# IREE's aarch64 iree-run-module, unpacked by .ci/aarch64-runtime, run under qemu
AARCH64_TOOL = os.environ.get("AOT_AARCH64_IREE_RUN_MODULE") or os.path.join(
    os.path.dirname(__file__), "..", "..", ".ci", "aarch64", "iree", "_runtime_libs",
    "iree-run-module")
AARCH64_LIBS = "/usr/aarch64-linux-gnu"


def _run_module(vmfb: str, inputs: list[np.ndarray], n_out: int, tmp_path, *,
                tool=(TOOL,), extra=()) -> list[np.ndarray]:
    """``iree-run-module`` on ``vmfb``'s ``main``: its ``n_out`` outputs, read back from
    .npy files (one ``--output`` per result)."""
    args = [*tool, f"--module={vmfb}", *extra, "--device=local-task", "--function=main"]
    for i, a in enumerate(inputs):
        np.save(tmp_path / f"in{i}.npy", a)
        args.append(f"--input=@{tmp_path / f'in{i}.npy'}")
    outs = [tmp_path / f"out{i}.npy" for i in range(n_out)]
    done = subprocess.run(args + [f"--output=@{o}" for o in outs], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return [np.load(o) for o in outs]


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x, y):
        h = torch.relu(self.a(x))
        return self.b(h) + y, h.sum(-1)


def test_export_vmfb_runs_on_irees_own_tool(tmp_path):
    torch.manual_seed(0)
    m, x, y = Small().eval(), torch.randn(2, 8), torch.randn(2, 4)
    path = str(tmp_path / "small.vmfb")
    data = aot.export_vmfb(m, (x, y), path)
    assert os.path.getsize(path) == len(data) > 0
    got = _run_module(path, [x.numpy(), y.numpy()], 2, tmp_path)
    with torch.no_grad():
        want = m(x, y)
    assert len(got) == 2
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.from_numpy(g), w, rtol=1e-4, atol=1e-4)


def test_cli_emit_vmfb_with_a_parameter_archive(tmp_path):
    """ResNet18's weights in an .irpa beside a module that holds only the code."""
    out, params = tmp_path / "m.vmfb", tmp_path / "m.irpa"
    done = subprocess.run([sys.executable, "-m", "aot.cli", "compile", "resnet18", "--emit",
                           "vmfb", "-o", str(out), "--parameters", str(params),
                           "--input-shape", "1,3,64,64"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"--parameters=model={params}" in done.stderr  # how to run it
    assert os.path.getsize(out) < 1e6 and os.path.getsize(params) > 40e6  # 11.7 M floats
    from aot.models.resnet18 import resnet18
    m, _ = resnet18()
    x = torch.randn(1, 3, 64, 64)
    (got,) = _run_module(str(out), [x.numpy()], 1, tmp_path,
                         extra=[f"--parameters=model={params}"])
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), m(x), rtol=1e-4, atol=1e-4)


def test_bert_encoder_runs_on_irees_own_tool(tmp_path):
    """int64 token ids in, float32 hidden states out; weights inside the module."""
    from aot.models.bert import bert_encoder
    m, (ids,) = bert_encoder(seq=32)
    path = str(tmp_path / "bert.vmfb")
    aot.export_vmfb(m, (ids,), path)
    (got,) = _run_module(path, [ids.numpy()], 1, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), m(ids), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not (os.path.exists(AARCH64_TOOL) and shutil.which("qemu-aarch64-static")
                         and os.path.exists(f"{AARCH64_LIBS}/lib/ld-linux-aarch64.so.1")),
                    reason="needs qemu-user-static and IREE's aarch64 iree-run-module: run "
                           ".ci/aarch64-runtime")
def test_aarch64_module_runs_under_qemu(tmp_path):
    """ResNet18 compiled here for aarch64, run by IREE's aarch64 tool under emulation."""
    from aot.models.resnet18 import resnet18
    m, _ = resnet18()
    x = torch.randn(1, 3, 64, 64)
    path = str(tmp_path / "r18-aarch64.vmfb")
    aot.export_vmfb(m, (x,), path, target="cpu:aarch64-linux-gnu")
    (got,) = _run_module(path, [x.numpy()], 1, tmp_path,
                         tool=("qemu-aarch64-static", "-L", AARCH64_LIBS, AARCH64_TOOL))
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), m(x), rtol=1e-4, atol=1e-4)


def test_another_architecture_is_refused_at_load_naming_both(tmp_path):
    """An aarch64 artifact on this x86_64 machine: an ArtifactError, not IREE's device
    error; compiled without measuring (placement coverage), the manifest says for what."""
    from aot.runtime.host_cpu import host_arch
    if host_arch() == "aarch64":
        pytest.skip("this machine is aarch64")
    torch.manual_seed(0)
    m, x, y = Small().eval(), torch.randn(2, 8), torch.randn(2, 4)
    c = aot.compile(m, (x, y), target="cpu:aarch64-linux-gnu")
    cpu = c.manifest["cpu"]
    assert cpu["arch"] == "aarch64" and cpu["cpu"] == "generic" and not cpu["host"]
    assert c.manifest["policy"]["placement"] == "coverage"
    with pytest.raises(aot.ArtifactError, match=rf"this machine is {host_arch()}.*aarch64"):
        c(x, y)  # compiled here, refused when called here
    c.save(str(tmp_path / "a.aot"))
    for arrays in ("torch", "numpy"):
        with pytest.raises(aot.ArtifactError, match=r"compiled for generic \(aarch64"):
            aot.load(str(tmp_path / "a.aot"), arrays=arrays)


def test_missing_cpu_features_are_refused_at_load(tmp_path):
    """A named x86 CPU whose features this one lacks (AMX, AVX512-FP16...): refused at
    load, naming them, where IREE would die of SIGILL at the first call that uses them."""
    from aot.toolchain.cpu_targets import cpu_flags, resolve_cpu
    from aot.runtime.host_cpu import host_arch, host_features
    if host_arch() != "x86_64" or host_features() is None:
        pytest.skip("needs an x86_64 host and iree-cpuinfo")
    have = host_features()
    name = next((n for n in ("sapphirerapids", "graniterapids", "diamondrapids", "znver5",
                             "x86-64-v4", "x86-64-v3")
                 if any(have.get(f) is False for f in resolve_cpu(cpu_flags(n)).features)),
                None)
    if name is None:
        pytest.skip("this CPU has every feature of the CPUs tried")
    torch.manual_seed(0)
    m, x, y = Small().eval(), torch.randn(2, 8), torch.randn(2, 4)
    c = aot.compile(m, (x, y), target=f"cpu:{name}")
    c.save(str(tmp_path / "f.aot"))
    lacking = [f for f in c.manifest["cpu"]["features"] if have.get(f) is False]
    with pytest.raises(aot.ArtifactError, match=f"compiled for {name}.*lacks {lacking[0]}"):
        aot.load(str(tmp_path / "f.aot"))


def test_a_cpu_this_one_can_run_compiles_and_runs():
    """x86-64-v3 (AVX2) on an x86 host that has it: named, not measured, right."""
    from aot.runtime.host_cpu import host_arch, host_features
    if host_arch() != "x86_64" or not (host_features() or {}).get("avx2"):
        pytest.skip("needs an x86_64 host with AVX2")
    torch.manual_seed(0)
    m, x, y = Small().eval(), torch.randn(2, 8), torch.randn(2, 4)
    c = aot.compile(m, (x, y), target="cpu:x86-64-v3")
    assert c.manifest["target"] == "cpu:x86-64-v3" and c.manifest["cpu"]["cpu"] == "x86-64-v3"
    assert "--iree-llvmcpu-target-cpu=x86-64-v3" in c.manifest["flags"]
    with torch.no_grad():
        for g, w in zip(c(x, y), m(x, y)):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target, message", [
    ("cpu:no-such-cpu", r"Unknown CPU for target architecture"),
    ("cpu:sparc64-linux-gnu", r"not a target triple of an architecture IREE targets"),
    ("cpu:aarch64-linux-gnu:host", r"'host' is this .* machine's CPU"),
    ("cuda:sm_80", r"only cpu takes a name"),
])
def test_bad_cpu_targets_are_clear_errors(target, message):
    with pytest.raises(aot.CompileFailed, match=message) as e:
        aot.export_vmfb(Small().eval(), (torch.randn(2, 8), torch.randn(2, 4)), target=target)
    assert e.value.stage == "options"


def test_kernel_calls_refuse_the_export_with_the_ops_listed():
    from aot.models.unlowerable import unlowerable_model
    m, args = unlowerable_model()
    with pytest.raises(aot.UnsupportedOp) as e:
        aot.export_vmfb(m, args)
    text = str(e.value)
    assert "aten.special_i0.default" in text and "unlowerable.py" in text
    assert "fallback='none'" in text and "aot.load" in text
    assert re.search(r"1 op\(s\) would run in ATen", text)


def test_cli_emit_vmfb_without_output_is_a_clear_error():
    done = subprocess.run([sys.executable, "-m", "aot.cli", "compile",
                           "aot/models/unlowerable.py:unlowerable_model", "--emit", "vmfb"],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "--emit vmfb needs -o" in done.stderr
