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
 * copy_mode; any other operand -- a prologue of several tensors, such as
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
 */
#include "emitters.h"
#include "library.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- analysis: the operands and the epilogue ----------------------------------- */


/* What a GEMM keeps of one batch dim of a plain operand: its factors. */
#define BATCH_FACTORS 4

typedef struct bdim {
	int n;                          /* 0: broadcast (stride 0) */
	int64_t e[BATCH_FACTORS], s[BATCH_FACTORS];
} bdim;

typedef struct gemm_opnd {
	int t;                          /* the MatMul input */
	bool plain;                     /* a buffer read through views / transposes */
	int leaf;                       /* plain: the buffer's tensor */
	int64_t s_outer, s_k;           /* plain: strides of the outer (M or N) and K coordinates */
	bool composite;                 /* plain: the outer or K dim is mixed-radix (fo, fk) */
	bool cvec;                      /* composite, yet copied `vec` elements at a time
					   along the innermost factor of its contiguous
					   coordinate (composite_vector) */
	bdim fo, fk;                    /* plain, composite: their factors */
	int64_t s_base;                 /* plain: element of index 0 (a slice's start) */
	bdim batch[AP_MAX_RANK];        /* plain: per output batch dim */
	bool k_fast;                    /* K is the contiguous coordinate (plain), or assumed so */
	int vec;                        /* plain: elements per cp.async along the contiguous
					   coordinate (0: none possible) */
	bool gather;                    /* convolution, not plain: the im2col element (or a
					   weight through transposes) is one element of `leaf`
					   at `gv`, copied one by one (4- and 8-byte types; a
					   16-bit element by the 4-byte pair around it:
					   copy_mode) */
	ap_sview gv;                       /* gather: the convolution input as a view of leaf */
	bool staged;                    /* plain or gather: the operand is computed element
					   for element from the view of `leaf` by unary ops
					   (ap_sview_of_unary: a Cast of the float32 inputs a
					   converted graph keeps, a scale): cp.async copies
					   leaf's elements, the operand is computed from them
					   into the tile (copy_mode); vec, k_fast and the
					   strides are leaf's */
	bool casts_only;                /* staged: those ops are all Casts (0 stays 0) */
	int src_es;                     /* staged: bytes of leaf's elements */
} gemm_opnd;

typedef struct gemm_plan {
	int node, y;
	ap_dtype in_t, acc_t;
	int nb;                         /* Y's batch dims */
	int64_t bdims[AP_MAX_RANK], batch, M, N, K;
	bool fold;                      /* B has no batch dims: the batch dims are
					   folded into the rows, Mr = batch * M */
	int64_t Mr, tb;                 /* rows of the product; batches of tiles */
	bool a_linear;                  /* folded, and A's rows are one stride apart
					   across batches too: offset row * s_outer */
	gemm_opnd a, b;                 /* b is described as [N][K] */
	bool tc;                        /* tensor cores */
	ap_kir_mma_kind mma;
	ap_emap *maps;                  /* per tensor of m->g */
	/* convolution as an implicit GEMM: rows (n, output position), columns
	 * the output channels of a group, K (input channel of the group,
	 * kernel position); tile batches are the groups */
	bool conv, convt;               /* Conv / ConvTranspose */
	int ns;                         /* spatial dims */
	int x, w, bias;                 /* the node's inputs (bias -1 when none) */
	int64_t C, groups, Cg, Mg, ohw, kk;
	int64_t D[3], O[3], KS[3], st[3], pd[3], dl[3];
	bool a_1x1;                     /* Conv 1x1, stride 1, no padding: A is
					   X itself, rows contiguous per image */
} gemm_plan;

static void plan_clear(gemm_plan *p)
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
 * bfloat16 on sm_80 and later; float32 with allow_tf32), and the
 * mma.sync shape for it. */
static void choose_mma(gemm_plan *p, const ap_target_info *t)
{
	p->tc = t->gpu && t->arch >= 80 &&
		(p->in_t == AP_DT_F16 || p->in_t == AP_DT_BF16 || (p->in_t == AP_DT_F32 && t->allow_tf32));
	p->mma = p->in_t == AP_DT_F16 ? AP_KIR_MMA_F16_16816
		 : p->in_t == AP_DT_BF16 ? AP_KIR_MMA_BF16_16816 : AP_KIR_MMA_TF32_1688;
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
	 * elements, and a thread keeps one row for a whole tile (issue_async),
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
 * pair holding it, see copy_mode), the padding zero-filled by the copy's
 * source size.  A Cast of the float32 input of a converted graph is
 * gathered in its own type and converted into the tile (staged,
 * copy_mode): only casts, so the zero padding stays zero, and elements of
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
		plan_clear(p);
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
static int analyze(const ap_mgraph *m, const ap_target_info *t, gemm_plan *p, char *why, size_t cap)
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
	if (!ap_kir_is_float_type(at->dtype) || at->dtype != bt->dtype || yt->dtype != at->dtype) {
		snprintf(why, cap, "operands of type %s", ap_dtype_name(at->dtype));
		return false;
	}
	p->in_t = at->dtype;
	p->acc_t = at->dtype == AP_DT_F64 ? AP_DT_F64 : AP_DT_F32;
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
		plan_clear(p);
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

/* SIMT order; tensor cores: tm = wm, tn = wn.  The space has K_SPLITK
 * only where split-K can be built and has more than one value (see
 * splitk_values), so other schedules read as they always did. */
enum { K_BM, K_BN, K_BK, K_TM, K_TN, K_STAGES, K_SPLITK, K_LIB };

typedef struct gemm_cfg {
	int bm, bn, bk, tm, tn, stages;   /* tensor cores: tm, tn = warps along M, N */
	int splitk;                       /* blocks (a thread-block cluster) sharing a tile's K */
} gemm_cfg;

