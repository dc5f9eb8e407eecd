"""The engine loop and continuous batching: many requests decoded together, each still running the
speculative loop.

Why this shape: every request keeps its own loop (:func:`promptlookup.speculate.step_ops`), its own
draft sources, sampler, grammar, stop strings and logprobs, exactly as when it runs alone; only the
forward is shared. :class:`~promptlookup.batching.engine_loop.EngineLoop` owns the model and every
running request on one thread: it admits requests into slots (:mod:`.pool`, prefix reuse in
:mod:`.prefix`), advances each to its next forward and runs them in one ``decode_many`` (a round),
splitting long prompts into chunks so that running sequences keep decoding while a new prompt is
read. :class:`~promptlookup.batching.pricing.DraftPricing` gives each sequence, as it comes to its
step, the draft length that maximizes the round's expected confirmed tokens per second given what
the other sequences feed it, from the forward's learned cost and each sequence's measured
acceptance: drafts shrink by themselves as the batch fills and come back when it empties.
"""
