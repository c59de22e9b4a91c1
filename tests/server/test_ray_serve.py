"""`tinyt serve --ray`'s code without a cluster (the default run): the Replica each Ray Serve
replica holds answers through the very handlers of `tinyt serve` (the same bodies, the same
errors), tags its answers, fails its health check when the engine's thread dies, refuses an
artifact whose manifest differs from the driver's; the deployment's options (a count or
autoscaling, health, drain) and the CLI's refusals. The Ray application is built where Ray is
importable; tests/server/test_ray_cluster.py serves it on a multi-node cluster (opt-in)."""

import os

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
pytest.importorskip("httpx", reason="starlette's TestClient needs httpx (the dev extra)")

from conftest import run_tinyt  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from tinyt.errors import ConfigError  # noqa: E402
from tinyt.server import build_app, load_engine  # noqa: E402
from tinyt.server import ray_serve as rs  # noqa: E402

OPTIONS = {"threads": 1, "max_batch": 4, "max_queue": 8, "model_id": "lm"}
BODIES = [("/v1/completions", {"model": "lm", "prompt": "def f(x):", "max_tokens": 8,
                               "temperature": 0}),
          ("/v1/completions", {"model": "lm", "prompt": "x", "max_tokens": 0.5}),
          ("/v1/completions", {"model": "nope", "prompt": "x"}),
          ("/v1/embeddings", {"model": "lm", "input": "x"}),
          ("/v1/completions", {"model": "lm", "prompt": "x", "logit_bias": {"1": 2}})]


def answers(app, bodies=BODIES):
    """(status, body without its id and time) of each request, the app started and stopped."""
    with TestClient(app) as client:
        got = []
        for path, body in bodies:
            r = client.post(path, json=body)
            data = r.json()
            for key in ("id", "created"):
                data.pop(key, None)
            got.append((r.status_code, data, r.headers.get("x-tinyt-replica")))
        assert client.get("/health").status_code == 200
    return got


def test_a_replica_answers_as_the_single_process_server(lm_onnx):
    replica = rs.Replica(str(lm_onnx), rs.manifest_digest(lm_onnx), dict(OPTIONS))
    through_ray = answers(replica.__serve_build_asgi_app__())
    options = {k: v for k, v in OPTIONS.items() if k != "model_id"}
    lm, engine, _ = load_engine(lm_onnx, **options)
    alone = answers(build_app(lm, engine, model_id="lm"))
    assert [s for s, _, _ in through_ray] == [200, 400, 404, 400, 400]
    assert [(s, d) for s, d, _ in through_ray] == [(s, d) for s, d, _ in alone]
    assert {tag for _, _, tag in through_ray} == {replica.tag.decode()}
    assert replica.tag.decode().startswith("local/")
    assert not replica.server.engine.alive  # the app's lifespan stopped it (a drained replica)


def test_the_health_check_fails_once_the_engine_thread_is_gone(lm_onnx):
    replica = rs.Replica(str(lm_onnx), rs.manifest_digest(lm_onnx), dict(OPTIONS))
    replica.check_health()  # not started yet: nothing to fail
    replica.server.engine.start()
    replica.server.ready = True
    replica.check_health()
    replica.server.engine.stop(timeout=30)
    with pytest.raises(RuntimeError, match="the engine's thread has stopped"):
        replica.check_health()


def test_a_replica_refuses_another_artifact_than_the_drivers(lm_onnx, tmp_path):
    with pytest.raises(ConfigError, match="has manifest sha256 .*, the driver's 0123456789ab: "
                                          "every node must see the same artifact"):
        rs.Replica(str(lm_onnx), "0123456789ab" * 5, dict(OPTIONS))
    assert rs.manifest_digest(tmp_path) == "missing"


def test_deployment_options_a_count_or_autoscaling():
    fixed = rs.deployment_options(replicas=3, min_replicas=None, max_replicas=None, threads=2,
                                  max_batch=None, max_queue=64)
    assert fixed["num_replicas"] == 3 and fixed["ray_actor_options"] == {"num_cpus": 2}
    assert fixed["max_ongoing_requests"] == 8 + 64  # a full batch and queue, past Ray's 5
    assert fixed["graceful_shutdown_timeout_s"] == 30.0
    auto = rs.deployment_options(replicas=None, min_replicas=1, max_replicas=4, threads=None,
                                 max_batch=4, max_queue=8)
    assert auto["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4,
                                          "target_ongoing_requests": rs.TARGET_ONGOING}
    assert "num_replicas" not in auto
    with pytest.raises(ConfigError, match="not both"):
        rs.deployment_options(replicas=2, min_replicas=1, max_replicas=None, threads=1,
                              max_batch=None, max_queue=1)
    with pytest.raises(ConfigError, match="--max-replicas 1 must be >= 1 and >= --min-replicas 3"):
        rs.deployment_options(replicas=None, min_replicas=3, max_replicas=1, threads=1,
                              max_batch=None, max_queue=1)


def test_the_ray_application_binds_the_replica(lm_onnx):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    options = rs.deployment_options(replicas=2, min_replicas=None, max_replicas=None,
                                    threads=1, max_batch=4, max_queue=8)
    app = rs.application(lm_onnx, deployment=options, engine=OPTIONS)
    dep = app._bound_deployment
    assert (dep.name, dep.num_replicas) == ("tinyt", 2)
    assert dep.func_or_class.__mro__[1] is rs.Replica
    assert dep.init_args[:2] == (str(lm_onnx.resolve()), rs.manifest_digest(lm_onnx))


def test_an_unreachable_cluster_is_one_line_at_once():
    with pytest.raises(ConfigError, match="cannot reach the Ray cluster at 127.0.0.1:1: "):
        rs.reachable("127.0.0.1:1")
    with pytest.raises(ConfigError, match="give HOST:PORT"):
        rs.reachable("nowhere")


def test_the_cli_refuses_ray_options_without_ray(lm_onnx):
    r = run_tinyt("serve", lm_onnx, "--replicas", "2", "--port", "0")
    assert r.returncode == 2 and "--replicas only apply with --ray" in r.stderr
    r = run_tinyt("serve", lm_onnx / "nothing", "--ray")
    assert r.returncode == 2, r.stderr
    assert ("no manifest.json" in r.stderr or "the ray extra" in r.stderr), r.stderr


def test_a_local_cluster_s_proxy_drains_in_a_second_and_a_user_s_value_is_kept(monkeypatch):
    """serve.shutdown waits 30 s for Ray Serve's controller, whose proxy drains for 30 s by
    default: the local cluster `tinyt serve --ray` starts gets 1 s (before ray.init starts it);
    a cluster at an address keeps its own."""
    ray = pytest.importorskip("ray")
    seen = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append(
        os.environ.get("RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S")))
    monkeypatch.delenv("RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S", raising=False)
    rs.connect("auto")
    rs.connect(None)
    assert seen == [None, "1"]
    monkeypatch.setenv("RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S", "7")
    rs.connect(None)
    assert seen[-1] == "7"
