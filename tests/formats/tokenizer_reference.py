"""Reference tokenization for tests/formats/test_gguf_tokenizer.cpp, from the `tokenizers` PyPI
package, built from the SAME vocabulary and merges as the C++ tokenizer: read from the GGUF file
with the `gguf` package.

Usage: tokenizer_reference.py MODEL.gguf CORPUS.json
CORPUS.json is a JSON list of strings. Prints JSON: {"ids": [[...], ...], "decoded": [...],
"pieces": [[...], ...]} with, per string, the token ids, the decoding of those ids, and the
pre-tokenizer's pieces (byte-level characters mapped back to text).

The tokenizer is what SmolLM2 uses (tokenizer.ggml.pre = "smollm"): a BPE model with no unknown
token, pre-tokenizers Digits(individual_digits=True) then ByteLevel(add_prefix_space=False,
use_regex=True), the ByteLevel decoder, and the control tokens (token type 3) as special tokens.
"""
import json
import sys

try:
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
except ImportError:
    sys.exit(77)  # the test skips: one interpreter start, no separate check


def strings(field):
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def main(model, corpus_path):
    r = GGUFReader(model)
    f = r.fields
    tokens = strings(f["tokenizer.ggml.tokens"])
    merges = strings(f["tokenizer.ggml.merges"])
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    assert bytes(f["tokenizer.ggml.pre"].parts[f["tokenizer.ggml.pre"].data[0]]).decode() == "smollm"
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == 3])
    with open(corpus_path, encoding="utf-8") as fh:
        corpus = json.load(fh)
    byte_decoder = decoders.ByteLevel()
    out = {"ids": [], "decoded": [], "pieces": []}
    for text in corpus:
        ids = tok.encode(text, add_special_tokens=False).ids
        out["ids"].append(ids)
        out["decoded"].append(tok.decode(ids, skip_special_tokens=False))
        pieces = tok.pre_tokenizer.pre_tokenize_str(text)
        out["pieces"].append([byte_decoder.decode([p]) for p, _ in pieces])
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
