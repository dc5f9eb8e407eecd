"""A multi-turn coding session replayed against OpenAI-compatible servers, side by side in one run.

Why this workload: the people whose work repeats most (coding agents, editors, chat clients) re-send
the whole conversation every turn and ask for the same file back with one small change, so later
turns carry long prefixes the server has already seen (prefix reuse) and answers that copy earlier
text (prompt lookup, memory across requests). This is the benchmark of issue 14 (not run in CI).

The session: a real source file of this machine's Python installation (``colorsys.py`` of the
stdlib by default: 166 lines, ~1850 SmolLM2 tokens, six public functions; ``--file`` for another,
capped at ``--max-lines``), a system prompt, then ``--turns`` (6) user turns, each asking for one
small change to one function (chosen from the file by ``ast``, in source order) and the whole file
back. Every turn re-sends system + all turns so far; the assistant turns fed back are each server's
own answers (a real session). With ``--max-tokens`` 512 the sixth request is ~5300 tokens, inside
the 8192 context every server gets. Temperature 0 everywhere (llama-cpp-python's server also gets
``repeat_penalty`` 1.0: its request default is 1.1, which is not greedy).

Rows (``--rows``, names or numbers, in that order; each server is started here as a subprocess on
a free 127.0.0.1 port, waited for, warmed up by one tiny untimed request, used, and always stopped):

1. ``ours``        ``python -m promptlookup serve -m MODEL -t T -c 8192`` (speculation default,
                   shared history, prefix reuse), with this checkout's ``src`` first on its
                   PYTHONPATH (``--our-src DIR`` for another tree).
2. ``ours-off``    the same with ``--speculate off``.
3. ``lcp``         ``python -m llama_cpp.server`` (llama-cpp-python 0.3.36) plain, with
                   ``--logits_all false`` (its faster setting when nothing drafts).
4. ``lcp-pld``     the same with ``--draft_model prompt-lookup-decoding
                   --draft_model_num_pred_tokens 10`` (``logits_all`` left at its default, true,
                   which a draft model needs).
5. ``ls``          llama.cpp's ``llama-server`` built from the vendored sources with our safe ISA
                   flags (``benchmarks/llama_tools.py``), ``-np 1``, plain.
6. ``ls-spec``     the same with an n-gram speculative mode, ``--llama-spec`` (default ngram-mod,
                   i.e. ``--spec-default``, the best of a short comparison: see DEFAULT_SPEC;
                   repeatable: one row per value, for comparing modes in one run; see SPEC_PRESETS).

Measured per turn from the streamed response (``stream_options.include_usage``): TTFT (request sent
to the first non-empty content delta), wall (request sent to ``data: [DONE]``), completion tokens
(``usage``, else ``timings.predicted_n``, else the answer re-tokenized by llama-cpp-python's
``/extras/tokenize/count``: its server reports neither), tok/s = tokens / wall (what the session
feels), decode tok/s = (tokens - 1) / (wall - TTFT), acceptance = ``timings.draft_n_accepted`` /
``timings.draft_n`` where the server reports it, ``cache_n`` (prompt tokens not prefilled again)
likewise. "= row 1" says whether a row's answer text equals the first row's for that turn (all
rows run one model greedily, but engines differ in kernels, batching and attention, so a near-tie
can flip); "= plain" compares a speculating row with the same engine's plain row (ours with
ours-off, lcp-pld with lcp, ls-spec with ls): exact speculation gives "yes" unless the engine's
batched verify computes other logits than its one-token decode. Once answers differ, later prompts
differ too: ``--answers FILE`` (an earlier run's ``--outputs``) feeds every row one recorded
session's answers instead, so every row gets the same prompts (a controlled comparison).

    .venv/bin/python benchmarks/serve_session.py [--rows ours,ours-off,lcp,lcp-pld,ls,ls-spec] \
        [--turns 6] [--max-tokens 512] [-t 2] [--model GGUF] [--md FILE] [--csv FILE] [--outputs FILE]

The whole run takes ~20-25 min on 2 cores (the first llama-server build ~10 min more). Run it on a
quiet machine: with -t 2 and other work on both cores, ggml's spinning threads fall to ~1 tok/s
(measured here at load 6); on a shared machine -t 1 gives figures that at least mean something.
"""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import http.client
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SYSTEM = ("You are a careful coding assistant. When asked to change a file, reply with the whole "
          "updated file in one ```python code block and nothing else.")

