"""Anthropic Messages (``POST /v1/messages``, Claude Code).

``dialect.py`` holds :data:`ANTHROPIC`; ``to_engine.py`` maps a request's
blocks to the engine's messages, ``from_engine.py`` maps them back (signed
blocks and cache breakpoints kept);
``pairing.py`` the API's tool pairing rule (checked, and kept by a last pass);
``replies.py`` the ``/compact`` answer and the error event in this API's
shape; ``recall.py`` its side of recall (:mod:`proxy.dialects.recall`). The
rest of the proxy imports :data:`ANTHROPIC` from here.
"""

from proxy.dialects.anthropic.dialect import (
    ANTHROPIC,
    UNCUT,
    AnthropicDialect,
    pairing_problems,
)

__all__ = ["ANTHROPIC", "UNCUT", "AnthropicDialect", "pairing_problems"]
