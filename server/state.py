"""What the routes read from the running server: SGLang's TokenizerManager and the served layout."""

from __future__ import annotations

from sglang_r3.core.layout import ModelLayout
from sglang_r3.serving.adapter import api
from sglang_r3.serving.adapter.outputs import served_layout


def tokenizer_manager():
    return api.tokenizer_manager()


def current_layout() -> ModelLayout:
    return served_layout(api.tokenizer_manager())
