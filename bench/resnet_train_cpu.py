#!/usr/bin/python3
"""ResNet-50 CPU training steps, side by side: onnxtrain (bench/demo_config, one replica) vs
PyTorch. Same architecture (the zoo's torchvision-v1.5 topology; PyTorch side from
bench/resnet50_cpu.py, random init), Adam, cross-entropy, batch, intra-op threads, random
data. The two run alternately, each in its own process, `--rounds` times; the medians of the
per-run median step times are reported with the ratio. Run through bench/resnet_train_cpu.sh.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def torch_worker(args):
    """One PyTorch timing run (a child process, so its thread pool does not outlive it)."""
    import torch
    sys.path.insert(0, str(HERE))
    from resnet50_cpu import build_torch_resnet50
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    c, h, w = (int(v) for v in args.input.split("x"))
    model, _ = build_torch_resnet50(args.classes)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(args.batch, c, h, w)
    y = torch.randint(0, args.classes, (args.batch,))
    times, cpu = [], []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        c0 = time.process_time()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        float(loss)
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
    print(f"median {statistics.median(times):.1f} ms/step, median CPU {statistics.median(cpu):.1f} "
          "ms/step (all threads)")


def run(cmd):
    """(wall, CPU) median ms per step that the peer printed."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        sys.exit(f"resnet_train_cpu: error: {' '.join(cmd)} failed:\n{p.stdout}{p.stderr}")
    m = re.search(r"median ([0-9.]+) ms/step", p.stdout)
    c = re.search(r"median CPU ([0-9.]+) ms/step", p.stdout)
    if not m or not c:
        sys.exit(f"resnet_train_cpu: error: no 'median ... ms/step, median CPU ... ms/step' in "
                 f"the output of {' '.join(cmd)}:\n{p.stdout}")
    return float(m.group(1)), float(c.group(1))


def load():
    return f"{os.getloadavg()[0]:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo-config", default=str(REPO / "build/bench/demo_config"))
    ap.add_argument("--inputs", default="3x224x224,3x64x64")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)
    if not Path(args.demo_config).is_file():
        sys.exit(f"resnet_train_cpu: error: {args.demo_config} not found (cmake -DONNXTRAIN_BENCH=ON, "
                 "cmake --build build --target demo_config, or pass --demo-config PATH)")
    print(f"# uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"# batch {args.batch}, threads {args.threads}, Adam, {args.steps} timed steps after "
          f"{args.warmup} warm-up per run, {args.rounds} rounds alternating")
    rows = []
    for inp in args.inputs.split(","):
        ours, theirs, ours_cpu, theirs_cpu = [], [], [], []
        for r in range(args.rounds):
            steps = ["--steps", str(args.steps), "--warmup", str(args.warmup)]
            ot = [args.demo_config, "--model", "resnet50", "--input", inp, "--width", "64",
                  "--classes", str(args.classes), "--batch", str(args.batch),
                  "--threads", str(args.threads), "--data", f"synthetic:{args.batch * 4}",
                  "--optimizer", "adam", "--seed", str(args.seed)] + steps
            pt = [sys.executable, __file__, "--torch-worker", "--input", inp,
                  "--classes", str(args.classes), "--batch", str(args.batch),
                  "--threads", str(args.threads), "--seed", str(args.seed)] + steps
            # Alternate which peer goes first, so a load change hits both alike.
            for who in (["onnxtrain", "torch"] if r % 2 == 0 else ["torch", "onnxtrain"]):
                before = load()
                ms, cpu_ms = run(ot if who == "onnxtrain" else pt)
                (ours if who == "onnxtrain" else theirs).append(ms)
                (ours_cpu if who == "onnxtrain" else theirs_cpu).append(cpu_ms)
                print(f"  {inp} round {r + 1} {who:<9} {ms:9.1f} ms/step, CPU {cpu_ms:9.1f} ms/step"
                      f"  (load {before} -> {load()})", flush=True)
        med = statistics.median
        rows.append((inp, med(ours), med(theirs), med(ours_cpu), med(theirs_cpu)))
    # Wall time is what a user sees; CPU time (all threads of the process) is what the step
    # costs, and stays comparable when other work steals time slices.
    print(f"\n| input | clock | onnxtrain ms/step | torch ms/step | onnxtrain img/s | torch img/s | "
          f"onnxtrain/torch |")
    print("|---|---|---|---|---|---|---|")
    for inp, a, b, ac, bc in rows:
        for clock, x, y in (("wall", a, b), ("CPU", ac, bc)):
            print(f"| {inp} | {clock} | {x:.1f} | {y:.1f} | {args.batch * 1e3 / x:.2f} | "
                  f"{args.batch * 1e3 / y:.2f} | {y / x:.2f}x |")
    print(f"# uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


if __name__ == "__main__":
    main()
