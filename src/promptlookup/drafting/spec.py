"""The one vocabulary of draft sources: ``ngram:draft=1:min=5`` (or CLI flags) -> a spec -> a source.

Why one place: generate, bench, stats, the cost simulation and ``auto`` all build sources from
settings. A :class:`SourceSpec` is a source name plus ``key=value`` options, parsed and checked
against the options that source declares, before any model loads; :func:`source_factory` turns a
spec and what a run has (:class:`Run`: vocabulary size, tokenizer fingerprint, cost curve, files
opened once) into a maker of fresh sources.

Each source declares itself in its own module: ``OPTIONS`` (key -> :class:`Option`), optionally
``check(spec)`` (settings that must agree with each other), ``factory(spec, run)`` (open the run's
files now, return a zero-argument maker of fresh sources) and optionally ``save(spec, source)``
(end of a run: write what the source learned back to its files), and optionally ``AUTO_WEIGHED``
(``"named"``: ``auto`` weighs it when its ``sources=`` names it; see
:mod:`promptlookup.drafting.auto.source`). Adding a source is its own folder plus one line in
:data:`SOURCES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

from promptlookup.costcurve import CostCurve
from promptlookup.drafting.base import MAX_DRAFT, DraftSource
from promptlookup.errors import UsageError

# name -> the module that declares the source's options and builds it (imported by name, on demand)
SOURCES: dict[str, str] = {
    "ngram": "promptlookup.drafting.ngram.source",
    "lookup": "promptlookup.drafting.lookup.source",
    "suffix": "promptlookup.drafting.suffix.source",
    "align": "promptlookup.drafting.align.source",
    "auto": "promptlookup.drafting.auto.source",
}
OFF = "off"  # plain decoding: no source at all


class SpecError(UsageError, ValueError):
    """A source specification that names an unknown source, setting or value."""


@dataclass(frozen=True)
class Option:
    """One setting of a source: its type, default, bounds, the CLI flag that sets it and the flag's
    help. The command line's source flags are generated from these (``cli.py``), so a setting's
    bounds and default are written once, here in its source's ``OPTIONS``."""

    kind: type = int  # int, float or str (a path)
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    flag: str | None = None  # e.g. "--ngram-min-match"; None: settable in a spec string only
    help: str = ""  # what the setting does (the flag's help; the default and bounds are added to it)

    @property
    def dest(self) -> str | None:
        """The argparse attribute of :attr:`flag`."""
        return self.flag.lstrip("-").replace("-", "_") if self.flag else None

    def parse(self, where: str, key: str, text: str) -> Any:
        """``text`` as this setting's value; :class:`SpecError` names ``where: key`` (or ``key``
        alone when ``where`` is empty, as for a flag) and what was wrong."""
        name = f"{where}: {key}" if where else key
        try:
            value = self.kind(text)
        except ValueError:
            kind = {int: "an integer", float: "a number"}.get(self.kind, self.kind.__name__)
            raise SpecError(f"{name} must be {kind}, got {text!r}") from None
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            bound = f"{self.lo}..{self.hi}" if self.hi is not None else f">= {self.lo}"
            raise SpecError(f"{name} must be {bound}, got {value}")
        return value

    def describe(self) -> str:
        """The flag's help: what it does, its bounds and default."""
        parts = [self.help] if self.help else []
        if self.lo is not None:
            parts.append(f"{self.lo}..{self.hi}" if self.hi is not None else f">= {self.lo}")
        if self.default is not None:
            parts.append(f"default {self.default}")
        return "; ".join(parts)


DRAFT = Option(int, 3, 1, MAX_DRAFT, "--draft", "tokens drafted per verify batch (every fixed source; "
               f"auto chooses up to {MAX_DRAFT})")


def module_of(name: str) -> ModuleType:
    """The module that declares source ``name``."""
    if name not in SOURCES:
        known = ", ".join([OFF, *SOURCES])
        raise SpecError(f"unknown draft source {name!r} (known: {known})")
    return importlib.import_module(SOURCES[name])


def options_of(name: str) -> Mapping[str, Option]:
    return {} if name == OFF else module_of(name).OPTIONS


