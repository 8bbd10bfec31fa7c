"""Every MoE family SGLang 0.5.23 serves on the CPU runtime, against transformers' own routers.

Each family's checkpoint is built and saved by transformers' own ``<Family>ForCausalLM`` (tests/family_specs/),
served with ``python -m sglang_r3.launch_server --model-path DIR --dtype float32``; the oracle is
transformers' router top-k (hooks on its routers) over the same prompt + completion ids, and its module
tree (which layers have a router and experts).

DeepSeek-V3 (MLA, YaRN, grouped top-k, one NextN layer) runs exactly once the CPU runtime attends
over the decompressed k/v in its MHA prefill (sglang_r3/cpu_runtime/ops/mla.py); it is served twice, MTP
speculation off and on. GLM-4.7-Flash (MLA through the same path, one NextN layer) is served once, with MTP
speculation on: its main rows must be transformers' (which never speculates), so spec on = off.
ERNIE-4.5-MoE (softmax top-k on scores + moe_statics bias, dense first and last layers) is served once, with MTP
speculation on (its dense MTP layer in ERNIE's checkpoint layout drafts; some drafts are accepted): main rows must
be transformers', so spec on = off.
Llama 4 is served as published, ``Llama4ForConditionalGeneration`` (one-layer vision tower, text prompts):
MoE every 2nd layer, top-1 weighing the expert input, NoPE every 4th layer, q/k norm; the CPU runtime runs its
attention as CUDA does and its input-weighted top-1 experts (sglang_r3/cpu_runtime/families/llama4.py).
Qwen3-Next (``Qwen3NextForCausalLM``) and Qwen3.5-MoE, text-only (``Qwen3_5MoeForCausalLM``) and as published
(``Qwen3_5MoeForConditionalGeneration``, one-block vision tower and processor configs, text prompts and a prompt
with an image, below): gated delta-net
layers and full attention alternating, every layer MoE with a gated shared expert, one MTP layer in the checkpoint;
the CPU runtime runs the linear attention through torch versions of the sgl-kernel ops SGLang's CPU path calls
(sglang_r3/cpu_runtime/ops/gdn.py, each checked against transformers' torch code in tests/test_cpu_gdn.py).
Served with their MTP layer drafting (``--speculative-algorithm EAGLE``, a chain of 3): the verify's convolution keeps
each draft step's window and the commit puts the last accepted step's states into the slots (cpu_runtime/ops/gdn.py; on CUDA
Triton kernels), so every row below is spec on = transformers, with drafts accepted (the checkpoint's MTP projection
passes the embedding on and its layer adds little, so the draft guesses close to the main model).
MiniMax-M2 (sigmoid scores with a selection bias, q/k RMS norm over the whole attention width, partial RoPE from
``rotary_dim``): its q/k norm's two Triton kernels assert CUDA tensors, so the CPU runtime runs them in torch
(sglang_r3/cpu_runtime/families/minimax_m2.py, checked against transformers' norm in tests/test_cpu_minimax_m2.py).
GLM-4.5V, Qwen3.5-MoE, Qwen3-VL-MoE, Kimi-K2.5 and Intern-S1 with an image in the prompt (the tokenizer carries the
releases' vision tokens, the processor runs on CPU): the image's tokens pass through the MoE layers like text, and their rows, ours and upstream's,
are transformers' router top-k over the pixels the checkpoint's own processor made (Intern-S1's: SGLang's own)
(``test_image_prompt_rows_are_transformers_router_topk``; GLM-4.5V's merger norm at SGLang's eps: ``SGLANG_NORM_EPS``). A Qwen3.5 vision config without
``deepstack_visual_indexes`` (transformers' own save) is refused at start-up: SGLang defaults it to Qwen3-VL's
[8, 16, 24], and the first image prompt stopped its scheduler (tests/test_startup_refusals.py).
GLM-4.5V / 4.6V (``Glm4vMoeForConditionalGeneration``, one-block vision tower and processor configs, text prompts and
with an image): GLM-4.5's text model (SGLang builds it with glm4_moe.py's Glm4MoeModel) under partial M-RoPE with
attention bias.
Qwen3-Omni-MoE (``Qwen3OmniMoeForConditionalGeneration`` as transformers' own class saves it: ``thinker.*`` tensors,
experts one by one, one-block vision and audio towers, no talker, its processor files; text prompts): SGLang's
qwen3_omni_moe.py builds the thinker only, a Qwen3-VL-MoE wrapper over Qwen3-MoE's decoder, from ``thinker_config``
(its text model in ``thinker_config.text_config``, which the config view reads); the oracle runs transformers' thinker
(the omni wrapper only generates); text prompts and with an image (the oracle given the processor's attention mask,
without which transformers' thinker gives the image's tokens text positions). Not proven: a prompt with audio.
JoyAI-LLM-Flash (Miles trains it): a ``DeepseekV3ForCausalLM`` under its own ``model_type: joyai_llm_flash``, whose
config class is the release's code, not read here (a stand-in: tests/checkpoints/configuration_joyai_llm_flash.py),
served with ``--trust-remote-code``; keys as the script's Megatron shapes (one expert group, q LoRA, RoPE base 3.2e7, no
MTP layers). transformers picks its weight conversions by model type, so the oracle reads the checkpoint as
DeepSeek-V3's (``STAND_INS``); under the release's name it left the experts at their initial values and 3 of
106 pairs differed.
Ling / Ring 2.0 (``BailingMoeV2ForCausalLM``, one NextN layer, served with MTP speculation on): transformers has no
class for it; the release's modeling code (inclusionAI/Ling-V2) computes what transformers' GLM-4.5 computes under
other names (checked once: its router top-k equal GLM-4.5's on 120 of 120 pairs, logits within 2e-7). So the checkpoint
is saved by ``Glm4MoeForCausalLM``, rewritten to the release's names and config (``model_type: bailing_moe``, a
stand-in for its config code: tests/checkpoints/configuration_bailing_moe_v2.py), served with ``--trust-remote-code``,
and read back as GLM-4.5's by the oracle (``AS_TRANSFORMERS``). Served first, 6 of 106 pairs differed: on the CPU
runtime its MoE block never applied the routed scaling factor (2.5) it leaves to the CUDA Triton runner; the CPU
runtime now applies it (sglang_r3/cpu_runtime/families/bailing_moe.py).
Intern-S1 (``InternS1ForConditionalGeneration``, one-layer InternViT tower, text prompts and with an image): its
remote code is transformers' InternVL under its own names over Qwen3-MoE's text model (SGLang's interns1.py builds
qwen3_moe.py's model by ``text_config.architectures``), saved by transformers' ``InternVLForConditionalGeneration``
with the release's tensor names and config (``model_type: interns1``, ``auto_map`` to a stand-in for its config code,
tests/checkpoints/configuration_interns1.py), served with ``--trust-remote-code``. Its image processor is SGLang's
own (multimodal/processors/internvl.py: 448-pixel tiles, ImageNet normalisation, bfloat16), so the oracle feeds
transformers' model that processor's pixels (``SGLANG_PROCESSED``), one tile (``image_max_dynamic_patch: 1``).
Moonlight-16B-A3B (``DeepseekV3ForCausalLM`` as published: no q LoRA, no RoPE scaling, one expert group, two shared
experts): SGLang's CPU path asserts a YaRN scaling for MLA's rotary embedding; the CPU runtime gives it the plain one
SGLang builds on other devices (sglang_r3/cpu_runtime/ops/rope.py). Its query and key projections are scaled 8x
(``qk_scale``): at transformers' init a tiny model's attention is near uniform and its rows hardly depend on
positions (RoPE's pair layout moved 0 of 120 pairs at 1x, 74 at 8x:
``test_the_moonlight_oracle_sees_ropes_pair_layout``); Kimi-K2.5 is built so too.
Kimi-K2.5 (``KimiK25ForConditionalGeneration``, one-block MoonViT tower, text prompts and with an image): DeepSeek-V3's
text model (one expert group, as published, no MTP layers), saved by transformers' ``Kimi_K25ForConditionalGeneration``
and rewritten as the Hub ships it (tensor names, config keys; transformers reads every tensor back:
``test_the_kimi_k25_checkpoint_is_in_the_hubs_layout_and_transformers_reads_all_of_it``). SGLang builds its processor
from the release's remote code, which a host without the Hub cannot fetch: the checkpoint carries a stand-in
(tests/checkpoints/kimi_k25_processor.py: the remote processor's API over transformers' image processor, so SGLang
serves the pixels transformers' processor makes), served with ``--trust-remote-code`` as the release is. Completions do not sample its media placeholders: transformers'
``Kimi_K25Model`` embeds those ids as id 0 whether or not an image stands behind them, SGLang as themselves, so a
text-sampled one routes otherwise on each side (seen: 1-2 pairs at exactly those tokens in some sampled runs).
Gemma-4 (``Gemma4ForConditionalGeneration``, one-layer vision tower, text prompts and with an image): a router and
GELU experts beside every layer's dense MLP, sliding-window (8 tokens) and full-attention layers, q/k/v norms. SGLang's
CPU norm path dropped the router's learned input scale (drawn here, not left at ones: half the pairs routed
otherwise); the CPU runtime applies it (sglang_r3/cpu_runtime/families/gemma4.py, checked against transformers' router
in tests/test_cpu_gemma4.py). Sliding and full-attention layers share one KV head shape here: with the published split
start-up refuses it on the CPU runtime (``gemma4_published_shapes``). Completions do not sample its image placeholder:
transformers' ``Gemma4Model`` embeds that id as the pad token where no image stands behind it, SGLang as itself.
With an image, its rows differed from the first image token on. Two causes, measured stage by stage: SGLang's vision
pooler pooled the padding patches' encoder states into the first soft token (transformers zeroes them:
sglang_r3/serving/adapter/gemma4_vision.py, every device; without it 58 of 1196 (token, layer) pairs differed), and
torch_native attended causally where transformers' sliding-window layers let an image's tokens attend to each other
both ways (the CPU runtime opens them there now: cpu_runtime/families/gemma4.py; causal, 301 differed; both checked against
transformers in tests/test_cpu_gemma4.py). With the mask SGLang's Triton path builds instead (every layer), 67
differed: a GPU's rows for an image prompt are refused (``image_attention``).
GLM-5 (``GlmMoeDsaForCausalLM``) and DeepSeek-V3.2 (``DeepseekV32ForCausalLM``): MLA with the DSA indexer, one NextN
layer, served with MTP speculation on. The CPU runtime attends to every key (sglang_r3/cpu_runtime/ops/dsa.py),
DSA's own result while a sequence fits in ``index_topk`` (2048 here, as published; start-up refuses a longer context
there): transformers' indexer then keeps every key too. With ``index_topk`` 8 in transformers, 48 of 120 (token,
layer) pairs of a 60-token prompt moved, from token 8 on: the indexer decides there, and the oracle sees it
(``test_the_dsa_oracle_sees_the_indexer_once_a_sequence_passes_index_topk``).
Qwen2-MoE (Qwen1.5-MoE: softmax top-k, no renormalisation, a gated shared expert): the shared expert's gate runs in
torch on CPU (cpu_runtime/ops/gdn.py's hook, both releases).
Nemotron-3-Nano (``NemotronHForCausalLM``): Mamba-2, attention, MLP and MoE blocks of one hybrid pattern (``ME*EM-E``,
config.json as nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 spells it: ``hybrid_override_pattern``, ``n_groups`` 8, ...),
every block a decoder layer, MoE at the E blocks (sigmoid scores with a selection bias, one group, renormalized and
scaled by ``routed_scaling_factor``, non-gated ReLU^2 experts and a ReLU^2 shared expert). SGLang's CPU path has no
Mamba-2 kernels (its causal convolutions are unbound on a CPU import of ``mamba.py``, its SSD scan and state update
Triton), no CPU ``torch.mm`` with ``out_dtype`` for the router and no non-gated ReLU^2 in ``moe_forward_native``: the CPU
runtime runs them in torch (sglang_r3/cpu_runtime/ops/mamba2.py and nemotron_h.py, checked against transformers'
torch code in tests/test_cpu_mamba2.py). Served with ``SGLANG_MAMBA_CONV_DTYPE=float32``: SGLang keeps a Mamba layer's
convolution window in bfloat16 whatever ``--dtype`` says (on CUDA too), and with it a float32 model's decode was ~1e-4
off transformers' logprobs (1 to 3 of ~400 sampled (token, layer) pairs moved). Its time-step biases are kept above
``time_step_min``: transformers' chunked scan (the oracle's one forward) clamps the step there, SGLang's kernels and
transformers' own decode do not. The checkpoint carries Nemotron-3-Ultra's MTP head (``num_nextn_predict_layers`` 1,
``mtp_hybrid_override_pattern`` ``*E``: an attention and a MoE block, ``mtp.layers.{0,1}.*``), served with MTP
speculation on: each verify runs the Mamba-2 mixers over the drafts (cpu_runtime/ops/mamba2.py keeps each step's state and window,
cpu_runtime/ops/gdn.py's commit writes the accepted step's), and every main row is still transformers' router top-k. Its flipped
checkpoint (the same head) is served with speculation off, as a checkpoint with an MTP head is when a user does not
speculate.
gpt-oss (softmax over the top-k router logits with a router bias, clamped SwiGLU experts with biases, attention
sinks, sliding-window layers of 8 tokens alternating with full ones): SGLang asserts an attention backend with sinks
(torch_native has none) and picks the triton_kernels MoE runner; the CPU runtime adds the sinks to torch_native
(sglang_r3/cpu_runtime/families/gpt_oss.py, checked against transformers' eager attention in
tests/test_cpu_gpt_oss.py) and keeps the MoE runner auto (moe_forward_native). Without the sinks, 18 of 106 greedy
(token, layer) pairs differed from transformers'. Served on both releases by hand; CI serves it on 0.5.23.

Families that do not run here, and why (SGLang 0.5.23, torch_native attention, CPU):
- Llama 4 text-only checkpoints (``Llama4ForCausalLM``): refused at start-up by their layout rule. Served,
  their rows differed from transformers' (12 of 106 greedy pairs): SGLang's llama4.py loads q/k_proj as saved and
  rotates half-split pairs, transformers rotates interleaved ones; only mllama4.py (Llama4ForConditionalGeneration)
  permutes the weights at load (``permute_qk_weight_for_rotary``) -- and that served checkpoint matches.
- GLM-4.7-Flash with q_lora_rank null (DeepSeek-V2-Lite-style attention, one ``q_proj``): refused at start-up by its
  layout rule. Served, 3% of its (token, layer) pairs agreed with transformers': glm4_moe_lite.py's load_weights
  renames ``self_attn.q_proj`` through its ``("qkv_proj", "q_proj", "q")`` stacking entry, finds no such
  parameter and skips it, so q_proj keeps its initial values (a DeepSeek-V3 checkpoint with q_lora_rank null, loaded
  by deepseek_v2.py, agrees 100%).
- Qwen3-VL-MoE saved by transformers 5.19's ``save_pretrained`` (``qwen3_vl_moe_transformers_save``): start-up
  stops loading the weights: ``qwen3_vl_moe.py load_fused_expert_weights`` hands each expert's slice of transformers
  5's fused ``mlp.experts.down_proj`` ([experts, hidden, intermediate]) to ``FusedMoE``'s ``_load_w2``, which expects
  the Hub's layout, transposed ("The size of tensor a (64) must match the size of tensor b (32)"). The checkpoint
  as the Hub ships it (fused experts transposed, as transformers' own conversion mapping reads them back) is
  served (``qwen3_vl_moe``, text prompts and with an image; its processor registers once cpu_runtime/ops/gdn.py provides the
  ``*_cpu`` ops models/qwen3_5.py reads at import).
  (tests: ``test_families_not_served_on_cpu_stop_where_the_docstring_says`` checks each of these stops.)
- MiniMax-M2 with a config without ``use_qk_norm: true``: refused by the layout rule. Served that way (SGLang's
  default builds no q/k norm) its rows differed from transformers', which always normalises q and k.
- Config-space flips (``REFUSED_FLIPS`` in tests/family_specs/specs.py), each refused by its layout rule naming the key:
  OLMoE with ``attention_bias``, ``clip_qkv`` or ``norm_topk_prob`` set (olmoe.py hard-codes no bias, no clipping,
  no renormalisation; served with the three, 105 of 106 pairs differed); Mixtral with a ``head_dim`` other than
  hidden_size // num_attention_heads (mixtral.py sizes heads from the latter; the first forward stopped on a shape
  mismatch) or a ``sliding_window`` shorter than the context (mixtral.py attends to every key); Qwen3-MoE with
  ``mlp_only_layers`` (qwen3_moe.py builds every layer MoE); Qwen3-Next and Qwen3.5 with ``attention_bias``
  (qwen3_next.py / qwen3_5.py build no attention biases; ~70% of pairs differed); ERNIE-4.5 with ``use_bias``
  (transformers then saves an lm_head.bias SGLang has no parameter for; its load stopped); and
  ``tie_word_embeddings: true`` for every architecture whose SGLang model never ties its head
  (``UNTIED_HEAD_ARCHITECTURES``, checked by tests/scripts/sweep.py; OLMoE tied: rows agreed, every greedy logprob
  did not).
  These are refused on the checkpoint's config.json before SGLang loads a weight (refusals.startup).
- MiMo-V2-Flash: refused at start-up by its family entry (sglang_r3/core/families/): SGLang builds its layers from
  per-layer lists transformers' MiMoV2FlashConfig ignores, and its 3 dense MTP layers are served as one draft
  layer or by multi-layer EAGLE, unproven for it -- so there is no checkpoint both sides read alike to serve.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from sglang_r3.core.layout import ROLE_DENSE, ROLE_MOE, ROLE_MTP, LayoutError, layout_from_model_path
from tests.family_specs.build import build, initialized
from tests.family_specs.groups import GROUPS, MTP_FLAGS, RELEASE_FAMILIES, SERVERS, serve_group, stop_ahead
from tests.family_specs.oracle import (IMAGE_FAMILIES, IMAGE_REQUEST, NEAR_TIE_LOGIT, NEAR_TIES_PER_RESPONSE,
                                       SGLANG_NORM_EPS, SGLANG_PROCESSED, RouterTrace, dense_or_moe, load_transformers,
                                       with_sglang_norm_eps)
from tests.family_specs.specs import FLIPPED, REFUSED_FLIPS, SPECS, CheckpointSpec
from tests.support.routing_http import fetch_layout, generate, record_of

pytestmark = pytest.mark.server

PROMPTS = ["The quick brown fox jumps over", "Routing replay: 1, 2, 3,", "MoE"]
SAMPLING = {
    "greedy": {"temperature": 0.0},
    "sampled": {"temperature": 1.0, "top_p": 0.9},
}
NEW_TOKENS = 24


def groups(*names: str) -> list:
    """Server groups as ``served``'s parameters: the release mark with each group served on SGLang 0.5.15.post1 too.
    A test that parametrizes ``served`` indirectly passes its own list through this, or pytest drops the mark the
    fixture's own params carry and the 0.5.15.post1 stage never selects it (tests/test_release_stage.py)."""
    return [pytest.param(g, marks=pytest.mark.release) if g in RELEASE_FAMILIES else g for g in names]


