#!/usr/bin/env python3
"""ResNet-50 CPU training in bf16 mixed precision, onnxtrain vs torch autocast (issue #19).

Per config, float32 and bfloat16 of each side: onnxtrain --precision fp32 | bf16 (Conv, Gemm,
MatMul and their gradients in bfloat16, float32 master weights) and torch eager float32 | with
torch.autocast("cpu", dtype=torch.bfloat16) around forward and loss (backward and Adam outside,
as autocast is meant to be used), optionally both in channels_last. Same training as
bench/train_peers.py: Adam lr 1e-3, cross-entropy over 1000 classes, random data, one replica,
the given intra-op threads. Each run is its own child process (its thread pools and max RSS are
its own); the runs' order rotates every round and the tables give the median over rounds.
Run through bench/amp_peers.sh, which builds or reuses the venv (bench/setup_peers.sh) first.
"""
import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_common import (REPO, add_bf16_run_options, BenchError, child_result,  # noqa: E402
                          cpu_flags, emit, fmt, header, print_table, resolve_tool, rotated,
                          run_child, run_main, step_result, summarize_runs, tail, time_steps,
                          uptime, versions)
from train_peers import CLASSES, LR, parse_configs, shape  # noqa: E402

PEERS = ["onnxtrain-fp32", "onnxtrain-bf16", "onnxtrain-bf16-plain", "onnxtrain-bf16-nocopies",
         "torch", "torch-bf16", "torch-cl", "torch-cl-bf16"]
PEER_LABEL = {"onnxtrain-fp32": "onnxtrain --precision fp32",
              "onnxtrain-bf16": "onnxtrain --precision bf16",
              "onnxtrain-bf16-plain": "onnxtrain --precision bf16 --plain-layout",
              "onnxtrain-bf16-nocopies": "onnxtrain --precision bf16 --no-weight-copies",
              "torch": "torch eager NCHW fp32",
              "torch-bf16": "torch eager NCHW autocast bf16",
              "torch-cl": "torch channels_last fp32",
              "torch-cl-bf16": "torch channels_last autocast bf16"}
# (numerator, denominator, label): img/s of one over the other's, > 1: the numerator is faster.
RATIOS = [("onnxtrain-bf16", "onnxtrain-fp32", "onnxtrain bf16 / onnxtrain fp32"),
          ("onnxtrain-bf16", "onnxtrain-bf16-plain", "onnxtrain bf16 blocked / plain layout"),
          ("onnxtrain-bf16", "onnxtrain-bf16-nocopies",
           "onnxtrain bf16 kept weight copies / --no-weight-copies"),
          ("onnxtrain-bf16", "torch-bf16", "onnxtrain bf16 / torch autocast bf16"),
          ("torch-bf16", "torch", "torch autocast bf16 / torch fp32"),
          ("onnxtrain-bf16", "torch-cl-bf16", "onnxtrain bf16 / torch channels_last autocast bf16"),
          ("torch-cl-bf16", "torch-cl", "torch channels_last bf16 / channels_last fp32"),
          ("onnxtrain-fp32", "torch", "onnxtrain fp32 / torch fp32 (as in train_peers)")]
# Shorthands for --config: the input side picks the config.
SHORT = {"64": "3x64x64:16:2", "224": "3x224x224:8:2"}
BF16_FLAGS = ["avx512_bf16", "amx_bf16", "amx_tile"]


# ----------------------------------------------------------------------------------------------
# Children: one timed run each; each prints one RESULT line.

def worker_torch(a, mode):
    import torch
    import torch.nn.functional as F
    import torchvision
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    c, h, w = shape(a.input)
    model = torchvision.models.resnet50(weights=None, num_classes=CLASSES)
    model.train()
    x = torch.randn(a.batch, c, h, w)
    y = torch.randint(0, CLASSES, (a.batch,))
    if mode.startswith("torch-cl"):
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    bf16 = mode.endswith("-bf16")

    def step():
        opt.zero_grad(set_to_none=True)
        # autocast on forward and loss only; cross_entropy runs in float32 inside it (CPU
        # autocast's fp32 list), the weights and Adam's state stay float32.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()

    times = time_steps(step, a.warmup, a.steps)
    emit(step_result(times, a.warmup, a.batch))
    return 0


