/* scalar.c -- the per-op scalar semantics every emitter shares: what one
 * element of an elementwise or broadcast op, or one step of a reduction,
 * computes, as kernel IR expressions (see value.h).
 *
 * Numerics follow the ONNX reference semantics (onnx/reference, the
 * operator specifications of ONNX 1.16): Max/Min/Relu/ReduceMax propagate
 * NaN, Softplus and Mish are evaluated without overflow, integer division
 * and modulo never trap (a zero divisor gives 0), Mod with fmod=0 takes the
 * divisor's sign, Pow uses powf (negative bases with integral exponents are
 * exact).
 */
#include "value.h"

#include <math.h>
#include <string.h>

bool ap_dtype_is_float(ap_dtype t)
{
	return ap_dtype_is_floating(t);
}

ap_dtype ap_acc_type(ap_dtype t)
{
	return t == AP_DT_F16 || t == AP_DT_BF16 ? AP_DT_F32 : t;
}

/* ---- helpers ------------------------------------------------------------------ */

ap_kir_expr *ap_v_const(ap_vctx *v, ap_dtype t, double x)
{
	return ap_kir_const(v->k, t, x);
}

static ap_kir_expr *C(ap_vctx *v, ap_dtype t, double x)
{
	return ap_kir_const(v->k, t, x);
}

static ap_kir_expr *bin(ap_vctx *v, ap_kir_binop op, ap_kir_expr *a, ap_kir_expr *b)
{
	return ap_kir_binary(v->k, op, a, b);
}

static ap_kir_expr *sel(ap_vctx *v, ap_kir_expr *c, ap_kir_expr *a, ap_kir_expr *b)
{
	return ap_kir_select(v->k, c, a, b);
}

static ap_kir_expr *fn1(ap_vctx *v, ap_kir_fn f, ap_kir_expr *a)
{
	return ap_kir_call(v->k, f, a, NULL);
}

/* Binds an intermediate so it is evaluated once. */
static ap_kir_expr *once(ap_vctx *v, ap_kir_expr *e)
{
	return e ? ap_kir_bind(v->k, v->cur, e->type, "s", e) : NULL;
}

/* NaN-propagating maximum / minimum for floats (a NaN operand gives a
 * NaN), plain for integers.  Written a != a ? a : (a > b ? a : b): the
 * inner select is exactly x86's maxss / minss (the second operand when
 * either is NaN), so host compilers emit it without a branch, and the
 * NaN test is a branch real data always takes the same way; the form
 * (a > b || a != a) ? a : b compiled to a data-dependent branch, 5x
 * slower on a max pooling of random data. */
ap_kir_expr *ap_v_max(ap_vctx *v, ap_kir_expr *a, ap_kir_expr *b)
{
	if (!a || !b)
		return NULL;
	if (!ap_dtype_is_float(a->type))
		return bin(v, AP_KIR_MAX, a, b);
	return sel(v, bin(v, AP_KIR_NE, a, a), a, sel(v, bin(v, AP_KIR_GT, a, b), a, b));
}

ap_kir_expr *ap_v_min(ap_vctx *v, ap_kir_expr *a, ap_kir_expr *b)
{
	if (!a || !b)
		return NULL;
	if (!ap_dtype_is_float(a->type))
		return bin(v, AP_KIR_MIN, a, b);
	return sel(v, bin(v, AP_KIR_NE, a, a), a, sel(v, bin(v, AP_KIR_LT, a, b), a, b));
}

double ap_dtype_lowest(ap_dtype t)
{
	switch (t) {
	case AP_DT_F32: case AP_DT_F64: case AP_DT_F16: case AP_DT_BF16: return -INFINITY;
	case AP_DT_I64: return -9.2233720368547758e18;
	case AP_DT_I32: return -2147483648.0;
	case AP_DT_I8: return -128;
	default: return 0;
	}
}

double ap_dtype_highest(ap_dtype t)
{
	switch (t) {
	case AP_DT_F32: case AP_DT_F64: case AP_DT_F16: case AP_DT_BF16: return INFINITY;
	case AP_DT_I64: return 9.2233720368547758e18;
	case AP_DT_I32: return 2147483647.0;
	case AP_DT_I8: return 127;
	case AP_DT_U8: return 255;
	default: return 1;
	}
}

