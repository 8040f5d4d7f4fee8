/* gemm.c -- the tiled GEMM emitter: a MatMul micro-graph (batched MatMul
 * with numpy batch broadcasting; Gemm, which expand.c opens into a MatMul
 * of transposed views with its alpha / beta / C as epilogue ops) with its
 * prologue and epilogue, as one kernel of block tiles staged through
 * shared memory.  Two forms over one skeleton:
 *
 *   SIMT (float32 without TF32, float64, targets without tensor cores,
 *   and the host): a block computes a BM x BN tile of the output with
 *   (BM/TM) x (BN/TN) threads, each holding a TM x TN register tile; per
 *   K step of BK, the A and B tiles are staged in shared memory k-major
 *   (As[k][m], Bs[k][n]) and every thread reads its TM + TN operands per k
 *   and does TM * TN multiply-adds (the register-blocked SGEMM of Volkov
 *   and Demmel, and of CUTLASS's SIMT path).
 *
 *   Tensor cores (float16 / bfloat16 on sm_80 and later, float32 with
 *   allow_tf32): a block of WM x WN warps, each warp a (BM/WM) x (BN/WN)
 *   tile of 16 x 8 mma.sync tiles (m16n8k16, or m16n8k8 for TF32) fed by
 *   ldmatrix from shared tiles: A row-major [m][k] (or k-major with
 *   ldmatrix .trans), B as [n][k] (or k-major [k][n] with .trans); float32
 *   accumulators in registers (the warp-level GEMM of the PTX ISA's mma
 *   and CUTLASS's "multistage" mainloop).
 *
 *   wgmma (target sm_90a, float16 / bfloat16: gemm_plan.wg): the same
 *   tiles per warpgroup of four warps -- knobs wgm x wgn warpgroups, each
 *   (BM/wgm) x (BN/wgn) of m64nNk16 products whose A and B the tensor
 *   cores read from shared memory through matrix descriptors (PTX ISA,
 *   "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"); the shared
 *   tiles in the ISA's canonical core-matrix layouts without swizzling
 *   (gemm_stage.c, wg_place), fenced for the async proxy before the
 *   barrier that publishes them; a K tile's products may stay in flight
 *   through the next (wait_group 1; CUTLASS's Hopper cp.async mainloop).
 *   The accumulators keep the mma.sync form's per-warp layout, so the
 *   epilogue and split-K are shared.
 *
 * Staging (both forms): a multi-stage pipeline over the K tiles: stage
 * s of S holds K tile kt with s = kt % S; loads for tile kt + S - 1 are
 * issued before tile kt is computed.  An operand that is a buffer read
 * through views and transposes ("plain"), aligned, whose contiguous
 * dimension is the one the shared tile keeps contiguous, is copied with
 * cp.async (sm_80 and later; 4, 8 or 16 bytes per copy, zero-filled past
 * the edges); so are a gather (im2col), a 16-bit operand no vector copy
 * reaches (pair staging) and an operand computed by unary ops from one
 * buffer (compute staging: a Cast, a scale; the buffer copied, the
 * operand computed into the tile once the stage has arrived), see
 * ap__gemm_copy_mode; any other operand -- a prologue of several tensors, such as
 * a LayerNorm's normalise -- is loaded into registers by the value
 * builder (so the prologue is computed once per element and block
 * column, not once per multiply) and stored to shared memory after the
 * current tile's arithmetic, which hides the global latency behind it.
 * The host runs the same kernel: cp.async is a copy, barriers split the
 * thread loops, ldmatrix / mma are emulated lane by lane (server/kir).
 *
 * Epilogue: every tensor the micro-graph writes is computed from the
 * MatMul output Y element by element (elementwise and broadcast ops,
 * views and transposes of Y); each accumulator element is cast to Y's
 * type, handed to the value builder as Y's value (a leaf hook), and each
 * output is stored at the index its views and transposes map Y's element
 * to.  Micro-graphs whose outputs are not all of that form are left to
 * the pointwise emitter (one thread per output element).
 *
 * Knobs: SIMT "bm", "bn", "bk", "tm", "tn", "stages"; tensor cores "bm",
 * "bn", "bk", "wm", "wn" (warps along M and N), "stages".  The default
 * configuration comes from the cost model (ap_cost_gemm_tile).
 *
 * This file: the analysis, the configuration space and its rule, the
 * library candidate, traffic and the emitter record; gemm_stage.c and
 * gemm_kernel.c build the kernel (gemm_internal.h lists what they share).
 */
#include "gemm_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- analysis: the operands and the epilogue ----------------------------------- */



void ap__gemm_plan_clear(gemm_plan *p)
{
	free(p->maps);
	p->maps = NULL;
}

/* Elements per cp.async for a plain operand: 16 bytes' worth, or fewer,
 * such that every copy stays aligned and inside its row. */
static int copy_width(const gemm_opnd *o, int64_t contig_extent, int64_t other_stride, int nb,
		      size_t es)
{
	for (int bytes = 16; bytes >= 4; bytes /= 2) {
		int w = (int)(bytes / (int)es);
		bool ok = w >= 1 && (size_t)w * es == (size_t)bytes && contig_extent % w == 0 &&
			  other_stride % w == 0 && o->s_base % w == 0;

		for (int d = 0; ok && d < nb; d++)
			for (int f = 0; ok && f < o->batch[d].n; f++)
				ok = o->batch[d].s[f] % w == 0;
		if (ok)
			return w;
	}
	return 0;
}

/* A composite operand whose outer or K coordinate ends in a factor of
 * stride 1 (the head dimension of attention heads merged back into rows,
 * a weight read through a reshape) is contiguous along that factor: runs
 * of `vec` elements copied by one cp.async stay inside it and aligned when
 * the factor's extent, every other stride and the base are multiples of
 * vec.  Sets k_fast, vec and cvec for the widest such run (K first). */
static void composite_vector(gemm_opnd *o, int nb, size_t es)
{
	for (int which = 0; which < 2; which++) {
		const bdim *f = which ? &o->fo : &o->fk;

		if (f->n < 1 || f->s[f->n - 1] != 1)
			continue;
		for (int bytes = 16; bytes >= 4; bytes /= 2) {
			int w = (int)(bytes / (int)es);
			bool ok = w >= 2 && f->e[f->n - 1] % w == 0 && o->s_base % w == 0;

			for (int q = 0; ok && q < o->fk.n; q++)
				ok = (f == &o->fk && q == o->fk.n - 1) || o->fk.s[q] % w == 0;
			for (int q = 0; ok && q < o->fo.n; q++)
				ok = (f == &o->fo && q == o->fo.n - 1) || o->fo.s[q] % w == 0;
			for (int d = 0; ok && d < nb; d++)
				for (int q = 0; ok && q < o->batch[d].n; q++)
					ok = o->batch[d].s[q] % w == 0;
			if (ok) {
				o->k_fast = f == &o->fk;
				o->vec = w;
				o->cvec = true;
				return;
			}
		}
	}
}

/* Fills o (role 0: A as [M][K]; 1: B, described as [N][K]; an operand
 * computed by unary ops from a view is analysed as that view, with
 * o->staged set). */
