"""Work on what a client sends stays in proportion to what it sent.

Every parser and matcher on the request path is handed shapes built to make
it slow — a megabyte model name, globs that invite backtracking, thousands of
identical items, nesting just inside the body parser's limit, a hundred
thousand small parts — and the test counts the work instead of timing it:

* Python-level work as the number of function calls (the profiler's ``call``
  and ``c_call`` events) at a size n and at 2n: linear work about doubles,
  quadratic work quadruples.
* Hashing as the bytes fed to the hash.
* A regex's own work, which no counter sees, by its shape: a pattern read by
  the standard parser, with no repetition that can give back what it matched
  once a later one has to (the check is tried on patterns that do backtrack).
* A regex's own work counted after all, where its shape cannot tell: the
  engine looks for signals every 4,096 of its steps, and a signal kept
  pending runs a handler, one more call, at each look.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest

from compaction import Profile, TokenCounter
from compaction.stages import pruner
from compaction.stages.pruner import prune, tool_brief
from compaction.summary import extractive, prompts, steps
from compaction.summary.files import parse_file_lists, strip_file_lists
from compaction.summary.format import without_thinking
from compaction.text import clipping
from compaction.text.shell import shell_files
from config import ModelResolver, Settings, find_override, model_table, resolve_model
from config.settings import ModelOverride
from proxy.dialects import base
from proxy.dialects.anthropic import ANTHROPIC
from proxy.dialects.chat import CHAT
from proxy.dialects.responses import RESPONSES
from proxy.edge.body import parse_object
from proxy.flow.usage import UsageTap
from proxy.upstream.overflow import detect_overflow

#: How much more than twice the work at n the work at 2n may be and still be
#: linear: fixed costs make it a little less than double, never four times.
_SLACK = 2.5


def _calls(work: Callable[[], object]) -> int:
    """The function calls, Python and built-in, that ``work()`` makes."""
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return count


def _linear(cost: Callable[[int], int], n: int) -> tuple[int, int]:
    """The cost at ``n`` and ``2n``, asserted to grow no faster than the size."""
    small, large = cost(n), cost(2 * n)
    assert large <= _SLACK * small, (n, small, large)
    return small, large


# --- regexes by shape --------------------------------------------------------------

# The standard library's own reader of patterns, the one re.compile uses.
_parser: Any = importlib.import_module("re._parser")
sre: Any = importlib.import_module("re._constants")


def _width_varies(items: list[Any], state: Any) -> bool:
    low, high = _parser.SubPattern(state, items).getwidth()
    return bool(low != high)


def _scan(items: list[Any], state: Any, free: bool, risks: list[str]) -> bool:
    """Walk one sequence; ``free``: an earlier repetition in it may still give back.

    Returns whether one may after the sequence. A repetition that can give
    back characters (greedy or lazy, unbounded) makes every variable-width
    piece after it a retry per character given back: that is the risk.
    """
    for op, av in items:
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            low, high, body = av
            if high == sre.MAXREPEAT and _width_varies(list(body), state):
                risks.append(f"a repetition of a variable-width piece: {body}")
            _scan(list(body), state, False, risks)
            if low != high:
                if free:
                    risks.append("a variable repetition after one that can give back")
                free = free or high == sre.MAXREPEAT
        elif op is sre.POSSESSIVE_REPEAT:
            _scan(list(av[2]), state, False, risks)
            if free and av[0] != av[1]:
                risks.append("a variable piece after a repetition that can give back")
        elif op is sre.ATOMIC_GROUP:
            _scan(list(av), state, False, risks)
            if free and _width_varies(list(av), state):
                risks.append("an atomic group retried by a repetition before it")
        elif op is sre.SUBPATTERN:
            free = _scan(list(av[3]), state, free, risks)
        elif op is sre.BRANCH:
            free = any([_scan(list(branch), state, free, risks) for branch in av[1]])
        elif op in (sre.ASSERT, sre.ASSERT_NOT):
            _scan(list(av[1]), state, False, risks)
    return free


def backtracking_risks(pattern: str) -> list[str]:
    """Why ``pattern``, matched at one place, could take more than linear time."""
    tree = _parser.parse(pattern)
    risks: list[str] = []
    _scan(list(tree), tree.state, False, risks)
    return risks


@pytest.mark.parametrize(
    "pattern",
    [r".*a.*b\Z", r"(a+)+\Z", r"(?:x|xy)*z", r"(?>.*?a).*.*b", r".*(?>.*?a)"],
)
def test_the_shape_check_sees_patterns_that_backtrack(pattern: str) -> None:
    assert backtracking_risks(pattern)


@pytest.mark.parametrize(
    "pattern", [r"(?s:(?>.*?a)(?>.*?b).*c)\Z", r"gpt\-4o.*\Z", r"abc", r"a{1,9}b"]
)
def test_the_shape_check_passes_patterns_that_cannot(pattern: str) -> None:
    assert backtracking_risks(pattern) == []


def test_the_heading_of_a_previous_summary_is_read_without_backtracking() -> None:
    # A summary the user edited is read line by line; a line of blanks between
    # two words once took minutes.
    assert backtracking_risks(extractive._HEADING.pattern) == []


def test_the_blanks_before_a_summary_headings_name_are_read_one_way() -> None:
    # What follows the name ends in ".*$", which any line without a newline
    # matches on the first try; before it, a line of blanks and no name made
    # the engine try every split of the blanks.
    before_name = prompts._HEADING_LINE.pattern.split("(?P<name>")[0]
    assert backtracking_risks(before_name) == []


# --- model names -------------------------------------------------------------------


def test_the_model_table_is_one_regex_that_cannot_backtrack() -> None:
    assert backtracking_risks(model_table._matcher().pattern) == []


@contextmanager
def _compiled() -> Iterator[list[str]]:
    """Every pattern compiled while the block runs."""
    seen: list[str] = []
    real = re.compile

    def recording(pattern: Any, flags: int = 0) -> re.Pattern[Any]:
        seen.append(pattern)
        return real(pattern, flags)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(re, "compile", recording)
        yield seen


#: Globs written to defeat a backtracking matcher; the test's own marker keeps
#: them apart from any cached elsewhere, so each is compiled here.
_HOSTILE_GLOBS = (
    "*a" * 40 + "*b",
    "*?" * 30 + "x",
    "[a-z]*" * 12 + "!",
    "*/" * 20 + "qwen*",
    "a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*",
)


def test_override_globs_become_regexes_that_cannot_backtrack() -> None:
    models = {f"{glob}#shape": ModelOverride() for glob in _HOSTILE_GLOBS}
    with _compiled() as seen:
        assert find_override(models, "a" * 5_000) is None
    assert len(seen) == len(_HOSTILE_GLOBS)
    for pattern in seen:
        assert backtracking_risks(pattern) == [], pattern


def test_a_hostile_name_against_hostile_globs_costs_calls_by_glob_not_by_length() -> None:
    models = {glob: ModelOverride() for glob in _HOSTILE_GLOBS}
    settings = Settings(models=models)

    def cost(n: int) -> int:
        name = "a" * n + "c"  # every glob's first stars match; the end never does
        return _calls(lambda: resolve_model(settings, name))

    cost(1)  # each glob is read once, on first use
    assert cost(500_000) == cost(1_000_000)


def test_a_megabyte_model_name_is_looked_up_in_as_many_calls_as_a_short_one() -> None:
    def cost(n: int) -> int:
        name = "claude-" * (n // 7)
        return _calls(lambda: model_table.builtin_context_window(name))

    cost(7)  # the table is compiled once, on first use
    assert cost(1 << 20) == cost(1 << 21) <= cost(700)


def test_a_resolver_keeps_no_name_longer_than_a_model_could_have() -> None:
    resolver = ModelResolver(Settings())
    for i in range(50):
        resolver.resolve(f"{i}-" + "a" * model_table.MAX_NAME_CHARS)
    resolver.resolve("gpt-4o")
    assert [key[0] for key in resolver._cache] == ["gpt-4o"]


# --- identical items ---------------------------------------------------------------


@contextmanager
def _hashed_bytes() -> Iterator[list[int]]:
    """The bytes item ids hash, counted while the block runs."""
    total = [0]
    real = hashlib.blake2b

    class Counting:
        def __init__(self, data: bytes = b"", **options: Any) -> None:
            total[0] += len(data)
            self._hash = real(data, **options)

        def update(self, data: bytes) -> None:
            total[0] += len(data)
            self._hash.update(data)

        def hexdigest(self) -> str:
            return self._hash.hexdigest()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hashlib, "blake2b", Counting)
        yield total


def _responses_twins(n: int) -> bytes:
    item = {"type": "message", "role": "user", "content": "the same words"}
    return orjson.dumps({"model": "gpt-4o", "input": [item] * n})


def _anthropic_twins(n: int) -> bytes:
    turns = [{"role": "user", "content": "again"}, {"role": "assistant", "content": "ok"}]
    return orjson.dumps({"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": turns * n})


@pytest.mark.parametrize(
    ("dialect", "body"), [(RESPONSES, _responses_twins), (ANTHROPIC, _anthropic_twins)]
)
def test_identical_items_cost_one_hash_each(dialect: Any, body: Callable[[int], bytes]) -> None:
    def cost(n: int) -> int:
        raw = body(n)
        with _hashed_bytes() as total:
            dialect.read(raw)
        return total[0]

    _linear(cost, 1_500)


def test_the_nth_twin_keeps_its_id_wherever_the_twins_sit() -> None:
    twin = {"type": "message", "role": "user", "content": "same"}

    def ids(items: list[dict[str, Any]]) -> list[str]:
        mapped = RESPONSES.to_engine({"model": "m", "input": items})
        origins = [base.origin_of(m) for m in mapped.messages]
        return [o[0] for o, item in zip(origins, items, strict=True) if o and item == twin]

    other = {"type": "message", "role": "user", "content": "other"}
    # Copies, as a parsed body has them: one object added twice is one item.
    first = ids([dict(twin), dict(other), dict(twin), dict(twin)])
    later = ids([dict(other), dict(twin), dict(twin), dict(other), dict(twin), dict(twin)])
    assert later[:3] == first
    assert len(set(later)) == 4


def test_twin_ids_are_the_ones_earlier_versions_stored() -> None:
    # A checkpoint stored before twins were counted names them by ``'``
    # appended once per twin before; it must still find its items.
    twin = {"type": "message", "role": "user", "content": "same"}
    mapped = RESPONSES.to_engine({"model": "m", "input": [dict(twin) for _ in range(5)]})
    origins = [base.origin_of(m) for m in mapped.messages]
    assert [o[0] for o in origins if o] == [base.item_id(twin, "'" * k) for k in range(5)]


# --- bodies and dialects -----------------------------------------------------------


def _chat_parts(n: int) -> bytes:
    parts = [{"type": "text", "text": "x"}] * n
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": parts}]})


def _anthropic_blocks(n: int) -> bytes:
    blocks = [{"type": "text", "text": "x"}] * n
    message = {"role": "user", "content": blocks}
    return orjson.dumps({"model": "m", "max_tokens": 1, "messages": [message]})


def _responses_items(n: int) -> bytes:
    items = [
        {"type": "message", "role": "user" if i % 2 else "assistant", "content": f"m{i}"}
        for i in range(n)
    ]
    return orjson.dumps({"model": "m", "input": items})


@pytest.mark.parametrize(
    ("read", "body"),
    [
        (functools.partial(parse_object, chat=True), _chat_parts),
        (CHAT.read, _chat_parts),
        (ANTHROPIC.read, _anthropic_blocks),
        (RESPONSES.read, _responses_items),
    ],
    ids=["chat body", "chat dialect", "anthropic dialect", "responses dialect"],
)
def test_many_small_parts_are_read_in_work_linear_in_their_number(
    read: Callable[[bytes], object], body: Callable[[int], bytes]
) -> None:
    _linear(lambda n: _calls(lambda: read(body(n))), 50_000)


def test_nesting_just_inside_the_parsers_limit_is_read_in_work_linear_in_its_depth() -> None:
    # orjson writes 254 levels, and the body's own object is one of them.
    def nested(depth: int) -> bytes:
        return b'{"model":"m","meta":' + b"[" * depth + b"]" * depth + b"}"

    assert parse_object(nested(253))["model"] == "m"
    _linear(lambda depth: _calls(lambda: parse_object(nested(depth))), 126)


# --- what the upstream answers ---------------------------------------------------------


def test_the_usage_tap_works_per_byte_fed_however_the_answer_is_cut() -> None:
    def cost(n: int) -> int:
        answer = b'{"usage":{"prompt_tokens":12}}' + b' "_tokens" :' * n
        tap = UsageTap(lambda count: None)

        def feed() -> None:
            for i in range(0, len(answer), 7):
                tap.feed(answer[i : i + 7])

        return _calls(feed)

    _linear(cost, 20_000)


def test_an_overflow_error_is_read_in_as_many_calls_however_long_it_is() -> None:
    def cost(n: int) -> int:
        message = "maximum context length is " * n
        body = orjson.dumps({"error": {"message": message, "code": "x"}})
        return _calls(lambda: detect_overflow(400, body))

    assert cost(20_000) == cost(40_000)


# --- the engine ------------------------------------------------------------------------


def test_a_hundred_thousand_parts_are_counted_in_work_linear_in_their_number() -> None:
    def cost(n: int) -> int:
        counter = TokenCounter(encoding="cl100k_base")
        message = {"role": "user", "content": [{"type": "text", "text": "hi"}] * n}
        return _calls(lambda: counter.count_message(message))

    _linear(cost, 100_000)


def test_tool_briefs_of_long_outputs_are_made_in_work_linear_in_their_lines() -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "make"}'},
    }

    def cost(n: int) -> int:
        result = {"role": "tool", "tool_call_id": "c1", "content": "Error: x\nok line\n" * n}
        return _calls(lambda: tool_brief(call, result))

    _linear(cost, 5_000)


def test_pruning_many_tool_groups_is_work_linear_in_their_number() -> None:
    def conversation(n: int) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for i in range(n):
            call = {
                "id": f"c{i}",
                "type": "function",
                "function": {"name": "read", "arguments": f'{{"path": "f{i}.py"}}'},
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "x" * 50})
        return messages

    def cost(n: int) -> int:
        messages = conversation(n)
        return _calls(lambda: prune(messages, 0, len(messages), Profile(context_window=8192)))

    _linear(cost, 1_000)


@pytest.mark.parametrize(
    "command",
    [
        lambda n: "cat " + " ".join(f"f{i}.py" for i in range(n)),
        lambda n: "a; " * n,
        lambda n: "sed -i s/x/y/ " + "'" * n,
        lambda n: "cat <<EOF\n" + "line\n" * n + "EOF",
    ],
    ids=["many paths", "many commands", "unbalanced quotes", "a long heredoc"],
)
def test_shell_commands_are_read_in_work_linear_in_their_length(
    command: Callable[[int], str],
) -> None:
    _linear(lambda n: _calls(lambda: shell_files(command(n))), 2_000)


def test_file_lists_are_read_in_work_linear_in_their_length() -> None:
    def cost(n: int) -> int:
        text = "<read-files>\n" + "a.py\n" * n + "</read-files>"
        return _calls(lambda: (parse_file_lists(text), strip_file_lists(text)))

    _linear(cost, 20_000)


# --- the engine's regexes, by their own steps ------------------------------------------


@contextmanager
def _regex_steps_as_calls(ticks: list[int]) -> Iterator[None]:
    """While the block runs, every 4,096 steps of the regex engine make one call.

    The engine checks for signals that often; a handler that leaves its
    signal pending again runs at each check. It cannot raise it itself: the
    interpreter checks again right after any call the handler makes and would
    run it within itself without end. So the handler raises a second signal,
    whose handler is C (libc's ``raise``, which ignores the arguments handlers
    get beyond the first) and raises the first once the handler has returned.
    The interpreter's own checks, between bytecodes, run it as well: Python
    work is counted a little more, in proportion, as it should be.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGUSR1"):
        pytest.skip("signals are handled on the main thread of a POSIX process")
    raise_ = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.py_object)(
        ("raise", ctypes.CDLL(None))
    )
    pending = [True]

    def tick(signum: int, frame: Any) -> None:
        ticks[0] += 1
        if pending[0]:
            raise_(signal.SIGUSR2, 0, None)

    rearm = functools.partial(raise_, signal.SIGUSR1)
    before = signal.signal(signal.SIGUSR1, tick), signal.signal(signal.SIGUSR2, rearm)
    try:
        signal.raise_signal(signal.SIGUSR1)
        yield
    finally:
        pending[0] = False
        # The second signal is ignored first: one still pending would otherwise
        # raise the first after its default action (ending the process) is back.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        signal.signal(signal.SIGUSR1, before[0])
        signal.signal(signal.SIGUSR2, before[1])


