/* onnx_import.c -- ap_onnx_import: an ONNX ModelProto (IR 3-13, default
 * domain opsets 1-25) into a validated Apollo graph of normalised nodes.
 *
 * The importer walks the ONNX nodes once, in file order (the IR requires
 * topological order), and keeps for every ONNX value name what it knows of
 * it (an `ival`): dtype and static shape always; the data when it is a
 * compile-time constant (initializer, Constant node, integer graph input
 * given with data, or a folded result); or "a large constant fill" for a
 * ConstantOfShape too big to spell out.  Nothing enters the graph until a
 * node that is kept needs it ("materialise"): a known value then becomes a
 * CONST tensor (at most AP_CONST_MAX_BYTES) or a PARAM whose data goes to
 * the parameter store; a fill becomes an Expand of a scalar CONST.
 *
 * Each ONNX node is lowered, for its opset, into zero or more normalised
 * nodes (ops.def): attributes and constant inputs resolved to the
 * normalised attributes, auto_pad/output_shape to explicit pads, legacy
 * broadcast=1 into a Reshape of the second operand, variadic Sum/Max/Min/
 * Mean into chains, Flatten/Squeeze/Unsqueeze into Reshape, Global*Pool
 * into reductions.  Every normalised node goes through emit(): its output
 * shapes come from ap__op_infer (ops.c), and when all its inputs are known
 * constants (any op: the reference evaluator, onnx_fold.c, implements them
 * all) and its outputs and the work are bounded (FOLD_MAX_BYTES,
 * FOLD_MAX_WORK) it is evaluated on the spot instead of being added, so
 * subgraphs that compute masks and tables from constants disappear.
 * Weights are not constants here: floating-point data too large to travel
 * by value (AP_CONST_MAX_BYTES), an initializer's or a Constant's, is a
 * PARAM that the client binds at launch (a training job's weights change
 * every step), so nothing that reads one is folded, and a model whose
 * integer inputs are given still compiles its data path instead of
 * collapsing into the evaluator.  This also makes the structure-only
 * import (no parameter store: ap_onnx_skeleton drops exactly those bytes)
 * fold what the full import folds, so both give one graph.  Shape,
 * Size, ConstantOfShape and Range are answered from static shapes and
 * constants directly, and an If whose condition is known is replaced by
 * the nodes of the branch it takes.
 *
 * At the end every graph output is made a VALUE tensor produced by a node
 * (an Identity is added when it is an input, a constant or listed twice),
 * eager_kernels is set, and ap_graph_validate checks the result.
 *
 * Errors name the ONNX node they concern (err->node) and say what was
 * wrong; no state outlives a call, so concurrent imports are independent.
 */
#include "onnx_internal.h"
#include "pb_budget.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_CAP 256
#define MAX_INTS 16          /* longest INTS attribute the importer builds */
#define MAX_RANGE_ELEMS ((int64_t)1 << 20)   /* a Range is data: 8 MiB at most */
/* Resize/Upsample become Gathers over per-axis index and weight tables
 * (constants built here): an axis of the output may be at most this long. */
#define MAX_RESIZE_AXIS ((int64_t)1 << 20)
/* Constant folding: a node whose inputs are all known is evaluated at
 * import when each output is at most FOLD_MAX_BYTES and the evaluation
 * visits at most FOLD_MAX_WORK elements (fold_work); its results become
 * CONSTs, or PARAMs with data when larger than AP_CONST_MAX_BYTES. */
#define FOLD_MAX_BYTES ((int64_t)16 << 20)
#define FOLD_MAX_WORK ((int64_t)1 << 27)
/* A model may take this many times its size once decoded, plus 16 MiB:
 * weights decode at 1x, structure at 2-18x (the backend-test models);
 * crafted bytes would take much more (issue 11, item 6). */
#define MODEL_DECODE_RATIO 16
#define MODEL_DECODE_FLOOR ((size_t)16 << 20)

/* ---- what the importer knows of an ONNX value ---------------------------- */

typedef struct ival {
	char *name;
	ap_shape sh;
	int tensor;                      /* graph tensor, -1 until materialised */
	ap_host_tensor *data;            /* known value (owned) */
	const Onnx__TensorProto *lazy;   /* known value not yet decoded */
	bool fill;                       /* every element equals fill_f / fill_i */
	bool weight;                     /* large float data: never folded into */
	double fill_f;
	int64_t fill_i;
	const char *poison;              /* why this value must not be used */
	char poison_node[128];
} ival;

typedef struct entry {
	char *key;
	ival *v;
} entry;

typedef struct strset {
	char **slots;
	size_t cap, n;
} strset;

typedef struct imp {
	ap_graph *g;
	ap_params *params;
	bool shape_only;                 /* no parameter store: large data never read */
	int params_cap;
	int64_t opset;
	ap_error *err;
	entry *map;                      /* ONNX name -> ival (open addressing) */
	size_t map_cap, map_n;
	ival **all;                      /* every ival, for freeing */
	int n_all, cap_all;
	strset tnames, nnames;           /* names used in the graph */
	const char *node;                /* ONNX node being imported */
	int n_made;                      /* counter for made-up node names */
	int n_emitted;                   /* normalised nodes added so far */
	unsigned eager;
} imp;

/* ---- small utilities ----------------------------------------------------------- */

