"""The one capturer of this scheduler process, as SGLang's runtime context holds it.

Shared by the capture and draft patches (both import it; neither imports the other's module).
"""

from __future__ import annotations

import os

from sglang_r3.capture import RoutingCapturer
from sglang_r3.layout import ModelLayout, layout_from_hf_config, layout_from_model_path


def capturer():
    # Called for every router of every forward: no imports on this path.
    cap = _get_resources().experts_capturer
    return cap if isinstance(cap, RoutingCapturer) else None


def _get_resources():
    global _get_resources
    from sglang.srt.runtime_context import get_resources

    _get_resources = get_resources
    return get_resources()


_layouts: dict = {}


def layout_of(model_config) -> ModelLayout:
    """The layout of the model an SGLang ``ModelConfig`` describes (built once per model)."""
    key = id(model_config.hf_config)
    if key not in _layouts:
        path = str(getattr(model_config, "model_path", "") or "")
        # The checkpoint's own config.json, as the trainer reads it (layout_from_model_path): the
        # fingerprint then covers exactly the values both sides see, not defaults transformers adds.
        if path and os.path.isfile(os.path.join(path, "config.json")):
            _layouts[key] = layout_from_model_path(path)
        else:
            _layouts[key] = layout_from_hf_config(model_config.hf_config)
    return _layouts[key]
