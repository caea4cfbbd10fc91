"""The terminal view of one report (rich): the header, the problems first in red, then one table
per section (workers, hottest voices, training queue) and what the fleet cannot list.

rich is imported inside each function, so importing this module (and `voicering --help`) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from voicering.status.report import NOT_RECORDED, Problem, StatusReport, WorkerRates, duration

if TYPE_CHECKING:
    from rich.console import RenderableType

    from hashring.fleet_view import FleetView

__all__ = ["SHOWN_OWNERS", "SHOWN_PROBLEMS", "render"]

SHOWN_PROBLEMS: Final = 12  # problem lines drawn; the JSON has them all
SHOWN_OWNERS: Final = 6


def render(report: StatusReport) -> RenderableType:
    """Problems first (red), then one table per section."""
    from rich.console import Group
    from rich.text import Text

    fleet = report.fleet
    serving = sum(w.state == "serving" for w in fleet.workers)
    head = Text.assemble(
        ("voicering fleet", "bold"), f"  {report.redis}  prefix {report.settings.ring.prefix}  ",
        ("ring epoch ", "dim"), str(fleet.epoch), ("  serving ", "dim"), f"{serving} of {len(fleet.workers)}",
        ("  streams ", "dim"), str(fleet.streams), ("  requests ", "dim"), f"{fleet.rate:.1f}/s",
        ("  autoscaler ", "dim"), "cooling" if fleet.cooling else ("no cool loop holds the lease", "yellow"))
    parts: list[Any] = [head, _problems(report.problems), _workers(report), _voices(fleet)]
    parts += [_training(report), _presence(report)]
    return Group(*parts)


def _presence(report: StatusReport) -> RenderableType:
    """One line per kind: each gateway and agent server with the age of its last announcement."""
    from rich.text import Text

    lines = Text()
    for kind, title in (("gateway", "gateways"), ("agent", "agent servers")):
        rows = [p for p in report.presence if p.kind == kind]
        lines.append(f"{title} ", style="bold")
        if not rows:
            lines.append("none announced\n", style="dim")
            continue
        for i, p in enumerate(rows):
            lines.append(", " if i else "")
            lines.append(p.id, style="yellow" if p.silent else "")
            lines.append(f" ({'silent ' if p.silent else ''}{p.seen_age_s:.0f}s ago)", style="dim")
        lines.append("\n")
    lines.append(NOT_RECORDED["presence"], style="dim")
    return lines


def _problems(problems: tuple[Problem, ...]) -> RenderableType:
    from rich.text import Text

    if not problems:
        return Text("no problems", style="green")
    lines = Text()
    for p in problems[:SHOWN_PROBLEMS]:
        lines.append(f"PROBLEM {p.message}\n", style="bold red")
    if len(problems) > SHOWN_PROBLEMS:
        lines.append(f"... and {len(problems) - SHOWN_PROBLEMS} more problems (see --json)\n", style="bold red")
    lines.rstrip()
    return lines


def _workers(report: StatusReport) -> RenderableType:
    from rich.table import Table

    table = Table(title="workers", title_justify="left", expand=False)
    for name, justify in (("WORKER", "left"), ("STATE", "left"), ("STREAMS", "right"), ("REFUSED/S", "right"),
                          ("RELAYED/S", "right"), ("ADAPTERS", "right"), ("HEARTBEAT", "right"), ("ADDRESS", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    colour = {"serving": "green", "draining": "yellow", "dead": "bold red"}
    for w in report.fleet.workers:
        probe, rates = report.probes.get(w.id), report.rates.get(w.id, WorkerRates(None, None))
        adapters = (str(len(w.adapters)) if w.adapters is not None else "-" if probe is None
                    else "?" if probe.health is None else str(probe.health.get("adapters_resident")))
        table.add_row(w.id, f"[{colour[w.state]}]{w.state}[/]", f"{w.streams}/{w.capacity}",
                      _per_s(rates.refusals_per_s), _per_s(rates.relays_per_s), adapters,
                      "never" if w.heartbeat_age_s is None else duration(w.heartbeat_age_s), w.proxy_url)
    if not report.fleet.workers:
        table.add_row("no workers registered", "", "", "", "", "", "", "")
    notes = []
    if report.probes and all(r.refusals_per_s is None for r in report.rates.values()):
        notes.append("refusals and relays per second need two samples of the workers' /metrics: use --watch")
    failed = [(wid, p.error) for wid, p in report.probes.items() if p.error]
    if failed:
        notes.append(f"{len(failed)} probe(s) incomplete: {', '.join(w for w, _ in failed[:SHOWN_OWNERS])}"
                     f"{' ...' if len(failed) > SHOWN_OWNERS else ''} (first: {failed[0][1]})")
    table.caption, table.caption_justify = "\n".join(notes) or None, "left"
    return table


def _voices(fleet: FleetView) -> RenderableType:
    from rich.table import Table

    table = Table(title=f"hottest voices ({len(fleet.voices)} of {fleet.voices_ranked} requested lately, with a "
                  "replica record or asked for)", title_justify="left")
    for name, justify in (("VOICE", "left"), ("REQ/S 5s", "right"), ("REQ/S 60s", "right"), ("SHARE", "right"),
                          ("REPLICAS", "right"), ("OWNERS", "left"), ("ADAPTER ON", "left"), ("SPILLED", "right"),
                          ("REFUSED", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for v in fleet.voices:
        replicas = f"{v.placed}/{v.wanted}"
        table.add_row(v.voice, f"{v.rate:.2f}", f"{v.rate_slow:.2f}", _percent(v.share),
                      f"[bold red]{replicas}[/]" if v.placed < v.wanted else replicas, _listed(v.owners),
                      _listed(v.adapter_on), _percent(v.spill_share), _percent(v.refusal_share))
    return table


def _training(report: StatusReport) -> RenderableType:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    queue = report.queue
    if queue is None:
        return Text(f"training queue: not readable ({report.queue_error})", style="yellow")
    age = queue.oldest_queued_age_s
    summary = Text.assemble(
        ("training queue  ", "bold"), f"queued {len(queue.queued)}",
        f" (oldest {duration(age)})" if age is not None else "", f"  running {len(queue.running)}",
        f"  failed in the last {duration(queue.failed_window_s)} {len(queue.failed_recent)}",
        f"  stream entries pending {queue.pending_entries}",
        "" if queue.complete else (f"  (newest {queue.scanned} jobs read)", "yellow"))
    if not queue.running and not queue.failed_recent:
        return summary
    table = Table(title_justify="left")
    for name in ("JOB", "VOICE", "STATE", "PROGRESS", "TRAINER", "AGE / ERROR"):
        table.add_column(name)
    for r in queue.running:
        j = r.status
        steps = f" step {j.step}/{j.total_steps}" if j.total_steps else ""
        lease = "" if r.leased else " [yellow](lease expired)[/]"
        table.add_row(j.job_id, j.voice_id, j.state, f"{j.progress:.1f}%{steps}", j.consumer + lease,
                      duration(queue.read_at - j.created_at))
    for j in queue.failed_recent:
        table.add_row(j.job_id, j.voice_id, "[red]failed[/]", f"{j.progress:.1f}%", j.consumer,
                      f"{duration(queue.read_at - j.updated_at)} ago: {j.error_code or '-'} {j.error}"[:160])
    return Group(summary, table)


def _listed(workers: tuple[str, ...]) -> str:
    shown = ", ".join(workers[:SHOWN_OWNERS])
    return shown + (f" +{len(workers) - SHOWN_OWNERS}" if len(workers) > SHOWN_OWNERS else "") or "-"


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def _per_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
