"""vLLM drop-in: our drafting as vLLM's ``custom_class`` speculative proposer.

    LLM(model, speculative_config={"method": "custom_class",
                                   "model": "promptlookup.integrations.vllm.PromptLookupProposer",
                                   "num_speculative_tokens": 8})
    vllm serve MODEL --speculative-config '{"method": "custom_class", "model":
        "promptlookup.integrations.vllm.PromptLookupProposer", "num_speculative_tokens": 8}'

Why it is built this way: what vLLM 0.32's interface gives. The class is built in vLLM's worker
process as ``Class(vllm_config)``; the CPU runner calls ``load_model(target_model)``; then, once per
engine step, after sampling, ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
slot_mappings=...)`` for the whole batch: ``sampled_token_ids[i]`` are the tokens row ``i`` confirmed
this step (accepted drafts plus the model's own token; empty: no draft wanted for that row, e.g. a
partial prefill), ``token_ids_cpu[i, :num_tokens_no_spec[i]]`` is that row's prompt and output so far,
those tokens included. Nothing else: no request ids, no prompt length, no call when a request
starts or ends, and rows are swapped and condensed as requests come and go. So, like the
llama-cpp-python drop-in, this class infers request boundaries from the tokens themselves
(:class:`RowTracker`):

* The fast path (almost every row, almost every step): the request that was in row ``i`` last step
  had ``n - m`` tokens, and the row's ``n - m`` tokens end with the same tokens it saw last; then
  the ``m`` new tokens are ``extend``-ed: microseconds per row, nothing is re-read.
* Otherwise (a new request, a row moved when the batch was condensed, a preempted request back):
  the longest live request whose tokens are a prefix of the row's takes it (an exact comparison,
  only on this slow path), and is extended by the difference; with none, a fresh source (reused
  from a pool) is reset on the row's tokens.
* A request seen last step that no row continues is over: it is committed to the history shared by
  every row, before this step drafts, so the next request drafts from it at once.
* Requests running together also draft from one another's output as it is written
  (:mod:`promptlookup.drafting.live_outputs`): where a row's own source drafts less than K, the longest
  match of its last tokens in the other live requests' outputs drafts instead, if that is longer.
  Identical or near-identical requests that run together (a follower a few steps behind a leader)
  copy the leader; the history would learn the leader only when it ends.

A wrong guess costs drafts, never tokens: vLLM verifies every drafted token against the model.

Settings. ``num_speculative_tokens`` (vLLM's, per engine) is the most tokens drafted per row per
step. Ours come from the environment of the process that starts vLLM (inherited by its workers),
because vLLM's config has no field for a custom class's settings:

* ``PROMPTLOOKUP_VLLM_SOURCE``: a source spec as in the CLI (default ``suffix:factor=1``: a draft
  at most as long as the match it follows; ``suffix`` drafts up to K after any match,
  ``suffix:budget=N``, ``ngram:min=2``, ``auto``).
* ``PROMPTLOOKUP_VLLM_HISTORY``: a suffix history file (``promptlookup.drafting.suffix.history``):
  loaded at start if it exists (checked against the model's tokenizer), saved when requests were
  committed, at most every ``PROMPTLOOKUP_VLLM_SAVE_S`` seconds (default 0: at every commit) and at
  the worker's exit.
* ``PROMPTLOOKUP_VLLM_PEERS``: ``on`` (default) or ``off``, drafting from concurrent requests'
  live outputs.

Only this module imports vLLM, and only for its logger; the tracking logic runs without it (tests
drive it with a fake batch).
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from promptlookup.drafting.base import DraftSource, StepFeedback
from promptlookup.drafting.live_outputs import LiveOutputs
from promptlookup.drafting.live_outputs import segment_of as peers_segment
from promptlookup.drafting.live_outputs import window_for as peers_window
from promptlookup.drafting.lookup.source import LONG_LIVED_BUDGET
from promptlookup.drafting.spec import Run, SourceSpec, SpecError, source_factory
from promptlookup.errors import UsageError

ENV_SOURCE = "PROMPTLOOKUP_VLLM_SOURCE"
ENV_HISTORY = "PROMPTLOOKUP_VLLM_HISTORY"
ENV_SAVE_S = "PROMPTLOOKUP_VLLM_SAVE_S"
ENV_PEERS = "PROMPTLOOKUP_VLLM_PEERS"
# the history across requests is what vLLM's own ngram lacks; factor=1 (SuffixDecoding's cap: a
# draft no longer than its match) because in vLLM's batches a drafted token costs its full price:
# measured (docs/vllm.md) prose 20.7 -> 27.6 tok/s and 8 requests at once 87.9 -> 95.6, copy_edit
# 75.6 -> 72.8 at K=8; at K=12 it leads ArcticInference's suffix on copy_edit, quote_doc and prose
DEFAULT_SOURCE = "suffix:factor=1"
TAIL = 8  # tokens compared on the fast path: the end of what a row's request had last step


def _logger() -> logging.Logger:
    try:
        from vllm.logger import init_logger

        return init_logger("vllm.promptlookup")  # under vLLM's logger, so its handler prints it
    except ImportError:
        return logging.getLogger(__name__)


@dataclass
class Slot:
    """One live request: its confirmed tokens (a growable copy, to recognise it in any row) and the
    source drafting for it."""

    source: DraftSource
    buf: np.ndarray = field(default_factory=lambda: np.zeros(256, dtype=np.int32))
    n: int = 0
    start: int = 0  # where its output starts (its prompt's length)
    last_draft: int = 0  # tokens drafted for it last step
    asked: bool = False  # whether its source was asked for last step's draft (an empty one counts)

    def set_tokens(self, row: np.ndarray, n: int) -> None:
        if n > len(self.buf):
            self.buf = np.zeros(max(2 * len(self.buf), n), dtype=np.int32)
        self.buf[:n] = row[:n]
        self.n = n

    def append(self, row: np.ndarray, start: int, n: int) -> None:
        if n > len(self.buf):
            grown = np.zeros(max(2 * len(self.buf), n), dtype=np.int32)
            grown[:start] = self.buf[:start]
            self.buf = grown
        self.buf[start:n] = row[start:n]
        self.n = n

    def continues(self, row: np.ndarray, before: int) -> bool:
        """Whether ``row`` holds this request, ``before`` tokens of it seen last step (the fast path:
        the same length and the same last :data:`TAIL` tokens)."""
        if self.n != before:
            return False
        a = max(0, before - TAIL)
        return row[a:before].tobytes() == self.buf[a:before].tobytes()

    def is_prefix_of(self, row: np.ndarray, n: int) -> bool:
        """Whether all of this request's tokens start ``row[:n]`` (the slow path: exact)."""
        return 0 < self.n <= n and np.array_equal(row[: self.n], self.buf[: self.n])


