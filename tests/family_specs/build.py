"""Building a tiny checkpoint folder from its spec: transformers' model with its weights drawn as the spec says
(``initialized``), ``save_pretrained``, the MTP layers appended as the release ships them, the published keys and
rewrites, the embedded byte-level tokenizer; cached per spec (``build``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

from sglang_r3.core.paths import cache_root
from sglang_r3.dev.embedded.tokenizer import NUM_BYTE_TOKENS, write_tokenizer
from tests.family_specs.specs import CheckpointSpec

# What makes a query or a key: per head (q_proj, k_proj) and MLA's (q_b_proj after its LoRA norm; kv_a_proj_with_mqa
# for the rotated key, kv_b_proj for the rest; q_a_proj's output is normalized, so scaling it would do nothing).
_QK_PROJECTIONS = ("q_proj.weight", "k_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight",
                   "kv_b_proj.weight")


def initialized(family: CheckpointSpec, text: Dict[str, Any]):
    """transformers' model of ``family`` with text config ``text``, its weights drawn as the checkpoint's are
    (seeded; routers, scales, biases and query/key projections as the fields above say), float32, eval."""
    import torch
    import transformers

    special = dict(eos_token_id=NUM_BYTE_TOKENS, pad_token_id=NUM_BYTE_TOKENS, bos_token_id=None)
    cfg = getattr(transformers, family.config_class)(**_keywords(family, text, special))
    torch.manual_seed(family.seed)
    model = getattr(transformers, family.model_class)(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".gate.weight", "router.weight", "router.proj.weight")):
                p.normal_(0.0, family.router_std)
            elif name.endswith(("router.scale", "router.per_expert_scale")):  # Gemma-4's router input and output
                p.uniform_(0.5, 1.5)  # scales (ones at init: a scale dropped would pass unseen)
            elif name.endswith(("e_score_correction_bias", "expert_bias")):  # ERNIE-4.5's moe_statics, AFMoE
                p.normal_(0.0, family.bias_std)
            elif name.endswith(family.bf16_params or ("\0",)):
                p.copy_(torch.randn_like(p).to(torch.bfloat16).to(p.dtype))
            elif ".self_attn." in name and name.endswith(_QK_PROJECTIONS):
                p.mul_(family.qk_scale)
            elif family.attn_bias_std and ".self_attn." in name and name.endswith("_proj.bias"):
                p.normal_(0.0, family.attn_bias_std)
        for name, b in model.named_buffers():
            if name.endswith(("e_score_correction_bias", "expert_bias")):  # sigmoid routers' selection bias (GLM,
                # DeepSeek-V3, LFM2-MoE)
                b.normal_(0.0, family.bias_std)
        if family.post_init is not None:
            family.post_init(model)
    return model


def build(family: CheckpointSpec, out: Optional[Path] = None) -> Path:
    """The checkpoint folder (built once per family definition, cached like the embedded model)."""
    import transformers

    key = hashlib.sha256(
        json.dumps([family.name, family.config_class, family.wrap(family.config) if family.wrap else family.config,
                    family.seed, family.router_std,
                    transformers.__version__] + ([family.bias_std] if family.bias_std != 0.1 else [])
                   + ([family.qk_scale] if family.qk_scale != 1.0 else [])
                   + ([["attn_bias_std", family.attn_bias_std]] if family.attn_bias_std else [])
                   + (["extra_files"] if family.extra_files else [])
                   + (["hub_tensors"] if family.hub_tensors else [])
                   + ([family.published, family.mtp_format] if family.published else [])
                   + (["qwen mtp drafts close"] if family.mtp_format == "qwen" else [])
                   + ([family.mtp_format, family.mtp_layers, "mtp blocks as saved"] if family.mtp_format == "nemotron_h" else [])
                   + (["post_init"] if family.post_init else []), sort_keys=True).encode()
    ).hexdigest()[:12]
    out = out or cache_root() / "families" / f"{family.name}-{key}"
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config_class = getattr(transformers, family.config_class)
    special = dict(eos_token_id=NUM_BYTE_TOKENS, pad_token_id=NUM_BYTE_TOKENS, bos_token_id=None)
    L = family.config["num_hidden_layers"]
    # With NextN MTP: a model one layer deeper, whose last decoder layer becomes the MTP block's layer.
    nextn = family.mtp_layers if family.mtp_format == "nextn" else 0
    model = initialized(family, {**family.config, "num_hidden_layers": L + nextn})
    model.save_pretrained(str(tmp))
    if nextn:
        _keep_last_layers_as_mtp(tmp, config_class(**_keywords(family, family.config, special)), family)
    elif family.mtp_format == "qwen":
        _append_qwen_mtp(tmp, family, special)
    elif family.mtp_format == "nemotron_h":
        _append_nemotron_h_mtp(tmp, family)
    elif family.mtp_layers:
        _append_ernie_mtp(tmp, model.config, family)
    if family.published:
        _write_published_keys(tmp, family)
    if family.hub_tensors is not None:
        family.hub_tensors(tmp)
    write_tokenizer(tmp)
    if family.extra_files is not None:
        family.extra_files(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _keywords(family: CheckpointSpec, text: Dict[str, Any], special: Dict[str, Any]) -> Dict[str, Any]:
    if family.wrap is None:
        return {**text, **special}
    return {**family.wrap({**text, **special}), **special}


def _write_published_keys(folder: Path, family: CheckpointSpec) -> None:
    """A wrapper's keys go into its text_config, but a dotted key names its section (``vision_config.x``)."""
    path = folder / "config.json"
    saved = json.loads(path.read_text())
    for key, value in family.published.items():
        section, _, name = key.rpartition(".")
        owner = saved[section] if section else saved["text_config"] if family.wrap is not None else saved
        owner[name] = value
    path.write_text(json.dumps(saved, indent=2, sort_keys=True))


