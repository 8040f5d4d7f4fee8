/* layer1.c -- APOLLO's Layer I (MLSys 2022, section 4.1): polyhedral loop
 * fusion inside one micro-graph, with isl.  The only file of Apollo that
 * includes isl (docs/design.md, "Layout").
 *
 * What it fuses.  A window micro-graph (AP_GROUP_WINDOW: a MaxPool or
 * AveragePool with its producers and elementwise consumers) whose pooled
 * tensor P is computed inside the micro-graph.  Inlined, P would be
 * evaluated once per window that covers it (9 times for a 3x3 stride-1
 * pooling, and a convolution producer's whole reduction with it); Layer I
 * instead gives P a statement of its own and fuses the two loop nests at
 * the tile level, PPCG-style: each block computes the footprint of its
 * output tile in P once into shared memory, then the pooling (and its
 * consumers) read it from there.  Tiles overlap only by the window's halo,
 * so P is evaluated (box of a tile / tile's share of P) ~ 1 times per
 * element.  The second kind of window is a global pooling written as a
 * reduction over all spatial axes (GlobalAveragePool, a training step's
 * mean over H and W) of a convolution's output: the iteration space is the
 * reduction's keepdims shape, a tile one (batch, channel) plane, so P never
 * goes to memory.  Outputs of the micro-graph in P's space (the activation
 * a backward pass reads again, SE-blocks' x * gate(pool(x))) are written
 * by S_fill, when isl shows that the tiles' footprints cover P exactly
 * once (exact_cover).
 *
 * The polyhedral model (one per micro-graph):
 *   statements  S_out[i]  one output element of the window's iteration
 *                         space (the pooling, the ops after it, every
 *                         output of the micro-graph in that space);
 *               S_fill[j] one element of P (P's producers, inlined as an
 *                         expression tree, as PPCG and AKG treat them, and
 *                         the outputs in P's space);
 *   domains     boxes from the static shapes;
 *   accesses    S_fill[j] -> P[j] (write), S_out[i] -> P[...] (read):
 *               the read is derived from the index expressions the value
 *               builder makes (server/lower/value.c), translated to isl's
 *               quasi-affine text (+, -, * by constants, floor division,
 *               mod, min, max); loop variables (the pooling window) become
 *               existentially quantified, guards are dropped (a may-read,
 *               an over-approximation), and the range is clipped to P's
 *               domain.  A non-affine index (a Gather's data-dependent one,
 *               a select) makes Layer I refuse.
 *   tiles       parameters p0..p(r-1) are a tile's origin in the output
 *               space; the footprint of a tile is the image of the tile
 *               under the read relation, and its shared-memory buffer is
 *               isl's fixed-size box hull of the footprint
 *               (isl_set_get_simple_fixed_box_hull), with an offset affine
 *               in the parameters -- PPCG's promotion to shared memory.
 *   schedule    a schedule tree: the (thread-mapped) domain, a sequence
 *               [S_fill's band; S_sync, the block's barrier, a statement of
 *               one instance (PPCG's synchronisation); S_out's band].  The
 *               two innermost dimensions of each band are mapped to the
 *               thread grid tx x ty by stride constraints in the domain
 *               (x - offset = tx mod TX), so isl's AST generator prints the
 *               strided loops.  Block mapping is the tile loop around the
 *               AST (grid-stride over the tiles).
 *   legality    dependences by isl's dataflow analysis
 *               (isl_union_access_info_compute_flow) in the block's view
 *               (thread parameters projected out): every read of P must
 *               find its source before it under the schedule (no read left
 *               without a source: the footprint covers the tile), the
 *               dependences must be those of the data order, none may join
 *               two instances of one band (the bands are parallel, mapped
 *               to threads), and S_sync must stand between the sources'
 *               sequence child and the sinks'.
 *   AST -> KIR  isl's AST (for, if, block, mark, user) converted one node
 *               for one node; user statements are built by the value
 *               builder, so both printers (CUDA and host) print every Layer
 *               I kernel and the host target checks it.
 *
 * isl runs with one context per thread (pthread key), ON_ERROR_CONTINUE,
 * and isl_ctx_set_max_operations bounding every plan and emission: a
 * micro-graph over the bound is refused and goes back to the partitioner.
 * The plan keeps only text (isl's own forms of the domain, accesses and
 * schedule tree) and integers, so an emission on another thread parses the
 * schedule again -- and a schedule dumped by `--dump-schedules` replays
 * through the very same path.
 */
#include "fuse.h"

#include <isl/aff.h>
#include <isl/ast.h>
#include <isl/ast_build.h>
#include <isl/ctx.h>
#include <isl/fixed_box.h>
#include <isl/flow.h>
#include <isl/id.h>
#include <isl/map.h>
#include <isl/options.h>
#include <isl/schedule.h>
#include <isl/schedule_node.h>
#include <isl/set.h>
#include <isl/union_map.h>
#include <isl/union_set.h>
#include <isl/val.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lower/emitters.h"

#define L1_MAX_LOOPS 16
#define L1_MAX_READS 8
#define L1_MAX_POUT 8
#define L1_SMEM_CAP ((unsigned)AP_WINDOW_STAGE_BYTES)

struct ap_layer1 {
	int staged;                        /* P: tensor of m->g staged in shared memory */
	int window;                        /* the window node of m->g (ap_node_is_window) */
	int iter;                          /* its output: the space the kernel iterates */
	bool reduce;                       /* the window is a global-pooling reduction: the
					      iteration space is its keepdims shape */
	int n_pout;                        /* outputs in P's space, written by S_fill */
	int pout[L1_MAX_POUT];
	int rank, prank;
	int64_t dims[AP_MAX_RANK], pdims[AP_MAX_RANK];
	int64_t tile[AP_MAX_RANK], ntiles[AP_MAX_RANK];
	int64_t n_tiles;
	int64_t off_c[AP_MAX_RANK];        /* box offset of P's dim d: off_c[d] + sum_e off_a[d][e] p_e */
	int64_t off_a[AP_MAX_RANK][AP_MAX_RANK];
	int64_t box[AP_MAX_RANK];          /* box extent per dim of P */
	int tx, ty;                        /* thread grid (block = tx * ty threads) */
	double recompute;                  /* evaluations of P per element */
	unsigned smem_bytes;
	char *domain, *reads, *writes, *schedule;  /* isl text */
	bool legal;                        /* `schedule` passed check_legal (the plan's own) */
	double isl_ms;
};

/* ---- isl contexts: one per thread ------------------------------------------------- */

static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;

static void ctx_free(void *p)
{
	isl_ctx_free(p);
}

static void ctx_key_init(void)
{
	(void)pthread_key_create(&ctx_key, ctx_free);
}

/* This thread's isl context (created on first use), its operation count
 * reset; NULL on ENOMEM. */
static isl_ctx *thread_ctx(void)
{
	isl_ctx *ctx;

	pthread_once(&ctx_once, ctx_key_init);
	ctx = pthread_getspecific(ctx_key);
	if (!ctx) {
		ctx = isl_ctx_alloc();
		if (!ctx)
			return NULL;
		isl_options_set_on_error(ctx, ISL_ON_ERROR_CONTINUE);
		if (pthread_setspecific(ctx_key, ctx) != 0) {
			isl_ctx_free(ctx);
			return NULL;
		}
	}
	isl_ctx_reset_error(ctx);
	isl_ctx_set_max_operations(ctx, AP_LAYER1_MAX_OPERATIONS);
	isl_ctx_reset_operations(ctx);
	return ctx;
}

static const char *isl_failure(isl_ctx *ctx)
{
	if (isl_ctx_last_error(ctx) == isl_error_quota)
		return "isl exceeded its bound of operations";
	return isl_ctx_last_error_msg(ctx) ? isl_ctx_last_error_msg(ctx) : "isl failed";
}

/* ---- small text builder -------------------------------------------------------------- */

typedef struct tbuf {
	char *s;
	size_t len, cap;
	bool oom;
} tbuf;

static void tb_printf(tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void tb_printf(tbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->oom)
		return;
	for (;;) {
		size_t room = b->cap - b->len;

		va_start(ap, fmt);
		n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? room : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = true;
			return;
		}
		if (b->s && (size_t)n < room) {
			b->len += (size_t)n;
			return;
		}
		{
			size_t ncap = (b->cap ? 2 * b->cap : 256) + (size_t)n + 1;
			char *p = realloc(b->s, ncap);

			if (!p) {
				b->oom = true;
				return;
			}
			b->s = p;
			b->cap = ncap;
		}
	}
}

static void tb_free(tbuf *b)
{
	free(b->s);
	memset(b, 0, sizeof(*b));
}

/* ---- the micro-graph's shape: which window, which tensor to stage ------------------------ */

/* The first window node (a pooling, or a global-pooling reduction) that
 * is a member of m (-1 when none); *count gets how many there are. */
static int find_window(const ap_mgraph *m, int *count)
{
	int first = -1;

	*count = 0;
	for (int i = 0; i < m->g->n_nodes; i++)
		if (m->member[i] && ap_node_is_window(m->g, &m->g->nodes[i]) && (*count)++ == 0)
			first = i;
	return first;
}

/* Marks what output o reads at its own element (ap_v_mark_current):
 * cur[x] 1 there, 2 elsewhere, 0 when computing o never reads x; cur and
 * seen have g->n_tensors + 1 entries, cleared here. */
static void mark_from(const ap_graph *g, int o, unsigned char *cur, unsigned char *seen)
{
	memset(cur, 0, (size_t)g->n_tensors + 1);
	memset(seen, 0, (size_t)g->n_tensors + 1);
	ap_v_mark_current(g, o, false, cur, seen);
}

/* Fills l->window, staged, iter and the shapes.  1 when Layer I applies,
 * 0 (why) when not, AP_ENOMEM. */
static int analyze(const ap_mgraph *m, ap_layer1 *l, char *why, size_t cap)
{
	const ap_graph *g = m->g;
	unsigned char *cur, *seen;
	int rc = 1, n_windows;

	l->window = find_window(m, &n_windows);
	if (n_windows != 1) {
		snprintf(why, cap, n_windows ? "two pooling windows in one micro-graph" : "no pooling window");
		return 0;
	}
	l->reduce = ap_op_category_of(g->nodes[l->window].op) == AP_CAT_REDUCTION;
	l->staged = g->nodes[l->window].inputs[0];
	l->iter = g->nodes[l->window].outputs[0];
	if (l->staged < 0 || l->iter < 0 || g->tensors[l->staged].producer < 0) {
		snprintf(why, cap, "the pooled tensor is read from memory: nothing to stage");
		return 0;
	}
	l->prank = g->tensors[l->staged].rank;
	l->rank = l->prank;
	if (l->prank < 3 || (!l->reduce && g->tensors[l->iter].rank != l->prank)) {
		snprintf(why, cap, "a pooling of rank %d", g->tensors[l->iter].rank);
		return 0;
	}
	memcpy(l->pdims, g->tensors[l->staged].dims, sizeof(l->pdims));
	if (l->reduce) {
		/* the keepdims shape: N, C, then 1 per reduced (spatial) axis */
		memcpy(l->dims, l->pdims, sizeof(l->dims));
		for (int d = 2; d < l->prank; d++)
			l->dims[d] = 1;
	} else {
		memcpy(l->dims, g->tensors[l->iter].dims, sizeof(l->dims));
	}
	cur = calloc((size_t)g->n_tensors + 1, 1);
	seen = calloc((size_t)g->n_tensors + 1, 1);
	if (!cur || !seen) {
		free(cur);
		free(seen);
		return AP_ENOMEM;
	}
	/* every output lies in the window's iteration space (it reads the
	 * window's result at its own element), or in P's (it does not read
	 * the window's result and reads P at its own element: S_fill writes
	 * it, once the tiles are known to cover P exactly once) */
	for (int i = 0; i < g->n_outputs && rc == 1; i++) {
		int o = g->outputs[i];
		int64_t n = ap_tensor_numel(&g->tensors[o]);

		mark_from(g, o, cur, seen);
		if (n == ap_tensor_numel(&g->tensors[l->iter]) && cur[l->iter]) {
			if (cur[l->iter] != 1) {
				snprintf(why, cap, "output %s reads the pooling at another element than its own",
					 g->tensors[o].name);
				rc = 0;
			}
		} else if (n == ap_tensor_numel(&g->tensors[l->staged]) && !cur[l->iter] &&
			   cur[l->staged] == 1) {
			if (l->n_pout == L1_MAX_POUT) {
				snprintf(why, cap, "more than %d outputs beside the pooling", L1_MAX_POUT);
				rc = 0;
			} else {
				l->pout[l->n_pout++] = o;
			}
		} else {
			snprintf(why, cap, "output %s is neither in the window's iteration space nor in the "
				 "pooled tensor's", g->tensors[o].name);
			rc = 0;
		}
	}
	free(cur);
	free(seen);
	return rc;
}

