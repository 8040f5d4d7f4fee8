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
 */
#include "emitters.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEYS 32                     /* SIMT: keys per tile, one per lane */
#define TC_HEAD_MAX 128             /* tensor cores: the largest head dim (registers) */
#define TC_PAD 8                    /* tensor cores: elements padding a shared row (16 bytes:
				       ldmatrix's eight rows fall in distinct banks) */

typedef struct att_plan {
	int mm1, mm2;                   /* the two products */
	int y1, s, m, e, l, p, o;       /* tensors: QK^T, scores, max, exp, sum, probabilities, PV */
	int q, kt, v;                   /* operands: Q [.., Nq, D], K^T [.., D, Nk], V [.., Nk, Dv] */
	int nb;                         /* batch dims of S (and O) */
	int64_t bdims[AP_MAX_RANK], batch, Nq, Nk, D, Dv;
	ap_dtype t, acc;
	ap_emap *maps;                  /* from O: its epilogue */
	bool *dep;                      /* per tensor: computed from Y1 */
	bool s_out, m_out, l_out;       /* written for other kernels */
	bool safe;                      /* safe softmax: the max is Max(m, lowest finite), the
					   divisor Max(l, 1) -- a row of -inf scores gives 0
					   (match_softmax) */
	int n_stat;                     /* outputs computed from m and l alone (a LogSumExp) */
	int stat[4];
	bool tc;                        /* the tensor-core form (16-bit operands, sm_80 and later) */
	ap_kir_mma_kind mma;            /* its mma.sync shape and types */
	/* tensor cores: per operand (Q, K^T, V), elements per cp.async when it
	 * is a strided view of a buffer, contiguous along the head dim (0: read
	 * through the value builder), its view and buffer */
	int aw[3];
	ap_sview sv[3];
	int leaf[3];
} att_plan;

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
		int a = g->nodes[mms[i]].inputs[0];

		if (producer(g, a, AP_OP_DIV) >= 0) {
			p->mm2 = mms[i];
			p->mm1 = mms[1 - i];
		}
	}
	if (p->mm1 == p->mm2) {
		snprintf(why, cap, "no product of probabilities");
		return 0;
	}
	p->p = g->nodes[p->mm2].inputs[0];
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
	p->t = st->dtype;
	if (!ap_dtype_is_float(p->t) || qt->dtype != p->t || kt->dtype != p->t || vt->dtype != p->t ||
	    ot->dtype != p->t) {
		snprintf(why, cap, "operands of type %s", ap_dtype_name(qt->dtype));
		return 0;
	}
	p->acc = ap_acc_type(p->t);
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
	if (p->tc && (p->D > TC_HEAD_MAX || p->Dv > TC_HEAD_MAX)) {
		snprintf(why, cap, "head dims %lld and %lld: the tensor-core form holds at most %d in registers",
			 (long long)p->D, (long long)p->Dv, TC_HEAD_MAX);
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
static int at_bind(const ap_mgraph *m, const ap_target_info *t, void **an)
{
	att_plan *p;
	char why[200];
	int rc;

	if (m->kind != AP_GROUP_ATTENTION)
		return 0;
	if (!(p = malloc(sizeof(*p))))
		return AP_ENOMEM;
	if ((rc = analyze(m, t, p, why, sizeof(why))) <= 0) {
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

/* Tensor-core tiles: head dims padded to the mma shapes (the k step of
 * QK^T: 16 for 16-bit operands, 8 for TF32; n8 for PV) and the shared
 * bytes of W warps (16 query rows each) and BK keys a tile. */
static bool tc_tf32(const att_plan *p)
{
	return p->mma == AP_KIR_MMA_TF32_1688;
}

static int64_t tc_dpad(const att_plan *p)
{
	int ks = tc_tf32(p) ? 8 : 16;

	return (p->D + ks - 1) / ks * ks;
}

static int64_t tc_dvpad(const att_plan *p)
{
	return (p->Dv + 7) / 8 * 8;
}

/* Row lengths (elements) of the shared Q / K tiles and of the V tile.
 * ldmatrix reads eight 16-byte rows at a time: 16 bytes of padding a row
 * put them in distinct banks (a row stride of 4 mod 32 words).  TF32
 * reads V's B fragments one element a lane (V[k][n] at rows t, t + 4 and
 * column g): a stride of 8 mod 32 words keeps the 32 lanes in distinct
 * banks. */
static int64_t tc_ldq(const att_plan *p)
{
	return tc_dpad(p) + (tc_tf32(p) ? 4 : TC_PAD);
}

static int64_t tc_ldv(const att_plan *p)
{
	int64_t d = tc_dvpad(p);

	return tc_tf32(p) ? d + (8 - d % 32 + 32) % 32 : d + TC_PAD;
}

/* Stages of the K and V tiles: two (the next tile's copies in flight
 * while the block computes on this one) when both are copied by
 * cp.async, else one. */
static int tc_stages(const att_plan *p)
{
	return p->aw[1] && p->aw[2] ? 2 : 1;
}

/* The tensor-core form on wgmma (sm_90a): 16-bit operands, V's head dim
 * at most 256 (one wgmma's N); a block of whole warpgroups (W a multiple
 * of 4) takes it. */
static bool tc_wg(const att_plan *p, const ap_target_info *t)
{
	return p->tc && t->wgmma && !tc_tf32(p) && tc_dvpad(p) <= 256;
}

static size_t tc_smem(const att_plan *p, int W, int BK)
{
	return (size_t)(16 * W * tc_ldq(p) + tc_stages(p) * BK * (tc_ldq(p) + tc_ldv(p))) * ap_dtype_size(p->t);
}

static bool tc_fits(const att_plan *p, const ap_target_info *t, int W, int BK)
{
	return W >= 1 && (unsigned)W * 32u <= ap_block_cap(t) && BK % 16 == 0 && BK >= 16 &&
	       tc_smem(p, W, BK) <= t->shared_per_block;
}

/* SIMT: "rows" (query rows a block, a warp each).  Tensor cores: "warps"
 * (16 query rows each) and "keys" (a tile of K and V). */
static int at_space(const ap_bound *b, ap_space *sp)
{
	const att_plan *p = b->an;

	sp->n = 1;
	ap_knob_pow2(&sp->knobs[0], p->tc ? "warps" : "rows", 1, 8);
	while (sp->knobs[0].n > 1 && (unsigned)sp->knobs[0].values[sp->knobs[0].n - 1] * 32u > ap_block_cap(b->t))
		sp->knobs[0].n--;
	if (p->tc) {
		sp->n = 2;
		ap_knob_pow2(&sp->knobs[1], "keys", 16, 64);
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
	while (W > 1 && !tc_fits(p, t, W, BK))
		W /= 2;
	while (BK > 16 && !tc_fits(p, t, W, BK))
		BK /= 2;
	s->v[0] = W;
	s->v[1] = BK;
	return 0;
}

/* A configuration resolved: warps (tensor cores) or rows (SIMT) a block,
 * keys a tile (tensor cores), and the launch at_traffic models. */
typedef struct at_res {
	int w, bk;
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
	r->threads = 32u * (unsigned)r->w;
	if (p->tc) {
		r->blocks = ap_grid_for(p->batch * ((p->Nq + 16 * r->w - 1) / (16 * r->w)), 1);
		r->smem = (unsigned)tc_smem(p, r->w, r->bk);
	} else {
		r->blocks = ap_grid_for(p->batch * ((p->Nq + r->w - 1) / r->w), 1);
		r->smem = (unsigned)((KEYS * (p->D + 1 + p->Dv) + r->w * (p->D + KEYS)) * ap_dtype_size(p->acc));
	}
	rc = !p->tc || tc_fits(p, b->t, r->w, r->bk);
	/* sm_90a: whole warpgroups (wgmma) wherever a warpgroup's tiles fit */
	if (rc && tc_wg(p, b->t) && r->w % 4 && tc_fits(p, b->t, 4, 16))
		rc = 0;
	return rc;
}

/* ---- the kernel ---------------------------------------------------------------------- */

typedef struct actx {
	const att_plan *p;
	ap_vctx *v;
	ap_kir_kernel *k;
	ap_kir_expr *bc[AP_MAX_RANK];   /* the block's batch coordinates */
	ap_kir_expr *dot;               /* leaf hook: Y1's value (a lane's dot product) */
	ap_kir_expr *mval, *lval;       /* leaf hook: the row's max and sum (accumulator type) */
	ap_kir_expr *out;               /* leaf hook: O's value */
	bool wg;                        /* the tensor-core form on wgmma (sm_90a): Q, K and V
					   tiles in core-matrix layouts (wg_place) */
} actx;

/* (emitters.h) Q and K are read K-major, V MN-major. */
ap_kir_expr *ap__wg_place(ap_kir_kernel *k, ap_kir_expr *r, ap_kir_expr *j, int64_t cols)
{
	ap_kir_expr *hr = ap_kir_binary(k, AP_KIR_SHR, r, ap_kir_idx(k, 3)), *lr = ap_kir_binary(k, AP_KIR_AND, r, ap_kir_idx(k, 7));
	ap_kir_expr *hj = ap_kir_binary(k, AP_KIR_SHR, j, ap_kir_idx(k, 3)), *lj = ap_kir_binary(k, AP_KIR_AND, j, ap_kir_idx(k, 7));

	return ap_kir_add(k, ap_kir_add(k, ap_kir_muli(k, hr, 8 * cols), ap_kir_muli(k, hj, 64)),
			  ap_kir_add(k, ap_kir_muli(k, lr, 8), lj));
}

/* What the output accumulator of a row is divided by: its sum l, or in
 * the safe form Max(l, 1) -- l itself wherever a score is finite (the
 * largest adds exp(0) = 1), 1 for a row of -inf scores, whose
 * accumulator stayed 0. */
static ap_kir_expr *divisor(actx *c, ap_kir_expr *l)
{
	return c->p->safe ? ap_v_max(c->v, l, ap_kir_float(c->k, l->type, 1.0)) : l;
}

static ap_kir_expr *att_leaf(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	actx *c = user;

	if (t == c->p->y1 && c->dot)
		return ap_kir_cast(v->k, v->g->tensors[t].dtype, c->dot);
	if (t == c->p->o && c->out)
		return ap_kir_cast(v->k, v->g->tensors[t].dtype, c->out);
	/* the statistics enter a LogSumExp unrounded (FlashAttention keeps
	 * them in float32 for 16-bit operands) */
	if (t == c->p->m && c->mval)
		return c->mval;
	if (t == c->p->l && c->lval)
		return c->lval;
	return NULL;
}

/* Index into tensor x (of rank >= 2) at the block's batch, broadcast the
 * numpy way, and (r, c) for its last two dims. */
static ap_lidx idx2(actx *c, int x, ap_kir_expr *r, ap_kir_expr *col)
{
	const ap_tensor *t = &c->v->g->tensors[x];
	ap_lidx ix = ap_lidx_shape(t);
	int rank = t->rank, nb = c->p->nb;

	for (int j = 0; j < rank - 2; j++) {
		int d = j + nb - (rank - 2);

		ix.c[j] = d < 0 || t->dims[j] == 1 ? ap_kir_idx(c->k, 0) : c->bc[d];
	}
	ix.c[rank - 2] = r;
	ix.c[rank - 1] = col;
	return ix;
}

/* Butterfly over groups of `lanes` consecutive lanes (a power of two):
 * every lane ends with the max (or sum) of v over its group. */
static ap_kir_expr *xor_reduce(actx *c, ap_kir_expr *v, bool max, int lanes)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *vc = c->v;
	ap_kir_var *acc;

	if (!v)
		return NULL;   /* an allocation failed: the kernel is marked failed */
	acc = ap_kir_var_new(k, v->type, max ? "wm" : "ws");

	ap_kir_let(k, vc->cur, acc, v);
	for (int off = lanes / 2; off >= 1; off /= 2) {
		ap_kir_var *o = ap_kir_var_new(k, v->type, "sh");

		ap_kir_let(k, vc->cur, o, NULL);
		ap_kir_shfl(k, vc->cur, o, AP_KIR_SHFL_XOR, ap_kir_ref(k, acc), ap_kir_idx(k, off), 32);
		ap_kir_assign(k, vc->cur, acc, max ? ap_kir_binary(k, AP_KIR_MAX, ap_kir_ref(k, acc), ap_kir_ref(k, o))
						   : ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc), ap_kir_ref(k, o)));
	}
	return ap_kir_ref(k, acc);
}

/* Stages rows [r0, r0 + n) of a tile of operand `role` (0 Q, 1 K^T, 2 V)
 * into the shared array `arr` (row r at arr[base + r * ld], `cols` elements of
 * arr's type), the block's threads striding over it: element (r, j) is
 * the operand at (r0 + r, j) -- K^T at (j, r0 + r) -- and zero past row
 * `rows_ok` or column `cols_ok`.  Copied by cp.async (p->aw[role]
 * elements at a time, from its buffer; the caller commits and waits) when
 * the plan says so, else read through the value builder (views and
 * prologues in place). */
static void stage_rows(actx *c, ap_kir_array *arr, ap_kir_expr *base, int role, int64_t n, int64_t cols,
		       int64_t ld, ap_kir_expr *r0, int64_t rows_ok, int64_t cols_ok)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const att_plan *p = c->p;
	int x = role == 0 ? p->q : role == 1 ? p->kt : p->v, w = p->aw[role] ? p->aw[role] : 1;
	bool trans = role == 1;
	unsigned nt = ap_kir_block_threads(k);
	ap_kir_block *saved, *s2;
	ap_kir_var *e = ap_v_loop(v, "e", ap_kir_index_of(k, AP_KIR_THREAD_X), ap_kir_idx(k, n * cols / w), nt, &saved);
	ap_kir_expr *r = ap_kir_binary(k, AP_KIR_DIV, ap_kir_ref(k, e), ap_kir_idx(k, cols / w));
	ap_kir_expr *j = ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, ap_kir_ref(k, e), ap_kir_idx(k, cols / w)), w);
	ap_kir_expr *gr = ap_kir_bind(k, v->cur, k->index_type, "gr", ap_kir_add(k, r0, r));
	ap_kir_expr *ok = ap_kir_binary(k, AP_KIR_LT, gr, ap_kir_idx(k, rows_ok));
	ap_kir_expr *at = ap_kir_add(k, base, c->wg ? ap__wg_place(k, r, j, cols) : ap_kir_add(k, ap_kir_muli(k, r, ld), j));
	ap_kir_var *val;
	ap_lidx ix;

	if (cols_ok < cols)
		ok = ap_kir_binary(k, AP_KIR_LAND, ok, ap_kir_binary(k, AP_KIR_LT, j, ap_kir_idx(k, cols_ok)));
	ix = trans ? idx2(c, x, j, gr) : idx2(c, x, gr, j);
	if (p->aw[role]) {
		ap_kir_cp_async(k, v->cur, arr, at, ap_v_buffer(v, p->leaf[role]),
				ap_sview_offset(k, &p->sv[role], &ix), w, ok);
		ap_v_close(v, saved);
		return;
	}
	val = ap_kir_var_new(k, arr->type, "x");
	ap_kir_let(k, v->cur, val, ap_kir_float(k, arr->type, 0));
	ap_v_if(v, ok, &s2, NULL);
	ap_kir_assign(k, v->cur, val, ap_kir_cast(k, arr->type, ap_val(v, x, &ix)));
	ap_v_close(v, s2);
	ap_kir_store(k, v->cur, arr, at, ap_kir_ref(k, val));
	ap_v_close(v, saved);
}

