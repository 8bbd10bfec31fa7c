"""SGLang started by launchers that are not ours, under ``SGLANG_R3_ENABLED=1``: slime's launch path.

``SlimeLaunchServer`` runs ``tests/scripts/slime_launch.py PORT OVERRIDES`` (slime's ``launch_server_process``, a
stand-in for slime's rollout engine actor); ``SLIME_OVERRIDES`` are the ``ServerArgs`` keywords our launcher would
add for the embedded model (fp32, and on a CPU host the CPU runtime's settings), ``SPEC_OVERRIDES`` MTP speculation
as our default launch serves it, ``OPT_IN`` the environment that opts SGLang's own launchers in.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sglang_r3.core import settings
from sglang_r3.dev.cpu import has_gpu
from tests.support.servers import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
SLIME_LAUNCH = ROOT / "tests" / "scripts" / "slime_launch.py"
OPT_IN = {settings.ENABLED: "1"}
SLIME_OVERRIDES = {"dtype": "float32", "max_total_tokens": 65536, **(
    {"device": "cpu", "attention_backend": "torch_native", "disable_overlap_schedule": True, "disable_cuda_graph": True,
     "sleep_on_idle": True}
    if not has_gpu() else {}
)}
# MTP speculation as our default launch serves it (slime's seed runs GLM-4.7 with its MTP layer).
SPEC_OVERRIDES = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
                  "speculative_num_draft_tokens": 4}


class SlimeLaunchServer(ServerProcess):
    """``tests/scripts/slime_launch.py PORT OVERRIDES``: slime's ``launch_server_process``; ``args`` = [overrides
    JSON]."""

    def start(self) -> "SlimeLaunchServer":
        cmd = [sys.executable, str(SLIME_LAUNCH), str(self.port), *self.args]
        self.spawn(cmd, f"sglang-slime-{self.port}-", self.env)
        return self
