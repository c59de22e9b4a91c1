"""Byte-level tokenizers saved as a standard Hugging Face `tokenizer.json` (torch-free).

Two kinds, one file format:
- `bpe`: byte-level BPE trained on the corpus (GPT-2's scheme), vocab size configurable;
- `byte`: the 256 bytes themselves (token id == byte value), no merges.
Both end with one special token, `<|endoftext|>`, used as document separator, EOS and pad
(a `byte` tokenizer made for an imported byte-level model may have none). An encoder-decoder's
adds `<pad>` after it: its padding and decoder start, distinct from the EOS, as Marian's.
Any UTF-8 text round-trips exactly: encode never drops or normalises a byte.

An imported tokenizer (a Llama-family model's) may end text with another token, begin
prompts with a BOS token and carry a chat template: those live where Hugging Face keeps them,
in `tokenizer_config.json` beside `tokenizer.json`, and travel with it through every stage.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from tinyt.errors import ConfigError, DataError
from tinyt.fsutil import read_json_object

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<pad>"  # an encoder-decoder's padding and first decoder token (Marian's convention)
MIN_BPE_VOCAB = 257  # 256 bytes + <|endoftext|>
TOKENIZER_CONFIG = "tokenizer_config.json"  # eos / bos tokens and the chat template, as HF's
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where newer transformers save the template


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, codes)}


def _byte_level_parts(tok: HFTokenizer) -> None:
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()


class Tokenizer:
    """A thin wrapper over a Hugging Face tokenizer with tinyt's conventions."""

    def __init__(self, hf: HFTokenizer, *, eos_token: str = EOS_TOKEN,
                 bos_token: str | None = None, chat_template: str | list | None = None):
        self.hf = hf
        self._size: tuple[int | None, int] = (None, 0)  # (distinct pieces, vocab_size) of hf
        self.eos_token, self.bos_token = eos_token, bos_token
        self.eos_id: int | None = hf.token_to_id(eos_token)
        self.bos_id: int | None = None if bos_token is None else hf.token_to_id(bos_token)
        for role, token, idx in (("eos", eos_token, self.eos_id), ("bos", bos_token, self.bos_id)):
            if token is not None and idx is None and token != EOS_TOKEN:
                raise DataError(f"the {role} token {token!r} is not in the tokenizer's vocabulary")
        self.chat_template = chat_template  # a Jinja string, or HF's list of named templates

    @property
    def settings(self) -> dict:
        """What tokenizer_config.json carries for tinyt (empty for tinyt's own tokenizers)."""
        out: dict = {}
        if self.eos_token != EOS_TOKEN:
            out["eos_token"] = self.eos_token
        if self.bos_token is not None:
            out["bos_token"] = self.bos_token
        if self.chat_template is not None:
            out["chat_template"] = self.chat_template
        return out

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def byte_level(cls, *, end_of_text: bool = True) -> Tokenizer:
        """The plain 256-byte tokenizer: id == byte value, then <|endoftext|> = 256.
        end_of_text=False: the 256 bytes alone (a byte-level nanoGPT model has no such token)."""
        table = bytes_to_unicode()
        vocab = {table[b]: b for b in range(256)}
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
        _byte_level_parts(hf)
        if end_of_text:
            hf.add_special_tokens([EOS_TOKEN])
        return cls(hf)

    @classmethod
    def train_bpe(cls, texts: Iterable[str], vocab_size: int) -> Tokenizer:
        """Train byte-level BPE on `texts`; the result has at most `vocab_size` tokens."""
        if not isinstance(vocab_size, int) or vocab_size < MIN_BPE_VOCAB:
            raise ConfigError(
                f"vocab_size={vocab_size!r} is too small for byte-level BPE: it needs at least "
                f"{MIN_BPE_VOCAB} (256 bytes + {EOS_TOKEN}); use tokenizer='byte' for bytes only"
            )
        hf = HFTokenizer(models.BPE())
        _byte_level_parts(hf)
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOS_TOKEN],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        hf.train_from_iterator(texts, trainer=trainer)
        return cls(hf)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Tokenizer:
        """A tokenizer.json, with the tokenizer_config.json (and chat_template.jinja) beside
        it when there is one."""
        path = Path(path)
        if not path.is_file():
            raise DataError(f"tokenizer file {path} does not exist")
        try:
            hf = HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust parser raises a bare Exception
            raise DataError(f"tokenizer file {path} is not a valid tokenizer.json: {e}") from None
        return cls(hf, **read_settings(path.parent))

    def save(self, path: str | os.PathLike) -> None:
        """tokenizer.json at `path`, and tokenizer_config.json beside it when the tokenizer
        has settings beyond tinyt's defaults."""
        self.hf.save(str(path))
        if self.settings:
            config = Path(path).parent / TOKENIZER_CONFIG
            config.write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                          **self.settings}, indent=2, ensure_ascii=False))

    # -- use -------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """The ids the tokenizer gives and reads: its largest id + 1. Not the count of distinct
        pieces (the library's get_vocab_size): a valid tokenizer.json may hold one piece at two
        ids (Gemma 3's tab at 247 and 255968), which the library's piece -> id map keeps once,
        leaving a hole in the ids below the largest."""
        distinct = self.hf.get_vocab_size(with_added_tokens=True)
        if self._size[0] != distinct:  # first asked, or tokens were added since: count again
            ids = [*self.hf.get_vocab(with_added_tokens=True).values(),
                   *self.hf.get_added_tokens_decoder()]
            self._size = (distinct, max(ids, default=-1) + 1)
        return self._size[1]

    @property
    def start_id(self) -> int | None:
        """The id the post-processor puts before every text (Llama's, Gemma's BOS): what each
        sequence the model was trained on begins with and encode_prompt begins a prompt with;
        None where it puts none (GPT-2's, tinyt's own)."""
        plain = self.hf.encode("a", add_special_tokens=False).ids
        full = self.hf.encode("a", add_special_tokens=True).ids
        return full[0] if len(full) > len(plain) and full[1:1 + len(plain)] == plain else None

    @property
    def pad_id(self) -> int | None:
        """The id of <pad>: an encoder-decoder's padding and decoder start; None without it."""
        return self.hf.token_to_id(PAD_TOKEN)

    def add_pad(self) -> int:
        """Add <pad> as a special token after the others (an encoder-decoder's tokenizer);
        returns its id."""
        self.hf.add_special_tokens([PAD_TOKEN])
        return self.hf.token_to_id(PAD_TOKEN)

    def end_texts_with_eos(self) -> None:
        """A post-processor that ends every text with <|endoftext|>, as Marian's, T5's and
        BART's tokenizer.json end a source with </s>: an encoder-decoder trained here reads
        its sources so ended (seq2seq_data.encode_sides), and encode_prompt (the runtime,
        Optimum, transformers.js) then gives them so."""
        if self.eos_id is None:
            raise ConfigError(f"the tokenizer has no {self.eos_token} token to end a text with")
        self.hf.post_processor = processors.TemplateProcessing(
            single=f"$A {self.eos_token}", pair=f"$A {self.eos_token} $B {self.eos_token}",
            special_tokens=[(self.eos_token, self.eos_id)])

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt's ids with the special tokens tokenizer.json's post-processor adds (Llama's
        BOS; nothing for GPT-2's or tinyt's own), as transformers' tokenizer(text) does."""
        return self.hf.encode(text, add_special_tokens=True).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_byte_lengths(self) -> np.ndarray:
        """UTF-8 bytes each token stands for (0 for special tokens); for nats-per-byte."""
        inverse = {c: b for b, c in bytes_to_unicode().items()}
        special = {t.content for t in self.hf.get_added_tokens_decoder().values()}
        lengths = np.zeros(self.vocab_size, dtype=np.int64)  # a hole in the ids: 0, never given
        for token, idx in self.hf.get_vocab(with_added_tokens=True).items():
            if token in special:
                continue
            if all(c in inverse for c in token):
                lengths[idx] = len(token)  # one byte-level character per byte
            else:  # not a byte-level vocabulary: measure the decoded text
                lengths[idx] = len(self.hf.decode([idx]).encode("utf-8"))
        return lengths

    def to_json_dict(self) -> dict:
        return json.loads(self.hf.to_str())


def read_settings(directory: Path) -> dict:
    """Tokenizer keyword arguments from a directory's tokenizer_config.json (and
    chat_template.jinja); {} when it has neither."""
    settings: dict = {}
    config = directory / TOKENIZER_CONFIG
    if config.is_file():
        data = read_json_object(config, DataError)
        for key in ("eos_token", "bos_token"):
            if _token_text(data.get(key)) is not None:
                settings[key] = _token_text(data[key])
        if data.get("chat_template") is not None:
            settings["chat_template"] = data["chat_template"]
    template = directory / CHAT_TEMPLATE_FILE
    if template.is_file() and "chat_template" not in settings:
        settings["chat_template"] = template.read_text(encoding="utf-8")
    return settings
