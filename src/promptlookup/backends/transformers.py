"""Hugging Face transformers: the same speculative loop on a torch model.

Why a second engine: it shows the loop and its draft sources are engine-agnostic (nothing above
:mod:`promptlookup.backends.base` changes), and it lets us run transformers' own prompt lookup
(``generate(prompt_lookup_num_tokens=...)``) on the very same weights as a peer. It loads any local
model directory, or a GGUF through ``gguf_file=`` (needs ``gguf``; transformers dequantizes it, here
to fp32). Nothing is fetched from a hub: ``local_files_only`` is always set.

The KV cache is one ``DynamicCache``; rollback crops it (``crop`` takes a negative count of tokens
to drop, which both transformers 4.x and 5.x read the same way). Argmax is taken in torch, so only
ids cross into Python; under sampling the kept logits rows are viewed as numpy arrays (no copy on
the CPU) and handed to the :class:`~promptlookup.sampling.Sampler`.

Padding short verify batches. On this CPU (2 threads, torch 2.13 CPU build, SmolLM2-135M fp32,
128 tokens of context) the cost of one forward is not monotone in its width: widths whose remainder
mod 4 is 2 or 3 hit a slow matmul path, most visibly in the 49152 x 576 fp32 output layer
(that matmul alone: 1 token 10 ms, 2: 21, 3: 32, 4: 16, 5: 16, 6: 23, 7: 33, 8: 17). Verify cost,
median of 3 interleaved curves x 5 repetitions (``benchmarks/transformers_verify_cost.py``, ms)::

    width          1     2     3     4     5     6     7     8     9
    plain         57    90   109    79    85   105   123    85    95
    padded        57    77    79    78    87    85    87    86    95   (2,3 -> 4; 6,7 -> 8)

So a verify of 2-3 tokens is padded to 4 and one of 6-7 to 8: dummy tokens (repeats of the last
real one) are appended, their outputs ignored and their cache entries cropped at once. Causal
attention means the real positions never see them. ``pad_to={}`` turns it off; re-measure with
``benchmarks/transformers_verify_cost.py`` on another machine.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from promptlookup.backends.base import BackendError, check_keep, one_turn
from promptlookup.sampling import Sampler

DEFAULT_N_CTX = 4096  # a backend built directly; the CLI, Engine and load_backend size it (context_size.py)
PREFILL_CHUNK = 512
DEFAULT_PAD_TO: Mapping[int, int] = {2: 4, 3: 4, 6: 8, 7: 8}
INSTALL_HINT = "pip install 'promptlookup[transformers]' (torch==2.13.0 transformers accelerate gguf)"
# Token texts llama.cpp also treats as end-of-generation (turn ends, and the FIM pad/repo tokens), so
# that both backends stop at the same place on the same vocabulary.
_EOG_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|return|>",
              "<EOT>", "<|fim_pad|>", "<fim-pad>", "<|repo_name|>", "<reponame>", "<|fim_repo|>")


def import_torch_transformers() -> tuple[Any, Any]:
    """``(torch, transformers)``, or a :class:`BackendError` naming the install command."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise BackendError(f"--backend transformers needs torch and transformers ({exc.name} is "
                           f"missing): {INSTALL_HINT}") from None
    return torch, transformers


