/* onnx_import_emit.c -- how the ONNX importer puts normalised nodes into the
 * graph.  ap__onnx_emit takes one normalised node (ops.def) with its input
 * values: it infers the outputs (ap__op_infer, ops.c); when every input is
 * a known constant (not a weight) and the outputs and the work are bounded
 * (FOLD_MAX_BYTES, FOLD_MAX_WORK) it evaluates the node on the spot
 * (ap__op_eval, onnx_fold.c) and its outputs become known values;
 * otherwise it materialises the inputs (a known value becomes a CONST or a
 * PARAM, a fill an Expand of a scalar CONST) and adds the node.  It imports
 * no ONNX op itself; the op importers (onnx_import_*.c) call it.
 */
#include "onnx_import_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Constant folding: a node whose inputs are all known is evaluated at
 * import when each output is at most FOLD_MAX_BYTES and the evaluation
 * visits at most FOLD_MAX_WORK elements (fold_work); its results become
 * CONSTs, or PARAMs with data when larger than AP_CONST_MAX_BYTES. */
#define FOLD_MAX_BYTES ((int64_t)16 << 20)
#define FOLD_MAX_WORK ((int64_t)1 << 27)

/* Known and readable: a structure-only import (no parameter store) lacks
 * the bytes of large floating-point tensors (ap_onnx_skeleton drops them;
 * they are weights, never folded into, so both imports give one graph). */
static bool readable(const imp *im, const ival *v)
{
	return known(v) && (v->data || !im->shape_only || known_small(v) || !float_dtype(v->sh.dtype));
}

/* ---- putting values into the graph ------------------------------------------- */

static int add_param(imp *im, ap_host_tensor *t)
{
	if (!im->params) {
		im->params = calloc(1, sizeof(*im->params));
		if (!im->params)
			return ap__onnx_nomem(im);
	}
	if (im->params->n == im->params_cap) {
		int ncap = im->params_cap ? 2 * im->params_cap : 16;
		ap_host_tensor **p = realloc(im->params->items, (size_t)ncap * sizeof(*p));

		if (!p)
			return ap__onnx_nomem(im);
		im->params->items = p;
		im->params_cap = ncap;
	}
	im->params->items[im->params->n++] = t;
	return 0;
}

/* A known value v of `bytes` bytes as a graph tensor: a CONST holding its
 * data up to AP_CONST_MAX_BYTES, else a PARAM whose data moves to the
 * parameter store.  The tensor, or errors decoding v, AP_ENOMEM. */
static int materialise_known(imp *im, ival *v, int64_t bytes)
{
	const ap_host_tensor *d = ap__onnx_val_data(im, v);
	char name[NAME_CAP];
	int t;

	if (!d)
		return im->err ? im->err->code : AP_EINVAL;
	if (ap__onnx_uniq(im, &im->tnames, v->name, name) < 0)
		return AP_ENOMEM;
	if (bytes >= 0 && bytes <= AP_CONST_MAX_BYTES) {
		t = ap_graph_add_tensor(im->g, name, d->dtype, d->rank, d->dims, AP_TENSOR_CONST,
					d->data, d->nbytes);
	} else {
		ap_host_tensor *p = v->data;
		char *pn = ap_strdup(name);

		if (!pn)
			return ap__onnx_nomem(im);
		free(p->name);
		p->name = pn;
		t = ap_graph_add_tensor(im->g, name, p->dtype, p->rank, p->dims, AP_TENSOR_PARAM,
					NULL, 0);
		if (t >= 0) {
			if (add_param(im, p) < 0)
				return AP_ENOMEM;
			v->data = NULL;
		}
	}
	if (t < 0)
		return ap__onnx_nomem(im);
	v->tensor = t;
	return t;
}

/* A fill v (every element one value) as a graph tensor: an Expand of a
 * scalar CONST to v's shape.  The tensor, or AP_ENOMEM. */
