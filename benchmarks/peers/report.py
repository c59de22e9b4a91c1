"""The peer benchmark's report: peers.md (method, times, agreement and KL, targets, what each
engine chose, what was skipped) and the plots peers.png (decode and prefill per engine) and
peers-plane.png (decode time against greedy agreement)."""
from __future__ import annotations

from pathlib import Path

from .analysis import time_keys
from .engines import TINYT


def markdown(result: dict) -> str:
    """peers.md: the method, every engine's times, agreement, targets, plans and skips."""
    lines = (_method(result) + _times(result) + _memory(result) + _agreement(result)
             + _targets(result) + _choices(result))
    return "\n".join(lines) + "\n"


def _time_columns(result: dict) -> list[str]:
    """The times table's columns: decode_x_floor second where a memory floor was measured."""
    keys = time_keys(result["method"])
    if result.get("memory_floor"):
        keys.insert(1, "decode_x_floor")
    return keys


def _method(result: dict) -> list[str]:
    """The title, the machine, how each time is taken and the memory floor of a decode step."""
    env, m = result["environment"], result["method"]
    flags = [k for k, v in env["cpu"].items() if v is True]
    vers = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    lines = [f"# tinyt vs peers, same weights ({result['model']['n_layer']} layers, "
             f"width {result['model']['n_embd']}, vocab {result['model']['vocab_size']})", "",
             f"{env['cpu'].get('model')}; CPU flags: {', '.join(flags)}; "
             f"{env['physical_cores']} physical cores; {vers}; {env['time']}", "",
             f"Batch 1, greedy. Decode = (t({m['decode_prompt']}-token prompt, "
             f"{m['decode_new']} new) − t(same, 1 new)) / {m['decode_new'] - 1}; prefill = "
             f"t(L-token prompt, 1 new). Median of {m['rounds']} interleaved rounds × "
             f"{m['block']} calls, each engine in its own process."
             + (f" decode_at_{m['long_context']} = the same decode after a prompt of "
                f"{m['long_context'] - m['decode_new']} tokens (the context filled to "
                f"{m['long_context']}), its steps timed inside each engine's token loop "
                "(from the first token to the last, over the steps between)."
                if m.get("long_context") else ""), ""]
    floor = result.get("memory_floor")
    if floor:
        lines[-1:-1] = [_floor(floor), ""]
    if not result["rows"]:
        lines[-2] = "Greedy agreement only (--rounds 0: nothing timed)."
    return lines


def _floor(floor: dict) -> str:
    """The memory floor's paragraph: the bytes a decode step reads and each rate's time."""
    weights_mb = floor["int8_weight_bytes"] / 1e6
    rates = ", ".join(f"{n} thread(s) {gb:.1f} GB/s = {floor['decode_ms'][n]:.3f} ms"
                      for n, gb in floor["read_gb_per_s"].items())
    return (f"Memory floor of a decode step: ({weights_mb:.1f} MB "
            f"of int8 weights + {floor['kv_cache_bytes'] / 1e6:.1f} MB of fp32 KV "
            "cache at the mean past of the timed steps) ÷ the read bandwidth of "
            "as many cores as the engine's threads (numpy, one part a thread, "
            f"between the rounds): {rates}; decode_x_floor is each engine's "
            "decode against its thread count's (fp32 engines read 4× the weights; "
            "int4 ones half; where the weights fit in a cache, as the demo's do, "
            "this is a cache floor, not memory's).")


