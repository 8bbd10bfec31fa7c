"""Errors the routing client raises."""

from __future__ import annotations

from typing import Any, Optional, Tuple


class RoutingClientError(RuntimeError):
    """The request could not be made or its answer could not be read."""


class RoutingArgumentError(RoutingClientError, ValueError):
    """A call was malformed (``prompts`` / ``input_ids``, ``batch_size``): nothing was sent. A
    RoutingClientError, and a ValueError as well, for callers that caught the ValueError it was."""


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


class RoutingUnavailableError(RoutingClientError):
    """The server finished a sample but says its routing cannot be trusted (``meta_info["routing_error"]``).

    code: the server's reason ("missing_rows": some rows were never written by a target forward;
    "capture_off": capture was switched off). sample: the output index, when known. affected: every
    output index of the batch without routing, so a caller can drop those samples and keep the rest.
    """

    def __init__(
        self,
        code: str,
        message: str,
        missing_rows: Optional[int] = None,
        rows: Optional[int] = None,
        sample: Optional[int] = None,
        affected: Tuple[int, ...] = (),
    ):
        where = f"output {sample}" if sample is not None else "output"
        count = f" ({missing_rows} of {rows} rows missing)" if missing_rows is not None and rows is not None else ""
        others = f"; {len(affected)} output(s) of the batch have no routing: {list(affected)}" if affected else ""
        super().__init__(f"{where} has no trustworthy routing [{code}]{count}: {message}{others}")
        self.code, self.message, self.missing_rows, self.rows = code, message, missing_rows, rows
        self.sample, self.affected = sample, tuple(affected)