static bool is_pout(const ap_layer1 *l, int t)
{
	for (int i = 0; i < l->n_pout; i++)
		if (l->pout[i] == t)
			return true;
	return false;
}

/* The window's output seen through the iteration space's shape (the
 * keepdims shape of a reduction window) at coordinates c. */
static ap_lidx iter_index(ap_vctx *v, const ap_layer1 *l, ap_kir_expr *const *c)
{
	ap_lidx ix;

	memset(&ix, 0, sizeof(ix));
	ix.rank = l->rank;
	for (int d = 0; d < l->rank; d++) {
		ix.dims[d] = l->dims[d];
		ix.c[d] = c[d];
	}
	return l->reduce ? ap_lidx_relin(v, &ix, l->iter) : ix;
}

/* ---- read accesses: the value builder's index expressions in isl's text --------------- */

typedef struct probe {
	int staged;
	int n_reads;
	ap_kir_expr *reads[L1_MAX_READS][AP_MAX_RANK];
	bool overflow;
	ap_kir_var *it[AP_MAX_RANK];       /* S_out's coordinates */
	int rank;
	/* loops and let-bound registers of the probe kernel */
	int n_loops;
	const ap_kir_stmt *loops[L1_MAX_LOOPS];
	int n_lets;
	const ap_kir_stmt **lets;
	int cap_lets;
} probe;

static ap_kir_expr *probe_leaf(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	probe *p = user;

	if (t != p->staged)
		return NULL;
	if (p->n_reads == L1_MAX_READS) {
		p->overflow = true;
	} else {
		for (int d = 0; d < ix->rank; d++)
			p->reads[p->n_reads][d] = ap_lidx_coord(v, ix, d);
		p->n_reads++;
	}
	return ap_kir_const(v->k, v->g->tensors[t].dtype, 0);
}

static int probe_stmt(const ap_kir_stmt *s, int depth, void *user)
{
	probe *p = user;

	(void)depth;
	if (s->kind == AP_KIR_S_FOR) {
		if (p->n_loops == L1_MAX_LOOPS)
			return 1;
		p->loops[p->n_loops++] = s;
	} else if (s->kind == AP_KIR_S_LET && s->value) {
		if (p->n_lets == p->cap_lets) {
			int ncap = p->cap_lets ? 2 * p->cap_lets : 64;
			const ap_kir_stmt **q = realloc(p->lets, (size_t)ncap * sizeof(*q));

			if (!q)
				return AP_ENOMEM;
			p->lets = q;
			p->cap_lets = ncap;
		}
		p->lets[p->n_lets++] = s;
	}
	return 0;
}

/* Writes e as an isl quasi-affine expression over i0.. (S_out's
 * coordinates) and l0.. (the probe's loop variables).  False when e is not
 * quasi-affine. */
static bool aff_text(const probe *p, const ap_kir_expr *e, tbuf *b, int depth)
{
	int64_t c;

	if (!e || depth > 64)
		return false;
	switch (e->kind) {
	case AP_KIR_E_INT:
		tb_printf(b, "(%lld)", (long long)e->ival);
		return true;
	case AP_KIR_E_CAST:
		return !ap_kir_is_float_type(e->type) && !ap_kir_is_float_type(e->a->type) && aff_text(p, e->a, b, depth + 1);
	case AP_KIR_E_VAR:
		for (int d = 0; d < p->rank; d++)
			if (e->var == p->it[d]) {
				tb_printf(b, "i%d", d);
				return true;
			}
		for (int j = 0; j < p->n_loops; j++)
			if (e->var == p->loops[j]->var) {
				tb_printf(b, "l%d", j);
				return true;
			}
		for (int j = 0; j < p->n_lets; j++)
			if (e->var == p->lets[j]->var)
				return aff_text(p, p->lets[j]->value, b, depth + 1);
		return false;
	case AP_KIR_E_UNARY:
		if (e->op != AP_KIR_NEG)
			return false;
		tb_printf(b, "(-");
		if (!aff_text(p, e->a, b, depth + 1))
			return false;
		tb_printf(b, ")");
		return true;
	case AP_KIR_E_BINARY:
		switch (e->op) {
		case AP_KIR_ADD: case AP_KIR_SUB: case AP_KIR_MIN: case AP_KIR_MAX:
			tb_printf(b, e->op == AP_KIR_MIN ? "min(" : e->op == AP_KIR_MAX ? "max(" : "(");
			if (!aff_text(p, e->a, b, depth + 1))
				return false;
			tb_printf(b, "%s", e->op == AP_KIR_ADD ? " + " : e->op == AP_KIR_SUB ? " - " : ", ");
			if (!aff_text(p, e->b, b, depth + 1))
				return false;
			tb_printf(b, ")");
			return true;
		case AP_KIR_MUL:
			if (ap_kir_is_int(e->b, &c)) {
				tb_printf(b, "(%lld * ", (long long)c);
				if (!aff_text(p, e->a, b, depth + 1))
					return false;
			} else if (ap_kir_is_int(e->a, &c)) {
				tb_printf(b, "(%lld * ", (long long)c);
				if (!aff_text(p, e->b, b, depth + 1))
					return false;
			} else {
				return false;
			}
			tb_printf(b, ")");
			return true;
		case AP_KIR_DIV: case AP_KIR_FLOORDIV: case AP_KIR_REM:
			/* index arithmetic divides non-negative linear indices
			 * (relinearisations), where C's / and % are floor and mod */
			if (!ap_kir_is_int(e->b, &c) || c <= 0)
				return false;
			tb_printf(b, e->op == AP_KIR_REM ? "((" : "floor((");
			if (!aff_text(p, e->a, b, depth + 1))
				return false;
			if (e->op == AP_KIR_REM)
				tb_printf(b, ") mod %lld)", (long long)c);
			else
				tb_printf(b, ")/%lld)", (long long)c);
			return true;
		default:
			return false;
		}
	default:
		return false;
	}
}

static void dims_text(tbuf *b, const char *prefix, int n)
{
	for (int d = 0; d < n; d++)
		tb_printf(b, "%s%s%d", d ? ", " : "", prefix, d);
}

static void params_text(tbuf *b, int rank)
{
	tb_printf(b, "[");
	dims_text(b, "p", rank);
	tb_printf(b, "]");
}

/* The read relation { S_out[i] -> P[o] } as text, clipped to P's domain.
 * 1, 0 (why: not affine), AP_ENOMEM. */
static int reads_text(const ap_mgraph *m, ap_layer1 *l, tbuf *out, char *why, size_t cap)
{
	const ap_graph *g = m->g;
	ap_kir_kernel *k = ap_kir_kernel_new("probe");
	ap_error err;
	ap_vctx v;
	probe p;
	ap_lidx ix;
	ap_kir_visitor vis = {probe_stmt, NULL};
	int rc = 1;

	memset(&p, 0, sizeof(p));
	ap_error_clear(&err);
	if (!k)
		return AP_ENOMEM;
	k->index_type = ap_index_type_for(g);
	if (ap_vctx_init(&v, m, k, &err)) {
		ap_kir_kernel_free(k);
		return AP_ENOMEM;
	}
	p.staged = l->staged;
	p.rank = l->rank;
	v.leaf = probe_leaf;
	v.leaf_user = &p;
	{
		ap_kir_expr *c[AP_MAX_RANK];

		for (int d = 0; d < l->rank; d++) {
			p.it[d] = ap_kir_var_new(k, k->index_type, "i");
			c[d] = ap_kir_ref(k, p.it[d]);
		}
		ix = iter_index(&v, l, c);
	}
	(void)ap_val(&v, l->iter, &ix);
	if (v.rc || ap_kir_failed(k)) {
		rc = v.rc == AP_ENOMEM || ap_kir_failed(k) ? AP_ENOMEM : 0;
		snprintf(why, cap, "the window cannot be built: %s", err.msg);
		goto out;
	}
	if ((rc = ap_kir_visit(k, &vis, &p)) != 0) {
		if (rc != AP_ENOMEM) {
			snprintf(why, cap, "more than %d loops around the reads of the pooled tensor",
				 L1_MAX_LOOPS);
			rc = 0;
		}
		goto out;
	}
	rc = 1;
	if (p.overflow || p.n_reads == 0) {
		snprintf(why, cap, "%d reads of the pooled tensor", p.n_reads);
		rc = 0;
		goto out;
	}
	tb_printf(out, "{ ");
	for (int r = 0; r < p.n_reads && rc == 1; r++) {
		tb_printf(out, "%sS_out[", r ? "; " : "");
		dims_text(out, "i", l->rank);
		tb_printf(out, "] -> P[");
		dims_text(out, "o", l->prank);
		tb_printf(out, "] : ");
		for (int d = 0; d < l->rank; d++)
			tb_printf(out, "0 <= i%d < %lld and ", d, (long long)l->dims[d]);
		for (int d = 0; d < l->prank; d++)
			tb_printf(out, "0 <= o%d < %lld and ", d, (long long)l->pdims[d]);
		if (p.n_loops) {
			tb_printf(out, "exists (");
			dims_text(out, "l", p.n_loops);
			tb_printf(out, " : ");
			for (int j = 0; j < p.n_loops; j++) {
				tb_printf(out, "%s", j ? " and " : "");
				if (!aff_text(&p, p.loops[j]->lo, out, 0)) {
					rc = 0;
					break;
				}
				tb_printf(out, " <= l%d < ", j);
				if (!aff_text(&p, p.loops[j]->hi, out, 0)) {
					rc = 0;
					break;
				}
			}
			tb_printf(out, " and ");
		}
		for (int d = 0; d < l->prank && rc == 1; d++) {
			tb_printf(out, "%so%d = ", d ? " and " : "", d);
			if (!aff_text(&p, p.reads[r][d], out, 0))
				rc = 0;
		}
		if (p.n_loops)
			tb_printf(out, ")");
	}
	tb_printf(out, " }");
	if (rc == 0)
		snprintf(why, cap, "a read of the pooled tensor %s is not affine",
			 g->tensors[l->staged].name);
	if (out->oom)
		rc = AP_ENOMEM;
out:
	free(p.lets);
	ap_vctx_clear(&v);
	ap_kir_kernel_free(k);
	return rc;
}

/* ---- tiles ---------------------------------------------------------------------------- */

/* Elements of P's dimension of extent D that ntile tiles of T outputs fill
 * in all, each [t T s - pb, last output's window end) clipped to [0, D). */
