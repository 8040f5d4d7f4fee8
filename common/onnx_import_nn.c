/* onnx_import_nn.c -- importers of the neural-network layers of ONNX:
 * Conv, ConvTranspose (auto_pad, output_shape and output_padding resolved
 * to explicit pads), MaxPool, AveragePool, GlobalAveragePool and
 * GlobalMaxPool (as reductions), LayerNormalization, BatchNormalization
 * (inference and training mode), InstanceNormalization, LRN, MatMul, Gemm,
 * Dropout (inference only: the identity).  Semantics: the ONNX operator
 * specification (https://onnx.ai/onnx/operators/), e.g.
 * https://onnx.ai/onnx/operators/onnx__Conv.html for the window rules.
 */
#include "onnx_import_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int ap__onnx_imp_layer_norm(imp *im, const Onnx__NodeProto *n)
{
	ival *in[3], *outs[3];
	const char *names[3] = { out_name(n, 0), out_name(n, 1), out_name(n, 2) };
	int64_t axis;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &in[0]));
	TRY(ap__onnx_get_in(im, n, 1, true, &in[1]));
	TRY(ap__onnx_get_in(im, n, 2, false, &in[2]));
	TRY(ap__onnx_norm_axis(im, ap__onnx_aint(n, "axis", -1), in[0]->sh.rank, &axis));
	ab_int(&A, "axis", axis);
	ab_float(&A, "epsilon", ap__onnx_afloat(n, "epsilon", 1e-5));
	TRY(ap__onnx_emit(im, AP_OP_LAYER_NORM, &A, in[2] ? 3 : 2, in,
			  n->n_output < 3 ? (int)n->n_output : 3, names, NULL, outs));
	for (size_t k = 0; k < n->n_output && k < 3; k++)
		if (outs[k])
			TRY(ap__onnx_bind(im, names[k], outs[k]));
	return 0;
}

/* BatchNormalization.  Training mode is training_mode=1 at opset 14+; for
 * older opsets it is what the outputs say (ONNX's "output case #1": Y,
 * mean, var, saved_mean, saved_var), and at opset < 7 an explicit is_test
 * decides.  Training mode keeps Y, the running mean and the running var
 * (ops.def); the legacy saved_mean / saved_var outputs are refused if used
 * (runtimes disagree on what saved_var holds: onnxruntime gives the
 * inverse standard deviation). */
int ap__onnx_imp_batch_norm(imp *im, const Onnx__NodeProto *n)
{
	ival *in[5], *outs[3];
	const char *names[3] = { out_name(n, 0), out_name(n, 1), out_name(n, 2) };
	bool train;
	int n_out = 1;
	abuf A;

	A.n = 0;
	for (int i = 0; i < 5; i++)
		TRY(ap__onnx_get_in(im, n, (size_t)i, true, &in[i]));
	if (im->opset >= 14) {
		int64_t tm = ap__onnx_aint(n, "training_mode", 0);

		if (tm != 0 && tm != 1)
			return ap__onnx_fail(im, AP_EINVAL, NULL,
					     "BatchNormalization: training_mode %lld",
					     (long long)tm);
		train = tm == 1;
	} else if (im->opset < 7 && ap__onnx_attr(n, "is_test")) {
		train = ap__onnx_aint(n, "is_test", 0) == 0;
	} else {
		train = n->n_output > 1;
	}
	if (im->opset < 9 && ap__onnx_aint(n, "spatial", 1) == 0 && in[1]->sh.rank != 1)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL,
				     "BatchNormalization with spatial=0");
	ab_float(&A, "epsilon", ap__onnx_afloat(n, "epsilon", 1e-5));
	if (train) {
		ab_int(&A, "training_mode", 1);
		ab_float(&A, "momentum", ap__onnx_afloat(n, "momentum", 0.9));
		n_out = n->n_output < 3 ? (int)n->n_output : 3;
	}
	TRY(ap__onnx_emit(im, AP_OP_BATCH_NORM, &A, 5, in, n_out, names, NULL, outs));
	for (int k = 0; k < n_out; k++)
		if (outs[k])
			TRY(ap__onnx_bind(im, names[k], outs[k]));
	for (size_t k = (size_t)n_out; k < n->n_output; k++)
		TRY(ap__onnx_poison_out(im, n, k, train ? "a legacy saved_mean/saved_var output"
							: "a training-mode statistics output"));
	return 0;
}

