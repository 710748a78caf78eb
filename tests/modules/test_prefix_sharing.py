"""Shared-prefix packing in the update: the same loss and gradients as running every sample on
its own (fp32), through MultiAgentRL.training_step with real advantages, micro-batches and
gradient accumulation, for tree- and parallel-shaped rollouts."""

import math
from dataclasses import replace

import lightning as L
import pytest
import torch

from drmas.algorithms import LossConfig
from drmas.data.batching import make_micro_batches
from drmas.modules import MultiAgentRL, PolicyConfig
from drmas.records import BatchSpec, Sample
from drmas.modules.policy_config import OptimSettings, PolicyGeneration, UpdateSettings
from drmas.records import GenerationSettings

g = torch.Generator().manual_seed(0)


def tokens(n):
    return torch.randint(100, 1000, (n,), generator=g).tolist()


def rollout():
    """Tree: 3 candidates of one 24-token prompt. Parallel: 2 trajectories of one task, whose
    second turns extend the first turn's prompt differently. One sample sharing nothing."""
    tree, first = tokens(24), tokens(20)
    out = [Sample("t1", f"c{k}", "a", 0, "p", tree, tokens(2 + k), [0.0] * (2 + k), advantage=a)
           for k, a in enumerate((1.0, -0.5, -0.5))]
    for j, a in enumerate((0.8, -0.8)):
        r1, r2 = tokens(3 + j), tokens(4)
        out.append(Sample("t2", f"j{j}", "a", 0, "p", first, r1, [0.0] * len(r1), advantage=a))
        second = first + r1 + tokens(6)
        out.append(Sample("t2", f"j{j}", "a", 1, "p", second, r2, [0.0] * 4, advantage=a))
    out.append(Sample("t3", "x", "a", 0, "p", tokens(18), tokens(5), [0.0] * 5, advantage=0.3))
    return out


SAMPLES = rollout()


class Fixed(L.LightningDataModule):
    def __init__(self, module, micro_batch_size):
        super().__init__()
        self.module, self.mbs = module, micro_batch_size

    def train_dataloader(self):
        spec = self.module.batch_spec("p")
        batches = make_micro_batches(SAMPLES, "p", replace(spec, micro_batch_size=self.mbs),
                                     rank=self.module.rank, world_size=self.module.world_size)
        self.batches = batches
        return torch.utils.data.DataLoader(batches, batch_size=None, collate_fn=lambda x: x)


