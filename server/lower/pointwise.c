/* pointwise.c -- the pointwise emitter: grid-stride loops over the
 * elements the micro-graph writes, every value built by the value builder
 * (producers inlined into their consumers' index expressions, common
 * values shared).  It accepts every micro-graph -- elementwise, broadcast
 * and injective ones (data movement as index maps), and the loop-shaped
 * ops (MatMul, Conv, pools, LRN, serial reductions) computed one output
 * element per thread -- so it is the registry's last resort.
 *
 * The written tensors are split into classes of equal shape; each class
 * is one grid-stride loop over its linear index i, whose coordinates are
 * named once.
 *
 * Vectors: when every output has one shape whose last dimension is a
 * multiple of `vector` (2 or 4), each thread takes `vector` consecutive
 * elements: the outputs are written with one vector store, and every leaf
 * read at the element itself (the same linear index: elementwise chains,
 * views) or as a trailing broadcast (a bias [N] under [M, N]: linear index
 * modulo its size, a multiple of `vector`) is read with one vector load
 * (ld.global.v4 on a GPU; the host prints scalar accesses).  Buffers are
 * 16-byte aligned (ap_kernel_src.align tells the runtime).  The elements
 * of a vector are still computed one by one.
 *
 * Knobs: "block" (threads per block), "vector" (elements per thread).
 */
#include "emitters.h"

#include <stdlib.h>
#include <string.h>

unsigned ap_pow2_at_least(int64_t n, unsigned lo, unsigned hi)
{
	unsigned p = lo;

	while (p < hi && (int64_t)p < n)
		p *= 2;
	return p;
}

void ap_knob_pow2(ap_knob *kb, const char *name, unsigned lo, unsigned hi)
{
	kb->name = name;
	kb->n = 0;
	for (unsigned p = lo; p <= hi && kb->n < AP_KNOB_MAX_VALUES; p *= 2)
		kb->values[kb->n++] = (int)p;
	if (kb->n == 0)
		kb->values[kb->n++] = (int)lo;
}

unsigned ap_block_cap(const ap_target_info *t)
{
	unsigned c = t->max_threads_per_block ? t->max_threads_per_block : 256;

	if (c < 32)
		c = 32;
	if (c > 1024)
		c = 1024;
	return c;
}

unsigned ap_grid_for(int64_t work, int64_t per_block)
{
	int64_t g = per_block > 0 ? (work + per_block - 1) / per_block : 1;

	if (g > (int64_t)AP_MAX_GRID)
		g = AP_MAX_GRID;
	return g < 1 ? 1 : (unsigned)g;
}

static int64_t max_output_numel(const ap_mgraph *m)
{
	int64_t max_n = 0;

	for (int i = 0; i < m->g->n_outputs; i++) {
		int64_t n = ap_tensor_numel(&m->g->tensors[m->g->outputs[i]]);

		if (n > max_n)
			max_n = n;
	}
	return max_n;
}

/* ---- vector access analysis --------------------------------------------------- */

/* How a tensor is read relative to the linear index L of the element the
 * kernel computes: at L itself, at L modulo its element count (a
 * trailing broadcast), or otherwise. */
enum { VD_NONE = 0, VD_SAME, VD_MOD, VD_OTHER };

typedef struct vdesc {
	unsigned char kind;
	int64_t mod;                     /* VD_MOD: the modulus */
} vdesc;

static void vd_meet(const ap_graph *g, int t, vdesc d, vdesc *vd);

/* Marks t and everything it is computed from as read otherwise. */
static void vd_other(const ap_graph *g, int t, vdesc *vd)
{
	vd_meet(g, t, (vdesc){VD_OTHER, 0}, vd);
}

