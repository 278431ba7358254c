"""Errors shared by the training loop and the rollout path."""

from __future__ import annotations


class TrainingError(RuntimeError):
    """A run cannot continue (non-finite loss, exhausted data...); the message says what was
    saved."""


class Interrupted(BaseException):
    """Ctrl-C / SIGTERM stopped the run. A BaseException, so the handlers that save state
    around a failing step do not treat it as a failure; the CLI exits with 128 + `signum`.
    The message says where the run stopped and what was saved."""

    def __init__(self, signum: int, message: str, at_once: bool = False):
        super().__init__(message)
        self.signum = signum
        self.at_once = at_once  # a second signal: whatever was in flight is abandoned
