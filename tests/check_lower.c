/* check_lower.c -- the schedule layer: every emitter, on small micro-graphs
 * built here, for every configuration of its parameter space.
 *
 * For each case: the micro-graph is matched by the emitter the case names;
 * every combination of the emitter's knobs is lowered (a combination the
 * emitter cannot build is refused with AP_EUNSUPPORTED, and at least one
 * must build) and printed as host C; the configurations to run -- all of
 * them with APOLLO_SWEEP=full, a deterministic sample by default
 * (tests/lib/sweep.h) -- are split into $APOLLO_JOBS (default: the
 * processors online) translation units compiled at once, loaded and run
 * over every block on random inputs, and each output is compared with a
 * reference computed here.
 * The default configuration's CUDA C is compared with a golden file under
 * tests/golden/lower/ (APOLLO_UPDATE_GOLDEN=1 rewrites them), checked for
 * the constructs the emitter exists for (warp shuffles, shared-memory
 * tiles, vector accesses), and compiled with NVRTC when it is present,
 * whose PTX must hold the matching instructions (shfl.sync, ld.shared,
 * ld.global.v4).  The kernel IR verifier runs on every kernel.
 */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/hostcheck.h"
#include "server/backend/backend.h"
#include "server/kir/kir.h"
#include "server/lower/emitters.h"
#include "server/lower/lower.h"
#include "server/tune/tune.h"
#include "tests/lib/require.h"
#include "tests/lib/sched.h"
#include "tests/lib/sweep.h"

#define MAX_CFG 2048
#define GOLDEN_DIR "tests/golden/lower"

typedef void (*host_fn)(void *const *args, unsigned block_begin, unsigned block_end);

static unsigned long long g_seed = 0x9e3779b97f4a7c15ull;

static float frand(float lo, float hi)
{
	g_seed ^= g_seed << 13;
	g_seed ^= g_seed >> 7;
	g_seed ^= g_seed << 17;
	return lo + (hi - lo) * (float)((g_seed >> 11) % 1000000) / 1000000.0f;
}

/* ---- building micro-graphs ---------------------------------------------------------- */

#define DIMS(...) ((const int64_t[]){__VA_ARGS__}), (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define LIST(...) (int)(sizeof((const int[]){__VA_ARGS__}) / sizeof(int)), ((const int[]){__VA_ARGS__})

/* The element type of the tensors tensor() makes (float32 unless a case
 * says otherwise: float16 buffers are converted by run()). */
static ap_dtype g_dt = AP_DT_F32;

static int tensor(ap_graph *g, const char *name, const int64_t *dims, int rank, ap_tensor_kind kind)
{
	int t = ap_graph_add_tensor(g, name, g_dt, rank, dims, kind, NULL, 0);

	ck_assert_int_ge(t, 0);
	if (kind == AP_TENSOR_INPUT) {
		g->inputs = realloc(g->inputs, (size_t)(g->n_inputs + 1) * sizeof(int));
		g->inputs[g->n_inputs++] = t;
	}
	return t;
}

static int scalar(ap_graph *g, const char *name, float v)
{
	int t = ap_graph_add_tensor(g, name, AP_DT_F32, 0, NULL, AP_TENSOR_CONST, &v, sizeof(v));

	ck_assert_int_ge(t, 0);
	return t;
}

static int node(ap_graph *g, const char *name, ap_op op, int n_in, const int *in, int n_out,
		const int *out)
{
	int n = ap_graph_add_node(g, name, op, n_in, in, n_out, out);

	ck_assert_int_ge(n, 0);
	return n;
}

static void reduce_axes(ap_graph *g, int n, const int64_t *axes, int n_axes, int keep)
{
	ap_node_set_ints(g, n, "axes", axes, n_axes);
	ap_node_set_int(g, n, "keepdims", keep);
}

static void output(ap_graph *g, int t)
{
	g->tensors[t].is_output = true;
	g->outputs = realloc(g->outputs, (size_t)(g->n_outputs + 1) * sizeof(int));
	g->outputs[g->n_outputs++] = t;
}

/* The micro-graph of all of g's nodes (all members) writing g's outputs. */
static ap_mgraph *whole(ap_graph *g, ap_group_kind kind)
{
	ap_error err;
	int *nodes = malloc(((size_t)g->n_nodes + 1) * sizeof(int));
	bool *member = malloc(((size_t)g->n_nodes + 1) * sizeof(bool));
	int root = 0, gi = 0;
	ap_mgraph *m;

	ck_assert_msg(ap_graph_validate(g, &err) == 0, "validate: %s", err.msg);
	for (int i = 0; i < g->n_nodes; i++) {
		nodes[i] = i;
		member[i] = true;
		if (ap_op_category_of(g->nodes[i].op) == AP_CAT_REDUCTION ||
		    g->nodes[i].op == AP_OP_TRANSPOSE || g->nodes[i].op == AP_OP_CONCAT ||
		    g->nodes[i].op == AP_OP_MATMUL || g->nodes[i].op == AP_OP_CONV)
			root = i;
	}
	m = ap_mgraph_extract(g, nodes, member, g->n_nodes, g->outputs, g->n_outputs, kind, root, &gi,
			      1, &err);
	ck_assert_msg(m != NULL, "extract: %s", err.msg);
	free(nodes);
	free(member);
	return m;
}

/* ---- running kernels on the host ------------------------------------------------------ */

static bool is_half(ap_dtype t)
{
	return t == AP_DT_F16 || t == AP_DT_BF16;
}

/* x rounded to the 16-bit type t (round to nearest even, as the kernels'
 * conversions); x itself for other types. */
static double half_round(ap_dtype t, double x)
{
	if (t == AP_DT_F16)
		return ap_kir_f16_to_f32(ap_kir_f32_to_f16((float)x));
	if (t == AP_DT_BF16)
		return ap_kir_bf16_to_f32(ap_kir_f32_to_bf16((float)x));
	return x;
}

typedef struct buffers {
	int n;
	float **data;                    /* per tensor of m->g (NULL when not a buffer) */
} buffers;

static void buffers_init(buffers *b, const ap_mgraph *m)
{
	b->n = m->g->n_tensors;
	b->data = calloc((size_t)b->n, sizeof(float *));
	for (int i = 0; i < m->g->n_inputs; i++) {
		int t = m->g->inputs[i];
		int64_t n = ap_tensor_numel(&m->g->tensors[t]);

		b->data[t] = malloc((size_t)(n ? n : 1) * sizeof(float));
		for (int64_t j = 0; j < n; j++)
			b->data[t][j] = frand(-2, 2);
		/* 16-bit inputs: values the type holds, so the reference sees
		 * what the kernel reads */
		for (int64_t j = 0; is_half(m->g->tensors[t].dtype) && j < n; j++)
			b->data[t][j] = (float)half_round(m->g->tensors[t].dtype, b->data[t][j]);
	}
}

/* A case's own touch on its random inputs (NULL: none). */
static void (*g_fill)(const ap_mgraph *m, buffers *b);

static void buffers_free(buffers *b)
{
	for (int i = 0; i < b->n; i++)
		free(b->data[i]);
	free(b->data);
}

/* A float16 or bfloat16 copy of n floats (malloc'd). */
static uint16_t *to_half(ap_dtype t, const float *x, int64_t n)
{
	uint16_t *h = malloc((size_t)(n ? n : 1) * sizeof(uint16_t));

	for (int64_t i = 0; i < n; i++)
		h[i] = t == AP_DT_BF16 ? ap_kir_f32_to_bf16(x[i]) : ap_kir_f32_to_f16(x[i]);
	return h;
}

typedef struct case_opts {
	const char *target;              /* "cpu" when NULL: the target of every configuration */
	bool allow_tf32;
	double rtol;                     /* 1e-4 when 0 */
	bool host_check;                 /* run in the checking mode (client/hostcheck.c): a race, a
					    read before its cp.async arrived, an access out of bounds
					    fails the case */
} case_opts;

static const case_opts *g_opts;      /* set around run_case_opts */
static const char *g_golden_target;  /* the target of run_case's golden default kernel (NULL: sm_80;
					a micro-graph only sm_90a's wgmma builds: sm_90a) */
static unsigned g_sms;               /* > 0: the target's SM count for the sweep (a persistent
					grid of few blocks, each walking several tiles) */
static bool g_unvalidated;           /* the sweep's target asks for the forms not yet run on a
					GPU (ap_target_info.unvalidated: tma=1 the GEMM's only value) */

/* Runs kernel k (entry f) over all its blocks, split into two ranges;
 * returns the outputs (malloc'd, in m->g->outputs order) as floats.
 * float16 buffers are converted on the way in and out. */
static float **run(host_fn f, const ap_kir_kernel *k, const ap_mgraph *m, const buffers *in)
{
	void **args = calloc((size_t)k->n_params + 1, sizeof(void *));
	float **outs = calloc((size_t)m->g->n_outputs + 1, sizeof(float *));
	uint16_t **halves = calloc((size_t)k->n_params + 1, sizeof(uint16_t *));
	unsigned long long *ext = calloc((size_t)k->n_params + 1, sizeof(*ext));
	unsigned blocks = k->grid[0] * k->grid[1] * k->grid[2];

	for (int i = 0; i < m->g->n_outputs; i++) {
		int64_t n = ap_tensor_numel(&m->g->tensors[m->g->outputs[i]]);

		outs[i] = malloc((size_t)(n ? n : 1) * sizeof(float));
		for (int64_t j = 0; j < n; j++)
			outs[i][j] = NAN;
	}
	for (int a = 0; a < k->n_arrays; a++) {
		const ap_kir_array *arr = k->arrays[a];

		if (arr->space != AP_KIR_GLOBAL)
			continue;
		if (arr->written) {
			for (int i = 0; i < m->g->n_outputs; i++)
				if (m->g->outputs[i] == arr->tensor)
					args[arr->param] = outs[i];
		} else {
			args[arr->param] = in->data[arr->tensor];
		}
		ck_assert_ptr_nonnull(args[arr->param]);
		ext[arr->param] = (unsigned long long)ap_tensor_numel(&m->g->tensors[arr->tensor]) *
				  (is_half(m->g->tensors[arr->tensor].dtype) ? 2 : sizeof(float));
		if (is_half(m->g->tensors[arr->tensor].dtype)) {
			halves[arr->param] = to_half(m->g->tensors[arr->tensor].dtype, args[arr->param],
						     ap_tensor_numel(&m->g->tensors[arr->tensor]));
			args[arr->param] = halves[arr->param];
		}
	}
	if (g_opts && g_opts->host_check)
		ap_hostcheck_begin(ext, k->n_params);
	f(args, 0, blocks / 2);
	f(args, blocks / 2, blocks);
	if (g_opts && g_opts->host_check) {
		char msg[1024];
		unsigned n = ap_hostcheck_end(msg, sizeof(msg));

		ck_assert_msg(n == 0, "%s: the checking mode found %u: %s", k->name, n, msg);
	}
	free(ext);
	for (int a = 0; a < k->n_arrays; a++) {
		const ap_kir_array *arr = k->arrays[a];

		if (arr->space != AP_KIR_GLOBAL || !arr->written || !halves[arr->param])
			continue;
		for (int i = 0; i < m->g->n_outputs; i++)
			if (m->g->outputs[i] == arr->tensor)
				for (int64_t j = 0; j < ap_tensor_numel(&m->g->tensors[arr->tensor]); j++)
					outs[i][j] = m->g->tensors[arr->tensor].dtype == AP_DT_BF16
						     ? ap_kir_bf16_to_f32(halves[arr->param][j])
						     : ap_kir_f16_to_f32(halves[arr->param][j]);
	}
	for (int i = 0; i < k->n_params; i++)
		free(halves[i]);
	free(halves);
	free(args);
	return outs;
}

static void expect_close_tol(const char *what, const float *got, const double *want, int64_t n,
			     double tol)
{
	for (int64_t i = 0; i < n; i++) {
		double err = fabs(got[i] - want[i]);

		ck_assert_msg(err <= tol + tol * fabs(want[i]) || (double)got[i] == want[i] || (isnan(got[i]) && isnan(want[i])),
			      "%s: element %lld: got %.9g, want %.9g", what, (long long)i, got[i], want[i]);
	}
}

/* ---- golden text ------------------------------------------------------------------------ */

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	long n;
	char *s;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	s = malloc((size_t)n + 1);
	if (fread(s, 1, (size_t)n, f) != (size_t)n) {
		free(s);
		fclose(f);
		return NULL;
	}
	s[n] = 0;
	fclose(f);
	return s;
}

/* Compares `text` with tests/golden/lower/NAME.cu (rewritten when
 * APOLLO_UPDATE_GOLDEN is set). */
static void golden(const char *name, const char *text)
{
	char path[256];
	char *want;

	snprintf(path, sizeof(path), GOLDEN_DIR "/%s.cu", name);
	if (getenv("APOLLO_UPDATE_GOLDEN")) {
		FILE *f;

		mkdir("tests/golden", 0755);
		mkdir(GOLDEN_DIR, 0755);
		f = fopen(path, "wb");
		ck_assert_ptr_nonnull(f);
		fputs(text, f);
		fclose(f);
		return;
	}
	want = slurp(path);
	ck_assert_msg(want != NULL, "no golden file %s (APOLLO_UPDATE_GOLDEN=1 writes it)", path);
	if (strcmp(want, text) != 0) {
		/* the first line that differs (the whole text is too long for a
		 * message) */
		const char *a = want, *b = text;
		int line = 1;

		while (*a && *a == *b) {
			line += *a == '\n';
			a++, b++;
		}
		while (a > want && a[-1] != '\n')
			a--, b--;
		ck_abort_msg("%s differs from the kernel printed now at line %d (APOLLO_UPDATE_GOLDEN=1 "
			     "after reviewing the change):\n- %.*s\n+ %.*s", path, line,
			     (int)strcspn(a, "\n") > 300 ? 300 : (int)strcspn(a, "\n"), a,
			     (int)strcspn(b, "\n") > 300 ? 300 : (int)strcspn(b, "\n"), b);
	}
	free(want);
}

static int nvrtc_state;   /* 0 unknown, 1 loaded, -1 absent */

static char *nvrtc_ptx(const char *src, const char *name)
{
	ap_error err;
	uint8_t *out = NULL;
	size_t len = 0;

	if (nvrtc_state == 0) {
		nvrtc_state = ap_nvrtc_load(&err) == 0 ? 1 : -1;
		if (nvrtc_state < 0)
			AP_SKIP("nvrtc", "check_lower: NVRTC not loaded, CUDA text not compiled (%s)", err.msg);
	}
	if (nvrtc_state < 0)
		return NULL;
	if (ap_nvrtc_compile(src, name, "compute_80", false, &out, &len, &err) != 0)
		fprintf(stderr, "NVRTC failed on %s:\n%s\n%s\n", name, err.msg, src);
	ck_assert_msg(out != NULL, "NVRTC: %.300s", err.msg);
	return (char *)out;
}

/* ---- one case: every configuration ------------------------------------------------------- */

typedef void (*reference_fn)(const ap_mgraph *m, const buffers *in, double **want);

typedef struct lcase {
	const char *name;                /* golden file stem */
	const char *emitter;             /* the emitter that must match */
	const char *cuda_has[4];         /* substrings of the default CUDA text */
	const char *ptx_has[4];          /* substrings of its PTX */
} lcase;

static int next_config(const ap_space *sp, int *idx)
{
	for (int i = 0; i < sp->n; i++) {
		if (++idx[i] < sp->knobs[i].n)
			return 1;
		idx[i] = 0;
	}
	return 0;
}

/* The bytes of a shared object -> loaded (dlopen); frees so. */
static void *so_load(uint8_t *so, size_t so_len)
{
	char so_path[] = "/tmp/check_lower_XXXXXX";
	void *h;
	int fd;

	fd = mkstemp(so_path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, so, so_len), (ssize_t)so_len);
	close(fd);
	free(so);
	h = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
	unlink(so_path);
	ck_assert_msg(h != NULL, "dlopen: %s", dlerror());
	return h;
}

/* Host C source -> a loaded shared object (ap_hostcc_compile, dlopen). */
static void *host_load(const char *src, const char *what)
{
	uint8_t *so = NULL;
	size_t so_len = 0;
	ap_error err;

	ck_assert_msg(ap_hostcc_compile(src, &so, &so_len, &err) == 0, "%s: cc: %.600s", what, err.msg);
	return so_load(so, so_len);
}

/* How many host compiles run at once: $APOLLO_JOBS, else the processors
 * online. */
