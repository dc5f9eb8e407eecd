"""The engine loop and continuous batching on a test double whose batched logits equal single ones
(tests/fakes.py BatchByteModel): every request's tokens under any concurrency equal its tokens alone,
rounds really batch, prompts are read in chunks beside running requests, a request that ends or fails
frees its sequence at once, and the draft pricing caps drafts as the batch fills."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from fakes import BatchByteModel, ByteModel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving import wait_until

from promptlookup import Engine
from promptlookup.backends.base import BackendError
from promptlookup.batching import prefix
from promptlookup.batching.engine_loop import EngineLoop, NeedSlot, Request, Started
from promptlookup.batching.pool import SeqView, Slot, SlotPool
from promptlookup.batching.pricing import BatchCost, DraftPricing, expected_confirmed
from promptlookup.errors import UsageError
from promptlookup.speculate import Forward, steps

CURVE = Path(__file__).resolve().parents[1] / "benchmarks" / "curves" / "smollm2-q4_1-cpu2.json"
PROMPTS = [
    "the cat sat on the mat; the cat sat on the mat; the cat",
    "a b c d e f g a b c d e f g a b c",
    "hello world",
    "zz yy xx zz yy xx zz yy xx zz",
    "one more prompt that is a little longer than the others, to read in several chunks",
    "q",
]
# an opening of 180 bytes that requests share (a system prompt, a file under discussion)
SHARED = "You are a careful assistant. Here is the file we discuss, read it whole before answering: " * 2


def linear_cost(n: int) -> float:
    """A CPU-like forward: a fixed part and a part per token (seconds)."""
    return 0.010 + 0.0035 * (n - 1)


def alone(prompt: str, speculate: str = "ngram", **fields) -> list[int]:
    engine = Engine.from_backend(ByteModel(), speculate=speculate, cost_curve=CURVE)
    return engine.generate(prompt, max_tokens=fields.pop("max_tokens", 40), **fields).tokens


def run_together(engine: Engine, jobs: list[tuple[str, dict]]) -> list[list[int]]:
    """Each job on its own thread, all started at once; their tokens, in job order."""
    out: list[list[int] | BaseException | None] = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def work(i: int, prompt: str, fields: dict) -> None:
        try:
            start.wait()
            out[i] = engine.generate(prompt, **fields).tokens
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            out[i] = exc

    threads = [threading.Thread(target=work, args=(i, p, f)) for i, (p, f) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a request never finished"
    for o in out:
        if isinstance(o, BaseException):
            raise o
    return out  # type: ignore[return-value]


def batch_engine(n_seq: int = 4, speculate: str = "ngram", gather: int = 0,
                 **kwargs) -> tuple[Engine, BatchByteModel]:
    """An engine of ``n_seq`` slots on the batching double; with ``gather``, its first forward waits
    until that many requests were handed to the loop, so that they share forwards however the threads
    are scheduled."""
    model = BatchByteModel(n_seq=n_seq)
    engine = Engine.from_backend(model, speculate=speculate, parallel=n_seq, cost_curve=CURVE, **kwargs)
    if gather:
        def on_round(n: int) -> None:
            if n == 0:
                # up to 60 s for the other threads to start their requests
                wait_until(lambda: engine.loop.running + engine.loop.waiting >= gather, timeout=60,
                           every=0.001)

        model.on_round = on_round
    return engine, model


# -- exactness -------------------------------------------------------------------------------------
@pytest.mark.parametrize("speculate", ["off", "ngram", "suffix", "auto"])
def test_concurrent_requests_equal_their_tokens_alone(speculate):
    engine, model = batch_engine(4, speculate, gather=4, prefill_chunk=8)
    jobs = [(p, {"max_tokens": 40}) for p in PROMPTS[:4]]
    got = run_together(engine, jobs)
    assert got == [alone(p, speculate) for p, _ in jobs]
    assert max(len(r) for r in model.rounds) > 1  # the requests really shared forwards


def test_seeded_sampling_is_exact_under_batching():
    engine, model = batch_engine(3, "ngram", gather=3)
    jobs = [(p, {"max_tokens": 30, "temperature": 0.9, "seed": 7 + i, "top_k": 5})
            for i, p in enumerate(PROMPTS[:3])]
    got = run_together(engine, jobs)
    assert got == [alone(p, "ngram", **dict(f)) for p, f in jobs]


def test_stop_strings_logprobs_and_streams_keep_working_per_request():
    engine, model = batch_engine(3, "suffix", gather=3)
    single = Engine.from_backend(ByteModel(), speculate="suffix", cost_curve=CURVE)
    fields = [{"max_tokens": 40, "stop": ["ee"]}, {"max_tokens": 30, "logprobs": 2},
              {"max_tokens": 35, "temperature": 0.7, "seed": 3, "logprobs": 1}]
    results: list = [None] * 3
    start = threading.Barrier(3)

    def work(i: int) -> None:
        start.wait()
        chunks = list(engine.generate(PROMPTS[i], stream=True, **fields[i]))
        results[i] = ("".join(c.text for c in chunks), chunks[-1].completion)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i, (text, got) in enumerate(results):
        want = single.generate(PROMPTS[i], **fields[i])
        assert text == got.text == want.text
        assert (got.tokens, got.stop, got.finish_reason) == (want.tokens, want.stop, want.finish_reason)
        assert got.logprobs == want.logprobs
    assert results[0][1].stop == "ee" and results[1][1].logprobs is not None


def test_more_requests_than_slots_wait_for_a_free_one():
    engine, model = batch_engine(2, "ngram", gather=2)
    jobs = [(p, {"max_tokens": 25}) for p in PROMPTS]
    assert run_together(engine, jobs) == [alone(p, max_tokens=25) for p, _ in jobs]
    assert max(len(r) for r in model.rounds) == 2


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=st.lists(st.integers(0, 30), min_size=2, max_size=5),
       chunk=st.sampled_from([1, 3, 16]), n_seq=st.integers(2, 4), shared=st.booleans())
def test_requests_arriving_at_any_round_equal_their_tokens_alone(arrivals, chunk, n_seq, shared):
    """Request i starts when the backend has run ``arrivals[i]`` forwards (the first at once); with
    ``shared``, every prompt opens with the same 180 bytes, so a request that arrives while an
    earlier one reads them waits for them and copies them (or copies them from an idle slot)."""
    model = BatchByteModel(n_seq=n_seq)
    engine = Engine.from_backend(model, speculate="ngram", parallel=n_seq, prefill_chunk=chunk,
                                cost_curve=CURVE)
    prompts = [(SHARED if shared else "") + PROMPTS[i % len(PROMPTS)] for i in range(len(arrivals))]
    out: dict[int, list[int]] = {}
    started: set[int] = set()
    threads: list[threading.Thread] = []

    def work(i: int) -> None:
        out[i] = engine.generate(prompts[i], max_tokens=20).tokens

    def launch(i: int) -> None:
        started.add(i)
        t = threading.Thread(target=work, args=(i,))
        threads.append(t)
        t.start()

    def on_round(n: int) -> None:
        for i, at in enumerate(arrivals):
            if i not in started and at <= n:
                launch(i)

    model.on_round = on_round
    launch(0)
    while len(started) < len(arrivals):  # arrivals past the last round start once all is quiet
        for t in list(threads):
            t.join(30)
        for i in range(len(arrivals)):
            if i not in started:
                launch(i)
                break
    for t in list(threads):
        t.join(30)
        assert not t.is_alive()
    assert [out[i] for i in range(len(arrivals))] == [alone(p, max_tokens=20) for p in prompts]
    if not shared:
        assert model.copies == []


# -- rounds ------------------------------------------------------------------------------------------
def test_a_long_prompt_is_read_in_chunks_while_others_decode():
    engine, model = batch_engine(2, "off", gather=2, prefill_chunk=4)
    short, long = "hello world", PROMPTS[4]
    run_together(engine, [(short, {"max_tokens": 40}), (long, {"max_tokens": 5})])
    chunked = [r for r in model.rounds if any(w == "none" for _, _, w in r)]
    assert chunked, "the long prompt was never split"
    assert all(n <= 4 for r in model.rounds for _, n, w in r if w in ("none", "last"))
    # while the long prompt is read, the other request keeps decoding in the same forwards
    assert any(any(w == "all" for _, _, w in r) for r in chunked)


def test_a_request_cancelled_while_its_prompt_is_read_stops_between_chunks():
    """PROMPTS[4] is 82 bytes, read 16 a round: a cancel seen after the first round ends the request
    with no token and nothing more fed; the same prompt again keeps those 16 positions, reads the
    rest in the same chunks and writes the tokens it writes alone."""
    engine, model = batch_engine(2, "off", prefill_chunk=16)
    prompt = PROMPTS[4]
    asked = []
    c = engine.generate(prompt, max_tokens=10, cancelled=lambda: len(asked.append(1) or asked) >= 2)
    assert (c.tokens, c.stopped_by) == ([], "cancelled")
    assert model.rounds == [[(0, 16, "none")]]
    again = engine.generate(prompt, max_tokens=10)
    assert again.cached_tokens == 16 and again.tokens == alone(prompt, "off", max_tokens=10)
    assert [r[0][1:] for r in model.rounds[1:6]] == [(16, "none")] * 4 + [(2, "last")]


def test_a_cancelled_request_frees_its_sequence_and_the_others_finish_exactly():
    engine, model = batch_engine(3, "ngram")
    stop = threading.Event()
    steps_seen = []

    def cancelled() -> bool:
        steps_seen.append(1)
        if len(steps_seen) >= 3:
            stop.set()
        return stop.is_set()

    jobs = [(PROMPTS[0], {"max_tokens": 40}), (PROMPTS[1], {"max_tokens": 400, "cancelled": cancelled}),
            (PROMPTS[3], {"max_tokens": 40})]
    got = run_together(engine, jobs)
    assert got[0] == alone(PROMPTS[0]) and got[2] == alone(PROMPTS[3])
    assert len(got[1]) < 40
    assert engine.loop.running == 0 and engine.loop.pool.busy == 0


def test_a_refused_part_fails_its_request_only():
    # gather: no forward (so no refusal, no slot freed) before all three hold a slot each; without
    # it, a thread that starts late on a busy machine took slot 1 after its refused request left it,
    # and failed too
    engine, model = batch_engine(3, "ngram", gather=3)
    model.refuse_seq = 1
    results: dict[int, object] = {}
    barrier = threading.Barrier(3)

    def work(i: int) -> None:
        barrier.wait()
        try:
            results[i] = engine.generate(PROMPTS[i], max_tokens=30).tokens
        except BackendError as exc:
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    failed = [i for i, r in results.items() if isinstance(r, BackendError)]
    assert len(failed) == 1 and "refused" in str(results[failed[0]])
    for i, r in results.items():
        if i not in failed:
            assert r == alone(PROMPTS[i], max_tokens=30)


def test_a_consumer_holding_a_chunk_does_not_stall_the_batch():
    engine, model = batch_engine(2, "off")
    held = engine.generate(PROMPTS[0], max_tokens=40, stream=True)
    first = next(held)  # this request now waits on its reader, who reads no further for a while
    assert first.tokens
    other = engine.generate(PROMPTS[1], max_tokens=30)  # would hang if rounds waited for the reader
    assert other.tokens == alone(PROMPTS[1], "off", max_tokens=30)
    rest = [c for c in held]
    tokens = first.tokens + [t for c in rest for t in c.tokens]
    assert tokens == alone(PROMPTS[0], "off")


def test_every_forward_runs_on_the_compute_thread_and_a_closed_engine_refuses():
    model = BatchByteModel(n_seq=2)
    threads: set[str] = set()
    model.on_round = lambda n: threads.add(threading.current_thread().name)
    engine = Engine.from_backend(model, speculate="off", parallel=2, cost_curve=CURVE)
    assert engine.generate(PROMPTS[0], max_tokens=5).tokens == alone(PROMPTS[0], "off", max_tokens=5)
    assert threads == {"promptlookup-compute"}
    engine.close()
    with pytest.raises(BackendError, match="the engine is closed"):
        engine.generate(PROMPTS[0], max_tokens=5)
    with pytest.raises(ValueError, match="prefill_chunk must be at least 1"):
        EngineLoop(model, [Slot(0, SeqView(model, 0))], prefill_chunk=0)


def alone_next(ids: list[int]) -> int:
    return ByteModel().prefill(ids)


def test_engine_refuses_parallel_without_a_batching_backend():
    with pytest.raises(UsageError, match="parallel=2 needs a backend that decodes that many sequences"):
        Engine.from_backend(ByteModel(), speculate="off", parallel=2, cost_curve=CURVE)
    with pytest.raises(UsageError, match="parallel must be an integer in 1..64, got 0"):
        Engine.from_backend(ByteModel(), speculate="off", parallel=0, cost_curve=CURVE)
    with pytest.raises(UsageError, match="parallel=4 needs"):
        Engine.from_backend(BatchByteModel(n_seq=2), speculate="off", parallel=4, cost_curve=CURVE)
    for bad in (0, True, 2.5):
        with pytest.raises(UsageError, match=f"lookup_budget must be a positive integer .* got {bad!r}"):
            Engine.from_backend(ByteModel(), speculate="off", lookup_budget=bad, cost_curve=CURVE)


def test_the_engine_lookup_budget_reaches_the_lookup_inside_auto():
    """A slot's sources live as long as the engine; the lookup one inside ``auto`` (the default) gets
    the engine's budget, the default one unless told otherwise."""
    for kwargs, budget in (({"lookup_budget": 50}, 50), ({}, 65536)):
        engine = Engine.from_backend(ByteModel(), cost_curve=CURVE, **kwargs)
        inside = {s.name: s for s in engine.source_for(engine.default_spec).sources}
        assert inside["lookup"].budget == budget


