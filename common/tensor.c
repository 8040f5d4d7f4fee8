/* tensor.c -- host tensors: decoding ONNX TensorProto bytes (the
 * input_K.pb / output_K.pb files of the ONNX backend tests, initializers,
 * Constant values) and the parameter store that keeps the data of PARAM
 * tensors on the client side.
 *
 * A TensorProto holds its data either in raw_data (little-endian,
 * row-major) or in one typed repeated field chosen by data_type (ONNX IR
 * spec, "Tensor data"): float_data for float32, double_data for float64,
 * int64_data for int64, int32_data for int32, int8, uint8 and bool, and
 * for float16 / bfloat16 (each int32 holding the 16-bit pattern).  The
 * data (raw bytes or typed values) is always checked against dims before
 * the tensor's buffer is allocated, so the memory used is bounded by the
 * bytes received.
 */
#include "onnx_internal.h"
#include "pb_budget.h"

#include <stdlib.h>
#include <string.h>

ap_host_tensor *ap_host_tensor_free(__ap_take ap_host_tensor *t)
{
	if (!t)
		return NULL;
	free(t->name);
	free(t->data);
	free(t);
	return NULL;
}

int64_t ap__shape_numel(int rank, const int64_t *dims)
{
	int64_t n = 1;

	for (int i = 0; i < rank; i++)
		if (dims[i] < 0)
			return -1;
	for (int i = 0; i < rank; i++)
		if (dims[i] == 0)
			return 0;
	for (int i = 0; i < rank; i++) {
		if (n > AP_MAX_ELEMENTS / dims[i])
			return -1;
		n *= dims[i];
	}
	return n;
}

__ap_give ap_host_tensor *ap__host_tensor_new(const char *name, ap_dtype dt, int rank,
					     const int64_t *dims)
{
	ap_host_tensor *t;
	int64_t n;

	if (rank < 0 || rank > AP_MAX_RANK || ap_dtype_size(dt) == 0)
		return NULL;
	n = ap__shape_numel(rank, dims);
	if (n < 0)
		return NULL;
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->name = ap_strdup(name);
	if (!t->name)
		return ap_host_tensor_free(t);
	t->dtype = dt;
	t->rank = rank;
	for (int i = 0; i < rank; i++)
		t->dims[i] = dims[i];
	t->nbytes = (size_t)n * ap_dtype_size(dt);
	if (t->nbytes > 0) {
		t->data = calloc(1, t->nbytes);
		if (!t->data)
			return ap_host_tensor_free(t);
	}
	return t;
}

static bool dtype_supported(int dt)
{
	switch (dt) {
	case AP_DT_F32: case AP_DT_F64: case AP_DT_I32: case AP_DT_I64:
	case AP_DT_U8: case AP_DT_I8: case AP_DT_BOOL: case AP_DT_F16: case AP_DT_BF16:
		return true;
	}
	return false;
}

/* How many values the typed field that holds data of type `dt` carries. */
static size_t typed_count(const Onnx__TensorProto *tp, ap_dtype dt)
{
	switch (dt) {
	case AP_DT_F32: return tp->n_float_data;
	case AP_DT_F64: return tp->n_double_data;
	case AP_DT_I64: return tp->n_int64_data;
	default: return tp->n_int32_data;
	}
}

/* Copies the `numel` typed values (counted by the caller) into t->data. */
static void fill_typed(ap_host_tensor *t, const Onnx__TensorProto *tp, int64_t numel)
{
	for (int64_t i = 0; i < numel; i++) {
		switch (t->dtype) {
		case AP_DT_F32: ((float *)t->data)[i] = tp->float_data[i]; break;
		case AP_DT_F64: ((double *)t->data)[i] = tp->double_data[i]; break;
		case AP_DT_I64: ((int64_t *)t->data)[i] = tp->int64_data[i]; break;
		case AP_DT_I32: ((int32_t *)t->data)[i] = tp->int32_data[i]; break;
		case AP_DT_I8: ((int8_t *)t->data)[i] = (int8_t)tp->int32_data[i]; break;
		/* 16-bit floats: the bit pattern in the low half of each int32 */
		case AP_DT_F16: case AP_DT_BF16: ((uint16_t *)t->data)[i] = (uint16_t)tp->int32_data[i]; break;
		case AP_DT_BOOL: ((uint8_t *)t->data)[i] = tp->int32_data[i] != 0; break;
		default: ((uint8_t *)t->data)[i] = (uint8_t)tp->int32_data[i]; break;
		}
	}
}

