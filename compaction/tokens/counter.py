"""Token estimation: tiktoken per model family, per-message cache, request totals.

Clients resend the whole history on every request, so counts are memoized per
message, keyed by a hash of the message's canonical JSON, in a bounded LRU: a
warm request only tokenizes what is new. Counting is thread-safe so large
requests can be counted off the event loop.

What is counted (docs/compaction.md, "Token counting"): every message with OpenAI's per-message
overhead (3 tokens, +1 for a ``name``), text parts, images at a fixed cost,
tool calls, the ``tools`` / ``functions`` schemas, ``response_format``, and 3
tokens priming the reply.

**Digits.** cl100k and o200k make one token of up to three digits; the
tokenizers of many open models (Qwen, Llama 1–2, Mistral, DeepSeek, Gemma,
Phi-3, Yi, StarCoder: :func:`splits_digits`) make one token of each digit, so a
tool output full of numbers counts up to three times our estimate there. For
those models every run of digits is counted a token a digit
(:func:`digit_surplus` is added to the encoding's count): a little too much
where their tokenizer groups some digits after all, never too little. The rule
is the counter's own (a counter per rule, so its cache keyed by message stays
right), and OpenAI models, whose tokenizers these encodings are, are counted
as the encoding counts. Scripts other than Latin need no such rule: for the
CJK-trained vocabularies (Qwen, DeepSeek, Yi) cl100k counts Chinese and
Japanese text at more tokens than they do, and the calibration ratio takes up
what remains.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from compaction.budget.profile import DEFAULT_IMAGE_TOKENS
from compaction.chat.messages import call_name_and_arguments, message_text, tool_calls
from compaction.tokens.encodings import load_encoding
from compaction.types import Message

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_PER_TOOL_CALL = 3
REPLY_PRIMING = 3
DEFAULT_CACHE_SIZE = 65_536
#: Chain links remembered per cached message (see :meth:`TokenCounter.remember_links`).
LINKS_PER_MESSAGE = 4
CHARS_PER_TOKEN = 4
#: New text above this many characters is tokenized in a worker thread by
#: :func:`count_messages_off_loop`: tens of milliseconds of CPU that would
#: stall an event loop. (Below it the thread hop costs more than it saves.)
OFF_LOOP_CHARS = 64_000

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
#: A key a caller may put on a message for its own bookkeeping (the proxy
#: records which request item an engine message stands for): it is never sent
#: upstream, so it is not counted.
ORIGIN_KEY = "_compaction_origin"
_COUNTED_ELSEWHERE = frozenset(
    {"role", "content", "name", "tool_calls", "function_call", ORIGIN_KEY}
)


#: Model families whose tokenizer makes one token of each digit (module doc),
#: by a word of the model's name. Llama 3 and later group digits by three, as
#: cl100k does; Llama without a version, TinyLlama and Code Llama do not.
_DIGITS_APART = re.compile(
    r"qwen|qwq|codellama|tinyllama|llama-?2|mistral|mixtral|codestral|ministral|"
    r"devstral|magistral|pixtral|deepseek|gemma|phi-?3|(?:^|[^a-z0-9])yi[-_:.]|starcoder"
)
_LLAMA = re.compile(r"llama(?:[-_ ]?v?(\d+))?")
#: Two digits or more: one digit is one token in every encoding.
_DIGIT_RUN = re.compile(r"[0-9][0-9]+")
#: What cl100k and o200k make one token of: up to three digits.
_DIGITS_PER_TOKEN = 3


def splits_digits(model: str | None) -> bool:
    """Whether ``model``'s tokenizer makes a token of each digit (module doc)."""
    if not model:
        return False
    name = model.lower().rsplit("/", 1)[-1]
    if _DIGITS_APART.search(name):
        return True
    llama = _LLAMA.search(name)
    return llama is not None and (llama.group(1) is None or int(llama.group(1)) < 3)


