"""One file a Hugging Face family: its config.json keys and refusals, its tensors' names
(tinyt/hf/tensors.py's roles), what export-hf writes, its tokenizer kind, and the ModelConfig
traits it turns on (`features`), which the model and the graph stages read.

    gpt2.py        GPT2LMHeadModel
    llama.py       Llama, Qwen2, Qwen3, Mistral, SmolLM3, Granite (the Llama layout)
    gemma.py       Gemma 3 (text), Gemma 2
    phi3.py        Phi-3 / 3.5 / Phi-4-mini
    olmo2.py       OLMo-2
    bert.py        BERT, RoBERTa, XLM-RoBERTa, DistilBERT
    modernbert.py  ModernBERT
    bart.py        BART, mBART (encoder-decoders)
    marian.py      Marian (Opus-MT)
    m2m100.py      M2M100, NLLB
    t5.py          T5 v1.0, v1.1 / Flan-T5
    whisper.py     Whisper (speech: an audio encoder-decoder)

tinyt.hf.catalogue assembles them, in the order export-hf tries them.
"""