# -- slots -------------------------------------------------------------------------------------------
def test_a_request_takes_the_free_slot_with_its_prompt_cached_else_an_empty_or_the_longest_idle():
    """With nothing else running (no gap to choose by)."""
    a, b, c, d = (Slot(i, ByteModel()) for i in range(4))
    pool = SlotPool([a, b, c, d])
    for slot, text in ((a, b"abcdef"), (b, b"abcxyz"), (c, b"zzz")):
        slot.view.prefill(list(text))
        slot.cache_valid = True
    got, keep = pool.choose(list(b"abcxyq"))
    assert (got, keep) == (b, 5)  # keeps the most (a would keep 3)
    pool.release(b)
    got, keep = pool.choose(list(b"abq"))  # a and b keep 2 of their 6: they do not fit, the empty d does
    assert (got, keep) == (d, 0)
    pool.release(d)
    got, keep = pool.choose(list(b"abcdeq"))
    assert (got, keep) == (a, 5)
    pool.release(a)
    for slot in (a, b, c, d):
        slot.cache_valid = False  # nothing fits better than another: the one idle longest
    got, keep = pool.choose(list(b"abcdef"))
    assert (got, keep) == (c, 0)


def test_a_request_keeps_the_running_sequences_consecutive_before_it_keeps_a_cached_prompt():
    """llama.cpp computes sequences with a gap between their ids in separate forwards: a request that
    continues no cache takes the slot that leaves the fewest runs of consecutive ids, even over a
    cached prompt it does not continue; one that continues a cache still goes there."""
    slots = [Slot(i, ByteModel()) for i in range(8)]
    pool = SlotPool(slots)
    got = [pool.choose(list(b"q%d" % i))[0].seq for i in range(4)]
    assert got == [0, 1, 2, 3]  # each next to the ones running
    slots[1].view.prefill(list(b"abcdef"))
    slots[1].cache_valid = True
    pool.release(slots[1])
    assert pool.choose(list(b"zz")) == (slots[1], 0)  # not the empty 4: that would run 0, 2-4
    pool.release(slots[1])
    slots[1].view.prefill(list(b"abcdef"))
    assert pool.choose(list(b"abcdefgh")) == (slots[1], 6)
    pool.release(slots[2])
    pool.release(slots[3])  # running 0, 1: the next goes to 2, not to the idle-longest 4
    assert pool.choose(list(b"yy"))[0] is slots[2]


