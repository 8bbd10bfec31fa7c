"""Refuse, at start-up, SGLang configurations under which routing capture would be wrong.

Outside the envelope capture is written for (one scheduler routes its whole batch, rows keyed by KV slots
only forwards write, drafts in ``EAGLEWorkerV2``, responses through our ``/generate``) the server would
answer HTTP 200 with wrong rows. ``check_supported`` names every flag that leaves it, one line each,
before SGLang starts a process: on the raw record (what the user asked for; some refused combinations
also fail SGLang's own resolution) and again after ``resolve_once`` (what SGLang turns on by itself).
"""

# Deliberately not refused (tests pin each): expert parallelism without an all-to-all backend (every
# rank routes the whole batch); EPLB (captured ids are the router's logical ones, before
# topk_ids_logical_to_physical; except 0.5.15's NPU path, which captures after it); --enable-single-batch-overlap (one select_experts per layer still);
# --skip-tokenizer-init (responses still pass our /generate); plain --dp-size replicas (each its own
# scheduler and capturer).

from __future__ import annotations

import argparse
import functools
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, NamedTuple, Optional, Sequence

from sglang_r3.core import settings

# The only speculative algorithm whose worker (EAGLEWorkerV2) we hook; NEXTN is
# SGLang's CLI alias for it.
_HOOKED_ALGORITHMS = ("EAGLE", "NEXTN")

# Worker each built-in algorithm gets in 0.5.23 (SpeculativeAlgorithm.create_worker):
# there is no v1 worker left and no env selects one; EAGLE/EAGLE3 run
# EAGLEWorkerV2 even with overlap disabled (synchronously).
_WORKER_OF = {
    "EAGLE3": "EAGLEWorkerV2 with an external EAGLE-3 draft head",
    "STANDALONE": "StandaloneWorkerV2",
    "NGRAM": "NGRAMWorker",
    "FROZEN_KV_MTP": "FrozenKVMTPWorkerV2",
    "DFLASH": "DFlashWorkerV2",
    "DSPARK": "DSparkWorkerV2",
    "UNO": "UnoWorkerV2",
}

_KV_RESTORE = (
    "KV restored from host or storage lands in KV slots that no forward of this server captured, "
    "so their rows would be stale or missing (rows are keyed by KV slot and only forwards write them)"
)

# MoE runner backends for which TopK.bind_runner_backend may pick a TopK output format
# other than STANDARD: TRITON_KERNEL never calls capture_routed_experts_if_allowed, and
# BYPASSED routes inside the fused kernel unless SGLang happens to materialize it.
_IN_KERNEL_ROUTING_RUNNERS = ("triton_kernel", "flashinfer_trtllm", "experimental_sgl_trtllm", "flashinfer_mxfp4")


class UnsupportedConfigError(ValueError):
    """The server configuration would make routing capture return wrong rows; one line per flag."""

    def __init__(self, refusals: Sequence["Refusal"]):
        self.refusals = list(refusals)
        lines = [
            "sglang-r3 refuses to start: routing capture would return wrong rows under "
            + ("this setting:" if len(self.refusals) == 1 else "these settings:")
        ]
        lines += [f"  {r.flag}: {r.reason}" for r in self.refusals]
        lines.append(
            "Remove the flag(s) above, or serve with plain `python -m sglang.launch_server` (no routing capture)."
        )
        super().__init__("\n".join(lines))

    @property
    def flags(self) -> List[str]:
        return [r.flag for r in self.refusals]


@dataclass(frozen=True)
class Refusal:
    flag: str  # as the user typed it, with its value where it has one
    reason: str


def check_supported(server_args: Any, *, argv: Optional[Sequence[str]] = None,
                    resolve: Optional[Callable[[], Any]] = None) -> None:
    """Raise ``UnsupportedConfigError`` listing every setting outside the capture envelope.

    ``server_args`` is what ``prepare_server_args`` returned. This resolves it (``resolve``; by default
    0.5.23's ``resolve_once``, idempotent, so ``run_server`` does not resolve twice; 0.5.15 resolved the
    record when it built it, so the raw pass there reads resolved values, unless it runs inside the
    ``__post_init__`` hook, which hands in the resolution itself). ``argv`` is the command line, used only
    to name flags as they were typed; by default it is the one SGLang kept on the record.
    """
    from sglang_r3.seam import release

    if argv is None:
        argv = release.launch_argv(server_args)
    names = _FlagNames(argv)
    refusals = _refusals(server_args, names, resolved=False)
    if refusals:
        raise UnsupportedConfigError(refusals)
    raw = release.as_asked(server_args)  # what the flags said, to name what SGLang's resolution changed
    if resolve is None:
        release.resolve(server_args)
    else:
        resolve()
    refusals = _refusals(release.resolved(server_args), names, resolved=True, raw=raw)
    if refusals:
        raise UnsupportedConfigError(refusals)


