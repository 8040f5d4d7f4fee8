#!/usr/bin/env python3
"""warm.py BENCH.jsonl COLD.json WARM.json MODEL BYTES TARGET [SUMMARY.jsonl]
   warm.py --table SUMMARY.jsonl
-- what bench/warm.sh prints: the cold and warm submit of one model as
whole apollo-client processes, the daemon's CPU per warm submit through a
kept connection, and warm submits per second with 1, 4 and 16 clients
(with SUMMARY.jsonl, one line of it appended there); --table, the
summary of several models against their kernel counts (issue 26, item 2).
The targets of issues 10 and 26 are printed beside the numbers; nothing is
asserted.  Standard library only."""
import json
import sys


def lines(path):
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


# issue 26, item 2: daemon CPU per warm submit by distinct kernels
ISSUE26 = {5: 0.2, 14: 0.4, 31: 0.6, 51: 1.0}


def table(path):
    rows = lines(path)
    print("warm path by kernels (daemon CPU per warm submit through a kept connection)")
    print("  %-22s %7s %8s %10s %12s %14s %10s" % ("model", "kernels", "distinct", "bundle KB",
                                                  "CPU ms", "ms/distinct", "submits/s"))
    for r in rows:
        goal = ISSUE26.get(r["distinct"])
        print("  %-22s %7d %8d %10.0f %12.3f %14.4f %10.0f%s" % (
            r["model"], r["kernels"], r["distinct"], r["blob_bytes"] / 1e3, r["cpu_ms"],
            r["cpu_ms"] / max(r["distinct"], 1), r["rps1"],
            "   (issue 26: <= %.1f ms)" % goal if goal else ""))


def main():
    if sys.argv[1] == "--table":
        return table(sys.argv[2])
    bench, cold_out, warm_out = (lines(p) for p in sys.argv[1:4])
    model, nbytes, target = sys.argv[4], int(sys.argv[5]), sys.argv[6]
    procs = [b for b in bench if b["bench"] == "process"]
    cpu = next(b for b in bench if b["bench"] == "cpu")
    rps = [b for b in bench if b["bench"] == "rps"]
    cold, warm = procs[0], procs[1]
    tiers = sorted({w.get("cache_tier", w.get("cache")) for w in warm_out})
    ratio = cold["median_ms"] / warm["median_ms"]
    print("warm path: %s (%.1f MB), target %s" % (model, nbytes / 1e6, target))
    print("  cold submit, whole apollo-client process:   %9.1f ms   (cache %s, %d kernels "
          "compiled)" % (cold["median_ms"], cold_out[0]["cache"],
                         cold_out[0].get("kernels_compiled", 0)))
    print("  warm submit, whole apollo-client process:   %9.2f ms   (median of %d, min %.2f; "
          "cache %s; client import %.3f ms)" % (warm["median_ms"], warm["runs"],
                                               warm["min_ms"], ",".join(tiers),
                                               warm_out[-1].get("client_import_ms", 0)))
    print("  cold / warm:                                %9.0fx    (issue 10: >= 20x)" % ratio)
    print("  daemon CPU per warm submit, kept connection: %8.3f ms   (issue 10: <= 0.3 ms; "
          "%d submits, round trip %.3f ms)" % (cpu["daemon_cpu_ms_per_submit"], cpu["submits"],
                                                cpu["round_trip_ms"]))
    print("  warm submits per second, kept connections: " +
          ", ".join("%d client%s %.0f" % (r["clients"], "" if r["clients"] == 1 else "s",
                                           r["per_second"]) for r in rps))
    if len(sys.argv) > 7:
        with open(sys.argv[7], "a") as f:
            f.write(json.dumps({"model": model, "kernels": cold_out[0].get("kernels", 0),
                                "distinct": cold_out[0].get("distinct_kernels", 0),
                                "blob_bytes": cold_out[0].get("blob_bytes", 0),
                                "cpu_ms": cpu["daemon_cpu_ms_per_submit"],
                                "rps1": rps[0]["per_second"] if rps else 0}) + "\n")
    bad = [w for w in warm_out if w.get("cache") != "hit"]
    if cold_out[0].get("cache") == "hit" or bad:
        print("  note: the cold submit was a hit or a warm one was not: the numbers above "
              "do not measure the warm path")


if __name__ == "__main__":
    main()
