"""`tinyt serve ARTIFACT --ray`: the same server on Ray Serve replicas (the `ray` extra).

    client ─HTTP─▶ Ray Serve's proxy (head node, or every node) ─▶ a replica, on any node
      replica = Replica: load_engine(ARTIFACT) once (server/__init__.py), the manifest's
                sha256 checked against the driver's; its ASGI app is OpenAIServer(...).app(),
                the very handlers of `tinyt serve` (mounted by @serve.ingress: one
                implementation of the routes), the engine started and drained by the app's
                lifespan as in one process
      health    Ray calls check_health every HEALTH_PERIOD_S: an engine thread that died
                fails it and Ray replaces the replica
      scale     --replicas N, or --min-replicas / --max-replicas: Ray's autoscaling on ongoing
                requests per replica (TARGET_ONGOING); a replica scaled down stops taking
                requests and finishes those it holds (graceful_shutdown_timeout_s =
                STOP_TIMEOUT_S, the engine's own drain)

Every node must see the artifact at the same path (a shared file system: NFS, a mounted
bucket; fetching remote URIs is the user's storage, docs/serving.md): `serve_on_ray` hashes
manifest.json on every alive node first and refuses to start, naming the nodes, where a hash
differs or the file is missing. Nothing below the server floor imports Ray.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from tinyt.errors import ConfigError

from . import load_engine, server_for
from .handlers import STOP_TIMEOUT_S, OpenAIServer

HEALTH_PERIOD_S = 10.0
TARGET_ONGOING = 8.0  # ongoing requests per replica Ray's autoscaler aims at (a full batch)


def manifest_digest(artifact: str | os.PathLike) -> str:
    """sha256 of ARTIFACT/manifest.json ('missing' where the node cannot read it): the
    manifest lists every file's sha256, so equal digests mean the same artifact."""
    try:
        return hashlib.sha256((Path(artifact) / "manifest.json").read_bytes()).hexdigest()
    except OSError:
        return "missing"


class Replica:
    """What one Ray Serve replica holds: the artifact loaded once, its engine, and the
    OpenAIServer whose app Ray mounts (usable without Ray: the tests call it directly)."""

    def __init__(self, artifact: str, digest: str, options: dict[str, Any]):
        here = manifest_digest(artifact)
        if here != digest:
            raise ConfigError(f"{artifact} on this node ({os.uname().nodename}) has manifest "
                              f"sha256 {here[:12]}, the driver's {digest[:12]}: every node must "
                              "see the same artifact")
        model_id, api_key = options.pop("model_id", None), options.pop("api_key", None)
        lm, engine, _ = load_engine(artifact, **options)
        self.server = server_for(lm, engine, model_id=model_id or Path(artifact).name,
                                 api_key=api_key, max_queue=options.get("max_queue", 64))
        self.tag = f"{ray_node()}/{os.getpid()}".encode()

    def __serve_build_asgi_app__(self):
        """The ASGI app Ray Serve's ingress mounts: tinyt's own routes, each answer with an
        X-Tinyt-Replica header (the Ray node id / the replica's process id)."""
        app = self.server.app()

        async def tagged(scope, receive, send):
            async def send_tagged(message):
                if message["type"] == "http.response.start":
                    message["headers"] = [*message.get("headers", []),
                                          (b"x-tinyt-replica", self.tag)]
                await send(message)
            await app(scope, receive, send_tagged)
        return tagged

    def check_health(self) -> None:
        """Ray's health check: the engine's thread must run once the app started."""
        if isinstance(self.server, OpenAIServer) and self.server.ready \
                and not self.server.engine.alive:
            raise RuntimeError("the engine's thread has stopped")


def ray_node() -> str:
    """The Ray node this process runs on ('local' outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
    except ImportError:
        return "local"


def deployment_options(*, replicas: int | None, min_replicas: int | None,
                       max_replicas: int | None, threads: int | None,
                       max_batch: int | None, max_queue: int) -> dict[str, Any]:
    """serve.deployment's options: a fixed count or autoscaling, one CPU per engine thread,
    room for a full batch and queue per replica, health checks and a graceful drain."""
    if replicas is not None and (min_replicas is not None or max_replicas is not None):
        raise ConfigError("give --replicas N, or --min-replicas / --max-replicas (autoscaling), "
                          "not both")
    for name, value in (("replicas", replicas), ("min_replicas", min_replicas),
                        ("max_replicas", max_replicas)):
        if value is not None and not (isinstance(value, int) and value >= 0):
            raise ConfigError(f"{name}={value!r} must be an integer >= 0")
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": threads or 1},
        # Ray's default (5) would cut a replica's batch; the engine answers 429 past its queue
        "max_ongoing_requests": (max_batch or 8) + max_queue,
        "health_check_period_s": HEALTH_PERIOD_S,
        "health_check_timeout_s": 3 * HEALTH_PERIOD_S,
        "graceful_shutdown_timeout_s": STOP_TIMEOUT_S,
        "graceful_shutdown_wait_loop_s": 1.0,
    }
    if min_replicas is None and max_replicas is None:
        options["num_replicas"] = 1 if replicas is None else replicas
        if options["num_replicas"] < 1:
            raise ConfigError("--replicas must be at least 1")
        return options
    low, high = min_replicas or 0, max_replicas or max(1, min_replicas or 1)
    if high < max(low, 1):
        raise ConfigError(f"--max-replicas {high} must be >= 1 and >= --min-replicas {low}")
    options["autoscaling_config"] = {"min_replicas": low, "max_replicas": high,
                                     "target_ongoing_requests": TARGET_ONGOING}
    return options


def application(artifact: str | os.PathLike, *, deployment: dict[str, Any],
                engine: dict[str, Any]):
    """The Ray Serve application: Replica behind @serve.ingress, bound to the artifact (an
    absolute path every node sees) and the driver's manifest digest."""
    from ray import serve

    path = str(Path(artifact).resolve())
    cls = serve.deployment(name="tinyt", **deployment)(serve.ingress()(Replica))
    return cls.bind(path, manifest_digest(path), dict(engine))