/* The copies this thread issued are complete (when there are any): the
 * barrier that follows makes them the block's. */
static void async_done(actx *c, bool any)
{
	if (any) {
		ap_kir_cp_commit(c->k, c->v->cur);
		ap_kir_cp_wait(c->k, c->v->cur, 0);
	}
}

/* sv = S at (row, key) (float32 or float64): the first product's
 * epilogue on `dot`, Y1's value there; S is also stored when another
 * kernel reads it and row < Nq (rows past it are read at the last row,
 * never stored). */
static void score(actx *c, ap_kir_var *sv, ap_kir_expr *dot, ap_kir_expr *row, ap_kir_expr *key)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const att_plan *p = c->p;
	ap_kir_expr *rowc;
	ap_lidx ix;

	if (!sv || !dot || !row || !key)
		return;   /* an allocation failed: the kernel is marked failed */
	rowc = ap_kir_binary(k, AP_KIR_MIN, row, ap_kir_idx(k, p->Nq - 1));
	c->dot = ap_kir_bind(k, v->cur, dot->type, "dot", dot);
	ix = idx2(c, p->s, rowc, key);
	ap_kir_assign(k, v->cur, sv, ap_kir_cast(k, sv->type, ap_val(v, p->s, &ix)));
	if (p->s_out) {
		ap_kir_block *s3;
		ap_lidx ox = idx2(c, p->s, row, key);

		ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, row, ap_kir_idx(k, p->Nq)), &s3, NULL);
		ap_kir_store(k, v->cur, ap_v_buffer(v, p->s), ap_lidx_linear(v, &ox),
			     ap_kir_cast(k, p->t, ap_kir_ref(k, sv)));
		ap_v_close(v, s3);
	}
	c->dot = NULL;
}

/* The row statistics other kernels read (the max m and the sum l of
 * row), stored when row < Nq and `cond`. */