static int materialise_fill(imp *im, ival *v)
{
	ival *s = ap__onnx_scalar_val(im, v->name, v->sh.dtype, v->fill_f, v->fill_i);
	char name[NAME_CAP];
	int st, out;

	if (!s)
		return AP_ENOMEM;
	st = ap__onnx_materialise(im, s);
	if (st < 0)
		return st;
	if (ap__onnx_uniq(im, &im->tnames, v->name, name) < 0)
		return AP_ENOMEM;
	out = ap_graph_add_tensor(im->g, name, v->sh.dtype, v->sh.rank, v->sh.dims,
				  AP_TENSOR_VALUE, NULL, 0);
	if (out < 0)
		return ap__onnx_nomem(im);
	if (ap__onnx_emit_node(im, v->name, AP_OP_EXPAND, NULL, 0, 1, &st, 1, &out) < 0)
		return AP_ENOMEM;
	v->tensor = out;
	return out;
}

/* The graph tensor of v, creating it on first use: a weight of a
 * structure-only import becomes a PARAM from its dims and dtype, a known
 * value a CONST or PARAM (materialise_known), a fill an Expand
 * (materialise_fill).  AP_EUNSUPPORTED for a poisoned value or a dtype
 * graphs do not have. */
int ap__onnx_materialise(imp *im, ival *v)
{
	char name[NAME_CAP];
	int64_t bytes;
	int t;

	if (v->poison)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, v->name,
				     "'%s' (%s of node '%s') is not supported", v->name, v->poison,
				     v->poison_node);
	if (v->tensor >= 0)
		return v->tensor;
	if (!graph_dtype(v->sh.dtype))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, v->name,
				     "constant '%s' has dtype %s, which Apollo does not compute with "
				     "(float32, float64, int32, int64, bool)", v->name,
				     ap_dtype_name(v->sh.dtype));
	bytes = sh_bytes(&v->sh);
	if (im->shape_only && !v->data && v->lazy && (bytes < 0 || bytes > AP_CONST_MAX_BYTES)) {
		/* a weight: its dims and dtype are the PARAM (ap_onnx_skeleton) */
		if (ap__onnx_uniq(im, &im->tnames, v->name, name) < 0)
			return AP_ENOMEM;
		t = ap_graph_add_tensor(im->g, name, v->sh.dtype, v->sh.rank, v->sh.dims,
					AP_TENSOR_PARAM, NULL, 0);
		if (t < 0)
			return ap__onnx_nomem(im);
		v->tensor = t;
		return t;
	}
	if (known(v))
		return materialise_known(im, v, bytes);
	if (v->fill)
		return materialise_fill(im, v);
	return ap__onnx_fail(im, AP_EINTERNAL, v->name,
			     "value '%s' has neither data nor a producer", v->name);
}

/* Adds a node with a unique name derived from `base` and copies attrs. */
int ap__onnx_emit_node(imp *im, const char *base, ap_op op, const ap_attr *attrs, int n_attrs,
		       int n_in, const int *ins, int n_out, const int *outs)
{
	char name[NAME_CAP];
	int n, rc = 0;

	if (ap__onnx_uniq(im, &im->nnames, base, name) < 0)
		return AP_ENOMEM;
	n = ap_graph_add_node(im->g, name, op, n_in, ins, n_out, outs);
	if (n < 0)
		return ap__onnx_nomem(im);
	for (int a = 0; a < n_attrs && rc == 0; a++) {
		const ap_attr *at = &attrs[a];

		switch (at->type) {
		case AP_ATTR_INT: rc = ap_node_set_int(im->g, n, at->name, at->i); break;
		case AP_ATTR_FLOAT: rc = ap_node_set_float(im->g, n, at->name, at->f); break;
		case AP_ATTR_STRING: rc = ap_node_set_string(im->g, n, at->name, at->s); break;
		case AP_ATTR_INTS:
			rc = ap_node_set_ints(im->g, n, at->name, at->ints, at->n_ints);
			break;
		case AP_ATTR_FLOATS:
			rc = ap_node_set_floats(im->g, n, at->name, at->floats, at->n_floats);
			break;
		}
	}
	return rc < 0 ? ap__onnx_nomem(im) : n;
}

/* ---- emit: one normalised node, folded or added ------------------------------- */

/* Elements the reference evaluator visits for `op` (an estimate, to bound
 * folding): multiply-adds for the contractions and windows, the elements
 * read and written otherwise.  Saturates at INT64_MAX / 2. */
