#!/usr/bin/env python3
"""Median over all repetitions (both passes) of the per-repetition lines in results/*.log."""
import re, glob, statistics as st
pat = re.compile(r"^(\w+) rep \d+: full ([\d.]+) ms, sync10k ([\d.]+) ms, sync100k ([\d.]+) ms, read cold ([\d.]+) / warm ([\d.]+) ms, churn sync med ([\d.]+) max ([\d.]+) ms, read churned cold ([\d.]+) / warm ([\d.]+) ms(?: \(cpu ([\d.]+)\))?, disk x([\d.]+) -> x([\d.]+) \(peak x([\d.]+)\)")
cols = ["full save (a), ms", "sync 10k (b), ms", "sync 100k (b), ms", "read cold (c), ms", "read warm (c), ms",
        "churn sync median (d), ms", "churn sync slowest (d), ms", "read cold after churn (c), ms", "read warm after churn (c), ms",
        "read warm after churn, process CPU ms", "disk/raw after full save", "disk/raw after churn", "disk/raw peak in churn"]
data = {}
for f in sorted(glob.glob("results/*.log")):
    for line in open(f):
        m = pat.match(line)
        if m:
            data.setdefault(m.group(1), []).append([None if x is None else float(x) for x in m.groups()[1:]])
names = [n for n in ("own", "redb", "fjall") if n in data]
print("| measure (median of reps) | " + " | ".join(f"{n} ({len(data[n])} reps)" for n in names) + " |")
print("|---|" + "---:|" * len(names))
for i, c in enumerate(cols):
    cells = []
    for n in names:
        v = [r[i] for r in data[n] if r[i] is not None]
        cells.append("n/a" if not v else (f"{st.median(v):.2f}" if "disk" in c else f"{st.median(v):.1f}" if "sync 10k" in c else f"{st.median(v):.0f}"))
    print(f"| {c} | " + " | ".join(cells) + " |")
