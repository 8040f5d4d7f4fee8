/* report.c -- a bundle as a human-readable summary or as one line of JSON
 * (what `apollo-client submit [--json]` prints and bench/run.sh parses).
 * JSON strings are escaped per RFC 8259; numbers that are not finite are
 * written as null.
 */
#include "tool.h"

#include <math.h>
#include <string.h>

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

static void json_num(FILE *f, double v)
{
	if (isfinite(v))
		fprintf(f, "%.3f", v);
	else
		fputs("null", f);
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

static uint64_t blob_total(const ap_bundle *b)
{
	uint64_t total = 0;
	ap_bundle_kernel k;

	for (int i = 0; i < ap_bundle_n_kernels(b); i++)
		if (ap_bundle_kernel_get(b, i, &k) == 0)
			total += k.blob_bytes;
	return total;
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
	fprintf(f, ",\"kernels\":%d,\"eager_kernels\":%u,\"nodes\":%u",
		ap_bundle_n_kernels(b), s.eager_kernels, s.nodes);
	fprintf(f, ",\"cache\":\"%s\"", s.cache_hit ? "hit" : "miss");
	fputs(",\"compile_ms\":", f);
	json_num(f, s.compile_ms);
	fputs(",\"import_ms\":", f);
	json_num(f, s.import_ms);
	fputs(",\"partition_ms\":", f);
	json_num(f, s.partition_ms);
	fputs(",\"codegen_ms\":", f);
	json_num(f, s.codegen_ms);
	fputs(",\"backend_ms\":", f);
	json_num(f, s.backend_ms);
	fputs(",\"cache_ms\":", f);
	json_num(f, s.cache_ms);
	fputs(",\"client_import_ms\":", f);
	json_num(f, info ? info->import_ms : 0);
	fputs(",\"round_trip_ms\":", f);
	json_num(f, info ? info->round_trip_ms : 0);
	fprintf(f, ",\"kernels_compiled\":%u,\"stats_kernels\":%u", s.kernels_compiled, s.kernels);
	fprintf(f, ",\"global_bytes\":%llu,\"eager_bytes\":%llu,\"min_bytes\":%llu",
		(unsigned long long)s.global_bytes, (unsigned long long)s.eager_bytes,
		(unsigned long long)s.min_bytes);
	fprintf(f, ",\"workspace_bytes\":%llu,\"launches\":%d,\"buffers\":%d,\"blob_bytes\":%llu",
		(unsigned long long)ap_bundle_workspace_bytes(b), ap_bundle_n_launches(b),
		ap_bundle_n_buffers(b), (unsigned long long)blob_total(b));
	fprintf(f, ",\"graph_hash\":\"%s\"", hex);
	fputs(",\"kernel_list\":[", f);
	for (int i = 0; i < ap_bundle_n_kernels(b); i++) {
		ap_bundle_kernel k;
		if (ap_bundle_kernel_get(b, i, &k) < 0)
			continue;
		fputs(i ? ",{\"name\":" : "{\"name\":", f);
		ap_json_string(f, k.name);
		fputs(",\"nodes\":[", f);
		for (int n = 0; n < k.n_nodes; n++) {
			if (n)
				fputc(',', f);
			ap_json_string(f, k.nodes[n]);
		}
		fprintf(f, "],\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"smem_bytes\":%u",
			k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1], k.block[2],
			k.smem_bytes);
		fprintf(f, ",\"blob_bytes\":%zu,\"params\":%d}", k.blob_bytes, k.n_params);
	}
	fputs("]}\n", f);
}

void ap_report_text(FILE *f, const ap_bundle *b, const ap_report_info *info)
{
	ap_bundle_stats s;
	int nk = ap_bundle_n_kernels(b);

	ap_bundle_stats_get(b, &s);
	fprintf(f, "%s%s%d kernels for %s (%s), %u eager kernels, %u nodes\n",
		info && info->model ? info->model : "", info && info->model ? ": " : "", nk,
		ap_bundle_target(b), format_name(ap_bundle_format(b)), s.eager_kernels, s.nodes);
	for (int i = 0; i < nk; i++) {
		ap_bundle_kernel k;
		if (ap_bundle_kernel_get(b, i, &k) < 0)
			continue;
		fprintf(f, "  %3d %-32s grid %u,%u,%u block %u,%u,%u smem %u  %zu B  [", i, k.name,
			k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1], k.block[2],
			k.smem_bytes, k.blob_bytes);
		for (int n = 0; n < k.n_nodes; n++) {
			if (n == 8) {
				fprintf(f, " ... +%d", k.n_nodes - n);
				break;
			}
			fprintf(f, "%s%s", n ? " " : "", k.nodes[n]);
		}
		fputs("]\n", f);
	}
	fprintf(f, "cache %s; compile %.1f ms in the daemon (import %.1f, partition %.1f, "
		   "codegen %.1f, backend %.1f, cache %.1f); %u kernels compiled\n",
		s.cache_hit ? "hit" : "miss", s.compile_ms, s.import_ms, s.partition_ms,
		s.codegen_ms, s.backend_ms, s.cache_ms, s.kernels_compiled);
	if (info)
		fprintf(f, "client: import %.1f ms, round trip %.1f ms\n", info->import_ms,
			info->round_trip_ms);
	fprintf(f, "modelled global memory: %llu B fused, %llu B eager, %llu B minimum; "
		   "workspace %llu B; %d launches, %d buffers, %llu B of blobs\n",
		(unsigned long long)s.global_bytes, (unsigned long long)s.eager_bytes,
		(unsigned long long)s.min_bytes,
		(unsigned long long)ap_bundle_workspace_bytes(b), ap_bundle_n_launches(b),
		ap_bundle_n_buffers(b), (unsigned long long)blob_total(b));
}
