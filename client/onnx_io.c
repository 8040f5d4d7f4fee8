/* onnx_io.c -- the graph inputs and outputs of an ONNX model, read straight
 * from the protobuf wire format (varint keys, length-delimited fields)
 * without decoding the weights.
 *
 * Backend-test data names its files input_K.pb by position among the graph
 * inputs that are not initializers (old IR 3 models list their initializers
 * among the inputs); the .pb's own name may be empty or different.  The
 * command needs that list to rename bindings to the real input names and to
 * say which input of a model has symbolic dims.  Field numbers are those of
 * onnx.proto (ONNX IR specification).
 */
#include "tool.h"

#include <stdlib.h>
#include <string.h>

typedef struct pb_field {
	uint32_t num;
	int wt;
	uint64_t v;            /* varint value */
	const uint8_t *p;      /* wire type 2: payload */
	size_t len;
} pb_field;

static bool get_varint(const uint8_t **cur, const uint8_t *end, uint64_t *out)
{
	uint64_t v = 0;

	for (int shift = 0; shift < 64; shift += 7) {
		uint8_t c;
		if (*cur >= end)
			return false;
		c = *(*cur)++;
		v |= (uint64_t)(c & 0x7f) << shift;
		if (!(c & 0x80)) {
			*out = v;
			return true;
		}
	}
	return false;
}

/* Next field of a message in [*cur, end).  1 with *f, 0 at the end, -1 on
 * malformed bytes. */
static int next_field(const uint8_t **cur, const uint8_t *end, pb_field *f)
{
	uint64_t key, n;

	if (*cur >= end)
		return 0;
	if (!get_varint(cur, end, &key) || (key >> 3) == 0 || (key >> 3) > UINT32_MAX)
		return -1;
	memset(f, 0, sizeof(*f));
	f->num = (uint32_t)(key >> 3);
	f->wt = (int)(key & 7);
	switch (f->wt) {
	case 0:
		return get_varint(cur, end, &f->v) ? 1 : -1;
	case 1:
		if (end - *cur < 8)
			return -1;
		*cur += 8;
		return 1;
	case 5:
		if (end - *cur < 4)
			return -1;
		*cur += 4;
		return 1;
	case 2:
		if (!get_varint(cur, end, &n) || n > (uint64_t)(end - *cur))
			return -1;
		f->p = *cur;
		f->len = (size_t)n;
		*cur += n;
		return 1;
	default:
		return -1;
	}
}

/* The string field `num` of a message (last occurrence), malloc'd; "" when
 * absent; NULL on malformed bytes or ENOMEM. */
static char *string_field(const uint8_t *p, size_t len, uint32_t num)
{
	const uint8_t *cur = p, *end = p + len, *s = (const uint8_t *)"";
	size_t sl = 0;
	pb_field f;
	int rc;
	char *out;

	while ((rc = next_field(&cur, end, &f)) > 0)
		if (f.num == num && f.wt == 2) {
			s = f.p;
			sl = f.len;
		}
	if (rc < 0)
		return NULL;
	out = malloc(sl + 1);
	if (!out)
		return NULL;
	memcpy(out, s, sl);
	out[sl] = 0;
	return out;
}

static ap_dtype onnx_dtype(uint64_t t)
{
	switch (t) {
	case 1: return AP_DT_F32;
	case 2: return AP_DT_U8;
	case 3: return AP_DT_I8;
	case 6: return AP_DT_I32;
	case 7: return AP_DT_I64;
	case 9: return AP_DT_BOOL;
	case 11: return AP_DT_F64;
	default: return AP_DT_UNDEF;
	}
}

/* ValueInfoProto.type (TypeProto) -> tensor_type (1) -> elem_type (1),
 * shape (2) -> dim (1) -> dim_value (1) | dim_param (2).  Sets *dt and
 * *sym (malloc'd name of the first symbolic dim, or NULL).  false on bad
 * bytes / ENOMEM. */
