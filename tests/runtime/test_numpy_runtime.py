"""The torch-free runtime (``aot.runtime.numpy_module``): an all-compiled artifact loaded
in a Python where torch cannot be imported, numpy arrays in and out, against eager
(float32 rtol 1e-5 / atol 1e-5: IREE reassociates sums; integers and bools exact);
its input errors are the torch runtime's, word for word; an artifact that needs torch
is refused, naming what needs it."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import aot


class Mixed(torch.nn.Module):
    """float and int64 inputs, a static float, a dict/list output with a bool leaf; an
    embedding table large enough to be an IREE parameter the runtime serves."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(300, 4)
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, ids, scale: float = 2.0):
        h = self.lin(x + self.emb(ids))
        return {"h": h * scale, "parts": [h.sum(-1), ids > 3]}


def _example():
    torch.manual_seed(0)
    return Mixed().eval(), torch.randn(2, 5, 4), torch.randint(0, 10, (2, 5))


@pytest.fixture(scope="module")
def mixed_artifact(tmp_path_factory):
    m, x, ids = _example()
    path = str(tmp_path_factory.mktemp("numpy") / "mixed.aot")
    c = aot.compile(m, (x, ids, 2.0), placement="coverage")
    assert not c.kernel_calls  # all compiled: what the torch-free runtime runs
    assert c.manifest.parameters  # ...reading its embedding table as a parameter
    c.save(path)
    return path, c


def _bad_calls(x, ids):
    """Wrong calls, as (name, args): each must fail the same way in both runtimes."""
    return [("dtype", (x.astype(np.float64) if isinstance(x, np.ndarray) else x.double(),
                       ids, 2.0)),
            ("shape", (x[:1], ids, 2.0)),
            ("count", (x, ids)),
            ("static", (x, ids, 3.0))]


def test_numpy_module_matches_eager_and_the_torch_runtimes_errors(mixed_artifact):
    path, c = mixed_artifact
    m, x, ids = _example()
    n = aot.load(path, arrays="numpy")
    assert type(n).__name__ == "NumpyModule"
    got = n(x.numpy(), ids.numpy(), 2.0)
    with torch.no_grad():
        want = m(x, ids, 2.0)
    assert set(got) == {"h", "parts"} and isinstance(got["parts"], list)
    np.testing.assert_allclose(got["h"], want["h"].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["parts"][0], want["parts"][0].numpy(), rtol=1e-5, atol=1e-5)
    assert got["parts"][1].dtype == np.bool_
    np.testing.assert_array_equal(got["parts"][1], want["parts"][1].numpy())
    for (what, t_args), (_, n_args) in zip(_bad_calls(x, ids), _bad_calls(x.numpy(), ids.numpy())):
        with pytest.raises(aot.InputMismatch) as te:
            c(*t_args)
        with pytest.raises(aot.InputMismatch) as ne:
            n(*n_args)
        assert str(ne.value) == str(te.value), what
    with pytest.raises(aot.InputMismatch, match=r"args\[0\]: expected a numpy.ndarray "
                                                r"float32\[2, 5, 4\], got Tensor"):
        n(x, ids.numpy(), 2.0)


def test_load_in_a_python_without_torch(mixed_artifact, tmp_path):
    """A subprocess where ``import torch`` (and sympy) fails: load, run, check inputs;
    torch stays out."""
    path, _ = mixed_artifact
    m, x, ids = _example()
    with torch.no_grad():
        want = m(x, ids, 2.0)
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "ids.npy", ids.numpy())
    from aot.models.unlowerable import unlowerable_model
    um, uargs = unlowerable_model()
    aot.compile(um, uargs, placement="coverage").save(str(tmp_path / "calls.aot"))
    script = textwrap.dedent(f"""
        import json, sys
        sys.modules["torch"] = None  # import torch raises ImportError
        sys.modules["sympy"] = None  # (torch brings it; a torch-free Python may lack it)
        import numpy as np
        import aot
        out = {{}}
        m = aot.load({path!r})
        out["type"] = type(m).__name__
        x, ids = np.load({str(tmp_path / "x.npy")!r}), np.load({str(tmp_path / "ids.npy")!r})
        r = m(x, ids, 2.0)
        out["h"] = r["h"].tolist()
        out["bools"] = r["parts"][1].tolist()
        try:
            m(x[:1], ids, 2.0)
        except aot.InputMismatch as e:
            out["shape_error"] = str(e)
        try:
            aot.load({str(tmp_path / "calls.aot")!r})
        except aot.ArtifactError as e:
            out["calls_error"] = str(e)
        out["torch_modules"] = sorted(k for k, v in sys.modules.items()
                                      if k.startswith("torch") and v is not None)
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["type"] == "NumpyModule" and out["torch_modules"] == []
    np.testing.assert_allclose(np.array(out["h"], dtype=np.float32), want["h"].numpy(),
                               rtol=1e-5, atol=1e-5)
    assert out["bools"] == want["parts"][1].tolist()
    assert out["shape_error"] == "[run]: args[0]: shape mismatch: expected [2, 5, 4], got [1, 5, 4]"
    assert "needs torch at run time" in out["calls_error"]
    assert "kernel calls into ATen for 1 op(s): aten.special_i0.default" in out["calls_error"]


def test_dynamic_sizes_and_layouts_with_numpy(tmp_path):
    """A dynamic batch: every size in range runs, outside it the torch runtime's error;
    a transposed (non-row-major) input is copied, or refused under strict_layout."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 3).eval()
    batch = torch.export.Dim("batch", min=1, max=8)
    c = aot.compile(lin, (torch.randn(4, 6),), dynamic_shapes=({0: batch},),
                    placement="coverage")
    c.save(str(tmp_path / "d.aot"))
    n = aot.load(str(tmp_path / "d.aot"), arrays="numpy")
    for b in (1, 4, 7):
        x = torch.randn(b, 6)
        with torch.no_grad():
            np.testing.assert_allclose(n(x.numpy()), lin(x).numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(aot.InputMismatch) as ne:
        n(np.zeros((9, 6), np.float32))
    with pytest.raises(aot.InputMismatch) as te:
        c(torch.zeros(9, 6))
    assert str(ne.value) == str(te.value) and "outside the range" in str(ne.value)
    xt = np.asfortranarray(np.random.default_rng(0).standard_normal((4, 6), np.float32))
    with pytest.warns(UserWarning, match="not row-major"):
        got = n(xt)
    with torch.no_grad():
        np.testing.assert_allclose(got, lin(torch.from_numpy(xt)).numpy(), rtol=1e-5, atol=1e-5)
    assert n.layout_conversions == 1
    ro = np.frombuffer(xt.copy(order="C").tobytes(), np.float32).reshape(4, 6)  # read-only
    np.testing.assert_array_equal(n(ro), got)  # copied (DLPack takes writable arrays only)
    strict = aot.load(str(tmp_path / "d.aot"), arrays="numpy", strict_layout=True)
    with pytest.raises(aot.InputMismatch, match="memory format mismatch"):
        strict(xt)


def test_bad_arrays_argument_is_a_clear_error(mixed_artifact):
    with pytest.raises(aot.ArtifactError, match=r"arrays='jax': choose one of"):
        aot.load(mixed_artifact[0], arrays="jax")
