"""Loading weights into an empty (meta) model from its checkpoint, as every rank of a sharded run
does: persistent buffers from the file, shared buffers in every owner, shapes checked, FP8
dequantised with its block scales, and checkpoints split over several files by an index."""

import json
import math
import re

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, DeepseekV3Config, LlamaConfig

from drmas.models import resolve_model_path
from drmas.models.sharded_loading import _Safetensors, empty_causal_lm, load_shards

CPU = torch.device("cpu")


def _save(model, path, fmt="safetensors", **kwargs):
    """``model`` saved as transformers does, or in the older format, which is read whole."""
    model.save_pretrained(path, **kwargs)
    if fmt == "bin":
        (path / "model.safetensors").unlink()
        torch.save(model.state_dict(), path / "pytorch_model.bin")
    return str(path)


def _equal_state(loaded, saved):
    want = saved.state_dict()
    got = loaded.state_dict()
    assert set(got) == set(want)
    for name, t in got.items():
        assert torch.equal(t, want[name]), name


def _tiny_moe():
    torch.manual_seed(0)
    config = DeepseekV3Config(
        vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, n_shared_experts=1,
        num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # a router bias as training leaves it, not its zeros at init
        model.model.layers[1].mlp.gate.e_score_correction_bias.copy_(torch.tensor([0.5, -1.0, 2.0, 0.25]))
    return model


def test_a_persistent_buffer_is_read_from_the_safetensors_files(tmp_path):
    saved = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-random"))
    bias = torch.tensor([0.5, -1.0, 2.0, 0.25])  # as a router's correction bias, learnt and saved
    saved.model.layers[1].mlp.register_buffer("correction", bias)
    path = _save(saved, tmp_path)
    model = empty_causal_lm(path, torch.float32)
    model.model.layers[1].mlp.register_buffer("correction", torch.zeros(4))  # its value at init
    assert load_shards(model, path, CPU) == "slices"
    assert model.model.layers[1].mlp.correction.tolist() == bias.tolist()
    _equal_state(model, saved)


def test_an_moe_router_bias_is_read_from_the_checkpoint(tmp_path):
    """DeepSeek-V3's ``e_score_correction_bias``: a persistent buffer, learnt in training. (Its
    experts are stored per expert and fused by transformers as it loads, so this is the whole path.)"""
    saved = _tiny_moe()
    path = _save(saved, tmp_path)
    model = empty_causal_lm(path, torch.float32)
    assert load_shards(model, path, CPU) == "whole"
    assert model.model.layers[1].mlp.gate.e_score_correction_bias.tolist() == [0.5, -1.0, 2.0, 0.25]
    _equal_state(model, saved)  # every parameter and buffer


def test_a_shared_buffer_keeps_its_value_in_every_owner():
    path = resolve_model_path("tiny-random")
    want = AutoModelForCausalLM.from_pretrained(path).model.rotary_emb.inv_freq
    model = empty_causal_lm(path, torch.float32)
    shared = model.model.rotary_emb.inv_freq
    for layer in model.model.layers:  # as models whose layers hold the model's rotary tables
        layer.self_attn.register_buffer("inv_freq", shared, persistent=False)
    load_shards(model, path, CPU)
    owners = [model.model.rotary_emb.inv_freq] + [layer.self_attn.inv_freq for layer in model.model.layers]
    assert all(b is owners[0] for b in owners)  # still one tensor
    assert torch.equal(owners[0], want)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_a_tensor_of_another_shape_is_refused_naming_it_both_shapes_and_the_file(tmp_path, fmt):
    torch.manual_seed(0)
    small = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=2)
    other = AutoModelForCausalLM.from_config(LlamaConfig(**{**small.to_dict(), "intermediate_size": 80}))
    path = tmp_path / "model"
    _save(other, path, fmt)
    small.save_pretrained(path)  # the config says 96, the weights have 80
    model = empty_causal_lm(str(path), torch.float32)
    with pytest.raises(ValueError) as err:
        load_shards(model, str(path), CPU)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(path))
    assert re.search(r"tensor 'model\.layers\.0\.mlp\.(gate|up|down)_proj\.weight' has shape "
                     r"\[(80, 64|64, 80)\], the model's has \[(96, 64|64, 96)\]", message), message


