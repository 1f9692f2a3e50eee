"""A chat template that rewrites history the way real ones do, so that re-rendering breaks token contiguity.

It is our ChatML + tools template with two changes modelled on Qwen3's: the generation prompt opens an empty
``<think>`` block (Qwen3's non-thinking mode), and earlier assistant turns are rendered without their ``<think>``
block and trimmed; tool-call arguments are re-serialised as indented JSON (other spacing than any model writes).
Every multi-turn episode rendered from text with it therefore differs from what the model saw at the previous turn;
only the prefix splice of recorded token ids keeps the prompts contiguous.
"""

from pathlib import Path

from nemo_tau2.generation.chat_templates import CHATML_TOOLS_TEMPLATE

_CONTENT = "{%- if message.content -%}{{- message.content -}}{%- endif -%}"
_ARGUMENTS = (
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
)
_GENERATION_PROMPT = "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"


def _rewrite(template: str) -> str:
    for old, new in (
        (_CONTENT, "{%- if message.content -%}{{- (message.content.split('</think>') | last) | trim -}}{%- endif -%}"),
        (
            _ARGUMENTS,
            "{%- if fn.arguments is string -%}{{- fn.arguments | replace('\": ', '\":  ') -}}"
            "{%- else -%}{{- fn.arguments | tojson(indent=1) -}}{%- endif -%}",
        ),
        (
            _GENERATION_PROMPT,
            "{%- if add_generation_prompt -%}"
            "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}",
        ),
    ):
        assert template.count(old) == 1, f"the ChatML template changed; update {__name__}: {old}"
        template = template.replace(old, new)
    return template


HISTORY_REWRITING_TEMPLATE = _rewrite(CHATML_TOOLS_TEMPLATE)


def write_history_rewriting_template(folder: Path) -> str:
    """The template as a file (vLLM's ``--chat-template`` takes a path); returns its path."""
    path = Path(folder) / "history_rewriting_chatml.jinja"
    path.write_text(HISTORY_REWRITING_TEMPLATE)
    return str(path)
