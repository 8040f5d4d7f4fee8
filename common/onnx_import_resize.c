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

/* What a Resize / Upsample node asks for, resolved: the modes (pointing
 * into the buffers or to literals) and, per axis of the input (rank r),
 * the scale and the output size. */
typedef struct rz_plan {
	char mb[16], cb[32], nb[32], kb[16];
	const char *mode, *ctm, *nmode;  /* ctm: coordinate_transformation_mode */
	bool old;                        /* Upsample or opset < 11: asymmetric, simple */
	bool linear;                     /* else nearest */
	ap_dtype dt;                     /* the input's (and the weights') dtype */
	int r, na;
	int64_t axes[AP_MAX_RANK];       /* the axes the scales / sizes are for */
	double scales[AP_MAX_RANK];
	int64_t sizes[AP_MAX_RANK];
	bool by_sizes;                   /* sizes given (else computed from scales) */
} rz_plan;

/* Reads the modes of n into p and refuses what is not supported
 * (AP_EUNSUPPORTED): a mode other than nearest and linear, antialias,
 * tf_crop_and_resize, a keep_aspect_ratio_policy other than stretch,
 * linear on a dtype other than float32 / float64. */
static int rz_modes(imp *im, const Onnx__NodeProto *n, bool upsample, const ival *x, rz_plan *p)
{
	p->mode = ap__onnx_astr(n, "mode", "nearest", p->mb, sizeof(p->mb));
	p->old = upsample || im->opset < 11;
	p->ctm = p->old ? "asymmetric" : ap__onnx_astr(n, "coordinate_transformation_mode",
						       "half_pixel", p->cb, sizeof(p->cb));
	p->nmode = p->old ? "simple" : ap__onnx_astr(n, "nearest_mode", "round_prefer_floor",
						     p->nb, sizeof(p->nb));
	p->r = x->sh.rank;
	p->dt = x->sh.dtype;
	p->linear = !strcmp(p->mode, "linear") || !strcmp(p->mode, "bilinear");
	if (!p->linear && strcmp(p->mode, "nearest"))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL,
				     "%s: mode '%s' (nearest and linear supported)", n->op_type,
				     p->mode);
	if (ap__onnx_aint(n, "antialias", 0))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "%s: antialias", n->op_type);
	if (!strcmp(p->ctm, "tf_crop_and_resize"))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "%s: tf_crop_and_resize",
				     n->op_type);
	if (strcmp(ap__onnx_astr(n, "keep_aspect_ratio_policy", "stretch", p->kb, sizeof(p->kb)),
		   "stretch"))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "%s: keep_aspect_ratio_policy '%s'",
				     n->op_type, p->kb);
	if (p->linear && x->sh.dtype != AP_DT_F32 && x->sh.dtype != AP_DT_F64)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, x->name, "%s: linear mode on %s",
				     n->op_type, ap_dtype_name(x->sh.dtype));
	return 0;
}

/* The axes attribute of n (every axis when absent), normalised into
 * p->axes; every scale 1 and every size the input's.  Errors as
 * ap__onnx_aints and ap__onnx_norm_axis. */
static int rz_axes(imp *im, const Onnx__NodeProto *n, const ival *x, rz_plan *p)
{
	int64_t raw[AP_MAX_RANK];

	p->na = 0;
	TRY(ap__onnx_aints(im, n, "axes", raw, AP_MAX_RANK, &p->na));
	if (!p->na)
		for (int d = 0; d < p->r; d++)
			raw[p->na++] = d;
	for (int i = 0; i < p->na; i++)
		TRY(ap__onnx_norm_axis(im, raw[i], p->r, &p->axes[i]));
	for (int d = 0; d < p->r; d++) {
		p->scales[d] = 1;
		p->sizes[d] = x->sh.dims[d];
	}
	return 0;
}

/* The sizes input sz (constant integers, one per axis, >= 0) into
 * p->sizes, and the scales they imply.  AP_EINVAL for a count other than
 * the axes' or a negative size; errors as ap__onnx_get_ints. */
