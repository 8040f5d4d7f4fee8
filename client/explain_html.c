/* explain_html.c -- a bundle's fused graph as one self-contained HTML page
 * (explain_html.h says what the page holds).
 *
 * Layout, all computed here: a launch's row is its depth in the graph of
 * boundaries (0 for a launch no boundary feeds; else one more than its
 * deepest producer, producers coming earlier in launch order); each row's
 * boxes sit side by side in launch order, the rows centred.  A box is as
 * wide as its longest line (clamped; longer names are cut with an
 * ellipsis, the whole name kept in the hover text) and as tall as its
 * lines.  An arrow between adjacent rows is one Bezier curve from the
 * producer's bottom edge to the consumer's top edge, the arrows leaving
 * (entering) one box spread along its edge; an arrow that skips rows runs
 * down a lane right of every box it passes, so it does not cross them.
 * Boundaries whose producer is not earlier than its consumer (not
 * expected from the daemon) loop round the right of the boxes.
 *
 * Widths are estimated from a monospace font's advance (CHAR_W per
 * character, UTF-8 continuation bytes not counted), which is what the page
 * asks the browser to use.
 */
#include "explain_html.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHAR_W 6.7         /* px per character of the 11px monospace font */
#define LINE_H 14          /* px per node line */
#define HEAD_H 34          /* the box's two header lines */
#define PAD 8              /* inside a box */
#define BOX_MIN_W 200
#define BOX_MAX_W 460
#define MAX_LINES 60       /* node lines shown per launch; the rest counted */
#define GAP_X 28           /* between boxes of a row */
#define GAP_Y 84           /* between rows: room for arrows and their labels */
#define MARGIN 24
#define LANE_W 16          /* between the lanes of row-skipping arrows */

/* A launch box: where it is, and what it shows. */
typedef struct box {
	int row;
	double x, y, w, h;
	int n_parts;         /* parts drawn as sub-boxes (0: the nodes directly) */
	int lines;           /* node lines drawn (all parts) */
	int out_deg, in_deg, out_k, in_k;   /* arrows leaving / entering, and how many placed */
	const char *kind;    /* emitter, else category, else "other" */
	unsigned layers;
	uint64_t bytes;
	double recompute;
} box;

/* ---- escaping ------------------------------------------------------------------------ */

/* `s` as HTML text or attribute value: & < > " ' as character references;
 * control characters other than tab and newline as U+FFFD.  At most
 * `max_chars` characters (negative: all), the cut marked with an ellipsis
 * and never inside a UTF-8 sequence. */
static void esc_n(FILE *f, const char *s, int max_chars)
{
	int chars = 0;

	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
		if ((*p & 0xC0) != 0x80) {
			if (max_chars >= 0 && chars == max_chars) {
				fputs("\xE2\x80\xA6", f);   /* U+2026 */
				return;
			}
			chars++;
		}
		switch (*p) {
		case '&': fputs("&amp;", f); break;
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '"': fputs("&quot;", f); break;
		case '\'': fputs("&#39;", f); break;
		case '\t': case '\n': fputc(*p, f); break;
		default:
			if (*p < 0x20 || *p == 0x7F)
				fputs("&#xFFFD;", f);
			else
				fputc(*p, f);
		}
	}
}

static void esc(FILE *f, const char *s)
{
	esc_n(f, s, -1);
}

/* Characters of `s` as the browser counts them (UTF-8 lead bytes). */
static int n_chars(const char *s)
{
	int n = 0;

	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++)
		n += (*p & 0xC0) != 0x80;
	return n;
}

/* `s` as a CSS class suffix: lower-case letters, digits and '-', at most
 * 32 of them; "none" when nothing is left. */
static void class_word(FILE *f, const char *s)
{
	int n = 0;

	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p && n < 32; p++) {
		unsigned char c = *p;
		if (c >= 'A' && c <= 'Z')
			c = (unsigned char)(c - 'A' + 'a');
		if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-') {
			fputc(c, f);
			n++;
		} else if (c == '_' || c == ' ' || c == '.') {
			fputc('-', f);
			n++;
		}
	}
	if (!n)
		fputs("none", f);
}

/* ---- colours --------------------------------------------------------------------------- */

/* The fill of a launch (or part) of kind `k`: a fixed colour for the
 * kinds the daemon names today, a hashed one of a light palette for any
 * other. */
