/* compile.c -- the compile job (see compile.h): request -> graph -> cache
 * -> program -> backend -> bundle.
 *
 * Approach: the job is a straight line; each step either fills the next
 * structure or stops with an ap_error, which becomes the reply's Error.
 * Every protobuf message of the reply is allocated with malloc, field by
 * field, exactly as protobuf-c's unpacker would, so one call to
 * apollo__compile_response__free_unpacked() frees a fresh reply and a reply
 * rebuilt from the cache alike.
 *
 * Cache keys hash inputs only (DESIGN.md): NVRTC output is not
 * reproducible, so a key never depends on a compiled byte.  The stored
 * bundle has its kernel blobs replaced by their digests; blobs live once in
 * the content-addressed table, shared by every bundle and kernel key that
 * names them, and are verified on every read.
 *
 * Kernels of one request are compiled in parallel: NVRTC and cc take tens
 * to hundreds of milliseconds per kernel, and the kernels of one program
 * are independent.  The compiler owns `threads - 1` helper threads, started
 * once; a request queues its kernels for them and compiles its share on
 * its own worker thread, so it never waits on helpers busy elsewhere.
 *
 * Backend refusals (upward feedback, issue 3): a kernel NVRTC or cc
 * rejects (AP_ECOMPILE) does not fail the request.  The parallel round
 * still compiles every other kernel; then the program is built again with
 * a backend hook (ap_build_options.accept_kernel) that answers from the
 * blobs of that round by kernel name and compiles only new kernels (the
 * halves of split groups), so a fused group the backend rejects is split
 * and no kernel is compiled twice.  Only a single-node kernel that does
 * not compile fails the request.  Test hook:
 * $APOLLO_TEST_REFUSE_KERNEL_NODES=N (read once, when the compiler is
 * created) makes the backend reject every kernel of more than N member
 * nodes, as $APOLLO_TEST_COMPILE_DELAY_MS=MS delays every request.
 */
#include "compile.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../common/graph.h"
#include "../backend/backend.h"
#include "../config.h"
#include "../plan/program.h"
#include "proto/apollo.pb-c.h"

struct task_batch;

struct ap_compiler {
	ap_cache *cache;
	unsigned threads;
	/* Helper threads for the kernels of a request (see compile_kernels). */
	pthread_mutex_t mu;
	pthread_cond_t work;
	struct task_batch *queue;     /* batches with tasks not yet taken */
	bool stop;
	unsigned n_helpers;
	pthread_t *helpers;
	unsigned delay_ms;       /* $APOLLO_TEST_COMPILE_DELAY_MS: tests only */
	bool stop_before_backend;   /* tests and fuzzing only (compile.h) */
	unsigned refuse_nodes;   /* $APOLLO_TEST_REFUSE_KERNEL_NODES: tests only */
	char cc_id[256];
	char nvrtc_id[64];
	char build_id[64];       /* "apollod 0.1.0 exe <sha256 prefix>" */
	atomic_uint_fast64_t requests, errors, hits, misses, kernels_compiled;
};

/* ---- set-up -------------------------------------------------------------- */

/* "cc <first line of `$APOLLO_CC --version`>", or "cc unknown". */
static void host_cc_identity(char *buf, size_t cap)
{
	const char *cc = getenv("APOLLO_CC");
	char cmd[512], line[200] = "";
	FILE *p;

	if (!cc || !*cc)
		cc = "cc";
	snprintf(cmd, sizeof(cmd), "%s --version 2>/dev/null", cc);
	p = popen(cmd, "r");
	if (p) {
		if (!fgets(line, sizeof(line), p))
			line[0] = '\0';
		while (fgetc(p) != EOF)
			;
		pclose(p);
	}
	line[strcspn(line, "\r\n")] = '\0';
	snprintf(buf, cap, "cc %s: %s", cc, line[0] ? line : "unknown");
}

static void *helper_main(void *arg);

/* Identifies this very build: AP_VERSION and a hash of the executable, so
 * that a rebuilt daemon never answers with bundles an older build made
 * (during development AP_VERSION stays the same across changes). */
static void build_identity(char *buf, size_t cap)
{
	FILE *f = fopen("/proc/self/exe", "rb");
	ap_sha256_ctx *h = f ? ap_sha256_new() : NULL;
	char hex[65] = "unknown";

	if (h) {
		uint8_t chunk[65536], d[32];
		size_t n;

		while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
			ap_sha256_update(h, chunk, n);
		ap_sha256_final(h, d);
		ap_hex(d, 8, hex);
	}
	if (f)
		fclose(f);
	snprintf(buf, cap, "apollod %s exe %s", AP_VERSION, hex);
}

ap_compiler *ap_compiler_new(ap_cache *cache, const ap_compiler_options *opt)
{
	ap_compiler *c = calloc(1, sizeof(*c));
	const char *delay = getenv("APOLLO_TEST_COMPILE_DELAY_MS");
	const char *refuse = getenv("APOLLO_TEST_REFUSE_KERNEL_NODES");
	const char *nv;

	if (!c)
		return NULL;
	c->cache = cache;
	c->threads = opt && opt->threads ? opt->threads : 1;
	c->stop_before_backend = opt && opt->stop_before_backend;
	if (c->threads > 256)
		c->threads = 256;
	if (delay && *delay)
		c->delay_ms = (unsigned)strtoul(delay, NULL, 10);
	if (refuse && *refuse)
		c->refuse_nodes = (unsigned)strtoul(refuse, NULL, 10);
	host_cc_identity(c->cc_id, sizeof(c->cc_id));
	build_identity(c->build_id, sizeof(c->build_id));
	nv = ap_nvrtc_version();
	snprintf(c->nvrtc_id, sizeof(c->nvrtc_id), "nvrtc %s", nv ? nv : "none");
	/* libcrypto initialises itself on first use and keeps that thread's
	 * state until exit: let that be this (long-lived) thread. */
	{
		uint8_t d[32];
		ap_sha256("", 0, d);
	}
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->work, NULL);
	c->helpers = calloc(c->threads, sizeof(pthread_t));
	if (!c->helpers)
		return ap_compiler_free(c);
	for (unsigned t = 1; t < c->threads; t++) {
		if (pthread_create(&c->helpers[c->n_helpers], NULL, helper_main, c))
			break;   /* fewer helpers: slower, still correct */
		c->n_helpers++;
	}
	return c;
}