static void analyze_operand(const ap_graph *g, const gemm_plan *p, int role, gemm_opnd *o)
{
	const ap_tensor *t = &g->tensors[o->t];
	ap_sview sv;
	int r = t->rank;
	size_t es = ap_dtype_size(t->dtype);

	o->plain = false;
	o->cvec = false;
	o->staged = false;
	o->k_fast = role == 0;   /* activations [M, K]; weights [K, N] */
	o->vec = 0;
	if (!ap_sview_of(g, o->t, &sv, &o->leaf)) {
		if (!ap_sview_of_unary(g, o->t, &sv, &o->leaf, &o->casts_only))
			return;
		o->staged = true;
		es = ap_dtype_size(g->tensors[o->leaf].dtype);
		o->src_es = (int)es;
	}
	if (sv.rank != r)
		return;
	o->composite = !ap_sview_stride(&sv, r - 2, role == 0 ? &o->s_outer : &o->s_k) ||
		       !ap_sview_stride(&sv, r - 1, role == 0 ? &o->s_k : &o->s_outer);
	if (o->composite) {
		/* a mixed-radix row or k dim (a weight read transposed through a
		 * reshape): addressed factor by factor, copied element by element */
		for (int which = 0; which < 2; which++) {
			int d = which == (role == 0 ? 0 : 1) ? r - 2 : r - 1;
			bdim *f = which ? &o->fk : &o->fo;

			if (sv.first[d + 1] - sv.first[d] > BATCH_FACTORS)
				return;
			f->n = 0;
			for (int q = sv.first[d]; q < sv.first[d + 1]; q++) {
				f->e[f->n] = sv.fe[q];
				f->s[f->n++] = sv.fs[q];
			}
		}
	}
	for (int d = 0; d < p->nb; d++) {
		int j = d - (p->nb - (r - 2));

		o->batch[d].n = 0;
		if (j < 0 || t->dims[j] == 1)
			continue;
		if (sv.first[j + 1] - sv.first[j] > BATCH_FACTORS)
			return;
		for (int f = sv.first[j]; f < sv.first[j + 1]; f++) {
			o->batch[d].e[o->batch[d].n] = sv.fe[f];
			o->batch[d].s[o->batch[d].n++] = sv.fs[f];
		}
	}
	o->plain = true;
	o->s_base = sv.off;
	if (o->composite) {
		o->vec = es >= 4 ? 1 : 0;
		composite_vector(o, p->nb, es);
		return;
	}
	if (o->s_k == 1 && (p->K > 1 || o->s_outer != 1)) {
		o->k_fast = true;
		o->vec = copy_width(o, p->K, o->s_outer, p->nb, es);
	} else if (o->s_outer == 1) {
		o->k_fast = false;
		o->vec = copy_width(o, role == 0 ? p->M : p->N, o->s_k, p->nb, es);
	}
}

/* Tensor cores where the target has them for the input type (float16,
 * bfloat16 on sm_80 and later; float32 with allow_tf32), the mma.sync
 * shape for it, and wgmma on sm_90a (TF32 included: wgmma .tf32 reads
 * both operands K-major, ap__gemm_tile_layouts). */
static void choose_mma(gemm_plan *p, const ap_target_info *t)
{
	p->tc = t->gpu && t->arch >= 80 &&
		(p->in_t == AP_DT_F16 || p->in_t == AP_DT_BF16 || (p->in_t == AP_DT_F32 && t->allow_tf32));
	p->mma = p->in_t == AP_DT_F16 ? AP_KIR_MMA_F16_16816
		 : p->in_t == AP_DT_BF16 ? AP_KIR_MMA_BF16_16816 : AP_KIR_MMA_TF32_1688;
	p->wg = p->tc && t->wgmma;
}

/* The convolution's spatial dims (input D, output O, kernel KS, strides,
 * dilations, leading pads) from node n and its input xt, weights wt,
 * output yt; ohw and kk the numbers of output and kernel positions; *one
 * when it is 1x1 with unit strides and no padding.  False with *why for
 * a stride or dilation below 1. */
static bool conv_dims(gemm_plan *p, const ap_node *n, const ap_tensor *xt, const ap_tensor *wt,
		      const ap_tensor *yt, bool *one, char *why, size_t cap)
{
	*one = true;
	p->ohw = 1;
	p->kk = 1;
	for (int d = 0; d < p->ns; d++) {
		p->D[d] = xt->dims[2 + d];
		p->O[d] = yt->dims[2 + d];
		p->KS[d] = wt->dims[2 + d];
		p->st[d] = ap_node_attr_at(n, "strides", d, 1);
		p->dl[d] = ap_node_attr_at(n, "dilations", d, 1);
		p->pd[d] = ap_node_attr_at(n, "pads", d, 0);
		if (p->st[d] < 1 || p->dl[d] < 1) {
			snprintf(why, cap, "stride %lld, dilation %lld", (long long)p->st[d], (long long)p->dl[d]);
			return false;
		}
		p->ohw *= p->O[d];
		p->kk *= p->KS[d];
		*one = *one && p->KS[d] == 1 && p->st[d] == 1 && p->pd[d] == 0 &&
		       ap_node_attr_at(n, "pads", p->ns + d, 0) == 0;
	}
	return true;
}

/* The implicit GEMM's operands that are buffers read as they are
 * ("plain"; vec: elements per cp.async).  A: X itself for a 1x1
 * convolution with unit stride and no padding (`one`; rows contiguous
 * within an image).  B: the weights as they are for a Conv
 * ([M][Cg * kernel], K contiguous); ConvTranspose's W[g * Cg + c][m][kpos]:
 * K = (c, kpos) is two factors apart, so plain but composite, copied
 * element by element (4- and 8-byte types; 16-bit ones go through
 * registers). */
static void conv_plain_operands(const ap_graph *g, gemm_plan *p, bool one)
{
	/* A gathered or computed A is also copied along its rows, NCHW's
	 * contiguous output positions: neighbouring threads read neighbouring
	 * elements, and a thread keeps one row for a whole tile (ap__gemm_issue_async),
	 * so the row's image and positions are computed once per tile
	 * (squeezenet1_1 on the host, one thread: 51-52 -> 49.5-50.3 ms along
	 * rows; its stem 4-5 -> 3.3-3.6 ms with the row computed once) */
	p->a.t = p->x;
	p->b.t = p->w;
	p->a.plain = false;
	p->b.plain = false;
	p->a.k_fast = false;
	p->b.k_fast = true;
	if (!p->convt && one && g->tensors[p->x].producer < 0 && g->tensors[p->x].kind != AP_TENSOR_CONST) {
		p->a_1x1 = true;
		p->a.plain = true;
		p->a.leaf = p->x;
		p->a.k_fast = false;
		p->a.s_outer = 1;
		p->a.s_k = p->ohw;
		p->a.vec = 0;
		for (int w = (int)(16 / ap_dtype_size(p->in_t)); w >= 1 && !p->a.vec; w /= 2)
			if ((size_t)w * ap_dtype_size(p->in_t) >= 4 && p->ohw % w == 0)
				p->a.vec = w;
	}
	if (g->tensors[p->w].producer < 0 &&
	    (g->tensors[p->w].kind != AP_TENSOR_CONST || ap_tensor_numel(&g->tensors[p->w]) > 16) &&
	    (!p->convt || ap_dtype_size(p->in_t) >= 4)) {
		p->b.plain = true;
		p->b.leaf = p->w;
		p->b.composite = p->convt;
		p->b.s_outer = p->convt ? p->kk : p->K;
		p->b.s_k = 1;
		p->b.vec = p->convt ? 1 : 0;
		for (int w = (int)(16 / ap_dtype_size(p->in_t)); w >= 1 && !p->b.vec; w /= 2)
			if ((size_t)w * ap_dtype_size(p->in_t) >= 4 && p->K % w == 0)
				p->b.vec = w;
	}
}

/* The operands that are not plain: one that is a view of a buffer (X for
 * the im2col rows; X or W through the transposes of a weight gradient)
 * is gathered by cp.async one element a copy (16-bit types: the aligned
 * pair holding it, see ap__gemm_copy_mode), the padding zero-filled by the copy's
 * source size.  A Cast of the float32 input of a converted graph is
 * gathered in its own type and converted into the tile (staged,
 * ap__gemm_copy_mode): only casts, so the zero padding stays zero, and elements of
 * 4 bytes at least, cp.async's smallest copy.  Anything else goes through
 * registers. */
static void conv_gathered_operands(const ap_graph *g, gemm_plan *p)
{
	for (int role = 0; role < 2; role++) {
		gemm_opnd *op = role ? &p->b : &p->a;
		bool staged = false, casts_only = false;

		op->staged = false;
		if (op->plain)
			continue;
		if (!ap_sview_of(g, op->t, &op->gv, &op->leaf)) {
			if (!ap_sview_of_unary(g, op->t, &op->gv, &op->leaf, &casts_only) || !casts_only ||
			    ap_dtype_size(g->tensors[op->leaf].dtype) < 4)
				continue;
			staged = true;
		}
		if (g->tensors[op->leaf].kind == AP_TENSOR_CONST || op->gv.rank != g->tensors[op->t].rank)
			continue;
		op->gather = true;
		op->staged = staged;
		op->casts_only = casts_only;
		op->src_es = (int)ap_dtype_size(g->tensors[op->leaf].dtype);
		op->vec = 1;
	}
}

/* A Conv / ConvTranspose micro-graph as an implicit GEMM (the im2col
 * product formed tile by tile in shared memory, never in memory; Chetlur
 * et al., "cuDNN: Efficient Primitives for Deep Learning", 2014): one
 * convolution node of a float type, groups of at least 8 output channels
 * (depthwise convolutions are left to the pointwise emitter), every
 * output an element-for-element function of its result.  Rows are
 * (image, output position), columns a group's output channels, K (input
 * channel of the group, kernel position); tile batches are the groups.
 * 1 with p filled, 0 with *why, AP_ENOMEM. */
