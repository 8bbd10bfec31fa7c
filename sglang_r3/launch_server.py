"""``python -m sglang_r3.launch_server [sglang flags...]``

SGLang's own launcher with routing capture installed. Every
``sglang.launch_server`` flag passes through. With no ``--model-path`` it
serves the embedded default model; on a host without a GPU it prepares the
CPU runtime and adds SGLang's CPU flags.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import List, Optional, Sequence

logger = logging.getLogger("sglang_r3")

ENABLE_ENV = "SGLANG_R3_ENABLED"
DEFAULT_ROUTING_ENV = "SGLANG_R3_DEFAULT_ROUTING"
DEFAULT_ROUTING_FLAG = "--r3-default-routing"
DEFAULT_ROUTING_CHOICES = ("main", "main+mtp", "ref")  # ref: a handle into the fleet's record store


def pop_default_routing(argv: Sequence[str]) -> tuple:
    """(argv without our ``--r3-default-routing X``, X or None).

    Gateways that re-serialize requests through their own schema (sglang-router) drop
    ``return_routing``; a server started with this flag returns routing for every /generate
    request that does not say otherwise, so routing survives such a gateway.
    """
    out, value, it = [], None, iter(argv)
    for a in it:
        if a == DEFAULT_ROUTING_FLAG:
            value = next(it, None)
        elif a.startswith(DEFAULT_ROUTING_FLAG + "="):
            value = a.split("=", 1)[1]
        else:
            out.append(a)
            continue
        if value not in DEFAULT_ROUTING_CHOICES:
            raise SystemExit(f"{DEFAULT_ROUTING_FLAG} must be one of {', '.join(DEFAULT_ROUTING_CHOICES)}, got {value!r}")
    return out, value


def _has_flag(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def resolve_argv(argv: Sequence[str], *, cpu: bool) -> List[str]:
    """The sglang argv we actually launch with."""
    out = [a for a in argv if a != "--disable-speculation"]
    speculate = "--disable-speculation" not in argv
    if not _has_flag(out, "--model-path") and not _has_flag(out, "--model"):
        from sglang_r3.embedded import default_speculative_flags, ensure_embedded_model

        out += ["--model-path", str(ensure_embedded_model())]
        if not _has_flag(out, "--dtype"):
            out += ["--dtype", "float32"]  # exact spec == non-spec equality
        if cpu and not _has_flag(out, "--max-total-tokens"):
            out += ["--max-total-tokens", "65536"]
        if speculate and not _has_flag(out, "--speculative-algorithm"):
            out += default_speculative_flags()
    if not _has_flag(out, "--enable-return-routed-experts"):
        # Turns on SGLang's per-request plumbing; our capturer replaces upstream's.
        out.append("--enable-return-routed-experts")
    if cpu:
        from sglang_r3.cpu import add_cpu_flags

        out = add_cpu_flags(out)
    return out


def prepare(argv: Sequence[str], process: Optional[str] = None):
    """SGLang's ServerArgs for our argv, checked against what capture supports.

    process: install our patches for this process kind first ("server" mounts the HTTP
    routes); None leaves it to SGLang's plugin loader (an in-process Engine).
    """
    from sglang_r3.cpu import activate_cpu_runtime, has_gpu

    cpu = not has_gpu()
    if cpu:
        activate_cpu_runtime()
    os.environ[ENABLE_ENV] = "1"  # read by the plugin in SGLang's child processes
    argv, default_routing = pop_default_routing(argv)
    if default_routing:
        os.environ[DEFAULT_ROUTING_ENV] = default_routing  # read by server/request.py
    sglang_argv = resolve_argv(argv, cpu=cpu)
    from sglang_r3.patches import api

    if process is not None:
        from sglang_r3.patches import install
        from sglang_r3.patches.hooks import HookTargetError

        from sglang_r3.plugin import rollout_api

        try:
            install(process=process, routes=rollout_api)
        except HookTargetError as exc:
            raise SystemExit(str(exc)) from None  # names each SGLang target that did not bind

    api.load_plugins()
    server_args = api.prepare_server_args(sglang_argv)
    from sglang_r3.patches.startup_checks import UnsupportedConfigError, check_supported

    try:
        # Before SGLang starts any process: outside the capture envelope it would serve
        # wrong routing rows with HTTP 200. This also resolves server_args (run_server's own
        # resolve_once then returns at once).
        check_supported(server_args, argv=sglang_argv)
    except UnsupportedConfigError as exc:
        raise SystemExit(str(exc)) from None  # the message on stderr, exit status 1, no traceback
    if cpu:
        from sglang_r3.cpu import bind_rank_threads

        bind_rank_threads(api.cpu_rank_count(server_args))
    return server_args


def main(argv: Optional[Sequence[str]] = None) -> None:
    server_args = prepare(list(sys.argv[1:] if argv is None else argv), process="server")
    from sglang_r3.patches import api

    try:
        api.run_server(server_args)
    finally:
        api.kill_children()


if __name__ == "__main__":
    main()