# -- naming flags -------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _option_strings() -> dict:
    """ServerArgs field -> its long CLI spellings (aliases included), from SGLang's own parser."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(parser)
    out: dict = {}
    for action in parser._actions:
        longs = tuple(s for s in action.option_strings if s.startswith("--"))
        if longs:
            out[action.dest] = out.get(action.dest, ()) + longs
    return out


_RAW = object()  # marker: the value is the one asked for, not changed by SGLang's resolution


class _FlagNames:
    def __init__(self, argv: Sequence[str]):
        self.argv = list(argv)

    def typed(self, field: str) -> Optional[str]:
        """The spelling of ``field``'s flag on the command line, or None."""
        for opt in _option_strings().get(field, ()):
            if any(a == opt or a.startswith(opt + "=") for a in self.argv):
                return opt
        return None

    def name(self, field: str, value: Any = None, *, resolved_from: Any = _RAW) -> str:
        """The flag as the user typed it (``--tp-size 2``), or its canonical spelling; with a note when
        SGLang's resolution changed the value (``resolved_from`` is then the value asked for)."""
        typed = self.typed(field)
        opts = _option_strings().get(field, ())
        canonical = "--" + field.replace("_", "-")
        flag = typed or (canonical if canonical in opts or not opts else opts[0])
        text = flag if value is None else f"{flag} {value}"
        if resolved_from is not _RAW:
            if typed is None:
                text += " (not on the command line: SGLang set it while resolving this configuration)"
            else:
                text += f" (SGLang resolved it from {resolved_from!r})"
        elif typed is None and "--config" in self.argv:
            text += " (from --config)"
        return text


# -- the rules ------------------------------------------------------------------


def _refusals(cfg: Any, names: _FlagNames, *, resolved: bool, raw: Any = None) -> List[Refusal]:
    """Every refusal for ``cfg``: the raw record, or the resolved view (then ``raw`` is the record)."""
    out: List[Refusal] = []
    for rule in (_parallelism, _moe_routing_layout, _kv_restore, _disaggregation, _speculative, _serving,
                 _checkpoint, _release_cpu_runtime, _dsa_on_cpu, _swa_shapes_on_cpu, _linear_attention_tree_on_cpu,
                 _fused_qk_norm_rope):
        for hit in rule(cfg, names, resolved=resolved):
            if hit.field.isupper():  # an environment variable, not a ServerArgs field
                flag = f"{hit.field}={hit.value} (environment variable)"
            else:
                asked = getattr(raw, hit.field) if resolved else _RAW
                changed = asked is not _RAW and asked != getattr(cfg, hit.field)
                flag = names.name(hit.field, hit.value, resolved_from=asked if changed else _RAW)
            out.append(Refusal(flag + hit.also, hit.reason))
    return out


class _Hit(NamedTuple):
    field: str  # ServerArgs field (or environment variable) that leaves the envelope
    value: Any  # shown after the flag; None for switches
    reason: str
    also: str = ""  # the rest of a refused combination, e.g. " together with --tp-size 2"


Rule = Iterable[_Hit]


def _parallelism(cfg, names, *, resolved) -> Rule:
    # DP attention is served: each rank's rows are cut out of the gathered batch (adapter/dp_rows.py).
    if _arg(cfg, "dwdp_size", 1) > 1:  # no DWDP before 0.5.23
        yield _Hit("dwdp_size", cfg.dwdp_size, (
            "DWDP runs attention DP across the TP ranks and routes each rank's own token shard; "
            "our capturer assumes one local batch routed whole"
        ))
    if cfg.pp_size > 1:
        yield _Hit("pp_size", cfg.pp_size, (
            "layers live on different pipeline ranks, so no rank captures every MoE layer of a token "
            "(and SGLang runs no MTP draft worker under pipeline parallelism)"
        ))
    cp_reason = (
        "context parallelism splits one request's tokens and KV across ranks; our capturer keys rows "
        "by this rank's KV slots and does not gather them across context-parallel ranks"
    )
    if cfg.attn_cp_size > 1:
        yield _Hit("attn_cp_size", cfg.attn_cp_size, cp_reason)
    if cfg.enable_prefill_cp:
        yield _Hit("enable_prefill_cp", None, cp_reason)
    if cfg.dcp_size > 1:
        yield _Hit("dcp_size", cfg.dcp_size, (
            "decode context parallelism spreads a request's KV across ranks; our capturer keys rows by "
            "this rank's KV slots and does not gather them across ranks"
        ))


# All-to-all backends whose scattered tokens adapter/dp_rows.py gathers across attention-TP ranks (as
# upstream's RoutedExpertsCapturer.capture does for exactly these two).
_GATHERED_A2A = ("deepep", "deepep_v2")
# Served on a GPU, not on the CPU runtime: DeepEP is CUDA kernels over NVSHMEM. SGLang imports it at module load
# and defers the failure to the first MoE layer built, i.e. after start-up (tests/test_expert_parallel.py checks
# the call on this host).
_DEEPEP_ON_CPU = {
    "deepep": (
        "DeepEP needs a CUDA device and NVSHMEM: on a host without a GPU SGLang's import of deep_ep fails "
        "(layers/moe/token_dispatcher/deepep.py: use_deepep is False) and _DeepEPDispatcherImplBase.__init__ raises "
        "ImportError when the first MoE layer is built, after start-up; expert parallelism without an all-to-all "
        "backend (--moe-a2a-backend none) is served on the CPU runtime"
    ),
    "deepep_v2": (
        "DeepEP v2 needs a CUDA device and NVSHMEM: on a host without a GPU SGLang's import of deep_ep fails "
        "(layers/moe/token_dispatcher/deepep_v2.py: use_deepep_v2 is False) and its dispatcher raises ImportError "
        "when the first MoE layer is built, after start-up; expert parallelism without an all-to-all backend "
        "(--moe-a2a-backend none) is served on the CPU runtime"
    ),
}