static bool value_type(const uint8_t *p, size_t len, ap_dtype *dt, char **sym)
{
	const uint8_t *cur = p, *end = p + len;
	pb_field f;
	bool have_tensor = false, have_shape = false;
	int rc;

	*dt = AP_DT_UNDEF;
	*sym = NULL;
	while ((rc = next_field(&cur, end, &f)) > 0) {
		const uint8_t *c2, *e2;
		pb_field g;
		int rc2;
		if (f.num != 1 || f.wt != 2)
			continue;
		have_tensor = true;
		c2 = f.p;
		e2 = f.p + f.len;
		while ((rc2 = next_field(&c2, e2, &g)) > 0) {
			const uint8_t *c3, *e3;
			pb_field h;
			int rc3;
			if (g.num == 1 && g.wt == 0)
				*dt = onnx_dtype(g.v);
			if (g.num != 2 || g.wt != 2)
				continue;
			have_shape = true;
			c3 = g.p;
			e3 = g.p + g.len;
			while ((rc3 = next_field(&c3, e3, &h)) > 0) {
				const uint8_t *c4, *e4;
				pb_field d;
				bool has_value = false;
				char *param = NULL;
				int rc4;
				if (h.num != 1 || h.wt != 2)
					continue;
				c4 = h.p;
				e4 = h.p + h.len;
				while ((rc4 = next_field(&c4, e4, &d)) > 0) {
					if (d.num == 1 && d.wt == 0)
						has_value = true;
					if (d.num == 2 && d.wt == 2 && !param) {
						param = malloc(d.len + 1);
						if (!param)
							return false;
						memcpy(param, d.p, d.len);
						param[d.len] = 0;
					}
				}
				if (rc4 < 0) {
					free(param);
					return false;
				}
				if (has_value && !param)
					continue;
				if (!*sym) {
					*sym = param && *param ? param : strdup("?");
					if (*sym != param)
						free(param);
					if (!*sym)
						return false;
				} else {
					free(param);
				}
			}
			if (rc3 < 0)
				return false;
		}
		if (rc2 < 0)
			return false;
	}
	if (rc < 0)
		return false;
	if (have_tensor && !have_shape && !*sym) {
		*sym = strdup("?");
		if (!*sym)
			return false;
	}
	return true;
}

ap_onnx_io *ap_onnx_io_free(ap_onnx_io *io)
{
	if (!io)
		return NULL;
	for (int i = 0; i < io->n_inputs; i++) {
		free(io->inputs[i]);
		free(io->input_symbolic[i]);
	}
	for (int i = 0; i < io->n_outputs; i++)
		free(io->outputs[i]);
	free(io->inputs);
	free(io->input_dtype);
	free(io->input_symbolic);
	free(io->outputs);
	free(io);
	return NULL;
}

int ap_onnx_io_input(const ap_onnx_io *io, const char *name)
{
	for (int i = 0; i < io->n_inputs; i++)
		if (!strcmp(io->inputs[i], name))
			return i;
	return -1;
}

static bool in_list(char **v, int n, const char *s)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(v[i], s))
			return true;
	return false;
}

