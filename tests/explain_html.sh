#!/bin/sh
# explain_html.sh -- `apollo-client submit --explain-html FILE` in a real
# browser (Debian's headless Chromium), through a real apollod (target cpu):
#   1. bert_like_2l and squeezenet1_1 from ../shared/testdata/models, each
#      submitted once with --explain --json --explain-html: Chromium loads
#      the page (--dump-dom, after its script ran) and the DOM has one
#      launch box per launch of the JSON's launch_list and one edge per
#      boundary of its boundary_list, counted both from the elements and
#      from what the page's script counted (data-rendered-*); a screenshot
#      of each page is taken and its path and size printed; moving the
#      mouse over a launch (a copy of the page with one more line of
#      script) fills the hover panel with its kernel, schedule, bytes and
#      recompute ratio;
#   2. a small ONNX model made here whose node and tensor names hold
#      <b>&"' : the page escapes them (no <b> element in the rendered DOM,
#      the name shown as text) and still counts right;
#   3. the torch backend's explain_html option (when torch is in .venv): a
#      small MLP compiled with torch.compile writes a page per graph, and
#      Chromium renders each with its launch count.
# The pages and screenshots are also copied to $APOLLO_BUILD/explain-html/
# for a look afterwards.  Without Chromium the script skips, unless
# $APOLLO_REQUIRE names "browser" (tests/lib/require.sh): then it fails.
#   env: APOLLO_BUILD, APOLLO_CHROMIUM (the browser to run; default
#        chromium, else chromium-browser on the PATH)
cd "$(dirname "$0")/.." || exit 1
. tests/daemon.inc

BROWSER=${APOLLO_CHROMIUM:-}
[ -n "$BROWSER" ] || BROWSER=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$BROWSER" ] || ! command -v "$BROWSER" >/dev/null 2>&1; then
	ap_skip browser "explain_html: skipped: no headless Chromium (apt-get install chromium, or make deps)"
	exit $?
fi
PY=$REPO/.venv/bin/python
if ! "$PY" -c 'import onnx, numpy' 2>/dev/null; then
	echo "explain_html: needs onnx and numpy in $REPO/.venv (make deps)"
	exit 1
fi
KEEP=$APOLLO_BUILD/explain-html
rm -rf "$KEEP"
mkdir -p "$KEEP" "$AP_TMP/profile"
ap_start
status=0

# browser ARGS... URL: one headless Chromium run with its own profile, its
# stderr (D-Bus chatter) kept in $AP_TMP/chromium.log.
browser() {
	timeout 120 "$BROWSER" --headless --no-sandbox --disable-gpu --no-first-run \
		--user-data-dir="$AP_TMP/profile" --hide-scrollbars "$@" 2>"$AP_TMP/chromium.log"
}

# attr NAME FILE: the value of the first NAME="..." in FILE.
attr() {
	sed -n "s/.*$1=\"\\([^\"]*\\)\".*/\\1/p" "$2" | head -1
}

# json_counts FILE: "LAUNCHES BOUNDARIES" of a --explain --json report.
json_counts() {
	"$PY" -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(len(d["launch_list"]), len(d["boundary_list"]))' "$1"
}

# page_check LABEL PAGE FROM WANT_LAUNCHES WANT_BOUNDARIES: the page
# rendered by Chromium has the launch boxes and edges wanted (FROM says
# where those counts come from); DOM in $AP_TMP/LABEL.dom.
page_check() {
	label=$1 page=$2 from=$3 wl=$4 wb=$5 dom=$AP_TMP/$1.dom
	if ! browser --dump-dom "file://$page" >"$dom" || [ ! -s "$dom" ]; then
		echo "FAILED: $label: chromium could not load $page:"
		tail -5 "$AP_TMP/chromium.log"
		return 1
	fi
	# every <g class="launch ..."> / <g class="boundary ..."> of the DOM
	nl=$(grep -o '<g class="launch [^"]*"' "$dom" | wc -l)
	nb=$(grep -o '<g class="boundary [^"]*"' "$dom" | wc -l)
	rl=$(attr data-rendered-launches "$dom")
	rb=$(attr data-rendered-boundaries "$dom")
	sl=$(attr data-launches "$dom")
	sb=$(attr data-boundaries "$dom")
	echo "$label: $from: $wl launches, $wb boundaries; rendered DOM: $nl launch boxes," \
		"$nb edges (the page's script counted ${rl:-none} and ${rb:-none}; <svg> says $sl and $sb)"
	if [ "$nl" != "$wl" ] || [ "$nb" != "$wb" ] || [ "$rl" != "$wl" ] || [ "$rb" != "$wb" ] ||
	   [ "$sl" != "$wl" ] || [ "$sb" != "$wb" ]; then
		echo "FAILED: $label: the page does not count $wl launches and $wb boundaries"
		return 1
	fi
	if [ "$wl" -lt 1 ]; then
		echo "FAILED: $label: no launches"
		return 1
	fi
	return 0
}