ap_kir_expr *ap_v_reduce_identity(ap_vctx *v, ap_op op, ap_dtype t)
{
	switch (op) {
	case AP_OP_REDUCE_MAX: return C(v, t, ap_dtype_lowest(t));
	case AP_OP_REDUCE_MIN: return C(v, t, ap_dtype_highest(t));
	case AP_OP_REDUCE_PROD: return C(v, t, 1);
	default: return C(v, t, 0);
	}
}

ap_kir_expr *ap_v_reduce_combine(ap_vctx *v, ap_op op, ap_kir_expr *acc, ap_kir_expr *x)
{
	switch (op) {
	case AP_OP_REDUCE_MAX: return ap_v_max(v, x, acc);
	case AP_OP_REDUCE_MIN: return ap_v_min(v, x, acc);
	case AP_OP_REDUCE_PROD: return bin(v, AP_KIR_MUL, acc, x);
	default: return bin(v, AP_KIR_ADD, acc, x);
	}
}

static ap_kir_expr *softplus(ap_vctx *v, ap_kir_expr *x)
{
	ap_dtype t = x->type;

	/* max(x, 0) + log1p(exp(-|x|)): never overflows */
	return bin(v, AP_KIR_ADD, sel(v, bin(v, AP_KIR_GT, x, C(v, t, 0)), x, C(v, t, 0)),
		   fn1(v, AP_KIR_LOG1P, fn1(v, AP_KIR_EXP, ap_kir_unary(v->k, AP_KIR_NEG,
									fn1(v, AP_KIR_FABS, x)))));
}

/* Integer divisor that is never 0 (0 -> 1; the result is then masked). */
static ap_kir_expr *safe_div(ap_vctx *v, ap_kir_binop op, ap_kir_expr *a, ap_kir_expr *b)
{
	ap_dtype t = a->type;
	ap_kir_expr *zero = bin(v, AP_KIR_EQ, b, C(v, t, 0));
	ap_kir_expr *d = sel(v, zero, C(v, t, 1), b);

	if (t == AP_DT_I64 || t == AP_DT_I32)   /* INT_MIN / -1 traps too */
		d = sel(v, bin(v, AP_KIR_EQ, d, C(v, t, -1)), C(v, t, 1), d);
	ap_kir_expr *q = bin(v, op, a, d);

	if (t == AP_DT_I64 || t == AP_DT_I32)
		q = sel(v, bin(v, AP_KIR_EQ, b, C(v, t, -1)),
			op == AP_KIR_DIV ? ap_kir_unary(v->k, AP_KIR_NEG, a) : C(v, t, 0), q);
	return sel(v, zero, C(v, t, 0), q);
}

/* ---- elementwise and broadcast ops ---------------------------------------------------- */

/* IsInf: x == +inf and / or x == -inf as the attributes detect_positive
 * and detect_negative ask (both by default; neither: false). */
static ap_kir_expr *is_inf(ap_vctx *v, const ap_node *node, ap_kir_expr *x)
{
	ap_dtype t = x->type;
	bool neg = ap_node_int(node, "detect_negative", 1) != 0;
	bool pos = ap_node_int(node, "detect_positive", 1) != 0;
	ap_kir_expr *p = bin(v, AP_KIR_EQ, x, C(v, t, INFINITY));
	ap_kir_expr *n = bin(v, AP_KIR_EQ, x, C(v, t, -INFINITY));

	if (neg && pos)
		return bin(v, AP_KIR_LOR, p, n);
	return neg ? n : pos ? p : ap_kir_int(v->k, AP_DT_BOOL, 0);
}

/* Shrink: x + bias below -lambd, x - bias above lambd, 0 between. */
static ap_kir_expr *shrink(ap_vctx *v, const ap_node *node, ap_kir_expr *x)
{
	ap_dtype t = x->type;
	double bias = ap_node_float(node, "bias", 0.0), l = ap_node_float(node, "lambd", 0.5);

	return sel(v, bin(v, AP_KIR_LT, x, C(v, t, -l)), bin(v, AP_KIR_ADD, x, C(v, t, bias)),
		   sel(v, bin(v, AP_KIR_GT, x, C(v, t, l)), bin(v, AP_KIR_SUB, x, C(v, t, bias)),
		       C(v, t, 0)));
}

