"""Which worker takes one more request for a voice, decided by one router on loads it only
estimates (pure; the pool's `RingRouter` and `bench/ring.py` run exactly this).

    estimate(w) = load w reported in its last heartbeat + this router's own opens minus closes
                  at w since that heartbeat (`OwnLoad`)
                  or, when a worker's own count rode on an answer newer than that heartbeat
                  (`opened`, `done`, `error`), that count + own opens minus closes since then
    order       = two distinct random owners, the better first (power of two choices)
                  then the other owners, better first (at most `owner_tries` owners in all)
                  then the ring's successors, in preference order (`successors()`: the caller
                  may put first those that already hold the voice's adapter)
                  and last, any of those whose estimate is at its capacity
    better      = (over c × the mean, estimate / weight, random tie-break)

Every router holds the same stale picture, so a deterministic arg-min sends every router's next
request for a voice to the same owner until the next refresh (herding; Mitzenmacher, "How useful
is old information?", 2000); two random choices stay close to the best even on old loads. The
balance factor c only orders candidates: an owner over c × the mean *by an estimate* is still
tried before any worker outside the owner set, because leaving the owners loads an adapter and
the estimate may be wrong. Workers at capacity by estimate go last, not out: the worker answers
for itself (`busy`).
"""

from __future__ import annotations

import bisect
import random
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

__all__ = ["OWNER_TRIES", "OwnLoad", "order"]

OWNER_TRIES = 3  # owners a request tries (each may refuse: `busy`) before the ring's successors


def order(
    owners: Sequence[str],
    successors: Callable[[], Sequence[str]],
    estimate: Mapping[str, float],
    *,
    weight: Mapping[str, float],
    capacity: Mapping[str, float],
    bound_per_weight: float,
    rng: random.Random,
    exclude: Collection[str] = (),
    owner_tries: int | None = None,
) -> Iterator[str]:
    """Candidates for one more request, best first (lazily: most callers take the first).

    `owners`: the voice's placement, preference order; `successors()`: the rest of the ring in
    preference order (called only if every owner is excluded or full); `estimate`: this router's
    estimate per worker (missing: 0); `bound_per_weight`: c × (estimated total + 1) / total
    weight, the load bound per unit weight; `owner_tries`: at most this many owners are yielded
    (None: all), the rest are left out (a request refused by that many owners spills)."""
    candidates = _order(owners, successors, estimate, weight=weight, capacity=capacity,
                        bound_per_weight=bound_per_weight, rng=rng, exclude=exclude)
    if owner_tries is None:
        yield from candidates
        return
    owner_set, tried = set(owners), 0
    for w in candidates:
        if w in owner_set:
            if tried >= owner_tries:
                continue
            tried += 1
        yield w


def _order(owners: Sequence[str], successors: Callable[[], Sequence[str]], estimate: Mapping[str, float], *,
           weight: Mapping[str, float], capacity: Mapping[str, float], bound_per_weight: float, rng: random.Random,
           exclude: Collection[str]) -> Iterator[str]:
    full: list[str] = []
    free = [w for w in owners if w not in exclude]

    def key(w: str) -> tuple[bool, float]:
        load, wt = estimate.get(w, 0.0), weight.get(w, 1.0)
        return load + 1 > bound_per_weight * wt + 1e-9, load / wt

    def at_capacity(w: str) -> bool:
        return estimate.get(w, 0.0) >= capacity.get(w, float("inf"))

    if len(free) > 2:
        picked = rng.sample(free, 2)
        rest = [w for w in free if w not in picked]
    else:
        picked, rest = free[:], []
        rng.shuffle(picked)
    picked.sort(key=key)  # stable: equal keys keep the random order
    for w in picked:
        if at_capacity(w):
            full.append(w)
        else:
            yield w
    if rest:
        rng.shuffle(rest)
        rest.sort(key=key)
        for w in rest:
            if at_capacity(w):
                full.append(w)
            else:
                yield w
    taken = set(owners)
    for w in successors():
        if w in taken or w in exclude:
            continue
        if at_capacity(w):
            full.append(w)
        else:
            yield w
    yield from full


class OwnLoad:
    """One router's own streams per worker over time, so that a load reported at time t can be
    brought up to now: estimate = reported + own(now) − own(t).

    The caller notes its stream count per worker whenever it may have changed (the pool: at each
    pick, plus the one it is about to open); samples older than `horizon_s` are dropped, keeping
    the latest of them (a report older than the horizon is brought up to date from there)."""

    def __init__(self, horizon_s: float = 10.0) -> None:
        if horizon_s <= 0:
            raise ValueError("horizon_s must be > 0")
        self.horizon_s = horizon_s
        self._times: dict[str, deque[float]] = {}
        self._counts: dict[str, deque[int]] = {}
        self._pruned: set[str] = set()  # workers whose oldest sample stands for everything before it
        self._answers: dict[str, tuple[float, int]] = {}  # worker -> (when, load) of its last answer with a load

    def note(self, worker: str, at: float, count: int) -> None:
        counts = self._counts.get(worker)
        if counts is None:
            if not count:
                return  # never had a stream there: own(t) is 0 throughout
            self._times[worker], self._counts[worker] = deque([at]), deque([count])
            return
        if counts[-1] == count:
            return
        times = self._times[worker]
        times.append(at)
        counts.append(count)
        while len(times) > 1 and times[1] < at - self.horizon_s:
            times.popleft()
            counts.popleft()
            self._pruned.add(worker)

    def observe(self, at: float, counts: Mapping[str, int]) -> None:
        """Note every worker's count (workers missing from `counts` that had streams now have 0)."""
        for worker in list(self._counts):
            if worker not in counts:
                self.note(worker, at, 0)
        for worker, count in counts.items():
            self.note(worker, at, count)

    def at(self, worker: str, t: float) -> int:
        """This router's streams at `worker` at time `t` (as last noted at or before `t`)."""
        times = self._times.get(worker)
        if times is None:
            return 0
        i = bisect.bisect_right(times, t)
        if i:
            return self._counts[worker][i - 1]
        return self._counts[worker][0] if worker in self._pruned else 0  # before its first stream: none

    def now(self, worker: str) -> int:
        counts = self._counts.get(worker)
        return counts[-1] if counts else 0

    def since(self, worker: str, t: float) -> int:
        """Own opens minus closes at `worker` since time `t`."""
        return self.now(worker) - self.at(worker, t)

    def answered(self, worker: str, at: float, load: int, count: int) -> None:
        """`worker` told its own count `load` at `at` (on an answer), when this router had `count`
        streams there: from now on it is the report estimates start from, until a newer one."""
        self.note(worker, at, count)
        self._answers[worker] = (at, load)

    def estimate(self, worker: str, reported_at: float, reported: int) -> float:
        """Streams at `worker` now: the newer of its heartbeat (`reported` at `reported_at`) and its
        last answer, brought up to now by this router's opens minus closes since."""
        at, load = self._answers.get(worker, (reported_at, reported))
        if at < reported_at:
            at, load = reported_at, reported
        return max(0.0, load + self.since(worker, at))