static gemm_cfg cfg_of(const ap_sched *s)
{
	gemm_cfg c = {s->v[K_BM], s->v[K_BN], s->v[K_BK], s->v[K_TM], s->v[K_TN], s->v[K_STAGES],
		      s->n > K_SPLITK ? s->v[K_SPLITK] : 1};

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
 * consecutive rows over the banks. */
static int pad_of(ap_dtype t)
{
	return (int)(16 / ap_dtype_size(t));
}

/* Shared tile layouts: for each operand, whether its tile is kept with K
 * contiguous ([outer][k]) -- else k-major ([k][outer]). */
static void tile_layouts(const gemm_plan *p, bool *a_rowk, bool *b_rowk)
{
	if (!p->tc) {
		*a_rowk = false;   /* SIMT: both k-major */
		*b_rowk = false;
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

/* How an operand copied by cp.async reaches its tile (copy_mode). */
typedef enum stage_mode {
	STAGE_TILE,                     /* straight into the tile's stages (or registers) */
	STAGE_PAIRS,                    /* pair-staged: 4-byte pairs, then extracted */
	STAGE_COMPUTE,                  /* the source's elements, then the operand computed */
} stage_mode;

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
 *     (extract_tile); the same pipeline as the pairs, for the source's
 *     shared memory.
 * Other operands computed on the way (a prologue of several tensors: a
 * LayerNorm's normalise) go through registers, as do all operands on GPUs
 * without cp.async (before sm_80). */
static int copy_mode(const gemm_plan *p, int role, const gemm_cfg *c, const ap_target_info *t, stage_mode *mode)
{
	const gemm_opnd *op = role ? &p->b : &p->a;
	bool ar, br, rowk;
	int ext;

	*mode = STAGE_TILE;
	if ((t->gpu && t->arch < 80) || (!op->plain && !op->gather))
		return 0;
	if (op->staged) {
		int w;

		ext = op->k_fast ? c->bk : (role ? c->bn : c->bm);
		w = op->vec > 0 && (!op->composite || op->cvec) && !op->gather && ext % op->vec == 0 ? op->vec : 1;
		if (w * op->src_es < 4)
			return 0;
		*mode = STAGE_COMPUTE;
		return w;
	}
	tile_layouts(p, &ar, &br);
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

/* Bytes of shared memory of configuration c on t: each operand's tile
 * stages (a pair- or compute-staged operand: one tile, plus per stage its
 * staging buffer), and split-K's partial accumulator tile. */
static size_t smem_bytes(const gemm_plan *p, const gemm_cfg *c, const ap_target_info *t)
{
	bool ar, br;
	stage_mode ma, mb;
	size_t es = ap_dtype_size(p->in_t), pad = (size_t)pad_of(p->in_t), S = (size_t)c->stages;
	size_t a, b;

	tile_layouts(p, &ar, &br);
	copy_mode(p, 0, c, t, &ma);
	copy_mode(p, 1, c, t, &mb);
	a = ar ? (size_t)c->bm * ((size_t)c->bk + pad) : (size_t)c->bk * ((size_t)c->bm + pad);
	b = br ? (size_t)c->bn * ((size_t)c->bk + pad) : (size_t)c->bk * ((size_t)c->bn + pad);
	a *= es * (ma != STAGE_TILE ? 1 : S);
	b *= es * (mb != STAGE_TILE ? 1 : S);
	a += staging_bytes(ma, &p->a, es, S * (size_t)c->bm * (size_t)c->bk);
	b += staging_bytes(mb, &p->b, es, S * (size_t)c->bn * (size_t)c->bk);
	/* split-K: every block's partial accumulator tile, for the cluster */
	if (c->splitk > 1)
		b += 16 + (size_t)c->bm * (size_t)c->bn * ap_dtype_size(p->acc_t);
	return a + b;
}

static unsigned threads_of(const gemm_plan *p, const gemm_cfg *c)
{
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

static bool cfg_valid(const gemm_plan *p, const gemm_cfg *c, const ap_target_info *t)
{
	unsigned nt = threads_of(p, c);

	if (c->stages < 1 || nt < 32 || nt > ap_block_cap(t) || nt % 32)
		return false;
	/* split-K: clusters exist from sm_90; each block sums an equal share of
	 * the accumulators; each slice has at least two K tiles */
	if (c->splitk > 1 && ((t->gpu && t->arch < 90) || ((int64_t)c->bm * c->bn / nt) % c->splitk ||
			      (p->K + c->bk - 1) / c->bk < 2 * c->splitk))
		return false;
	if (smem_bytes(p, c, t) > smem_limit(t))
		return false;
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
	int64_t nt = threads_of(p, c), v = (int64_t)c->bm * c->bn / nt;

	for (int role = 0; role < 2; role++) {
		stage_mode mode;

		if (copy_mode(p, role, c, t, &mode) == 0)
			v += 2 * ((int64_t)(role ? c->bn : c->bm) * c->bk + nt - 1) / nt;
	}
	return v;
}

/* What the default rule lets a thread keep live (measured with ptxas on
 * the models: about 64 such values stay under 255 registers without
 * spilling, with the fragments and addresses beside them). */
#define LIVE_BUDGET 64

static int gm_match(const ap_mgraph *m, const ap_target_info *t)
{
	gemm_plan p;
	char why[160];
	int rc = analyze(m, t, &p, why, sizeof(why));

	plan_clear(&p);
	return rc;
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

static int gm_space(const ap_mgraph *m, const ap_target_info *t, ap_space *sp)
{
	/* bk[tc]: one array, indexed (a choice between two arrays by ?: reads
	 * as an overflow to GCC's object-size sanitizer) */
	static const int tiles[] = {16, 32, 64, 128, 256}, bk[2][3] = {{8, 16, 32}, {16, 32, 64}};
	static const int thr[] = {1, 2, 4, 8}, warps[] = {1, 2, 4}, st_async[] = {2, 3, 4, 5}, st_sync[] = {1, 2};
	gemm_plan p;
	char why[160];
	bool tc;

	int nm, nn, nk = 3, rc;

	if ((rc = analyze(m, t, &p, why, sizeof(why))) < 0)
		return rc;
	tc = p.tc;
	/* 256-row or -column tiles on tensor cores only (128 x 256 and
	 * 256 x 128 with 16 warps: a SIMT thread's register tile caps the
	 * SIMT block at 128) */
	nm = nn = tc ? 5 : 4;
	/* no tile beyond the next power of two of the problem (at least 16) */
	while (nm > 1 && tiles[nm - 2] >= p.Mr)
		nm--;
	while (nn > 1 && tiles[nn - 2] >= p.N)
		nn--;
	while (nk > 1 && bk[tc][nk - 2] >= p.K)
		nk--;
	sp->n = 6;
	knob(&sp->knobs[K_BM], "bm", tiles, nm);
	knob(&sp->knobs[K_BN], "bn", tiles, nn);
	knob(&sp->knobs[K_BK], "bk", bk[tc], nk);
	knob(&sp->knobs[K_TM], tc ? "wm" : "tm", tc ? warps : thr, tc ? 3 : 4);
	knob(&sp->knobs[K_TN], tc ? "wn" : "tn", tc ? warps : thr, tc ? 3 : 4);
	if (t->gpu && t->arch >= 80)
		knob(&sp->knobs[K_STAGES], "stages", st_async, 4);
	else
		knob(&sp->knobs[K_STAGES], "stages", st_sync, 2);
	{
		int vals[4], n = splitk_values(&p, t, vals);

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

		rc = lib_call(m, t, &p, &lib);
		plan_clear(&p);
		if (rc < 0)
			return rc;
		if (rc == 1) {
			if (sp->n == 6)
				knob(&sp->knobs[K_SPLITK], "splitk", one, 1);
			sp->n = 8;
			knob(&sp->knobs[K_LIB], "lib", lib_vals, 2);
		}
	}
	return 0;
}

static int gm_traffic(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t, ap_traffic *out);

/* Default: the tile from the cost model, the rest by rule. */
static int gm_choose(const ap_mgraph *m, const ap_target_info *t, const ap_space *sp, ap_sched *s)
{
	gemm_plan p;
	char why[160];
	ap_cost_gemm_tile tile;
	gemm_cfg c;
	int rc;

	if ((rc = analyze(m, t, &p, why, sizeof(why))) <= 0)
		return rc;
	ap_cost_gemm_default(t, p.tb, p.Mr, p.N, p.K, ap_dtype_size(p.in_t), p.tc, &tile);
	c = (gemm_cfg){tile.bm, tile.bn, tile.bk, tile.tm, tile.tn, tile.stages, 1};
	/* shrink what the target cannot hold */
	while (!cfg_valid(&p, &c, t) && c.stages > 1)
		c.stages--;
	while (!cfg_valid(&p, &c, t) && c.bk > (p.tc ? 16 : 8))
		c.bk /= 2;
	/* register pressure: more warps (tensor cores, up to 8) while the
	 * warp tile allows, then a shorter K tile (a 128 x 128 tile: 2 x 4
	 * warps of 64 x 32, where the 2 x 2 the rule gives held twice the
	 * accumulators the budget allows) */
	while (p.tc && live_values(&p, &c, t) > LIVE_BUDGET) {
		gemm_cfg d = c;

		if (c.bn / c.tn >= 16 && c.tm * c.tn < 8 && c.tn < 4)
			d.tn *= 2;   /* N first: a warp's n8 tiles cost one ldmatrix .x2 each, its m16 tiles one .x4 */
		else if (c.bm / c.tm >= 32 && c.tm * c.tn < 8 && c.tm < 4)
			d.tm *= 2;
		else if (c.bk > 16)
			d.bk /= 2;
		else
			break;
		if (!cfg_valid(&p, &d, t))
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
		int64_t tiles = p.tb * ((p.Mr + c.bm - 1) / c.bm) * ((p.N + c.bn - 1) / c.bn);
		int64_t kt = (p.K + c.bk - 1) / c.bk;

		s->v[K_SPLITK] = 1;
		for (int i = 0; t->gpu && tiles * 2 <= (int64_t)t->sm_count && i < sp->knobs[K_SPLITK].n; i++) {
			gemm_cfg d = c;

			d.splitk = sp->knobs[K_SPLITK].values[i];
			if (tiles * d.splitk <= (int64_t)t->sm_count && kt >= 4 * d.splitk && cfg_valid(&p, &d, t))
				s->v[K_SPLITK] = d.splitk;
		}
	}
	plan_clear(&p);
	/* lib: the library where the cost model expects it to be faster than
	 * this kernel; where the model calls this tile a spill (INFINITY) the
	 * rule keeps the kernel and leaves the choice to a search, which can
	 * walk the tiles from here (a measured tuning record overrides both) */
	if (sp->n > K_LIB) {
		ap_traffic own, lib;

		s->v[K_LIB] = 0;
		if ((rc = gm_traffic(m, s, t, &own)) < 0)
			return rc;
		s->v[K_LIB] = 1;
		if ((rc = gm_traffic(m, s, t, &lib)) < 0)
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
static int lib_point(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t)
{
	ap_space sp;
	ap_sched d = *s;
	int rc;

	if ((rc = gm_space(m, t, &sp)) < 0 || (rc = gm_choose(m, t, &sp, &d)) < 0)
		return rc;
	for (int i = 0; i < K_LIB; i++)
		if (d.v[i] != s->v[i])
			return 0;
	return 1;
}

static int gm_valid(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t)
{
	gemm_plan p;
	char why[160];
	gemm_cfg c = cfg_of(s);
	bool ok;
	int rc;

	if ((rc = analyze(m, t, &p, why, sizeof(why))) <= 0)
		return rc;
	ok = cfg_valid(&p, &c, t);
	plan_clear(&p);
	if (ok && s->n > K_LIB && s->v[K_LIB])
		return lib_point(m, s, t);
	return ok;
}

/* ---- the kernel ---------------------------------------------------------------------- */

typedef struct gctx {
	const ap_mgraph *m;
	const ap_graph *g;
	const gemm_plan *p;
	gemm_cfg c;
	const ap_target_info *t;
	ap_vctx *v;
	ap_kir_kernel *k;
	unsigned nt;
	bool a_rowk, b_rowk;            /* shared tiles with K contiguous */
	bool a_async, b_async;          /* loaded by cp.async */
	stage_mode a_mode, b_mode;      /* copy_mode; pair- or compute-staged: a single tile
					   stage, filled from pa / pb by extract_tile */
	ap_kir_array *pa, *pb;          /* per stage: two elements a tile element (pairs), or
					   one float32 element (convert) */
	ap_kir_array *qa, *qb;          /* pair-staged: per stage, the element's place in its pair */
	int hook_leaf;                  /* compute-staged, while a tile element is computed: the
					   source buffer, whose element is hook_val */
	ap_kir_expr *hook_val;
	ap_kir_array *red;              /* split-K: the block's partial accumulators, for the cluster */
	int a_w, b_w;                   /* elements per cp.async */
	int lda, ldb;                   /* shared row lengths (elements) */
	int64_t a_stage, b_stage;       /* elements per stage */
	ap_kir_array *sa, *sb;
	ap_kir_expr *bcoord[AP_MAX_RANK]; /* Y's batch coordinates of the tile */
	ap_kir_expr *tb_index;          /* the tile's linear batch (not folded) */
	ap_kir_expr *m0, *n0;           /* the tile's first row and column */
	ap_kir_expr *tid;
	/* register-staged loads: per operand, the registers of one tile */
	int a_regs, b_regs;
	ap_kir_var **a_reg, **b_reg;
	/* the accumulator the epilogue hands out as Y */
	ap_kir_array *acc;
	ap_kir_expr *acc_index;
	/* split-K: this block's rank in its cluster, its first K tile */
	ap_kir_expr *rank, *kofs;
	bool kpred;                     /* loads check k < K (a K tile may pass the end) */
	/* the launch (set_launch): output tiles, tiles_m x tiles_n per tile
	 * batch, walked by `grid` blocks (clusters with split-K); K tiles per
	 * block */
	int tiles_m, tiles_n, ktl;
	int64_t tiles;
	unsigned grid;
	/* the thread's place (declare_threads): SIMT (ty, tx); tensor cores
	 * its lane and its warp's first row and column of the tile */
	ap_kir_expr *ty, *tx, *lane, *wm0, *wn0;
	ap_kir_array *fa, *fb;          /* operand fragments / values of one k (registers) */
	/* hoist_copies: per operand, its copies' source element and tile
	 * place for copy 0 of K tile 0, bound before the K loop (NULL: not
	 * hoisted), and what each further copy of a thread adds */
	ap_kir_expr *cp_src[2], *cp_dst[2];
	int64_t cp_dsrc[2], cp_ddst[2];
} gctx;

static ap_kir_expr *I(gctx *c, int64_t v)
{
	return ap_kir_idx(c->k, v);
}

static ap_kir_expr *row_split(gctx *c, ap_kir_expr *row, ap_kir_expr **bc)
{
	ap_kir_kernel *k = c->k;
	const gemm_plan *p = c->p;
	ap_kir_expr *rest;

	if (!p->fold) {
		for (int d = 0; d < p->nb; d++)
			bc[d] = c->bcoord[d];
		return row;
	}
	rest = ap_kir_binary(k, AP_KIR_DIV, row, I(c, p->M));
	for (int d = p->nb - 1; d >= 0; d--) {
		bc[d] = p->bdims[d] == 1 ? I(c, 0) : ap_kir_binary(k, AP_KIR_REM, rest, I(c, p->bdims[d]));
		if (d > 0)
			rest = ap_kir_binary(k, AP_KIR_DIV, rest, I(c, p->bdims[d]));
	}
	return p->M == 1 ? I(c, 0) : ap_kir_binary(k, AP_KIR_REM, row, I(c, p->M));
}

/* Index into operand `role`'s tensor for batch coordinates c->bcoord,
 * outer coordinate `o` (row of A, column of B) and k. */
static ap_lidx operand_index(gctx *c, int role, ap_kir_expr *o, ap_kir_expr *kk)
{
	const gemm_opnd *op = role ? &c->p->b : &c->p->a;
	const ap_tensor *t = &c->g->tensors[op->t];
	ap_lidx ix = ap_lidx_shape(t);
	int r = t->rank, nb = c->p->nb;
	ap_kir_expr *bc[AP_MAX_RANK];

	if (role == 0)
		o = row_split(c, o, bc);
	else
		for (int d = 0; d < nb; d++)
			bc[d] = c->bcoord[d];
	for (int j = 0; j < r - 2; j++) {
		int d = j + nb - (r - 2);

		ix.c[j] = d < 0 || t->dims[j] == 1 ? I(c, 0) : bc[d];
	}
	ix.c[r - 2] = role ? kk : o;
	ix.c[r - 1] = role ? o : kk;
	return ix;
}

/* sum_i ((x / inner_i) % e_i) * s_i over the factors of f (outer to inner). */
static ap_kir_expr *factor_offset(gctx *c, ap_kir_expr *x, const bdim *f)
{
	ap_kir_kernel *k = c->k;
	ap_kir_expr *e = I(c, 0);
	int64_t inner = 1;

	for (int q = f->n - 1; q >= 0; q--) {
		ap_kir_expr *cf = x;

		if (inner > 1)
			cf = ap_kir_binary(k, AP_KIR_DIV, cf, I(c, inner));
		if (q > 0)
			cf = ap_kir_binary(k, AP_KIR_REM, cf, I(c, f->e[q]));
		e = ap_kir_add(k, e, ap_kir_muli(k, cf, f->s[q]));
		inner *= f->e[q];
	}
	return e;
}

/* The element of a plain operand's buffer at outer coordinate o and k. */
static ap_kir_expr *plain_offset(gctx *c, int role, ap_kir_expr *o, ap_kir_expr *kk)
{
	const gemm_opnd *op = role ? &c->p->b : &c->p->a;
	ap_kir_kernel *k = c->k;
	ap_kir_expr *bc[AP_MAX_RANK], *e;

	if (c->p->conv) {
		const gemm_plan *p = c->p;

		if (role == 1 && p->convt) {   /* W[g * Cg + k / kk][o][k % kk] */
			ap_kir_expr *ch = ap_kir_binary(k, AP_KIR_DIV, kk, I(c, p->kk));

			return ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Cg), ch), p->Mg), o), p->kk),
					  ap_kir_binary(k, AP_KIR_REM, kk, I(c, p->kk)));
		}
		if (role == 1)   /* W[g * Mg + o][k] */
			return ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Mg), o), p->K), kk);
		/* X[n][g * Cg + k][position]: n = o / ohw, position = o % ohw */
		return ap_kir_add(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_binary(k, AP_KIR_DIV, o, I(c, p->ohw)), p->C * p->ohw),
						ap_kir_binary(k, AP_KIR_REM, o, I(c, p->ohw))),
				  ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Cg), kk), p->ohw));
	}
	if (role == 0 && c->p->a_linear)
		return ap_kir_addi(k, ap_kir_add(k, ap_kir_muli(k, o, op->s_outer), ap_kir_muli(k, kk, op->s_k)),
				   op->s_base);
	if (role == 0)
		o = row_split(c, o, bc);
	else
		for (int d = 0; d < c->p->nb; d++)
			bc[d] = c->bcoord[d];
	if (op->composite)
		e = ap_kir_addi(k, ap_kir_add(k, factor_offset(c, o, &op->fo), factor_offset(c, kk, &op->fk)),
				op->s_base);
	else
		e = ap_kir_addi(k, ap_kir_add(k, ap_kir_muli(k, o, op->s_outer), ap_kir_muli(k, kk, op->s_k)),
				op->s_base);
	for (int d = 0; d < c->p->nb; d++)
		e = ap_kir_add(k, e, factor_offset(c, bc[d], &op->batch[d]));
	return e;
}

/* Splits a linear index over dims[0..n) (row-major) into coordinates. */
static void split_linear(gctx *c, ap_kir_expr *lin, const int64_t *dims, int n, ap_kir_expr **out)
{
	ap_kir_kernel *k = c->k;

	for (int d = n - 1; d >= 0; d--) {
		out[d] = d == 0 ? lin : ap_kir_binary(k, AP_KIR_REM, lin, I(c, dims[d]));
		if (d > 0)
			lin = ap_kir_binary(k, AP_KIR_DIV, lin, I(c, dims[d]));
	}
}

/* The part of a convolution's im2col row o that no k changes: the image
 * n and, per spatial dim, where the kernel's first tap meets the input
 * (o_d * stride - pad for Conv, o_d + pad for ConvTranspose).  With
 * `bind` each is an index variable of v->cur, computed once where a loop
 * keeps the row (issue_async). */
typedef struct conv_row {
	ap_kir_expr *n, *base[3];
} conv_row;

