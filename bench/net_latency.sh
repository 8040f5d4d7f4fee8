#!/bin/sh
# net_latency.sh [BUILD] [NODES] [PINGS] -- ping round trips of apollod with
# and without big compile requests in flight from another client.
#
# Builds bench/net_latency.c by hand against BUILD's libraries (default
# build/), starts BUILD/apollod (or $APOLLOD) on a temporary socket, runs
# the measurement and stops the daemon.  NODES (default 400000) is the
# length of the Relu chain in each big request (about 14 MiB a frame),
# PINGS (default 2000) the pings per phase.  Prints p50 / p99 in
# microseconds for each phase and the loaded/idle ratios.
set -e
BUILD=${1:-build}
NODES=${2:-400000}
PINGS=${3:-2000}
CC=${CC:-cc}
APOLLOD=${APOLLOD:-$BUILD/apollod}
dir=$(mktemp -d /tmp/apollo-netlat-XXXXXX)
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
$CC -std=c11 -D_GNU_SOURCE -O2 -pthread -I"$BUILD/proto" -I. -o "$dir/net_latency" \
	bench/net_latency.c "$BUILD/libapcommon.a" -lprotobuf-c -lm
"$APOLLOD" --socket "$dir/s" --cache "$dir/cache.db" --workers 2 --foreground \
	--log-level warn >"$dir/log" 2>&1 &
pid=$!
i=0
while [ ! -S "$dir/s" ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done
"$dir/net_latency" "$dir/s" "$NODES" "$PINGS"
kill -TERM $pid
wait $pid
