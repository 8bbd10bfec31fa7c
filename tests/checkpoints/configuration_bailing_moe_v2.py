"""A STAND-IN for the config class behind Ling / Ring 2.0's ``BailingMoeV2ForCausalLM`` (``model_type: bailing_moe``,
``auto_map`` AutoConfig ``configuration_bailing_moe_v2.BailingMoeV2Config``), which is the release's own code
(inclusionAI/Ling-V2, models/configuration_bailing_moe_v2.py) and which a host without the Hub cannot fetch. Its text
is not copied here: this class takes the release class's keywords with its defaults (read at af8837e), keeps each
as given, and derives what it derives (head_dim from the widths when null); other keys go to PretrainedConfig as
they do there. Served with ``--trust-remote-code``, as the release is.
"""

from transformers import PretrainedConfig


class BailingMoeV2Config(PretrainedConfig):
    model_type = "bailing_moe"

    def __init__(self, vocab_size=157184, hidden_size=2048, intermediate_size=5120, num_hidden_layers=20,
                 num_attention_heads=16, num_key_value_heads=4, hidden_act="silu", use_qkv_bias=False, use_bias=False,
                 rms_norm_eps=1e-06, tie_word_embeddings=False, embedding_dropout=0.0, attention_dropout=0.0,
                 output_dropout=0.0, initializer_range=0.02, max_position_embeddings=32768, rope_theta=600000.0,
                 use_cache=True, max_window_layers=20, rope_scaling=None, pad_token_id=156892, eos_token_id=156892,
                 num_experts=256, num_shared_experts=1, num_experts_per_tok=8, n_group=8, topk_group=4,
                 moe_intermediate_size=512, first_k_dense_replace=1, head_dim=128, output_router_logits=False,
                 use_qk_norm=True, num_nextn_predict_layers=0, mtp_loss_scaling_factor=0,
                 moe_router_enable_expert_bias=True, routed_scaling_factor=1.0, **kwargs):
        own = dict(locals())
        for key in ("self", "kwargs", "__class__", "tie_word_embeddings", "pad_token_id", "eos_token_id"):
            own.pop(key, None)
        for key, value in own.items():
            setattr(self, key, value)
        self.head_dim = head_dim or hidden_size // num_attention_heads
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)
