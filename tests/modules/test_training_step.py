"""MultiAgentRL.training_step with hand-set, non-zero advantages: outcomes known in advance."""

import math
from dataclasses import replace

import lightning as L
import numpy as np
import pytest
import torch

from drmas.algorithms import LossConfig
from drmas.data.batching import make_micro_batches
from drmas.hardware import fast_dtype
from drmas.modules import MultiAgentRL, PolicyConfig
from drmas.records import BatchSpec, Sample
from drmas.modules.policy_config import OptimSettings, PolicyGeneration, UpdateSettings
from drmas.records import GenerationSettings

PROMPT = [1, 504, 2000, 31, 2]
# four responses of different lengths; advantages of both signs
RESPONSES = [[300, 301, 302], [410, 411], [520, 521, 522, 523, 524], [630]]
ADVANTAGES = [1.0, -1.0, 0.5, -0.5]


def samples(advantages=ADVANTAGES):
    return [Sample("t", f"j{i}", "a", 0, "p", PROMPT, r, [0.0] * len(r), advantage=a)
            for i, (r, a) in enumerate(zip(RESPONSES, advantages))]


class Fixed(L.LightningDataModule):
    """The same micro-batches every iteration, as the rollout side would hand them over."""

    def __init__(self, module, micro_batch_size, ppo_epochs=1, advantages=ADVANTAGES):
        super().__init__()
        self.args = (module, micro_batch_size, ppo_epochs, advantages)

    def train_dataloader(self):
        module, mbs, epochs, adv = self.args
        spec = module.batch_spec("p")
        batches = [b for e in range(epochs)
                   for b in make_micro_batches(samples(adv), "p", replace(spec, micro_batch_size=mbs),
                                               ppo_epoch=e)]
        return torch.utils.data.DataLoader(batches, batch_size=None, collate_fn=lambda x: x)


class Grads(L.Callback):
    """The gradient of every parameter right before each optimiser step."""

    def __init__(self):
        self.steps = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps.append({n: p.grad.detach().clone()
                           for n, p in pl_module.policies["p"].model.named_parameters()
                           if p.grad is not None})


def module(agg="token-mean", lr=1e-3, ppo_epochs=1, clip=0.2, micro_batch_size=4, kl_coef=0.0):
    torch.manual_seed(0)
    cfg = PolicyConfig(model="tiny-random", optim=OptimSettings(lr=lr, grad_clip=0.0),
                       update=UpdateSettings(ppo_epochs=ppo_epochs, micro_batch_size=micro_batch_size),
                       generation=PolicyGeneration(
                           train=GenerationSettings(temperature=1.0, max_new_tokens=8)))
    return MultiAgentRL(policies={"p": cfg}, agents={"a": "p"}, engine="hf",
                        loss=LossConfig(importance_cap=None, clip_low=clip, clip_high=clip, agg=agg,
                                        kl_coef=kl_coef))


def fit(m, micro_batch_size, ppo_epochs=1, callbacks=(), advantages=ADVANTAGES, iterations=1):
    trainer = L.Trainer(accelerator="cpu", max_epochs=iterations, reload_dataloaders_every_n_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=list(callbacks))
    trainer.fit(m, datamodule=Fixed(m, micro_batch_size, ppo_epochs, advantages))
    return trainer


def sequence_logprobs(m) -> list[float]:
    """Mean response-token log-prob of each sample under the current weights."""
    b = make_micro_batches(samples(), "p", BatchSpec(pad_id=m.batch_spec("p").pad_id, micro_batch_size=8))[0]
    with torch.no_grad():
        logp, _ = m.token_logprobs(m.policies["p"], b, 1.0)
    per_row = (logp * b.response_mask).sum(-1) / b.response_mask.sum(-1)
    out = [0.0] * len(RESPONSES)
    for row, i in enumerate(b.sample_index.tolist()):
        out[i] = float(per_row[row])
    return out


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradients_accumulated_over_micro_batches_equal_the_whole_batch(agg):
    whole, pieces = Grads(), Grads()
    fit(module(agg, micro_batch_size=4), 4, callbacks=[whole])
    fit(module(agg, micro_batch_size=1), 1, callbacks=[pieces])
    assert len(whole.steps) == len(pieces.steps) == 1  # one optimiser step either way
    a, b = whole.steps[0], pieces.steps[0]
    assert a.keys() == b.keys() and len(a) > 0
    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in a.values()))
    assert norm > 1e-4  # non-zero advantages give a real gradient
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-6 * norm, msg=name)


def test_one_step_raises_positive_and_lowers_negative_advantage_responses():
    m = module(lr=1e-3)
    before = sequence_logprobs(m)
    fit(m, 2)
    after = sequence_logprobs(m)
    delta = [b - a for a, b in zip(before, after)]
    assert delta[0] > 0 and delta[2] > 0, delta  # advantages +1, +0.5
    assert delta[1] < 0 and delta[3] < 0, delta  # advantages -1, -0.5
    assert m.policies["p"].version == 1


