"""Errors of the trainer side of R3."""

from __future__ import annotations


class ReplayError(ValueError):
    """Routing replay cannot be set up or driven as asked."""


class ModelMismatchError(ReplayError):
    """The trainer's Megatron model does not have the structure of the layout the records belong to."""
