"""A BF16 GGUF made from the bundled Q4_1 model, for benchmarks that need a second real CPU curve.

Why: the bundled SmolLM2 is Q4_1, whose verify cost grows steeply with batch width on a CPU (the
dequantizing matmul is compute bound); a BF16 copy of the same weights has a flatter curve (more
memory traffic per token, amortized over the batch), so `auto` must get both right. Weights cannot
be downloaded here, so the copy is made with the `gguf` package: every quantized tensor is
dequantized and stored as BF16, F32 tensors (norms) stay F32, and all metadata (tokenizer, chat
template) is copied. It is cached outside the repository, never committed:
``~/.cache/promptlookup/models/<stem>-BF16.gguf``, written atomically.

    python benchmarks/bf16_gguf.py            # prints the path (converts once)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

CACHE = Path.home() / ".cache" / "promptlookup" / "models"


def bf16_path(src: Path) -> Path:
    return CACHE / f"{src.stem.split('.')[0]}-BF16.gguf"


def convert(src: Path, dst: Path) -> Path:
    """Write ``src`` with its quantized tensors as BF16 to ``dst`` (atomically)."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as Q

    reader = gguf.GGUFReader(str(src))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    dst.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(tmp), arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_key_value(field.name, int(gguf.LlamaFileType.MOSTLY_BF16), vtype)
            continue
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    tensors = []
    for t in reader.tensors:
        if t.tensor_type in (Q.F32, Q.F16, Q.BF16):
            data, qtype = np.asarray(t.data), t.tensor_type
        else:
            floats = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            data, qtype = gguf.quants.quantize(floats, Q.BF16), Q.BF16
        tensors.append((t.name, data, qtype))
        # shapes: GGUF stores dims fastest first; the writer wants the numpy (row-major) shape
        shape = list(reversed([int(d) for d in t.shape]))
        writer.add_tensor_info(t.name, shape, np.dtype(np.float32) if qtype == Q.BF16 else data.dtype,
                               data.nbytes, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(data)
    writer.close()
    os.replace(tmp, dst)
    return dst


def ensure_bf16(src: Path | None = None) -> Path:
    """The BF16 copy of ``src`` (default: the bundled model), converted once."""
    if src is None:
        from promptlookup.backends.models import bundled_model_path

        src = bundled_model_path()
    dst = bf16_path(src)
    if not dst.exists():
        print(f"[bf16_gguf] converting {src.name} to BF16 -> {dst}", file=sys.stderr, flush=True)
        convert(src, dst)
    return dst


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", type=Path, help="source GGUF (default: the bundled model)")
    p.add_argument("--force", action="store_true", help="convert again")
    args = p.parse_args()
    if args.force and args.model is not None:
        bf16_path(args.model).unlink(missing_ok=True)
    print(ensure_bf16(args.model))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