ap_compiler *ap_compiler_free(ap_compiler *c)
{
	if (!c)
		return NULL;
	pthread_mutex_lock(&c->mu);
	c->stop = true;
	pthread_cond_broadcast(&c->work);
	pthread_mutex_unlock(&c->mu);
	for (unsigned t = 0; t < c->n_helpers; t++)
		pthread_join(c->helpers[t], NULL);
	free(c->helpers);
	pthread_cond_destroy(&c->work);
	pthread_mutex_destroy(&c->mu);
	free(c);
	return NULL;
}

const char *ap_compiler_backend_id(const ap_compiler *c, bool gpu)
{
	return gpu ? c->nvrtc_id : c->cc_id;
}

void ap_compiler_get_counters(const ap_compiler *c, ap_compile_counters *out)
{
	ap_compiler *m = (ap_compiler *)c;

	memset(out, 0, sizeof(*out));
	if (!c)
		return;
	out->requests = atomic_load(&m->requests);
	out->errors = atomic_load(&m->errors);
	out->cache_hits = atomic_load(&m->hits);
	out->cache_misses = atomic_load(&m->misses);
	out->kernels_compiled = atomic_load(&m->kernels_compiled);
}

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
static int onnx_request_key(const Apollo__CompileRequest *req, const char *target, int output,
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
			    "unknown target '%.64s': expected cpu, sm_XX (e.g. sm_90, sm_90a) or compute_XX",
			    t);
}

/* ---- protobuf building ---------------------------------------------------- */

/* Allocation helpers that record a failure in *oom instead of returning it,
 * so the builder below reads straight and checks once. */
static void *xcalloc(size_t n, size_t size, bool *oom)
{
	void *p = calloc(n ? n : 1, size);

	if (!p)
		*oom = true;
	return p;
}

static char *xstrdup(const char *s, bool *oom)
{
	char *p = ap_strdup(s);

	if (!p)
		*oom = true;
	return p;
}

static void *xmemdup(const void *src, size_t n, bool *oom)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		*oom = true;
	else if (n)
		memcpy(p, src, n);
	return p;
}

/* The names ("I", "II", "III") of the fusion layers in `layers`
 * (AP_LAYER_* bits), malloc'd; *n gets the count. */
static char **layer_names(unsigned layers, size_t *n, bool *oom)
{
	static const char *const names[] = {"I", "II", "III"};
	char **v = xcalloc(3, sizeof(char *), oom);

	*n = 0;
	for (int i = 0; v && i < 3; i++)
		if (layers & (1u << i)) {
			v[*n] = xstrdup(names[i], oom);
			if (!v[*n])
				break;
			(*n)++;
		}
	return v;
}

/* A compiled kernel blob, before it goes into the bundle. */
struct kblob {
	uint8_t *data;
	size_t len;
	uint8_t digest[32];
	bool compiled;        /* by the backend (else from the kernel cache) */
	bool skipped;         /* not tried: the request had failed already */
	int rc;
	ap_error err;
};

/* Builds the bundle from the program and the blobs (taken: every
 * blobs[i].data is owned by the bundle, or freed, afterwards). */
