"""Where each rank's engine goes: vLLM's external launcher on several GPU ranks, and a placement
it would not follow refused (pure arguments: no GPU or vLLM needed)."""

import pytest
import torch


def test_each_ranks_vllm_engine_takes_its_own_gpu_through_the_external_launcher():
    from drmas.engines.vllm_settings import launcher_env, launcher_kwargs

    # several GPU ranks: vLLM's documented executor for torchrun-style launchers, one TP group per rank
    assert launcher_kwargs(8, on_gpu=True) == {"distributed_executor_backend": "external_launcher",
                                               "tensor_parallel_size": 1}
    assert launcher_env(5, 1, 8, on_gpu=True) == {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}
    # one rank, or CPU ranks (each engine in its own process's memory): vLLM's default executor
    assert launcher_kwargs(1, on_gpu=True) == launcher_kwargs(2, on_gpu=False) == {}
    assert launcher_env(1, 1, 2, on_gpu=False) == {}


def test_a_gpu_list_that_vllm_would_not_follow_is_refused():
    from drmas.engines import Placement, VLLMSettings, VLLMEngine

    place = Placement(rank=1, local_rank=1, world_size=2, device=torch.device("cuda", 5))
    with pytest.raises(ValueError, match=r"rank 1 trains on cuda:5 but its vLLM engine would take cuda:1"):
        VLLMEngine.create(None, VLLMSettings(), place, {}, {})
    one = Placement(device=torch.device("cuda", 3))  # --trainer.devices [3] on one rank
    with pytest.raises(ValueError, match=r"this run trains on cuda:3 but its vLLM engine would take cuda:0 .*"
                                         r"CUDA_VISIBLE_DEVICES=3 and --trainer.devices 1"):
        VLLMEngine.check_placement(one)
    VLLMEngine.check_placement(Placement(device=torch.device("cuda", 0)))  # the first GPU: where it lands
    VLLMEngine.check_placement(Placement(device=torch.device("cpu")))
