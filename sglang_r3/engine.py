"""``sglang_r3.engine.Engine(...)``: SGLang's in-process ``sglang.Engine`` with routing capture.

Takes the same flags as ``python -m sglang_r3.launch_server`` (and so as
``sglang.launch_server``). Outputs keep upstream's contract: with
``return_routed_experts=True`` a finished output's ``meta_info["routed_experts"]`` is
base64 int32 ``[T-1, num_hidden_layers, topk]``, as verl reads it from
``TokenizerManager.generate_request``; ``meta_info["routing"]`` is the role-tagged record
(``RoutingRecord.from_wire``), and ``meta_info["routing_error"]`` replaces both when
the rows cannot be trusted.
"""

from __future__ import annotations

import os
from typing import Sequence

from sglang_r3.launch_server import ENABLE_ENV, prepare
from sglang_r3.patches import api


def Engine(argv: Sequence[str] = ()):  # noqa: N802 -- named like the class it builds
    server_args = prepare(list(argv))
    os.environ[ENABLE_ENV] = "1"  # the plugin installs capture in this process and the scheduler's
    return api.engine(server_args)
