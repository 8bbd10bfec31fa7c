"""The trainer model is checked against the layout; every difference is refused by name."""

from __future__ import annotations

import pytest

from replay_helpers import replace_layer, with_mtp
from sglang_r3.core.layout import ROLE_DENSE, ROLE_MOE, LayerInfo, ModelLayout
from sglang_r3.trainer import ModelMismatchError, ReplayFiller
from sglang_r3.trainer.diagnostics import find_routers

pytestmark = pytest.mark.fast


def _layout(base: ModelLayout, layers, num_hidden_layers=None, arch=None) -> ModelLayout:
    return ModelLayout(arch or base.architecture, num_hidden_layers or base.num_hidden_layers, tuple(layers))


def test_model_shaped_like_the_embedded_model_passes(gpt_mtp1, glm_layout):
    ReplayFiller(gpt_mtp1, glm_layout)


def test_decoder_layer_count_differs(gpt_mtp1, glm_layout):
    E, k = glm_layout.num_experts, glm_layout.topk
    layers = [LayerInfo(0, ROLE_DENSE)] + [LayerInfo(i, ROLE_MOE, None, E, k) for i in range(1, 5)]
    layers.append(LayerInfo(5, "mtp", 1, E, k))
    with pytest.raises(ModelMismatchError, match=r"decoder layers: trainer has 4, layout has 5"):
        ReplayFiller(gpt_mtp1, _layout(glm_layout, layers, num_hidden_layers=5))


def test_which_layers_are_moe_differs(gpt_mtp1, glm_layout):
    layout = replace_layer(glm_layout, 0, role=ROLE_MOE, num_experts=16, topk=4)
    with pytest.raises(ModelMismatchError, match=r"MoE layers: trainer has \[1, 2, 3\], layout has \[0, 1, 2, 3\]") as e:
        ReplayFiller(gpt_mtp1, layout)
    assert "layer 0: trainer has no router, layout calls it moe" in str(e.value)


def test_topk_differs(gpt_mtp1, glm_layout):
    layout = glm_layout
    for lid in (1, 2, 3, 4):
        layout = replace_layer(layout, lid, topk=2)
    with pytest.raises(ModelMismatchError, match=r"decoder\.layers\.1\.mlp\.router \(decoder, layer 1\): trainer top-4, layout top-2"):
        ReplayFiller(gpt_mtp1, layout)


def test_expert_count_differs(gpt_mtp1, glm_layout):
    layout = glm_layout
    for lid in (1, 2, 3, 4):
        layout = replace_layer(layout, lid, num_experts=8)
    with pytest.raises(ModelMismatchError, match=r"trainer has 16 experts, layout has 8"):
        ReplayFiller(gpt_mtp1, layout)


def test_mtp_layer_count_differs(gpt_mtp1, gpt_mtp3, glm_layout):
    with pytest.raises(ModelMismatchError, match=r"MTP layers: trainer has 1, layout has 3"):
        ReplayFiller(gpt_mtp1, with_mtp(glm_layout, 3))
    with pytest.raises(ModelMismatchError, match=r"MTP layers: trainer has 3, layout has 1"):
        ReplayFiller(gpt_mtp3, glm_layout)
    no_mtp = _layout(glm_layout, [l for l in glm_layout.layers if l.role != "mtp"])
    with pytest.raises(ModelMismatchError, match=r"MTP layers: trainer has 1, layout has 0"):
        ReplayFiller(gpt_mtp1, no_mtp)


def test_the_message_names_the_layout(gpt_mtp1, glm_layout):
    no_mtp = _layout(glm_layout, [l for l in glm_layout.layers if l.role != "mtp"])
    with pytest.raises(ModelMismatchError, match=no_mtp.fingerprint + r" \(Glm4MoeForCausalLM: 4 decoder layers") as e:
        ReplayFiller(gpt_mtp1, no_mtp)
    assert "mtp.layers.0.transformer_layer.mlp.router (MTP depth 1, layer 4): the layout has no layer 4" in str(e.value)


# --- numbering schemes: bind by place, not by number --------------------------------------------

class _Renumbered:
    """Give the real model megatron-core 0.19's MTP numbering for one test, then restore it."""

    def __init__(self, model):
        self.model = model
        self.saved = []

    def __enter__(self):
        for depth, mtp_layer in enumerate(self.model.mtp.layers, start=1):
            tl = mtp_layer.transformer_layer
            self.saved.append((tl, tl.layer_number, tl.mlp.router.layer_number))
            tl.layer_number = depth  # 0.19: MTP layers numbered k ...
            tl.is_mtp_layer = True  # ... and flagged
            tl.mlp.router.layer_number = depth
        for layer in self.model.decoder.layers:
            layer.is_mtp_layer = False
        return self.model

    def __exit__(self, *exc):
        for tl, n, rn in self.saved:
            tl.layer_number, tl.mlp.router.layer_number = n, rn
            del tl.is_mtp_layer
        for layer in self.model.decoder.layers:
            del layer.is_mtp_layer


def test_megatron_016_numbering_mtp_router_is_layer_L_plus_k(gpt_mtp3, mtp3_layout):
    sites = find_routers(gpt_mtp3, 4)
    mtp = [s for s in sites if s.is_mtp]
    assert [s.megatron_number for s in mtp] == [5, 6, 7]  # looks like decoder layers 5..7 by number
    assert [(s.layer_id, s.depth) for s in mtp] == [(4, 1), (5, 2), (6, 3)]
    assert [s.layer_id for s in sites if not s.is_mtp] == [1, 2, 3]


def test_megatron_019_numbering_mtp_router_is_k_with_is_mtp_layer(gpt_mtp3, mtp3_layout):
    with _Renumbered(gpt_mtp3):
        sites = find_routers(gpt_mtp3, 4)
        mtp = [s for s in sites if s.is_mtp]
        # By number alone MTP depth 1..3 would collide with decoder layers 0..2.
        assert [s.megatron_number for s in mtp] == [1, 2, 3]
        assert [(s.layer_id, s.depth) for s in mtp] == [(4, 1), (5, 2), (6, 3)]
        assert [s.layer_id for s in sites if not s.is_mtp] == [1, 2, 3]
        filler = ReplayFiller(gpt_mtp3, mtp3_layout)
        assert [s.layer_id for s in filler.decoder_sites] == [1, 2, 3]


def test_is_mtp_layer_on_a_decoder_layer_is_refused(gpt_mtp1):
    layer = gpt_mtp1.decoder.layers[2]
    layer.is_mtp_layer = True
    try:
        with pytest.raises(ModelMismatchError, match=r"decoder\.layers\.2\.mlp\.router .*is_mtp_layer=True but sits outside the MTP block"):
            find_routers(gpt_mtp1, 4)
    finally:
        del layer.is_mtp_layer


def test_pipeline_chunks_are_a_list(gpt_mtp1, glm_layout):
    """A list of chunks (virtual pipeline stages) is accepted; here one chunk."""
    filler = ReplayFiller([gpt_mtp1], glm_layout)
    assert {s.chunk for s in filler.sites} == {0}