def test_a_checkpoint_without_a_tensor_of_the_model_is_refused(tmp_path):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    path = _save(AutoModelForCausalLM.from_config(config), tmp_path, "bin")
    state = torch.load(tmp_path / "pytorch_model.bin")
    del state["model.layers.0.mlp.up_proj.weight"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    # not initialised at random, as transformers would with a warning
    with pytest.raises(ValueError, match=r"has no tensor for 1 of the model's parameters and buffers "
                                         r"\(model\.layers\.0\.mlp\.up_proj\.weight\)"):
        load_shards(empty_causal_lm(path, torch.float32), path, CPU)


def _quantise(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-wise FP8 (e4m3) as DeepSeek-V3 stores it: values and one inverse scale per block."""
    rows, cols = math.ceil(w.shape[0] / block), math.ceil(w.shape[1] / block)
    scale_inv = torch.empty(rows, cols)
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
    for i in range(rows):
        for j in range(cols):
            part = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            scale_inv[i, j] = part.abs().max() / 448.0
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = (part / scale_inv[i, j]).to(q.dtype)
    return q, scale_inv


def _dequantise(q: torch.Tensor, scale_inv: torch.Tensor, block: int) -> torch.Tensor:
    out = q.float().clone()
    for i in range(scale_inv.shape[0]):
        for j in range(scale_inv.shape[1]):
            out[i * block:(i + 1) * block, j * block:(j + 1) * block] *= scale_inv[i, j]
    return out


def _fp8_checkpoint(path, block=32, scales=True):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=80, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False)
    config.quantization_config = {"quant_method": "fp8", "weight_block_size": [block, block],
                                  "activation_scheme": "dynamic"}
    state, want = {}, {}
    for name, t in AutoModelForCausalLM.from_config(config).state_dict().items():
        if t.dim() == 2 and "proj" in name:  # the linear layers, as FP8 checkpoints quantise them
            q, s = _quantise(t, block)
            state[name], want[name] = q, _dequantise(q, s, block)
            if scales:
                state[f"{name}_scale_inv"] = s
        else:
            state[name] = want[name] = t.contiguous()
    path.mkdir()
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(path)
    return str(path), want


def test_fp8_weights_are_dequantised_with_their_block_scales(tmp_path):
    path, want = _fp8_checkpoint(tmp_path / "fp8")
    model = empty_causal_lm(path, torch.float32)
    assert type(model.model.layers[0].mlp.up_proj) is torch.nn.Linear  # a plain model, not an FP8 one
    assert load_shards(model, path, CPU) == "slices"
    for name, t in model.state_dict().items():
        if name in want:
            assert torch.equal(t, want[name]), name
    # a rank's rows that start and end inside a block (80 rows in blocks of 32) read the same values
    up = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(_Safetensors(path).read(up, 40, 72), want[up][40:72])
    # and the values are the weights' (not raw FP8 codes): within e4m3's precision of the originals
    assert model.model.layers[0].mlp.up_proj.weight.abs().max() < 1.0


def test_fp8_without_scales_is_refused_never_loaded_raw(tmp_path):
    path, _ = _fp8_checkpoint(tmp_path / "fp8", scales=False)
    with pytest.raises(ValueError, match=r"is F8_E4M3 and cannot be dequantised "
                                         r"\(no '.*_scale_inv' beside it\)"):
        load_shards(empty_causal_lm(path, torch.float32), path, CPU)


def test_a_checkpoint_split_over_several_files_is_read_through_its_index(tmp_path):
    path = resolve_model_path("tiny-random")
    saved = AutoModelForCausalLM.from_pretrained(path)
    split = _save(saved, tmp_path / "split", max_shard_size="200KB")
    files = sorted(p.name for p in (tmp_path / "split").glob("*.safetensors"))
    weight_map = json.loads((tmp_path / "split" / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(files) >= 3 and sorted(set(weight_map.values())) == files
    model = empty_causal_lm(split, torch.float32)
    assert load_shards(model, split, CPU) == "slices"
    _equal_state(model, saved)
    # rows from the middle of a tensor, as a rank's shard, from whichever file holds it
    name = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(_Safetensors(split).read(name, 10, 30), saved.state_dict()[name][10:30])
