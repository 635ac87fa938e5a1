#!/usr/bin/env python3
"""Exports a randomly initialised BertForSequenceClassification (a tiny config: nothing is
downloaded) for training and writes a tokenized toy task as train.npz / val.npz:
input_ids, attention_mask (int64 [N, T]) and labels (int64 [N]).

The task: each sentence is a padded run of word ids; its label is 1 when the word "42" occurs
in the unpadded part. Tokenization is a plain word -> id table (a real run uses the model's
tokenizer and the same three arrays).

    python3 prepare.py OUT_DIR [--exporter dynamo|classic]
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from export_torch import export_for_training  # noqa: E402

VOCAB, T = 64, 16


def toy_task(n, rng):
    ids = np.zeros((n, T), np.int64)
    mask = np.zeros((n, T), np.int64)
    labels = np.zeros(n, np.int64)
    for i in range(n):
        length = rng.integers(4, T + 1)
        words = rng.integers(2, VOCAB, length)
        if rng.random() < 0.5:
            words[rng.integers(0, length)] = 42
        ids[i, :length] = words  # 0 is the padding id
        mask[i, :length] = 1
        labels[i] = int((words == 42).any())
    return ids, mask, labels


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--exporter", default="dynamo", choices=["dynamo", "classic"])
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=T, num_labels=2,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, return_dict=False)
    model = BertForSequenceClassification(cfg)
    rng = np.random.default_rng(0)
    for name, n in (("train", 2048), ("val", 256)):
        ids, mask, labels = toy_task(n, rng)
        np.savez(os.path.join(a.out, f"{name}.npz"), input_ids=ids, attention_mask=mask,
                 labels=labels)
    ids, mask, _ = toy_task(4, rng)
    export_for_training(model, (), os.path.join(a.out, "bert.onnx"), exporter=a.exporter,
                        kwargs={"input_ids": torch.from_numpy(ids),
                                "attention_mask": torch.from_numpy(mask)},
                        output_names=["logits"])


if __name__ == "__main__":
    main()