static void conv_row_of(gctx *c, ap_kir_expr *o, bool bind, conv_row *r)
{
	const gemm_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_kir_expr *op[3];

	r->n = ap_kir_binary(k, AP_KIR_DIV, o, I(c, p->ohw));
	split_linear(c, ap_kir_binary(k, AP_KIR_REM, o, I(c, p->ohw)), p->O, p->ns, op);
	if (bind)
		r->n = ap_kir_bind(k, c->v->cur, k->index_type, "img", r->n);
	for (int d = 0; d < p->ns; d++) {
		r->base[d] = p->convt ? ap_kir_addi(k, op[d], p->pd[d])
				      : ap_kir_addi(k, ap_kir_muli(k, op[d], p->st[d]), -p->pd[d]);
		if (bind)
			r->base[d] = ap_kir_bind(k, c->v->cur, k->index_type, "ib", r->base[d]);
	}
}

/* The implicit-GEMM element of a convolution's operand, emitting its
 * statements into v->cur: A (row = (n, output position), k = (input
 * channel in the group, kernel position)) is X at the input position the
 * kernel position meets -- Conv: o * stride - pad + kpos * dilation;
 * ConvTranspose: (o + pad - kpos * dilation) / stride where that divides
 * -- or 0 outside X (ONNX Conv / ConvTranspose); B (column m of group g,
 * k) is W[g * Mg + m][c][kpos] (Conv) or W[g * Cg + c][m][kpos]
 * (ConvTranspose).  For A, `row` may hold o's part already (conv_row_of;
 * NULL: computed here). */
static void conv_index(gctx *c, int role, ap_kir_expr *o, const conv_row *row, ap_kir_expr *kk, ap_lidx *ixp,
		       ap_kir_expr **validp)
{
	const gemm_plan *p = c->p;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const ap_tensor *xt = &c->g->tensors[p->x], *wt = &c->g->tensors[p->w];
	ap_kir_expr *kp[3], *ch, *valid = NULL;
	conv_row own;
	ap_lidx ix;

	ch = ap_kir_binary(k, AP_KIR_DIV, kk, I(c, p->kk));
	split_linear(c, ap_kir_binary(k, AP_KIR_REM, kk, I(c, p->kk)), p->KS, p->ns, kp);
	if (role == 1) {
		ix = ap_lidx_shape(wt);
		ix.c[0] = p->convt ? ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Cg), ch)
				   : ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Mg), o);
		ix.c[1] = p->convt ? o : ch;
		for (int d = 0; d < p->ns; d++)
			ix.c[2 + d] = kp[d];
		*ixp = ix;
		*validp = NULL;
		return;
	}
	if (!row) {
		conv_row_of(c, o, false, &own);
		row = &own;
	}
	ix = ap_lidx_shape(xt);
	ix.c[0] = row->n;
	ix.c[1] = ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Cg), ch);
	for (int d = 0; d < p->ns; d++) {
		ap_kir_expr *pos, *ok;

		if (!p->convt) {
			pos = ap_kir_bind(k, v->cur, k->index_type, "ip",
					  ap_kir_add(k, row->base[d], ap_kir_muli(k, kp[d], p->dl[d])));
			ix.c[2 + d] = pos;
			ok = ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_GE, pos, I(c, 0)),
					   ap_kir_binary(k, AP_KIR_LT, pos, I(c, p->D[d])));
			if (p->pd[d] == 0 && (p->O[d] - 1) * p->st[d] + (p->KS[d] - 1) * p->dl[d] < p->D[d])
				ok = NULL;   /* always inside */
		} else {
			pos = ap_kir_bind(k, v->cur, k->index_type, "ip",
					  ap_kir_add(k, row->base[d], ap_kir_muli(k, kp[d], -p->dl[d])));
			ix.c[2 + d] = p->st[d] == 1 ? pos : ap_kir_binary(k, AP_KIR_DIV, pos, I(c, p->st[d]));
			ok = ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_GE, pos, I(c, 0)),
					   ap_kir_binary(k, AP_KIR_LT, pos, I(c, p->D[d] * p->st[d])));
			if (p->st[d] != 1)
				ok = ap_kir_binary(k, AP_KIR_LAND, ok,
						   ap_kir_binary(k, AP_KIR_EQ,
								 ap_kir_binary(k, AP_KIR_REM, pos, I(c, p->st[d])),
								 I(c, 0)));
		}
		if (ok)
			valid = valid ? ap_kir_binary(k, AP_KIR_LAND, valid, ok) : ok;
	}
	*ixp = ix;
	*validp = valid;
}

/* The element of a convolution operand at (o, kk): W[..] for role 1, the
 * im2col element of X (0 in the padding) for role 0, through the value
 * builder. */
static ap_kir_expr *conv_element(gctx *c, int role, ap_kir_expr *o, ap_kir_expr *kk)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int t = role ? c->p->w : c->p->x;
	ap_kir_expr *valid;
	ap_kir_var *r;
	ap_kir_block *saved;
	ap_lidx ix;

	conv_index(c, role, o, NULL, kk, &ix, &valid);
	if (!valid)
		return ap_val(v, t, &ix);
	r = ap_kir_var_new(k, c->p->in_t, "x");
	ap_kir_let(k, v->cur, r, ap_v_const(v, c->p->in_t, 0));
	ap_v_if(v, valid, &saved, NULL);
	ap_kir_assign(k, v->cur, r, ap_val(v, t, &ix));
	ap_v_close(v, saved);
	return ap_kir_ref(k, r);
}


/* Shared-memory index of (outer, k) in stage `st` of operand `role`'s
 * tile (a pair- or compute-staged operand has one tile: st is ignored). */
/* The place of tile element (o, kk) in one stage of operand `role`'s
 * shared tile (linear in both: a sum of places is a place's offset). */
static ap_kir_expr *smem_lin(gctx *c, int role, ap_kir_expr *o, ap_kir_expr *kk)
{
	ap_kir_kernel *k = c->k;
	int ld = role ? c->ldb : c->lda;

	return (role ? c->b_rowk : c->a_rowk) ? ap_kir_add(k, ap_kir_muli(k, o, ld), kk)
					      : ap_kir_add(k, ap_kir_muli(k, kk, ld), o);
}

static ap_kir_expr *smem_index(gctx *c, int role, ap_kir_expr *st, ap_kir_expr *o, ap_kir_expr *kk)
{
	ap_kir_kernel *k = c->k;
	int64_t stage = role ? c->b_stage : c->a_stage;
	ap_kir_expr *e = smem_lin(c, role, o, kk);

	if ((role ? c->b_mode : c->a_mode) != STAGE_TILE)
		return e;
	return ap_kir_add(k, ap_kir_mul(k, st, I(c, stage)), e);
}

/* Tile extents of operand `role`: outer rows and the problem's extent. */
static void extents(gctx *c, int role, int *rows, int64_t *total)
{
	*rows = role ? c->c.bn : c->c.bm;
	*total = role ? c->p->N : c->p->Mr;
}

/* Opens the loop over operand `role`'s copies of one K tile, dealt to the
 * threads (copy i of `copies`, each `w` elements along the contiguous
 * coordinate), and gives the copy's index and tile coordinates (*o,
 * *kk); the caller closes the loop with ap_v_close(v, *saved).  When
 * every thread makes the same number of copies (at most COPY_UNROLL) the
 * loop has that constant trip count and is unrolled, copy i = tid + j *
 * threads: its coordinates are shifts and masks of tid the compiler
 * computes once, outside the K loop (issue 25: no division in the main
 * loop); otherwise a thread-strided loop. */
#define COPY_UNROLL 8
static ap_kir_expr *copy_loop(gctx *c, int role, int w, ap_kir_expr **o, ap_kir_expr **kk, int64_t *copies,
			      ap_kir_var **jv, ap_kir_block **saved)
{
	const gemm_opnd *op = role ? &c->p->b : &c->p->a;
	ap_kir_kernel *k = c->k;
	int rows = role ? c->c.bn : c->c.bm;
	int64_t fast_ext = op->k_fast ? c->c.bk : rows, slow_ext = op->k_fast ? rows : c->c.bk;
	ap_kir_expr *i, *fast, *slow;

	*jv = NULL;
	*copies = fast_ext / w * slow_ext;
	if (*copies % c->nt == 0 && *copies / c->nt <= COPY_UNROLL) {
		ap_kir_var *j = ap_v_loop_unrolled(c->v, "c", *copies / c->nt, saved);

		*jv = j;
		i = ap_kir_bind(k, c->v->cur, k->index_type, "ci", ap_kir_add(k, c->tid, ap_kir_muli(k, ap_kir_ref(k, j), c->nt)));
	} else {
		i = ap_kir_ref(k, ap_v_loop(c->v, "c", c->tid, I(c, *copies), c->nt, saved));
	}
	fast = ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, i, I(c, fast_ext / w)), w);
	slow = ap_kir_binary(k, AP_KIR_DIV, i, I(c, fast_ext / w));
	*o = op->k_fast ? slow : fast;
	*kk = op->k_fast ? fast : slow;
	return i;
}

/* cp.async of operand `role`'s K tile `kt` into stage `st`: each copy
 * moves `vec` elements along the contiguous coordinate (a pair-staged
 * operand: the pair holding its element, into stage st of the pairs,
 * the element's place in the pair into its parity byte; compute-staged:
 * the source's elements into stage st of the staging buffer, in copy
 * order). */
static void issue_async(gctx *c, int role, ap_kir_expr *st, ap_kir_expr *kt)
{
	const gemm_opnd *op = role ? &c->p->b : &c->p->a;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int rows, w = role ? c->b_w : c->a_w;
	int64_t total, copies;
	ap_kir_block *saved;
	ap_kir_expr *o, *kk, *og, *kg, *src, *copy, *pred = NULL;
	ap_kir_var *j = NULL;
	conv_row row, *rowp = NULL;

	extents(c, role, &rows, &total);
	if (op->gather && role == 0 && c->p->conv && !op->k_fast && w == 1 && c->nt % (unsigned)rows == 0) {
		/* im2col rows along the threads, as many threads as rows or a
		 * multiple: each thread keeps one row for the whole tile, so the
		 * row's image and positions are computed once, not per element
		 * (copy i = kk * rows + o, copy_loop's numbering) */
		o = ap_kir_bind(k, v->cur, k->index_type, "o", ap_kir_binary(k, AP_KIR_REM, c->tid, I(c, rows)));
		og = ap_kir_add(k, c->m0, o);
		conv_row_of(c, og, true, &row);
		rowp = &row;
		copies = (int64_t)rows * c->c.bk;
		kk = ap_kir_ref(k, ap_v_loop(v, "c", ap_kir_binary(k, AP_KIR_DIV, c->tid, I(c, rows)),
					     I(c, c->c.bk), (int64_t)(c->nt / (unsigned)rows), &saved));
		copy = ap_kir_add(k, ap_kir_muli(k, kk, rows), o);
	} else {
		copy = copy_loop(c, role, w, &o, &kk, &copies, &j, &saved);
		og = ap_kir_add(k, role ? c->n0 : c->m0, o);
	}
	kg = ap_kir_add(k, ap_kir_muli(k, kt, c->c.bk), kk);
	if (total % rows)
		pred = ap_kir_binary(k, AP_KIR_LT, og, I(c, total));
	if (c->kpred) {
		ap_kir_expr *pk = ap_kir_binary(k, AP_KIR_LT, kg, I(c, c->p->K));

		pred = pred ? ap_kir_binary(k, AP_KIR_LAND, pred, pk) : pk;
	}
	if (op->gather) {
		ap_kir_expr *valid;
		ap_lidx ix;

		/* a padding element is a copy of size 0: zero-filled */
		conv_index(c, role, og, rowp, kg, &ix, &valid);
		if (valid)
			pred = pred ? ap_kir_binary(k, AP_KIR_LAND, pred, valid) : valid;
		src = ap_sview_offset(c->k, &op->gv, &ix);
	} else {
		src = plain_offset(c, role, og, kg);
	}
	if ((role ? c->b_mode : c->a_mode) == STAGE_PAIRS) {
		ap_kir_expr *e = ap_kir_bind(k, v->cur, k->index_type, "e", src);
		ap_kir_expr *slot = ap_kir_add(k, ap_kir_muli(k, st, copies), copy);
		ap_kir_array *pairs = role ? c->pb : c->pa, *buf = ap_v_buffer(v, op->leaf);
		int64_t n = ap_tensor_numel(&c->g->tensors[op->leaf]);
		ap_kir_block *at = v->cur;

		if (n % 2) {
			/* an odd count of elements: the pair of the last one (an
			 * even index, parity 0) would end 2 bytes past the buffer,
			 * so that element is loaded and stored by itself -- no copy,
			 * which would zero-fill the slot behind the store's back */
			ap_kir_expr *last = ap_kir_binary(k, AP_KIR_GE, ap_kir_binary(k, AP_KIR_OR, e, I(c, 1)),
							 I(c, n));
			ap_kir_stmt *s = ap_kir_if(k, v->cur, pred ? ap_kir_binary(k, AP_KIR_LAND, pred, last)
								 : last);

			ap_kir_store(k, &s->body, pairs, ap_kir_muli(k, slot, 2), ap_kir_load(k, buf, e));
			at = &s->orelse;
		}
		ap_kir_cp_async(k, at, pairs, ap_kir_muli(k, slot, 2), buf,
				ap_kir_binary(k, AP_KIR_AND, e, I(c, -2)), 2, pred);
		ap_kir_store(k, v->cur, role ? c->qb : c->qa, slot,
			     ap_kir_cast(k, AP_DT_U8, ap_kir_binary(k, AP_KIR_AND, e, I(c, 1))));
	} else if ((role ? c->b_mode : c->a_mode) == STAGE_COMPUTE) {
		/* copy i's w elements at i * w of the stage: the tile's elements
		 * in the operand's order, as extract_tile reads them back */
		ap_kir_expr *slot = ap_kir_add(k, ap_kir_muli(k, st, copies), copy);

		ap_kir_cp_async(k, v->cur, role ? c->pb : c->pa, ap_kir_muli(k, slot, w), ap_v_buffer(v, op->leaf),
				src, w, pred);
	} else if (c->cp_src[role] && j) {
		/* hoisted (hoist_copies): copy 0's places plus this copy's
		 * and this K tile's increments */
		ap_kir_expr *dj = ap_kir_ref(k, j);

		src = ap_kir_add(k, c->cp_src[role],
				 ap_kir_add(k, ap_kir_muli(k, dj, c->cp_dsrc[role]),
					    ap_kir_muli(k, kt, (int64_t)c->c.bk * op->s_k)));
		ap_kir_cp_async(k, v->cur, role ? c->sb : c->sa,
				ap_kir_add(k, ap_kir_mul(k, st, I(c, role ? c->b_stage : c->a_stage)),
					   ap_kir_add(k, c->cp_dst[role], ap_kir_muli(k, dj, c->cp_ddst[role]))),
				ap_v_buffer(v, op->leaf), src, w, pred);
	} else {
		ap_kir_cp_async(k, v->cur, role ? c->sb : c->sa, smem_index(c, role, st, o, kk),
				ap_v_buffer(v, op->leaf), src, w, pred);
	}
	ap_v_close(v, saved);
}