/* Records that t is read as d, and propagates to its producer's inputs. */
static void vd_meet(const ap_graph *g, int t, vdesc d, vdesc *vd)
{
	vdesc *cur;
	int p;

	if (t < 0)
		return;
	cur = &vd[t];
	if (cur->kind == VD_OTHER)
		return;
	if (cur->kind != VD_NONE) {
		if (cur->kind == d.kind && cur->mod == d.mod)
			return;   /* seen with the same reads */
		d = (vdesc){VD_OTHER, 0};
	}
	*cur = d;
	p = g->tensors[t].producer;
	if (p < 0)
		return;
	{
		const ap_node *n = &g->nodes[p];
		ap_op_category cat = ap_op_category_of(n->op);
		int64_t nt = ap_tensor_numel(&g->tensors[t]);

		for (int i = 0; i < n->n_inputs; i++) {
			int x = n->inputs[i];
			const ap_tensor *xt;
			int64_t nx;

			if (x < 0)
				continue;
			xt = &g->tensors[x];
			nx = ap_tensor_numel(xt);
			if (d.kind == VD_OTHER) {
				vd_other(g, x, vd);
			} else if (ap_op_is_view(n->op) || cat == AP_CAT_ELEMWISE ||
				   (cat == AP_CAT_BROADCAST && ap_dims_equal(xt->rank, xt->dims,
									       g->tensors[t].rank,
									       g->tensors[t].dims))) {
				vd_meet(g, x, nx == nt ? d : (vdesc){VD_OTHER, 0}, vd);
			} else if (cat == AP_CAT_BROADCAST && nx > 0 && nt % nx == 0 &&
				   (d.kind == VD_SAME || d.mod % nx == 0)) {
				/* x's dims, leading ones dropped, are t's trailing dims:
				 * its linear index is t's modulo its size */
				int j = xt->rank - 1, k = g->tensors[t].rank - 1;
				bool trailing = true;

				for (; j >= 0; j--, k--) {
					if (k < 0 || xt->dims[j] != g->tensors[t].dims[k]) {
						for (; j >= 0; j--)
							if (xt->dims[j] != 1)
								trailing = false;
						break;
					}
				}
				vd_meet(g, x, trailing ? (vdesc){VD_MOD, nx} : (vdesc){VD_OTHER, 0}, vd);
			} else {
				vd_other(g, x, vd);
			}
		}
	}
}

/* Vector width `w` is usable for m: one output shape, its last dimension a
 * multiple of w, every output's dtype with a w-wide vector type.  When
 * `vd` is not NULL it receives each tensor's reads. */
static bool vector_ok(const ap_mgraph *m, int w, vdesc *vd)
{
	const ap_graph *g = m->g;
	const ap_tensor *o0;

	if (g->n_outputs == 0)
		return false;
	o0 = &g->tensors[g->outputs[0]];
	if (o0->rank < 1 || o0->dims[o0->rank - 1] % w != 0 || ap_tensor_numel(o0) < w)
		return false;
	for (int i = 0; i < g->n_outputs; i++) {
		const ap_tensor *o = &g->tensors[g->outputs[i]];

		if (!ap_dims_equal(o->rank, o->dims, o0->rank, o0->dims) || !ap_kir_vector_ok(o->dtype, w))
			return false;
	}
	if (vd)
		for (int i = 0; i < g->n_outputs; i++)
			vd_meet(g, g->outputs[i], (vdesc){VD_SAME, 0}, vd);
	return true;
}

/* A leaf of m read as a vector of width w. */
static bool vector_leaf(const ap_graph *g, int t, const vdesc *vd, int w)
{
	const ap_tensor *x = &g->tensors[t];

	if (x->producer >= 0 || x->kind == AP_TENSOR_CONST || !ap_kir_vector_ok(x->dtype, w))
		return false;
	return vd[t].kind == VD_SAME || (vd[t].kind == VD_MOD && vd[t].mod % w == 0);
}

/* The analysis: the vector widths the outputs allow and the largest
 * output's elements (the grid covers them). */
typedef struct pw_plan {
	bool vector_ok[5];               /* [w]: w = 2 or 4 elements a thread at once */
	int64_t max_numel;
} pw_plan;

/* Binds every micro-graph (the registry's last emitter). */
static int pw_bind(const ap_mgraph *m, const ap_target_info *t, void **an, char *why, size_t cap)
{
	pw_plan *p = calloc(1, sizeof(*p));

	(void)t;
	(void)why;   /* binds every micro-graph */
	(void)cap;
	if (!p)
		return AP_ENOMEM;
	for (int w = 2; w <= 4; w *= 2)
		p->vector_ok[w] = vector_ok(m, w, NULL);
	p->max_numel = max_output_numel(m);
	*an = p;
	return 1;
}

static int pw_space(const ap_bound *b, ap_space *sp)
{
	const pw_plan *p = b->an;

	sp->n = 2;
	ap_knob_pow2(&sp->knobs[0], "block", 32, ap_block_cap(b->t));
	sp->knobs[1] = (ap_knob){"vector", 1, {1}, false};
	for (int w = 2; w <= 4; w *= 2)
		if (p->vector_ok[w])
			sp->knobs[1].values[sp->knobs[1].n++] = w;
	return 0;
}

