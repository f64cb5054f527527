"""compaction: keep a chat conversation inside a model's context window."""
