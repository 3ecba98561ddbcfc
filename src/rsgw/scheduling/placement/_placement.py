"""One model's placement under lpt_packing: the workers hosting its replicas, and their weights.

Pure: no trio, no sockets, no logging, no clock. `compute_assignment`
(`rsgw.scheduling.placement._assignment`) decides a `Placement` per model, its greedy pass
(`_greedy`) builds them, the packer's reports carry them (`_reports`) and the
lpt_packing scheduler routes each request within one (`_lpt`). It is a plain value
below all of those, so each can import it without importing the placement algorithm.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Placement:
    """One model's replicas: `(url, weight)` pairs sorted by URL, no URL twice.

    Sorted so two placements of the same set compare equal and the fill router's
    replica indices (and so its rotation cursor) mean the same thing across repacks.

    Raises:
        ValueError: the URLs are not strictly increasing, or a weight is not positive.
    """

    replicas: tuple[tuple[str, float], ...] = ()
    #: The URLs alone, computed once: the request path reads them on every call.
    urls: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        urls = tuple(url for url, _ in self.replicas)
        if any(a >= b for a, b in itertools.pairwise(urls)):
            raise ValueError(f"placement URLs must be sorted and distinct, got {list(urls)}")
        if any(not weight > 0 for _, weight in self.replicas):
            raise ValueError(f"placement weights must be positive, got {self.replicas}")
        object.__setattr__(self, "urls", urls)

    def __iter__(self) -> Iterator[tuple[str, float]]:
        return iter(self.replicas)

    def __len__(self) -> int:
        return len(self.replicas)
