"""What users bring: tiny random-weight transformers models (a few layers, width 64, vocab 320)
saved as Hub directories with the real models' other config.json settings — their contexts,
rope parameters, windows, head_dim, norms, multipliers — and a byte-level BPE tokenizer.json
covering the whole vocabulary, with a chat template.

    save_hf(name, path, **overrides) -> (transformers model, config.json dict)

`REAL` holds each real model's settings, with only the size scaled down (layers, width, heads,
vocabulary); a test that needs a window shorter than its sequence overrides `sliding_window`
and says so. Nothing is downloaded: the models are built and saved here.
"""
from __future__ import annotations

import functools
import json
import sysconfig
from pathlib import Path

import torch

from tinyt.tokenizer import Tokenizer

VOCAB = 320
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# The size every fixture shares (the real models' are in the comments of REAL).
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1)

# LongRoPE factors of the shape Phi-3.5 / Phi-4-mini have: short ones near 1, long ones
# growing with the wavelength (the real sets have 48; the fixtures take the first ones)
SHORT = [round(1.0 + 0.05 * i * i / 8, 4) for i in range(48)]
LONG = [round(1.0 + 1.5 * i, 4) for i in range(48)]
REAL: dict[str, tuple[str, dict]] = {
    # HuggingFaceTB/SmolLM2-135M: 30 layers, 576 wide, 9 / 3 heads
    "smollm2": ("llama", dict(num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=8192, rope_theta=100000.0,
                              rms_norm_eps=1e-5, tie_word_embeddings=True)),
    # Qwen/Qwen2.5-0.5B: 24 layers, 896 wide, 14 / 2 heads; the window is off
    "qwen2.5": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=32768, rope_theta=1000000.0,
                              rms_norm_eps=1e-6, tie_word_embeddings=True,
                              use_sliding_window=False, sliding_window=32768,
                              max_window_layers=2)),
    # meta-llama/Llama-3.2-1B: 16 layers, 2048 wide, 32 / 8 heads, head_dim 64
    "llama3.2": ("llama", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               max_position_embeddings=131072, rope_theta=500000.0,
                               rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 8192},
                               rms_norm_eps=1e-5, tie_word_embeddings=True)),
    # Llama-3.2's context and base without its rope scaling (the context alone)
    "llama-131k": ("llama", dict(num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=131072, rope_theta=500000.0,
                                 rms_norm_eps=1e-5, tie_word_embeddings=True)),
    # Qwen/Qwen3-0.6B: 28 layers, 1024 wide, 16 / 8 heads, head_dim 128 (not 1024 / 16)
    "qwen3": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                            max_position_embeddings=40960, rope_theta=1000000.0,
                            rms_norm_eps=1e-6, tie_word_embeddings=True,
                            use_sliding_window=False, sliding_window=None,
                            max_window_layers=2)),
    # mistralai/Mistral-7B-v0.1: 32 layers, 4096 wide, 32 / 8 heads, window 4096, untied
    "mistral": ("mistral", dict(num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=32768, rope_theta=10000.0,
                                sliding_window=4096, rms_norm_eps=1e-5,
                                tie_word_embeddings=False)),
    # HuggingFaceTB/SmolLM3-3B: 36 layers, 2048 wide, 16 / 4 heads, no rotary on every 4th
    "smollm3": ("smollm3", dict(num_hidden_layers=4, num_attention_heads=4,
                                num_key_value_heads=2, max_position_embeddings=65536,
                                rope_theta=5000000.0, no_rope_layer_interval=4,
                                rms_norm_eps=1e-6, tie_word_embeddings=True,
                                use_sliding_window=False, pad_token_id=None)),
    # ibm-granite/granite-3.1-2b-instruct: 40 layers, 2048 wide, 32 / 8 heads
    "granite": ("granite", dict(num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=131072, rope_theta=5000000.0,
                                embedding_multiplier=12.0, residual_multiplier=0.22,
                                attention_multiplier=0.015625, logits_scaling=8.0,
                                rms_norm_eps=1e-5, tie_word_embeddings=True)),
    # google/gemma-3-270m: 18 layers, 640 wide, 4 / 1 heads, head_dim 256, window 512, every
    # 6th layer global; 262,144 ids. Six layers here, so that one is global.
    "gemma3": ("gemma3_text", dict(num_hidden_layers=6, num_attention_heads=4,
                                   num_key_value_heads=1, head_dim=32,
                                   max_position_embeddings=32768, rope_theta=1000000.0,
                                   rope_local_base_freq=10000.0, sliding_window=512,
                                   query_pre_attn_scalar=256, rms_norm_eps=1e-6,
                                   hidden_activation="gelu_pytorch_tanh",
                                   final_logit_softcapping=None, attn_logit_softcapping=None,
                                   tie_word_embeddings=True, pad_token_id=0)),
    # google/gemma-2-2b: 26 layers, 2304 wide, 8 / 4 heads, head_dim 256, window 4096 on the
    # even layers, attention and final soft caps 50 / 30
    "gemma2": ("gemma2", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                              max_position_embeddings=8192, rope_theta=10000.0,
                              sliding_window=4096, query_pre_attn_scalar=256,
                              rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
                              final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                              tie_word_embeddings=True, pad_token_id=0)),
    # microsoft/Phi-3.5-mini-instruct: 32 layers, 3072 wide, 32 / 32 heads, LongRoPE from 4,096
    # to 131,072 (48 factors a set), a window of 262,144 over every layer, untied
    "phi3.5": ("phi3", dict(num_attention_heads=4, num_key_value_heads=4,
                            max_position_embeddings=131072,
                            original_max_position_embeddings=4096, rope_theta=10000.0,
                            rope_scaling={"type": "longrope", "short_factor": SHORT[:8],
                                          "long_factor": LONG[:8]},
                            sliding_window=262144, rms_norm_eps=1e-5,
                            tie_word_embeddings=False, pad_token_id=None)),
    # microsoft/Phi-4-mini-instruct: 32 layers, 3072 wide, 24 / 8 heads, head_dim 128 of which
    # 96 rotate (partial_rotary_factor 0.75), LongRoPE from 4,096 to 131,072, tied. Here
    # 2 / 1 heads of 64, 48 of them rotating (GroupQueryAttention's rotary: a multiple of 16)
    "phi4-mini": ("phi3", dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                               max_position_embeddings=131072,
                               original_max_position_embeddings=4096, rope_theta=10000.0,
                               partial_rotary_factor=0.75,
                               rope_scaling={"type": "longrope", "short_factor": SHORT[:24],
                                             "long_factor": LONG[:24]},
                               sliding_window=262144, rms_norm_eps=1e-5,
                               tie_word_embeddings=True, pad_token_id=None)),
    # allenai/OLMo-2-0425-1B: 16 layers, 2048 wide, 16 / 16 heads, 4,096 context, untied; norms
    # after each branch, q/k norms over the whole projection
    "olmo2": ("olmo2", dict(num_attention_heads=4, num_key_value_heads=4,
                            max_position_embeddings=4096, rope_theta=500000.0,
                            rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=None)),
}
CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
           "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
           "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
           "mistral": ("MistralConfig", "MistralForCausalLM"),
           "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM"),
           "granite": ("GraniteConfig", "GraniteForCausalLM"),
           "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
           "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
           "phi3": ("Phi3Config", "Phi3ForCausalLM"),
           "olmo2": ("Olmo2Config", "Olmo2ForCausalLM")}


