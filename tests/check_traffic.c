/* check_traffic.c -- every emitter's `traffic` (what the cost model, the
 * tuner and Layer III believe of a configuration: server/cost/cost.h's
 * ap_traffic) against the kernel its `emit` builds for the same
 * configuration.
 *
 * An emitter analyses its micro-graph once in `emit` and again in
 * `traffic`, so the two can disagree unseen, and the tuner ranks
 * configurations by `traffic` alone.  Over micro-graphs -- small ones
 * built here (shapes of check_lower's cases; every emitter of the
 * registry that matches them) and those the partitioner and Layer II make
 * of the models under $APOLLO_TESTDATA (../shared/testdata) models/ and
 * training/ (their registry emitter, the one a build uses; Layer I off,
 * as no registry emitter builds its kernels) -- at cpu, sm_80 and sm_90,
 * each configuration `valid` accepts is lowered (ap_lower, verified) and
 * its traffic asked for, and
 *   structure, exactly, for every configuration lowered:
 *     blocks       = grid[0] x grid[1] x grid[2];
 *     threads      = block[0] x block[1] x block[2];
 *     shared_bytes = the kernel's static shared arrays (elements x size)
 *                    + its dynamic shared memory (smem_bytes), without
 *                    ap_kir_shared_bytes's 16-byte alignment of each array;
 *     tensor_cores = whether the body holds an mma.sync;
 *     flops > 0 where the body computes on floating-point values (an
 *                    operator, comparison or math call on them, an mma);
 *   bytes, measured, for the configurations run: the kernel printed in
 *     the checking mode (AP_KIR_HOST_CHECK, as `apollo-client check
 *     --host-check` runs host:sm_XX bundles), compiled (-O0: the checker
 *     counts, speed does not matter), run on the host over every block
 *     (APOLLO_HOSTCHECK_ALL_BLOCKS=1) on random inputs with the checker
 *     counting each parameter's global bytes (ap_hostcheck_count):
 *     bytes_written = the distinct bytes written, exactly (every output
 *                    byte once, as the model claims; no emitter writes a
 *                    workspace: split-K sums its partials in distributed
 *                    shared memory, never in global memory);
 *     bytes_read    = the distinct bytes read, exactly (READ_TOL: the model
 *                    counts the elements each input's readers touch,
 *                    ap_cost_touched -- a slice or gather's part, else the
 *                    whole input -- and the kernels read just that here:
 *                    integer inputs hold their positions, so gathers pick
 *                    distinct rows);
 *     tile_bytes    (gemm, depthwise, attention) within [TILE_LO, TILE_HI] times the
 *                    bytes the blocks load from the product's operands (the
 *                    parameters its two operands are computed from), every
 *                    load counted: exact for operands copied as they are;
 *                    below 1 where a 16-bit operand is pair-staged (each
 *                    element copied with its 4-byte pair) or a prologue
 *                    reads two tensors, above 1 for an implicit-GEMM
 *                    convolution whose padding is zero-filled, not loaded;
 *   and the checker must find no violation.
 * shared_banks runs float16 products counted at sm_90a and sm_80 and reads
 * the shared-memory wavefronts of their cp.async copies and ldmatrix rows
 * (ap_hostcheck_banks_of): each must take exactly those its bytes need.
 * A difference known[] explains -- its predicate recognises it, exactly
 * where it can -- is counted and printed with its reason at the end of
 * each test instead of failing it; any other fails the test.
 * CHECK_TRAFFIC_SURVEY=1 prints every difference and fails none (2: also
 * each run's counts per parameter), to survey an emitter.
 *
 * How many configurations (tests/lib/sweep.h): the small micro-graphs
 * lower every configuration `valid` accepts and run a sample of stride
 * RUN_STRIDE x the sweep's (each knob value still in one run), or every
 * one with APOLLO_SWEEP=full; the models' micro-graphs lower the sweep's
 * sample (full: every one) and run their default configuration (full:
 * also a sample of stride RUN_STRIDE x AP_SWEEP_STRIDE).  A sampled sweep,
 * and any of a model's, runs no configuration whose checked accesses would
 * pass RUN_MAX (run_cost: the models' large products would take minutes
 * each), and says how many it left.  A kernel whose checked host C and
 * modelled bytes equal one run before (the same micro-graph at sm_80 and
 * sm_90, a layer repeated) runs once.  About 40 s on one core (ASan: 65 s;
 * APOLLO_SWEEP=full: about 15 minutes).
 */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/hostcheck.h"
#include "client/tool.h"
#include "server/backend/backend.h"
#include "server/fuse/fuse.h"
#include "server/kir/kir.h"
#include "server/lower/lower.h"
#include "server/lower/value.h"
#include "server/partition/mgraph.h"
#include "server/tune/tune.h"
#include "tests/lib/require.h"
#include "tests/lib/sweep.h"

#define READ_TOL 0.0       /* bytes_read: relative difference allowed (exact) */
#define TILE_LO 0.5        /* tile_bytes / the operands' bytes loaded: at least */
#define TILE_HI 2.0        /* ... at most */
#define RUN_STRIDE 10      /* configurations run: the sweep's stride times this */
#define RUN_MAX 2e6        /* sampled sweeps run no configuration costing more (run_cost) */

typedef void (*host_fn)(void *const *args, unsigned block_begin, unsigned block_end);

static const char *const g_targets[] = {"cpu", "sm_80", "sm_90"};
#define N_TARGETS 3

/* ---- what a kernel is, read from its IR ---------------------------------------------- */

/* What the traffic's structure is compared with: the grid's blocks, a
 * block's threads, the shared memory (static arrays + dynamic), whether
 * the body holds an mma.sync or a wgmma, whether it computes on floats. */
typedef struct kfacts {
	unsigned long long blocks, threads, shared;
	bool mma, arith;
} kfacts;

static int facts_stmt(const ap_kir_stmt *s, int depth, void *user)
{
	(void)depth;
	if (s->kind == AP_KIR_S_MMA || s->kind == AP_KIR_S_WGMMA)
		((kfacts *)user)->mma = ((kfacts *)user)->arith = true;
	return 0;
}

static int facts_expr(const ap_kir_expr *e, const ap_kir_stmt *s, void *user)
{
	(void)s;
	if (e->kind == AP_KIR_E_CALL ||
	    ((e->kind == AP_KIR_E_BINARY || e->kind == AP_KIR_E_UNARY) && e->a &&
	     ap_kir_is_float_type(e->a->type)))
		((kfacts *)user)->arith = true;
	return 0;
}

/* The facts of kernel k (a walk of its body). */
static kfacts facts_of(const ap_kir_kernel *k)
{
	kfacts f = {0};
	ap_kir_visitor v = {facts_stmt, facts_expr};

	f.blocks = (unsigned long long)k->grid[0] * k->grid[1] * k->grid[2];
	f.threads = (unsigned long long)k->block[0] * k->block[1] * k->block[2];
	f.shared = k->smem_bytes;
	for (int i = 0; i < k->n_arrays; i++)
		if (k->arrays[i]->space == AP_KIR_SHARED)
			f.shared += (unsigned long long)k->arrays[i]->size * ap_dtype_size(k->arrays[i]->type);
	ap_kir_visit(k, &v, &f);
	return f;
}

/* ---- the parameters of a kernel ----------------------------------------------------- */

/* What a kernel parameter is bound to, for the byte checks. */
enum {
	PA_WRITTEN = 1,   /* an output */
	PA_CONST = 2,     /* a constant of the micro-graph too large to bake into the source
			     (AP_CONST_BAKE_MAX), read from a buffer; none of its inputs */
	PA_OPERAND = 4,   /* read on the way to the product's two operands (what tile_bytes
			     counts) */
};

/* The product node of g (a MatMul, Conv or ConvTranspose), or -1. */
static int product_node(const ap_graph *g)
{
	for (int i = 0; i < g->n_nodes; i++)
		if (ap_op_category_of(g->nodes[i].op) == AP_CAT_MATMUL || g->nodes[i].op == AP_OP_CONV ||
		    g->nodes[i].op == AP_OP_CONV_TRANSPOSE)
			return i;
	return -1;
}

/* The tensors the product's two operands are computed from (and they),
 * in up[] (g->n_tensors, zeroed by the caller).  False when g has no
 * product.  (Nodes are in topological order: one pass backwards.) */
static bool operand_sources(const ap_graph *g, bool *up)
{
	int pn = product_node(g);

	if (pn < 0)
		return false;
	for (int i = 0; i < 2 && i < g->nodes[pn].n_inputs; i++)
		if (g->nodes[pn].inputs[i] >= 0)
			up[g->nodes[pn].inputs[i]] = true;
	for (int n = pn - 1; n >= 0; n--) {
		const ap_node *nd = &g->nodes[n];
		bool feeds = false;

		for (int o = 0; o < nd->n_outputs; o++)
			feeds |= nd->outputs[o] >= 0 && up[nd->outputs[o]];
		for (int i = 0; feeds && i < nd->n_inputs; i++)
			if (nd->inputs[i] >= 0)
				up[nd->inputs[i]] = true;
	}
	return true;
}

/* Whether an operand of m's product is computed from a constant baked
 * into the kernel's source (AP_CONST_BAKE_MAX elements at most): loads
 * no kernel parameter serves. */
static bool baked_operand(const ap_mgraph *m)
{
	const ap_graph *g = m->g;
	bool *up = calloc((size_t)g->n_tensors + 1, sizeof(bool)), any = false;

	ck_assert_ptr_nonnull(up);
	if (operand_sources(g, up))
		for (int t = 0; t < g->n_tensors; t++)
			any |= up[t] && g->tensors[t].kind == AP_TENSOR_CONST &&
			       ap_tensor_numel(&g->tensors[t]) <= AP_CONST_BAKE_MAX;
	free(up);
	return any;
}

/* Elements of [lo, lo + n) inside [0, size). */
static int64_t clipped(int64_t lo, int64_t n, int64_t size)
{
	int64_t a = lo < 0 ? 0 : lo, b = lo + n > size ? size : lo + n;

	return b > a ? b - a : 0;
}

/* The bytes the depthwise emitter's blocks load for configuration s
 * (knobs th, tw, cols; depthwise.c's geometry): per block, for each of
 * the Cg input channels of its group, its tile's halo clipped to the
 * input plane (the padding and what lies past the plane are zero-filled,
 * not loaded) and the channel's KH x KW weights.  -1 when m has no
 * convolution. */
static double depthwise_loads(const ap_mgraph *m, const ap_sched *s)
{
	const ap_graph *g = m->g;
	int pn = product_node(g), ns;
	const ap_node *n;
	const ap_tensor *x, *w, *y;
	int64_t dim[2][7] = {{1, 1, 1, 1, 1, 0, 1}, {1, 1, 1, 1, 1, 0, 1}};   /* in, out, k, st, dl, pad, tile */
	int64_t sum[2] = {0, 0}, tiles[2] = {1, 1};

	if (pn < 0 || g->nodes[pn].op != AP_OP_CONV)
		return -1;
	n = &g->nodes[pn];
	x = &g->tensors[n->inputs[0]];
	w = &g->tensors[n->inputs[1]];
	y = &g->tensors[n->outputs[0]];
	ns = x->rank - 2;
	for (int d = 0; d < ns; d++) {
		int64_t *v = dim[ns == 2 ? d : 1];

		v[0] = x->dims[2 + d];
		v[1] = y->dims[2 + d];
		v[2] = w->dims[2 + d];
		v[3] = ap_node_attr_at(n, "strides", d, 1);
		v[4] = ap_node_attr_at(n, "dilations", d, 1);
		v[5] = ap_node_attr_at(n, "pads", d, 0);
	}
	dim[0][6] = s->v[0];
	dim[1][6] = s->v[1];
	for (int d = 0; d < 2; d++) {
		int64_t *v = dim[d], halo = (v[6] - 1) * v[3] + (v[2] - 1) * v[4] + 1;

		tiles[d] = (v[1] + v[6] - 1) / v[6];
		for (int64_t i = 0; i < tiles[d]; i++)
			sum[d] += clipped(i * v[6] * v[3] - v[5], halo, v[0]);
	}
	return (double)(x->dims[0] * y->dims[1] * w->dims[1]) *
	       ((double)(sum[0] * sum[1]) * (double)ap_dtype_size(x->dtype) +
		(double)(tiles[0] * tiles[1] * dim[0][2] * dim[1][2]) * (double)ap_dtype_size(w->dtype));
}

