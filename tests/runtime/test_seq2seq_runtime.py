"""The encoder-decoder in the torch-free runtime (runtime/encoder_decoder.py, beam.py, rules.py):
greedy against tinyt.seq2seq.greedy, beam search against transformers' generate, sampling,
argument checks and `tinyt translate`.

The models and their artifacts: tests/seq2seq_fixtures.py."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
from cli_run import run_cli
from seq2seq_fixtures import seq2seq_artifact

import tinyt.runtime as rt
from tinyt.errors import ConfigError
from tinyt.runtime.beam import BeamParams, beam_search
from tinyt.runtime.encoder_decoder import DecoderSteps
from tinyt.runtime.rules import Rules
from tinyt.seq2seq import greedy
from tinyt.tokenizer import Tokenizer

SOURCES = ["The cat sat on the mat.", "Hi", "A longer source, with some more words in it."]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models on a shared machine: one thread is fastest (torch's default, a thread per
    core, waits on the others' work)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """form -> (torch model, loaded runtime model), each exported once."""
    made = {}

    def get(form: str):
        if form not in made:
            model, path = seq2seq_artifact(tmp_path_factory.mktemp(f"s2s-{form}"), form)
            made[form] = model, rt.load(path, threads=1)
        return made[form]
    return get


@pytest.fixture(scope="module", params=["learned", "t5"])
def pair(request, built):
    return built(request.param)


@pytest.fixture(scope="module")
def learned(built):
    return built("learned")


def _batch(tok: Tokenizer, texts=SOURCES) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """Right-padded ids and mask of `texts`, and their rows."""
    rows = [tok.encode_prompt(t) for t in texts]
    ids = torch.full((len(rows), max(map(len, rows))), tok.eos_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
    return ids, mask, rows


def _until_eos(row: list[int], eos: int) -> list[int]:
    return row[:row.index(eos)] if eos in row else row


def test_greedy_matches_torch_on_a_padded_batch(pair):
    model, mt = pair
    eos = mt.tokenizer.eos_id
    ids, mask, rows = _batch(mt.tokenizer)
    for n in (1, 20):
        want = greedy(model, ids, mask, max_new_tokens=n, eos_id=eos)[:, 1:].tolist()
        got = mt.generate_ids(rows, max_new_tokens=n)
        assert [r.token_ids for r in got] == [_until_eos(w, eos) for w in want], n
        assert [r.finish_reason for r in got] == [
            "eos" if eos in w else "length" for w in want]
    lang = mt.tokenizer.hf.token_to_id("__de__")
    want = greedy(model, ids, mask, max_new_tokens=12, eos_id=eos, forced_bos_id=lang)
    got = mt.generate_ids(rows, max_new_tokens=12, tgt_lang="de")
    assert [r.token_ids for r in got] == [_until_eos(w, eos) for w in want[:, 1:].tolist()]
    assert all(r.token_ids[0] == lang and "__de__" not in r.text for r in got)


def test_greedy_reaches_the_decoders_last_position(pair, monkeypatch):
    """With no end-of-sequence token every row runs to block_size new tokens: the decoder
    reads positions 0..block_size - 1, and not one more."""
    model, mt = pair
    monkeypatch.setattr(mt, "generation", dataclasses.replace(mt.generation, eos=()))
    ids, mask, rows = _batch(mt.tokenizer, SOURCES[:2])
    n = model.config.block_size
    want = greedy(model, ids, mask, max_new_tokens=n)[:, 1:].tolist()
    got = mt.generate_ids(rows, max_new_tokens=n)
    assert [r.token_ids for r in got] == want
    assert [r.finish_reason for r in got] == ["length", "length"]
    with pytest.raises(ConfigError, match=f"at most {n} positions"):
        mt.generate_ids(rows, max_new_tokens=n + 1)


def _torch_steps(model, ids, mask):
    """beam_search's first logits and step function over the torch model, without a cache:
    every step decodes each row's whole target again."""
    cross = model.cross_kv(model.encode(ids, mask))
    state = {"seq": torch.full((len(ids), 1), model.config.decoder_start_id),
             "src": torch.arange(len(ids))}

    @torch.no_grad()
    def logits():
        src = state["src"]
        out, _ = model.decode(state["seq"], tuple((k[src], v[src]) for k, v in cross),
                              mask[src])
        return out[:, -1].numpy()

    def step(parents, tokens):
        p = torch.from_numpy(parents)
        state["seq"] = torch.cat([state["seq"][p], torch.from_numpy(tokens)[:, None]], 1)
        state["src"] = state["src"][p]
        return logits()

    return logits(), step


