// The tokenizer of every page: tokenizer.json run by @huggingface/tokenizers, as tinyt.mjs
// re-exports it (with TinytWebError, the error every module of the page throws: defined
// here, the module the others import first, so no module imports tinyt.mjs at load).
import * as hf from "./tokenizers.min.mjs";
import { isCjk, OffsetsError, tokensWithOffsets, trimOffsets } from "./offsets.mjs";

export class TinytWebError extends Error {}

// -- the tokenizer: tokenizer.json run by @huggingface/tokenizers ------------------------------
// Every tokenizer.json is written for Hugging Face's Rust `tokenizers`, which tinyt's Python side
// runs. The JS library (tokenizers.min.mjs, the version web.json names) reads the same file; where
// it departs from the Rust library the constructor below puts it back, each a difference that
// tests/export/test_web_encoders.py finds on hostile text without it:
//  - JS `\s` is not Unicode's White_Space (Rust's): it takes U+FEFF and leaves out U+0085, so
//    ByteLevel's GPT-2 split cut text with either elsewhere; the split is rebuilt on White_Space.
//  - Metaspace (XLM-R's SentencePiece) splits before each ▁ unless its `split` is false; the
//    library keeps the text whole.
//  - The model runs on each pre-token alone, so a Unigram's unknown pieces fuse within a word
//    but never across words; the library fused them across a whole section.
//  - BertNormalizer spaces CJK ideographs by code point; the library read UTF-16 units, so the
//    extensions past U+FFFF (U+20000...) stayed glued to their neighbours.
//  - RobertaProcessing types both texts of a pair 0; the library typed the second 1 (_post).
const WS = "\\t\\n\\v\\f\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const GPT2_SPLIT = new RegExp(`'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^${WS}\\p{L}\\p{N}]+` +
                              `|[${WS}]+(?![^${WS}])|[${WS}]+`, "gu");

function conformPre(pre, json) {
  if (!pre || !json) return;
  if (json.type === "Sequence") {
    json.pretokenizers.forEach((j, i) => conformPre(pre.tokenizers[i], j));
  } else if (pre instanceof hf.ByteLevelPreTokenizer) {
    pre.pattern = GPT2_SPLIT;
  } else if (pre instanceof hf.MetaspacePreTokenizer && json.split !== false) {
    const whole = pre.pre_tokenize_text.bind(pre), rep = pre.replacement;
    pre.pre_tokenize_text = (text, o) => whole(text, o).flatMap((t) => {
      const [first, ...rest] = t.split(rep);  // "a▁▁b" -> "a", "▁", "▁b": each ▁ begins a piece
      return [first, ...rest.map((r) => rep + r)].filter(Boolean);
    });
  }
}

const isRoberta = (j) => !!j && (j.type === "RobertaProcessing" || (j.type === "Sequence" && j.processors.some(isRoberta)));

/** The Rust library's longest_first truncation of a text's tokens (and its pair's) to `max`. */
function truncate(a, b, max) {
  if (max <= 0) return [a.slice(0, 0), b && b.slice(0, 0)];
  if (!b) return [a.slice(0, max), null];
  if (a.length + b.length <= max) return [a, b];
  let n1 = a.length, n2 = b.length;
  const swap = n1 > n2;
  if (swap) [n1, n2] = [n2, n1];
  n2 = n1 > max ? n1 : Math.max(n1, max - n1);
  if (n1 + n2 > max) { n1 = Math.floor(max / 2); n2 = n1 + (max % 2); }
  if (swap) [n1, n2] = [n2, n1];
  return [a.slice(0, n1), b.slice(0, n2)];
}

const lowerEach = (text) => Array.from(text, (c) => c.toLowerCase()).join("");

function conformNorm(n, json) {
  if (!n || !json) return;
  if (json.type === "Sequence") {
    json.normalizers.forEach((j, i) => conformNorm(n.normalizers[i], j));
  } else if (n instanceof hf.BertNormalizer) {  // CJK spaced by code point, as the Rust library
    n.tokenize_chinese_chars = (text) => Array.from(text, (c) => (isCjk(c) ? ` ${c} ` : c)).join("");
    const cfg = n.config;
    n.normalize = (text) => {
      if (cfg.clean_text) text = n.clean_text(text);
      if (cfg.handle_chinese_chars) text = n.tokenize_chinese_chars(text);
      if (cfg.lowercase) text = lowerEach(text);
      if (cfg.lowercase ? cfg.strip_accents !== false : cfg.strip_accents) text = n.strip_accents(text);
      return text;
    };
  } else if (n instanceof hf.LowercaseNormalizer) {
    n.normalize = lowerEach;
  }
}

