#!/bin/sh
# device-kit.sh [OUTDIR] -- the device kit (default build/device-kit): a folder
# that a bare GPU machine (an NVIDIA driver, CUDA, PyTorch; none of the
# libraries Apollo links, no package registry) runs with one command,
# `sh OUTDIR/device-check.sh RESULTS` (tools/device-check.sh; docs/testing.md, "The
# device kit").  It holds:
#   bin/       apollod, apollo-client, tests/check_runtime and the stand-in
#              driver tests/libcuda-standin.so, as built here (make all),
#              without their debug information;
#   lib/       the shared libraries they load beyond glibc / libstdc++ /
#              libgcc, taken from Debian's packages: `apt-get download` of
#              the package that holds each (the installed version; cached in
#              $DEVICE_KIT_DEBS, default build/device-kit-debs), `dpkg -x`,
#              and the file named by the soname copied; where the download
#              fails (no network), the installed package's file (said so);
#   data/      models/ and training/ of ../shared/testdata, and prec/: their
#              float16 and bfloat16 variants (tools/convert_precision.py, as
#              tests/precision.sh makes them), so the device needs no onnx;
#   bench/     gemm_shapes.py and gemm_device.py (the GEMM / attention shapes
#              are made on the device with numpy: their data is too large to
#              carry);
#   device-check.sh, KIT_INFO (commit, date, packages, sizes).
# Prints the kit's size and its largest parts, and fails above
# DEVICE_KIT_MAX_MIB (60) MiB.
#   env: APOLLO_BUILD (default build), APOLLO_TESTDATA (default
#        ../shared/testdata), DEVICE_KIT_DEBS
cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
OUT=${1:-build/device-kit}
BUILD=${APOLLO_BUILD:-$REPO/build}
TESTDATA=${APOLLO_TESTDATA:-../shared/testdata}
DEBS=${DEVICE_KIT_DEBS:-$BUILD/device-kit-debs}
MAX_MIB=${DEVICE_KIT_MAX_MIB:-60}
PY=$REPO/.venv/bin/python

fail() { echo "device-kit: $*" >&2; exit 1; }

for f in apollod apollo-client tests/check_runtime tests/libcuda-standin.so; do
	[ -f "$BUILD/$f" ] || fail "missing $BUILD/$f: build first (make all)"
done
[ -d "$TESTDATA/models" ] && [ -d "$TESTDATA/training" ] || fail "no test data at $TESTDATA"
"$PY" -c 'import onnx, onnxruntime, numpy' 2>/dev/null ||
	fail "needs onnx, onnxruntime and numpy in $REPO/.venv (make deps) for the float16 / bfloat16 variants"
