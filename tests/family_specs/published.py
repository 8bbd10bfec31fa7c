"""The tiny checkpoints as their releases publish them, where transformers' save writes them otherwise: the media
tokens and processor files a release ships, the rewriters of tensor names and config.json (a spec's ``hub_tensors``),
the stand-ins for a release's own config code (``STAND_INS``), the published spelling of renamed keys
(``PUBLISHED_KEYS``) and the architecture a checkpoint names (``architecture_of``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional

if TYPE_CHECKING:
    from tests.family_specs.specs import CheckpointSpec

# The stand-ins' code and Kimi-K2.5's processor: tests/checkpoints/.
CHECKPOINT_CODE = Path(__file__).parent.parent / "checkpoints"

# Qwen3-VL / Qwen3.5's vision tokens, after the embedded tokenizer's 260 ids, and the config keys naming them.
QWEN_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_VISION_IDS = dict(vision_start_token_id=260, vision_end_token_id=261, image_token_id=262, video_token_id=263)

# Qwen3-Omni-MoE's vision and audio tokens (Qwen/Qwen3-Omni-30B-A3B-Instruct's tokenizer names them), likewise; the
# keys are the thinker config's (vision_start / vision_end / audio_end: published keys its transformers class keeps,
# SGLang's processor reads vision_start_token_id and audio_start_token_id from the thinker config).
QWEN_OMNI_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<|audio_start|>",
                    "<|audio_end|>", "<|audio_pad|>")
QWEN_OMNI_IDS = dict(vision_start_token_id=260, vision_end_token_id=261, image_token_id=262, video_token_id=263,
                     audio_start_token_id=264, audio_end_token_id=265, audio_token_id=266)
# The names its tokenizer_config.json gives them, which transformers' Qwen3OmniMoeProcessor reads off the tokenizer.
QWEN_OMNI_TOKEN_NAMES = dict(zip(("vision_bos_token", "vision_eos_token", "image_token", "video_token",
                                  "audio_bos_token", "audio_eos_token", "audio_token"), QWEN_OMNI_TOKENS))

# GLM-4.5V's, likewise.
GLM_VISION_TOKENS = ("<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>",
                     "<|video|>")
GLM_VISION_IDS = dict(image_start_token_id=260, image_end_token_id=261, image_token_id=262, video_start_token_id=263,
                      video_end_token_id=264, video_token_id=265)


# Gemma-4's media tokens (google/gemma-4-26B-A4B-it's tokenizer names: image soft token, begin / end of image, the
# same for audio, and the video token its processor adds), likewise. transformers 5.19's Gemma4Processor refuses
# every input of a tokenizer without the audio tokens (its validate_inputs), so they are there too.
GEMMA4_VISION_TOKENS = ("<|image|>", "<|image>", "<image|>", "<|audio|>", "<|audio>", "<audio|>", "<|video|>")
GEMMA4_VISION_IDS = dict(image_token_id=260, boi_token_id=261, eoi_token_id=262, audio_token_id=263,
                         boa_token_id=264, eoa_token_id=265, video_token_id=266)


# Kimi-K2.5's media tokens (its tokenizer's names), likewise; image_token_id is the published
# media_placeholder_token_id, the others are the keys transformers' Kimi_K25Config names them by.
KIMI_MEDIA_TOKENS = ("<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>",
                     "<|kimi_k25_video_placeholder|>")
KIMI_MEDIA_IDS = dict(vision_start_token_id=260, media_content=261, vision_end_token_id=262, image_token_id=263,
                      video_token_id=264)

# Intern-S1's image tokens (SGLang's InternVLProcessor expands a prompt's <image> to <img>, 256 <IMG_CONTEXT> per tile,
# </img>; the release's tokenizer holds them as special tokens) and its video pad, after the embedded tokenizer's
# 260 ids; image_token_id is the config's.
INTERNS1_VISION_TOKENS = ("<img>", "</img>", "<IMG_CONTEXT>", "<|video_pad|>")
INTERNS1_VISION_IDS = dict(image_start=260, image_end=261, image_token_id=262, video=263)

def _qwen_vl_processors(folder: Path, **sizes) -> None:
    """What a Qwen3-VL / Qwen3.5 checkpoint ships for images: the image and video processor configs (SGLang builds
    its processor from them at start-up, text-only prompts included) and the vision special tokens in its tokenizer,
    at the ids its config names (``QWEN_VISION_IDS``), so a prompt can hold an image."""
    import transformers

    transformers.Qwen2VLImageProcessor(**sizes).save_pretrained(str(folder))
    transformers.Qwen3VLVideoProcessor(**sizes).save_pretrained(str(folder))
    _add_vision_tokens(folder, QWEN_VISION_TOKENS, QWEN_VISION_IDS)


def _qwen3_omni_processor(folder: Path) -> None:
    """What a Qwen3-Omni checkpoint ships for its media (SGLang builds its processor at start-up, text-only prompts
    included): transformers' Qwen3OmniMoeProcessor over its image, video and audio processors, the tokenizer naming
    its vision and audio tokens at the ids the thinker config names."""
    import transformers

    _add_vision_tokens(folder, QWEN_OMNI_TOKENS, QWEN_OMNI_IDS)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), extra_special_tokens=QWEN_OMNI_TOKEN_NAMES)
    sizes = dict(patch_size=16, merge_size=2, temporal_patch_size=2)
    processor = transformers.Qwen3OmniMoeProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(**sizes),
        video_processor=transformers.Qwen2VLVideoProcessor(**sizes),
        feature_extractor=transformers.WhisperFeatureExtractor(feature_size=128), tokenizer=tokenizer)
    processor.save_pretrained(str(folder))


def _add_vision_tokens(folder: Path, tokens, ids: Dict[str, int]) -> None:
    """The release's vision special tokens in the embedded tokenizer, at the ids the config names."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.add_special_tokens(list(tokens))
    assert [tokenizer.token_to_id(t) for t in tokens] == list(ids.values())
    tokenizer.save(str(folder / "tokenizer.json"))


