/* library.c -- whether cuBLASLt can compute a GEMM micro-graph, its call,
 * and its modelled time (library.h; issue 25).
 *
 * The call is built in Apollo's row-major terms (apollo.LibraryCall); the
 * runtime (client/library.c) maps it to cuBLASLt's column-major API.  The
 * library is never offered where the fusion needs Apollo's kernel: a
 * prologue (an operand computed, gathered, or read at an offset), an
 * epilogue beyond alpha, bias, residual and ReLU or GELU (tanh), several
 * outputs, a convolution, attention; nor on the host target.
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
static void mark_ancestors(const ap_graph *g, int t, bool *node_seen)
{
	int p;

	if (t < 0 || (p = g->tensors[t].producer) < 0 || node_seen[p])
		return;
	node_seen[p] = true;
	for (int j = 0; j < g->nodes[p].n_inputs; j++)
		mark_ancestors(g, g->nodes[p].inputs[j], node_seen);
}

/* What the epilogue computes, as cuBLASLt's
 * D = act(alpha * (A B) + beta * C + bias): the tensor D, the bias vector
 * and the residual C (-1: none), alpha, and act (0 none, else
 * AP_LIB_EPI_RELU or AP_LIB_EPI_GELU). */
typedef struct lib_epi {
	int d_t, bias_t, c_t;
	double alpha;
	int act;
} lib_epi;

/* The value of t when it is a finite constant of one element. */
static bool scalar_const(const ap_graph *g, int t, double *v)
{
	return ap_tensor_scalar(g, t, v) && isfinite(*v);
}

/* Where the activation is tested: it is read off the nodes as a function
 * of one variable and compared with ReLU and GELU at every 1/16 from -8
 * to 8 (exact in every floating type; a function built of the ops
 * eval_node knows that agrees there is the activation up to bumps
 * narrower than 1/16, which only a graph made to fool this test has). */
#define N_ACT_X 257
#define ACT_X(i) (((double)(i) - 128) / 16)

/* Node n of the activation on the values of its inputs (val[t][i] at
 * ACT_X(i); scalar constants read from g): false for an op outside the
 * set an activation is built of here. */
static bool eval_node(const ap_graph *g, const ap_node *n, double (*val)[N_ACT_X], double *out)
{
	bool binary = n->op == AP_OP_ADD || n->op == AP_OP_SUB || n->op == AP_OP_MUL ||
		      n->op == AP_OP_DIV || n->op == AP_OP_POW;
	bool nary = n->op == AP_OP_MAX || n->op == AP_OP_MIN;

	if (n->n_inputs < 1 || n->n_inputs > 4 || (binary && n->n_inputs != 2) ||
	    (!binary && !nary && n->n_inputs != 1))
		return false;
	for (size_t i = 0; i < N_ACT_X; i++) {
		double a[4], r;

		for (int j = 0; j < n->n_inputs; j++)
			if (!scalar_const(g, n->inputs[j], &a[j]))
				a[j] = val[n->inputs[j]][i];
		r = a[0];
		switch (n->op) {
		case AP_OP_IDENTITY: break;
		case AP_OP_NEG: r = -a[0]; break;
		case AP_OP_RELU: r = a[0] > 0 ? a[0] : 0; break;
		case AP_OP_TANH: r = tanh(a[0]); break;
		case AP_OP_ERF: r = erf(a[0]); break;
		case AP_OP_EXP: r = exp(a[0]); break;
		case AP_OP_SQRT: r = sqrt(a[0]); break;
		case AP_OP_SIGMOID: r = 1 / (1 + exp(-a[0])); break;
		case AP_OP_ADD: r = a[0] + a[1]; break;
		case AP_OP_SUB: r = a[0] - a[1]; break;
		case AP_OP_MUL: r = a[0] * a[1]; break;
		case AP_OP_DIV: r = a[0] / a[1]; break;
		case AP_OP_POW: r = pow(a[0], a[1]); break;
		case AP_OP_MAX:
		case AP_OP_MIN:
			for (int j = 1; j < n->n_inputs; j++)
				r = (n->op == AP_OP_MAX) == (a[j] > r) ? a[j] : r;
			break;
		default:
			return false;
		}
		out[i] = r;
	}
	return true;
}

