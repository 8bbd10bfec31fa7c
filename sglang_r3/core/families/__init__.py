"""The one registry of model families sglang-r3 describes: one entry per family.

Each ``Family`` says everything sglang-r3 knows about it, in one place:

* ``architectures``: the ``architectures[0]`` values SGLang dispatches on, each with the ``model_type`` of the
  config class SGLang builds for it (a config dict without ``model_type`` is read as that class);
* ``facts``: per model type, what that config class says (attribute-map aliases, routing-relevant defaults,
  the values its ``__post_init__`` derives, keys only this class names) -- read by ``config_view``;
* ``rule``: which decoder layers SGLang 0.5.23 builds with a router, their experts and top-k, and its MTP
  layers -- read by ``layout``; ``None`` with a ``refusal``: a family SGLang serves whose routing sglang-r3
  cannot describe exactly, refused at start-up with that reason;
* ``mtp``: how SGLang drafts with its MTP layers (``none``, ``nextn``: one NextN/MTP layer reused per step,
  ``multi_layer``: one layer per draft step, ``MultiLayerEagleWorkerV2``), and whether multi-layer capture is
  proven (``multi_layer_capture``, read by the start-up checks).

A family lives in one module of this package (``glm.py``, ``deepseek.py``, ``qwen.py``, ...; families SGLang serves
that sglang-r3 refuses outright share ``refused.py``): its facts and their derivations, its layout rule and
refusals, its ``FAMILIES`` entries, its ``KEYS`` (key accounting, ``keys.py``) and, where SGLang builds its head
untied, its ``UNTIED_HEAD_ARCHITECTURES``. ``_base.py`` holds what they share. This module finds the family modules
(every module of the package but ``_base`` and ``keys``), orders their families as ``_ORDER`` says (a family it does
not name comes after, by module name) and answers every lookup the rest of sglang-r3 makes.

No SGLang, no transformers: the trainer computes layouts and fingerprints from this table.
tests/test_config_view.py checks ``facts`` against the installed config classes, tests/test_layout.py the
rules against published configs, and tests/test_sweep.py every MoE architecture in SGLang's registry
against the module tree SGLang (and transformers, where it has the class) builds from a tiny config.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Dict, FrozenSet, Optional, Sequence, Tuple

from sglang_r3.core.families._base import (  # noqa: F401  (the registry's public names)
    MTP_MULTI_LAYER, MTP_NEXTN, MTP_NONE, ConfigError, Facts, Family, RuleError, Stack,
)
from sglang_r3.core.families.keys import COMMON_IRRELEVANT, Keys, _rule_strings  # noqa: F401


def _family_modules() -> list:
    """Every family module of this package, by name (not ``_base``, not ``keys``)."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_") and m.name != "keys")
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


_MODULES = _family_modules()

# The order of the registry (docs/models.md's tables, the tools' listings): these families first, as listed; a family
# not named here after them, in the order of its module's name and its place there.
_ORDER: Tuple[str, ...] = (
    "GLM-4.5 / 4.7", "GLM-4.5V / 4.6V (text)", "DeepSeek-V3", "Kimi-K2.5 (text)", "DeepSeek-V2", "GLM-4.7-Flash",
    "GLM-5 (DSA)", "DeepSeek-V3.2 (DSA)", "Qwen3-MoE", "Qwen2-MoE", "Qwen3-Next", "Qwen3.5-MoE", "MiMo-7B",
    "Mixtral", "OLMoE", "Step-3.5", "MiniMax-M2", "gpt-oss", "Llama 4", "Llama 4 text-only", "Qwen3-VL-MoE (text)",
    "Qwen3-Omni-MoE (thinker text)", "Gemma-4 (text)", "Gemma-4 text-only", "ERNIE-4.5-MoE", "Hunyuan-MoE v1",
    "Granite-MoE", "LFM2-MoE", "AFMoE (Arcee Trinity)", "Nemotron-H (Nemotron-3)", "DBRX", "DeepSeek-V4",
    "MiMo-V2-Flash", "LongCat-Flash", "Intern-S1", "Intern-S1-Pro", "Ling / Ring 2.0 (Bailing-MoE V2)", "Inkling",
)


def _registry() -> Tuple[Tuple[Family, ...], Dict[str, Keys], FrozenSet[str]]:
    families, keys, untied = [], {}, set()
    for module in _MODULES:
        own = {fam.name for fam in module.FAMILIES}
        for name in getattr(module, "KEYS", {}):
            if name not in own:
                raise ValueError(f"{module.__name__}: KEYS names {name!r}, not a family of its FAMILIES")
        families += module.FAMILIES
        keys.update(getattr(module, "KEYS", {}))
        untied |= set(getattr(module, "UNTIED_HEAD_ARCHITECTURES", ()))
    names = [fam.name for fam in families]
    if len(set(names)) != len(names):
        raise ValueError(f"a family name is in two entries: {sorted(n for n in set(names) if names.count(n) > 1)}")
    unknown = sorted(set(_ORDER) - set(names))
    if unknown:
        raise ValueError(f"_ORDER names families no module defines: {unknown}")
    rank = {name: i for i, name in enumerate(_ORDER)}
    families.sort(key=lambda fam: rank.get(fam.name, len(_ORDER)))  # stable: the rest keep the modules' order
    return tuple(families), {fam.name: keys[fam.name] for fam in families if fam.name in keys}, frozenset(untied)


# FAMILIES: every family, in the registry's order. KEYS: per family name, how it accounts for every config key its
# reference class reads (keys.py).
FAMILIES, KEYS, _UNTIED = _registry()


