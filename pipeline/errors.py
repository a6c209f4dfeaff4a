"""The pipeline's one error: a message for a person, never a Java stack trace."""

from __future__ import annotations


class PipelineError(Exception):
    """A job cannot run or failed; `str()` says why and, where it can, what to do."""


__all__ = ["PipelineError"]
