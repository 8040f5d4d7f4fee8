"""torch_lean.py -- install PyTorch from PyPI into this venv without the CUDA
wheels the machine already has.

PyPI's Linux torch wheel depends on about 3 GB (compressed) of NVIDIA wheels
plus triton; installed they take 4-5 GB, and a CI machine with a few GB of free
disk cannot hold them.  Apollo's tests use PyTorch on the CPU only, so the
CUDA libraries matter only in that libtorch_cuda.so must load.  This script:

  1. installs torch and torchvision with --no-deps, then every requirement of
     theirs that is not a CUDA wheel (sympy, networkx, jinja2, ...) normally;
  2. imports torch in a child process; while that fails for a CUDA library
     (a missing libX.so, or an undefined symbol of an older system copy), it
     installs the one NVIDIA wheel torch's metadata pins for that library
     (--no-deps), and tries again.

Libraries the system's CUDA toolkit provides (/usr/local/cuda through
ldconfig) are used as they are; triton is not installed (Inductor's CPU path
does not use it).  Exit status 0 when `import torch, torchvision` works and a
tensor adds up, 1 otherwise: tools/deps.sh then installs PyPI's full set.

Method: the wheels' own metadata (Requires-Dist, PEP 508 markers evaluated
with packaging) and the dynamic loader's error text; nothing is pinned here.
"""
import os
import re
import subprocess
import sys
import tempfile
import zipfile

# --no-warn-conflicts: pip would list every CUDA wheel left out as a conflict.
PIP = [sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-warn-conflicts"]


def say(msg):
    print("torch_lean: " + msg, flush=True)


def pip(*args):
    return subprocess.call(PIP + list(args)) == 0


def is_cuda_wheel(name):
    n = name.lower().replace("_", "-")
    return n.startswith("nvidia-") or n.startswith("cuda-") or n == "triton"


def requirements(dist, extras=("",)):
    """The requirements of installed distribution dist that apply here."""
    from importlib.metadata import requires
    from packaging.requirements import Requirement
    out = []
    for s in requires(dist) or []:
        r = Requirement(s)
        if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras):
            out.append(r)
    return out


def wheel_requirements(req):
    """Requirements of a wheel not installed (cuda-toolkit's metapackage):
    its METADATA read from a --no-deps download, markers evaluated for the
    extras req asks for."""
    from packaging.requirements import Requirement
    with tempfile.TemporaryDirectory() as d:
        if subprocess.call([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--no-cache-dir", "-d", d, str(req.name) + str(req.specifier)]) != 0:
            return []
        out = []
        for whl in os.listdir(d):
            with zipfile.ZipFile(os.path.join(d, whl)) as z:
                meta = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
                for line in z.read(meta[0]).decode().splitlines():
                    if line.startswith("Requires-Dist:"):
                        r = Requirement(line.split(":", 1)[1].strip())
                        if r.marker is None or any(r.marker.evaluate({"extra": e})
                                                   for e in req.extras):
                            out.append(r)
        return out


def key(name):
    """nvidia-cusparselt-cu13 -> cusparselt; nvidia-cuda-runtime -> cudaruntime."""
    n = name.lower().replace("_", "-")
    n = re.sub(r"^nvidia-", "", n)
    n = re.sub(r"-cu\d+$", "", n)
    return n.replace("-", "")


# A library (or a symbol prefix) named differently from its wheel.
ALIAS = {"cudart": "cudaruntime", "cuda": "cudaruntime", "cublaslt": "cublas",
         "nvshmemhost": "nvshmem", "nvrtc": "cudanvrtc", "cupti": "cudacupti",
         "nvtoolsext": "nvtx", "cusparselt": "cusparselt"}


def wanted(err):
    """The wheel key an import error asks for, or None."""
    m = re.search(r"lib([A-Za-z0-9_]+?)\.so[.\d]*: cannot open shared object", err)
    if m:
        k = m.group(1).lower().replace("_", "")
        return ALIAS.get(k, k)
    m = re.search(r"undefined symbol: _*([a-z]+)([A-Z][a-z]+)?", err)
    if m:
        k = m.group(1) + ("lt" if m.group(2) == "Lt" else "")
        return ALIAS.get(k, k)
    return None


def try_import():
    p = subprocess.run([sys.executable, "-c",
                        "import torch, torchvision\n"
                        "assert float((torch.ones(3) + 1).sum()) == 6.0"],
                       capture_output=True, text=True)
    return p.returncode == 0, p.stderr


def main():
    if not pip("packaging") or not pip("--no-deps", "torch", "torchvision"):
        return 1
    reqs = requirements("torch") + requirements("torchvision")
    plain = sorted({str(r) for r in reqs if not is_cuda_wheel(r.name)
                    and r.name.lower() not in ("torch", "torchvision")})
    if plain and not pip(*plain):
        return 1
    pool = {}
    for r in reqs:
        if r.name.lower() == "cuda-toolkit":
            for s in wheel_requirements(r):
                pool.setdefault(key(s.name), s)
        elif r.name.lower().startswith("nvidia-"):
            pool.setdefault(key(r.name), r)
    last, added = None, []
    while True:
        ok, err = try_import()
        if ok:
            say("torch imports; NVIDIA wheels installed: %s (the rest from the system)"
                % (", ".join(added) or "none"))
            return 0
        k = wanted(err)
        if k is None or k not in pool or k == last:
            say("cannot resolve: " + (err.strip().splitlines() or ["?"])[-1])
            return 1
        r = pool.pop(k)
        say("installing %s (the system's copy is missing or too old)" % r.name)
        if not pip("--no-deps", r.name + str(r.specifier)):
            return 1
        added.append(r.name)
        last = k


if __name__ == "__main__":
    sys.exit(main())
