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
* ``generate_rollout`` (``installer.py`` too): slime's ``--rollout-function-path
  sglang_r3.trainer.slime.generate_rollout``, the rollout side: slime's own rollout function, each training
  rollout refused before slime converts it where a sample's routing cannot be replayed (``routing_error``,
  rows != tokens - 1, another layout, mixed weight versions), each refused sample named by slime's sample index,
  the code and the fix (``SlimeSampleError``; the installed fill checks what reaches it the same way);
  ``check_rollout`` / ``watch_responses`` for a rollout function of your own.
"""

from sglang_r3.trainer.slime.binding import ENABLE_ENV, LIVE_STAGE, REPLAY_FORWARD, STAGE_ENV, bind
from sglang_r3.trainer.slime.fill import LayerRows, SlimeFill, fill_routing_replay, layer_rows, upstream_moe_columns
from sglang_r3.trainer.slime.installer import (
    ERRORS_ATTR,
    HEALTH_ENV,
    INSTALL_PATH,
    RECORD_KEY,
    ROLLOUT_FUNCTION_PATH,
    ROUTING_ERROR_FIXES,
    SLIME_ACTOR_MODULE,
    SLIME_MODEL_MODULE,
    SampleProblem,
    SlimeInstall,
    SlimeInstallError,
    SlimeSampleError,
    check_rollout,
    generate_rollout,
    install,
    sample_problems,
    watch_responses,
)
from sglang_r3.trainer.slime.measure import SLIME_REPLAY_MODULE, health, health_counts
from sglang_r3.trainer.slime.ranks import step_health

__all__ = [
    "ENABLE_ENV", "ERRORS_ATTR", "HEALTH_ENV", "INSTALL_PATH", "LIVE_STAGE", "LayerRows", "RECORD_KEY",
    "REPLAY_FORWARD", "ROLLOUT_FUNCTION_PATH", "ROUTING_ERROR_FIXES", "SLIME_ACTOR_MODULE", "SLIME_MODEL_MODULE",
    "SLIME_REPLAY_MODULE", "STAGE_ENV", "SampleProblem", "SlimeFill", "SlimeInstall", "SlimeInstallError",
    "SlimeSampleError", "bind", "check_rollout", "fill_routing_replay", "generate_rollout", "health",
    "health_counts", "install", "layer_rows", "sample_problems", "step_health", "upstream_moe_columns",
    "watch_responses",
]