/* Default: the widest vector that is allowed and leaves a block's worth of
 * work per block; the block as large as the elements (cap). */
static int pw_choose(const ap_bound *b, const ap_space *sp, ap_sched *s)
{
	int64_t n = ((const pw_plan *)b->an)->max_numel;
	int w = 1;

	for (int i = 0; i < sp->knobs[1].n; i++)
		if (sp->knobs[1].values[i] > w && n / sp->knobs[1].values[i] >= 32)
			w = sp->knobs[1].values[i];
	s->v[0] = (int)ap_pow2_at_least(n / w, 32, ap_block_cap(b->t));
	s->v[1] = w;
	return 0;
}

typedef struct vec_hook {
	ap_kir_var ***lanes;             /* per tensor: its w loaded elements, or NULL */
	int w, lane;
} vec_hook;

static ap_kir_expr *vec_leaf(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	vec_hook *h = user;

	return h->lanes[t] ? ap_kir_ref(v->k, h->lanes[t][h->lane]) : NULL;
}

/* The vector form: one grid-stride loop over groups of w elements of the
 * outputs' single shape. */
static int emit_vector(const ap_mgraph *m, ap_vctx *v, unsigned bs, int w)
{
	const ap_graph *g = m->g;
	ap_kir_kernel *k = v->k;
	const ap_tensor *o0 = &g->tensors[g->outputs[0]];
	int64_t groups = ap_tensor_numel(o0) / w;
	unsigned grid = ap_grid_for(groups, bs);
	vdesc *vd = calloc((size_t)g->n_tensors + 1, sizeof(*vd));
	ap_kir_var ***vals = calloc((size_t)g->n_outputs + 1, sizeof(*vals));
	vec_hook h = {calloc((size_t)g->n_tensors + 1, sizeof(ap_kir_var **)), w, 0};
	ap_kir_block *saved;
	ap_kir_var *q;
	ap_kir_expr *base;

	if (!vd || !vals || !h.lanes) {
		free(vd);
		free(vals);
		free(h.lanes);
		ap_v_fail(v, AP_ENOMEM, NULL, "out of memory");
		return AP_ENOMEM;
	}
	vector_ok(m, w, vd);
	k->grid[0] = grid;
	k->block[0] = bs;
	q = ap_v_loop(v, "q",
		      ap_kir_add(k, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_BLOCK_X), bs),
				 ap_kir_index_of(k, AP_KIR_THREAD_X)),
		      ap_kir_idx(k, groups), (int64_t)grid * bs, &saved);
	base = ap_kir_bind(k, v->cur, k->index_type, "i", ap_kir_muli(k, ap_kir_ref(k, q), w));
	/* one vector load per leaf read at the element or as a trailing broadcast */
	for (int t = 0; t < g->n_tensors; t++) {
		ap_kir_var **lane;
		ap_kir_expr *idx;

		if (!vector_leaf(g, t, vd, w))
			continue;
		lane = calloc((size_t)w, sizeof(*lane));
		if (!lane) {
			ap_v_fail(v, AP_ENOMEM, NULL, "out of memory");
			break;
		}
		for (int j = 0; j < w; j++)
			lane[j] = ap_kir_var_new(k, g->tensors[t].dtype, "e");
		idx = vd[t].kind == VD_SAME ? base
					    : ap_kir_binary(k, AP_KIR_REM, base, ap_kir_idx(k, vd[t].mod));
		ap_kir_vload(k, v->cur, ap_v_buffer(v, t), idx, w, lane);
		h.lanes[t] = lane;
	}
	v->leaf = vec_leaf;
	v->leaf_user = &h;
	for (int i = 0; i < g->n_outputs; i++)
		vals[i] = calloc((size_t)w, sizeof(ap_kir_var *));
	for (int j = 0; j < w && !v->rc; j++) {
		ap_lidx ix = ap_lidx_shape(o0);

		h.lane = j;
		ix.lin = ap_kir_addi(k, base, j);
		for (int i = 0; i < g->n_outputs && !v->rc; i++) {
			ap_lidx r = ix;
			ap_kir_expr *e = ap_val(v, g->outputs[i], &r);

			if (!vals[i]) {
				ap_v_fail(v, AP_ENOMEM, NULL, "out of memory");
				break;
			}
			vals[i][j] = ap_kir_var_new(k, g->tensors[g->outputs[i]].dtype, "w");
			ap_kir_let(k, v->cur, vals[i][j], e);
		}
	}
	for (int i = 0; i < g->n_outputs && !v->rc; i++) {
		ap_kir_expr *es[4];

		for (int j = 0; j < w; j++)
			es[j] = ap_kir_ref(k, vals[i][j]);
		ap_kir_vstore(k, v->cur, ap_v_buffer(v, g->outputs[i]), base, w, es);
	}
	ap_v_close(v, saved);
	v->leaf = NULL;
	for (int t = 0; t < g->n_tensors; t++)
		free(h.lanes[t]);
	free(h.lanes);
	for (int i = 0; i < g->n_outputs; i++)
		free(vals[i]);
	free(vals);
	free(vd);
	return v->rc;
}