def _moe_routing_layout(cfg, names, *, resolved) -> Rule:
    from sglang_r3.seam.release import attn_tp_size_of

    # SGLang's own derivation: tp_size / (attn_dp_size * attn_cp_size).
    attn_tp = attn_tp_size_of(cfg)
    if attn_tp > 1:
        also = f" together with {names.name('tp_size', cfg.tp_size)} (attention-TP width {attn_tp})"
        if names.typed("ep_size"):
            also += f" and {names.name('ep_size', cfg.ep_size)}"
        scatter = (
            f"the all-to-all scatters each forward's tokens across the {attn_tp} attention-TP ranks, so "
            "a rank's {router} sees only its share; sglang-r3 gathers the shares (as upstream does) only for "
            + " and ".join(_GATHERED_A2A) + ", whose scatter layout it was checked against. Expert parallelism "
            "without an all-to-all backend (--moe-a2a-backend none) is supported"
        )
        if cfg.moe_a2a_backend not in (None, "none", *_GATHERED_A2A):
            yield _Hit("moe_a2a_backend", cfg.moe_a2a_backend, scatter.format(router="router"), also)
        if cfg.speculative_moe_a2a_backend not in (None, "none", *_GATHERED_A2A):
            yield _Hit(
                "speculative_moe_a2a_backend",
                cfg.speculative_moe_a2a_backend,
                scatter.format(router="MTP router"),
                also,
            )
    if cfg.device == "cpu":
        for field in ("moe_a2a_backend", "speculative_moe_a2a_backend"):
            backend = getattr(cfg, field)
            if backend in _GATHERED_A2A:
                yield _Hit(field, backend, _DEEPEP_ON_CPU[backend], f" on {names.name('device', cfg.device)}")
    if cfg.device != "cpu" and cfg.enable_torch_compile and cfg.ep_size > 1 and cfg.moe_a2a_backend in (None, "none"):
        # On the CPU runtime the compiled forward keeps moe_forward_native, which cpu_runtime/platform/expert_parallel.py serves.
        yield _Hit("enable_torch_compile", None, (
            "at a batch of one token SGLang's torch.compile mode swaps the MoE forward for "
            "layers/moe/fused_moe_native.fused_moe_forward_native (0.5.23: UnquantizedFusedMoEMethod."
            "_torch_compile_forward; 0.5.15: MultiPlatformOp.enter_torch_compile), which indexes "
            "w13_weight[topk_ids] with the -1 id expert parallelism gives another rank's expert "
            "(token_dispatcher/standard.py): the last local expert would be added where the CUDA kernel adds "
            "nothing, so the forward would not be the model's"
        ), f" together with {names.name('ep_size', cfg.ep_size)}")
    if cfg.device == "npu" and _expert_placement_remapped(cfg):
        from sglang_r3.seam.release import npu_topk_captures_physical_ids

        if npu_topk_captures_physical_ids():
            yield _Hit("enable_eplb" if cfg.enable_eplb else "init_expert_location",
                       None if cfg.enable_eplb else cfg.init_expert_location, (
                "SGLang 0.5.15's NPU top-k (hardware_backend/npu/moe/topk.py fused_topk_npu) calls the capture "
                "site after topk_ids_logical_to_physical, so rows would hold physical (replica) ids, not the "
                "router's experts"
            ), f" on {names.name('device', cfg.device)}")
    if cfg.moe_runner_backend in _IN_KERNEL_ROUTING_RUNNERS:
        yield _Hit("moe_runner_backend", cfg.moe_runner_backend, (
            "this runner may route inside its fused kernel (TopK output TRITON_KERNEL or BYPASSED), which "
            "skips SGLang's capture site, so main rows would not be captured"
        ))
    if cfg.enable_two_batch_overlap:
        yield _Hit("enable_two_batch_overlap", None, (
            "each forward runs as two micro-batches (batch_overlap/two_batch_overlap.py), and each calls "
            "layers.moe.topk.capture_routed_experts_if_allowed(topk_config, layer_id, topk_ids) with its own "
            "tokens and no offset into the forward, so the second half's rows land where the first's are "
            "(upstream's capturer overwrites them the same way); no faithful capture exists in SGLang 0.5.23"
        ))


def _expert_placement_remapped(cfg) -> bool:
    """Whether logical expert ids are mapped to other physical ones (EPLB, a non-trivial initial placement)."""
    return bool(cfg.enable_eplb or cfg.init_expert_location not in (None, "trivial")
                or (getattr(cfg, "ep_num_redundant_experts", 0) or 0) > 0)


