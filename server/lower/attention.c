/* attention.c -- the fused attention emitter: O = softmax(S) @ V with
 * S = f(Q @ K^T) (a scale, a mask: any elementwise epilogue of the first
 * product) as one kernel that never writes S or P, by the online softmax of
 * FlashAttention (Dao et al., 2022; Milakov and Gimelshein, "Online
 * normalizer calculation for softmax", 2018).
 *
 * The micro-graph (kind "attention", made by Layer II from the QK^T
 * product, the softmax statistics and the PV product, server/fuse) holds
 * the primitives Softmax opens into (expand.c):
 *   Y1 = MatMul(Q, KT); S = elementwise(Y1, ...); m = ReduceMax(S, last);
 *   E = Exp(S - m); l = ReduceSum(E, last); P = E / l; O = MatMul(P, V)
 * and O's epilogue (views, transposes, elementwise ops).  Per row of S the
 * kernel keeps a running maximum m and sum l and an output accumulator,
 * and for each tile of keys: s_j = S(q . k_j); m' = max(m, max_j s_j);
 * l = l * exp(m - m') + sum_j exp(s_j - m'); acc = acc * exp(m - m') +
 * sum_j exp(s_j - m') v_j; m = m'.  At the end O = acc / l, which is
 * softmax(S) @ V (a row whose scores are all -inf gives NaN, as the
 * unfused graph does; in the safe form -- Attention's safe_softmax,
 * expand.c -- acc / Max(l, 1) = 0).  S, m and l are written too when another kernel
 * reads them, and so is what is computed from m and l alone (Attention's
 * LogSumExp m + log l, which its backward, AttentionGrad, reads to
 * recompute P: O(rows) saved, no S).
 *
 * Two forms.  The tensor-core form (float16 / bfloat16, and float32 with
 * allow_tf32, on sm_80 and later; "the tensor-core form" below) keeps 16
 * query rows a warp on mma.sync.  The SIMT form (everything else, and the
 * host) is this.
 *
 * SIMT layout: a block takes `rows` query rows of one batch, one warp per row,
 * and walks the keys in tiles of 32 (a key per lane): the tile of K and
 * of V is staged in shared memory (the value builder loads it, so views
 * and prologues of K and V are read in place), each lane computes its
 * score against the row's query (held in shared memory), the warp reduces
 * the tile's maximum and sum with shuffles, writes its probabilities to
 * shared memory, and each lane accumulates the output columns lane, lane
 * + 32, ... of its row.  The host runs the same kernel (shuffles and
 * barriers emulated).
 *
 * Knobs: "rows" (query rows per block); tensor cores: "warps" (16 query
 * rows each) and "keys" (the K / V tile).
 *
 * Files: this one (the analysis, the space, the plan, the emitter
 * record), attention_kernel.c (the steps both forms share, the SIMT form),
 * attention_tc.c (the tensor-core form); attention_internal.h between them.
 */
#include "attention_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void plan_clear(att_plan *p)
{
	free(p->maps);
	free(p->dep);
	p->maps = NULL;
	p->dep = NULL;
}

static int producer(const ap_graph *g, int t, ap_op op)
{
	int n = t >= 0 ? g->tensors[t].producer : -1;

	return n >= 0 && g->nodes[n].op == op ? n : -1;
}

/* A reduction of the last axis of x, keeping it. */
static bool last_axis_kept(const ap_graph *g, int node)
{
	const ap_node *n = &g->nodes[node];
	const ap_attr *ax = ap_node_attr(n, "axes");
	const ap_tensor *x = &g->tensors[n->inputs[0]];

	return ax && ax->n_ints == 1 && ax->ints[0] == x->rank - 1 && ap_node_int(n, "keepdims", 1) == 1;
}

/* The probabilities a product's operand a is: a, or x where a is a Cast
 * of float32 x to 16-bit a (Attention's fp32_scores, expand.c: the
 * softmax in float32, P rounded to the operands' type, which the kernel
 * does as it stores P for the second product). */
static int probabilities(const ap_graph *g, int a)
{
	int n = producer(g, a, AP_OP_CAST);
	int x = n >= 0 ? g->nodes[n].inputs[0] : -1;

	if (x >= 0 && g->tensors[x].dtype == AP_DT_F32 &&
	    (g->tensors[a].dtype == AP_DT_F16 || g->tensors[a].dtype == AP_DT_BF16))
		return x;
	return a;
}

/* The two products: mm2 reads the probabilities (a Div's output), mm1
 * makes Y1 = Q K^T; their operands and outputs into p.  0 with *why when
 * there are not two products or none reads probabilities. */
static int find_products(const ap_graph *g, att_plan *p, char *why, size_t cap)
{
	int n_mm = 0, mms[2];

	for (int i = 0; i < g->n_nodes; i++)
		if (g->nodes[i].op == AP_OP_MATMUL && n_mm++ < 2)
			mms[n_mm - 1] = i;
	if (n_mm != 2) {
		snprintf(why, cap, "%d products, not two", n_mm);
		return 0;
	}
	for (int i = 0; i < 2; i++) {
		int a = probabilities(g, g->nodes[mms[i]].inputs[0]);

		if (producer(g, a, AP_OP_DIV) >= 0) {
			p->mm2 = mms[i];
			p->mm1 = mms[1 - i];
		}
	}
	if (p->mm1 == p->mm2) {
		snprintf(why, cap, "no product of probabilities");
		return 0;
	}
	p->p = probabilities(g, g->nodes[p->mm2].inputs[0]);
	p->v = g->nodes[p->mm2].inputs[1];
	p->o = g->nodes[p->mm2].outputs[0];
	p->q = g->nodes[p->mm1].inputs[0];
	p->kt = g->nodes[p->mm1].inputs[1];
	p->y1 = g->nodes[p->mm1].outputs[0];
	return 1;
}

