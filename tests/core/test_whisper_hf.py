"""Whisper (WhisperForConditionalGeneration) as users bring it (tests/whisper_fixtures.py:
random weights at the real models' widths, heads, mel bins, 1,500 source and 448 target
positions and vocabularies, fewer layers): every tensor name and shape at the four real
sizes, logits equal to transformers' over a whole target given the log-mel features of real
speech (espeak-ng), step by step through the caches too, and the directory written back by
export-hf bit-identical; what tinyt does not hold is refused by name.

Tolerance: llama_reference.HF_ATOL (1e-4), the same float32 arithmetic in another order (tinyt
fuses q, k, v and scales q.k where Whisper scales q). Both sides are exact in float64 (agree to
1e-12 here); in float32 each is ~5e-4 from float64 at weights of std 0.2 (logits to 22, the
residual stream to ~50: u·sqrt(K) of that per sum, over 1,500 keys), so the fixture draws std
0.1 (logits to ~11): measured 9e-6. A wrong stem (no GELU, stride 1), a position table
shifted a row or a missing final norm moves logits by 0.1 or more."""
import json
import re

import pytest
import torch
from llama_reference import HF_ATOL
from whisper_fixtures import WHISPER, save_whisper, speech_features, whisper_config

import tinyt.hf as hf
from tinyt.checkpoint import load_checkpoint, unique_state_dict
from tinyt.config import ModelConfig
from tinyt.errors import ConfigError, ConversionError
from tinyt.hf import import_hf, to_hf

TARGET = 40  # tokens of the teacher-forced target
# transformers' save moves config.json's generation keys into generation_config.json, and says so
pytestmark = pytest.mark.filterwarnings("ignore:Moving the following attributes")
_made: dict[str, tuple] = {}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> (transformers' model, its directory, tinyt's checkpoint directory), made once."""
    def make(name: str):
        if name not in _made:
            root = tmp_path_factory.mktemp(name)
            model = save_whisper(name, root / "hf")
            _made[name] = (model, root / "hf", import_hf(root / "hf", root / "ck"))
        return _made[name]
    return make


def _hf_config(name: str, layers: tuple[int, int] | None = None) -> dict:
    settings = {} if layers is None else dict(encoder_layers=layers[0],
                                              decoder_layers=layers[1])
    config = whisper_config(name, **settings)
    return {**config.to_dict(), "architectures": ["WhisperForConditionalGeneration"]}


@pytest.mark.parametrize("name", sorted(WHISPER))
def test_the_real_shapes_map_every_tensor(name):
    """At the real layer counts (on the meta device: names and shapes, no memory): the config
    reads as the model, and tinyt's tensors under Whisper's names are transformers' own,
    name for name and shape for shape (proj_out is the decoder's table, tied)."""
    from transformers import WhisperForConditionalGeneration

    from tinyt.hf.weights import pairs, tinyt_shapes

    real = WHISPER[name][1]
    config = _hf_config(name, real)
    cfg = hf.config_from_hf(hf.WHISPER, config, "config.json")
    assert (cfg.n_layer, cfg.decoder_layers, cfg.n_embd, cfg.n_head, cfg.mlp_width) == \
        (*real, config["d_model"], config["encoder_attention_heads"], config["encoder_ffn_dim"])
    assert (cfg.n_mels, cfg.source_positions, cfg.block_size, cfg.vocab_size) == \
        (config["num_mel_bins"], 1500, 448, config["vocab_size"])
    assert (cfg.decoder_start_id, cfg.tie_weights, cfg.shared_embeddings) == (50258, True, False)
    with torch.device("meta"):
        theirs = WhisperForConditionalGeneration(whisper_config(name, **dict(zip(
            ("encoder_layers", "decoder_layers"), real))))
    want = {k: tuple(v.shape) for k, v in theirs.state_dict().items() if k != "proj_out.weight"}
    have, got = tinyt_shapes(cfg), {}
    for p in pairs(hf.WHISPER, cfg):  # each tinyt tensor split by rows into Whisper's
        shape = have[p.ours]
        for theirs_name, rows in zip(p.theirs, p.rows or (shape[0],)):
            if not theirs_name.endswith(hf.WHISPER.absent):  # k_proj has no bias
                got[theirs_name] = (rows, *shape[1:])
    assert got == want
    assert hf.writer_for(cfg, "x") is hf.WHISPER


def _cases(names):
    return [pytest.param(n, marks=pytest.mark.slow) if n == "large-v3-turbo" else n
            for n in names]


@pytest.mark.parametrize("name", _cases(["tiny", "large-v3-turbo"]))
def test_logits_equal_transformers_on_speech_forced_and_cached(name, imported):
    features = speech_features(WHISPER[name][0]["num_mel_bins"])
    if features is None:
        pytest.skip("espeak-ng is not installed (scripts/setup.sh installs it with apt)")
    theirs, _, ck_dir = imported(name)
    ck = load_checkpoint(ck_dir)
    ours = ck.model.eval()
    assert ck.tokenizer.eos_id == theirs.config.eos_token_id == 50257
    x = torch.from_numpy(features)[None]  # (1, n_mels, 3000)
    target = torch.randint(0, ck.config.vocab_size, (1, TARGET),
                           generator=torch.Generator().manual_seed(0))
    target[0, 0] = ck.config.decoder_start_id
    with torch.no_grad():
        want = theirs(input_features=x, decoder_input_ids=target).logits
        assert want.shape == (1, TARGET, ck.config.vocab_size)
        worst = float((ours(x, None, target) - want).abs().max())
        assert worst <= HF_ATOL, ("teacher forcing", worst)
        cross = ours.cross_kv(ours.encode(x))  # the encoder once, then the caches
        mask = ours.source_ones(x)
        logits, past = ours.decode(target[:, :4], cross, mask)
        worst = float((logits - want[:, :4]).abs().max())
        for t in range(4, TARGET):
            logits, past = ours.decode(target[:, t:t + 1], cross, mask, past)
            worst = max(worst, float((logits[:, 0] - want[:, t]).abs().max()))
        assert worst <= HF_ATOL, ("cached", worst)


def test_export_hf_writes_it_back_bit_identically(imported, tmp_path):
    """Every safetensors tensor equal, config.json's keys and values equal (but transformers'
    version and the tinyt block), and import -> export-hf -> import the same checkpoint."""
    from safetensors.torch import load_file

    _, src_dir, ck_dir = imported("tiny")
    out = to_hf(ck_dir, tmp_path / "out")
    a, b = load_file(src_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    assert [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])] == []
    first, back = (json.loads((d / "config.json").read_text()) for d in (src_dir, out))
    assert back.pop("tinyt")["logits_max_abs_diff"] <= HF_ATOL
    assert {k: v for k, v in back.items() if k != "transformers_version"} == \
        {k: v for k, v in first.items() if k != "transformers_version"}
    again = load_checkpoint(import_hf(out, tmp_path / "again"))
    ck = load_checkpoint(ck_dir)
    assert again.config == ck.config
    x, y = unique_state_dict(ck.model), unique_state_dict(again.model)
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("overrides, says", [
    (dict(decoder_attention_heads=3), "decoder_attention_heads=3 with "
     "encoder_attention_heads=6 is not implemented"),
    (dict(activation_function="gelu_10"), "activation_function='gelu_10' is not implemented"),
    (dict(max_source_positions=0), "source_positions=0 is invalid"),
])
def test_what_tinyt_does_not_hold_is_refused_by_name(overrides, says):
    config = {**_hf_config("tiny"), **overrides}
    with pytest.raises(ConversionError, match=re.escape(says)):
        hf.config_from_hf(hf.WHISPER, config, "config.json")


