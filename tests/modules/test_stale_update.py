"""The update on samples one version old (``--data.rollout.staleness 1``), with outcomes known in
advance: hand-set advantages, and engine log-probs computed by the weights one update before the
trainer's, as a rollout behind the update records them."""

import lightning as L
import pytest
import torch
from test_training_step import RESPONSES, module, samples, sequence_logprobs

from drmas.algorithms import LossConfig
from drmas.data.batching import make_micro_batches


def token_logprobs(m, state) -> list[list[float]]:
    """Each sample's response-token log-probs under the weights ``state`` (the module's own weights are
    put back after)."""
    policy = m.policies["p"]
    now = {k: v.clone() for k, v in policy.model.state_dict().items()}
    policy.model.load_state_dict(state)
    batch = make_micro_batches(samples(), "p", m.batch_spec("p"))[0]
    with torch.no_grad():
        logp, _ = m.token_logprobs(policy, batch, 1.0)
    policy.model.load_state_dict(now)
    out = [[] for _ in RESPONSES]
    for row, i in enumerate(batch.sample_index.tolist()):
        out[i] = logp[row][batch.response_mask[row]].tolist()
    return out


class Lagged(L.LightningDataModule):
    """The same four samples every iteration, their engine log-probs those of the weights ``lag``
    updates before the trainer's (the initial weights while there are none that old)."""

    def __init__(self, m, lag):
        super().__init__()
        self.m, self.lag, self.states = m, lag, []

    def train_dataloader(self):
        self.states.append({k: v.clone() for k, v in self.m.policies["p"].model.state_dict().items()})
        behaviour = token_logprobs(self.m, self.states[max(0, len(self.states) - 1 - self.lag)])
        batch = samples()
        for s, lp in zip(batch, behaviour):
            s.engine_logprobs = lp
        batches = make_micro_batches(batch, "p", self.m.batch_spec("p"))
        return torch.utils.data.DataLoader(batches, batch_size=None, collate_fn=lambda x: x)


def train(lag: int, iterations: int = 6):
    m = module(lr=3e-3)
    m.loss = LossConfig(importance_cap=2.0, clip_low=0.2, clip_high=0.2)
    before = sequence_logprobs(m)
    trainer = L.Trainer(accelerator="cpu", max_epochs=iterations, reload_dataloaders_every_n_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(m, datamodule=Lagged(m, lag))
    moved = [b - a for a, b in zip(before, sequence_logprobs(m))]
    tag = "train/p/importance_weight_mean"
    weights = [h[tag] for h in m.history if tag in h]
    return moved, weights


def test_samples_one_update_old_raise_the_rewarded_responses_as_on_policy_ones():
    on, on_weights = train(lag=0)
    off, off_weights = train(lag=1)
    for moved in (on, off):  # advantages +1, -1, +0.5, -0.5
        assert moved[0] > 0 and moved[2] > 0 and moved[1] < 0 and moved[3] < 0, moved
    # on-policy the engine is the trainer: weights of 1; one update behind they differ (the first
    # iteration has no older weights), and the corrected update moves each response about as far
    # as on-policy: a response the last update already pushed down moves less (pi_prox / pi_behav).
    # Measured, the same on an Intel Xeon with AMX and an AMD EPYC (nats; weights per iteration):
    assert on_weights == pytest.approx([1.0] * 6, abs=1e-5)
    assert on == pytest.approx([2.0907, -1.0079, 1.9335, -0.5603], abs=0.02)
    assert off == pytest.approx([2.3312, -0.6794, 1.9937, -0.2643], abs=0.02)
    assert off_weights == pytest.approx([1.0, 1.2533, 1.4386, 1.3032, 1.2564, 1.2554], abs=0.01)