static const char *kind_fill(const char *k)
{
	static const struct {
		const char *kind, *fill;
	} known[] = {
		{ "gemm", "#cfe0ff" }, { "matmul", "#cfe0ff" }, { "conv", "#d6e4f5" },
		{ "attention", "#e4d5ff" }, { "stitched", "#ffe0bf" }, { "reduction", "#fff1a8" },
		{ "elementwise", "#d5f2cc" }, { "pointwise", "#d5f2cc" }, { "broadcast", "#cdeeee" },
		{ "window", "#f8d3e3" }, { "parallel", "#e8e8e8" }, { "opaque", "#e0d8cc" },
	};
	static const char *const palette[] = {
		"#f4d8c8", "#d8e8c0", "#c8dcf0", "#ecd0ec", "#f0ecc0", "#c8ece0", "#e4dcc8", "#dcd4f4",
	};
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if (!strcmp(k, known[i].kind))
			return known[i].fill;
	for (const unsigned char *p = (const unsigned char *)k; *p; p++)
		h = (h ^ *p) * 16777619u;
	return palette[h % (sizeof(palette) / sizeof(palette[0]))];
}

/* The outline of a launch built by fusion layers `layers` (the highest
 * one's colour) and its width. */
static const char *layer_stroke(unsigned layers, double *width)
{
	*width = layers ? 3 : 1.2;
	if (layers & AP_BUNDLE_LAYER_III)
		return "#7b3fbf";
	if (layers & AP_BUNDLE_LAYER_II)
		return "#d9730d";
	if (layers & AP_BUNDLE_LAYER_I)
		return "#1f6fd1";
	return "#5a5a5a";
}

/* "I II" for layer bits ("" for none); into buf. */
static const char *layer_words(unsigned layers, char *buf, size_t cap)
{
	static const char *const names[] = { "I", "II", "III" };
	size_t n = 0;

	buf[0] = '\0';
	for (int i = 0; i < 3; i++)
		if (layers & (1u << i))
			n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", n ? " " : "", names[i]);
	return buf;
}

/* "12.5 MiB" */
static void fmt_bytes(FILE *f, uint64_t v)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double d = (double)v;
	int u = 0;

	while (d >= 1024 && u < 4) {
		d /= 1024;
		u++;
	}
	if (u)
		fprintf(f, "%.1f %s", d, unit[u]);
	else
		fprintf(f, "%llu B", (unsigned long long)v);
}

/* ---- what a launch shows ------------------------------------------------------------- */

/* The node names of launch `i` when it is drawn without parts: the
 * launch's, else its kernel's. */
static void launch_names(const ap_bundle *b, int i, int *n, const char *const **names,
			 const char **category)
{
	unsigned kernel = 0;
	int n_args;
	const uint32_t *args;
	ap_bundle_kernel k;

	*n = 0;
	*names = NULL;
	*category = "";
	if (ap_bundle_launch_nodes(b, i, n, names, category) < 0)
		*n = 0;
	if (!*category)
		*category = "";
	if (*n <= 0 && ap_bundle_launch(b, i, &kernel, &n_args, &args) == 0 &&
	    ap_bundle_kernel_get(b, (int)kernel, &k) == 0) {
		*n = k.n_nodes;
		*names = k.nodes;
	}
}

static const char *kernel_name(const ap_bundle *b, int i)
{
	unsigned kernel = 0;
	int n_args;
	const uint32_t *args;
	ap_bundle_kernel k;

	if (ap_bundle_launch(b, i, &kernel, &n_args, &args) == 0 &&
	    ap_bundle_kernel_get(b, (int)kernel, &k) == 0 && k.name)
		return k.name;
	return "";
}

static const char *str_or(const char *s, const char *dflt)
{
	return s && s[0] ? s : dflt;
}

/* Sizes box `bx` for launch `i`: its kind, layers, bytes, recompute ratio,
 * lines, width and height. */
static void box_measure(const ap_bundle *b, int i, box *bx)
{
	int np = ap_bundle_launch_n_parts(b, i), n, widest;
	const char *const *names;
	const char *cat;
	ap_bundle_launch_part pt;

	launch_names(b, i, &n, &names, &cat);
	bx->layers = ap_bundle_launch_layers(b, i, &bx->bytes);
	bx->recompute = 1;
	bx->kind = str_or(cat, "other");
	widest = n_chars(kernel_name(b, i)) + 6;
	for (int j = 0; j < np; j++)
		if (ap_bundle_launch_part_get(b, i, j, &pt) == 0) {
			if (pt.recompute > bx->recompute)
				bx->recompute = pt.recompute;
			if (j == 0 && pt.emitter && pt.emitter[0])
				bx->kind = pt.emitter;
		}
	bx->n_parts = np > 1 ? np : 0;
	bx->lines = 0;
	if (bx->n_parts) {
		for (int j = 0; j < np; j++) {
			if (ap_bundle_launch_part_get(b, i, j, &pt) < 0)
				continue;
			bx->lines += 1 + (pt.n_nodes < MAX_LINES ? pt.n_nodes : MAX_LINES + 1);
			for (int k = 0; k < pt.n_nodes && k < MAX_LINES; k++)
				if (n_chars(pt.nodes[k]) + 2 > widest)
					widest = n_chars(pt.nodes[k]) + 2;
		}
	} else {
		bx->lines = n < MAX_LINES ? n : MAX_LINES + 1;
		for (int k = 0; k < n && k < MAX_LINES; k++)
			if (n_chars(names[k]) > widest)
				widest = n_chars(names[k]);
	}
	bx->w = widest * CHAR_W + 2 * PAD;
	if (bx->w < BOX_MIN_W)
		bx->w = BOX_MIN_W;
	if (bx->w > BOX_MAX_W)
		bx->w = BOX_MAX_W;
	bx->h = HEAD_H + bx->lines * LINE_H + 2 * PAD + (bx->n_parts ? bx->n_parts * 6 : 0);
}