@functools.lru_cache(maxsize=1)
def tokenizer() -> Tokenizer:
    """Byte-level BPE trained to the whole vocabulary on the standard library's own source
    (the corpus every machine has), with <|im_start|> / <|im_end|> as its last two ids."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(lib / name).read_text(encoding="utf-8") for name in
             ("textwrap.py", "string.py", "shlex.py", "fnmatch.py")]
    tok = Tokenizer.train_bpe(texts, VOCAB - 2)
    tok.hf.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    out = Tokenizer(tok.hf, eos_token="<|im_end|>", bos_token="<|im_start|>",
                    chat_template=TEMPLATE)
    assert out.vocab_size == VOCAB and (out.bos_id, out.eos_id) == (VOCAB - 2, VOCAB - 1)
    return out


def hf_model(name: str, **overrides):
    """transformers' model of the fixture `name` on random weights (std 0.2: logits of size,
    where init's near-zero weights would hide a wrong sign)."""
    import transformers as T

    model_type, settings = REAL[name]
    config_class, model_class = CLASSES[model_type]
    config = getattr(T, config_class)(**{**SMALL, **settings, **overrides},
                                      attn_implementation="eager")
    torch.manual_seed(0)
    model = getattr(T, model_class)(config)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return model.eval()


def save_hf(name: str, path: Path, **overrides):
    """The fixture `name` saved as a Hub directory (safetensors, config.json, tokenizer.json,
    tokenizer_config.json with the chat template); returns (model, config.json as saved)."""
    path = Path(path)
    model = hf_model(name, **overrides)
    model.generation_config.bos_token_id = VOCAB - 2
    model.generation_config.eos_token_id = VOCAB - 1
    model.save_pretrained(path, safe_serialization=True)
    tok = tokenizer()
    tok.hf.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE,
        "model_max_length": model.config.max_position_embeddings,
        "eos_token": {"content": "<|im_end|>", "special": True}, "bos_token": "<|im_start|>"}))
    return model, json.loads((path / "config.json").read_text())


