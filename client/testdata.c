/* testdata.c -- files and ONNX backend-test folders: DIR/model.onnx and
 * DIR/test_data_set_N/{input_K.pb, output_K.pb}, each .pb one serialized
 * onnx.TensorProto decoded by ap_onnx_tensor_decode (common/).  Writing
 * goes the other way (ap_testdata_encode: dims, data_type, name and
 * raw_data, packed by the protobuf-c code generated from proto/onnx.proto),
 * so that `apollo-client check --save-outputs` can turn one run's results
 * into the reference data of another (the fusion-level differential).
 */
#include "tool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/onnx.pb-c.h"

int ap_file_read(const char *path, size_t max, uint8_t **buf, size_t *len, ap_error *err)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	uint8_t *b;
	size_t n;

	*buf = NULL;
	*len = 0;
	if (!f)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot open %s: %s", path,
				    strerror(errno));
	if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
		fclose(f);
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s is not a regular file", path);
	}
	if ((uint64_t)st.st_size > max) {
		fclose(f);
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
				    "%s has %lld bytes, more than the limit of %zu", path,
				    (long long)st.st_size, max);
	}
	b = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (!b) {
		fclose(f);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory reading %s", path);
	}
	n = fread(b, 1, (size_t)st.st_size, f);
	if (n != (size_t)st.st_size || ferror(f)) {
		fclose(f);
		free(b);
		return ap_error_set(err, AP_EIO, NULL, NULL, "reading %s failed", path);
	}
	fclose(f);
	*buf = b;
	*len = n;
	return 0;
}

int ap_file_write(const char *path, const uint8_t *buf, size_t len, ap_error *err)
{
	FILE *f = fopen(path, "wb");

	if (!f)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot create %s: %s", path,
				    strerror(errno));
	bool bad = len && fwrite(buf, 1, len, f) != len;

	if (fclose(f) != 0)
		bad = true;
	if (bad)
		return ap_error_set(err, AP_EIO, NULL, NULL, "writing %s failed", path);
	return 0;
}

const char *ap_path_folder(const char *path, char *dir, size_t cap)
{
	const char *slash = strrchr(path, '/');
	size_t n = slash ? (size_t)(slash - path) : 0;

	if (!slash)
		return ".";
	if (n == 0)
		return "/";
	if (n >= cap)
		return NULL;
	memcpy(dir, path, n);
	dir[n] = 0;
	return dir;
}