static int64_t dim_fill(int64_t O, int64_t D, int64_t T, int64_t s, int64_t pb, int64_t K, int64_t dil)
{
	int64_t sum = 0;

	for (int64_t o0 = 0; o0 < O; o0 += T) {
		int64_t o1 = o0 + T < O ? o0 + T : O;
		int64_t lo = o0 * s - pb, hi = (o1 - 1) * s - pb + (K - 1) * dil + 1;

		lo = lo < 0 ? 0 : lo;
		hi = hi > D ? D : hi;
		sum += hi > lo ? hi - lo : 0;
	}
	return sum;
}

/* The window's stride, begin pad, kernel extent and dilation along the two
 * innermost output dimensions (attr[q]: q = 0 rows, 1 columns). */
static void window_attrs(const ap_graph *g, const ap_layer1 *l, int64_t attr[2][4])
{
	const ap_node *w = &g->nodes[l->window];
	int r = l->rank, ns = r - 2;

	for (int q = 0; q < 2; q++) {
		int sd = ns - 2 + q;   /* spatial index of output dim r-2+q */

		if (sd < 0 || l->reduce) {
			attr[q][0] = 1, attr[q][1] = 0, attr[q][3] = 1;
			attr[q][2] = sd >= 0 ? l->pdims[r - 2 + q] : 1;
			continue;
		}
		attr[q][0] = ap_node_attr_at(w, "strides", sd, 1);
		attr[q][1] = ap_node_attr_at(w, "pads", sd, 0);
		attr[q][2] = ap_node_attr_at(w, "kernel_shape", sd, 1);
		attr[q][3] = ap_node_attr_at(w, "dilations", sd, 1);
	}
}

static unsigned smem_cap_of(const ap_target_info *t)
{
	return t->shared_per_block < L1_SMEM_CAP ? t->shared_per_block : L1_SMEM_CAP;
}

/* The staged box's two innermost extents for tile th x tw (a reduction
 * window: its whole plane), and its bytes (a reduction window: tw
 * channels of whole planes, th unused). */
static uint64_t tile_box(const ap_graph *g, const ap_layer1 *l, int64_t th, int64_t tw, int64_t *bh,
			 int64_t *bw)
{
	int r = l->rank;
	uint64_t es = ap_dtype_size(g->tensors[l->staged].dtype);
	int64_t attr[2][4];

	if (l->reduce) {
		uint64_t plane = 1;

		for (int d = 2; d < r; d++)
			plane *= (uint64_t)l->pdims[d];
		*bh = l->pdims[r - 2];
		*bw = l->pdims[r - 1];
		return plane * (uint64_t)tw * es;
	}
	window_attrs(g, l, attr);
	*bh = (th - 1) * attr[0][0] + (attr[0][2] - 1) * attr[0][3] + 1;
	*bw = (tw - 1) * attr[1][0] + (attr[1][2] - 1) * attr[1][3] + 1;
	return (uint64_t)(*bh * *bw) * es;
}

static uint64_t tile_box_bytes(const ap_graph *g, const ap_layer1 *l, int64_t th, int64_t tw)
{
	int64_t bh, bw;

	return tile_box(g, l, th, tw, &bh, &bw);
}

/* The thread grid of a box bh x bw: a thread per column up to a warp, rows
 * up to `threads` in all, at least a warp. */
static void thread_grid(int64_t bh, int64_t bw, unsigned threads, int *tx, int *ty)
{
	*tx = (int)ap_pow2_at_least(bw, 1, 32);
	*ty = (int)ap_pow2_at_least(bh, 1, threads / (unsigned)*tx);
	if (*tx * *ty < 32 && *tx < 32)
		*tx = 32 / *ty > *tx ? 32 / *ty : *tx;
}

/* Evaluations of P per element with tile th x tw (1 for a reduction
 * window: planes are whole). */
static double tile_ratio(const ap_graph *g, const ap_layer1 *l, int64_t th, int64_t tw)
{
	int r = l->rank;
	int64_t attr[2][4], fh, fw;

	if (l->reduce)
		return 1.0;
	window_attrs(g, l, attr);
	fh = dim_fill(l->dims[r - 2], l->pdims[r - 2], th, attr[0][0], attr[0][1], attr[0][2], attr[0][3]);
	fw = dim_fill(l->dims[r - 1], l->pdims[r - 1], tw, attr[1][0], attr[1][1], attr[1][2], attr[1][3]);
	return (double)fh * (double)fw / ((double)l->pdims[r - 2] * (double)l->pdims[r - 1]);
}

/* Sets the tile: th x tw of the two innermost output dimensions, or tw
 * channels of whole planes for a reduction window; its recompute ratio
 * and tile counts. */
static void set_tile(const ap_graph *g, ap_layer1 *l, int64_t th, int64_t tw)
{
	int r = l->rank;

	for (int d = 0; d < r; d++)
		l->tile[d] = 1;
	if (l->reduce) {
		l->tile[1] = tw;
	} else {
		l->tile[r - 2] = th;
		l->tile[r - 1] = tw;
	}
	l->recompute = tile_ratio(g, l, th, tw);
	l->n_tiles = 1;
	for (int d = 0; d < r; d++) {
		l->ntiles[d] = (l->dims[d] + l->tile[d] - 1) / l->tile[d];
		l->n_tiles *= l->ntiles[d];
	}
}

/* Row heights and column widths a tile may take: powers of two, then the
 * whole extent (clipped to it, without repeats); a reduction window's
 * channel counts.  Returns how many (<= AP_KNOB_MAX_VALUES). */
static const int64_t tile_ths[] = {1, 2, 4, 8, 16, 32, 64};
static const int64_t tile_tws[] = {8, 16, 32, 64};

static int add_value(int64_t *v, int n, int64_t x)
{
	for (int i = 0; i < n; i++)
		if (v[i] == x)
			return n;
	if (n < AP_KNOB_MAX_VALUES)
		v[n++] = x;
	return n;
}

static int tile_values(const ap_layer1 *l, int q, int64_t *v)
{
	int r = l->rank, n = 0;
	int64_t ext = l->dims[r - 2 + q];

	if (l->reduce) {
		static const int64_t planes[] = {1, 2, 4, 8, 16, 32};

		for (size_t i = 0; i < sizeof(planes) / sizeof(planes[0]); i++)
			if (planes[i] <= l->pdims[1])
				n = add_value(v, n, planes[i]);
		return n;
	}
	if (q == 0) {
		for (size_t i = 0; i < sizeof(tile_ths) / sizeof(tile_ths[0]); i++)
			if (tile_ths[i] <= ext)
				n = add_value(v, n, tile_ths[i]);
	} else {
		for (size_t i = 0; i < sizeof(tile_tws) / sizeof(tile_tws[0]); i++)
			n = add_value(v, n, tile_tws[i] < ext ? tile_tws[i] : ext);
	}
	return add_value(v, n, ext);
}

/* The default rule's tile.  Of the two innermost output dimensions: the
 * tile whose staged box fits L1_SMEM_CAP (and the target) and recomputes
 * least, then the smaller (more blocks).  A reduction window's iteration
 * space has extent 1 there: its one tile's window is the whole plane, and
 * it stages as many channels as fit (at most 32, each reduced by a thread
 * of its own in S_out) but no fewer tiles (blocks) than the target has SMs
 * while the planes allow.  False when no tile fits. */
static bool choose_tile(const ap_graph *g, ap_layer1 *l, const ap_target_info *t)
{
	int r = l->rank;
	unsigned smem_cap = smem_cap_of(t);
	double best = 1e300;
	int64_t bth = 1, btw = 1;

	if (l->reduce) {
		int64_t tc, planes = l->pdims[0] * l->pdims[1];
		int64_t want = planes < (int64_t)t->sm_count ? planes : (int64_t)t->sm_count;

		tc = (int64_t)(smem_cap / tile_box_bytes(g, l, 1, 1));
		tc = tc > 32 ? 32 : tc > l->pdims[1] ? l->pdims[1] : tc;
		if (tc < 1)
			return false;
		while (tc > 1 && l->pdims[0] * ((l->pdims[1] + tc - 1) / tc) < want)
			tc--;
		set_tile(g, l, 1, tc);
		return true;
	}
	/* powers of two, then the whole extent */
	for (size_t a = 0; a < sizeof(tile_ths) / sizeof(tile_ths[0]) + 1; a++) {
		for (size_t b = 0; b < sizeof(tile_tws) / sizeof(tile_tws[0]) + 1; b++) {
			int64_t th = a < sizeof(tile_ths) / sizeof(tile_ths[0]) ? tile_ths[a] : l->dims[r - 2];
			int64_t tw = b < sizeof(tile_tws) / sizeof(tile_tws[0]) ? tile_tws[b] : l->dims[r - 1];
			double ratio, score;

			if (th > l->dims[r - 2] && a > 0)
				continue;
			if (tw > l->dims[r - 1])
				tw = l->dims[r - 1];
			th = th > l->dims[r - 2] ? l->dims[r - 2] : th;
			if (tile_box_bytes(g, l, th, tw) > smem_cap)
				continue;
			ratio = tile_ratio(g, l, th, tw);
			/* a tile smaller than a warp's row wastes threads: a mild preference */
			score = ratio + (tw * th < 64 ? 0.05 : 0) + 1e-4 * (double)(th * tw) / 4096.0;
			if (score < best) {
				best = score;
				bth = th;
				btw = tw;
			}
		}
	}
	if (best < 1e300)
		set_tile(g, l, bth, btw);
	return best < 1e300;
}

/* ---- sets and the schedule tree as isl text ---------------------------------------------------- */

/* The tile of origin p in S_out's space, as constraints. */
static void tile_constraints(tbuf *b, const ap_layer1 *l)
{
	for (int d = 0; d < l->rank; d++)
		tb_printf(b, "%sp%d <= i%d < p%d + %lld and i%d < %lld", d ? " and " : "", d, d, d,
			  (long long)l->tile[d], d, (long long)l->dims[d]);
}

/* The context: tile origins and thread indices in range. */
static void context_text(tbuf *b, const ap_layer1 *l)
{
	params_text(b, l->rank);
	tb_printf(b, " -> { : ");
	for (int d = 0; d < l->rank; d++)
		tb_printf(b, "%s0 <= p%d < %lld and exists (e%d : p%d = %lld e%d)", d ? " and " : "", d,
			  (long long)l->dims[d], d, d, (long long)l->tile[d], d);
	tb_printf(b, " }");
}

/* A band over dimensions dims[0..n) of statement `stmt` (coordinates `v`). */
static void band_text(tbuf *b, const ap_layer1 *l, const char *stmt, const char *v, const int *dims,
		      int n)
{
	tb_printf(b, "{ schedule: \"");
	params_text(b, l->rank);
	tb_printf(b, " -> [");
	for (int q = 0; q < n; q++) {
		tb_printf(b, "%s{ %s[", q ? ", " : "", stmt);
		dims_text(b, v, l->rank);
		tb_printf(b, "] -> [(%s%d)] }", v, dims[q]);
	}
	tb_printf(b, "]\", coincident: [");
	for (int q = 0; q < n; q++)
		tb_printf(b, "%s1", q ? ", " : "");
	tb_printf(b, "]");
}

/* A statement's bands: the outer dimensions, a mark, and the dimensions
 * the kernel maps to threads: under "threads" the two innermost, to the
 * thread grid ty, tx; under "threads1" (a reduction window's S_out, whose
 * spatial dimensions have extent 1) the channel dimension alone, to the
 * block's threads in a row, so that each thread reduces planes of its own. */