static int analyze_conv(const ap_mgraph *m, const ap_target_info *t, gemm_plan *p, int node, char *why,
			size_t cap)
{
	const ap_graph *g = m->g;
	const ap_node *n = &g->nodes[node];
	const ap_tensor *xt, *wt, *yt;
	ap_conv_ops co;
	bool one;
	int rc;

	p->conv = true;
	p->convt = n->op == AP_OP_CONV_TRANSPOSE;
	p->node = node;
	if (!ap__conv_ops(g, node, 3, &co, why, cap))
		return false;
	p->x = co.x;
	p->w = co.w;
	p->bias = co.bias;
	p->y = co.y;
	xt = &g->tensors[p->x];
	wt = &g->tensors[p->w];
	yt = &g->tensors[p->y];
	p->ns = co.ns;
	p->in_t = co.in_t;
	p->acc_t = co.acc_t;
	p->C = co.C;
	p->groups = co.groups;
	p->Cg = co.Cg;
	p->Mg = co.Mg;
	if (p->Mg < 8) {
		snprintf(why, cap, "%lld output channels per group: a depthwise-like convolution",
			 (long long)p->Mg);
		return false;
	}
	if (!conv_dims(p, n, xt, wt, yt, &one, why, cap))
		return false;
	p->batch = 1;
	p->nb = 0;
	p->M = p->ohw;
	p->Mr = xt->dims[0] * p->ohw;
	p->N = p->Mg;
	p->K = p->Cg * p->kk;
	p->tb = p->groups;
	if (p->Mr < 1 || p->K < 1) {
		snprintf(why, cap, "an empty convolution");
		return false;
	}
	p->maps = calloc((size_t)g->n_tensors + 1, sizeof(ap_emap));
	if (!p->maps) {
		snprintf(why, cap, "out of memory");
		return AP_ENOMEM;
	}
	if ((rc = ap__epilogue_maps(g, p->y, p->maps, true, why, cap)) <= 0) {
		ap__gemm_plan_clear(p);
		return rc;
	}
	conv_plain_operands(g, p, one);
	conv_gathered_operands(g, p);
	choose_mma(p, t);
	return true;
}

/* The MatMul micro-graphs this emitter builds: one MatMul of two operands
 * of rank >= 2 and a float type, every output an element-for-element
 * function of its product. */
int ap__gemm_analyze(const ap_mgraph *m, const ap_target_info *t, gemm_plan *p, char *why,
		     size_t cap)
{
	const ap_graph *g = m->g;
	const ap_tensor *at, *bt, *yt;
	int n_mm = 0, rc;

	memset(p, 0, sizeof(*p));
	p->bias = -1;
	if (m->kind == AP_GROUP_CONV) {
		int n_conv = 0, node = -1;

		for (int i = 0; i < g->n_nodes; i++)
			if (g->nodes[i].op == AP_OP_CONV || g->nodes[i].op == AP_OP_CONV_TRANSPOSE) {
				node = i;
				n_conv++;
			}
		if (n_conv != 1) {
			snprintf(why, cap, "%d convolutions", n_conv);
			return false;
		}
		return analyze_conv(m, t, p, node, why, cap);
	}
	if (m->kind != AP_GROUP_MATMUL) {
		snprintf(why, cap, "not a matmul or convolution micro-graph");
		return false;
	}
	for (int i = 0; i < g->n_nodes; i++)
		if (g->nodes[i].op == AP_OP_MATMUL) {
			p->node = i;
			n_mm++;
		}
	if (n_mm != 1) {
		snprintf(why, cap, "%d matmuls", n_mm);
		return false;
	}
	p->y = g->nodes[p->node].outputs[0];
	p->a.t = g->nodes[p->node].inputs[0];
	p->b.t = g->nodes[p->node].inputs[1];
	at = &g->tensors[p->a.t];
	bt = &g->tensors[p->b.t];
	yt = &g->tensors[p->y];
	if (at->rank < 2 || bt->rank < 2) {
		snprintf(why, cap, "a vector operand");
		return false;
	}
	p->in_t = at->dtype;
	p->acc_t = at->dtype == AP_DT_F64 ? AP_DT_F64 : AP_DT_F32;
	/* Y in the operands' type, or the float32 accumulator itself over
	 * 16-bit operands (Attention's fp32 scores, expand.c) */
	if (!ap_kir_is_float_type(at->dtype) || at->dtype != bt->dtype ||
	    (yt->dtype != at->dtype && !(yt->dtype == p->acc_t && ap_dtype_size(at->dtype) == 2))) {
		snprintf(why, cap, "operands of type %s", ap_dtype_name(at->dtype));
		return false;
	}
	p->M = at->dims[at->rank - 2];
	p->K = at->dims[at->rank - 1];
	p->N = bt->dims[bt->rank - 1];
	p->nb = yt->rank - 2;
	p->batch = 1;
	for (int d = 0; d < p->nb; d++) {
		p->bdims[d] = yt->dims[d];
		p->batch *= yt->dims[d];
	}
	if (p->M < 1 || p->N < 1 || p->K < 1 || p->batch < 1) {
		snprintf(why, cap, "an empty product");
		return false;
	}
	p->fold = p->nb > 0 && bt->rank == 2;
	p->Mr = p->fold ? p->batch * p->M : p->M;
	p->tb = p->fold ? 1 : p->batch;
	p->maps = calloc((size_t)g->n_tensors + 1, sizeof(ap_emap));
	if (!p->maps) {
		snprintf(why, cap, "out of memory");
		return AP_ENOMEM;
	}
	if ((rc = ap__epilogue_maps(g, p->y, p->maps, true, why, cap)) <= 0) {
		ap__gemm_plan_clear(p);
		return rc;
	}
	analyze_operand(g, p, 0, &p->a);
	analyze_operand(g, p, 1, &p->b);
	p->a_linear = p->fold && p->a.plain && !p->a.composite;
	for (int d = p->nb - 1; p->a_linear && d >= 0; d--) {
		/* one factor per batch dim, each one stride past the next */
		const bdim *b = &p->a.batch[d];
		int64_t want = d == p->nb - 1 ? p->M * p->a.s_outer
			       : p->bdims[d + 1] * (p->a.batch[d + 1].n ? p->a.batch[d + 1].s[0] : 0);

		if (p->bdims[d] > 1 && (b->n != 1 || b->s[0] != want))
			p->a_linear = false;
	}
	choose_mma(p, t);
	return true;
}

/* ---- configuration ---------------------------------------------------------------- */


gemm_cfg ap__gemm_cfg_of(const ap_sched *s)
{
	gemm_cfg c = {s->v[K_BM], s->v[K_BN], s->v[K_BK], s->v[K_TM], s->v[K_TN], s->v[K_STAGES],
		      s->n > K_SPLITK ? s->v[K_SPLITK] : 1, s->n > K_TMA ? s->v[K_TMA] : 0};

	return c;
}

/* Split-K: the K tiles of one output tile dealt to the `splitk` blocks of
 * a thread-block cluster (sm_90 and later; the host runs a cluster as one
 * wide block), each accumulating its share; the partial accumulators are
 * summed in a fixed order (deterministic) through distributed shared
 * memory, each block summing and storing 1/splitk of the tile's elements
 * through the epilogue (CUTLASS's split-K idea, on Hopper's clusters
 * instead of a global workspace).  It pays when the tiles are far fewer
 * than the SMs and K is long: a weight gradient's product over the batch
 * and positions.  Values: 1, 2, 4, 8 (a portable cluster has at most 8
 * blocks), each slice at least 2 K tiles of the smallest bk. */
static int splitk_values(const gemm_plan *p, const ap_target_info *t, int *vals)
{
	int n = 0;

	for (int sk = 1; sk <= 8; sk *= 2)
		if (sk == 1 || ((!t->gpu || t->arch >= 90) && p->K >= (int64_t)sk * 2 * (p->tc ? 16 : 8)))
			vals[n++] = sk;
	return n;
}

/* Shared-memory padding (elements) of a tile row: 16 bytes keeps rows
 * 16-byte aligned for vector and ldmatrix accesses and spreads
 * consecutive rows over the banks.  wgmma's tiles are core matrices of
 * 8 rows of 16 bytes, back to back: no padding. */
int ap__gemm_pad_of(const gemm_plan *p)
{
	return p->wg ? 0 : (int)(16 / ap_dtype_size(p->in_t));
}