# One small change per turn, cycling; {f} is a function of the file, {p} its first parameter.
EDITS = (
    "Rename the function `{f}` to `convert_{f}` and show the whole file.",
    "Add a one-line docstring to the function `{f}` and show the whole file.",
    "Add type hints to the parameters and the return value of `{f}` and show the whole file.",
    "Add a comment line above the function `{f}` saying what it computes, and show the whole file.",
    "Rename the parameter `{p}` of `{f}` to `{p}_in` and show the whole file.",
    "Make `{f}` raise ValueError when any argument is negative, and show the whole file.",
)

DEFAULT_FILE = "colorsys.py"
OUR_SRC = Path(__file__).resolve().parents[1] / "src"  # our rows run the checkout this script is in
CTX = 8192

# --llama-spec values: a name here, or raw llama-server arguments (anything starting with "--").
SPEC_PRESETS: dict[str, tuple[str, ...]] = {
    "ngram-simple": ("--spec-type", "ngram-simple"),
    "ngram-map-k": ("--spec-type", "ngram-map-k"),
    "ngram-map-k4v": ("--spec-type", "ngram-map-k4v"),
    "ngram-mod": ("--spec-default",),  # ngram-mod, n_match 24, n_min 48, n_max 64
    "ngram-cache": ("--spec-type", "ngram-cache"),
}
# Chosen by a short comparison (2 turns x 256 tokens, -t 1, on the shared 2-core machine, 12:36 UTC;
# wall over plain llama-server's): ngram-mod 0.74 (52% of 214 drafted accepted), ngram-simple 1.07
# (57% of 540), ngram-map-k 1.32 (58% of 480), ngram-cache 1.36 (26% of 794). ngram-mod is also what
# llama-server's own --spec-default enables. Rerun the comparison with one --llama-spec per mode.
DEFAULT_SPEC = "ngram-mod"

ROW_KEYS = ("ours", "ours-off", "lcp", "lcp-pld", "ls", "ls-spec")


# -- the session (pure) ---------------------------------------------------------------------------
def default_source(stdlib: Path | None = None) -> Path:
    """The stdlib file the session edits: ``colorsys.py`` when present (every CPython has it), else
    the first ``*.py`` of the stdlib folder, in name order, with 150-300 lines (deterministic)."""
    lib = Path(stdlib or sysconfig.get_paths()["stdlib"])
    if (lib / DEFAULT_FILE).is_file():
        return lib / DEFAULT_FILE
    for p in sorted(lib.glob("*.py")):
        n = p.read_text(encoding="utf-8", errors="replace").count("\n")
        if 150 <= n <= 300:
            return p
    raise SystemExit(f"serve_session: error: no 150-300 line module in {lib}; pass --file")


def cap_lines(text: str, max_lines: int) -> str:
    """The first ``max_lines`` lines: the cap that keeps six turns inside an 8192 context."""
    lines = text.splitlines(keepends=True)
    return "".join(lines[:max_lines])


