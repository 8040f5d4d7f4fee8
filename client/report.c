/* report.c -- a bundle as a human-readable summary or as one line of JSON
 * (what `apollo-client submit [--json] [--explain]` prints and
 * bench/run.sh parses).  JSON strings are escaped per RFC 8259; numbers
 * that are not finite are written as null.
 */
#include "tool.h"

#include <math.h>
#include <string.h>

#include "proto/apollo.pb-c.h"

void ap_json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
		switch (*p) {
		case '"': fputs("\\\"", f); break;
		case '\\': fputs("\\\\", f); break;
		case '\n': fputs("\\n", f); break;
		case '\r': fputs("\\r", f); break;
		case '\t': fputs("\\t", f); break;
		case '\b': fputs("\\b", f); break;
		case '\f': fputs("\\f", f); break;
		default:
			if (*p < 0x20)
				fprintf(f, "\\u%04x", *p);
			else
				fputc(*p, f);
		}
	}
	fputc('"', f);
}

static void json_num(FILE *f, const char *key, double v)
{
	fprintf(f, ",\"%s\":", key);
	if (isfinite(v))
		fprintf(f, "%.3f", v);
	else
		fputs("null", f);
}

static void json_strings(FILE *f, int n, const char *const *v)
{
	fputc('[', f);
	for (int i = 0; i < n; i++) {
		if (i)
			fputc(',', f);
		ap_json_string(f, v[i]);
	}
	fputc(']', f);
}

static const char *format_name(ap_output_kind k)
{
	switch (k) {
	case AP_OUTPUT_PTX: return "ptx";
	case AP_OUTPUT_CUBIN: return "cubin";
	case AP_OUTPUT_SO: return "so";
	default: return "default";
	}
}

static const char *buffer_kind_name(ap_bundle_buffer_kind k)
{
	switch (k) {
	case AP_BUNDLE_BUF_INPUT: return "input";
	case AP_BUNDLE_BUF_OUTPUT: return "output";
	case AP_BUNDLE_BUF_PARAM: return "param";
	case AP_BUNDLE_BUF_CONST: return "const";
	case AP_BUNDLE_BUF_INTERMEDIATE: return "intermediate";
	default: return "unknown";
	}
}

/* ,"reads":[..],"writes":[..] -- the buffer indices launch arguments bind,
 * split by the kernel parameter's `written` flag; each buffer once, in
 * argument order. */
static void json_launch_buffers(FILE *f, const ap_bundle *b, unsigned kernel, int n_args,
				const uint32_t *args)
{
	for (int pass = 0; pass < 2; pass++) {
		int n = 0;
		fputs(pass ? ",\"writes\":[" : ",\"reads\":[", f);
		for (int a = 0; a < n_args; a++) {
			ap_bundle_param p;
			bool seen = false;
			if (ap_bundle_kernel_param(b, (int)kernel, a, &p) < 0 || p.written != (pass == 1))
				continue;
			for (int e = 0; e < a && !seen; e++) {
				ap_bundle_param q;
				seen = args[e] == args[a] &&
				       ap_bundle_kernel_param(b, (int)kernel, e, &q) == 0 &&
				       q.written == p.written;
			}
			if (!seen)
				fprintf(f, "%s%u", n++ ? "," : "", args[a]);
		}
		fputc(']', f);
	}
}

/* Bytes of the bundle's blobs, a blob several kernels share (one program)
 * counted once. */
static uint64_t blob_total(const ap_bundle *b)
{
	const Apollo__Bundle *pb = ap_bundle_pb(b);
	uint64_t total = 0;

	for (size_t i = 0; i < pb->n_kernels; i++)
		if (pb->kernels[i] && !pb->kernels[i]->blob_of)
			total += pb->kernels[i]->blob.len;
	return total;
}

/* ["II","III"] for layer bits. */
static void json_layers(FILE *f, unsigned layers)
{
	static const char *const names[] = {"I", "II", "III"};
	bool first = true;

	fputc('[', f);
	for (int i = 0; i < 3; i++)
		if (layers & (1u << i)) {
			fprintf(f, "%s\"%s\"", first ? "" : ",", names[i]);
			first = false;
		}
	fputc(']', f);
}

/* The report's word for where the answer came from: "miss" (compiled),
 * "hit" (the daemon's own cache), "remote-hit" (the shared cache),
 * "shared-hit" (an identical request compiled it). */
