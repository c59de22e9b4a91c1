"""Serving under load: `tinyt serve` (continuous batching) against the naive server (a thread
per request calling generate), on the same artifact, with closed-loop clients.

    for each server (one at a time, a process of its own on a free loopback port):
      for concurrency C in 1, 2, 4, 8, 16: C clients, each sending streamed greedy completions
      (a held-out prompt of PROMPT tokens, exactly NEW new tokens) one after another, for
      REQUESTS requests each or SECONDS seconds, whichever ends first
    ──▶ aggregate generated tokens/s; time to first token and time between tokens (p50, p99,
        from the server-sent events as the client reads them) ──▶ serving.json, serving.md,
        serving.png

    .venv/bin/python -m benchmarks.serving artifacts/onnx-int8-rows-gqa --out OUT
    tinyt bench artifacts --serving --out OUT    (the artifacts' onnx-int8-rows-gqa)

Both servers speak the same streamed /v1/completions; greedy, so both make the same tokens
(checked on one request before timing). Ratios compare concurrency C with C = 1 of the same
server in the same run.

Before the servers, the ceiling the kernels allow (`ceiling`): the engine's own graph runs,
timed alone in this process with nothing else running, interleaved — a decode step of 1 and of
8 rows, one prompt's admission and 8 prompts' — and what they bound: tokens/s at 8 clients
over 1 client's with no HTTP and no Python between runs, and the least time between tokens at
8 clients when a prompt is admitted between two steps. A measured ratio is read against it.
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

CONCURRENCY = (1, 2, 4, 8, 16)
TARGETS = {"tokens_per_s_at_8_vs_1_min": 4.0, "p99_tbt_at_8_vs_1_max": 2.0}


# -- the naive server: what an application writes without tinyt serve ------------------------
def naive_server(artifact: str, port: int, threads: int | None) -> None:
    """A thread per request (the standard library's ThreadingHTTPServer), each calling the
    runtime's stream() on one shared LanguageModel."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import tinyt.runtime as rt

    lm = rt.load(artifact, threads=threads)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):  # /health
            self._send(200, b'{"status": "ok"}', "application/json")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = int(body["max_tokens"])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in lm.stream(body["prompt"], max_new_tokens=n, min_new_tokens=n):
                self._chunk(f"data: {json.dumps({'choices': [{'text': piece}]})}\n\n")
            self._chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")

        def _chunk(self, text: str) -> None:
            data = text.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _send(self, status, data, kind):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"naive server on http://127.0.0.1:{server.server_address[1]}", file=sys.stderr,
          flush=True)
    signal.signal(signal.SIGTERM, lambda *a: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


# -- the client side ------------------------------------------------------------------------
class Server:
    def __init__(self, kind: str, artifact: Path, threads: int | None, max_batch: int,
                 prefill_chunk: int | None = None):
        args = ([sys.executable, "-m", "tinyt", "serve", str(artifact), "--port", "0",
                 "--max-batch", str(max_batch), "--max-queue", "256", "--model-id", "m"]
                if kind == "tinyt-serve" else
                [sys.executable, "-m", "tinyt.benchmarks.serving", str(artifact),
                 "--naive-server"])
        if threads:
            args += ["--threads", str(threads)]
        if prefill_chunk and kind == "tinyt-serve":
            args += ["--prefill-chunk", str(prefill_chunk)]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True)
        self.port = None
        deadline = time.time() + 300
        while self.port is None and time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"{kind} exited {self.proc.returncode}")
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            self.port = int(m.group(1)) if m else None
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        while time.time() < deadline:
            try:
                if self._health():
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{kind} did not become healthy")

    def _health(self) -> bool:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            c.request("GET", "/health")
            return c.getresponse().status == 200
        finally:
            c.close()

    def stream(self, prompt: str, n: int) -> tuple[str, float, list[float]]:
        """(text, time to first token, gaps between tokens) of one streamed completion."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            t0 = time.perf_counter()
            c.request("POST", "/v1/completions", body=json.dumps({
                "model": "m", "prompt": prompt, "max_tokens": n, "min_tokens": n,
                "temperature": 0, "stream": True}), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
            times, text = [], []
            for line in r:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                times.append(time.perf_counter())
                text.append(json.loads(line[6:])["choices"][0].get("text", ""))
            ttft = times[0] - t0 if times else float("nan")
            return "".join(text), ttft, [b - a for a, b in zip(times, times[1:])]
        finally:
            c.close()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


def load_level(server: Server, prompts: list[str], n: int, clients: int, requests: int,
               seconds: float) -> dict:
    """`clients` closed-loop clients, each `requests` requests or until `seconds` pass."""
    ttfts: list[float] = []
    gaps: list[float] = []
    tokens = [0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def client(k: int) -> None:
        for j in range(requests):
            if time.perf_counter() > stop_at:
                return
            _, ttft, g = server.stream(prompts[(k * requests + j) % len(prompts)], n)
            with lock:
                ttfts.append(ttft)
                gaps.extend(g)
                tokens[0] += len(g) + 1
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"clients": clients, "requests": len(ttfts), "tokens": tokens[0], "seconds": wall,
            "tokens_per_s": tokens[0] / wall, "ttft_p50_ms": _pct(ttfts, 0.5),
            "ttft_p99_ms": _pct(ttfts, 0.99), "tbt_p50_ms": _pct(gaps, 0.5),
            "tbt_p99_ms": _pct(gaps, 0.99)}


def _prompts(artifact: Path, count: int, length: int) -> list[str]:
    from tinyt.data import held_out_prompts, load_corpus
    from tinyt.tokenizer import Tokenizer

    tok = Tokenizer.from_file(artifact / "tokenizer.json")
    return [tok.decode(p) for p in held_out_prompts(tok, load_corpus(None).val, count, length)]


def ceiling(artifact: Path, prompts: list[str], new_tokens: int, threads: int | None,
            rows: int = 8, rounds: int = 3, prefill_chunk: int | None = None) -> dict:
    """What the engine's graph runs alone allow at `rows` clients against one (module
    docstring): a request as the engine runs it — its prompt's admission, then new_tokens - 1
    steps — for one client and for `rows` clients whose prompts arrive together, each timed
    as one sequence of runs, the two alternating round by round."""
    import numpy as np

    import tinyt.runtime as rt
    from tinyt.runtime.cache import SharedCache
    from tinyt.runtime.engine import rows_independent

    lm = rt.load(artifact, threads=threads)
    ids = [lm.tokenizer.encode(p) for p in prompts[:rows]]
    kv = dict(kv_dtype=lm._kv_dtype, prefill_session=lm.prefill_session)
    big = SharedCache(lm.session, lm.config, rows, lm.context, **kv)
    one, many = (SharedCache(lm.session, lm.config, b, lm.context, **kv) for b in (1, rows))
    together = rows_independent(lm.artifact.manifest)
    nxt = np.full(rows, lm._pad, dtype=np.int64)

    def request(k: int) -> dict:
        """ms of: admitting k prompts, each step after it, all of it."""
        t0 = time.perf_counter()
        if k == 1 or not together:
            for i in range(k):
                big.admit_from({i: ids[i]}, lm._pad, one)
        else:
            big.admit_from(dict(enumerate(ids[:k])), lm._pad, many)
        t1 = time.perf_counter()
        active = np.zeros(rows, dtype=bool)
        active[:k] = True
        steps = []
        for _ in range(new_tokens - 1):
            t = time.perf_counter()
            big.step_rows(k, nxt, active)
            steps.append(time.perf_counter() - t)
        return {"admit": 1e3 * (t1 - t0), "step": 1e3 * float(np.median(steps)),
                "total": 1e3 * (time.perf_counter() - t0)}
    runs: dict[int, list[dict]] = {1: [], rows: []}
    pieces: list[float] = []
    for r in range(rounds + 1):
        for k in runs:
            got = request(k)
            if r:  # round 0 warms up
                runs[k].append(got)
        if prefill_chunk:  # one piece of a prompt, continuing a staging cache
            one.lens[:] = 0
            one.extend(ids[0][:prefill_chunk])
            t = time.perf_counter()
            one.extend(ids[0][prefill_chunk:2 * prefill_chunk] or ids[0][:1])
            if r:
                pieces.append(1e3 * (time.perf_counter() - t))
    med = {k: {m: float(np.median([g[m] for g in v])) for m in ("admit", "step", "total")}
           for k, v in runs.items()}
    one_client = 1e3 * new_tokens / med[1]["total"]
    at_rows = 1e3 * rows * new_tokens / med[rows]["total"]
    gap = med[rows]["step"] + med[1]["admit"]  # a step after one prompt's admission
    if prefill_chunk:  # ... or after one piece of a prompt
        med["piece"] = float(np.median(pieces))
        gap = med[rows]["step"] + med["piece"]
    return {"rows": rows, "prompts_together": together, "ms": med,
            "prefill_chunk": prefill_chunk,
            "tokens_per_s_1": one_client, f"tokens_per_s_{rows}": at_rows,
            "tokens_per_s_ratio": at_rows / one_client, "tbt_with_admission_ms": gap,
            "tbt_ratio": gap / med[1]["step"]}


def run(artifact: Path, out: Path, *, threads: int | None = None, max_batch: int = 16,
        prompt_tokens: int = 32, new_tokens: int = 32, requests: int = 4,
        seconds: float = 60.0, levels: tuple[int, ...] = CONCURRENCY,
        servers: tuple[str, ...] = ("tinyt-serve", "naive"),
        prefill_chunk: int | None = None) -> dict:
    from tinyt.manifest import read_model_config

    from .environment import environment

    cfg, _ = read_model_config(artifact)
    prompts = _prompts(artifact, 64, prompt_tokens)
    result = {"artifact": str(artifact), "model": cfg.to_dict(),
              "environment": environment(("tinyt", "onnxruntime", "numpy", "starlette",
                                          "uvicorn")),
              "method": {"prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
                         "requests_per_client": requests, "seconds_per_level": seconds,
                         "max_batch": max_batch, "threads": threads, "levels": list(levels),
                         "prefill_chunk": prefill_chunk},
              "servers": {}}
    texts = {}
    for kind in servers:
        server = Server(kind, artifact, threads, max_batch, prefill_chunk)
        try:
            texts[kind] = server.stream(prompts[0], new_tokens)[0]  # same computation first
            server.stream(prompts[1], new_tokens)  # warm
            result["servers"][kind] = [load_level(server, prompts, new_tokens, c, requests,
                                                  seconds) for c in levels]
        finally:
            result["servers"][f"{kind} exit status"] = server.stop()
    # after the servers, so that nothing of this process runs beside them
    result["ceiling"] = ceiling(artifact, prompts, new_tokens, threads,
                                prefill_chunk=prefill_chunk)
    result["same_tokens"] = len(set(texts.values())) == 1
    result["targets"] = targets(result)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serving.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "serving.md").write_text(markdown(result))
    _plot(result, out / "serving.png")
    return result


def targets(result: dict) -> dict:
    rows = {r["clients"]: r for r in result["servers"].get("tinyt-serve", [])}
    if 1 not in rows or 8 not in rows:
        return {}
    speedup = rows[8]["tokens_per_s"] / rows[1]["tokens_per_s"]
    tbt = rows[8]["tbt_p99_ms"] / rows[1]["tbt_p99_ms"]
    return {"tokens_per_s_at_8_vs_1": {"measured": speedup, "min": 4.0, "met": speedup >= 4.0},
            "p99_tbt_at_8_vs_1": {"measured": tbt, "max": 2.0, "met": tbt <= 2.0}}


def _cores(env: dict) -> int:
    """Logical cores, as benchmarks.environment records them (older results: "cores")."""
    return env.get("logical_cores", env.get("cores"))


def markdown(result: dict) -> str:
    m, cpu = result["method"], result["environment"]["cpu"]
    flags = [k for k, v in cpu.items() if v is True]
    lines = [f"# Serving under load ({result['model']['n_layer']} layers × "
             f"{result['model']['n_embd']}, {Path(result['artifact']).name})", "",
             f"{cpu.get('model')}; {', '.join(flags)}; {_cores(result['environment'])} cores; "
             f"{result['environment']['time']}", "",
             f"Closed-loop clients, each streaming greedy completions of {m['prompt_tokens']} "
             f"prompt tokens and exactly {m['new_tokens']} new ones, {m['requests_per_client']} "
             f"requests each (or {m['seconds_per_level']:.0f} s); tinyt serve with max batch "
             f"{m['max_batch']}"
             + (f", prompts in pieces of {m['prefill_chunk']} tokens"
                if m.get("prefill_chunk") else "")
             + f". Same tokens from both servers: {result['same_tokens']}.", "",
             "| server | clients | tokens/s | × 1 client | TTFT p50 ms | TTFT p99 | "
             "TBT p50 ms | TBT p99 |", "|---|---|---|---|---|---|---|---|"]
    for kind, rows in result["servers"].items():
        if not isinstance(rows, list):
            continue
        base = rows[0]["tokens_per_s"]
        for r in rows:
            lines.append(f"| {kind} | {r['clients']} | {r['tokens_per_s']:.1f} | "
                         f"{r['tokens_per_s'] / base:.2f} | {r['ttft_p50_ms']:.1f} | "
                         f"{r['ttft_p99_ms']:.1f} | {r['tbt_p50_ms']:.2f} | "
                         f"{r['tbt_p99_ms']:.2f} |")
    for name, t in result["targets"].items():
        goal = f"≥ {t['min']}" if "min" in t else f"≤ {t['max']}"
        lines += ["", f"- {name}: {t['measured']:.2f} (goal {goal}, "
                      f"{'met' if t['met'] else 'not met'})"]
    c = result.get("ceiling")
    if c:
        k, ms = c["rows"], c["ms"]
        one, many = ms["1"] if "1" in ms else ms[1], ms[str(k)] if str(k) in ms else ms[k]
        lines += ["", f"What the graph runs alone allow (benchmarks/serving.py `ceiling`: a "
                  f"request as the engine runs it, without HTTP or Python between runs, for 1 "
                  f"client and {k} arriving together, alternating, medians): a step of 1 row "
                  f"{one['step']:.2f} ms, of {k} rows {many['step']:.2f} ms; admitting one "
                  f"prompt {one['admit']:.2f} ms, {k} prompts {many['admit']:.2f} ms "
                  f"({'in one run' if c['prompts_together'] else 'one by one'}). "
                  f"So at most {c['tokens_per_s_ratio']:.2f}× one client's tokens/s at {k} "
                  f"clients ({c[f'tokens_per_s_{k}']:.0f} vs {c['tokens_per_s_1']:.0f} tokens/s)"
                  + (f", and a gap holding one {c['prefill_chunk']}-token piece of a prompt "
                     f"({ms['piece']:.2f} ms) lasts at least " if c.get("prefill_chunk") else
                     ", and a gap holding one admission lasts at least ")
                  + f"{c['tbt_with_admission_ms']:.2f} ms, {c['tbt_ratio']:.2f}× a 1-row step."]
    return "\n".join(lines) + "\n"


def _plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, rows in result["servers"].items():
        if not isinstance(rows, list):
            continue
        c = [r["clients"] for r in rows]
        a.plot(c, [r["tokens_per_s"] for r in rows], marker="o", label=kind)
        b.plot(c, [r["tbt_p99_ms"] for r in rows], marker="o", label=f"{kind} TBT p99")
        b.plot(c, [r["ttft_p50_ms"] for r in rows], marker="x", ls="--",
               label=f"{kind} TTFT p50")
    for ax, title in ((a, "aggregate tokens/s"), (b, "latency, ms")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/serving"))
    ap.add_argument("--threads", type=int)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=4, help="per client and level")
    ap.add_argument("--seconds", type=float, default=60.0, help="per level, at most")
    ap.add_argument("--levels", default=",".join(map(str, CONCURRENCY)))
    ap.add_argument("--servers", default="tinyt-serve,naive")
    ap.add_argument("--prefill-chunk", type=int, help="tinyt serve --prefill-chunk")
    ap.add_argument("--naive-server", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.naive_server:
        return naive_server(str(args.artifact), 0, args.threads)
    result = run(args.artifact, args.out, threads=args.threads, max_batch=args.max_batch,
                 prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
                 requests=args.requests, seconds=args.seconds,
                 levels=tuple(int(x) for x in args.levels.split(",")),
                 servers=tuple(args.servers.split(",")), prefill_chunk=args.prefill_chunk)
    print(markdown(result))


if __name__ == "__main__":
    main()
