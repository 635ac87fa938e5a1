#!/usr/bin/python3
"""ResNet-50 CPU inference, side by side: onnxrun vs PyTorch (and ONNX Runtime when installed).

Checks onnxrun's logits against an independent PyTorch build of the same network, then times
batch 1 and batch 8 at one shared thread count. Run through bench/resnet50_cpu.sh; see
bench/README.md for what is measured and how to read the figures.
"""
import argparse
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-3  # max |onnxrun - torch| must stay within TOLERANCE * max |torch logit|


class BenchError(Exception):
    """A failure that ends the bench with a one-line message and exit code 1."""


def import_or_fail():
    try:
        import numpy  # noqa: F401
        import onnx  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        raise BenchError(f"{sys.executable} cannot import {e.name}: this bench needs numpy, onnx "
                         "and torch (Debian: apt-get install python3-torch python3-onnx, or "
                         "scripts/setup.sh --with-bench); set PYTHON=... for another interpreter")


# ----------------------------------------------------------------------------------------------
# The PyTorch peer: torchvision's ResNet-50 (v1.5: stride on the 3x3 conv) when torchvision is
# installed, else the same topology written out here with the same module names, so the ONNX
# initializer names are the state_dict keys.

def build_torch_resnet50(num_classes):
    import torch.nn as nn
    try:
        import torchvision
        try:
            return torchvision.models.resnet50(weights=None, num_classes=num_classes), "torchvision"
        except TypeError:  # torchvision < 0.13
            return torchvision.models.resnet50(pretrained=False, num_classes=num_classes), "torchvision"
    except ImportError:
        pass

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes, planes, stride, downsample):
            super().__init__()
            width = planes
            self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + identity)

    class ResNet50(nn.Module):
        def __init__(self):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
            self.layer1 = self._make_layer(64, 3, 1)
            self.layer2 = self._make_layer(128, 4, 2)
            self.layer3 = self._make_layer(256, 6, 2)
            self.layer4 = self._make_layer(512, 3, 2)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(2048, num_classes)

        def _make_layer(self, planes, blocks, stride):
            downsample = None
            if stride != 1 or self.inplanes != planes * 4:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False),
                    nn.BatchNorm2d(planes * 4))
            layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * 4
            layers += [Bottleneck(self.inplanes, planes, 1, None) for _ in range(1, blocks)]
            return nn.Sequential(*layers)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet50(), "written in bench/resnet50_cpu.py (torchvision not installed)"


def attr(node, name, default=None):
    import onnx
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def check_topology(model_proto, torch_model):
    """Fails unless every ONNX Conv / BN / Gemm matches the torch module of the same name, so a
    topology drift in onnxzoo (say stride on conv1 instead of conv2) is caught here, not as a
    mysterious logit mismatch."""
    import torch.nn as nn
    modules = dict(torch_model.named_modules())
    seen = {"Conv": 0, "BatchNormalization": 0, "Gemm": 0}
    for node in model_proto.graph.node:
        if node.op_type not in seen:
            continue
        seen[node.op_type] += 1
        owner = node.input[1].rsplit(".", 1)[0]
        m = modules.get(owner)
        where = f"ONNX {node.op_type} '{node.name}' (weight '{node.input[1]}')"
        if node.op_type == "Conv":
            if not isinstance(m, nn.Conv2d):
                raise BenchError(f"{where}: no torch Conv2d named '{owner}'")
            pads = list(attr(node, "pads", [0, 0, 0, 0]))
            got = (list(attr(node, "strides", [1, 1])), pads[:2], pads[2:],
                   attr(node, "group", 1), list(attr(node, "dilations", [1, 1])))
            want = (list(m.stride), list(m.padding), list(m.padding), m.groups, list(m.dilation))
            if got != want:
                raise BenchError(f"{where}: strides/pads/group/dilations {got} != torch {want}")
        elif node.op_type == "BatchNormalization":
            if not isinstance(m, nn.BatchNorm2d):
                raise BenchError(f"{where}: no torch BatchNorm2d named '{owner}'")
            eps = attr(node, "epsilon", 1e-5)
            if abs(eps - m.eps) > 1e-9:
                raise BenchError(f"{where}: epsilon {eps} != torch {m.eps}")
        else:
            if not isinstance(m, nn.Linear) or attr(node, "transB", 0) != 1 or \
                    attr(node, "alpha", 1.0) != 1.0 or attr(node, "beta", 1.0) != 1.0:
                raise BenchError(f"{where}: expected Gemm(transB=1, alpha=beta=1) = torch Linear")
    want = {"Conv": 53, "BatchNormalization": 53, "Gemm": 1}
    if seen != want:
        raise BenchError(f"ONNX op counts {seen} != ResNet-50's {want}")


