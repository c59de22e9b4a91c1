"""Scaling out: two replicas of a tinyt model behind Ray Serve, on this machine, serving the
same requests with the same outputs as one process does.

    Ray Serve (its HTTP proxy on a free loopback port, round-robin over the replicas)
      └─ deployment TinytLM, num_replicas=2; each replica: tinyt.runtime.load(ARTIFACT) and
         the continuous-batching Engine (tinyt.runtime.engine), one thread per replica
    client: N greedy completions over HTTP, from 4 threads ──▶ each answer's text and the
    replica (process id) that made it; the same N run by tinyt.runtime in this process
    ──▶ identical texts, both replicas used ──▶ OUT/replicas.md, OUT/replicas.json

    python -m lab.replicas_ray ARTIFACT --out benchmarks/results/replicas-ray

Ray is not a dependency of tinyt (nor of its tests: it is heavy, and starts a cluster): this
runs in an environment with `ray[serve]` and `tinyt[cpu,serve]` installed
(docs/serving.md says how); its recorded output is committed.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path


def deployment(artifact: str):
    from ray import serve

    @serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 1})
    class TinytLM:
        def __init__(self, artifact: str):
            import tinyt.runtime as rt
            from tinyt.runtime.engine import Engine

            self.lm = rt.load(artifact, threads=1)
            self.engine = Engine(self.lm, max_batch=8).start()

        async def __call__(self, request):
            import asyncio

            from tinyt.runtime.sampling import SamplingParams

            body = await request.json()
            ids = self.lm.tokenizer.encode_prompt(body["prompt"])
            req = self.engine.submit(ids, SamplingParams(max_new_tokens=body["max_tokens"],
                                                         temperature=0.0))
            done = await asyncio.to_thread(req.wait, 120)
            return {"text": done.text, "finish_reason": done.finish_reason,
                    "replica": os.getpid()}

    return TinytLM.bind(artifact)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(artifact: Path, out: Path, *, requests: int = 24, max_tokens: int = 16) -> dict:
    import ray
    from ray import serve

    import tinyt.runtime as rt
    from tinyt.benchmarks.environment import environment

    lm = rt.load(artifact, threads=1)
    prompts = [["def ", "import os\n", "class ", "    return ", "x = "][i % 5] * (1 + i % 3)
               for i in range(requests)]
    alone = [lm.generate(p, max_new_tokens=max_tokens) for p in prompts]
    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment(str(artifact.resolve())), route_prefix="/")
        answers: list = [None] * requests

        def client(k: int) -> None:
            for i in range(k, requests, 4):
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                c.request("POST", "/", body=json.dumps({"prompt": prompts[i],
                                                        "max_tokens": max_tokens}))
                answers[i] = json.loads(c.getresponse().read())
                c.close()
        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    finally:
        serve.shutdown()
        ray.shutdown()
    replicas = sorted({a["replica"] for a in answers})
    result = {"artifact": str(artifact), "requests": requests, "max_tokens": max_tokens,
              "replicas": len(replicas),
              "served_by": {str(r): sum(a["replica"] == r for a in answers) for r in replicas},
              "identical_to_one_process": all(a["text"] == w for a, w in zip(answers, alone)),
              "seconds": wall, "environment": environment(("tinyt", "ray", "onnxruntime")),
              "answers": [{"prompt": p, "text": a["text"], "replica": a["replica"]}
                          for p, a in zip(prompts, answers)]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "replicas.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "replicas.md").write_text(
        f"# Two tinyt replicas behind Ray Serve\n\nRay {ray.__version__}, {artifact}, "
        f"{result['environment']['time']}: {requests} greedy completions of {max_tokens} "
        f"tokens from 4 client threads through Ray Serve's HTTP proxy; served by "
        f"{len(replicas)} replicas "
        f"({', '.join(f'{n} by pid {r}' for r, n in result['served_by'].items())}) in "
        f"{wall:.1f} s; every text identical to tinyt.runtime's in one process: "
        f"{result['identical_to_one_process']}.\n\nCommand: `python -m lab.replicas_ray "
        f"{artifact} --out {out}`\n")
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/replicas-ray"))
    ap.add_argument("--requests", type=int, default=24)
    args = ap.parse_args(argv)
    result = run(args.artifact, args.out, requests=args.requests)
    print((args.out / "replicas.md").read_text())
    if not (result["identical_to_one_process"] and result["replicas"] == 2):
        sys.exit(1)


if __name__ == "__main__":
    main()