static Apollo__Bundle *build_bundle(const ap_program *p, struct kblob *blobs, const char *target,
				    int output, const uint8_t graph_hash[32], bool *oom)
{
	Apollo__Bundle *b = xcalloc(1, sizeof(*b), oom);
	int i;

	if (!b) {
		for (i = 0; i < p->n_kernels; i++)
			free(blobs[i].data), blobs[i].data = NULL;
		return NULL;
	}
	apollo__bundle__init(b);
	b->target = xstrdup(target, oom);
	b->format = (Apollo__OutputKind)output;
	b->kernels = xcalloc((size_t)p->n_kernels, sizeof(*b->kernels), oom);
	for (i = 0; b->kernels && i < p->n_kernels; i++) {
		const ap_kernel_src *ks = &p->kernels[i];
		Apollo__Kernel *k = xcalloc(1, sizeof(*k), oom);

		if (!k)
			break;
		apollo__kernel__init(k);
		b->kernels[i] = k;
		b->n_kernels = (size_t)i + 1;
		k->name = xstrdup(ks->name, oom);
		k->target = xstrdup(target, oom);
		k->format = (Apollo__OutputKind)output;
		k->blob.data = blobs[i].data;
		k->blob.len = blobs[i].len;
		blobs[i].data = NULL;
		k->digest.data = xmemdup(blobs[i].digest, 32, oom);
		k->digest.len = k->digest.data ? 32 : 0;
		k->grid = xcalloc(3, sizeof(uint32_t), oom);
		k->block = xcalloc(3, sizeof(uint32_t), oom);
		if (k->grid && k->block) {
			k->n_grid = k->n_block = 3;
			for (int d = 0; d < 3; d++) {
				k->grid[d] = ks->grid[d];
				k->block[d] = ks->block[d];
			}
		}
		k->dynamic_shared_bytes = ks->smem_bytes;
		k->params = xcalloc((size_t)ks->n_params, sizeof(*k->params), oom);
		for (int a = 0; k->params && a < ks->n_params; a++) {
			Apollo__KernelParam *kp = xcalloc(1, sizeof(*kp), oom);
			if (!kp)
				break;
			apollo__kernel_param__init(kp);
			k->params[a] = kp;
			k->n_params = (size_t)a + 1;
			kp->name = xstrdup(ks->params[a].name, oom);
			kp->dtype = (Apollo__DataType)ks->params[a].dtype;
			kp->written = ks->params[a].written;
		}
		k->nodes = xcalloc((size_t)ks->n_nodes, sizeof(char *), oom);
		for (int a = 0; k->nodes && a < ks->n_nodes; a++) {
			k->nodes[a] = xstrdup(ks->nodes[a], oom);
			if (!k->nodes[a])
				break;
			k->n_nodes = (size_t)a + 1;
		}
	}
	for (; i < p->n_kernels; i++)
		free(blobs[i].data), blobs[i].data = NULL;

	b->plan = xcalloc((size_t)p->n_launches, sizeof(*b->plan), oom);
	for (i = 0; b->plan && i < p->n_launches; i++) {
		const ap_launch *l = &p->launches[i];
		Apollo__Launch *pl = xcalloc(1, sizeof(*pl), oom);
		if (!pl)
			break;
		apollo__launch__init(pl);
		b->plan[i] = pl;
		b->n_plan = (size_t)i + 1;
		pl->kernel = (uint32_t)l->kernel;
		pl->args = xcalloc((size_t)l->n_args, sizeof(uint32_t), oom);
		if (pl->args) {
			pl->n_args = (size_t)l->n_args;
			for (int a = 0; a < l->n_args; a++)
				pl->args[a] = (uint32_t)l->args[a];
		}
		/* The imported nodes this launch computes and its micro-graph's
		 * kind (a kernel may be shared by several launches). */
		pl->nodes = xcalloc((size_t)l->n_nodes, sizeof(char *), oom);
		for (int a = 0; pl->nodes && a < l->n_nodes; a++) {
			pl->nodes[a] = xstrdup(l->nodes[a], oom);
			if (!pl->nodes[a])
				break;
			pl->n_nodes = (size_t)a + 1;
		}
		if (l->category)
			pl->category = xstrdup(l->category, oom);
		pl->global_bytes = l->global_bytes;
		pl->layers = layer_names(l->layers, &pl->n_layers, oom);
		pl->parts = xcalloc((size_t)l->n_parts, sizeof(*pl->parts), oom);
		for (int j = 0; pl->parts && j < l->n_parts; j++) {
			const ap_launch_part *pt = &l->parts[j];
			Apollo__LaunchPart *pp = xcalloc(1, sizeof(*pp), oom);

			if (!pp)
				break;
			apollo__launch_part__init(pp);
			pl->parts[j] = pp;
			pl->n_parts = (size_t)j + 1;
			pp->category = xstrdup(pt->category ? pt->category : "", oom);
			pp->block_begin = pt->block_begin;
			pp->blocks = pt->blocks;
			pp->detail = xstrdup(pt->detail ? pt->detail : "", oom);
			pp->layers = layer_names(pt->layers, &pp->n_layers, oom);
			pp->nodes = xcalloc((size_t)pt->n_nodes, sizeof(char *), oom);
			for (int a = 0; pp->nodes && a < pt->n_nodes; a++) {
				pp->nodes[a] = xstrdup(pt->nodes[a], oom);
				if (!pp->nodes[a])
					break;
				pp->n_nodes = (size_t)a + 1;
			}
		}
	}

	/* Why launches were not fused: the --explain report. */
	b->boundaries = xcalloc((size_t)p->n_boundaries, sizeof(*b->boundaries), oom);
	for (i = 0; b->boundaries && i < p->n_boundaries; i++) {
		const ap_program_boundary *pb = &p->boundaries[i];
		Apollo__Boundary *bd = xcalloc(1, sizeof(*bd), oom);
		if (!bd)
			break;
		apollo__boundary__init(bd);
		b->boundaries[i] = bd;
		b->n_boundaries = (size_t)i + 1;
		bd->producer = (uint32_t)pb->producer;
		bd->consumer = (uint32_t)pb->consumer;
		bd->tensor = xstrdup(pb->tensor ? pb->tensor : "", oom);
		bd->reason = xstrdup(pb->reason ? pb->reason : "", oom);
		bd->detail = xstrdup(pb->detail ? pb->detail : "", oom);
	}

	b->buffers = xcalloc((size_t)p->n_buffers, sizeof(*b->buffers), oom);
	for (i = 0; b->buffers && i < p->n_buffers; i++) {
		const ap_buffer *bs = &p->buffers[i];
		Apollo__Buffer *bb = xcalloc(1, sizeof(*bb), oom);
		if (!bb)
			break;
		apollo__buffer__init(bb);
		b->buffers[i] = bb;
		b->n_buffers = (size_t)i + 1;
		bb->name = xstrdup(bs->name, oom);
		bb->kind = (Apollo__BufferKind)bs->kind;
		bb->dtype = (Apollo__DataType)bs->dtype;
		bb->dims = xcalloc((size_t)bs->rank, sizeof(int64_t), oom);
		if (bb->dims) {
			bb->n_dims = (size_t)bs->rank;
			memcpy(bb->dims, bs->dims, (size_t)bs->rank * sizeof(int64_t));
		}
		bb->bytes = bs->nbytes;
		bb->offset = bs->offset;
		bb->index = bs->index;
	}
	b->workspace_bytes = p->workspace_bytes;
	b->graph_hash.data = xmemdup(graph_hash, 32, oom);
	b->graph_hash.len = b->graph_hash.data ? 32 : 0;
	b->stats = xcalloc(1, sizeof(*b->stats), oom);
	if (b->stats)
		apollo__stats__init(b->stats);
	return b;
}

static Apollo__Bundle *bundle_free(Apollo__Bundle *b)
{
	if (b)
		apollo__bundle__free_unpacked(b, NULL);
	return NULL;
}

