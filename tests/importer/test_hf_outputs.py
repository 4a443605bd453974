"""A Hugging Face language model with its defaults (``use_cache=True``): it returns a
``ModelOutput`` holding a ``DynamicCache``, which the artifact returns too, before and
after a save and load in a fresh process (``aot.hf_pytree``)."""

import subprocess
import sys

import pytest
import torch

import aot

tf = pytest.importorskip("transformers")
pytest.importorskip("transformers.integrations.executorch")


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64,
                        bos_token_id=0, eos_token_id=0)
    m = tf.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 1000, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = m(ids)
    return m, ids, ref


def _same(out, ref, tol):
    assert type(out) is type(ref)
    assert type(out.past_key_values) is type(ref.past_key_values)
    torch.testing.assert_close(out.logits, ref.logits, rtol=tol, atol=tol)
    layers = list(zip(out.past_key_values.layers, ref.past_key_values.layers, strict=True))
    assert len(layers) == 2
    for got, want in layers:
        torch.testing.assert_close(got.keys, want.keys, rtol=tol, atol=tol)
        torch.testing.assert_close(got.values, want.values, rtol=tol, atol=tol)


def test_a_language_model_with_its_cache_compiles_and_returns_eager_structure(gpt2, tmp_path):
    m, ids, ref = gpt2
    cm = aot.compile(m, (ids,))
    # float32 through IREE: within a few ulps of eager's logits and cache
    _same(cm(ids), ref, 1e-5)
    path = str(tmp_path / "gpt2.aot")
    cm.save(path)
    torch.save({"ids": ids, "logits": ref.logits,
                "keys": [layer.keys for layer in ref.past_key_values.layers],
                "values": [layer.values for layer in ref.past_key_values.layers]},
               tmp_path / "ref.pt")
    script = f"""
import sys, torch, aot
assert "transformers" not in sys.modules
d = torch.load({str(tmp_path / 'ref.pt')!r})
out = aot.load({path!r})(d["ids"])
assert type(out).__name__ == "CausalLMOutputWithCrossAttentions", type(out)
assert type(out.past_key_values).__name__ == "DynamicCache", type(out.past_key_values)
torch.testing.assert_close(out.logits, d["logits"], rtol=1e-5, atol=1e-5)
for layer, k, v in zip(out.past_key_values.layers, d["keys"], d["values"], strict=True):
    torch.testing.assert_close(layer.keys, k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.values, v, rtol=1e-5, atol=1e-5)
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_loading_imports_only_transformers_own_output_modules():
    """A spec naming a ``transformers`` type outside its model outputs and cache imports
    nothing; one of a model's modeling module imports that module (its outputs register
    themselves)."""
    from aot.hf_pytree import register_for_load
    names = ["transformers.commands.chat.ChatCommand", "transformers.utils.hub.X",
             "os.path.Y", "transformers.models.gpt2.modeling_gpt2.GPT2DoubleHeadsModelOutput"]
    before = set(sys.modules)
    register_for_load(names)
    new = set(sys.modules) - before
    assert not {"transformers.commands.chat", "transformers.utils.hub", "os.path"} & new
    assert "transformers.models.gpt2.modeling_gpt2" in sys.modules
    import torch.utils._pytree as pytree
    assert names[-1] in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE


def test_a_decode_step_takes_the_cache_as_input(gpt2):
    """One token after the prompt, the prompt's ``DynamicCache`` passed in (with a padding
    mask over a batch of two): the artifact's logits and grown cache are eager's."""
    import copy
    m, _, _ = gpt2
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (2, 6), generator=g)
    mask = torch.ones(2, 6, dtype=torch.int64)
    mask[1, :2] = 0
    with torch.no_grad():
        past = m(ids, attention_mask=mask).past_key_values
        nxt = torch.randint(0, 1000, (2, 1), generator=g)
        mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.int64)], 1)
        ref = m(nxt, past_key_values=copy.deepcopy(past), attention_mask=mask)
    kwargs = {"past_key_values": copy.deepcopy(past), "attention_mask": mask}
    cm = aot.compile(m, (nxt,), example_kwargs=kwargs)
    out = cm(nxt, past_key_values=copy.deepcopy(past), attention_mask=mask)
    _same(out, ref, 1e-5)
    assert out.past_key_values.layers[0].keys.shape[2] == 7