# screenshot LABEL PAGE: a PNG of the page, its path and size printed.
screenshot() {
	png=$AP_TMP/$1.png
	if ! browser --window-size=1400,1800 --screenshot="$png" "file://$2" >/dev/null ||
	   [ ! -s "$png" ]; then
		echo "FAILED: $1: no screenshot"
		tail -5 "$AP_TMP/chromium.log"
		return 1
	fi
	if [ "$(od -An -c -j1 -N3 "$png" | tr -d ' ')" != PNG ]; then
		echo "FAILED: $1: $png is not a PNG"
		return 1
	fi
	# width and height from the IHDR chunk (big-endian, bytes 16..23)
	wh=$(od -An -tu1 -j16 -N8 "$png" | awk '{ printf "%dx%d", (($1*256+$2)*256+$3)*256+$4, (($5*256+$6)*256+$7)*256+$8 }')
	cp "$png" "$KEEP/"
	echo "$1: screenshot $png ($(wc -c <"$png") bytes, $wh px; kept as $KEEP/$1.png)"
}

# 1. Two real models.
for m in bert_like_2l squeezenet1_1; do
	d=$TESTDATA/models/$m
	page=$AP_TMP/$m.html
	if [ ! -f "$d/model.onnx" ]; then
		ap_skip testdata "explain_html: $d/model.onnx missing" || status=1
		continue
	fi
	if ! "$CLIENT" submit "$d/model.onnx" --data "$d/test_data_set_0" --explain --json \
		--explain-html "$page" >"$AP_TMP/$m.json" 2>"$AP_TMP/$m.err"; then
		echo "FAILED: $m: submit --explain-html:"
		cat "$AP_TMP/$m.err"
		status=1
		continue
	fi
	cp "$page" "$KEEP/"
	echo "$m: page $page ($(wc -c <"$page") bytes)"
	# shellcheck disable=SC2046
	page_check "$m" "$page" "--explain --json" $(json_counts "$AP_TMP/$m.json") || status=1
	screenshot "$m" "$page" || status=1
done

# The hover panel: a copy of bert_like_2l's page with a line of script that
# moves the mouse over launch 1 shows that launch's kernel, schedule,
# bytes and recompute ratio in #info, and marks its arrows.
page=$AP_TMP/bert_like_2l.html
if [ -f "$page" ]; then
	sed 's|</body>|<script>document.querySelector("#launch-1 rect").dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));</script></body>|' \
		"$page" >"$AP_TMP/hover.html"
	browser --dump-dom "file://$AP_TMP/hover.html" >"$AP_TMP/hover.dom"
	info=$(sed -n 's/.*<div id="info">\(.*\)<\/div>.*/\1/p' "$AP_TMP/hover.dom" | head -1 | sed 's/<[^>]*>/ /g')
	kernel=$(sed -n 's/.*id="launch-1" data-index="1" data-kernel="\([^"]*\)".*/\1/p' "$page")
	hot=$(grep -o '<g class="boundary [^"]* hot"' "$AP_TMP/hover.dom" | wc -l)
	case $info in
	*"launch:  1"*"kernel:  $kernel"*"schedule: "*"global bytes: "*"recompute ratio: "*)
		if [ "$hot" -ge 1 ]; then
			echo "hover over launch 1: the panel shows$(echo "$info" | tr -s ' '); $hot arrows marked"
		else
			echo "FAILED: hover over launch 1 marks none of its arrows"
			status=1
		fi ;;
	*)
		echo "FAILED: hover over launch 1: the panel shows '$info', not its kernel $kernel, schedule, bytes and recompute ratio"
		status=1 ;;
	esac
fi