/* The copies' addresses of plain operands computed once a tile, before
 * its K loop (issue 25: copy addresses advanced by increments, not
 * recomputed in the main loop): an operand copied by cp.async straight
 * into its tile, not gathered, whose element offset is linear in its
 * outer coordinate and k (plain_offset: no folded batch, no composite
 * dimension), with copy_loop's unrolled numbering and whole rows of
 * copies per thread stride (threads a multiple of the copies a row):
 * copy j of a thread is copy 0 moved j * threads / row_copies rows, so
 * its source and tile places are copy 0's plus j times a constant, and
 * K tile kt's source is K tile 0's plus kt * bk * s_k.  issue_async uses
 * them where set. */
static void hoist_copies(gctx *c)
{
	ap_kir_kernel *k = c->k;

	for (int role = 0; role < 2; role++) {
		const gemm_opnd *op = role ? &c->p->b : &c->p->a;
		int w = role ? c->b_w : c->a_w, rows = role ? c->c.bn : c->c.bm;
		int64_t fast_ext = op->k_fast ? c->c.bk : rows, slow_ext = op->k_fast ? rows : c->c.bk;
		int64_t f, copies, step, d_o, d_k;
		ap_kir_expr *fast, *slow, *o, *kk;

		c->cp_src[role] = c->cp_dst[role] = NULL;
		/* w is set for cp.async operands only */
		if (!(role ? c->b_async : c->a_async) || w <= 0 || (role ? c->b_mode : c->a_mode) != STAGE_TILE ||
		    op->gather || c->p->conv || op->composite || (role == 0 && c->p->fold && !c->p->a_linear))
			continue;
		f = fast_ext / w;
		copies = f * slow_ext;
		if (f <= 0 || copies % c->nt || copies / c->nt > COPY_UNROLL || c->nt % f)
			continue;
		step = c->nt / f;
		fast = ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, c->tid, I(c, f)), w);
		slow = ap_kir_binary(k, AP_KIR_DIV, c->tid, I(c, f));
		o = op->k_fast ? slow : fast;
		kk = op->k_fast ? fast : slow;
		d_o = op->k_fast ? step : 0;
		d_k = op->k_fast ? 0 : step;
		c->cp_src[role] = ap_kir_bind(k, c->v->cur, k->index_type, "cs",
					      plain_offset(c, role, ap_kir_add(k, role ? c->n0 : c->m0, o), kk));
		c->cp_dst[role] = ap_kir_bind(k, c->v->cur, k->index_type, "cd", smem_lin(c, role, o, kk));
		c->cp_dsrc[role] = d_o * op->s_outer + d_k * op->s_k;
		c->cp_ddst[role] = (role ? c->b_rowk : c->a_rowk) ? d_o * (role ? c->ldb : c->lda) + d_k
								  : d_k * (role ? c->ldb : c->lda) + d_o;
	}
}

/* The value builder's leaf hook while a compute-staged tile element is
 * built: the source buffer's element is the staged one. */
static ap_kir_expr *staged_leaf(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	gctx *c = user;

	return t == c->hook_leaf ? c->hook_val : NULL;
}

/* x, an element of buffer `leaf`, through the Casts on the way to tensor
 * t (the views between them change no value; ap_sview_of_unary's chain,
 * every op a Cast, its input 0 the chain), as the value builder casts. */
static ap_kir_expr *apply_casts(gctx *c, int t, int leaf, ap_kir_expr *x)
{
	ap_dtype to[32];
	int n = 0;

	for (int u = t; u != leaf && c->g->tensors[u].producer >= 0;) {
		const ap_node *p = &c->g->nodes[c->g->tensors[u].producer];

		if (p->op == AP_OP_CAST && n < 32)
			to[n++] = c->g->tensors[u].dtype;
		u = p->inputs[0];
	}
	while (n > 0)
		x = ap_kir_cast(c->k, to[--n], x);
	return x;
}

/* Tile element (o, kk) of compute-staged operand `role` in K tile `ktile`
 * from its staged source element `src`: the operand's value (the value
 * builder, with src as the source buffer's element), 0 past K -- the
 * zero-filled copies give 0 there only when the ops are casts, so the
 * others are guarded (rows and columns past the problem are computed but
 * never stored). */
static ap_kir_expr *staged_value(gctx *c, int role, ap_kir_expr *ktile, ap_kir_expr *o, ap_kir_expr *kk,
				 ap_kir_expr *src)
{
	const gemm_opnd *op = role ? &c->p->b : &c->p->a;
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_leaf_fn leaf = v->leaf;
	void *user = v->leaf_user;
	ap_kir_expr *og, *kg, *pred = NULL, *val;
	ap_kir_block *saved = NULL;
	ap_kir_var *r = NULL;
	ap_lidx ix;

	if (op->casts_only)
		return apply_casts(c, op->t, op->leaf, src);
	src = ap_kir_bind(k, v->cur, c->g->tensors[op->leaf].dtype, "s", src);
	og = ap_kir_add(k, role ? c->n0 : c->m0, o);
	kg = ap_kir_add(k, ap_kir_muli(k, ktile, c->c.bk), kk);
	if (c->kpred)
		pred = ap_kir_binary(k, AP_KIR_LT, kg, I(c, c->p->K));
	if (pred) {
		r = ap_kir_var_new(k, c->p->in_t, "x");
		ap_kir_let(k, v->cur, r, ap_v_const(v, c->p->in_t, 0));
		ap_v_if(v, pred, &saved, NULL);
	}
	c->hook_leaf = op->leaf;
	c->hook_val = src;
	v->leaf = staged_leaf;
	v->leaf_user = c;
	ix = operand_index(c, role, og, kg);   /* not a gather: those are casts only */
	val = ap_val(v, op->t, &ix);
	v->leaf = leaf;
	v->leaf_user = user;
	if (!pred)
		return val;
	ap_kir_assign(k, v->cur, r, val);
	ap_v_close(v, saved);
	return ap_kir_ref(k, r);
}

/* A pair- or compute-staged operand's stage `st` (K tile `ktile`) into its
 * tile (after the stage's copies are complete and a barrier; a barrier
 * before the tile is read): each element from its pair, at the place its
 * parity byte gives, or computed from its staged source element. */
static void extract_staged(gctx *c, int role, ap_kir_expr *st, ap_kir_expr *ktile)
{
	ap_kir_kernel *k = c->k;
	ap_kir_block *saved;
	ap_kir_array *stg = role ? c->pb : c->pa;
	ap_kir_expr *i, *o, *kk, *slot, *val;
	ap_kir_var *j;
	int64_t copies;

	i = copy_loop(c, role, 1, &o, &kk, &copies, &j, &saved);
	slot = ap_kir_bind(k, c->v->cur, k->index_type, "q", ap_kir_add(k, ap_kir_muli(k, st, copies), i));
	if ((role ? c->b_mode : c->a_mode) == STAGE_PAIRS) {
		val = ap_kir_load(k, stg, ap_kir_add(k, ap_kir_muli(k, slot, 2),
						     ap_kir_cast(k, k->index_type,
								 ap_kir_load(k, role ? c->qb : c->qa, slot))));
	} else {
		val = staged_value(c, role, ktile, o, kk, ap_kir_load(k, stg, slot));
		if (c->p->tc && c->p->mma == AP_KIR_MMA_TF32_1688)
			val = ap_kir_call(k, AP_KIR_TF32, val, NULL);
	}
	ap_kir_store(k, c->v->cur, role ? c->sb : c->sa, smem_index(c, role, st, o, kk), val);
	ap_v_close(c->v, saved);
}

/* Every pair- or compute-staged operand's stage st (K tile ktile) into its
 * tile, and the barrier before the tiles are read. */
static void extract_tile(gctx *c, ap_kir_expr *st, ap_kir_expr *ktile)
{
	if (c->a_mode == STAGE_TILE && c->b_mode == STAGE_TILE)
		return;
	for (int role = 0; role < 2; role++)
		if ((role ? c->b_mode : c->a_mode) != STAGE_TILE)
			extract_staged(c, role, st, ktile);
	ap_kir_barrier(c->k, c->v->cur);
}

/* Elements per thread of a register-staged tile load. */
static int reg_count(gctx *c, int role)
{
	int rows = role ? c->c.bn : c->c.bm;

	return (int)((rows * c->c.bk + c->nt - 1) / c->nt);
}

/* The (outer, k) of register slot r of this thread, along the operand's
 * fast coordinate, and whether the slot is inside the tile. */
static void reg_slot(gctx *c, int role, int r, ap_kir_expr **o, ap_kir_expr **kk, ap_kir_expr **in_tile)
{
	const gemm_opnd *op = role ? &c->p->b : &c->p->a;
	ap_kir_kernel *k = c->k;
	int rows = role ? c->c.bn : c->c.bm;
	int64_t fast_ext = op->k_fast ? c->c.bk : rows, total = (int64_t)rows * c->c.bk;
	ap_kir_expr *e = ap_kir_addi(k, c->tid, (int64_t)r * c->nt);
	ap_kir_expr *fast = ap_kir_binary(k, AP_KIR_REM, e, I(c, fast_ext));
	ap_kir_expr *slow = ap_kir_binary(k, AP_KIR_DIV, e, I(c, fast_ext));

	*o = op->k_fast ? slow : fast;
	*kk = op->k_fast ? fast : slow;
	*in_tile = ((int64_t)(r + 1) * c->nt <= total) ? NULL : ap_kir_binary(k, AP_KIR_LT, e, I(c, total));
}

/* Register-staged load of operand `role`'s K tile `kt`: each register
 * gets the element's value (0 outside the problem), through the value
 * builder. */
static void issue_regs(gctx *c, int role, ap_kir_expr *kt)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int n = role ? c->b_regs : c->a_regs;
	ap_kir_var **regs = role ? c->b_reg : c->a_reg;
	int64_t total = role ? c->p->N : c->p->Mr;
	int rows = role ? c->c.bn : c->c.bm;
	ap_dtype T = c->p->in_t;

	for (int r = 0; r < n; r++) {
		ap_kir_expr *o, *kk, *in_tile, *og, *kg, *pred = NULL;
		ap_kir_block *saved;
		ap_lidx ix;

		reg_slot(c, role, r, &o, &kk, &in_tile);
		og = ap_kir_add(k, role ? c->n0 : c->m0, o);
		kg = ap_kir_add(k, ap_kir_muli(k, kt, c->c.bk), kk);
		if (total % rows)
			pred = ap_kir_binary(k, AP_KIR_LT, og, I(c, total));
		if (c->kpred) {
			ap_kir_expr *pk = ap_kir_binary(k, AP_KIR_LT, kg, I(c, c->p->K));

			pred = pred ? ap_kir_binary(k, AP_KIR_LAND, pred, pk) : pk;
		}
		if (in_tile)
			pred = pred ? ap_kir_binary(k, AP_KIR_LAND, in_tile, pred) : in_tile;
		ap_kir_assign(k, v->cur, regs[r], ap_v_const(v, T, 0));
		if (pred)
			ap_v_if(v, pred, &saved, NULL);
		if ((role ? &c->p->b : &c->p->a)->plain && !(role ? &c->p->b : &c->p->a)->staged) {
			/* a buffer read through views: its element directly */
			int leaf = role ? c->p->b.leaf : c->p->a.leaf;

			ap_kir_assign(k, v->cur, regs[r],
				      ap_kir_load(k, ap_v_buffer(v, leaf), plain_offset(c, role, og, kg)));
		} else if (c->p->conv) {
			ap_kir_assign(k, v->cur, regs[r], conv_element(c, role, og, kg));
		} else {
			ix = operand_index(c, role, og, kg);
			ap_kir_assign(k, v->cur, regs[r], ap_val(v, role ? c->p->b.t : c->p->a.t, &ix));
		}
		if (pred)
			ap_v_close(v, saved);
	}
}