def split_model_path(path: str | os.PathLike[str]) -> tuple[Path, str | None]:
    """``(directory, gguf file name or None)`` for a model directory or a GGUF file."""
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise BackendError(f"model directory has no config.json: {p}")
        return p, None
    from promptlookup.backends.models import check_gguf

    try:
        p = check_gguf(p)
    except ValueError as exc:
        raise BackendError(f"{exc} (--backend transformers takes a model directory or a GGUF file)") from None
    return p.parent, p.name


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, reversed: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class TransformersBackend:
    """A transformers causal LM with one sequence of ``DynamicCache``, decoded greedily."""

    name = "transformers"

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        dtype: str = "float32",
        pad_to: Mapping[int, int] | None = None,
    ) -> None:
        torch, transformers = import_torch_transformers()
        from promptlookup.backends.llama_cpp import default_threads

        self._torch = torch
        self.model_path = Path(model_path)
        self.n_threads = n_threads or default_threads()
        torch.set_num_threads(self.n_threads)
        self.pad_to = dict(DEFAULT_PAD_TO if pad_to is None else pad_to)
        directory, gguf = split_model_path(self.model_path)
        kwargs: dict[str, Any] = {"local_files_only": True}
        if gguf:
            kwargs["gguf_file"] = gguf
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        try:  # GGUF conversion draws a tqdm bar on stderr that no setting turns off
            with contextlib.redirect_stderr(io.StringIO()):
                self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), **kwargs)
                self.model = transformers.AutoModelForCausalLM.from_pretrained(
                    str(directory), dtype=getattr(torch, dtype), **kwargs).eval()
        except (OSError, ValueError, ImportError, RuntimeError, KeyError) as exc:
            raise BackendError(f"transformers could not load {self.model_path}: {exc}") from exc
        self._device = None
        self._bind_model(transformers, n_ctx)
        self._eog = self._eog_ids()

    @classmethod
    def from_model(cls, model: Any, eos_token_ids: Sequence[int], n_ctx: int, tokenizer: Any = None,
                   pad_to: Mapping[int, int] | None = None) -> TransformersBackend:
        """Wrap a model the caller already loaded (no second copy, threads and device left as they are).

        Why a separate constructor: the drop-in ``promptlookup.integrations.transformers.generate``
        must stop exactly where ``model.generate`` stops, so the end-of-generation ids are the caller's
        (``eos_token_ids``), not the extra turn-end texts :meth:`_eog_ids` adds for the CLI. Width
        padding is a CPU measurement (module docstring), so it applies on CPU only by default.
        ``tokenizer`` is needed only for :meth:`fingerprint` (checking history and corpus files)."""
        torch, transformers = import_torch_transformers()
        self = cls.__new__(cls)
        self._torch = torch
        self.model = model
        self.tokenizer = tokenizer
        self.model_path = Path(str(getattr(getattr(model, "config", None), "name_or_path", "") or "model"))
        self.n_threads = torch.get_num_threads()
        self._device = next(model.parameters()).device
        if pad_to is None:
            pad_to = DEFAULT_PAD_TO if self._device.type == "cpu" else {}
        self.pad_to = dict(pad_to)
        self._bind_model(transformers, n_ctx)
        self._eog = frozenset(int(t) for t in eos_token_ids)
        return self

    def _bind_model(self, transformers: Any, n_ctx: int) -> None:
        """Cache class, forward's cache keyword, vocabulary and context of ``self.model``."""
        self._cache_cls = transformers.DynamicCache
        # transformers 5 renamed forward's past_key_values to cache (the old name warns)
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        if self._cache_kw not in params:
            raise BackendError(f"{type(self.model).__name__}.forward takes no KV cache (neither cache= nor "
                               "past_key_values=): speculative decoding needs one to verify and roll back")
        self._cache = self._cache_cls()
        cfg = self.model.config
        self.n_vocab = int(self.model.get_output_embeddings().weight.shape[0])
        limit = getattr(cfg, "max_position_embeddings", None) or n_ctx
        self.n_ctx = min(n_ctx, int(limit))
        self.n_past = 0
        self._ids: list[int] = []  # the tokens in the cache, for the sampler's penalties

    def _eog_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for src in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(src, int):
                ids.add(src)
            elif src:
                ids.update(int(t) for t in src)
        for text in _EOG_TEXTS:
            tid = self.tokenizer.convert_tokens_to_ids(text)
            if (isinstance(tid, int) and 0 <= tid < self.n_vocab
                    and self.tokenizer.convert_ids_to_tokens(tid) == text):
                ids.add(tid)
        return frozenset(ids)

    # -- metadata -------------------------------------------------------------------------
    @property
    def eog_ids(self) -> frozenset[int]:
        return self._eog

    def is_eog(self, token: int) -> bool:
        return int(token) in self._eog

    def check_token(self, token: int) -> None:
        if not 0 <= int(token) < self.n_vocab:
            raise BackendError(f"token id {token} is outside the vocabulary (0..{self.n_vocab - 1})")

    # -- tokenizer ------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        enc = self.tokenizer(text, add_special_tokens=add_special, split_special_tokens=not parse_special)
        return list(enc["input_ids"])

    def control_texts(self) -> list[str]:
        """Texts of the special tokens that only ``parse_special`` matches (``split_special_tokens``
        turns exactly these off); promptlookup.chat finds them in template text only."""
        texts = set(self.tokenizer.all_special_tokens)
        texts.update(t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special)
        return sorted(t for t in texts if t)

    def detokenize(self, ids: Sequence[int]) -> str:
        for t in ids:
            self.check_token(t)
        return self.tokenizer.decode(list(ids), skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False)

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (byte-level BPE, SentencePiece or a special token's text)."""
        piece = self.tokenizer.convert_ids_to_tokens(int(token))
        if piece is None:
            return b""
        if piece in self.tokenizer.all_special_tokens or int(token) in self.tokenizer.added_tokens_decoder:
            return piece.encode("utf-8")
        if not hasattr(self, "_bytes_of"):
            self._bytes_of = _byte_decoder()
        if all(ch in self._bytes_of for ch in piece):
            return bytes(self._bytes_of[ch] for ch in piece)
        if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:  # SentencePiece byte
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode("utf-8")

    def fingerprint(self) -> str:
        """Tokenizer fingerprint over each token's bytes; equals llama.cpp's for the same vocabulary."""
        from promptlookup.fingerprint import fingerprint_pieces

        return fingerprint_pieces(self.n_vocab, (self.token_bytes(t) for t in range(self.n_vocab)))

    def chat_prompt(self, user: str, system: str | None = None) -> str:
        """Render the model's own chat template for one user turn, ready for generation."""
        return self.render_chat(one_turn(user, system))

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template text (None when it has none, or several by name)."""
        template = self.tokenizer.chat_template
        return template if isinstance(template, str) and template else None

    def render_chat(self, messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """Render the model's own chat template for ``messages`` (role/content; tool calls and tool
        results as OpenAI's) and ``tools``, ready for the assistant's next turn."""
        if not self.tokenizer.chat_template:
            raise BackendError(f"{self.model_path.name} has no chat template (chat needs one)")
        try:
            return str(self.tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                                          add_generation_prompt=True,
                                                          tools=list(tools) if tools else None))
        except Exception as exc:  # jinja2's TemplateError and the template's own raise_exception
            raise BackendError(f"the chat template refused these messages: {exc}") from exc

    # -- decoding -------------------------------------------------------------------------
    def _forward(self, ids: Sequence[int], logits_to_keep: int, n_real: int | None = None,
                 sampler: Sampler | None = None) -> list[int]:
        """One forward; the choice after each kept position (of the first ``n_real`` fed tokens)."""
        torch = self._torch
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([list(ids)], dtype=torch.long, device=self._device),
                             use_cache=True,
                             logits_to_keep=logits_to_keep, **{self._cache_kw: self._cache})
            logits = out.logits[0]
            n_real = len(ids) if n_real is None else n_real
            n_rows = min(logits.shape[0], n_real)
            if sampler is None or sampler.argmax_only:
                return logits[:n_rows].argmax(dim=-1).tolist()
            # kept rows are the last one (prefill) or every one, padding last: the first n_rows
            # predict the positions after the last n_rows real tokens fed
            rows = logits[:n_rows].float().cpu().numpy()
            return sampler.sample_rows(rows, self._ids, self.n_past + n_real - n_rows + 1)

    def _check(self, ids: Sequence[int]) -> None:
        if not ids:
            raise BackendError("nothing to decode")
        if self.n_past + len(ids) > self.n_ctx:
            raise BackendError(
                f"context full: {self.n_past} cached + {len(ids)} new tokens > n_ctx {self.n_ctx}")
        for t in ids:
            self.check_token(t)

    @property
    def tokens(self) -> list[int]:
        return list(self._ids)

    def prefill(self, ids: Sequence[int], sampler: Sampler | None = None, keep: int = 0) -> int:
        check_keep(self._ids, ids, keep)
        if keep:
            self.rollback(keep)
        else:
            self._cache = self._cache_cls()
            self.n_past = 0
        rest = ids[keep:]
        self._check(rest)
        self._ids = [int(t) for t in ids]
        last = -1
        for start in range(0, len(rest), PREFILL_CHUNK):
            chunk = rest[start : start + PREFILL_CHUNK]
            final = start + len(chunk) == len(rest)
            if final:
                last = int(self._forward(chunk, logits_to_keep=1, sampler=sampler)[-1])
            else:
                self._forward(chunk, logits_to_keep=1)
            self.n_past += len(chunk)
        return last

    def verify(self, ids: Sequence[int], sampler: Sampler | None = None) -> list[int]:
        self._check(ids)
        m = len(ids)
        del self._ids[self.n_past :]
        self._ids.extend(int(t) for t in ids)
        width = self.pad_to.get(m, m)
        if width > m and self.n_past + width <= self.n_ctx:
            chosen = self._forward([*ids, *[ids[-1]] * (width - m)], logits_to_keep=0, n_real=m,
                                   sampler=sampler)
            self._cache.crop(m - width)
        else:
            chosen = self._forward(ids, logits_to_keep=0, sampler=sampler)
        self.n_past += m
        return [int(t) for t in chosen]

    def rollback(self, n_keep: int) -> None:
        if not 0 <= n_keep <= self.n_past:
            raise BackendError(f"cannot roll back to {n_keep} with {self.n_past} cached")
        if n_keep == 0:
            self._cache = self._cache_cls()
        elif n_keep < self.n_past:
            self._cache.crop(n_keep - self.n_past)
        self.n_past = n_keep
        del self._ids[n_keep:]

    def cached_length(self) -> int:
        """Positions the cache actually holds (equals ``n_past``; for tests)."""
        return int(self._cache.get_seq_length())

    def close(self) -> None:
        self._cache = None
        self.model = None

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        with contextlib.suppress(Exception):
            self.close()
