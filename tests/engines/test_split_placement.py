"""Engines on a GPU of their own (``--model.engine_placement split``): which GPU each rank's engines
take, what their vLLM process is built with, what the memory plan counts on the trainer's GPU, the
NCCL group of a weight transfer, and the rank ending when the engine's side of an NCCL call fails.
No GPU here: these are the arguments and the failure path; the transfer itself is vLLM's."""

import os
import subprocess
import sys

import pytest
import torch

from drmas.engines.placement import device_env, engine_gpu
from drmas.engines.vllm.settings import VLLMSettings, llm_kwargs

GIB = 2**30


def test_each_rank_takes_a_free_gpu_of_its_node_in_rank_order():
    cuda = torch.device("cuda", 0)
    # --trainer.devices 4 on 8 GPUs: ranks 0-3 train on 0-3, their engines on 4-7
    assert [engine_gpu(cuda, [0, 1, 2, 3], 8, r).index for r in range(4)] == [4, 5, 6, 7]
    # --trainer.devices [0,2,4,6]: the engines take the odd ones
    assert [engine_gpu(cuda, [0, 2, 4, 6], 8, r).index for r in range(4)] == [1, 3, 5, 7]
    # one rank on 3 GPUs: the first free one; the engine process sees it alone, as its cuda:0
    gpu = engine_gpu(cuda, [0], 3, 0)
    assert gpu == torch.device("cuda", 1)
    uuids = ["GPU-2", "GPU-5", "GPU-7"]  # what the trainer's CUDA calls its cuda:0-2
    assert device_env(gpu, "2,5,7", uuids.__getitem__) == {"CUDA_VISIBLE_DEVICES": "GPU-5"}


def test_split_is_refused_on_cpu_and_where_the_node_has_too_few_gpus():
    with pytest.raises(ValueError, match=r"split puts each rank's engines on a GPU of their own, but this "
                                         r"run trains on cpu: on CPU, rollouts behind the update"):
        engine_gpu(torch.device("cpu"), [], 0, 0)
    with pytest.raises(ValueError, match=r"this node shows 8 GPU\(s\) and the trainer takes 6 "
                                         r"\(\[0, 1, 2, 3, 4, 5\]\), leaving 2; train on at most 4"):
        engine_gpu(torch.device("cuda", 0), range(6), 8, 0)


def test_an_engine_on_a_gpu_of_its_own_never_sleeps_and_takes_weights_over_nccl():
    settings = VLLMSettings(gpu_memory_utilization=0.9)
    split = llm_kwargs("m", settings, 0, True, split=True)
    assert split["weight_transfer_config"] == {"backend": "nccl"}
    assert split["enable_sleep_mode"] is False and split["gpu_memory_utilization"] == 0.9
    shared = llm_kwargs("m", settings, 0, True)
    assert shared["weight_transfer_config"] == {"backend": "ipc"} and shared["enable_sleep_mode"] is True
    # on CPU split has no meaning (refused before any engine is built): the shared-memory transfer
    cpu = llm_kwargs("m", settings, 0, False, split=True)
    assert cpu["weight_transfer_config"] == {"backend": "drmas_shm"}


def test_the_nccl_group_is_the_rank_and_its_engine_on_loopback_double_buffered():
    from drmas.engines.vllm.transfer import nccl_init_info

    info = nccl_init_info(64 * 2**20, port=29555)
    assert (info.rank, info.world_size, info.master_address, info.master_port) == (0, 2, "127.0.0.1", 29555)
    assert info.is_sender and info.backend == "nccl"
    assert (info.packed, info.packed_buffer_size_bytes, info.packed_num_buffers) == (True, 64 * 2**20, 2)
    ports = {nccl_init_info(2**20).master_port for _ in range(3)}  # a free port of its own each time
    assert all(0 < p < 65536 for p in ports)


def test_the_trainers_gpu_holds_no_engine_only_the_nccl_transfers_buffers():
    from drmas.engines import HFEngine, VLLMEngine
    from drmas.modules.memory import memory_plan, plan_terms
    from drmas.modules.policy import Policy, PolicyConfig

    policies = {"p": Policy("p", PolicyConfig(model="tiny-random"))}
    team = {"p": policies["p"].config}
    vllm = VLLMSettings(gpu_memory_utilization=0.9, transfer_buffer_mib=16)
    terms = plan_terms(policies, VLLMEngine, vllm, team, 1, 80 * GIB, False, False, False, awake=True,
                       split=True)
    assert terms["engine_fractions"] == [] and terms["engine_asleep"] == [] and terms["host_bytes"] == 0
    largest = max(t.numel() for t in policies["p"].model.state_dict().values())
    tensor = largest * 2  # bf16 on GPUs (dtype auto)
    # two chunks in flight, the one being packed twice over (its tensors and their concatenation)
    # while the other is still in flight: three chunks, each up to one tensor past the buffer
    assert terms["transfer_bytes"] == 3 * (16 * 2**20 + tensor)
    text, fits = memory_plan(**terms)
    assert fits and "(engines on a GPU of their own)" in text and "engines 0.00 GiB = 0" in text
    # the HF engine in a process on its GPU keeps no copy on the trainer's
    hf = plan_terms(policies, HFEngine, None, team, 1, 80 * GIB, False, True, False, split=True)
    assert hf["policies"][0].engine_copy_bytes == 0 and hf["engine_fractions"] == []