class RowTracker:
    """Per-row drafting state over vLLM's batch, kept incrementally: see the module docstring.

    ``make_source`` makes a fresh source (all of them sharing one history, so a committed request
    is seen by every row); ``k`` is the most tokens drafted per row per step; ``max_len`` the model's
    context (a draft never runs past it). ``clock`` is injected so tests never depend on the machine.
    """

    def __init__(self, make_source: Callable[[], DraftSource], k: int, max_len: int,
                 clock: Callable[[], float] = time.perf_counter,
                 on_commit: Callable[[], None] | None = None, peers: LiveOutputs | None = None) -> None:
        if k < 1:
            raise UsageError(f"num_speculative_tokens must be at least 1, got {k}")
        self.make_source = make_source
        self.k = k
        self.max_len = max_len
        self.clock = clock
        self.on_commit = on_commit
        self.peers = peers
        self.rows: dict[int, Slot] = {}  # row index -> the request it held last step
        self.free: list[Slot] = []  # slots of ended requests, their sources reused
        self.left_at: float | None = None  # when the previous call returned
        self.call_s = 0.0
        self.requests = 0  # requests started (new or not recognised)
        self.committed = 0  # requests committed to the history
        self.moved = 0  # requests found in another row than last step
        self.calls = 0
        self.drafted_tokens = 0
        self.errors = 0
        self.peer_drafts = 0  # drafts copied from another live request's output
        self.peer_tokens = 0

    def step(self, sampled: Sequence[Sequence[int]], num_tokens: np.ndarray,
             token_ids: np.ndarray) -> list[list[int]]:
        """One engine step: the drafts for each of ``len(sampled)`` rows (``[]``: none)."""
        entered = self.clock()
        gap = None if self.left_at is None else entered - self.left_at
        n_rows = len(sampled)
        self.calls += 1
        new_rows: dict[int, Slot] = {}
        taken: set[int] = set()  # id() of the slots claimed this step
        todo: list[int] = []
        # pass 1, the fast path: each row's request of last step, continued by this step's tokens
        for i in range(n_rows):
            m = len(sampled[i])
            slot = self.rows.get(i)
            if slot is None:
                if m:
                    todo.append(i)
                continue
            if m == 0:  # no draft wanted (a prefill chunk): keep the row's request as it was
                if slot.n <= int(num_tokens[i]):
                    slot.last_draft = 0  # what it drafted before is not what the next step verifies
                    slot.asked = False
                    new_rows[i] = slot
                    taken.add(id(slot))
                continue
            if slot.continues(token_ids[i], int(num_tokens[i]) - m):
                new_rows[i] = slot
                taken.add(id(slot))
            else:
                todo.append(i)
        # pass 2, the slow path: a live request that moved row or skipped steps, else a new one
        live = [s for s in self.rows.values() if id(s) not in taken]
        fresh: list[int] = []
        for i in todo:
            n = int(num_tokens[i])
            best = None
            for s in live:
                if id(s) not in taken and (best is None or s.n > best.n) and s.is_prefix_of(token_ids[i], n):
                    best = s
            if best is None:
                fresh.append(i)
                continue
            taken.add(id(best))
            new_rows[i] = best
            self.moved += 1
        # requests no row holds any more are over: commit them before anyone drafts this step
        ended = [s for s in self.rows.values() if id(s) not in taken]
        seen: set[int] = set()
        for s in ended:
            if id(s) in seen:
                continue
            seen.add(id(s))
            s.source.commit()
            s.n = 0
            s.last_draft = 0
            s.asked = False
            self.free.append(s)
            self.committed += 1
        if ended and self.on_commit is not None:
            self.on_commit()
        for i in fresh:
            slot = self.free.pop() if self.free else Slot(self.make_source())
            slot.n = 0
            new_rows[i] = slot
        self.rows = new_rows
        # extend every claimed row by what it confirmed, then draft
        active: list[Slot | None] = []
        for i in range(n_rows):
            m = len(sampled[i])
            slot = new_rows.get(i)
            if m == 0 or slot is None or not self._update(slot, token_ids[i], int(num_tokens[i]), m, gap):
                active.append(None)
            else:
                active.append(slot)
        owner: dict[int, int] = {}
        if self.peers is not None:
            live = {id(s): s for s in new_rows.values() if s.n > 0}
            owner = {key: j for j, key in enumerate(live)}
            window = peers_window(len(live))
            self.peers.build([peers_segment(s.buf, s.start, s.n, window) for s in live.values()])
        out = [[] if slot is None else self._draft(slot, owner.get(id(slot), -1)) for slot in active]
        self.left_at = self.clock()
        self.call_s = self.left_at - entered
        return out

    def _update(self, slot: Slot, row: np.ndarray, n: int, m: int, gap: float | None) -> bool:
        """Bring ``slot`` to the row's ``n`` tokens (``m`` of them confirmed this step); False when
        its source refused a token (no draft this step)."""
        try:
            if slot.n == 0:
                slot.source.reset(row[:n].tolist())
                slot.set_tokens(row, n)
                slot.start = n - m
                self.requests += 1
            elif slot.n < n:
                if slot.asked and gap is not None and slot.n == n - m:
                    # the time since the last call is the engine step that verified this row's draft,
                    # or decoded it plainly where the source drafted nothing: auto learns the cost of
                    # a plain step from those (without them it kept forcing plain steps to measure
                    # one, and never drafted)
                    slot.source.feedback(StepFeedback(fed=1 + slot.last_draft, confirmed=m,
                                                      verify_s=gap, draft_s=self.call_s))
                start = slot.n
                slot.source.extend(row[start:n].tolist())
                slot.append(row, start, n)
            return True
        except ValueError:  # a token our source refuses (outside the vocabulary): no draft, no crash
            self._refused(slot)
            return False

    def _refused(self, slot: Slot) -> None:
        self.errors += 1
        slot.n = 0  # start afresh next time this row drafts
        slot.asked = False
        slot.last_draft = 0

    def _draft(self, slot: Slot, owner: int) -> list[int]:
        n = slot.n
        k = min(self.k, self.max_len - n - 1)
        if k <= 0:
            slot.asked = False
            slot.last_draft = 0
            return []
        try:
            got = slot.source.propose(k)
        except ValueError:
            self._refused(slot)
            return []
        draft = list(got.tokens[:k])
        if self.peers is not None and len(draft) < k:
            context = slot.buf[max(0, n - self.peers.max_match) : n]
            _, copied = self.peers.draft(owner, context, k)
            if len(copied) > len(draft):
                draft = copied.tolist()
                self.peer_drafts += 1
                self.peer_tokens += len(draft)
        slot.asked = True
        slot.last_draft = len(draft)
        self.drafted_tokens += len(draft)
        return draft

    def commit_all(self) -> None:
        """Commit every live request (at exit: there is no call when the last requests end)."""
        for s in {id(s): s for s in self.rows.values()}.values():
            s.source.commit()

    def stats(self) -> dict[str, int]:
        return {"calls": self.calls, "requests": self.requests, "committed": self.committed,
                "moved": self.moved, "drafted_tokens": self.drafted_tokens, "errors": self.errors,
                "live": len(self.rows), "peer_drafts": self.peer_drafts, "peer_tokens": self.peer_tokens}