# -- the loop's cap ----------------------------------------------------------------------------------
def test_a_draft_cap_of_zero_makes_plain_steps_without_asking_the_source():
    from fakes import FakeModel, RandomDrafts

    model = FakeModel()
    asked = []

    class Counting(RandomDrafts):
        def propose(self, k):
            asked.append(k)
            return super().propose(k)

    run = steps(model, [1, 2, 3], 10, Counting(model, 0), draft=4, draft_limit=lambda: 0)
    out = list(run)
    assert asked == [] and all(len(x) == 1 for x in out)
    asked.clear()
    list(steps(model, [1, 2, 3], 10, Counting(model, 0), draft=4, draft_limit=lambda: 2))
    assert asked[0] == 2 and max(asked) == 2  # the last steps ask less: max_tokens is near


@pytest.mark.parametrize("speculate", ["off", "ngram"])
def test_only_a_request_that_drafts_asks_the_batch_for_a_draft_cap(speculate):
    """``off`` has nothing to price: its steps never run the pricing; a drafting request's do."""
    engine, model = batch_engine(2, speculate, gather=2)
    asked = []
    draft_cap = engine.loop.draft_cap
    engine.loop.draft_cap = lambda seq: asked.append(seq) or draft_cap(seq)
    jobs = [(p, {"max_tokens": 20}) for p in PROMPTS[:2]]
    assert run_together(engine, jobs) == [alone(p, speculate, max_tokens=20) for p, _ in jobs]
    assert asked == [] if speculate == "off" else len(asked) > 10


