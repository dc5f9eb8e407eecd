"""Continuous batching: many requests decoded together, each still running the speculative loop.

Why this shape: every request keeps its own loop (:func:`promptlookup.speculate.steps`), its own
draft sources, sampler, grammar, stop strings and logprobs, exactly as when it runs alone; only the
forward is shared. Each request's loop talks to a :class:`~promptlookup.batching.scheduler.SlotDecoder`
(one sequence of a :class:`~promptlookup.backends.base.BatchDecoder`); the
:class:`~promptlookup.batching.scheduler.Scheduler` gathers what every running sequence wants to
decode into one ``decode_many`` (a round), splitting long prompts into chunks so that running
sequences keep decoding while a new prompt is read. :class:`~promptlookup.batching.pricing.DraftPricing`
gives each sequence, as it comes to its step, the draft length that maximizes the round's expected
confirmed tokens per second given what the other sequences feed it, from the forward's learned cost
and each sequence's measured acceptance: drafts shrink by themselves as the batch fills and come
back when it empties.
"""
