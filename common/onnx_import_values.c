/* onnx_import_values.c -- the bookkeeping of the ONNX importer (see
 * onnx_import.c for the approach): errors that name the node being
 * imported, sets of the names used in the graph, the map from ONNX value
 * names to what the importer knows of them (an `ival`: dtype, static shape,
 * and the data when known, decoded lazily), constructors of known values,
 * and the readers of an ONNX node's attributes and inputs.  It imports no
 * ONNX op itself; the readers follow the ONNX IR
 * (https://onnx.ai/onnx/repo-docs/IR.html) for defaults and absent inputs.
 */
#include "onnx_import_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors and names -------------------------------------------------------- */

int ap__onnx_fail(imp *im, int code, const char *tensor, const char *fmt, ...)
{
	va_list ap;

	if (!im->err)
		return code;
	im->err->code = code;
	snprintf(im->err->node, sizeof(im->err->node), "%s", im->node ? im->node : "");
	snprintf(im->err->tensor, sizeof(im->err->tensor), "%s", tensor ? tensor : "");
	va_start(ap, fmt);
	vsnprintf(im->err->msg, sizeof(im->err->msg), fmt, ap);
	va_end(ap);
	return code;
}

int ap__onnx_nomem(imp *im)
{
	return ap__onnx_fail(im, AP_ENOMEM, NULL, "out of memory");
}

bool ap__onnx_ss_has(const strset *s, const char *name)
{
	size_t i;

	if (!s->cap)
		return false;
	i = (size_t)ap__fnv1a(name) & (s->cap - 1);
	while (s->slots[i]) {
		if (strcmp(s->slots[i], name) == 0)
			return true;
		i = (i + 1) & (s->cap - 1);
	}
	return false;
}

int ap__onnx_ss_add(strset *s, const char *name)
{
	size_t i;

	if (2 * (s->n + 1) > s->cap) {
		size_t ncap = s->cap ? 2 * s->cap : 64;
		char **slots = calloc(ncap, sizeof(*slots));

		if (!slots)
			return AP_ENOMEM;
		for (size_t j = 0; j < s->cap; j++) {
			if (!s->slots[j])
				continue;
			i = (size_t)ap__fnv1a(s->slots[j]) & (ncap - 1);
			while (slots[i])
				i = (i + 1) & (ncap - 1);
			slots[i] = s->slots[j];
		}
		free(s->slots);
		s->slots = slots;
		s->cap = ncap;
	}
	i = (size_t)ap__fnv1a(name) & (s->cap - 1);
	while (s->slots[i]) {
		if (strcmp(s->slots[i], name) == 0)
			return 0;
		i = (i + 1) & (s->cap - 1);
	}
	s->slots[i] = ap_strdup(name);
	if (!s->slots[i])
		return AP_ENOMEM;
	s->n++;
	return 0;
}

static void ss_free(strset *s)
{
	for (size_t i = 0; i < s->cap; i++)
		free(s->slots[i]);
	free(s->slots);
}

/* Writes a name not yet in `s` (base, base_1, base_2, ...) to out and
 * records it. */
int ap__onnx_uniq(imp *im, strset *s, const char *base, char *out)
{
	char b[NAME_CAP - 16];

	snprintf(b, sizeof(b), "%s", base && base[0] ? base : "t");
	snprintf(out, NAME_CAP, "%s", b);
	for (int k = 1; ap__onnx_ss_has(s, out); k++)
		snprintf(out, NAME_CAP, "%s_%d", b, k);
	if (ap__onnx_ss_add(s, out) < 0)
		return ap__onnx_nomem(im);
	return 0;
}

/* ---- ONNX name -> value ---------------------------------------------------------- */

ival *ap__onnx_lookup(imp *im, const char *name)
{
	size_t i;

	if (!im->map_cap)
		return NULL;
	i = (size_t)ap__fnv1a(name) & (im->map_cap - 1);
	while (im->map[i].key) {
		if (strcmp(im->map[i].key, name) == 0)
			return im->map[i].v;
		i = (i + 1) & (im->map_cap - 1);
	}
	return NULL;
}

