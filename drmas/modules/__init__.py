"""The trainable side: policies and the multi-agent LightningModule."""

from drmas.modules.multi_agent import MultiAgentRL
from drmas.modules.policy import Policy, PolicyConfig

__all__ = ["MultiAgentRL", "Policy", "PolicyConfig"]
