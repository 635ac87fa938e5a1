#!/usr/bin/env python3
"""Recurrent training exported from PyTorch, onnxtrain vs torch eager, side by side.

A token classifier Embedding(vocab, embed) -> LSTM | GRU | RNN (hidden, batch_first) -> Linear on
the last step, random weights (same seed for both), exported once with tools/export_torch.py
(dynamo exporter), trained on the same random token data with Adam (lr 1e-3, cross-entropy):
  onnxtrain  onnxtrain MODEL --data npy:X,Y --replicas 1 --threads T, one epoch of
             warmup + steps batches; the metrics JSON's steady_step_seconds
  torch      the module in torch eager, the median step over `steps` after `warmup`
Each round runs both, the torch run in its own process; the table gives the median over rounds
and onnxtrain / torch as a speed ratio (> 1: onnxtrain is faster). Run through
bench/rnn_peers.sh, which builds or reuses the model corpus venv first.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def build(cell, vocab, embed, hidden, classes):
    import torch
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, embed)
            self.rnn = getattr(nn, cell.upper())(embed, hidden, batch_first=True)
            self.out = nn.Linear(hidden, classes)

        def forward(self, ids):
            h, _ = self.rnn(self.embed(ids))
            return self.out(h[:, -1])

    torch.manual_seed(0)
    return Model().train()


def torch_run(a, x_path, y_path):
    """Median torch eager step time in seconds (runs in a child process)."""
    import time
    import numpy as np
    import torch
    torch.set_num_threads(a.threads)
    m = build(a.cell, a.vocab, a.embed, a.hidden, a.classes)
    x, y = np.load(x_path), np.load(y_path)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    times = []
    for i in range(a.warmup + a.steps):
        xb = torch.from_numpy(x[i * a.batch:(i + 1) * a.batch])
        yb = torch.from_numpy(y[i * a.batch:(i + 1) * a.batch])
        t = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(xb), yb).backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times[a.warmup:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default="lstm,gru", help="comma list of lstm, gru, rnn (default lstm,gru)")
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--embed", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--classes", type=int, default=5)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run (default 10)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--onnxtrain", default=str(REPO / "build" / "tools" / "onnxtrain"))
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--cell", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps({"step_seconds": torch_run(a, *a.worker)}))
        return 0
    cells = [c.strip() for c in a.cells.split(",") if c.strip()]
    bad = [c for c in cells if c not in ("lstm", "gru", "rnn")]
    if bad or not cells:
        print(f"rnn_peers: error: --cells: unknown {bad or cells}; choose from lstm, gru, rnn", file=sys.stderr)
        return 2
    if not os.access(a.onnxtrain, os.X_OK):
        print(f"rnn_peers: error: {a.onnxtrain} is not an executable onnxtrain (build first)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO / "tools"))
    import numpy as np
    import torch
    from export_torch import export_for_training
    print(f"rnn_peers: torch {torch.__version__}; embed {a.embed}, hidden {a.hidden}, seq {a.seq}, "
          f"batch {a.batch}, {a.threads} threads, {a.steps} timed steps, {a.rounds} rounds")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rnn_peers_") as tmp:
        n = a.batch * (a.warmup + a.steps)
        rng = np.random.default_rng(0)
        x_path, y_path = os.path.join(tmp, "x.npy"), os.path.join(tmp, "y.npy")
        np.save(x_path, rng.integers(0, a.vocab, (n, a.seq)).astype(np.int64))
        np.save(y_path, rng.integers(0, a.classes, n).astype(np.int64))
        for cell in cells:
            model = os.path.join(tmp, f"{cell}.onnx")
            export_for_training(build(cell, a.vocab, a.embed, a.hidden, a.classes),
                                (torch.zeros(a.batch, a.seq, dtype=torch.int64),), model)
            ours, theirs = [], []
            for _ in range(a.rounds):
                metrics = os.path.join(tmp, f"{cell}.jsonl")
                cmd = [a.onnxtrain, model, "--data", f"npy:{x_path},{y_path}", "--val-data", "none",
                       "--epochs", "1", "--batch-size", str(a.batch), "--replicas", "1",
                       "--threads", str(a.threads), "--optimizer", "adam", "--lr", "1e-3",
                       "--metrics-json", metrics]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"rnn_peers: error: onnxtrain exited {r.returncode}: {r.stderr.strip()[-300:]}", file=sys.stderr)
                    return 1
                ours.append(json.loads(open(metrics).read().strip().splitlines()[-1])["steady_step_seconds"])
                w = subprocess.run([sys.executable, __file__, "--worker", x_path, y_path, "--cell", cell,
                                    *sum(([f"--{k}", str(getattr(a, k))] for k in
                                          ("vocab", "embed", "hidden", "classes", "batch", "threads", "steps", "warmup")), [])],
                                   capture_output=True, text=True)
                if w.returncode != 0:
                    print(f"rnn_peers: error: the torch run failed: {w.stderr.strip()[-300:]}", file=sys.stderr)
                    return 1
                theirs.append(json.loads(w.stdout.strip().splitlines()[-1])["step_seconds"])
            o, t = statistics.median(ours), statistics.median(theirs)
            rows.append((cell, o * 1e3, t * 1e3, t / o))
    print("\n| cell | onnxtrain ms/step | torch eager ms/step | onnxtrain / torch (speed) |")
    print("|---|---|---|---|")
    for cell, o, t, ratio in rows:
        print(f"| {cell} | {o:.1f} | {t:.1f} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
