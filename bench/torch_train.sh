#!/bin/sh
# bench/torch_train.sh [torch_train.py ARGS...] -- training-step time of the
# real models of bench/torch_sweep.py: eager PyTorch, torch.compile with
# Inductor and torch.compile(backend="apollo") on target cpu, the first
# step cold and warm, graph breaks (bench/torch_train.py, whose comment
# says what each column is).  Starts a private apollod (a temporary socket
# and an empty cache, tests/daemon.inc) and gives Inductor an empty cache
# folder of its own, so that both cold first steps are cold; the warm ones
# come from those caches after torch._dynamo.reset().
#   ARGS: --models M,M... (default: a set that runs in a few minutes on 2
#   cores; --models all: every model of the sweep), --steps, --warmup,
#   --dtype, --no-inductor, --json OUT.
#   env: APOLLO_BUILD (default build/).
# Needs torch, torchvision and transformers in .venv (make deps).  Prints
# numbers, asserts nothing.
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

PY=$REPO/.venv/bin/python
if ! "$PY" -c 'import torch, torchvision, transformers' 2>/dev/null; then
	echo "bench/torch_train: needs torch, torchvision and transformers in $REPO/.venv (make deps)"
	exit 1
fi
ap_start >/dev/null
APOLLO_LIB=$APOLLO_BUILD/libapollo-client.so
PYTHONPATH=$REPO/client/python${PYTHONPATH:+:$PYTHONPATH}
TORCHINDUCTOR_CACHE_DIR=$AP_TMP/inductor
export APOLLO_LIB PYTHONPATH TORCHINDUCTOR_CACHE_DIR
"$PY" bench/torch_train.py "$@" 2>"$AP_TMP/torch_train.err"
st=$?
# Python's and the libraries' warnings stay out of the table; an error shows
[ $st -eq 0 ] || grep -v 'Warning\|warnings.warn' "$AP_TMP/torch_train.err" | tail -20
exit $st