static int rz_by_sizes(imp *im, ival *sz, const ival *x, rz_plan *p)
{
	int64_t raw[AP_MAX_RANK];
	int cnt;

	TRY(ap__onnx_get_ints(im, sz, "Resize sizes", raw, AP_MAX_RANK, &cnt));
	if (cnt != p->na)
		return ap__onnx_fail(im, AP_EINVAL, sz->name, "Resize: %d sizes for %d axes", cnt,
				     p->na);
	for (int i = 0; i < p->na; i++) {
		int64_t a = p->axes[i];

		if (raw[i] < 0)
			return ap__onnx_fail(im, AP_EINVAL, sz->name, "Resize: negative size");
		p->sizes[a] = raw[i];
		p->scales[a] = x->sh.dims[a] ? (double)raw[i] / (double)x->sh.dims[a] : 1;
	}
	p->by_sizes = true;
	return 0;
}

/* The scales input sc (a constant float32 / float64 vector, one per axis)
 * into p->scales.  AP_EUNSUPPORTED otherwise; errors decoding sc. */
static int rz_by_scales(imp *im, const Onnx__NodeProto *n, ival *sc, rz_plan *p)
{
	const ap_host_tensor *d;

	if (!known(sc) || sh_numel(&sc->sh) != p->na ||
	    (sc->sh.dtype != AP_DT_F32 && sc->sh.dtype != AP_DT_F64))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, sc->name,
				     "%s: scales must be a constant float vector of %d values",
				     n->op_type, p->na);
	d = ap__onnx_val_data(im, sc);
	if (!d)
		return im->err ? im->err->code : AP_EINVAL;
	for (int i = 0; i < p->na; i++)
		p->scales[p->axes[i]] = d->dtype == AP_DT_F32 ? ((float *)d->data)[i]
							       : ((double *)d->data)[i];
	return 0;
}

/* The scales or sizes of n: the scales attribute of Upsample before opset
 * 9 (one per axis of x, AP_EINVAL otherwise), else exactly one of the
 * inputs scales and sizes (an empty one counts as absent; AP_EINVAL
 * otherwise).  roi is read and ignored (tf_crop_and_resize is refused). */
static int rz_scales(imp *im, const Onnx__NodeProto *n, bool upsample, const ival *x,
		     rz_plan *p)
{
	ival *roi = NULL, *sc = NULL, *sz = NULL;
	size_t si = upsample || im->opset < 11 ? 1 : 2;

	p->by_sizes = false;
	if (upsample && im->opset < 9) {
		const Onnx__AttributeProto *a = ap__onnx_attr(n, "scales");

		if (!a || a->n_floats != (size_t)p->r)
			return ap__onnx_fail(im, AP_EINVAL, NULL,
					     "Upsample: scales must have %d values", p->r);
		for (int d = 0; d < p->r; d++)
			p->scales[d] = a->floats[d];
		return 0;
	}
	if (!p->old)
		TRY(ap__onnx_get_in(im, n, 1, false, &roi));
	TRY(ap__onnx_get_in(im, n, si, false, &sc));
	if (!p->old)
		TRY(ap__onnx_get_in(im, n, 3, false, &sz));
	(void)roi;
	if (sc && sh_numel(&sc->sh) == 0)
		sc = NULL;
	if (sz && sh_numel(&sz->sh) == 0)
		sz = NULL;
	if (!sc == !sz)
		return ap__onnx_fail(im, AP_EINVAL, NULL, "%s: exactly one of scales and sizes",
				     n->op_type);
	return sz ? rz_by_sizes(im, sz, x, p) : rz_by_scales(im, n, sc, p);
}

/* Checks the scales (positive, finite: AP_EINVAL) and, when they were
 * given, computes the output sizes from them (floor(in * scale), the
 * scale rounded to float32).  AP_ETOOLARGE for an output of more than
 * AP_MAX_ELEMENTS elements or a resized axis longer than MAX_RESIZE_AXIS. */
