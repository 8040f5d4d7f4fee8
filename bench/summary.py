#!/usr/bin/env python3
"""summary.py BENCH.jsonl -- the table bench/run.sh prints: one row per model
and target from the JSON lines `apollo-client submit --json` wrote (wrapped
with bench_model, bench_target and phase cold/warm).  Standard library only."""
import json
import statistics
import sys


def main():
    rows = {}
    with open(sys.argv[1]) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            key = (r["bench_model"], r["bench_target"])
            rows.setdefault(key, {"cold": [], "warm": []})[r["phase"]].append(r["result"])
    hdr = ("model", "target", "kernels", "eager", "cold ms", "warm ms", "cold/warm",
           "import", "partition", "codegen", "backend", "cache", "compiled", "client import")
    fmt = "%-24s %-7s %7s %6s %9s %8s %9s %8s %9s %8s %8s %7s %8s %13s"
    print(fmt % hdr)
    for (model, target), r in sorted(rows.items()):
        if not r["cold"]:
            continue
        c = r["cold"][0]
        warm = [w["round_trip_ms"] for w in r["warm"]]
        wm = statistics.median(warm) if warm else float("nan")
        ratio = c["round_trip_ms"] / wm if warm and wm > 0 else float("nan")
        hits = sum(1 for w in r["warm"] if w["cache"] == "hit")
        print(fmt % (model, target, c["kernels"], c["eager_kernels"],
                     "%.1f" % c["round_trip_ms"], "%.2f" % wm, "%.1fx" % ratio,
                     "%.1f" % c["import_ms"], "%.1f" % c["partition_ms"],
                     "%.1f" % c["codegen_ms"], "%.1f" % c["backend_ms"],
                     "%.1f" % c["cache_ms"], c["kernels_compiled"],
                     "%.1f" % c["client_import_ms"]))
        if warm and hits != len(warm):
            print("  note: %d of %d warm submits of %s were cache misses" % (len(warm) - hits, len(warm), model))
    print("cold ms / warm ms: the client's round trip for one submit (median of the warm ones);")
    print("import..cache: where the daemon spent the cold compile, ms (backend = NVRTC or cc);")
    print("client import: ONNX import in the client, before either submit.")


if __name__ == "__main__":
    main()