static const char *cache_word(const ap_bundle_stats *s)
{
	static const char *const words[] = { "miss", "hit", "remote-hit", "shared-hit" };

	return words[s->cache_tier & 3];
}

/* The most recomputed intermediate's modelled evaluations per element,
 * over launch `i`'s parts (every launch when i < 0); 1 when none is
 * modelled. */
static double bundle_recompute(const ap_bundle *b, int i)
{
	double worst = 1;

	for (int l = i < 0 ? 0 : i; l < (i < 0 ? ap_bundle_n_launches(b) : i + 1); l++)
		for (int j = 0; j < ap_bundle_launch_n_parts(b, l); j++) {
			ap_bundle_launch_part pt;

			if (ap_bundle_launch_part_get(b, l, j, &pt) == 0 && pt.recompute > worst)
				worst = pt.recompute;
		}
	return worst;
}

void ap_report_json(FILE *f, const ap_bundle *b, const ap_report_info *info)
{
	ap_bundle_stats s;
	size_t hlen;
	const uint8_t *h = ap_bundle_graph_hash(b, &hlen);
	char hex[65] = "";

	ap_bundle_stats_get(b, &s);
	if (h && hlen == 32)
		ap_hex(h, 32, hex);
	fputs("{\"model\":", f);
	ap_json_string(f, info && info->model ? info->model : "");
	fputs(",\"target\":", f);
	ap_json_string(f, ap_bundle_target(b));
	fprintf(f, ",\"format\":\"%s\"", format_name(ap_bundle_format(b)));
	fprintf(f, ",\"kernels\":%d,\"distinct_kernels\":%d,\"eager_kernels\":%u,\"nodes\":%u",
		ap_bundle_n_launches(b), ap_bundle_n_kernels(b), s.eager_kernels, s.nodes);
	fprintf(f, ",\"cache\":\"%s\",\"cache_tier\":\"%s\"", cache_word(&s),
		ap_cache_tier_name(s.cache_tier));
	json_num(f, "compile_ms", s.compile_ms);
	json_num(f, "import_ms", s.import_ms);
	json_num(f, "partition_ms", s.partition_ms);
	json_num(f, "codegen_ms", s.codegen_ms);
	json_num(f, "backend_ms", s.backend_ms);
	json_num(f, "cache_ms", s.cache_ms);
	json_num(f, "client_import_ms", info ? info->import_ms : 0);
	json_num(f, "round_trip_ms", info ? info->round_trip_ms : 0);
	fprintf(f, ",\"kernels_compiled\":%u,\"kernels_remote\":%u,\"kernels_shared\":%u",
		s.kernels_compiled, s.kernels_remote, s.kernels_shared);
	fprintf(f, ",\"layers\":{\"I\":%u,\"II\":%u,\"III\":%u}", s.layer1, s.layer2, s.layer3);
	json_num(f, "layer1_ms", s.layer1_ms);
	fprintf(f, ",\"tuning\":{\"hits\":%u,\"measured\":%u,\"searched\":%u,\"candidates\":%u,"
		   "\"capped\":%u", s.tune_hits, s.tune_measured, s.tune_searched, s.tune_tried,
		s.tune_capped);
	json_num(f, "ms", s.tune_ms);
	fputc('}', f);
	json_num(f, "recompute_ratio", bundle_recompute(b, -1));
	fprintf(f, ",\"global_bytes\":%llu,\"eager_bytes\":%llu,\"min_bytes\":%llu",
		(unsigned long long)s.global_bytes, (unsigned long long)s.eager_bytes,
		(unsigned long long)s.min_bytes);
	fprintf(f, ",\"workspace_bytes\":%llu,\"peak_bytes\":%llu,\"input_bytes\":%llu,"
		   "\"output_bytes\":%llu,\"const_bytes\":%llu",
		(unsigned long long)ap_bundle_workspace_bytes(b), (unsigned long long)s.peak_bytes,
		(unsigned long long)s.input_bytes, (unsigned long long)s.output_bytes,
		(unsigned long long)s.const_bytes);
	fprintf(f, ",\"buffers\":%d,\"blob_bytes\":%llu,\"boundaries\":%d", ap_bundle_n_buffers(b),
		(unsigned long long)blob_total(b), ap_bundle_n_boundaries(b));
	fprintf(f, ",\"graph_hash\":\"%s\"", hex);
	fputs(",\"kernel_list\":[", f);
	for (int i = 0; i < ap_bundle_n_kernels(b); i++) {
		ap_bundle_kernel k;
		if (ap_bundle_kernel_get(b, i, &k) < 0)
			continue;
		fputs(i ? ",{\"name\":" : "{\"name\":", f);
		ap_json_string(f, k.name);
		fputs(",\"nodes\":", f);
		json_strings(f, k.n_nodes, k.nodes);
		fprintf(f, ",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"smem_bytes\":%u",
			k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1], k.block[2],
			k.smem_bytes);
		fprintf(f, ",\"blob_bytes\":%zu,\"params\":%d}", k.blob_bytes, k.n_params);
	}
	fputs("],\"launch_list\":[", f);
	for (int i = 0; i < ap_bundle_n_launches(b); i++) {
		ap_bundle_kernel k;
		unsigned kernel = 0;
		int n_args = 0, n_nodes = 0;
		const uint32_t *args = NULL;
		const char *const *nodes = NULL;
		const char *cat = "";
		ap_bundle_launch(b, i, &kernel, &n_args, &args);
		ap_bundle_launch_nodes(b, i, &n_nodes, &nodes, &cat);
		fprintf(f, "%s{\"kernel\":%u,\"name\":", i ? "," : "", kernel);
		ap_json_string(f, ap_bundle_kernel_get(b, (int)kernel, &k) == 0 ? k.name : "");
		fputs(",\"category\":", f);
		ap_json_string(f, cat);
		fputs(",\"nodes\":", f);
		json_strings(f, n_nodes, nodes);
		{
			uint64_t bytes;
			unsigned layers = ap_bundle_launch_layers(b, i, &bytes);

			fputs(",\"layers\":", f);
			json_layers(f, layers);
			fprintf(f, ",\"global_bytes\":%llu", (unsigned long long)bytes);
			json_num(f, "recompute_ratio", bundle_recompute(b, i));
		}
		if (info && info->explain) {
			json_launch_buffers(f, b, kernel, n_args, args);
			fputs(",\"parts\":[", f);
			for (int j = 0; j < ap_bundle_launch_n_parts(b, i); j++) {
				ap_bundle_launch_part pt;

				if (ap_bundle_launch_part_get(b, i, j, &pt) < 0)
					continue;
				fputs(j ? ",{\"category\":" : "{\"category\":", f);
				ap_json_string(f, pt.category);
				fprintf(f, ",\"block_begin\":%u,\"blocks\":%u,\"nodes\":", pt.block_begin,
					pt.blocks);
				json_strings(f, pt.n_nodes, pt.nodes);
				fputs(",\"layers\":", f);
				json_layers(f, pt.layers);
				fputs(",\"detail\":", f);
				ap_json_string(f, pt.detail);
				fputs(",\"emitter\":", f);
				ap_json_string(f, pt.emitter);
				fputs(",\"schedule\":", f);
				ap_json_string(f, pt.schedule);
				json_num(f, "recompute_ratio", pt.recompute);
				fprintf(f, ",\"layer1\":%s", pt.layer1[0] ? "true" : "false");
				fputc('}', f);
			}
			fputc(']', f);
		}
		fputc('}', f);
	}
	fputc(']', f);
	if (info && info->explain) {
		fputs(",\"buffer_list\":[", f);
		for (int i = 0; i < ap_bundle_n_buffers(b); i++) {
			ap_bundle_buffer bf;
			if (ap_bundle_buffer_get(b, i, &bf) < 0)
				continue;
			fputs(i ? ",{\"name\":" : "{\"name\":", f);
			ap_json_string(f, bf.name);
			fprintf(f, ",\"kind\":\"%s\",\"bytes\":%llu}", buffer_kind_name(bf.kind),
				(unsigned long long)bf.bytes);
		}
		fputc(']', f);
		fputs(",\"boundary_list\":[", f);
		for (int i = 0; i < ap_bundle_n_boundaries(b); i++) {
			ap_bundle_boundary x;
			ap_bundle_boundary_get(b, i, &x);
			fprintf(f, "%s{\"producer\":%u,\"consumer\":%u,\"tensor\":", i ? "," : "",
				x.producer, x.consumer);
			ap_json_string(f, x.tensor);
			fputs(",\"reason\":", f);
			ap_json_string(f, x.reason);
			fputs(",\"detail\":", f);
			ap_json_string(f, x.detail);
			fputc('}', f);
		}
		fputc(']', f);
	}
	fputs("}\n", f);
}