int ap__onnx_imp_instance_norm(imp *im, const Onnx__NodeProto *n)
{
	ival *in[3], *y;
	abuf A;

	A.n = 0;
	for (int i = 0; i < 3; i++)
		TRY(ap__onnx_get_in(im, n, (size_t)i, true, &in[i]));
	ab_float(&A, "epsilon", ap__onnx_afloat(n, "epsilon", 1e-5));
	TRY(ap__onnx_emit1(im, AP_OP_INSTANCE_NORM, &A, 3, in, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_lrn(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *y;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	if (!ap__onnx_attr(n, "size"))
		return ap__onnx_fail(im, AP_EINVAL, NULL, "LRN: attribute 'size' missing");
	ab_float(&A, "alpha", ap__onnx_afloat(n, "alpha", 1e-4));
	ab_float(&A, "beta", ap__onnx_afloat(n, "beta", 0.75));
	ab_float(&A, "bias", ap__onnx_afloat(n, "bias", 1.0));
	ab_int(&A, "size", ap__onnx_aint(n, "size", 1));
	TRY(ap__onnx_emit1(im, AP_OP_LRN, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_matmul(imp *im, const Onnx__NodeProto *n)
{
	ival *ab[2], *y;

	TRY(ap__onnx_get_in(im, n, 0, true, &ab[0]));
	TRY(ap__onnx_get_in(im, n, 1, true, &ab[1]));
	TRY(ap__onnx_emit1(im, AP_OP_MATMUL, NULL, 2, ab, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_gemm(imp *im, const Onnx__NodeProto *n)
{
	ival *in[3], *y;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &in[0]));
	TRY(ap__onnx_get_in(im, n, 1, true, &in[1]));
	TRY(ap__onnx_get_in(im, n, 2, false, &in[2]));
	ab_float(&A, "alpha", ap__onnx_afloat(n, "alpha", 1.0));
	ab_float(&A, "beta", ap__onnx_afloat(n, "beta", 1.0));
	ab_int(&A, "transA", ap__onnx_aint(n, "transA", 0) ? 1 : 0);
	ab_int(&A, "transB", ap__onnx_aint(n, "transB", 0) ? 1 : 0);
	TRY(ap__onnx_emit1(im, AP_OP_GEMM, &A, in[2] ? 3 : 2, in, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

/* Window attributes of Conv / pools with auto_pad resolved (ONNX Conv /
 * MaxPool spec: SAME_* output = ceil(in / stride), total padding split
 * evenly, the odd one at the end for SAME_UPPER and at the start for
 * SAME_LOWER; VALID = no padding). */
static int window(imp *im, const Onnx__NodeProto *n, const ap_shape *x, const int64_t *kernel,
		  int k, int64_t *strides, int64_t *pads, int64_t *dil)
{
	char buf[32];
	const char *ap = ap__onnx_astr(n, "auto_pad", "NOTSET", buf, sizeof(buf));
	int cnt;

	for (int i = 0; i < k; i++) {
		strides[i] = 1;
		dil[i] = 1;
		pads[i] = pads[k + i] = 0;
	}
	TRY(ap__onnx_aints(im, n, "strides", strides, k, &cnt));
	if (cnt && cnt != k)
		return ap__onnx_fail(im, AP_EINVAL, NULL,
				     "%s: strides has %d values for %d spatial dims", n->op_type,
				     cnt, k);
	TRY(ap__onnx_aints(im, n, "dilations", dil, k, &cnt));
	if (cnt && cnt != k)
		return ap__onnx_fail(im, AP_EINVAL, NULL,
				     "%s: dilations has %d values for %d spatial dims", n->op_type,
				     cnt, k);
	for (int i = 0; i < k; i++)
		if (strides[i] <= 0 || dil[i] <= 0)
			return ap__onnx_fail(im, AP_EINVAL, NULL,
					     "%s: strides and dilations must be positive",
					     n->op_type);
	if (strcmp(ap, "NOTSET") == 0 || ap[0] == '\0') {
		TRY(ap__onnx_aints(im, n, "pads", pads, 2 * k, &cnt));
		if (cnt && cnt != 2 * k)
			return ap__onnx_fail(im, AP_EINVAL, NULL,
					     "%s: pads has %d values for %d spatial dims",
					     n->op_type, cnt, k);
	} else if (strcmp(ap, "SAME_UPPER") == 0 || strcmp(ap, "SAME_LOWER") == 0) {
		for (int i = 0; i < k; i++) {
			int64_t in = x->dims[2 + i], out = (in + strides[i] - 1) / strides[i];
			int64_t total = (out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - in;

			if (total < 0)
				total = 0;
			if (ap[5] == 'U') {
				pads[i] = total / 2;
				pads[k + i] = total - total / 2;
			} else {
				pads[i] = total - total / 2;
				pads[k + i] = total / 2;
			}
		}
	} else if (strcmp(ap, "VALID") != 0) {
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "%s: auto_pad '%s'", n->op_type,
				     ap);
	}
	return 0;
}

/* ConvTranspose's output_padding into opad and, when output_shape is
 * given (or auto_pad is SAME_*: in * stride), the pads that give that
 * shape (ONNX ConvTranspose: total padding = stride * (in - 1) +
 * output_padding + (kernel - 1) * dilation + 1 - out, split as auto_pad
 * says; a negative total becomes extra output_padding).  x is the input,
 * k its spatial rank.  AP_EINVAL for an output_shape of a bad length;
 * errors as ap__onnx_aints. */
static int conv_transpose_pads(imp *im, const Onnx__NodeProto *n, const ap_shape *x,
			       const int64_t *kernel, int k, const int64_t *strides, int64_t *pads,
			       const int64_t *dil, int64_t *opad)
{
	int64_t oshape[AP_MAX_RANK + 2];
	char buf[32];
	const char *ap = ap__onnx_astr(n, "auto_pad", "NOTSET", buf, sizeof(buf));
	bool have_out;
	int cnt;

	for (int i = 0; i < k; i++)
		opad[i] = 0;
	TRY(ap__onnx_aints(im, n, "output_padding", opad, k, &cnt));
	TRY(ap__onnx_aints(im, n, "output_shape", oshape, k + 2, &cnt));
	have_out = cnt > 0;
	if (have_out && cnt == k + 2)
		memmove(oshape, oshape + 2, (size_t)k * sizeof(int64_t));
	else if (have_out && cnt != k)
		return ap__onnx_fail(im, AP_EINVAL, NULL,
				     "ConvTranspose: output_shape has %d values", cnt);
	if (!have_out && (strcmp(ap, "SAME_UPPER") == 0 || strcmp(ap, "SAME_LOWER") == 0)) {
		for (int i = 0; i < k; i++)
			oshape[i] = x->dims[2 + i] * strides[i];
		have_out = true;
	}
	if (!have_out)
		return 0;
	for (int i = 0; i < k; i++) {
		int64_t total = strides[i] * (x->dims[2 + i] - 1) + opad[i] +
				(kernel[i] - 1) * dil[i] + 1 - oshape[i];

		if (total < 0) {
			opad[i] -= total;
			total = 0;
		}
		if (strcmp(ap, "SAME_UPPER") == 0) {
			pads[i] = total / 2;
			pads[k + i] = total - total / 2;
		} else {
			pads[i] = total - total / 2;
			pads[k + i] = total / 2;
		}
	}
	return 0;
}

/* Conv and ConvTranspose: X, W and the optional bias; kernel_shape must be
 * W's; the window (window) and, for ConvTranspose, the output padding
 * (conv_transpose_pads) resolved to explicit attributes.  AP_ESHAPE when X
 * and W do not fit. */
int ap__onnx_imp_conv(imp *im, const Onnx__NodeProto *n, bool transpose)
{
	ival *in[3], *y;
	int64_t kernel[AP_MAX_RANK], strides[AP_MAX_RANK], pads[2 * AP_MAX_RANK], dil[AP_MAX_RANK];
	int64_t opad[AP_MAX_RANK];
	int k, cnt;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &in[0]));
	TRY(ap__onnx_get_in(im, n, 1, true, &in[1]));
	TRY(ap__onnx_get_in(im, n, 2, false, &in[2]));
	k = in[0]->sh.rank - 2;
	if (k < 1 || in[1]->sh.rank != in[0]->sh.rank)
		return ap__onnx_fail(im, AP_ESHAPE, in[1]->name,
				     "%s: X and W must have the same rank >= 3", n->op_type);
	for (int i = 0; i < k; i++)
		kernel[i] = in[1]->sh.dims[2 + i];
	TRY(ap__onnx_aints(im, n, "kernel_shape", kernel, k, &cnt));
	for (int i = 0; i < k; i++)
		if (kernel[i] != in[1]->sh.dims[2 + i])
			return ap__onnx_fail(im, AP_ESHAPE, in[1]->name,
					     "%s: kernel_shape does not match the weight",
					     n->op_type);
	TRY(window(im, n, &in[0]->sh, kernel, k, strides, pads, dil));
	if (transpose) {
		TRY(conv_transpose_pads(im, n, &in[0]->sh, kernel, k, strides, pads, dil, opad));
		ab_ints(&A, "output_padding", opad, k);
	}
	ab_int(&A, "group", ap__onnx_aint(n, "group", 1));
	ab_ints(&A, "strides", strides, k);
	ab_ints(&A, "pads", pads, 2 * k);
	ab_ints(&A, "dilations", dil, k);
	TRY(ap__onnx_emit1(im, transpose ? AP_OP_CONV_TRANSPOSE : AP_OP_CONV, &A, in[2] ? 3 : 2, in,
			   out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_pool(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *x, *y;
	int64_t kernel[AP_MAX_RANK], strides[AP_MAX_RANK], pads[2 * AP_MAX_RANK], dil[AP_MAX_RANK];
	int k, cnt;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	k = x->sh.rank - 2;
	if (k < 1)
		return ap__onnx_fail(im, AP_ESHAPE, x->name, "%s: input needs rank >= 3",
				     n->op_type);
	TRY(ap__onnx_aints(im, n, "kernel_shape", kernel, k, &cnt));
	if (cnt != k)
		return ap__onnx_fail(im, AP_EINVAL, NULL, "%s: kernel_shape needs %d values",
				     n->op_type, k);
	TRY(window(im, n, &x->sh, kernel, k, strides, pads, dil));
	ab_ints(&A, "kernel_shape", kernel, k);
	ab_ints(&A, "strides", strides, k);
	ab_ints(&A, "pads", pads, 2 * k);
	ab_ints(&A, "dilations", dil, k);
	ab_int(&A, "ceil_mode", ap__onnx_aint(n, "ceil_mode", 0) ? 1 : 0);
	if (op == AP_OP_AVERAGE_POOL)
		ab_int(&A, "count_include_pad", ap__onnx_aint(n, "count_include_pad", 0) ? 1 : 0);
	TRY(ap__onnx_emit1(im, op, &A, 1, &x, out_name(n, 0), NULL, &y));
	TRY(ap__onnx_poison_out(im, n, 1, "MaxPool's Indices output"));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_global_pool(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *x, *y;
	int64_t axes[AP_MAX_RANK];
	int na = 0;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	if (x->sh.rank < 3)
		return ap__onnx_fail(im, AP_ESHAPE, x->name, "%s: input needs rank >= 3",
				     n->op_type);
	for (int d = 2; d < x->sh.rank; d++)
		axes[na++] = d;
	ab_ints(&A, "axes", axes, na);
	ab_int(&A, "keepdims", 1);
	TRY(ap__onnx_emit1(im, op, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_dropout(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *tm = NULL;
	double train = 0;

	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	if (im->opset >= 12) {
		TRY(ap__onnx_get_in(im, n, 2, false, &tm));
		if (tm)
			TRY(ap__onnx_get_scalar(im, tm, "Dropout training_mode", &train));
	} else if (im->opset < 7 && ap__onnx_attr(n, "is_test") &&
		   ap__onnx_aint(n, "is_test", 1) == 0) {
		train = 1;
	}
	if (train != 0)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "Dropout in training mode");
	TRY(ap__onnx_poison_out(im, n, 1, "Dropout's mask output"));
	return ap__onnx_bind(im, out_name(n, 0), x);
}

/* One of Q, K, V of ONNX Attention in its 3-D form [B, S, heads * E] as
 * [B, heads, S, E] (a Reshape and a Transpose); the 4-D form as it is. */
static int attention_heads(imp *im, ival *x, int64_t heads, const char *base, const char *what, ival **out)
{
	char nm[256];
	int64_t d[4], perm[4] = {0, 2, 1, 3};

	if (x->sh.rank == 4) {
		*out = x;
		return 0;
	}
	if (x->sh.rank != 3 || heads < 1 || x->sh.dims[2] % heads != 0)
		return ap__onnx_fail(im, AP_EINVAL, x->name,
				     "Attention: %s must be [B, S, heads * E] (with q_num_heads / kv_num_heads) or "
				     "[B, heads, S, E]", what);
	d[0] = x->sh.dims[0];
	d[1] = x->sh.dims[1];
	d[2] = heads;
	d[3] = x->sh.dims[2] / heads;
	snprintf(nm, sizeof(nm), "%.200s_%s4", base, what);
	TRY(ap__onnx_reshape_to(im, x, 4, d, nm, &x));
	snprintf(nm, sizeof(nm), "%.200s_%sT", base, what);
	return ap__onnx_transpose_to(im, x, perm, nm, out);
}

/* Attention (opset 23): Y = softmax(scale * Q K^T + mask, causal upper-left)
 * V as Apollo's Attention (ops.def), grouped-query heads included; the 3-D
 * form [B, S, heads * E] through q_num_heads / kv_num_heads.  Refused
 * (AP_EUNSUPPORTED, naming the part): a KV cache (past_key / past_value
 * inputs, present_key / present_value outputs), nonpad_kv_seqlen, the
 * qk_matmul_output output, softcap, opset 25's sliding windows and any
 * attribute it does not know. */
int ap__onnx_imp_attention(imp *im, const Onnx__NodeProto *n)
{
	ival *q, *k, *v, *mask, *ins[4], *y;
	const char *base = out_name(n, 0);
	bool three;
	double scale;
	abuf A;

	A.n = 0;
	for (size_t i = 1; i < n->n_output; i++)
		if (out_name(n, i)[0])
			return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "Attention: output %zu (%s) is not supported",
					     i, i == 3 ? "qk_matmul_output" : "a KV cache's present_key / present_value");
	for (size_t i = 4; i < n->n_input; i++)
		if (n->input[i] && n->input[i][0])
			return ap__onnx_fail(im, AP_EUNSUPPORTED, n->input[i], "Attention: input %zu (%s) is not supported",
					     i, i == 6 ? "nonpad_kv_seqlen" : "a KV cache's past_key / past_value");
	if (ap__onnx_afloat(n, "softcap", 0.0) != 0.0)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "Attention: softcap is not supported");
	for (size_t i = 0; i < n->n_attribute; i++) {
		static const char *const known[] = {"is_causal", "kv_num_heads", "q_num_heads", "scale", "softcap",
						    "softmax_precision", "qk_matmul_output_mode"};
		const char *a = n->attribute[i]->name ? n->attribute[i]->name : "";
		bool ok = false;

		for (size_t j = 0; j < sizeof(known) / sizeof(known[0]); j++)
			ok = ok || strcmp(a, known[j]) == 0;
		/* opset 25's sliding windows: only "no window" (-1) is taken */
		if ((!strcmp(a, "left_window_size") || !strcmp(a, "right_window_size")) && ap__onnx_aint(n, a, -1) == -1)
			ok = true;
		if (!ok)
			return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "Attention: attribute '%s' is not supported", a);
	}
	TRY(ap__onnx_get_in(im, n, 0, true, &q));
	TRY(ap__onnx_get_in(im, n, 1, true, &k));
	TRY(ap__onnx_get_in(im, n, 2, true, &v));
	TRY(ap__onnx_get_in(im, n, 3, false, &mask));
	three = q->sh.rank == 3;
	TRY(attention_heads(im, q, ap__onnx_aint(n, "q_num_heads", 0), base, "q", &ins[0]));
	TRY(attention_heads(im, k, ap__onnx_aint(n, "kv_num_heads", 0), base, "k", &ins[1]));
	TRY(attention_heads(im, v, ap__onnx_aint(n, "kv_num_heads", 0), base, "v", &ins[2]));
	ins[3] = mask;
	if (ins[0]->sh.dims[3] < 1)
		return ap__onnx_fail(im, AP_EINVAL, q->name, "Attention: empty head dim");
	scale = ap__onnx_attr(n, "scale") ? ap__onnx_afloat(n, "scale", 1.0) : 1.0 / sqrt((double)ins[0]->sh.dims[3]);
	ab_float(&A, "scale", scale);
	ab_int(&A, "is_causal", ap__onnx_aint(n, "is_causal", 0));
	/* softmax_precision FLOAT (1) over 16-bit inputs: the scores and the
	 * softmax in float32 (Attention's fp32_scores; ONNX's reference rounds
	 * the product to the input type first, about one 16-bit step of a
	 * score from this) */
	if (ap__onnx_aint(n, "softmax_precision", 0) == 1 &&
	    (ins[0]->sh.dtype == AP_DT_F16 || ins[0]->sh.dtype == AP_DT_BF16))
		ab_int(&A, "fp32_scores", 1);
	if (!three) {
		TRY(ap__onnx_emit1(im, AP_OP_ATTENTION, &A, mask ? 4 : 3, ins, base, NULL, &y));
		return ap__onnx_bind(im, base, y);
	}
	{
		char nm[256];
		int64_t perm[4] = {0, 2, 1, 3}, d[3];

		snprintf(nm, sizeof(nm), "%.200s_y4", base);
		TRY(ap__onnx_emit1(im, AP_OP_ATTENTION, &A, mask ? 4 : 3, ins, nm, NULL, &y));
		snprintf(nm, sizeof(nm), "%.200s_yT", base);
		TRY(ap__onnx_transpose_to(im, y, perm, nm, &y));
		d[0] = y->sh.dims[0];
		d[1] = y->sh.dims[1];
		d[2] = y->sh.dims[2] * y->sh.dims[3];
		TRY(ap__onnx_reshape_to(im, y, 3, d, base, &y));
		return ap__onnx_bind(im, base, y);
	}
}