/* Serializes `b` with every kernel blob left out (digests kept): what the
 * action cache stores.  NULL when out of memory. */
static uint8_t *pack_stripped(Apollo__Bundle *b, size_t *len)
{
	ProtobufCBinaryData *saved = calloc(b->n_kernels ? b->n_kernels : 1, sizeof(*saved));
	uint8_t *out = NULL;

	if (!saved)
		return NULL;
	for (size_t i = 0; i < b->n_kernels; i++) {
		saved[i] = b->kernels[i]->blob;
		b->kernels[i]->blob.data = NULL;
		b->kernels[i]->blob.len = 0;
	}
	*len = apollo__bundle__get_packed_size(b);
	out = malloc(*len ? *len : 1);
	if (out)
		apollo__bundle__pack(b, out);
	for (size_t i = 0; i < b->n_kernels; i++)
		b->kernels[i]->blob = saved[i];
	free(saved);
	return out;
}

/* ---- kernels -------------------------------------------------------------- */

/* One request's kernel compiles: target and blobs, shared by the worker
 * that owns the request and the helper threads (through a task_batch);
 * each blobs[i] is written only by the thread that runs task i. */
struct kernel_batch {
	ap_compiler *c;
	const ap_program *p;
	const char *target;
	bool gpu, use_cache;
	int output;
	struct kblob *blobs;
	atomic_bool failed;          /* a failure other than AP_ECOMPILE: skip the rest */
};

/* Compiles one kernel for the batch's target into `out` (rc 0 and the
 * blob, from the kernel cache or the backend; or rc and err, AP_ECOMPILE
 * when the backend rejects the source).  The test hook
 * $APOLLO_TEST_REFUSE_KERNEL_NODES=N makes the backend reject, with
 * AP_ECOMPILE, every kernel of more than N member nodes
 * (ap_kernel_src.n_members), cached or not. */
static void compile_kernel(const struct kernel_batch *kb, const ap_kernel_src *ks,
			   struct kblob *out)
{
	const char *src = ks->src;
	const char *bid = ap_compiler_backend_id(kb->c, kb->gpu);
	uint8_t key[32];
	char file[160];

	ap_error_clear(&out->err);
	if (!src) {
		out->rc = ap_error_set(&out->err, AP_EINTERNAL, ks->n_nodes ? ks->nodes[0] : NULL, NULL,
				       "kernel %s has no %s source", ks->name, kb->gpu ? "CUDA" : "host");
		return;
	}
	if (kb->c->refuse_nodes && ks->n_members > 0 &&
	    (unsigned)ks->n_members > kb->c->refuse_nodes) {
		out->rc = ap_error_set(&out->err, AP_ECOMPILE, ks->n_nodes ? ks->nodes[0] : NULL, NULL,
				       "test hook APOLLO_TEST_REFUSE_KERNEL_NODES=%u: a kernel of %d "
				       "member nodes does not compile", kb->c->refuse_nodes,
				       ks->n_members);
		return;
	}
	if (ap_compile_kernel_key(src, ks->name, kb->target, kb->output, bid, key)) {
		out->rc = ap_error_set(&out->err, AP_ENOMEM, NULL, NULL, "out of memory");
		return;
	}
	if (kb->use_cache &&
	    ap_cache_kernel_get(kb->c->cache, key, &out->data, &out->len, out->digest) == 1)
		return;
	snprintf(file, sizeof(file), "%s.cu", ks->name);
	if (kb->gpu)
		out->rc = ap_nvrtc_compile(src, file, kb->target,
					   kb->output == APOLLO__OUTPUT_KIND__OUTPUT_CUBIN, &out->data,
					   &out->len, &out->err);
	else
		out->rc = ap_hostcc_compile(src, &out->data, &out->len, &out->err);
	if (out->rc) {
		if (!out->err.node[0] && ks->n_nodes > 0)
			snprintf(out->err.node, sizeof(out->err.node), "%s", ks->nodes[0]);
		return;
	}
	out->compiled = true;
	ap_sha256(out->data, out->len, out->digest);
	if (kb->use_cache)
		ap_cache_kernel_put(kb->c->cache, key, out->data, out->len, NULL);
}

/* ---- the task pool: the request's worker and the helper threads ----------- */

/* n independent tasks fn(0..n-1, arg) of one request.  `next`, `done` and
 * the queue links are under the compiler's mutex. */
struct task_batch {
	int n, next, done;
	void (*fn)(int i, void *arg);
	void *arg;
	struct task_batch *queue_next;
	pthread_cond_t finished;
};

/* Removes `tb` from the queue of batches with tasks left (under c->mu). */
static void dequeue(ap_compiler *c, struct task_batch *tb)
{
	struct task_batch **pp = &c->queue;

	while (*pp && *pp != tb)
		pp = &(*pp)->queue_next;
	if (*pp)
		*pp = tb->queue_next;
}

/* Takes the next task of `tb` (under c->mu); -1 when none is left.  A
 * batch with nothing left to hand out leaves the queue. */
static int take_index(ap_compiler *c, struct task_batch *tb)
{
	int i;

	if (tb->next >= tb->n) {
		dequeue(c, tb);
		return -1;
	}
	i = tb->next++;
	if (tb->next == tb->n)
		dequeue(c, tb);
	return i;
}

/* Runs task i of `tb` outside the lock and records it (takes c->mu). */
static void run_index(ap_compiler *c, struct task_batch *tb, int i)
{
	pthread_mutex_unlock(&c->mu);
	tb->fn(i, tb->arg);
	pthread_mutex_lock(&c->mu);
	tb->done++;
	if (tb->done == tb->n)
		pthread_cond_signal(&tb->finished);
}

/* Helper thread: serves the queue of batches until the compiler is freed.
 * Helpers live as long as the compiler, so per-thread library state
 * (OpenSSL's error queue, NVRTC's) is set up once, not per request. */
