/* keys.c -- the compile job's cache keys (graph, kernel, ONNX
 * request) and its targets (compile.h).
 *
 * Cache keys hash inputs only (docs/design.md): NVRTC output is not
 * reproducible, so a key never depends on a compiled byte.  The stored
 * bundle has its kernel blobs replaced by their digests; blobs live once in
 * the content-addressed table, shared by every bundle and kernel key that
 * names them, and are verified on every read.
 */
#include "compile_internal.h"

/* ---- keys ---------------------------------------------------------------- */

/* Adds one field as (tag, NUL, 8-byte little-endian length, bytes), so that
 * no two different field lists hash the same byte string. */
static void key_field(ap_sha256_ctx *h, const char *tag, const void *data, size_t len)
{
	uint8_t n[8];

	for (int i = 0; i < 8; i++)
		n[i] = (uint8_t)((uint64_t)len >> (8 * i));
	ap_sha256_update(h, tag, strlen(tag) + 1);
	ap_sha256_update(h, n, 8);
	if (len)
		ap_sha256_update(h, data, len);
}

static void key_str(ap_sha256_ctx *h, const char *tag, const char *s)
{
	key_field(h, tag, s ? s : "", s ? strlen(s) : 0);
}

static void key_uint(ap_sha256_ctx *h, const char *tag, uint64_t v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
	key_str(h, tag, buf);
}