# 2. Names that are markup: node and tensor names holding <b>&"'.
"$PY" - "$AP_TMP/markup.onnx" <<'EOF' || { echo "FAILED: could not write the model"; exit 1; }
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)
w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1")
w2 = numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "w2")
nodes = [
    helper.make_node("MatMul", ["x", "w1"], ["h"], name='mm1<b>&"\''),
    helper.make_node("Relu", ["h"], ['r<b>&"\''], name='relu <b>&"'),
    helper.make_node("MatMul", ['r<b>&"\'', "w2"], ["m2"], name="mm2"),
    helper.make_node("Tanh", ["m2"], ["y"], name="tanh</text><b>x</b>"),
]
g = helper.make_graph(nodes, "markup", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [w1, w2])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
onnx.checker.check_model(m)
onnx.save(m, sys.argv[1])
EOF
page=$AP_TMP/markup.html
if ! "$CLIENT" submit "$AP_TMP/markup.onnx" --explain --json --explain-html "$page" \
	>"$AP_TMP/markup.json" 2>"$AP_TMP/markup.err"; then
	echo "FAILED: markup: submit --explain-html:"
	cat "$AP_TMP/markup.err"
	status=1
else
	cp "$page" "$KEEP/"
	# shellcheck disable=SC2046
	page_check markup "$page" "--explain --json" $(json_counts "$AP_TMP/markup.json") || status=1
	dom=$AP_TMP/markup.dom
	if grep -q '<b>' "$page" || grep -q '<b>' "$dom"; then
		echo "FAILED: markup: a <b> element from a node name reached the page or its DOM"
		status=1
	elif ! grep -q '>relu &lt;b&gt;&amp;"</text>' "$dom" ||
	     ! grep -q '&lt;/text&gt;&lt;b&gt;x&lt;/b&gt;' "$dom"; then
		echo "FAILED: markup: the node names are not shown as escaped text:"
		grep -o '<text[^>]*>[^<]*</text>' "$dom" | head -20
		status=1
	elif ! grep -q 'data-tensor="r&lt;b&gt;&amp;&quot;&#39;"' "$page"; then
		echo "FAILED: markup: the boundary's tensor is not escaped in its attribute:"
		grep -o 'data-tensor="[^"]*"' "$page" | head -5
		status=1
	else
		echo "markup: node names <b>&\"' shown as text, no element made from them:" \
			"$(grep -o '>relu &lt;b&gt;&amp;"</text>' "$dom" | head -1)"
	fi
	screenshot markup "$page" || status=1
fi

# 3. The torch backend's explain_html option.
if "$PY" -c 'import torch' 2>/dev/null; then
	pages=$AP_TMP/torch-pages
	if ! PYTHONPATH=$REPO/client/python APOLLO_LIB=$APOLLO_BUILD/libapollo-client.so "$PY" - "$pages" \
		>"$AP_TMP/torch.log" 2>&1 <<'EOF'
import sys
import torch
import apollo.torch_backend as tb

torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8),
                        torch.nn.LayerNorm(8))
x = torch.randn(4, 16)
with torch.no_grad():
    f = torch.compile(m, backend="apollo", options={"target": "cpu", "strict": True,
                                                    "explain_html": sys.argv[1]})
    got, want = f(x), m(x)
err = (got - want).abs().max().item()
print("torch: compiled %d graph(s), %d launches, max |error| %.2e" % (tb.stats()["graphs"],
                                                                     tb.stats()["kernels"], err))
assert err < 1e-4, err
EOF
	then
		echo "FAILED: torch backend with explain_html:"
		cat "$AP_TMP/torch.log"
		status=1
	else
		cat "$AP_TMP/torch.log"
		n=0
		for p in "$pages"/*.html; do
			[ -f "$p" ] || continue
			n=$((n + 1))
			l=$(attr data-launches "$p")
			b=$(attr data-boundaries "$p")
			cp "$p" "$KEEP/torch-$(basename "$p")"
			page_check "torch_$(basename "$p" .html)" "$p" "the page's <svg>" "$l" "$b" || status=1
		done
		if [ "$n" -eq 0 ]; then
			echo "FAILED: torch: explain_html wrote no page into $pages"
			status=1
		fi
	fi
else
	ap_skip torch "explain_html: torch part skipped: no torch in $REPO/.venv (make deps)" || status=1
fi

if [ $status -eq 0 ]; then
	echo "explain_html: passed (pages and screenshots in $KEEP)"
fi
exit $status
