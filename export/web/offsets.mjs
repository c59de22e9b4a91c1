// Where each token of a text sits in it: the character offsets Hugging Face's Rust `tokenizers`
// gives (Encoding.offsets; tinyt.runtime's TokenClassifier.tag returns them), for a
// tokenizer.json that @huggingface/tokenizers runs -- which gives none (0.2.0 has no offsets
// anywhere: its normalizers return strings, its encode tokens and ids).
//
// The tokens and everything they are made of still come from the library; this module only
// follows each character through the steps, as the Rust library's NormalizedString does:
//
//   text ── added tokens (the library's splitter) ── sections, each [start, end) of the text
//     section ── normalizer ── normalized chars, each with the original [start, end) it came from
//               (Rust's `transform` rules: a replaced char keeps its source's, an inserted one
//               takes the one before, removed ones vanish; NFC/NFKC as the
//               unicode-normalization-alignments crate composes: a composed char keeps its first
//               source's; the library's string is checked to have as many chars)
//     ── pre-tokenizer ── pre-tokens: the library's pieces found in order in the normalized chars
//               (Metaspace's ▁ and ByteLevel's bytes take their char's span)
//     ── model ── tokens: the library's, each as many chars of its pre-token as it spells
//               (WordPiece's [UNK] the whole word; Unigram's unknown run its raw chars)
//     ── post-processor ── ByteLevel / RobertaProcessing trim_offsets (leading / trailing Ġ)
//
// Offsets count code points, as Python's str (and the Rust library's char offsets) do:
// `Array.from(text).slice(start, end).join("")`; special tokens the post-processor adds are
// [0, 0]. A normalizer or pre-tokenizer not in the tables below is refused by name.
import * as hf from "./tokenizers.min.mjs";

export class OffsetsError extends Error {}

// -- a string whose chars know where they came from --------------------------------------------
class Aligned {
  constructor(chars, align, origin) { this.chars = chars; this.align = align; this.origin = origin; }
  static of(text, start) {
    const chars = Array.from(text);
    return new Aligned(chars, chars.map((_, i) => [start + i, start + i + 1]), start);
  }
  get text() { return this.chars.join(""); }
  slice(s, e) {  // Rust's slice: its origin is where its first char came from
    const align = this.align.slice(s, e);
    return new Aligned(this.chars.slice(s, e), align, align.length ? align[0][0] : this.origin);
  }
  span(s, e) { return [this.align[s][0], this.align[e - 1][1]]; }
}

/** NormalizedString::transform_range, one entry per char: `pairs` of (char, change) replace
 * chars [s, e) of `a` after `initial` removed ones; change 0 replaces a char (its span), < 0
 * replaces one and removes -change more, > 0 inserts one (the span of the char before). */
function transform(a, pairs, initial = 0, s = 0, e = a.chars.length) {
  const chars = [], align = [];
  let off = s + initial;
  for (const [c, change] of pairs) {
    if (change > 0) align.push(off < 1 ? [a.origin, a.origin] : a.align[off - 1]);
    else { align.push(a.align[off]); off += 1 - change; }
    chars.push(c);
  }
  return new Aligned([...a.chars.slice(0, s), ...chars, ...a.chars.slice(e)],
                     [...a.align.slice(0, s), ...align, ...a.align.slice(e)], a.origin);
}

function filter(a, keep) {  // removed chars go with the kept one before them (Rust's filter)
  const pairs = [];
  let removed = 0, first = 0, last = null;
  for (const c of a.chars) {
    if (!keep(c)) { removed += 1; continue; }
    if (last === null) first = removed; else pairs.push([last, -removed]);
    last = c; removed = 0;
  }
  if (last !== null) pairs.push([last, -removed]);
  return transform(a, pairs, first);
}

const map = (a, f) => transform(a, a.chars.map((c) => [f(c), 0]));
const expand = (a, f) => transform(a, a.chars.flatMap((c) => Array.from(f(c), (d, i) => [d, i ? 1 : 0])));

