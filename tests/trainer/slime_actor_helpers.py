"""slime's actor for the slime install tests (test_slime_install.py, test_slime_rollout.py): a training process with
the stand-in under slime's module names (the ``slime_trainer`` fixture), ``MegatronTrainRayActor.init`` with
``--custom-megatron-init-path sglang_r3.trainer.slime.install``, the checkpoints it reads the layout from
(``hf_checkpoints``) and slime's out-of-order microbatch schedule.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import slime_actor_reference as sar
import slime_reference as slime
from megatron_cpu import TinyMoeSpec, build_gpt, routers
from slime_helpers import GLM_STYLE, RECOMPUTE, STAGE
from sglang_r3.core import settings
from sglang_r3.trainer import slime as r3_slime
from sglang_r3.trainer.slime import INSTALL_PATH

MICRO_BATCH_INDICES = [[2], [4, 0], [1, 3]]
NUM_MICROBATCHES = [1, 2]


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory):
    """--hf-checkpoint per MTP count: the embedded GLM-style checkpoint's config (1 MTP layer), and the same
    with num_nextn_predict_layers=3 (config.json is what the layout is read from)."""
    from sglang_r3.dev.embedded import ensure_embedded_model

    one = str(ensure_embedded_model())
    three = tmp_path_factory.mktemp("glm_mtp3")
    cfg = json.load(open(os.path.join(one, "config.json")))
    cfg["num_nextn_predict_layers"] = 3
    (three / "config.json").write_text(json.dumps(cfg))
    return {1: one, 3: str(three)}


@pytest.fixture
def slime_trainer(megatron_cpu, monkeypatch):
    """A slime training process: the stand-in under slime's module names, ENABLE_ROUTING_REPLAY=1 (slime's
    actor_group.py sets it for the actor role), models built by MegatronTrainRayActor.init after init(args)."""
    undo = slime.install()
    undo_actor = sar.install_actor()
    original_topk_factory = slime.get_routing_replay_compute_topk
    monkeypatch.setenv("ENABLE_ROUTING_REPLAY", "1")
    monkeypatch.delenv(r3_slime.HEALTH_ENV, raising=False)
    settings.current.cache_clear()  # install reads SGLANG_R3_HEALTH once, as set by the test
    try:
        yield
    finally:
        settings.current.cache_clear()
        slime.get_routing_replay_compute_topk = original_topk_factory  # the health wrap is once per process
        try:
            undo_actor()
        finally:
            undo()
        os.environ.pop(STAGE, None)
        slime.RoutingReplay.all_routing_replays = []


def build_model(mtp_layers: int, seed: int):
    def build(args):
        model = build_gpt(TinyMoeSpec(mtp_layers=mtp_layers, routing_replay=False), seed=seed,
                          **GLM_STYLE, **RECOMPUTE)
        g = torch.Generator().manual_seed(seed)
        for _, r in routers(model):  # a trained GLM's bias moves the top-k
            r.expert_bias.copy_(torch.randn(r.expert_bias.shape, generator=g) * 0.05)
        return [model]

    return build


def start_actor(hf_checkpoints, mtp_layers, *, seed=41, **overrides):
    """slime's MegatronTrainRayActor.init with --custom-megatron-init-path sglang_r3.trainer.slime.install."""
    slime.RoutingReplay.all_routing_replays = []
    sar.BUILD_MODEL = build_model(mtp_layers, seed)
    kw = dict(custom_megatron_init_path=INSTALL_PATH, hf_checkpoint=hf_checkpoints[mtp_layers],
              mtp_num_layers=mtp_layers)
    kw.update(overrides)
    actor = sar.MegatronTrainRayActor()
    actor.init(sar.default_args(**kw))
    return actor