/* Whether x is Max(y, c) for a constant scalar c equal to want: y's
 * tensor, else -1. */
static int max_with(const ap_graph *g, int x, double want)
{
	int n = producer(g, x, AP_OP_MAX);

	if (n < 0 || g->nodes[n].n_inputs != 2)
		return -1;
	for (int j = 0; j < 2; j++) {
		double v;

		if (ap_tensor_scalar(g, g->nodes[n].inputs[j], &v) && v == want)
			return g->nodes[n].inputs[1 - j];
	}
	return -1;
}

/* The softmax between the products: P = E / l, E = Exp(S - m),
 * m = ReduceMax(S), l = ReduceSum(E) (or of exp(S - m) recomputed), both
 * over S's last axis, kept; or its safe form (expand.c, safe_softmax),
 * E = Exp(S - Max(m, lowest finite)), P = E / Max(l, 1).  p->e, l, s, m
 * and safe set (m and l the reductions).  0 with *why when not. */
static int match_softmax(const ap_graph *g, att_plan *p, char *why, size_t cap)
{
	int dv_node, ex_node, sub_node, rs_node, rm_node, msub, lm;

	dv_node = producer(g, p->p, AP_OP_DIV);
	p->e = g->nodes[dv_node].inputs[0];
	p->l = g->nodes[dv_node].inputs[1];
	ex_node = producer(g, p->e, AP_OP_EXP);
	if ((lm = max_with(g, p->l, 1.0)) >= 0) {
		p->safe = true;
		p->l = lm;
	}
	rs_node = producer(g, p->l, AP_OP_REDUCE_SUM);
	sub_node = ex_node >= 0 ? producer(g, g->nodes[ex_node].inputs[0], AP_OP_SUB) : -1;
	if (ex_node < 0 || rs_node < 0 || sub_node < 0) {
		snprintf(why, cap, "the probabilities are not exp(S - max) / sum");
		return 0;
	}
	p->s = g->nodes[sub_node].inputs[0];
	msub = p->m = g->nodes[sub_node].inputs[1];
	if (p->safe) {
		const ap_tensor *st = &g->tensors[p->s];

		p->m = max_with(g, msub, ap_dtype_lowest_finite(st->dtype));
		if (p->m < 0) {
			snprintf(why, cap, "a sum clamped to 1 without the max clamped to the lowest value");
			return 0;
		}
	}
	if (g->nodes[rs_node].inputs[0] != p->e) {
		/* the partitioner may have recomputed exp(S - max) for the sum */
		int e2 = producer(g, g->nodes[rs_node].inputs[0], AP_OP_EXP);
		int s2 = e2 >= 0 ? producer(g, g->nodes[e2].inputs[0], AP_OP_SUB) : -1;

		int ms2 = s2 >= 0 ? g->nodes[s2].inputs[1] : -1;

		/* (the safe form's clamped max may be recomputed with it) */
		if (s2 < 0 || g->nodes[s2].inputs[0] != p->s ||
		    (ms2 != msub && (!p->safe || max_with(g, ms2, ap_dtype_lowest_finite(g->tensors[p->s].dtype)) != p->m))) {
			snprintf(why, cap, "the sum is not of exp(S - max)");
			return 0;
		}
	}
	rm_node = producer(g, p->m, AP_OP_REDUCE_MAX);
	if (rm_node < 0 || g->nodes[rm_node].inputs[0] != p->s || !last_axis_kept(g, rm_node) ||
	    !last_axis_kept(g, rs_node)) {
		snprintf(why, cap, "the softmax does not normalise the scores' last axis");
		return 0;
	}
	return 1;
}

/* Types and shapes: S [.., Nq, Nk], Q [.., Nq, D], K^T [.., D, Nk],
 * V [.., Nk, Dv] and O [.., Nq, Dv] of one float type, batches equal
 * (Q, K^T, V broadcast); the form (tensor cores or SIMT) and, on tensor
 * cores, each operand's cp.async width; the head dims must fit the
 * form's registers or shared memory.  0 with *why when not. */
