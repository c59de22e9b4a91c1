"""tinyt train --task seq2seq: the built-in code-summarization pairs, a user's .tsv / .jsonl,
the loss over target tokens only, training, resume, chrF / BLEU, the CLI, data parallelism."""
import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sacrebleu
import torch
from conftest import run_tinyt
from safetensors.torch import load_file
from test_ddp import GRAD_RTOL, LOSS_ATOL, WORKER

from tinyt import seq2seq_data as S
from tinyt.checkpoint import MODEL_FILE, load_checkpoint, save_checkpoint
from tinyt.config import ModelConfig, TrainConfig, preset
from tinyt.data import is_validation
from tinyt.errors import DataError
from tinyt.model import build_model
from tinyt.seq2seq import seq2seq_loss
from tinyt.seq2seq_task import IGNORE, Seq2SeqTask, collate, text_metrics
from tinyt.tokenizer import Tokenizer
from tinyt.train import train

QUIET = dict(log=lambda s: None)
MODEL = dict(task="seq2seq", block_size=32, vocab_size=300, n_layer=2, n_head=2, n_embd=32)
TRAIN = dict(max_steps=8, batch_size=8, warmup_steps=2, eval_interval=4, eval_batches=2,
             learning_rate=3e-3, min_lr=3e-4, max_target_tokens=12)

MODULE = textwrap.dedent('''\
    """A module."""


    def plain(a, b):
        """Add two numbers, e.g. ints. Then more.

        A second paragraph.
        """
        return a + b


    class Box:
        @property
        def size(self):
            """Return the size."""
            # a comment stays
            return len(self.items)

        async def fetch(self):
            """Fetch the items
            over two lines."""
            return await self.source()


    def only_doc():
        """Nothing but a docstring."""


    def signature(x):
        """signature(x) -> int"""
        return 1


    def no_doc(x):
        return x
    ''')


def _pairs(n=120):
    """Learnable pairs: the target names the words of the function's name."""
    words = ["alpha", "beta", "gamma", "delta", "value", "items", "count", "result", "name",
             "path", "size", "data"]
    out = []
    for i in range(n):
        a, b = words[i % len(words)], words[(i * 5 + 1) % len(words)]
        out.append((f"def get_{a}_{b}(self, n={i % 7}):\n    return self.{a}[n]",
                    f"Return the {a} of the {b}."))
    return out


@pytest.fixture(scope="session")
def pairs_tsv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pairs") / "pairs.tsv"
    path.write_text("".join(f"{s.replace(chr(10), ' ')}\t{t}\n" for s, t in _pairs()))
    return path


@pytest.fixture(scope="session")
def s2s_ckpt(tmp_path_factory, pairs_tsv) -> Path:
    """A tiny seq2seq checkpoint trained on the pairs (read-only for tests)."""
    out = tmp_path_factory.mktemp("s2s") / "ck"
    return train(ModelConfig(**MODEL), TrainConfig(**TRAIN), out, data=str(pairs_tsv), **QUIET)


# -- the data -----------------------------------------------------------------------------------
def test_function_pairs_strip_the_docstring_and_keep_its_first_sentence():
    pairs = dict((t, s) for s, t in S.function_pairs(MODULE))
    assert sorted(pairs) == ["Add two numbers, e.g. ints.", "Fetch the items over two lines.",
                             "Return the size."]  # no body, a signature, no docstring: out
    assert pairs["Add two numbers, e.g. ints."] == "def plain(a, b):\n    return a + b"
    assert pairs["Return the size."] == ("@property\ndef size(self):\n    # a comment stays\n"
                                         "    return len(self.items)")  # method, dedented
    assert pairs["Fetch the items over two lines."].startswith("async def fetch(self):\n")
    assert not any('"""' in s for s in pairs.values())
    assert S.function_pairs("def broken(:\n") == []


