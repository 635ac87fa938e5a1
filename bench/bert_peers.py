#!/usr/bin/env python3
"""BERT CPU training exported from PyTorch, onnxtrain vs torch, fp32 and bf16 side by side.

A transformers.BertForSequenceClassification built from a BertConfig with random weights
(nothing is downloaded; defaults: vocab 8000, hidden 256, 4 layers, 4 heads, intermediate 1024,
max_position_embeddings = the sequence length, no dropout, 3 labels), exported once per run of
the bench with tools/export_torch.py (dynamo exporter), and trained on the same random token
data (an .npz of input_ids, attention_mask all ones, labels in [0, 3)) by:
  onnxtrain-fp32 / onnxtrain-bf16  onnxtrain MODEL --data npz:FILE --precision fp32 | bf16, one
                                   epoch of warmup + steps batches, Adam lr 1e-4
  torch / torch-bf16               the same module (same seed, same initial weights) in torch
                                   eager float32 | with torch.autocast("cpu", dtype=bfloat16)
                                   around forward + loss (backward and Adam outside), Adam lr
                                   1e-4, cross_entropy on the logits
Each timed run is its own child process (its thread pools and max RSS are its own); the runs'
order rotates every round and the tables give the median over rounds. Throughput is in
samples/s (sequences per second). Run through bench/bert_peers.sh, which builds or reuses the
model corpus venv (tests/models/setup_venv.sh) first.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_common import (REPO, add_bf16_run_options, BenchError, child_result,  # noqa: E402
                          cpu_flags, describe_rc, emit, fmt, header, parse_result, print_table,
                          resolve_tool, rotated, run_child, run_main, step_result, summarize_runs,
                          tail, time_steps, uptime, versions)

PEERS = ["onnxtrain-fp32", "onnxtrain-bf16", "torch", "torch-bf16"]
PEER_LABEL = {"onnxtrain-fp32": "onnxtrain --precision fp32",
              "onnxtrain-bf16": "onnxtrain --precision bf16",
              "torch": "torch eager fp32",
              "torch-bf16": "torch eager autocast bf16"}
# (numerator, denominator, label): samples/s of one over the other's, > 1: the numerator is faster.
RATIOS = [("onnxtrain-fp32", "torch", "onnxtrain fp32 / torch fp32"),
          ("onnxtrain-bf16", "torch-bf16", "onnxtrain bf16 / torch autocast bf16"),
          ("onnxtrain-bf16", "onnxtrain-fp32", "onnxtrain bf16 / onnxtrain fp32"),
          ("torch-bf16", "torch", "torch autocast bf16 / torch fp32")]
LR = 1e-4
LABELS = 3
SEED = 0
BF16_FLAGS = ["avx512_bf16", "amx_bf16", "amx_tile"]


# ----------------------------------------------------------------------------------------------
# Children (the venv's python): the export, and one timed torch run each.

def build_model(a):
    """The BERT every peer trains: the same config and, through the seed, the same weights."""
    import torch
    import transformers
    cfg = transformers.BertConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, intermediate_size=a.intermediate,
        max_position_embeddings=a.seq, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=LABELS, return_dict=False)
    torch.manual_seed(SEED)
    model = transformers.BertForSequenceClassification(cfg).float()
    model.train()
    return model


def worker_export(a):
    """Writes bert.onnx and data.npz into a.export_to; prints a RESULT with what it made."""
    import numpy as np
    import torch
    sys.path.insert(0, str(REPO / "tools"))
    from export_torch import export_for_training
    out = Path(a.export_to)
    model = build_model(a)
    n = a.batch * (a.warmup + a.steps)
    rng = np.random.default_rng(SEED)
    np.savez(out / "data.npz",
             input_ids=rng.integers(0, a.vocab, (n, a.seq), dtype=np.int64),
             attention_mask=np.ones((n, a.seq), np.int64),
             labels=rng.integers(0, LABELS, n, dtype=np.int64))
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))
    mask = torch.ones(a.batch, a.seq, dtype=torch.int64)
    t0 = time.perf_counter()
    info = export_for_training(model, (), str(out / "bert.onnx"), exporter="dynamo",
                               kwargs={"input_ids": ids, "attention_mask": mask},
                               input_names=["input_ids", "attention_mask"],
                               output_names=["logits"])
    emit({"export_s": time.perf_counter() - t0,
          "params": sum(p.numel() for p in model.parameters()),
          "attn": str(model.config._attn_implementation),
          "kept": info.get("kept_by_name"), "tensors": info.get("parameters"),
          "lost": len(info.get("lost", []))})
    return 0


def worker_torch(a, mode):
    import numpy as np
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    model = build_model(a)
    data = np.load(a.data)
    ids = torch.from_numpy(data["input_ids"])
    mask = torch.from_numpy(data["attention_mask"])
    labels = torch.from_numpy(data["labels"])
    if ids.shape[0] < a.batch * (a.warmup + a.steps):
        raise SystemExit(f"{a.data}: {ids.shape[0]} rows, fewer than batch x steps")
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    bf16 = mode == "torch-bf16"
    losses = []

    def step():
        i = len(losses) * a.batch
        x, m, y = ids[i:i + a.batch], mask[i:i + a.batch], labels[i:i + a.batch]
        opt.zero_grad(set_to_none=True)
        # autocast on forward and loss only; cross_entropy runs in float32 inside it (CPU
        # autocast's fp32 list), the weights and Adam's state stay float32.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=x, attention_mask=m)[0]
            loss = F.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())

    times = time_steps(step, a.warmup, a.steps)
    emit(step_result(times, a.warmup, a.batch, loss=sum(losses) / len(losses),
                     attn=str(model.config._attn_implementation)))
    return 0


# ----------------------------------------------------------------------------------------------
# The parent.

def model_args(a):
    return ["--vocab", a.vocab, "--hidden", a.hidden, "--layers", a.layers, "--heads", a.heads,
            "--intermediate", a.intermediate, "--seq", a.seq, "--batch", a.batch,
            "--steps", a.steps, "--warmup", a.warmup]


def one_run(a, peer, work):
    """(RESULT dict or None, error text or None, max RSS MiB) of one child."""
    model, data = work / "bert.onnx", work / "data.npz"
    if peer.startswith("onnxtrain"):
        metrics = work / "metrics.json"
        metrics.unlink(missing_ok=True)
        precision = peer.split("-", 1)[1]
        cmd = [a.onnxtrain, model, "--data", f"npz:{data}", "--val-data", "none",
               "--epochs", "1", "--batch-size", a.batch, "--replicas", "1",
               "--threads", a.threads, "--optimizer", "adam", "--lr", LR,
               "--precision", precision, "--metrics-json", metrics]
        if precision == "bf16" and a.allow_emulation:
            cmd.append("--allow-emulation")
    else:
        cmd = [sys.executable, __file__, "--worker", peer, "--data", data,
               "--threads", a.threads] + model_args(a)
    rc, so, se, rss, _ = run_child(cmd, timeout=a.timeout)
    ours = peer.startswith("onnxtrain")
    res, err, rss = child_result(rc, so, se, rss, metrics if ours else None, a.batch)
    if res is not None and ours:  # the last epoch's loss too (read once more: it parsed)
        last = [l for l in metrics.read_text().splitlines() if l.strip()][-1]
        res["loss"] = json.loads(last).get("loss")
    return res, err, rss


def positive(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text} is not >= 1")
    return v


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=positive, default=256, help="hidden size (default 256)")
    ap.add_argument("--layers", type=positive, default=4, help="encoder layers (default 4)")
    ap.add_argument("--heads", type=positive, default=4, help="attention heads (default 4)")
    ap.add_argument("--intermediate", type=positive, default=1024,
                    help="feed-forward size (default 1024)")
    ap.add_argument("--vocab", type=positive, default=8000, help="vocabulary (default 8000)")
    ap.add_argument("--seq", type=positive, default=128, help="sequence length (default 128)")
    ap.add_argument("--batch", type=positive, default=16, help="sequences per step (default 16)")
    ap.add_argument("--threads", type=positive, default=2, help="intra-op threads (default 2)")
    ap.add_argument("--rounds", type=positive, default=3, help="rounds (default 3)")
    ap.add_argument("--steps", type=positive, default=5, help="timed steps per run (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per run (default 1)")
    add_bf16_run_options(ap, PEERS, "onnxtrain")
    ap.add_argument("--keep", metavar="DIR", help="keep the model, data and metrics in DIR")
    # child modes
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--export-to", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.hidden % a.heads:
        raise BenchError(f"--hidden {a.hidden} is not a multiple of --heads {a.heads}")
    if a.warmup < 0:
        raise BenchError("--warmup must be >= 0")
    if a.export_to:
        return worker_export(a)
    if a.worker:
        if a.worker not in PEERS or a.worker.startswith("onnxtrain"):
            raise SystemExit(f"unknown worker {a.worker}")
        return worker_torch(a, a.worker)

    peers = [p.strip() for p in a.peers.split(",") if p.strip()]
    bad = [p for p in peers if p not in PEERS]
    if bad or not peers:
        raise BenchError(f"--peers: unknown {','.join(bad) or '(none given)'}; choose from "
                         f"{','.join(PEERS)}")
    a.onnxtrain = resolve_tool(a.bin, "onnxtrain")

    header("BERT CPU training exported from PyTorch: onnxtrain vs torch, fp32 and bf16", sys.argv)
    flags = cpu_flags(BF16_FLAGS)
    print(f"bf16 instructions: {', '.join(flags) if flags else 'none (bf16 is emulated: slow)'}")
    print(f"peer versions: {versions(['torch', 'transformers', 'onnxscript', 'onnx', 'numpy'])}")
    print(f"BertForSequenceClassification: vocab {a.vocab}, hidden {a.hidden}, {a.layers} "
          f"layer(s), {a.heads} heads, intermediate {a.intermediate}, max positions {a.seq}, "
          f"dropout 0, {LABELS} labels, random init (seed {SEED})")
    print(f"sequence {a.seq}, batch {a.batch}, {a.threads} thread(s); Adam lr {LR:g}, "
          f"cross-entropy, random tokens; {a.warmup} warm-up + {a.steps} timed steps per run, "
          f"{a.rounds} round(s), run order rotated each round")
    print("torch bf16 = torch.autocast('cpu', dtype=torch.bfloat16) around forward + loss; "
          "onnxtrain bf16 = --precision bf16; both keep float32 master weights and Adam state")
    sys.stdout.flush()

    work = Path(a.keep).resolve() if a.keep else Path(tempfile.mkdtemp(prefix="bert_peers_"))
    work.mkdir(parents=True, exist_ok=True)
    onnxtrain_failed = False
    try:
        rc, so, se, _, _ = run_child([sys.executable, __file__, "--export-to", work,
                                      "--threads", a.threads] + model_args(a),
                                     timeout=a.timeout)
        exp = parse_result(so) if rc == 0 else None
        if exp is None:
            raise BenchError(f"the export failed ({describe_rc(rc)}): "
                             f"{tail(se or so, 1)}")
        size = (work / "bert.onnx").stat().st_size / 2**20
        print(f"export: {exp['params'] / 1e6:.2f} M parameters, dynamo exporter, {size:.1f} MiB, "
              f"{exp['export_s']:.1f} s; {exp['kept']}/{exp['tensors']} parameters keep torch's "
              f"names, {exp['lost']} not found; attention at export: {exp['attn']}", flush=True)

        got = {p: [] for p in peers}
        errors = {}
        attn = set()
        for r in range(a.rounds):
            for p in rotated(peers, r):
                if p in errors and not p.startswith("onnxtrain"):
                    continue  # a torch peer that failed once is not retried
                res, err, rss = one_run(a, p, work)
                if err:
                    errors[p] = err
                    print(f"  round {r + 1} {p:<14} FAILED {err}", flush=True)
                    if p.startswith("onnxtrain"):
                        onnxtrain_failed = True
                    continue
                res["rss"] = rss
                if res.get("attn"):
                    attn.add(res["attn"])
                got[p].append(res)
                print(f"  round {r + 1} {p:<14} {res['median_ms']:9.1f} ms/step "
                      f"{res['img_s']:8.2f} samples/s  first {fmt(res.get('first_ms'))} ms  "
                      f"loss {fmt(res.get('loss'), '.4f')}  RSS {rss:.0f} MiB", flush=True)
        if attn:
            print(f"torch attention implementation (model.config._attn_implementation): "
                  f"{', '.join(sorted(attn))}")

        stats = {p: s for p in peers if (s := summarize_runs(got[p], a.batch))}
        rows = []
        for p in peers:
            if p in stats:
                ms, sps, first, rss, steady = stats[p]
                mark = "" if steady else " *"
                loss = [x["loss"] for x in got[p] if x.get("loss") is not None]
                rows.append([PEER_LABEL[p], f"{ms:.1f}{mark}", f"{sps:.2f}{mark}",
                             f"{first / ms:.2f}" if first else "-", f"{rss:.0f}",
                             f"{loss[-1]:.4f}" if loss else "-"])
            else:
                rows.append([PEER_LABEL[p], "failed", "", "", "", ""])
        print(f"\n-- BERT h{a.hidden} L{a.layers} A{a.heads} I{a.intermediate}, seq {a.seq}, "
              f"batch {a.batch}, {a.threads} thread(s): median of {a.rounds} round(s), "
              f"{a.steps} timed steps")
        print_table(["run", "median ms/step", "samples/s", "first step / steady", "max RSS MiB",
                     "mean loss"], rows)
        if any(not stats[p][4] for p in stats):
            print("* onnxtrain's metrics JSON has no steady_images_per_sec: its figure is "
                  "samples/s over the whole epoch, first step included")
        ratios = [(name, stats[n][1] / stats[d][1], stats[n][3] / stats[d][3])
                  for n, d, name in RATIOS if n in stats and d in stats]
        if ratios:
            print()
            print_table(["ratio", "samples/s", "max RSS"],
                        [[name, f"{v:.2f}x", f"{m:.2f}x"] for name, v, m in ratios])
        print("\nratio = samples/s of the first over the second (> 1: the first is faster); "
              "max RSS ratio likewise (< 1: the first takes less memory); first step / steady "
              "= the first step's time over the median timed step; onnxtrain's steady figure "
              "leaves out only the first step (warm-up steps after it count); mean loss = the "
              "mean training loss over the run's steps (last round), a sanity check: same "
              "weights and data, but onnxtrain shuffles the batches")
        print(f"uptime after: {uptime()}")
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    if onnxtrain_failed:
        failed = ", ".join(p for p in errors if p.startswith("onnxtrain"))
        print(f"bert_peers: error: onnxtrain failed ({failed}; see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_main(main, "bert_peers")