static int rz_out_sizes(imp *im, const Onnx__NodeProto *n, const ival *x, rz_plan *p,
			const char *base)
{
	ap_shape o = x->sh;

	for (int d = 0; d < p->r; d++) {
		if (!(p->scales[d] > 0) || !isfinite(p->scales[d]))
			return ap__onnx_fail(im, AP_EINVAL, NULL, "%s: scale %g on axis %d",
					     n->op_type, p->scales[d], d);
		if (!p->by_sizes) {
			double len = floor((double)x->sh.dims[d] * (double)(float)p->scales[d]);

			if (len > (double)AP_MAX_ELEMENTS)
				return ap__onnx_fail(im, AP_ETOOLARGE, base, "%s: output too large",
						     n->op_type);
			p->sizes[d] = (int64_t)len;
		}
	}
	for (int d = 0; d < p->r; d++)
		o.dims[d] = p->sizes[d];
	if (sh_bytes(&o) < 0)
		return ap__onnx_fail(im, AP_ETOOLARGE, base, "%s: output too large", n->op_type);
	for (int d = 0; d < p->r; d++)
		if (p->sizes[d] > MAX_RESIZE_AXIS &&
		    (p->sizes[d] != x->sh.dims[d] || (float)p->scales[d] != 1.0f))
			return ap__onnx_fail(im, AP_ETOOLARGE, base,
					     "%s: output axis %d of %lld elements (at most %lld)",
					     n->op_type, d, (long long)p->sizes[d],
					     (long long)MAX_RESIZE_AXIS);
	return 0;
}

/* The tables of one resized axis of `out` elements: for output position
 * o the input index i1[o] (nearest), or the two neighbours i1[o], i2[o]
 * and their weights w1[o], w2[o] (linear); doubles, as array_val takes
 * them. */
typedef struct rz_tables {
	double *i1, *i2, *w1, *w2;
} rz_tables;

static void rz_tables_free(rz_tables *t)
{
	free(t->i1); free(t->i2); free(t->w1); free(t->w2);
}

/* Input coordinate xi of output coordinate xo (float32, as onnxruntime
 * computes it) under coordinate_transformation_mode ctm, for an axis of
 * `in` elements resized to `out` by scale s (len = in * s); false for a
 * mode it does not know. */
static bool rz_coord(const char *ctm, float xo, float s, float len, int64_t in, int64_t out,
		     float *xi)
{
	if (!strcmp(ctm, "half_pixel"))
		*xi = (xo + 0.5f) / s - 0.5f;
	else if (!strcmp(ctm, "pytorch_half_pixel"))
		*xi = len > 1.0f ? (xo + 0.5f) / s - 0.5f : 0.0f;
	else if (!strcmp(ctm, "align_corners"))
		*xi = len == 1.0f ? 0.0f : xo * (float)(in - 1) / (len - 1.0f);
	else if (!strcmp(ctm, "tf_half_pixel_for_nn"))
		*xi = (xo + 0.5f) / s;
	else if (!strcmp(ctm, "half_pixel_symmetric")) {
		float adj = (float)out / (s * (float)in), ctr = (float)in / 2.0f;

		*xi = ctr * (1.0f - adj) + (xo + 0.5f) / s - 0.5f;
	} else if (!strcmp(ctm, "asymmetric"))
		*xi = xo / s;
	else
		return false;
	return true;
}

/* The input index nearest to coordinate xi under nearest_mode nmode
 * ("simple" is Upsample's and old Resize's: ceil when downscaling,
 * truncation otherwise), clamped to [0, in - 1]. */
static double rz_nearest(const char *nmode, float xi, float s, int64_t in)
{
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
	return k < 0 ? 0 : k > (double)(in - 1) ? (double)(in - 1) : k;
}

/* Entry o of the linear tables for coordinate xi: the neighbours below
 * and above (clamped to the edge) and weights summing to 1. */
