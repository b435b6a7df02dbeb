#!/usr/bin/env python3
"""Write a tiny llama model with random weights as GGUF, for llama-server on a CPU.

``tiny_gguf.py VOCAB.gguf OUT.gguf [--dim 64] [--layers 2]``: the tokenizer is copied from a
vocab-only GGUF (llama.cpp's ``models/ggml-vocab-llama-spm.gguf``); the weights are random
(seeded), so it answers garbage, deterministically at temperature 0. Needs ``gguf`` and numpy
(``pip install gguf``).
"""

from __future__ import annotations

import argparse
import sys

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _value(field: object) -> object:
    parts = field.parts  # type: ignore[attr-defined]
    return [bytes(parts[i]).decode("utf-8", "replace") if field.types[-1].name == "STRING"  # type: ignore[attr-defined]
            else parts[i].tolist()[0] for i in field.data]  # type: ignore[attr-defined]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vocab")
    parser.add_argument("out")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=2048)
    args = parser.parse_args()
    try:
        import gguf
        import numpy as np
    except ImportError:
        print("tiny_gguf: needs the gguf package: pip install gguf", file=sys.stderr)
        return 2
    vocab = gguf.GGUFReader(args.vocab)
    tokens = _value(vocab.fields["tokenizer.ggml.tokens"])
    scores = _value(vocab.fields["tokenizer.ggml.scores"])
    types = _value(vocab.fields["tokenizer.ggml.token_type"])
    n_vocab, dim, heads, ff = len(tokens), args.dim, 4, args.dim * 4

    def one(key: str) -> object:
        return _value(vocab.fields[key])[0]

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name("tiny-random-llama")
    w.add_block_count(args.layers)
    w.add_context_length(args.ctx)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(dim // heads)
    w.add_file_type(0)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model(str(one("tokenizer.ggml.model")))
    w.add_tokenizer_pre(str(one("tokenizer.ggml.pre")))
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(int(one("tokenizer.ggml.bos_token_id")))  # type: ignore[arg-type]
    w.add_eos_token_id(int(one("tokenizer.ggml.eos_token_id")))  # type: ignore[arg-type]
    w.add_chat_template(CHATML)
    rng = np.random.default_rng(0)

    def rand(*shape: int) -> object:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(n_vocab, dim))
    w.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    w.add_tensor("output.weight", rand(n_vocab, dim))
    for i in range(args.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(dim, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + name + ".weight", rand(dim, dim))
        w.add_tensor(p + "ffn_norm.weight", np.ones(dim, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rand(ff, dim))
        w.add_tensor(p + "ffn_up.weight", rand(ff, dim))
        w.add_tensor(p + "ffn_down.weight", rand(dim, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