def test_the_pricing_learns_what_each_loop_counted_and_nothing_else():
    """The acceptance the batch pricing learns is what each request's loop counted (drafted and
    accepted tokens per verify, told through ``EngineLoop.settled``): the sums equal the requests'
    own counters."""
    engine, _ = batch_engine(2, "ngram", gather=2)
    pricing = engine.loop.pricing
    assert pricing is not None
    engine.loop.draft_cap = lambda seq: None  # drafts uncapped: every verify carries one
    told: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    observe = pricing.observe
    pricing.observe = lambda seq, d, a: told[seq].append((d, a)) or observe(seq, d, a)
    done: list = [None, None]
    start = threading.Barrier(2)

    def work(i: int) -> None:
        start.wait()
        done[i] = engine.generate(PROMPTS[i], max_tokens=40)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    got = sorted((sum(d for d, _ in v), sum(a for _, a in v)) for v in told.values())
    want = sorted((c.counters.drafted_tokens, c.counters.accepted_tokens) for c in done)
    assert got == want and all(a > 0 for _, a in want)
    assert all(d >= 1 and 0 <= a <= d for v in told.values() for d, a in v)
    steps_drafted = sorted(len(v) for v in told.values())
    assert steps_drafted == sorted(c.counters.drafted_steps for c in done)
    engine.close()


# -- pricing -----------------------------------------------------------------------------------------
def test_expected_confirmed_tokens_of_a_draft():
    assert expected_confirmed(0.5, 0) == 1.0
    assert expected_confirmed(0.5, 3) == 1.875
    assert expected_confirmed(1.0, 4) == 5.0


def test_a_sequence_that_drafts_well_drafts_beside_one_that_does_not_and_a_full_batch_stops():
    pricing = DraftPricing(BatchCost(linear_cost))
    for _ in range(50):  # sequence 1 drafts well, sequence 0 badly
        pricing.observe(1, 4, 4)
        pricing.observe(0, 4, 0)
    beside = {9: (1, 1.0)}  # another sequence feeding its pending token
    assert pricing.best_draft(1, beside, 8) > 0 and pricing.best_draft(0, beside, 8) == 0
    # beside 15 sequences feeding one token each, a drafted token at a middling rate costs a full
    # per-token share of the forward: no draft pays
    many = DraftPricing(BatchCost(linear_cost))
    for s in range(16):
        many.observe(s, 3, 1)
    assert many.best_draft(0, {s: (1, 1.0) for s in range(1, 16)}, 8) == 0