static void store_stats(actx *c, ap_kir_expr *row, ap_kir_expr *cond, ap_kir_var *m, ap_kir_var *l)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const att_plan *p = c->p;
	ap_kir_block *s2;

	if (!p->m_out && !p->l_out && !p->n_stat)
		return;
	ap_v_if(v, ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_LT, row, ap_kir_idx(k, p->Nq)), cond), &s2, NULL);
	for (int i = 0; i < p->n_stat; i++) {
		ap_lidx mix = idx2(c, p->m, row, ap_kir_idx(k, 0)), ix = ap_lidx_relin(v, &mix, p->stat[i]);

		c->mval = ap_kir_ref(k, m);
		c->lval = ap_kir_ref(k, l);
		ap_kir_store(k, v->cur, ap_v_buffer(v, p->stat[i]), ap_lidx_linear(v, &ix),
			     ap_kir_cast(k, v->g->tensors[p->stat[i]].dtype, ap_val(v, p->stat[i], &ix)));
		c->mval = c->lval = NULL;
	}
	for (int w = 0; w < 2; w++) {
		int x = w ? p->l : p->m;
		ap_lidx ix;

		if (!(w ? p->l_out : p->m_out))
			continue;
		ix = idx2(c, x, row, ap_kir_idx(k, 0));
		ap_kir_store(k, v->cur, ap_v_buffer(v, x), ap_lidx_linear(v, &ix),
			     ap_kir_cast(k, v->g->tensors[x].dtype, ap_kir_ref(k, w ? l : m)));
	}
	ap_v_close(v, s2);
}

/* Opens the grid-stride loop over the block tiles, `per` query rows of
 * one batch each (the grid is set here), with a barrier first (the
 * previous tile's shared memory is free after it); sets c->bc to the
 * tile's batch coordinates and returns its first query row.  *saved
 * closes the loop (ap_v_close). */
static ap_kir_expr *open_tiles(actx *c, int64_t per, ap_kir_block **saved)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const att_plan *p = c->p;
	int64_t qblocks = (p->Nq + per - 1) / per, stride = 1;
	unsigned grid = ap_grid_for(p->batch * qblocks, 1);
	ap_kir_var *tile;
	ap_kir_expr *bi, *q0;

	k->grid[0] = grid;
	tile = ap_v_loop(v, "tile", ap_kir_index_of(k, AP_KIR_BLOCK_X), ap_kir_idx(k, p->batch * qblocks), grid, saved);
	ap_kir_barrier(k, v->cur);
	bi = ap_kir_bind(k, v->cur, k->index_type, "bi",
			 ap_kir_binary(k, AP_KIR_DIV, ap_kir_ref(k, tile), ap_kir_idx(k, qblocks)));
	q0 = ap_kir_bind(k, v->cur, k->index_type, "q0",
			 ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, ap_kir_ref(k, tile), ap_kir_idx(k, qblocks)), per));
	for (int d = p->nb - 1; d >= 0; d--) {
		c->bc[d] = p->bdims[d] == 1 ? ap_kir_idx(k, 0)
			   : ap_kir_bind(k, v->cur, k->index_type, "b",
					 ap_kir_binary(k, AP_KIR_REM, ap_kir_binary(k, AP_KIR_DIV, bi, ap_kir_idx(k, stride)),
						       ap_kir_idx(k, p->bdims[d])));
		stride *= p->bdims[d];
	}
	return q0;
}

/* The SIMT form's state (emit_simt): R warps a block, one query row a
 * warp, KEYS keys a tile, one key a lane. */
typedef struct att_simt {
	actx *c;
	ap_dtype A;                     /* the accumulator type */
	int nc;                         /* output columns a lane: lane, lane + 32, ... */
	ap_kir_array *ks, *vs;          /* the key tile of K ([key][D + 1]) and of V ([key][Dv]) */
	ap_kir_array *qs, *ps;          /* per warp: its row's query [D], its probabilities [KEYS] */
	ap_kir_array *acc;              /* the lane's output columns (registers) */
	ap_kir_expr *warp, *lane, *ninf;
	ap_kir_expr *row, *rowc, *valid;  /* the warp's row, clamped to Nq - 1, row < Nq */
	ap_kir_var *mrun, *lrun;        /* the row's running maximum and sum */
} att_simt;

/* The warp's row of Q into qs[warp][..] (the lanes striding over D), as
 * the accumulator type. */
static void simt_load_query(att_simt *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_var *d = ap_v_loop(v, "d", s->lane, ap_kir_idx(k, c->p->D), 32, &saved);
	ap_lidx ix = idx2(c, c->p->q, s->rowc, ap_kir_ref(k, d));

	ap_kir_store(k, v->cur, s->qs, ap_kir_add(k, ap_kir_muli(k, s->warp, c->p->D), ap_kir_ref(k, d)),
		     ap_kir_cast(k, s->A, ap_val(v, c->p->q, &ix)));
	ap_v_close(v, saved);
}

/* The score of this lane's key of the tile at key0 (the tiles of K and V
 * staged first): the dot product of the row's query with the key, then
 * the first product's epilogue (score); -inf past the last key.
 * Returns it. */
static ap_kir_expr *simt_score(att_simt *s, ap_kir_expr *key0)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_expr *key;
	ap_kir_var *dot, *sv;
	ap_kir_block *saved;

	ap_kir_barrier(k, v->cur);
	/* the key tile of K (from K^T) and of V */
	stage_rows(c, s->ks, ap_kir_idx(k, 0), 1, KEYS, p->D, p->D + 1, key0, p->Nk, p->D);
	stage_rows(c, s->vs, ap_kir_idx(k, 0), 2, KEYS, p->Dv, p->Dv, key0, p->Nk, p->Dv);
	ap_kir_barrier(k, v->cur);
	/* this lane's key: its score */
	key = ap_kir_bind(k, v->cur, k->index_type, "key", ap_kir_add(k, key0, s->lane));
	dot = ap_kir_var_new(k, s->A, "dot");
	ap_kir_let(k, v->cur, dot, ap_kir_float(k, s->A, 0));
	{
		ap_kir_var *d = ap_v_loop(v, "d", ap_kir_idx(k, 0), ap_kir_idx(k, p->D), 1, &saved);

		ap_kir_assign(k, v->cur, dot,
			      ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, dot),
					    ap_kir_binary(k, AP_KIR_MUL,
							  ap_kir_load(k, s->qs, ap_kir_add(k, ap_kir_muli(k, s->warp, p->D), ap_kir_ref(k, d))),
							  ap_kir_load(k, s->ks, ap_kir_add(k, ap_kir_muli(k, s->lane, p->D + 1), ap_kir_ref(k, d))))));
		ap_v_close(v, saved);
	}
	/* S at (row, key): the first product's epilogue on the dot product */
	sv = ap_kir_var_new(k, s->A, "s");
	ap_kir_let(k, v->cur, sv, s->ninf);
	ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, key, ap_kir_idx(k, p->Nk)), &saved, NULL);
	score(c, sv, ap_kir_ref(k, dot), s->row, key);
	ap_v_close(v, saved);
	return ap_kir_ref(k, sv);
}

/* The online softmax step for the tile (the file comment): the tile's
 * maximum over the warp, the new maximum m', the lane's probability
 * exp(s - m') into ps[warp][lane], l and m updated.  Returns the rescale
 * factor exp(m - m') of the output (1 while every score is -inf). */
static ap_kir_expr *simt_softmax(att_simt *s, ap_kir_expr *sval)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_dtype A = s->A;
	ap_kir_expr *mt, *mnew, *dead, *alpha, *pv, *psum;

	mt = xor_reduce(c, sval, true, 32);
	mnew = ap_kir_bind(k, v->cur, A, "mn", ap_kir_binary(k, AP_KIR_MAX, ap_kir_ref(k, s->mrun), mt));
	/* with every score so far -inf, nothing to rescale and nothing to add */
	dead = ap_kir_bind(k, v->cur, AP_DT_BOOL, "dd", ap_kir_binary(k, AP_KIR_EQ, mnew, s->ninf));
	alpha = ap_kir_bind(k, v->cur, A, "al",
			    ap_kir_select(k, dead, ap_kir_float(k, A, 1),
					  ap_kir_call(k, AP_KIR_EXP, ap_kir_binary(k, AP_KIR_SUB, ap_kir_ref(k, s->mrun), mnew), NULL)));
	pv = ap_kir_bind(k, v->cur, A, "p",
			 ap_kir_select(k, dead, ap_kir_float(k, A, 0),
				       ap_kir_call(k, AP_KIR_EXP, ap_kir_binary(k, AP_KIR_SUB, sval, mnew), NULL)));
	psum = xor_reduce(c, pv, false, 32);
	ap_kir_assign(k, v->cur, s->lrun, ap_kir_binary(k, AP_KIR_ADD, ap_kir_binary(k, AP_KIR_MUL, ap_kir_ref(k, s->lrun), alpha), psum));
	ap_kir_assign(k, v->cur, s->mrun, mnew);
	ap_kir_store(k, v->cur, s->ps, ap_kir_add(k, ap_kir_muli(k, s->warp, KEYS), s->lane), pv);
	ap_kir_barrier(k, v->cur);
	return alpha;
}