/* Characters of a node line that fit box `bx` (indent: characters before it). */
static int fit_chars(const box *bx, int indent)
{
	return (int)((bx->w - 2 * PAD) / CHAR_W) - indent;
}

/* ---- the page -------------------------------------------------------------------------- */

static const char PAGE_STYLE[] =
	"body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1d1d1d;"
	"background:#fafafa}\n"
	"header{padding:12px 20px;background:#fff;border-bottom:1px solid #ddd}\n"
	"h1{font-size:18px;margin:0 0 4px}\n"
	"header p{margin:2px 0}\n"
	"#legend{display:flex;flex-wrap:wrap;gap:6px 14px;padding:8px 20px;font-size:12px}\n"
	"#legend span.sw{display:inline-block;width:14px;height:10px;margin-right:4px;"
	"border:1px solid #888;vertical-align:middle}\n"
	"#info{position:fixed;top:10px;right:10px;width:340px;max-height:70vh;overflow:auto;"
	"background:#fff;border:1px solid #bbb;border-radius:6px;padding:8px 10px;font-size:12px;"
	"box-shadow:0 2px 8px rgba(0,0,0,.15);white-space:pre-wrap;word-break:break-all}\n"
	"#info b{font-weight:600}\n"
	"#counts{font-size:12px;color:#555;padding:0 20px}\n"
	"#wrap{overflow:auto;padding:0 0 40px}\n"
	"svg text{font:11px monospace;fill:#111}\n"
	"svg text.head{font-weight:bold}\n"
	"svg text.sub{fill:#444}\n"
	"svg text.more{fill:#777;font-style:italic}\n"
	"svg text.badge{font-weight:bold;fill:#fff}\n"
	"svg text.reason{fill:#333;font-size:10px}\n"
	"g.launch{cursor:default}\n"
	"g.launch:hover rect.box,g.launch.hot rect.box{filter:drop-shadow(0 0 4px #333)}\n"
	"g.boundary path{fill:none;stroke:#777;stroke-width:1.3}\n"
	"g.boundary.hot path{stroke:#d11;stroke-width:2.5}\n"
	"g.boundary:hover path{stroke:#d11;stroke-width:2.5}\n"
	"rect.label{fill:#fff;fill-opacity:.9;stroke:#ccc;stroke-width:.6}\n";

/* Reads only data-* attributes and writes only text: no string from the
 * bundle is ever parsed as HTML or code. */
static const char PAGE_SCRIPT[] =
	"(function(){\n"
	"var svg=document.getElementById('graph'),info=document.getElementById('info');\n"
	"var counts=document.getElementById('counts');\n"
	"var nl=svg.querySelectorAll('g.launch').length,nb=svg.querySelectorAll('g.boundary').length;\n"
	"counts.setAttribute('data-rendered-launches',String(nl));\n"
	"counts.setAttribute('data-rendered-boundaries',String(nb));\n"
	"counts.textContent='rendered: '+nl+' launch boxes, '+nb+' boundary edges';\n"
	"function row(k,v){var d=document.createElement('div'),b=document.createElement('b');\n"
	" b.textContent=k+': ';d.appendChild(b);d.appendChild(document.createTextNode(v));"
	"info.appendChild(d);}\n"
	"function clear(){while(info.firstChild)info.removeChild(info.firstChild);\n"
	" svg.querySelectorAll('.hot').forEach(function(e){e.classList.remove('hot');});}\n"
	"var L=[['kernel','kernel'],['category','category'],['emitter','emitter'],"
	"['schedule','schedule'],['fusion layers','layers'],['global bytes','bytes'],"
	"['recompute ratio','recompute'],['nodes','nodes']];\n"
	"var B=[['tensor','tensor'],['reason','reason'],['detail','detail']];\n"
	"function show(ev){var g=ev.target.closest?ev.target.closest('g.launch,g.boundary'):null;\n"
	" if(!g)return;clear();var d=g.dataset;\n"
	" if(g.classList.contains('launch')){row('launch',d.index);\n"
	"  L.forEach(function(p){if(d[p[1]])row(p[0],d[p[1]]);});g.classList.add('hot');\n"
	"  svg.querySelectorAll('g.boundary').forEach(function(e){\n"
	"   if(e.dataset.producer===d.index||e.dataset.consumer===d.index)e.classList.add('hot');});\n"
	" }else{row('boundary','launch '+d.producer+' \\u2192 launch '+d.consumer);\n"
	"  B.forEach(function(p){if(d[p[1]])row(p[0],d[p[1]]);});g.classList.add('hot');}\n"
	"}\n"
	"svg.addEventListener('mouseover',show);\n"
	"})();\n";