def functions(source: str) -> list[tuple[str, str | None]]:
    """Public top-level functions in source order, each with its first parameter (or None).
    Falls back to every top-level function, then to the classes, so any module yields targets."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a capped file may end mid-statement: parse what parses
        tree = ast.parse("")
        for n in range(source.count("\n"), 0, -1):
            try:
                tree = ast.parse(cap_lines(source, n))
                break
            except SyntaxError:
                continue
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    public = [n for n in defs if not n.name.startswith("_")] or defs
    out = [(n.name, n.args.args[0].arg if n.args.args else None) for n in public]
    if not out:
        out = [(n.name, None) for n in tree.body if isinstance(n, ast.ClassDef)]
    return out


def plan_edits(source: str, turns: int) -> list[str]:
    """One instruction per turn: turn i applies EDITS[i % 6] to the i-th function (cycling)."""
    funcs = functions(source)
    if not funcs:
        raise SystemExit("serve_session: error: the file defines no function or class to edit")
    out = []
    for i in range(turns):
        name, param = funcs[i % len(funcs)]
        edit = EDITS[i % len(EDITS)]
        if "{p}" in edit and param is None:
            edit = EDITS[1]
        out.append(edit.format(f=name, p=param))
    return out


def user_turns(name: str, source: str, turns: int) -> list[str]:
    """The user messages: the first carries the file, the rest only the next change."""
    edits = plan_edits(source, turns)
    first = f"Here is the file `{name}`:\n\n```python\n{source.rstrip()}\n```\n\n{edits[0]}"
    return [first, *(f"Now {e[0].lower()}{e[1:]}" for e in edits[1:])]


def messages(users: Sequence[str], answers: Sequence[str], system: str = SYSTEM) -> list[dict]:
    """The conversation re-sent for turn ``len(answers)``: system, then user/assistant pairs so
    far, then the next user turn."""
    msgs = [{"role": "system", "content": system}]
    for u, a in zip(users, answers, strict=False):
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    msgs.append({"role": "user", "content": users[len(answers)]})
    return msgs


# -- one streamed response (pure) -----------------------------------------------------------------
@dataclass
class TurnMetrics:
    """What one streamed chat completion measured (times in seconds from the request's send)."""

    ttft: float | None = None
    wall: float = 0.0
    text: str = ""
    tokens: int | None = None
    tokens_from: str = ""
    prompt_n: int | None = None
    cache_n: int | None = None
    draft_n: int | None = None
    draft_accepted: int | None = None
    finish_reason: str | None = None
    error: str = ""

    @property
    def tps(self) -> float | None:
        """Completion tokens over wall time: the rate the session feels, prefill included."""
        return self.tokens / self.wall if self.tokens and self.wall > 0 else None

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first over the time after the first: the generation rate alone."""
        if not self.tokens or self.tokens < 2 or self.ttft is None or self.wall <= self.ttft:
            return None
        return (self.tokens - 1) / (self.wall - self.ttft)

    @property
    def acceptance(self) -> float | None:
        """Accepted over drafted tokens, where the server reports drafting at all."""
        if self.draft_n is None or self.draft_accepted is None or self.draft_n == 0:
            return None
        return self.draft_accepted / self.draft_n


def parse_stream(events: Iterable[tuple[float, str]]) -> TurnMetrics:
    """Metrics from a recorded SSE stream: ``(seconds since send, line)`` per non-empty line.

    Takes the last ``usage`` and ``timings`` seen (llama-server and ours put them in the final
    chunks); comment lines (sse-starlette's pings) are skipped; an ``error`` object ends it."""
    m = TurnMetrics()
    parts: list[str] = []
    usage: dict | None = None
    timings: dict | None = None
    for t, line in events:
        m.wall = t
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            m.error = f"bad SSE data: {data[:80]}"
            continue
        if "error" in obj:
            m.error = str(obj["error"].get("message", obj["error"]) if isinstance(obj["error"], dict)
                          else obj["error"])[:200]
            break
        for ch in obj.get("choices") or ():
            piece = (ch.get("delta") or {}).get("content") or ""
            if piece:
                if m.ttft is None:
                    m.ttft = t
                parts.append(piece)
            if ch.get("finish_reason"):
                m.finish_reason = ch["finish_reason"]
        usage = obj.get("usage") or usage
        timings = obj.get("timings") or timings
    m.text = "".join(parts)
    if usage:
        m.tokens, m.tokens_from = usage.get("completion_tokens"), "usage"
        m.prompt_n = usage.get("prompt_tokens")
    if timings:
        if m.tokens is None and timings.get("predicted_n") is not None:
            m.tokens, m.tokens_from = timings["predicted_n"], "timings"
        m.cache_n = timings.get("cache_n")
        if m.prompt_n is None and timings.get("prompt_n") is not None:
            m.prompt_n = timings["prompt_n"] + (m.cache_n or 0)
        m.draft_n = timings.get("draft_n")
        m.draft_accepted = timings.get("draft_n_accepted")
    return m


# -- results and tables (pure) --------------------------------------------------------------------
@dataclass
class TurnResult:
    """One turn of one row, with whether its text equals the reference row's for that turn."""

    row: str
    turn: int
    m: TurnMetrics
    same: str = ""  # vs the first row: "ref", "yes", "no @N" (first differing character), ""
    key: str = ""  # ROW_KEYS entry, to find the same engine's plain row
    same_plain: str = ""  # vs that plain row: "plain" (it is one), "yes", "no @N", "" (none ran)


@dataclass
class RowTotal:
    """One row's whole session."""

    row: str
    turns: list[TurnResult] = field(default_factory=list)
    error: str = ""

    @property
    def ttft(self) -> float:
        return sum(r.m.ttft or 0.0 for r in self.turns)

    @property
    def wall(self) -> float:
        return sum(r.m.wall for r in self.turns)

    @property
    def tokens(self) -> int | None:
        vals = [r.m.tokens for r in self.turns]
        return sum(vals) if vals and all(v is not None for v in vals) else None

    @property
    def draft(self) -> tuple[int, int] | None:
        """(accepted, drafted) over the turns that report them (llama-server omits both in a turn
        that drafted nothing); None when no turn does."""
        rep = [r.m for r in self.turns if r.m.draft_n is not None and r.m.draft_accepted is not None]
        if not rep:
            return None
        return (sum(m.draft_accepted for m in rep), sum(m.draft_n for m in rep))


def compare(text: str, ref: str) -> str:
    """"yes" when equal, else "no @N" with the first differing character's index."""
    if text == ref:
        return "yes"
    n = next((i for i, (a, b) in enumerate(zip(text, ref, strict=False)) if a != b), min(len(text), len(ref)))
    return f"no @{n}"


PLAIN_OF = {"ours": "ours-off", "lcp-pld": "lcp", "ls-spec": "ls"}


def annotate_plain(results: Sequence[TurnResult]) -> None:
    """Set ``same_plain`` on every turn: plain rows say so, speculating rows compare their text
    with the same engine's plain row for that turn (the first such row that answered it)."""
    plain: dict[tuple[str, int], str] = {}
    for r in results:
        if r.key in PLAIN_OF.values() and not r.m.error:
            plain.setdefault((r.key, r.turn), r.m.text)
    for r in results:
        if r.m.error:
            continue
        if r.key in PLAIN_OF.values():
            r.same_plain = "plain"
        elif (PLAIN_OF.get(r.key), r.turn) in plain:
            r.same_plain = compare(r.m.text, plain[(PLAIN_OF[r.key], r.turn)])


def _count(turns: Sequence[TurnResult], attr: str, ok: tuple[str, ...]) -> str:
    marks = [m for m in (getattr(r, attr) for r in turns) if m]  # the turns compared at all
    if not marks:
        return ""
    if all(x == "plain" for x in marks):
        return "plain"
    return f"{sum(x in ok for x in marks)}/{len(marks)}"


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _acc(accepted: int | None, drafted: int | None) -> str:
    if accepted is None or drafted is None:
        return "n/a"
    if drafted == 0:
        return "0 drafted"
    return f"{100 * accepted / drafted:.0f}% ({accepted}/{drafted})"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right_from: int) -> str:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _int(x: int | None) -> str:
    return "n/a" if x is None else str(x)


def turn_table(results: Sequence[TurnResult]) -> str:
    """Per turn, the rows side by side (grouped by turn, rows in run order)."""
    header = ("turn", "row", "prompt", "cached", "TTFT s", "wall s", "tokens", "tok/s", "decode tok/s",
              "accepted", "= row 1", "= plain")
    body = []
    for r in sorted(results, key=lambda r: r.turn):  # stable: run order within a turn
        m = r.m
        if m.error:
            body.append((str(r.turn), r.row, "error: " + m.error, *[""] * 9))
            continue
        body.append((str(r.turn), r.row, _int(m.prompt_n), _int(m.cache_n), _f(m.ttft, ".2f"),
                     f"{m.wall:.2f}", _int(m.tokens), _f(m.tps, ".1f"), _f(m.decode_tps, ".1f"),
                     _acc(m.draft_accepted, m.draft_n), r.same, r.same_plain))
    return _table(header, body, 2)


def total_table(totals: Sequence[RowTotal]) -> str:
    """The whole session per row; "rel. wall" is the row's wall over the first row's."""
    header = ("row", "turns", "TTFT s (sum)", "wall s", "tokens", "tok/s", "accepted", "= row 1",
              "= plain", "rel. wall")
    base = next((t.wall for t in totals if t.turns and not t.error), None)
    body = []
    for t in totals:
        if t.error and not t.turns:
            body.append((t.row, "0", "error: " + t.error, *[""] * 7))
            continue
        tok = t.tokens
        draft = t.draft
        turns = str(len(t.turns)) + (f" (error: {t.error})" if t.error else "")
        body.append((t.row, turns, f"{t.ttft:.2f}", f"{t.wall:.2f}", _int(tok),
                     _f(tok / t.wall if tok and t.wall > 0 else None, ".1f"),
                     _acc(*(draft or (None, None))), _count(t.turns, "same", ("yes", "ref")),
                     _count(t.turns, "same_plain", ("yes",)),
                     _f(t.wall / base if base else None, ".2f")))
    return _table(header, body, 1)


# same_plain is "" in a row that ran before its plain row (the default order runs ours before
# ours-off): the markdown has it complete, and text_sha1 compares any two rows.
CSV_FIELDS = ("row", "turn", "prompt_n", "cache_n", "ttft_s", "wall_s", "tokens", "tokens_from", "tok_s",
              "decode_tok_s", "draft_n", "draft_accepted", "acceptance", "finish", "same", "same_plain",
              "chars", "text_sha1", "error")


def csv_row(r: TurnResult) -> dict:
    """One turn as a CSV row (raw numbers, not the table's rounding)."""
    m = r.m
    return {"row": r.row, "turn": r.turn, "prompt_n": m.prompt_n, "cache_n": m.cache_n, "ttft_s": m.ttft,
            "wall_s": m.wall, "tokens": m.tokens, "tokens_from": m.tokens_from, "tok_s": m.tps,
            "decode_tok_s": m.decode_tps, "draft_n": m.draft_n, "draft_accepted": m.draft_accepted,
            "acceptance": m.acceptance, "finish": m.finish_reason, "same": r.same,
            "same_plain": r.same_plain, "chars": len(m.text),
            "text_sha1": hashlib.sha1(m.text.encode()).hexdigest()[:12], "error": m.error}


def csv_total(t: RowTotal) -> dict:
    """A row's session total as a CSV row (turn "total")."""
    d = t.draft
    tok = t.tokens
    return {"row": t.row, "turn": "total", "ttft_s": t.ttft, "wall_s": t.wall, "tokens": tok,
            "tok_s": tok / t.wall if tok and t.wall > 0 else None,
            "draft_n": d[1] if d else None, "draft_accepted": d[0] if d else None,
            "acceptance": d[0] / d[1] if d and d[1] else None,
            "same": sum(r.same in ("yes", "ref") for r in t.turns), "error": t.error}


# -- servers (processes) --------------------------------------------------------------------------
def free_port() -> int:
    """A port free on 127.0.0.1 now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RowSpec:
    """How to start one row's server and what to add to its requests."""

    key: str
    label: str
    argv: list[str]
    env: dict[str, str]
    extra_body: dict = field(default_factory=dict)
    retokenize: bool = False  # completion tokens from /extras/tokenize/count (llama-cpp-python)


def spec_args(spec: str) -> tuple[str, ...]:
    """llama-server arguments for a --llama-spec value: a preset name or raw arguments."""
    if spec in SPEC_PRESETS:
        return SPEC_PRESETS[spec]
    if spec.startswith("--"):
        return tuple(shlex.split(spec))
    raise SystemExit(f"serve_session: error: --llama-spec {spec!r}: one of {', '.join(SPEC_PRESETS)}, "
                     "or raw llama-server arguments starting with --")


def row_specs(keys: Sequence[str], args: argparse.Namespace) -> list[RowSpec]:
    """The rows to run, in order (the port is added when each starts)."""
    model, t = str(args.model), str(args.threads)
    py = sys.executable
    env = dict(os.environ)
    our_env = dict(env)
    if args.our_src:
        our_env["PYTHONPATH"] = os.pathsep.join([str(Path(args.our_src).resolve()),
                                                 *filter(None, [env.get("PYTHONPATH")])])
    ours = [py, "-m", "promptlookup", "serve", "-m", model, "-t", t, "-c", str(CTX), "--host", "127.0.0.1"]
    lcp = [py, "-m", "llama_cpp.server", "--model", model, "--n_ctx", str(CTX), "--n_threads", t,
           "--n_threads_batch", t, "--host", "127.0.0.1"]
    greedy_lcp = {"repeat_penalty": 1.0}
    out: list[RowSpec] = []
    for k in keys:
        if k == "ours":
            out.append(RowSpec("ours", "promptlookup serve", ours, our_env))
        elif k == "ours-off":
            out.append(RowSpec("ours-off", "promptlookup serve --speculate off",
                               [*ours, "--speculate", "off"], our_env))
        elif k == "lcp":
            out.append(RowSpec("lcp", "llama_cpp.server", [*lcp, "--logits_all", "false"], env, greedy_lcp,
                               True))
        elif k == "lcp-pld":
            out.append(RowSpec("lcp-pld", f"llama_cpp.server prompt-lookup {args.lcp_pred}",
                               [*lcp, "--draft_model", "prompt-lookup-decoding",
                                "--draft_model_num_pred_tokens", str(args.lcp_pred)], env, greedy_lcp, True))
        elif k in ("ls", "ls-spec"):
            ls = [str(args.llama_server), "-m", model, "-t", t, "-tb", t, "-c", str(CTX), "-np", "1",
                  "--host", "127.0.0.1"]
            if k == "ls":
                out.append(RowSpec("ls", "llama-server", ls, env))
            else:
                for s in args.llama_spec:
                    out.append(RowSpec("ls-spec", f"llama-server {s}", [*ls, *spec_args(s)], env))
    return out


class Server:
    """A server subprocess in its own process group: started, waited for, always stopped.

    Its own session so that a Ctrl-C here reaches only this script, which then stops the server
    itself (SIGTERM to the group, SIGKILL after a bounded wait)."""

    def __init__(self, spec: RowSpec, log: Path, start_timeout: float) -> None:
        self.spec, self.log, self.start_timeout = spec, log, start_timeout
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        argv = [*self.spec.argv, "--port", str(self.port)]
        with self.log.open("w", encoding="utf-8") as f:
            f.write(shlex.join(argv) + "\n")
        logf = self.log.open("a", encoding="utf-8")
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT, env=self.spec.env, start_new_session=True)
        finally:
            logf.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _get(self, path: str) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode} while starting: {self.log_tail()}")
            try:
                st = self._get("/health")
                if st == 404:  # llama-cpp-python's server has no /health
                    st = self._get("/v1/models")
                if st == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"not ready after {self.start_timeout:.0f} s: {self.log_tail()}")

    def log_tail(self, n: int = 3) -> str:
        lines = self.log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        return " / ".join(lines[-n:])[-400:]

    def stop(self) -> None:
        """SIGTERM to the group, 15 s, then SIGKILL; returns within ~20 s whatever the server does."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                return
            try:
                p.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def model_id(self) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/v1/models")
            data = json.loads(conn.getresponse().read())
            return data["data"][0]["id"]
        except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError):
            return "model"
        finally:
            conn.close()

    def post_json(self, path: str, body: dict, timeout: float = 60) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return json.loads(resp.read())
        finally:
            conn.close()

    def stream_chat(self, body: dict, timeout: float) -> list[tuple[float, str]]:
        """POST a streaming chat completion; every non-empty line with its time since the send."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        events: list[tuple[float, str]] = []
        try:
            t0 = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}")
            while True:
                line = resp.readline()
                t = time.perf_counter() - t0
                if not line:
                    break
                s = line.decode("utf-8", errors="replace").rstrip("\r\n")
                if s:
                    events.append((t, s))
                if s == "data: [DONE]":
                    break
                if t > timeout:
                    raise RuntimeError(f"no [DONE] after {timeout:.0f} s")
        finally:
            conn.close()
        return events


