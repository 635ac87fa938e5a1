#!/usr/bin/python3
"""Sums a Chrome trace written by SessionOptions::profile_path per op type (the event's "cat")
and lists the slowest nodes: what bench/demo_config --profile is read with.

usage: bench/trace_summary.py trace.json [--steps N] [--top K]
--steps N divides the totals by N (ms per step when the trace holds N steps).
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    by_op = collections.Counter()
    count = collections.Counter()
    by_node = collections.Counter()
    for e in events:
        by_op[e["cat"]] += e["dur"]
        count[e["cat"]] += 1
        by_node[(e["name"], e["cat"])] += e["dur"]
    total = sum(by_op.values())
    n = max(args.steps, 1)
    print(f"{len(events)} kernel runs, {total / 1e3 / n:.1f} ms per step in kernels")
    print(f"{'op':<28}{'ms/step':>10}{'share':>8}{'runs/step':>11}")
    for op, us in by_op.most_common(args.top):
        print(f"{op:<28}{us / 1e3 / n:>10.2f}{100 * us / total:>7.1f}%{count[op] / n:>11.1f}")
    print(f"\nslowest nodes:")
    for (name, op), us in by_node.most_common(args.top):
        print(f"  {name:<50}{op:<24}{us / 1e3 / n:>8.2f} ms/step")


if __name__ == "__main__":
    main()
