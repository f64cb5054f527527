"""Context windows of common model families, by glob on the model name.

A name is matched case-insensitively, as given (``openai/gpt-4o``) and with
its provider prefix removed (everything up to the last ``/``), so OpenRouter,
Hugging Face and Ollama spellings find the same entry:
``meta-llama/Llama-3.1-8B-Instruct``, ``llama-3.1-8b-instant``, ``llama3.1:8b``.
The most specific pattern wins: the one with the most literal characters
(``gpt-4o-mini*`` before ``gpt-4o*`` before ``gpt-4*``).

Values are the windows the vendors document. Where a family has several,
the table takes the one a server loads by default, and the smaller one when
in doubt: a window set too small only compacts early, one set too large costs
an overflow error and a retry. Ollama serves every model with its own
``num_ctx`` (a few thousand tokens unless configured), which no name reveals:
give such models a ``[models."…"]`` table.

The name comes from the client, so the lookup is linear in its length: each
glob becomes :func:`fnmatch.translate`'s regex, whose every ``*`` but the last
is an atomic group that never gives back what it matched, so no name makes the
engine retry one star's choices for each of another's. A name longer than
:data:`MAX_NAME_CHARS` is not looked up at all: no vendor names a model so.
"""

from __future__ import annotations

import functools
import re
from fnmatch import translate
from typing import Final

_K128: Final = 128_000
_K200: Final = 200_000
_LLAMA: Final = 131_072
_GEMINI: Final = 1_048_576
_M1: Final = 1_000_000
_GPT_1M: Final = 1_050_000

#: The longest name the table is asked about (four times the edge's default
#: limit on a request's model name); a longer one gets ``None``, the default.
MAX_NAME_CHARS: Final = 1_024

# (glob, window). Order does not matter: the most specific match wins.
_TABLE: Final[tuple[tuple[str, int], ...]] = (
    # OpenAI — platform.openai.com/docs/models (each model's page); gpt-5.4 and
    # gpt-5.5 as OpenRouter (openrouter.ai/openai/gpt-5.4) and Vercel AI
    # Gateway (vercel.com/ai-gateway/models/openai/gpt-5.5) list them, 1,050,000;
    # their mini and nano variants stay with gpt-5* until a page says otherwise.
    ("gpt-5.4", _GPT_1M),
    ("gpt-5.4-2*", _GPT_1M),
    ("gpt-5.4-pro*", _GPT_1M),
    ("gpt-5.5", _GPT_1M),
    ("gpt-5.5-2*", _GPT_1M),
    ("gpt-5.5-pro*", _GPT_1M),
    ("gpt-5*", 400_000),
    ("gpt-5*-chat*", _K128),
    ("gpt-4.1*", 1_047_576),
    ("gpt-4.5*", _K128),
    ("gpt-4o*", _K128),
    ("gpt-4o-mini*", _K128),
    ("chatgpt-4o*", _K128),
    ("gpt-4-turbo*", _K128),
    ("gpt-4-*preview*", _K128),
    ("gpt-4-32k*", 32_768),
    ("gpt-4", 8_192),
    ("gpt-4-0*", 8_192),
    ("gpt-3.5-turbo*", 16_385),
    ("o1*", _K200),
    ("o1-mini*", _K128),
    ("o1-preview*", _K128),
    ("o3*", _K200),
    ("o4-mini*", _K200),
    ("gpt-oss*", 131_072),
    # Anthropic (also Bedrock's "anthropic.claude-…" names) — Claude Platform
    # docs, "Models overview" and each model's page
    # (platform.claude.com/docs/en/models/opus-4-8/overview: "Context window:
    # 1M tokens"; the same for opus-4-6, opus-4-7, sonnet-4-6, sonnet-5 and
    # the 5.x lineup; 200K for opus-4-5, sonnet-4-5, haiku-4-5 and older).
    # Sonnet 4 and 4.5 reach 1M only with the context-1m beta header, which
    # config.profiles.with_client_window reads.
    ("*claude-opus-4-6*", _M1),
    ("*claude-opus-4-7*", _M1),
    ("*claude-opus-4-8*", _M1),
    ("*claude-sonnet-4-6*", _M1),
    ("*claude-opus-5*", _M1),
    ("*claude-sonnet-5*", _M1),
    ("*claude-fable-*", _M1),
    ("*claude-haiku-*", _K200),
    ("*claude-3*", _K200),
    ("*claude-*-4*", _K200),
    ("*claude-4*", _K200),
    ("*claude-2.1*", _K200),
    ("*claude-2.0*", 100_000),
    # Google — ai.google.dev/gemini-api/docs/models (gemini-3-pro-preview,
    # gemini-3.1-pro-preview: input token limit 1,048,576)
    ("gemini-1.5*", _GEMINI),
    ("gemini-2*", _GEMINI),
    ("gemini-3*", _GEMINI),
    ("gemini-1.0*", 32_760),
    ("gemini-pro", 32_760),
    ("gemma2*", 8_192),
    ("gemma-2*", 8_192),
    ("gemma3*", 131_072),
    ("gemma-3*", 131_072),
    ("gemma3:1b*", 32_768),
    ("gemma-3-1b*", 32_768),
    # Meta — the Llama model cards (llama.com/docs/model-cards-and-prompt-formats):
    # 3.1 and later are 128k; 3 is 8k; 2 is 4k
    ("*llama-3.1*", _LLAMA),
    ("*llama3.1*", _LLAMA),
    ("*llama-3.2*", _LLAMA),
    ("*llama3.2*", _LLAMA),
    ("*llama-3.3*", _LLAMA),
    ("*llama3.3*", _LLAMA),
    ("llama3", 8_192),
    ("llama3:*", 8_192),
    ("llama3-*", 8_192),
    ("*llama-3-*", 8_192),
    ("llama2*", 4_096),
    ("*llama-2-*", 4_096),
    # Qwen — the model cards on huggingface.co/Qwen (config.json
    # max_position_embeddings; "Processing Long Texts"): 2.5 is 32k as
    # configured (128k only with YaRN); 3 is 40k as shipped
    ("qwen2*", 32_768),
    ("qwen2.5*", 32_768),
    ("qwen-2.5*", 32_768),
    ("qwen2.5*-1m*", 1_010_000),
    ("qwen3*", 40_960),
    ("qwen3-*2507*", 262_144),
    ("qwen3-coder*", 262_144),
    # Mistral — docs.mistral.ai/getting-started/models (each model's context)
    ("*mistral-large*", _K128),
    ("*mistral-medium*", _K128),
    ("*mistral-small*", _K128),
    ("*mistral-nemo*", _K128),
    ("ministral*", _K128),
    ("devstral*", _K128),
    ("mistral", 32_768),
    ("mistral:*", 32_768),
    ("*mistral-7b*", 32_768),
    ("*mixtral*", 32_768),
    ("*mixtral-8x22b*", 65_536),
    ("mixtral:8x22b*", 65_536),
    ("codestral*", 256_000),
    ("codestral:*", 32_768),
    # DeepSeek — api-docs.deepseek.com/quick_start/pricing: the API serves
    # 128k since V3.1
    ("deepseek-chat*", _K128),
    ("deepseek-reasoner*", _K128),
    ("deepseek-v3*", _K128),
    ("deepseek-r1*", _K128),
    # Microsoft — the Phi model cards on huggingface.co/microsoft: plain phi-3
    # is the 4k variant; phi-3.5 and phi-4-mini are 128k
    ("phi-3*", 4_096),
    ("phi3*", 4_096),
    ("phi-3*128k*", 131_072),
    ("phi3*128k*", 131_072),
    ("phi-3.5*", 131_072),
    ("phi3.5*", 131_072),
    ("phi-4*", 16_384),
    ("phi4*", 16_384),
    ("phi-4-mini*", 131_072),
    ("phi4-mini*", 131_072),
    # Cohere — docs.cohere.com/docs/models
    ("command-r*", _K128),
    ("command-a*", 256_000),
)


