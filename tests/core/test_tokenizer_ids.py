"""A tokenizer's ids as the model numbers them: a valid tokenizer.json may hold one piece at two
ids (Gemma 3's tab at 247 and 255968, converted from its GGUF), so the vocabulary is the
largest id + 1, not the count of distinct pieces; and a tokenizer that puts a BOS before every
text (Gemma's, Llama's post-processor) has the accuracy report's windows and prompts begin
with it, as every sequence the model was trained on did."""
import json

import numpy as np
from hf_fixtures import VOCAB, save_hf

from tinyt import data as D
from tinyt.config import ModelConfig
from tinyt.tokenizer import Tokenizer, bytes_to_unicode

TAB = bytes_to_unicode()[9]  # the tab byte's piece in a byte-level vocabulary
BOS, EOS = VOCAB - 2, VOCAB - 1  # hf_fixtures' <|im_start|>, <|im_end|>
DUPLICATE = VOCAB - 3  # the tab again, as Gemma's 255968


def duplicate_piece_json() -> str:
    """tokenizer.json text of a byte-level BPE of VOCAB ids: the 256 bytes, <unused{i}> pieces,
    the tab's piece again at DUPLICATE (a repeated key of the vocabulary object: the library's
    piece -> id map keeps the later, leaving id 9 a hole), then BOS and EOS; the post-processor
    puts BOS before every text."""
    table = bytes_to_unicode()
    pieces = [table[b] for b in range(256)] + [f"<unused{i}>" for i in range(256, DUPLICATE)]
    pieces += [TAB, "<|im_start|>", "<|im_end|>"]
    vocab = ",".join(f"{json.dumps(p)}:{i}" for i, p in enumerate(pieces))
    added = [{"id": i, "content": pieces[i], "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": i >= BOS}
             for i in [*range(256, DUPLICATE), BOS, EOS]]
    rest = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True},
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                        {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<|im_start|>": {
                                   "id": "<|im_start|>", "ids": [BOS],
                                   "tokens": ["<|im_start|>"]}}},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True}}
    model = ('{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,'
             '"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,'
             f'"ignore_merges":false,"vocab":{{{vocab}}},"merges":[]}}')
    text = json.dumps(rest)
    return text[:-1] + f',"model":{model}}}'


def test_a_duplicate_piece_leaves_the_vocabulary_its_largest_id_plus_one(tmp_path):
    (tmp_path / "tokenizer.json").write_text(duplicate_piece_json(), encoding="utf-8")
    tok = Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert tok.hf.get_vocab_size(with_added_tokens=True) == VOCAB - 1  # distinct pieces
    assert tok.vocab_size == VOCAB
    assert tok.hf.id_to_token(9) is None and tok.encode("a\tb") == [97, DUPLICATE, 98]
    lengths = tok.token_byte_lengths()  # was IndexError: index VOCAB - 1 out of bounds
    assert lengths.shape == (VOCAB,)
    assert (lengths[DUPLICATE], lengths[9], lengths[97], lengths[BOS], lengths[EOS]) == \
        (1, 0, 1, 0, 0)  # the hole stands for no text; special tokens for none either
    assert tok.start_id == BOS and tok.encode_prompt("ab") == [BOS, 97, 98]
    tok.hf.add_special_tokens(["<extra>"])  # tokens added after: counted again
    assert tok.vocab_size == VOCAB + 1


def test_import_hf_takes_a_duplicate_piece_without_calling_the_last_id_padding(tmp_path):
    from tinyt.checkpoint import load_checkpoint
    from tinyt.hf import import_hf

    save_hf("smollm2", tmp_path / "hf", num_hidden_layers=1)
    (tmp_path / "hf" / "tokenizer.json").write_text(duplicate_piece_json(), encoding="utf-8")
    said = []
    ck = import_hf(tmp_path / "hf", tmp_path / "ck", log=said.append)
    assert not any("padding" in s for s in said), said
    meta = json.loads((ck / "config.json").read_text())
    assert meta["vocab_padding"] == 0, meta["vocab_padding"]
    tok = load_checkpoint(ck).tokenizer
    assert tok.vocab_size == VOCAB and (tok.bos_id, tok.eos_id) == (BOS, EOS)
    assert tok.token_byte_lengths().shape == (VOCAB,)


def test_windows_and_prompts_begin_with_the_bos_the_tokenizer_puts_first(tmp_path, corpus_dir,
                                                                        monkeypatch):
    from tinyt.export import accuracy

    stream = np.arange(100, 160, dtype=np.uint32)
    x, y = D.lm_eval_windows(stream, 8, 3)  # no BOS: as before
    assert (x[:, 1:] == y[:, :-1]).all() and x[0, 0] == 100 and y[0, 0] == 101
    x, y = D.lm_eval_windows(stream, 8, 3, start=BOS)
    assert x.shape == y.shape == (3, 8) and (x[:, 0] == BOS).all()
    assert (x[:, 1:] == y[:, :-1]).all() and y[0, 0] == 100  # each target a token of the stream
    assert BOS not in y

    (tmp_path / "tokenizer.json").write_text(duplicate_piece_json(), encoding="utf-8")
    tok = Tokenizer(Tokenizer.from_file(tmp_path / "tokenizer.json").hf,
                    eos_token="<|im_end|>", bos_token="<|im_start|>")
    cfg = ModelConfig(block_size=32, vocab_size=VOCAB, n_layer=1, n_head=2, n_embd=32)
    seen = {"windows": [], "prompts": []}

    def logits(sess, cfg, kind, xb):  # the graphs stand aside: what they are fed is the test
        seen["windows"].append(xb)
        return np.zeros(xb.shape + (cfg.vocab_size,), np.float32)

    def greedy_rows(sess, cfg, kind, prompts, steps, limit):
        seen["prompts"] += prompts
        return [[0] * steps for _ in prompts]

    monkeypatch.setattr(accuracy, "_logits", logits)
    monkeypatch.setattr(accuracy, "ort_greedy_rows", greedy_rows)
    report = accuracy.lm_accuracy(None, None, cfg, "decoder_with_past", tok, str(corpus_dir),
                                  rows_independent=True)
    windows = np.concatenate(seen["windows"])
    assert windows.shape[1] == report["window"] and (windows[:, 0] == BOS).all()
    assert not (windows[:, 1:] == BOS).any()  # once, at the start
    assert seen["prompts"] and all(p[0] == BOS and BOS not in p[1:] for p in seen["prompts"])