def _glm4v_processors(folder: Path) -> None:
    """The image and video processor configs a GLM-4.5V checkpoint ships (SGLang builds its processor at start-up)
    and its vision special tokens in the tokenizer."""
    import transformers

    transformers.Glm4vImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2).save_pretrained(str(folder))
    transformers.Glm4vVideoProcessor(patch_size=14, merge_size=2, temporal_patch_size=2).save_pretrained(str(folder))
    _add_vision_tokens(folder, GLM_VISION_TOKENS, GLM_VISION_IDS)


def _gemma4_processor(folder: Path) -> None:
    """The processor a Gemma-4 checkpoint ships (SGLang builds it at start-up, for text prompts too): transformers'
    Gemma4Processor over its image, video and audio processors, the tokenizer naming its vision tokens."""
    import transformers

    _add_vision_tokens(folder, GEMMA4_VISION_TOKENS, GEMMA4_VISION_IDS)
    names = dict(zip(("image_token", "boi_token", "eoi_token", "audio_token", "boa_token", "eoa_token"),
                     GEMMA4_VISION_TOKENS))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), extra_special_tokens=names)
    processor = transformers.Gemma4Processor(
        feature_extractor=transformers.Gemma4AudioFeatureExtractor(),
        image_processor=transformers.Gemma4ImageProcessor(patch_size=16),
        video_processor=transformers.Gemma4VideoProcessor(patch_size=16), tokenizer=tokenizer)
    processor.save_pretrained(str(folder))


def _gemma4_as_published(folder: Path) -> None:
    """config.json as google/gemma-4-26B-A4B-it ships it: the full-attention layers' shape as ``global_head_dim`` /
    ``num_global_key_value_heads``, which transformers' Gemma4TextConfig turns into the ``per_layer_config`` its save
    writes instead."""
    path = folder / "config.json"
    saved = json.loads(path.read_text())
    text = saved["text_config"]
    # (one override per full-attention layer, all alike; none where they equal the sliding layers')
    shapes = {json.dumps(o, sort_keys=True) for o in text.pop("per_layer_config").values()}
    shape = json.loads(shapes.pop()) if shapes else {}
    assert not shapes
    text["global_head_dim"] = shape.get("head_dim", text["head_dim"])
    text["num_global_key_value_heads"] = shape.get("num_key_value_heads", text["num_key_value_heads"])
    path.write_text(json.dumps(saved, indent=2, sort_keys=True))


