"""A local stand-in for a replica: 200 on GET /health, optionally vLLM's /metrics, 404 elsewhere, on 127.0.0.1.

deploy.sh and `hetcompile migrate` wait for every replica to answer /health before they route to
it, and migrate's drain reads the replica's `vllm:num_requests_running` / `_waiting` gauges; the
stub `sky` (stub_sky.py) points endpoints at this server.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


IDLE_METRICS = ("# TYPE vllm:num_requests_running gauge\n"
                'vllm:num_requests_running{engine="0",model_name="stub"} 0.0\n'
                "# TYPE vllm:num_requests_waiting gauge\n"
                'vllm:num_requests_waiting{engine="0",model_name="stub"} 0.0\n')
"""The gauges of an idle vLLM server: what a drained replica reports (a replica that does not answer
/metrics at all makes a drain wait its whole limit, as it should for a real one)."""


def _handler(metrics: Callable[[], str] | None) -> type[BaseHTTPRequestHandler]:
    class _Replica(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/metrics" and metrics is not None:
                body = metrics().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a) -> None:
            pass

    return _Replica


@contextlib.contextmanager
def health_server(metrics: Callable[[], str] | None = None) -> Iterator[str]:
    """Serve /health (and /metrics from `metrics()`, each GET calling it once) on an ephemeral
    loopback port; yields "127.0.0.1:PORT"; stops on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(metrics))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