def _times(result: dict) -> list[str]:
    """The times table: a row per engine and thread count, fastest first per count."""
    if not result["rows"]:
        return []
    keys = _time_columns(result)
    lines = ["| engine | threads | " + " | ".join(keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    for label, row in sorted(result["rows"].items(), key=lambda kv: (kv[0].split("@")[1],
                                                                      kv[1][keys[0]])):
        name, n = label.rsplit("@", 1)
        lines.append(f"| {name} | {n[:-1]} | " + " | ".join(f"{row[k]:.3f}" for k in keys)
                     + " |")
    return lines


def _memory(result: dict) -> list[str]:
    """Each worker's files and resident memory: after the load, the load's peak, the calls'."""
    if not result.get("memory"):
        return []
    m, files = result["method"], result.get("files", {})
    lines = ["", "Files and resident memory of each worker process (MB: 10^6 bytes): "
             "after the load, the load's own peak, and the peak over the calls after it"
             + (f" (the {m['long_context']}-token context's included, where timed)"
                if m.get("long_context") else "")
             + "; * where the peak could not be reset after the load (then it is the "
             "process's whole peak):", "",
             "| engine | threads | files MB | loaded RSS MB | load's peak MB | "
             "peak RSS over the calls MB |", "|---|---|---|---|---|---|"]
    for label, mem in result["memory"].items():
        name, n = label.rsplit("@", 1)
        loaded = mem.get("loaded") or {}
        lines.append(f"| {name} | {n[:-1]} | {_mb(files.get(name))} | "
                     f"{_mb(loaded.get('rss'))} | {_mb(loaded.get('peak_rss'))} | "
                     f"{_mb(mem.get('peak_rss'))}{'' if mem.get('peak_reset') else ' *'} |")
    return lines


def _agreement(result: dict) -> list[str]:
    """Greedy agreement and next-token KL of each engine against tinyt fp32."""
    m = result["method"]
    lines = ["", f"Greedy agreement with tinyt fp32 ({m['agreement_prompts']} held-out prompts "
             f"of {m['agreement_prompt_tokens']} tokens × {m['agreement_new_tokens']} new "
             "tokens, position by position):", "",
             "| engine | agreement | KL vs fp32, next token (mean / max) | must equal | "
             "identical |", "|---|---|---|---|---|"]
    for name, a in result["agreement"].items():
        ag, kl = a.get("agreement_with_fp32"), a.get("kl_vs_fp32")
        kl_text = "—" if kl is None else f"{kl:.2e} / {a['kl_vs_fp32_max']:.2e}"
        lines.append(f"| {name} | {'—' if ag is None else f'{ag:.1%}'} "
                     f"({a.get('matching_tokens')}/{a.get('tokens')}) | {kl_text} | "
                     f"{a.get('must_equal', '—')} | {a.get('identical_to', '—')} |")
    return lines


def _targets(result: dict) -> list[str]:
    """The targets table: tinyt against the fastest peer (or a bound), and whether met."""
    if not result["targets"]:
        return []
    lines = ["", "| target | tinyt | fastest peer | ratio | goal | met |",
             "|---|---|---|---|---|---|"]
    for key, t in result["targets"].items():
        if "unmeasured" in t:
            lines.append(f"| {key} | — | — | — | — | not measured: a time difference <= 0 "
                         "(the calls' noise exceeds the decode) for "
                         f"{', '.join(t['unmeasured'])} |")
        elif "ratio" in t:
            lines.append(f"| {key} | {t['tinyt']} | {t['fastest_peer']} | {t['ratio']:.2f} | "
                         f"≤ {t['target_max']} | {t['met']} |")
        else:
            lines.append(f"| {key} | {t['measured']:.1f} µs | — | — | ≤ {t['target_max']} | "
                         f"{t['met']} |")
    return lines


def _choices(result: dict) -> list[str]:
    """What each engine chose at load, what was skipped and what was not timed."""
    lines = []
    if result.get("plans"):
        lines += ["", "What each engine chose at load (tinyt: runtime/tuning.py's plan):", ""]
        lines += [f"- {label}: {plan}" for label, plan in result["plans"].items()]
    if result["skipped"]:
        lines += ["", "Skipped:", ""] + [f"- {k}: {v}" for k, v in result["skipped"].items()]
    if result["mismatched"]:
        lines += ["", f"Not timed (tokens differ where they must be equal): "
                      f"{result['mismatched']}"]
    if result.get("refused_with"):  # (runs before it was recorded have no such key)
        lines += ["", "Not timed either (their tool's quantizations of the refused model, not "
                      "of tinyt's; their agreement above is with another model's): " + ", ".join(
                          f"{k} (of {v})" for k, v in result["refused_with"].items())]
    return lines


def _mb(n: int | None) -> str:
    return "—" if n is None else f"{n / 1e6:,.0f}"


def plot(result: dict, path: Path) -> None:
    """peers.png (decode and the longest prefill, per engine) and peers-plane.png."""
    if not result["rows"]:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    m = result["method"]
    keys = ["decode_ms_per_token", f"prefill_{m['prefill_tokens'][-1]}_ms"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = sorted(result["rows"], key=lambda k: (k.split("@")[1], k))
    for ax, key in zip(axes, keys):
        vals = [result["rows"][k][key] for k in labels]
        colors = ["tab:blue" if k.split("@")[0] in TINYT else "tab:gray" for k in labels]
        ax.barh(labels, vals, color=colors)
        ax.set_xlabel("ms" + (" per token" if key.startswith("decode") else ""))
        ax.set_title(key.replace("_", " "))
        ax.invert_yaxis()
    fig.suptitle(f"tinyt (blue) vs peers, same weights: {result['model']['n_layer']} layers × "
                 f"{result['model']['n_embd']}, batch 1")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    plot_plane(result, path.with_name("peers-plane.png"), plt)


def plot_plane(result: dict, path: Path, plt) -> None:
    """Decode ms/token against greedy agreement with fp32, one point per engine and
    precision at the first thread count: down and to the right is better."""
    n = result["method"]["threads"][0]
    points = [(k.rsplit("@", 1)[0], r["decode_ms_per_token"]) for k, r in result["rows"].items()
              if k.endswith(f"@{n}t")]
    points = [(name, ms, result["agreement"].get(name, {}).get("agreement_with_fp32"))
              for name, ms in points]
    points = [p for p in points if p[2] is not None]
    if not points:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, ms, agree in points:
        ax.scatter(ms, 100 * agree, color="tab:blue" if name in TINYT else "tab:gray")
        ax.annotate(name, (ms, 100 * agree), textcoords="offset points", xytext=(4, 3),
                    fontsize=8)
    ax.set_xlabel(f"decode ms per token ({n} thread{'s' if n > 1 else ''})")
    ax.set_ylabel("greedy agreement with fp32, %")
    ax.set_title(f"speed against fidelity: {result['model']['n_layer']} layers × "
                 f"{result['model']['n_embd']} (tinyt blue)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