/* Which activation f is: AP_LIB_EPI_RELU, AP_LIB_EPI_GELU (the tanh
 * approximation, cuBLASLt's), 0 for the identity, -1 for none of them.
 * Within a tolerance of the constants' rounding to the graph's type (a
 * float16 graph's 0.044715 is float16's): 1e-6 plus r relative, r four of
 * the type's epsilons and at least 1e-4.  Erf's GELU differs from tanh's
 * by 4e-4 at -3 (tanh's -0.00364): more than r = 4e-3 (float16) allows
 * there; bfloat16's r = 3e-2 still tells them apart further out. */
static int classify_act(const double *f, ap_dtype dt)
{
	double eps = dt == AP_DT_F16 ? 0x1p-10 : dt == AP_DT_BF16 ? 0x1p-7 : 0x1p-23;
	double r = fmax(4 * eps, 1e-4);
	bool relu = true, gelu = true, id = true;

	for (size_t i = 0; i < N_ACT_X; i++) {
		double x = ACT_X(i);
		double g = 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
		double rl = x > 0 ? x : 0;

		if (!isfinite(f[i]))
			return -1;
		relu = relu && fabs(f[i] - rl) <= 1e-6 + r * fabs(rl);
		gelu = gelu && fabs(f[i] - g) <= 1e-6 + r * fabs(g);
		id = id && fabs(f[i] - x) <= 1e-6 + r * fabs(x);
	}
	return id ? 0 : relu ? AP_LIB_EPI_RELU : gelu ? AP_LIB_EPI_GELU : -1;
}

/* The activation: the nodes of g not marked in `seen` compute the graph's
 * one output elementwise from tensor v and scalar constants alone.  Its
 * kind (classify_act) in *act; false with why. */
static int read_activation(const ap_graph *g, const ap_lib_gemm *gm, int v, bool *seen, int *act,
			   char *why, size_t cap)
{
	double (*val)[N_ACT_X] = calloc((size_t)g->n_tensors + 1, sizeof(*val));
	bool *known = calloc((size_t)g->n_tensors + 1, sizeof(bool));
	int out = g->n_outputs == 1 ? g->outputs[0] : -1, left = 0, rc = 1;
	bool progress = true;

	if (!val || !known) {
		free(val);
		free(known);
		return AP_ENOMEM;
	}
	for (size_t i = 0; i < N_ACT_X; i++)
		val[v][i] = ACT_X(i);
	known[v] = true;
	for (int i = 0; i < g->n_nodes; i++)
		left += !seen[i];
	while (left > 0 && progress && rc == 1) {
		progress = false;
		for (int i = 0; i < g->n_nodes && rc == 1; i++) {
			const ap_node *n = &g->nodes[i];
			bool ready = !seen[i] && n->n_outputs == 1 && n->outputs[0] >= 0;
			double c;

			for (int j = 0; ready && j < n->n_inputs; j++)
				ready = n->inputs[j] >= 0 &&
					(known[n->inputs[j]] || scalar_const(g, n->inputs[j], &c));
			if (!ready)
				continue;
			if (g->tensors[n->outputs[0]].dtype != gm->in_t ||
			    !eval_node(g, n, val, val[n->outputs[0]])) {
				snprintf(why, cap, "a %s epilogue", ap_op_name(n->op));
				rc = 0;
				break;
			}
			known[n->outputs[0]] = true;
			seen[i] = true;
			left--;
			progress = true;
		}
	}
	if (rc == 1 && left > 0) {
		snprintf(why, cap, "an epilogue reading tensors beside the product");
		rc = 0;
	} else if (rc == 1 && (out < 0 || !known[out])) {
		snprintf(why, cap, "%d outputs", g->n_outputs);
		rc = 0;
	} else if (rc == 1 && (*act = classify_act(val[out], gm->in_t)) < 0) {
		snprintf(why, cap, "an activation that is neither ReLU nor GELU (tanh)");
		rc = 0;
	}
	free(val);
	free(known);
	return rc;
}

