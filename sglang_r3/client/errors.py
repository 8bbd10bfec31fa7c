"""Errors the routing client raises."""

from __future__ import annotations

from typing import Any, Optional


class RoutingClientError(RuntimeError):
    """The request could not be made or its answer could not be read."""


class RoutingServerError(RoutingClientError):
    """The server answered with an HTTP error; carries the server's own message."""

    def __init__(self, status: int, message: str, field: Optional[str] = None, body: Any = None, url: str = ""):
        where = f" ({url})" if url else ""
        on = f" [field {field}]" if field else ""
        super().__init__(f"HTTP {status}{where}{on}: {message}")
        self.status, self.message, self.field, self.body, self.url = status, message, field, body, url

    @property
    def is_client_error(self) -> bool:
        """4xx: the request was wrong; retrying it unchanged will not help."""
        return 400 <= self.status < 500
