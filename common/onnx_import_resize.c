/* onnx_import_resize.c -- the importer of ONNX Resize (opsets 10-19) and
 * Upsample (7-9) (https://onnx.ai/onnx/operators/onnx__Resize.html) in
 * nearest and linear modes, made of Gathers over per-axis index tables and,
 * for linear, a weighted sum of two Gathers: separable, one resized axis at
 * a time.  For output coordinate x the input coordinate comes from
 * coordinate_transformation_mode (computed in float32, as onnxruntime
 * does); nearest rounds it by nearest_mode; linear takes the two
 * neighbours (clamped to the edge).  Cubic, antialias, tf_crop_and_resize
 * and a keep_aspect_ratio_policy other than stretch are refused.
 */
#include "onnx_import_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Resize/Upsample become Gathers over per-axis index and weight tables
 * (constants built here): an axis of the output may be at most this long. */
#define MAX_RESIZE_AXIS ((int64_t)1 << 20)

/* A new known tensor of dtype dt and shape (rank, dims) holding vals
 * (numel of them, converted). */
static ival *array_val(imp *im, const char *name, ap_dtype dt, int rank, const int64_t *dims,
		       const double *vals)
{
	ap_host_tensor *t = ap__host_tensor_new(name, dt, rank, dims);
	int64_t cnt = ap__shape_numel(rank, dims);

	if (!t) {
		ap__onnx_nomem(im);
		return NULL;
	}
	for (int64_t i = 0; i < cnt; i++) {
		switch (dt) {
		case AP_DT_F32: ((float *)t->data)[i] = (float)vals[i]; break;
		case AP_DT_F64: ((double *)t->data)[i] = vals[i]; break;
		default: ((int64_t *)t->data)[i] = (int64_t)vals[i]; break;
		}
	}
	return ap__onnx_const_val(im, name, t);
}

/* Resize (opsets 10-19) and Upsample (7-9) in nearest and linear modes:
 * separable, one resized axis at a time.  For output coordinate x the
 * input coordinate comes from coordinate_transformation_mode (computed in
 * float32, as onnxruntime does); nearest rounds it by nearest_mode and
 * gathers; linear gathers the two neighbours (clamped to the edge) and
 * weighs them.  Cubic, antialias, tf_crop_and_resize and a
 * keep_aspect_ratio_policy other than stretch are refused. */
