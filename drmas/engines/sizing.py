"""What an engine class says about device memory, for the memory plan (``drmas.modules.memory``)
and the refusals before anything is built: apart from :class:`~drmas.engines.base.Engine`, which
generates and syncs weights. An engine class names its own as ``Engine.sizing``; the defaults
here are an engine that reserves nothing (the HF engine on the trainer's device)."""

from __future__ import annotations

from typing import Any

__all__ = ["EngineSizing"]


class EngineSizing:
    """An engine class's memory: every method a classmethod of the settings and the team (each
    policy's config by name), read before any engine exists."""

    @classmethod
    def check_memory(cls, team: dict[str, Any], settings: Any, on_gpu: bool, split: bool = False) -> None:
        """Refuse, before anything is built, engines that cannot fit (a one-line ValueError); ``split``:
        on a GPU of their own."""

    @classmethod
    def startup_budgets(cls, team: dict[str, Any], settings: Any, shapes: dict[str, Any], device_bytes: int,
                        device_name: str, in_flight: dict[str, int], split: bool) -> list[Any]:
        """What each engine takes as it starts on its GPU of ``device_bytes`` (``shapes``: each
        policy's :class:`~drmas.models.shapes.ModelShape`; ``in_flight``: as
        ``Placement.in_flight``), each with ``line()``, ``fits`` and ``refusal()``; none by default."""
        return []

    @classmethod
    def device_fractions(cls, team: dict[str, Any], settings: Any) -> list[float]:
        """The device share each engine reserves during the rollout."""
        return []

    @classmethod
    def asleep_bytes(cls, team: dict[str, Any], settings: Any) -> list[float]:
        """What each engine still holds on the device while asleep, during the update (bytes)."""
        return []

    @classmethod
    def asleep_host_bytes(cls, team: dict[str, Any], settings: Any, parameters: dict[str, int]) -> float:
        """Host memory the engines keep while asleep (bytes; ``parameters``: each policy's count)."""
        return 0.0

    @classmethod
    def transfer_bytes(cls, settings: Any, largest: int, split: bool = False) -> float:
        """The device memory one weight sync takes on the trainer's side at its peak (bytes), for a
        policy whose largest tensor has ``largest`` elements; ``split``: to engines on a GPU of
        their own."""
        return 0.0

    @classmethod
    def keeps_copy(cls, sharded: bool) -> bool:
        """Whether the engine keeps a whole copy of a policy's weights on the device at all times."""
        return False