/* The kinds drawn (first appearance order), for the legend. */
typedef struct kinds {
	const char **v;
	int n;
} kinds;

static void kinds_add(kinds *k, const char *s)
{
	for (int i = 0; i < k->n; i++)
		if (!strcmp(k->v[i], s))
			return;
	k->v[k->n++] = s;
}

static void write_head(FILE *f, const ap_bundle *b, const ap_report_info *info, const kinds *kn)
{
	ap_bundle_stats s;
	const char *model = info && info->model ? info->model : "";
	int nb = ap_bundle_n_boundaries(b);

	ap_bundle_stats_get(b, &s);
	fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
	      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
	      "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\n"
	      "<meta name=\"generator\" content=\"apollo-client --explain-html\">\n<title>Apollo: ", f);
	esc(f, model[0] ? model : "fused graph");
	fprintf(f, "</title>\n<style>\n%s</style>\n</head>\n<body>\n<header>\n<h1>", PAGE_STYLE);
	esc(f, model[0] ? model : "fused graph");
	fprintf(f, "</h1>\n<p>%d kernel launches (%d distinct kernels) for ", ap_bundle_n_launches(b),
		ap_bundle_n_kernels(b));
	esc(f, ap_bundle_target(b));
	fprintf(f, "; eager: %u kernels, %u nodes</p>\n<p>modelled global memory: ", s.eager_kernels,
		s.nodes);
	fmt_bytes(f, s.global_bytes);
	fputs(" fused, ", f);
	fmt_bytes(f, s.eager_bytes);
	fputs(" eager, ", f);
	fmt_bytes(f, s.min_bytes);
	fprintf(f, " minimum</p>\n<p>fusion layers: I scheduled %u micro-graphs, II stitched %u, "
		   "III launched %u together; %d boundaries between launches", s.layer1, s.layer2,
		s.layer3, nb);
	if (info && info->round_trip_ms > 0)
		fprintf(f, "; compile %.1f ms in the daemon, round trip %.1f ms", s.compile_ms,
			info->round_trip_ms);
	fputs("</p>\n<p>Hover a launch for its kernel, schedule, bytes and recompute ratio; "
	      "hover an arrow for the tensor and why the launches were not fused.</p>\n"
	      "</header>\n<div id=\"legend\">", f);
	for (int i = 0; i < kn->n; i++) {
		fputs("<span><span class=\"sw\" style=\"background:", f);
		fputs(kind_fill(kn->v[i]), f);
		fputs("\"></span>", f);
		esc(f, kn->v[i]);
		fputs("</span>", f);
	}
	for (int l = 0; l <= 3; l++) {
		double w;
		unsigned bits = l ? 1u << (l - 1) : 0;
		static const char *const words[] = { "no fusion layer", "Layer I (isl scheduling)",
			"Layer II (memory stitching)", "Layer III (parallel launch)" };
		fprintf(f, "<span><span class=\"sw\" style=\"background:#fff;border:2px solid %s\">"
			   "</span>%s</span>", layer_stroke(bits, &w), words[l]);
	}
	fputs("</div>\n<p id=\"counts\"></p>\n<div id=\"info\">Hover a launch or an arrow.</div>\n", f);
}

/* One text line at (x, y) of class `cls`, `s` cut to `max` characters. */
static void text_line(FILE *f, double x, double y, const char *cls, const char *s, int max)
{
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\"%s%s%s>", x, y, cls ? " class=\"" : "", cls ? cls : "",
		cls ? "\"" : "");
	esc_n(f, s, max);
	fputs("</text>\n", f);
}

