/* onnx_external.c -- the data of an ONNX tensor kept in a file beside the
 * model (ONNX external data: TensorProto.external_data, field 13, key/value
 * entries "location", "offset", "length", "checksum"; data_location, field
 * 14, EXTERNAL = 1; docs/ExternalData.md of the ONNX IR spec).  The
 * importer (ap_onnx_import_dir, graph.h) calls ap__onnx_external_load when
 * it needs such a tensor's values.
 *
 * A model file is untrusted input: its `location` must not reach outside
 * the model's folder, and its offset and length must not make us allocate
 * or read more than the file holds or the tensor needs.  So, before a byte
 * is allocated or read: the location is relative and has no ".."
 * component; its real path (links resolved) is under the folder's real
 * path; the file is a regular file, opened without following a link; the
 * range is inside the file; the length is the tensor's element count
 * times its dtype's size; the import's total stays within
 * AP_ONNX_EXTERNAL_MAX_BYTES.  Only then the tensor is allocated and the
 * bytes read with pread (no mapping: a file truncated meanwhile gives a
 * short read, an error, not a SIGBUS).
 */
#include "onnx_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

bool ap__onnx_is_external(const Onnx__TensorProto *tp)
{
	return (tp->has_data_location &&
		tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) ||
	       tp->n_external_data > 0;
}

/* What a tensor's external_data entries say. */
struct ext_ref {
	const char *location;   /* borrowed from the proto; NULL when absent */
	uint64_t offset, length;
	bool has_length;
};

/* A non-negative decimal integer, the whole string.  false when not. */
static bool parse_u64(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!s || !*s)
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9' || v > (UINT64_MAX - 9) / 10)
			return false;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return true;
}

static int read_entries(const Onnx__TensorProto *tp, const char *name, struct ext_ref *r,
			ap_error *err)
{
	memset(r, 0, sizeof(*r));
	for (size_t i = 0; i < tp->n_external_data; i++) {
		const Onnx__StringStringEntryProto *e = tp->external_data[i];
		const char *k = e->key ? e->key : "", *v = e->value ? e->value : "";

		if (!strcmp(k, "location")) {
			r->location = v;
		} else if (!strcmp(k, "offset") || !strcmp(k, "length")) {
			bool off = !strcmp(k, "offset");

			if (!parse_u64(v, off ? &r->offset : &r->length))
				return ap_error_set(err, AP_EINVAL, NULL, name,
						    "tensor '%s': external data %s '%.40s' is not a "
						    "non-negative integer", name, k, v);
			if (!off)
				r->has_length = true;
		}
	}
	if (!r->location || !r->location[0])
		return ap_error_set(err, AP_EINVAL, NULL, name,
				    "tensor '%s' keeps its data in an external file but names "
				    "no location", name);
	return 0;
}

/* The location must be relative and free of ".." components. */
static int check_location(const char *name, const char *loc, ap_error *err)
{
	const char *p = loc;

	if (loc[0] == '/')
		return ap_error_set(err, AP_EINVAL, NULL, name,
				    "tensor '%s': external data file '%.200s' is an absolute path; "
				    "it must be relative to the model's folder", name, loc);
	while (*p) {
		size_t n = strcspn(p, "/");

		if (n == 2 && p[0] == '.' && p[1] == '.')
			return ap_error_set(err, AP_EINVAL, NULL, name,
					    "tensor '%s': external data file '%.200s' has a '..' "
					    "component; it must stay in the model's folder", name, loc);
		p += n;
		while (*p == '/')
			p++;
	}
	return 0;
}

/* Resolves dir/loc into real (PATH_MAX bytes) and checks that it is under
 * dir's real path.  0, AP_EINVAL (outside, too long) or AP_EIO. */
static int resolve(const char *name, const char *dir, const char *loc, char *real,
		   ap_error *err)
{
	char path[PATH_MAX], base[PATH_MAX];
	size_t bl;
	int n;

	if (!realpath(dir, base))
		return ap_error_set(err, AP_EIO, NULL, name,
				    "tensor '%s': cannot resolve the model's folder %.200s: %s",
				    name, dir, strerror(errno));
	n = snprintf(path, sizeof(path), "%s/%s", dir, loc);
	if (n < 0 || (size_t)n >= sizeof(path))
		return ap_error_set(err, AP_EINVAL, NULL, name,
				    "tensor '%s': external data file '%.200s': path too long",
				    name, loc);
	if (!realpath(path, real))
		return ap_error_set(err, AP_EIO, NULL, name,
				    "tensor '%s': cannot open external data file %.200s: %s", name,
				    path, strerror(errno));
	bl = strlen(base);
	if (strcmp(base, "/") != 0 &&
	    (strncmp(real, base, bl) != 0 || (real[bl] != '/' && real[bl] != 0)))
		return ap_error_set(err, AP_EINVAL, NULL, name,
				    "tensor '%s': external data file '%.200s' leads outside the "
				    "model's folder (to %.200s)", name, loc, real);
	return 0;
}

/* Checks the byte range [offset, offset + length) of a file of `size`
 * bytes against the tensor's `need` bytes; sets r->length when absent. */