__ap_give ap_host_tensor *ap__onnx_tensor_from_proto(const Onnx__TensorProto *tp,
						   const char *what, ap_error *err)
{
	const char *name = tp->name && tp->name[0] ? tp->name : (what ? what : "");
	ap_host_tensor *t;
	int64_t numel;
	int dt = tp->has_data_type ? tp->data_type : 0;

	if (tp->n_dims > AP_MAX_RANK) {
		ap_error_set(err, AP_EUNSUPPORTED, NULL, name,
			     "tensor '%s' has rank %zu (at most %d supported)", name,
			     tp->n_dims, AP_MAX_RANK);
		return NULL;
	}
	for (size_t i = 0; i < tp->n_dims; i++)
		if (tp->dims[i] < 0) {
			ap_error_set(err, AP_EINVAL, NULL, name,
				     "tensor '%s' has negative dimension %lld", name,
				     (long long)tp->dims[i]);
			return NULL;
		}
	numel = ap__shape_numel((int)tp->n_dims, tp->dims);
	if (numel < 0) {
		ap_error_set(err, AP_ETOOLARGE, NULL, name,
			     "tensor '%s' has more than %lld elements", name,
			     (long long)AP_MAX_ELEMENTS);
		return NULL;
	}
	if (!dtype_supported(dt)) {
		ap_error_set(err, AP_EUNSUPPORTED, NULL, name,
			     "tensor '%s' has unsupported data type %d", name, dt);
		return NULL;
	}
	if ((tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) ||
	    tp->n_external_data > 0) {
		ap_error_set(err, AP_EUNSUPPORTED, NULL, name,
			     "tensor '%s' keeps its data in an external file", name);
		return NULL;
	}
	if (tp->has_raw_data && tp->raw_data.len != (size_t)numel * ap_dtype_size(dt)) {
		ap_error_set(err, AP_EINVAL, NULL, name,
			     "tensor '%s': raw_data has %zu bytes, %lld elements of %s need %zu",
			     name, tp->raw_data.len, (long long)numel, ap_dtype_name(dt),
			     (size_t)numel * ap_dtype_size(dt));
		return NULL;
	}
	/* The values must be there before their buffer is: a few bytes of
	 * dims must not buy gigabytes. */
	if (!tp->has_raw_data && numel > 0 && typed_count(tp, dt) != (size_t)numel) {
		ap_error_set(err, AP_EINVAL, NULL, name, "tensor '%s' has %zu values for %lld elements",
			     name, typed_count(tp, dt), (long long)numel);
		return NULL;
	}
	t = ap__host_tensor_new(name, dt, (int)tp->n_dims, tp->dims);
	if (!t) {
		ap_error_set(err, AP_ENOMEM, NULL, name, "out of memory decoding tensor '%s'", name);
		return NULL;
	}
	if (numel == 0)
		return t;
	if (tp->has_raw_data) {
		memcpy(t->data, tp->raw_data.data, t->nbytes);
		if (dt == AP_DT_BOOL)
			for (size_t i = 0; i < t->nbytes; i++)
				((uint8_t *)t->data)[i] = ((uint8_t *)t->data)[i] != 0;
		return t;
	}
	fill_typed(t, tp, numel);
	return t;
}

/* Decodes one serialized onnx.TensorProto; see graph.h.  Errors:
 * AP_EMESSAGE (bytes that do not decode), AP_EUNSUPPORTED (dtype, rank,
 * external data), AP_EINVAL (data does not match dims), AP_ETOOLARGE. */