static int host_jobs(void)
{
	const char *s = getenv("APOLLO_JOBS");
	long n = s && *s ? strtol(s, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);

	return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

typedef struct chunk {
	char *src;                       /* one translation unit (owned) */
	uint8_t *so;
	size_t so_len;
	int rc;
	ap_error err;
} chunk;

static void *chunk_compile(void *arg)
{
	chunk *c = arg;

	c->rc = ap_hostcc_compile(c->src, &c->so, &c->so_len, &c->err);
	return NULL;
}

/* The host C texts[0..n) (consumed) as `n_chunks` translation units of
 * consecutive texts about equal in length, compiled at once (one cc each,
 * on threads; ap_hostcc_compile shares nothing between calls) and loaded:
 * h[c] is chunk c's handle, and text i is in chunk in_chunk[i]. */
static void host_load_chunks(char **texts, int n, int n_chunks, void **h, int *in_chunk, const char *what)
{
	chunk *cs = calloc((size_t)n_chunks, sizeof(chunk));
	pthread_t *th = calloc((size_t)n_chunks, sizeof(pthread_t));
	size_t total = 0, done = 0;
	int first = 0;

	for (int i = 0; i < n; i++)
		total += strlen(texts[i]) + 1;
	for (int c = 0; c < n_chunks; c++) {
		size_t len = 1, off = 0;
		int end = first;

		/* texts up to c+1 n_chunks-ths of the whole, at least one, and
		 * one left for every later chunk */
		while (end < n - (n_chunks - c - 1) &&
		       (end == first || c == n_chunks - 1 || done + strlen(texts[end]) + 1 <= total * (size_t)(c + 1) / (size_t)n_chunks))
			done += strlen(texts[end++]) + 1;
		for (int i = first; i < end; i++)
			len += strlen(texts[i]) + 1;
		cs[c].src = malloc(len);
		for (int i = first; i < end; i++) {
			size_t l = strlen(texts[i]);

			memcpy(cs[c].src + off, texts[i], l);
			off += l;
			cs[c].src[off++] = '\n';
			in_chunk[i] = c;
			free(texts[i]);
		}
		cs[c].src[off] = 0;
		first = end;
	}
	ck_assert_int_eq(first, n);
	for (int c = 0; c < n_chunks; c++)
		ck_assert_int_eq(pthread_create(&th[c], NULL, chunk_compile, &cs[c]), 0);
	for (int c = 0; c < n_chunks; c++)
		pthread_join(th[c], NULL);
	for (int c = 0; c < n_chunks; c++) {
		ck_assert_msg(cs[c].rc == 0, "%s (part %d of %d): cc: %.600s", what, c + 1, n_chunks, cs[c].err.msg);
		h[c] = so_load(cs[c].so, cs[c].so_len);
		free(cs[c].src);
	}
	free(th);
	free(cs);
}

static void run_case(const lcase *lc, ap_mgraph *m, reference_fn ref)
{
	ap_target_info ti;
	const ap_emitter *em;
	ap_bound b;                              /* m on ti, bound once for every configuration */
	ap_kir_target host_kind = g_opts && g_opts->host_check ? AP_KIR_HOST_CHECK : AP_KIR_HOST;
	unsigned host_flags;                     /* a GPU target's kernels: emulated, baseline only */
	ap_space sp;
	ap_sched dflt;
	ap_kir_kernel *ks[MAX_CFG];
	int n_k = 0, n_refused = 0, n_invalid = 0, n_unrun = 0, idx[AP_SPACE_MAX_KNOBS] = {0};
	int n_chunks, in_chunk[MAX_CFG], n_built = 0, cap_built = 0, dpos = -1, stride = ap_sweep_stride();
	int (*built)[AP_SPACE_MAX_KNOBS] = NULL;   /* the knob indices of each configuration that builds */
	bool *take;
	void *h[64];
	char **texts = calloc(MAX_CFG, sizeof(char *));
	ap_error err;
	buffers in;
	double **want;

	ck_assert_int_eq(ap_cost_target(g_opts && g_opts->target ? g_opts->target : "cpu", &ti), 0);
	if (g_sms)
		ti.sm_count = g_sms;
	ti.unvalidated = ti.tma = g_unvalidated;
	ti.max_threads_per_block = 256;
	ti.ws_threads = 128;   /* a producer warpgroup past the cap, as apollod's default (pipeline.c) */
	ti.allow_tf32 = g_opts && g_opts->allow_tf32;
	host_flags = ti.gpu ? AP_KIR_PRINT_BASELINE : 0;
	ck_assert_int_eq(ap_bind_first(m, &ti, &b, &err), 0);
	em = b.em;
	ck_assert_msg(strcmp(em->name, lc->emitter) == 0, "%s: bound by %s, not %s", lc->name,
		      em->name, lc->emitter);
	ck_assert_int_eq(ap_emitter_default(&b, &sp, &dflt, &err), 0);
	ck_assert_int_ge(sp.n, 1);
	/* the default configuration: golden CUDA text and its constructs */
	{
		ap_target_info gi;
		ap_lower_options lo = {256, NULL, true};
		ap_kir_kernel *k;
		char *cuda, *ptx;

		ck_assert_int_eq(ap_cost_target(g_golden_target ? g_golden_target : "sm_80", &gi), 0);
		gi.max_threads_per_block = 256;
		gi.allow_tf32 = ti.allow_tf32;
		k = ap_lower_mgraph(m, &gi, lc->name, &lo, NULL, &err);
		ck_assert_msg(k != NULL, "%s default: %s", lc->name, err.msg);
		cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
		ck_assert_ptr_nonnull(cuda);
		golden(lc->name, cuda);
		for (int i = 0; i < 4 && lc->cuda_has[i]; i++)
			ck_assert_msg(strstr(cuda, lc->cuda_has[i]), "%s: no '%s' in\n%s", lc->name,
				      lc->cuda_has[i], cuda);
		ptx = nvrtc_ptx(cuda, lc->name);
		for (int i = 0; ptx && i < 4 && lc->ptx_has[i]; i++)
			ck_assert_msg(strstr(ptx, lc->ptx_has[i]), "%s: no '%s' in its PTX", lc->name,
				      lc->ptx_has[i]);
		free(ptx);
		free(cuda);
		ap_kir_kernel_free(k);
	}
	/* every configuration of the space lowered and printed; then those
	 * the sweep selects (APOLLO_SWEEP: ap_sweep_select) lowered again and
	 * kept to be compiled and run */
	do {
		ap_sched s = {em, sp.n, {0}};
		ap_lower_options lo = {256, &s, true};
		char name[64];
		ap_kir_kernel *k;
		char *text;
		bool is_default = dflt.n == sp.n;

		for (int i = 0; i < sp.n; i++) {
			s.v[i] = sp.knobs[i].values[idx[i]];
			is_default &= s.v[i] == dflt.v[i];
		}
		if (ap_sched_valid(&b, &s) <= 0) {
			n_invalid++;
			continue;
		}
		snprintf(name, sizeof(name), "%s_%d", lc->name, n_built);
		ap_error_clear(&err);
		k = ap_lower(&b, name, &lo, NULL, &err);
		if (!k) {
			ck_assert_msg(err.code == AP_EUNSUPPORTED, "%s %s: %s", lc->name, name, err.msg);
			n_refused++;
			continue;
		}
		text = ap_kir_print_with(k, host_kind, host_flags, &err);
		ck_assert_msg(text != NULL, "%s: host print: %s", lc->name, err.msg);
		free(text);
		ap_kir_kernel_free(k);
		if (n_built == cap_built) {
			cap_built = cap_built ? 2 * cap_built : 256;
			built = realloc(built, (size_t)cap_built * sizeof(*built));
			ck_assert_ptr_nonnull(built);
		}
		memcpy(built[n_built], idx, sizeof(built[0]));
		if (is_default)
			dpos = n_built;
		n_built++;
	} while (next_config(&sp, idx));
	take = calloc((size_t)n_built + 1, sizeof(bool));
	ck_assert_ptr_nonnull(take);
	ap_sweep_select(stride, &sp, (const int (*)[AP_SPACE_MAX_KNOBS])built, n_built, dpos, take);
	for (int c = 0; c < n_built; c++) {
		ap_sched s = {em, sp.n, {0}};
		ap_lower_options lo = {256, &s, true};
		char name[64];

		if (!take[c]) {
			n_unrun++;
			continue;
		}
		for (int i = 0; i < sp.n; i++)
			s.v[i] = sp.knobs[i].values[built[c][i]];
		snprintf(name, sizeof(name), "%s_%d", lc->name, c);
		ck_assert_int_lt(n_k, MAX_CFG);
		ks[n_k] = ap_lower(&b, name, &lo, NULL, &err);
		ck_assert_msg(ks[n_k] != NULL, "%s %s: %s", lc->name, name, err.msg);
		texts[n_k] = ap_kir_print_with(ks[n_k], host_kind, host_flags, &err);
		ck_assert_ptr_nonnull(texts[n_k]);
		n_k++;
	}
	free(take);
	free(built);
	ap_unbind(&b);
	ck_assert_msg(n_k >= 1, "%s: no configuration builds", lc->name);
	/* compiled in parts at once, loaded */
	n_chunks = host_jobs() < n_k ? host_jobs() : n_k;
	host_load_chunks(texts, n_k, n_chunks, h, in_chunk, lc->name);
	free(texts);
	buffers_init(&in, m);
	if (g_fill)
		g_fill(m, &in);
	want = calloc((size_t)m->g->n_outputs, sizeof(double *));
	for (int i = 0; i < m->g->n_outputs; i++)
		want[i] = calloc((size_t)ap_tensor_numel(&m->g->tensors[m->g->outputs[i]]) + 1,
				 sizeof(double));
	ref(m, &in, want);
	for (int c = 0; c < n_k; c++) {
		host_fn f = (host_fn)dlsym(h[in_chunk[c]], ks[c]->name);
		float **outs;

		ck_assert_msg(f != NULL, "no symbol %s", ks[c]->name);
		if (g_opts && g_opts->host_check) {
			const ap_hcheck_ops **rt = dlsym(h[in_chunk[c]], "ap_check_rt");

			ck_assert_ptr_nonnull(rt);
			*rt = ap_hostcheck_ops();
		}
		outs = run(f, ks[c], m, &in);
		for (int i = 0; i < m->g->n_outputs; i++) {
			char what[96];

			snprintf(what, sizeof(what), "%s output %d", ks[c]->name, i);
			expect_close_tol(what, outs[i], want[i],
					 ap_tensor_numel(&m->g->tensors[m->g->outputs[i]]),
					 g_opts && g_opts->rtol > 0 ? g_opts->rtol : 1e-4);
			free(outs[i]);
		}
		free(outs);
		ap_kir_kernel_free(ks[c]);
	}
	printf("check_lower: %s (%s, %s): %d configurations run, %d refused, %d outside the target",
	       lc->name, em->name, g_opts && g_opts->target ? g_opts->target : "cpu", n_k, n_refused, n_invalid);
	if (n_unrun)
		printf(", %d more lowered, not run (APOLLO_SWEEP sample, stride %d)", n_unrun, stride);
	printf("\n");
	for (int i = 0; i < m->g->n_outputs; i++)
		free(want[i]);
	free(want);
	buffers_free(&in);
	for (int c = 0; c < n_chunks; c++)
		dlclose(h[c]);
}

/* ---- the cases ---------------------------------------------------------------------------- */

/* y = tanh(2x + b), x [6, 40], b [40]: pointwise, b a trailing broadcast. */
static void ref_bias_tanh(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]], *b = in->data[m->g->inputs[1]];

	for (int i = 0; i < 6 * 40; i++)
		want[0][i] = tanh(2.0 * x[i] + b[i % 40]);
}

START_TEST(pointwise_vector)
{
	ap_graph *g = ap_graph_new("pw");
	int x = tensor(g, "x", DIMS(6, 40), AP_TENSOR_INPUT), b = tensor(g, "b", DIMS(40), AP_TENSOR_INPUT);
	int two = scalar(g, "two", 2.0f);
	int a = tensor(g, "a", DIMS(6, 40), AP_TENSOR_VALUE), c = tensor(g, "c", DIMS(6, 40), AP_TENSOR_VALUE);
	int y = tensor(g, "y", DIMS(6, 40), AP_TENSOR_VALUE);
	lcase lc = {"pointwise_bias_tanh", "pointwise", {"float4", "tanhf"}, {".v4.f32", "st.global.v4.f32"}};
	ap_mgraph *m;

	node(g, "mul", AP_OP_MUL, LIST(x, two), LIST(a));
	node(g, "add", AP_OP_ADD, LIST(a, b), LIST(c));
	node(g, "tanh", AP_OP_TANH, LIST(c), LIST(y));
	output(g, y);
	m = whole(g, AP_GROUP_BROADCAST);
	run_case(&lc, m, ref_bias_tanh);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* s = sum(exp(x), axis 1), m = max(x, axis 1): x [7, 300] (row form). */
static void ref_rowsum(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]];

	for (int r = 0; r < 7; r++) {
		double s = 0;

		for (int c = 0; c < 300; c++)
			s += exp(x[r * 300 + c]);
		want[0][r] = s;
	}
}

START_TEST(row_reduce)
{
	ap_graph *g = ap_graph_new("rr");
	int x = tensor(g, "x", DIMS(7, 300), AP_TENSOR_INPUT);
	int e = tensor(g, "e", DIMS(7, 300), AP_TENSOR_VALUE), s = tensor(g, "s", DIMS(7, 1), AP_TENSOR_VALUE);
	lcase lc = {"row_reduce_sum_exp", "row_reduce", {"__shfl_xor_sync(0xffffffff"}, {"shfl.sync.bfly"}};
	ap_mgraph *m;
	int n;

	node(g, "exp", AP_OP_EXP, LIST(x), LIST(e));
	n = node(g, "sum", AP_OP_REDUCE_SUM, LIST(e), LIST(s));
	reduce_axes(g, n, (const int64_t[]){1}, 1, 1);
	output(g, s);
	m = whole(g, AP_GROUP_REDUCTION);
	run_case(&lc, m, ref_rowsum);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* max over axis 0 of x [50, 3, 24] -> [3, 24] (column form). */
static void ref_colmax(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]];

	for (int k = 0; k < 3 * 24; k++) {
		double v = -INFINITY;

		for (int r = 0; r < 50; r++)
			v = fmax(v, x[r * 72 + k]);
		want[0][k] = v;
	}
}

START_TEST(column_reduce)
{
	ap_graph *g = ap_graph_new("cr");
	int x = tensor(g, "x", DIMS(50, 3, 24), AP_TENSOR_INPUT);
	int s = tensor(g, "s", DIMS(3, 24), AP_TENSOR_VALUE);
	lcase lc = {"column_reduce_max", "column_reduce", {"__shfl_xor_sync(0xffffffff"}, {"shfl.sync.bfly"}};
	ap_mgraph *m;
	int n;

	n = node(g, "max", AP_OP_REDUCE_MAX, LIST(x), LIST(s));
	reduce_axes(g, n, (const int64_t[]){0}, 1, 0);
	output(g, s);
	m = whole(g, AP_GROUP_REDUCTION);
	run_case(&lc, m, ref_colmax);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* Softmax over the last axis of x [9, 257]: max, exp(x - max), sum, div:
 * one stitched kernel (Layer II), the row kept on chip. */
static void ref_softmax_rows(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]];

	for (int r = 0; r < 9; r++) {
		double mx = -INFINITY, s = 0;

		for (int c = 0; c < 257; c++)
			mx = fmax(mx, x[r * 257 + c]);
		for (int c = 0; c < 257; c++)
			s += exp(x[r * 257 + c] - mx);
		for (int c = 0; c < 257; c++)
			want[0][r * 257 + c] = exp(x[r * 257 + c] - mx) / s;
	}
}

static ap_graph *softmax_graph(const int64_t *dims, int rank, int64_t axis)
{
	ap_graph *g = ap_graph_new("sm");
	int64_t rd[AP_MAX_RANK];
	int x, mx, d, e, s, y, n;

	memcpy(rd, dims, (size_t)rank * sizeof(int64_t));
	rd[axis] = 1;
	x = tensor(g, "x", dims, rank, AP_TENSOR_INPUT);
	mx = tensor(g, "mx", rd, rank, AP_TENSOR_VALUE);
	d = tensor(g, "d", dims, rank, AP_TENSOR_VALUE);
	e = tensor(g, "e", dims, rank, AP_TENSOR_VALUE);
	s = tensor(g, "s", rd, rank, AP_TENSOR_VALUE);
	y = tensor(g, "y", dims, rank, AP_TENSOR_VALUE);
	n = node(g, "max", AP_OP_REDUCE_MAX, LIST(x), LIST(mx));
	reduce_axes(g, n, &axis, 1, 1);
	node(g, "sub", AP_OP_SUB, LIST(x, mx), LIST(d));
	node(g, "exp", AP_OP_EXP, LIST(d), LIST(e));
	n = node(g, "sum", AP_OP_REDUCE_SUM, LIST(e), LIST(s));
	reduce_axes(g, n, &axis, 1, 1);
	node(g, "div", AP_OP_DIV, LIST(e, s), LIST(y));
	output(g, y);
	return g;
}

START_TEST(stitched_softmax_rows)
{
	ap_graph *g = softmax_graph((const int64_t[]){9, 257}, 2, 1);
	lcase lc = {"stitched_softmax_rows", "stitched", {"__shfl_xor_sync(0xffffffff", "#pragma unroll"},
		    {"shfl.sync.bfly"}};
	ap_mgraph *m = whole(g, AP_GROUP_STITCHED);

	run_case(&lc, m, ref_softmax_rows);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* Softmax over axis 0 of x [13, 6] (column form). */
static void ref_softmax_cols(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]];

	for (int c = 0; c < 6; c++) {
		double mx = -INFINITY, s = 0;

		for (int r = 0; r < 13; r++)
			mx = fmax(mx, x[r * 6 + c]);
		for (int r = 0; r < 13; r++)
			s += exp(x[r * 6 + c] - mx);
		for (int r = 0; r < 13; r++)
			want[0][r * 6 + c] = exp(x[r * 6 + c] - mx) / s;
	}
}

START_TEST(stitched_softmax_columns)
{
	ap_graph *g = softmax_graph((const int64_t[]){13, 6}, 2, 0);
	lcase lc = {"stitched_softmax_columns", "stitched", {"__shfl_xor_sync(0xffffffff"}, {"shfl.sync.bfly"}};
	ap_mgraph *m = whole(g, AP_GROUP_STITCHED);

	run_case(&lc, m, ref_softmax_cols);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* LayerNorm of x [5, 2100] with gamma [2100]: mean, variance (two levels),
 * normalise; also writes the row's inverse deviation.  A row of 2100
 * floats: registers or shared memory. */
static void ref_layernorm(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]], *gm = in->data[m->g->inputs[1]];
	const int N = 2100;

	for (int r = 0; r < 5; r++) {
		double mean = 0, var = 0;

		for (int c = 0; c < N; c++)
			mean += x[r * N + c];
		mean /= N;
		for (int c = 0; c < N; c++)
			var += (x[r * N + c] - mean) * (x[r * N + c] - mean);
		var /= N;
		for (int c = 0; c < N; c++)
			want[0][r * N + c] = (x[r * N + c] - mean) / sqrt(var + 1e-5) * gm[c];
		want[1][r] = 1 / sqrt(var + 1e-5);
	}
}

START_TEST(stitched_layernorm)
{
	ap_graph *g = ap_graph_new("ln");
	int x = tensor(g, "x", DIMS(5, 2100), AP_TENSOR_INPUT), gm = tensor(g, "gm", DIMS(2100), AP_TENSOR_INPUT);
	int inv_n = scalar(g, "inv_n", 1.0f / 2100), eps = scalar(g, "eps", 1e-5f);
	int sum = tensor(g, "sum", DIMS(5, 1), AP_TENSOR_VALUE), mean = tensor(g, "mean", DIMS(5, 1), AP_TENSOR_VALUE);
	int d = tensor(g, "d", DIMS(5, 2100), AP_TENSOR_VALUE), d2 = tensor(g, "d2", DIMS(5, 2100), AP_TENSOR_VALUE);
	int ss = tensor(g, "ss", DIMS(5, 1), AP_TENSOR_VALUE), var = tensor(g, "var", DIMS(5, 1), AP_TENSOR_VALUE);
	int ve = tensor(g, "ve", DIMS(5, 1), AP_TENSOR_VALUE), sd = tensor(g, "sd", DIMS(5, 1), AP_TENSOR_VALUE);
	int inv = tensor(g, "inv", DIMS(5, 1), AP_TENSOR_VALUE), nrm = tensor(g, "nrm", DIMS(5, 2100), AP_TENSOR_VALUE);
	int y = tensor(g, "y", DIMS(5, 2100), AP_TENSOR_VALUE);
	lcase lc = {"stitched_layernorm", "stitched", {"__shfl_xor_sync(0xffffffff", "__syncthreads"},
		    {"shfl.sync.bfly"}};
	ap_mgraph *m;
	int n;

	n = node(g, "sum", AP_OP_REDUCE_SUM, LIST(x), LIST(sum));
	reduce_axes(g, n, (const int64_t[]){1}, 1, 1);
	node(g, "mean", AP_OP_MUL, LIST(sum, inv_n), LIST(mean));
	node(g, "sub", AP_OP_SUB, LIST(x, mean), LIST(d));
	node(g, "sq", AP_OP_MUL, LIST(d, d), LIST(d2));
	n = node(g, "ss", AP_OP_REDUCE_SUM, LIST(d2), LIST(ss));
	reduce_axes(g, n, (const int64_t[]){1}, 1, 1);
	node(g, "var", AP_OP_MUL, LIST(ss, inv_n), LIST(var));
	node(g, "ve", AP_OP_ADD, LIST(var, eps), LIST(ve));
	node(g, "sd", AP_OP_SQRT, LIST(ve), LIST(sd));
	node(g, "inv", AP_OP_RECIPROCAL, LIST(sd), LIST(inv));
	node(g, "nrm", AP_OP_MUL, LIST(d, inv), LIST(nrm));
	node(g, "y", AP_OP_MUL, LIST(nrm, gm), LIST(y));
	output(g, y);
	output(g, inv);
	m = whole(g, AP_GROUP_STITCHED);
	run_case(&lc, m, ref_layernorm);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* y = 2 * transpose(x + 1, [1, 0]), x [40, 70]. */
static void ref_transpose(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]];

	for (int i = 0; i < 70; i++)
		for (int j = 0; j < 40; j++)
			want[0][i * 40 + j] = 2.0 * (x[j * 70 + i] + 1.0);
}

START_TEST(transpose_tiles)
{
	ap_graph *g = ap_graph_new("tr");
	int x = tensor(g, "x", DIMS(40, 70), AP_TENSOR_INPUT), one = scalar(g, "one", 1.0f);
	int two = scalar(g, "two", 2.0f);
	int a = tensor(g, "a", DIMS(40, 70), AP_TENSOR_VALUE), t = tensor(g, "t", DIMS(70, 40), AP_TENSOR_VALUE);
	int y = tensor(g, "y", DIMS(70, 40), AP_TENSOR_VALUE);
	lcase lc = {"transpose_tiles", "transpose", {"__shared__ float tile_0[1056]", "__syncthreads"},
		    {"st.shared.f32", "ld.shared.f32"}};
	ap_mgraph *m;
	int n;

	node(g, "add", AP_OP_ADD, LIST(x, one), LIST(a));
	n = node(g, "tr", AP_OP_TRANSPOSE, LIST(a), LIST(t));
	ap_node_set_ints(g, n, "perm", (const int64_t[]){1, 0}, 2);
	node(g, "mul", AP_OP_MUL, LIST(t, two), LIST(y));
	output(g, y);
	m = whole(g, AP_GROUP_TRANSPOSE);
	run_case(&lc, m, ref_transpose);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* y = concat([a, relu(b)], axis 1), a [5, 8], b [5, 12]. */
static void ref_concat(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *a = in->data[m->g->inputs[0]], *b = in->data[m->g->inputs[1]];

	for (int r = 0; r < 5; r++) {
		for (int c = 0; c < 8; c++)
			want[0][r * 20 + c] = a[r * 8 + c];
		for (int c = 0; c < 12; c++)
			want[0][r * 20 + 8 + c] = fmax(b[r * 12 + c], 0.0);
	}
}

START_TEST(movement_concat)
{
	ap_graph *g = ap_graph_new("mv");
	int a = tensor(g, "a", DIMS(5, 8), AP_TENSOR_INPUT), b = tensor(g, "b", DIMS(5, 12), AP_TENSOR_INPUT);
	int rb = tensor(g, "rb", DIMS(5, 12), AP_TENSOR_VALUE), y = tensor(g, "y", DIMS(5, 20), AP_TENSOR_VALUE);
	lcase lc = {"movement_concat", "movement", {"float4", "operand 1"}, {".v4.f32", "st.global.v4.f32"}};
	ap_mgraph *m;
	int n;

	node(g, "relu", AP_OP_RELU, LIST(b), LIST(rb));
	n = node(g, "cat", AP_OP_CONCAT, LIST(a, rb), LIST(y));
	ap_node_set_int(g, n, "axis", 1);
	output(g, y);
	m = whole(g, AP_GROUP_INJECTIVE);
	run_case(&lc, m, ref_concat);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* ---- GEMM ------------------------------------------------------------------------------ */

static bool g_tf32;   /* the reference rounds matmul operands to TF32 */

static double tf32_or_not(double v)
{
	float f = (float)v;
	uint32_t u;

	if (!g_tf32)
		return v;
	memcpy(&u, &f, 4);
	u = ap_kir_tf32_bits(u);
	memcpy(&f, &u, 4);
	return f;
}

/* y = relu(x) @ W + b + r, x [2, 20, 36], W [36, 24], b [24], r [2, 20, 24];
 * outputs y and transpose(y, [0, 2, 1]).  W has no batch dims: the two
 * batches fold into 40 rows; relu is a prologue of one buffer (x copied
 * by cp.async, relu applied into the tile: compute-staged), W a plain
 * buffer (copied), the output written both ways. */
static void ref_gemm_fold(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]], *w = in->data[m->g->inputs[1]];
	const float *b = in->data[m->g->inputs[2]], *r = in->data[m->g->inputs[3]];

	for (int bb = 0; bb < 2; bb++)
		for (int i = 0; i < 20; i++)
			for (int j = 0; j < 24; j++) {
				double acc = 0;

				for (int k = 0; k < 36; k++)
					acc += tf32_or_not(fmax(x[(bb * 20 + i) * 36 + k], 0.0)) *
					       tf32_or_not(w[k * 24 + j]);
				acc = (float)acc + b[j];
				acc = (float)acc + r[(bb * 20 + i) * 24 + j];
				want[0][(bb * 20 + i) * 24 + j] = acc;
				want[1][(bb * 24 + j) * 20 + i] = acc;
			}
}

