"""A scripted multi-turn tool-using session, speculating vs ``speculate: off`` (issue 27).

Why this workload: an agent's turns copy. It reads a file (the tool's result lands in the prompt),
then edits it (the call's arguments quote that file), then shows the result (more quoting). Prompt
lookup drafts exactly such copies, and the forced calls go through the grammar mask at every
verified position, so this is where speculation and tool calling meet. The session, per setting:

1. the user asks to fix a typo; a forced ``read_file`` call (named ``tool_choice``);
2. the file comes back as the tool's result; a forced ``edit_file`` call (named) whose
   ``old``/``new`` arguments quote the file;
3. ``ok`` comes back; the model shows the fixed function, free text (``tool_choice: none``).

Each turn sends the whole conversation again (as an agent does), on one engine per setting (its
prefix cache and suffix history live across the turns, as on a server; a one-token request first
builds the grammar's vocabulary view, which is per engine, not per request). Greedy: every setting must
write the same tokens as ``off`` (column ``same``). ``prefill s`` is the prompt's new part (the tool
results land there), ``generation s`` the decodes and drafting after it (the engine's counters).
Times are medians over ``--repeat`` sessions,
each on a fresh engine; compare settings within one run, on a quiet machine (``uptime`` load < 1.5).

The model: by default the bundled SmolLM2 with the Hermes tool template of ``tests/tool_gguf.py``
(made in the temp directory on first use), or ``-m`` any GGUF whose template supports tools::

    python benchmarks/agent_loop.py -t 1 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

FILE = '''import smtplib
from email.message import EmailMessage


def send_report(host: str, port: int, sender: str, to: list[str], body: str) -> None:
    """Send the nightly report; the server must recieve it before 6 am."""
    msg = EmailMessage()
    msg["Subject"] = "Nightly report"
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    msg.set_content(body)
    with smtplib.SMTP(host, port, timeout=30) as server:
        server.starttls()
        server.send_message(msg)


def recieve_count(log: list[str]) -> int:
    """How many reports the server did recieve, from its log."""
    return sum(1 for line in log if "recieved" in line)
'''
PATH = "src/mail.py"
TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the project",
        "parameters": {"type": "object", "properties": {"path": {"type": "string", "maxLength": 60}},
                       "required": ["path"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "edit_file", "description": "Replace the text old by the text new in a file",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "maxLength": 60}, "old": {"type": "string", "maxLength": 300},
            "new": {"type": "string", "maxLength": 300}},
            "required": ["path", "old", "new"], "additionalProperties": False}}},
]
TURNS = [  # (tool_choice, max_tokens)
    ({"type": "function", "function": {"name": "read_file"}}, 60),
    ({"type": "function", "function": {"name": "edit_file"}}, 240),
    ("none", 240),
]
SETTINGS = ["off", "ngram", "suffix", "auto"]


def default_model() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tool_gguf import hermes_gguf

    return hermes_gguf()


def session(engine, speculate: str) -> list[dict]:
    """One scripted session; per turn: seconds, tokens, decodes, and the reply (for ``same``)."""
    messages = [{"role": "user", "content": f"The word 'recieve' is misspelled in {PATH}. Read the file, "
                                            "fix it, then show me the fixed function."}]
    results = [f"{FILE}", "ok: 1 replacement"]
    out = []
    for i, (choice, max_tokens) in enumerate(TURNS):
        t0 = time.perf_counter()
        c = engine.chat(messages, tools=TOOLS, tool_choice=choice, max_tokens=max_tokens, temperature=0,
                        speculate=speculate)
        took = time.perf_counter() - t0
        out.append({"s": took, "tokens": len(c.tokens), "decodes": c.counters.decodes,
                    "prefill": c.counters.prefill_s, "decode": c.counters.decode_s + c.counters.draft_s,
                    "reply": (c.text, [(x.name, x.arguments) for x in c.tool_calls or ()])})
        if i < len(results):
            if not c.tool_calls:
                break  # cut by max_tokens: the session ends here (the same for every setting)
            call = c.tool_calls[0]
            messages += [{"role": "assistant", "content": c.text or None, "tool_calls": [call.as_openai()]},
                         {"role": "tool", "tool_call_id": call.id, "content": results[i]}]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="a GGUF whose template supports tools (default: SmolLM2 with a "
                                          "Hermes template, tests/tool_gguf.py)")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--show", action="store_true", help="print the replies of the first session")
    args = ap.parse_args()

    from promptlookup.api import Engine

    model = Path(args.model) if args.model else default_model()
    runs: dict[str, list[list[dict]]] = {}
    for speculate in args.settings.split(","):
        for _ in range(args.repeat):
            with Engine(model, threads=args.threads, n_ctx=4096, speculate=speculate) as engine:
                # llguidance's view of the vocabulary is built once per engine, not per request: build
                # it here, with speculation off (so the suffix history stays empty)
                engine.chat([{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice="required",
                            max_tokens=1, speculate="off")
                runs.setdefault(speculate, []).append(session(engine, speculate))
    base = runs[args.settings.split(",")[0]][0]
    if args.show:
        for turn in base:
            print(json.dumps(turn["reply"], ensure_ascii=False))
    print(f"model {model.name}, {args.threads} thread(s), median of {args.repeat} sessions\n")
    print("| speculate | turn | tokens | decodes | prefill s | generation s | seconds | same as first |")
    print("|---|---|---|---|---|---|---|---|")
    totals: dict[str, float] = {}
    gen_total: dict[str, float] = {}
    for speculate, sessions in runs.items():
        total = 0.0
        for i, turn in enumerate(sessions[0]):
            s = statistics.median(run[i]["s"] for run in sessions)
            total += s
            same = all(run[i]["reply"] == base[i]["reply"] for run in sessions) if i < len(base) else False
            prefill = statistics.median(run[i]["prefill"] for run in sessions)
            gen = statistics.median(run[i]["decode"] for run in sessions)
            gen_total[speculate] = gen_total.get(speculate, 0.0) + gen
            print(f"| {speculate} | {i + 1} | {turn['tokens']} | {turn['decodes']} | {prefill:.3f} | "
                  f"{gen:.3f} | {s:.3f} | {'yes' if same else 'NO'} |")
        totals[speculate] = total
    first, first_gen = next(iter(totals.values())), next(iter(gen_total.values()))
    print("\n| speculate | session seconds | speed-up | generation seconds | speed-up |")
    print("|---|---|---|---|---|")
    for speculate, total in totals.items():
        gen = gen_total[speculate]
        print(f"| {speculate} | {total:.3f} | {first / total:.2f}x | {gen:.3f} | {first_gen / gen:.2f}x |")


if __name__ == "__main__":
    main()
