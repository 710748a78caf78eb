"""Engine processes that alter one tensor as it arrives in a weight transfer (the faulty.py fault
``corrupt_transfer``): what a defect in a transfer would do, for the first-minute pass to catch."""

from __future__ import annotations

TENSOR = "model.layers.0.mlp.down_proj.weight"
"""The tensor altered: 0.5 added to its first row, as it arrives."""


def _altered(name, tensor):
    if name != TENSOR:
        return tensor
    bad = tensor.clone()
    bad[0] += 0.5
    return bad


def serve_vllm(fd: str, quiet: str = "") -> None:
    from drmas.engines.vllm import process, transfer

    receive = transfer.SharedMemoryWeightTransferEngine.receive_weights

    def receive_altered(self, update_info):
        load = self.model.load_weights
        self.model.load_weights = lambda weights: load([(n, _altered(n, t)) for n, t in weights])
        try:
            return receive(self, update_info)
        finally:
            self.model.load_weights = load

    transfer.SharedMemoryWeightTransferEngine.receive_weights = receive_altered
    process.serve(fd, quiet)


def serve_hf(fd: str) -> None:
    import torch

    from drmas.engines import hf_process

    load = hf_process.HFServer.load_chunk

    def load_altered(self, **layout):
        load(self, **layout)
        if TENSOR in layout.get("names", ()):
            with torch.no_grad():
                self.state[TENSOR][0] += 0.5

    hf_process.HFServer.load_chunk = load_altered
    hf_process.serve(fd)
