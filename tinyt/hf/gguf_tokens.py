"""A GGUF file's tokenizer (tokenizer.ggml.*) as a tokenizer.json, the way llama.cpp runs it.

    tokenizer.ggml.model   "gpt2": byte-level BPE (the only kind read here; "llama", the
                           SentencePiece kind, is refused by name)
    tokenizer.ggml.tokens / merges / token_type
                           the vocabulary in id order, the merges by rank ("Ġ t"), each token's
                           kind (1 normal, 3 control = special, 4 user-defined = added)
    tokenizer.ggml.pre     how text is split before BPE (llama.cpp's pre-tokenizer name): PRE
    tokenizer.ggml.bos_token_id / eos_token_id / add_bos_token, tokenizer.chat_template

transformers' own GGUF converter (integrations/ggml.py) reads the same keys but ignores
`pre` and always adds a BOS: on SmolLM2 ("smollm": digits one by one, add_bos_token false) it
splits "2026" as one piece where llama.cpp (and SmolLM2's own tokenizer.json) split four, and
begins every text with <|im_start|>. tinyt follows the file, as llama.cpp does.
"""
from __future__ import annotations

from typing import Any

from tinyt.errors import ConversionError
from tinyt.tokenizer import Tokenizer

# llama.cpp's pre-tokenizer names (llama-vocab.cpp) -> what splits the text before BPE
GPT2_REGEX = None  # the ByteLevel pre-tokenizer's own regex (GPT-2's)
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"
                r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE = {
    "default": "gpt2", "gpt-2": "gpt2", "gpt2": "gpt2",
    # digits one by one, then GPT-2's regex (llama.cpp: STARCODER, REFACT, SMOLLM, ...)
    "smollm": "digits", "starcoder": "digits", "refact": "digits",
    "llama-bpe": "llama3", "llama3": "llama3",
}
SPECIAL, ADDED = 3, 4  # tokenizer.ggml.token_type: CONTROL, USER_DEFINED


def gguf_tokenizer(fields: dict[str, Any], source: str) -> Tokenizer:
    """The tokenizer a GGUF's tokenizer.ggml.* fields describe (fields: key -> value)."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    kind = fields.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ConversionError(f"{source}: tokenizer.ggml.model={kind!r}; tinyt reads the "
                              "byte-level BPE kind, 'gpt2' (SentencePiece's 'llama' is not read "
                              "yet)")
    pre = fields.get("tokenizer.ggml.pre", "default")
    if pre not in PRE:
        raise ConversionError(f"{source}: tokenizer.ggml.pre={pre!r} is not a pre-tokenizer "
                              f"tinyt knows; known: {', '.join(sorted(PRE))}")
    tokens, kinds = _list(fields, "tokenizer.ggml.tokens", source), \
        fields.get("tokenizer.ggml.token_type")
    merges = [_merge(m, source) for m in _list(fields, "tokenizer.ggml.merges", source)]
    if kinds is not None and len(kinds) != len(tokens):
        raise ConversionError(f"{source}: {len(kinds)} token types for {len(tokens)} tokens")
    vocab = {t: i for i, t in enumerate(tokens)}
    try:
        hf = HFTokenizer(models.BPE(vocab, merges))
    except Exception as e:  # the Rust side raises a bare Exception
        raise ConversionError(f"{source}: tokenizer.ggml.* is not a BPE vocabulary: {e}") \
            from None
    hf.pre_tokenizer = _pre_tokenizer(PRE[pre], pre_tokenizers)
    hf.decoder = decoders.ByteLevel()
    kinds = list(kinds) if kinds is not None else [1] * len(tokens)
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, k in zip(tokens, kinds) if k == SPECIAL])
    hf.add_tokens([AddedToken(t, special=False, normalized=False)
                   for t, k in zip(tokens, kinds) if k == ADDED])
    bos, eos = (_role(fields, tokens, role, source) for role in ("bos", "eos"))
    if fields.get("tokenizer.ggml.add_bos_token") and bos is not None:
        hf.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])])
    return Tokenizer(hf, eos_token=eos if eos is not None else "<|endoftext|>", bos_token=bos,
                     chat_template=fields.get("tokenizer.chat_template"))


def _pre_tokenizer(kind: str, pre_tokenizers):
    level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                     use_regex=kind != "llama3")
    if kind == "digits":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), level])
    if kind == "llama3":
        from tokenizers import Regex
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated"), level])
    return level


def _list(fields: dict[str, Any], key: str, source: str) -> list:
    value = fields.get(key)
    if not isinstance(value, list) or not value:
        raise ConversionError(f"{source} has no {key}: a byte-level BPE tokenizer needs it")
    return value


def _merge(text: Any, source: str) -> tuple[str, str]:
    parts = text.split(" ") if isinstance(text, str) else []
    if len(parts) != 2:
        raise ConversionError(f"{source}: tokenizer.ggml.merges holds {text!r}, not two pieces "
                              "joined by a space")
    return parts[0], parts[1]


def _role(fields: dict[str, Any], tokens: list[str], role: str, source: str) -> str | None:
    idx = fields.get(f"tokenizer.ggml.{role}_token_id")
    if idx is None:
        return None
    if not (isinstance(idx, int) and 0 <= idx < len(tokens)):
        raise ConversionError(f"{source}: tokenizer.ggml.{role}_token_id={idx!r} is not one of "
                              f"the {len(tokens)} tokens' ids")
    return tokens[idx]
