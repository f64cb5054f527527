"""proxy.session: one conversation's compaction against the store.

    conversation.py  look up the checkpoint, lock, execute, store, record
    compacting.py    one compaction as the proxy runs it: job, events, checkpoint
    ahead.py         the compaction a conversation will need, prepared early
    background.py    the tasks that outlive the request that started them
    steering.py      summary edits, per-session settings, "compact now"
"""
