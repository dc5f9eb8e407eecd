"""A request's completion as OpenAI's objects: the whole response, or the stream's chunk objects.

Why apart from the routes: what a client reads -- the chat and the legacy completions shapes,
logprobs in each (chat's ``content`` entries with bytes, completions' ``tokens``/``token_logprobs``/
``top_logprobs``/``text_offset``), ``usage``, and our extensions (llama-server's ``timings``, the
``counters``, the ``seed``) -- is one job, independent of how a request is queued and run. A
:class:`Render` turns an engine :class:`~promptlookup.api.Completion` and its
:class:`~promptlookup.api.Chunk` s (with the token texts the engine loop looked up for each,
:class:`~promptlookup.serve.queue.TokenTexts`) into plain dicts; the app serializes them. A stream's
chunk carries the logprobs of its own tokens, as OpenAI's do; the final chunk only those of tokens no
earlier chunk carried.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from promptlookup import __version__
from promptlookup.api import Completion, TokenLogprob
from promptlookup.drafting.spec import OFF, options_of
from promptlookup.serve import schemas as s

FINGERPRINT = f"promptlookup-{__version__}"


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0  # JSON has no -inf (a token of probability 0)


def public_label(label: str) -> str:
    """A spec label without its file settings (paths on the server's disk stay there)."""
    name, *opts = label.split(":")
    paths = {k for k, o in options_of(name).items() if o.kind is str} if name != OFF else set()
    return ":".join([name, *(o for o in opts if o.partition("=")[0] not in paths)])


class Render:
    """The response objects of one request (chat or completions), whole or as stream chunks."""

    def __init__(self, model: str, kind: str, body: s.SamplingFields, logprobs: int | None) -> None:
        self.model = model
        self.stream = bool(body.stream)  # answered as server-sent events
        self.include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
        self.token_ids = bool(body.return_token_ids)
        self.kind = kind
        self.logprobs = logprobs
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.streamed = 0  # characters of the token texts whose logprobs the stream has sent (text_offset)

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT}

    def _extensions(self, c: Completion) -> dict[str, Any]:
        counters = c.counters.as_dict()
        counters.update(stopped_by=c.stopped_by, source_choices=dict(c.source_choices),
                        source=public_label(c.speculate))
        return {"timings": c.timings, "counters": counters, "seed": c.seed}

    @staticmethod
    def usage(c: Completion) -> dict[str, Any]:
        n = len(c.tokens)
        return {"prompt_tokens": c.prompt_tokens, "completion_tokens": n, "total_tokens": c.prompt_tokens + n,
                "prompt_tokens_details": {"cached_tokens": c.cached_tokens}}

    def _logprobs(self, lps: Sequence[TokenLogprob] | None, texts: Mapping[int, str] | None,
                  start: int = 0) -> dict[str, Any] | None:
        """The logprobs object of ``lps`` (completions' ``text_offset`` counted from ``start``)."""
        if lps is None or texts is None:
            return None
        if self.kind == "chat":
            def entry(t: int, lp: float) -> dict[str, Any]:
                text = texts[t]
                return {"token": text, "logprob": _finite(lp), "bytes": list(text.encode("utf-8"))}

            return {"content": [{**entry(x.token, x.logprob), "top_logprobs": [entry(t, v) for t, v in x.top]}
                                for x in lps], "refusal": None}
        offsets, pos = [], start
        for x in lps:
            offsets.append(pos)
            pos += len(texts[x.token])
        return {"tokens": [texts[x.token] for x in lps],
                "token_logprobs": [_finite(x.logprob) for x in lps],
                "top_logprobs": [{texts[t]: _finite(v) for t, v in x.top} for x in lps],
                "text_offset": offsets}

    def _streamed_logprobs(self, lps: Sequence[TokenLogprob] | None,
                           texts: Mapping[int, str] | None) -> dict[str, Any] | None:
        """The logprobs object of a stream chunk's tokens, continuing the stream's text offsets."""
        out = self._logprobs(lps, texts, self.streamed)
        if out is not None and lps:
            assert texts is not None
            self.streamed += sum(len(texts[x.token]) for x in lps)
        return out

    # -- whole ----------------------------------------------------------------------------------
    def whole(self, text: str, c: Completion, texts: Mapping[int, str] | None) -> dict[str, Any]:
        lp = self._logprobs(c.logprobs, texts)
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
            if c.tool_calls:  # a turn that only calls tools has no content (OpenAI's null)
                message["content"] = text if text.strip() else None
                message["tool_calls"] = [call.as_openai() for call in c.tool_calls]
            choice = {"index": 0, "message": message, "logprobs": lp, "finish_reason": c.finish_reason}
            obj = self._base("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": c.finish_reason}
            obj = self._base("text_completion")
        if self.token_ids:
            choice["token_ids"] = list(c.tokens)
        return {**obj, "choices": [choice], "usage": self.usage(c), **self._extensions(c)}

    # -- stream ---------------------------------------------------------------------------------
    def _chunk(self, choice: dict[str, Any] | None) -> dict[str, Any]:
        obj = self._base("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        obj["choices"] = [] if choice is None else [choice]
        if self.include_usage:
            obj["usage"] = None
        return obj

    def _choice(self, text: str | None, finish: str | None = None, lp: Any = None) -> dict[str, Any]:
        if self.kind == "chat":
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish}

    def head(self) -> dict[str, Any]:
        if self.kind == "chat":
            return self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None})
        return self._chunk(self._choice(""))

    def delta(self, text: str, lps: Sequence[TokenLogprob] | None = None,
              texts: Mapping[int, str] | None = None) -> dict[str, Any]:
        """A chunk of new text with the logprobs of its tokens ``lps`` (when asked)."""
        return self._chunk(self._choice(text, lp=self._streamed_logprobs(lps, texts)))

    def tail(self, c: Completion, rest: Sequence[TokenLogprob] | None = None,
             texts: Mapping[int, str] | None = None) -> list[dict[str, Any]]:
        """The tool calls' delta when the reply called tools (each call whole: id, name and arguments
        in one piece, as the model's text is parsed only once it ends), the last chunk (finish reason;
        the logprobs of ``rest``, the tokens no delta carried, if any; timings and counters), then the
        usage chunk when ``stream_options.include_usage``."""
        out = []
        if c.tool_calls and self.kind == "chat":  # the calls, whole, in one delta before the finish
            calls = [{"index": i, **call.as_openai()} for i, call in enumerate(c.tool_calls)]
            out.append(self._chunk({"index": 0, "delta": {"tool_calls": calls}, "logprobs": None,
                                    "finish_reason": None}))
        last = self._chunk(self._choice(None, c.finish_reason, self._streamed_logprobs(rest or None, texts)))
        last.update(self._extensions(c))
        out.append(last)
        if self.include_usage:
            u = self._chunk(None)
            u["usage"] = self.usage(c)
            u.update(self._extensions(c))
            out.append(u)
        return out

