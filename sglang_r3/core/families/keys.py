"""Key accounting: every config key a family's reference class reads (transformers' config class fields and what its
modeling file reads off a config: ``python -m sglang_r3.tools.config_keys``, by AST, for the transformers each served
SGLang release pins) is accounted for, in the family's module (its ``KEYS``), as one of:

* proven     -- set off the class default in a checkpoint served by tests/test_families.py, whose rows equal
                transformers' router top-k (tests/test_key_accounting.py checks each against the checkpoints);
* neutral    -- only the listed values are accepted; any other is refused at start-up naming the key;
* ruled      -- the family's layout rule (or the tied-head check) reads it: a value SGLang builds otherwise than
                transformers is refused there, naming the key (computed: the rule's source, not listed);
* irrelevant -- changes neither routing nor logits of a served forward, with why;
* via        -- its value reaches both sides through another key that is accounted for (the legacy RoPE spellings
                transformers folds into rope_parameters, an attribute SGLang's config class derives), with why.

Both sides' keys: those transformers' class reads, and those SGLang's model file reads off the config that
transformers' class neither reads nor declares (``config_keys.sglang_only_keys``: honoured by SGLang, ignored by
the reference, so any value but the neutral one is served otherwise than the checkpoint means).

tests/test_key_accounting.py fails on a key the installed transformers reads that its family leaves unaccounted.
This module holds the vocabulary the family modules write their ``KEYS`` in (``Keys``, the keys every class reads
that are irrelevant, the groups several families share) and how a rule's reads are found (``_rule_strings``); the
registry (``sglang_r3.core.families``) merges the families' ``KEYS`` and answers ``account`` / ``check_neutral``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple


@dataclass(frozen=True)
class Keys:
    neutral: Mapping[str, Tuple[Tuple[Any, ...], str]] = field(default_factory=dict)  # key -> (accepted, why)
    proven: Tuple[str, ...] = ()
    irrelevant: Mapping[str, str] = field(default_factory=dict)  # key -> why
    via: Mapping[str, str] = field(default_factory=dict)  # key -> the accounted key it reaches both sides through, why
    # Not accounted for yet (issue 52 stays open while any is): key -> what is missing. Shown per family in
    # docs/models.md; the test fails on a key listed here that another category now covers. ``pending_all``: every
    # key the class reads, with why (a family whose served forwards are not held to transformers' class).
    pending: Mapping[str, str] = field(default_factory=dict)
    pending_all: str = ""


_DROPOUT = "dropout: inactive in a forward without training (eval mode), SGLang has none"

# Keys every family's class reads that touch neither routing nor logits of a served forward.
COMMON_IRRELEVANT: Mapping[str, str] = {
    "attention_dropout": _DROPOUT, "hidden_dropout": _DROPOUT, "activation_dropout": _DROPOUT, "dropout": _DROPOUT,
    "projector_dropout": _DROPOUT,
    "bos_token_id": "generation's start id: the forward never reads it",
    "eos_token_id": "generation's stop ids: the forward never reads them",
    "pad_token_id": "the embedding's padding_idx: zeroes that row at init and in its gradient; a served checkpoint "
                    "loads the row's values",
    "initializer_range": "the init's spread: a served checkpoint's weights are loaded, not drawn",
    "output_router_logits": "whether the forward also returns router logits (for the auxiliary loss); the logits and "
                            "the routing are the same",
    "router_aux_loss_coef": "the auxiliary load-balancing loss's weight: training only",
    "router_jitter_noise": "noise on the router's input under self.training only",
    "use_cache": "whether generate keeps a KV cache: the same logits either way",
    "num_logits_to_keep": "how many last positions the head computes logits for in generate: their values unchanged",
}

# The activation SGLang's model file builds for the family (its SiluAndMul / GeluAndMul); the releases publish it.
_SILU = {"hidden_act": (("silu",), "SGLang's model builds SiLU-gated MLPs (SiluAndMul; some raise on another "
                                   "activation only once the model is built)")}

# Groups and reasons more than one family's KEYS use.
def mla_latent_eps(published: float) -> dict:
    """rms_norm_eps of an MLA family: SGLang's deepseek_v2.py / glm4_moe_lite.py build the latent norms
    (q_a_layernorm, kv_a_layernorm) with it, transformers' classes at 1e-6 whatever it says. Served at the published
    value (rows equal transformers' router top-k); at another (0.1 in a flipped checkpoint) 5 families' rows
    differed: refused."""
    return {"rms_norm_eps": ((published,), "SGLang applies rms_norm_eps to the MLA latent norms (q_a_layernorm, "
                                           "kv_a_layernorm) as well, transformers' class keeps them at 1e-6; only "
                                           "the published value is proven by a served forward")}


_NEVER_READ = "declared by the config class, read by none of its modeling code"

_INIT_ONLY = "read by _init_weights only (the init of a parameter a served checkpoint loads)"

_NO_ATTENTION_BIAS_MLA = {"attention_bias": ((False,), "SGLang's deepseek_v2.py builds its MLA projections without "
                                                       "biases")}

_SHAPES = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads", "num_key_value_heads",
           "vocab_size", "max_position_embeddings")

_SHAPES_BUT_KV = tuple(k for k in _SHAPES if k != "num_key_value_heads")

_MLA = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")

def rope_spellings(reader: str, keys=("rope_scaling", "rope_theta")) -> Dict[str, str]:
    """The legacy RoPE spellings SGLang's model file reads (``via``): transformers 5 folds them into rope_parameters
    on load (``config.rope_scaling`` returns it), as the config view does."""
    return {k: f"rope_parameters: the legacy spelling transformers 5 folds into rope_parameters on load (the config "
               f"view too), {reader}" for k in keys}


# Multimodal wrappers' switches SGLang's ModelConfig writes onto the config from the server flags of those names
# (--encoder-only, --language-only): a checkpoint's own value is never read.
SERVER_FLAG_SWITCHES = {k: "SGLang's only: ModelConfig sets it from the server flag of that name; the file's value is "
                           "never read" for k in ("encoder_only", "language_only")}


# SGLang's models that build the Qwen attention (qwen2_moe.py, qwen3_moe.py) hand this to get_rope, which then builds
# a dual-chunk rotary embedding (0.5.15.post1 switches to its dual-chunk attention backend; 0.5.23's first forward
# stops); transformers' classes have no dual-chunk attention.
DUAL_CHUNK = {"dual_chunk_attention_config": ((None,), "SGLang builds dual-chunk attention from it, transformers' "
                                                       "class has none")}

_GROUPED = ("n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor", "n_shared_experts")


def _pending(*keys: str, why: str = "no served checkpoint sets it off its default yet") -> Dict[str, str]:
    return {k: why for k in keys}


_PACKAGE = __name__.rpartition(".")[0]  # sglang_r3.core.families


def _in_package(module: str) -> bool:
    return module == _PACKAGE or module.startswith(_PACKAGE + ".")


def _rule_strings(fn: Callable, seen: Optional[set] = None) -> set:
    """String constants in ``fn`` and in the functions of this package it calls, transitively: the keys a rule reads
    (``v.get("key")``, ``_int(v, "key", ...)``) and names in its refusals. A name is looked up where ``fn`` reads it
    (its module's globals: a family module's own functions and the helpers it imports from ``_base``)."""
    import ast
    import inspect
    import textwrap

    seen = set() if seen is None else seen
    if fn in seen:
        return set()
    seen.add(fn)
    out = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn)))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)
        elif isinstance(node, ast.Name):
            target = fn.__globals__.get(node.id)
            if callable(target) and _in_package(getattr(target, "__module__", "")) and inspect.isfunction(target):
                out |= _rule_strings(target, seen)
    return out
