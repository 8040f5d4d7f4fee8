#!/usr/bin/env python3
"""sass_check.py -- which kernels of a bundle run on the tensor cores, read
from their SASS.

    sass_check.py BUNDLE.pb EXPLAIN.txt --need OPCODE [--emitters gemm,attention]
                  [--nvdisasm PATH]

BUNDLE.pb is what `apollo-client submit --format cubin -o` wrote and
EXPLAIN.txt what its --explain printed beside it.  Each cubin in the
bundle is disassembled with nvdisasm (PyPI's nvidia-cuda-nvdisasm in the
project's .venv by default); every kernel that --explain says an emitter
of --emitters built must hold OPCODE (e.g. HGMMA: wgmma on sm_90a) in its
SASS.  Prints one line per checked kernel and a summary; exits 1 when a
kernel lacks it, 2 when nothing could be checked.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from gemm_sass import cubins  # noqa: E402


def emitters_of(explain):
    """Kernel name -> the emitters --explain names under its launch."""
    out, cur = {}, None
    for line in explain.splitlines():
        m = re.match(r"\s*launch \d+ (\S+) ", line)
        if m:
            cur = m.group(1)
            out.setdefault(cur, set())
            continue
        m = re.match(r"\s*emitter (\w+):", line)
        if m and cur:
            out[cur].add(m.group(1))
    return out


def functions(nvdisasm, blob):
    """Function name -> its SASS text, for one cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(blob)
        f.flush()
        text = subprocess.run([nvdisasm, "-c", f.name], check=True, capture_output=True, text=True).stdout
    parts = re.split(r"//-+ \.text\.(\S+)\s+-+", text)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("explain")
    ap.add_argument("--need", required=True)
    ap.add_argument("--emitters", default="gemm,attention")
    ap.add_argument("--nvdisasm", default=None)
    a = ap.parse_args()
    tool = a.nvdisasm or next(iter(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".venv",
                                                          "lib", "python3*", "site-packages", "nvidia", "*", "bin",
                                                          "nvdisasm"))), None)
    if not tool:
        print("sass_check: no nvdisasm (pip install nvidia-cuda-nvdisasm into .venv, or --nvdisasm)")
        return 2
    want = set(a.emitters.split(","))
    with open(a.explain) as f:
        ems = emitters_of(f.read())
    with open(a.bundle, "rb") as f:
        data = f.read()
    checked = bad = 0
    for blob in cubins(data):
        for name, sass in functions(tool, blob).items():
            if not (ems.get(name, set()) & want):
                continue
            n = len(re.findall(r"\b%s\b" % re.escape(a.need), sass))
            checked += 1
            bad += n == 0
            print("sass_check: %s (%s): %d %s%s" % (name, ",".join(sorted(ems[name])), n, a.need,
                                                    "" if n else "  MISSING"))
    print("sass_check: %d kernels checked, %d without %s" % (checked, bad, a.need))
    return 2 if checked == 0 else 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
