"""The comparison rig: the direct connection and each proxy, measured in interleaved rounds.

Every figure is taken in rounds; in each round every target is measured once,
in an order that rotates from round to round, so a slow spell of the machine
lands on all sides alike. A proxy's figure is compared with the direct
connection's figure *of the same round*; the report gives the median of those
per-round figures and their range.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.bench.client import Target
from tests.bench.processes import Server
from tests.bench.stats import Spread, spread

DIRECT = "direct"

#: target name → metric → one value per round.
Rounds = dict[str, dict[str, list[float]]]


@dataclass
class Rig:
    upstream: Server
    #: The proxies under test by target name (``compaction-proxy``, ``litellm``).
    proxies: dict[str, Server] = field(default_factory=dict)

    @property
    def targets(self) -> list[Target]:
        servers = [(DIRECT, self.upstream), *self.proxies.items()]
        return [Target(name, "127.0.0.1", server.port) for name, server in servers]

    def server(self, name: str) -> Server:
        return self.upstream if name == DIRECT else self.proxies[name]

    def interleave(
        self,
        rounds: int,
        measure: Callable[[Target], dict[str, float]],
        only: list[str] | None = None,
    ) -> Rounds:
        """Run ``measure`` on every target in every round, in rotating order."""
        targets = [t for t in self.targets if only is None or t.name in only]
        results: Rounds = {t.name: {} for t in targets}
        for index in range(rounds):
            shift = index % len(targets)
            for target in targets[shift:] + targets[:shift]:
                for metric, value in measure(target).items():
                    results[target.name].setdefault(metric, []).append(value)
        return results


def added(results: Rounds, name: str, metric: str) -> Spread:
    """``name``'s figure minus the direct one, round by round."""
    pairs = zip(results[name][metric], results[DIRECT][metric], strict=True)
    return spread([value - direct for value, direct in pairs])


def ratio(results: Rounds, name: str, metric: str) -> Spread:
    """``name``'s figure as a share of the direct one, round by round."""
    pairs = zip(results[name][metric], results[DIRECT][metric], strict=True)
    return spread([value / direct if direct else math.nan for value, direct in pairs])


def of(results: Rounds, name: str, metric: str) -> Spread:
    return spread(results[name][metric])