/* The wgmma kind of the product's input type (p->wg): float16,
 * bfloat16, or TF32 for float32. */
ap_kir_wgmma_kind ap__gemm_wgmma_kind(const gemm_plan *p)
{
	return p->in_t == AP_DT_F16 ? AP_KIR_WGMMA_F16 : p->in_t == AP_DT_BF16 ? AP_KIR_WGMMA_BF16 : AP_KIR_WGMMA_TF32;
}

/* Shared tile layouts: for each operand, whether its tile is kept with K
 * contiguous ([outer][k]) -- else k-major ([k][outer]). */
void ap__gemm_tile_layouts(const gemm_plan *p, bool *a_rowk, bool *b_rowk)
{
	if (!p->tc) {
		*a_rowk = false;   /* SIMT: both k-major */
		*b_rowk = false;
		return;
	}
	if (p->wg && p->mma == AP_KIR_MMA_TF32_1688) {
		/* wgmma .tf32 has no transpose: both tiles K-major, an operand whose
		 * outer coordinate is contiguous copied element by element (or
		 * through registers) into it; no TMA box for it (tma_operand) */
		*a_rowk = *b_rowk = true;
		return;
	}
	if (p->mma == AP_KIR_MMA_TF32_1688) {
		/* ldmatrix of 32-bit elements has no .trans: a plain operand whose
		 * outer coordinate is contiguous stays k-major (cp.async), its
		 * fragments read element by element; the others go [outer][k] */
		*a_rowk = !(p->a.plain && !p->a.k_fast);
		*b_rowk = !(p->b.plain && !p->b.k_fast);
		if (!*a_rowk && !*b_rowk)
			*a_rowk = true;   /* A through registers into rows: one operand by ldmatrix */
		return;
	}
	/* 16-bit: follow the global layout (cp.async copies rows as they are;
	 * ldmatrix .trans adapts); prologue operands go row-major */
	*a_rowk = !p->a.plain || p->a.k_fast;
	*b_rowk = p->b.plain ? p->b.k_fast : false;
}


/* How operand `role` reaches shared memory in configuration c on t:
 * returns the elements each cp.async copies (0: through registers, by the
 * value builder), and *mode how they reach the tile.
 *   - A plain operand (a buffer read through views and transposes) whose
 *     contiguous coordinate is the one its tile keeps contiguous is copied
 *     in vectors of op->vec elements;
 *   - else, for 4- and 8-byte elements, a plain or gathered operand is
 *     copied one element a copy;
 *   - else (16-bit), it is pair-staged: cp.async copies at least 4 bytes,
 *     so each element is fetched as the 4-byte-aligned pair of elements
 *     that holds it (into a pair buffer, one per stage), with the
 *     element's place in the pair (its address's parity) in a byte beside
 *     it; once the stage's copies are complete the block extracts each
 *     element into the single tile that ldmatrix reads (extract_pairs).
 *     The addresses and the global latency stay off the registers that
 *     the register-staged path keeps live across the main loop, for
 *     about twice the operand's shared memory and one more barrier per K
 *     tile;
 *   - an operand computed by unary ops from a buffer's view (op->staged:
 *     a Cast of the float32 inputs a converted graph keeps, a scale) is
 *     "compute-staged": cp.async copies the buffer's elements into a
 *     staging buffer, one per stage, in the operand's own order (vec
 *     elements a copy along its contiguous coordinate, else one, when
 *     that is 4 bytes at least), and once the stage's copies are complete
 *     the block computes each tile element from its staged element
 *     (ap__gemm_extract_tile); the same pipeline as the pairs, for the source's
 *     shared memory.
 * Other operands computed on the way (a prologue of several tensors: a
 * LayerNorm's normalise) go through registers, as do all operands on GPUs
 * without cp.async (before sm_80). */
int ap__gemm_copy_mode(const gemm_plan *p, int role, const gemm_cfg *c, const ap_target_info *t,
		       stage_mode *mode)
{
	const gemm_opnd *op = role ? &p->b : &p->a;
	bool ar, br, rowk;
	int ext;

	*mode = STAGE_TILE;
	if ((t->gpu && t->arch < 80) || (!op->plain && !op->gather))
		return 0;
	if (c->tma == 3) {
		/* warp specialised with a copying producer (gemm_tma.c): an
		 * operand cp.async cannot copy straight into its tile goes
		 * through the producer's registers (no staging buffer a stage
		 * to extract from, which would need the whole block) */
		stage_mode m;
		gemm_cfg d = *c;
		int w;

		d.tma = 0;
		w = ap__gemm_copy_mode(p, role, &d, t, &m);
		return m == STAGE_TILE ? w : 0;
	}
	if (op->staged) {
		int w;

		ext = op->k_fast ? c->bk : (role ? c->bn : c->bm);
		w = op->vec > 0 && (!op->composite || op->cvec) && !op->gather && ext % op->vec == 0 ? op->vec : 1;
		if (w * op->src_es < 4)
			return 0;
		*mode = STAGE_COMPUTE;
		return w;
	}
	ap__gemm_tile_layouts(p, &ar, &br);
	rowk = role ? br : ar;
	ext = rowk ? c->bk : (role ? c->bn : c->bm);
	if (op->vec > 0 && (!op->composite || op->cvec) && !op->gather && op->k_fast == rowk && ext % op->vec == 0)
		return op->vec;
	if (ap_dtype_size(p->in_t) >= 4)
		return op->vec > 0 ? 1 : 0;
	*mode = STAGE_PAIRS;
	return 1;
}

/* Bytes of shared memory of operand op's staging buffer of `elems` tile
 * elements in mode m (each array 16-byte aligned): pairs (2 elements of
 * es bytes) and parity bytes, or the source's elements. */
static size_t staging_bytes(stage_mode m, const gemm_opnd *op, size_t es, size_t elems)
{
	if (m == STAGE_PAIRS)
		return 16 + elems * (2 * es + 1) + 16;
	if (m == STAGE_COMPUTE)
		return 16 + elems * (size_t)op->src_es;
	return 0;
}

/* The swizzle, in bytes (0, 32, 64 or 128), of operand `role`'s shared
 * tile on wgmma (kir.h, ap_kir_wg_layout): the widest whose atom row --
 * W bytes of the tile's contiguous coordinate -- divides that extent and,
 * for an MN-major tile, every warpgroup's start along M or N (A's m64
 * tiles, B's bn / tn columns), so that a descriptor's start is an atom's
 * row 0.  Swizzling spreads the 16-byte chunks a warp's copies write
 * along the contiguous coordinate over all 32 banks: unswizzled, chunks
 * 128 bytes apart (the next core matrix) share 4 banks -- up to 8-way
 * conflicts on an MN-major tile's cp.async writes (PTX ISA, "Shared
 * Memory Matrix Layout"; CUTLASS picks its sm90 atoms the same way).  0
 * off wgmma. */
int ap__gemm_wg_swizzle(const gemm_plan *p, const gemm_cfg *c, int role)
{
	bool ar, br;
	int es = (int)ap_dtype_size(p->in_t), ext, start;

	if (!p->wg)
		return 0;
	ap__gemm_tile_layouts(p, &ar, &br);
	if (role ? br : ar) {
		ext = c->bk * es;
		start = ext;
	} else {
		ext = (role ? c->bn : c->bm) * es;
		start = (role ? c->bn / c->tn : 64) * es;
	}
	return ap_kir_wg_swizzle_fit(ext, start);
}

/* Bytes of shared memory of configuration c on t: each operand's tile
 * stages (a pair- or compute-staged operand: one tile, plus per stage its
 * staging buffer), and split-K's partial accumulator tile; wgmma's
 * tiles add B's start rounded up to its repeat and the slack of the
 * run-time alignment (ap_kir_shared_dyn_aligned). */
