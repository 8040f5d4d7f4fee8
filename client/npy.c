/* npy.c -- numpy's .npy files, read and written strictly (the format of
 * numpy.lib.format, versions 1.0 and 2.0): the magic "\x93NUMPY", the
 * version bytes, the header's length (2 bytes little-endian in 1.0, 4 in
 * 2.0), then the header, a Python dict literal
 *     {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * padded with spaces and ended by '\n', then the elements, row-major.
 *
 * Only what maps onto Apollo's dtypes is taken: little-endian '<f4' '<f8'
 * '<f2' '<i8' '<i4' and the one-byte '|u1' '|i1' '|b1' ('<' accepted for
 * those too), C order, rank <= AP_MAX_RANK.  The header is parsed in full
 * -- exactly the three keys, each once, nothing after the dict but the
 * padding -- and the data's size (shape x dtype) checked against the file's
 * size before the data is allocated: a truncated file, a Fortran-order
 * array, a big-endian or structured dtype, a header over 64 KiB are each
 * an error naming the file and what is wrong, never a guess.  Bool
 * elements must be 0 or 1 bytes.
 */
#include "tool.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAX_HEADER ((size_t)65536)

static const struct {
	const char *descr;   /* as np.save writes it */
	ap_dtype dt;
} npy_types[] = {
	{ "<f4", AP_DT_F32 }, { "<f8", AP_DT_F64 }, { "<f2", AP_DT_F16 },
	{ "<i8", AP_DT_I64 }, { "<i4", AP_DT_I32 }, { "|u1", AP_DT_U8 },
	{ "|i1", AP_DT_I8 },  { "|b1", AP_DT_BOOL },
};
#define N_NPY_TYPES (sizeof(npy_types) / sizeof(npy_types[0]))
static const char npy_known[] = "<f4 <f8 <f2 <i8 <i4 |u1 |i1 |b1";

/* What a header says. */
typedef struct npy_header {
	ap_dtype dt;
	int rank;
	int64_t dims[AP_MAX_RANK];
	uint64_t data_bytes;     /* numel x element size */
} npy_header;

/* ---- the header --------------------------------------------------------------------- */

typedef struct cursor {
	const char *p, *end;
	const char *what;        /* the file, for messages */
	ap_error *err;
} cursor;

static void skip_space(cursor *c)
{
	while (c->p < c->end && (*c->p == ' ' || *c->p == '\t'))
		c->p++;
}

