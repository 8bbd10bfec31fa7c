"""Configurations outside the capture envelope are refused at start-up, naming the flag.

Argument level, in process: the argv our launcher builds (``resolve_argv(..., cpu=True)``), SGLang's own
record of it as asked for (``api.prepare_server_args``, as our launcher takes it), then ``check_supported``
(which also runs SGLang's resolution: 0.5.23's ``resolve_once``, 0.5.15's ``__post_init__``). No server is
started, except the one end-to-end launch at the bottom, which must exit before SGLang launches anything.
On every served release: a flag the installed release does not have is shown to be refused by SGLang's own
parser (nothing to serve or refuse there).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import types

import pytest

from sglang_r3.core import settings
from sglang_r3.serving.launch import resolve_argv

pytestmark = [pytest.mark.sglang, pytest.mark.release]


@pytest.fixture(scope="module")
def sglang_args():
    # SGLang's argument resolution imports sgl-kernel, which needs the libcuda stand-in on a CPU-only
    # host; resolution also exports env vars. Restore the environment so later tests (which start real
    # servers) see the one they would have seen without this module.
    saved = dict(os.environ)
    from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu

    if not has_gpu():
        activate_cpu_runtime()
    from sglang_r3.serving.adapter.api import prepare_server_args

    yield prepare_server_args
    os.environ.clear()
    os.environ.update(saved)


def _check(prepare_server_args, flags, *, pass_argv=True):
    from sglang_r3.serving.refusals.startup import check_supported

    argv = resolve_argv(flags, cpu=True)
    server_args, resolve = prepare_server_args(argv)
    check_supported(server_args, argv=argv if pass_argv else None, resolve=resolve)
    return server_args


def _refusal(prepare_server_args, flags, **kw):
    from sglang_r3.serving.refusals.startup import UnsupportedConfigError

    with pytest.raises(UnsupportedConfigError) as info:
        _check(prepare_server_args, flags, **kw)
    return info.value


def _resolved(server_args):
    from sglang_r3.seam.release import resolved

    return resolved(server_args)


def _release() -> str:
    from sglang_r3.seam.versions import installed

    return installed()


def _absent_flags(flags) -> list:
    """The flags of ``flags`` the installed SGLang release does not have."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(parser)
    known = {s for a in parser._actions for s in a.option_strings}
    return [f for f in flags if f.startswith("--") and f not in known]


def _not_on_this_release(sglang_args, flags) -> bool:
    """True (after checking SGLang's own parser refuses it) when a flag of ``flags`` does not exist on the
    installed release: there is nothing there to serve or refuse."""
    absent = _absent_flags(flags)
    if not absent:
        return False
    with pytest.raises(SystemExit):  # argparse: "unrecognized arguments"
        sglang_args(resolve_argv(flags, cpu=True))
    return True


def _assert_only_flag(err, flag: str, *reason_words: str):
    """Exactly one refusal, for ``flag``, on its own line of the message, with a reason."""
    assert err.flags == [flag], str(err)
    line = next(l for l in str(err).splitlines() if l.startswith(f"  {flag}: "))
    for word in reason_words:
        assert word in line, line


# -- the envelope we serve today keeps starting ----------------------------------------------------

TREE = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4"]


@pytest.mark.parametrize(
    "flags",
    [
        [],  # the default launch: embedded model, EAGLE/NEXTN speculation topk 1, CPU flags
        ["--disable-speculation"],
        TREE,
        ["--speculative-algorithm", "NEXTN"],  # SGLang's alias for EAGLE
        ["--dtype", "bfloat16"],
        ["--enable-metrics"],
        ["--admin-api-key", "secret"],
        ["--max-total-tokens", "4096"],
        ["--sleep-on-idle"],
        ["--tp-size", "1"],
    ],
    ids=lambda f: " ".join(f) or "defaults",
)
def test_supported_configuration_passes_the_check(sglang_args, flags):
    _check(sglang_args, flags)


def test_expert_parallel_without_all_to_all_backend_is_accepted(sglang_args):
    # With --moe-a2a-backend none every rank routes the whole batch: rows are complete.
    server_args = _check(sglang_args, ["--tp-size", "2", "--ep-size", "2"])
    assert _resolved(server_args).moe_a2a_backend == "none"


@pytest.mark.parametrize(
    "flags",
    [["--enable-eplb", "--ep-size", "2", "--tp-size", "2"], ["--init-expert-location", "trivial"]],
    ids=lambda f: " ".join(f),
)
def test_eplb_is_accepted_because_capture_sees_logical_ids(sglang_args, flags):
    _check(sglang_args, flags)


def _function_source(module: str, function: str) -> str:
    # Read the file rather than import it: the NPU module does not import on other hosts.
    path = importlib.util.find_spec(module).origin
    text = open(path).read()
    node = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == function)
    return ast.get_source_segment(text, node)


# The function of each release's top-k path that calls the capture site and remaps logical expert ids.
_TOPK_PATHS = {
    "0.5.23": [("sglang.srt.layers.moe.topk", "_post_process_topk_ids"),
               ("sglang.srt.hardware_backend.npu.moe.topk", "_finalize_topk_npu")],
    "0.5.15.post1": [("sglang.srt.layers.moe.topk", "_post_process_topk_ids"),
                     ("sglang.srt.hardware_backend.npu.moe.topk", "fused_topk_npu")],
}


@pytest.mark.parametrize("path", [0, 1], ids=["cuda-cpu", "npu"])
def test_capture_site_runs_before_the_eplb_logical_to_physical_remap_or_eplb_is_refused(sglang_args, path):
    # Why EPLB is accepted: rows hold the router's logical expert ids, whatever EPLB does to placement.
    # Where a release captures after the remap (0.5.15's NPU path), EPLB is refused on that device instead.
    module, function = _TOPK_PATHS[_release()][path]
    src = _function_source(module, function)
    if src.index("capture_routed_experts_if_allowed(") < src.index("topk_ids_logical_to_physical("):
        return
    from sglang_r3.serving.refusals.startup import _FlagNames, _refusals

    assert path == 1 and _release() == "0.5.15.post1", (module, function)

    class OnNpuWithEplb:  # the resolved default launch, as it would be on an NPU with EPLB on
        device, enable_eplb = "npu", True

        def __init__(self, cfg):
            self._cfg = cfg

        def __getattr__(self, name):
            return getattr(self._cfg, name)

    npu = OnNpuWithEplb(_resolved(_check(sglang_args, [])))
    hits = [r.flag for r in _refusals(npu, _FlagNames([]), resolved=True, raw=npu)]
    assert hits == ["--enable-eplb on --device npu"], hits


