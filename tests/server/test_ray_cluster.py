"""tinyt on a multi-node Ray cluster (opt-in: the `cluster` marker, TINYT_CLUSTER_TESTS=1 and
the ray extra). Ray's own ray.cluster_utils.Cluster starts a head and a worker raylet on
loopback, one CPU and 80 MiB of object store each, always torn down:
  - completions and embeddings through Ray Serve's proxy equal tinyt.runtime's (greedy text
    identical; embeddings within the batching bound), answered by replicas on both nodes;
  - bad requests get the single-process server's status and body;
  - a replica killed while serving: every request in flight ends (an answer or an error),
    none hangs, and the next ones are served;
  - a worker node killed during `tinyt batch --ray`: the job completes and every input row
    is in the output exactly once (by key).
Its recorded run: benchmarks/results/ray-cluster/ (the command and the machine)."""
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(
    os.environ.get("TINYT_CLUSTER_TESTS") != "1",
    reason="a multi-node Ray cluster: run with TINYT_CLUSTER_TESTS=1 (and the ray extra: "
           "pip install 'tinyt[cpu,ray]') pytest -n 0 -m cluster tests/server/test_ray_cluster.py")]

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

import tinyt.runtime as rt  # noqa: E402
from tinyt.app import batch as b  # noqa: E402
from tinyt.server import build_app, load_engine  # noqa: E402
from tinyt.server import ray_serve as rs  # noqa: E402