/* The PA_* bits of every parameter of k, lowered for m (malloc'd). */
static unsigned char *param_classes(const ap_mgraph *m, const ap_kir_kernel *k)
{
	const ap_graph *g = m->g;
	unsigned char *cls = calloc((size_t)k->n_params + 1, 1);
	bool *up = calloc((size_t)g->n_tensors + 1, sizeof(bool));

	ck_assert_ptr_nonnull(cls);
	ck_assert_ptr_nonnull(up);
	operand_sources(g, up);
	for (int i = 0; i < k->n_arrays; i++) {
		const ap_kir_array *a = k->arrays[i];

		if (a->space != AP_KIR_GLOBAL || a->tensor < 0 || a->tensor >= g->n_tensors)
			continue;
		cls[a->param] = (a->written ? PA_WRITTEN : 0) | (up[a->tensor] ? PA_OPERAND : 0) |
				(g->tensors[a->tensor].kind == AP_TENSOR_CONST ? PA_CONST : 0);
	}
	free(up);
	return cls;
}

/* Whether m holds a convolution or pooling window that skips input
 * positions (a stride or dilation above 1). */
static bool strided_window(const ap_mgraph *m)
{
	for (int i = 0; i < m->g->n_nodes; i++) {
		const ap_node *n = &m->g->nodes[i];

		if (ap_op_category_of(n->op) != AP_CAT_CONV)
			continue;
		for (int d = 0; d < AP_MAX_RANK; d++)
			if (ap_node_attr_at(n, "strides", d, 1) > 1 || ap_node_attr_at(n, "dilations", d, 1) > 1)
				return true;
	}
	return false;
}

/* ---- known differences ------------------------------------------------------------------ */

enum { CK_BLOCKS, CK_THREADS, CK_SHARED, CK_TC, CK_FLOPS, CK_WRITTEN, CK_READ, CK_TILE, CK_N };

static const char *const check_names[CK_N] = {"blocks", "threads", "shared_bytes", "tensor_cores",
					      "flops", "bytes_written", "bytes_read", "tile_bytes"};

/* What a check saw: the kernel, its traffic and IR facts; for the
 * structure checks the micro-graph and configuration, for the byte checks
 * the counts per parameter and the parameters' PA_* bits. */
struct job;

typedef struct evidence {
	const ap_kir_kernel *k;
	const ap_traffic *tr;
	kfacts f;
	const ap_mgraph *m;                 /* structure checks */
	const ap_sched *s;                  /* structure checks */
	const struct job *j;                /* byte checks */
	const ap_hostcheck_traffic *cnt;    /* byte checks: per parameter */
	double measured;                    /* byte checks: the figure compared */
} evidence;

/* One configuration to run: its kernel, traffic, what the micro-graph
 * says of its parameters, and its description. */
typedef struct job {
	ap_kir_kernel *k;                /* owned */
	ap_traffic tr;
	unsigned char *cls;              /* per parameter: PA_* (owned) */
	bool strided;                    /* strided_window(m) */
	bool baked;                      /* baked_operand(m) */
	double dw_loads;                 /* depthwise_loads(m, s) (depthwise emitter; else -1) */
	const char *emitter;             /* static */
	char what[200];
} job;

/* Each counted run's shared-memory wavefronts of its cp.async copies
 * (ap_hostcheck_banks_of), by its `what` -- the shared_banks test reads
 * them back. */
typedef struct bank_fig {
	char what[200];
	unsigned long long wave, ideal;         /* cp.async into shared memory */
	unsigned long long lm_wave, lm_ideal;   /* ldmatrix rows */
} bank_fig;

static bank_fig g_banks[64];
static int g_n_banks;

/* gemm.c: smem_bytes adds 16 bytes of alignment for every shared array
 * besides the two tiles (pair and compute staging, split-K's partials),
 * whatever their sizes: an upper bound, which valid() and the choice of
 * static or dynamic shared memory use too. */
static bool gemm_align_16(const evidence *e)
{
	int n = 0;

	for (int i = 0; i < e->k->n_arrays; i++)
		n += e->k->arrays[i]->space == AP_KIR_SHARED || e->k->arrays[i]->space == AP_KIR_SHARED_DYN;
	return n > 2 && e->tr->shared_bytes == e->f.shared + 16ull * (unsigned)(n - 2);
}

/* pointwise.c (ap__lower_inline_traffic, every emitter's bytes_read): the
 * model counts the micro-graph's inputs; a constant of more than
 * AP_CONST_BAKE_MAX elements is read from a buffer (value.c const_value)
 * and its bytes are not counted. */
static bool const_buffers(const evidence *e)
{
	unsigned long long c = 0;

	for (int p = 0; p < e->k->n_params; p++)
		if (e->j->cls[p] & PA_CONST)
			c += e->cnt[p].read;
	return c > 0 && e->tr->bytes_read + (double)c == e->measured;
}

/* ap_cost_touched: every reader but a Slice or Gather reads its input
 * whole; a convolution computed inline (the pointwise emitter) with a
 * stride or dilation above 1 reads only the positions they reach. */
static bool inline_strided_window(const evidence *e)
{
	return e->j->strided && e->measured < e->tr->bytes_read;
}

/* dw_traffic: each block's halo box counted whole; the kernel loads only
 * its part inside the input plane (depthwise_loads, exactly). */
static bool depthwise_halo_box(const evidence *e)
{
	return e->j->dw_loads >= 0 && e->measured == e->j->dw_loads && e->tr->tile_bytes > e->measured;
}

/* gm_traffic: an operand computed from a constant baked into the source
 * is counted as loads, which no parameter serves. */
static bool gemm_baked_operand(const evidence *e)
{
	return e->j->baked && e->measured < e->tr->tile_bytes;
}

/* gm_traffic: the tiles' elements loaded once per block row or column;
 * a prologue computed from several tensors on the way to the tile (a
 * register-staged operand) loads each of them per tile element. */
static bool gemm_prologue_leaves(const evidence *e)
{
	int n = 0;

	for (int p = 0; p < e->k->n_params; p++)
		n += (e->j->cls[p] & PA_OPERAND) != 0;
	return n > 2 && e->measured > e->tr->tile_bytes;
}

/* A difference between an emitter's model and its kernel that the suite
 * reports without failing: the emitter (NULL: any), the check, the
 * predicate that recognises it (exactly, where it can), whether the model
 * means it (a simplification, an upper bound) or it is a fault left for
 * now, and why.  A fault's fix corrects only `traffic`, but the tuner's
 * choices and Layer III's merges read it, so bundles may change: each
 * waits for its own change (the entry goes with it). */
typedef struct known_diff {
	const char *emitter;
	int check;
	bool (*explains)(const evidence *e);
	bool fault;
	const char *reason;
} known_diff;

static const known_diff known[] = {
	{NULL, CK_READ, const_buffers, true, "ap__lower_inline_traffic counts the micro-graph's inputs, "
	 "not the constants of more than AP_CONST_BAKE_MAX elements a kernel reads from a buffer"},
	{"gemm", CK_SHARED, gemm_align_16, false, "smem_bytes adds 16 bytes of alignment for every "
	 "staging or split-K array, an upper bound that valid() and the static/dynamic choice share"},
	{"pointwise", CK_READ, inline_strided_window, false, "ap_cost_touched counts a convolution's "
	 "input whole; computed inline with strides or dilations it reads only the positions they reach"},
	{"depthwise", CK_TILE, depthwise_halo_box, false, "dw_traffic counts each block's halo box whole, "
	 "the kernel loads only its part inside the input (the loads equal the clipped halos exactly)"},
	{"gemm", CK_TILE, gemm_baked_operand, false, "gm_traffic counts an operand computed from a "
	 "constant baked into the source as loads"},
	{"gemm", CK_TILE, gemm_prologue_leaves, false, "gm_traffic counts a tile element once; a "
	 "register-staged prologue of several tensors loads each of them per element"},
	{NULL, 0, NULL, false, NULL},
};

/* The entry of known[] that explains a difference of `check` by emitter
 * `em`, or NULL. */
static const known_diff *known_for(const char *em, int check, const evidence *e)
{
	for (size_t i = 0; known[i].explains; i++)
		if ((!known[i].emitter || !strcmp(known[i].emitter, em)) && known[i].check == check &&
		    known[i].explains(e))
			return &known[i];
	return NULL;
}

#define N_KNOWN ((int)(sizeof(known) / sizeof(known[0])))

/* Per emitter: per check the configurations that agreed and that
 * differed; per entry of known[] the differences it explained and the
 * first one's text. */
typedef struct tally {
	int agree[CK_N], differ[CK_N];
	int hits[N_KNOWN];
	char first[N_KNOWN][240];
} tally;

static tally g_tally[16];

/* CHECK_TRAFFIC_SURVEY=1: every difference printed, none failing (to
 * survey an emitter's model); 2: also every tile_bytes ratio and each
 * run's counts per parameter */
static int g_survey;

static int emitter_index(const char *name)
{
	int n;
	const ap_emitter *const *r = ap_emitters(&n);

	for (int i = 0; i < n; i++)
		if (!strcmp(r[i]->name, name))
			return i;
	return n;   /* not of the registry */
}

/* One check's outcome: agreement is counted; a difference fails the test
 * unless known[] explains it (or in a survey), then it is counted under
 * its explanation. */