/* acc = acc * alpha + P V for this lane's output columns lane,
 * lane + 32, ... (those below Dv): the warp's probabilities from ps, V's
 * tile from vs. */
static void simt_accumulate(att_simt *s, ap_kir_expr *alpha)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_kir_var *e = ap_kir_var_new(k, k->index_type, "i");
	ap_kir_stmt *li = ap_kir_for_unroll(k, c->v->cur, e, ap_kir_idx(k, 0), ap_kir_idx(k, s->nc), 1, -1);
	ap_kir_expr *col = ap_kir_add(k, s->lane, ap_kir_muli(k, ap_kir_ref(k, e), 32));
	ap_kir_var *a2 = ap_kir_var_new(k, s->A, "a"), *j = ap_kir_var_new(k, k->index_type, "j");
	ap_kir_stmt *lj, *guard;

	if (!li)
		return;
	ap_kir_let(k, &li->body, a2, ap_kir_binary(k, AP_KIR_MUL, ap_kir_load(k, s->acc, ap_kir_ref(k, e)), alpha));
	guard = ap_kir_if(k, &li->body, ap_kir_binary(k, AP_KIR_LT, col, ap_kir_idx(k, c->p->Dv)));
	lj = guard ? ap_kir_for(k, &guard->body, j, ap_kir_idx(k, 0), ap_kir_idx(k, KEYS), 1) : NULL;
	if (lj)
		ap_kir_assign(k, &lj->body, a2,
			      ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, a2),
					    ap_kir_binary(k, AP_KIR_MUL,
							  ap_kir_load(k, s->ps, ap_kir_add(k, ap_kir_muli(k, s->warp, KEYS), ap_kir_ref(k, j))),
							  ap_kir_load(k, s->vs, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, j), c->p->Dv), col)))));
	ap_kir_store(k, &li->body, s->acc, ap_kir_ref(k, e), ap_kir_ref(k, a2));
}

/* After the last key tile: O = acc / l at the lane's columns through O's
 * epilogue (rows below Nq), and the row's statistics others read (lane
 * 0). */
static void simt_store(att_simt *s)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved, *s2;
	ap_kir_var *i = ap_v_loop(v, "i", ap_kir_idx(k, 0), ap_kir_idx(k, s->nc), 1, &saved);
	ap_kir_expr *col = ap_kir_bind(k, v->cur, k->index_type, "col",
				       ap_kir_add(k, s->lane, ap_kir_muli(k, ap_kir_ref(k, i), 32)));

	ap_v_if(v, ap_kir_binary(k, AP_KIR_LAND, s->valid, ap_kir_binary(k, AP_KIR_LT, col, ap_kir_idx(k, p->Dv))), &s2, NULL);
	c->out = ap_kir_bind(k, v->cur, s->A, "o", ap_kir_binary(k, AP_KIR_DIV, ap_kir_load(k, s->acc, ap_kir_ref(k, i)),
								  divisor(c, ap_kir_ref(k, s->lrun))));
	ap__epilogue_store(v, p->maps, idx2(c, p->o, s->rowc, col));
	c->out = NULL;
	ap_v_close(v, s2);
	ap_v_close(v, saved);
	store_stats(c, s->row, ap_kir_binary(k, AP_KIR_EQ, s->lane, ap_kir_idx(k, 0)), s->mrun, s->lrun);
}

/* The SIMT form (the file comment): R warps a block, a query row each;
 * per key tile, simt_score, simt_softmax and simt_accumulate, then
 * simt_store.  Errors: AP_EUNSUPPORTED (R warps do not fit a block),
 * AP_ENOMEM. */
static int emit_simt(actx *c, const ap_target_info *t, int R, ap_error *err)
{
	const att_plan *p = c->p;
	ap_vctx *v = c->v;
	ap_kir_kernel *k = c->k;
	unsigned nt = 32u * (unsigned)R;
	int64_t ntiles;
	att_simt s;
	ap_kir_expr *tid, *qrow0;
	ap_kir_var *kt;
	ap_kir_block *tsaved, *ksaved;

	if (R < 1 || nt > ap_block_cap(t))
		return ap_error_set(err, AP_EUNSUPPORTED, c->v->g->nodes[c->v->m->root].name, NULL,
				    "attention emitter: %d rows per block", R);
	memset(&s, 0, sizeof(s));
	s.c = c;
	s.A = p->acc;
	s.nc = (int)((p->Dv + 31) / 32);
	s.ks = ap_kir_shared(k, "ks", s.A, KEYS * (p->D + 1));
	s.vs = ap_kir_shared(k, "vs", s.A, KEYS * p->Dv);
	s.qs = ap_kir_shared(k, "qs", s.A, (int64_t)R * p->D);
	s.ps = ap_kir_shared(k, "ps", s.A, (int64_t)R * KEYS);
	s.acc = ap_kir_local(k, "acc", s.A, s.nc);
	if (ap_kir_failed(k))
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering attention");
	ntiles = (p->Nk + KEYS - 1) / KEYS;
	k->block[0] = nt;
	tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	s.warp = ap_kir_bind(k, v->cur, k->index_type, "w", ap_kir_binary(k, AP_KIR_SHR, tid, ap_kir_idx(k, 5)));
	s.lane = ap_kir_bind(k, v->cur, k->index_type, "ln", ap_kir_binary(k, AP_KIR_AND, tid, ap_kir_idx(k, 31)));
	s.ninf = ap_kir_float(k, s.A, -INFINITY);
	qrow0 = open_tiles(c, R, &tsaved);
	/* this warp's row; past the last row, the last row again (never stored),
	 * so that every warp takes part in the barriers and shuffles */
	s.row = ap_kir_bind(k, v->cur, k->index_type, "row", ap_kir_add(k, qrow0, s.warp));
	s.valid = ap_kir_bind(k, v->cur, AP_DT_BOOL, "ok", ap_kir_binary(k, AP_KIR_LT, s.row, ap_kir_idx(k, p->Nq)));
	s.rowc = ap_kir_bind(k, v->cur, k->index_type, "rc", ap_kir_binary(k, AP_KIR_MIN, s.row, ap_kir_idx(k, p->Nq - 1)));
	simt_load_query(&s);
	s.mrun = ap_kir_var_new(k, s.A, "m");
	s.lrun = ap_kir_var_new(k, s.A, "l");
	ap_kir_let(k, v->cur, s.mrun, s.ninf);
	ap_kir_let(k, v->cur, s.lrun, ap_kir_float(k, s.A, 0));
	{
		ap_kir_var *i = ap_kir_var_new(k, k->index_type, "z");
		ap_kir_stmt *lz = ap_kir_for_unroll(k, v->cur, i, ap_kir_idx(k, 0), ap_kir_idx(k, s.nc), 1, -1);

		if (lz)
			ap_kir_store(k, &lz->body, s.acc, ap_kir_ref(k, i), ap_kir_float(k, s.A, 0));
	}
	kt = ap_v_loop(v, "kt", ap_kir_idx(k, 0), ap_kir_idx(k, ntiles), 1, &ksaved);
	{
		ap_kir_expr *key0 = ap_kir_bind(k, v->cur, k->index_type, "k0", ap_kir_muli(k, ap_kir_ref(k, kt), KEYS));
		ap_kir_expr *sval = simt_score(&s, key0);

		simt_accumulate(&s, simt_softmax(&s, sval));
	}
	ap_v_close(v, ksaved);
	simt_store(&s);
	ap_v_close(v, tsaved);
	return 0;
}

/* Rounds the n float32 elements of register array f to TF32 (what the
 * tensor core reads of them: PTX cvt.rna.tf32.f32). */
static void round_tf32(actx *c, ap_kir_array *f, int n)
{
	ap_kir_block *saved;
	ap_kir_var *i = ap_v_loop_unrolled(c->v, "r", n, &saved);

	ap_kir_store(c->k, c->v->cur, f, ap_kir_ref(c->k, i),
		     ap_kir_call(c->k, AP_KIR_TF32, ap_kir_load(c->k, f, ap_kir_ref(c->k, i)), NULL));
	ap_v_close(c->v, saved);
}

/* TF32: the probabilities of the warp's 16 rows, held in the m16n8 C
 * layout in cf (per n8 tile j: P[g][2t, 2t + 1], P[g + 8][2t, 2t + 1]),
 * into the m16n8k8 A layout in af (per k8 step j: P[g][t], P[g + 8][t],
 * P[g][t + 4], P[g + 8][t + 4]), rounded to TF32.  P[g][c] sits in lane
 * 4g + c / 2, element c % 2: two source lanes, 4g + t / 2 and
 * 4g + 2 + t / 2, each shuffled (its four elements; the caller's parity
 * picks). */