/* Node lines of one list, from y; returns the y after them. */
static double node_lines(FILE *f, const box *bx, double x, double y, int indent, int n,
			 const char *const *names)
{
	for (int k = 0; k < n && k < MAX_LINES; k++, y += LINE_H)
		text_line(f, x, y, NULL, names[k], fit_chars(bx, indent));
	if (n > MAX_LINES) {
		char more[48];
		snprintf(more, sizeof(more), "... +%d more nodes", n - MAX_LINES);
		text_line(f, x, y, "more", more, -1);
		y += LINE_H;
	}
	return y;
}

static void write_launch(FILE *f, const ap_bundle *b, int i, const box *bx)
{
	int n, np = ap_bundle_launch_n_parts(b, i);
	const char *const *names;
	const char *cat;
	const char *kname = kernel_name(b, i);
	char lw[16], sched[1024] = "", emit[256] = "";
	double sw, y;
	const char *stroke = layer_stroke(bx->layers, &sw);
	ap_bundle_launch_part pt;
	size_t sl = 0, el = 0;

	launch_names(b, i, &n, &names, &cat);
	layer_words(bx->layers, lw, sizeof(lw));
	/* schedules and emitters of the parts, "; "-joined (cut at the buffer) */
	for (int j = 0; j < np; j++)
		if (ap_bundle_launch_part_get(b, i, j, &pt) == 0) {
			if (pt.schedule && pt.schedule[0] && sl < sizeof(sched))
				sl += (size_t)snprintf(sched + sl, sizeof(sched) - sl, "%s%s", sl ? "; " : "",
						       pt.schedule);
			if (pt.emitter && pt.emitter[0] && el < sizeof(emit))
				el += (size_t)snprintf(emit + el, sizeof(emit) - el, "%s%s", el ? ", " : "",
						       pt.emitter);
		}
	fputs("<g class=\"launch kind-", f);
	class_word(f, bx->kind);
	fputs(" layer-", f);
	if (bx->layers) {
		for (const char *p = lw; *p; p++)
			fputc(*p == ' ' ? '-' : *p, f);
	} else {
		fputs("none", f);
	}
	fprintf(f, "\" id=\"launch-%d\" data-index=\"%d\" data-kernel=\"", i, i);
	esc(f, kname);
	fputs("\" data-category=\"", f);
	esc(f, cat);
	fputs("\" data-emitter=\"", f);
	esc(f, emit);
	fputs("\" data-schedule=\"", f);
	esc(f, sched);
	fprintf(f, "\" data-layers=\"%s\" data-bytes=\"%llu\" data-recompute=\"%.3f\" "
		   "data-nodes=\"%d\" data-parts=\"%d\">\n<title>launch %d: ", lw[0] ? lw : "none",
		(unsigned long long)bx->bytes, bx->recompute, n, np, i);
	esc(f, kname);
	fputs("\ncategory: ", f);
	esc(f, str_or(cat, "-"));
	if (emit[0]) {
		fputs("\nemitter: ", f);
		esc(f, emit);
	}
	if (sched[0]) {
		fputs("\nschedule: ", f);
		esc(f, sched);
	}
	fprintf(f, "\nfusion layers: %s\nglobal bytes: %llu\nrecompute ratio: %.3f</title>\n",
		lw[0] ? lw : "none", (unsigned long long)bx->bytes, bx->recompute);
	fprintf(f, "<rect class=\"box\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" rx=\"6\" "
		   "fill=\"%s\" stroke=\"%s\" stroke-width=\"%.1f\"/>\n", bx->x, bx->y, bx->w, bx->h,
		kind_fill(bx->kind), stroke, sw);
	{
		char head[32];
		snprintf(head, sizeof(head), "#%d ", i);
		fprintf(f, "<text class=\"head\" x=\"%.1f\" y=\"%.1f\">%s", bx->x + PAD, bx->y + PAD + 10,
			head);
		esc_n(f, kname, fit_chars(bx, (int)strlen(head)));
		fputs("</text>\n", f);
	}
	fprintf(f, "<text class=\"sub\" x=\"%.1f\" y=\"%.1f\">", bx->x + PAD, bx->y + PAD + 25);
	esc_n(f, str_or(cat, "-"), 24);
	if (emit[0]) {
		fputs(" \xC2\xB7 ", f);
		esc_n(f, emit, 24);
	}
	fputs("</text>\n", f);
	/* layer badges at the top right */
	{
		double bxr = bx->x + bx->w - PAD;
		static const char *const names3[] = { "I", "II", "III" };
		for (int l = 2; l >= 0; l--) {
			double w, bw;
			unsigned bit = 1u << l;
			if (!(bx->layers & bit))
				continue;
			bw = 10 + 7 * (double)strlen(names3[l]);
			bxr -= bw;
			fprintf(f, "<rect class=\"badge\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"14\" "
				   "rx=\"3\" fill=\"%s\"/><text class=\"badge\" x=\"%.1f\" y=\"%.1f\">%s</text>\n",
				bxr, bx->y + PAD + 14, bw, layer_stroke(bit, &w), bxr + 5, bx->y + PAD + 25,
				names3[l]);
			bxr -= 3;
		}
	}
	y = bx->y + PAD + HEAD_H + 10;
	if (!bx->n_parts) {
		node_lines(f, bx, bx->x + PAD, y, 0, n, names);
	} else {
		for (int j = 0; j < np; j++) {
			double top = y - 11, pw;
			char label[160];
			const char *ps;
			if (ap_bundle_launch_part_get(b, i, j, &pt) < 0)
				continue;
			int lines = 1 + (pt.n_nodes < MAX_LINES ? pt.n_nodes : MAX_LINES + 1);
			ps = layer_stroke(pt.layers, &pw);
			fprintf(f, "<rect class=\"part\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
				   "rx=\"4\" fill=\"%s\" stroke=\"%s\" stroke-width=\"%.1f\"/>\n",
				bx->x + PAD / 2.0, top, bx->w - PAD, lines * LINE_H + 4.0,
				kind_fill(str_or(pt.emitter, str_or(pt.category, "other"))), ps,
				pw > 1.5 ? 1.5 : 0.8);
			snprintf(label, sizeof(label), "blocks [%u, %u) %s %s", pt.block_begin,
				 pt.block_begin + pt.blocks, str_or(pt.category, "-"), str_or(pt.emitter, ""));
			text_line(f, bx->x + PAD, y, "sub", label, fit_chars(bx, 0));
			y = node_lines(f, bx, bx->x + PAD + 2 * CHAR_W, y + LINE_H, 2, pt.n_nodes, pt.nodes);
			y += 6;
		}
	}
	fputs("</g>\n", f);
}