STORE = 80 << 20  # bytes of object store per node: the tests move a few KB
ATOL = 1e-6  # an embedding run in another batch moves its last bits (test_server_embeddings)
TIMEOUT_S = 60  # any one request; none may take longer (nothing hangs)
PROMPTS = ["def f(x):", "import os\n", "class A:", "    return ", "x = 1\n", "for i in"]
BAD = [{"model": "lm", "prompt": "x", "max_tokens": 0.5}, {"model": "nope", "prompt": "x"},
       {"model": "lm", "prompt": "x", "logit_bias": {"1": 2}}, {"model": "lm"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body) -> tuple[int, dict, str]:
    """(status, JSON body, X-Tinyt-Replica) of one request, bounded by TIMEOUT_S."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return r.status, json.loads(r.read()), r.headers.get("x-tinyt-replica", "")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text), e.headers.get("x-tinyt-replica", "")
        except ValueError:
            return e.code, {"raw": text.decode(errors="replace")}, ""


@pytest.fixture(scope="module")
def cluster():
    from ray import serve
    from ray.cluster_utils import Cluster

    # The proxy (head node only) would keep requests on its own node's replica while that one
    # keeps up; off, it spreads them over both (docs/serving.md: a head-only proxy's cluster
    # is started so). The raylets and every process they start inherit it.
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING", "0")
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": STORE, "include_dashboard": False})
    try:
        worker = c.add_node(num_cpus=1, object_store_memory=STORE)
        c.wait_for_nodes()
        rs.connect(c.address)
        yield c, worker
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            c.shutdown()
            mp.undo()


def serving(artifact, replicas=2):
    """Serve `artifact` on the cluster (what served before shut down: a proxy keeps the
    port it started with): the proxy's URL."""
    from ray import serve

    serve.shutdown()
    return rs.serve_on_ray(artifact, port=free_port(), replicas=replicas, threads=1,
                           max_batch=4, max_queue=16, model_id="lm", wait=False)


def test_completions_equal_the_runtime_on_replicas_of_both_nodes(cluster, lm_onnx):
    url = serving(lm_onnx)
    lm = rt.load(lm_onnx, threads=1)
    prompts = PROMPTS * 4
    want = [lm.generate(p, max_new_tokens=8, temperature=0.0) for p in prompts]
    got = [None] * len(want)

    def client(k):
        for i in range(k, len(want), 6):
            got[i] = post(url + "/v1/completions", {"model": "lm", "prompt": prompts[i],
                                                     "max_tokens": 8, "temperature": 0})
    threads = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [s for s, _, _ in got] == [200] * len(want)
    assert [a["choices"][0]["text"] for _, a, _ in got] == want
    nodes = {tag.split("/")[0] for _, _, tag in got}
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2 and nodes <= alive, (sorted({t for *_, t in got}), alive)
    # the same bad requests, the same answers as one process gives
    lm_, engine, _ = load_engine(lm_onnx, threads=1, max_batch=4, max_queue=16)
    from starlette.testclient import TestClient
    with TestClient(build_app(lm_, engine, model_id="lm")) as one:
        alone = [(r.status_code, r.json()) for r in
                 (one.post("/v1/completions", json=body) for body in BAD)]
        alone.append((400, one.post("/v1/completions", content=b"{bad").json()))
    ray_side = [post(url + "/v1/completions", body)[:2] for body in BAD]
    ray_side.append(post(url + "/v1/completions", b"{bad")[:2])
    assert ray_side == alone
    assert [s for s, _ in ray_side] == [400, 404, 400, 400, 400]


def test_embeddings_equal_the_runtime(cluster, tmp_path_factory):
    from hf_fixtures import save_bert

    from tinyt.export import export_onnx
    from tinyt.hf import import_hf

    root = tmp_path_factory.mktemp("cluster-enc")
    save_bert(root / "st", num_hidden_layers=1)
    import_hf(root / "st", root / "ckpt")
    enc = export_onnx(root / "ckpt", root / "minilm")
    url = serving(enc)
    texts = [p * (1 + i % 3) for i, p in enumerate(PROMPTS * 3)]
    want = rt.load(enc, threads=1).embed(texts)
    got = []
    for t in texts:
        status, answer, _ = post(url + "/v1/embeddings", {"model": "lm", "input": t})
        assert status == 200, answer
        got.append(answer["data"][0]["embedding"])
    got = np.array(got, dtype=np.float32)
    worst = float(np.abs(got - want).max())
    cosine = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert worst <= ATOL and cosine.min() >= 0.99999, (worst, cosine.min())


def test_a_replica_killed_while_serving(cluster, lm_onnx):
    url = serving(lm_onnx)
    statuses, stop = [], threading.Event()

    def client(k):
        while not stop.is_set():
            t0 = time.monotonic()
            status, _, _ = post(url + "/v1/completions", {"model": "lm", "prompt": PROMPTS[k],
                                                          "max_tokens": 16, "temperature": 0})
            statuses.append((time.monotonic(), status, time.monotonic() - t0))
    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    time.sleep(2)
    replica = next(a for a in ray.util.list_named_actors(all_namespaces=True)
                   if a["name"].startswith("SERVE_REPLICA::"))
    killed = time.monotonic()
    ray.kill(ray.get_actor(replica["name"], namespace=replica["namespace"]), no_restart=True)
    time.sleep(8)
    stop.set()
    for t in threads:
        t.join(TIMEOUT_S + 5)
    assert not any(t.is_alive() for t in threads), "a client hangs"
    assert max(s for _, _, s in statuses) < TIMEOUT_S
    after = [code for when, code, _ in statuses if when > killed + 4]
    assert after and all(code == 200 for code in after[-8:]), after
    print(f"\nreplica killed: {len(statuses)} requests, "
          f"{sum(c != 200 for _, c, _ in statuses)} errors "
          f"({sorted({c for _, c, _ in statuses})}), slowest {max(s for *_, s in statuses):.2f} s")


def test_a_worker_node_killed_during_a_batch(cluster, lm_onnx, tmp_path):
    from ray import serve

    serve.shutdown()  # the replicas' CPUs go to the batch's actors
    c, worker = cluster
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"r{i}", "text": PROMPTS[i % 6] * (1 + i % 3)})
                              + "\n" for i in range(600)))
    out, result = tmp_path / "out", {}

    def job():
        result["summary"] = b.batch(lm_onnx, corpus, out, task="generate", part_rows=10,
                                    ray_address=c.address, actors=2,
                                    options={"max_tokens": 16}, log=lambda s: None)
    runner = threading.Thread(target=job)
    runner.start()
    deadline = time.monotonic() + 120
    while len(list(out.glob("part-*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    done_at_kill = len(list(out.glob("part-*")))
    c.remove_node(worker)  # its actor and the blocks it held are gone
    c.add_node(num_cpus=1, object_store_memory=STORE)  # the replacement a cluster would bring
    runner.join(300)
    assert not runner.is_alive(), "the batch hangs after the node was lost"
    assert 4 <= done_at_kill < 60, done_at_kill
    rows = [r["row"] for r in b.read_output(out)]
    assert sorted(rows) == list(range(600)) and len(rows) == 600
    lm = rt.load(lm_onnx, threads=1)
    first = lm.generate_details([PROMPTS[i % 6] * (1 + i % 3) for i in range(10)],
                                max_new_tokens=16, temperature=0.0)
    assert [r["text"] for r in b.read_output(out)[:10]] == [r.text for r in first]
    print(f"\nworker node killed after {done_at_kill}/60 parts: the job completed, "
          f"600 rows once each ({result['summary']['seconds']:.1f} s)")
