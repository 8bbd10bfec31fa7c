"""transformers' router top-k for a family checkpoint's MTP layer: the oracle of the record's MTP section.

transformers builds no MTP layer, but its decoder layers are the MTP layer's blocks. So the checkpoint's MTP blocks
are loaded as the last decoder layer(s) of the family's own transformers model (a copy of the checkpoint, its MTP
tensors renamed to those layers'), and a forward pre-hook feeds the first of them what the draft model computes at
position p -- the projection of [norm(embedding of token p + 1); norm(target hidden state at p)], the hidden state
the target's final norm gives, which SGLang hands its draft -- in place of the layer below's output. (The test
checkpoints' final norms weigh 1 and hnorm rescales, so here the hidden state before that norm picks the same experts:
this oracle does not tell the two apart.) The rest of the
forward is transformers' own: attention over the earlier positions' MTP inputs (the draft's KV of verified tokens),
the router, its grouping and bias.

What each MTP format projects (SGLang's draft models, read in 0.5.23):
- "nextn" (deepseek_nextn.py, glm4_moe_nextn.py, bailing_moe_nextn.py): ``model.layers.{L}.eh_proj`` of
  [enorm(embedding); hnorm(hidden)], then decoder layer L as stored.
- "qwen" (qwen3_next_mtp.py, qwen3_5_mtp.py): ``mtp.fc`` of [pre_fc_norm_embedding(embedding);
  pre_fc_norm_hidden(hidden)] (Gemma-style norms: 1 + weight), then ``mtp.layers.0``.
- "nemotron_h" (nemotron_h_mtp.py): ``mtp.layers.0.eh_proj`` of [enorm(embedding); hnorm(hidden)], then the blocks
  of ``mtp_hybrid_override_pattern``, ``mtp.layers.{b}``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

from tests.family_specs.oracle import RouterTrace, load_transformers
from tests.family_specs.specs import CheckpointSpec

# MTP tensors of the projection's side, per format: (projection, embedding norm, hidden norm, Gemma-style norms)
_PROJECTION = {
    "nextn": ("{layers}{L}.eh_proj.weight", "{layers}{L}.enorm.weight", "{layers}{L}.hnorm.weight", False),
    "qwen": ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", True),
    "nemotron_h": ("mtp.layers.0.eh_proj.weight", "mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight", False),
}
# MTP tensors that are not a decoder block's (left where they are; transformers ignores them)
_NOT_BLOCK = (".eh_proj.", ".enorm.", ".hnorm.", ".final_layernorm.", ".shared_head.", ".embed_tokens.")


def _text_section(cfg: Dict[str, Any]) -> Dict[str, Any]:
    return cfg["text_config"] if "text_config" in cfg else cfg


def _layers_prefix(tensors: Dict[str, Any]) -> str:
    """The checkpoint's decoder-layer prefix (``model.layers.``, ``backbone.layers.``,
    ``model.language_model.layers.``), read off layer 0's tensors."""
    key = next(k for k in sorted(tensors) if not k.startswith("mtp.") and ".layers.0." in k)
    return key[:key.index(".layers.0.")] + ".layers."


