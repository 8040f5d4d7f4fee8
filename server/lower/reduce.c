/* reduce.c -- reduction emitters.
 *
 * row_reduce: a reduction micro-graph (producers + one reduction whose
 * result is the only tensor written) whose reduction covers at least 32
 * elements: one block per output element (a grid-stride loop over
 * blocks), each thread folding a strided part of the reduced elements,
 * then a tree in shared memory.  Knobs: "block".
 */
#include "emitters.h"

#include <string.h>

#define REDUCE_BLOCK_MIN 32

static bool rr_match(const ap_mgraph *m, const ap_target_info *t)
{
	const ap_graph *g = m->g;
	const ap_node *root = &g->nodes[m->root];

	return m->kind == AP_GROUP_REDUCTION && g->n_outputs == 1 &&
	       ap_op_category_of(root->op) == AP_CAT_REDUCTION && g->outputs[0] == root->outputs[0] &&
	       ap_reduced_count(g, root) >= REDUCE_BLOCK_MIN;
}

static void rr_space(const ap_mgraph *m, const ap_target_info *t, ap_space *sp)
{
	sp->n = 1;
	ap_knob_pow2(&sp->knobs[0], "block", 32, ap_block_cap(t));
}

static void rr_choose(const ap_mgraph *m, const ap_target_info *t, const ap_space *sp, ap_sched *s)
{
	s->v[0] = (int)ap_pow2_at_least(ap_reduced_count(m->g, &m->g->nodes[m->root]), 32,
					ap_block_cap(t));
}

static int rr_emit(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t, ap_kir_kernel *k,
		   ap_error *err)
{
	const ap_graph *g = m->g;
	const ap_node *node = &g->nodes[m->root];
	int y = node->outputs[0], x = node->inputs[0];
	ap_dtype dt = g->tensors[y].dtype;
	int64_t M = ap_tensor_numel(&g->tensors[y]), R = ap_reduced_count(g, node);
	unsigned bs = (unsigned)s->v[0];
	unsigned grid = M > AP_MAX_GRID ? AP_MAX_GRID : (M < 1 ? 1 : (unsigned)M);
	ap_kir_block *saved, *saved_r, *sv;
	ap_kir_var *o, *acc, *r;
	ap_kir_array *sh;
	ap_kir_expr *tx;
	ap_lidx ox, in;
	ap_vctx v;
	int rc;

	if ((rc = ap_vctx_init(&v, m, k, err)))
		return rc;
	sh = ap_kir_shared(k, "red", dt, bs);
	tx = ap_kir_index_of(k, AP_KIR_THREAD_X);
	k->grid[0] = grid;
	k->block[0] = bs;
	o = ap_v_loop(&v, "o", ap_kir_index_of(k, AP_KIR_BLOCK_X), ap_kir_idx(k, M), grid, &saved);
	ox = ap_lidx_shape(&g->tensors[y]);
	ox.lin = ap_kir_ref(k, o);
	acc = ap_kir_var_new(k, dt, "acc");
	ap_kir_let(k, v.cur, acc, ap_v_reduce_identity(&v, node->op, dt));
	r = ap_v_loop(&v, "r", tx, ap_kir_idx(k, R), bs, &saved_r);
	in = ap_reduce_in_idx(&v, node, x, &ox, ap_kir_ref(k, r));
	ap_kir_assign(k, v.cur, acc, ap_v_reduce_combine(&v, node->op, ap_kir_ref(k, acc), ap_val(&v, x, &in)));
	ap_v_close(&v, saved_r);
	ap_kir_store(k, v.cur, sh, tx, ap_kir_ref(k, acc));
	ap_kir_barrier(k, v.cur);
	for (unsigned st = bs / 2; st > 0; st /= 2) {
		ap_v_if(&v, ap_kir_binary(k, AP_KIR_LT, tx, ap_kir_idx(k, st)), &sv, NULL);
		{
			ap_kir_expr *mine = ap_kir_bind(k, v.cur, dt, "a", ap_kir_load(k, sh, tx));
			ap_kir_expr *other = ap_kir_bind(k, v.cur, dt, "b",
							 ap_kir_load(k, sh, ap_kir_addi(k, tx, st)));

			ap_kir_store(k, v.cur, sh, tx, ap_v_reduce_combine(&v, node->op, mine, other));
		}
		ap_v_close(&v, sv);
		ap_kir_barrier(k, v.cur);
	}
	ap_v_if(&v, ap_kir_binary(k, AP_KIR_EQ, tx, ap_kir_idx(k, 0)), &sv, NULL);
	ap_kir_store(k, v.cur, ap_v_buffer(&v, y), ap_kir_ref(k, o), ap_kir_load(k, sh, ap_kir_idx(k, 0)));
	ap_v_close(&v, sv);
	ap_kir_barrier(k, v.cur);   /* `red` is reused by the next element */
	ap_v_close(&v, saved);
	rc = v.rc;
	ap_vctx_clear(&v);
	return rc;
}

static void rr_traffic(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t, ap_traffic *out)
{
	int64_t M = ap_tensor_numel(&m->g->tensors[m->g->outputs[0]]);

	memset(out, 0, sizeof(*out));
	ap__lower_inline_traffic(m, out);
	out->threads = (unsigned)s->v[0];
	out->blocks = M > AP_MAX_GRID ? AP_MAX_GRID : (M < 1 ? 1 : (unsigned)M);
	out->shared_bytes = (unsigned)(s->v[0] * ap_dtype_size(m->g->tensors[m->g->outputs[0]].dtype));
}

const ap_emitter ap_emitter_row_reduce = {
	"row_reduce", rr_match, rr_space, rr_choose, rr_emit, rr_traffic,
};
