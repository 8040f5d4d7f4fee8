#!/usr/bin/env python3
"""scale.py SCALE.jsonl -- the table bench/scale.sh prints: one row per graph
size from the JSON lines `apollo-client submit --json` wrote (wrapped with
"layers"), the fastest of each size's repetitions (partition, codegen and
their sum each), then the ratio time(512) / time(64) of partition +
codegen.  Standard library only."""
import json
import sys


def main():
    runs = {}
    with open(sys.argv[1]) as f:
        for line in f:
            line = line.strip()
            if line:
                r = json.loads(line)
                runs.setdefault(r["layers"], []).append(r["result"])
    fmt = "%7s %8s %9s %13s %11s %15s %15s"
    print(fmt % ("layers", "nodes", "launches", "partition ms", "codegen ms", "part+cg ms",
                 "us per node"))
    total = {}
    for layers in sorted(runs):
        rs = runs[layers]
        part = min(r["partition_ms"] for r in rs)
        cg = min(r["codegen_ms"] for r in rs)
        both = min(r["partition_ms"] + r["codegen_ms"] for r in rs)
        nodes = rs[0]["nodes"]
        total[layers] = both
        print(fmt % (layers, nodes, rs[0]["kernels"], "%.1f" % part, "%.1f" % cg, "%.1f" % both,
                     "%.2f" % (1000.0 * both / nodes if nodes else float("nan"))))
    if 64 in total and 512 in total and total[64] > 0:
        print("time(512)/time(64) = %.1f  (partition + codegen; 8x the nodes)" %
              (total[512] / total[64]))
    print("nodes: imported ONNX nodes; launches: kernel launches of the plan;")
    print("partition: expand + partition, codegen: lowering, printing and the launch plan")
    print("(the daemon's own timers; the backend compiler is not included).")


if __name__ == "__main__":
    main()
