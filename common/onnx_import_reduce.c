/* onnx_import_reduce.c -- importers of the ONNX reductions and scans:
 * ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceSumSquare,
 * ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp (axes as an attribute
 * or, from opset 13 for ReduceSum and 18 for the others, an input);
 * Softmax and LogSoftmax (before opset 13 over every axis from `axis` on);
 * ArgMax, ArgMin; CumSum.  Semantics: the ONNX operator specification
 * (https://onnx.ai/onnx/operators/); axes are normalised to non-negative,
 * sorted ones (ops.def).
 */
#include "onnx_import_internal.h"

#include <string.h>

int ap__onnx_imp_reduce(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *x, *ax = NULL, *y;
	int64_t axes[AP_MAX_RANK * 2];
	int n_axes = 0;
	int64_t keep = ap__onnx_aint(n, "keepdims", 1);
	int64_t noop = ap__onnx_aint(n, "noop_with_empty_axes", 0);
	bool axes_input = op == AP_OP_REDUCE_SUM ? im->opset >= 13 : im->opset >= 18;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	if (axes_input) {
		TRY(ap__onnx_get_in(im, n, 1, false, &ax));
		if (ax)
			TRY(ap__onnx_get_ints(im, ax, "Reduce axes", axes, AP_MAX_RANK * 2,
					      &n_axes));
	} else {
		TRY(ap__onnx_aints(im, n, "axes", axes, AP_MAX_RANK * 2, &n_axes));
	}
	if (n_axes == 0 && noop) {
		/* no reduction: the input, or its elementwise part */
		ap_op e = op == AP_OP_REDUCE_SUM_SQUARE ? AP_OP_MUL :
			  (op == AP_OP_REDUCE_L1 || op == AP_OP_REDUCE_L2) ? AP_OP_ABS :
			  op == AP_OP_REDUCE_LOG_SUM ? AP_OP_LOG : AP_OP_IDENTITY;
		ival *pair[2] = { x, x };

		if (e == AP_OP_IDENTITY)
			return ap__onnx_bind(im, out_name(n, 0), x);
		TRY(ap__onnx_emit1(im, e, NULL, e == AP_OP_MUL ? 2 : 1, pair, out_name(n, 0), NULL,
				   &y));
		return ap__onnx_bind(im, out_name(n, 0), y);
	}
	if (n_axes == 0) {
		for (int d = 0; d < x->sh.rank; d++)
			axes[d] = d;
		n_axes = x->sh.rank;
	}
	TRY(ap__onnx_norm_axes(im, axes, &n_axes, x->sh.rank));
	if (n_axes == 0)
		return ap__onnx_bind(im, out_name(n, 0), x);
	ab_ints(&A, "axes", axes, n_axes);
	ab_int(&A, "keepdims", keep ? 1 : 0);
	TRY(ap__onnx_emit1(im, op, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_softmax(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *x, *y;
	int64_t axis, axes[AP_MAX_RANK];
	int n_axes = 0;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	if (x->sh.rank == 0)
		return ap__onnx_fail(im, AP_EINVAL, x->name, "%s of a scalar", n->op_type);
	TRY(ap__onnx_norm_axis(im, ap__onnx_aint(n, "axis", im->opset < 13 ? 1 : -1), x->sh.rank,
			       &axis));
	if (im->opset < 13)
		for (int d = (int)axis; d < x->sh.rank; d++)
			axes[n_axes++] = d;
	else
		axes[n_axes++] = axis;
	ab_ints(&A, "axes", axes, n_axes);
	TRY(ap__onnx_emit1(im, op, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_argext(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *x, *y;
	int64_t axis;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	TRY(ap__onnx_norm_axis(im, ap__onnx_aint(n, "axis", 0), x->sh.rank, &axis));
	ab_int(&A, "axis", axis);
	ab_int(&A, "keepdims", ap__onnx_aint(n, "keepdims", 1) ? 1 : 0);
	ab_int(&A, "select_last_index", ap__onnx_aint(n, "select_last_index", 0) ? 1 : 0);
	TRY(ap__onnx_emit1(im, op, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_cumsum(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *av, *y;
	double a;
	int64_t axis;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	TRY(ap__onnx_get_in(im, n, 1, true, &av));
	TRY(ap__onnx_get_scalar(im, av, "CumSum axis", &a));
	TRY(ap__onnx_norm_axis(im, (int64_t)a, x->sh.rank, &axis));
	ab_int(&A, "axis", axis);
	ab_int(&A, "exclusive", ap__onnx_aint(n, "exclusive", 0) ? 1 : 0);
	ab_int(&A, "reverse", ap__onnx_aint(n, "reverse", 0) ? 1 : 0);
	TRY(ap__onnx_emit1(im, AP_OP_CUM_SUM, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}