static void bands_text(tbuf *b, const ap_layer1 *l, const char *stmt, const char *v)
{
	int r = l->rank, outer[AP_MAX_RANK], inner[2], n = 0, n_in = 2;
	bool planes = l->reduce && !strcmp(stmt, "S_out");

	for (int d = 0; d < r; d++)
		if (planes ? d != 1 : d < r - 2)
			outer[n++] = d;
	inner[0] = planes ? 1 : r - 2;
	inner[1] = r - 1;
	if (planes)
		n_in = 1;
	band_text(b, l, stmt, v, outer, n);
	tb_printf(b, ", child: { mark: \"%s\", child: ", planes ? "threads1" : "threads");
	band_text(b, l, stmt, v, inner, n_in);
	tb_printf(b, " } } }");
}

/* The schedule tree (isl's YAML form) over the domain text: S_fill's
 * bands, the block barrier S_sync, S_out's bands. */
static void schedule_text(tbuf *b, const ap_layer1 *l, const char *domain)
{
	tb_printf(b, "{ domain: \"%s\", child: { sequence: [ { filter: \"{ S_fill[", domain);
	dims_text(b, "j", l->rank);
	tb_printf(b, "] }\", child: ");
	bands_text(b, l, "S_fill", "j");
	tb_printf(b, " }, { filter: \"{ S_sync[] }\" }, { filter: \"{ S_out[");
	dims_text(b, "i", l->rank);
	tb_printf(b, "] }\", child: ");
	bands_text(b, l, "S_out", "i");
	tb_printf(b, " } ] } }");
}

/* ---- legality ------------------------------------------------------------------------------ */

static __isl_give isl_union_map *flow_deps(__isl_keep isl_union_map *sink,
					   __isl_keep isl_union_map *source,
					   __isl_take isl_union_map *sched, isl_union_map **no_source)
{
	isl_union_access_info *ai = isl_union_access_info_from_sink(isl_union_map_copy(sink));
	isl_union_flow *flow;
	isl_union_map *dep;

	ai = isl_union_access_info_set_must_source(ai, isl_union_map_copy(source));
	ai = isl_union_access_info_set_schedule_map(ai, sched);
	flow = isl_union_access_info_compute_flow(ai);
	dep = isl_union_flow_get_may_dependence(flow);
	if (no_source)
		*no_source = isl_union_flow_get_may_no_source(flow);
	isl_union_flow_free(flow);
	return dep;
}

/* What filter child k of a sequence holds: bit 0 sources (S_fill), bit 1
 * sinks (S_out), bit 2 the barrier (S_sync); -1 on failure. */
static int child_holds(__isl_keep isl_schedule_node *seq, int k)
{
	isl_schedule_node *f = isl_schedule_node_get_child(seq, k);
	isl_union_set *filt = f && isl_schedule_node_get_type(f) == isl_schedule_node_filter
			      ? isl_schedule_node_filter_get_filter(f) : NULL;
	isl_set_list *sets = filt ? isl_union_set_get_set_list(filt) : NULL;
	isl_size n = sets ? isl_set_list_size(sets) : -1;
	int bits = n < 0 ? -1 : 0;

	for (int i = 0; i < n; i++) {
		isl_set *st = isl_set_list_get_at(sets, i);
		const char *name = st ? isl_set_get_tuple_name(st) : NULL;

		if (name && !strcmp(name, "S_fill"))
			bits |= 1;
		else if (name && !strcmp(name, "S_out"))
			bits |= 2;
		else if (name && !strcmp(name, "S_sync"))
			bits |= 4;
		isl_set_free(st);
	}
	isl_set_list_free(sets);
	isl_union_set_free(filt);
	isl_schedule_node_free(f);
	return bits;
}

/* Checks schedule `s` (thread view) against the micro-graph's model: it
 * covers exactly the expected statement instances, every read of P finds
 * its source before it, the dependences are those of the data order,
 * none lies inside a band (mapped to parallel threads), and each sink's
 * sequence child starts with a barrier.  0, or -1 with why. */
static int check_legal(isl_ctx *ctx, const ap_layer1 *l, __isl_keep isl_schedule *s, char *why,
		       size_t cap)
{
	isl_union_set *dom = isl_union_set_read_from_str(ctx, l->domain);
	isl_union_set *sdom = isl_schedule_get_domain(s);
	isl_union_map *reads = isl_union_map_read_from_str(ctx, l->reads);
	isl_union_map *writes = isl_union_map_read_from_str(ctx, l->writes);
	isl_union_map *sink, *source, *sched, *ref, *dep = NULL, *dep_ref = NULL;
	isl_union_map *no_src = NULL;
	isl_union_set *bdom;
	isl_schedule_node *root = NULL, *seq = NULL;
	tbuf t = {0};
	int rc = -1;

	if (!dom || !sdom || !reads || !writes) {
		snprintf(why, cap, "%s", isl_failure(ctx));
		goto out;
	}
	if (isl_union_set_is_equal(dom, sdom) != isl_bool_true) {
		snprintf(why, cap, "the schedule covers other statement instances than the micro-graph's");
		goto out;
	}
	/* the block's instances (the bands are mapped to threads later) */
	bdom = isl_union_set_copy(dom);
	sink = isl_union_map_intersect_domain(isl_union_map_copy(reads), isl_union_set_copy(bdom));
	source = isl_union_map_intersect_domain(isl_union_map_copy(writes), isl_union_set_copy(bdom));
	sched = isl_schedule_get_map(s);
	dep = flow_deps(sink, source, sched, &no_src);
	/* the data order: every S_fill before every S_out */
	tb_printf(&t, "{ S_fill[");
	dims_text(&t, "j", l->rank);
	tb_printf(&t, "] -> [0, ");
	dims_text(&t, "j", l->rank);
	tb_printf(&t, "]; S_sync[] -> [1, ");
	for (int d = 0; d < l->rank; d++)
		tb_printf(&t, "%s0", d ? ", " : "");
	tb_printf(&t, "]; S_out[");
	dims_text(&t, "i", l->rank);
	tb_printf(&t, "] -> [2, ");
	dims_text(&t, "i", l->rank);
	tb_printf(&t, "] }");
	ref = t.oom ? NULL : isl_union_map_read_from_str(ctx, t.s);
	ref = isl_union_map_intersect_domain(ref, isl_union_set_copy(bdom));
	dep_ref = flow_deps(sink, source, ref, NULL);
	isl_union_map_free(sink);
	isl_union_map_free(source);
	isl_union_set_free(bdom);
	if (!dep || !dep_ref || !no_src) {
		snprintf(why, cap, "%s", isl_failure(ctx));
		goto out;
	}
	if (isl_union_map_is_empty(no_src) != isl_bool_true) {
		snprintf(why, cap, "illegal schedule: a read of the staged tensor has no write before it "
				   "(the footprint does not cover the tile, or the order is reversed)");
		goto out;
	}
	if (isl_union_map_is_equal(dep, dep_ref) != isl_bool_true) {
		snprintf(why, cap, "illegal schedule: it changes the dependences of the data order");
		goto out;
	}
	{
		isl_union_map *same = isl_union_map_intersect_range(
			isl_union_map_copy(dep),
			isl_union_map_domain(isl_union_map_copy(dep)));
		isl_bool empty = isl_union_map_is_empty(same);

		isl_union_map_free(same);
		if (empty != isl_bool_true) {
			snprintf(why, cap, "illegal schedule: a dependence inside a thread-parallel band");
			goto out;
		}
	}
	root = isl_schedule_get_root(s);
	seq = root && isl_schedule_node_has_children(root) == isl_bool_true
	      ? isl_schedule_node_get_child(root, 0) : NULL;
	if (!seq || isl_schedule_node_get_type(seq) != isl_schedule_node_sequence) {
		snprintf(why, cap, "illegal schedule: expected a sequence under the domain");
		goto out;
	}
	{
		/* the writes of the stage and its reads in distinct children,
		 * the barrier statement between them */
		isl_size n = isl_schedule_node_n_children(seq);
		int src = -1, snk = -1, bar = -1;

		for (int k = 0; k < n; k++) {
			int bits = child_holds(seq, k);

			if (bits < 0 || (bits & 3) == 3) {
				src = snk = -1;
				break;
			}
			if ((bits & 1) && src < 0)
				src = k;
			if ((bits & 2) && snk < 0)
				snk = k;
			if ((bits & 4) && src >= 0 && snk < 0)
				bar = k;
		}
		if (src < 0 || snk < 0 || bar < 0 || !(src < bar && bar < snk)) {
			snprintf(why, cap, "illegal schedule: no barrier between the staged tile's writes "
					   "and its reads");
			goto out;
		}
	}
	rc = 0;
out:
	tb_free(&t);
	isl_schedule_node_free(seq);
	isl_schedule_node_free(root);
	isl_union_map_free(no_src);
	isl_union_map_free(dep);
	isl_union_map_free(dep_ref);
	isl_union_map_free(reads);
	isl_union_map_free(writes);
	isl_union_set_free(sdom);
	isl_union_set_free(dom);
	return rc;
}

/* ---- planning ------------------------------------------------------------------------------ */

ap_layer1 *ap_fuse_layer1_free(ap_layer1 *l)
{
	if (l) {
		free(l->domain);
		free(l->reads);
		free(l->writes);
		free(l->schedule);
		free(l);
	}
	return NULL;
}

static char *take(tbuf *b)
{
	char *s = b->oom ? NULL : b->s;

	if (!s)
		free(b->s);
	memset(b, 0, sizeof(*b));
	return s;
}

/* Integer value of an isl_val (false when not an integer). */
static bool val_int(__isl_take isl_val *v, int64_t *out)
{
	bool ok = v && isl_val_is_int(v) == isl_bool_true;

	if (ok)
		*out = isl_val_get_num_si(v);
	isl_val_free(v);
	return ok;
}

/* The footprint of a tile and its box (offsets, sizes) by isl. */
static int box_of(isl_ctx *ctx, ap_layer1 *l, char *why, size_t cap)
{
	tbuf t = {0};
	isl_set *tile;
	isl_map *rd;
	isl_set *fp;
	isl_fixed_box *box = NULL;
	isl_multi_aff *off = NULL;
	isl_multi_val *size = NULL;
	int rc = -1;

	params_text(&t, l->rank);
	tb_printf(&t, " -> { S_out[");
	dims_text(&t, "i", l->rank);
	tb_printf(&t, "] : ");
	tile_constraints(&t, l);
	tb_printf(&t, " }");
	if (t.oom)
		return AP_ENOMEM;
	tile = isl_set_read_from_str(ctx, t.s);
	tb_free(&t);
	rd = isl_map_from_union_map(isl_union_map_read_from_str(ctx, l->reads));
	fp = isl_set_apply(tile, rd);
	box = fp ? isl_set_get_simple_fixed_box_hull(fp) : NULL;
	isl_set_free(fp);
	if (!box || isl_fixed_box_is_valid(box) != isl_bool_true) {
		snprintf(why, cap, "the footprint of a tile has no fixed-size box (%s)",
			 box ? "unbounded" : isl_failure(ctx));
		goto out;
	}
	off = isl_fixed_box_get_offset(box);
	size = isl_fixed_box_get_size(box);
	for (int d = 0; d < l->prank; d++) {
		isl_aff *a = isl_multi_aff_get_aff(off, d);
		isl_val *den = a ? isl_aff_get_denominator_val(a) : NULL;
		int64_t dv = 0;
		bool ok = val_int(den, &dv) && dv == 1 && val_int(isl_aff_get_constant_val(a), &l->off_c[d]);

		for (int e = 0; ok && e < l->rank; e++)
			ok = val_int(isl_aff_get_coefficient_val(a, isl_dim_param, e), &l->off_a[d][e]);
		isl_aff_free(a);
		if (!ok || !val_int(isl_multi_val_get_val(size, d), &l->box[d]) || l->box[d] < 1) {
			snprintf(why, cap, "the box of a tile's footprint is not integral");
			goto out;
		}
	}
	rc = 0;
out:
	isl_multi_aff_free(off);
	isl_multi_val_free(size);
	isl_fixed_box_free(box);
	return rc;
}