static void outcome(const char *em, int check, bool agree, const evidence *e, const char *what,
		    const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void outcome(const char *em, int check, bool agree, const evidence *e, const char *what,
		    const char *fmt, ...)
{
	tally *t = &g_tally[emitter_index(em)];
	const known_diff *kd;
	char msg[200];
	va_list ap;
	int i;

	if (agree) {
		t->agree[check]++;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	kd = known_for(em, check, e);
	if (g_survey)
		printf("check_traffic: differs: %s: %s: %s%s\n", what, check_names[check], msg,
		       kd ? " (known)" : "");
	else
		ck_assert_msg(kd != NULL, "%s: %s: %s", what, check_names[check], msg);
	t->differ[check]++;
	i = kd ? (int)(kd - known) : N_KNOWN - 1;   /* the last entry: unexplained (a survey) */
	if (!t->hits[i]++)
		snprintf(t->first[i], sizeof(t->first[i]), "%s: %s", what, msg);
}

/* Prints the tallies of the test that ran (each test runs in its own
 * process), then clears them. */
static void print_tallies(const char *test)
{
	int n;
	const ap_emitter *const *r = ap_emitters(&n);

	for (int e = 0; e < n; e++) {
		tally *t = &g_tally[e];
		char line[400];
		size_t len = 0;

		for (int c = 0; c < CK_N && len + 40 < sizeof(line); c++)
			if (t->agree[c] || t->differ[c])
				len += (size_t)snprintf(line + len, sizeof(line) - len, " %s %d/%d", check_names[c],
							t->agree[c], t->agree[c] + t->differ[c]);
		if (!len)
			continue;
		printf("check_traffic: %s: %s agreed:%s\n", test, r[e]->name, line);
		for (int i = 0; i < N_KNOWN; i++)
			if (t->hits[i])
				printf("check_traffic: %s: %s: known difference in %s (%d configurations, %s): %s; "
				       "first: %s\n", test, r[e]->name,
				       known[i].explains ? check_names[known[i].check] : "?", t->hits[i],
				       !known[i].explains ? "unexplained" : known[i].fault ? "a fault" : "by design",
				       known[i].explains ? known[i].reason : "-", t->first[i]);
	}
	memset(g_tally, 0, sizeof(g_tally));
}

/* ---- structure, exactly --------------------------------------------------------------- */

/* The traffic `tr` of configuration s of emitter em for m (`what`)
 * against its kernel k's launch shape, shared memory and arithmetic. */
static void check_structure(const char *em, const ap_mgraph *m, const ap_sched *s, const ap_kir_kernel *k,
			    const ap_traffic *tr, const char *what)
{
	evidence e = {k, tr, facts_of(k), m, s, NULL, NULL, 0};
	const kfacts *f = &e.f;

	outcome(em, CK_BLOCKS, tr->blocks == f->blocks, &e, what, "traffic %u, grid %ux%ux%u = %llu",
		tr->blocks, k->grid[0], k->grid[1], k->grid[2], f->blocks);
	outcome(em, CK_THREADS, tr->threads == f->threads, &e, what, "traffic %u, block %ux%ux%u = %llu",
		tr->threads, k->block[0], k->block[1], k->block[2], f->threads);
	outcome(em, CK_SHARED, tr->shared_bytes == f->shared, &e, what,
		"traffic %u, kernel %llu (static + %u dynamic; %llu padded)", tr->shared_bytes, f->shared,
		k->smem_bytes, (unsigned long long)ap_kir_shared_bytes(k));
	outcome(em, CK_TC, tr->tensor_cores == f->mma, &e, what, "traffic %s, the kernel %s mma.sync",
		tr->tensor_cores ? "true" : "false", f->mma ? "has" : "has no");
	outcome(em, CK_FLOPS, !f->arith || tr->flops > 0, &e, what, "flops %g, the kernel computes on floats",
		tr->flops);
}

/* ---- bytes, measured ------------------------------------------------------------------ */

static unsigned long long g_seed = 0x9e3779b97f4a7c15ull;

static double frand(void)
{
	g_seed ^= g_seed << 13;
	g_seed ^= g_seed >> 7;
	g_seed ^= g_seed << 17;
	return (double)((g_seed >> 11) % 2000001) / 1000000.0 - 1.0;
}

/* The configurations waiting to run, and the kernels already run (by
 * hash: host C and traffic). */
typedef struct batch {
	job *j;
	int n, cap;
	uint64_t *seen;
	int n_seen, cap_seen;
	int n_run, n_same;
} batch;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
	return h;
}

/* Whether a kernel printing as k does under a fixed name, with traffic
 * tr, was queued before (else remembers it). */
static bool seen_before(batch *b, ap_kir_kernel *k, const ap_traffic *tr)
{
	char *name = strdup(k->name), *text;
	ap_error err;
	uint64_t h = 0xcbf29ce484222325ull;
	double nums[3] = {tr->bytes_read, tr->bytes_written, tr->tile_bytes};

	ck_assert_int_eq(ap_kir_kernel_rename(k, "ap_same"), 0);
	text = ap_kir_print(k, AP_KIR_HOST_CHECK, &err);
	ck_assert_msg(text != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_kir_kernel_rename(k, name), 0);
	h = fnv(fnv(h, text, strlen(text)), nums, sizeof(nums));
	free(text);
	free(name);
	for (int i = 0; i < b->n_seen; i++)
		if (b->seen[i] == h)
			return true;
	if (b->n_seen == b->cap_seen) {
		b->cap_seen = b->cap_seen ? 2 * b->cap_seen : 256;
		b->seen = realloc(b->seen, (size_t)b->cap_seen * sizeof(*b->seen));
		ck_assert_ptr_nonnull(b->seen);
	}
	b->seen[b->n_seen++] = h;
	return false;
}

/* The buffer of parameter a: inputs random floats, integers their
 * element's position (gather indices are clamped by the kernel: distinct
 * rows), bool alternating; outputs zero.  *bytes receives its extent. */
static void *param_buffer(const ap_kir_array *a, unsigned long long *bytes)
{
	size_t es = ap_dtype_size(a->type);
	void *buf;

	*bytes = (unsigned long long)(a->size > 0 ? a->size : 0) * es;
	buf = calloc(*bytes + 16, 1);
	ck_assert_ptr_nonnull(buf);
	for (int64_t i = 0; !a->written && i < a->size; i++)
		ap_elem_set(buf, a->type, i,
			    ap_dtype_is_floating(a->type) ? frand() : a->type == AP_DT_BOOL ? (double)(i & 1)
											     : (double)i);
	return buf;
}

/* Compares job j's traffic with the counts of its run (cnt, per
 * parameter). */
static void check_bytes(const job *j, const ap_hostcheck_traffic *cnt)
{
	unsigned long long rd = 0, wr = 0, tiles = 0;
	evidence e = {j->k, &j->tr, facts_of(j->k), NULL, NULL, j, cnt, 0};

	for (int p = 0; p < j->k->n_params; p++) {
		rd += cnt[p].read;
		wr += cnt[p].written;
		tiles += j->cls[p] & PA_OPERAND ? cnt[p].loads : 0;
	}
	e.measured = (double)wr;
	outcome(j->emitter, CK_WRITTEN, j->tr.bytes_written == (double)wr, &e, j->what,
		"traffic %.0f, distinct bytes written %llu", j->tr.bytes_written, wr);
	e.measured = (double)rd;
	outcome(j->emitter, CK_READ, fabs(j->tr.bytes_read - (double)rd) <= READ_TOL * (double)rd, &e, j->what,
		"traffic %.0f, distinct bytes read %llu", j->tr.bytes_read, rd);
	e.measured = (double)tiles;
	if (g_survey > 1 && j->tr.tile_bytes > 0)
		printf("check_traffic: tile ratio %.3f %s\n", tiles ? j->tr.tile_bytes / (double)tiles : 0.0, j->what);
	if (g_survey > 1)
		for (int p = 0; p < j->k->n_params; p++)
			printf("check_traffic: param %d of %s: cls %d read %llu written %llu loads %llu stores %llu\n",
			       p, j->what, j->cls[p], cnt[p].read, cnt[p].written, cnt[p].loads, cnt[p].stores);
	if (j->tr.tile_bytes > 0)
		outcome(j->emitter, CK_TILE,
			j->tr.tile_bytes >= TILE_LO * (double)tiles && j->tr.tile_bytes <= TILE_HI * (double)tiles,
			&e, j->what, "tile_bytes %.0f, the operands' bytes loaded %llu (ratio %.3f)",
			j->tr.tile_bytes, tiles, tiles ? j->tr.tile_bytes / (double)tiles : 0.0);
}

/* Runs job j's kernel (entry f) over every block with the checker
 * counting, and checks its bytes. */
static void run_counted(const job *j, host_fn f)
{
	const ap_kir_kernel *k = j->k;
	int np = k->n_params;
	void **args = calloc((size_t)np + 1, sizeof(void *));
	unsigned long long *ext = calloc((size_t)np + 1, sizeof(*ext));
	ap_hostcheck_traffic *cnt = calloc((size_t)np + 1, sizeof(*cnt));
	char msg[2048];
	unsigned nv;
	int rc;

	for (int i = 0; i < k->n_arrays; i++)
		if (k->arrays[i]->space == AP_KIR_GLOBAL)
			args[k->arrays[i]->param] = param_buffer(k->arrays[i], &ext[k->arrays[i]->param]);
	ap_hostcheck_count(1);
	ap_hostcheck_begin(ext, np);
	f(args, 0, k->grid[0] * k->grid[1] * k->grid[2]);
	rc = ap_hostcheck_traffic_of(cnt, np);
	if (g_n_banks < (int)(sizeof(g_banks) / sizeof(g_banks[0]))) {
		bank_fig *bf = &g_banks[g_n_banks++];

		snprintf(bf->what, sizeof(bf->what), "%s", j->what);
		ck_assert_int_eq(ap_hostcheck_banks_of(AP_HOSTCHECK_BANKS_COPY, &bf->wave, &bf->ideal), 0);
		ck_assert_int_eq(ap_hostcheck_banks_of(AP_HOSTCHECK_BANKS_LDMATRIX, &bf->lm_wave, &bf->lm_ideal), 0);
		if (g_survey > 1)
			printf("check_traffic: wavefronts: cp.async %llu for %llu, ldmatrix %llu for %llu: %s\n", bf->wave,
			       bf->ideal, bf->lm_wave, bf->lm_ideal, j->what);
	}
	nv = ap_hostcheck_end(msg, sizeof(msg));
	ap_hostcheck_count(0);
	ck_assert_msg(rc == 0, "%s: the launch was not counted", j->what);
	ck_assert_msg(nv == 0, "%s: the checker found %u violations:\n%s", j->what, nv, msg);
	check_bytes(j, cnt);
	for (int p = 0; p < np; p++)
		free(args[p]);
	free(args);
	free(ext);
	free(cnt);
}

/* ---- compiling and running a batch ---------------------------------------------------- */

/* How many host compiles run at once: $APOLLO_JOBS, else the processors
 * online (check_lower's rule). */
static int host_jobs(void)
{
	const char *s = getenv("APOLLO_JOBS");
	long n = s && *s ? strtol(s, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);

	return n < 1 ? 1 : n > 16 ? 16 : (int)n;
}

typedef struct chunk {
	char *src;                       /* one translation unit (owned) */
	uint8_t *so;
	size_t so_len;
	int rc;
	ap_error err;
	void *h;
} chunk;

static void *chunk_compile(void *arg)
{
	chunk *c = arg;

	c->rc = ap_hostcc_compile(c->src, &c->so, &c->so_len, &c->err);
	return NULL;
}

/* Loads a compiled chunk (dlopen of a temporary file) and points its
 * ap_check_rt at the checker. */
static void chunk_load(chunk *c)
{
	char path[] = "/tmp/check_traffic_XXXXXX";
	const ap_hcheck_ops **rt;
	int fd = mkstemp(path);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, c->so, c->so_len), (ssize_t)c->so_len);
	close(fd);
	free(c->so);
	c->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	unlink(path);
	ck_assert_msg(c->h != NULL, "dlopen: %s", dlerror());
	rt = dlsym(c->h, "ap_check_rt");
	ck_assert_ptr_nonnull(rt);
	*rt = ap_hostcheck_ops();
}

/* Compiles the queued kernels in checking mode ($APOLLO_JOBS translation
 * units at once), runs each counted, and empties the queue. */