def test_single_batch_overlap_is_accepted(sglang_args):
    # One batch, one select_experts per layer: routing is captured as without it.
    _check(sglang_args, ["--enable-single-batch-overlap"])


def test_skip_tokenizer_init_is_accepted(sglang_args):
    # Responses still go through our /generate; the tokenizer manager base64s the payload as the
    # detokenizer would.
    _check(sglang_args, ["--skip-tokenizer-init"])


# -- one refusal per flag ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        ["--enable-dp-attention", "--tp-size", "2", "--dp-size", "2"],
        ["--attn-dp-size", "2", "--tp-size", "2"],
        # slime's GLM-4.7 rollout flags (docs/en/examples/glm4.7-355B-A32B.md, THUDM/slime 624b824), 2 ranks.
        ["--enable-dp-attention", "--tp-size", "2", "--dp-size", "2", "--enable-dp-lm-head",
         "--moe-dense-tp-size", "1", "--ep-size", "2", "--speculative-algorithm", "EAGLE",
         "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
    ],
    ids=["enable-dp-attention", "attn-dp-size", "slime-glm4.7"],
)
def test_dp_attention_is_accepted(sglang_args, flags):
    # Each DP rank's rows are cut out of the gathered batch (adapter/dp_rows.py; tests/test_dp_attention.py
    # serves it and compares with a one-rank server and with plain SGLang's own capturer).
    if _not_on_this_release(sglang_args, flags):  # 0.5.15 has no --attn-dp-size
        return
    _check(sglang_args, flags)


# A GPU's device (DeepEP is served there; the CPU runtime cannot run it, below). Arguments only: nothing starts.
ON_A_GPU = ["--device", "cuda"]


@pytest.mark.parametrize("backend", ["deepep"])  # SGLang itself refuses deepep_v2 for GLM-4.5 (not registered)
def test_deepep_with_attention_tp_is_accepted_on_a_gpu(sglang_args, backend):
    # Upstream's capturer all-gathers top-k across attention-TP ranks for exactly these; so does ours.
    _check(sglang_args, ["--moe-a2a-backend", backend, "--tp-size", "2", "--ep-size", "2", *ON_A_GPU])


@pytest.mark.parametrize("flags", [
    ["--moe-a2a-backend", "deepep", "--tp-size", "2", "--ep-size", "2"],
    ["--enable-dp-attention", "--tp-size", "2", "--dp-size", "2", "--ep-size", "2", "--moe-a2a-backend", "deepep"],
], ids=["attention-tp", "dp-attention"])
def test_deepep_on_the_cpu_runtime_is_refused_naming_sglangs_call_that_stops_it(sglang_args, flags):
    # On a CPU host SGLang would start and then stop building the first MoE layer (tests/test_expert_parallel.py
    # runs that call here); expert parallelism without an all-to-all backend is served instead.
    err = _refusal(sglang_args, flags)
    _assert_only_flag(err, "--moe-a2a-backend deepep on --device cpu", "use_deepep is False",
                      "_DeepEPDispatcherImplBase.__init__", "--moe-a2a-backend none) is served")


def test_expert_parallelism_without_an_all_to_all_backend_is_accepted_on_the_cpu_runtime(sglang_args):
    # Served and compared with a one-rank server in tests/test_dp_attention.py (slime's GLM-4.7 flags).
    _check(sglang_args, ["--enable-dp-attention", "--tp-size", "2", "--dp-size", "2", "--ep-size", "2",
                         "--moe-a2a-backend", "none"])


def test_torch_compile_with_expert_parallelism_is_refused_on_a_gpu_and_accepted_on_the_cpu_runtime(sglang_args):
    # Off the CPU runtime the compiled mode's one-token MoE forward indexes the weights with EP's -1 ids
    # (tests/test_expert_parallel.py runs SGLang's function on them); the CPU runtime keeps moe_forward_native.
    flags = ["--enable-dp-attention", "--tp-size", "2", "--dp-size", "2", "--ep-size", "2", "--enable-torch-compile"]
    err = _refusal(sglang_args, [*flags, *ON_A_GPU])
    _assert_only_flag(err, "--enable-torch-compile together with --ep-size 2", "fused_moe_forward_native",
                      "w13_weight[topk_ids]")
    _check(sglang_args, flags)


def test_all_to_all_backend_with_attention_tp_is_refused_naming_the_combination(sglang_args):
    err = _refusal(sglang_args, ["--moe-a2a-backend", "mooncake", "--tp-size", "2", "--ep-size", "2"])
    _assert_only_flag(
        err,
        "--moe-a2a-backend mooncake together with --tp-size 2 (attention-TP width 2) and --ep-size 2",
        "scatters",
        "deepep and deepep_v2",
    )


@pytest.mark.parametrize(
    "flags",
    [["--enable-waterfill", "--tp-size", "2", *ON_A_GPU],
     ["--moe-a2a-backend", "none", "--enable-waterfill", "--tp-size", "2", *ON_A_GPU]],
    ids=["untyped", "typed-none"],
)
def test_deepep_set_by_sglang_resolution_is_checked_on_the_resolved_view_and_accepted(sglang_args, flags):
    # --enable-waterfill makes SGLang's resolution switch the a2a backend to DeepEP (only the resolved
    # view shows it); DeepEP's scattered top-k is gathered across attention-TP ranks, so it is served.
    if _not_on_this_release(sglang_args, flags):
        return
    server_args = _check(sglang_args, flags)
    assert _resolved(server_args).moe_a2a_backend == "deepep"


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_pd_disaggregation_with_mooncake_is_served(sglang_args, mode):
    # Served on both releases: the prompt's rows travel with its KV (adapter/pd_rows.py; tests/test_pd.py serves a
    # pair).
    _check(sglang_args, ["--disaggregation-mode", mode, "--disaggregation-transfer-backend", "mooncake"])


