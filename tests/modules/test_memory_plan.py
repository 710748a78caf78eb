"""The GPU memory plan (pure arithmetic, checked by hand) and the strategy/resume guards."""

import pytest
import torch

from drmas.modules.memory import GIB, PolicyMemory, memory_plan
from drmas.modules.sharding import FSDP, check_resume, resolve_strategy
from dataclasses import replace

ONE_B = PolicyMemory("shared", parameters=10**9, vocab_size=100_000, chunk_tokens=1024,
                     tokens_per_micro_batch=10**5)


def test_plan_counts_sharded_state_logits_and_engines():
    text, fits = memory_plan([ONE_B], ranks=8, device_bytes=80 * GIB, engine_fractions=[0.3])
    assert fits
    # 1e9 / 8 params per rank: 4 B weights + 4 B grads + 8 B Adam; logits 3 x 4 B x 1024 x 1e5
    state, logits = 10**9 / 8, 12 * 1024 * 100_000
    update = (16 * state + logits) / GIB
    rollout = (12 * state + 0.3 * 80 * GIB) / GIB
    assert f"update peak {update:.2f} GiB (engines asleep 0.00); rollout peak {rollout:.2f} GiB" in text
    # each engine asleep still holds its process's context during the update; a sync's staging
    # buffer counts at the rollout
    text, _ = memory_plan([ONE_B], ranks=8, device_bytes=80 * GIB, engine_fractions=[0.3, 0.1],
                          engine_asleep=[GIB, GIB], transfer_bytes=GIB)
    rollout = (12 * state + 0.4 * 80 * GIB + GIB) / GIB
    assert (f"update peak {update + 2:.2f} GiB (engines asleep 2.00); rollout peak {rollout:.2f} GiB "
            f"(engines 32.00 GiB = 0.3 + 0.1; weight transfer 1.00)") in text
    assert f"shared{'':6s} {4 * state / GIB:8.2f} {4 * state / GIB:8.2f} {8 * state / GIB:8.2f}" in text


def test_engines_awake_through_the_update_count_their_whole_share_and_keep_a_copy():
    """Rollouts behind the update (--data.rollout.staleness): the engines' fractions count at the
    update's peak too, and an engine that could use the trained tensors keeps a copy."""
    from drmas.engines import HFEngine, VLLMEngine
    from drmas.engines.vllm.settings import VLLMSettings
    from drmas.modules.memory import plan_terms
    from drmas.modules.policy import Policy, PolicyConfig

    policies = {"p": Policy("p", PolicyConfig(model="tiny-random"))}
    team = {"p": policies["p"].config}
    vllm = VLLMSettings(gpu_memory_utilization=0.3)
    terms = plan_terms(policies, VLLMEngine, vllm, team, 1, 80 * GIB, False, False, False, awake=True)
    assert terms["engine_asleep"] == [0.3 * 80 * GIB] and terms["awake"]
    text, _ = memory_plan(**terms)
    assert "(engines awake 24.00)" in text
    asleep = plan_terms(policies, VLLMEngine, vllm, team, 1, 80 * GIB, False, False, False)
    assert asleep["engine_asleep"] == [GIB] and "(engines asleep 1.00)" in memory_plan(**asleep)[0]
    hf = plan_terms(policies, HFEngine, None, team, 1, 80 * GIB, False, False, False, awake=True)
    assert hf["policies"][0].engine_copy_bytes > 0
    assert plan_terms(policies, HFEngine, None, team, 1, 80 * GIB, False, False, False)[
        "policies"][0].engine_copy_bytes == 0


def test_plan_refuses_what_cannot_fit_and_offloading_fits_it():
    big = PolicyMemory("big", parameters=8 * 10**9, vocab_size=151_936, chunk_tokens=0,
                       tokens_per_micro_batch=8192, reference=True)
    text, fits = memory_plan([big], ranks=1, device_bytes=80 * GIB, engine_fractions=[0.3])
    assert not fits and "does not fit in 80.0 GiB" in text and "fsdp_offload" in text
    # 8 ranks: 8e9 x (16 + 2 reference) / 8 = 18e9 B of state plus 8192-token logits
    assert memory_plan([big], ranks=8, device_bytes=80 * GIB, engine_fractions=[0.3])[1]
    assert memory_plan([big], ranks=1, device_bytes=80 * GIB, engine_fractions=[0.3], offload=True)[1]


def test_the_hf_engines_unsharded_copy_is_counted_and_can_refuse_a_plan():
    # 15B sharded over 8 ranks fits in 80 GiB (30 GB of state); the HF engine's whole fp32 copy
    # on every rank (60 GB) does not
    sharded = PolicyMemory("p", parameters=15 * 10**9, vocab_size=151_936, chunk_tokens=1024,
                           tokens_per_micro_batch=8192)
    assert memory_plan([sharded], ranks=8, device_bytes=80 * GIB, engine_fractions=[])[1]
    copy = PolicyMemory("p", 15 * 10**9, 151_936, 1024, 8192, engine_copy_bytes=4 * 15 * 10**9)
    text, fits = memory_plan([copy], ranks=8, device_bytes=80 * GIB, engine_fractions=[])
    state, logits = 15 * 10**9 / 8, 12 * 1024 * 151_936
    assert not fits and f"update peak {(16 * state + logits + 60 * 10**9) / GIB:.2f} GiB" in text
    assert text.splitlines()[2].endswith(f"{60 * 10**9 / GIB:8.2f}")  # the engine column of the policy's row