def check_nodes(artifact: str) -> dict[str, str]:
    """Every alive node's manifest digest of `artifact` (a task pinned to each node);
    ConfigError naming those that differ from this machine's or cannot read it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    digest = ray.remote(num_cpus=0)(manifest_digest)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [digest.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        n["NodeID"], soft=False)).remote(artifact) for n in nodes]
    seen = {n["NodeManagerAddress"] + "/" + n["NodeID"][:8]: d
            for n, d in zip(nodes, ray.get(refs, timeout=120))}
    want = manifest_digest(artifact)
    wrong = {node: d[:12] for node, d in seen.items() if d != want}
    if want == "missing" or wrong:
        raise ConfigError(f"{artifact}: manifest.json's sha256 here is {want[:12]}, but "
                          f"{wrong or 'this machine cannot read it'}; every node must see the "
                          "same artifact at the same path (a shared file system)")
    return seen


CONNECT_TIMEOUT_S = 5.0
# A cluster this process starts (no --ray-address) ends with it: Ray Serve's proxy otherwise
# drains for RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S (30 s) after its last request, longer than
# serve.shutdown's 30-s wait, so a SIGTERM took 40 s to exit (4.5 s with 1 s, measured: a
# 1-replica GPT-2-form artifact on a 2-core EPYC). It still waits for requests in flight.
LOCAL_PROXY_DRAIN_S = "1"


def reachable(address: str) -> None:
    """ConfigError unless HOST:PORT (or ray://HOST:PORT) of a Ray cluster accepts a TCP
    connection within CONNECT_TIMEOUT_S: ray.init itself retries an unreachable address for
    minutes."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--ray-address {address!r}: give HOST:PORT (the head's GCS, 6379 "
                          "by default) or ray://HOST:10001")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ConfigError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}; start "
                          "one with `ray start --head` or check the address") from None


def connect(address: str | None, **init: Any) -> None:
    """ray.init on `address` (None: a new local cluster), or ConfigError saying it cannot be
    reached; nothing where this process is connected already."""
    import ray

    if ray.is_initialized():
        return
    if address not in (None, "auto"):
        reachable(address)
    if address is None:  # read by the local cluster's processes (a user's value is kept)
        os.environ.setdefault("RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S", LOCAL_PROXY_DRAIN_S)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, **init)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ConfigError(f"cannot reach the Ray cluster at {address or 'a new local one'}: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}; start "
                          "one with `ray start --head` or give --ray-address") from None


def serve_on_ray(artifact, *, address: str | None = None, host: str = "127.0.0.1",
                 port: int = 8000, replicas: int | None = None, min_replicas: int | None = None,
                 max_replicas: int | None = None, proxy_on: str = "head",
                 wait: bool = True, **engine: Any) -> str:
    """Serve `artifact` on Ray Serve (a cluster at `address`, or a new local one) with the
    routes of `tinyt serve`; returns the proxy's URL once every replica is ready, after
    serving until SIGTERM / Ctrl-C where `wait`. engine: load_engine's options and
    model_id, api_key. proxy_on: 'head' or 'every-node' (Ray's proxy on each node)."""
    import signal
    import sys
    import threading

    from ray import serve

    if proxy_on not in ("head", "every-node"):
        raise ConfigError(f"proxy_on={proxy_on!r}: choose 'head' or 'every-node'")
    if not (Path(artifact) / "manifest.json").is_file():
        raise ConfigError(f"{artifact} is not an artifact directory (no manifest.json)")
    options = deployment_options(replicas=replicas, min_replicas=min_replicas,
                                 max_replicas=max_replicas, threads=engine.get("threads"),
                                 max_batch=engine.get("max_batch"),
                                 max_queue=engine.get("max_queue", 64))
    path = str(Path(artifact).resolve())
    connect(address)
    check_nodes(path)
    serve.start(http_options={"host": host, "port": port,
                              "location": "HeadOnly" if proxy_on == "head" else "EveryNode"})
    serve.run(application(path, deployment=options, engine=engine), name="tinyt",
              route_prefix="/")
    url = f"http://{host}:{port}"
    how = (f"{options['num_replicas']} replicas" if "num_replicas" in options else
           "{min_replicas}..{max_replicas} replicas (autoscaling)".format(
               **options["autoscaling_config"]))
    print(f"tinyt serve: {Path(path).name} on {url} (Ray Serve, {how})", file=sys.stderr,
          flush=True)
    if not wait:
        return url
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:  # the replicas drain what they hold (graceful_shutdown_timeout_s)
        serve.shutdown()
    return url
