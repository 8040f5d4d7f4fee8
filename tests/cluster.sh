#!/bin/sh
# cluster.sh -- integration test of the shared cache (issue 10) on a real
# local cluster: deploy/cluster.sh starts one redis-server and two apollods
# (node 1, node 2) with their own sockets and caches.  In order:
#   1. a graph compiled by node 1 is a remote hit on node 2, which compiles
#      nothing;
#   2. an entry altered in Redis is not served: node 2 misses (logged,
#      counted at the lookup and at the lease's second look), compiles,
#      and answers;
#   3. Redis stopped: both nodes answer every request (compiled), node 1's
#      breaker opens;
#   4. Redis back: after redis_breaker_open_ms the breaker closes and a
#      graph compiled by node 1 is again a remote hit on node 2;
#   5. single-flight: 8 clients submitting one cold graph at once to node 2
#      cause exactly its distinct kernels' worth of compiles, and all 8 get
#      the same bundle;
#   6. the metrics endpoint answers curl with valid Prometheus text
#      (tests/prom_check.py) holding the same numbers as
#      `apollo-client stats --json`.
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc
PY=python3
[ -x "$REPO/.venv/bin/python" ] && PY=$REPO/.venv/bin/python
C=$AP_TMP/cluster
N1=$C/node1/apollod.sock
N2=$C/node2/apollod.sock
MLP=$TESTDATA/models/mlp_gelu_ln
BERT=$TESTDATA/models/bert_like_2l
export APOLLOD APOLLO_CLIENT="$CLIENT"
trap 'sh deploy/cluster.sh stop "$C"; rm -rf "$AP_TMP"' EXIT

fail() {
	echo "cluster: FAILED: $*"
	for f in "$C"/node1.log "$C"/node2.log; do
		echo "--- $f"
		tail -20 "$f"
	done
	exit 1
}

# submit SOCKET MODEL.onnx DIR [FLAGS]: the --json line of one submit
submit() {
	s=$1 m=$2 d=$3
	shift 3
	"$CLIENT" --socket "$s" submit "$m" --data "$d" --json "$@" || fail "submit to $s"
}

field() {   # field JSON NAME
	printf '%s' "$1" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['$2'])"
}

metric() {   # metric SOCKET 'NAME' 'k=v,...': one value from stats --json
	"$CLIENT" --socket "$1" stats --json | "$PY" -c "
import json, sys
m = json.load(sys.stdin)['metrics']
want = dict(kv.split('=') for kv in '$3'.split(',') if kv)
for f in m.values():
    for s in f['samples']:
        if s['name'] == '$2' and s['labels'] == want:
            print('%g' % s['value']); sys.exit(0)
sys.exit('no sample $2 {$3}')"
}

sh deploy/cluster.sh start "$C" --workers 4 --redis-breaker-failures 2 \
	--redis-breaker-open-ms 700 --redis-timeout-ms 300 --metrics 0 >/dev/null || fail "start"

# 1. compiled on node 1, a remote hit on node 2
j=$(submit "$N1" "$MLP/model.onnx" "$MLP")
[ "$(field "$j" cache)" = miss ] || fail "node 1 first submit: $(field "$j" cache)"
k1=$(field "$j" kernels)
j=$(submit "$N2" "$MLP/model.onnx" "$MLP")
[ "$(field "$j" cache)" = remote-hit ] || fail "node 2: cache $(field "$j" cache), want remote-hit"
[ "$(field "$j" kernels_compiled)" = 0 ] || fail "node 2 compiled on a remote hit"
[ "$(field "$j" kernels)" = "$k1" ] || fail "node 2's bundle differs"
[ "$(metric "$N2" apollo_kernels_total tier=compiled)" = 0 ] || fail "node 2 compiled kernels"
j=$(submit "$N2" "$MLP/model.onnx" "$MLP")
[ "$(field "$j" cache)" = hit ] || fail "node 2 second submit: $(field "$j" cache), want hit (L1)"
echo "cluster: 1. node 1 compiled $k1 launches; node 2: remote hit, nothing compiled, then an L1 hit"

# 2. an entry altered in Redis is not served
submit "$N1" "$MLP/model.onnx" "$MLP" --namespace tamper >/dev/null
keys=$(redis-cli -s "$C/redis.sock" --scan --pattern 'apollo:*:a:*')
[ "$(echo "$keys" | wc -l)" = 2 ] || fail "expected 2 action entries in Redis, got: $keys"
for k in $keys; do   # alter a byte in the middle of every action entry
	redis-cli -s "$C/redis.sock" SETRANGE "$k" 200 X >/dev/null
