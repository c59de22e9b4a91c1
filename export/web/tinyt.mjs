// tinyt in the browser: a `tinyt package --format web` folder's models on ONNX Runtime Web's
// WebAssembly backend, tokenized by @huggingface/tokenizers (both pinned beside this file:
// web.json says which versions). No build step, no dependency but ort.wasm.min.mjs and
// tokenizers.min.mjs in the same folder. load() gives what the package holds:
//
//   import { load } from "./tinyt.mjs";
//   const lm = await load(".", { numThreads: 1 });          // reads web.json, graph(s), tokenizer
//   const r = await lm.generate("def ", { maxNewTokens: 32, temperature: 0,
//                                         onToken: (piece, id) => out.textContent += piece });
//   r.tokenIds, r.text, r.finishReason ("eos" | "stop" | "length" | "cancelled"), r.timings
//
//   const enc = await load(".");                             // an encoder (sentence embeddings)
//   await enc.embed(["a text", "another"])                   // [Float32Array(dim), ...]
//   const clf = await load(".");                             // a classifier
//   await clf.classify(["a text"])                           // [{label, probabilities: {name: p}}]
//   await clf.classify([["a premise", "a hypothesis"]])      // a pair: one input, as the runtime
//   await clf.tag("a text")   // a token classifier's: [{token, start, end, label, probability}, ...]
//   const mt = await load(".");                              // an encoder-decoder (seq2seq.mjs)
//   await mt.generate("a source text", { maxNewTokens: 32 }) // its translation, as generate's
//   const asr = await load(".");                             // a Whisper (speech.mjs)
//   await asr.transcribe(samples16k, { language: null })     // {text, tokenIds, language, ...}
//
// generate() options: maxNewTokens (default 32), temperature (0: greedy), topK, topP, seed
// (sampling is reproducible for a seed), stop (strings that end the text, cut before them),
// onToken(piece, id) called as each token is chosen, signal (an AbortSignal: cancel),
// minNewTokens (end-of-text is not chosen before that many tokens). Unknown options are errors.
// embed / classify / tag take a string (one result) or an array of strings (one each), as
// tinyt.runtime's Encoder.embed, Classifier.classify and TokenClassifier.tag do, and give
// their numbers. Errors are TinytWebError with a message that names the problem.
import * as ort from "./ort.wasm.min.mjs";
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
export function rng(seed) {  // mulberry32: small, fast, the same sequence for a seed on every browser
  let a = (seed >>> 0) || 0x9e3779b9;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function argmax(x) {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

export function sample(logits, { temperature, topK, topP }, random) {
  for (let i = 0; i < logits.length; i++) {
    if (Number.isNaN(logits[i]) || logits[i] === Infinity) throw new TinytWebError(`the model produced a non-finite logit (${logits[i]}) at token ${i}`);
  }
  if (!temperature) return argmax(logits);
  let idx = Array.from(logits.keys()).sort((a, b) => logits[b] - logits[a]);
  if (topK) idx = idx.slice(0, topK);
  const top = logits[idx[0]];
  let p = idx.map((i) => Math.exp((logits[i] - top) / temperature));
  let sum = p.reduce((a, b) => a + b, 0);
  p = p.map((v) => v / sum);
  if (topP && topP < 1) {
    let acc = 0, keep = 0;
    while (keep < p.length && acc < topP) acc += p[keep++];
    idx = idx.slice(0, keep); p = p.slice(0, keep);
    sum = p.reduce((a, b) => a + b, 0); p = p.map((v) => v / sum);
  }
  let u = random(), acc = 0;
  for (let k = 0; k < p.length; k++) { acc += p[k]; if (u < acc) return idx[k]; }
  return idx[idx.length - 1];
}

// -- the model ---------------------------------------------------------------------------------
// A turn of the event loop without setTimeout's 4 ms clamp (a token must not cost a timer tick).
export function yieldNow() {
  return new Promise((resolve) => {
    const ch = new MessageChannel();
    ch.port1.onmessage = () => { ch.port1.close(); resolve(); };
    ch.port2.postMessage(0);
  });
}

async function fetchBytes(url, what) {
  let r;
  try { r = await fetch(url); } catch (e) { throw new TinytWebError(`cannot fetch ${what} (${url}): ${e.message}`); }
  if (!r.ok) throw new TinytWebError(`cannot fetch ${what} (${url}): HTTP ${r.status}`);
  return new Uint8Array(await r.arrayBuffer());
}

export class LanguageModel {
  constructor(web, tokenizer, step, prompt) {
    this.web = web; this.tokenizer = tokenizer; this.step = step; this.prompt = prompt || step;
    this.context = web.context;
  }

  _feeds(ids, past, cache) {  // one row: the contract's inputs, or the shared-cache graph's
    const n = ids.length, w = this.web, f = {};
    f.input_ids = new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, n]);
    f.position_ids = new ort.Tensor("int64", BigInt64Array.from(ids, (_, i) => BigInt(past + i)), [1, n]);
    if (w.graph === "decoder_gqa") {
      f.seqlens_k = new ort.Tensor("int32", Int32Array.of(past + n - 1), [1]);
      f.total_sequence_length = new ort.Tensor("int32", Int32Array.of(past + n), []);
      if (this.step.inputNames.includes("window_seqlens_k")) {
        // the windowed layers' own counts (tinyt.contract.WINDOW_INPUTS): here their buffers
        // hold the whole past as the others' do, so the counts are the same
        f.window_seqlens_k = f.seqlens_k;
        f.window_total_sequence_length = f.total_sequence_length;
      }
    } else {
      f.attention_mask = new ort.Tensor("int64", new BigInt64Array(past + n).fill(1n), [1, past + n]);
    }
    for (let l = 0; l < w.n_layer; l++) {
      f[`past_key_values.${l}.key`] = cache[2 * l];
      f[`past_key_values.${l}.value`] = cache[2 * l + 1];
    }
    return f;
  }

  _emptyCache(tokens) {
    // a shared-cache graph's buffers hold what this call can reach (prompt + new tokens),
    // never the model's whole context; the contract graph's past starts empty and grows
    const w = this.web, cap = w.graph === "decoder_gqa" ? Math.min(tokens, this.context) : 0;
    // the contract's order (tinyt.contract.kv_axes), symbolic axes filled in
    const shape = w.kv_axes.map((a) => (a === "length" ? cap : typeof a === "string" ? 1 : a));
    const size = shape.reduce((a, b) => a * b, 1);
    return Array.from({ length: 2 * w.n_layer }, () => new ort.Tensor("float32", new Float32Array(size), shape));
  }

  async _run(session, ids, past, cache) {
    const out = await session.run(this._feeds(ids, past, cache));
    const next = [];
    for (let l = 0; l < this.web.n_layer; l++) next.push(out[`present.${l}.key`], out[`present.${l}.value`]);
    const logits = out.logits, V = logits.dims[logits.dims.length - 1];
    return { logits: logits.data.subarray(logits.data.length - V), cache: next };
  }

  /** Generate from `prompt` (a string, or token ids); see the module comment for options. */
  async generate(prompt, opts = {}) {
    const known = ["maxNewTokens", "minNewTokens", "temperature", "topK", "topP", "seed", "stop",
                   "onToken", "signal"];
    const unknown = Object.keys(opts).filter((k) => !known.includes(k));
    if (unknown.length) throw new TinytWebError(`unknown option(s) ${unknown.join(", ")}; options are ${known.join(", ")}`);
    const o = { maxNewTokens: 32, minNewTokens: 0, temperature: 0, topK: 0, topP: 1, seed: 0,
                stop: [], ...opts };
    if (!Number.isInteger(o.maxNewTokens) || o.maxNewTokens < 1) throw new TinytWebError(`maxNewTokens=${o.maxNewTokens} must be an integer >= 1`);
    for (const [k, v] of [["temperature", o.temperature], ["topP", o.topP], ["topK", o.topK]]) {
      if (typeof v !== "number" || !Number.isFinite(v) || v < 0) throw new TinytWebError(`${k}=${v} must be a finite number >= 0`);
    }
    if (o.topP > 1) throw new TinytWebError(`topP=${o.topP} must be at most 1`);
    const ids = typeof prompt === "string" ? this.tokenizer.hf.encode(prompt, { add_special_tokens: true }).ids : Array.from(prompt);
    if (!ids.length) throw new TinytWebError("the prompt is empty: give at least one token");
    if (ids.length >= this.context) {
      throw new TinytWebError(`the prompt is ${ids.length} tokens; the model's context is ${this.context}, which leaves no room for a token (at most ${this.context - 1} prompt tokens)`);
    }
    const room = Math.min(o.maxNewTokens, this.context - ids.length);
    const random = rng(o.seed), out = [], t0 = performance.now();
    let cache = this._emptyCache(ids.length + room), past = 0, shown = 0, reason = "length", tPrompt = 0;
    let r = await this._run(this.prompt, ids, past, cache);
    past = ids.length; cache = r.cache; tPrompt = performance.now() - t0;
    const eos = this.web.eos_token_id;
    let text = "";
    for (let k = 0; k < room; k++) {
      if (o.signal && o.signal.aborted) { reason = "cancelled"; break; }
      if (eos != null && out.length < o.minNewTokens) r.logits[eos] = -Infinity;  // not yet
      const id = sample(r.logits, o, random);
      if (id === eos) { reason = "eos"; break; }
      out.push(id);
      text = this.tokenizer.decode(out);
      const cut = o.stop.map((s) => text.indexOf(s)).filter((i) => i >= 0);
      if (cut.length) { text = text.slice(0, Math.min(...cut)); reason = "stop"; }
      const safe = reason === "stop" ? text.length : (text.endsWith("\ufffd") ? text.lastIndexOf("\ufffd") : text.length);
      if (o.onToken) o.onToken(safe > shown ? text.slice(shown, safe) : "", id);
      shown = Math.max(shown, safe);
      if (reason === "stop" || k === room - 1) break;
      r = await this._run(this.step, [id], past, cache);
      past += 1; cache = r.cache;
      await yieldNow();  // let the page paint the token
    }
    const ms = performance.now() - t0;
    return { tokenIds: out, text, finishReason: reason, promptTokens: ids.length,
             timings: { prefillMs: tPrompt, totalMs: ms,
                        decodeMsPerToken: out.length > 1 ? (ms - tPrompt) / (out.length - 1) : null } };
  }
}

