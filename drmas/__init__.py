"""drmas: stable group-relative RL for multi-agent LLM systems (Dr. MAS, AT-GRPO)."""

__version__ = "0.1.0"