/* Makes ONNX name `name` refer to v (a later binding replaces an earlier). */
int ap__onnx_bind(imp *im, const char *name, ival *v)
{
	size_t i;

	if (!name || !name[0])
		return 0;
	if (2 * (im->map_n + 1) > im->map_cap) {
		size_t ncap = im->map_cap ? 2 * im->map_cap : 256;
		entry *m = calloc(ncap, sizeof(*m));

		if (!m)
			return ap__onnx_nomem(im);
		for (size_t j = 0; j < im->map_cap; j++) {
			if (!im->map[j].key)
				continue;
			i = (size_t)ap__fnv1a(im->map[j].key) & (ncap - 1);
			while (m[i].key)
				i = (i + 1) & (ncap - 1);
			m[i] = im->map[j];
		}
		free(im->map);
		im->map = m;
		im->map_cap = ncap;
	}
	i = (size_t)ap__fnv1a(name) & (im->map_cap - 1);
	while (im->map[i].key) {
		if (strcmp(im->map[i].key, name) == 0) {
			im->map[i].v = v;
			return 0;
		}
		i = (i + 1) & (im->map_cap - 1);
	}
	im->map[i].key = ap_strdup(name);
	if (!im->map[i].key)
		return ap__onnx_nomem(im);
	im->map[i].v = v;
	im->map_n++;
	return 0;
}

ival *ap__onnx_new_val(imp *im, const char *name)
{
	ival *v;

	if (im->n_all == im->cap_all) {
		int ncap = im->cap_all ? 2 * im->cap_all : 256;
		ival **p = realloc(im->all, (size_t)ncap * sizeof(*p));

		if (!p) {
			ap__onnx_nomem(im);
			return NULL;
		}
		im->all = p;
		im->cap_all = ncap;
	}
	v = calloc(1, sizeof(*v));
	if (!v || !(v->name = ap_strdup(name))) {
		free(v);
		ap__onnx_nomem(im);
		return NULL;
	}
	v->tensor = -1;
	im->all[im->n_all++] = v;
	return v;
}

/* ---- known values --------------------------------------------------------------- */

/* A TensorProto's data: decoded from the model, or read from its external
 * file (ap__onnx_external_load).  NULL with im->err set. */
__ap_give ap_host_tensor *ap__onnx_tensor_load(imp *im, const Onnx__TensorProto *tp,
					       const char *what)
{
	if (ap__onnx_is_external(tp))
		return ap__onnx_external_load(tp, what, im->model_dir, &im->external_bytes,
					      im->err);
	return ap__onnx_tensor_from_proto(tp, what, im->err);
}

/* The data of a known value, decoding it on first use. */
const ap_host_tensor *ap__onnx_val_data(imp *im, ival *v)
{
	if (v->data)
		return v->data;
	if (!v->lazy) {
		ap__onnx_fail(im, AP_EINTERNAL, v->name, "value '%s' has no data", v->name);
		return NULL;
	}
	v->data = ap__onnx_tensor_load(im, v->lazy, v->name);
	if (!v->data) {
		snprintf(im->err->node, sizeof(im->err->node), "%s", im->node ? im->node : "");
		return NULL;
	}
	v->lazy = NULL;
	return v->data;
}

ival *ap__onnx_const_val(imp *im, const char *name, __ap_take ap_host_tensor *t)
{
	ival *v = ap__onnx_new_val(im, name);

	if (!v) {
		ap_host_tensor_free(t);
		return NULL;
	}
	v->data = t;
	v->sh.dtype = t->dtype;
	v->sh.rank = t->rank;
	memcpy(v->sh.dims, t->dims, sizeof(v->sh.dims));
	return v;
}

/* A new known int64 vector value. */
ival *ap__onnx_ints_val(imp *im, const char *name, const int64_t *vals, int n)
{
	int64_t d = n;
	ap_host_tensor *t = ap__host_tensor_new(name, AP_DT_I64, 1, &d);

	if (!t) {
		ap__onnx_nomem(im);
		return NULL;
	}
	if (n)
		memcpy(t->data, vals, (size_t)n * sizeof(int64_t));
	return ap__onnx_const_val(im, name, t);
}