// -- encoders and classifiers: one graph, input_ids / attention_mask [/ token_type_ids] --------
const TEXT_OUTPUT = { encoder: "sentence_embedding", classifier: "logits", token_classifier: "logits" };

function softmax(z) {  // one row of logits -> probabilities (max subtracted, as the runtime does)
  const top = Math.max(...z), e = Array.from(z, (v) => Math.exp(v - top));
  const sum = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / sum);
}

export class TextModel {
  constructor(web, tokenizer, session) {
    this.web = web; this.tokenizer = tokenizer; this.session = session; this.kind = web.graph;
    this.maxLength = web.max_length; this.labels = web.labels || [];
    this.types = session.inputNames.includes("token_type_ids");
  }

  /** One text or a list of them (classify: an item may be a pair [a, b]); {single, list}. */
  _texts(texts, what, nonEmpty, pairs = false) {
    const single = typeof texts === "string", list = single ? [texts] : texts;
    const isPair = (t) => pairs && Array.isArray(t) && t.length === 2 && t.every((x) => typeof x === "string");
    const bad = Array.isArray(list) ? list.findIndex((t) => typeof t !== "string" && !isPair(t)) : -1;
    if (!Array.isArray(list) || !list.length || bad >= 0) {
      const given = bad >= 0 && Array.isArray(list[bad]) ? ` (item ${bad} is an array of ${list[bad].length})` : "";
      throw new TinytWebError(`${what} takes a string or a non-empty array of strings${pairs ? " or of pairs [text, text]" : ""}${given}`);
    }
    const empty = nonEmpty ? list.findIndex((t) => (isPair(t) ? !t[0] || !t[1] : !t)) : -1;
    if (empty >= 0) throw new TinytWebError(`text ${empty} ${isPair(list[empty]) ? "is a pair with an empty text" : "is empty"}; give at least one character`);
    return { single, list };
  }

