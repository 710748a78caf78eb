import json
from pathlib import Path

import pytest
import torch

from drmas.models import load_causal_lm, resolve_model_path
from drmas.models.loading import _build_tiny_random, _materialise


def test_tiny_random_is_a_seeded_small_llama_with_the_smollm2_chat_template(tmp_path):
    model, tok = load_causal_lm("tiny-random")
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim) == (2, 64, 2, 32)
    assert cfg.vocab_size == len(tok) == 49152
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nhi<|im_end|>" in text
    assert tok.pad_token is not None

    # Building it again elsewhere gives the same weights, and leaves the global RNG alone.
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    _build_tiny_random(tmp_path)
    again, _ = load_causal_lm(str(tmp_path))
    assert torch.rand(1) == before
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


def test_dtype_argument():
    model, _ = load_causal_lm("tiny-random", dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_materialise_is_atomic_when_the_build_fails(tmp_path):
    target = tmp_path / "m"

    def broken(out: Path):
        (out / "model.safetensors").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        _materialise(target, broken)
    assert list(tmp_path.iterdir()) == []  # neither the target nor a temporary directory

    _materialise(target, lambda out: (out / "config.json").write_text("{}"))
    assert (target / "config.json").read_text() == "{}"
    # an existing directory is reused, not rebuilt
    assert _materialise(target, broken) == target


def test_unknown_names_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unknown embedded model 'embedded:gpt5'; "
                                         r"known: embedded:smollm2-135m-instruct"):
        load_causal_lm("embedded:gpt5")
    with pytest.raises(FileNotFoundError, match="nowhere/model"):
        load_causal_lm(str(tmp_path / "nowhere/model"))
    with pytest.raises(ValueError, match=r"cannot load model 'nobody-xyz/not-a-model'.*tiny-random"):
        load_causal_lm("nobody-xyz/not-a-model")


def test_a_local_directory_loads(tmp_path):
    model, tok = load_causal_lm("tiny-random")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, _ = load_causal_lm(str(tmp_path))
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)


@pytest.mark.integration
def test_embedded_smollm2_loads_trains_saves_and_answers(tmp_path):
    model, tok = load_causal_lm("embedded:smollm2-135m-instruct")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert getattr(model, "hf_quantizer", None) is None
    cfg = json.loads((Path(resolve_model_path("embedded:smollm2-135m-instruct")) / "config.json").read_text())
    assert "quantization_config" not in cfg

    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, return_tensors="pt",
        return_dict=True
    )
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "4" in tok.decode(out[0, ids["input_ids"].shape[1]:])

    # it trains: a gradient reaches the weights and a step changes them
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model(**ids, labels=ids["input_ids"]).loss.backward()
    w = model.model.layers[0].mlp.up_proj.weight
    assert w.grad is not None and w.grad.abs().sum() > 0
    before = w.detach().clone()
    opt.step()
    assert not torch.equal(before, w)

    # it saves as a plain HF model that transformers reloads
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, _ = load_causal_lm(str(tmp_path))
    assert torch.equal(again.model.layers[0].mlp.up_proj.weight, w.detach())


def test_a_deferred_policy_gets_the_same_weights_buffers_and_reference(tmp_path, caplog):
    from drmas.modules import PolicyConfig
    from drmas.modules.policy import Policy, deferred_weights

    eager = Policy("p", PolicyConfig(model="tiny-random"), reference=True, prefix_sharing=True)
    with deferred_weights():
        late = Policy("p", PolicyConfig(model="tiny-random"), reference=True, prefix_sharing=True)
    assert late.deferred and all(p.is_meta for p in late.model.parameters())  # nothing loaded yet
    assert late.model.lm_head.weight is late.model.model.embed_tokens.weight  # tied, stored once
    assert late.load_weights(torch.device("cpu")) == "slices" and not late.deferred
    for mine, theirs in ((late.model, eager.model), (late.reference, eager.reference)):
        want = theirs.state_dict()
        assert all(torch.equal(t, want[n]) for n, t in mine.state_dict().items())  # buffers included
    ids = torch.tensor([[5, 9, 42, 7]])
    assert torch.equal(late.model(ids).logits, eager.model(ids).logits)  # the rotary frequencies too
    # the same checks of what the model allows, made once the weights are there
    assert ((late.chunk_tokens, late.prefix_sharing) == (eager.chunk_tokens, eager.prefix_sharing)
            == (1024, True))
    # a checkpoint without safetensors files is read whole (once), with a warning
    bin_dir = tmp_path / "bin"
    eager.model.save_pretrained(bin_dir)
    eager.tokenizer.save_pretrained(bin_dir)
    (bin_dir / "model.safetensors").unlink()
    torch.save(eager.model.state_dict(), bin_dir / "pytorch_model.bin")  # the older format
    with deferred_weights():
        old = Policy("p", PolicyConfig(model=str(bin_dir)))
    with caplog.at_level("WARNING"):
        assert old.load_weights(torch.device("cpu")) == "whole"
    assert any("each rank reads the whole model once" in r.getMessage() for r in caplog.records)
    assert all(torch.equal(t, eager.model.state_dict()[n]) for n, t in old.model.state_dict().items())