int ap__onnx_imp_resize(imp *im, const Onnx__NodeProto *n, bool upsample)
{
	ival *x, *roi = NULL, *sc = NULL, *sz = NULL, *y;
	char mb[16], cb[32], nb[32], kb[16];
	const char *mode = ap__onnx_astr(n, "mode", "nearest", mb, sizeof(mb));
	bool old = upsample || im->opset < 11;
	const char *ctm = old ? "asymmetric" : ap__onnx_astr(n, "coordinate_transformation_mode",
							     "half_pixel", cb, sizeof(cb));
	const char *nmode = old ? "simple" : ap__onnx_astr(n, "nearest_mode", "round_prefer_floor",
							   nb, sizeof(nb));
	double scales[AP_MAX_RANK];
	int64_t sizes[AP_MAX_RANK], axes[AP_MAX_RANK], raw[AP_MAX_RANK];
	int r, na = 0, cnt;
	bool linear;
	const char *base = out_name(n, 0);

	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	r = x->sh.rank;
	linear = !strcmp(mode, "linear") || !strcmp(mode, "bilinear");
	if (!linear && strcmp(mode, "nearest"))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL,
				     "%s: mode '%s' (nearest and linear supported)", n->op_type,
				     mode);
	if (ap__onnx_aint(n, "antialias", 0))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "%s: antialias", n->op_type);
	if (!strcmp(ctm, "tf_crop_and_resize"))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "%s: tf_crop_and_resize",
				     n->op_type);
	if (strcmp(ap__onnx_astr(n, "keep_aspect_ratio_policy", "stretch", kb, sizeof(kb)),
		   "stretch"))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "%s: keep_aspect_ratio_policy '%s'",
				     n->op_type, kb);
	if (linear && x->sh.dtype != AP_DT_F32 && x->sh.dtype != AP_DT_F64)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, x->name, "%s: linear mode on %s",
				     n->op_type, ap_dtype_name(x->sh.dtype));
	TRY(ap__onnx_aints(im, n, "axes", raw, AP_MAX_RANK, &na));
	if (!na)
		for (int d = 0; d < r; d++)
			raw[na++] = d;
	for (int i = 0; i < na; i++)
		TRY(ap__onnx_norm_axis(im, raw[i], r, &axes[i]));
	for (int d = 0; d < r; d++) {
		scales[d] = 1;
		sizes[d] = x->sh.dims[d];
	}
	if (upsample && im->opset < 9) {
		const Onnx__AttributeProto *a = ap__onnx_attr(n, "scales");

		if (!a || a->n_floats != (size_t)r)
			return ap__onnx_fail(im, AP_EINVAL, NULL,
					     "Upsample: scales must have %d values", r);
		for (int d = 0; d < r; d++)
			scales[d] = a->floats[d];
	} else {
		size_t si = upsample || im->opset < 11 ? 1 : 2;

		if (!old)
			TRY(ap__onnx_get_in(im, n, 1, false, &roi));
		TRY(ap__onnx_get_in(im, n, si, false, &sc));
		if (!old)
			TRY(ap__onnx_get_in(im, n, 3, false, &sz));
		if (sc && sh_numel(&sc->sh) == 0)
			sc = NULL;
		if (sz && sh_numel(&sz->sh) == 0)
			sz = NULL;
		if (!sc == !sz)
			return ap__onnx_fail(im, AP_EINVAL, NULL,
					     "%s: exactly one of scales and sizes", n->op_type);
		if (sz) {
			TRY(ap__onnx_get_ints(im, sz, "Resize sizes", raw, AP_MAX_RANK, &cnt));
			if (cnt != na)
				return ap__onnx_fail(im, AP_EINVAL, sz->name,
						     "Resize: %d sizes for %d axes", cnt, na);
			for (int i = 0; i < na; i++) {
				if (raw[i] < 0)
					return ap__onnx_fail(im, AP_EINVAL, sz->name,
							     "Resize: negative size");
				sizes[axes[i]] = raw[i];
				scales[axes[i]] = x->sh.dims[axes[i]] ? (double)raw[i] / (double)x->sh.dims[axes[i]] : 1;
			}
		} else {
			const ap_host_tensor *d;

			if (!known(sc) || sh_numel(&sc->sh) != na ||
			    (sc->sh.dtype != AP_DT_F32 && sc->sh.dtype != AP_DT_F64))
				return ap__onnx_fail(im, AP_EUNSUPPORTED, sc->name,
						     "%s: scales must be a constant float vector of %d values",
						     n->op_type, na);
			d = ap__onnx_val_data(im, sc);
			if (!d)
				return im->err ? im->err->code : AP_EINVAL;
			for (int i = 0; i < na; i++)
				scales[axes[i]] = d->dtype == AP_DT_F32 ? ((float *)d->data)[i] : ((double *)d->data)[i];
		}
	}
	for (int d = 0; d < r; d++) {
		if (!(scales[d] > 0) || !isfinite(scales[d]))
			return ap__onnx_fail(im, AP_EINVAL, NULL, "%s: scale %g on axis %d",
					     n->op_type, scales[d], d);
		if (!sz) {
			double o = floor((double)x->sh.dims[d] * (double)(float)scales[d]);

			if (o > (double)AP_MAX_ELEMENTS)
				return ap__onnx_fail(im, AP_ETOOLARGE, base, "%s: output too large",
						     n->op_type);
			sizes[d] = (int64_t)o;
		}
	}
	{
		ap_shape o = x->sh;

		for (int d = 0; d < r; d++)
			o.dims[d] = sizes[d];
		if (sh_bytes(&o) < 0)
			return ap__onnx_fail(im, AP_ETOOLARGE, base, "%s: output too large",
					     n->op_type);
	}
	for (int d = 0; d < r; d++)
		if (sizes[d] > MAX_RESIZE_AXIS && (sizes[d] != x->sh.dims[d] || (float)scales[d] != 1.0f))
			return ap__onnx_fail(im, AP_ETOOLARGE, base,
					     "%s: output axis %d of %lld elements (at most %lld)",
					     n->op_type, d, (long long)sizes[d],
					     (long long)MAX_RESIZE_AXIS);
	y = x;
	for (int d = 0; d < r; d++) {
		int64_t in = x->sh.dims[d], out = sizes[d], bdims[AP_MAX_RANK];
		float s = (float)scales[d];
		float len = (float)in * s;   /* the resized length, fractional from a scale */
		double *i1, *i2 = NULL, *w1 = NULL, *w2 = NULL;
		ival *c1, *pair[2], *g1, *g2, *t1, *t2;
		bool last = true;
		char nm[NAME_CAP];
		abuf A;

		if (out == in && s == 1.0f)
			continue;
		if (in == 0 || out == 0)
			return ap__onnx_fail(im, AP_EUNSUPPORTED, x->name, "%s of an empty axis",
					     n->op_type);
		for (int e = d + 1; e < r; e++)
			if (sizes[e] != x->sh.dims[e] || (float)scales[e] != 1.0f)
				last = false;
		i1 = calloc((size_t)out, sizeof(double));
		if (linear) {
			i2 = calloc((size_t)out, sizeof(double));
			w1 = calloc((size_t)out, sizeof(double));
			w2 = calloc((size_t)out, sizeof(double));
		}
		if (!i1 || (linear && (!i2 || !w1 || !w2))) {
			free(i1); free(i2); free(w1); free(w2);
			return ap__onnx_nomem(im);
		}
		for (int64_t o = 0; o < out; o++) {
			float xo = (float)o, xi;

			if (!strcmp(ctm, "half_pixel"))
				xi = (xo + 0.5f) / s - 0.5f;
			else if (!strcmp(ctm, "pytorch_half_pixel"))
				xi = len > 1.0f ? (xo + 0.5f) / s - 0.5f : 0.0f;
			else if (!strcmp(ctm, "align_corners"))
				xi = len == 1.0f ? 0.0f : xo * (float)(in - 1) / (len - 1.0f);
			else if (!strcmp(ctm, "tf_half_pixel_for_nn"))
				xi = (xo + 0.5f) / s;
			else if (!strcmp(ctm, "half_pixel_symmetric")) {
				float adj = (float)out / (s * (float)in), ctr = (float)in / 2.0f;

				xi = ctr * (1.0f - adj) + (xo + 0.5f) / s - 0.5f;
			} else if (!strcmp(ctm, "asymmetric"))
				xi = xo / s;
			else {
				free(i1); free(i2); free(w1); free(w2);
				return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL,
						     "%s: coordinate_transformation_mode '%s'",
						     n->op_type, ctm);
			}
			if (!linear) {
				double k;

				if (!strcmp(nmode, "simple"))
					k = s < 1.0f ? ceilf(xi) : (double)(int64_t)xi;
				else if (!strcmp(nmode, "floor"))
					k = floorf(xi);
				else if (!strcmp(nmode, "ceil"))
					k = ceilf(xi);
				else if (!strcmp(nmode, "round_prefer_ceil"))
					k = xi == (float)(int64_t)xi + 0.5f ? ceilf(xi) : roundf(xi);
				else
					k = xi == (float)(int64_t)xi + 0.5f ? floorf(xi) : roundf(xi);
				i1[o] = k < 0 ? 0 : k > (double)(in - 1) ? (double)(in - 1) : k;
			} else {
				int64_t a, b;

				xi = xi < 0 ? 0 : xi > (float)(in - 1) ? (float)(in - 1) : xi;
				a = (int64_t)xi < in - 1 ? (int64_t)xi : in - 1;
				b = a + 1 < in - 1 ? a + 1 : in - 1;
				i1[o] = (double)a;
				i2[o] = (double)b;
				w1[o] = a == b ? 0.5 : fabsf(xi - (float)b);
				w2[o] = a == b ? 0.5 : fabsf(xi - (float)a);
			}
		}
		A.n = 0;
		ab_int(&A, "axis", d);
		snprintf(nm, sizeof(nm), "%.200s_idx%d", base, d);
		c1 = array_val(im, nm, AP_DT_I64, 1, &out, i1);
		pair[0] = y;
		pair[1] = c1;
		snprintf(nm, sizeof(nm), "%.200s_axis%d", base, d);
		if (!c1 || ap__onnx_emit1(im, AP_OP_GATHER, &A, 2, pair,
					  linear || !last ? nm : base, NULL, &g1) < 0) {
			free(i1); free(i2); free(w1); free(w2);
			return im->err && im->err->code ? im->err->code : AP_ENOMEM;
		}
		if (!linear) {
			free(i1);
			y = g1;
			continue;
		}
		for (int e = 0; e < r; e++)
			bdims[e] = e == d ? out : 1;
		snprintf(nm, sizeof(nm), "%.200s_idx%d_hi", base, d);
		c1 = array_val(im, nm, AP_DT_I64, 1, &out, i2);
		pair[1] = c1;
		snprintf(nm, sizeof(nm), "%.200s_axis%d_hi", base, d);
		if (!c1 || ap__onnx_emit1(im, AP_OP_GATHER, &A, 2, pair, nm, NULL, &g2) < 0)
			goto lin_fail;
		snprintf(nm, sizeof(nm), "%.200s_w%d", base, d);
		pair[0] = g1;
		pair[1] = array_val(im, nm, x->sh.dtype, r, bdims, w1);
		snprintf(nm, sizeof(nm), "%.200s_lo%d", base, d);
		if (!pair[1] || ap__onnx_emit1(im, AP_OP_MUL, NULL, 2, pair, nm, NULL, &t1) < 0)
			goto lin_fail;
		snprintf(nm, sizeof(nm), "%.200s_w%d_hi", base, d);
		pair[0] = g2;
		pair[1] = array_val(im, nm, x->sh.dtype, r, bdims, w2);
		snprintf(nm, sizeof(nm), "%.200s_hi%d", base, d);
		if (!pair[1] || ap__onnx_emit1(im, AP_OP_MUL, NULL, 2, pair, nm, NULL, &t2) < 0)
			goto lin_fail;
		pair[0] = t1;
		pair[1] = t2;
		snprintf(nm, sizeof(nm), "%.200s_axis%d_mix", base, d);
		if (ap__onnx_emit1(im, AP_OP_ADD, NULL, 2, pair, last ? base : nm, NULL, &y) < 0)
			goto lin_fail;
		free(i1); free(i2); free(w1); free(w2);
		continue;
lin_fail:
		free(i1); free(i2); free(w1); free(w2);
		return im->err && im->err->code ? im->err->code : AP_ENOMEM;
	}
	(void)roi;
	if (y == x)
		TRY(ap__onnx_emit1(im, AP_OP_IDENTITY, NULL, 1, &x, base, NULL, &y));
	return ap__onnx_bind(im, base, y);
}