/* The rectifiers with a negative branch: LeakyRelu (alpha * x), Elu
 * (alpha * (exp(x) - 1)) and Selu (gamma * (alpha * exp(x) - alpha),
 * gamma * x above 0), the ONNX defaults for alpha and gamma. */
static ap_kir_expr *leaky_or_elu(ap_vctx *v, const ap_node *node, ap_kir_expr *x)
{
	ap_dtype t = x->type;

	if (node->op == AP_OP_LEAKY_RELU) {
		double a = ap_node_float(node, "alpha", 0.01);

		return sel(v, bin(v, AP_KIR_LT, x, C(v, t, 0)), bin(v, AP_KIR_MUL, C(v, t, a), x), x);
	}
	if (node->op == AP_OP_ELU) {
		double a = ap_node_float(node, "alpha", 1.0);

		return sel(v, bin(v, AP_KIR_LT, x, C(v, t, 0)),
			   bin(v, AP_KIR_MUL, C(v, t, a),
			       bin(v, AP_KIR_SUB, fn1(v, AP_KIR_EXP, x), C(v, t, 1))), x);
	}
	{
		double a = ap_node_float(node, "alpha", 1.67326319217681884765625);
		double gm = ap_node_float(node, "gamma", 1.05070102214813232421875);

		return sel(v, bin(v, AP_KIR_LE, x, C(v, t, 0)),
			   bin(v, AP_KIR_MUL, C(v, t, gm),
			       bin(v, AP_KIR_SUB, bin(v, AP_KIR_MUL, C(v, t, a), fn1(v, AP_KIR_EXP, x)),
				   C(v, t, a))),
			   bin(v, AP_KIR_MUL, C(v, t, gm), x));
	}
}

/* HardSigmoid: h = clamp(alpha * x + beta, 0, 1); HardSwish: x * h with
 * alpha = 1/6, beta = 1/2. */
static ap_kir_expr *hard_sigmoid(ap_vctx *v, const ap_node *node, ap_kir_expr *x)
{
	ap_dtype t = x->type;
	bool swish = node->op == AP_OP_HARD_SWISH;
	double a = swish ? 1.0 / 6.0 : ap_node_float(node, "alpha", 0.2);
	double b = swish ? 0.5 : ap_node_float(node, "beta", 0.5);
	ap_kir_expr *h = once(v, bin(v, AP_KIR_ADD, bin(v, AP_KIR_MUL, C(v, t, a), x), C(v, t, b)));

	h = sel(v, bin(v, AP_KIR_LT, h, C(v, t, 0)), C(v, t, 0),
		sel(v, bin(v, AP_KIR_GT, h, C(v, t, 1)), C(v, t, 1), h));
	return swish ? bin(v, AP_KIR_MUL, x, h) : h;
}

/* Gelu: 0.5 x (1 + erf(x / sqrt(2))), or with approximate = "tanh"
 * 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). */
static ap_kir_expr *gelu(ap_vctx *v, const ap_node *node, ap_kir_expr *x)
{
	ap_dtype t = x->type;
	const char *ap = ap_node_string(node, "approximate", "none");
	ap_kir_expr *inner;

	if (strcmp(ap, "tanh") == 0) {
		ap_kir_expr *x3 = bin(v, AP_KIR_MUL, bin(v, AP_KIR_MUL, x, x), x);

		inner = fn1(v, AP_KIR_TANH,
			    bin(v, AP_KIR_MUL, C(v, t, 0.7978845608028654),
				bin(v, AP_KIR_ADD, x, bin(v, AP_KIR_MUL, C(v, t, 0.044715), x3))));
	} else {
		inner = fn1(v, AP_KIR_ERF, bin(v, AP_KIR_MUL, x, C(v, t, 0.7071067811865476)));
	}
	return bin(v, AP_KIR_MUL, bin(v, AP_KIR_MUL, C(v, t, 0.5), x),
		   bin(v, AP_KIR_ADD, C(v, t, 1), inner));
}

/* Clip to the attributes min and max (a bound the type cannot pass is
 * left out). */