def digit_surplus(text: str) -> int:
    """How many more tokens the runs of digits in ``text`` are a token a digit
    than three digits a token (the encodings' way)."""
    if not any(digit in text for digit in "0123456789"):
        return 0
    surplus = 0
    for run in _DIGIT_RUN.findall(text):
        surplus += len(run) - -(-len(run) // _DIGITS_PER_TOKEN)
    return surplus


def encoding_for_model(model: str | None) -> str:
    """``o200k_base`` for the gpt-4o / 4.1 / 5 / o-series families, ``cl100k_base`` otherwise."""
    if not model:
        return "cl100k_base"
    name = model.lower().rsplit("/", 1)[-1]
    if name.startswith(_O200K_PREFIXES):
        return "o200k_base"
    return "cl100k_base"


def message_key(message: Message) -> bytes:
    """A stable digest of a message's canonical JSON form (16 bytes).

    Taken of every message of every request, so the hash is SHA-256: CPUs
    compute it in hardware (x86 SHA extensions, ARMv8), while CPython's
    BLAKE2 is portable C at about half the speed.
    """
    data = orjson.dumps(message, option=orjson.OPT_SORT_KEYS, default=repr)
    return hashlib.sha256(data).digest()[:16]


def message_keys(messages: Sequence[Message]) -> list[bytes]:
    """:func:`message_key` of every message."""
    return list(map(message_key, messages))


class KeyMemo:
    """:func:`message_key` of messages already keyed, by object identity, for the
    length of one compaction.

    A compaction counts the same messages many times over (the whole request,
    then each stage's output, whose unchanged messages are the input's own
    objects), and keying is a serialization and a hash of each message. The
    memo holds a reference to every message it keyed, so no ``id`` is reused
    while it lives; messages must not be mutated meanwhile (stages never do).
    """

    __slots__ = ("_known",)

    def __init__(
        self, messages: Sequence[Message] = (), keys: Sequence[bytes] | None = None
    ) -> None:
        """Start with ``keys`` as the known keys of ``messages``, if given."""
        self._known: dict[int, tuple[Message, bytes]] = {}
        if keys is not None:
            if len(keys) != len(messages):
                raise ValueError(f"{len(keys)} keys for {len(messages)} messages")
            for message, key in zip(messages, keys, strict=True):
                self._known[id(message)] = (message, key)

    def keys(self, messages: Sequence[Message]) -> list[bytes]:
        """:func:`message_keys` of ``messages``, each computed once."""
        known = self._known
        out: list[bytes] = []
        for message in messages:
            entry = known.get(id(message))
            if entry is None:
                entry = known[id(message)] = (message, message_key(message))
            out.append(entry[1])
        return out


class _Entry:
    """What the cache knows about one message."""

    __slots__ = ("count", "links")

    def __init__(self, count: int) -> None:
        self.count = count
        #: This message's recent links in checkpoint hash chains: the hash
        #: before it → its own (see :meth:`TokenCounter.follow`).
        self.links: dict[bytes, bytes] | None = None


class TokenCounter:
    """Counts tokens the way the upstream will, with a bounded per-message cache.

    The cache also remembers each message's links in checkpoint hash chains
    (:func:`compaction.conversation.checkpoints.chain_hashes`): a link costs a
    normalization and a hash of the whole message, as much as its key, and a
    warm request needs both for every message it resends.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        encoding: str | None = None,
        image_tokens: int = DEFAULT_IMAGE_TOKENS,
        cache_size: int = DEFAULT_CACHE_SIZE,
        digits_apart: bool | None = None,
    ) -> None:
        """``digits_apart``: count every digit a token (module doc); by default
        when ``model``'s tokenizer does (:func:`splits_digits`)."""
        name = encoding or encoding_for_model(model)
        self._encoding = load_encoding(name)
        self.encoding_name = name if self._encoding is not None else "chars/4"
        self.digits_apart = splits_digits(model) if digits_apart is None else digits_apart
        self.image_tokens = image_tokens
        self._cache: OrderedDict[bytes, _Entry] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    # --- text ------------------------------------------------------------

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        if self._encoding is None:
            count = math.ceil(len(text) / CHARS_PER_TOKEN)
        else:
            count = len(self._encoding.encode_ordinary(text))
        return count + digit_surplus(text) if self.digits_apart else count

    def _count_json(self, value: Any) -> int:
        return self.count_text(orjson.dumps(value, default=repr).decode())

    # --- messages --------------------------------------------------------

    def count_message(self, message: Message) -> int:
        return self.count_messages([message])[0]

    def count_messages(
        self, messages: Sequence[Message], keys: Sequence[bytes] | None = None
    ) -> list[int]:
        """The count of every message; ``keys`` are their :func:`message_key` if known."""
        if keys is None:
            keys = message_keys(messages)
        counts, missing = self.cached_counts(keys)
        for i in missing:
            counts[i] = self._count_missing(messages[i], keys[i])
        return counts

    def cached_counts(self, keys: Sequence[bytes]) -> tuple[list[int], list[int]]:
        """The cached count of each key (0 where there is none) and the positions
        of the keys the cache does not hold, in one pass under the lock."""
        counts: list[int] = []
        missing: list[int] = []
        with self._lock:
            cache = self._cache
            for i, key in enumerate(keys):
                entry = cache.get(key)
                if entry is None:
                    missing.append(i)
                    counts.append(0)
                else:
                    cache.move_to_end(key)
                    counts.append(entry.count)
            self.hits += len(keys) - len(missing)
        return counts, missing

    def _count_missing(self, message: Message, key: bytes) -> int:
        cached = self._cached(key)  # a repeat of an earlier message, or another thread's
        count = self._count_message_uncached(message) if cached is None else cached
        with self._lock:
            if cached is None:
                self.misses += 1
            else:
                self.hits += 1
        self._remember(key, count)
        return count

    def _cached(self, key: bytes) -> int | None:
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                return None
            self._cache.move_to_end(key)
            return entry.count

    def _remember(self, key: bytes, count: int) -> None:
        with self._lock:
            if key not in self._cache:
                self._cache[key] = _Entry(count)
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)

    # --- chain links -----------------------------------------------------

    def follow(self, keys: Sequence[bytes], start: int, previous: bytes) -> list[bytes]:
        """The chain links remembered for ``keys[start:]`` in turn, the first one
        after the hash ``previous``, up to the first that is not remembered."""
        links: list[bytes] = []
        with self._lock:
            cache = self._cache
            for i in range(start, len(keys)):
                entry = cache.get(keys[i])
                link = entry.links.get(previous) if entry is not None and entry.links else None
                if link is None:
                    break
                links.append(link)
                previous = link
        return links

    def remember_links(self, links: Iterable[tuple[bytes, bytes, bytes]]) -> None:
        """Remember ``(message key, previous hash, link)`` triples for messages in the
        cache (the others are not kept).

        A message keeps its last :data:`LINKS_PER_MESSAGE` links: the same
        short message ("ok", "continue") may follow many others.
        """
        with self._lock:
            for key, previous, link in links:
                entry = self._cache.get(key)
                if entry is None:
                    continue
                if entry.links is None:
                    entry.links = {}
                elif previous not in entry.links and len(entry.links) >= LINKS_PER_MESSAGE:
                    del entry.links[next(iter(entry.links))]
                entry.links[previous] = link

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
                total += self._count_schema(value)
        response_format = request.get("response_format")
        if isinstance(response_format, dict) and response_format.get("type") != "text":
            total += self._count_schema(response_format)
        return total

    def _count_schema(self, value: Any) -> int:
        """:meth:`_count_json`, cached: agents resend the same tool schemas every turn."""
        data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=repr)
        # The prefix keeps a schema from sharing a key with a message.
        key = hashlib.sha256(b"schema:" + data).digest()[:16]
        count = self._cached(key)
        if count is None:
            count = self._count_json(value)
            self._remember(key, count)
        return count

    def count_request(self, request: Mapping[str, Any]) -> int:
        """Everything the upstream will count for a chat-completions body."""
        messages = request.get("messages")
        body = sum(self.count_messages(messages)) if isinstance(messages, list) else 0
        return body + self.request_overhead(request)