/* AP_EINVAL: "FILE: bad .npy header: WHY". */
static int bad(cursor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(cursor *c, const char *fmt, ...)
{
	char why[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return ap_error_set(c->err, AP_EINVAL, NULL, NULL, "%s: bad .npy header: %s", c->what, why);
}

/* A quoted Python string without escapes (' or "), into out (cap bytes). */
static int parse_string(cursor *c, char *out, size_t cap)
{
	char q;
	size_t n = 0;

	skip_space(c);
	if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
		return bad(c, "a quoted string was expected");
	q = *c->p++;
	while (c->p < c->end && *c->p != q) {
		if (*c->p == '\\' || n + 1 >= cap)
			return bad(c, "a string is escaped or longer than %zu bytes", cap - 1);
		out[n++] = *c->p++;
	}
	if (c->p >= c->end)
		return bad(c, "a string is not closed");
	c->p++;
	out[n] = 0;
	return 0;
}

static int parse_bool(cursor *c, bool *out)
{
	skip_space(c);
	if ((size_t)(c->end - c->p) >= 4 && !memcmp(c->p, "True", 4)) {
		*out = true;
		c->p += 4;
	} else if ((size_t)(c->end - c->p) >= 5 && !memcmp(c->p, "False", 5)) {
		*out = false;
		c->p += 5;
	} else {
		return bad(c, "'fortran_order' is not True or False");
	}
	return 0;
}

/* A Python tuple of non-negative integers: (), (3,), (2, 3) -- the dims,
 * each and their product at most AP_MAX_ELEMENTS. */
static int parse_shape(cursor *c, npy_header *h)
{
	int64_t numel = 1;

	skip_space(c);
	if (c->p >= c->end || *c->p != '(')
		return bad(c, "'shape' is not a tuple");
	c->p++;
	h->rank = 0;
	for (;;) {
		int64_t v = 0;
		const char *start;

		skip_space(c);
		if (c->p < c->end && *c->p == ')')
			break;
		start = c->p;
		while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
			v = v * 10 + (*c->p++ - '0');
			if (v > AP_MAX_ELEMENTS)
				return ap_error_set(c->err, AP_ETOOLARGE, NULL, NULL,
						    "%s: a dimension of the .npy shape is over %lld",
						    c->what, (long long)AP_MAX_ELEMENTS);
		}
		if (c->p == start)
			return bad(c, "'shape' holds something other than non-negative integers");
		if (h->rank == AP_MAX_RANK)
			return ap_error_set(c->err, AP_EUNSUPPORTED, NULL, NULL,
					    "%s: the .npy array has more than %d dimensions", c->what,
					    AP_MAX_RANK);
		h->dims[h->rank++] = v;
		numel = v && numel > AP_MAX_ELEMENTS / v ? AP_MAX_ELEMENTS + 1 : numel * v;
		skip_space(c);
		if (c->p < c->end && *c->p == ',') {
			c->p++;
			continue;
		}
		skip_space(c);
		if (c->p >= c->end || *c->p != ')')
			return bad(c, "'shape' is not a tuple of integers");
		if (h->rank == 1)   /* (3) is an int in Python, not a tuple */
			return bad(c, "'shape' (N) is not a tuple: a 1-D shape is written (N,)");
		break;
	}
	c->p++;
	if (numel > AP_MAX_ELEMENTS)
		return ap_error_set(c->err, AP_ETOOLARGE, NULL, NULL,
				    "%s: the .npy shape has more than %lld elements", c->what,
				    (long long)AP_MAX_ELEMENTS);
	h->data_bytes = (uint64_t)numel;   /* elements; bytes once the dtype is known */
	return 0;
}

/* The dtype named by a descr string: 0, or AP_EUNSUPPORTED naming it. */
static int parse_descr(cursor *c, const char *d, ap_dtype *dt)
{
	for (size_t i = 0; i < N_NPY_TYPES; i++) {
		const char *k = npy_types[i].descr;

		/* a one-byte type may be written '<' too */
		if (!strcmp(d, k) || (k[0] == '|' && d[0] == '<' && !strcmp(d + 1, k + 1))) {
			*dt = npy_types[i].dt;
			return 0;
		}
	}
	if (d[0] == '>')
		return ap_error_set(c->err, AP_EUNSUPPORTED, NULL, NULL,
				    "%s: the .npy dtype '%s' is big-endian; save the array "
				    "little-endian (arr.astype(arr.dtype.newbyteorder('<')))", c->what, d);
	return ap_error_set(c->err, AP_EUNSUPPORTED, NULL, NULL,
			    "%s: the .npy dtype '%s' is not one Apollo takes (%s)", c->what, d,
			    npy_known);
}

/* One key and its value into h; `seen` marks keys read (bits 0-2). */
static int parse_entry(cursor *c, npy_header *h, unsigned *seen, bool *fortran)
{
	static const char *const keys[] = { "descr", "fortran_order", "shape" };
	char key[32], descr[32];
	int k = -1, rc;

	if ((rc = parse_string(c, key, sizeof(key))) < 0)
		return rc;
	for (int i = 0; i < 3; i++)
		if (!strcmp(key, keys[i]))
			k = i;
	if (k < 0)
		return bad(c, "unknown key '%s' (descr, fortran_order and shape only)", key);
	if (*seen & (1u << k))
		return bad(c, "key '%s' is given twice", key);
	*seen |= 1u << k;
	skip_space(c);
	if (c->p >= c->end || *c->p != ':')
		return bad(c, "':' was expected after '%s'", key);
	c->p++;
	skip_space(c);
	if (k == 0 && c->p < c->end && *c->p == '[')
		return ap_error_set(c->err, AP_EUNSUPPORTED, NULL, NULL,
				    "%s: the .npy array has a structured dtype (fields); Apollo takes "
				    "plain arrays (%s)", c->what, npy_known);
	if (k == 0)
		return (rc = parse_string(c, descr, sizeof(descr))) < 0 ? rc
		       : parse_descr(c, descr, &h->dt);
	if (k == 1)
		return parse_bool(c, fortran);
	return parse_shape(c, h);
}

/* Parses the header text (len bytes) into h. */
static int parse_header(const char *text, size_t len, const char *what, npy_header *h,
			ap_error *err)
{
	cursor c = { text, text + len, what, err };
	unsigned seen = 0;
	bool fortran = false;
	int rc;

	memset(h, 0, sizeof(*h));
	if (len == 0 || text[len - 1] != '\n')
		return bad(&c, "it does not end with a newline");
	c.end--;
	skip_space(&c);
	if (c.p >= c.end || *c.p != '{')
		return bad(&c, "it is not a dict");
	c.p++;
	for (;;) {
		skip_space(&c);
		if (c.p < c.end && *c.p == '}')
			break;
		if ((rc = parse_entry(&c, h, &seen, &fortran)) < 0)
			return rc;
		skip_space(&c);
		if (c.p < c.end && *c.p == ',') {
			c.p++;
			continue;
		}
		if (c.p >= c.end || *c.p != '}')
			return bad(&c, "',' or '}' was expected");
	}
	c.p++;
	while (c.p < c.end && (*c.p == ' ' || *c.p == '\n'))
		c.p++;
	if (c.p != c.end)
		return bad(&c, "something follows the dict");
	if (seen != 7)
		return bad(&c, "%s is missing", !(seen & 1) ? "'descr'" : !(seen & 2) ?
			   "'fortran_order'" : "'shape'");
	if (fortran && h->rank > 1)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "%s: the .npy array is in Fortran order (column-major); Apollo "
				    "takes C order: save np.ascontiguousarray(arr)", what);
	h->data_bytes *= ap_dtype_size(h->dt);
	return 0;
}

