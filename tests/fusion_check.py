#!/usr/bin/env python3
"""fusion_check.py -- value checks on what the compiler reports at each
fusion level (tests/fusion_levels.sh runs it against a live apollod).

    fusion_check.py --client APOLLO_CLIENT [--out FILE] TESTDIR...

For every TESTDIR (model.onnx + test_data_set_0, whose inputs bind symbolic
dims) and every level none, rules, apollo, runs
`apollo-client submit MODEL --data TESTDIR --fusion LEVEL --explain --json`
and checks:
  - explain: every launch has a category and at least one ONNX node; every
    boundary names launches of the plan, a tensor, and a reason that is
    neither empty nor "unknown"; every pair of launches joined by a buffer
    (one writes it, a later one reads it) has a boundary that says why
    they were not fused;
  - figures: min_bytes > 0, and min_bytes <= global_bytes, eager_bytes;
  - memory (issue 24, item 2): workspace_bytes, peak_bytes, input_bytes,
    output_bytes and const_bytes reported; input, output and const bytes
    the sums of buffer_list's buffers of that kind; peak_bytes = inputs +
    outputs + constants + workspace, so peak >= workspace and peak >=
    inputs + outputs; outputs > 0; at level apollo a peak no higher than at
    none (one kernel per primitive, the nearest to an eager run);
  - at level apollo, against rules on the same model: no more launches and
    no more global bytes;
  - the partition issue's targets at level apollo, on bert_like_2l and
    mlp_gelu_ln: launches <= 0.45 x eager_kernels, and
    global_bytes - min_bytes <= 0.5 x (eager_bytes - min_bytes);
  - the fusion-phase issue's targets at level apollo (Layers II and III):
    launches at most LAUNCH_TARGETS[model], and no model with more launches
    or more global bytes than BEFORE_LAYERS (the same measure before the
    fusion layers existed, plus the model's constant buffers read once:
    see BEFORE_LAYERS);
  - hints travel (mlp_gelu_ln, level apollo): --fusion-barrier on a node
    that shares a launch with an earlier node gives a boundary with reason
    "hint" into a launch holding that node; --keep-whole ReduceMean puts all
    of each ReduceMean's primitives in one launch of category "whole".
Prints one line per failed check ("FAIL ..."), a table of the figures, and
"fusion_check: N checks, N failed"; exits 1 on any failure.  With --out,
also writes each answer as a JSON line {"dir","level","result"}.
Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys

LEVELS = ("none", "rules", "apollo")
TARGET_MODELS = ("bert_like_2l", "mlp_gelu_ln")
KERNEL_RATIO = 0.45
TRAFFIC_RATIO = 0.5
# Launches at --fusion apollo the fusion layers must reach.
LAUNCH_TARGETS = {"bert_like_2l": 18, "mlp_gelu_ln": 6, "squeezenet1_1": 25,
                  "prenorm_layer_train": 40, "mlp_residual_train": 22,
                  "small_convnet_train": 25}
# (launches, global bytes) at --fusion apollo before the fusion layers
# (0526259).  Its kernels had every constant (parameters aside) baked into
# their source -- the constant buffers, BUF_CONST, came a day later
# (f16dfce) -- so these bytes hold none; a launch now counts the constants it
# reads from a buffer, and any plan reads each at least once: the check adds
# the model's const_bytes to these figures.
BEFORE_LAYERS = {"bert_like_2l": (28, 16021504), "mlp_gelu_ln": (8, 6547328),
                 "ppocr_mobile_v2_cls": (103, 6430444), "silero_vad_op18_ifless": (11, 1251884),
                 "squeezenet1_1": (31, 31904800), "mlp_residual_train": (29, 1394764),
                 "prenorm_layer_train": (55, 1470196), "small_convnet_train": (30, 831532)}


class Checker:
    def __init__(self):
        self.n = 0
        self.failed = 0

    def check(self, ok, what):
        self.n += 1
        if not ok:
            self.failed += 1
            print("FAIL " + what)
        return ok


def submit(client, d, level, extra=()):
    cmd = [client, "submit", os.path.join(d, "model.onnx"), "--data", d,
           "--fusion", level, "--explain", "--json"] + list(extra)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=900)
    if p.returncode != 0:
        return None, p.stderr.strip() or ("exit status %d" % p.returncode)
    try:
        return json.loads(p.stdout), None
    except ValueError as e:
        return None, "bad JSON from submit: %s" % e


def explain_checks(ck, name, level, r):
    """The --explain report of one answer; returns the reasons seen."""
    tag = "%s --fusion %s" % (name, level)
    launches = r.get("launch_list", [])
    bounds = r.get("boundary_list")
    bufs = r.get("buffer_list")
    n = len(launches)
    if not ck.check(bounds is not None and bufs is not None,
                    "%s: no boundary_list/buffer_list in --explain --json" % tag):
        return {}
    ck.check(n == r.get("kernels"), "%s: %d launches listed, kernels says %s" % (tag, n, r.get("kernels")))
    # One FAIL line per kind of problem, with up to three examples.
    def each(items, what):
        ck.check(not items, "%s: %d %s, e.g. %s" % (tag, len(items), what, "; ".join(items[:3])))

    each(["launch %d (%s)" % (i, l.get("name")) for i, l in enumerate(launches) if not l.get("category")],
         "launches without a category")
    each(["launch %d (%s)" % (i, l.get("name")) for i, l in enumerate(launches) if not l.get("nodes")],
         "launches naming no ONNX node")
    reasons = {}
    pairs = set()
    bad_reason, bad_launch, bad_tensor = [], [], []
    for j, b in enumerate(bounds):
        reason = b.get("reason", "")
        reasons[reason] = reasons.get(reason, 0) + 1
        p, c = b.get("producer", -1), b.get("consumer", -1)
        desc = "boundary %d (launch %s -> launch %s via %s)" % (j, p, c, b.get("tensor"))
        if reason in ("", "unknown"):
            bad_reason.append("%s: %r" % (desc, reason))
        if not (0 <= p < n and 0 <= c < n and p != c):
            bad_launch.append(desc)
        if not b.get("tensor"):
            bad_tensor.append(desc)
        pairs.add((p, c))
    each(bad_reason, "boundaries with an empty or \"unknown\" reason")
    each(bad_launch, "boundaries naming launches outside the plan of %d (or one launch twice)" % n)
    each(bad_tensor, "boundaries naming no tensor")
    # Every buffer written by one launch and read by a later one is an edge
    # between two kernels: it needs a boundary saying why.
    writers = {}
    missing = []
    for i, l in enumerate(launches):
        for bi in l.get("reads", []):
            for w in writers.get(bi, ()):
                if w != i and (w, i) not in pairs:
                    missing.append("launch %d -> launch %d via %s" % (
                        w, i, bufs[bi]["name"] if 0 <= bi < len(bufs) else "buffer %d" % bi))
        for bi in l.get("writes", []):
            writers.setdefault(bi, []).append(i)
    ck.check(not missing, "%s: %d edges between launches without a boundary, e.g. %s" % (
        tag, len(missing), "; ".join(missing[:3])))
    return reasons


def figure_checks(ck, name, level, r):
    tag = "%s --fusion %s" % (name, level)
    g, e, m = r.get("global_bytes", 0), r.get("eager_bytes", 0), r.get("min_bytes", 0)
    if ck.check(m > 0, "%s: min_bytes is %s (not reported?)" % (tag, m)):
        ck.check(m <= g, "%s: global_bytes %d under min_bytes %d" % (tag, g, m))
        ck.check(m <= e, "%s: eager_bytes %d under min_bytes %d" % (tag, e, m))
    ck.check(r.get("eager_kernels", 0) > 0, "%s: eager_kernels is 0" % tag)


MEMORY = ("workspace_bytes", "peak_bytes", "input_bytes", "output_bytes", "const_bytes")


def memory_checks(ck, name, level, r):
    """The memory figures of one answer (issue 24, item 2) against its
    buffer_list (--explain)."""
    tag = "%s --fusion %s" % (name, level)
    missing = [k for k in MEMORY if not isinstance(r.get(k), int)]
    if not ck.check(not missing, "%s: %s not reported" % (tag, ", ".join(missing))):
        return
    ws, peak, i, o, c = (r[k] for k in MEMORY)
    sums = {}
    for b in r.get("buffer_list", []):
        sums[b.get("kind")] = sums.get(b.get("kind"), 0) + b.get("bytes", 0)
    ck.check((i, o, c) == (sums.get("input", 0), sums.get("output", 0), sums.get("const", 0)),
             "%s: input/output/const bytes %d/%d/%d, the buffer list sums to %d/%d/%d" % (
                 tag, i, o, c, sums.get("input", 0), sums.get("output", 0), sums.get("const", 0)))
    ck.check(peak == i + o + c + ws, "%s: peak_bytes %d, not inputs %d + outputs %d + constants %d + "
             "workspace %d" % (tag, peak, i, o, c, ws))
    ck.check(peak >= ws and peak >= i + o, "%s: peak_bytes %d under the workspace %d or inputs + "
             "outputs %d" % (tag, peak, ws, i + o))
    ck.check(o > 0, "%s: output_bytes is 0" % tag)


def launches_with(r, node):
    return [i for i, l in enumerate(r.get("launch_list", [])) if node in l.get("nodes", [])]


def hint_checks(ck, client, d, base):
    """--fusion-barrier and --keep-whole reach the partitioner."""
    name = os.path.basename(d.rstrip("/"))
    # The barrier: the second distinct node of the launch with the most.
    best = None
    for l in base.get("launch_list", []):
        distinct = list(dict.fromkeys(l.get("nodes", [])))
        if len(distinct) >= 2 and (best is None or len(distinct) > len(best)):
            best = distinct
    if ck.check(best is not None, "%s --fusion apollo: no launch fuses two ONNX nodes" % name):
        node = best[1]
        r, err = submit(client, d, "apollo", ["--fusion-barrier", node])
        if ck.check(r is not None, "%s --fusion-barrier %s: %s" % (name, node, err)):
            hinted = [b for b in r.get("boundary_list", []) if b.get("reason") == "hint"]
            holding = set(launches_with(r, node))
            ck.check(any(b.get("consumer") in holding for b in hinted),
                     "%s --fusion-barrier %s: no boundary with reason \"hint\" into a launch "
                     "holding %s (hint boundaries: %d)" % (name, node, node, len(hinted)))
            ck.check(r["kernels"] > base["kernels"],
                     "%s --fusion-barrier %s: %d launches, as many as without it" % (name, node, r["kernels"]))
    r, err = submit(client, d, "apollo", ["--keep-whole", "ReduceMean"])
    if ck.check(r is not None, "%s --keep-whole ReduceMean: %s" % (name, err)):
        means = sorted({n for l in r.get("launch_list", []) for n in l.get("nodes", [])
                        if "ReduceMean" in n})
        ck.check(len(means) > 0, "%s --keep-whole ReduceMean: no launch names a ReduceMean node" % name)
        for n in means:
            at = launches_with(r, n)
            cats = [r["launch_list"][i].get("category") for i in at]
            ck.check(len(at) == 1 and cats == ["whole"],
                     "%s --keep-whole ReduceMean: %s is in launches %s of categories %s, "
                     "not in one launch of category \"whole\"" % (name, n, at, cats))


def ratio(a, b):
    return "%.3f" % (a / b) if b else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--client", required=True)
    ap.add_argument("--out")
    ap.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    ck = Checker()
    res = {}
    out = open(a.out, "w") if a.out else None
    for d in a.dirs:
        d = d.rstrip("/")
        name = os.path.basename(d)
        for level in LEVELS:
            r, err = submit(a.client, d, level)
            if not ck.check(r is not None, "%s --fusion %s: submit failed: %s" % (name, level, err)):
                continue
            res[(name, level)] = r
            if out:
                out.write(json.dumps({"dir": d, "level": level, "result": r}) + "\n")
            reasons = explain_checks(ck, name, level, r)
            r["_reasons"] = reasons
            figure_checks(ck, name, level, r)
            memory_checks(ck, name, level, r)
        ru, ap_ = res.get((name, "rules")), res.get((name, "apollo"))
        no = res.get((name, "none"))
        if no and ap_ and all(isinstance(x.get("peak_bytes"), int) for x in (no, ap_)):
            ck.check(ap_["peak_bytes"] <= no["peak_bytes"],
                     "%s: apollo's peak %d B more than none's %d B" % (name, ap_["peak_bytes"], no["peak_bytes"]))
        if ru and ap_:
            ck.check(ap_["kernels"] <= ru["kernels"],
                     "%s: apollo launches %d more than rules %d" % (name, ap_["kernels"], ru["kernels"]))
            ck.check(ap_["global_bytes"] <= ru["global_bytes"],
                     "%s: apollo global_bytes %d more than rules %d" % (name, ap_["global_bytes"], ru["global_bytes"]))
        if ap_ and name in TARGET_MODELS:
            k, e = ap_["kernels"], ap_["eager_kernels"]
            g, eb, m = ap_["global_bytes"], ap_["eager_bytes"], ap_["min_bytes"]
            ck.check(k <= KERNEL_RATIO * e,
                     "%s --fusion apollo: %d launches > %.2f x %d eager kernels" % (name, k, KERNEL_RATIO, e))
            ck.check(g - m <= TRAFFIC_RATIO * (eb - m),
                     "%s --fusion apollo: avoidable traffic %d B > %.1f x eager's %d B" % (
                         name, g - m, TRAFFIC_RATIO, eb - m))
        if ap_ and name in LAUNCH_TARGETS:
            ck.check(ap_["kernels"] <= LAUNCH_TARGETS[name],
                     "%s --fusion apollo: %d launches, target %d" % (name, ap_["kernels"], LAUNCH_TARGETS[name]))
        if ap_ and name in BEFORE_LAYERS:
            k0, g0 = BEFORE_LAYERS[name]
            g0 += ap_.get("const_bytes", 0)
            ck.check(ap_["kernels"] <= k0 and ap_["global_bytes"] <= g0,
                     "%s --fusion apollo: %d launches / %d B, more than before the fusion layers (%d / %d "
                     "with its constants read once)" % (name, ap_["kernels"], ap_["global_bytes"], k0, g0))
            layers = ap_.get("layers", {})
            ck.check(layers.get("II", 0) + layers.get("III", 0) > 0,
                     "%s --fusion apollo: no micro-graph changed by Layer II or III" % name)
        if ap_ and name == "mlp_gelu_ln":
            hint_checks(ck, a.client, d, ap_)
    if out:
        out.close()
    fmt = "%-24s %-6s %7s %6s %9s %12s %12s %12s %10s %9s %6s  %s"
    print(fmt % ("model", "level", "kernels", "eager", "k/eager", "global B", "eager B", "min B",
                 "global/min", "avoid.", "II/III", "boundaries by reason"))
    for d in a.dirs:
        name = os.path.basename(d.rstrip("/"))
        for level in LEVELS:
            r = res.get((name, level))
            if not r:
                continue
            g, eb, m = r["global_bytes"], r["eager_bytes"], r["min_bytes"]
            reasons = ", ".join("%s %d" % (k or "(none)", v) for k, v in sorted(r["_reasons"].items()))
            ly = r.get("layers", {})
            print(fmt % (name, level, r["kernels"], r["eager_kernels"], ratio(r["kernels"], r["eager_kernels"]),
                         g, eb, m, ratio(g, m), ratio(g - m, eb - m) if eb > m else "-",
                         "%d/%d" % (ly.get("II", 0), ly.get("III", 0)), reasons or "-"))
    print("avoid.: (global - min) / (eager - min), the share of eager's avoidable traffic left")
    fmt = "%-24s %-6s %12s %12s %12s %12s %10s"
    print(fmt % ("model", "level", "peak B", "workspace B", "inputs B", "outputs B", "consts B"))
    for d in a.dirs:
        name = os.path.basename(d.rstrip("/"))
        for level in LEVELS:
            r = res.get((name, level))
            if r and all(isinstance(r.get(k), int) for k in MEMORY):
                print(fmt % ((name, level) + tuple(r[k] for k in ("peak_bytes", "workspace_bytes",
                                                                  "input_bytes", "output_bytes",
                                                                  "const_bytes"))))
    print("peak: the device bytes one run holds (inputs + outputs + constants + workspace; weights not counted)")
    print("fusion_check: %d checks, %d failed" % (ck.n, ck.failed))
    return 1 if ck.failed else 0


if __name__ == "__main__":
    sys.exit(main())
