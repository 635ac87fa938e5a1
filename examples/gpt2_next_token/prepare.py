#!/usr/bin/env python3
"""Exports a randomly initialised GPT2LMHeadModel (a tiny config: nothing is downloaded) for
training and writes a tokenized toy language-modelling task as train.npz / val.npz:
input_ids, attention_mask (int64 [N, T]) and per-token labels (int64 [N, T]).

The task: each sequence counts up from a random start by a random step (1, 2 or 3) modulo the
vocabulary, e.g. 17 19 21 23 ...; sequences have random lengths and are right-padded. As for any
causal LM, the label of position t is the token at t + 1 (the model sees tokens 0..t), and the
last real token and the padding get -100, torch's ignore_index: out of the loss and the
accuracy. From the third token on, the next one is determined by the two before it, so the loss
can fall from ln(VOCAB) = 4.2 towards the entropy of the first two predictions.

    python3 prepare.py OUT_DIR [--exporter dynamo|classic]
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from export_torch import export_for_training  # noqa: E402

VOCAB, T, PAD = 64, 16, 0


def toy_task(n, rng):
    ids = np.full((n, T), PAD, np.int64)
    mask = np.zeros((n, T), np.int64)
    labels = np.full((n, T), -100, np.int64)
    for i in range(n):
        length = rng.integers(6, T + 1)
        start, step = rng.integers(1, VOCAB), rng.integers(1, 4)
        seq = 1 + (start - 1 + step * np.arange(length)) % (VOCAB - 1)  # ids 1..VOCAB-1
        ids[i, :length] = seq
        mask[i, :length] = 1
        labels[i, :length - 1] = seq[1:]  # next token; the last real one has none
    return ids, mask, labels


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--exporter", default="dynamo", choices=["dynamo", "classic"])
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=T, n_embd=64, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                     bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(cfg)
    rng = np.random.default_rng(0)
    for name, n in (("train", 4096), ("val", 512)):
        ids, mask, labels = toy_task(n, rng)
        np.savez(os.path.join(a.out, f"{name}.npz"), input_ids=ids, attention_mask=mask,
                 labels=labels)
    ids, mask, _ = toy_task(4, rng)
    # The attention mask is an input: padded batches need it, and without it transformers
    # traces a packed-sequence check (torch.diff) that the classic exporter cannot export.
    export_for_training(model, (), os.path.join(a.out, "gpt2.onnx"), exporter=a.exporter,
                        kwargs={"input_ids": torch.from_numpy(ids),
                                "attention_mask": torch.from_numpy(mask)},
                        output_names=["logits"])


if __name__ == "__main__":
    main()
