"""A local stand-in for a replica's `/health`: 200 on GET /health, 404 elsewhere, on 127.0.0.1.

deploy.sh and `hetcompile migrate` wait for every replica to answer /health before they route to
it; the stub `sky` (stub_sky.py) points endpoints at this server.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *a) -> None:
        pass


@contextlib.contextmanager
def health_server() -> Iterator[str]:
    """Serve /health on an ephemeral loopback port; yields "127.0.0.1:PORT"; stops on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