def _index():
    by_arch: Dict[str, Family] = {}
    facts: Dict[str, Facts] = {}
    model_type: Dict[str, str] = {}
    text: Dict[str, str] = {}
    for fam in FAMILIES:
        for arch, mt in fam.architectures.items():
            if arch in by_arch:
                raise ValueError(f"architecture {arch!r} is in two families")
            by_arch[arch] = fam
            if mt:
                model_type[arch] = mt
        for mt, f in fam.facts.items():
            if mt in facts and facts[mt] is not f:
                raise ValueError(f"model type {mt!r} has two fact tables")
            facts[mt] = f
        text.update(fam.text_model_types)
    return by_arch, facts, model_type, text


_BY_ARCH, _FACTS, _ARCH_MODEL_TYPE, _TEXT_MODEL_TYPE = _index()

SUPPORTED_ARCHITECTURES: Sequence[str] = tuple(a for a, f in _BY_ARCH.items() if f.rule is not None)
CONFIG_MODEL_TYPES: Tuple[str, ...] = tuple(_FACTS)
# Multi-layer EAGLE (MultiLayerEagleWorkerV2) is captured for these architectures only: the ones whose
# layout rule, draft runners and chained draft-extend rows were proven against a spec-off server
# (tests/test_multi_layer_mtp.py).
MULTI_LAYER_MTP_ARCHITECTURES: Tuple[str, ...] = tuple(
    a for a, f in _BY_ARCH.items() if f.mtp == MTP_MULTI_LAYER and f.multi_layer_capture
)


# Architectures whose SGLang 0.5.23 model builds its own lm_head whatever tie_word_embeddings says, and loads
# lm_head.weight, which a tied checkpoint does not hold (transformers' save_pretrained writes the embedding once):
# served tied, the head keeps its initial values (OLMoE tied: every greedy logprob off transformers'; the rows,
# SGLang's own forward over its own tokens, still agreed). tests/scripts/sweep.py builds every ruled architecture with
# tie_word_embeddings true and checks this set against the head SGLang builds.
# Each family module lists its own (its UNTIED_HEAD_ARCHITECTURES).
UNTIED_HEAD_ARCHITECTURES: FrozenSet[str] = _UNTIED


def check_head(view, arch: str) -> None:
    """Refuse a tied checkpoint SGLang would serve with an untied, unloaded head (``UNTIED_HEAD_ARCHITECTURES``)."""
    if arch in UNTIED_HEAD_ARCHITECTURES and view.get("tie_word_embeddings") is True:
        raise RuleError(
            f"{arch}: tie_word_embeddings=True: SGLang 0.5.23 builds this model's lm_head untied and loads "
            f"lm_head.weight, which a tied checkpoint does not hold (its head would keep its initial values); "
            f"refusing")


def family_of(architecture: str) -> Optional[Family]:
    return _BY_ARCH.get(architecture)


def facts_of(model_type: str) -> Optional[Facts]:
    return _FACTS.get(model_type)


def model_type_of(architecture: str) -> str:
    """The model type of the config class SGLang builds for ``architecture`` ("" when unknown)."""
    return _ARCH_MODEL_TYPE.get(architecture, "")


def text_model_type_of(model_type: str) -> str:
    return _TEXT_MODEL_TYPE.get(model_type, "")


def facts_table() -> Dict[str, Tuple[Dict[str, str], Dict[str, Any]]]:
    """(aliases, defaults) per model type, for the test that compares them with the live classes."""
    return {mt: (dict(f.aliases), dict(f.defaults)) for mt, f in _FACTS.items()}


def account(family: Family, keys) -> Dict[str, str]:
    """How ``family`` accounts for each of ``keys``: "ruled", "neutral: ...", "proven", "irrelevant: ...", "via: ..."
    (keys left unaccounted are absent)."""
    own = KEYS.get(family.name, Keys())
    aliases = {a: s for f in family.facts.values() for a, s in f.aliases.items()}  # transformers' attribute_map
    ruled = _rule_strings(family.rule) if family.rule is not None else set()
    ruled |= set(family.required_keys)
    if any(a in UNTIED_HEAD_ARCHITECTURES for a in family.architectures):
        ruled.add("tie_word_embeddings")
    ruled |= {aliases[k] for k in ruled if k in aliases}
    out = {}
    for key in keys:  # the strongest evidence first (a served forward, a refusal), the family's own words before
        if key in own.proven:  # the static reading of its rule's source
            out[key] = "proven"
        elif key in own.neutral:
            out[key] = f"neutral: {list(own.neutral[key][0])} accepted"
        elif key in own.irrelevant:
            out[key] = f"irrelevant: {own.irrelevant[key]}"
        elif key in own.via:
            out[key] = f"via: {own.via[key]}"
        elif key in ruled:
            out[key] = "ruled"
        elif key in COMMON_IRRELEVANT:
            out[key] = f"irrelevant: {COMMON_IRRELEVANT[key]}"
        elif key in own.pending or own.pending_all:
            out[key] = f"PENDING: {own.pending.get(key) or own.pending_all}"
    return out


def check_neutral(view, arch: str) -> None:
    """Refuse a value the family accepts only at its neutral values (``Keys.neutral``), naming the key."""
    family = family_of(arch)
    for key, (accepted, why) in (KEYS.get(family.name, Keys()).neutral.items() if family else ()):
        if key in view.given and view.given[key] not in accepted:
            raise RuleError(f"{arch}: {key}={view.given[key]!r}: {why}; only {list(accepted)} is served exactly; "
                            f"refusing")
