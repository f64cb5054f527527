"""The ``compaction-proxy`` command line: a thin layer over the library.

    compaction-proxy serve              run the proxy (default http://127.0.0.1:8808/v1)
    compaction-proxy compact [FILE|-]   run the pipeline on a request body
    compaction-proxy inspect [FILE|-]   show why a conversation is large
    compaction-proxy eval DIR           score what compaction keeps (evaluation/)
    compaction-proxy eval --replay      price whole sessions replayed through serve
    compaction-proxy sessions           the dashboard's overview, as a table
    compaction-proxy show SESSION       one session: timeline, summary, events

Exit codes: 0 success; 2 unreadable or invalid input or configuration;
3 the conversation cannot be made to fit.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.metadata
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from compaction import CannotFitError, CompactionError, Profile, Summarizer, compact
from config import (
    ConfigError,
    ModelConfig,
    find_config_file,
    load_settings,
    resolve_model,
    with_client_window,
)
from proxy.cli.inspect import render_inspection
from proxy.cli.request_file import RequestFile, read_request

EXIT_OK = 0
EXIT_INVALID = 2
EXIT_CANNOT_FIT = 3

#: CLI flag → Profile field; a flag given on the command line beats every
#: other source, including per-model tables.
_PROFILE_FLAGS = {
    "context_window": "context_window",
    "reserve_tokens": "reserve_tokens",
    "keep_recent_tokens": "keep_recent_tokens",
    "threshold": "threshold",
    "head_count": "head_count",
    "summarizer": "summarizer",
}


class UsageError(Exception):
    """Bad input or configuration: exit 2 with one line on stderr."""


def _budget_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", default="-", help="request body (JSON); - for stdin")
    parser.add_argument("--config", help="TOML configuration file")
    parser.add_argument("--model", help="model name (default: the body's model)")
    parser.add_argument("--context-window", type=int, metavar="N")
    parser.add_argument("--reserve-tokens", type=int, metavar="N")
    parser.add_argument("--keep-recent-tokens", type=int, metavar="N")
    parser.add_argument("--threshold", type=int, metavar="N", help="absolute trigger")
    parser.add_argument("--head-count", type=int, metavar="N")


def _installed_version() -> str:
    """The installed distribution's version (what a bug report should name)."""
    try:
        return importlib.metadata.version("compaction-proxy")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compaction-proxy",
        description="Keep long chat conversations inside a model's context window.",
    )
    parser.add_argument(
        "--version", action="version", version=f"compaction-proxy {_installed_version()}"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="TOML configuration file")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8808)")
    serve.add_argument(
        "--upstream", metavar="URL", help="OpenAI-compatible upstream base URL (chat, responses)"
    )
    serve.add_argument(
        "--anthropic-upstream",
        metavar="URL",
        help="Anthropic Messages upstream base URL (POST /v1/messages)",
    )
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    serve.add_argument(
        "--log-format", choices=("text", "json"), help="text (default) or one JSON object a line"
    )
    serve.add_argument(
        "--log-content",
        action="store_const",
        const=True,
        help="also log the last message's text (off by default: it is private)",
    )

    run = commands.add_parser("compact", help="compact a chat-completions request body")
    _budget_flags(run)
    run.add_argument(
        "--summarizer",
        choices=("extractive", "off", "llm"),
        help="default: extractive (llm calls --upstream, key from OPENAI_API_KEY)",
    )
    run.add_argument("--upstream", metavar="URL", help="OpenAI-compatible base URL for llm")
    run.add_argument("--reason", choices=("threshold", "manual", "overflow"), default="threshold")
    run.add_argument("--instructions", metavar="TEXT", help="focus for the summary")
    run.add_argument("--report", metavar="PATH", help="write a JSON report here")

    look = commands.add_parser("inspect", help="show tokens by role and group, head and tail")
    _budget_flags(look)
    look.add_argument("--top", type=int, default=10, metavar="N", help="largest groups to list")
    look.add_argument(
        "--anthropic-beta",
        metavar="BETAS",
        help="the client's anthropic-beta header (context-1m-… opens the 1M window)",
    )

    # Its options are read by evaluation/cli.py, so that nothing of the
    # evaluation is imported unless asked for.
    score = commands.add_parser(
        "eval", help="score what compaction keeps, per strategy", add_help=False, prefix_chars="\0"
    )
    score.add_argument("options", nargs="*", help="see compaction-proxy eval --help")

    listing = commands.add_parser("sessions", help="the dashboard's overview, as a table")
    listing.add_argument(
        "--config", help="TOML configuration file (for store.url; default: the last serve's)"
    )
    listing.add_argument("--limit", type=int, default=50, metavar="N", help="newest sessions")
    show = commands.add_parser("show", help="one session: timeline, summary and events")
    show.add_argument("session", help="the session id, or a unique start of it")
    show.add_argument(
        "--config", help="TOML configuration file (for store.url; default: the last serve's)"
    )
    show.add_argument(
        "--owner", help="whose session, where two owners' share the id (a unique start)"
    )
    return parser