def fit_tokens(text: str, max_tokens: int, counter: TokenCounter) -> str:
    """``text`` cut from the end until it holds at most ``max_tokens`` tokens."""
    if max_tokens <= 0:
        return ""
    while (count := counter.count_text(text)) > max_tokens:
        # Strictly shorter each round, marker included, so the loop ends.
        keep = min(int(len(text) * max_tokens / count * 0.95), len(text) - 3)
        if keep <= 0:
            return ""
        text = text[:keep].rstrip() + " …"
    return text


def text_size(messages: Sequence[Message]) -> int:
    """Roughly how many characters the tokenizer will see: text and tool-call arguments."""
    size = 0
    for message in messages:
        size += len(message_text(message))
        for call in tool_calls(message):
            size += len(call_name_and_arguments(call)[1])
    return size


async def count_messages_off_loop(
    counter: TokenCounter, messages: Sequence[Message], keys: Sequence[bytes] | None = None
) -> list[int]:
    """:meth:`TokenCounter.count_messages`, tokenizing in a worker thread when the
    messages the cache has not seen hold more than :data:`OFF_LOOP_CHARS` of text.

    A resent history is a cache lookup and stays on the loop; only new text
    can be expensive.
    """
    keys = message_keys(messages) if keys is None else keys
    counts, missing = counter.cached_counts(keys)
    if missing:
        fresh = [messages[i] for i in missing]
        fresh_keys = [keys[i] for i in missing]
        if text_size(fresh) > OFF_LOOP_CHARS:
            found = await asyncio.to_thread(counter.count_messages, fresh, fresh_keys)
        else:
            found = counter.count_messages(fresh, fresh_keys)
        for i, count in zip(missing, found, strict=True):
            counts[i] = count
    return counts
