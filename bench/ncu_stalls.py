#!/usr/bin/env python3
"""Where a kernel's warps wait, by SASS instruction: reads Nsight Compute's source page as CSV
    ncu --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \\
        --kernel-name regex:NAME --launch-count 1 python3 ... > FILE.csv
and prints the warp-stall samples by reason (share of all samples), by opcode (with the warp
instructions executed), and the top instructions with their main reasons.
    python3 bench/ncu_stalls.py FILE.csv [--top 40] [--ops 14]"""
import argparse
import collections
import csv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--ops", type=int, default=14)
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r[:2] == ["Address", "Source"])
    cols = rows[head]
    name = next((r[1] for r in rows[:head] if r and r[0] == "Kernel Name"), "?")
    total_col = cols.index("Warp Stall Sampling (All Samples)")
    reasons = [(i, c[len("stall_"):]) for i, c in enumerate(cols) if c.startswith("stall_") and "Not Issued" not in c]
    num = lambda s: float(s.replace(",", "") or 0)
    insts = [r for r in rows[head + 1:] if len(r) == len(cols)]
    total = sum(num(r[total_col]) for r in insts) or 1.0
    by_reason = collections.Counter()
    for r in insts:
        for i, n in reasons:
            by_reason[n] += num(r[i])
    print(f"{name[:150]}\n{len(insts)} instructions, {total:.0f} samples")
    print("By reason: " + ", ".join(f"{n} {100 * v / total:.1f}%" for n, v in by_reason.most_common() if v))
    executed = cols.index("Instructions Executed")
    by_op, runs = collections.defaultdict(collections.Counter), collections.Counter()
    for r in insts:
        words = r[1].split() or ["?"]
        op = (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]
        by_op[op]["all"] += num(r[total_col])
        runs[op] += num(r[executed])
        for i, n in reasons:
            by_op[op][n] += num(r[i])
    print(f"\nBy opcode ({sum(runs.values()):.0f} warp instructions executed):")
    for op, c in sorted(by_op.items(), key=lambda x: -x[1]["all"])[:args.ops]:
        top = ", ".join(f"{n} {100 * v / total:.1f}%" for n, v in c.most_common(4) if n != "all" and v)
        print(f"  {op:<8} {100 * c['all'] / total:5.1f}%  executed {runs[op]:>12.0f}  {top}")
    print(f"\nTop {args.top} instructions (share of samples, top reasons):")
    for r in sorted(insts, key=lambda r: -num(r[total_col]))[:args.top]:
        top = sorted(((num(r[i]), n) for i, n in reasons), reverse=True)[:3]
        why = ", ".join(f"{n} {v:.0f}" for v, n in top if v)
        print(f"{r[0]:>9}  {100 * num(r[total_col]) / total:5.2f}%  {r[1][:70]:<70}  {why}")


if __name__ == "__main__":
    main()
