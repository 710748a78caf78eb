"""The first-minute pass: every path a run's GPUs take, exercised at start before the validation
before training and the first checkpoint (which can take hours on a GPU config), so that a defect
in the engines' build, the weight transfer, sleep and wake or the update surfaces in minutes.

On each rank, for each policy, in this order (``--model.preflight``; on by default where engines
run on GPUs):

1. the engine is built and the policy's full weights are sent once (an engine process starts with
   the checkpoint's, so without this the first transfer would come at iteration 2's sync);
2. what arrived is checked per tensor against what was sent: float64 sums and sums of squares of
   each tensor in the transfer's dtype, taken engine-side as each tensor is loaded (before the
   engine fuses q/k/v or gate/up) and trainer-side over the shards (added up over the ranks);
3. the engine's log-probs of a fixed prompt's sampled tokens against the trainer's, within the
   engine dtype's tolerance (this catches a tensor loaded into the wrong place, which step 2 cannot);
4. the engines sleep and wake as the run will (on GPUs: sleep, then a sync that wakes them and
   sends the weights again), and generate again;
5. one micro-batch of the policy runs forward and backward under the run's precision, without a
   step (gradients are dropped).

A failure ends the run on every rank in one line naming the step, the rank and the policy. The
global random generators are restored afterwards, so the pass changes no sample of the run.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from drmas.engines.base import tensor_sums
from drmas.ranks import agree
from drmas.records import GenerationSettings, MicroBatch

__all__ = ["LOGPROB_TOLERANCE", "PreflightError", "compare_sums", "run_preflight", "sent_sums"]

LOGPROB_TOLERANCE = {torch.float32: 0.02, torch.bfloat16: 0.1, torch.float16: 0.1}
"""The largest mean absolute gap (nats per token) between the engine's log-probs and the trainer's
on the fixed prompt, by the engine's dtype (the trainer computes in fp32 or under autocast).
Measured on CPU: 0.001 with a float32 engine process (tiny-random), 0.007 with a bfloat16 one
(SmolLM2-135M against bf16-mixed); weights that are not the policy's are nats apart."""

PROMPT = "The first-minute check of a weight transfer: count to ten. One, two,"
SAMPLED = GenerationSettings(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)


class PreflightError(RuntimeError):
    """A step of the first-minute pass failed; the message names the step, the rank and the policy."""