/* Up to `max` names (all when max < 0), then "... +N". */
static void text_names(FILE *f, int n, const char *const *v, int max)
{
	for (int i = 0; i < n; i++) {
		if (max >= 0 && i == max) {
			fprintf(f, " ... +%d", n - i);
			break;
		}
		fprintf(f, "%s%s", i ? " " : "", v[i]);
	}
}

/* The boundaries counted by reason, in order of first appearance:
 * "rule 12, level 3".  Reasons past the 32nd distinct one are summed as
 * "other". */
static void text_reason_counts(FILE *f, const ap_bundle *b)
{
	const char *keys[32];
	int counts[32], n = 0, other = 0;

	for (int i = 0; i < ap_bundle_n_boundaries(b); i++) {
		ap_bundle_boundary x;
		int j;
		if (ap_bundle_boundary_get(b, i, &x) < 0)
			continue;
		for (j = 0; j < n && strcmp(keys[j], x.reason); j++)
			;
		if (j < n) {
			counts[j]++;
		} else if (n < 32) {
			keys[n] = x.reason;
			counts[n++] = 1;
		} else {
			other++;
		}
	}
	for (int j = 0; j < n; j++)
		fprintf(f, "%s%s %d", j ? ", " : "", keys[j][0] ? keys[j] : "(none)", counts[j]);
	if (other)
		fprintf(f, "%sother %d", n ? ", " : "", other);
}

