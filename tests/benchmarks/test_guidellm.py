"""benchmarks/guidellm_sweep.py: the guidellm command line it builds, the summary it reads from
guidellm's report, and (opt-in: guidellm lives in .venv-guidellm, which CI does not make) the
sweep itself against `tinyt serve` at the tiny model's size.

data/guidellm-report.json is guidellm 0.8.1's report of a real sweep (the tiny test model,
`--prompt-tokens 8 --new-tokens 8 --rates 4 --requests 8`), trimmed to the strategies and,
of the metrics the summary reads, the successful requests' mean, median, count, p50 and p99.
"""
import gzip
import json
from pathlib import Path

import pytest

from benchmarks.guidellm_sweep import GUIDELLM, REPORT, SUMMARY, command, markdown, rows, run

FIXTURE = Path(__file__).parent / "data" / "guidellm-report.json"


def _kv(option: str) -> dict:
    """A guidellm key=value option as guidellm reads it (comma-separated pairs, each value
    YAML): the values written here are numbers, plain strings or single-quoted strings."""
    out = {}
    for pair in option.split(","):
        key, value = pair.split("=", 1)
        if value.startswith("'"):
            out[key] = value[1:-1].replace("''", "'")
        else:
            for kind in (int, float, str):
                try:
                    out[key] = kind(value)
                    break
                except ValueError:
                    pass
    return out


def _options(cmd: list[str]) -> dict[str, list]:
    assert cmd[1] == "run" and cmd[-1] == "--disable-console-interactive"
    flags = cmd[2:-1]
    opts: dict[str, list] = {}
    for flag, value in zip(flags[::2], flags[1::2]):
        assert flag.startswith("--"), flag
        opts.setdefault(flag, []).append(_kv(value))
    return opts


def test_the_command_asks_for_the_sweep_and_exact_lengths(tmp_path):
    art = tmp_path / "int8-gqa"
    cmd = command(Path("/opt/gl/bin/guidellm"), 8123, art, tmp_path / "o" / "r.json",
                  prompt_tokens=32, new_tokens=16, rates=6, requests=50, seconds=12.5,
                  max_concurrency=8)
    assert cmd[0] == "/opt/gl/bin/guidellm"
    o = _options(cmd)
    assert o["--backend"] == [{"kind": "openai_http", "target": "http://127.0.0.1:8123",
                               "model": "m", "request_format": "/v1/completions",
                               "max_tokens": 16, "extras.body.min_tokens": 16,
                               "extras.body.temperature": 0}]
    # no output length in the data: guidellm would send vLLM's ignore_eos, which tinyt refuses
    assert o["--data"] == [{"kind": "synthetic_text", "prompt_tokens": 32}]
    assert o["--profile"] == [{"kind": "sweep", "sweep_size": 6, "max_concurrency": 8}]
    assert o["--tokenizer"] == [{"kind": "hf_auto", "model": str(art)}]
    assert o["--constraint"] == [{"kind": "max_requests", "count": 50},
                                 {"kind": "max_duration", "seconds": 12.5}]
    assert o["--output"] == [{"kind": "json", "path": str(tmp_path / "o" / "r.json")}]


def test_paths_guidellm_would_misread_are_quoted_or_refused(tmp_path):
    odd = tmp_path / "run #2: it's"  # YAML would cut a comment and read a mapping
    cmd = command(GUIDELLM, 1, odd, tmp_path / "r.json", prompt_tokens=1, new_tokens=1,
                  rates=2, requests=1, seconds=1, max_concurrency=1)
    tok = cmd[cmd.index("--tokenizer") + 1]
    assert tok == "kind=hf_auto,model='" + str(odd).replace("'", "''") + "'"
    assert _kv(tok)["model"] == str(odd)
    with pytest.raises(ValueError, match="comma"):
        command(GUIDELLM, 1, tmp_path / "a,b", tmp_path / "r.json", prompt_tokens=1,
                new_tokens=1, rates=2, requests=1, seconds=1, max_concurrency=1)


