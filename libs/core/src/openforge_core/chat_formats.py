"""Chat formats written once for the two model-directory builders: the tiny model builder
(``openforge_inference.tiny_model``, real weights) and the test fakes
(``openforge_testing.fakes``, tokenizer and template only).

A library both can import (libraries never import services), holding data only: Jinja template
text and special-token spellings, no tokenizer or template engine.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CONTENT_MACRO",
    "LLAMA3_BOS_TOKEN",
    "LLAMA3_END_TOKENS",
    "LLAMA3_EOS_TOKEN",
    "LLAMA3_PAD_TOKEN",
    "LLAMA3_SPECIAL_TOKENS",
    "LLAMA3_TEMPLATE",
]

#: A Jinja macro ``render_content(content)``: a string as it is, the text parts of a list of
#: content parts, anything else as JSON. Both the Hermes and the Llama templates start with it.
CONTENT_MACRO: Final = """\
{%- macro render_content(content) -%}
{%- if content is string -%}{{- content -}}
{%- elif content is iterable and content is not mapping -%}
{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
{%- elif content is not none -%}{{- content | tojson -}}
{%- endif -%}
{%- endmacro -%}
"""

#: Llama 3's special tokens as the tokenizers built here carry them, ids 0..7 in this order (the
#: markers of the Llama 3.1 format; a real Llama 3 tokenizer holds them at ids 128000 and up).
LLAMA3_SPECIAL_TOKENS: Final[tuple[str, ...]] = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
)

#: Llama 3.1-style template, written from the format's description in Meta's Llama 3.1 model
#: card (not a copy of Meta's template): ``<|begin_of_text|>`` (the tokenizer's ``bos_token``),
#: every message ``<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>``, a system message
#: always (with ``Environment: ipython`` and the tool definitions when tools are given, and a
#: fixed date: no clock), tool results as the ``ipython`` role, an assistant's calls written
#: ``{"name": ..., "parameters": {...}}`` (several separated by ``; ``) and its turn then ended
#: with ``<|eom_id|>`` (the model card: a message that waits for a tool's result), and the
#: generation prompt ``<|start_header_id|>assistant<|end_header_id|>\n\n``.
LLAMA3_TEMPLATE: Final = (
    CONTENT_MACRO
    + """\
{%- macro render_call(tool_call) -%}
{%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
{{- '{"name": "' + call.name + '", "parameters": ' -}}
{%- if call.arguments is string -%}{{- call.arguments -}}{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}
{{- '}' -}}
{%- endmacro -%}
{%- if date_string is not defined %}
{%- set date_string = '26 Jul 2024' %}
{%- endif %}
{{- bos_token }}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
{%- if tools %}
{{- 'Environment: ipython\\n' }}
{%- endif %}
{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + date_string + '\\n\\n' }}
{%- if tools %}
{{- 'You have access to the following functions. To call a function, respond with JSON ' }}
{{- 'in the format {"name": function name, "parameters": dictionary of argument name and its ' }}
{{- 'value}. Do not use variables.\\n\\n' }}
{%- for tool in tools %}
{{- (tool | tojson) + '\\n\\n' }}
{%- endfor %}
{%- endif %}
{%- if messages[0].role == 'system' %}
{{- render_content(messages[0].content) }}
{%- endif %}
{{- '<|eot_id|>' }}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- if not loop.first %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + render_content(message.content) + '<|eot_id|>' }}
{%- endif %}
{%- elif message.role == 'user' %}
{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' + render_content(message.content) + '<|eot_id|>' }}
{%- elif message.role == 'assistant' %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' + render_content(message.content) }}
{%- if message.tool_calls is defined and message.tool_calls %}
{%- if message.content %}
{{- '\\n' }}
{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if not loop.first %}
{{- '; ' }}
{%- endif %}
{{- render_call(tool_call) }}
{%- endfor %}
{{- '<|eom_id|>' }}
{%- else %}
{{- '<|eot_id|>' }}
{%- endif %}
{%- elif message.role == 'tool' or message.role == 'ipython' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + render_content(message.content) + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
)

#: The tokenizer's ``bos_token``; the template writes it first.
LLAMA3_BOS_TOKEN: Final = "<|begin_of_text|>"
#: The tokenizer's ``eos_token`` (Llama 3.1 Instruct's): the end of a turn.
LLAMA3_EOS_TOKEN: Final = "<|eot_id|>"
#: The tokenizer's ``pad_token``.
LLAMA3_PAD_TOKEN: Final = "<|finetune_right_pad_id|>"
#: Every token that ends an assistant turn, ``eos_token`` first: ``<|eot_id|>`` (a turn's end),
#: ``<|eom_id|>`` (a message waiting for a tool's result) and ``<|end_of_text|>``.
LLAMA3_END_TOKENS: Final[tuple[str, ...]] = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
