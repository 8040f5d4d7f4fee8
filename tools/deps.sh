#!/bin/sh
# deps.sh [demo] -- install what Apollo needs and is missing; do nothing
# when all is there.
#   deps.sh        (make deps, make check) everything the tests use: Debian
#                  packages through apt-get; Python tooling (onnx,
#                  onnxruntime, numpy; torch, torchvision, transformers,
#                  onnxscript) into the project's own virtual environment
#                  .venv; where no CUDA toolkit is present, the
#                  nvidia-cuda-nvrtc wheel into the same .venv so that
#                  apollod can still dlopen NVRTC.
#   deps.sh demo   (make demo) only what building the daemon and the client
#                  needs, and onnx, onnxruntime, numpy (the demo's
#                  comparison with onnxruntime): no PyTorch, no test tools.
set -e
cd "$(dirname "$0")/.."
MODE=${1:-all}
# Building apollod and apollo-client.
PKGS="build-essential pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler libisl-dev libsqlite3-dev libssl-dev libhiredis-dev python3-venv"
# Only the tests use these: the Check library (the C suites), a real Redis
# and curl (check_redis, cluster.sh, /metrics), clang and its sanitizer
# runtimes (make fuzz), chromium rendering the --explain-html pages
# headless (tests/explain_html.sh).
[ "$MODE" = demo ] || PKGS="$PKGS check redis-server curl clang libclang-rt-dev chromium"
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "deps: installing$missing"
	SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
PY=${PYTHON:-python3}
# pip keeps no copy of the wheels it downloads (PyPI's torch brings about
# 3 GB of CUDA wheels; a cached copy would double what the install needs).
PIP=".venv/bin/pip install -q --no-cache-dir"
# Says how much room is left where the venv goes when an install fails.
pip_failed() {
	echo "deps: pip could not install $1; free space under $(pwd):" >&2
	df -h . >&2 || true
	exit 1
}
if [ ! -x .venv/bin/python ]; then
	echo "deps: creating .venv"
	$PY -m venv .venv
fi
if ! .venv/bin/python -c "import onnx, onnxruntime, numpy" 2>/dev/null; then
	echo "deps: installing onnx onnxruntime numpy into .venv"
	$PIP onnx onnxruntime numpy || pip_failed "onnx onnxruntime numpy"
fi
[ "$MODE" = demo ] && exit 0
# PyTorch for the PyTorch backend's tests (tests/torch.sh) and the ONNX
# exports of real architectures (tests/export_models.py): torch,
# torchvision, transformers and onnxscript (torch.onnx's newer exporter),
# all from PyPI.
# Only the tests use them.
if ! .venv/bin/python -c "import torch, torchvision, transformers, onnxscript" 2>/dev/null; then
	echo "deps: installing torch, torchvision, transformers, onnxscript into .venv (the PyTorch tests and model exports)"
	# PyTorch's CPU-only wheels (about 0.2 GB against PyPI's 6 GB installed
	# with the CUDA wheels and triton) where its index is reachable; else
	# PyPI's torch with only the CUDA wheels the system's toolkit lacks
	# (tools/torch_lean.py: about 2 GB); else PyPI's full set.
	if ! .venv/bin/python -c "import torch, torchvision" 2>/dev/null; then
		$PIP --retries 0 --timeout 10 --index-url https://download.pytorch.org/whl/cpu torch torchvision 2>/dev/null ||
			.venv/bin/python tools/torch_lean.py ||
			$PIP torch torchvision || pip_failed "torch torchvision"
	fi
	$PIP transformers onnxscript || pip_failed "transformers onnxscript"
fi
# NVRTC for CUDA 12 beside the system's CUDA 13 (or the wheel of 13): the
# daemon keeps every major it finds and answers a request from a CUDA 12
# driver (R525-R570) with CUDA 12 cubins (driver negotiation, backend.h).
if ! ls .venv/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 >/dev/null 2>&1; then
	echo "deps: installing nvidia-cuda-nvrtc-cu12 into .venv (NVRTC 12 for CUDA 12 drivers)"
	$PIP nvidia-cuda-nvrtc-cu12 || echo "deps: nvidia-cuda-nvrtc-cu12 unavailable; CUDA 12 drivers will be refused"
fi
# nvdisasm (6 MB) for the SASS the tests and bench/gemm_sass.py read (HGMMA,
# HMMA per issued instruction): PyPI's wheel, NVIDIA's own disassembler
if ! ls .venv/lib/python3*/site-packages/nvidia/*/bin/nvdisasm >/dev/null 2>&1; then
	$PIP nvidia-cuda-nvdisasm || echo "deps: nvidia-cuda-nvdisasm unavailable; SASS is not read"
fi
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if ! ls "$CUDA_HOME"/lib64/libnvrtc.so.* >/dev/null 2>&1; then
	if ! ls .venv/lib/python3*/site-packages/nvidia/cu*/lib/libnvrtc.so.* >/dev/null 2>&1 &&
	   ! ls .venv/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.* >/dev/null 2>&1; then
		echo "deps: no CUDA toolkit at $CUDA_HOME: installing the nvidia-cuda-nvrtc wheel into .venv"
		$PIP nvidia-cuda-nvrtc || echo "deps: nvidia-cuda-nvrtc unavailable; GPU targets will answer an error"
	fi
fi
exit 0
