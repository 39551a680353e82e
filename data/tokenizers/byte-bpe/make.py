#!/usr/bin/env python3
"""Writes tokenizer.json: a byte-level BPE tokenizer of our own for tests (no model's
vocabulary, no download). Every byte is a token (ids 3..258, in the GPT-2 byte-to-unicode
alphabet that byte-level BPE uses), plus merges of the most frequent adjacent pairs in the
English words below, so a token is about 2-3 characters as with a real vocabulary. Special
tokens: <s> (0), </s> (1), <pad> (2). Run: python3 make.py > tokenizer.json"""
import json
from collections import Counter

def byte_alphabet():
    # Printable bytes map to themselves; the others to code points from 256 up.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars

WORDS = """the of and to in is that for it as was with be by on not he this are or his from at
which but have an they you were their one all we can her has there been if more when will
would who so no document section tenant premises repair lease agreement shall party notice
question answer system user assistant please summarize explain following context policy
""".split()

def main():
    alphabet = byte_alphabet()
    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2}
    for b in range(256):
        vocab[alphabet[b]] = 3 + b
    # Words as byte-level symbols, each with and without the leading space marker.
    corpus = []
    for w in WORDS:
        corpus.append([alphabet[b] for b in w.encode()])
        corpus.append([alphabet[b] for b in (" " + w).encode()])
    merges = []
    for _ in range(200):
        pairs = Counter()
        for word in corpus:
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += 1
        if not pairs:
            break
        (a, b), _count = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merged = a + b
        if merged in vocab:
            break
        vocab[merged] = len(vocab)
        merges.append(f"{a} {b}")
        for i, word in enumerate(corpus):
            out, j = [], 0
            while j < len(word):
                if j + 1 < len(word) and word[j] == a and word[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(word[j])
                    j += 1
            corpus[i] = out
    special = lambda i, c: {"id": i, "content": c, "single_word": False, "lstrip": False,
                            "rstrip": False, "normalized": False, "special": True}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [special(0, "<s>"), special(1, "</s>"), special(2, "<pad>")],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    print(json.dumps(tok, ensure_ascii=False, indent=1))

main()
