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
    "DEEPSEEK_V31_BOS_TOKEN",
    "DEEPSEEK_V31_END_TOKENS",
    "DEEPSEEK_V31_EOS_TOKEN",
    "DEEPSEEK_V31_PAD_TOKEN",
    "DEEPSEEK_V31_SPECIAL_TOKENS",
    "DEEPSEEK_V31_TEMPLATE",
    "GLM45_END_TOKENS",
    "GLM45_EOS_TOKEN",
    "GLM45_PAD_TOKEN",
    "GLM45_SPECIAL_TOKENS",
    "GLM45_TEMPLATE",
    "HERMES_TEMPLATE",
    "LLAMA3_BOS_TOKEN",
    "LLAMA3_END_TOKENS",
    "LLAMA3_EOS_TOKEN",
    "LLAMA3_PAD_TOKEN",
    "LLAMA3_SPECIAL_TOKENS",
    "LLAMA3_TEMPLATE",
    "MISTRAL_BOS_TOKEN",
    "MISTRAL_END_TOKENS",
    "MISTRAL_EOS_TOKEN",
    "MISTRAL_PAD_TOKEN",
    "MISTRAL_SPECIAL_TOKENS",
    "MISTRAL_TEMPLATE",
    "QWEN3_TEMPLATE",
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