static ap_graph *gemm_fold_graph(void)
{
	ap_graph *g = ap_graph_new("gemm");
	int x = tensor(g, "x", DIMS(2, 20, 36), AP_TENSOR_INPUT), w = tensor(g, "w", DIMS(36, 24), AP_TENSOR_INPUT);
	int b = tensor(g, "b", DIMS(24), AP_TENSOR_INPUT), r = tensor(g, "r", DIMS(2, 20, 24), AP_TENSOR_INPUT);
	int rx = tensor(g, "rx", DIMS(2, 20, 36), AP_TENSOR_VALUE), mm = tensor(g, "mm", DIMS(2, 20, 24), AP_TENSOR_VALUE);
	int yb = tensor(g, "yb", DIMS(2, 20, 24), AP_TENSOR_VALUE), y = tensor(g, "y", DIMS(2, 20, 24), AP_TENSOR_VALUE);
	int yt = tensor(g, "yt", DIMS(2, 24, 20), AP_TENSOR_VALUE);
	int n;

	node(g, "relu", AP_OP_RELU, LIST(x), LIST(rx));
	node(g, "mm", AP_OP_MATMUL, LIST(rx, w), LIST(mm));
	node(g, "bias", AP_OP_ADD, LIST(mm, b), LIST(yb));
	node(g, "res", AP_OP_ADD, LIST(yb, r), LIST(y));
	n = node(g, "tr", AP_OP_TRANSPOSE, LIST(y), LIST(yt));
	ap_node_set_ints(g, n, "perm", (const int64_t[]){0, 2, 1}, 3);
	output(g, y);
	output(g, yt);
	return g;
}

START_TEST(gemm_simt)
{
	ap_graph *g = gemm_fold_graph();
	lcase lc = {"gemm_simt", "gemm", {"cp.async.cg.shared.global", "__syncthreads"},
		    {"cp.async.cg.shared.global", "ld.shared.f32"}};
	ap_mgraph *m = whole(g, AP_GROUP_MATMUL);

	g_tf32 = false;
	run_case(&lc, m, ref_gemm_fold);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* Convert-staged operands (server/lower/gemm.c, copy_mode): y = Cast(x)
 * @ Cast(w)^T with x [2, M, K] and w [24, K] float32 (the float32 inputs
 * and weights a converted training graph keeps) in a 16-bit type.  Both
 * operands are copied by cp.async as float32 (16 bytes a copy for K = 36,
 * one element for K = 23) and converted into the tile once their stage
 * has arrived; every configuration is run, on sm_90 through the emulated
 * mma.sync (2 to 4 stages: a stage read from the wrong staging slot shows)
 * and on the host's SIMT form.  Reference: the operands rounded to the
 * type, products summed exactly; tolerance: the output's rounding (f16
 * 4e-3, bf16 2e-2). */
static void expect_no_spills(const ap_mgraph *m, const char *name);

/* run_case with options o (g_opts around it), then, with `spills`, no
 * spills in the default kernel for sm_80 and sm_90; frees m and g. */
static void run_case_with(const lcase *lc, ap_graph *g, ap_mgraph *m, reference_fn ref, const case_opts *o,
			  bool spills)
{
	g_opts = o;
	run_case(lc, m, ref);
	if (spills)
		expect_no_spills(m, lc->name);
	g_opts = NULL;
	ap_mgraph_free(m);
	ap_graph_free(g);
}

typedef struct convert_case {
	const char *name, *target;
	ap_dtype dt;
	int64_t M, K;                    /* x [2, M, K] */
} convert_case;

static const convert_case *g_cv;

static void ref_gemm_convert(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]], *w = in->data[m->g->inputs[1]];
	int64_t K = g_cv->K;

	for (int64_t i = 0; i < 2 * g_cv->M; i++)
		for (int64_t j = 0; j < 24; j++) {
			double acc = 0;

			for (int64_t k = 0; k < K; k++)
				acc += half_round(g_cv->dt, x[i * K + k]) * half_round(g_cv->dt, w[j * K + k]);
			want[0][i * 24 + j] = acc;
		}
}

static void run_convert_case(const convert_case *c)
{
	ap_graph *g = ap_graph_new("gemm_convert");
	int x = tensor(g, "x", DIMS(2, c->M, c->K), AP_TENSOR_INPUT), w = tensor(g, "w", DIMS(24, c->K), AP_TENSOR_INPUT);
	int cx, cw, wt, y, n;
	lcase lc = {c->name, "gemm", {"converted into the tile", "cp.async"}, {"cp.async.ca.shared.global"}};
	case_opts o = {c->target, false, c->dt == AP_DT_F16 ? 4e-3 : 2e-2, false};
	ap_mgraph *m;

	if (c->K % 4 == 0)
		lc.ptx_has[0] = "cp.async.cg.shared.global";   /* 16-byte copies bypass L1 */
	g_dt = c->dt;
	cx = tensor(g, "cx", DIMS(2, c->M, c->K), AP_TENSOR_VALUE);
	cw = tensor(g, "cw", DIMS(24, c->K), AP_TENSOR_VALUE);
	wt = tensor(g, "wt", DIMS(c->K, 24), AP_TENSOR_VALUE);
	y = tensor(g, "y", DIMS(2, c->M, 24), AP_TENSOR_VALUE);
	g_dt = AP_DT_F32;
	n = node(g, "cast_x", AP_OP_CAST, LIST(x), LIST(cx));
	ap_node_set_int(g, n, "to", c->dt);
	n = node(g, "cast_w", AP_OP_CAST, LIST(w), LIST(cw));
	ap_node_set_int(g, n, "to", c->dt);
	n = node(g, "wt", AP_OP_TRANSPOSE, LIST(cw), LIST(wt));
	ap_node_set_ints(g, n, "perm", (const int64_t[]){1, 0}, 2);
	node(g, "mm", AP_OP_MATMUL, LIST(cx, wt), LIST(y));
	output(g, y);
	m = whole(g, AP_GROUP_MATMUL);
	g_cv = c;
	run_case_with(&lc, g, m, ref_gemm_convert, &o, c->target != NULL);
}

/* Prologues of unary ops computed from the staged elements: y =
 * (x * 0.5 + 1) @ (w + 1)^T in float16, x [2, 9, 20] and w [24, 20] (ops
 * with baked constants: both operands compute-staged, 8-byte copies; K =
 * 20, so K tiles pass the end, where the copies give 0 and both prologues
 * 1: the tile elements must be 0 there).  Every configuration on sm_90;
 * tolerance 4e-3. */
static int scalar_dt(ap_graph *g, const char *name, float v);

static void ref_gemm_staged_prologue(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]], *w = in->data[m->g->inputs[1]];

	for (int i = 0; i < 18; i++)
		for (int j = 0; j < 24; j++) {
			double acc = 0;

			for (int k = 0; k < 20; k++)
				acc += half_round(AP_DT_F16, half_round(AP_DT_F16, x[i * 20 + k] * 0.5f) + 1.0f) *
				       half_round(AP_DT_F16, w[j * 20 + k] + 1.0f);
			want[0][i * 24 + j] = acc;
		}
}

static void run_staged_prologue(const char *name, const char *target)
{
	ap_graph *g = ap_graph_new("gemm_prologue");
	int x, w, half, one, xs, xa, wa, wt, y, n;
	lcase lc = {name, "gemm", {"computed into the tile", "cp.async"}, {"cp.async.ca.shared.global"}};
	case_opts o = {target, false, 4e-3, false};

	g_dt = AP_DT_F16;
	x = tensor(g, "x", DIMS(2, 9, 20), AP_TENSOR_INPUT);
	w = tensor(g, "w", DIMS(24, 20), AP_TENSOR_INPUT);
	half = scalar_dt(g, "half", 0.5f);
	one = scalar_dt(g, "one", 1.0f);
	xs = tensor(g, "xs", DIMS(2, 9, 20), AP_TENSOR_VALUE);
	xa = tensor(g, "xa", DIMS(2, 9, 20), AP_TENSOR_VALUE);
	wa = tensor(g, "wa", DIMS(24, 20), AP_TENSOR_VALUE);
	wt = tensor(g, "wt", DIMS(20, 24), AP_TENSOR_VALUE);
	y = tensor(g, "y", DIMS(2, 9, 24), AP_TENSOR_VALUE);
	g_dt = AP_DT_F32;
	node(g, "scale", AP_OP_MUL, LIST(x, half), LIST(xs));
	node(g, "shift", AP_OP_ADD, LIST(xs, one), LIST(xa));
	node(g, "wshift", AP_OP_ADD, LIST(w, one), LIST(wa));
	n = node(g, "wt", AP_OP_TRANSPOSE, LIST(wa), LIST(wt));
	ap_node_set_ints(g, n, "perm", (const int64_t[]){1, 0}, 2);
	node(g, "mm", AP_OP_MATMUL, LIST(xa, wt), LIST(y));
	output(g, y);
	run_case_with(&lc, g, whole(g, AP_GROUP_MATMUL), ref_gemm_staged_prologue, &o, target != NULL);
}

/* A prologue of two tensors stays register-staged: y = (x + c) @ w, x
 * [12, 20], c [20] broadcast along the rows, w [20, 24] (operand A through
 * registers, the value builder reading x and c; B copied); every
 * configuration on the host in float32 and on sm_90 in float16. */
static ap_dtype g_rp_dt;

static void ref_gemm_register_prologue(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]], *cv = in->data[m->g->inputs[1]];
	const float *w = in->data[m->g->inputs[2]];

	for (int i = 0; i < 12; i++)
		for (int j = 0; j < 24; j++) {
			double acc = 0;

			for (int k = 0; k < 20; k++)
				acc += half_round(g_rp_dt, x[i * 20 + k] + cv[k]) * w[k * 24 + j];
			want[0][i * 24 + j] = acc;
		}
}

static void run_register_prologue(const char *name, const char *target, ap_dtype dt)
{
	ap_graph *g = ap_graph_new("gemm_regs");
	int x, cv, w, xa, y;
	lcase lc = {name, "gemm", {"through registers (computed on the way)"},
		    {dt == AP_DT_F16 ? "mma.sync.aligned.m16n8k16" : "ld.shared.f32"}};
	case_opts o = {target, false, dt == AP_DT_F16 ? 4e-3 : 1e-4, false};

	g_dt = dt;
	x = tensor(g, "x", DIMS(12, 20), AP_TENSOR_INPUT);
	cv = tensor(g, "c", DIMS(20), AP_TENSOR_INPUT);
	w = tensor(g, "w", DIMS(20, 24), AP_TENSOR_INPUT);
	xa = tensor(g, "xa", DIMS(12, 20), AP_TENSOR_VALUE);
	y = tensor(g, "y", DIMS(12, 24), AP_TENSOR_VALUE);
	g_dt = AP_DT_F32;
	node(g, "shift", AP_OP_ADD, LIST(x, cv), LIST(xa));
	node(g, "mm", AP_OP_MATMUL, LIST(xa, w), LIST(y));
	output(g, y);
	g_rp_dt = dt;
	run_case_with(&lc, g, whole(g, AP_GROUP_MATMUL), ref_gemm_register_prologue, &o, target != NULL);
}

/* A float32 product of 16-bit operands (MatMul declared float32 over
 * float16 / bfloat16, ops.def; Attention's fp32_scores opens into one):
 * y [2, 40, 24] = x [2, 40, 72] w [72, 24], the accumulator stored as it
 * is -- at 1e-5 against float64 of the operands, which a result rounded
 * to the operand type misses (tried: a float16-rounded reference, 8.03125
 * against the kernel's 8.02812).  On
 * sm_80 (mma.sync), sm_90a (wgmma) and the host. */
static void ref_gemm_wide(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]], *w = in->data[m->g->inputs[1]];

	for (int64_t i = 0; i < 2 * 40; i++)
		for (int64_t j = 0; j < 24; j++) {
			double acc = 0;

			for (int64_t k = 0; k < 72; k++)
				acc += (double)x[i * 72 + k] * w[k * 24 + j];
			want[0][i * 24 + j] = acc;
		}
}

static void run_wide_case(const char *name, const char *target, ap_dtype dt, const char *has)
{
	ap_graph *g = ap_graph_new("gemm_wide");
	lcase lc = {name, "gemm", {has}, {".entry"}};
	case_opts o = {target, false, 1e-5, target != NULL};
	int x, w, y;

	g_dt = dt;
	x = tensor(g, "x", DIMS(2, 40, 72), AP_TENSOR_INPUT);
	w = tensor(g, "w", DIMS(72, 24), AP_TENSOR_INPUT);
	g_dt = AP_DT_F32;
	y = tensor(g, "y", DIMS(2, 40, 24), AP_TENSOR_VALUE);
	node(g, "mm", AP_OP_MATMUL, LIST(x, w), LIST(y));
	output(g, y);
	if (target && !strcmp(target, "sm_90a"))
		g_golden_target = target;
	run_case_with(&lc, g, whole(g, AP_GROUP_MATMUL), ref_gemm_wide, &o, target != NULL);
	g_golden_target = NULL;
}

START_TEST(gemm_float32_result)
{
	run_wide_case("gemm_f32_result_f16", "sm_80", AP_DT_F16, "mma.sync");
	run_wide_case("gemm_f32_result_wg_bf16", "sm_90a", AP_DT_BF16, "wgmma.mma_async");
	run_wide_case("gemm_f32_result_host_f16", NULL, AP_DT_F16, "float acc");
}
END_TEST

START_TEST(gemm_convert_staged)
{
	static const convert_case cases[] = {
		{"gemm_convert_f16", "sm_90", AP_DT_F16, 12, 36},
		{"gemm_convert_bf16_odd", "sm_90", AP_DT_BF16, 8, 23},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		run_convert_case(&cases[i]);
	run_staged_prologue("gemm_prologue_staged_f16", "sm_90");
	run_register_prologue("gemm_prologue_registers", NULL, AP_DT_F32);
	run_register_prologue("gemm_prologue_registers_f16", "sm_90", AP_DT_F16);
}
END_TEST

/* wgmma (sm_90a, server/lower/gemm_kernel.c): y = x w + b in float16
 * and bfloat16, x [72, K], w [K, 40] -- B with N contiguous, so its
 * tiles are MN-major; M and N not multiples of the tiles; K 128 (float16)
 * long enough for split-K clusters, 64 (bfloat16, under APOLLO_SWEEP=full)
 * -- every configuration the sweep takes run on the
 * host in the checking mode through the emulated wgmma (a stage read
 * before its fence and barrier, or a tile element the descriptor
 * misplaces, fails); the default kernel's CUDA holds wgmma and its PTX
 * for sm_90a too, without spills.  Then the convert-staged and
 * register-prologue products above on sm_90a: K-major tiles, operands
 * computed into the tile and through registers. */
static ap_dtype g_wg_dt;
static int g_wg_k;

static void ref_gemm_wg(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]], *w = in->data[m->g->inputs[1]];
	const float *b = in->data[m->g->inputs[2]];

	for (int i = 0; i < 72; i++)
		for (int j = 0; j < 40; j++) {
			double acc = 0;

			for (int k = 0; k < g_wg_k; k++)
				acc += (double)x[i * g_wg_k + k] * w[k * 40 + j];
			want[0][i * 40 + j] = half_round(g_wg_dt, half_round(g_wg_dt, acc) + b[j]);
		}
}

static void run_wg_bias(const char *name, ap_dtype dt, int K)
{
	ap_graph *g = ap_graph_new("gemm_wg");
	int x, w, b, mm, y;
	lcase lc = {name, "gemm", {"cp.async"}, {"mma.sync.aligned.m16n8k16"}};
	case_opts o = {"sm_90a", false, dt == AP_DT_F16 ? 4e-3 : 2e-2, true};
	ap_target_info ti;
	ap_error err;
	ap_mgraph *m;

	g_dt = dt;
	x = tensor(g, "x", DIMS(72, K), AP_TENSOR_INPUT);
	w = tensor(g, "w", DIMS(K, 40), AP_TENSOR_INPUT);
	b = tensor(g, "b", DIMS(40), AP_TENSOR_INPUT);
	mm = tensor(g, "mm", DIMS(72, 40), AP_TENSOR_VALUE);
	y = tensor(g, "y", DIMS(72, 40), AP_TENSOR_VALUE);
	g_dt = AP_DT_F32;
	node(g, "mm", AP_OP_MATMUL, LIST(x, w), LIST(mm));
	node(g, "bias", AP_OP_ADD, LIST(mm, b), LIST(y));
	output(g, y);
	m = whole(g, AP_GROUP_MATMUL);
	g_wg_dt = dt;
	g_wg_k = K;
	g_opts = &o;
	run_case(&lc, m, ref_gemm_wg);
	g_opts = NULL;
	ck_assert_int_eq(ap_cost_target("sm_90a", &ti), 0);
	/* the default rule's kernel (cp.async), then the same tile with its
	 * operands filled by TMA (tma=1, gemm_tma.c) */
	for (int tma = 0; tma < 2; tma++) {
		ap_lower_options lo = {0, NULL, true};
		ap_sched s;
		ap_kir_kernel *k;
		char *cuda, *probe;
		uint8_t *ptx = NULL;
		size_t len = 0;
		ap_ptxas_stats st;

		if (tma) {
			ap_test_default_with(m, &ti, "tma", 0, 1, &s);
			lo.sched = &s;
		}
		k = ap_lower_mgraph(m, &ti, name, &lo, NULL, &err);
		ck_assert_msg(k != NULL, "%s", err.msg);
		cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
		ck_assert_ptr_nonnull(cuda);
		ck_assert_ptr_nonnull(strstr(cuda, "wgmma.mma_async.sync.aligned.m64n"));
		ck_assert_ptr_nonnull(strstr(cuda, "fence.proxy.async.shared::cta"));
		/* the wgmma kernel's own text (the golden above is sm_80's):
		 * swizzled tiles in dynamic shared memory aligned at run time */
		ck_assert_ptr_nonnull(strstr(cuda, "ap_smem_raw"));
		ck_assert_int_eq(strstr(cuda, "cp.async.bulk.tensor.2d") != NULL, tma);
		ck_assert_int_eq(strstr(cuda, "cp.async.cg") != NULL || strstr(cuda, "cp.async.ca") != NULL, !tma);
		{
			char gname[64];

			snprintf(gname, sizeof(gname), "%s%s_sm90a", name, tma ? "_tma" : "");
			golden(gname, cuda);
		}
		probe = nvrtc_ptx("extern \"C\" __global__ void ap_probe() {}", "ap_probe");
		if (probe) {   /* NVRTC is there */
			free(probe);
			ck_assert_msg(ap_nvrtc_compile(cuda, k->name, "sm_90a", false, &ptx, &len, &err) == 0, "%s",
				      err.msg);
			ck_assert_ptr_nonnull(strstr((char *)ptx, "wgmma.mma_async.sync.aligned"));
			free(ptx);
			ck_assert_int_eq(ap_nvrtc_ptxas_stats(cuda, k->name, "sm_90a", &st, &err), 0);
			ck_assert_int_eq(st.spill_store_bytes + st.spill_load_bytes, 0);
		}
		free(cuda);
		ap_kir_kernel_free(k);
	}
	ap_mgraph_free(m);
	ap_graph_free(g);
}

