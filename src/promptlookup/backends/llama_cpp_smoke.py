"""The llama.cpp smoke test: the decode paths speculation uses, run once on the bundled model.

Why: a llama.cpp build can be fine for a one-token decode and still die by SIGILL (or compute
garbage) in the matmul kernels a multi-token batch takes: ggml's AMX path did exactly that. So the
test runs what speculation runs: a prefill of a few hundred tokens, a verify of 9 tokens with every
row's logits, a rollback, then the same 9 tokens decoded one at a time, and checks that each batched
row agrees with its single-token row (within a tolerance, and the argmax must agree wherever the top
two are not nearly tied: llama.cpp's default kernels do not compute a row bit-identically in batches
of different widths).

Then it checks, bit for bit, whether the build is batch-invariant (:func:`invariance_check`: every
position decoded alone against the same positions in a whole-prompt batch, in verify batches of
several widths, and after a kept prefix). Only a batch-invariant build makes speculative output equal
plain decoding token for token; a build set up to be one (no batch-dependent kernels, see
``promptlookup.llama_build.recipe``) fails the smoke test when it is not.

Run it as a child process (``python -m promptlookup.backends.llama_cpp_smoke``): a signal inside
llama.cpp cannot be caught in the process it kills. The child prints ``step: NAME`` before each step
(flushed) so the parent can tell which step died, and ``result: {json}`` at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from promptlookup.backends.llama_cpp import LlamaCppBackend

N_PREFILL = 300
N_VERIFY = 9
#: the largest |batched - single| logit difference accepted, as a share of the single row's range
#: (measured on the bundled model, Q4_1, AVX-512 build: 2.0% of the range; a broken kernel is far off).
DIFF_TOLERANCE = 0.10
#: below this top-2 margin (in logits) the argmax may legitimately flip between batched and single
TIE_MARGIN = 0.5

SMOKE_TEXT = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "The quick brown fox jumps over the lazy dog while the five boxing wizards jump quickly. "
    "Speculative decoding drafts tokens from text already seen and verifies them in one batch.\n"
)


class SmokeFailure(RuntimeError):
    """The build ran but computed something wrong; the message says what."""


def _top2_margin(row: np.ndarray) -> float:
    top = np.partition(row, -2)[-2:]
    return float(top[1] - top[0])


def compare_rows(batched: Sequence[np.ndarray], single: Sequence[np.ndarray]) -> dict[str, Any]:
    """Check batched rows against single-token rows of the same positions; raise SmokeFailure."""
    if len(batched) != len(single):
        raise SmokeFailure(f"{len(batched)} batched rows but {len(single)} single rows")
    worst = 0.0
    agree = 0
    for i, (b, s) in enumerate(zip(batched, single, strict=True)):
        if not (np.isfinite(b).all() and np.isfinite(s).all()):
            raise SmokeFailure(f"non-finite logits at verify row {i}")
        span = float(s.max() - s.min()) or 1.0
        diff = float(np.abs(b - s).max()) / span
        worst = max(worst, diff)
        if diff > DIFF_TOLERANCE:
            raise SmokeFailure(f"verify row {i}: batched logits differ from the single-token decode by "
                               f"{diff:.1%} of the logit range (tolerance {DIFF_TOLERANCE:.0%})")
        same = int(b.argmax()) == int(s.argmax())
        agree += same
        if not same and _top2_margin(s) > TIE_MARGIN:
            raise SmokeFailure(f"verify row {i}: batched argmax {int(b.argmax())} != single-token argmax "
                               f"{int(s.argmax())} with a top-2 margin of {_top2_margin(s):.2f}")
    return {"max_rel_diff": worst, "argmax_agree": agree, "rows": len(batched)}


# -- batch invariance: bitwise ------------------------------------------------------------------
#: verify widths the set-up smoke check proves bitwise (the tests prove every width 1..64)
SMOKE_WIDTHS = (2, 3, 4, 8, 9, 16, 33, 64)
#: where the per-width verify batches are centred: llama.cpp pads the attended KV cells to multiples
#: of 256, so a batch across position 256 attends 512 cells where a one-token decode before it
#: attends 256 (the attention dot products get longer; bitwise equality must survive that too)
KV_PAD = 256
#: tokens the bitwise check decodes (alone, then batched): enough for the widest verify across 256
INVARIANCE_TOKENS = KV_PAD + max(SMOKE_WIDTHS) + 8


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _rows(backend: Any, ids: Sequence[int]) -> list[np.ndarray]:
    """Verify ``ids`` at ``backend.n_past`` and return every row's logits (copies)."""
    backend.record_logits = True
    backend.recorded.clear()
    try:
        backend.verify(ids)
        return [row for _, row in backend.recorded]
    finally:
        backend.record_logits = False
        backend.recorded.clear()


