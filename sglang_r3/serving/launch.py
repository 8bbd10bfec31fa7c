"""``python -m sglang_r3.launch_server [sglang flags...]``: SGLang's own launcher with routing capture.

Every ``sglang.launch_server`` flag passes through. With no ``--model-path`` it serves the embedded
default model; on a host without a GPU it prepares the CPU runtime and adds SGLang's CPU flags.
"""

from __future__ import annotations

import logging
import sys
from typing import List, Optional, Sequence

from sglang_r3.core import settings

logger = logging.getLogger("sglang_r3")

DEFAULT_ROUTING_FLAG = "--r3-default-routing"


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
        if value not in settings.DEFAULT_ROUTING_CHOICES:
            raise SystemExit(f"{DEFAULT_ROUTING_FLAG} must be one of {', '.join(settings.DEFAULT_ROUTING_CHOICES)}, "
                             f"got {value!r}")
    return out, value


def _has_flag(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def resolve_argv(argv: Sequence[str], *, cpu: bool) -> List[str]:
    """The sglang argv we actually launch with."""
    out = [a for a in argv if a != "--disable-speculation"]
    speculate = "--disable-speculation" not in argv
    if not _has_flag(out, "--model-path") and not _has_flag(out, "--model"):
        from sglang_r3.dev.embedded import default_speculative_flags, ensure_embedded_model

        out += ["--model-path", str(ensure_embedded_model())]
        if not _has_flag(out, "--dtype"):
            out += ["--dtype", "float32"]  # exact spec == non-spec equality
        if cpu and not _has_flag(out, "--max-total-tokens"):
            out += ["--max-total-tokens", "65536"]
        if speculate and not _has_flag(out, "--speculative-algorithm"):
            out += default_speculative_flags()
    for need in settings.flags_to_add(cpu=False):  # what capture needs everywhere (settings.CAPTURE_NEEDS)
        if not _has_flag(out, need.argv[0]):
            out += need.argv
    if cpu:  # the CPU runtime's needs, and its comfort flags
        from sglang_r3.dev.cpu import add_cpu_flags

        out = add_cpu_flags(out)
    return out


def prepare(argv: Sequence[str], process: Optional[str] = None):
    """SGLang's ServerArgs for our argv, checked against what capture supports.

    process: "server" installs our patches for an HTTP server first (the launch is ours: SGLang's plugin
    loader leaves this process alone); None is an in-process Engine, whose patches SGLang's plugin
    loader installs.
    """
    try:
        settings.current()
    except settings.SettingsError as exc:
        raise SystemExit(f"sglang-r3 refuses to start: {exc}") from None
    from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu

    cpu = not has_gpu()
    if cpu:
        activate_cpu_runtime()
    argv, default_routing = pop_default_routing(argv)
    # For the plugin in SGLang's processes (ENABLED) and server/request.py (DEFAULT_ROUTING).
    settings.publish({settings.ENABLED: "1"}, **({settings.DEFAULT_ROUTING: default_routing} if default_routing else {}))
    sglang_argv = resolve_argv(argv, cpu=cpu)
    from sglang_r3.serving.adapter import api
    from sglang_r3.serving.adapter.opt_in import begin_launch

    begin_launch("server" if process == "server" else "engine")
    if process is not None:
        from sglang_r3.serving.adapter import install
        from sglang_r3.seam.hooks import HookTargetError
        from sglang_r3.seam.release import UnsupportedRelease

        from sglang_r3.serving.plugin import rollout_api

        try:
            install(process=process, routes=rollout_api)
        except (HookTargetError, UnsupportedRelease) as exc:
            raise SystemExit(str(exc)) from None  # names each SGLang target that did not bind

    api.load_plugins()
    server_args, resolve = api.prepare_server_args(sglang_argv)
    from sglang_r3.serving.refusals.startup import UnsupportedConfigError, check_supported

    try:
        # Before SGLang starts any process: outside the capture envelope it would serve
        # wrong routing rows with HTTP 200. This also resolves server_args (run_server's own
        # resolution then returns at once).
        check_supported(server_args, argv=sglang_argv, resolve=resolve)
    except UnsupportedConfigError as exc:
        raise SystemExit(str(exc)) from None  # the message on stderr, exit status 1, no traceback
    if cpu:
        from sglang_r3.dev.cpu import bind_rank_threads

        bind_rank_threads(api.cpu_rank_count(server_args))
    return server_args


def main(argv: Optional[Sequence[str]] = None) -> None:
    server_args = prepare(list(sys.argv[1:] if argv is None else argv), process="server")
    from sglang_r3.serving.adapter import api

    try:
        api.run_server(server_args)
    finally:
        api.kill_children()


if __name__ == "__main__":
    main()