def settings_from_env(env: dict[str, str] | None = None) -> tuple[SourceSpec, str | None, float]:
    """``(spec, history file, save interval)`` from the environment; a bad value is one line that
    names its variable."""
    env = dict(os.environ if env is None else env)
    text = env.get(ENV_SOURCE, "").strip() or DEFAULT_SOURCE
    try:
        spec = SourceSpec.parse(text)
    except SpecError as exc:
        raise UsageError(f"{ENV_SOURCE}={text!r}: {exc}") from None
    if spec.name == "off":
        raise UsageError(f"{ENV_SOURCE}=off drafts nothing: leave speculative_config out instead")
    history = env.get(ENV_HISTORY, "").strip() or None
    written = spec.get("history")
    if history and written and written != history:
        raise UsageError(f"{ENV_HISTORY}={history!r} disagrees with {ENV_SOURCE}={text!r}")
    history = history or written
    if history and "history" not in _options(spec.name):
        raise UsageError(f"{ENV_HISTORY} is a setting of the suffix source (and auto), not of {spec.name!r}")
    raw = env.get(ENV_SAVE_S, "").strip() or "0"
    try:
        save_s = float(raw)
    except ValueError:
        save_s = -1.0
    if not save_s >= 0:
        raise UsageError(f"{ENV_SAVE_S}={raw!r}: must be seconds, 0 or more")
    return spec, history, save_s