# ----------------------------------------------------------------------------------------------
# The parent.

def one_run(a, peer, inp, batch, threads, work, model):
    """(RESULT dict or None, error text or None, max RSS MiB) of one child."""
    if peer.startswith("onnxtrain"):
        metrics = work / "metrics.json"
        metrics.unlink(missing_ok=True)
        precision = peer.split("-")[1]
        cmd = [a.onnxtrain, model, "--data", f"synthetic:{batch * (a.warmup + a.steps)}",
               "--val-data", "none", "--epochs", "1", "--batch-size", batch, "--replicas", "1",
               "--threads", threads, "--optimizer", "adam", "--lr", LR,
               "--precision", precision, "--metrics-json", metrics]
        if precision == "bf16" and a.allow_emulation:
            cmd.append("--allow-emulation")
        if peer.endswith("-plain"):
            cmd.append("--plain-layout")
        if peer.endswith("-nocopies"):
            cmd.append("--no-weight-copies")
    else:
        cmd = [sys.executable, __file__, "--worker", peer, "--input", inp, "--batch", batch,
               "--threads", threads, "--steps", a.steps, "--warmup", a.warmup]
    rc, so, se, rss, _ = run_child(cmd, timeout=a.timeout)
    return child_result(rc, so, se, rss, metrics if peer.startswith("onnxtrain") else None, batch)