/* Outputs in P's space are written by S_fill, so the tiles' footprints
 * must cover P and each element of P must lie in one footprint only: the
 * relation { T[p] -> P[o] } (tile origin to the elements its fill
 * computes) must reach all of P and be injective.  0, or -1 with why. */
static int exact_cover(isl_ctx *ctx, const ap_layer1 *l, char *why, size_t cap)
{
	tbuf t = {0}, a = {0};
	isl_map *tiles, *fill;
	isl_set *all, *range;
	isl_bool inj, eq;

	tb_printf(&t, "{ T[");
	dims_text(&t, "p", l->rank);
	tb_printf(&t, "] -> S_out[");
	dims_text(&t, "i", l->rank);
	tb_printf(&t, "] : ");
	for (int d = 0; d < l->rank; d++)
		tb_printf(&t, "0 <= p%d < %lld and exists (e%d : p%d = %lld e%d) and ", d,
			  (long long)l->dims[d], d, d, (long long)l->tile[d], d);
	tile_constraints(&t, l);
	tb_printf(&t, " }");
	tb_printf(&a, "{ P[");
	dims_text(&a, "o", l->prank);
	tb_printf(&a, "] : ");
	for (int d = 0; d < l->prank; d++)
		tb_printf(&a, "%s0 <= o%d < %lld", d ? " and " : "", d, (long long)l->pdims[d]);
	tb_printf(&a, " }");
	if (t.oom || a.oom) {
		tb_free(&t);
		tb_free(&a);
		snprintf(why, cap, "out of memory");
		return -1;
	}
	tiles = isl_map_read_from_str(ctx, t.s);
	all = isl_set_read_from_str(ctx, a.s);
	tb_free(&t);
	tb_free(&a);
	fill = isl_map_apply_range(tiles, isl_map_from_union_map(isl_union_map_read_from_str(ctx, l->reads)));
	range = fill ? isl_map_range(isl_map_copy(fill)) : NULL;
	inj = fill ? isl_map_is_injective(fill) : isl_bool_error;
	eq = range && all ? isl_set_is_equal(range, all) : isl_bool_error;
	isl_map_free(fill);
	isl_set_free(range);
	isl_set_free(all);
	if (inj == isl_bool_true && eq == isl_bool_true)
		return 0;
	snprintf(why, cap, "%s",
		 inj < 0 || eq < 0 ? isl_failure(ctx)
		 : "an output beside the pooling needs every element of the pooled tensor computed "
		   "once, and the tiles' footprints overlap or leave gaps");
	return -1;
}

/* Builds the domain (thread view), writes and schedule texts of l. */
static int model_text(isl_ctx *ctx, ap_layer1 *l)
{
	tbuf o = {0}, f = {0}, tl = {0}, rn = {0}, w = {0}, s = {0};
	isl_union_set *out_part, *fill_part, *all;
	isl_union_map *rd;
	isl_schedule *sched;
	char *canon, *txt;

	/* S_out: the tile */
	params_text(&o, l->rank);
	tb_printf(&o, " -> { S_out[");
	dims_text(&o, "i", l->rank);
	tb_printf(&o, "] : ");
	tile_constraints(&o, l);
	tb_printf(&o, " }");
	/* S_fill: P's elements ... */
	params_text(&f, l->rank);
	tb_printf(&f, " -> { S_fill[");
	dims_text(&f, "j", l->rank);
	tb_printf(&f, "] }");
	/* ... and within the footprint: the image of the tile under the reads */
	params_text(&tl, l->rank);
	tb_printf(&tl, " -> { S_out[");
	dims_text(&tl, "i", l->rank);
	tb_printf(&tl, "] : ");
	tile_constraints(&tl, l);
	tb_printf(&tl, " }");
	tb_printf(&rn, "{ P[");
	dims_text(&rn, "j", l->rank);
	tb_printf(&rn, "] -> S_fill[");
	dims_text(&rn, "j", l->rank);
	tb_printf(&rn, "] }");
	tb_printf(&w, "{ S_fill[");
	dims_text(&w, "j", l->rank);
	tb_printf(&w, "] -> P[");
	dims_text(&w, "j", l->rank);
	tb_printf(&w, "] }");
	if (o.oom || f.oom || tl.oom || rn.oom || w.oom) {
		tb_free(&o), tb_free(&f), tb_free(&tl), tb_free(&rn), tb_free(&w);
		return AP_ENOMEM;
	}
	rd = isl_union_map_read_from_str(ctx, l->reads);
	out_part = isl_union_set_read_from_str(ctx, o.s);
	fill_part = isl_union_set_intersect(
		isl_union_set_read_from_str(ctx, f.s),
		isl_union_set_apply(isl_union_set_apply(isl_union_set_read_from_str(ctx, tl.s), rd),
				    isl_union_map_read_from_str(ctx, rn.s)));
	tb_free(&o), tb_free(&f), tb_free(&tl), tb_free(&rn);
	all = isl_union_set_coalesce(isl_union_set_union(out_part, fill_part));
	{
		tbuf y = {0};

		params_text(&y, l->rank);
		tb_printf(&y, " -> { S_sync[] }");
		all = isl_union_set_union(all, y.oom ? NULL : isl_union_set_read_from_str(ctx, y.s));
		tb_free(&y);
	}
	txt = all ? isl_union_set_to_str(all) : NULL;
	isl_union_set_free(all);
	if (!txt) {
		tb_free(&w);
		return -1;
	}
	l->domain = txt;
	l->writes = take(&w);
	if (!l->writes)
		return AP_ENOMEM;
	schedule_text(&s, l, l->domain);
	if (s.oom)
		return AP_ENOMEM;
	sched = isl_schedule_read_from_str(ctx, s.s);
	tb_free(&s);
	canon = sched ? isl_schedule_to_str(sched) : NULL;
	isl_schedule_free(sched);
	if (!canon)
		return -1;
	l->schedule = canon;
	return 0;
}

int ap_fuse_layer1_plan(const ap_mgraph *m, const ap_target_info *t, unsigned max_threads,
			const ap_sched *tile, ap_layer1 **out, char *why, size_t cap)
{
	double t0 = ap_now_ms();
	ap_layer1 *l;
	isl_ctx *ctx;
	tbuf rd = {0};
	int rc;
	unsigned threads = max_threads ? max_threads : 256;

	*out = NULL;
	why[0] = 0;
	if (m->kind != AP_GROUP_WINDOW) {
		snprintf(why, cap, "not a window micro-graph");
		return 0;
	}
	l = calloc(1, sizeof(*l));
	if (!l)
		return AP_ENOMEM;
	rc = analyze(m, l, why, cap);
	if (rc <= 0)
		goto fail;
	rc = reads_text(m, l, &rd, why, cap);
	if (rc <= 0)
		goto fail;
	l->reads = take(&rd);
	if (!l->reads) {
		rc = AP_ENOMEM;
		goto fail;
	}
	if (tile && tile->n == (l->reduce ? 1 : 2) &&
	    tile_box_bytes(m->g, l, tile->v[0], tile->v[tile->n - 1]) <= smem_cap_of(t)) {
		set_tile(m->g, l, tile->v[0], tile->v[tile->n - 1]);
	} else if (!choose_tile(m->g, l, t)) {
		snprintf(why, cap, "no tile's staged box fits in %u bytes of shared memory", smem_cap_of(t));
		rc = 0;
		goto fail;
	}
	if (!(ctx = thread_ctx())) {
		rc = AP_ENOMEM;
		goto fail;
	}
	if (box_of(ctx, l, why, cap) < 0 || (l->n_pout > 0 && exact_cover(ctx, l, why, cap) < 0)) {
		rc = 0;
		goto fail;
	}
	{
		int64_t n = 1, bw = l->box[l->prank - 1], bh = l->box[l->prank - 2];

		for (int d = 0; d < l->prank; d++)
			n *= l->box[d];
		l->smem_bytes = (unsigned)(n * (int64_t)ap_dtype_size(m->g->tensors[l->staged].dtype));
		if (l->smem_bytes > t->shared_per_block) {
			snprintf(why, cap, "the staged box of %u bytes exceeds the block's shared memory",
				 l->smem_bytes);
			rc = 0;
			goto fail;
		}
		thread_grid(bh, bw, threads, &l->tx, &l->ty);
	}
	if ((rc = model_text(ctx, l)) < 0) {
		if (rc != AP_ENOMEM) {
			snprintf(why, cap, "%s", isl_failure(ctx));
			rc = 0;
		}
		goto fail;
	}
	{
		isl_schedule *s = isl_schedule_read_from_str(ctx, l->schedule);
		int lr = s ? check_legal(ctx, l, s, why, cap) : -1;

		if (!s)
			snprintf(why, cap, "%s", isl_failure(ctx));
		isl_schedule_free(s);
		if (lr < 0) {
			rc = 0;
			goto fail;
		}
		l->legal = true;
	}
	l->isl_ms = ap_now_ms() - t0;
	*out = l;
	return 1;
fail:
	tb_free(&rd);
	ap_fuse_layer1_free(l);
	return rc;
}

/* ---- AST -> KIR ------------------------------------------------------------------------------ */

typedef struct astc {
	const ap_layer1 *l;
	ap_vctx *v;
	ap_kir_kernel *k;
	ap_kir_array *stage;
	ap_kir_expr *p[AP_MAX_RANK], *off[AP_MAX_RANK], *tx, *ty, *tid;
	int n_names;
	char *names[64];
	ap_kir_var *vars[64];
	bool in_out;                      /* building S_out: P comes from the stage */
	int map_level;                    /* loops met under a "threads" mark (-1: none) */
	bool map_flat;                    /* under "threads1": the first loop takes every thread */
	char why[200];
} astc;

static ap_kir_expr *stage_index(astc *c, ap_kir_expr *const *coord)
{
	ap_kir_kernel *k = c->k;
	ap_kir_expr *e = ap_kir_idx(k, 0);
	int64_t stride = 1;

	for (int d = c->l->prank - 1; d >= 0; d--) {
		e = ap_kir_add(k, e, ap_kir_muli(k, ap_kir_binary(k, AP_KIR_SUB, coord[d], c->off[d]), stride));
		stride *= c->l->box[d];
	}
	return e;
}

static ap_kir_expr *stage_leaf(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	astc *c = user;
	ap_kir_expr *coord[AP_MAX_RANK];

	if (!c->in_out || t != c->l->staged)
		return NULL;
	for (int d = 0; d < ix->rank; d++)
		coord[d] = ap_lidx_coord(v, ix, d);
	return ap_kir_load(v->k, c->stage, stage_index(c, coord));
}

static ap_kir_expr *ast_expr(astc *c, __isl_keep isl_ast_expr *e);

static ap_kir_expr *ast_arg(astc *c, __isl_keep isl_ast_expr *e, int i)
{
	isl_ast_expr *a = isl_ast_expr_op_get_arg(e, i);
	ap_kir_expr *r = ast_expr(c, a);

	isl_ast_expr_free(a);
	return r;
}

