"""Plain IREE modules (``aot.export_vmfb``, ``aot compile --emit vmfb``): run by IREE's
own ``iree-run-module`` (from ``iree-base-runtime``) against eager, float32 rtol 1e-4 /
atol 1e-4 (IREE reassociates sums); refused, with the ops listed, where kernel calls
remain."""

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


def _run_module(vmfb: str, inputs: list[np.ndarray], n_out: int, tmp_path) -> list[np.ndarray]:
    """``iree-run-module`` on ``vmfb``'s ``main``: its ``n_out`` outputs, read back from
    .npy files (one ``--output`` per result)."""
    args = [TOOL, f"--module={vmfb}", "--device=local-task", "--function=main"]
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


def test_cli_emit_vmfb(tmp_path):
    out = tmp_path / "m.vmfb"
    done = subprocess.run([sys.executable, "-m", "aot.cli", "compile", "resnet18", "--emit",
                           "vmfb", "-o", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "iree-run-module --module=" in done.stderr  # how to run it
    from models.resnet18 import resnet18
    m, (x,) = resnet18()
    (got,) = _run_module(str(out), [x.numpy()], 1, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), m(x), rtol=1e-4, atol=1e-4)


def test_kernel_calls_refuse_the_export_with_the_ops_listed():
    from models.unlowerable import unlowerable_model
    m, args = unlowerable_model()
    with pytest.raises(aot.UnsupportedOp) as e:
        aot.export_vmfb(m, args)
    text = str(e.value)
    assert "aten.special_i0.default" in text and "unlowerable.py" in text
    assert "fallback='none'" in text and "aot.load" in text
    assert re.search(r"1 op\(s\) would run in ATen", text)


def test_cli_emit_vmfb_without_output_is_a_clear_error():
    done = subprocess.run([sys.executable, "-m", "aot.cli", "compile",
                           "models/unlowerable.py:unlowerable_model", "--emit", "vmfb"],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "--emit vmfb needs -o" in done.stderr
