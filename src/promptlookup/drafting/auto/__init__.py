"""``--speculate auto``: draft only where drafting pays, judged by the run's own measured time.

A drafting step that is not accepted often enough costs more than the plain decode it replaced,
and tightening a fixed gate converges on "off". So instead of a fixed draft length, the controller
decides per step which source to draft from and how many tokens to send (0 = a plain decode), by
the most confirmed tokens per second. One module per part:

* ``acceptance.py``: the acceptance model, P(drafted token i holds | the ones before it held) per
  (source, match-length bucket, position), learned online from every proposal, sent or not;
  ``expected_tokens`` and ``best_length`` turn it into expected confirmed tokens per draft length.
* ``timing.py``: :class:`~promptlookup.drafting.auto.timing.StepTimes`, the measured seconds of a
  step by verify width (the load-time cost curve only gives the shape), drafting's own seconds and
  the slow plain steps drafting leaves behind.
* ``controller.py``: :class:`~promptlookup.drafting.auto.controller.AutoDrafter`, the choice per
  step, its ledgers of realized outcomes (the winner's-curse correction) and its calibration.
* ``source.py``: the spec glue (``auto[:sources=ngram+lookup+suffix+align][:curve=FILE][:margin=X]``):
  which sources ``auto`` weighs (each source module declares ``AUTO_WEIGHED``), its options, and
  its factory.

The controller is itself a :class:`~promptlookup.drafting.base.DraftSource` (named ``auto``)
wrapping the real sources, so the speculative loop needs no special case for it. Without feedback
(a loop that reports no times) it decides on the curve and the acceptance model alone; the
llama-cpp-python drop-in reports the time between two calls of its draft model instead.
"""
