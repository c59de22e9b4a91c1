"""Whisper's ONNX export in Optimum's speech layout (export/seq2seq_export.py): an imported
random Whisper (tests/whisper_fixtures.py at the real vocabulary, 80 mel bins and 1,500
source positions, narrowed to 64 wide, 1 + 1 layers) written as encoder_model.onnx
(input_features -> last_hidden_state) and the two decoder graphs without a source mask.

Checked: each graph against PyTorch (the encoder on espeak-ng speech, the first step, then
steps through both caches); Optimum's ORTModelForSpeechSeq2Seq loads the directory unchanged
and its logits equal transformers' on the source model; its generate (Whisper's rules:
forced language and task, suppressed tokens; greedy, 3 beams, with timestamps) makes
transformers' tokens; the generation
config and the special tokens' ids go with the artifact; the stages tinyt does not run on it
yet are refused by name.

Tolerance: the same float32 arithmetic in ONNX Runtime's order, ~1e-6 on logits of size ~10
(measured 2e-7 at a smaller shape); ONNX_ATOL 1e-4 as the verifier's."""
import json

import numpy as np
import pytest
import torch
from whisper_fixtures import save_whisper, speech_features

from tinyt.checkpoint import load_checkpoint
from tinyt.errors import ConfigError
from tinyt.hf import import_hf

ONNX_ATOL = 1e-4
SMALL = dict(d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_layers=1, decoder_layers=1)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(transformers' model, tinyt's checkpoint, the ONNX artifact directory, the source)."""
    from tinyt.export import export_onnx

    root = tmp_path_factory.mktemp("whisper")
    model = save_whisper("tiny", root / "hf", **SMALL)
    ck = import_hf(root / "hf", root / "ck")
    return model, ck, export_onnx(ck, root / "onnx"), root / "hf"


def _features():
    features = speech_features(80)
    if features is None:
        pytest.skip("espeak-ng is not installed (scripts/setup.sh installs it with apt)")
    return torch.from_numpy(features)[None]


def test_each_graph_equals_pytorch(exported):
    import onnxruntime as ort

    _, ck_dir, out, _ = exported
    model = load_checkpoint(ck_dir).model.eval()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    run = {role: ort.InferenceSession(str(out / f"{role}_model.onnx"), opts)
           for role in ("encoder", "decoder", "decoder_with_past")}
    assert [i.name for i in run["encoder"].get_inputs()] == ["input_features"]
    assert [i.name for i in run["decoder"].get_inputs()] == ["input_ids",
                                                             "encoder_hidden_states"]
    x = _features()
    ids = torch.tensor([[50258, 50259, 50359, 50363, 400, 401]])
    with torch.no_grad():
        memory, want = model.encode(x), model(x, None, ids)
    hidden = run["encoder"].run(None, {"input_features": x.numpy()})[0]
    assert hidden.shape == (1, 1500, 64)
    worst = {"encoder": float(np.abs(hidden - memory.numpy()).max())}
    out0 = run["decoder"].run(None, {"input_ids": ids[:, :2].numpy(),
                                     "encoder_hidden_states": hidden})
    worst["decoder"] = float(np.abs(out0[0] - want[:, :2].numpy()).max())
    names = [o.name.replace("present", "past_key_values")
             for o in run["decoder"].get_outputs()[1:]]
    past = dict(zip(names, out0[1:]))
    for t in range(2, ids.shape[1]):
        step = run["decoder_with_past"].run(None, {"input_ids": ids[:, t:t + 1].numpy(), **past})
        worst[f"step {t}"] = float(np.abs(step[0] - want[:, t:t + 1].numpy()).max())
        grown = [o.name.replace("present", "past_key_values")
                 for o in run["decoder_with_past"].get_outputs()[1:]]
        past.update(zip(grown, step[1:]))
    assert max(worst.values()) <= ONNX_ATOL, worst


@pytest.mark.filterwarnings("ignore")  # transformers' notes on Whisper's logits processors
def test_optimum_loads_it_unchanged_and_generates_transformers_tokens(exported):
    from optimum.onnxruntime import ORTModelForSpeechSeq2Seq

    theirs, _, out, _ = exported
    ours = ORTModelForSpeechSeq2Seq.from_pretrained(out, provider="CPUExecutionProvider")
    x = _features()
    ids = torch.tensor([[50258, 50259, 50359, 50363, 400, 401, 402]])
    with torch.no_grad():
        want = theirs(input_features=x, decoder_input_ids=ids).logits
    got = ours(input_features=x, decoder_input_ids=ids).logits
    assert float((got - want).abs().max()) <= ONNX_ATOL
    for extra in ({}, {"num_beams": 3}, {"return_timestamps": True}):
        settings = dict(language="en", task="transcribe", max_new_tokens=12, do_sample=False,
                        **extra)
        a = theirs.generate(x, **settings)
        b = ours.generate(x, **settings)
        assert a.tolist() == b.tolist(), extra
        # transformers returns the tokens after the forced prompt: none of them suppressed
        assert a.shape[1] >= 1 and not set(a[0].tolist()) & set(
            theirs.generation_config.suppress_tokens)


def test_the_generation_config_and_tokens_go_with_it(exported):
    from tinyt.hf.speech import load_speech

    _, ck_dir, out, source = exported
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen == json.loads((source / "generation_config.json").read_text())
    assert gen["no_timestamps_token_id"] == 50363 and gen["lang_to_id"]["<|en|>"] == 50259
    assert load_speech(out) == load_speech(ck_dir)
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["num_mel_bins"], config["max_source_positions"]) == \
        ("whisper", 80, 1500)


def test_tinyt_runtime_loads_it_as_a_speech_model(exported):
    """rt.load gives a SpeechModel (tests/runtime/test_whisper_runtime.py transcribes)."""
    import tinyt.runtime as rt

    _, _, out, _ = exported
    model = rt.load(out, threads=1)
    assert isinstance(model, rt.SpeechModel) and model.n_mels == 80
    with pytest.raises(ConfigError, match="io_binding=True: .* is a speech \\(Whisper\\)"):
        rt.load(out, io_binding=True)