def _extended_checkpoint(family: CheckpointSpec, folder: Path, out: Path) -> Tuple[int, int, Dict[str, Any]]:
    """A copy of ``folder`` whose transformers model has the MTP blocks as its last decoder layers: returns (the main
    model's layer count L, the MTP blocks' count, the tensors of the projection side)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, out, dirs_exist_ok=True)
    cfg = json.loads((out / "config.json").read_text())
    text = _text_section(cfg)
    L = int(text["num_hidden_layers"])
    (shard,) = out.glob("*.safetensors")
    tensors = load_file(str(shard))
    layers = _layers_prefix(tensors)
    fmt = family.mtp_format
    if fmt == "nemotron_h":
        pattern = text["mtp_hybrid_override_pattern"]
        text["hybrid_override_pattern"] += pattern
        blocks = len(pattern)
    else:
        blocks = 1
        for key in [k for k, v in text.items() if k.endswith("_types") and isinstance(v, list) and len(v) == L]:
            text[key] = text[key] + text[key][-1:]  # per-layer kinds: the MTP layer's as the last main layer's
            # (full attention, MoE, its own indexer)
    text["num_hidden_layers"] = L + blocks
    if fmt in ("qwen", "nemotron_h"):  # mtp.layers.{b}.* -> layer L + b (nextn's are stored as layer L already)
        for key in [k for k in tensors if k.startswith("mtp.layers.") and not any(s in k for s in _NOT_BLOCK)]:
            b, rest = key[len("mtp.layers."):].split(".", 1)
            tensors[f"{layers}{L + int(b)}.{rest}"] = tensors.pop(key)
    names = [n.format(layers=layers, L=L) for n in _PROJECTION[fmt][:3]]
    projection = {n: tensors[n].float() for n in names}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(shard), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return L, blocks, {"names": names, **projection}


def _find_stack(model, first_layer):
    """The module whose ``layers`` holds the decoder layers: its embedding and final norm."""
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if layers is not None and len(layers) and layers[0] is first_layer:
            norm = next(getattr(module, n) for n in ("norm", "norm_f", "final_layernorm") if hasattr(module, n))
            return module.get_input_embeddings() if hasattr(module, "get_input_embeddings") else module.embed_tokens, norm
    raise LookupError("no module holds the decoder layers")


class DraftOracle:
    """transformers' top-k of the MTP layer's router at each position p of a sequence, for the draft forward that
    consumes token p + 1's embedding and the target's hidden state at p (the record's MTP entries: ``positions`` p,
    ``tokens`` token p + 1). Step 0 of a round routes verified tokens, whose draft KV the draft extend wrote from
    the target's hidden states: those entries are this oracle's rows."""

    def __init__(self, family: CheckpointSpec, folder: Path):
        import torch

        from tests.family_specs.oracle import decoder_layers

        self._tmp = tempfile.TemporaryDirectory()
        L, blocks, proj = _extended_checkpoint(family, folder, Path(self._tmp.name) / "extended")
        self.model = load_transformers(Path(self._tmp.name) / "extended", strict=True)
        layers = decoder_layers(self.model)
        assert len(layers) == L + blocks, (len(layers), L, blocks)
        self._embed, self._norm = _find_stack(self.model, layers[0])
        cfg = self.model.config.get_text_config()
        self._eps = float(getattr(cfg, "rms_norm_eps", None) or getattr(cfg, "layer_norm_epsilon"))
        self._gemma = _PROJECTION[family.mtp_format][3]
        p, e, h = proj["names"]
        self._proj, self._enorm, self._hnorm = proj[p], proj[e], proj[h]
        self._next_tokens = None
        layers[L].register_forward_pre_hook(self._feed, with_kwargs=True)
        self.trace = RouterTrace(self.model)
        self._torch = torch

    def _rms(self, x, w):
        torch = self._torch
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self._eps)
        return x * ((1.0 + w) if self._gemma else w)

    def _feed(self, module, args, kwargs):
        torch = self._torch
        below = args[0] if args else kwargs["hidden_states"]
        hidden = self._norm(below)  # the target's hidden state: its final norm over the last main layer's output
        emb = self._embed(self._next_tokens)
        z = torch.cat([self._rms(emb, self._enorm), self._rms(hidden, self._hnorm)], dim=-1) @ self._proj.T
        z = z.to(below.dtype)
        if args:
            return (z, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": z}

    def topk(self, tokens: List[int]) -> np.ndarray:
        """[len(tokens) - 1, topk] sorted: the MTP router's ids at positions 0 .. len - 2."""
        torch = self._torch
        self._next_tokens = torch.tensor([tokens[1:] + tokens[-1:]])  # the last position's is dropped
        rows = self.trace.topk(tokens)
        return rows[:-1, -1]

    def close(self):
        self.trace.close()
        self._tmp.cleanup()
