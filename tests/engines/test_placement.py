"""Where each rank's engine process goes and what it is built with (pure arguments: no GPU or
vLLM needed): the trainer's own GPU whatever the device list says, the rank's share of the cores,
and sleep mode (CuMem) only on GPUs, in a process that holds no other engine."""

import os

import pytest
import torch

from drmas.engines.placement import device_env, local_ranks, rank_cores, slurm_node_tasks
from drmas.engines.vllm.settings import VLLMSettings, engine_process_env, llm_kwargs


class Devices:
    """CUDA's device list as a process sees it: its order is fixed when CUDA starts (the first
    call), from CUDA_DEVICE_ORDER then; a later change of the variable (Lightning's) moves nothing."""

    # two GPUs whose orders differ: the faster one sits second on the PCI bus
    PCI = ["GPU-aaaa", "GPU-bbbb"]
    FASTEST_FIRST = ["GPU-bbbb", "GPU-aaaa"]

    order = None

    def uuid_of(self, index):
        if self.order is None:
            pci = os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
            self.order = self.PCI if pci else self.FASTEST_FIRST
        return self.order[index]


@pytest.mark.parametrize("started, later", [(None, "PCI_BUS_ID"), ("PCI_BUS_ID", None)])
def test_the_engine_process_sees_the_trainers_gpu_by_uuid_in_either_device_order(monkeypatch, started, later):
    def order(value):
        if value is None:
            monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
        else:
            monkeypatch.setenv("CUDA_DEVICE_ORDER", value)

    devices = Devices()
    order(started)
    trainer_gpu = devices.uuid_of(1)  # CUDA starts in the trainer: its cuda:1
    order(later)  # then the variable changes, as Lightning changes it
    env = engine_process_env(torch.device("cuda", 1), [0], visible="", uuid_of=devices.uuid_of)
    # the engine is named the trainer's own GPU, which an index would not do in the child's order
    assert env["CUDA_VISIBLE_DEVICES"] == trainer_gpu
    child_order = Devices.PCI if later == "PCI_BUS_ID" else Devices.FASTEST_FIRST
    assert child_order[1] != trainer_gpu  # what "1" would have named in the engine process
    # under CUDA_VISIBLE_DEVICES of indices, the trainer's index is still its own CUDA's
    assert engine_process_env(torch.device("cuda", 1), [0], visible="4,6",
                              uuid_of=devices.uuid_of)["CUDA_VISIBLE_DEVICES"] == trainer_gpu


