"""Each agent's own contribution to its policy's gradient, for ``train/<policy>/<agent>/grad_norm``.

With micro-batches that hold one agent each (``BatchSpec.by_agent``), what a micro-batch's
backward adds to the gradient is that agent's; it is added to a buffer per (policy, agent),
whose norm is read when the policy steps. Costs one gradient-sized buffer per agent, plus a copy
of the gradient during each backward.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

import torch

__all__ = ["AgentGradients"]


class AgentGradients:
    def __init__(self) -> None:
        self._acc: dict[str, dict[str, list[torch.Tensor]]] = defaultdict(dict)

    def backward(self, policy: str, agent: str, params: Sequence[torch.nn.Parameter],
                 backward: Callable[[], None]) -> None:
        """Run ``backward()`` and add what it added to ``params``' gradients to ``agent``'s buffer."""
        before = [None if p.grad is None else p.grad.detach().clone() for p in params]
        backward()
        acc = self._acc[policy].setdefault(agent, [torch.zeros_like(p) for p in params])
        with torch.no_grad():
            for a, p, b in zip(acc, params, before):
                if p.grad is not None:
                    a.add_(p.grad if b is None else p.grad - b)

    def take_norms(self, policy: str) -> dict[str, float]:
        """Each agent's gradient norm since the policy's last step; the buffers are released."""
        return {agent: float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(a)
                                                                   for a in acc])))
                for agent, acc in self._acc.pop(policy, {}).items()}