static ap_kir_expr *ast_id(astc *c, const char *name)
{
	/* the innermost binding: sibling loops reuse isl's iterator names */
	for (int i = c->n_names - 1; i >= 0; i--)
		if (!strcmp(c->names[i], name))
			return ap_kir_ref(c->k, c->vars[i]);
	if (name[0] == 'p') {
		int d = atoi(name + 1);

		if (d >= 0 && d < c->l->rank)
			return c->p[d];
	}
	snprintf(c->why, sizeof(c->why), "unknown name %s in isl's AST", name);
	return NULL;
}

static ap_kir_expr *ast_expr(astc *c, isl_ast_expr *e)
{
	ap_kir_kernel *k = c->k;
	static const struct { enum isl_ast_expr_op_type op; ap_kir_binop kop; } bin[] = {
		{isl_ast_expr_op_and, AP_KIR_LAND}, {isl_ast_expr_op_and_then, AP_KIR_LAND},
		{isl_ast_expr_op_or, AP_KIR_LOR}, {isl_ast_expr_op_or_else, AP_KIR_LOR},
		{isl_ast_expr_op_max, AP_KIR_MAX}, {isl_ast_expr_op_min, AP_KIR_MIN},
		{isl_ast_expr_op_add, AP_KIR_ADD}, {isl_ast_expr_op_sub, AP_KIR_SUB},
		{isl_ast_expr_op_mul, AP_KIR_MUL}, {isl_ast_expr_op_div, AP_KIR_DIV},
		{isl_ast_expr_op_fdiv_q, AP_KIR_FLOORDIV}, {isl_ast_expr_op_pdiv_q, AP_KIR_DIV},
		{isl_ast_expr_op_pdiv_r, AP_KIR_REM}, {isl_ast_expr_op_zdiv_r, AP_KIR_REM},
		{isl_ast_expr_op_eq, AP_KIR_EQ}, {isl_ast_expr_op_le, AP_KIR_LE},
		{isl_ast_expr_op_lt, AP_KIR_LT}, {isl_ast_expr_op_ge, AP_KIR_GE},
		{isl_ast_expr_op_gt, AP_KIR_GT},
	};

	if (!e)
		return NULL;
	switch (isl_ast_expr_get_type(e)) {
	case isl_ast_expr_int: {
		int64_t v;

		if (!val_int(isl_ast_expr_int_get_val(e), &v))
			return NULL;
		return ap_kir_idx(k, v);
	}
	case isl_ast_expr_id: {
		isl_id *id = isl_ast_expr_id_get_id(e);
		ap_kir_expr *r = id ? ast_id(c, isl_id_get_name(id)) : NULL;

		isl_id_free(id);
		return r;
	}
	case isl_ast_expr_op: {
		enum isl_ast_expr_op_type op = isl_ast_expr_op_get_type(e);
		isl_size n = isl_ast_expr_op_get_n_arg(e);

		if (op == isl_ast_expr_op_minus && n == 1)
			return ap_kir_unary(k, AP_KIR_NEG, ast_arg(c, e, 0));
		if ((op == isl_ast_expr_op_cond || op == isl_ast_expr_op_select) && n == 3)
			return ap_kir_select(k, ast_arg(c, e, 0), ast_arg(c, e, 1), ast_arg(c, e, 2));
		for (size_t i = 0; i < sizeof(bin) / sizeof(bin[0]); i++)
			if (bin[i].op == op && n >= 2) {
				ap_kir_expr *r = ast_arg(c, e, 0);

				/* min and max may take more than two arguments */
				for (int j = 1; j < n; j++)
					r = ap_kir_binary(k, bin[i].kop, r, ast_arg(c, e, j));
				return r;
			}
		snprintf(c->why, sizeof(c->why), "isl AST operation %d is not translated", (int)op);
		return NULL;
	}
	default:
		snprintf(c->why, sizeof(c->why), "isl AST expression of unknown type");
		return NULL;
	}
}

static ap_kir_var *bind_iter(astc *c, __isl_keep isl_ast_expr *it)
{
	isl_id *id = isl_ast_expr_id_get_id(it);
	ap_kir_var *v;

	if (!id || c->n_names == 64) {
		isl_id_free(id);
		snprintf(c->why, sizeof(c->why), "too many loop iterators in isl's AST");
		return NULL;
	}
	v = ap_kir_var_new(c->k, c->k->index_type, "c");
	c->names[c->n_names] = ap_strdup(isl_id_get_name(id));
	c->vars[c->n_names] = v;
	isl_id_free(id);
	if (!c->names[c->n_names])
		return NULL;
	c->n_names++;
	return v;
}

/* Opens a scope of the value builder's memo on block b (like ap_v_loop). */
static ap_kir_block *scope_open(astc *c, ap_kir_block *b)
{
	ap_kir_block *saved = c->v->cur;

	c->v->cur = b;
	c->v->depth++;
	return saved;
}

static int ast_node(astc *c, __isl_keep isl_ast_node *n);

static int ast_child(astc *c, __isl_take isl_ast_node *n)
{
	int rc = n ? ast_node(c, n) : -1;

	isl_ast_node_free(n);
	return rc;
}

static int user_stmt(astc *c, __isl_keep isl_ast_node *n)
{
	isl_ast_expr *call = isl_ast_node_user_get_expr(n);
	isl_ast_expr *fn = call ? isl_ast_expr_op_get_arg(call, 0) : NULL;
	isl_id *id = fn ? isl_ast_expr_id_get_id(fn) : NULL;
	const ap_layer1 *l = c->l;
	const ap_graph *g = c->v->g;
	ap_kir_kernel *k = c->k;
	ap_kir_expr *coord[AP_MAX_RANK];
	ap_lidx ix;
	int rc = -1;
	bool fill;

	if (id && !strcmp(isl_id_get_name(id), "S_sync")) {
		ap_kir_barrier(k, c->v->cur);
		rc = 0;
		goto out;
	}
	if (!id || isl_ast_expr_op_get_n_arg(call) != l->rank + 1)
		goto out;
	fill = !strcmp(isl_id_get_name(id), "S_fill");
	if (!fill && strcmp(isl_id_get_name(id), "S_out") != 0)
		goto out;
	for (int d = 0; d < l->rank; d++)
		if (!(coord[d] = ap_v_once(c->v, ast_arg(c, call, d + 1))))
			goto out;
	if (fill) {
		ix = ap_lidx_shape(&g->tensors[l->staged]);
		for (int d = 0; d < l->rank; d++)
			ix.c[d] = coord[d];
		ap_kir_store(k, c->v->cur, c->stage, stage_index(c, coord), ap_val(c->v, l->staged, &ix));
		/* the outputs in P's space: exact_cover made each element's
		 * fill happen in one tile only */
		for (int q = 0; q < l->n_pout; q++) {
			ap_lidx oi = ap_lidx_relin(c->v, &ix, l->pout[q]);

			ap_kir_store(k, c->v->cur, ap_v_buffer(c->v, l->pout[q]), ap_lidx_linear(c->v, &oi),
				     ap_val(c->v, l->pout[q], &oi));
		}
	} else {
		ix = iter_index(c->v, l, coord);
		c->in_out = true;
		for (int q = 0; q < g->n_outputs; q++) {
			int o = g->outputs[q];
			ap_lidx oi;

			if (is_pout(l, o))
				continue;
			oi = ap_lidx_relin(c->v, &ix, o);

			ap_kir_store(k, c->v->cur, ap_v_buffer(c->v, o), ap_lidx_linear(c->v, &oi),
				     ap_val(c->v, o, &oi));
		}
		c->in_out = false;
	}
	rc = c->v->rc ? -1 : 0;
out:
	if (rc && !c->why[0] && !c->v->rc)
		snprintf(c->why, sizeof(c->why), "unexpected statement in isl's AST");
	isl_id_free(id);
	isl_ast_expr_free(fn);
	isl_ast_expr_free(call);
	return rc;
}

static int ast_node(astc *c, __isl_keep isl_ast_node *n)
{
	ap_kir_kernel *k = c->k;

	switch (isl_ast_node_get_type(n)) {
	case isl_ast_node_block: {
		isl_ast_node_list *ch = isl_ast_node_block_get_children(n);
		isl_size cnt = ch ? isl_ast_node_list_size(ch) : -1;
		int rc = cnt < 0 ? -1 : 0;

		for (int i = 0; i < cnt && rc == 0; i++)
			rc = ast_child(c, isl_ast_node_list_get_at(ch, i));
		isl_ast_node_list_free(ch);
		return rc;
	}
	case isl_ast_node_mark: {
		/* "threads": the loops of the band below go to the thread grid;
		 * "threads1": its first loop to all the block's threads */
		isl_id *id = isl_ast_node_mark_get_id(n);
		bool thr = id && !strcmp(isl_id_get_name(id), "threads");
		bool thr1 = id && !strcmp(isl_id_get_name(id), "threads1");
		int saved = c->map_level, rc;
		bool saved_flat = c->map_flat;

		isl_id_free(id);
		if (thr || thr1) {
			c->map_level = 0;
			c->map_flat = thr1;
		}
		rc = ast_child(c, isl_ast_node_mark_get_node(n));
		c->map_level = saved;
		c->map_flat = saved_flat;
		return rc;
	}
	case isl_ast_node_user:
		return user_stmt(c, n);
	case isl_ast_node_if: {
		isl_ast_expr *ce = isl_ast_node_if_get_cond(n);
		ap_kir_expr *cond = ast_expr(c, ce);
		ap_kir_stmt *s;
		ap_kir_block *saved;
		int rc;

		isl_ast_expr_free(ce);
		if (!cond || !(s = ap_kir_if(k, c->v->cur, cond)))
			return -1;
		saved = scope_open(c, &s->body);
		rc = ast_child(c, isl_ast_node_if_get_then_node(n));
		ap_v_close(c->v, saved);
		if (rc == 0 && isl_ast_node_if_has_else_node(n) == isl_bool_true) {
			saved = scope_open(c, &s->orelse);
			rc = ast_child(c, isl_ast_node_if_get_else_node(n));
			ap_v_close(c->v, saved);
		}
		return rc;
	}
	case isl_ast_node_for: {
		isl_ast_expr *it = isl_ast_node_for_get_iterator(n);
		isl_ast_expr *init = isl_ast_node_for_get_init(n);
		ap_kir_var *var = it ? bind_iter(c, it) : NULL;
		ap_kir_expr *lo = init ? ast_expr(c, init) : NULL;
		ap_kir_block *saved;
		int rc = -1;

		/* under a "threads" mark the first loop goes to ty, the second to tx:
		 * a coincident band, each thread takes every T-th iteration */
		ap_kir_expr *tid = c->map_flat ? (c->map_level == 0 ? c->tid : NULL)
				   : c->map_level == 0 ? c->ty : c->map_level == 1 ? c->tx : NULL;
		int64_t nt = c->map_flat ? (c->map_level == 0 ? (int64_t)c->l->tx * c->l->ty : 1)
			     : c->map_level == 0 ? c->l->ty : c->map_level == 1 ? c->l->tx : 1;
		int saved_level = c->map_level;

		if (!var || !lo)
			goto for_out;
		if (c->map_level >= 0)
			c->map_level++;
		if (isl_ast_node_for_is_degenerate(n) == isl_bool_true) {
			/* one iteration: thread 0 of the mapped dimension runs it */
			ap_kir_stmt *s = ap_kir_if(k, c->v->cur, tid ? ap_kir_binary(k, AP_KIR_EQ, tid, ap_kir_idx(k, 0))
									: ap_kir_binary(k, AP_KIR_EQ, ap_kir_idx(k, 0),
										       ap_kir_idx(k, 0)));

			if (!s)
				goto for_out;
			/* a block of its own scopes the iterator */
			saved = scope_open(c, &s->body);
			ap_kir_let(k, c->v->cur, var, lo);
			rc = ast_child(c, isl_ast_node_for_get_body(n));
			ap_v_close(c->v, saved);
		} else {
			isl_ast_expr *ce = isl_ast_node_for_get_cond(n), *inc = isl_ast_node_for_get_inc(n);
			isl_ast_expr *a0 = ce && isl_ast_expr_get_type(ce) == isl_ast_expr_op
					   ? isl_ast_expr_op_get_arg(ce, 0) : NULL;
			enum isl_ast_expr_op_type op = ce ? isl_ast_expr_op_get_type(ce) : isl_ast_expr_op_error;
			int64_t step = 0;
			ap_kir_expr *hi = NULL;
			ap_kir_stmt *s;

			/* the condition is `iterator < bound` or `iterator <= bound` */
			if (a0 && isl_ast_expr_is_equal(a0, it) == isl_bool_true &&
			    (op == isl_ast_expr_op_lt || op == isl_ast_expr_op_le)) {
				hi = ast_arg(c, ce, 1);
				if (hi && op == isl_ast_expr_op_le)
					hi = ap_kir_addi(k, hi, 1);
			} else if (!c->why[0]) {
				snprintf(c->why, sizeof(c->why), "a loop condition isl's AST gives in another form");
			}
			if (inc && isl_ast_expr_get_type(inc) == isl_ast_expr_int)
				(void)val_int(isl_ast_expr_int_get_val(inc), &step);
			isl_ast_expr_free(a0);
			isl_ast_expr_free(ce);
			isl_ast_expr_free(inc);
			if (tid) {
				lo = ap_kir_add(k, lo, ap_kir_muli(k, tid, step));
				step *= nt;
			}
			if (!hi || step <= 0 || !(s = ap_kir_for(k, c->v->cur, var, lo, hi, step)))
				goto for_out;
			saved = scope_open(c, &s->body);
			rc = ast_child(c, isl_ast_node_for_get_body(n));
			ap_v_close(c->v, saved);
		}
for_out:
		c->map_level = saved_level;
		if (var && c->n_names > 0 && c->vars[c->n_names - 1] == var)
			free(c->names[--c->n_names]);   /* the iterator's scope ends */
		isl_ast_expr_free(it);
		isl_ast_expr_free(init);
		return rc;
	}
	default:
		snprintf(c->why, sizeof(c->why), "isl AST node of an unknown type");
		return -1;
	}
}