def _kv_restore(cfg, names, *, resolved) -> Rule:
    if cfg.enable_hierarchical_cache:
        yield _Hit("enable_hierarchical_cache", None, _KV_RESTORE)
    if cfg.hicache_storage_backend is not None:
        yield _Hit("hicache_storage_backend", cfg.hicache_storage_backend, _KV_RESTORE)
    if cfg.enable_lmcache:
        yield _Hit("enable_lmcache", None, _KV_RESTORE)
    if _arg(cfg, "enable_flexkv", False):  # no FlexKV before 0.5.23
        yield _Hit("enable_flexkv", None, _KV_RESTORE)
    if cfg.radix_cache_backend is not None:
        yield _Hit("radix_cache_backend", cfg.radix_cache_backend, (
            "a plugin radix-cache backend may serve prefixes from KV it restored from outside this "
            "server's forwards; " + _KV_RESTORE
        ))
    if _arg(cfg, "enable_unified_cache_external_linker", False):  # no unified-cache linker before 0.5.23
        yield _Hit("enable_unified_cache_external_linker", None, _KV_RESTORE)
    if cfg.enable_hisparse:
        yield _Hit("enable_hisparse", None, (
            "hierarchical sparse attention keeps KV in host memory and stages it back through a device "
            "buffer; rows are keyed by KV slot and this mapping is not followed"
        ))
    if cfg.disaggregation_decode_enable_offload_kvcache:
        yield _Hit("disaggregation_decode_enable_offload_kvcache", None, _KV_RESTORE)


def _disaggregation(cfg, names, *, resolved) -> Rule:
    # PD disaggregation is served with Mooncake: the prompt's rows travel with its KV (adapter/pd_rows.py).
    if cfg.disaggregation_mode not in (None, "null"):
        from sglang_r3.seam import release

        if cfg.disaggregation_transfer_backend != "mooncake":
            yield _Hit("disaggregation_transfer_backend", cfg.disaggregation_transfer_backend, (
                "under PD disaggregation the prompt's rows travel with its KV; that is served with the mooncake "
                "transfer backend (--disaggregation-transfer-backend mooncake), the one it is proven with"
            ))
        if cfg.kv_cache_dtype == "mxfp8" and release.pd_rows_carrier().state_type == "BLOCK_SCALE":
            yield _Hit("kv_cache_dtype", cfg.kv_cache_dtype, (
                "under PD disaggregation the prompt's rows travel as the KV transfer's block_scale component, "
                "which an MXFP8 KV cache uses for its own per-block scales"
            ), also=f" together with {names.name('disaggregation_mode', cfg.disaggregation_mode)}")
    if cfg.enable_pdmux:
        yield _Hit("enable_pdmux", None, (
            "PD multiplexing runs a prefill split into layer chunks interleaved with decode forwards; our "
            "capturer stages one forward at a time"
        ))
    if cfg.decoupled_spec_role not in (None, "null"):
        yield _Hit("decoupled_spec_role", cfg.decoupled_spec_role, (
            "draft and verify run in separate engines; MTP draft capture and accept resolution live in "
            "the EAGLEWorkerV2 of one scheduler"
        ))


def _speculative(cfg, names, *, resolved) -> Rule:
    algo = cfg.speculative_algorithm
    if algo is not None:
        name = str(algo).upper()
        # Resolution upper-cases the name and turns NEXTN into EAGLE (or into FROZEN_KV_MTP for a
        # Gemma-4 assistant draft), so on the resolved view only EAGLE is ours.
        if name not in (("EAGLE",) if resolved else _HOOKED_ALGORITHMS):
            worker = _WORKER_OF.get(name, "a plugin-registered speculative worker")
            yield _Hit("speculative_algorithm", algo, (
                f"it runs in {worker}; sglang-r3 hooks only EAGLEWorkerV2 drafting with the model's own "
                "MTP (NextN) layers (EAGLE / NEXTN), where draft routing is kept apart from main rows and "
                "tagged accepted or rejected"
            ))
        elif resolved and (worker := _platform_worker(algo)) is not None:
            yield _Hit("device", cfg.device, (
                f"this out-of-tree platform replaces EAGLEWorkerV2 with {worker}, which sglang-r3 does not hook"
            ))
    if cfg.enable_multi_layer_eagle and algo is not None and resolved:
        # Checked on the resolved view only: SGLang turns it on by itself for the models that need it, and
        # whether we serve it depends on the model (its layout) and the resolved draft settings.
        yield from _multi_layer_eagle(cfg)


# Multi-layer EAGLE (MultiLayerEagleWorkerV2) is captured for these architectures only: the ones whose
# layout rule, draft runners and chained draft-extend rows were proven against a spec-off server
# (tests/test_multi_layer_mtp.py); the family registry (sglang_r3.core.families, ``multi_layer_capture``) says which.
from sglang_r3.core.families import MULTI_LAYER_MTP_ARCHITECTURES as _MULTI_LAYER_MTP_ARCHITECTURES  # noqa: E402