/* The fixed part: magic, version, header length.  `avail` bytes at b (at
 * least 12 unless the file is shorter).  0 with *hlen and *hoff (where the
 * header starts). */
static int parse_prefix(const uint8_t *b, size_t avail, const char *what, size_t *hlen,
			size_t *hoff, ap_error *err)
{
	if (avail < 10 || memcmp(b, NPY_MAGIC, 6))
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "%s: not a .npy file (it does not start with \\x93NUMPY)", what);
	if (b[6] == 1 && b[7] == 0) {
		*hlen = (size_t)b[8] | (size_t)b[9] << 8;
		*hoff = 10;
	} else if (b[6] == 2 && b[7] == 0) {
		if (avail < 12)
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "%s: truncated .npy file (%zu bytes)", what, avail);
		*hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 |
			(size_t)b[11] << 24;
		*hoff = 12;
	} else {
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, NULL,
				    "%s: .npy format version %u.%u (1.0 and 2.0 are read)", what,
				    b[6], b[7]);
	}
	if (*hlen > NPY_MAX_HEADER)
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
				    "%s: the .npy header has %zu bytes, over the limit of %zu", what,
				    *hlen, NPY_MAX_HEADER);
	return 0;
}

/* The tensor for header h (data allocated, not filled), named `name`. */
static ap_host_tensor *tensor_for(const npy_header *h, const char *name)
{
	ap_host_tensor *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->dtype = h->dt;
	t->rank = h->rank;
	memcpy(t->dims, h->dims, sizeof(t->dims));
	t->nbytes = (size_t)h->data_bytes;
	t->data = malloc(t->nbytes ? t->nbytes : 1);
	t->name = name ? ap_strdup(name) : NULL;
	if (!t->data || (name && !t->name))
		return ap_host_tensor_free(t);
	return t;
}

static int check_bools(const ap_host_tensor *t, const char *what, ap_error *err)
{
	const uint8_t *p = t->data;

	if (t->dtype != AP_DT_BOOL)
		return 0;
	for (size_t i = 0; i < t->nbytes; i++)
		if (p[i] > 1)
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "%s: bool element %zu is the byte %u, not 0 or 1", what, i,
					    p[i]);
	return 0;
}

