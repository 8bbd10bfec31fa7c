"""ModelLayout from the published config.json of each supported family.

Fixtures under tests/data/configs/ are trimmed copies of real configs (values
as published; ``_source`` says where each was read). The expected layouts are
what SGLang 0.5.23 builds for them, so a routing record's rows line up.
"""

import copy
import json
import re
from pathlib import Path

import pytest

from sglang_r3.core.layout import (
    ROLE_DENSE,
    ROLE_MOE,
    ROLE_MTP,
    LayerInfo,
    LayoutError,
    ModelLayout,
    config_digest,
    layout_from_hf_config,
    layout_from_model_path,
)

pytestmark = pytest.mark.fast

CONFIGS = Path(__file__).parent / "data" / "configs"


def load(name):
    return json.loads((CONFIGS / f"{name}.json").read_text())


# name -> (architecture, L, first dense layers, experts, top-k, MTP layers, MTP is MoE)
FAMILIES = {
    "glm4_5": ("Glm4MoeForCausalLM", 92, 3, 160, 8, 1, True),
    "glm4_7": ("Glm4MoeForCausalLM", 92, 3, 160, 8, 1, True),
    "deepseek_v3": ("DeepseekV3ForCausalLM", 61, 3, 256, 8, 1, True),
    "qwen3_30b_a3b": ("Qwen3MoeForCausalLM", 48, 0, 128, 8, 0, True),
    "qwen3_next_80b_a3b_instruct": ("Qwen3NextForCausalLM", 48, 0, 512, 10, 1, True),
    "qwen3_5_35b_a3b": ("Qwen3_5MoeForConditionalGeneration", 40, 0, 256, 8, 1, True),
    "mimo_7b": ("MiMoForCausalLM", 36, 36, 0, 0, 2, False),
    "mixtral_8x7b": ("MixtralForCausalLM", 32, 0, 8, 2, 0, True),
}


# Hybrid families whose MoE layers follow a per-block pattern: name -> (architecture, MoE layer ids, experts, top-k).
PATTERN_FAMILIES = {
    # Nemotron-3-Nano: 52 blocks of MEMEM*EMEMEM*..., MoE at the 23 E blocks (Megatron numbers every block a layer)
    "nemotron_3_nano_30b_a3b": ("NemotronHForCausalLM", (1, 3, 6, 8, 10, 13, 15, 17, 20, 22, 24, 27, 29, 31, 34, 36,
                                                        38, 40, 43, 45, 47, 49, 51), 128, 6),
}


def test_every_fixture_names_its_source():
    names = {p.stem for p in CONFIGS.glob("*.json")}
    assert names == set(FAMILIES) | set(PATTERN_FAMILIES)
    for name in names:
        assert load(name)["_source"].strip()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_published_layout(name):
    arch, L, first_dense, E, k, n_mtp, mtp_moe = FAMILIES[name]
    layout = layout_from_hf_config(load(name))

    assert layout.architecture == arch
    assert layout.num_hidden_layers == L
    roles = [l.role for l in layout.layers]
    assert roles == [ROLE_DENSE] * first_dense + [ROLE_MOE] * (L - first_dense) + [ROLE_MTP] * n_mtp
    assert layout.moe_layer_ids == tuple(range(first_dense, L))
    for l in layout.moe_layers:
        assert (l.num_experts, l.topk) == (E, k)

    assert layout.num_mtp_layers == n_mtp
    assert [l.id for l in layout.mtp_layers] == list(range(L, L + n_mtp))
    assert [l.depth for l in layout.mtp_layers] == list(range(1, n_mtp + 1))
    for l in layout.mtp_layers:
        assert (l.num_experts, l.topk) == ((E, k) if mtp_moe else (0, 0))

    assert layout.num_experts == E
    assert layout.topk == k
    assert layout.expert_dtype == ("uint8" if E <= 256 else "uint16")


def test_expert_dtype_boundary_uses_real_configs():
    # 256 experts (DeepSeek-V3, Qwen3.5-35B-A3B) still fit uint8; 512 do not.
    assert layout_from_hf_config(load("deepseek_v3")).expert_dtype == "uint8"
    assert layout_from_hf_config(load("qwen3_5_35b_a3b")).expert_dtype == "uint8"
    assert layout_from_hf_config(load("qwen3_next_80b_a3b_instruct")).expert_dtype == "uint16"


@pytest.mark.parametrize("name", sorted(PATTERN_FAMILIES))
def test_published_pattern_layout(name):
    arch, moe, E, k = PATTERN_FAMILIES[name]
    layout = layout_from_hf_config(load(name))
    assert layout.architecture == arch and layout.num_hidden_layers == len(load(name)["hybrid_override_pattern"])
    assert layout.moe_layer_ids == moe and layout.num_mtp_layers == 0
    assert all((l.num_experts, l.topk) == (E, k) for l in layout.moe_layers)
    assert all(l.role == ROLE_DENSE for l in layout.layers if l.id not in moe)


def _nemotron(**changes):
    cfg = {k: v for k, v in load("nemotron_3_nano_30b_a3b").items() if not k.startswith("_")}
    return {**cfg, **changes}


def test_nemotron_h_block_types_in_every_spelling_are_one_layout():
    # SGLang's pattern string, its layers_block_type names (what its save_pretrained writes) and transformers 5's
    # (linear_attention / full_attention; SGLang 0.5.23 cannot load those, but a trainer reads them): one layout,
    # one fingerprint. num_hidden_layers is the pattern's length whatever the file says (both classes).
    hub = _nemotron()
    names = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
    pattern = hub["hybrid_override_pattern"]
    sglang = {**{k: v for k, v in hub.items() if k != "hybrid_override_pattern"},
              "layers_block_type": [names[c] for c in pattern]}
    hf = {**sglang, "layers_block_type": [{"mamba": "linear_attention", "attention": "full_attention"}.get(t, t)
                                          for t in sglang["layers_block_type"]], "num_hidden_layers": 7}
    a, b, c = (layout_from_hf_config(x) for x in (hub, sglang, hf))
    assert a == b == c and a.fingerprint == b.fingerprint == c.fingerprint
    # layers_block_type wins over the pattern where both are given (both classes)
    both = layout_from_hf_config({**hub, "layers_block_type": ["mamba", "moe"]})
    assert both.num_hidden_layers == 2 and both.moe_layer_ids == (1,)