/* Under a launch of the explain report: which fusion layer stitched it
 * and how ("    stitched by Layer II: ..." / "    stitched: Layer III ...",
 * then its parts). */
/* The library call of launch i, when the daemon chose one (issue 25):
 * "    library: cuBLASLt matmul 4096 x 4096 x 4096 float16, epilogue
 * bias+relu (then ", alpha A" when not 1, ", plus B x C" for a residual,
 * ", N KiB workspace"); chosen by the cost model: 174.3 us modelled vs 193.1 us for
 * Apollo's kernel (which the host target, or a runtime without
 * libcublasLt, runs)".  Nothing without one. */
static void text_library(FILE *f, const ap_bundle *b, int i)
{
	const Apollo__Bundle *pb = ap_bundle_pb(b);
	const Apollo__LibraryCall *lc;
	const char *epi;

	if (i < 0 || (size_t)i >= pb->n_plan || !(lc = pb->plan[i]->library))
		return;
	switch (lc->epilogue) {
	case APOLLO__LIBRARY_EPILOGUE__LIB_EPI_RELU: epi = "relu"; break;
	case APOLLO__LIBRARY_EPILOGUE__LIB_EPI_BIAS: epi = "bias"; break;
	case APOLLO__LIBRARY_EPILOGUE__LIB_EPI_BIAS_RELU: epi = "bias+relu"; break;
	case APOLLO__LIBRARY_EPILOGUE__LIB_EPI_GELU: epi = "gelu(tanh)"; break;
	case APOLLO__LIBRARY_EPILOGUE__LIB_EPI_BIAS_GELU: epi = "bias+gelu(tanh)"; break;
	default: epi = "none"; break;
	}
	fprintf(f, "    library: cuBLASLt matmul %u x %u x %u", lc->m, lc->n, lc->k);
	if (lc->batch > 1)
		fprintf(f, " (%u batches)", lc->batch);
	fprintf(f, " %s%s, epilogue %s", ap_dtype_name((ap_dtype)lc->a_type),
		lc->compute == APOLLO__LIBRARY_COMPUTE__LIB_COMPUTE_F32_FAST_TF32 ? " (TF32)" : "", epi);
	if (lc->alpha != 1)
		fprintf(f, ", alpha %g", (double)lc->alpha);
	if (lc->beta != 0)
		fprintf(f, ", plus %g x C", (double)lc->beta);
	if (lc->workspace_bytes)
		fprintf(f, ", %llu KiB workspace", (unsigned long long)(lc->workspace_bytes >> 10));
	fprintf(f, "; chosen by the %s (schedule lib=1): %.1f us modelled vs ",
		lc->chosen_by && *lc->chosen_by ? lc->chosen_by : "cost model", lc->library_us);
	if (isfinite(lc->kernel_us))
		fprintf(f, "%.1f us", lc->kernel_us);
	else
		fprintf(f, "a register spill");
	fprintf(f, " for Apollo's kernel at this tile, which the host target and a runtime "
		"without libcublasLt run\n");
}