/* The fields every key shares; `kind` tells the key families apart. */
static void key_common(ap_sha256_ctx *h, const char *kind, const char *target, int output,
		       const char *backend_id)
{
	key_str(h, "kind", kind);
	key_str(h, "target", target);
	key_uint(h, "output", (uint64_t)output);
	key_str(h, "backend", backend_id);
	key_str(h, "apollo", AP_VERSION);
	key_uint(h, "schema", APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A list of strings as a set: sorted, so that order does not matter. */
static void key_str_set(ap_sha256_ctx *h, const char *tag, char **v, size_t n)
{
	char **sorted = n ? malloc(n * sizeof(*sorted)) : NULL;

	key_uint(h, tag, n);
	if (n && !sorted) {
		/* Out of memory: hash in the given order (at worst a miss). */
		for (size_t i = 0; i < n; i++)
			key_str(h, tag, v[i]);
		return;
	}
	if (n) {
		memcpy(sorted, v, n * sizeof(*sorted));
		qsort(sorted, n, sizeof(*sorted), cmp_str);
	}
	for (size_t i = 0; i < n; i++)
		key_str(h, tag, sorted[i]);
	free(sorted);
}

/* Every option that can change the answer; no_cache cannot. */
static void key_options(ap_sha256_ctx *h, const Apollo__CompileOptions *opt)
{
	key_str(h, "namespace", opt ? opt->cache_namespace : "");
	key_uint(h, "max_block_threads", opt ? opt->max_block_threads : 0);
	key_uint(h, "fusion", opt ? (uint64_t)opt->fusion : 0);
	key_str_set(h, "fusion_barrier", opt ? opt->fusion_barriers : NULL,
		    opt ? opt->n_fusion_barriers : 0);
	key_str_set(h, "keep_whole", opt ? opt->keep_whole : NULL, opt ? opt->n_keep_whole : 0);
	if (opt && opt->allow_tf32)   /* only when set: earlier keys stay what they were */
		key_uint(h, "allow_tf32", 1);
	if (opt && opt->no_layer1)
		key_uint(h, "no_layer1", 1);
	if (opt && opt->no_tune)
		key_uint(h, "no_tune", 1);
	if (opt && opt->tune_variant)
		key_uint(h, "tune_variant", opt->tune_variant);
	if (opt && opt->host_check)
		key_uint(h, "host_check", 1);
	if (opt && opt->tma)
		key_uint(h, "tma", 1);
	if (opt && opt->unvalidated)
		key_uint(h, "unvalidated", 1);
}

/* A key can only be had whole: without a hash context it would be all
 * zero, and every request that ran out of memory there would share one
 * cache entry. */
int ap_compile_graph_key(const uint8_t graph_hash[32], const char *target, int output,
			 const struct Apollo__CompileOptions *opt, const char *backend_id,
			 uint8_t key[32])
{
	ap_sha256_ctx *h = ap_sha256_new();

	if (!h)
		return AP_ENOMEM;
	key_common(h, "graph", target, output, backend_id);
	key_field(h, "graph_hash", graph_hash, 32);
	key_options(h, opt);
	ap_sha256_final(h, key);
	return 0;
}

int ap_compile_kernel_key(const char *src, const char *entry, const char *target, int output,
			  const char *backend_id, uint8_t key[32])
{
	ap_sha256_ctx *h = ap_sha256_new();

	if (!h)
		return AP_ENOMEM;
	key_common(h, "kernel", target, output, backend_id);
	key_str(h, "source", src);
	key_str(h, "entry", entry);
	ap_sha256_final(h, key);
	return 0;
}

/* Key of an ONNX request, before import: the model bytes and bindings as
 * sent, so that a warm ONNX submit skips the import too.  0 or AP_ENOMEM. */
int ap__compile_onnx_request_key(const Apollo__CompileRequest *req, const char *target, int output,
			    const char *backend_id, uint8_t key[32])
{
	ap_sha256_ctx *h = ap_sha256_new();

	if (!h)
		return AP_ENOMEM;
	key_common(h, "onnx", target, output, backend_id);
	key_field(h, "model", req->onnx_model.data, req->onnx_model.len);
	key_uint(h, "bindings", req->n_bindings);
	for (size_t i = 0; i < req->n_bindings; i++) {
		const Apollo__Tensor *t = req->bindings[i];
		key_str(h, "name", t->name);
		key_uint(h, "dtype", (uint64_t)t->dtype);
		key_uint(h, "rank", t->n_dims);
		for (size_t d = 0; d < t->n_dims; d++)
			key_uint(h, "dim", (uint64_t)t->dims[d]);
		key_field(h, "data", t->data.data, t->data.len);
	}
	key_options(h, req->options);
	ap_sha256_final(h, key);
	return 0;
}

/* ---- targets ------------------------------------------------------------- */

/* Matches PREFIX followed by 2-3 digits and at most one lowercase letter. */
static bool arch_like(const char *t, const char *prefix)
{
	size_t n = strlen(prefix), d = 0;

	if (strncmp(t, prefix, n))
		return false;
	t += n;
	while (t[d] >= '0' && t[d] <= '9')
		d++;
	if (d < 2 || d > 3)
		return false;
	t += d;
	return !*t || (*t >= 'a' && *t <= 'z' && !t[1]);
}

int ap_compile_parse_target(const char *target, int output, bool *gpu, int *resolved,
			    ap_error *err)
{
	const char *t = target && *target ? target : "cpu";

	if (output < APOLLO__OUTPUT_KIND__OUTPUT_DEFAULT || output > APOLLO__OUTPUT_KIND__OUTPUT_SO)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL, "unknown output kind %d", output);
	if (!strcmp(t, "cpu")) {
		*gpu = false;
		if (output != APOLLO__OUTPUT_KIND__OUTPUT_DEFAULT && output != APOLLO__OUTPUT_KIND__OUTPUT_SO)
			return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
					    "target cpu produces a host shared object, not %s",
					    output == APOLLO__OUTPUT_KIND__OUTPUT_PTX ? "PTX" : "cubin");
		*resolved = APOLLO__OUTPUT_KIND__OUTPUT_SO;
		return 0;
	}
	if (!strncmp(t, "host:", 5) && (arch_like(t + 5, "sm_") || arch_like(t + 5, "compute_"))) {
		/* the GPU's kernels run on the host: lowered for it, host C */
		*gpu = false;
		if (output != APOLLO__OUTPUT_KIND__OUTPUT_DEFAULT && output != APOLLO__OUTPUT_KIND__OUTPUT_SO)
			return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
					    "target %s runs on the host: a shared object, not %s", t,
					    output == APOLLO__OUTPUT_KIND__OUTPUT_PTX ? "PTX" : "cubin");
		*resolved = APOLLO__OUTPUT_KIND__OUTPUT_SO;
		return 0;
	}
	if (arch_like(t, "sm_")) {
		*gpu = true;
		if (output == APOLLO__OUTPUT_KIND__OUTPUT_SO)
			return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
					    "target %s produces PTX or cubin, not a host shared object", t);
		*resolved = output == APOLLO__OUTPUT_KIND__OUTPUT_PTX ? APOLLO__OUTPUT_KIND__OUTPUT_PTX
								      : APOLLO__OUTPUT_KIND__OUTPUT_CUBIN;
		return 0;
	}
	if (arch_like(t, "compute_")) {
		*gpu = true;
		if (output == APOLLO__OUTPUT_KIND__OUTPUT_CUBIN || output == APOLLO__OUTPUT_KIND__OUTPUT_SO)
			return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
					    "target %s is a virtual architecture: PTX only (cubin needs sm_%s)",
					    t, t + 8);
		*resolved = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
		return 0;
	}
	return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
			    "unknown target '%.64s': expected cpu, sm_XX (e.g. sm_90, sm_90a), compute_XX "
			    "or host:sm_XX (emulated on the host)",
			    t);
}