@pytest.fixture(scope="module", params=groups(*sorted(GROUPS)))
def served(request, _group_order):
    """One family's servers at a time: pytest runs every test of a family, then the next family (the next ones'
    servers start while this family's tests run: tests/family_specs/groups.py serve_group)."""
    order, done = _group_order
    then = order[len(done) + 1:] if order[len(done):len(done) + 1] == [request.param] else ()
    done.append(request.param)
    yield from serve_group(request.param, then=then)


@pytest.fixture(scope="session")
def _group_order(request):
    """The groups in the order pytest sets ``served`` up (its items, reordered by module-scoped parameter: one
    block per group), and the groups set up so far."""
    from tests.support.ordering import values_in_order

    yield values_in_order(request.session.items, "served"), []
    stop_ahead()


@pytest.fixture(scope="module")
def oracles():
    """transformers' model and router hooks per family, loaded once."""
    out = {}
    yield lambda name: out.setdefault(
        name, RouterTrace(with_sglang_norm_eps(name, load_transformers(build(SPECS[name])))))
    for trace in out.values():
        trace.close()


@pytest.fixture(scope="module")
def draft_oracles():
    """transformers' router top-k of each family's MTP layer (tests/support/mtp_oracle.py), loaded once."""
    from tests.support.mtp_oracle import DraftOracle

    out = {}

    def get(name):
        if name not in out:
            out[name] = DraftOracle(SPECS[name], build(SPECS[name]))
            with_sglang_norm_eps(name, out[name].model)
        return out[name]

    yield get
    for oracle in out.values():
        oracle.close()