@pytest.mark.parametrize("doc,first", [
    ("Return x. More.", "Return x."),
    ("Open the file (eg. a pipe) now.\nNext.", "Open the file (eg. a pipe) now."),
    ("No period at all\n\nSecond paragraph.", "No period at all"),
    ("Word.", None),  # one word
    ("S.find(sub) -> int", None),  # a signature
    ("x" * 200 + ".", None),  # too long
])
def test_first_sentence(doc, first):
    assert S.first_sentence(doc) == first


def test_long_source_is_cut_at_a_line_end():
    body = "".join(f"    x{i} = {i}\n" for i in range(200))
    (src, _), = S.function_pairs(f'def f():\n    """Make many names."""\n{body}')
    lines = src.splitlines()
    assert S.SOURCE_CHARS - 1 <= len(src) < S.SOURCE_CHARS + 20
    assert lines[0] == "def f():" and lines[-1] == f"    x{len(lines) - 2} = {len(lines) - 2}"


def test_code_directory_split_by_file_is_disjoint_deterministic_and_deduplicated(tmp_path):
    for i in range(40):
        (tmp_path / f"m{i:02d}.py").write_text(MODULE.replace("plain", f"plain{i}"))
    d = S.load_pairs(tmp_path)
    assert d.val and d.train
    sources = [s for s, _ in d.train + d.val]
    assert len(sources) == len(set(sources)) == 40 + 2  # Box's two methods kept once
    assert S.load_pairs(tmp_path) == d
    held = {f"m{i:02d}.py" for i in range(40) if is_validation(f"m{i:02d}.py")}
    assert {s.split("(")[0][len("def "):] for s, _ in d.val if s.startswith("def plain")} \
        == {f"plain{int(n[1:3])}" for n in held}