def test_audio_settings_are_checked_and_only_whisper_writes_them():
    cfg = ModelConfig(task="seq2seq", vocab_size=300, n_layer=1, n_head=2, n_embd=32,
                      n_mels=8, source_positions=10, shared_embeddings=False)
    assert hf.writer_for(cfg, "x") is hf.WHISPER
    from tinyt.model import build_model

    model = build_model(cfg)
    with pytest.raises(ConfigError, match=re.escape("an audio encoder reads features (batch, "
                                                    "8, 20); got (1, 8, 30)")):
        model.encode(torch.zeros(1, 8, 30))
    with pytest.raises(ConversionError, match=re.escape("WhisperForConditionalGeneration: its "
                                                        "source is audio (num_mel_bins)")):
        hf.writer_for(ModelConfig(task="seq2seq", vocab_size=300, n_layer=1, n_head=2,
                                  n_embd=32, shared_embeddings=False), "x",
                      among=(hf.WHISPER,))
    for bad, says in ((dict(shared_embeddings=True), "an audio encoder has no token table"),
                      (dict(source_positions=None), "source_positions=None is invalid"),
                      (dict(task="causal_lm", shared_embeddings=True), "n_mels=8 is invalid")):
        with pytest.raises(ConfigError, match=re.escape(says)):
            ModelConfig(**{**cfg.to_dict(), **bad})