static void text_layers(FILE *f, const ap_bundle *b, int i)
{
	int np = ap_bundle_launch_n_parts(b, i);

	text_library(f, b, i);

	if (np > 1)
		fprintf(f, "    stitched: Layer III launches %d independent micro-graphs together, "
			"split by blockIdx ranges:\n", np);
	for (int j = 0; j < np; j++) {
		ap_bundle_launch_part pt;

		if (ap_bundle_launch_part_get(b, i, j, &pt) < 0)
			continue;
		if (np > 1) {
			fprintf(f, "      blocks [%u, %u) %s: ", pt.block_begin, pt.block_begin + pt.blocks,
				pt.category[0] ? pt.category : "-");
			text_names(f, pt.n_nodes, pt.nodes, -1);
			fputc('\n', f);
		}
		if (pt.detail[0])
			fprintf(f, "    %s%s\n", np > 1 ? "  " : "", pt.detail);
		if (pt.emitter[0])
			fprintf(f, "    %semitter %s: %s\n", np > 1 ? "  " : "", pt.emitter, pt.schedule);
		if (pt.layer1[0])
			fprintf(f, "    %sLayer I: scheduled by isl (%.2f evaluations per staged element)\n",
				np > 1 ? "  " : "", pt.recompute);
		else if (pt.emitter[0])
			fprintf(f, "    %sLayer I: not scheduled (%s)\n", np > 1 ? "  " : "",
				!strcmp(pt.category, "window") ? "the pooled tensor is read from memory"
							       : "not a window micro-graph");
	}
}

void ap_report_text(FILE *f, const ap_bundle *b, const ap_report_info *info)
{
	ap_bundle_stats s;
	int nl = ap_bundle_n_launches(b);
	bool explain = info && info->explain;

	ap_bundle_stats_get(b, &s);
	fprintf(f, "%s%s%d kernel launches (%d distinct kernels) for %s (%s); eager: %u kernels, %u nodes\n",
		info && info->model ? info->model : "", info && info->model ? ": " : "", nl,
		ap_bundle_n_kernels(b), ap_bundle_target(b), format_name(ap_bundle_format(b)),
		s.eager_kernels, s.nodes);
	for (int i = 0; i < nl; i++) {
		ap_bundle_kernel k;
		unsigned kernel = 0;
		int n_args, n_nodes;
		const uint32_t *args;
		const char *const *nodes;
		const char *cat;
		if (ap_bundle_launch(b, i, &kernel, &n_args, &args) < 0 ||
		    ap_bundle_kernel_get(b, (int)kernel, &k) < 0)
			continue;
		ap_bundle_launch_nodes(b, i, &n_nodes, &nodes, &cat);
		if (explain)
			fprintf(f, "  launch %d %s %s: ", i, k.name, cat[0] ? cat : "-");
		else
			fprintf(f, "  %3d %-28s %-11s grid %u,%u,%u block %u,%u,%u smem %u %7zu B  [",
				i, k.name, cat[0] ? cat : "-", k.grid[0], k.grid[1], k.grid[2],
				k.block[0], k.block[1], k.block[2], k.smem_bytes, k.blob_bytes);
		if (n_nodes > 0)
			text_names(f, n_nodes, nodes, explain ? -1 : 6);
		else
			text_names(f, k.n_nodes, k.nodes, explain ? -1 : 6);
		fputs(explain ? "\n" : "]\n", f);
		if (explain)
			text_layers(f, b, i);
	}
	fprintf(f, "cache %s; compile %.1f ms in the daemon (import %.1f, partition %.1f, "
		   "codegen %.1f, backend %.1f, cache %.1f); %u kernels compiled\n",
		cache_word(&s), s.compile_ms, s.import_ms, s.partition_ms,
		s.codegen_ms, s.backend_ms, s.cache_ms, s.kernels_compiled);
	if (info)
		fprintf(f, "client: import %.1f ms, round trip %.1f ms\n", info->import_ms,
			info->round_trip_ms);
	fprintf(f, "fusion layers: I scheduled %u micro-graphs (%.1f ms), II stitched %u micro-graphs, "
		   "III launched %u micro-graphs together\n", s.layer1, s.layer1_ms, s.layer2, s.layer3);
	fprintf(f, "tuning: %u kernels from records (%u measured), %u searched, %u configurations "
		   "evaluated in %.1f ms\n", s.tune_hits, s.tune_measured, s.tune_searched, s.tune_tried,
		s.tune_ms);
	if (s.tune_capped)
		fprintf(f, "tuning: the daemon's time limit cut %u searches short (a loaded machine's "
			   "bundle, not cached)\n", s.tune_capped);
	fprintf(f, "modelled global memory: %llu B fused, %llu B eager, %llu B minimum; "
		   "workspace %llu B; %d buffers, %llu B of blobs\n",
		(unsigned long long)s.global_bytes, (unsigned long long)s.eager_bytes,
		(unsigned long long)s.min_bytes,
		(unsigned long long)ap_bundle_workspace_bytes(b), ap_bundle_n_buffers(b),
		(unsigned long long)blob_total(b));
	fprintf(f, "device memory: peak %llu B = inputs %llu B + outputs %llu B + constants %llu B + "
		   "workspace %llu B (parameters not counted)\n", (unsigned long long)s.peak_bytes,
		(unsigned long long)s.input_bytes, (unsigned long long)s.output_bytes,
		(unsigned long long)s.const_bytes, (unsigned long long)ap_bundle_workspace_bytes(b));
	if (explain) {
		int nb = ap_bundle_n_boundaries(b);
		fprintf(f, "%d boundaries between launches%s", nb, nb ? " (" : "\n");
		if (nb) {
			text_reason_counts(f, b);
			fputs("):\n", f);
		}
		for (int i = 0; i < nb; i++) {
			ap_bundle_boundary x;
			if (ap_bundle_boundary_get(b, i, &x) < 0)
				continue;
			fprintf(f, "  launch %u -> launch %u via %s: %s", x.producer, x.consumer,
				x.tensor[0] ? x.tensor : "?", x.reason[0] ? x.reason : "(no reason)");
			/* A detail that opens with its own reason key ("rule: ...")
			 * is shown without the repetition. */
			const char *d = x.detail;
			size_t rl = strlen(x.reason);
			if (rl && !strncmp(d, x.reason, rl) && d[rl] == ':' && d[rl + 1] == ' ' && d[rl + 2])
				d += rl + 2;
			if (d[0])
				fprintf(f, " (%s)", d);
			fputc('\n', f);
		}
	}
}

