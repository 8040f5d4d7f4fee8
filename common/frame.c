/* frame.c -- length prefixes, the default socket path and its directory,
 * and the TCP handshake's proofs (see frame.h). */
#include "frame.h"

#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph.h"

uint32_t ap_frame_get_len(const uint8_t hdr[AP_FRAME_HEADER_BYTES])
{
	return (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 |
	       (uint32_t)hdr[2] << 8 | (uint32_t)hdr[3];
}

void ap_frame_put_len(uint8_t hdr[AP_FRAME_HEADER_BYTES], uint32_t len)
{
	hdr[0] = len >> 24;
	hdr[1] = len >> 16;
	hdr[2] = len >> 8;
	hdr[3] = len;
}

int ap_frame_check_len(uint32_t len, uint32_t max, ap_error *err)
{
	if (len == 0)
		return ap_error_set(err, AP_EFRAME, NULL, NULL,
				    "frame length is 0: a frame carries one Envelope of at least 1 byte");
	if (len > max)
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
				    "frame length %u exceeds the limit of %u bytes", len, max);
	return 0;
}

int ap_default_socket_path(char *buf, size_t cap)
{
	const char *env = getenv("APOLLO_SOCKET");
	int n;

	const char *xdg = getenv("XDG_RUNTIME_DIR");

	if (env && *env)
		n = snprintf(buf, cap, "%s", env);
	else if (xdg && xdg[0] == '/')
		n = snprintf(buf, cap, "%s/apollod.sock", xdg);
	else
		n = snprintf(buf, cap, "/tmp/apollod-%u/apollod.sock", (unsigned)geteuid());
	if (n < 0 || (size_t)n >= cap || n > 107)
		return AP_ETOOLARGE;
	return 0;
}

int ap_socket_dir_check(const char *path, ap_error *err)
{
	char copy[4096], own[32];
	const char *dir;
	struct stat st;
	uid_t me = geteuid();

	if (strlen(path) >= sizeof(copy))
		return ap_error_set(err, AP_EIO, NULL, NULL, "socket path is too long");
	memcpy(copy, path, strlen(path) + 1);
	dir = dirname(copy);
	snprintf(own, sizeof(own), "apollod-%u", (unsigned)me);
	if (stat(dir, &st) != 0) {
		if (errno != ENOENT || mkdir(dir, 0700) != 0 || stat(dir, &st) != 0)
			return ap_error_set(err, AP_EIO, NULL, NULL, "socket directory %s: %s", dir,
					    strerror(errno));
	}
	if (!S_ISDIR(st.st_mode))
		return ap_error_set(err, AP_EIO, NULL, NULL, "socket directory %s is not a directory",
				    dir);
	if (st.st_uid != me && st.st_uid != 0)
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "socket directory %s belongs to uid %u, not to this user (uid %u) "
				    "or root: another user could replace the socket; refusing it",
				    dir, (unsigned)st.st_uid, (unsigned)me);
	if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "socket directory %s (mode %03o) is writable by other users and not "
				    "sticky: anyone could replace the socket; refusing it", dir,
				    (unsigned)(st.st_mode & 07777));
	if (!strcmp(basename(copy), own) &&
	    (st.st_uid != me || (st.st_mode & (S_IRWXG | S_IRWXO))))
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "socket directory %s should be this user's private directory "
				    "(uid %u, mode 0700) but is uid %u, mode %03o: someone may have "
				    "created it first; remove it, or set XDG_RUNTIME_DIR or --socket",
				    dir, (unsigned)me, (unsigned)st.st_uid,
				    (unsigned)(st.st_mode & 07777));
	return 0;
}

int ap_auth_proof(const char *token, ap_auth_role role, const uint8_t nc[AP_AUTH_NONCE_BYTES],
		  const uint8_t ns[AP_AUTH_NONCE_BYTES], uint8_t out[AP_AUTH_PROOF_BYTES])
{
	static const char server_label[] = "apollod server", client_label[] = "apollo client";
	const void *parts[3];
	size_t lens[3];

	if (role == AP_AUTH_SERVER) {
		parts[0] = server_label, lens[0] = sizeof(server_label);
		parts[1] = nc, parts[2] = ns;
	} else {
		parts[0] = client_label, lens[0] = sizeof(client_label);
		parts[1] = ns, parts[2] = nc;
	}
	lens[1] = lens[2] = AP_AUTH_NONCE_BYTES;
	return ap_hmac_sha256(token, strlen(token), parts, lens, 3, out);
}

bool ap_auth_check(const char *token, ap_auth_role role, const uint8_t nc[AP_AUTH_NONCE_BYTES],
		   const uint8_t ns[AP_AUTH_NONCE_BYTES], const uint8_t *got, size_t got_len)
{
	uint8_t want[AP_AUTH_PROOF_BYTES];

	if (ap_auth_proof(token, role, nc, ns, want))
		return false;
	/* the length is public (a protocol constant), the bytes are compared
	 * in constant time */
	return got_len == AP_AUTH_PROOF_BYTES && got && ap_mem_equal_ct(want, got, sizeof(want));
}
