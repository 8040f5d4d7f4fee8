/* view.c -- operands as strided views of the buffers they are read from:
 * the mixed-radix view a chain of reshapes, transposes, slices, splits and
 * expands (stride-0 factors) makes of a buffer (the GEMM emitter's tile
 * loads and gathers, the attention emitter's cp.async copies and tensor
 * maps of Q, K and V).  Declared in emitters.h.
 */
#include "emitters.h"

#include <string.h>

static void sv_rowmajor(ap_sview *v, const ap_tensor *t)
{
	int64_t st = 1;

	v->rank = t->rank;
	v->off = 0;
	v->nf = 0;
	/* factors outer to inner: count first, then fill from the inside */
	for (int d = 0; d < t->rank; d++) {
		v->first[d] = v->nf;
		if (t->dims[d] != 1)
			v->nf++;
	}
	v->first[t->rank] = v->nf;
	for (int d = t->rank - 1, f = v->nf - 1; d >= 0; d--)
		if (t->dims[d] != 1) {
			v->fe[f] = t->dims[d];
			v->fs[f--] = st;
			st *= t->dims[d];
		}
}

/* The same elements as `rank` x `dims`: adjacent factors that are
 * contiguous with each other merge, then each new dim takes factors from
 * the outside until their extents multiply to its size, splitting a
 * factor whose extent the remainder divides.  False when it cannot (a
 * reshape that is no view of the buffer, or too many factors). */
bool ap_sview_reshape(ap_sview *v, int rank, const int64_t *dims)
{
	int64_t fe[AP_SV_FACTORS], fs[AP_SV_FACTORS];
	int nf = 0, at = 0;
	ap_sview out;

	for (int i = 0; i < v->nf; i++) {
		if (nf > 0 && fs[nf - 1] == v->fe[i] * v->fs[i]) {
			fe[nf - 1] *= v->fe[i];
			fs[nf - 1] = v->fs[i];
			continue;
		}
		fe[nf] = v->fe[i];
		fs[nf++] = v->fs[i];
	}
	memset(&out, 0, sizeof(out));
	out.rank = rank;
	out.off = v->off;
	for (int d = 0; d < rank; d++) {
		int64_t need = dims[d];

		out.first[d] = out.nf;
		while (need > 1) {
			if (at >= nf || out.nf == AP_SV_FACTORS)
				return false;
			if (fe[at] <= need) {
				if (need % fe[at])
					return false;
				out.fe[out.nf] = fe[at];
				out.fs[out.nf++] = fs[at];
				need /= fe[at++];
			} else {
				/* the outer `need` of this factor; the rest stays */
				if (fe[at] % need)
					return false;
				out.fe[out.nf] = need;
				out.fs[out.nf++] = fs[at] * (fe[at] / need);
				fe[at] /= need;
				need = 1;
			}
		}
	}
	out.first[rank] = out.nf;
	if (at != nf)
		return false;
	*v = out;
	return true;
}

/* The stride of dim d when it has at most one factor (0 for none); false
 * for a composite dim. */
bool ap_sview_stride(const ap_sview *v, int d, int64_t *s)
{
	int n = v->first[d + 1] - v->first[d];

	*s = n ? v->fs[v->first[d]] : 0;
	return n <= 1;
}

/* Expand (ONNX, numpy broadcasting) of view v of tensor `in` to `out`'s
 * shape: a dim of extent 1, or a new leading one, repeated n times reads
 * the same elements -- a factor of extent n and stride 0 (grouped-query
 * attention's K and V expanded over each group's heads); the other dims
 * keep their factors.  False when `out` is no such broadcast of `in` or
 * the factors run out. */
static bool sv_expand(ap_sview *v, const ap_tensor *in, const ap_tensor *out)
{
	ap_sview w;
	int lead = out->rank - in->rank;

	if (lead < 0 || v->rank != in->rank)
		return false;
	memset(&w, 0, sizeof(w));
	w.rank = out->rank;
	w.off = v->off;
	for (int d = 0; d < out->rank; d++) {
		int64_t ie = d < lead ? 1 : in->dims[d - lead];

		w.first[d] = w.nf;
		if (ie == out->dims[d]) {
			for (int f = d < lead ? 0 : v->first[d - lead]; d >= lead && f < v->first[d - lead + 1]; f++) {
				w.fe[w.nf] = v->fe[f];
				w.fs[w.nf++] = v->fs[f];
			}
		} else if (ie == 1 && w.nf < AP_SV_FACTORS) {
			w.fe[w.nf] = out->dims[d];
			w.fs[w.nf++] = 0;
		} else {
			return false;
		}
	}
	w.first[out->rank] = w.nf;
	*v = w;
	return true;
}