def test_pricing_drafts_all_it_may_on_a_flat_cost_and_nothing_when_tokens_cost_their_full_share():
    flat = DraftPricing(BatchCost(lambda n: 0.01))
    assert flat.best_draft(0, {1: (1, 1.0)}, 8) == 8
    assert flat.best_draft(0, {1: (1, 1.0)}, 3) == 3  # never past what the loop may draft
    proportional = DraftPricing(BatchCost(lambda n: 0.01 * n))
    assert proportional.best_draft(0, {1: (1, 1.0)}, 8) == 0


def test_pricing_exact_draft_for_a_known_cost_and_rates():
    """By hand, cost 10 ms + 3.5 ms per token past the first, beside a sequence feeding one token:
    from 2 tokens (148.1 tok/s) the 0.9 sequence's 1st..4th drafted tokens raise the round's rate to
    170.6, 181.0, 185.0 and 185.3 tok/s, its 5th gives 183.4 and nothing after recovers; the 0.3
    sequence's first gives 146.0."""
    pricing = DraftPricing(BatchCost(linear_cost))
    pricing.rate = {0: 0.9, 1: 0.3}.__getitem__
    assert pricing.best_draft(0, {9: (1, 1.0)}, 8) == 4
    assert pricing.best_draft(1, {9: (1, 1.0)}, 8) == 0


def test_a_part_confirms_what_its_kind_and_rate_promise():
    pricing = DraftPricing(BatchCost(linear_cost))
    pricing.rate = {0: 0.5}.__getitem__
    assert pricing.expected(0, 4, "all") == 1.875  # a verify of the pending token and 3 drafted
    assert pricing.expected(0, 1, "all") == 1.0
    assert pricing.expected(0, 128, "last") == 1.0  # a prompt's last chunk: its first token
    assert pricing.expected(0, 128, "none") == 0.0  # any other chunk


def test_acceptance_estimates_shrink_toward_the_pooled_rate():
    pricing = DraftPricing(BatchCost(linear_cost))
    assert pricing.rate(0) == 0.5  # nothing measured: the starting rate
    pricing.observe(0, 4, 2)  # 2 accepted, then a rejection
    assert pricing.rate(1) == pytest.approx(4 / 7)  # pooled: (2 + 4 * 0.5) / (3 + 4)
    assert pricing.rate(0) == pytest.approx(30 / 49)  # own: (2 + 4 * 4/7) / (3 + 4)
    pricing.observe(0, 3, 3)  # accepted whole: no rejection counted
    decay = 0.5 ** (1 / 32)
    hits, misses = 2 * decay + 3, 1 * decay
    pooled = (hits + 2) / (hits + misses + 4)
    assert pricing.rate(0) == pytest.approx((hits + 4 * pooled) / (hits + misses + 4))
    pricing.start(0)  # a new request on sequence 0 starts from the pooled rate
    assert pricing.rate(0) == pytest.approx(pooled)


def test_batch_cost_learns_a_width_from_measured_rounds():
    cost = BatchCost(linear_cost)
    assert cost.seconds(16) == pytest.approx(linear_cost(16))
    cost.observe([16], 2 * linear_cost(16))
    assert cost.seconds(16) == pytest.approx(2 * linear_cost(16))
    assert cost.seconds(20) == pytest.approx(2 * linear_cost(20))  # same bucket (16..23)
    assert cost.seconds(8) == pytest.approx(linear_cost(8))  # another bucket, untouched
    cost.observe([16], 1000.0)  # a stall is clipped at 4x before it is averaged in
    assert cost.seconds(16) == pytest.approx((2 + 0.1 * (4 - 2)) * linear_cost(16))


def test_pricing_counts_the_extra_forwards_a_round_of_unequal_parts_costs():
    """With llama.cpp's separate KV streams, a round whose sequences feed different counts is
    several forwards (``forward_sizes``), each paying the fixed part (cost 10 ms + 3.5 ms a token):
    - beside one sequence feeding one token, the 0.9 sequence drafts 5 (151.6 tok/s: forwards of 2
      then 5 tokens) where one forward would let it draft 4;
    - beside three sequences feeding one token each, a draft pays a whole second forward: none;
    - beside three that each feed a 3-token draft at 0.8, drafting 3 too makes the round one
      forward of 16 (196.7 tok/s against 168.5 without, forwards of 4 then 9);
    - beside a 128-token prompt chunk, the draft rides in the chunk's forwards: all 8."""
    from types import SimpleNamespace

    from promptlookup.backends.llama_cpp import LlamaCppBackend

    backend = SimpleNamespace(n_batch=512, n_seq=4)
    pricing = DraftPricing(BatchCost(linear_cost),
                           forwards=lambda parts: LlamaCppBackend.forward_sizes(backend, parts))
    pricing.rate = {0: 0.9, 1: 0.3, 2: 0.8, 3: 0.8}.__getitem__
    assert pricing.best_draft(0, {1: (1, 1.0)}, 8) == 5
    assert pricing.best_draft(0, {s: (1, 1.0) for s in (1, 2, 3)}, 8) == 0
    drafting = expected_confirmed(0.8, 3)
    assert pricing.best_draft(0, {s: (4, drafting) for s in (1, 2, 3)}, 8) == 3
    assert pricing.best_draft(0, {1: (128, 0.0)}, 8) == 8
    one = DraftPricing(BatchCost(linear_cost))  # a backend that decodes any mix in one forward
    one.rate = pricing.rate
    assert one.best_draft(0, {1: (1, 1.0)}, 8) == 4