def load_weights(model_proto, torch_model):
    """Copies every initializer into the torch state_dict entry of the same name; both sides must
    cover each other exactly (num_batches_tracked aside) with equal shapes."""
    import numpy as np
    import onnx.numpy_helper
    import torch
    state = torch_model.state_dict()
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model_proto.graph.initializer}
    wanted = {k for k in state if not k.endswith("num_batches_tracked")}
    missing, extra = sorted(wanted - inits.keys()), sorted(inits.keys() - wanted)
    if missing or extra:
        raise BenchError(f"initializer names do not match the torch ResNet-50: missing "
                         f"{missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected "
                         f"{extra[:5]}{'...' if len(extra) > 5 else ''}")
    for name in wanted:
        a = inits[name]
        if tuple(a.shape) != tuple(state[name].shape):
            raise BenchError(f"initializer '{name}': shape {a.shape} != torch {tuple(state[name].shape)}")
        state[name] = torch.from_numpy(np.array(a, dtype=np.float32))  # a writable copy
    torch_model.load_state_dict(state, strict=True)
    torch_model.eval()


def randomize_batchnorm(model_proto, seed):
    """The zoo's PyTorch-default BN is the identity in eval mode (gamma 1, beta 0, mean 0, var 1),
    which would let a BN kernel that ignores its statistics pass. This copy gets random ones."""
    import numpy as np
    import onnx
    import onnx.numpy_helper
    rng = np.random.default_rng(seed + 1000)
    out = onnx.ModelProto()
    out.CopyFrom(model_proto)
    bn_inputs = {}
    for node in out.graph.node:
        if node.op_type == "BatchNormalization":
            for role, name in zip(("scale", "bias", "mean", "var"), node.input[1:5]):
                bn_inputs[name] = role
    for init in out.graph.initializer:
        role = bn_inputs.get(init.name)
        if role is None:
            continue
        n = onnx.numpy_helper.to_array(init).shape
        value = {"scale": lambda: rng.uniform(0.5, 1.5, n),
                 "bias": lambda: rng.normal(0.0, 0.1, n),
                 "mean": lambda: rng.normal(0.0, 0.1, n),
                 "var": lambda: rng.uniform(0.5, 2.0, n)}[role]()
        init.CopyFrom(onnx.numpy_helper.from_array(value.astype(np.float32), init.name))
    return out


# ----------------------------------------------------------------------------------------------
# Running the peers.

def run_tool(cmd, what, timeout=1800):
    print(f"$ {shlex.join(str(c) for c in cmd)}", flush=True)
    try:
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise BenchError(f"{what}: cannot start {cmd[0]}: {e}")
    except subprocess.TimeoutExpired:
        raise BenchError(f"{what}: {cmd[0]} did not finish within {timeout} s")
    if p.returncode != 0:
        tail = (p.stderr.strip() or p.stdout.strip() or "(no output)").splitlines()[-15:]
        raise BenchError(f"{what}: {cmd[0]} exited with {p.returncode}:\n    " + "\n    ".join(tail))
    return p.stdout


def onnxrun_logits(args, model_path, x, workdir, tag):
    import numpy as np
    in_path, out_dir = workdir / f"{tag}_input.npy", workdir / f"{tag}_out"
    np.save(in_path, x)
    run_tool([args.onnxrun, model_path, "--input", f"input={in_path}", "--output-dir", out_dir,
              "--threads", args.threads], f"onnxrun on {tag}")
    out = out_dir / "logits.npy"
    if not out.exists():
        raise BenchError(f"onnxrun on {tag}: exited 0 but wrote no {out}")
    return np.load(out)


def onnxrun_median_ms(args, model_path, x, workdir, runs):
    import numpy as np
    in_path = workdir / f"bench_b{x.shape[0]}.npy"
    np.save(in_path, x)
    out = run_tool([args.onnxrun, model_path, "--input", f"input={in_path}", "--threads",
                    args.threads, "--bench", runs], f"onnxrun --bench batch {x.shape[0]}")
    m = re.search(r"median latency:\s*([0-9.eE+-]+)\s*ms", out)
    if not m:
        raise BenchError(f"onnxrun --bench printed no 'median latency: X ms' line:\n{out}")
    return float(m.group(1))


def time_median_ms(fn, warmup, runs):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def ort_session(args, model_path):
    """An ONNX Runtime session with the same intra-op thread count, or None (with the reason
    printed) when onnxruntime is not importable or --no-ort is given."""
    if args.no_ort:
        print("onnxruntime: skipped (--no-ort)")
        return None
    try:
        import onnxruntime as ort
    except ImportError as e:
        print(f"onnxruntime: skipped, not importable by {sys.executable} ({e}); "
              f"install with: {sys.executable} -m pip install --user onnxruntime")
        return None
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])


