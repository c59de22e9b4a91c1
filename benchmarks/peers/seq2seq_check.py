"""The encoder-decoder peers' same-output check (seq2seq_peers.py): every engine's greedy and
beam tokens on the check's sources against tinyt fp32's, from its worker at the first thread
count, before anything is timed.

    identical                     the engine's tokens are the reference's
    differing, within a tie       where they first part, the reference's own logits prefer its
                                  token to the other's by at most TIE_FACTOR x reorder_bound
                                  (export/compare.py: two fp32 orders of the same sums may
                                  reverse that; the seq2seq verifier's rule for greedy tokens)
    differing beyond a tie        an fp32 engine is refused: skipped with the first such
                                  place, never timed (another model, a wrong conversion)

INT8 and 4-bit engines report their agreement (tokens equal position by position).
"""
from __future__ import annotations

from pathlib import Path

from tinyt.errors import BenchError

from .engines import PeerEngine
from .protocol import Worker

REFERENCE = "tinyt-fp32"


def check(workers: list[Worker], rows: list[PeerEngine], threads: int, plan: dict,
          skipped: dict[str, str], tie, log) -> dict[str, dict]:
    """Each engine's greedy (and beam) tokens on the check's sources, from its worker at
    `threads`, against the reference's. An engine that must give the reference's tokens and
    does not (beyond a tie: `tie`(magnitude) is the margin two fp32 orders may reverse), or
    cannot translate them, is skipped with why: every worker of it closed and dropped from
    `workers`."""
    exact = {e.name: e.exact for e in rows}
    tokens: dict[str, dict[str, list]] = {}
    for w in [w for w in workers if w.threads == threads]:
        try:
            tokens[w.name] = {
                "greedy": [w.ask(op="translate", sources=[s], n=plan["new_tokens"],
                                 beams=1)["tokens"][0] for s in plan["check"]],
                "beams": [w.ask(op="translate", sources=[s], n=plan["new_tokens"],
                                beams=plan["beams"])["tokens"][0] for s in plan["check"]]}
            if "clip" in plan:  # a Whisper's clip from its audio (told, not required)
                tokens[w.name]["clip"] = w.ask(op="clip", n=plan["clip"]["n"])
        except RuntimeError as err:
            skipped[w.name] = "failed the check: " + " ".join(str(err).split())[:300]
    if REFERENCE not in tokens:
        raise BenchError(f"the reference, {REFERENCE}, did not run: "
                         f"{skipped.get(REFERENCE) or skipped.get(f'{REFERENCE}@{threads}t')}")
    ref = tokens[REFERENCE]
    reference = next(w for w in workers if w.name == REFERENCE and w.threads == threads)
    agreement = {}
    for name, got in tokens.items():
        a = {k: agree(got[k], ref[k]) for k in ("greedy", "beams")}
        if "clip" in got:
            a["clip"] = _clip(got["clip"], ref["clip"])
        a.update(must_equal=REFERENCE if exact[name] else None)
        if exact[name] and not a["greedy"]["identical"]:
            a["greedy"]["ties"] = ties(reference, plan, got["greedy"], ref["greedy"], tie)
            beyond = [t for t in a["greedy"]["ties"] if not t["tie"]]
            if beyond:
                skipped[name] = (f"refused before timing: its greedy tokens differ from "
                                 f"{REFERENCE}'s on {len(beyond)} of {len(plan['check'])} "
                                 f"sources beyond a tie (agreement "
                                 f"{a['greedy']['agreement']:.1%}; first at source "
                                 f"{beyond[0]['source']}, token {beyond[0]['position']}: "
                                 f"{REFERENCE} prefers its token by {beyond[0]['margin']:.3g}"
                                 f" > {beyond[0]['tie_bound']:.3g})")
        agreement[name] = a
        log(f"{name}: greedy agreement {a['greedy']['agreement']:.1%}, beams "
            f"{a['beams']['agreement']:.1%}" + (" — refused" if name in skipped else ""))
    for w in [w for w in workers if w.name in skipped]:
        w.close()
        workers.remove(w)
    return agreement


def tie_bound(artifact: Path):
    """(largest |logit|) -> the margin two fp32 computations of the reference's model may
    reverse: compare.TIE_FACTOR x reorder_bound over both stacks, the seq2seq verifier's rule
    for greedy tokens."""
    from tinyt.export.compare import TIE_FACTOR, reorder_bound
    from tinyt.manifest import read_model_config

    cfg, _ = read_model_config(artifact)
    layers = cfg.n_layer + cfg.decoder_layers
    return lambda magnitude: TIE_FACTOR * reorder_bound(cfg, magnitude, layers)


def ties(reference: Worker, plan: dict, got: list[list[int]], ref: list[list[int]],
         tie) -> list[dict]:
    """Per source whose tokens differ: where first, by how much the reference's logits there
    prefer its token to the other's, and whether that is within a tie (`tie`(magnitude))."""
    out = []
    for k, (g, r) in enumerate(zip(got, ref)):
        if g == r:
            continue
        at = next((i for i, (x, y) in enumerate(zip(g, r)) if x != y), min(len(g), len(r)))
        mine, theirs = (r[at] if at < len(r) else plan["eos"]), (
            g[at] if at < len(g) else plan["eos"])
        said = reference.ask(op="logits", source=plan["check"][k], prefix=r[:at],
                             ids=[mine, theirs])
        margin = said["values"][0] - said["values"][1]
        bound = tie(said["magnitude"])
        out.append({"source": k, "position": at, "margin": margin, "tie_bound": bound,
                    "tie": margin <= bound})
    return out


def _clip(got: dict, ref: dict) -> dict | None:
    """The clip's tokens against the reference's, and how far the engine's features of it
    are from runtime/audio.log_mel's (None: it keeps them, or takes no clip)."""
    if got["tokens"] is None or ref["tokens"] is None:
        return None
    return {**agree([got["tokens"]], [ref["tokens"]]),
            "features_vs_log_mel": got["features_vs_log_mel"]}


def agree(got: list[list[int]], ref: list[list[int]]) -> dict:
    """Tokens equal to the reference's position by position (over the reference's tokens), the
    sources whose tokens differ at all, and how many different outputs the sources gave (one:
    weights that ignore their source, which a check cannot tell from a broken encoder)."""
    same = sum(a == b for g, r in zip(got, ref) for a, b in zip(g, r))
    total = sum(map(len, ref))
    differ = sum(g != r for g, r in zip(got, ref))
    return {"agreement": same / total if total else 1.0, "matching_tokens": same,
            "tokens": total, "sources_differing": differ, "identical": differ == 0,
            "distinct_outputs": len({tuple(g) for g in got})}