static int check_shapes(const ap_graph *g, const ap_target_info *t, att_plan *p, char *why, size_t cap)
{
	const ap_tensor *st = &g->tensors[p->s], *qt = &g->tensors[p->q], *kt = &g->tensors[p->kt];
	const ap_tensor *vt = &g->tensors[p->v], *ot = &g->tensors[p->o];

	if (st->rank < 2 || qt->rank < 2 || kt->rank < 2 || vt->rank < 2 || ot->rank != st->rank) {
		snprintf(why, cap, "vector operands");
		return 0;
	}
	p->t = qt->dtype;
	p->acc = ap_acc_type(p->t);
	/* the scores in the operands' type, or float32 over 16-bit operands
	 * (Attention's fp32_scores) */
	if (!ap_dtype_is_float(p->t) || (st->dtype != p->t && st->dtype != p->acc) || kt->dtype != p->t ||
	    vt->dtype != p->t || ot->dtype != p->t) {
		snprintf(why, cap, "operands of type %s", ap_dtype_name(qt->dtype));
		return 0;
	}
	p->tc = t->gpu && t->arch >= 80 &&
		(p->t == AP_DT_F16 || p->t == AP_DT_BF16 || (p->t == AP_DT_F32 && t->allow_tf32));
	p->mma = p->t == AP_DT_BF16 ? AP_KIR_MMA_BF16_16816
		 : p->t == AP_DT_F16 ? AP_KIR_MMA_F16_16816 : AP_KIR_MMA_TF32_1688;
	p->nb = st->rank - 2;
	p->Nq = st->dims[p->nb];
	p->Nk = st->dims[p->nb + 1];
	p->D = qt->dims[qt->rank - 1];
	p->Dv = vt->dims[vt->rank - 1];
	p->batch = 1;
	for (int d = 0; d < p->nb; d++) {
		p->bdims[d] = st->dims[d];
		p->batch *= st->dims[d];
		if (ot->dims[d] != st->dims[d]) {
			snprintf(why, cap, "the two products have different batches");
			return 0;
		}
	}
	if (p->Nq < 1 || p->Nk < 1 || p->D < 1 || p->Dv < 1 || vt->dims[vt->rank - 2] != p->Nk ||
	    ot->dims[p->nb] != p->Nq || ot->dims[p->nb + 1] != p->Dv) {
		snprintf(why, cap, "shapes that do not chain");
		return 0;
	}
	for (int r = 0; p->tc && r < 3; r++)
		p->aw[r] = ap_sview_copy_width(g, r == 0 ? p->q : r == 1 ? p->kt : p->v, r == 1, &p->sv[r], &p->leaf[r]);
	p->kv_tma = p->tc && p->leaf[1] != p->leaf[2] && ap__att_op_tma(g, p, 1) && ap__att_op_tma(g, p, 2);
	p->q_tma = p->kv_tma && p->leaf[0] != p->leaf[1] && p->leaf[0] != p->leaf[2] && ap__att_op_tma(g, p, 0);
	/* mma.sync holds Q's fragments and the output in registers; wgmma
	 * reads Q from shared memory and keeps one m64nDv accumulator (Dv up
	 * to 256, one wgmma's N): whole warpgroups only past TC_HEAD_MAX */
	if (p->tc && (p->D > TC_HEAD_MAX || p->Dv > TC_HEAD_MAX) &&
	    !(tc_wg(p, t) && p->D <= TC_WG_HEAD_MAX && p->Dv <= TC_WG_HEAD_MAX)) {
		snprintf(why, cap, "head dims %lld and %lld: the tensor-core form holds at most %d in registers "
			 "(%d on wgmma)", (long long)p->D, (long long)p->Dv, TC_HEAD_MAX, TC_WG_HEAD_MAX);
		return 0;
	}
	/* shared memory: the K and V tiles, the rows' queries and probabilities
	 * (SIMT, 8 rows); the tensor-core form's smallest tiles are smaller */
	if (!p->tc && (size_t)(KEYS * (p->D + 1 + p->Dv) + 8 * (p->D + KEYS)) * ap_dtype_size(p->acc) >
	    t->shared_per_block) {
		snprintf(why, cap, "head dims %lld and %lld do not fit in shared memory", (long long)p->D,
			 (long long)p->Dv);
		return 0;
	}
	return 1;
}

/* S from Y1 element for element: a chain of elementwise and broadcast
 * ops, each reading exactly one tensor that depends on Y1, of its own
 * shape (the rest -- a scale, a mask -- read at the element).  Fills
 * p->dep (per tensor: computed from Y1).  0 with *why when not. */
static int scores_from_product(const ap_graph *g, att_plan *p, char *why, size_t cap)
{
	p->dep[p->y1] = true;
	for (int i = 0; i < g->n_nodes; i++)
		for (int j = 0; j < g->nodes[i].n_inputs; j++)
			if (g->nodes[i].inputs[j] >= 0 && p->dep[g->nodes[i].inputs[j]])
				for (int o = 0; o < g->nodes[i].n_outputs; o++)
					if (g->nodes[i].outputs[o] >= 0)
						p->dep[g->nodes[i].outputs[o]] = true;
	for (int x = p->s; x != p->y1;) {
		int pn = g->tensors[x].producer, next = -1, nd = 0;
		ap_op_category cat = pn >= 0 ? ap_op_category_of(g->nodes[pn].op) : AP_CAT_OPAQUE;

		if (pn < 0 || (cat != AP_CAT_ELEMWISE && cat != AP_CAT_BROADCAST) || g->nodes[pn].op == AP_OP_EXPAND) {
			snprintf(why, cap, "the scores are not the first product element for element");
			return 0;
		}
		for (int j = 0; j < g->nodes[pn].n_inputs; j++) {
			int in = g->nodes[pn].inputs[j];

			if (in >= 0 && p->dep[in]) {
				nd++;
				next = in;
			}
		}
		if (nd != 1 || !ap_dims_equal(g->tensors[next].rank, g->tensors[next].dims, g->tensors[x].rank,
					      g->tensors[x].dims)) {
			snprintf(why, cap, "the scores are not the first product element for element");
			return 0;
		}
		x = next;
	}
	return 1;
}

/* Whether tensor x is computed from the row statistics m and l alone,
 * element for element (elementwise ops, casts and views of m and l, and
 * constants: Attention's LogSumExp, m + log l), with one element per row
 * of S.  depth bounds the walk. */