void ap_strv_free(char **v, int n)
{
	if (!v)
		return;
	for (int i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

void ap_host_tensors_free(ap_host_tensor **ts, int n)
{
	if (!ts)
		return;
	for (int i = 0; i < n; i++)
		ap_host_tensor_free(ts[i]);
	free(ts);
}

ap_host_tensor *ap_host_tensor_copy(const ap_host_tensor *t, const char *name)
{
	ap_host_tensor *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->name = ap_strdup(name ? name : t->name);
	c->data = malloc(t->nbytes ? t->nbytes : 1);
	if (!c->name || !c->data)
		return ap_host_tensor_free(c);
	c->dtype = t->dtype;
	c->rank = t->rank;
	memcpy(c->dims, t->dims, sizeof(c->dims));
	c->nbytes = t->nbytes;
	if (t->nbytes)
		memcpy(c->data, t->data, t->nbytes);
	return c;
}

typedef struct set_ent {
	long num;
	char *path;
} set_ent;

static int cmp_set(const void *a, const void *b)
{
	const set_ent *x = a, *y = b;

	return x->num < y->num ? -1 : x->num > y->num;
}

int ap_testdata_sets(const char *dir, char ***names, int *n, ap_error *err)
{
	static const char prefix[] = "test_data_set_";
	DIR *d = opendir(dir);
	struct dirent *de;
	set_ent *ents = NULL;
	int count = 0, cap = 0;
	char **out;

	*names = NULL;
	*n = 0;
	if (!d)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot open %s: %s", dir,
				    strerror(errno));
	while ((de = readdir(d))) {
		char *end;
		long num;
		if (strncmp(de->d_name, prefix, sizeof(prefix) - 1))
			continue;
		num = strtol(de->d_name + sizeof(prefix) - 1, &end, 10);
		if (*end || end == de->d_name + sizeof(prefix) - 1)
			continue;
		if (count == cap) {
			int nc = cap ? cap * 2 : 4;
			set_ent *ne = realloc(ents, sizeof(*ents) * (size_t)nc);
			if (!ne)
				goto nomem;
			ents = ne;
			cap = nc;
		}
		ents[count].num = num;
		if (asprintf(&ents[count].path, "%s/%s", dir, de->d_name) < 0)
			goto nomem;
		count++;
	}
	closedir(d);
	d = NULL;
	if (count)   /* ents is NULL for a folder without sets: qsort wants an array */
		qsort(ents, (size_t)count, sizeof(*ents), cmp_set);
	out = calloc(count ? (size_t)count : 1, sizeof(char *));
	if (!out)
		goto nomem;
	for (int i = 0; i < count; i++)
		out[i] = ents[i].path;
	free(ents);
	*names = out;
	*n = count;
	return 0;
nomem:
	if (d)
		closedir(d);
	for (int i = 0; i < count; i++)
		free(ents[i].path);
	free(ents);
	return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
}

int ap_testdata_load(const char *setdir, const char *prefix, ap_host_tensor ***ts, int *n,
		     ap_error *err)
{
	ap_host_tensor **out = NULL;
	int count = 0, rc;

	*ts = NULL;
	*n = 0;
	for (;;) {
		char path[4096];
		uint8_t *buf;
		size_t len;
		ap_host_tensor *t, **nv;
		struct stat st;
		snprintf(path, sizeof(path), "%s/%s_%d.pb", setdir, prefix, count);
		if (stat(path, &st) < 0)
			break;
		rc = ap_file_read(path, (size_t)1 << 32, &buf, &len, err);
		if (rc < 0)
			goto fail;
		t = ap_onnx_tensor_decode(buf, len, err);
		free(buf);
		if (!t) {
			char msg[sizeof(err->msg)];
			rc = err ? err->code : AP_EMESSAGE;
			if (err) {
				snprintf(msg, sizeof(msg), "%s", err->msg);
				ap_error_set(err, rc, NULL, NULL, "%s: %s", path, msg);
			}
			goto fail;
		}
		nv = realloc(out, sizeof(*out) * (size_t)(count + 1));
		if (!nv) {
			ap_host_tensor_free(t);
			rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
			goto fail;
		}
		out = nv;
		out[count++] = t;
	}
	*ts = out;
	*n = count;
	return 0;
fail:
	ap_host_tensors_free(out, count);
	return rc < 0 ? rc : AP_EIO;
}

int ap_testdata_encode(const ap_host_tensor *t, const char *name, uint8_t **out, size_t *len,
		       ap_error *err)
{
	Onnx__TensorProto tp = ONNX__TENSOR_PROTO__INIT;
	size_t es = ap_dtype_size(t->dtype), n;
	uint64_t numel = 1;
	uint8_t *buf;

	*out = NULL;
	*len = 0;
	if (t->rank < 0 || t->rank > AP_MAX_RANK || es == 0)
		return ap_error_set(err, AP_EINVAL, NULL, t->name,
				    "tensor '%s': rank %d or data type %d cannot be written",
				    t->name ? t->name : "", t->rank, (int)t->dtype);
	for (int i = 0; i < t->rank; i++) {
		if (t->dims[i] < 0 || (t->dims[i] > 0 && numel > UINT64_MAX / (uint64_t)t->dims[i]))
			return ap_error_set(err, AP_EINVAL, NULL, t->name,
					    "tensor '%s': bad dimension %lld", t->name ? t->name : "",
					    (long long)t->dims[i]);
		numel *= (uint64_t)t->dims[i];
	}
	if (numel > SIZE_MAX / es || numel * es != t->nbytes)
		return ap_error_set(err, AP_EINVAL, NULL, t->name,
				    "tensor '%s': %zu bytes of data for its shape", t->name ? t->name : "",
				    t->nbytes);
	tp.n_dims = (size_t)t->rank;
	tp.dims = (int64_t *)t->dims;
	tp.has_data_type = 1;
	tp.data_type = (int32_t)t->dtype;   /* ap_dtype is numbered as TensorProto.DataType */
	tp.name = (char *)(name ? name : t->name ? t->name : "");
	tp.has_raw_data = 1;
	tp.raw_data.len = t->nbytes;
	tp.raw_data.data = t->data;
	n = onnx__tensor_proto__get_packed_size(&tp);
	buf = malloc(n ? n : 1);
	if (!buf)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	onnx__tensor_proto__pack(&tp, buf);
	*out = buf;
	*len = n;
	return 0;
}

/* mkdir that accepts an existing directory. */
static int make_dir(const char *path, ap_error *err)
{
	struct stat st;

	if (mkdir(path, 0777) == 0 || (errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode)))
		return 0;
	return ap_error_set(err, AP_EIO, NULL, NULL, "cannot create directory %s: %s", path,
			    strerror(errno));
}

int ap_testdata_save_model(const char *dir, const char *model, ap_error *err)
{
	char *real, link[4200];
	int rc;

	if ((rc = make_dir(dir, err)) < 0)
		return rc;
	real = realpath(model, NULL);
	if (!real)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot resolve %s: %s", model,
				    strerror(errno));
	if ((size_t)snprintf(link, sizeof(link), "%s/model.onnx", dir) >= sizeof(link)) {
		free(real);
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL, "path too long: %s", dir);
	}
	if ((unlink(link) < 0 && errno != ENOENT) || symlink(real, link) < 0) {
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "cannot link %s to %s: %s", link, real,
				  strerror(errno));
		free(real);
		return rc;
	}
	free(real);
	return 0;
}

int ap_testdata_save(const char *setdir, const char *prefix, int k, const ap_host_tensor *t,
		     const char *name, ap_error *err)
{
	char path[4200];
	uint8_t *buf;
	size_t len;
	int rc;

	if ((rc = make_dir(setdir, err)) < 0)
		return rc;
	if ((size_t)snprintf(path, sizeof(path), "%s/%s_%d.pb", setdir, prefix, k) >= sizeof(path))
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL, "path too long: %s", setdir);
	if ((rc = ap_testdata_encode(t, name, &buf, &len, err)) < 0)
		return rc;
	rc = ap_file_write(path, buf, len, err);
	free(buf);
	return rc;
}