# transformers 5.19's save of Kimi_K25ForConditionalGeneration -> the Hub's tensor names (moonshotai/Kimi-K2.5,
# which transformers' conversion_mapping.py "kimi_k25" reads): its reverse mapping renames every "layers" to
# "blocks" and leaves two vision prefixes.
_KIMI_K25_HUB_NAMES = {"language_model.model.blocks.": "language_model.model.layers.",
                       "model.mm_projector.pre_norm.": "mm_projector.pre_norm.",
                       "vision_tower.encoder.patch_embed.": "vision_tower.patch_embed."}


def _rename_tensors(folder: Path, prefixes: Dict[str, str]) -> None:
    """Each saved tensor whose name starts with a key of ``prefixes`` renamed to start with its value."""
    from safetensors.torch import load_file, save_file

    for shard in sorted(folder.glob("*.safetensors")):
        renamed = {}
        for k, v in load_file(str(shard)).items():
            old = next((o for o in prefixes if k.startswith(o)), None)
            renamed[prefixes[old] + k[len(old):] if old else k] = v
        save_file(renamed, str(shard), metadata={"format": "pt"})


def _kimi_k25_as_published(folder: Path) -> None:
    """Tensor names and config.json as moonshotai/Kimi-K2.5 ships them. Its vision_config spells the tower's sizes
    vt_* and its position grid init_pos_emb_*, and SGLang's projector reads them; SGLang's MoonViT and transformers'
    vision config read the unprefixed sizes (which default to the release's values), so both are written."""
    _rename_tensors(folder, _KIMI_K25_HUB_NAMES)
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    text, vision = cfg["text_config"], cfg["vision_config"]
    cfg["architectures"] = ["KimiK25ForConditionalGeneration"]
    cfg["media_placeholder_token_id"] = cfg["image_token_id"]
    text["architectures"] = ["DeepseekV3ForCausalLM"]
    vision.update({f"vt_{k}": vision[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                     "num_hidden_layers")})
    vision.update({f"init_{k}": vision[k] for k in ("pos_emb_height", "pos_emb_width", "pos_emb_time")})
    vision.update(mm_hidden_size=vision["hidden_size"], text_hidden_size=text["hidden_size"], merge_type="sd2_tpool",
                  mm_projector_type="patchmerger", pos_emb_type="divided_fixed", projector_hidden_act="gelu",
                  projector_ln_eps=1e-5, video_attn_type="spatial_temporal")
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def _joyai_llm_flash_as_published(folder: Path) -> None:
    """config.json under JoyAI-LLM-Flash's model type, auto_map to the stand-in for its config class (copied beside
    it); the architecture and tensors stay DeepSeek-V3's."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg["model_type"] = "joyai_llm_flash"
    STAND_INS["joyai_llm_flash"].carry(folder, cfg)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


# transformers 5.19's save of InternVLForConditionalGeneration (its conversion mapping reversed: the InternVL-hf
# names) -> the module names Intern-S1 ships, which SGLang's interns1.py maps (_mapping_interns1_name) and
# transformers loads as they are.
_INTERNS1_HUB_NAMES = {"language_model.model.": "model.language_model.", "language_model.lm_head.": "lm_head.",
                       "vision_tower.": "model.vision_tower.", "multi_modal_projector.": "model.multi_modal_projector."}


def _interns1_as_published(folder: Path) -> None:
    """Tensor names and config.json as internlm/Intern-S1 ships them: its architecture and model types, auto_map to
    its config code (the stand-in, copied beside it), the text model's architecture (interns1.py picks its language
    model by it), and the vision keys SGLang's InternVisionModel reads that transformers' InternVL vision config does
    not save (dropout, drop_path_rate, initializer_factor: published in the release's vision_config)."""
    _rename_tensors(folder, _INTERNS1_HUB_NAMES)
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(architectures=["InternS1ForConditionalGeneration"], model_type="interns1")
    STAND_INS["interns1"].carry(folder, cfg)
    cfg["text_config"]["architectures"] = ["Qwen3MoeForCausalLM"]
    cfg["vision_config"].update(model_type="interns1_vision", dropout=0.0, drop_path_rate=0.0, initializer_factor=0.1)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


# GLM-4.5's tensor names (transformers 5.19's save) -> Ling 2.0's (the release's modeling code; SGLang's bailing_moe.py
# load_weights): q/k/v_proj are fused into query_key_value ([q heads; k heads; v heads] rows), the NextN layer's
# shared_head.norm is its final_layernorm, and its own head and embedding are not stored (the release's MTP layer
# uses the model's).
_BAILING_NAMES = {"model.embed_tokens.": "model.word_embeddings.", ".self_attn.o_proj.": ".attention.dense.",
                  ".self_attn.q_norm.": ".attention.query_layernorm.",
                  ".self_attn.k_norm.": ".attention.key_layernorm.",
                  ".mlp.gate.e_score_correction_bias": ".mlp.gate.expert_bias",
                  ".shared_head.norm.": ".final_layernorm."}
_BAILING_QKV = (".self_attn.q_proj.", ".self_attn.k_proj.", ".self_attn.v_proj.")
# Ling 2.0's config keys -> GLM-4.5's, where they differ; the keys both spell alike, read as they are.
_BAILING_KEYS = {"num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts",
                 "use_qkv_bias": "attention_bias"}
_BAILING_SAME_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings",
                      "partial_rotary_factor", "use_qk_norm", "num_experts_per_tok", "n_group", "topk_group",
                      "moe_intermediate_size", "first_k_dense_replace", "norm_topk_prob", "routed_scaling_factor",
                      "num_nextn_predict_layers", "tie_word_embeddings", "eos_token_id", "pad_token_id",
                      "bos_token_id")