BEAM_CASES = [  # num_beams, length_penalty, no_repeat_ngram_size, early_stopping, new tokens
    (4, 1.0, 0, False, 24), (4, 2.0, 2, "never", 24), (3, -0.5, 3, True, 16)]


@pytest.mark.parametrize("case", BEAM_CASES)
def test_beam_search_matches_the_torch_model(pair, case):
    """The runtime's beams (caches reordered, cross keys / values expanded) choose as the
    same search over the torch model's logits without a cache."""
    model, mt = pair
    K, lp, ngram, early, n = case
    ids, mask, rows = _batch(mt.tokenizer)
    with torch.no_grad():
        first, step = _torch_steps(model, ids, mask)
    start = model.config.decoder_start_id
    want = beam_search(first, step, [[start]] * len(rows), BeamParams(K, lp, early),
                       eos=[mt.tokenizer.eos_id], max_new_tokens=n,
                       rules=Rules(max_new_tokens=n, no_repeat_ngram_size=ngram))
    got = mt.generate_ids(rows, num_beams=K, length_penalty=lp, no_repeat_ngram_size=ngram,
                          early_stopping=early, max_new_tokens=n)
    assert [(r.token_ids, r.finish_reason) for r in got] == want


def test_beam_of_one_source_is_the_same_in_a_batch(learned):
    _, mt = learned
    alone = [mt.generate(s, num_beams=4, max_new_tokens=16) for s in SOURCES]
    assert mt.generate(SOURCES, num_beams=4, max_new_tokens=16) == alone


# -- the search itself against transformers' generate --------------------------------------
HF_V, HF_EOS, HF_PAD, HF_WEIGHT_STD = 40, 0, 39, 0.6
HF_CASES = [  # num_beams, length_penalty, no_repeat_ngram_size, early_stopping, new tokens,
    # forced first token, forced eos, banned words
    (4, 1.0, 0, False, 12, None, False, ()),
    (4, 2.0, 0, False, 12, None, False, ()),
    (4, -0.5, 2, True, 10, None, False, ()),
    (3, 0.7, 3, "never", 15, None, False, ()),
    (4, 1.0, 0, "never", 9, 5, True, ((HF_PAD,), (7, 8))),
    (1, 1.0, 0, False, 12, None, False, ()),  # transformers' greedy
]


def _bart(seed: int, eos_boost: float):
    """A random BartForConditionalGeneration (learned positions, untied head, weights at
    HF_WEIGHT_STD: less repetitive than a random Marian's), eos boosted by `eos_boost`."""
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(seed)
    cfg = BartConfig(vocab_size=HF_V, d_model=32, encoder_layers=2, decoder_layers=2,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                     decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=HF_PAD,
                     eos_token_id=HF_EOS, bos_token_id=1, decoder_start_token_id=HF_PAD,
                     forced_bos_token_id=None, forced_eos_token_id=None,
                     init_std=HF_WEIGHT_STD, tie_word_embeddings=False)
    model = BartForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        model.final_logits_bias[0, HF_EOS] = eos_boost
    return model


def _hf_steps(model, ids, mask):
    from transformers.modeling_outputs import BaseModelOutput

    memory = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    state = {"seq": torch.full((len(ids), 1), HF_PAD), "src": torch.arange(len(ids))}

    @torch.no_grad()
    def logits():
        src = state["src"]
        return model(encoder_outputs=BaseModelOutput(memory[src]), attention_mask=mask[src],
                     decoder_input_ids=state["seq"]).logits[:, -1].numpy()

    def step(parents, tokens):
        p = torch.from_numpy(parents)
        state["seq"] = torch.cat([state["seq"][p], torch.from_numpy(tokens)[:, None]], 1)
        state["src"] = state["src"][p]
        return logits()

    return logits(), step


def test_beam_search_matches_transformers():
    """runtime/beam.py and runtime/rules.py driven by a transformers BART's own logits
    choose what its generate() chooses, on a batch of two sources (one padded), for two
    random models: one whose hypotheses end early, one whose beams part from greedy."""
    endings = set()
    for seed in (0, 1):
        endings |= _against_transformers(_bart(seed, eos_boost=2.0), seed)
    assert {r for r, _ in endings} == {"eos", "length"} and len(endings) > 6  # not trivial