@pytest.mark.parametrize("change, words", [
    ({"num_nextn_predict_layers": 2}, "num_nextn_predict_layers=2"),  # nemotron_h_mtp.py asserts one
    ({"num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "M*E"}, "attention and MoE blocks only"),
    ({"num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*EE"}, "2 MoE blocks in one MTP layer"),
    ({"n_shared_experts": 2}, "n_shared_experts=2"),
    ({"mlp_hidden_act": "silu"}, "mlp_hidden_act='silu'"),
    ({"mamba_hidden_act": "gelu"}, "mamba_hidden_act='gelu'"),
    ({"mlp_bias": True}, "mlp_bias=True"),
    ({"sliding_window": 4096}, "sliding_window=4096"),
    ({"n_groups": 4}, "n_groups=4 but mamba_n_groups=8"),  # SGLang's mixer takes mamba_n_groups (default 8)
    ({"layer_types": ["mamba"] * 52}, "layer_types"),
])
def test_nemotron_h_configs_sglang_and_transformers_build_differently_are_refused_naming_the_key(change, words):
    with pytest.raises(LayoutError, match=re.escape(words)):
        layout_from_hf_config(_nemotron(**change))


@pytest.mark.parametrize("mtp", [{}, {"mtp_hybrid_override_pattern": "*E"},
                                 {"mtp_layers_block_type": ["attention", "moe"]}])
def test_nemotron_h_mtp_head_as_ultra_publishes_it_is_one_moe_mtp_layer_after_the_decoder(mtp):
    # Nemotron-3-Ultra: num_nextn_predict_layers 1, its head attention then MoE ("*E", SGLang's class default too):
    # one MTP layer whose router is the MoE block's (served with speculation on: tests/test_families.py nemotron_h).
    nano = layout_from_hf_config(_nemotron())
    ultra = layout_from_hf_config(_nemotron(num_nextn_predict_layers=1, **mtp))
    assert ultra.moe_layer_ids == nano.moe_layer_ids and nano.num_mtp_layers == 0
    assert [(l.id, l.depth, l.num_experts, l.topk) for l in ultra.mtp_layers] == [
        (nano.num_hidden_layers, 1, nano.num_experts, nano.topk)]
    # a head of attention only: a dense MTP layer (no router)
    dense = layout_from_hf_config(_nemotron(num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*"))
    assert [l.num_experts for l in dense.mtp_layers] == [0]


def test_nemotron_h_mixer_groups_given_in_both_spellings_that_agree_are_served():
    assert layout_from_hf_config(_nemotron(n_groups=4, mamba_n_groups=4)).moe_layer_ids == \
        layout_from_hf_config(_nemotron()).moe_layer_ids


def test_qwen_linear_attention_layers_are_still_moe():
    # Qwen3.5 / Qwen3-Next interleave linear and full attention; SGLang builds
    # a sparse MoE block in both kinds of layer.
    cfg = load("qwen3_5_35b_a3b")
    assert "linear_attention" in cfg["text_config"]["layer_types"]
    layout = layout_from_hf_config(cfg)
    assert len(layout.moe_layer_ids) == cfg["text_config"]["num_hidden_layers"]


def test_qwen3_next_has_one_mtp_layer_though_its_config_declares_none():
    cfg = load("qwen3_next_80b_a3b_instruct")
    assert "num_nextn_predict_layers" not in cfg and "mtp_num_hidden_layers" not in cfg
    assert layout_from_hf_config(cfg).num_mtp_layers == 1
    # An explicit count still wins, including 0.
    assert layout_from_hf_config({**cfg, "num_nextn_predict_layers": 0}).num_mtp_layers == 0


def test_qwen3_5_text_only_checkpoint_matches_the_wrapped_one():
    wrapped = load("qwen3_5_35b_a3b")
    flat = {**wrapped["text_config"], "architectures": ["Qwen3_5MoeForCausalLM"]}
    a, b = layout_from_hf_config(wrapped), layout_from_hf_config(flat)
    assert [(l.id, l.role, l.depth, l.num_experts, l.topk) for l in a.layers] == [
        (l.id, l.role, l.depth, l.num_experts, l.topk) for l in b.layers
    ]


def test_deepseek_moe_layer_freq_other_than_one_is_refused_and_glm_ignores_it():
    # deepseek_v2.py checks layer % moe_layer_freq; transformers' DeepSeek-V2/V3 modeling does not (MoE iff
    # layer >= first_k_dense_replace): no layout both serve. glm4_moe.py ignores it, as transformers does.
    for name, arch in (("deepseek_v3", "DeepseekV3ForCausalLM"), ("deepseek_v3", "DeepseekV2ForCausalLM")):
        with pytest.raises(LayoutError, match=rf"{arch}: moe_layer_freq=2.*transformers.*disagree"):
            layout_from_hf_config({**load(name), "architectures": [arch], "model_type": None, "moe_layer_freq": 2})
    assert layout_from_hf_config({**load("deepseek_v3"), "moe_layer_freq": 1}) == layout_from_hf_config(
        load("deepseek_v3"))
    glm = {**load("glm4_7"), "moe_layer_freq": 2}
    assert layout_from_hf_config(glm).moe_layer_ids == tuple(range(3, 92))


# GLM-4.7-Flash (zai-org/GLM-4.7-Flash: 47 layers, first_k_dense_replace=1, 64 experts, top-4, one NextN layer),
# GLM-5 (zai-org/GLM-5: 78 layers, first_k_dense_replace=3, 256 experts, top-8, one NextN layer),
# DeepSeek-V3.2 (61 layers as V3). The sweep (tests/test_sweep.py) proves the rules on SGLang's module tree.
_MLA_DSA = {
    "glm4_7_flash": {"architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite",
                     "num_hidden_layers": 47, "first_k_dense_replace": 1, "n_routed_experts": 64,
                     "num_experts_per_tok": 4, "num_nextn_predict_layers": 1, "topk_method": "noaux_tc"},
    "glm5": {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "num_hidden_layers": 78,
             "first_k_dense_replace": 3, "n_routed_experts": 256, "num_experts_per_tok": 8,
             "num_nextn_predict_layers": 1, "moe_layer_freq": 1},
    "deepseek_v3_2": {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
                      "num_hidden_layers": 61, "first_k_dense_replace": 3, "n_routed_experts": 256,
                      "num_experts_per_tok": 8, "num_nextn_predict_layers": 1, "moe_layer_freq": 1,
                      "index_topk": 2048},
}


@pytest.mark.parametrize("name, L, first_dense, E, k", [("glm4_7_flash", 47, 1, 64, 4), ("glm5", 78, 3, 256, 8),
                                                         ("deepseek_v3_2", 61, 3, 256, 8)])
def test_mla_dsa_families_first_k_dense_and_one_moe_nextn_layer(name, L, first_dense, E, k):
    cfg = _MLA_DSA[name]
    layout = layout_from_hf_config(cfg)
    assert layout.moe_layer_ids == tuple(range(first_dense, L)) and (layout.num_experts, layout.topk) == (E, k)
    assert [(l.id, l.depth, l.num_experts, l.topk) for l in layout.mtp_layers] == [(L, 1, E, k)]
    # transformers' spelling of the same layers (mlp_layer_types) is the same model
    types = ["dense"] * first_dense + ["sparse"] * (L - first_dense)
    same = layout_from_hf_config({**cfg, "mlp_layer_types": types})
    assert same == layout and same.fingerprint == layout.fingerprint
    # ... and one that says otherwise is refused: SGLang builds from first_k_dense_replace
    with pytest.raises(LayoutError, match="mlp_layer_types=.*disagree with first_k_dense_replace"):
        layout_from_hf_config({**cfg, "mlp_layer_types": ["dense"] * (first_dense + 1) + ["sparse"] * (L - first_dense - 1)})


def test_glm47_flash_needs_first_k_dense_replace_which_its_transformers_class_does_not_define():
    cfg = dict(_MLA_DSA["glm4_7_flash"])
    del cfg["first_k_dense_replace"]
    with pytest.raises(LayoutError, match="Glm4MoeLiteForCausalLM config is missing 'first_k_dense_replace'"):
        layout_from_hf_config(cfg)
    # transformers' default mlp_layer_types (layer 0 dense) disagree with first_k_dense_replace=2
    with pytest.raises(LayoutError, match="disagree with first_k_dense_replace"):
        layout_from_hf_config({**_MLA_DSA["glm4_7_flash"], "first_k_dense_replace": 2})


def test_glm5_and_deepseek_v3_2_refuse_moe_layer_freq_other_than_one():
    for cfg in (_MLA_DSA["glm5"], _MLA_DSA["deepseek_v3_2"]):
        with pytest.raises(LayoutError, match="moe_layer_freq=2"):
            layout_from_hf_config({**cfg, "moe_layer_freq": 2})


@pytest.mark.parametrize("override", [{"decoder_sparse_step": 2}, {"mlp_only_layers": [0]}])
def test_qwen_dense_layers_are_refused(override):
    # transformers would make those layers dense; SGLang builds them MoE anyway.
    with pytest.raises(LayoutError, match="SGLang builds every"):
        layout_from_hf_config({**load("qwen3_30b_a3b"), **override})


@pytest.mark.parametrize("override, refused", [
    ({"use_sliding_window": True, "sliding_window": 8}, True),
    ({"use_sliding_window": True, "sliding_window": 262144}, False),  # a window as long as the context masks nothing
    ({"use_sliding_window": False, "sliding_window": 8}, False),  # the class keeps no window then
])
def test_qwen3_moe_sliding_window_sglang_does_not_read_is_refused(override, refused):
    # The held-out variant issue 52 found served with other rows: transformers' Qwen3-MoE windows every layer,
    # SGLang's qwen3_moe.py attends to every key.
    cfg = {**load("qwen3_30b_a3b"), **override}
    if refused:
        with pytest.raises(LayoutError, match="use_sliding_window=True with sliding_window=8"):
            layout_from_hf_config(cfg)
    else:
        layout_from_hf_config(cfg)


def _sglang_config(directory, cfg):
    """The config object SGLang's own loader resolves from a folder holding ``cfg``."""
    pytest.importorskip("sglang")
    from sglang.srt.utils.hf_transformers.config import get_config

    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg))
    return get_config(str(directory), trust_remote_code=False)


def _published(name):
    return {k: v for k, v in load(name).items() if not k.startswith("_")}


SERVED_FIXTURES = sorted(n for n in [*FAMILIES, *PATTERN_FAMILIES] if n != "mimo_7b")  # MiMo's class is remote code


@pytest.mark.parametrize("name", SERVED_FIXTURES)
@pytest.mark.sglang  # SGLang's own config loader is the oracle
def test_config_object_sglang_resolves_gives_the_file_layout(tmp_path, name):
    # SGLang's object has every default filled, (transformers 5) rope_theta folded into
    # rope_parameters and attribute-mapped names; layout and fingerprint are still the file's.
    cfg = _published(name)
    obj = _sglang_config(tmp_path / "m", cfg)
    a, b = layout_from_hf_config(obj), layout_from_hf_config(cfg)
    assert a == b and a.fingerprint == b.fingerprint


@pytest.mark.parametrize("name", ["deepseek_v3", "glm4_5", "glm4_7", "mixtral_8x7b", "qwen3_30b_a3b"])
def test_transformers_autoconfig_object_gives_the_file_layout(tmp_path, name):
    # For these families SGLang builds transformers' own class, so a trainer's AutoConfig agrees too.
    transformers = pytest.importorskip("transformers")
    cfg = _published(name)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    obj = transformers.AutoConfig.from_pretrained(str(tmp_path))
    assert layout_from_hf_config(obj).fingerprint == layout_from_hf_config(cfg).fingerprint


def test_hf_config_object_built_without_a_file_gives_the_layout_of_its_values():
    transformers = pytest.importorskip("transformers")
    cfg = _published("deepseek_v3")
    obj = transformers.DeepseekV3Config(**cfg)
    assert layout_from_hf_config(obj).fingerprint == layout_from_hf_config(cfg).fingerprint


@pytest.mark.sglang  # SGLang's own config loader is the oracle
def test_hf_config_object_changed_after_loading_gets_the_fingerprint_of_what_it_is(tmp_path):
    # e.g. SGLang's --json-model-override-args: the server serves the object, so its layout is the
    # object's; a trainer holding the file's layout then refuses those records (they are of another model).
    cfg = _published("deepseek_v3")
    obj = _sglang_config(tmp_path / "m", cfg)
    obj.topk_group = 2
    changed = layout_from_hf_config(obj)
    assert changed.fingerprint != layout_from_hf_config(cfg).fingerprint
    assert changed.fingerprint == layout_from_hf_config({**cfg, "topk_group": 2}).fingerprint


# One model, every spelling ------------------------------------------------------

# The attribute-map aliases of each family's config class (transformers 5.19), renamed by hand:
# what transformers 5 save_pretrained (Qwen3-MoE: num_local_experts) or an exporter may write.
ALIAS_SPELLINGS = {
    "glm4_5": {"n_routed_experts": "num_local_experts", "num_nextn_predict_layers": "num_mtp_layers"},
    "glm4_7": {"n_routed_experts": "num_local_experts", "num_nextn_predict_layers": "num_mtp_layers"},
    "deepseek_v3": {"n_routed_experts": "num_local_experts", "num_nextn_predict_layers": "num_mtp_layers"},
    "qwen3_30b_a3b": {"num_experts": "num_local_experts"},
    "mixtral_8x7b": {"num_local_experts": "num_experts"},
}


def _respelled(cfg, renames):
    inner = cfg.get("text_config") or cfg
    for old, new in renames.items():
        inner[new] = inner.pop(old)
    return cfg


@pytest.mark.parametrize("name", sorted(ALIAS_SPELLINGS))
def test_each_family_rule_reads_both_spellings_of_its_keys(name):
    hub = layout_from_hf_config(_published(name))
    respelled = layout_from_hf_config(_respelled(_published(name), ALIAS_SPELLINGS[name]))
    assert respelled == hub and respelled.fingerprint == hub.fingerprint


@pytest.mark.parametrize(
    "name, renames",
    [
        # transformers 5 folds rope_theta into rope_parameters; 4.x wrote rope_theta / rope_scaling.
        ("qwen3_5_35b_a3b", {}),
        ("qwen3_next_80b_a3b_instruct", {}),
    ],
)
def test_qwen_hybrid_families_read_layer_types_or_full_attention_interval(name, renames):
    cfg = _published(name)
    inner = cfg.get("text_config") or cfg
    interval, L = inner["full_attention_interval"], inner["num_hidden_layers"]
    as_layer_types = copy.deepcopy(cfg)
    t = as_layer_types.get("text_config") or as_layer_types
    t.pop("full_attention_interval")
    t["layer_types"] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(L)]
    t["rope_parameters"] = {"rope_type": "default", "rope_theta": t.pop("rope_theta", 10000.0)}
    a, b = layout_from_hf_config(cfg), layout_from_hf_config(as_layer_types)
    assert a == b and a.fingerprint == b.fingerprint


# A served transformers-5 Qwen3-MoE checkpoint (num_local_experts) starting and routing, with its
# rows equal to transformers' routers: tests/test_families.py (qwen3_moe).


def _bridge_style(directory, name):
    """A stand-in for a megatron-bridge export: the bridge builds the HF config through the family's
    config class from the values it maps (in the class's constructor spelling, alias names included),
    adds its dtype, and saves it with save_pretrained."""
    transformers = pytest.importorskip("transformers")
    cfg = _published(name)
    cls = transformers.CONFIG_MAPPING[cfg["model_type"]]
    kwargs = _respelled(copy.deepcopy(cfg), ALIAS_SPELLINGS.get(name, {}))
    kwargs.pop("model_type")
    obj = cls(**kwargs, dtype="bfloat16")
    obj.save_pretrained(str(directory))
    return json.loads((directory / "config.json").read_text())


@pytest.mark.parametrize("name", SERVED_FIXTURES)
@pytest.mark.sglang  # SGLang's own config loader is the oracle
def test_hub_save_pretrained_and_bridge_exports_give_one_layout(tmp_path, name):
    hub = _published(name)
    obj = _sglang_config(tmp_path / "m", hub)
    obj.save_pretrained(str(tmp_path / "saved"))
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    spellings = {"hub": hub, "save_pretrained": saved}
    if name in ALIAS_SPELLINGS:  # families SGLang builds with transformers' own class
        spellings["bridge"] = _bridge_style(tmp_path / "bridge", name)
    layouts = {k: layout_from_hf_config(v) for k, v in spellings.items()}
    assert {k: l.fingerprint for k, l in layouts.items()} == {k: layouts["hub"].fingerprint for k in layouts}
    assert all(l == layouts["hub"] for l in layouts.values())
    if name == "qwen3_30b_a3b":  # the spelling that used to stop the scheduler
        assert "num_local_experts" in saved and "num_experts" not in saved


def test_layout_from_model_path(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(load("mixtral_8x7b")))
    assert layout_from_model_path(str(tmp_path)) == layout_from_hf_config(load("mixtral_8x7b"))


# Fingerprint and wire form -------------------------------------------------


@pytest.mark.parametrize("name", sorted([*FAMILIES, *PATTERN_FAMILIES]))
def test_fingerprint_is_stable_and_round_trips(name):
    a = layout_from_hf_config(load(name))
    b = layout_from_hf_config(copy.deepcopy(load(name)))
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 16

    wire = json.loads(json.dumps(a.to_dict()))
    back = ModelLayout.from_dict(wire)
    assert back == a and back.fingerprint == a.fingerprint


def test_fingerprint_changes_with_one_layer_role():
    a = layout_from_hf_config(load("glm4_7"))
    layers = list(a.layers)
    layers[3] = LayerInfo(3, ROLE_DENSE)  # first MoE layer made dense
    b = ModelLayout(a.architecture, a.num_hidden_layers, tuple(layers), config_digest=a.config_digest)
    assert b.fingerprint != a.fingerprint
    # Source-level change too: one more dense layer, the same layers as b.
    c = layout_from_hf_config({**load("glm4_7"), "first_k_dense_replace": 4})
    assert c.layers == b.layers and c.fingerprint != a.fingerprint


def test_values_equal_to_the_class_default_are_the_same_config():
    # GLM-4.7 writes n_group = topk_group = 1, Glm4MoeConfig's defaults that GLM-4.5 leaves implicit:
    # SGLang and transformers build the same router for both, so they share a fingerprint.
    a, b = layout_from_hf_config(load("glm4_5")), layout_from_hf_config(load("glm4_7"))
    assert (load("glm4_7")["n_group"], load("glm4_7")["topk_group"]) == (1, 1) and "n_group" not in load("glm4_5")
    assert a == b and a.fingerprint == b.fingerprint


def test_same_shape_different_routing_config_differs():
    a = layout_from_hf_config(load("glm4_7"))
    b = layout_from_hf_config({**load("glm4_7"), "n_group": 4, "topk_group": 2})
    assert a.layers == b.layers
    assert a.config_digest != b.config_digest and a.fingerprint != b.fingerprint and a != b


def _with(name, key, value):
    cfg = load(name)
    (cfg.get("text_config") or cfg)[key] = value
    return cfg


@pytest.mark.parametrize(
    "name, key, a, b",
    [
        ("deepseek_v3", "routed_scaling_factor", 2.5, 1.0),
        ("deepseek_v3", "norm_topk_prob", True, False),
        ("deepseek_v3", "scoring_func", "sigmoid", "softmax"),
        ("deepseek_v3", "topk_group", 4, 8),
        ("deepseek_v3", "rope_scaling", {"type": "yarn", "factor": 40}, {"type": "yarn", "factor": 4}),
        ("qwen3_30b_a3b", "norm_topk_prob", True, False),
        ("qwen3_5_35b_a3b", "linear_num_value_heads", 32, 16),
    ],
)
def test_configs_differing_in_one_routing_value_have_different_fingerprints(name, key, a, b):
    la, lb = layout_from_hf_config(_with(name, key, a)), layout_from_hf_config(_with(name, key, b))
    assert la.layers == lb.layers and la.fingerprint != lb.fingerprint


@pytest.mark.parametrize(
    "key, a, b",
    [
        ("torch_dtype", "bfloat16", "float32"),
        ("dtype", "bfloat16", "float32"),
        ("transformers_version", "4.54.0", "5.19.0"),
        ("_name_or_path", "zai-org/GLM-4.5", "/somewhere/else"),
        ("use_cache", True, False),
        ("bos_token_id", 0, 12345),
        ("eos_token_id", 1, [1, 2]),
        ("quantization_config", None, {"quant_method": "fp8"}),
        ("aux_loss_alpha", 0.001, 0.5),
    ],
)
def test_numerics_and_bookkeeping_do_not_change_the_fingerprint(key, a, b):
    # A bf16 and an fp32 copy of one checkpoint route the same way by construction.
    la, lb = layout_from_hf_config(_with("deepseek_v3", key, a)), layout_from_hf_config(_with("deepseek_v3", key, b))
    assert la.fingerprint == lb.fingerprint


def test_absent_and_null_keys_are_the_same_where_the_class_has_no_default():
    base = load("glm4_5")
    assert "scoring_func" not in base  # not a Glm4MoeConfig field
    assert layout_from_hf_config({**base, "scoring_func": None}).fingerprint == layout_from_hf_config(base).fingerprint


def test_embedded_model_dir_raw_json_and_transformers_agree():
    from sglang_r3.dev.embedded import ensure_embedded_model

    model_dir = ensure_embedded_model()
    raw = json.loads((model_dir / "config.json").read_text())
    a = layout_from_model_path(str(model_dir))
    assert a == layout_from_hf_config(raw) and a.config_digest == config_digest(raw) and a.config_digest
    transformers = pytest.importorskip("transformers")
    assert layout_from_hf_config(transformers.AutoConfig.from_pretrained(str(model_dir))).fingerprint == a.fingerprint


def test_config_digest_travels_with_the_layout():
    a = layout_from_hf_config(load("glm4_7"))
    d = json.loads(json.dumps(a.to_dict()))
    assert d["config_digest"] == a.config_digest
    d["config_digest"] = layout_from_hf_config({**load("glm4_7"), "topk_group": 2}).config_digest
    with pytest.raises(LayoutError, match="does not match"):
        ModelLayout.from_dict(d)
    del d["config_digest"]  # a layout from a server that does not send it
    with pytest.raises(LayoutError, match="does not match"):
        ModelLayout.from_dict(d)


def test_tampered_fingerprint_is_rejected():
    d = layout_from_hf_config(load("deepseek_v3")).to_dict()
    d["layers"][3]["role"] = ROLE_DENSE
    d["layers"][3]["num_experts"] = d["layers"][3]["topk"] = 0
    with pytest.raises(LayoutError, match="does not match"):
        ModelLayout.from_dict(d)


# Errors -------------------------------------------------------------------


def test_unknown_architecture():
    with pytest.raises(LayoutError, match="no layout rule for architecture 'LlamaForCausalLM'.*Glm4MoeForCausalLM"):
        layout_from_hf_config({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32})


def test_missing_architectures():
    with pytest.raises(LayoutError, match="no 'architectures'.*'deepseek_v3'"):
        layout_from_hf_config({"model_type": "deepseek_v3", "num_hidden_layers": 61})


@pytest.mark.parametrize(
    "name, key",
    [
        ("glm4_5", "first_k_dense_replace"),
        ("deepseek_v3", "n_routed_experts"),
        ("qwen3_30b_a3b", "num_experts_per_tok"),
        ("mixtral_8x7b", "num_local_experts"),
    ],
)
@pytest.mark.sglang  # SGLang's own config loader is the oracle
def test_missing_key_takes_the_class_default_as_sglang_does(tmp_path, name, key):
    cfg = _published(name)
    del cfg[key]
    assert layout_from_hf_config(cfg) == layout_from_hf_config(_sglang_config(tmp_path / "m", cfg))


@pytest.mark.sglang  # SGLang's own config loader is the oracle
def test_missing_key_inside_text_config_takes_the_text_class_default(tmp_path):
    cfg = _published("qwen3_5_35b_a3b")
    del cfg["text_config"]["num_experts"]
    layout = layout_from_hf_config(cfg)
    assert layout.num_experts == 512  # SGLang's Qwen3_5MoeTextConfig default
    assert layout == layout_from_hf_config(_sglang_config(tmp_path / "m", cfg))


@pytest.mark.parametrize(
    "cfg, key",
    [
        ({**load("mimo_7b")}, "num_hidden_layers"),  # MiMo's class is remote code: raw keys only
        ({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "a_fork", "num_hidden_layers": 2}, "num_experts"),
    ],
)
def test_missing_key_without_a_known_config_class_names_the_key(cfg, key):
    cfg = dict(cfg)
    cfg.pop(key, None)
    with pytest.raises(LayoutError, match=f"{cfg['architectures'][0]} config is missing '{key}'"):
        layout_from_hf_config(cfg)


def test_malformed_wire_layout():
    with pytest.raises(LayoutError, match="malformed layout"):
        ModelLayout.from_dict({"architecture": "x", "layers": []})



# -- Step-3.5 (multi-layer MTP; served in tests/test_multi_layer_mtp.py) ----------------------------------


def _step3p5(**changes):
    from tests.support.step3p5 import config

    return {**config(), **changes}


def test_step3p5_layout_reads_moe_layers_enum_and_has_one_moe_layer_per_mtp_depth():
    from tests.support.step3p5 import DENSE_LAYERS, NUM_EXPERTS, NUM_LAYERS, NUM_MTP, TOPK

    layout = layout_from_hf_config(_step3p5())
    assert layout.num_hidden_layers == NUM_LAYERS
    assert [l.id for l in layout.layers if l.role == ROLE_DENSE] == list(DENSE_LAYERS)
    assert [(l.id, l.depth, l.num_experts, l.topk) for l in layout.mtp_layers] == [
        (NUM_LAYERS + j, j + 1, NUM_EXPERTS, TOPK) for j in range(NUM_MTP)
    ]
    # moe_layers_enum as a list (the class default's spelling) and share_expert_dims under its stored name
    cfg = _step3p5()
    cfg["moe_layers_enum"] = [int(x) for x in cfg["moe_layers_enum"].split(",")]
    cfg["share_expert_dim"] = cfg.pop("share_expert_dims")
    assert layout_from_hf_config(cfg) == layout and layout_from_hf_config(cfg).fingerprint == layout.fingerprint


def test_step3p5_mtp_layers_are_dense_when_layer_45_is():
    enum = ",".join(str(i) for i in range(1, 45))  # the class default's range: no MTP layer listed
    layout = layout_from_hf_config(_step3p5(moe_layers_enum=enum))
    assert [l.has_router for l in layout.mtp_layers] == [False, False, False]


def test_step3p5_mtp_layers_sglang_would_build_otherwise_are_refused():
    # 45 MoE, 46/47 dense: SGLang 0.5.23 builds all three MTP layers as layer 45.
    with pytest.raises(LayoutError, match=r"MTP layers \[45\] MoE and \[46, 47\] dense.*as layer 45"):
        layout_from_hf_config(_step3p5(moe_layers_enum=",".join(str(i) for i in range(1, 46))))
    with pytest.raises(LayoutError, match="num_hidden_layers=44.*as layer 45"):
        layout_from_hf_config(_step3p5(num_hidden_layers=44))


def test_minimax_m2_every_layer_moe_and_longcat_zero_experts_refused_by_name():
    # MiniMax-M2 as published (62 layers, 256 experts, top-8); the sweep (tests/test_sweep.py) proves the rule
    # against SGLang's module tree.
    cfg = {"architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "num_hidden_layers": 62,
           "num_local_experts": 256, "num_experts_per_tok": 8, "scoring_func": "sigmoid", "use_routing_bias": True,
           "use_qk_norm": True, "qk_norm_type": "per_layer"}
    layout = layout_from_hf_config(cfg)
    assert layout.moe_layer_ids == tuple(range(62)) and (layout.num_experts, layout.topk) == (256, 8)
    assert layout.num_mtp_layers == 0
    # transformers always normalises q/k, adds its selection bias and takes the sigmoid; SGLang only as the config
    # says: any other value refused (served with use_routing_bias false: tests/family_specs/specs.py's variant)
    with pytest.raises(LayoutError, match="use_qk_norm=None.*transformers' MiniMaxM2 always"):
        layout_from_hf_config({k: v for k, v in cfg.items() if k != "use_qk_norm"})
    # partial RoPE as published (rotary_dim 64 of head_dim 128), as transformers 5.19 saves it (both), refused when
    # SGLang's rotary_dim and transformers' factor disagree
    half = {**cfg, "head_dim": 128, "rotary_dim": 64}
    assert layout_from_hf_config(half).moe_layer_ids == layout.moe_layer_ids
    assert layout_from_hf_config({**half, "partial_rotary_factor": 0.5}).moe_layer_ids == layout.moe_layer_ids
    for bad in ({**cfg, "partial_rotary_factor": 0.5}, {**half, "partial_rotary_factor": 1.0}):
        with pytest.raises(LayoutError, match="SGLang .minimax_m2.py. rotates rotary_dim="):
            layout_from_hf_config(bad)
    for key, value in (("use_routing_bias", False), ("use_routing_bias", None), ("scoring_func", "softmax")):
        with pytest.raises(LayoutError, match=f"{key}={value!r}.*transformers' MiniMaxM2 always"):
            layout_from_hf_config({**cfg, key: value} if value is not None else
                                  {k: v for k, v in cfg.items() if k != key})
    with pytest.raises(LayoutError, match="'LongcatFlashForCausalLM'.*zero-computation"):
        layout_from_hf_config({"architectures": ["LongcatFlashForCausalLM"], "num_hidden_layers": 28})


# Published configs of the newer families (values as their model cards' config.json give them); the sweep
# (tests/test_sweep.py) proves each rule on SGLang's and transformers' module trees from a tiny config.
def test_gpt_oss_every_layer_moe():
    # openai/gpt-oss-120b: 36 layers, 128 experts, top-4 (experts_per_token repeats it)
    cfg = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_hidden_layers": 36,
           "num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4, "sliding_window": 128}
    layout = layout_from_hf_config(cfg)
    assert layout.moe_layer_ids == tuple(range(36)) and (layout.num_experts, layout.topk) == (128, 4)
    assert layout.num_mtp_layers == 0
    # transformers' derived layer_types (sliding, full, ...) are the same model written out
    same = layout_from_hf_config({**cfg, "layer_types": ["sliding_attention", "full_attention"] * 18})
    assert same.fingerprint == layout.fingerprint
    assert layout_from_hf_config({**cfg, "sliding_window": 64}).fingerprint != layout.fingerprint


def test_llama4_interleaved_moe_top1_and_moe_layers_that_disagree_refused():
    # Llama-4-Maverick: 48 layers, MoE every 2nd (1, 3, ...), 128 experts, top-1; Scout: every layer, 16 experts.
    text = {"model_type": "llama4_text", "num_hidden_layers": 48, "num_local_experts": 128, "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 2}
    maverick = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": text}
    layout = layout_from_hf_config(maverick)
    assert layout.moe_layer_ids == tuple(range(1, 48, 2)) and (layout.num_experts, layout.topk) == (128, 1)
    scout = layout_from_hf_config({**maverick, "text_config": {**text, "num_local_experts": 16,
                                                               "interleave_moe_layer_step": 1}})
    assert scout.moe_layer_ids == tuple(range(48))
    # A text-only Llama4ForCausalLM checkpoint is refused: SGLang's llama4.py loads q/k_proj without the
    # RoPE permutation mllama4.py applies, so served rows differed from transformers' (tests/test_families.py).
    with pytest.raises(LayoutError, match="Llama4ForCausalLM"):
        layout_from_hf_config({**text, "architectures": ["Llama4ForCausalLM"]})
    # transformers' moe_layers, when given, must be SGLang's interleave
    assert layout_from_hf_config({**maverick, "text_config": {**text, "moe_layers": list(range(1, 48, 2))}}) == layout
    with pytest.raises(LayoutError, match="moe_layers=.*interleave_moe_layer_step=2"):
        layout_from_hf_config({**maverick, "text_config": {**text, "moe_layers": list(range(0, 48, 2))}})


def test_qwen3_vl_moe_text_routing_every_layer_and_sparse_step_refused():
    # Qwen/Qwen3-VL-30B-A3B-Instruct text_config: 48 layers, 128 experts, top-8
    text = {"model_type": "qwen3_vl_moe_text", "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8}
    cfg = {"architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe", "text_config": text}
    layout = layout_from_hf_config(cfg)
    assert layout.moe_layer_ids == tuple(range(48)) and (layout.num_experts, layout.topk) == (128, 8)
    with pytest.raises(LayoutError, match="decoder_sparse_step=2"):
        layout_from_hf_config({**cfg, "text_config": {**text, "decoder_sparse_step": 2}})


def test_qwen3_omni_moe_thinker_text_routing_not_talker_and_sparse_step_refused():
    # Qwen/Qwen3-Omni-30B-A3B-Instruct: the thinker's text_config (48 layers, 128 experts, top-8) routes; the talker's
    # MoE (here 20 layers of 64 experts, top-6) SGLang does not build (qwen3_omni_moe.py: thinker only).
    text = {"model_type": "qwen3_omni_moe_text", "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8}
    talker = {"text_config": {"model_type": "qwen3_omni_moe_talker_text", "num_hidden_layers": 20, "num_experts": 64,
                              "num_experts_per_tok": 6}}
    cfg = {"architectures": ["Qwen3OmniMoeForConditionalGeneration"], "model_type": "qwen3_omni_moe",
           "thinker_config": {"model_type": "qwen3_omni_moe_thinker", "text_config": text}, "talker_config": talker}
    layout = layout_from_hf_config(cfg)
    assert layout.moe_layer_ids == tuple(range(48)) and (layout.num_experts, layout.topk) == (128, 8)
    assert not layout.mtp_layers
    with pytest.raises(LayoutError, match="decoder_sparse_step=2"):
        layout_from_hf_config({**cfg, "thinker_config": {"text_config": {**text, "decoder_sparse_step": 2}}})
    with pytest.raises(LayoutError, match=r"mlp_only_layers=\[0\]"):
        layout_from_hf_config({**cfg, "thinker_config": {"text_config": {**text, "mlp_only_layers": [0]}}})


def test_interns1_text_routing_as_qwen3_moe_and_a_dense_text_model_refused():
    # internlm/Intern-S1: Qwen3-235B-A22B's text model (94 layers, 128 experts, top-8) under an InternViT tower;
    # Intern-S1-mini: Qwen3-8B's, dense (interns1.py builds Qwen3ForCausalLM: no routers).
    text = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 94,
            "num_experts": 128, "num_experts_per_tok": 8}
    cfg = {"architectures": ["InternS1ForConditionalGeneration"], "model_type": "interns1", "text_config": text,
           "vision_config": {"model_type": "interns1_vision", "num_hidden_layers": 24, "image_size": [448, 448]}}
    layout = layout_from_hf_config(cfg)
    assert layout.moe_layer_ids == tuple(range(94)) and (layout.num_experts, layout.topk) == (128, 8)
    assert not layout.mtp_layers
    with pytest.raises(LayoutError, match=r"mlp_only_layers=\[0\]"):
        layout_from_hf_config({**cfg, "text_config": {**text, "mlp_only_layers": [0]}})
    mini = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 36}
    with pytest.raises(LayoutError, match="not Qwen3-MoE's .model type read: 'qwen3'.*no routers"):
        layout_from_hf_config({**cfg, "text_config": mini})
    # a text_config naming no model type is Qwen2's to the release's config class (dense): refused, not read as MoE
    with pytest.raises(LayoutError, match="not Qwen3-MoE's.*no routers"):
        layout_from_hf_config({**cfg, "text_config": {k: v for k, v in text.items() if k != "model_type"}})


def test_ernie_moe_layer_range_dense_mtp_and_interval_refused():
    # baidu/ERNIE-4.5-21B-A3B-PT: 28 layers, MoE from layer 1 to the last (-1), 64 experts, top-6, one MTP layer
    cfg = {"architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe", "num_hidden_layers": 28,
           "moe_num_experts": 64, "moe_k": 6, "moe_layer_start_index": 1, "moe_layer_end_index": -1,
           "moe_layer_interval": 1, "num_nextn_predict_layers": 1}
    layout = layout_from_hf_config(cfg)
    assert layout.moe_layer_ids == tuple(range(1, 28)) and (layout.num_experts, layout.topk) == (64, 6)
    assert [(l.id, l.num_experts) for l in layout.mtp_layers] == [(28, 0)]  # dense MTP (ernie4_eagle.py)
    assert layout_from_hf_config({**cfg, "moe_layer_end_index": 27}).fingerprint == layout.fingerprint
    with pytest.raises(LayoutError, match="moe_layer_interval=2"):
        layout_from_hf_config({**cfg, "moe_layer_interval": 2})


def test_hunyuan_refused_naming_what_sglang_serves_wrong():
    # tencent/Hunyuan-A13B-Instruct's keys; served, SGLang 0.5.23 stops (tests/test_families.py hunyuan_v1_moe)
    cfg = {"architectures": ["HunYuanMoEV1ForCausalLM"], "model_type": "hunyuan_v1_moe", "num_hidden_layers": 32,
           "num_experts": 64, "moe_topk": [8] * 32, "use_mixed_mlp_moe": 1, "num_shared_expert": [1] * 32,
           "use_qk_norm": True}
    with pytest.raises(LayoutError, match="HunYuanMoEV1ForCausalLM.*padded_extend_real_tokens"):
        layout_from_hf_config(cfg)


def test_granite_lfm2_afmoe_layouts():
    granite = layout_from_hf_config({"architectures": ["GraniteMoeForCausalLM"], "model_type": "granitemoe",
                                     "num_hidden_layers": 32, "num_local_experts": 40, "num_experts_per_tok": 8})
    assert granite.moe_layer_ids == tuple(range(32)) and (granite.num_experts, granite.topk) == (40, 8)
    lfm2 = layout_from_hf_config({"architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe",
                                  "num_hidden_layers": 24, "num_dense_layers": 2, "num_experts": 32,
                                  "num_experts_per_tok": 4})
    assert lfm2.moe_layer_ids == tuple(range(2, 24)) and (lfm2.num_experts, lfm2.topk) == (32, 4)
    afmoe = {"architectures": ["AfmoeForCausalLM"], "model_type": "afmoe", "num_hidden_layers": 4,
             "num_dense_layers": 1, "num_experts": 8, "num_experts_per_tok": 2,
             "layer_types": ["sliding_attention", "full_attention"] * 2}
    assert layout_from_hf_config(afmoe).moe_layer_ids == (1, 2, 3)
    with pytest.raises(LayoutError, match="no layer_types"):
        layout_from_hf_config({k: v for k, v in afmoe.items() if k != "layer_types"})
    # keys transformers' AFMoE router ignores (always sigmoid, renormalised, one group) and SGLang's follows
    for key, value in (("score_func", "softmax"), ("route_norm", False), ("n_group", 4)):
        with pytest.raises(LayoutError, match=f"{key}={value!r}: SGLang 0.5.23 .afmoe.py. and transformers"):
            layout_from_hf_config({**afmoe, key: value})
    with pytest.raises(LayoutError, match=r"attention_bias=True: SGLang 0.5.23 \(granitemoe.py\)"):
        layout_from_hf_config({"architectures": ["GraniteMoeForCausalLM"], "model_type": "granitemoe",
                               "num_hidden_layers": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
                               "attention_bias": True})


@pytest.mark.parametrize("arch, words", [("DbrxForCausalLM", "fused_experts"), ("DeepseekV4ForCausalLM", "tid2eid"),
                                         ("MiMoV2FlashForCausalLM", "MTP layout")])
def test_families_refused_with_a_specific_reason(arch, words):
    with pytest.raises(LayoutError, match=rf"'{arch}'.*{words}"):
        layout_from_hf_config({"architectures": [arch], "num_hidden_layers": 2})


# inclusionAI/Ling-mini-2.0's keys (the published config.json as SGLang's own tests shrink it, full size here).
_LING_MINI_2 = {"architectures": ["BailingMoeV2ForCausalLM"], "model_type": "bailing_moe", "num_hidden_layers": 20,
                "num_experts": 256, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
                "first_k_dense_replace": 1, "num_shared_experts": 1, "moe_intermediate_size": 512,
                "moe_shared_expert_intermediate_size": 512, "norm_topk_prob": True, "score_function": "sigmoid",
                "moe_router_enable_expert_bias": True, "router_dtype": "fp32", "routed_scaling_factor": 2.5,
                "partial_rotary_factor": 0.5, "use_qk_norm": True, "use_qkv_bias": False, "use_bias": False,
                "head_dim": 128, "num_nextn_predict_layers": 1}


def test_ling_2_layout_and_the_keys_on_which_sglang_and_the_release_compute_otherwise():
    layout = layout_from_hf_config(_LING_MINI_2)
    assert layout.moe_layer_ids == tuple(range(1, 20)) and (layout.num_experts, layout.topk) == (256, 8)
    assert [(m.id, m.depth, m.num_experts) for m in layout.mtp_layers] == [(20, 1, 256)]
    # the release's class defaults fill what a file leaves out (SGLang loads that class: --trust-remote-code)
    defaulted = {k: v for k, v in _LING_MINI_2.items() if k not in ("n_group", "topk_group", "num_experts")}
    assert layout_from_hf_config(defaulted).num_experts == 256
    # the release's modeling_bailing_moe_v2.py always: sigmoid over an expert bias, float32 router logits,
    # renormalised top-k, shared expert of moe_intermediate_size, partial_rotary_factor; no qkv bias for use_bias
    for key, value in (("moe_router_enable_expert_bias", False), ("score_function", "softmax"),
                       ("norm_topk_prob", False), ("router_dtype", "bf16"), ("use_bias", True), ("norm_head", True),
                       ("moe_shared_expert_intermediate_size", 1024)):
        with pytest.raises(LayoutError, match=rf"BailingMoeV2ForCausalLM: SGLang 0.5.23's bailing_moe.py and the "
                                              rf"release's .*{key}"):
            layout_from_hf_config({**_LING_MINI_2, key: value})
    with pytest.raises(LayoutError, match="router_dtype=None"):
        layout_from_hf_config({k: v for k, v in _LING_MINI_2.items() if k != "router_dtype"})
    with pytest.raises(LayoutError, match=r"rotary_dim=32 without partial_rotary_factor"):
        layout_from_hf_config({**{k: v for k, v in _LING_MINI_2.items() if k != "partial_rotary_factor"},
                               "rotary_dim": 32})
    # beside partial_rotary_factor (which the view keeps in rope_parameters), SGLang reads the factor, not rotary_dim
    assert layout_from_hf_config({**_LING_MINI_2, "rotary_dim": 64}).moe_layer_ids == tuple(range(1, 20))
    with pytest.raises(LayoutError, match="multi_gate"):
        layout_from_hf_config({**_LING_MINI_2, "router_type": "MultiRouter"})
    with pytest.raises(LayoutError, match="Only 1 nextn layer"):
        layout_from_hf_config({**_LING_MINI_2, "num_nextn_predict_layers": 2})
