"""One message and the groups messages form: reading and checking them,
tool calls and their results, the proxy's own messages (its summaries
included), refs to originals for recall, and what a person typed."""