size_t ap__gemm_smem_bytes(const gemm_plan *p, const gemm_cfg *c, const ap_target_info *t)
{
	bool ar, br;
	stage_mode ma, mb;
	size_t es = ap_dtype_size(p->in_t), pad = (size_t)ap__gemm_pad_of(p), S = (size_t)c->stages;
	size_t a, b;

	ap__gemm_tile_layouts(p, &ar, &br);
	ap__gemm_copy_mode(p, 0, c, t, &ma);
	ap__gemm_copy_mode(p, 1, c, t, &mb);
	a = ar ? (size_t)c->bm * ((size_t)c->bk + pad) : (size_t)c->bk * ((size_t)c->bm + pad);
	b = br ? (size_t)c->bn * ((size_t)c->bk + pad) : (size_t)c->bk * ((size_t)c->bn + pad);
	a *= es * (ma != STAGE_TILE ? 1 : S);
	b *= es * (mb != STAGE_TILE ? 1 : S);
	if (p->wg) {
		/* wgmma's tiles: dynamic, B's start on its repeat after A's
		 * tiles, and the run-time alignment's slack (gemm_kernel.c,
		 * declare_shared) */
		size_t tiles[2] = { a, b };
		unsigned al[2] = { 8u * (unsigned)ap__gemm_wg_swizzle(p, c, 0),
				   8u * (unsigned)ap__gemm_wg_swizzle(p, c, 1) };

		b = ap_kir_shared_dyn_bytes(2, tiles, al) - a;
	}
	a += staging_bytes(ma, &p->a, es, S * (size_t)c->bm * (size_t)c->bk);
	b += staging_bytes(mb, &p->b, es, S * (size_t)c->bn * (size_t)c->bk);
	/* split-K: every block's partial accumulator tile, for the cluster */
	if (c->splitk > 1)
		b += 16 + (size_t)c->bm * (size_t)c->bn * ap_dtype_size(p->acc_t);
	/* tma=1: the ring's mbarriers, 8 bytes a stage; tma=2 and 3 (warp
	 * specialised): a full and an empty barrier a stage */
	if (c->tma)
		b += (c->tma >= 2 ? 16 : 8) * S;
	return a + b;
}

unsigned ap__gemm_threads_of(const gemm_plan *p, const gemm_cfg *c)
{
	if (p->wg)   /* tma=2, 3: the producer warpgroup after the consumers */
		return 128u * (unsigned)(c->tm * c->tn + (c->tma >= 2));
	if (p->tc)
		return 32u * (unsigned)(c->tm * c->tn);
	return (unsigned)((c->bm / c->tm) * (c->bn / c->tn));
}

/* Largest dynamic shared memory a block may ask for on t. */
static size_t smem_limit(const ap_target_info *t)
{
	return t->shared_optin_per_block > t->shared_per_block ? t->shared_optin_per_block
							       : t->shared_per_block;
}

bool ap__gemm_cfg_valid(const gemm_plan *p, const gemm_cfg *c, const ap_target_info *t)
{
	unsigned nt = ap__gemm_threads_of(p, c);

	if (c->stages < 1 || nt < 32 || nt > ap_block_cap(t) + (c->tma >= 2 ? t->ws_threads : 0) || nt % 32)
		return false;
	if (c->tma == 3 && !ap__gemm_ws_copies_fit(p, c, t))
		return false;
	/* split-K: clusters exist from sm_90; each block sums an equal share of
	 * the accumulators; each slice has at least two K tiles */
	if (c->splitk > 1 && ((t->gpu && t->arch < 90) || ((int64_t)c->bm * c->bn / nt) % c->splitk ||
			      (p->K + c->bk - 1) / c->bk < 2 * c->splitk))
		return false;
	if (ap__gemm_smem_bytes(p, c, t) > smem_limit(t))
		return false;
	if ((c->tma == 1 || c->tma == 2) && !ap__gemm_tma_fits(p, c))
		return false;
	if (p->wg) {
		/* a warpgroup's tile: m64 rows per wgmma, N a multiple of 8 up to
		 * 256, at most 128 accumulators a thread */
		int wtm = c->bm / c->tm, wtn = c->bn / c->tn;

		return c->bm % c->tm == 0 && c->bn % c->tn == 0 && wtm % 64 == 0 && wtn % 8 == 0 && wtn <= 256 &&
		       c->bk % ap_kir_wgmma_k(ap__gemm_wgmma_kind(p)) == 0 && wtm / 64 * (wtn / 8) * 4 <= 128;
	}
	if (p->tc) {
		int ks = p->mma == AP_KIR_MMA_TF32_1688 ? 8 : 16;
		int wtm = c->bm / c->tm, wtn = c->bn / c->tn;

		return c->bm % c->tm == 0 && c->bn % c->tn == 0 && wtm % 16 == 0 && wtn % 8 == 0 &&
		       c->bk % ks == 0 && wtm / 16 * (wtn / 8) <= 32;
	}
	return c->bm % c->tm == 0 && c->bn % c->tn == 0 && c->tm * c->tn <= 64;
}

/* Values a thread keeps live across the main loop, roughly: its share of
 * the accumulator, plus twice its share of each register-staged operand
 * tile (the value, and the index arithmetic of a gathered or computed
 * element).  Operands cp.async copies cost nothing here. */
static int64_t live_values(const gemm_plan *p, const gemm_cfg *c, const ap_target_info *t)
{
	int64_t nt = ap__gemm_threads_of(p, c), v;

	/* warp specialised: the consumers hold the accumulators; with a
	 * copying producer (tma=3) its registers are its own
	 * (ap__gemm_ws_copies_fit) */
	if (c->tma >= 2)
		return (int64_t)c->bm * c->bn / (nt - 128);
	v = (int64_t)c->bm * c->bn / nt;
	for (int role = 0; role < 2; role++) {
		stage_mode mode;

		if (ap__gemm_copy_mode(p, role, c, t, &mode) == 0)
			v += 2 * ((int64_t)(role ? c->bn : c->bm) * c->bk + nt - 1) / nt;
	}
	return v;
}

/* What the default rule lets a thread keep live (measured with ptxas on
 * the models: about 64 such values stay under 255 registers without
 * spilling, with the fragments and addresses beside them). */
#define LIVE_BUDGET 64

/* The same for a wgmma tile's consumer threads (no A / B fragments in
 * registers: the operands are read from shared memory): 128 accumulators
 * a thread -- the 128 x 256 tile of two consumer warpgroups, each an
 * m64n256 -- compile at 154 registers for sm_90a without spills under
 * 384 threads (ptxas; check_hostcheck ws_gemm_large_tile). */
#define WG_LIVE_BUDGET 128

static int64_t live_budget(const gemm_plan *p)
{
	return p->wg ? WG_LIVE_BUDGET : LIVE_BUDGET;
}

/* Output tiles of c over every batch (the grid before split-K). */
static int64_t tiles_of(const gemm_plan *p, const gemm_cfg *c)
{
	return p->tb * ((p->Mr + c->bm - 1) / c->bm) * ((p->N + c->bn - 1) / c->bn);
}

/* The analysis (ap__gemm_analyze), kept for the binding. */
static int gm_bind(const ap_mgraph *m, const ap_target_info *t, void **an, char *why, size_t cap)
{
	gemm_plan *p = malloc(sizeof(*p));
	int rc;

	if (!p)
		return AP_ENOMEM;
	rc = ap__gemm_analyze(m, t, p, why, cap);
	if (rc <= 0) {
		free(p);
		return rc;
	}
	*an = p;
	return 1;
}

static void gm_unbind(void *an)
{
	ap__gemm_plan_clear(an);
	free(an);
}

static void knob(ap_knob *kb, const char *name, const int *vals, int n)
{
	kb->name = name;
	kb->n = n;
	memcpy(kb->values, vals, (size_t)n * sizeof(int));
}

/* The library's call for the product (library.h), from the plan: 1 with
 * *lib filled, 0 where cuBLASLt cannot compute it (or on the host),
 * AP_ENOMEM.  A folded batch (B without batch dims) is one product of Mr
 * rows when A's rows are linear; otherwise each operand's batch dims
 * collapse into one stride or the library is not offered. */
static int lib_call(const ap_mgraph *m, const ap_target_info *t, const gemm_plan *p, ap_kir_library *lib)
{
	ap_lib_gemm gm;
	char why[160];

	if (p->conv || !t->gpu)
		return 0;
	memset(&gm, 0, sizeof(gm));
	gm.node = p->node;
	gm.y = p->y;
	gm.in_t = p->in_t;
	gm.batch = p->tb;
	gm.M = p->Mr;
	gm.N = p->N;
	gm.K = p->K;
	for (int r = 0; r < 2; r++) {
		const gemm_opnd *o = r ? &p->b : &p->a;
		ap_lib_operand *lo = r ? &gm.b : &gm.a;
		int64_t s = -1, inner = 1;

		lo->plain = o->plain && !o->staged && !o->composite && !o->gather;
		lo->leaf = o->leaf;
		lo->s_base = o->s_base;
		lo->s_outer = o->s_outer;
		lo->s_k = o->s_k;
		lo->batch_ok = !p->fold || r == 1 || p->a_linear;
		for (int d = p->nb - 1; d >= 0 && !p->fold && lo->batch_ok; d--) {
			int64_t sd = o->batch[d].n ? o->batch[d].s[0] : 0;

			if (p->bdims[d] == 1)
				continue;
			if (o->batch[d].n > 1 || (s >= 0 && sd != s * inner))
				lo->batch_ok = false;
			if (s < 0)
				s = sd;
			inner *= p->bdims[d];
		}
		lo->s_batch = s < 0 ? 0 : s;
	}
	return ap__library_express(m, t, &gm, lib, why, sizeof(why));
}

