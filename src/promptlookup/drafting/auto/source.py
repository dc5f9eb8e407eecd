"""``auto`` in the source vocabulary: ``auto[:sources=ngram+lookup+suffix+align][:curve=FILE][:margin=X]``
plus the settings of the sources it weighs (``static=``, ``history=``, ``corpus=``...).

Sources join ``auto`` by declaration, not by a list here: a source module in
:data:`promptlookup.drafting.spec.SOURCES` that sets ``AUTO_WEIGHED`` is weighed, either

* ``"always"``: built by its module's ``auto_factory(spec, run)``, whatever ``sources=`` says (the
  ngram matcher, ungated: the controller's buckets judge its matches), or
* ``"named"``: built from ``auto``'s own spec by the source's ``factory`` when ``sources=`` names it
  (``auto`` offers its options, less ``draft``, and hands them on).

The weighed order is :data:`~promptlookup.drafting.spec.SOURCES`' order, "always" sources first.
"""

from __future__ import annotations

from collections.abc import Callable

from promptlookup.costcurve import CostCurve
from promptlookup.drafting.auto.controller import AutoDrafter
from promptlookup.drafting.base import MAX_DRAFT, DraftSource
from promptlookup.drafting.spec import (
    SOURCES,
    Option,
    Run,
    SourceSpec,
    SpecError,
    module_of,
    options_of,
    save_state,
    source_factory,
)

ALWAYS, NAMED = "always", "named"  # the values of a source module's AUTO_WEIGHED


def weighed(role: str) -> tuple[str, ...]:
    """The sources that declare ``AUTO_WEIGHED = role``, in :data:`SOURCES`' order."""
    return tuple(n for n in SOURCES if n != "auto" and getattr(module_of(n), "AUTO_WEIGHED", None) == role)


OPTIONS = {
    "sources": Option(str, "+".join(weighed(ALWAYS) + weighed(NAMED))),
    "curve": Option(str, None, flag="--cost-curve",
                    help="auto's verify cost curve (JSON, promptlookup curve -o) instead of measuring one"),
    "margin": Option(float, 0.0),  # a draft must beat plain decoding's rate by this fraction
    **{k: v for name in weighed(NAMED) for k, v in options_of(name).items() if k != "draft"},
}


def check(spec: SourceSpec) -> None:
    margin = spec.value("margin")
    if not -1.0 < margin <= 10.0:  # also refuses nan
        raise SpecError(f"margin must be a number above -1 and at most 10, got {spec.get('margin')!r}")
    known = weighed(ALWAYS) + weighed(NAMED)
    unknown = [n for n in spec.value("sources").split("+") if n not in known]
    if unknown:
        raise SpecError(f"{spec.label}: auto weighs {', '.join(known)}; not {', '.join(unknown)}")


def weighed_specs(spec: SourceSpec) -> list[SourceSpec]:
    """The specs of the "named" sources ``spec`` weighs, each with its own settings."""
    named = weighed(NAMED)
    return [SourceSpec(n, spec.with_options(options_of(n)), spec.from_flags)
            for n in spec.value("sources").split("+") if n in named]


def factory(spec: SourceSpec, run: Run) -> Callable[[], AutoDrafter]:
    """The cost curve is read (or measured, through ``run.cost_curve``) once; each drafter gets fresh
    sources."""
    makers = [module_of(n).auto_factory(spec, run) for n in weighed(ALWAYS)]
    makers += [source_factory(s, run) for s in weighed_specs(spec)]
    curve = CostCurve.load(spec.value("curve")) if spec.value("curve") else run.curve()
    rel, margin = curve.relative(MAX_DRAFT + 1), spec.value("margin")

    def make() -> AutoDrafter:
        sources: list[DraftSource] = [s for s in (m() for m in makers) if s is not None]
        return AutoDrafter(sources, rel, max_draft=MAX_DRAFT, margin=margin, plain_s=curve.cost(1))

    return make


def save(spec: SourceSpec, source: AutoDrafter) -> None:
    """End of a run (after commit): every named source saves what it learned."""
    named = source.sources[len(weighed(ALWAYS)):]
    for s, src in zip(weighed_specs(spec), named, strict=True):
        save_state(s, src)
