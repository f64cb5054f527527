"""Token estimation: tiktoken per model family, per-message cache, request totals.

Clients resend the whole history on every request, so counts are memoized per
message, keyed by a hash of the message's canonical JSON, in a bounded LRU: a
warm request only tokenizes what is new. Counting is thread-safe so large
requests can be counted off the event loop.

What is counted (DESIGN.md §3–4): every message with OpenAI's per-message
overhead (3 tokens, +1 for a ``name``), text parts, images at a fixed cost,
tool calls, the ``tools`` / ``functions`` schemas, ``response_format``, and 3
tokens priming the reply.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from compaction.encodings import load_encoding
from compaction.profile import DEFAULT_IMAGE_TOKENS
from compaction.types import Message

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_PER_TOOL_CALL = 3
REPLY_PRIMING = 3
DEFAULT_CACHE_SIZE = 65_536
CHARS_PER_TOKEN = 4

_O200K_PREFIXES = (
    "gpt-4o",
    "gpt-4.1",
    "gpt-4.5",
    "gpt-5",
    "chatgpt-4o",
    "gpt-oss",
    "o1",
    "o3",
    "o4",
)
_COUNTED_ELSEWHERE = frozenset({"role", "content", "name", "tool_calls", "function_call"})


def encoding_for_model(model: str | None) -> str:
    """``o200k_base`` for the gpt-4o / 4.1 / 5 / o-series families, ``cl100k_base`` otherwise."""
    if not model:
        return "cl100k_base"
    name = model.lower().rsplit("/", 1)[-1]
    if name.startswith(_O200K_PREFIXES):
        return "o200k_base"
    return "cl100k_base"


def message_key(message: Message) -> bytes:
    """A stable digest of a message's canonical JSON form."""
    data = orjson.dumps(message, option=orjson.OPT_SORT_KEYS, default=repr)
    return hashlib.blake2b(data, digest_size=16).digest()


class TokenCounter:
    """Counts tokens the way the upstream will, with a bounded per-message cache."""

    def __init__(
        self,
        model: str | None = None,
        *,
        encoding: str | None = None,
        image_tokens: int = DEFAULT_IMAGE_TOKENS,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        name = encoding or encoding_for_model(model)
        self._encoding = load_encoding(name)
        self.encoding_name = name if self._encoding is not None else "chars/4"
        self.image_tokens = image_tokens
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    # --- text ------------------------------------------------------------

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        if self._encoding is None:
            return math.ceil(len(text) / CHARS_PER_TOKEN)
        return len(self._encoding.encode_ordinary(text))

    def _count_json(self, value: Any) -> int:
        return self.count_text(orjson.dumps(value, default=repr).decode())

    # --- messages --------------------------------------------------------

    def count_message(self, message: Message) -> int:
        key = message_key(message)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return cached
        count = self._count_message_uncached(message)
        with self._lock:
            self.misses += 1
            self._cache[key] = count
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return count

    def count_messages(self, messages: Sequence[Message]) -> list[int]:
        return [self.count_message(m) for m in messages]

    def is_cached(self, message: Message) -> bool:
        with self._lock:
            return message_key(message) in self._cache

    def _count_message_uncached(self, message: Message) -> int:
        total = TOKENS_PER_MESSAGE
        total += self._count_content(message.get("content"))
        name = message.get("name")
        if isinstance(name, str):
            total += TOKENS_PER_NAME + self.count_text(name)
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                total += TOKENS_PER_TOOL_CALL + self._count_call(call)
        function_call = message.get("function_call")
        if isinstance(function_call, dict):
            total += TOKENS_PER_TOOL_CALL + self._count_call(function_call)
        for key, value in message.items():
            if key not in _COUNTED_ELSEWHERE and isinstance(value, str):
                total += self.count_text(value)
        return total

    def _count_call(self, call: Any) -> int:
        if not isinstance(call, dict):
            return self._count_json(call)
        function = call.get("function", call)
        if not isinstance(function, dict):
            return self._count_json(function)
        total = 0
        for key in ("name", "arguments"):
            value = function.get(key)
            if isinstance(value, str):
                total += self.count_text(value)
            elif value is not None:
                total += self._count_json(value)
        return total

    def _count_content(self, content: Any) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content)
        if not isinstance(content, list):
            return self._count_json(content)
        total = 0
        for part in content:
            if not isinstance(part, dict):
                total += self._count_json(part)
                continue
            kind = part.get("type")
            if kind in ("image_url", "image", "input_image"):
                total += self.image_tokens
            elif isinstance(part.get("text"), str):
                total += self.count_text(part["text"])
            else:
                total += self._count_json(part)
        return total

    # --- requests --------------------------------------------------------

    def request_overhead(self, request: Mapping[str, Any]) -> int:
        """Tokens a request costs besides its messages: schemas and reply priming."""
        total = REPLY_PRIMING
        for key in ("tools", "functions"):
            value = request.get(key)
            if value:
                total += self._count_json(value)
        response_format = request.get("response_format")
        if isinstance(response_format, dict) and response_format.get("type") != "text":
            total += self._count_json(response_format)
        return total

    def count_request(self, request: Mapping[str, Any]) -> int:
        """Everything the upstream will count for a chat-completions body."""
        messages = request.get("messages")
        body = sum(self.count_messages(messages)) if isinstance(messages, list) else 0
        return body + self.request_overhead(request)
