"""Sampling under speculation: the random stream, each sampler pinned by hand, fast == reference,
seed identity (speculative == plain token for token), and the distribution with negative controls."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from chisq import chi2_sf, chi_square
from fakes import LogitsFakeModel, RandomDrafts
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.drafting.ngram.source import NgramSource
from promptlookup.sampling import (
    Sampler,
    SamplingParams,
    _reference_top_k,
    filtered_distribution,
    penalize,
    reference_sample,
    uniform,
)
from promptlookup.speculate import generate

OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}  # every filter off


# -- the random stream ----------------------------------------------------------------------------
def test_uniform_is_a_pure_function_of_seed_and_position():
    assert uniform(7, 0) == uniform(7, 0)
    # pinned: changing the stream would silently change every seeded run
    pinned = [uniform(0, 0), uniform(0, 1), uniform(1, 0), uniform(2**64 - 1, 10**6)]
    assert pinned == [0.6524484863740322, 0.7012121095215252, 0.36818951565166946, 0.4611314684076886]
    assert uniform(1, 5) != uniform(2, 5) and uniform(1, 5) != uniform(1, 6)
    s = Sampler(seed=123)
    assert s.uniform(42) == uniform(123, 42)  # the sampler's cached key gives the same stream


def test_uniform_stream_is_uniform():
    u = np.array([uniform(9, p) for p in range(20_000)])
    assert u.min() >= 0.0 and u.max() < 1.0
    observed = Counter(np.floor(u * 20).astype(int).tolist())
    stat, df, p = chi_square(observed, {b: 1 / 20 for b in range(20)}, len(u))
    assert df == 19 and p > 0.001
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.03  # neighbouring positions are unrelated


def test_chi2_sf_matches_tables():
    # critical values at 5% and 0.1% from the standard table
    for x, df, p in [(3.841, 1, 0.05), (18.307, 10, 0.05), (124.342, 100, 0.05), (10.828, 1, 0.001),
                     (29.588, 10, 0.001), (2.0, 2, math.exp(-1.0))]:
        assert chi2_sf(x, df) == pytest.approx(p, rel=2e-3)
    assert chi2_sf(0.0, 3) == 1.0 and chi2_sf(1e4, 3) < 1e-300


# -- each sampler, pinned by hand -------------------------------------------------------------------
def test_top_k_keeps_exactly_k_and_ties_go_to_the_lower_id():
    row = np.array([1.0, 3.0, 3.0, 3.0, 0.0], dtype=np.float32)
    params = SamplingParams(temp=1.0, **{**OFF, "top_k": 2})
    assert filtered_distribution(row, [], 0, params) == pytest.approx({1: 0.5, 2: 0.5})
    ids, lg = Sampler._top_k(row, 2)
    assert ids.tolist() == [1, 2] and lg.tolist() == [3.0, 3.0]
    ids, _ = Sampler._top_k(row, 4)
    assert ids.tolist() == [1, 2, 3, 0]
    # k past the vocabulary, or 0, is off
    assert len(filtered_distribution(row, [], 0, SamplingParams(temp=1.0, **{**OFF, "top_k": 9}))) == 5
    assert len(filtered_distribution(row, [], 0, SamplingParams(temp=1.0, **OFF))) == 5


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # probabilities 1/2, 1/4, 1/8, 1/8 (to float32 rounding of the logits: margins of 1e-6)
    row = np.array([0.0, -math.log(2), -2 * math.log(2), -2 * math.log(2)], dtype=np.float64)

    def kept(p: float) -> list[int]:
        return sorted(filtered_distribution(row, [], 0, SamplingParams(temp=1.0, **{**OFF, "top_p": p})))

    assert kept(0.5 - 1e-6) == [0]
    assert kept(0.5 + 1e-6) == [0, 1]
    assert kept(0.75 - 1e-6) == [0, 1]
    assert kept(0.75 + 1e-6) == [0, 1, 2]  # the tie at 1/8 goes to the lower id
    assert kept(1.0) == [0, 1, 2, 3]
    dist = filtered_distribution(row, [], 0, SamplingParams(temp=1.0, **{**OFF, "top_p": 0.7}))
    assert dist == pytest.approx({0: 2 / 3, 1: 1 / 3})  # renormalized over what is kept


def test_min_p_is_relative_to_the_max():
    top = 2.0
    row = np.array([top, top + math.log(0.1) + 1e-4, top + math.log(0.1) - 1e-4, -5.0], dtype=np.float64)
    dist = filtered_distribution(row, [], 0, SamplingParams(temp=1.0, **{**OFF, "min_p": 0.1}))
    assert sorted(dist) == [0, 1]
    assert dist[1] / dist[0] == pytest.approx(0.1, rel=1e-3)
    # the same cut whatever the absolute level of the logits
    dist2 = filtered_distribution(row - 7.0, [], 0, SamplingParams(temp=1.0, **{**OFF, "min_p": 0.1}))
    assert sorted(dist2) == [0, 1]


def test_penalties_apply_once_per_token_id():
    row = np.array([4.0, -1.0, 0.0, 2.0, 1.0, 3.0], dtype=np.float32)
    params = SamplingParams(temp=1.0, repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=1.0)
    history = [0, 0, 0, 1, 2]
    got = penalize(row, history, len(history), params)
    # 0: positive, seen 3 times: 4 / 2 - 3 * 0.5 - 1 (divided once, not three times)
    # 1: negative, once: -1 * 2 - 0.5 - 1;   2: zero counts as non-positive: 0 * 2 - 0.5 - 1
    assert got.tolist() == [-0.5, -3.5, -1.5, 2.0, 1.0, 3.0]
    # only the last repeat_last_n tokens count; -1 is all of them, 0 none
    last2 = penalize(row, history, 5, SamplingParams(temp=1.0, repeat_penalty=2.0, repeat_last_n=2))
    assert last2.tolist() == [4.0, -2.0, 0.0, 2.0, 1.0, 3.0]
    every = penalize(row, history * 40, 200, SamplingParams(temp=1.0, presence_penalty=1.0, repeat_last_n=-1))
    assert every.tolist() == [3.0, -2.0, -1.0, 2.0, 1.0, 3.0]
    assert penalize(row, history, 5, SamplingParams(temp=1.0, presence_penalty=1.0,
                                                     repeat_last_n=0)).tolist() == row.tolist()
    # the fast sampler applies the very same penalties: greedy with penalties is their argmax
    s = Sampler(SamplingParams(temp=0.0, repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=1.0))
    assert s.sample(row, history, 5) == 5
    assert Sampler(SamplingParams(temp=0.0)).sample(row, history, 5) == 0


def test_temperature_scales_the_survivors():
    row = np.array([1.0, 0.0, -1.0], dtype=np.float32)
    dist = filtered_distribution(row, [], 0, SamplingParams(temp=2.0, **OFF))
    w = np.exp(np.array([1.0, 0.0, -1.0]) / 2)
    assert [dist[i] for i in range(3)] == pytest.approx((w / w.sum()).tolist())
    assert filtered_distribution(row, [], 0, SamplingParams(temp=0.0)) == {0: 1.0}


def test_inverse_cdf_pick():
    # the uniform of a position picks the candidate whose CDF interval holds it
    row = np.array([0.0, 0.0], dtype=np.float32)
    params = SamplingParams(temp=1.0, **OFF)
    picks = {seed: reference_sample(row, [], 3, params, seed) for seed in range(40)}
    assert all(picks[s] == (0 if uniform(s, 3) < 0.5 else 1) for s in picks)


@pytest.mark.parametrize("kwargs, flag", [
    ({"temp": -0.1}, "--temp"), ({"top_p": 0.0}, "--top-p"), ({"top_p": 1.01}, "--top-p"),
    ({"top_k": -1}, "--top-k"), ({"min_p": 1.5}, "--min-p"), ({"repeat_penalty": 0.0}, "--repeat-penalty"),
    ({"repeat_last_n": -2}, "--repeat-last-n"), ({"temp": float("nan")}, "--temp"),
    ({"top_p": float("inf")}, "--top-p"),
])
def test_bad_settings_are_one_line_errors(kwargs, flag):
    with pytest.raises(ValueError, match=flag) as exc:
        SamplingParams(**kwargs)
    assert "\n" not in str(exc.value)


def test_bad_seed_and_logprobs():
    with pytest.raises(ValueError, match="--seed"):
        Sampler(seed=-1)
    with pytest.raises(ValueError, match="--logprobs"):
        Sampler(logprobs=21)
    assert 0 <= Sampler().seed < 2**32  # a random seed is chosen when none is given


# -- fast == reference ------------------------------------------------------------------------------
params_strategy = st.builds(
    SamplingParams,
    temp=st.sampled_from([0.0, 0.3, 0.8, 1.0, 1.7]),
    top_k=st.sampled_from([0, 1, 2, 5, 40]),
    top_p=st.sampled_from([0.5, 0.9, 0.95, 1.0]),
    min_p=st.sampled_from([0.0, 0.05, 0.2]),
    repeat_penalty=st.sampled_from([1.0, 1.1, 1.5]),
    repeat_last_n=st.sampled_from([-1, 0, 4, 64]),
    presence_penalty=st.sampled_from([0.0, 0.5]),
    frequency_penalty=st.sampled_from([0.0, 0.3]),
)


@settings(max_examples=300, deadline=None)
@given(params=params_strategy, seed=st.integers(0, 2**64 - 1), data_seed=st.integers(0, 10_000),
       vocab=st.sampled_from([3, 17, 300]), coarse=st.booleans(), pos=st.integers(0, 50))
def test_fast_sampler_equals_the_reference(params, seed, data_seed, vocab, coarse, pos):
    rng = np.random.default_rng(data_seed)
    row = (rng.standard_normal(vocab) * 3).astype(np.float32)
    if coarse:  # many exact ties, at the top-k boundary too
        row = np.round(row).astype(np.float32)
    tokens = rng.integers(0, vocab, size=pos).tolist()
    assert Sampler(params, seed).sample(row, tokens, pos) == reference_sample(row, tokens, pos, params, seed)


def test_fast_top_k_falls_back_when_few_logits_are_near_the_max():
    rng = np.random.default_rng(1)
    row = rng.standard_normal(500).astype(np.float32)
    row[[7, 300]] = 40.0  # only two candidates within the cut: the whole row is partitioned
    ids, lg = Sampler._top_k(row, 5)
    ref_ids, ref_lg = _reference_top_k(row, 5)
    assert ids.tolist() == ref_ids.tolist()[:5] and ids.tolist()[:2] == [7, 300]
    params = SamplingParams(temp=1.0, top_k=5, top_p=1.0, min_p=0.0)
    for seed in range(50):
        assert Sampler(params, seed).sample(row, [], 0) == reference_sample(row, [], 0, params, seed)


# -- seed identity on the fake model ----------------------------------------------------------------
def plain_sampling(model: LogitsFakeModel, prompt: Sequence[int], n: int, params: SamplingParams,
                   seed: int) -> list[int]:
    """Plain sampling, one position at a time, straight from the reference implementation."""
    seq = list(prompt)
    out: list[int] = []
    while len(out) < n:
        t = reference_sample(model.logits(seq), seq, len(seq), params, seed)
        out.append(t)
        seq.append(t)
        if model.is_eog(t):
            break
    return out


@settings(max_examples=150, deadline=None)
@given(prompt=st.lists(st.integers(0, 7), min_size=1, max_size=20), n=st.integers(1, 40),
       draft=st.integers(1, 8), seed=st.integers(0, 2**32), p_right=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
       params=params_strategy, eos=st.one_of(st.none(), st.integers(0, 7)), window=st.integers(1, 3))
def test_speculative_sampling_equals_plain_sampling_for_any_drafts(prompt, n, draft, seed, p_right, params,
                                                                   eos, window):
    model = LogitsFakeModel(n_vocab=8, window=window, eos=eos, seed=seed % 1000)
    expected = plain_sampling(model, prompt, n, params, seed)
    plain = generate(model, prompt, n, sampler=Sampler(params, seed))
    assert plain.tokens == expected
    got = generate(model, prompt, n, source=RandomDrafts(model, seed, p_right), draft=draft,
                   sampler=Sampler(params, seed))
    assert got.tokens == expected
    assert got.seed == seed
    assert model.cache == list(prompt) + expected[:-1] or got.stopped_by == "eos"


def test_greedy_through_the_sampler_is_todays_greedy():
    model = LogitsFakeModel(n_vocab=20, window=2)
    prompt = [1, 2, 3, 1, 2]
    plain = generate(model, prompt, 40)
    for source in (None, NgramSource(min_match=1)):
        greedy = Sampler(SamplingParams(temp=0.0), 3)
        got = generate(model, prompt, 40, source=source, draft=4, sampler=greedy)
        assert got.tokens == plain.tokens


def test_verify_stops_at_the_first_rejected_draft():
    model = LogitsFakeModel(n_vocab=8)
    sampler = Sampler(SamplingParams(temp=1.0), 11)
    first = model.prefill([1, 2, 3], sampler=sampler)
    truth = plain_sampling(model, [1, 2, 3], 4, sampler.params, 11)
    assert first == truth[0]
    wrong = (truth[2] + 1) % 8
    chosen = model.verify([truth[0], truth[1], wrong, 5], sampler=sampler)
    assert chosen == truth[1:3]  # the accepted draft's sample, then the sample that rejects `wrong`


def test_logprobs_are_the_raw_model_distribution_and_survive_speculation():
    model = LogitsFakeModel(n_vocab=30, window=2, scale=2.0)
    prompt = [1, 2, 3, 1, 2, 3, 1]
    params = SamplingParams(temp=0.9, top_k=10)
    plain = generate(model, prompt, 30, sampler=Sampler(params, 5, logprobs=3))
    spec = generate(model, prompt, 30, source=NgramSource(min_match=1), draft=5,
                    sampler=Sampler(params, 5, logprobs=3))
    assert spec.tokens == plain.tokens and spec.logprobs == plain.logprobs
    seq = list(prompt)
    for tok, lp in zip(plain.tokens, plain.logprobs, strict=True):
        row = model.logits(seq).astype(np.float64)
        logp = row - (row.max() + math.log(np.exp(row - row.max()).sum()))
        assert lp.token == tok and lp.logprob == pytest.approx(logp[tok], abs=1e-9)
        assert [t for t, _ in lp.top] == np.argsort(-logp, kind="stable")[:3].tolist()
        assert [v for _, v in lp.top] == pytest.approx(sorted(logp, reverse=True)[:3], abs=1e-9)
        seq.append(tok)
    no_alts = generate(model, prompt, 5, sampler=Sampler(params, 5, logprobs=0))
    assert all(lp.top == () for lp in no_alts.logprobs)
    assert generate(model, prompt, 5, sampler=Sampler(params, 5)).logprobs is None


# -- the distribution, with negative controls -------------------------------------------------------
class ResampleRejected(Sampler):
    """WRONG: at a rejected draft, draws the position again from its full distribution (fresh
    randomness) instead of emitting the sample that rejected it; biased toward the draft."""

    _fresh = False

    def uniform(self, pos: int) -> float:
        return uniform(self.seed ^ 0x5EED, pos) if self._fresh else super().uniform(pos)

    def sample_rows(self, rows, tokens, first):
        out = []
        for i in range(len(rows)):
            pos = first + i
            tok = self.sample(rows[i], tokens, pos)
            if pos < len(tokens) and tokens[pos] != tok:
                self._fresh = True
                tok = self.sample(rows[i], tokens, pos)
                self._fresh = False
            out.append(tok)
            if pos < len(tokens) and tokens[pos] != tok:
                break
        return out


class StalePenalties(Sampler):
    """WRONG: penalties at a verify position read only the tokens before the batch, skipping the
    drafts accepted just before that position."""

    def sample_rows(self, rows, tokens, first):
        before = list(tokens[:first])
        out = []
        for i in range(len(rows)):
            pos = first + i
            tok = self.sample(rows[i], before, pos)
            out.append(tok)
            if pos < len(tokens) and tokens[pos] != tok:
                break
        return out


DIST_PARAMS = SamplingParams(temp=1.0, top_k=3, top_p=0.95, min_p=0.05, presence_penalty=1.5,
                             frequency_penalty=0.5)
DIST_PROMPT = [0]
N_RUNS = 4000  # the p-values are deterministic (seeded); at 4000 the weaker control fails at ~1e-14


def exact_joint(model: LogitsFakeModel, params: SamplingParams, n: int) -> dict[tuple[int, ...], float]:
    """P(first n tokens) under plain sampling, enumerated exactly from the known logits."""
    out: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(model.n_vocab), repeat=n):
        p = 1.0
        hist = list(DIST_PROMPT)
        for t in seq:
            p *= filtered_distribution(model.logits(hist), hist, len(hist), params).get(t, 0.0)
            if p == 0.0:
                break
            hist.append(t)
        if p > 0:
            out[seq] = p
    return out


def joint_counts(sampler_cls, speculate: bool, n_runs: int = N_RUNS, first_seed: int = 0) -> Counter:
    """The first three tokens of ``n_runs`` runs, seeds ``first_seed..``; speculating, each run's
    drafts are random (p_right = 0.8: mostly the argmax, long drafts often accepted, often not)."""
    model = LogitsFakeModel(n_vocab=4, window=2, scale=1.2, seed=3)
    counts: Counter = Counter()
    for s in range(first_seed, first_seed + n_runs):
        source = RandomDrafts(model, 10_000 + s, p_right=0.8) if speculate else None
        gen = generate(model, DIST_PROMPT, 3, source=source, draft=3, sampler=sampler_cls(DIST_PARAMS, s))
        counts[tuple(gen.tokens)] += 1
    return counts


@pytest.fixture(scope="module")
def joint():
    return exact_joint(LogitsFakeModel(n_vocab=4, window=2, scale=1.2, seed=3), DIST_PARAMS, 3)


def test_plain_sampling_has_the_exact_distribution(joint):
    _, df, p = chi_square(joint_counts(Sampler, speculate=False), joint, N_RUNS)
    assert df >= 10 and p > 1e-3


def test_speculative_sampling_has_the_exact_distribution(joint):
    # other seeds than the plain test's: an independent sample (same seeds would give the same tokens)
    _, df, p = chi_square(joint_counts(Sampler, speculate=True, first_seed=10**6), joint, N_RUNS)
    assert df >= 10 and p > 1e-3


@pytest.mark.parametrize("wrong", [ResampleRejected, StalePenalties])
def test_the_distribution_test_rejects_wrong_samplers(joint, wrong):
    # under plain decoding the wrong samplers are right (nothing is drafted) ...
    assert joint_counts(wrong, speculate=False, n_runs=300) == joint_counts(Sampler, speculate=False,
                                                                             n_runs=300)
    # ... and under speculation the test catches them, by the statistic (not by an impossible token)
    # and by a wide margin (measured: p ~ 1e-14 and 1e-118 at these settings)
    stat, df, p = chi_square(joint_counts(wrong, speculate=True), joint, N_RUNS)
    assert math.isfinite(stat) and df >= 10
    assert p < 1e-3
