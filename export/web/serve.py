"""Host a web package on loopback with the headers that make a page cross-origin isolated —
`Cross-Origin-Opener-Policy: same-origin` and `Cross-Origin-Embedder-Policy: require-corp` —
without which browsers withhold SharedArrayBuffer, and ONNX Runtime Web runs on one thread.
Any server that sends those two headers does the same (docs/web.md)."""
from __future__ import annotations

import functools
import shutil
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ISOLATION_HEADERS = {"Cross-Origin-Opener-Policy": "same-origin",
                     "Cross-Origin-Embedder-Policy": "require-corp",
                     "Cross-Origin-Resource-Policy": "same-origin"}


def chromium() -> str:
    """The system Chromium (scripts/setup-web.sh installs the distribution's package)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        raise RuntimeError("no chromium on PATH: bash scripts/setup-web.sh (Debian: apt-get "
                           "install chromium)")
    return found


class _Handler(SimpleHTTPRequestHandler):
    isolate = True
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript",
                      ".wasm": "application/wasm", ".onnx": "application/octet-stream"}

    def end_headers(self) -> None:
        if self.isolate:
            for k, v in ISOLATION_HEADERS.items():
                self.send_header(k, v)
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, *args) -> None:  # quiet: the page reports what matters
        pass


def start(directory: str | Path, port: int = 0, *, isolate: bool = True
          ) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Serve `directory` on 127.0.0.1:port (0: a free port) in a thread; stop with
    server.shutdown(). isolate=False leaves the isolation headers out (one thread)."""
    handler = functools.partial(type("H", (_Handler,), {"isolate": isolate}),
                                directory=str(directory))
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def serve_dir(directory: str | Path, port: int = 8080) -> None:
    """`tinyt package --format web --serve`: host until Ctrl-C."""
    try:
        server, thread = start(directory, port)
    except OSError as e:
        print(f"error: cannot listen on 127.0.0.1:{port}: {e.strerror}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"serving {directory} on http://127.0.0.1:{server.server_address[1]}/ "
          "(cross-origin isolated; Ctrl-C stops)", flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()
