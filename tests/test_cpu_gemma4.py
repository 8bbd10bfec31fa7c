"""The CPU runtime's Gemma-4 router (sglang_r3/cpu_runtime/families/gemma4.py) against transformers 5.19's own
``Gemma4TextRouter`` (``modeling_gemma4``): same probabilities, same top-k experts, for a router whose learned
input scale is not uniform; and SGLang's own CPU path without the hook routes otherwise. With an image: the CPU
runtime's image mask and the vision pooler (adapter/gemma4_vision.py) against transformers' own, and the
``image_attention`` refusal."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.fast


def test_the_router_is_transformers_and_sglangs_own_cpu_path_is_not():
    # In a fresh process with the CPU runtime as a server has it (SGLang's modules import sgl-kernel).
    code = textwrap.dedent("""
        import torch
        from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu
        if not has_gpu():
            activate_cpu_runtime()
        torch.set_num_threads(1)
        from transformers import Gemma4TextConfig
        from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRouter
        from sglang.srt.models.gemma4_causal import Gemma4Router
        from sglang_r3.cpu_runtime.families import gemma4

        cfg = Gemma4TextConfig(hidden_size=64, num_experts=8, top_k_experts=2, rms_norm_eps=1e-6)
        gen = torch.Generator().manual_seed(0)
        theirs = Gemma4TextRouter(cfg)
        ours = Gemma4Router(cfg)
        with torch.no_grad():
            theirs.proj.weight.copy_(torch.randn(8, 64, generator=gen))
            theirs.scale.copy_(torch.rand(64, generator=gen) + 0.5)
            ours.proj.weight.copy_(theirs.proj.weight)
            ours.scale.copy_(theirs.scale)
        x = torch.randn(40, 64, generator=gen) * 3
        with torch.no_grad():
            probs, _, ids = theirs(x)
            own = Gemma4Router.forward(ours, x)  # SGLang's own CPU path (Gemma4RMSNorm.forward_native)
            hooked = gemma4._router_around(Gemma4Router.forward, ours, x)
        torch.testing.assert_close(torch.softmax(hooked, -1), probs, atol=1e-6, rtol=1e-5)
        assert torch.equal(hooked.topk(2).indices.sort(-1).values, ids.sort(-1).values)
        moved = (own.topk(2).indices.sort(-1).values != ids.sort(-1).values).any(-1).sum().item()
        assert moved > 0, moved
        print("ROUTER", moved)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ROUTER" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def test_an_image_is_masked_pooled_and_refused_as_the_checkpoint_says():
    """With an image in the prompt (sglang_r3/cpu_runtime/families/gemma4.py, adapter/gemma4_vision.py):
    the CPU runtime's sliding-window mask is transformers' ``create_masks_for_vision_model`` sliding mask (its full
    mask is causal: those layers are left as SGLang runs them); the vision pooler is transformers'
    ``Gemma4VisionPooler`` (SGLang's own, over padded patches, is not); and a request whose image's attention is
    not the checkpoint's gets ``image_attention`` instead of rows. The request and forward batch are stand-ins
    (named so) around SGLang's own multimodal items."""
    code = textwrap.dedent("""
        import types
        import torch
        from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu
        if not has_gpu():
            activate_cpu_runtime()
        torch.set_num_threads(1)
        from transformers import Gemma4TextConfig, Gemma4VisionConfig
        from transformers.models.gemma4 import modeling_gemma4 as hf
        from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalInputs
        from sglang.srt.models.gemma4_vision import Gemma4VisionPooler
        from sglang_r3.serving.adapter import gemma4_vision
        from sglang_r3.cpu_runtime.families import gemma4

        # the mask: a 20-token prompt, an image at 3..11 and one at 14..16, a 4-token window
        length, window, images = 20, 4, [(3, 11), (14, 16)]
        cfg = Gemma4TextConfig(hidden_size=16, sliding_window=window, num_hidden_layers=2,
                               layer_types=["sliding_attention", "full_attention"])
        cfg._attn_implementation = "sdpa"
        types_ = torch.zeros(1, length, dtype=torch.long)
        for first, last in images:
            types_[0, first:last + 1] = 1
        masks = hf.create_masks_for_vision_model(
            config=cfg, inputs_embeds=torch.zeros(1, length, 16), attention_mask=torch.ones(1, length, dtype=torch.long),
            past_key_values=None, position_ids=torch.arange(length)[None],
            block_sequence_ids=hf.get_block_sequence_ids_for_mask(types_, device=torch.device("cpu")))
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        full = masks["full_attention"]
        assert full is None or torch.equal(full[0, 0], causal)  # None: sdpa's own is_causal
        # torch_native's window as SGLang hands it over (gemma4_causal.py: sliding_window - 1)
        ours = gemma4.sliding_mask_with_images(images, q_len=length, kv_len=length, sliding_window_size=window - 1,
                                               device=torch.device("cpu"))
        assert torch.equal(ours, masks["sliding_attention"][0, 0].bool()), (ours.int(), masks["sliding_attention"])
        assert not torch.equal(ours, causal & (torch.arange(length)[None] > torch.arange(length)[:, None] - window))

        # the pooler: 2 x 2 patches per soft token, 6 real patches of 8 (positions -1 pad), two soft tokens
        vcfg = Gemma4VisionConfig(hidden_size=8)
        gen = torch.Generator().manual_seed(0)
        hidden = torch.randn(1, 8, 8, generator=gen)
        pos = torch.tensor([[[0, 0], [1, 0], [0, 1], [1, 1], [2, 0], [3, 0], [-1, -1], [-1, -1]]])
        pad = (pos == -1).all(-1)
        want, want_mask = hf.Gemma4VisionPooler(vcfg)(hidden, pos, pad, output_length=2)
        sglang = Gemma4VisionPooler(vcfg)
        got, got_mask = gemma4_vision._pooler_around(Gemma4VisionPooler.forward, sglang, hidden, pos, pad, 2)
        torch.testing.assert_close(got, want.to(got.dtype))
        assert torch.equal(got_mask, want_mask)
        own, _ = Gemma4VisionPooler.forward(sglang, hidden, pos, pad, 2)
        assert not torch.allclose(own[0, 0], want[0, 0])  # SGLang's own: the padding pooled into the first token

        # the refusal, at collect: SGLang's items in a stand-in request and forward batch
        def request(*spans):
            items = [MultimodalDataItem(modality=Modality.IMAGE, offsets=[s]) for s in spans]
            return types.SimpleNamespace(multimodal_inputs=MultimodalInputs(mm_items=items))  # stand-in Req
        arch = "Gemma4ForConditionalGeneration"
        refuse = gemma4_vision.image_attention_refusal
        assert refuse("Qwen3VLMoeForConditionalGeneration", False, request((3, 11))) is None
        assert refuse(arch, False, types.SimpleNamespace(multimodal_inputs=None)) is None
        assert "GPU attention" in refuse(arch, False, request((3, 11)))
        req = request((3, 11), (14, 16))
        assert refuse(arch, True, req) is None
        batch = types.SimpleNamespace(extend_prefix_lens_cpu=[0], extend_seq_lens_cpu=[15],  # stand-in ForwardBatch
                                      mm_inputs=[req.multimodal_inputs])
        assert gemma4.image_spans(batch) == [[(3, 11)]]  # the second image is cut at token 15
        assert "(14, 16)" in refuse(arch, True, req)
        print("IMAGE")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "IMAGE" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