def _specificity(pattern: str) -> int:
    return sum(1 for char in pattern if char not in "*?")


# Most specific first; the table's order breaks ties. Built once, never changed.
_RULES: Final = tuple(
    (pattern, window)
    for _, _, pattern, window in sorted(
        (-_specificity(pattern), index, pattern, window)
        for index, (pattern, window) in enumerate(_TABLE)
    )
)


@functools.cache
def _matcher() -> re.Pattern[str]:
    # One alternation in specificity order: a match stops at the first (most
    # specific) alternative that matches, and ``lastindex`` says which. About
    # 10x faster than trying the globs one by one; compiled on first use to
    # keep it out of import time. Joining translate()'s results with "|" is a
    # use its source promises to keep working; each result ends in ``\Z``.
    alternatives = (f"({translate(pattern)})" for pattern, _ in _RULES)
    return re.compile("|".join(alternatives))


def match_model(matcher: re.Pattern[str], model: str) -> re.Match[str] | None:
    """``matcher``'s match of ``model`` as the built-in tables match a name:
    case-insensitively, without any provider prefix first, then as given; a
    name over :data:`MAX_NAME_CHARS` matches nothing."""
    name = model.strip().lower()
    if not name or len(name) > MAX_NAME_CHARS:
        return None
    bare = name.rsplit("/", 1)[-1]
    return matcher.match(bare) or (matcher.match(name) if bare != name else None)


def builtin_context_window(model: str) -> int | None:
    """The documented context window of ``model``, or ``None`` if the table does not know it."""
    match = match_model(_matcher(), model)
    if match is None or match.lastindex is None:
        return None
    return _RULES[match.lastindex - 1][1]


def builtin_table() -> tuple[tuple[str, int], ...]:
    """Every (glob, window) entry, most specific first: for documentation."""
    return _RULES
