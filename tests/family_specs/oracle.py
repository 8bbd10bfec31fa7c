"""The transformers oracle: a checkpoint read back by transformers' own class (``load_transformers``), its module
tree per decoder layer (``dense_or_moe``) and its routers' top-k (``RouterTrace``, with ``near_tie``), and what the
oracle is fed where SGLang prepares a request otherwise (images, norms' eps).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np

from tests.family_specs.published import AS_TRANSFORMERS, STAND_INS, TRANSFORMERS_CLASS
from tests.family_specs.specs import SPECS, CheckpointSpec

def load_transformers(path: Path, *, strict: bool = False):
    """transformers' model of the checkpoint at ``path``, float32, eval (``strict``: every parameter from the
    checkpoint, none left at its initial value)."""
    import torch
    import transformers

    saved = json.loads((path / "config.json").read_text())
    (arch,) = saved["architectures"]
    if arch in AS_TRANSFORMERS:
        arch, as_transformers = AS_TRANSFORMERS[arch]
        path = as_transformers(path)
        saved = json.loads((path / "config.json").read_text())
    cls = getattr(transformers, TRANSFORMERS_CLASS.get(arch, arch))
    kwargs = {}
    stand_in = STAND_INS.get(saved.get("model_type"))
    if stand_in is not None and stand_in.renames:
        fields = {k: v for k, v in saved.items() if k != "auto_map"}
        kwargs["config"] = cls.config_class(**{**fields, "model_type": stand_in.renames})
    model, info = cls.from_pretrained(str(path), dtype=torch.float32, output_loading_info=True, **kwargs)
    assert not (strict and info["missing_keys"]), f"{path}: not in the checkpoint: {sorted(info['missing_keys'])}"
    return model.eval()


def spec_of_model(model) -> CheckpointSpec:
    return next(f for f in SPECS.values() if f.model_class == type(model).__name__)


def decoder_layers(model) -> List[Any]:
    return spec_of_model(model).layers_of(model)


def dense_or_moe(model) -> List[str]:
    """transformers' module tree, per decoder layer: 'moe' where the MLP has a router and experts."""
    fam = spec_of_model(model)
    return ["moe" if fam.is_moe_module(fam.mlp_of(layer)) else "dense" for layer in decoder_layers(model)]


# How far (in router logits) a float32 near tie may sit for RouterTrace.near_tie: the few (token, layer) pairs of a
# sampled completion where SGLang's and transformers' op orders pick different experts of (almost) equal score.
# Measured: the MLA families served with MTP speculation (SGLang's absorbed attention, transformers' naive one) now and
# then meet one a move of 1e-4 to 1e-3 decides (GLM-5, sampled: one pair in a full run); the wrong rows found so far
# needed 0.1 and more (Ling 2.0 without its routed scaling factor).
NEAR_TIE_LOGIT = 1e-3
# At most this many near ties per response, each named in the failure message of the comparison that allowed it.
NEAR_TIES_PER_RESPONSE = 2