START_TEST(gemm_wgmma)
{
	static const convert_case cv = {"gemm_convert_f16_sm90a", "sm_90a", AP_DT_F16, 12, 36};

	run_wg_bias("gemm_wg_f16", AP_DT_F16, 128);
	if (ap_sweep_stride() == 1)   /* the same kernels in another type: make check-full */
		run_wg_bias("gemm_wg_bf16", AP_DT_BF16, 64);
	run_convert_case(&cv);
	run_register_prologue("gemm_prologue_registers_f16_sm90a", "sm_90a", AP_DT_F16);
}
END_TEST

/* A product whose output is concatenated (SqueezeNet's fire modules:
 * expand1x1 -> ReLU -> Concat with the expand3x3 branch): out =
 * Concat(s, relu(x @ w), t) along the rows, x [2, 8, 12], w [12, 24], s
 * and t [2, 8, 24] (epilogue.c, AP_EMAP_CONCAT).  The GEMM emitter writes
 * the whole output, s and t element by element beside Y's element; every
 * configuration on the host.  A Concat whose other input has another
 * shape, or a Concat read by another op, stays with the movement emitter. */
static void ref_gemm_concat(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]], *w = in->data[m->g->inputs[1]];
	const float *sv = in->data[m->g->inputs[2]], *tv = in->data[m->g->inputs[3]];

	for (int b = 0; b < 2; b++)
		for (int i = 0; i < 8; i++)
			for (int j = 0; j < 24; j++) {
				double acc = 0;

				for (int k = 0; k < 12; k++)
					acc += (double)x[(b * 8 + i) * 12 + k] * w[k * 24 + j];
				want[0][(b * 24 + i) * 24 + j] = sv[(b * 8 + i) * 24 + j];
				want[0][(b * 24 + 8 + i) * 24 + j] = fmax(acc, 0.0);
				want[0][(b * 24 + 16 + i) * 24 + j] = tv[(b * 8 + i) * 24 + j];
			}
}

/* The graph of gemm_concat: t of dims td, the Concat along `axis`, and
 * with `after` a Neg of the concatenation as the output. */
static ap_graph *gemm_concat_graph(const int64_t *td, int axis, bool after)
{
	ap_graph *g = ap_graph_new("gemm_concat");
	int x = tensor(g, "x", DIMS(2, 8, 12), AP_TENSOR_INPUT), w = tensor(g, "w", DIMS(12, 24), AP_TENSOR_INPUT);
	int sv = tensor(g, "s", DIMS(2, 8, 24), AP_TENSOR_INPUT), tv = tensor(g, "t", td, 3, AP_TENSOR_INPUT);
	int64_t od[3] = {2, 8, 24};
	int mm, yr, out, n;

	od[axis] = 2 * od[axis] + td[axis];
	mm = tensor(g, "mm", DIMS(2, 8, 24), AP_TENSOR_VALUE);
	yr = tensor(g, "yr", DIMS(2, 8, 24), AP_TENSOR_VALUE);
	out = tensor(g, "out", od, 3, AP_TENSOR_VALUE);
	node(g, "mm", AP_OP_MATMUL, LIST(x, w), LIST(mm));
	node(g, "relu", AP_OP_RELU, LIST(mm), LIST(yr));
	n = node(g, "cat", AP_OP_CONCAT, LIST(sv, yr, tv), LIST(out));
	ap_node_set_int(g, n, "axis", axis);
	if (after) {
		int neg = tensor(g, "neg", od, 3, AP_TENSOR_VALUE);

		node(g, "neg", AP_OP_NEG, LIST(out), LIST(neg));
		out = neg;
	}
	output(g, out);
	return g;
}

START_TEST(gemm_concat_epilogue)
{
	ap_graph *g = gemm_concat_graph((const int64_t[]){2, 8, 24}, 1, false);
	lcase lc = {"gemm_concat", "gemm", {"__syncthreads"}, {"ld.shared.f32"}};
	ap_mgraph *m = whole(g, AP_GROUP_MATMUL);

	run_case(&lc, m, ref_gemm_concat);
	ap_mgraph_free(m);
	ap_graph_free(g);
	/* not of the product's shape; read after the Concat */
	for (int i = 0; i < 2; i++) {
		ap_target_info ti;
		ap_bound b;
		ap_error err;

		g = i ? gemm_concat_graph((const int64_t[]){2, 8, 24}, 1, true)
		      : gemm_concat_graph((const int64_t[]){2, 8, 5}, 2, false);
		m = whole(g, AP_GROUP_MATMUL);
		ck_assert_int_eq(ap_cost_target("cpu", &ti), 0);
		ck_assert_int_eq(ap_bind_first(m, &ti, &b, &err), 0);
		/* the movement emitter builds a micro-graph whose output is a
		 * Concat; the pointwise emitter the rest */
		ck_assert_msg(strcmp(b.em->name, i ? "pointwise" : "movement") == 0, "case %d: bound by %s", i,
			      b.em->name);
		ap_unbind(&b);
		ap_mgraph_free(m);
		ap_graph_free(g);
	}
}
END_TEST

/* The host's ISA clones (print.c, AP_HOST_ISA; hostcc.c): the default
 * GEMM kernel of gemm_fold_graph on the host has a register tile, so it is
 * declared with the x86-64-v3 clone; built with the clones and built
 * baseline only (-DAP_HOST_ISA=), it gives the same bits (no FMA
 * contraction in the clone this machine picks) and the reference's
 * values. */