static void batch_flush(batch *b)
{
	int nc = b->n < host_jobs() ? b->n : host_jobs();
	chunk *cs = calloc((size_t)nc + 1, sizeof(chunk));
	pthread_t *th = calloc((size_t)nc + 1, sizeof(pthread_t));
	size_t *len = calloc((size_t)nc + 1, sizeof(size_t));
	char **texts = calloc((size_t)b->n + 1, sizeof(char *));
	ap_error err;

	for (int i = 0; i < b->n; i++) {
		texts[i] = ap_kir_print(b->j[i].k, AP_KIR_HOST_CHECK, &err);
		ck_assert_msg(texts[i] != NULL, "%s: %s", b->j[i].what, err.msg);
		len[i % nc] += strlen(texts[i]) + 1;
	}
	for (int c = 0; c < nc; c++) {
		cs[c].src = malloc(len[c] + 1);
		cs[c].src[0] = 0;
		len[c] = 0;
	}
	for (int i = 0; i < b->n; i++) {   /* kernel i in chunk i % nc */
		chunk *c = &cs[i % nc];
		size_t l = strlen(texts[i]);

		memcpy(c->src + len[i % nc], texts[i], l);
		len[i % nc] += l;
		c->src[len[i % nc]++] = '\n';
		c->src[len[i % nc]] = 0;
		free(texts[i]);
	}
	for (int c = 0; c < nc; c++)
		ck_assert_int_eq(pthread_create(&th[c], NULL, chunk_compile, &cs[c]), 0);
	for (int c = 0; c < nc; c++)
		pthread_join(th[c], NULL);
	for (int c = 0; c < nc; c++) {
		ck_assert_msg(cs[c].rc == 0, "cc: %.600s", cs[c].err.msg);
		free(cs[c].src);
		chunk_load(&cs[c]);
	}
	for (int i = 0; i < b->n; i++) {
		void *sym = dlsym(cs[i % nc].h, b->j[i].k->name);
		host_fn f;

		ck_assert_msg(sym != NULL, "no symbol %s", b->j[i].k->name);
		memcpy(&f, &sym, sizeof(f));
		run_counted(&b->j[i], f);
		ap_kir_kernel_free(b->j[i].k);
		free(b->j[i].cls);
		b->n_run++;
	}
	for (int c = 0; c < nc; c++)
		dlclose(cs[c].h);
	b->n = 0;
	free(texts);
	free(len);
	free(th);
	free(cs);
}

#define BATCH_MAX 48

/* Queues kernel k (owned from here), lowered for m with configuration s
 * (`what`), unless the same kernel with the same traffic ran before; runs
 * the queue when full. */
static void batch_add(batch *b, const ap_mgraph *m, const ap_sched *s, ap_kir_kernel *k,
		      const ap_traffic *tr, const char *what)
{
	job *j;

	if (seen_before(b, k, tr)) {
		ap_kir_kernel_free(k);
		b->n_same++;
		return;
	}
	if (b->n == b->cap) {
		b->cap = b->cap ? 2 * b->cap : 64;
		b->j = realloc(b->j, (size_t)b->cap * sizeof(*b->j));
		ck_assert_ptr_nonnull(b->j);
	}
	j = &b->j[b->n];
	j->k = k;
	j->tr = *tr;
	j->cls = param_classes(m, k);
	j->strided = strided_window(m);
	j->baked = baked_operand(m);
	j->dw_loads = strcmp(s->em->name, "depthwise") ? -1 : depthwise_loads(m, s);
	j->emitter = s->em->name;
	snprintf(j->what, sizeof(j->what), "%s", what);
	if (++b->n >= BATCH_MAX)
		batch_flush(b);
}

static void batch_done(batch *b)
{
	if (b->n)
		batch_flush(b);
	free(b->j);
	free(b->seen);
	b->j = NULL;
	b->seen = NULL;
	b->cap = b->n_seen = b->cap_seen = 0;
}

/* ---- sweeping an emitter's space -------------------------------------------------------- */

static int next_config(const ap_space *sp, int *idx)
{
	for (int i = 0; i < sp->n; i++) {
		if (++idx[i] < sp->knobs[i].n)
			return 1;
		idx[i] = 0;
	}
	return 0;
}

/* How a sweep samples (see the file comment): a small micro-graph's
 * lowers every configuration and runs a sample (every one with
 * APOLLO_SWEEP=full); a model's lowers the sweep's sample (every one) and
 * runs its default configuration (a sample), none past RUN_MAX. */
typedef struct sweep_plan {
	bool model;
} sweep_plan;

typedef struct sweep_count {
	int lowered, refused, queued, too_large;
} sweep_count;

/* The accesses the checker would see, roughly, running configuration tr:
 * its global bytes, tile loads and shared reads in 4-byte accesses, and
 * its arithmetic (emitters that model no tile or shared traffic). */
static double run_cost(const ap_traffic *tr)
{
	return (tr->bytes_read + tr->bytes_written + tr->tile_bytes + tr->shared_read + tr->flops) / 4;
}

static int g_kno;   /* kernels lowered: unique names */
static int g_too_large;   /* configurations the sample did not run for their size */

/* Lowers configuration s of the emitter bd binds, checks its structure
 * against that binding's traffic and, with `run`, queues it to run counted
 * (with `capped`, unless its run_cost passes RUN_MAX). */
static void one_config(batch *b, const ap_bound *bd, const ap_sched *s, const char *label, bool run,
		       bool capped, sweep_count *n)
{
	const ap_mgraph *m = bd->m;
	const ap_emitter *em = bd->em;
	ap_lower_options lo = {256, s, true};
	char name[32], what[200], *cfg = ap_sched_describe(bd, s);
	ap_traffic tr;
	ap_kir_kernel *k;
	ap_error err;

	ck_assert_ptr_nonnull(cfg);
	snprintf(what, sizeof(what), "%.100s, %s %.80s", label, em->name, cfg);
	free(cfg);
	snprintf(name, sizeof(name), "tk_%d", g_kno++);
	ap_error_clear(&err);
	k = ap_lower(bd, name, &lo, NULL, &err);
	if (!k) {
		ck_assert_msg(err.code == AP_EUNSUPPORTED, "%s: %s", what, err.msg);
		n->refused++;
		return;
	}
	ck_assert_msg(ap_traffic_of(bd, s, &tr) == 0, "%s: traffic failed", what);
	if (tr.library) {
		/* lib=1 (issue 25): the traffic is cuBLASLt's call, attached to
		 * the kernel, which is lib=0's and is checked against its traffic */
		const ap_kir_library *lib = k->library;
		ap_sched s0 = *s;

		ck_assert_msg(lib != NULL, "%s: library traffic but no call on the kernel", what);
		ck_assert_msg(fabs(2.0 * (double)lib->m * (double)lib->n * (double)lib->k * (double)lib->batch - tr.flops) < 1,
			      "%s: the call's %lld x %lld x %lld x %lld against %g flops", what, (long long)lib->m,
			      (long long)lib->n, (long long)lib->k, (long long)lib->batch, tr.flops);
		s0.v[s->n - 1] = 0;   /* lib, the gemm space's last knob */
		ck_assert_msg(ap_traffic_of(bd, &s0, &tr) == 0 && !tr.library, "%s: lib=0's traffic", what);
	} else {
		ck_assert_msg(k->library == NULL, "%s: a library call without its traffic", what);
	}
	check_structure(em->name, m, s, k, &tr, what);
	n->lowered++;
	if (run && capped && run_cost(&tr) > RUN_MAX) {
		run = false;
		n->too_large++;
	}
	if (!run) {
		ap_kir_kernel_free(k);
		return;
	}
	n->queued++;
	batch_add(b, m, s, k, &tr, what);
}

/* Every configuration of the space of the emitter bd binds that `valid`
 * accepts, as the plan samples them (see the file comment). */
static sweep_count sweep(batch *b, const ap_bound *bd, const char *label, const sweep_plan *pl)
{
	const ap_emitter *em = bd->em;
	ap_space sp;
	ap_sched dflt;
	ap_sweep sw, rs;
	ap_error err;
	int idx[AP_SPACE_MAX_KNOBS] = {0};
	sweep_count n = {0};
	bool full;

	ck_assert_int_eq(ap_emitter_default(bd, &sp, &dflt, &err), 0);
	ap_sweep_init(&sw);
	ap_sweep_init(&rs);
	full = sw.stride == 1;
	rs.stride = RUN_STRIDE * (full ? (pl->model ? AP_SWEEP_STRIDE : 0) : sw.stride);
	if (rs.stride < 1)
		rs.stride = 1;
	do {
		ap_sched s = {em, sp.n, {0}};
		bool dfl = true, lower, run;

		for (int i = 0; i < sp.n; i++) {
			s.v[i] = sp.knobs[i].values[idx[i]];
			dfl &= s.v[i] == dflt.v[i];
		}
		if (ap_sched_valid(bd, &s) <= 0)
			continue;
		lower = ap_sweep_take(&sw, &sp, idx, dfl) || !pl->model;
		run = ap_sweep_take(&rs, &sp, idx, dfl);
		if (pl->model && !full)
			run = dfl;
		if (lower || run)
			one_config(b, bd, &s, label, run, pl->model || !full, &n);
	} while (next_config(&sp, idx));
	return n;
}

/* Checks micro-graph m at target g_targets[t]: with `all`, every emitter
 * that matches it, else its registry emitter (the one a build uses);
 * `tf32`: float32 products may use TF32 tensor cores.  Returns the
 * configurations lowered by the registry emitter. */
static int check_at(batch *b, const ap_mgraph *m, const char *label, int t, bool tf32, bool all,
		    const sweep_plan *pl)
{
	int n, built = 0;
	const ap_emitter *const *r = ap_emitters(&n), *first;
	ap_target_info ti;
	ap_error err;
	char what[120];

	ck_assert_int_eq(ap_cost_target(g_targets[t], &ti), 0);
	ti.max_threads_per_block = 256;
	ti.allow_tf32 = tf32;
	{
		ap_bound fb;

		ck_assert_int_eq(ap_bind_first(m, &ti, &fb, &err), 0);
		first = fb.em;
		ap_unbind(&fb);
	}
	snprintf(what, sizeof(what), "%.100s at %s", label, g_targets[t]);
	for (int e = 0; e < n; e++) {
		ap_bound bd;
		int rc = all || r[e] == first ? ap_bind(r[e], m, &ti, &bd, NULL, 0) : 0;
		sweep_count c;

		ck_assert_int_ge(rc, 0);
		if (!rc)
			continue;
		c = sweep(b, &bd, what, pl);
		ap_unbind(&bd);
		if (!pl->model)
			printf("check_traffic: %s: %s: %d configurations lowered, %d refused, %d to run, %d too "
			       "large to run\n", what, r[e]->name, c.lowered, c.refused, c.queued, c.too_large);
		g_too_large += c.too_large;
		if (r[e] == first)
			built = c.lowered;
	}
	return built;
}

/* check_at for every target (GPU targets only with tf32); the registry
 * emitter must build m. */
static void check_mgraph(batch *b, const ap_mgraph *m, const char *label, bool tf32, bool all,
			 const sweep_plan *pl)
{
	for (int t = tf32 ? 1 : 0; t < N_TARGETS; t++)
		ck_assert_msg(check_at(b, m, label, t, tf32, all, pl) > 0, "%s at %s: its emitter builds no "
			      "configuration", label, g_targets[t]);
}

/* ---- small micro-graphs (check_lower's shapes) --------------------------------------- */

#define DIMS(...) ((const int64_t[]){__VA_ARGS__}), (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define LIST(...) (int)(sizeof((const int[]){__VA_ARGS__}) / sizeof(int)), ((const int[]){__VA_ARGS__})

static ap_dtype g_dt = AP_DT_F32;   /* the type tensor() makes */

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

/* A constant of g_dt: one value, or n values v, v + 1, ... (n > 16: read
 * from a buffer, as a layer's bias). */
