"""Experience records, micro-batching, rollout engines and the rollout data module.

Kept free of Lightning imports: import ``drmas.data.datamodule`` for the data module.
"""

from drmas.data.experience import Experience, MicroBatch, make_micro_batches

__all__ = ["Experience", "MicroBatch", "make_micro_batches"]