/* Stores the registers of a register-staged load into stage `st`. */
static void complete_regs(gctx *c, int role, ap_kir_expr *st)
{
	ap_kir_kernel *k = c->k;
	int n = role ? c->b_regs : c->a_regs;
	ap_kir_var **regs = role ? c->b_reg : c->a_reg;

	for (int r = 0; r < n; r++) {
		ap_kir_expr *o, *kk, *in_tile, *val = ap_kir_ref(k, regs[r]);
		ap_kir_block *saved;

		reg_slot(c, role, r, &o, &kk, &in_tile);
		if (c->p->tc && c->p->mma == AP_KIR_MMA_TF32_1688)
			val = ap_kir_call(k, AP_KIR_TF32, val, NULL);
		if (in_tile)
			ap_v_if(c->v, in_tile, &saved, NULL);
		ap_kir_store(k, c->v->cur, role ? c->sb : c->sa, smem_index(c, role, st, o, kk), val);
		if (in_tile)
			ap_v_close(c->v, saved);
	}
}

/* Issues the loads of K tile kt into stage st (cp.async, or registers). */
static void issue_tile(gctx *c, ap_kir_expr *st, ap_kir_expr *kt)
{
	if (c->a_async)
		issue_async(c, 0, st, kt);
	else
		issue_regs(c, 0, kt);
	if (c->b_async)
		issue_async(c, 1, st, kt);
	else
		issue_regs(c, 1, kt);
}

static void complete_tile(gctx *c, ap_kir_expr *st)
{
	if (!c->a_async)
		complete_regs(c, 0, st);
	if (!c->b_async)
		complete_regs(c, 1, st);
}

/* ---- SIMT arithmetic ---- */

/* acc[i][j] += A[k][ty*TM + i] * B[k][tx*TN + j] over the K tile in stage
 * st: per k, the thread's TM values of A and TN of B from the shared
 * tiles into the register arrays c->fa / c->fb (cast to the accumulator
 * type), then TM x TN multiply-adds. */
static void compute_simt(gctx *c, ap_kir_expr *st)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_dtype A = c->p->acc_t;
	int TM = c->c.tm, TN = c->c.tn;
	ap_kir_stmt *lk, *li, *lj;
	ap_kir_var *kk = ap_kir_var_new(k, k->index_type, "kk"), *i, *j;

	lk = ap_kir_for_unroll(k, v->cur, kk, I(c, 0), I(c, c->c.bk), 1, -1);
	if (!lk)
		return;
	for (int role = 0; role < 2; role++) {
		int n = role ? TN : TM;
		ap_kir_expr *base = ap_kir_muli(k, role ? c->tx : c->ty, n);

		i = ap_kir_var_new(k, k->index_type, "f");
		li = ap_kir_for_unroll(k, &lk->body, i, I(c, 0), I(c, n), 1, -1);
		if (!li)
			return;
		ap_kir_store(k, &li->body, role ? c->fb : c->fa, ap_kir_ref(k, i),
			     ap_kir_cast(k, A, ap_kir_load(k, role ? c->sb : c->sa,
					 smem_index(c, role, st, ap_kir_add(k, base, ap_kir_ref(k, i)),
						    ap_kir_ref(k, kk)))));
	}
	i = ap_kir_var_new(k, k->index_type, "i");
	li = ap_kir_for_unroll(k, &lk->body, i, I(c, 0), I(c, TM), 1, -1);
	if (!li)
		return;
	j = ap_kir_var_new(k, k->index_type, "j");
	lj = ap_kir_for_unroll(k, &li->body, j, I(c, 0), I(c, TN), 1, -1);
	if (!lj)
		return;
	{
		ap_kir_expr *ai = ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, i), TN), ap_kir_ref(k, j));

		ap_kir_store(k, &lj->body, c->acc, ai,
			     ap_kir_binary(k, AP_KIR_ADD, ap_kir_load(k, c->acc, ai),
					   ap_kir_binary(k, AP_KIR_MUL, ap_kir_load(k, c->fa, ap_kir_ref(k, i)),
							 ap_kir_load(k, c->fb, ap_kir_ref(k, j)))));
	}
}

/* ---- tensor-core arithmetic ---- */

/* What the steps of one K tile on tensor cores share (compute_tc): the
 * stage, the k-step loop and its variable, the fragment shapes, and the
 * parts of the lane that address ldmatrix's rows. */
typedef struct tc_step {
	ap_kir_expr *st;                /* the stage holding the K tile */
	ap_kir_var *kk;                 /* the k step (ks elements of K) */
	ap_kir_block *body;             /* the k-step loop's body */
	bool tf32;                      /* m16n8k8 on float32 registers */
	int E;                          /* elements in 16 bytes */
	int MI, NI;                     /* the warp's m16 row tiles and n8 column tiles */
	int na, nb, nc;                 /* elements of an A, B, C fragment a lane */
	ap_kir_expr *l16, *l8, *hi, *j2;  /* lane % 16, lane % 8, lane / 16, (lane / 8) % 2 */
	/* the place in stage st of the lane's first element (ldmatrix: its
	 * row address) for the warp's first row (column) tile and k step 0,
	 * bound once a K tile;
	 * row tile mi and k step kk read at abase + smem_lin(16 mi, kk) (B:
	 * 8 ni), a constant offset once the loops are unrolled, which the
	 * compiler folds into the instruction (print.c) */
	ap_kir_expr *abase, *bbase;
} tc_step;

/* The A fragments of the warp's MI row tiles into c->fa (na elements
 * each): ldmatrix .x4 at s->abase (compute_tc).  TF32 from a k-major
 * tile (s->abase: the lane's (g, t)): one element a lane, a0 = A[g][t], a1 = A[g+8][t],
 * a2 = A[g][t+4], a3 = A[g+8][t+4].  False when a loop could not be
 * allocated (the kernel is marked failed). */
static bool load_a_frags(gctx *c, const tc_step *s)
{
	ap_kir_kernel *k = c->k;
	ap_kir_var *mi = ap_kir_var_new(k, k->index_type, "mi");
	ap_kir_stmt *lm = ap_kir_for_unroll(k, s->body, mi, I(c, 0), I(c, s->MI), 1, -1);

	if (!lm)
		return false;
	if (s->tf32 && !c->a_rowk) {
		for (int e = 0; e < 4; e++)
			ap_kir_store(k, &lm->body, c->fa,
				     ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, mi), s->na), e),
				     ap_kir_load(k, c->sa, ap_kir_add(k, s->abase,
						smem_lin(c, 0, ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, mi), 16), 8 * (e & 1)),
							 ap_kir_addi(k, ap_kir_ref(k, s->kk), 4 * (e >> 1))))));
		return true;
	}
	ap_kir_ldmatrix(k, &lm->body, c->fa, ap_kir_muli(k, ap_kir_ref(k, mi), s->na), c->sa,
			ap_kir_add(k, s->abase, smem_lin(c, 0, ap_kir_muli(k, ap_kir_ref(k, mi), 16), ap_kir_ref(k, s->kk))),
			4, !c->a_rowk);
	return true;
}

/* The B fragments of the warp's NI column tiles into c->fb (nb elements
 * each): ldmatrix .x2 of one n8 tile at s->bbase (compute_tc).  TF32
 * from a k-major tile (s->bbase: the lane's (g, t)): one element a lane,
 * b0 = B[k=t][n=g], b1 = B[k=t+4][n=g].  False when a loop could
 * not be allocated. */
static bool load_b_frags(gctx *c, const tc_step *s)
{
	ap_kir_kernel *k = c->k;
	ap_kir_var *ni = ap_kir_var_new(k, k->index_type, "ni");
	ap_kir_stmt *ln = ap_kir_for_unroll(k, s->body, ni, I(c, 0), I(c, s->NI), 1, -1);

	if (!ln)
		return false;
	if (s->tf32 && !c->b_rowk) {
		for (int e = 0; e < 2; e++)
			ap_kir_store(k, &ln->body, c->fb,
				     ap_kir_addi(k, ap_kir_muli(k, ap_kir_ref(k, ni), s->nb), e),
				     ap_kir_load(k, c->sb, ap_kir_add(k, s->bbase,
						smem_lin(c, 1, ap_kir_muli(k, ap_kir_ref(k, ni), 8),
							 ap_kir_addi(k, ap_kir_ref(k, s->kk), 4 * e)))));
		return true;
	}
	ap_kir_ldmatrix(k, &ln->body, c->fb, ap_kir_muli(k, ap_kir_ref(k, ni), s->nb), c->sb,
			ap_kir_add(k, s->bbase, smem_lin(c, 1, ap_kir_muli(k, ap_kir_ref(k, ni), 8), ap_kir_ref(k, s->kk))),
			2, !c->b_rowk);
	return true;
}

/* TF32: the fragments of the operands copied by cp.async as they are
 * (float32) are rounded to TF32 in the registers (PTX cvt.rna.tf32.f32);
 * register-staged operands were rounded on the way. */
static void round_frags_tf32(gctx *c, const tc_step *s)
{
	ap_kir_kernel *k = c->k;

	for (int role = 0; role < 2; role++) {
		ap_kir_var *e;
		ap_kir_stmt *le;
		ap_kir_array *f = role ? c->fb : c->fa;
		int n = role ? s->NI * s->nb : s->MI * s->na;

		if (!(role ? c->b_async : c->a_async))
			continue;
		e = ap_kir_var_new(k, k->index_type, "r");
		le = ap_kir_for_unroll(k, s->body, e, I(c, 0), I(c, n), 1, -1);
		if (le)
			ap_kir_store(k, &le->body, f, ap_kir_ref(k, e),
				     ap_kir_call(k, AP_KIR_TF32, ap_kir_load(k, f, ap_kir_ref(k, e)), NULL));
	}
}

/* MI x NI mma.sync of the warp's fragments into the accumulators
 * (acc[(mi * NI + ni) * nc ..], float32). */
static void mma_tiles(gctx *c, const tc_step *s)
{
	ap_kir_kernel *k = c->k;
	ap_kir_var *mi, *ni;
	ap_kir_stmt *lm, *ln;
	ap_kir_expr *ai;

	mi = ap_kir_var_new(k, k->index_type, "mi");
	lm = ap_kir_for_unroll(k, s->body, mi, I(c, 0), I(c, s->MI), 1, -1);
	if (!lm)
		return;
	ni = ap_kir_var_new(k, k->index_type, "ni");
	ln = ap_kir_for_unroll(k, &lm->body, ni, I(c, 0), I(c, s->NI), 1, -1);
	if (!ln)
		return;
	ai = ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, mi), s->NI), ap_kir_ref(k, ni)), s->nc);
	ap_kir_mma(k, &ln->body, c->p->mma, c->acc, ai, c->fa, ap_kir_muli(k, ap_kir_ref(k, mi), s->na), c->fb,
		   ap_kir_muli(k, ap_kir_ref(k, ni), s->nb), c->acc, ai);
}

/* Per k step of the K tile in stage st: A fragments of the warp's MI row
 * tiles and B fragments of its NI column tiles by ldmatrix (the warp's
 * first row and column c->wm0, c->wn0), TF32 rounding where needed, then
 * MI x NI mma.sync into the accumulators. */
static void compute_tc(gctx *c, ap_kir_expr *st)
{
	ap_kir_kernel *k = c->k;
	ap_kir_expr *lane = c->lane;
	tc_step s;
	ap_kir_stmt *lk;
	ap_kir_expr *g4, *q4;

	s.st = st;
	s.tf32 = c->p->mma == AP_KIR_MMA_TF32_1688;
	s.E = 16 / (int)ap_dtype_size(c->p->in_t);
	s.MI = c->c.bm / c->c.tm / 16;
	s.NI = c->c.bn / c->c.tn / 8;
	s.kk = ap_kir_var_new(k, k->index_type, "ks");
	s.l16 = ap_kir_binary(k, AP_KIR_AND, lane, I(c, 15));
	s.l8 = ap_kir_binary(k, AP_KIR_AND, lane, I(c, 7));
	s.hi = ap_kir_binary(k, AP_KIR_SHR, lane, I(c, 4));                 /* lane / 16 */
	s.j2 = ap_kir_binary(k, AP_KIR_AND, ap_kir_binary(k, AP_KIR_SHR, lane, I(c, 3)), I(c, 1));
	ap_kir_mma_frag_sizes(c->p->mma, &s.na, &s.nb, &s.nc);
	g4 = ap_kir_binary(k, AP_KIR_SHR, lane, I(c, 2));
	q4 = ap_kir_binary(k, AP_KIR_AND, lane, I(c, 3));
	/* A, ldmatrix .x4 from a row-major [m][k] tile: matrix j = lane / 8
	 * covers rows (j % 2) * 8.. and k (j / 2) * E..; in lane terms row
	 * lane % 16, k (lane / 16) * E.  k-major tiles (.trans): rows of the
	 * shared tile are k: k (j / 2) * 8 + lane % 8, m (j % 2) * 8.
	 * B, .x2 of one n8 tile from an [n][k] tile: matrix j = (lane / 8) % 2
	 * covers n lane % 8, k j * E..; k-major tiles (.trans): k j * 8 +
	 * lane % 8. */
	if (s.tf32 && !c->a_rowk)   /* TF32, k-major: a lane's element (g, t) of each */
		s.abase = smem_index(c, 0, st, ap_kir_add(k, c->wm0, g4), q4);
	else if (c->a_rowk)
		s.abase = smem_index(c, 0, st, ap_kir_add(k, c->wm0, s.l16), ap_kir_muli(k, s.hi, s.E));
	else
		s.abase = smem_index(c, 0, st, ap_kir_add(k, c->wm0, ap_kir_muli(k, s.j2, 8)),
				     ap_kir_add(k, ap_kir_muli(k, s.hi, 8), s.l8));
	if (s.tf32 && !c->b_rowk)
		s.bbase = smem_index(c, 1, st, ap_kir_add(k, c->wn0, g4), q4);
	else if (c->b_rowk)
		s.bbase = smem_index(c, 1, st, ap_kir_add(k, c->wn0, s.l8), ap_kir_muli(k, s.j2, s.E));
	else
		s.bbase = smem_index(c, 1, st, c->wn0, ap_kir_add(k, ap_kir_muli(k, s.j2, 8), s.l8));
	s.abase = ap_kir_bind(k, c->v->cur, k->index_type, "ab", s.abase);
	s.bbase = ap_kir_bind(k, c->v->cur, k->index_type, "bb", s.bbase);
	lk = ap_kir_for_unroll(k, c->v->cur, s.kk, I(c, 0), I(c, c->c.bk), s.tf32 ? 8 : 16, -1);
	if (!lk)
		return;
	s.body = &lk->body;
	if (!load_a_frags(c, &s) || !load_b_frags(c, &s))
		return;
	if (s.tf32 && (c->a_async || c->b_async))
		round_frags_tf32(c, &s);
	mma_tiles(c, &s);
}

