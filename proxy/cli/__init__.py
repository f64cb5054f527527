"""The ``compaction-proxy`` command line (the entry point is :func:`main`)."""

from proxy.cli.commands import main

__all__ = ["main"]
