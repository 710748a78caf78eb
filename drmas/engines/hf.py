"""Rollouts with transformers ``generate`` on the training model itself.

No second copy of the weights exists, so there is nothing to synchronise and the engine
runs anywhere the model runs (a sharded model is the exception: the engine then keeps an
unsharded copy, see ``copy_weights``). It is the reference the vLLM engine is tested against.

Log-probs are ``log_softmax(logits / T)`` of the raw logits at each sampled token (raw
logits when ``T == 0``): the quantity the trainer recomputes, so the PPO ratio starts at 1.
They are read from the logits ``generate`` already computes (no second forward pass):
a logits processor placed *before* the sampling warpers records them, and a stopping
criterion picks the sampled token's entry after each step. Top-k / top-p truncation is
deliberately not reflected in them (the trainer does not truncate either); note that the
vLLM engine's log-probs *do* include the truncation.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from drmas.engines.sizing import EngineSizing
from drmas.engines.base import (ENGINES, Engine, Placement, check_request,
                                FullState, per_prompt, tensor_sums)
from drmas.models import load_causal_lm
from drmas.models.lora import activate
from drmas.records import Completion, GenerationSettings

__all__ = ["HFEngine"]


class _StepTracker:
    """Per-row state of one ``generate`` call: log-probs, where each row ended, and why."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_len: int,
        batch: int,
        temperature: float,
        eos_ids: set[int],
        stops: Sequence[Sequence[str]],
        limits: Sequence[int],
        device: torch.device,
    ) -> None:
        self.tokenizer = tokenizer
        self.prompt_len = prompt_len
        self.temperature = temperature
        self.eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
        self.stops = [[s for s in stop if s] for stop in stops]  # each row's own
        self.any_stop = any(self.stops)
        # Enough trailing tokens to contain the longest stop string even if each token is one
        # character, plus slack for tokens that decode to nothing (skipped special tokens).
        self.windows = [max((len(s) for s in stop), default=0) + 4 for stop in self.stops]
        self.limits = torch.tensor(list(limits), dtype=torch.long, device=device)
        self.last_logprobs: torch.Tensor | None = None
        self.step_logprobs: list[torch.Tensor] = []
        self.length = torch.full((batch,), -1, dtype=torch.long, device=device)  # -1: still running
        self.capped = torch.zeros(batch, dtype=torch.bool, device=device)  # ended by its own length budget

    def record(self, scores: torch.Tensor) -> None:
        scores = scores.float()
        if self.temperature > 0:
            scores = scores / self.temperature
        self.last_logprobs = torch.log_softmax(scores, dim=-1)

    def after_step(self, input_ids: torch.Tensor) -> torch.Tensor:
        assert self.last_logprobs is not None, "the recorder did not run before the stopping criterion"
        new = input_ids[:, -1]
        self.step_logprobs.append(self.last_logprobs.gather(1, new[:, None])[:, 0])
        step = input_ids.shape[1] - self.prompt_len  # tokens generated so far, this one included
        running = self.length < 0
        ended = running & torch.isin(new, self.eos)
        if self.any_stop:
            for row in torch.nonzero(running & ~ended).flatten().tolist():
                if self.stops[row]:
                    tail = input_ids[row, max(self.prompt_len, input_ids.shape[1] - self.windows[row]) :]
                    text = self.tokenizer.decode(tail, skip_special_tokens=True)
                    if any(s in text for s in self.stops[row]):
                        ended[row] = True
        capped = running & ~ended & (step >= self.limits)  # a shorter budget than the call's
        self.capped |= capped
        self.length[ended | capped] = step
        return self.length >= 0


class _Recorder(LogitsProcessor):
    def __init__(self, tracker: _StepTracker) -> None:
        self.tracker = tracker

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.tracker.record(scores)
        return scores


class _StopTracker(StoppingCriteria):
    def __init__(self, tracker: _StepTracker) -> None:
        self.tracker = tracker

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any
    ) -> torch.BoolTensor:
        return self.tracker.after_step(input_ids)


class HFSizing(EngineSizing):
    """The HF engine generates with the trainer's own model, but keeps a copy of its own where that
    model is sharded (``copy_weights``)."""

    @classmethod
    def keeps_copy(cls, sharded: bool) -> bool:
        return sharded