static int64_t fold_work(ap_op op, const abuf *A, int n_in, ival *const *ins, int n_out,
			 const ap_shape *out)
{
	int64_t w = 0, per = 1;
	const int64_t cap = INT64_MAX / 2;

	for (int k = 0; k < n_out; k++)
		w += sh_numel(&out[k]) > 0 ? sh_numel(&out[k]) : 0;
	switch (op) {
	case AP_OP_MATMUL:
		per = ins[0]->sh.rank ? ins[0]->sh.dims[ins[0]->sh.rank - 1] : 1;
		break;
	case AP_OP_GEMM:
		per = ins[0]->sh.dims[0] * ins[0]->sh.dims[1] / (out[0].dims[0] ? out[0].dims[0] : 1);
		break;
	case AP_OP_CONV: case AP_OP_CONV_TRANSPOSE:
		/* every weight against every output element (the evaluator's loops) */
		per = sh_numel(&ins[1]->sh);
		if (op == AP_OP_CONV_TRANSPOSE && sh_numel(&out[0]) > 0)
			per = per * sh_numel(&ins[0]->sh) / sh_numel(&out[0]);
		break;
	case AP_OP_MAX_POOL: case AP_OP_AVERAGE_POOL: case AP_OP_LRN:
		for (int i = 0; A && i < A->n; i++)
			if (!strcmp(A->a[i].name, "kernel_shape"))
				for (int d = 0; d < A->a[i].n_ints; d++)
					per *= A->a[i].ints[d] > 0 ? A->a[i].ints[d] : 1;
		if (op == AP_OP_LRN)
			per = 16;
		break;
	default:
		break;
	}
	if (per > 1 && w > cap / per)
		return cap;
	w *= per;
	for (int i = 0; i < n_in; i++) {
		int64_t m = ins[i] ? sh_numel(&ins[i]->sh) : 0;

		if (m > 0)
			w = w > cap - m ? cap : w + m;
	}
	return w;
}

/* A known value's data for the evaluator: its own, or a fill spelled out
 * into *tmp (freed by the caller).  NULL with the error set. */
static const ap_host_tensor *fold_input(imp *im, ival *v, ap_host_tensor **tmp)
{
	int64_t m;

	*tmp = NULL;
	if (!v->fill)
		return ap__onnx_val_data(im, v);
	*tmp = ap__host_tensor_new(v->name, v->sh.dtype, v->sh.rank, v->sh.dims);
	if (!*tmp) {
		ap__onnx_nomem(im);
		return NULL;
	}
	m = sh_numel(&v->sh);
	for (int64_t i = 0; i < m; i++) {
		void *d = (*tmp)->data;

		switch (v->sh.dtype) {
		case AP_DT_F32: ((float *)d)[i] = (float)v->fill_f; break;
		case AP_DT_F64: ((double *)d)[i] = v->fill_f; break;
		case AP_DT_I32: ((int32_t *)d)[i] = (int32_t)v->fill_i; break;
		case AP_DT_I64: ((int64_t *)d)[i] = v->fill_i; break;
		case AP_DT_I8: ((int8_t *)d)[i] = (int8_t)v->fill_i; break;
		case AP_DT_BOOL: ((uint8_t *)d)[i] = v->fill_i != 0; break;
		default: ((uint8_t *)d)[i] = (uint8_t)v->fill_i; break;
		}
	}
	return *tmp;
}

/* Whether a node may be folded, its output shapes inferred (out_sh):
 * every input known and readable (or a fill of at most FOLD_MAX_BYTES)
 * and not a weight, every output named and of at most FOLD_MAX_BYTES, and
 * the work within FOLD_MAX_WORK. */
static bool foldable(const imp *im, ap_op op, const abuf *A, int n_in, ival *const *ins,
		     int n_out, const char *const *out_names, const ap_shape *out_sh)
{
	for (int i = 0; i < n_in; i++) {
		const ival *v = ins[i];

		if (v && ((!readable(im, v) &&
			   !(v->fill && sh_bytes(&v->sh) >= 0 && sh_bytes(&v->sh) <= FOLD_MAX_BYTES)) ||
			  v->weight))
			return false;
	}
	for (int k = 0; k < n_out; k++) {
		int64_t b = sh_bytes(&out_sh[k]);

		if (!out_names[k] || !out_names[k][0] || b < 0 || b > FOLD_MAX_BYTES)
			return false;
	}
	return fold_work(op, A, n_in, ins, n_out, out_sh) <= FOLD_MAX_WORK;
}

