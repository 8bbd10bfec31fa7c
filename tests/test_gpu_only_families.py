"""The MoE families Miles' scripts train that sglang-r3 refuses at start-up because SGLang serves them on GPU kernels
only (DeepSeek-V4, Inkling): their refusal (sglang_r3/core/families/) says where plain SGLang 0.5.23 stops on the
CPU runtime, and this module checks it with SGLang itself as the oracle. Each tiny checkpoint is saved by
transformers 5.19's own class and launched with ``python -m sglang.launch_server`` (not ours, so no refusal of ours
runs first) on the CPU runtime's flags; each launch must stop, naming the SGLang call its refusal names. Should a
release serve one of them on the CPU, its test fails: the family then wants a rule proven by a served forward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List

import pytest

pytest.importorskip("sglang")

import torch  # noqa: E402

from sglang_r3.core.families import family_of  # noqa: E402
from sglang_r3.dev.cpu import CPU_SERVER_FLAGS, has_gpu  # noqa: E402
from sglang_r3.dev.cpu.bootstrap import EAGER_ENV, build_libcuda_stub  # noqa: E402
from sglang_r3.dev.embedded.tokenizer import write_tokenizer  # noqa: E402
from sglang_r3.serving.fleet.gateway import free_port, stop_process_group  # noqa: E402
from tests import children  # noqa: E402

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(has_gpu(), reason="where plain SGLang stops on the CPU runtime: a host without a GPU")]

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT_S = 400  # two SGLang imports (launcher and scheduler) and a load, beside the suite's servers


def _save(model, folder: Path) -> Path:
    model.save_pretrained(str(folder))
    write_tokenizer(folder)
    return folder


def _deepseek_v4(folder: Path) -> Path:
    """transformers' DeepseekV4ForCausalLM, tiny: a hash-routed MoE layer, then learned routers; both attention
    kinds (compressed sparse, heavily compressed); mHC with 2 streams; one MTP layer."""
    import transformers

    torch.manual_seed(0)
    config = transformers.DeepseekV4Config(
        vocab_size=512, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=1, head_dim=64, q_lora_rank=32, num_experts_per_tok=2, n_routed_experts=8,
        n_shared_experts=1, o_groups=2, o_lora_rank=32, index_n_heads=2, index_head_dim=32, index_topk=16,
        sliding_window=16, hc_mult=2, num_nextn_predict_layers=1, max_position_embeddings=4096,
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"])
    return _save(transformers.DeepseekV4ForCausalLM(config), folder)


def _deepseek_v4_sglang_keys(folder: Path) -> Path:
    """The same checkpoint with the keys SGLang's DeepSeekV4Config reads (configs/deepseek_v4.py) that
    transformers' save renames or leaves out: per-layer compression ratios (the MTP layer's last), the hash-layer
    count, the router's top-k method and groups, YaRN scaling with its original context."""
    _deepseek_v4(folder)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    ratios = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    config.update(
        compress_ratios=[ratios[t] for t in config["layer_types"]] + [0],
        n_hash_layers=config["mlp_layer_types"].count("hash_moe"), topk_method="noaux_tc", n_group=1, topk_group=1,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "beta_fast": 32,
                      "beta_slow": 1})
    path.write_text(json.dumps(config, indent=2))
    return folder


def _inkling(folder: Path) -> Path:
    """transformers' InklingForConditionalGeneration, tiny: three sliding / relative-bias layers, each MoE."""
    import transformers

    torch.manual_seed(0)
    text = dict(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=16,
                sliding_window_size=16, d_rel=4, rel_extent=32, intermediate_size=64, moe_intermediate_size=32,
                n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, max_position_embeddings=4096)
    config = transformers.InklingConfig(
        text_config=text, vision_config=dict(text_hidden_size=64, hidden_size=32, num_hidden_layers=1,
                                             num_attention_heads=2),
        audio_config=dict(text_hidden_size=64), image_token_id=500, audio_token_id=501, image_bos_token_id=502,
        audio_bos_token_id=503)
    return _save(transformers.InklingForConditionalGeneration(config), folder)


@dataclass(frozen=True)
class Launch:
    architecture: str
    build: Callable[[Path], Path]
    # Where SGLang stops, as its log shows it: each must be in the log, the first is what the refusal names.
    stops: List[str]


LAUNCHES: Dict[str, Launch] = {
    # SGLang's model config reads compress_ratios (model_config.py _derive_model_shapes), which transformers'
    # config class does not write: the checkpoint is not read at all.
    "deepseek_v4_as_transformers_saves_it": Launch(
        "DeepseekV4ForCausalLM", _deepseek_v4, ["compress_ratios", "_derive_model_shapes"]),
    # Read, built, and stopped at load: the mHC kernels compile for the CUDA device.
    "deepseek_v4": Launch("DeepseekV4ForCausalLM", _deepseek_v4_sglang_keys,
                          ["prewarm_mhc_pre", "_prewarm_mhc_kernels", "torch/cuda/__init__.py"]),
    # Stopped as SGLang resolves its arguments: inkling.py asks for the Mamba cache's extra buffer.
    "inkling": Launch("InklingForConditionalGeneration", _inkling,
                      ["validate_mamba_extra_buffer",
                       "extra_buffer requires platform support for Mamba cache state snapshots"]),
}


def _plain_sglang_env() -> Dict[str, str]:
    """SGLang on the CPU runtime without sglang-r3: the libcuda stand-in on the loader path, SGLang's CPU engine,
    torch.compile'd functions run eagerly (as our launcher runs them); sglang-r3 not opted in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_R3_")}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(build_libcuda_stub()), env.get("LD_LIBRARY_PATH")) if p)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env.setdefault(EAGER_ENV, "1")
    return env


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """Every launch started at once (each is mostly a SGLang import), then waited on: name -> (return code, log)."""
    env = _plain_sglang_env()
    started = {}
    for name, launch in LAUNCHES.items():
        folder = launch.build(tmp_path_factory.mktemp(name))
        log = open(folder / "launch.log", "w+")
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(folder), "--port", str(free_port()),
               *(arg for flag in CPU_SERVER_FLAGS for arg in flag), "--dtype", "float32", "--max-total-tokens",
               "4096", "--mem-fraction-static", "0.99"]
        # A session of its own, reaped with the run (tests/children.py).
        started[name] = (children.spawn(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env), log)
    results = {}
    try:
        for name, (proc, log) in started.items():
            try:
                code = proc.wait(timeout=LAUNCH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                code = None  # still running: it did not stop
            log.seek(0)
            results[name] = (code, log.read())
    finally:
        for proc, log in started.values():
            stop_process_group(proc)  # a launch that did not stop (the run reaps what a stopped one left)
            log.close()
    return results


@pytest.mark.parametrize("name", sorted(LAUNCHES))
def test_plain_sglang_stops_on_the_cpu_runtime_where_the_refusal_says(name, stopped):
    launch = LAUNCHES[name]
    code, log = stopped[name]
    assert code not in (None, 0), f"plain SGLang did not stop ({code}):\n{log[-4000:]}"
    for words in launch.stops:
        assert words in log, f"{words!r} not in SGLang's log:\n{log[-4000:]}"
    refusal = family_of(launch.architecture).refusal
    assert launch.stops[0] in refusal, refusal