  _need(kind, method, instead, opts, known) {
    if (this.kind !== kind) throw new TinytWebError(`${this.web.name} is a ${this.kind} graph: ${method}() needs a ${kind}; use ${instead}()`);
    const unknown = Object.keys(opts).filter((k) => !known.includes(k));
    if (unknown.length) throw new TinytWebError(`unknown option(s) ${unknown.join(", ")}; options are ${known.join(", ")}`);
  }

  /** Rows (encodeRow's) through the graph in batches of `batchSize`, each padded on the right
   * to its longest; `order` (indices) says which rows go together. Returns, per row, the
   * output's slice for it: [dim] or [labels] per row, [tokens, labels] for a token classifier. */
  async _run(rows, order, batchSize) {
    if (!Number.isInteger(batchSize) || batchSize < 1) throw new TinytWebError(`batchSize=${batchSize} must be an integer >= 1`);
    const out = new Array(rows.length), name = TEXT_OUTPUT[this.kind];
    for (let s = 0; s < order.length; s += batchSize) {
      const part = order.slice(s, s + batchSize), B = part.length;
      const T = Math.max(...part.map((i) => rows[i].ids.length));
      const ids = new BigInt64Array(B * T).fill(BigInt(this.web.pad_token_id)),
        mask = new BigInt64Array(B * T), types = new BigInt64Array(B * T);
      part.forEach((i, r) => rows[i].ids.forEach((id, t) => {
        ids[r * T + t] = BigInt(id); mask[r * T + t] = 1n; types[r * T + t] = BigInt(rows[i].typeIds[t]);
      }));
      const feeds = { input_ids: new ort.Tensor("int64", ids, [B, T]),
                      attention_mask: new ort.Tensor("int64", mask, [B, T]) };
      if (this.types) feeds.token_type_ids = new ort.Tensor("int64", types, [B, T]);
      const y = (await this.session.run(feeds, [name]))[name];
      const per = y.data.length / B;  // [C], [labels] or [T, labels] per row
      part.forEach((i, r) => { out[i] = y.data.slice(r * per, (r + 1) * per); });
    }
    return out;
  }

