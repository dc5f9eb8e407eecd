"""A GGUF whose chat template supports tools, made at test time from the bundled SmolLM2.

Why: SmolLM2's template has no tool section, so a request with tools is refused on it. The tool
tests need a real model behind a real template that shows tools and teaches a call format; this
copies the bundled GGUF with ``tokenizer.chat_template`` replaced by a Qwen-style (Hermes
``<tool_call>``) template written here. The weights are unchanged, so the model is still a
135M-parameter SmolLM2 that was never trained on tools: forced calls (grammar) always parse, free
ones rarely happen. Made once per template into the system's temp directory, never committed.

The copy is byte-level: the key-value section is rewritten with the new template string, the tensor
infos are copied as they are, and the tensor data follows at the next alignment boundary (tensor
offsets count from the data section's start, so they stay valid).
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from pathlib import Path

# A Qwen 2.5-style template (Hermes tool calls), written for these tests: tools listed in the system
# turn as JSON lines inside <tools></tools>, calls as <tool_call>{json}</tool_call>, tool results in a
# user turn inside <tool_response></tool_response>.
HERMES_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}"
    "{%- else -%}{{- 'You are a helpful assistant.' -}}{%- endif -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}"
    "{%- elif messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' and message.tool_calls -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if message.content -%}{{- message.content + '\\n' -}}{%- endif -%}"
    "{%- for call in message.tool_calls -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' "
    "+ (call.function.arguments | tojson) + '}\\n</tool_call>' -}}"
    "{%- if not loop.last -%}{{- '\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role != 'system' -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def with_template(source: Path, template: str, target: Path) -> Path:
    """Write ``source`` with its ``tokenizer.chat_template`` replaced by ``template`` to ``target``."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    field = reader.fields["tokenizer.chat_template"]
    key_parts = sum(p.nbytes for p in field.parts[:3])  # key length, key, value type
    value_at = field.offset + key_parts
    value_end = field.offset + sum(p.nbytes for p in field.parts)
    infos_end = max(t.field.offset + sum(p.nbytes for p in t.field.parts) for t in reader.tensors)
    raw = source.read_bytes()
    encoded = template.encode("utf-8")
    head = raw[:value_at] + struct.pack("<Q", len(encoded)) + encoded + raw[value_end:infos_end]
    head += b"\0" * (-len(head) % reader.alignment)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(head + raw[reader.data_offset:])
    os.replace(tmp, target)
    return target


def hermes_gguf() -> Path:
    """The bundled SmolLM2 with :data:`HERMES_TEMPLATE`, cached in the temp directory."""
    from promptlookup.backends.models import bundled_model_path

    source = bundled_model_path()
    tag = hashlib.sha256(HERMES_TEMPLATE.encode() + str(source.stat().st_size).encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / "promptlookup-test-models"
    folder.mkdir(exist_ok=True)
    target = folder / f"smollm2-hermes-{tag}.gguf"
    if not target.exists():
        with_template(source, HERMES_TEMPLATE, target)
    return target