static bool from_stats(const ap_graph *g, const att_plan *p, int x, int depth)
{
	const ap_tensor *t = &g->tensors[x];
	int pn = t->producer;
	ap_op_category cat;

	if (x == p->m || x == p->l || t->kind == AP_TENSOR_CONST)
		return x != p->m && x != p->l ? ap_tensor_numel(t) == 1 : true;
	if (pn < 0 || depth > 16 || ap_tensor_numel(t) != ap_tensor_numel(&g->tensors[p->m]))
		return false;
	cat = ap_op_category_of(g->nodes[pn].op);
	if (cat != AP_CAT_ELEMWISE && cat != AP_CAT_BROADCAST && g->nodes[pn].op != AP_OP_RESHAPE)
		return false;
	if (g->nodes[pn].op == AP_OP_EXPAND || g->nodes[pn].op == AP_OP_WHERE)
		return false;
	for (int j = 0; j < g->nodes[pn].n_inputs; j++) {
		int in = g->nodes[pn].inputs[j];

		if (in >= 0 && !from_stats(g, p, in, depth + 1))
			return false;
		if (in >= 0 && g->nodes[pn].op != AP_OP_RESHAPE && g->tensors[in].kind != AP_TENSOR_CONST &&
		    ap_tensor_numel(&g->tensors[in]) != ap_tensor_numel(t))
			return false;
	}
	return true;
}

/* What the kernel writes: O's epilogue (p->maps), S, the max and the
 * sum for other kernels (p->s_out, m_out, l_out), and outputs computed
 * from the max and the sum alone (p->stat: the LogSumExp the backward
 * reads).  0 with *why when the micro-graph writes anything else. */
static int classify_outputs(const ap_graph *g, att_plan *p, char *why, size_t cap)
{
	for (int i = 0; i < g->n_outputs; i++) {
		int x = g->outputs[i];

		if (p->maps[x].derived)
			continue;
		if (x == p->s)
			p->s_out = true;
		else if (x == p->m)
			p->m_out = true;
		else if (x == p->l)
			p->l_out = true;
		else if (p->n_stat < 4 && from_stats(g, p, x, 0))
			p->stat[p->n_stat++] = x;
		else {
			snprintf(why, cap, "it would write %s, which only the unfused form computes",
				 g->tensors[x].name);
			return 0;
		}
	}
	return 1;
}

/* S = Where(cond, x, -inf): x, else -1. */
static int where_ninf(const ap_graph *g, int s)
{
	int w = producer(g, s, AP_OP_WHERE);
	double v;

	return w >= 0 && g->nodes[w].n_inputs == 3 && ap_tensor_scalar(g, g->nodes[w].inputs[2], &v) &&
	       v == -INFINITY ? g->nodes[w].inputs[1] : -1;
}

/* FlashAttention-2's fold of the softmax scale (Dao 2023, section 3.1:
 * the scale with log2(e) in one multiply-add before exp2): where S is
 * x = c Y1, Y1 times (or divided by) a positive finite scalar constant,
 * or Where(cond, x, -inf) (a causal or boolean mask), with Y1, x and S in
 * the accumulation type -- no rounding between -- and S not written,
 * softmax(S) = softmax over S / c computed from Y1 (or -inf) and its row
 * maxima: exp(S - max S) = exp2((S / c) c log2(e) - max(S / c) c log2(e))
 * (c > 0).  The factor c and p->sx = x, or 0. */
static double scale_fold(const ap_graph *g, att_plan *p)
{
	int w = where_ninf(g, p->s), x = w >= 0 ? w : p->s, n = g->tensors[x].producer;
	const ap_node *nd = n >= 0 ? &g->nodes[n] : NULL;
	double c;

	if (!nd || p->s_out || nd->n_inputs != 2 || nd->inputs[0] != p->y1 ||
	    (nd->op != AP_OP_MUL && nd->op != AP_OP_DIV) || g->tensors[p->y1].dtype != p->acc ||
	    g->tensors[x].dtype != p->acc || g->tensors[p->s].dtype != p->acc ||
	    !ap_tensor_scalar(g, nd->inputs[1], &c) ||
	    !ap_dims_equal(g->tensors[x].rank, g->tensors[x].dims, g->tensors[p->s].rank, g->tensors[p->s].dims))
		return 0;
	if (nd->op == AP_OP_DIV)
		c = 1 / c;
	if (!(c > 0 && isfinite(c)))
		return 0;
	p->sx = x;
	return c;
}

/* The causal mask of the scores: k >= 0 where S = Where(cond, x, -inf)
 * with cond [.., Nq, Nk] = Cast(Trilu(Expand(c), lower, k)) of a nonzero
 * scalar c -- true where key j <= query i + k (expand.c causal_cond) --
 * so that every score past row i's diagonal is -inf; else -1. */
