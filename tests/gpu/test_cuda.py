"""On a CUDA device (skipped elsewhere; ``scripts/device_check.sh`` runs them on the lent GPU):
FSDP2 at world size 1 against the unsharded step, the chunked log-probs and packed shared
prefixes under bf16 against the full-logits, unpacked path, and the memory plan against the
measured peak for SmolLM2-135M- and 1.7B-shaped random models, a tensor over 1 GiB to another
process by CUDA IPC within the planned transfer peak, and the trainer's cache handed back. Each
prints one line the check's summary collects (``fsdp ...``, ``logprobs ...``, ``memory plan ...``,
``cuda ipc ...``, ``release ...``)."""

import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

MODULES = Path(__file__).resolve().parent.parent / "modules"
sys.path.insert(0, str(MODULES))  # fsdp_step.py and the prefix-sharing samples live there

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _step(tmp_path, *flags):
    out = tmp_path / f"out{'-'.join(flags)}.pt"
    proc = subprocess.run([sys.executable, str(MODULES / "fsdp_step.py"), str(out), "--cuda", *flags],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=True)


def test_fsdp2_on_cuda_at_world_size_1_equals_the_unsharded_step(tmp_path):
    single, sharded = _step(tmp_path), _step(tmp_path, "--shard")
    assert sharded["sharded"] and not single["sharded"]  # DTensors, also on one rank
    assert sharded["read"] == {"p": "slices"}
    assert sharded["engine_diff"] == single["engine_diff"] == 0.0
    loss_gap = abs(sharded["loss"] - single["loss"]) / max(1.0, abs(single["loss"]))
    norm_gap = abs(sharded["grad_norm"] - single["grad_norm"]) / single["grad_norm"]
    weight_gap = max(float((sharded["weights"][n] - w).abs().max()) for n, w in single["weights"].items())
    print(f"fsdp world 1 on cuda: loss rel {loss_gap:.2e}, grad norm rel {norm_gap:.2e}, "
          f"weights max {weight_gap:.2e}")
    assert loss_gap <= 1e-6 and norm_gap <= 1e-5
    assert weight_gap <= 2e-2  # one AdamW step's width at most (see tests/modules/test_fsdp.py)


def _train_bf16(prefix_sharing: bool):
    from test_prefix_sharing import Fixed, Grads

    from drmas.algorithms import LossConfig
    from drmas.modules import MultiAgentRL, PolicyConfig
    from drmas.modules.policy_config import OptimSettings, PolicyGeneration, UpdateSettings
    from drmas.records import GenerationSettings

    torch.manual_seed(0)
    cfg = PolicyConfig(model="tiny-random", optim=OptimSettings(lr=1e-3, grad_clip=0.0),
                       update=UpdateSettings(micro_batch_size=3),
                       generation=PolicyGeneration(
                           train=GenerationSettings(temperature=0.7, max_new_tokens=8)))
    module = MultiAgentRL(policies={"p": cfg}, agents={"a": "p"}, engine="hf",
                          loss=LossConfig(importance_cap=None, entropy_coef=0.01),
                          prefix_sharing=prefix_sharing)
    grads, dm = Grads(), Fixed(module, 3)
    L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_epochs=1,
              reload_dataloaders_every_n_epochs=1, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False,
              callbacks=[grads]).fit(module, datamodule=dm)
    logged = next(h for h in module.history if "train/p/loss" in h)
    return module, dm.batches, grads.grads, logged


def test_chunked_logprobs_and_packed_prefixes_under_bf16_match_the_unpacked_path():
    packed_module, packed_batches, packed, a = _train_bf16(True)
    _, plain_batches, plain, b = _train_bf16(False)
    policy = packed_module.policies["p"]
    assert policy.chunk_tokens == 1024 and policy.prefix_sharing  # the checks passed under bf16 on CUDA
    assert any(x.packed is not None for x in packed_batches)
    assert all(x.packed is None for x in plain_batches)
    loss_gap = abs(a["train/p/loss"] - b["train/p/loss"]) / max(1e-3, abs(b["train/p/loss"]))
    num = sum(float((packed[n] - g).float().norm() ** 2) for n, g in plain.items()) ** 0.5
    den = sum(float(g.float().norm() ** 2) for g in plain.values()) ** 0.5
    print(f"logprobs bf16 on cuda, packed vs unpacked: loss rel {loss_gap:.2e}, gradient rel {num / den:.2e}")
    assert loss_gap <= 2e-2 and num / den <= 5e-2  # bf16's rounding, not a different computation


def _gib(text: str, label: str) -> float:
    return float(re.search(rf"{label} ([\d.]+) GiB", text).group(1))


