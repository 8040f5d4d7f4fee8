/* onnx_import_constant.c -- importers of the ONNX ops that make data the
 * importer knows at import time, so none of them adds a node: Constant
 * (tensor, value_float(s), value_int(s)), ConstantOfShape (spelled out up
 * to AP_CONST_MAX_BYTES, a fill above), Shape and Size (from the static
 * shape), Range (at most MAX_RANGE_ELEMS elements).  Semantics: the ONNX
 * operator specification (https://onnx.ai/onnx/operators/).
 */
#include "onnx_import_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_RANGE_ELEMS ((int64_t)1 << 20)   /* a Range is data: 8 MiB at most */

int ap__onnx_imp_constant(imp *im, const Onnx__NodeProto *n)
{
	const Onnx__AttributeProto *a;
	const char *o = out_name(n, 0);
	ival *v = NULL;

	if ((a = ap__onnx_attr(n, "value")) && a->t) {
		v = ap__onnx_new_val(im, o);
		if (!v)
			return AP_ENOMEM;
		if (a->t->n_dims > AP_MAX_RANK)
			return ap__onnx_fail(im, AP_EUNSUPPORTED, o, "Constant of rank %zu",
					     a->t->n_dims);
		v->lazy = a->t;
		v->sh.dtype = a->t->has_data_type ? (ap_dtype)a->t->data_type : AP_DT_UNDEF;
		v->sh.rank = (int)a->t->n_dims;
		for (size_t d = 0; d < a->t->n_dims; d++)
			v->sh.dims[d] = a->t->dims[d];
		if (sh_numel(&v->sh) < 0)
			return ap__onnx_fail(im, AP_ETOOLARGE, o, "Constant '%s' too large", o);
		/* large floating-point data is a weight, as an initializer's */
		v->weight = float_dtype(v->sh.dtype) && sh_bytes(&v->sh) > AP_CONST_MAX_BYTES;
		/* decode now: a Constant is usually small and used soon (a
		 * large one without a parameter store is never decoded) */
		if (!(im->shape_only && !known_small(v)) && !ap__onnx_val_data(im, v))
			return im->err ? im->err->code : AP_EINVAL;
	} else if ((a = ap__onnx_attr(n, "value_float"))) {
		v = ap__onnx_scalar_val(im, o, AP_DT_F32, a->f, 0);
	} else if ((a = ap__onnx_attr(n, "value_int"))) {
		v = ap__onnx_scalar_val(im, o, AP_DT_I64, 0, a->i);
	} else if ((a = ap__onnx_attr(n, "value_ints"))) {
		if (a->n_ints > (size_t)(1 << 24))
			return ap__onnx_fail(im, AP_ETOOLARGE, o, "Constant too large");
		v = ap__onnx_ints_val(im, o, a->ints, (int)a->n_ints);
	} else if ((a = ap__onnx_attr(n, "value_floats"))) {
		int64_t d = (int64_t)a->n_floats;
		ap_host_tensor *t;

		if (a->n_floats > (size_t)(1 << 24))
			return ap__onnx_fail(im, AP_ETOOLARGE, o, "Constant too large");
		t = ap__host_tensor_new(o, AP_DT_F32, 1, &d);
		if (!t)
			return ap__onnx_nomem(im);
		if (d)
			memcpy(t->data, a->floats, (size_t)d * sizeof(float));
		v = ap__onnx_const_val(im, o, t);
	} else {
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL,
				     "Constant without a tensor/float/int value "
				     "(sparse and string constants are not supported)");
	}
	if (!v)
		return AP_ENOMEM;
	return ap__onnx_bind(im, o, v);
}