/* ---- split-K ---- */

/* Every block of the cluster leaves its partial accumulators in shared
 * memory (red[e * nt + tid], coalesced); after a cluster barrier the block
 * of rank r sums the elements e of its share (e / (n / splitk) == r) over
 * the cluster's blocks in rank order -- the same order whichever block
 * finished first: deterministic -- and the epilogue stores only those
 * (own_element).  The caller ends the tile with a cluster barrier, so no
 * block overwrites or leaves its partials while another still reads
 * them. */
static void splitk_reduce(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int64_t n = c->acc->size, chunk = n / c->c.splitk;
	ap_kir_block *s1, *s2;
	ap_kir_var *e;
	ap_kir_expr *slot;

	e = ap_v_loop_unrolled(v, "e", n, &s1);
	slot = ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, e), c->nt), c->tid);
	ap_kir_store(k, v->cur, c->red, slot, ap_kir_load(k, c->acc, ap_kir_ref(k, e)));
	ap_v_close(v, s1);
	ap_kir_cluster_barrier(k, v->cur);
	e = ap_v_loop_unrolled(v, "e", n, &s1);
	slot = ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, e), c->nt), c->tid);
	ap_v_if(v, ap_kir_binary(k, AP_KIR_EQ, ap_kir_binary(k, AP_KIR_DIV, ap_kir_ref(k, e), I(c, chunk)), c->rank),
		&s2, NULL);
	{
		ap_kir_expr *sum = ap_kir_load_remote(k, c->red, slot, I(c, 0));

		for (int r = 1; r < c->c.splitk; r++)
			sum = ap_kir_binary(k, AP_KIR_ADD, sum, ap_kir_load_remote(k, c->red, slot, I(c, r)));
		ap_kir_store(k, v->cur, c->acc, ap_kir_ref(k, e), sum);
	}
	ap_v_close(v, s2);
	ap_v_close(v, s1);
}

/* Split-K: whether accumulator element `ai` is this block's to store
 * (NULL: every element is, no split). */
static ap_kir_expr *own_element(gctx *c, ap_kir_expr *ai)
{
	if (c->c.splitk <= 1)
		return NULL;
	return ap_kir_binary(c->k, AP_KIR_EQ, ap_kir_binary(c->k, AP_KIR_DIV, ai, I(c, c->acc->size / c->c.splitk)),
			     c->rank);
}

/* ---- epilogue ---- */

static ap_kir_expr *acc_leaf(ap_vctx *v, int t, ap_lidx *ix, void *user)
{
	gctx *c = user;

	ap_kir_expr *a;

	if (t != c->p->y)
		return NULL;
	a = ap_kir_load(v->k, c->acc, c->acc_index);
	if (c->p->bias >= 0) {
		/* the convolution's bias, per output channel */
		ap_lidx bi = ap_lidx_shape(&v->g->tensors[c->p->bias]);

		bi.c[0] = ap_lidx_coord(v, ix, 1);
		a = ap_kir_binary(v->k, AP_KIR_ADD, a, ap_kir_cast(v->k, c->acc->type, ap_val(v, c->p->bias, &bi)));
	}
	return ap_kir_cast(v->k, v->g->tensors[t].dtype, a);
}

/* Y's index for element (row, col) of the tile's batch. */
static ap_lidx y_index(gctx *c, ap_kir_expr *row, ap_kir_expr *col)
{
	ap_lidx ix = ap_lidx_shape(&c->g->tensors[c->p->y]);
	ap_kir_expr *bc[AP_MAX_RANK];

	if (c->p->conv) {
		/* Y[n][g * Mg + col][position], row = (n, position) */
		const gemm_plan *p = c->p;
		ap_kir_kernel *k = c->k;
		ap_kir_expr *n = ap_kir_binary(k, AP_KIR_DIV, row, I(c, p->ohw));
		ap_kir_expr *pos = ap_kir_binary(k, AP_KIR_REM, row, I(c, p->ohw));
		ap_kir_expr *m = ap_kir_add(k, ap_kir_muli(k, c->tb_index, p->Mg), col);

		ix.c[0] = n;
		ix.c[1] = m;
		split_linear(c, pos, p->O, p->ns, &ix.c[2]);
		ix.lin = ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, n, p->groups * p->Mg), m), p->ohw), pos);
		return ix;
	}
	/* the linear index of a row-major Y: (batch, row) * N + col */
	if (c->p->fold || c->p->nb == 0)
		ix.lin = ap_kir_add(c->k, ap_kir_muli(c->k, row, c->p->N), col);
	else
		ix.lin = ap_kir_add(c->k, ap_kir_muli(c->k, ap_kir_add(c->k, ap_kir_muli(c->k, c->tb_index, c->p->M), row),
						      c->p->N), col);
	row = row_split(c, row, bc);
	for (int d = 0; d < c->p->nb; d++)
		ix.c[d] = bc[d];
	ix.c[c->p->nb] = row;
	ix.c[c->p->nb + 1] = col;
	return ix;
}

/* Stores every output for the accumulator element acc[ai], which holds
 * Y[batch][row][col] (inside the problem: the caller checks). */
static void store_outputs(gctx *c, ap_kir_expr *ai, ap_kir_expr *row, ap_kir_expr *col)
{
	c->acc_index = ai;
	ap__epilogue_store(c->v, c->p->maps, y_index(c, row, col));
}

/* ---- the skeleton ---------------------------------------------------------------------- */

/* How each operand reaches shared memory (copy_mode: cp.async where the
 * operand is read as it is; the host copies: the same statement, printed
 * as a copy), and a comment saying so for readers of the source
 * (tests/check_gemm.c requires cp.async in the PTX when one is). */
static void choose_staging(gctx *c)
{
	ap_kir_kernel *k = c->k;
	const gemm_plan *p = c->p;

	c->a_w = copy_mode(p, 0, &c->c, c->t, &c->a_mode);
	c->b_w = copy_mode(p, 1, &c->c, c->t, &c->b_mode);
	c->a_async = c->a_w > 0;
	c->b_async = c->b_w > 0;
	for (int role = 0; role < 2; role++) {
		int w = role ? c->b_w : c->a_w;

		stage_mode mode = role ? c->b_mode : c->a_mode;

		if (mode == STAGE_PAIRS)
			ap_kir_comment(k, c->v->cur, "operand %c: cp.async of the 4-byte pair holding each "
				       "gathered element, extracted into the tile", role ? 'B' : 'A');
		else if (mode == STAGE_COMPUTE)
			ap_kir_comment(k, c->v->cur, "operand %c: cp.async of its %s elements, %d bytes a copy, "
				       "%s into the tile", role ? 'B' : 'A',
				       ap_dtype_name(c->g->tensors[(role ? p->b : p->a).leaf].dtype),
				       w * (role ? p->b : p->a).src_es, (role ? p->b : p->a).casts_only ? "converted" : "computed");
		else if (w > 0)
			ap_kir_comment(k, c->v->cur, "operand %c: cp.async, %d bytes a copy", role ? 'B' : 'A',
				       w * (int)ap_dtype_size(p->in_t));
		else
			ap_kir_comment(k, c->v->cur, "operand %c: through registers (%s)", role ? 'B' : 'A',
				       !(role ? p->b : p->a).plain && !(role ? p->b : p->a).gather ? "computed on the way"
				       : "no cp.async here");
	}
}

/* The shared arrays: the A and B tiles sa / sb (rows lda / ldb elements,
 * padded by pad_of; `stages` of them, one for a pair- or compute-staged
 * operand), the raw copies of pair-staged (pa / pb with their places in
 * the pair qa / qb) and compute-staged operands (ca / cb, the source
 * buffer's type), and split-K's partial tile red (bm x bn accumulators).
 * Static shared memory while it fits the target's per-block limit,
 * dynamic past it.  A failed allocation marks the kernel failed (the
 * caller checks). */
static void declare_shared(gctx *c)
{
	ap_kir_kernel *k = c->k;
	const gemm_plan *p = c->p;
	int S = c->c.stages;
	size_t smem;

	c->lda = (c->a_rowk ? c->c.bk : c->c.bm) + pad_of(p->in_t);
	c->ldb = (c->b_rowk ? c->c.bk : c->c.bn) + pad_of(p->in_t);
	c->a_stage = (int64_t)c->lda * (c->a_rowk ? c->c.bm : c->c.bk);
	c->b_stage = (int64_t)c->ldb * (c->b_rowk ? c->c.bn : c->c.bk);
	smem = smem_bytes(p, &c->c, c->t);
	{
		ap_kir_array *(*shared)(ap_kir_kernel *, const char *, ap_dtype, int64_t) =
			smem <= c->t->shared_per_block ? ap_kir_shared : ap_kir_shared_dyn;
		int64_t pairs_a = (int64_t)S * c->c.bm * c->c.bk, pairs_b = (int64_t)S * c->c.bn * c->c.bk;

		c->sa = shared(k, "sa", p->in_t, c->a_stage * (c->a_mode != STAGE_TILE ? 1 : S));
		c->sb = shared(k, "sb", p->in_t, c->b_stage * (c->b_mode != STAGE_TILE ? 1 : S));
		if (c->a_mode == STAGE_PAIRS) {
			c->pa = shared(k, "pa", p->in_t, 2 * pairs_a);
			c->qa = shared(k, "qa", AP_DT_U8, pairs_a);
		} else if (c->a_mode == STAGE_COMPUTE) {
			c->pa = shared(k, "ca", c->g->tensors[p->a.leaf].dtype, pairs_a);
		}
		if (c->b_mode == STAGE_PAIRS) {
			c->pb = shared(k, "pb", p->in_t, 2 * pairs_b);
			c->qb = shared(k, "qb", AP_DT_U8, pairs_b);
		} else if (c->b_mode == STAGE_COMPUTE) {
			c->pb = shared(k, "cb", c->g->tensors[p->b.leaf].dtype, pairs_b);
		}
		if (c->c.splitk > 1)
			c->red = shared(k, "red", p->acc_t, (int64_t)c->c.bm * c->c.bn);
	}
}

/* The launch: tiles_m x tiles_n output tiles per tile batch (tb of
 * them), a grid-stride loop of `grid` blocks over them; split-K makes
 * each tile a cluster of splitk blocks, rank r taking K tiles
 * [r * ktl, (r + 1) * ktl) (c->rank, c->kofs) and checking k < K on
 * every load.  Sets the kernel's grid, cluster and block. */
static void set_launch(gctx *c)
{
	ap_kir_kernel *k = c->k;
	const gemm_plan *p = c->p;
	int KT;

	c->tiles_m = (int)((p->Mr + c->c.bm - 1) / c->c.bm);
	c->tiles_n = (int)((p->N + c->c.bn - 1) / c->c.bn);
	c->tiles = p->tb * c->tiles_m * c->tiles_n;
	KT = (int)((p->K + c->c.bk - 1) / c->c.bk);
	c->kpred = p->K % c->c.bk != 0;
	if (c->c.splitk > 1) {
		/* a cluster of splitk blocks per tile, each ktl of its K tiles */
		c->grid = ap_grid_for(c->tiles, 1);
		if (c->grid > AP_MAX_GRID / (unsigned)c->c.splitk)
			c->grid = AP_MAX_GRID / (unsigned)c->c.splitk;
		k->cluster = (unsigned)c->c.splitk;
		k->grid[0] = c->grid * k->cluster;
		c->ktl = (KT + c->c.splitk - 1) / c->c.splitk;
		c->rank = ap_kir_index_of(k, AP_KIR_CLUSTER_RANK);
		c->kofs = ap_kir_muli(k, c->rank, c->ktl);
		c->kpred = true;
		ap_kir_comment(k, c->v->cur, "split-K: a cluster of %d blocks per tile, %d K tiles each, "
			       "partial tiles summed through distributed shared memory", c->c.splitk, c->ktl);
	} else {
		c->grid = ap_grid_for(c->tiles, 1);
		k->grid[0] = c->grid;
		c->ktl = KT;
		c->kofs = I(c, 0);
	}
	k->block[0] = c->nt;
}

