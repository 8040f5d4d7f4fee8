/* onnx_import_elementwise.c -- importers of the elementwise ONNX ops:
 * the unary table of onnx_import.c (Neg, Abs, Exp, ..., IsNaN) and
 * LeakyRelu, Elu, Selu, HardSigmoid, Gelu (their attributes); Cast,
 * CastLike; Clip (bounds as attributes before opset 11, as inputs after:
 * constant bounds become attributes, run-time ones a Max then a Min); the
 * binary table (Add, ..., Xor, PRelu, Mod), legacy broadcast=1 (opset < 7)
 * made a Reshape of B; Sum, Mean, Max, Min as chains of binary nodes;
 * Where; IsInf; Shrink; Trilu.  Semantics: the ONNX operator specification
 * (https://onnx.ai/onnx/operators/), one normalised node each (ops.def).
 */
#include "onnx_import_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int ap__onnx_imp_unary(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *x, *y;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	switch (op) {
	case AP_OP_LEAKY_RELU: ab_float(&A, "alpha", ap__onnx_afloat(n, "alpha", 0.01)); break;
	case AP_OP_ELU: ab_float(&A, "alpha", ap__onnx_afloat(n, "alpha", 1.0)); break;
	case AP_OP_SELU:
		ab_float(&A, "alpha", ap__onnx_afloat(n, "alpha", 1.67326319217681884765625));
		ab_float(&A, "gamma", ap__onnx_afloat(n, "gamma", 1.05070102214813232421875));
		break;
	case AP_OP_HARD_SIGMOID:
		ab_float(&A, "alpha", ap__onnx_afloat(n, "alpha", 0.2));
		ab_float(&A, "beta", ap__onnx_afloat(n, "beta", 0.5));
		break;
	case AP_OP_GELU: {
		char buf[32];
		const char *s = ap__onnx_astr(n, "approximate", "none", buf, sizeof(buf));

		if (strcmp(s, "none") && strcmp(s, "tanh"))
			return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "Gelu: approximate='%s'",
					     s);
		ab_str(&A, "approximate", strcmp(s, "tanh") == 0 ? "tanh" : "none");
		break;
	}
	default:
		break;
	}
	TRY(ap__onnx_emit1(im, op, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_cast(imp *im, const Onnx__NodeProto *n, bool like)
{
	ival *x, *t = NULL, *y;
	int64_t to;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	if (like) {
		TRY(ap__onnx_get_in(im, n, 1, true, &t));
		to = t->sh.dtype;
	} else {
		to = ap__onnx_aint(n, "to", 0);
	}
	if (!ap_dtype_in_graphs((ap_dtype)to))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL,
				     "%s to ONNX data type %lld is not supported", n->op_type,
				     (long long)to);
	if (to == x->sh.dtype)
		return ap__onnx_bind(im, out_name(n, 0), x);
	ab_int(&A, "to", to);
	TRY(ap__onnx_emit1(im, AP_OP_CAST, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_clip(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *mn = NULL, *mx = NULL, *y;
	double lo = -INFINITY, hi = INFINITY;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	if (im->opset < 11) {
		lo = ap__onnx_afloat(n, "min", -INFINITY);
		hi = ap__onnx_afloat(n, "max", INFINITY);
	} else {
		TRY(ap__onnx_get_in(im, n, 1, false, &mn));
		TRY(ap__onnx_get_in(im, n, 2, false, &mx));
		if ((mn && !known(mn)) || (mx && !known(mx))) {
			/* bounds computed at run time: Max then Min */
			ival *t = x, *pair[2];
			char nm[NAME_CAP];

			if (mn) {
				pair[0] = t;
				pair[1] = mn;
				snprintf(nm, sizeof(nm), "%s_lo", out_name(n, 0));
				TRY(ap__onnx_emit1(im, AP_OP_MAX, NULL, 2, pair,
						   mx ? nm : out_name(n, 0), NULL, &t));
			}
			if (mx) {
				pair[0] = t;
				pair[1] = mx;
				TRY(ap__onnx_emit1(im, AP_OP_MIN, NULL, 2, pair, out_name(n, 0),
						   NULL, &t));
			}
			return ap__onnx_bind(im, out_name(n, 0), t);
		}
		if (mn)
			TRY(ap__onnx_get_scalar(im, mn, "Clip min", &lo));
		if (mx)
			TRY(ap__onnx_get_scalar(im, mx, "Clip max", &hi));
	}
	ab_float(&A, "min", lo);
	ab_float(&A, "max", hi);
	TRY(ap__onnx_emit1(im, AP_OP_CLIP, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

/* Legacy (opset < 7) broadcast=1 with `axis`: B's dims placed at axis of
 * A, padded with 1s, so that numpy broadcasting gives the old meaning. */
static int legacy_bcast(imp *im, const Onnx__NodeProto *n, ival *a, ival **b)
{
	const Onnx__AttributeProto *ax = ap__onnx_attr(n, "axis");
	int64_t axis, dims[AP_MAX_RANK];
	int ra = a->sh.rank, rb = (*b)->sh.rank;
	char nm[NAME_CAP];

	if (im->opset >= 7 || ap__onnx_aint(n, "broadcast", 0) != 1 || !ax)
		return 0;
	axis = ax->i;
	if (axis < 0)
		axis += ra;
	if (axis < 0 || axis + rb > ra)
		return ap__onnx_fail(im, AP_ESHAPE, (*b)->name,
				     "legacy broadcast: axis %lld does not fit B of "
				     "rank %d into A of rank %d", (long long)ax->i, rb, ra);
	for (int d = 0; d < ra; d++)
		dims[d] = (d >= axis && d < axis + rb) ? (*b)->sh.dims[d - axis] : 1;
	/* trailing 1s only matter when they are needed for alignment */
	snprintf(nm, sizeof(nm), "%s_bcast", (*b)->name);
	return ap__onnx_reshape_to(im, *b, (int)(ra - axis), dims + axis, nm, b);
}

int ap__onnx_imp_binary(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *ab[2], *y;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &ab[0]));
	TRY(ap__onnx_get_in(im, n, 1, true, &ab[1]));
	TRY(legacy_bcast(im, n, ab[0], &ab[1]));
	if (op == AP_OP_MOD)
		ab_int(&A, "fmod", ap__onnx_aint(n, "fmod", 0));
	if (op == AP_OP_PRELU && im->opset < 7 && ab[1]->sh.rank == 1 && ab[0]->sh.rank >= 2 &&
	    ab[1]->sh.dims[0] > 1 && ab[1]->sh.dims[0] == ab[0]->sh.dims[1]) {
		/* PRelu-6: one slope per channel (dim 1) */
		int64_t dims[AP_MAX_RANK];
		char nm[NAME_CAP];

		dims[0] = ab[1]->sh.dims[0];
		for (int d = 1; d < ab[0]->sh.rank - 1; d++)
			dims[d] = 1;
		snprintf(nm, sizeof(nm), "%s_bcast", ab[1]->name);
		TRY(ap__onnx_reshape_to(im, ab[1], ab[0]->sh.rank - 1, dims, nm, &ab[1]));
	}
	TRY(ap__onnx_emit1(im, op, &A, 2, ab, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

/* Sum / Mean / Max / Min: a chain of binary nodes. */
int ap__onnx_imp_variadic(imp *im, const Onnx__NodeProto *n, ap_op op, bool mean)
{
	ival *acc, *x, *pair[2];
	char nm[NAME_CAP];

	if (n->n_input == 0)
		return ap__onnx_fail(im, AP_EINVAL, NULL, "%s needs at least one input",
				     n->op_type);
	TRY(ap__onnx_get_in(im, n, 0, true, &acc));
	for (size_t i = 1; i < n->n_input; i++) {
		bool last = i + 1 == n->n_input && !mean;

		TRY(ap__onnx_get_in(im, n, i, true, &x));
		pair[0] = acc;
		pair[1] = x;
		snprintf(nm, sizeof(nm), "%s_%zu", out_name(n, 0), i);
		TRY(ap__onnx_emit1(im, op, NULL, 2, pair, last ? out_name(n, 0) : nm, NULL, &acc));
	}
	if (mean && n->n_input > 1) {
		ival *cnt = ap__onnx_scalar_val(im, "mean_count", acc->sh.dtype, (double)n->n_input,
						(int64_t)n->n_input);

		if (!cnt)
			return AP_ENOMEM;
		pair[0] = acc;
		pair[1] = cnt;
		TRY(ap__onnx_emit1(im, AP_OP_DIV, NULL, 2, pair, out_name(n, 0), NULL, &acc));
	}
	return ap__onnx_bind(im, out_name(n, 0), acc);
}

int ap__onnx_imp_where(imp *im, const Onnx__NodeProto *n)
{
	ival *in[3], *y;

	for (int i = 0; i < 3; i++)
		TRY(ap__onnx_get_in(im, n, (size_t)i, true, &in[i]));
	TRY(ap__onnx_emit1(im, AP_OP_WHERE, NULL, 3, in, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_is_inf(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *y;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	ab_int(&A, "detect_negative", ap__onnx_aint(n, "detect_negative", 1) ? 1 : 0);
	ab_int(&A, "detect_positive", ap__onnx_aint(n, "detect_positive", 1) ? 1 : 0);
	TRY(ap__onnx_emit1(im, AP_OP_IS_INF, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_shrink(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *y;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	ab_float(&A, "bias", ap__onnx_afloat(n, "bias", 0.0));
	ab_float(&A, "lambd", ap__onnx_afloat(n, "lambd", 0.5));
	TRY(ap__onnx_emit1(im, AP_OP_SHRINK, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_trilu(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *kv = NULL, *y;
	double k = 0;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	TRY(ap__onnx_get_in(im, n, 1, false, &kv));
	if (kv)
		TRY(ap__onnx_get_scalar(im, kv, "Trilu k", &k));
	ab_int(&A, "upper", ap__onnx_aint(n, "upper", 1) ? 1 : 0);
	ab_int(&A, "k", (int64_t)k);
	TRY(ap__onnx_emit1(im, AP_OP_TRILU, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}
