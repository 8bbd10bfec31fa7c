"""Real megatron-core models on CPU, shared per session (building imports megatron once)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from replay_helpers import embedded_layout, with_mtp  # noqa: E402
from megatron_cpu import TinyMoeSpec, build_gpt, init_megatron_cpu  # noqa: E402


@pytest.fixture(scope="session")
def megatron_cpu():
    init_megatron_cpu()


@pytest.fixture(scope="session")
def glm_layout():
    """The embedded GLM-4.7-style model's layout: 4 layers (dense, MoE x3), 16 experts top-4, 1 MTP."""
    return embedded_layout()


@pytest.fixture(scope="session")
def mtp3_layout(glm_layout):
    return with_mtp(glm_layout, 3)


@pytest.fixture(scope="session")
def gpt_mtp1(megatron_cpu):
    return build_gpt(TinyMoeSpec(mtp_layers=1))


@pytest.fixture(scope="session")
def gpt_mtp3(megatron_cpu):
    return build_gpt(TinyMoeSpec(mtp_layers=3), seed=4321)


@pytest.fixture(autouse=True)
def _fresh_replay_state(request):
    """Routers and Megatron's MTP tracker are process-global; leave them clean for the next test."""
    yield
    if "megatron_cpu" not in request.fixturenames:
        return
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler
    from megatron.core.transformer.moe.router_replay import RouterReplay
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    RouterReplay.clear_global_indices()
    RouterReplay.clear_global_router_replay_action()
    # Sized by the first model that logs; a 1-head and a 3-head model must not share it.
    MTPLossLoggingHelper.tracker.clear()
    # A plain backward leaves a 0-d scale here that Megatron's schedule later copies a [1] tensor into.
    MoEAuxLossAutoScaler.main_loss_backward_scale = None
    # Megatron's MoE layer-wise tracker is sized by the first model that logs, like the MTP one.
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    get_moe_layer_wise_logging_tracker().clear()