_SYSTEM_AND_TOOLS: Final = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}
{{- render_content(messages[0].content) + '\\n\\n' }}
{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}
{{- '\\n' + (tool | tojson) }}
{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and ' }}
{{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + render_content(messages[0].content) + '<|im_end|>\\n' }}
{%- endif %}
"""

_ASSISTANT_BODY: Final = """\
{{- render_content(message.content) }}
{%- if message.tool_calls is defined and message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- set call = tool_call.function if tool_call.function is defined else tool_call %}
{%- if (not loop.first) or (message.content is not none and message.content) %}
{{- '\\n' }}
{%- endif %}
{{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
{%- if call.arguments is string %}
{{- call.arguments }}
{%- else %}
{{- call.arguments | tojson }}
{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\\n' }}
"""

_OTHER_ROLES: Final = """\
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}
"""

#: Hermes-style template that keeps every assistant turn's reasoning.
HERMES_TEMPLATE: Final = (
    CONTENT_MACRO
    + _SYSTEM_AND_TOOLS
    + """\
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- if not loop.first %}
{{- '<|im_start|>system\\n' + render_content(message.content) + '<|im_end|>\\n' }}
{%- endif %}
{%- elif message.role == 'user' %}
{{- '<|im_start|>user\\n' + render_content(message.content) + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if message.reasoning_content is defined and message.reasoning_content is not none %}
{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}
{%- endif %}
"""
    + _ASSISTANT_BODY
    + _OTHER_ROLES
)

#: Qwen3-style template: reasoning only on assistant turns after the last user message.
QWEN3_TEMPLATE: Final = (
    CONTENT_MACRO
    + _SYSTEM_AND_TOOLS
    + """\
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
{%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- if not loop.first %}
{{- '<|im_start|>system\\n' + render_content(message.content) + '<|im_end|>\\n' }}
{%- endif %}
{%- elif message.role == 'user' %}
{{- '<|im_start|>user\\n' + render_content(message.content) + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if loop.index0 > ns.last_user and message.reasoning_content is defined and message.reasoning_content %}
{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}
{%- endif %}
"""
    + _ASSISTANT_BODY
    + _OTHER_ROLES
)

#: GLM-4.5's special tokens as the tokenizers built here carry them, ids 0.. in this order (the
#: markers of the GLM-4.5 format; a real GLM-4.5 tokenizer holds them at ids 151329 and up).
GLM45_SPECIAL_TOKENS: Final[tuple[str, ...]] = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)

#: GLM-4.5-style template, written from the format's description (not a copy of Zhipu's
#: template): ``[gMASK]<sop>`` first; each message opened by its role's token with no end token
#: (``<|system|>\n``, ``<|user|>\n``, ``<|assistant|>``, ``<|observation|>`` before a run of
#: tool results, each ``\n<tool_response>\n...\n</tool_response>``); the tool definitions in a
#: system message; an assistant turn ``\n<think>REASONING</think>`` (reasoning kept only after
#: the last user message, else ``\n<think></think>``), then ``\nCONTENT`` and each call
#: ``\n<tool_call>NAME`` + ``\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>`` per argument (a
#: string as it is, anything else as JSON) + ``\n</tool_call>``; the generation prompt
#: ``<|assistant|>`` (then ``\n<think></think>`` with ``enable_thinking`` false). The model ends
#: its turn with the token that opens the next message (:data:`GLM45_END_TOKENS`). Finding the
#: last user message takes a loop of its own, as in Qwen3's template, so the proxy renders it
#: whole at every call (no incremental render).
GLM45_TEMPLATE: Final = (
    CONTENT_MACRO
    + """\
{{- '[gMASK]<sop>' }}
{%- if tools %}
{{- '<|system|>\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\\n' }}
{%- for tool in tools %}
{{- (tool | tojson) + '\\n' }}
{%- endfor %}
{{- '</tools>\\n\\nFor each function call, output the function name and arguments within the ' }}
{{- 'following XML format:\\n<tool_call>{function-name}\\n<arg_key>{arg-key-1}</arg_key>\\n' }}
{{- '<arg_value>{arg-value-1}</arg_value>\\n<arg_key>{arg-key-2}</arg_key>\\n' }}
{{- '<arg_value>{arg-value-2}</arg_value>\\n...\\n</tool_call>' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
{%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{{- '<|system|>\\n' + render_content(message.content) }}
{%- elif message.role == 'user' %}
{{- '<|user|>\\n' + render_content(message.content) }}
{%- elif message.role == 'assistant' %}
{{- '<|assistant|>' }}
{%- if loop.index0 > ns.last_user and message.reasoning_content is defined and message.reasoning_content %}
{{- '\\n<think>' + message.reasoning_content.strip() + '</think>' }}
{%- else %}
{{- '\\n<think></think>' }}
{%- endif %}
{%- set content = render_content(message.content) %}
{%- if content.strip() %}
{{- '\\n' + content.strip() }}
{%- endif %}
{%- if message.tool_calls is defined and message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- set call = tool_call.function if tool_call.function is defined else tool_call %}
{{- '\\n<tool_call>' + call.name }}
{%- for key, value in call.arguments.items() %}
{{- '\\n<arg_key>' + key + '</arg_key>\\n<arg_value>' }}
{%- if value is string %}{{- value }}{%- else %}{{- value | tojson }}{%- endif %}
{{- '</arg_value>' }}
{%- endfor %}
{{- '\\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|observation|>' }}
{%- endif %}
{{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|assistant|>' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '\\n<think></think>' }}
{%- endif %}
{%- endif %}
"""
)

#: The tokenizer's ``eos_token``.
GLM45_EOS_TOKEN: Final = "<|endoftext|>"
#: The tokenizer's ``pad_token``.
GLM45_PAD_TOKEN: Final = "<|endoftext|>"
#: Every token that ends an assistant turn: ``<|user|>`` (an answer: the user speaks next),
#: ``<|observation|>`` (calls: their results come next) and ``<|endoftext|>``.
GLM45_END_TOKENS: Final[tuple[str, ...]] = ("<|user|>", "<|observation|>", "<|endoftext|>")

#: Mistral's control tokens (v7/v11 tokenizers: Mistral Small 3.x, Devstral) as the tokenizers
#: built here carry them, ids 0.. in this order (a real Tekken tokenizer holds them among its
#: first 1000 ids, ``[ARGS]`` at 32 and ``[CALL_ID]`` at 33).
MISTRAL_SPECIAL_TOKENS: Final[tuple[str, ...]] = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "<pad>",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[ARGS]",
    "[CALL_ID]",
)

#: Mistral v11-style template (Mistral Small 3.x, Devstral, Magistral), written from the format
#: as ``mistral-common``'s v13 encoder writes it (not a copy of Mistral's template; the test
#: ``test_mistral_template_vs_mistral_common`` checks it renders that encoder's text):
#: ``<s>`` (the tokenizer's ``bos_token``), a system message as
#: ``[SYSTEM_PROMPT]...[/SYSTEM_PROMPT]``, the tool definitions once as
#: ``[AVAILABLE_TOOLS][...][/AVAILABLE_TOOLS]`` after the first system prompt (the v7/v11
#: encoders place them before the last user message, so a conversation's render would not be a
#: prefix of its next one), a user message ``[INST]...[/INST]``, an assistant turn its text then
#: each call ``[TOOL_CALLS]NAME[ARGS]{json}`` (no ``[CALL_ID]``, as v13), ended with ``</s>``, a
#: tool result ``[TOOL_RESULTS]...[/TOOL_RESULTS]``. No generation prompt: the model writes
#: right after ``[/INST]`` or ``[/TOOL_RESULTS]``.
MISTRAL_TEMPLATE: Final = (
    CONTENT_MACRO
    + """\
{{- bos_token }}
{%- if messages[0].role == 'system' %}
{{- '[SYSTEM_PROMPT]' + render_content(messages[0].content) + '[/SYSTEM_PROMPT]' }}
{%- endif %}
{%- if tools %}
{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- if not loop.first %}
{{- '[SYSTEM_PROMPT]' + render_content(message.content) + '[/SYSTEM_PROMPT]' }}
{%- endif %}
{%- elif message.role == 'user' %}
{{- '[INST]' + render_content(message.content) + '[/INST]' }}
{%- elif message.role == 'assistant' %}
{{- render_content(message.content) }}
{%- if message.tool_calls is defined and message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- set call = tool_call.function if tool_call.function is defined else tool_call %}
{{- '[TOOL_CALLS]' + call.name + '[ARGS]' }}
{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
{%- endfor %}
{%- endif %}
{{- eos_token }}
{%- elif message.role == 'tool' %}
{{- '[TOOL_RESULTS]' + render_content(message.content) + '[/TOOL_RESULTS]' }}
{%- endif %}
{%- endfor %}
"""
)

#: The tokenizer's ``bos_token``; the template writes it first.
MISTRAL_BOS_TOKEN: Final = "<s>"
#: The tokenizer's ``eos_token``: the end of an assistant turn.
MISTRAL_EOS_TOKEN: Final = "</s>"
#: The tokenizer's ``pad_token``.
MISTRAL_PAD_TOKEN: Final = "<pad>"
#: Every token that ends an assistant turn: ``</s>``.
MISTRAL_END_TOKENS: Final[tuple[str, ...]] = ("</s>",)

#: DeepSeek-V3.1's special tokens as the tokenizers built here carry them, ids 0.. in this order
#: (the spellings of DeepSeek-V3.1's tokenizer: ``｜`` is U+FF5C, ``▁`` U+2581; a real one holds
#: them at ids 0..2 and 128798 and up).
DEEPSEEK_V31_SPECIAL_TOKENS: Final[tuple[str, ...]] = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜▁pad▁｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
)

#: DeepSeek-V3.1-style template, written from the format's description (DeepSeek-V3.1's model
#: card, "Chat Template" and "ToolCall"; not a copy of DeepSeek's template): the BOS token, then
#: every system message's text (joined by a blank line) and, with tools, their definitions and the
#: call syntax; a user message ``<｜User｜>TEXT``; an assistant turn right after a user message
#: opened by ``<｜Assistant｜></think>`` (past reasoning is never rendered), right after tool
#: results opened by nothing; its text, then its calls
#: ``<｜tool▁calls▁begin｜>`` + ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>``
#: per call + ``<｜tool▁calls▁end｜>``, ended with ``<｜end▁of▁sentence｜>``; a tool result
#: ``<｜tool▁output▁begin｜>TEXT<｜tool▁output▁end｜>``. The generation prompt, after a user
#: message only, is ``<｜Assistant｜></think>``, or ``<｜Assistant｜><think>`` with ``thinking``
#: true; after tool results the model writes right away.
DEEPSEEK_V31_TEMPLATE: Final = (
    CONTENT_MACRO
    + """\
{%- set ns = namespace(system='', last='') %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- set ns.system = ns.system + ('\\n\\n' if ns.system else '') + render_content(message.content) %}
{%- endif %}
{%- endfor %}
{%- if tools %}
{%- set ns.system = ns.system + ('\\n\\n' if ns.system else '') %}
{%- set ns.system = ns.system + '## Tools\\nYou have access to the following tools:\\n' %}
{%- for tool in tools %}
{%- set ns.system = ns.system + (tool | tojson) + '\\n' %}
{%- endfor %}
{%- set ns.system = ns.system + 'Call a tool as <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME' %}
{%- set ns.system = ns.system + '<｜tool▁sep｜>ARGUMENTS' %}
{%- set ns.system = ns.system + '<｜tool▁call▁end｜><｜tool▁calls▁end｜>, where NAME is one of the tools above ' %}
{%- set ns.system = ns.system + 'and ARGUMENTS a JSON object that follows its parameters; chain several calls ' %}
{%- set ns.system = ns.system + 'inside one <｜tool▁calls▁begin｜> with nothing between them.\\n' %}
{%- endif %}
{{- bos_token }}
{{- ns.system }}
{%- for message in messages %}
{%- if message.role == 'user' %}
{{- '<｜User｜>' + render_content(message.content) }}
{%- elif message.role == 'assistant' %}
{%- if ns.last == 'user' %}
{{- '<｜Assistant｜></think>' }}
{%- endif %}
{{- render_content(message.content) }}
{%- if message.tool_calls is defined and message.tool_calls %}
{{- '<｜tool▁calls▁begin｜>' }}
{%- for tool_call in message.tool_calls %}
{%- set call = tool_call.function if tool_call.function is defined else tool_call %}
{{- '<｜tool▁call▁begin｜>' + call.name + '<｜tool▁sep｜>' }}
{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
{{- '<｜tool▁call▁end｜>' }}
{%- endfor %}
{{- '<｜tool▁calls▁end｜>' }}
{%- endif %}
{{- '<｜end▁of▁sentence｜>' }}
{%- elif message.role == 'tool' %}
{{- '<｜tool▁output▁begin｜>' + render_content(message.content) + '<｜tool▁output▁end｜>' }}
{%- endif %}
{%- if message.role != 'system' %}
{%- set ns.last = message.role %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt and ns.last == 'user' %}
{{- '<｜Assistant｜>' + ('<think>' if thinking is defined and thinking else '</think>') }}
{%- endif %}
"""
)

#: The tokenizer's ``bos_token``; the template writes it first.
DEEPSEEK_V31_BOS_TOKEN: Final = "<｜begin▁of▁sentence｜>"
#: The tokenizer's ``eos_token``: the end of an assistant turn.
DEEPSEEK_V31_EOS_TOKEN: Final = "<｜end▁of▁sentence｜>"
#: The tokenizer's ``pad_token``.
DEEPSEEK_V31_PAD_TOKEN: Final = "<｜▁pad▁｜>"
#: Every token that ends an assistant turn: ``<｜end▁of▁sentence｜>``.
DEEPSEEK_V31_END_TOKENS: Final[tuple[str, ...]] = ("<｜end▁of▁sentence｜>",)
