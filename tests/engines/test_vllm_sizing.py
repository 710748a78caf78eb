"""A vLLM engine's start-up on a GPU, by vLLM 0.32's rules, from the models' shapes alone (their
config.json, shipped in tests/data/model_configs: Llama-3.2 is gated and tests have no network):
hand numbers for the 3B, 7B and 8B shapes, the KV cache per sequence against vLLM's own
``FullAttentionSpec`` and its refusal (``kv_cache_utils``), and the settings the refusal names
really letting the engine start."""

import os
from types import SimpleNamespace

import pytest
import torch

from drmas.engines.vllm.sizing import batch_defaults, engine_budget, sequence_bytes
from drmas.models.shapes import config_shape

GIB = 1024**3
H100 = int(79.2 * GIB)
CONFIGS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "model_configs")


@pytest.fixture(scope="module")
def shapes():
    return {key: config_shape(os.path.join(CONFIGS, path)) for key, path in
            [("3b", "meta-llama/Llama-3.2-3B-Instruct"), ("7b", "Qwen/Qwen2.5-7B-Instruct"),
             ("8b", "Qwen/Qwen3-8B")]}


def test_the_shapes_read_from_config_json_alone(shapes):
    # the published parameter counts (tied embeddings for Llama-3.2-3B, untied for the Qwen models)
    assert {k: s.parameters for k, s in shapes.items()} == {"3b": 3_212_749_824, "7b": 7_615_616_512,
                                                           "8b": 8_190_735_360}
    assert shapes["3b"].largest == 128256 * 3072 and shapes["3b"].root == 128256 * 3072 + 3072
    assert shapes["7b"].root == 2 * 152064 * 3584 + 3584  # embeddings, head and final norm
    # key + value, every layer, bf16: 28 x 8 heads x 128, 28 x 4 x 128, 36 x 8 x 128
    assert [s.kv_bytes_per_token(2) for s in shapes.values()] == [2 * 28 * 8 * 128 * 2, 2 * 28 * 4 * 128 * 2,
                                                                  2 * 36 * 8 * 128 * 2]


def test_the_kv_cache_of_one_sequence_is_vllms_own(shapes):
    from vllm.v1.core.kv_cache_utils import _check_enough_kv_cache_memory
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    cases = [(shapes["3b"], 8192), (shapes["7b"], 8192), (shapes["8b"], 12288), (shapes["8b"], 1000)]
    for shape, length in cases:
        spec = FullAttentionSpec(block_size=16, num_kv_heads=shape.kv_heads, head_size=shape.head_dim,
                                 dtype=torch.bfloat16)
        config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=length),
                                 parallel_config=SimpleNamespace(decode_context_parallel_size=1))
        assert sequence_bytes(shape, length, 2) == shape.layers * spec.max_memory_usage_bytes(config)
    # hand numbers: 0.875 GiB for Llama-3B at 8,192 tokens, 1.125 GiB for Qwen3-8B
    assert sequence_bytes(shapes["3b"], 8192, 2) == 0.875 * GIB
    assert sequence_bytes(shapes["8b"], 8192, 2) == 1.125 * GIB
    assert sequence_bytes(shapes["8b"], 1000, 2) == 1008 * 147456  # whole blocks of 16 tokens
    # vLLM refuses an engine whose KV cache is one byte short of a sequence, and takes it at one
    need = sequence_bytes(shapes["3b"], 8192, 2)
    with pytest.raises(ValueError, match=r"To serve at least one request with the model's max seq len"):
        _check_enough_kv_cache_memory(need - 1, lambda: need, 8192, lambda available: 0)
    _check_enough_kv_cache_memory(need, lambda: need, 8192, lambda available: 0)


def test_vllms_batch_defaults_by_gpu():
    assert batch_defaults(H100, "NVIDIA H100 80GB HBM3") == (16384, 1024)
    assert batch_defaults(H100, "NVIDIA A100-SXM4-80GB") == (8192, 256)  # A100s keep the smaller ones
    assert batch_defaults(int(139.8 * GIB), "NVIDIA H200") == (16384, 1024)
    assert batch_defaults(40 * GIB, "NVIDIA A100-SXM4-40GB") == (8192, 256)


