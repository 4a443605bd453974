"""The typed manifest: built once, checked, frozen, read by its fields; JSON in and out."""

import dataclasses
import json

import pytest
import torch

import aot
from aot.artifact import CompiledArtifact, load_artifact
from aot.errors import ArtifactError
from aot.manifest import Manifest


@pytest.fixture(scope="module")
def art():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    return aot.compile(m, (torch.randn(2, 16),), placement="coverage").artifact


def test_a_compiled_artifact_holds_a_typed_manifest_with_its_compile_recorded(art):
    m = art.manifest
    assert isinstance(m, Manifest)
    assert m.driver == "local-task" and m.target == "cpu" and m.via == "torch"
    assert isinstance(m.flags, tuple) and isinstance(m.kernel_calls, tuple)
    assert [p["where"] for p in m.placements] == ["compiled", "compiled"]
    # recorded by a new, checked manifest at the end of the compile, not by an edit
    assert m.compile_seconds > 0 and m.folded_ops is not None


def test_a_manifest_is_frozen(art):
    m = art.manifest
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.driver = "cuda"
    with pytest.raises(TypeError):
        m["driver"] = "cuda"  # the JSON view is read-only


def test_json_round_trip_and_the_read_only_view(art):
    m = art.manifest
    doc = m.to_json()
    assert Manifest.from_json(doc, len(art.constants)) == m
    assert dict(m) == doc and m["driver"] == m.driver and "region" not in m
    doc["driver"] = "cuda"  # a copy: changing it changes no manifest
    doc["placements"][0]["where"] = "kernel_call"
    assert m.driver == "local-task" and m.placements[0]["where"] == "compiled"
    # from_json copies what it is given: the caller's document cannot reach into it
    mine = m.to_json()
    again = Manifest.from_json(mine, len(art.constants))
    mine["inputs"][0]["shape"][0] = 99
    assert again.inputs[0]["shape"][0] == 2


def test_the_file_round_trip_keeps_the_manifest(art, tmp_path):
    path = str(tmp_path / "m.aot")
    art.save(path)
    loaded = load_artifact(path)
    assert loaded.manifest == art.manifest
    assert json.loads(json.dumps(loaded.manifest.to_json())) == art.manifest.to_json()


def test_replace_checks_the_new_manifest_as_a_file_is(art):
    m = art.manifest
    assert m.replace(len(art.constants), driver="local-sync").driver == "local-sync"
    with pytest.raises(ArtifactError, match="driver"):
        m.replace(len(art.constants), driver="tpu")
    with pytest.raises(ArtifactError, match=r"inputs\[0\]"):
        m.replace(len(art.constants), inputs=[{"dtype": "float32", "shape": "x"}])
    with pytest.raises(TypeError, match="not manifest fields"):
        m.replace(len(art.constants), colour="blue")


def test_with_manifest_keeps_the_bytes_and_refuses_new_digests(art):
    sync = art.with_manifest(driver="local-sync")
    assert sync.vmfb is art.vmfb and sync.manifest.driver == "local-sync"
    assert art.manifest.driver == "local-task"
    with pytest.raises(ValueError, match="digests"):
        art.with_manifest(vmfb_sha256="0" * 64)
    # a manifest whose digests do not match the bytes is refused where it is not derived
    with pytest.raises(ArtifactError, match="checksum"):
        CompiledArtifact(art.vmfb, {**art.manifest.to_json(), "vmfb_sha256": "0" * 64},
                         art.constants)


def test_a_malformed_document_names_its_field(art):
    doc = art.manifest.to_json()
    del doc["outputs"]
    with pytest.raises(ArtifactError, match="lacks outputs"):
        Manifest.from_json(doc, len(art.constants))
    with pytest.raises(ArtifactError, match="not a JSON object"):
        Manifest.from_json([1, 2], 0)


def test_the_plan_view(art):
    region = {"chosen": "aten", "key": "k1", "candidates_ms": {"iree": 2.0, "aten": 1.0}}
    m = art.manifest.replace(len(art.constants), region=region)
    assert m.plan() == {"format": 1, "program": "k1", "region": "aten",
                        "candidates_ms": {"iree": 2.0, "aten": 1.0}}
    assert art.manifest.replace(len(art.constants), region=None, variant=None).plan()["region"] is None


def test_replace_takes_fields_read_from_another_manifest(art):
    """A field read off a manifest is a tuple; set on another, it is the same JSON list."""
    m = art.manifest.replace(len(art.constants), placements=art.manifest.placements)
    assert m == art.manifest and isinstance(m.to_json()["placements"], list)