def _rewrite(name: str, table: Dict[str, str]) -> str:
    for old, new in table.items():
        if old in name:
            return name.replace(old, new)
    return name


def _bailing_as_published(folder: Path) -> None:
    """Tensors and config.json as Ling 2.0 ships them (from transformers' GLM-4.5 save, _BAILING_NAMES)."""
    import torch
    from safetensors.torch import load_file, save_file

    (shard,) = folder.glob("*.safetensors")
    tensors = load_file(str(shard))
    out = {}
    for k, t in tensors.items():
        if k.endswith(".shared_head.head.weight") or (k.startswith("model.layers.") and ".embed_tokens." in k):
            continue  # the NextN layer's own head and embedding: the release's MTP layer uses the model's
        if _BAILING_QKV[0] in k:
            parts = [tensors[k.replace(_BAILING_QKV[0], p)] for p in _BAILING_QKV]
            out[k.replace(_BAILING_QKV[0], ".attention.query_key_value.")] = torch.cat(parts)
        elif not any(p in k for p in _BAILING_QKV):
            out[_rewrite(k, _BAILING_NAMES)] = t
    save_file(out, str(shard), metadata={"format": "pt"})
    path = folder / "config.json"
    glm = json.loads(path.read_text())
    cfg = {k: glm[k] for k in _BAILING_SAME_KEYS}
    cfg.update({k: glm[g] for k, g in _BAILING_KEYS.items()})
    cfg.update(architectures=["BailingMoeV2ForCausalLM"], model_type="bailing_moe", torch_dtype="float32",
               rope_theta=glm["rope_parameters"]["rope_theta"], rope_scaling=None, use_bias=False,
               score_function="sigmoid", moe_router_enable_expert_bias=True, router_dtype="fp32",
               moe_shared_expert_intermediate_size=glm["moe_intermediate_size"], embedding_dropout=0.0,
               attention_dropout=0.0, output_dropout=0.0)
    STAND_INS["bailing_moe"].carry(folder, cfg)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def _bailing_as_glm4_moe(path: Path) -> Path:
    """The oracle's copy of a Ling 2.0 checkpoint: its tensors and config under GLM-4.5's names (the inverse of
    _bailing_as_published; query_key_value split by the config's heads), beside it, written once."""
    import transformers
    from safetensors.torch import load_file, save_file

    out = path.with_name(path.name + ".as-glm4_moe")
    if (out / "config.json").is_file():
        return out
    cfg = json.loads((path / "config.json").read_text())
    glm = {k: cfg[k] for k in _BAILING_SAME_KEYS}
    glm.update({g: cfg[k] for k, g in _BAILING_KEYS.items()})
    glm.update(rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"],
                                "partial_rotary_factor": cfg["partial_rotary_factor"]})
    config = transformers.Glm4MoeConfig(**glm)
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    back = {v: k for k, v in _BAILING_NAMES.items()}
    tensors = {}
    for shard in path.glob("*.safetensors"):
        for k, t in load_file(str(shard)).items():
            if k.startswith(f"model.layers.{config.num_hidden_layers}."):
                continue  # the NextN layer: transformers' GLM-4.5 builds none
            if ".attention.query_key_value." in k:
                for part, piece in zip(_BAILING_QKV, t.split([q, kv, kv])):
                    tensors[k.replace(".attention.query_key_value.", part)] = piece.contiguous()
            else:
                tensors[_rewrite(k, back)] = t
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(tmp))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