@settings(max_examples=300, deadline=None)
@given(data=st.data(), streams=st.booleans(), n_batch=st.sampled_from([16, 64, 512]))
def test_fast_pricing_agrees_with_its_plain_twin(data, streams, n_batch):
    """best_draft (one sorted layout, one part changed per length, costs remembered until the next
    measured round) against best_draft_reference (every layout built and priced afresh): the same
    answer for any batch, rates, learned costs and cap, on llama.cpp's separate streams and on one
    forward."""
    from types import SimpleNamespace

    from promptlookup.backends.llama_cpp import LlamaCppBackend

    seqs = data.draw(st.lists(st.integers(0, 15), min_size=1, max_size=16, unique=True))
    seq, others = seqs[0], seqs[1:]
    fed = {s: data.draw(st.one_of(st.just(1), st.integers(1, 140))) for s in others}
    rates = {s: data.draw(st.floats(0.0, 1.0)) for s in seqs}
    backend = SimpleNamespace(n_batch=n_batch, n_seq=16 if streams else 1)
    pricing = DraftPricing(BatchCost(linear_cost),
                           forwards=lambda parts: LlamaCppBackend.forward_sizes(backend, parts))
    pricing.rate = rates.__getitem__
    for forwards in data.draw(st.lists(st.lists(st.integers(1, 200), min_size=1, max_size=4), max_size=4)):
        pricing.cost.observe(forwards, data.draw(st.floats(0.001, 2.0)) * len(forwards))
    want = {s: data.draw(st.sampled_from(["all", "last", "none"])) for s in others}
    beside = {s: (fed[s], pricing.expected(s, fed[s], want[s])) for s in others}
    most = data.draw(st.integers(0, 10))
    assert pricing.best_draft(seq, beside, most) == pricing.best_draft_reference(seq, beside, most)


def scripted(ids: list[int], forwards: list[Forward], log: list, ask=None):
    """A request as the engine loop sees it: a slot for ``ids``, then ``forwards`` one by one (the
    tokens of each logged; a callable one is called with the positions the slot kept); ``ask(seq)``
    is called before each forward is yielded (a draft's price)."""
    def run():
        yield Started()
        slot, keep = yield NeedSlot(ids)
        log.append(("slot", slot.seq, keep))
        for op in forwards:
            op = op(keep) if callable(op) else op
            if ask is not None:
                log.append(("cap", slot.seq, ask(slot.seq)))
            log.append((slot.seq, op.kind, (yield op)))
    return run()


def loop_of(model: BatchByteModel, **kwargs) -> EngineLoop:
    """A loop on the double whose rounds the test runs itself (``loop.round()``)."""
    return EngineLoop(model, [Slot(i, SeqView(model, i)) for i in range(model.n_seq)], driven=False,
                      **kwargs)


def test_the_loop_prices_a_draft_against_the_parts_before_it_in_the_round():
    """Sequence 0 feeds a 7-token verify (a 6-token draft, 1.98 tokens expected at the starting rate
    0.5) in the round where sequence 1 drafts: 1 is priced against that part and may draft 1. When
    0 feeds the 7-token last chunk of a prompt (it confirms one token), 1 may draft 2. Between
    rounds, 0's next part after its prompt is taken for a one-token step: none. Once 0 has left, 1
    decodes alone, uncapped."""
    model = BatchByteModel(n_seq=2)
    loop = loop_of(model, cost=linear_cost, clock=lambda: 0.0, prefill_chunk=7)
    assert loop.pricing is not None and loop.pricing.rate(0) == 0.5
    log: list = []
    events: list = []
    prompt = list(range(104, 111))
    zero = scripted([97], [Forward("prefill", [97]), Forward("verify", prompt),
                           Forward("prefill", [97, *prompt], keep=1)], log)
    one = scripted([98], [Forward("prefill", [98]), Forward("verify", [104]), Forward("verify", [105]),
                          Forward("verify", [106])], log, ask=loop.draft_cap)
    assert loop.submit(Request(zero, lambda k, p: events.append((0, k)))) and loop.submit(
        Request(one, lambda k, p: events.append((1, k))))
    loop.round()  # both prompts
    assert log[:2] == [("slot", 0, 0), ("slot", 1, 0)]
    assert loop.draft_cap(1) == 0  # between rounds: 0 fed a prompt's last chunk, a one-token step next
    loop.round()  # 0 verifies 7, then 1 asks
    loop.round()  # 0 reads a 7-token prompt (kept 1) in one last chunk, then 1 asks
    caps = [x[2] for x in log if x[0] == "cap"]
    assert caps[:3] == [0, 1, 2]  # beside 0's one-token prompt, 0's 7-token verify, 0's 7-token prompt
    loop.round()  # 0 ends; 1 alone
    loop.round()
    caps = [x[2] for x in log if x[0] == "cap"]
    assert caps == [0, 1, 2, None] and log[-1][:2] == (1, "verify")
    assert model.rounds[1] == [(0, 7, "all"), (1, 1, "all")]
    assert model.rounds[2] == [(0, 7, "last"), (1, 1, "all")]
    assert (0, "end") in events and (0, "start") in events