/* Whether x is a constant small enough to be baked into a kernel. */
static bool baked(const ap_graph *g, int x)
{
	return g->tensors[x].kind == AP_TENSOR_CONST && ap_tensor_numel(&g->tensors[x]) <= AP_CONST_BAKE_MAX;
}

/* The input of node p (making x) that a unary chain goes on through: p is
 * elementwise (or a broadcast of baked constants), every other input a
 * baked constant, that input of x's shape; -1 when p is no such op. */
static int unary_input(const ap_graph *g, const ap_node *p, int x)
{
	ap_op_category cat = ap_op_category_of(p->op);
	int in = -1;

	if ((cat != AP_CAT_ELEMWISE && cat != AP_CAT_BROADCAST) || p->n_outputs != 1)
		return -1;
	for (int j = 0; j < p->n_inputs; j++) {
		int u = p->inputs[j];

		if (u < 0 || baked(g, u))
			continue;
		if (in >= 0)
			return -1;
		in = u;
	}
	if (in < 0 || !ap_dims_equal(g->tensors[in].rank, g->tensors[in].dims, g->tensors[x].rank, g->tensors[x].dims))
		return -1;
	return in;
}

/* Tensor t as a strided view of a buffer, when it is one: views,
 * transposes, slices and splits back to a leaf of the micro-graph; with
 * `ops` non-NULL, also through unary elementwise ops (unary_input: they
 * are element for element, so they commute with the views), counted in
 * *ops, *casts counting the Casts among them. */
static bool sview_walk(const ap_graph *g, int t, ap_sview *out, int *leaf, int *ops, int *casts)
{
	int chain[32], n = 0, x = t;

	if (ops)
		*ops = *casts = 0;
	while (g->tensors[x].producer >= 0) {
		const ap_node *p = &g->nodes[g->tensors[x].producer];
		int u = ops ? unary_input(g, p, x) : -1;

		if (u >= 0 && *ops < 32) {
			++*ops;
			*casts += p->op == AP_OP_CAST;
			x = u;
			continue;
		}
		if ((!ap_op_is_view(p->op) && p->op != AP_OP_TRANSPOSE && p->op != AP_OP_SLICE &&
		     p->op != AP_OP_SPLIT && p->op != AP_OP_EXPAND) || n == 32 || p->inputs[0] < 0)
			return false;
		chain[n++] = x;
		x = p->inputs[0];
	}
	/* a constant of a few elements is baked into the kernel; a larger one
	 * (a small convolution's weights) is read from a buffer like a weight */
	if (baked(g, x))
		return false;
	*leaf = x;
	sv_rowmajor(out, &g->tensors[x]);
	while (n > 0) {
		int y = chain[--n];
		const ap_node *p = &g->nodes[g->tensors[y].producer];
		const ap_tensor *yt = &g->tensors[y];

		if (p->op == AP_OP_TRANSPOSE) {
			ap_sview in = *out;

			out->nf = 0;
			for (int d = 0; d < yt->rank; d++) {
				int64_t pd = ap_node_attr_at(p, "perm", d, yt->rank - 1 - d);

				if (pd < 0 || pd >= in.rank)
					return false;
				out->first[d] = out->nf;
				for (int f = in.first[pd]; f < in.first[pd + 1]; f++) {
					out->fe[out->nf] = in.fe[f];
					out->fs[out->nf++] = in.fs[f];
				}
			}
			out->first[yt->rank] = out->nf;
			out->rank = yt->rank;
		} else if (p->op == AP_OP_SLICE) {
			/* element c of the slice: start + c * step of its input (dims of
			 * one factor only) */
			for (int d = 0; d < out->rank; d++) {
				int64_t st, start = ap_node_attr_at(p, "starts", d, 0), step = ap_node_attr_at(p, "steps", d, 1);
				int f = out->first[d];

				if (!ap_sview_stride(out, d, &st))
					return false;
				out->off += start * st;
				if (yt->dims[d] == 1 && out->first[d + 1] > f) {
					/* a single element: the dim's factor goes */
					memmove(&out->fe[f], &out->fe[f + 1], (size_t)(out->nf - f - 1) * sizeof(int64_t));
					memmove(&out->fs[f], &out->fs[f + 1], (size_t)(out->nf - f - 1) * sizeof(int64_t));
					out->nf--;
					for (int q = d + 1; q <= out->rank; q++)
						out->first[q]--;
				} else if (out->first[d + 1] > f) {
					out->fe[f] = yt->dims[d];
					out->fs[f] = st * step;
				}
			}
		} else if (p->op == AP_OP_SPLIT) {
			/* this output: the input from the sizes of the outputs before it */
			int64_t axis = ap_node_int(p, "axis", 0), start = 0, st;

			if (axis < 0 || axis >= out->rank || !ap_sview_stride(out, (int)axis, &st) ||
			    out->first[axis + 1] == out->first[axis])
				return false;
			for (int o = 0; o < p->n_outputs && p->outputs[o] != y; o++)
				if (p->outputs[o] >= 0)
					start += g->tensors[p->outputs[o]].dims[axis];
			out->off += start * st;
			out->fe[out->first[axis]] = yt->dims[axis];
			if (yt->dims[axis] == 1)
				return false;   /* keep it simple: a one-element split is rare */
		} else if (p->op == AP_OP_EXPAND) {
			if (!sv_expand(out, &g->tensors[p->inputs[0]], yt))
				return false;
		} else if (!ap_sview_reshape(out, yt->rank, yt->dims)) {
			return false;
		}
	}
	return true;
}

