"""Save every policy as a Hugging Face directory (``save_pretrained``) during and after training.

Lightning's own checkpoints hold optimiser and loop state for resuming; these directories are
what a user serves, evaluates or loads into vLLM. Layout::

    <dirpath>/iter_<k>/<policy>/   config.json, model.safetensors, tokenizer files
                                   (a LoRA policy: adapter_config.json, adapter_model.safetensors
                                   in peft's format, and with merge_lora merged/, a plain model)
    <dirpath>/latest               text: the newest directory name, e.g. "iter_12"

where k is the number of finished RL iterations (one Lightning epoch = one iteration).

The module advances ``pl_module.iteration`` when an iteration begins (its rollout), so in
``on_train_epoch_end`` it already names the iteration that is finishing. That matters because
Lightning calls plain callbacks' ``on_train_epoch_end`` BEFORE the module's own
(``lightning/pytorch/loops/fit_loop.py``, ``_FitLoop.on_advance_end``, lines 482-484).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from drmas.atomic import replace_dir, write_text
from drmas.callbacks.contracts import ExportedPolicy, PolicyModule, require
from drmas.models.lora import save_adapter
from drmas.ranks import at, portable

__all__ = ["HFCheckpoint"]

LATEST_FILE = "latest"


def _full_state_dict(model: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor] | None:
    """A full (unsharded) CPU state dict when ``model`` is sharded with FSDP2, else None; ``keep``:
    on the rank that writes it (the others take part in each gather and drop the tensor at once).

    Gathering is a collective of the model's mesh (every rank, or the policy's pool): each of its
    ranks must call this, one tensor gathered at a time, so the writer's host memory holds one model.
    """
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in model.parameters()):
        return None
    full: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if keep:
            full[name] = whole.detach().to("cpu", copy=True)
        del whole
    return full


class HFCheckpoint(Callback):
    """Write ``<dirpath>/iter_<k>/<policy>/`` with ``save_pretrained`` every n iterations and at the end.

    Each iteration directory is written under a temporary sibling name and renamed into place,
    so a reader (or a resumed run) never sees a partly written one; ``latest`` is replaced
    atomically after the rename. Only global rank 0 writes. Saving iteration k again (a run
    resumed from an older Lightning checkpoint) replaces the old ``iter_<k>``.
    """

    def __init__(
        self, every_n_iterations: int = 0, dirpath: str | None = None, save_tokenizer: bool = True,
        merge_lora: bool = False,
    ) -> None:
        """
        Args:
            every_n_iterations: save after every n-th finished RL iteration; 0 saves only when
                training ends (the final weights are always saved).
            dirpath: where to write; default ``<trainer.log_dir>/hf`` (``default_root_dir/hf``
                without a logger).
            save_tokenizer: also save each policy's tokenizer next to its weights.
            merge_lora: for a LoRA policy, also write its base with the adapter merged in
                (``<policy>/merged``: a plain model, as large as the base).
        """
        if every_n_iterations < 0:
            raise ValueError(f"every_n_iterations must be >= 0, got {every_n_iterations}")
        self.every_n_iterations = int(every_n_iterations)
        self.dirpath = dirpath
        self.save_tokenizer = save_tokenizer
        self.merge_lora = merge_lora
        # The iteration most recently written by this run, so on_train_end does not save it twice.
        self.last_saved: int | None = None
        self.last_saved_path: str | None = None

    # ------------------------------------------------------------------ hooks

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        require(pl_module, PolicyModule, "HFCheckpoint")
        for policy in pl_module.policies.values():
            require(policy, ExportedPolicy, "HFCheckpoint")

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        finished = int(pl_module.iteration)
        if self.every_n_iterations and finished % self.every_n_iterations == 0:
            self.save(trainer, pl_module, finished)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        finished = int(pl_module.iteration)
        if finished != self.last_saved:
            self.save(trainer, pl_module, finished)

    # ------------------------------------------------------------------ saving

    def resolve_dirpath(self, trainer: pl.Trainer) -> str:
        if self.dirpath is not None:
            return os.path.abspath(os.path.expanduser(self.dirpath))
        # trainer.log_dir broadcasts from rank 0: every rank must evaluate it.
        return os.path.join(trainer.log_dir or trainer.default_root_dir, "hf")

    def save(self, trainer: pl.Trainer, pl_module: pl.LightningModule, iteration: int) -> str:
        """Save all policies as ``<dirpath>/iter_<iteration>/``; return that path.

        Call on every rank (sharded weights are gathered collectively). Rank 0 makes the directory;
        each policy is written by the first rank that holds it (rank 0, or under per-policy pools its
        pool's first), into rank 0's temporary directory, which rank 0 then renames into place.
        """
        root = self.resolve_dirpath(trainer)
        name = f"iter_{iteration}"
        target = os.path.join(root, name)
        # frozen: as loaded
        policies = {n: p for n, p in pl_module.policies.items() if p.trainable}
        pools = pl_module.pools if getattr(pl_module, "pooled", False) else {}
        at("the HF export")
        failure: BaseException | None = None
        tmp = None
        if trainer.is_global_zero:
            try:
                os.makedirs(root, exist_ok=True)
                tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root)
            except Exception as err:
                failure = err
        # where the policies go, for writers other than rank 0 (per-policy pools)
        into = trainer.strategy.broadcast(tmp) if pools and trainer.world_size > 1 else tmp
        written = 0
        try:
            for pname, policy in policies.items():
                # one policy's full weights at a time (a collective of the ranks that hold it): the
                # writer's host memory holds one model, not the team's
                writes = (pools[pname][0] if pname in pools else 0) == trainer.global_rank
                full = _full_state_dict(policy.model, keep=writes)
                if writes and into is not None and failure is None:
                    try:
                        self._write_policy(policy, full, os.path.join(into, pname))
                        written += 1
                    except Exception as err:  # a full disk: the other policies' gathers still made
                        failure = err
                del full
            if pools and trainer.world_size > 1:  # every writer's outcome before rank 0 renames
                outcomes = pl_module.gather_objects((portable(failure, trainer.global_rank), written))
                failure = failure or next((f for f, _ in outcomes if f is not None), None)
                written = sum(n for _, n in outcomes)
            if tmp is not None and failure is None:
                try:
                    replace_dir(tmp, target)
                    write_text(os.path.join(root, LATEST_FILE), name + "\n")
                    rank_zero_info(f"HFCheckpoint: saved {written} policies to {target}")
                except Exception as err:
                    failure = err
        finally:  # the temporary directory never outlives the export, however it ends
            if tmp is not None and os.path.exists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
        # rank 0's outcome, on every rank: nobody reads `latest` or moves on before rank 0 has finished
        agreed = trainer.strategy.broadcast(portable(failure, 0))
        if agreed is not None:
            raise failure if failure is not None else agreed
        self.last_saved = iteration
        self.last_saved_path = target
        return target

    def _write_policy(self, policy: Any, full: dict[str, torch.Tensor] | None, out: str) -> None:
        """The policy's writer: one policy into ``out`` (inside the export's temporary directory)."""
        kwargs: dict[str, Any] = {} if full is None else {"state_dict": full}
        if policy.adapter is not None:
            save_adapter(policy.model, policy.adapter, out, merged=self.merge_lora)
        else:
            model = policy.model
            # transformers writes only on global rank 0 once torch.distributed is up
            # (PreTrainedModel.should_save_on_this_rank); a pool's first rank writes its own policy
            model.should_save_on_this_rank = lambda is_main_process: is_main_process
            try:
                model.save_pretrained(out, **kwargs)
            finally:
                del model.should_save_on_this_rank
        if self.save_tokenizer and policy.tokenizer is not None:
            policy.tokenizer.save_pretrained(out)