/* An arrow's end points and path for boundary `x` (producer and consumer
 * valid); lane_x: the lane of a row-skipping arrow.  Writes the <g>. */
static void write_boundary(FILE *f, int idx, const ap_bundle_boundary *x, box *bx, double lane_x,
			   double *lx, double *ly)
{
	box *p = &bx[x->producer], *c = &bx[x->consumer];
	double sx, sy, ex, ey;

	fprintf(f, "<g class=\"boundary reason-");
	class_word(f, x->reason);
	fprintf(f, "\" id=\"boundary-%d\" data-producer=\"%u\" data-consumer=\"%u\" data-tensor=\"", idx,
		x->producer, x->consumer);
	esc(f, x->tensor);
	fputs("\" data-reason=\"", f);
	esc(f, x->reason);
	fputs("\" data-detail=\"", f);
	esc(f, x->detail);
	fprintf(f, "\">\n<title>launch %u \xE2\x86\x92 launch %u via ", x->producer, x->consumer);
	esc(f, str_or(x->tensor, "?"));
	fputs(": ", f);
	esc(f, str_or(x->reason, "(no reason)"));
	if (x->detail && x->detail[0]) {
		fputs(" (", f);
		esc(f, x->detail);
		fputc(')', f);
	}
	fputs("</title>\n", f);
	if (x->producer >= x->consumer || c->row <= p->row) {
		/* a loop round the right of both boxes */
		sx = p->x + p->w;
		sy = p->y + p->h / 2;
		ex = c->x + c->w;
		ey = c->y + c->h / 3;
		fprintf(f, "<path d=\"M%.1f %.1f C%.1f %.1f %.1f %.1f %.1f %.1f\" marker-end=\"url(#arrow)\"/>\n",
			sx, sy, lane_x, sy, lane_x, ey, ex + 2, ey);
		*lx = lane_x;
		*ly = (sy + ey) / 2;
	} else {
		p->out_k++;
		c->in_k++;
		sx = p->x + p->w * p->out_k / (p->out_deg + 1);
		sy = p->y + p->h;
		ex = c->x + c->w * c->in_k / (c->in_deg + 1);
		ey = c->y;
		if (c->row == p->row + 1) {
			double d = (ey - sy) / 2;
			fprintf(f, "<path d=\"M%.1f %.1f C%.1f %.1f %.1f %.1f %.1f %.1f\" "
				   "marker-end=\"url(#arrow)\"/>\n", sx, sy, sx, sy + d, ex, ey - d, ex, ey - 2);
			*lx = (sx + ex) / 2;
			*ly = (sy + ey) / 2;
		} else {
			/* down a lane right of the rows it skips */
			double d = GAP_Y / 3.0;
			fprintf(f, "<path d=\"M%.1f %.1f C%.1f %.1f %.1f %.1f %.1f %.1f L%.1f %.1f "
				   "C%.1f %.1f %.1f %.1f %.1f %.1f\" marker-end=\"url(#arrow)\"/>\n",
				sx, sy, sx, sy + d, lane_x, sy + d, lane_x, sy + 2 * d,
				lane_x, ey - 2 * d, lane_x, ey - d, ex, ey - d, ex, ey - 2);
			*lx = lane_x;
			*ly = (sy + ey) / 2;
		}
	}
	fputs("</g>\n", f);
}

