"""compaction: keep a chat conversation inside a model's context window.

A pure library: no HTTP server, no settings files. The summarizer is injected
as an async callable, so everything here runs and tests without a network.
"""