int ap__onnx_imp_constant_of_shape(imp *im, const Onnx__NodeProto *n)
{
	const Onnx__AttributeProto *a = ap__onnx_attr(n, "value");
	ival *s, *v;
	int64_t shape[AP_MAX_RANK];
	int cnt;
	ap_dtype dt = AP_DT_F32;
	double f = 0;
	int64_t iv = 0;
	const char *o = out_name(n, 0);

	TRY(ap__onnx_get_in(im, n, 0, true, &s));
	TRY(ap__onnx_get_ints(im, s, "ConstantOfShape shape", shape, AP_MAX_RANK, &cnt));
	if (a && a->t) {
		ap_host_tensor *t = ap__onnx_tensor_load(im, a->t, "value");

		if (!t) {
			snprintf(im->err->node, sizeof(im->err->node), "%s", im->node);
			return im->err->code;
		}
		if (ap__shape_numel(t->rank, t->dims) != 1) {
			ap_host_tensor_free(t);
			return ap__onnx_fail(im, AP_EINVAL, NULL,
					     "ConstantOfShape: value must hold one element");
		}
		dt = t->dtype;
		switch (dt) {
		case AP_DT_F32: f = *(float *)t->data; break;
		case AP_DT_F64: f = *(double *)t->data; break;
		case AP_DT_F16: case AP_DT_BF16: f = ap_elem_get(t->data, dt, 0); break;
		case AP_DT_I32: iv = *(int32_t *)t->data; break;
		case AP_DT_I64: iv = *(int64_t *)t->data; break;
		case AP_DT_I8: iv = *(int8_t *)t->data; break;
		default: iv = *(uint8_t *)t->data; break;
		}
		if (!ap_dtype_is_floating(dt))
			f = (double)iv;
		else   /* iv is unused for float fills; NaN / out of range would be UB */
			iv = ap_f64_to_i64(f);
		ap_host_tensor_free(t);
	}
	for (int i = 0; i < cnt; i++)
		if (shape[i] < 0)
			return ap__onnx_fail(im, AP_EINVAL, s->name,
					     "ConstantOfShape: negative dimension");
	v = ap__onnx_new_val(im, o);
	if (!v)
		return AP_ENOMEM;
	v->sh.dtype = dt;
	v->sh.rank = cnt;
	memcpy(v->sh.dims, shape, (size_t)cnt * sizeof(int64_t));
	if (sh_bytes(&v->sh) >= 0 && sh_bytes(&v->sh) <= AP_CONST_MAX_BYTES) {
		ap_host_tensor *t = ap__host_tensor_new(o, dt, cnt, shape);
		int64_t m = sh_numel(&v->sh);

		if (!t)
			return ap__onnx_nomem(im);
		for (int64_t i = 0; i < m; i++) {
			switch (dt) {
			case AP_DT_F32: ((float *)t->data)[i] = (float)f; break;
			case AP_DT_F64: ((double *)t->data)[i] = f; break;
			case AP_DT_F16: case AP_DT_BF16: ap_elem_set(t->data, dt, i, f); break;
			case AP_DT_I32: ((int32_t *)t->data)[i] = (int32_t)iv; break;
			case AP_DT_I64: ((int64_t *)t->data)[i] = iv; break;
			case AP_DT_I8: ((int8_t *)t->data)[i] = (int8_t)iv; break;
			case AP_DT_BOOL: ((uint8_t *)t->data)[i] = iv != 0; break;
			default: ((uint8_t *)t->data)[i] = (uint8_t)iv; break;
			}
		}
		v->data = t;
	} else {
		/* a broadcast of one value: costs no memory until a kernel reads it */
		v->fill = true;
		v->fill_f = f;
		v->fill_i = iv;
	}
	return ap__onnx_bind(im, o, v);
}

int ap__onnx_imp_shape(imp *im, const Onnx__NodeProto *n, bool size)
{
	ival *x, *v;
	int64_t start = 0, end, r;

	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	r = x->sh.rank;
	if (size) {
		v = ap__onnx_scalar_val(im, out_name(n, 0), AP_DT_I64, 0, sh_numel(&x->sh));
	} else {
		start = ap__onnx_aint(n, "start", 0);
		end = ap__onnx_aint(n, "end", r);
		if (start < 0)
			start += r;
		if (end < 0)
			end += r;
		start = start < 0 ? 0 : start > r ? r : start;
		end = end < 0 ? 0 : end > r ? r : end;
		if (end < start)
			end = start;
		v = ap__onnx_ints_val(im, out_name(n, 0), x->sh.dims + start, (int)(end - start));
	}
	if (!v)
		return AP_ENOMEM;
	return ap__onnx_bind(im, out_name(n, 0), v);
}

int ap__onnx_imp_range(imp *im, const Onnx__NodeProto *n)
{
	ival *in[3], *v;
	double s, l, d;
	int64_t cnt;
	ap_host_tensor *t;

	for (int i = 0; i < 3; i++)
		TRY(ap__onnx_get_in(im, n, (size_t)i, true, &in[i]));
	TRY(ap__onnx_get_scalar(im, in[0], "Range start", &s));
	TRY(ap__onnx_get_scalar(im, in[1], "Range limit", &l));
	TRY(ap__onnx_get_scalar(im, in[2], "Range delta", &d));
	if (d == 0)
		return ap__onnx_fail(im, AP_EINVAL, in[2]->name, "Range: delta 0");
	if (!isfinite(s) || !isfinite(l) || !isfinite(d))
		return ap__onnx_fail(im, AP_EINVAL, out_name(n, 0), "Range from %g to %g by %g", s,
				     l, d);
	{
		double c = ceil((l - s) / d);   /* compared as a double: it may not fit an int64 */

		if (c > (double)MAX_RANGE_ELEMS)
			return ap__onnx_fail(im, AP_ETOOLARGE, out_name(n, 0),
					     "Range of %.0f elements (at most %lld)", c,
					     (long long)MAX_RANGE_ELEMS);
		cnt = c < 0 ? 0 : (int64_t)c;
	}
	t = ap__host_tensor_new(out_name(n, 0), in[0]->sh.dtype, 1, &cnt);
	if (!t)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, in[0]->name, "Range of dtype %s",
				     ap_dtype_name(in[0]->sh.dtype));
	for (int64_t i = 0; i < cnt; i++) {
		double x = s + (double)i * d;

		switch (t->dtype) {
		case AP_DT_F32: ((float *)t->data)[i] = (float)x; break;
		case AP_DT_F64: ((double *)t->data)[i] = x; break;
		case AP_DT_F16: case AP_DT_BF16: ap_elem_set(t->data, t->dtype, i, x); break;
		case AP_DT_I32: ((int32_t *)t->data)[i] = (int32_t)ap_f64_to_i64(x); break;
		case AP_DT_I64:
			((int64_t *)t->data)[i] = (int64_t)((uint64_t)ap_f64_to_i64(s) +
							    (uint64_t)i * (uint64_t)ap_f64_to_i64(d));
			break;
		default: break;
		}
	}
	v = ap__onnx_const_val(im, out_name(n, 0), t);
	if (!v)
		return AP_ENOMEM;
	return ap__onnx_bind(im, out_name(n, 0), v);
}
