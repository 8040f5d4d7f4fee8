#!/bin/sh
# cluster.sh -- a local two-node Apollo cluster: one redis-server and two
# apollods sharing it, each with its own socket and local cache, as two
# GPU nodes would.  For trying the shared cache out, and for
# tests/cluster.sh.
#
#   deploy/cluster.sh start DIR [APOLLOD FLAGS...]
#       creates DIR, a cluster secret DIR/secret (mode 600), starts
#       redis-server on the Unix socket DIR/redis.sock (no persistence,
#       maxmemory 256mb allkeys-lru) and apollod twice:
#         node 1: socket DIR/node1/apollod.sock, cache DIR/node1/cache.db
#         node 2: socket DIR/node2/apollod.sock, cache DIR/node2/cache.db
#       both with --redis unix:DIR/redis.sock --redis-secret-file DIR/secret
#       and the extra flags; logs in DIR/*.log, pids in DIR/*.pid.  Waits
#       until both answer a ping, then prints how to reach them.
#   deploy/cluster.sh stop DIR          SIGTERM to both daemons, then Redis
#   deploy/cluster.sh redis-stop DIR    stops Redis only (the daemons go on)
#   deploy/cluster.sh redis-start DIR   starts it again on the same socket
#
# Environment: APOLLOD (default: build/apollod beside this script's
# repository), APOLLO_CLIENT (build/apollo-client), REDIS_SERVER
# (redis-server from PATH).  On real nodes, point every apollod at the
# same Redis with the same secret file and namespace (deploy/redis.md).
set -e
here=$(cd "$(dirname "$0")/.." && pwd)
APOLLOD=${APOLLOD:-$here/build/apollod}
APOLLO_CLIENT=${APOLLO_CLIENT:-$here/build/apollo-client}
REDIS_SERVER=${REDIS_SERVER:-redis-server}

usage() {
	sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
}

[ $# -ge 2 ] || usage
cmd=$1
dir=$2
shift 2

wait_for() {   # wait_for WHAT COMMAND...: up to 10 s
	what=$1
	shift
	i=0
	until "$@" >/dev/null 2>&1; do
		i=$((i + 1))
		if [ $i -gt 200 ]; then
			echo "cluster: $what did not start; see $dir/*.log" >&2
			exit 1
		fi
		sleep 0.05
	done
}

redis_start() {
	"$REDIS_SERVER" --port 0 --unixsocket "$dir/redis.sock" --unixsocketperm 600 \
		--save '' --appendonly no --maxmemory 256mb --maxmemory-policy allkeys-lru \
		--logfile "$dir/redis.log" --daemonize no >/dev/null 2>&1 &
	echo $! >"$dir/redis.pid"
	wait_for redis-server redis-cli -s "$dir/redis.sock" ping
}

stop_pid() {   # stop_pid FILE: SIGTERM, wait for the process to go
	[ -f "$1" ] || return 0
	pid=$(cat "$1")
	rm -f "$1"
	kill -TERM "$pid" 2>/dev/null || return 0
	i=0
	while kill -0 "$pid" 2>/dev/null && [ $i -lt 300 ]; do
		sleep 0.05
		i=$((i + 1))
	done
}

case $cmd in
start)
	mkdir -p "$dir/node1" "$dir/node2"
	chmod 700 "$dir" "$dir/node1" "$dir/node2"
	if [ ! -s "$dir/secret" ]; then
		umask 077
		head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret"
		chmod 600 "$dir/secret"
	fi
	redis_start
	for n in 1 2; do
		"$APOLLOD" --socket "$dir/node$n/apollod.sock" --cache "$dir/node$n/cache.db" \
			--redis "unix:$dir/redis.sock" --redis-secret-file "$dir/secret" \
			"$@" >"$dir/node$n.log" 2>&1 &
		echo $! >"$dir/node$n.pid"
	done
	for n in 1 2; do
		wait_for "apollod node $n" "$APOLLO_CLIENT" --socket "$dir/node$n/apollod.sock" ping
	done
	echo "cluster: redis unix:$dir/redis.sock; node 1 $dir/node1/apollod.sock; node 2 $dir/node2/apollod.sock"
	echo "  apollo-client --socket $dir/node1/apollod.sock submit MODEL.onnx --json"
	;;
stop)
	stop_pid "$dir/node1.pid"
	stop_pid "$dir/node2.pid"
	stop_pid "$dir/redis.pid"
	;;
redis-stop)
	stop_pid "$dir/redis.pid"
	;;
redis-start)
	redis_start
	;;
*)
	usage
	;;
esac