def _against_transformers(model, seed: int) -> set[tuple[str, int]]:
    """Each HF_CASES search against model.generate; the (finish reason, length) met."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, HF_PAD, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    ids[1, 5:], mask[1, 5:] = HF_PAD, 0
    endings = set()
    for K, lp, ngram, early, n, bos, forced_eos, bad in HF_CASES:
        with torch.no_grad():
            ref = model.generate(input_ids=ids, attention_mask=mask, num_beams=K,
                                 length_penalty=lp, no_repeat_ngram_size=ngram,
                                 early_stopping=early, max_new_tokens=n, do_sample=False,
                                 forced_bos_token_id=bos,
                                 forced_eos_token_id=HF_EOS if forced_eos else None,
                                 bad_words_ids=[list(w) for w in bad] or None)
        with torch.no_grad():
            first, step = _hf_steps(model, ids, mask)
        rules = Rules(max_new_tokens=n, no_repeat_ngram_size=ngram, forced_bos=bos,
                      forced_eos=(HF_EOS,) if forced_eos else (), bad_words=bad)
        got = beam_search(first, step, [[HF_PAD]] * 2, BeamParams(K, lp, early), eos=[HF_EOS],
                          max_new_tokens=n, rules=rules)
        for b, (tokens, reason) in enumerate(got):
            want = ref[b, 1:].tolist()
            ended = HF_EOS in want
            want = want[:want.index(HF_EOS)] if ended else want[:n]
            assert (tokens, reason) == (want, "eos" if ended else "length"), (K, lp, b)
            endings.add((reason, len(tokens)))
    return endings


# -- an imported Opus-MT end to end against transformers ---------------------------------------
MARIAN_EOS_BOOST = 8.0  # the fixture's logits reach ~10: hypotheses end at many lengths


@pytest.fixture(scope="module")
def opus_mt(tmp_path_factory):
    """(transformers' random Opus-MT at its real vocabulary, the runtime on its import)."""
    from hf_fixtures import save_seq2seq

    from tinyt.export.exporter import export_onnx
    from tinyt.hf import import_hf

    root = tmp_path_factory.mktemp("opus-mt")
    theirs = save_seq2seq("opus-mt", root / "hf")
    with torch.no_grad():
        theirs.final_logits_bias[0, theirs.config.eos_token_id] += MARIAN_EOS_BOOST
    theirs.save_pretrained(root / "hf", safe_serialization=True)
    export_onnx(import_hf(root / "hf", root / "ck"), root / "onnx")
    return theirs, rt.load(root / "onnx", threads=1)


@pytest.mark.parametrize("case", [(1, 1.0, 0, False), (4, 1.0, 0, False),
                                  (4, 2.0, 2, "never"), (3, 0.5, 0, True)])
def test_an_imported_marian_generates_as_transformers(opus_mt, case):
    """Greedy and beams of the imported artifact give transformers' generate() tokens on a
    padded batch (its forced_eos_token_id off: tinyt's import does not carry it)."""
    theirs, mt = opus_mt
    K, lp, ngram, early = case
    pad, eos = theirs.config.pad_token_id, theirs.config.eos_token_id
    ids = torch.randint(3, 790, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, 6:], mask[1, 6:] = pad, 0
    with torch.no_grad():
        ref = theirs.generate(ids, attention_mask=mask, num_beams=K, length_penalty=lp,
                              no_repeat_ngram_size=ngram, early_stopping=early,
                              max_new_tokens=12, do_sample=False, forced_eos_token_id=None)
    got = mt.generate_ids([ids[0].tolist(), ids[1, :6].tolist()], num_beams=K,
                          length_penalty=lp, no_repeat_ngram_size=ngram, early_stopping=early,
                          max_new_tokens=12)
    want = [_until_eos(r[1:], eos) for r in ref.tolist()]
    assert [r.token_ids for r in got] == want
    assert [r.finish_reason for r in got] == ["eos" if eos in r else "length"
                                              for r in ref[:, 1:].tolist()]
    text = "The cat sat on the mat."  # the tokenizer's post-processor ends it with </s>
    (one,) = mt.generate_details([text], num_beams=K, max_new_tokens=12)
    source = torch.tensor([mt.tokenizer.encode_prompt(text)])
    assert source[0, -1] == eos
    with torch.no_grad():
        ref = theirs.generate(source, num_beams=K, max_new_tokens=12, do_sample=False,
                              forced_eos_token_id=None)
    assert one.token_ids == _until_eos(ref[0, 1:].tolist(), eos)


# -- sampling, arguments, the CLI ------------------------------------------------------------
def test_sampling_is_reproducible(learned):
    _, mt = learned
    kw = dict(temperature=1.0, top_k=50, max_new_tokens=16)
    one = mt.generate_details(SOURCES, seed=7, **kw)
    assert [r.token_ids for r in one] == [r.token_ids for r in
                                          mt.generate_details(SOURCES, seed=7, **kw)]
    alone = [mt.generate_details([s], seed=7, **kw)[0].token_ids for s in SOURCES]
    assert [r.token_ids for r in one] == alone  # each source its own generator
    others = {tuple(mt.generate_details(SOURCES[:1], seed=s, **kw)[0].token_ids)
              for s in range(5)}
    assert len(others) > 1


@pytest.mark.parametrize("kwargs,needle", [
    (dict(num_beams=0), "num_beams=0 is invalid"),
    (dict(max_new_tokens=-1), "max_new_tokens=-1 is invalid: an integer in 0..64"),
    (dict(max_new_tokens=65), "at most 64 positions"),
    (dict(length_penalty=float("nan")), "length_penalty=nan"),
    (dict(early_stopping="sometimes"), "True, False or 'never'"),
    (dict(no_repeat_ngram_size=-2), "no_repeat_ngram_size=-2"),
    (dict(num_beams=2, temperature=0.7), "beam search here is deterministic"),
    (dict(tgt_lang="xx"), "__de__, __fr__"),
    (dict(tgt_lang="de", forced_bos_token_id=3), "not both"),
    (dict(forced_bos_token_id=999), "0..258"),
    (dict(top_k=0), "top_k=0"),
    (dict(beams=2), "unknown generation argument(s) ['beams']"),
])
def test_bad_arguments_are_refused_by_name(learned, kwargs, needle):
    _, mt = learned
    with pytest.raises(ConfigError, match=re.escape(needle)):
        mt.generate("Hello", **kwargs)


def test_a_source_past_the_block_and_no_language_tokens(learned):
    _, mt = learned
    with pytest.raises(ConfigError, match="65 tokens; this model reads at most 64"):
        mt.generate("x" * 65)
    assert mt.generate_ids([[1, 2, 3]], max_new_tokens=0)[0].finish_reason == "length"
    plain = Tokenizer.byte_level()
    from tinyt.runtime.encoder_decoder import language_id
    with pytest.raises(ConfigError, match="has no language tokens"):
        language_id(plain, "de")
    assert language_id(mt.tokenizer, "__fr__") == language_id(mt.tokenizer, "fr") == 258


def test_decoder_steps_reorder_rows(learned):
    """A row continued from another row reads that row's cache: the same logits as the
    source decoded alone."""
    _, mt = learned
    rows = [mt.tokenizer.encode_prompt(s) for s in SOURCES]
    memory, mask = mt.encode(rows)
    steps = DecoderSteps(mt, memory, mask)
    steps.first(mt.generation.decoder_start)
    mixed = steps(np.array([2, 0, 2]), np.array([5, 6, 7]))  # row 1 dropped, row 2 twice
    for r, (src, tok) in enumerate([(2, 5), (0, 6), (2, 7)]):
        alone = DecoderSteps(mt, *mt.encode([rows[src]]))
        alone.first(mt.generation.decoder_start)
        np.testing.assert_allclose(mixed[r], alone(np.array([0]), np.array([tok]))[0],
                                   atol=1e-4)


def test_translate_cli(learned, monkeypatch, capsys, tmp_path):
    _, mt = learned
    art = mt.artifact.path
    lines = tmp_path / "in.txt"
    lines.write_text("From a file\n", encoding="utf-8")
    code, out, err = run_cli(monkeypatch, capsys, "translate", art, "Hello", "World",
                             "--file", lines, "--beams", "2", "--max-new-tokens", "8")
    assert code == 0, err
    want = mt.generate(["Hello", "World", "From a file"], num_beams=2, max_new_tokens=8)
    assert out.split("\n") == [w.replace("\n", "\\n") for w in want] + [""]  # not splitlines: \x1d
    code, out, err = run_cli(monkeypatch, capsys, "translate", art, "Hi", "--tgt-lang", "zz")
    assert code == 2 and "__de__, __fr__" in err
    code, out, err = run_cli(monkeypatch, capsys, "generate", art, "Hi")
    assert code == 2 and "tinyt translate" in err
    code, out, err = run_cli(monkeypatch, capsys, "serve", art, "--port", "0",
                             "--prefill-chunk", "4")  # served: tests/server/test_seq2seq_serve.py
    assert code == 2 and "is an encoder-decoder: --prefill-chunk only apply" in err