# Step-3.5 (stepfun-ai/Step-3.5-Flash): transformers 5.19 reads model_type step3p5 with Step3p7TextConfig (the text
# model of Step3p7ForConditionalGeneration; there is no Step3p5ForCausalLM) and saves its keys in its own spelling,
# which SGLang's own Step3p5Config does not read: the release's config.json spells them as below (transformers'
# __post_init__ still takes these legacy spellings: moe_layers_enum, attention_other_setting, per-layer rope_theta and
# partial_rotary_factors), and adds the keys only SGLang's step3p5.py reads, at the published values.
_STEP3P5_KEYS = {"n_routed_experts": "moe_num_experts", "num_experts_per_tok": "moe_top_k",
                 "num_key_value_heads": "num_attention_groups", "share_expert_dim": "share_expert_dims"}
# transformers' own spellings that the published keys replace (derived again from those when transformers reads them).
_STEP3P5_DERIVED = ("mlp_layer_types", "rope_parameters", "num_sliding_attention_heads", "per_layer_config",
                    "mtp_layer_types", "mtp_mlp_layer_types")
# Keys the release publishes that only SGLang's step3p5.py reads (transformers' class always gates each head, adds the
# router's bias, and computes the router in the weights' dtype).
STEP3P5_SGLANG_ONLY = {"use_head_wise_attn_gate": True, "use_moe_router_bias": True, "need_fp32_gate": True,
                       "norm_expert_weight": True}
# The vision tower the oracle's Step3p7ForConditionalGeneration carries beside the text model (never fed: text prompts).
STEP3P7_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=56,
                      patch_size=14)


def step3p5_published_config(text: Dict[str, Any]) -> Dict[str, Any]:
    """config.json as Step-3.5 ships it, from the text config transformers' Step3p7TextConfig saved (``text``)."""
    n = text["num_hidden_layers"]
    types = text["layer_types"]
    rope = [text["rope_parameters"][types[i]] for i in range(n)]
    assert all(r.get("rope_type", "default") == "default" for r in rope), "only the default RoPE is spelled here"
    cfg = {k: v for k, v in text.items() if k not in _STEP3P5_KEYS and k not in _STEP3P5_DERIVED}
    cfg.update({published: text[k] for k, published in _STEP3P5_KEYS.items()})
    cfg.update(
        architectures=["Step3p5ForCausalLM"], model_type="step3p5", torch_dtype="float32", rope_scaling=None,
        rope_theta=[r["rope_theta"] for r in rope],
        partial_rotary_factors=[r.get("partial_rotary_factor", 1.0) for r in rope],
        moe_layers_enum=",".join(str(i) for i, t in enumerate(text["mlp_layer_types"]) if t == "sparse"),
        attention_other_setting={"num_attention_heads": text["num_sliding_attention_heads"],
                                 "num_attention_groups": text["num_key_value_heads"]},
        swiglu_limits=[x or 0 for x in (text.get("swiglu_limits") or [0] * n)],
        swiglu_limits_shared=[x or 0 for x in (text.get("swiglu_limits_shared") or [0] * n)],
        max_seq_len=text["max_position_embeddings"], **STEP3P5_SGLANG_ONLY)
    return cfg