static int pw_emit(const ap_bound *b, const ap_plan *pl, ap_kir_kernel *k, ap_error *err)
{
	const ap_sched *s = &pl->s;
	const ap_mgraph *m = b->m;
	const ap_graph *g = m->g;
	unsigned bs = (unsigned)s->v[0], grid;
	bool *done = calloc((size_t)g->n_outputs + 1, sizeof(bool));
	ap_vctx v;
	int rc;

	if (!done)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering a micro-graph");
	if ((rc = ap_vctx_init(&v, m, k, err))) {
		free(done);
		return rc;
	}
	if (s->n > 1 && s->v[1] > 1) {
		rc = emit_vector(m, &v, bs, s->v[1]);
		ap_vctx_clear(&v);
		free(done);
		return rc;
	}
	grid = ap_grid_for(((const pw_plan *)b->an)->max_numel, bs);
	k->grid[0] = grid;
	k->block[0] = bs;
	for (int i = 0; i < g->n_outputs && !v.rc; i++) {
		const ap_tensor *first = &g->tensors[g->outputs[i]];
		ap_kir_block *saved;
		ap_kir_var *iv;
		ap_lidx ix;

		if (done[i])
			continue;
		iv = ap_v_loop(&v, "i",
			       ap_kir_add(k, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_BLOCK_X), bs),
					  ap_kir_index_of(k, AP_KIR_THREAD_X)),
			       ap_kir_idx(k, ap_tensor_numel(first)), (int64_t)grid * bs, &saved);
		ix = ap_lidx_shape(first);
		ix.lin = ap_kir_ref(k, iv);
		/* name the coordinates once */
		for (int d = 0; d < ix.rank; d++)
			if (ix.dims[d] != 1)
				ix.c[d] = ap_kir_bind(k, v.cur, k->index_type, "x", ap_lidx_coord(&v, &ix, d));
		for (int j = i; j < g->n_outputs; j++) {
			int o = g->outputs[j];
			ap_lidx r;

			if (done[j] || !ap_lidx_same_dims(&ix, &g->tensors[o]))
				continue;
			done[j] = true;
			r = ix;
			ap_kir_store(k, v.cur, ap_v_buffer(&v, o), ix.lin, ap_val(&v, o, &r));
		}
		ap_v_close(&v, saved);
	}
	rc = v.rc;
	ap_vctx_clear(&v);
	free(done);
	return rc;
}

/* ---- traffic: shared by the emitters that inline producers ---------------------- */

typedef struct mg_view {
	const ap_graph *g;
} mg_view;

static int mg_source_of(int t, void *user)
{
	const ap_graph *g = ((mg_view *)user)->g;
	int p;

	while ((p = g->tensors[t].producer) >= 0 && ap_op_is_view(g->nodes[p].op) &&
	       !g->tensors[t].is_output && g->nodes[p].inputs[0] >= 0)
		t = g->nodes[p].inputs[0];
	return t;
}

static bool mg_written(int t, void *user)
{
	return ((mg_view *)user)->g->tensors[t].is_output;
}

static double tensor_bytes(const ap_tensor *t)
{
	int64_t n = ap_tensor_numel(t);

	return n > 0 ? (double)n * (double)ap_dtype_size(t->dtype) : 0.0;
}

/* Bytes read (the elements of each input it touches, once) and written
 * (each output once) and arithmetic
 * (every evaluation of a compute node's output, by the cost model's
 * evaluation counts) of micro-graph m when producers are inlined. */
