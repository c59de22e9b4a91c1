"""The encoder-decoder peer benchmark's figures and report (seq2seq_peers.py): the rows of
timed workers, tinyt against CTranslate2 int8 (the target) and the fastest peer, results.md."""
from __future__ import annotations

import statistics

FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16")
CT2_INT8 = "ct2-int8"  # the yardstick
TARGET = 0.9  # tinyt's best time over CTranslate2 int8's, at most (the issue's)
# each timed call's figure: its key in a row, and whether higher wins; clip and clip_features:
# a Whisper's 5-s clip, audio to transcript and its front end alone (whisper_peers.py)
FIGURES = {"greedy": ("greedy_ms", False), "beam": ("beam_ms", False),
           "batch": ("batch_sentences_per_s", True), "clip": ("clip_ms", False),
           "clip_features": ("clip_features_ms", False)}
CALLS = ("greedy", "beam", "batch")  # the timed calls of the text benchmark, in order
MEASURES = {key: higher for name, (key, higher) in FIGURES.items()  # the target's measures
            if name != "clip_features"}


def rows(raw: dict, batch: int, calls: tuple[str, ...] = CALLS) -> dict[str, dict]:
    """Per worker, a figure per timed call (`calls`, FIGURES' names, in raw's order): ms of
    one call, or sentences (windows) per second of the batch; None where the engine took no
    such call (a Whisper without the clip)."""
    out = {}
    for label, times in raw.items():
        out[label] = {}
        for name, ts in zip(calls, times):
            key, _ = FIGURES[name]
            out[label][key] = None if not ts else (
                batch / statistics.median(ts) if name == "batch" else
                1e3 * statistics.median(ts))
    return out


def _time_of(row: dict, key: str) -> float:
    """A measure as a time (sentences per second turned over)."""
    return 1 / row[key] if MEASURES[key] else row[key]


def targets(timed: dict[str, dict], threads: list[int], ours: set[str]) -> dict[str, dict]:
    """Per measure and thread count: tinyt's best (of the engines `ours`) against CTranslate2
    int8 (the target: at most TARGET of its time) and against the fastest peer, as ratios of
    times (< 1: tinyt faster)."""
    out = {}
    for n in threads:
        at = {k.rsplit("@", 1)[0]: v for k, v in timed.items() if k.endswith(f"@{n}t")}
        for key in MEASURES:
            mine = {k: v for k, v in at.items() if k in ours and v.get(key) is not None}
            peers = {k: v for k, v in at.items() if k not in ours and v.get(key) is not None}
            if not mine:
                continue
            best = min(mine, key=lambda k, key=key: _time_of(mine[k], key))
            entry: dict = {"tinyt": best}
            if CT2_INT8 in peers:
                each = {k: _time_of(v, key) / _time_of(peers[CT2_INT8], key)
                        for k, v in mine.items()}
                entry.update(vs_ct2_int8=each[best], target_max=TARGET,
                             met=each[best] <= TARGET, each_vs_ct2_int8=each)
            if peers:
                fast = min(peers, key=lambda k, key=key: _time_of(peers[k], key))
                entry.update(fastest_peer=fast, vs_fastest_peer=_time_of(mine[best], key)
                             / _time_of(peers[fast], key))
            out[f"{key}@{n}t"] = entry
    return out


def markdown(result: dict, head=None) -> str:
    """results.md: the model, machine, method (`head`(result), default a text
    encoder-decoder's), times with the target, the check, memory and files, what was
    skipped."""
    lines = ((head or _head)(result) + _times(result) + _targets(result) + _check(result)
             + _memory(result) + _engines(result))
    return "\n".join(lines) + "\n"


def cpu_line(env: dict) -> str:
    """The CPU, its int8 flags (present and absent), cores and the load average around the
    run: what every figure is measured on."""
    cpu = env["cpu"]
    flags = ", ".join(f"{f} {'yes' if cpu.get(f) else 'no'}" for f in FLAGS)
    load = env.get("load_average") or {}
    said = "; ".join(f"{k} {' / '.join(f'{x:.2f}' for x in v)}" for k, v in load.items())
    return (f"{cpu.get('model')} ({flags}); {env['physical_cores']} physical cores"
            + (f"; load average (1 / 5 / 15 min) {said}" if said else "") + f"; {env['time']}")