def compare(name, got, ref):
    """Prints and returns the normalized error max|got - ref| / max|ref|."""
    import numpy as np
    if got.shape != ref.shape:
        raise BenchError(f"{name}: logits shape {got.shape} != torch {ref.shape}")
    if not np.all(np.isfinite(got)):
        raise BenchError(f"{name}: logits contain {np.count_nonzero(~np.isfinite(got))} NaN/Inf")
    diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    scale = float(np.abs(ref).max())
    # Element-wise relative error, over logits not close to zero (where it means nothing).
    big = np.abs(ref) > 1e-2 * scale
    rel = float((diff[big] / np.abs(ref[big])).max()) if big.any() else float("nan")
    norm = float(diff.max()) / scale if scale > 0 else float(diff.max())
    same_top1 = bool((got.argmax(1) == ref.argmax(1)).all())
    print(f"  {name:<28} max abs diff {diff.max():.3e}  max|logit| {scale:.3e}  "
          f"max abs/max|logit| {norm:.3e}  max rel diff {rel:.3e}  top-1 equal: {same_top1}")
    return norm


def resolve_tool(given, name):
    if given:
        p = Path(given)
        if not p.exists():
            raise BenchError(f"--{name} {given}: no such file")
        return p.resolve()
    p = REPO / "build" / "tools" / name
    if p.exists():
        return p
    found = sorted(str(q.relative_to(REPO)) for q in REPO.glob(f"build*/tools/{name}") if q.is_file())
    hint = f" (built ones: {', '.join(found)})" if found else " (cmake --build build)"
    raise BenchError(f"{p} not found; build it or pass --{name} PATH{hint}")