static void rz_linear(float xi, int64_t in, int64_t o, rz_tables *t)
{
	int64_t a, b;

	xi = xi < 0 ? 0 : xi > (float)(in - 1) ? (float)(in - 1) : xi;
	a = (int64_t)xi < in - 1 ? (int64_t)xi : in - 1;
	b = a + 1 < in - 1 ? a + 1 : in - 1;
	t->i1[o] = (double)a;
	t->i2[o] = (double)b;
	t->w1[o] = a == b ? 0.5 : fabsf(xi - (float)b);
	t->w2[o] = a == b ? 0.5 : fabsf(xi - (float)a);
}

/* Allocates and fills the tables of an axis of `in` elements resized to
 * `out` by scale s.  AP_ENOMEM; AP_EUNSUPPORTED for an unknown
 * coordinate_transformation_mode.  The caller frees t, also on error. */
static int rz_fill(imp *im, const Onnx__NodeProto *n, const rz_plan *p, int64_t in, int64_t out,
		   float s, rz_tables *t)
{
	float len = (float)in * s;   /* the resized length, fractional from a scale */

	t->i1 = calloc((size_t)out, sizeof(double));
	if (p->linear) {
		t->i2 = calloc((size_t)out, sizeof(double));
		t->w1 = calloc((size_t)out, sizeof(double));
		t->w2 = calloc((size_t)out, sizeof(double));
	}
	if (!t->i1 || (p->linear && (!t->i2 || !t->w1 || !t->w2)))
		return ap__onnx_nomem(im);
	for (int64_t o = 0; o < out; o++) {
		float xi;

		if (!rz_coord(p->ctm, (float)o, s, len, in, out, &xi))
			return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL,
					     "%s: coordinate_transformation_mode '%s'", n->op_type,
					     p->ctm);
		if (!p->linear)
			t->i1[o] = rz_nearest(p->nmode, xi, s, in);
		else
			rz_linear(xi, in, o, t);
	}
	return 0;
}

/* The error an emission along an axis failed with (AP_ENOMEM when a
 * constant could not be made). */
static int rz_error(imp *im)
{
	return im->err && im->err->code ? im->err->code : AP_ENOMEM;
}

/* y gathered along axis d at the `out` indices idx (a new int64 constant
 * named `tab`), into *g named `name`.  0 or rz_error. */
static int rz_gather(imp *im, ival *y, int d, int64_t out, const double *idx, const char *tab,
		     const char *name, ival **g)
{
	ival *pair[2];
	abuf A;

	A.n = 0;
	ab_int(&A, "axis", d);
	pair[0] = y;
	pair[1] = array_val(im, tab, AP_DT_I64, 1, &out, idx);
	if (!pair[1] || ap__onnx_emit1(im, AP_OP_GATHER, &A, 2, pair, name, NULL, g) < 0)
		return rz_error(im);
	return 0;
}

/* g times the weights w (a new constant of dtype dt and shape bdims
 * named `wname`), into *t named `name`.  0 or rz_error. */
static int rz_weigh(imp *im, ival *g, const double *w, ap_dtype dt, int r, const int64_t *bdims,
		    const char *wname, const char *name, ival **t)
{
	ival *pair[2];

	pair[0] = g;
	pair[1] = array_val(im, wname, dt, r, bdims, w);
	if (!pair[1] || ap__onnx_emit1(im, AP_OP_MUL, NULL, 2, pair, name, NULL, t) < 0)
		return rz_error(im);
	return 0;
}

/* Linear along axis d: y gathered at the neighbours above (i2; g1, those
 * below, already gathered), both weighed (w1, w2 broadcast along d) and
 * added into *y, named base when `last`. */