def test_the_llama_3b_engine_as_shipped_before_cannot_start_and_the_fixes_named_can(shapes):
    # llama3b_qwen7b.yaml's 0.12 of an H100, with vLLM's 1,024 sequences (drmas left them to vLLM)
    b = engine_budget("verifier", shapes["3b"], 0.12, H100, 2, 8192, eager=False)
    assert b.weights == 3_212_749_824 * 2
    assert b.activations == 16384 * (3 * 8192 + 4 * 3072) * 2
    assert b.sampler == 1024 * 128256 * (2 + 16)  # bf16 logits and four fp32 copies
    assert b.graphs == GIB / 2
    assert b.kv == pytest.approx(0.12 * H100 - b.weights - b.activations - b.sampler - b.graphs)
    assert b.kv < b.per_sequence and not b.fits
    refusal = b.refusal()
    assert refusal.startswith("the vLLM engine of verifier cannot start: of its 0.12 x 79.2 GiB, weights "
                              "5.98 + profiling peak 3.33 (1024 sequences, 16384 tokens) + CUDA graphs 0.50 "
                              "leave -0.31 GiB of KV cache, less than the 0.875 GiB of one sequence of 8192")
    assert ("give it fewer sequences per step (engine_settings: {llm_args: {max_num_seqs: 474}} or fewer), "
            "or a larger fraction (engine_settings: {gpu_memory_utilization: 0.14} or more)") in refusal
    # each fix named really leaves a sequence, and one sequence more than it names does not
    assert engine_budget("verifier", shapes["3b"], 0.12, H100, 2, 8192, False, max_num_seqs=474).fits
    assert not engine_budget("verifier", shapes["3b"], 0.12, H100, 2, 8192, False, max_num_seqs=475).fits
    assert engine_budget("verifier", shapes["3b"], 0.14, H100, 2, 8192, False).fits
    # as shipped now: 0.15, and the 40 sequences a search rollout sends it at once (8 tasks x 5)
    now = engine_budget("verifier", shapes["3b"], 0.15, H100, 2, 8192, False, max_num_seqs=40)
    assert now.sampler == 40 * 128256 * 18 and now.sequences == pytest.approx(4.78, abs=0.01)
    # eager: no graph reserve
    assert engine_budget("verifier", shapes["3b"], 0.15, H100, 2, 8192, True, max_num_seqs=40).graphs == 0


def test_qwen3_8b_at_the_shipped_fraction_holds_a_few_sequences(shapes):
    # qwen3_8b.yaml: 0.3 of an H100; the search recipe sends 8 tasks x 5 x 3 agents = 120 at once
    vllms = engine_budget("shared", shapes["8b"], 0.3, H100, 2, 8192, False)
    ours = engine_budget("shared", shapes["8b"], 0.3, H100, 2, 8192, False, max_num_seqs=120)
    assert vllms.sequences == pytest.approx(3.35, abs=0.01)
    assert ours.sequences == pytest.approx(5.39, abs=0.01)
    # Qwen2.5-7B at 0.25: four KV heads make its sequences small
    qwen7 = engine_budget("answerer", shapes["7b"], 0.25, H100, 2, 8192, False, max_num_seqs=40)
    assert qwen7.per_sequence == 0.4375 * GIB and qwen7.sequences == pytest.approx(6.50, abs=0.01)


def test_the_gpu_a_plan_is_made_for_is_named_by_kind_or_size():
    from drmas.modules.plan_preview import parse_device

    assert parse_device("H100") == (int(79.2 * GIB), "NVIDIA H100 80GB HBM3")
    assert parse_device("141") == (141 * GIB, "a GPU of 141 GiB")
    with pytest.raises(ValueError, match=r"takes h100, h200, a100, cuda or a size in GiB, got 'b200'"):
        parse_device("b200")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"--print_memory_plan cuda: this machine has no GPU"):
            parse_device("cuda")