/* Evaluates node nd on the data of its known inputs ins (ap__op_eval,
 * onnx_fold.c) into outputs of the inferred shapes out_sh: outs[k] become
 * known values.  0, or an error decoding an input, AP_ENOMEM, or the
 * evaluator's error; when that is AP_EUNSUPPORTED (a dtype or op it does
 * not handle) the error is cleared and *fallback set: the caller adds the
 * node instead. */
static int emit_fold(imp *im, const ap_node *nd, int n_in, ival *const *ins, int n_out,
		     const char *const *out_names, const ap_shape *out_sh, ival **outs,
		     bool *fallback)
{
	const ap_host_tensor *in_d[64];
	ap_host_tensor *out_d[64], *tmp[64];
	int rc = 0;

	memset(tmp, 0, sizeof(tmp));
	for (int i = 0; i < n_in && rc == 0; i++) {
		in_d[i] = ins[i] ? fold_input(im, ins[i], &tmp[i]) : NULL;
		if (ins[i] && !in_d[i])
			rc = im->err && im->err->code ? im->err->code : AP_EINVAL;
	}
	if (rc) {
		for (int i = 0; i < n_in; i++)
			ap_host_tensor_free(tmp[i]);
		return rc;
	}
	memset(out_d, 0, sizeof(out_d));
	for (int k = 0; k < n_out; k++) {
		out_d[k] = ap__host_tensor_new(out_names[k], out_sh[k].dtype, out_sh[k].rank,
					       out_sh[k].dims);
		if (!out_d[k])
			rc = ap__onnx_nomem(im);
	}
	if (rc == 0)
		rc = ap__op_eval(nd, in_d, n_in, out_d, n_out, im->err);
	if (rc == 0) {
		for (int k = 0; k < n_out; k++) {
			outs[k] = ap__onnx_const_val(im, out_names[k], out_d[k]);
			out_d[k] = NULL;
			if (!outs[k])
				rc = AP_ENOMEM;
		}
	}
	for (int k = 0; k < n_out; k++)
		ap_host_tensor_free(out_d[k]);
	for (int i = 0; i < n_in; i++)
		ap_host_tensor_free(tmp[i]);
	if (rc == AP_EUNSUPPORTED) {
		ap_error_clear(im->err);
		*fallback = true;
	}
	return rc;
}

/* Adds node nd to the graph: its inputs ins materialised, each named
 * output a new VALUE tensor of the inferred shape out_sh[k] (outs[k]).
 * AP_EUNSUPPORTED for an output of a dtype graphs do not have; the errors
 * of ap__onnx_materialise; AP_ENOMEM. */
static int emit_add(imp *im, const ap_node *nd, int n_in, ival *const *ins, int n_out,
		    const char *const *out_names, const ap_shape *out_sh, ival **outs)
{
	int tin[64], tout[64], rc;
	char name[NAME_CAP];

	for (int k = 0; k < n_out; k++)
		if (out_names[k] && out_names[k][0] && !graph_dtype(out_sh[k].dtype))
			return ap__onnx_fail(im, AP_EUNSUPPORTED, out_names[k],
					     "%s output '%s' would have dtype %s "
					     "(float32, float64, int32, int64, bool supported)",
					     ap_op_name(nd->op), out_names[k],
					     ap_dtype_name(out_sh[k].dtype));
	for (int i = 0; i < n_in; i++) {
		tin[i] = ins[i] ? ap__onnx_materialise(im, ins[i]) : -1;
		if (tin[i] < -1 || (ins[i] && tin[i] < 0))
			return tin[i];
	}
	for (int k = 0; k < n_out; k++) {
		tout[k] = -1;
		if (!out_names[k] || !out_names[k][0])
			continue;
		if (ap__onnx_uniq(im, &im->tnames, out_names[k], name) < 0)
			return AP_ENOMEM;
		tout[k] = ap_graph_add_tensor(im->g, name, out_sh[k].dtype, out_sh[k].rank,
					      out_sh[k].dims, AP_TENSOR_VALUE, NULL, 0);
		if (tout[k] < 0)
			return ap__onnx_nomem(im);
		outs[k] = ap__onnx_new_val(im, out_names[k]);
		if (!outs[k])
			return AP_ENOMEM;
		outs[k]->sh = out_sh[k];
		outs[k]->tensor = tout[k];
	}
	rc = ap__onnx_emit_node(im, im->node, nd->op, nd->attrs, nd->n_attrs, n_in, tin, n_out,
				tout);
	if (rc < 0)
		return rc;
	im->n_emitted++;
	return 0;
}