def test_each_samples_trainer_vs_engine_gap_is_kept_per_token_for_its_record():
    m = module(lr=1e-2, ppo_epochs=2)
    b = make_micro_batches(samples(), "p", BatchSpec(pad_id=m.batch_spec("p").pad_id, micro_batch_size=8))[0]
    with torch.no_grad():
        logp, _ = m.token_logprobs(m.policies["p"], b, 1.0)
    before = {i: logp[row][b.response_mask[row].bool()] for row, i in enumerate(b.sample_index.tolist())}
    fit(m, 2, ppo_epochs=2)  # the second epoch's moved weights must not overwrite the first's gaps
    assert sorted(m.sample_gaps) == [("p", i) for i in range(len(RESPONSES))]
    for i, response in enumerate(RESPONSES):
        mean, tokens = m.sample_gaps[("p", i)]
        # the engine's log-probs are all 0 here: trainer - engine is the trainer's own, token by token
        assert len(tokens) == len(response) and tokens.dtype == np.float16
        torch.testing.assert_close(torch.from_numpy(tokens).float(), before[i], rtol=2e-3, atol=2e-3)
        assert mean == pytest.approx(float(before[i].abs().mean()), rel=1e-3)


def test_the_second_ppo_epoch_sees_moved_ratios_and_clipping_engages():
    tight = module(lr=1e-2, ppo_epochs=2, clip=0.01)
    fit(tight, 2, ppo_epochs=2)
    s = next(h for h in tight.history if "train/p/clip_frac" in h)
    # the first PPO epoch runs at ratio 1 exactly (old log-probs are its own): any clipped token
    # and any ratio away from 1 come from the second epoch, after the first step moved the weights
    assert tight.policies["p"].version == 2
    assert s["train/p/clip_frac"] > 0 and s["train/p/approx_kl"] > 0 and s["train/p/ratio_max"] > 1.01

    loose = module(lr=1e-2, ppo_epochs=2, clip=10.0)
    fit(loose, 2, ppo_epochs=2)
    s = next(h for h in loose.history if "train/p/clip_frac" in h)
    assert s["train/p/clip_frac"] == 0 and s["train/p/approx_kl"] > 0  # same moves, nothing clipped


def test_a_kl_penalty_keeps_a_frozen_reference_and_grows_as_the_policy_moves():
    m = module(lr=1e-2, kl_coef=0.1)
    ref = m.policies["p"].reference
    assert ref is not None and next(ref.parameters()).dtype == fast_dtype("cpu")  # bf16 where native
    frozen = {n: p.detach().clone() for n, p in ref.named_parameters()}
    fit(m, 2, iterations=3)
    assert all(torch.equal(frozen[n], p) for n, p in ref.named_parameters())  # never trained
    assert not any(p.requires_grad for p in ref.parameters())
    kls = [h["train/p/kl"] for h in m.history if "train/p/kl" in h]
    assert len(kls) == 3 and all(math.isfinite(k) and k >= 0 for k in kls)
    # iteration 1 runs at the initial weights (at most bf16 rounding apart); then the policy drifts
    assert kls[0] < 1e-3 < kls[2] and kls[2] > kls[1] > kls[0]
    assert module().policies["p"].reference is None  # no reference without a KL penalty
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        module(kl_coef=-1.0)


class ByAgent(L.LightningDataModule):
    """Samples of two agents (a: 0 and 2, b: 1 and 3) on policy p, split by agent; ``only``
    keeps one agent's micro-batches (its last one carrying the step)."""

    def __init__(self, module, only=None):
        super().__init__()
        self.module, self.only = module, only

    def train_dataloader(self):
        s = samples()
        for i, x in enumerate(s):
            x.agent = "a" if i % 2 == 0 else "b"
        spec = self.module.batch_spec("p")
        batches = make_micro_batches(s, "p", BatchSpec(pad_id=spec.pad_id, micro_batch_size=1, agg=spec.agg,
                                                       by_agent=spec.by_agent))
        if self.only is not None:
            batches = [b for b in batches if b.agent == self.only]
            for b in batches:
                b.step_after = False
            batches[-1].step_after = True
        return torch.utils.data.DataLoader(batches, batch_size=None, collate_fn=lambda x: x)


def test_per_agent_grad_norms_are_each_agents_own_gradient():
    def run(only=None):
        m = module(micro_batch_size=1)
        m.agent_grad_norms = True
        grads = Grads()
        trainer = L.Trainer(accelerator="cpu", max_epochs=1, reload_dataloaders_every_n_epochs=1,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=[grads])
        trainer.fit(m, datamodule=ByAgent(m, only))
        return m, grads.steps[0]

    def norm(grad):
        return float(torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g) for g in grad.values()])))

    both, total = run()
    logged = both.history[-1]
    # a direct computation: the gradient of agent a's micro-batches alone (same scales), and of b's
    _, only_a = run("a")
    _, only_b = run("b")
    assert logged["train/p/a/grad_norm"] == pytest.approx(norm(only_a), rel=1e-5)
    assert logged["train/p/b/grad_norm"] == pytest.approx(norm(only_b), rel=1e-5)
    # the two contributions add up to the policy's gradient, whose norm is logged as before
    assert all(torch.allclose(total[n], only_a[n] + only_b[n], atol=1e-6) for n in total)
    assert logged["train/p/grad_norm"] == pytest.approx(norm(total), rel=1e-5)
    assert logged["train/p/a/grad_norm"] != pytest.approx(logged["train/p/b/grad_norm"])
