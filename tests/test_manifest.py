"""The adapter's manifest (sglang_r3/serving/patches/manifest.py) against the installed SGLang.

Every hook, instance patch, route change and private name we touch is listed with the shape it was
written against; a target that is gone or changed stops start-up naming it. The checks run in fresh
processes: the plugin's hook list is process-global, and start-up is what is being tested.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.sglang

TARGET = "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments"


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SGLANG_R3_ENABLED": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_target_of_the_manifest_is_as_written_against_in_the_installed_sglang():
    r = subprocess.run([sys.executable, "-m", "sglang_r3.serving.patches.manifest"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CHANGED" not in r.stdout


def test_the_plugin_starts_and_every_hook_it_registers_is_in_the_manifest():
    r = _run("""
        import sglang_r3.serving.patches as p
        from sglang_r3.serving.patches import hooks, manifest
        p.plugin()  # what SGLang's plugin loader calls in every process it starts
        got = hooks.registered()
        assert got and all(t in manifest.BY_TARGET for t in got), got
        print("REGISTERED", len(got))
    """)
    assert r.returncode == 0 and "REGISTERED" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("change,expect", [
    ("renamed", "has no attribute 'normalize_batch_and_arguments'"),
    ("signature", "signature changed: written against (self, strict)"),
    ("unlisted", "not listed in sglang_r3/serving/patches/manifest.py"),
])
def test_a_hook_target_that_is_renamed_changed_or_unlisted_stops_start_up_naming_it(change, expect):
    r = _run(f"""
        import dataclasses
        from sglang_r3.serving.patches import manifest
        target = {TARGET!r}
        entry = manifest.BY_TARGET.pop(target)
        if {change!r} == "renamed":  # SGLang renamed the method our hook is written for
            from sglang.srt.managers.io_struct import GenerateReqInput
            GenerateReqInput.normalize_batch_and_argumentz = GenerateReqInput.normalize_batch_and_arguments
            del GenerateReqInput.normalize_batch_and_arguments
            manifest.BY_TARGET[target] = entry
        elif {change!r} == "signature":  # the manifest records another shape than the installed one
            manifest.BY_TARGET[target] = dataclasses.replace(entry, signature="(self, strict)")
        import sglang_r3.serving.patches as p
        p.plugin()
        print("STARTED")
    """)
    assert r.returncode != 0 and "STARTED" not in r.stdout, r.stdout + r.stderr
    assert "sglang-r3 refuses to start" in r.stderr and TARGET in r.stderr and expect in r.stderr, r.stderr


USES = "sglang.srt.managers.io_struct.SetInternalStateReq"  # POST /routing/capture builds it (patches/api.py)


@pytest.mark.parametrize("launch", ["our launcher", "SGLang's own launcher"])
def test_a_used_sglang_name_that_is_gone_stops_start_up_naming_it(launch):
    # What our routes and launch path call (kind "uses") is checked in the launching process too: without
    # it the server would start, and /routing/capture would fail at its first call.
    r = _run(f"""
        import sys
        from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu
        if not has_gpu():
            activate_cpu_runtime()
        from sglang.srt.managers import io_struct
        del io_struct.SetInternalStateReq  # as if SGLang renamed it
        if {launch!r} == "our launcher":
            from sglang_r3.serving.launch import prepare
            prepare(["--model-path", "unused"], process="server")
        else:
            from sglang_r3.serving.patches.hooks import HookTargetError
            from sglang_r3.serving.patches.opt_in import refuse_unsupported_before_sglangs_checks
            try:
                refuse_unsupported_before_sglangs_checks(None)
            except HookTargetError as err:
                sys.exit(str(err))
        print("STARTED")
    """)
    assert r.returncode != 0 and "STARTED" not in r.stdout, r.stdout + r.stderr
    assert "sglang-r3 refuses to start" in r.stderr and USES in r.stderr, r.stderr[-3000:]