class RouterTrace:
    """Forward hooks on transformers' own routers: the top-k expert ids each MoE layer chose per token.

    Families route in one of three places: a router module whose forward returns (logits, scores,
    indices) (Qwen3-MoE, Mixtral, OLMoE, ERNIE-4.5, Qwen3-VL-MoE: ``mlp.gate``), the MoE block's
    ``route_tokens_to_experts`` that turns the gate's logits into (indices, weights) (GLM-4.5, DeepSeek-V3:
    grouping and the correction bias live there), or a router the family names (``CheckpointSpec.router_ids``:
    Llama 4's ``feed_forward.router``, whose scores are non-zero at the chosen ids only; gpt-oss's
    ``mlp.router``). All are transformers' own code; we only read their outputs.
    """

    def __init__(self, model):
        self.model = model
        self.rows: Dict[int, List[np.ndarray]] = {}
        self._inputs: Dict[int, List[Any]] = {}  # a router module's hidden-state input, per call (near_tie)
        self._gates: Dict[int, Any] = {}
        self._gate_args: Dict[int, tuple] = {}
        self._routes: Dict[int, Callable] = {}  # route_tokens_to_experts, unwrapped: near_tie's second step
        self._ids: Dict[int, Callable] = {}  # a named router's output -> its ids (CheckpointSpec.router_ids)
        self._probing = False
        self._undo: List[Callable[[], None]] = []
        fam = spec_of_model(model)
        self._forward = fam.forward_of(model)
        for i, layer in enumerate(decoder_layers(model)):
            mlp = fam.mlp_of(layer)
            if not fam.is_moe_module(mlp):
                continue
            if fam.router_ids is not None:
                router, self._ids[i] = fam.router_ids(mlp)
                self._hook_gate(i, router)
            elif hasattr(mlp, "route_tokens_to_experts"):
                self._wrap_method(i, mlp)
            else:
                self._hook_gate(i, mlp.gate)

    def _record(self, i, indices):
        self.rows.setdefault(i, []).append(indices.detach().reshape(-1, indices.shape[-1]).cpu().numpy())

    def _picked(self, i, out):
        """The ids in a router module's output."""
        if i in self._ids:
            return self._ids[i](out)
        return out[-1] if isinstance(out, tuple) else out

    def _hook_gate(self, i, gate):
        def hook(module, args, out):
            if self._probing:  # near_tie's own call
                return
            if i not in self._routes:  # route_tokens_to_experts records the ids
                self._record(i, self._picked(i, out))
            self._inputs.setdefault(i, []).append(args[0].detach().reshape(-1, args[0].shape[-1]).clone())
            self._gate_args[i] = args[1:]  # a router's other inputs (LFM2-MoE's expert bias), for near_tie

        self._gates[i] = gate
        self._undo.append(gate.register_forward_hook(hook).remove)

    def near_tie(self, column: int, token: int, chosen, delta: float = NEAR_TIE_LOGIT) -> bool:
        """Whether transformers' own router, from the last ``topk`` forward, picks ``chosen`` at (token, MoE layer
        column) once its logits move by at most ``delta``: up for the experts only ``chosen`` has, down for those
        only transformers chose. The move is made on the router's input (the least-squares hidden-state change
        that shifts the logits so), so grouping, bias and scoring stay the router's own code (the gate module's,
        then the block's ``route_tokens_to_experts`` where the block routes). A float32 near tie that another op
        order decides is one; a wrong row is not. A router without a [experts, hidden] weight: never."""
        import torch

        layer = sorted(self.rows)[column]
        gate = self._gates.get(layer)
        weight = getattr(gate, "weight", None)
        if gate is None or weight is None or weight.dim() != 2:
            return False
        hidden = torch.cat(self._inputs[layer])[token]
        mine = set(np.concatenate(self.rows[layer])[token].tolist())
        theirs = {int(e) for e in chosen}
        shift = torch.zeros(weight.shape[0], dtype=torch.float64)
        shift[sorted(theirs - mine)] = delta
        shift[sorted(mine - theirs)] = -delta
        move = torch.linalg.lstsq(weight.detach().double(), shift[:, None]).solution[:, 0]
        self._probing = True
        try:
            with torch.no_grad():
                out = gate((hidden.double() + move).to(hidden.dtype)[None], *self._gate_args.get(layer, ()))
                if layer in self._routes:  # the block routes the gate's logits (GLM-4.5 / DeepSeek-V3 style)
                    out = self._routes[layer](out)[0]
        finally:
            self._probing = False
        picked = out if layer in self._routes else self._picked(layer, out)
        return set(picked.reshape(-1).tolist()) == theirs

    def _wrap_method(self, i, mlp):
        import torch

        original = mlp.route_tokens_to_experts

        def wrapped(*args, **kwargs):
            out = original(*args, **kwargs)
            if not self._probing:
                self._record(i, out[0])
            return out

        mlp.route_tokens_to_experts = wrapped
        self._undo.append(lambda: delattr(mlp, "route_tokens_to_experts"))
        # The gate module's input too, so near_tie moves the hidden state and runs gate, then the block's routing.
        gate = getattr(mlp, "gate", None)
        if isinstance(gate, torch.nn.Module):
            self._routes[i] = original
            self._hook_gate(i, gate)

    def topk(self, token_ids: List[int], **inputs) -> np.ndarray:
        """[len(token_ids), moe layers, topk] sorted ids from one forward over the whole sequence (``inputs``: the
        model's other inputs, e.g. an image's pixel values from its processor)."""
        import torch

        self.rows.clear()
        self._inputs.clear()
        with torch.no_grad():
            out = self._forward(torch.tensor([token_ids]), **inputs)
        self.logits = out.logits[0].double()  # [len(token_ids), vocab]
        layers = sorted(self.rows)
        per_layer = [np.concatenate(self.rows[i]) for i in layers]
        return np.sort(np.stack(per_layer, axis=1), axis=-1)

    def close(self):
        for undo in self._undo:
            undo()
        self._undo.clear()