static ap_kir_expr *clip(ap_vctx *v, const ap_node *node, ap_kir_expr *x)
{
	ap_dtype t = x->type;
	double lo = ap_node_float(node, "min", -INFINITY), hi = ap_node_float(node, "max", INFINITY);
	ap_kir_expr *c = x;

	if (lo > ap_dtype_lowest(t))
		c = once(v, sel(v, bin(v, AP_KIR_LT, c, C(v, t, lo)), C(v, t, lo), c));
	if (hi < ap_dtype_highest(t))
		c = sel(v, bin(v, AP_KIR_GT, c, C(v, t, hi)), C(v, t, hi), c);
	return c;
}

/* The unary ops defined on integers (and bool) as well as floats. */
static bool unary_on_ints(ap_op op)
{
	switch (op) {
	case AP_OP_IDENTITY: case AP_OP_NEG: case AP_OP_ABS: case AP_OP_SIGN:
	case AP_OP_RELU: case AP_OP_NOT: case AP_OP_CAST: case AP_OP_CLIP:
		return true;
	default:
		return false;
	}
}

/* One element of an elementwise op on x (Cast converts to `out`), see
 * value.h; NULL (the context failed) for an op with no lowering here or
 * an integer x where only floats are defined. */
ap_kir_expr *ap_v_unary(ap_vctx *v, const ap_node *node, ap_kir_expr *x, ap_dtype out)
{
	ap_kir_kernel *k = v->k;
	ap_dtype t;

	if (!x)
		return NULL;
	t = x->type;
	if (!ap_dtype_is_float(t) && !unary_on_ints(node->op))
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "dtype %s", ap_dtype_name(t));
	switch (node->op) {
	case AP_OP_IDENTITY: return x;
	case AP_OP_NEG: return ap_kir_unary(k, AP_KIR_NEG, x);
	case AP_OP_ABS:
		return ap_dtype_is_float(t) ? fn1(v, AP_KIR_FABS, x)
				   : sel(v, bin(v, AP_KIR_LT, x, C(v, t, 0)), ap_kir_unary(k, AP_KIR_NEG, x), x);
	case AP_OP_EXP: return fn1(v, AP_KIR_EXP, x);
	case AP_OP_LOG: return fn1(v, AP_KIR_LOG, x);
	case AP_OP_SQRT: return fn1(v, AP_KIR_SQRT, x);
	case AP_OP_RECIPROCAL: return bin(v, AP_KIR_DIV, C(v, t, 1), x);
	case AP_OP_TANH: return fn1(v, AP_KIR_TANH, x);
	case AP_OP_SIGMOID:
		return bin(v, AP_KIR_DIV, C(v, t, 1),
			   bin(v, AP_KIR_ADD, C(v, t, 1),
			       fn1(v, AP_KIR_EXP, ap_kir_unary(k, AP_KIR_NEG, x))));
	case AP_OP_RELU: return sel(v, bin(v, AP_KIR_LT, x, C(v, t, 0)), C(v, t, 0), x);
	case AP_OP_ERF: return fn1(v, AP_KIR_ERF, x);
	case AP_OP_SIGN:
		return sel(v, bin(v, AP_KIR_GT, x, C(v, t, 0)), C(v, t, 1),
			   sel(v, bin(v, AP_KIR_LT, x, C(v, t, 0)), C(v, t, -1),
			       ap_dtype_is_float(t) ? bin(v, AP_KIR_MUL, x, C(v, t, 0)) : C(v, t, 0)));
	case AP_OP_SIN: return fn1(v, AP_KIR_SIN, x);
	case AP_OP_COS: return fn1(v, AP_KIR_COS, x);
	case AP_OP_IS_NAN: return bin(v, AP_KIR_NE, x, x);
	case AP_OP_IS_INF: return is_inf(v, node, x);
	case AP_OP_SHRINK: return shrink(v, node, x);
	case AP_OP_FLOOR: return fn1(v, AP_KIR_FLOOR, x);
	case AP_OP_CEIL: return fn1(v, AP_KIR_CEIL, x);
	case AP_OP_NOT: return ap_kir_unary(k, AP_KIR_LNOT, x);
	case AP_OP_SOFTSIGN:
		return bin(v, AP_KIR_DIV, x, bin(v, AP_KIR_ADD, C(v, t, 1), fn1(v, AP_KIR_FABS, x)));
	case AP_OP_CAST:
		return ap_kir_cast(k, out, x);
	case AP_OP_LEAKY_RELU:
	case AP_OP_ELU:
	case AP_OP_SELU:
		return leaky_or_elu(v, node, x);
	case AP_OP_HARD_SIGMOID:
	case AP_OP_HARD_SWISH:
		return hard_sigmoid(v, node, x);
	case AP_OP_SOFTPLUS:
		return softplus(v, x);
	case AP_OP_MISH:
		return bin(v, AP_KIR_MUL, x, fn1(v, AP_KIR_TANH, once(v, softplus(v, x))));
	case AP_OP_GELU:
		return gelu(v, node, x);
	case AP_OP_CLIP:
		return clip(v, node, x);
	default:
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "not an elementwise op");
	}
}