def test_uuids_the_trainer_was_given_pass_on_and_a_gpu_it_cannot_see_is_refused():
    def unused(index):
        raise AssertionError("a UUID given in CUDA_VISIBLE_DEVICES is passed on as it is")

    given = "GPU-1111,MIG-2222"
    assert device_env(torch.device("cuda", 1), given, unused) == {"CUDA_VISIBLE_DEVICES": "MIG-2222"}
    with pytest.raises(ValueError, match=r"runs on cuda:2 but CUDA_VISIBLE_DEVICES='4,6' shows 2 GPU"):
        engine_process_env(torch.device("cuda", 2), [0], visible="4,6", uuid_of=unused)
    cpu = engine_process_env(torch.device("cpu"), [2, 3])
    assert cpu["VLLM_CPU_OMP_THREADS_BIND"] == "2,3" and "CUDA_VISIBLE_DEVICES" not in cpu
    assert cpu["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the worker in the engine's own process


def test_srun_local_ranks_without_local_world_size():
    assert local_ranks(8, {"LOCAL_WORLD_SIZE": "4", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "2"}) == 4
    assert local_ranks(8, {"SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4"}) == 4
    # srun -n 7 over 3 nodes without --ntasks-per-node: 3 + 2 + 2, read at this node's id
    step = {"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "3,2(x2)"}
    assert [local_ranks(7, {**step, "SLURM_NODEID": str(n)}) for n in range(3)] == [3, 2, 2]
    assert local_ranks(7, {"SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}) == 1
    assert local_ranks(8, {}) == 8  # no launcher said: every rank on this node
    with pytest.raises(ValueError, match=r"names 3 node\(s\), not node 5"):
        slurm_node_tasks("3,2(x2)", 5)


def test_each_rank_gets_its_share_of_the_cores():
    assert rank_cores(0, 1, allowed=[0, 1], machine=2) == [0, 1]
    assert [rank_cores(r, 2, allowed=[0, 1], machine=2) for r in (0, 1)] == [[0], [1]]
    assert [rank_cores(r, 2, allowed=range(8), machine=8) for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [rank_cores(r, 4, allowed=[0, 1], machine=2) for r in range(4)] == [[0], [1], [0], [1]]
    # a launcher already bound this rank to fewer cores than the machine has: those, all of them
    assert rank_cores(1, 2, allowed=[6, 7], machine=8) == [6, 7]


def test_sleep_mode_and_its_allocator_only_on_gpus_and_the_transfer_each_side_uses():
    settings = VLLMSettings(dtype="bfloat16", max_model_len=512, gpu_memory_utilization=0.4,
                            kv_cache_gib=0.25)
    gpu = llm_kwargs("m", settings, 0, True)
    assert gpu["enable_sleep_mode"] is True and gpu["gpu_memory_utilization"] == 0.4
    assert gpu["weight_transfer_config"] == {"backend": "ipc"} and "kv_cache_memory_bytes" not in gpu
    assert gpu["enforce_eager"] is False and gpu["dtype"] == "bfloat16"
    cpu = llm_kwargs("m", settings, 0, False, max_loras=2, max_lora_rank=8)
    assert "enable_sleep_mode" not in cpu and "enable_cumem_allocator" not in cpu
    assert cpu["kv_cache_memory_bytes"] == 2**28 and cpu["weight_transfer_config"] == {"backend": "drmas_shm"}
    assert (cpu["enable_lora"], cpu["max_loras"], cpu["max_lora_rank"]) == (True, 2, 8)
    assert cpu["logprobs_mode"] == "processed_logprobs"
    assert cpu["enforce_eager"] is True
    # other vLLM arguments pass through; those drmas sets are refused by name, saying what sets them
    extra = VLLMSettings(llm_args={"max_num_seqs": 4, "enable_prefix_caching": False})
    assert llm_kwargs("m", extra, 0, False)["max_num_seqs"] == 4
    with pytest.raises(ValueError, match=r"llm_args may not set gpu_memory_utilization \(set engine_settings"
                                         r"\.gpu_memory_utilization\); seed \(each rollout reseeds"):
        VLLMSettings(llm_args={"seed": 1, "gpu_memory_utilization": 0.9})


def test_per_device_defaults_of_the_transfer_buffer_eager_mode_and_the_build_order():
    from drmas.engines.vllm.settings import VLLMSettings, builds_alone, eager, transfer_buffer_bytes

    assert transfer_buffer_bytes(None, on_gpu=True) == 2**30
    assert transfer_buffer_bytes(None, on_gpu=False) == 2**28
    assert transfer_buffer_bytes(64, on_gpu=True) == 64 * 2**20
    assert eager(None, on_gpu=False) is True and eager(None, on_gpu=True) is False  # CUDA graphs on GPUs
    assert eager(True, on_gpu=True) is True and eager(False, on_gpu=False) is False
    # vLLM sizes a GPU's KV cache from free-memory changes: one build at a time there
    assert builds_alone(on_gpu=True) and not builds_alone(on_gpu=False)
    with pytest.raises(ValueError, match=r"transfer_buffer_mib must be > 0 \(or unset\), got 0"):
        VLLMSettings(transfer_buffer_mib=0)


def test_a_gpu_transfer_peak_holds_the_largest_tensor_twice_over_the_buffer():
    from drmas.engines import VLLMEngine
    from drmas.engines.vllm.settings import VLLMSettings

    qwen3_8b_embedding = 151936 * 4096  # 1.16 GiB in bf16: more than vLLM's 1 GiB default buffer
    peak = VLLMEngine.sizing.transfer_bytes(VLLMSettings(dtype="bfloat16"), qwen3_8b_embedding)
    assert peak == 2 * qwen3_8b_embedding * 2  # the buffer raised to it, and the gathered tensor beside it
    small = 1024 * 1024  # 2 MiB in bf16: the 1 GiB buffer and the tensor
    assert VLLMEngine.sizing.transfer_bytes(VLLMSettings(dtype="bfloat16"), small) == 2**30 + 2 * small
    fp32 = VLLMSettings(dtype="float32", transfer_buffer_mib=8)
    assert VLLMEngine.sizing.transfer_bytes(fp32, small) == 8 * 2**20 + 4 * small
