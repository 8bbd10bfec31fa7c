"""sglang_r3.core.config_view against the config classes SGLang 0.5.23 builds (the oracle).

The view of a raw config.json (computed without transformers, from the table in config_view) must
equal the view of the config object SGLang's own ``get_config`` resolves from that file, and the view
of what that object's ``save_pretrained`` writes: three spellings of one model, one view.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from sglang_r3.core.config_view import CONFIG_MODEL_TYPES, ConfigError, facts_table, is_routing_key, view_of
from sglang_r3.core.families import FAMILIES

transformers = pytest.importorskip("transformers")
hf_common = pytest.importorskip("sglang.srt.utils.hf_transformers.common")
from sglang.srt.utils.hf_transformers.config import get_config  # noqa: E402

pytestmark = pytest.mark.sglang

CONFIGS = Path(__file__).parent / "data" / "configs"
# Fixtures SGLang can resolve without remote code (MiMo's config class is the checkpoint's own code).
FIXTURES = sorted(p.stem for p in CONFIGS.glob("*.json") if p.stem != "mimo_7b")


def _load(name):
    return {k: v for k, v in json.loads((CONFIGS / f"{name}.json").read_text()).items() if not k.startswith("_")}


def _sglang_config(tmp_path, cfg, sub="m"):
    """What SGLang's loader builds from this config.json; a model type whose class is a release's own code
    (tests/family_specs/published.py STAND_INS) with that code beside it (its stand-in), as --trust-remote-code
    loads it."""
    from tests.family_specs.published import STAND_INS

    d = tmp_path / sub
    d.mkdir()
    stand_in = STAND_INS.get(cfg.get("model_type"))
    if stand_in is not None:
        cfg = dict(cfg)
        stand_in.carry(d, cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return get_config(str(d), trust_remote_code=stand_in is not None)


def _saved(tmp_path, obj, sub="saved"):
    d = tmp_path / sub
    obj.save_pretrained(str(d))
    return json.loads((d / "config.json").read_text())


def _config_class(model_type):
    """The class SGLang instantiates for a model type: its own registry first, then transformers', else the release's
    own (its stand-in)."""
    from tests.family_specs.published import STAND_INS

    if model_type in STAND_INS and model_type not in transformers.CONFIG_MAPPING:
        return STAND_INS[model_type].load()
    return hf_common._CONFIG_REGISTRY.get(model_type) or transformers.CONFIG_MAPPING[model_type]


def _field_defaults(cls):
    if cls.__module__.startswith("transformers"):  # transformers 5: dataclass configs
        out = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
        return out
    out = {}  # SGLang's own classes and a release's (its stand-in): keyword defaults of their __init__ chain
    for c in reversed(cls.__mro__):
        if "__init__" in c.__dict__ and not c.__module__.startswith("transformers"):
            for n, p in inspect.signature(c.__init__).parameters.items():
                if p.default is not inspect.Parameter.empty:
                    out[n] = p.default
    return out


@pytest.mark.parametrize("model_type", CONFIG_MODEL_TYPES)
def test_alias_and_default_table_is_the_config_class_sglang_builds(model_type):
    cls = _config_class(model_type)
    aliases = dict(getattr(cls, "attribute_map", {}) or {})
    defaults = {
        aliases.get(k, k): v
        for k, v in _field_defaults(cls).items()
        if (is_routing_key(k, model_type) or k in aliases) and v is not None
    }
    defaults.setdefault("rope_theta", getattr(cls, "default_theta", None))
    table_aliases, table_defaults = facts_table()[model_type]
    assert (table_aliases, table_defaults) == (aliases, defaults), (
        f"regenerate _FACTS[{model_type!r}] from {cls.__module__}.{cls.__name__}:\n"
        f"aliases={aliases!r},\ndefaults={dict(sorted(defaults.items()))!r}"
    )


@pytest.mark.parametrize("name", FIXTURES)
def test_file_object_and_save_pretrained_views_agree(tmp_path, name):
    raw = _load(name)
    obj = _sglang_config(tmp_path, raw)
    saved = _saved(tmp_path, obj)
    assert view_of(obj) == view_of(raw)
    assert view_of(saved) == view_of(raw)
    # and what SGLang resolves from the saved file
    assert view_of(_sglang_config(tmp_path, saved, "again")) == view_of(raw)


def _perturbed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 + 2
    if isinstance(value, float):
        return value * 3
    if isinstance(value, str):
        return {"silu": "gelu", "greedy": "group_limited_greedy"}.get(value)
    return None


def _perturbations():
    for mt in CONFIG_MODEL_TYPES:
        _, defaults = facts_table()[mt]
        for key, value in sorted(defaults.items()):
            new = _perturbed(value)
            if new is not None:
                yield pytest.param(mt, key, new, id=f"{mt}-{key}")


# Architectures SGLang dispatches on, per model type (only to make the configs complete): the registry's
# last architecture of each model type (Qwen3.5: its text-only Qwen3_5MoeForCausalLM).
_ARCH = {mt: arch for fam in FAMILIES for arch, mt in fam.architectures.items() if mt}
_WRAPPED = {text: (outer, arch) for fam in FAMILIES for outer, text in fam.text_model_types.items()
            for arch, mt in fam.architectures.items() if mt == outer}
# Wrappers whose text_config sits inside another sub-config (Qwen3-Omni-MoE: thinker_config.text_config).
_TEXT_HOLDER = {"qwen3_omni_moe": "thinker_config"}


def _wrapped_text(outer, text):
    holder = _TEXT_HOLDER.get(outer)
    return {holder: {"text_config": text}} if holder else {"text_config": text}


# Attention widths a class validates together: changed as a consistent trio.
_WIDTHS = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
_WIDTHS_CHANGED = {"hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 4}


# (model type, key) -> the words of the config class's own refusal of the changed value. Empty: every changed
# value of every class builds (the bound on skips this test allows).
_CLASS_REFUSES: dict = {}


@pytest.mark.parametrize("model_type, key, value", list(_perturbations()))
def test_one_changed_value_reads_the_same_through_file_and_object(tmp_path, model_type, key, value):
    # Every default the table holds, changed one at a time: the class's derivations (head_dim from
    # qk_rope_head_dim, sliding windows, layer types, RoPE) must be mirrored for each of them.
    inner = {"model_type": model_type, key: value}
    if key in _WIDTHS:
        inner.update({**_WIDTHS, key: _WIDTHS_CHANGED[key]})
    if model_type in ("qwen3_next", "qwen3_5_moe_text"):
        inner.setdefault("full_attention_interval", 4)
    if model_type in _ARCH:
        raw = {**inner, "architectures": [_ARCH[model_type]]}
    else:  # a text model type only a multimodal wrapper dispatches on: changed inside its text_config
        outer, arch = _WRAPPED[model_type]
        raw = {"model_type": outer, "architectures": [arch], **_wrapped_text(outer, inner)}
    try:
        obj = _sglang_config(tmp_path, raw)
    except Exception as e:
        # The class itself refusing a value leaves nothing to compare: allowed only where _CLASS_REFUSES names
        # the case and what the class says (none today), so a case cannot pass by raising.
        want = _CLASS_REFUSES.get((model_type, key))
        if want is None or want not in str(e):
            pytest.fail(f"{model_type}: {key}={value!r} did not build ({type(e).__name__}: {e}); if the class "
                        "refuses it by design, add the case to _CLASS_REFUSES with the message")
        pytest.skip(f"{model_type} class refuses {key}={value!r}: {e}")
    assert view_of(obj) == view_of(raw)
    assert view_of(_saved(tmp_path, obj)) == view_of(raw)


def test_step3p5_file_object_and_save_pretrained_views_agree(tmp_path):
    # SGLang's own Step3p5Config: per-layer rope_theta lists, share_expert_dims stored as share_expert_dim,
    # moe_layers_enum as a string.
    from tests.support.step3p5 import config

    raw = config()
    obj = _sglang_config(tmp_path, raw)
    assert type(obj).__name__ == "Step3p5Config"
    assert view_of(obj) == view_of(raw) == view_of(_saved(tmp_path, obj))
    assert view_of(raw).get("moe_layers_enum")[:3] == [1, 3, 4]


@pytest.mark.parametrize(
    "legacy, current",
    [
        ({"rope_theta": 500000}, {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}),
        (
            {"rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 4.0}, "max_position_embeddings": 4096},
            {"max_position_embeddings": 4096, "rope_parameters": {
                "rope_type": "yarn", "factor": 4, "rope_theta": 10000, "original_max_position_embeddings": 4096}},
        ),
    ],
)
def test_rope_spellings_of_4x_and_5x_are_one_view(legacy, current):
    base = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}
    assert view_of({**base, **legacy}) == view_of({**base, **current})


def test_glm_partial_rotary_factor_top_level_or_inside_rope_parameters():
    base = {"model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"]}
    a = view_of({**base, "partial_rotary_factor": 0.5, "rope_theta": 1000000})
    b = view_of({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}})
    assert a == b


def test_partial_rotary_factor_given_twice_and_disagreeing_is_refused():
    # As transformers 5.19 saves a Qwen3.5 config given the factor in rope_parameters only: the attribute at its
    # class default, which SGLang's qwen3_5.py reads (served so, rows differed: tests/test_families.py
    # qwen3_5_moe_text_rope_factor_inside). Given alike, one view.
    base = {"model_type": "qwen3_5_moe_text", "architectures": ["Qwen3_5MoeForCausalLM"]}
    rope = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    with pytest.raises(ConfigError, match=r"partial_rotary_factor=0.25 and rope_parameters.partial_rotary_factor=0.5"):
        view_of({**base, "partial_rotary_factor": 0.25, "rope_parameters": rope})
    assert view_of({**base, "partial_rotary_factor": 0.5, "rope_parameters": rope}) == view_of(
        {**base, "partial_rotary_factor": 0.5, "rope_theta": 1e4})
    # Not a number: a ConfigError naming the key (a bare ValueError from float() before).
    for bad in ("half", True):
        with pytest.raises(ConfigError, match=r"rope_parameters.partial_rotary_factor must be a number"):
            view_of({**base, "partial_rotary_factor": 0.5, "rope_parameters": {**rope, "partial_rotary_factor": bad}})
        with pytest.raises(ConfigError, match=r"^partial_rotary_factor must be a number"):
            view_of({**base, "partial_rotary_factor": bad, "rope_theta": 1e4})


def test_rope_scaling_and_rope_parameters_given_apart_are_refused():
    # Held out (Qwen3.5): transformers 5 takes rope_scaling, SGLang's qwen3_5.py rope_parameters. Given alike (the
    # legacy "type" for "rope_type" included), one view.
    base = {"model_type": "qwen3_5_moe_text", "architectures": ["Qwen3_5MoeForCausalLM"], "partial_rotary_factor": 0.25}
    ours = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}
    with pytest.raises(ConfigError, match=r"rope_scaling and rope_parameters apart \(rope_theta: 1000.0 and 10000.0\)"):
        view_of({**base, "rope_parameters": ours, "rope_scaling": {**ours, "rope_theta": 1e3}})
    assert view_of({**base, "rope_parameters": ours, "rope_scaling": {**ours, "type": "default"}}) == view_of(
        {**base, "rope_parameters": ours})


def test_alias_and_stored_name_that_disagree_are_refused():
    with pytest.raises(ConfigError, match=r"'num_experts'=8 and 'num_local_experts'=16.*alias of 'num_local_experts'"):
        view_of({"model_type": "qwen3_moe", "num_experts": 8, "num_local_experts": 16})


def test_layer_types_that_contradict_full_attention_interval_are_refused():
    cfg = {"model_type": "qwen3_next", "num_hidden_layers": 4, "full_attention_interval": 2,
           "layer_types": ["linear_attention"] * 4}
    with pytest.raises(ConfigError, match="disagree with full_attention_interval=2"):
        view_of(cfg)


def test_view_of_an_object_is_of_the_object_not_its_file(tmp_path):
    # --json-model-override-args changes the object SGLang serves; the view follows what is served.
    obj = _sglang_config(tmp_path, _load("deepseek_v3"))
    before = view_of(obj)
    obj.topk_group = 2
    assert view_of(obj) != before and view_of(obj).get("topk_group") == 2


def test_wrapped_text_config_is_read_with_its_own_class_facts(tmp_path):
    raw = _load("qwen3_5_35b_a3b")
    text = copy.deepcopy(raw["text_config"])
    text.pop("model_type", None)  # files without it are read as the wrapper's text model
    view = view_of({**raw, "text_config": text})
    assert view.model_type == "qwen3_5_moe_text" and view.architecture == "Qwen3_5MoeForConditionalGeneration"
    assert view == view_of(_sglang_config(tmp_path, raw))


def _omni(text):
    # Qwen3-Omni-MoE as its releases nest it: the thinker's text model two levels down, talker beside the thinker.
    return {"model_type": "qwen3_omni_moe", "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
            "enable_audio_output": False, "thinker_config": {"model_type": "qwen3_omni_moe_thinker", "text_config": text},
            "talker_config": {"text_config": {"num_hidden_layers": 5, "num_experts": 4}}}


def test_omni_thinker_text_config_is_read_two_levels_deep(tmp_path):
    # The thinker's text model is what SGLang builds and routes (qwen3_omni_moe.py); its config sits in
    # thinker_config.text_config. File, the object SGLang's get_config resolves, and its save: one view, the
    # thinker text class's (not the talker's 5 layers of 4 experts, not the outer or thinker class's).
    text = {"model_type": "qwen3_omni_moe_text", "num_hidden_layers": 3, "num_experts": 8, "num_experts_per_tok": 2,
            "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
    raw = _omni(text)
    view = view_of(raw)
    assert (view.architecture, view.model_type) == ("Qwen3OmniMoeForConditionalGeneration", "qwen3_omni_moe_text")
    assert (view.get("num_hidden_layers"), view.get("num_experts"), view.get("head_dim")) == (3, 8, 32)
    assert view.get("moe_intermediate_size") == 768  # the thinker text class's default
    obj = _sglang_config(tmp_path, raw)
    assert type(obj.thinker_config.text_config).__name__ == "Qwen3OmniMoeTextConfig"
    assert view_of(obj) == view == view_of(_saved(tmp_path, obj))
    # a text_config without model_type is read as the wrapper's thinker text model
    bare = {k: v for k, v in text.items() if k != "model_type"}
    assert view_of(_omni(bare)) == view
    # no head_dim: both attentions take hidden_size // num_attention_heads, one view either way
    no_head = {k: v for k, v in text.items() if k != "head_dim"}
    assert view_of(_omni(no_head)) == view_of(_omni({**no_head, "head_dim": 16}))


def test_trainer_without_transformers_computes_the_servers_fingerprints(tmp_path):
    # The trainer's base install has no transformers (tests/test_trainer_install.py): its table path
    # must give the fingerprint the server computes from the config object SGLang resolves.
    from sglang_r3.core.layout import layout_from_hf_config
    from tests.support.blocked_imports import SERVER_ONLY, ok, run

    names = FIXTURES
    server = {n: layout_from_hf_config(_sglang_config(tmp_path, _load(n), n)).fingerprint for n in names}
    saved = {n: str(tmp_path / f"saved-{n}") for n in names}
    for n in names:
        _sglang_config(tmp_path, _load(n), f"{n}-again").save_pretrained(saved[n])
    code = f"""
import json
from sglang_r3.core.layout import layout_from_hf_config, layout_from_model_path
raw = {{n: layout_from_hf_config({{k: v for k, v in json.load(open(p)).items() if not k.startswith("_")}}).fingerprint
       for n, p in {dict((n, str(CONFIGS / f"{n}.json")) for n in names)!r}.items()}}
saved = {{n: layout_from_model_path(p).fingerprint for n, p in {saved!r}.items()}}
print(json.dumps([raw, saved]))
"""
    raw, resaved = json.loads(ok(run(code, SERVER_ONLY)).strip().splitlines()[-1])
    assert raw == server and resaved == server
