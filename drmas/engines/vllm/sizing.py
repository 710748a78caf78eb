"""What a vLLM engine on a GPU takes at start-up, by vLLM 0.32's own rules, and the KV cache left to
it: the arithmetic behind the memory plan's engine lines and its refusal of an engine that vLLM
would refuse to start. Pure Python (no vLLM, no GPU): the model's shape and the settings suffice.

vLLM builds an engine in ``gpu_memory_utilization x`` the GPU's memory (``gpu_worker.
determine_available_memory``): the weights, then a profiling forward pass of
``max_num_batched_tokens`` tokens and a sampler pass over ``max_num_seqs`` rows of the vocabulary's
logits, then (CUDA graphs on) an estimate of the graphs' memory; what is left is the KV cache,
and ``kv_cache_utils.check_enough_kv_cache_memory`` refuses the engine when it cannot hold one
sequence of ``max_model_len``. The weights and the KV cache per sequence are exact (the KV cache's
blocks of 16 tokens, as ``FullAttentionSpec.max_memory_usage_bytes``); the activation, sampler and
graph terms are estimates, named so wherever they are printed.
"""

from __future__ import annotations

from dataclasses import dataclass

from drmas.models.shapes import ModelShape

__all__ = ["BLOCK_TOKENS", "CUDA_GRAPH_BYTES", "EngineBudget", "batch_defaults", "engine_budget",
           "sequence_bytes"]

GIB = 1024**3
BLOCK_TOKENS = 16
"""Tokens per KV-cache block (vLLM's default ``block_size`` on CUDA)."""
CUDA_GRAPH_BYTES = GIB // 2
"""The CUDA graphs' memory vLLM reserves unless eager (``profile_cudagraph_memory``): an estimate."""
SAMPLER_COPIES = 4
"""fp32 copies of the ``max_num_seqs x vocabulary`` logits the sampler holds at once with
``logprobs_mode=processed_logprobs`` (native top-k/top-p: the fp32 logits, their log-softmax, the
probabilities and the exponential draws), beside the model's own logits in its dtype: an estimate."""


