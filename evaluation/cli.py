"""``compaction-proxy eval DIR``: the command-line side of the evaluation.

    compaction-proxy eval DIR [--window N …] [--strategy S …]
                              [--summarizer extractive|llm|off] [--json] [--output PATH]
                              [--upstream URL --summary-model NAME] [--judge URL]

Defaults: windows 8192, 16384 and 32768; all three strategies; the extractive
summarizer (no network). What recall gets back (:mod:`evaluation.recall`) is
measured at the ``--window`` values given, or at 8192 and 16384.
``--summarizer llm`` asks ``--upstream`` (default: the configuration's
``upstream.base_url``) for summaries with
``--summary-model`` (default: the configuration's ``compaction.summary_model``),
with the key in the configuration's key variable (``OPENAI_API_KEY`` unless
set otherwise), as ``compaction-proxy compact`` does. ``--judge URL`` grades
each probe with ``--judge-model`` at that OpenAI-compatible base URL, key
from the variable ``--judge-key-env`` names (default ``OPENAI_API_KEY``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, get_args

import orjson

from compaction import Profile, Strategy, Summarizer
from config import Settings, load_settings, resolve_model
from evaluation.corpus import read_bodies
from evaluation.judge import Judge
from evaluation.recall import (
    RECALL_WINDOWS,
    evaluate_recall,
    proxy_counter,
    recall_json,
    recall_table,
    tool_tokens,
)
from evaluation.repeats import natural_repeats
from evaluation.report import report_json, report_table
from evaluation.run import evaluate

DEFAULT_WINDOWS = (8_192, 16_384, 32_768)
DEFAULT_JUDGE_MODEL = "gpt-4o-mini"


class EvalUsageError(Exception):
    """Bad options: the command exits 2 with this message."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compaction-proxy eval",
        description="Compact every request body in DIR at each window and strategy, "
        "and score what the compacted requests still tell a model.",
    )
    parser.add_argument("dir", type=Path, help="folder of request bodies (*.json, any API)")
    parser.add_argument("--config", help="TOML configuration file")
    parser.add_argument(
        "--window", type=int, action="append", metavar="N", help="context window (repeatable)"
    )
    parser.add_argument(
        "--strategy", action="append", choices=get_args(Strategy), help="(repeatable)"
    )
    parser.add_argument("--summarizer", choices=("extractive", "llm", "off"), default="extractive")
    parser.add_argument("--upstream", metavar="URL", help="OpenAI-compatible base URL for llm")
    parser.add_argument("--summary-model", metavar="NAME", help="model that writes summaries")
    parser.add_argument("--judge", metavar="URL", help="OpenAI-compatible base URL of a judge")
    parser.add_argument("--judge-model", metavar="NAME", default=DEFAULT_JUDGE_MODEL)
    parser.add_argument("--judge-key-env", metavar="VAR", default="OPENAI_API_KEY")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--output", metavar="PATH", help="also write the report here")
    return parser


async def run_eval(argv: Sequence[str]) -> str:
    """The report the command prints, for the command's options ``argv``."""
    args = build_parser().parse_args(argv)
    if not args.dir.is_dir():
        raise EvalUsageError(f"not a folder: {args.dir}")
    windows = tuple(args.window or DEFAULT_WINDOWS)
    if any(window <= 0 for window in windows):
        raise EvalUsageError("--window must be positive")
    strategies: tuple[Strategy, ...] = tuple(args.strategy or get_args(Strategy))
    settings = load_settings(args.config)
    transport = None
    summarizer: Summarizer | None = None
    judge: Judge | None = None
    try:
        if args.summarizer == "llm" or args.judge:
            from proxy.upstream.service import build_transport

            transport = build_transport(settings)
        if args.summarizer == "llm":
            summarizer = _llm(args, settings, transport)
        if args.judge:
            judge = Judge(_chat(transport, args.judge, args.judge_model, args.judge_key_env))
        bodies = list(read_bodies(args.dir))
        profiles = _profiles(settings, args.summarizer)
        cells = await evaluate(bodies, windows, strategies, profiles, summarizer, judge)
        repeats = natural_repeats(bodies, profiles)
        recall_windows = tuple(args.window or RECALL_WINDOWS)
        recalled = await evaluate_recall(bodies, recall_windows, profiles)
    finally:
        if transport is not None:
            await transport.aclose()
    judged = judge is not None
    tool = tool_tokens(proxy_counter(None, profiles(None)))
    if args.json:
        report = {**report_json(cells, judged, repeats), "recall": recall_json(recalled, tool)}
        text = orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
    else:
        text = report_table(cells, judged, repeats) + "\n\n" + recall_table(recalled, tool)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return text


def _profiles(settings: Settings, summarizer: Any) -> Callable[[str | None], Profile]:
    def profile_for(model: str | None) -> Profile:
        return dataclasses.replace(resolve_model(settings, model).profile, summarizer=summarizer)

    return profile_for


def _chat(transport: Any, base_url: str, model: str, key_env: str | None) -> Summarizer:
    from proxy.upstream.summarizer import UpstreamSummarizer

    key = os.environ.get(key_env) if key_env else None
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return UpstreamSummarizer(transport, base_url, model, headers)


def _llm(args: argparse.Namespace, settings: Settings, transport: Any) -> Summarizer:
    config = resolve_model(settings, None)
    model = args.summary_model or config.summary_model
    if not model:
        raise EvalUsageError("--summarizer llm needs --summary-model (or compaction.summary_model)")
    return _chat(transport, args.upstream or config.upstream, model, config.api_key_env)