function prepend(a, s) {
  if (!a.chars.length) return a;
  return transform(a, [...Array.from(s, (c, i) => [c, i ? 1 : 0]), [a.chars[0], 1]], 0, 0, 1);
}

function replace(a, pattern, content) {  // each match's chars out, content in after the last
  const text = a.text, starts = new Map([[0, 0]]);
  let u = 0;
  a.chars.forEach((c, i) => { u += c.length; starts.set(u, i + 1); });
  const at = (i) => starts.get(i);  // a UTF-16 index -> a char index
  let out = a, shift = 0;
  for (const m of text.matchAll(pattern)) {
    const s = at(m.index), e = at(m.index + m[0].length), add = Array.from(content, (c) => [c, 1]);
    out = transform(out, add, e - s, s + shift, e + shift);
    shift += add.length - (e - s);
  }
  return out;
}

// -- NFD / NFKD / NFC / NFKC as unicode-normalization-alignments emits them ------------------
// Its decomposition gives each source char's first char change 0 and the others +1, then sorts
// each run of non-starters by canonical combining class, changes travelling with their chars;
// its composition gives a composed char change (a + b - 1). JavaScript has no class table, so
// the class order comes from String.normalize itself: two non-starters swap under NFD exactly
// when the first's class is the greater.
const memo = new Map();
function cached(key, f) {
  let v = memo.get(key);
  if (v === undefined) {
    if (memo.size > 100000) memo.clear();
    v = f(); memo.set(key, v);
  }
  return v;
}
// class 0 <=> it moves neither before U+0301 (class 230) nor after U+0334 (class 1)
const starter = (c) => cached(`s${c}`, () => ("\u0301" + c).normalize("NFD") === "\u0301" + c
                                            && (c + "\u0334").normalize("NFD") === c + "\u0334");
const order = (x, y) => cached(`o${x}${y}`, () => ((x + y).normalize("NFD") === y + x ? 1
  : (y + x).normalize("NFD") === x + y ? -1 : 0));  // sign(class(x) - class(y)), non-starters
const compose = (a, b) => cached(`c${a}${b}`, () => {
  const r = (a + b).normalize("NFC");
  return Array.from(r).length === 1 ? r : null;
});

function decompose(chars, form) {
  const out = [];
  let run = [];
  const flush = () => { run.sort((p, q) => order(p[0], q[0])); out.push(...run); run = []; };
  for (const ch of chars) {
    Array.from(ch.normalize(form)).forEach((d, i) => {
      if (starter(d)) { flush(); out.push([d, i ? 1 : 0]); } else run.push([d, i ? 1 : 0]);
    });
  }
  flush();
  return out;
}

function recompose(pairs) {  // the crate's Recompositions, state for state
  const out = [];
  let composee = null, last = null, buffer = [];
  for (const [ch, change] of pairs) {
    const isStarter = starter(ch);
    if (composee === null) {
      if (isStarter) composee = [ch, change]; else out.push([ch, change]);
      continue;
    }
    if (last !== null && (isStarter || order(last, ch) >= 0)) {  // blocked from the composee
      if (isStarter) { out.push(composee, ...buffer); buffer = []; last = null; composee = [ch, change]; }
      else { buffer.push([ch, change]); last = ch; }
      continue;
    }
    const r = compose(composee[0], ch);
    if (r !== null) { composee = [r, composee[1] + change - 1]; continue; }
    if (last === null && isStarter) { out.push(composee); composee = [ch, change]; continue; }
    buffer.push([ch, change]); last = ch;
  }
  if (composee !== null) out.push(composee);
  return [...out, ...buffer];
}

function unicodeForm(a, form) {
  const d = decompose(a.chars, form.endsWith("C") ? form.replace("C", "D") : form);
  return transform(a, form.endsWith("C") ? recompose(d) : d);
}