@dataclass(frozen=True)
class SourceSpec:
    """A source name and its ``key=value`` options (as written, so the label reads back)."""

    name: str
    options: tuple[tuple[str, str], ...] = ()
    from_flags: bool = field(default=False, compare=False)  # name settings by their flags in errors

    @property
    def label(self) -> str:
        return ":".join([self.name, *(f"{k}={v}" for k, v in self.options)])

    def get(self, key: str, default: Any = None) -> Any:
        """The option as written, or ``default``."""
        return dict(self.options).get(key, default)

    def int_option(self, key: str, default: int) -> int:
        v = self.get(key)
        if v is None:
            return default
        try:
            return int(v)
        except ValueError:
            raise SpecError(f"{self.label}: {key} must be an integer, got {v!r}") from None

    def value(self, key: str) -> Any:
        """The option parsed by its declared type, or its declared default."""
        opt = options_of(self.name)[key]
        v = self.get(key)
        return opt.default if v is None else opt.parse(self.label, key, v)

    def setting(self, key: str) -> str:
        """How the user wrote setting ``key``: its flag for a spec from flags, else ``key``."""
        flag = options_of(self.name)[key].flag
        return flag if self.from_flags and flag else key

    @property
    def draft(self) -> int:
        """Tokens drafted per verify batch: the fixed sources' ``draft``, ``auto``'s maximum."""
        if self.name == "auto":
            return MAX_DRAFT
        return self.value("draft") if "draft" in options_of(self.name) else DRAFT.default

    def with_options(self, keys: Mapping[str, Option]) -> tuple[tuple[str, str], ...]:
        """This spec's options that ``keys`` declares too (what one source hands another)."""
        return tuple((k, v) for k, v in self.options if k in keys)

    def with_settings(self, settings: Mapping[str, Any]) -> SourceSpec:
        """This spec with each of ``settings`` (key -> value; None: unset) that its source declares and
        the spec does not write itself: run-wide files (a corpus, a static cache) reach every source
        that can use them."""
        declared = options_of(self.name)
        extra = tuple((k, str(v)) for k, v in settings.items()
                      if v is not None and k in declared and self.get(k) is None)
        return SourceSpec(self.name, self.options + extra, self.from_flags).check() if extra else self

    def without(self, *keys: str) -> SourceSpec:
        """This spec less the options ``keys`` (settings a caller takes over)."""
        return SourceSpec(self.name, tuple((k, v) for k, v in self.options if k not in keys), self.from_flags)

    def check(self) -> SourceSpec:
        """Raise :class:`SpecError` unless every option is declared and in range; return self."""
        declared = options_of(self.name)
        for key, text in self.options:
            if key not in declared:
                allowed = ", ".join(sorted(declared)) or "none"
                raise SpecError(f"{self.label!r}: unknown setting '{key}={text}' "
                                f"(allowed for {self.name}: {allowed})")
            declared[key].parse(self.label, self.setting(key), text)
        if self.name != OFF:
            check = getattr(module_of(self.name), "check", None)
            try:
                if check is not None:
                    check(self)
            except SpecError as exc:
                if self.from_flags:
                    raise
                raise SpecError(f"{self.label}: {exc}") from None
        return self

    @classmethod
    def parse(cls, text: str) -> SourceSpec:
        """``NAME[:key=value...]``, e.g. ``ngram:draft=1:min=5``."""
        parts = [p for p in text.strip().split(":") if p]
        if not parts:
            raise SpecError("empty draft source specification")
        name = parts[0]
        if name != OFF:
            module_of(name)
        opts = []
        for p in parts[1:]:
            key, sep, value = p.partition("=")
            if not sep:
                raise SpecError(f"{text!r}: unknown setting {p!r} (write key=value)")
            opts.append((key, value))
        return cls(name, tuple(opts)).check()

    @classmethod
    def from_args(cls, args: Any, name: str, offered: Mapping[str, str]) -> SourceSpec:
        """The spec a command's flags ask for: source ``name`` (one of ``offered``, which maps each
        source the command offers to how its flags select it, e.g. ``"--source lookup"``).

        A flag with no default (a file, a budget) given for a source that is not chosen is an
        error; a flag with a default (``--draft``, ``--ngram-min-match``) only applies when its
        source is chosen."""
        opts: list[tuple[str, str]] = []
        stray: dict[str, list[str]] = {}  # flag given -> the offered sources it belongs to
        for src in offered:
            if src == OFF:
                continue
            for key, opt in options_of(src).items():
                value = getattr(args, opt.dest, None) if opt.dest else None
                if value is None:
                    continue
                if src == name:
                    opts.append((key, str(value)))
                elif opt.default is None:
                    stray.setdefault(opt.flag, []).append(src)
        own = {o.flag for o in options_of(name).values()}
        for flag, owners in stray.items():
            if flag not in own:
                raise UsageError(f"{flag} only applies with " + " or ".join(offered[s] for s in owners))
        return cls(name, tuple(opts), from_flags=True).check()