START_TEST(host_isa_clones)
{
	ap_graph *g = gemm_fold_graph();
	ap_mgraph *m = whole(g, AP_GROUP_MATMUL);
	ap_target_info ti;
	ap_lower_options lo = {256, NULL, true};
	ap_kir_kernel *k;
	ap_error err;
	const char *clones = getenv("APOLLO_HOST_CLONES");
	char *src, *saved = clones ? strdup(clones) : NULL;
	void *h[2];
	float **outs[2];
	double *want[2];
	buffers in;

	ck_assert_int_eq(ap_cost_target("cpu", &ti), 0);
	k = ap_lower_mgraph(m, &ti, "isa_gemm", &lo, NULL, &err);
	ck_assert_msg(k != NULL, "%s", err.msg);
	src = ap_kir_print(k, AP_KIR_HOST, &err);
	ck_assert_ptr_nonnull(src);
	ck_assert_msg(strstr(src, "AP_HOST_ISA void isa_gemm("), "no clone declaration in\n%.2000s", src);
	{   /* an emulated GPU target's print: the same kernel, no clone */
		char *base = ap_kir_print_with(k, AP_KIR_HOST, AP_KIR_PRINT_BASELINE, &err);

		ck_assert_ptr_nonnull(base);
		ck_assert_msg(strstr(base, "\nvoid isa_gemm(") && !strstr(base, "AP_HOST_ISA void"),
			      "a clone declared in the baseline print:\n%.2000s", base);
		free(base);
	}
	/* the test runners build without clones (APOLLO_HOST_CLONES=0):
	 * this test asks for each form itself */
	setenv("APOLLO_HOST_CLONES", "1", 1);
	h[0] = host_load(src, "clones");
	setenv("APOLLO_HOST_CLONES", "0", 1);
	h[1] = host_load(src, "baseline");
	if (saved)
		setenv("APOLLO_HOST_CLONES", saved, 1);
	else
		unsetenv("APOLLO_HOST_CLONES");
	buffers_init(&in, m);
	for (int i = 0; i < 2; i++) {
		host_fn f = (host_fn)dlsym(h[i], "isa_gemm");

		ck_assert_ptr_nonnull(f);
		outs[i] = run(f, k, m, &in);
	}
	for (int o = 0; o < 2; o++)
		want[o] = calloc((size_t)ap_tensor_numel(&g->tensors[g->outputs[o]]), sizeof(double));
	ref_gemm_fold(m, &in, want);
	for (int o = 0; o < 2; o++) {
		int64_t n = ap_tensor_numel(&g->tensors[g->outputs[o]]);

		expect_close_tol("clones", outs[0][o], want[o], n, 1e-4);
		for (int64_t j = 0; j < n; j++)
			ck_assert_msg(memcmp(&outs[0][o][j], &outs[1][o][j], sizeof(float)) == 0,
				      "output %d [%lld]: %a with the clones, %a baseline", o, (long long)j,
				      (double)outs[0][o][j], (double)outs[1][o][j]);
	}
	printf("check_lower: host_isa_clones: the %s clone ran, bit-identical to the baseline build\n",
	       __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "x86-64-v3" : "default");
	for (int i = 0; i < 2; i++) {
		for (int o = 0; o < 2; o++)
			free(outs[i][o]);
		free(outs[i]);
		dlclose(h[i]);
	}
	for (int o = 0; o < 2; o++)
		free(want[o]);
	buffers_free(&in);
	free(saved);
	free(src);
	ap_kir_kernel_free(k);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* Split-K (server/lower/gemm.c): y = x w + b with K = 512 on sm_90 with
 * TF32, every configuration of the space (splitk 1, 2, 4, 8 among them:
 * thread-block clusters, run on the host as one wide block per cluster,
 * the partials summed through the emulated distributed shared memory)
 * against the reference; the default rule splits K for this 4-tile
 * product, and its CUDA compiles for sm_90 with cluster barriers and
 * distributed shared-memory loads in the PTX and no spills. */
static void ref_gemm_splitk(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *x = in->data[m->g->inputs[0]], *w = in->data[m->g->inputs[1]];
	const float *b = in->data[m->g->inputs[2]];

	for (int i = 0; i < 24; i++)
		for (int j = 0; j < 20; j++) {
			double acc = 0;

			for (int k = 0; k < 512; k++)
				acc += tf32_or_not(x[i * 512 + k]) * tf32_or_not(w[k * 20 + j]);
			want[0][i * 20 + j] = (float)acc + b[j];
		}
}

START_TEST(gemm_splitk)
{
	ap_graph *g = ap_graph_new("gemm_splitk");
	int x = tensor(g, "x", DIMS(24, 512), AP_TENSOR_INPUT), w = tensor(g, "w", DIMS(512, 20), AP_TENSOR_INPUT);
	int b = tensor(g, "b", DIMS(20), AP_TENSOR_INPUT);
	int mm = tensor(g, "mm", DIMS(24, 20), AP_TENSOR_VALUE), y = tensor(g, "y", DIMS(24, 20), AP_TENSOR_VALUE);
	lcase lc = {"gemm_splitk", "gemm", {"mma.sync.aligned.m16n8k8", "ldmatrix.sync.aligned", NULL},
		    {"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "cp.async", NULL}};
	case_opts o = {"sm_90", true, 1e-4, false};
	ap_mgraph *m;
	ap_target_info ti;
	ap_space sp;
	ap_sched s;
	ap_error err;

	node(g, "mm", AP_OP_MATMUL, LIST(x, w), LIST(mm));
	node(g, "bias", AP_OP_ADD, LIST(mm, b), LIST(y));
	output(g, y);
	m = whole(g, AP_GROUP_MATMUL);
	g_tf32 = true;
	g_opts = &o;
	run_case(&lc, m, ref_gemm_splitk);
	g_opts = NULL;
	g_tf32 = false;
	/* the default rule on sm_90: a cluster per tile */
	ck_assert_int_eq(ap_cost_target("sm_90", &ti), 0);
	ti.allow_tf32 = true;
	{
		ap_bound b;

		ck_assert_int_eq(ap_bind_first(m, &ti, &b, &err), 0);
		ck_assert_str_eq(b.em->name, "gemm");
		ck_assert_int_eq(ap_emitter_default(&b, &sp, &s, &err), 0);
		ap_unbind(&b);
	}
	ck_assert_int_gt(ap_sched_get(&s, &sp, "splitk", 1), 1);
	{
		ap_lower_options lo = {0, NULL, true};
		ap_kir_kernel *k = ap_lower_mgraph(m, &ti, "gemm_splitk_sm90", &lo, NULL, &err);
		char *cuda, *probe;
		uint8_t *ptx = NULL;
		size_t len = 0;
		ap_ptxas_stats st;

		ck_assert_msg(k != NULL, "%s", err.msg);
		ck_assert_uint_gt(k->cluster, 1);
		cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
		ck_assert_ptr_nonnull(cuda);
		ck_assert_ptr_nonnull(strstr(cuda, "__cluster_dims__"));
		probe = nvrtc_ptx("extern \"C\" __global__ void ap_probe() {}", "ap_probe");
		if (probe) {   /* NVRTC is there */
			free(probe);
			ck_assert_msg(ap_nvrtc_compile(cuda, k->name, "compute_90", false, &ptx, &len, &err) == 0,
				      "%s", err.msg);
			ck_assert_ptr_nonnull(strstr((char *)ptx, "barrier.cluster.arrive"));
			ck_assert_ptr_nonnull(strstr((char *)ptx, "mapa.shared::cluster"));
			ck_assert_ptr_nonnull(strstr((char *)ptx, "ld.shared::cluster.f32"));
			free(ptx);
			ck_assert_int_eq(ap_nvrtc_ptxas_stats(cuda, k->name, "sm_90", &st, &err), 0);
			ck_assert_int_eq(st.spill_store_bytes + st.spill_load_bytes, 0);
		}
		free(cuda);
		ap_kir_kernel_free(k);
	}
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* The same micro-graph on sm_80 with TF32 allowed: tensor cores, every
 * configuration run on the host through the emulated ldmatrix / mma. */
START_TEST(gemm_tf32)
{
	ap_graph *g = gemm_fold_graph();
	lcase lc = {"gemm_tf32", "gemm", {"mma.sync.aligned.m16n8k8", "ldmatrix.sync.aligned", "cvt.rna.tf32.f32"},
		    {"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "ldmatrix.sync.aligned", "cp.async"}};
	ap_mgraph *m = whole(g, AP_GROUP_MATMUL);
	case_opts o = {"sm_80", true, 1e-4, false};

	g_tf32 = true;
	g_opts = &o;
	run_case(&lc, m, ref_gemm_fold);
	g_opts = NULL;
	g_tf32 = false;
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* y = tanh(a @ b), a [3, 1, 16, 40] and b [1, 2, 40, 28] broadcast to
 * [3, 2, 16, 28]: batches of tiles, each operand broadcast over one
 * batch dim (stride 0). */
static void ref_gemm_batched(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *a = in->data[m->g->inputs[0]], *b = in->data[m->g->inputs[1]];

	for (int p = 0; p < 3; p++)
		for (int q = 0; q < 2; q++)
			for (int i = 0; i < 16; i++)
				for (int j = 0; j < 28; j++) {
					double acc = 0;

					for (int k = 0; k < 40; k++)
						acc += (double)a[(p * 16 + i) * 40 + k] * b[(q * 40 + k) * 28 + j];
					want[0][((p * 2 + q) * 16 + i) * 28 + j] = tanh((float)acc);
				}
}

START_TEST(gemm_batched)
{
	ap_graph *g = ap_graph_new("bmm");
	int a = tensor(g, "a", DIMS(3, 1, 16, 40), AP_TENSOR_INPUT), b = tensor(g, "b", DIMS(1, 2, 40, 28), AP_TENSOR_INPUT);
	int mm = tensor(g, "mm", DIMS(3, 2, 16, 28), AP_TENSOR_VALUE), y = tensor(g, "y", DIMS(3, 2, 16, 28), AP_TENSOR_VALUE);
	lcase lc = {"gemm_batched", "gemm", {"__syncthreads"}, {"ld.shared.f32"}};
	ap_mgraph *m;

	node(g, "mm", AP_OP_MATMUL, LIST(a, b), LIST(mm));
	node(g, "tanh", AP_OP_TANH, LIST(mm), LIST(y));
	output(g, y);
	m = whole(g, AP_GROUP_MATMUL);
	run_case(&lc, m, ref_gemm_batched);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* y = a @ b in float16 on sm_90a with the forms not yet run on a GPU
 * (--unvalidated: tma=2 and 1, the warp-specialised form the default), a
 * [3, 1, 70, 64] and b [1, 2,
 * 64, 48] broadcast to [3, 2, 70, 48]: batches of tiles whose operands
 * are 3-D tensor maps (K or N, M or K, the batch dim each has), M not a
 * multiple of the tile (zero-filled rows), every configuration the sweep
 * takes run in the checking host mode against float64 on one SM (the
 * persistent grid's blocks walk tiles of several batches, prefetching the
 * next batch's first stages). */
static void ref_gemm_batched_tma(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *a = in->data[m->g->inputs[0]], *b = in->data[m->g->inputs[1]];

	for (int p = 0; p < 3; p++)
		for (int q = 0; q < 2; q++)
			for (int i = 0; i < 70; i++)
				for (int j = 0; j < 48; j++) {
					double acc = 0;

					for (int k = 0; k < 64; k++)
						acc += (double)a[(p * 70 + i) * 64 + k] * b[(q * 64 + k) * 48 + j];
					want[0][((p * 2 + q) * 70 + i) * 48 + j] = half_round(AP_DT_F16, acc);
				}
}

START_TEST(gemm_batched_tma)
{
	ap_graph *g = ap_graph_new("bmm_tma");
	int a, b, y;
	lcase lc = {"gemm_batched_tma_f16", "gemm", {"mma.sync"}, {"mma.sync.aligned.m16n8k16"}};
	case_opts o = {"sm_90a", false, 4e-3, true};
	ap_target_info ti;
	ap_lower_options lo = {256, NULL, true};
	ap_ptxas_stats st;
	ap_kir_kernel *k;
	ap_error err;
	ap_mgraph *m;
	char *cuda;

	g_dt = AP_DT_F16;
	a = tensor(g, "a", DIMS(3, 1, 70, 64), AP_TENSOR_INPUT);
	b = tensor(g, "b", DIMS(1, 2, 64, 48), AP_TENSOR_INPUT);
	y = tensor(g, "y", DIMS(3, 2, 70, 48), AP_TENSOR_VALUE);
	g_dt = AP_DT_F32;
	node(g, "mm", AP_OP_MATMUL, LIST(a, b), LIST(y));
	output(g, y);
	m = whole(g, AP_GROUP_MATMUL);
	g_unvalidated = true;
	g_sms = 1;
	g_opts = &o;
	run_case(&lc, m, ref_gemm_batched_tma);
	g_opts = NULL;
	g_unvalidated = false;
	g_sms = 0;
	/* the default kernel of such a request: 3-D boxes, no spills */
	ck_assert_int_eq(ap_cost_target("sm_90a", &ti), 0);
	ti.unvalidated = ti.tma = true;
	k = ap_lower_mgraph(m, &ti, "bmm_tma", &lo, NULL, &err);
	ck_assert_msg(k != NULL, "%s", err.msg);
	cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
	ck_assert_ptr_nonnull(cuda);
	if (getenv("CHECK_LOWER_DUMP"))
		fputs(cuda, stdout);
	ck_assert_msg(strstr(cuda, "cp.async.bulk.tensor.3d"), "no 3-D TMA load in\n%.3000s", cuda);
	if (ap_nvrtc_load(&err) == 0) {
		ck_assert_msg(ap_nvrtc_ptxas_stats(cuda, "bmm_tma", "sm_90a", &st, &err) == 0, "%s", err.msg);
		ck_assert_msg(st.spill_store_bytes == 0 && st.spill_load_bytes == 0, "spills %d / %d bytes",
			      st.spill_store_bytes, st.spill_load_bytes);
		printf("check_lower: gemm_batched_tma_f16 on sm_90a (tma=2, warp specialised): %d registers, no spills\n", st.registers);
	}
	free(cuda);
	ap_kir_kernel_free(k);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* y = a @ b in float16 on sm_90a with --unvalidated (the persistent
 * TMA and producer forms), a [1090, 24], b [24, 136]: 9 or 18 rows of
 * tiles (5 of 256) and 1-9 columns, so the grouped order's bands of 8
 * rows end in a shorter one (1 or 2 rows); three SMs, each persistent block walking
 * tiles of several bands; every configuration the sweep takes checked in
 * the checking host mode against float64 (a tile left out, or written
 * twice, fails). */
static void ref_gemm_bands(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *a = in->data[m->g->inputs[0]], *b = in->data[m->g->inputs[1]];

	for (int i = 0; i < 1090; i++)
		for (int j = 0; j < 136; j++) {
			double acc = 0;

			for (int k = 0; k < 24; k++)
				acc += (double)a[i * 24 + k] * b[k * 136 + j];
			want[0][i * 136 + j] = half_round(AP_DT_F16, acc);
		}
}

START_TEST(gemm_tile_bands)
{
	ap_graph *g = ap_graph_new("gemm_bands");
	int a, b, y;
	lcase lc = {"gemm_bands_f16", "gemm", {"mma.sync"}, {"mma.sync.aligned.m16n8k16"}};
	case_opts o = {"sm_90a", false, 4e-3, true};
	ap_target_info ti;
	ap_lower_options lo = {256, NULL, true};
	ap_kir_kernel *k;
	ap_error err;
	ap_mgraph *m;
	char *cuda;

	g_dt = AP_DT_F16;
	a = tensor(g, "a", DIMS(1090, 24), AP_TENSOR_INPUT);
	b = tensor(g, "b", DIMS(24, 136), AP_TENSOR_INPUT);
	y = tensor(g, "y", DIMS(1090, 136), AP_TENSOR_VALUE);
	g_dt = AP_DT_F32;
	node(g, "mm", AP_OP_MATMUL, LIST(a, b), LIST(y));
	output(g, y);
	m = whole(g, AP_GROUP_MATMUL);
	g_unvalidated = true;
	g_sms = 3;
	g_opts = &o;
	run_case(&lc, m, ref_gemm_bands);
	g_opts = NULL;
	g_unvalidated = false;
	g_sms = 0;
	/* the default kernel of such a request walks the bands */
	ck_assert_int_eq(ap_cost_target("sm_90a", &ti), 0);
	ti.unvalidated = ti.tma = true;
	k = ap_lower_mgraph(m, &ti, "gemm_bands", &lo, NULL, &err);
	ck_assert_msg(k != NULL, "%s", err.msg);
	cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
	ck_assert_ptr_nonnull(cuda);
	if (getenv("CHECK_LOWER_DUMP"))
		fputs(cuda, stdout);
	ck_assert_msg(strstr(cuda, "band_r") && strstr(cuda, "cp.async.bulk.tensor.2d"),
		      "no grouped tile order in the TMA form:\n%.3000s", cuda);
	free(cuda);
	ap_kir_kernel_free(k);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* y = relu(a @ b + bias) in float16 and bfloat16 on sm_90a, warp
 * specialised (tma=2, asked for with --unvalidated): a [150, 136], b
 * [136, 296] -- M, N and K none a multiple of the tile (zero-filled
 * boxes) -- a producer warpgroup filling the stages by TMA, the
 * consumer warpgroups each their own coroutine on the host; every
 * configuration the sweep takes (tma=2 and the phase form tma=1) checked
 * in the checking host mode against float64 on one SM (each persistent
 * block walks several tiles, the ring's phases carried across them).
 * The default kernel: ROLES printed as an if / else chain, HGMMA and the
 * TMA load in its cubin's PTX, no spills. */
static void ref_gemm_ws(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *a = in->data[m->g->inputs[0]], *b = in->data[m->g->inputs[1]], *bias = in->data[m->g->inputs[2]];
	ap_dtype dt = m->g->tensors[m->g->outputs[0]].dtype;

	for (int i = 0; i < 150; i++)
		for (int j = 0; j < 296; j++) {
			double acc = 0, y;

			for (int k = 0; k < 136; k++)
				acc += (double)a[i * 136 + k] * b[k * 296 + j];
			y = (double)half_round(dt, acc) + bias[j];
			want[0][i * 296 + j] = half_round(dt, y > 0 ? y : 0);
		}
}

START_TEST(gemm_ws)
{
	for (int pass = 0; pass < 2; pass++) {
		ap_dtype dt = pass ? AP_DT_BF16 : AP_DT_F16;
		ap_graph *g = ap_graph_new("gemm_ws");
		int a, b, bias, y, z, r;
		lcase lc = {pass ? "gemm_ws_bf16" : "gemm_ws_f16", "gemm", {"mma.sync"}, {"mma.sync.aligned.m16n8k16"}};
		case_opts o = {"sm_90a", false, pass ? 2e-2 : 4e-3, true};
		ap_target_info ti;
		ap_lower_options lo = {256, NULL, true};
		ap_ptxas_stats st;
		ap_kir_kernel *k;
		ap_error err;
		ap_mgraph *m;
		char *cuda;

		g_dt = dt;
		a = tensor(g, "a", DIMS(150, 136), AP_TENSOR_INPUT);
		b = tensor(g, "b", DIMS(136, 296), AP_TENSOR_INPUT);
		bias = tensor(g, "bias", DIMS(296), AP_TENSOR_INPUT);
		y = tensor(g, "y", DIMS(150, 296), AP_TENSOR_VALUE);
		z = tensor(g, "z", DIMS(150, 296), AP_TENSOR_VALUE);
		r = tensor(g, "r", DIMS(150, 296), AP_TENSOR_VALUE);
		g_dt = AP_DT_F32;
		node(g, "mm", AP_OP_MATMUL, LIST(a, b), LIST(y));
		node(g, "add", AP_OP_ADD, LIST(y, bias), LIST(z));
		node(g, "relu", AP_OP_RELU, LIST(z), LIST(r));
		output(g, r);
		m = whole(g, AP_GROUP_MATMUL);
		g_unvalidated = true;
		g_sms = 1;
		g_opts = &o;
		run_case(&lc, m, ref_gemm_ws);
		g_opts = NULL;
		g_unvalidated = false;
		g_sms = 0;
		ck_assert_int_eq(ap_cost_target("sm_90a", &ti), 0);
		ti.unvalidated = ti.tma = true;
		k = ap_lower_mgraph(m, &ti, "gemm_ws", &lo, NULL, &err);
		ck_assert_msg(k != NULL, "%s", err.msg);
		cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
		ck_assert_ptr_nonnull(cuda);
		if (getenv("CHECK_LOWER_DUMP"))   /* the sm_90a kernel, for reading */
			fputs(cuda, stdout);
		ck_assert_msg(strstr(cuda, "if (ap_role_t >= 256u && ap_role_t < 384u)") &&
			      strstr(cuda, "cp.async.bulk.tensor.2d") && strstr(cuda, "wgmma.mma_async"),
			      "not the warp-specialised form:\n%.3000s", cuda);
		if (ap_nvrtc_load(&err) == 0) {
			ck_assert_msg(ap_nvrtc_ptxas_stats(cuda, "gemm_ws", "sm_90a", &st, &err) == 0, "%s", err.msg);
			ck_assert_msg(st.spill_store_bytes == 0 && st.spill_load_bytes == 0, "spills %d / %d bytes",
				      st.spill_store_bytes, st.spill_load_bytes);
			ck_assert_msg(!st.wgmma_serialized, "ptxas serialised the wgmma (C7520)");
			printf("check_lower: %s on sm_90a (tma=2): %d registers, no spills\n", lc.name, st.registers);
		}
		free(cuda);
		ap_kir_kernel_free(k);
		ap_mgraph_free(m);
		ap_graph_free(g);
	}
}
END_TEST

/* y = a b + bias, a [20, 24], b [24, 30], split along the columns into
 * parts of 8, 12 and 10 (a projection into Q, K and V, as a transformer's
 * in-projection writes them), the second through a ReLU; and z = c * c, a
 * sibling of y's shape that does not read the product, which the GEMM's
 * epilogue stores beside it. */
static void ref_gemm_split(const ap_mgraph *m, const buffers *in, double **want)
{
	const float *a = in->data[m->g->inputs[0]], *b = in->data[m->g->inputs[1]];
	const float *bias = in->data[m->g->inputs[2]], *cc = in->data[m->g->inputs[3]];
	static const int start[3] = {0, 8, 20}, len[3] = {8, 12, 10};

	for (int i = 0; i < 20; i++)
		for (int j = 0; j < 30; j++) {
			double acc = 0;
			float y;
			int part = j < 8 ? 0 : j < 20 ? 1 : 2;

			for (int k = 0; k < 24; k++)
				acc += (double)a[i * 24 + k] * b[k * 30 + j];
			y = (float)acc + bias[j];
			if (part == 1 && y < 0)
				y = 0;
			want[part][i * len[part] + j - start[part]] = y;
			want[3][i * 30 + j] = (double)cc[i * 30 + j] * cc[i * 30 + j];
		}
}

START_TEST(gemm_split_epilogue)
{
	ap_graph *g = ap_graph_new("qkv");
	int a = tensor(g, "a", DIMS(20, 24), AP_TENSOR_INPUT), b = tensor(g, "b", DIMS(24, 30), AP_TENSOR_INPUT);
	int bias = tensor(g, "bias", DIMS(30), AP_TENSOR_INPUT), cc = tensor(g, "c", DIMS(20, 30), AP_TENSOR_INPUT);
	int mm = tensor(g, "mm", DIMS(20, 30), AP_TENSOR_VALUE), y = tensor(g, "y", DIMS(20, 30), AP_TENSOR_VALUE);
	int q = tensor(g, "q", DIMS(20, 8), AP_TENSOR_VALUE), k = tensor(g, "k", DIMS(20, 12), AP_TENSOR_VALUE);
	int v = tensor(g, "v", DIMS(20, 10), AP_TENSOR_VALUE), kr = tensor(g, "kr", DIMS(20, 12), AP_TENSOR_VALUE);
	int z = tensor(g, "z", DIMS(20, 30), AP_TENSOR_VALUE);
	lcase lc = {"gemm_split_epilogue", "gemm", {"__syncthreads"}, {"ld.shared.f32"}};
	ap_mgraph *m;
	int n;

	node(g, "mm", AP_OP_MATMUL, LIST(a, b), LIST(mm));
	node(g, "bias", AP_OP_ADD, LIST(mm, bias), LIST(y));
	n = node(g, "split", AP_OP_SPLIT, LIST(y), LIST(q, k, v));
	ap_node_set_int(g, n, "axis", 1);
	node(g, "relu", AP_OP_RELU, LIST(k), LIST(kr));
	node(g, "square", AP_OP_MUL, LIST(cc, cc), LIST(z));
	output(g, q);
	output(g, kr);
	output(g, v);
	output(g, z);
	m = whole(g, AP_GROUP_MATMUL);
	run_case(&lc, m, ref_gemm_split);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* ---- attention ---------------------------------------------------------------------- */

/* An attention case: O = softmax(Q K^T / 4 + mask) V over B x H heads,
 * written as O^T [B, Nq, H, Dv] (an epilogue transpose); with `stats`
 * the scores S, the row maxima and sums are outputs too (a training
 * step's backward reads them). */
typedef struct att_case {
	const char *name;
	ap_dtype dt;
	int64_t B, H, Nq, Nk, D, Dv;
	bool stats;
	const char *target;              /* configurations run for it (host-emulated) */
	double rtol;
	int fp32;                        /* 1: the scores and the softmax in float32, P Cast to dt
					    for P V (Attention's fp32_scores, expand.c); 2: the
					    same without the mask -- S = Y1 / 4, the scale folded
					    into the exponent (attention.c scale_fold) -- and with
					    stats the maxima and sums alone; 3: as 2 with a causal
					    mask (key j > row i: -inf, expand.c's causal_cond),
					    each query tile's key loop stopped at its diagonal; 4:
					    as 1 (the mask added) with the causal mask after it,
					    the scale not folded */
} att_case;

static const att_case *g_ac;
static int64_t g_kv_heads;           /* > 0: K and V inputs [B, g_kv_heads, 1, N, D] expanded and
					reshaped to H heads (grouped-query attention) */

/* Operand x's (K or V) element (b, h, j, e) of width w: with grouped
 * heads, head h reads its group's. */
static int64_t kv_at(const att_case *c, int64_t b, int64_t h, int64_t j, int64_t e, int64_t w)
{
	int64_t kh = g_kv_heads ? g_kv_heads : c->H, hh = g_kv_heads ? h / (c->H / g_kv_heads) : h;

	return ((b * kh + hh) * c->Nk + j) * w + e;
}

/* The unfused graph's numbers: Y1, the scale and the mask each rounded to
 * the operand type (the kernel rounds there too) unless the case's scores
 * are float32, the softmax and PV exact. */
static void ref_attention(const ap_mgraph *m, const buffers *in, double **want)
{
	const att_case *c = g_ac;
	const float *q = in->data[m->g->inputs[0]], *kk = in->data[m->g->inputs[1]];
	const float *v = in->data[m->g->inputs[2]];
	const float *mask = m->g->n_inputs > 3 ? in->data[m->g->inputs[3]] : NULL;
	double *sc = malloc((size_t)c->Nk * sizeof(double));

	for (int64_t b = 0; b < c->B; b++)
		for (int64_t h = 0; h < c->H; h++)
			for (int64_t i = 0; i < c->Nq; i++) {
				int64_t bh = b * c->H + h, srow = (bh * c->Nq + i) * c->Nk;
				double mx = -INFINITY, sum = 0;

				for (int64_t j = 0; j < c->Nk; j++) {
					double d = 0;

					for (int64_t e = 0; e < c->D; e++)
						d += (double)q[(bh * c->Nq + i) * c->D + e] * kk[kv_at(c, b, h, j, e, c->D)];
					if (c->fp32) {
						sc[j] = c->fp32 >= 3 && j > i ? -INFINITY
							: d / 4.0 + (mask ? mask[i * c->Nk + j] : 0);
					} else {
						d = half_round(c->dt, (float)d);
						d = half_round(c->dt, (float)d / 4.0f);
						sc[j] = half_round(c->dt, (float)d + mask[i * c->Nk + j]);
					}
					if (sc[j] > mx)
						mx = sc[j];
				}
				for (int64_t j = 0; j < c->Nk; j++)
					sum += exp(sc[j] - mx);
				for (int64_t dv = 0; dv < c->Dv; dv++) {
					double o = 0;

					for (int64_t j = 0; j < c->Nk; j++)
						o += exp(sc[j] - mx) / sum * v[kv_at(c, b, h, j, dv, c->Dv)];
					want[0][((b * c->Nq + i) * c->H + h) * c->Dv + dv] = o;
				}
				if (c->stats && (c->fp32 == 2 || c->fp32 == 3)) {
					want[1][bh * c->Nq + i] = mx;
					want[2][bh * c->Nq + i] = sum;
				} else if (c->stats) {
					for (int64_t j = 0; j < c->Nk; j++)
						want[1][srow + j] = sc[j];
					want[2][bh * c->Nq + i] = mx;
					want[3][bh * c->Nq + i] = sum;
				}
			}
	free(sc);
}

/* Row 0 of the mask takes the first 32 keys away (whole key tiles of 16
 * and 32: the online softmax starts from rows of -inf). */
static void mask_first_tile(const ap_mgraph *m, buffers *b)
{
	float *mask = m->g->n_inputs > 3 ? b->data[m->g->inputs[3]] : NULL;

	for (int j = 0; mask && j < 32; j++)
		mask[j] = -INFINITY;
}

/* Q scaled by 4 (scores up to about 40, where a float16 step is 1/32 and
 * a bfloat16 one 1/4) and mask_first_tile's row. */
static void large_scores(const ap_mgraph *m, buffers *b)
{
	float *q = b->data[m->g->inputs[0]];
	int64_t n = ap_tensor_numel(&m->g->tensors[m->g->inputs[0]]);

	for (int64_t i = 0; i < n; i++)
		q[i] *= 4;
	mask_first_tile(m, b);
}

static int scalar_dt(ap_graph *g, const char *name, float v)
{
	uint16_t h = g_dt == AP_DT_BF16 ? ap_kir_f32_to_bf16(v) : ap_kir_f32_to_f16(v);
	int t = is_half(g_dt) ? ap_graph_add_tensor(g, name, g_dt, 0, NULL, AP_TENSOR_CONST, &h, sizeof(h))
		: scalar(g, name, v);

	ck_assert_int_ge(t, 0);
	return t;
}

/* The attention pattern of case c, unfused: Y = softmax(Q K^T / 4 + mask) V
 * with Y transposed to [B, Nq, H, Dv] (and the scores, row maxima and row
 * sums as outputs with c->stats). */
static ap_graph *attention_graph(const att_case *c)
{
	ap_graph *g = ap_graph_new("att");
	int64_t B = c->B, H = c->H, Nq = c->Nq, Nk = c->Nk, D = c->D, Dv = c->Dv;
	int q, kk, v, mask, four, kt, y1, sc, s2, sm, mx, d, e, l, pr, pr16, o, ot, n;

	g_dt = c->dt;
	q = tensor(g, "q", DIMS(B, H, Nq, D), AP_TENSOR_INPUT);
	if (g_kv_heads) {   /* grouped-query: each K / V head expanded over its group (repeat_kv) */
		int64_t G = g_kv_heads, R = H / G;
		int ki = tensor(g, "k", DIMS(B, G, 1, Nk, D), AP_TENSOR_INPUT);
		int vi = tensor(g, "v", DIMS(B, G, 1, Nk, Dv), AP_TENSOR_INPUT);
		int ke = tensor(g, "ke", DIMS(B, G, R, Nk, D), AP_TENSOR_VALUE);
		int ve = tensor(g, "ve", DIMS(B, G, R, Nk, Dv), AP_TENSOR_VALUE);

		kk = tensor(g, "kr", DIMS(B, H, Nk, D), AP_TENSOR_VALUE);
		v = tensor(g, "vr", DIMS(B, H, Nk, Dv), AP_TENSOR_VALUE);
		node(g, "kexp", AP_OP_EXPAND, LIST(ki), LIST(ke));
		node(g, "vexp", AP_OP_EXPAND, LIST(vi), LIST(ve));
		node(g, "kres", AP_OP_RESHAPE, LIST(ke), LIST(kk));
		node(g, "vres", AP_OP_RESHAPE, LIST(ve), LIST(v));
	} else {
		kk = tensor(g, "k", DIMS(B, H, Nk, D), AP_TENSOR_INPUT);
		v = tensor(g, "v", DIMS(B, H, Nk, Dv), AP_TENSOR_INPUT);
	}
	kt = tensor(g, "kt", DIMS(B, H, D, Nk), AP_TENSOR_VALUE);
	/* P rounded to Q's type for P V (none for float32 Q) */
	pr16 = c->fp32 && c->dt != AP_DT_F32 ? tensor(g, "p16", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE) : -1;
	if (c->fp32)
		g_dt = AP_DT_F32;   /* the scores, the mask and the softmax */
	mask = c->fp32 < 2 || c->fp32 == 4 ? tensor(g, "mask", DIMS(Nq, Nk), AP_TENSOR_INPUT) : -1;
	four = scalar_dt(g, "four", 4.0f);
	y1 = tensor(g, "y1", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE);
	sc = tensor(g, "sc", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE);
	s2 = mask >= 0 || c->fp32 == 3 ? tensor(g, "s2", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE) : sc;
	sm = c->fp32 == 4 ? tensor(g, "sm", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE) : s2;   /* the masked scores */
	mx = tensor(g, "mx", DIMS(B, H, Nq, 1), AP_TENSOR_VALUE);
	d = tensor(g, "d", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE);
	e = tensor(g, "e", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE);
	l = tensor(g, "l", DIMS(B, H, Nq, 1), AP_TENSOR_VALUE);
	pr = tensor(g, "p", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE);
	g_dt = c->dt;
	o = tensor(g, "o", DIMS(B, H, Nq, Dv), AP_TENSOR_VALUE);
	ot = tensor(g, "ot", DIMS(B, Nq, H, Dv), AP_TENSOR_VALUE);
	g_dt = AP_DT_F32;
	n = node(g, "kt", AP_OP_TRANSPOSE, LIST(kk), LIST(kt));
	ap_node_set_ints(g, n, "perm", (const int64_t[]){0, 1, 3, 2}, 4);
	node(g, "qk", AP_OP_MATMUL, LIST(q, kt), LIST(y1));
	node(g, "scale", AP_OP_DIV, LIST(y1, four), LIST(sc));
	if (mask >= 0)
		node(g, "mask", AP_OP_ADD, LIST(sc, mask), LIST(sm));
	if (c->fp32 >= 3) {   /* Where(Cast(Trilu(Expand(1), lower, k = 0)), sc, -inf) */
		int one = scalar(g, "one", 1.0f), ninf = scalar(g, "ninf", -INFINITY);
		int ex = tensor(g, "ones", DIMS(Nq, Nk), AP_TENSOR_VALUE), tri = tensor(g, "tri", DIMS(Nq, Nk), AP_TENSOR_VALUE);
		int cond;

		g_dt = AP_DT_BOOL;
		cond = tensor(g, "causal", DIMS(Nq, Nk), AP_TENSOR_VALUE);
		g_dt = AP_DT_F32;
		node(g, "ones", AP_OP_EXPAND, LIST(one), LIST(ex));
		n = node(g, "tri", AP_OP_TRILU, LIST(ex), LIST(tri));
		ap_node_set_int(g, n, "upper", 0);
		ap_node_set_int(g, n, "k", 0);
		n = node(g, "causal", AP_OP_CAST, LIST(tri), LIST(cond));
		ap_node_set_int(g, n, "to", AP_DT_BOOL);
		node(g, "where", AP_OP_WHERE, LIST(cond, sm == s2 ? sc : sm, ninf), LIST(s2));
	}
	n = node(g, "max", AP_OP_REDUCE_MAX, LIST(s2), LIST(mx));
	reduce_axes(g, n, (const int64_t[]){3}, 1, 1);
	node(g, "sub", AP_OP_SUB, LIST(s2, mx), LIST(d));
	node(g, "exp", AP_OP_EXP, LIST(d), LIST(e));
	n = node(g, "sum", AP_OP_REDUCE_SUM, LIST(e), LIST(l));
	reduce_axes(g, n, (const int64_t[]){3}, 1, 1);
	node(g, "div", AP_OP_DIV, LIST(e, l), LIST(pr));
	if (pr16 >= 0) {
		n = node(g, "p16", AP_OP_CAST, LIST(pr), LIST(pr16));
		ap_node_set_int(g, n, "to", c->dt);
		pr = pr16;
	}
	node(g, "pv", AP_OP_MATMUL, LIST(pr, v), LIST(o));
	n = node(g, "tr", AP_OP_TRANSPOSE, LIST(o), LIST(ot));
	ap_node_set_ints(g, n, "perm", (const int64_t[]){0, 2, 1, 3}, 4);
	output(g, ot);
	if (c->stats) {
		if (c->fp32 < 2 || c->fp32 == 4)
			output(g, s2);
		output(g, mx);
		output(g, l);
	}
	return g;
}

static void run_attention_case(const att_case *c, const lcase *lc)
{
	ap_graph *g = attention_graph(c);
	case_opts opts = {c->target, c->dt == AP_DT_F32 && c->target != NULL, c->rtol, c->target != NULL};   /* float32 on a GPU: TF32; checked */
	ap_mgraph *m = whole(g, AP_GROUP_ATTENTION);

	g_ac = c;
	g_fill = c->fp32 ? large_scores : mask_first_tile;
	run_case_with(lc, g, m, ref_attention, &opts, c->target != NULL);
	g_fill = NULL;
}

/* float32 on the host: the SIMT form (a query row a warp). */
START_TEST(attention_online_softmax)
{
	static const att_case c = {"attention_online_softmax", AP_DT_F32, 2, 3, 37, 45, 16, 12, false, NULL, 0, false};
	lcase lc = {c.name, "attention", {"__shfl_xor_sync", "__syncthreads"}, {"shfl.sync.bfly"}};

	run_attention_case(&c, &lc);
}
END_TEST

/* float16 and bfloat16 on sm_90: the tensor-core form, every
 * configuration run on the host through the emulated ldmatrix and
 * mma.sync.  Head dims that are not multiples of the mma shapes (12, 24,
 * 20: padded with zeros), query and key counts that no tile divides, a
 * row whose first 32 keys are masked out; the bfloat16 case also writes
 * the scores and the row statistics.  Tolerances: half the operand
 * type's epsilon for float16 (4e-3), bfloat16's 2e-2 (P is rounded to
 * the operand type before PV, unnormalised). */
START_TEST(attention_tensor_cores)
{
	static const att_case f16 = {"attention_tc_f16", AP_DT_F16, 2, 3, 37, 45, 16, 12, false, "sm_90", 4e-3, false};
	static const att_case bf16 = {"attention_tc_bf16_stats", AP_DT_BF16, 2, 3, 37, 45, 24, 20, true, "sm_90", 2e-2, false};
	lcase l1 = {f16.name, "attention", {"mma.sync", "ldmatrix"}, {"mma.sync.aligned.m16n8k16", "ldmatrix.sync.aligned.m8n8.x2.trans"}};
	lcase l2 = {bf16.name, "attention", {"mma.sync", "ldmatrix"}, {"mma.sync.aligned.m16n8k16.row.col.f32.bf16"}};

	run_attention_case(&f16, &l1);
	run_attention_case(&bf16, &l2);
}
END_TEST

/* float16 and bfloat16 on sm_90a: the tensor-core form on wgmma (4 and 8
 * warps: one and two warpgroups of 64 query rows; fewer warps stay on
 * mma.sync), S = Q K^T from the shared Q and K tiles, O += P V with P
 * from registers; every configuration run on the host in the checking
 * mode (the async-proxy fences, the wgmma waits); the same shapes and
 * tolerances as on sm_90.  The default kernel's CUDA holds wgmma and its
 * PTX for sm_90a too, without spills. */
START_TEST(attention_wgmma)
{
	static const att_case f16 = {"attention_wg_f16", AP_DT_F16, 2, 3, 37, 45, 16, 12, false, "sm_90a", 4e-3, false};
	static const att_case bf16 = {"attention_wg_bf16_stats", AP_DT_BF16, 2, 3, 37, 45, 24, 20, true, "sm_90a", 2e-2, false};
	lcase l1 = {f16.name, "attention", {"mma.sync", "ldmatrix"}, {"mma.sync.aligned.m16n8k16"}};
	lcase l2 = {bf16.name, "attention", {"mma.sync", "ldmatrix"}, {"mma.sync.aligned.m16n8k16.row.col.f32.bf16"}};

	run_attention_case(&f16, &l1);
	run_attention_case(&bf16, &l2);
}
END_TEST

/* Query and key counts the tiles divide (128 queries, 256 keys, head dim
 * 64): the tensor-core forms leave out the key mask and the staging's row
 * tests, and stage K, V and Q with addresses computed once a tile
 * (ap__att_stage_rows' whole passes) -- on sm_90a (wgmma, swizzled
 * tiles) and sm_90 (mma.sync, padded rows), the sampled configurations in
 * the checking host mode against float64, a row's first 32 keys masked
 * (the all -inf start of the online softmax). */
START_TEST(attention_whole_tiles)
{
	static const att_case wg = {"attention_wg_whole_f16", AP_DT_F16, 1, 2, 128, 256, 64, 64, false, "sm_90a", 4e-3, false};
	static const att_case tc = {"attention_tc_whole_bf16", AP_DT_BF16, 1, 2, 128, 256, 64, 64, true, "sm_90", 2e-2, false};
	lcase l1 = {wg.name, "attention", {"wgmma.mma_async", "ex2.approx.ftz.f32"},
		    {"wgmma.mma_async.sync.aligned", "ex2.approx.ftz.f32"}};
	lcase l2 = {tc.name, "attention", {"mma.sync", "ex2.approx.ftz.f32"},
		    {"mma.sync.aligned.m16n8k16.row.col.f32.bf16", "ex2.approx.ftz.f32"}};

	g_golden_target = "sm_90a";   /* the default kernel printed for the wgmma target */
	run_attention_case(&wg, &l1);
	g_golden_target = NULL;
	run_attention_case(&tc, &l2);
}
END_TEST

/* Attention's fp32_scores (expand.c): the first product float32 over
 * 16-bit Q and K, the scale, the mask and the softmax float32, P Cast to
 * the operand type for P V -- FlashAttention's numbers.  Scores up to
 * about 40 (large_scores), against float64 of the unrounded scores at
 * tolerances a kernel that rounds the scores to the operand type misses
 * (tried: against a reference that rounds them, the sm_90a case gives
 * 0.6465 for 0.6525, sm_90's bfloat16 0.3203 for 0.2962, the host
 * 0.1730 for 0.1697): the wgmma form (sm_90a, whole tiles), mma.sync
 * (sm_90, bfloat16, padded head dims, the statistics written), the
 * SIMT form on the host. */
START_TEST(attention_fp32_scores)
{
	static const att_case wg = {"attention_wg_fp32_scores_f16", AP_DT_F16, 1, 2, 128, 256, 64, 64, false, "sm_90a",
				    2e-3, true};
	static const att_case tc = {"attention_tc_fp32_scores_bf16", AP_DT_BF16, 1, 2, 37, 45, 24, 20, true, "sm_90",
				    1e-2, true};
	static const att_case host = {"attention_fp32_scores_f16", AP_DT_F16, 1, 2, 37, 45, 16, 12, false, NULL, 2e-3, true};
	lcase l1 = {wg.name, "attention", {"wgmma.mma_async", "ex2.approx.ftz.f32"}, {"wgmma.mma_async.sync.aligned"}};
	lcase l2 = {tc.name, "attention", {"mma.sync", "ldmatrix"}, {"mma.sync.aligned.m16n8k16.row.col.f32.bf16"}};
	lcase l3 = {host.name, "attention", {"__shfl_xor_sync", "__syncthreads"}, {"shfl.sync.bfly"}};
	g_golden_target = "sm_90a";
	run_attention_case(&wg, &l1);
	g_golden_target = NULL;
	run_attention_case(&tc, &l2);
	run_attention_case(&host, &l3);
}
END_TEST

/* The softmax scale folded into the exponent (attention.c scale_fold:
 * S = Y1 / 4 in float32, no mask, S not written): the tensor-core forms
 * keep Y1's row maxima and compute exp2(Y1 log2(e) / 4 - max log2(e) /
 * 4: log2(e) / 4 a literal in the CUDA), the row maxima written scaled
 * (the statistics) -- on sm_90a (wgmma,
 * whole tiles, float16) and sm_90 (mma.sync, bfloat16, 45 keys: the last
 * tile's keys past the end set to -inf), every sampled configuration in
 * the checking host mode against float64 of the unrounded scores, Y and
 * the maxima and sums. */
START_TEST(attention_scale_fold)
{
	static const att_case wg = {"attention_wg_fold_f16", AP_DT_F16, 1, 2, 128, 256, 64, 64, true, "sm_90a", 2e-3, 2};
	static const att_case tc = {"attention_tc_fold_bf16", AP_DT_BF16, 1, 2, 37, 45, 24, 20, true, "sm_90", 1e-2, 2};
	lcase l1 = {wg.name, "attention", {"wgmma.mma_async", "0x1.715476p-2f"}, {"wgmma.mma_async.sync.aligned"}};
	lcase l2 = {tc.name, "attention", {"mma.sync", "0x1.715476p-2f"}, {"mma.sync.aligned.m16n8k16.row.col.f32.bf16"}};

	g_golden_target = "sm_90a";
	run_attention_case(&wg, &l1);
	g_golden_target = NULL;
	run_attention_case(&tc, &l2);
}
END_TEST

/* A causal mask (Where(Cast(Trilu(Expand(1), lower)), S, -inf), as
 * expand.c opens Attention's is_causal): the tensor-core forms stop each
 * query tile's key loop after the tile holding its last row's diagonal
 * (attention_tc.c tile_bound) -- on sm_90a (wgmma, 128 queries, 256
 * keys, head dim 64: 64-key tiles past the first query tile's diagonal
 * never visited) and sm_90 (mma.sync, bfloat16, 70 queries and 150 keys:
 * query tiles whose bound falls inside and at the end of the keys, the
 * last tile partial; and float16 with an additive mask before the causal
 * one, whose tiles below the diagonal take the masked scores without the
 * causal test; and float32 on the host, the SIMT form, its blocks of
 * R rows bounded by their last row), every sampled configuration in the
 * checking host mode against float64, Y and the row maxima and sums.  The scale is folded
 * where no additive mask comes between (attention.c scale_fold): tiles
 * below the diagonal then do nothing to their products. */
START_TEST(attention_causal)
{
	static const att_case wg = {"attention_wg_causal_f16", AP_DT_F16, 1, 2, 128, 256, 64, 64, true, "sm_90a", 2e-3, 3};
	static const att_case tc = {"attention_tc_causal_bf16", AP_DT_BF16, 1, 2, 70, 150, 24, 20, true, "sm_90", 1e-2, 3};
	static const att_case mk = {"attention_tc_causal_mask_f16", AP_DT_F16, 1, 2, 70, 150, 16, 12, false, "sm_90", 2e-3,
				    4};
	lcase l1 = {wg.name, "attention", {"wgmma.mma_async", "nt"}, {"wgmma.mma_async.sync.aligned"}};
	lcase l2 = {tc.name, "attention", {"mma.sync", "nt"}, {"mma.sync.aligned.m16n8k16.row.col.f32.bf16"}};
	lcase l3 = {mk.name, "attention", {"mma.sync", "nt"}, {"mma.sync.aligned.m16n8k16"}};
	/* float32 on the host: the SIMT form (R rows a block, 32 keys a
	 * tile) bounds its key loop by the block's last row the same way */
	static const att_case simt = {"attention_simt_causal", AP_DT_F32, 1, 2, 70, 150, 16, 12, true, NULL, 0, 3};
	lcase l4 = {simt.name, "attention", {"__shfl_xor_sync", "nkt"}, {"shfl.sync.bfly"}};

	run_attention_case(&simt, &l4);
	g_golden_target = "sm_90a";
	g_sms = 1;   /* one persistent block (tma, ws) through every query tile: the stages' phases
			carried across tiles of different key counts */
	run_attention_case(&wg, &l1);
	g_sms = 0;
	g_golden_target = NULL;
	run_attention_case(&tc, &l2);
	run_attention_case(&mk, &l3);
}
END_TEST

/* A test that runs every configuration of a form not yet run on a GPU
 * sets APOLLO_SWEEP to full -- unless the run asked for a stride of its
 * own (sample:K: make check-asan and check-fast, where every
 * configuration is still lowered and printed, and the sanitizers watch
 * the emitters, not the host kernels cc builds).  Returns the value to
 * put back (sweep_restore frees it). */
static char *sweep_full(void)
{
	const char *sw = getenv("APOLLO_SWEEP");
	char *saved = sw ? strdup(sw) : NULL;

	if (!sw || strncmp(sw, "sample:", 7))
		setenv("APOLLO_SWEEP", "full", 1);
	return saved;
}

static void sweep_restore(char *saved)
{
	if (saved)
		setenv("APOLLO_SWEEP", saved, 1);
	else
		unsetenv("APOLLO_SWEEP");
	free(saved);
}

/* The wgmma form's overlap (knob overlap=1, attention_tc.c ov_key_loop:
 * tile j's softmax beside tile j-1's O += P V): every configuration of
 * the space run in the checking host mode (APOLLO_SWEEP full here), 150
 * keys in 3 to 10 key tiles so that the stages alternate and the last
 * tile is partial, against float64; the CUDA of overlap=1 for sm_90a
 * without spills (expect_no_spills). */
START_TEST(attention_wgmma_overlap)
{
	static const att_case f16 = {"attention_wg_overlap_f16", AP_DT_F16, 1, 1, 70, 150, 16, 12, true, "sm_90a", 4e-3, false};
	lcase lc = {f16.name, "attention", {"mma.sync", "ldmatrix"}, {"mma.sync.aligned.m16n8k16"}};
	char *saved;

	saved = sweep_full();
	run_attention_case(&f16, &lc);
	sweep_restore(saved);
}
END_TEST

/* Q, K and V by TMA (knob tma=1, attention_tc.c tma_fill; tma=2 the same
 * warp specialised, emit_ws): head dims 128
 * and 32 (128- and 64-byte swizzles: two boxes a tile of Q and K, one of
 * V), Q, K and V [2, 3, 70 / 150, D] as 4-D tensor maps, every
 * configuration of the sm_90a space run in the checking host mode
 * against float64 -- both
 * forms (overlap 0 and 1), 150 keys in 3-10 tiles, the last tile's boxes
 * zero-filled past key 150 -- on a target of one SM, so that tma=1's
 * persistent grid (as many blocks as one SM holds) has blocks walking
 * two query tiles, carrying the stages' phases on; the CUDA of tma=1
 * compiles without spills and holds cp.async.bulk.tensor
 * (expect_no_spills).  The sweep holds tma=2 (overlap 0, whole
 * warpgroups): a producer warpgroup and the query warpgroups as
 * coroutines on the host, checked the same way; --unvalidated takes it.
 * Then grouped-query attention (K and V of one head expanded over three)
 * the same way. */
START_TEST(attention_wgmma_tma)
{
	static const att_case f16 = {"attention_wg_tma_f16", AP_DT_F16, 2, 3, 70, 150, 128, 32, false, "sm_90a", 4e-3, false};
	static const att_case gqa = {"attention_wg_tma_gqa_f16", AP_DT_F16, 2, 3, 70, 150, 64, 32, false, "sm_90a", 4e-3, false};
	lcase lc = {f16.name, "attention", {"mma.sync", "ldmatrix"}, {"mma.sync.aligned.m16n8k16"}};
	lcase lcg = {gqa.name, "attention", {"mma.sync", "ldmatrix"}, {"mma.sync.aligned.m16n8k16"}};
	char *saved;
	ap_graph *g = attention_graph(&f16);
	ap_mgraph *m = whole(g, AP_GROUP_ATTENTION);
	ap_target_info ti;

	ck_assert_int_eq(ap_cost_target("sm_90a", &ti), 0);
	ck_assert_msg(ap_test_space_has(m, &ti, "tma"), "no tma knob for K and V [2, 3, 150, 128 / 32]");
	{
		/* the forms not yet run on a GPU: warp specialised (tma=2), a
		 * producer warpgroup after the query warpgroups, Q's, K's and
		 * V's boxes on full / empty barriers */
		ap_lower_options lo = {256, NULL, true};
		ap_kir_kernel *k;
		ap_error err;
		char *cuda;

		ti.unvalidated = ti.tma = true;
		k = ap_lower_mgraph(m, &ti, "att_ws", &lo, NULL, &err);
		ck_assert_msg(k != NULL, "%s", err.msg);
		ck_assert_uint_eq(k->block[0], 256);
		cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
		ck_assert_ptr_nonnull(cuda);
		ck_assert_msg(strstr(cuda, "if (ap_role_t >= 128u && ap_role_t < 256u)") &&
			      strstr(cuda, "} else if (ap_role_t >= 0u && ap_role_t < 128u)") &&
			      strstr(cuda, "cp.async.bulk.tensor.4d") && !strstr(cuda, "__syncthreads();\n\t\tif"),
			      "not the warp-specialised attention:\n%.3000s", cuda);
		free(cuda);
		ap_kir_kernel_free(k);
		ti.unvalidated = ti.tma = false;
	}
	ap_mgraph_free(m);
	ap_graph_free(g);
	saved = sweep_full();
	g_sms = 1;
	run_attention_case(&f16, &lc);
	/* grouped-query: K and V [2, 1, 1, 150, D] expanded over the 3 heads
	 * (a stride-0 factor: no dimension of their maps) */
	g_kv_heads = 1;
	g = attention_graph(&gqa);
	m = whole(g, AP_GROUP_ATTENTION);
	ck_assert_msg(ap_test_space_has(m, &ti, "tma"), "no tma knob for grouped-query K and V");
	ap_mgraph_free(m);
	ap_graph_free(g);
	run_attention_case(&gqa, &lcg);
	g_kv_heads = 0;
	g_sms = 0;
	sweep_restore(saved);
}
END_TEST

/* Head dims past mma.sync's 128 on wgmma (sm_90a: Q read from shared
 * memory, one m64nDv accumulator, Dv up to 256): float16 at 256 (128-byte
 * swizzles, four TMA boxes a row of Q and K) and bfloat16 at 160 / 144
 * with the statistics (64- and 32-byte swizzles, padded head dims), 150
 * keys in several tiles, every configuration the sampled sweep runs checked
 * on the host against float64; the default kernel for sm_90a without
 * spills.  Without wgmma (sm_90) the attention emitter refuses them,
 * saying so. */
START_TEST(attention_wgmma_wide_heads)
{
	static const att_case f16 = {"attention_wg_d256_f16", AP_DT_F16, 1, 2, 70, 150, 256, 256, false, "sm_90a", 4e-3, false};
	static const att_case bf16 = {"attention_wg_d160_bf16_stats", AP_DT_BF16, 1, 2, 70, 150, 160, 144, true, "sm_90a",
				      2e-2, false};
	lcase l1 = {f16.name, "attention", {"wgmma"}, {"wgmma.mma_async"}};
	lcase l2 = {bf16.name, "attention", {"wgmma"}, {"wgmma.mma_async"}};
	ap_graph *g = attention_graph(&f16);
	ap_mgraph *m = whole(g, AP_GROUP_ATTENTION);
	ap_target_info ti;
	char why[256];

	ck_assert_int_eq(ap_cost_target("sm_90", &ti), 0);
	ck_assert_int_eq(ap_lower_attention_ok(m, &ti, why, sizeof(why)), 0);
	ck_assert_msg(strstr(why, "at most 128 in registers (256 on wgmma)"), "%s", why);
	ck_assert_int_eq(ap_cost_target("sm_90a", &ti), 0);
	ck_assert_int_eq(ap_lower_attention_ok(m, &ti, why, sizeof(why)), 1);
	ap_mgraph_free(m);
	ap_graph_free(g);
	g_golden_target = "sm_90a";
	run_attention_case(&f16, &l1);
	run_attention_case(&bf16, &l2);
	g_golden_target = NULL;
}
END_TEST

/* The attention forward warp specialised with a copying producer (knob
 * tma=3, attention_tc.c ws_produce): head dims 16 and 12 (V's tile
 * padded to 16, a 32-byte swizzle; no tensor map takes these operands),
 * the statistics written, every configuration of the --unvalidated space
 * (overlap 1; tma 3, and 0) run in the checking host mode on one SM --
 * persistent blocks walking several query tiles, the phases of Q's and
 * the K / V stages' barriers carried on -- against float64; the default
 * kernel is the copying producer's arm chain and compiles without spills
 * (expect_no_spills).  A release moved above the wait that completes
 * O += P V, Q's announcement before its copies' wait, or a stage refilled
 * without the empty wait each fail it (tried by hand). */
START_TEST(attention_ws_copies)
{
	static const att_case f16 = {"attention_ws_copy_f16", AP_DT_F16, 2, 3, 70, 150, 16, 12, true, "sm_90a", 4e-3, false};
	lcase lc = {f16.name, "attention", {"mma.sync", "ldmatrix"}, {"mma.sync.aligned.m16n8k16"}};
	char *saved;
	ap_graph *g = attention_graph(&f16);
	ap_mgraph *m = whole(g, AP_GROUP_ATTENTION);
	ap_lower_options lo = {256, NULL, true};
	ap_target_info ti;
	ap_kir_kernel *k;
	ap_error err;
	char *cuda;

	ck_assert_int_eq(ap_cost_target("sm_90a", &ti), 0);
	ti.unvalidated = ti.tma = true;
	k = ap_lower_mgraph(m, &ti, "att_ws_copy", &lo, NULL, &err);
	ck_assert_msg(k != NULL, "%s", err.msg);
	cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
	ck_assert_ptr_nonnull(cuda);
	ck_assert_msg(strstr(cuda, "copies Q, K and V") && strstr(cuda, "} else if (ap_role_t >= 0u && ap_role_t < 128u)") &&
		      strstr(cuda, "cp.async.wait_group 0") && !strstr(cuda, "cp.async.bulk"),
		      "not the copying producer's attention:\n%.3000s", cuda);
	free(cuda);
	ap_kir_kernel_free(k);
	ap_mgraph_free(m);
	ap_graph_free(g);
	saved = sweep_full();
	g_sms = 1;
	g_unvalidated = true;
	run_attention_case(&f16, &lc);
	g_unvalidated = false;
	g_sms = 0;
	sweep_restore(saved);
}
END_TEST

/* Expand as a view (view.c, sv_expand): grouped-query K [2, 1, 1, 5, 8]
 * expanded to [2, 1, 3, 5, 8], reshaped to [2, 3, 5, 8] (three heads
 * reading one) and transposed to K^T [2, 3, 8, 5]: a strided view of k
 * whose head factor has stride 0; every element of K^T at the offset of
 * k[b, 0, 0, n, d] (the test's own walk of the factors, as
 * ap_sview_offset splits an index); expanding the expanded view's other
 * unit dim gives it a stride-0 factor too. */
START_TEST(sview_expand)
{
	ap_graph *g = ap_graph_new("gqa_view");
	int k = tensor(g, "k", DIMS(2, 1, 1, 5, 8), AP_TENSOR_INPUT);
	int ke = tensor(g, "ke", DIMS(2, 1, 3, 5, 8), AP_TENSOR_VALUE);
	int kr = tensor(g, "kr", DIMS(2, 3, 5, 8), AP_TENSOR_VALUE);
	int kt = tensor(g, "kt", DIMS(2, 3, 8, 5), AP_TENSOR_VALUE);
	int ke2 = tensor(g, "ke2", DIMS(2, 2, 3, 5, 8), AP_TENSOR_VALUE);
	int n, leaf = -1;
	ap_sview sv;

	node(g, "expand", AP_OP_EXPAND, LIST(k), LIST(ke));
	node(g, "reshape", AP_OP_RESHAPE, LIST(ke), LIST(kr));
	n = node(g, "kt", AP_OP_TRANSPOSE, LIST(kr), LIST(kt));
	ap_node_set_ints(g, n, "perm", (const int64_t[]){0, 1, 3, 2}, 4);
	node(g, "expand2", AP_OP_EXPAND, LIST(ke), LIST(ke2));
	ck_assert(ap_sview_of(g, kt, &sv, &leaf));
	ck_assert_int_eq(leaf, k);
	ck_assert_int_eq(sv.rank, 4);
	for (int b = 0; b < 2; b++)
		for (int h = 0; h < 3; h++)
			for (int d = 0; d < 8; d++)
				for (int j = 0; j < 5; j++) {
					const int ix[4] = {b, h, d, j};
					int64_t off = sv.off;

					for (int x = 0; x < 4; x++) {
						int64_t inner = 1;

						for (int q = sv.first[x + 1] - 1; q >= sv.first[x]; q--) {
							int64_t c = ix[x] / inner;

							off += (q > sv.first[x] ? c % sv.fe[q] : c) * sv.fs[q];
							inner *= sv.fe[q];
						}
					}
					ck_assert_msg(off == (b * 5 + j) * 8 + d, "K^T[%d][%d][%d][%d] at %lld", b, h, d, j,
						      (long long)off);
				}
	ck_assert(ap_sview_of(g, ke2, &sv, &leaf));
	ck_assert_int_eq(sv.first[2] - sv.first[1], 1);
	ck_assert_int_eq(sv.fe[sv.first[1]], 2);
	ck_assert_int_eq(sv.fs[sv.first[1]], 0);
	ck_assert_int_eq(sv.fs[sv.first[2]], 0);
	ap_graph_free(g);
}
END_TEST

/* A tuning record written before the space had `overlap` (a late knob,
 * lower.h) still parses: without the knob it means overlap=0, the form
 * the kernels had before it; a record missing `keys` (not late) does not. */
START_TEST(attention_record_before_overlap)
{
	static const att_case f16 = {"attention_record", AP_DT_F16, 1, 1, 70, 150, 16, 12, true, "sm_90a", 4e-3, false};
	ap_graph *g = attention_graph(&f16);
	ap_mgraph *m = whole(g, AP_GROUP_ATTENTION);
	ap_target_info ti;
	ap_bound b;
	ap_space sp;
	ap_sched dflt, back;
	ap_error err;
	char text[2][256] = {"", ""}, *d, *save = NULL;
	int ov = -1, keys = -1;

	ck_assert_int_eq(ap_cost_target("sm_90a", &ti), 0);
	ck_assert_int_eq(ap_bind_first(m, &ti, &b, &err), 0);
	ck_assert_ptr_eq(b.em, &ap_emitter_attention);
	ck_assert_int_eq(ap_emitter_default(&b, &sp, &dflt, &err), 0);
	for (int i = 0; i < sp.n; i++) {
		ov = strcmp(sp.knobs[i].name, "overlap") ? ov : i;
		keys = strcmp(sp.knobs[i].name, "keys") ? keys : i;
	}
	ck_assert_int_ge(ov, 0);
	ck_assert_int_ge(keys, 0);
	ck_assert(sp.knobs[ov].late && !sp.knobs[keys].late);
	dflt.v[ov] = 1;   /* so that the missing knob's value is seen to come from the text's absence */
	ck_assert_ptr_nonnull(d = ap_sched_describe(&b, &dflt));
	/* text[0]: every knob but overlap; text[1]: but overlap and keys */
	for (char *tok = strtok_r(d, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
		for (int t = 0; t < 2; t++)
			if (strncmp(tok, "overlap=", 8) && (t == 0 || strncmp(tok, "keys=", 5)))
				snprintf(text[t] + strlen(text[t]), sizeof(text[t]) - strlen(text[t]), "%s%s",
					 *text[t] ? " " : "", tok);
	free(d);
	ck_assert_msg(!strstr(text[0], "overlap") && strstr(text[0], "keys="), "%s", text[0]);
	ck_assert_int_eq(ap_sched_parse(&b, text[0], &back), 1);
	for (int i = 0; i < sp.n; i++)
		ck_assert_int_eq(back.v[i], i == ov ? 0 : dflt.v[i]);
	ck_assert_msg(!strstr(text[1], "keys="), "%s", text[1]);
	ck_assert_int_eq(ap_sched_parse(&b, text[1], &back), 0);
	ap_unbind(&b);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* A request asking for the forms not yet run on a GPU (--unvalidated,
 * ap_target_info.unvalidated): the default rule takes overlap=1 and the
 * cost model prices it; without the request overlap=1 has no time
 * (INFINITY, `unvalidated`) and the default keeps 0.  The two requests'
 * tuning signatures differ (records of one never serve the other). */
START_TEST(attention_overlap_unvalidated)
{
	static const att_case f16 = {"attention_unvalidated", AP_DT_F16, 1, 1, 70, 150, 16, 12, true, "sm_90a", 4e-3, false};
	ap_graph *g = attention_graph(&f16);
	ap_mgraph *m = whole(g, AP_GROUP_ATTENTION);
	uint8_t sig[2][32];

	for (int asked = 0; asked < 2; asked++) {
		ap_target_info ti;
		ap_bound b;
		ap_space sp;
		ap_sched dflt, ov1;
		ap_plan pl;
		ap_traffic tr;
		ap_error err;
		int ov = 2;

		ck_assert_int_eq(ap_cost_target("sm_90a", &ti), 0);
		ti.unvalidated = ti.tma = asked;
		ck_assert_int_eq(ap_bind_first(m, &ti, &b, &err), 0);
		ck_assert_int_eq(ap_emitter_default(&b, &sp, &dflt, &err), 0);
		/* and tma: K and V here are no tensor maps, the space holds 0
		 * and the copying producer (3), taken when asked */
		ck_assert_int_eq(sp.n, 4);
		ck_assert_str_eq(sp.knobs[ov].name, "overlap");
		ck_assert_int_eq(dflt.v[ov], asked);
		ck_assert_str_eq(sp.knobs[3].name, "tma");
		ck_assert_int_eq(sp.knobs[3].n, 2);
		ck_assert_int_eq(dflt.v[3], asked ? 3 : 0);
		ov1 = dflt;
		ov1.v[ov] = 1;
		ck_assert_int_eq(b.em->resolve(&b, &ov1, &pl), 1);
		ck_assert_int_eq(b.em->traffic(&b, &pl, &tr), 0);
		ck_assert_int_eq(tr.unvalidated, !asked);
		ck_assert_int_eq(isinf(ap_cost_schedule_us(&tr, &ti)) != 0, !asked);
		ck_assert_int_eq(ap_tune_signature(b.em, m, "sm_90a", &ti, 0, sig[asked]), 0);
		ap_unbind(&b);
	}
	ck_assert_int_ne(memcmp(sig[0], sig[1], 32), 0);
	ap_mgraph_free(m);
	ap_graph_free(g);
}
END_TEST

/* float32 with allow_tf32 on sm_90: the tensor-core form on TF32 mma.sync
 * m16n8k8 (Q and K by 32-bit ldmatrix, V one element a lane, P moved from
 * the C to the A layout by shuffles), every configuration run on the host;
 * head dims 20 and 12 (padded to 24 and 16), with the statistics.
 * Tolerance 1e-2: Q, K, V and P rounded to TF32's 10-bit mantissa. */
START_TEST(attention_tensor_cores_tf32)
{
	static const att_case tf = {"attention_tc_tf32_stats", AP_DT_F32, 2, 3, 37, 45, 20, 12, true, "sm_90", 1e-2, false};
	lcase lc = {tf.name, "attention", {"mma.sync", "ldmatrix"}, {"mma.sync.aligned.m16n8k8.row.col.f32.tf32", "shfl.sync.idx"}};

	run_attention_case(&tf, &lc);
}
END_TEST

/* ---- the attention backward -------------------------------------------------------------- */

/* An AttentionGrad case: B x H query heads on Hk key/value heads, L
 * queries, S keys, head dims E and Ev, `scale`, causal or not, an
 * additive [L, S] mask or none; Y and the log-sum-exp are inputs like the
 * rest (ag_fill makes them the forward's), P_ij = exp(s_ij - lse_i),
 * D_i = dY_i . Y_i. */
typedef struct ag_case {
	const char *name;
	ap_dtype dt;
	int B, H, Hk, L, S, E, Ev;
	double scale;
	bool causal, mask;
	const char *target;              /* configurations run for it (host-emulated); NULL: cpu */
	double rtol;
} ag_case;

static const ag_case *g_agc;

/* FlashAttention-2's gradients (attention_grad.c's comment) in float64,
 * straight from the definition: dQ, dK, dV. */
static void ref_attention_grad(const ap_mgraph *m, const buffers *in, double **want)
{
	const ag_case *c = g_agc;
	const float *dy = in->data[m->g->inputs[0]], *q = in->data[m->g->inputs[1]];
	const float *kk = in->data[m->g->inputs[2]], *v = in->data[m->g->inputs[3]];
	const float *y = in->data[m->g->inputs[4]], *lse = in->data[m->g->inputs[5]];
	const float *mask = c->mask ? in->data[m->g->inputs[6]] : NULL;
	int G = c->H / c->Hk;

	for (int b = 0; b < c->B; b++)
		for (int h = 0; h < c->H; h++)
			for (int i = 0; i < c->L; i++) {
				int64_t qi = ((int64_t)(b * c->H + h) * c->L + i);
				double D = 0;

				for (int e = 0; e < c->Ev; e++)
					D += (double)dy[qi * c->Ev + e] * y[qi * c->Ev + e];
				for (int j = 0; j < c->S && (!c->causal || j <= i); j++) {
					int64_t kj = (int64_t)(b * c->Hk + h / G) * c->S + j;
					double s = 0, dp = 0, p, ds;

					for (int e = 0; e < c->E; e++)
						s += (double)q[qi * c->E + e] * kk[kj * c->E + e];
					s = c->scale * s + (mask ? mask[i * c->S + j] : 0.0);
					p = exp(s - lse[qi]);
					for (int e = 0; e < c->Ev; e++) {
						dp += (double)dy[qi * c->Ev + e] * v[kj * c->Ev + e];
						want[2][kj * c->Ev + e] += p * dy[qi * c->Ev + e];
					}
					ds = p * (dp - D);
					for (int e = 0; e < c->E; e++) {
						want[0][qi * c->E + e] += c->scale * ds * kk[kj * c->E + e];
						want[1][kj * c->E + e] += c->scale * ds * q[qi * c->E + e];
					}
				}
			}
}

/* The forward's saved state for the case's random Q, K, V and mask: the
 * log-sum-exp of each row's scores and Y = P V (rounded to the operand
 * type), so that P <= 1 as in training (random ones would overflow
 * float16's P and dS). */
static void ag_fill(const ap_mgraph *m, buffers *in)
{
	const ag_case *c = g_agc;
	const float *q = in->data[m->g->inputs[1]], *kk = in->data[m->g->inputs[2]];
	const float *v = in->data[m->g->inputs[3]], *mask = c->mask ? in->data[m->g->inputs[6]] : NULL;
	float *y = in->data[m->g->inputs[4]], *lse = in->data[m->g->inputs[5]];
	double *s = malloc((size_t)c->S * sizeof(double));
	int G = c->H / c->Hk;

	for (int b = 0; b < c->B; b++)
		for (int h = 0; h < c->H; h++)
			for (int i = 0; i < c->L; i++) {
				int64_t qi = ((int64_t)(b * c->H + h) * c->L + i);
				int n = c->causal ? (i + 1 < c->S ? i + 1 : c->S) : c->S;
				double mx = -INFINITY, sum = 0, l;

				for (int j = 0; j < n; j++) {
					int64_t kj = (int64_t)(b * c->Hk + h / G) * c->S + j;

					s[j] = 0;
					for (int e = 0; e < c->E; e++)
						s[j] += (double)q[qi * c->E + e] * kk[kj * c->E + e];
					s[j] = c->scale * s[j] + (mask ? mask[i * c->S + j] : 0.0);
					mx = s[j] > mx ? s[j] : mx;
				}
				for (int j = 0; j < n; j++)
					sum += exp(s[j] - mx);
				l = mx + log(sum);
				lse[qi] = (float)l;
				for (int e = 0; e < c->Ev; e++) {
					double o = 0;

					for (int j = 0; j < n; j++)
						o += exp(s[j] - (double)lse[qi]) * v[((int64_t)(b * c->Hk + h / G) * c->S + j) * c->Ev + e];
					y[qi * c->Ev + e] = is_half(c->dt) ? (float)half_round(c->dt, (float)o) : (float)o;
				}
			}
	free(s);
}

static void run_attention_grad_case(const ag_case *c, const lcase *lc)
{
	ap_graph *g = ap_graph_new("attg");
	int in[7], out[3], n, n_in = c->mask ? 7 : 6;
	case_opts opts = {c->target, false, c->rtol, c->target != NULL};
	ap_mgraph *m;

	g_dt = c->dt;
	in[0] = tensor(g, "dy", DIMS(c->B, c->H, c->L, c->Ev), AP_TENSOR_INPUT);
	in[1] = tensor(g, "q", DIMS(c->B, c->H, c->L, c->E), AP_TENSOR_INPUT);
	in[2] = tensor(g, "k", DIMS(c->B, c->Hk, c->S, c->E), AP_TENSOR_INPUT);
	in[3] = tensor(g, "v", DIMS(c->B, c->Hk, c->S, c->Ev), AP_TENSOR_INPUT);
	in[4] = tensor(g, "y", DIMS(c->B, c->H, c->L, c->Ev), AP_TENSOR_INPUT);
	g_dt = AP_DT_F32;       /* the log-sum-exp: the accumulation type */
	in[5] = tensor(g, "lse", DIMS(c->B, c->H, c->L), AP_TENSOR_INPUT);
	g_dt = c->dt;
	if (c->mask)
		in[6] = tensor(g, "mask", DIMS(c->L, c->S), AP_TENSOR_INPUT);
	out[0] = tensor(g, "dq", DIMS(c->B, c->H, c->L, c->E), AP_TENSOR_VALUE);
	out[1] = tensor(g, "dk", DIMS(c->B, c->Hk, c->S, c->E), AP_TENSOR_VALUE);
	out[2] = tensor(g, "dv", DIMS(c->B, c->Hk, c->S, c->Ev), AP_TENSOR_VALUE);
	g_dt = AP_DT_F32;
	n = ap_graph_add_node(g, "attention_grad", AP_OP_ATTENTION_GRAD, n_in, in, 3, out);
	ck_assert_int_ge(n, 0);
	ap_node_set_float(g, n, "scale", c->scale);
	ap_node_set_int(g, n, "is_causal", c->causal);
	for (int i = 0; i < 3; i++)
		output(g, out[i]);
	m = whole(g, AP_GROUP_OPAQUE);
	g_agc = c;
	g_fill = ag_fill;
	run_case_with(lc, g, m, ref_attention_grad, &opts, c->target != NULL);
	g_fill = NULL;
}

/* The host's SIMT kernel, every configuration (threads 32 ... 256: key
 * and query tiles of that many), against the float64 definition: 4 query
 * heads on 2, L 11 and S 13 (no tile divides them), head dims 8 and 6,
 * scale 0.3, causal, an additive mask. */
START_TEST(attention_backward)
{
	static const ag_case c = {"attention_grad_causal_gqa", AP_DT_F32, 2, 4, 2, 11, 13, 8, 6, 0.3, true, true, NULL, 0};
	lcase lc = {c.name, "attention_grad", {"__syncthreads", "key sweep"}, {"bar.sync"}};

	run_attention_grad_case(&c, &lc);
}
END_TEST

/* float16 and bfloat16 on sm_90: the tensor-core form (mma.sync,
 * ldmatrix, cp.async), every configuration run on the host through the
 * emulated instructions in the checking mode (a race, a read of bytes a
 * cp.async has not delivered or out of bounds fails).  float16: 4 query heads on 2, L 37 and S 45
 * (no tile divides them), head dims 24 (cp.async of 16 bytes, padded to
 * 32) and 20 (8 bytes), causal with an additive mask; bfloat16: one head
 * each, L 50 > S 21, head dims 16 and 7 (V and dY staged through
 * registers: one stage), no mask.  Tolerances: P and dS
 * are rounded to the operand type before their products (as
 * FlashAttention-2 does), so about ten of its epsilons: 1e-2 for
 * float16, 6e-2 for bfloat16. */
START_TEST(attention_backward_tensor_cores)
{
	static const ag_case f16 = {"attention_grad_tc_f16", AP_DT_F16, 2, 4, 2, 37, 45, 24, 20, 0.3, true, true, "sm_90", 4e-3};
	static const ag_case bf16 = {"attention_grad_tc_bf16", AP_DT_BF16, 1, 2, 2, 50, 21, 16, 7, 0.25, false, false, "sm_90", 2e-2};
	lcase l1 = {f16.name, "attention_grad", {"mma.sync", "ldmatrix", "cp.async"},
		    {"mma.sync.aligned.m16n8k16.row.col.f32.f16", "ldmatrix.sync.aligned.m8n8.x2.trans", "cp.async"}};
	lcase l2 = {bf16.name, "attention_grad", {"mma.sync", "ldmatrix"}, {"mma.sync.aligned.m16n8k16.row.col.f32.bf16"}};

	run_attention_grad_case(&f16, &l1);
	run_attention_grad_case(&bf16, &l2);
}
END_TEST

/* ---- depthwise and grouped convolutions -------------------------------------------------- */

/* One convolution case: y = Conv(x or relu(x), w, b) with an epilogue
 * (act 0: none, 1: HardSwish, 2: y * HardSigmoid(y), 3: Relu), plus a
 * residual r of the output's shape when `residual`.  ns 1 is NCW (H = 1,
 * KH = 1, pads[0] = pads[2] = 0). */
typedef struct conv_case {
	const char *name;
	int ns;
	int64_t N, C, H, W, M, G, KH, KW, sh, sw, dh, dw;
	int64_t pads[4];                 /* begin h, begin w, end h, end w */
	bool bias, prologue, residual;
	int act;
	ap_dtype dt;
} conv_case;

static const conv_case *g_cc;      /* the case ref_conv computes */

static int64_t conv_oh(const conv_case *c)
{
	return (c->H + c->pads[0] + c->pads[2] - c->dh * (c->KH - 1) - 1) / c->sh + 1;
}

static int64_t conv_ow(const conv_case *c)
{
	return (c->W + c->pads[1] + c->pads[3] - c->dw * (c->KW - 1) - 1) / c->sw + 1;
}

/* The convolution from its definition (ONNX Conv), in double. */
static void ref_conv(const ap_mgraph *m, const buffers *in, double **want)
{
	const conv_case *c = g_cc;
	const float *x = in->data[m->g->inputs[0]], *w = in->data[m->g->inputs[1]];
	const float *b = c->bias ? in->data[m->g->inputs[2]] : NULL;
	const float *r = c->residual ? in->data[m->g->inputs[c->bias ? 3 : 2]] : NULL;
	int64_t OH = conv_oh(c), OW = conv_ow(c), Cg = c->C / c->G, Mg = c->M / c->G;

	for (int64_t n = 0; n < c->N; n++)
		for (int64_t mo = 0; mo < c->M; mo++)
			for (int64_t oh = 0; oh < OH; oh++)
				for (int64_t ow = 0; ow < OW; ow++) {
					int64_t o = ((n * c->M + mo) * OH + oh) * OW + ow;
					double s = b ? b[mo] : 0, y;

					for (int64_t ci = 0; ci < Cg; ci++)
						for (int64_t kh = 0; kh < c->KH; kh++)
							for (int64_t kw = 0; kw < c->KW; kw++) {
								int64_t ih = oh * c->sh - c->pads[0] + kh * c->dh;
								int64_t iw = ow * c->sw - c->pads[1] + kw * c->dw;
								double xv;

								if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W)
									continue;
								xv = x[((n * c->C + mo / Mg * Cg + ci) * c->H + ih) * c->W + iw];
								if (c->prologue)
									xv = fmax(xv, 0.0);
								s += xv * w[((mo * Cg + ci) * c->KH + kh) * c->KW + kw];
							}
					y = s;
					if (c->act == 1)
						y = s * fmin(fmax(s / 6 + 0.5, 0.0), 1.0);
					else if (c->act == 2)
						y = s * fmin(fmax(0.2 * s + 0.5, 0.0), 1.0);
					else if (c->act == 3)
						y = fmax(s, 0.0);
					if (r)
						y += r[o];
					want[0][o] = y;
				}
}

static ap_graph *conv_graph(const conv_case *c)
{
	ap_graph *g = ap_graph_new("dw");
	int64_t OH = conv_oh(c), OW = conv_ow(c);
	int64_t xd[4] = {c->N, c->C, c->H, c->W}, wd[4] = {c->M, c->C / c->G, c->KH, c->KW};
	int64_t yd[4] = {c->N, c->M, OH, OW};
	int rank = c->ns + 2, x, w, b = -1, r = -1, y, cur, n;
	int in[3];

	if (c->ns == 1) {
		xd[2] = c->W;
		wd[2] = c->KW;
		yd[2] = OW;
	}
	g_dt = c->dt;
	x = tensor(g, "x", xd, rank, AP_TENSOR_INPUT);
	w = tensor(g, "w", wd, rank, AP_TENSOR_INPUT);
	if (c->bias)
		b = tensor(g, "b", DIMS(c->M), AP_TENSOR_INPUT);
	if (c->residual)
		r = tensor(g, "r", yd, rank, AP_TENSOR_INPUT);
	cur = x;
	if (c->prologue) {
		int xr = tensor(g, "xr", xd, rank, AP_TENSOR_VALUE);

		node(g, "relu_in", AP_OP_RELU, LIST(x), LIST(xr));
		cur = xr;
	}
	y = tensor(g, "y", yd, rank, AP_TENSOR_VALUE);
	in[0] = cur;
	in[1] = w;
	in[2] = b;
	n = node(g, "conv", AP_OP_CONV, c->bias ? 3 : 2, in, LIST(y));
	ap_node_set_int(g, n, "group", c->G);
	if (c->ns == 2) {
		ap_node_set_ints(g, n, "strides", (int64_t[]){c->sh, c->sw}, 2);
		ap_node_set_ints(g, n, "dilations", (int64_t[]){c->dh, c->dw}, 2);
		ap_node_set_ints(g, n, "pads", c->pads, 4);
		ap_node_set_ints(g, n, "kernel_shape", (int64_t[]){c->KH, c->KW}, 2);
	} else {
		ap_node_set_ints(g, n, "strides", (int64_t[]){c->sw}, 1);
		ap_node_set_ints(g, n, "dilations", (int64_t[]){c->dw}, 1);
		ap_node_set_ints(g, n, "pads", (int64_t[]){c->pads[1], c->pads[3]}, 2);
		ap_node_set_ints(g, n, "kernel_shape", (int64_t[]){c->KW}, 1);
	}
	cur = y;
	if (c->act) {
		int z = tensor(g, "z", yd, rank, AP_TENSOR_VALUE);

		if (c->act == 1) {
			node(g, "hswish", AP_OP_HARD_SWISH, LIST(y), LIST(z));
		} else if (c->act == 3) {
			node(g, "relu", AP_OP_RELU, LIST(y), LIST(z));
		} else {
			int hs = tensor(g, "hs", yd, rank, AP_TENSOR_VALUE);
			int k = node(g, "hsig", AP_OP_HARD_SIGMOID, LIST(y), LIST(hs));

			ap_node_set_float(g, k, "alpha", 0.2);
			ap_node_set_float(g, k, "beta", 0.5);
			node(g, "gate", AP_OP_MUL, LIST(y, hs), LIST(z));
		}
		cur = z;
	}
	if (c->residual) {
		int o = tensor(g, "o", yd, rank, AP_TENSOR_VALUE);

		node(g, "res", AP_OP_ADD, LIST(cur, r), LIST(o));
		cur = o;
	}
	output(g, cur);
	g_dt = AP_DT_F32;
	return g;
}

/* ptxas's report of the default configuration for sm_80 and sm_90: no
 * spill stores or loads (skipped without NVRTC). */
static void expect_no_spills(const ap_mgraph *m, const char *name)
{
	static const char *const archs[] = {"sm_80", "sm_90", "sm_90a"};
	/* sm_90a's kernels (wgmma) where the case is built for it */
	int n = g_opts && g_opts->target && !strcmp(g_opts->target, "sm_90a") ? 3 : 2;
	ap_error err;

	if (nvrtc_state == 0) {
		nvrtc_state = ap_nvrtc_load(&err) == 0 ? 1 : -1;
		if (nvrtc_state < 0)
			AP_SKIP("nvrtc", "check_lower: NVRTC not loaded, spills of %s not checked (%s)", name, err.msg);
	}
	/* a = 3: sm_90a again with the attention's overlap (overlap=1), where
	 * the space has it: a form the default rule does not take yet; a = 4:
	 * every such form (--unvalidated), where the space has the knob tma
	 * -- warp specialised by TMA (tma=2) where Q, K and V are maps,
	 * overlap=1 tma=1 where K and V are, else the copying producer
	 * (tma=3) */
	for (int a = 0; a < n + 2 * (n == 3) && nvrtc_state > 0; a++) {
		ap_target_info ti;
		ap_lower_options lo = {256, NULL, true};
		ap_ptxas_stats st;
		ap_kir_kernel *k;
		ap_sched s;
		char *cuda;
		bool ws;

		ck_assert_int_eq(ap_cost_target(archs[a < 3 ? a : 2], &ti), 0);
		ti.allow_tf32 = g_opts && g_opts->allow_tf32;
		ti.unvalidated = ti.tma = a == 4;
		if (a == 4 && !ap_test_space_has(m, &ti, "tma"))
			break;
		if (a == 3) {
			if (!ap_test_space_has(m, &ti, "overlap"))
				break;
			ap_test_default_with(m, &ti, "overlap", 0, 1, &s);
			lo.sched = &s;
		}
		k = ap_lower_mgraph(m, &ti, name, &lo, NULL, &err);
		ck_assert_msg(k != NULL, "%s: %s", name, err.msg);
		cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
		ck_assert_ptr_nonnull(cuda);
		/* the sm_90a cases are 16-bit tensor-core ones: on wgmma there */
		ck_assert_msg(a < 2 || strstr(cuda, "wgmma.mma_async.sync.aligned"), "%s: no wgmma on sm_90a", name);
		ws = a == 4 && strstr(cuda, "} else if (ap_role_t >= 0u");
		ck_assert_msg(a < 3 || ws || strstr(cuda, "wgmma.wait_group.sync.aligned 1"), "%s: no overlap", name);
		ck_assert_msg(a < 4 || strstr(cuda, "cp.async.bulk.tensor.") || strstr(cuda, "copies Q, K and V"),
			      "%s: K and V neither by TMA nor by a copying producer", name);
		ck_assert_msg(ap_nvrtc_ptxas_stats(cuda, name, archs[a < 3 ? a : 2], &st, &err) == 0, "%s: %s", name,
			      err.msg);
		ck_assert_msg(st.spill_store_bytes == 0 && st.spill_load_bytes == 0,
			      "%s (%s): spills %d / %d bytes, %d registers", name, archs[a < 3 ? a : 2],
			      st.spill_store_bytes, st.spill_load_bytes, st.registers);
		ck_assert_msg(!st.wgmma_serialized, "%s (%s): ptxas serialised its wgmma (C7520)", name,
			      archs[a < 3 ? a : 2]);
		printf("check_lower: %s on %s%s: %d registers, no spills, %d bytes of shared memory\n", name,
		       archs[a < 3 ? a : 2], a == 3 ? " (overlap=1)" : ws && strstr(cuda, "copies Q, K and V") ? " (tma=3, warp specialised, copying)"
		       : ws ? " (tma=2, warp specialised)" : a == 4 ? " (overlap=1 tma=1)" : "",
		       st.registers, st.shared_bytes);
		free(cuda);
		ap_kir_kernel_free(k);
	}
}

/* The implicit-GEMM convolution on sm_90a warp specialised with a copying
 * producer (tma=3, server/lower/gemm_tma.c): float16 with a ReLU prologue
 * on X (the im2col operand through the producer's registers, the weight
 * by its cp.async), padding, bias, ReLU and a residual; bfloat16 grouped
 * (two groups: the producer's tiles carry the group), strides (2, 1),
 * dilation (1, 2), asymmetric padding, HardSwish -- every configuration
 * of the --unvalidated space the sweep takes (tma 3 and 0) run on one SM
 * in the checking host mode against float64; the default kernel is the
 * copying producer's arm chain, and compiles for sm_90a without spills. */
START_TEST(conv_ws)
{
	static const conv_case cs[2] = {
		{"conv_ws_f16", 2, 2, 16, 13, 11, 24, 1, 3, 3, 1, 1, 1, 1, {1, 1, 1, 1}, true, true, true, 3, AP_DT_F16},
		{"conv_ws_bf16_grouped", 2, 2, 16, 15, 9, 32, 2, 3, 2, 2, 1, 1, 2, {1, 0, 1, 1}, true, false, false, 1,
		 AP_DT_BF16},
	};

	for (int i = 0; i < 2; i++) {
		const conv_case *c = &cs[i];
		ap_graph *g = conv_graph(c);
		lcase lc = {c->name, "gemm", {"cp.async"}, {"mma.sync.aligned.m16n8k16"}};
		case_opts o = {"sm_90a", false, c->dt == AP_DT_F16 ? 4e-3 : 2e-2, true};
		ap_mgraph *m = whole(g, AP_GROUP_CONV);
		ap_target_info ti;
		ap_lower_options lo = {256, NULL, true};
		ap_ptxas_stats st;
		ap_kir_kernel *k;
		ap_error err;
		char *cuda;

		g_cc = c;
		g_unvalidated = true;
		g_sms = 1;
		g_opts = &o;
		run_case(&lc, m, ref_conv);
		g_opts = NULL;
		g_unvalidated = false;
		g_sms = 0;
		ck_assert_int_eq(ap_cost_target("sm_90a", &ti), 0);
		ti.unvalidated = ti.tma = true;
		k = ap_lower_mgraph(m, &ti, c->name, &lo, NULL, &err);
		ck_assert_msg(k != NULL, "%s", err.msg);
		cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
		ck_assert_ptr_nonnull(cuda);
		if (getenv("CHECK_LOWER_DUMP"))
			fputs(cuda, stdout);
		ck_assert_msg(strstr(cuda, "copies operands A and B (registers, cp.async)") &&
			      strstr(cuda, "} else if (ap_role_t >= 0u") && strstr(cuda, "mbarrier.try_wait.parity") &&
			      strstr(cuda, "wgmma.mma_async") && !strstr(cuda, "cp.async.bulk"),
			      "%s: not the copying producer's form:\n%.3000s", c->name, cuda);
		if (ap_nvrtc_load(&err) == 0) {
			ck_assert_msg(ap_nvrtc_ptxas_stats(cuda, c->name, "sm_90a", &st, &err) == 0, "%s", err.msg);
			ck_assert_msg(st.spill_store_bytes == 0 && st.spill_load_bytes == 0, "%s: spills %d / %d bytes",
				      c->name, st.spill_store_bytes, st.spill_load_bytes);
			ck_assert_msg(!st.wgmma_serialized, "%s: ptxas serialised the wgmma (C7520)", c->name);
			printf("check_lower: %s on sm_90a (tma=3): %d registers, no spills\n", c->name, st.registers);
		}
		free(cuda);
		ap_kir_kernel_free(k);
		ap_mgraph_free(m);
		ap_graph_free(g);
	}
}
END_TEST

static void run_conv_case(const conv_case *c)
{
	ap_graph *g = conv_graph(c);
	lcase lc = {c->name, "depthwise", {"__syncthreads", "__shared__"}, {"ld.shared", "bar.sync"}};
	case_opts o = {NULL, false, c->dt == AP_DT_F16 ? 4e-3 : 1e-4, false};
	ap_mgraph *m = whole(g, AP_GROUP_CONV);

	g_cc = c;
	run_case_with(&lc, g, m, ref_conv, &o, true);
}

/* Depthwise (Cg = 1, Mg = 1), stride 1, a 3x3 window, asymmetric pads,
 * 13 x 19 input planes (no tile divides them), a ReLU prologue, bias,
 * HardSwish and a residual add in the epilogue. */
static const conv_case dw_s1 = {"depthwise_s1", 2, 2, 3, 13, 19, 3, 3, 3, 3, 1, 1, 1, 1, {1, 0, 2, 1},
				true, true, true, 1, AP_DT_F32};
/* Stride 2, dilation 2, 5x3 window, asymmetric pads, y * HardSigmoid(y). */
static const conv_case dw_s2 = {"depthwise_s2_dilated", 2, 1, 4, 17, 23, 4, 4, 5, 3, 2, 2, 2, 2, {2, 1, 1, 2},
				true, false, false, 2, AP_DT_F32};
/* Grouped: 3 groups of 2 input and 4 output channels, a 3x2 window,
 * strides (1, 2), no bias, ReLU. */
static const conv_case grouped = {"grouped_cg2_mg4", 2, 2, 6, 11, 15, 12, 3, 3, 2, 1, 2, 1, 1, {1, 0, 1, 1},
				  false, false, false, 3, AP_DT_F32};
/* 1-D (NCW), window 5, stride 1, pads 2 / 1. */
static const conv_case dw_1d = {"depthwise_1d", 1, 2, 4, 1, 29, 4, 4, 1, 5, 1, 1, 1, 1, {0, 2, 0, 1},
				true, false, false, 1, AP_DT_F32};

START_TEST(depthwise_stride1)
{
	run_conv_case(&dw_s1);
}
END_TEST

START_TEST(depthwise_stride2_dilated)
{
	run_conv_case(&dw_s2);
}
END_TEST

START_TEST(depthwise_grouped)
{
	run_conv_case(&grouped);
}
END_TEST

START_TEST(depthwise_1d)
{
	run_conv_case(&dw_1d);
}
END_TEST

/* The same three 2-D cases in float16 (accumulated in float32, the
 * epilogue rounded to float16 at every op: relative tolerance 4e-3). */
START_TEST(depthwise_f16)
{
	conv_case c[3] = {dw_s1, dw_s2, grouped};

	c[0].name = "depthwise_s1_f16";
	c[1].name = "depthwise_s2_dilated_f16";
	c[2].name = "grouped_cg2_mg4_f16";
	for (int i = 0; i < 3; i++) {
		c[i].dt = AP_DT_F16;
		run_conv_case(&c[i]);
	}
}
END_TEST

/* Every emitter of the registry has a case above. */
START_TEST(registry_covered)
{
	static const char *const covered[] = {"stitched", "row_reduce", "column_reduce", "transpose",
					      "attention", "attention_grad", "gemm", "depthwise", "movement",
					      "pointwise"};
	int n;
	const ap_emitter *const *r = ap_emitters(&n);

	ck_assert_int_eq(n, (int)(sizeof(covered) / sizeof(covered[0])));
	for (int i = 0; i < n; i++)
		ck_assert_str_eq(r[i]->name, covered[i]);
}
END_TEST

static Suite *lower_suite(void)
{
	Suite *s = suite_create("lower");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, registry_covered);
	tcase_add_test(tc, pointwise_vector);
	tcase_add_test(tc, row_reduce);
	tcase_add_test(tc, column_reduce);
	tcase_add_test(tc, stitched_softmax_rows);
	tcase_add_test(tc, stitched_softmax_columns);
	tcase_add_test(tc, stitched_layernorm);
	tcase_add_test(tc, transpose_tiles);
	tcase_add_test(tc, movement_concat);
	tcase_add_test(tc, gemm_simt);
	tcase_add_test(tc, gemm_tf32);
	tcase_add_test(tc, gemm_batched);
	tcase_add_test(tc, gemm_batched_tma);
	tcase_add_test(tc, gemm_ws);
	tcase_add_test(tc, gemm_tile_bands);
	tcase_add_test(tc, conv_ws);
	tcase_add_test(tc, depthwise_stride1);
	tcase_add_test(tc, depthwise_stride2_dilated);
	tcase_add_test(tc, depthwise_grouped);
	tcase_add_test(tc, depthwise_1d);
	tcase_add_test(tc, depthwise_f16);
	suite_add_tcase(s, tc);
	/* epilogues of Split parts and siblings (run alone: CK_RUN_CASE=epilogue) */
	tc = tcase_create("epilogue");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, gemm_split_epilogue);
	suite_add_tcase(s, tc);
	/* fused attention (run alone: CK_RUN_CASE=attention) */
	tc = tcase_create("attention");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, attention_online_softmax);
	tcase_add_test(tc, attention_tensor_cores);
	tcase_add_test(tc, attention_wgmma);
	tcase_add_test(tc, attention_wgmma_overlap);
	tcase_add_test(tc, attention_whole_tiles);
	tcase_add_test(tc, attention_fp32_scores);
	tcase_add_test(tc, attention_scale_fold);
	tcase_add_test(tc, attention_causal);
	tcase_add_test(tc, attention_wgmma_tma);
	tcase_add_test(tc, attention_ws_copies);
	tcase_add_test(tc, attention_wgmma_wide_heads);
	tcase_add_test(tc, sview_expand);
	tcase_add_test(tc, attention_record_before_overlap);
	tcase_add_test(tc, attention_overlap_unvalidated);
	tcase_add_test(tc, attention_tensor_cores_tf32);
	tcase_add_test(tc, attention_backward);
	tcase_add_test(tc, attention_backward_tensor_cores);
	suite_add_tcase(s, tc);
	/* a product's output concatenated (run alone: CK_RUN_CASE=concat) */
	tc = tcase_create("concat");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, gemm_concat_epilogue);
	suite_add_tcase(s, tc);
	/* float32 operands staged by cp.async and converted (run alone:
	 * CK_RUN_CASE=convert) */
	tc = tcase_create("convert");
	tcase_set_timeout(tc, 900);
	tcase_add_test(tc, gemm_convert_staged);
	tcase_add_test(tc, gemm_float32_result);
	suite_add_tcase(s, tc);
	/* the host's ISA clones (run alone: CK_RUN_CASE=isa) */
	tc = tcase_create("isa");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, host_isa_clones);
	suite_add_tcase(s, tc);
	/* split-K on thread-block clusters (run alone: CK_RUN_CASE=splitk) */
	tc = tcase_create("splitk");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, gemm_splitk);
	tcase_add_test(tc, gemm_wgmma);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(lower_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
