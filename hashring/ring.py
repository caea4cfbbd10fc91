"""The consistent hash ring: pure computation, no I/O.

A node owns `max(1, round(vnodes × weight))` points on a 32-bit circle; point i of node `w1` is
`mmh3_32(b"w1#i", SEED)`. A key (a voice id) hashes the same way, and its owner is the node of the
first point strictly after the key's hash, wrapping past the top. Points that collide are ordered
by node id, so a ring depends only on its membership: every process that sees the same nodes and
weights computes the same owners, and adding nodes one at a time gives the same ring as building
it in one go.

Keys are hashed byte-exact: a `str` is hashed as its UTF-8 bytes, `bytes` as they are, so
`"é"` and `"é".encode()` land on the same node. A `str` that has no UTF-8 form (a lone surrogate)
raises `InvalidVoiceId`; it is never handed to mmh3 (mmh3 5.3 crashes the process on one).

Lookups are the hot step: `owner` is one hash and one list index into a bucket table (about eight
buckets per point, at most 2**20) and, for the ~12% of buckets a point splits, one `bisect`.
`owners` walks the ring to the next distinct nodes and memoises the walk per point. `choose` is
consistent hashing with bounded loads.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import mmh3
import numpy as np

from hashring.errors import EmptyRing, InvalidVoiceId

__all__ = ["DEFAULT_BALANCE", "DEFAULT_VNODES", "SEED", "Key", "Node", "Ring", "hash_key"]

SEED: Final = 0x766F6963  # b"voic"; changing it moves every voice in every deployment
DEFAULT_VNODES: Final = 2048  # 64 equal nodes: largest share / mean share ~1.05 (see docs/ring.md)
DEFAULT_BALANCE: Final = 1.25  # c in "load <= c × average" (HAProxy's hash-balance-factor 125)

Key = str | bytes

_SPACE: Final = 1 << 32
_MAX_WALKS: Final = 16384
_mmh3_32 = mmh3.hash


def hash_key(key: Key) -> int:
    """The unsigned 32-bit position of `key` on the ring (mmh3 of its UTF-8 bytes, fixed seed)."""
    if isinstance(key, str) and not key.isascii():
        try:
            key = key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidVoiceId(
                f"id {key!r} is not valid Unicode (lone surrogate at position {exc.start}); "
                "send ids as UTF-8 text"
            ) from None
    return _mmh3_32(key, SEED, False)


@dataclass(frozen=True, slots=True)
class Node:
    """A ring member: an id and a weight (its share of points and of the load bound)."""

    id: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a ring node needs a non-empty id")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"node {self.id!r}: weight must be a positive number, got {self.weight!r}")


@lru_cache(maxsize=1024)  # 8 KiB per node at 2048 points
def _node_points(node_id: str, count: int) -> np.ndarray:
    """The `count` ring positions of one node, unsorted; cached, so a rebuild hashes only newcomers."""
    prefix = node_id.encode("utf-8") + b"#"
    points = np.fromiter((_mmh3_32(prefix + b"%d" % i, SEED, False) for i in range(count)), np.uint32, count)
    points.flags.writeable = False
    return points  # [count]


def _node_keys(node_id: str, count: int, rank: int) -> np.ndarray:
    """Sort keys `position << 32 | rank` of one node's points."""
    return (_node_points(node_id, count).astype(np.uint64) << np.uint64(32)) | np.uint64(rank)  # [count]


def _point_count(node: Node, vnodes: int) -> int:
    return max(1, round(vnodes * node.weight))


