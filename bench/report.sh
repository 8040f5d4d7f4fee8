#!/bin/sh
# bench/report.sh [-o FILE] [-t TARGET] [--quick] [BENCH...] -- run the
# benchmarks and write their tables into FILE (default docs/benchmarks.md),
# with a header giving the date, the machine (CPU model, cores, memory,
# GPU where nvidia-smi answers), the git commit, the binaries and the
# daemon's NVRTC.  `make bench` runs it with no arguments: every benchmark
# bench/run.sh runs, in its order.  Each benchmark's output is also shown
# as it runs, and goes into FILE unchanged (each prints its own table, with
# its ratios against a baseline measured in the same run); FILE is
# replaced only when the report is complete.
#
#   BENCH        a subset, by name: coldwarm (bench/run.sh's own table:
#                cold and warm compile of every model), warm, fusion,
#                layer1, compile, tune, autotune, scale, gemm, gemm_sass, host,
#                attention_memory, torch_train (bench/NAME.sh).  The
#                header then says which ran.
#   -t TARGET    passed to the benchmarks that take one (coldwarm, warm,
#                layer1, compile, tune); default: each picks sm_90 when the
#                daemon has NVRTC, else cpu, as bench/run.sh does.
#   --quick      fewer repetitions (WARM_RUNS=2, REPEAT=1, REPEAT_RUN=2,
#                SCALE_REPS=1, CPU_SUBMITS=200, RPS_SECONDS=1,
#                HOST_MAX_GFLOP=0.2; bench/scale.sh at 8, 64 and 256
#                layers; bench/torch_train.sh with 2 steps after 1),
#                to see that the benchmarks run; the header says so, and
#                its numbers are not for comparison.
#   env: APOLLO_BUILD (default build/), and every benchmark's own.
cd "$(dirname "$0")/.." || exit 1

ALL="coldwarm warm fusion layer1 compile tune autotune scale gemm gemm_sass host attention_memory torch_train"
out=docs/benchmarks.md
target=
quick=
while [ $# -gt 0 ]; do
	case $1 in
	-o) out=$2; shift 2 ;;
	-t) target=$2; shift 2 ;;
	--quick) quick=1; shift ;;
	-h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "bench/report: unknown option $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
benches=${*:-$ALL}
for b in $benches; do
	case " $ALL " in
	*" $b "*) ;;
	*) echo "bench/report: unknown benchmark '$b' (one of: $ALL)" >&2; exit 2 ;;
	esac
done
partial=
[ "$benches" = "$ALL" ] || partial=1
scale_sizes=
torch_args=
if [ -n "$quick" ]; then
	torch_args="--steps 2 --warmup 1"
	WARM_RUNS=2 REPEAT=1 REPEAT_RUN=2 SCALE_REPS=1 CPU_SUBMITS=200 RPS_SECONDS=1 HOST_MAX_GFLOP=0.2
	export WARM_RUNS REPEAT REPEAT_RUN SCALE_REPS CPU_SUBMITS RPS_SECONDS HOST_MAX_GFLOP
	scale_sizes="8 64 256"
fi

# The binaries and the daemon's NVRTC, from one daemon started here.
. tests/daemon.inc
ap_start >/dev/null
ping=$("$CLIENT" ping 2>&1 | sed 's/; targets:.*//')
ap_stop
default_target=sm_90
case $ping in *"NVRTC none"*) default_target=cpu ;; esac

# The machine.
cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null)
[ -n "$cpu" ] || cpu=$(uname -m)
cores=$(nproc 2>/dev/null || echo "?")
mem=$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo 2>/dev/null)
load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)
gpu=
if command -v nvidia-smi >/dev/null 2>&1; then
	gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap \
		--format=csv,noheader 2>/dev/null | sed 's/^/    - /')
