"""The suite's tiny trained model with a short chat template, as a shared-cache artifact: what
the live-server tests serve (tests/server/test_server.py, test_server_logprobs.py)."""
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")  # short: the tiny model reads 31


def chat_gqa(tiny_ckpt, root):
    """ROOT/tiny-gqa: the tiny checkpoint with TEMPLATE, exported, optimized and made a
    shared-cache graph."""
    from tinyt.checkpoint import load_checkpoint, save_checkpoint
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.tokenizer import Tokenizer

    ck = load_checkpoint(tiny_ckpt)
    chat_ck = save_checkpoint(root / "ck", ck.model,
                              Tokenizer(ck.tokenizer.hf, chat_template=TEMPLATE))
    opt = optimize(export_onnx(chat_ck, root / "onnx"), root / "opt")
    return optimize(opt, root / "tiny-gqa", target="gqa")