# -- encoders ------------------------------------------------------------------------------------
# sentence-transformers/all-MiniLM-L6-v2: BertModel, 6 layers, 384 wide, 12 heads, intermediate
# 1536, a 512-position table, two token types, LayerNorm eps 1e-12, exact GELU, vocabulary
# 30,522 (uncased WordPiece); mean pooling, normalized, texts cut at 256 tokens
BERT_VOCAB = 30522
MINILM = dict(vocab_size=BERT_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=96, max_position_embeddings=512, type_vocab_size=2,
              layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=0)


@functools.lru_cache(maxsize=1)
def wordpiece_tokenizer():
    """An uncased WordPiece tokenizer.json as BERT's is built (BertNormalizer, BertPreTokenizer,
    [CLS] $A [SEP] with token types, WordPiece decoder) over the whole 30,522-id vocabulary:
    BERT's special ids (0 [PAD], 100 [UNK], 101 [CLS], 102 [SEP], 103 [MASK]), characters and
    their ## continuations, the standard library's commonest words, then filler pieces."""
    import re
    from collections import Counter

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    vocab = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = [chr(c) for c in range(33, 127) if not chr(c).isupper()] + list("éèàüöçñß")
    vocab += chars + [f"##{c}" for c in chars if c.isalnum()]
    lib = Path(sysconfig.get_paths()["stdlib"])
    words = Counter(w for name in ("textwrap.py", "string.py", "shlex.py", "fnmatch.py")
                    for w in re.findall(r"[a-z]{2,}", (lib / name).read_text().lower()))
    vocab += [w for w, _ in words.most_common(2000) if w not in vocab]
    vocab += [f"##{w}" for w, _ in words.most_common(500) if f"##{w}" not in vocab]
    i = 0
    while len(vocab) < BERT_VOCAB:
        vocab.append(f"x{i}q")
        i += 1
    tok = HFTokenizer(models.WordPiece({t: n for n, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 101), ("[SEP]", 102)])
    tok.decoder = decoders.WordPiece()
    assert tok.get_vocab_size() == BERT_VOCAB
    return tok


# sentence-transformers/msmarco-distilbert-base-v4: DistilBertModel, 6 layers, 768 wide, 12 heads,
# hidden_dim 3072, 512 positions, the uncased WordPiece, GELU, no token types
DISTILBERT = dict(vocab_size=BERT_VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=96,
                  max_position_embeddings=512, activation="gelu", sinusoidal_pos_embds=False,
                  pad_token_id=0)
# sentence-transformers/all-distilroberta-v1: RobertaModel, 6 layers, 768 wide, 12 heads,
# 514 positions from pad_token_id 1 + 1, one token type, eps 1e-5, byte-level BPE (50,265
# ids; the fixture's BPE is trained to ROBERTA_VOCAB on the standard library)
ROBERTA_VOCAB = 1000
ROBERTA = dict(vocab_size=ROBERTA_VOCAB, hidden_size=64, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=96, max_position_embeddings=514,
               type_vocab_size=1, layer_norm_eps=1e-5, hidden_act="gelu", pad_token_id=1,
               bos_token_id=0, eos_token_id=2)
