"""Client of the R3 routing server: generate with routing records, read the model layout."""

from sglang_r3.trainer.client.async_client import AsyncRoutingClient
from sglang_r3.trainer.client.errors import (
    RoutingArgumentError,
    RoutingClientError,
    RoutingServerError,
    RoutingUnavailableError,
)
from sglang_r3.trainer.client.results import GenerateResult, decode_routing, parse_outputs
from sglang_r3.trainer.client.sync_client import RoutingClient

__all__ = [
    "AsyncRoutingClient",
    "GenerateResult",
    "RoutingArgumentError",
    "RoutingClient",
    "RoutingClientError",
    "RoutingServerError",
    "RoutingUnavailableError",
    "decode_routing",
    "parse_outputs",
]
