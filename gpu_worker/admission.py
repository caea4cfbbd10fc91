"""Admission: which starts a worker takes, and the counts that say its load.

A start is refused ``busy`` at once, before any model work, past one of four bounds; the refusal
names the bound (`Busy.limit`), because only a connection's own bound is the link's:

- ``capacity``: ``max_streams`` contexts spoken by this worker's engine;
- ``share``: a start a ring-aware pool placed that would take this worker past its share of the
  fleet's load, ``in_flight + 1 > max(ceil(admit_factor × fleet_mean), share floor)``
  (`fleet_share`), unless it ``insist``s (the pool's last try);
- ``relay``: ``max_relayed_streams`` contexts relayed to their owners (a relay costs no engine slot);
- ``connection``: one connection's share of the worker.

The check and the count are one synchronous step (no await between them). A relayed context that
falls back to this engine moves from the relay count to the engine count (`claim_engine`), or is
refused ``busy`` when the engine is full.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from gpu_worker.errors import Busy, BusyLimit
from gpu_worker.protocol import Start
from gpu_worker.settings import WorkerSettings
from hashring.errors import InvalidVoiceId
from hashring.placement import HeatRecorder
from hashring.records import RingView
from hashring.settings import RingSettings
from hashring.share import share_bound, share_floor_streams, share_of_mean

if TYPE_CHECKING:
    from gpu_worker.metrics import WorkerMetrics

__all__ = ["Admission", "Holds", "fleet_share"]

Holds = Literal["engine", "relay"] | None  # which of the worker's counts a context takes (None: released)

# the `voicering_worker_rejected_total` reason of each busy limit (the metric's names predate `limit`)
_REJECTED_REASON: dict[str, str] = {"capacity": "busy", "share": "share", "relay": "busy", "connection": "connection_limit"}


def fleet_share(view: RingView, worker_id: str, in_flight: int, admit_factor: float,
                floor: int = 0) -> tuple[int, float]:
    """This worker's share of the fleet's streams: ``(max(ceil(admit_factor × mean), floor), mean)``,
    where mean = (the reported loads of the live, undrained workers in ``view``, with this worker's
    exact ``in_flight`` in place of its own report, + 1 for the start being decided) / their count
    (this worker counted once, in the ring or not), and ``floor`` its share floor in streams. A lone
    worker's share is never below ``in_flight + 1``."""
    loads = view.loads
    others = sum(load for wid, load in loads.items() if wid != worker_id)
    return share_bound(others, in_flight, len(loads) + (worker_id not in loads), admit_factor, floor)


class Admission:
    """The worker's two counts (`active`: contexts its engine speaks, local fallbacks of relays
    included, its load; `relayed`: contexts relayed to their owners) and the bounds on them.
    ``ring``: the ring view and settings once the worker has joined (None outside the ring:
    capacity alone bounds a placed start); ``heat``: counts refusals per voice (entry worker)."""

    def __init__(self, settings: WorkerSettings, metrics: WorkerMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.active = 0
        self.relayed = 0
        self.view: Callable[[], RingView] | None = None
        self.ring_settings: RingSettings | None = None
        self.heat: HeatRecorder | None = None

    def join(self, view: Callable[[], RingView], ring_settings: RingSettings, heat: HeatRecorder | None) -> None:
        """The worker joined the ring: bound placed starts by its share of the fleet."""
        self.view, self.ring_settings, self.heat = view, ring_settings, heat

    def admit(self, start: Start, connection_streams: int, *, relay: bool) -> Holds:
        """Refuse a start past a bound (`Busy`, naming it), or claim its count. ``connection_streams``:
        the contexts its connection already holds."""
        settings = self.settings
        limit = settings.connection_stream_limit()
        refused: BusyLimit | None = None
        message = ""
        if not relay and self.active >= settings.max_streams:
            refused = "capacity"
            message = f"worker is at its limit of {settings.max_streams} concurrent streams; try another replica"
        elif not relay and self._shared(start) and (share := self.share()) is not None and self.active + 1 > share[0]:
            refused = "share"
            bound, mean = share
            rule = f"ceil({self.admit_factor} × mean {mean:.1f})"
            if bound > share_of_mean(mean, self.admit_factor):
                rule = f"its share floor, above {rule}"
            message = f"worker holds {self.active} streams, over its share of the fleet ({rule} = {bound}); try another owner"
        elif relay and self.relayed >= settings.relay_stream_limit():
            refused = "relay"
            message = f"worker relays at most {settings.relay_stream_limit()} streams at once; try another worker"
        elif connection_streams >= limit:
            refused = "connection"
            message = (f"this connection holds {limit} streams, its share of the worker's {settings.max_streams}; "
                       "wait for one to end or use another connection")
        if refused is not None:
            if self.metrics is not None:
                self.metrics.rejected.labels(_REJECTED_REASON[refused]).inc()
            if self.heat is not None:  # per voice, for operators; a share refusal also raises its replicas
                with contextlib.suppress(InvalidVoiceId):  # (the pool must go past the owners)
                    self.heat.refused(start.voice, raise_replicas=refused == "share" and start.placed)
            raise Busy(message, refused)
        if relay:
            self.relayed += 1
            return "relay"
        self.active += 1
        return "engine"

    def claim_engine(self, holds: Holds) -> Holds:
        """A relayed context falls back to this worker's engine: it takes an engine slot (its relay
        slot is given back), or is refused ``busy`` when the engine has none (bug M2: fallbacks
        bypassed ``max_streams`` exactly under overload, and were missing from the load)."""
        if holds == "engine":
            return holds
        if self.active >= self.settings.max_streams:
            if self.metrics is not None:
                self.metrics.rejected.labels("busy").inc()
            raise Busy(f"no owner could take it and this worker is at its limit of {self.settings.max_streams} "
                       "concurrent streams; try again shortly", "capacity")
        self.relayed -= holds == "relay"
        self.active += 1
        return "engine"

    def release(self, holds: Holds) -> None:
        if holds == "engine":
            self.active -= 1
        elif holds == "relay":
            self.relayed -= 1

    def share(self) -> tuple[int, float] | None:
        """This worker's share of the fleet's streams (never below its share floor), or None outside
        the ring (capacity alone bounds it then)."""
        if self.view is None or self.ring_settings is None:
            return None
        floor = share_floor_streams(self.settings.max_streams, self.ring_settings.share_floor)
        return fleet_share(self.view(), self.settings.worker_id, self.active, self.admit_factor, floor)

    @property
    def admit_factor(self) -> float:
        return self.ring_settings.admit_factor if self.ring_settings is not None else 0.0

    @staticmethod
    def _shared(start: Start) -> bool:
        """Whether the share rule applies: to a start a ring-aware pool placed (it can try another
        owner, and insists on its last try), never to one from a caller that does not know the ring
        (a direct client has nowhere else to go: capacity alone bounds it)."""
        return start.placed and not start.insist
