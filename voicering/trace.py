"""`voicering trace TRACE_ID --logs DIR`: one request's path (gateway -> entry worker -> owner) and
each hop's timings, joined from the hop lines the processes logged (`gpu_worker.trace_context`).

Every ``*.log`` under each DIR is read (recursively, symlinked folders not followed; a file over
`MAX_LOG_BYTES` is skipped and named), line by line, a line over `MAX_LINE_BYTES` skipped: JSON
lines (the workers') by their ``hop`` object, text lines (the gateway's) by their ``key=value``
fields. A `voicering up` folder keeps its children's logs in ``<folder>/logs`` (the default).

Exit status: 0 the trace was found, 1 no hop of it in the logs, 2 a usage error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import typer

from gpu_worker.trace_context import HOPS, Hop, hop_from, parse_hop, trace_id_of

__all__ = ["MAX_LINE_BYTES", "MAX_LOG_BYTES", "FoundHop", "command", "find_hops", "render"]

MAX_LOG_BYTES: Final = 256 << 20
MAX_LINE_BYTES: Final = 64 << 10
EXIT_NOT_FOUND: Final = 1


@dataclass(frozen=True, slots=True)
class FoundHop:
    hop: Hop
    file: Path


def log_files(roots: Iterable[Path], skipped: list[Path]) -> Iterator[Path]:
    """Every ``*.log`` under ``roots`` (a root may be a file), in name order; too large ones go to ``skipped``."""
    for root in roots:
        if root.is_file():
            candidates = [root]
        else:
            candidates = sorted(Path(folder) / name for folder, _, names in os.walk(root) for name in names
                                if name.endswith(".log"))
        for path in candidates:
            try:
                if path.stat().st_size > MAX_LOG_BYTES:
                    skipped.append(path)
                    continue
            except OSError:
                continue
            yield path


def find_hops(trace_id: str, roots: Iterable[Path], skipped: list[Path] | None = None) -> list[FoundHop]:
    """The hops of one trace in the logs under ``roots``, in path order (gateway, entry, owner;
    then by the time each began)."""
    needle = trace_id.encode()
    found: list[FoundHop] = []
    for path in log_files(roots, skipped if skipped is not None else []):
        try:
            with open(path, "rb") as lines:
                for raw in lines:
                    if len(raw) > MAX_LINE_BYTES or needle not in raw:
                        continue
                    hop = _hop_of(raw.decode("utf-8", errors="replace"))
                    if hop is not None and hop.trace == trace_id:
                        found.append(FoundHop(hop, path))
        except OSError:
            continue
    return sorted(found, key=lambda f: (HOPS.index(f.hop.hop), f.hop.began))


def _hop_of(line: str) -> Hop | None:
    line = line.strip()
    if line.startswith("{"):
        try:
            entry = json.loads(line)
        except ValueError:
            return None
        values = entry.get("hop") if isinstance(entry, dict) else None
        return hop_from(values) if isinstance(values, dict) else None
    return parse_hop(line)


def render(trace_id: str, hops: list[FoundHop]) -> str:
    """The path on one line, then one row per hop."""
    steps = [f"{f.hop.hop} {f.hop.worker}".strip() for f in hops]
    lines = [f"trace {trace_id}: " + " -> ".join(steps), ""]
    header = ("hop", "worker", "span", "parent", "to", "voice", "ttfb_ms", "total_ms", "outcome", "log")
    rows = [header] + [(h.hop, h.worker or "-", h.span, h.parent or "-", h.to or "-", h.voice or "-",
                        _ms(h.ttfb_ms), _ms(h.total_ms), h.outcome or "-", f.file.name)
                       for f in hops for h in (f.hop,)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    spans = {f.hop.span for f in hops}
    orphans = [f.hop for f in hops if f.hop.parent and f.hop.parent not in spans and f.hop.hop != "gateway"]
    if orphans:
        lines += ["", "missing hops: " + ", ".join(f"the parent {h.parent} of {h.hop} {h.worker}" for h in orphans)
                  + " (not in these logs)"]
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def command(
    trace: str = typer.Argument(..., metavar="TRACE_ID", help="The trace id (32 hex: `x-voicering-trace-id`, "
                                "`done.stats.trace_id`) or a whole traceparent."),
    logs: list[Path] = typer.Option(None, "--logs", metavar="DIR", help="A folder of logs (read recursively) or a "
                                    "log file; repeatable (default: the `voicering up` folder's logs)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: the hops, in path order."),
) -> None:
    """One request's path across gateway, entry worker and owner, with each hop's timings, from the logs.

    Exit status: 0 found, 1 not in the logs, 2 usage error."""
    trace_id = trace_id_of(trace)
    if trace_id is None:
        typer.echo("error: TRACE_ID must be 32 hex characters (or a traceparent 00-<trace id>-<span id>-<flags>)",
                   err=True)
        raise typer.Exit(2)
    if not logs:
        from voicering.stack.settings import UpSettings

        logs = [UpSettings().logs]
    missing = [str(p) for p in logs if not p.exists()]
    if missing:
        typer.echo(f"error: no such log folder or file: {', '.join(missing)}", err=True)
        raise typer.Exit(2)
    skipped: list[Path] = []
    hops = find_hops(trace_id, logs, skipped)
    for path in skipped:
        typer.echo(f"skipped {path}: over {MAX_LOG_BYTES >> 20} MiB", err=True)
    if as_json:
        typer.echo(json.dumps({"trace_id": trace_id, "hops": [{**f.hop.fields(), "log": str(f.file)} for f in hops]}))
    elif hops:
        typer.echo(render(trace_id, hops))
    if not hops:
        if not as_json:
            typer.echo(f"trace {trace_id}: no hop of it in {', '.join(map(str, logs))}", err=True)
        raise typer.Exit(EXIT_NOT_FOUND)