def _model_config(args: argparse.Namespace, body_model: str | None) -> ModelConfig:
    settings = load_settings(args.config)
    resolved = resolve_model(settings, args.model or body_model)
    flags = {
        field: getattr(args, flag)
        for flag, field in _PROFILE_FLAGS.items()
        if getattr(args, flag, None) is not None
    }
    if "summarizer" not in flags:
        # The CLI never calls a network service unless asked to.
        flags["summarizer"] = "extractive"
    try:
        profile = dataclasses.replace(resolved.profile, **flags)
    except ValueError as exc:
        raise UsageError(f"invalid option: {exc}") from exc
    source = "override" if "context_window" in flags else resolved.window_source
    return dataclasses.replace(resolved, profile=profile, window_source=source)


def _write_output(request: RequestFile, messages: list[Any] | None) -> None:
    if messages is None:
        sys.stdout.buffer.write(request.raw)
    else:
        sys.stdout.buffer.write(orjson.dumps(request.with_messages(messages)))
        sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()


async def _run_compact(args: argparse.Namespace, request: RequestFile, config: ModelConfig) -> int:
    profile: Profile = config.profile
    summarizer: Summarizer | None = None
    transport = None
    if profile.summarizer == "llm":
        from proxy.upstream.service import build_transport
        from proxy.upstream.summarizer import UpstreamSummarizer

        key = os.environ.get(config.api_key_env) if config.api_key_env else None
        headers = {"authorization": f"Bearer {key}"} if key else {}
        # The proxy's own upstream settings: timeouts, trust_env, ca_bundle.
        settings = load_settings(args.config)
        transport = build_transport(settings)
        summarizer = UpstreamSummarizer(
            transport,
            args.upstream or config.upstream,
            config.summary_model,
            headers,
            deadline=settings.upstream.summarizer_timeout_seconds,
        )
    try:
        result = await compact(
            request.body,
            profile,
            summarizer,
            reason=args.reason,
            instructions=args.instructions,
        )
    finally:
        if transport is not None:
            await transport.aclose()

    _write_output(request, result.messages if result.changed else None)
    print(
        f"{result.stage}: {result.tokens_before:,} → {result.tokens_after:,} tokens "
        f"(limit {result.input_limit:,}, trigger {result.trigger:,}; "
        f"{result.messages_before} → {result.messages_after} messages; reason {result.reason}"
        + (f"; summary by {result.summarizer_used}" if result.summarizer_used else "")
        + ")",
        file=sys.stderr,
    )
    for note in result.notes:
        print(f"  note: {note}", file=sys.stderr)
    if args.report:
        report = {
            "model": config.model,
            "stage": result.stage,
            "reason": result.reason,
            "tokens_before": result.tokens_before,
            "tokens_after": result.tokens_after,
            "context_window": profile.context_window,
            "window_source": config.window_source,
            "input_limit": result.input_limit,
            "trigger": result.trigger,
            "messages_before": result.messages_before,
            "messages_after": result.messages_after,
            "summarizer": result.summarizer_used,
            "summarizer_calls": result.summarizer_calls,
            "notes": list(result.notes),
        }
        Path(args.report).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    from proxy.cli.served import remember
    from proxy.cli.server import serve

    settings = load_settings(
        args.config,
        server={
            "host": args.host,
            "port": args.port,
            "log_format": args.log_format,
            "log_content": args.log_content,
        },
        upstream={"base_url": args.upstream, "anthropic_base_url": args.anthropic_upstream},
    )
    remember(find_config_file(args.config), settings)  # for sessions and show
    serve(settings, log_level=args.log_level)
    return EXIT_OK


def _eval(args: argparse.Namespace) -> int:
    if "--replay" in args.options:
        return _replay(args)
    from evaluation.cli import EvalUsageError, run_eval

    try:
        print(asyncio.run(run_eval(args.options)))
    except EvalUsageError as exc:
        raise UsageError(str(exc)) from exc
    return EXIT_OK


def _replay(args: argparse.Namespace) -> int:
    from evaluation.replay.cli import ReplayUsageError, run_replay

    try:
        print(asyncio.run(run_replay(args.options)))
    except ReplayUsageError as exc:
        raise UsageError(str(exc)) from exc
    return EXIT_OK


def _dashboard(args: argparse.Namespace) -> int:
    from proxy.cli.served import dashboard_settings
    from proxy.cli.terminal import UnknownSession, sessions_text, show_text

    served = dashboard_settings(args.config)
    settings = served.settings
    if served.note is not None:
        print(f"compaction-proxy: {served.note}", file=sys.stderr)
    try:
        if args.command == "sessions":
            print(asyncio.run(sessions_text(settings, args.limit)))
        else:
            print(asyncio.run(show_text(settings, args.session, args.owner)))
    except UnknownSession as exc:
        raise UsageError(str(exc)) from exc
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "eval":
            return _eval(args)
        if args.command in ("sessions", "show"):
            return _dashboard(args)
        request = read_request(args.file, any_api=args.command == "inspect")
        config = _model_config(args, request.model)
        if args.command == "inspect":
            config = with_client_window(config, args.anthropic_beta)
            print(render_inspection(request.body, config, top=args.top, api=request.api))
            return EXIT_OK
        return asyncio.run(_run_compact(args, request, config))
    except CannotFitError as exc:
        print(f"compaction-proxy: cannot fit: {exc}", file=sys.stderr)
        return EXIT_CANNOT_FIT
    except (UsageError, ConfigError, CompactionError, OSError) as exc:
        print(f"compaction-proxy: {exc}", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