def sent_sums(model: torch.nn.Module, dtype: torch.dtype | None) -> dict[str, tuple[float, float]]:
    """:func:`~drmas.engines.base.tensor_sums` of each state-dict tensor cast to ``dtype`` (floating ones),
    as a transfer sends it; a sharded (DTensor) one summed over its local shard and added up over the
    ranks of its mesh (one all-reduce; under per-policy pools, the policy's pool), so no tensor is
    gathered."""
    from torch.distributed.tensor import DTensor

    sums, shards, group = {}, [], None
    for name, tensor in model.state_dict().items():
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if dtype is not None and local.is_floating_point():
            local = local.to(dtype)
        sums[name] = tensor_sums(local)
        if isinstance(tensor, DTensor):
            shards.append(name)
            group = tensor.device_mesh.get_group()
    if shards and torch.distributed.is_initialized():
        device = next(model.parameters()).device
        flat = torch.tensor([v for n in shards for v in sums[n]], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(flat, group=group)
        for i, name in enumerate(shards):
            sums[name] = (float(flat[2 * i]), float(flat[2 * i + 1]))
    return sums


def compare_sums(sent: dict[str, tuple[float, float]], received: dict[str, tuple[float, float]],
                 numels: dict[str, int]) -> list[str]:
    """One line per tensor that did not arrive as sent (missing, or sums apart beyond float64's
    rounding over that many elements)."""
    wrong = []
    for name, (total, squares) in sent.items():
        if name not in received:
            wrong.append(f"{name} never arrived")
            continue
        got_total, got_squares = received[name]
        scale = math.sqrt(max(squares, 0.0) * max(numels.get(name, 1), 1))  # |sum| <= this
        apart = abs(got_squares - squares) > 1e-7 * squares + 1e-12
        if apart or abs(got_total - total) > 1e-7 * scale + 1e-12:
            wrong.append(f"{name} arrived with sum {got_total:.6g} and sum of squares {got_squares:.6g}, "
                         f"sent {total:.6g} and {squares:.6g}")
    return wrong


def _fail(step: str, rank: int, policy: str, detail: str) -> PreflightError:
    return PreflightError(f"first-minute pass: {step} failed on rank {rank} for policy {policy}: {detail}")


def _batch(policy: Any, prompt: list[int], response: list[int], rows: int,
           device: torch.device) -> MicroBatch:
    ids = torch.tensor([prompt + response] * rows, device=device)
    mask = torch.zeros(rows, ids.shape[1] - 1, dtype=torch.bool, device=device)
    mask[:, len(prompt) - 1:] = True  # position t predicts token t + 1: the response's tokens
    zeros = torch.zeros(rows, ids.shape[1] - 1, device=device)
    return MicroBatch(policy.name, ids, torch.ones_like(ids), mask, zeros, torch.zeros(rows, device=device),
                      torch.arange(rows, device=device), 1.0)


def run_preflight(module: Any) -> tuple[float, float]:
    """The pass on this rank (a collective: every rank runs it), its line printed by rank 0: its wall
    time in seconds, and the part of it the engines' build took (which the first rollout's sync
    would wait for otherwise)."""
    start = time.perf_counter()
    devices = [module.device] if module.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        build = _run(module)
    seconds = time.perf_counter() - start
    if module.rank == 0:
        slept = "" if module.engines.staleness else "slept and woken, "
        print(f"first-minute pass: every engine built, its weights sent and checked tensor by tensor and by "
              f"its log-probs, {slept}one micro-batch forward and backward: ok in {seconds:.1f} s, "
              f"{build:.1f} s of it the engines' build (--model.preflight)", flush=True)
    return seconds, build


def _on_each_engine(module: Any, step: str, call: str) -> None:
    """``engine.<call>()`` on every engine of this rank; a failure, named by the step and the
    policy, agreed by every rank."""
    failure = None
    for name, engine in module.engines.built.items():
        try:
            getattr(engine, call)()
        except Exception as err:
            failure = failure or _fail(step, module.rank, name, str(err))
    agree(module.gather_objects, module.rank, failure)


def _run(module: Any) -> float:
    rank, failure = module.rank, None
    # 1. build every engine, then one full transfer per policy, each engine recording what it loads
    start = time.perf_counter()
    module.engines.build()
    build = time.perf_counter() - start
    module.engines.resend()
    _on_each_engine(module, "the engines' build", "record_transfer")
    sums = {}
    for name, policy in module.policies.items():  # trainer-side sums first: a collective over the shards
        engine = module.engines.built[name]
        sums[name] = sent_sums(policy.model, engine.transfer_dtype)
    module.sync_weights()
    # 2. each tensor as it arrived; 3. the engine's log-probs against the trainer's
    for name, policy in module.policies.items():
        engine, step = module.engines.built[name], "the weight transfer's check"
        try:
            received = engine.received_sums()
            if received is not None:
                numels = {n: t.numel() for n, t in policy.model.state_dict().items()}
                wrong = compare_sums(sums[name], received, numels)
                if wrong:
                    more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
                    raise _fail(step, rank, name, "; ".join(wrong[:3]) + more)
        except PreflightError as err:
            failure = failure or err
        except Exception as err:
            failure = failure or _fail(step, rank, name, str(err))
    agree(module.gather_objects, module.rank, failure)
    prompts = {}
    for name, policy in module.policies.items():
        prompts[name] = policy.tokenizer(PROMPT, add_special_tokens=True)["input_ids"]
    samples = _logprobs_step(module, prompts, "the engine's log-probs against the trainer's")
    # 4. sleep and wake as the run will, then generate again
    if not module.engines.staleness:  # (rollouts behind the update keep the engines awake)
        _on_each_engine(module, "the engines' sleep", "sleep")
        module.sync_weights()
        _logprobs_step(module, prompts, "generation after sleep and wake")
    # 5. one micro-batch forward and backward per trainable policy, no step
    for name, policy in module.policies.items():
        if not policy.trainable:
            continue
        prompt, response = samples[name]
        rows = policy.config.update.micro_batch_size
        batch = _batch(policy, prompt, response, rows, module.device)
        was_training = policy.training
        policy.train()
        try:
            with module.trainer.precision_plugin.forward_context():
                logp, _ = policy.token_logprobs(batch, 1.0)
            module.manual_backward(-(logp.sum() / rows))
        except Exception as err:  # inside the update's collectives: this rank ends with its line
            raise _fail("one micro-batch forward and backward", rank, name, str(err)) from err
        finally:
            policy.train(was_training)
            for p in policy.model.parameters():
                p.grad = None
    return build


def _logprobs_step(module: Any, prompts: dict[str, list[int]],
                   step: str) -> dict[str, tuple[list[int], list[int]]]:
    """Each policy's engine samples a few tokens of its fixed prompt; the trainer's log-probs of them
    must match the engine's within :data:`LOGPROB_TOLERANCE` (a collective: the forward passes of a
    sharded policy run on every rank)."""
    rank, failure, samples = module.rank, None, {}
    for name, policy in module.policies.items():
        prompt = prompts[name]
        try:
            completion = module.engines.built[name].generate([prompt], 1, SAMPLED)[0][0]
            response = list(completion.response_ids) or [prompt[-1]]
            engine_logprobs = list(completion.logprobs) or [0.0]
        except Exception as err:
            failure = failure or _fail(step, rank, name, str(err))
            response, engine_logprobs = [prompt[-1]], [0.0]
        samples[name] = (prompt, response)
        batch = _batch(policy, prompt, response, 1, module.device)
        with torch.no_grad(), module.trainer.precision_plugin.forward_context():
            logp, _ = policy.token_logprobs(batch, 1.0)
        ours = logp[0, len(prompt) - 1:].float().cpu()
        if failure is None:
            dtype = getattr(module.engines.built[name], "dtype", torch.float32)
            gap = float((ours - torch.tensor(engine_logprobs)).abs().mean())
            bound = LOGPROB_TOLERANCE.get(dtype, 0.1)
            if not gap <= bound:
                failure = _fail(step, rank, name, f"the engine's log-probs of {len(response)} sampled tokens "
                                f"are {gap:.3f} nats per token from the trainer's (at most {bound} for "
                                f"{str(dtype).removeprefix('torch.')}): its weights are not the policy's")
    agree(module.gather_objects, module.rank, failure)
    return samples