static int64_t causal_of(const ap_graph *g, att_plan *p)
{
	int x = where_ninf(g, p->s), w = g->tensors[p->s].producer, cast, tri, ex;
	const ap_tensor *ct;
	double v;
	int64_t kk;

	if (x < 0 || !ap_dims_equal(g->tensors[x].rank, g->tensors[x].dims, g->tensors[p->s].rank,
				    g->tensors[p->s].dims))
		return -1;
	ct = &g->tensors[g->nodes[w].inputs[0]];
	cast = producer(g, g->nodes[w].inputs[0], AP_OP_CAST);
	tri = cast >= 0 ? producer(g, g->nodes[cast].inputs[0], AP_OP_TRILU) : -1;
	ex = tri >= 0 ? producer(g, g->nodes[tri].inputs[0], AP_OP_EXPAND) : -1;
	if (ct->rank < 2 || ct->dims[ct->rank - 2] != p->Nq || ct->dims[ct->rank - 1] != p->Nk || ex < 0 ||
	    ap_node_int(&g->nodes[tri], "upper", 1) != 0 || g->nodes[tri].n_inputs > 1 ||
	    !ap_tensor_scalar(g, g->nodes[ex].inputs[0], &v) || v == 0 || v != v)
		return -1;
	kk = ap_node_int(&g->nodes[tri], "k", 0);
	p->cx = x;
	return kk >= 0 ? kk : -1;
}

/* 1 when m is O = softmax(f(Q K^T)) V as the file comment says (p
 * filled), 0 with *why when not, AP_ENOMEM. */
static int analyze(const ap_mgraph *m, const ap_target_info *t, att_plan *p, char *why, size_t cap)
{
	const ap_graph *g = m->g;
	int rc;

	memset(p, 0, sizeof(*p));
	if (!find_products(g, p, why, cap) || !match_softmax(g, p, why, cap) || !check_shapes(g, t, p, why, cap))
		return 0;
	p->maps = calloc((size_t)g->n_tensors + 1, sizeof(ap_emap));
	p->dep = calloc((size_t)g->n_tensors + 1, sizeof(bool));
	if (!p->maps || !p->dep) {
		plan_clear(p);
		snprintf(why, cap, "out of memory");
		return AP_ENOMEM;
	}
	if ((rc = ap__epilogue_maps(g, p->o, p->maps, false, why, cap)) <= 0) {
		plan_clear(p);
		return rc;
	}
	if (!scores_from_product(g, p, why, cap) || !classify_outputs(g, p, why, cap)) {
		plan_clear(p);
		return 0;
	}
	p->sx = p->cx = -1;
	p->sfold = scale_fold(g, p);
	p->causal_k = causal_of(g, p);
	return 1;
}

int ap_lower_attention_ok(const ap_mgraph *m, const ap_target_info *t, char *why, size_t cap)
{
	att_plan p;
	int rc = analyze(m, t, &p, why, cap);

	plan_clear(&p);
	return rc;
}

/* The analysis of an attention micro-graph, kept for the binding. */
static int at_bind(const ap_mgraph *m, const ap_target_info *t, void **an, char *why, size_t cap)
{
	att_plan *p;
	int rc;

	if (m->kind != AP_GROUP_ATTENTION) {
		snprintf(why, cap, "not an attention micro-graph");
		return 0;
	}
	if (!(p = malloc(sizeof(*p))))
		return AP_ENOMEM;
	if ((rc = analyze(m, t, p, why, cap)) <= 0) {
		plan_clear(p);
		free(p);
		return rc;
	}
	*an = p;
	return 1;
}

static void at_unbind(void *an)
{
	plan_clear(an);
	free(an);
}

/* SIMT: "rows" (query rows a block, a warp each).  Tensor cores: "warps"
 * (16 query rows each) and "keys" (a tile of K and V); on wgmma with two
 * K / V stages also "overlap" (1: the softmax beside O += P V,
 * attention_tc.c ov_key_loop; 2: that, and warp specialised with two
 * query warpgroups, their products taking turns -- ping-pong,
 * ws_overlap_loop) and "tma" (1: K and V tiles filled by TMA,
 * where they are tensor maps; 2 the same warp specialised, Q a map too;
 * 3 warp specialised with a producer warpgroup copying them, any
 * operands); the new forms first where the request asks for the forms
 * not yet run on a GPU (ap_target_info.unvalidated). */
static int at_space(const ap_bound *b, ap_space *sp)
{
	const att_plan *p = b->an;
	bool only;

	sp->n = 1;
	ap_knob_pow2(&sp->knobs[0], p->tc ? "warps" : "rows", 1, 8);
	while (sp->knobs[0].n > 1 && (unsigned)sp->knobs[0].values[sp->knobs[0].n - 1] * 32u > ap_block_cap(b->t))
		sp->knobs[0].n--;
	if (p->tc) {
		sp->n = 2;
		ap_knob_pow2(&sp->knobs[1], "keys", 16, tc_wg(p, b->t) ? 128 : 64);
	}
	/* the forms not yet run on a GPU: a request for them (the device kit
	 * validates them) gets them only, where a warpgroup's tiles fit */
	only = p->tc && b->t->unvalidated && tc_fits(p, b->t, 4, 16);
	if (tc_overlap_fits(p, b->t)) {   /* wgmma: the softmax beside O += P V */
		sp->n = 3;
		sp->knobs[2] = only ? (ap_knob){ .name = "overlap", .n = 2, .values = { 2, 1 }, .late = true }
				    : (ap_knob){ .name = "overlap", .n = 3, .values = { 0, 1, 2 }, .late = true };
	}
	/* tma: 1 where K and V are maps, 2 where Q is too and the producer
	 * fits, 3 where the producer fits; 0 first, or (only) the new forms
	 * first -- 2, 1, 3 -- and 0 last where no map takes the operands */
	if (tc_tma_fits(p, b->t) || tc_wscopy_fits(p, b->t, 4)) {
		ap_knob *kb = &sp->knobs[3];

		sp->n = 4;
		*kb = (ap_knob){ .name = "tma", .n = 0, .late = true };
		if (!only)
			kb->values[kb->n++] = 0;
		if (only && tc_ws_fits(p, b->t, 4))
			kb->values[kb->n++] = 2;
		if (tc_tma_fits(p, b->t))
			kb->values[kb->n++] = 1;
		if (!only && tc_ws_fits(p, b->t, 4))
			kb->values[kb->n++] = 2;
		if (tc_wscopy_fits(p, b->t, 4))
			kb->values[kb->n++] = 3;
		if (only && !tc_tma_fits(p, b->t))
			kb->values[kb->n++] = 0;
	}
	return 0;
}

