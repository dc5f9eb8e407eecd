"""``GET /metrics``: Prometheus counters, gauges and histograms of the server, on its own registry.

Names follow vLLM's (``vllm:spec_decode_num_drafts`` ...) with our prefix, so dashboards built for
vLLM's speculative decoding read ours with one substitution: ``num_drafts`` counts verify steps that
carried a draft, ``num_draft_tokens`` the tokens drafted, ``num_accepted_tokens`` those the model
kept, ``num_grammar_tokens`` those of the accepted ones that the grammar forced (grammar drafts:
their share of ``generation_tokens`` is what structured output gained from them). The registry is
the server's own (never prometheus_client's global one), so two apps in one
process (the tests) never collide.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from promptlookup.telemetry import Counters

PREFIX = "promptlookup:"
CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class RoundCollector:
    """The continuous-batching rounds (:class:`~promptlookup.batching.engine_loop.RoundStats`), read at
    scrape time: how many rounds ran, with how many sequences and tokens, in how many seconds. Why:
    ``batch_forward_seconds_total`` against the wall clock says how much of the server's time is the
    model's (the rest is ours: HTTP, text, drafting); ``batch_round_parts_total / batch_rounds_total``
    is the mean batch. Nothing is exported with one slot (``--parallel 1``)."""

    def __init__(self, stats: Callable[[], object | None]) -> None:
        self._stats = stats

    def collect(self):
        s = self._stats()
        if s is None:
            return
        for name, doc, value in (
                ("batch_rounds", "rounds run by the engine loop with several slots (one decode_many each)",
                 s.rounds),
                ("batch_round_parts", "sequences fed, summed over the rounds", s.parts),
                ("batch_round_tokens", "tokens fed (prompt chunks, drafts, pending tokens)", s.tokens),
                ("batch_forward_seconds", "seconds spent in the rounds' forwards", s.seconds)):
            yield CounterMetricFamily(f"{PREFIX}{name}", doc, value=value)


class Metrics:
    def __init__(self, waiting: Callable[[], int], running: Callable[[], int],
                 rounds: Callable[[], object | None] = lambda: None,
                 history: Callable[[], object | None] = lambda: None,
                 learned: Callable[[], int] = lambda: 0) -> None:
        disable_created_metrics()  # no *_created series: a scrape shows what dashboards read
        self.registry = r = CollectorRegistry(auto_describe=True)
        r.register(RoundCollector(rounds))
        p = PREFIX
        self.num_drafts = Counter(f"{p}spec_decode_num_drafts", "verify steps that carried a draft",
                                  registry=r)
        self.num_draft_tokens = Counter(f"{p}spec_decode_num_draft_tokens", "tokens drafted", registry=r)
        self.num_accepted_tokens = Counter(f"{p}spec_decode_num_accepted_tokens",
                                           "drafted tokens the model accepted", registry=r)
        self.grammar_tokens = Counter(f"{p}spec_decode_num_grammar_tokens",
                                      "accepted drafted tokens that the grammar forced (grammar drafts)",
                                      registry=r)
        self.decodes = Counter(f"{p}spec_decode_num_verify_decodes", "verify decodes after the prompt",
                               registry=r)
        self.prompt_tokens = Counter(f"{p}prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.cached_tokens = Counter(f"{p}prompt_tokens_cached",
                                     "prompt tokens reused from the previous request's cache", registry=r)
        self.generation_tokens = Counter(f"{p}generation_tokens", "tokens generated", registry=r)
        self.requests = Counter(f"{p}request_success", "finished requests by finish reason",
                                ["finished_reason"], registry=r)
        self.errors = Counter(f"{p}request_errors", "requests answered with an error, by HTTP status",
                              ["status"], registry=r)
        self.rejected = Counter(f"{p}requests_rejected", "requests refused because the queue was full (503)",
                                registry=r)
        self.cancelled = Counter(f"{p}requests_cancelled", "requests whose client went away", registry=r)
        self.history_saves = Counter(f"{p}history_saves", "suffix history files written", registry=r)
        waiting_g = Gauge(f"{p}num_requests_waiting", "requests queued for the model", registry=r)
        waiting_g.set_function(waiting)
        running_g = Gauge(f"{p}num_requests_running", "requests generating now", registry=r)
        running_g.set_function(running)
        # the suffix history grows with every request, by design, up to its budget: its size here
        # lets an operator (and benchmarks/soak.py) tell that growth from a leak
        history_tokens = Gauge(f"{p}suffix_history_tokens",
                               "tokens of earlier requests kept in the suffix history (up to its budget)",
                               registry=r)
        history_tokens.set_function(lambda: getattr(history(), "n_tokens", 0))
        history_bytes = Gauge(f"{p}suffix_history_bytes",
                              "bytes the suffix history holds (its automaton's states, edges and hash, and "
                              "its tokens)", registry=r)
        history_bytes.set_function(lambda: getattr(history(), "bytes_in_use", 0))
        # each slot's lookup dynamic cache also learns from every request it serves, up to its budget
        learned_g = Gauge(f"{p}lookup_dynamic_bytes",
                          "bytes the slots' lookup dynamic caches hold (n-grams, follower entries and "
                          "hash; each up to --lookup-budget entries)", registry=r)
        learned_g.set_function(learned)
        self.queue_time = Histogram(f"{p}request_queue_time_seconds", "time waiting for the model",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(f"{p}time_to_first_token_seconds", "arrival to the first generated text",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(f"{p}e2e_request_latency_seconds", "arrival to the last byte of the answer",
                             buckets=LATENCY_BUCKETS, registry=r)

    def finished(self, counters: Counters, finish_reason: str) -> None:
        self.num_drafts.inc(counters.drafted_steps)
        self.num_draft_tokens.inc(counters.drafted_tokens)
        self.num_accepted_tokens.inc(counters.accepted_tokens)
        self.grammar_tokens.inc(counters.grammar_tokens)
        self.decodes.inc(counters.decodes)
        self.prompt_tokens.inc(counters.prompt_tokens)
        self.cached_tokens.inc(counters.cached_tokens)
        self.generation_tokens.inc(counters.generated_tokens)
        self.requests.labels(finish_reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
