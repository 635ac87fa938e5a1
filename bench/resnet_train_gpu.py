#!/usr/bin/python3
"""ResNet-50 training on one NVIDIA GPU, side by side: onnxtrain (bench/demo_config --device cuda)
vs PyTorch on the same GPU. Same topology (the zoo's torchvision-v1.5 ResNet-50; PyTorch side from
bench/resnet50_cpu.py), Adam, cross-entropy, float32 with TF32 matmul/conv on both sides (unless
--no-tf32), random data, the same batch. Each peer runs in its own process, alternating, `--rounds`
times; reports median ms/step, images/s and the ratio. Run by scripts/gpu-check.sh.
"""
import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from resnet_train_cpu import run  # noqa: E402  (parses 'median X ms/step, median CPU Y ms/step')


def torch_gpu_setup(input_shape, batch, classes, seed, tf32):
    """(torch, device, model, Adam, loss, x, y): PyTorch's ResNet-50 (bench/resnet50_cpu.py) in
    training mode on cuda, Adam lr 1e-3, TF32 per `tf32`, cuDNN autotuning, and one pinned host
    batch (copied each step, as onnxtrain's loader feeds host tensors). Shared with amp_gpu.py."""
    import torch
    from resnet50_cpu import build_torch_resnet50
    torch.manual_seed(seed)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    c, h, w = (int(v) for v in input_shape.split("x"))
    dev = torch.device("cuda")
    model, _ = build_torch_resnet50(classes)
    model = model.to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, c, h, w).pin_memory()
    y = torch.randint(0, classes, (batch,)).pin_memory()
    return torch, dev, model, opt, loss_fn, x, y


def torch_worker(args):
    torch, dev, model, opt, loss_fn, x, y = torch_gpu_setup(args.input, args.batch, args.classes,
                                                            args.seed, args.tf32)
    times, cpu = [], []
    for i in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        xd, yd = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xd), yd)
        loss.backward()
        opt.step()
        float(loss)  # synchronizes, as onnxtrain's step returns the loss
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
    print(f"median {statistics.median(times):.1f} ms/step, median CPU {statistics.median(cpu):.1f} "
          "ms/step (all threads)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo-config", default=str(REPO / "build/bench/demo_config"))
    ap.add_argument("--input", default="3x224x224")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-tf32", dest="tf32", action="store_false")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)
    if not Path(args.demo_config).is_file():
        sys.exit(f"resnet_train_gpu: error: {args.demo_config} not found (configure with "
                 "-DONNXTRAIN_BENCH=ON and build target demo_config, or pass --demo-config PATH)")
    steps = ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    ot = [args.demo_config, "--model", "resnet50", "--input", args.input, "--width", "64",
          "--classes", str(args.classes), "--batch", str(args.batch), "--threads", "4",
          "--data", f"synthetic:{args.batch * 2}", "--optimizer", "adam", "--seed", str(args.seed),
          "--device", "cuda"] + steps + ([] if args.tf32 else ["--no-tf32"])
    pt = [sys.executable, __file__, "--torch-worker", "--input", args.input, "--classes",
          str(args.classes), "--batch", str(args.batch), "--seed", str(args.seed)] + steps + \
         ([] if args.tf32 else ["--no-tf32"])
    print(f"# ResNet-50 {args.input}, batch {args.batch}, Adam, float32 {'with' if args.tf32 else 'without'}"
          f" TF32, {args.steps} timed steps after {args.warmup} warm-up, {args.rounds} rounds")
    ours, theirs = [], []
    for r in range(args.rounds):
        for who in (["onnxtrain", "torch"] if r % 2 == 0 else ["torch", "onnxtrain"]):
            ms, _ = run(ot if who == "onnxtrain" else pt)
            (ours if who == "onnxtrain" else theirs).append(ms)
            print(f"  round {r + 1} {who:<9} {ms:9.1f} ms/step  {args.batch * 1e3 / ms:8.1f} img/s",
                  flush=True)
    a, b = statistics.median(ours), statistics.median(theirs)
    print("\n| peer | ms/step | images/s |\n|---|---|---|")
    print(f"| onnxtrain | {a:.1f} | {args.batch * 1e3 / a:.1f} |")
    print(f"| torch | {b:.1f} | {args.batch * 1e3 / b:.1f} |")
    print(f"onnxtrain/torch images/s ratio: {b / a:.2f}x")


if __name__ == "__main__":
    main()
