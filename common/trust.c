/* trust.c -- the file-ownership rule of trust.h.
 *
 * Approach: resolve the path (realpath), check the file's own status, then
 * walk its directories from the innermost up to "/": owner this user or
 * root, writable by others only when sticky (the innermost not at all with
 * AP_TRUST_PRIVATE_DIR).  Every refusal says which path, who owns it, its mode and why.
 */
#include "trust.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One directory by the strict (innermost) or the ancestor rule. */
static int dir_ok(const char *dir, bool strict, const char *what, const char *path,
		  ap_error *err)
{
	struct stat st;
	uid_t me = geteuid();

	if (stat(dir, &st))
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s %s: cannot examine directory %s: %s",
				    what, path, dir, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s %s: %s is not a directory", what,
				    path, dir);
	if (st.st_uid != me && st.st_uid != 0)
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "%s %s: directory %s belongs to uid %u, not to this user (uid %u) "
				    "or root: its owner could replace what apollod reads; refusing it",
				    what, path, dir, (unsigned)st.st_uid, (unsigned)me);
	if ((st.st_mode & (S_IWGRP | S_IWOTH)) && (strict || !(st.st_mode & S_ISVTX)))
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "%s %s: directory %s (mode %04o) is writable by %s%s: another user "
				    "could create or replace files there; refusing it (use a directory "
				    "only this user can write, e.g. mode 0700)",
				    what, path, dir, (unsigned)(st.st_mode & 07777),
				    st.st_mode & S_IWOTH ? "others" : "its group",
				    strict ? "" : " and is not sticky");
	return 0;
}

/* Walks `dir` (an absolute, resolved path; modified) up to "/". */
static int walk_dirs(char *dir, bool strict_first, const char *what, const char *path,
		     ap_error *err)
{
	bool strict = strict_first;

	for (;;) {
		char *slash;
		int rc = dir_ok(dir, strict, what, path, err);

		if (rc)
			return rc;
		strict = false;
		if (!strcmp(dir, "/"))
			return 0;
		slash = strrchr(dir, '/');
		if (!slash)
			return 0;
		if (slash == dir)
			dir[1] = '\0';
		else
			*slash = '\0';
	}
}

/* The file's own status: regular, owned by this user or root, not writable
 * by group or others, and (secrets) not readable by others. */
static int file_ok(const struct stat *st, const char *what, const char *path, unsigned flags,
		   ap_error *err)
{
	uid_t me = geteuid();

	if (!S_ISREG(st->st_mode))
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s %s is not a regular file", what,
				    path);
	if (st->st_uid != me && st->st_uid != 0)
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "%s %s belongs to uid %u, not to this user (uid %u) or root: its "
				    "owner controls what apollod reads from it; refusing it",
				    what, path, (unsigned)st->st_uid, (unsigned)me);
	if (st->st_mode & (S_IWGRP | S_IWOTH))
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "%s %s (mode %04o) is writable by %s: refusing it (chmod go-w)",
				    what, path, (unsigned)(st->st_mode & 07777),
				    st->st_mode & S_IWOTH ? "others" : "its group");
	if ((flags & AP_TRUST_SECRET) && (st->st_mode & S_IROTH))
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "%s %s (mode %04o) holds a secret and is readable by others: "
				    "refusing it (chmod 600)", what, path,
				    (unsigned)(st->st_mode & 07777));
	return 0;
}

/* The directories of the resolved file `real` (strict innermost). */
static int file_dirs(const char *real, const char *what, const char *path, unsigned flags,
		     ap_error *err)
{
	char dir[PATH_MAX];
	char *slash;

	if (strlen(real) >= sizeof(dir))
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s %s: path too long", what, path);
	strcpy(dir, real);
	slash = strrchr(dir, '/');
	if (!slash)
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s %s: not an absolute path", what, path);
	if (slash == dir)
		dir[1] = '\0';
	else
		*slash = '\0';
	return walk_dirs(dir, flags & AP_TRUST_PRIVATE_DIR, what, path, err);
}

/* A path not there yet: the nearest existing directory on its way, strict
 * (with AP_TRUST_PRIVATE_DIR) when it is the directory that will hold the
 * file itself (apollod creates the missing ones, mode 0700). */
static int missing_ok(const char *path, const char *what, unsigned flags, ap_error *err)
{
	char copy[PATH_MAX], real[PATH_MAX];
	bool innermost = flags & AP_TRUST_PRIVATE_DIR;

	if (strlen(path) >= sizeof(copy))
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s %s: path too long", what, path);
	strcpy(copy, path);
	for (;;) {
		char *slash = strrchr(copy, '/');

		if (!slash)
			strcpy(copy, ".");
		else if (slash == copy)
			copy[1] = '\0';
		else
			*slash = '\0';
		if (realpath(copy, real))
			return walk_dirs(real, innermost, what, path, err);
		if (errno != ENOENT || !strcmp(copy, ".") || !strcmp(copy, "/"))
			return ap_error_set(err, AP_EIO, NULL, NULL, "%s %s: cannot resolve %s: %s",
					    what, path, copy, strerror(errno));
		innermost = false;
	}
}

int ap_trust_path(const char *path, const char *what, unsigned flags, ap_error *err)
{
	char real[PATH_MAX];
	struct stat st;
	int rc;

	if (!realpath(path, real)) {
		if (errno == ENOENT && (flags & AP_TRUST_MAY_BE_MISSING))
			return missing_ok(path, what, flags, err);
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s %s: %s", what, path, strerror(errno));
	}
	if (stat(real, &st))
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s %s: %s", what, path, strerror(errno));
	if ((rc = file_ok(&st, what, path, flags, err)))
		return rc;
	return file_dirs(real, what, path, flags, err);
}

int ap_trust_fd(int fd, const char *path, const char *what, unsigned flags, ap_error *err)
{
	char real[PATH_MAX];
	struct stat st;
	int rc;

	if (fstat(fd, &st))
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s %s: %s", what, path, strerror(errno));
	if ((rc = file_ok(&st, what, path, flags, err)))
		return rc;
	if (!realpath(path, real))
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s %s: %s", what, path, strerror(errno));
	return file_dirs(real, what, path, flags, err);
}

int ap_trust_open(const char *path, const char *what, unsigned flags, ap_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	int rc;

	if (fd < 0)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot open %s %s: %s", what, path,
				    strerror(errno));
	if ((rc = ap_trust_fd(fd, path, what, flags & ~AP_TRUST_MAY_BE_MISSING, err))) {
		close(fd);
		return rc;
	}
	return fd;
}