static int rz_mix(imp *im, const rz_plan *p, const rz_tables *t, ival *g1, int d, int64_t out,
		  bool last, const char *base, ival **y)
{
	int64_t bdims[AP_MAX_RANK];
	ival *g2, *t1, *t2, *pair[2];
	char tab[NAME_CAP], nm[NAME_CAP];

	for (int e = 0; e < p->r; e++)
		bdims[e] = e == d ? out : 1;
	snprintf(tab, sizeof(tab), "%.200s_idx%d_hi", base, d);
	snprintf(nm, sizeof(nm), "%.200s_axis%d_hi", base, d);
	TRY(rz_gather(im, *y, d, out, t->i2, tab, nm, &g2));
	snprintf(tab, sizeof(tab), "%.200s_w%d", base, d);
	snprintf(nm, sizeof(nm), "%.200s_lo%d", base, d);
	TRY(rz_weigh(im, g1, t->w1, p->dt, p->r, bdims, tab, nm, &t1));
	snprintf(tab, sizeof(tab), "%.200s_w%d_hi", base, d);
	snprintf(nm, sizeof(nm), "%.200s_hi%d", base, d);
	TRY(rz_weigh(im, g2, t->w2, p->dt, p->r, bdims, tab, nm, &t2));
	pair[0] = t1;
	pair[1] = t2;
	snprintf(nm, sizeof(nm), "%.200s_axis%d_mix", base, d);
	if (ap__onnx_emit1(im, AP_OP_ADD, NULL, 2, pair, last ? base : nm, NULL, y) < 0)
		return rz_error(im);
	return 0;
}

/* Resizes *y (x resized along the axes before d) along axis d: nearest
 * is one Gather, linear two Gathers weighed and added (rz_mix).  The
 * result is named base when no later axis is resized (`last`). */
static int rz_axis(imp *im, const Onnx__NodeProto *n, const rz_plan *p, const ival *x, int d,
		   bool last, const char *base, ival **y)
{
	int64_t in = x->sh.dims[d], out = p->sizes[d];
	rz_tables t = { NULL, NULL, NULL, NULL };
	char tab[NAME_CAP], nm[NAME_CAP];
	ival *g1;
	int rc;

	rc = rz_fill(im, n, p, in, out, (float)p->scales[d], &t);
	if (rc == 0) {
		snprintf(tab, sizeof(tab), "%.200s_idx%d", base, d);
		snprintf(nm, sizeof(nm), "%.200s_axis%d", base, d);
		rc = rz_gather(im, *y, d, out, t.i1, tab, p->linear || !last ? nm : base, &g1);
	}
	if (rc == 0 && !p->linear)
		*y = g1;
	else if (rc == 0)
		rc = rz_mix(im, p, &t, g1, d, out, last, base, y);
	rz_tables_free(&t);
	return rc;
}

/* Whether no axis after d is resized. */
static bool rz_last(const rz_plan *p, const ival *x, int d)
{
	for (int e = d + 1; e < p->r; e++)
		if (p->sizes[e] != x->sh.dims[e] || (float)p->scales[e] != 1.0f)
			return false;
	return true;
}

/* Resize (opsets 10-19) and Upsample (7-9) in nearest and linear modes:
 * separable, one resized axis at a time (rz_axis); an Identity when no
 * axis changes.  Errors: AP_EUNSUPPORTED for a mode, coordinate transform
 * or dtype not supported and for an empty resized axis, AP_EINVAL for bad
 * scales or sizes, AP_ETOOLARGE for an output too large. */
int ap__onnx_imp_resize(imp *im, const Onnx__NodeProto *n, bool upsample)
{
	ival *x, *y;
	rz_plan p;
	const char *base = out_name(n, 0);

	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	TRY(rz_modes(im, n, upsample, x, &p));
	TRY(rz_axes(im, n, x, &p));
	TRY(rz_scales(im, n, upsample, x, &p));
	TRY(rz_out_sizes(im, n, x, &p, base));
	y = x;
	for (int d = 0; d < p.r; d++) {
		if (p.sizes[d] == x->sh.dims[d] && (float)p.scales[d] == 1.0f)
			continue;
		if (x->sh.dims[d] == 0 || p.sizes[d] == 0)
			return ap__onnx_fail(im, AP_EUNSUPPORTED, x->name, "%s of an empty axis",
					     n->op_type);
		TRY(rz_axis(im, n, &p, x, d, rz_last(&p, x, d), base, &y));
	}
	if (y == x)
		TRY(ap__onnx_emit1(im, AP_OP_IDENTITY, NULL, 1, &x, base, NULL, &y));
	return ap__onnx_bind(im, base, y);
}