static void tf32_a_from_c(actx *c, ap_kir_array *cf, ap_kir_array *af, int tiles, ap_kir_expr *tq)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_expr *lane = ap_kir_binary(k, AP_KIR_AND, ap_kir_index_of(k, AP_KIR_THREAD_X), ap_kir_idx(k, 31));
	ap_kir_expr *odd = ap_kir_bind(k, v->cur, AP_DT_BOOL, "od",
				       ap_kir_binary(k, AP_KIR_NE, ap_kir_binary(k, AP_KIR_AND, tq, ap_kir_idx(k, 1)),
						     ap_kir_idx(k, 0)));
	ap_kir_expr *src[2];
	ap_kir_block *saved;
	ap_kir_var *j;

	src[0] = ap_kir_bind(k, v->cur, k->index_type, "sl",
			     ap_kir_add(k, ap_kir_binary(k, AP_KIR_AND, lane, ap_kir_idx(k, ~3)),
					ap_kir_binary(k, AP_KIR_SHR, tq, ap_kir_idx(k, 1))));
	src[1] = ap_kir_bind(k, v->cur, k->index_type, "sl", ap_kir_addi(k, src[0], 2));
	j = ap_v_loop_unrolled(v, "pj", tiles, &saved);
	for (int h = 0; h < 2; h++)          /* source lane: columns t, t + 4 */
		for (int r = 0; r < 2; r++) {    /* rows g, g + 8 */
			ap_kir_var *x[2];

			for (int e = 0; e < 2; e++) {
				x[e] = ap_kir_var_new(k, AP_DT_F32, "px");
				ap_kir_let(k, v->cur, x[e], NULL);
				ap_kir_shfl(k, v->cur, x[e], AP_KIR_SHFL_IDX,
					    ap_kir_load(k, cf, ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, j), 4), 2 * r + e)),
					    src[h], 32);
			}
			ap_kir_store(k, v->cur, af, ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, j), 4), 2 * h + r),
				     ap_kir_call(k, AP_KIR_TF32,
						 ap_kir_select(k, odd, ap_kir_ref(k, x[1]), ap_kir_ref(k, x[0])), NULL));
		}
	ap_v_close(v, saved);
}

/* ---- the tensor-core form ---------------------------------------------------------------
 *
 * FlashAttention-2's warp layout (Dao, "FlashAttention-2", 2023, section
 * 3.3) on mma.sync m16n8k16: a block takes 16 * W query rows of one batch,
 * 16 rows a warp, and walks the keys in tiles of BK.  Q's tile is staged
 * in shared memory once and held as A fragments (ldmatrix .x4); each key
 * tile of K and V is staged in shared memory (rows padded by tc_ldq /
 * tc_ldv; zero past the head dims and past the last key).  For a tile:
 *   S = Q K^T      K's rows are B's columns: ldmatrix .x2, mma into BK / 8
 *                  accumulator fragments (float32);
 *   scores         the first product's epilogue on each element a lane
 *                  holds (rows g and g + 8 of the warp's 16, g = lane / 4),
 *                  -inf past the last key;
 *   online softmax a row's maximum over the four lanes that hold it (two
 *                  xor shuffles), exp(s - m') in float32, the lane's part
 *                  of the row sum kept per lane (the four are summed at
 *                  the end: the rescale factor is the same for all four);
 *   O += P V       the score fragments of two n8 tiles are, element for
 *                  element, the A fragment of one k16 step (the m16n8k16
 *                  C and A layouts, kir.h), so P goes to 16-bit registers
 *                  without shared memory; V's tile is B with its rows
 *                  along k: ldmatrix .x2 .trans.
 * With K and V both copied by cp.async the tiles have two stages: the
 * next tile's copies are issued before this tile's products.  At the end
 * O = acc / l through O's epilogue; the statistics other kernels read as
 * in the SIMT form.  P is rounded to the operand type before PV as the
 * unfused graph rounds its probabilities, but before the division by the
 * sum (as FlashAttention does).  TF32 (m16n8k8, float32 registers): Q and
 * K through 32-bit ldmatrix, V's B fragments one element a lane, P moved
 * from the C layout to the A layout by shuffles (tf32_a_from_c), every
 * operand rounded to TF32 first. */

/* The tensor-core form's state (emit_tc and its steps): W warps of 16
 * query rows (BQ = 16 * W), key tiles of BK in NST stages. */
typedef struct att_tc {
	actx *c;
	ap_dtype T, A;                  /* the operand type; float32 accumulators */
	int64_t Dp, Dvp, ldq, ldv;      /* padded head dims; shared row lengths (tc_ldq, tc_ldv) */
	int BK, BQ, NST;
	int NS, NO;                     /* n8 tiles of a score tile (BK / 8) and of O (Dvp / 8) */
	bool tf32;
	int KS;                         /* k step of an mma */
	int AF, BF, CF;                 /* elements of the A, B and C fragments a lane */
	int64_t ntiles;                 /* key tiles */
	ap_kir_array *qs, *ks, *vs;     /* shared: Q's tile, the K and V tiles */
	ap_kir_array *qf, *kf, *vf;     /* registers: Q's A fragments, a B fragment of K, of V */
	ap_kir_array *sacc, *pf, *oacc; /* registers: scores (C), probabilities (A), O (C) */
	ap_kir_expr *warp, *lane, *g, *tq;       /* g = lane / 4, tq = lane % 4 */
	ap_kir_expr *l8, *l16, *hi, *j2;         /* lane % 8, lane % 16, lane / 16, (lane / 8) % 2 */
	ap_kir_expr *wrow, *ninf;       /* the warp's first row; -inf */
	ap_kir_var *mrun[2], *lrun[2];  /* running max and sum of rows g (0) and g + 8 (1) */
	/* the current key tile */
	ap_kir_expr *key0, *kbase, *vbase;   /* its first key; its stage's K and V offsets */
	ap_kir_expr *mnew[2], *dead[2], *alpha[2];
	ap_kir_var *rs[2];              /* the lane's part of the tile's row sums */
} att_tc;

/* The shared tiles and the register fragments, and a comment per
 * operand saying how it is staged.  AP_ENOMEM through err when an
 * allocation failed. */
static int tc_declare(att_tc *s, ap_error *err)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;

	s->qs = ap_kir_shared(k, "qs", s->T, s->BQ * s->ldq);
	s->ks = ap_kir_shared(k, "ks", s->T, s->NST * s->BK * s->ldq);
	s->vs = ap_kir_shared(k, "vs", s->T, s->NST * s->BK * s->ldv);
	ap_kir_mma_frag_sizes(p->mma, &s->AF, &s->BF, &s->CF);
	s->qf = ap_kir_local(k, "qf", s->T, s->Dp / s->KS * s->AF);
	s->kf = ap_kir_local(k, "kf", s->T, s->BF);
	s->vf = ap_kir_local(k, "vf", s->T, s->BF);
	s->sacc = ap_kir_local(k, "sf", s->A, s->NS * 4);
	s->pf = ap_kir_local(k, "pf", s->T, s->NS * 4);     /* 16-bit: BK / 16 A fragments of 8; TF32: BK / 8 of 4 */
	s->oacc = ap_kir_local(k, "of", s->A, s->NO * 4);
	if (ap_kir_failed(k))
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering attention");
	for (int r = 0; r < 3; r++) {
		static const char *const names[] = {"Q", "K", "V"};

		if (p->aw[r])
			ap_kir_comment(k, c->v->cur, "operand %s: cp.async, %zu bytes a copy", names[r],
				       (size_t)p->aw[r] * ap_dtype_size(s->T));
		else
			ap_kir_comment(k, c->v->cur, "operand %s: through registers (computed on the way, or "
				       "not contiguous along the head dim)", names[r]);
	}
	return 0;
}

/* (emitters.h) */
void ap__mma_lanes(ap_kir_kernel *k, ap_kir_block *b, ap_mma_lanes *l)
{
	ap_kir_expr *tid = ap_kir_index_of(k, AP_KIR_THREAD_X);

	l->warp = ap_kir_bind(k, b, k->index_type, "w", ap_kir_binary(k, AP_KIR_SHR, tid, ap_kir_idx(k, 5)));
	l->lane = ap_kir_bind(k, b, k->index_type, "ln", ap_kir_binary(k, AP_KIR_AND, tid, ap_kir_idx(k, 31)));
	l->g = ap_kir_bind(k, b, k->index_type, "g", ap_kir_binary(k, AP_KIR_SHR, l->lane, ap_kir_idx(k, 2)));
	l->tq = ap_kir_bind(k, b, k->index_type, "tq", ap_kir_binary(k, AP_KIR_AND, l->lane, ap_kir_idx(k, 3)));
	l->l8 = ap_kir_binary(k, AP_KIR_AND, l->lane, ap_kir_idx(k, 7));
	l->l16 = ap_kir_binary(k, AP_KIR_AND, l->lane, ap_kir_idx(k, 15));
	l->hi = ap_kir_binary(k, AP_KIR_SHR, l->lane, ap_kir_idx(k, 4));
	l->j2 = ap_kir_binary(k, AP_KIR_AND, ap_kir_binary(k, AP_KIR_SHR, l->lane, ap_kir_idx(k, 3)), ap_kir_idx(k, 1));
}