static int fail(imp *im, int code, const char *tensor, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail(imp *im, int code, const char *tensor, const char *fmt, ...)
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

static int nomem(imp *im)
{
	return fail(im, AP_ENOMEM, NULL, "out of memory");
}

static bool ss_has(const strset *s, const char *name)
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

static int ss_add(strset *s, const char *name)
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
static int uniq(imp *im, strset *s, const char *base, char *out)
{
	char b[NAME_CAP - 16];

	snprintf(b, sizeof(b), "%s", base && base[0] ? base : "t");
	snprintf(out, NAME_CAP, "%s", b);
	for (int k = 1; ss_has(s, out); k++)
		snprintf(out, NAME_CAP, "%s_%d", b, k);
	if (ss_add(s, out) < 0)
		return nomem(im);
	return 0;
}

static ival *lookup(imp *im, const char *name)
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
static int bind(imp *im, const char *name, ival *v)
{
	size_t i;

	if (!name || !name[0])
		return 0;
	if (2 * (im->map_n + 1) > im->map_cap) {
		size_t ncap = im->map_cap ? 2 * im->map_cap : 256;
		entry *m = calloc(ncap, sizeof(*m));

		if (!m)
			return nomem(im);
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
		return nomem(im);
	im->map[i].v = v;
	im->map_n++;
	return 0;
}

static ival *new_val(imp *im, const char *name)
{
	ival *v;

	if (im->n_all == im->cap_all) {
		int ncap = im->cap_all ? 2 * im->cap_all : 256;
		ival **p = realloc(im->all, (size_t)ncap * sizeof(*p));

		if (!p) {
			nomem(im);
			return NULL;
		}
		im->all = p;
		im->cap_all = ncap;
	}
	v = calloc(1, sizeof(*v));
	if (!v || !(v->name = ap_strdup(name))) {
		free(v);
		nomem(im);
		return NULL;
	}
	v->tensor = -1;
	im->all[im->n_all++] = v;
	return v;
}

static int64_t sh_numel(const ap_shape *s)
{
	return ap__shape_numel(s->rank, s->dims);
}

/* Bytes of a value, or -1 when its element count is out of range. */
static int64_t sh_bytes(const ap_shape *s)
{
	int64_t n = sh_numel(s);
	size_t es = ap_dtype_size(s->dtype);

	return n < 0 || es == 0 ? -1 : n * (int64_t)es;
}

/* The dtypes a graph tensor may have (validate.c accepts the same). */
static bool graph_dtype(ap_dtype dt)
{
	return dt == AP_DT_F32 || dt == AP_DT_F64 || dt == AP_DT_F16 || dt == AP_DT_BF16 ||
	       dt == AP_DT_I32 || dt == AP_DT_I64 || dt == AP_DT_BOOL;
}

static bool int_dtype(ap_dtype dt)
{
	return dt == AP_DT_I32 || dt == AP_DT_I64 || dt == AP_DT_I8 || dt == AP_DT_U8;
}

static bool float_dtype(ap_dtype dt)
{
	return dt == AP_DT_F32 || dt == AP_DT_F64 || dt == AP_DT_F16 || dt == AP_DT_BF16;
}

static bool known(const ival *v)
{
	return v && (v->data || v->lazy);
}

/* Known, and small enough to travel as a CONST (a structure-only import
 * decodes only these). */
static bool known_small(const ival *v)
{
	int64_t b = v ? sh_bytes(&v->sh) : -1;

	return known(v) && b >= 0 && b <= AP_CONST_MAX_BYTES;
}

/* Known and readable: a structure-only import (no parameter store) lacks
 * the bytes of large floating-point tensors (ap_onnx_skeleton drops them;
 * they are weights, never folded into, so both imports give one graph). */
static bool readable(const imp *im, const ival *v)
{
	return known(v) && (v->data || !im->shape_only || known_small(v) || !float_dtype(v->sh.dtype));
}

/* The data of a known value, decoding it on first use. */
static const ap_host_tensor *val_data(imp *im, ival *v)
{
	if (v->data)
		return v->data;
	if (!v->lazy) {
		fail(im, AP_EINTERNAL, v->name, "value '%s' has no data", v->name);
		return NULL;
	}
	v->data = ap__onnx_tensor_from_proto(v->lazy, v->name, im->err);
	if (!v->data) {
		snprintf(im->err->node, sizeof(im->err->node), "%s", im->node ? im->node : "");
		return NULL;
	}
	v->lazy = NULL;
	return v->data;
}

static ival *const_val(imp *im, const char *name, ap_host_tensor *t)
{
	ival *v = new_val(im, name);

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
static ival *ints_val(imp *im, const char *name, const int64_t *vals, int n)
{
	int64_t d = n;
	ap_host_tensor *t = ap__host_tensor_new(name, AP_DT_I64, 1, &d);

	if (!t) {
		nomem(im);
		return NULL;
	}
	if (n)
		memcpy(t->data, vals, (size_t)n * sizeof(int64_t));
	return const_val(im, name, t);
}

static ival *scalar_val(imp *im, const char *name, ap_dtype dt, double f, int64_t i)
{
	ap_host_tensor *t = ap__host_tensor_new(name, dt, 0, NULL);

	if (!t) {
		nomem(im);
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
	return const_val(im, name, t);
}

/* ---- putting values into the graph ------------------------------------------- */

static int add_param(imp *im, ap_host_tensor *t)
{
	if (!im->params) {
		im->params = calloc(1, sizeof(*im->params));
		if (!im->params)
			return nomem(im);
	}
	if (im->params->n == im->params_cap) {
		int ncap = im->params_cap ? 2 * im->params_cap : 16;
		ap_host_tensor **p = realloc(im->params->items, (size_t)ncap * sizeof(*p));

		if (!p)
			return nomem(im);
		im->params->items = p;
		im->params_cap = ncap;
	}
	im->params->items[im->params->n++] = t;
	return 0;
}

static int emit_node(imp *im, const char *base, ap_op op, const ap_attr *attrs, int n_attrs,
		     int n_in, const int *ins, int n_out, const int *outs);

/* The graph tensor of v, creating it (CONST, PARAM or Expand of a fill)
 * on first use. */
static int materialise(imp *im, ival *v)
{
	char name[NAME_CAP];
	int64_t bytes;
	int t;

	if (v->poison)
		return fail(im, AP_EUNSUPPORTED, v->name, "'%s' (%s of node '%s') is not supported",
			    v->name, v->poison, v->poison_node);
	if (v->tensor >= 0)
		return v->tensor;
	if (!graph_dtype(v->sh.dtype))
		return fail(im, AP_EUNSUPPORTED, v->name,
			    "constant '%s' has dtype %s, which Apollo does not compute with "
			    "(float32, float64, int32, int64, bool)", v->name, ap_dtype_name(v->sh.dtype));
	bytes = sh_bytes(&v->sh);
	if (im->shape_only && !v->data && v->lazy && (bytes < 0 || bytes > AP_CONST_MAX_BYTES)) {
		/* a weight: its dims and dtype are the PARAM (ap_onnx_skeleton) */
		if (uniq(im, &im->tnames, v->name, name) < 0)
			return AP_ENOMEM;
		t = ap_graph_add_tensor(im->g, name, v->sh.dtype, v->sh.rank, v->sh.dims,
					AP_TENSOR_PARAM, NULL, 0);
		if (t < 0)
			return nomem(im);
		v->tensor = t;
		return t;
	}
	if (known(v)) {
		const ap_host_tensor *d = val_data(im, v);

		if (!d)
			return im->err ? im->err->code : AP_EINVAL;
		if (uniq(im, &im->tnames, v->name, name) < 0)
			return AP_ENOMEM;
		if (bytes >= 0 && bytes <= AP_CONST_MAX_BYTES) {
			t = ap_graph_add_tensor(im->g, name, d->dtype, d->rank, d->dims,
						AP_TENSOR_CONST, d->data, d->nbytes);
		} else {
			ap_host_tensor *p = v->data;
			char *pn = ap_strdup(name);

			if (!pn)
				return nomem(im);
			free(p->name);
			p->name = pn;
			t = ap_graph_add_tensor(im->g, name, p->dtype, p->rank, p->dims,
						AP_TENSOR_PARAM, NULL, 0);
			if (t >= 0) {
				if (add_param(im, p) < 0)
					return AP_ENOMEM;
				v->data = NULL;
			}
		}
		if (t < 0)
			return nomem(im);
		v->tensor = t;
		return t;
	}
	if (v->fill) {
		ival *s = scalar_val(im, v->name, v->sh.dtype, v->fill_f, v->fill_i);
		int st, out;

		if (!s)
			return AP_ENOMEM;
		st = materialise(im, s);
		if (st < 0)
			return st;
		if (uniq(im, &im->tnames, v->name, name) < 0)
			return AP_ENOMEM;
		out = ap_graph_add_tensor(im->g, name, v->sh.dtype, v->sh.rank, v->sh.dims,
					  AP_TENSOR_VALUE, NULL, 0);
		if (out < 0)
			return nomem(im);
		if (emit_node(im, v->name, AP_OP_EXPAND, NULL, 0, 1, &st, 1, &out) < 0)
			return AP_ENOMEM;
		v->tensor = out;
		return out;
	}
	return fail(im, AP_EINTERNAL, v->name, "value '%s' has neither data nor a producer", v->name);
}

/* Adds a node with a unique name derived from `base` and copies attrs. */
static int emit_node(imp *im, const char *base, ap_op op, const ap_attr *attrs, int n_attrs,
		     int n_in, const int *ins, int n_out, const int *outs)
{
	char name[NAME_CAP];
	int n, rc = 0;

	if (uniq(im, &im->nnames, base, name) < 0)
		return AP_ENOMEM;
	n = ap_graph_add_node(im->g, name, op, n_in, ins, n_out, outs);
	if (n < 0)
		return nomem(im);
	for (int a = 0; a < n_attrs && rc == 0; a++) {
		const ap_attr *at = &attrs[a];

		switch (at->type) {
		case AP_ATTR_INT: rc = ap_node_set_int(im->g, n, at->name, at->i); break;
		case AP_ATTR_FLOAT: rc = ap_node_set_float(im->g, n, at->name, at->f); break;
		case AP_ATTR_STRING: rc = ap_node_set_string(im->g, n, at->name, at->s); break;
		case AP_ATTR_INTS: rc = ap_node_set_ints(im->g, n, at->name, at->ints, at->n_ints); break;
		case AP_ATTR_FLOATS:
			rc = ap_node_set_floats(im->g, n, at->name, at->floats, at->n_floats);
			break;
		}
	}
	return rc < 0 ? nomem(im) : n;
}

/* ---- normalised attributes under construction ---------------------------------- */

typedef struct abuf {
	ap_attr a[12];
	int64_t iv[12][MAX_INTS];
	int n;
} abuf;

static ap_attr *ab_slot(abuf *b, const char *name, ap_attr_type type)
{
	ap_attr *a = &b->a[b->n];

	memset(a, 0, sizeof(*a));
	a->name = (char *)name;
	a->type = type;
	a->ints = b->iv[b->n];
	b->n++;
	return a;
}

static void ab_int(abuf *b, const char *name, int64_t v)
{
	ab_slot(b, name, AP_ATTR_INT)->i = v;
}

static void ab_float(abuf *b, const char *name, double v)
{
	ab_slot(b, name, AP_ATTR_FLOAT)->f = v;
}

static void ab_str(abuf *b, const char *name, const char *s)
{
	ab_slot(b, name, AP_ATTR_STRING)->s = (char *)s;
}

static void ab_ints(abuf *b, const char *name, const int64_t *v, int n)
{
	ap_attr *a = ab_slot(b, name, AP_ATTR_INTS);

	if (n > MAX_INTS)
		n = MAX_INTS;
	memcpy(a->ints, v, (size_t)n * sizeof(int64_t));
	a->n_ints = n;
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
		return val_data(im, v);
	*tmp = ap__host_tensor_new(v->name, v->sh.dtype, v->sh.rank, v->sh.dims);
	if (!*tmp) {
		nomem(im);
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

/* Lowers one normalised node.  ins[i] may be NULL (optional input left
 * out); out_names[k] NULL or "" = output not produced.  given: output
 * shapes of the ops whose output shape is not inferred (ap__op_shape_given).
 * outs[k] receives the new values.  Folds the node when every input is a
 * small known constant and every output is small. */
static int emit(imp *im, ap_op op, abuf *A, int n_in, ival *const *ins, int n_out,
		const char *const *out_names, const ap_shape *given, ival **outs)
{
	ap_node nd;
	const ap_shape *in_sh[64];
	const char *in_names[64];
	ap_shape out_sh[64];
	bool fold = true;
	int rc;

	if (n_in > 64 || n_out > 64)
		return fail(im, AP_EUNSUPPORTED, NULL, "more than 64 inputs or outputs");
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
			return fail(im, AP_EUNSUPPORTED, ins[i]->name,
				    "'%s' (%s of node '%s') is not supported", ins[i]->name,
				    ins[i]->poison, ins[i]->poison_node);
		if (ins[i] && ((!readable(im, ins[i]) &&
		     !(ins[i]->fill && sh_bytes(&ins[i]->sh) >= 0 && sh_bytes(&ins[i]->sh) <= FOLD_MAX_BYTES)) ||
		    ins[i]->weight))
			fold = false;
	}
	for (int k = 0; k < n_out; k++) {
		if (given)
			out_sh[k] = given[k];
		else
			memset(&out_sh[k], 0, sizeof(out_sh[k]));
		if (!out_names[k] || !out_names[k][0])
			fold = false;
		outs[k] = NULL;
	}
	rc = ap__op_infer(&nd, in_sh, n_in, out_sh, n_out, in_names, im->err);
	if (rc < 0)
		return rc;
	for (int k = 0; k < n_out && fold; k++) {
		int64_t b = sh_bytes(&out_sh[k]);

		if (b < 0 || b > FOLD_MAX_BYTES)
			fold = false;
	}
	if (fold && fold_work(op, A, n_in, ins, n_out, out_sh) > FOLD_MAX_WORK)
		fold = false;
	if (fold) {
		const ap_host_tensor *in_d[64];
		ap_host_tensor *out_d[64], *tmp[64];

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
				rc = nomem(im);
		}
		if (rc == 0)
			rc = ap__op_eval(&nd, in_d, n_in, out_d, n_out, im->err);
		if (rc == 0) {
			for (int k = 0; k < n_out; k++) {
				outs[k] = const_val(im, out_names[k], out_d[k]);
				out_d[k] = NULL;
				if (!outs[k])
					rc = AP_ENOMEM;
			}
		}
		for (int k = 0; k < n_out; k++)
			ap_host_tensor_free(out_d[k]);
		for (int i = 0; i < n_in; i++)
			ap_host_tensor_free(tmp[i]);
		if (rc != AP_EUNSUPPORTED)
			return rc;
		ap_error_clear(im->err);
	}
	{
		int tin[64], tout[64];
		char name[NAME_CAP];

		for (int k = 0; k < n_out; k++)
			if (out_names[k] && out_names[k][0] && !graph_dtype(out_sh[k].dtype))
				return fail(im, AP_EUNSUPPORTED, out_names[k],
					    "%s output '%s' would have dtype %s (float32, float64, int32, int64, bool supported)",
					    ap_op_name(op), out_names[k], ap_dtype_name(out_sh[k].dtype));
		for (int i = 0; i < n_in; i++) {
			tin[i] = ins[i] ? materialise(im, ins[i]) : -1;
			if (tin[i] < -1 || (ins[i] && tin[i] < 0))
				return tin[i];
		}
		for (int k = 0; k < n_out; k++) {
			tout[k] = -1;
			if (!out_names[k] || !out_names[k][0])
				continue;
			if (uniq(im, &im->tnames, out_names[k], name) < 0)
				return AP_ENOMEM;
			tout[k] = ap_graph_add_tensor(im->g, name, out_sh[k].dtype, out_sh[k].rank,
						      out_sh[k].dims, AP_TENSOR_VALUE, NULL, 0);
			if (tout[k] < 0)
				return nomem(im);
			outs[k] = new_val(im, out_names[k]);
			if (!outs[k])
				return AP_ENOMEM;
			outs[k]->sh = out_sh[k];
			outs[k]->tensor = tout[k];
		}
		rc = emit_node(im, im->node, op, nd.attrs, nd.n_attrs, n_in, tin, n_out, tout);
		if (rc < 0)
			return rc;
		im->n_emitted++;
	}
	return 0;
}

static int emit1(imp *im, ap_op op, abuf *A, int n_in, ival *const *ins, const char *out_name,
		 const ap_shape *given, ival **out)
{
	const char *names[1] = { out_name };

	return emit(im, op, A, n_in, ins, 1, names, given, out);
}

/* x reshaped to (rank, dims); x itself when the shape is the same. */
static int reshape_to(imp *im, ival *x, int rank, const int64_t *dims, const char *out_name,
		      ival **out)
{
	ap_shape s = x->sh;

	s.rank = rank;
	memcpy(s.dims, dims, (size_t)rank * sizeof(int64_t));
	if (rank == x->sh.rank && memcmp(dims, x->sh.dims, (size_t)rank * sizeof(int64_t)) == 0) {
		*out = x;
		return 0;
	}
	return emit1(im, AP_OP_RESHAPE, NULL, 1, &x, out_name, &s, out);
}

/* ---- ONNX attributes ------------------------------------------------------------ */

static const Onnx__AttributeProto *attr(const Onnx__NodeProto *n, const char *name)
{
	for (size_t i = 0; i < n->n_attribute; i++)
		if (n->attribute[i]->name && strcmp(n->attribute[i]->name, name) == 0)
			return n->attribute[i];
	return NULL;
}

static int64_t aint(const Onnx__NodeProto *n, const char *name, int64_t dflt)
{
	const Onnx__AttributeProto *a = attr(n, name);

	if (!a)
		return dflt;
	if (a->has_i)
		return a->i;
	if (a->has_f)
		return ap_f64_to_i64(a->f);
	return dflt;
}

static double afloat(const Onnx__NodeProto *n, const char *name, double dflt)
{
	const Onnx__AttributeProto *a = attr(n, name);

	if (!a)
		return dflt;
	if (a->has_f)
		return a->f;
	if (a->has_i)
		return (double)a->i;
	return dflt;
}

/* Copies a STRING attribute (at most cap-1 bytes) into buf. */
static const char *astr(const Onnx__NodeProto *n, const char *name, const char *dflt, char *buf,
			size_t cap)
{
	const Onnx__AttributeProto *a = attr(n, name);
	size_t len;

	if (!a || !a->has_s)
		return dflt;
	len = a->s.len < cap - 1 ? a->s.len : cap - 1;
	memcpy(buf, a->s.data, len);
	buf[len] = '\0';
	return buf;
}

/* INTS attribute: 1 when present (count in *cnt), 0 when absent. */
static int aints(imp *im, const Onnx__NodeProto *n, const char *name, int64_t *out, int max,
		 int *cnt)
{
	const Onnx__AttributeProto *a = attr(n, name);

	*cnt = 0;
	if (!a)
		return 0;
	if (a->n_ints > (size_t)max)
		return fail(im, AP_EUNSUPPORTED, NULL, "attribute '%s' has %zu values (at most %d)",
			    name, a->n_ints, max);
	for (size_t i = 0; i < a->n_ints; i++)
		out[i] = a->ints[i];
	*cnt = (int)a->n_ints;
	return 1;
}

/* ---- ONNX inputs ------------------------------------------------------------------ */

/* Input k of n (NULL when absent or ""); AP_EINVAL when the name is
 * unknown, or when `required` and it is absent. */
static int get_in(imp *im, const Onnx__NodeProto *n, size_t k, bool required, ival **out)
{
	const char *name = k < n->n_input ? n->input[k] : NULL;

	*out = NULL;
	if (!name || !name[0]) {
		if (required)
			return fail(im, AP_EINVAL, NULL, "%s: required input %zu is missing",
				    n->op_type, k);
		return 0;
	}
	*out = lookup(im, name);
	if (!*out)
		return fail(im, AP_EINVAL, name, "input '%s' is not produced by any earlier node, "
			    "initializer or graph input", name);
	if ((*out)->poison)
		return fail(im, AP_EUNSUPPORTED, name, "'%s' (%s of node '%s') is not supported",
			    name, (*out)->poison, (*out)->poison_node);
	return 0;
}

/* The values of a known integer vector (or scalar) v, at most max. */
static int get_ints(imp *im, ival *v, const char *what, int64_t *out, int max, int *cnt)
{
	const ap_host_tensor *d;
	int64_t n;

	if (!known(v))
		return fail(im, AP_EUNSUPPORTED, v->name,
			    "%s '%s' must be a compile-time constant (an initializer, a Constant or "
			    "an input given with data)", what, v->name);
	if (!int_dtype(v->sh.dtype))
		return fail(im, AP_EINVAL, v->name, "%s '%s' must be an integer tensor, not %s", what,
			    v->name, ap_dtype_name(v->sh.dtype));
	n = sh_numel(&v->sh);
	if (n < 0 || n > max || v->sh.rank > 1)
		return fail(im, AP_EUNSUPPORTED, v->name, "%s '%s' has %lld values (at most %d, rank <= 1)",
			    what, v->name, (long long)n, max);
	d = val_data(im, v);
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
static int get_scalar(imp *im, ival *v, const char *what, double *out)
{
	const ap_host_tensor *d;

	if (!known(v))
		return fail(im, AP_EUNSUPPORTED, v->name, "%s '%s' must be a compile-time constant",
			    what, v->name);
	if (sh_numel(&v->sh) != 1)
		return fail(im, AP_EINVAL, v->name, "%s '%s' must hold exactly one value", what, v->name);
	d = val_data(im, v);
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

static const char *out_name(const Onnx__NodeProto *n, size_t k)
{
	return k < n->n_output && n->output[k] ? n->output[k] : "";
}

/* Axis normalised into [0, rank). */
static int norm_axis(imp *im, int64_t axis, int rank, int64_t *out)
{
	*out = 0;
	if (axis < -rank || axis >= rank)
		return fail(im, AP_EINVAL, NULL, "axis %lld out of range for rank %d", (long long)axis,
			    rank);
	*out = axis < 0 ? axis + rank : axis;
	return 0;
}

/* Sorted, distinct, non-negative axes. */
static int norm_axes(imp *im, int64_t *axes, int *n, int rank)
{
	bool seen[AP_MAX_RANK] = { false };
	int m = 0;

	for (int i = 0; i < *n; i++) {
		int64_t a;

		if (norm_axis(im, axes[i], rank, &a) < 0)
			return AP_EINVAL;
		seen[a] = true;
	}
	for (int d = 0; d < rank; d++)
		if (seen[d])
			axes[m++] = d;
	*n = m;
	return 0;
}

#define TRY(x) do { int rc_ = (x); if (rc_ < 0) return rc_; } while (0)

/* ---- op families ----------------------------------------------------------------- */

static const struct { const char *onnx; ap_op op; } unary_ops[] = {
	{ "Neg", AP_OP_NEG }, { "Abs", AP_OP_ABS }, { "Exp", AP_OP_EXP }, { "Log", AP_OP_LOG },
	{ "Sqrt", AP_OP_SQRT }, { "Reciprocal", AP_OP_RECIPROCAL }, { "Tanh", AP_OP_TANH },
	{ "Sigmoid", AP_OP_SIGMOID }, { "Relu", AP_OP_RELU }, { "Erf", AP_OP_ERF },
	{ "Sign", AP_OP_SIGN }, { "Floor", AP_OP_FLOOR }, { "Ceil", AP_OP_CEIL },
	{ "Not", AP_OP_NOT }, { "Softsign", AP_OP_SOFTSIGN }, { "HardSwish", AP_OP_HARD_SWISH },
	{ "Mish", AP_OP_MISH }, { "Softplus", AP_OP_SOFTPLUS }, { "Sin", AP_OP_SIN },
	{ "Cos", AP_OP_COS }, { "IsNaN", AP_OP_IS_NAN },
};

static const struct { const char *onnx; ap_op op; } binary_ops[] = {
	{ "Add", AP_OP_ADD }, { "Sub", AP_OP_SUB }, { "Mul", AP_OP_MUL }, { "Div", AP_OP_DIV },
	{ "Pow", AP_OP_POW }, { "Mod", AP_OP_MOD }, { "PRelu", AP_OP_PRELU },
	{ "Equal", AP_OP_EQUAL }, { "Less", AP_OP_LESS }, { "Greater", AP_OP_GREATER },
	{ "LessOrEqual", AP_OP_LESS_OR_EQUAL }, { "GreaterOrEqual", AP_OP_GREATER_OR_EQUAL },
	{ "And", AP_OP_AND }, { "Or", AP_OP_OR }, { "Xor", AP_OP_XOR },
};

static const struct { const char *onnx; ap_op op; } reduce_ops[] = {
	{ "ReduceSum", AP_OP_REDUCE_SUM }, { "ReduceMean", AP_OP_REDUCE_MEAN },
	{ "ReduceMax", AP_OP_REDUCE_MAX }, { "ReduceMin", AP_OP_REDUCE_MIN },
	{ "ReduceProd", AP_OP_REDUCE_PROD }, { "ReduceSumSquare", AP_OP_REDUCE_SUM_SQUARE },
	{ "ReduceL1", AP_OP_REDUCE_L1 }, { "ReduceL2", AP_OP_REDUCE_L2 },
	{ "ReduceLogSum", AP_OP_REDUCE_LOG_SUM }, { "ReduceLogSumExp", AP_OP_REDUCE_LOG_SUM_EXP },
};

static int imp_unary(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *x, *y;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	switch (op) {
	case AP_OP_LEAKY_RELU: ab_float(&A, "alpha", afloat(n, "alpha", 0.01)); break;
	case AP_OP_ELU: ab_float(&A, "alpha", afloat(n, "alpha", 1.0)); break;
	case AP_OP_SELU:
		ab_float(&A, "alpha", afloat(n, "alpha", 1.67326319217681884765625));
		ab_float(&A, "gamma", afloat(n, "gamma", 1.05070102214813232421875));
		break;
	case AP_OP_HARD_SIGMOID:
		ab_float(&A, "alpha", afloat(n, "alpha", 0.2));
		ab_float(&A, "beta", afloat(n, "beta", 0.5));
		break;
	case AP_OP_GELU: {
		char buf[32];
		const char *s = astr(n, "approximate", "none", buf, sizeof(buf));

		if (strcmp(s, "none") && strcmp(s, "tanh"))
			return fail(im, AP_EUNSUPPORTED, NULL, "Gelu: approximate='%s'", s);
		ab_str(&A, "approximate", strcmp(s, "tanh") == 0 ? "tanh" : "none");
		break;
	}
	default:
		break;
	}
	TRY(emit1(im, op, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_cast(imp *im, const Onnx__NodeProto *n, bool like)
{
	ival *x, *t = NULL, *y;
	int64_t to;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	if (like) {
		TRY(get_in(im, n, 1, true, &t));
		to = t->sh.dtype;
	} else {
		to = aint(n, "to", 0);
	}
	if (!ap_dtype_in_graphs((ap_dtype)to))
		return fail(im, AP_EUNSUPPORTED, NULL, "%s to ONNX data type %lld is not supported",
			    n->op_type, (long long)to);
	if (to == x->sh.dtype)
		return bind(im, out_name(n, 0), x);
	ab_int(&A, "to", to);
	TRY(emit1(im, AP_OP_CAST, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_clip(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *mn = NULL, *mx = NULL, *y;
	double lo = -INFINITY, hi = INFINITY;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	if (im->opset < 11) {
		lo = afloat(n, "min", -INFINITY);
		hi = afloat(n, "max", INFINITY);
	} else {
		TRY(get_in(im, n, 1, false, &mn));
		TRY(get_in(im, n, 2, false, &mx));
		if ((mn && !known(mn)) || (mx && !known(mx))) {
			/* bounds computed at run time: Max then Min */
			ival *t = x, *pair[2];
			char nm[NAME_CAP];

			if (mn) {
				pair[0] = t;
				pair[1] = mn;
				snprintf(nm, sizeof(nm), "%s_lo", out_name(n, 0));
				TRY(emit1(im, AP_OP_MAX, NULL, 2, pair, mx ? nm : out_name(n, 0), NULL, &t));
			}
			if (mx) {
				pair[0] = t;
				pair[1] = mx;
				TRY(emit1(im, AP_OP_MIN, NULL, 2, pair, out_name(n, 0), NULL, &t));
			}
			return bind(im, out_name(n, 0), t);
		}
		if (mn)
			TRY(get_scalar(im, mn, "Clip min", &lo));
		if (mx)
			TRY(get_scalar(im, mx, "Clip max", &hi));
	}
	ab_float(&A, "min", lo);
	ab_float(&A, "max", hi);
	TRY(emit1(im, AP_OP_CLIP, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

/* Legacy (opset < 7) broadcast=1 with `axis`: B's dims placed at axis of
 * A, padded with 1s, so that numpy broadcasting gives the old meaning. */
static int legacy_bcast(imp *im, const Onnx__NodeProto *n, ival *a, ival **b)
{
	const Onnx__AttributeProto *ax = attr(n, "axis");
	int64_t axis, dims[AP_MAX_RANK];
	int ra = a->sh.rank, rb = (*b)->sh.rank;
	char nm[NAME_CAP];

	if (im->opset >= 7 || aint(n, "broadcast", 0) != 1 || !ax)
		return 0;
	axis = ax->i;
	if (axis < 0)
		axis += ra;
	if (axis < 0 || axis + rb > ra)
		return fail(im, AP_ESHAPE, (*b)->name, "legacy broadcast: axis %lld does not fit B of "
			    "rank %d into A of rank %d", (long long)ax->i, rb, ra);
	for (int d = 0; d < ra; d++)
		dims[d] = (d >= axis && d < axis + rb) ? (*b)->sh.dims[d - axis] : 1;
	/* trailing 1s only matter when they are needed for alignment */
	snprintf(nm, sizeof(nm), "%s_bcast", (*b)->name);
	return reshape_to(im, *b, (int)(ra - axis), dims + axis, nm, b);
}

static int imp_binary(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *ab[2], *y;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &ab[0]));
	TRY(get_in(im, n, 1, true, &ab[1]));
	TRY(legacy_bcast(im, n, ab[0], &ab[1]));
	if (op == AP_OP_MOD)
		ab_int(&A, "fmod", aint(n, "fmod", 0));
	if (op == AP_OP_PRELU && im->opset < 7 && ab[1]->sh.rank == 1 && ab[0]->sh.rank >= 2 &&
	    ab[1]->sh.dims[0] > 1 && ab[1]->sh.dims[0] == ab[0]->sh.dims[1]) {
		/* PRelu-6: one slope per channel (dim 1) */
		int64_t dims[AP_MAX_RANK];
		char nm[NAME_CAP];

		dims[0] = ab[1]->sh.dims[0];
		for (int d = 1; d < ab[0]->sh.rank - 1; d++)
			dims[d] = 1;
		snprintf(nm, sizeof(nm), "%s_bcast", ab[1]->name);
		TRY(reshape_to(im, ab[1], ab[0]->sh.rank - 1, dims, nm, &ab[1]));
	}
	TRY(emit1(im, op, &A, 2, ab, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

/* Sum / Mean / Max / Min: a chain of binary nodes. */
static int imp_variadic(imp *im, const Onnx__NodeProto *n, ap_op op, bool mean)
{
	ival *acc, *x, *pair[2];
	char nm[NAME_CAP];

	if (n->n_input == 0)
		return fail(im, AP_EINVAL, NULL, "%s needs at least one input", n->op_type);
	TRY(get_in(im, n, 0, true, &acc));
	for (size_t i = 1; i < n->n_input; i++) {
		bool last = i + 1 == n->n_input && !mean;

		TRY(get_in(im, n, i, true, &x));
		pair[0] = acc;
		pair[1] = x;
		snprintf(nm, sizeof(nm), "%s_%zu", out_name(n, 0), i);
		TRY(emit1(im, op, NULL, 2, pair, last ? out_name(n, 0) : nm, NULL, &acc));
	}
	if (mean && n->n_input > 1) {
		ival *cnt = scalar_val(im, "mean_count", acc->sh.dtype, (double)n->n_input,
				       (int64_t)n->n_input);

		if (!cnt)
			return AP_ENOMEM;
		pair[0] = acc;
		pair[1] = cnt;
		TRY(emit1(im, AP_OP_DIV, NULL, 2, pair, out_name(n, 0), NULL, &acc));
	}
	return bind(im, out_name(n, 0), acc);
}

static int imp_where(imp *im, const Onnx__NodeProto *n)
{
	ival *in[3], *y;

	for (int i = 0; i < 3; i++)
		TRY(get_in(im, n, (size_t)i, true, &in[i]));
	TRY(emit1(im, AP_OP_WHERE, NULL, 3, in, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_reduce(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *x, *ax = NULL, *y;
	int64_t axes[AP_MAX_RANK * 2];
	int n_axes = 0;
	int64_t keep = aint(n, "keepdims", 1), noop = aint(n, "noop_with_empty_axes", 0);
	bool axes_input = op == AP_OP_REDUCE_SUM ? im->opset >= 13 : im->opset >= 18;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	if (axes_input) {
		TRY(get_in(im, n, 1, false, &ax));
		if (ax)
			TRY(get_ints(im, ax, "Reduce axes", axes, AP_MAX_RANK * 2, &n_axes));
	} else {
		TRY(aints(im, n, "axes", axes, AP_MAX_RANK * 2, &n_axes));
	}
	if (n_axes == 0 && noop) {
		/* no reduction: the input, or its elementwise part */
		ap_op e = op == AP_OP_REDUCE_SUM_SQUARE ? AP_OP_MUL :
			  (op == AP_OP_REDUCE_L1 || op == AP_OP_REDUCE_L2) ? AP_OP_ABS :
			  op == AP_OP_REDUCE_LOG_SUM ? AP_OP_LOG : AP_OP_IDENTITY;
		ival *pair[2] = { x, x };

		if (e == AP_OP_IDENTITY)
			return bind(im, out_name(n, 0), x);
		TRY(emit1(im, e, NULL, e == AP_OP_MUL ? 2 : 1, pair, out_name(n, 0), NULL, &y));
		return bind(im, out_name(n, 0), y);
	}
	if (n_axes == 0) {
		for (int d = 0; d < x->sh.rank; d++)
			axes[d] = d;
		n_axes = x->sh.rank;
	}
	TRY(norm_axes(im, axes, &n_axes, x->sh.rank));
	if (n_axes == 0)
		return bind(im, out_name(n, 0), x);
	ab_ints(&A, "axes", axes, n_axes);
	ab_int(&A, "keepdims", keep ? 1 : 0);
	TRY(emit1(im, op, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_softmax(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *x, *y;
	int64_t axis, axes[AP_MAX_RANK];
	int n_axes = 0;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	if (x->sh.rank == 0)
		return fail(im, AP_EINVAL, x->name, "%s of a scalar", n->op_type);
	TRY(norm_axis(im, aint(n, "axis", im->opset < 13 ? 1 : -1), x->sh.rank, &axis));
	if (im->opset < 13)
		for (int d = (int)axis; d < x->sh.rank; d++)
			axes[n_axes++] = d;
	else
		axes[n_axes++] = axis;
	ab_ints(&A, "axes", axes, n_axes);
	TRY(emit1(im, op, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

/* Marks optional output k of n as unusable (e.g. Dropout's mask). */
static int poison_out(imp *im, const Onnx__NodeProto *n, size_t k, const char *why)
{
	ival *v;

	if (!out_name(n, k)[0])
		return 0;
	v = new_val(im, out_name(n, k));
	if (!v)
		return AP_ENOMEM;
	v->poison = why;
	snprintf(v->poison_node, sizeof(v->poison_node), "%s", im->node);
	return bind(im, out_name(n, k), v);
}

static int imp_layer_norm(imp *im, const Onnx__NodeProto *n)
{
	ival *in[3], *outs[3];
	const char *names[3] = { out_name(n, 0), out_name(n, 1), out_name(n, 2) };
	int64_t axis;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &in[0]));
	TRY(get_in(im, n, 1, true, &in[1]));
	TRY(get_in(im, n, 2, false, &in[2]));
	TRY(norm_axis(im, aint(n, "axis", -1), in[0]->sh.rank, &axis));
	ab_int(&A, "axis", axis);
	ab_float(&A, "epsilon", afloat(n, "epsilon", 1e-5));
	TRY(emit(im, AP_OP_LAYER_NORM, &A, in[2] ? 3 : 2, in, n->n_output < 3 ? (int)n->n_output : 3,
		 names, NULL, outs));
	for (size_t k = 0; k < n->n_output && k < 3; k++)
		if (outs[k])
			TRY(bind(im, names[k], outs[k]));
	return 0;
}

/* BatchNormalization.  Training mode is training_mode=1 at opset 14+; for
 * older opsets it is what the outputs say (ONNX's "output case #1": Y,
 * mean, var, saved_mean, saved_var), and at opset < 7 an explicit is_test
 * decides.  Training mode keeps Y, the running mean and the running var
 * (ops.def); the legacy saved_mean / saved_var outputs are refused if used
 * (runtimes disagree on what saved_var holds: onnxruntime gives the
 * inverse standard deviation). */
static int imp_batch_norm(imp *im, const Onnx__NodeProto *n)
{
	ival *in[5], *outs[3];
	const char *names[3] = { out_name(n, 0), out_name(n, 1), out_name(n, 2) };
	bool train;
	int n_out = 1;
	abuf A;

	A.n = 0;
	for (int i = 0; i < 5; i++)
		TRY(get_in(im, n, (size_t)i, true, &in[i]));
	if (im->opset >= 14) {
		int64_t tm = aint(n, "training_mode", 0);

		if (tm != 0 && tm != 1)
			return fail(im, AP_EINVAL, NULL, "BatchNormalization: training_mode %lld",
				    (long long)tm);
		train = tm == 1;
	} else if (im->opset < 7 && attr(n, "is_test")) {
		train = aint(n, "is_test", 0) == 0;
	} else {
		train = n->n_output > 1;
	}
	if (im->opset < 9 && aint(n, "spatial", 1) == 0 && in[1]->sh.rank != 1)
		return fail(im, AP_EUNSUPPORTED, NULL, "BatchNormalization with spatial=0");
	ab_float(&A, "epsilon", afloat(n, "epsilon", 1e-5));
	if (train) {
		ab_int(&A, "training_mode", 1);
		ab_float(&A, "momentum", afloat(n, "momentum", 0.9));
		n_out = n->n_output < 3 ? (int)n->n_output : 3;
	}
	TRY(emit(im, AP_OP_BATCH_NORM, &A, 5, in, n_out, names, NULL, outs));
	for (int k = 0; k < n_out; k++)
		if (outs[k])
			TRY(bind(im, names[k], outs[k]));
	for (size_t k = (size_t)n_out; k < n->n_output; k++)
		TRY(poison_out(im, n, k, train ? "a legacy saved_mean/saved_var output"
					       : "a training-mode statistics output"));
	return 0;
}

static int imp_instance_norm(imp *im, const Onnx__NodeProto *n)
{
	ival *in[3], *y;
	abuf A;

	A.n = 0;
	for (int i = 0; i < 3; i++)
		TRY(get_in(im, n, (size_t)i, true, &in[i]));
	ab_float(&A, "epsilon", afloat(n, "epsilon", 1e-5));
	TRY(emit1(im, AP_OP_INSTANCE_NORM, &A, 3, in, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_lrn(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *y;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	if (!attr(n, "size"))
		return fail(im, AP_EINVAL, NULL, "LRN: attribute 'size' missing");
	ab_float(&A, "alpha", afloat(n, "alpha", 1e-4));
	ab_float(&A, "beta", afloat(n, "beta", 0.75));
	ab_float(&A, "bias", afloat(n, "bias", 1.0));
	ab_int(&A, "size", aint(n, "size", 1));
	TRY(emit1(im, AP_OP_LRN, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_matmul(imp *im, const Onnx__NodeProto *n)
{
	ival *ab[2], *y;

	TRY(get_in(im, n, 0, true, &ab[0]));
	TRY(get_in(im, n, 1, true, &ab[1]));
	TRY(emit1(im, AP_OP_MATMUL, NULL, 2, ab, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_gemm(imp *im, const Onnx__NodeProto *n)
{
	ival *in[3], *y;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &in[0]));
	TRY(get_in(im, n, 1, true, &in[1]));
	TRY(get_in(im, n, 2, false, &in[2]));
	ab_float(&A, "alpha", afloat(n, "alpha", 1.0));
	ab_float(&A, "beta", afloat(n, "beta", 1.0));
	ab_int(&A, "transA", aint(n, "transA", 0) ? 1 : 0);
	ab_int(&A, "transB", aint(n, "transB", 0) ? 1 : 0);
	TRY(emit1(im, AP_OP_GEMM, &A, in[2] ? 3 : 2, in, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

/* Window attributes of Conv / pools with auto_pad resolved (ONNX Conv /
 * MaxPool spec: SAME_* output = ceil(in / stride), total padding split
 * evenly, the odd one at the end for SAME_UPPER and at the start for
 * SAME_LOWER; VALID = no padding). */
static int window(imp *im, const Onnx__NodeProto *n, const ap_shape *x, const int64_t *kernel,
		  int k, int64_t *strides, int64_t *pads, int64_t *dil)
{
	char buf[32];
	const char *ap = astr(n, "auto_pad", "NOTSET", buf, sizeof(buf));
	int cnt;

	for (int i = 0; i < k; i++) {
		strides[i] = 1;
		dil[i] = 1;
		pads[i] = pads[k + i] = 0;
	}
	TRY(aints(im, n, "strides", strides, k, &cnt));
	if (cnt && cnt != k)
		return fail(im, AP_EINVAL, NULL, "%s: strides has %d values for %d spatial dims",
			    n->op_type, cnt, k);
	TRY(aints(im, n, "dilations", dil, k, &cnt));
	if (cnt && cnt != k)
		return fail(im, AP_EINVAL, NULL, "%s: dilations has %d values for %d spatial dims",
			    n->op_type, cnt, k);
	for (int i = 0; i < k; i++)
		if (strides[i] <= 0 || dil[i] <= 0)
			return fail(im, AP_EINVAL, NULL, "%s: strides and dilations must be positive",
				    n->op_type);
	if (strcmp(ap, "NOTSET") == 0 || ap[0] == '\0') {
		TRY(aints(im, n, "pads", pads, 2 * k, &cnt));
		if (cnt && cnt != 2 * k)
			return fail(im, AP_EINVAL, NULL, "%s: pads has %d values for %d spatial dims",
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
		return fail(im, AP_EUNSUPPORTED, NULL, "%s: auto_pad '%s'", n->op_type, ap);
	}
	return 0;
}

static int imp_conv(imp *im, const Onnx__NodeProto *n, bool transpose)
{
	ival *in[3], *y;
	int64_t kernel[AP_MAX_RANK], strides[AP_MAX_RANK], pads[2 * AP_MAX_RANK], dil[AP_MAX_RANK];
	int64_t opad[AP_MAX_RANK];
	int k, cnt;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &in[0]));
	TRY(get_in(im, n, 1, true, &in[1]));
	TRY(get_in(im, n, 2, false, &in[2]));
	k = in[0]->sh.rank - 2;
	if (k < 1 || in[1]->sh.rank != in[0]->sh.rank)
		return fail(im, AP_ESHAPE, in[1]->name, "%s: X and W must have the same rank >= 3",
			    n->op_type);
	for (int i = 0; i < k; i++)
		kernel[i] = in[1]->sh.dims[2 + i];
	TRY(aints(im, n, "kernel_shape", kernel, k, &cnt));
	for (int i = 0; i < k; i++)
		if (kernel[i] != in[1]->sh.dims[2 + i])
			return fail(im, AP_ESHAPE, in[1]->name,
				    "%s: kernel_shape does not match the weight", n->op_type);
	TRY(window(im, n, &in[0]->sh, kernel, k, strides, pads, dil));
	if (transpose) {
		int64_t oshape[AP_MAX_RANK + 2];
		char buf[32];
		const char *ap = astr(n, "auto_pad", "NOTSET", buf, sizeof(buf));
		bool have_out;

		for (int i = 0; i < k; i++)
			opad[i] = 0;
		TRY(aints(im, n, "output_padding", opad, k, &cnt));
		TRY(aints(im, n, "output_shape", oshape, k + 2, &cnt));
		have_out = cnt > 0;
		if (have_out && cnt == k + 2)
			memmove(oshape, oshape + 2, (size_t)k * sizeof(int64_t));
		else if (have_out && cnt != k)
			return fail(im, AP_EINVAL, NULL, "ConvTranspose: output_shape has %d values", cnt);
		if (!have_out && (strcmp(ap, "SAME_UPPER") == 0 || strcmp(ap, "SAME_LOWER") == 0)) {
			for (int i = 0; i < k; i++)
				oshape[i] = in[0]->sh.dims[2 + i] * strides[i];
			have_out = true;
		}
		if (have_out) {
			for (int i = 0; i < k; i++) {
				int64_t total = strides[i] * (in[0]->sh.dims[2 + i] - 1) + opad[i] +
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
		}
		ab_ints(&A, "output_padding", opad, k);
	}
	ab_int(&A, "group", aint(n, "group", 1));
	ab_ints(&A, "strides", strides, k);
	ab_ints(&A, "pads", pads, 2 * k);
	ab_ints(&A, "dilations", dil, k);
	TRY(emit1(im, transpose ? AP_OP_CONV_TRANSPOSE : AP_OP_CONV, &A, in[2] ? 3 : 2, in,
		  out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_pool(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *x, *y;
	int64_t kernel[AP_MAX_RANK], strides[AP_MAX_RANK], pads[2 * AP_MAX_RANK], dil[AP_MAX_RANK];
	int k, cnt;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	k = x->sh.rank - 2;
	if (k < 1)
		return fail(im, AP_ESHAPE, x->name, "%s: input needs rank >= 3", n->op_type);
	TRY(aints(im, n, "kernel_shape", kernel, k, &cnt));
	if (cnt != k)
		return fail(im, AP_EINVAL, NULL, "%s: kernel_shape needs %d values", n->op_type, k);
	TRY(window(im, n, &x->sh, kernel, k, strides, pads, dil));
	ab_ints(&A, "kernel_shape", kernel, k);
	ab_ints(&A, "strides", strides, k);
	ab_ints(&A, "pads", pads, 2 * k);
	ab_ints(&A, "dilations", dil, k);
	ab_int(&A, "ceil_mode", aint(n, "ceil_mode", 0) ? 1 : 0);
	if (op == AP_OP_AVERAGE_POOL)
		ab_int(&A, "count_include_pad", aint(n, "count_include_pad", 0) ? 1 : 0);
	TRY(emit1(im, op, &A, 1, &x, out_name(n, 0), NULL, &y));
	TRY(poison_out(im, n, 1, "MaxPool's Indices output"));
	return bind(im, out_name(n, 0), y);
}

static int imp_global_pool(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *x, *y;
	int64_t axes[AP_MAX_RANK];
	int na = 0;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	if (x->sh.rank < 3)
		return fail(im, AP_ESHAPE, x->name, "%s: input needs rank >= 3", n->op_type);
	for (int d = 2; d < x->sh.rank; d++)
		axes[na++] = d;
	ab_ints(&A, "axes", axes, na);
	ab_int(&A, "keepdims", 1);
	TRY(emit1(im, op, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

/* ---- shape-changing views -------------------------------------------------------- */

static int imp_reshape(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *s = NULL, *y;
	int64_t shape[AP_MAX_RANK + 1], dims[AP_MAX_RANK];
	int cnt, infer = -1;
	int64_t known_prod = 1, total;
	bool allowzero = aint(n, "allowzero", 0) != 0;

	TRY(get_in(im, n, 0, true, &x));
	if (im->opset < 5) {
		TRY(aints(im, n, "shape", shape, AP_MAX_RANK, &cnt));
	} else {
		TRY(get_in(im, n, 1, true, &s));
		TRY(get_ints(im, s, "Reshape shape", shape, AP_MAX_RANK, &cnt));
	}
	total = sh_numel(&x->sh);
	for (int i = 0; i < cnt; i++) {
		if (shape[i] == 0 && !allowzero) {
			if (i >= x->sh.rank)
				return fail(im, AP_ESHAPE, NULL, "Reshape: 0 at position %d copies a dimension "
					    "the input (rank %d) does not have", i, x->sh.rank);
			dims[i] = x->sh.dims[i];
		} else if (shape[i] == -1) {
			if (infer >= 0)
				return fail(im, AP_EINVAL, NULL, "Reshape: more than one -1");
			infer = i;
			dims[i] = 1;
			continue;
		} else if (shape[i] < -1) {
			return fail(im, AP_EINVAL, NULL, "Reshape: dimension %lld", (long long)shape[i]);
		} else {
			dims[i] = shape[i];
		}
		if (dims[i] && known_prod > AP_MAX_ELEMENTS / dims[i])
			return fail(im, AP_ETOOLARGE, NULL, "Reshape: target shape too large");
		known_prod *= dims[i];
	}
	if (infer >= 0) {
		if (known_prod == 0 || total % known_prod)
			return fail(im, AP_ESHAPE, x->name, "Reshape: cannot infer -1 for %lld elements",
				    (long long)total);
		dims[infer] = total / known_prod;
	}
	if (ap__shape_numel(cnt, dims) != total)
		return fail(im, AP_ESHAPE, x->name, "Reshape: %lld elements do not fit the target shape",
			    (long long)total);
	TRY(reshape_to(im, x, cnt, dims, out_name(n, 0), &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_flatten(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *y;
	int64_t axis = aint(n, "axis", 1), dims[2] = { 1, 1 };

	TRY(get_in(im, n, 0, true, &x));
	if (axis < 0)
		axis += x->sh.rank;
	if (axis < 0 || axis > x->sh.rank)
		return fail(im, AP_EINVAL, NULL, "Flatten: axis %lld for rank %d",
			    (long long)aint(n, "axis", 1), x->sh.rank);
	for (int d = 0; d < x->sh.rank; d++)
		dims[d < axis ? 0 : 1] *= x->sh.dims[d];
	TRY(reshape_to(im, x, 2, dims, out_name(n, 0), &y));
	return bind(im, out_name(n, 0), y);
}

static int squeeze_axes(imp *im, const Onnx__NodeProto *n, int64_t *axes, int *cnt)
{
	ival *a = NULL;

	*cnt = 0;
	if (im->opset >= 13) {
		TRY(get_in(im, n, 1, false, &a));
		if (a)
			TRY(get_ints(im, a, "axes", axes, AP_MAX_RANK, cnt));
		return 0;
	}
	return aints(im, n, "axes", axes, AP_MAX_RANK, cnt) < 0 ? AP_EUNSUPPORTED : 0;
}

static int imp_squeeze(imp *im, const Onnx__NodeProto *n, bool un)
{
	ival *x, *y;
	int64_t axes[AP_MAX_RANK], dims[AP_MAX_RANK];
	int cnt, r = 0;
	bool mark[AP_MAX_RANK + 1] = { false };

	TRY(get_in(im, n, 0, true, &x));
	TRY(squeeze_axes(im, n, axes, &cnt));
	if (un) {
		int orank = x->sh.rank + cnt, src = 0;

		if (orank > AP_MAX_RANK)
			return fail(im, AP_EUNSUPPORTED, NULL, "Unsqueeze: result rank %d", orank);
		for (int i = 0; i < cnt; i++) {
			int64_t a;

			TRY(norm_axis(im, axes[i], orank, &a));
			if (mark[a])
				return fail(im, AP_EINVAL, NULL, "Unsqueeze: axis %lld repeated",
					    (long long)axes[i]);
			mark[a] = true;
		}
		for (int d = 0; d < orank; d++)
			dims[r++] = mark[d] ? 1 : x->sh.dims[src++];
	} else {
		for (int i = 0; i < cnt; i++) {
			int64_t a;

			TRY(norm_axis(im, axes[i], x->sh.rank, &a));
			if (x->sh.dims[a] != 1)
				return fail(im, AP_ESHAPE, x->name, "Squeeze: dimension %lld is %lld, not 1",
					    (long long)a, (long long)x->sh.dims[a]);
			mark[a] = true;
		}
		for (int d = 0; d < x->sh.rank; d++)
			if (!(cnt ? mark[d] : x->sh.dims[d] == 1))
				dims[r++] = x->sh.dims[d];
	}
	TRY(reshape_to(im, x, r, dims, out_name(n, 0), &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_transpose(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *y;
	int64_t perm[AP_MAX_RANK];
	int cnt;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	TRY(aints(im, n, "perm", perm, AP_MAX_RANK, &cnt));
	if (!cnt) {
		for (int d = 0; d < x->sh.rank; d++)
			perm[d] = x->sh.rank - 1 - d;
		cnt = x->sh.rank;
	}
	if (cnt != x->sh.rank)
		return fail(im, AP_EINVAL, NULL, "Transpose: perm has %d values for rank %d", cnt,
			    x->sh.rank);
	for (int d = 0; d < cnt; d++)
		if (perm[d] < 0)
			perm[d] += cnt;
	ab_ints(&A, "perm", perm, cnt);
	TRY(emit1(im, AP_OP_TRANSPOSE, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_expand(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *s, *y;
	int64_t shape[AP_MAX_RANK];
	int cnt;
	ap_shape t, r;

	TRY(get_in(im, n, 0, true, &x));
	TRY(get_in(im, n, 1, true, &s));
	TRY(get_ints(im, s, "Expand shape", shape, AP_MAX_RANK, &cnt));
	t = x->sh;
	t.rank = cnt;
	memcpy(t.dims, shape, (size_t)cnt * sizeof(int64_t));
	if (ap__broadcast(&x->sh, &t, &r) < 0)
		return fail(im, AP_ESHAPE, x->name, "Expand: input does not broadcast to the shape");
	if (r.rank == x->sh.rank && memcmp(r.dims, x->sh.dims, (size_t)r.rank * sizeof(int64_t)) == 0)
		return bind(im, out_name(n, 0), x);
	TRY(emit1(im, AP_OP_EXPAND, NULL, 1, &x, out_name(n, 0), &r, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_tile(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *rp, *y;
	int64_t rep[AP_MAX_RANK];
	int cnt;
	ap_shape r;

	TRY(get_in(im, n, 0, true, &x));
	TRY(get_in(im, n, 1, true, &rp));
	TRY(get_ints(im, rp, "Tile repeats", rep, AP_MAX_RANK, &cnt));
	if (cnt != x->sh.rank)
		return fail(im, AP_EINVAL, rp->name, "Tile: %d repeats for rank %d", cnt, x->sh.rank);
	r = x->sh;
	for (int d = 0; d < cnt; d++) {
		if (rep[d] < 0)
			return fail(im, AP_EINVAL, rp->name, "Tile: negative repeat");
		if (rep[d] && x->sh.dims[d] > AP_MAX_ELEMENTS / rep[d])
			return fail(im, AP_ETOOLARGE, out_name(n, 0), "Tile: result too large");
		r.dims[d] = x->sh.dims[d] * rep[d];
	}
	if (sh_numel(&r) < 0)
		return fail(im, AP_ETOOLARGE, out_name(n, 0), "Tile: result of more than %lld elements",
			    (long long)AP_MAX_ELEMENTS);
	TRY(emit1(im, AP_OP_TILE, NULL, 1, &x, out_name(n, 0), &r, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_slice(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *y, *v;
	int64_t st[AP_MAX_RANK], en[AP_MAX_RANK], ax[AP_MAX_RANK], sp[AP_MAX_RANK];
	int64_t starts[AP_MAX_RANK], steps[AP_MAX_RANK];
	int ns, ne, na = 0, nsp = 0, r;
	ap_shape out;
	bool identity = true;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	r = x->sh.rank;
	if (im->opset < 10) {
		TRY(aints(im, n, "starts", st, AP_MAX_RANK, &ns));
		TRY(aints(im, n, "ends", en, AP_MAX_RANK, &ne));
		TRY(aints(im, n, "axes", ax, AP_MAX_RANK, &na));
	} else {
		TRY(get_in(im, n, 1, true, &v));
		TRY(get_ints(im, v, "Slice starts", st, AP_MAX_RANK, &ns));
		TRY(get_in(im, n, 2, true, &v));
		TRY(get_ints(im, v, "Slice ends", en, AP_MAX_RANK, &ne));
		TRY(get_in(im, n, 3, false, &v));
		if (v)
			TRY(get_ints(im, v, "Slice axes", ax, AP_MAX_RANK, &na));
		TRY(get_in(im, n, 4, false, &v));
		if (v)
			TRY(get_ints(im, v, "Slice steps", sp, AP_MAX_RANK, &nsp));
	}
	if (ns != ne || (na && na != ns) || (nsp && nsp != ns))
		return fail(im, AP_EINVAL, NULL, "Slice: starts/ends/axes/steps lengths differ");
	out = x->sh;
	for (int d = 0; d < r; d++) {
		starts[d] = 0;
		steps[d] = 1;
	}
	for (int i = 0; i < ns; i++) {
		int64_t a = na ? ax[i] : i, dim, s, e, step = nsp ? sp[i] : 1, cnt;

		TRY(norm_axis(im, a, r, &a));
		if (step == 0)
			return fail(im, AP_EINVAL, NULL, "Slice: step 0");
		dim = x->sh.dims[a];
		s = st[i];
		e = en[i];
		if (s < 0)
			s += dim;
		if (e < 0)
			e = e < INT64_MIN + dim ? -1 : e + dim;
		if (step > 0) {
			s = s < 0 ? 0 : s > dim ? dim : s;
			e = e < 0 ? 0 : e > dim ? dim : e;
			cnt = e > s ? (e - s + step - 1) / step : 0;
		} else {
			s = s < 0 ? -1 : s > dim - 1 ? dim - 1 : s;
			e = e < -1 ? -1 : e > dim - 1 ? dim - 1 : e;
			cnt = s > e ? (s - e + (-step) - 1) / (-step) : 0;
		}
		starts[a] = cnt ? s : 0;
		steps[a] = step;
		out.dims[a] = cnt;
	}
	for (int d = 0; d < r; d++)
		if (starts[d] != 0 || steps[d] != 1 || out.dims[d] != x->sh.dims[d])
			identity = false;
	if (identity)
		return bind(im, out_name(n, 0), x);
	ab_ints(&A, "starts", starts, r);
	ab_ints(&A, "steps", steps, r);
	TRY(emit1(im, AP_OP_SLICE, &A, 1, &x, out_name(n, 0), &out, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_concat(imp *im, const Onnx__NodeProto *n)
{
	ival *ins[64], *y;
	int64_t axis;
	int m = 0;
	abuf A;

	A.n = 0;
	if (n->n_input == 0 || n->n_input > 64)
		return fail(im, AP_EUNSUPPORTED, NULL, "Concat of %zu inputs", n->n_input);
	for (size_t i = 0; i < n->n_input; i++)
		TRY(get_in(im, n, i, true, &ins[m++]));
	TRY(norm_axis(im, aint(n, "axis", 1), ins[0]->sh.rank, &axis));
	if (m == 1)
		return bind(im, out_name(n, 0), ins[0]);
	ab_int(&A, "axis", axis);
	TRY(emit1(im, AP_OP_CONCAT, &A, m, ins, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_split(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *sv = NULL, *outs[64];
	int64_t axis, sizes[64];
	int cnt = 0, k = (int)n->n_output;
	ap_shape given[64];
	const char *names[64];
	abuf A;

	A.n = 0;
	if (k < 1 || k > 64)
		return fail(im, AP_EUNSUPPORTED, NULL, "Split into %d outputs", k);
	TRY(get_in(im, n, 0, true, &x));
	TRY(norm_axis(im, aint(n, "axis", 0), x->sh.rank, &axis));
	if (im->opset >= 13) {
		TRY(get_in(im, n, 1, false, &sv));
		if (sv)
			TRY(get_ints(im, sv, "Split sizes", sizes, 64, &cnt));
	} else {
		TRY(aints(im, n, "split", sizes, 64, &cnt));
	}
	if (cnt && cnt != k)
		return fail(im, AP_EINVAL, NULL, "Split: %d sizes for %d outputs", cnt, k);
	if (!cnt) {
		int64_t dim = x->sh.dims[axis];

		if (im->opset >= 18 && attr(n, "num_outputs")) {
			int64_t chunk = (dim + k - 1) / k;

			for (int i = 0; i < k; i++) {
				int64_t left = dim - i * chunk;

				sizes[i] = left < 0 ? 0 : left < chunk ? left : chunk;
			}
		} else {
			if (dim % k)
				return fail(im, AP_ESHAPE, x->name, "Split: %lld does not split into %d equal parts",
					    (long long)dim, k);
			for (int i = 0; i < k; i++)
				sizes[i] = dim / k;
		}
	}
	for (int i = 0; i < k; i++) {
		if (sizes[i] < 0)
			return fail(im, AP_EINVAL, NULL, "Split: negative size");
		given[i] = x->sh;
		given[i].dims[axis] = sizes[i];
		names[i] = out_name(n, (size_t)i);
		if (!names[i][0])
			return fail(im, AP_EUNSUPPORTED, NULL, "Split with an unnamed output");
	}
	ab_int(&A, "axis", axis);
	TRY(emit(im, AP_OP_SPLIT, &A, 1, &x, k, names, given, outs));
	for (int i = 0; i < k; i++)
		TRY(bind(im, names[i], outs[i]));
	return 0;
}

static int imp_gather(imp *im, const Onnx__NodeProto *n)
{
	ival *in[2], *y;
	int64_t axis;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &in[0]));
	TRY(get_in(im, n, 1, true, &in[1]));
	TRY(norm_axis(im, aint(n, "axis", 0), in[0]->sh.rank, &axis));
	ab_int(&A, "axis", axis);
	TRY(emit1(im, AP_OP_GATHER, &A, 2, in, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_pad(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *v, *y;
	int64_t pads[2 * AP_MAX_RANK], raw[2 * AP_MAX_RANK], axes[AP_MAX_RANK];
	int cnt, na = 0, r;
	double value = 0;
	char buf[32];
	const char *mode = astr(n, "mode", "constant", buf, sizeof(buf));
	bool zero = true;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	r = x->sh.rank;
	if (im->opset < 11) {
		if (!attr(n, "pads") && attr(n, "paddings"))
			TRY(aints(im, n, "paddings", raw, 2 * AP_MAX_RANK, &cnt));
		else
			TRY(aints(im, n, "pads", raw, 2 * AP_MAX_RANK, &cnt));
		value = afloat(n, "value", 0);
	} else {
		TRY(get_in(im, n, 1, true, &v));
		TRY(get_ints(im, v, "Pad pads", raw, 2 * AP_MAX_RANK, &cnt));
		TRY(get_in(im, n, 2, false, &v));
		if (v)
			TRY(get_scalar(im, v, "Pad constant_value", &value));
		TRY(get_in(im, n, 3, false, &v));
		if (v)
			TRY(get_ints(im, v, "Pad axes", axes, AP_MAX_RANK, &na));
	}
	if (strcmp(mode, "constant") && strcmp(mode, "reflect") && strcmp(mode, "edge"))
		return fail(im, AP_EUNSUPPORTED, NULL, "Pad: mode '%s'", mode);
	for (int i = 0; i < 2 * r; i++)
		pads[i] = 0;
	if (na) {
		if (cnt != 2 * na)
			return fail(im, AP_EINVAL, NULL, "Pad: %d pads for %d axes", cnt, na);
		for (int i = 0; i < na; i++) {
			int64_t a;

			TRY(norm_axis(im, axes[i], r, &a));
			pads[a] = raw[i];
			pads[r + a] = raw[na + i];
		}
	} else {
		if (cnt != 2 * r)
			return fail(im, AP_EINVAL, NULL, "Pad: %d pads for rank %d", cnt, r);
		memcpy(pads, raw, (size_t)cnt * sizeof(int64_t));
	}
	for (int i = 0; i < 2 * r; i++)
		if (pads[i])
			zero = false;
	if (zero)
		return bind(im, out_name(n, 0), x);
	ab_ints(&A, "pads", pads, 2 * r);
	ab_str(&A, "mode", strcmp(mode, "reflect") == 0 ? "reflect" :
			   strcmp(mode, "edge") == 0 ? "edge" : "constant");
	ab_float(&A, "value", value);
	TRY(emit1(im, AP_OP_PAD, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

/* ---- constants and shape arithmetic ------------------------------------------------ */

static int imp_constant(imp *im, const Onnx__NodeProto *n)
{
	const Onnx__AttributeProto *a;
	const char *o = out_name(n, 0);
	ival *v = NULL;

	if ((a = attr(n, "value")) && a->t) {
		v = new_val(im, o);
		if (!v)
			return AP_ENOMEM;
		if (a->t->n_dims > AP_MAX_RANK)
			return fail(im, AP_EUNSUPPORTED, o, "Constant of rank %zu", a->t->n_dims);
		v->lazy = a->t;
		v->sh.dtype = a->t->has_data_type ? (ap_dtype)a->t->data_type : AP_DT_UNDEF;
		v->sh.rank = (int)a->t->n_dims;
		for (size_t d = 0; d < a->t->n_dims; d++)
			v->sh.dims[d] = a->t->dims[d];
		if (sh_numel(&v->sh) < 0)
			return fail(im, AP_ETOOLARGE, o, "Constant '%s' too large", o);
		/* large floating-point data is a weight, as an initializer's */
		v->weight = float_dtype(v->sh.dtype) && sh_bytes(&v->sh) > AP_CONST_MAX_BYTES;
		/* decode now: a Constant is usually small and used soon (a
		 * large one without a parameter store is never decoded) */
		if (!(im->shape_only && !known_small(v)) && !val_data(im, v))
			return im->err ? im->err->code : AP_EINVAL;
	} else if ((a = attr(n, "value_float"))) {
		v = scalar_val(im, o, AP_DT_F32, a->f, 0);
	} else if ((a = attr(n, "value_int"))) {
		v = scalar_val(im, o, AP_DT_I64, 0, a->i);
	} else if ((a = attr(n, "value_ints"))) {
		if (a->n_ints > (size_t)(1 << 24))
			return fail(im, AP_ETOOLARGE, o, "Constant too large");
		v = ints_val(im, o, a->ints, (int)a->n_ints);
	} else if ((a = attr(n, "value_floats"))) {
		int64_t d = (int64_t)a->n_floats;
		ap_host_tensor *t;

		if (a->n_floats > (size_t)(1 << 24))
			return fail(im, AP_ETOOLARGE, o, "Constant too large");
		t = ap__host_tensor_new(o, AP_DT_F32, 1, &d);
		if (!t)
			return nomem(im);
		if (d)
			memcpy(t->data, a->floats, (size_t)d * sizeof(float));
		v = const_val(im, o, t);
	} else {
		return fail(im, AP_EUNSUPPORTED, NULL, "Constant without a tensor/float/int value "
			    "(sparse and string constants are not supported)");
	}
	if (!v)
		return AP_ENOMEM;
	return bind(im, o, v);
}

static int imp_constant_of_shape(imp *im, const Onnx__NodeProto *n)
{
	const Onnx__AttributeProto *a = attr(n, "value");
	ival *s, *v;
	int64_t shape[AP_MAX_RANK];
	int cnt;
	ap_dtype dt = AP_DT_F32;
	double f = 0;
	int64_t iv = 0;
	const char *o = out_name(n, 0);

	TRY(get_in(im, n, 0, true, &s));
	TRY(get_ints(im, s, "ConstantOfShape shape", shape, AP_MAX_RANK, &cnt));
	if (a && a->t) {
		ap_host_tensor *t = ap__onnx_tensor_from_proto(a->t, "value", im->err);

		if (!t) {
			snprintf(im->err->node, sizeof(im->err->node), "%s", im->node);
			return im->err->code;
		}
		if (ap__shape_numel(t->rank, t->dims) != 1) {
			ap_host_tensor_free(t);
			return fail(im, AP_EINVAL, NULL, "ConstantOfShape: value must hold one element");
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
			return fail(im, AP_EINVAL, s->name, "ConstantOfShape: negative dimension");
	v = new_val(im, o);
	if (!v)
		return AP_ENOMEM;
	v->sh.dtype = dt;
	v->sh.rank = cnt;
	memcpy(v->sh.dims, shape, (size_t)cnt * sizeof(int64_t));
	if (sh_bytes(&v->sh) >= 0 && sh_bytes(&v->sh) <= AP_CONST_MAX_BYTES) {
		ap_host_tensor *t = ap__host_tensor_new(o, dt, cnt, shape);
		int64_t m = sh_numel(&v->sh);

		if (!t)
			return nomem(im);
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
	return bind(im, o, v);
}

static int imp_shape(imp *im, const Onnx__NodeProto *n, bool size)
{
	ival *x, *v;
	int64_t start = 0, end, r;

	TRY(get_in(im, n, 0, true, &x));
	r = x->sh.rank;
	if (size) {
		v = scalar_val(im, out_name(n, 0), AP_DT_I64, 0, sh_numel(&x->sh));
	} else {
		start = aint(n, "start", 0);
		end = aint(n, "end", r);
		if (start < 0)
			start += r;
		if (end < 0)
			end += r;
		start = start < 0 ? 0 : start > r ? r : start;
		end = end < 0 ? 0 : end > r ? r : end;
		if (end < start)
			end = start;
		v = ints_val(im, out_name(n, 0), x->sh.dims + start, (int)(end - start));
	}
	if (!v)
		return AP_ENOMEM;
	return bind(im, out_name(n, 0), v);
}

static int imp_range(imp *im, const Onnx__NodeProto *n)
{
	ival *in[3], *v;
	double s, l, d;
	int64_t cnt;
	ap_host_tensor *t;

	for (int i = 0; i < 3; i++)
		TRY(get_in(im, n, (size_t)i, true, &in[i]));
	TRY(get_scalar(im, in[0], "Range start", &s));
	TRY(get_scalar(im, in[1], "Range limit", &l));
	TRY(get_scalar(im, in[2], "Range delta", &d));
	if (d == 0)
		return fail(im, AP_EINVAL, in[2]->name, "Range: delta 0");
	if (!isfinite(s) || !isfinite(l) || !isfinite(d))
		return fail(im, AP_EINVAL, out_name(n, 0), "Range from %g to %g by %g", s, l, d);
	{
		double c = ceil((l - s) / d);   /* compared as a double: it may not fit an int64 */

		if (c > (double)MAX_RANGE_ELEMS)
			return fail(im, AP_ETOOLARGE, out_name(n, 0), "Range of %.0f elements (at most %lld)",
				    c, (long long)MAX_RANGE_ELEMS);
		cnt = c < 0 ? 0 : (int64_t)c;
	}
	t = ap__host_tensor_new(out_name(n, 0), in[0]->sh.dtype, 1, &cnt);
	if (!t)
		return fail(im, AP_EUNSUPPORTED, in[0]->name, "Range of dtype %s",
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
	v = const_val(im, out_name(n, 0), t);
	if (!v)
		return AP_ENOMEM;
	return bind(im, out_name(n, 0), v);
}

static int imp_dropout(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *tm = NULL;
	double train = 0;

	TRY(get_in(im, n, 0, true, &x));
	if (im->opset >= 12) {
		TRY(get_in(im, n, 2, false, &tm));
		if (tm)
			TRY(get_scalar(im, tm, "Dropout training_mode", &train));
	} else if (im->opset < 7 && attr(n, "is_test") && aint(n, "is_test", 1) == 0) {
		train = 1;
	}
	if (train != 0)
		return fail(im, AP_EUNSUPPORTED, NULL, "Dropout in training mode");
	TRY(poison_out(im, n, 1, "Dropout's mask output"));
	return bind(im, out_name(n, 0), x);
}

static int import_nodes(imp *im, const Onnx__GraphProto *g);

static int imp_if(imp *im, const Onnx__NodeProto *n)
{
	ival *c;
	double cond;
	const Onnx__AttributeProto *br;
	const Onnx__GraphProto *sub;
	const char *outer = im->node;
	int rc;

	TRY(get_in(im, n, 0, true, &c));
	if (!known(c))
		return fail(im, AP_EUNSUPPORTED, c->name,
			    "If: the condition '%s' is not a compile-time constant; only an If with a "
			    "constant condition is supported (it is inlined)", c->name);
	TRY(get_scalar(im, c, "If condition", &cond));
	br = attr(n, cond != 0 ? "then_branch" : "else_branch");
	if (!br || !br->g)
		return fail(im, AP_EINVAL, NULL, "If: branch missing");
	sub = br->g;
	if (sub->n_output != n->n_output)
		return fail(im, AP_EINVAL, NULL, "If: branch has %zu outputs, the node %zu",
			    sub->n_output, n->n_output);
	rc = import_nodes(im, sub);
	im->node = outer;
	if (rc < 0)
		return rc;
	for (size_t k = 0; k < sub->n_output; k++) {
		const char *bn = sub->output[k]->name ? sub->output[k]->name : "";
		ival *v = lookup(im, bn);

		if (!v)
			return fail(im, AP_EINVAL, bn, "If: branch output '%s' is not defined", bn);
		TRY(bind(im, out_name(n, k), v));
	}
	return 0;
}

/* ---- ops of issue 12: elementwise tests, gather/scatter by elements, scans --------- */

static int imp_is_inf(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *y;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	ab_int(&A, "detect_negative", aint(n, "detect_negative", 1) ? 1 : 0);
	ab_int(&A, "detect_positive", aint(n, "detect_positive", 1) ? 1 : 0);
	TRY(emit1(im, AP_OP_IS_INF, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_shrink(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *y;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	ab_float(&A, "bias", afloat(n, "bias", 0.0));
	ab_float(&A, "lambd", afloat(n, "lambd", 0.5));
	TRY(emit1(im, AP_OP_SHRINK, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

/* GatherElements, ScatterElements (and opset 9-10 Scatter), ScatterND. */
static int imp_elements(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *in[3], *y;
	int n_in = op == AP_OP_GATHER_ELEMENTS ? 2 : 3;
	char buf[16];
	const char *red = astr(n, "reduction", "none", buf, sizeof(buf));
	int64_t axis;
	abuf A;

	A.n = 0;
	for (int i = 0; i < n_in; i++)
		TRY(get_in(im, n, (size_t)i, true, &in[i]));
	if (op != AP_OP_SCATTER_ND) {
		TRY(norm_axis(im, aint(n, "axis", 0), in[0]->sh.rank, &axis));
		ab_int(&A, "axis", axis);
	}
	if (op != AP_OP_GATHER_ELEMENTS)
		ab_str(&A, "reduction", red);
	TRY(emit1(im, op, &A, n_in, in, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_trilu(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *kv = NULL, *y;
	double k = 0;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	TRY(get_in(im, n, 1, false, &kv));
	if (kv)
		TRY(get_scalar(im, kv, "Trilu k", &k));
	ab_int(&A, "upper", aint(n, "upper", 1) ? 1 : 0);
	ab_int(&A, "k", (int64_t)k);
	TRY(emit1(im, AP_OP_TRILU, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_cumsum(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *av, *y;
	double a;
	int64_t axis;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	TRY(get_in(im, n, 1, true, &av));
	TRY(get_scalar(im, av, "CumSum axis", &a));
	TRY(norm_axis(im, (int64_t)a, x->sh.rank, &axis));
	ab_int(&A, "axis", axis);
	ab_int(&A, "exclusive", aint(n, "exclusive", 0) ? 1 : 0);
	ab_int(&A, "reverse", aint(n, "reverse", 0) ? 1 : 0);
	TRY(emit1(im, AP_OP_CUM_SUM, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

static int imp_argext(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *x, *y;
	int64_t axis;
	abuf A;

	A.n = 0;
	TRY(get_in(im, n, 0, true, &x));
	TRY(norm_axis(im, aint(n, "axis", 0), x->sh.rank, &axis));
	ab_int(&A, "axis", axis);
	ab_int(&A, "keepdims", aint(n, "keepdims", 1) ? 1 : 0);
	ab_int(&A, "select_last_index", aint(n, "select_last_index", 0) ? 1 : 0);
	TRY(emit1(im, op, &A, 1, &x, out_name(n, 0), NULL, &y));
	return bind(im, out_name(n, 0), y);
}

/* ---- ops imported as other ops ------------------------------------------------------ */

/* x transposed by perm (rank values); x itself when perm is the identity. */
static int transpose_to(imp *im, ival *x, const int64_t *perm, const char *name, ival **out)
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
	return emit1(im, AP_OP_TRANSPOSE, &A, 1, &x, name, NULL, out);
}

/* DepthToSpace (DCR or CRD) and SpaceToDepth on [N, C, H, W]: a reshape to
 * rank 6, a transpose, a reshape back (ONNX operator specification). */
static int imp_depth_space(imp *im, const Onnx__NodeProto *n, bool to_space)
{
	ival *x, *a, *b, *y;
	int64_t bs = aint(n, "blocksize", 0), d6[6], perm[6], d4[4], N, C, H, W;
	char buf[8], nm[NAME_CAP];
	bool crd = strcmp(astr(n, "mode", "DCR", buf, sizeof(buf)), "CRD") == 0;

	TRY(get_in(im, n, 0, true, &x));
	if (x->sh.rank != 4 || bs < 1)
		return fail(im, AP_EINVAL, x->name, "%s needs a rank-4 input and blocksize >= 1 (%lld)",
			    n->op_type, (long long)bs);
	N = x->sh.dims[0];
	C = x->sh.dims[1];
	H = x->sh.dims[2];
	W = x->sh.dims[3];
	if (to_space) {
		if (C % (bs * bs))
			return fail(im, AP_ESHAPE, x->name, "DepthToSpace: %lld channels for blocksize %lld",
				    (long long)C, (long long)bs);
		if (crd) {
			int64_t s[6] = { N, C / (bs * bs), bs, bs, H, W }, p[6] = { 0, 1, 4, 2, 5, 3 };
			memcpy(d6, s, sizeof(s));
			memcpy(perm, p, sizeof(p));
		} else {
			int64_t s[6] = { N, bs, bs, C / (bs * bs), H, W }, p[6] = { 0, 3, 4, 1, 5, 2 };
			memcpy(d6, s, sizeof(s));
			memcpy(perm, p, sizeof(p));
		}
		d4[0] = N; d4[1] = C / (bs * bs); d4[2] = H * bs; d4[3] = W * bs;
	} else {
		int64_t s[6] = { N, C, H / bs, bs, W / bs, bs }, p[6] = { 0, 3, 5, 1, 2, 4 };

		if (crd) {
			/* channel, then row and column offsets within the block */
			p[1] = 1; p[2] = 3; p[3] = 5; p[4] = 2; p[5] = 4;
		}
		if (H % bs || W % bs)
			return fail(im, AP_ESHAPE, x->name, "SpaceToDepth: %lldx%lld for blocksize %lld",
				    (long long)H, (long long)W, (long long)bs);
		memcpy(d6, s, sizeof(s));
		memcpy(perm, p, sizeof(p));
		d4[0] = N; d4[1] = C * bs * bs; d4[2] = H / bs; d4[3] = W / bs;
	}
	snprintf(nm, sizeof(nm), "%.200s_split", out_name(n, 0));
	TRY(reshape_to(im, x, 6, d6, nm, &a));
	snprintf(nm, sizeof(nm), "%.200s_perm", out_name(n, 0));
	TRY(transpose_to(im, a, perm, nm, &b));
	TRY(reshape_to(im, b, 4, d4, out_name(n, 0), &y));
	return bind(im, out_name(n, 0), y);
}

/* Einsum as a plain contraction (ONNX Einsum; numpy.einsum's rules): one or
 * two operands, no label repeated within an operand, "..." allowed.  Labels
 * only one operand has and the output lacks are summed first; then the
 * operands are transposed to [batch, free, contracted] / [batch,
 * contracted, free], reshaped to 3 groups, multiplied (MatMul) and the
 * result reshaped and transposed to the output's order. */
#define EIN_MAX (2 * AP_MAX_RANK)
typedef struct ein_op {
	char lab[EIN_MAX];
	int n;
} ein_op;

/* Parses one operand's labels (letters; "..." becomes the ellipsis labels
 * '0'.. right-aligned over `ell` dims) for an operand of rank `rank`. */
static int ein_parse(imp *im, const char *s, size_t len, int rank, int ell, ein_op *o)
{
	int explicit_n = 0, total;
	bool has_ell = false;

	o->n = 0;
	for (size_t i = 0; i < len; i++) {
		if (s[i] == '.') {
			if (i + 2 >= len || s[i + 1] != '.' || s[i + 2] != '.' || has_ell)
				return fail(im, AP_EINVAL, NULL, "Einsum: bad ellipsis");
			has_ell = true;
			i += 2;
			continue;
		}
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
			return fail(im, AP_EINVAL, NULL, "Einsum: bad label '%c'", s[i]);
		explicit_n++;
	}
	if (rank >= 0 && (has_ell ? explicit_n > rank : explicit_n != rank))
		return fail(im, AP_ESHAPE, NULL, "Einsum: %d labels for an operand of rank %d",
			    explicit_n, rank);
	/* the labels this term will hold: o->lab has room for EIN_MAX */
	total = explicit_n + (has_ell ? (rank >= 0 ? rank - explicit_n : ell) : 0);
	if (total > AP_MAX_RANK)
		return fail(im, AP_EUNSUPPORTED, NULL, "Einsum: %d labels in one term (at most %d)",
			    total, AP_MAX_RANK);
	for (size_t i = 0; i < len; i++) {
		if (s[i] == '.') {
			int e = rank >= 0 ? rank - explicit_n : ell;

			for (int k = 0; k < e; k++)
				o->lab[o->n++] = (char)('0' + (ell - e) + k);
			i += 2;
			continue;
		}
		for (int k = 0; k < o->n; k++)
			if (o->lab[k] == s[i])
				return fail(im, AP_EUNSUPPORTED, NULL,
					    "Einsum: label '%c' repeated in one operand (a diagonal)", s[i]);
		o->lab[o->n++] = s[i];
	}
	return 0;
}

static int ein_find(const ein_op *o, char c)
{
	for (int k = 0; k < o->n; k++)
		if (o->lab[k] == c)
			return k;
	return -1;
}

/* Sums x (labels o) over the labels that `keep` does not mark. */
static int ein_sum_out(imp *im, ival **x, ein_op *o, const bool *keep, const char *base)
{
	ival *s;
	int64_t axes[EIN_MAX];
	int na = 0, m = 0;
	char nm[NAME_CAP];
	abuf A;

	for (int k = 0; k < o->n; k++)
		if (!keep[k])
			axes[na++] = k;
	if (!na)
		return 0;
	A.n = 0;
	ab_ints(&A, "axes", axes, na);
	ab_int(&A, "keepdims", 0);
	snprintf(nm, sizeof(nm), "%.200s_sum", base);
	TRY(emit1(im, AP_OP_REDUCE_SUM, &A, 1, x, nm, NULL, &s));
	*x = s;
	for (int k = 0; k < o->n; k++)
		if (keep[k])
			o->lab[m++] = o->lab[k];
	o->n = m;
	return 0;
}

static int imp_einsum(imp *im, const Onnx__NodeProto *n)
{
	char eq[256], cleaned[256];
	const char *arrow, *comma;
	ein_op op[2], out;
	ival *x[2], *y;
	int n_ops = (int)n->n_input, ell = 0, m = 0;
	const char *base = out_name(n, 0);
	char nm[NAME_CAP];

	if (n_ops < 1 || n_ops > 2)
		return fail(im, AP_EUNSUPPORTED, NULL, "Einsum of %d operands (1 or 2 supported)", n_ops);
	astr(n, "equation", "", eq, sizeof(eq));
	for (size_t i = 0, j = 0; i <= strlen(eq); i++)
		if (eq[i] != ' ')
			cleaned[j++] = eq[i];
	arrow = strstr(cleaned, "->");
	comma = strchr(cleaned, ',');
	if ((n_ops == 2) != (comma != NULL && (!arrow || comma < arrow)))
		return fail(im, AP_EINVAL, NULL, "Einsum: equation '%s' for %d operands", eq, n_ops);
	for (int i = 0; i < n_ops; i++) {
		TRY(get_in(im, n, (size_t)i, true, &x[i]));
		if (x[i]->sh.rank > ell)
			ell = x[i]->sh.rank;
	}
	{
		const char *s = cleaned;
		int maxe = 0;

		for (int i = 0; i < n_ops; i++) {
			const char *e = i == 0 && n_ops == 2 ? comma : arrow ? arrow : cleaned + strlen(cleaned);
			int cnt = 0;
			bool has = false;

			for (const char *p = s; p < e; p++) {
				if (*p == '.') {
					has = true;
					p += 2;
				} else {
					cnt++;
				}
			}
			if (has && x[i]->sh.rank - cnt > maxe)
				maxe = x[i]->sh.rank - cnt;
			s = e + 1;
		}
		ell = maxe;
		s = cleaned;
		for (int i = 0; i < n_ops; i++) {
			const char *e = i == 0 && n_ops == 2 ? comma : arrow ? arrow : cleaned + strlen(cleaned);

			TRY(ein_parse(im, s, (size_t)(e - s), x[i]->sh.rank, ell, &op[i]));
			s = e + 1;
		}
	}
	if (arrow) {
		TRY(ein_parse(im, arrow + 2, strlen(arrow + 2), -1, ell, &out));
	} else {
		/* implicit: the ellipsis, then the labels seen once, sorted */
		out.n = 0;
		for (int k = 0; k < ell; k++)
			out.lab[out.n++] = (char)('0' + k);
		for (char c = 'A'; c <= 'z'; c++) {
			int seen = 0;

			if (c > 'Z' && c < 'a')
				continue;
			for (int i = 0; i < n_ops; i++)
				seen += ein_find(&op[i], c) >= 0;
			if (seen == 1)
				out.lab[out.n++] = c;
		}
	}
	for (int k = 0; k < out.n; k++) {
		bool found = false;

		for (int i = 0; i < n_ops; i++)
			found |= ein_find(&op[i], out.lab[k]) >= 0;
		if (!found)
			return fail(im, AP_EINVAL, NULL, "Einsum: output label '%c' is in no operand",
				    out.lab[k]);
	}
	/* sizes must agree */
	for (int k = 0; n_ops == 2 && k < op[0].n; k++) {
		int j = ein_find(&op[1], op[0].lab[k]);

		if (j >= 0 && x[0]->sh.dims[k] != x[1]->sh.dims[j])
			return fail(im, AP_ESHAPE, x[1]->name, "Einsum: label '%c' is %lld and %lld",
				    op[0].lab[k], (long long)x[0]->sh.dims[k], (long long)x[1]->sh.dims[j]);
	}
	/* labels only one operand has and the output lacks: summed first */
	for (int i = 0; i < n_ops; i++) {
		bool keep[EIN_MAX];

		for (int k = 0; k < op[i].n; k++)
			keep[k] = ein_find(&out, op[i].lab[k]) >= 0 ||
				  (n_ops == 2 && ein_find(&op[1 - i], op[i].lab[k]) >= 0);
		snprintf(nm, sizeof(nm), "%.200s_%d", base, i);
		TRY(ein_sum_out(im, &x[i], &op[i], keep, nm));
	}
	if (n_ops == 1) {
		int64_t perm[EIN_MAX];

		for (int k = 0; k < out.n; k++)
			perm[k] = ein_find(&op[0], out.lab[k]);
		if (out.n != op[0].n)
			return fail(im, AP_EINTERNAL, NULL, "Einsum: labels lost");
		TRY(transpose_to(im, x[0], perm, base, &y));
		if (y == x[0]) {
			TRY(emit1(im, AP_OP_IDENTITY, NULL, 1, &x[0], base, NULL, &y));
		}
		return bind(im, base, y);
	}
	{
		/* batch: in both and the output; free: one operand and the
		 * output; contracted: both, not the output */
		char bat[EIN_MAX], fa[EIN_MAX], fb[EIN_MAX], con[EIN_MAX];
		int nb = 0, nfa = 0, nfb = 0, nc = 0;
		int64_t pa[EIN_MAX], pb[EIN_MAX], da[AP_MAX_RANK], db[AP_MAX_RANK], dc[EIN_MAX];
		int64_t M = 1, N = 1, K = 1, pc[EIN_MAX];
		ival *a, *b, *c, *pair[2];
		ein_op res;

		for (int k = 0; k < out.n; k++) {
			bool ia = ein_find(&op[0], out.lab[k]) >= 0, ib = ein_find(&op[1], out.lab[k]) >= 0;

			if (ia && ib)
				bat[nb++] = out.lab[k];
		}
		for (int k = 0; k < op[0].n; k++) {
			char l = op[0].lab[k];

			if (ein_find(&op[1], l) < 0)
				fa[nfa++] = l;
			else if (ein_find(&out, l) < 0)
				con[nc++] = l;
		}
		for (int k = 0; k < op[1].n; k++)
			if (ein_find(&op[0], op[1].lab[k]) < 0)
				fb[nfb++] = op[1].lab[k];
		if (nb + 2 > AP_MAX_RANK || nb + nfa + nfb > AP_MAX_RANK)
			return fail(im, AP_EUNSUPPORTED, NULL, "Einsum: too many dimensions");
		for (int k = 0; k < nb; k++) {
			pa[m] = ein_find(&op[0], bat[k]);
			pb[m] = ein_find(&op[1], bat[k]);
			da[m] = db[m] = x[0]->sh.dims[pa[m]];
			m++;
		}
		for (int k = 0; k < nfa; k++) {
			pa[nb + k] = ein_find(&op[0], fa[k]);
			M *= x[0]->sh.dims[pa[nb + k]];
		}
		for (int k = 0; k < nc; k++) {
			pa[nb + nfa + k] = ein_find(&op[0], con[k]);
			pb[nb + k] = ein_find(&op[1], con[k]);
			K *= x[0]->sh.dims[pa[nb + nfa + k]];
		}
		for (int k = 0; k < nfb; k++) {
			pb[nb + nc + k] = ein_find(&op[1], fb[k]);
			N *= x[1]->sh.dims[pb[nb + nc + k]];
		}
		snprintf(nm, sizeof(nm), "%.200s_a", base);
		TRY(transpose_to(im, x[0], pa, nm, &a));
		da[nb] = M;
		da[nb + 1] = K;
		snprintf(nm, sizeof(nm), "%.200s_a2", base);
		TRY(reshape_to(im, a, nb + 2, da, nm, &a));
		snprintf(nm, sizeof(nm), "%.200s_b", base);
		TRY(transpose_to(im, x[1], pb, nm, &b));
		db[nb] = K;
		db[nb + 1] = N;
		snprintf(nm, sizeof(nm), "%.200s_b2", base);
		TRY(reshape_to(im, b, nb + 2, db, nm, &b));
		pair[0] = a;
		pair[1] = b;
		snprintf(nm, sizeof(nm), "%.200s_mm", base);
		TRY(emit1(im, AP_OP_MATMUL, NULL, 2, pair, nm, NULL, &c));
		/* [batch, free a, free b] */
		res.n = 0;
		for (int k = 0; k < nb; k++) {
			dc[res.n] = da[k];
			res.lab[res.n++] = bat[k];
		}
		for (int k = 0; k < nfa; k++) {
			dc[res.n] = x[0]->sh.dims[ein_find(&op[0], fa[k])];
			res.lab[res.n++] = fa[k];
		}
		for (int k = 0; k < nfb; k++) {
			dc[res.n] = x[1]->sh.dims[ein_find(&op[1], fb[k])];
			res.lab[res.n++] = fb[k];
		}
		snprintf(nm, sizeof(nm), "%.200s_c", base);
		TRY(reshape_to(im, c, res.n, dc, nm, &c));
		for (int k = 0; k < out.n; k++)
			pc[k] = ein_find(&res, out.lab[k]);
		TRY(transpose_to(im, c, pc, base, &y));
		return bind(im, base, y);
	}
}

/* A new known tensor of dtype dt and shape (rank, dims) holding vals
 * (numel of them, converted). */
static ival *array_val(imp *im, const char *name, ap_dtype dt, int rank, const int64_t *dims,
		       const double *vals)
{
	ap_host_tensor *t = ap__host_tensor_new(name, dt, rank, dims);
	int64_t cnt = ap__shape_numel(rank, dims);

	if (!t) {
		nomem(im);
		return NULL;
	}
	for (int64_t i = 0; i < cnt; i++) {
		switch (dt) {
		case AP_DT_F32: ((float *)t->data)[i] = (float)vals[i]; break;
		case AP_DT_F64: ((double *)t->data)[i] = vals[i]; break;
		default: ((int64_t *)t->data)[i] = (int64_t)vals[i]; break;
		}
	}
	return const_val(im, name, t);
}

/* Resize (opsets 10-19) and Upsample (7-9) in nearest and linear modes:
 * separable, one resized axis at a time.  For output coordinate x the
 * input coordinate comes from coordinate_transformation_mode (computed in
 * float32, as onnxruntime does); nearest rounds it by nearest_mode and
 * gathers; linear gathers the two neighbours (clamped to the edge) and
 * weighs them.  Cubic, antialias, tf_crop_and_resize and a
 * keep_aspect_ratio_policy other than stretch are refused. */
static int imp_resize(imp *im, const Onnx__NodeProto *n, bool upsample)
{
	ival *x, *roi = NULL, *sc = NULL, *sz = NULL, *y;
	char mb[16], cb[32], nb[32], kb[16];
	const char *mode = astr(n, "mode", "nearest", mb, sizeof(mb));
	bool old = upsample || im->opset < 11;
	const char *ctm = old ? "asymmetric" : astr(n, "coordinate_transformation_mode", "half_pixel", cb, sizeof(cb));
	const char *nmode = old ? "simple" : astr(n, "nearest_mode", "round_prefer_floor", nb, sizeof(nb));
	double scales[AP_MAX_RANK];
	int64_t sizes[AP_MAX_RANK], axes[AP_MAX_RANK], raw[AP_MAX_RANK];
	int r, na = 0, cnt;
	bool linear;
	const char *base = out_name(n, 0);

	TRY(get_in(im, n, 0, true, &x));
	r = x->sh.rank;
	linear = !strcmp(mode, "linear") || !strcmp(mode, "bilinear");
	if (!linear && strcmp(mode, "nearest"))
		return fail(im, AP_EUNSUPPORTED, NULL, "%s: mode '%s' (nearest and linear supported)",
			    n->op_type, mode);
	if (aint(n, "antialias", 0))
		return fail(im, AP_EUNSUPPORTED, NULL, "%s: antialias", n->op_type);
	if (!strcmp(ctm, "tf_crop_and_resize"))
		return fail(im, AP_EUNSUPPORTED, NULL, "%s: tf_crop_and_resize", n->op_type);
	if (strcmp(astr(n, "keep_aspect_ratio_policy", "stretch", kb, sizeof(kb)), "stretch"))
		return fail(im, AP_EUNSUPPORTED, NULL, "%s: keep_aspect_ratio_policy '%s'", n->op_type, kb);
	if (linear && x->sh.dtype != AP_DT_F32 && x->sh.dtype != AP_DT_F64)
		return fail(im, AP_EUNSUPPORTED, x->name, "%s: linear mode on %s", n->op_type,
			    ap_dtype_name(x->sh.dtype));
	TRY(aints(im, n, "axes", raw, AP_MAX_RANK, &na));
	if (!na)
		for (int d = 0; d < r; d++)
			raw[na++] = d;
	for (int i = 0; i < na; i++)
		TRY(norm_axis(im, raw[i], r, &axes[i]));
	for (int d = 0; d < r; d++) {
		scales[d] = 1;
		sizes[d] = x->sh.dims[d];
	}
	if (upsample && im->opset < 9) {
		const Onnx__AttributeProto *a = attr(n, "scales");

		if (!a || a->n_floats != (size_t)r)
			return fail(im, AP_EINVAL, NULL, "Upsample: scales must have %d values", r);
		for (int d = 0; d < r; d++)
			scales[d] = a->floats[d];
	} else {
		size_t si = upsample || im->opset < 11 ? 1 : 2;

		if (!old)
			TRY(get_in(im, n, 1, false, &roi));
		TRY(get_in(im, n, si, false, &sc));
		if (!old)
			TRY(get_in(im, n, 3, false, &sz));
		if (sc && sh_numel(&sc->sh) == 0)
			sc = NULL;
		if (sz && sh_numel(&sz->sh) == 0)
			sz = NULL;
		if (!sc == !sz)
			return fail(im, AP_EINVAL, NULL, "%s: exactly one of scales and sizes", n->op_type);
		if (sz) {
			TRY(get_ints(im, sz, "Resize sizes", raw, AP_MAX_RANK, &cnt));
			if (cnt != na)
				return fail(im, AP_EINVAL, sz->name, "Resize: %d sizes for %d axes", cnt, na);
			for (int i = 0; i < na; i++) {
				if (raw[i] < 0)
					return fail(im, AP_EINVAL, sz->name, "Resize: negative size");
				sizes[axes[i]] = raw[i];
				scales[axes[i]] = x->sh.dims[axes[i]] ? (double)raw[i] / (double)x->sh.dims[axes[i]] : 1;
			}
		} else {
			const ap_host_tensor *d;

			if (!known(sc) || sh_numel(&sc->sh) != na ||
			    (sc->sh.dtype != AP_DT_F32 && sc->sh.dtype != AP_DT_F64))
				return fail(im, AP_EUNSUPPORTED, sc->name,
					    "%s: scales must be a constant float vector of %d values", n->op_type, na);
			d = val_data(im, sc);
			if (!d)
				return im->err ? im->err->code : AP_EINVAL;
			for (int i = 0; i < na; i++)
				scales[axes[i]] = d->dtype == AP_DT_F32 ? ((float *)d->data)[i] : ((double *)d->data)[i];
		}
	}
	for (int d = 0; d < r; d++) {
		if (!(scales[d] > 0) || !isfinite(scales[d]))
			return fail(im, AP_EINVAL, NULL, "%s: scale %g on axis %d", n->op_type, scales[d], d);
		if (!sz) {
			double o = floor((double)x->sh.dims[d] * (double)(float)scales[d]);

			if (o > (double)AP_MAX_ELEMENTS)
				return fail(im, AP_ETOOLARGE, base, "%s: output too large", n->op_type);
			sizes[d] = (int64_t)o;
		}
	}
	{
		ap_shape o = x->sh;

		for (int d = 0; d < r; d++)
			o.dims[d] = sizes[d];
		if (sh_bytes(&o) < 0)
			return fail(im, AP_ETOOLARGE, base, "%s: output too large", n->op_type);
	}
	for (int d = 0; d < r; d++)
		if (sizes[d] > MAX_RESIZE_AXIS && (sizes[d] != x->sh.dims[d] || (float)scales[d] != 1.0f))
			return fail(im, AP_ETOOLARGE, base, "%s: output axis %d of %lld elements (at most %lld)",
				    n->op_type, d, (long long)sizes[d], (long long)MAX_RESIZE_AXIS);
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
			return fail(im, AP_EUNSUPPORTED, x->name, "%s of an empty axis", n->op_type);
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
			return nomem(im);
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
				return fail(im, AP_EUNSUPPORTED, NULL, "%s: coordinate_transformation_mode '%s'",
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
		if (!c1 || emit1(im, AP_OP_GATHER, &A, 2, pair, linear || !last ? nm : base, NULL, &g1) < 0) {
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
		if (!c1 || emit1(im, AP_OP_GATHER, &A, 2, pair, nm, NULL, &g2) < 0)
			goto lin_fail;
		snprintf(nm, sizeof(nm), "%.200s_w%d", base, d);
		pair[0] = g1;
		pair[1] = array_val(im, nm, x->sh.dtype, r, bdims, w1);
		snprintf(nm, sizeof(nm), "%.200s_lo%d", base, d);
		if (!pair[1] || emit1(im, AP_OP_MUL, NULL, 2, pair, nm, NULL, &t1) < 0)
			goto lin_fail;
		snprintf(nm, sizeof(nm), "%.200s_w%d_hi", base, d);
		pair[0] = g2;
		pair[1] = array_val(im, nm, x->sh.dtype, r, bdims, w2);
		snprintf(nm, sizeof(nm), "%.200s_hi%d", base, d);
		if (!pair[1] || emit1(im, AP_OP_MUL, NULL, 2, pair, nm, NULL, &t2) < 0)
			goto lin_fail;
		pair[0] = t1;
		pair[1] = t2;
		snprintf(nm, sizeof(nm), "%.200s_axis%d_mix", base, d);
		if (emit1(im, AP_OP_ADD, NULL, 2, pair, last ? base : nm, NULL, &y) < 0)
			goto lin_fail;
		free(i1); free(i2); free(w1); free(w2);
		continue;
lin_fail:
		free(i1); free(i2); free(w1); free(w2);
		return im->err && im->err->code ? im->err->code : AP_ENOMEM;
	}
	(void)roi;
	if (y == x)
		TRY(emit1(im, AP_OP_IDENTITY, NULL, 1, &x, base, NULL, &y));
	return bind(im, base, y);
}

/* ---- dispatch ------------------------------------------------------------------------ */

static bool is_view_op(const char *op)
{
	return !strcmp(op, "Reshape") || !strcmp(op, "Flatten") || !strcmp(op, "Squeeze") ||
	       !strcmp(op, "Unsqueeze") || !strcmp(op, "Identity") || !strcmp(op, "Dropout");
}

static int import_node(imp *im, const Onnx__NodeProto *n)
{
	const char *op = n->op_type ? n->op_type : "";
	size_t i;

	if (!op[0])
		return fail(im, AP_EINVAL, NULL, "node without an op_type");
	if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx"))
		return fail(im, AP_EUNSUPPORTED, NULL, "op '%s' of domain '%s' is not supported", op,
			    n->domain);
	for (i = 0; i < sizeof(unary_ops) / sizeof(unary_ops[0]); i++)
		if (!strcmp(op, unary_ops[i].onnx))
			return imp_unary(im, n, unary_ops[i].op);
	for (i = 0; i < sizeof(binary_ops) / sizeof(binary_ops[0]); i++)
		if (!strcmp(op, binary_ops[i].onnx))
			return imp_binary(im, n, binary_ops[i].op);
	for (i = 0; i < sizeof(reduce_ops) / sizeof(reduce_ops[0]); i++)
		if (!strcmp(op, reduce_ops[i].onnx))
			return imp_reduce(im, n, reduce_ops[i].op);
	if (!strcmp(op, "LeakyRelu")) return imp_unary(im, n, AP_OP_LEAKY_RELU);
	if (!strcmp(op, "Elu")) return imp_unary(im, n, AP_OP_ELU);
	if (!strcmp(op, "Selu")) return imp_unary(im, n, AP_OP_SELU);
	if (!strcmp(op, "HardSigmoid")) return imp_unary(im, n, AP_OP_HARD_SIGMOID);
	if (!strcmp(op, "Gelu")) return imp_unary(im, n, AP_OP_GELU);
	if (!strcmp(op, "Cast")) return imp_cast(im, n, false);
	if (!strcmp(op, "CastLike")) return imp_cast(im, n, true);
	if (!strcmp(op, "Clip")) return imp_clip(im, n);
	if (!strcmp(op, "Sum")) return imp_variadic(im, n, AP_OP_ADD, false);
	if (!strcmp(op, "Mean")) return imp_variadic(im, n, AP_OP_ADD, true);
	if (!strcmp(op, "Max")) return imp_variadic(im, n, AP_OP_MAX, false);
	if (!strcmp(op, "Min")) return imp_variadic(im, n, AP_OP_MIN, false);
	if (!strcmp(op, "Where")) return imp_where(im, n);
	if (!strcmp(op, "Softmax")) return imp_softmax(im, n, AP_OP_SOFTMAX);
	if (!strcmp(op, "LogSoftmax")) return imp_softmax(im, n, AP_OP_LOG_SOFTMAX);
	if (!strcmp(op, "LayerNormalization")) return imp_layer_norm(im, n);
	if (!strcmp(op, "BatchNormalization")) return imp_batch_norm(im, n);
	if (!strcmp(op, "InstanceNormalization")) return imp_instance_norm(im, n);
	if (!strcmp(op, "LRN")) return imp_lrn(im, n);
	if (!strcmp(op, "MatMul")) return imp_matmul(im, n);
	if (!strcmp(op, "Gemm")) return imp_gemm(im, n);
	if (!strcmp(op, "Conv")) return imp_conv(im, n, false);
	if (!strcmp(op, "ConvTranspose")) return imp_conv(im, n, true);
	if (!strcmp(op, "MaxPool")) return imp_pool(im, n, AP_OP_MAX_POOL);
	if (!strcmp(op, "AveragePool")) return imp_pool(im, n, AP_OP_AVERAGE_POOL);
	if (!strcmp(op, "GlobalAveragePool")) return imp_global_pool(im, n, AP_OP_REDUCE_MEAN);
	if (!strcmp(op, "GlobalMaxPool")) return imp_global_pool(im, n, AP_OP_REDUCE_MAX);
	if (!strcmp(op, "Reshape")) return imp_reshape(im, n);
	if (!strcmp(op, "Flatten")) return imp_flatten(im, n);
	if (!strcmp(op, "Squeeze")) return imp_squeeze(im, n, false);
	if (!strcmp(op, "Unsqueeze")) return imp_squeeze(im, n, true);
	if (!strcmp(op, "Transpose")) return imp_transpose(im, n);
	if (!strcmp(op, "Expand")) return imp_expand(im, n);
	if (!strcmp(op, "Tile")) return imp_tile(im, n);
	if (!strcmp(op, "Slice")) return imp_slice(im, n);
	if (!strcmp(op, "Concat")) return imp_concat(im, n);
	if (!strcmp(op, "Split")) return imp_split(im, n);
	if (!strcmp(op, "Gather")) return imp_gather(im, n);
	if (!strcmp(op, "Pad")) return imp_pad(im, n);
	if (!strcmp(op, "Identity")) {
		ival *x;

		TRY(get_in(im, n, 0, true, &x));
		return bind(im, out_name(n, 0), x);
	}
	if (!strcmp(op, "Dropout")) return imp_dropout(im, n);
	if (!strcmp(op, "Constant")) return imp_constant(im, n);
	if (!strcmp(op, "ConstantOfShape")) return imp_constant_of_shape(im, n);
	if (!strcmp(op, "Shape")) return imp_shape(im, n, false);
	if (!strcmp(op, "Size")) return imp_shape(im, n, true);
	if (!strcmp(op, "Range")) return imp_range(im, n);
	if (!strcmp(op, "If")) return imp_if(im, n);
	if (!strcmp(op, "IsInf")) return imp_is_inf(im, n);
	if (!strcmp(op, "Shrink")) return imp_shrink(im, n);
	if (!strcmp(op, "GatherElements")) return imp_elements(im, n, AP_OP_GATHER_ELEMENTS);
	if (!strcmp(op, "ScatterElements") || !strcmp(op, "Scatter"))
		return imp_elements(im, n, AP_OP_SCATTER_ELEMENTS);
	if (!strcmp(op, "ScatterND")) return imp_elements(im, n, AP_OP_SCATTER_ND);
	if (!strcmp(op, "Trilu")) return imp_trilu(im, n);
	if (!strcmp(op, "CumSum")) return imp_cumsum(im, n);
	if (!strcmp(op, "ArgMax")) return imp_argext(im, n, AP_OP_ARG_MAX);
	if (!strcmp(op, "ArgMin")) return imp_argext(im, n, AP_OP_ARG_MIN);
	if (!strcmp(op, "DepthToSpace")) return imp_depth_space(im, n, true);
	if (!strcmp(op, "SpaceToDepth")) return imp_depth_space(im, n, false);
	if (!strcmp(op, "Einsum")) return imp_einsum(im, n);
	if (!strcmp(op, "Resize")) return imp_resize(im, n, false);
	if (!strcmp(op, "Upsample")) return imp_resize(im, n, true);
	return fail(im, AP_EUNSUPPORTED, NULL, "op '%s' is not supported", op);
}

/* Registers a graph's initializers (undecoded) and imports its nodes. */
static int import_nodes(imp *im, const Onnx__GraphProto *g)
{
	char made[NAME_CAP];

	for (size_t i = 0; i < g->n_initializer; i++) {
		const Onnx__TensorProto *tp = g->initializer[i];
		const char *name = tp->name ? tp->name : "";
		ival *v;

		if (!name[0])
			continue;
		v = new_val(im, name);
		if (!v)
			return AP_ENOMEM;
		if (tp->n_dims > AP_MAX_RANK) {
			v->poison = "an initializer of rank > 8";
			snprintf(v->poison_node, sizeof(v->poison_node), "%s", name);
		} else {
			v->lazy = tp;
			v->sh.dtype = tp->has_data_type ? (ap_dtype)tp->data_type : AP_DT_UNDEF;
			v->sh.rank = (int)tp->n_dims;
			for (size_t d = 0; d < tp->n_dims; d++)
				v->sh.dims[d] = tp->dims[d];
			if (sh_numel(&v->sh) < 0) {
				im->node = NULL;
				return fail(im, AP_ETOOLARGE, name, "initializer '%s' has a negative or "
					    "too large dimension", name);
			}
			v->weight = float_dtype(v->sh.dtype) && sh_bytes(&v->sh) > AP_CONST_MAX_BYTES;
		}
		TRY(bind(im, name, v));
	}
	for (size_t i = 0; i < g->n_node; i++) {
		const Onnx__NodeProto *n = g->node[i];
		const char *op = n->op_type ? n->op_type : "";
		int before = im->n_emitted, rc;

		if (n->name && n->name[0]) {
			im->node = n->name;
		} else {
			snprintf(made, sizeof(made), "%s_%d", op[0] ? op : "node", im->n_made);
			im->node = made;
		}
		im->n_made++;
		rc = import_node(im, n);
		if (rc < 0)
			return rc;
		if (im->n_emitted > before && !is_view_op(op) && strcmp(op, "If") != 0)
			im->eager++;
	}
	return 0;
}

/* ---- graph inputs and outputs ----------------------------------------------------- */

static bool is_initializer(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; i < g->n_initializer; i++)
		if (g->initializer[i]->name && strcmp(g->initializer[i]->name, name) == 0)
			return true;
	return false;
}

static const ap_host_tensor *find_binding(const Onnx__GraphProto *g, const char *name, int pos,
					  const ap_host_tensor *const *b, int nb)
{
	for (int i = 0; i < nb; i++)
		if (b[i] && b[i]->name && strcmp(b[i]->name, name) == 0)
			return b[i];
	if (pos < nb && b[pos]) {
		/* by position, unless that binding names another input */
		for (size_t i = 0; i < g->n_input; i++)
			if (b[pos]->name && b[pos]->name[0] && g->input[i]->name &&
			    strcmp(g->input[i]->name, b[pos]->name) == 0)
				return NULL;
		return b[pos];
	}
	return NULL;
}

static int import_inputs(imp *im, const Onnx__GraphProto *g, const ap_host_tensor *const *b,
			 int nb)
{
	int pos = 0;

	for (size_t i = 0; i < g->n_input; i++) {
		const Onnx__ValueInfoProto *vi = g->input[i];
		const char *name = vi->name ? vi->name : "";
		const Onnx__TypeProto__Tensor *tt = vi->type && vi->type->value_case ==
			ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ? vi->type->tensor_type : NULL;
		const ap_host_tensor *bind_t;
		ap_shape sh;
		ival *v;
		int t;

		if (is_initializer(g, name))
			continue;
		bind_t = find_binding(g, name, pos, b, nb);
		pos++;
		im->node = NULL;
		if (!tt)
			return fail(im, AP_EUNSUPPORTED, name, "graph input '%s' is not a tensor", name);
		memset(&sh, 0, sizeof(sh));
		sh.dtype = tt->has_elem_type ? (ap_dtype)tt->elem_type : AP_DT_UNDEF;
		if (bind_t && sh.dtype != AP_DT_UNDEF && bind_t->dtype != sh.dtype)
			return fail(im, AP_ESHAPE, name, "graph input '%s' is %s, its binding %s", name,
				    ap_dtype_name(sh.dtype), ap_dtype_name(bind_t->dtype));
		if (tt->shape) {
			if (tt->shape->n_dim > AP_MAX_RANK)
				return fail(im, AP_EUNSUPPORTED, name, "graph input '%s' has rank %zu",
					    name, tt->shape->n_dim);
			sh.rank = (int)tt->shape->n_dim;
			for (int d = 0; d < sh.rank; d++) {
				const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];

				if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
					sh.dims[d] = dim->dim_value;
				} else {
					sh.dims[d] = -1;
					if (!bind_t)
						return fail(im, AP_EINVAL, name,
							    "graph input '%s' has symbolic dimension '%s' "
							    "(dim %d) and no binding gives its size", name,
							    dim->value_case ? dim->dim_param : "?", d);
				}
			}
			if (bind_t) {
				bool ok = bind_t->rank == sh.rank;

				for (int d = 0; ok && d < sh.rank; d++)
					if (sh.dims[d] >= 0 && sh.dims[d] != bind_t->dims[d])
						ok = false;
				if (!ok)
					return fail(im, AP_ESHAPE, name, "the binding of graph input '%s' "
						    "does not match its declared shape", name);
			}
		} else if (!bind_t) {
			return fail(im, AP_EINVAL, name, "graph input '%s' has no shape and no binding",
				    name);
		}
		if (bind_t) {
			sh.rank = bind_t->rank;
			memcpy(sh.dims, bind_t->dims, sizeof(sh.dims));
			if (sh.dtype == AP_DT_UNDEF)
				sh.dtype = bind_t->dtype;
		}
		for (int d = 0; d < sh.rank; d++)
			if (sh.dims[d] < 0)
				return fail(im, AP_EINVAL, name, "graph input '%s' has dimension %lld", name,
					    (long long)sh.dims[d]);
		v = new_val(im, name);
		if (!v)
			return AP_ENOMEM;
		v->sh = sh;
		if (bind_t && (bind_t->data || bind_t->nbytes == 0) && int_dtype(sh.dtype) &&
		    bind_t->nbytes == (size_t)sh_numel(&sh) * ap_dtype_size(sh.dtype)) {
			/* an integer input given with data: a compile-time constant */
			ap_host_tensor *c = ap__host_tensor_new(name, sh.dtype, sh.rank, sh.dims);

			if (!c)
				return nomem(im);
			if (c->nbytes)
				memcpy(c->data, bind_t->data, c->nbytes);
			v->data = c;
		} else {
			char tn[NAME_CAP];
			int *p;

			if (!graph_dtype(sh.dtype))
				return fail(im, AP_EUNSUPPORTED, name, "graph input '%s' has dtype %s "
					    "(float32, float64, int32, int64, bool supported)", name,
					    ap_dtype_name(sh.dtype));
			if (uniq(im, &im->tnames, name, tn) < 0)
				return AP_ENOMEM;
			t = ap_graph_add_tensor(im->g, tn, sh.dtype, sh.rank, sh.dims, AP_TENSOR_INPUT,
						NULL, 0);
			if (t < 0)
				return nomem(im);
			p = realloc(im->g->inputs, (size_t)(im->g->n_inputs + 1) * sizeof(int));
			if (!p)
				return nomem(im);
			im->g->inputs = p;
			im->g->inputs[im->g->n_inputs++] = t;
			v->tensor = t;
		}
		TRY(bind(im, name, v));
	}
	return 0;
}

static int import_outputs(imp *im, const Onnx__GraphProto *g)
{
	im->node = NULL;
	for (size_t i = 0; i < g->n_output; i++) {
		const char *name = g->output[i]->name ? g->output[i]->name : "";
		ival *v = lookup(im, name);
		int t;
		int *p;

		if (!v)
			return fail(im, AP_EINVAL, name, "graph output '%s' is not produced", name);
		if (v->poison)
			return fail(im, AP_EUNSUPPORTED, name, "graph output '%s' is %s of node '%s'",
				    name, v->poison, v->poison_node);
		t = v->tensor;
		if (t < 0 || im->g->tensors[t].kind != AP_TENSOR_VALUE || im->g->tensors[t].is_output) {
			/* an input, constant or repeated output: copy it */
			ival *y;
			char nm[NAME_CAP];

			snprintf(nm, sizeof(nm), "%s_output", name);
			im->node = nm;
			if (emit1(im, AP_OP_IDENTITY, NULL, 1, &v, name, NULL, &y) < 0)
				return im->err ? im->err->code : AP_EINVAL;
			im->node = NULL;
			if (y->tensor < 0) {
				/* Identity of a constant folded: force a node */
				int in = materialise(im, v), out;

				if (in < 0)
					return in;
				if (uniq(im, &im->tnames, name, nm) < 0)
					return AP_ENOMEM;
				out = ap_graph_add_tensor(im->g, nm, v->sh.dtype, v->sh.rank, v->sh.dims,
							  AP_TENSOR_VALUE, NULL, 0);
				if (out < 0)
					return nomem(im);
				snprintf(nm, sizeof(nm), "%s_output", name);
				if (emit_node(im, nm, AP_OP_IDENTITY, NULL, 0, 1, &in, 1, &out) < 0)
					return AP_ENOMEM;
				y->tensor = out;
			}
			t = y->tensor;
		} else if (strcmp(im->g->tensors[t].name, name) != 0 && !ss_has(&im->tnames, name)) {
			/* name the output tensor as the model does */
			char *nn = ap_strdup(name);

			if (!nn || ss_add(&im->tnames, name) < 0) {
				free(nn);
				return nomem(im);
			}
			free(im->g->tensors[t].name);
			im->g->tensors[t].name = nn;
		}
		im->g->tensors[t].is_output = true;
		p = realloc(im->g->outputs, (size_t)(im->g->n_outputs + 1) * sizeof(int));
		if (!p)
			return nomem(im);
		im->g->outputs = p;
		im->g->outputs[im->g->n_outputs++] = t;
	}
	return 0;
}

static void imp_clear(imp *im)
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

__ap_give ap_graph *ap_onnx_import(const uint8_t *buf, size_t len,
				   const ap_host_tensor *const *bindings, int n_bindings,
				   __ap_give ap_params **params, ap_error *err)
{
	Onnx__ModelProto *m;
	ap_pb_budget budget;
	imp im;
	ap_error local;
	uint8_t *skeleton = NULL;
	int rc;

	if (params)
		*params = NULL;
	if (!err)
		err = &local;
	ap_error_clear(err);
	memset(&im, 0, sizeof(im));
	im.err = err;
	if (!params) {   /* structure only: the weights' bytes are never read */
		size_t n = 0;

		if (ap_onnx_skeleton(buf, len, &skeleton, &n, err))
			return NULL;
		buf = skeleton;
		len = n;
		im.shape_only = true;
	}
	ap_pb_budget_init(&budget, ap_pb_decode_limit(len, MODEL_DECODE_RATIO, MODEL_DECODE_FLOOR));
	m = onnx__model_proto__unpack(&budget.allocator, len, buf);
	free(skeleton);   /* protobuf-c copied what it kept */
	if (!m && budget.out_of_memory) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory decoding the ONNX model");
		return NULL;
	}
	if (!m && budget.exceeded) {
		ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
			     "a %zu-byte ONNX model would take more than %zu bytes to decode", len,
			     budget.limit);
		return NULL;
	}
	if (!m) {
		ap_error_set(err, AP_EMESSAGE, NULL, NULL,
			     "%zu bytes do not decode as an ONNX ModelProto", len);
		return NULL;
	}
	im.opset = -1;
	for (size_t i = 0; i < m->n_opset_import; i++) {
		const Onnx__OperatorSetIdProto *o = m->opset_import[i];

		if (!o->domain || !o->domain[0] || strcmp(o->domain, "ai.onnx") == 0)
			im.opset = o->has_version ? o->version : 1;
	}
	if (m->n_opset_import == 0 && m->ir_version < 3)
		im.opset = 1;
	if (!m->graph) {
		ap_error_set(err, AP_EMESSAGE, NULL, NULL, "the model has no graph");
		goto fail;
	}
	if (im.opset < 1 || im.opset > 25) {
		ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
			     "default-domain opset %lld is not supported (1..25)", (long long)im.opset);
		goto fail;
	}
	im.g = ap_graph_new(m->graph->name ? m->graph->name : "");
	if (!im.g) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto fail;
	}
	rc = import_inputs(&im, m->graph, bindings, n_bindings < 0 ? 0 : n_bindings);
	if (rc == 0)
		rc = import_nodes(&im, m->graph);
	if (rc == 0)
		rc = import_outputs(&im, m->graph);
	if (rc < 0) {
		if (!err->code)
			ap_error_set(err, rc, im.node, NULL, "import failed");
		goto fail;
	}
	im.g->eager_kernels = im.eager;
	rc = ap_graph_validate(im.g, err);
	if (rc < 0)
		goto fail;
	if (params) {
		*params = im.params;
		im.params = NULL;
		if (!*params)
			*params = calloc(1, sizeof(**params));
	}
	ap_params_free(im.params);
	imp_clear(&im);
	onnx__model_proto__free_unpacked(m, NULL);
	return im.g;
fail:
	ap_params_free(im.params);
	imp_clear(&im);
	onnx__model_proto__free_unpacked(m, NULL);
	ap_graph_free(im.g);
	return NULL;
}