static int check_range(const char *name, const char *loc, struct ext_ref *r, uint64_t size,
		       uint64_t need, ap_error *err)
{
	if (r->offset > size)
		return ap_error_set(err, AP_EINVAL, NULL, name,
				    "tensor '%s': external data file '%.200s' has %llu bytes, "
				    "the data's offset is %llu", name, loc, (unsigned long long)size,
				    (unsigned long long)r->offset);
	if (!r->has_length)
		r->length = size - r->offset;
	if (r->length != need)
		return ap_error_set(err, AP_EINVAL, NULL, name,
				    "tensor '%s': external data in '%.200s' has %llu bytes, its "
				    "dims and dtype need %llu", name, loc,
				    (unsigned long long)r->length, (unsigned long long)need);
	if (r->length > size - r->offset)
		return ap_error_set(err, AP_EINVAL, NULL, name,
				    "tensor '%s': external data file '%.200s' has %llu bytes, "
				    "the data needs bytes %llu to %llu (the file is truncated?)",
				    name, loc, (unsigned long long)size,
				    (unsigned long long)r->offset,
				    (unsigned long long)(r->offset + r->length));
	return 0;
}

/* Reads n bytes at off of fd into p.  0 or AP_EIO. */
static int read_all(int fd, uint8_t *p, size_t n, uint64_t off, const char *name,
		    const char *loc, ap_error *err)
{
	while (n > 0) {
		ssize_t k = pread(fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n, (off_t)off);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return ap_error_set(err, AP_EIO, NULL, name,
					    "tensor '%s': cannot read external data file "
					    "'%.200s': %s", name, loc,
					    k < 0 ? strerror(errno) : "it ended early");
		p += k;
		off += (uint64_t)k;
		n -= (size_t)k;
	}
	return 0;
}

/* Opens the checked real path and reads the tensor's bytes into t. */
static int load_bytes(const char *name, const char *loc, const char *real, struct ext_ref *r,
		      uint64_t need, uint64_t *total, ap_host_tensor **out, const Onnx__TensorProto *tp,
		      ap_error *err)
{
	struct stat st;
	ap_host_tensor *t;
	int fd, rc;

	fd = open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return ap_error_set(err, AP_EIO, NULL, name,
				    "tensor '%s': cannot open external data file '%.200s': %s",
				    name, loc, strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return ap_error_set(err, AP_EIO, NULL, name,
				    "tensor '%s': external data file '%.200s' is not a regular file",
				    name, loc);
	}
	rc = check_range(name, loc, r, (uint64_t)st.st_size, need, err);
	if (!rc && r->length > AP_ONNX_EXTERNAL_MAX_BYTES - *total)
		rc = ap_error_set(err, AP_ETOOLARGE, NULL, name,
				  "tensor '%s': external data file '%.200s': the model's external "
				  "data is over the limit of %llu bytes", name, loc,
				  (unsigned long long)AP_ONNX_EXTERNAL_MAX_BYTES);
	if (rc) {
		close(fd);
		return rc;
	}
	t = ap__host_tensor_new(name, (ap_dtype)tp->data_type, (int)tp->n_dims, tp->dims);
	if (!t) {
		close(fd);
		return ap_error_set(err, AP_ENOMEM, NULL, name,
				    "out of memory reading tensor '%s'", name);
	}
	rc = t->nbytes ? read_all(fd, t->data, t->nbytes, r->offset, name, loc, err) : 0;
	close(fd);
	if (rc) {
		ap_host_tensor_free(t);
		return rc;
	}
	if (t->dtype == AP_DT_BOOL)   /* as raw_data: any non-zero byte is true */
		for (size_t i = 0; i < t->nbytes; i++)
			((uint8_t *)t->data)[i] = ((uint8_t *)t->data)[i] != 0;
	*total += r->length;
	*out = t;
	return 0;
}

__ap_give ap_host_tensor *ap__onnx_external_load(const Onnx__TensorProto *tp, const char *what,
						 const char *model_dir, uint64_t *total,
						 ap_error *err)
{
	const char *name = tp->name && tp->name[0] ? tp->name : (what ? what : "");
	char real[PATH_MAX];
	struct ext_ref r;
	ap_host_tensor *t = NULL;
	int64_t numel;
	size_t es;

	if (read_entries(tp, name, &r, err))
		return NULL;
	if (!model_dir) {
		ap_error_set(err, AP_EUNSUPPORTED, NULL, name,
			     "tensor '%s' keeps its data in the external file '%.200s', which this "
			     "import cannot read (no model folder): weights with external data "
			     "must be bound by the client", name, r.location);
		return NULL;
	}
	for (size_t i = 0; i < tp->n_dims; i++)
		if (tp->dims[i] < 0) {
			ap_error_set(err, AP_EINVAL, NULL, name,
				     "tensor '%s' has negative dimension %lld", name,
				     (long long)tp->dims[i]);
			return NULL;
		}
	numel = tp->n_dims <= AP_MAX_RANK ? ap__shape_numel((int)tp->n_dims, tp->dims) : -1;
	es = ap_dtype_size((ap_dtype)(tp->has_data_type ? tp->data_type : 0));
	if (numel < 0 || es == 0) {
		ap_error_set(err, numel < 0 ? AP_ETOOLARGE : AP_EUNSUPPORTED, NULL, name,
			     "tensor '%s' (external data in '%.200s') has %s", name, r.location,
			     numel < 0 ? "too many elements" : "an unsupported data type");
		return NULL;
	}
	if (check_location(name, r.location, err) ||
	    resolve(name, model_dir, r.location, real, err) ||
	    load_bytes(name, r.location, real, &r, (uint64_t)numel * es, total, &t, tp, err))
		return NULL;
	return t;
}