/* The kernel for schedule text `schedule` of plan l (its other fields). */
static int emit_kernel(const ap_mgraph *m, const ap_layer1 *l, const ap_target_info *t,
		       ap_kir_kernel *k, ap_error *err)
{
	const ap_graph *g = m->g;
	const char *root = g->nodes[l->window].name;
	isl_ctx *ctx = thread_ctx();
	isl_schedule *s = NULL;
	isl_ast_build *build = NULL;
	isl_ast_node *tree = NULL;
	isl_set *context = NULL;
	tbuf ct = {0};
	char why[300] = "";
	ap_vctx v;
	astc c;
	int rc;
	int64_t nbox = 1;

	memset(&c, 0, sizeof(c));
	if (!ctx)
		return ap_error_set(err, AP_ENOMEM, root, NULL, "out of memory");
	s = isl_schedule_read_from_str(ctx, l->schedule);
	if (!s)
		return ap_error_set(err, AP_EUNSUPPORTED, root, NULL, "layer I: the schedule does not parse: %s",
				    isl_failure(ctx));
	if (!l->legal && check_legal(ctx, l, s, why, sizeof(why)) < 0) {
		isl_schedule_free(s);
		return ap_error_set(err, AP_EUNSUPPORTED, root, NULL, "layer I: %s", why);
	}
	context_text(&ct, l);
	context = ct.oom ? NULL : isl_set_read_from_str(ctx, ct.s);
	tb_free(&ct);
	build = context ? isl_ast_build_from_context(context) : NULL;
	tree = build ? isl_ast_build_node_from_schedule(build, s) : (isl_schedule_free(s), NULL);
	isl_ast_build_free(build);
	if (!tree)
		return ap_error_set(err, AP_EUNSUPPORTED, root, NULL, "layer I: no AST: %s", isl_failure(ctx));

	if ((rc = ap_vctx_init(&v, m, k, err))) {
		isl_ast_node_free(tree);
		return rc;
	}
	c.l = l;
	c.map_level = -1;
	c.v = &v;
	c.k = k;
	v.leaf = stage_leaf;
	v.leaf_user = &c;
	ap_kir_comment(k, &k->body, "window micro-graph, Layer I: the pooled tensor staged in shared memory "
		       "per tile");
	{
		char txt[200];
		size_t len = 0;

		for (int d = 0; d < l->rank && len + 40 < sizeof(txt); d++)
			len += (size_t)snprintf(txt + len, sizeof(txt) - len, "%s%lld/%lld", d ? " x " : "",
						(long long)l->tile[d], (long long)l->box[d]);
		ap_kir_comment(k, &k->body, "tile/box per dimension: %s; threads %d x %d; recompute %.3f",
			       txt, l->tx, l->ty, l->recompute);
	}
	for (int d = 0; d < l->prank; d++)
		nbox *= l->box[d];
	c.stage = ap_kir_shared(k, "stage", g->tensors[l->staged].dtype, nbox);
	k->block[0] = (unsigned)(l->tx * l->ty);
	k->grid[0] = ap_grid_for(l->n_tiles, 1);
	c.tx = ap_kir_bind(k, v.cur, k->index_type, "tx",
			   ap_kir_binary(k, AP_KIR_REM, ap_kir_index_of(k, AP_KIR_THREAD_X), ap_kir_idx(k, l->tx)));
	c.ty = ap_kir_bind(k, v.cur, k->index_type, "ty",
			   ap_kir_binary(k, AP_KIR_DIV, ap_kir_index_of(k, AP_KIR_THREAD_X), ap_kir_idx(k, l->tx)));
	c.tid = ap_kir_bind(k, v.cur, k->index_type, "tid", ap_kir_index_of(k, AP_KIR_THREAD_X));
	{
		ap_kir_block *sv;
		ap_kir_var *tv = ap_v_loop(&v, "tl", ap_kir_index_of(k, AP_KIR_BLOCK_X),
					   ap_kir_idx(k, l->n_tiles), k->grid[0], &sv);
		ap_kir_expr *q = ap_kir_ref(k, tv);
		int64_t stride = 1;

		/* tile origins, the last dimension fastest */
		for (int d = l->rank - 1; d >= 0; d--) {
			ap_kir_expr *e = stride == 1 ? q : ap_kir_binary(k, AP_KIR_DIV, q, ap_kir_idx(k, stride));

			if (d > 0)
				e = ap_kir_binary(k, AP_KIR_REM, e, ap_kir_idx(k, l->ntiles[d]));
			c.p[d] = ap_kir_bind(k, v.cur, k->index_type, "org", ap_kir_muli(k, e, l->tile[d]));
			stride *= l->ntiles[d];
		}
		for (int d = 0; d < l->prank; d++) {
			ap_kir_expr *e = ap_kir_idx(k, l->off_c[d]);

			for (int q2 = 0; q2 < l->rank; q2++)
				if (l->off_a[d][q2])
					e = ap_kir_add(k, e, ap_kir_muli(k, c.p[q2], l->off_a[d][q2]));
			c.off[d] = ap_kir_bind(k, v.cur, k->index_type, "off", e);
		}
		rc = ast_node(&c, tree);
		ap_kir_barrier(k, v.cur);   /* the stage is free for the next tile */
		ap_v_close(&v, sv);
	}
	isl_ast_node_free(tree);
	for (int i = 0; i < c.n_names; i++)
		free(c.names[i]);
	if (rc == 0 && v.rc)
		rc = v.rc;
	else if (rc < 0)
		rc = v.rc ? v.rc
		     : ap_error_set(err, AP_EUNSUPPORTED, root, NULL, "layer I: %s",
				    c.why[0] ? c.why : isl_failure(ctx));
	ap_vctx_clear(&v);
	return rc;
}

__ap_give ap_kir_kernel *ap_fuse_layer1_emit(const ap_mgraph *m, const ap_layer1 *l,
					     const ap_target_info *t, const char *name, ap_error *err)
{
	ap_kir_kernel *k = ap_kir_kernel_new(name);
	ap_kir_limits lim = {1024, t->shared_per_block};
	ap_error verr;
	int rc;

	if (!k) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		return NULL;
	}
	k->index_type = ap_index_type_for(m->g);
	if (emit_kernel(m, l, t, k, err))
		return ap_kir_kernel_free(k);
	if (ap_kir_failed(k)) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		return ap_kir_kernel_free(k);
	}
	if ((rc = ap_kir_verify(k, &lim, &verr)) != 0) {
		ap_error_set(err, rc == AP_ENOMEM ? AP_ENOMEM : AP_EINTERNAL,
			     m->g->nodes[l->window].name, NULL, "layer I built an invalid kernel: %s",
			     verr.msg);
		return ap_kir_kernel_free(k);
	}
	return k;
}

/* ---- what the rest of the compiler reads ------------------------------------------------------ */

double ap_fuse_layer1_recompute(const ap_layer1 *l)
{
	return l->recompute;
}

double ap_fuse_layer1_ms(const ap_layer1 *l)
{
	return l->isl_ms;
}

__ap_give char *ap_fuse_layer1_text(const ap_layer1 *l)
{
	tbuf b = {0};

	tb_printf(&b, "# Apollo Layer I schedule (isl text forms); replay with ap_fuse_layer1_load\n");
	tb_printf(&b, "tile:");
	for (int d = 0; d < l->rank; d++)
		tb_printf(&b, " %lld", (long long)l->tile[d]);
	tb_printf(&b, "\nthreads: %d %d\nrecompute: %.4f\n", l->tx, l->ty, l->recompute);
	tb_printf(&b, "domain: %s\nreads: %s\nwrites: %s\nschedule: %s\n", l->domain, l->reads, l->writes,
		  l->schedule);
	return take(&b);
}

/* The value after "key: " on its own line of text, malloc'd; NULL when absent. */
static char *field(const char *text, const char *key)
{
	size_t kl = strlen(key);

	for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		if (!strncmp(p, key, kl) && p[kl] == ':' && p[kl + 1] == ' ') {
			const char *e = strchr(p, '\n');
			size_t n = e ? (size_t)(e - p) - kl - 2 : strlen(p + kl + 2);
			char *s = malloc(n + 1);

			if (s) {
				memcpy(s, p + kl + 2, n);
				s[n] = 0;
			}
			return s;
		}
	}
	return NULL;
}

int ap_fuse_layer1_load(const ap_mgraph *m, const ap_target_info *t, const char *text,
			ap_layer1 **out, char *why, size_t cap)
{
	ap_layer1 *l;
	char *sched;
	int rc;

	*out = NULL;
	rc = ap_fuse_layer1_plan(m, t, 0, NULL, &l, why, cap);
	if (rc <= 0)
		return rc;
	/* the text's tile (a tuned one may differ from the rule's) */
	if ((sched = field(text, "tile"))) {
		int64_t tile[AP_MAX_RANK];
		int n = 0;
		char *p = sched, *end;

		while (n < AP_MAX_RANK && (tile[n] = strtoll(p, &end, 10), end != p)) {
			n++;
			p = end;
		}
		free(sched);
		if (n == l->rank && memcmp(tile, l->tile, (size_t)n * sizeof(tile[0]))) {
			ap_sched ts = { &ap_fuse_layer1_emitter, l->reduce ? 1 : 2,
					{ (int)(l->reduce ? tile[1] : tile[n - 2]), (int)tile[n - 1] } };

			ap_fuse_layer1_free(l);
			rc = ap_fuse_layer1_plan(m, t, 0, &ts, &l, why, cap);
			if (rc <= 0)
				return rc;
		}
	}
	sched = field(text, "schedule");
	if (!sched) {
		snprintf(why, cap, "the text has no \"schedule:\" line");
		ap_fuse_layer1_free(l);
		return 0;
	}
	free(l->schedule);
	l->schedule = sched;
	l->legal = false;   /* checked when the kernel is emitted */
	*out = l;
	return 1;
}

