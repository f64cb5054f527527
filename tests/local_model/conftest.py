"""The local-model measurement reports figures; it asserts nothing. Keep pytest out of it."""

collect_ignore_glob = ["*.py"]