class Vocabulary(Protocol):
    """What a run needs of a model: its vocabulary's size and identity (a backend's
    :class:`~promptlookup.backends.base.Model` has both; drafting never imports a backend)."""

    n_vocab: int

    def fingerprint(self) -> str: ...


@dataclass
class Run:
    """What a run has that sources are built from.

    ``fingerprint`` is asked only when a file needs checking against the tokenizer; ``cost_curve``
    (a :class:`~promptlookup.costcurve.CostCurve` maker) only by ``auto`` when its spec names no
    curve file. Files opened through :meth:`shared` are opened once per run and shared by every
    source made from it (read-only caches and indexes)."""

    n_vocab: int
    fingerprint: Callable[[], str]
    cost_curve: Callable[[], CostCurve] | None = None
    verify: bool = False  # full body checks of static caches and corpus indexes at open
    # one suffix history every source made from this run shares (the public API and the server keep
    # one for all their requests); None: each source gets its own, from its spec's history= file
    history: Any = None
    # follower entries each lookup dynamic cache made from this run may keep across requests (an
    # engine's slots keep theirs for the process's life); None: unbounded, as llama.cpp's one run
    lookup_budget: int | None = None
    opened: dict[tuple[str, str], Any] = field(default_factory=dict)
    warm: bool = True  # compile a new spec's kernels when its factory is made (see drafting.warmup)
    _fp: str | None = None
    _curve: CostCurve | None = None

    @classmethod
    def for_backend(cls, backend: Vocabulary, cost_curve: Callable[[], CostCurve] | None = None) -> Run:
        """What a loaded backend gives: its vocabulary and its tokenizer's fingerprint; ``cost_curve``
        (for ``auto``) is the caller's, typically :func:`promptlookup.backends.costs.cached_cost_curve`
        of the backend: drafting never imports a backend module, not even to measure one."""
        return cls(backend.n_vocab, backend.fingerprint, cost_curve=cost_curve)

    def curve(self) -> CostCurve:
        """:attr:`cost_curve`'s curve, made once per run (a warm-up and the real source share it)."""
        if self._curve is None:
            if self.cost_curve is None:
                raise SpecError("auto needs a verify cost curve and this run has none (give curve=FILE)")
            self._curve = self.cost_curve()
        return self._curve

    def for_warm_up(self) -> Run:
        """A run for a throw-away source: the same vocabulary, curve and opened files, no shared
        history (a warm-up must not add to it) and no warm-up of its own."""
        return Run(self.n_vocab, self.fingerprint, cost_curve=self.curve, verify=False, history=None,
                   opened=self.opened, warm=False)

    def tokenizer_fingerprint(self) -> str:
        if self._fp is None:
            self._fp = self.fingerprint()
        return self._fp

    def shared(self, kind: str, path: str, open_fn: Callable[[], Any]) -> Any:
        key = (kind, path)
        if key not in self.opened:
            self.opened[key] = open_fn()
        return self.opened[key]


def source_factory(spec: SourceSpec, run: Run) -> Callable[[], DraftSource | None]:
    """Open what ``spec`` needs from ``run`` now (so a bad file fails here), compile its kernels now
    (once per spec and process, on a throw-away source: :mod:`promptlookup.drafting.warmup`, so no
    timed step pays numba's compilation), and return a maker of fresh sources; ``off`` makes
    ``None`` (plain decoding)."""
    if spec.name == OFF:
        return lambda: None
    make = module_of(spec.name).factory(spec, run)
    if run.warm:
        from promptlookup.drafting.warmup import PRIVATE, warm_up

        private = spec.without(*PRIVATE)
        warm_up(private.label, lambda: module_of(spec.name).factory(private, run.for_warm_up())(),
                run.n_vocab)
    return make


def build_source(spec: SourceSpec, run: Run) -> DraftSource | None:
    """One fresh source for ``spec``."""
    return source_factory(spec, run)()


def finish(spec: SourceSpec, source: DraftSource | None) -> None:
    """End of a run: commit the request and save what the source learned to the files it came from."""
    if source is None:
        return
    source.commit()
    save_state(spec, source)


def save_state(spec: SourceSpec, source: DraftSource) -> None:
    """Write what a committed source learned back to the files its spec names (if its module saves)."""
    save = getattr(module_of(spec.name), "save", None)
    if save is not None:
        save(spec, source)