const char *ap_fuse_layer1_schedule(const ap_layer1 *l)
{
	return l->schedule;
}

int ap_fuse_layer1_set_schedule(ap_layer1 *l, const char *schedule)
{
	char *s = ap_strdup(schedule);

	if (!s)
		return AP_ENOMEM;
	free(l->schedule);
	l->schedule = s;
	l->legal = false;
	return 0;
}

bool ap_fuse_layer1_wanted(const ap_mgraph *m)
{
	int n, w = find_window(m, &n);
	int x = w >= 0 ? m->g->nodes[w].inputs[0] : -1;

	return m->kind == AP_GROUP_WINDOW && x >= 0 && m->g->tensors[x].producer >= 0;
}

const char *ap_fuse_layer1_window_name(const ap_mgraph *m)
{
	int n, w = find_window(m, &n);

	return w >= 0 ? m->g->nodes[w].name : "";
}

bool ap_fuse_layer1_pays(const ap_mgraph *m, const ap_layer1 *l, const ap_target_info *t, char *why,
			 size_t cap)
{
	const ap_graph *g = m->g;

	for (int i = 0; i < g->n_nodes; i++) {
		const ap_node *n = &g->nodes[i];
		ap_op_category cat = ap_op_category_of(n->op);
		double k;

		if ((cat != AP_CAT_CONV && cat != AP_CAT_MATMUL) || !m->member[i])
			continue;
		if (!ap_cost_staged_product_pays(t, g, n, l->recompute, &k)) {
			snprintf(why, cap, "the cost model keeps %s (%.0f multiply-adds per element, %.2f "
					   "evaluations per element staged) in its own kernel",
				 n->name, k, l->recompute);
			return false;
		}
	}
	return true;
}

char *ap_fuse_layer1_describe(const ap_layer1 *l)
{
	tbuf b = {0};

	tb_printf(&b, "tile=");
	for (int d = 0; d < l->rank; d++)
		tb_printf(&b, "%s%lld", d ? "x" : "", (long long)l->tile[d]);
	tb_printf(&b, " box=");
	for (int d = 0; d < l->prank; d++)
		tb_printf(&b, "%s%lld", d ? "x" : "", (long long)l->box[d]);
	tb_printf(&b, " threads=%dx%d", l->tx, l->ty);
	return take(&b);
}

/* ---- the emitter record ---------------------------------------------------------------- */

/* Layer I's binding: the window analysis a configuration needs (no
 * isl), and the isl plan of the configuration the driver chose, once
 * made (ap_fuse_layer1_plan_bound). */
typedef struct l1_bound {
	ap_layer1 win;
	ap_layer1 *plan;                   /* owned; NULL until planned */
} l1_bound;

static const ap_layer1 *win_of(const ap_bound *b)
{
	return &((const l1_bound *)b->an)->win;
}

/* 1 for a window micro-graph Layer I applies to, 0 when not, AP_ENOMEM.
 * Not in the registry: the driver binds Layer I where the micro-graph
 * wants it, and keeps it where the cost model says it pays
 * (ap_fuse_layer1_pays). */
static int l1_bind(const ap_mgraph *m, const ap_target_info *t, void **an, char *why, size_t cap)
{
	l1_bound *lb;
	int rc;

	(void)t;
	if (m->kind != AP_GROUP_WINDOW) {
		snprintf(why, cap, "not a window micro-graph");
		return 0;
	}
	if (!(lb = calloc(1, sizeof(*lb))))
		return AP_ENOMEM;
	if ((rc = analyze(m, &lb->win, why, cap)) <= 0) {
		free(lb);
		return rc;
	}
	*an = lb;
	return 1;
}

static void l1_unbind(void *an)
{
	ap_fuse_layer1_free(((l1_bound *)an)->plan);
	free(an);
}

/* Configuration *s of plan l's tile (Layer I's knobs). */
static void sched_of_plan(const ap_layer1 *l, ap_sched *s)
{
	s->em = &ap_fuse_layer1_emitter;
	s->n = l->reduce ? 1 : 2;
	if (l->reduce)
		s->v[0] = (int)l->tile[1];
	else
		s->v[0] = (int)l->tile[l->rank - 2], s->v[1] = (int)l->tile[l->rank - 1];
}

/* The binding's plan when it is configuration s's (its tile), else NULL. */
static const ap_layer1 *plan_for(const ap_bound *b, const ap_sched *s)
{
	const ap_layer1 *l = ((const l1_bound *)b->an)->plan;
	ap_sched ps;

	if (!l)
		return NULL;
	sched_of_plan(l, &ps);
	return s->n == ps.n && !memcmp(s->v, ps.v, (size_t)ps.n * sizeof(ps.v[0])) ? l : NULL;
}

int ap_fuse_layer1_plan_bound(ap_bound *b, unsigned max_threads, ap_sched *s, char *why, size_t cap)
{
	l1_bound *lb = b->an;
	ap_layer1 *l = NULL;
	int rc;

	if (b->em != &ap_fuse_layer1_emitter || !lb) {
		snprintf(why, cap, "not bound to Layer I");
		return 0;
	}
	rc = ap_fuse_layer1_plan(b->m, b->t, max_threads, s->n ? s : NULL, &l, why, cap);
	if (rc <= 0)
		return rc;
	ap_fuse_layer1_free(lb->plan);
	lb->plan = l;
	sched_of_plan(l, s);
	return 1;
}

const ap_layer1 *ap_fuse_layer1_bound_plan(const ap_bound *b)
{
	return b->em == &ap_fuse_layer1_emitter && b->an ? ((const l1_bound *)b->an)->plan : NULL;
}

/* The tile as knobs: "th" rows and "tw" columns of the two innermost
 * output dimensions (powers of two, then the whole extent), or "planes"
 * staged at once by a global-pooling window; the default rule's values
 * are always among them. */
static int l1_space(const ap_bound *b, ap_space *out)
{
	ap_layer1 l = *win_of(b);   /* choose_tile sets the tile */
	int64_t v[AP_KNOB_MAX_VALUES];
	bool rule;

	memset(out, 0, sizeof(*out));
	rule = choose_tile(b->m->g, &l, b->t);
	out->n = l.reduce ? 1 : 2;
	for (int q = 0; q < out->n; q++) {
		ap_knob *k = &out->knobs[q];
		int n = tile_values(&l, l.reduce ? 1 : q, v);

		if (rule)
			n = add_value(v, n, l.reduce ? l.tile[1] : l.tile[l.rank - 2 + q]);
		k->name = l.reduce ? "planes" : q ? "tw" : "th";
		k->n = n;
		for (int i = 0; i < n; i++)
			k->values[i] = (int)v[i];
	}
	return 0;
}

static int l1_choose(const ap_bound *b, const ap_space *sp, ap_sched *s)
{
	ap_layer1 l = *win_of(b);

	for (int q = 0; q < sp->n; q++)
		s->v[q] = sp->knobs[q].values[0];
	if (choose_tile(b->m->g, &l, b->t)) {
		if (l.reduce)
			s->v[0] = (int)l.tile[1];
		else
			s->v[0] = (int)l.tile[l.rank - 2], s->v[1] = (int)l.tile[l.rank - 1];
	}
	return 0;
}

/* A tile resolved: its staged box's shared bytes, thread grid, blocks
 * (one a tile) and recompute ratio -- the binding's isl plan's where it is
 * this tile's, else as tile_box and thread_grid estimate them (the
 * tuner's points, before any plan).  What l1_traffic models. */
typedef struct l1_res {
	bool tiled;                        /* s gives the tile (else: the micro-graph's traffic only) */
	unsigned smem;
	int tx, ty;
	unsigned blocks;
	double recompute;
} l1_res;

_Static_assert(sizeof(l1_res) <= AP_PLAN_BYTES, "the Layer I plan fits ap_plan");

static int l1_resolve(const ap_bound *b, const ap_sched *s, ap_plan *out)
{
	ap_layer1 l = *win_of(b);   /* set_tile sets the tile */
	const ap_layer1 *pl = plan_for(b, s);
	l1_res *r = (l1_res *)out->x;
	int64_t bh, bw;

	if (s->n != (l.reduce ? 1 : 2))
		return 0;
	r->tiled = true;
	if (pl) {
		r->smem = pl->smem_bytes;
		r->tx = pl->tx;
		r->ty = pl->ty;
		r->blocks = ap_grid_for(pl->n_tiles, 1);
		r->recompute = pl->recompute;
		return 1;
	}
	r->smem = (unsigned)tile_box(b->m->g, &l, s->v[0], s->v[s->n - 1], &bh, &bw);
	set_tile(b->m->g, &l, s->v[0], s->v[s->n - 1]);
	thread_grid(bh, bw, 256, &r->tx, &r->ty);
	r->blocks = ap_grid_for(l.n_tiles, 1);
	r->recompute = l.recompute;
	return tile_box_bytes(b->m->g, win_of(b), s->v[0], s->v[s->n - 1]) <= smem_cap_of(b->t);
}

/* The kernel of configuration s: the binding's plan where it is this
 * tile's, else the tile planned now (isl); then the plan's kernel
 * (emit_kernel), as ap_fuse_layer1_emit builds it.  AP_EUNSUPPORTED when
 * Layer I refuses the tile (the message says why), AP_ENOMEM. */
static int l1_emit(const ap_bound *b, const ap_plan *pl, ap_kir_kernel *k, ap_error *err)
{
	const ap_layer1 *bound = plan_for(b, &pl->s);
	ap_layer1 *l = NULL;
	char why[300];
	int rc;

	if (bound)
		return emit_kernel(b->m, bound, b->t, k, err);
	rc = ap_fuse_layer1_plan(b->m, b->t, 0, &pl->s, &l, why, sizeof(why));
	if (rc <= 0)
		return ap_error_set(err, rc < 0 ? AP_ENOMEM : AP_EUNSUPPORTED, b->m->g->nodes[win_of(b)->window].name,
				    NULL, "layer I: %s", rc < 0 ? "out of memory" : why);
	rc = emit_kernel(b->m, l, b->t, k, err);
	ap_fuse_layer1_free(l);
	return rc;
}

/* A tile's launch for the cost model: the micro-graph's traffic (every
 * input and output once) with its arithmetic repeated by the recompute
 * ratio of the tile's halo (the staged tensor's producer, a convolution
 * or product, dominates it), one block per tile, the box's thread grid
 * (at most 256 threads) and its shared memory. */
static int l1_traffic(const ap_bound *b, const ap_plan *pl, ap_traffic *out)
{
	const l1_res *r = (const l1_res *)pl->x;

	memset(out, 0, sizeof(*out));
	if (ap__lower_inline_traffic(b->m, out) < 0)
		return AP_ENOMEM;
	if (!r->tiled)
		return 0;
	out->shared_bytes = r->smem;
	out->blocks = r->blocks;
	out->threads = (unsigned)(r->tx * r->ty);
	out->flops *= r->recompute;
	return 0;
}

const ap_emitter ap_fuse_layer1_emitter = {
	"layer1", l1_bind, l1_unbind, l1_space, l1_choose, l1_emit, l1_traffic, l1_resolve, true, NULL,
};