// -- normalizers: the library's steps, with Rust's rules for where each char comes from -------
// (the library's own content choices are kept, so the string has the library's length)
const CONTROL = /^(\p{Cc}|\p{Cf}|\p{Co}|\p{Cs})$/u, SPACE = /^\s$/u, JS_SPACE = /\s/u;
// the Rust library's is_chinese_char (normalizers/bert.rs), on code points (tinyt.mjs gives the
// library's BertNormalizer the same: 0.2.0 read UTF-16 units, missing the CJK past U+FFFF)
const CJK_RANGES = [[0x4e00, 0x9fff], [0x3400, 0x4dbf], [0x20000, 0x2a6df], [0x2a700, 0x2b73f],
  [0x2b740, 0x2b81f], [0x2b920, 0x2ceaf], [0xf900, 0xfaff], [0x2f800, 0x2fa1f]];
export const isCjk = (c) => { const cp = c.codePointAt(0); return CJK_RANGES.some(([a, b]) => cp >= a && cp <= b); };
const PRECOMPILED_REMOVED = /[\u0001-\u0008\u000B\u000E-\u001F\u007F\u008F\u009F]/u;
const PRECOMPILED_SPACE = /[\u0009\u000A\u000C\u000D\u00A0\u1680\u2000-\u200F\u2028\u2029\u202F\u205F\u2581\u3000\uFEFF\uFFFD]/u;

function strip(a, left, right) {
  let lead = 0, trail = 0;
  if (left) while (lead < a.chars.length && JS_SPACE.test(a.chars[lead])) lead++;
  if (right) while (trail < a.chars.length - lead && JS_SPACE.test(a.chars[a.chars.length - 1 - trail])) trail++;
  if (!lead && !trail) return a;
  const n = a.chars.length, keep = a.chars.slice(lead, n - trail);
  return transform(a, keep.map((c, i) => [c, i === keep.length - 1 ? -trail : 0]), lead);
}

const NORMALIZERS = {
  BertNormalizer(a, n) {
    const cfg = n.config;
    if (cfg.clean_text) {
      a = filter(a, (c) => { const cp = c.charCodeAt(0); return !(cp === 0 || cp === 0xfffd || (c !== "\t" && c !== "\n" && c !== "\r" && CONTROL.test(c))); });
      a = map(a, (c) => (SPACE.test(c) ? " " : c));
    }
    if (cfg.handle_chinese_chars) a = transform(a, a.chars.flatMap((c) => (isCjk(c) ? [[" ", 0], [c, 1], [" ", 1]] : [[c, 0]])));
    if (cfg.lowercase) a = expand(a, (c) => c.toLowerCase());
    if (cfg.lowercase ? cfg.strip_accents !== false : cfg.strip_accents) {
      a = filter(unicodeForm(a, "NFD"), (c) => !/\p{Mn}/u.test(c));
    }
    return a;
  },
  NFC: (a) => unicodeForm(a, "NFC"),
  NFD: (a) => unicodeForm(a, "NFD"),
  NFKC: (a) => unicodeForm(a, "NFKC"),
  NFKD: (a) => unicodeForm(a, "NFKD"),
  Lowercase: (a) => expand(a, (c) => c.toLowerCase()),
  StripAccents: (a) => filter(a, (c) => !/\p{M}/u.test(c)),
  Strip: (a, n) => strip(a, n.config.strip_left, n.config.strip_right),
  Prepend: (a, n) => prepend(a, n.config.prepend),
  Replace: (a, n) => (n.pattern === null ? a : replace(a, n.pattern, n.config.content ?? "")),
  Precompiled(a) {  // the library's stand-in for the charsmap: these removed, these spaced, NFKC
    a = filter(a, (c) => !PRECOMPILED_REMOVED.test(c));
    a = map(a, (c) => (PRECOMPILED_SPACE.test(c) ? " " : c));
    const parts = [];  // NFKC, except around U+FF5E, which the library keeps
    let from = 0;
    a.chars.forEach((c, i) => { if (c === "\uff5e") { parts.push([from, i]); from = i + 1; } });
    parts.push([from, a.chars.length]);
    for (const [s, e] of parts.reverse()) {
      const pairs = recompose(decompose(a.chars.slice(s, e), "NFKD"));
      a = transform(a, pairs, 0, s, e);
    }
    return a;
  },
  Sequence(a, n, json) {
    json.normalizers.forEach((j, i) => { if (n.normalizers[i]) a = normalize(a, n.normalizers[i], j); });
    return a;
  },
};