static int size_error(const char *what, const npy_header *h, uint64_t have, ap_error *err)
{
	return ap_error_set(err, AP_EINVAL, NULL, NULL,
			    "%s: the .npy header's shape and dtype (%s) need %llu data bytes, "
			    "the file has %llu%s", what, ap_dtype_name(h->dt),
			    (unsigned long long)h->data_bytes, (unsigned long long)have,
			    have < h->data_bytes ? " (the file is truncated?)" : "");
}

/* ---- reading ------------------------------------------------------------------------- */

int ap_npy_decode(const uint8_t *buf, size_t len, const char *what, ap_host_tensor **out,
		  ap_error *err)
{
	size_t hlen, hoff;
	npy_header h;
	ap_host_tensor *t;
	int rc;

	*out = NULL;
	what = what ? what : ".npy data";
	if ((rc = parse_prefix(buf, len, what, &hlen, &hoff, err)) < 0)
		return rc;
	if (hlen > len - hoff)
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "%s: truncated .npy file: its header needs %zu bytes, %zu follow",
				    what, hlen, len - hoff);
	if ((rc = parse_header((const char *)buf + hoff, hlen, what, &h, err)) < 0)
		return rc;
	if (h.data_bytes != len - hoff - hlen)
		return size_error(what, &h, len - hoff - hlen, err);
	if (!(t = tensor_for(&h, NULL)))
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "%s: out of memory", what);
	memcpy(t->data, buf + hoff + hlen, t->nbytes);
	if ((rc = check_bools(t, what, err)) < 0) {
		ap_host_tensor_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

/* Reads exactly n bytes at off; 0 or AP_EIO. */
static int read_at(int fd, void *p, size_t n, off_t off, const char *path, ap_error *err)
{
	while (n > 0) {
		ssize_t k = pread(fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n, off);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return ap_error_set(err, AP_EIO, NULL, NULL, "reading %s failed: %s", path,
					    k < 0 ? strerror(errno) : "it ended early");
		p = (uint8_t *)p + k;
		off += k;
		n -= (size_t)k;
	}
	return 0;
}

/* Reads and parses the header of the open file fd (st_size bytes). */
static int read_header(int fd, uint64_t size, const char *path, npy_header *h, size_t *data_off,
		       ap_error *err)
{
	uint8_t pre[12];
	size_t avail = size < sizeof(pre) ? (size_t)size : sizeof(pre), hlen, hoff;
	char *text;
	int rc;

	if ((rc = read_at(fd, pre, avail, 0, path, err)) < 0 ||
	    (rc = parse_prefix(pre, avail, path, &hlen, &hoff, err)) < 0)
		return rc;
	if (hlen > size - hoff)
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "%s: truncated .npy file: its header needs %zu bytes, %llu follow",
				    path, hlen, (unsigned long long)(size - hoff));
	if (!(text = malloc(hlen ? hlen : 1)))
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory reading %s", path);
	rc = read_at(fd, text, hlen, (off_t)hoff, path, err);
	if (!rc)
		rc = parse_header(text, hlen, path, h, err);
	free(text);
	*data_off = hoff + hlen;
	return rc;
}