/* ---- the files a model's external data is in -------------------------------------------- */

typedef struct ext_files {
	const char *dir;
	char **loc, **real;
	int n;
	ap_error *err;
} ext_files;

/* Adds tp's file to f unless listed already: checked as a load checks it
 * (location, folder), and a regular file. */
static int ext_add(ext_files *f, const Onnx__TensorProto *tp)
{
	const char *name = tp->name && tp->name[0] ? tp->name : "";
	char real[PATH_MAX], **nl, **nr;
	struct ext_ref r;
	struct stat st;
	int rc;

	if ((rc = read_entries(tp, name, &r, f->err)) || (rc = check_location(name, r.location, f->err)))
		return rc;
	for (int i = 0; i < f->n; i++)
		if (!strcmp(f->loc[i], r.location))
			return 0;
	if ((rc = resolve(name, f->dir, r.location, real, f->err)))
		return rc;
	if (stat(real, &st) < 0 || !S_ISREG(st.st_mode))
		return ap_error_set(f->err, AP_EIO, NULL, name,
				    "tensor '%s': external data file '%.200s' is not a regular file",
				    name, r.location);
	nl = realloc(f->loc, (size_t)(f->n + 1) * sizeof(char *));
	if (nl)
		f->loc = nl;
	nr = nl ? realloc(f->real, (size_t)(f->n + 1) * sizeof(char *)) : NULL;
	if (nr)
		f->real = nr;
	if (!nl || !nr || !(f->loc[f->n] = ap_strdup(r.location)))
		return ap_error_set(f->err, AP_ENOMEM, NULL, NULL, "out of memory");
	if (!(f->real[f->n] = ap_strdup(real))) {
		free(f->loc[f->n]);
		return ap_error_set(f->err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	f->n++;
	return 0;
}

static int ext_graph(ext_files *f, const Onnx__GraphProto *g, int depth);

static int ext_tensor(ext_files *f, const Onnx__TensorProto *tp)
{
	return tp && ap__onnx_is_external(tp) ? ext_add(f, tp) : 0;
}

/* Every tensor of a graph: initializers, and the tensor and graph
 * attributes of its nodes, subgraphs included (at most 64 deep). */
static int ext_graph(ext_files *f, const Onnx__GraphProto *g, int depth)
{
	int rc = 0;

	if (!g)
		return 0;
	if (depth > 64)
		return ap_error_set(f->err, AP_EMESSAGE, NULL, NULL, "subgraphs nested over 64 deep");
	for (size_t i = 0; i < g->n_initializer && !rc; i++)
		rc = ext_tensor(f, g->initializer[i]);
	for (size_t i = 0; i < g->n_node && !rc; i++)
		for (size_t a = 0; a < g->node[i]->n_attribute && !rc; a++) {
			const Onnx__AttributeProto *at = g->node[i]->attribute[a];

			rc = ext_tensor(f, at->t);
			for (size_t k = 0; k < at->n_tensors && !rc; k++)
				rc = ext_tensor(f, at->tensors[k]);
			if (!rc)
				rc = ext_graph(f, at->g, depth + 1);
			for (size_t k = 0; k < at->n_graphs && !rc; k++)
				rc = ext_graph(f, at->graphs[k], depth + 1);
		}
	return rc;
}

int ap_onnx_external_files(const uint8_t *buf, size_t len, const char *model_dir,
			   char ***locations, char ***paths, int *n, ap_error *err)
{
	ext_files f = { model_dir, NULL, NULL, 0, err };
	Onnx__ModelProto *m;
	uint8_t *sk;
	size_t sl;
	int rc;

	*locations = *paths = NULL;
	*n = 0;
	if ((rc = ap_onnx_skeleton(buf, len, &sk, &sl, err)) < 0)
		return rc;
	m = onnx__model_proto__unpack(NULL, sl, sk);
	free(sk);
	if (!m)
		return ap_error_set(err, AP_EMESSAGE, NULL, NULL,
				    "%zu bytes are not an ONNX ModelProto", len);
	rc = ext_graph(&f, m->graph, 0);
	onnx__model_proto__free_unpacked(m, NULL);
	if (rc) {
		for (int i = 0; i < f.n; i++) {
			free(f.loc[i]);
			free(f.real[i]);
		}
		free(f.loc);
		free(f.real);
		return rc;
	}
	*locations = f.loc;
	*paths = f.real;
	*n = f.n;
	return 0;
}