ival *ap__onnx_scalar_val(imp *im, const char *name, ap_dtype dt, double f, int64_t i)
{
	ap_host_tensor *t = ap__host_tensor_new(name, dt, 0, NULL);

	if (!t) {
		ap__onnx_nomem(im);
		return NULL;
	}
	switch (dt) {
	case AP_DT_F32: *(float *)t->data = (float)f; break;
	case AP_DT_F64: *(double *)t->data = f; break;
	case AP_DT_F16: case AP_DT_BF16: ap_elem_set(t->data, dt, 0, f); break;
	case AP_DT_I32: *(int32_t *)t->data = (int32_t)i; break;
	case AP_DT_I64: *(int64_t *)t->data = i; break;
	case AP_DT_I8: *(int8_t *)t->data = (int8_t)i; break;
	case AP_DT_BOOL: *(uint8_t *)t->data = i != 0; break;
	default: *(uint8_t *)t->data = (uint8_t)i; break;
	}
	return ap__onnx_const_val(im, name, t);
}

/* ---- ONNX attributes ------------------------------------------------------------ */

const Onnx__AttributeProto *ap__onnx_attr(const Onnx__NodeProto *n, const char *name)
{
	for (size_t i = 0; i < n->n_attribute; i++)
		if (n->attribute[i]->name && strcmp(n->attribute[i]->name, name) == 0)
			return n->attribute[i];
	return NULL;
}

int64_t ap__onnx_aint(const Onnx__NodeProto *n, const char *name, int64_t dflt)
{
	const Onnx__AttributeProto *a = ap__onnx_attr(n, name);

	if (!a)
		return dflt;
	if (a->has_i)
		return a->i;
	if (a->has_f)
		return ap_f64_to_i64(a->f);
	return dflt;
}

double ap__onnx_afloat(const Onnx__NodeProto *n, const char *name, double dflt)
{
	const Onnx__AttributeProto *a = ap__onnx_attr(n, name);

	if (!a)
		return dflt;
	if (a->has_f)
		return a->f;
	if (a->has_i)
		return (double)a->i;
	return dflt;
}

/* Copies a STRING attribute (at most cap-1 bytes) into buf. */
const char *ap__onnx_astr(const Onnx__NodeProto *n, const char *name, const char *dflt, char *buf,
			  size_t cap)
{
	const Onnx__AttributeProto *a = ap__onnx_attr(n, name);
	size_t len;

	if (!a || !a->has_s)
		return dflt;
	len = a->s.len < cap - 1 ? a->s.len : cap - 1;
	memcpy(buf, a->s.data, len);
	buf[len] = '\0';
	return buf;
}

/* INTS attribute: 1 when present (count in *cnt), 0 when absent. */
int ap__onnx_aints(imp *im, const Onnx__NodeProto *n, const char *name, int64_t *out, int max,
		   int *cnt)
{
	const Onnx__AttributeProto *a = ap__onnx_attr(n, name);

	*cnt = 0;
	if (!a)
		return 0;
	if (a->n_ints > (size_t)max)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL,
				     "attribute '%s' has %zu values (at most %d)", name, a->n_ints,
				     max);
	for (size_t i = 0; i < a->n_ints; i++)
		out[i] = a->ints[i];
	*cnt = (int)a->n_ints;
	return 1;
}

/* ---- ONNX inputs ------------------------------------------------------------------ */

/* Input k of n (NULL when absent or ""); AP_EINVAL when the name is
 * unknown, or when `required` and it is absent. */
int ap__onnx_get_in(imp *im, const Onnx__NodeProto *n, size_t k, bool required, ival **out)
{
	const char *name = k < n->n_input ? n->input[k] : NULL;

	*out = NULL;
	if (!name || !name[0]) {
		if (required)
			return ap__onnx_fail(im, AP_EINVAL, NULL,
					     "%s: required input %zu is missing", n->op_type, k);
		return 0;
	}
	*out = ap__onnx_lookup(im, name);
	if (!*out)
		return ap__onnx_fail(im, AP_EINVAL, name,
				     "input '%s' is not produced by any earlier node, "
				     "initializer or graph input", name);
	if ((*out)->poison)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, name,
				     "'%s' (%s of node '%s') is not supported", name,
				     (*out)->poison, (*out)->poison_node);
	return 0;
}