@pytest.mark.parametrize("shape", ["s135", "s1700"])
def test_the_memory_plan_is_a_floor_of_the_measured_update(shape):
    """The plan counts weights, gradients, AdamW moments and one chunk of logits (not activations):
    after a step the state it counts is what stays allocated, and the measured peak is above it."""
    folder = os.environ.get("DRMAS_DEVICE_MODELS")
    if not folder or not os.path.isdir(os.path.join(folder, shape)):
        pytest.skip("DRMAS_DEVICE_MODELS names no folder with the random models (scripts/device_models.py)")
    from drmas.modules import PolicyConfig
    from drmas.modules.memory import GIB, memory_plan, policy_memory
    from drmas.modules.policy import Policy
    from drmas.modules.policy_config import UpdateSettings

    policy = Policy("p", PolicyConfig(model=os.path.join(folder, shape),
                                      update=UpdateSettings(micro_batch_size=2)))
    model = policy.model.cuda().train()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    entry = policy_memory(policy, kl=False, max_len=1024)
    plan, _ = memory_plan([entry], 1, torch.cuda.get_device_properties(0).total_memory, [])
    params = entry.parameters
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    ids = torch.randint(0, model.config.vocab_size, (2, 1024), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    state = torch.cuda.memory_allocated() - base + 4 * params  # + the weights, allocated before base
    peak = torch.cuda.max_memory_allocated() - base + 4 * params
    planned_state, planned_peak = 16 * params, _gib(plan, "update peak") * GIB
    print(f"memory plan {shape}: {params / 1e6:.0f}M parameters; state after the step "
          f"{state / GIB:.2f} GiB measured vs {planned_state / GIB:.2f} planned (weights, grads, adam); "
          f"update peak {peak / GIB:.2f} GiB measured vs {planned_peak / GIB:.2f} planned "
          f"(activations not planned: {max(0.0, peak - planned_peak) / GIB:.2f} GiB)")
    assert abs(state - planned_state) <= 0.03 * planned_state
    assert peak >= 0.97 * planned_peak  # a floor


CHILD = """
import pickle, sys, torch
func, args = pickle.load(sys.stdin.buffer)
tensor = func(*args)  # the trainer's memory, mapped here by CUDA IPC: no copy
print("CHECKSUM", float(tensor[::4099].double().sum()), tensor.dtype, tuple(tensor.shape), flush=True)
"""


def test_a_tensor_over_1_gib_reaches_another_process_by_cuda_ipc_within_the_planned_peak():
    """What vLLM's IPC sender does with the trainer's buffer (``reduce_tensor`` here, its rebuild in
    the engine process), for Qwen3-8B's embedding in bf16 (151936 x 4096 x 2 B = 1.16 GiB, above
    vLLM's 1 GiB default buffer): the bytes arrive whole, and the trainer's peak (the tensor cast
    before the gather, and the buffer raised to it) is what the memory plan counts
    (``VLLMEngine.sizing.transfer_bytes``)."""
    from torch.multiprocessing.reductions import reduce_tensor

    from drmas.engines.vllm.engine import VLLMEngine
    from drmas.engines.vllm.settings import VLLMSettings
    from drmas.modules.memory import GIB

    shape = (151936, 4096)
    shard = torch.randn(shape, device="cuda")  # the trainer's fp32 weight (its own memory, not counted)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    tensor = shard.to(torch.bfloat16)  # cast first, then (on several ranks) gathered
    planned = VLLMEngine.sizing.transfer_bytes(VLLMSettings(dtype="bfloat16"), tensor.numel())
    buffer = torch.empty(max(2**30, tensor.numel() * 2), dtype=torch.uint8, device="cuda")
    buffer[: tensor.numel() * 2].copy_(tensor.view(-1).view(torch.uint8))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    sent = buffer[: tensor.numel() * 2].view(torch.bfloat16).view(shape)
    child = subprocess.run([sys.executable, "-c", CHILD], input=pickle.dumps(reduce_tensor(sent)),
                           capture_output=True, timeout=120)
    assert child.returncode == 0, child.stderr.decode()[-3000:]
    said = next(line for line in child.stdout.decode().splitlines() if line.startswith("CHECKSUM")).split()
    expected = float(tensor[::4099].double().sum())
    print(f"cuda ipc: {tensor.numel() * 2 / GIB:.2f} GiB tensor to another process, checksum {said[1]} vs "
          f"{expected}; transfer peak {peak / GIB:.2f} GiB measured vs {planned / GIB:.2f} planned")
    assert float(said[1]) == expected and said[2] == "torch.bfloat16"
    assert abs(peak - planned) <= 0.02 * planned


def test_the_trainer_hands_its_cached_memory_back_before_engines_wake():
    from drmas.modules.engine_routing import release_cached_memory
    from drmas.modules.memory import GIB

    blocks = [torch.empty(2**30, dtype=torch.uint8, device="cuda") for _ in range(4)]  # what an update frees
    del blocks
    before = torch.cuda.memory_reserved()
    release_cached_memory(torch.device("cuda", torch.cuda.current_device()))
    after = torch.cuda.memory_reserved()
    print(f"release: reserved {before / GIB:.2f} GiB -> {after / GIB:.2f} GiB")
    assert before - after >= 4 * GIB - 2**20