export class Tokenizer {
  /** A tokenizer.json (parsed), as Hugging Face's tokenizers runs it. */
  constructor(json) {
    try {
      this.hf = new hf.Tokenizer(json, { clean_up_tokenization_spaces: false });
    } catch (e) {
      throw new TinytWebError(`tokenizer.json: @huggingface/tokenizers cannot read it (${e.message})`);
    }
    this.json = json;
    conformPre(this.hf.pre_tokenizer, json.pre_tokenizer);
    conformNorm(this.hf.normalizer, json.normalizer);
    const model = this.hf.model;
    if (model.fuse_unk) {
      const all = model._call.bind(model);
      model._call = (pieces) => pieces.flatMap((p) => all([p]));
    }
    this.added = this._post([], null).tokens.length;  // [CLS] [SEP], <s> </s>, ...
    this.addedPair = this._post([], []).tokens.length;  // [CLS] [SEP] [SEP], <s> </s> </s> </s>
  }

  get vocabSize() { return this.hf.model.vocab.length; }

  tokenId(text) { return this.hf.token_to_id(text); }

  /** ids of `text`, as tinyt's Tokenizer.encode (no special tokens added; those in the text
   * are matched). */
  encode(text) {
    if (typeof text !== "string") throw new TinytWebError("encode takes a string");
    return this.hf.encode(text, { add_special_tokens: false }).ids;
  }

  /** The post-processor's row of a text's entries (and its pair's): special tokens as strings
   * around them, token types as the Rust library gives them -- RobertaProcessing's are all 0
   * (0.2.0 gives a pair's 1), and a pair without a template is typed 0 then 1. */
  _post(a, b) {
    const post = this.hf.post_processor;
    const r = post ? post(a, b, true) : { tokens: a, tokens_pair: b };
    let tokens = r.tokens, types = r.token_type_ids;
    if (r.tokens_pair) {  // ByteLevel alone leaves the pair apart
      tokens = [...r.tokens, ...r.tokens_pair];
      types = [...r.tokens.map(() => 0), ...r.tokens_pair.map(() => 1)];
    }
    if (!types || isRoberta(this.json.post_processor)) types = tokens.map(() => 0);
    return { tokens, types };
  }

  /** What a model row is made of: ids, token types and pieces with the post-processor's special
   * tokens, cut to `maxLength` tokens in all as the Rust library truncates (longest_first: the
   * texts' own tokens are cut, the special ones kept). `pair`: a second text, [CLS] a [SEP] b
   * [SEP] (or <s> a </s></s> b </s>). `offsets`: each token's [start, end) in its text, in code
   * points ([0, 0] for the special tokens), as the Rust library's offsets (offsets.mjs). */
  encodeRow(text, maxLength, { pair = null, offsets = false } = {}) {
    if (typeof text !== "string" || (pair !== null && typeof pair !== "string")) {
      throw new TinytWebError("encodeRow takes a string (and a string pair)");
    }
    const body = (t) => (offsets ? this.withOffsets(t)
      : this.hf.encode(t, { add_special_tokens: false }).tokens.map((token) => ({ token })));
    const [a, b] = truncate(body(text), pair === null ? null : body(pair),
                            maxLength - (pair === null ? this.added : this.addedPair));
    if (offsets) for (const part of [a, b]) if (part) trimOffsets(this.json.post_processor, part);
    const r = this._post(a, b);
    const h = this.hf;  // tokens to ids as the library's own encode maps them
    const ids = r.tokens.map((e) => (typeof e === "string" ? e : e.token)).map((t) =>
      h.added_tokens_map.get(t)?.id ?? h.token_to_id(t) ?? h.model.unk_token_id);
    // the pieces as the Rust library shows them (an added token with the spaces it stripped)
    const tokens = r.tokens.map((e) => (typeof e === "string" ? e : e.shown ?? e.token));
    const row = { ids, typeIds: r.types, tokens };
    if (offsets) row.offsets = r.tokens.map((t) => (typeof t === "string" ? [0, 0] : t.span));
    return row;
  }

  /** The tokens of `text` (no special tokens) with their [start, end) in code points. */
  withOffsets(text) {
    let got;
    try {
      got = tokensWithOffsets(this.hf, this.json, text);
    } catch (e) {
      if (e instanceof OffsetsError) throw new TinytWebError(e.message);
      throw e;
    }
    const want = this.hf.encode(text, { add_special_tokens: false }).tokens;
    if (got.length !== want.length || got.some((t, i) => t.token !== want[i])) {
      throw new TinytWebError(`character offsets: the tokens followed for ${JSON.stringify(text.slice(0, 40))} are not the library's (${JSON.stringify(got.map((t) => t.token).slice(0, 8))} vs ${JSON.stringify(want.slice(0, 8))})`);
    }
    return got;
  }

  /** The text of `ids` (special tokens as their text). */
  decode(ids) {
    for (const id of ids) {
      if (this.hf.model.vocab[id] === undefined) throw new TinytWebError(`token id ${id} is not in the vocabulary (${this.vocabSize})`);
    }
    return ids.length ? this.hf.decode(Array.from(ids), { skip_special_tokens: false }) : "";
  }
}

// -- sampling: greedy, or temperature / top-k / top-p with a seeded generator -------------------
