"""One port per model family, named after its module in ``sglang_r3/core/families/``.
"""
