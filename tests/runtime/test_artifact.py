"""Artifacts: save -> load in a fresh process without iree.compiler; corrupt files are clear errors."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import aot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 6)
        self.b = torch.nn.Linear(6, 2)

    def forward(self, x):
        h = torch.nn.functional.layer_norm(self.a(x), (6,))
        return {"out": self.b(torch.tanh(h)), "aux": (h.sum(-1),)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(4, 6)
    cm = aot.compile(m, (x,), fallback_ops=["aten.layer_norm"])
    path = str(tmp_path_factory.mktemp("art") / "net.aot")
    cm.save(path)
    out = cm(x)
    torch.save({"x": x, "out": out["out"], "aux": out["aux"][0]}, path + ".pt")
    return path, m, x, out


def test_pytree_and_fallback(saved):
    _, m, x, out = saved
    ref = m(x)
    assert set(out) == {"out", "aux"} and isinstance(out["aux"], tuple)
    torch.testing.assert_close(out["out"], ref["out"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["aux"][0], ref["aux"][0], rtol=1e-5, atol=1e-5)


def test_load_in_fresh_process_without_compiler(saved):
    path, _, _, _ = saved
    script = textwrap.dedent(f"""
        import sys, importlib.abc
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "iree.compiler" or name.startswith("iree.compiler."):
                    raise ImportError("iree.compiler is blocked in this test")
        sys.meta_path.insert(0, Block())
        import torch, aot
        data = torch.load({path + '.pt'!r})
        cm = aot.load({path!r})
        out = cm(data["x"])
        torch.testing.assert_close(out["out"], data["out"], rtol=0, atol=0)
        torch.testing.assert_close(out["aux"][0], data["aux"], rtol=0, atol=0)
        assert "iree.compiler" not in sys.modules
        print(aot.report(cm))
        print("FRESH-OK", cm.kernel_call_count)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "FRESH-OK" in r.stdout and "aten.layer_norm.default" in r.stdout
    assert "leaked" not in r.stderr


def _corrupt(tmp_path, path, fn):
    data = open(path, "rb").read()
    bad = str(tmp_path / "bad.aot")
    with open(bad, "wb") as f:
        f.write(fn(data))
    return bad


def test_truncated(saved, tmp_path):
    bad = _corrupt(tmp_path, saved[0], lambda d: d[: len(d) // 2])
    with pytest.raises(aot.ArtifactError, match="corrupt or truncated|truncated"):
        aot.load(bad)


def test_truncated_header(saved, tmp_path):
    bad = _corrupt(tmp_path, saved[0], lambda d: d[:9])
    with pytest.raises(aot.ArtifactError, match="truncated"):
        aot.load(bad)


def test_flipped_byte(saved, tmp_path):
    bad = _corrupt(tmp_path, saved[0], lambda d: d[:-100] + bytes([d[-100] ^ 0xFF]) + d[-99:])
    with pytest.raises(aot.ArtifactError, match="checksum"):
        aot.load(bad)


def test_not_an_artifact(tmp_path):
    p = tmp_path / "x.aot"
    p.write_bytes(b"hello world, not an artifact")
    with pytest.raises(aot.ArtifactError, match="not an aot artifact"):
        aot.load(str(p))


def test_missing_file(tmp_path):
    with pytest.raises(aot.ArtifactError, match="cannot read artifact"):
        aot.load(str(tmp_path / "nope.aot"))


def test_incompatible_version(saved, tmp_path):
    import struct
    def bump(d):
        ver, n = struct.unpack_from("<IQ", d, 7)
        return d[:7] + struct.pack("<IQ", ver + 1, n) + d[19:]
    bad = _corrupt(tmp_path, saved[0], bump)
    with pytest.raises(aot.ArtifactError, match="format version 3"):
        aot.load(bad)
