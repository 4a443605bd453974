"""A measured placement is reproducible: a second compile reuses it; a plan pins it.

The region decision (``aot.lower.regions``) is cached per program and machine, so
compiling the same model twice on one machine gives the same placements and the
same artifact bytes' decisions; ``CompiledModule.plan()`` pinned into another
compile gives its choice without measuring; ``AOT_REMEASURE=1`` measures again.
"""

import pytest
import torch

import aot


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 64)
        self.b = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.b(torch.special.i0(self.a(x) * 0.1))


def _placements(cm):
    return [(p["node"], p["where"]) for p in cm.manifest["placements"]], \
        (cm.manifest.get("region") or {}).get("chosen"), cm.manifest["driver"]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("AOT_REMEASURE", raising=False)
    return tmp_path


def test_second_compile_reuses_the_decision(cache):
    torch.manual_seed(0)
    m, x = Small().eval(), torch.randn(4, 64)
    first = aot.compile(m, (x,))
    assert first.manifest["region"]["source"] == "measured"
    second = aot.compile(m, (x,))
    assert "reused" in second.manifest["region"]["source"]
    assert _placements(second) == _placements(first)
    assert "the decision was reused" in second.report()
    with torch.no_grad():
        torch.testing.assert_close(second(x), m(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pin", ["iree", "aten"])
def test_a_plan_pins_the_choice(cache, pin, tmp_path):
    import json
    torch.manual_seed(0)
    m, x = Small().eval(), torch.randn(4, 64)
    cm = aot.compile(m, (x,), plan={"region": pin})
    assert cm.manifest["region"]["chosen"] == pin
    assert "pinned" in cm.manifest["region"]["source"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(cm.plan()))
    again = aot.compile(m, (x,), plan=str(path))
    assert _placements(again) == _placements(cm)
    with torch.no_grad():
        torch.testing.assert_close(again(x), m(x), rtol=1e-5, atol=1e-5)


def test_a_plan_naming_a_missing_candidate_is_an_error(cache):
    m, x = Small().eval(), torch.randn(4, 64)
    with pytest.raises(aot.UnsupportedOp, match="pins region candidate 'aten-int8-onednn'"):
        aot.compile(m, (x,), plan={"region": "aten-int8-onednn"})
    with pytest.raises(aot.UnsupportedOp, match="plan should be"):
        aot.compile(m, (x,), plan={"nothing": 1})


def test_near_ties_keep_the_earlier_candidate():
    from aot.lower.regions import _decide
    # three candidates tied within MARGIN, all well ahead of iree: the first in order wins
    tied = {"iree": (10.0, 0.2, 9), "iree-sync": (5.0, 0.3, 9), "aten": (4.9, 0.3, 9),
            "aten-prepacked": (4.95, 0.2, 9)}
    assert _decide(tied)["chosen"] == "iree-sync"
    # a lead beyond MARGIN and beyond two standard errors of the difference wins
    ahead = {**tied, "aten-prepacked": (4.0, 0.2, 9)}
    assert _decide(ahead)["chosen"] == "aten-prepacked"
    # a noisy incumbent does not block a faster candidate for good (a measured case: BERT's
    # per-op placement at 2.10 +- 1.19 ms against its prepacked region at 1.38 +- 0.11):
    # after 18 runs each the lead is within the noise (undecided, measured more)...
    bert = {"iree": (2.096, 1.186, 18), "iree-sync": (1.758, 0.136, 18),
            "aten": (1.469, 0.115, 18), "aten-prepacked": (1.383, 0.105, 18)}
    assert _decide(bert)["undecided"] == ["iree", "aten-prepacked"]
    # ... and with four times the runs it is a win
    bert = {k: (*v[:2], 72) for k, v in bert.items()}
    assert _decide(bert)["chosen"] == "aten-prepacked" and "undecided" not in _decide(bert)
    # a lead within the noise of too few samples is undecided: the earlier candidate stands
    unclear = {"iree": (10.0, 3.0, 9), "aten": (8.0, 0.1, 9)}
    region = _decide(unclear)
    assert region["chosen"] == "iree" and region["undecided"] == ["iree", "aten"]
    # ... and decided once there are enough samples
    assert _decide({"iree": (10.0, 3.0, 90), "aten": (8.0, 0.1, 90)})["chosen"] == "aten"


@pytest.mark.parametrize("name", ["custom_op", "bert", "resnet18"])
def test_two_compiles_of_a_bundled_model_place_identically(cache, name):
    from models import get
    model, args = get(name)
    first, second = aot.compile(model, args), aot.compile(model, args)
    assert _placements(second) == _placements(first)
    assert second.manifest.get("executor") == first.manifest.get("executor")
    assert second.artifact.vmfb == first.artifact.vmfb
    with torch.no_grad():
        want = model(*args)
        torch.testing.assert_close(second(*args), want, rtol=1e-4, atol=1e-4)


def test_cli_saves_and_pins_a_plan(cache, tmp_path, capsys):
    import json

    from aot.cli import main
    plan = tmp_path / "plan.json"
    assert main(["compile", "custom_op", "-o", str(tmp_path / "a.aot"),
                 "--save-plan", str(plan)]) == 0
    saved = json.loads(plan.read_text())
    assert saved["region"] in saved["candidates_ms"]
    assert main(["compile", "custom_op", "-o", str(tmp_path / "b.aot"), "--plan", str(plan)]) == 0
    a, b = aot.load(str(tmp_path / "a.aot")), aot.load(str(tmp_path / "b.aot"))
    assert _placements(b) == _placements(a)
    assert "pinned" in b.manifest["region"]["source"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"x": 1}')
    assert main(["compile", "custom_op", "-o", str(tmp_path / "c.aot"), "--plan", str(bad)]) != 0
    assert "is not a plan" in capsys.readouterr().err