static int gm_space(const ap_bound *b, ap_space *sp)
{
	/* bk[tc]: one array, indexed (a choice between two arrays by ?: reads
	 * as an overflow to GCC's object-size sanitizer) */
	static const int tiles[] = {16, 32, 64, 128, 256}, bk[2][3] = {{8, 16, 32}, {16, 32, 64}};
	static const int thr[] = {1, 2, 4, 8}, warps[] = {1, 2, 4}, st_async[] = {2, 3, 4, 5}, st_sync[] = {1, 2};
	const gemm_plan *p = b->an;
	const ap_target_info *t = b->t;
	bool tc;

	int nm, nn, nk = 3, rc;

	tc = p->tc;
	/* 256-row or -column tiles on tensor cores only (128 x 256 and
	 * 256 x 128 with 16 warps: a SIMT thread's register tile caps the
	 * SIMT block at 128) */
	nm = nn = tc ? 5 : 4;
	/* no tile beyond the next power of two of the problem (at least 16;
	 * wgmma: 64 rows, its instruction's) */
	while (nm > (p->wg ? 3 : 1) && tiles[nm - 2] >= p->Mr)
		nm--;
	while (nn > 1 && tiles[nn - 2] >= p->N)
		nn--;
	while (nk > 1 && bk[tc][nk - 2] >= p->K)
		nk--;
	sp->n = 6;
	knob(&sp->knobs[K_BM], "bm", tiles, nm);
	knob(&sp->knobs[K_BN], "bn", tiles, nn);
	knob(&sp->knobs[K_BK], "bk", bk[tc], nk);
	knob(&sp->knobs[K_TM], p->wg ? "wgm" : tc ? "wm" : "tm", tc ? warps : thr, tc ? 3 : 4);
	knob(&sp->knobs[K_TN], p->wg ? "wgn" : tc ? "wn" : "tn", tc ? warps : thr, tc ? 3 : 4);
	if (t->gpu && t->arch >= 80)
		knob(&sp->knobs[K_STAGES], "stages", st_async, 4);
	else
		knob(&sp->knobs[K_STAGES], "stages", st_sync, 2);
	{
		int vals[4], n = splitk_values(p, t, vals);

		if (n > 1) {
			sp->n = 7;
			knob(&sp->knobs[K_SPLITK], "splitk", vals, n);
		}
	}
	/* lib: cuBLASLt computes the product instead (library.h), where it
	 * can; the knob comes after splitk, which is then always listed */
	{
		ap_kir_library lib;
		static const int lib_vals[] = {0, 1}, one[] = {1};

		rc = lib_call(b->m, t, p, &lib);
		if (rc < 0)
			return rc;
		if (rc == 1) {
			if (sp->n == 6) {
				knob(&sp->knobs[K_SPLITK], "splitk", one, 1);
				sp->knobs[K_SPLITK].late = true;
			}
			sp->n = 8;
			knob(&sp->knobs[K_LIB], "lib", lib_vals, 2);
			sp->knobs[K_LIB].late = true;   /* 0 first: Apollo's kernel */
		}
	}
	/* tma: how wgmma's tiles are filled (gemm_tma.c) -- 0 cp.async by
	 * every thread; where the operands are tensor maps, 1 TMA (the phase
	 * form) and 2 TMA from a producer warpgroup; 3 a producer warpgroup
	 * copying by cp.async and its registers (any operands: convolutions'
	 * gathers, prologues).  After lib, with splitk and lib listed (lib=0
	 * only where the library cannot).  A request asking for the new forms
	 * (ap_target_info.tma) gets their space, and no split-K, which they
	 * do not combine with */
	if (p->wg) {
		static const int tma_vals[] = {0, 1, 2, 3}, newest[] = {2, 1, 3}, cp_vals[] = {0, 3},
				 cp_newest[] = {3, 0}, zero[] = {0}, one[] = {1};
		bool maps = ap__gemm_tma_operands(p);

		if (sp->n == 6 || t->tma) {
			knob(&sp->knobs[K_SPLITK], "splitk", one, 1);
			sp->knobs[K_SPLITK].late = sp->n == 6;
		}
		if (sp->n < 8) {
			knob(&sp->knobs[K_LIB], "lib", zero, 1);
			sp->knobs[K_LIB].late = true;
		}
		sp->n = 9;
		if (t->tma)
			knob(&sp->knobs[K_TMA], "tma", maps ? newest : cp_newest, maps ? 3 : 2);
		else
			knob(&sp->knobs[K_TMA], "tma", maps ? tma_vals : cp_vals, maps ? 4 : 2);
		/* 0 first: the cp.async form; a request asking for the new forms
		 * (which has records of its own: ap_tune_signature's "|tma") the
		 * warp-specialised TMA form first, then the phase form, then the
		 * copying producer; without maps the copying producer, then the
		 * cp.async form where it does not fit (gemm_tma.c) */
		sp->knobs[K_TMA].late = true;
	}
	return 0;
}


static int traffic_of(const ap_bound *b, const ap_sched *s, ap_traffic *out);

/* wgmma's default tile (sm_90a): CUTLASS's Hopper shape, a 128 x 128
 * tile of two warpgroups of 64 x 128 (64 accumulators a thread), K tiles
 * of 128 bytes (64 16-bit elements, 32 TF32: the widest swizzle's row)
 * -- each smaller where the problem is (64 rows, a power of two of at
 * least 16 columns, K tiles of 16 or 32); the cost model's stages. */
static gemm_cfg wg_default(const gemm_plan *p, int stages)
{
	int bk = 128 / (int)ap_dtype_size(p->in_t);
	gemm_cfg c = {p->Mr > 64 ? 128 : 64, 128, p->K >= bk ? bk : p->K > 16 ? 32 : 16, 1, 1,
		      stages < 2 ? 2 : stages, 1, 0};

	while (c.bn > 16 && c.bn / 2 >= p->N)
		c.bn /= 2;
	c.tm = c.bm / 64;
	return c;
}