case $OUT in /*) ;; *) OUT=$REPO/$OUT ;; esac
case $OUT in /|"$REPO"|"$REPO/") fail "refusing to use $OUT as the kit folder" ;; esac
t0=$(date +%s)
rm -rf "$OUT"
mkdir -p "$OUT/bin/tests" "$OUT/lib" "$OUT/data" "$OUT/bench" "$DEBS" || fail "cannot create $OUT"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/device-kit.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

# ---- binaries ------------------------------------------------------------------------------
bins="apollod apollo-client tests/check_runtime tests/libcuda-standin.so"
for f in $bins; do
	if command -v strip >/dev/null 2>&1; then
		strip --strip-debug -o "$OUT/bin/$f" "$BUILD/$f" || fail "strip $f"
	else
		cp "$BUILD/$f" "$OUT/bin/$f" || fail "copy $f"
	fi
done

# ---- libraries -----------------------------------------------------------------------------------
# every library ldd resolves, less the C / C++ runtime the device has
for f in $bins; do ldd "$BUILD/$f"; done | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' |
	sort -u | while read -r soname path; do
	case $soname in
	linux-vdso*|ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|\
	libresolv.so.*|libutil.so.*|libstdc++.so.*|libgcc_s.so.*) continue ;;
	esac
	echo "$soname $path"
done >"$TMP/libs"
[ -s "$TMP/libs" ] || fail "ldd listed no libraries to carry"
# cached_deb PKG VERSION: the .deb of that version in $DEBS, if there
cached_deb() {
	for d in "$DEBS/$1"_*.deb; do
		[ -f "$d" ] && [ "$(dpkg-deb -f "$d" Version 2>/dev/null)" = "$2" ] && { echo "$d"; return; }
	done
}
: >"$TMP/pkgs"
while read -r soname path; do
	real=$(readlink -f "$path")
	pkg=
	for p in "$path" "$real" "/usr$path" "${real#/usr}"; do
		pkg=$(dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1-2 | sed 's/: .*//')
		[ -n "$pkg" ] && break
	done
	pkg=${pkg%%:*}
	got=
	if [ -n "$pkg" ]; then
		ver=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null)
		deb=$(cached_deb "$pkg" "$ver")
		if [ -z "$deb" ]; then
			(cd "$DEBS" && timeout 120 apt-get download -q -o Acquire::Retries=0 "$pkg=$ver") \
				>"$TMP/apt.log" 2>&1
			deb=$(cached_deb "$pkg" "$ver")
		fi
		if [ -z "$deb" ]; then
			# the installed version left the archive: the candidate
			# (same soname; a newer build of the same release)
			cand=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ { print $2 }')
			if [ -n "$cand" ] && [ "$cand" != "(none)" ]; then
				deb=$(cached_deb "$pkg" "$cand")
				[ -n "$deb" ] || { (cd "$DEBS" && timeout 120 apt-get download -q \
					-o Acquire::Retries=0 "$pkg=$cand") >>"$TMP/apt.log" 2>&1
					deb=$(cached_deb "$pkg" "$cand"); }
				[ -n "$deb" ] && echo "device-kit: $soname: $pkg $ver (installed) is no longer in the archive; taking $cand" >&2
			fi
		fi
		if [ -n "$deb" ]; then
			rm -rf "$TMP/x" && mkdir "$TMP/x" && dpkg -x "$deb" "$TMP/x" &&
				src=$(find "$TMP/x" -name "$soname" | head -1) && [ -n "$src" ] &&
				cp -L "$src" "$OUT/lib/$soname" && got="${deb##*/}"
		fi
	fi
	if [ -z "$got" ]; then
		echo "device-kit: $soname: apt-get download of ${pkg:-its package} failed ($(tail -1 "$TMP/apt.log" 2>/dev/null)); taking the installed file $real (apt-get update may help)" >&2
		cp -L "$path" "$OUT/lib/$soname" || fail "cannot copy $path"
		got="installed ${pkg:-?} $ver"
	fi
	echo "$soname $got" >>"$TMP/pkgs"
done <"$TMP/libs"

# ---- data ----------------------------------------------------------------------------------------------
for cat in models training; do
	mkdir -p "$OUT/data/$cat"
	for d in "$TESTDATA/$cat"/*/; do
		[ -f "$d/model.onnx" ] && cp -R "${d%/}" "$OUT/data/$cat/"
	done
done
dirs=$(ls -d "$OUT"/data/models/*/ "$OUT"/data/training/*/ | sed 's|/$||')
for dt in float16 bfloat16; do
	# shellcheck disable=SC2086
	"$PY" tools/convert_precision.py --dtype $dt --out "$OUT/data/prec" $dirs \
		>"$TMP/convert.log" 2>&1 || { grep -v "W:onnxruntime" "$TMP/convert.log" >&2; fail "converting to $dt failed"; }
done
cp bench/gemm_shapes.py bench/gemm_device.py "$OUT/bench/"
cp tools/device-check.sh "$OUT/device-check.sh"
chmod +x "$OUT/device-check.sh"

# ---- KIT_INFO, size ------------------------------------------------------------------------------------
kb=$(du -sk "$OUT" | cut -f1)
{
	echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo '+changes') built $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"), glibc $(ldd --version 2>/dev/null | head -1 | awk '{ print $NF }')"
	echo "size: $kb KiB"
	echo "libraries (soname, from):"
	sed 's/^/  /' "$TMP/pkgs"
	echo "models: $(ls "$OUT/data/models" | tr '\n' ' ')"
	echo "training: $(ls "$OUT/data/training" | tr '\n' ' ')"
	echo "prec: $(ls "$OUT/data/prec" | wc -l) folders (float16__*, bfloat16__*)"
} >"$OUT/KIT_INFO"
echo "device-kit: $OUT: $(awk -v k="$kb" 'BEGIN { printf "%.1f", k / 1024 }') MiB (limit $MAX_MIB MiB), made in $(($(date +%s) - t0)) s; largest parts:"
du -sk "$OUT"/bin "$OUT"/lib "$OUT"/data/* "$OUT"/bench | sort -rn |
	awk -v o="$OUT/" '{ sub(o, "", $2); printf "  %6.1f MiB  %s\n", $1 / 1024, $2 }'
echo "  libraries: $(cut -d' ' -f1 "$TMP/pkgs" | tr '\n' ' ')"
if [ "$kb" -gt $((MAX_MIB * 1024)) ]; then
	fail "the kit is $kb KiB, over $MAX_MIB MiB"
fi
echo "device-kit: run it on a GPU machine with: sh ${OUT#"$REPO"/}/device-check.sh OUTDIR"