def _multi_layer_eagle(cfg) -> Rule:
    def refuse(why: str, field: str = "enable_multi_layer_eagle", value: Any = None, also: str = "") -> _Hit:
        return _Hit(field, value, "multi-layer EAGLE (MultiLayerEagleWorkerV2): " + why, also)

    try:
        from sglang_r3.core.layout import LayoutError, layout_from_hf_config
        from sglang_r3.seam.release import model_config_of

        hf_config = model_config_of(cfg).hf_config
        arch = (getattr(hf_config, "architectures", None) or [""])[0]
        layout = layout_from_hf_config(hf_config)
    except LayoutError as e:
        yield refuse(f"the model has no layout sglang-r3 can describe ({e})")
        return
    except Exception as e:  # noqa: BLE001 -- the config did not load; say so rather than guess
        yield refuse(f"the model config could not be read to check its MTP layers ({type(e).__name__}: {e})")
        return
    if arch not in _MULTI_LAYER_MTP_ARCHITECTURES:
        yield refuse(
            f"captured only for {', '.join(_MULTI_LAYER_MTP_ARCHITECTURES)}, not {arch!r} (its draft runners "
            "and chained draft-extend rows are not proven)"
        )
        return
    if cfg.speculative_eagle_topk not in (None, 1):
        yield refuse(
            "the chained draft-extend rows are tagged for chain drafting (one token per step) only",
            "speculative_eagle_topk", cfg.speculative_eagle_topk,
        )
    steps = cfg.speculative_num_steps
    if steps is not None and steps > layout.num_mtp_layers:
        yield refuse(
            f"draft step i runs MTP layer i + 1, but the model has {layout.num_mtp_layers} MTP layer(s)",
            "speculative_num_steps", steps,
        )
    # SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX (on by default) widens the draft-extend window only for hybrid
    # (mamba) request pools, which Step-3.5 does not have; a widened window stops the scheduler
    # (adapter/draft_site.py) rather than be filed.
    if cfg.device != "cpu" and not cfg.disable_cuda_graph:
        from sglang_r3.seam.release import has_draft_extend_graph_switch

        if not has_draft_extend_graph_switch():  # 0.5.15 has no switch for the draft-extend graphs alone
            yield refuse("its draft-extend CUDA graphs replay outside ModelRunner.forward, where MTP-draft routing "
                         "is filed; SGLang 0.5.15 captures them whenever decode CUDA graphs are on: "
                         "--disable-cuda-graph", also=" with CUDA graphs on")
        elif not _env_flag("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH"):
            yield refuse(
                "its draft-extend CUDA graphs replay outside ModelRunner.forward, where MTP-draft routing is filed; "
                "set SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 (or --disable-cuda-graph)",
                also=" with CUDA graphs on",
            )


def _dsa_on_cpu(cfg, names, *, resolved) -> Rule:
    """The CPU runtime attends a DSA model's queries to every key (cpu_runtime/ops/dsa.py): DSA's own result only while
    no sequence is longer than index_topk, so a longer context is refused there. (Resolved pass: the context length
    is SGLang's, from --context-length or the config.)"""
    if not resolved or cfg.device != "cpu":
        return
    try:
        from sglang.srt.configs.model_config import get_dsa_index_topk, is_deepseek_dsa

        from sglang_r3.seam.release import model_config_of

        model = model_config_of(cfg)
        if not is_deepseek_dsa(model.hf_config):
            return
        topk = get_dsa_index_topk(model.hf_config)
    except Exception:  # noqa: BLE001 -- a config that does not load: SGLang's own start-up says why
        return
    if model.context_len > topk:
        yield _Hit("context_length", model.context_len, (
            f"on the CPU runtime a DSA model's attention runs over every key, which is what its indexer selects only "
            f"while a sequence has at most index_topk={topk} tokens; pass --context-length {topk} or less (a GPU "
            f"serves it with SGLang's DSA kernels)"
        ))


def _linear_attention_tree_on_cpu(cfg, names, *, resolved) -> Rule:
    """The CPU runtime's Mamba-2 and gated delta-net mixers (cpu_runtime/ops/mamba2.py, cpu_runtime/ops/gdn.py) verify a drafted
    chain, one state per draft step; a drafted tree (--speculative-eagle-topk > 1) stopped the scheduler at its
    first verify. (Resolved pass: SGLang's own draft settings and its own test for linear-attention layers.)"""
    if not resolved or cfg.device != "cpu" or cfg.speculative_algorithm is None:
        return
    if cfg.speculative_eagle_topk in (None, 1):
        return
    from sglang_r3.seam.release import linear_attention_config, model_config_of

    try:
        model = model_config_of(cfg)
    except Exception:  # noqa: BLE001 -- a config that does not load: SGLang's own start-up says why
        return
    if linear_attention_config(model) is None:  # (an error here is ours: raised, not taken for "no such layers")
        return
    yield _Hit("speculative_eagle_topk", cfg.speculative_eagle_topk, (
        "on the CPU runtime a model with linear-attention (Mamba-2 / gated delta-net) layers verifies a drafted "
        "chain only: its recurrent state is kept per draft step along one chain; pass --speculative-eagle-topk 1 "
        "(a GPU serves trees with SGLang's kernels)"
    ))


