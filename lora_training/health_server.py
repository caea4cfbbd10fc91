"""The trainer's internal HTTP port: `GET /health` (200 while `TrainerHealth` says ok, else 503
with the problems in words) and `GET /metrics` (Prometheus text). Nothing else is served.

It runs on its own threads beside the synchronous job loop, with a reader that reads the training
queue every `refresh_s` through its own Redis connection: that read is the trainer's Redis probe
(the job loop may be inside one long step) and it sets the queue gauges.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lora_training.errors import TrainingError
from lora_training.health import TrainerHealth
from lora_training.jobs import JobQueue
from lora_training.metrics import TrainerMetrics
from lora_training.queue_view import read_queue

__all__ = ["HealthServer"]

log = logging.getLogger(__name__)

QUEUE_READ_LIMIT = 500  # jobs read per refresh (read_queue's bound: a deeper queue's oldest are not seen)


class HealthServer:
    """Serve `/health` and `/metrics` on ``host:port`` (0: any free port; `port` says which) and read
    the queue every ``refresh_s`` until `close`, which closes ``queue`` too (the server's own connection)."""

    def __init__(self, health: TrainerHealth, metrics: TrainerMetrics, queue: JobQueue, *, host: str, port: int,
                 refresh_s: float) -> None:
        self.health, self.metrics, self._queue, self._refresh_s = health, metrics, queue, refresh_s
        self._stop = threading.Event()
        self._http = ThreadingHTTPServer((host, port), self._handler())
        self._http.daemon_threads = True
        self.port = self._http.server_address[1]
        self._threads = [threading.Thread(target=self._http.serve_forever, name="trainer-health", daemon=True),
                         threading.Thread(target=self._read_queue, name="trainer-queue-reader", daemon=True)]

    def start(self) -> HealthServer:
        for thread in self._threads:
            thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._http.shutdown()
        self._http.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._queue.close()

    def read_once(self) -> None:
        """One queue read: the gauges and the Redis half of the verdict."""
        try:
            view = read_queue(self._queue, limit=QUEUE_READ_LIMIT)
        except TrainingError as err:
            self.health.redis_failed(err.message)
            self.metrics.queue_failed()
            return
        self.health.redis_ok()
        self.metrics.queue_read(view)

    def _read_queue(self) -> None:
        while not self._stop.is_set():
            try:
                self.read_once()
            except Exception:  # the reader must outlive any one failure; the verdict shows Redis as failing
                log.exception("reading the training queue for /health failed")
                self.health.redis_failed("the queue read raised (see the trainer's log)")
            self._stop.wait(self._refresh_s)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path == "/health":
                    verdict = server.health.verdict()
                    body = json.dumps(verdict.to_dict()).encode()
                    self._answer(200 if verdict.ok else 503, "application/json", body)
                elif self.path == "/metrics":
                    self._answer(200, server.metrics.content_type, server.metrics.render())
                else:
                    self._answer(404, "text/plain; charset=utf-8", b"only /health and /metrics are served here\n")

            def _answer(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # probes every few seconds: not worth a log line each
                pass

        return Handler
