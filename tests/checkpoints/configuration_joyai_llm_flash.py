"""A STAND-IN for the config class behind JoyAI-LLM-Flash's ``model_type: joyai_llm_flash``, which is the release's
own code (loaded with ``--trust-remote-code``) and was not read here: no host of this project reaches the Hub.

What is known of the release: its architecture is DeepSeek-V3's (``DeepseekV3ForCausalLM``; radixark/miles issue
606), and Miles converts it with mbridge's ``DeepseekV3Bridge`` registered under this model type
(``miles_plugins/mbridge/joyai_llm_flash.py``), which reads DeepSeek-V3's config keys. So the stand-in is
transformers' DeepseekV3Config under that model type. Routing is not touched here.
"""

from transformers import DeepseekV3Config


class JoyAILLMFlashConfig(DeepseekV3Config):
    model_type = "joyai_llm_flash"
