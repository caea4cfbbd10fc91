"""Typed records shared by the store, membership and placement, and the id rules they enforce."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import Final, Literal

from hashring.errors import InvalidVoiceId, InvalidWorkerId
from hashring.ring import Node, Ring

__all__ = [
    "MAX_VOICE_ID_BYTES",
    "VOICE_ID",
    "RingView",
    "Snapshot",
    "WorkerInfo",
    "WorkerState",
    "WorkerStatus",
    "check_voice_id",
    "check_worker_id",
    "shown_voice_id",
    "valid_voice_id",
]

WorkerStatus = Literal["live", "draining", "down"]

MAX_VOICE_ID_BYTES: Final = 256
# The grammar of voices stored as adapters: ``name`` or ``tenant/name``, each part 1-128 letters,
# digits or '._-' starting with a letter or digit, so a voice id is a relative path that needs no
# quoting and never climbs ('..'). Anchored with \A...\Z: '$' would let "tara\n" through.
VOICE_ID: Final = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,127}(?:/[A-Za-z0-9][A-Za-z0-9_.-]{0,127})?\Z")
SHOWN_VOICE_ID_CHARS: Final = 64
_WORKER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}")


def check_worker_id(worker_id: str) -> str:
    """Return `worker_id` if usable: 1-128 chars of letters, digits and `._:@/-`, not starting with
    punctuation (so host:port and pod names work and nothing needs quoting in a shell)."""
    if not isinstance(worker_id, str) or not _WORKER_ID.fullmatch(worker_id):
        raise InvalidWorkerId(
            f"worker id {worker_id!r} is not usable: use 1-128 letters, digits or '._:@/-', "
            "starting with a letter or digit"
        )
    return worker_id


def valid_voice_id(voice: object) -> bool:
    """True when `voice` is in the adapter grammar (`VOICE_ID`)."""
    return isinstance(voice, str) and VOICE_ID.match(voice) is not None


def shown_voice_id(voice: str) -> str:
    """`voice` quoted for an error message: escaped, and cut to 64 characters so a huge id sent by a
    client never floods a log line or a reply."""
    text = voice if len(voice) <= SHOWN_VOICE_ID_CHARS else voice[:SHOWN_VOICE_ID_CHARS] + "…"
    return repr(text)


def check_voice_id(voice: str) -> str:
    """Return `voice` if usable: non-empty valid Unicode of at most 256 UTF-8 bytes.

    Any other character is fine (spaces, ':', '{', '*', emoji): voice ids are hashed byte-exact and
    reach Redis only as hash fields or hex-encoded inside key names, never as raw key text.
    """
    if not isinstance(voice, str) or not voice:
        raise InvalidVoiceId("a voice id must be a non-empty string")
    try:
        size = len(voice.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidVoiceId(
            f"voice id {shown_voice_id(voice)!r} is not valid Unicode (lone surrogate at position {exc.start})"
        ) from None
    if size > MAX_VOICE_ID_BYTES:
        raise InvalidVoiceId(f"voice id is {size} bytes long; the limit is {MAX_VOICE_ID_BYTES} UTF-8 bytes")
    return voice


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker registers: where to reach it and how much it can take."""

    id: str
    ws_url: str  # public websocket address clients stream from
    proxy_url: str  # internal address the wrong-worker proxy forwards to
    weight: float = 1.0  # share of the ring (and of the load bound) relative to other workers
    capacity: int = 32  # concurrent streams it accepts

    def __post_init__(self) -> None:
        check_worker_id(self.id)
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"worker {self.id!r}: weight must be a positive number, got {self.weight!r}")
        if self.capacity < 1:
            raise ValueError(f"worker {self.id!r}: capacity must be >= 1, got {self.capacity!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> WorkerInfo:
        data = json.loads(text)
        return cls(
            id=data["id"],
            ws_url=data["ws_url"],
            proxy_url=data["proxy_url"],
            weight=float(data.get("weight", 1.0)),
            capacity=int(data.get("capacity", 32)),
        )


@dataclass(frozen=True, slots=True)
class WorkerState:
    """A worker as a reader sees it."""

    info: WorkerInfo
    status: WorkerStatus
    load: int  # streams it reported in its last heartbeat
    heartbeat_age_s: float | None  # seconds since its last heartbeat (ring clock: outages do not count); None if never


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one read of Redis returns, taken atomically (one Lua script)."""

    epoch: int
    server_time: float  # the ring clock: Redis time less the outages so far (hashring.store)
    workers: Mapping[str, WorkerInfo]
    heartbeats: Mapping[str, float]
    live: frozenset[str]
    draining: frozenset[str]
    loads: Mapping[str, int]
    replicas: Mapping[str, int]  # operator floor per voice
    auto_replicas: Mapping[str, int]  # automatic count per hot voice
    incarnation: str = ""  # set once per Redis data set: a new one means Redis lost its data ('' unknown)


@dataclass(frozen=True)
class RingView:
    """A reader's picture of the fleet at one epoch: the ring of live, undrained workers plus the
    per-voice replica counts. Immutable; a watcher swaps in a new one on every change."""

    epoch: int
    ring: Ring
    workers: Mapping[str, WorkerState] = field(default_factory=dict)
    replicas: Mapping[str, int] = field(default_factory=dict)
    auto_replicas: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, snap: Snapshot, *, vnodes: int, previous: RingView | None = None) -> RingView:
        """Build a view; reuses `previous.ring` when ring membership did not change."""
        workers: dict[str, WorkerState] = {}
        for wid, info in sorted(snap.workers.items()):
            status: WorkerStatus = "down"
            if wid in snap.live:
                status = "draining" if wid in snap.draining else "live"
            beat = snap.heartbeats.get(wid)
            age = None if beat is None else max(0.0, snap.server_time - beat)
            workers[wid] = WorkerState(info, status, snap.loads.get(wid, 0), age)
        members = [Node(wid, st.info.weight) for wid, st in workers.items() if st.status == "live"]
        if previous is not None and previous.ring.vnodes == vnodes and previous.ring.nodes == tuple(members):
            ring = previous.ring
        else:
            ring = Ring(members, vnodes=vnodes)
        return cls(
            epoch=snap.epoch,
            ring=ring,
            workers=MappingProxyType(workers),
            replicas=MappingProxyType(dict(snap.replicas)),
            auto_replicas=MappingProxyType(dict(snap.auto_replicas)),
        )

    def without(self, worker_id: str) -> RingView:
        """This view with `worker_id` out of the ring, shown as draining (a reader's own drain)."""
        if worker_id not in self.ring:
            return self
        workers = dict(self.workers)
        if worker_id in workers:
            workers[worker_id] = replace(workers[worker_id], status="draining")
        return replace(self, ring=self.ring.without_node(worker_id), workers=MappingProxyType(workers))

    @property
    def loads(self) -> dict[str, int]:
        """Reported streams per worker in the ring."""
        return {wid: st.load for wid, st in self.workers.items() if wid in self.ring}

    def worker(self, worker_id: str) -> WorkerInfo:
        return self.workers[worker_id].info