# sentence-transformers/paraphrase-multilingual-MiniLM-L12-v2: XLMRobertaModel, 12 layers, 384
# wide, 12 heads, 514 positions, one token type, eps 1e-5, a SentencePiece Unigram (250,002
# ids; the fixture's is XLMR_VOCAB pieces)
XLMR_VOCAB = 800
XLMR = {**ROBERTA, "vocab_size": XLMR_VOCAB}
# answerdotai/ModernBERT-base: 22 layers, 768 wide, 12 heads, intermediate 1152, 8,192
# positions by rotary (global base 160,000, local 10,000), every 3rd layer global and the rest
# +-64 tokens (local_attention 128), GeGLU, no biases, a byte-level BPE (50,368 ids; the
# fixture's is the RoBERTa one); its classifier pools the mean through a GELU head
MODERNBERT = dict(vocab_size=ROBERTA_VOCAB, hidden_size=64, num_hidden_layers=4,
                  num_attention_heads=4, intermediate_size=96, max_position_embeddings=8192,
                  norm_eps=1e-5, norm_bias=False, attention_bias=False, mlp_bias=False,
                  global_rope_theta=160000.0, local_rope_theta=10000.0,
                  global_attn_every_n_layers=3, local_attention=128, hidden_activation="gelu",
                  classifier_pooling="mean", classifier_activation="gelu",
                  pad_token_id=1, bos_token_id=0, eos_token_id=2, cls_token_id=0,
                  sep_token_id=2)
ENCODERS = {"bert": ("BertConfig", "BertModel", MINILM),
            "modernbert": ("ModernBertConfig", "ModernBertModel", MODERNBERT),
            "distilbert": ("DistilBertConfig", "DistilBertModel", DISTILBERT),
            "roberta": ("RobertaConfig", "RobertaModel", ROBERTA),
            "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", XLMR)}


