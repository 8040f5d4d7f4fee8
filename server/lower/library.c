/* library.c -- whether cuBLASLt can compute a GEMM micro-graph, its call,
 * and its modelled time (library.h; issue 25).
 *
 * The call is built in Apollo's row-major terms (apollo.LibraryCall); the
 * runtime (client/library.c) maps it to cuBLASLt's column-major API.  The
 * library is never offered where the fusion needs Apollo's kernel: a
 * prologue (an operand computed, gathered, or read at an offset), an
 * epilogue beyond bias and ReLU, several outputs, a convolution,
 * attention; nor on the host target.
 */
#include "library.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The nodes of g that read tensor t: how many, and the last one. */
static int readers(const ap_graph *g, int t, int *node)
{
	int n = 0;

	for (int i = 0; i < g->n_nodes; i++)
		for (int j = 0; j < g->nodes[i].n_inputs; j++)
			if (g->nodes[i].inputs[j] == t) {
				*node = i;
				n++;
				break;
			}
	return n;
}

/* Marks t and what it is computed from (its producers, transitively). */
static int mark_ancestors(const ap_graph *g, int t, bool *node_seen)
{
	int n = 0, p;

	if (t < 0 || (p = g->tensors[t].producer) < 0 || node_seen[p])
		return 0;
	node_seen[p] = true;
	n = 1;
	for (int j = 0; j < g->nodes[p].n_inputs; j++)
		n += mark_ancestors(g, g->nodes[p].inputs[j], node_seen);
	return n;
}

/* The epilogue from y: Add of a bias vector, then Relu, each optional;
 * *d_t the tensor written, *bias_t the bias (-1), *epi its
 * apollo.LibraryEpilogue, *nodes the nodes walked.  false with why. */
static bool walk_epilogue(const ap_graph *g, const ap_lib_gemm *gm, int *d_t, int *bias_t, int *epi,
			  int *nodes, char *why, size_t cap)
{
	int cur = gm->y, node, stage = 0;   /* 0: before the bias, 1: after it, 2: after Relu */

	*bias_t = -1;
	*nodes = 0;
	for (;;) {
		int nr = readers(g, cur, &node);
		const ap_node *n;

		if (nr == 0)
			break;
		if (nr > 1 || g->tensors[cur].is_output) {
			snprintf(why, cap, "the product is read by %d ops", nr + g->tensors[cur].is_output);
			return false;
		}
		n = &g->nodes[node];
		if (n->n_outputs != 1 || n->outputs[0] < 0 ||
		    g->tensors[n->outputs[0]].dtype != gm->in_t) {
			snprintf(why, cap, "a %s epilogue", ap_op_name(n->op));
			return false;
		}
		if (n->op == AP_OP_ADD && stage == 0 && n->n_inputs == 2) {
			int o = n->inputs[0] == cur ? n->inputs[1] : n->inputs[0];
			const ap_tensor *bt = &g->tensors[o];
			int64_t elems = 1;

			for (int d = 0; d < bt->rank; d++)
				elems *= bt->dims[d];
			if (o == cur || bt->producer >= 0 || bt->dtype != gm->in_t || bt->rank < 1 ||
			    bt->dims[bt->rank - 1] != gm->N || elems != gm->N) {
				snprintf(why, cap, "an Add that is not of a bias vector of %lld elements",
					 (long long)gm->N);
				return false;
			}
			*bias_t = o;
			stage = 1;
		} else if (n->op == AP_OP_RELU && stage < 2) {
			stage = 2;
		} else {
			snprintf(why, cap, "a %s epilogue", ap_op_name(n->op));
			return false;
		}
		cur = n->outputs[0];
		(*nodes)++;
	}
	if (!g->tensors[cur].is_output || g->n_outputs != 1) {
		snprintf(why, cap, "%d outputs", g->n_outputs);
		return false;
	}
	*d_t = cur;
	*epi = *bias_t >= 0 ? (stage == 2 ? AP_LIB_EPI_BIAS_RELU : AP_LIB_EPI_BIAS)
	       : stage == 2 ? AP_LIB_EPI_RELU : AP_LIB_EPI_NONE;
	return true;
}

/* A's (outer = M) or B's (outer = N, B described as [N][K]) layout in
 * row-major terms.  For A: not transposed when K is contiguous; for B:
 * not transposed when N is. */
static bool operand_layout(const ap_lib_operand *o, bool is_b, int64_t outer, int64_t K,
			   bool *trans, int64_t *ld)
{
	if (!o->plain || !o->batch_ok || o->s_base != 0)
		return false;
	if (!is_b) {
		if (o->s_k == 1 && (outer == 1 || o->s_outer >= K)) {
			*trans = false;
			*ld = outer == 1 ? K : o->s_outer;
			return true;
		}
		if (o->s_outer == 1 && (K == 1 || o->s_k >= outer)) {
			*trans = true;
			*ld = K == 1 ? outer : o->s_k;
			return true;
		}
		return false;
	}
	if (o->s_outer == 1 && (K == 1 || o->s_k >= outer)) {
		*trans = false;   /* K x N, rows of N */
		*ld = K == 1 ? outer : o->s_k;
		return true;
	}
	if (o->s_k == 1 && (outer == 1 || o->s_outer >= K)) {
		*trans = true;    /* N x K, rows of K */
		*ld = outer == 1 ? K : o->s_outer;
		return true;
	}
	return false;
}

