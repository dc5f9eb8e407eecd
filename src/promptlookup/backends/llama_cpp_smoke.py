"""The llama.cpp smoke test: the decode paths speculation uses, run once on the bundled model.

Why: a llama.cpp build can be fine for a one-token decode and still die by SIGILL (or compute
garbage) in the matmul kernels a multi-token batch takes: ggml's AMX path did exactly that. So the
test runs what speculation runs: a prefill of a few hundred tokens, a verify of 9 tokens with every
row's logits, a rollback, then the same 9 tokens decoded one at a time, and checks that each batched
row agrees with its single-token row (batched logits are not bit-identical on llama.cpp, so within a
tolerance, and the argmax must agree wherever the top two are not nearly tied).

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


def smoke_test(backend: LlamaCppBackend, step: Callable[[str], None] = lambda name: None) -> dict[str, Any]:
    """Run the steps on a loaded :class:`LlamaCppBackend`; return what was measured."""
    ids: list[int] = []
    while len(ids) < N_PREFILL + N_VERIFY:
        ids += backend.tokenize(SMOKE_TEXT, add_special=not ids)
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

    result["system_info"] = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    from promptlookup.backends.llama_cpp import LlamaCppBackend

    step("load the model")
    backend = LlamaCppBackend(args.model, n_ctx=1024, n_threads=args.threads)
    result["threads"] = backend.n_threads
    try:
        result.update(smoke_test(backend, step))
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
