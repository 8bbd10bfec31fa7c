"""``sglang_r3.serving.engine.Engine(argv)``: SGLang's in-process ``sglang.Engine`` with routing capture.

Same flags as ``python -m sglang_r3.launch_server``; outputs keep upstream's ``routed_experts`` (base64
int32 ``[T-1, num_hidden_layers, topk]``, as verl reads it) and add ``routing`` (or ``routing_error``).
"""

from __future__ import annotations

from typing import Sequence

from sglang_r3.serving.launch import prepare
from sglang_r3.serving.adapter import api


def Engine(argv: Sequence[str] = ()):  # noqa: N802 -- named like the class it builds
    # prepare publishes settings.ENABLED: the plugin installs capture in this process and the scheduler's.
    return api.engine(prepare(list(argv)))
