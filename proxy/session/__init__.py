"""proxy.session: one conversation's compaction against the store.

service.py       Conversations: the store, caches, model knowledge, model_config
conversation.py  compact_if_needed: look up, decide once, lock, recheck, execute, store
compacting.py    one compaction as the proxy runs it: job, recheck, events, checkpoint
ahead.py         the compaction a conversation will need, prepared early
background.py    the tasks that outlive the request that started them
steering.py      the session's settings for decide; summary edits, "compact now"
"""
