"""Counting tokens: the bundled encodings, the counter with its cache and
chain links, and the calibration of its count against the upstream's."""
