#!/bin/sh
# attention_memory.sh [ARGS...] -- bench/attention_memory.py against a
# private apollod (build/ by default, APOLLO_BUILD to override): Apollo's
# attention bundles' peak bytes beside eager PyTorch's, S = 512 ... 8192.
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc
ap_start
APOLLO_LIB=$APOLLO_BUILD/libapollo-client.so "$REPO/.venv/bin/python" bench/attention_memory.py "$@"