int ap_npy_read(const char *path, const char *name, ap_host_tensor **out, ap_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	npy_header h;
	size_t off = 0;
	ap_host_tensor *t = NULL;
	int rc;

	*out = NULL;
	if (fd < 0)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot open %s: %s", path,
				    strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s is not a regular file", path);
	}
	rc = read_header(fd, (uint64_t)st.st_size, path, &h, &off, err);
	if (!rc && h.data_bytes != (uint64_t)st.st_size - off)
		rc = size_error(path, &h, (uint64_t)st.st_size - off, err);
	if (!rc && !(t = tensor_for(&h, name)))
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory reading %s", path);
	if (!rc)
		rc = read_at(fd, t->data, t->nbytes, (off_t)off, path, err);
	if (!rc)
		rc = check_bools(t, path, err);
	close(fd);
	if (rc < 0) {
		ap_host_tensor_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

/* ---- writing ------------------------------------------------------------------------- */

int ap_npy_encode(const ap_host_tensor *t, uint8_t **out, size_t *len, ap_error *err)
{
	const char *descr = NULL;
	char header[512];
	size_t n = 0, total;
	uint64_t numel = 1;
	uint8_t *buf;

	*out = NULL;
	*len = 0;
	for (size_t i = 0; i < N_NPY_TYPES; i++)
		if (npy_types[i].dt == t->dtype)
			descr = npy_types[i].descr;
	if (!descr)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, t->name,
				    "tensor '%s': %s has no .npy dtype Apollo writes",
				    t->name ? t->name : "", ap_dtype_name(t->dtype));
	if (t->rank < 0 || t->rank > AP_MAX_RANK)
		return ap_error_set(err, AP_EINVAL, NULL, t->name, "tensor '%s': rank %d",
				    t->name ? t->name : "", t->rank);
	n += (size_t)snprintf(header, sizeof(header), "{'descr': '%s', 'fortran_order': False, "
			      "'shape': (", descr);
	for (int d = 0; d < t->rank; d++) {
		if (t->dims[d] < 0 || t->dims[d] > AP_MAX_ELEMENTS)
			return ap_error_set(err, AP_EINVAL, NULL, t->name,
					    "tensor '%s': dimension %lld", t->name ? t->name : "",
					    (long long)t->dims[d]);
		numel *= (uint64_t)t->dims[d];
		n += (size_t)snprintf(header + n, sizeof(header) - n, "%s%lld", d ? ", " : "",
				      (long long)t->dims[d]);
	}
	n += (size_t)snprintf(header + n, sizeof(header) - n, "%s), }", t->rank == 1 ? "," : "");
	if (numel > (uint64_t)AP_MAX_ELEMENTS || numel * ap_dtype_size(t->dtype) != t->nbytes)
		return ap_error_set(err, AP_EINVAL, NULL, t->name,
				    "tensor '%s': %zu bytes of data for its shape",
				    t->name ? t->name : "", t->nbytes);
	/* pad with spaces and a newline so that the data starts 64-byte aligned */
	while ((10 + n + 1) % 64)
		header[n++] = ' ';
	header[n++] = '\n';
	total = 10 + n + t->nbytes;
	if (!(buf = malloc(total)))
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	memcpy(buf, NPY_MAGIC, 6);
	buf[6] = 1;
	buf[7] = 0;
	buf[8] = (uint8_t)(n & 0xff);
	buf[9] = (uint8_t)(n >> 8);
	memcpy(buf + 10, header, n);
	if (t->nbytes)
		memcpy(buf + 10 + n, t->data, t->nbytes);
	*out = buf;
	*len = total;
	return 0;
}

int ap_npy_write(const char *path, const ap_host_tensor *t, ap_error *err)
{
	uint8_t *buf;
	size_t len;
	int rc = ap_npy_encode(t, &buf, &len, err);

	if (rc < 0)
		return rc;
	rc = ap_file_write(path, buf, len, err);
	free(buf);
	return rc;
}

/* ---- either kind of tensor file ---------------------------------------------------- */

int ap_tensor_file_read(const char *path, const char *name, ap_host_tensor **out, ap_error *err)
{
	size_t pl = strlen(path), len;
	uint8_t *buf;
	ap_host_tensor *t;
	char msg[sizeof(err->msg)];
	int rc;

	*out = NULL;
	if (pl >= 4 && !strcmp(path + pl - 4, ".npy"))
		return ap_npy_read(path, name, out, err);
	if ((rc = ap_file_read(path, (size_t)1 << 32, &buf, &len, err)) < 0)
		return rc;
	t = ap_onnx_tensor_decode(buf, len, err);
	free(buf);
	if (!t) {
		rc = err ? err->code : AP_EMESSAGE;
		if (err) {
			snprintf(msg, sizeof(msg), "%s", err->msg);
			ap_error_set(err, rc, NULL, NULL, "%s: %s", path, msg);
		}
		return rc;
	}
	*out = ap_host_tensor_copy(t, name);
	ap_host_tensor_free(t);
	return *out ? 0 : ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
}
