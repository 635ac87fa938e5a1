"""Helpers shared by bench/{train,infer,scaling}_peers.py (issue #18): running one measurement
in its own child process (max RSS from wait4), the `RESULT {json}` line each child prints,
reading onnxtrain's --metrics-json, the machine line, medians and tables.

Only the standard library is imported here: the ONNX Runtime training child runs this file's
callers under another venv's python.
"""
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


class BenchError(Exception):
    """A failure that ends the bench with a one-line message and exit code 1."""


# ----------------------------------------------------------------------------------------------
# In a child: timing a step function and reporting.

def time_steps(step, warmup, steps):
    """Runs step() warmup + steps times; returns the per-step wall times (ms) of all of them."""
    times = []
    for _ in range(warmup + steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def step_result(times, warmup, images_per_step, **extra):
    """The RESULT of a run whose per-step times are `times` (the first `warmup` untimed)."""
    timed = times[warmup:] or times
    med = statistics.median(timed)
    out = {"median_ms": med, "first_ms": times[0], "img_s": images_per_step * 1e3 / med,
           "steady": True, "steps": len(timed)}
    out.update(extra)
    return out


def emit(result):
    """The one machine-readable line the parent reads."""
    print("RESULT " + json.dumps(result), flush=True)


def emit_na(reason):
    """A RESULT that marks the peer n/a, with the first non-empty line of the reason (an
    exception's message line; torch appends hints after it)."""
    lines = [l.strip() for l in str(reason).splitlines() if l.strip()]
    emit({"na": lines[0][:300] if lines else "n/a"})


# ----------------------------------------------------------------------------------------------
# In the parent.

def run_child(cmd, env=None, timeout=3600, cwd=None):
    """Runs cmd to completion; returns (returncode, stdout, stderr, max RSS in MiB, wall s).
    The RSS is the child's own peak (wait4's rusage), grandchildren that it waited for included."""
    cmd = [str(c) for c in cmd]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        try:
            p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        except OSError as e:
            return 127, "", f"cannot start {cmd[0]}: {e}", 0.0, 0.0
        deadline = time.monotonic() + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid == p.pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                status = None
                break
            time.sleep(0.05)
        p.returncode = -9  # reaped here; keep Popen from waiting again
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        so = out.read().decode(errors="replace")
        se = err.read().decode(errors="replace")
    if status is None:
        return 124, so, se + f"\n(killed after {timeout} s)", ru.ru_maxrss / 1024.0, wall
    rc = os.waitstatus_to_exitcode(status)
    return rc, so, se, ru.ru_maxrss / 1024.0, wall


def parse_result(stdout):
    """The dict of the last `RESULT {json}` line, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            try:
                return json.loads(line[len("RESULT "):])
            except ValueError:
                return None
    return None


def describe_rc(rc):
    """'exit N', or the signal that ended the child ('signal 11 (SIGSEGV)')."""
    if rc < 0:
        import signal
        try:
            return f"killed by signal {-rc} ({signal.Signals(-rc).name})"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


def tail(text, n=6):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return "\n      ".join(lines[-n:]) if lines else "(no output)"


def read_onnxtrain_metrics(path, images_per_step):
    """onnxtrain's --metrics-json (one object per epoch; the last is read) as a RESULT dict.
    steady_images_per_sec / first_step_seconds / steady_step_seconds exclude the first step;
    without them images_per_sec is used and the figure is marked as including it."""
    lines = [l for l in Path(path).read_text().splitlines() if l.strip()]
    if not lines:
        raise BenchError(f"{path}: empty metrics file")
    m = json.loads(lines[-1])
    if m.get("steady_images_per_sec"):
        ips = float(m["steady_images_per_sec"])
        med = (float(m["steady_step_seconds"]) * 1e3 if m.get("steady_step_seconds")
               else images_per_step * 1e3 / ips)
        first = m.get("first_step_seconds")
        return {"median_ms": med, "img_s": ips, "steady": True,
                "first_ms": float(first) * 1e3 if first is not None else None}
    ips = float(m["images_per_sec"])
    return {"median_ms": images_per_step * 1e3 / ips, "img_s": ips, "steady": False,
            "first_ms": None}


def child_result(rc, so, se, rss, metrics=None, images_per_step=None):
    """(RESULT dict or None, error text or None, max RSS MiB) of a finished child (run_child's
    rc, stdout, stderr, RSS): onnxtrain's --metrics-json file when `metrics` is given, else the
    child's `RESULT {json}` line."""
    if rc != 0:
        return None, f"{describe_rc(rc)}: {tail(se or so)}", rss
    if metrics is not None:
        try:
            return read_onnxtrain_metrics(metrics, images_per_step), None, rss
        except (OSError, ValueError, KeyError, BenchError) as e:
            return None, f"no metrics: {e}\n      {tail(so)}", rss
    res = parse_result(so)
    if res is None:
        return None, f"no RESULT line: {tail(so + se)}", rss
    return res, None, rss


def resolve_tool(bin_dir, name):
    p = Path(bin_dir) / name
    if not p.is_file():
        raise BenchError(f"{p} not found (cmake --build build, or pass --bin DIR)")
    return p


def uptime():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return f"load average {os.getloadavg()}"


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_flags(names):
    """Those of `names` (e.g. avx512_bf16, amx_bf16) that /proc/cpuinfo lists, in that order."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [n for n in names if n in have]
    except OSError:
        pass
    return []


def versions(names, python=None):
    """'name version' for each installed distribution, of this interpreter or of `python`."""
    # (compared unresolved: a venv's python is a symlink to the interpreter it was made from)
    if python and os.path.abspath(python) != os.path.abspath(sys.executable):
        code = ("import importlib.metadata as md, json, sys\n"
                "out = {}\n"
                "for n in sys.argv[1:]:\n"
                "    try: out[n] = md.version(n)\n"
                "    except Exception: out[n] = None\n"
                "print(json.dumps(out))")
        try:
            p = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True,
                               timeout=120)
            got = json.loads(p.stdout)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return f"(cannot run {python})"
    else:
        got = {}
        for n in names:
            try:
                got[n] = importlib.metadata.version(n)
            except importlib.metadata.PackageNotFoundError:
                got[n] = None
    return ", ".join(f"{n} {v}" for n, v in got.items() if v) or "(none installed)"


def header(title, argv):
    print(f"== {title}")
    print(f"command: {shlex.join([sys.executable] + argv)}")
    print(f"machine: {cpu_model()}, {os.cpu_count()} logical cores; python "
          f"{platform.python_version()} ({sys.executable})")
    print(f"uptime before: {uptime()}", flush=True)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize_runs(runs, images_per_step):
    """Medians over rounds of a peer's RESULT dicts (each with "rss" added by the parent; n/a ones
    skipped): (median ms/step, img/s from it, median first-step ms or None, max of the max RSS
    MiB, whether every run's figure excludes the first step), or None without a run."""
    runs = [x for x in runs if "na" not in x]
    if not runs:
        return None
    ms = median([x["median_ms"] for x in runs])
    return (ms, images_per_step * 1e3 / ms, median([x.get("first_ms") for x in runs]),
            max(x["rss"] for x in runs), all(x.get("steady", True) for x in runs))


def rotated(items, r):
    """items rotated left by r, so every item leads in turn across rounds."""
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def fmt(v, spec=".1f", none="-"):
    return none if v is None else format(v, spec)


def print_table(headers, rows):
    """A Markdown table (pasted as it is into bench/README.md)."""
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")


def add_bf16_run_options(ap, peers, tools="onnxtrain"):
    """The options amp_peers and bert_peers share: the peers (a subset of `peers`), where
    onnxtrain is, bf16 emulation and the per-run timeout."""
    ap.add_argument("--peers", default=",".join(peers),
                    help="comma-separated subset of %(default)s")
    ap.add_argument("--bin", default=os.environ.get("ONNXTRAIN_BIN", str(REPO / "build/tools")),
                    help=f"folder of {tools} (default: build/tools, or $ONNXTRAIN_BIN)")
    ap.add_argument("--allow-emulation", action="store_true",
                    help="pass --allow-emulation to onnxtrain bf16 (a CPU without bf16 "
                         "instructions; its figures then mean nothing)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per child run")


def run_main(main, name):
    """Runs main(argv) as a script: a BenchError is a one-line `NAME: error:` and exit 1."""
    try:
        sys.exit(main(sys.argv[1:]))
    except BenchError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
