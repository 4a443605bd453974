"""Artifacts: save -> load in a fresh process without iree.compiler; corrupt files are clear errors."""

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import aot
from aot.manifest import FORMAT_VERSION
from artifact_edit import rewrite, sections, setter

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
        (ver,) = struct.unpack_from("<I", d, 7)
        return d[:7] + struct.pack("<I", ver + 1) + d[11:]
    bad = _corrupt(tmp_path, saved[0], bump)
    with pytest.raises(aot.ArtifactError, match=f"format version {FORMAT_VERSION + 1}"):
        aot.load(bad)


# -- every byte covered ------------------------------------------------------------------

@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small artifact: compiled code, a kernel call, a host-held constant, a static input."""
    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, k: float = 0.5):
            return torch.special.i0(self.lin(x)) * k + 1

    torch.manual_seed(0)
    m, x = Small().eval(), torch.randn(2, 4)
    cm = aot.compile(m, (x, 0.5), placement="coverage", fallback_ops=["aten.linear"])
    assert cm.manifest["host_constants"] and len(cm.kernel_calls) >= 1
    path = str(tmp_path_factory.mktemp("small") / "small.aot")
    cm.save(path)
    return path, m, x


def test_every_manifest_byte_and_a_sample_of_the_rest_is_covered(small, tmp_path):
    """Flip each byte of the manifest, and every 97th byte elsewhere: always an
    ArtifactError at load (never a load that succeeds, never another exception)."""
    path, _, _ = small
    data = open(path, "rb").read()
    start, end = sections(data)
    where = list(range(start, end)) + [i for i in range(0, len(data), 97)
                                       if not start <= i < end] + [len(data) - 1]
    bad = str(tmp_path / "bad.aot")
    outcomes = {}
    for i in where:
        with open(bad, "wb") as f:
            f.write(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:])
        try:
            aot.load(bad)
            outcomes[i] = "loaded"
        except aot.ArtifactError as e:
            outcomes[i] = str(e).split(":")[-1].strip()[:40]
    assert len(where) > 1000
    assert not [i for i, o in outcomes.items() if o == "loaded"]


@pytest.mark.parametrize("field,value,named", [
    (("inputs", 0, "dtype"), "float99", "inputs[0].dtype"),
    (("inputs", 0, "shape"), "2x4", "inputs[0].shape"),
    (("inputs", 0, "strides"), [1], "inputs[0].strides"),
    (("inputs", 1), {"static": {"nonsense": 1}}, "inputs[1].static"),
    (("driver",), "gpu", "driver"),
    (("outputs",), [], "returns_input"),
    (("in_spec",), "not a spec", "in_spec"),
    (("kernel_calls", 0, "op"), 7, "kernel_calls[0]"),
    (("kernel_calls", 0, "results", 0, "dtype"), "int3", "kernel_calls[0].results[0].dtype"),
    (("mutations",), [{"input": 5}], "mutations[0]"),
    (("whole_program_call",), "call_99", "whole_program_call"),
    (("vmfb_sha256",), "abc", "vmfb_sha256"),
], ids=lambda v: str(v) if isinstance(v, str) else None)
def test_hand_edited_manifest_names_the_field(small, tmp_path, field, value, named):
    bad = rewrite(small[0], str(tmp_path / "edited.aot"), setter(field, value))
    with pytest.raises(aot.ArtifactError, match="malformed manifest field " + re.escape(named)):
        aot.load(bad)


def test_hand_edited_constant_offset_outside_the_blob(small, tmp_path):
    def edit(m):
        name = next(iter(m["host_constants"]))
        m["host_constants"][name]["offset"] = 1 << 20
    bad = rewrite(small[0], str(tmp_path / "edited.aot"), edit)
    with pytest.raises(aot.ArtifactError, match=r"host_constants\..*offset"):
        aot.load(bad)


@pytest.fixture(scope="module")
def host_program(tmp_path_factory):
    """An artifact that is a host program (a data-dependent shape), with a weight."""
    class Picks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4))

        def forward(self, x, k: float = 0.5):
            return (x * self.w)[x > 0] * k

    torch.manual_seed(0)
    m, x = Picks().eval(), torch.randn(2, 4)
    cm = aot.compile(m, (x, 0.5))
    assert cm.manifest.get("host_program")
    path = str(tmp_path_factory.mktemp("hp") / "hp.aot")
    cm.save(path)
    return path, m, x


@pytest.mark.parametrize("which", ["small", "host_program"])
def test_every_leaf_of_the_manifest_replaced_is_an_artifact_error_or_harmless(
        which, request, tmp_path):
    """Each scalar in the manifest replaced by a value of the wrong type: an
    ArtifactError at load, or (a field only the report reads) a module that still
    gives the original answer. Never another exception."""
    import json
    path, m, x = request.getfixturevalue(which)
    data = open(path, "rb").read()
    start, end = sections(data)
    manifest = json.loads(data[start:end])
    with torch.no_grad():
        want = m(x, 0.5)

    def leaves(obj, at=()):
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from leaves(v, at + (k,))
        elif isinstance(obj, list) and obj:
            for i, v in enumerate(obj):
                yield from leaves(v, at + (i,))
        else:
            yield at

    paths = list(leaves(manifest))
    assert len(paths) > 50
    failures = []
    for p in paths:
        for value in ([["?"]], "?"):
            bad = rewrite(path, str(tmp_path / "leaf.aot"), setter(p, value))
            try:
                cm = aot.load(bad)
                got = cm(x, 0.5)
                aot.report(cm)
                if not torch.equal(got, cm(x, 0.5)) or not torch.allclose(got, want, rtol=1e-5,
                                                                         atol=1e-5):
                    failures.append((p, value, "wrong answer"))
            except aot.AotError:
                pass
            except Exception as e:  # noqa: BLE001 - what this test looks for
                failures.append((p, value, f"{type(e).__name__}: {e}"[:160]))
    assert failures == [], "\n".join(map(str, failures))


def test_private_return_types_save_and_load(tmp_path):
    """``torch.lu`` returns ``torch.return_types._lu_with_info``, which torch before 2.15
    registers with pytree without a serialization name (``all_return_types`` omits it)."""
    class LU(torch.nn.Module):
        def forward(self, a):
            return torch.lu(a)

    a = torch.randn(3, 4, 4)
    cm = aot.compile(LU(), (a,))
    cm.save(tmp_path / "lu.aot")
    out = aot.load(str(tmp_path / "lu.aot"))(a)
    for got, want in zip(out, LU()(a)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