def _upstream_rows(b64: str, T: int, num_layers: int, topk: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype=np.int32).reshape(T - 1, num_layers, topk)


def test_layout_roles_are_transformers_module_tree(served, oracles):
    for name in served.families:
        _check_layout_roles(name, served.urls[name], oracles)


def _check_layout_roles(name, url, oracles):
    layout = fetch_layout(url)
    model = oracles(name).model
    decoder = [l for l in layout.layers if l.role != ROLE_MTP]
    assert [l.role for l in decoder] == dense_or_moe(model)
    # MTP layers: transformers builds none; the checkpoint carries SPECS[name].mtp_layers NextN layers.
    text_config = getattr(model.config, "text_config", model.config)
    assert [(l.id, l.depth) for l in layout.mtp_layers] == [
        (text_config.num_hidden_layers + d, d + 1) for d in range(SPECS[name].mtp_layers)
    ]
    for l in layout.moe_layers + tuple(m for m in layout.mtp_layers if m.num_experts):  # ERNIE's MTP is dense
        assert (l.num_experts, l.topk) == tuple(SPECS[name].experts_topk(model.config))
    # The trainer reading the checkpoint's config.json (as save_pretrained spelled it) agrees, fingerprint too.
    if name == "qwen3_moe":  # the spelling that used to stop the scheduler ("missing 'num_experts'")
        saved = json.loads((build(SPECS[name]) / "config.json").read_text())
        assert saved["num_local_experts"] == 8 and "num_experts" not in saved
    assert layout_from_model_path(str(build(SPECS[name]))) == layout
    assert layout_from_model_path(str(build(SPECS[name]))).fingerprint == layout.fingerprint