static int by_consumer(const void *a, const void *b)
{
	const ap_bundle_boundary *x = a, *y = b;

	return x->consumer < y->consumer ? -1 : x->consumer > y->consumer;
}

int ap_report_html(FILE *f, const ap_bundle *b, const ap_report_info *info, ap_error *err)
{
	int nl = ap_bundle_n_launches(b), nb = ap_bundle_n_boundaries(b), n_rows = 0, drawn = 0;
	box *bx = calloc((size_t)(nl > 0 ? nl : 1), sizeof(*bx));
	ap_bundle_boundary *bd = calloc((size_t)(nb > 0 ? nb : 1), sizeof(*bd));
	double *row_w = NULL, *row_h = NULL, *row_y = NULL, width = 0, height, lane_next;
	double *lbl_x = calloc((size_t)(nb > 0 ? nb : 1), sizeof(double));
	double *lbl_y = calloc((size_t)(nb > 0 ? nb : 1), sizeof(double));
	int *lbl_i = calloc((size_t)(nb > 0 ? nb : 1), sizeof(int));
	kinds kn = { calloc((size_t)(nl > 0 ? nl : 1), sizeof(char *)), 0 };
	int rc = 0;

	if (!bx || !bd || !kn.v || !lbl_x || !lbl_y || !lbl_i) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "explain-html: out of memory");
		goto out;
	}
	for (int i = 0; i < nb; i++)
		if (ap_bundle_boundary_get(b, i, &bd[i]) < 0)
			bd[i].producer = bd[i].consumer = (unsigned)-1;
	/* rows: a consumer one below its deepest earlier producer */
	qsort(bd, (size_t)nb, sizeof(*bd), by_consumer);
	for (int i = 0; i < nl; i++)
		box_measure(b, i, &bx[i]);
	for (int i = 0; i < nb; i++) {
		unsigned p = bd[i].producer, c = bd[i].consumer;
		if (p >= (unsigned)nl || c >= (unsigned)nl)
			continue;
		if (p < c && bx[c].row < bx[p].row + 1)
			bx[c].row = bx[p].row + 1;
	}
	for (int i = 0; i < nl; i++) {
		if (bx[i].row + 1 > n_rows)
			n_rows = bx[i].row + 1;
		kinds_add(&kn, bx[i].kind);
	}
	for (int i = 0; i < nb; i++) {
		unsigned p = bd[i].producer, c = bd[i].consumer;
		if (p >= (unsigned)nl || c >= (unsigned)nl)
			continue;
		if (p < c && bx[c].row > bx[p].row) {
			bx[p].out_deg++;
			bx[c].in_deg++;
		}
	}
	row_w = calloc((size_t)(n_rows > 0 ? n_rows : 1), sizeof(double));
	row_h = calloc((size_t)(n_rows > 0 ? n_rows : 1), sizeof(double));
	row_y = calloc((size_t)(n_rows > 0 ? n_rows : 1), sizeof(double));
	if (!row_w || !row_h || !row_y) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "explain-html: out of memory");
		goto out;
	}
	for (int i = 0; i < nl; i++) {
		row_w[bx[i].row] += (row_w[bx[i].row] > 0 ? GAP_X : 0) + bx[i].w;
		if (bx[i].h > row_h[bx[i].row])
			row_h[bx[i].row] = bx[i].h;
	}
	for (int r = 0; r < n_rows; r++) {
		if (row_w[r] > width)
			width = row_w[r];
		row_y[r] = r ? row_y[r - 1] + row_h[r - 1] + GAP_Y : MARGIN;
	}
	{
		double *row_x = calloc((size_t)(n_rows > 0 ? n_rows : 1), sizeof(double));
		if (!row_x) {
			rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "explain-html: out of memory");
			goto out;
		}
		for (int r = 0; r < n_rows; r++)
			row_x[r] = MARGIN + (width - row_w[r]) / 2;
		for (int i = 0; i < nl; i++) {
			bx[i].x = row_x[bx[i].row];
			bx[i].y = row_y[bx[i].row];
			row_x[bx[i].row] += bx[i].w + GAP_X;
		}
		free(row_x);
	}
	height = n_rows ? row_y[n_rows - 1] + row_h[n_rows - 1] + MARGIN : 2 * MARGIN;
	lane_next = MARGIN + width + 20;
	/* arrows back in boundary order (the bundle's), lanes assigned as met */
	for (int i = 0; i < nb; i++)
		if (ap_bundle_boundary_get(b, i, &bd[i]) < 0)
			bd[i].producer = bd[i].consumer = (unsigned)-1;

	write_head(f, b, info, &kn);
	for (int i = 0; i < nb; i++)
		if (bd[i].producer < (unsigned)nl && bd[i].consumer < (unsigned)nl)
			drawn++;
	{
		int lanes = 0;
		for (int i = 0; i < nb; i++) {
			unsigned p = bd[i].producer, c = bd[i].consumer;
			if (p < (unsigned)nl && c < (unsigned)nl &&
			    (p >= c || bx[c].row != bx[p].row + 1))
				lanes++;
		}
		fprintf(f, "<div id=\"wrap\">\n<svg id=\"graph\" xmlns=\"http://www.w3.org/2000/svg\" "
			   "data-launches=\"%d\" data-boundaries=\"%d\" width=\"%.0f\" height=\"%.0f\" "
			   "viewBox=\"0 0 %.0f %.0f\">\n", nl, drawn, lane_next + lanes * LANE_W + MARGIN,
			height, lane_next + lanes * LANE_W + MARGIN, height);
	}
	fputs("<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" "
	      "markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M0 0L10 5L0 10z\" "
	      "fill=\"#555\"/></marker></defs>\n<g class=\"edges\">\n", f);
	{
		int k = 0;
		for (int i = 0; i < nb; i++) {
			unsigned p = bd[i].producer, c = bd[i].consumer;
			double lane = lane_next;
			if (p >= (unsigned)nl || c >= (unsigned)nl)
				continue;
			if (p >= c || bx[c].row != bx[p].row + 1)
				lane = lane_next + (k++) * LANE_W;
			write_boundary(f, i, &bd[i], bx, lane, &lbl_x[i], &lbl_y[i]);
			lbl_i[i] = 1;
		}
	}
	fputs("</g>\n<g class=\"launches\">\n", f);
	for (int i = 0; i < nl; i++)
		write_launch(f, b, i, &bx[i]);
	/* labels last, above boxes and arrows */
	fputs("</g>\n<g class=\"labels\">\n", f);
	for (int i = 0; i < nb; i++) {
		const char *r = str_or(bd[i].reason, "?");
		int chars = n_chars(r) < 24 ? n_chars(r) : 24;
		double w = chars * 6.1 + 8;
		if (!lbl_i[i])
			continue;
		fprintf(f, "<g class=\"reason-label\" data-boundary=\"%d\"><rect class=\"label\" x=\"%.1f\" "
			   "y=\"%.1f\" width=\"%.1f\" height=\"13\" rx=\"3\"/><text class=\"reason\" x=\"%.1f\" "
			   "y=\"%.1f\">", i, lbl_x[i] - w / 2, lbl_y[i] - 8, w, lbl_x[i] - w / 2 + 4,
			lbl_y[i] + 2);
		esc_n(f, r, 24);
		fputs("</text></g>\n", f);
	}
	fprintf(f, "</g>\n</svg>\n</div>\n<script>\n%s</script>\n</body>\n</html>\n", PAGE_SCRIPT);
	if (fflush(f) != 0 || ferror(f))
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "explain-html: write failed: %s",
				  strerror(errno));
out:
	free(bx);
	free(bd);
	free(row_w);
	free(row_h);
	free(row_y);
	free(lbl_x);
	free(lbl_y);
	free(lbl_i);
	free(kn.v);
	return rc;
}

int ap_report_html_file(const char *path, const ap_bundle *b, const char *model, ap_error *err)
{
	ap_report_info info = { .model = model };
	FILE *f;
	int rc;

	if (!path || !b)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "explain-html: no %s",
				    path ? "bundle" : "path");
	f = fopen(path, "w");
	if (!f)
		return ap_error_set(err, AP_EIO, NULL, NULL, "explain-html: cannot write %s: %s", path,
				    strerror(errno));
	rc = ap_report_html(f, b, &info, err);
	if (fclose(f) != 0 && rc == 0)
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "explain-html: cannot write %s: %s", path,
				  strerror(errno));
	else if (rc == AP_EIO && err)
		ap_error_set(err, AP_EIO, NULL, NULL, "explain-html: cannot write %s: %s", path,
			     strerror(errno));
	if (rc < 0)
		unlink(path);
	return rc;
}
