"""guidellm (PyPI, a load generator no one here wrote) drives `tinyt serve` through a rate
sweep; its own report is kept beside a short summary.

    tinyt serve ARTIFACT (a process of its own on a free loopback port: benchmarks/serving.py's
    Server, model id "m") ── one greedy completion of exactly NEW tokens answered? ──▶
    guidellm run (its own venv, .venv-guidellm: scripts/setup-guidellm.sh)
        --profile sweep: synchronous (one request at a time), throughput (all at once, at most
                  MAX_CONCURRENCY in flight), then RATES - 2 constant rates evenly between the
                  two rates those measured
        --data synthetic_text: prompts of PROMPT tokens, counted by the artifact's own
                  tokenizer (guidellm's hf_auto tokenizer loads the artifact directory)
        each request: streamed /v1/completions, max_tokens = min_tokens = NEW, temperature 0
        each rate: REQUESTS requests or SECONDS seconds, whichever ends first
    ──▶ OUT/guidellm.json.gz (guidellm's report, gzipped: ~100 KB a rate, mostly its
        distributions; `gunzip -k` gives the JSON that `guidellm export` reads),
        OUT/guidellm.log (its console tables), OUT/guidellm.md (per rate: requests/s, output
        tokens/s, TTFT and ITL p50/p99; the commands, CPU, versions)

    bash scripts/setup-guidellm.sh
    .venv/bin/python -m benchmarks.guidellm_sweep ARTIFACT --out benchmarks/results/guidellm-<cpu>

Exactly NEW tokens through min_tokens: given an output length in its data guidellm sends vLLM's
`ignore_eos`, which tinyt serve takes too (since this script was written); the length goes in
the backend's max_tokens and the body's min_tokens, which asks the same of any server.

guidellm runs WORKERS worker processes (1 by default, each an asyncio loop holding many
requests in flight): on a machine of few cores the load generator shares them with the server.

guidellm's ITL is per request, (last token - first token) / (tokens - 1), and its p50/p99 are
over requests; benchmarks/serving.py's TBT percentiles are over every gap between tokens, so
its p99 catches single long gaps this one averages away.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDELLM = ROOT / ".venv-guidellm" / "bin" / "guidellm"
REPORT, LOG, SUMMARY = "guidellm.json.gz", "guidellm.log", "guidellm.md"
CPU_FLAGS = ("amx_int8", "avx2", "avx512_vnni")  # as grep -o -w -E "...": which int8 units
SAMPLE_SIZE = 4  # requests a rate whose own record guidellm's report keeps (its metrics
# are over every request)


def _value(path: Path) -> str:
    """A path as a value of guidellm's key=value options: those split on commas, then read
    each value as YAML (so a single-quoted string keeps '#' or ': ' literal)."""
    text = str(path.resolve())
    if "," in text:
        raise ValueError(f"{text!r} holds a comma, which guidellm's key=value options split "
                         "on; use a path without one")
    if re.fullmatch(r"/[\w./+@-]*", text):  # YAML reads it back as this string
        return text
    return "'" + text.replace("'", "''") + "'"


def command(guidellm: Path, port: int, artifact: Path, report: Path, *, prompt_tokens: int,
            new_tokens: int, rates: int, requests: int, seconds: float,
            max_concurrency: int, seed: int = 42) -> list[str]:
    """guidellm's command line for the sweep (the module docstring) against tinyt serve on
    `port`, writing its JSON report to `report`."""
    return [str(guidellm), "run",
            "--backend", f"kind=openai_http,target=http://127.0.0.1:{port},model=m,"
                         f"request_format=/v1/completions,max_tokens={new_tokens},"
                         f"extras.body.min_tokens={new_tokens},extras.body.temperature=0",
            "--profile", f"kind=sweep,sweep_size={rates},max_concurrency={max_concurrency}",
            "--data", f"kind=synthetic_text,prompt_tokens={prompt_tokens}",
            "--tokenizer", f"kind=hf_auto,model={_value(artifact)}",
            "--constraint", f"kind=max_requests,count={requests}",
            "--constraint", f"kind=max_duration,seconds={seconds:g}",
            "--metrics", f"kind=generative,sample_size={SAMPLE_SIZE}",
            "--seed", f"kind=static,value={seed}",
            "--output", f"kind=json,path={_value(report)}",
            "--disable-console-interactive"]


def check(port: int, prompt: str, new_tokens: int) -> str:
    """One greedy completion as guidellm's requests ask for it (max_tokens = min_tokens):
    its text, after checking that the server made exactly `new_tokens` tokens."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        c.request("POST", "/v1/completions", body=json.dumps({
            "model": "m", "prompt": prompt, "max_tokens": new_tokens,
            "min_tokens": new_tokens, "temperature": 0}),
            headers={"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
    finally:
        c.close()
    if r.status != 200:
        raise RuntimeError(f"tinyt serve answered HTTP {r.status}: {body[:300]!r}")
    got = json.loads(body)
    made = got["usage"]["completion_tokens"]
    if made != new_tokens:
        raise RuntimeError(f"tinyt serve made {made} tokens for max_tokens = min_tokens = "
                           f"{new_tokens}")
    return got["choices"][0]["text"]


def cpu() -> dict:
    """The CPU's model name and which of CPU_FLAGS it has (/proc/cpuinfo; Linux)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": platform.processor() or platform.machine(), "flags": []}
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), platform.machine())
    words = set(info.split())
    return {"model": model, "flags": [f for f in CPU_FLAGS if f in words]}


def guidellm_versions(guidellm: Path) -> dict:
    """Versions in guidellm's venv (the python beside its executable), {} if there is none."""
    python = guidellm.parent / "python"
    if not python.exists():
        return {}
    code = ("import importlib.metadata as m, json; print(json.dumps({d: m.version(d) for d in "
            "('guidellm', 'transformers', 'tokenizers', 'torch')}))")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def _label(strategy: dict) -> str:
    kind = strategy["type_"]
    return f"constant {strategy['rate']:.2f}/s" if "rate" in strategy else kind


def rows(report: dict) -> list[dict]:
    """Per benchmark of guidellm's report, in its order: the strategy, and over successful
    requests the means of requests/s and output tokens/s, TTFT and ITL p50/p99 in ms, and the
    median prompt and output tokens the server counted."""
    def stat(m: dict, name: str, key: str = "mean") -> float:
        s = m[name]["successful"]
        return s[key] if key in s else s["percentiles"][key]
    out = []
    for b in report["benchmarks"]:
        m = b["metrics"]
        out.append({"strategy": _label(b["config"]["strategy"]),
                    "completed": m["request_totals"]["successful"],
                    "errored": m["request_totals"]["errored"],
                    "requests_per_s": stat(m, "requests_per_second"),
                    "output_tokens_per_s": stat(m, "output_tokens_per_second"),
                    "concurrency": stat(m, "request_concurrency"),
                    "ttft_p50_ms": stat(m, "time_to_first_token_ms", "p50"),
                    "ttft_p99_ms": stat(m, "time_to_first_token_ms", "p99"),
                    "itl_p50_ms": stat(m, "inter_token_latency_ms", "p50"),
                    "itl_p99_ms": stat(m, "inter_token_latency_ms", "p99"),
                    "prompt_tokens": stat(m, "prompt_token_count", "median"),
                    "output_tokens": stat(m, "output_token_count", "median")})
    return out


def markdown(report: dict, info: dict) -> str:
    """The summary: what ran, where, and one row per rate of the sweep."""
    c, v = info["cpu"], info["versions"]
    lines = [f"# guidellm rate sweep against tinyt serve ({info['artifact_name']})", "",
             f"{c['model']}; {', '.join(c['flags']) or 'none of ' + ', '.join(CPU_FLAGS)}; "
             f"{info['logical_cores']} logical cores; {info['time']}", "",
             f"guidellm {v.get('guidellm')} (transformers {v.get('transformers')}, torch "
             f"{v.get('torch')}) in its own venv; tinyt {v.get('tinyt')}, onnxruntime "
             f"{v.get('onnxruntime')}, python {info['python']}.", "",
             f"Streamed /v1/completions of {info['prompt_tokens']} prompt tokens (guidellm's "
             f"synthetic text, counted by the artifact's tokenizer) and exactly "
             f"{info['new_tokens']} new ones (max_tokens = min_tokens, greedy); tinyt serve "
             f"with max batch {info['max_batch']}, threads {info['threads'] or 'its default'}. "
             f"Each rate: at most {info['requests']} requests or {info['seconds']:g} s, at "
             f"most {info['max_concurrency']} in flight, from {info['workers']} guidellm worker "
             f"process{'es' if info['workers'] > 1 else ''}. "
             "Means over each rate's successful requests; percentiles over requests (ITL: a "
             "request's mean gap between tokens).", "",
             "| rate | done | errors | requests/s | output tokens/s | concurrency | "
             "TTFT p50 ms | TTFT p99 | ITL p50 ms | ITL p99 | prompt / output tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows(report):
        lines.append(f"| {r['strategy']} | {r['completed']} | {r['errored']} | "
                     f"{r['requests_per_s']:.2f} | {r['output_tokens_per_s']:.1f} | "
                     f"{r['concurrency']:.1f} | {r['ttft_p50_ms']:.1f} | "
                     f"{r['ttft_p99_ms']:.1f} | {r['itl_p50_ms']:.2f} | {r['itl_p99_ms']:.2f} | "
                     f"{r['prompt_tokens']:g} / {r['output_tokens']:g} |")
    lines += ["", "Commands:", "", "```", info["command"], shlex.join(info["guidellm_command"]),
              "```"]
    return "\n".join(lines) + "\n"


def run(artifact: Path, out: Path, *, guidellm: Path = GUIDELLM, threads: int | None = None,
        max_batch: int = 16, prompt_tokens: int = 32, new_tokens: int = 32, rates: int = 8,
        requests: int = 200, seconds: float = 30.0, max_concurrency: int = 64,
        workers: int = 1, argv: list[str] | None = None) -> dict:
    """Serve `artifact`, sweep it with guidellm, write OUT/guidellm.{json.gz,log,md}; the
    summary's rows and what ran."""
    import gzip
    import time

    from tinyt.manifest import read_model_config

    from .environment import environment
    from .serving import Server, _prompts

    if not guidellm.is_file():
        raise FileNotFoundError(f"no guidellm at {guidellm}: run `bash scripts/setup-guidellm.sh`"
                                " (its own venv, .venv-guidellm) or give --guidellm PATH")
    cfg, _ = read_model_config(artifact)
    if prompt_tokens + new_tokens > cfg.block_size:
        raise ValueError(f"{prompt_tokens} prompt + {new_tokens} new tokens do not fit the "
                         f"model's context of {cfg.block_size}; lower --prompt-tokens or "
                         "--new-tokens")
    if max_concurrency > 256:  # Server starts tinyt serve with --max-queue 256
        raise ValueError(f"--max-concurrency {max_concurrency}: at most 256, the queue "
                         "benchmarks/serving.py's Server gives tinyt serve")
    out.mkdir(parents=True, exist_ok=True)
    report = out / "guidellm.json"  # as guidellm writes it; gzipped when it is done
    report.unlink(missing_ok=True)
    env = environment(("tinyt", "onnxruntime", "numpy", "starlette", "uvicorn"))
    info = {"artifact": str(artifact), "artifact_name": artifact.resolve().name,
            "cpu": cpu(), "logical_cores": env["logical_cores"], "python": env["python"],
            "time": env["time"], "versions": {**env["versions"], **guidellm_versions(guidellm)},
            "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "rates": rates,
            "requests": requests, "seconds": seconds, "max_batch": max_batch,
            "threads": threads, "max_concurrency": max_concurrency, "workers": workers,
            "command": shlex.join(["python", "-m", "benchmarks.guidellm_sweep",
                                   *(argv if argv is not None else [str(artifact)])])}
    prompt = _prompts(artifact, 1, prompt_tokens)[0]
    server = Server("tinyt-serve", artifact, threads, max_batch)
    try:
        info["check_text"] = check(server.port, prompt, new_tokens)
        cmd = command(guidellm, server.port, artifact, report, prompt_tokens=prompt_tokens,
                      new_tokens=new_tokens, rates=rates, requests=requests, seconds=seconds,
                      max_concurrency=max_concurrency)
        info["guidellm_command"] = cmd
        # each rate ends by its own bounds; this only stops a guidellm that hangs
        limit = rates * (seconds + 120) + 300
        t0 = time.perf_counter()
        env = {**os.environ, "HF_HUB_OFFLINE": "1",
               "GUIDELLM__MAX_WORKER_PROCESSES": str(workers)}
        with open(out / LOG, "w") as log:
            done = subprocess.run(cmd, cwd=out, stdout=log, stderr=subprocess.STDOUT, env=env,
                                  timeout=limit)
        info["guidellm_seconds"] = round(time.perf_counter() - t0, 1)
    finally:
        info["server_exit_status"] = server.stop()
    if done.returncode != 0 or not report.is_file():
        raise RuntimeError(f"guidellm exited {done.returncode}; its output: {out / LOG}")
    raw = report.read_bytes()
    data = json.loads(raw)
    (out / REPORT).write_bytes(gzip.compress(raw, 9, mtime=0))
    report.unlink()
    info["versions"].setdefault("guidellm", data["metadata"].get("guidellm_version"))
    (out / SUMMARY).write_text(markdown(data, info))
    return {"rows": rows(data), "info": info}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", type=Path, help="a shared-cache artifact (tinyt serve's)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--guidellm", type=Path, default=GUIDELLM,
                    help="guidellm's executable (default .venv-guidellm/bin/guidellm)")
    ap.add_argument("--threads", type=int, help="tinyt serve --threads")
    ap.add_argument("--max-batch", type=int, default=16, help="tinyt serve --max-batch")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rates", type=int, default=8, help="guidellm's sweep_size: synchronous, "
                    "throughput and RATES - 2 constant rates between them")
    ap.add_argument("--requests", type=int, default=200, help="per rate, at most")
    ap.add_argument("--seconds", type=float, default=30.0, help="per rate, at most")
    ap.add_argument("--max-concurrency", type=int, default=64,
                    help="requests in flight at most (the throughput rate sends all at once)")
    ap.add_argument("--workers", type=int, default=1, help="guidellm's worker processes")
    args = ap.parse_args(argv)
    r = run(args.artifact, args.out, guidellm=args.guidellm, threads=args.threads,
            max_batch=args.max_batch, prompt_tokens=args.prompt_tokens,
            new_tokens=args.new_tokens, rates=args.rates, requests=args.requests,
            seconds=args.seconds, max_concurrency=args.max_concurrency,
            workers=args.workers, argv=argv)
    print((args.out / SUMMARY).read_text())
    print(f"guidellm took {r['info']['guidellm_seconds']} s; its report: {args.out / REPORT}")


if __name__ == "__main__":
    main()
