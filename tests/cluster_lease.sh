#!/bin/sh
# cluster_lease.sh -- one compile per cold graph across the cluster (issue
# 26, item 1): one redis-server and 8 apollods sharing it (their own
# sockets and L1 caches, --redis-lease-ms 3000), 8 clients each.
#   1. all 64 clients submit the same cold graph at once (bert_like_2l, at
#      sm_90 when NVRTC loads, else cpu): the kernels compiled over the
#      whole cluster (each daemon's kernels_compiled, stats --json) are the
#      graph's distinct kernels, and every client gets the same bundle
#      (the same kernel blob digests, read from the bundles themselves);
#   2. a 9th daemon (--redis-lease-ms 1000) takes the lease of another
#      cold graph (mlp_gelu_ln) and is SIGKILLed while it holds it
#      (APOLLO_TEST_LEASE_HOLD_MS keeps it from compiling), 64 clients of
#      the 8 others waiting: its lease lapses, one of them takes it over
#      and compiles, and every client gets the same bundle;
#   3. two different cold graphs that share every kernel (squeezenet1_1
#      under two namespaces, odd daemons' clients asking for one, even
#      daemons' for the other) at once: each kernel is compiled once in
#      the cluster (kernel leases, server/compile/kernels.c), no wait
#      reaching its bound, and every client gets the same kernel blobs;
#   4. Redis stopped: every client still gets an answer (each daemon
#      compiles the graph once, alone; no lease taken or waited on).
# The background tuner is off (its variant builds would count as compiles).
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc
PY=python3
[ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
C=$AP_TMP/lease
N=8
BERT=$TESTDATA/models/bert_like_2l
MLP=$TESTDATA/models/mlp_gelu_ln
SQUEEZE=$TESTDATA/models/squeezenet1_1
PIDS=
REDIS_PID=
SPLIT_NS=

stop_all() {
	for p in $PIDS; do
		kill -TERM "$p" 2>/dev/null
	done
	for p in $PIDS; do
		wait "$p" 2>/dev/null
	done
	[ -z "$REDIS_PID" ] || { kill -TERM "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null; }
	rm -rf "$AP_TMP"
}
trap stop_all EXIT

fail() {
	echo "cluster_lease: FAILED: $*"
	for f in "$C"/node*.log; do
		echo "--- $f"
		tail -8 "$f"
	done
	exit 1
}

mkdir -p "$C" && chmod 700 "$C"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$C/secret"
chmod 600 "$C/secret"
redis-server --port 0 --unixsocket "$C/redis.sock" --unixsocketperm 600 --save '' \
	--appendonly no --logfile "$C/redis.log" >/dev/null 2>&1 &
REDIS_PID=$!

# node I [ENV=VALUE...]: starts daemon I in the background, its lease
# lasting $LEASE_MS
LEASE_MS=3000
node() {
	i=$1
	shift
	mkdir -p "$C/node$i" && chmod 700 "$C/node$i"
	env "$@" "$APOLLOD" --socket "$C/node$i/s" --cache "$C/node$i/cache.db" \
		--redis "unix:$C/redis.sock" --redis-secret-file "$C/secret" \
		--redis-lease-ms "$LEASE_MS" --redis-timeout-ms 300 --redis-breaker-failures 2 --workers 2 \
		--no-tune-refine --no-tune-measure >"$C/node$i.log" 2>&1 &
	PIDS="$PIDS $!"
	eval "PID$i=$!"
}

up() {   # up I: waits until daemon I answers
	k=0
	until "$CLIENT" --socket "$C/node$1/s" ping >/dev/null 2>&1; do
		k=$((k + 1))
		[ $k -lt 200 ] || fail "daemon $1 did not start"
		sleep 0.05
	done
}

k=0
until redis-cli -s "$C/redis.sock" ping >/dev/null 2>&1; do
	k=$((k + 1))
	[ $k -lt 200 ] || fail "redis-server did not start"
	sleep 0.05
done
i=1
while [ $i -le $N ]; do
	node $i
	i=$((i + 1))
done
i=1
while [ $i -le $N ]; do
	up $i
	i=$((i + 1))
done
TARGET=cpu
grep -q "NVRTC .* loaded" "$C/node1.log" && TARGET=sm_90

# stats: one JSON object per line, daemon 1..N
stats() {
	i=1
	while [ $i -le $N ]; do
		"$CLIENT" --socket "$C/node$i/s" stats --json || echo '{}'
		i=$((i + 1))
	done
}

# submit_all CASE MODEL_DIR [FLAGS]: 8 clients per daemon at once, each
# writing CASE-I-J.json and CASE-I-J.pb; waits for all.  With $SPLIT_NS
# set, daemon I's clients add --namespace $SPLIT_NS<I mod 2>.
submit_all() {
	c=$1 m=$2
	shift 2
	clients=
	i=1
	while [ $i -le $N ]; do
		j=1
		ns=
		[ -z "$SPLIT_NS" ] || ns="--namespace $SPLIT_NS$((i % 2))"
		while [ $j -le 8 ]; do
			# shellcheck disable=SC2086 # $ns: none, or a flag and its value
			"$CLIENT" --socket "$C/node$i/s" submit "$m/model.onnx" --data "$m" --json \
				-o "$C/$c-$i-$j.pb" $ns "$@" >"$C/$c-$i-$j.json" 2>"$C/$c-$i-$j.err" &
			clients="$clients $!"
			j=$((j + 1))
		done
		i=$((i + 1))
	done
	for p in $clients; do
		wait "$p"
	done
}

# check CASE BEFORE AFTER WANT: every client answered, one bundle, and
# the kernels compiled over the cluster (AFTER - BEFORE) as WANT says
check() {
	"$PY" - "$C" "$1" "$2" "$3" "$4" "$N" <<'EOF' || fail "case $1"
import json, sys
d, case, before, after, want, n = sys.argv[1:7]
n = int(n)

def field(b, want):   # the length-delimited fields numbered `want` of a message
    i, out = 0, []
    while i < len(b):
        key = 0; s = 0
        while True:
            c = b[i]; i += 1; key |= (c & 127) << s; s += 7
            if c < 128: break
        num, wt = key >> 3, key & 7
        if wt == 0:
            while b[i] >= 128: i += 1
            i += 1
        elif wt == 2:
            ln = 0; s = 0
            while True:
                c = b[i]; i += 1; ln |= (c & 127) << s; s += 7
                if c < 128: break
            if num == want: out.append(b[i:i + ln])
            i += ln
        elif wt == 1: i += 8
        elif wt == 5: i += 4
        else: raise ValueError("wire type %d" % wt)
    return out

def digests(path):   # Bundle.kernels (3) -> Kernel.digest (9)
    return [field(k, 9)[0].hex() for k in field(open(path, "rb").read(), 3)]

runs, ds = [], set()
for i in range(1, n + 1):
    for j in range(1, 9):
        p = "%s/%s-%d-%d" % (d, case, i, j)
        try:
            runs.append(json.load(open(p + ".json")))
        except Exception:
            sys.exit("client %d-%d got no answer: %s" % (i, j, open(p + ".err").read()[-300:]))
        ds.add(tuple(digests(p + ".pb")))
# compiled once in the cluster: one bundle, blob for blob (alone, each
# daemon's own compile need not give the same bytes: NVRTC's do not)
assert want == "alone" or len(ds) == 1, "%d different bundles (kernel digests)" % len(ds)
distinct = runs[0]["distinct_kernels"]
b = [json.loads(l) for l in open(before)]
a = [json.loads(l) for l in open(after)]
compiled = sum(x["kernels_compiled"] for x in a) - sum(x["kernels_compiled"] for x in b)
def lease(x, ev, fam="apollo_cluster_leases_total"):
    for s in x["metrics"][fam]["samples"]:
        if s["labels"]["event"] == ev: return s["value"]
events = ("taken", "waited", "lapsed", "taken_over", "timeout")
ev = {e: int(sum(lease(x, e) for x in a) - sum(lease(x, e) for x in b)) for e in events}
kev = {e: int(sum(lease(x, e, "apollo_cluster_kernel_leases_total") for x in a) -
              sum(lease(x, e, "apollo_cluster_kernel_leases_total") for x in b)) for e in events}
caches = sorted(r["cache"] for r in runs)
if want in ("once", "shared"):
    assert compiled == distinct, "%d kernels compiled in the cluster for %d distinct" % (compiled, distinct)
    assert ev["timeout"] == 0 and kev["timeout"] == 0, (ev, kev)
    # shared: two request leases (two graph keys), the kernels' shared
    assert want == "once" or ev["taken"] == 2, ev
elif want == "taken-over":
    assert compiled == distinct, "%d kernels compiled in the cluster for %d distinct" % (compiled, distinct)
    assert ev["taken_over"] == 1 and ev["lapsed"] >= 1, ev
else:   # alone: each daemon compiled it once (its kernels maybe from its L1), nobody waited
    for i in range(n):
        c = [r["cache"] for r in runs[8 * i:8 * i + 8]]
        assert c.count("miss") == 1, "daemon %d answered %s" % (i + 1, c)
    assert ev["waited"] == 0 and ev["taken"] == 0, ev
    assert kev["waited"] == 0 and kev["taken"] == 0, kev
print("cluster_lease: %s: %d clients, %d bundle(s) of %d distinct kernels, %d compiled in the "
      "cluster; leases %s; kernel leases %s; answers %s" % (case, len(runs), len(ds), distinct,
      compiled, " ".join("%s %d" % kv for kv in ev.items()),
      " ".join("%s %d" % kv for kv in kev.items()),
      ", ".join("%s %d" % (c, caches.count(c)) for c in sorted(set(caches)))))
EOF
}

# 1. 64 clients, one cold graph, at once
stats >"$C/s0"
submit_all cold "$BERT" --target "$TARGET"
stats >"$C/s1"
check cold "$C/s0" "$C/s1" once

# 2. the holder killed while it holds the lease
LEASE_MS=1000
node 9 APOLLO_TEST_LEASE_HOLD_MS=4000
up 9
"$CLIENT" --socket "$C/node9/s" submit "$MLP/model.onnx" --data "$MLP" --namespace kill \
	>/dev/null 2>&1 &   # fails when its daemon is killed
k=0
until "$CLIENT" --socket "$C/node9/s" stats --json | grep -q \
	'"labels":{"event":"taken"},"value":1}'; do
	k=$((k + 1))
	[ $k -lt 200 ] || fail "daemon 9 took no lease"
	sleep 0.05
done
submit_all kill "$MLP" --namespace kill &
waiters=$!
sleep 0.5
kill -KILL "$PID9"
wait "$PID9" 2>/dev/null
PIDS=$(echo "$PIDS" | sed "s/ $PID9\$//")
wait "$waiters"
stats >"$C/s2"
check kill "$C/s1" "$C/s2" taken-over

# 3. two cold graphs (one model, two namespaces) sharing every kernel
SPLIT_NS=shared
submit_all shared "$SQUEEZE" --target "$TARGET"
SPLIT_NS=
stats >"$C/s3"
check shared "$C/s2" "$C/s3" shared

# 4. Redis stopped: every daemon compiles alone
kill -TERM "$REDIS_PID"
wait "$REDIS_PID" 2>/dev/null
REDIS_PID=
submit_all outage "$MLP" --namespace outage
stats >"$C/s4"
check outage "$C/s3" "$C/s4" alone
echo "cluster_lease: all passed"