/* SIMT: 4 rows a block.  Tensor cores: 4 warps (64 query rows), fewer
 * while the blocks leave SMs idle; 64 keys a tile (fewer for short
 * sequences, 32 past head dim 64: the score and output fragments share
 * the registers), and fewer warps while the tiles do not fit in shared
 * memory. */
static int at_choose(const ap_bound *b, const ap_space *sp, ap_sched *s)
{
	const att_plan *p = b->an;
	const ap_target_info *t = b->t;
	int W, BK;

	if (!p->tc) {
		s->v[0] = sp->knobs[0].values[sp->knobs[0].n > 2 ? 2 : sp->knobs[0].n - 1];   /* 4 rows */
		return 0;
	}
	W = sp->knobs[0].values[sp->knobs[0].n > 2 ? 2 : sp->knobs[0].n - 1];
	/* wgmma: a warpgroup at least (64 query rows) */
	while (W > (tc_wg(p, t) ? 4 : 1) && p->batch * ((p->Nq + 16 * W - 1) / (16 * W)) < (int64_t)t->sm_count)
		W /= 2;
	BK = p->Nk > 32 ? 64 : p->Nk > 16 ? 32 : 16;
	if ((tc_dpad(p) > 64 || tc_dvpad(p) > 64) && BK > 32)
		BK = 32;
	if (tc_wg(p, t) && W % 4 == 0) {
		/* wgmma: up to 128 keys a tile (Q's re-reads from shared memory
		 * and the output's rescale amortised over more keys), fewer
		 * where the registers of the warpgroups and a producer's would
		 * not fit the SM's file (tc_traffic), or past 224 estimated: the
		 * estimate leaves out what the statistics' outputs and bfloat16's
		 * conversions add (ptxas, sm_90a: head dim 128 at 128 keys 221
		 * registers; 160 / 144 in bfloat16 with the statistics, estimated
		 * 232, takes 255 and spills); the form the space offers first
		 * decides whether a producer warpgroup shares the file */
		int form = sp->n > 3 ? sp->knobs[3].values[0] : 0;

		BK = p->Nk > 64 ? 128 : BK;
		while (BK > 16 && (tc_regs(p, t, W, BK) > 224 || !tc_regs_fit(p, t, W, BK, form)))
			BK /= 2;
	}
	while (W > 1 && !tc_fits(p, t, W, BK))
		W /= 2;
	while (BK > 16 && !tc_fits(p, t, W, BK))
		BK /= 2;
	s->v[0] = W;
	s->v[1] = BK;
	/* overlap: only by a tuning record until a GPU has run it, unless the
	 * request asks for such forms (the space's only value then): whole
	 * warpgroups, the key tile shrunk until they fit */
	if (sp->n > 3)
		s->v[3] = sp->knobs[3].values[0];   /* tma: as overlap */
	if (sp->n > 2) {
		s->v[2] = sp->knobs[2].values[0];
		if ((s->v[2] || (sp->n > 3 && s->v[3] >= 2)) && s->v[0] % 4) {
			s->v[0] = 4;
			while (s->v[1] > 16 && !tc_fits(p, t, 4, s->v[1]))
				s->v[1] /= 2;
		}
	}
	/* tma=2 and 3 (warp specialised): the producer warpgroup within the
	 * thread cap, else the space's next form that fits */
	for (int i = 0; sp->n > 3 && i < sp->knobs[3].n; i++) {
		int x = sp->knobs[3].values[i];

		s->v[3] = x;
		if (!(x == 2 && !tc_ws_fits(p, t, s->v[0])) && !(x == 3 && !tc_wscopy_fits(p, t, s->v[0])))
			break;
		s->v[3] = 0;
	}
	/* ping-pong (offered first to a request for the new forms only):
	 * FlashAttention-3's two query warpgroups where their tiles and
	 * registers fit and the query blocks of 128 rows fill at least half
	 * the SMs (as the GEMM's 128 x 256 tiles); else the overlap alone */
	if (sp->n > 3 && s->v[2] == 2 && s->v[0] == 4 && tc_pingpong_fits(8, s->v[3]) &&
	    tc_fits(p, t, 8, s->v[1]) && tc_regs_fit(p, t, 8, s->v[1], s->v[3]) &&
	    (s->v[3] == 2 ? tc_ws_fits(p, t, 8) : tc_wscopy_fits(p, t, 8)) &&
	    2 * p->batch * ((p->Nq + 127) / 128) >= (int64_t)t->sm_count)
		s->v[0] = 8;
	if (sp->n > 2 && s->v[2] == 2 && !tc_pingpong_fits(s->v[0], sp->n > 3 ? s->v[3] : 0))
		s->v[2] = 1;
	return 0;
}

