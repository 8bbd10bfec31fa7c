"""Start SGLang exactly as slime does, in this process's child: ``python tests/scripts/slime_launch.py PORT [JSON]``.

A stand-in for slime's rollout engine actor (slime is not on PyPI), written from the public source at
THUDM/slime 624b824, ``slime/backends/sglang_utils/sglang_engine.py``:

* ``_compute_server_args`` builds a ``ServerArgs`` keyword dict: the checkpoint, ``trust_remote_code``,
  a seed, host/port/nccl_port, one node, ``dist_init_addr``, GPU placement, parallel sizes 1,
  ``skip_server_warmup``, ``enable_draft_weights_cpu_backup``, ``enable_metrics``, and
  ``enable_return_routed_experts`` when ``--use-rollout-routing-replay`` is on; then every
  ``--sglang-*`` argument (here: JSON on the command line, e.g. the speculative or CPU settings).
* ``launch_server_process`` drops the CUDA allocator options from the environment, forces the
  ``spawn`` start method, strips brackets off the host and runs
  ``multiprocessing.Process(target=sglang.srt.entrypoints.http_server.launch_server,
  args=(ServerArgs(**kwargs),))``.

* PD disaggregation (``_compute_server_args``' ``worker_type``): a prefill worker gets ``disaggregation_mode
  prefill``, ``load_balance_method follow_bootstrap_room`` and its bootstrap port; a decode worker
  ``disaggregation_mode decode`` and ``prefill_round_robin_balance``, a key neither SGLang 0.5.15.post1 nor 0.5.23
  has: slime drops every key ``ServerArgs`` lacks ("for compatibility with old args"), and so does this script.
  ``python tests/scripts/slime_launch.py PORT JSON prefill|decode [BOOTSTRAP_PORT]``.

slime then polls ``/health_generate`` (the test does that). This process waits for its child and
exits with the child's exit status, so a start-up refusal is seen as slime sees it: the child dies.
Kept out: slime's memory saver (``enable_memory_saver`` needs CUDA; slime sets it only with
``--offload-rollout``) and Ray.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys


def slime_server_kwargs(port: int, nccl_port: int, model_path: str, overrides: dict) -> dict:
    host = "127.0.0.1"
    kwargs = {
        "model_path": model_path,
        "trust_remote_code": True,
        "random_seed": 1234,  # slime: args.seed + rank * num_gpus_per_node
        "enable_memory_saver": False,
        "host": host,
        "port": port,
        "nccl_port": nccl_port,
        "nnodes": 1,
        "node_rank": 0,
        "dist_init_addr": f"{host}:{nccl_port + 1}",
        "gpu_id_step": 1,
        "base_gpu_id": 0,
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "ep_size": 1,
        "skip_server_warmup": True,
        "enable_draft_weights_cpu_backup": True,
        "enable_metrics": True,
        "enable_return_routed_experts": True,  # slime: if args.use_rollout_routing_replay
    }
    kwargs.update(overrides)  # slime: the --sglang-* arguments, applied after the base ones
    return kwargs


def slime_worker_kwargs(worker_type: str, bootstrap_port) -> dict:
    """What slime's ``_compute_server_args`` adds for a PD worker (THUDM/slime 624b824)."""
    if worker_type == "prefill":
        assert bootstrap_port is not None, "disaggregation_bootstrap_port must be set for prefill worker"
        return {"disaggregation_mode": "prefill", "load_balance_method": "follow_bootstrap_room",
                "disaggregation_bootstrap_port": int(bootstrap_port)}
    if worker_type == "decode":
        return {"disaggregation_mode": "decode", "prefill_round_robin_balance": True}
    return {}


def drop_unknown_keys(kwargs: dict) -> dict:
    """slime's ``_compute_server_args`` pops every key ``ServerArgs`` has no field for, logging it."""
    import dataclasses

    from sglang.srt.server_args import ServerArgs

    # slime reads dataclasses.fields(ServerArgs), a dataclass on 0.5.15.post1; 0.5.23's is a msgspec Struct, on which
    # that raises TypeError: its __struct_fields__ are the same names.
    if dataclasses.is_dataclass(ServerArgs):
        fields = {f.name for f in dataclasses.fields(ServerArgs)}
    else:
        fields = set(ServerArgs.__struct_fields__)
    unused = set(kwargs) - fields
    if unused:
        print(f"Warning: The following arguments is not supported in the current sglang: {unused}.", flush=True)
    return {k: v for k, v in kwargs.items() if k in fields}


def launch_server_process(server_args) -> multiprocessing.Process:
    from sglang.srt.entrypoints.http_server import launch_server

    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    os.environ.pop("PYTORCH_ALLOC_CONF", None)
    multiprocessing.set_start_method("spawn", force=True)
    server_args.host = server_args.host.strip("[]")
    p = multiprocessing.Process(target=launch_server, args=(server_args,))
    p.start()
    return p


if __name__ == "__main__":
    from sglang.srt.server_args import ServerArgs

    from sglang_r3.dev.embedded import ensure_embedded_model
    from sglang_r3.serving.fleet.gateway import free_port

    port = int(sys.argv[1])
    overrides = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    worker_type = sys.argv[3] if len(sys.argv) > 3 else "regular"
    pd = slime_worker_kwargs(worker_type, sys.argv[4] if len(sys.argv) > 4 else None)
    # slime: the worker's keys, then R3's, then the --sglang-* overrides
    kwargs = slime_server_kwargs(port, free_port(), str(ensure_embedded_model()), {**pd, **overrides})
    # An override of None drops the key (SGLang's default), e.g. a slime run without R3 on.
    kwargs = drop_unknown_keys({k: v for k, v in kwargs.items() if v is not None})
    proc = launch_server_process(ServerArgs(**kwargs))
    proc.join()
    print(f"slime_launch: server process exited with {proc.exitcode}", flush=True)
    sys.exit(0 if proc.exitcode == 0 else 1)
