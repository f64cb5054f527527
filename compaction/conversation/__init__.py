"""A conversation read once: its groups, head and tail, token counts and
checkpoint chain, read incrementally when the previous request is a prefix;
the checkpoints the proxy stores; the files re-read after a compaction."""