static int constant(ap_graph *g, const char *name, float v, int64_t n)
{
	int64_t one = n;
	uint8_t *data = calloc((size_t)n, ap_dtype_size(g_dt));
	int t;

	for (int64_t i = 0; i < n; i++)
		ap_elem_set(data, g_dt, i, v + (double)i);
	t = ap_graph_add_tensor(g, name, g_dt, n > 1 ? 1 : 0, n > 1 ? &one : NULL, AP_TENSOR_CONST, data,
				(size_t)n * ap_dtype_size(g_dt));
	free(data);
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

static void reduce_axes(ap_graph *g, int n, int64_t axis, int keep)
{
	ap_node_set_ints(g, n, "axes", &axis, 1);
	ap_node_set_int(g, n, "keepdims", keep);
}

static void output(ap_graph *g, int t)
{
	g->tensors[t].is_output = true;
	g->outputs = realloc(g->outputs, (size_t)(g->n_outputs + 1) * sizeof(int));
	g->outputs[g->n_outputs++] = t;
}

/* The micro-graph of all of g's nodes writing g's outputs; its root the
 * last reduction, transpose, concat or product. */
static ap_mgraph *whole(ap_graph *g, ap_group_kind kind)
{
	ap_error err;
	int *nodes = malloc(((size_t)g->n_nodes + 1) * sizeof(int));
	bool *member = malloc(((size_t)g->n_nodes + 1) * sizeof(bool));
	int root = 0, gi = 0;
	ap_mgraph *m;

	ck_assert_msg(ap_graph_validate(g, &err) == 0, "validate: %s", err.msg);
	for (int i = 0; i < g->n_nodes; i++) {
		ap_op op = g->nodes[i].op;

		nodes[i] = i;
		member[i] = true;
		if (ap_op_category_of(op) == AP_CAT_REDUCTION || op == AP_OP_TRANSPOSE || op == AP_OP_CONCAT ||
		    op == AP_OP_MATMUL || op == AP_OP_CONV)
			root = i;
	}
	m = ap_mgraph_extract(g, nodes, member, g->n_nodes, g->outputs, g->n_outputs, kind, root, &gi, 1,
			      &err);
	ck_assert_msg(m != NULL, "extract: %s", err.msg);
	free(nodes);
	free(member);
	return m;
}

/* Checks g (freed) as one micro-graph of `kind` with every emitter that
 * matches it. */
static void check_graph(batch *b, ap_graph *g, ap_group_kind kind, const char *label, bool tf32)
{
	ap_mgraph *m = whole(g, kind);
	sweep_plan pl = {false};

	check_mgraph(b, m, label, tf32, true, &pl);
	ap_mgraph_free(m);
	ap_graph_free(g);
	g_dt = AP_DT_F32;
}

/* y = tanh(2x + b), x [6, 40], b [40]; z = x + c, c a constant of 40
 * elements (read from a buffer); u = relu(x[1:5, 8:40]) (reads a slice);
 * v = gather(t, i) over a table t [50, 8] with i [6] int64 (reads the
 * rows it selects). */
START_TEST(pointwise)
{
	batch b = {0};
	ap_graph *g = ap_graph_new("pw");
	int x = tensor(g, "x", DIMS(6, 40), AP_TENSOR_INPUT), bb = tensor(g, "b", DIMS(40), AP_TENSOR_INPUT);
	int two = constant(g, "two", 2, 1), a = tensor(g, "a", DIMS(6, 40), AP_TENSOR_VALUE);
	int c = tensor(g, "c", DIMS(6, 40), AP_TENSOR_VALUE), y = tensor(g, "y", DIMS(6, 40), AP_TENSOR_VALUE);

	node(g, "mul", AP_OP_MUL, LIST(x, two), LIST(a));
	node(g, "add", AP_OP_ADD, LIST(a, bb), LIST(c));
	node(g, "tanh", AP_OP_TANH, LIST(c), LIST(y));
	output(g, y);
	check_graph(&b, g, AP_GROUP_BROADCAST, "pointwise_bias_tanh", false);
	for (int dt = 0; dt < 2; dt++) {
		g_dt = dt ? AP_DT_F16 : AP_DT_F32;
		g = ap_graph_new("pwc");
		x = tensor(g, "x", DIMS(6, 40), AP_TENSOR_INPUT);
		c = constant(g, "c", 0.5f, 40);
		y = tensor(g, "y", DIMS(6, 40), AP_TENSOR_VALUE);
		node(g, "add", AP_OP_ADD, LIST(x, c), LIST(y));
		output(g, y);
		check_graph(&b, g, AP_GROUP_BROADCAST, dt ? "pointwise_const_f16" : "pointwise_const", false);
	}
	{
		int s, u, n;

		g = ap_graph_new("pws");
		x = tensor(g, "x", DIMS(6, 40), AP_TENSOR_INPUT);
		s = tensor(g, "s", DIMS(4, 32), AP_TENSOR_VALUE);
		u = tensor(g, "u", DIMS(4, 32), AP_TENSOR_VALUE);
		n = node(g, "slice", AP_OP_SLICE, LIST(x), LIST(s));
		ap_node_set_ints(g, n, "starts", (const int64_t[]){1, 8}, 2);
		ap_node_set_ints(g, n, "ends", (const int64_t[]){5, 40}, 2);
		ap_node_set_ints(g, n, "axes", (const int64_t[]){0, 1}, 2);
		ap_node_set_ints(g, n, "steps", (const int64_t[]){1, 1}, 2);
		node(g, "relu", AP_OP_RELU, LIST(s), LIST(u));
		output(g, u);
		check_graph(&b, g, AP_GROUP_INJECTIVE, "pointwise_slice", false);
	}
	{
		int t, i, v, n;

		g = ap_graph_new("pwg");
		t = tensor(g, "t", DIMS(50, 8), AP_TENSOR_INPUT);
		g_dt = AP_DT_I64;
		i = tensor(g, "i", DIMS(6), AP_TENSOR_INPUT);
		g_dt = AP_DT_F32;
		v = tensor(g, "v", DIMS(6, 8), AP_TENSOR_VALUE);
		n = node(g, "gather", AP_OP_GATHER, LIST(t, i), LIST(v));
		ap_node_set_int(g, n, "axis", 0);
		output(g, v);
		check_graph(&b, g, AP_GROUP_INJECTIVE, "pointwise_gather", false);
	}
	batch_done(&b);
	print_tallies("pointwise");
}
END_TEST

/* s = sum(exp(x), axis 1) over x [7, 300]; m = max(x, axis 0) over
 * x [50, 3, 24]. */
START_TEST(reductions)
{
	batch b = {0};
	ap_graph *g = ap_graph_new("rr");
	int x = tensor(g, "x", DIMS(7, 300), AP_TENSOR_INPUT);
	int e = tensor(g, "e", DIMS(7, 300), AP_TENSOR_VALUE), s = tensor(g, "s", DIMS(7, 1), AP_TENSOR_VALUE);

	node(g, "exp", AP_OP_EXP, LIST(x), LIST(e));
	reduce_axes(g, node(g, "sum", AP_OP_REDUCE_SUM, LIST(e), LIST(s)), 1, 1);
	output(g, s);
	check_graph(&b, g, AP_GROUP_REDUCTION, "row_reduce_sum_exp", false);
	g = ap_graph_new("cr");
	x = tensor(g, "x", DIMS(50, 3, 24), AP_TENSOR_INPUT);
	s = tensor(g, "s", DIMS(3, 24), AP_TENSOR_VALUE);
	reduce_axes(g, node(g, "max", AP_OP_REDUCE_MAX, LIST(x), LIST(s)), 0, 0);
	output(g, s);
	check_graph(&b, g, AP_GROUP_REDUCTION, "column_reduce_max", false);
	batch_done(&b);
	print_tallies("reductions");
}
END_TEST

/* Softmax over an axis of x (max, exp(x - max), sum, div), Layer II's
 * stitched form. */
static ap_graph *softmax_graph(const int64_t *dims, int rank, int64_t axis)
{
	ap_graph *g = ap_graph_new("sm");
	int64_t rd[AP_MAX_RANK];
	int x, mx, d, e, s, y;

	memcpy(rd, dims, (size_t)rank * sizeof(int64_t));
	rd[axis] = 1;
	x = tensor(g, "x", dims, rank, AP_TENSOR_INPUT);
	mx = tensor(g, "mx", rd, rank, AP_TENSOR_VALUE);
	d = tensor(g, "d", dims, rank, AP_TENSOR_VALUE);
	e = tensor(g, "e", dims, rank, AP_TENSOR_VALUE);
	s = tensor(g, "s", rd, rank, AP_TENSOR_VALUE);
	y = tensor(g, "y", dims, rank, AP_TENSOR_VALUE);
	reduce_axes(g, node(g, "max", AP_OP_REDUCE_MAX, LIST(x), LIST(mx)), axis, 1);
	node(g, "sub", AP_OP_SUB, LIST(x, mx), LIST(d));
	node(g, "exp", AP_OP_EXP, LIST(d), LIST(e));
	reduce_axes(g, node(g, "sum", AP_OP_REDUCE_SUM, LIST(e), LIST(s)), axis, 1);
	node(g, "div", AP_OP_DIV, LIST(e, s), LIST(y));
	output(g, y);
	return g;
}

/* LayerNorm of x [5, 2100] with gamma [2100], writing the normalised rows
 * and each row's inverse deviation (a row of 2100: registers or shared
 * memory). */
static ap_graph *layernorm_graph(void)
{
	ap_graph *g = ap_graph_new("ln");
	int x = tensor(g, "x", DIMS(5, 2100), AP_TENSOR_INPUT), gm = tensor(g, "gm", DIMS(2100), AP_TENSOR_INPUT);
	int inv_n = constant(g, "inv_n", 1.0f / 2100, 1), eps = constant(g, "eps", 1e-5f, 1);
	int sum = tensor(g, "sum", DIMS(5, 1), AP_TENSOR_VALUE), mean = tensor(g, "mean", DIMS(5, 1), AP_TENSOR_VALUE);
	int d = tensor(g, "d", DIMS(5, 2100), AP_TENSOR_VALUE), d2 = tensor(g, "d2", DIMS(5, 2100), AP_TENSOR_VALUE);
	int ss = tensor(g, "ss", DIMS(5, 1), AP_TENSOR_VALUE), var = tensor(g, "var", DIMS(5, 1), AP_TENSOR_VALUE);
	int ve = tensor(g, "ve", DIMS(5, 1), AP_TENSOR_VALUE), sd = tensor(g, "sd", DIMS(5, 1), AP_TENSOR_VALUE);
	int inv = tensor(g, "inv", DIMS(5, 1), AP_TENSOR_VALUE), nrm = tensor(g, "nrm", DIMS(5, 2100), AP_TENSOR_VALUE);
	int y = tensor(g, "y", DIMS(5, 2100), AP_TENSOR_VALUE);

	reduce_axes(g, node(g, "sum", AP_OP_REDUCE_SUM, LIST(x), LIST(sum)), 1, 1);
	node(g, "mean", AP_OP_MUL, LIST(sum, inv_n), LIST(mean));
	node(g, "sub", AP_OP_SUB, LIST(x, mean), LIST(d));
	node(g, "sq", AP_OP_MUL, LIST(d, d), LIST(d2));
	reduce_axes(g, node(g, "ss", AP_OP_REDUCE_SUM, LIST(d2), LIST(ss)), 1, 1);
	node(g, "var", AP_OP_MUL, LIST(ss, inv_n), LIST(var));
	node(g, "ve", AP_OP_ADD, LIST(var, eps), LIST(ve));
	node(g, "sd", AP_OP_SQRT, LIST(ve), LIST(sd));
	node(g, "inv", AP_OP_RECIPROCAL, LIST(sd), LIST(inv));
	node(g, "nrm", AP_OP_MUL, LIST(d, inv), LIST(nrm));
	node(g, "y", AP_OP_MUL, LIST(nrm, gm), LIST(y));
	output(g, y);
	output(g, inv);
	return g;
}

START_TEST(stitched)
{
	batch b = {0};

	check_graph(&b, softmax_graph((const int64_t[]){9, 257}, 2, 1), AP_GROUP_STITCHED,
		    "stitched_softmax_rows", false);
	check_graph(&b, softmax_graph((const int64_t[]){13, 6}, 2, 0), AP_GROUP_STITCHED,
		    "stitched_softmax_columns", false);
	g_dt = AP_DT_F16;
	check_graph(&b, softmax_graph((const int64_t[]){4, 3, 100}, 3, 2), AP_GROUP_STITCHED,
		    "stitched_softmax_f16", false);
	check_graph(&b, layernorm_graph(), AP_GROUP_STITCHED, "stitched_layernorm", false);
	batch_done(&b);
	print_tallies("stitched");
}
END_TEST

/* y = 2 * transpose(x + 1, [1, 0]), x [40, 70], in float32 and float16;
 * y = concat([a, relu(b)], axis 1), a [5, 8], b [5, 12]. */
START_TEST(movement)
{
	batch b = {0};

	for (int dt = 0; dt < 2; dt++) {
		ap_graph *g = ap_graph_new("tr");
		int x, one, two, a, t, y;

		g_dt = dt ? AP_DT_F16 : AP_DT_F32;
		x = tensor(g, "x", DIMS(40, 70), AP_TENSOR_INPUT);
		one = constant(g, "one", 1, 1);
		two = constant(g, "two", 2, 1);
		a = tensor(g, "a", DIMS(40, 70), AP_TENSOR_VALUE);
		t = tensor(g, "t", DIMS(70, 40), AP_TENSOR_VALUE);
		y = tensor(g, "y", DIMS(70, 40), AP_TENSOR_VALUE);
		node(g, "add", AP_OP_ADD, LIST(x, one), LIST(a));
		ap_node_set_ints(g, node(g, "tr", AP_OP_TRANSPOSE, LIST(a), LIST(t)), "perm",
				 (const int64_t[]){1, 0}, 2);
		node(g, "mul", AP_OP_MUL, LIST(t, two), LIST(y));
		output(g, y);
		check_graph(&b, g, AP_GROUP_TRANSPOSE, dt ? "transpose_tiles_f16" : "transpose_tiles", false);
	}
	{
		ap_graph *g = ap_graph_new("mv");
		int a = tensor(g, "a", DIMS(5, 8), AP_TENSOR_INPUT), bb = tensor(g, "b", DIMS(5, 12), AP_TENSOR_INPUT);
		int rb = tensor(g, "rb", DIMS(5, 12), AP_TENSOR_VALUE), y = tensor(g, "y", DIMS(5, 20), AP_TENSOR_VALUE);

		node(g, "relu", AP_OP_RELU, LIST(bb), LIST(rb));
		ap_node_set_int(g, node(g, "cat", AP_OP_CONCAT, LIST(a, rb), LIST(y)), "axis", 1);
		output(g, y);
		check_graph(&b, g, AP_GROUP_INJECTIVE, "movement_concat", false);
	}
	batch_done(&b);
	print_tallies("movement");
}
END_TEST

/* ---- products ------------------------------------------------------------------------- */

/* y = relu(x) @ W + b + r, x [2, 20, 36], W [36, 24], b [24], r
 * [2, 20, 24]; outputs y and transpose(y, [0, 2, 1]) (check_lower's
 * gemm_fold_graph): a prologue, a bias, a residual, two outputs. */
static ap_graph *gemm_fold_graph(void)
{
	ap_graph *g = ap_graph_new("gemm");
	int x = tensor(g, "x", DIMS(2, 20, 36), AP_TENSOR_INPUT), w = tensor(g, "w", DIMS(36, 24), AP_TENSOR_INPUT);
	int b = tensor(g, "b", DIMS(24), AP_TENSOR_INPUT), r = tensor(g, "r", DIMS(2, 20, 24), AP_TENSOR_INPUT);
	int rx = tensor(g, "rx", DIMS(2, 20, 36), AP_TENSOR_VALUE), mm = tensor(g, "mm", DIMS(2, 20, 24), AP_TENSOR_VALUE);
	int yb = tensor(g, "yb", DIMS(2, 20, 24), AP_TENSOR_VALUE), y = tensor(g, "y", DIMS(2, 20, 24), AP_TENSOR_VALUE);
	int yt = tensor(g, "yt", DIMS(2, 24, 20), AP_TENSOR_VALUE);

	node(g, "relu", AP_OP_RELU, LIST(x), LIST(rx));
	node(g, "mm", AP_OP_MATMUL, LIST(rx, w), LIST(mm));
	node(g, "bias", AP_OP_ADD, LIST(mm, b), LIST(yb));
	node(g, "res", AP_OP_ADD, LIST(yb, r), LIST(y));
	ap_node_set_ints(g, node(g, "tr", AP_OP_TRANSPOSE, LIST(y), LIST(yt)), "perm", (const int64_t[]){0, 2, 1}, 3);
	output(g, y);
	output(g, yt);
	return g;
}

/* y = x @ w (+ b) in g_dt, x [M, K], w [K, N]. */
static ap_graph *product_graph(int64_t M, int64_t K, int64_t N, bool bias)
{
	ap_graph *g = ap_graph_new("mm");
	int x = tensor(g, "x", DIMS(M, K), AP_TENSOR_INPUT), w = tensor(g, "w", DIMS(K, N), AP_TENSOR_INPUT);
	int mm = tensor(g, "mm", DIMS(M, N), AP_TENSOR_VALUE), y = mm;

	node(g, "mm", AP_OP_MATMUL, LIST(x, w), LIST(mm));
	if (bias) {
		int b = tensor(g, "b", DIMS(N), AP_TENSOR_INPUT);

		y = tensor(g, "y", DIMS(M, N), AP_TENSOR_VALUE);
		node(g, "bias", AP_OP_ADD, LIST(mm, b), LIST(y));
	}
	output(g, y);
	return g;
}

/* tanh(a @ b) with a [3, 1, 16, 40] and b [1, 2, 40, 28] broadcast to
 * batches [3, 2]. */
static ap_graph *batched_graph(void)
{
	ap_graph *g = ap_graph_new("bmm");
	int a = tensor(g, "a", DIMS(3, 1, 16, 40), AP_TENSOR_INPUT), b = tensor(g, "b", DIMS(1, 2, 40, 28), AP_TENSOR_INPUT);
	int mm = tensor(g, "mm", DIMS(3, 2, 16, 28), AP_TENSOR_VALUE), y = tensor(g, "y", DIMS(3, 2, 16, 28), AP_TENSOR_VALUE);

	node(g, "mm", AP_OP_MATMUL, LIST(a, b), LIST(mm));
	node(g, "tanh", AP_OP_TANH, LIST(mm), LIST(y));
	output(g, y);
	return g;
}

/* y = a b + bias split along the columns into parts of 8, 12 and 10, the
 * second through a ReLU, and z = c * c beside it (check_lower's
 * gemm_split_epilogue). */
static ap_graph *split_graph(void)
{
	ap_graph *g = ap_graph_new("qkv");
	int a = tensor(g, "a", DIMS(20, 24), AP_TENSOR_INPUT), b = tensor(g, "b", DIMS(24, 30), AP_TENSOR_INPUT);
	int bias = tensor(g, "bias", DIMS(30), AP_TENSOR_INPUT), cc = tensor(g, "c", DIMS(20, 30), AP_TENSOR_INPUT);
	int mm = tensor(g, "mm", DIMS(20, 30), AP_TENSOR_VALUE), y = tensor(g, "y", DIMS(20, 30), AP_TENSOR_VALUE);
	int q = tensor(g, "q", DIMS(20, 8), AP_TENSOR_VALUE), k = tensor(g, "k", DIMS(20, 12), AP_TENSOR_VALUE);
	int v = tensor(g, "v", DIMS(20, 10), AP_TENSOR_VALUE), kr = tensor(g, "kr", DIMS(20, 12), AP_TENSOR_VALUE);
	int z = tensor(g, "z", DIMS(20, 30), AP_TENSOR_VALUE);

	node(g, "mm", AP_OP_MATMUL, LIST(a, b), LIST(mm));
	node(g, "bias", AP_OP_ADD, LIST(mm, bias), LIST(y));
	ap_node_set_int(g, node(g, "split", AP_OP_SPLIT, LIST(y), LIST(q, k, v)), "axis", 1);
	node(g, "relu", AP_OP_RELU, LIST(k), LIST(kr));
	node(g, "square", AP_OP_MUL, LIST(cc, cc), LIST(z));
	output(g, q);
	output(g, kr);
	output(g, v);
	output(g, z);
	return g;
}

/* out = Concat(s, relu(x @ w), t) along axis 1, x [2, 8, 12], w [12, 24],
 * s and t [2, 8, 24] (a SqueezeNet fire module's shape). */
static ap_graph *concat_graph(void)
{
	ap_graph *g = ap_graph_new("gemm_concat");
	int x = tensor(g, "x", DIMS(2, 8, 12), AP_TENSOR_INPUT), w = tensor(g, "w", DIMS(12, 24), AP_TENSOR_INPUT);
	int sv = tensor(g, "s", DIMS(2, 8, 24), AP_TENSOR_INPUT), tv = tensor(g, "t", DIMS(2, 8, 24), AP_TENSOR_INPUT);
	int mm = tensor(g, "mm", DIMS(2, 8, 24), AP_TENSOR_VALUE), yr = tensor(g, "yr", DIMS(2, 8, 24), AP_TENSOR_VALUE);
	int out = tensor(g, "out", DIMS(2, 24, 24), AP_TENSOR_VALUE);

	node(g, "mm", AP_OP_MATMUL, LIST(x, w), LIST(mm));
	node(g, "relu", AP_OP_RELU, LIST(mm), LIST(yr));
	ap_node_set_int(g, node(g, "cat", AP_OP_CONCAT, LIST(sv, yr, tv), LIST(out)), "axis", 1);
	output(g, out);
	return g;
}

/* The GEMM emitter's forms: SIMT with prologue and epilogue, TF32 and
 * float16 tensor cores (cp.async pipelines on sm_80 and sm_90), split-K
 * on clusters (K = 512 over a 24 x 20 output, sm_90), batches, Split
 * parts, a Concat epilogue. */
START_TEST(gemm)
{
	batch b = {0};

	check_graph(&b, gemm_fold_graph(), AP_GROUP_MATMUL, "gemm_fold", false);
	check_graph(&b, gemm_fold_graph(), AP_GROUP_MATMUL, "gemm_fold_tf32", true);
	g_dt = AP_DT_F16;
	check_graph(&b, product_graph(40, 72, 48, true), AP_GROUP_MATMUL, "gemm_f16", false);
	check_graph(&b, product_graph(24, 512, 20, true), AP_GROUP_MATMUL, "gemm_splitk_tf32", true);
	check_graph(&b, batched_graph(), AP_GROUP_MATMUL, "gemm_batched", false);
	check_graph(&b, split_graph(), AP_GROUP_MATMUL, "gemm_split_epilogue", false);
	check_graph(&b, concat_graph(), AP_GROUP_MATMUL, "gemm_concat", false);
	batch_done(&b);
	print_tallies("gemm");
}
END_TEST

/* Shared-memory bank conflicts (ap_hostcheck_banks_of, counted in the
 * emulation) of float16 products' default configurations, bk 32 and 64,
 * A K-major (x [M, K] row-major), B MN-major (w [K, N] row-major) and,
 * with w transposed, K-major: every cp.async copy must take exactly the
 * wavefronts its bytes need -- on sm_90a's swizzled wgmma tiles
 * (ap_kir_wg_layout; with the swizzle off, 6x), on sm_80's padded
 * mma.sync tiles by dealing lines shorter than 128 bytes 8 at a time
 * (gemm_stage.c, copy_interleaved; before, 1.5-2x at bk 32), in the
 * default tiles and in the 4096^3 product's 128 x 128 -- and on sm_80
 * every ldmatrix too (the 16-byte padding's purpose). */
static void banks_case(batch *b, ap_graph *g, const char *tgt, const char *label, int bk, bool large)
{
	ap_mgraph *m = whole(g, AP_GROUP_MATMUL);
	ap_target_info ti;
	ap_bound bd;
	ap_space sp;
	ap_sched s;
	ap_error err;
	sweep_count n = {0};
	char what[120];

	ck_assert_int_eq(ap_cost_target(tgt, &ti), 0);
	ti.max_threads_per_block = 256;
	ck_assert_int_eq(ap_bind_first(m, &ti, &bd, &err), 0);
	ck_assert_str_eq(bd.em->name, "gemm");
	ck_assert_int_eq(ap_emitter_default(&bd, &sp, &s, &err), 0);
	for (int i = 0; i < sp.n; i++)
		if (!strcmp(sp.knobs[i].name, "bk"))
			s.v[i] = bk;
		else if (!strcmp(sp.knobs[i].name, "lib"))
			s.v[i] = 0;
		else if (large && (!strcmp(sp.knobs[i].name, "bm") || !strcmp(sp.knobs[i].name, "bn")))
			s.v[i] = 128;   /* the 4096^3 product's tile (mma.sync: 2 x 4 warps) */
		else if (large && !strcmp(sp.knobs[i].name, "wm"))
			s.v[i] = 2;
		else if (large && !strcmp(sp.knobs[i].name, "wn"))
			s.v[i] = 4;
	snprintf(what, sizeof(what), "%s at %s bk=%d", label, tgt, bk);
	one_config(b, &bd, &s, what, true, false, &n);
	ck_assert_msg(n.queued == 1 || b->n_same > 0, "%s: not queued (%d lowered, %d refused)", what, n.lowered,
		      n.refused);
	ap_unbind(&bd);
	ap_mgraph_free(m);
	ap_graph_free(g);
}

static ap_graph *product_t_graph(int64_t M, int64_t K, int64_t N)
{
	ap_graph *g = ap_graph_new("mmt");
	int x = tensor(g, "x", DIMS(M, K), AP_TENSOR_INPUT), w = tensor(g, "w", DIMS(N, K), AP_TENSOR_INPUT);
	int wt = tensor(g, "wt", DIMS(K, N), AP_TENSOR_VALUE), y = tensor(g, "y", DIMS(M, N), AP_TENSOR_VALUE);

	ap_node_set_ints(g, node(g, "wt", AP_OP_TRANSPOSE, LIST(w), LIST(wt)), "perm", (const int64_t[]){1, 0}, 2);
	node(g, "mm", AP_OP_MATMUL, LIST(x, wt), LIST(y));
	output(g, y);
	return g;
}

START_TEST(shared_banks)
{
	batch b = {0};
	static const char *const tgts[] = {"sm_90a", "sm_80"};
	int checked = 0;

	g_n_banks = 0;
	g_dt = AP_DT_F16;
	for (int t = 0; t < 2; t++)
		for (int bk = 32; bk <= 64; bk *= 2)
			for (int large = 0; large <= t; large++) {
				banks_case(&b, product_graph(128, 256, 128, false), tgts[t], "x @ w f16 128x256x128", bk,
					   large);
				banks_case(&b, product_t_graph(128, 256, 128), tgts[t], "x @ w^T f16 128x256x128", bk,
					   large);
			}
	g_dt = AP_DT_F32;
	batch_done(&b);
	for (int i = 0; i < g_n_banks; i++) {
		const bank_fig *f = &g_banks[i];

		printf("check_traffic: shared_banks: cp.async wavefronts %llu, needed %llu (%.2fx); ldmatrix %llu, "
		       "needed %llu (%.2fx): %s\n", f->wave, f->ideal, f->ideal ? (double)f->wave / (double)f->ideal : 0.0,
		       f->lm_wave, f->lm_ideal, f->lm_ideal ? (double)f->lm_wave / (double)f->lm_ideal : 0.0, f->what);
		ck_assert_msg(f->ideal > 0 && f->wave >= f->ideal, "%s: %llu wavefronts for %llu needed", f->what,
			      f->wave, f->ideal);
		ck_assert_msg(f->wave == f->ideal, "%s: the copies take %llu wavefronts for %llu", f->what, f->wave,
			      f->ideal);
		if (strstr(f->what, "sm_90a")) {
			checked++;
		} else {
			/* mma.sync's rows padded by 16 bytes: ldmatrix's 8 rows of a
			 * matrix in distinct banks (the padding's purpose) */
			ck_assert_msg(f->lm_ideal > 0 && f->lm_wave == f->lm_ideal,
				      "%s: padded tiles, yet ldmatrix takes %llu wavefronts for %llu", f->what, f->lm_wave,
				      f->lm_ideal);
		}
	}
	ck_assert_int_eq(checked, 4);
}
END_TEST

/* ---- attention and convolutions ------------------------------------------------------ */

/* O = softmax(Q K^T / 4 + mask) V over B x H heads, written as O^T
 * [B, Nq, H, Dv]; with `stats` the scores, row maxima and sums are
 * outputs too (check_lower's attention cases). */
static ap_graph *attention_graph(int64_t B, int64_t H, int64_t Nq, int64_t Nk, int64_t D, int64_t Dv,
				 bool stats)
{
	ap_graph *g = ap_graph_new("att");
	int q = tensor(g, "q", DIMS(B, H, Nq, D), AP_TENSOR_INPUT), kk = tensor(g, "k", DIMS(B, H, Nk, D), AP_TENSOR_INPUT);
	int v = tensor(g, "v", DIMS(B, H, Nk, Dv), AP_TENSOR_INPUT), mask = tensor(g, "mask", DIMS(Nq, Nk), AP_TENSOR_INPUT);
	int four = constant(g, "four", 4, 1), kt = tensor(g, "kt", DIMS(B, H, D, Nk), AP_TENSOR_VALUE);
	int y1 = tensor(g, "y1", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE), sc = tensor(g, "sc", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE);
	int s2 = tensor(g, "s2", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE), mx = tensor(g, "mx", DIMS(B, H, Nq, 1), AP_TENSOR_VALUE);
	int d = tensor(g, "d", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE), e = tensor(g, "e", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE);
	int l = tensor(g, "l", DIMS(B, H, Nq, 1), AP_TENSOR_VALUE), pr = tensor(g, "p", DIMS(B, H, Nq, Nk), AP_TENSOR_VALUE);
	int o = tensor(g, "o", DIMS(B, H, Nq, Dv), AP_TENSOR_VALUE), ot = tensor(g, "ot", DIMS(B, Nq, H, Dv), AP_TENSOR_VALUE);

	ap_node_set_ints(g, node(g, "kt", AP_OP_TRANSPOSE, LIST(kk), LIST(kt)), "perm", (const int64_t[]){0, 1, 3, 2}, 4);
	node(g, "qk", AP_OP_MATMUL, LIST(q, kt), LIST(y1));
	node(g, "scale", AP_OP_DIV, LIST(y1, four), LIST(sc));
	node(g, "mask", AP_OP_ADD, LIST(sc, mask), LIST(s2));
	reduce_axes(g, node(g, "max", AP_OP_REDUCE_MAX, LIST(s2), LIST(mx)), 3, 1);
	node(g, "sub", AP_OP_SUB, LIST(s2, mx), LIST(d));
	node(g, "exp", AP_OP_EXP, LIST(d), LIST(e));
	reduce_axes(g, node(g, "sum", AP_OP_REDUCE_SUM, LIST(e), LIST(l)), 3, 1);
	node(g, "div", AP_OP_DIV, LIST(e, l), LIST(pr));
	node(g, "pv", AP_OP_MATMUL, LIST(pr, v), LIST(o));
	ap_node_set_ints(g, node(g, "tr", AP_OP_TRANSPOSE, LIST(o), LIST(ot)), "perm", (const int64_t[]){0, 2, 1, 3}, 4);
	output(g, ot);
	if (stats) {
		output(g, s2);
		output(g, mx);
		output(g, l);
	}
	return g;
}

/* The attention emitter's SIMT form (float32), its tensor-core forms
 * (float16, bfloat16 with the statistics, TF32) with head dims the mma
 * shapes do not divide. */
START_TEST(attention)
{
	batch b = {0};

	check_graph(&b, attention_graph(2, 3, 37, 45, 16, 12, false), AP_GROUP_ATTENTION, "attention_f32", false);
	g_dt = AP_DT_F16;
	check_graph(&b, attention_graph(2, 3, 37, 45, 16, 12, false), AP_GROUP_ATTENTION, "attention_f16", false);
	g_dt = AP_DT_BF16;
	check_graph(&b, attention_graph(2, 3, 37, 45, 24, 20, true), AP_GROUP_ATTENTION, "attention_bf16_stats",
		    false);
	check_graph(&b, attention_graph(2, 3, 37, 45, 20, 12, true), AP_GROUP_ATTENTION, "attention_tf32_stats",
		    true);
	batch_done(&b);
	print_tallies("attention");
}
END_TEST

/* A convolution case (check_lower's conv_case): y = act(Conv(x or
 * relu(x), w, b)) (+ r); ns 1 is NCW. */
typedef struct conv_case {
	const char *name;
	int ns;
	int64_t N, C, H, W, M, G, KH, KW, sh, sw, dh, dw;
	int64_t pads[4];                 /* begin h, begin w, end h, end w */
	bool bias, prologue, residual;
	ap_dtype dt;
} conv_case;

static ap_graph *conv_graph(const conv_case *c)
{
	ap_graph *g = ap_graph_new("conv");
	int64_t OH = (c->H + c->pads[0] + c->pads[2] - c->dh * (c->KH - 1) - 1) / c->sh + 1;
	int64_t OW = (c->W + c->pads[1] + c->pads[3] - c->dw * (c->KW - 1) - 1) / c->sw + 1;
	int64_t xd[4] = {c->N, c->C, c->H, c->W}, wd[4] = {c->M, c->C / c->G, c->KH, c->KW}, yd[4] = {c->N, c->M, OH, OW};
	int rank = c->ns + 2, x, w, in[3] = {-1, -1, -1}, y, z, n;

	if (c->ns == 1) {
		xd[2] = c->W;
		wd[2] = c->KW;
		yd[2] = OW;
	}
	g_dt = c->dt;
	x = tensor(g, "x", xd, rank, AP_TENSOR_INPUT);
	w = tensor(g, "w", wd, rank, AP_TENSOR_INPUT);
	in[0] = x;
	in[1] = w;
	if (c->bias)
		in[2] = tensor(g, "b", DIMS(c->M), AP_TENSOR_INPUT);
	if (c->prologue) {
		in[0] = tensor(g, "xr", xd, rank, AP_TENSOR_VALUE);
		node(g, "relu_in", AP_OP_RELU, LIST(x), LIST(in[0]));
	}
	y = tensor(g, "y", yd, rank, AP_TENSOR_VALUE);
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
	z = tensor(g, "z", yd, rank, AP_TENSOR_VALUE);
	node(g, "hswish", AP_OP_HARD_SWISH, LIST(y), LIST(z));
	if (c->residual) {
		int r = tensor(g, "r", yd, rank, AP_TENSOR_INPUT), o = tensor(g, "o", yd, rank, AP_TENSOR_VALUE);

		node(g, "res", AP_OP_ADD, LIST(z, r), LIST(o));
		z = o;
	}
	output(g, z);
	return g;
}

/* Depthwise and grouped convolutions (the depthwise emitter): stride 1
 * with a prologue, bias and residual; stride 2 dilated; 3 groups of 2 in
 * and 4 out channels; 1-D; float16.  Then a dense one (the GEMM
 * emitter's implicit product). */
START_TEST(convolutions)
{
	static const conv_case cases[] = {
		{"depthwise_s1", 2, 2, 3, 13, 19, 3, 3, 3, 3, 1, 1, 1, 1, {1, 0, 2, 1}, true, true, true, AP_DT_F32},
		{"depthwise_s2_dilated", 2, 1, 4, 17, 23, 4, 4, 5, 3, 2, 2, 2, 2, {2, 1, 1, 2}, true, false, false, AP_DT_F32},
		{"grouped_cg2_mg4", 2, 2, 6, 11, 15, 12, 3, 3, 2, 1, 2, 1, 1, {1, 0, 1, 1}, false, false, false, AP_DT_F32},
		{"depthwise_1d", 1, 2, 4, 1, 29, 4, 4, 1, 5, 1, 1, 1, 1, {0, 2, 0, 1}, true, false, false, AP_DT_F32},
		{"depthwise_s1_f16", 2, 2, 3, 13, 19, 3, 3, 3, 3, 1, 1, 1, 1, {1, 0, 2, 1}, true, true, true, AP_DT_F16},
		{"dense_conv", 2, 1, 8, 9, 11, 16, 1, 3, 3, 1, 1, 1, 1, {1, 1, 1, 1}, true, false, false, AP_DT_F32},
	};
	batch b = {0};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		check_graph(&b, conv_graph(&cases[i]), AP_GROUP_CONV, cases[i].name, false);
	batch_done(&b);
	print_tallies("convolutions");
}
END_TEST

/* ---- the models' micro-graphs ------------------------------------------------------------ */

/* Imports DIR/model.onnx with test_data_set_0's inputs as bindings (they
 * give symbolic dimensions their sizes); NULL with a message when it
 * cannot (check_program's import_dir). */
static ap_graph *import_dir(const char *dir)
{
	char path[1024], set[1024];
	uint8_t *buf = NULL;
	size_t len = 0;
	ap_onnx_io *io = NULL;
	ap_host_tensor **ins = NULL, **bind;
	int n_in = 0;
	ap_params *params = NULL;
	ap_graph *g;
	ap_error err;

	snprintf(path, sizeof(path), "%s/model.onnx", dir);
	snprintf(set, sizeof(set), "%s/test_data_set_0", dir);
	if (ap_file_read(path, (size_t)1 << 30, &buf, &len, &err) < 0 || ap_onnx_io_read(buf, len, &io, &err) < 0 ||
	    ap_testdata_load(set, "input", &ins, &n_in, &err) < 0) {
		fprintf(stderr, "check_traffic: %s: %s\n", dir, err.msg);
		free(buf);
		ap_onnx_io_free(io);
		return NULL;
	}
	bind = calloc((size_t)n_in + 1, sizeof(*bind));
	for (int i = 0; i < n_in; i++)
		bind[i] = ap_host_tensor_copy(ins[i], i < io->n_inputs ? io->inputs[i] : NULL);
	g = ap_onnx_import(buf, len, (const ap_host_tensor *const *)bind, n_in, &params, &err);
	if (!g)
		fprintf(stderr, "check_traffic: %s: import: %s\n", dir, err.msg);
	for (int i = 0; i < n_in; i++)
		ap_host_tensor_free(bind[i]);
	ap_host_tensors_free(ins, n_in);
	free(bind);
	ap_params_free(params);
	ap_onnx_io_free(io);
	free(buf);
	return g;
}

/* The micro-graphs a build of g for ti lowers (ap_program_build's stages
 * up to Layer II at level apollo, Layer I off): *n of them, malloc'd. */
static ap_mgraph **model_mgraphs(const ap_graph *g, const ap_target_info *ti, int *n)
{
	ap_error err;
	ap_graph *eg = ap_partition_expand(g, NULL, NULL, &err);
	ap_partition_options po = {.level = AP_FUSE_APOLLO, .target = ti, .no_layer1 = true};
	ap_partition *p;
	ap_mgraph **ms;
	bool *no_stitch;
	unsigned n2;

	ck_assert_msg(eg != NULL, "expand: %s", err.msg);
	p = ap_partition_build(eg, &po, &err);
	ck_assert_msg(p != NULL, "partition: %s", err.msg);
	ms = calloc((size_t)p->n_groups + 1, sizeof(*ms));
	no_stitch = calloc((size_t)p->n_groups + 1, sizeof(bool));
	for (int i = 0; i < p->n_groups; i++) {
		ms[i] = ap_mgraph_of_group(p, i, &err);
		ck_assert_msg(ms[i] != NULL, "micro-graph %d: %s", i, err.msg);
	}
	*n = p->n_groups;
	ck_assert_msg(ap_fuse_stitch(p, &ms, n, no_stitch, ti, &n2, &err) == 0, "layer II: %s", err.msg);
	free(no_stitch);
	ap_partition_free(p);
	ap_graph_free(eg);
	return ms;
}

/* Whether micro-graph m writes nothing (a build launches nothing for it). */
static bool writes_nothing(const ap_mgraph *m)
{
	for (int i = 0; i < m->g->n_outputs; i++)
		if (ap_tensor_numel(&m->g->tensors[m->g->outputs[i]]) != 0)
			return false;
	return true;
}

/* Signatures of the micro-graphs checked so far (ap_tune_signature:
 * structure, shapes, emitter, target): a layer repeated is checked once. */
typedef struct sigset {
	uint8_t (*sig)[32];
	int n, cap;
} sigset;

static bool sig_add(sigset *s, const uint8_t sig[32])
{
	for (int i = 0; i < s->n; i++)
		if (!memcmp(s->sig[i], sig, 32))
			return false;
	if (s->n == s->cap) {
		s->cap = s->cap ? 2 * s->cap : 64;
		s->sig = realloc(s->sig, (size_t)s->cap * sizeof(*s->sig));
		ck_assert_ptr_nonnull(s->sig);
	}
	memcpy(s->sig[s->n++], sig, 32);
	return true;
}

/* Every distinct micro-graph of model folder `rel` at every target, with
 * its registry emitter. */
static void check_model(batch *b, sigset *seen, const char *rel)
{
	char dir[512];
	ap_graph *g;
	int checked = 0, same = 0;

	snprintf(dir, sizeof(dir), "%s/%s", getenv("APOLLO_TESTDATA") ? getenv("APOLLO_TESTDATA") : "../shared/testdata",
		 rel);
	if (access(dir, R_OK) != 0) {
		AP_SKIP("testdata", "check_traffic: %s not found, skipped", dir);
		return;
	}
	g = import_dir(dir);
	ck_assert_msg(g != NULL, "%s: import failed", rel);
	for (int tt = 0; tt <= N_TARGETS; tt++) {
		/* the last round: sm_90 with TF32 (float32 products on tensor cores) */
		int t = tt < N_TARGETS ? tt : N_TARGETS - 1;
		bool tf32 = tt == N_TARGETS;
		ap_target_info ti;
		int n;
		ap_mgraph **ms;

		ck_assert_int_eq(ap_cost_target(g_targets[t], &ti), 0);
		ti.max_threads_per_block = 256;
		ti.allow_tf32 = tf32;
		ms = model_mgraphs(g, &ti, &n);
		for (int i = 0; i < n; i++) {
			ap_bound bd;
			uint8_t sig[32];
			ap_error err;
			char label[160];
			sweep_plan pl = {true};

			ck_assert_int_eq(ap_bind_first(ms[i], &ti, &bd, &err), 0);
			ck_assert_int_eq(ap_tune_signature(bd.em, ms[i], g_targets[t], &ti, 256, sig), 0);
			ap_unbind(&bd);
			if (writes_nothing(ms[i]) || !sig_add(seen, sig)) {
				same += !writes_nothing(ms[i]);
			} else {
				snprintf(label, sizeof(label), "%s #%d (%s)%s", rel, i, ap_group_kind_name(ms[i]->kind),
					 tf32 ? " tf32" : "");
				ck_assert_msg(check_at(b, ms[i], label, t, tf32, false, &pl) > 0,
					      "%s at %s: its emitter builds no configuration", label, g_targets[t]);
				checked++;
			}
			ap_mgraph_free(ms[i]);
		}
		free(ms);
	}
	printf("check_traffic: %s: %d micro-graphs checked at cpu, sm_80, sm_90 and sm_90 with TF32 (%d "
	       "repeated)\n", rel, checked, same);
	ap_graph_free(g);
}

START_TEST(models)
{
	static const char *const dirs[] = {
		"models/bert_like_2l", "models/mlp_gelu_ln", "models/ppocr_mobile_v2_cls",
		"models/silero_vad_op18_ifless", "models/squeezenet1_1", "training/mlp_residual_train",
		"training/prenorm_layer_train", "training/small_convnet_train",
	};
	batch b = {0};
	sigset seen = {0};

	for (size_t d = 0; d < sizeof(dirs) / sizeof(dirs[0]); d++)
		check_model(&b, &seen, dirs[d]);
	batch_done(&b);
	printf("check_traffic: models: %d kernels run, %d the same as one run before, %d too large to run in "
	       "a sampled sweep\n", b.n_run, b.n_same, g_too_large);
	free(seen.sig);
	print_tallies("models");
}
END_TEST

static Suite *traffic_suite(void)
{
	Suite *s = suite_create("traffic");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 1800);   /* APOLLO_SWEEP=full: minutes per test */
	tcase_add_test(tc, pointwise);
	tcase_add_test(tc, reductions);
	tcase_add_test(tc, stitched);
	tcase_add_test(tc, movement);
	tcase_add_test(tc, gemm);
	tcase_add_test(tc, shared_banks);
	tcase_add_test(tc, attention);
	tcase_add_test(tc, convolutions);
	suite_add_tcase(s, tc);
	/* the models' micro-graphs (run alone: CK_RUN_CASE=models) */
	tc = tcase_create("models");
	tcase_set_timeout(tc, 3600);
	tcase_add_test(tc, models);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr;
	int failed;

	const char *cc = getenv("APOLLO_CC");
	char ccbuf[600];

	/* every block through the checker, its shared memory tracked too */
	setenv("APOLLO_HOSTCHECK_ALL_BLOCKS", "1", 1);
	/* the checked kernels count accesses, their speed does not matter:
	 * compiled at -O0 (ten times faster than hostcc's -O3) without the
	 * ISA clones */
	snprintf(ccbuf, sizeof(ccbuf), "%s -O0 -DAP_HOST_ISA=", cc && *cc ? cc : "cc");
	setenv("APOLLO_CC", ccbuf, 1);
	g_survey = getenv("CHECK_TRAFFIC_SURVEY") ? atoi(getenv("CHECK_TRAFFIC_SURVEY")) : 0;
	sr = srunner_create(traffic_suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