ap_kir_expr *ap_v_binary(ap_vctx *v, const ap_node *node, ap_kir_expr *a, ap_kir_expr *b)
{
	ap_dtype t;

	if (!a || !b)
		return NULL;
	t = a->type;
	switch (node->op) {
	case AP_OP_ADD: return bin(v, AP_KIR_ADD, a, b);
	case AP_OP_SUB: return bin(v, AP_KIR_SUB, a, b);
	case AP_OP_MUL: return bin(v, AP_KIR_MUL, a, b);
	case AP_OP_DIV:
		return ap_dtype_is_float(t) ? bin(v, AP_KIR_DIV, a, b) : safe_div(v, AP_KIR_DIV, a, b);
	case AP_OP_POW:
		if (ap_dtype_is_float(t))
			return ap_kir_call(v->k, AP_KIR_POW, a, ap_kir_cast(v->k, t, b));
		return ap_kir_cast(v->k, t, ap_kir_call(v->k, AP_KIR_POW, ap_kir_cast(v->k, AP_DT_F64, a),
							 ap_kir_cast(v->k, AP_DT_F64, b)));
	case AP_OP_MAX: return ap_v_max(v, a, b);
	case AP_OP_MIN: return ap_v_min(v, a, b);
	case AP_OP_PRELU:
		return sel(v, bin(v, AP_KIR_LT, a, C(v, t, 0)), bin(v, AP_KIR_MUL, b, a), a);
	case AP_OP_MOD: {
		bool fmod_ = ap_node_int(node, "fmod", 0) != 0;
		ap_kir_expr *r;

		if (ap_dtype_is_float(t))
			r = ap_kir_call(v->k, AP_KIR_FMOD, a, b);
		else
			r = safe_div(v, AP_KIR_REM, a, b);
		if (fmod_)
			return r;
		r = once(v, r);
		/* Python's sign rule: a nonzero remainder takes the divisor's sign */
		return sel(v, bin(v, AP_KIR_LAND, bin(v, AP_KIR_NE, r, C(v, t, 0)),
				  bin(v, AP_KIR_NE, bin(v, AP_KIR_LT, r, C(v, t, 0)),
				      bin(v, AP_KIR_LT, b, C(v, t, 0)))),
			   bin(v, AP_KIR_ADD, r, b), r);
	}
	case AP_OP_EQUAL: return bin(v, AP_KIR_EQ, a, b);
	case AP_OP_LESS: return bin(v, AP_KIR_LT, a, b);
	case AP_OP_GREATER: return bin(v, AP_KIR_GT, a, b);
	case AP_OP_LESS_OR_EQUAL: return bin(v, AP_KIR_LE, a, b);
	case AP_OP_GREATER_OR_EQUAL: return bin(v, AP_KIR_GE, a, b);
	case AP_OP_AND: return bin(v, AP_KIR_LAND, a, b);
	case AP_OP_OR: return bin(v, AP_KIR_LOR, a, b);
	case AP_OP_XOR: return bin(v, AP_KIR_NE, ap_kir_cast(v->k, AP_DT_BOOL, a),
				   ap_kir_cast(v->k, AP_DT_BOOL, b));
	default:
		return ap_v_fail(v, AP_EUNSUPPORTED, node, "not a binary op");
	}
}