/* Lowers one normalised node: the node, its output shapes (ap__op_infer:
 * AP_ESHAPE, AP_EINVAL, AP_EUNSUPPORTED), then emit_fold when foldable,
 * emit_add when not or when the evaluator does not handle it.  AP_EUNSUPPORTED for
 * a poisoned input or more than 64 inputs or outputs. */
int ap__onnx_emit(imp *im, ap_op op, abuf *A, int n_in, ival *const *ins, int n_out,
		  const char *const *out_names, const ap_shape *given, ival **outs)
{
	ap_node nd;
	const ap_shape *in_sh[64];
	const char *in_names[64];
	ap_shape out_sh[64];
	int rc;

	if (n_in > 64 || n_out > 64)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "more than 64 inputs or outputs");
	memset(&nd, 0, sizeof(nd));
	nd.name = (char *)(im->node ? im->node : "");
	nd.op = op;
	nd.attrs = A ? A->a : NULL;
	nd.n_attrs = A ? A->n : 0;
	nd.n_inputs = n_in;
	nd.n_outputs = n_out;
	for (int i = 0; i < n_in; i++) {
		in_sh[i] = ins[i] ? &ins[i]->sh : NULL;
		in_names[i] = ins[i] ? ins[i]->name : NULL;
		if (ins[i] && ins[i]->poison)
			return ap__onnx_fail(im, AP_EUNSUPPORTED, ins[i]->name,
					     "'%s' (%s of node '%s') is not supported",
					     ins[i]->name, ins[i]->poison, ins[i]->poison_node);
	}
	for (int k = 0; k < n_out; k++) {
		if (given)
			out_sh[k] = given[k];
		else
			memset(&out_sh[k], 0, sizeof(out_sh[k]));
		outs[k] = NULL;
	}
	rc = ap__op_infer(&nd, in_sh, n_in, out_sh, n_out, in_names, im->err);
	if (rc < 0)
		return rc;
	if (foldable(im, op, A, n_in, ins, n_out, out_names, out_sh)) {
		bool fallback = false;

		rc = emit_fold(im, &nd, n_in, ins, n_out, out_names, out_sh, outs, &fallback);
		if (!fallback)
			return rc;
	}
	return emit_add(im, &nd, n_in, ins, n_out, out_names, out_sh, outs);
}

int ap__onnx_emit1(imp *im, ap_op op, abuf *A, int n_in, ival *const *ins, const char *out_name,
		   const ap_shape *given, ival **out)
{
	const char *names[1] = { out_name };

	return ap__onnx_emit(im, op, A, n_in, ins, 1, names, given, out);
}

/* x reshaped to (rank, dims); x itself when the shape is the same. */
int ap__onnx_reshape_to(imp *im, ival *x, int rank, const int64_t *dims, const char *out_name,
			ival **out)
{
	ap_shape s = x->sh;

	s.rank = rank;
	memcpy(s.dims, dims, (size_t)rank * sizeof(int64_t));
	if (rank == x->sh.rank && memcmp(dims, x->sh.dims, (size_t)rank * sizeof(int64_t)) == 0) {
		*out = x;
		return 0;
	}
	return ap__onnx_emit1(im, AP_OP_RESHAPE, NULL, 1, &x, out_name, &s, out);
}

/* x transposed by perm (rank values); x itself when perm is the identity. */
int ap__onnx_transpose_to(imp *im, ival *x, const int64_t *perm, const char *name, ival **out)
{
	bool ident = true;
	abuf A;

	for (int d = 0; d < x->sh.rank; d++)
		if (perm[d] != d)
			ident = false;
	if (ident) {
		*out = x;
		return 0;
	}
	A.n = 0;
	ab_ints(&A, "perm", perm, x->sh.rank);
	return ap__onnx_emit1(im, AP_OP_TRANSPOSE, &A, 1, &x, name, NULL, out);
}