int ap__library_express(const ap_mgraph *m, const ap_target_info *t, const ap_lib_gemm *gm,
			ap_kir_library *out, char *why, size_t cap)
{
	const ap_graph *g = m->g;
	bool *seen;
	int d_t, bias_t, epi, walked, counted;

	memset(out, 0, sizeof(*out));
	if (!t->gpu) {
		snprintf(why, cap, "the host target");
		return 0;
	}
	if (gm->in_t != AP_DT_F16 && gm->in_t != AP_DT_BF16 && gm->in_t != AP_DT_F32) {
		snprintf(why, cap, "operands of type %s", ap_dtype_name(gm->in_t));
		return 0;
	}
	if (gm->M > INT32_MAX || gm->N > INT32_MAX || gm->K > INT32_MAX || gm->batch > INT32_MAX) {
		snprintf(why, cap, "dims beyond 2^31");
		return 0;
	}
	if (!operand_layout(&gm->a, false, gm->M, gm->K, &out->trans_a, &out->lda) ||
	    !operand_layout(&gm->b, true, gm->N, gm->K, &out->trans_b, &out->ldb)) {
		snprintf(why, cap, "an operand with a prologue, an offset or strides cuBLASLt cannot take");
		return 0;
	}
	if (!walk_epilogue(g, gm, &d_t, &bias_t, &epi, &walked, why, cap))
		return 0;
	/* nothing else computed: the product, its operands' views, the epilogue */
	seen = calloc((size_t)g->n_nodes + 1, sizeof(bool));
	if (!seen)
		return AP_ENOMEM;
	seen[gm->node] = true;
	counted = 1 + walked + mark_ancestors(g, g->nodes[gm->node].inputs[0], seen) +
		  mark_ancestors(g, g->nodes[gm->node].inputs[1], seen);
	free(seen);
	if (counted != g->n_nodes) {
		snprintf(why, cap, "%d ops beside the product and its epilogue", g->n_nodes - counted);
		return 0;
	}
	out->op = AP_LIB_MATMUL;
	out->a_type = out->b_type = gm->in_t;
	out->c_type = out->d_type = out->bias_type = gm->in_t;
	out->compute = gm->in_t == AP_DT_F32 && t->allow_tf32 ? 1 : 0;
	out->m = gm->M;
	out->n = gm->N;
	out->k = gm->K;
	out->batch = gm->batch;
	if (gm->batch > 1) {
		out->stride_a = gm->a.s_batch;
		out->stride_b = gm->b.s_batch;
		out->stride_d = gm->M * gm->N;
	}
	out->ldc = out->ldd = gm->N;
	out->epilogue = epi;
	out->alpha = 1;
	out->beta = 0;
	out->a = out->b = out->c = out->d = out->bias = -1;
	return 1;
}

void ap__library_tensors(const ap_mgraph *m, const ap_lib_gemm *gm, int *d_t, int *bias_t)
{
	char why[128];
	int epi, walked;

	*d_t = *bias_t = -1;
	if (!walk_epilogue(m->g, gm, d_t, bias_t, &epi, &walked, why, sizeof(why)))
		*d_t = *bias_t = -1;
}

static int param_of(const ap_kir_kernel *k, int t)
{
	for (int i = 0; t >= 0 && i < k->n_arrays; i++)
		if (k->arrays[i]->space == AP_KIR_GLOBAL && k->arrays[i]->tensor == t)
			return k->arrays[i]->param;
	return -1;
}

bool ap__library_bind(ap_kir_library *lib, const ap_kir_kernel *k, int a_t, int b_t, int d_t,
		      int bias_t)
{
	lib->a = param_of(k, a_t);
	lib->b = param_of(k, b_t);
	lib->d = param_of(k, d_t);
	lib->bias = bias_t >= 0 ? param_of(k, bias_t) : -1;
	lib->c = -1;
	return lib->a >= 0 && lib->b >= 0 && lib->d >= 0 && (bias_t < 0 || lib->bias >= 0);
}

void ap__library_traffic(const ap_kir_library *lib, const ap_target_info *t, ap_traffic *out)
{
	double es = (double)ap_dtype_size(lib->a_type), ds = (double)ap_dtype_size(lib->d_type);
	double B = (double)lib->batch, M = (double)lib->m, N = (double)lib->n, K = (double)lib->k;
	double rows = ceil(M / 128), cols = ceil(N / 256);
	bool tf32 = lib->compute == 1 && t->tf32_gflops > 0 && t->tc_gflops > 0;

	memset(out, 0, sizeof(*out));
	out->flops = 2 * B * M * N * K;
	out->bytes_read = es * B * (M * K + K * N) + (lib->bias >= 0 ? ds * N : 0);
	out->bytes_written = ds * B * M * N;
	out->blocks = (unsigned)fmin(B * rows * cols, 4e9);
	/* 384 threads of 168 registers (3 warp groups): one block per SM; a
	 * build that caps Apollo's blocks lower (max_threads_per_block) gets
	 * as many registers per thread as keep it one block per SM */
	out->threads = t->max_threads_per_block < 384 ? t->max_threads_per_block : 384;
	out->regs = out->threads >= 384 ? 168 : 255;
	out->shared_bytes = t->shared_optin_per_block / 2;
	out->tensor_cores = t->tc_gflops > 0 && (lib->a_type != AP_DT_F32 || tf32);
	out->tile_bytes = es * B * K * (M * cols + N * rows);
	out->shared_read = es * (out->flops / 2) * (1.0 / 128 + 1.0 / 256);
	out->alu_fraction = AP_LIBRARY_EFFICIENCY * (tf32 ? t->tf32_gflops / t->tc_gflops : 1);
	out->library = true;
}
