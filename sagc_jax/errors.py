"""Errors shared by the training loop and the rollout path."""

from __future__ import annotations


class TrainingError(RuntimeError):
    """A run cannot continue (non-finite loss, exhausted data...); the message says what was
    saved."""
