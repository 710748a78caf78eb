"""Errors answered to a client in OpenAI's shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ApiError"]


@dataclass
class ApiError(Exception):
    """An error answered to the client in OpenAI's shape: ``{"error": {message, type, param, code}}``."""

    status: int
    message: str
    code: str | None = None
    param: str | None = None

    @property
    def type(self) -> str:
        return {401: "authentication_error", 404: "invalid_request_error", 410: "invalid_request_error"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"