def test_the_built_in_pairs_are_kept_on_disk_under_a_key_of_their_files(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYT_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "lib"
    root.mkdir()
    for i in range(6):
        (root / f"m{i}.py").write_text(MODULE.replace("plain", f"plain{i}"))
    S._stdlib_pairs.cache_clear()
    first = S._stdlib_pairs(root)
    (kept,) = (tmp_path / "cache").glob("stdlib-pairs-*.json")
    parse = S._code_pairs
    S._stdlib_pairs.cache_clear()
    monkeypatch.setattr(S, "_code_pairs", lambda *a: pytest.fail("parsed again"))
    assert S._stdlib_pairs(root) == first  # read from the disk
    monkeypatch.setattr(S, "_code_pairs", parse)
    S._stdlib_pairs.cache_clear()
    kept.write_text("{not json")  # an unreadable copy is made again
    assert S._stdlib_pairs(root) == first and json.loads(kept.read_text())["val"]
    (root / "m0.py").write_text(MODULE.replace("plain", "changed"))  # another key
    S._stdlib_pairs.cache_clear()
    changed = S._stdlib_pairs(root)
    assert len(list((tmp_path / "cache").glob("stdlib-pairs-*.json"))) == 2
    sources = {s for s, _ in changed.train + changed.val}
    assert any(s.startswith("def changed") for s in sources)
    assert not any(s.startswith("def plain0(") for s in sources)
    S._stdlib_pairs.cache_clear()


@pytest.fixture(scope="session")
def stdlib_pairs():
    return S.load_pairs()


def test_builtin_pairs_come_from_the_stdlib(stdlib_pairs):
    d = stdlib_pairs
    assert "standard library" in d.source and len(d.train) > 3000 and len(d.val) > 100
    assert not {s for s, _ in d.train} & {s for s, _ in d.val}
    join = next(s for s, t in d.train + d.val
                if t == "Join two or more pathname components, inserting '/' as needed.")
    assert join.startswith("def join(a, *p):\n    a = os.fspath(a)\n")  # posixpath.join
    assert "pathname components" not in join  # its docstring is gone
    assert all(len(t) <= S.TARGET_CHARS and len(s) < S.SOURCE_CHARS + 400 for s, t in d.train)


def test_tsv_and_jsonl_read_the_same_pairs(tmp_path):
    pairs = [("a b", "x."), ("c\td", "y."), ("e\nf", "z.")]
    tsv = tmp_path / "p.tsv"
    tsv.write_text("a b\tx.\r\n\n  \nq\tr\n")  # CRLF and blank lines read
    assert S.read_tsv(tsv) == [("a b", "x."), ("q", "r")]
    jl = tmp_path / "p.jsonl"
    jl.write_text("".join(json.dumps({"source": s, "target": t, "id": i}) + "\n"
                          for i, (s, t) in enumerate(pairs)))
    assert S.read_jsonl(jl) == pairs  # tabs and newlines survive; other keys are ignored


@pytest.mark.parametrize("name,text,needle", [
    ("p.tsv", "a\tb\nno tab here\n", r"p.tsv line 2 has 0 tabs; each line is source<TAB>target"),
    ("p.tsv", "a\tb\tc\n", r"line 1 has 2 tabs.*use .jsonl"),
    ("p.tsv", "a\t \n", r"line 1 has an empty target"),
    ("p.jsonl", '{"source": "a", "target": "b"}\n{oops}\n', r"p.jsonl line 2 is not JSON"),
    ("p.jsonl", '["a", "b"]\n', r"line 1 is a JSON list, not an object"),
    ("p.jsonl", '{"src": "a", "tgt": "b"}\n',
     r"line 1 has keys \['src', 'tgt'\] but no \['source', 'target'\]"),
    ("p.jsonl", '{"source": "a", "target": 3}\n', r"line 1: 'target' is 3; it must be a non-"),
    ("p.tsv", "\n  \n", r"p.tsv holds no pairs \(it is empty or blank\)"),
    ("p.csv", "a,b\n", r"suffix '.csv'; allowed: a .tsv file"),
    ("p.tsv", "a\tb\n", r"1 distinct pair\(s\) with 1 source\(s\); at least 2"),
])
def test_malformed_pairs_are_named(tmp_path, name, text, needle):
    (tmp_path / name).write_text(text)
    with pytest.raises(DataError, match=needle):
        S.load_pairs(tmp_path / name)


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(DataError, match="does not exist; pass a .tsv file"):
        S.load_pairs(tmp_path / "none.tsv")
    (tmp_path / "b.tsv").write_bytes(b"a\t\xff\n")
    with pytest.raises(DataError, match="b.tsv is not UTF-8 text"):
        S.load_pairs(tmp_path / "b.tsv")


def test_file_split_is_by_source_hash_and_deduplicated():
    pairs = [(f"src {i}", f"tgt {i}.") for i in range(400)]
    d = S.split_pairs("x", pairs + pairs[:50] + [("src 3", "another target.")])
    assert len(d.train) + len(d.val) == 401  # exact duplicates dropped
    val_sources = {s for s, _ in d.val}
    assert val_sources == {s for s, _ in pairs if is_validation(s)}
    assert not val_sources & {s for s, _ in d.train}  # a source is never on both sides
    few = S.split_pairs("x", pairs[:3])
    assert len(few.val) == 1 and len(few.train) == 2


# -- the loss and the task ------------------------------------------------------------------------
def _task(pairs=None, **train):
    pairs = pairs or _pairs(40)
    tok = Tokenizer.train_bpe([x for p in pairs for x in p], 300)
    tok.add_pad()
    cfg = ModelConfig(**{**MODEL, "vocab_size": tok.vocab_size, "decoder_start_id": tok.pad_id,
                         "block_size": 64})  # room for the loss test's extra padding
    data = S.split_pairs("test", pairs)
    return Seq2SeqTask(tok, data, cfg, TrainConfig(**{**TRAIN, **train})), cfg


@torch.no_grad()
def test_loss_is_over_target_tokens_only():
    task, cfg = _task()
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    examples = task.train[:6]
    batch = task._batch(examples)
    x, mask, y, _ = batch
    assert (mask.sum(1) < x.shape[1]).any() and (y == IGNORE).any()  # padding on both sides
    loss = task.loss(model, batch)
    # Each example alone, unpadded: the batch's loss is the mean over all target tokens.
    nats = sum(float(task.loss(model, task._batch([e]))) * len(e[1]) for e in examples)
    assert float(loss) == pytest.approx(nats / sum(len(t) for _, t in examples), rel=1e-5)
    assert float(loss) == pytest.approx(float(seq2seq_loss(model, x, mask, y, task.pad)),
                                        rel=1e-6)  # the model's own definition agrees
    x2 = x.masked_fill(mask == 0, 7)  # other ids in the source's padding
    y2 = torch.cat([y, torch.full((len(y), 3), IGNORE)], 1)  # more target padding
    x3, mask3 = (torch.cat([t, torch.full((len(t), 4), v)], 1) for t, v in ((x2, 5), (mask, 0)))
    assert float(task.loss(model, (x3, mask3, y2, batch[3]))) == pytest.approx(float(loss),
                                                                              rel=1e-5)


def test_batches_are_a_function_of_seed_and_step():
    task, _ = _task()
    a, b, c = task.batch(1, 7, 4), task.batch(1, 7, 4), task.batch(1, 8, 4)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not all(u.shape == v.shape and torch.equal(u, v) for u, v in zip(a, c))


def test_targets_are_cut_to_max_target_tokens_with_eos():
    long = [(f"def f{i}(): pass", " ".join(["word"] * 40) + ".") for i in range(10)]
    task, _ = _task(long, max_target_tokens=6)
    assert all(len(t) == 6 and t[-1] == task.tok.eos_id for _, t in task.train)
    x, _, y = collate([[1, 2, 3], [4]], [[5], [6, 7]], pad=9)
    assert x.tolist() == [[1, 2, 3], [4, 9, 9]] and y.tolist() == [[5, IGNORE], [6, 7]]


# -- training, checkpoints, metrics ---------------------------------------------------------------
def test_training_lowers_the_loss_and_scores_greedy_outputs(s2s_ckpt):
    meta = json.loads((s2s_ckpt / "config.json").read_text())
    state = json.loads((s2s_ckpt / "train_state.json").read_text())
    first, last = state["history"][0], state["history"][-1]
    assert last["step"] == 8 and last["val_loss"] < first["val_loss"] < math.log(300)
    assert last["train_loss"] < first["train_loss"]
    assert meta["metrics"] == {**last, "parameters": meta["metrics"]["parameters"]}
    assert 0 <= meta["metrics"]["val_chrf"] <= 100 and 0 <= meta["metrics"]["val_bleu"] <= 100


def test_checkpoint_round_trip(s2s_ckpt, tmp_path):
    ckpt = load_checkpoint(s2s_ckpt)
    tok, cfg = ckpt.tokenizer, ckpt.config
    assert cfg.task == "seq2seq" and cfg.vocab_size == tok.vocab_size
    assert cfg.decoder_start_id == tok.pad_id == tok.vocab_size - 1 != tok.eos_id
    # a source as training read it is what encode_prompt (the runtime, Optimum) gives
    text = "def get_a(self):\n    return self.a"
    assert tok.encode_prompt(text) == S.encode_sides(tok, [text], 64)[0]
    assert tok.encode_prompt(text)[-1] == tok.eos_id and tok.start_id is None
    stored = load_file(str(s2s_ckpt / MODEL_FILE))
    assert "lm_head.weight" not in stored and "decoder.wte.weight" not in stored  # tied, shared
    assert ckpt.model.decoder.wte.weight is ckpt.model.encoder.wte.weight
    save_checkpoint(tmp_path / "again", ckpt.model, tok)
    again = load_checkpoint(tmp_path / "again")
    assert again.config == cfg and again.tokenizer.pad_id == tok.pad_id
    x = torch.randint(0, cfg.vocab_size, (2, 9))
    d = torch.randint(0, cfg.vocab_size, (2, 5))
    assert torch.equal(ckpt.model(x, None, d), again.model(x, None, d))


def test_reported_scores_are_sacrebleus_on_the_same_outputs(s2s_ckpt, pairs_tsv):
    ckpt = load_checkpoint(s2s_ckpt)
    t = TrainConfig(**TRAIN)
    task = Seq2SeqTask(ckpt.tokenizer, S.load_pairs(pairs_tsv), ckpt.config, t)
    picks = task.eval_indices(t.eval_batches * t.batch_size)
    hyps = task.generate(ckpt.model, picks, t.batch_size, "cpu")
    refs = [task.references[i] for i in picks]
    meta = json.loads((s2s_ckpt / "config.json").read_text())["metrics"]
    assert meta["val_chrf"] == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert meta["val_bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score
    perfect = text_metrics(refs, refs)
    assert perfect == pytest.approx({"chrf": 100.0, "bleu": 100.0})


def test_resume_continues_the_same_run(pairs_tsv, tmp_path):
    m = ModelConfig(**{**MODEL, "dropout": 0.1})  # the torch RNG state must come back too
    t = TrainConfig(**TRAIN)
    train(m, t, tmp_path / "straight", data=str(pairs_tsv), **QUIET)
    train(m, t, tmp_path / "split", data=str(pairs_tsv), stop_after=4, **QUIET)
    # the saved settings win on resume: a different max_target_tokens passed is not used
    train(m, dataclasses.replace(t, max_target_tokens=3), tmp_path / "split", resume=True,
          **QUIET)
    a, b = (load_file(str(tmp_path / d / MODEL_FILE)) for d in ("straight", "split"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"


def test_a_small_causal_preset_trains_as_seq2seq(pairs_tsv, tmp_path):
    m, t = preset("test", task="seq2seq", max_steps=4, eval_interval=4)
    out = train(m, t, tmp_path / "ck", data=str(pairs_tsv), **QUIET)
    ckpt = load_checkpoint(out)
    assert ckpt.config.task == "seq2seq" and ckpt.config.decoder_layers == 2
    assert "val_chrf" in ckpt.meta["metrics"]


def test_cli_end_to_end(pairs_tsv, tmp_path):
    out = tmp_path / "ck"
    proc = run_tinyt("train", "--task", "seq2seq", "--preset", "seq2seq-test", "--data",
                     pairs_tsv, "--max-steps", "10", "--out", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "train pairs" in proc.stderr and "val_chrf" in proc.stderr
    meta = json.loads((out / "config.json").read_text())
    assert meta["model"]["task"] == "seq2seq" and meta["metrics"]["step"] == 10
    proc = run_tinyt("sample", out, "--prompt", "def get_alpha_beta(self, n=1):",
                     "--max-new-tokens", "8")
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-2000:]
    proc = run_tinyt("sample", out, "--temperature", "0.5")
    assert proc.returncode != 0 and "seq2seq checkpoint: it answers greedily" in proc.stderr


@pytest.mark.slow
def test_two_process_ddp_steps_with_the_single_process_gradients(pairs_tsv, tmp_path):
    """As tests/core/test_ddp.py for the LM: uneven target lengths across the ranks' halves
    still give the single-process gradient (the loss is a mean over the global batch's
    tokens, not over each rank's)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    common = ["train", "--preset", "seq2seq-test", "--data", str(pairs_tsv), "--max-steps",
              "4", "--eval-interval", "2", "--batch-size", "8"]
    for name, launch in (("single", []), ("ddp", ["-m", "torch.distributed.run",
                                                  "--standalone", "--nproc_per_node", "2"])):
        proc = subprocess.run([sys.executable, *launch, WORKER, tmp_path / f"{name}.grads",
                               *common, "--out", tmp_path / name],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (load_file(str(tmp_path / f"{d}.grads")) for d in ("single", "ddp"))
    assert a.keys() == b.keys() and len(a) > 0
    for k in a:
        scale = float(a[k].abs().max())
        worst = float((a[k] - b[k]).abs().max())
        assert worst <= GRAD_RTOL * scale, f"{k}: single vs DDP gradient {worst:.3g} > " \
                                           f"{GRAD_RTOL} x {scale:.3g}"
    ma, mb = (json.loads((tmp_path / d / "config.json").read_text())["metrics"]
              for d in ("single", "ddp"))
    assert ma["step"] == mb["step"] == 4
    assert abs(ma["val_loss"] - mb["val_loss"]) <= LOSS_ATOL, (ma["val_loss"], mb["val_loss"])