/* Default: the tile from the cost model, the rest by rule. */
static int gm_choose(const ap_bound *b, const ap_space *sp, ap_sched *s)
{
	const gemm_plan *p = b->an;
	const ap_target_info *t = b->t;
	ap_cost_gemm_tile tile;
	gemm_cfg c;
	int rc;

	ap_cost_gemm_default(t, p->tb, p->Mr, p->N, p->K, ap_dtype_size(p->in_t), p->tc, &tile);
	c = (gemm_cfg){tile.bm, tile.bn, tile.bk, tile.tm, tile.tn, tile.stages, 1, 0};
	if (p->wg)
		c = wg_default(p, tile.stages);
	/* shrink what the target cannot hold */
	while (!ap__gemm_cfg_valid(p, &c, t) && c.stages > 1)
		c.stages--;
	while (!ap__gemm_cfg_valid(p, &c, t) && c.bk > (p->tc ? 16 : 8))
		c.bk /= 2;
	/* register pressure: more warps (tensor cores, up to 8) while the
	 * warp tile allows, then a shorter K tile (a 128 x 128 tile: 2 x 4
	 * warps of 64 x 32, where the 2 x 2 the rule gives held twice the
	 * accumulators the budget allows) */
	/* wgmma: a register-staged prologue's share of the tile shrinks with
	 * the K tile (the warpgroups stay: their tile is the instruction's) */
	while (p->wg && live_values(p, &c, t) > LIVE_BUDGET && c.bk > 16)
		c.bk /= 2;
	while (p->tc && !p->wg && live_values(p, &c, t) > LIVE_BUDGET) {
		gemm_cfg d = c;

		if (c.bn / c.tn >= 16 && c.tm * c.tn < 8 && c.tn < 4)
			d.tn *= 2;   /* N first: a warp's n8 tiles cost one ldmatrix .x2 each, its m16 tiles one .x4 */
		else if (c.bm / c.tm >= 32 && c.tm * c.tn < 8 && c.tm < 4)
			d.tm *= 2;
		else if (c.bk > 16)
			d.bk /= 2;
		else
			break;
		if (!ap__gemm_cfg_valid(p, &d, t))
			break;
		c = d;
	}
	s->v[K_BM] = c.bm;
	s->v[K_BN] = c.bn;
	s->v[K_BK] = c.bk;
	s->v[K_TM] = c.tm;
	s->v[K_TN] = c.tn;
	s->v[K_STAGES] = c.stages;
	/* split-K on GPUs when the tiles leave most SMs idle: the most blocks
	 * per tile that still fit the SMs, each slice at least 4 K tiles */
	if (sp->n > K_SPLITK) {
		int64_t tiles = tiles_of(p, &c);
		int64_t kt = (p->K + c.bk - 1) / c.bk;

		s->v[K_SPLITK] = 1;
		for (int i = 0; t->gpu && tiles * 2 <= (int64_t)t->sm_count && i < sp->knobs[K_SPLITK].n; i++) {
			gemm_cfg d = c;

			d.splitk = sp->knobs[K_SPLITK].values[i];
			if (tiles * d.splitk <= (int64_t)t->sm_count && kt >= 4 * d.splitk && ap__gemm_cfg_valid(p, &d, t))
				s->v[K_SPLITK] = d.splitk;
		}
	}
	/* lib: the library where the cost model expects it to be faster than
	 * this kernel; where the model calls this tile a spill (INFINITY) the
	 * rule keeps the kernel and leaves the choice to a search, which can
	 * walk the tiles from here (a measured tuning record overrides both) */
	/* tma: where the request asks for it (ap_target_info.tma: split-K
	 * off) the first of the space's forms the tile fits -- the warp-
	 * specialised one (2) unless its producer warpgroup's threads or the
	 * empty barriers do not fit, then the phase form (1); else 0 until a
	 * device run has validated them (docs/limits.md): only a tuning record
	 * chooses them then */
	if (sp->n > K_TMA) {
		s->v[K_TMA] = sp->knobs[K_TMA].values[0];
		for (int i = 0; i < sp->knobs[K_TMA].n; i++) {
			gemm_cfg d = c;

			d.tma = sp->knobs[K_TMA].values[i];
			/* the producer warpgroup past the block's thread cap (256
			 * unless the request says more): the tile of one consumer
			 * warpgroup (64 x 128 for the 128 x 128 of two) */
			if (d.tma >= 2 && !ap__gemm_cfg_valid(p, &d, t) && d.tm * d.tn > 1) {
				gemm_cfg e = d;

				e.bm = d.bm / d.tm;
				e.bn = d.bn / d.tn;
				e.tm = e.tn = 1;
				if (ap__gemm_cfg_valid(p, &e, t) && live_values(p, &e, t) <= LIVE_BUDGET)
					d = e;
			}
			/* warp specialised, a large product: two consumer
			 * warpgroups of 64 x 256 (CUTLASS's and cuBLAS's Hopper
			 * tile: a third fewer L2 re-reads than 128 x 128, an
			 * m64n256k16 a K step) where the tiles fill at least half
			 * the SMs; the search, which prices the idle SMs against
			 * the L2 traffic saved, can go back to smaller tiles */
			if (d.tma >= 2 && d.bm == 128 && d.tm == 2 && d.bn == 128 && d.tn == 1 && d.splitk == 1) {
				gemm_cfg e = d;

				e.bn = 256;
				if (2 * tiles_of(p, &e) >= (int64_t)t->sm_count &&
				    ap__gemm_cfg_valid(p, &e, t) && live_values(p, &e, t) <= WG_LIVE_BUDGET)
					d = e;
			}
			/* the TMA and producer forms' blocks are persistent, one
			 * an SM: shared memory no second block could use goes to
			 * stages (the largest of the knob's that fits; CUTLASS's
			 * carve-out rule) -- a consumer holds two stages (one
			 * K tile's wgmma in flight, the next issued), so with
			 * three the producer is one K tile ahead, with four two */
			if (d.tma >= 1 && ap__gemm_cfg_valid(p, &d, t)) {
				const ap_knob *st = &sp->knobs[K_STAGES];

				for (int j = st->n - 1; j >= 0 && st->values[j] > d.stages; j--) {
					gemm_cfg e = d;

					e.stages = st->values[j];
					if (ap__gemm_cfg_valid(p, &e, t)) {
						d = e;
						break;
					}
				}
			}
			if (ap__gemm_cfg_valid(p, &d, t)) {
				s->v[K_TMA] = d.tma;
				s->v[K_BM] = d.bm;
				s->v[K_BN] = d.bn;
				s->v[K_TM] = d.tm;
				s->v[K_TN] = d.tn;
				s->v[K_STAGES] = d.stages;
				break;
			}
		}
	}
	if (sp->n > K_LIB && sp->knobs[K_LIB].n > 1) {
		ap_traffic own, lib;

		s->v[K_LIB] = 0;
		if ((rc = traffic_of(b, s, &own)) < 0)
			return rc;
		s->v[K_LIB] = 1;
		if ((rc = traffic_of(b, s, &lib)) < 0)
			return rc;
		s->v[K_LIB] = isfinite(ap_cost_schedule_us(&own, t)) &&
			      ap_cost_schedule_us(&lib, t) < ap_cost_schedule_us(&own, t);
	}
	return 0;
}

/* lib=1 is one point of the space: the default rule's other knobs (the
 * kernel a runtime without the library runs), so that the tuner's
 * candidates hold one library point beside Apollo's tiles.  1, 0 or
 * AP_ENOMEM. */
static int lib_point(const ap_bound *b, const ap_sched *s)
{
	ap_space sp;
	ap_sched d = *s;
	int rc;

	if ((rc = gm_space(b, &sp)) < 0 || (rc = gm_choose(b, &sp, &d)) < 0)
		return rc;
	for (int i = 0; i < s->n; i++)
		if (i != K_LIB && d.v[i] != s->v[i])
			return 0;
	return 1;
}

_Static_assert(sizeof(gemm_res) <= AP_PLAN_BYTES, "the gemm plan fits ap_plan");

/* The plan of configuration s: its tile, each operand's staging, threads
 * and shared bytes, whether the target holds it (no verdict on lib=1's
 * other knobs: gm_resolve's). */
static void plan_of(const ap_bound *b, const ap_sched *s, ap_plan *out)
{
	const gemm_plan *p = b->an;
	gemm_res *r = (gemm_res *)out->x;

	memset(out, 0, sizeof(*out));
	out->s = *s;
	r->c = ap__gemm_cfg_of(s);
	for (int role = 0; role < 2; role++) {
		r->w[role] = ap__gemm_copy_mode(p, role, &r->c, b->t, &r->mode[role]);
		r->sw[role] = ap__gemm_wg_swizzle(p, &r->c, role);
	}
	r->threads = ap__gemm_threads_of(p, &r->c);
	r->smem = ap__gemm_smem_bytes(p, &r->c, b->t);
	r->fits = ap__gemm_cfg_valid(p, &r->c, b->t);
	r->lib = s->n > K_LIB && s->v[K_LIB];
}

/* plan_of; it fits when the target holds it, and lib=1 is one point of
 * the space (lib_point). */
static int gm_resolve(const ap_bound *b, const ap_sched *s, ap_plan *out)
{
	const gemm_res *r = (const gemm_res *)out->x;

	plan_of(b, s, out);
	if (!r->fits)
		return 0;
	return r->lib ? lib_point(b, s) : 1;
}

static int gm_traffic(const ap_bound *b, const ap_plan *pl, ap_traffic *out);

/* gm_traffic of configuration s, its plan made here (plan_of: the default
 * rule and the library's call price configurations without lib_point's
 * verdict, which runs the rule). */
static int traffic_of(const ap_bound *b, const ap_sched *s, ap_traffic *out)
{
	ap_plan pl;

	plan_of(b, s, &pl);
	return gm_traffic(b, &pl, out);
}

/* lib=1: the library's call attached to kernel k (built as for lib=0),
 * its params bound and both modelled times noted (--explain).  0 or
 * AP_ENOMEM; a call that cannot be bound (an operand baked into the
 * kernel) is left out: the kernel runs. */