/* A configuration resolved: warps (tensor cores) or rows (SIMT) a block,
 * keys a tile (tensor cores), and the launch at_traffic models. */
typedef struct at_res {
	int w, bk;
	int overlap;                     /* 0, 1 the softmax beside O += P V, 2 that and ping-pong */
	int tma;                         /* 0 cp.async, 1 TMA, 2 TMA warp specialised,
					    3 warp specialised with a copying producer */
	unsigned threads, blocks, smem;
} at_res;

_Static_assert(sizeof(at_res) <= AP_PLAN_BYTES, "the attention plan fits ap_plan");

static int at_resolve(const ap_bound *b, const ap_sched *s, ap_plan *out)
{
	const att_plan *p = b->an;
	at_res *r = (at_res *)out->x;
	int rc;

	r->w = s->v[0];
	r->bk = p->tc ? s->v[1] : 0;
	r->overlap = s->n > 2 ? s->v[2] : 0;
	r->tma = s->n > 3 ? s->v[3] : 0;
	r->threads = 32u * (unsigned)r->w;
	if (p->tc) {
		r->blocks = ap_grid_for(p->batch * ((p->Nq + 16 * r->w - 1) / (16 * r->w)), 1);
		r->smem = (unsigned)tc_smem(p, b->t, r->w, r->bk);
	} else {
		r->blocks = ap_grid_for(p->batch * ((p->Nq + r->w - 1) / r->w), 1);
		r->smem = (unsigned)((KEYS * (p->D + 1 + p->Dv) + r->w * (p->D + KEYS)) * ap_dtype_size(p->acc));
	}
	rc = !p->tc || tc_fits(p, b->t, r->w, r->bk);
	/* sm_90a: whole warpgroups (wgmma) wherever a warpgroup's tiles fit,
	 * and always past mma.sync's head dims */
	if (rc && tc_wg(p, b->t) && r->w % 4 && (tc_fits(p, b->t, 4, 16) || p->D > TC_HEAD_MAX || p->Dv > TC_HEAD_MAX))
		rc = 0;
	/* the overlap is a form of the wgmma kernel */
	if (rc && r->overlap && (!tc_overlap_fits(p, b->t) || r->w % 4))
		rc = 0;
	if (rc && r->overlap == 2 && !tc_pingpong_fits(r->w, r->tma))
		rc = 0;
	/* so is TMA filling (and its mbarriers) */
	if (rc && (r->tma == 1 || r->tma == 2) && (!tc_tma_fits(p, b->t) || r->w % 4))
		rc = 0;
	/* warp specialised: Q a map too, the producer's threads; copying:
	 * the producer's threads */
	if (rc && r->tma == 2 && !tc_ws_fits(p, b->t, r->w))
		rc = 0;
	if (rc && r->tma == 3 && !tc_wscopy_fits(p, b->t, r->w))
		rc = 0;
	r->smem += tc_barrier_bytes(p, r->tma, r->overlap);
	if (r->tma >= 2)
		r->threads += 128;
	/* the registers of the whole block (a producer's warpgroup too: it
	 * gets as many) within the SM's file, or ptxas, bound by the block's
	 * size, would spill (tc_regs is an estimate, on the safe side) */
	if (rc && p->tc && !tc_regs_fit(p, b->t, r->w, r->bk, r->tma))
		rc = 0;
	return rc;
}

static int at_emit(const ap_bound *b, const ap_plan *pl, ap_kir_kernel *k, ap_error *err)
{
	const att_plan *p = b->an;
	const at_res *r = (const at_res *)pl->x;
	actx c;
	ap_vctx v;
	int rc;

	if ((rc = ap_vctx_init(&v, b->m, k, err)))
		return rc;
	memset(&c, 0, sizeof(c));
	c.p = p;
	c.v = &v;
	c.k = k;
	c.overlap = r->overlap != 0;
	c.pingpong = r->overlap == 2;
	c.tma = r->tma == 1 || r->tma == 2;
	c.ws = r->tma >= 2;
	v.leaf = ap__att_leaf;
	v.leaf_user = &c;
	rc = p->tc ? ap__att_emit_tc(&c, b->t, r->w, r->bk, err) : ap__att_emit_simt(&c, b->t, r->w, err);
	if (!rc)
		rc = v.rc;
	v.leaf = NULL;
	ap_vctx_clear(&v);
	return rc;
}

/* What the tensor-core form's key tile changes (FlashAttention-2 section
 * 3.1's work split, FlashAttention-3 section 3's overlap argument):
 *   - shared memory: per key tile each warp (mma.sync: Q's fragments in
 *     registers) or each warpgroup (wgmma: Q's 64 rows read from shared
 *     memory by every S = Q K^T) reads the K and V tiles: a small tile
 *     re-reads Q for fewer keys;
 *   - L2: every query block reads K and V whole, and its Q (tile_bytes);
 *   - registers (tc_regs: ptxas's counts for sm_90a's kernels at head
 *     dims 64 and 128, keys 32 to 128, are within a few registers of it
 *     with the overlap, below it without);
 *   - the softmax's SIMT work beside the products: per score about six
 *     FP32-pipe operations (scale, max, the exponent's argument, sum, the
 *     16-bit conversion) and one exponential on the special-function unit
 *     (an eighth of the FP32 rate: 16 against 128 lanes a clock an SM), per
 *     row and key tile the rescale of the output (Dv multiplies) and the
 *     row reductions' shuffles (16).  It runs beside the tensor cores where
 *     a second warpgroup's worth of warps resident on the SM hides it (one
 *     warpgroup's softmax beside the other's products: FlashAttention-3
 *     section 3.1); with one warpgroup the overlap (knob overlap) hides it
 *     behind O += P V only -- S = Q K^T of the next tile waits for the
 *     softmax -- else it runs in series: alu_fraction is the products'
 *     share of that time. */