def _swa_shapes_on_cpu(cfg, names, *, resolved) -> Rule:
    """The CPU runtime serves one KV pool for every layer (--disable-hybrid-swa-memory, core/settings.py): a model
    whose sliding-window layers have another KV head shape than its full-attention ones (SGLang's swa_head_dim /
    swa_num_key_value_heads: Gemma-4 as published) does not fit in it, and the first prefill stopped the scheduler
    (a shape mismatch writing the KV cache). (Resolved pass: the model config as SGLang's loader flattened it.)"""
    if not resolved or cfg.device != "cpu" or not cfg.disable_hybrid_swa_memory:
        return
    try:
        from sglang_r3.seam.release import model_config_of

        model = model_config_of(cfg)
        if not hasattr(model.hf_text_config, "swa_num_key_value_heads"):  # one shape (what get_swa_num_kv_heads reads)
            return
        swa = (model.swa_head_dim, model.get_swa_num_kv_heads(1))
        full = (model.head_dim, model.get_num_kv_heads(1))
    except Exception:  # noqa: BLE001 -- a config that does not load: SGLang's own start-up says why
        return
    if swa != full:
        yield _Hit("device", "cpu", (
            f"this model's sliding-window layers keep keys and values of head_dim {swa[0]} x {swa[1]} heads, its "
            f"full-attention layers of {full[0]} x {full[1]}; the CPU runtime serves one KV pool for every layer "
            "(its torch_native backend reads a separate sliding-window pool by full-pool slot ids), whose one shape "
            "cannot hold both (a GPU serves it with SGLang's hybrid SWA pool)"
        ))


def _arg(cfg, name: str, absent: Any) -> Any:
    """A ServerArgs field 0.5.23 has and 0.5.15 lacks; ``absent``: what its absence meant there."""
    return getattr(cfg, name, absent)


def _env_flag(name: str) -> bool:
    from sglang.srt.environ import envs

    var = getattr(envs, name, None)
    if var is not None:
        return bool(var.get())
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _platform_worker(algo: str) -> Optional[str]:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_r3.seam.release import has_platform_spec_workers

    if not has_platform_spec_workers():  # no out-of-tree platform workers before 0.5.23
        return None
    cls = SpeculativeAlgorithm.from_string(algo).get_platform_worker_cls()
    return None if cls is None else cls.__name__


def _serving(cfg, names, *, resolved) -> Rule:
    if cfg.tokenizer_worker_num > 1:
        yield _Hit("tokenizer_worker_num", cfg.tokenizer_worker_num, (
            "multi-tokenizer mode serves HTTP from worker processes that import SGLang's app afresh, "
            "without our /generate (mounted in the launcher process); they would return our capture "
            "payload as if it were upstream's routed_experts"
        ))
    grpc = (
        "gRPC requests bypass our /generate, so the capture payload would reach clients as if it were "
        "upstream's routed_experts"
    )
    smg = _arg(cfg, "smg_grpc_mode", False)  # no SMG gRPC mode before 0.5.23
    if smg:
        yield _Hit("smg_grpc_mode", None, grpc)
    if cfg.grpc_mode:
        yield _Hit("grpc_mode", None, grpc)
    # Legacy SMG mode resolves a port too; one line for it is enough. 0.5.15 sets grpc_port on every record
    # (port + 10000) and starts a gRPC server only in grpc_mode: there the port says nothing.
    from sglang_r3.seam.release import grpc_port_means_a_grpc_server

    if grpc_port_means_a_grpc_server() and cfg.grpc_port is not None and not (smg or cfg.grpc_mode):
        yield _Hit("grpc_port", cfg.grpc_port, grpc + " (the port may also come from SGLANG_GRPC_PORT)")
    if cfg.use_ray:
        yield _Hit("use_ray", None, (
            f"schedulers run as Ray actors, which do not inherit {settings.ENABLED} from the launcher, so "
            "our capturer would not be installed in them"
        ))
    if not resolved and _rust_server():
        yield _Hit("SGLANG_RUST_SERVER", os.environ.get("SGLANG_RUST_SERVER"), (
            "the Rust HTTP server replaces SGLang's FastAPI app, so our /generate is never served"
        ))


def _rust_server() -> bool:
    from sglang.srt.environ import envs

    from sglang_r3.seam.release import has_rust_http_server

    return has_rust_http_server() and bool(envs.SGLANG_RUST_SERVER.get())  # no Rust HTTP server before 0.5.23


