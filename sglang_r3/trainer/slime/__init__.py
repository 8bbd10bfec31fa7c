"""slime's R3 replay by identity (THUDM/slime 624b824), one module per job:

* ``install`` (``installer.py``): slime's ``--custom-megatron-init-path sglang_r3.trainer.slime.install``, the
  zero-edit path: the fill in place of ``MegatronTrainRayActor.fill_routing_replay``, the refusals, and with
  ``SGLANG_R3_HEALTH`` on, each step's health in slime's training log.
* ``fill_routing_replay`` (``fill.py``): the drop-in for slime's fill; ``layer_rows`` prepares one microbatch's
  rows as slime does, ``upstream_moe_columns`` checks an upstream int32 ``routed_experts`` array.
* ``bind`` (``binding.py``): decoder MoE routers served their own ``routing_replay``'s rows, MTP routers live
  under slime's ``fallthrough`` stage.
* ``health`` / ``health_counts`` (``measure.py``): live R3 health through slime's ``compute_topk`` factory.
* ``step_health`` (``ranks.py``): a step's counts summed over data-parallel (and sequence-parallel) ranks.
"""

from sglang_r3.trainer.slime.binding import ENABLE_ENV, LIVE_STAGE, REPLAY_FORWARD, STAGE_ENV, bind
from sglang_r3.trainer.slime.fill import LayerRows, SlimeFill, fill_routing_replay, layer_rows, upstream_moe_columns
from sglang_r3.trainer.slime.installer import (
    HEALTH_ENV,
    INSTALL_PATH,
    RECORD_KEY,
    SLIME_ACTOR_MODULE,
    SLIME_MODEL_MODULE,
    SlimeInstall,
    SlimeInstallError,
    install,
)
from sglang_r3.trainer.slime.measure import SLIME_REPLAY_MODULE, health, health_counts
from sglang_r3.trainer.slime.ranks import step_health

__all__ = [
    "ENABLE_ENV", "HEALTH_ENV", "INSTALL_PATH", "LIVE_STAGE", "LayerRows", "RECORD_KEY", "REPLAY_FORWARD",
    "SLIME_ACTOR_MODULE", "SLIME_MODEL_MODULE", "SLIME_REPLAY_MODULE", "STAGE_ENV", "SlimeFill", "SlimeInstall",
    "SlimeInstallError", "bind", "fill_routing_replay", "health", "health_counts", "install", "layer_rows",
    "step_health", "upstream_moe_columns",
]
