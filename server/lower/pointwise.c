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
 * named once.  Knobs: "block" (threads per block).
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

static bool pw_match(const ap_mgraph *m, const ap_target_info *t)
{
	return true;
}

static void pw_space(const ap_mgraph *m, const ap_target_info *t, ap_space *sp)
{
	sp->n = 1;
	ap_knob_pow2(&sp->knobs[0], "block", 32, ap_block_cap(t));
}

static void pw_choose(const ap_mgraph *m, const ap_target_info *t, const ap_space *sp, ap_sched *s)
{
	s->v[0] = (int)ap_pow2_at_least(max_output_numel(m), 32, ap_block_cap(t));
}

static int pw_emit(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t, ap_kir_kernel *k,
		   ap_error *err)
{
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
	grid = ap_grid_for(max_output_numel(m), bs);
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
void ap__lower_inline_traffic(const ap_mgraph *m, ap_traffic *out)
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
			double per = ap_op_category_of(node->op) == AP_CAT_MATMUL ? 2.0 : 1.0;

			if (ap_op_is_view(node->op) || node->n_outputs < 1 || node->outputs[0] < 0)
				continue;
			for (int j = 0; j < node->n_inputs; j++)
				if (node->inputs[j] >= 0)
					out->flops += per * ap_cost_eval_of(c, node->outputs[0]) *
						      ap_cost_reads_per_element(g, node, j) /
						      node->n_inputs;
		}
	}
	free(nodes);
	ap_cost_evals_free(c);
}

static void pw_traffic(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t, ap_traffic *out)
{
	memset(out, 0, sizeof(*out));
	ap__lower_inline_traffic(m, out);
	out->threads = (unsigned)s->v[0];
	out->blocks = ap_grid_for(max_output_numel(m), s->v[0]);
}

const ap_emitter ap_emitter_pointwise = {
	"pointwise", pw_match, pw_space, pw_choose, pw_emit, pw_traffic,
};
