"""`voicering status`: the fleet at a glance, from its Redis and the workers' own HTTP ports.

    report.py    the data of one sample: settings, problems, probes, rates; the report as JSON (pure)
    probes.py    StatusReader: the fleet and the queue from Redis, the workers' /health and /metrics
    terminal.py  the rich terminal view: problems first, one table per section
    cli.py       the typer command: settings resolved once, one sample or --watch until Ctrl-C

Problems: a dead worker still listed, a voice with fewer replicas placed than wanted, a training
job queued longer than --queue-age-limit minutes. Gateways and agent servers are listed from their
announcements (hashring.presence). What no process records (workers publish how many adapters
they hold, not which; spills are taken by the cool loop as it reads them; refusals are not counted
per voice) is null in the JSON, with the reason. Nothing heavy is imported with the package: redis and rich load when a run starts.
"""

from voicering.status.cli import command
from voicering.status.probes import StatusReader, counter_totals
from voicering.status.report import (NOT_RECORDED, Probe, Problem, StatusReport, StatusSettings, WorkerRates,
                                     problems_of, rates_between, report_json)
from voicering.status.terminal import render

__all__ = ["NOT_RECORDED", "Probe", "Problem", "StatusReader", "StatusReport", "StatusSettings", "WorkerRates",
           "command", "counter_totals", "problems_of", "rates_between", "render", "report_json"]