def config_label(inp, batch, threads):
    _, h, w = shape(inp)
    side = f"{h}²" if h == w else f"{h}x{w}"
    return f"{side} b{batch} {threads} thread{'s' if threads != 1 else ''}"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", "--configs", default="64,224",
                    help="comma-separated INPUT:BATCH:THREADS, or 64 (= %s) / 224 (= %s) "
                         "(default %%(default)s)" % (SHORT["64"], SHORT["224"]))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per run (default 1)")
    add_bf16_run_options(ap, PEERS, "onnxtrain and onnxzoo")
    ap.add_argument("--keep", metavar="DIR", help="keep the models in DIR")
    # child modes
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        if a.worker not in PEERS or a.worker.startswith("onnxtrain"):
            raise SystemExit(f"unknown worker {a.worker}")
        return worker_torch(a, a.worker)

    peers = [p.strip() for p in a.peers.split(",") if p.strip()]
    bad = [p for p in peers if p not in PEERS]
    if bad or not peers:
        raise BenchError(f"--peers: unknown {bad}; choose from {','.join(PEERS)}")
    if a.rounds < 1 or a.steps < 1 or a.warmup < 0:
        raise BenchError("--rounds and --steps must be >= 1, --warmup >= 0")
    try:
        configs = parse_configs(",".join(SHORT.get(c.strip(), c.strip())
                                         for c in a.config.split(",") if c.strip()))
    except ValueError as e:
        raise BenchError(f"--config '{a.config}': {e}; expected 64, 224 or INPUT:BATCH:THREADS "
                         "such as 3x64x64:16:2") from None
    onnxzoo = resolve_tool(a.bin, "onnxzoo")
    a.onnxtrain = resolve_tool(a.bin, "onnxtrain")

    header("ResNet-50 CPU training, bf16 mixed precision: onnxtrain vs torch autocast "
           "(issue #19)", sys.argv)
    flags = cpu_flags(BF16_FLAGS)
    print(f"bf16 instructions: {', '.join(flags) if flags else 'none (bf16 is emulated: slow)'}")
    print(f"peer versions: {versions(['torch', 'torchvision', 'numpy'])}")
    print(f"Adam lr {LR:g}, cross-entropy, {CLASSES} classes, random data; {a.warmup} warm-up + "
          f"{a.steps} timed steps per run, {a.rounds} round(s), run order rotated each round")
    print("torch bf16 = torch.autocast('cpu', dtype=torch.bfloat16) around forward + loss; "
          "onnxtrain bf16 = --precision bf16; both keep float32 master weights and Adam state")
    sys.stdout.flush()

    work = Path(a.keep).resolve() if a.keep else Path(tempfile.mkdtemp(prefix="amp_peers_"))
    work.mkdir(parents=True, exist_ok=True)
    onnxtrain_failed = False
    summary = {}  # config label -> {peer: img/s}
    try:
        models = {}
        for inp, _, _ in configs:
            if inp in models:
                continue
            models[inp] = work / f"resnet50_{inp}.onnx"
            rc, so, se, _, _ = run_child([onnxzoo, "resnet50", "--input", inp, "--classes",
                                          CLASSES, "-o", models[inp]])
            if rc != 0:
                raise BenchError(f"onnxzoo failed: {tail(se or so)}")

        for inp, batch, threads in configs:
            label = config_label(inp, batch, threads)
            print(f"\n-- {inp} batch {batch} threads {threads}", flush=True)
            got = {p: [] for p in peers}
            errors = {}
            for r in range(a.rounds):
                for p in rotated(peers, r):
                    if p in errors and not p.startswith("onnxtrain"):
                        continue  # a peer that failed once is not retried
                    res, err, rss = one_run(a, p, inp, batch, threads, work, models[inp])
                    if err:
                        errors[p] = err
                        print(f"  round {r + 1} {p:<14} FAILED {err}", flush=True)
                        if p.startswith("onnxtrain"):
                            onnxtrain_failed = True
                        continue
                    res["rss"] = rss
                    got[p].append(res)
                    print(f"  round {r + 1} {p:<14} {res['median_ms']:9.1f} ms/step "
                          f"{res['img_s']:8.2f} img/s  first {fmt(res.get('first_ms'))} ms  "
                          f"RSS {rss:.0f} MiB", flush=True)
            stats = {p: s for p in peers if (s := summarize_runs(got[p], batch))}
            rows = []
            for p in peers:
                if p in stats:
                    ms, ips, first, rss, steady = stats[p]
                    mark = "" if steady else " *"
                    rows.append([PEER_LABEL[p], f"{ms:.1f}{mark}", f"{ips:.2f}{mark}",
                                 f"{first / ms:.2f}" if first else "-", f"{rss:.0f}"])
                else:
                    rows.append([PEER_LABEL[p], "failed", "", "", ""])
            print()
            print_table(["run", "median ms/step", "img/s", "first step / steady",
                         "max RSS MiB"], rows)
            if any(not stats[p][4] for p in stats):
                print("* onnxtrain's metrics JSON has no steady_images_per_sec: its figure is "
                      "images_per_sec over the whole epoch, first step included")
            ratios = [(name, stats[n][1] / stats[d][1], stats[n][3] / stats[d][3])
                      for n, d, name in RATIOS if n in stats and d in stats]
            if ratios:
                print()
                print_table(["ratio", "img/s", "max RSS"],
                            [[name, f"{v:.2f}x", f"{m:.2f}x"] for name, v, m in ratios])
            summary[label] = {p: s for p, s in stats.items()}

        # All configs side by side (the table for bench/README.md / the issue note).
        labels = list(summary)
        if labels:
            print(f"\n-- summary: median of {a.rounds} round(s), {a.steps} timed steps")
            rows = []
            for p in peers:
                rows.append([f"{PEER_LABEL[p]} img/s (max RSS MiB)"] +
                            [f"{summary[l][p][1]:.2f} ({summary[l][p][3]:.0f})"
                             if p in summary[l] else "failed" for l in labels])
            for n, d, name in RATIOS:
                if n in peers and d in peers:
                    rows.append([name] + [f"{summary[l][n][1] / summary[l][d][1]:.2f}x"
                                          if n in summary[l] and d in summary[l] else "-"
                                          for l in labels])
            print_table(["run"] + labels, rows)
        print("\nratio = img/s of the first over the second (> 1: the first is faster); "
              "max RSS ratio likewise (< 1: the first takes less memory); first step / steady "
              "= the first step's time over the median timed step")
        print(f"uptime after: {uptime()}")
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    if onnxtrain_failed:
        print("amp_peers: error: onnxtrain failed (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_main(main, "amp_peers")
