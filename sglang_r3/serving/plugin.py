"""The project's one entry point into SGLang: ``sglang.srt.plugins`` calls ``plugin`` in every SGLang
process (pyproject.toml). It hands the adapter (``sglang_r3.serving.adapter``) the rollout API it mounts where an
HTTP server is launched; inert unless capture is enabled (``settings.ENABLED``, see ``adapter/__init__.py``)."""

from __future__ import annotations


def rollout_api():
    """The rollout API's router (``server/routes.py``), imported only where it is mounted."""
    from sglang_r3_server.routes import router

    return router


def plugin() -> None:
    from sglang_r3.serving import adapter

    adapter.plugin(routes=rollout_api)
