"""``promptlookup stats``: the lookup-stats replay of a text through a source spec, and its cost
simulation under a cost curve.

Why its own module: the lookup-stats replay (:mod:`promptlookup.measure.replay`) and its compiled twin for
``--lookup`` (:mod:`promptlookup.measure.replay_lookup`) only drive sources; this is where a text
is tokenized, the spec's files are opened (their open time is the replay's load time) and the
replay to run is chosen.
"""

from __future__ import annotations

import time

from promptlookup.costcurve import CostCurve
from promptlookup.drafting.base import MAX_DRAFT
from promptlookup.drafting.spec import Run, SourceSpec, options_of, source_factory
from promptlookup.measure.replay import ReplayStats, read_text_tokens, replay


def run_stats(text: str, model_path: str, n_ctx: int, spec: SourceSpec, verify: bool = False,
              reference: bool = False) -> ReplayStats:
    """Tokenize ``text`` with the model's vocabulary and replay it through ``spec``'s source.

    ``lookup`` replays with the compiled loop unless ``reference``; ``verify`` runs the full body
    checks of the static cache or corpus index at open (counted in the load time).
    """
    from promptlookup.build.tokenizers import VocabTokenizer

    compiled = spec.name == "lookup" and not reference
    tok = VocabTokenizer(model_path)
    tokens, n_bad = read_text_tokens(text, tok, as_list=not compiled)
    files = any(options_of(spec.name)[k].kind is str for k, _ in spec.options)  # paths to check
    fingerprint = tok.fingerprint() if files else ""  # the tokenizer's work, not the files' load
    run = Run(tok.n_vocab, lambda: fingerprint, verify=verify)
    tok.close()  # the vocabulary's memory is not needed by the replay
    t0 = time.perf_counter()
    make = source_factory(spec, run)
    if not compiled:
        t_load = time.perf_counter() - t0
        st = replay(tokens, n_ctx, spec.draft, make, t_load)
        st.n_invalid_utf8 = n_bad
        return st
    from promptlookup.measure.replay_lookup import replay_lookup

    source = make()
    t_load = time.perf_counter() - t0
    st = replay_lookup(tokens, n_ctx, spec.draft, static=source.static, dynamic=source.dynamic,
                       t_load_s=t_load)
    st.n_invalid_utf8 = n_bad
    return st


def curve_from_arg(arg: str) -> CostCurve:
    """``--cost-curve FILE|flat``: loaded (and checked) before any replay runs."""
    return CostCurve.flat(MAX_DRAFT + 1) if arg == "flat" else CostCurve.load(arg)


def cost_simulation(text: str, model_path: str, n_ctx: int, spec: SourceSpec, curve: CostCurve) -> str:
    """``stats --cost-curve``: the text under ``spec`` at fixed draft lengths, under ``auto`` (with
    the spec's files) and the hindsight oracle, on a backend with that curve."""
    from promptlookup.build.tokenizers import VocabTokenizer
    from promptlookup.measure.simulate import report_table, simulate_text

    tok = VocabTokenizer(model_path)
    tokens, _ = read_text_tokens(text, tok)  # the replay before this reported the replacements
    run = Run(tok.n_vocab, tok.fingerprint, cost_curve=lambda: curve)
    fixed = source_factory(spec, run)
    auto = source_factory(SourceSpec("auto", spec.with_options(options_of("auto"))), run)
    policies = {f"{spec.name} draft {k}": (fixed, k) for k in sorted({1, 2, 3, 4, 8, spec.draft})}
    policies["auto"] = (auto, MAX_DRAFT)
    results = simulate_text(tokens, n_ctx, curve, policies, oracle_sources=lambda: auto().sources,
                            max_draft=MAX_DRAFT)
    return report_table(results, curve)
