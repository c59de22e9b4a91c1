"""`python -m tinyt serve` in a child on a free loopback port, for the tests that drive a live
server (tests/server/test_server.py, tests/export/test_families_chain.py): always stopped by
the test that started it."""
import http.client
import json
import re
import signal
import subprocess
import sys
import threading
import time

KEY = "test-key-123"


class Server:
    """`python -m tinyt serve` on a free loopback port (--port 0), stopped by the test."""

    def __init__(self, artifact, *args):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tinyt", "serve", str(artifact), "--port", "0",
             "--threads", "1", *map(str, args)], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        self.port = None
        while self.port is None and time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}")
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # drain the log
        while time.time() < deadline and self.get("/health")[0] != 200:
            time.sleep(0.05)

    def request(self, method, path, body=None, headers=None, raw=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            data = raw if raw is not None else (None if body is None else json.dumps(body))
            conn.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                           **(headers or {})})
            r = conn.getresponse()
            text = r.read().decode()
            return r.status, text, dict(r.getheaders())
        except ConnectionError:
            return 0, "", {}
        finally:
            conn.close()

    def get(self, path):
        try:
            return self.request("GET", path)
        except OSError:
            return 0, "", {}

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def client(self, key=KEY):
        import openai

        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key,
                             max_retries=0, timeout=60)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        return self.proc.returncode