@pytest.mark.parametrize("backend", ["nixl", "fake"])
def test_pd_disaggregation_with_another_transfer_backend_is_refused_naming_it(sglang_args, backend):
    err = _refusal(sglang_args, ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", backend])
    _assert_only_flag(err, f"--disaggregation-transfer-backend {backend}", "mooncake")


def test_pd_disaggregation_with_an_mxfp8_kv_cache_is_refused_naming_it(sglang_args):
    # An MXFP8 KV pool sends its block scales as the KV transfer's block_scale component: the rows' carrier.
    from sglang_r3.seam import release

    if release.pd_rows_carrier().state_type != "BLOCK_SCALE":
        return  # 0.5.15.post1: the rows ride another state type, which no KV cache dtype takes
    flags = ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mooncake",
             "--kv-cache-dtype", "mxfp8"]
    err = _refusal(sglang_args, flags)
    assert err.flags == ["--kv-cache-dtype mxfp8 together with --disaggregation-mode prefill"], str(err)
    assert "block_scale" in str(err), str(err)


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--enable-hierarchical-cache"], "--enable-hierarchical-cache"),
        (["--enable-hicache"], "--enable-hicache"),  # named as typed, not by its canonical spelling (0.5.23)
        (["--hicache-storage-backend", "file"], "--hicache-storage-backend file"),
        (["--enable-lmcache"], "--enable-lmcache"),
        (["--enable-flexkv"], "--enable-flexkv"),
        (["--enable-unified-cache-external-linker"], "--enable-unified-cache-external-linker"),
        (["--enable-hisparse"], "--enable-hisparse"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_host_or_storage_kv_cache_is_refused(sglang_args, flags, flag):
    if _not_on_this_release(sglang_args, flags):
        return
    err = _refusal(sglang_args, flags)
    _assert_only_flag(err, flag, "KV")


def test_flag_is_named_as_typed_from_sglangs_own_record_of_the_command_line(sglang_args):
    # Without argv, check_supported reads the command line SGLang kept on the record (0.5.23); 0.5.15 keeps
    # none, so there it is the process's own command line, which here is pytest's: the canonical spelling.
    if _release() == "0.5.15.post1":  # which also has no --enable-hicache alias
        err = _refusal(sglang_args, ["--enable-hierarchical-cache"], pass_argv=False)
        _assert_only_flag(err, "--enable-hierarchical-cache", "stale")
    else:
        err = _refusal(sglang_args, ["--enable-hicache"], pass_argv=False)
        _assert_only_flag(err, "--enable-hicache", "stale")


def test_pipeline_parallel_is_refused(sglang_args):
    err = _refusal(sglang_args, ["--pp-size", "2"])
    _assert_only_flag(err, "--pp-size 2", "pipeline ranks")


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--attn-cp-size", "2", "--tp-size", "2"], "--attn-cp-size 2"),
        (["--enable-prefill-cp"], "--enable-prefill-cp"),
        (["--dcp-size", "2", "--tp-size", "2"], "--dcp-size 2"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_context_parallel_is_refused(sglang_args, flags, flag):
    _assert_only_flag(_refusal(sglang_args, flags), flag, "KV slots")


@pytest.mark.parametrize(
    "algorithm, worker",
    [
        ("NGRAM", "NGRAMWorker"),
        ("STANDALONE", "StandaloneWorkerV2"),
        ("EAGLE3", "EAGLE-3"),
        ("DFLASH", "DFlashWorkerV2"),
        ("FROZEN_KV_MTP", "FrozenKVMTPWorkerV2"),
    ],
)
def test_speculative_algorithm_without_our_hooked_worker_is_refused(sglang_args, algorithm, worker):
    err = _refusal(sglang_args, ["--speculative-algorithm", algorithm])
    _assert_only_flag(err, f"--speculative-algorithm {algorithm}", worker, "EAGLEWorkerV2")


def test_multi_layer_eagle_worker_is_refused(sglang_args):
    # The embedded GLM model: multi-layer EAGLE is captured for Step-3.5 only.
    err = _refusal(sglang_args, ["--enable-multi-layer-eagle"])
    _assert_only_flag(err, "--enable-multi-layer-eagle", "MultiLayerEagleWorkerV2", "Step3p5ForCausalLM",
                      "Glm4MoeForCausalLM")


def _step3p5_dir(tmp_path, **changes):
    import json

    from tests.support.step3p5 import build

    d = build(tmp_path / "step3p5")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    return ["--model-path", str(d), "--load-format", "dummy"]


def test_multi_layer_eagle_that_sglang_turns_on_for_step3p5_passes_the_check(sglang_args, tmp_path):
    from tests.support.step3p5 import SPEC_FLAGS

    server_args = _check(sglang_args, _step3p5_dir(tmp_path) + SPEC_FLAGS)
    assert _resolved(server_args).enable_multi_layer_eagle  # SGLang's own choice for Step3p5ForCausalLM


def test_multi_layer_eagle_for_a_model_without_a_layout_is_refused_naming_the_flag_sglang_set(sglang_args, tmp_path):
    from tests.support.step3p5 import NUM_LAYERS, SPEC_FLAGS

    # MTP layers 45 (MoE) and 46, 47 (dense): SGLang would build all three as layer 45.
    enum = ",".join(str(i) for i in range(1, NUM_LAYERS + 1))
    flags = _step3p5_dir(tmp_path, moe_layers_enum=enum) + SPEC_FLAGS
    # The checkpoint's config.json has no layout: refused on it before anything resolves, naming --model-path.
    err = _refusal(sglang_args, flags)
    assert [f.split()[0] for f in err.flags] == ["--model-path"], str(err)
    assert "layer 45" in str(err)
    # Under --json-model-override-args the merged config is the model's: checked once SGLang resolved it, where
    # the refusal names the flag SGLang set.
    err = _refusal(sglang_args, flags + ["--json-model-override-args", '{"sglang_r3_unused": 1}'])
    assert err.flags == ["--enable-multi-layer-eagle (not on the command line: SGLang set it while resolving "
                         "this configuration)"], str(err)
    assert "no layout" in str(err) and "layer 45" in str(err)


def test_multi_layer_eagle_with_more_draft_steps_than_mtp_layers_is_refused(sglang_args, tmp_path):
    from tests.support.step3p5 import SPEC_FLAGS

    flags = _step3p5_dir(tmp_path, num_nextn_predict_layers=2)
    # 48 per-layer entries, as transformers' validator wants them, for 45 + 2 layers: keep 47.
    import json

    cfg = json.loads((tmp_path / "step3p5" / "config.json").read_text())
    for key in ("layer_types", "rope_theta", "swiglu_limits", "swiglu_limits_shared", "partial_rotary_factors"):
        cfg[key] = cfg[key][:47]
    (tmp_path / "step3p5" / "config.json").write_text(json.dumps(cfg))
    err = _refusal(sglang_args, flags + SPEC_FLAGS)
    _assert_only_flag(err, "--speculative-num-steps 3", "MultiLayerEagleWorkerV2", "2 MTP layer(s)")


@pytest.mark.parametrize("name", [  # gated delta-net, Mamba-2
    pytest.param("qwen3_next", marks=pytest.mark.skipif(
        _release() == "0.5.15.post1", reason="0.5.15's CPU runtime refuses a gated delta-net model outright, in the "
        "raw pass, before this resolved-pass check (test_what_sglang_0_5_15_cannot_run_on_the_cpu_runtime_is_refused_"
        "there_before_it_stops)")),
    pytest.param("nemotron_h", marks=pytest.mark.skipif(
        _release() == "0.5.15.post1", reason="building the checkpoint with 0.5.15's transformers 5.12 fetches "
        "NemotronH's causal-conv1d kernel from the Hub (no network in CI)")),
])
def test_a_drafted_tree_over_linear_attention_layers_on_the_cpu_runtime_is_refused(sglang_args, name):
    # The CPU runtime's gated delta-net and Mamba-2 mixers verify a drafted chain (one state per draft step); a
    # tree's first verify stopped the scheduler. Both checkpoints are the family tests' (served with a chain there);
    # the embedded model (no linear attention) keeps serving TREE (test_supported_configuration_passes_the_check).
    from tests.family_specs.build import build
    from tests.family_specs.groups import HYBRID_FLAGS
    from tests.family_specs.specs import SPECS

    err = _refusal(sglang_args, ["--model-path", str(build(SPECS[name])), *HYBRID_FLAGS, *TREE])
    _assert_only_flag(err, "--speculative-eagle-topk 2", "linear-attention", "--speculative-eagle-topk 1")


def test_two_batch_overlap_is_refused(sglang_args):
    err = _refusal(sglang_args, ["--enable-two-batch-overlap"])
    _assert_only_flag(err, "--enable-two-batch-overlap", "micro-batches")


@pytest.mark.parametrize("backend", ["triton_kernel", "flashinfer_trtllm"])
def test_moe_runner_that_routes_inside_its_kernel_is_refused(sglang_args, backend):
    err = _refusal(sglang_args, ["--moe-runner-backend", backend])
    _assert_only_flag(err, f"--moe-runner-backend {backend}", "capture site")


def test_multi_tokenizer_mode_is_refused(sglang_args):
    err = _refusal(sglang_args, ["--tokenizer-worker-num", "2"])
    _assert_only_flag(err, "--tokenizer-worker-num 2", "/generate")


@pytest.mark.parametrize(
    "flags, flag",
    [(["--grpc-port", "50051"], "--grpc-port 50051"), (["--smg-grpc-mode"], "--smg-grpc-mode")],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_grpc_serving_is_refused(sglang_args, flags, flag):
    if _not_on_this_release(sglang_args, flags):
        return
    _assert_only_flag(_refusal(sglang_args, flags), flag, "bypass our /generate")


def test_ray_launch_is_refused(sglang_args):
    _assert_only_flag(_refusal(sglang_args, ["--use-ray"]), "--use-ray", "SGLANG_R3_ENABLED")


def test_pd_multiplexing_is_refused(sglang_args):
    _assert_only_flag(_refusal(sglang_args, ["--enable-pdmux"]), "--enable-pdmux", "interleaved")


def test_rust_http_server_is_refused(sglang_args, monkeypatch):
    monkeypatch.setenv("SGLANG_RUST_SERVER", "1")
    if _release() == "0.5.15.post1":  # 0.5.15 has no Rust HTTP server: the variable changes nothing there
        _check(sglang_args, [])
        return
    err = _refusal(sglang_args, [])
    _assert_only_flag(err, "SGLANG_RUST_SERVER=1 (environment variable)", "FastAPI")


def test_every_unsupported_setting_is_listed_at_once(sglang_args):
    err = _refusal(
        sglang_args,
        ["--enable-two-batch-overlap", "--pp-size", "2", "--enable-hierarchical-cache",
         "--speculative-algorithm", "NGRAM", "--tokenizer-worker-num", "2"],
    )
    assert err.flags == [
        "--pp-size 2",
        "--enable-two-batch-overlap",
        "--enable-hierarchical-cache",
        "--speculative-algorithm NGRAM",
        "--tokenizer-worker-num 2",
    ], str(err)
    assert sum(l.startswith("  --") for l in str(err).splitlines()) == 5


# -- the launcher -------------------------------------------------------------------------------------


def test_refused_launch_exits_nonzero_naming_the_flag_before_sglang_starts():
    # Generous timeout: importing SGLang takes ~25 s on an idle 2-core machine, much longer on a loaded one.
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_r3.launch_server", "--enable-two-batch-overlap"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0
    assert "  --enable-two-batch-overlap: " in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # SGLang logs its resolved arguments as it starts launching its processes; it never got there.
    assert "server_args=" not in proc.stderr + proc.stdout


# -- sliding-window layers on the CPU runtime -----------------------------------------------------------


def test_cpu_launch_of_a_sliding_window_model_gets_one_full_kv_pool(sglang_args, tmp_path):
    # Step-3.5 has sliding-window layers (SGLang gives them a KV pool of their own unless told not to):
    # our launcher adds --disable-hybrid-swa-memory on the CPU runtime, and SGLang's model config agrees.
    from sglang_r3.seam.release import model_config_of

    flags = [f for f in _step3p5_dir(tmp_path) if f != "--disable-hybrid-swa-memory"]
    server_args = _check(sglang_args, flags)
    view = _resolved(server_args)
    assert view.disable_hybrid_swa_memory
    assert not model_config_of(view).is_hybrid_swa


def test_opt_in_launch_of_a_sliding_window_model_on_cpu_without_one_full_pool_is_refused(sglang_args, tmp_path):
    # SGLang's own launchers under SGLANG_R3_ENABLED=1 add nothing: the missing setting is named.
    from sglang_r3.serving.adapter.opt_in import missing_settings

    argv = ["--model-path", _step3p5_dir(tmp_path)[1], "--enable-return-routed-experts", "--device", "cpu",
            "--attention-backend", "torch_native", "--disable-overlap-schedule", "--disable-cuda-graph"]
    server_args, resolve = sglang_args(argv)
    resolve()
    assert settings.current().cpu  # the fixture prepared the CPU runtime
    missing = missing_settings(_resolved(server_args))
    assert [m.flag for m in missing] == ["--disable-hybrid-swa-memory"], missing
    assert "sliding-window" in missing[0].reason
    # The embedded GLM model has no sliding-window layers: nothing to add.
    plain, resolve = sglang_args(["--model-path", _embedded(), "--enable-return-routed-experts", "--device", "cpu",
                                  "--attention-backend", "torch_native", "--disable-overlap-schedule",
                                  "--disable-cuda-graph"])
    resolve()
    assert missing_settings(_resolved(plain)) == []


def _embedded() -> str:
    from sglang_r3.dev.embedded import ensure_embedded_model

    return str(ensure_embedded_model())


# -- checkpoints SGLang cannot build as written ----------------------------------------------------------


def _qwen_hybrid_save(tmp_path, arch: str):
    """A config as transformers' own class saves it (architectures set as a model save writes them): no weights,
    start-up's raw pass reads config.json before anything loads."""
    import json

    import transformers

    small = dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                 num_experts_per_tok=2, vocab_size=128, head_dim=16)
    if arch == "Qwen3NextForCausalLM":
        config = transformers.Qwen3NextConfig(**small)
    else:
        config = transformers.Qwen3_5MoeConfig(text_config=small)
    config.architectures = [arch]
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    return config, saved


@pytest.mark.parametrize("arch", ["Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration"])
def test_a_transformers_saved_qwen_hybrid_without_full_attention_interval_is_refused_naming_the_key(
        sglang_args, tmp_path, arch):
    import json

    from sglang.srt.configs.qwen3_next import HybridLayerType
    from sglang.srt.configs.qwen3_next import Qwen3NextConfig as SGLangQwen3NextConfig

    config, saved = _qwen_hybrid_save(tmp_path, arch)
    text = saved.get("text_config", saved)
    assert "full_attention_interval" not in text and text["layer_types"][3] == "full_attention"
    # SGLang's own config class (every Qwen3.5 text config subclasses it) cannot give its layer types: the
    # scheduler would stop here after start-up accepted the checkpoint.
    with pytest.raises(AttributeError, match="full_attention_interval"):
        SGLangQwen3NextConfig(**{k: v for k, v in text.items() if k != "model_type"}).layers_block_type
    where = "text_config." if "text_config" in saved else ""
    err = _refusal(sglang_args, ["--model-path", str(tmp_path)])
    assert set(err.flags) == {f"--model-path {tmp_path}"}, str(err)
    assert f'add "{where}full_attention_interval": 4' in str(err) and arch in str(err), str(err)
    # The key as the refusal says: SGLang's layers are transformers' layer types, and the check passes.
    text["full_attention_interval"] = 4
    (tmp_path / "config.json").write_text(json.dumps(saved))
    sg = SGLangQwen3NextConfig(**{k: v for k, v in text.items() if k != "model_type"})
    names = {"full_attention": HybridLayerType.full_attention.value,
             "linear_attention": HybridLayerType.linear_attention.value}
    assert sg.layers_block_type == [names[t] for t in (config.text_config if where else config).layer_types]
    from sglang_r3.serving.refusals.startup import _checkpoint

    hits = list(_checkpoint(types.SimpleNamespace(model_path=str(tmp_path)), None, resolved=False))
    # (the VL wrapper's vision_config has its own published key: the next test)
    assert [h for h in hits if "full_attention_interval" in str(h)] == []


def test_a_transformers_saved_qwen3_next_with_its_rope_base_only_in_rope_parameters_is_refused(sglang_args, tmp_path):
    import json

    from sglang.srt.configs.qwen3_next import Qwen3NextConfig as SGLangQwen3NextConfig

    config, saved = _qwen_hybrid_save(tmp_path, "Qwen3NextForCausalLM")
    saved["full_attention_interval"] = 4  # the other published key, so only this one is missing
    saved["rope_parameters"] = {**saved["rope_parameters"], "rope_theta": 1000.0}
    saved.pop("rope_theta", None)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    # The oracle is SGLang's own config class: it keeps its default base, whatever rope_parameters says.
    assert SGLangQwen3NextConfig(**{k: v for k, v in saved.items() if k != "model_type"}).rope_theta == 10000.0
    err = _refusal(sglang_args, ["--model-path", str(tmp_path)])
    assert set(err.flags) == {f"--model-path {tmp_path}"} and 'add "rope_theta": 1000.0' in str(err), str(err)
    saved["rope_theta"] = 1000.0  # as the refusal says: SGLang's class now holds the checkpoint's base
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert SGLangQwen3NextConfig(**{k: v for k, v in saved.items() if k != "model_type"}).rope_theta == 1000.0
    from sglang_r3.serving.refusals.startup import _checkpoint

    hits = list(_checkpoint(types.SimpleNamespace(model_path=str(tmp_path)), None, resolved=False))
    assert [h for h in hits if "rope_theta" in str(h)] == [], hits


def test_a_qwen3_next_whose_rope_sglang_and_transformers_read_apart_is_refused(sglang_args, tmp_path):
    # Held out: SGLang's Qwen3NextConfig reads the top-level rope_theta and rope_scaling only, transformers 5 its
    # rope_parameters. A base given both ways apart, or a scaling given only inside rope_parameters, was accepted.
    import json

    import transformers
    from sglang.srt.configs.qwen3_next import Qwen3NextConfig as SGLangQwen3NextConfig

    _, saved = _qwen_hybrid_save(tmp_path, "Qwen3NextForCausalLM")
    saved["full_attention_interval"] = 4
    saved.pop("rope_scaling", None)
    cases = {
        "twice": dict(rope_theta=1000.0, rope_parameters={"rope_type": "default", "rope_theta": 50000.0}),
        "inside": dict(rope_theta=1000.0, rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0}),
    }
    for name, keys in cases.items():
        cfg = {**saved, **keys}
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        ours = SGLangQwen3NextConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
        theirs = transformers.Qwen3NextConfig.from_pretrained(tmp_path).rope_parameters
        # The oracles: the two config classes themselves disagree on the rotation
        if name == "twice":
            assert ours.rope_theta == 1000.0 and theirs["rope_theta"] == 50000.0, (ours.rope_theta, theirs)
        else:
            assert theirs["rope_type"] == "linear" and theirs["factor"] == 4.0, theirs
            assert not (getattr(ours, "rope_scaling", None) or {}).get("factor"), vars(ours).get("rope_scaling")
        err = _refusal(sglang_args, ["--model-path", str(tmp_path)])
        assert set(err.flags) == {f"--model-path {tmp_path}"}, (name, str(err))
        assert ("gives RoPE's base twice" if name == "twice" else "scales RoPE only inside rope_parameters") in str(err)


# arch -> transformers' config class (transformers 5.12.1 has no DeepSeek-V3.2 / GLM-5 class: skipped there)
_DEEPSEEK_LAYER_CLASSES = {"DeepseekV3ForCausalLM": "DeepseekV3Config", "DeepseekV2ForCausalLM": "DeepseekV2Config",
                           "DeepseekV32ForCausalLM": "DeepseekV32Config", "GlmMoeDsaForCausalLM": "GlmMoeDsaConfig"}


@pytest.mark.parametrize("arch", list(_DEEPSEEK_LAYER_CLASSES))
def test_a_transformers_saved_deepseek_without_moe_layer_freq_is_refused_naming_the_key(sglang_args, tmp_path,
                                                                                        arch):
    import inspect
    import json

    import transformers
    from sglang.srt.models.deepseek_v2 import DeepseekV2DecoderLayer

    cls = getattr(transformers, _DEEPSEEK_LAYER_CLASSES[arch], None)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {_DEEPSEEK_LAYER_CLASSES[arch]}")
    config = cls(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                 n_routed_experts=8, num_experts_per_tok=2, vocab_size=128, first_k_dense_replace=1)
    config.architectures = [arch]
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "moe_layer_freq" not in saved
    def is_sparse(config, i):  # 0.5.23: a static method over the config; 0.5.15.post1: a method reading self.config
        fn = DeepseekV2DecoderLayer._is_layer_sparse
        if next(iter(inspect.signature(fn).parameters)) == "self":
            return fn(types.SimpleNamespace(config=config), i, is_nextn=False)
        return fn(config, i, is_nextn=False)

    # The oracle is SGLang's own layer builder over that config: it stops there, after start-up would accept it.
    with pytest.raises(AttributeError, match="moe_layer_freq"):
        is_sparse(transformers.PretrainedConfig(**saved), 1)
    err = _refusal(sglang_args, ["--model-path", str(tmp_path)])
    assert set(err.flags) == {f"--model-path {tmp_path}"}, str(err)
    assert 'add "moe_layer_freq": 1' in str(err) and arch in str(err), str(err)
    # DeepseekV2MoE reads topk_method as unconditionally: transformers' V2 class saves it, the others do not.
    assert ("topk_method" in saved) == (arch == "DeepseekV2ForCausalLM")
    assert ('add "topk_method": "noaux_tc"' in str(err)) == ("topk_method" not in saved), str(err)
    # and scoring_func (its TopK's scores), which no transformers DeepSeek class declares: deepseek_v2.py, whose MoE
    # each of them builds (GLM-5's class subclasses its model), reads it unconditionally (read off its source), and
    # the refusal names the published value
    from sglang_r3.tools.config_keys import sglang_unconditional_keys

    assert "scoring_func" not in saved and "scoring_func" in sglang_unconditional_keys("DeepseekV2ForCausalLM")
    scores = "softmax" if arch == "DeepseekV2ForCausalLM" else "sigmoid"
    assert f'add "scoring_func": "{scores}"' in str(err), str(err)
    # The key as the refusal says: SGLang builds the layers transformers does, and the check passes.
    saved["moe_layer_freq"] = 1
    (tmp_path / "config.json").write_text(json.dumps(saved))
    sg = transformers.PretrainedConfig(**saved)
    # (transformers' DeepSeek-V2 / V3 make layer i MoE iff i >= first_k_dense_replace; V3.2 / GLM-5 by mlp_layer_types)
    theirs = [t == "sparse" for t in getattr(config, "mlp_layer_types", None) or
              ["sparse" if i >= config.first_k_dense_replace else "dense" for i in range(4)]]
    assert [is_sparse(sg, i) for i in range(4)] == theirs
    from sglang_r3.serving.refusals.startup import _checkpoint

    hits = list(_checkpoint(types.SimpleNamespace(model_path=str(tmp_path)), None, resolved=False))
    assert [h for h in hits if "moe_layer_freq" in str(h)] == [], hits


@pytest.mark.parametrize("arch", ["GlmMoeDsaForCausalLM", "Qwen3NextForCausalLM"])
def test_what_sglang_0_5_15_cannot_run_on_the_cpu_runtime_is_refused_there_before_it_stops(sglang_args, tmp_path,
                                                                                          arch):
    """0.5.15.post1's own CPU path stops a DSA model in its argument resolution (asking CUDA for a device capability)
    and a gated delta-net model at its first prefill: start-up refuses both there, naming the model. 0.5.23's CPU
    runtime serves them (tests/test_families.py), so it refuses neither."""
    import json

    import transformers

    if arch == "Qwen3NextForCausalLM":
        _qwen_hybrid_save(tmp_path, arch)
        saved = json.loads((tmp_path / "config.json").read_text())
        saved["full_attention_interval"] = 4  # as published: the only refusal left is the release's
        (tmp_path / "config.json").write_text(json.dumps(saved))
    else:
        config = transformers.GlmMoeDsaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                              n_routed_experts=8, num_experts_per_tok=2, vocab_size=128)
        config.architectures = [arch]
        config.save_pretrained(tmp_path)
        saved = json.loads((tmp_path / "config.json").read_text())
        # as published: the only refusal left is the release's
        saved.update(moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid")
        (tmp_path / "config.json").write_text(json.dumps(saved))
    flags = ["--model-path", str(tmp_path)]
    if _release() != "0.5.15.post1":
        from sglang_r3.serving.refusals.startup import _release_cpu_runtime

        cfg = types.SimpleNamespace(model_path=str(tmp_path), device="cpu")
        assert list(_release_cpu_runtime(cfg, None, resolved=False)) == []
        return
    err = _refusal(sglang_args, flags)
    assert err.flags == [f"--model-path {tmp_path}"], str(err)
    assert f"{arch}: SGLang 0.5.15.post1" in str(err) and "SGLang 0.5.23's CPU runtime" in str(err), str(err)
    from sglang_r3.dev.cpu import has_gpu

    if arch == "GlmMoeDsaForCausalLM" and not has_gpu():  # where SGLang stops without the refusal: its resolution
        from sglang_r3.serving.adapter.api import prepare_server_args

        _, resolve = prepare_server_args(resolve_argv(flags, cpu=True))
        with pytest.raises(RuntimeError, match="NVIDIA driver"):
            resolve()


def test_a_hub_id_in_the_hub_cache_is_checked_as_its_folder_is(sglang_args, tmp_path):
    """A Hub id whose config.json is in the Hub cache (laid out as huggingface_hub writes it; ``--download-dir`` is
    the cache SGLang loads from) is read from there; one not in the cache passes to SGLang, which fetches it."""
    from huggingface_hub import try_to_load_from_cache

    saved_dir = tmp_path / "save"
    _, saved = _qwen_hybrid_save(saved_dir, "Qwen3NextForCausalLM")
    cache, revision = tmp_path / "hub", "0123456789abcdef0123456789abcdef01234567"
    snapshot = cache / "models--acme--qwen3-next-tiny" / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((saved_dir / "config.json").read_text())
    (cache / "models--acme--qwen3-next-tiny" / "refs").mkdir()
    (cache / "models--acme--qwen3-next-tiny" / "refs" / "main").write_text(revision)
    assert try_to_load_from_cache("acme/qwen3-next-tiny", "config.json", cache_dir=cache) == str(snapshot / "config.json")
    err = _refusal(sglang_args, ["--model-path", "acme/qwen3-next-tiny", "--download-dir", str(cache)])
    # (on 0.5.15.post1's CPU runtime the same flag also carries the release's own refusal of Qwen3-Next)
    assert set(err.flags) == {"--model-path acme/qwen3-next-tiny"}, str(err)
    assert 'add "full_attention_interval": 4' in str(err), str(err)
    from sglang_r3.serving.refusals.startup import _checkpoint

    elsewhere = types.SimpleNamespace(model_path="acme/qwen3-next-tiny", download_dir=str(tmp_path / "empty"),
                                      revision=None)
    assert list(_checkpoint(elsewhere, None, resolved=False)) == []


def test_a_transformers_saved_qwen3_5_vl_without_deepstack_indexes_is_refused_naming_the_key(sglang_args, tmp_path):
    import json

    import transformers
    from sglang.srt.utils.hf_transformers_utils import get_config

    arch = "Qwen3_5MoeForConditionalGeneration"
    config, saved = _qwen_hybrid_save(tmp_path, arch)
    saved["text_config"]["full_attention_interval"] = 4  # the other published key, so only this one is missing
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert "deepstack_visual_indexes" not in saved["vision_config"]
    # transformers' Qwen3.5 has no deepstack; SGLang's own config class, reading the same file, builds Qwen3-VL's.
    assert not hasattr(transformers.AutoConfig.from_pretrained(tmp_path).vision_config, "deepstack_visual_indexes")
    assert get_config(str(tmp_path), trust_remote_code=False).vision_config.deepstack_visual_indexes == [8, 16, 24]
    err = _refusal(sglang_args, ["--model-path", str(tmp_path)])
    assert set(err.flags) == {f"--model-path {tmp_path}"}, str(err)  # (0.5.15.post1: its own refusal of Qwen3.5 too)
    assert 'add "vision_config.deepstack_visual_indexes": []' in str(err) and arch in str(err), str(err)
    # The key as the refusal says (a new folder: SGLang caches configs by path): no deepstack, and the check passes.
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    saved["vision_config"]["deepstack_visual_indexes"] = []
    (fixed / "config.json").write_text(json.dumps(saved))
    assert get_config(str(fixed), trust_remote_code=False).vision_config.deepstack_visual_indexes == []
    from sglang_r3.serving.refusals.startup import _checkpoint

    assert list(_checkpoint(types.SimpleNamespace(model_path=str(fixed)), None, resolved=False)) == []


def _glm5_save(tmp_path, **keys):
    """A GLM-5 (DSA) config as transformers' own class saves it, with the published keys its class does not
    define: no weights (start-up resolves the config only)."""
    import json

    import transformers

    config = transformers.GlmMoeDsaConfig(
        num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
        n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, index_head_dim=128, index_n_heads=4,
        max_position_embeddings=512, **keys)
    config.architectures = ["GlmMoeDsaForCausalLM"]
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved.update(moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid")
    (tmp_path / "config.json").write_text(json.dumps(saved))


@pytest.mark.skipif(_release() == "0.5.15.post1", reason="SGLang 0.5.15's DSA resolution asks the CUDA device "
                    "(torch.cuda.get_device_capability): start-up refuses DSA models on its CPU runtime outright "
                    "(test_what_sglang_0_5_15_cannot_run_on_the_cpu_runtime_is_refused_there_before_it_stops)")
def test_a_dsa_model_on_the_cpu_runtime_is_refused_a_context_longer_than_index_topk(tmp_path):
    # The CPU runtime attends to every key (cpu_runtime/ops/dsa.py): DSA's result only up to index_topk keys. Launched
    # as users launch it: the CPU runtime's hooks (its DSA start-up among them) install in the launcher's process.
    _glm5_save(tmp_path, index_topk=64)
    proc = subprocess.run([sys.executable, "-m", "sglang_r3.launch_server", "--model-path", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    # 512: SGLang's own context length for the config (max_position_embeddings), named as the flag that sets it.
    assert "  --context-length 512: " in proc.stderr, proc.stderr[-3000:]
    assert "index_topk=64" in proc.stderr and "--context-length 64 or less" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_a_transformers_saved_step3p5_is_refused_naming_the_keys_sglang_reads_in_the_releases_spelling(sglang_args,
                                                                                                       tmp_path):
    # transformers 5.19 reads model_type step3p5 with Step3p7TextConfig and saves its own spelling (n_routed_experts,
    # mlp_layer_types, rope_parameters, swiglu_limits: null, ...); SGLang's own Step3p5Config reads the release's.
    import json

    import transformers

    cls = getattr(transformers, "Step3p7TextConfig", None)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no Step3p7TextConfig")
    from sglang.srt.configs.step3p5 import Step3p5Config
    from sglang.srt.models.step3p5 import Step3p5DecoderLayer

    config = cls(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 n_routed_experts=8, num_experts_per_tok=2, vocab_size=288,
                 mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
    config.architectures = ["Step3p5ForCausalLM"]
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "step3p5" and "moe_layers_enum" not in saved and saved["swiglu_limits"] is None
    # The oracle is SGLang's own layer builder over that config: it stops there (its default enum is a tuple).
    with pytest.raises(AttributeError, match="split"):
        Step3p5DecoderLayer._is_moe_layer(Step3p5Config(**saved), 1)
    err = _refusal(sglang_args, ["--model-path", str(tmp_path)])
    for key, value in (("moe_layers_enum", '"3,4,...,44"'), ("moe_num_experts", "288"), ("rope_theta", "[10000.0]"),
                       ("use_head_wise_attn_gate", "true"), ("need_fp32_gate", "true")):
        assert f'add "{key}": {value}' in str(err), str(err)
    # With the release's keys (what the tests' checkpoint carries), a null clamp is still refused by the layout rule.
    from sglang_r3.core.layout import LayoutError, layout_from_hf_config
    from tests.family_specs.build import build
    from tests.family_specs.specs import SPECS

    published = json.loads((build(SPECS["step3p5"]) / "config.json").read_text())
    layout_from_hf_config(published)
    with pytest.raises(LayoutError, match="swiglu_limits=None"):
        layout_from_hf_config({**published, "swiglu_limits": None})


def test_the_deepseek_routers_start_up_refuses_are_sglangs_top_k_otherwise_than_transformers():
    # SGLang's own top-k functions (layers/moe/topk.py, what its TopK computes) against transformers' DeepSeek router
    # classes on the same gate logits: where start-up accepts a router (V3's noaux_tc, V2's greedy over every group),
    # the two choose the same experts; where it refuses (V3 with another topk_method: SGLang builds no correction
    # bias; V2's greedy over fewer groups than it has: SGLang keeps the best groups only), they do not.
    import torch
    import transformers
    from sglang.srt.layers.moe import topk as sglang_topk
    from transformers.models.deepseek_v2 import modeling_deepseek_v2
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    DeepseekV2TopkRouter = getattr(modeling_deepseek_v2, "DeepseekV2TopkRouter", None)
    if DeepseekV2TopkRouter is None:
        pytest.skip(f"transformers {transformers.__version__} has no DeepseekV2TopkRouter (5.19.0 has)")

    from sglang_r3.core.layout import LayoutError, layout_from_hf_config

    torch.manual_seed(0)
    tokens, experts, hidden, k = 64, 16, 32, 2
    x, weight, bias = torch.randn(tokens, hidden), torch.randn(experts, hidden) * 0.5, torch.randn(experts) * 0.3
    logits = x @ weight.t()

    def experts_of(ids):
        return ids.long().sort(-1).values

    def theirs(router_cls, **cfg):
        cfg = types.SimpleNamespace(num_experts_per_tok=k, num_experts=experts, num_local_experts=experts,
                                    hidden_size=hidden, routed_scaling_factor=1.0, **cfg)
        router = router_cls(cfg)
        router.weight.data = weight.clone()
        if hasattr(router, "e_score_correction_bias"):
            router.e_score_correction_bias.data = bias.clone()
        with torch.no_grad():
            return experts_of(router(x)[-1])

    v3 = theirs(DeepseekV3TopkRouter, n_group=4, topk_group=2, norm_topk_prob=True)
    _, biased = sglang_topk.biased_grouped_topk_impl(x, logits, bias, k, True, 4, 2)
    _, unbiased = sglang_topk.grouped_topk_gpu(x, logits, k, True, 4, 2)
    assert torch.equal(v3, experts_of(biased))  # noaux_tc: served
    assert (v3 != experts_of(unbiased)).any(-1).sum() > tokens // 4  # any other topk_method: refused below

    v2 = theirs(DeepseekV2TopkRouter, topk_method="greedy", n_group=4, topk_group=1)
    _, all_groups = sglang_topk.grouped_topk_gpu(x, logits, k, False, 4, 4)
    _, best_group = sglang_topk.grouped_topk_gpu(x, logits, k, False, 4, 1)
    assert torch.equal(v2, experts_of(all_groups))  # greedy over every group: served
    assert (v2 != experts_of(best_group)).any(-1).sum() > tokens // 4  # over fewer: refused below

    import json
    from pathlib import Path

    from tests.family_specs.specs import SPECS

    v3_published = json.loads((Path(__file__).parent / "data" / "configs" / "deepseek_v3.json").read_text())
    layout_from_hf_config(v3_published)
    with pytest.raises(LayoutError, match="topk_method='greedy'"):
        layout_from_hf_config({**v3_published, "topk_method": "greedy"})
    v2 = {**SPECS["deepseek_v2"].config, "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2"}
    layout_from_hf_config({**v2, "topk_method": "greedy", "n_group": 4, "topk_group": 4})
    layout_from_hf_config({**v2, "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 1})
    with pytest.raises(LayoutError, match="topk_method='greedy' with n_group=4, topk_group=1"):
        layout_from_hf_config({**v2, "topk_method": "greedy", "n_group": 4, "topk_group": 1})


def test_sglangs_fused_qk_norm_rope_on_a_yarn_qwen3_moe_is_refused_naming_the_flag(sglang_args, tmp_path):
    # Held out: Qwen3's model card turns YaRN on with factor 4 over 32768 of its 40960 positions. SGLang's fused
    # q/k-norm RoPE kernel (CUDA, --enable-fused-qk-norm-rope) takes its parameters from compute_yarn_parameters,
    # transformers from rope_parameters: the oracles are the two functions themselves.
    import json

    import transformers
    from sglang.srt.models.qwen3_moe import compute_yarn_parameters
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6}
    config = transformers.Qwen3MoeConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                                         vocab_size=128, max_position_embeddings=40960, rope_parameters=yarn)
    config.architectures = ["Qwen3MoeForCausalLM"]
    config.save_pretrained(tmp_path)
    ours = compute_yarn_parameters(config)
    _, theirs = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    assert ours[0] == 1.25 and abs(ours[3] - theirs) > 0.1, (ours, theirs)
    err = _refusal(sglang_args, ["--model-path", str(tmp_path), "--enable-fused-qk-norm-rope"])
    assert set(err.flags) == {"--enable-fused-qk-norm-rope"}, str(err)
    assert "compute_yarn_parameters" in str(err) and "(4.0)" in str(err), str(err)
    # Without the flag (the default), or without YaRN, nothing is refused for it.
    _check(sglang_args, ["--model-path", str(tmp_path)])
    saved = json.loads((tmp_path / "config.json").read_text())
    saved["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    _check(sglang_args, ["--model-path", str(tmp_path), "--enable-fused-qk-norm-rope"])