class Ring:
    """An immutable consistent hash ring. `with_node` / `without_node` return new rings.

    Internally each point is one uint64 sort key `position << 32 | rank`, where rank is the node's
    index among the sorted node ids; sorting those keys orders points by position, then node id.
    """

    __slots__ = ("_weights", "_ids", "_vnodes", "_keys", "_points", "_owner_at", "_table", "_shift", "_walks")

    def __init__(self, nodes: Iterable[Node | str] = (), *, vnodes: int = DEFAULT_VNODES) -> None:
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        weights: dict[str, float] = {}
        for item in nodes:
            node = Node(item) if isinstance(item, str) else item
            if node.id in weights:
                raise ValueError(f"node {node.id!r} is listed twice")
            weights[node.id] = node.weight
        ids = tuple(sorted(weights))
        parts = [_node_keys(nid, _point_count(Node(nid, weights[nid]), vnodes), rank) for rank, nid in enumerate(ids)]
        keys = np.sort(np.concatenate(parts)) if parts else np.empty(0, np.uint64)
        self._init(weights, ids, vnodes, keys)

    def _init(self, weights: dict[str, float], ids: tuple[str, ...], vnodes: int, keys: np.ndarray) -> None:
        self._weights = {nid: weights[nid] for nid in ids}
        self._ids = ids
        self._vnodes = vnodes
        self._keys = keys  # [P] uint64, sorted: position << 32 | rank
        points = keys >> np.uint64(32)  # [P]
        owner_rank = (keys & np.uint64(0xFFFFFFFF)).astype(np.intp)  # [P]
        id_array = np.array(ids, dtype=object)
        self._points: list[int] = points.tolist()
        self._owner_at: list[str] = id_array[owner_rank].tolist() if len(ids) else []
        self._walks: dict[int, tuple[str, ...]] = {}
        # Bucket table: 2**bits buckets over the circle; a bucket that no point splits maps straight
        # to its owner, the others hold None and fall back to bisect.
        bits = min(20, max(4, math.ceil(math.log2(max(1, len(points)))) + 3))  # ~8 buckets per point
        self._shift = 32 - bits
        if not len(points):
            self._table: list[str | None] = [None] * (1 << bits)
            return
        starts = np.arange(1 << bits, dtype=np.uint64) << np.uint64(self._shift)  # [B]
        ends = starts + np.uint64((1 << self._shift) - 1)  # [B]
        first = np.searchsorted(points, starts, side="right")  # [B]
        last = np.searchsorted(points, ends, side="right")  # [B]
        owner_of_bucket = id_array[owner_rank[first % len(points)]]  # [B]
        owner_of_bucket[first != last] = None
        self._table = owner_of_bucket.tolist()

    @classmethod
    def _from_keys(cls, weights: dict[str, float], vnodes: int, keys: np.ndarray) -> Ring:
        ring = cls.__new__(cls)
        ring._init(weights, tuple(sorted(weights)), vnodes, keys)
        return ring

    # -- membership -------------------------------------------------------------------------------

    def with_node(self, node: Node | str) -> Ring:
        """A new ring with `node` added: its points are merged in, the others keep their places."""
        node = Node(node) if isinstance(node, str) else node
        if node.id in self._weights:
            raise ValueError(f"node {node.id!r} is already in the ring")
        weights = {**self._weights, node.id: node.weight}
        rank = bisect_right(self._ids, node.id)  # new node's rank; ranks at or above it shift by one
        pos = self._keys >> np.uint64(32)
        old_rank = self._keys & np.uint64(0xFFFFFFFF)
        shifted = (pos << np.uint64(32)) | (old_rank + (old_rank >= rank).astype(np.uint64))  # order kept
        new = np.sort(_node_keys(node.id, _point_count(node, self._vnodes), rank))
        keys = np.insert(shifted, np.searchsorted(shifted, new), new)
        return Ring._from_keys(weights, self._vnodes, keys)

    def without_node(self, node_id: str) -> Ring:
        """A new ring with `node_id` removed; only keys that node owned change owner."""
        if node_id not in self._weights:
            raise ValueError(f"node {node_id!r} is not in the ring")
        weights = {nid: w for nid, w in self._weights.items() if nid != node_id}
        rank = self._ids.index(node_id)
        pos = self._keys >> np.uint64(32)
        old_rank = self._keys & np.uint64(0xFFFFFFFF)
        keep = old_rank != rank
        keys = (pos[keep] << np.uint64(32)) | (old_rank[keep] - (old_rank[keep] > rank).astype(np.uint64))
        return Ring._from_keys(weights, self._vnodes, keys)

    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(Node(nid, w) for nid, w in self._weights.items())

    @property
    def vnodes(self) -> int:
        return self._vnodes

    def weight(self, node_id: str) -> float:
        return self._weights[node_id]

    def __len__(self) -> int:
        return len(self._weights)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._weights

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ring):
            return NotImplemented
        return self._vnodes == other._vnodes and self._weights == other._weights

    def __hash__(self) -> int:
        return hash((self._vnodes, tuple(self._weights.items())))

    def __repr__(self) -> str:
        return f"Ring({len(self._weights)} nodes, {len(self._points)} points, digest={self.digest()})"

    def digest(self) -> str:
        """A short fingerprint of the point layout; equal digests mean equal owners for every key."""
        layout = self._keys.tobytes() + repr(self._vnodes).encode()
        return format(mmh3.hash64(layout, seed=SEED, signed=False)[0], "016x")

    # -- lookups (the hot step) -------------------------------------------------------------------

    def owner(self, key: Key) -> str:
        """The first owner of `key`. Raises EmptyRing on an empty ring."""
        h = _mmh3_32(key, SEED, False) if key.__class__ is str and key.isascii() else hash_key(key)
        owner = self._table[h >> self._shift]
        if owner is not None:
            return owner
        i = bisect_right(self._points, h)
        try:
            return self._owner_at[i if i < len(self._points) else 0]
        except IndexError:
            raise EmptyRing("the ring has no nodes: register a worker or undrain one") from None

    def owners(self, key: Key, n: int) -> tuple[str, ...]:
        """The preference list of `key`: its first `n` distinct nodes in ring order.

        Returns fewer than `n` when the ring has fewer nodes. `owners(key, 1) == (owner(key),)`.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        return self._walk(self._start(hash_key(key)), n)[:n]

    def choose(
        self,
        key: Key,
        loads: Mapping[str, float],
        *,
        c: float = DEFAULT_BALANCE,
        replicas: int = 1,
        exclude: Collection[str] = (),
    ) -> str:
        """Pick a node for one more unit of load on `key` (consistent hashing with bounded loads).

        `loads` maps node id to its current load (missing means 0). After this unit is placed the
        average load per unit weight is `(total + 1) / W`; a node of weight w is *within the bound*
        when its load plus this unit stays at or under `c × (total + 1) × w / W`. Among the first
        `replicas` owners the least loaded (per unit weight) node within the bound wins, ties going
        to preference order; if none is within it, the walk spills on in preference order to the
        first node within the bound. While the fleet is nearly idle no node may satisfy that
        strictly (the bound is below 1), so a second pass uses Mirrokni et al.'s integer capacity,
        `load < ceil(c × (total + 1) × w / W)`, which some node always meets. Nodes in `exclude`
        are skipped and left out of `total` and `W`; raises EmptyRing when every node is excluded.
        """
        if c < 1:
            raise ValueError(f"balance factor c must be >= 1, got {c}")
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        weights = self._weights
        if not weights:
            raise EmptyRing("the ring has no nodes: register a worker or undrain one")
        # The bound is over the nodes that may take this unit: an excluded node's load and weight
        # in the mean would make it unmeetable while the others still have room.
        total, live_weight = 0.0, 0.0
        for nid, weight in weights.items():
            if nid not in exclude:
                total += loads.get(nid, 0)
                live_weight += weight
        if not live_weight:
            raise EmptyRing("every worker in the ring is excluded for this request (full or failed); retry shortly")
        per_weight = c * (total + 1) / live_weight
        start = self._start(hash_key(key))
        order = self._walk(start, replicas)
        for strict in (True, False):
            best, best_rel = None, math.inf
            for nid in order[:replicas]:
                if nid in exclude:
                    continue
                load, weight = loads.get(nid, 0), weights[nid]
                if _within(load, per_weight * weight, strict) and load / weight < best_rel:
                    best, best_rel = nid, load / weight
            if best is not None:
                return best
            order = self._walk(start, len(weights))
            for nid in order[replicas:]:
                if nid not in exclude and _within(loads.get(nid, 0), per_weight * weights[nid], strict):
                    return nid
        raise EmptyRing("every worker in the ring is excluded for this request (full or failed); retry shortly")

    def shares(self) -> dict[str, float]:
        """Fraction of the hash space each node owns (sums to 1)."""
        if not self._points:
            return {}
        points = self._keys >> np.uint64(32)  # [P]
        ranks = (self._keys & np.uint64(0xFFFFFFFF)).astype(np.intp)  # [P]
        arcs = np.diff(points.astype(np.int64), prepend=int(points[-1]) - _SPACE)  # [P], arc ending at point
        owned = np.bincount(ranks, weights=arcs, minlength=len(self._ids)) / _SPACE  # [N]
        return dict(zip(self._ids, owned.tolist()))

    # -- internals --------------------------------------------------------------------------------

    def _start(self, h: int) -> int:
        if not self._points:
            raise EmptyRing("the ring has no nodes: register a worker or undrain one")
        i = bisect_right(self._points, h)
        return i if i < len(self._points) else 0

    def _walk(self, start: int, n: int) -> tuple[str, ...]:
        """Distinct owners from point `start` on, at least min(n, len(self)) of them; memoised."""
        want = min(n, len(self._weights))
        walk = self._walks.get(start)
        if walk is not None and len(walk) >= want:
            return walk
        owner_at, count = self._owner_at, len(self._owner_at)
        seen: list[str] = []
        found: set[str] = set()
        i = start
        while len(seen) < want:
            nid = owner_at[i]
            if nid not in found:
                found.add(nid)
                seen.append(nid)
            i = i + 1 if i + 1 < count else 0
        walk = tuple(seen)
        if len(self._walks) >= _MAX_WALKS:
            self._walks.clear()  # keeps the memo to a few MiB however many distinct keys pass
        self._walks[start] = walk
        return walk


def _within(load: float, limit: float, strict: bool) -> bool:
    if strict:
        return load + 1 <= limit + 1e-9
    return load < math.ceil(limit - 1e-9)