function normalize(a, n, json) {
  const f = NORMALIZERS[json.type];
  if (!f) throw new OffsetsError(`character offsets through the ${json.type} normalizer are not derived (the page follows ${Object.keys(NORMALIZERS).join(", ")})`);
  return f(a, n, json);
}

// -- pre-tokenizers: the library's pieces, found in order in what each one splits --------------
function locate(view, pieces, what) {  // each piece a run of view's chars, in order
  const text = view.text, out = [];
  let u = 0, c = 0;
  for (const p of pieces) {
    const i = text.indexOf(p, u);
    if (i < 0) throw new OffsetsError(`${what}: the piece ${JSON.stringify(p)} is not in ${JSON.stringify(text)}`);
    c += Array.from(text.slice(u, i)).length;
    const n = Array.from(p).length;
    out.push(view.slice(c, c + n));
    c += n; u = i + p.length;
  }
  return out;
}

const UTF8 = new TextEncoder(), UTF8_IN = new TextDecoder("utf-8", { ignoreBOM: true });  // a BOM is text
const BYTES = new WeakMap();  // a ByteLevel pre-tokenizer's char -> byte
function byteOf(pre) {
  if (!BYTES.has(pre)) BYTES.set(pre, new Map(Object.entries(pre.byte_encoder).map(([b, ch]) => [ch, Number(b)])));
  return BYTES.get(pre);
}
function preTokenize(pre, json, pieces, options) {
  if (json.type === "Sequence") {
    json.pretokenizers.forEach((j, i) => { if (pre.tokenizers[i]) pieces = preTokenize(pre.tokenizers[i], j, pieces, options); });
    return pieces;
  }
  return pieces.flatMap((a) => {
    const got = pre.pre_tokenize_text(a.text, options);
    if (json.type === "ByteLevel") {  // each char -> its UTF-8 bytes, all with its span
      const view = pre.add_prefix_space && !a.text.startsWith(" ") ? prepend(a, " ") : a;
      const bytes = byteOf(pre);
      const text = got.map((g) => UTF8_IN.decode(Uint8Array.from(Array.from(g, (ch) => bytes.get(ch)))));
      return locate(view, text, "ByteLevel").map((p, k) => new Aligned(
        Array.from(got[k]), p.chars.flatMap((ch, i) => Array(UTF8.encode(ch).length).fill(p.align[i])), p.origin));
    }
    if (json.type === "Metaspace") {  // ' ' -> ▁ one for one, a ▁ before the section
      let view = Array.from(pre.str_rep).length === 1 ? map(a, (c) => (c === " " ? pre.str_rep : c))
        : replace(a, / /gu, pre.str_rep);
      const first = (options || {}).section_index === 0;
      if (!view.text.startsWith(pre.replacement) && (pre.prepend_scheme === "always" || (pre.prepend_scheme === "first" && first))) {
        view = prepend(view, pre.str_rep);
      }
      return locate(view, got, "Metaspace");
    }
    if (!["BertPreTokenizer", "Whitespace", "WhitespaceSplit", "Punctuation", "Digits", "Split", "FixedLength"].includes(json.type)) {
      throw new OffsetsError(`character offsets through the ${json.type} pre-tokenizer are not derived`);
    }
    return locate(a, got, json.type);  // pieces of the text itself
  });
}