/* The values of a known integer vector (or scalar) v, at most max. */
int ap__onnx_get_ints(imp *im, ival *v, const char *what, int64_t *out, int max, int *cnt)
{
	const ap_host_tensor *d;
	int64_t n;

	if (!known(v))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, v->name,
				     "%s '%s' must be a compile-time constant (an initializer, a Constant or "
				     "an input given with data)", what, v->name);
	if (!int_dtype(v->sh.dtype))
		return ap__onnx_fail(im, AP_EINVAL, v->name,
				     "%s '%s' must be an integer tensor, not %s", what, v->name,
				     ap_dtype_name(v->sh.dtype));
	n = sh_numel(&v->sh);
	if (n < 0 || n > max || v->sh.rank > 1)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, v->name,
				     "%s '%s' has %lld values (at most %d, rank <= 1)", what,
				     v->name, (long long)n, max);
	d = ap__onnx_val_data(im, v);
	if (!d)
		return im->err ? im->err->code : AP_EINVAL;
	for (int64_t i = 0; i < n; i++)
		out[i] = d->dtype == AP_DT_I64 ? ((int64_t *)d->data)[i] :
			 d->dtype == AP_DT_I32 ? ((int32_t *)d->data)[i] :
			 d->dtype == AP_DT_I8 ? ((int8_t *)d->data)[i] : ((uint8_t *)d->data)[i];
	*cnt = (int)n;
	return 0;
}

/* The single value of a known scalar (or 1-element) v as double. */
int ap__onnx_get_scalar(imp *im, ival *v, const char *what, double *out)
{
	const ap_host_tensor *d;

	if (!known(v))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, v->name,
				     "%s '%s' must be a compile-time constant", what, v->name);
	if (sh_numel(&v->sh) != 1)
		return ap__onnx_fail(im, AP_EINVAL, v->name, "%s '%s' must hold exactly one value",
				     what, v->name);
	d = ap__onnx_val_data(im, v);
	if (!d)
		return im->err ? im->err->code : AP_EINVAL;
	switch (d->dtype) {
	case AP_DT_F32: *out = *(float *)d->data; break;
	case AP_DT_F64: *out = *(double *)d->data; break;
	case AP_DT_F16: case AP_DT_BF16: *out = ap_elem_get(d->data, d->dtype, 0); break;
	case AP_DT_I32: *out = *(int32_t *)d->data; break;
	case AP_DT_I64: *out = (double)*(int64_t *)d->data; break;
	case AP_DT_I8: *out = *(int8_t *)d->data; break;
	default: *out = *(uint8_t *)d->data; break;
	}
	return 0;
}

/* Axis normalised into [0, rank). */
int ap__onnx_norm_axis(imp *im, int64_t axis, int rank, int64_t *out)
{
	*out = 0;
	if (axis < -rank || axis >= rank)
		return ap__onnx_fail(im, AP_EINVAL, NULL, "axis %lld out of range for rank %d",
				     (long long)axis, rank);
	*out = axis < 0 ? axis + rank : axis;
	return 0;
}

/* Sorted, distinct, non-negative axes. */
int ap__onnx_norm_axes(imp *im, int64_t *axes, int *n, int rank)
{
	bool seen[AP_MAX_RANK] = { false };
	int m = 0;

	for (int i = 0; i < *n; i++) {
		int64_t a;

		if (ap__onnx_norm_axis(im, axes[i], rank, &a) < 0)
			return AP_EINVAL;
		seen[a] = true;
	}
	for (int d = 0; d < rank; d++)
		if (seen[d])
			axes[m++] = d;
	*n = m;
	return 0;
}

/* Marks optional output k of n as unusable (e.g. Dropout's mask). */
int ap__onnx_poison_out(imp *im, const Onnx__NodeProto *n, size_t k, const char *why)
{
	ival *v;

	if (!out_name(n, k)[0])
		return 0;
	v = ap__onnx_new_val(im, out_name(n, k));
	if (!v)
		return AP_ENOMEM;
	v->poison = why;
	snprintf(v->poison_node, sizeof(v->poison_node), "%s", im->node);
	return ap__onnx_bind(im, out_name(n, k), v);
}

void ap__onnx_clear(imp *im)
{
	for (int i = 0; i < im->n_all; i++) {
		free(im->all[i]->name);
		ap_host_tensor_free(im->all[i]->data);
		free(im->all[i]);
	}
	free(im->all);
	for (size_t i = 0; i < im->map_cap; i++)
		free(im->map[i].key);
	free(im->map);
	ss_free(&im->tnames);
	ss_free(&im->nnames);
}
