"""Draft sources: pure code over token ids. Nothing in this package imports a model backend."""

from promptlookup.drafting.base import Draft, DraftSource, NoDraft, StepFeedback

__all__ = ["Draft", "DraftSource", "NoDraft", "StepFeedback"]