__ap_give ap_host_tensor *ap_onnx_tensor_decode(const uint8_t *buf, size_t len, ap_error *err)
{
	ap_pb_budget budget;
	Onnx__TensorProto *tp;
	ap_host_tensor *t;

	/* typed values decode at up to 8x (one byte of varint per int64) */
	ap_pb_budget_init(&budget, ap_pb_decode_limit(len, 16, (size_t)1 << 20));
	tp = onnx__tensor_proto__unpack(&budget.allocator, len, buf);
	if (!tp && budget.out_of_memory) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory decoding a TensorProto");
		return NULL;
	}
	if (!tp && budget.exceeded) {
		ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
			     "a %zu-byte TensorProto would take more than %zu bytes to decode", len,
			     budget.limit);
		return NULL;
	}
	if (!tp) {
		ap_error_set(err, AP_EMESSAGE, NULL, NULL,
			     "%zu bytes do not decode as an onnx.TensorProto", len);
		return NULL;
	}
	t = ap__onnx_tensor_from_proto(tp, NULL, err);
	onnx__tensor_proto__free_unpacked(tp, NULL);
	return t;
}

ap_params *ap_params_free(__ap_take ap_params *p)
{
	if (!p)
		return NULL;
	for (int i = 0; i < p->n; i++)
		ap_host_tensor_free(p->items[i]);
	free(p->items);
	free(p);
	return NULL;
}

/* The parameter named `name`, or NULL (also for a NULL store). */
const ap_host_tensor *ap_params_find(const ap_params *p, const char *name)
{
	if (!p || !name)
		return NULL;
	for (int i = 0; i < p->n; i++)
		if (p->items[i]->name && strcmp(p->items[i]->name, name) == 0)
			return p->items[i];
	return NULL;
}

/* One dim of a shape binding: a positive decimal integer up to
 * AP_MAX_ELEMENTS ending at *end ('x' or NUL). */
static int parse_dim(const char *spec, const char *p, const char **end, int64_t *out,
		     ap_error *err)
{
	int64_t v = 0;
	const char *q = p;

	while (*q >= '0' && *q <= '9') {
		v = v * 10 + (*q - '0');
		if (v > AP_MAX_ELEMENTS)
			return ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
					    "shape '%.200s': dimension '%.*s...' is over %lld", spec,
					    (int)(q - p + 1), p, (long long)AP_MAX_ELEMENTS);
		q++;
	}
	if (q == p || (*q && *q != 'x'))
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "shape '%.200s': dimensions are positive integers joined by "
				    "'x' (e.g. input=1x3x224x224), not '%.40s'", spec, p);
	if (v == 0)
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "shape '%.200s': a dimension is 0; give positive sizes", spec);
	*end = q;
	*out = v;
	return 0;
}

int ap_shape_binding_parse(const char *spec, __ap_give ap_host_tensor **out, ap_error *err)
{
	const char *eq = spec ? strchr(spec, '=') : NULL, *p;
	ap_host_tensor *t;
	int64_t dims[AP_MAX_RANK];
	int rank = 0;

	*out = NULL;
	if (!eq || eq == spec || eq - spec > 1024)
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "shape '%.200s': want NAME=DIMS, e.g. input=1x3x224x224",
				    spec ? spec : "");
	for (p = eq + 1; *p; rank++) {
		if (rank == AP_MAX_RANK)
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "shape '%.200s': more than %d dimensions", spec,
					    AP_MAX_RANK);
		if (parse_dim(spec, p, &p, &dims[rank], err))
			return err ? err->code : AP_EINVAL;
		if (*p == 'x' && !*++p)
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "shape '%.200s' ends with 'x'", spec);
	}
	if (ap__shape_numel(rank, dims) < 0)
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
				    "shape '%.200s' has more than %lld elements", spec,
				    (long long)AP_MAX_ELEMENTS);
	t = calloc(1, sizeof(*t));
	if (!t || !(t->name = strndup(spec, (size_t)(eq - spec)))) {
		free(t);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	t->dtype = AP_DT_UNDEF;
	t->rank = rank;
	memcpy(t->dims, dims, (size_t)rank * sizeof(dims[0]));
	*out = t;
	return 0;
}
