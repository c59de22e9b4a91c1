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
import { TinytWebError, Tokenizer } from "./tokenizer.mjs";

export { TinytWebError, Tokenizer };

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

/** Load a packaged model from `base` (a URL of the package folder): a LanguageModel, a
 * TextModel for an encoder or a (token) classifier, a Seq2SeqModel (seq2seq.mjs) for an
 * encoder-decoder, or a SpeechModel (speech.mjs) for a Whisper. Options: numThreads (1: no
 * threads; more need cross-origin isolation), fetchBytes(url) to load files another way. */
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
  const model = web.speech ? (await import("./speech.mjs")).speechModel(web, tokenizer, sessions, await get(url(web.speech.mel_filters), "the mel filters"))
    : seq2seq ? new (await import("./seq2seq.mjs")).Seq2SeqModel(web, tokenizer, sessions)
    : text ? new TextModel(web, tokenizer, sessions[0])
    : new LanguageModel(web, tokenizer, sessions[0], sessions[1]);
  model.loadMs = performance.now() - t0;
  return model;
}

export { ort };
