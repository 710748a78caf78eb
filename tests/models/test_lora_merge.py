"""The merged LoRA export (``save_adapter(..., merged=True)``) for adapters built with peft
directly: a GPT-2-style ``Conv1D`` layer (``fan_in_fan_out``) merges with its transposed update,
and when two adapters on one base target different modules, the other adapter's layers are not
left wrapped in the merged model. The merged model computes the adapted model's logits."""

import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from drmas.models import load_causal_lm
from drmas.models.lora import LoraSettings, activate, add_lora, save_adapter


def randomize(model, adapter):
    """LoRA starts with B = 0 (no change): give every B of ``adapter`` values."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if f"lora_B.{adapter}." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def merged_matches(model, adapter, tmp_path, ids):
    activate(model, adapter)
    with torch.no_grad():
        want = model(input_ids=ids).logits
    save_adapter(model, adapter, str(tmp_path / adapter), merged=True)
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / adapter / "merged")).eval()
    names = list(merged.state_dict())
    assert not [n for n in names if "lora_" in n or "base_layer" in n]
    with torch.no_grad():
        got = merged(input_ids=ids).logits
    return (got - want).abs().max().item()


def test_a_conv1d_adapter_merges_transposed(tmp_path):
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64)).eval()
    model = add_lora(gpt2, "a", LoraSettings(rank=4, target_modules=["c_attn", "c_fc"]))
    randomize(model, "a")
    ids = torch.tensor([[1, 5, 9, 33, 2, 7]])
    with torch.no_grad():
        activate(model, "a")
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            base = model(input_ids=ids).logits
    assert (adapted - base).abs().max() > 1e-2  # the adapter changes the model
    assert merged_matches(model, "a", tmp_path, ids) < 1e-4


def test_adapters_on_different_modules_of_one_base_merge_alone(tmp_path):
    base, _ = load_causal_lm("tiny-random")
    model = add_lora(base, "a", LoraSettings(rank=4, target_modules=["q_proj"]))
    model = add_lora(model, "b", LoraSettings(rank=4, target_modules=["v_proj", "down_proj"]))
    randomize(model, "a")
    randomize(model, "b")
    model.eval()
    ids = torch.tensor([[1, 5, 9, 33, 2, 7]])
    assert merged_matches(model, "a", tmp_path, ids) < 1e-4
    assert merged_matches(model, "b", tmp_path, ids) < 1e-4


def test_a_dora_adapter_merges_with_its_magnitudes(tmp_path):
    # peft's merge (drmas's export calls it) folds DoRA's per-column magnitudes in too: the sum
    # B A alone, which a hand-written merge adds, gives another model
    import peft

    base, _ = load_causal_lm("tiny-random")
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"],
                                                      use_dora=True), adapter_name="a")
    randomize(model, "a")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_magnitude_vector.a" in name:
                p.mul_(1.5)  # magnitudes away from the base weight's own column norms
    model.eval()
    ids = torch.tensor([[1, 5, 9, 33, 2, 7]])
    assert merged_matches(model, "a", tmp_path, ids) < 1e-4
