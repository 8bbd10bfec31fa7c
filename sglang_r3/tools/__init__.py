"""Offline tools over records (``python -m sglang_r3.tools.report``)."""
