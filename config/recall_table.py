"""Models measured never to call the recall tool, by glob on the model name.

Recall (docs/recall.md) costs every compacted request of a tool-using client
the tool's definition (about 215 tokens) and each brief its ref; it pays only
when the model calls the tool. The models here were run against the proxy
on a local server with conversations whose next step needed a line that
only recall could give back, in a tool-calling client's words and in a
text-command agent's, and never called it: they answered with a line they
made up (docs/local-servers.md, "Measured with real small models"). For
them recall is off unless a ``[models."…"]`` table sets ``recall = true``.

Only measured models are listed: a model's size says little about whether
it reads a tool's description, and a wrong entry takes recall from a model
that would have used it. Names are matched as in :mod:`config.model_table`:
case-insensitively, as given and with any provider prefix removed, so
``Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF``, ``qwen2.5-coder:1.5b`` (Ollama) and
``qwen2.5-coder-1.5b-instruct`` (llama.cpp's ``--alias``) find the same entry.
"""

from __future__ import annotations

import functools
import re
from fnmatch import translate
from typing import Final

from config.model_table import match_model

#: Globs of the models that never called the recall tool when measured. Each
#: ends in its only ``*``, so matching is linear in the (client-given) name.
NO_RECALL: Final = (
    "qwen2.5-coder-0.5b*",
    "qwen2.5-coder:0.5b*",
    "qwen2.5-coder-1.5b*",
    "qwen2.5-coder:1.5b*",
)


@functools.cache
def _matcher() -> re.Pattern[str]:
    return re.compile("|".join(translate(pattern) for pattern in NO_RECALL))


def never_recalls(model: str) -> bool:
    """Whether ``model`` is one measured never to call the recall tool."""
    return match_model(_matcher(), model) is not None
