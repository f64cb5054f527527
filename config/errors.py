"""The one error ``config`` raises: a configuration that cannot be used.

ConfigError                  (carries one ConfigIssue per problem found)

Every foreign error met while loading (pydantic's ``ValidationError``, a TOML
syntax error, a missing file, bad JSON in an environment variable) is
translated into it at the boundary, with the key path and the source named, so
the CLI can print one line and exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigIssue:
    """One problem: where it is (``key``), what is wrong, and which source said it."""

    key: str  #: dotted key path, e.g. ``compaction.reserve_tokens``; "" for the whole file
    problem: str  #: e.g. ``must not be negative (got -1)``; for an unknown key, a hint
    source: str | None = None  #: e.g. ``compaction-proxy.toml``, ``environment variable X``
    unknown_key: bool = False

    def __str__(self) -> str:
        where = f" in {self.source}" if self.source else ""
        if self.unknown_key:
            hint = f" ({self.problem})" if self.problem else ""
            return f"unknown key '{self.key}'{where}{hint}"
        if self.key:
            return f"{self.key}: {self.problem}{where}"
        return f"{self.problem}{where}"


class ConfigError(Exception):
    """The configuration is invalid; ``issues`` lists every problem found."""

    def __init__(self, issues: ConfigIssue | tuple[ConfigIssue, ...]) -> None:
        self.issues = issues if isinstance(issues, tuple) else (issues,)
        lines = [str(issue) for issue in self.issues]
        if len(lines) == 1:
            message = f"invalid configuration: {lines[0]}"
        else:
            message = "invalid configuration:\n" + "\n".join(f"  {line}" for line in lines)
        super().__init__(message)