done
j=$(submit "$N2" "$MLP/model.onnx" "$MLP" --namespace tamper)
[ "$(field "$j" cache)" = miss ] || fail "an altered entry was served: cache $(field "$j" cache)"
[ "$(field "$j" kernels)" = "$k1" ] || fail "node 2's recompiled bundle differs"
# read twice: by the lookup, and again once node 2 took the graph's lease
# (server/compile/lease.h: an entry may appear between a miss and the take)
[ "$(metric "$N2" apollo_redis_verify_failures_total '')" = 2 ] || fail "verify failure not counted"
grep -q "not served: the signature does not match" "$C/node2.log" || fail "verify failure not logged"
echo "cluster: 2. altered entry: a miss on node 2, logged, compiled again"

# 3. Redis stopped: clients see only latency
sh deploy/cluster.sh redis-stop "$C"
for n in 1 2; do
	s=$C/node$n/apollod.sock
	j=$(submit "$s" "$MLP/model.onnx" "$MLP" --namespace outage)
	[ "$(field "$j" cache)" = miss ] || fail "node $n without Redis: $(field "$j" cache)"
	[ "$(field "$j" kernels)" = "$k1" ] || fail "node $n without Redis: another bundle"
done
[ "$(metric "$N1" apollo_redis_circuit_state '')" = 1 ] || fail "node 1's breaker is not open"
echo "cluster: 3. Redis stopped: both nodes answered; node 1's breaker open"

# 4. Redis back: the breaker closes, sharing resumes
sh deploy/cluster.sh redis-start "$C"
sleep 1   # > redis_breaker_open_ms
j=$(submit "$N1" "$MLP/model.onnx" "$MLP" --namespace back)
[ "$(metric "$N1" apollo_redis_circuit_state '')" = 0 ] || fail "node 1's breaker did not close"
sleep 1
j=$(submit "$N2" "$MLP/model.onnx" "$MLP" --namespace back)
[ "$(field "$j" cache)" = remote-hit ] || fail "after Redis returned: cache $(field "$j" cache)"
[ "$(metric "$N2" apollo_redis_circuit_state '')" = 0 ] || fail "node 2's breaker did not close"
echo "cluster: 4. Redis back: breakers closed, node 2 a remote hit again"

# 5. single-flight: 8 clients, one cold graph, at once
before=$(metric "$N2" apollo_kernels_total tier=compiled)
i=0
while [ $i -lt 8 ]; do
	"$CLIENT" --socket "$N2" submit "$BERT/model.onnx" --data "$BERT" --json \
		>"$AP_TMP/flight$i.json" 2>"$AP_TMP/flight$i.err" &
	i=$((i + 1))
done
wait
after=$(metric "$N2" apollo_kernels_total tier=compiled)
"$PY" - "$AP_TMP" "$((after - before))" <<'EOF' || fail "single-flight"
import json, sys
d, compiled = sys.argv[1], int(sys.argv[2])
runs = [json.load(open("%s/flight%d.json" % (d, i))) for i in range(8)]
same = lambda r: (r["graph_hash"], json.dumps(r["kernel_list"]), json.dumps(r["launch_list"]))
assert all(same(r) == same(runs[0]) for r in runs), "the 8 bundles differ"
distinct = runs[0]["distinct_kernels"]
assert compiled == distinct, "%d kernels compiled for %d distinct" % (compiled, distinct)
caches = sorted(r["cache"] for r in runs)
assert caches.count("miss") == 1, caches
print("cluster: 5. single-flight: 8 clients, %d distinct kernels compiled once; answers %s"
      % (distinct, ", ".join("%s %d" % (c, caches.count(c)) for c in sorted(set(caches)))))
EOF

# 6. metrics: curl, Prometheus text, the same numbers as stats --json
port=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$C/node2.log" | head -1)
[ -n "$port" ] || fail "node 2 logged no metrics port"
"$CLIENT" --socket "$N2" stats --json >"$AP_TMP/stats.json" || fail "stats --json"
curl -sf "http://127.0.0.1:$port/metrics" >"$AP_TMP/metrics.txt" || fail "curl /metrics"
"$PY" tests/prom_check.py "$AP_TMP/metrics.txt" --stats "$AP_TMP/stats.json" \
	--ignore apollo_uptime_seconds apollo_requests_total apollo_clients \
	--expect 'apollo_redis_enabled{}=1' --expect 'apollo_redis_circuit_state{}=0' \
	--expect 'apollo_redis_verify_failures_total{}=2' \
	--expect 'apollo_compile_answers_total{tier="l2"}=2' || fail "metrics"
echo "cluster: all passed"
