"""The one capturer of this scheduler process, where the installed SGLang holds it.

Shared by the capture and draft patches (both import it; neither imports the other's module).
"""

from __future__ import annotations

from sglang_r3.serving.capture import RoutingCapturer
from sglang_r3.core.layout import ModelLayout, layout_from_hf_config


def capturer():
    # Called for every router of every forward: no imports on this path.
    cap = _experts_capturer()
    return cap if isinstance(cap, RoutingCapturer) else None


def _experts_capturer():
    global _experts_capturer
    from sglang_r3.seam.release import experts_capturer_getter

    _experts_capturer = experts_capturer_getter()  # where the installed release keeps it, bound once
    return _experts_capturer()


_layouts: dict = {}


def layout_of(model_config) -> ModelLayout:
    """The layout of the model an SGLang ``ModelConfig`` describes (built once per model)."""
    key = id(model_config.hf_config)
    if key not in _layouts:
        # The config object SGLang's loader resolved (its config class: attribute maps, defaults;
        # --json-model-override-args applied), read as that class resolves it: the layout and
        # fingerprint the trainer computes from the checkpoint's config.json however it is spelled.
        _layouts[key] = layout_from_hf_config(_loaded_hf_config(model_config))
    return _layouts[key]


def _loaded_hf_config(model_config):
    """``get_config``'s object for this model, not ``model_config.hf_config`` itself: ModelConfig
    writes serving-derived values back into its own copy (v_head_dim = head_dim when absent, the
    context length into max_position_embeddings, ...), which no checkpoint file says. get_config is
    cached and ModelConfig deep-copies what it returns, so this is the object it started from."""
    from sglang.srt.runtime_context import get_server_args
    from sglang.srt.utils.hf_transformers.config import get_config

    args = get_server_args()
    kwargs = {}
    config_file = getattr(args, "decrypted_config_file", None)
    if config_file and config_file.strip():
        kwargs["_configuration_file"] = config_file.strip()
    return get_config(
        model_config.model_path,
        trust_remote_code=args.trust_remote_code,
        revision=model_config.revision,
        model_override_args=model_config.model_override_args,
        model_config_parser=model_config.model_config_parser,
        **kwargs,
    )