# Multimodal MoE wrappers whose processor runs on CPU, served with an image in the prompt: its tokens pass through the
# MoE layers as tokens, so their rows are in the record (ours and upstream's routed_experts) like any other.
# family -> (its prompt with the release's image placeholder, the image's side: a multiple of patch x merge within the
# processor's pixel bounds, so neither side resizes it)
IMAGE_FAMILIES = {
    "glm4v_moe": ("Look: <|begin_of_image|><|image|><|end_of_image|> What is it?", 112),
    "qwen3_5_moe": ("Look: <|vision_start|><|image_pad|><|vision_end|> What is it?", 64),
    "qwen3_vl_moe": ("Look: <|vision_start|><|image_pad|><|vision_end|> What is it?", 64),
    "qwen3_omni_moe": ("Look: <|vision_start|><|image_pad|><|vision_end|> What is it?", 64),
    "kimi_k25": ("Look: <|media_begin|><|media_pad|><|media_end|> What is it?", 56),
    # (its processor resizes any image to its soft-token budget, 256 tokens here, on both sides alike)
    "gemma4": ("Look: <|image|> What is it?", 96),
    # one 448-pixel tile (the request's image_max_dynamic_patch: 1; SGLang's default cuts up to 12 and a thumbnail)
    "interns1": ("Look: <image> What is it?", 448),
}
# What a family's image request carries beyond the prompt and the image.
IMAGE_REQUEST = {"interns1": {"image_max_dynamic_patch": 1}}


def _interns1_image_inputs(folder: Path, text: str, image) -> tuple:
    """Intern-S1's model inputs for ``text`` with ``image``, as SGLang prepares them: the release's processor is not
    transformers' (SGLang runs its own InternVLProcessor, multimodal/processors/internvl.py
    process_qwen_mm_data_async), so the oracle takes that processor's pixels: the image scaled to [0, 1], normalised
    by its ImageNet mean and std, cut into tiles by its own dynamic_preprocess (one tile here, as the request asks),
    and the prompt's <image> expanded to <img>, the context token per tile feature, </img>."""
    import numpy
    import torch
    import transformers
    from sglang.srt.multimodal.processors.internvl import InternVLProcessor as SGLangProcessor

    config = json.loads((folder / "config.json").read_text())
    vision = config["vision_config"]
    per_tile = int((vision["image_size"][0] // vision["patch_size"][0]) ** 2 * config["downsample_ratio"] ** 2)
    pixels = torch.from_numpy(numpy.array(image.convert("RGB"))).permute(2, 0, 1).float() / 255.0
    mean = torch.tensor(SGLangProcessor.IMAGENET_MEAN).view(-1, 1, 1)
    std = torch.tensor(SGLangProcessor.IMAGENET_STD).view(-1, 1, 1)
    tiles = SGLangProcessor.dynamic_preprocess((pixels - mean) / std, image_size=448,
                                               max_num=IMAGE_REQUEST["interns1"]["image_max_dynamic_patch"],
                                               use_thumbnail=True)
    expanded = text.replace(SGLangProcessor.IMAGE_PLACEHOLDER_TOKEN, SGLangProcessor.IMG_START
                            + SGLangProcessor.IMG_CONTEXT * (per_tile * tiles.shape[0]) + SGLangProcessor.IMG_END)
    ids = transformers.AutoTokenizer.from_pretrained(str(folder))(expanded)["input_ids"]
    return ids, {"pixel_values": tiles.to(torch.float32)}


# Families whose release's processor is not transformers': folder, prompt, image -> (input ids, pixel inputs) as
# SGLang's own processor makes them.
SGLANG_PROCESSED = {"interns1": _interns1_image_inputs}
# Where SGLang's model builds a norm with another eps than transformers' (on every device), the oracle takes SGLang's,
# so the rows compared are of one computation; tests/test_families.py pins each difference on both sides.
# GLM-4.5V: glm4v.py builds the patch merger's post_projection_norm as SGLang's own LayerNorm (eps 1e-6), transformers
# as nn.LayerNorm (1e-5). Traced op by op (every vision op before it agrees within float32): with transformers' eps,
# SGLang's logprobs after an image were 4.3e-4 off (text-only: 3.8e-7) and sampled completions differed at a pair
# now and then (8 of 44 responses, 1e-3 to 1e-2 of a logit from a tie); with SGLang's, 4.3e-7 and 0 of 40.
SGLANG_NORM_EPS = {"glm4v_moe": {"model.visual.merger.post_projection_norm": 1e-6}}


def with_sglang_norm_eps(name: str, model):
    """``model`` (transformers') with the norms SGLang builds with another eps set to SGLang's (SGLANG_NORM_EPS)."""
    for path, eps in SGLANG_NORM_EPS.get(name, {}).items():
        model.get_submodule(path).eps = eps
    return model