def _append_qwen_mtp(folder: Path, family: CheckpointSpec, special: Dict[str, Any]) -> None:
    """Qwen3-Next / Qwen3.5's MTP layers as their releases ship them: per depth d, ``mtp.layers.{d}.*`` (a
    full-attention MoE decoder layer of transformers' own class, built one-layer and seeded; experts one by one),
    and ``mtp.fc`` (the projection of [embedding; hidden]), ``mtp.pre_fc_norm_{embedding,hidden}``, ``mtp.norm``
    (Gemma-style norms: 0 is the identity)."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    config_class = getattr(transformers, family.config_class)
    one = {**family.config, "num_hidden_layers": 1, "layer_types": ["full_attention"]}
    one.pop("full_attention_interval", None)
    torch.manual_seed(family.seed + 1)
    model = getattr(transformers, family.model_class)(config_class(**_keywords(family, one, special))).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".gate.weight"):
                p.normal_(0.0, family.router_std)
    (shard,) = folder.glob("*.safetensors")
    tensors = load_file(str(shard))
    H = family.config["hidden_size"]
    I = family.config["moe_intermediate_size"]
    for d in range(family.mtp_layers):
        prefix = f"mtp.layers.{d}."
        for key, value in family.layers_of(model)[0].state_dict().items():
            if key.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H]: gate rows, then up rows
                for e in range(value.shape[0]):
                    base = prefix + key.replace("gate_up_proj", f"{e}.")
                    tensors[base + "gate_proj.weight"] = value[e, :I].clone()
                    tensors[base + "up_proj.weight"] = value[e, I:].clone()
            elif key.endswith("mlp.experts.down_proj"):  # [E, H, I]
                for e in range(value.shape[0]):
                    tensors[prefix + key.replace("down_proj", f"{e}.down_proj.weight")] = value[e].clone()
            else:
                tensors[prefix + key] = value.clone()
    # The draft guesses close to the main model, so that some drafts are accepted and a verify commits states past
    # its first step: fc passes the embedding of token t+1 on and the layer adds little (its output projections
    # scaled down), so the draft says what the head makes of token t+1 -- near what this tiny main model, whose
    # prediction leans on the current token, predicts there (passing the hidden state on instead: none accepted).
    for key in [k for k in tensors if k.startswith("mtp.layers.") and k.endswith(("o_proj.weight", "down_proj.weight"))]:
        tensors[key] = tensors[key] * 0.1
    gen = torch.Generator().manual_seed(family.seed + 2)
    fc = torch.randn(H, 2 * H, generator=gen) * 0.01
    fc[:, :H] += torch.eye(H)  # [embedding; hidden]: SGLang's qwen3_next_mtp.py concatenates in that order
    tensors["mtp.fc.weight"] = fc
    for norm in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"):
        tensors[norm] = torch.zeros(H)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(shard), metadata={"format": "pt"})


# Nemotron-3-Ultra's MTP head (Miles' nemotron-3-ultra-550b-a55b-4layer.py: "MTP head: attention + moe -> *E").
_NEMOTRON_H_MTP_PATTERN = "*E"


def _append_nemotron_h_mtp(folder: Path, family: CheckpointSpec) -> None:
    """Nemotron-H's MTP layer as Nemotron-3-Ultra ships it: config.json's num_nextn_predict_layers and
    mtp_hybrid_override_pattern, and per block b of that pattern ``mtp.layers.{b}.*`` named as the backbone's blocks
    (``norm``, ``mixer.*``: SGLang's nemotron_h.py load_weights(is_mtp=True) maps ``mtp.layers.`` to its draft's
    ``model.layers.``), the first block with ``enorm`` / ``hnorm`` / ``eh_proj`` (the projection of [embedding;
    hidden]), the last with ``final_layernorm``. The blocks are transformers' own, from a model of that pattern built
    as the checkpoint's (seeded, routers and biases drawn alike). transformers' NemotronH builds no MTP layer."""
    import torch
    from safetensors.torch import load_file, save_file

    blocks = initialized(family, {**family.config, "hybrid_override_pattern": _NEMOTRON_H_MTP_PATTERN,
                                  "num_hidden_layers": len(_NEMOTRON_H_MTP_PATTERN)})
    # Saved as the checkpoint is (the Hub's names: backbone.layers.*, experts one by one), then renamed: the
    # in-memory state_dict names them model.layers.* with the experts fused, which no release carries.
    with tempfile.TemporaryDirectory() as saved:
        blocks.save_pretrained(saved)
        (block_shard,) = Path(saved).glob("*.safetensors")
        head = {k.replace("backbone.layers.", "mtp.layers."): v for k, v in load_file(str(block_shard)).items()
                if k.startswith("backbone.layers.")}
    (shard,) = folder.glob("*.safetensors")
    tensors = load_file(str(shard))
    H = family.config["hidden_size"]
    assert head and not set(head) & set(tensors), "the MTP blocks' tensors are missing or clash"
    tensors.update(head)
    # Drafts close to the main model, so that some are accepted and a verify commits Mamba states past its first
    # step (as _append_qwen_mtp): eh_proj passes the embedding of token t+1 on, the blocks add little.
    for key in [k for k in tensors if k.startswith("mtp.layers.") and k.endswith(("o_proj.weight", "down_proj.weight"))]:
        tensors[key] = tensors[key] * 0.1
    gen = torch.Generator().manual_seed(family.seed + 2)
    proj = torch.randn(H, 2 * H, generator=gen) * 0.01
    proj[:, :H] += torch.eye(H)  # [embedding; hidden]: nemotron_h_mtp.py concatenates in that order
    last = len(_NEMOTRON_H_MTP_PATTERN) - 1
    tensors.update({"mtp.layers.0.enorm.weight": torch.ones(H), "mtp.layers.0.hnorm.weight": torch.ones(H),
                    "mtp.layers.0.eh_proj.weight": proj, f"mtp.layers.{last}.final_layernorm.weight": torch.ones(H)})
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(shard), metadata={"format": "pt"})
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(num_nextn_predict_layers=family.mtp_layers, mtp_hybrid_override_pattern=_NEMOTRON_H_MTP_PATTERN)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def _append_ernie_mtp(folder: Path, config, family: CheckpointSpec) -> None:
    """ERNIE-4.5's MTP layers as its checkpoints carry them: per depth d, ``model.mtp_block.{d}.*`` (a dense
    decoder layer; here layer 0's tensors, dense by moe_layer_start_index, perturbed) and the norms and the
    projection of [embedding; hidden] that feed it. The projection passes the hidden half on and the block
    adds little, so the draft guesses close to the main model and some drafts are accepted."""
    import torch
    from safetensors.torch import load_file, save_file

    (shard,) = folder.glob("*.safetensors")
    tensors = load_file(str(shard))
    H = config.hidden_size
    gen = torch.Generator().manual_seed(family.seed + 1)
    for d in range(family.mtp_layers):
        for k, v in list(tensors.items()):
            if k.startswith("model.layers.0."):
                noise = torch.randn(v.shape, generator=gen) * 0.02 if v.dim() > 1 else 0.0
                scale = 0.1 if k.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
                tensors[k.replace("model.layers.0.", f"model.mtp_block.{d}.")] = ((v + noise) * scale).contiguous()
        tensors[f"model.mtp_emb_norm.{d}.weight"] = torch.ones(H)
        tensors[f"model.mtp_hidden_norm.{d}.weight"] = torch.ones(H)
        proj = torch.randn(H, 2 * H, generator=gen) * 0.01
        proj[:, H:] += torch.eye(H)
        tensors[f"model.mtp_linear_proj.{d}.weight"] = proj
    save_file(tensors, str(shard), metadata={"format": "pt"})


def _keep_last_layers_as_mtp(folder: Path, main_config, family: CheckpointSpec) -> None:
    """Turn the saved (L + K)-layer checkpoint into an L-layer one with K NextN layers: transformers
    re-saves the first L layers under the L-layer config (num_nextn_predict_layers = K), and the
    layer tensors L.. stay, joined by the NextN-only ones (enorm, hnorm, eh_proj, shared_head)."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    (shard,) = folder.glob("*.safetensors")
    tensors = load_file(str(shard))
    L, H = main_config.num_hidden_layers, main_config.hidden_size
    main = getattr(transformers, family.model_class).from_pretrained(str(folder), config=main_config,
                                                                     dtype=torch.float32)
    for p in folder.glob("*.safetensors"):
        p.unlink()
    main.save_pretrained(str(folder))
    (shard,) = folder.glob("*.safetensors")
    out = load_file(str(shard))
    gen = torch.Generator().manual_seed(family.seed + 1)
    for d in range(family.mtp_layers):
        prefix = f"model.layers.{L + d}."
        out.update({k: v for k, v in tensors.items() if k.startswith(prefix)})
        out[prefix + "enorm.weight"] = torch.ones(H)
        out[prefix + "hnorm.weight"] = torch.ones(H)
        out[prefix + "eh_proj.weight"] = torch.randn(H, 2 * H, generator=gen) * (2 * H) ** -0.5
        out[prefix + "shared_head.norm.weight"] = torch.ones(H)
        # the model's head: lm_head, or the embedding a tied checkpoint keeps in its place
        head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
        out[prefix + "shared_head.head.weight"] = head.clone()
        out[prefix + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file({k: v.contiguous() for k, v in out.items()}, str(shard), metadata={"format": "pt"})