  /** Sentence embeddings (Float32Array each), as tinyt.runtime's Encoder.embed: texts sorted
   * by length into batches; normalize (true / false / null: the model's own choice). */
  async embed(texts, opts = {}) {
    this._need("encoder", "embed", this.kind === "classifier" ? "classify" : "tag", opts,
               ["normalize", "batchSize"]);
    const { normalize = null, batchSize = 32 } = opts;
    const { single, list } = this._texts(texts, "embed", false);
    const rows = list.map((t) => this.tokenizer.encodeRow(t, this.maxLength));
    const order = rows.map((_, i) => i).sort((a, b) => rows[a].ids.length - rows[b].ids.length);
    const out = await this._run(rows, order, batchSize);
    if (normalize) {
      for (const e of out) {
        const n = Math.max(Math.hypot(...e), 1e-12);
        e.forEach((v, k) => { e[k] = v / n; });
      }
    }
    return single ? out[0] : out;
  }

  /** Label and class probabilities of each text, as tinyt.runtime's Classifier.classify; an
   * item that is a pair [a, b] is classified as one input, [CLS] a [SEP] b [SEP] (an NLI model's
   * or a cross-encoder's), b's tokens of type 1 where the model has token types. */
  async classify(texts, opts = {}) {
    this._need("classifier", "classify", this.kind === "encoder" ? "embed" : "tag", opts,
               ["batchSize"]);
    const { batchSize = 32 } = opts;
    const { single, list } = this._texts(texts, "classify", true, true);
    const rows = list.map((t) => (typeof t === "string" ? this.tokenizer.encodeRow(t, this.maxLength)
      : this.tokenizer.encodeRow(t[0], this.maxLength, { pair: t[1] })));
    const out = (await this._run(rows, rows.map((_, i) => i), batchSize)).map((z) => {
      const p = softmax(z);
      const best = p.indexOf(Math.max(...p));
      return { label: this.labels[best], probabilities: Object.fromEntries(this.labels.map((n, k) => [n, p[k]])) };
    });
    return single ? out[0] : out;
  }