def _work(work: Callable[[], object]) -> int:
    """The calls ``work()`` makes, its regexes' steps included (by 4,096)."""
    # Counted apart from the profiler's calls: the profiler's own hook would
    # run the handler again at each of its checks, and so on without end.
    ticks = [0]
    with _regex_steps_as_calls(ticks):
        work()
    return _calls(work) + ticks[0]


def test_the_regex_engines_steps_are_counted() -> None:
    unclosed = re.compile(r"<output>(.*?)</output>", re.DOTALL)

    def cost(n: int) -> int:
        text = "<output>" * n
        return _work(lambda: unclosed.search(text))

    small, large = cost(2_000), cost(4_000)
    assert large > 3.5 * small > 3.5 * 1_000  # retried at every opener: quadratic


#: Text a client controls, shaped to make a regex retry at every character.
_REGEX_HOSTILE: dict[str, Callable[[int], object]] = {
    "an unclosed output tag, unwrapped for a brief": lambda n: pruner._command_output(
        "<output>" * n
    ),
    "an unclosed output tag, read for a step": lambda n: steps._outcome("<output>" * n, runs=True),
    "unclosed file blocks": lambda n: (
        parse_file_lists("<read-files>" * n),
        strip_file_lists("<read-files>" * n),
    ),
    "unclosed thinking": lambda n: without_thinking("<think>" * n + "<Reasoning>" * n),
    "a line of slashes": lambda n: clipping.clip_keeping("ok\n" + "a/" * n + "\nend", 1_000),
    "a line of colons": lambda n: clipping.error_lines("a:" * n),
    "a repeated brief arrow": lambda n: steps._pruned_brief(
        "bash", "[bash] " + " → 1 lines output (" * n
    ),
    "a repeated brief size": lambda n: steps._pruned_brief(
        "bash", "[bash] " + " (1 chars, " * n + ")"
    ),
}


@pytest.mark.parametrize("work", list(_REGEX_HOSTILE.values()), ids=list(_REGEX_HOSTILE))
def test_what_clients_write_is_read_in_regex_steps_linear_in_its_length(
    work: Callable[[int], object],
) -> None:
    _linear(lambda n: _work(lambda: work(n)), 4_000)