/* The epilogue from y, as cuBLASLt computes it: an optional Mul by a
 * constant scalar (alpha), Adds of a bias vector of N elements and of a
 * residual C of y's shape (a buffer of the micro-graph; beta = 1), in
 * either order, then an activation (read_activation), nothing else
 * computed beside the product and its operands' views.  1 with *e, 0 with
 * why, AP_ENOMEM. */
static int read_epilogue(const ap_graph *g, const ap_lib_gemm *gm, lib_epi *e, char *why,
			 size_t cap)
{
	bool *seen = calloc((size_t)g->n_nodes + 1, sizeof(bool));
	int cur = gm->y, node, rc;

	if (!seen)
		return AP_ENOMEM;
	e->bias_t = e->c_t = -1;
	e->alpha = 1;
	e->act = 0;
	seen[gm->node] = true;
	mark_ancestors(g, g->nodes[gm->node].inputs[0], seen);
	mark_ancestors(g, g->nodes[gm->node].inputs[1], seen);
	for (;;) {
		const ap_node *n;
		const ap_tensor *ot;
		int o;
		double c;

		if (readers(g, cur, &node) != 1 || g->tensors[cur].is_output)
			break;
		n = &g->nodes[node];
		if (n->n_inputs != 2 || n->n_outputs != 1 || n->outputs[0] < 0 ||
		    g->tensors[n->outputs[0]].dtype != gm->in_t ||
		    !ap_dims_equal(g->tensors[n->outputs[0]].rank, g->tensors[n->outputs[0]].dims,
				   g->tensors[cur].rank, g->tensors[cur].dims))
			break;
		o = n->inputs[0] == cur ? n->inputs[1] : n->inputs[0];
		if (o == cur || o < 0)
			break;
		ot = &g->tensors[o];
		if (n->op == AP_OP_MUL && e->bias_t < 0 && e->c_t < 0 && scalar_const(g, o, &c)) {
			e->alpha *= c;
		} else if (n->op == AP_OP_ADD && ot->producer < 0 && ot->dtype == gm->in_t &&
			   e->bias_t < 0 && ot->rank >= 1 && ot->dims[ot->rank - 1] == gm->N &&
			   ap_tensor_numel(ot) == gm->N) {
			e->bias_t = o;
		} else if (n->op == AP_OP_ADD && ot->producer < 0 && ot->dtype == gm->in_t &&
			   e->c_t < 0 && ap_dims_equal(ot->rank, ot->dims, g->tensors[cur].rank,
						       g->tensors[cur].dims)) {
			e->c_t = o;
		} else {
			break;
		}
		seen[node] = true;
		cur = n->outputs[0];
	}
	rc = read_activation(g, gm, cur, seen, &e->act, why, cap);
	e->d_t = g->n_outputs == 1 ? g->outputs[0] : -1;
	free(seen);
	if (rc == 1 && !isfinite((float)e->alpha)) {
		snprintf(why, cap, "a scale beyond float");
		rc = 0;
	}
	return rc;
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
	lib_epi e;
	int rc;

	memset(out, 0, sizeof(*out));
	if (!t->gpu) {
		snprintf(why, cap, "the host target");
		return 0;
	}
	if (gm->in_t != AP_DT_F16 && gm->in_t != AP_DT_BF16 && gm->in_t != AP_DT_F32) {
		snprintf(why, cap, "operands of type %s", ap_dtype_name(gm->in_t));
		return 0;
	}
	if (g->tensors[gm->y].dtype != gm->in_t) {   /* D in A's type only (expand.c's fp32 scores: Apollo's) */
		snprintf(why, cap, "a %s product of %s operands", ap_dtype_name(g->tensors[gm->y].dtype),
			 ap_dtype_name(gm->in_t));
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
	if ((rc = read_epilogue(g, gm, &e, why, cap)) <= 0)
		return rc;
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
	if (gm->batch > 1 && e.c_t >= 0)
		out->stride_c = gm->M * gm->N;
	out->epilogue = e.act | (e.bias_t >= 0 ? AP_LIB_EPI_BIAS : 0);
	if (!out->epilogue)
		out->epilogue = AP_LIB_EPI_NONE;
	out->alpha = (float)e.alpha;
	out->beta = e.c_t >= 0 ? 1 : 0;
	/* scratch for the library's split-K and stream-K reductions: what
	 * cuBLAS's documentation recommends per handle (cublasSetWorkspace:
	 * 32 MiB on Hopper, 4 MiB before it); the plan places it */
	out->workspace_bytes = t->arch >= 90 ? 32 << 20 : 4 << 20;
	out->a = out->b = out->c = out->d = out->bias = -1;
	return 1;
}

void ap__library_tensors(const ap_mgraph *m, const ap_lib_gemm *gm, int *d_t, int *bias_t, int *c_t)
{
	char why[128];
	lib_epi e;

	*d_t = *bias_t = *c_t = -1;
	if (read_epilogue(m->g, gm, &e, why, sizeof(why)) == 1) {
		*d_t = e.d_t;
		*bias_t = e.bias_t;
		*c_t = e.c_t;
	}
}

static int param_of(const ap_kir_kernel *k, int t)
{
	for (int i = 0; t >= 0 && i < k->n_arrays; i++)
		if (k->arrays[i]->space == AP_KIR_GLOBAL && k->arrays[i]->tensor == t)
			return k->arrays[i]->param;
	return -1;
}

bool ap__library_bind(ap_kir_library *lib, const ap_kir_kernel *k, int a_t, int b_t, int d_t,
		      int bias_t, int c_t)
{
	lib->a = param_of(k, a_t);
	lib->b = param_of(k, b_t);
	lib->d = param_of(k, d_t);
	lib->bias = bias_t >= 0 ? param_of(k, bias_t) : -1;
	lib->c = c_t >= 0 ? param_of(k, c_t) : -1;
	return lib->a >= 0 && lib->b >= 0 && lib->d >= 0 && (bias_t < 0 || lib->bias >= 0) &&
	       (c_t < 0 || lib->c >= 0);
}

void ap__library_traffic(const ap_kir_library *lib, const ap_target_info *t, ap_traffic *out)
{
	double es = (double)ap_dtype_size(lib->a_type), ds = (double)ap_dtype_size(lib->d_type);
	double B = (double)lib->batch, M = (double)lib->m, N = (double)lib->n, K = (double)lib->k;
	double rows = ceil(M / 128), cols = ceil(N / 256);
	bool tf32 = lib->compute == 1 && t->tf32_gflops > 0 && t->tc_gflops > 0;

	memset(out, 0, sizeof(*out));
	out->flops = 2 * B * M * N * K;
	out->bytes_read = es * B * (M * K + K * N) + (lib->bias >= 0 ? ds * N : 0) +
			  (lib->beta != 0 ? ds * B * M * N : 0);
	out->bytes_written = ds * B * M * N;
	out->blocks = (unsigned)fmin(B * rows * cols, 4e9);
	/* 384 threads of 168 registers (3 warp groups): one block per SM; a
	 * build that caps Apollo's blocks lower (max_threads_per_block) gets
	 * as many registers per thread as keep it one block per SM */
	out->threads = t->max_threads_per_block < 384 ? t->max_threads_per_block : 384;
	out->regs = out->threads >= 384 ? 168 : 255;
	out->shared_bytes = t->shared_optin_per_block / 2;
	out->tensor_cores = t->tc_gflops > 0 && (lib->a_type != AP_DT_F32 || tf32);
	out->tf32 = tf32;
	out->tile_bytes = es * B * K * (M * cols + N * rows);
	out->shared_read = es * (out->flops / 2) * (1.0 / 128 + 1.0 / 256);
	out->alu_fraction = AP_LIBRARY_EFFICIENCY;
	out->library = true;
}
