"""Every route of the rollout API, in one router that ``adapter/http.py`` mounts on SGLang's app:
``/generate`` (``server/generate.py``) and ``/routing/*`` (``server/admin.py``)."""

from __future__ import annotations

from fastapi import APIRouter

from sglang_r3_server import admin, generate

router = APIRouter()
# The route objects themselves, not include_router: this FastAPI wraps an included router in one
# route, and adapter/http.py mounts each endpoint on the app by itself (see there why).
router.routes.extend([*generate.router.routes, *admin.router.routes])