@pytest.mark.parametrize("mode", sorted(SAMPLING))
def test_captured_rows_are_transformers_router_topk(served, oracles, mode):
    # A flipped checkpoint proves its keys' math with greedy completions (rows and logprobs); sampling is its
    # family's to prove, once.
    for name in (n for n in served.families if mode == "greedy" or not n.endswith("_flipped")):
        _check_rows(name, served.urls[name], oracles, mode)


def _sampling(name, mode) -> dict:
    params = {**SAMPLING[mode], "max_new_tokens": NEW_TOKENS}
    if SPECS[name].not_sampled:
        params["logit_bias"] = {str(t): -1e4 for t in SPECS[name].not_sampled}
    return params


def _check_rows(name, url, oracles, mode):
    trace = oracles(name)
    prompts = [list(p.encode()) for p in PROMPTS]
    outs = generate(
        url, input_ids=prompts, return_routing=True, return_routed_experts=True,
        sampling_params=_sampling(name, mode), return_logprob=mode == "greedy",
    )
    pairs = 0
    for prompt, out in zip(prompts, outs):
        tokens = prompt + list(out["output_ids"])
        T = len(tokens)
        assert len(out["output_ids"]) >= 1
        want = trace.topk(tokens)[: T - 1]  # the last token was never an input
        got = _compare_rows(name, mode, url, out, want, T, trace)
        pairs += got.shape[0] * got.shape[1]
        if mode == "greedy":
            _assert_logprobs(name, trace, out, len(prompt))
    assert pairs > 0


# Rows alone miss what acts after the last router (the LM head, tied or not; final norms, logit soft-capping): the
# greedy completion's logprobs, SGLang's, are transformers' too. float32 both sides: far below a wrong head's error.
LOGPROB_ATOL = 1e-3


def _assert_logprobs(name, trace, out, prompt_len):
    import torch

    served = [(lp, tok) for lp, tok, *_ in out["meta_info"]["output_token_logprobs"]]
    assert [t for _, t in served] == list(out["output_ids"])
    logits = trace.logits.clone()
    logits[:, list(SPECS[name].not_sampled)] -= 1e4  # the request's logit_bias: SGLang's logprobs include it
    logprobs = torch.log_softmax(logits, dim=-1)
    want = [float(logprobs[prompt_len - 1 + i, tok]) for i, (_, tok) in enumerate(served)]
    np.testing.assert_allclose([lp for lp, _ in served], want, rtol=0, atol=LOGPROB_ATOL,
                               err_msg=f"{name}: greedy completion logprobs differ from transformers'")


def _image(side: int):
    """A square RGB PNG of seeded noise and its data URL, as a client sends it."""
    import io

    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return Image.open(io.BytesIO(buf.getvalue())), "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("served", groups(*sorted(IMAGE_FAMILIES)), indirect=True)
@pytest.mark.parametrize("mode", sorted(SAMPLING))
def test_image_prompt_rows_are_transformers_router_topk(served, oracles, mode):
    """The prompt as a client sends it (text with the vision tokens, the image as a data URL); the oracle is the
    checkpoint's own transformers processor (input ids with the image pads expanded, pixel values, M-RoPE token
    types) and transformers' model over prompt + completion with the pixels."""
    import torch
    import transformers

    name = served.family
    text, side = IMAGE_FAMILIES[name]
    image, url_data = _image(side)
    folder = build(SPECS[name])
    if name in SGLANG_PROCESSED:  # the release's processor is SGLang's own, not transformers'
        prompt, pixels = SGLANG_PROCESSED[name](folder, text, image)
        image_token_id = json.loads((folder / "config.json").read_text())["image_token_id"]
    else:
        processor = transformers.AutoProcessor.from_pretrained(str(folder))
        enc = processor(text=[text], images=[image], return_tensors="pt")
        prompt = enc["input_ids"][0].tolist()
        image_token_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)  # Qwen3-Omni's: no _id
        pixels = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    assert prompt.count(image_token_id) > 1  # the processor expanded the one placeholder the text holds
    out = generate(served.url, text=text, image_data=url_data, return_routing=True, return_routed_experts=True,
                   sampling_params=_sampling(name, mode), **IMAGE_REQUEST.get(name, {}))
    assert out["meta_info"]["prompt_tokens"] == len(prompt)
    tokens = prompt + list(out["output_ids"])
    if name not in SGLANG_PROCESSED and "mm_token_type_ids" in enc:  # M-RoPE's token types: the completion is text
        pixels["mm_token_type_ids"] = torch.cat(
            [enc["mm_token_type_ids"], torch.zeros(1, len(out["output_ids"]), dtype=torch.long)], dim=1)
    # The attention mask a processor returns, over prompt + completion: transformers' Qwen3-Omni thinker computes its
    # M-RoPE positions only when given one (without it the image's tokens got text positions: 9 of 94 pairs differed).
    pixels["attention_mask"] = torch.ones(1, len(tokens), dtype=torch.long)
    trace = oracles(name)
    want = trace.topk(tokens, **pixels)[: len(tokens) - 1]
    got = _compare_rows(name, mode, served.url, out, want, len(tokens), trace)
    # The pixels reached the rows: the same ids without the image (its pads embedded as plain tokens) route otherwise.
    assert (trace.topk(tokens)[: len(tokens) - 1] != got).any()


def _assert_router_topk(what, trace, got, want):
    """``got`` (sorted rows) is ``want``, transformers' router top-k from ``trace``'s last forward, but for at most
    NEAR_TIES_PER_RESPONSE pairs that are float32 near ties in transformers' own router (RouterTrace.near_tie): a
    sampled completion meets one now and then, and SGLang's op order may decide it the other way."""
    mismatch = [tuple(m) for m in np.argwhere((got != want).any(axis=-1)).tolist()]
    ties = [(t, c) for t, c in mismatch if trace.near_tie(c, t, got[t, c])]
    wrong = [m for m in mismatch if m not in ties]
    assert not wrong and len(ties) <= NEAR_TIES_PER_RESPONSE, (
        f"{what}: {len(mismatch)} of {got.shape[0] * got.shape[1]} (token, MoE layer) pairs differ from "
        f"transformers, first at (token, layer column) {wrong[:5]} (ours {[got[m].tolist() for m in wrong[:5]]}, "
        f"transformers' {[want[m].tolist() for m in wrong[:5]]}; the logit move that makes transformers pick ours: "
        f"{[_move_to_pick(trace, t, c, got[t, c]) for t, c in wrong[:5]]}); near ties within {NEAR_TIE_LOGIT} of a "
        f"logit ({len(ties)}, at most {NEAR_TIES_PER_RESPONSE} allowed): {ties[:5]}"
    )


def _move_to_pick(trace, token, column, chosen) -> str:
    """For a failure message: the least of a ladder of logit moves past which transformers' router picks
    ``chosen``. transformers' own float32 error is below the first rung (GLM-4.7-Flash's test checkpoint: router
    logits within 2e-6 of float64's over 60 tokens); SGLang's other op orders reach up to NEAR_TIE_LOGIT; the wrong
    rows found so far took 0.1 and more."""
    for delta in (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0):
        if trace.near_tie(column, token, chosen, delta=delta):
            return f"<= {delta:g}"
    return "> 10 (or a router near_tie cannot move)"


