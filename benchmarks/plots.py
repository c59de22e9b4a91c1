"""PNG plots of a benchmark result: latency vs prompt length, decode tokens/s, and size vs
validation-loss change, per variant (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def write_plots(result: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    threads = max(result["environment"]["threads"])
    tag = f"@{threads}t"
    rows = [r for r in result["rows"] if r["variant"].endswith(tag) and r["batch"] == 1]
    names = list(dict.fromkeys(r["variant"] for r in rows))
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in names:
        pts = sorted((r["tokens"], r["p50_ms"]) for r in rows
                     if r["variant"] == name and r["kind"] == "prefill")
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name.removesuffix(tag))
    ax.set(xlabel="prompt length (tokens)", ylabel="prefill p50 (ms)",
           title=f"Prefill latency, batch 1, {threads} threads")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "latency_vs_prompt.png"))

    decode = [(r["variant"].removesuffix(tag), r["tokens_per_s"]) for r in rows
              if r["kind"] == "decode" and r["past"] == max(x["past"] for x in rows
                                                            if x["kind"] == "decode")]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.barh([n for n, _ in decode], [v for _, v in decode])
    ax.set(xlabel="decode tokens/s (batch 1)", title=f"Decode speed, {threads} threads")
    ax.tick_params(axis="y", labelsize=7)
    paths.append(_save(fig, out / "decode_tokens_per_s.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, change in result["accuracy_change"].items():
        size = result["sizes_bytes"].get(name)
        if size is not None and change is not None:
            ax.scatter(size / 2**20, 100 * change)
            ax.annotate(name, (size / 2**20, 100 * change), fontsize=7)
    ax.set(xlabel="model.onnx (MiB)", ylabel="validation loss change vs fp32 (%)",
           title="Size vs accuracy cost")
    paths.append(_save(fig, out / "size_vs_loss.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
