#!/usr/bin/env python3
"""torch_train.py -- training-step time of the sweep's models: eager
PyTorch, torch.compile with Inductor, torch.compile with Apollo (target
cpu), in one process on the same batches.

    torch_train.py [--models M,M...] [--steps 5] [--warmup 2]
                   [--dtype float32|float64] [--json OUT] [--no-inductor]

Needs apollod at $APOLLO_SOCKET and the apollo package importable
(bench/torch_train.sh starts a private daemon and sets both).  MODEL: the
models of bench/torch_sweep.py, in its configurations (random weights,
dropout as the libraries make it); --models all for every one.  The
default set (DEFAULT below) keeps a run to a few minutes on 2 cores.

Per model, one training step is forward, backward, AdamW (lr 1e-3) and
zero_grad on one batch, the same batch every step; each way starts from
the same initial weights.  Printed:

  eager       the median of --steps steps after --warmup steps
  inductor    torch.compile(backend="inductor"): the first step (Dynamo,
              AOTAutograd, Inductor's C++ compile: cold, Inductor's caches
              in the folder $TORCHINDUCTOR_CACHE_DIR, which
              bench/torch_train.sh makes empty), the first step again after
              torch._dynamo.reset() (warm: Inductor's FX graph cache), and
              the median after warm-up; where Inductor cannot compile on
              this machine (no C++ compiler, ...), why
  apollo      torch.compile(backend="apollo", target cpu), in a cache
              namespace of its own (apollo-bench-PID-TIME: the daemon's
              cache has nothing for it, a cold start); the first step
              (cold: each graph compiled by the daemon), the first step
              again after torch._dynamo.reset() (warm: every graph from the
              daemon's cache), the median after warm-up, and the graph
              breaks (Dynamo's and the backend's) with the graphs and parts
              run eagerly
  ratio       each time / eager's median measured in this run (below 1:
              faster than eager)

Prints numbers, asserts nothing (bench/torch_sweep.py and tests/torch.sh
check the values); exits 1 only when a model cannot be built or run in
eager PyTorch.
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_sweep  # noqa: E402  (the models and their batches)

DEFAULT = ["resnet18", "vit_b_16", "gpt2", "bert", "t5", "whisper"]


def _first_line(e):
    s = str(e).strip().splitlines()
    return "%s: %s" % (type(e).__name__, s[0][:160] if s else "")


def _steps(step, n):
    """Times n calls of step(), in seconds."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def _trainer(model, fn, batch):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        loss = fn(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return step


def _breaks(backend):
    from torch._dynamo.utils import counters
    dyn = sum(counters["graph_break"].values())
    st = backend.stats()
    return dyn, st


def measure(name, args, namespace):
    import apollo.torch_backend as backend
    from torch._dynamo.utils import counters
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    base, batch = torch_sweep.build(name, dropout=True)
    base = base.to(dtype).train()
    b = batch(torch.Generator().manual_seed(1))
    b = tuple(t.to(dtype) if t.is_floating_point() else t for t in b)
    row = {"model": name, "params": sum(p.numel() for p in base.parameters()), "dtype": args.dtype}

    # eager
    model = copy.deepcopy(base)
    step = _trainer(model, model, b)
    _steps(step, args.warmup)
    row["eager_ms"] = 1e3 * statistics.median(_steps(step, args.steps))
    del model, step

    # inductor: cold first step, warm first step (after a dynamo reset), median
    if args.no_inductor:
        row["inductor_error"] = "not run (--no-inductor)"
    else:
        try:
            torch._dynamo.reset()
            model = copy.deepcopy(base)
            step = _trainer(model, torch.compile(model, backend="inductor"), b)
            row["inductor_first_s"] = _steps(step, 1)[0]
            torch._dynamo.reset()
            model = copy.deepcopy(base)
            step = _trainer(model, torch.compile(model, backend="inductor"), b)
            row["inductor_warm_s"] = _steps(step, 1)[0]
            _steps(step, args.warmup)
            row["inductor_ms"] = 1e3 * statistics.median(_steps(step, args.steps))
        except Exception as e:  # e.g. no C++ compiler: say why in the table
            row["inductor_error"] = _first_line(e)
            if args.verbose:
                traceback.print_exc()
        finally:
            torch._dynamo.reset()

    # apollo: cold (a namespace of its own), warm (the same graphs again
    # from the daemon's cache after a dynamo reset), median
    opts = {"target": "cpu", "namespace": namespace, "quiet": not args.verbose}
    try:
        torch._dynamo.reset()
        counters.clear()
        backend.reset_stats()
        model = copy.deepcopy(base)
        step = _trainer(model, torch.compile(model, backend="apollo", options=opts), b)
        row["apollo_first_s"] = _steps(step, 1)[0]
        dyn, st = _breaks(backend)
        row.update(dynamo_breaks=dyn, apollo_breaks=len(st["graph_breaks"]), graphs=st["graphs"],
                   cold_hits=st["cache_hits"], eager_graphs=st["eager_graphs"], eager_parts=st["eager_parts"],
                   daemon_s=st["compile_ms"] / 1e3, break_reasons=sorted(set(st["graph_breaks"])))
        torch._dynamo.reset()
        backend.reset_stats()
        model = copy.deepcopy(base)
        step = _trainer(model, torch.compile(model, backend="apollo", options=opts), b)
        row["apollo_warm_s"] = _steps(step, 1)[0]
        st = backend.stats()
        row.update(warm_graphs=st["graphs"], warm_hits=st["cache_hits"])
        _steps(step, args.warmup)
        row["apollo_ms"] = 1e3 * statistics.median(_steps(step, args.steps))
    except Exception as e:
        row["apollo_error"] = _first_line(e)
        if args.verbose:
            traceback.print_exc()
    finally:
        torch._dynamo.reset()
    return row