/* The thread's warp and lane parts (ap__mma_lanes) and -inf. */
static void tc_lanes(att_tc *s)
{
	ap_mma_lanes l;

	ap__mma_lanes(s->c->k, s->c->v->cur, &l);
	s->warp = l.warp;
	s->lane = l.lane;
	s->g = l.g;
	s->tq = l.tq;
	s->l8 = l.l8;
	s->l16 = l.l16;
	s->hi = l.hi;
	s->j2 = l.j2;
	s->ninf = ap_kir_float(s->c->k, s->A, -INFINITY);
}

/* The block's BQ query rows from q0 into qs (with two stages, the first
 * key tile's copies issued behind them), then the warp's 16 rows as A
 * fragments qf by ldmatrix .x4 (matrix j = lane / 8: rows (j % 2) * 8..,
 * k (j / 2) * KS / 2..), rounded for TF32. */
static void tc_load_q(att_tc *s, ap_kir_expr *q0)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_var *kk;

	stage_rows(c, s->qs, ap_kir_idx(k, 0), 0, s->BQ, s->Dp, s->ldq, q0, p->Nq, p->D);
	if (p->aw[0])
		ap_kir_cp_commit(k, v->cur);
	if (s->NST == 2) {
		/* the first key tile's copies, in flight while Q's fragments load */
		stage_rows(c, s->ks, ap_kir_idx(k, 0), 1, s->BK, s->Dp, s->ldq, ap_kir_idx(k, 0), p->Nk, p->D);
		stage_rows(c, s->vs, ap_kir_idx(k, 0), 2, s->BK, s->Dvp, s->ldv, ap_kir_idx(k, 0), p->Nk, p->Dv);
		ap_kir_cp_commit(k, v->cur);
	}
	if (p->aw[0])
		ap_kir_cp_wait(k, v->cur, s->NST == 2 ? 1 : 0);    /* Q's group */
	if (c->wg) {   /* wgmma reads Q from shared memory through the async proxy */
		ap_kir_fence_proxy_async(k, v->cur);
		ap_kir_barrier(k, v->cur);
		return;
	}
	ap_kir_barrier(k, v->cur);
	kk = ap_v_loop_unrolled(v, "kq", s->Dp / s->KS, &saved);
	ap_kir_ldmatrix(k, v->cur, s->qf, ap_kir_muli(k, ap_kir_ref(k, kk), s->AF), s->qs,
			ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, s->warp, 16), s->l16), s->ldq),
				   ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, kk), s->KS), ap_kir_muli(k, s->hi, s->KS / 2))),
			4, false);
	ap_v_close(v, saved);
	if (s->tf32)
		round_tf32(c, s->qf, s->Dp / s->KS * s->AF);
}

/* The row statistics m = -inf, l = 0 of the lane's two rows and the
 * output accumulators set to zero. */
static void tc_init_state(att_tc *s)
{
	ap_kir_kernel *k = s->c->k;
	ap_vctx *v = s->c->v;
	ap_kir_block *saved;
	ap_kir_var *i;

	for (int h = 0; h < 2; h++) {
		s->mrun[h] = ap_kir_var_new(k, s->A, "m");
		s->lrun[h] = ap_kir_var_new(k, s->A, "l");
		ap_kir_let(k, v->cur, s->mrun[h], s->ninf);
		ap_kir_let(k, v->cur, s->lrun[h], ap_kir_float(k, s->A, 0));
	}
	i = ap_v_loop_unrolled(v, "z", s->NO * 4, &saved);
	ap_kir_store(k, v->cur, s->oacc, ap_kir_ref(k, i), ap_kir_float(k, s->A, 0));
	ap_v_close(v, saved);
}

/* Key tile kt in shared memory: with two stages, the next tile's copies
 * go into the other stage (its last readers passed the barrier first)
 * and this one's are waited for; with one, this tile is staged and
 * waited for.  Sets key0 and the stage's offsets kbase / vbase. */
static void tc_stage_kv(att_tc *s, ap_kir_var *kt)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_expr *kst;

	s->key0 = ap_kir_bind(k, v->cur, k->index_type, "k0", ap_kir_muli(k, ap_kir_ref(k, kt), s->BK));
	ap_kir_barrier(k, v->cur);
	if (s->NST == 2) {
		ap_kir_expr *nx = ap_kir_bind(k, v->cur, k->index_type, "kn", ap_kir_addi(k, ap_kir_ref(k, kt), 1));
		ap_kir_block *s2;

		kst = ap_kir_bind(k, v->cur, k->index_type, "st", ap_kir_binary(k, AP_KIR_AND, ap_kir_ref(k, kt), ap_kir_idx(k, 1)));
		ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, nx, ap_kir_idx(k, s->ntiles)), &s2, NULL);
		{
			ap_kir_expr *nst = ap_kir_binary(k, AP_KIR_AND, nx, ap_kir_idx(k, 1));
			ap_kir_expr *nkey0 = ap_kir_muli(k, nx, s->BK);

			stage_rows(c, s->ks, ap_kir_muli(k, nst, s->BK * s->ldq), 1, s->BK, s->Dp, s->ldq, nkey0, p->Nk, p->D);
			stage_rows(c, s->vs, ap_kir_muli(k, nst, s->BK * s->ldv), 2, s->BK, s->Dvp, s->ldv, nkey0, p->Nk, p->Dv);
		}
		ap_v_close(v, s2);
		ap_kir_cp_commit(k, v->cur);
		ap_kir_cp_wait(k, v->cur, 1);
	} else {
		kst = ap_kir_idx(k, 0);
		stage_rows(c, s->ks, kst, 1, s->BK, s->Dp, s->ldq, s->key0, p->Nk, p->D);
		stage_rows(c, s->vs, kst, 2, s->BK, s->Dvp, s->ldv, s->key0, p->Nk, p->Dv);
		async_done(c, p->aw[1] || p->aw[2]);
	}
	s->kbase = ap_kir_bind(k, v->cur, k->index_type, "kb", ap_kir_muli(k, kst, s->BK * s->ldq));
	s->vbase = ap_kir_bind(k, v->cur, k->index_type, "vb", ap_kir_muli(k, kst, s->BK * s->ldv));
	if (c->wg)
		ap_kir_fence_proxy_async(k, v->cur);
	ap_kir_barrier(k, v->cur);
}

/* wgmma's layouts of the Q and K tiles (K-major: rows along M or N, the
 * head dim along K) and of the V tile (MN-major: keys along K, its head
 * dim along N), wg_place's. */
static ap_kir_wg_layout wg_qk_layout(const att_tc *s)
{
	return (ap_kir_wg_layout){false, 128, (int)(16 * s->Dp)};
}

static ap_kir_wg_layout wg_v_layout(const att_tc *s)
{
	return (ap_kir_wg_layout){true, (int)(16 * s->Dvp), 128};
}

/* S = Q K^T on wgmma (sm_90a, FlashAttention-3's first product): per k16
 * step of the head dim one m64nBKk16 of the warpgroup -- A its 64 query
 * rows of the Q tile, B the K tile -- into the score accumulators, whose
 * layout is mma.sync's per warp (warp q of the warpgroup: rows 16 q..). */
static void wg_qk(att_tc *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_var *i, *kk;
	ap_kir_expr *row0 = ap_kir_muli(k, ap_kir_binary(k, AP_KIR_SHR, s->warp, ap_kir_idx(k, 2)), 64);

	i = ap_v_loop_unrolled(v, "z", s->NS * 4, &saved);
	ap_kir_store(k, v->cur, s->sacc, ap_kir_ref(k, i), ap_kir_float(k, s->A, 0));
	ap_v_close(v, saved);
	ap_kir_wgmma_fence(k, v->cur, s->sacc);
	kk = ap_v_loop_unrolled(v, "kq", s->Dp / 16, &saved);
	ap_kir_wgmma(k, v->cur, s->T == AP_DT_F16 ? AP_KIR_WGMMA_F16 : AP_KIR_WGMMA_BF16, s->BK, s->sacc,
		     ap_kir_idx(k, 0), s->qs, ap__wg_place(k, row0, ap_kir_muli(k, ap_kir_ref(k, kk), 16), s->Dp),
		     wg_qk_layout(s), s->ks,
		     ap_kir_add(k, s->kbase, ap__wg_place(k, ap_kir_idx(k, 0), ap_kir_muli(k, ap_kir_ref(k, kk), 16), s->Dp)),
		     wg_qk_layout(s));
	ap_v_close(v, saved);
	ap_kir_wgmma_commit(k, v->cur);
	ap_kir_wgmma_wait(k, v->cur, 0, s->sacc);
}