/* Walks one GraphProto. */
static int read_graph(const uint8_t *p, size_t len, ap_onnx_io *io, ap_error *err)
{
	const uint8_t *cur = p, *end = p + len;
	char **inits = NULL;
	int n_inits = 0, cap_inits = 0, rc, cap_in = 0, cap_out = 0;
	pb_field f;

	/* Pass 1: initializer names (TensorProto.name = 8; sparse: values (1) . name). */
	while ((rc = next_field(&cur, end, &f)) > 0) {
		char *name = NULL;
		if (f.num == 5 && f.wt == 2) {
			name = string_field(f.p, f.len, 8);
		} else if (f.num == 15 && f.wt == 2) {
			const uint8_t *c2 = f.p, *e2 = f.p + f.len;
			pb_field g;
			name = NULL;
			while (next_field(&c2, e2, &g) > 0)
				if (g.num == 1 && g.wt == 2) {
					free(name);
					name = string_field(g.p, g.len, 8);
				}
			if (!name)
				name = strdup("");
		} else {
			continue;
		}
		if (!name)
			goto bad;
		if (n_inits == cap_inits) {
			int nc = cap_inits ? cap_inits * 2 : 16;
			char **nv = realloc(inits, sizeof(char *) * (size_t)nc);
			if (!nv) {
				free(name);
				goto nomem;
			}
			inits = nv;
			cap_inits = nc;
		}
		inits[n_inits++] = name;
	}
	if (rc < 0)
		goto bad;
	/* Pass 2: inputs (11) and outputs (12). */
	cur = p;
	while ((rc = next_field(&cur, end, &f)) > 0) {
		char *name, *sym = NULL;
		ap_dtype dt = AP_DT_UNDEF;
		const uint8_t *c2, *e2;
		pb_field g;
		if ((f.num != 11 && f.num != 12) || f.wt != 2)
			continue;
		name = string_field(f.p, f.len, 1);
		if (!name)
			goto bad;
		if (f.num == 12) {
			if (io->n_outputs == cap_out) {
				int nc = cap_out ? cap_out * 2 : 8;
				char **nv = realloc(io->outputs, sizeof(char *) * (size_t)nc);
				if (!nv) {
					free(name);
					goto nomem;
				}
				io->outputs = nv;
				cap_out = nc;
			}
			io->outputs[io->n_outputs++] = name;
			continue;
		}
		if (in_list(inits, n_inits, name)) {
			free(name);
			continue;
		}
		c2 = f.p;
		e2 = f.p + f.len;
		while (next_field(&c2, e2, &g) > 0)
			if (g.num == 2 && g.wt == 2) {
				free(sym);
				if (!value_type(g.p, g.len, &dt, &sym)) {
					free(name);
					goto bad;
				}
			}
		if (io->n_inputs == cap_in) {
			int nc = cap_in ? cap_in * 2 : 8;
			char **a = realloc(io->inputs, sizeof(char *) * (size_t)nc);
			if (a)
				io->inputs = a;
			char **s = a ? realloc(io->input_symbolic, sizeof(char *) * (size_t)nc) : NULL;
			if (s)
				io->input_symbolic = s;
			ap_dtype *d = s ? realloc(io->input_dtype, sizeof(ap_dtype) * (size_t)nc) : NULL;
			if (!d) {
				free(name);
				free(sym);
				goto nomem;
			}
			io->input_dtype = d;
			cap_in = nc;
		}
		io->inputs[io->n_inputs] = name;
		io->input_symbolic[io->n_inputs] = sym;
		io->input_dtype[io->n_inputs] = dt;
		io->n_inputs++;
	}
	if (rc < 0)
		goto bad;
	ap_strv_free(inits, n_inits);
	return 0;
bad:
	ap_strv_free(inits, n_inits);
	return ap_error_set(err, AP_EMESSAGE, NULL, NULL,
			    "the model's GraphProto does not decode");
nomem:
	ap_strv_free(inits, n_inits);
	return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
}

int ap_onnx_io_read(const uint8_t *buf, size_t len, ap_onnx_io **out, ap_error *err)
{
	const uint8_t *cur = buf, *end = buf + len, *graph = NULL;
	size_t graph_len = 0;
	bool have_ir = false;
	ap_onnx_io *io;
	pb_field f;
	int rc;

	*out = NULL;
	while ((rc = next_field(&cur, end, &f)) > 0) {
		if (f.num == 1 && f.wt == 0)
			have_ir = true;
		if (f.num == 7 && f.wt == 2) {
			graph = f.p;
			graph_len = f.len;
		}
	}
	if (rc < 0 || !graph)
		return ap_error_set(err, AP_EMESSAGE, NULL, NULL,
				    "%zu bytes are not an ONNX ModelProto (%s)", len,
				    rc < 0 ? "malformed protobuf" : "no graph");
	(void)have_ir;
	io = calloc(1, sizeof(*io));
	if (!io)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	rc = read_graph(graph, graph_len, io, err);
	if (rc < 0) {
		ap_onnx_io_free(io);
		return rc;
	}
	*out = io;
	return 0;
}
