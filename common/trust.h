/* trust.h -- whether a file apollod reads code, configuration or secrets
 * from is under the control of the daemon's own user.
 *
 * The rule is OpenSSH's StrictModes (sshd's safe_path), with the sticky-bit
 * allowance of its callers: a file is trusted when it is a regular file
 * owned by the effective uid or by root and writable by neither group nor
 * others; every directory from its own up to "/" is owned by the effective
 * uid or root and, when group- or other-writable, sticky (so that nobody
 * else can rename or replace the entry below it).  With
 * AP_TRUST_PRIVATE_DIR the file's own directory may not be group- or
 * other-writable at all, sticky or not: a database needs that, since
 * another user could otherwise create the file, or SQLite's -wal / -shm /
 * -journal beside it, first.  A secret (a token, an HMAC key, a password) must besides be
 * unreadable by others.  Symbolic links are followed: the checks apply to
 * the file the path resolves to and to that file's directories.
 *
 * A file another user controls is how the second hardening review ran code
 * as root: a cache database planted in /tmp held a host shared object that
 * root's next cache hit loaded.
 */
#ifndef AP_TRUST_H
#define AP_TRUST_H

#include "base.h"

enum {
	AP_TRUST_SECRET = 1u << 0,     /* also refuse a file readable by others */
	AP_TRUST_MAY_BE_MISSING = 1u << 1, /* a file not there yet: check the directory that
					    * will hold it (it is made by the caller) */
	AP_TRUST_PRIVATE_DIR = 1u << 2, /* its directory writable by nobody else, even sticky */
};

/* Checks `path` and its directories by the rule above.  `what` names the
 * file in the message ("cache database", "config file").  `flags` is a set
 * of AP_TRUST_*.  Returns 0, or AP_EIO with `err` naming the path, its
 * owner and mode, and why it is refused (also when it cannot be resolved or
 * is not a regular file).  Reads the file system only; opens nothing. */
int ap_trust_path(const char *path, const char *what, unsigned flags, ap_error *err);

/* The same rule for a file already open as `fd` (fstat, so the file checked
 * is the file read) whose name is `path` (its directories are checked by
 * name).  0 or AP_EIO with `err`. */
int ap_trust_fd(int fd, const char *path, const char *what, unsigned flags, ap_error *err);

/* Opens `path` read-only (O_CLOEXEC) and checks it by the rule above before
 * anything is read.  Returns the descriptor (the caller closes it), or a
 * negative AP_EIO with `err`. */
int ap_trust_open(const char *path, const char *what, unsigned flags, ap_error *err);

#endif
