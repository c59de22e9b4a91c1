"""Verification of a speech (Whisper) artifact (torch): its three graphs against the PyTorch
model on log-mel features, and greedy transcription through tinyt.runtime against a greedy
loop on the PyTorch model with Whisper's rules.

    audio: a synthetic voice (a 120-Hz buzz through moving formants, with noise) and, where
    espeak-ng is installed, espeak-ng speech; features by runtime/audio.log_mel
      ──encoder_model.onnx──▶ hidden states [B, frames, C]   vs model.encode(features)
    torch's hidden states + a target (teacher forcing)
      ──decoder_model.onnx──▶ logits, self cache, cross k/v  vs model.decode, model.cross_kv
    torch's caches of the target's first P tokens + the rest
      ──decoder_with_past_model.onnx──▶ logits, self cache   vs model.decode(past)
    decoder_model on the start token, then one token a step on the graphs' own caches
    greedy: rt.load(artifact)'s decoding of one window (SpeechModel.decode_features: the
      graphs, the caches, Whisper's rules) vs the PyTorch model on the same features and prompt
      (start, <|en|>, <|transcribe|>, <|notimestamps|>), the suppressed tokens at -inf as the
      runtime's rules set them

Every output is held to seq2seq_checks.graph_bound: fp32 rounding over both stacks, widened
to the audio encoder's sums (attention over every frame, the convolutions). Greedy tokens
must be identical but for a tie at fp32 precision (compare.TIE_FACTOR).
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tinyt.contract import SEQ2SEQ
from tinyt.runtime.audio import SAMPLE_RATE, load_audio, log_mel

from .compare import TIE_FACTOR, first_difference
from .seq2seq_checks import graph_bound
from .seq2seq_verify import CHECK_TARGET, _check_steps, _sessions, _Worst
from .speech_accuracy import SENTENCES, voice

GEN_TOKENS = 32  # greedy tokens a clip, at most: PyTorch's steps pay the 51,865-wide head each


def clips() -> dict[str, np.ndarray]:
    """The check's audio by name: the synthetic voice, and espeak-ng's first sentence where
    espeak-ng is installed."""
    out = {"synthetic voice": voice()}
    if shutil.which("espeak-ng") is not None:
        with tempfile.TemporaryDirectory() as tmp:
            wav = Path(tmp) / "said.wav"
            subprocess.run(["espeak-ng", "-w", str(wav), SENTENCES[0]], check=True,
                           timeout=60, capture_output=True)
            out["espeak-ng"] = load_audio(wav)
    return out


def _check_graphs(model, sessions, features: torch.Tensor, label: str, T: int,
                  worst: _Worst) -> None:
    """The three graphs on one batch of features, against PyTorch."""
    cfg = model.config
    n = cfg.decoder_layers
    names = [f"present.{i}.{s}.{kv}" for i in range(n) for s in ("decoder", "encoder")
             for kv in ("key", "value")]
    rng = np.random.default_rng(0)
    B = features.shape[0]
    case = {"audio": label, "batch": B}
    with torch.no_grad():
        memory = model.encode(features)
        (hidden,) = sessions["encoder"].run(None, {"input_features": features.numpy()})
        worst.add("encoder_model.onnx", "last_hidden_state", hidden, memory.numpy(), case)
        cross = model.cross_kv(memory)
        target = torch.from_numpy(rng.integers(0, cfg.vocab_size, (B, T), dtype=np.int64))
        target[:, 0] = cfg.decoder_start_id
        logits, own = model.decode(target, cross, None)
        out = sessions["decoder"].run(None, {"input_ids": target.numpy(),
                                             "encoder_hidden_states": memory.numpy()})
        ref = [logits, *(t for o, c in zip(own, cross) for t in (*o, *c))]
        for name, o, r in zip(["logits", *names], out, ref):
            worst.add("decoder_model.onnx", name, o, r.numpy(), {**case, "target": T})
        P = T // 2
        _, past = model.decode(target[:, :P], cross, None)
        logits2, own2 = model.decode(target[:, P:], cross, None, past)
        feeds = {"input_ids": target[:, P:].numpy()}
        caches = [t for p, c in zip(past, cross) for t in (*p, *c)]
        feeds.update(zip((m.replace("present", "past_key_values", 1) for m in names),
                         (t.numpy() for t in caches)))
        out = sessions["decoder_with_past"].run(None, feeds)
        ref = [logits2, *(t for o in own2 for t in o)]
        self_names = [m for m in names if ".decoder." in m]
        for name, o, r in zip(["logits", *self_names], out, ref):
            worst.add("decoder_with_past_model.onnx", name, o, r.numpy(),
                      {**case, "past": P, "target": T - P})
        _check_steps(sessions, n, None, memory, target, logits, worst, case)


@torch.no_grad()
def _torch_greedy(model, features: torch.Tensor, prompt: list[int], steps: int,
                  rules: dict[str, Any]) -> tuple[list[int], Any]:
    """Greedy tokens after `prompt` on the PyTorch model, Whisper's suppressions applied as the
    runtime applies them; and a function giving the processed scores after a prefix."""
    cross = model.cross_kv(model.encode(features))

    @torch.no_grad()
    def scores(made: list[int]) -> torch.Tensor:
        z = model.decode(torch.tensor([prompt + made]), cross, None)[0][0, -1].clone()
        z[list(rules["suppress"])] = -torch.inf
        if not made:
            z[list(rules["begin_suppress"])] = -torch.inf
        return z

    made: list[int] = []
    logits, past = model.decode(torch.tensor([prompt]), cross, None)
    for step in range(steps):  # through the cache, as the graphs step
        z = logits[0, -1].clone()
        z[list(rules["suppress"])] = -torch.inf
        if step == 0:
            z[list(rules["begin_suppress"])] = -torch.inf
        nxt = int(z.argmax())
        if nxt == rules["eos"]:
            break
        made.append(nxt)
        logits, past = model.decode(torch.tensor([[nxt]]), cross, None, past)
    return made, scores


def _greedy(model, onnx_dir: Path, audio: dict[str, np.ndarray], steps: int, bound: float,
            failures: list[str]) -> list[dict[str, Any]]:
    """Each clip's greedy tokens through the runtime against the PyTorch model's."""
    from tinyt.runtime import load

    asr = load(onnx_dir, threads=1)
    lang = "en" if asr.multilingual else None
    prompt = asr._prefix(lang, "transcribe", False)
    rules = {"suppress": asr.suppress, "begin_suppress": asr.begin_suppress, "eos": asr.eos}
    out = []
    for label, samples in audio.items():
        feats = torch.from_numpy(log_mel(samples, model.config.n_mels))[None]
        ref, scores = _torch_greedy(model, feats, prompt, steps, rules)
        # one window's loop (SpeechModel.decode_features: the graphs, the caches, the
        # rules), not transcribe's windowing, which a timestamp pair would move on
        got = asr.decode_features(feats.numpy(), language=lang, max_new_tokens=steps)[0]
        first = first_difference(got, ref)
        case = {"prompt": label, "tokens": steps, "identical": got == ref, "torch": ref,
                "onnxruntime": got}
        if first is None and len(got) != len(ref):  # one stopped where the other went on
            first = min(len(got), len(ref))
        if first is not None:
            z = scores(ref[:first])
            theirs = got[first] if first < len(got) else asr.eos
            mine = ref[first] if first < len(ref) else asr.eos
            margin = float(z[mine] - z[theirs])
            case["first_difference"] = {"position": first, "torch_logit_margin": margin,
                                        "tie_bound": TIE_FACTOR * bound}
            if margin > TIE_FACTOR * bound:
                failures.append(f"greedy transcription differs for {label} at token {first} "
                                f"(PyTorch prefers its token by {margin:.3g}, more than a tie "
                                f"at fp32 precision, {TIE_FACTOR * bound:.3g})")
        out.append(case)
    return out


def verify_speech(ckpt, onnx_dir: Path, gen_tokens: int = 64) -> dict[str, Any]:
    """The report of verifier.verify for a Whisper artifact (`passed`, `failures` naming the
    graph, `worst` per graph and output group, `generation`)."""
    model = ckpt.model.eval()
    cfg = model.config
    audio = clips()
    mels = {k: torch.from_numpy(log_mel(a, cfg.n_mels)) for k, a in audio.items()}
    batches = [(" + ".join(mels), torch.stack(list(mels.values()))),
               ("silence", torch.from_numpy(log_mel(np.zeros(SAMPLE_RATE, np.float32),
                                                    cfg.n_mels))[None])]
    T = min(CHECK_TARGET, cfg.block_size)
    worst = _Worst()
    sessions = _sessions(onnx_dir)
    for label, features in batches:
        _check_graphs(model, sessions, features, label, T, worst)
    del sessions
    layers = cfg.n_layer + cfg.decoder_layers
    failures = []
    for name, w in worst.by.items():
        w["bound"] = graph_bound(cfg, w["magnitude"], layers)
        if not w["max_abs"] <= w["bound"]:
            failures.append(f"{name} max abs diff {w['max_abs']:.3g} > {w['bound']:.3g} (fp32 "
                            f"rounding at |value| up to {w['magnitude']:.3g}, {layers} blocks "
                            f"and the convolutions) at {w['case']}")
    logits_size = max(w["magnitude"] for n, w in worst.by.items() if n.endswith("logits"))
    steps = min(gen_tokens, GEN_TOKENS, cfg.block_size - 4)
    generation = _greedy(model, onnx_dir, audio, steps,
                         graph_bound(cfg, logits_size, layers), failures)
    return {"passed": not failures, "failures": failures, "graph": SEQ2SEQ,
            "sizes": {"frames": 2 * cfg.source_positions, "longest_sequence": T,
                      "context": cfg.block_size, "highest_position": T - 1,
                      "batch": len(mels), "generated_tokens": steps},
            "audio": list(audio), "tolerances": {n: w["bound"] for n, w in worst.by.items()},
            "worst": worst.by, "generation": generation}