/* (emitters.h) */
bool ap_sview_of(const ap_graph *g, int t, ap_sview *out, int *leaf)
{
	return sview_walk(g, t, out, leaf, NULL, NULL);
}

/* (emitters.h) */
bool ap_sview_of_unary(const ap_graph *g, int t, ap_sview *out, int *leaf, bool *casts_only)
{
	int ops, casts;

	if (!sview_walk(g, t, out, leaf, &ops, &casts) || ops == 0)
		return false;
	*casts_only = casts == ops;
	return true;
}

/* (emitters.h) */
int ap_sview_copy_width(const ap_graph *g, int x, bool trans, ap_sview *sv, int *leaf)
{
	const ap_tensor *t = &g->tensors[x];
	int cd = t->rank - (trans ? 2 : 1), w, es = (int)ap_dtype_size(t->dtype);
	int64_t st;

	if (cd < 0 || !ap_sview_of(g, x, sv, leaf) || sv->rank != t->rank ||
	    g->tensors[*leaf].kind == AP_TENSOR_CONST || g->tensors[*leaf].dtype != t->dtype ||
	    !ap_sview_stride(sv, cd, &st) || st != 1)
		return 0;
	for (w = 16 / es; w * es >= 4; w /= 2) {
		bool ok = t->dims[cd] % w == 0 && sv->off % w == 0;

		for (int f = 0; f < sv->nf && ok; f++)
			ok = f == sv->first[cd] || sv->fs[f] % w == 0;
		if (ok)
			return w;
	}
	return 0;
}

/* Offset in the leaf buffer of element ix of a view: per dim, its factors'
 * coordinates (outermost without a remainder) times their strides. */
ap_kir_expr *ap_sview_factor_coord(ap_kir_kernel *k, const ap_sview *sv, int d, int q, ap_kir_expr *x)
{
	int64_t inner = 1;

	for (int r = q + 1; r < sv->first[d + 1]; r++)
		inner *= sv->fe[r];
	if (inner > 1)
		x = ap_kir_binary(k, AP_KIR_DIV, x, ap_kir_idx(k, inner));
	if (q > sv->first[d])
		x = ap_kir_binary(k, AP_KIR_REM, x, ap_kir_idx(k, sv->fe[q]));
	return x;
}

ap_kir_expr *ap_sview_offset(ap_kir_kernel *k, const ap_sview *sv, const ap_lidx *ix)
{
	ap_kir_expr *e = ap_kir_idx(k, sv->off);

	for (int d = 0; d < sv->rank; d++)
		for (int q = sv->first[d + 1] - 1; q >= sv->first[d]; q--)
			e = ap_kir_add(k, e, ap_kir_muli(k, ap_sview_factor_coord(k, sv, d, q, ix->c[d]), sv->fs[q]));
	return e;
}