def _step3p5_as_published(folder: Path) -> None:
    """Step3p7ForConditionalGeneration's save (its text model's tensors already in the Hub's names: model.layers.*.moe.*,
    share_expert, lm_head) as a text-only Step-3.5 checkpoint: the vision tower's tensors dropped, config.json as
    published (step3p5_published_config)."""
    from safetensors.torch import load_file, save_file

    (shard,) = folder.glob("*.safetensors")
    tensors = {k: t for k, t in load_file(str(shard)).items() if k.startswith(("model.", "lm_head."))}
    save_file(tensors, str(shard), metadata={"format": "pt"})
    path = folder / "config.json"
    saved = json.loads(path.read_text())
    path.write_text(json.dumps(step3p5_published_config(saved["text_config"]), indent=2, sort_keys=True))


# Step-3.5's sliding window: SGLang 0.5.23's (and 0.5.15's) step3p5.py hands config.sliding_window to its attention
# as the keys before the query (window + 1 keys: the torch-native mask keeps k >= q - window; gemma3_causal.py and
# gpt_oss.py pass sliding_window - 1 for that reason); the release's modeling_step3p5.py and transformers' Step3p7
# mask to sliding_window keys (create_sliding_window_causal_mask). An upstream difference, past the window only:
# served as SGLang computes it (refusing it refuses the published model); the oracle reads the window SGLang attends
# (sglang_window), and tests/test_families.py pins that the published window gives other rows.
STEP3P5_SGLANG_WINDOW_EXTRA = 1


def _step3p5_as_step3p7(path: Path, sglang_window: bool = True) -> Path:
    """The oracle's copy of a Step-3.5 checkpoint: its config.json as the text_config of a Step3p7Config (transformers
    reads the published keys itself) beside a vision tower it never feeds, its tensors linked (transformers'
    conversion mapping for step3p7 reads the Hub's names), written once. ``sglang_window``: the window SGLang's
    step3p5.py attends (STEP3P5_SGLANG_WINDOW_EXTRA), else the published one."""
    out = path.with_name(path.name + (".as-step3p7" if sglang_window else ".as-step3p7-published-window"))
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    text = json.loads((path / "config.json").read_text())
    if sglang_window and text.get("sliding_window") is not None:
        text["sliding_window"] += STEP3P5_SGLANG_WINDOW_EXTRA
    cfg = {"architectures": ["Step3p7ForConditionalGeneration"], "model_type": "step3p7", "text_config": text,
           "vision_config": STEP3P7_VISION, "tie_word_embeddings": text.get("tie_word_embeddings", False)}
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    for shard in path.glob("*.safetensors"):
        (tmp / shard.name).symlink_to(shard.resolve())
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


# Block names transformers 5.19 saves (layers_block_type) -> hybrid_override_pattern's characters.
_NEMOTRON_H_BLOCKS = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}