def test_batch_cost_learns_from_a_round_of_several_forwards():
    cost = BatchCost(linear_cost)
    assert cost.round_seconds([4, 8]) == pytest.approx(linear_cost(4) + linear_cost(8))
    cost.observe([4, 8], 1.5 * (linear_cost(4) + linear_cost(8)))  # both buckets learn the ratio
    assert cost.seconds(4) == pytest.approx(1.5 * linear_cost(4))
    assert cost.seconds(8) == pytest.approx(1.5 * linear_cost(8))
    assert cost.seconds(2) == pytest.approx(linear_cost(2))



def test_a_prompt_shared_with_a_running_request_is_copied_not_computed():
    """Request B opens with the same 180 bytes as request A, which has read its prompt and is still
    writing on slot 0 when B arrives: B takes slot 1, copies the 180 bytes from slot 0 and computes
    only the rest; both get the tokens they get alone."""
    engine, model = batch_engine(2, "off")
    prompt_a, prompt_b = SHARED + "A: summarise it.", SHARED + "B: list the functions."
    out: dict = {}
    threads = start_when_waited(engine, model, 3, [(prompt_b, 20)], out)  # A's third step
    got_a = engine.generate(prompt_a, max_tokens=20)
    for t in threads:
        t.join(60)
    got = out[prompt_b]
    fed = sum(n for r in model.rounds for seq, n, _ in r if seq == 1)
    shared = len(SHARED.encode())  # the bytes both prompts open with
    assert model.copies == [(0, 1, shared)]
    assert got.cached_tokens == shared
    assert fed == len(prompt_b.encode()) - shared + len(got.tokens) - 1  # the rest, then one per token
    assert got.tokens == alone(prompt_b, "off", max_tokens=20)
    assert got_a.tokens == alone(prompt_a, "off", max_tokens=20)
    assert engine.loop.prefix_copies == 1 and engine.loop.prefix_copied_tokens == shared


def start_when_waited(engine: Engine, model: BatchByteModel, at_round: int, jobs: list[tuple[str, int]],
                      out: dict) -> list[threading.Thread]:
    """At round ``at_round`` of the double, start each job (prompt, max_tokens) on a thread of its
    own, one after another, each once the previous one is in the loop's hands (up to 60 s): so the
    loop takes them, in that order, at its next round, while the earlier requests are still reading
    their prompts."""
    threads: list[threading.Thread] = []

    def work(prompt: str, max_tokens: int) -> None:
        out[prompt] = engine.generate(prompt, max_tokens=max_tokens)

    def on_round(n: int) -> None:
        if n != at_round:
            return
        for k, (prompt, max_tokens) in enumerate(jobs, 1):
            t = threading.Thread(target=work, args=(prompt, max_tokens))
            t.start()
            threads.append(t)
            wait_until(lambda k=k: engine.loop.waiting >= k, timeout=60, every=0.001)

    model.on_round = on_round
    return threads


def test_requests_arriving_together_read_their_shared_opening_once():
    """A reads its prompt 16 tokens a round; B and C open with the same 180 bytes and arrive while A
    is still reading them (round 1). Neither reads them too: B waits until A's sequence holds the
    180 bytes and copies them; C, which shares more with B than with A, waits for B, then copies.
    Every request gets the tokens it gets alone, and the shared bytes are fed once in all."""
    engine, model = batch_engine(3, "off", prefill_chunk=16)
    tails = ("A: summarise it.", "B: list the functions.", "B: list the classes.")
    prompts = [SHARED + tail for tail in tails]
    out: dict = {}
    threads = start_when_waited(engine, model, 1, [(prompts[1], 20), (prompts[2], 20)], out)
    out[prompts[0]] = engine.generate(prompts[0], max_tokens=20)
    for t in threads:
        t.join(60)
    shared = len(SHARED.encode())
    bc = len((SHARED + "B: list the ").encode())
    assert model.copies == [(0, 1, shared), (1, 2, bc)]
    assert engine.loop.prefix_waits == 2 and engine.loop.prefix_copies == 2
    for p in prompts:
        assert out[p].tokens == alone(p, "off", max_tokens=20)
    assert [out[p].cached_tokens for p in prompts] == [0, shared, bc]
    fed = sum(n for r in model.rounds for _, n, _ in r)
    assert fed == sum(len(p.encode()) + len(out[p].tokens) - 1 for p in prompts) - shared - bc


def test_a_request_waiting_for_a_prefix_that_is_never_read_goes_on_alone():
    """B arrives while A reads its first 16 tokens and waits for A's opening, but A's request fails
    on its next round (the double then refuses sequence 0): B stops waiting, copies nothing (A's
    sequence holds too little) and reads its whole prompt itself, with the tokens it gets alone."""
    engine, model = batch_engine(2, "off", prefill_chunk=16)
    prompt_b = SHARED + "B: list the functions."
    out: dict = {}
    threads = start_when_waited(engine, model, 0, [(prompt_b, 10)], out)
    starting = model.on_round

    def on_round(n: int) -> None:
        starting(n)
        if n == 0:
            model.refuse_seq = 0  # from the next forward on

    model.on_round = on_round
    with pytest.raises(BackendError, match="sequence 0 refused"):
        engine.generate(SHARED + "A: summarise it.", max_tokens=10)
    for t in threads:
        t.join(60)
    assert engine.loop.prefix_waits == 1 and model.copies == []
    assert out[prompt_b].tokens == alone(prompt_b, "off", max_tokens=10)
    assert out[prompt_b].cached_tokens == 0


