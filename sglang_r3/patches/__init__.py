"""Everything that touches SGLang 0.5.23 internals lives in this package.

The next SGLang bump should only need changes here. ``plugin`` is registered
under SGLang's ``sglang.srt.plugins`` entry-point group, so SGLang calls it in
each of its processes; it is inert unless the process was started by
``sglang_r3.launch_server`` (which sets ``SGLANG_R3_ENABLED=1``).
"""

from __future__ import annotations

import os

_installed = set()


def plugin() -> None:
    # The launcher process installs its own set ("server") before SGLang loads plugins.
    if os.environ.get("SGLANG_R3_ENABLED") != "1" or "server" in _installed:
        return
    install(process="child")


def install(process: str) -> None:
    if process in _installed:
        return
    _installed.add(process)
    if os.environ.get("SGLANG_R3_CPU") == "1":
        from sglang_r3.patches.cpu import install_cpu_patches

        install_cpu_patches()
    # The TokenizerManager lives in the launcher's process for a server and in the caller's for an
    # in-process sglang.Engine: every output leaves through it, in every process kind.
    from sglang_r3.patches.responses import install_response_patches

    install_response_patches()
    # Requests are checked where they enter (the TokenizerManager, whichever process holds it),
    # so a bad field becomes a 400 instead of killing the scheduler.
    from sglang_r3.patches.input_guard import install_input_guard

    install_input_guard()
    if process == "server":
        from sglang_r3.patches.http import install_http_routes

        install_http_routes()
    else:
        from sglang_r3.patches.capture import install_capture_patches

        install_capture_patches()