def _head(result: dict) -> list[str]:
    m, cfg, env = result["method"], result["model"], result["environment"]
    shape = ", ".join(f"{k} {v}" for k, v in cfg.items() if k != "architecture")
    vers = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    return [f"# Encoder-decoders: tinyt vs peers on one {cfg['architecture']}", "",
            f"Model: {shape} ({result['artifacts']}/hf).", "", cpu_line(env) + ".", "",
            f"Versions: {vers}.", "",
            f"Each engine in its own process per thread count, source token ids in, generated "
            f"ids out. One sentence: a {m['source_tokens']}-token source, {m['new_tokens']} "
            f"new tokens, greedy and with {m['beams']} beams; a batch: {m['batch']} such "
            f"sources, greedy. Median of {m['rounds']} interleaved rounds × {m['block']} calls "
            f"(after {m['settle']} untimed).", ""]


def _times(result: dict) -> list[str]:
    rows = result["rows"]
    if not rows:
        return ["Nothing timed (--rounds 0, or no engine passed the check).", ""]
    m = result["method"]
    one = m.get("unit", "sentence")  # what one call reads: a sentence, a 30-s window
    heads = {"greedy_ms": f"1 {one} greedy ms", "beam_ms": f"1 {one}, {m['beams']} beams ms",
             "batch_sentences_per_s": f"batch {m['batch']}: {one}s/s",
             "clip_ms": "5-s clip, audio to text ms", "clip_features_ms": "its front end ms"}
    keys = [k for k in heads if any(k in r for r in rows.values())]
    lines = ["| engine | threads | " + " | ".join(heads[k] for k in keys)
             + " | tokens made (per call) |", "|---|---|" + "---|" * len(keys) + "---|"]
    for label, r in sorted(rows.items(), key=lambda kv: (int(kv[0].rsplit("@", 1)[1][:-1]),
                                                         kv[1][keys[0]] or 0)):
        name, n = label.rsplit("@", 1)
        made = " / ".join(str(x) for x in result["made"].get(label, []))
        cells = [_ms(r.get(k), ".2f" if k == "batch_sentences_per_s" else ".1f")
                 for k in keys]
        lines.append(f"| {name} | {n[:-1]} | " + " | ".join(cells) + f" | {made} |")
    return lines + [""]


def _ms(x: float | None, form: str = ".1f") -> str:
    return "—" if x is None else format(x, form)


def _targets(result: dict) -> list[str]:
    t = result["targets"]
    if not t:
        return []
    lines = ["tinyt's best against CTranslate2 int8 (time over its time; the target ≤ 0.9) "
             "and against the fastest peer:", "",
             "| measure | threads | tinyt's best | × CTranslate2 int8 | met | fastest peer | "
             "× it |", "|---|---|---|---|---|---|---|"]
    for key, e in t.items():
        measure, n = key.rsplit("@", 1)
        vs = f"{e['vs_ct2_int8']:.2f}" if "vs_ct2_int8" in e else "—"
        met = {True: "yes", False: "**no**"}.get(e.get("met"), "—")
        fast = f"{e['vs_fastest_peer']:.2f}" if "vs_fastest_peer" in e else "—"
        lines.append(f"| {measure} | {n[:-1]} | {e['tinyt']} | {vs} | {met} | "
                     f"{e.get('fastest_peer', '—')} | {fast} |")
    return lines + [""] + _each(t)


