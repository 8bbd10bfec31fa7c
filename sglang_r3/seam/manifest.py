"""Every SGLang name sglang-r3 touches, per served release, in one list checked against the installed SGLang.

A hook that no longer fires is silent, and for R3 that means rows never captured or never checked.
So each target is named here with what we do to it and why, the releases it is touched on, and the shape
we wrote against on each: the parameter names, kinds and defaults of a callable (annotations are left
out: SGLang moves them between strings and objects without changing a call), or the attributes we read
of an SGLang object. ``hooks.register`` refuses a target that is not listed for the installed release or
whose signature differs; ``check`` resolves every entry of a release (``python -m
sglang_r3.tools.manifest_check`` prints the differences). ``tests/test_manifest.py`` fails on any
SGLang name the SGLang side (``serving/adapter/``, ``serving/refusals/``, ``seam/``, ``cpu_runtime/``) imports, names, hooks or reads that is not listed here.

Kinds: ``hook`` (SGLang's HookRegistry: around / before / after / replace), ``instance`` (we
replace a method on one live object), ``adds`` (we add a method a class lacks; SGLang
defining it stops start-up), ``overrides`` (we define on a class a method it inherits from a base
that raises; the class defining its own stops start-up), ``route`` (we change the app's route list),
``op`` (we add operators to a namespace), ``uses`` (we call or read it; a private name is marked in
``why``), ``reads`` (attributes we read of the class's instances, ``attrs``), ``replaces`` (a Triton kernel,
launched as ``kernel[grid](...)``, that we replace at a module attribute with a stand-in; its signature is the
kernel's Python function's).
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from sglang_r3.seam.versions import SERVED, V0_5_15, V0_5_23, in_force

R15: Tuple[str, ...] = (V0_5_15,)
R23: Tuple[str, ...] = (V0_5_23,)


@dataclass(frozen=True)
class Touch:
    target: str  # dotted path as SGLang's HookRegistry names it
    kind: str
    why: str
    # normalized (see ``signature_of``); one string for every release, or one per release; None: not a
    # callable we call into
    signature: Union[None, str, Mapping[str, str]] = None
    releases: Tuple[str, ...] = SERVED  # the releases this target is touched on
    attrs: Tuple[str, ...] = ()  # kind "reads": the attributes read of its instances
    # False: checked where it is used, not by the launcher's start-up check (hooks.check_uses): its module imports
    # prometheus_client, which the launcher must not import before SGLang sets PROMETHEUS_MULTIPROC_DIR (or our
    # counters in its HTTP process leave /metrics)
    at_start: bool = True

    def signature_on(self, release: str) -> Optional[str]:
        if isinstance(self.signature, Mapping):
            return self.signature[release]
        return self.signature


_MR = "sglang.srt.model_executor.model_runner.ModelRunner"
_INTERNAL_STATE = "sglang.srt.managers.scheduler_components.internal_state"
_SCHED = "sglang.srt.managers.scheduler.Scheduler"
_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
_GRI = "sglang.srt.managers.io_struct.GenerateReqInput"
_EAGLE = "sglang.srt.speculative.eagle_worker_v2"
_MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
_SA = "sglang.srt.server_args.ServerArgs"
_TNA_MODULE = "sglang.srt.layers.attention.torch_native_backend"
_TNA = f"{_TNA_MODULE}.TorchNativeAttnBackend"
_RC = "sglang.srt.runtime_context"
_DP = "sglang.srt.layers.dp_attention"
_TOPK = "sglang.srt.layers.moe.topk"
_FWD = "sglang.srt.model_executor.forward_batch_info"

_PD_PREFILL = "sglang.srt.disaggregation.prefill"
_PD_DECODE = "sglang.srt.disaggregation.decode"
_RETRACTION_BACKUP = "(req, tree_cache, req_to_token_pool, token_to_kv_pool_allocator, backend)"
_RETRACTION_COPY = "(self, req_to_token_pool, token_to_kv_pool_allocator)"
_SETUP_STATE_KV_ARGS = ("(kv_args, token_to_kv_pool, draft_token_to_kv_pool=None, total_kv_layers=None, "
                        "req_to_token_pool=None)")

_FORWARD_GENERATION = {V0_5_15: "(self, batch, on_publish=None)",
                       V0_5_23: "(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None)"}

MANIFEST: Tuple[Touch, ...] = (
    # -- capture (adapter/capture_site.py) ---------------------------------------------------------------
    Touch(f"{_MR}.init_routed_experts_capturer", "hook:around",
          "install our capturer (layout, staging sized from the limits) instead of upstream's", "(self)"),
    Touch(f"{_TOPK}.capture_routed_experts_if_allowed", "hook:replace",
          "the single capture site: main routers to RoutingCapturer, draft routers to DraftCapturer "
          "(0.5.15 hands it the fused shared-expert columns too, after the routed ones)",
          "(topk_config, layer_id, topk_ids)"),
    Touch("sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
          "._maybe_collect_routed_experts", "hook:around",
          "per-request gather at finish: rows and marks of req_to_token[start:T-1], missing rows refused",
          "(self, req)"),
    Touch(f"{_INTERNAL_STATE}.SchedulerInternalStateController.get_internal_state", "hook:after",
          "capture counters (and requests held) for /routing/stats", "(self, recv_req)", R23),
    Touch(f"{_INTERNAL_STATE}.SchedulerInternalStateController._update_handlers", "hook:after",
          "private: adds the sglang_r3_capture knob to /set_internal_state", "(self)", R23),
    Touch(f"{_INTERNAL_STATE}._UpdateHandler", "uses", "private: the handler type _update_handlers returns",
          "(validate, apply)", R23),
    Touch(f"{_INTERNAL_STATE}.UpdateRejected", "uses", "a knob value /set_internal_state refuses", None, R23),
    Touch(f"{_SCHED}.get_internal_state", "hook:after",
          "capture counters (and requests held) for /routing/stats", "(self, recv_req)", R15),
    Touch(f"{_SCHED}.set_internal_state", "hook:around",
          "the sglang_r3_capture knob, taken out before SGLang's hard-coded allow-list sees the request",
          "(self, recv_req)", R15),

    Touch(f"{_MEMORY_POOL}.MHATokenToKVPool.move_kv_cache", "instance",
          "tree drafting moves accepted KV; the wrapper on the live pool (of whichever KV pool class, all "
          "share this method's shape) moves rows and marks with it",
          "(self, tgt_loc, src_loc)"),
    Touch("sglang.srt.state_capturer.routed_experts.set_global_experts_capturer", "uses",
          "the capturer SGLang's forward ends call", "(capturer)"),
    Touch("sglang.srt.state_capturer.routed_experts.get_global_experts_capturer", "uses",
          "upstream's capturer where ours is not installed (0.5.15: where ours is held too)", "()"),
    Touch(f"{_TOPK}.TopK", "reads", "every router of the served model: its layer and its config",
          attrs=("layer_id", "topk_config")),
    Touch(f"{_TOPK}.TopKConfig", "reads", "a router's top-k, capture permission and output format",
          attrs=("top_k", "allow_routed_experts_capture", "output_format", "num_shared_topk_slots"), releases=R23),
    Touch(f"{_TOPK}.TopKConfig", "reads", "a router's top-k, capture permission, output format and fused "
          "shared-expert columns", attrs=("top_k", "allow_routed_experts_capture", "output_format",
                                         "num_fused_shared_experts"), releases=R15),
    Touch(f"{_TOPK}.TopKOutputFormat", "uses", "STANDARD: the output format that passes the capture site",
          attrs=("STANDARD",)),
    Touch("sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE", "reads", "each MoE layer's expert count",
          attrs=("layer_id", "num_experts", "num_fused_shared_experts")),
    Touch(_MR, "reads", "what the capturer is sized from and installed on",
          attrs=("is_draft_worker", "model", "model_config", "device", "token_to_kv_pool", "max_running_requests",
                 "kv_index_translator", "max_token_pool_size", "draft_model_idx", "forward"), releases=R23),
    Touch(_MR, "reads", "what the capturer is sized from and installed on",
          attrs=("is_draft_worker", "model", "model_config", "device", "token_to_kv_pool", "max_running_requests",
                 "max_token_pool_size", "max_total_num_tokens", "page_size", "server_args", "draft_model_idx",
                 "forward"), releases=R15),
    Touch(_MR, "reads", "start-up, CPU only: whether a model has linear-attention layers (SGLang's own test; a "
          "property evaluated on a bare runner given model_config, is_draft_worker and its registry cache)",
          attrs=("mambaish_config",), releases=R15),
    Touch("sglang.srt.model_executor.model_runner", "reads", "the unset marker of the runner's registry cache",
          attrs=("_UNSET",), releases=R15),
    Touch("sglang.srt.configs.hybrid_arch.mambaish_config", "uses",
          "start-up, CPU only: whether a model has linear-attention layers (SGLang's own test: it picks the hybrid "
          "attention backend by it)", "(model_config)", R23),
    Touch("sglang.srt.managers.schedule_batch.Req", "reads", "a finished request's tokens and its KV row; a PD "
          "decode engine's retracted request's tokens (seqlen: its KV backup's length)",
          attrs=("rid", "return_routed_experts", "origin_input_ids", "output_ids_through_stop", "routed_experts_start_len",
                 "routed_experts", "kv", "sampling_params", "finished", "multimodal_inputs", "seqlen"), releases=R23),
    Touch("sglang.srt.managers.schedule_batch.Req", "reads", "a finished request's tokens and its KV row; a PD "
          "decode engine's retracted request's tokens (seqlen: its KV backup's length)",
          attrs=("rid", "return_routed_experts", "origin_input_ids", "output_ids_through_stop", "routed_experts_start_len",
                 "routed_experts", "req_pool_idx", "sampling_params", "finished", "multimodal_inputs", "seqlen"),
          releases=R15),
    Touch("sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor", "reads",
          "the request-to-token table at collect", attrs=("req_to_token_pool",), releases=R23),
    Touch(_SCHED, "reads", "requests held, for /routing/stats", attrs=("running_batch", "waiting_queue")),
    Touch(f"{_INTERNAL_STATE}.SchedulerInternalStateController", "reads", "the scheduler it answers for", attrs=("scheduler",),
          releases=R23),
    Touch("sglang.srt.managers.io_struct.GetInternalStateReqOutput", "reads", "where /routing/stats' counters go",
          attrs=("internal_state",)),
    Touch("sglang.srt.managers.io_struct.SetInternalStateReqOutput", "reads", "whether SGLang applied the rest",
          attrs=("updated",), releases=R15),
    Touch(f"{_RC}.cutedsl_moe_max_num_tokens", "uses", "the CuteDSL MoE token bound (the staging size)", "()", R23),
    Touch(f"{_RC}.get_resources", "uses", "the scheduler's experts capturer (read per router call)", "()", R23),
    Touch(f"{_RC}.Resources", "reads", "the scheduler's experts capturer", attrs=("experts_capturer",), releases=R23),
    Touch(f"{_RC}.get_server_args", "uses",
          "this process's resolved server args: the capture switch, the forward limits, the metrics switch", "()"),
    Touch("sglang.srt.mem_cache.kv_index_translator.KVIndexTranslator", "reads",
          "how many KV slot ids out_cache_loc can hold (the host buffer's rows)", attrs=("capture_token_capacity",),
          releases=R23),
    Touch("sglang.srt.layers.moe.utils.get_moe_runner_backend", "uses",
          "0.5.15 picks a router's output format per forward from it: an in-kernel one skips capture", "()", R15),
    Touch("sglang.srt.layers.moe.utils.MoeRunnerBackend", "reads", "which runner backends route inside the kernel",
          attrs=("is_triton_kernels", "is_experimental_sgl_trtllm", "is_flashinfer_trtllm",
                 "is_flashinfer_mxfp4"), releases=R15),
    Touch(f"{_SA}.cutedsl_moe_max_num_tokens", "uses", "the CuteDSL MoE token bound (the staging size)",
          "(self)", R15),
    # -- DP attention / DeepEP (adapter/dp_rows.py) ----------------------------------------------------
    Touch(f"{_DP}.is_dp_attention_enabled", "uses", "whether MoE layers route the DP-gathered batch", "()"),
    Touch(f"{_DP}.get_dp_global_num_tokens", "uses",
          "the per-rank token counts (as padded for the gather) of the forward being routed", "()"),
    Touch(f"{_DP}.get_global_dp_buffer_len", "uses",
          "the gathered batch's length: a router that routed another count files nothing", "()"),
    Touch(f"{_DP}.dp_slot_in", "uses", "this rank's slot in the gather", "(per_rank)", R23),
    Touch(f"{_DP}.attn_tp_all_gather_into_tensor", "uses",
          "DeepEP: each router's share of the local batch gathered across attention-TP ranks, as upstream",
          "(output, input)"),
    Touch("sglang.srt.layers.moe.get_moe_a2a_backend", "uses", "DeepEP scatters tokens across attention-TP ranks",
          "()"),
    Touch("sglang.srt.layers.moe.utils.MoeA2ABackend", "reads", "which all-to-all backend scatters tokens",
          attrs=("is_deepep", "is_deepep_v2"), releases=R23),
    Touch("sglang.srt.layers.moe.utils.MoeA2ABackend", "reads", "which all-to-all backend scatters tokens",
          attrs=("is_deepep",), releases=R15),
    Touch(f"{_RC}.get_parallel", "uses", "the attention-TP width; this rank's attention-DP rank (/routing/stats' dp_rank; 0.5.15: its DP slot too)", "()"),
    Touch(f"{_RC}.ParallelContext", "reads", "attention parallel widths and ranks",
          attrs=("attn_tp_size", "attn_dp_rank")),
    # -- draft (adapter/draft_site.py) -----------------------------------------------------------------
    Touch(f"{_EAGLE}.EagleDraftWorker.draft", "hook:around",
          "draft guard and step numbering around every draft forward",
          {V0_5_15: "(self, batch)", V0_5_23: "(self, batch, kw:with_topology=False)"}),
    Touch(f"{_EAGLE}.EAGLEWorkerV2.forward_batch_generation", "hook:after",
          "accept lengths after the verify: draft entries marked accepted or rejected", _FORWARD_GENERATION),
    Touch("sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleWorkerV2.forward_batch_generation",
          "hook:around",
          "multi-layer MTP: the verify's accept lengths resolve the drafts filed before it (its own draft-extend "
          "files the next round's); a prefill chunk drops its requests' unverified drafts", _FORWARD_GENERATION),
    Touch(f"{_MEMORY_POOL}.ReqToTokenPool.free_rows", "hook:after",
          "draft entries of a freed request row are dropped", "(self, indices)", R23),
    Touch(f"{_MEMORY_POOL}.ReqToTokenPool.free", "hook:before",
          "draft entries of a freed request row are dropped (before it clears req.req_pool_idx)", "(self, req)", R15),
    Touch(f"{_MEMORY_POOL}.ReqToTokenPool.alloc", "hook:after",
          "a new request row starts with no draft entries and its MTP wish", "(self, reqs)"),
    Touch(f"{_MEMORY_POOL}.ReqToTokenPool", "reads", "the request-to-token table", attrs=("req_to_token",)),
    Touch(f"{_MR}.forward", "instance",
          "the draft runner's forward (each multi-layer MTP runner's too) is wrapped in the draft guard (main "
          "writes from it raise) and files its draft routing",
          "(self, forward_batch, skip_attn_backend_init=None, pp_proxy_tensors=None, "
          "reinit_attn_backend=False, split_forward_count=1)"),
    Touch(f"{_FWD}.ForwardBatch", "reads", "a forward's requests, tokens and mode (draft filing, CPU attention; "
          "Gemma-4's image spans on the CPU runtime)",
          attrs=("forward_mode", "batch_size", "req_pool_indices", "extend_seq_lens", "extend_seq_lens_cpu",
                 "extend_prefix_lens", "extend_prefix_lens_cpu", "positions", "input_ids", "spec_info",
                 "out_cache_loc", "seq_lens", "_original_batch_size", "extend_logprob_start_lens_cpu", "mm_inputs")),
    Touch(f"{_FWD}.ForwardMode", "reads", "what kind of forward runs",
          attrs=("is_idle", "is_decode", "is_extend", "is_target_verify", "is_draft_extend_v2")),
    Touch("sglang.srt.managers.schedule_batch.ScheduleBatch", "reads", "the batch a speculative worker runs",
          attrs=("forward_mode", "is_extend_in_batch", "req_pool_indices", "reqs")),
    Touch("sglang.srt.speculative.eagle_info.EagleDraftExtendInput", "reads",
          "how many drafted tokens a request's verify accepted (and the boundary-KV front rows)",
          attrs=("num_accept_tokens", "num_front_tokens"), releases=R23),
    Touch("sglang.srt.speculative.eagle_info.EagleDraftExtendInput", "reads",
          "how many drafted tokens a request's verify accepted (and, CPU only, the draft extend's fixed width per "
          "request, which DP-attention padding gives its dummy requests)",
          attrs=("num_accept_tokens", "num_tokens_per_req"), releases=R15),
    Touch(f"{_MR}Output", "reads",
          "whether the forward replayed a CUDA graph", attrs=("can_run_graph",)),
    Touch("sglang.srt.managers.utils.GenerationBatchResult", "reads", "the verify's accept lengths",
          attrs=("accept_lens",)),
    # -- requests and responses (refusals/input_guard.py, adapter/outputs.py) -----------------------
    Touch(f"{_TM}._validate_one_request", "hook:around",
          "private: hostile input becomes a 400 naming the field instead of killing the scheduler",
          "(self, obj, input_ids)"),
    Touch(f"{_GRI}.normalize_batch_and_arguments", "hook:around",
          "a batch's sampling_params object is checked once", "(self)"),
    Touch(f"{_GRI}.__getitem__", "hook:around", "a batch item keeps its index for error messages", "(self, i)"),
    Touch(f"{_TM}._stream_one_response", "hook:around",
          "private: every output leaves here; ours gets the payload, others upstream's routed_experts",
          "(self, obj, state, request=None)", R23),
    Touch(f"{_TM}._wait_one_response", "hook:around",
          "private: every output leaves this generator; ours gets the payload, others upstream's routed_experts",
          "(self, obj, request=None)", R15),
    *(Touch(f"{_TM}.{m}", "hook:around",
            "0.5.15 stamps outputs with one weight version: the updates applied while a request ran tell a "
            "request that spanned one (its record says mixed:)", "(self, obj, request=None)", R15)
      for m in ("update_weights_from_disk", "update_weights_from_distributed", "update_weights_from_tensor",
                "update_weights_from_ipc")),
    Touch(_TM, "reads", "the served model and tokenizer (layout, vocabulary)",
          attrs=("model_config", "tokenizer", "server_args")),
    Touch("sglang.srt.sampling.sampling_params.SamplingParams", "uses",
          "the sampling fields a request may set (checked before the scheduler sees them)"),
    Touch("sglang.srt.sampling.sampling_params.MAX_STOP_REGEX_LEN", "uses",
          "SGLang's own bound on a stop regex (0.5.15 has none)", None, R23),
    Touch("sglang.srt.managers.io_struct.SessionParams", "uses", "a request's session fields, checked as SGLang reads them"),
    Touch("sglang.srt.managers.embed_types.PositionalEmbeds", "uses", "in-process embeddings are not JSON"),
    # -- launch (adapter/opt_in.py, refusals/startup.py) ----------------------------------------------
    Touch(f"{_SA}.resolve_once", "hook:around",
          "start-up refusals on SGLang's own resolved ServerArgs (opt-in launches)", "(self)", R23),
    Touch(f"{_SA}.__post_init__", "hook:around",
          "start-up refusals on SGLang's own resolved ServerArgs (opt-in launches): 0.5.15 resolves here", "(self)",
          R15),
    Touch(f"{_SA}.check_server_args", "hook:before",
          "start-up refusals before SGLang's own checks", "(self)"),
    Touch(f"{_SA}.add_cli_args", "uses", "SGLang's own flag spellings, to name refused flags as typed", "(parser)"),
    Touch(f"{_SA}.get_model_config", "uses", "the model config SGLang resolves (0.5.15)", "(self)", R15),
    Touch(_SA, "reads", "the flags start-up checks read",
          attrs=("enable_eplb", "init_expert_location", "ep_num_redundant_experts", "dwdp_size", "pp_size", "attn_cp_size", "enable_prefill_cp", "dcp_size", "tp_size", "ep_size",
                 "dp_size", "moe_a2a_backend", "speculative_moe_a2a_backend", "moe_runner_backend",
                 "enable_two_batch_overlap", "enable_hierarchical_cache", "hicache_storage_backend", "enable_lmcache",
                 "enable_flexkv", "radix_cache_backend", "enable_unified_cache_external_linker", "enable_hisparse",
                 "disaggregation_decode_enable_offload_kvcache", "disaggregation_mode", "enable_pdmux",
                 "decoupled_spec_role", "speculative_algorithm", "enable_multi_layer_eagle", "speculative_eagle_topk",
                 "speculative_num_steps", "device", "disable_cuda_graph", "disable_hybrid_swa_memory", "tokenizer_worker_num",
                 "smg_grpc_mode",
                 "grpc_mode", "grpc_port", "use_ray", "decrypted_config_file", "trust_remote_code",
                 "enable_return_routed_experts", "enable_dp_attention", "enable_metrics", "enable_torch_compile", "chunked_prefill_size",
                 "max_prefill_tokens", "speculative_num_draft_tokens", "disaggregation_transfer_backend",
                 "kv_cache_dtype", "enable_fused_qk_norm_rope"), releases=R23),
    Touch(_SA, "reads", "the flags start-up checks read (0.5.15 has no DWDP, FlexKV, unified-cache linker, "
          "SMG gRPC or native gRPC port flags)",
          attrs=("enable_eplb", "init_expert_location", "ep_num_redundant_experts", "pp_size", "attn_cp_size", "enable_prefill_cp", "dcp_size", "tp_size", "ep_size", "dp_size",
                 "moe_a2a_backend", "speculative_moe_a2a_backend", "moe_runner_backend", "enable_two_batch_overlap",
                 "enable_hierarchical_cache", "hicache_storage_backend", "enable_lmcache", "radix_cache_backend",
                 "enable_hisparse", "disaggregation_decode_enable_offload_kvcache", "disaggregation_mode",
                 "enable_pdmux", "decoupled_spec_role", "speculative_algorithm", "enable_multi_layer_eagle",
                 "speculative_eagle_topk", "speculative_num_steps", "device", "disable_cuda_graph", "disable_hybrid_swa_memory",
                 "tokenizer_worker_num", "grpc_mode", "use_ray", "decrypted_config_file", "trust_remote_code",
                 "enable_return_routed_experts", "enable_dp_attention", "enable_metrics", "enable_torch_compile", "chunked_prefill_size",
                 "max_prefill_tokens", "speculative_num_draft_tokens", "kv_cache_dtype", "enable_fused_qk_norm_rope"),
          releases=R15),
    Touch("sglang.srt.arg_groups.overrides.resolving_view", "uses",
          "the resolved values of a ServerArgs record (0.5.15 writes them onto the record)", "(server_args)", R23),
    Touch("sglang.srt.arg_groups.model_override_base.model_config_of", "uses",
          "start-up checks read the model config SGLang resolves (multi-layer MTP layout; hybrid-SWA pool on CPU)",
          "(server_args)", R23),
    Touch("sglang.srt.configs.model_config.ModelConfig", "reads", "the resolved model config",
          attrs=("hf_config", "is_hybrid_swa", "model_path", "revision", "model_override_args", "model_config_parser",
                 "context_len", "hf_text_config", "head_dim", "swa_head_dim", "get_num_kv_heads",
                 "get_swa_num_kv_heads")),
    Touch(f"{_RC}.attn_tp_size_of", "uses", "the attention-TP width a configuration resolves to", "(cfg)", R23),
    Touch("sglang.srt.environ.envs", "reads", "environment switches start-up checks read",
          attrs=("SGLANG_RUST_SERVER", "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH"), releases=R23),
    Touch("sglang.srt.speculative.spec_info.SpeculativeAlgorithm", "reads",
          "an out-of-tree platform's own speculative worker", attrs=("from_string", "get_platform_worker_cls"),
          releases=R23),
    Touch("sglang.srt.server_args.prepare_server_args", "uses", "our launcher resolves argv as SGLang's does",
          "(argv)"),
    # -- starting SGLang (adapter/api.py for launch_server.py, engine.py) ---------------------------------
    Touch("sglang.srt.plugins.load_plugins", "uses", "our launcher loads plugins before resolving argv", "()"),
    Touch("sglang.launch_server.run_server", "hook:around",
          "our launcher runs SGLang's own server; under the opt-in (`sglang serve`) it marks an HTTP launch, whose "
          "refusals exit instead of raising", "(server_args)"),
    Touch("sglang.srt.entrypoints.engine.Engine._launch_subprocesses", "hook:around",
          "under the opt-in: marks an in-process sglang.Engine launch (unless an HTTP launch runs it), whose "
          "refusals raise to the caller",
          {V0_5_15: "(server_args, init_tokenizer_manager_func, run_scheduler_process_func, "
                    "run_detokenizer_process_func, port_args=None)",
           V0_5_23: "(server_args, init_tokenizer_manager_func, run_scheduler_process_func, "
                    "run_detokenizer_process_func, port_args=None, placement_group=None)"}),
    Touch("sglang.srt.entrypoints.engine.Engine.__init__", "hook:around",
          "under the opt-in: marks an in-process sglang.Engine launch before 0.5.15 resolves its ServerArgs "
          "(in __init__, before _launch_subprocesses)", "(self, **kwargs)", R15),
    Touch("sglang.srt.utils.kill_process_tree", "uses", "clean-up after the server returns, as SGLang's launcher",
          {V0_5_15: "(parent_pid, include_parent=True, skip_pid=None, wait_timeout=None)",
           V0_5_23: "(parent_pid, include_parent=True, skip_pid=None, wait_timeout=60)"}),
    Touch("sglang.srt.entrypoints.engine.Engine", "uses", "sglang_r3.serving.engine.Engine builds SGLang's in-process engine",
          "(**kwargs)"),
    Touch("sglang.srt.plugins.hook_registry.HookRegistry", "uses",
          "registers every hook; its private _patched set tells which were applied",
          attrs=("register", "apply_hooks", "_patched")),
    Touch("sglang.srt.plugins.hook_registry.HookType", "uses", "around / before / after / replace",
          attrs=("AROUND",)),
    Touch("sglang.srt.plugins.hook_registry._current_plugin_source", "uses",
          "private: whether hooks are being collected inside load_plugins (apply now or later)"),
    # -- HTTP (adapter/http.py; adapter/api.py for server/) -----------------------------------------------
    Touch("sglang.srt.entrypoints.http_server.app", "route",
          "our /generate takes the place of SGLang's in the app's route list; /routing/* added"),
    Touch("sglang.srt.entrypoints.http_server.get_global_state", "uses", "the TokenizerManager of the app", "()"),
    Touch("sglang.srt.entrypoints.http_server._create_error_response", "uses",
          "private: SGLang's own error body for a failed /generate", "(e)"),
    Touch("sglang.srt.entrypoints.api_contract.generate_contract_error", "uses",
          "SGLang's /generate body contract, applied before ours (0.5.15 has none beyond its dataclass)", "(body)",
          R23),
    Touch("sglang.srt.utils.auth.auth_level", "uses", "admin auth for /routing/capture", "(level)"),
    Touch("sglang.srt.utils.auth.AuthLevel", "uses", "ADMIN_OPTIONAL: the level of /routing/capture",
          attrs=("ADMIN_OPTIONAL",)),
    Touch("sglang.srt.managers.io_struct.GenerateReqInput", "uses", "our /generate builds SGLang's request object; "
          "the input guard reads its fields",
          attrs=("contains_mm_input", "input_embeds", "logprob_start_len", "priority", "return_logprob",
                 "session_params", "top_logprobs_num", "sampling_params", "input_ids", "routed_experts_start_len",
                 "batch_size")),
    Touch("sglang.srt.managers.io_struct.SetInternalStateReq", "uses", "POST /routing/capture sets the capture knob"),
    Touch("sglang.srt.utils.json_response.orjson_response", "uses", "JSON responses as SGLang writes them"),
    Touch("sglang.srt.utils.json_response.dumps_json", "uses", "stream frames as SGLang writes them"),
    Touch("sglang.srt.utils.hf_transformers.config.get_config", "uses",
          "the config object SGLang's loader resolved (the layout is built from it)",
          "(model, trust_remote_code, revision=None, model_override_args=None, model_config_parser='auto', **kwargs)"),
    # -- PD disaggregation (adapter/pd_rows.py) -------------------------------------------------------------
    Touch(f"{_PD_PREFILL}.setup_state_kv_args", "hook:after",
          "the prefill engine's capture rows and marks become one more state component of its KV transfer; on the "
          "CPU runtime (0.5.23), its Mooncake sender set to its host page-id path then (cpu_runtime/platform/disaggregation.py)",
          _SETUP_STATE_KV_ARGS),
    Touch(f"{_PD_DECODE}.setup_state_kv_args", "hook:after",
          "the decode engine's capture rows and marks receive the prefill engine's, page for page with the KV",
          _SETUP_STATE_KV_ARGS),
    Touch(f"{_PD_DECODE}.DecodeReqToTokenPool.alloc", "hook:after",
          "a decode engine's request row starts with no draft entries and its MTP wish", "(self, reqs)"),
    Touch(f"{_PD_DECODE}.DecodeReqToTokenPool.free", "hook:before",
          "draft entries of a decode engine's freed request row are dropped", "(self, req)"),
    Touch(f"{_PD_DECODE}.DecodePreallocQueue._pre_alloc", "hook:after",
          "private: the KV slots a decode engine allocates for a request start unmarked (the prefill engine's marks "
          "arrive with its rows)", "(self, req, prefix_indices=None, prefix_len=None, total_prefix_len=None)"),
    Touch(f"{_PD_PREFILL}.SchedulerDisaggregationPrefillMixin.send_kv_chunk", "hook:before",
          "before a request's last chunk is sent, the prefill engine writes its prompt's MTP draft entries and marks "
          "at the prompt's KV slots (they travel with the rows)", "(self, req, last_chunk=False, end_idx=None)"),
    Touch(f"{_PD_DECODE}.DecodeTransferQueue._commit_transfer_to_req", "hook:after",
          "private: once a request's transfer is committed, the decode engine files the prompt's MTP draft entries "
          "that arrived, or notes why its MTP section would be short", "(self, decode_req)"),
    Touch(f"{_PD_DECODE}.DecodeTransferQueue", "reads", "the decode scheduler (its request-to-token table)",
          attrs=("scheduler",)),
    Touch(f"{_PD_DECODE}.DecodeRequest", "reads", "the request a committed transfer belongs to, and its metadata slot "
          "(the prefill engine's weight version)", attrs=("req", "metadata_buffer_index")),
    Touch(f"{_RC}.get_serving", "uses", "the weight version this scheduler serves (a PD request's prefill engine's "
          "and decode engine's; release.served_weight_version)", "()", R23),
    Touch("sglang.srt.utils.weight_versions.WeightVersionEvent", "uses",
          "a PD request whose prefill engine served another weight version: that version, for its first output token",
          attrs=("old_version", "num_output_tokens"), releases=R23),
    Touch("sglang.srt.managers.schedule_batch.Req", "reads", "a PD request's metadata slot (the prefill engine's "
          "weight version rides in its metadata row)", attrs=("metadata_buffer_index",)),
    Touch("sglang.srt.managers.schedule_batch.Req", "reads", "a PD decode engine's request's weight version events "
          "(its prefill engine's other version is filed there)", attrs=("weight_version_events",), releases=R23),
    Touch("sglang.srt.managers.schedule_batch.Req", "reads", "the weight version a PD engine's TokenizerManager "
          "stamped into the request's sampling params (0.5.15's scheduler holds none)", attrs=("sampling_params",),
          releases=R15),
    Touch("sglang.srt.sampling.sampling_params.SamplingParams", "reads", "a PD request's custom_params carry the weight "
          "version its engine serves (release.WEIGHT_VERSION_STAMP; SGLang hands them to the scheduler as they are)",
          attrs=("custom_params",), releases=R15),
    Touch(f"{_TM}._create_tokenized_object", "hook:after",
          "a PD engine stamps the request it sends its scheduler with the weight version it serves now (0.5.15's "
          "scheduler knows only the start-up --weight-version)",
          "(self, obj, input_text, input_ids, input_embeds=None, mm_inputs=None, token_type_ids=None)", R15),
    Touch(_SA, "reads", "whether a TokenizerManager serves a PD engine, and the weight version it serves now",
          attrs=("disaggregation_mode", "weight_version"), releases=R15),
    Touch("sglang.srt.disaggregation.utils.MetadataBuffers", "reads", "the first output token's metadata row (int32 "
          "[size, 16]; SGLang reads only [0]): its 15 spare ints carry the prefill engine's weight version",
          attrs=("output_ids",)),
    Touch(_SCHED, "reads", "the prefill engine's metadata buffers (the row its weight version rides in)",
          attrs=("disagg_metadata_buffers",)),
    Touch(f"{_PD_DECODE}.DecodeTransferQueue", "reads", "the decode engine's metadata buffers (the prefill engine's "
          "weight version arrives there)", attrs=("metadata_buffers",)),
    Touch(_SCHED, "reads", "the prefill engine's request-to-token table (a request's prompt slots)",
          attrs=("req_to_token_pool",)),
    Touch("sglang.srt.managers.schedule_batch.backup_kv_cache", "hook:before",
          "a decode engine's retracted request keeps its rows and marks with its KV backup",
          _RETRACTION_BACKUP, R23),
    Touch(f"{_PD_DECODE}.restore_kv_cache", "hook:after",
          "a resumed request's rows and marks go to the new slots its KV is restored into", _RETRACTION_BACKUP, R23),
    Touch("sglang.srt.managers.schedule_batch.Req.offload_kv_cache", "hook:before",
          "a decode engine's retracted request keeps its rows and marks with its KV's CPU copy",
          _RETRACTION_COPY, R15),
    Touch("sglang.srt.managers.schedule_batch.Req.load_kv_cache", "hook:after",
          "a resumed request's rows and marks go to the new slots its KV's CPU copy is loaded into",
          _RETRACTION_COPY, R15),
    Touch("sglang.srt.disaggregation.utils.append_state_component", "uses",
          "registers the rows and marks as a state component (one item per KV page)",
          {V0_5_23: "(kv_args, state_type, data_ptrs, data_lens, item_lens, dim_per_tensor=None, "
                    "conv_shard_groups=None, slice_outer_counts=None, layer_ids=None)",
           V0_5_15: "(kv_args, state_type, data_ptrs, data_lens, item_lens, dim_per_tensor=None)"}),
    Touch("sglang.srt.disaggregation.base.conn.StateType", "uses",
          "BLOCK_SCALE: the state type whose payload is the request's full KV page ids, the rows' carrier "
          "(release.pd_rows_carrier)", attrs=("BLOCK_SCALE",), releases=R23),
    Touch("sglang.srt.disaggregation.base.conn.StateType", "uses",
          "MINIMAX_INDEX_K: the state type whose payload is the request's full KV page ids, sent flat, the rows' "
          "carrier (release.pd_rows_carrier)", attrs=("MINIMAX_INDEX_K",), releases=R15),
    Touch("sglang.srt.disaggregation.base.conn.KVArgs", "reads", "the state components set up so far; the KV's "
          "item sizes (logged beside the rows')", attrs=("state_types", "state_data_ptrs", "kv_item_lens")),
    Touch("sglang.srt.disaggregation.base.conn.KVArgs", "reads", "the metadata (aux) buffers, one more appended: the "
          "prefill engine's weight version per request", attrs=("aux_data_ptrs", "aux_data_lens", "aux_item_lens"),
          releases=R23),
    Touch(f"{_MEMORY_POOL}.KVCache", "reads", "the KV page size (one transfer item per page)", attrs=("page_size",)),
    # -- CPU runtime (cpu_runtime/) -------------------------------------------------------------------------
    Touch("sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender", "reads",
          "CPU only: set to False, so the prefill engine hands the sender its page ids as numpy (kv_to_page_indices), "
          "not a pinned copy waited on with a torch.cuda.Event (cpu_runtime/platform/disaggregation.py)",
          attrs=("supports_host_tensor_indices",), releases=R23, at_start=False),
    Touch(f"{_TNA}.forward_extend", "hook:around",
          "TARGET_VERIFY / DRAFT_EXTEND on the torch_native backend, and gpt-oss's attention sinks (CPU only)",
          "(self, q, k, v, layer, forward_batch, save_kv_cache=True)"),
    Touch(f"{_TNA}.forward_decode", "hook:around", "draft decode on the torch_native backend, and gpt-oss's attention sinks (CPU only)",
          "(self, q, k, v, layer, forward_batch, save_kv_cache=True)"),
    Touch(_TNA, "reads", "the torch_native backend's pools and SDPA helpers (CPU only)",
          attrs=("token_to_kv_pool", "req_to_token_pool", "swa_out_cache_loc", "_run_sdpa_forward_decode",
                 "init_forward_metadata")),
    Touch("sglang.srt.layers.radix_attention.RadixAttention", "reads", "an attention layer's heads and scaling",
          attrs=("tp_q_head_num", "tp_k_head_num", "tp_v_head_num", "qk_head_dim", "v_head_dim", "layer_id",
                 "scaling", "sliding_window_size", "is_cross_attention")),
    Touch(f"{_MEMORY_POOL}.KVWriteLoc", "uses", "where the CPU verify writes K/V (full and SWA slots)"),
    Touch(f"{_MEMORY_POOL}.MHATokenToKVPool", "reads", "K/V buffers the CPU verify reads and writes",
          attrs=("get_key_buffer", "get_value_buffer", "set_kv_buffer")),
    Touch(f"{_MEMORY_POOL}.MLATokenToKVPool", "reads", "the latent width (MLA prefill on CPU)", attrs=("kv_lora_rank",)),
    Touch("sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend", "hook:around",
          "private: the draft attention backend on CPU",
          {V0_5_15: "(self, backend_name, backend_map, error_template)",
           V0_5_23: "(self, backend_name, backend_map, error_template, stamps_children=False)"}),
    Touch("sglang.srt.speculative.draft_utils.DraftBackendFactory", "reads", "the draft runner and its shape",
          attrs=("draft_model_runner", "topk", "speculative_num_steps")),
    Touch("sglang.srt.speculative.eagle_info.EagleVerifyInput", "reads", "the drafted tree a CPU verify attends over",
          attrs=("tree_topk", "custom_mask")),
    Touch("sglang.srt.distributed.parallel_state.init_model_parallel_group", "hook:around",
          "CPU only: process groups without pynccl (it refuses a CPU device), so TP / DP attention run on gloo",
          {V0_5_15: "(group_ranks, local_rank, backend, use_pynccl=None, use_custom_allreduce=None, "
                    "use_message_queue_broadcaster=False, group_name=None, use_mscclpp_allreduce=None, "
                    "use_torch_symm_mem_allreduce=None, recovered_rank=False)",
           V0_5_23: "(group_ranks, local_rank, backend, use_pynccl=None, use_custom_allreduce=None, "
                    "use_message_queue_broadcaster=False, group_name=None, use_mscclpp=None, "
                    "use_torch_symm_mem_allreduce=None, recovered_rank=False, rank_offset=0, max_world_size=None)"}),
    Touch("sglang.srt.models.llama4.Llama4Attention.forward", "hook:around",
          "CPU only: Llama 4 attention with RoPE's returned q/k and a float32 QK norm (its non-CUDA branch drops "
          "the rotation, which CUDA applies in place, and casts q/k to bfloat16)",
          "(self, positions, hidden_states, forward_batch)"),
    Touch("sglang.srt.models.llama4.Llama4Attention", "reads", "the attention's projections and norms (CPU only)",
          attrs=("qkv_proj", "q_size", "kv_size", "rotary_emb", "qk_norm", "head_dim", "use_rope",
                 "attn_temperature_tuning", "_get_attn_scale", "attn", "o_proj")),
    Touch("sglang.srt.layers.moe.fused_moe_native.moe_forward_native", "hook:around",
          "CPU only: top-1 experts that weigh their input (Llama 4's apply_router_weight_on_input), which it refuses; "
          "and, with --ep-size N, another rank's experts (id -1) contributing zero, as the CUDA kernel (it scatters "
          "the -1 ids); and Nemotron-H's non-gated ReLU^2 experts, which it refuses (cpu_runtime/families/nemotron_h.py); and "
          "Step-3.5's SiLU experts with a swiglu clamp (gemm1_clamp_limit), which it drops (cpu_runtime/families/step3p5.py)",
          "(layer, x, topk_output, moe_runner_config)"),
    Touch("sglang.srt.layers.moe.moe_runner.base.MoeRunnerConfig", "reads",
          "whether experts weigh their input; their activation, gating, routed scaling factor and SwiGLU clamp "
          "(CPU only)",
          attrs=("apply_router_weight_on_input", "activation", "is_gated", "routed_scaling_factor", "gemm1_alpha",
                 "gemm1_clamp_limit")),
    Touch(f"{_TOPK}.StandardTopKOutput", "reads", "the router weights and expert ids handed to the experts",
          attrs=("topk_weights", "topk_ids", "_replace")),
    Touch("sglang.srt.layers.layernorm.RMSNorm", "reads", "Llama 4's q/k norm epsilon", attrs=("variance_epsilon",)),
    Touch(f"{_TNA}.get_cpu_graph_seq_len_fill_value", "adds",
          "CPU only: the padded-row sequence length DP-attention padding asks for (1, as Intel AMX's); "
          "start-up stops if SGLang defines it itself", None, R23),
    Touch(f"{_TNA}.get_cuda_graph_seq_len_fill_value", "overrides",
          "CPU only: 0.5.15's DP-attention padding asks every backend for it, and torch_native inherits the base "
          "class's NotImplementedError; 1, as Intel AMX's CPU value", None, R15),
    Touch(f"{_FWD}.ForwardBatch.prepare_mlp_sync_batch", "hook:around",
          "CPU only: 0.5.15 builds the gathered token counts with pin_memory=True, which needs a CUDA driver; "
          "on the CPU runtime the same tensor unpinned", "(self, model_runner)", R15),
    Touch(f"{_FWD}.ForwardBatch._pad_inputs_to_size", "hook:around",
          "CPU only: 0.5.15 pads a draft extend's dummy requests with extend length 0 and no prefix length (the "
          "torch_native per-request loop then stops); as 0.5.23 pads them: the fixed per-request width, prefix 0",
          "(self, model_runner, num_tokens, bs)", R15),
    Touch(f"{_DP}.memcpy_triton", "hook:around",
          "CPU only: 0.5.15's DP gather / scatter copies a rank's rows with a Triton kernel only; the same row copy "
          "in torch (0.5.23's memcpy_cpu)", "(dst, src, dim, offset, sz, offset_src)", R15),
    *(Touch(f"sglang.srt.distributed.parallel_state.GroupCoordinator.{m}", "hook:around",
            f"CPU only: 0.5.15 sends it through sglang::reg_{m}, an op "
            "registered for CUDA only; the group's own torch.distributed call instead (0.5.23's CPU branch)",
            "(self, output, input)", R15)
      for m in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")),
    Touch("sglang.srt.distributed.parallel_state.GroupCoordinator.reduce_scatterv", "hook:around",
          "CPU only: with DP attention and --ep-size equal to the DP size SGLang returns the MoE output with it, on "
          "pynccl only; the group's all-reduce and this rank's rows instead (0.5.23's _deterministic_reduce_scatterv)",
          "(self, input_, output=None, sizes=None)"),
    Touch("sglang.srt.distributed.parallel_state.GroupCoordinator", "reads",
          "the group's pynccl communicator, rank and all-reduce",
          attrs=("pynccl_comm", "rank_in_group", "world_size", "all_reduce"), releases=R23),
    Touch("sglang.srt.distributed.parallel_state.GroupCoordinator", "reads",
          "the group's torch.distributed calls, pynccl communicator, rank and all-reduce",
          attrs=("_all_gather_into_tensor", "_reduce_scatter_tensor", "_all_to_all_single", "pynccl_comm",
                 "rank_in_group", "world_size", "all_reduce"), releases=R15),
    Touch("sglang.srt.state_capturer.base.BaseHostCache.__init__", "hook:around",
          "CPU only: 0.5.15's own routed-experts host cache pins with pin_memory=True (no CUDA driver to pin for); "
          "unpinned, plain SGLang's capturer runs on the CPU runtime as the tests' oracle",
          "(self, num_tokens, num_layers, topk_size, name)", R15),
    Touch("sglang.srt.mem_cache.pool_host.common.ALLOC_MEMORY_FUNCS", "uses",
          "CPU only: the 'cpu' entry allocates host pools without cudaHostRegister (no GPU to pin for)"),
    Touch("sglang.srt.mem_cache.pool_host.common.HostTensorAllocator", "reads", "the allocator an entry is handed",
          attrs=("allocate",)),
    # -- CPU runtime, SGLang 0.5.15's EAGLE kernels (cpu_runtime/ops/eagle_0_5_15.py) --------------------------
    # 0.5.15 sends no speculative kernel to the CPU: each entry point its EAGLE v2 path reaches goes to the
    # torch version of 0.5.23's *_cpu op (cpu_runtime/ops/spec_ops.py). Hooks for Python wrappers; "replaces" for Triton
    # kernels launched as kernel[grid](...), at the module attribute the launch site reads.
    Touch("sglang.srt.speculative.triton_ops.cache_locs.assign_req_to_token_pool_func", "hook:around",
          "CPU only: each speculative decode step's KV slots into req_to_token (its Triton kernel needs a GPU)",
          "(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, batch_size)", R15),
    Touch("sglang.srt.speculative.triton_ops.cache_locs.assign_extend_cache_locs_func", "hook:around",
          "CPU only: the verify's out_cache_loc (0.5.15 returns None off CUDA / NPU)",
          "(req_pool_indices, req_to_token, start_offset, end_offset, batch_size, draft_token_num, device)", R15),
    Touch("sglang.srt.speculative.eagle_utils.verify_tree_greedy_func", "hook:around",
          "CPU only: the greedy verify (0.5.15 has no CPU branch and returns its inputs untouched)",
          "(predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token, "
          "retrieve_next_sibling, target_predict, topk=-1)", R15),
    Touch("sglang.srt.speculative.eagle_utils.build_tree_kernel_efficient", "hook:around",
          "CPU only: the drafted tree with a QLEN_ONLY mask (0.5.23's CPU mode, which cpu_runtime/ops/attention.py reads) by "
          "the CPU tree kernel (0.5.15 calls sgl-kernel's CUDA one, not even imported on CPU)",
          "(bonus_tokens, parent_list, top_scores_index, draft_tokens, seq_lens, seq_lens_sum, topk, spec_steps, "
          "num_verify_tokens, tree_mask_mode=<TreeMaskMode.FULL_MASK: 0>, tree_mask_buf=None, position_buf=None)",
          R15),
    Touch("sglang.srt.speculative.eagle_utils.TreeMaskMode", "uses", "CPU only: QLEN_ONLY, the tree mask's layout",
          None, R15, attrs=("QLEN_ONLY",)),
    Touch("sglang.srt.speculative.eagle_utils.eagle_sample", "hook:around",
          "CPU only: verify greedily whatever the requests' sampling, as 0.5.23 on CPU (the sampling verify is "
          "CUDA / Triton): batch.sampling_info.is_all_greedy is true for the call",
          "(verify_input, batch, logits_output, vocab_mask=None)", R15),
    Touch("sglang.srt.managers.schedule_batch.ScheduleBatch.sampling_info", "uses",
          "CPU only: the verified batch's sampling info (its greedy flag is set for the verify)", None, R15),
    Touch("sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo", "reads",
          "CPU only: the flag eagle_sample picks the greedy verify by", attrs=("is_all_greedy",), releases=R15),
    Touch("sglang.srt.speculative.eagle_info.EagleVerifyInput.create_idle_input", "hook:around",
          "CPU only: the idle verify input of a DP-attention rank without requests on the CPU (0.5.15: "
          "device='cuda')", "(topk, spec_steps, num_verify_tokens)", R15),
    Touch("sglang.srt.speculative.eagle_info.EagleVerifyInput.__init__", "uses",
          "CPU only: the idle verify input built",
          "(self, draft_token, custom_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, "
          "retrieve_cum_len, spec_steps, topk, draft_token_num, capture_hidden_mode, seq_lens_sum, seq_lens_cpu, "
          "grammar=None, draft_probs=None, num_tokens_per_req=-1)", R15),
    Touch(f"{_FWD}.CaptureHiddenMode", "uses", "CPU only: FULL, the idle verify input's hidden-state capture", None,
          R15, attrs=("FULL",)),
    Touch("sglang.srt.speculative.triton_ops.multi_layer_eagle.rotate_input_ids_triton", "hook:around",
          "CPU only: multi-layer MTP's draft-extend input rotation (its Triton kernel needs a GPU)",
          "(input_ids, extend_start_loc, extend_seq_lens, topk_index, select_index=None)", R15),
    Touch("sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker.draft_forward", "hook:around",
          "CPU only: multi-layer MTP's chain parents are built with device='cuda'; for the call its module's "
          "torch.full puts them on the CPU (0.5.23: the tree's device)", "(self, forward_batch)", R15),
    Touch("sglang.srt.speculative.triton_ops.cache_locs.assign_draft_cache_locs_contiguous", "replaces",
          "CPU only: the draft forwards' KV slots (prepare_for_draft launches it from this module)",
          "(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, speculative_num_steps)", R15),
    Touch(f"{_EAGLE}.fill_bonus_tokens", "replaces", "CPU only: each request's bonus token after the verify",
          "(accept_tokens, accept_lens, bonus_tokens_ptr, accept_stride)", R15),
    Touch("sglang.srt.speculative.multi_layer_eagle_worker_v2.fill_bonus_tokens", "replaces",
          "CPU only: each request's bonus token after a multi-layer MTP verify",
          "(accept_tokens, accept_lens, bonus_tokens_ptr, accept_stride)", R15),
    Touch("sglang.srt.speculative.spec_utils.assign_extend_cache_locs", "replaces",
          "CPU only: tree drafting's accepted path, the slots it moves to",
          "(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len, bs_upper)", R15),
    Touch("sglang.srt.speculative.spec_utils.fill_accept_out_cache_loc", "replaces",
          "CPU only: tree drafting's accepted path, the slots it moves from",
          "(accept_index, out_cache_loc, accept_out_cache_loc, size_upper)", R15),
    Touch(f"{_MEMORY_POOL}.copy_all_layer_kv_cache_tiled", "replaces",
          "CPU only: the KV pool's copy warm-up at start-up (a pool built for speculation) and every "
          "move_kv_cache (tree drafting), as 0.5.23's copy_all_layer_kv_cache_cpu",
          "(data_ptrs, strides, tgt_loc_ptr, src_loc_ptr, num_locs, num_locs_upper, BYTES_PER_TILE)", R15),
    # -- CPU runtime, gated delta-net (Qwen3-Next, Qwen3.5; cpu_runtime/ops/gdn.py) --------------------------------
    Touch("sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated.forward", "hook:around",
          "CPU only: the gated RMSNorm after the delta rule in torch (without AMX it launches a Triton kernel)",
          "(self, x, g, residual=None, prenorm=False, residual_in_fp32=False)", R23),
    Touch("sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated", "reads",
          "the norm's parameters and gate activation (CPU only)", attrs=("weight", "eps", "activation"), releases=R23),
    Touch("sglang.kernels.ops.attention.fla.layernorm_gated.RMSNorm.forward", "hook:around",
          "CPU only: Qwen3.5's gated RMSNorm after the delta rule in torch (without AMX a Triton kernel)",
          "(self, x, z=None)", R23),
    Touch("sglang.kernels.ops.attention.fla.layernorm_gated.RMSNorm", "reads",
          "the norm's parameters, groups, gate order and activation (CPU only)",
          attrs=("weight", "eps", "activation", "group_size", "norm_before_gate"), releases=R23),
    Touch("sglang.srt.models.qwen3_next.Qwen3GatedDeltaNet.__init__", "hook:around",
          "CPU only: while the layer is built, torch.get_device_module() answers torch.cpu, as on a CPU-only torch "
          "build (it builds its gated RMSNorm on current_device() of torch.cuda otherwise, and CUDA fails to start)",
          "(self, config, layer_id, quant_config=None, alt_stream=None, prefix='')", R23),
    Touch("sglang.srt.layers.attention.linear.gdn_backend.causal_conv1d_update", "hook:around",
          "CPU only: a target verify's convolution with each draft step's window kept (the name is sgl-kernel's CPU "
          "wrapper there, which takes none of the verify keywords GDNAttnBackend.forward_extend passes); decode "
          "calls go to the wrapper", "(mixed_qkv, conv_states, conv_weights, bias, activation, conv_state_indices)",
          R23),
    Touch("sglang.srt.utils.is_cpu", "uses", "whether gdn_backend bound causal_conv1d_update to sgl-kernel's CPU "
          "wrapper in this process (cached: a launching process may have asked before the CPU runtime was prepared)",
          "()", R23),
    Touch("sglang.srt.layers.attention.hybrid_linear_attn_backend.scatter_mamba_states_after_mtp_verify",
          "hook:around", "CPU only: the accepted draft step's recurrent state and conv window into each request's "
          "slot after a verify, in torch (Triton scatters)",
          "(mamba_caches, state_indices_tensor, last_correct_step_indices, mamba_track_indices, "
          "mamba_steps_to_track, src_indices_raw=None)", R23),
    Touch("sglang.srt.mem_cache.memory_pool.MambaPool.SpeculativeState", "reads",
          "the recurrent states, conv windows and their per-draft-step copies the commit scatters (CPU only)",
          attrs=("temporal", "intermediate_ssm", "conv", "intermediate_conv_window"), releases=R23),
    Touch("sglang.srt.models.qwen2_moe.fused_gate_sigmoid_mul_add", "hook:around",
          "CPU only: the shared expert's sigmoid gate added to the routed output in torch (a Triton kernel but on "
          "AMX CPUs and NPUs; Qwen2-MoE, Qwen3-Next, Qwen3.5)",
          "(hidden_states, gate_weight, shared_output, final_hidden_states)"),
    # -- CPU runtime, Mamba-2 (Nemotron-H; cpu_runtime/ops/mamba2.py) ------------------------------------------------
    Touch("sglang.srt.layers.attention.mamba.mamba.MambaMixer2.forward", "hook:around",
          "CPU only: the mixer's six kernel names (mamba.py's module globals) bound to torch versions for the call: "
          "the causal convolutions (unbound on a CPU import: NameError) and the SSD scan and state update (Triton)",
          "(self, kw:hidden_states, kw:output=None, kw:layer_cache, kw:metadata, kw:mup_vector=None, "
          "kw:use_triton_causal_conv=False)", R23),
    Touch("sglang.srt.layers.attention.mamba.mamba.mamba_chunk_scan_combined", "swaps",
          "CPU only, during MambaMixer2.forward: the SSD scan over each prefill sequence in torch (a Triton kernel)",
          "(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None, "
          "chunk_indices=None, chunk_offsets=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, inf), out=None, "
          "return_final_states=False, return_varlen_states=False, return_intermediate_states=False, state_dtype=None, "
          "return_track_states=False, track_seq_idx=None, track_end_locs=None)", R23),
    Touch("sglang.srt.layers.attention.mamba.mamba.selective_state_update", "swaps",
          "CPU only, during MambaMixer2.forward: the decode step's state update in torch (a Triton kernel)",
          "(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, state_batch_indices=None, "
          "pad_slot_id=-1, out=None, disable_state_update=False, intermediate_states_buffer=None, cache_steps=None, "
          "retrieve_parent_token=None, intermediate_state_indices=None)", R23),
    Touch("sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_fn", "swaps",
          "CPU only, during MambaMixer2.forward: bound as mamba.py's causal_conv1d_fn_triton / causal_conv1d_fn (a "
          "CUDA import binds this Triton function there, a CPU import nothing); the prefill convolution in torch, "
          "taking this signature", "(x, weight, bias, conv_states, query_start_loc, seq_lens_cpu, cache_indices=None, "
          "has_initial_state=None, activation='silu', pad_slot_id=-1, validate_data=False, block_table=None, "
          "**kwargs)", R23),
    Touch("sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_update", "swaps",
          "CPU only, during MambaMixer2.forward: bound as mamba.py's causal_conv1d_update_triton / "
          "causal_conv1d_update, likewise; the decode convolution in torch (no verify windows: MTP refused)",
          "(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, conv_state_indices=None, "
          "num_accept_tokens=None, intermediate_conv_window=None, intermediate_state_indices=None, "
          "retrieve_next_token=None, retrieve_next_sibling=None, retrieve_parent_token=None, pad_slot_id=-1, "
          "metadata=None, validate_data=False)", R23),
    Touch("sglang.srt.layers.attention.mamba.mamba2_metadata.Mamba2Metadata", "reads",
          "whether a forward tracks Mamba states for the radix cache (refused on the CPU runtime)",
          attrs=("has_mamba_track_mask",), releases=R23),
    # -- CPU runtime, Nemotron-H's MoE block (cpu_runtime/families/nemotron_h.py) -----------------------------------------
    Touch("sglang.srt.models.nemotron_h.NemotronHMoE._forward_core_normal", "hook:around",
          "CPU only: the router logits as a float32 product (torch.mm with out_dtype is CUDA only), then the same "
          "steps: shared expert, TopK (the capture site), experts", "(self, hidden_states)", R23),
    Touch("sglang.srt.layers.quantization.unquant.UnquantizedFusedMoEMethod.create_weights", "reads",
          "CPU only: registers the w13_weight [experts, intermediate, hidden] (non-gated: the up projection alone) and "
          "w2_weight [experts, hidden, intermediate] parameters on the FusedMoE, which cpu_runtime/families/nemotron_h.py's ReLU^2 "
          "experts and cpu_runtime/families/step3p5.py's clamped SiLU experts read by name (get_parameter)", "(self, layer, num_experts, hidden_size, intermediate_size_per_partition, "
          "params_dtype, with_bias=False, **extra_weight_attrs)", R23),
    Touch("sglang.srt.models.nemotron_h.NemotronHMoE", "reads", "the MoE block's router, shared expert and experts",
          attrs=("gate", "shared_experts", "topk", "use_latent_moe", "_apply_fc1_latent_proj", "experts"),
          releases=R23),
    # -- CPU runtime, LFM2-MoE's short convolutions (cpu_runtime/families/lfm2_moe.py) ---------------------------------------
    Touch("sglang.srt.models.lfm2_moe.Lfm2MoeShortConv.forward", "hook:around",
          "CPU only: the layer's two convolution names (lfm2_moe.py's module globals, Triton kernels on a CPU import) "
          "bound to mamba2.py's torch convolutions for the call", "(self, hidden_states, forward_batch)", R23),
    Touch("sglang.srt.models.lfm2_moe.causal_conv1d_fn", "swaps",
          "CPU only, during Lfm2MoeShortConv.forward: the prefill convolution in torch (no activation), taking this "
          "signature", "(x, weight, bias=None, query_start_loc=None, cache_indices=None, has_initial_state=None, "
          "conv_states=None, activation='silu', pad_slot_id=-1, **kwargs)", R23),
    Touch("sglang.srt.models.lfm2_moe.causal_conv1d_update", "swaps",
          "CPU only, during Lfm2MoeShortConv.forward: the decode convolution in torch, taking this signature",
          "(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, conv_state_indices=None, "
          "pad_slot_id=-1)", R23),
    # -- CPU runtime, Ling / Ring 2.0's routed scaling factor (cpu_runtime/families/bailing_moe.py) --------------------------
    Touch("sglang.srt.models.bailing_moe.BailingMoESparseMoeBlock._forward_router_experts", "hook:around",
          "CPU only: the routed experts' output times routed_scaling_factor, which the block leaves to the CUDA Triton "
          "runner (moe_forward_native applies none) unless TopK folds it in",
          {V0_5_23: "(self, hidden_states, forward_batch)", V0_5_15: "(self, hidden_states)"}, R23 + R15),
    Touch("sglang.srt.models.bailing_moe.BailingMoESparseMoeBlock", "reads",
          "the block's routed scaling factor and whether its experts fuse it into TopK",
          attrs=("routed_scaling_factor", "experts"), releases=R23 + R15),
    # -- CPU runtime, AFMoE's packed experts (cpu_runtime/families/afmoe.py) -------------------------------------------------
    Touch("sglang.srt.models.afmoe.fused_moe", "hook:around",
          "CPU only: AFMoE's experts (packed w1 / w2, no FusedMoE layer) in SGLang's torch implementation with the "
          "call's routed scaling factor (the Triton runner's custom op is registered for CUDA only)",
          '(hidden_states, w1, w2, topk_output, moe_runner_config=MoeRunnerConfig(num_experts=None, '
          'num_local_experts=None, hidden_size=None, intermediate_size_per_partition=None, layer_id=None, '
          'top_k=None, num_fused_shared_experts=None, params_dtype=None, routing_method_type=None, '
          "runner_backend=None, activation='silu', is_gated=True, apply_router_weight_on_input=False, "
          'inplace=True, no_combine=False, no_combine_keep_router_weight=False, routed_scaling_factor=None, '
          'gemm1_alpha=None, gemm1_beta=None, gemm1_clamp_limit=None, swiglu_limit=None, '
          'gate_up_interleaved=True, layer=None, use_tp_all_gather_activation=False, silu_mul_keep_fp32=False),'
          ' b1=None, b2=None, use_fp8_w8a8=False, use_int8_w8a8=False, use_int8_w8a16=False, '
          'use_int4_w4a16=False, per_channel_quant=False, w1_scale=None, w2_scale=None, w1_zp=None, w2_zp=None,'
          ' a1_scale=None, a2_scale=None, block_shape=None)', R23),
    Touch("sglang.srt.layers.moe.fused_moe_native.fused_moe_forward_native", "uses",
          "CPU only: AFMoE's experts in torch (gathered gate / up and down weights, SiLU-gated, top-k weighted)",
          "(layer, dispatch_output)", R23),
    Touch("sglang.srt.layers.moe.moe_runner.MoeRunnerConfig", "reads",
          "CPU only: what AFMoE's fused_moe call asks of the kernel (served: plain SiLU-gated experts)",
          attrs=("activation", "is_gated", "apply_router_weight_on_input", "gemm1_alpha", "gemm1_clamp_limit",
                 "swiglu_limit", "routed_scaling_factor", "inplace"), releases=R23),
    Touch("sglang.srt.layers.moe.token_dispatcher.StandardDispatchOutput", "uses",
          "CPU only: the tokens and top-k handed to fused_moe_forward_native",
          "(hidden_states, hidden_states_scale, topk_output, hidden_states_pre_quant=None)", R23),
    # -- CPU runtime, MiniMax-M2's QK norm (cpu_runtime/families/minimax_m2.py) ---------------------------------------------
    Touch("sglang.srt.models.minimax_m2.rms_sumsq_serial", "hook:around",
          "CPU only: the q and k rows' sums of squares in torch (a Triton kernel that asserts CUDA tensors)",
          "(x1, x2)"),
    Touch("sglang.srt.models.minimax_m2.rms_apply_serial", "hook:around",
          "CPU only: q and k scaled by their whole-width RMS and weighted, in torch (a Triton kernel that asserts "
          "CUDA tensors)", "(x1, x2, w1, w2, sum_sq, tp_world=1, eps=1e-05)"),
    # -- CPU runtime, gpt-oss's attention sinks (cpu_runtime/families/gpt_oss.py) --------------------------------------------
    Touch(f"{_TNA_MODULE}.scaled_dot_product_attention", "hook:around",
          "CPU only: inside a torch_native forward given gpt-oss's sinks, softmax over the scores and the head's sink "
          "logit, the sink's share dropped (transformers' eager_attention_forward); torch's SDPA otherwise"),
    Touch("sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments", "hook:around",
          "CPU only. gpt-oss: its attention-backend assertion counts torch_native (sinks added here) as a backend "
          "with sinks (cpu_runtime/families/gpt_oss.py). Gemma-4: likewise, torch_native as the CPU backend it lists (cpu_runtime/families/gemma4.py). "
          "DSA models: its DSA branch runs without the CUDA capability it reads only for the two DSA kernel passes, "
          "which are skipped (cpu_runtime/ops/dsa.py)", "(server_args)", R23),
    Touch("sglang.srt.arg_groups.model_hook.attention_backends_of", "swaps",
          "CPU only, gpt-oss and Gemma-4 only, during handle_model_specific_adjustments: torch_native answered as "
          "intel_amx, the CPU backend its assertion lists", "(cfg)", R23),
    Touch("sglang.srt.arg_groups.model_overrides.gpt_oss.is_triton_kernels_available", "hook:around",
          "CPU only: false, so gpt-oss's MoE runner stays auto (moe_forward_native on CPU, through the TopK capture "
          "site) instead of triton_kernel, whose Triton kernels have no CPU target", "()", R23),
    Touch(f"{_SA}._handle_model_specific_adjustments", "hook:around",
          "CPU only, gpt-oss only: its attention-backend assertion counts torch_native (sinks added here) as a "
          "backend with sinks", "(self)", R15),
    Touch("sglang.srt.arg_groups.overrides.attention_backends_of", "swaps",
          "CPU only, gpt-oss only, during ServerArgs._handle_model_specific_adjustments: torch_native answered as "
          "intel_amx, the CPU backend its assertion lists", "(cfg)", R15),
    Touch("sglang.srt.arg_groups.overrides.is_triton_kernels_available", "hook:around",
          "CPU only: false, so gpt-oss's MoE runner stays auto (moe_forward_native on CPU, through the TopK capture "
          "site) instead of triton_kernel, whose Triton kernels have no CPU target", "()", R15),
    # -- Gemma-4's vision pooler, every device (adapter/gemma4_vision.py) -----------------------------------------------
    Touch("sglang.srt.models.gemma4_vision.Gemma4VisionPooler.forward", "hook:around",
          "the padding patches' hidden states zeroed before pooling, as transformers' Gemma4VisionPooler does "
          "(gemma4_mm.py builds the pooler without mask_pad_before_pool; 0.5.15's has no such flag)",
          "(self, hidden_states, patch_positions, padding_positions, output_length=None)"),
    Touch("sglang.srt.managers.schedule_batch.MultimodalInputs", "reads", "a request's multimodal items (Gemma-4: the "
          "CPU runtime's image mask, and at collect its images' attention; adapter/gemma4_vision.py)",
          attrs=("mm_items",)),
    Touch("sglang.srt.managers.schedule_batch.MultimodalDataItem", "reads",
          "an item's modality and its token spans (first, last), as prepare_attn_masks reads them",
          attrs=("is_image", "offsets")),
    # -- CPU runtime, Gemma-4 (cpu_runtime/families/gemma4.py) ---------------------------------------------------------------
    Touch("sglang.srt.models.gemma4_causal.Gemma4Router.forward", "hook:around",
          "CPU only: the router's input normalised with the weight fuse_scale folds its learned scale and "
          "hidden_size ** -0.5 into, as CUDA's rmsnorm applies it (Gemma4RMSNorm.forward_native skips the weight of "
          "a norm built with_scale=False)", "(self, x)", R23),
    Touch("sglang.srt.models.gemma4_causal.Gemma4Router", "reads",
          "the fused scale's state, its norm (weight, eps) and projection (CPU only)",
          attrs=("_scale_fused", "fuse_scale", "norm", "proj"), releases=R23),
    Touch("sglang.srt.layers.layernorm.Gemma4RMSNorm", "reads", "the router norm's weight and eps (CPU only)",
          attrs=("weight", "eps"), releases=R23),
    Touch("sglang.srt.models.gemma4_mm.Gemma4ForConditionalGeneration.prepare_attn_masks", "hook:around",
          "CPU only, torch_native only (it logs a fall back to causal attention there): each request's image spans "
          "recorded for the sliding-window layers' mask, as transformers' create_masks_for_vision_model opens them",
          "(self, forward_batch, input_ids, mask_dtype)", R23),
    Touch(f"{_TNA}._run_sdpa_forward_extend", "hook:around",
          "CPU only, Gemma-4 image prefills only, sliding-window layers only: its sliding mask built with each image "
          "span's upper triangle open (the class's _make_sliding_window_mask, shadowed on the instance for the call)",
          "(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, extend_prefix_lens, "
          "extend_seq_lens, encoder_lens=None, scaling=None, enable_gqa=False, causal=False, is_cross_attn=False, "
          "sliding_window_size=None)", R23),
    Touch(f"{_TNA}._make_sliding_window_mask", "uses",
          "the sliding-window mask the image spans are opened in (CPU only)",
          "(kw:q_len, kw:kv_len, kw:sliding_window_size, kw:device, kw:query_offset=0)", R23),
    # -- CPU runtime, DSA models served dense within index_topk (cpu_runtime/ops/dsa.py) ---------------------------
    Touch("sglang.srt.arg_groups.model_hook.run_post_process_pass", "swaps",
          "CPU only, DSA models only, during handle_model_specific_adjustments: _dsa_kv_cache_dtype_default and "
          "_dsa_split_backend_resolution (a CUDA DSA kernel backend, an fp8 KV cache) skipped; every other pass runs",
          "(server_args, fn)", R23),
    Touch("sglang.srt.arg_groups.overrides._dsa_kv_cache_dtype_default", "reads",
          "its name: the pass skipped on the CPU runtime", "(view)", R23),
    Touch("sglang.srt.arg_groups.overrides._dsa_split_backend_resolution", "reads",
          "its name: the pass skipped on the CPU runtime", "(view)", R23),
    Touch("sglang.srt.layers.attention.dsa.dsa_indexer.Indexer.forward_native", "hook:around",
          "CPU only: no top-k indices (None) when the attention backend has no indexer metadata, as forward_cuda "
          "returns; the layer attends to every key (exact while sequences fit in index_topk, which start-up "
          "enforces on the CPU runtime)", "(self, *args, **kwargs)", R23),
    Touch("sglang.srt.model_executor.forward_context.get_attn_backend", "uses",
          "CPU only, inside the indexer's forward: the attention backend whose get_indexer_metadata says whether it "
          "runs an indexer; in Gemma-4's prepare_attn_masks, the backend its image mask is for (cpu_runtime/families/gemma4.py)",
          "()", R23),
    Touch("sglang.srt.layers.attention.base_attn_backend.AttentionBackend", "reads",
          "CPU only: get_indexer_metadata, None for a backend that runs no DSA indexer (torch_native)", releases=R23,
          attrs=("get_indexer_metadata",)),
    Touch("sglang.srt.configs.model_config.is_deepseek_dsa", "reads",
          "whether a model's attention is DSA (the CPU runtime's DSA start-up and context-length check)",
          "(config)"),
    Touch("sglang.srt.configs.model_config.get_dsa_index_topk", "uses",
          "a DSA model's index_topk (the CPU runtime's context-length check)", "(config)", R23),
    # -- CPU runtime, DeepSeek-style attention's rotation: unscaled, half-split (cpu_runtime/ops/rope.py) --------------
    Touch("sglang.srt.layers.rotary_embedding.factory.get_rope_cpu", "hook:around",
          "CPU only: without rope_scaling (which it asserts is deepseek_yarn), the plain rotary embedding get_rope "
          "builds on every other device; scaled configs unchanged",
          "(head_size, rotary_dim, max_position, base, is_neox_style=True, rope_scaling=None, dtype=None, "
          "partial_rotary_factor=1.0, device=None)"),
    Touch("sglang.srt.layers.rotary_embedding.factory.get_rope", "uses",
          "CPU only, for DeepSeek-style attention without rope_scaling: the plain rotary embedding",
          "(head_size, rotary_dim, max_position, base, is_neox_style=True, rope_scaling=None, dtype=None, "
          "partial_rotary_factor=1.0, dual_chunk_attention_config=None)"),
    Touch("sglang.srt.layers.rotary_embedding.rope_variant.DeepseekScalingRotaryEmbedding.forward_native",
          "hook:around", "CPU only: half-split pairs (is_neox_style, rope_interleave false) rotated as it means to; it "
          "repeats cos/sin to a leading axis; interleaved unchanged", "(self, positions, query, key, offsets=None)"),
    Touch("sglang.srt.layers.rotary_embedding.rope_variant.DeepseekScalingRotaryEmbedding.forward_cpu", "hook:around",
          "CPU only (AMX): half-split pairs rotated as forward_native means to; its kernel call passes is_neox=False; "
          "interleaved unchanged", "(self, positions, query, key, offsets=None)"),
    Touch("sglang.srt.layers.rotary_embedding.rope_variant.DeepseekScalingRotaryEmbedding", "reads",
          "its pair layout, YaRN cos/sin cache and rotated width (CPU only)",
          attrs=("is_neox_style", "cos_sin_cache", "rotary_dim")),
    Touch("sglang.srt.layers.rotary_embedding.utils.rotate_neox", "uses",
          "CPU only: the half-split rotation DeepseekScalingRotaryEmbedding.forward_native applies", "(x)"),
    Touch("sgl_kernel", "op", "torch versions of the *_cpu ops sgl-kernel's CPU paths call: speculative "
          "(cpu_runtime/ops/spec_ops.py) and gated delta-net (cpu_runtime/ops/gdn.py)"),
)


def entries(release: str) -> Tuple[Touch, ...]:
    """The manifest of one release."""
    return tuple(e for e in MANIFEST if release in e.releases)


@functools.cache
def by_target() -> Dict[str, Touch]:
    """The installed release's entries by target (mutable: tests change it to simulate another SGLang)."""
    return {e.target: e for e in entries(in_force())}


