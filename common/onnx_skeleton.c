/* onnx_skeleton.c -- ap_onnx_skeleton: a serialized ONNX ModelProto
 * rewritten without the data of its large tensors, for the warm path
 * (issue 10): a submit needs the structure and the shapes and dtypes of
 * the weights, never their bytes, and decoding a model with protobuf-c
 * copies every initializer (3 ms per MiB of model, most of a warm submit).
 *
 * Approach: one walk over the wire format (pb_wire.h), message by message,
 * copying every field as it is except inside the messages that can hold
 * tensors -- ModelProto.graph, GraphProto.node and .initializer,
 * NodeProto.attribute, AttributeProto.t/.g/.tensors/.graphs (subgraphs:
 * If branches) -- which are rewritten recursively and written back with
 * their new length.  A TensorProto of floating-point data (float, double,
 * float16, bfloat16: weights) whose element count times element size
 * (from its dims and data_type, as the importer computes them) is more
 * than AP_CONST_MAX_BYTES loses its data fields (float_data, int32_data,
 * string_data, int64_data, raw_data, double_data, uint64_data) and keeps
 * the rest.  Integer and bool tensors keep their data whatever their size:
 * they are indices and masks, which the importer may fold (a shifted-window
 * mask scattered at constant indices), never weights, and rarely large.
 * Those bytes are skipped by their length, never read: a model
 * mapped into memory has the pages of its weights never touched.  The
 * importer, told to (ap_onnx_import with no parameter store), makes every
 * such tensor a PARAM from its dims and dtype alone, exactly as it does
 * with the data (check_import compares the two on every test model).
 *
 * A large tensor's data is still checked against its dims, by lengths
 * alone, as the full import checks it (tensor_examine): a model the full
 * import refuses is refused here too.
 *
 * The output is never longer than the input; nesting deeper than
 * MAX_DEPTH messages is refused (AP_EMESSAGE), so crafted bytes cannot
 * exhaust the stack.
 */
#include "graph.h"
#include "pb_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

enum kind { K_MODEL, K_GRAPH, K_NODE, K_ATTR, K_TENSOR };

/* Output: a buffer as large as the input (the result never grows). */
struct out {
	uint8_t *p;
	size_t len;
};

static void put(struct out *o, const void *p, size_t n)
{
	memcpy(o->p + o->len, p, n);
	o->len += n;
}

/* The message kind of field `number` of a message of kind `k`, when it is
 * one that is rewritten; -1 otherwise (copied as is). */
static int child_kind(enum kind k, uint32_t number)
{
	switch (k) {
	case K_MODEL: return number == 7 ? K_GRAPH : -1;
	case K_GRAPH: return number == 1 ? K_NODE : number == 5 ? K_TENSOR : -1;
	case K_NODE: return number == 5 ? K_ATTR : -1;
	case K_ATTR:
		return number == 5 || number == 10 ? K_TENSOR : number == 6 || number == 11 ? K_GRAPH : -1;
	case K_TENSOR: return -1;
	}
	return -1;
}

/* Multiplies the element count by one dim. */
static void mul_dim(uint64_t v, uint64_t *numel, bool *overflow, bool *negative)
{
	if ((int64_t)v < 0)
		*negative = true;
	else if (v && *numel > UINT64_MAX / 2 / v)
		*overflow = true;
	else
		*numel *= v;
}

/* Varints in `n` bytes (bytes without the continuation bit). */
static uint64_t count_varints(const uint8_t *p, size_t n)
{
	uint64_t c = 0;

	for (size_t i = 0; i < n; i++)
		c += !(p[i] & 0x80);
	return c;
}

/* The typed field that holds values of `dtype` (as tensor.c reads them). */
static uint32_t typed_field(uint64_t dtype)
{
	return dtype == AP_DT_F32 ? 4 : dtype == AP_DT_F64 ? 10 : dtype == AP_DT_I64 ? 7 : 5;
}

/* Looks at a TensorProto: *strip when its data is floating-point and
 * larger than a graph constant may be, by its dims (packed or not) and
 * data_type (a weight, see above).  A large
 * one's data must match its dims, as the full import checks it, by the
 * lengths alone (raw_data's bytes, or the values of its typed field: a
 * packed float or double run's length, a packed varint run's
 * terminators); a tensor with external data (ap_onnx_import_dir) has none
 * here to check: the importer checks its file when it reads it.
 * 0, or AP_EINVAL naming the tensor. */