@ENGINES.register("hf")
class HFEngine(Engine):
    """Batched ``model.generate`` with left padding; all ``prompts x n`` rows in one call.

    ``max_batch_size`` caps the rows per ``generate`` call (None: no cap). Sampling uses
    torch's global RNG, so it is reproducible under ``torch.manual_seed``. Generation
    settings stored on the model (``model.generation_config``) other than the ones set
    from :class:`GenerationSettings` still apply, as with a plain ``generate`` call.

    ``copy_weights``: ``model`` is the engine's own copy, and :meth:`sync_weights` copies the
    trained model's weights into it (needed when the trained model is sharded) instead of
    generating with the trained model object itself.

    ``share_prefill``: a prompt asked for ``n`` samples (or repeated in one call) is prefilled
    once and its KV cache repeated for its rows, instead of once per row; the samples are the
    same (same logits, same random draws).
    """

    sizing = HFSizing

    def __init__(self, model: torch.nn.Module, tokenizer: Any, max_batch_size: int | None = None,
                 copy_weights: bool = False, share_prefill: bool = True, adapter: str | None = None) -> None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.copy_weights = copy_weights
        self.share_prefill = share_prefill
        self.adapter = adapter  # a LoRA adapter of a (possibly shared) peft model to generate with
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError("the tokenizer has neither a pad token nor an EOS token to pad with")
        self.pad_id = int(pad)

    auto_preference = 0  # runs anywhere: ``auto``'s choice where no faster engine is available

    @classmethod
    def create(cls, policy: Any, settings: Any, place: Placement, pool: dict[str, Any],
               team: dict[str, Any]) -> tuple[Engine, bool]:
        """The trained model itself. A sharded one cannot generate (each rank decodes a different
        number of steps, which the shards' collectives cannot follow), so the engine then keeps an
        unsharded copy that ``sync_weights`` fills tensor by tensor. A trained policy whose rollouts
        play while the trainer updates it (``place.overlapped``), and every policy's on a GPU of the
        engines' own (``place.split``) or asked by other ranks (``place.reached``), is served by an HF
        engine in a process of its own
        (:class:`~drmas.engines.hf_process.HFProcessEngine`)."""
        # a frozen policy's tensors never change: it plays behind the update with them
        apart = place.split or place.reached or (place.overlapped and policy.trainable)
        if apart and policy.adapter is not None:
            raise ValueError(f"policy {policy.name!r} trains a LoRA adapter, which the hf engine generates "
                             f"with on the trained model itself: with rollouts behind the update "
                             f"(--data.rollout.staleness), engines on a GPU of their own "
                             f"(--model.engine_placement split) or per-policy pools use --model.engine vllm")
        if apart:  # in a process of its own, on cores (and maybe a GPU) of its own (docs/async.md)
            from drmas.engines.hf_process import HFProcessEngine
            from drmas.engines.placement import local_ranks, rank_cores

            cores = place.cpus or rank_cores(place.local_rank, local_ranks(place.world_size))
            return HFProcessEngine(policy, cores, place.engines_on), False
        if not place.sharded:
            return cls(policy.model, policy.tokenizer, adapter=policy.adapter), True
        model = load_causal_lm(policy.config.model, dtype=policy.config.dtype)[0]
        return cls(model.to(place.device).eval().requires_grad_(False), policy.tokenizer,
                   copy_weights=True), False

    @classmethod
    def own_process(cls, overlapped: bool) -> bool:
        return overlapped

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        config_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        for value in (config_eos, self.tokenizer.eos_token_id):
            if value is None:
                continue
            ids.update([value] if isinstance(value, int) else value)
        return ids

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, params: GenerationSettings,
        stops: Sequence[Sequence[str]] | None = None, max_new_tokens: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        check_request(prompts, n, params)
        if not prompts:
            return []
        stops, budgets = per_prompt(prompts, params, stops, max_new_tokens)
        if self.adapter is not None:
            activate(self.model, self.adapter)
        rows = [(list(p), stop, budget) for p, stop, budget in zip(prompts, stops, budgets) for _ in range(n)]
        size = self.max_batch_size or len(rows)
        out: list[Completion] = []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(rows), size):
                    out.extend(self._generate_rows(rows[start : start + size], params))
        finally:
            self.model.train(was_training)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the KV cache of generate is not needed by the update
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _generate_rows(self, requests: list[tuple[list[int], list[str], int]],
                       params: GenerationSettings) -> list[Completion]:
        """``(prompt, stop strings, length budget)`` rows in one ``generate`` call."""
        rows, stops, limits = ([r for r, _, _ in requests], [s for _, s, _ in requests],
                               [m for _, _, m in requests])
        device = next(self.model.parameters()).device
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            attention_mask[i, width - len(r) :] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)

        greedy = params.temperature == 0
        eos_ids = self._eos_ids()
        tracker = _StepTracker(self.tokenizer, width, len(rows), params.temperature, eos_ids, stops, limits,
                               device)
        # The recorder must see the raw logits, but generate appends custom processors after
        # its own warpers. So generate's warpers are switched off and ours follow the recorder.
        processors: list[LogitsProcessor] = [_Recorder(tracker)]
        if not greedy:
            if params.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                processors.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                processors.append(TopPLogitsWarper(params.top_p))
        # Neutral values only when sampling: generate warns about sampling flags in greedy mode.
        sampling_off = {} if greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
        cache = self._shared_prefill(rows, input_ids, attention_mask) if self.share_prefill else None
        sequences = self.model.generate(
            input_ids=input_ids,
            **({} if cache is None else {"past_key_values": cache}),
            attention_mask=attention_mask,
            do_sample=not greedy,
            **sampling_off,
            repetition_penalty=1.0,
            max_new_tokens=max(limits),
            eos_token_id=sorted(eos_ids) or None,
            pad_token_id=self.pad_id,
            logits_processor=LogitsProcessorList(processors),
            stopping_criteria=StoppingCriteriaList([_StopTracker(tracker)]),
        )
        generated = sequences[:, width:].cpu()
        logprobs = torch.stack(tracker.step_logprobs, dim=1).cpu() if tracker.step_logprobs else None
        lengths, capped = tracker.length.cpu().tolist(), tracker.capped.cpu().tolist()
        results = []
        for i in range(len(rows)):
            stopped = lengths[i] >= 0 and not capped[i]
            length = lengths[i] if lengths[i] >= 0 else generated.shape[1]
            token_ids = generated[i, :length].tolist()
            # An EOS id need not be a special token (generation_config may list any id): keep
            # it out of the text explicitly.
            ended_by_eos = stopped and token_ids[-1] in eos_ids
            shown = token_ids[:-1] if ended_by_eos else token_ids
            text = self.tokenizer.decode(shown, skip_special_tokens=True)
            if stopped and not ended_by_eos:
                text = cut_after_stop(text, stops[i])
            results.append(
                Completion(
                    prompt_ids=rows[i],
                    response_ids=token_ids,
                    logprobs=logprobs[i, :length].tolist() if logprobs is not None else [],
                    text=text,
                    finish_reason="stop" if stopped else "length",
                )
            )
        return results

    def _shared_prefill(self, rows: list[list[int]], input_ids: torch.Tensor,
                        attention_mask: torch.Tensor) -> Any:
        """The KV cache of every distinct prompt but its last token, computed once and repeated
        for each row that asks it; ``generate`` then starts from it. None when no prompt repeats
        (or the model keeps no cache): ``generate`` prefills as usual."""
        first: dict[tuple[int, ...], int] = {}
        owner = [first.setdefault(tuple(r), i) for i, r in enumerate(rows)]
        if len(first) == len(rows) or input_ids.shape[1] < 2:
            return None
        distinct = sorted(first.values())
        slot = {row: k for k, row in enumerate(distinct)}
        ids, mask = input_ids[distinct, :-1], attention_mask[distinct, :-1]
        # the positions generate gives left-padded rows: counted from each row's first real token
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                           use_cache=True).past_key_values
        if cache is None or not hasattr(cache, "batch_select_indices"):
            return None
        cache.batch_select_indices(torch.tensor([slot[o] for o in owner], device=input_ids.device))
        return cache

    def received_sums(self) -> dict[str, tuple[float, float]] | None:
        """The sums of the engine's own copy (None without one: it generates with the trained model)."""
        if not self.copy_weights:
            return None
        return {name: tensor_sums(t) for name, t in self.model.state_dict().items()}

    def sync_weights(self, weights: FullState) -> None:
        """Without ``copy_weights`` nothing is copied: the engine generates with the model object
        it was given, and a different object replaces the one used so far. With it, the model's
        weights are copied into the engine's model tensor by tensor (gathered from the shards)."""
        if not self.copy_weights:
            self.model = weights.model
            return
        own = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in weights:
                own[name].copy_(tensor)


def cut_after_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to and including the earliest stop string (unchanged when none occurs)."""
    ends = [text.find(s) + len(s) for s in stop if s and s in text]
    return text[: min(ends)] if ends else text
