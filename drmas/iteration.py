"""One RL iteration, top to bottom.

Lightning runs an iteration as one epoch, and each step lives with its state: the trainer's
module, the rollout side, the callbacks. This module is the one place that names the steps in
their order. :func:`prepare` (steps 1-5) is what the data module runs at an iteration's start,
the only path to a rollout; :data:`STEPS` is the whole order (Lightning calls a callback's epoch
hook before the module's, and checkpoint callbacks last), which ``tests/test_iteration.py``
checks against a real run with every step instrumented, so the list cannot drift from the code.

Iteration k, on every rank:

==  ===================  ======================================  ==========================================
 #  step                 code                                    what happens
==  ===================  ======================================  ==========================================
 1  begin                ``MultiAgentRL.begin_iteration``        k += 1; each policy's LR scheduler steps
                                                                 (from k = 2 on: see below)
 2  sync                 ``MultiAgentRL.sync_weights``           engines get the weights after update k-1
                                                                 (built at k = 1), reseeded for k
 3  rollout              ``Workflow.rollout``                    this rank's tasks, ``group_size`` each;
                                                                 gathered from every rank
 4  advantages           ``compute_advantages``                  the estimator over the whole iteration
 5  micro_batches        ``policy_micro_batches``                this rank's share, per policy and PPO
                                                                 epoch -> ``PreparedIteration``
 6  rollout_scalars      ``RolloutStats.on_train_epoch_start``   ``rollout/<agent>/...``, ``time/...``
 7  sleep                ``MultiAgentRL.on_train_epoch_start``   engines free accelerator memory
 8  update               ``MultiAgentRL.training_step``          one call per micro-batch: log-probs,
                                                                 loss, backward; a PPO epoch's last
                                                                 micro-batch clips and steps
 9  validate             ``RolloutDataModule.validate``          when k % ``validation.every`` == 0 or k
                                                                 is the last (and before k = 1)
10  export               ``HFCheckpoint.save``                   ``hf/iter_k/`` when due
11  train_scalars        ``MultiAgentRL.on_train_epoch_end``     ``train/<policy>/...``
12  checkpoint           ``IterationCheckpoint``                 ``last.ckpt``, holding all of the above
==  ===================  ======================================  ==========================================

With ``--data.rollout.staleness`` N >= 1 (docs/async.md) the same steps run in the same order, but
step 2 only moves the weights (each rollout reseeds the engines itself), step 3 starts the rollout
of k+N in a background thread and takes k's own, played during update k-1
(:class:`~drmas.data.background.Pipeline`), step 7 leaves the engines awake, and before step 9 the
data module drains the pipeline (waits for the rollout of k+N), so validation, the export and the
checkpoint find the engines idle and the checkpoint holds the rollouts played ahead.

Why the LR schedulers step at the start (1) and not after the update (8): the checkpoint written
at the end of iteration k (12) then holds the schedule of the iteration it finished, and a run
resumed from it steps it once at the start of k+1, exactly as the uninterrupted run does
(``tests/recipes/test_resume.py`` holds with a warm-up and a cosine schedule).
"""

from __future__ import annotations

from typing import Any

from drmas.records import PreparedIteration

__all__ = ["STEPS", "prepare"]

STEPS = ("begin", "sync", "rollout", "advantages", "micro_batches", "rollout_scalars", "sleep",
         "update", "validate", "export", "train_scalars", "checkpoint")
"""The steps of one iteration, in order (the table above)."""


def prepare(backend: Any, rollouts: Any) -> PreparedIteration:
    """Steps 1-5: begin iteration k on ``backend`` (a ``RolloutBackend``), then let ``rollouts``
    (:class:`~drmas.data.rollouts.Rollouts`) sync, play, score and pack it."""
    k = backend.begin_iteration()
    return rollouts.prepare(backend, k)