def test_the_summary_reads_each_rate_of_the_report():
    report = json.loads(FIXTURE.read_text())
    got = rows(report)
    assert [r["strategy"] for r in got] == ["synchronous", "throughput"] + [
        f"constant {b['config']['strategy']['rate']:.2f}/s" for b in report["benchmarks"][2:]]
    for r, b in zip(got, report["benchmarks"]):
        m = {k: v.get("successful", v) for k, v in b["metrics"].items()}
        assert r["completed"] == 8 and r["errored"] == 0
        assert r["requests_per_s"] == m["requests_per_second"]["mean"]
        assert r["output_tokens_per_s"] == m["output_tokens_per_second"]["mean"]
        assert r["ttft_p50_ms"] == m["time_to_first_token_ms"]["percentiles"]["p50"]
        assert r["ttft_p99_ms"] == m["time_to_first_token_ms"]["percentiles"]["p99"]
        assert r["itl_p50_ms"] == m["inter_token_latency_ms"]["percentiles"]["p50"]
        assert r["itl_p99_ms"] == m["inter_token_latency_ms"]["percentiles"]["p99"]
        assert r["prompt_tokens"] == r["output_tokens"] == 8  # the run's sizes
    info = {"artifact_name": "gqa", "cpu": {"model": "Some CPU", "flags": ["avx2"]},
            "logical_cores": 2, "time": "T", "python": "3.11",
            "versions": {"guidellm": "0.8.1", "transformers": "5.25.0"}, "prompt_tokens": 8,
            "new_tokens": 8, "max_batch": 4, "threads": 1, "requests": 8, "seconds": 20.0,
            "max_concurrency": 64, "workers": 1, "command": "python -m benchmarks.x",
            "guidellm_command": ["guidellm", "run", "--profile", "kind=sweep"]}
    md = markdown(report, info)
    r = got[1]
    assert (f"| throughput | 8 | 0 | {r['requests_per_s']:.2f} | "
            f"{r['output_tokens_per_s']:.1f} | {r['concurrency']:.1f} | "
            f"{r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | {r['itl_p50_ms']:.2f} | "
            f"{r['itl_p99_ms']:.2f} | 8 / 8 |") in md
    assert md.count("\n| ") == 1 + len(got)  # the header and a row per rate
    assert "Some CPU; avx2; 2 logical cores" in md and "guidellm 0.8.1" in md
    assert "guidellm run --profile kind=sweep" in md


@pytest.mark.slow
@pytest.mark.skipif(not GUIDELLM.is_file(), reason="guidellm is opt-in: bash "
                    "scripts/setup-guidellm.sh makes .venv-guidellm (CI does not install it)")
def test_guidellm_sweeps_tinyt_serve(lm_onnx, tmp_path):
    pytest.importorskip("starlette", reason="the serve extra is not installed")
    from tinyt.export.optimize import optimize

    art = optimize(optimize(lm_onnx, tmp_path / "opt"), tmp_path / "gqa", target="gqa")
    out = tmp_path / "out"
    r = run(art, out, prompt_tokens=8, new_tokens=8, rates=3, requests=4, seconds=60,
            threads=1, max_batch=4)
    assert r["info"]["server_exit_status"] == 0
    assert r["info"]["check_text"]  # the greedy completion before timing
    assert [row["strategy"] for row in r["rows"]][:2] == ["synchronous", "throughput"]
    assert len(r["rows"]) == 3 and r["rows"][2]["strategy"].startswith("constant ")
    for row in r["rows"]:
        assert row["completed"] == 4 and row["errored"] == 0, row
    report = json.loads(gzip.decompress((out / REPORT).read_bytes()))
    assert not (out / "guidellm.json").exists()  # only the gzipped copy stays
    for b in report["benchmarks"]:  # every request: the sizes asked for, as the server counted
        sizes = [(q["prompt_tokens"], q["output_tokens"]) for q in b["requests"]["successful"]]
        assert sizes == [(8, 8)] * 4, sizes
    assert (out / SUMMARY).read_text().count("| constant ") == 1