/* O += P V on wgmma: per k16 step j of the key tile one m64nDvk16 with A
 * the probabilities' registers (pf: the A fragment of step j, the same
 * layout as mma.sync's) and B the V tile's keys 16 j.. */
static void wg_pv(att_tc *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_var *j;

	ap_kir_wgmma_fence(k, v->cur, s->oacc);
	j = ap_v_loop_unrolled(v, "kj", s->BK / 16, &saved);
	ap_kir_wgmma(k, v->cur, s->T == AP_DT_F16 ? AP_KIR_WGMMA_F16 : AP_KIR_WGMMA_BF16, (int)s->Dvp, s->oacc,
		     ap_kir_idx(k, 0), s->pf, ap_kir_muli(k, ap_kir_ref(k, j), 8), wg_qk_layout(s), s->vs,
		     ap_kir_add(k, s->vbase, ap__wg_place(k, ap_kir_muli(k, ap_kir_ref(k, j), 16), ap_kir_idx(k, 0), s->Dvp)),
		     wg_v_layout(s));
	ap_v_close(v, saved);
	ap_kir_wgmma_commit(k, v->cur);
	ap_kir_wgmma_wait(k, v->cur, 0, s->oacc);
}

/* S = Q K^T for the tile: the NS score fragments set to zero, then per k
 * step and n8 tile a B fragment of K by ldmatrix .x2 (K's rows are B's
 * columns: matrix j2 holds k j2 * KS / 2..) and an mma. */
static void tc_qk(att_tc *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved, *s2;
	ap_kir_var *i, *kk, *ni;
	ap_kir_expr *si;

	i = ap_v_loop_unrolled(v, "z", s->NS * 4, &saved);
	ap_kir_store(k, v->cur, s->sacc, ap_kir_ref(k, i), ap_kir_float(k, s->A, 0));
	ap_v_close(v, saved);
	kk = ap_v_loop_unrolled(v, "kq", s->Dp / s->KS, &saved);
	ni = ap_v_loop_unrolled(v, "ni", s->NS, &s2);
	si = ap_kir_muli(k, ap_kir_ref(k, ni), 4);
	ap_kir_ldmatrix(k, v->cur, s->kf, ap_kir_idx(k, 0), s->ks,
			ap_kir_add(k, s->kbase,
				   ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, ni), 8), s->l8), s->ldq),
					      ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, kk), s->KS), ap_kir_muli(k, s->j2, s->KS / 2)))),
			2, false);
	if (s->tf32)
		round_tf32(c, s->kf, s->BF);
	ap_kir_mma(k, v->cur, c->p->mma, s->sacc, si, s->qf, ap_kir_muli(k, ap_kir_ref(k, kk), s->AF), s->kf,
		   ap_kir_idx(k, 0), s->sacc, si);
	ap_v_close(v, s2);
	ap_v_close(v, saved);
}

/* The scores: the first product's epilogue (score) on each element a
 * lane holds, element e of n8 tile ni at row wrow + g + 8 * (e / 2), key
 * key0 + 8 * ni + 2 * tq + e % 2; -inf past the last key. */
static void tc_scores(att_tc *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_var *ni = ap_v_loop_unrolled(v, "ni", s->NS, &saved);

	for (int e = 0; e < 4; e++) {
		ap_kir_expr *si = ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, ni), 4), e);
		ap_kir_expr *row = ap_kir_bind(k, v->cur, k->index_type, "r",
					       ap_kir_add(k, s->wrow, ap_kir_addi(k, s->g, 8 * (e >> 1))));
		ap_kir_expr *key = ap_kir_bind(k, v->cur, k->index_type, "key",
					       ap_kir_add(k, ap_kir_add(k, s->key0, ap_kir_muli(k, ap_kir_ref(k, ni), 8)),
							  ap_kir_addi(k, ap_kir_muli(k, s->tq, 2), e & 1)));
		ap_kir_var *sv = ap_kir_var_new(k, s->A, "s");
		ap_kir_block *s2;

		ap_kir_let(k, v->cur, sv, s->ninf);
		ap_v_if(v, ap_kir_binary(k, AP_KIR_LT, key, ap_kir_idx(k, c->p->Nk)), &s2, NULL);
		score(c, sv, ap_kir_load(k, s->sacc, si), row, key);
		ap_v_close(v, s2);
		ap_kir_store(k, v->cur, s->sacc, si, ap_kir_ref(k, sv));
	}
	ap_v_close(v, saved);
}

/* The online softmax's maxima for rows g (h = 0) and g + 8 (h = 1): the
 * lane's maximum, then the row's over the four lanes that hold it (two
 * xor shuffles); the new maximum mnew, `dead` while every score so far
 * is -inf, the rescale factor alpha = exp(m - mnew), and rs = 0, the
 * lane's part of the tile's row sum. */
static void tc_row_max(att_tc *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_dtype A = s->A;
	ap_kir_block *saved;

	for (int h = 0; h < 2; h++) {
		ap_kir_var *mx = ap_kir_var_new(k, A, "mx"), *ni;
		ap_kir_expr *mt;

		ap_kir_let(k, v->cur, mx, s->ninf);
		ni = ap_v_loop_unrolled(v, "ni", s->NS, &saved);
		for (int e = 2 * h; e < 2 * h + 2; e++)
			ap_kir_assign(k, v->cur, mx, ap_kir_binary(k, AP_KIR_MAX, ap_kir_ref(k, mx),
								   ap_kir_load(k, s->sacc, ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, ni), 4), e))));
		ap_v_close(v, saved);
		mt = xor_reduce(c, ap_kir_ref(k, mx), true, 4);
		s->mnew[h] = ap_kir_bind(k, v->cur, A, "mn", ap_kir_binary(k, AP_KIR_MAX, ap_kir_ref(k, s->mrun[h]), mt));
		/* every score so far -inf: nothing to rescale, nothing to add */
		s->dead[h] = ap_kir_bind(k, v->cur, AP_DT_BOOL, "dd", ap_kir_binary(k, AP_KIR_EQ, s->mnew[h], s->ninf));
		s->alpha[h] = ap_kir_bind(k, v->cur, A, "al",
					  ap_kir_select(k, s->dead[h], ap_kir_float(k, A, 1),
							ap_kir_call(k, AP_KIR_EXP, ap_kir_binary(k, AP_KIR_SUB, ap_kir_ref(k, s->mrun[h]), s->mnew[h]), NULL)));
		s->rs[h] = ap_kir_var_new(k, A, "rs");
		ap_kir_let(k, v->cur, s->rs[h], ap_kir_float(k, A, 0));
	}
}

/* The probabilities exp(s - mnew) of the tile, summed into rs and moved
 * into pf as PV's A fragments (16-bit: the C fragments of n8 tiles 2j,
 * 2j + 1 are the A fragment of k16 step j; TF32: through the C layout
 * and tf32_a_from_c); then l = l * alpha + rs, m = mnew, and O's
 * accumulators rescaled by alpha. */
static void tc_probabilities(att_tc *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_dtype A = s->A;
	ap_kir_block *saved;
	ap_kir_var *ni = ap_v_loop_unrolled(v, "ni", s->NS, &saved);

	for (int e = 0; e < 4; e++) {
		ap_kir_expr *si = ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, ni), 4), e);
		ap_kir_expr *pv = ap_kir_bind(k, v->cur, A, "p",
					      ap_kir_select(k, s->dead[e >> 1], ap_kir_float(k, A, 0),
							    ap_kir_call(k, AP_KIR_EXP, ap_kir_binary(k, AP_KIR_SUB, ap_kir_load(k, s->sacc, si), s->mnew[e >> 1]), NULL)));

		ap_kir_assign(k, v->cur, s->rs[e >> 1], ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, s->rs[e >> 1]), pv));
		ap_kir_store(k, v->cur, s->tf32 ? s->sacc : s->pf, si, ap_kir_cast(k, s->tf32 ? A : s->T, pv));
	}
	ap_v_close(v, saved);
	if (s->tf32)
		tf32_a_from_c(c, s->sacc, s->pf, s->NS, s->tq);
	for (int h = 0; h < 2; h++) {
		ap_kir_assign(k, v->cur, s->lrun[h], ap_kir_binary(k, AP_KIR_ADD,
								    ap_kir_binary(k, AP_KIR_MUL, ap_kir_ref(k, s->lrun[h]), s->alpha[h]),
								    ap_kir_ref(k, s->rs[h])));
		ap_kir_assign(k, v->cur, s->mrun[h], s->mnew[h]);
	}
	ni = ap_v_loop_unrolled(v, "no", s->NO, &saved);
	for (int e = 0; e < 4; e++) {
		ap_kir_expr *oi = ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, ni), 4), e);

		ap_kir_store(k, v->cur, s->oacc, oi, ap_kir_binary(k, AP_KIR_MUL, ap_kir_load(k, s->oacc, oi), s->alpha[e >> 1]));
	}
	ap_v_close(v, saved);
}