/* The thread's place in the tile and its registers.  Tensor cores: warp
 * (wm, wn) of WM x WN, wn fastest, its first row and column c->wm0 /
 * c->wn0 and c->lane; fragments fa (MI A fragments), fb (NI B fragments)
 * and float32 accumulators acc (MI x NI C fragments).  SIMT: thread
 * (ty, tx) of the (bm / tm) x (bn / tn) grid, tx fastest; fa / fb the tm
 * and tn operands of one k, acc the tm x tn register tile.  A failed
 * allocation marks the kernel failed (the caller checks). */
static void declare_threads(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const gemm_plan *p = c->p;

	c->tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	if (p->tc) {
		int na, nb, nc, MI = c->c.bm / c->c.tm / 16, NI = c->c.bn / c->c.tn / 8;
		ap_kir_expr *warp = ap_kir_binary(k, AP_KIR_SHR, c->tid, I(c, 5));

		ap_kir_mma_frag_sizes(p->mma, &na, &nb, &nc);
		c->fa = ap_kir_local(k, "fa", p->in_t, (int64_t)MI * na);
		c->fb = ap_kir_local(k, "fb", p->in_t, (int64_t)NI * nb);
		c->acc = ap_kir_local(k, "acc", AP_DT_F32, (int64_t)MI * NI * nc);
		c->lane = ap_kir_bind(k, v->cur, k->index_type, "lane", ap_kir_binary(k, AP_KIR_AND, c->tid, I(c, 31)));
		/* warp (wm, wn), wn fastest */
		c->wm0 = ap_kir_bind(k, v->cur, k->index_type, "wm",
				     ap_kir_muli(k, ap_kir_binary(k, AP_KIR_DIV, warp, I(c, c->c.tn)), c->c.bm / c->c.tm));
		c->wn0 = ap_kir_bind(k, v->cur, k->index_type, "wn",
				     ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, warp, I(c, c->c.tn)), c->c.bn / c->c.tn));
	} else {
		c->fa = ap_kir_local_scratch(k, "fa", p->acc_t, c->c.tm);
		c->fb = ap_kir_local_scratch(k, "fb", p->acc_t, c->c.tn);
		c->acc = ap_kir_local(k, "acc", p->acc_t, (int64_t)c->c.tm * c->c.tn);
		c->tx = ap_kir_bind(k, v->cur, k->index_type, "tx",
				    ap_kir_binary(k, AP_KIR_REM, c->tid, I(c, c->c.bn / c->c.tn)));
		c->ty = ap_kir_bind(k, v->cur, k->index_type, "ty",
				    ap_kir_binary(k, AP_KIR_DIV, c->tid, I(c, c->c.bn / c->c.tn)));
	}
}

/* Whether every array declared so far exists (no allocation failed). */
static bool declared(gctx *c)
{
	return !ap_kir_failed(c->k) && c->sa && c->sb && c->fa && c->fb && c->acc &&
	       (c->a_mode == STAGE_TILE || c->pa) && (c->a_mode != STAGE_PAIRS || c->qa) &&
	       (c->b_mode == STAGE_TILE || c->pb) && (c->b_mode != STAGE_PAIRS || c->qb) &&
	       (c->c.splitk <= 1 || c->red);
}

/* Opens the grid-stride loop over the output tiles (*saved closes it):
 * a barrier (the previous tile's last stage is read by everyone), then
 * the tile's batch bi (c->tb_index; not folded: its coordinates
 * c->bcoord, row-major over Y's batch dims) and its first row and column
 * c->m0, c->n0 (tiles row-major within a batch). */
static void open_tile(gctx *c, ap_kir_block **saved)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const gemm_plan *p = c->p;
	ap_kir_var *tile;
	ap_kir_expr *r, *bi, *rest;
	int64_t stride = 1, per = (int64_t)c->tiles_m * c->tiles_n;

	tile = ap_v_loop(v, "tile", ap_kir_index_of(k, c->c.splitk > 1 ? AP_KIR_CLUSTER_X : AP_KIR_BLOCK_X),
			 I(c, c->tiles), c->grid, saved);
	ap_kir_barrier(k, v->cur);
	r = ap_kir_ref(k, tile);
	bi = ap_kir_bind(k, v->cur, k->index_type, "bi", ap_kir_binary(k, AP_KIR_DIV, r, I(c, per)));
	rest = ap_kir_binary(k, AP_KIR_REM, r, I(c, per));
	c->m0 = ap_kir_bind(k, v->cur, k->index_type, "m0",
			    ap_kir_muli(k, ap_kir_binary(k, AP_KIR_DIV, rest, I(c, c->tiles_n)), c->c.bm));
	c->n0 = ap_kir_bind(k, v->cur, k->index_type, "n0",
			    ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, rest, I(c, c->tiles_n)), c->c.bn));
	c->tb_index = bi;
	for (int d = p->nb - 1; d >= 0 && !p->fold; d--) {
		c->bcoord[d] = p->bdims[d] == 1 ? I(c, 0)
			       : ap_kir_bind(k, v->cur, k->index_type, "b",
					     ap_kir_binary(k, AP_KIR_REM,
							   ap_kir_binary(k, AP_KIR_DIV, bi, I(c, stride)),
							   I(c, p->bdims[d])));
		stride *= p->bdims[d];
	}
}

/* At the start of a tile: the registers of register-staged loads (ra,
 * rb: declared here so that they live from the issue to the store) and
 * the accumulators set to zero. */
static void clear_tile(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;

	for (int i = 0; i < c->a_regs; i++) {
		c->a_reg[i] = ap_kir_var_new(k, c->p->in_t, "ra");
		ap_kir_let(k, v->cur, c->a_reg[i], NULL);
	}
	for (int i = 0; i < c->b_regs; i++) {
		c->b_reg[i] = ap_kir_var_new(k, c->p->in_t, "rb");
		ap_kir_let(k, v->cur, c->b_reg[i], NULL);
	}
	{
		ap_kir_var *e = ap_kir_var_new(k, k->index_type, "z");
		ap_kir_stmt *lz = ap_kir_for_unroll(k, v->cur, e, I(c, 0), I(c, c->acc->size), 1, -1);

		if (lz)
			ap_kir_store(k, &lz->body, c->acc, ap_kir_ref(k, e), ap_kir_const(k, c->acc->type, 0));
	}
}

/* The arithmetic of the K tile in stage st: tensor cores or SIMT. */
static void compute_tile(gctx *c, ap_kir_expr *st)
{
	if (c->p->tc)
		compute_tc(c, st);
	else
		compute_simt(c, st);
}

/* The K loop with one stage: load, wait, compute (the host's default:
 * its threads run one after the other, there is no latency to hide). */
static void mainloop_single(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	ap_kir_block *ksaved;
	ap_kir_var *kt = ap_v_loop(v, "kt", I(c, 0), I(c, c->ktl), 1, &ksaved);

	ap_kir_barrier(k, v->cur);
	issue_tile(c, I(c, 0), ap_kir_add(k, c->kofs, ap_kir_ref(k, kt)));
	complete_tile(c, I(c, 0));
	if (c->a_async || c->b_async) {
		ap_kir_cp_commit(k, v->cur);
		ap_kir_cp_wait(k, v->cur, 0);
	}
	ap_kir_barrier(k, v->cur);
	extract_tile(c, I(c, 0), ap_kir_add(k, c->kofs, ap_kir_ref(k, kt)));
	compute_tile(c, I(c, 0));
	ap_v_close(v, ksaved);
}

/* The K loop with S >= 2 stages (the file comment): a prologue issuing
 * tiles 0 .. S-2 (one cp.async group each, empty past the block's last
 * K tile); then per K tile kt: wait for its group, issue tile kt + S - 1
 * into the stage tile kt - 1 used, compute tile kt, and store the
 * registers of the register-staged loads into their stage; the last
 * groups are waited for after the loop. */
static void mainloop_pipelined(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	int S = c->c.stages;
	ap_kir_block *ksaved, *saved;
	ap_kir_var *kt, *stv = NULL, *nsv = NULL;
	ap_kir_expr *stage, *nxt, *nst, *more;

	hoist_copies(c);
	/* prologue: stages 0 .. S-2 */
	for (int st = 0; st < S - 1; st++) {
		if (st < c->ktl) {
			issue_tile(c, I(c, st), ap_kir_addi(k, c->kofs, st));
			complete_tile(c, I(c, st));
		}
		if (c->a_async || c->b_async)
			ap_kir_cp_commit(k, v->cur);
	}
	/* the stages of tile kt and of tile kt + S - 1: kt % S and (kt + S -
	 * 1) % S, carried across iterations (S > 2: advanced by a compare
	 * and select at the end of each, no division in the loop) */
	if (S > 2) {
		stv = ap_kir_var_new(k, k->index_type, "st");
		nsv = ap_kir_var_new(k, k->index_type, "ns");
		ap_kir_let(k, v->cur, stv, I(c, 0));
		ap_kir_let(k, v->cur, nsv, I(c, S - 1));
	}
	/* main loop */
	kt = ap_v_loop(v, "kt", I(c, 0), I(c, c->ktl), 1, &ksaved);
	if (c->a_async || c->b_async)
		ap_kir_cp_wait(k, v->cur, S - 2);
	ap_kir_barrier(k, v->cur);
	stage = S == 2 ? ap_kir_bind(k, v->cur, k->index_type, "st", ap_kir_binary(k, AP_KIR_AND, ap_kir_ref(k, kt), I(c, 1)))
		       : ap_kir_ref(k, stv);
	extract_tile(c, stage, ap_kir_add(k, c->kofs, ap_kir_ref(k, kt)));
	nxt = ap_kir_bind(k, v->cur, k->index_type, "nx", ap_kir_addi(k, ap_kir_ref(k, kt), S - 1));
	nst = S == 2 ? ap_kir_bind(k, v->cur, k->index_type, "ns", ap_kir_binary(k, AP_KIR_AND, nxt, I(c, 1)))
		     : ap_kir_ref(k, nsv);
	more = ap_kir_binary(k, AP_KIR_LT, nxt, I(c, c->ktl));
	ap_v_if(v, more, &saved, NULL);
	issue_tile(c, nst, ap_kir_add(k, c->kofs, nxt));
	ap_v_close(v, saved);
	if (c->a_async || c->b_async)
		ap_kir_cp_commit(k, v->cur);
	compute_tile(c, stage);
	if (!c->a_async || !c->b_async) {
		ap_v_if(v, more, &saved, NULL);
		complete_tile(c, nst);
		ap_v_close(v, saved);
	}
	for (int i = 0; S > 2 && i < 2; i++) {
		ap_kir_var *x = i ? nsv : stv;

		ap_kir_assign(k, v->cur, x, ap_kir_select(k, ap_kir_binary(k, AP_KIR_EQ, ap_kir_ref(k, x), I(c, S - 1)),
							  I(c, 0), ap_kir_addi(k, ap_kir_ref(k, x), 1)));
	}
	ap_v_close(v, ksaved);
	if (c->a_async || c->b_async)
		ap_kir_cp_wait(k, v->cur, 0);
}

/* Whether the tensor-core epilogue stores its C fragments' element pairs
 * (2t, 2t + 1 of a row: adjacent columns) as one vector store each: every
 * output of the micro-graph is Y's element's value at Y's own index (no
 * view, transpose, part or Concat between them: ap_emap with no steps), Y
 * is a row-major matrix (not a convolution's NCHW) of an even number of
 * columns (so a pair starts at an even element: aligned), the output
 * types make a vector of two, at most PAIR_OUTPUTS_MAX outputs, and with
 * split-K a pair never straddles two
 * ranks' shares of the accumulators. */
#define PAIR_OUTPUTS_MAX 8
static bool pair_stores(gctx *c)
{
	const ap_graph *g = c->g;

	if (g->n_outputs > PAIR_OUTPUTS_MAX || c->p->conv || c->p->N % 2 || (c->c.splitk > 1 && (c->acc->size / c->c.splitk) % 2))
		return false;
	for (int i = 0; i < g->n_outputs; i++) {
		const ap_emap *mp = &c->p->maps[g->outputs[i]];

		if (!mp->derived || mp->n || !ap_kir_vector_ok(g->tensors[g->outputs[i]].dtype, 2))
			return false;
	}
	return true;
}

/* The outputs of accumulator elements acc[ai] and acc[ai + 1], Y[row][col]
 * and Y[row][col + 1] (pair_stores holds; the caller checks the pair is
 * inside the problem): both values of every output, then one two-wide
 * vector store each (the epilogue's stores halved: issue 25, item 2). */
static void store_output_pairs(gctx *c, ap_kir_expr *ai, ap_kir_expr *row, ap_kir_expr *col)
{
	ap_kir_kernel *k = c->k;
	const ap_graph *g = c->g;
	ap_kir_expr *vals[PAIR_OUTPUTS_MAX][2];
	int n = g->n_outputs;

	for (int j = 0; j < 2 && !c->v->rc; j++) {
		ap_lidx ix = y_index(c, row, ap_kir_addi(k, col, j));

		c->acc_index = ap_kir_addi(k, ai, j);
		for (int i = 0; i < n && !c->v->rc; i++) {
			ap_lidx r = ix;
			ap_kir_var *x = ap_kir_var_new(k, g->tensors[g->outputs[i]].dtype, "w");

			ap_kir_let(k, c->v->cur, x, ap_val(c->v, g->outputs[i], &r));
			vals[i][j] = ap_kir_ref(k, x);
		}
	}
	for (int i = 0; i < n && !c->v->rc; i++) {
		ap_lidx ix = y_index(c, row, col);

		ap_kir_vstore(k, c->v->cur, ap_v_buffer(c->v, g->outputs[i]), ap_lidx_linear(c->v, &ix), 2, vals[i]);
	}
}