def test_policy_memory_counts_the_copy_in_the_policys_dtype():
    from drmas.modules import PolicyConfig
    from drmas.modules.memory import policy_memory
    from drmas.modules.policy import Policy

    policy = Policy("p", PolicyConfig(model="tiny-random", dtype="bfloat16"))
    n = sum(p.numel() for p in policy.model.parameters())
    assert policy_memory(policy, False, 128).engine_copy_bytes == 0
    assert policy_memory(policy, False, 128, engine_copy=True).engine_copy_bytes == 2 * n


def test_strategy_names_and_sharded_checkpoints_without_sharding(tmp_path):
    from drmas.modules.sharding import is_sharded

    # which strategies make the CLI build policies on the meta device and load each rank's shards
    assert is_sharded("fsdp") and is_sharded("fsdp_offload") and is_sharded(FSDP())
    assert is_sharded({"class_path": "drmas.modules.sharding.FSDP", "init_args": {}})
    assert not is_sharded("auto") and not is_sharded(None) and not is_sharded({"class_path": "DDPStrategy"})
    assert resolve_strategy("auto") == "auto"
    assert isinstance(resolve_strategy("fsdp"), FSDP) and not resolve_strategy("fsdp").cpu_offload
    assert resolve_strategy("fsdp_offload").cpu_offload
    with pytest.raises(ValueError,
                       match=r"--trainer.strategy 'deepspeed' is not supported; use one of: auto"):
        resolve_strategy("deepspeed")
    ckpt = tmp_path / "last.ckpt"
    ckpt.mkdir()
    torch.save({"drmas": {"rng": [{}, {}, {}, {}]}}, ckpt / "meta.pt")
    with pytest.raises(ValueError,
                       match="written by 4 ranks: resume it with --trainer.strategy fsdp, on any number"):
        check_resume(str(ckpt), "auto")
    check_resume(str(ckpt), FSDP())  # sharded: any rank count, the load reshards
    check_resume(None, "auto")


def test_the_plan_counts_level_one_host_copies_and_rechecks_with_the_measured_residue():
    from drmas.engines.vllm.settings import VLLMSettings, host_copy_bytes
    from drmas.models.lora import LoraSettings
    from drmas.modules.memory import residue_report
    from drmas.modules.policy import PolicyConfig

    team = {"trained": PolicyConfig(), "judge": PolicyConfig(trainable=False),
            "a": PolicyConfig(model="base", lora=replace(LoraSettings(), share_base=True)),
            "b": PolicyConfig(model="base", lora=replace(LoraSettings(), share_base=True))}
    params = {"trained": 7, "judge": 1000, "a": 300, "b": 300}
    # bf16 engines: the frozen judge and the LoRA base (once for a and b) kept on the host, 2 B each;
    # the trained whole model sleeps at level 2 and keeps nothing
    assert host_copy_bytes(team, VLLMSettings(dtype="bfloat16"), params) == 2 * (1000 + 300)
    assert host_copy_bytes(team, VLLMSettings(dtype="float32"), params) == 4 * (1000 + 300)
    text, _ = memory_plan([ONE_B], ranks=8, device_bytes=80 * GIB, engine_fractions=[0.3], host_bytes=3 * GIB)
    assert "host memory per rank: 3.00 GiB of weights kept by engines asleep at level 1" in text

    plan = dict(policies=[ONE_B], ranks=8, device_bytes=80 * GIB, engine_fractions=[0.3, 0.3],
                engine_asleep=[GIB, GIB])
    # update peak 16 B x 1e9 / 8 + logits = 3.0 GiB + 2 x 1 GiB asleep: fits; measured 1.5 GiB each still fits
    lines = residue_report({"p": (1.5 * GIB, "NVML, pid 7"), "q": (1.5 * GIB, "NVML, pid 8")}, plan)
    assert lines == ["engine p asleep holds 1.50 GiB of the device (NVML, pid 7; the plan counted 1.00)",
                     "engine q asleep holds 1.50 GiB of the device (NVML, pid 8; the plan counted 1.00)"]
    # 40 GiB each (an engine whose sleep released nothing): the update no longer fits, said with the plan
    lines = residue_report({"p": (40 * GIB, "NVML, pid 7"), "q": (40 * GIB, "NVML, pid 8")}, plan)
    assert lines[-1].startswith("with the engines' measured residue the plan no longer fits (expect an "
                                "out-of-memory in the update):\nmemory plan per device")
    assert "engines asleep 80.00" in lines[-1]
    assert residue_report({}, plan) == []


def test_an_engine_process_finds_its_own_pid_in_nvmls_list():
    from types import SimpleNamespace

    from drmas.engines.vllm.process import pid_usage

    rows = [SimpleNamespace(pid=7, usedGpuMemory=3 * GIB), SimpleNamespace(pid=9, usedGpuMemory=GIB),
            SimpleNamespace(pid=7, usedGpuMemory=GIB), SimpleNamespace(pid=8, usedGpuMemory=None)]
    assert pid_usage(7, rows) == 4 * GIB  # on two devices: both counted
    assert pid_usage(8, rows) is None  # NVML cannot say (no privilege)
    assert pid_usage(5, rows) is None  # not listed: another pid namespace