# -- the run ---------------------------------------------------------------------------------------
def machine_line() -> str:
    """CPU, cores and load: the figures mean little without them on a shared machine."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{cpu}, {os.cpu_count()} logical cores, load average {load}"


def tree_line(src: str) -> str:
    """Which code our rows ran: the folder and its git commit (``+dirty`` with local changes)."""
    def git(*a: str) -> str:
        r = subprocess.run(["git", "-C", src, *a], capture_output=True, text=True, timeout=20)
        return r.stdout.strip() if r.returncode == 0 else ""
    commit = git("rev-parse", "--short", "HEAD")
    dirty = "+dirty" if commit and git("status", "--porcelain", "--", ".") else ""
    return f"{src} ({commit}{dirty})" if commit else src


def run_row(spec: RowSpec, users: list[str], args: argparse.Namespace, logdir: Path,
            ref: dict[int, str], emit, fixed: Sequence[str] | None = None) -> RowTotal:
    """Start the server, warm it up, play the session, stop it. The assistant turns fed back are
    the server's own answers, or ``fixed`` (one recorded session's, the same for every row)."""
    total = RowTotal(spec.label)
    log = logdir / f"{len(list(logdir.iterdir())):02d}-{spec.key}.log"
    print(f"[serve_session] {spec.label}: starting ({log})", file=sys.stderr, flush=True)
    try:
        with Server(spec, log, args.start_timeout) as srv:
            model = srv.model_id()
            base = {"model": model, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}, **spec.extra_body}
            if args.warmup:  # untimed: page the model in, allocate the graphs
                srv.stream_chat({**base, "messages": [{"role": "user", "content": "Say OK."}],
                                 "max_tokens": 4}, args.request_timeout)
            answers: list[str] = []
            for i in range(len(users)):
                body = {**base, "messages": messages(users, answers), "max_tokens": args.max_tokens}
                try:
                    m = parse_stream(srv.stream_chat(body, args.request_timeout))
                except (OSError, http.client.HTTPException, RuntimeError) as e:
                    m = TurnMetrics(error=str(e)[:200])
                if spec.retokenize and m.tokens is None and m.text:
                    try:
                        m.tokens = srv.post_json("/extras/tokenize/count", {"input": m.text})["count"]
                        m.tokens_from = "retokenized"
                    except (OSError, http.client.HTTPException, ValueError, KeyError):
                        pass
                r = TurnResult(spec.label, i + 1, m, key=spec.key)
                if not m.error:
                    r.same = compare(m.text, ref[i + 1]) if i + 1 in ref else "ref"
                    ref.setdefault(i + 1, m.text)
                if not m.error:  # an errored turn is in the per-turn table, not in the totals
                    total.turns.append(r)
                emit(r)
                acc = _acc(m.draft_accepted, m.draft_n)
                print(f"[serve_session] {spec.label} turn {i + 1}: ttft {_f(m.ttft, '.2f')} s, wall "
                      f"{m.wall:.2f} s, {_int(m.tokens)} tokens, accepted {acc}, same {r.same}"
                      + (f", error {m.error}" if m.error else ""), file=sys.stderr, flush=True)
                if m.error:
                    total.error = f"turn {i + 1}: {m.error}"
                    break
                answers.append(fixed[i] if fixed else m.text)
    except (RuntimeError, OSError, http.client.HTTPException) as e:  # start or warm-up failed
        total.error = str(e)[:300]
        print(f"[serve_session] {spec.label}: {total.error}", file=sys.stderr, flush=True)
    return total


def load_answers(path: Path, row: str | None, turns: int) -> tuple[str, list[str]]:
    """One row's answers from an ``--outputs`` file, enough for ``turns`` turns (the last turn's
    answer is not fed back, so ``turns - 1`` suffice)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not data:
        raise SystemExit(f"serve_session: error: {path}: not an --outputs file")
    row = row or next(iter(data))
    texts = data.get(row)
    if not isinstance(texts, list) or len(texts) < turns - 1 or not all(isinstance(t, str) for t in texts):
        raise SystemExit(f"serve_session: error: {path}: no {turns - 1} answers for row {row!r} "
                         f"(rows: {', '.join(data)})")
    return row, texts


