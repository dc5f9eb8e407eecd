"""Counters of one run and their three renderings: report lines, a CSV row, a JSON object.

Counters are plain integers and seconds; every figure a report shows is derived from them here, so
the lines, the CSV and the JSON can never disagree. The report lines follow the self-speculative
loop's telemetry this project started from: acceptance
and tokens per verify decode, drafting cost against the effective rate, and coverage (how many
steps drafted at all), plus page faults and peak memory.
"""

from __future__ import annotations

import json
import resource
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Counters:
    source: str = "off"
    draft_max: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt positions reused from the previous request's cache (not decoded)
    generated_tokens: int = 0
    decodes: int = 0  # verify decodes after the prompt (one per step)
    drafted_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    grammar_tokens: int = 0  # accepted drafted tokens that the grammar forced (drafting.forced)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    major_faults: int = 0
    peak_rss_bytes: int = 0

    # -- derived ----------------------------------------------------------------------------
    @property
    def acceptance(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def tokens_per_decode(self) -> float:
        return self.generated_tokens / self.decodes if self.decodes else float(self.generated_tokens)

    @property
    def coverage(self) -> float:
        return self.drafted_steps / self.decodes if self.decodes else 0.0

    @property
    def reported_tps(self) -> float:
        """Generated tokens per second of prefill-free decode time, drafting excluded."""
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def effective_tps(self) -> float:
        """The rate to believe: decode time plus every second spent drafting."""
        spent = self.decode_s + self.draft_s
        return self.generated_tokens / spent if spent > 0 else 0.0

    @property
    def grammar_share(self) -> float:
        """The share of generated tokens that came from grammar drafts (accepted forced tokens)."""
        return self.grammar_tokens / self.generated_tokens if self.generated_tokens else 0.0

    @property
    def draft_s_per_token(self) -> float:
        return self.draft_s / self.generated_tokens if self.generated_tokens else 0.0

    @property
    def major_faults_per_token(self) -> float:
        return self.major_faults / self.generated_tokens if self.generated_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            acceptance=round(self.acceptance, 6),
            tokens_per_decode=round(self.tokens_per_decode, 6),
            coverage=round(self.coverage, 6),
            grammar_share=round(self.grammar_share, 6),
            reported_tps=round(self.reported_tps, 4),
            effective_tps=round(self.effective_tps, 4),
            draft_s_per_token=self.draft_s_per_token,
            major_faults_per_token=round(self.major_faults_per_token, 4),
        )
        return d

    # -- renderings -------------------------------------------------------------------------
    def timings(self) -> dict[str, float | int]:
        """llama-server's ``timings`` object: prompt (the decoded part; ``cache_n`` reused) and
        generation (verify and drafting time, the first token's prefill excluded)."""
        prompt_n = self.prompt_tokens - self.cached_tokens
        prompt_ms = self.prefill_s * 1000.0
        predicted_n = self.generated_tokens
        predicted_ms = (self.decode_s + self.draft_s) * 1000.0
        return {
            "cache_n": self.cached_tokens,
            "prompt_n": prompt_n,
            "prompt_ms": round(prompt_ms, 3),
            "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
            "prompt_per_second": round(prompt_n / self.prefill_s, 3) if self.prefill_s > 0 else 0.0,
            "predicted_n": predicted_n,
            "predicted_ms": round(predicted_ms, 3),
            "predicted_per_token_ms": round(predicted_ms / predicted_n, 3) if predicted_n else 0.0,
            "predicted_per_second": (round(predicted_n * 1000.0 / predicted_ms, 3)
                                     if predicted_ms > 0 else 0.0),
            "draft_n": self.drafted_tokens,
            "draft_n_accepted": self.accepted_tokens,
        }

    def report_lines(self) -> list[str]:
        s = self.source
        grammar = ([f"{s}: {self.grammar_tokens} of {self.generated_tokens} tokens came from grammar drafts "
                    f"({100 * self.grammar_share:.1f}%)"] if self.grammar_tokens else [])
        return [
            f"{s}: {self.accepted_tokens}/{self.drafted_tokens} drafts accepted "
            f"({100 * self.acceptance:.1f}%), {self.tokens_per_decode:.2f} tokens per verify decode "
            f"({self.decodes} decodes for {self.generated_tokens} tokens)",
            f"{s}: drafting costs {self.draft_s_per_token:.4f} s/token on top of decode "
            f"\u2192 {self.effective_tps:.2f} tok/s effective (vs {self.reported_tps:.2f} reported)",
            f"{s}: drafted on {self.drafted_steps} of {self.decodes} steps "
            f"({100 * self.coverage:.1f}%); the rest decoded plainly",
            f"{s}: {self.major_faults_per_token:.2f} major faults per token, "
            f"peak RSS {self.peak_rss_bytes / 2**20:.1f} MiB, "
            f"prompt {self.prompt_tokens} tokens in {self.prefill_s:.3f} s",
            *grammar,
        ]

    def csv_row(self, **extra: Any) -> str:
        """One line of ``key=value`` fields, comma separated (values never contain commas)."""
        fields = {**extra, **self.as_dict()}
        return ",".join(f"{k}={_csv_value(v)}" for k, v in fields.items())

    def to_json(self, **extra: Any) -> str:
        return json.dumps({**extra, **self.as_dict()})


def _csv_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v).replace(",", ";").replace("\n", " ")


class ResourceProbe:
    """Major page faults over a span of work, and the process's peak resident set size."""

    def __init__(self) -> None:
        self._start = resource.getrusage(resource.RUSAGE_SELF).ru_majflt

    def finish(self, counters: Counters) -> None:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        counters.major_faults = ru.ru_majflt - self._start
        counters.peak_rss_bytes = ru.ru_maxrss * 1024  # Linux reports KiB
