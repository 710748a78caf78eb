"""One optimiser step of MultiAgentRL on a fixed batch, unsharded (1 process) or sharded with
FSDP2 over 2 CPU processes (gloo); writes the loss, grad norm and final weights to OUT.

    python tests/modules/fsdp_step.py OUT [--shard]

Lightning starts the second rank by running this script again. Every rank trains on the same
micro-batches, so FSDP's averaged gradient equals the single-process gradient.
"""

import sys

import lightning as L
import torch

from drmas.data.batching import make_micro_batches
from drmas.engines import SamplingParams
from drmas.modules import MultiAgentRL, PolicyConfig
from drmas.records import Experience

PROMPT = [1, 504, 2000, 31, 2]
RESPONSES = [[300, 301, 302], [410, 411], [520, 521, 522, 523, 524], [630]]
ADVANTAGES = [1.0, -1.0, 0.5, -0.5]


class Fixed(L.LightningDataModule):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def train_dataloader(self):
        samples = [Experience("t", f"j{i}", f"j{i}", "a", 0, "p", PROMPT, r, [0.0] * len(r), advantage=a)
                   for i, (r, a) in enumerate(zip(RESPONSES, ADVANTAGES))]
        spec = self.module.batch_spec("p")
        batches = make_micro_batches(samples, "p", 2, spec.pad_id, spec.agg)
        return torch.utils.data.DataLoader(batches, batch_size=None, collate_fn=lambda x: x)


def main(out: str, shard: bool) -> None:
    torch.manual_seed(0)
    cfg = PolicyConfig(model="tiny-random", lr=1e-2, grad_clip=0.5, micro_batch_size=2,
                       train_sampling=SamplingParams(temperature=1.0, max_new_tokens=8))
    module = MultiAgentRL(policies={"p": cfg}, agents={"a": "p"}, engine="hf", is_cap=None, entropy_coef=0.01)
    strategy = "auto"
    if shard:
        from drmas.modules.sharding import FSDP

        strategy = FSDP()
    trainer = L.Trainer(accelerator="cpu", devices=2 if shard else 1, strategy=strategy, max_epochs=1,
                        reload_dataloaders_every_n_epochs=1, use_distributed_sampler=False, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=Fixed(module))
    weights = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
               for n, p in module.policies["p"].model.named_parameters()}
    if trainer.is_global_zero:
        logged = next(h for h in module.history if "train/p/loss" in h)
        torch.save({"loss": logged["train/p/loss"], "grad_norm": logged["train/p/grad_norm"],
                    "version": module.policies["p"].version, "weights": weights,
                    "sharded": any(hasattr(p, "full_tensor") for p in module.policies["p"].model.parameters())}, out)


if __name__ == "__main__":
    main(sys.argv[1], "--shard" in sys.argv[2:])