def reference_rows(backend: Any, ids: Sequence[int]) -> list[np.ndarray]:
    """Every position's logits, each decoded alone: one token per ``llama_decode`` from an empty
    cache, so no row and no cached key/value ever came from a batch wider than 1."""
    backend.prefill(ids[:1])
    backend.rollback(0)
    rows: list[np.ndarray] = []
    for t in ids:
        rows += _rows(backend, [t])
    return rows


@dataclass
class Invariance:
    """Bitwise comparison of rows computed in batches against the same rows decoded alone."""

    rows: int = 0
    identical: int = 0
    max_abs_diff: float = 0.0
    argmax_flips: int = 0
    first: str = ""  # the first row that differed: "how it was batched, position"
    by_case: dict[str, list[int]] = field(default_factory=dict)  # case -> [rows, identical]

    @property
    def bitwise(self) -> bool:
        return self.rows > 0 and self.identical == self.rows

    def add(self, case: str, first_pos: int, got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> None:
        tally = self.by_case.setdefault(case, [0, 0])
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            same = _same_bits(g, w)
            self.rows += 1
            tally[0] += 1
            if same:
                self.identical += 1
                tally[1] += 1
                continue
            self.max_abs_diff = max(self.max_abs_diff, float(np.abs(g - w).max()))
            self.argmax_flips += int(g.argmax()) != int(w.argmax())
            if not self.first:
                self.first = f"{case}, position {first_pos + i}"

    def line(self) -> str:
        if self.bitwise:
            return f"batch-invariant: all {self.rows} rows bit-identical to one-token decodes"
        return (f"not batch-invariant: {self.rows - self.identical}/{self.rows} rows differ from "
                f"one-token decodes (max |diff| {self.max_abs_diff:.3g}, {self.argmax_flips} argmax "
                f"flips; first: {self.first})")


def invariance_check(backend: Any, ids: Sequence[int], widths: Sequence[int] = SMOKE_WIDTHS,
                     reference: Sequence[np.ndarray] | None = None) -> Invariance:
    """Compare, bit for bit, each position's logits computed (a) in one wide batch (a prefill with
    every row: llama.cpp's default batch), (b) by verify batches of each width in ``widths``, laid
    across the 256-cell KV padding step, after a prefill that kept the cached prefix, and (c) as the
    last row of a prefill that kept a prefix, against the same position decoded alone.

    ``ids`` must be longer than ``KV_PAD + max(widths)``. Leaves the cache empty.
    """
    n = len(ids)
    w_max = max(widths)
    if n < KV_PAD + w_max or n > backend.n_batch:
        raise ValueError(f"need {KV_PAD + w_max}..{backend.n_batch} ids for widths up to {w_max}, got {n}")
    ref = list(reference) if reference is not None else reference_rows(backend, ids)
    out = Invariance()

    backend.rollback(0)
    out.add("prefill (one batch, every row)", 0, _rows(backend, ids), ref)

    base = KV_PAD - w_max // 2 - 1  # the cached prefix every width starts from
    backend.rollback(0)
    backend.prefill(ids[:base])
    for w in widths:
        start = KV_PAD - w // 2  # the batch covers position 256 (for w >= 2)
        backend.rollback(base)
        if start > base:
            out.add("verify lead-ins", base,
                    _rows(backend, ids[base:start]), ref[base:start])
        out.add(f"verify width {w}", start, _rows(backend, ids[start:start + w]), ref[start:start + w])

    for keep, end in ((base, n), (KV_PAD + 1, KV_PAD + 5), (7, 100)):
        backend.prefill(ids)
        backend.record_logits = True
        backend.recorded.clear()
        try:
            backend.prefill(ids[:end], keep=keep)
            got = [row for _, row in backend.recorded]
        finally:
            backend.record_logits = False
            backend.recorded.clear()
        out.add(f"prefill keeping {keep} cached", end - 1, got, ref[end - 1:end])
    backend.rollback(0)
    return out


def smoke_ids(backend: Any, n: int) -> list[int]:
    """``n`` tokens of the smoke text, repeated as needed (BOS first)."""
    ids: list[int] = []
    while len(ids) < n:
        ids += backend.tokenize(SMOKE_TEXT, add_special=not ids)
    return ids[:n]


def smoke_test(backend: LlamaCppBackend, step: Callable[[str], None] = lambda name: None) -> dict[str, Any]:
    """Run the steps on a loaded :class:`LlamaCppBackend`; return what was measured."""
    ids = smoke_ids(backend, N_PREFILL + N_VERIFY)
    prompt, draft = ids[:N_PREFILL], ids[N_PREFILL:N_PREFILL + N_VERIFY]

    step(f"prefill {N_PREFILL} tokens")
    t0 = time.perf_counter()
    backend.prefill(prompt)
    prefill_s = time.perf_counter() - t0

    step(f"verify {N_VERIFY} tokens")
    backend.record_logits = True
    try:
        backend.recorded.clear()
        t0 = time.perf_counter()
        backend.verify(draft)
        verify_s = time.perf_counter() - t0
        batched = [row for _, row in backend.recorded]

        step("rollback")
        backend.rollback(N_PREFILL)
        if backend.n_past != N_PREFILL:
            raise SmokeFailure(f"rollback left {backend.n_past} positions, expected {N_PREFILL}")

        step(f"{N_VERIFY} single-token decodes")
        backend.recorded.clear()
        for t in draft:
            backend.verify([t])
        single = [row for _, row in backend.recorded]
    finally:
        backend.record_logits = False
        backend.recorded.clear()
    step("compare batched and single rows")
    out = compare_rows(batched, single)
    backend.rollback(0)
    out.update(prefill_s=prefill_s, verify_s=verify_s)
    return out


def _say(line: str) -> None:
    print(line, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m promptlookup.backends.llama_cpp_smoke")
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--curve", action="store_true", help="also measure (and cache) the verify cost curve")
    args = ap.parse_args(argv)

    step = lambda name: _say(f"step: {name}")  # noqa: E731 - one-line callback
    result: dict[str, Any] = {}
    step("load the llama.cpp library")
    import llama_cpp

    from promptlookup.backends.llama_cpp import LlamaCppBackend, invariant_build, system_info

    result["system_info"] = system_info(llama_cpp)
    result["invariant_build"] = invariant_build(result["system_info"])

    step("load the model")
    backend = LlamaCppBackend(args.model, n_ctx=1024, n_threads=args.threads)
    result["threads"] = backend.n_threads
    result["flash_attention"] = backend.flash_attention
    try:
        result.update(smoke_test(backend, step))
        step(f"batch invariance, bitwise: {INVARIANCE_TOKENS} tokens decoded alone, then in batches")
        inv = invariance_check(backend, smoke_ids(backend, INVARIANCE_TOKENS))
        result["invariance"] = {"bitwise": inv.bitwise, "rows": inv.rows, "identical": inv.identical,
                                "max_abs_diff": inv.max_abs_diff, "line": inv.line()}
        if result["invariant_build"] and not inv.bitwise:
            raise SmokeFailure(f"built without the batch-dependent kernels, yet {inv.line()}")
        if args.curve:
            from promptlookup.backends.costs import cached_cost_curve

            step("measure the verify cost curve")
            curve = cached_cost_curve(backend, max_tokens=N_VERIFY, refresh=True)
            result["curve_seconds"] = list(curve.seconds)
    except SmokeFailure as exc:
        result["failure"] = str(exc)
    finally:
        backend.close()
    _say("result: " + json.dumps(result))
    return 1 if "failure" in result else 0


if __name__ == "__main__":
    sys.exit(main())
