"""``python -m benchmarks.plain_server [flags]``: the capture-overhead baseline -- SGLang with R3 not installed.

It launches SGLang's own ``run_server`` with exactly the argv our launcher resolves
(``sglang_r3.serving.launch.resolve_argv``: embedded model, dtype, speculative flags, CPU flags such as
``--sleep-on-idle``) minus ``--enable-return-routed-experts``, so SGLang builds no capturer at all and no
sglang-r3 patch is installed: no capture hooks, no draft wrappers, no response hooks, no routes.
``SGLANG_R3_ENABLED`` stays unset, so our SGLang plugin is inert in every process.

On a CPU-only host the CPU runtime is the one thing it shares with ours, because SGLang cannot run
there without it: the libcuda stub, and ``sglang_r3.cpu_runtime`` (torch versions of sgl-kernel's CPU
speculative ops, TARGET_VERIFY for torch_native attention, gloo process groups for several ranks).

``--upstream-capture`` keeps ``--enable-return-routed-experts``: SGLang's own ``RoutedExpertsCapturer``
then fills ``routed_experts`` (the tests' oracle for what plain SGLang returns in a configuration). SGLang starts its scheduler with the
``spawn`` start method, which re-imports this module in each child as ``__mp_main__``; the import below
installs the CPU patches there too.
"""

from __future__ import annotations

import os
import sys

from sglang_r3.core import settings

_here = settings.parse(os.environ)  # this process's own (a spawned child's: what the parent published)
if _here.cpu and not _here.enabled:
    from sglang_r3.cpu_runtime import install_cpu_patches

    install_cpu_patches()


def main() -> None:
    from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu
    from sglang_r3.serving.launch import resolve_argv

    os.environ.pop(settings.ENABLED, None)
    cpu = not has_gpu()
    if cpu:
        activate_cpu_runtime()
        from sglang_r3.cpu_runtime import install_cpu_patches

        install_cpu_patches()
    upstream = "--upstream-capture" in sys.argv[1:]
    argv = resolve_argv([a for a in sys.argv[1:] if a != "--upstream-capture"], cpu=cpu)
    if not upstream:
        argv = [a for a in argv if a != "--enable-return-routed-experts"]
    from sglang.launch_server import run_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    server_args = prepare_server_args(argv)
    if cpu:
        from sglang_r3.dev.cpu import bind_rank_threads
        from sglang_r3.serving.adapter.api import cpu_rank_count

        bind_rank_threads(cpu_rank_count(server_args))
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