@functools.lru_cache(maxsize=1)
def roberta_tokenizer():
    """Byte-level BPE as RoBERTa's tokenizer.json is built: <s> <pad> </s> <unk> first, then
    <mask> last, RobertaProcessing (<s> $A </s>, pairs </s></s>), trained on the standard
    library to ROBERTA_VOCAB ids."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    lib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(lib / n).read_text(encoding="utf-8") for n in ("textwrap.py", "string.py")]
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=ROBERTA_VOCAB - 1, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.add_special_tokens(["<mask>"])
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    assert tok.get_vocab_size() == ROBERTA_VOCAB
    return tok


@functools.lru_cache(maxsize=1)
def unigram_tokenizer():
    """A SentencePiece-style Unigram tokenizer.json as XLM-R's is built (<s> <pad> </s> <unk>
    first, Metaspace, <s> $A </s>), pieces of the standard library's words with log-frequency
    scores, XLMR_VOCAB ids."""
    import math
    import re
    from collections import Counter

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    lib = Path(sysconfig.get_paths()["stdlib"])
    words = Counter(w for name in ("textwrap.py", "argparse.py")
                    for w in re.findall(r"[A-Za-z]+", (lib / name).read_text()))
    pieces = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    chars = sorted({c for w in words for c in w} | set("éüñ東京.,!?'-0123456789"))
    pieces += [(c, -10.0) for c in chars] + [("▁" + c, -9.0) for c in chars]
    total = sum(words.values())
    have = {p for p, _ in pieces}
    for w, n in words.most_common():
        if len(pieces) >= XLMR_VOCAB - 1:
            break
        if "▁" + w not in have:
            pieces.append(("▁" + w, math.log(n / total)))
            have.add("▁" + w)
    pieces.append(("<mask>", 0.0))
    tok = HFTokenizer(models.Unigram(pieces, unk_id=3, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    assert tok.get_vocab_size() == XLMR_VOCAB, tok.get_vocab_size()
    return tok


LABELS = ("negative", "neutral", "positive")
HEADS = {"sequence": "ForSequenceClassification", "token": "ForTokenClassification"}


def encoder_model(kind: str = "bert", head: str | None = None, **overrides):
    """transformers' base encoder of `kind` at its real model's settings (scaled), or its
    sequence / token classifier (`head`, three named labels), random weights of std 0.2 (norm
    gains near 1, so hidden states stay of size through the post-norms)."""
    import transformers as T

    config_class, model_class, settings = ENCODERS[kind]
    if head is not None:
        model_class = model_class.removesuffix("Model") + HEADS[head]
        overrides = {"id2label": dict(enumerate(LABELS)),
                     "label2id": {n: i for i, n in enumerate(LABELS)}, **overrides}
    config = getattr(T, config_class)(**{**settings, **overrides}, attn_implementation="eager")
    torch.manual_seed(0)
    model = getattr(T, model_class)(config)
    for name, p in model.named_parameters():
        gain = name.endswith("weight") and "norm" in name.lower()
        torch.nn.init.normal_(p, mean=1.0 if gain else 0.0, std=0.2)
    return model.eval()


def bert_model(**overrides):
    return encoder_model("bert", **overrides)


def save_bert(path: Path, **kwargs):
    return save_encoder("bert", path, **kwargs)


def save_encoder(kind: str, path: Path, *, sentence: bool = True, pooling: str = "mean",
                 normalize: bool = True, max_seq_length: int = 256, head: str | None = None,
                 **overrides):
    """A base encoder directory of `kind` (safetensors, with BERT's and RoBERTa's pooler;
    config.json; tokenizer.json and tokenizer_config.json as transformers' fast tokenizer
    saves them); with sentence, laid out as sentence-transformers saves all-MiniLM-L6-v2
    (modules.json, 1_Pooling with the legacy booleans, 2_Normalize,
    sentence_bert_config.json). Returns the model."""
    import transformers as T

    path = Path(path)
    model = encoder_model(kind, head, **overrides)
    model.save_pretrained(path, safe_serialization=True)
    if kind in ("bert", "distilbert"):  # WordPiece; RoBERTa's and ModernBERT's BPE, XLM-R's
        #                                   Unigram
        fast = (T.BertTokenizerFast if kind == "bert" else T.DistilBertTokenizerFast)(
            tokenizer_object=wordpiece_tokenizer(), do_lower_case=True, model_max_length=512)
    else:
        fast = T.PreTrainedTokenizerFast(
            tokenizer_object=unigram_tokenizer() if kind == "xlm-roberta" else
            roberta_tokenizer(),
            bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
            mask_token="<mask>", model_max_length=512)
    fast.save_pretrained(path)
    if sentence:
        modules = [{"idx": 0, "name": "0", "path": "",
                    "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling"}]
        if normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
            (path / "2_Normalize").mkdir()
        (path / "modules.json").write_text(json.dumps(modules))
        (path / "1_Pooling").mkdir()
        (path / "1_Pooling" / "config.json").write_text(json.dumps({
            "word_embedding_dimension": model.config.hidden_size,
            **{f"pooling_mode_{m}": m == {"mean": "mean_tokens", "cls": "cls_token",
                                          "last": "lasttoken"}[pooling]
               for m in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
                         "lasttoken")}}))
        (path / "sentence_bert_config.json").write_text(json.dumps(
            {"max_seq_length": max_seq_length, "do_lower_case": False}))
    return model


def sentence_embeddings(model, input_ids, attention_mask, token_type_ids=None, *,
                        pooling: str = "mean", normalize: bool = True):
    """sentence-transformers' arithmetic on transformers' hidden states: mean over the mask
    (clamped at 1e-9), the first token, or the last real one; then F.normalize."""
    with torch.no_grad():
        types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        h = model(input_ids=input_ids, attention_mask=attention_mask, **types).last_hidden_state
    m = attention_mask.unsqueeze(-1).to(h.dtype)
    if pooling == "mean":
        e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
    elif pooling == "cls":
        e = h[:, 0]
    else:
        e = h[torch.arange(h.shape[0]), attention_mask.sum(1) - 1]
    return h, (torch.nn.functional.normalize(e, p=2, dim=-1) if normalize else e)


# -- encoder-decoders ----------------------------------------------------------------------------
# Each real model's settings with the layers and width cut (each kept at its real vocabulary,
# positions, heads, buckets, ties, scales, norms and activation); the real sizes are in the
# comments. A SentencePiece-like Unigram tokenizer.json with the model's special ids (Marian's
# <pad> last, at 58,100; T5's 100 <extra_id_*> after its 32,000 pieces) or RoBERTa's / XLM-R's.
SEQ2SEQ: dict[str, tuple[str, str, dict]] = {
    # Helsinki-NLP/opus-mt-en-de: 6 + 6 layers, 512 wide, 8 heads, ffn 2048, 58,101 ids (</s> 0,
    # <unk> 1, <pad> 58,100 the decoder's start), 512 sinusoid positions, scale_embedding, swish
    "opus-mt": ("MarianConfig", "MarianMTModel", dict(
        vocab_size=58101, decoder_vocab_size=58101, d_model=64, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=8, decoder_attention_heads=8,
        encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=512,
        scale_embedding=True, activation_function="swish", share_encoder_decoder_embeddings=True,
        pad_token_id=58100, decoder_start_token_id=58100, eos_token_id=0,
        forced_eos_token_id=0, bad_words_ids=[[58100]])),  # the pad never generated
    # google/flan-t5-small: 8 + 8 layers, 512 wide, 6 heads of d_kv 64 (384, not 512), d_ff 1024,
    # gated-gelu, lm_head of its own, 32 buckets to distance 128, 32,128 ids (pad 0 the start)
    "flan-t5": ("T5Config", "T5ForConditionalGeneration", dict(
        vocab_size=32128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
        num_heads=6, relative_attention_num_buckets=32, relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False, layer_norm_epsilon=1e-6,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)),
    # google-t5/t5-small: 6 + 6 layers, 512 wide, 8 heads of 64, d_ff 2048, ReLU, the head tied
    # (its input times d_model^-0.5), n_positions 512
    "t5-small": ("T5Config", "T5ForConditionalGeneration", dict(
        vocab_size=32128, d_model=64, d_kv=8, d_ff=128, num_layers=2, num_heads=8,
        relative_attention_num_buckets=32, relative_attention_max_distance=128,
        feed_forward_proj="relu", tie_word_embeddings=True, n_positions=512,
        layer_norm_epsilon=1e-6, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)),
    # facebook/bart-base: 6 + 6 layers, 768 wide, 12 heads, ffn 3072, 50,265 ids, 1,024 learned
    # positions from row 2, GELU, layernorm_embedding, post-norm, </s> 2 the start. Here 2 + 1
    # layers (distilbart-cnn-12-6's decoder has half its encoder's)
    "bart-base": ("BartConfig", "BartForConditionalGeneration", dict(
        vocab_size=50265, d_model=96, encoder_layers=2, decoder_layers=1,
        encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=128,
        decoder_ffn_dim=128, max_position_embeddings=1024, activation_function="gelu",
        scale_embedding=False, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, forced_eos_token_id=2)),
    # facebook/mbart-large-cc25: 12 + 12 layers, 1024 wide, 16 heads, ffn 4096, 250,027 ids, 1,024
    # positions from row 2, scale_embedding, pre-norm with each stack's final layer_norm
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", dict(
        vocab_size=250027, d_model=64, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=128,
        decoder_ffn_dim=128, max_position_embeddings=1024, activation_function="gelu",
        scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, forced_eos_token_id=2)),
    # facebook/m2m100_418M: 12 + 12 layers, 1024 wide, 16 heads, ffn 4096, 128,112 ids, 1,024
    # sinusoid positions from pad + 1, ReLU, scale_embedding, pre-norm, </s> 2 the start
    "m2m100": ("M2M100Config", "M2M100ForConditionalGeneration", dict(
        vocab_size=128112, d_model=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=128,
        decoder_ffn_dim=128, max_position_embeddings=1024, activation_function="relu",
        scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2)),
    # facebook/nllb-200-distilled-600M: M2M100's class, 12 + 12 layers, 1024 wide, 16 heads, ffn
    # 4096, 256,206 ids, 1,024 positions
    "nllb": ("M2M100Config", "M2M100ForConditionalGeneration", dict(
        vocab_size=256206, d_model=64, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=128,
        decoder_ffn_dim=128, max_position_embeddings=1024, activation_function="relu",
        scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2)),
}
T5_PIECES = 32000  # T5's SentencePiece pieces; its 100 <extra_id_*> follow (32,100 ids)


@functools.lru_cache(maxsize=4)
def sentencepiece_tokenizer(first: tuple[str, ...], size: int, last: tuple[str, ...] = ()):
    """A Unigram tokenizer.json as SentencePiece models convert (Metaspace, $A </s>): the
    special pieces `first`, characters, the standard library's words, filler pieces up to
    `size` ids, then `last` (Marian's <pad>, T5's <extra_id_*> counting down)."""
    import re
    from collections import Counter

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors

    lib = Path(sysconfig.get_paths()["stdlib"])
    words = Counter(w for name in ("textwrap.py", "argparse.py")
                    for w in re.findall(r"[A-Za-z]+", (lib / name).read_text()))
    pieces = [(p, 0.0) for p in first]
    chars = sorted({c for w in words for c in w} | set(".,!?'-0123456789"))
    pieces += [(c, -10.0) for c in chars] + [("▁" + c, -9.0) for c in chars]
    have = {p for p, _ in pieces}
    pieces += [("▁" + w, -1.0 - i / 1000) for i, (w, _) in enumerate(words.most_common(3000))
               if "▁" + w not in have]
    pieces += [(f"x{i}q", -20.0) for i in range(size - len(last) - len(pieces))]
    pieces += [(p, 0.0) for p in last]
    tok = HFTokenizer(models.Unigram(pieces, unk_id=first.index("<unk>"), byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>",
        special_tokens=[("</s>", first.index("</s>"))])
    tok.add_special_tokens([*first, *last])
    assert tok.get_vocab_size() == size, tok.get_vocab_size()
    return tok


def seq2seq_tokenizer(name: str):
    """The fixture `name`'s tokenizer: Marian's and T5's SentencePiece ids, BART's byte-level
    BPE (RoBERTa's), M2M100's / NLLB's / mBART's SentencePiece (XLM-R's <s> <pad> </s> <unk>)."""
    if name == "opus-mt":
        return sentencepiece_tokenizer(("</s>", "<unk>"), 58101, ("<pad>",))
    if name.endswith("t5") or name.startswith("t5"):
        extra = tuple(f"<extra_id_{i}>" for i in range(99, -1, -1))
        return sentencepiece_tokenizer(("<pad>", "</s>", "<unk>"), T5_PIECES + 100, extra)
    return roberta_tokenizer() if name.startswith("bart") else unigram_tokenizer()


def seq2seq_model(name: str, **overrides):
    """transformers' encoder-decoder `name` on random weights (std 0.2; norm gains around 1)."""
    import transformers as T

    config_class, model_class, settings = SEQ2SEQ[name]
    config = getattr(T, config_class)(**{**settings, **overrides}, attn_implementation="eager")
    torch.manual_seed(0)
    model = getattr(T, model_class)(config)
    for pname, p in model.named_parameters():
        if "embed_positions" in pname and name == "opus-mt":
            continue  # Marian's sinusoid, a parameter transformers computes
        gain = pname.endswith("weight") and "norm" in pname.lower()
        # T5 has no 1/sqrt(d_kv) in attention: its q weights carry it (init and training)
        std = 0.2 / config.d_kv ** 0.5 if pname.endswith("Attention.q.weight") else 0.2
        torch.nn.init.normal_(p, mean=1.0 if gain else 0.0, std=std)
    if hasattr(model, "final_logits_bias"):
        model.final_logits_bias.normal_(std=0.2, generator=torch.Generator().manual_seed(1))
    return model.eval()


def save_seq2seq(name: str, path: Path, **overrides):
    """The fixture `name` saved as a Hub directory (safetensors, config.json,
    generation_config.json, tokenizer.json, tokenizer_config.json); returns the model."""
    path = Path(path)
    model = seq2seq_model(name, **overrides)
    model.save_pretrained(path, safe_serialization=True)
    tok = seq2seq_tokenizer(name)
    tok.save(str(path / "tokenizer.json"))
    specials = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512, **specials}))
    return model