def load_note(threads):
    """The 1-minute load average, flagged when other work competes for the cores: every peer
    suffers, but not equally (a compile that starts halfway through hits whoever runs then)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return "load average unknown"
    busy = load > 0.5 + (os.cpu_count() or 1) - threads
    return f"1-min load average {load:.2f}" + (
        "  ** WARNING: other work is running; timings are noisy, use --rounds and rerun **"
        if busy else "")


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnxzoo", help="onnxzoo binary (default: build/tools/onnxzoo)")
    ap.add_argument("--onnxrun", help="onnxrun binary (default: build/tools/onnxrun)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="intra-op threads for every peer (default: nproc = %(default)s)")
    ap.add_argument("--runs", type=int, help="timed runs per peer and batch "
                    "(default: 10 at batch 1, 5 at batch 8)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed runs before timing, torch and ORT (default 1, as onnxrun --bench)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the whole peer rotation K times and report the median of the "
                    "per-round medians (evens out load that changes during the run; default 1)")
    ap.add_argument("--batches", default="1,8", help="batch sizes to time (default 1,8)")
    ap.add_argument("--seed", type=int, default=0, help="weights and input seed (default 0)")
    ap.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime out")
    ap.add_argument("--check-only", action="store_true", help="correctness only, no timing")
    ap.add_argument("--keep", metavar="DIR", help="keep the models and .npy files in DIR")
    args = ap.parse_args()
    if args.threads < 1 or (args.runs is not None and args.runs < 1) or args.rounds < 1 \
            or args.warmup < 0:
        ap.error("--threads, --runs and --rounds must be >= 1, --warmup >= 0")
    batches = [int(b) for b in args.batches.split(",") if b]

    import_or_fail()
    import numpy as np
    import onnx
    import torch

    args.onnxzoo = resolve_tool(args.onnxzoo, "onnxzoo")
    args.onnxrun = resolve_tool(args.onnxrun, "onnxrun")
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)

    print("== ResNet-50 CPU inference: onnxrun vs PyTorch vs ONNX Runtime")
    print(f"command: {shlex.join(sys.argv)}")
    print(f"cpu: {cpu_model()}, {os.cpu_count()} logical cores; threads per peer: {args.threads}")
    print(f"python {platform.python_version()} ({sys.executable}), torch {torch.__version__}, "
          f"numpy {np.__version__}, onnx {onnx.__version__}")

    if args.keep:
        workdir = Path(args.keep).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="bench_resnet50_"))
    try:
        return run_bench(args, batches, workdir)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def run_bench(args, batches, workdir):
    import numpy as np
    import onnx
    import torch

    # (1) the model under test
    model_path = workdir / "resnet50.onnx"
    run_tool([args.onnxzoo, "resnet50", "--input", "3x224x224", "--classes", "1000",
              "--seed", args.seed, "-o", model_path], "onnxzoo")
    proto = onnx.load(str(model_path))

    # (2) the torch peer with the same weights
    net, origin = build_torch_resnet50(1000)
    print(f"torch model: {origin}")
    check_topology(proto, net)
    load_weights(proto, net)

    # (3) correctness: same input through torch and onnxrun, on the zoo weights and on a copy
    # whose BatchNorm parameters are random (the zoo's are the identity)
    bn_path = workdir / "resnet50_bnrand.onnx"
    bn_proto = randomize_batchnorm(proto, args.seed)
    onnx.save(bn_proto, str(bn_path))
    net_bn, _ = build_torch_resnet50(1000)
    load_weights(bn_proto, net_bn)
    del bn_proto

    sess = ort_session(args, model_path)
    if sess is not None:
        print(f"onnxruntime {sys.modules['onnxruntime'].__version__}, "
              f"providers {sess.get_providers()}")

    x = np.random.default_rng(args.seed).standard_normal((2, 3, 224, 224), dtype=np.float32)
    print(f"\n-- correctness: batch 2, N(0,1) input (seed {args.seed}), pass if "
          f"max abs diff <= {TOLERANCE:g} * max|torch logit|")
    worst, ort_worst = 0.0, 0.0
    for tag, path, tnet in (("zoo", model_path, net), ("bn-random", bn_path, net_bn)):
        with torch.inference_mode():
            ref = tnet(torch.from_numpy(x)).numpy()
        got = onnxrun_logits(args, path, x, workdir, tag)
        worst = max(worst, compare(f"onnxrun vs torch [{tag}]", got, ref))
        if sess is not None:
            s = sess if tag == "zoo" else ort_session(args, path)
            ort_worst = max(ort_worst, compare(f"ORT vs torch [{tag}]", s.run(["logits"], {"input": x})[0], ref))
    del net_bn
    if ort_worst > TOLERANCE:
        raise BenchError(f"ONNX Runtime disagrees with the torch reference ({ort_worst:.3e} > "
                         f"{TOLERANCE:g}): the reference itself is suspect")
    if worst > TOLERANCE:
        raise BenchError(f"onnxrun logits differ from torch: {worst:.3e} > {TOLERANCE:g} "
                         "(max abs diff / max|logit|)")
    print("  PASS")
    if args.check_only:
        return 0

    # (4) speed
    print(f"\n-- speed: {args.threads} threads each, median of N runs after warm-up "
          f"(onnxrun: 1 warm-up inside --bench; torch/ORT: {args.warmup}), {args.rounds} round(s)")
    print(f"before: {load_note(args.threads)}")
    peers = ["onnxrun", "torch"] + (["onnxruntime"] if sess is not None else [])
    medians = {}  # (peer, batch) -> [median ms of each round]
    for r in range(args.rounds):
        for b in batches:
            runs = args.runs or (10 if b == 1 else 5)
            xb = np.random.default_rng(args.seed + b).standard_normal((b, 3, 224, 224),
                                                                      dtype=np.float32)
            tx = torch.from_numpy(xb)
            for p in peers:
                if p == "onnxrun":
                    ms = onnxrun_median_ms(args, model_path, xb, workdir, runs)
                elif p == "torch":
                    with torch.inference_mode():
                        ms = time_median_ms(lambda: net(tx), args.warmup, runs)
                else:
                    ms = time_median_ms(lambda: sess.run(["logits"], {"input": xb}),
                                        args.warmup, runs)
                medians.setdefault((p, b), []).append(ms)
                print(f"  round {r + 1}: {p:<12} batch {b}: median {ms:.1f} ms", flush=True)
    print(f"after: {load_note(args.threads)}")

    ms_of = {key: statistics.median(v) for key, v in medians.items()}
    ips = {(p, b): b * 1e3 / ms for (p, b), ms in ms_of.items()}
    print(f"\n{'peer':<12} {'batch':>5} {'runs':>4} {'median ms':>10} {'images/s':>9} "
          f"{'onnxrun/peer':>13}")
    for b in batches:
        for p in peers:
            runs = args.runs or (10 if b == 1 else 5)
            ratio = ips[("onnxrun", b)] / ips[(p, b)]
            print(f"{p:<12} {b:>5} {runs:>4} {ms_of[(p, b)]:>10.1f} {ips[(p, b)]:>9.2f} "
                  f"{ratio:>12.2f}x")
    print("(onnxrun/peer = onnxrun images/s / peer images/s; > 1 means onnxrun is faster; "
          "runs = timed runs per round)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"resnet50_cpu: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
