"""The summary: its format, the ledger of facts computed from a span (files,
commands, errors, user messages), the prompts a summarizer is given, the
extractive summary made without one, and the checks a model's summary must
pass before it replaces a span."""
