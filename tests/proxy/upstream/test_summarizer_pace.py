"""The summarizer's deadline follows the upstream's measured speed, a call it
abandons is cancelled upstream, and on a one-slot server the calls take turns.

:class:`~proxy.upstream.pace.Pace` is pure arithmetic over samples (tested
with made-up ones); the summarizer is tested against loopback servers, its
samples timed by a fake clock."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from compaction import SummarizationError
from proxy.upstream.pace import MARGIN, MAX_DEADLINE, Pace, Paces
from proxy.upstream.summarizer import UpstreamSummarizer
from proxy.upstream.transport import Transport
from tests.proxy.raw_servers import read_request, serve_script

REPLY = {"choices": [{"message": {"role": "assistant", "content": "## Goal\nx"}}]}
MESSAGES = [{"role": "user", "content": "x" * 2000}]

# --- the pace ---------------------------------------------------------------------


def test_before_any_measure_the_deadline_is_the_configured_one() -> None:
    assert Pace().deadline(50_000, 120.0) == 120.0


def test_the_deadline_is_the_prompt_at_the_slowest_measured_speed_with_a_margin() -> None:
    pace = Pace()
    pace.answered(10_000, 20.0)  # 500 bytes a second
    pace.answered(10_000, 100.0)  # 100 bytes a second: the slowest
    # A 5,500-token prompt on a 1.5B at ~30 tokens/s: past any fixed 120 s.
    assert pace.deadline(22_000, 120.0) == pytest.approx(22_000 / 100 * MARGIN)
    assert pace.deadline(1_000, 120.0) == 120.0  # never under the configured one
    assert pace.deadline(10**9, 120.0) == MAX_DEADLINE


def test_a_call_that_ran_out_of_time_doubles_the_next_deadline_for_its_size() -> None:
    pace = Pace()
    pace.timed_out(20_000, 120.0)
    assert pace.deadline(20_000, 120.0) == pytest.approx(2 * 120.0 * MARGIN)
    assert pace.duration() is None  # a timeout is no summary's duration


def test_the_duration_is_a_high_percentile_of_the_answered_calls() -> None:
    pace = Pace()
    for seconds in [1.0] * 8 + [4.0, 9.0]:
        pace.answered(1_000, seconds)
    assert pace.duration(0.9) == 4.0
    assert pace.duration(1.0) == 9.0


def test_paces_are_kept_for_at_most_so_many_upstreams_the_oldest_forgotten() -> None:
    paces = Paces(max_keys=2)
    first = paces.of("a")
    paces.of("b")
    paces.of("c")
    assert paces.of("a") is not first


# --- the summarizer against loopback servers ---------------------------------------


async def _served(
    answer: Callable[[web.Request], Awaitable[web.StreamResponse]],
    run: Callable[[UpstreamSummarizer | Callable[..., UpstreamSummarizer]], Awaitable[Any]],
) -> Any:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    transport = Transport(connect_timeout=5, read_timeout=30, max_connections=4, keepalive_expiry=4)

    def make(**options: Any) -> UpstreamSummarizer:
        return UpstreamSummarizer(transport, f"http://127.0.0.1:{port}/v1", "m", **options)

    try:
        return await run(make)
    finally:
        await transport.aclose()
        await runner.cleanup()


def test_each_answered_call_is_a_sample_of_its_size_and_the_seconds_it_took() -> None:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(REPLY)

    pace = Pace()
    ticks = itertools.count(0, 40)  # the fake clock: 40 s between two readings

    async def run(make: Any) -> str:
        summarizer = make(pace=pace, clock=lambda: float(next(ticks)))
        text: str = await summarizer(MESSAGES, 600)
        return text

    assert asyncio.run(_served(answer, run)) == "## Goal\nx"
    (sample,) = pace.samples
    assert sample.seconds == 40.0 and sample.sent > 2000
    assert list(pace.durations) == [40.0]


def test_a_slow_server_measured_slow_gets_the_time_its_prompt_needs() -> None:
    # The server takes longer than the configured deadline; measured slow
    # before, the call is given the time and answered (a fixed deadline ends it).
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(0.6)
        return web.json_response(REPLY)

    pace = Pace()
    pace.answered(1_000, 2.0)  # 500 bytes a second: the prompt needs seconds

    async def run(make: Any) -> tuple[str, str]:
        measured: str = await make(deadline=0.2, pace=pace)(MESSAGES, 600)
        try:
            await make(deadline=0.2)(MESSAGES, 600)
        except SummarizationError as exc:
            return measured, str(exc)
        return measured, "answered"

    measured, fixed = asyncio.run(_served(answer, run))
    assert measured == "## Goal\nx"
    assert "timed out" in fixed


def test_a_call_abandoned_at_its_deadline_is_cancelled_upstream() -> None:
    # The server never answers; the summarizer gives up: the connection is
    # closed, so the server stops generating what nobody will read.
    seen: list[bool] = []

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        seen.append(await reader.read() == b"")  # EOF: the client closed it
        writer.close()

    async def run(url: str) -> str:
        transport = Transport(
            connect_timeout=5, read_timeout=30, max_connections=1, keepalive_expiry=4
        )
        try:
            summarizer = UpstreamSummarizer(transport, url + "/v1", "m", deadline=0.3, pace=Pace())
            try:
                await summarizer(MESSAGES, 600)
            except SummarizationError as exc:
                return str(exc)
            return "answered"
        finally:
            await transport.aclose()

    with serve_script(hang) as url:
        outcome = asyncio.run(run(url))
        for _ in range(200):  # the server's read returns once the socket closes
            if seen:
                break
            asyncio.run(asyncio.sleep(0.01))
    assert "timed out" in outcome
    assert seen == [True]


@pytest.mark.parametrize("one_at_a_time", [True, False])
def test_on_a_one_slot_server_two_summaries_take_turns(one_at_a_time: bool) -> None:
    # The main summary and the turn-prefix summary of one compaction are asked
    # together; a one-slot server would queue one behind the other, each
    # counting the other's time against its deadline.
    at_once = [0, 0]  # now, most

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        at_once[0] += 1
        at_once[1] = max(at_once)
        await asyncio.sleep(0.1)
        at_once[0] -= 1
        return web.json_response(REPLY)

    pace = Pace()

    async def run(make: Any) -> list[str]:
        summarizers = [make(pace=pace, one_at_a_time=one_at_a_time) for _ in range(2)]
        return list(await asyncio.gather(*(s(MESSAGES, 600) for s in summarizers)))

    assert asyncio.run(_served(answer, run)) == ["## Goal\nx"] * 2
    assert at_once[1] == (1 if one_at_a_time else 2)