class Grads(L.Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads = {n: p.grad.detach().clone() for n, p in pl_module.policies["p"].model.named_parameters()}


def train(prefix_sharing, agg, micro_batch_size, kl_coef):
    cfg = PolicyConfig(model="tiny-random", optim=OptimSettings(lr=1e-3, grad_clip=0.0),
                       update=UpdateSettings(micro_batch_size=micro_batch_size),
                       generation=PolicyGeneration(
                           train=GenerationSettings(temperature=0.7, max_new_tokens=8)))
    m = MultiAgentRL(policies={"p": cfg}, agents={"a": "p"}, engine="hf",
                     loss=LossConfig(importance_cap=None, agg=agg, entropy_coef=0.01, kl_coef=kl_coef),
                     prefix_sharing=prefix_sharing)
    grads, dm = Grads(), Fixed(m, micro_batch_size)
    L.Trainer(accelerator="cpu", max_epochs=1, reload_dataloaders_every_n_epochs=1, logger=False,
              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
              callbacks=[grads]).fit(m, datamodule=dm)
    logged = next(h for h in m.history if "train/p/loss" in h)
    return m, dm.batches, grads.grads, logged


@pytest.mark.parametrize("agg, micro_batch_size, kl_coef", [
    ("token-mean", 3, 0.0), ("seq-mean-token-mean", 4, 0.0), ("seq-mean-token-sum-norm", 8, 0.0),
    ("token-mean", 8, 0.05),
])
def test_packed_prefixes_give_the_same_loss_and_gradients(agg, micro_batch_size, kl_coef):
    m, packed_batches, packed, logged = train(True, agg, micro_batch_size, kl_coef)
    assert m.policies["p"].prefix_sharing
    _, plain_batches, plain, want = train(False, agg, micro_batch_size, kl_coef)
    assert all(b.packed is None for b in plain_batches)
    # prefixes really were shared: fewer tokens ran through the decoder
    ran = sum(b.packed.tokens if b.packed is not None else int(b.attention_mask.sum())
              for b in packed_batches)
    whole = sum(int(b.attention_mask.sum()) for b in plain_batches)
    assert any(b.packed is not None for b in packed_batches) and ran < whole
    assert logged["train/p/tokens"] == ran and want["train/p/tokens"] == whole  # logged as run
    for key in (("train/p/loss", "train/p/entropy", "train/p/grad_norm")
                + (("train/p/kl",) if kl_coef else ())):
        assert logged[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    norm = math.sqrt(sum(float(v.pow(2).sum()) for v in plain.values()))
    assert norm > 1e-3
    for name, grad in plain.items():
        torch.testing.assert_close(packed[name], grad, rtol=1e-5, atol=1e-5 * norm, msg=name)


def test_models_whose_attention_cannot_take_the_block_mask_fall_back(caplog):
    from drmas.models import load_causal_lm
    from drmas.modules.logprobs import packed_logprobs_match
    from drmas.modules.policy import Policy

    model, _ = load_causal_lm("tiny-random")
    assert model.config._attn_implementation == "sdpa" and packed_logprobs_match(model)
    model.config._attn_implementation = "eager"  # an additive float mask
    assert packed_logprobs_match(model)
    model.config._attn_implementation = "flash_attention_2"  # takes no 4-D mask
    assert not packed_logprobs_match(model)
    # a policy without the chunked log-probs runs samples whole, and says so once
    with caplog.at_level("WARNING"):
        policy = Policy("p", PolicyConfig(model="tiny-random",
                                          update=UpdateSettings(logprob_chunk_tokens=0)), prefix_sharing=True)
    assert not policy.prefix_sharing
    assert [r.getMessage() for r in caplog.records].count(
        "policy p: LlamaForCausalLM cannot run packed shared prefixes (needs SDPA or eager attention and the "
        "chunked log-probs); every sample runs its whole prompt") == 1


def test_a_sliding_window_model_packs_only_samples_that_fit_its_window(tmp_path, caplog):
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM

    from drmas.models import resolve_model_path
    from drmas.modules.logprobs import response_logprobs

    tok = AutoTokenizer.from_pretrained(resolve_model_path("tiny-random"))
    torch.manual_seed(0)
    MistralForCausalLM(MistralConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                     head_dim=32, sliding_window=32,
                                     pad_token_id=tok.pad_token_id)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with caplog.at_level("WARNING"):
        module = MultiAgentRL(policies={"p": PolicyConfig(model=str(tmp_path))}, engine="hf")
    policy, spec = module.policies["p"], module.batch_spec("p")
    assert policy.prefix_sharing and spec.prefix_sharing and spec.attention_window == 32
    assert sum("sliding window of 32 tokens" in r.getMessage() for r in caplog.records) == 1
    model = policy.model.eval()

    def group(prompt_len):  # three samples sharing a prompt
        prompt = tokens(prompt_len)
        return [Sample("t", f"c{k}", "a", 0, "p", prompt, tokens(4 + k), [0.0] * (4 + k)) for k in range(3)]

    def logprobs(batch, packed):
        return response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask, 1.0,
                                 packed=batch.packed if packed else None)[0]

    short, long = group(22), group(40)  # 22 + 6 tokens fit the window; 40 + 4 do not
    windowed = BatchSpec(pad_id=spec.pad_id, micro_batch_size=3, prefix_sharing=True,
                         attention_window=spec.attention_window)
    (fits,) = make_micro_batches(short, "p", windowed)
    (whole,) = make_micro_batches(long, "p", windowed)
    assert fits.packed is not None and whole.packed is None  # the long group runs whole samples
    torch.testing.assert_close(logprobs(fits, True), logprobs(fits, False), rtol=1e-5, atol=1e-5)
    # what packing the long group would have done: tokens attend past the window
    (unsafe,) = make_micro_batches(long, "p", BatchSpec(pad_id=spec.pad_id, micro_batch_size=3,
                                                        prefix_sharing=True))
    assert (logprobs(unsafe, True) - logprobs(unsafe, False)).abs().max() > 1e-3

