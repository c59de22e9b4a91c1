"""The encoder peer benchmark's report (encoders.py): results.md from its results."""
from __future__ import annotations


def markdown(result: dict) -> str:
    """results.md: the model, machine, method, times with ratios, the check, what was skipped."""
    m, env, cfg = result["method"], result["environment"], result["model"]
    tp, lat = m["throughput"], m["latency"]
    flags = [k for k, v in env["cpu"].items() if v is True]
    vers = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    lines = [f"# Encoders: tinyt vs peers on one sentence-transformers directory "
             f"({cfg['layers']} layers, width {cfg['dim']}, {cfg['heads']} heads, vocab "
             f"{cfg['vocab']}, {cfg['pooling']} pooling{', Normalize' if cfg['normalize'] else ''}"
             f", max_seq_length {cfg['max_length']})", "", f"Weights: {result['st_dir']}"
             + _training(result.get("training")), "",
             f"{env['cpu'].get('model')}; CPU flags: {', '.join(flags)}; {env['physical_cores']} "
             f"physical cores; parent: {vers}; peers' python: {env['peer_python']}; "
             f"{env['time']}", "",
             f"Each engine in its own process per thread count, texts in and embeddings out (its "
             f"own tokenization included). Median of {m['rounds']} interleaved rounds × "
             f"{m['block']} calls (after {m['settle']} untimed). × tinyt: the engine's time over "
             "the fastest tinyt artifact's at the same thread count (named in brackets); above "
             "1 is slower than tinyt.", ""]
    if not result["rows"]:
        lines[-2:] = ["Nothing timed (--rounds 0, or no engine passed the check)."]
    else:
        lines += [f"| engine | threads | texts/s ({tp['batch']} × {tp['tokens']} tokens) | "
                  f"× tinyt | ms ({lat['batch']} × {lat['tokens']} tokens) | × tinyt |",
                  "|---|---|---|---|---|---|"]
    for label, r in sorted(result["rows"].items(), key=lambda kv: (
            int(kv[0].rsplit("@", 1)[1][:-1]), -kv[1]["texts_per_s"])):
        name, n = label.rsplit("@", 1)
        lines.append(f"| {name} | {n[:-1]} | {r['texts_per_s']:.1f} | "
                     f"{_ratio(r, 'batch')} | {r['latency_ms']:.2f} | {_ratio(r, 'latency')} |")
    lines += ["", f"Same embeddings first: {m['check_texts']} texts (tinyt's retrieval set), "
              "against transformers' hidden states pooled as sentence-transformers pools them; "
              f"an fp32 engine must reach cosine {m['exact_cosine']} on every text, INT8 reports "
              "(recall@10: the reference's 10 best passages per query among the engine's 10 "
              "best).", "", "| engine | threads | cosine min | cosine mean | recall@10 | "
              "must match | verdict |", "|---|---|---|---|---|---|---|"]
    for label, a in result["accuracy"].items():
        name, n = label.rsplit("@", 1)
        fig = (f"{a['cosine_min']:.6f} | {a['cosine_mean']:.6f} | {a['recall_at_10']:.3f}"
               if "cosine_min" in a else f"shape {a['shape']} | — | —")
        verdict = {True: "matches", False: "**refused**", None: "reported"}[a["matches"]]
        lines.append(f"| {name} | {n[:-1]} | {fig} | {a['must_match']} | {verdict} |")
    lines += ["", "Each worker: its load, resident memory after it and the peak by the end (MB: "
              "10^6 bytes):", "", "| engine | threads | load s | RSS loaded MB | peak RSS MB |",
              "|---|---|---|---|---|"]
    for label, w in result["workers"].items():
        name, n = label.rsplit("@", 1)
        peak = (w.get("memory_after") or {}).get("peak_rss")
        lines.append(f"| {name} | {n[:-1]} | {w['load_s']:.1f} | "
                     f"{(w['memory'] or {}).get('rss', 0) / 1e6:,.0f} | "
                     f"{'—' if peak is None else f'{peak / 1e6:,.0f}'} |")
    pythons = {w["python"]: w["versions"] for w in result["workers"].values()}
    lines += ["", "Engines:", ""]
    for name, about in result["engines"].items():
        ran = [w["python"] for k, w in result["workers"].items() if k.startswith(f"{name}@")]
        lines.append(f"- {name}: {about}" + (f" ({ran[0]})" if ran else ""))
    lines += ["", "Versions in each python:", ""] + [
        f"- {py}: " + ", ".join(f"{d} {v}" for d, v in vers.items())
        for py, vers in pythons.items()]
    if result["skipped"]:
        lines += ["", "Not run:", ""] + [f"- {k}: {v}" for k, v in result["skipped"].items()]
    if result["refused"]:
        lines += ["", f"Refused before timing (embeddings differ): {list(result['refused'])}"]
    return "\n".join(lines) + "\n"


def _training(t: dict | None) -> str:
    if not t:
        return "."
    loss = t["loss"]
    return (f" ({t['method']}; {t['texts']} texts: {t['text_source']}; batch {t['batch_size']}, "
            f"lr {t['lr']}, temperature {t['temperature']}, {t['max_tokens']} tokens, seed "
            f"{t['seed']}; loss {loss[0]:.3f} at the first step, {loss[-1]:.3f} at the last; "
            f"{t['seconds']:.0f} s on {t['threads']} threads, {t['cpu_seconds']:.0f} s of CPU).")


def _ratio(row: dict, measure: str) -> str:
    if f"{measure}_vs_tinyt" not in row:
        return "—"
    return f"{row[f'{measure}_vs_tinyt']:.2f} ({row[f'{measure}_tinyt']})"
