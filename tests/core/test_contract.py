from tinyt import contract as C
from tinyt.config import ModelConfig


def test_decoder_contract_names_and_axes():
    cfg = ModelConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=300)
    ins = C.decoder_inputs(cfg)
    assert [t.name for t in ins] == [
        "input_ids", "attention_mask", "position_ids",
        "past_key_values.0.key", "past_key_values.0.value",
        "past_key_values.1.key", "past_key_values.1.value",
    ]
    assert ins[1].shape == (C.BATCH, C.TOTAL)
    assert ins[3].shape == (C.BATCH, 4, C.PAST, 16) and ins[3].dtype == "float32"
    outs = C.decoder_outputs(cfg)
    assert outs[0].shape == (C.BATCH, C.SEQ, 300)
    assert [t.name for t in outs[1:3]] == ["present.0.key", "present.0.value"]
    assert outs[1].shape == (C.BATCH, 4, C.TOTAL, 16)


def test_no_cache_and_classifier_contracts():
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, task="classifier", num_labels=5)
    assert [t.name for t in C.decoder_inputs(cfg, with_past=False)] == ["input_ids",
                                                                         "attention_mask"]
    assert C.classifier_outputs(cfg)[0].shape == (C.BATCH, 5)
    assert C.decoder_inputs(cfg, kv_dtype="float16")[3].dtype == "float16"
