"""The encoder-decoder families as users bring them (tests/hf_fixtures.py's SEQ2SEQ:
random-weight transformers models at the real models' vocabularies, positions, buckets, ties,
scales, norms and activations, with fewer and narrower layers): Marian (Opus-MT), BART, mBART,
M2M100 / NLLB, T5 v1.0 and Flan-T5. Each imports with logits equal to transformers' over a
whole target (teacher forcing, a right-padded source batch) and step by step through the
caches, makes the tokens of transformers' greedy generate, and goes back to its class
bit-identically; what tinyt does not hold is refused by name.

Tolerance: the same float32 kernels on the same weights, summed in another order where tinyt
fuses q, k, v and the cross k, v (llama_reference.HF_ATOL, 1e-4; measured 7e-7 to 1.6e-5
here, on logits of size 1 to 10). A wrong embedding scale, position form or offset, or T5's
head unscaled, moves them by 0.4 to 7; the subtler slips by 1e-3 (LayerNorm's eps 1e-6 for
1e-5), 6e-3 (the exact GELU for gelu_new) and 0.07 (a bucket distance of 64 for 128): ten
times the bound or more."""
import json
import math
import re

import pytest
import torch
from hf_fixtures import SEQ2SEQ, save_seq2seq, seq2seq_model
from llama_reference import HF_ATOL

import tinyt.hf as hf
from tinyt.checkpoint import load_checkpoint, save_checkpoint, unique_state_dict
from tinyt.config import ModelConfig
from tinyt.errors import CheckpointError, ConversionError
from tinyt.hf import import_hf, to_hf
from tinyt.model import build_model
from tinyt.seq2seq import greedy

FORCED = 700  # NLLB's / M2M100's target language is a token forced first; an id of the fixture's
CASES = {  # name: (fixture, overrides, the entry, what generation forces first)
    "opus-mt": ("opus-mt", {}, "MARIAN", None),
    # a Marian with a decoder table of its own (share_encoder_decoder_embeddings false)
    "opus-mt-unshared": ("opus-mt", dict(share_encoder_decoder_embeddings=False), "MARIAN", None),
    # BART-large-CNN's forced <s> (transformers saves it in generation_config.json)
    "bart-base": ("bart-base", dict(forced_bos_token_id=0), "BART", None),
    "mbart": ("mbart", {}, "MBART", None),
    "m2m100": ("m2m100", {}, "M2M100", FORCED),
    "nllb": ("nllb", {}, "M2M100", FORCED),
    "t5-small": ("t5-small", {}, "T5", None),
    "flan-t5": ("flan-t5", {}, "T5", None),
}
SOURCE, TARGET = 20, 12  # tokens of the padded source's longest row, of the target
HEAVY = ("mbart", "nllb")  # 250,027 and 256,206 ids: 5-8 s a test on 2 cores
# transformers' save moves BART-large-CNN's forced <s> into generation_config.json, and says so
pytestmark = pytest.mark.filterwarnings("ignore:Moving the following attributes")


def _cases(names):
    return [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in names]
_made: dict[str, tuple] = {}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """case -> (transformers' model, its directory, tinyt's checkpoint directory), made once."""
    def make(case: str):
        if case not in _made:
            name, overrides, _, _ = CASES[case]
            root = tmp_path_factory.mktemp(case)
            model = save_seq2seq(name, root / "hf", **overrides)
            _made[case] = (model, root / "hf", import_hf(root / "hf", root / "ck"))
        return _made[case]
    return make


def _batch(cfg: ModelConfig, pad: int):
    """A source of three rows right-padded with `pad` (SOURCE tokens, 9, 2) and a target from
    decoder_start_id, no real token the pad."""
    g = torch.Generator().manual_seed(1)
    mask = (torch.arange(SOURCE)[None] < torch.tensor([SOURCE, 9, 2])[:, None]).long()
    ids = torch.randint(3, 790, (3, SOURCE), generator=g)  # within every fixture's tokenizer
    ids = torch.where(mask.bool(), ids + (ids >= pad).long(), pad)
    target = torch.randint(3, 790, (3, TARGET), generator=g)
    target = target + (target >= pad).long()
    target[:, 0] = cfg.decoder_start_id
    return ids, mask, target