void ap_report_stats_json(FILE *f, const char *server, const ap_server_stats *s,
			  const ap_metrics *m)
{
	const Apollo__StatsReply *r = m ? ap_metrics_pb(m) : NULL;

	fputs("{\"server\":", f);
	ap_json_string(f, server);
	json_num(f, "uptime_s", s->uptime_s);
	fprintf(f, ",\"requests\":%llu,\"errors\":%llu,\"cache_hits\":%llu,\"cache_misses\":%llu,"
		"\"kernels_compiled\":%llu,\"cache_entries\":%llu,\"cache_blob_bytes\":%llu,"
		"\"clients\":%u,\"in_flight\":%u", (unsigned long long)s->requests,
		(unsigned long long)s->errors, (unsigned long long)s->cache_hits,
		(unsigned long long)s->cache_misses, (unsigned long long)s->kernels_compiled,
		(unsigned long long)s->cache_entries, (unsigned long long)s->cache_blob_bytes,
		s->clients, s->in_flight);
	fputs(",\"metrics\":{", f);
	for (size_t i = 0; r && i < r->n_metrics; i++) {
		const Apollo__MetricFamily *fam = r->metrics[i];

		fputs(i ? "," : "", f);
		ap_json_string(f, fam->name);
		fputs(":{\"type\":", f);
		ap_json_string(f, fam->type);
		fputs(",\"help\":", f);
		ap_json_string(f, fam->help);
		fputs(",\"samples\":[", f);
		for (size_t j = 0; j < fam->n_samples; j++) {
			const Apollo__MetricSample *sm = fam->samples[j];
			char name[256];

			snprintf(name, sizeof(name), "%s%s", fam->name ? fam->name : "",
				 sm->suffix ? sm->suffix : "");
			fputs(j ? ",{\"name\":" : "{\"name\":", f);
			ap_json_string(f, name);
			fputs(",\"labels\":{", f);
			for (size_t k = 0; k < sm->n_labels; k++) {
				fputs(k ? "," : "", f);
				ap_json_string(f, sm->labels[k]->name);
				fputc(':', f);
				ap_json_string(f, sm->labels[k]->value);
			}
			fputs("},\"value\":", f);
			if (!isfinite(sm->value))
				fputs("null", f);
			else if (sm->value == floor(sm->value) && fabs(sm->value) < 9e15)
				fprintf(f, "%.0f", sm->value);
			else
				fprintf(f, "%.9g", sm->value);
			fputc('}', f);
		}
		fputs("]}", f);
	}
	fputs("}}\n", f);
}
