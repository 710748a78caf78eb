"""One optimiser step of MultiAgentRL on a fixed batch, unsharded (1 process) or sharded with
FSDP2 over 2 CPU processes (gloo); writes the loss, grad norm and final weights to OUT.

    python tests/modules/fsdp_step.py OUT [--shard] [--cuda]

``--cuda``: on one GPU, sharded over that one rank (tests/gpu/test_cuda.py).

Lightning starts the second rank by running this script again. Each rank trains its own share
of the samples, as a real iteration deals them (whole prefix groups, a zero-weight padding pass
where a rank has fewer micro-batches, loss scales multiplied by the world size), so FSDP's
averaged gradient equals the single-process gradient only if all of that is right. The samples
share prompt prefixes, so the packed rows run through the sharded model too.
"""

import sys

import lightning as L
import torch

# same folder: hand-set advantages on samples sharing prompt prefixes (tree- and parallel-shaped)
from test_prefix_sharing import Fixed

from drmas.algorithms import LossConfig
from drmas.modules import MultiAgentRL, PolicyConfig
from drmas.modules.policy import deferred_weights
from drmas.modules.policy_config import OptimSettings, PolicyGeneration, UpdateSettings
from drmas.records import GenerationSettings


def main(out: str, shard: bool, cuda: bool = False) -> None:
    torch.manual_seed(0)
    cfg = PolicyConfig(model="tiny-random", optim=OptimSettings(lr=1e-2, grad_clip=0.5),
                       update=UpdateSettings(micro_batch_size=3),
                       generation=PolicyGeneration(
                           train=GenerationSettings(temperature=1.0, max_new_tokens=8)))
    # sharded: built on the meta device, each rank reading only its rows of the weights once
    # sharded; a wrong row would change the loss and the step
    with deferred_weights(shard):
        module = MultiAgentRL(policies={"p": cfg}, agents={"a": "p"}, engine="hf",
                              loss=LossConfig(importance_cap=None, entropy_coef=0.01))
    strategy = "auto"
    if shard:
        from drmas.modules.sharding import FSDP

        strategy = FSDP(mixed_precision=False)  # fp32 on both sides, also on a GPU: the steps compare
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1 if cuda else 2 if shard else 1,
                        strategy=strategy, max_epochs=1,
                        reload_dataloaders_every_n_epochs=1, use_distributed_sampler=False, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    dm = Fixed(module, micro_batch_size=3)
    # the weights every run starts from: what the step moved each element by, seen from the test
    initial = ({} if shard
               else {n: p.detach().clone() for n, p in module.policies["p"].model.named_parameters()})
    trainer.fit(module, datamodule=dm)
    weights = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
               for n, p in module.policies["p"].model.named_parameters()}
    # the rollout engine of a sharded policy: its own unsharded copy, filled from the shards
    module.sync_weights()
    engine = module.engines.built["p"]
    engine_diff = max(float((engine.model.state_dict()[n] - w).abs().max()) for n, w in weights.items())
    shares = module.gather_objects([(b.sample_index.tolist(), b.stand_in) for b in dm.batches])
    if trainer.is_global_zero:
        logged = next(h for h in module.history if "train/p/loss" in h)
        torch.save({"loss": logged["train/p/loss"], "grad_norm": logged["train/p/grad_norm"],
                    "version": module.policies["p"].version, "weights": weights, "initial": initial,
                    "chunk_tokens": module.policies["p"].chunk_tokens,
                    "packed": sum(b.packed is not None for b in dm.batches), "shares": shares,
                    "read": module.weights_read,
                    "engine_copy": engine.model is not module.policies["p"].model, "engine_diff": engine_diff,
                    "sharded": any(hasattr(p, "full_tensor")
                                   for p in module.policies["p"].model.parameters())}, out)


if __name__ == "__main__":
    main(sys.argv[1], "--shard" in sys.argv[2:], "--cuda" in sys.argv[2:])
