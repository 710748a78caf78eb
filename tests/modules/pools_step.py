"""One optimiser step of a two-policy team (A for agent a, B for agent b) on a fixed batch, over 2 CPU
processes (gloo), in the shared layout (both policies sharded over both ranks), then in per-policy
pools (A on rank 0, B on rank 1), each from the same initial weights; each rank writes what it holds
after each to OUT.<layout>.<rank>.

    python tests/modules/pools_step.py OUT

Lightning starts the second rank by running this script again; the two fits share its processes.
The samples are the prefix-sharing test's, dealt to the two agents, with their hand-set advantages;
each rank gets its micro-batches as a rollout deals them (``policy_micro_batches``), so in the pooled
layout rank 0 trains only A and rank 1 only B, and the loss scales must still be those of the whole
batch for the step to equal the shared one.
"""

import sys
import time
from dataclasses import replace

import lightning as L
import torch

from test_prefix_sharing import SAMPLES  # same folder: samples sharing prompt prefixes

from drmas.algorithms import LossConfig
from drmas.data.batching import policy_micro_batches
from drmas.modules import MultiAgentRL, PolicyConfig
from drmas.modules.policy import deferred_weights
from drmas.modules.policy_config import OptimSettings, PolicyGeneration, UpdateSettings
from drmas.modules.sharding import FSDP
from drmas.records import GenerationSettings


def samples():
    out = []
    for i, s in enumerate(SAMPLES):  # every other sample to agent b, so both policies train 4
        agent = "ab"[i % 2]
        out.append(replace(s, agent=agent, policy=agent.upper()))
    return out


class Fixed(L.LightningDataModule):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def train_dataloader(self):
        m = self.module
        specs = {name: replace(m.batch_spec(name), micro_batch_size=2) for name in ("A", "B")}
        self.batches = policy_micro_batches(samples(), specs, m.rank, m.world_size)
        return torch.utils.data.DataLoader(self.batches, batch_size=None, collate_fn=lambda x: x)


class Clock(L.Callback):
    """The wall-clock start of this rank's first micro-batch and the end of its last."""

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.start = getattr(self, "start", time.time())

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.end = time.time()


def held(module, name):
    """Elements of ``name``'s parameters this rank keeps in memory (its shards)."""
    if name not in module.policies:  # another rank's: its tokenizer and settings only
        return 0
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel()
               for p in module.policies[name].model.parameters())


def step(out: str, layout: str) -> None:
    torch.manual_seed(0)
    pooled = layout == "pooled"

    def cfg(rank):
        return PolicyConfig(model="tiny-random", optim=OptimSettings(lr=1e-2, grad_clip=0.5),
                            update=UpdateSettings(micro_batch_size=2), ranks=[rank] if pooled else None,
                            generation=PolicyGeneration(train=GenerationSettings(temperature=1.0,
                                                                                 max_new_tokens=8)))

    with deferred_weights(True):
        module = MultiAgentRL(policies={"A": cfg(0), "B": cfg(1)}, agents={"a": "A", "b": "B"}, engine="hf",
                              loss=LossConfig(importance_cap=None, entropy_coef=0.01))
    clock = Clock()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=FSDP(mixed_precision=False), max_epochs=1,
                        reload_dataloaders_every_n_epochs=1, use_distributed_sampler=False, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[clock])
    trainer.fit(module, datamodule=Fixed(module))
    weights, moments = {}, {}
    for name, policy in module.policies.items():
        full = lambda t: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()  # noqa: E731
        weights[name] = {n: full(p) for n, p in policy.model.named_parameters()}
        state = module._optimizer(name).state
        moments[name] = {n: (full(state[p]["exp_avg"]), full(state[p]["exp_avg_sq"]))
                         for n, p in policy.model.named_parameters()}
    logged = next(h for h in module.history if "train/A/loss" in h)
    torch.save({"weights": weights, "moments": moments, "held": {n: held(module, n) for n in ("A", "B")},
                "span": (clock.start, clock.end), "loss": {n: logged[f"train/{n}/loss"] for n in "AB"},
                "grad_norm": {n: logged[f"train/{n}/grad_norm"] for n in "AB"},
                "versions": {n: p.version for n, p in module.policies.items()}},
               f"{out}.{layout}.{trainer.global_rank}")


if __name__ == "__main__":
    for layout in ("shared", "pooled"):
        step(sys.argv[1], layout)