@pytest.mark.parametrize("case", _cases(sorted(CASES)))
def test_import_equals_transformers_forced_cached_and_greedy(case, imported):
    theirs, _, ck_dir = imported(case)
    ck = load_checkpoint(ck_dir)
    cfg, ours = ck.config, ck.model.eval()
    assert cfg.task == "seq2seq" and hf.writer_for(cfg, "x") is getattr(hf, CASES[case][2])
    assert cfg.vocab_size == SEQ2SEQ[CASES[case][0]][2]["vocab_size"]  # the real vocabulary
    assert cfg.decoder_start_id == theirs.generation_config.decoder_start_token_id
    assert cfg.forced_bos_id == theirs.generation_config.forced_bos_token_id
    assert ck.tokenizer.eos_id == theirs.config.eos_token_id
    assert ck.tokenizer.pad_id == theirs.config.pad_token_id
    ids, mask, target = _batch(cfg, theirs.config.pad_token_id)
    with torch.no_grad():
        want = theirs(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
        assert want.shape == (3, TARGET, cfg.vocab_size)
        worst = float((ours(ids, mask, target) - want).abs().max())
        assert worst <= HF_ATOL, ("teacher forcing", worst)
        cross = ours.cross_kv(ours.encode(ids, mask))  # the encoder once, then the caches
        logits, past = ours.decode(target[:, :4], cross, mask)
        worst = float((logits - want[:, :4]).abs().max())
        for t in range(4, TARGET):
            logits, past = ours.decode(target[:, t:t + 1], cross, mask, past)
            worst = max(worst, float((logits[:, 0] - want[:, t]).abs().max()))
        assert worst <= HF_ATOL, ("cached", worst)
        forced = CASES[case][3] if CASES[case][3] is not None else cfg.forced_bos_id
        eos = ck.tokenizer.eos_id
        # the end transformers forces at max_length (forced_eos_token_id) is not tinyt's; a
        # finished row pads with the end in both
        want = theirs.generate(ids, attention_mask=mask, max_new_tokens=10, num_beams=1,
                               do_sample=False, forced_bos_token_id=forced,
                               forced_eos_token_id=None, pad_token_id=eos)
    got = greedy(ours, ids, mask, max_new_tokens=10, eos_id=eos, forced_bos_id=forced)
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("case", _cases(["opus-mt", "opus-mt-unshared", "bart-base", "nllb",
                                         "t5-small", "flan-t5"]))
def test_each_goes_back_to_its_class_bit_identically(case, imported, tmp_path):
    from transformers import AutoModelForSeq2SeqLM

    theirs, _, src = imported(case)
    out = to_hf(src, tmp_path / "out")
    meta = json.loads((out / "config.json").read_text())
    assert meta["architectures"] == [type(theirs).__name__]
    assert meta["tinyt"]["logits_max_abs_diff"] <= HF_ATOL
    back = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    a, b = theirs.state_dict(), back.state_dict()
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    gen = back.generation_config  # what generate starts, forces and stops at
    for key in ("decoder_start_token_id", "forced_bos_token_id", "eos_token_id",
                "pad_token_id", "bad_words_ids"):
        assert getattr(gen, key) == getattr(theirs.generation_config, key), key
    again = load_checkpoint(import_hf(out, tmp_path / "again"))
    first = load_checkpoint(src)
    assert again.config == first.config
    x, y = unique_state_dict(first.model), unique_state_dict(again.model)
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("entry, settings", [
    ("BART", dict(norm_placement="post", pos_encoding="learned", position_offset=2,
                  embedding_norm=True, final_logits_bias=True, n_decoder_layer=1)),
    ("MBART", dict(pos_encoding="learned", position_offset=2, embedding_norm=True,
                   final_logits_bias=True, embedding_multiplier=8.0, forced_bos_id=5)),
    ("MARIAN", dict(norm_placement="post", pos_encoding="sinusoidal", final_logits_bias=True,
                    activation="silu", embedding_multiplier=8.0, shared_embeddings=False,
                    decoder_start_id=299, bad_word_ids=(299,))),
    ("M2M100", dict(pos_encoding="sinusoidal_fairseq", position_offset=2, activation="relu",
                    embedding_multiplier=8.0, decoder_start_id=2)),
    ("T5", dict(norm="rmsnorm", bias=False, pos_encoding="relative", attention_multiplier=1.0,
                activation="geglu_tanh", tie_weights=False, head_size=24, n_decoder_layer=3,
                relative_buckets=16, relative_max_distance=64)),
    ("T5", dict(norm="rmsnorm", bias=False, pos_encoding="relative", attention_multiplier=1.0,
                activation="relu", logits_scaling=8.0)),
])
def test_entries_map_their_config_and_weights_both_ways(entry, settings):
    """Without transformers: the entry writes the model, its config.json reads back as it,
    and every tensor comes back unchanged through the entry's names."""
    from tinyt.hf.weights import pairs

    family = getattr(hf, entry)
    cfg = ModelConfig(task="seq2seq", vocab_size=300, n_layer=2, n_head=4, n_embd=64,
                      n_inner=96, block_size=512, **settings)
    assert hf.writer_for(cfg, "the test model") is family
    written = hf.hf_config(family, cfg, 1, None)
    assert hf.config_from_hf(family, written, "config.json") == cfg
    torch.manual_seed(0)
    model = build_model(cfg)
    theirs = hf.hf_state(family, model)
    assert sorted(theirs) == sorted(n for p in pairs(family, cfg) for n in p.theirs)
    back, ours = hf.state_from_hf(family, theirs, cfg, "test"), unique_state_dict(model)
    assert back.keys() == ours.keys() and all(torch.equal(back[k], ours[k]) for k in ours)


def _config(name: str, **overrides) -> dict:
    import transformers as T

    config_class, model_class, settings = SEQ2SEQ[name]
    config = getattr(T, config_class)(**{**settings, **overrides})
    return {**config.to_dict(), "architectures": [model_class]}


def test_opus_mt_keeps_its_banned_pad_through_import_and_export(imported, tmp_path):
    """Opus-MT's generation_config.json bans its pad (bad_words_ids [[58100]]): the checkpoint
    keeps it, the ONNX export's generation_config.json carries it, and the runtime reads it
    into its rules (tests/runtime: a bad word is never generated)."""
    import tinyt.runtime as rt
    from tinyt.export import export_onnx

    _, _, src = imported("opus-mt")
    cfg = load_checkpoint(src).config
    assert cfg.bad_word_ids == (58100,)
    out = export_onnx(src, tmp_path / "onnx")
    assert json.loads((out / "generation_config.json").read_text())["bad_words_ids"] == [[58100]]
    assert rt.load(out).generation.bad_words == ((58100,),)


@pytest.mark.parametrize("name, overrides, says", [
    ("opus-mt", dict(decoder_vocab_size=32000, share_encoder_decoder_embeddings=False),
     "decoder_vocab_size=32000 with vocab_size=58101 is not implemented: a target vocabulary "
     "of its own"),
    ("bart-base", dict(decoder_attention_heads=6),
     "decoder_attention_heads=6 with encoder_attention_heads=12 is not implemented"),
    ("bart-base", dict(activation_function="gelu_10"),
     "activation_function='gelu_10' is not implemented by tinyt's model"),
    ("flan-t5", dict(feed_forward_proj="gated-relu"),
     "feed_forward_proj='gated-relu' is not implemented by tinyt's model (T5's MLPs tinyt "
     "runs); allowed: relu, gated-gelu"),
    ("mbart", dict(decoder_start_token_id=None, bos_token_id=None),
     "decoder_start_token_id=None: an encoder-decoder needs the id its decoder starts at"),
    ("opus-mt", dict(bad_words_ids=[[5, 6]]),
     "bad_words_ids=[[5, 6]] is not implemented: tinyt bans single tokens"),
])
def test_what_tinyt_does_not_hold_is_refused_by_name(name, overrides, says):
    family = hf.family_of(_config(name), "config.json")
    with pytest.raises(ConversionError, match=re.escape(says)):
        hf.config_from_hf(family, _config(name, **overrides), "config.json")


def test_a_tokenizer_tinyt_cannot_read_or_a_pad_apart_is_refused(tmp_path):
    """Marian's SentencePiece pair without a tokenizer.json (transformers has no fast Marian
    tokenizer to write one) is refused naming what to bring; a <pad> that is not the model's
    pad_token_id is refused, as is a model that no encoder-decoder class holds."""
    d = tmp_path / "marian"
    seq2seq_model("opus-mt", encoder_layers=1, decoder_layers=1).save_pretrained(d)
    for name in ("source.spm", "target.spm", "vocab.json"):
        (d / name).write_text("")
    with pytest.raises(CheckpointError, match="has source.spm / target.spm and no "
                       "tokenizer.json: tinyt reads tokenizer.json, and transformers' "
                       "MarianTokenizer has no fast form"):
        import_hf(d, tmp_path / "ck")
    m = tmp_path / "m2m"
    save_seq2seq("m2m100", m, pad_token_id=3, encoder_layers=1, decoder_layers=1)
    with pytest.raises(ConversionError, match=re.escape(
            "config.json's pad_token_id=3 is not the tokenizer's <pad> (1)")):
        import_hf(m, tmp_path / "ck2")
    from tinyt.tokenizer import Tokenizer

    own = ModelConfig(task="seq2seq", vocab_size=300, n_layer=1, n_head=2, n_embd=32)
    src = save_checkpoint(tmp_path / "own", build_model(own), Tokenizer.byte_level())
    with pytest.raises(ConversionError) as e:
        to_hf(src, tmp_path / "out")
    assert "cannot be written as BartForConditionalGeneration / " in str(e.value)
    assert "a MarianMTModel has" in str(e.value) and not (tmp_path / "out").exists()


def test_the_fixtures_carry_the_real_models_settings():
    """Vocabularies, positions, heads, buckets, ties and scales as the real config.json files
    say (the layers and widths cut)."""
    t5 = _config("flan-t5")
    assert (t5["vocab_size"], t5["num_heads"], t5["relative_attention_num_buckets"],
            t5["relative_attention_max_distance"], t5["is_gated_act"], t5["dense_act_fn"],
            t5["tie_word_embeddings"]) == (32128, 6, 32, 128, True, "gelu_new", False)
    assert t5["d_kv"] * t5["num_heads"] != t5["d_model"]  # as Flan-T5-small's 6 x 64 of 512
    marian = _config("opus-mt")
    assert (marian["vocab_size"], marian["max_position_embeddings"], marian["scale_embedding"],
            marian["pad_token_id"], marian["decoder_start_token_id"]) == \
        (58101, 512, True, 58100, 58100)
    assert {n: _config(n)["vocab_size"] for n in ("bart-base", "m2m100", "nllb", "mbart")} == \
        {"bart-base": 50265, "m2m100": 128112, "nllb": 256206, "mbart": 250027}
    assert math.isclose(hf.config_from_hf(hf.MARIAN, marian, "x").embedding_multiplier,
                        math.sqrt(64))
