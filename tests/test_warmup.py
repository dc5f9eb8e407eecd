"""Compile before "ready": no numba kernel compiles inside a timed step, and a warm-up leaves no trace."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from promptlookup.costcurve import CostCurve
from promptlookup.drafting import warmup
from promptlookup.drafting.spec import Run, SourceSpec, source_factory

# A fresh interpreter (numba's dispatchers start empty there, whatever this process compiled): build
# the source through the factory, then run a real request through the loop on a real text (a stdlib
# module's bytes as token ids) and list every dispatcher that gained a compiled signature during it.
PROBE = textwrap.dedent("""
    import inspect, json, sys, json.decoder
    from numba.core.registry import CPUDispatcher
    from promptlookup.backends.text import TextBackend
    from promptlookup.drafting.spec import Run, SourceSpec, source_factory
    from promptlookup.costcurve import CostCurve
    from promptlookup.speculate import generate

    spec, warm = SourceSpec.parse(sys.argv[1]), sys.argv[2] == "warm"
    text = list(inspect.getsource(json.decoder).encode())[:3000]
    run = Run(256, lambda: "bytes", cost_curve=lambda: CostCurve.flat(), warm=warm)
    source = source_factory(spec, run)()

    def dispatchers():
        found = {}
        for name, mod in list(sys.modules.items()):
            if name.startswith("promptlookup."):
                for attr, obj in vars(mod).items():
                    if isinstance(obj, CPUDispatcher):
                        found[f"{name}.{attr}"] = len(obj.signatures)
        return found

    before = dispatchers()
    gen = generate(TextBackend(text), text[:1500], 1400, source=source, draft=spec.draft)
    after = dispatchers()
    print(json.dumps({"compiled_in_run": sorted(k for k in after if after[k] > before.get(k, 0)),
                      "accepted": gen.counters.accepted_tokens}))
""")


def _probe(spec: str, warm: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, spec, "warm" if warm else "cold"],
                         capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("spec", ["auto", "ngram", "lookup", "suffix", "align"])
def test_nothing_compiles_inside_the_loop_after_the_factory(spec):
    got = _probe(spec, warm=True)
    assert got["compiled_in_run"] == []
    assert got["accepted"] > 100  # the run drafted: every drafting path was taken


def test_without_the_warm_up_kernels_compile_inside_the_loop():
    # Negative control: the same probe with the warm-up off sees auto's kernels compile mid-run.
    got = _probe("auto", warm=False)
    assert any("drafting.lookup" in k for k in got["compiled_in_run"])
    assert any("drafting.suffix" in k for k in got["compiled_in_run"])


def _replay(source, text: list[int]) -> list[tuple[int, ...]]:
    """The drafts a source proposes over ``text`` (two requests, committed between)."""
    drafts = []
    for prompt_len in (40, 10):
        source.reset(text[:prompt_len])
        for t in text[prompt_len:]:
            drafts.append(source.propose(6).tokens)
            source.extend([t])
        source.commit()
    return drafts


@pytest.mark.parametrize("spec", ["auto", "suffix", "lookup", "ngram:min=2", "align"])
def test_a_warm_up_leaves_no_trace(spec):
    # The source made after a warm-up proposes exactly what one made without any warm-up does, and
    # the run's shared history holds nothing the warm-up saw.
    from promptlookup.drafting.suffix.history import History

    text = list(b"the cat sat on the mat; the cat sat on the hat; the dog sat on the mat. " * 3)
    plain_run = Run(256, lambda: "b", cost_curve=lambda: CostCurve.flat(), warm=False)
    plain = _replay(source_factory(SourceSpec.parse(spec), plain_run)(), text)
    warmup.forget()
    shared = History(fingerprint="b")
    warm_run = Run(256, lambda: "b", cost_curve=lambda: CostCurve.flat(), history=shared)
    made = source_factory(SourceSpec.parse(spec), warm_run)
    assert shared.n_tokens == 0 and shared.text() == []
    assert _replay(made(), text) == plain


def test_warm_up_runs_once_per_spec_and_process():
    calls = []

    class Counting:
        name = "counting"

        def reset(self, prompt):
            calls.append("reset")

        def extend(self, tokens):
            pass

        def propose(self, k):
            from promptlookup.drafting.base import make_draft

            return make_draft((), self.name)

        def commit(self):
            pass

        def feedback(self, step):
            pass

    warmup.forget()
    assert warmup.warm_up("x", Counting, 100) is not None
    assert calls == ["reset", "reset"]  # two requests
    assert warmup.warm_up("x", Counting, 100) is None
    assert calls == ["reset", "reset"]


def test_synthetic_text_is_fixed_and_in_the_vocabulary():
    a = warmup.synthetic_text(49152)
    assert a == warmup.synthetic_text(49152) and len(a) == 640
    assert max(a) < 512 and min(a) >= 0
    assert max(warmup.synthetic_text(6)) < 6