def _each(t: dict) -> list[str]:
    """Every tinyt engine's time over CTranslate2 int8's (its quantization beside it: the
    agreement table says what each keeps of fp32's output)."""
    keys = [k for k, e in t.items() if "each_vs_ct2_int8" in e]
    if not keys:
        return []
    names = sorted({n for k in keys for n in t[k]["each_vs_ct2_int8"]})
    lines = ["Each tinyt engine's time over CTranslate2 int8's:", "",
             "| engine | " + " | ".join(f"{k.rsplit('@', 1)[0]} {k.rsplit('@', 1)[1]}"
                                       for k in keys) + " |",
             "|---|" + "---|" * len(keys)]
    for name in names:
        cells = [t[k]["each_vs_ct2_int8"].get(name) for k in keys]
        lines.append(f"| {name} | " + " | ".join("—" if c is None else f"{c:.2f}"
                                                 for c in cells) + " |")
    return lines + [""]


def _check(result: dict) -> list[str]:
    m = result["method"]
    lo, hi = m.get("check_lengths") or (None, None)
    what = m.get("check_said") or f"sources of {lo} to {hi} tokens"
    lines = [f"Same output first ({m['check_sources']} {what}, one at a "
             f"time, {m['new_tokens']} new tokens, at {m['threads'][0]} thread(s)): tokens "
             "equal to tinyt fp32's, position by position. An fp32 engine must give them "
             "exactly (greedy), but for a tie at fp32 precision where they first part (tinyt's "
             "logits there prefer its token by at most TIE_FACTOR × reorder_bound, the seq2seq "
             "verifier's rule), or is refused; the beams' are told.", "",
             "| engine | greedy agreement | sources differing | different outputs | beams "
             "agreement | must equal | verdict |", "|---|---|---|---|---|---|---|"]
    clip = ["", "The 5-s clip from its audio, greedy, each engine through its own front end "
            "(told, not required): its tokens against tinyt fp32's, and its features' largest "
            "difference from runtime/audio.log_mel's (— where the engine keeps them).", "",
            "| engine | clip agreement | features max abs difference |", "|---|---|---|"]
    for name, a in result["agreement"].items():
        if "clip" in a:
            c = a["clip"] or {}
            diff = c.get("features_vs_log_mel")
            clip.append(f"| {name} | {c['agreement']:.1%} |" if c else f"| {name} | — |")
            clip[-1] += f" {'—' if diff is None else f'{diff:.2g}'} |"
        g, b = a["greedy"], a["beams"]
        ties = g.get("ties") or []
        verdict = ("**refused**" if name in result["skipped"] else
                   "identical" if g["identical"] else
                   "identical but for " + "; ".join(
                       f"a tie at source {t['source']}, token {t['position']} (margin "
                       f"{t['margin']:.2g} ≤ {t['tie_bound']:.2g})" for t in ties)
                   if ties else "reported")
        lines.append(f"| {name} | {g['agreement']:.1%} | {g['sources_differing']} | "
                     f"{g['distinct_outputs']} of {m['check_sources']} | {b['agreement']:.1%} | "
                     f"{a['must_equal'] or '—'} | {verdict} |")
    return lines + (clip if len(clip) > 5 else []) + [""]


def _memory(result: dict) -> list[str]:
    lines = ["Files and memory (MB: 10^6 bytes; resident set after the load, and the peak over "
             "the calls after it):", "", "| engine | threads | files MB | load s | "
             "RSS loaded MB | peak RSS MB |", "|---|---|---|---|---|---|"]
    for label, mem in result["memory"].items():
        name, n = label.rsplit("@", 1)
        files = result["files"].get(name)
        loaded = (mem.get("loaded") or {}).get("rss")
        lines.append(f"| {name} | {n[:-1]} | {_mb(files)} | {mem.get('load_s') or 0:.1f} | "
                     f"{_mb(loaded)} | {_mb(mem.get('peak_rss'))} |")
    return lines + [""]


def _engines(result: dict) -> list[str]:
    lines = ["Engines:", ""] + [f"- {k}: {v}" for k, v in result["engines"].items()]
    if result["skipped"]:
        lines += ["", "Not run or not timed:", ""] + [f"- {k}: {v}"
                                                      for k, v in result["skipped"].items()]
    return lines


def _mb(n: int | None) -> str:
    return "—" if not n else f"{n / 1e6:,.0f}"