fi
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
bin=$(readlink -f "$APOLLOD" 2>/dev/null || echo "$APOLLOD")
elsewhere=
case $bin in
"$(pwd -P)"/*) ;;
*) elsewhere=" (outside this checkout: built from another tree, perhaps not this commit)" ;;
esac
dirty=
[ -z "$(git status --porcelain --untracked-files=no -- . ":!$out" 2>/dev/null)" ] ||
	dirty=" (with uncommitted changes)"

# What each benchmark is, and how it runs.
describe() {
	case $1 in
	coldwarm) echo "Cold and warm compile of every model (bench/run.sh's own table): a fresh cache answers the first submit, the same submit again from the cache; kernels against eager kernels; where the cold time went." ;;
	warm) echo "The warm path of the largest model: cold and warm submits as whole apollo-client processes, the daemon's CPU per warm submit through a kept connection, warm submits per second with 1, 4 and 16 clients." ;;
	fusion) echo "The fusion table: launches and modelled global-memory bytes of every model and training step at each fusion level, beside the node count of onnxruntime's optimized graph." ;;
	layer1) echo "Layer I off and on: launches, modelled bytes, the micro-graphs it scheduled, its recomputation, its time beside the backend's." ;;
	compile) echo "Cold compile against the NVRTC floor of the same kernels (apollo-kernels --floor), and distinct kernels of 1 ... 32-layer encoders whose weights are initializers." ;;
	tune) echo "Cold compile with tuning and without (--no-tune), the search's cost, and host run time tuned and untuned." ;;
	autotune) echo "What the background tuner does after one cold compile: candidates compiled with ptxas, records refined and moved, candidates timed where a GPU is." ;;
	scale) echo "Partition and codegen time against graph size: transformer encoders of 8 ... 512 layers, and time(512)/time(64)." ;;
	gemm) echo "The models' GEMM, convolution and attention shapes: FLOPs, bytes, what ptxas reports for sm_90, host time beside onnxruntime's (and the device's where nvidia-smi works)." ;;
	host) echo "Every model and training step on target cpu, Apollo beside onnxruntime, same inputs, same threads." ;;
	gemm_sass) echo "The K loop of 4096^3 and 1024^3 MatMuls on sm_90 read from their SASS (nvdisasm): instructions a K tile, the share that multiply (HMMA / FFMA), barriers, integer address arithmetic, shared loads, asynchronous copies, the epilogue's stores by width. A static count, not a timing." ;;
	attention_memory) echo "GPT-2-small attention (12 heads of 64, batch 1, float16, causal, sm_90) at S = 512 ... 8192: the peak bytes of Apollo's forward and backward bundles beside eager PyTorch's tensors with the flash and the math kernel, and the growth per doubling of S." ;;
	torch_train) echo "Training steps of real PyTorch models (bench/torch_sweep.py's): eager, torch.compile with Inductor and with Apollo on target cpu, the first step cold and warm, graph breaks." ;;
	esac
}
command_of() {
	case $1 in
	coldwarm) echo "BENCH_ONLY_COLD_WARM=1 sh bench/run.sh${target:+ $target}" ;;
	warm | layer1 | compile | tune) echo "sh bench/$1.sh${target:+ $target}" ;;
	scale) echo "sh bench/scale.sh${scale_sizes:+ $scale_sizes}" ;;
	torch_train) echo "sh bench/torch_train.sh${torch_args:+ $torch_args}" ;;
	*) echo "sh bench/$1.sh" ;;
	esac
}

body=$AP_TMP/body.md
: >"$body"
t_all=$(date +%s)
failed=
for b in $benches; do
	cmd=$(command_of "$b")
	echo "== bench/report: $b: $cmd"
	t0=$(date +%s)
	# the benchmark's output to the terminal and to the report, and its status
	{ sh -c "$cmd" 2>&1; echo $? >"$AP_TMP/status"; } | tee "$AP_TMP/$b.out"
	st=$(cat "$AP_TMP/status")
	secs=$(($(date +%s) - t0))
	{
		echo "## $b"
		echo
		describe "$b"
		echo
		if [ "$st" -eq 0 ]; then
			echo "\`$cmd\` -- $secs s."
		else
			echo "\`$cmd\` -- $secs s, **failed (exit $st)**: the output below is what it printed."
			failed="$failed $b"
		fi
		echo
		echo '```text'
		cat "$AP_TMP/$b.out"
		echo '```'
		echo
	} >>"$body"
done

tmp=$out.tmp.$$
{
	echo "# Benchmarks"
	echo
	echo "Generated by \`make bench\` (\`bench/report.sh\`): do not edit by hand;"
	echo "run \`make bench\` again to bring it up to date.  Every table below is"
	echo "a benchmark's own output, with its ratios against a baseline measured"
	echo "in the same run on the same machine.  The benchmarks assert nothing:"
	echo "the machine's other load moves their numbers.  Not run here:"
	echo "\`bench/net_latency.sh\` (ping round trips with and without large"
	echo "compile frames in flight) and \`bench/torch_sweep.py\` (real models'"
	echo "training steps through \`torch.compile\` checked against eager, graph"
	echo "breaks, [torch.md](torch.md); their times are torch_train's); on a"
	echo "GPU machine, the device kit's \`device-check.sh\` times the GEMM and"
	echo "attention shapes beside PyTorch ([testing.md](testing.md#the-device-kit))."
	echo
	if [ -n "$quick" ] || [ -n "$partial" ]; then
		echo "**Not a full run:**${partial:+ only \`$benches\` ran;}${quick:+ \`--quick\` (fewer repetitions: WARM_RUNS=2, REPEAT=1, REPEAT_RUN=2, SCALE_REPS=1, CPU_SUBMITS=200, RPS_SECONDS=1, HOST_MAX_GFLOP=0.2; scale at $scale_sizes layers; torch_train $torch_args), so these numbers only show that the benchmarks run and are not for comparison.}"
		echo
	fi
	echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'), $(($(date +%s) - t_all)) s in all"
	echo "- machine: $cpu, $cores cores, $mem of memory; load average at the start $load"
	if [ -n "$gpu" ]; then
		echo "- GPU (nvidia-smi: name, memory, driver, compute capability):"
		echo "$gpu"
	else
		echo "- GPU: none (no nvidia-smi, or it answered nothing): no device time was measured"
	fi
	echo "- commit: \`$commit\`$dirty"
	echo "- binaries: \`$bin\` and beside it$elsewhere; $ping"
	if [ -n "$target" ]; then
		echo "- target: $target (-t)"
	else
		echo "- target: $default_target (each benchmark's default on this machine; fusion, scale and host run on cpu)"
	fi
	[ -z "$failed" ] || echo "- failed:$failed"
	echo
	cat "$body"
} >"$tmp" && mv "$tmp" "$out"
echo "bench/report: wrote $out"
[ -z "$failed" ]
