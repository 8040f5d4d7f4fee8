/* notify.c -- sd_notify and socket activation by hand (see notify.h).
 *
 * Approach: ap_notify opens an AF_UNIX datagram socket for each message
 * (they are rare: ready, stopping, and a watchdog ping every few
 * seconds), connects it to $NOTIFY_SOCKET ('@' for the abstract
 * namespace: a leading NUL byte, the address length counting only the
 * name) and sends the text in one datagram.  ap_listen_fds reads
 * $LISTEN_PID / $LISTEN_FDS with strict decimal parsing.
 */
#include "notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define LISTEN_FDS_START 3

/* A decimal unsigned value of a variable; false when unset or malformed. */
static bool env_u64(const char *name, uint64_t *out)
{
	const char *v = getenv(name);
	char *end;
	unsigned long long x;

	if (!v || !*v || *v == '-')
		return false;
	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno || *end)
		return false;
	*out = x;
	return true;
}

int ap_notify(const char *state)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un addr;
	socklen_t alen;
	size_t n;
	int fd, rc = 1;

	if (!path || !*path)
		return 0;
	n = strlen(path);
	if ((path[0] != '/' && path[0] != '@') || n >= sizeof(addr.sun_path))
		return AP_EIO;
	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	memcpy(addr.sun_path, path, n);
	if (path[0] == '@')
		addr.sun_path[0] = '\0';
	alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '/'));
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return AP_EIO;
	if (connect(fd, (struct sockaddr *)&addr, alen) ||
	    send(fd, state, strlen(state), MSG_NOSIGNAL) != (ssize_t)strlen(state))
		rc = AP_EIO;
	close(fd);
	return rc;
}

uint64_t ap_notify_watchdog_usec(void)
{
	uint64_t usec, pid;

	if (!env_u64("WATCHDOG_USEC", &usec) || usec == 0)
		return 0;
	if (env_u64("WATCHDOG_PID", &pid) && pid != (uint64_t)getpid())
		return 0;
	return usec;
}

int ap_listen_fds(void)
{
	uint64_t pid, n;
	bool ok = env_u64("LISTEN_PID", &pid) && pid == (uint64_t)getpid() &&
		  env_u64("LISTEN_FDS", &n) && n > 0 && n < 64;

	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	if (!ok)
		return 0;
	for (int fd = LISTEN_FDS_START; fd < LISTEN_FDS_START + (int)n; fd++) {
		int flags = fcntl(fd, F_GETFD);

		if (flags < 0)
			return 0;
		fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
	}
	return (int)n;
}
