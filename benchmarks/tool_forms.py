"""How a tool model writes its calls under ``tool_choice: "auto"``, and which come back as calls.

Why: small tool-trained models rarely use the ``<tool_call>`` tags their template teaches; they write
the call as a fenced ```json block or a bare JSON object (issue 40). This runs twelve one-turn
requests with five tools (greedy, ``speculate: off``: the text is the model's either way) and prints,
per prompt, the reply's form (``tags``, ``fenced``, ``bare``, ``text``), its finish reason and the
calls parsed, then how many replies came back as calls; the table in docs/agents.md is its output::

    python benchmarks/tool_forms.py -t 1 \\
        -m ~/.cache/promptlookup/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import json


def _obj(props: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


S = {"type": "string"}
TOOLS = [
    ("read_file", "Read a file of the project", _obj({"path": S}, ["path"])),
    ("write_file", "Write text to a file", _obj({"path": S, "content": S}, ["path", "content"])),
    ("get_weather", "The weather in a city",
     _obj({"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city"])),
    ("run_tests", "Run the test suite, or one test file", _obj({"path": S}, [])),
    ("search_code", "Search the code for a regular expression", _obj({"pattern": S}, ["pattern"])),
]
PROMPTS = ["What is the weather in Paris?", "Open src/app.py at line 12.", "Hi! How are you?",
           "Read the README.md file.", "Run the tests in tests/test_api.py.",
           "Is it raining in Tokyo? Use fahrenheit.", "Find where the function parse_args is defined.",
           "Create a file hello.txt containing 'hello world'.", "What is 2 + 2?",
           "Write a Python function that reverses a string.", "Run all the tests.",
           "Search the code for TODO comments."]


def form(raw: str) -> str:
    """The shape of a reply: in the template's tags, a fenced block, a bare object, or text."""
    body = raw.lstrip()
    if "<tool_call>" in raw:
        return "tags"
    return "fenced" if body.startswith("```") else "bare" if body.startswith("{") else "text"


def main() -> None:
    from promptlookup.api import Engine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True, help="a GGUF whose chat template supports tools")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-n", "--max-tokens", type=int, default=120)
    args = ap.parse_args()
    engine = Engine(args.model, threads=args.threads, n_ctx=4096, speculate="off")
    tools = [{"type": "function", "function": {"name": n, "description": d, "parameters": p}}
             for n, d, p in TOOLS]
    called = 0
    for prompt in PROMPTS:
        c = engine.chat([{"role": "user", "content": prompt}], tools=tools, max_tokens=args.max_tokens,
                        temperature=0)
        calls = [(x.name, json.loads(x.arguments)) for x in c.tool_calls or ()]
        called += bool(calls)
        print(f"| {prompt} | {form(engine.detokenize(c.tokens))} | {c.finish_reason} | "
              f"{', '.join(f'{n} {json.dumps(a)}' for n, a in calls) or '-'} |")
    print(f"replies returned as calls: {called} of {len(PROMPTS)}")


if __name__ == "__main__":
    main()
