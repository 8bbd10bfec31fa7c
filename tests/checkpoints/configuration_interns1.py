"""A STAND-IN for the config code Intern-S1 ships on the Hub (``configuration_interns1.py``, loaded with
``--trust-remote-code``), which cannot be fetched on a host without the Hub.

The release's classes are transformers' InternVL config classes under their own model types: ``InternS1Config``
(``model_type: interns1``: vision_config; text_config, built by its model_type -- Qwen3-MoE for Intern-S1; and
image_token_id, image_seq_length, downsample_ratio, projector_hidden_act, vision_feature_layer,
vision_feature_select_strategy, with InternVLConfig's defaults) and ``InternS1VisionConfig``
(``model_type: interns1_vision``, InternVLVisionConfig's fields and defaults). So these are transformers' classes,
renamed: SGLang's interns1.py reads the same attributes from either, and the tests' oracle is transformers'
InternVLForConditionalGeneration over the same checkpoint. Routing is not touched here.
"""

from transformers import InternVLConfig, InternVLVisionConfig


class InternS1VisionConfig(InternVLVisionConfig):
    model_type = "interns1_vision"


class InternS1Config(InternVLConfig):
    model_type = "interns1"
    sub_configs = {**InternVLConfig.sub_configs, "vision_config": InternS1VisionConfig}

    def __post_init__(self, **kwargs):
        if isinstance(self.vision_config, dict) or self.vision_config is None:
            self.vision_config = InternS1VisionConfig(**(self.vision_config or {}))
        super().__post_init__(**kwargs)