double ap_lower_recompute(const ap_mgraph *m)
{
	const ap_graph *g = m->g;
	ap_cost_evals_ctx *c = ap_cost_evals_new(g);
	mg_view mv = {g};
	ap_cost_graph_view gv = {mg_source_of, mg_written, &mv};
	int *nodes = malloc(((size_t)g->n_nodes + 1) * sizeof(int));
	double worst = 1;
	int64_t space = 0;

	if (!c || !nodes) {
		ap_cost_evals_free(c);
		free(nodes);
		return 0;
	}
	for (int i = 0; i < g->n_nodes; i++)
		nodes[i] = i;
	ap_cost_evals(c, nodes, g->n_nodes, &gv);
	for (int i = 0; i < g->n_outputs; i++)
		if (ap_tensor_numel(&g->tensors[g->outputs[i]]) > space)
			space = ap_tensor_numel(&g->tensors[g->outputs[i]]);
	for (int i = 0; i < g->n_nodes; i++) {
		const ap_node *node = &g->nodes[i];
		int t = node->n_outputs > 0 ? node->outputs[0] : -1;
		int64_t n = t >= 0 ? ap_tensor_numel(&g->tensors[t]) : 0;

		/* intermediates of the iteration space's size or larger: a smaller
		 * one is a broadcast operand, evaluated per use by design */
		if (t < 0 || n <= 0 || n < space || g->tensors[t].is_output || ap_op_is_view(node->op))
			continue;
		if (ap_cost_eval_of(c, t) / (double)n > worst)
			worst = ap_cost_eval_of(c, t) / (double)n;
	}
	ap_cost_evals_free(c);
	free(nodes);
	return worst;
}

double ap__lower_node_flops(const ap_graph *g, const ap_node *n, double evals)
{
	double per = ap_op_category_of(n->op) == AP_CAT_MATMUL ? 2.0 : 1.0, f = 0;

	if (ap_op_is_view(n->op) || n->n_outputs < 1 || n->outputs[0] < 0)
		return 0;
	for (int j = 0; j < n->n_inputs; j++)
		if (n->inputs[j] >= 0)
			f += per * evals * ap_cost_reads_per_element(g, n, j) / n->n_inputs;
	return f;
}

int ap__lower_inline_traffic(const ap_mgraph *m, ap_traffic *out)
{
	const ap_graph *g = m->g;
	ap_cost_evals_ctx *c = ap_cost_evals_new(g);
	mg_view mv = {g};
	ap_cost_graph_view gv = {mg_source_of, mg_written, &mv};
	int *nodes = malloc(((size_t)g->n_nodes + 1) * sizeof(int));

	for (int i = 0; i < g->n_inputs; i++) {
		const ap_tensor *x = &g->tensors[g->inputs[i]];

		out->bytes_read += ap_cost_touched(g, g->inputs[i]) * (double)ap_dtype_size(x->dtype);
	}
	for (int i = 0; i < g->n_outputs; i++)
		out->bytes_written += tensor_bytes(&g->tensors[g->outputs[i]]);
	if (c && nodes) {
		for (int i = 0; i < g->n_nodes; i++)
			nodes[i] = i;
		ap_cost_evals(c, nodes, g->n_nodes, &gv);
		for (int i = 0; i < g->n_nodes; i++) {
			const ap_node *node = &g->nodes[i];

			if (!ap_op_is_view(node->op) && node->n_outputs >= 1 && node->outputs[0] >= 0)
				out->flops += ap__lower_node_flops(g, node,
								   ap_cost_eval_of(c, node->outputs[0]));
		}
	}
	free(nodes);
	ap_cost_evals_free(c);
	return c && nodes ? 0 : AP_ENOMEM;
}

static int pw_traffic(const ap_bound *b, const ap_plan *pl, ap_traffic *out)
{
	const ap_sched *s = &pl->s;
	memset(out, 0, sizeof(*out));
	out->threads = (unsigned)s->v[0];
	out->blocks = ap_grid_for(((const pw_plan *)b->an)->max_numel / (s->n > 1 ? s->v[1] : 1), s->v[0]);
	return ap__lower_inline_traffic(b->m, out);
}

const ap_emitter ap_emitter_pointwise = {
	"pointwise", pw_bind, NULL, pw_space, pw_choose, pw_emit, pw_traffic, NULL, false, NULL,
};
