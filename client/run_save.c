/* run_save.c -- `apollo-client run --save DIR`: a run kept as an ONNX
 * backend-test folder (DIR/model.onnx, DIR/test_data_set_0/input_K.pb and
 * output_K.pb), so that `apollo-client check DIR` runs it again later.
 *
 * The model is copied, not linked (the folder outlives the user's copy),
 * and so is each file of its external data, at the location the model
 * names (relative, confined to the model's folder: ap_onnx_external_files
 * checks it as the importer does), so the copy imports as the original.
 * Nothing is overwritten: DIR must be new or empty, and every file is
 * created with O_EXCL.
 */
#include "tool.h"

#include <dirent.h>
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

/* DIR made, or found empty.  0, AP_EINVAL (not a folder, not empty), AP_EIO. */
static int fresh_dir(const char *dir, ap_error *err)
{
	DIR *d;
	struct dirent *de;
	bool empty = true;

	if (mkdir(dir, 0777) == 0)
		return 0;
	if (errno != EEXIST)
		return ap_error_set(err, AP_EIO, NULL, NULL, "--save: cannot create %s: %s", dir,
				    strerror(errno));
	if (!(d = opendir(dir)))
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "--save: %s exists and is not a "
				    "folder: %s", dir, strerror(errno));
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			empty = false;
	closedir(d);
	if (!empty)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "--save: %s is not empty: give a new "
				    "or an empty folder (nothing is overwritten)", dir);
	return 0;
}

/* Writes len bytes to fd; 0 or AP_EIO. */
static int write_all(int fd, const uint8_t *p, size_t len, const char *path, ap_error *err)
{
	while (len > 0) {
		ssize_t k = write(fd, p, len > ((size_t)1 << 30) ? (size_t)1 << 30 : len);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return ap_error_set(err, AP_EIO, NULL, NULL, "writing %s failed: %s", path,
					    strerror(errno));
		p += k;
		len -= (size_t)k;
	}
	return 0;
}

/* Creates `path` (which must not exist) holding len bytes at buf, or,
 * with buf NULL, a copy of the regular file `src`. */
static int create_file(const char *path, const uint8_t *buf, size_t len, const char *src,
		       ap_error *err)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666), in = -1, rc = 0;
	uint8_t chunk[1 << 16];

	if (fd < 0)
		return ap_error_set(err, AP_EIO, NULL, NULL, "--save: cannot create %s: %s", path,
				    strerror(errno));
	if (buf)
		rc = write_all(fd, buf, len, path, err);
	else if ((in = open(src, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) < 0)
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "cannot open %s: %s", src,
				  strerror(errno));
	while (!buf && !rc) {
		ssize_t k = read(in, chunk, sizeof(chunk));

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			rc = ap_error_set(err, AP_EIO, NULL, NULL, "reading %s failed: %s", src,
					  strerror(errno));
		if (k <= 0)
			break;
		rc = write_all(fd, chunk, (size_t)k, path, err);
	}
	if (in >= 0)
		close(in);
	if (close(fd) < 0 && !rc)
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "writing %s failed: %s", path,
				  strerror(errno));
	return rc;
}

/* DIR/loc's parent folders inside DIR (loc is relative, without ".."). */
static int make_parents(const char *dir, const char *loc, ap_error *err)
{
	char path[PATH_MAX];
	size_t dl = strlen(dir);

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, loc) >= sizeof(path))
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL, "--save: path too long: %s/%s",
				    dir, loc);
	for (char *p = path + dl + 1; (p = strchr(p, '/')); p++) {
		*p = 0;
		if (mkdir(path, 0777) < 0 && errno != EEXIST)
			return ap_error_set(err, AP_EIO, NULL, NULL, "--save: cannot create %s: %s",
					    path, strerror(errno));
		*p = '/';
	}
	return 0;
}

/* Copies each external data file of the model into DIR at its location. */
static int copy_external(const char *dir, const char *model_path, const uint8_t *buf,
			 size_t len, ap_error *err)
{
	char folder[PATH_MAX], path[PATH_MAX], **loc = NULL, **real = NULL;
	const char *mdir = ap_path_folder(model_path, folder, sizeof(folder));
	int n = 0, rc;

	if (!mdir)
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL, "path too long: %s", model_path);
	rc = ap_onnx_external_files(buf, len, mdir, &loc, &real, &n, err);
	for (int i = 0; i < n && !rc; i++) {
		bool copied = false;   /* "a.data" after "./a.data": the same file, there */

		if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, loc[i]) >= sizeof(path))
			rc = ap_error_set(err, AP_ETOOLARGE, NULL, NULL, "--save: path too long");
		for (int j = 0; j < i && !rc; j++)
			copied |= !strcmp(real[j], real[i]) && access(path, F_OK) == 0;
		if (!rc && !copied)
			rc = make_parents(dir, loc[i], err);
		if (!rc && !copied)
			rc = create_file(path, NULL, 0, real[i], err);
	}
	for (int i = 0; i < n; i++) {
		free(loc[i]);
		free(real[i]);
	}
	free(loc);
	free(real);
	return rc;
}

int ap_run_save(const char *dir, const char *model_path, const uint8_t *buf, size_t len,
		ap_host_tensor *const *in, int n_in, ap_host_tensor *const *out, int n_out,
		ap_error *err)
{
	char path[PATH_MAX], set[PATH_MAX];
	int rc;

	if ((size_t)snprintf(path, sizeof(path), "%s/model.onnx", dir) >= sizeof(path) ||
	    (size_t)snprintf(set, sizeof(set), "%s/test_data_set_0", dir) >= sizeof(set))
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL, "--save: path too long: %s", dir);
	if ((rc = fresh_dir(dir, err)) < 0 || (rc = create_file(path, buf, len, NULL, err)) < 0 ||
	    (rc = copy_external(dir, model_path, buf, len, err)) < 0)
		return rc;
	if (mkdir(set, 0777) < 0)
		return ap_error_set(err, AP_EIO, NULL, NULL, "--save: cannot create %s: %s", set,
				    strerror(errno));
	for (int k = 0; k < n_in; k++)
		if ((rc = ap_testdata_save(set, "input", k, in[k], NULL, err)) < 0)
			return rc;
	for (int k = 0; k < n_out; k++)
		if ((rc = ap_testdata_save(set, "output", k, out[k], NULL, err)) < 0)
			return rc;
	return 0;
}
