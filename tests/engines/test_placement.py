"""Where each rank's engine process goes and what it is built with (pure arguments: no GPU or
vLLM needed): the trainer's own GPU whatever the device list says, the rank's share of the cores,
and sleep mode (CuMem) only on GPUs, in a process that holds no other engine."""

import pytest
import torch

from drmas.engines.vllm_settings import engine_process_env, llm_kwargs, rank_cores


def test_the_engine_process_sees_only_the_trainers_gpu():
    # --trainer.devices [3] on one rank: the engine sees GPU 3 alone (its cuda:0), not the first GPU
    assert engine_process_env(torch.device("cuda", 3), [0], visible="")["CUDA_VISIBLE_DEVICES"] == "3"
    # under CUDA_VISIBLE_DEVICES the trainer's index is mapped to the physical id
    assert engine_process_env(torch.device("cuda", 1), [0], visible="4,6")["CUDA_VISIBLE_DEVICES"] == "6"
    with pytest.raises(ValueError, match=r"runs on cuda:2 but CUDA_VISIBLE_DEVICES='4,6' shows 2 GPU"):
        engine_process_env(torch.device("cuda", 2), [0], visible="4,6")
    cpu = engine_process_env(torch.device("cpu"), [2, 3])
    assert cpu["VLLM_CPU_OMP_THREADS_BIND"] == "2,3" and "CUDA_VISIBLE_DEVICES" not in cpu
    assert cpu["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the worker in the engine's own process


def test_each_rank_gets_its_share_of_the_cores():
    assert rank_cores(0, 1, allowed=[0, 1], machine=2) == [0, 1]
    assert [rank_cores(r, 2, allowed=[0, 1], machine=2) for r in (0, 1)] == [[0], [1]]
    assert [rank_cores(r, 2, allowed=range(8), machine=8) for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [rank_cores(r, 4, allowed=[0, 1], machine=2) for r in range(4)] == [[0], [1], [0], [1]]
    # a launcher already bound this rank to fewer cores than the machine has: those, all of them
    assert rank_cores(1, 2, allowed=[6, 7], machine=8) == [6, 7]


def test_sleep_mode_and_its_allocator_only_on_gpus_and_the_transfer_each_side_uses():
    gpu = llm_kwargs("m", "bfloat16", 512, 0, True, 0.4, 1.0)
    assert gpu["enable_sleep_mode"] is True and gpu["gpu_memory_utilization"] == 0.4
    assert gpu["weight_transfer_config"] == {"backend": "ipc"} and "kv_cache_memory_bytes" not in gpu
    cpu = llm_kwargs("m", "float32", 512, 0, False, 0.4, 0.25, max_loras=2, max_lora_rank=8)
    assert "enable_sleep_mode" not in cpu and "enable_cumem_allocator" not in cpu
    assert cpu["kv_cache_memory_bytes"] == 2**28 and cpu["weight_transfer_config"] == {"backend": "drmas_shm"}
    assert (cpu["enable_lora"], cpu["max_loras"], cpu["max_lora_rank"]) == (True, 2, 8)
    assert cpu["logprobs_mode"] == "processed_logprobs"
    assert llm_kwargs("m", "float32", 512, 0, False, 0.4, 0.25, max_num_seqs=4)["max_num_seqs"] == 4