/* The share of the (query tile, key tile) pairs a form visits with BQ
 * query rows and BK keys a tile: 1, or under a causal mask those up to
 * each query tile's diagonal (attention_tc.c tile_bound; the SIMT form's
 * R rows and KEYS keys, ap__att_emit_simt). */
static double visited(const att_plan *p, int64_t BQ, int64_t BK)
{
	int64_t ntiles = (p->Nk + BK - 1) / BK, sum = 0, nq = 0;

	if (p->causal_k < 0)
		return 1;
	for (int64_t q0 = 0; q0 < p->Nq; q0 += BQ, nq++) {
		int64_t i1 = q0 + BQ - 1 < p->Nq - 1 ? q0 + BQ - 1 : p->Nq - 1, need = (i1 + p->causal_k) / BK + 1;

		sum += need < ntiles ? need : ntiles;
	}
	return (double)sum / ((double)nq * (double)ntiles);
}

static void tc_traffic(const att_plan *p, const ap_target_info *t, const at_res *r, ap_traffic *out)
{
	double es = (double)ap_dtype_size(p->t), dp = (double)tc_dpad(p), dv = (double)tc_dvpad(p);
	double f = visited(p, 16 * r->w, r->bk);   /* the key tiles visited, causal: fewer */
	double bk = r->bk, tiles = f * (double)((p->Nk + r->bk - 1) / r->bk);
	double rows = (double)p->batch * (double)p->Nq, qblocks = (double)p->batch *
		(double)((p->Nq + 16 * r->w - 1) / (16 * r->w));
	bool wg = tc_wg(p, t) && r->w % 4 == 0;
	double readers = wg ? rows / 64 : rows / 16;   /* warpgroups or warps, each over every key tile */
	double peak = out->tf32 && t->tf32_gflops > 0 ? t->tf32_gflops : t->tc_gflops > 0 ? t->tc_gflops : t->gflops;
	double simt = f * rows * (double)p->Nk * 6 + rows * tiles * (dv + 16), sfu = f * rows * (double)p->Nk;
	double tc_us, simt_us;
	unsigned per_sm;

	out->shared_read = readers * tiles * (bk * (dp + dv) + (wg ? 64 * dp : 0)) * es;
	out->tile_bytes = (f * qblocks * (double)p->Nk * (double)(p->D + p->Dv) + rows * (double)p->D) * es;
	/* a thread's registers at the launch: the producer warpgroup and the
	 * query warpgroups split the block's share (tc_ws_maxnreg) */
	out->regs = tc_launch_regs(p, t, r->w, r->bk, r->tma);
	/* the next tile's K and V in flight while this one is computed on
	 * (two stages: cp.async or TMA) */
	if (tc_stages(p) == 2 || r->tma)
		out->inflight_bytes = bk * (dp + dv) * es;
	if (t->gflops <= 0 || !t->gpu)
		return;
	tc_us = out->flops / (peak * 1e3);
	simt_us = simt / (t->gflops * 1e3 / 2) + sfu / (t->gflops * 1e3 / 16);
	per_sm = tc_blocks_per_sm(t, r->threads, out->shared_bytes, out->regs);
	if (per_sm * out->threads >= 256) {
		out->alu_fraction = tc_us / (tc_us > simt_us ? tc_us : simt_us);
	} else if (r->overlap) {
		double pv_us = tc_us * dv / (dp + dv);

		out->alu_fraction = tc_us / (tc_us - pv_us + (pv_us > simt_us ? pv_us : simt_us));
	} else {
		out->alu_fraction = tc_us / (tc_us + simt_us);
	}
}

static int at_traffic(const ap_bound *b, const ap_plan *pl, ap_traffic *out)
{
	const att_plan *p = b->an;
	const at_res *r = (const at_res *)pl->x;

	memset(out, 0, sizeof(*out));
	if (ap__lower_inline_traffic(b->m, out) < 0)
		return AP_ENOMEM;
	out->flops = 2.0 * (double)p->batch * (double)p->Nq * (double)p->Nk * (double)(p->D + p->Dv);
	/* the products of the key tiles visited (a causal mask: to the diagonal) */
	out->flops *= p->tc ? visited(p, 16 * r->w, r->bk) : visited(p, r->w, KEYS);
	/* tma=2, 3: the producer warpgroup loads only (as the GEMM's) */
	out->threads = r->threads - (r->tma >= 2 ? 128u : 0u);
	out->blocks = r->blocks;
	out->shared_bytes = r->smem;
	out->tensor_cores = p->tc;
	out->tf32 = p->tc && p->t == AP_DT_F32;   /* float32 operands: TF32, half float16's rate */
	if (p->tc)
		tc_traffic(p, b->t, r, out);
	/* no time until a GPU has run them (cost.h) */
	out->unvalidated = (r->overlap || r->tma) && !b->t->unvalidated;
	return 0;
}

const ap_emitter ap_emitter_attention = {
	"attention", at_bind, at_unbind, at_space, at_choose, at_emit, at_traffic, at_resolve, false, NULL,
};