def test_the_prefix_plan_copies_from_the_longest_shared_prompt_in_flight_else_the_longest_cache():
    """``prefix.plan`` for a prompt on sequence 3 that keeps 10 of its own positions: a running
    request's prompt that shares more than any cache by more than 32 is waited for; else the cache
    that shares most, when that is more than 32 beyond what the slot keeps; else nothing."""
    ids = list(range(100))
    cached = {0: ids[:50], 1: ids[:20] + [7], 3: ids[:10]}
    assert prefix.plan(ids, 3, 10, cached, {}) == prefix.PrefixPlan(0, 3, 50, in_flight=False)
    assert prefix.plan(ids, 3, 10, cached, {1: ids[:83], 2: ids[:90]}) == prefix.PrefixPlan(
        2, 3, 90, in_flight=True)
    assert prefix.plan(ids, 3, 10, cached, {2: ids[:82]}) == prefix.PrefixPlan(0, 3, 50, in_flight=False)
    assert prefix.plan(ids, 3, 20, cached, {}) is None  # 50 is not more than 20 + 32
    assert prefix.plan(ids, 3, 10, {3: ids}, {3: ids}) is None  # its own sequence is never a donor


def test_a_request_waiting_for_a_prefix_in_flight_feeds_nothing_and_is_not_priced():
    """Sequence 1's prompt opens like sequence 0's, which is still being read 16 a round: 1 waits
    (no part of its own) until 0 holds the shared 180 positions, meanwhile 0 is the only sequence
    decoding and drafts uncapped; then 1 copies them and reads only its rest."""
    model = BatchByteModel(n_seq=2)
    loop = loop_of(model, cost=linear_cost, clock=lambda: 0.0, prefill_chunk=16)
    a, b = list((SHARED + "A").encode()), list((SHARED + "B!").encode())
    log: list = []
    loop.submit(Request(scripted(a, [Forward("prefill", a), Forward("verify", [1]),
                                     Forward("verify", [2])], log, ask=loop.draft_cap), lambda k, p: None))
    loop.round()
    loop.submit(Request(scripted(b, [lambda keep: Forward("prefill", b, keep=keep)], log), lambda k, p: None))
    for _ in range(4):
        loop.round()
    assert loop.running == 2 and loop.draft_cap(0) is None  # 1 waits: 0 decodes alone
    rounds = 5
    while not any(x[0] == 1 for x in log):
        loop.round()
        rounds += 1
        assert rounds < 40
    shared = len(SHARED.encode())
    assert loop.prefix_waits == 1 and model.copies == [(0, 1, shared)]
    assert all(seq == 0 for r in model.rounds[:12] for seq, _, _ in r)  # 1 fed nothing while it waited
    assert [x for x in log if x[0] == "slot"] == [("slot", 0, 0), ("slot", 1, shared)]
    assert model.rounds[12] == [(0, 1, "all"), (1, 2, "last")]  # 0's first step, 1's rest: "B!"


def test_a_short_shared_prefix_or_reuse_prefix_off_copies_nothing():
    engine, model = batch_engine(2, "off")
    engine.generate("short shared opening, then A", max_tokens=5)
    busy = engine.generate(SHARED + "A", max_tokens=5, stream=True)
    next(busy)
    engine.generate("short shared opening, then B", max_tokens=5)  # shares under 32 positions
    assert model.copies == []
    list(busy)
    engine, model = batch_engine(2, "off", reuse_prefix=False)
    busy = engine.generate(SHARED + "A", max_tokens=5, stream=True)
    next(busy)
    engine.generate(SHARED + "B", max_tokens=5)
    assert model.copies == []
    list(busy)


def test_an_unexpected_failure_of_a_forward_reaches_every_part_and_the_loop_goes_on():
    model = BatchByteModel(n_seq=2)
    loop = loop_of(model)
    events: list = []
    for s in range(2):
        loop.submit(Request(scripted([97 + s], [Forward("prefill", [97 + s])], []),
                            lambda k, p, s=s: events.append((s, k, type(p).__name__ if p else None))))
    model.on_round = lambda n: 1 // 0  # a bug, not a refusal: no part is at fault alone
    loop.round()  # both prompts in one forward, which fails
    loop.round()  # each request is thrown the error and ends
    assert [e for e in events if e[1] == "error"] == [(0, "error", "ZeroDivisionError"),
                                                     (1, "error", "ZeroDivisionError")]
    assert loop.running == 0 and loop.pool.busy == 0
    model.on_round = None
    log: list = []
    loop.submit(Request(scripted([99], [Forward("prefill", [99])], log), lambda k, p: None))
    loop.round()
    loop.round()
    assert log == [("slot", 0, 0), (0, "prefill", [ByteModel().prefill([99])])]
