"""Chat templates we ship: ChatML with tools in the Hermes/Qwen convention.

Tools go into the system turn as JSON lines inside ``<tools></tools>``; an assistant's calls are rendered as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (what the Hermes tool parser of vLLM and ours
read back); tool results come back in a user turn as ``<tool_response>`` blocks, consecutive results sharing one
turn. Every piece of text is emitted from an expression and every tag trims whitespace, so the rendering is the
same under transformers' Jinja settings and llama.cpp's minja. Used by the tiny test model and as the llama.cpp
default (SmolLM2's own template ignores tools).
"""

CHATML_TOOLS_TEMPLATE = """
{%- set ns = namespace(system='', start=0) -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set ns.system = messages[0].content -%}
  {%- set ns.start = 1 -%}
{%- endif -%}
{%- if tools -%}
  {{- '<|im_start|>system\\n' -}}
  {%- if ns.system -%}{{- ns.system + '\\n\\n' -}}{%- endif -%}
  {{- '# Tools\\n\\nYou can call the functions described below. Their signatures are JSON objects inside '
      + '<tools></tools>:\\n<tools>' -}}
  {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\\n</tools>\\n\\nTo call a function, reply with a JSON object holding its name and its arguments between '
      + '<tool_call></tool_call> tags:\\n<tool_call>\\n{"name": <function name>, "arguments": <JSON object>}\\n'
      + '</tool_call><|im_end|>\\n' -}}
{%- elif ns.start == 1 -%}
  {{- '<|im_start|>system\\n' + ns.system + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if loop.index0 < ns.start -%}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- elif message.role == 'assistant' -%}
    {{- '<|im_start|>assistant\\n' -}}
    {%- if message.content -%}{{- message.content -}}{%- endif -%}
    {%- if message.tool_calls -%}
      {%- for call in message.tool_calls -%}
        {%- set fn = call.function if call.function is defined else call -%}
        {%- if (message.content or not loop.first) -%}{{- '\\n' -}}{%- endif -%}
        {{- '<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' -}}
        {%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
        {{- '}\\n</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
""".strip()
"""ChatML + tools (Hermes/Qwen convention); end of turn is ``<|im_end|>``."""