// -- the model: how many chars of its pre-token each token spells ------------------------------
function modelTokens(model, json, piece) {
  const text = piece.text, tokens = model._call([text]), n = piece.chars.length;
  const len = (s) => Array.from(s).length;
  let lengths;
  if (json.type === "WordPiece") {
    const prefix = json.continuing_subword_prefix ?? "##";
    lengths = tokens.length === 1 && tokens[0] === model.unk_token ? [n]
      : tokens.map((t, i) => len(i && t.startsWith(prefix) ? t.slice(prefix.length) : t));
  } else if (json.type === "Unigram") {
    lengths = tokens.map(len);  // pieces of the text; an unknown run is its own raw chars
  } else if (json.type === "BPE") {
    const pieces = model.ignore_merges && model.tokens_to_ids.has(text) ? [text] : model.bpe(text);
    const cut = (p, i) => {
      const suffix = i === pieces.length - 1 ? model.end_of_word_suffix : model.continuing_subword_suffix;
      return len(suffix && p.endsWith(suffix) ? p.slice(0, -suffix.length) : p);
    };
    const each = [];  // what BPE.encode makes of each piece, then fuse_unk
    pieces.forEach((p, i) => {
      const k = cut(p, i);
      if (model.tokens_to_ids.has(p)) each.push([p, k]);
      else if (model.byte_fallback && Array.from(UTF8.encode(p)).every((b) => model.tokens_to_ids.has(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`))) {
        UTF8.encode(p).forEach((b, j) => each.push([`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`, j ? 0 : k]));
      } else if (model.unk_token != null) {
        const prev = each[each.length - 1];
        if (model.fuse_unk && prev && prev[0] === model.unk_token) prev[1] += k; else each.push([model.unk_token, k]);
      }
    });
    if (each.map((e) => e[0]).join("\u0000") !== tokens.join("\u0000")) {
      throw new OffsetsError(`BPE offsets: ${JSON.stringify(text)} made ${JSON.stringify(tokens)}, not ${JSON.stringify(each.map((e) => e[0]))}`);
    }
    lengths = each.map((e) => e[1]);
  } else {
    throw new OffsetsError(`character offsets for a ${json.type} model are not derived`);
  }
  const out = [];
  let at = 0;
  tokens.forEach((t, i) => {
    const k = lengths[i];
    // a byte-fallback token past its piece's first keeps that piece's span
    out.push({ token: t, span: k ? piece.span(at, at + k) : out.length ? out[out.length - 1].span : piece.span(at, at + 1) });
    at += k;
  });
  if (at !== n) throw new OffsetsError(`${json.type} offsets: the tokens ${JSON.stringify(tokens)} spell ${at} of the ${n} chars of ${JSON.stringify(text)}`);
  return out;
}

// -- post-processors: trim_offsets ------------------------------------------------------------
const G = "\u0120";  // Ġ, byte-level's space
const TRIMS = { RobertaProcessing: (j) => j.trim_offsets !== false, ByteLevel: (j) => j.trim_offsets };
function trimOffsets(json, body) {
  if (!json) return;
  if (json.type === "Sequence") { json.processors.forEach((j) => trimOffsets(j, body)); return; }
  if (!(json.type in TRIMS) || !TRIMS[json.type](json)) return;
  const ws = (c) => c === G || /\p{White_Space}/u.test(c);
  body.forEach((t, i) => {  // processors/byte_level.rs process_offsets
    const chars = Array.from(t.shown ?? t.token);  // an added token with the spaces it took
    let lead = 0, trail = 0;
    while (lead < chars.length && ws(chars[lead])) lead++;
    while (trail < chars.length && ws(chars[chars.length - 1 - trail])) trail++;
    const o = t.span;
    if (lead > 0) {
      if ((i === 0 || o[0] === 0) && json.add_prefix_space && lead === 1) lead = 0;
      o[0] = Math.min(o[0] + lead, o[1]);
    }
    if (trail > 0 && o[1] >= trail) o[1] = Math.max(o[1] - trail, o[0]);
  });
}

/** The tokens of `text` (no special tokens) with their [start, end) in it, as the library's
 * encode_text makes them (its added-token splits, normalizer, pre-tokenizer and model), each
 * span as the Rust library's offsets give it. `tok` is a library Tokenizer, `json` its file. */
export function tokensWithOffsets(tok, json, text) {
  const out = [], sections = tok.splitter_unnormalized.split(text), chars = Array.from(text);
  const at = [];  // [start, end) of each section, in code points
  let c = 0;
  for (const s of sections) { const n = Array.from(s).length; at.push([c, c + n]); c += n; }
  const takeSpaces = (i, left) => {  // an added token's lstrip / rstrip takes its neighbour's spaces
    const [s, e] = at[i], chars = Array.from(sections[i]);
    let k = 0;
    if (left) { while (k < chars.length && /\s/u.test(chars[chars.length - 1 - k])) k++; at[i] = [s, e - k]; sections[i] = chars.slice(0, chars.length - k).join(""); }
    else { while (k < chars.length && /\s/u.test(chars[k])) k++; at[i] = [s + k, e]; sections[i] = chars.slice(k).join(""); }
    return k;
  };
  const added = sections.map((s) => tok.added_tokens_map.get(s));
  added.forEach((t, i) => {
    if (!t) return;
    if (t.lstrip && i > 0 && !added[i - 1]) at[i] = [at[i][0] - takeSpaces(i - 1, true), at[i][1]];
    if (t.rstrip && i < sections.length - 1 && !added[i + 1]) at[i] = [at[i][0], at[i][1] + takeSpaces(i + 1, false)];
  });
  sections.forEach((section, index) => {
    if (!section.length) return;
    if (added[index]) {  // as the Rust library shows it: with the spaces lstrip / rstrip took
      const [s, e] = at[index];
      out.push({ token: section, span: [s, e], shown: chars.slice(s, e).join("") });
      return;
    }
    let a = Aligned.of(section, at[index][0]);
    const normalized = tok.normalizer ? tok.normalizer(section) : section;
    if (tok.normalizer) a = normalize(a, tok.normalizer, json.normalizer);
    if (Array.from(normalized).length !== a.chars.length) {
      throw new OffsetsError(`offsets: the normalizer made ${a.chars.length} chars of ${JSON.stringify(section)} here, the library ${Array.from(normalized).length}`);
    }
    if (!normalized.length) return;
    // the library's normalized text, with this module's spans: the same length, char for char
    a = new Aligned(Array.from(normalized), a.align, a.origin);
    const subs = tok.splitter_normalized.split(normalized);
    const parts = locate(a, subs, "added tokens");
    const addedHere = subs.map((s) => tok.added_tokens_map.get(s));
    addedHere.forEach((t, j) => {  // lstrip / rstrip in the normalized text
      if (!t) return;
      const cut = (k, left) => {
        const p = parts[k], chars = p.chars;
        let n = 0;
        if (left) { while (n < chars.length && /\s/u.test(chars[chars.length - 1 - n])) n++; parts[k] = p.slice(0, chars.length - n); return [p.slice(chars.length - n, chars.length), n]; }
        while (n < chars.length && /\s/u.test(chars[n])) n++;
        parts[k] = p.slice(n, chars.length);
        return [p.slice(0, n), n];
      };
      if (t.lstrip && j > 0 && !addedHere[j - 1]) { const [ws] = cut(j - 1, true); parts[j] = new Aligned([...ws.chars, ...parts[j].chars], [...ws.align, ...parts[j].align], ws.origin); }
      if (t.rstrip && j < subs.length - 1 && !addedHere[j + 1]) { const [ws] = cut(j + 1, false); parts[j] = new Aligned([...parts[j].chars, ...ws.chars], [...parts[j].align, ...ws.align], parts[j].origin); }
    });
    parts.forEach((p, j) => {
      if (!p.chars.length) return;
      if (addedHere[j]) { out.push({ token: subs[j], span: p.span(0, p.chars.length), shown: p.text }); return; }
      const pieces = tok.pre_tokenizer ? preTokenize(tok.pre_tokenizer, json.pre_tokenizer, [p], { section_index: index }) : [p];
      for (const piece of pieces) if (piece.chars.length) out.push(...modelTokens(tok.model, json.model, piece));
    });
  });
  return out;
}

export { trimOffsets };