/* The epilogue on tensor cores: each lane holds, per (mi, ni) tile, the
 * m16n8 C fragment's elements e = 0..3 at row g + 8 * (e / 2) and column
 * 2t + e % 2 (g = lane / 4, t = lane % 4); each inside the problem (and,
 * with split-K, this block's to store: own_element) has its outputs
 * stored. */
static void epilogue_tc(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const gemm_plan *p = c->p;
	int na, nb, nc, MI = c->c.bm / c->c.tm / 16, NI = c->c.bn / c->c.tn / 8;
	ap_kir_var *mi, *ni, *e;
	ap_kir_block *s1, *s2, *s3, *s4;
	ap_kir_expr *g4 = ap_kir_binary(k, AP_KIR_SHR, c->lane, I(c, 2));
	ap_kir_expr *q4 = ap_kir_binary(k, AP_KIR_AND, c->lane, I(c, 3));
	ap_kir_expr *row, *col, *ai, *in, *own;

	bool pairs = pair_stores(c);
	ap_kir_expr *ev;

	ap_kir_mma_frag_sizes(p->mma, &na, &nb, &nc);
	mi = ap_v_loop_unrolled(v, "mi", MI, &s1);
	ni = ap_v_loop_unrolled(v, "ni", NI, &s2);
	/* element e of the fragment (pairs: e = 2 * e2, and e + 1 with it) */
	e = ap_v_loop_unrolled(v, "e", pairs ? 2 : 4, &s3);
	ev = pairs ? ap_kir_muli(k, ap_kir_ref(k, e), 2) : ap_kir_ref(k, e);
	row = ap_kir_add(k, ap_kir_add(k, c->m0, c->wm0),
			 ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, mi), 16),
				    ap_kir_add(k, g4, ap_kir_muli(k, ap_kir_binary(k, AP_KIR_SHR, ev, I(c, 1)), 8))));
	col = ap_kir_add(k, ap_kir_add(k, c->n0, c->wn0),
			 ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, ni), 8),
				    ap_kir_add(k, ap_kir_muli(k, q4, 2), ap_kir_binary(k, AP_KIR_AND, ev, I(c, 1)))));
	ai = ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, mi), NI),
						   ap_kir_ref(k, ni)), nc), ev);
	own = own_element(c, ai);
	row = ap_kir_bind(k, v->cur, k->index_type, "row", row);
	col = ap_kir_bind(k, v->cur, k->index_type, "col", col);
	in = ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_LT, row, I(c, p->Mr)),
			   ap_kir_binary(k, AP_KIR_LT, col, I(c, p->N)));
	ap_v_if(v, own ? ap_kir_binary(k, AP_KIR_LAND, own, in) : in, &s4, NULL);
	if (pairs)
		store_output_pairs(c, ai, row, col);
	else
		store_outputs(c, ai, row, col);
	ap_v_close(v, s4);
	ap_v_close(v, s3);
	ap_v_close(v, s2);
	ap_v_close(v, s1);
}

/* The epilogue in SIMT: thread (ty, tx) holds rows m0 + ty * tm + i and
 * columns n0 + tx * tn + j, acc[i * tn + j]; each inside the problem
 * (checked only where the problem does not fill the tile) and this
 * block's to store under split-K has its outputs stored. */
static void epilogue_simt(gctx *c)
{
	ap_kir_kernel *k = c->k;
	ap_vctx *v = c->v;
	const gemm_plan *p = c->p;
	ap_kir_var *i, *j;
	ap_kir_block *s1, *s2, *s3;
	ap_kir_expr *row, *col, *ai, *in;

	i = ap_v_loop_unrolled(v, "i", c->c.tm, &s1);
	j = ap_v_loop_unrolled(v, "j", c->c.tn, &s2);
	row = ap_kir_bind(k, v->cur, k->index_type, "row",
			  ap_kir_add(k, c->m0, ap_kir_add(k, ap_kir_muli(k, c->ty, c->c.tm), ap_kir_ref(k, i))));
	col = ap_kir_bind(k, v->cur, k->index_type, "col",
			  ap_kir_add(k, c->n0, ap_kir_add(k, ap_kir_muli(k, c->tx, c->c.tn), ap_kir_ref(k, j))));
	ai = ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, i), c->c.tn), ap_kir_ref(k, j));
	in = own_element(c, ai);
	if (p->Mr % c->c.bm) {
		ap_kir_expr *cm = ap_kir_binary(k, AP_KIR_LT, row, I(c, p->Mr));

		in = in ? ap_kir_binary(k, AP_KIR_LAND, in, cm) : cm;
	}
	if (p->N % c->c.bn) {
		ap_kir_expr *cn = ap_kir_binary(k, AP_KIR_LT, col, I(c, p->N));

		in = in ? ap_kir_binary(k, AP_KIR_LAND, in, cn) : cn;
	}
	if (in)
		ap_v_if(v, in, &s3, NULL);
	store_outputs(c, ai, row, col);
	if (in)
		ap_v_close(v, s3);
	ap_v_close(v, s2);
	ap_v_close(v, s1);
}

/* The kernel (the file comment): per output tile, the K loop (one stage
 * or a pipeline), split-K's cluster reduction, and the epilogue, which
 * reads the accumulators as Y through the value builder's leaf hook.
 * Errors: AP_EUNSUPPORTED (not a GEMM this emitter builds, or a
 * configuration that does not fit the target), AP_ENOMEM. */
/* lib=1: the library's call attached to kernel k (built as for lib=0),
 * its params bound and both modelled times noted (--explain).  0 or
 * AP_ENOMEM; a call that cannot be bound (an operand baked into the
 * kernel) is left out: the kernel runs. */
static int attach_library(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t,
			  const gemm_plan *p, ap_kir_kernel *k)
{
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
	if ((rc = gm_traffic(m, &own, t, &tr)) < 0)
		return rc;
	lib.kernel_us = ap_cost_schedule_us(&tr, t);
	k->library = malloc(sizeof(lib));
	if (!k->library)
		return AP_ENOMEM;
	*k->library = lib;
	return 0;
}

static int gm_emit(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t, ap_kir_kernel *k,
		   ap_error *err)
{
	gemm_plan p;
	gctx c;
	ap_vctx v;
	char why[200];
	int rc;
	ap_kir_block *tsaved;

	if ((rc = analyze(m, t, &p, why, sizeof(why))) <= 0)
		return ap_error_set(err, rc < 0 ? AP_ENOMEM : AP_EUNSUPPORTED, m->g->nodes[m->root].name, NULL,
				    "gemm emitter: %s", why);
	memset(&c, 0, sizeof(c));
	c.m = m;
	c.g = m->g;
	c.p = &p;
	c.c = cfg_of(s);
	c.t = t;
	c.k = k;
	if (!cfg_valid(&p, &c.c, t)) {
		plan_clear(&p);
		return ap_error_set(err, AP_EUNSUPPORTED, m->g->nodes[m->root].name, NULL,
				    "gemm emitter: configuration %dx%dx%d/%dx%d/%d does not fit the target",
				    c.c.bm, c.c.bn, c.c.bk, c.c.tm, c.c.tn, c.c.stages);
	}
	if ((rc = ap_vctx_init(&v, m, k, err))) {
		plan_clear(&p);
		return rc;
	}
	c.v = &v;
	c.nt = threads_of(&p, &c.c);
	tile_layouts(&p, &c.a_rowk, &c.b_rowk);
	choose_staging(&c);
	declare_shared(&c);
	set_launch(&c);
	declare_threads(&c);
	if (!declared(&c)) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering a matmul");
		goto done;
	}
	/* the registers of register-staged loads (declared per tile by
	 * clear_tile) */
	c.a_regs = c.a_async ? 0 : reg_count(&c, 0);
	c.b_regs = c.b_async ? 0 : reg_count(&c, 1);
	c.a_reg = calloc((size_t)c.a_regs + 1, sizeof(*c.a_reg));
	c.b_reg = calloc((size_t)c.b_regs + 1, sizeof(*c.b_reg));
	if (!c.a_reg || !c.b_reg) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering a matmul");
		goto done;
	}
	open_tile(&c, &tsaved);
	clear_tile(&c);
	if (c.c.stages == 1)
		mainloop_single(&c);
	else
		mainloop_pipelined(&c);
	if (c.c.splitk > 1)
		splitk_reduce(&c);
	v.leaf = acc_leaf;
	v.leaf_user = &c;
	if (p.tc)
		epilogue_tc(&c);
	else
		epilogue_simt(&c);
	v.leaf = NULL;
	if (c.c.splitk > 1)   /* the cluster's partials are read: the next tile may reuse them */
		ap_kir_cluster_barrier(k, v.cur);
	ap_v_close(&v, tsaved);
	rc = v.rc;
	if (rc == 0 && s->n > K_LIB && s->v[K_LIB] && attach_library(m, s, t, &p, k) < 0)
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory lowering a matmul");
done:
	free(c.a_reg);
	free(c.b_reg);
	ap_vctx_clear(&v);
	plan_clear(&p);
	return rc;
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
	unsigned per_sm = ap_cost_blocks_per_sm_regs(t, tr->threads, tr->shared_bytes, tr->regs);

	if (peak <= 0 || clk_ghz <= 0 || per_sm == 0)
		return 1;
	return work / (work + TC_BUBBLE_CLK / per_sm);
}

static int gm_traffic(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t, ap_traffic *out)
{
	gemm_plan p;
	char why[160];
	gemm_cfg c = cfg_of(s);
	int rc;

	memset(out, 0, sizeof(*out));
	if (ap__lower_inline_traffic(m, out) < 0)
		return AP_ENOMEM;
	if ((rc = analyze(m, t, &p, why, sizeof(why))) <= 0)
		return rc;
	if (s->n > K_LIB && s->v[K_LIB]) {   /* the library's call (library.h) */
		ap_kir_library lib;

		rc = lib_call(m, t, &p, &lib);
		plan_clear(&p);
		if (rc == 1)
			ap__library_traffic(&lib, t, out);
		return rc < 0 ? rc : 0;
	}
	/* the inline model counts a prologue once per multiply; tiles evaluate
	 * it once per block column (A) or block row (B) */
	out->flops = 2.0 * (double)p.tb * (double)p.Mr * (double)p.N * (double)p.K;
	out->threads = threads_of(&p, &c);
	out->blocks = ap_grid_for(p.tb * ((p.Mr + c.bm - 1) / c.bm) * ((p.N + c.bn - 1) / c.bn), 1) *
		      (unsigned)c.splitk;
	out->shared_bytes = (unsigned)smem_bytes(&p, &c, t);
	out->tensor_cores = p.tc;
	{
		/* what only the tile changes: every block column re-reads A's rows,
		 * every block row B's columns (from L2); a SIMT thread reads tm + tn
		 * values from shared memory per tm x tn multiply-adds, a warp of
		 * tensor cores wtm + wtn per wtm x wtn; registers from the live
		 * values of the default rule's estimate, plus addresses */
		double es = (double)ap_dtype_size(p.in_t), macs = out->flops / 2;
		double rows = (double)((p.Mr + c.bm - 1) / c.bm), cols = (double)((p.N + c.bn - 1) / c.bn);
		double fm = p.tc ? (double)c.bm / c.tm : c.tm, fn = p.tc ? (double)c.bn / c.tn : c.tn;
		int64_t live = live_values(&p, &c, t) + 32;

		out->tile_bytes = es * (double)p.tb * (double)p.K * ((double)p.Mr * cols + (double)p.N * rows);
		out->shared_read = es * macs * (1.0 / fm + 1.0 / fn);
		/* split-K: each block writes its partial tile, and the cluster reads
		 * them all back once */
		if (c.splitk > 1)
			out->shared_read += 2.0 * (double)out->blocks * c.bm * c.bn * (double)ap_dtype_size(p.acc_t);
		/* past the default rule's budget ptxas spills (measured on the
		 * models): more than a thread may hold */
		out->regs = t->gpu && live - 32 > LIVE_BUDGET ? 256u : (unsigned)(live > 255 ? 255 : live);
		/* the host's C compiler vectorises a thread's register tile,
		 * roughly: the vector unit is busy from 16 accumulators on (the
		 * tuner does not search host GEMMs: host_rule_only) */
		if (!t->gpu && !p.tc)
			out->alu_fraction = fmin(1.0, c.tm * c.tn / 16.0);
		/* split-K: a block's pipeline fills (stages - 1 K tiles copied
		 * before its first product) and its cluster's reduction and
		 * barrier (about one K tile more) stand outside the overlapped
		 * main loop: it fills ktl / (ktl + stages) of a block's time over
		 * its ktl K tiles.  Idle SMs outweigh that many times over; the
		 * last wave's quantisation of a grid of many waves never does
		 * (TF32 4096^3 was split 8 ways without it). */
		if (c.splitk > 1) {
			double ktl = ceil(ceil((double)p.K / c.bk) / c.splitk);

			out->loop_fraction = ktl / (ktl + c.stages);
		}
		if (t->gpu && p.tc)
			out->loop_fraction = (out->loop_fraction > 0 ? out->loop_fraction : 1.0) *
					     tc_barrier_fraction(&p, &c, t, out);
	}
	plan_clear(&p);
	return 0;
}

const ap_emitter ap_emitter_gemm = {
	"gemm", gm_match, gm_space, gm_choose, gm_emit, gm_traffic, gm_valid, true, NULL,
};