def batch_defaults(device_bytes: int, device_name: str = "") -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` vLLM 0.32's ``LLM`` takes when none is given
    (``EngineArgs.get_batch_defaults``): 16,384 and 1,024 on a GPU of 70 GiB or more that is no A100,
    else 8,192 and 256."""
    if device_bytes >= 160 * GIB or (device_bytes >= 70 * GIB and "a100" not in device_name.lower()):
        return 16384, 1024
    return 8192, 256


def sequence_bytes(shape: ModelShape, max_model_len: int, element_bytes: int) -> int:
    """The KV cache one sequence of ``max_model_len`` tokens takes, in whole blocks."""
    blocks = -(-max_model_len // BLOCK_TOKENS)
    return blocks * BLOCK_TOKENS * shape.kv_bytes_per_token(element_bytes)


@dataclass(frozen=True)
class EngineBudget:
    """One engine's start-up on its GPU, in bytes (see the module docstring for what is exact)."""

    name: str
    fraction: float
    device_bytes: int
    weights: float
    activations: float
    """The profiling forward's transient peak, ``max_num_batched_tokens`` tokens (an estimate)."""
    sampler: float
    """The profiling sampler pass, ``max_num_seqs`` rows of logits (an estimate)."""
    graphs: float
    kv: float
    per_sequence: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int

    @property
    def requested(self) -> float:
        return self.fraction * self.device_bytes

    @property
    def sequences(self) -> float:
        """How many sequences of ``max_model_len`` the KV cache holds."""
        return self.kv / self.per_sequence

    @property
    def fits(self) -> bool:
        return self.sequences >= 1

    def line(self) -> str:
        """The plan's line for this engine."""
        g = GIB
        graphs = f" + CUDA graphs {self.graphs / g:.2f}" if self.graphs else " (eager: no CUDA graphs)"
        return (f"engine {self.name}: {self.fraction:g} x {self.device_bytes / g:.1f} = "
                f"{self.requested / g:.2f} GiB = weights {self.weights / g:.2f} + profiling peak "
                f"{self.profiling / g:.2f} "
                f"(activations {self.activations / g:.2f} for {self.max_num_batched_tokens} tokens, sampler "
                f"{self.sampler / g:.2f} for {self.max_num_seqs} sequences; estimates){graphs} + KV cache "
                f"{self.kv / g:.2f} = {self.sequences:.1f} sequences of {self.max_model_len} tokens "
                f"({self.per_sequence / g:.3f} GiB each)")

    @property
    def profiling(self) -> float:
        return self.activations + self.sampler

    def refusal(self) -> str:
        """Why vLLM would refuse this engine, and the settings that would let it start."""
        other = self.weights + self.activations + self.graphs
        fraction = (other + self.sampler + self.per_sequence) / self.device_bytes
        # the largest max_num_seqs whose sampler pass leaves one sequence at this fraction
        per_row = self.sampler / self.max_num_seqs
        rows = int((self.requested - other - self.per_sequence) // per_row) if per_row else 0
        fixes = [f"a larger fraction (engine_settings: {{gpu_memory_utilization: {fraction + 0.005:.2f}}} "
                 "or more)"]
        if 1 <= rows < self.max_num_seqs:
            fixes.insert(0, "fewer sequences per step (engine_settings: {llm_args: {max_num_seqs: "
                            f"{rows}}}}} or fewer)")
        fixes.append("a shorter max_model_len")
        return (f"the vLLM engine of {self.name} cannot start: of its {self.fraction:g} x "
                f"{self.device_bytes / GIB:.1f} GiB, weights {self.weights / GIB:.2f} + profiling peak "
                f"{self.profiling / GIB:.2f} ({self.max_num_seqs} sequences, {self.max_num_batched_tokens} "
                f"tokens) + CUDA graphs {self.graphs / GIB:.2f} leave {self.kv / GIB:.2f} GiB of KV cache, "
                f"less than the {self.per_sequence / GIB:.3f} GiB of one sequence of {self.max_model_len} "
                "tokens (vLLM refuses to start so); give it " + ", or ".join(fixes))


def engine_budget(name: str, shape: ModelShape, fraction: float, device_bytes: int, element_bytes: int,
                  max_model_len: int, eager: bool, max_num_seqs: int | None = None,
                  max_num_batched_tokens: int | None = None, device_name: str = "") -> EngineBudget:
    """One engine's :class:`EngineBudget`: ``element_bytes`` of its dtype; ``max_num_seqs`` and
    ``max_num_batched_tokens`` as set (None: vLLM's defaults for the device, :func:`batch_defaults`;
    the tokens are never fewer than ``max_model_len`` without chunked prefill, which vLLM turns on
    by default, so they stay as set)."""
    tokens, seqs = batch_defaults(device_bytes, device_name)
    tokens = max_num_batched_tokens or tokens
    seqs = max_num_seqs or seqs
    weights = float(shape.parameters * element_bytes)
    # the forward's largest transient per token: the fused gate/up output and its activation (three
    # intermediate widths) and a few hidden-sized buffers (residual, normed input, attention output)
    activations = float(tokens * (3 * shape.intermediate_size + 4 * shape.hidden_size) * element_bytes)
    sampler = float(seqs * shape.vocab_size * (element_bytes + 4 * SAMPLER_COPIES))
    graphs = 0.0 if eager else float(CUDA_GRAPH_BYTES)
    kv = fraction * device_bytes - weights - activations - sampler - graphs
    per_sequence = float(sequence_bytes(shape, max_model_len, element_bytes))
    return EngineBudget(name, fraction, device_bytes, weights, activations, sampler, graphs, kv, per_sequence,
                        max_model_len, seqs, tokens)
