"""Every config key a family's reference class reads is accounted for (issue 52), on the installed transformers.

The keys come from transformers' own sources, read by AST (``sglang_r3.tools.config_keys``): the fields of the
family's config class and what its modeling file reads off a config. Run on both served releases (0.5.23 pins
transformers 5.19.0, 0.5.15.post1 5.12.1: they read different keys). For each family with a rule:

- no key is left unaccounted (``families.KEYS``: ruled, neutral, proven, irrelevant, or listed pending);
- a key listed pending is not covered otherwise (the list shrinks as keys are proven);
- each proven key is set off its class default in a checkpoint tests/test_families.py serves for the family (a
  family's own or its ``_flipped`` one), whose rows are held to transformers' router top-k there;
- each neutral key's class default is accepted, every served checkpoint passes, and any other value is refused at
  start-up naming the key (the layout check start-up runs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.fast, pytest.mark.release]

transformers = pytest.importorskip("transformers")

from sglang_r3.core import families as F  # noqa: E402
from sglang_r3.core.layout import LayoutError, layout_from_hf_config  # noqa: E402
from sglang_r3.tools import config_keys  # noqa: E402

RULED = [f for f in F.FAMILIES if f.rule is not None]
# The spellings a checkpoint gives RoPE's parameters in (transformers folds them into rope_parameters).
ROPE_SPELLINGS = {"rope_theta": "rope_parameters", "rope_scaling": "rope_parameters"}


def _cases():
    out = []
    for fam in RULED:
        for mt in fam.facts:
            out.append(pytest.param(fam, mt, id=f"{fam.name}:{mt}"))
    return out


def _keys(mt: str):
    keys = config_keys.transformers_keys(mt)
    if keys is None:
        pytest.skip(f"transformers {transformers.__version__} has no config class for {mt!r} (the release's own code: "
                    f"its checkpoint carries a stand-in)")
    return keys


@pytest.mark.parametrize("fam, mt", _cases())
def test_every_key_the_reference_reads_is_accounted_for(fam, mt):
    keys = _keys(mt)
    how = F.account(fam, keys)
    missing = sorted(k for k in keys if k not in how)
    assert not missing, (f"{fam.name} ({mt}, transformers {transformers.__version__}): keys its reference reads that "
                         f"its module of core/families/ (KEYS) leaves unaccounted (rule, neutral, proven or irrelevant, with why): "
                         f"{missing}")
    own = F.KEYS.get(fam.name, F.Keys())
    stale = sorted(k for k in own.pending if k in keys and not how[k].startswith("PENDING"))
    assert not stale, f"{fam.name}: listed pending but accounted for otherwise now (drop them from pending): {stale}"


def _sglang_cases():
    return [pytest.param(fam, arch, id=f"{fam.name}:{arch}") for fam in RULED for arch in fam.architectures]


@pytest.mark.parametrize("fam, arch", _sglang_cases())
def test_every_key_sglang_reads_that_the_reference_ignores_is_accounted_for(fam, arch):
    # The other side: a key SGLang's model file honours that transformers' class neither reads nor declares (a
    # DeepSeek-V3 with topk_method "greedy", held out, was served with other rows: SGLang drops the correction bias
    # transformers' router always adds). Accounted for as the reference's own keys are, on the installed SGLang.
    model_types = [mt for mt in fam.facts if config_keys.transformers_keys(mt) is not None]
    if not model_types:
        pytest.skip(f"{fam.name}: no transformers class (the release's own code is the reference)")
    if arch not in config_keys.sglang_model_files():
        pytest.skip(f"the installed SGLang has no model file for {arch}")
    keys = config_keys.sglang_only_keys(arch, [*model_types, F.model_type_of(arch)])
    how = F.account(fam, keys)
    missing = sorted(k for k in keys if k not in how)
    assert not missing, (f"{fam.name} ({arch}): keys SGLang's model file reads off the config that transformers' class "
                         f"neither reads nor declares, left unaccounted in its module of core/families/ (KEYS: "
                         f"neutral, ruled, irrelevant or via, with why): {missing}")


def _served_specs(fam):
    from tests.family_specs.published import architecture_of
    from tests.family_specs.specs import SPECS

    return [s for s in SPECS.values() if architecture_of(s) in fam.architectures and not s.not_served]


def _default(mt: str, spec):
    try:
        cls = transformers.CONFIG_MAPPING[mt]
    except KeyError:
        cls = getattr(transformers, spec.config_class)
    return cls()


def _attr(config, key):
    try:
        return getattr(config, key)
    except AttributeError:  # a key the class does not declare, read with getattr(config, key, None)
        return None
    except Exception:  # a key the class declares per layer type only (Gemma-4): not a default to compare with
        return object()


@pytest.mark.parametrize("fam, mt", _cases())
def test_each_proven_key_is_set_off_its_default_in_a_served_checkpoint(fam, mt):
    keys = _keys(mt)
    proven = [k for k in F.KEYS.get(fam.name, F.Keys()).proven if k in keys and F.account(fam, [k]).get(k) == "proven"]
    if not proven:
        pytest.skip(f"{fam.name}: no proven keys")
    specs = _served_specs(fam)
    assert specs, f"{fam.name}: no served checkpoint in tests/family_specs/specs.py"
    aliases = {a: s for f in fam.facts.values() for a, s in f.aliases.items()}
    default = _default(mt, specs[0])
    flipped = set()
    for spec in specs:
        given = {ROPE_SPELLINGS.get(aliases.get(k, k), aliases.get(k, k)): v for k, v in spec.config.items()}
        if "rope_parameters" in given and ("rope_theta" in spec.config or "rope_scaling" in spec.config):
            flipped.add("rope_parameters")  # a RoPE base or scaling given: transformers' default has neither
        flipped |= {k for k, v in given.items() if k in keys and v != _attr(default, k)}
    unproven = sorted(set(proven) - flipped)
    assert not unproven, (f"{fam.name}: listed proven, but no served checkpoint ({[s.name for s in specs]}) sets them "
                          f"off the class default: {unproven}")


def _neutral_cases():
    return [pytest.param(fam, key, id=f"{fam.name}:{key}")
            for fam in RULED for key in F.KEYS.get(fam.name, F.Keys()).neutral]


def _other_value(accepted):
    sample = accepted[0]
    if isinstance(sample, bool):
        return not sample
    if isinstance(sample, (int, float)):
        return sample * 2 + 1
    if sample is None:
        return 8
    return f"{sample}_other"


def _config_of(fam, spec) -> dict:
    """The config.json a served checkpoint of ``fam`` carries, near enough for the layout check: its keywords, under
    the architecture it names (wrappers: the text model in text_config)."""
    from tests.family_specs.published import architecture_of

    arch = architecture_of(spec)
    (mt,) = fam.facts
    text = {**spec.config, "model_type": mt}
    if fam.text_model_types:
        (outer,) = fam.text_model_types
        return {"architectures": [arch], "model_type": outer, "text_config": text}
    return {**text, "architectures": [arch]}


@pytest.mark.parametrize("fam, key", _neutral_cases())
def test_a_neutral_key_refuses_any_other_value_naming_it(fam, key):
    accepted, why = F.KEYS[fam.name].neutral[key]
    (mt,) = fam.facts
    specs = _served_specs(fam)
    keys = config_keys.transformers_keys(mt)
    if specs and keys is not None and key in keys:  # the class default is one of the accepted values
        default = _attr(_default(mt, specs[0]), key)
        assert default in accepted, f"{fam.name}: {key}'s class default {default!r} is not accepted {accepted}"
    for spec in specs:  # every checkpoint served passes
        layout_from_hf_config(_config_of(fam, spec))
    if not specs:
        pytest.skip(f"{fam.name}: no served checkpoint to change")
    config = _config_of(fam, specs[0])
    text = config.get("text_config", config)
    text[key] = _other_value(accepted)
    with pytest.raises(LayoutError, match=f"{key}="):
        layout_from_hf_config(config)


def test_a_published_checkpoint_with_another_activation_is_refused_at_the_layout_check():
    # End to end on a published config (Qwen3-30B-A3B's): transformers would build GELU experts, SGLang SiLU ones.
    cfg = json.loads((Path(__file__).parent / "data" / "configs" / "qwen3_30b_a3b.json").read_text())
    layout_from_hf_config(cfg)
    with pytest.raises(LayoutError, match="hidden_act='gelu'"):
        layout_from_hf_config({**cfg, "hidden_act": "gelu"})


def test_the_reader_finds_what_issue_52_found_by_hand():
    # The keys the held-out variants turned on, read off transformers' sources: Qwen3-MoE's attention window, and the
    # DeepSeek key transformers' class does not save while SGLang reads it.
    assert {"sliding_window", "use_sliding_window"} <= config_keys.transformers_keys("qwen3_moe")
    assert "moe_layer_freq" not in config_keys.transformers_fields("deepseek_v3")
    assert "moe_layer_freq" in config_keys.sglang_unconditional_keys("DeepseekV3ForCausalLM")
    assert "topk_method" in config_keys.sglang_unconditional_keys("DeepseekV3ForCausalLM")
    # and the SGLang-only keys a held-out DeepSeek-V3 turned on (topk_method "greedy": 159 of 252 pairs differed)
    assert {"topk_method", "swiglu_limit", "num_hash_layers"} <= config_keys.sglang_only_keys(
        "DeepseekV3ForCausalLM", ["deepseek_v3"])
    assert "quant_config" not in config_keys.sglang_only_keys("Glm4MoeForCausalLM", ["glm4_moe"])


def test_the_models_doc_shows_the_accounting_as_generated():
    if transformers.__version__ != "5.19.0":
        pytest.skip("docs/models.md's counts are transformers 5.19.0's (SGLang 0.5.23's pin)")
    text = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text()
    begin = "<!-- key accounting: generated by `python -m sglang_r3.tools.config_keys --markdown`"
    shown = text.split(begin, 1)[1].split("-->\n", 1)[1].split("<!-- end of key accounting -->", 1)[0]
    assert shown == config_keys.markdown(), "regenerate it: python -m sglang_r3.tools.config_keys --markdown"
