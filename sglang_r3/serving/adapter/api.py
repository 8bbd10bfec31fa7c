"""The SGLang names the rest of sglang-r3 calls: ``server/``, the launchers and the metrics probe.

No module outside this package imports SGLang; they call these instead, so the next SGLang bump
changes this package only, and every name used here is a ``uses`` entry of ``manifest.py`` (checked
by ``manifest.check`` and its test). Imports stay inside the functions: importing this module costs
nothing, and a process that never serves never loads SGLang's HTTP stack.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, FrozenSet, Sequence


# -- the HTTP app (server/) ------------------------------------------------------------------------

def tokenizer_manager():
    """The TokenizerManager behind SGLang's FastAPI app (in the server's HTTP process)."""
    from sglang.srt.entrypoints.http_server import get_global_state

    return get_global_state().tokenizer_manager


def generate_fields() -> FrozenSet[str]:
    """Field names of SGLang's ``GenerateReqInput`` (our /generate forwards only these)."""
    import dataclasses

    from sglang.srt.managers.io_struct import GenerateReqInput

    return frozenset(f.name for f in dataclasses.fields(GenerateReqInput))


def generate_request(fields: Dict[str, Any]):
    """SGLang's request object for ``/generate`` (TypeError for a malformed field, as SGLang raises)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    return GenerateReqInput(**fields)


def contract_error(body: Dict[str, Any]):
    """The message of the first violation of the /generate body contract, or None: SGLang's own where the
    release has one, else the input guard's check of GenerateReqInput's declared types."""
    from sglang_r3.seam import release
    from sglang_r3.serving.refusals.input_guard import body_type_error

    return release.contract_error(body) if release.has_body_contract() else body_type_error(body)


def error_response(exc: Exception):
    """SGLang's own error response for a /generate that failed in the TokenizerManager."""
    from sglang.srt.entrypoints.http_server import _create_error_response

    return _create_error_response(exc)


def json_response(content: Any):
    """A JSON response serialized as SGLang serializes its own (orjson, numpy-aware)."""
    from sglang.srt.utils.json_response import orjson_response

    return orjson_response(content)


def dumps_json(content: Any) -> bytes:
    from sglang.srt.utils.json_response import dumps_json as dumps

    return dumps(content)


def capture_mode_request(code: int):
    """The ``/set_internal_state`` request that sets our capture knob (adapter/capture_site.py reads it)."""
    from sglang.srt.managers.io_struct import SetInternalStateReq

    return SetInternalStateReq(server_args={"sglang_r3_capture": code})


def admin_optional(endpoint: Callable) -> Callable:
    """SGLang's admin level for an endpoint: with --admin-api-key set, it needs that key."""
    from sglang.srt.utils.auth import AuthLevel, auth_level

    return auth_level(AuthLevel.ADMIN_OPTIONAL)(endpoint)


def app():
    """SGLang's FastAPI app (the one ``adapter/http.py`` mounts our routes on)."""
    from sglang.srt.entrypoints import http_server

    return http_server.app


# -- starting SGLang (launch_server.py, engine.py) ---------------------------------------------------

def load_plugins() -> None:
    from sglang.srt.plugins import load_plugins as load

    load()


def prepare_server_args(argv: Sequence[str]):
    """(SGLang's ServerArgs record as asked for, the call that resolves it): ``release.raw_server_args``."""
    from sglang_r3.seam.release import raw_server_args

    return raw_server_args(argv)


def run_server(server_args) -> None:
    from sglang.launch_server import run_server as run

    run(server_args)


def kill_children() -> None:
    """Kill every process this one started (SGLang's own clean-up after its server returns)."""
    import os

    from sglang.srt.utils import kill_process_tree

    kill_process_tree(os.getpid(), include_parent=False, wait_timeout=60)  # 0.5.15's default does not wait


def engine(server_args):
    """SGLang's in-process ``sglang.Engine``."""
    from sglang.srt.entrypoints.engine import Engine

    return Engine(server_args=server_args)


# -- observability (sglang_r3.serving.metrics) ---------------------------------------------------------------

def metrics_enabled() -> bool:
    """Whether this process serves SGLang's /metrics (--enable-metrics)."""
    from sglang_r3.seam.release import metrics_enabled as enabled

    try:
        return enabled()
    except Exception:  # noqa: BLE001 -- runtime context not published in this process
        return False


def cpu_rank_count(server_args) -> int:
    """Scheduler ranks SGLang's CPU runtime binds threads for (``release.cpu_rank_count``)."""
    from sglang_r3.seam.release import cpu_rank_count as count

    return count(server_args)