int ap__gemm_attach_library(const ap_bound *b, const ap_sched *s, ap_kir_kernel *k)
{
	const gemm_plan *p = b->an;
	const ap_mgraph *m = b->m;
	const ap_target_info *t = b->t;
	ap_kir_library lib;
	ap_traffic tr;
	ap_sched own = *s;
	int rc = lib_call(m, t, p, &lib), d_t, bias_t, c_t;
	ap_lib_gemm gm = {.node = p->node, .y = p->y, .in_t = p->in_t, .N = p->N};

	if (rc <= 0)
		return rc;
	ap__library_tensors(m, &gm, &d_t, &bias_t, &c_t);
	if (!ap__library_bind(&lib, k, p->a.leaf, p->b.leaf, d_t, bias_t, c_t))
		return 0;
	ap__library_traffic(&lib, t, &tr);
	lib.library_us = ap_cost_schedule_us(&tr, t);
	own.v[K_LIB] = 0;
	if ((rc = traffic_of(b, &own, &tr)) < 0)
		return rc;
	lib.kernel_us = ap_cost_schedule_us(&tr, t);
	k->library = malloc(sizeof(lib));
	if (!k->library)
		return AP_ENOMEM;
	*k->library = lib;
	return 0;
}

/* ---- traffic --------------------------------------------------------------------------- */

/* Of a block's time, what its K loop of mma.sync fills between its
 * barriers: every K tile ends in __syncthreads, where the warps'
 * tensor-core work drains and the next tile's starts again -- a bubble
 * of about TC_BUBBLE_CLK cycles (the barrier's latency plus an HMMA's
 * result latency, both some 20-35 cycles on sm_80/sm_90: Abdelkhalik et
 * al., "Demystifying the Nvidia Ampere architecture through
 * microbenchmarking and instruction-level analysis", 2022; Luo et al.,
 * "Benchmarking and dissecting the Nvidia Hopper GPU architecture", 2024) which the other blocks resident on the SM fill.
 * The work between bubbles is the K tile's mma.sync of the block's
 * warps on an SM's four tensor cores, at the peak rate (t->tc_gflops or
 * tf32_gflops over the SMs at the clock shared_gbps implies: 128 bytes
 * a clock an SM): a longer K tile (bk) or larger warp tile amortises the
 * barrier (issue 25: bk 32 and 64 over 16).  The bubble stalls the whole
 * loop (copies and shared-memory reads too): ap_traffic.loop_fraction. */
#define TC_BUBBLE_CLK 50.0
static double tc_barrier_fraction(const gemm_plan *p, const gemm_cfg *c, const ap_target_info *t,
				const ap_traffic *tr)
{
	bool tf32 = p->mma == AP_KIR_MMA_TF32_1688;
	double peak = tf32 ? t->tf32_gflops : t->tc_gflops;
	double clk_ghz = t->shared_gbps / ((double)t->sm_count * 128.0);
	double per_clk = peak / ((double)t->sm_count * clk_ghz * 4.0);   /* FLOP a clock a tensor core */
	double mmas = (double)(c->bm / c->tm / 16) * (double)(c->bn / c->tn / 8) * (double)(c->bk / (tf32 ? 8 : 16));
	double work = (double)(c->tm * c->tn) / 4.0 * mmas * (tf32 ? 2048.0 : 4096.0) / per_clk;

	if (p->wg)   /* the block's products on the SM's four tensor cores */
		work = 2.0 * c->bm * c->bn * c->bk / (4.0 * per_clk);
	unsigned per_sm = ap_cost_blocks_per_sm_regs(t, tr->threads, tr->shared_bytes, tr->regs);

	if (peak <= 0 || clk_ghz <= 0 || per_sm == 0)
		return 1;
	return work / (work + TC_BUBBLE_CLK / per_sm);
}

static int gm_traffic(const ap_bound *b, const ap_plan *pl, ap_traffic *out)
{
	const gemm_plan *p = b->an;
	const gemm_res *r = (const gemm_res *)pl->x;
	const gemm_cfg *c = &r->c;
	const ap_target_info *t = b->t;
	int rc;

	memset(out, 0, sizeof(*out));
	if (ap__lower_inline_traffic(b->m, out) < 0)
		return AP_ENOMEM;
	if (r->lib) {   /* the library's call (library.h) */
		ap_kir_library lib;

		rc = lib_call(b->m, t, p, &lib);
		if (rc == 1)
			ap__library_traffic(&lib, t, out);
		return rc < 0 ? rc : 0;
	}
	/* the inline model counts a prologue once per multiply; tiles evaluate
	 * it once per block column (A) or block row (B) */
	out->flops = 2.0 * (double)p->tb * (double)p->Mr * (double)p->N * (double)p->K;
	/* tma=2, 3: the producer warpgroup issues a stage's loads and no
	 * arithmetic -- the model counts the consumers' threads (the blocks
	 * are persistent, one an SM at most, so its registers do not change
	 * residency) */
	out->threads = r->threads - (c->tma >= 2 ? 128u : 0u);
	out->blocks = ap_grid_for(tiles_of(p, c), 1) *
		      (unsigned)c->splitk;
	out->shared_bytes = (unsigned)r->smem;
	out->tensor_cores = p->tc;
	out->tf32 = p->tc && p->mma == AP_KIR_MMA_TF32_1688;   /* half float16's rate on sm_80 and sm_90 */
	out->unvalidated = c->tma && !t->tma;
	{
		/* what only the tile changes: every block column re-reads A's rows,
		 * every block row B's columns (from L2); a SIMT thread reads tm + tn
		 * values from shared memory per tm x tn multiply-adds, a warp of
		 * tensor cores wtm + wtn per wtm x wtn; registers from the live
		 * values of the default rule's estimate, plus addresses */
		double es = (double)ap_dtype_size(p->in_t), macs = out->flops / 2;
		double rows = (double)((p->Mr + c->bm - 1) / c->bm), cols = (double)((p->N + c->bn - 1) / c->bn);
		double fm = p->tc ? (double)c->bm / c->tm : c->tm, fn = p->tc ? (double)c->bn / c->tn : c->tn;
		int64_t live = live_values(p, c, t) + 32;

		out->tile_bytes = es * (double)p->tb * (double)p->K * ((double)p->Mr * cols + (double)p->N * rows);
		out->shared_read = es * macs * (1.0 / fm + 1.0 / fn);
		/* a pipeline keeps the stages ahead of the one computed on in
		 * flight (cp.async groups, TMA boxes; no more than the block's
		 * K tiles): DRAM's latency covered without many resident
		 * threads (cost.h inflight_bytes) */
		if (t->gpu && c->stages > 1) {
			int64_t kt = (p->K / c->splitk + c->bk - 1) / c->bk, ahead = c->stages - 1 < kt ? c->stages - 1 : kt;

			out->inflight_bytes = (double)ahead * (double)(c->bm + c->bn) * (double)c->bk * es;
		}
		/* split-K: each block writes its partial tile, and the cluster reads
		 * them all back once */
		if (c->splitk > 1)
			out->shared_read += 2.0 * (double)out->blocks * c->bm * c->bn * (double)ap_dtype_size(p->acc_t);
		/* past the default rule's budget ptxas spills (measured on the
		 * models): more than a thread may hold */
		out->regs = t->gpu && live - 32 > live_budget(p) ? 256u : (unsigned)(live > 255 ? 255 : live);
		/* the host's C compiler vectorises a thread's register tile,
		 * roughly: the vector unit is busy from 16 accumulators on (the
		 * tuner does not search host GEMMs: host_rule_only) */
		if (!t->gpu && !p->tc)
			out->alu_fraction = fmin(1.0, c->tm * c->tn / 16.0);

		/* split-K: a block's pipeline fills (stages - 1 K tiles copied
		 * before its first product) and its cluster's reduction and
		 * barrier (about one K tile more) stand outside the overlapped
		 * main loop: it fills ktl / (ktl + stages) of a block's time over
		 * its ktl K tiles.  Idle SMs outweigh that many times over; the
		 * last wave's quantisation of a grid of many waves never does
		 * (TF32 4096^3 was split 8 ways without it). */
		if (c->splitk > 1) {
			double ktl = ceil(ceil((double)p->K / c->bk) / c->splitk);

			out->loop_fraction = ktl / (ktl + c->stages);
		}
		if (t->gpu && p->tc)
			out->loop_fraction = (out->loop_fraction > 0 ? out->loop_fraction : 1.0) *
					     tc_barrier_fraction(p, c, t, out);
	}
	return 0;
}

const ap_emitter ap_emitter_gemm = {
	"gemm", gm_bind, gm_unbind, gm_space, gm_choose, ap__gemm_emit, gm_traffic, gm_resolve, true, NULL,
};