def report(header: str, results: list[TurnResult], totals: list[RowTotal]) -> str:
    """The markdown: header, the per-turn table, the whole-session table."""
    annotate_plain(results)
    return (f"{header}\n\n### Per turn\n\n{turn_table(results)}\n### Whole session\n\n"
            f"{total_table(totals)}")


def parse_rows(value: str) -> list[str]:
    """``--rows``: names or 1-based numbers, comma-separated, in the order given."""
    out = []
    for part in filter(None, (p.strip() for p in value.split(","))):
        key = ROW_KEYS[int(part) - 1] if part.isdigit() and 1 <= int(part) <= len(ROW_KEYS) else part
        if key not in ROW_KEYS:
            raise argparse.ArgumentTypeError(f"unknown row {part!r}: one of {', '.join(ROW_KEYS)} or 1-6")
        out.append(key)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=parse_rows, default=list(ROW_KEYS),
                    help=f"comma-separated, names or 1-6 (default {','.join(ROW_KEYS)})")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--model", type=Path, default=None, help="GGUF (default: the bundled SmolLM2-135M)")
    ap.add_argument("--file", type=Path, default=None,
                    help=f"the source file (default: stdlib {DEFAULT_FILE})")
    ap.add_argument("--max-lines", type=int, default=300, help="cap on the file's lines (default 300)")
    ap.add_argument("--our-src", default=str(OUR_SRC), metavar="DIR",
                    help="PYTHONPATH for our server rows (default: this checkout's src, whatever "
                         "promptlookup the venv has installed)")
    ap.add_argument("--llama-server", type=Path, default=None,
                    help="llama-server binary (default: build it with benchmarks/llama_tools.py)")
    ap.add_argument("--llama-spec", action="append", default=None, metavar="SPEC",
                    help=f"row ls-spec's mode, repeatable: {', '.join(SPEC_PRESETS)} or raw '--...' "
                         f"arguments (default {DEFAULT_SPEC})")
    ap.add_argument("--lcp-pred", type=int, default=10, help="row lcp-pld's num_pred_tokens (default 10)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--request-timeout", type=float, default=900)
    ap.add_argument("--md", type=Path, default=None, help="write the tables here (rewritten after each row)")
    ap.add_argument("--csv", type=Path, default=None, help="raw rows, written as each turn finishes")
    ap.add_argument("--outputs", type=Path, default=None,
                    help="the answers as JSON ({row: [text per turn]}), to see where rows differ")
    ap.add_argument("--answers", type=Path, default=None, metavar="JSON",
                    help="feed every row the same assistant turns: one row's answers from an earlier "
                         "--outputs file (default: each server's own answers, a real session)")
    ap.add_argument("--answers-row", default=None, metavar="LABEL",
                    help="which row of --answers (default: its first)")
    ap.add_argument("--logs", type=Path, default=None, help="server logs folder (default: a temp folder)")
    args = ap.parse_args(argv)
    args.llama_spec = args.llama_spec or [DEFAULT_SPEC]
    for s in args.llama_spec:
        spec_args(s)
    if args.model is None:
        from promptlookup.backends.models import bundled_model_path
        args.model = bundled_model_path()
    if any(k in ("ls", "ls-spec") for k in args.rows) and args.llama_server is None:
        sys.path.insert(0, str(Path(__file__).parent))
        import llama_tools
        args.llama_server = llama_tools.ensure_server()

    path = args.file or default_source()
    source = cap_lines(path.read_text(encoding="utf-8"), args.max_lines)
    users = user_turns(path.name, source, args.turns)
    fixed = None
    if args.answers:
        args.answers_row, fixed = load_answers(args.answers, args.answers_row, args.turns)
    logdir = args.logs or Path(tempfile.mkdtemp(prefix="serve_session-"))
    logdir.mkdir(parents=True, exist_ok=True)
    specs = row_specs(args.rows, args)
    header = (f"## Serve session: {path.name} ({source.count(chr(10))} lines), {args.turns} turns, "
              f"max_tokens {args.max_tokens}, temperature 0, {args.threads} threads, context {CTX}\n\n"
              f"Model {Path(args.model).name}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
              f"start: {machine_line()}.\n\nRows: " + "; ".join(f"**{s.label}**: `{shlex.join(s.argv)}`"
                                                                for s in specs))
    header += (f".\n\nAssistant turns fed back: {args.answers_row}'s answers from "
               f"{args.answers} (the same prompts for every row)" if fixed else
               ".\n\nAssistant turns fed back: each server's own answers")
    if any(s.key.startswith("ours") for s in specs):
        header += f".\n\nOur rows ran {tree_line(args.our_src)}"

    def sigterm(signum, frame):  # so the finally blocks stop the servers
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, sigterm)
    results: list[TurnResult] = []
    totals: list[RowTotal] = []
    ref: dict[int, str] = {}
    csvf = args.csv.open("w", newline="", encoding="utf-8") if args.csv else None
    writer = csv.DictWriter(csvf, CSV_FIELDS) if csvf else None
    if writer:
        writer.writeheader()
        csvf.flush()

    def emit(r: TurnResult) -> None:
        results.append(r)
        annotate_plain(results)
        if writer:
            writer.writerow(csv_row(r))
            csvf.flush()

    try:
        for spec in specs:
            t = run_row(spec, users, args, logdir, ref, emit, fixed)
            totals.append(t)
            if writer:
                writer.writerow(csv_total(t))
                csvf.flush()
            if args.md:
                args.md.write_text(report(header, results, totals), encoding="utf-8")
            if args.outputs:
                answers = {t.row: [r.m.text for r in t.turns] for t in totals}
                args.outputs.write_text(json.dumps(answers, indent=1, ensure_ascii=False), encoding="utf-8")
    except KeyboardInterrupt:
        print("[serve_session] interrupted; servers stopped", file=sys.stderr)
        return 130
    finally:
        if csvf:
            csvf.close()
    text = report(header + f"\n\nEnd: {machine_line()}.", results, totals)
    print(text)
    if args.md:
        args.md.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
