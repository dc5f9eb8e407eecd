"""The agent loop of ``agent_loop.py`` over HTTP: ``promptlookup serve`` beside llama-server (issue 27).

The same scripted session (read a file with a forced call, its content comes back as the tool's
result, a forced edit call that quotes it, then a free answer with ``tool_choice: none``), sent as an
agent sends it: OpenAI chat requests with ``tools``, each turn re-sending the whole conversation with
the server's own tool calls and the tools' results. Rows, each a server started here on a free
127.0.0.1 port, warmed up by one untimed request, run ``--repeat`` sessions, stopped:

- ``ours``        ``promptlookup serve`` (speculation default, auto)
- ``ours-off``    ``promptlookup serve --speculate off``
- ``ls``          llama-server ``--jinja`` (its own template engine and tool-call parser; grammar-forced
                  calls), plain
- ``ls-spec``     the same with its n-gram drafting (``--spec-default``)

A forced call is ``tool_choice: "required"`` for every server (llama-server takes no named choice):
the model picks the tool, and the session goes on with whatever it called. The model: SmolLM2 with
the Hermes tool template of ``tests/tool_gguf.py`` (made in the temp directory on first use), whose
template both servers render. Per row: the median session's wall seconds, tokens and calls made.

    python benchmarks/agent_loop_http.py -t 2 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_loop import FILE, PATH, TOOLS, default_model  # noqa: E402
from serve_session import RowSpec, Server  # noqa: E402

OUR_SRC = Path(__file__).resolve().parents[1] / "src"
ROWS = ("ours", "ours-off", "ls", "ls-spec")
TURNS = [("required", 60), ("required", 240), ("none", 240)]


def row_spec(key: str, args: argparse.Namespace) -> RowSpec:
    model, t = str(args.model), str(args.threads)
    env = dict(os.environ)
    ours_env = {**env, "PYTHONPATH": os.pathsep.join([str(OUR_SRC), *filter(None, [env.get("PYTHONPATH")])])}
    ours = [sys.executable, "-m", "promptlookup", "serve", "-m", model, "-t", t, "-c", "4096"]
    if key == "ours":
        return RowSpec(key, "promptlookup serve", ours, ours_env)
    if key == "ours-off":
        return RowSpec(key, "promptlookup serve --speculate off", [*ours, "--speculate", "off"], ours_env)
    ls = [str(args.llama_server), "-m", model, "-t", t, "-tb", t, "-c", "4096", "-np", "1", "--jinja",
          "--host", "127.0.0.1"]
    if key == "ls":
        return RowSpec(key, "llama-server --jinja", ls, env)
    if key == "ls-spec":
        return RowSpec(key, "llama-server --jinja --spec-default", [*ls, "--spec-default"], env)
    raise SystemExit(f"agent_loop_http: error: unknown row {key!r} (rows: {', '.join(ROWS)})")


def session(server: Server, model: str) -> dict:
    """One scripted session over HTTP; its wall seconds, completion tokens and the calls made."""
    messages: list[dict] = [{"role": "user", "content": f"The word 'recieve' is misspelled in {PATH}. Read "
                                                        "the file, fix it, then show me the fixed function."}]
    results = [FILE, "ok: 1 replacement"]
    seconds, tokens, calls = 0.0, 0, []
    for i, (choice, max_tokens) in enumerate(TURNS):
        body = {"model": model, "messages": messages, "tools": TOOLS, "tool_choice": choice,
                "max_tokens": max_tokens, "temperature": 0}
        t0 = time.perf_counter()
        r = server.post_json("/v1/chat/completions", body, timeout=600)
        seconds += time.perf_counter() - t0
        if "choices" not in r:
            raise RuntimeError(f"turn {i + 1}: {json.dumps(r)[:300]}")
        tokens += (r.get("usage") or {}).get("completion_tokens") or 0
        msg = r["choices"][0]["message"]
        if i < len(results):
            tc = msg.get("tool_calls") or []
            if not tc:
                break  # no call (cut by max_tokens): the session ends here
            call = tc[0]
            calls.append(call["function"]["name"])
            messages += [{"role": "assistant", "content": msg.get("content"), "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": call.get("id") or f"call_{i}",
                          "content": results[i]}]
    return {"s": seconds, "tokens": tokens, "calls": calls}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="a GGUF whose template supports tools (default: SmolLM2 with a "
                                          "Hermes template, tests/tool_gguf.py)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--llama-server", help="llama-server binary (default: built by llama_tools.py)")
    args = ap.parse_args()
    args.model = Path(args.model) if args.model else default_model()
    rows = [r for r in args.rows.split(",") if r]
    if any(r.startswith("ls") for r in rows) and args.llama_server is None:
        import llama_tools

        args.llama_server = llama_tools.ensure_server()
    logdir = Path(tempfile.mkdtemp(prefix="agent_loop_http-"))
    print(f"model {args.model.name}, -t {args.threads}, median of {args.repeat} sessions (each on a fresh "
          "server)\n")
    print("| row | session s | tokens | calls | tok/s |")
    print("|---|---:|---:|---|---:|", flush=True)
    for key in rows:
        spec = row_spec(key, args)
        done = []
        for _ in range(args.repeat):
            with Server(spec, logdir / f"{key}.log", start_timeout=600) as server:
                model = server.model_id()
                server.post_json("/v1/chat/completions", {"model": model, "max_tokens": 2, "temperature": 0,
                                                          "messages": [{"role": "user", "content": "hi"}]})
                done.append(session(server, model))
        mid = sorted(done, key=lambda d: d["s"])[len(done) // 2]
        print(f"| {spec.label} | {statistics.median(d['s'] for d in done):.2f} | {mid['tokens']} | "
              f"{'+'.join(mid['calls']) or '-'} | {mid['tokens'] / mid['s']:.1f} |", flush=True)
    print(f"\n<!-- server logs: {logdir} -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