static int tensor_examine(const uint8_t *p, size_t n, bool *strip, ap_error *err)
{
	ap_pbw r;
	ap_pbw_field f;
	uint64_t numel = 1, dtype = 0, values = 0, raw_len = 0;
	bool overflow = false, negative = false, raw = false, external = false, large;
	const uint8_t *name = (const uint8_t *)"";
	size_t name_len = 0, es;
	char nm[128];

	*strip = false;
	ap_pbw_init(&r, p, n);
	while (ap_pbw_next(&r, &f) == 1) {
		if (f.number == 2 && f.wire == 0)
			dtype = f.varint;
		else if (f.number == 8 && f.wire == 2)
			name = f.data, name_len = f.len;
		else if (f.number == 9 && f.wire == 2)
			raw = true, raw_len = f.len;
		else if ((f.number == 13) || (f.number == 14 && f.wire == 0 && f.varint == 1))
			external = true;
		else if (f.number == 1 && f.wire == 0)
			mul_dim(f.varint, &numel, &overflow, &negative);
		else if (f.number == 1 && f.wire == 2) {
			const uint8_t *q = f.data, *end = f.data + f.len;

			while (q < end) {   /* packed: a run of varints */
				uint64_t v = 0;

				for (int shift = 0; q < end && shift < 64; shift += 7) {
					uint8_t b = *q++;

					v |= (uint64_t)(b & 0x7f) << shift;
					if (!(b & 0x80))
						break;
				}
				mul_dim(v, &numel, &overflow, &negative);
			}
		}
	}
	es = ap_dtype_size((ap_dtype)dtype);
	if (negative || es == 0)
		return 0;   /* the importer reports it, from the whole tensor */
	snprintf(nm, sizeof(nm), "%.*s", (int)(name_len < sizeof(nm) - 1 ? name_len : sizeof(nm) - 1),
		 (const char *)name);
	large = overflow || numel > (uint64_t)AP_CONST_MAX_BYTES / es;
	*strip = large && (dtype == AP_DT_F32 || dtype == AP_DT_F64 || dtype == AP_DT_F16 ||
			   dtype == AP_DT_BF16);
	if (!large || overflow || numel > (uint64_t)AP_MAX_ELEMENTS)
		return 0;   /* too many elements: the importer says so from the dims */
	if (external)
		return 0;   /* no data here: the import checks the file's */
	if (raw) {
		if (raw_len != numel * es)
			return ap_error_set(err, AP_EINVAL, NULL, nm,
					    "tensor '%s': raw_data has %llu bytes, %llu elements "
					    "of %s need %llu", nm, (unsigned long long)raw_len,
					    (unsigned long long)numel, ap_dtype_name((ap_dtype)dtype),
					    (unsigned long long)(numel * es));
		return 0;
	}
	ap_pbw_init(&r, p, n);
	while (ap_pbw_next(&r, &f) == 1) {
		if (f.number != typed_field(dtype))
			continue;
		if (f.wire != 2)
			values++;
		else if (f.number == 4)
			values += f.len % 4 ? UINT64_MAX / 2 : f.len / 4;
		else if (f.number == 10)
			values += f.len % 8 ? UINT64_MAX / 2 : f.len / 8;
		else
			values += count_varints(f.data, f.len);
	}
	if (values != numel)
		return ap_error_set(err, AP_EINVAL, NULL, nm,
				    "tensor '%s' has %llu values for %llu elements", nm,
				    (unsigned long long)values, (unsigned long long)numel);
	return 0;
}

static bool is_data_field(uint32_t number)
{
	return number == 4 || number == 5 || number == 6 || number == 7 || number == 9 ||
	       number == 10 || number == 11;
}

/* Rewrites the message of kind `k` in `n` bytes at `p` into `o`.  0, or
 * AP_EMESSAGE (bytes that do not walk: `err` not set), or a tensor's
 * error with `err` set. */
static int rewrite(enum kind k, const uint8_t *p, size_t n, struct out *o, int depth,
		   ap_error *err)
{
	ap_pbw r;
	ap_pbw_field f;
	bool strip = false;
	int rc;

	if (depth > MAX_DEPTH)
		return AP_EMESSAGE;
	if (k == K_TENSOR && (rc = tensor_examine(p, n, &strip, err)))
		return rc;
	ap_pbw_init(&r, p, n);
	while ((rc = ap_pbw_next(&r, &f)) == 1) {
		int ck = f.wire == 2 ? child_kind(k, f.number) : -1;
		uint8_t head[20];
		size_t hl, at;

		if (strip && is_data_field(f.number))
			continue;
		if (ck < 0) {
			put(o, f.start, (size_t)(f.end - f.start));
			continue;
		}
		/* The child is written after room for its tag and its old
		 * length, then moved back onto its new length's end. */
		hl = (size_t)(f.data - f.start);
		at = o->len;
		o->len += hl;
		if ((rc = rewrite((enum kind)ck, f.data, f.len, o, depth + 1, err)) < 0)
			return rc;
		{
			size_t body = o->len - at - hl, tl = 0, nl;

			tl = ap_pbw_put_varint(head, ((uint64_t)f.number << 3) | 2);
			nl = ap_pbw_put_varint(head + tl, body);
			memmove(o->p + at + tl + nl, o->p + at + hl, body);
			memcpy(o->p + at, head, tl + nl);
			o->len = at + tl + nl + body;
		}
	}
	return rc;
}

int ap_onnx_skeleton(const uint8_t *buf, size_t len, uint8_t **out, size_t *out_len,
		     ap_error *err)
{
	struct out o = { malloc(len ? len : 1), 0 };
	int rc;

	*out = NULL;
	*out_len = 0;
	if (!o.p)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	rc = rewrite(K_MODEL, buf, len, &o, 0, err);
	if (rc == AP_EMESSAGE) {
		free(o.p);
		return ap_error_set(err, AP_EMESSAGE, NULL, NULL,
				    "%zu bytes do not decode as an ONNX ModelProto", len);
	}
	if (rc < 0) {
		free(o.p);
		return rc;
	}
	*out = o.p;
	*out_len = o.len;
	return 0;
}