  /** Each text's tokens with their labels, as tinyt.runtime's TokenClassifier.tag: the token
   * pieces, special ones included, each with its [start, end) in the text in code points
   * (Python's str indices: Array.from(text).slice(start, end); special tokens 0, 0). */
  async tag(texts, opts = {}) {
    this._need("token_classifier", "tag", this.kind === "encoder" ? "embed" : "classify", opts,
               ["batchSize"]);
    const { batchSize = 32 } = opts;
    const { single, list } = this._texts(texts, "tag", true);
    const rows = list.map((t) => this.tokenizer.encodeRow(t, this.maxLength, { offsets: true }));
    const L = this.labels.length;
    const out = (await this._run(rows, rows.map((_, i) => i), batchSize)).map((z, i) =>
      rows[i].tokens.map((token, t) => {
        const p = softmax(z.subarray(t * L, (t + 1) * L)), best = p.indexOf(Math.max(...p));
        const [start, end] = rows[i].offsets[t];
        return { token, start, end, label: this.labels[best], probability: p[best] };
      }));
    return single ? out[0] : out;
  }
}

async function speechModel(web, tokenizer, sessions, bytes) {  // a Whisper's (speech.mjs)
  const { n_mels: m, bins } = web.speech, filters = new Float64Array(bytes.slice().buffer);
  if (filters.length !== m * bins) throw new TinytWebError(`${web.speech.mel_filters} holds ${filters.length} numbers; the model's ${m} mel filters over ${bins} bins are ${m * bins}`);
  return new (await import("./speech.mjs")).SpeechModel(web, tokenizer, sessions, filters);
}

/** Load a packaged model from `base` (a URL of the package folder): a LanguageModel, a
 * TextModel for an encoder or a (token) classifier, a Seq2SeqModel (seq2seq.mjs) for an
 * encoder-decoder, or a SpeechModel (speech.mjs) for a Whisper. Options: numThreads (1: no threads; more need cross-origin isolation),
 * fetchBytes(url) to load files another way. */
export async function load(base = ".", { numThreads = 1, fetch: get = fetchBytes } = {}) {
  const t0 = performance.now();
  const url = (f) => `${base.replace(/\/$/, "")}/${f}`;
  let web, tokJson;
  try { web = JSON.parse(new TextDecoder().decode(await get(url("web.json"), "web.json"))); }
  catch (e) { throw e instanceof TinytWebError ? e : new TinytWebError(`web.json is not valid JSON: ${e.message}`); }
  try { tokJson = JSON.parse(new TextDecoder().decode(await get(url(web.tokenizer), "the tokenizer"))); }
  catch (e) { throw e instanceof TinytWebError ? e : new TinytWebError(`${web.tokenizer} is not valid JSON: ${e.message}`); }
  const tokenizer = new Tokenizer(tokJson);
  const text = web.graph in TEXT_OUTPUT, seq2seq = web.graph === "seq2seq";
  // a language model's logits are one per id; an encoder's table may have unused rows beyond the
  // tokenizer's ids, but no id past it
  if (text || seq2seq ? tokenizer.vocabSize > web.vocab_size : tokenizer.vocabSize !== web.vocab_size) {
    throw new TinytWebError(`the tokenizer has ${tokenizer.vocabSize} tokens but the model's vocabulary is ${web.vocab_size}: they are not from the same artifact`);
  }
  ort.env.wasm.numThreads = numThreads;
  const sessions = [];
  for (const f of web.graphs) {
    const bytes = await get(url(f), `the model graph ${f}`);
    try {
      sessions.push(await ort.InferenceSession.create(bytes, { executionProviders: ["wasm"], graphOptimizationLevel: "all" }));
    } catch (e) {
      throw new TinytWebError(`ONNX Runtime Web cannot load ${f}: ${String(e.message || e).slice(0, 300)}`);
    }
  }
  const model = web.speech ? await speechModel(web, tokenizer, sessions, await get(url(web.speech.mel_filters), "the mel filters"))
    : seq2seq ? new (await import("./seq2seq.mjs")).Seq2SeqModel(web, tokenizer, sessions)
    : text ? new TextModel(web, tokenizer, sessions[0])
    : new LanguageModel(web, tokenizer, sessions[0], sessions[1]);
  model.loadMs = performance.now() - t0;
  return model;
}

export { ort };