def test_tokens_and_generation_config_go_through_import_and_export(imported, tmp_path):
    """The special tokens read from tokenizer.json's added tokens; generation_config.json
    (suppressed and begin-suppressed ids, forced ids, language and task tables, the
    no-timestamps id, alignment heads) kept whole and written back as it came; transformers'
    WhisperTokenizer on the written directory makes the prefix tinyt's ids say."""
    from transformers import AutoTokenizer, GenerationConfig

    from tinyt.hf.speech import load_speech

    theirs, src_dir, ck_dir = imported("tiny")
    speech = load_speech(ck_dir)
    tokens = speech["tokens"]
    assert (tokens["start"], tokens["end"], tokens["no_timestamps"], tokens["previous"],
            tokens["timestamp_begin"], tokens["timestamps"]) == \
        (50258, 50257, 50363, 50361, 50364, 1501)
    assert tokens["tasks"] == {"transcribe": 50359, "translate": 50358}
    assert len(tokens["languages"]) == 99 and tokens["languages"]["en"] == 50259
    source = json.loads((src_dir / "generation_config.json").read_text())
    assert speech["generation_config"] == source
    out = to_hf(ck_dir, tmp_path / "out")
    assert json.loads((out / "generation_config.json").read_text()) == source
    gen, want = GenerationConfig.from_pretrained(out), theirs.generation_config
    for key in ("suppress_tokens", "begin_suppress_tokens", "forced_decoder_ids", "lang_to_id",
                "task_to_id", "no_timestamps_token_id", "alignment_heads",
                "decoder_start_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(gen, key) == getattr(want, key), key
    tok = AutoTokenizer.from_pretrained(out)
    tok.set_prefix_tokens(language="english", task="transcribe", predict_timestamps=False)
    assert tok.prefix_tokens == [tokens["start"], tokens["languages"]["en"],
                                 tokens["tasks"]["transcribe"], tokens["no_timestamps"]]


def test_large_v3_ids_shift_by_its_hundredth_language():
    from whisper_fixtures import whisper_tokenizer

    from tinyt.hf.speech import speech_tokens
    from tinyt.tokenizer import Tokenizer

    tokens = speech_tokens(Tokenizer(whisper_tokenizer(51866)))
    assert len(tokens["languages"]) == 100 and tokens["languages"]["yue"] == 50358
    assert (tokens["tasks"]["transcribe"], tokens["no_timestamps"],
            tokens["timestamp_begin"]) == (50360, 50364, 50365)


def test_a_generation_config_of_another_tokenizer_is_refused(tmp_path):
    """A large-v3 generation_config.json (its task ids a place later) beside a v2 tokenizer."""
    from whisper_fixtures import generation_config, whisper_tokenizer

    from tinyt.hf.speech import read_speech
    from tinyt.tokenizer import Tokenizer

    (tmp_path / "generation_config.json").write_text(json.dumps(generation_config(51866, 2)))
    cfg = hf.config_from_hf(hf.WHISPER, _hf_config("tiny"), "config.json")
    with pytest.raises(ConversionError, match=re.escape(
            "generation_config.json's no_timestamps_token_id=50364, but the model's is 50363")):
        read_speech(tmp_path, {}, Tokenizer(whisper_tokenizer(51865)), cfg)
    gen = {**generation_config(51865, 2), "alignment_heads": [[2, 0]]}
    (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    with pytest.raises(ConversionError, match=re.escape(
            "alignment_heads has [2, 0]: each is [decoder layer < 2, head < 6]")):
        read_speech(tmp_path, {}, Tokenizer(whisper_tokenizer(51865)), cfg)



def test_config_json_generation_keys_of_older_saves_come_back(tmp_path):
    """openai/whisper-* config.json files hold forced_decoder_ids, suppress_tokens and
    begin_suppress_tokens themselves (saved before transformers moved them to
    generation_config.json): export-hf writes them back where they were. 64 wide, 1 + 1."""
    from whisper_fixtures import generation_config

    src = tmp_path / "hf"
    save_whisper("tiny", src, d_model=64, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                 encoder_layers=1, decoder_layers=1)
    config = json.loads((src / "config.json").read_text())
    gen = generation_config(51865, 1)
    config.update(forced_decoder_ids=[[1, 50259], [2, 50359], [3, 50363]],
                  suppress_tokens=gen["suppress_tokens"], begin_suppress_tokens=[220, 50257])
    (src / "config.json").write_text(json.dumps(config))
    out = to_hf(import_hf(src, tmp_path / "ck"), tmp_path / "out")
    back = json.loads((out / "config.json").read_text())
    back.pop("tinyt")
    assert {k: v for k, v in back.items() if k != "transformers_version"} == \
        {k: v for k, v in config.items() if k != "transformers_version"}
    assert json.loads((out / "generation_config.json").read_text()) == \
        json.loads((src / "generation_config.json").read_text())