def signature_of(obj: Any) -> Optional[str]:
    """Parameter names, kinds and defaults of a callable, e.g. ``(self, batch, kw:with_topology=False)``."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        s = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**", p.KEYWORD_ONLY: "kw:"}.get(p.kind, "") + p.name
        if p.default is not p.empty:
            s += "=" + repr(p.default)
        out.append(s)
    return "(" + ", ".join(out) + ")"


def problem(target: str, obj: Any, kind: Optional[str] = None) -> Optional[str]:
    """Why ``obj`` (what ``target`` resolved to) is not what sglang-r3 was written against, or None."""
    entry = by_target().get(target)
    if entry is None:
        return (f"not listed for SGLang {in_force()} in sglang_r3/seam/manifest.py "
                "(every SGLang target must be)")
    if kind is not None and not entry.kind.startswith(kind):
        return f"listed as {entry.kind!r}, touched as {kind!r}"
    want = entry.signature_on(in_force())
    if want is not None:
        now = signature_of(obj)
        if now != want:
            return f"signature changed: written against {want}, installed {now}"
    return None


def missing_attrs(cls: Any, attrs: Tuple[str, ...]) -> List[str]:
    """The attributes of ``attrs`` an instance of ``cls`` would not have: neither on the class (methods,
    properties, class attributes), nor a dataclass / msgspec field, nor assigned to ``self`` in the source of
    a class of its MRO, nor, for a module or an object, an attribute of it."""
    if not isinstance(cls, type):
        return [a for a in attrs if not hasattr(cls, a)]
    fields = set(getattr(cls, "__dataclass_fields__", {})) | set(getattr(cls, "__struct_fields__", ()))
    for c in cls.__mro__:
        fields |= set(getattr(c, "__annotations__", {}))
    assigned = set()
    for c in cls.__mro__:
        if c.__module__.split(".")[0] not in ("sglang", "sgl_kernel"):
            continue
        try:
            src = inspect.getsource(c)
        except (OSError, TypeError):
            continue
        assigned |= set(re.findall(r"self\.(\w+)\s*(?::[^=\n]+)?=", src))
    return [a for a in attrs if not hasattr(cls, a) and a not in fields and a not in assigned]


def check(entries_: Optional[Tuple[Touch, ...]] = None, *, release: Optional[str] = None) -> List[Tuple[str, str]]:
    """(target, why) for every entry (of ``release``: by default the installed one) that is missing or
    changed in the installed SGLang."""
    from sglang_r3.seam.resolve import describe_error, resolve

    if release is None:
        release = in_force()
    out = []
    for e in (entries(release) if entries_ is None else entries_):
        if e.kind in ("adds", "overrides"):
            owner, _, name = e.target.rpartition(".")
            try:
                cls = resolve(owner)
            except Exception as exc:  # noqa: BLE001
                out.append((e.target, describe_error(exc)))
                continue
            have = getattr(cls, name, None) if e.kind == "adds" else cls.__dict__.get(name)
            if have is not None and getattr(have, "__module__", "").split(".")[0] != "sglang_r3":
                out.append((e.target, "SGLang now defines it: sglang-r3's CPU stand-in would replace it"))
            elif e.kind == "overrides" and getattr(cls, name, None) is None:
                out.append((e.target, "no base class defines it any more: nothing calls what we would override"))
            continue
        try:
            obj = resolve(e.target)
        except Exception as exc:  # noqa: BLE001 -- ImportError, AttributeError, or the module's own error
            out.append((e.target, describe_error(exc)))
            continue
        if e.kind == "replaces":  # the kernel (our stand-in keeps it as __wrapped__), by its Python function
            obj = getattr(getattr(obj, "__wrapped__", obj), "fn", None)
            if obj is None:
                out.append((e.target, "no longer a Triton kernel (we replace it where it is launched as kernel[grid])"))
                continue
        want = e.signature_on(release)
        if want is not None and signature_of(obj) != want:
            out.append((e.target, f"signature changed: written against {want}, installed {signature_of(obj)}"))
        if e.attrs:
            gone = missing_attrs(obj, e.attrs)
            if gone:
                out.append((e.target, f"no attribute {', '.join(gone)} (read by sglang-r3)"))
    return out