ENDS = r"""
from drmas.engines.vllm.transfer import ProcessClient

def call(method, **kwargs):
    raise RuntimeError(f"the vLLM engine process of solver (pid 7) ended (exit code -9) during {method!r}")

try:
    ProcessClient(call, concurrent=True).update_weights({"names": []})
except RuntimeError as err:
    print("raised:", err)
print("still running")
"""


@pytest.mark.integration  # a rank and an engine in processes of their own (9 s)
def test_a_failed_engine_side_of_an_nccl_call_ends_the_rank_with_its_line():
    """vLLM runs the engine's side of an NCCL transfer in a thread beside the trainer's broadcast, which
    would wait for the dead peer forever: that failure ends the rank at once, naming the engine. Over
    shared memory the call is the trainer's own and the failure is raised, to be agreed on."""
    from drmas.engines.vllm.transfer import ProcessClient

    def call(method, **kwargs):
        raise RuntimeError(f"engine gone during {method!r}")

    ended = []
    with pytest.raises(RuntimeError, match="engine gone during 'update_weights'"):
        ProcessClient(call, end=ended.append).update_weights({})
    assert ended == []  # not concurrent: raised to the caller alone
    with pytest.raises(RuntimeError, match="engine gone during 'init_weight_transfer_engine'"):
        ProcessClient(call, concurrent=True, end=ended.append).init_weight_transfer_engine({})
    assert [str(e) for e in ended] == ["engine gone during 'init_weight_transfer_engine' (the trainer's side "
                                       "of the NCCL weight transfer cannot be interrupted: this rank ends)"]
    # and by default through the watch's end: the process exits 1 with the rank's line
    done = subprocess.run([sys.executable, "-c", ENDS], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 1 and "still running" not in done.stdout
    assert ("drmas: rank 0 failed during" in done.stderr
            and "the vLLM engine process of solver (pid 7) ended (exit code -9) during 'update_weights' "
                "(the trainer's side of the NCCL weight transfer cannot be interrupted: this rank ends)"
            in done.stderr), done.stderr


def test_the_hf_engine_apart_from_the_trainer_refuses_a_lora_policy_it_could_not_follow():
    from types import SimpleNamespace

    from drmas.engines import HFEngine, Placement

    place = Placement(device=torch.device("cuda", 0), engine_device=torch.device("cuda", 1))
    assert place.split and place.engines_on == torch.device("cuda", 1)
    assert Placement().engines_on == torch.device("cpu") and not Placement().split
    lora = SimpleNamespace(name="solver", adapter="solver", trainable=False)
    with pytest.raises(ValueError, match=r"policy 'solver' trains a LoRA adapter.*engines on a GPU of their "
                                         r"own \(--model.engine_placement split\) or per-policy pools use "
                                         r"--model.engine vllm"):
        HFEngine.create(lora, None, place, {}, {})


def test_split_engines_share_their_gpu_unless_a_fraction_is_set():
    from drmas.engines.vllm.settings import engine_fractions
    from drmas.modules.policy import PolicyConfig

    own = {"gpu_memory_utilization": 0.3}
    team = {"a": PolicyConfig(model="m"), "b": PolicyConfig(model="m", engine_settings=own),
            "c": PolicyConfig(model="m")}
    unset = VLLMSettings()
    # on a GPU of their own: vLLM's 0.92 divided among the rank's three engines; set still wins
    assert engine_fractions(team, unset, split=True) == {"a": 0.92 / 3, "b": 0.3, "c": 0.92 / 3}
    assert engine_fractions(team, unset) == {"a": 0.5, "b": 0.3, "c": 0.5}  # on the trainer's GPU
    assert llm_kwargs("m", unset, 0, True, split=True)["gpu_memory_utilization"] == 0.92
    assert llm_kwargs("m", unset, 0, True)["gpu_memory_utilization"] == 0.5
    # the batch a rollout sends at once bounds vLLM's on a GPU, unless llm_args sets one; not on CPU
    assert llm_kwargs("m", unset, 0, True, max_num_seqs=40)["max_num_seqs"] == 40
    given = VLLMSettings(llm_args={"max_num_seqs": 8})
    assert llm_kwargs("m", given, 0, True, max_num_seqs=40)["max_num_seqs"] == 8
    assert "max_num_seqs" not in llm_kwargs("m", unset, 0, False, max_num_seqs=40)