static void *helper_main(void *arg)
{
	ap_compiler *c = arg;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		struct task_batch *tb;
		int i;

		while (!c->stop && !c->queue)
			pthread_cond_wait(&c->work, &c->mu);
		if (c->stop)
			break;
		tb = c->queue;
		i = take_index(c, tb);
		if (i >= 0)
			run_index(c, tb, i);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/* Runs fn(0..n-1, arg) with the helpers' help, the calling worker taking
 * its share, and returns when every task is done (ap_task_pool.run). */
static void run_tasks(void *pool, int n, void (*fn)(int i, void *arg), void *arg)
{
	ap_compiler *c = pool;
	struct task_batch tb = {.n = n, .fn = fn, .arg = arg};
	int i;

	if (n <= 0)
		return;
	pthread_cond_init(&tb.finished, NULL);
	pthread_mutex_lock(&c->mu);
	if (c->n_helpers > 0 && n > 1) {
		struct task_batch **pp = &c->queue;

		while (*pp)
			pp = &(*pp)->queue_next;
		*pp = &tb;
		pthread_cond_broadcast(&c->work);
	}
	while ((i = take_index(c, &tb)) >= 0)
		run_index(c, &tb, i);
	while (tb.done < tb.n)
		pthread_cond_wait(&tb.finished, &c->mu);
	pthread_mutex_unlock(&c->mu);
	pthread_cond_destroy(&tb.finished);
}

/* Task i of a kernel batch: compile kernel i, unless an earlier failure
 * (other than the backend rejecting a kernel) already dooms the request. */
static void compile_task(int i, void *arg)
{
	struct kernel_batch *kb = arg;
	struct kblob *b = &kb->blobs[i];

	if (atomic_load(&kb->failed)) {
		b->skipped = true;
		return;
	}
	compile_kernel(kb, &kb->p->kernels[i], b);
	if (b->rc && b->rc != AP_ECOMPILE)
		atomic_store(&kb->failed, true);
}

/* Compiles (or fetches) every kernel of `p` on the task pool; 0, or the
 * first failure's code with `err` copied from it, a failure other than
 * AP_ECOMPILE first: after an AP_ECOMPILE every kernel has still been
 * tried. */
static int compile_kernels(ap_compiler *c, struct kernel_batch *kb, const ap_program *p,
			   struct kblob *blobs, ap_error *err)
{
	int i;

	kb->p = p;
	kb->blobs = blobs;
	atomic_store(&kb->failed, false);
	run_tasks(c, p->n_kernels, compile_task, kb);
	for (i = 0; i < p->n_kernels; i++) {
		if (!blobs[i].skipped && blobs[i].rc && blobs[i].rc != AP_ECOMPILE) {
			*err = blobs[i].err;
			return blobs[i].rc;
		}
	}
	for (i = 0; i < p->n_kernels; i++) {
		if (!blobs[i].skipped && blobs[i].rc) {
			*err = blobs[i].err;
			return blobs[i].rc;
		}
	}
	return 0;
}

/* ---- backend refusals (upward feedback) ------------------------------------ */

/* Every kernel one request has offered the backend, by name (a kernel's
 * name hashes its sources, so one name is one source), with its result:
 * the blob, or the backend's error.  Owned by the request's worker. */
struct kmemo {
	struct kernel_batch *kb;     /* target, output, cache use; kb->p unused */
	int n, cap;
	char **names;
	struct kblob *blobs;
	double ms;                   /* time spent compiling in accept_kernel */
};

static void kmemo_clear(struct kmemo *m)
{
	for (int i = 0; i < m->n; i++) {
		free(m->names[i]);
		free(m->blobs[i].data);
	}
	free(m->names);
	free(m->blobs);
	memset(m, 0, sizeof(*m));
}

static int kmemo_find(const struct kmemo *m, const char *name)
{
	for (int i = 0; i < m->n; i++)
		if (strcmp(m->names[i], name) == 0)
			return i;
	return -1;
}

/* Appends (name, *b), taking b's data; 0 or AP_ENOMEM (b's data freed). */
static int kmemo_add(struct kmemo *m, const char *name, struct kblob *b)
{
	char *nm = strdup(name);

	if (m->n == m->cap) {
		int ncap = m->cap ? 2 * m->cap : 16;
		char **nn = realloc(m->names, (size_t)ncap * sizeof(*nn));
		struct kblob *nb = nn ? realloc(m->blobs, (size_t)ncap * sizeof(*nb)) : NULL;

		if (nn)
			m->names = nn;
		if (nb)
			m->blobs = nb;
		if (!nn || !nb) {
			free(nm);
			free(b->data), b->data = NULL;
			return AP_ENOMEM;
		}
		m->cap = ncap;
	}
	if (!nm) {
		free(b->data), b->data = NULL;
		return AP_ENOMEM;
	}
	m->names[m->n] = nm;
	m->blobs[m->n++] = *b;
	b->data = NULL;
	return 0;
}

/* ap_build_options.accept_kernel: the backend's verdict on kernel k, from
 * the memo or compiled now (through the kernel cache) and remembered, so
 * that a kernel is compiled once per request.  0, AP_ENOMEM, or the
 * backend's error code with its message in `why`. */
static int on_accept_kernel(const ap_kernel_src *k, void *user, ap_error *why)
{
	struct kmemo *m = user;
	int i = kmemo_find(m, k->name);
	struct kblob b;

	if (i < 0) {
		double t = ap_now_ms();

		memset(&b, 0, sizeof(b));
		compile_kernel(m->kb, k, &b);
		m->ms += ap_now_ms() - t;
		if (kmemo_add(m, k->name, &b) < 0)
			return AP_ENOMEM;
		i = m->n - 1;
	}
	if (m->blobs[i].rc && why)
		*why = m->blobs[i].err;
	return m->blobs[i].rc;
}

/* ---- the job --------------------------------------------------------------- */

struct request {
	const Apollo__CompileRequest *req;
	const char *target;
	bool gpu, use_cache;
	int output;
	unsigned mbt;
	double t0, import_ms, cache_ms;
};

/* Rebuilds a reply from a stored (stripped) bundle: every kernel blob is
 * fetched by digest and verified.  NULL when anything is missing. */
static Apollo__Bundle *from_cache(ap_compiler *c, const uint8_t *val, size_t len)
{
	Apollo__Bundle *b = apollo__bundle__unpack(NULL, len, val);

	if (!b)
		return NULL;
	for (size_t i = 0; i < b->n_kernels; i++) {
		Apollo__Kernel *k = b->kernels[i];
		uint8_t *data = NULL;
		size_t n = 0;

		if (k->digest.len != 32 || ap_cache_blob_get(c->cache, k->digest.data, &data, &n) != 1)
			return bundle_free(b);
		free(k->blob.data);
		k->blob.data = data;
		k->blob.len = n;
	}
	if (!b->stats) {
		b->stats = malloc(sizeof(*b->stats));
		if (!b->stats)
			return bundle_free(b);
		apollo__stats__init(b->stats);
	}
	return b;
}

/* Looks `key` up; on a hit returns the bundle with this request's stats. */
static Apollo__Bundle *lookup(ap_compiler *c, struct request *r, const uint8_t key[32])
{
	double t = ap_now_ms();
	uint8_t *val = NULL;
	size_t len = 0;
	Apollo__Bundle *b = NULL;

	if (r->use_cache && ap_cache_get(c->cache, key, &val, &len) == 1) {
		b = from_cache(c, val, len);
		free(val);
	}
	r->cache_ms += ap_now_ms() - t;
	if (!b)
		return NULL;
	b->stats->cache_hit = 1;
	b->stats->kernels_compiled = 0;
	b->stats->import_ms = r->import_ms;
	b->stats->partition_ms = 0;
	b->stats->codegen_ms = 0;
	b->stats->backend_ms = 0;
	b->stats->cache_ms = r->cache_ms;
	b->stats->compile_ms = ap_now_ms() - r->t0;
	return b;
}

/* Converts the request's bindings for ap_onnx_import (borrowing their
 * data).  0 or AP_E* naming the binding. */
static int convert_bindings(const Apollo__CompileRequest *req, ap_host_tensor *hts,
			    const ap_host_tensor **ptrs, ap_error *err)
{
	for (size_t i = 0; i < req->n_bindings; i++) {
		const Apollo__Tensor *t = req->bindings[i];
		ap_host_tensor *h = &hts[i];

		if (t->n_dims > AP_MAX_RANK)
			return ap_error_set(err, AP_ETOOLARGE, NULL, t->name,
					    "binding '%.100s' has rank %zu, at most %d supported", t->name,
					    t->n_dims, AP_MAX_RANK);
		memset(h, 0, sizeof(*h));
		h->name = t->name;
		h->dtype = (ap_dtype)t->dtype;
		h->rank = (int)t->n_dims;
		for (size_t d = 0; d < t->n_dims; d++) {
			if (t->dims[d] < 0)
				return ap_error_set(err, AP_EINVAL, NULL, t->name,
						    "binding '%.100s' has a negative dimension", t->name);
			h->dims[d] = t->dims[d];
		}
		if (t->data.len) {
			size_t es = ap_dtype_size(h->dtype);
			ap_tensor tmp;
			int64_t numel;

			memset(&tmp, 0, sizeof(tmp));
			tmp.rank = h->rank;
			memcpy(tmp.dims, h->dims, sizeof(tmp.dims));
			numel = ap_tensor_numel(&tmp);
			if (!es || numel < 0 || (uint64_t)numel * es != t->data.len)
				return ap_error_set(err, AP_ESHAPE, NULL, t->name,
						    "binding '%.100s' carries %zu bytes of data, its shape and "
						    "dtype need %lld", t->name, t->data.len,
						    numel < 0 || !es ? -1LL : (long long)((uint64_t)numel * es));
		}
		h->data = t->data.data;
		h->nbytes = t->data.len;
		ptrs[i] = h;
	}
	return 0;
}

/* After the parallel compile of *progp rejected a kernel (AP_ECOMPILE):
 * remembers every blob by kernel name, builds the program again with
 * on_accept_kernel as the backend hook, and replaces *progp and *blobsp
 * by the new program and its blobs.  *compiled counts the backend compiles
 * of both rounds, *backend_ms adds the hook's compile time.  0, or an
 * error with `err` set (AP_ECOMPILE when a single-node kernel does not
 * compile, from ap_program_build). */
static int rebuild_refused(ap_compiler *c, const ap_graph *g, ap_build_options *bo,
			   struct kernel_batch *kb, ap_program **progp, struct kblob **blobsp,
			   unsigned *compiled, double *backend_ms, ap_error *err)
{
	ap_program *prog = *progp;
	struct kblob *blobs = *blobsp;
	struct kmemo m;
	int rc = 0, n = prog->n_kernels;

	memset(&m, 0, sizeof(m));
	m.kb = kb;
	kb->p = NULL;
	for (int i = 0; i < n && rc == 0; i++)
		rc = kmemo_add(&m, prog->kernels[i].name, &blobs[i]);
	for (int i = 0; i < n; i++)
		free(blobs[i].data);
	free(blobs);
	*blobsp = NULL;
	*progp = ap_program_free(prog);
	if (rc) {
		kmemo_clear(&m);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	bo->accept_kernel = on_accept_kernel;
	bo->accept_user = &m;
	ap_error_clear(err);
	prog = ap_program_build(g, bo, err);
	bo->accept_kernel = NULL;
	bo->accept_user = NULL;
	*backend_ms += m.ms;
	for (int i = 0; i < m.n; i++)
		*compiled += m.blobs[i].compiled;
	if (!prog) {
		kmemo_clear(&m);
		return err->code ? err->code : AP_EINTERNAL;
	}
	*progp = prog;
	blobs = calloc((size_t)prog->n_kernels + 1, sizeof(*blobs));
	if (!blobs) {
		kmemo_clear(&m);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	*blobsp = blobs;
	for (int i = 0; i < prog->n_kernels; i++) {
		int j = kmemo_find(&m, prog->kernels[i].name);

		/* every kept kernel was offered to on_accept_kernel and accepted */
		if (j < 0 || m.blobs[j].rc || !m.blobs[j].data) {
			kmemo_clear(&m);
			return ap_error_set(err, AP_EINTERNAL, NULL, NULL,
					    "kernel %s was kept without the backend's blob",
					    prog->kernels[i].name);
		}
		blobs[i] = m.blobs[j];
		m.blobs[j].data = NULL;
	}
	kmemo_clear(&m);
	return 0;
}

/* The job proper: 0 and *out, or an error code with `err` set. */
static int run(ap_compiler *c, struct request *r, Apollo__Bundle **out, ap_error *err)
{
	const Apollo__CompileRequest *req = r->req;
	ap_graph *g = NULL;
	ap_program *prog = NULL;
	struct kblob *blobs = NULL;
	Apollo__Bundle *b = NULL;
	uint8_t graph_hash[32], named_hash[32], gkey[32], rkey[32];
	bool have_rkey = false, oom = false;
	char bid[400];
	double t, backend_ms;
	unsigned compiled = 0;
	ap_build_options bo;
	ap_task_pool pool;
	struct kernel_batch kb;
	int rc;

	rc = ap_compile_parse_target(req->target, req->output, &r->gpu, &r->output, err);
	if (rc)
		return rc;
	r->target = req->target && *req->target ? req->target : "cpu";
	if (r->gpu) {
		ap_error why;
		if (ap_nvrtc_load(&why))
			return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
					    "target %.32s needs NVRTC: %.440s", r->target, why.msg);
	}
	/* Graph and request keys also name this build (see build_identity);
	 * kernel keys do not: they hash the kernel source itself. */
	snprintf(bid, sizeof(bid), "%s | %s", ap_compiler_backend_id(c, r->gpu), c->build_id);
	memset(&kb, 0, sizeof(kb));
	kb.c = c;
	kb.target = r->target;
	kb.gpu = r->gpu;
	kb.output = r->output;
	r->mbt = req->options ? req->options->max_block_threads : 0;
	r->use_cache = ap_cache_enabled(c->cache) && !(req->options && req->options->no_cache);
	kb.use_cache = r->use_cache;

	t = ap_now_ms();
	switch (req->source_case) {
	case APOLLO__COMPILE_REQUEST__SOURCE_GRAPH:
		g = ap_graph_from_pb(req->graph, err);
		if (!g)
			return err->code ? err->code : AP_EINVAL;
		if ((rc = ap_graph_validate(g, err)))
			goto done;
		break;
	case APOLLO__COMPILE_REQUEST__SOURCE_ONNX_MODEL: {
		ap_host_tensor *hts;
		const ap_host_tensor **ptrs;

		if (onnx_request_key(req, r->target, r->output, bid, rkey))
			return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		have_rkey = true;
		if ((*out = lookup(c, r, rkey)))
			return 0;
		hts = calloc(req->n_bindings + 1, sizeof(*hts));
		ptrs = calloc(req->n_bindings + 1, sizeof(*ptrs));
		if (!hts || !ptrs) {
			free(hts);
			free(ptrs);
			return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		}
		rc = convert_bindings(req, hts, ptrs, err);
		if (!rc) {
			g = ap_onnx_import(req->onnx_model.data, req->onnx_model.len, ptrs,
					   (int)req->n_bindings, NULL, err);
			if (!g)
				rc = err->code ? err->code : AP_EINVAL;
		}
		free(hts);
		free(ptrs);
		if (rc)
			return rc;
		break;
	}
	default:
		return ap_error_set(err, AP_EMESSAGE, NULL, NULL,
				    "CompileRequest carries neither a graph nor an onnx_model");
	}
	r->import_ms = ap_now_ms() - t;

	/* The key hashes names too: the bundle binds params by name. */
	if (ap_graph_hash(g, graph_hash) || ap_graph_hash_named(g, named_hash) ||
	    ap_compile_graph_key(named_hash, r->target, r->output, req->options, bid, gkey)) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory hashing the graph");
		goto done;
	}
	if ((b = lookup(c, r, gkey))) {
		if (have_rkey) {
			size_t len = 0;
			uint8_t *val = pack_stripped(b, &len);
			t = ap_now_ms();
			if (val)
				ap_cache_put(c->cache, rkey, val, len);
			free(val);
			b->stats->cache_ms += ap_now_ms() - t;
		}
		*out = b;
		rc = 0;
		goto done;
	}

	pool.run = run_tasks;
	pool.pool = c;
	bo = (ap_build_options){
		.target = r->target,
		.pool = &pool,
		.max_block_threads = r->mbt,
		.fusion = req->options ? (ap_fuse_level)req->options->fusion : AP_FUSE_DEFAULT,
		.n_fusion_barriers = req->options ? (int)req->options->n_fusion_barriers : 0,
		.fusion_barriers = req->options ? req->options->fusion_barriers : NULL,
		.n_keep_whole = req->options ? (int)req->options->n_keep_whole : 0,
		.keep_whole = req->options ? req->options->keep_whole : NULL,
	};
	if (bo.fusion > AP_FUSE_APOLLO) {
		rc = ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				  "unknown fusion level %d (none=1, rules=2, apollo=3)", (int)bo.fusion);
		goto done;
	}
	/* Optimistic: build with no backend hook and compile every kernel in
	 * parallel; the backend rejects a kernel almost never. */
	prog = ap_program_build(g, &bo, err);
	if (!prog) {
		rc = err->code ? err->code : AP_EINTERNAL;
		goto done;
	}
	if (c->stop_before_backend) {
		rc = ap_error_set(err, AP_EINTERNAL, NULL, NULL, "stopped before the backend");
		goto done;
	}

	t = ap_now_ms();
	blobs = calloc((size_t)prog->n_kernels + 1, sizeof(*blobs));
	if (!blobs) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto done;
	}
	rc = compile_kernels(c, &kb, prog, blobs, err);
	backend_ms = ap_now_ms() - t;
	if (rc == AP_ECOMPILE) {
		/* Upward feedback: the backend rejected a kernel.  Build again,
		 * the backend judging each kernel (rejected ones refused, so
		 * their fused groups are split), then take the blobs from the
		 * memo: every kernel is compiled once. */
		rc = rebuild_refused(c, g, &bo, &kb, &prog, &blobs, &compiled, &backend_ms, err);
		if (rc)
			goto done;
	} else if (rc) {
		goto done;
	} else {
		for (int i = 0; i < prog->n_kernels; i++)
			compiled += blobs[i].compiled;
	}
	atomic_fetch_add(&c->kernels_compiled, compiled);

	b = build_bundle(prog, blobs, r->target, r->output, graph_hash, &oom);
	if (oom || !b) {
		b = bundle_free(b);
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory building the bundle");
		goto done;
	}
	b->stats->kernels = (uint32_t)prog->n_launches;
	b->stats->distinct_kernels = (uint32_t)prog->n_kernels;
	b->stats->layer1_changed = prog->layer_count[0];
	b->stats->layer2_stitched = prog->layer_count[1];
	b->stats->layer3_merged = prog->layer_count[2];
	b->stats->eager_kernels = prog->eager_kernels ? prog->eager_kernels : g->eager_kernels;
	b->stats->nodes = (uint32_t)g->n_nodes;
	b->stats->global_bytes = prog->global_bytes;
	b->stats->eager_bytes = prog->eager_bytes;
	b->stats->min_bytes = prog->min_bytes;
	b->stats->import_ms = r->import_ms;
	b->stats->partition_ms = prog->partition_ms;
	b->stats->codegen_ms = prog->codegen_ms;
	b->stats->backend_ms = backend_ms;
	b->stats->kernels_compiled = compiled;
	b->stats->cache_hit = 0;

	if (r->use_cache) {   /* no_cache: neither read nor write */
		size_t len = 0;
		uint8_t *val;

		t = ap_now_ms();
		b->stats->cache_ms = r->cache_ms;
		b->stats->compile_ms = ap_now_ms() - r->t0;
		val = pack_stripped(b, &len);
		if (val) {
			ap_cache_put(c->cache, gkey, val, len);
			if (have_rkey)
				ap_cache_put(c->cache, rkey, val, len);
		}
		free(val);
		r->cache_ms += ap_now_ms() - t;
	}
	b->stats->cache_ms = r->cache_ms;
	b->stats->compile_ms = ap_now_ms() - r->t0;
	*out = b;
	rc = 0;
