"""tinyt past one process on this machine: `tinyt serve` alone against `tinyt serve --ray`
with 1 and 2 replicas, and `tinyt batch` locally against --ray with 1 and 2 actors.

    serving: closed-loop clients (1, 8, 32 threads, keep-alive HTTP), each sending the same
      request REQUESTS times ──▶ requests/s, latency p50 / p99 per (server, clients); Ray's
      proxy cost per request = p50 through Ray with 1 replica at 1 client - p50 alone
    batch: ROWS texts ──▶ texts/s of `tinyt batch` locally (1 thread) and on Ray Data
      (1 and 2 actors of 1 thread), parts of 64 rows, outputs compared row by row
    ──▶ OUT/ray.json, OUT/ray.md (the command and the machine)

    python -m lab.ray_scaling --lm ARTIFACT --encoder ARTIFACT --out benchmarks/results/DIR

Every process gets one ONNX Runtime thread; Ray runs with 2 CPUs (the machine's), an 80 MiB
object store, no dashboard, on loopback.
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CLIENTS = (1, 8, 32)


def closed_loop(port: int, path: str, body: dict, clients: int, requests: int) -> dict:
    """`clients` threads each sending `body` `requests` times: requests/s and latency."""
    lat: list[float] = []
    errors = [0]

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        data = json.dumps(body)
        for _ in range(requests):
            t0 = time.perf_counter()
            conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            lat.append(time.perf_counter() - t0)
            errors[0] += r.status != 200
        conn.close()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat.sort()
    return {"clients": clients, "requests": len(lat), "errors": errors[0],
            "rps": len(lat) / wall, "p50_ms": 1e3 * statistics.median(lat),
            "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]}


def sweep(port: int, path: str, body: dict, requests: int) -> list[dict]:
    closed_loop(port, path, body, 2, 3)  # warm both sides
    return [closed_loop(port, path, body, c, max(2, requests // c)) for c in CLIENTS]


def alone(artifact: Path, path: str, body: dict, requests: int) -> list[dict]:
    proc = subprocess.Popen([sys.executable, "-m", "tinyt", "serve", str(artifact), "--port", "0",
                             "--threads", "1", "--model-id", "m"],
                            stderr=subprocess.PIPE, text=True)
    try:
        port = None
        while port is None:
            line = proc.stderr.readline()
            if not line:
                raise RuntimeError("tinyt serve exited")
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
            port = int(m.group(1)) if m else None
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        return sweep(port, path, body, requests)
    finally:
        proc.terminate()
        proc.wait(60)


def on_ray(artifact: Path, replicas: int, path: str, body: dict, requests: int) -> list[dict]:
    import socket

    from ray import serve

    from tinyt.server.ray_serve import serve_on_ray

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.shutdown()
    serve_on_ray(artifact, port=port, replicas=replicas, threads=1, model_id="m", wait=False)
    try:
        return sweep(port, path, body, requests)
    finally:
        serve.shutdown()


def batch_rates(encoder: Path, work: Path, rows: int) -> dict:
    from tinyt.app.batch import batch, read_output

    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"sentence {i}: " + "a quick fox " * (i % 9)})
                              + "\n" for i in range(rows)))
    out, rates = {}, {}
    for name, kw in (("local", {}), ("ray-1", {"ray_address": "local", "actors": 1}),
                     ("ray-2", {"ray_address": "local", "actors": 2})):
        s = batch(encoder, corpus, work / name, task="embed", part_rows=64, log=lambda s: None,
                  **kw)
        rates[name] = rows / s["seconds"]
        out[name] = [r["embedding"] for r in read_output(work / name)]
    worst = max(abs(a - b) for name in ("ray-1", "ray-2")
                for x, y in zip(out["local"], out[name]) for a, b in zip(x, y))
    return {"rows": rows, "texts_per_s": rates, "max_abs_vs_local": worst}


def run(lm: Path, encoder: Path, out: Path, *, requests: int, rows: int) -> dict:
    import ray

    from tinyt.benchmarks.environment import environment

    cases = {"lm": (lm, "/v1/completions", {"model": "m", "prompt": "def f(x):\n",
                                            "max_tokens": 16, "temperature": 0}),
             "encoder": (encoder, "/v1/embeddings",
                         {"model": "m", "input": "A man is eating food. " * 4})}
    result: dict = {"requests_per_point": requests, "serving": {}}
    for name, (art, path, body) in cases.items():
        result["serving"][name] = {"alone": alone(art, path, body, requests)}
    ray.init(num_cpus=2, object_store_memory=80 << 20, include_dashboard=False,
             log_to_driver=False)
    try:
        for name, (art, path, body) in cases.items():
            for r in (1, 2):
                result["serving"][name][f"ray-{r}"] = on_ray(art, r, path, body, requests)
        with tempfile.TemporaryDirectory() as work:
            result["batch"] = batch_rates(encoder, Path(work), rows)
    finally:
        ray.shutdown()
    for name, rows_ in result["serving"].items():
        result.setdefault("proxy_cost_ms", {})[name] = (rows_["ray-1"][0]["p50_ms"]
                                                        - rows_["alone"][0]["p50_ms"])
    result["environment"] = environment(("tinyt", "ray", "onnxruntime"))
    result["artifacts"] = {"lm": str(lm), "encoder": str(encoder)}
    return result


def markdown(result: dict, command: str) -> str:
    env = result["environment"]
    cpu = env.get("cpu", {})
    flags = [k for k in ("avx2", "avx512_vnni", "avx_vnni", "amx_int8") if cpu.get(k)]
    versions = ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items())
    lines = ["# tinyt serve alone, on Ray Serve, and tinyt batch on Ray Data\n",
             f"{cpu.get('model', '?')} ({', '.join(flags)}), {env.get('logical_cores')} cores; "
             f"{versions}; {env.get('time', '')}. The machine was shared with other work: "
             "timings are disturbed. Every server and actor runs 1 ONNX Runtime thread; the "
             "clients run on the same cores.\n",
             f"Command: `{command}`\n"]
    for name, rows in result["serving"].items():
        lines += [f"\n## {name} ({result['artifacts'][name]})\n",
                  "| server | clients | requests/s | p50 ms | p99 ms | errors |",
                  "|---|---|---|---|---|---|"]
        for server, points in rows.items():
            lines += [f"| {server} | {p['clients']} | {p['rps']:.1f} | {p['p50_ms']:.1f} | "
                      f"{p['p99_ms']:.1f} | {p['errors']} |" for p in points]
        lines.append(f"\nRay's proxy, per request at 1 client: "
                     f"{result['proxy_cost_ms'][name]:+.1f} ms")
    b = result["batch"]
    lines += ["\n## tinyt batch (embed)\n", "| run | texts/s |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in b["texts_per_s"].items()]
    lines.append(f"\n{b['rows']} rows; Ray's outputs against local: max abs "
                 f"{b['max_abs_vs_local']:.2g}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lm", type=Path, required=True)
    ap.add_argument("--encoder", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=64, help="requests per point (all clients)")
    ap.add_argument("--rows", type=int, default=2048)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result = run(args.lm, args.encoder, args.out, requests=args.requests, rows=args.rows)
    command = "python -m lab.ray_scaling " + " ".join(sys.argv[1:] if argv is None else argv)
    (args.out / "ray.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "ray.md").write_text(markdown(result, command))
    print((args.out / "ray.md").read_text())


if __name__ == "__main__":
    main()