# SGLang's Qwen3NextConfig (srt/configs/qwen3_next.py, 0.5.15.post1 and 0.5.23; Qwen3.5's text configs subclass
# it) builds its layers from full_attention_interval (layers_block_type) and drops layer_types, which is all a
# transformers-5 save_pretrained writes: the scheduler would stop on an AttributeError after start-up accepted it.
_NEEDS_FULL_ATTENTION_INTERVAL = ("Qwen3NextForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
# SGLang's Qwen3NextConfig (srt/configs/qwen3_next.py) takes rope_theta as a keyword (default 10000) and qwen3_next.py
# rotates with config.rope_theta; rope_parameters' own rope_theta, all a transformers-5 save writes, is not read
# (Qwen3.5's config reads rope_parameters). Served so, a flipped checkpoint's layout digest (SGLang's 10000) differed
# from its config.json's (1000).
_READS_TOP_LEVEL_ROPE_THETA = ("Qwen3NextForCausalLM",)
# SGLang's Qwen3.5 vision config (srt/configs/qwen3_5.py) subclasses Qwen3-VL's, whose deepstack_visual_indexes
# defaults to [8, 16, 24]; the Qwen3.5 releases ship it empty, and transformers' Qwen3.5 vision config has no such key
# (a transformers-5 save drops it). Without it SGLang adds deepstack features Qwen3.5 does not have to the image
# tokens' first decoder layers: served with a one-block tower, the first image prompt stopped the scheduler.
_NEEDS_DEEPSTACK_KEY = ("Qwen3_5MoeForConditionalGeneration",)


def _checkpoint(cfg, names, *, resolved) -> Rule:
    """What a checkpoint's config.json asks of SGLang that SGLang cannot build (raw pass only: SGLang's own
    argument resolution may already stop on such a config)."""
    config = None if resolved else _read_config(cfg)
    if config is None:
        return
    arch = (config.get("architectures") or [""])[0]
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if arch in _NEEDS_FULL_ATTENTION_INTERVAL and "full_attention_interval" not in text:
        where = "text_config." if text is not config else ""
        yield _Hit("model_path", cfg.model_path, (
            f"{arch}: its config.json has no {where}full_attention_interval. SGLang builds the layers' attention "
            f"from it (Qwen3NextConfig.layers_block_type) and ignores layer_types, which transformers 5 writes "
            f"instead; {_interval_hint(text.get('layer_types'), where)}"
        ))
    yield from _required_keys(cfg, arch, text, "text_config." if text is not config else "")
    rope = text.get("rope_parameters") if isinstance(text.get("rope_parameters"), dict) else {}
    theta = rope.get("rope_theta")
    if arch in _READS_TOP_LEVEL_ROPE_THETA and text.get("rope_theta") is None and theta not in (None, 10000, 10000.0):
        yield _Hit("model_path", cfg.model_path, (
            f"{arch}: its config.json gives RoPE's base only inside rope_parameters (rope_theta={theta}, as "
            f"transformers 5 saves it); SGLang's Qwen3NextConfig reads the top-level rope_theta, default 10000, and "
            f"would rotate with that; add \"rope_theta\": {json.dumps(theta)} as the published config.json has it"))
    if arch in _READS_TOP_LEVEL_ROPE_THETA:
        yield from _top_level_rope(cfg, arch, text, rope)
    vision = config.get("vision_config")
    if arch in _NEEDS_DEEPSTACK_KEY and isinstance(vision, dict) and "deepstack_visual_indexes" not in vision:
        yield _Hit("model_path", cfg.model_path, (
            f"{arch}: its config.json's vision_config has no deepstack_visual_indexes. SGLang's Qwen3.5 vision config "
            f"then takes Qwen3-VL's deepstack layers [8, 16, 24], which Qwen3.5 does not have (transformers' "
            f'Qwen3.5 writes no such key); add "vision_config.deepstack_visual_indexes": [] as the releases ship it'
        ))
    # The layout rule on the checkpoint's own config.json, before SGLang loads a weight: a config the rule refuses
    # stops here naming its key, also where SGLang's load would stop first on another error (ERNIE-4.5's use_bias:
    # "Parameter 'lm_head.bias' not found"). Under --json-model-override-args the merged config is checked by the
    # scheduler's layout (as for a Hub id not cached yet).
    if getattr(cfg, "json_model_override_args", None) in (None, "", "{}"):
        from sglang_r3.core.layout import LayoutError, layout_from_hf_config

        try:
            layout_from_hf_config(config)
        except LayoutError as e:
            yield _Hit("model_path", cfg.model_path, str(e))


def _top_level_rope(cfg, arch: str, text: dict, rope: dict) -> Rule:
    """SGLang's Qwen3NextConfig rotates with the top-level rope_theta and rope_scaling only (it drops rope_parameters),
    transformers 5 with rope_parameters: a base given both ways apart, or a scaling given only inside
    rope_parameters, would be served with other positions than the checkpoint's."""
    theta = rope.get("rope_theta")
    if text.get("rope_theta") is not None and theta is not None and float(text["rope_theta"]) != float(theta):
        yield _Hit("model_path", cfg.model_path, (
            f"{arch}: its config.json gives RoPE's base twice, rope_theta={text['rope_theta']} at the top level and "
            f"{theta} inside rope_parameters; SGLang's Qwen3NextConfig rotates with the first, transformers with the "
            f"second; give one value"))
    kind = rope.get("rope_type", rope.get("type"))
    if kind not in (None, "default") and not isinstance(text.get("rope_scaling"), dict):
        yield _Hit("model_path", cfg.model_path, (
            f"{arch}: its config.json scales RoPE only inside rope_parameters (rope_type={kind!r}); SGLang's "
            f"Qwen3NextConfig reads the top-level rope_scaling only and would rotate unscaled; add \"rope_scaling\" "
            f"with the same parameters"))


def _required_keys(cfg, arch: str, text: dict, where: str) -> Rule:
    """A key the family's SGLang model reads unconditionally that the checkpoint lacks (``Family.required_keys``:
    transformers' config class neither defines nor saves it): refused naming the key and the value to add, where
    SGLang's scheduler would stop on an AttributeError while building the model."""
    from sglang_r3.core.families import family_of

    family = family_of(arch)
    missing = {k: v for k, v in (family.required_keys if family else {}).items() if k not in text}
    for key, (value, reader) in missing.items():
        yield _Hit("model_path", cfg.model_path, (
            f"{arch}: its config.json has no {where}{key}, which SGLang's model reads unconditionally ({reader}) "
            f"and transformers' config class neither defines nor saves (its scheduler would stop on an "
            f"AttributeError); add \"{where}{key}\": {json.dumps(value)} as the published config.json has it"))


# Architectures whose attention is qwen3_moe.py's Qwen3MoeAttention, whose fused q/k-norm RoPE kernel takes YaRN's
# parameters from compute_yarn_parameters: the factor as max_position_embeddings / original_max_position_embeddings
# whatever rope_parameters says, the attention factor from that. transformers (and SGLang's unfused rotary
# embedding) take the factor given: a Qwen3 YaRN config as its model card writes it (factor 4 over 32768 of 40960
# positions) rotates with 1.25 there, 4 here.
_FUSED_QK_NORM_ROPE_YARN = ("Qwen3MoeForCausalLM", "InternS1ForConditionalGeneration")


def _fused_qk_norm_rope(cfg, names, *, resolved) -> Rule:
    if resolved or not _arg(cfg, "enable_fused_qk_norm_rope", False) or (config := _read_config(cfg)) is None:
        return
    arch = (config.get("architectures") or [""])[0]
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    if arch in _FUSED_QK_NORM_ROPE_YARN and kind == "yarn":
        yield _Hit("enable_fused_qk_norm_rope", None, (
            f"{arch} with YaRN RoPE: SGLang's fused q/k-norm RoPE kernel takes YaRN's factor as "
            f"max_position_embeddings / original_max_position_embeddings (qwen3_moe.py compute_yarn_parameters), "
            f"transformers and SGLang's unfused rotary embedding the factor rope_parameters gives ({rope.get('factor')})"
        ))


def _release_cpu_runtime(cfg, names, *, resolved) -> Rule:
    """A model the served release's own CPU path cannot run, refused before SGLang stops on it (raw pass: the DSA
    stop is in 0.5.15's argument resolution itself)."""
    if resolved or getattr(cfg, "device", None) != "cpu":
        return
    from sglang_r3.seam import release

    stops = release.cpu_runtime_stops()  # by architecture: 0.5.15.post1's DSA and gated delta-net models
    if not stops or (config := _read_config(cfg)) is None:
        return
    arch = (config.get("architectures") or [""])[0]
    if arch in stops:
        yield _Hit("model_path", cfg.model_path, (
            f"{arch}: {stops[arch]}; serve it on a GPU, or on SGLang 0.5.23's CPU runtime"
        ))


def _read_config(cfg) -> Optional[dict]:
    """--model-path's config.json as a dict; None for a Hub id not in the cache yet (SGLang downloads it later; the
    scheduler's layout check still applies) or a file that does not parse (SGLang's own loader says why)."""
    path = _config_json(cfg)
    if path is None:
        return None
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _config_json(cfg) -> Optional[str]:
    """--model-path's config.json: in the folder, or for a Hub id the copy in the Hub cache SGLang loads from
    (``--download-dir`` or huggingface_hub's default). Never fetched here: offline, a fetch retries for ~20 s."""
    model = cfg.model_path or ""
    if os.path.isdir(model):
        path = os.path.join(model, "config.json")
        return path if os.path.isfile(path) else None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json", cache_dir=getattr(cfg, "download_dir", None),
                                        revision=getattr(cfg, "revision", None))
    except Exception:  # not a Hub id (huggingface_hub validates it): SGLang's own loader says what is wrong
        return None
    return cached if isinstance(cached, str) else None


def _interval_hint(layer_types: Any, where: str) -> str:
    if isinstance(layer_types, list) and layer_types:
        full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
        n = full[0] + 1 if full else 0
        if n and full == [i for i in range(len(layer_types)) if (i + 1) % n == 0]:
            return f'its layer_types are every {n}th layer full attention: add "{where}full_attention_interval": {n}'
        return "its layer_types have no period SGLang can build (full attention every n-th layer)"
    return "add the published full_attention_interval"

