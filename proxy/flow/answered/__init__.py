"""proxy.flow.answered: a compacted request's bookkeeping, once the client has its answer.

bill.py    what the request cost (Spent: its work beside the answer), and without compaction
record.py  the figures of one answered request, for the recorder
finish.py  the metrics, the bill, the log line and the figures of a request, written
"""
