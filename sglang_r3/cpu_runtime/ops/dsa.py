"""DSA models (GLM-5, DeepSeek-V3.2) on the CPU runtime: MLA attention over every key, no indexer run.

DSA attends each query to the ``index_topk`` keys its indexer scores highest. While a sequence is no longer
than ``index_topk`` that set is every key, so sparse attention is plain causal MLA: SGLang itself serves such
prefills dense (``SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD`` defaults to ``index_topk``), and
transformers' indexer takes ``min(index_topk, kv_len)`` keys, an empty mask. The CPU runtime serves DSA models
exactly that way, and start-up refuses a context longer than ``index_topk`` there
(``refusals.startup``, naming ``--context-length``), so no sequence can reach the case where the indexer decides.

* start-up: ``handle_model_specific_adjustments``'s DSA branch asks the CUDA device's capability to pick a
  DSA kernel backend and an fp8 KV cache; neither exists on the CPU runtime, whose attention backend is the
  torch_native one the launcher names. For DSA models on the CPU runtime those two passes
  (``_dsa_kv_cache_dtype_default``, ``_dsa_split_backend_resolution``) are skipped, and the capability the
  branch reads (and never uses once they are skipped) is answered without a driver;
* forward: the indexer's CUDA forward returns no indices when the attention backend has no indexer
  metadata (``get_indexer_metadata`` is None: "don't support indexer"), and the layer then attends densely.
  Its CPU forward (``forward_native``) raises instead; here it returns None in that same case and nothing
  else -- torch_native has no indexer metadata, so on the CPU runtime the indexer never runs.

Served and compared with transformers' router top-k in tests/test_families.py (``glm_moe_dsa``, ``deepseek_v32``,
MTP speculation on).
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang_r3.seam.swap import swapped

_DSA_PASSES = ("_dsa_kv_cache_dtype_default", "_dsa_split_backend_resolution")
_INDEXER = "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer"


def _hf_config(server_args):
    from sglang_r3.seam.release import model_config_of

    try:
        return model_config_of(server_args).hf_config
    except Exception:  # no readable config: SGLang's own call reports it
        return None


def _is_dsa(server_args) -> bool:
    from sglang.srt.configs.model_config import is_deepseek_dsa

    config = _hf_config(server_args)
    return config is not None and is_deepseek_dsa(config)


def _without_dsa_passes(run_post_process_pass):
    def run(server_args, post_process, *args, **kwargs):
        if getattr(post_process, "__name__", "") in _DSA_PASSES:
            return None
        return run_post_process_pass(server_args, post_process, *args, **kwargs)

    return run


def _no_device_capability(device=None):
    # The DSA branch unpacks the capability and, with its two passes skipped, reads it no further: any pair will
    # do, and no CUDA driver is asked (there is none on the CPU runtime).
    return (0, 0)


def _adjustments_around(original, server_args):
    if not _is_dsa(server_args):
        return original(server_args)
    from sglang.srt.arg_groups import model_hook

    with swapped(model_hook, "run_post_process_pass", _without_dsa_passes(model_hook.run_post_process_pass)), \
            swapped(torch.cuda, "get_device_capability", _no_device_capability):
        return original(server_args)


def _indexer_forward_native(original, self, x=None, q_lora=None, positions=None, forward_batch=None,
                            layer_id=None, *args, **kwargs) -> Optional[torch.Tensor]:
    from sglang.srt.model_executor.forward_context import get_attn_backend

    if get_attn_backend().get_indexer_metadata(layer_id, forward_batch) is None:
        return None  # as forward_cuda: the backend runs no indexer, the layer attends to every key
    return original(self, x, q_lora, positions, forward_batch, layer_id, *args, **kwargs)


def hooks():
    from sglang_r3.seam.release import cpu_model_ports_apply

    if not cpu_model_ports_apply():  # 0.5.15 keeps DSA in ServerArgs itself, and stops it at start-up on CPU
        return []
    return [
        ("sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments", _adjustments_around),
        (f"{_INDEXER}.forward_native", _indexer_forward_native),
    ]