def _nemotron_h_as_published(folder: Path) -> None:
    """config.json as nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 spells it: the blocks as hybrid_override_pattern and
    num_hidden_layers (transformers 5.19 writes layers_block_type with its own names, which SGLang 0.5.23's
    NemotronHConfig refuses: "contains invalid types"), no mtp_layers_block_type (Nemotron-3-Ultra spells its MTP head
    mtp_hybrid_override_pattern: _append_nemotron_h_mtp) and no time_step_limit (neither is published; transformers
    writes its defaults). The tensors are already the Hub's names."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    blocks = cfg.pop("layers_block_type")
    cfg["hybrid_override_pattern"] = "".join(_NEMOTRON_H_BLOCKS[b] for b in blocks)
    cfg["num_hidden_layers"] = len(blocks)
    for key in ("mtp_layers_block_type", "time_step_limit"):
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def _kimi_k25_processor(folder: Path) -> None:
    """Kimi-K2.5's processor files: transformers' image and video processor configs, the release's media_proc_cfg
    and auto_map (to the stand-in for its remote code, copied beside them), its media tokens in the tokenizer."""
    import transformers

    transformers.Kimi_K25ImageProcessor().save_pretrained(str(folder))
    transformers.Kimi_K25VideoProcessor().save_pretrained(str(folder))
    path = folder / "preprocessor_config.json"
    cfg = json.loads(path.read_text())
    cfg["auto_map"] = {"AutoProcessor": "kimi_k25_processor.KimiK25Processor"}
    cfg["media_proc_cfg"] = {"patch_size": 14, "merge_kernel_size": 2, "in_patch_limit": 16384,
                             "patch_limit_on_one_side": 512, "fixed_output_tokens": None,
                             "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))
    shutil.copy(CHECKPOINT_CODE / "kimi_k25_processor.py", folder)
    _add_vision_tokens(folder, KIMI_MEDIA_TOKENS, KIMI_MEDIA_IDS)

def _transpose_fused_experts(folder: Path) -> None:
    """Each ``mlp.experts.gate_up_proj`` / ``down_proj`` tensor [experts, a, b] stored as [experts, b, a]."""
    from safetensors.torch import load_file, save_file

    for shard in sorted(folder.glob("*.safetensors")):
        tensors = load_file(str(shard))
        for k, v in tensors.items():
            if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
                tensors[k] = v.transpose(1, 2).contiguous()
        save_file(tensors, str(shard), metadata={"format": "pt"})


# The Hub's architecture name -> transformers' class, where they differ.
TRANSFORMERS_CLASS = {"KimiK25ForConditionalGeneration": "Kimi_K25ForConditionalGeneration",
                      "InternS1ForConditionalGeneration": "InternVLForConditionalGeneration"}
# Architectures transformers has no class for, whose math is another class's under other names
# (CheckpointSpec.published_as):
# architecture -> (that class, checkpoint folder -> a copy under its names, which the oracle loads).
AS_TRANSFORMERS: Dict[str, tuple] = {
    "BailingMoeV2ForCausalLM": ("Glm4MoeForCausalLM", lambda p: _bailing_as_glm4_moe(p)),
    "Step3p5ForCausalLM": ("Step3p7ForConditionalGeneration", lambda p: _step3p5_as_step3p7(p)),
}


# The published spelling of a family's config keys where its checkpoint renames transformers'
# (CheckpointSpec.published_as).
PUBLISHED_KEYS: Dict[str, Dict[str, str]] = {"bailing_moe_v2": {g: k for k, g in _BAILING_KEYS.items()}}


def architecture_of(family: CheckpointSpec) -> str:
    """The architecture a family's checkpoint names (config.json ``architectures``)."""
    if family.published_as:
        return family.published_as
    return {cls: arch for arch, cls in TRANSFORMERS_CLASS.items()}.get(family.model_class, family.model_class)


@dataclass(frozen=True)
class StandIn:
    """A release's config class that is its own code (served with --trust-remote-code), which a host without the
    Hub cannot fetch: the STAND-IN the tests' checkpoints carry (tests/checkpoints/<module>.py, copied beside
    config.json, auto_map to it) and the transformers model type whose classes it renames."""

    module: str
    config_class: str
    renames: Optional[str]  # None: a class of its own (the oracle reads the checkpoint another way)

    @property
    def source(self) -> Path:
        return CHECKPOINT_CODE / f"{self.module}.py"

    def load(self):
        """The stand-in class, as --trust-remote-code imports it (the sweep's module-tree build uses it)."""
        import importlib.util

        spec = importlib.util.spec_from_file_location(self.module, self.source)
        code = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(code)
        return getattr(code, self.config_class)

    def carry(self, folder: Path, cfg: Dict[str, Any]) -> None:
        """config.json's auto_map to the stand-in, and its file beside it, as the release ships its own."""
        cfg["auto_map"] = {"AutoConfig": f"{self.module}.{self.config_class}"}
        shutil.copy(self.source, folder)


# model_type -> its stand-in. transformers picks its weight conversions by model type (DeepSeek-V3's fuses the experts
# stored one by one): the oracle reads these checkpoints under the type renamed (load_transformers), since under the
# release's name JoyAI-LLM-Flash's experts were left at their initial values.
STAND_INS: Dict[str, StandIn] = {
    "interns1": StandIn("configuration_interns1", "InternS1Config", "internvl"),
    "joyai_llm_flash": StandIn("configuration_joyai_llm_flash", "JoyAILLMFlashConfig", "deepseek_v3"),
    "bailing_moe": StandIn("configuration_bailing_moe_v2", "BailingMoeV2Config", None),
}