@pytest.mark.fast  # transformers only
@pytest.mark.release  # each release's transformers: 5.12's GLM / DeepSeek blocks route the gate's logits themselves
@pytest.mark.parametrize("name", ["glm4_moe_lite", "qwen3_moe", "llama4", "gpt_oss"])
def test_a_near_tie_is_what_transformers_router_picks_with_logits_moved_by_at_most_delta(name):
    """RouterTrace.near_tie, which lets a few sampled pairs differ: its own pick is one at no move; the expert with
    the lowest logit swapped in is none within NEAR_TIE_LOGIT, and is one once the move is large enough."""
    import torch

    torch.set_num_threads(1)
    trace = RouterTrace(load_transformers(build(SPECS[name])))
    try:
        tokens = list(PROMPTS[0].encode())
        want = trace.topk(tokens)
        token, column = 5, want.shape[1] - 1
        own = want[token, column]
        assert trace.near_tie(column, token, own, delta=0.0)
        layer = sorted(trace.rows)[column]
        assert len(trace.rows[layer]) == 1  # near_tie's own calls are not recorded
        gate = trace._gates[layer]
        with torch.no_grad():
            out = gate(torch.cat(trace._inputs[layer])[token][None])
        logits = (out[0] if isinstance(out, tuple) else out)[0]  # transformers 5.12's gate returns the logits alone
        lowest = min((e for e in range(logits.shape[0]) if e not in own), key=lambda e: float(logits[e]))
        swapped = np.sort(np.array([*own[:-1], lowest]))
        assert not trace.near_tie(column, token, swapped)
        assert trace.near_tie(column, token, swapped, delta=50.0)  # within softmax's and sigmoid's float32 range
    finally:
        trace.close()
    # docs/models.md's "served forward" states the allowance: these numbers.
    words = " ".join((Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text().split())
    assert f"At most {['zero', 'one', 'two', 'three'][NEAR_TIES_PER_RESPONSE]} (token, layer) pairs" in words
    assert f"most {NEAR_TIE_LOGIT:.0e} (`RouterTrace.near_tie`".replace("e-0", "e-") in words


# Keys that act only together (grouped top-k: topk_group groups of n_group, and DeepSeek-V2's topk_method that
# turns it on): flipped together.
# partial RoPE given twice, as published (the attribute SGLang reads, rope_parameters' transformers reads);
# MiniMax-M2 gives it a third time, as rotary_dim (what its SGLang model reads)
_FLIP_TOGETHER = (("n_group", "topk_group"), ("partial_rotary_factor", "rope_parameters"),
                  ("partial_rotary_factor", "rope_parameters", "rotary_dim"),
                  ("topk_method", "n_group", "topk_group"), ("use_sliding_window", "sliding_window"),
                  # Gemma-4: the KV-sharing layers' double-wide MLP; the per-layer input embeddings' table
                  ("num_kv_shared_layers", "use_double_wide_mlp"),
                  ("hidden_size_per_layer_input", "vocab_size_per_layer_input"))


@pytest.mark.fast  # transformers only
@pytest.mark.parametrize("name", sorted([f"{b}_flipped" for b in FLIPPED] + list(REFUSED_FLIPS)))
def test_every_flipped_key_changes_transformers_model(name):
    """A flipped key that changed nothing would prove nothing: each key of a flipped checkpoint (FLIPPED, or a
    refused one: REFUSED_FLIPS), or each group of keys that act together, set alone the other way, changes
    transformers' module tree (parameter names and shapes) or, the weights drawn alike (the flipped checkpoint's
    draw), its logits."""
    import torch

    torch.set_num_threads(1)
    base, keys = REFUSED_FLIPS[name][:2] if name in REFUSED_FLIPS else (name[:-8], FLIPPED[name[:-8]])  # "_flipped"
    flipped = SPECS[name]
    tokens = torch.tensor([list(PROMPTS[0].encode())])

    def fingerprint(text):
        model = initialized(flipped, text)
        with torch.no_grad():
            logits = flipped.forward_of(model)(input_ids=tokens).logits
        return {n: tuple(p.shape) for n, p in model.named_parameters()}, logits

    groups = [g for g in _FLIP_TOGETHER if set(g) <= set(keys)]
    groups = [g for g in groups if not any(set(g) < set(h) for h in groups)]  # the widest that apply
    units = groups + [(k,) for k in keys if not any(k in g for g in groups)]
    shapes0, logits0 = fingerprint(SPECS[base].config)
    inert = []
    for unit in units:
        shapes, logits = fingerprint({**SPECS[base].config, **{k: keys[k] for k in unit}})
        if shapes == shapes0 and torch.allclose(logits, logits0, rtol=0.0, atol=1e-6):
            inert.append(unit)
    assert not inert, f"{name}: flipping {inert} changed neither transformers' modules nor its logits"


def _compare_rows(name, mode, url, out, want, T, trace) -> np.ndarray:
    """Our record for one response against ``want`` ([T - 1, MoE layers, top-k], sorted: ``trace``'s last forward),
    and a format check of our ``routed_experts`` field (our record re-encoded, not plain SGLang's capturer: that
    oracle runs on the embedded model, tests/test_serving.py); returns our rows, sorted."""
    layout = fetch_layout(url)
    moe_cols = list(layout.moe_layer_ids)
    dense_cols = [l.id for l in layout.layers if l.role == ROLE_DENSE]
    record = record_of(out)
    assert record.experts.shape == (T - 1, len(moe_cols), layout.topk) and record.start == 0
    got = np.sort(record.experts.astype(np.int64), axis=-1)
    _assert_router_topk(f"{name}/{mode}", trace, got, want)
    upstream = _upstream_rows(out["meta_info"]["routed_experts"], T, layout.num_hidden_layers, layout.topk)
    np.testing.assert_array_equal(np.sort(upstream[:, moe_cols], axis=-1), got,
                                  err_msg="format check: our field re-encodes our record")
    assert not upstream[:, dense_cols].any(), "format check: our field re-encodes our record"
    return got


@pytest.mark.parametrize("served", groups("step3p5"), indirect=True)
def test_step3p5_is_served_with_the_window_sglang_attends_one_key_longer_than_published(served):
    """SGLang's step3p5.py attends sliding_window + 1 keys, the release's modeling code and transformers' Step3p7
    sliding_window (tests/family_specs/published.py, STEP3P5_SGLANG_WINDOW_EXTRA): the flipped checkpoint's window (4)
    is shorter than its sequences, its rows equal transformers' at the window SGLang attends (the family's oracle,
    test_captured_rows_are_transformers_router_topk) and differ at the published one. If SGLang comes to attend the
    published window, this fails: drop the extra key from the oracle."""
    from tests.family_specs.published import _step3p5_as_step3p7

    name = "step3p5_flipped"
    assert SPECS[name].config["sliding_window"] == 4
    published = RouterTrace(with_sglang_norm_eps(name, load_transformers(
        _step3p5_as_step3p7(build(SPECS[name]), sglang_window=False))))
    try:
        url = served.urls[name]
        moe_cols = list(fetch_layout(url).moe_layer_ids)
        prompts = [list(p.encode()) for p in PROMPTS]
        outs = generate(url, input_ids=prompts, return_routing=True, sampling_params=_sampling(name, "greedy"))
        differ = pairs = 0
        for prompt, out in zip(prompts, outs):
            tokens = prompt + list(out["output_ids"])
            got = np.sort(record_of(out).experts.astype(np.int64), axis=-1)
            want = published.topk(tokens)[: len(tokens) - 1]
            assert got.shape == want.shape and len(moe_cols) == got.shape[1]
            differ += int((got != want).any(axis=-1).sum())
            pairs += got.shape[0] * got.shape[1]
        assert differ > 0, f"all {pairs} (token, layer) pairs equal transformers' at the published window"
    finally:
        published.close()


def _qwen3_with_a_dense_layer() -> CheckpointSpec:
    base = SPECS["qwen3_moe"]
    return CheckpointSpec("qwen3_moe_mlp_only", base.config_class, base.model_class,
                          {**base.config, "mlp_only_layers": [0]})


def _launch(path):
    from tests.family_specs.groups import SERVE_FLAGS
    from tests.support.servers import ServerProcess

    return ServerProcess(["--model-path", str(path), *SERVE_FLAGS]).start()


def _refusal_of(server) -> str:
    """What our launcher said when it refused to serve (it must exit)."""
    try:
        with pytest.raises(RuntimeError, match="server exited") as info:
            server.wait_ready()
    finally:
        server.stop()
    return str(info.value)


def _start_up_refusal(path) -> str:
    """What our launcher says when it refuses to serve the checkpoint at ``path``."""
    return _refusal_of(_launch(path))


def _read_in_process(name) -> bool:
    # The launcher runs the layout rule on config.json before a weight loads (refusals.startup), as the one refused
    # flip launched shows (ERNIE's, whose load would stop first on its own); the other flips are read in-process.
    return name in REFUSED_FLIPS and name != "ernie4_5_moe_use_bias"


@pytest.fixture(scope="module")
def launched_refusals(request):
    """Our launcher started on every selected not-served checkpoint that is launched, all at once: each stops at
    start-up after a SGLang import, which started one by one would run in series on one core."""
    selected = {item.callspec.params["name"] for item in request.session.items
                if item.originalname == "test_families_not_served_on_cpu_stop_where_the_docstring_says"}
    servers = {n: _launch(build(SPECS[n])) for n in sorted(selected) if not _read_in_process(n)}
    yield lambda name: _refusal_of(servers[name])
    for server in servers.values():
        server.stop()


@pytest.mark.fast  # transformers only
@pytest.mark.parametrize("name", ["glm_moe_dsa", "deepseek_v32"])
def test_the_dsa_oracle_sees_the_indexer_once_a_sequence_passes_index_topk(name):
    # The DSA families' rows are compared at index_topk 2048 (as published), where the indexer keeps every key. That
    # comparison is only worth something if transformers' routing depends on the indexer where it does select: at
    # index_topk 8 the rows of the first 8 tokens (every key kept) stay, and later ones move.
    ids = list(np.random.RandomState(0).randint(0, 256, size=60))  # byte tokens of the test tokenizer
    rows = {}
    for k in (2048, 8):
        model = load_transformers(build(SPECS[name]))
        for module in model.modules():
            if hasattr(module, "index_topk"):
                module.index_topk = k
        trace = RouterTrace(model)
        rows[k] = trace.topk(ids)
        trace.close()
    moved = (rows[2048] != rows[8]).any(-1)  # [token, MoE layer]
    assert not moved[:8].any()
    assert moved[8:].sum() >= 10, moved.sum()


@pytest.mark.fast  # transformers only
def test_the_moonlight_oracle_sees_ropes_pair_layout():
    # Moonlight's served rows prove cpu_runtime/ops/rope.py's rotary embedding only if transformers' rows depend on the rotation:
    # with RoPE's pairs laid out half-split instead of interleaved (rope_interleave, which SGLang reads as
    # is_neox_style), rows move -- at the checkpoint's qk_scale, not at transformers' init (near-uniform attention).
    from dataclasses import replace

    ids = list(np.random.RandomState(0).randint(0, 256, size=60))
    moved = {}
    for scale in (1.0, SPECS["moonlight"].qk_scale):
        rows = {}
        for interleave in (True, False):
            model = load_transformers(build(replace(SPECS["moonlight"], qk_scale=scale)))
            model.config.rope_interleave = interleave
            trace = RouterTrace(model)
            rows[interleave] = trace.topk(ids)
            trace.close()
        moved[scale] = int((rows[True] != rows[False]).any(-1).sum())
    assert moved[1.0] <= 2, moved  # the blind spot qk_scale exists for
    assert moved[SPECS["moonlight"].qk_scale] >= 30, moved


@pytest.mark.fast  # transformers only
def test_the_kimi_k25_checkpoint_is_in_the_hubs_layout_and_transformers_reads_all_of_it():
    # Written as moonshotai/Kimi-K2.5 ships it (tests/family_specs/published.py _kimi_k25_as_published): transformers'
    # conversion mapping for the Hub files finds every tensor it needs and no other, and the text model's tensors
    # (routers and their selection bias included) are read as written.
    import torch
    import transformers
    from safetensors.torch import load_file

    path = build(SPECS["kimi_k25"])
    model, info = transformers.Kimi_K25ForConditionalGeneration.from_pretrained(
        str(path), dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info
    saved = {k: v for shard in path.glob("*.safetensors") for k, v in load_file(str(shard)).items()}
    assert {k.split(".")[0] for k in saved} == {"language_model", "mm_projector", "vision_tower"}
    assert any(k.startswith("vision_tower.encoder.blocks.0.wqkv") for k in saved)
    params = model.state_dict()
    text = {k: v for k, v in saved.items() if k.startswith("language_model.model.layers.") and ".experts." not in k}
    assert any(k.endswith("mlp.gate.e_score_correction_bias") for k in text)
    for k, v in text.items():
        assert torch.equal(params[k.replace("language_model.model.", "model.language_model.")], v), k


@pytest.mark.fast  # transformers only
def test_the_interns1_checkpoint_is_in_the_releases_layout_and_transformers_reads_all_of_it():
    # Written as internlm/Intern-S1 ships it (tests/family_specs/published.py _interns1_as_published): the module
    # names its remote code loads and SGLang's interns1.py maps, its config class the checkpoint's own (the stand-in),
    # and transformers' InternVL reads every tensor as written, none missing (its lm_head is not a fresh one).
    import torch
    import transformers
    from safetensors.torch import load_file

    path = build(SPECS["interns1"])
    config = json.loads((path / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "configuration_interns1.InternS1Config"}
    assert (path / "configuration_interns1.py").is_file()
    model, info = transformers.InternVLForConditionalGeneration.from_pretrained(
        str(path), dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info
    saved = {k: v for shard in path.glob("*.safetensors") for k, v in load_file(str(shard)).items()}
    assert {k.split(".")[0] if k.startswith("lm_head") else ".".join(k.split(".")[:2]) for k in saved} == {
        "lm_head", "model.language_model", "model.vision_tower", "model.multi_modal_projector"}
    # experts one by one, as the release stores them (SGLang's expert_params_mapping reads gate_proj / up_proj /
    # down_proj per expert; transformers fuses them when it loads)
    assert any(k.endswith("mlp.experts.0.gate_proj.weight") for k in saved)
    params = model.state_dict()
    rest = {k: v for k, v in saved.items() if ".experts." not in k}
    assert rest.keys() == {k for k in params if ".experts." not in k}
    for k, v in rest.items():
        assert torch.equal(params[k], v), k


@pytest.mark.fast  # transformers only
def test_the_joyai_checkpoint_names_its_own_model_type_and_the_oracle_reads_every_tensor():
    # JoyAI-LLM-Flash's config.json names model_type joyai_llm_flash (its config class the checkpoint's own: the
    # stand-in) over DeepseekV3ForCausalLM. transformers picks its weight conversions by model type: read under that
    # name it leaves the experts (stored one by one) at their initial values, so the oracle reads it as DeepSeek-V3's
    # (STAND_INS), which loads every tensor.
    import torch
    import transformers

    path = build(SPECS["joyai_llm_flash"])
    config = json.loads((path / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("joyai_llm_flash", ["DeepseekV3ForCausalLM"])
    assert SPECS["joyai_llm_flash"].stand_in == config["model_type"]  # what the family table says
    assert config["auto_map"] == {"AutoConfig": "configuration_joyai_llm_flash.JoyAILLMFlashConfig"}
    assert (path / "configuration_joyai_llm_flash.py").is_file()
    _, info = transformers.DeepseekV3ForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                                 output_loading_info=True)
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in info["missing_keys"])
    oracle = load_transformers(path)
    want = initialized(SPECS["joyai_llm_flash"], SPECS["joyai_llm_flash"].config).state_dict()
    got = oracle.state_dict()
    assert want.keys() == got.keys()
    for k, v in want.items():
        assert torch.equal(got[k], v), k


@pytest.mark.fast  # transformers only
def test_the_ling_2_checkpoint_has_the_releases_names_and_the_oracle_reads_every_tensor():
    # Ling 2.0 as published: the module names of the release's modeling_bailing_moe_v2.py (BailingMoeV2Attention's
    # query_key_value / dense / query_layernorm / key_layernorm, BailingMoeV2Gate's expert_bias, the NextN layer
    # BailingMoeV2MTPLayer's enorm / hnorm / eh_proj / final_layernorm, no head or embedding of its own), none of
    # GLM-4.5's; the oracle is GLM-4.5's class over the same tensors, every one of them read.
    import torch
    import transformers
    from safetensors import safe_open

    from tests.family_specs.published import _bailing_as_glm4_moe

    path = build(SPECS["bailing_moe_v2"])
    config = json.loads((path / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("bailing_moe", ["BailingMoeV2ForCausalLM"])
    assert SPECS["bailing_moe_v2"].stand_in == config["model_type"]  # what the family table says
    assert config["auto_map"] == {"AutoConfig": "configuration_bailing_moe_v2.BailingMoeV2Config"}
    assert (path / "configuration_bailing_moe_v2.py").is_file()
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    L = config["num_hidden_layers"]
    assert "model.word_embeddings.weight" in names and "lm_head.weight" in names
    assert not [n for n in names if any(g in n for g in ("self_attn", "embed_tokens", "shared_head", "e_score"))]
    for i in range(L + 1):
        assert {f"model.layers.{i}.attention.{m}.weight" for m in ("query_key_value", "dense", "query_layernorm",
                                                                    "key_layernorm")} <= names
    assert f"model.layers.{L - 1}.mlp.gate.expert_bias" in names
    assert {f"model.layers.{L}.{m}.weight" for m in ("enorm", "hnorm", "eh_proj", "final_layernorm")} <= names
    _, info = transformers.Glm4MoeForCausalLM.from_pretrained(str(_bailing_as_glm4_moe(path)), dtype=torch.float32,
                                                              output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info


@pytest.mark.sglang  # SGLang's module built in a fresh process, as the sweep builds it
def test_the_norm_eps_the_oracle_takes_from_sglang_is_sglangs_and_differs_from_transformers():
    # SGLANG_NORM_EPS is a difference of SGLang's model, not a choice of ours: SGLang builds the norm with that eps and
    # transformers with another. When either side changes, this fails and the entry goes.
    import subprocess
    import sys

    code = (
        "from tests.scripts import sweep\n"
        "sweep.init_runtime()\n"
        "import torch\n"
        "from sglang.srt.models.glm4v import Glm4vPatchMerger\n"
        "with torch.device('meta'):\n"
        "    print(Glm4vPatchMerger(d_model=64, context_dim=64).post_projection_norm.variance_epsilon)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    sglang_eps = float(out.stdout.strip().splitlines()[-1])
    model = load_transformers(build(SPECS["glm4v_moe"]))
    (path, eps), = SGLANG_NORM_EPS["glm4v_moe"].items()
    assert sglang_eps == eps
    assert model.get_submodule(path).eps != eps  # transformers' own (1e-5)


@pytest.mark.sglang  # the launcher refuses before SGLang serves
def test_qwen_mlp_only_layers_stay_refused_at_start_up():
    # transformers builds layer 0 as a dense MLP; SGLang 0.5.23's Qwen3-MoE ignores mlp_only_layers and
    # would build it MoE, so its rows would be of another model than the trainer's: refused.
    fam = _qwen3_with_a_dense_layer()
    path = build(fam)
    model = load_transformers(path)
    assert dense_or_moe(model) == [ROLE_DENSE, ROLE_MOE]
    with pytest.raises(LayoutError, match=r"mlp_only_layers=\[0\].*SGLang builds every Qwen3MoeForCausalLM layer"):
        layout_from_model_path(str(path))
    assert "SGLang builds every Qwen3MoeForCausalLM layer as MoE" in _start_up_refusal(path)


@pytest.mark.sglang
@pytest.mark.parametrize("name", sorted(n for n, f in SPECS.items() if f.not_served))
def test_families_not_served_on_cpu_stop_where_the_docstring_says(name, launched_refusals):
    # Each family this module does not serve stops our launcher at start-up with the reason stated above (before
    # a model loads: a few seconds after SGLang imports), so the statement is checked, not remembered.
    fam = SPECS[name]
    path = build(fam)
    if _read_in_process(name):
        with pytest.raises(LayoutError) as info:
            layout_from_model_path(str(path))
        assert fam.not_served in str(info.value)
        return
    if name == "llama4_text":
        with pytest.raises(LayoutError, match="Llama4ForCausalLM.*permute_qk_weight_for_rotary"):
            layout_from_model_path(str(path))
    if name == "glm4_moe_lite_no_q_lora":  # the trainer reading the same config.json refuses it too
        with pytest.raises(LayoutError, match="Glm4MoeLiteForCausalLM: q_lora_rank=None.*never loads it"):
            layout_from_model_path(str(path))
    assert fam.not_served in launched_refusals(name)


def _check_mtp_section(tokens, prompt_len, mtp, draft):
    """Draft entries tagged as for GLM: depth 1 (one NextN layer), an accepted entry routed the token
    that followed its position, rejections monotone within a round (tests/support/mtp_section.py); and the draft's
    routing of verified tokens (step 0: the draft extend over the verify's hidden states) is transformers' router
    top-k of the checkpoint's MTP layer fed as the draft model feeds it (tests/support/mtp_oracle.py)."""
    from tests.support.mtp_section import check_mtp_marks

    assert mtp is not None and mtp.num_entries > 0
    assert set(np.unique(mtp.depth)) == {1}
    check_mtp_marks(tokens, mtp, 0)
    want = draft.topk(tokens)  # [len - 1, topk]: position p, token p + 1
    # (the last position's draft routed a token the verify found past max_new_tokens: not in the output)
    verified = np.flatnonzero((mtp.step == 0) & (mtp.positions < len(tokens) - 1))
    positions = mtp.positions[verified].astype(np.int64)
    # one verified draft forward per position from the prompt's last on: the prefill's draft extend over the prompt's
    # uncached tokens (a radix-cache hit leaves the cached ones out), then each round's over its verified tokens
    start = int(positions.min())
    assert start <= prompt_len - 1, (start, prompt_len)
    np.testing.assert_array_equal(np.sort(positions), np.arange(start, len(tokens) - 1))
    np.testing.assert_array_equal(mtp.tokens[verified], np.asarray(tokens)[positions + 1])
    got = want[:, None, :].copy()  # positions with no verified draft entry compare transformers with itself
    got[positions, 0] = np.sort(mtp.experts[verified].astype(np.int64), axis=-1)
    _assert_router_topk("MTP draft of verified tokens", _LastColumn(draft.trace), got, want[:, None, :])


class _LastColumn:
    """A RouterTrace read at its last MoE layer only (the MTP layer's router), for _assert_router_topk."""

    def __init__(self, trace):
        self._trace = trace

    def near_tie(self, column, token, chosen, delta=NEAR_TIE_LOGIT):
        return self._trace.near_tie(-1, token, chosen, delta=delta)


def _check_spec_outputs(trace, layout, prompts, outs, draft):
    """Responses of a server with MTP speculation on: our rows are transformers' router top-k over prompt + completion
    (transformers never speculates), our routed_experts field re-encodes them (a format check), and the draft's
    routing is tagged and, for verified tokens, transformers' top-k of the MTP layer."""
    for prompt, out in zip(prompts, outs):
        tokens = prompt + list(out["output_ids"])
        rec = record_of(out)
        got = np.sort(rec.experts.astype(np.int64), axis=-1)
        _assert_router_topk("speculation on", trace, got, trace.topk(tokens)[:-1])
        upstream = _upstream_rows(out["meta_info"]["routed_experts"], len(tokens), layout.num_hidden_layers,
                                  layout.topk)
        np.testing.assert_array_equal(np.sort(upstream[:, list(layout.moe_layer_ids)], axis=-1), got,
                                      err_msg="format check: our field re-encodes our record")
        _check_mtp_section(tokens, len(prompt), rec.mtp, draft)


@pytest.mark.parametrize("served", groups("deepseek_v3"), indirect=True)
def test_deepseek_v3_mtp_main_rows_equal_spec_off_rows_and_transformers(served, oracles, draft_oracles):
    spec, base = served.urls["deepseek_v3_mtp"], served.urls["deepseek_v3"]
    trace = oracles("deepseek_v3")
    prompts = [list(p.encode()) for p in PROMPTS]
    params = {"temperature": 0.0, "max_new_tokens": 32}
    on = generate(spec, input_ids=prompts, return_routing={"mtp": True}, sampling_params=params)
    off = generate(base, input_ids=prompts, return_routing=True, sampling_params=params)
    for prompt, s, b in zip(prompts, on, off):
        assert s["output_ids"] == b["output_ids"]
        rs, rb = record_of(s), record_of(b)
        np.testing.assert_array_equal(rs.experts, rb.experts)
        tokens = prompt + list(s["output_ids"])
        np.testing.assert_array_equal(np.sort(rs.experts.astype(np.int64), axis=-1), trace.topk(tokens)[:-1])
        _check_mtp_section(tokens, len(prompt), rs.mtp, draft_oracles("deepseek_v3"))
        assert rb.mtp is None


@pytest.mark.parametrize("served", groups("deepseek_v3"), indirect=True)
def test_deepseek_v3_mtp_sampled_rows_are_transformers_router_topk(served, oracles, draft_oracles):
    url = served.urls["deepseek_v3_mtp"]
    trace = oracles("deepseek_v3")
    prompts = [list(p.encode()) for p in PROMPTS]
    outs = generate(url, input_ids=prompts, return_routing={"mtp": True}, return_routed_experts=True,
                    sampling_params={**SAMPLING["sampled"], "max_new_tokens": 32})
    _check_spec_outputs(trace, fetch_layout(url), prompts, outs, draft_oracles("deepseek_v3"))



@pytest.mark.parametrize("served", groups("qwen3_next", "qwen3_5_moe", "nemotron_h"), indirect=True)
def test_hybrid_mtp_speculation_rows_are_transformers_router_topk_and_mtp_tagged(served, oracles, draft_oracles):
    # Qwen3-Next, Qwen3.5-MoE and Nemotron-H are served with their MTP layer drafting (tests/family_specs/groups.py
    # SERVERS), so every row of the families' other tests is already spec on = transformers (which never speculates).
    # Here: drafts are accepted (a verify commits the recurrent state and conv window of a step past the first:
    # cpu_runtime/ops/gdn.py's verify convolution and commit, cpu_runtime/ops/mamba2.py's Mamba-2 verify), and the draft's routing sits in the
    # MTP section at depth 1 (Nemotron-H's MTP layer: attention then MoE blocks, its router in the second).
    prompts = [list(p.encode()) for p in PROMPTS]
    for name in (n for n in served.families if MTP_FLAGS[0] in SERVERS[n][1]):  # not the flipped: served spec off
        url, trace = served.urls[name], oracles(name)
        layout = fetch_layout(url)
        assert [(l.depth, l.num_experts, l.topk) for l in layout.mtp_layers] == [
            (1, *SPECS[name].experts_topk(trace.model.config))]
        # NEW_TOKENS as the families' other tests: at 32, Qwen3-Next's layer 2 at token 50 of the second prompt
        # is a near tie in transformers (2nd and 3rd expert 4e-6 apart) that float32's op order decides; there
        # SGLang's rows with speculation on equal its rows with it off.
        outs = generate(url, input_ids=prompts, return_routing={"mtp": True}, return_routed_experts=True,
                        sampling_params={"temperature": 0.0, "max_new_tokens": NEW_TOKENS})
        accepted = [out["meta_info"]["spec_correct_drafts_histogram"] for out in outs]
        assert any(sum(h[1:]) for h in accepted), accepted  # some verify accepted one or more drafts
        _check_spec_outputs(trace, layout, prompts, outs, draft_oracles(name))


@pytest.mark.parametrize("served", groups("glm4_moe_lite", "bailing_moe_v2"), indirect=True)
def test_nextn_mtp_speculation_rows_are_transformers_router_topk_and_mtp_tagged(served, oracles, draft_oracles):
    # GLM-4.7-Flash and Ling 2.0 are served once, with NextN speculation on (tests/family_specs/groups.py SERVERS):
    # their main rows must be what transformers routes with no speculation at all (greedy and sampled), upstream's
    # routed_experts too, and the draft's routing sits in the MTP section at depth 1 (Ling 2.0's NextN MoE block is
    # built as layer 0: bailing_moe_nextn.py).
    name = served.family
    url, trace = served.urls[name], oracles(name)
    layout = fetch_layout(url)
    config = trace.model.config
    assert [(l.id, l.num_experts, l.topk) for l in layout.mtp_layers] == [
        (config.num_hidden_layers, *SPECS[name].experts_topk(config))]
    prompts = [list(p.encode()) for p in PROMPTS]
    for mode in sorted(SAMPLING):
        outs = generate(url, input_ids=prompts, return_routing={"mtp": True}, return_routed_experts=True,
                        sampling_params={**SAMPLING[mode], "max_new_tokens": 32})
        _check_spec_outputs(trace, layout, prompts, outs, draft_oracles(name))