def _ms(row, key):
    v = row.get(key)
    if v is None:
        return "-"
    return "%.1f (%.2f)" % (v, v / row["eager_ms"])


def _s(row, key):
    v = row.get(key)
    return "-" if v is None else "%.1f" % v


def table(rows):
    head = ("model", "params", "eager ms", "inductor ms", "apollo ms", "ind. 1st cold/warm s",
            "apollo 1st cold/warm s", "breaks")
    lines = []
    for r in rows:
        if "error" in r:
            lines.append((r["model"], "-", "FAILED: " + r["error"], "", "", "", "", ""))
            continue
        brk = "-"
        if "graphs" in r:
            brk = "%d" % (r["dynamo_breaks"] + r["apollo_breaks"])
            if r["eager_graphs"] or r["eager_parts"]:
                brk += " (%d eager graphs, %d parts)" % (r["eager_graphs"], r["eager_parts"])
        lines.append((r["model"], "%.1fM" % (r["params"] / 1e6), "%.1f" % r["eager_ms"],
                      _ms(r, "inductor_ms") if "inductor_error" not in r else "n/a (see below)",
                      _ms(r, "apollo_ms") if "apollo_error" not in r else "FAILED (see below)",
                      "%s / %s" % (_s(r, "inductor_first_s"), _s(r, "inductor_warm_s")),
                      "%s / %s" % (_s(r, "apollo_first_s"), _s(r, "apollo_warm_s")), brk))
    width = [max(len(str(x[i])) for x in lines + [head]) for i in range(len(head))]
    out = ["  ".join(str(h).ljust(w) for h, w in zip(head, width))]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(ln, width)) for ln in lines]
    return "\n".join(s.rstrip() for s in out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(DEFAULT),
                    help="comma-separated, or 'all' (default: %s)" % ",".join(DEFAULT))
    ap.add_argument("--steps", type=int, default=5, help="timed steps (the median is shown)")
    ap.add_argument("--warmup", type=int, default=2, help="steps before the timed ones")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--no-inductor", action="store_true", help="skip Inductor")
    ap.add_argument("--json", help="one JSON object per model, one a line")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    names = torch_sweep.MODELS if a.models == "all" else [m for m in a.models.split(",") if m]
    known = torch_sweep.MODELS + torch_sweep.SMALL
    for n in names:
        if n not in known:
            ap.error("unknown model %r (%s)" % (n, ", ".join(known)))
    import apollo.torch_backend  # noqa: F401  (registers the backend)
    namespace = "apollo-bench-%d-%d" % (os.getpid(), int(time.time()))
    print("bench/torch_train: %s, %d timed steps after %d (median), torch %s with %d threads, target cpu, "
          "daemon cache namespace %s" % (a.dtype, a.steps, a.warmup, torch.__version__, torch.get_num_threads(),
                                         namespace), flush=True)
    rows, ok = [], True
    for n in names:
        t0 = time.perf_counter()
        try:
            r = measure(n, a, namespace)
        except Exception as e:
            traceback.print_exc()
            r = {"model": n, "error": _first_line(e)}
            ok = False
        r["bench_s"] = time.perf_counter() - t0
        rows.append(r)
        print("  %s: %.0f s%s" % (n, r["bench_s"], "" if "error" in r else
                                  "; apollo: %d graphs, daemon %.1f s cold, warm %d of %d from the cache"
                                  % (r.get("graphs", 0), r.get("daemon_s", 0.0), r.get("warm_hits", 0),
                                     r.get("warm_graphs", 0))), flush=True)
    print()
    print("Training step (forward, backward, AdamW), %s; in brackets the time / eager's median "
          "(below 1: faster)." % a.dtype)
    print("1st: the first step, Dynamo and the compile included: cold (nothing cached), warm (after "
          "torch._dynamo.reset(): Inductor's FX graph cache, the daemon's cache).")
    print(table(rows))
    notes = []
    for r in rows:
        if r.get("inductor_error"):
            notes.append("%s: inductor: %s" % (r["model"], r["inductor_error"]))
        if r.get("apollo_error"):
            notes.append("%s: apollo: %s" % (r["model"], r["apollo_error"]))
        for b in r.get("break_reasons", []):
            notes.append("%s: graph break: %s" % (r["model"], b))
        if r.get("dynamo_breaks"):
            notes.append("%s: %d Dynamo graph breaks" % (r["model"], r["dynamo_breaks"]))
    for line in notes:
        print("  " + line)
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