done:
	if (blobs && prog)
		for (int i = 0; i < prog->n_kernels; i++)
			free(blobs[i].data);
	free(blobs);
	ap_program_free(prog);
	ap_graph_free(g);
	return rc;
}

Apollo__CompileResponse *ap_compile_run(ap_compiler *c, const Apollo__CompileRequest *req)
{
	struct request r = { .req = req, .t0 = ap_now_ms() };
	Apollo__CompileResponse *resp = malloc(sizeof(*resp));
	Apollo__Bundle *b = NULL;
	ap_error err;
	int rc;

	if (!resp)
		return NULL;
	apollo__compile_response__init(resp);
	ap_error_clear(&err);
	atomic_fetch_add(&c->requests, 1);
	if (c->delay_ms) {
		struct timespec ts = { c->delay_ms / 1000, (long)(c->delay_ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
	rc = run(c, &r, &b, &err);
	if (rc == 0 && b) {
		atomic_fetch_add(b->stats->cache_hit ? &c->hits : &c->misses, 1);
		resp->result_case = APOLLO__COMPILE_RESPONSE__RESULT_BUNDLE;
		resp->bundle = b;
		ap_log(AP_LOG_DEBUG, "compiled %zu kernels for %s in %.1f ms%s", b->n_kernels,
		       b->target, b->stats->compile_ms, b->stats->cache_hit ? " (cache hit)" : "");
		return resp;
	}
	atomic_fetch_add(&c->errors, 1);
	if (!rc)
		rc = ap_error_set(&err, AP_EINTERNAL, NULL, NULL, "no bundle and no error");
	{
		Apollo__Error *e = malloc(sizeof(*e));
		if (!e) {
			free(resp);
			return NULL;
		}
		apollo__error__init(e);
		e->code = (Apollo__ErrorCode)ap_error_wire_code(rc);
		e->message = strdup(err.msg[0] ? err.msg : ap_error_name(rc));
		e->node = strdup(err.node);
		e->tensor = strdup(err.tensor);
		resp->result_case = APOLLO__COMPILE_RESPONSE__RESULT_ERROR;
		resp->error = e;
		if (!e->message || !e->node || !e->tensor) {
			ap_compile_response_free(resp);
			return NULL;
		}
	}
	ap_log(AP_LOG_INFO, "compile request failed (%s): %s%s%s", ap_error_name(rc), err.msg,
	       err.node[0] ? " at node " : "", err.node);
	return resp;
}

void ap_compile_response_free(Apollo__CompileResponse *r)
{
	if (r)
		apollo__compile_response__free_unpacked(r, NULL);
}