def peers_from_env(env: dict[str, str] | None = None) -> bool:
    """Whether rows draft from concurrent requests' live outputs (``PROMPTLOOKUP_VLLM_PEERS``)."""
    env = os.environ if env is None else env
    raw = env.get(ENV_PEERS, "").strip().lower() or "on"
    if raw not in ("on", "off"):
        raise UsageError(f"{ENV_PEERS}={raw!r}: must be on or off")
    return raw == "on"


def _options(name: str) -> Any:
    from promptlookup.drafting.spec import options_of

    return options_of(name)


def hf_fingerprint(tokenizer: Any, n_vocab: int) -> str:
    """Our tokenizer fingerprint for a Hugging Face tokenizer: the same bytes per token as the
    transformers backend hashes, so a history file is shared with runs of the CLI on that model."""
    from types import SimpleNamespace

    from promptlookup.backends.transformers import TransformersBackend
    from promptlookup.fingerprint import fingerprint_pieces

    shim = SimpleNamespace(tokenizer=tokenizer)
    return fingerprint_pieces(n_vocab, (TransformersBackend.token_bytes(shim, t)  # type: ignore[arg-type]
                                        for t in range(n_vocab)))


class PromptLookupProposer:
    """vLLM's ``custom_class`` proposer drafting with a promptlookup source; see the module docstring.

    ``vllm_config`` is vLLM's ``VllmConfig`` (read: ``speculative_config.num_speculative_tokens``,
    ``model_config.max_model_len``, the vocabulary size and tokenizer); ``env`` replaces
    ``os.environ`` for tests; ``fingerprint`` replaces loading the tokenizer (needed only with a
    history file)."""

    def __init__(self, vllm_config: Any, *, env: dict[str, str] | None = None,
                 fingerprint: Callable[[], str] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        from promptlookup.drafting.suffix.history import DEFAULT_BUDGET, History

        self.log = _logger()
        self.spec, self.history_path, self.save_s = settings_from_env(env)
        peers = LiveOutputs() if peers_from_env(env) else None
        model_config = vllm_config.model_config
        k = int(vllm_config.speculative_config.num_speculative_tokens)
        written = self.spec.get("draft")
        if written is not None:
            k = min(k, int(written))
        self.n_vocab = int(model_config.get_vocab_size())
        self.fingerprint = fingerprint or (lambda: self._tokenizer_fingerprint(model_config))
        run_spec = self.spec.without("history", "budget")
        history = None
        if "history" in _options(self.spec.name):
            budget = self.spec.value("budget")
            if self.history_path and os.path.exists(self.history_path):
                history = History.load(self.history_path, fingerprint=self.fingerprint(), budget=budget)
            else:
                fp = self.fingerprint() if self.history_path else ""
                history = History(budget=budget or DEFAULT_BUDGET, fingerprint=fp)
        self.history = history
        from promptlookup.integrations import prior_cost_curve

        # rows are reused by later requests, so each row's lookup cache is bounded as an engine slot's
        run = Run(self.n_vocab, self.fingerprint, cost_curve=prior_cost_curve, history=history,
                  lookup_budget=LONG_LIVED_BUDGET)
        make = source_factory(run_spec, run)  # compiles the kernels now, not in the first step
        self.tracker = RowTracker(make, k, int(model_config.max_model_len), clock=clock,  # type: ignore[arg-type]
                                  on_commit=self._committed, peers=peers)
        self._saved_at = -float("inf")
        self._clock = clock
        if self.history_path:
            atexit.register(self.close)
        self.log.info("promptlookup proposer: source %s, %d tokens per draft, history %s, drafting from "
                      "concurrent requests %s", self.spec.label, k, self.history_path or "in memory",
                      "on" if peers else "off")

    @staticmethod
    def _tokenizer_fingerprint(model_config: Any) -> str:
        from transformers import AutoTokenizer

        remote = getattr(model_config, "trust_remote_code", False)
        tok = AutoTokenizer.from_pretrained(model_config.tokenizer, trust_remote_code=remote)
        return hf_fingerprint(tok, int(model_config.get_vocab_size()))

    def load_model(self, target_model: Any) -> None:
        """The CPU runner calls this unconditionally; we draft without the model."""

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None, **_: Any) -> list[list[int]]:
        """vLLM's call, once per engine step: one draft per row of this step's batch."""
        return self.tracker.step(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)

    def _committed(self) -> None:
        if self.history_path and self._clock() - self._saved_at >= self.save_s:
            self.save()

    def save(self) -> None:
        """Write the history to its file (atomically); a no-op without ``PROMPTLOOKUP_VLLM_HISTORY``."""
        if self.history_path and self.history is not None:
            self.history.save(self.history_path)
            self._saved_at = self._clock()

    def close(self) -> None:
        """Commit the live requests and save (registered at exit when a history file is set)."""
        self.tracker.commit_all()
        self.save()

    def forget(self) -> None:
        """Empty the history and forget the live requests (a benchmark's fresh start between
        workloads, reached through ``LLM.collective_rpc``); nothing is written."""
        from promptlookup.drafting.suffix.automaton import SuffixAutomaton

        t = self.tracker
        t.free.extend({id(s): s for s in t.rows.values()}.values())
        for s in t.free:
            s.source.reset([])  # a committed empty request: commit() adds nothing
            s.n = 0
        t.rows = {}
        h = self.history
        if h is not None:
            h.seqs.clear()
            h.n_tokens = 0
            h.automaton = SuffixAutomaton(depth=h.depth)

    def stats(self) -> dict[str, int]:
        return self.tracker.stats()