/* O += P V: per k step j of the tile and n8 tile no of O, V's B fragment
 * (16-bit: ldmatrix .x2 .trans, V's rows along k; TF32: b0 = V[t][g],
 * b1 = V[t + 4][g], one element a lane, since ldmatrix does not transpose
 * 32-bit elements) and an mma with the probabilities' A fragment. */
static void tc_pv(att_tc *s)
{
	actx *c = s->c;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved, *s2;
	ap_kir_var *j = ap_v_loop_unrolled(v, "kj", s->BK / s->KS, &saved);
	ap_kir_var *no = ap_v_loop_unrolled(v, "no", s->NO, &s2);
	ap_kir_expr *oi = ap_kir_muli(k, ap_kir_ref(k, no), 4);

	if (s->tf32) {
		for (int e = 0; e < 2; e++)
			ap_kir_store(k, v->cur, s->vf, ap_kir_idx(k, e),
				     ap_kir_call(k, AP_KIR_TF32,
						 ap_kir_load(k, s->vs, ap_kir_add(k, s->vbase,
							ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, j), 8),
												ap_kir_addi(k, s->tq, 4 * e)), s->ldv),
								   ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, no), 8), s->g)))), NULL));
	} else {
		ap_kir_ldmatrix(k, v->cur, s->vf, ap_kir_idx(k, 0), s->vs,
				ap_kir_add(k, s->vbase,
					   ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, j), 16),
										   ap_kir_add(k, ap_kir_muli(k, s->j2, 8), s->l8)), s->ldv),
						      ap_kir_muli(k, ap_kir_ref(k, no), 8))),
				2, true);
	}
	ap_kir_mma(k, v->cur, c->p->mma, s->oacc, oi, s->pf, ap_kir_muli(k, ap_kir_ref(k, j), s->AF), s->vf,
		   ap_kir_idx(k, 0), s->oacc, oi);
	ap_v_close(v, s2);
	ap_v_close(v, saved);
}

/* After the last key tile: each row's sum from the four lanes that hold
 * parts of it, O = acc / l through O's epilogue (rows below Nq, columns
 * below Dv), and the statistics others read (from the lanes with
 * tq = 0). */
static void tc_store(att_tc *s)
{
	actx *c = s->c;
	const att_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *saved;
	ap_kir_var *no;

	for (int h = 0; h < 2; h++)
		ap_kir_assign(k, v->cur, s->lrun[h], xor_reduce(c, ap_kir_ref(k, s->lrun[h]), false, 4));
	no = ap_v_loop_unrolled(v, "no", s->NO, &saved);
	for (int e = 0; e < 4; e++) {
		ap_kir_expr *row = ap_kir_bind(k, v->cur, k->index_type, "r",
					       ap_kir_add(k, s->wrow, ap_kir_addi(k, s->g, 8 * (e >> 1))));
		ap_kir_expr *col = ap_kir_bind(k, v->cur, k->index_type, "col",
					       ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, no), 8),
							  ap_kir_addi(k, ap_kir_muli(k, s->tq, 2), e & 1)));
		ap_kir_block *s2;

		ap_v_if(v, ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_LT, row, ap_kir_idx(k, p->Nq)),
					 ap_kir_binary(k, AP_KIR_LT, col, ap_kir_idx(k, p->Dv))), &s2, NULL);
		c->out = ap_kir_bind(k, v->cur, s->A, "o",
				     ap_kir_binary(k, AP_KIR_DIV,
						   ap_kir_load(k, s->oacc, ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, no), 4), e)),
						   divisor(c, ap_kir_ref(k, s->lrun[e >> 1]))));
		ap__epilogue_store(v, p->maps, idx2(c, p->o, row, col));
		c->out = NULL;
		ap_v_close(v, s2);
	}
	ap_v_close(v, saved);
	for (int h = 0; h < 2 && (p->m_out || p->l_out || p->n_stat); h++) {
		ap_kir_expr *row = ap_kir_bind(k, v->cur, k->index_type, "r", ap_kir_add(k, s->wrow, ap_kir_addi(k, s->g, 8 * h)));

		store_stats(c, row, ap_kir_binary(k, AP_KIR_EQ, s->tq, ap_kir_idx(k, 0)), s->mrun[h], s->lrun[h]);
	}
}

/* The tensor-core form (the comment above): W warps of 16 query rows, key
 * tiles of BK; per key tile tc_stage_kv, tc_qk, tc_scores, tc_row_max,
 * tc_probabilities and tc_pv, then tc_store.  Errors: AP_EUNSUPPORTED
 * (the tiles do not fit the target: tc_fits), AP_ENOMEM. */
static int emit_tc(actx *c, const ap_target_info *t, int W, int BK, ap_error *err)
{
	const att_plan *p = c->p;
	ap_vctx *v = c->v;
	ap_kir_kernel *k = c->k;
	att_tc s;
	int rc;
	ap_kir_expr *q0;
	ap_kir_var *kt;
	ap_kir_block *tsaved, *ksaved;

	if (!tc_fits(p, t, W, BK))
		return ap_error_set(err, AP_EUNSUPPORTED, v->g->nodes[v->m->root].name, NULL,
				    "attention emitter: %d warps and %d keys a tile do not fit", W, BK);
	memset(&s, 0, sizeof(s));
	s.c = c;
	s.T = p->t;
	s.A = AP_DT_F32;
	s.Dp = tc_dpad(p);
	s.Dvp = tc_dvpad(p);
	s.ldq = tc_ldq(p);
	s.ldv = tc_ldv(p);
	s.BK = BK;
	s.BQ = 16 * W;
	s.NS = BK / 8;
	s.NO = (int)(s.Dvp / 8);
	s.NST = tc_stages(p);
	s.tf32 = tc_tf32(p);
	s.KS = s.tf32 ? 8 : 16;
	c->wg = tc_wg(p, t) && W % 4 == 0;
	if (c->wg) {   /* core-matrix tiles: no padding */
		s.ldq = s.Dp;
		s.ldv = s.Dvp;
		ap_kir_comment(k, v->cur, "wgmma (sm_90a): %d warpgroups of 64 query rows, Q, K and V tiles "
			       "in core-matrix layouts", W / 4);
	}
	if ((rc = tc_declare(&s, err)))
		return rc;
	s.ntiles = (p->Nk + BK - 1) / BK;
	k->block[0] = 32u * (unsigned)W;
	tc_lanes(&s);
	q0 = open_tiles(c, s.BQ, &tsaved);
	/* the first of this warp's 16 rows */
	s.wrow = ap_kir_bind(k, v->cur, k->index_type, "wr", ap_kir_add(k, q0, ap_kir_muli(k, s.warp, 16)));
	tc_load_q(&s, q0);
	tc_init_state(&s);
	kt = ap_v_loop(v, "kt", ap_kir_idx(k, 0), ap_kir_idx(k, s.ntiles), 1, &ksaved);
	tc_stage_kv(&s, kt);
	if (c->wg)
		wg_qk(&s);
	else
		tc_qk(&s);
	tc_scores(&s);
	tc_row_max(&s);
	tc_probabilities(&s);
	if (c->wg)
		wg_pv(&s);
	else
		tc_pv(&s);
	ap_v_close(v, ksaved);
	tc_store(&s);
	ap_v_close(v, tsaved);
	return 0;
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
	v.leaf = att_leaf;
	v.leaf_user = &c;
	rc = p->tc ? emit_tc(&c, b->t, r->w, r->bk, err) : emit_simt(&c, b->t, r->w, err);
	if (!rc)
		rc = v.rc;
	v.leaf = NULL;
	ap_vctx_clear(&v);
	return rc;
}

static int at_traffic(const ap_bound *b, const ap_plan *pl, ap_traffic *out)
{
	const att_plan *p = b->an;
	const at_res *r = (const at_res *)pl->x;

	memset(out, 0, sizeof(*out));
	if (ap__lower_inline_traffic(b->m, out) < 0)
		return AP_ENOMEM;
	out->flops = 2.0 * (double)p->batch * (double)p->Nq * (double)p->Nk * (double)(p->D + p->Dv);
	out->threads = r->threads;
	out->blocks = r->blocks;
	out->shared_bytes = r->smem;
	out->tensor_cores = p->tc;
	return 0;
}

const ap_emitter ap_emitter_attention = {
	"attention", at_bind, at_unbind, at_space, at_choose, at_emit, at_traffic, at_resolve, false, NULL,
};
