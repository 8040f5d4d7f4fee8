/* check_deploy.c -- apollod under a service manager, the way systemd runs
 * it (deploy/apollod.socket, deploy/apollod.service), with the test as the
 * manager: a listening Unix socket passed as descriptor 3 with LISTEN_FDS
 * and LISTEN_PID (socket activation), a datagram socket as NOTIFY_SOCKET
 * receiving READY=1, WATCHDOG=1 pings (WATCHDOG_USEC) and STOPPING=1; and
 * the metrics endpoint's HTTP answers (GET /metrics, 404, 405, 400 for a
 * malformed request line -- a NUL byte, a byte above 0x7e, no HTTP
 * version, longer than 1 KiB -- at once, 431 for headers too long) and its
 * slots (issue 29, item 9: one peer holding idle connections cannot keep
 * a scrape out; an idle connection is closed by the header time-out).
 * The Prometheus text itself is parsed by tests/prom_check.py
 * (tests/cluster.sh). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "client/apollo.h"

static char dir[64];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/apollo-deploy-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	signal(SIGPIPE, SIG_IGN);
}

static void teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
}

static const char *apollod_path(void)
{
	static char path[4096];
	const char *build = getenv("APOLLO_BUILD");

	snprintf(path, sizeof(path), "%s/apollod", build && *build ? build : "build");
	return path;
}

/* A socket bound to `path`, close-on-exec (start_activated hands the
 * listening one on as descriptor 3 with dup2). */
static int unix_socket(int type, const char *path, bool listening)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	ck_assert_msg(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "bind %s: %s", path,
		      strerror(errno));
	if (listening)
		ck_assert_int_eq(listen(fd, 16), 0);
	return fd;
}

/* The next datagram on `fd` within `ms` into buf ("" on timeout). */
static void next_datagram(int fd, char *buf, size_t cap, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	ssize_t n;

	buf[0] = '\0';
	if (poll(&p, 1, ms) != 1)
		return;
	n = recv(fd, buf, cap - 1, 0);
	buf[n > 0 ? n : 0] = '\0';
}

/* Waits for a datagram starting with `prefix`, skipping others. */
static bool expect_datagram(int fd, const char *prefix, int ms, char *got, size_t cap)
{
	for (int waited = 0; waited < ms; waited += 100) {
		next_datagram(fd, got, cap, 100);
		if (!strncmp(got, prefix, strlen(prefix)))
			return true;
	}
	return false;
}

/* Starts apollod as systemd would: `listen_fd` as descriptor 3,
 * LISTEN_FDS=1, LISTEN_PID=its pid, NOTIFY_SOCKET, WATCHDOG_USEC. */
static pid_t start_activated(int listen_fd, const char *notify, const char *extra_arg)
{
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		char log[128], cache[128], unused[128], mypid[32];
		int logfd;

		snprintf(log, sizeof(log), "%s/apollod.log", dir);
		snprintf(cache, sizeof(cache), "%s/cache.db", dir);
		snprintf(unused, sizeof(unused), "%s/not-this.sock", dir);
		logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		dup2(logfd, 2);
		if (listen_fd != 3) {
			dup2(listen_fd, 3);
			close(listen_fd);
		}
		snprintf(mypid, sizeof(mypid), "%d", (int)getpid());
		setenv("LISTEN_FDS", "1", 1);
		setenv("LISTEN_PID", mypid, 1);
		setenv("NOTIFY_SOCKET", notify, 1);
		setenv("WATCHDOG_USEC", "200000", 1);
		execl(apollod_path(), "apollod", "--socket", unused, "--cache", cache,
		      "--workers", "1", extra_arg ? extra_arg : NULL, extra_arg ? "0" : NULL,
		      (char *)NULL);
		_exit(127);
	}
	return pid;
}

START_TEST(socket_activation_and_notify)
{
	char act[128], notify[128], unused[128], got[512], server[64];
	int lfd, nfd, st;
	pid_t pid;
	ap_client *c;
	ap_error err;
	int watchdogs = 0;

	snprintf(act, sizeof(act), "%s/activated.sock", dir);
	snprintf(notify, sizeof(notify), "%s/notify", dir);
	snprintf(unused, sizeof(unused), "%s/not-this.sock", dir);
	lfd = unix_socket(SOCK_STREAM, act, true);
	nfd = unix_socket(SOCK_DGRAM, notify, false);
	pid = start_activated(lfd, notify, NULL);
	close(lfd);   /* the daemon has it now, as descriptor 3 */

	ck_assert_msg(expect_datagram(nfd, "READY=1", 10000, got, sizeof(got)),
		      "no READY=1 from apollod (see %s/apollod.log)", dir);
	ck_assert_ptr_nonnull(strstr(got, "STATUS=listening on "));
	ck_assert_ptr_nonnull(strstr(got, act));
	/* it serves on the socket it was given, and bound nothing else */
	c = ap_client_connect(act, &err);
	ck_assert_msg(c != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_client_ping(c, server, sizeof(server), &err), 0);
	ck_assert_str_eq(server, "apollod 0.1.0");
	ap_client_free(c);
	ck_assert_int_ne(access(unused, F_OK), 0);
	/* WATCHDOG_USEC 200 ms: pings every 100 ms */
	for (int i = 0; i < 8; i++) {
		next_datagram(nfd, got, sizeof(got), 300);
		watchdogs += !strcmp(got, "WATCHDOG=1");
	}
	ck_assert_int_ge(watchdogs, 5);

	kill(pid, SIGTERM);
	ck_assert(expect_datagram(nfd, "STOPPING=1", 5000, got, sizeof(got)));
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	/* the socket file is systemd's: still there for the next start */
	ck_assert_int_eq(access(act, F_OK), 0);
	close(nfd);
}
END_TEST

/* A TCP connection to the metrics endpoint on 127.0.0.1. */
static int http_connect(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct timeval tv = { 10, 0 };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	ck_assert_int_ge(fd, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

/* One HTTP exchange of `len` request bytes: the whole answer (as much as
 * comes before the endpoint closes, or 10 s without a byte). */
static void http_n(int port, const char *request, size_t len, char *out, size_t cap)
{
	int fd = http_connect(port);
	size_t n = 0;
	ssize_t r;

	ck_assert_int_eq(send(fd, request, len, MSG_NOSIGNAL), (ssize_t)len);
	while (n < cap - 1 && (r = recv(fd, out + n, cap - 1 - n, 0)) > 0)
		n += (size_t)r;
	out[n] = '\0';
	close(fd);
}

static void http(int port, const char *request, char *out, size_t cap)
{
	http_n(port, request, strlen(request), out, cap);
}

START_TEST(metrics_endpoint_http)
{
	char act[128], notify[128], log[128], line[256], *body = malloc(1 << 16), *big;
	int lfd, nfd, st, port = 0;
	pid_t pid;
	FILE *f;

	snprintf(act, sizeof(act), "%s/activated.sock", dir);
	snprintf(notify, sizeof(notify), "%s/notify", dir);
	snprintf(log, sizeof(log), "%s/apollod.log", dir);
	lfd = unix_socket(SOCK_STREAM, act, true);
	nfd = unix_socket(SOCK_DGRAM, notify, false);
	pid = start_activated(lfd, notify, "--metrics");   /* --metrics 0: any free port */
	close(lfd);
	ck_assert(expect_datagram(nfd, "READY=1", 10000, line, sizeof(line)));
	close(nfd);   /* unread, its queue would fill and block the WATCHDOG=1 sends */
	f = fopen(log, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "metrics on port "))
			port = atoi(strstr(line, "metrics on port ") + 16);
	fclose(f);
	ck_assert_int_gt(port, 0);

	http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", body, 1 << 16);
	ck_assert_int_eq(strncmp(body, "HTTP/1.1 200 OK\r\n", 17), 0);
	ck_assert_ptr_nonnull(strstr(body, "Content-Type: text/plain; version=0.0.4"));
	ck_assert_ptr_nonnull(strstr(body, "\r\n\r\n# HELP apollo_uptime_seconds "));
	ck_assert_ptr_nonnull(strstr(body, "\napollo_requests_total{kind=\"compile\",result=\"ok\"} 0\n"));
	ck_assert_ptr_nonnull(strstr(body, "\napollo_redis_enabled 0\n"));
	{   /* Content-Length is the body's */
		const char *cl = strstr(body, "Content-Length: "), *b = strstr(body, "\r\n\r\n") + 4;

		ck_assert_ptr_nonnull(cl);
		ck_assert_uint_eq((size_t)atol(cl + 16), strlen(b));
	}
	http(port, "GET /other HTTP/1.1\r\n\r\n", body, 1 << 16);
	ck_assert_int_eq(strncmp(body, "HTTP/1.1 404 ", 13), 0);
	http(port, "POST /metrics HTTP/1.1\r\n\r\n", body, 1 << 16);
	ck_assert_int_eq(strncmp(body, "HTTP/1.1 405 ", 13), 0);
	big = malloc(8192);
	memset(big, 'a', 8191);
	big[8191] = '\0';
	memcpy(big, "GET /", 5);
	http(port, big, body, 1 << 16);   /* a request line over 1 KiB */
	ck_assert_int_eq(strncmp(body, "HTTP/1.1 400 ", 13), 0);
	/* a good request line, then more than 4 KiB of headers */
	memcpy(big, "GET /metrics HTTP/1.1\r\nX-Long: ", 31);
	http(port, big, body, 1 << 16);
	ck_assert_msg(!strncmp(body, "HTTP/1.1 431 ", 13), "%.60s", body);
	free(big);

	kill(pid, SIGTERM);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	free(body);
}
END_TEST

/* Starts apollod with --metrics 0 as metrics_endpoint_http does: its pid,
 * the metrics port in *port.  The notify socket is closed once READY=1
 * has come (unread, its queue would fill and block the WATCHDOG=1
 * sends). */
static pid_t start_metrics(int *port)
{
	int nfd_, *nfd = &nfd_;
	char act[128], notify[128], log[128], line[256];
	int lfd;
	pid_t pid;
	FILE *f;

	snprintf(act, sizeof(act), "%s/activated.sock", dir);
	snprintf(notify, sizeof(notify), "%s/notify", dir);
	snprintf(log, sizeof(log), "%s/apollod.log", dir);
	lfd = unix_socket(SOCK_STREAM, act, true);
	*nfd = unix_socket(SOCK_DGRAM, notify, false);
	pid = start_activated(lfd, notify, "--metrics");
	close(lfd);
	ck_assert(expect_datagram(*nfd, "READY=1", 10000, line, sizeof(line)));
	*port = 0;
	f = fopen(log, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "metrics on port "))
			*port = atoi(strstr(line, "metrics on port ") + 16);
	fclose(f);
	ck_assert_int_gt(*port, 0);
	close(*nfd);
	return pid;
}

/* Issue 29, item 9: the endpoint's 16 connections had no per-peer limit:
 * one local process re-opening 16 idle connections made 0 of 12 scrapes
 * succeed, and a request line with a NUL byte got no 400 and was closed
 * after 5 s.  Now a new connection makes idle ones (the peer's own first)
 * give way, and a malformed request line is answered 400 at once -- the
 * requests below never end their headers, so only the request line can
 * have been judged. */
START_TEST(metrics_endpoint_limits)
{
	static const struct {
		const char *req;
		size_t len;
	} bad[] = {
	/* sizeof, not a count by hand: two of these hold a NUL or a \xff, and a
	 * length counted wrong sent bytes past the literal (ASan, CI) */
#define REQ(s) { s, sizeof(s) - 1 }
		REQ("GET /met\0rics HTTP/1.1\r\n"),
		REQ("GET /metrics\xff HTTP/1.1\r\n"),
		REQ("GET /metrics\r\n"),
		REQ("GET /metrics HTTP/1.1 extra\r\n"),
		REQ("get /metrics HTTP/1.1\r\n"),
#undef REQ
	};
	char *body = malloc(1 << 16), c;
	int port, st, idle[16], ok = 0;
	pid_t pid = start_metrics(&port);

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		http_n(port, bad[i].req, bad[i].len, body, 1 << 16);
		ck_assert_msg(!strncmp(body, "HTTP/1.1 400 Bad Request\r\n", 26),
			      "request %zu: '%.40s'", i, body);
	}
	/* 12 scrapes, each after the same peer has opened 16 idle
	 * connections again (closing its previous ones) */
	for (int i = 0; i < 16; i++)
		idle[i] = -1;
	for (int round = 0; round < 12; round++) {
		for (int i = 0; i < 16; i++) {
			if (idle[i] >= 0)
				close(idle[i]);
			idle[i] = http_connect(port);
		}
		http(port, "GET /metrics HTTP/1.1\r\n\r\n", body, 1 << 16);
		ok += !strncmp(body, "HTTP/1.1 200 OK\r\n", 17);
	}
	printf("metrics_endpoint_limits: %d of 12 scrapes answered beside 16 idle connections\n",
	       ok);
	fflush(stdout);
	ck_assert_int_eq(ok, 12);
	/* the idle ones are all closed, without an answer: made way for the
	 * scrape, or the header time-out */
	for (int i = 0; i < 16; i++) {
		ssize_t r = recv(idle[i], &c, 1, 0);

		ck_assert_msg(r == 0, "idle connection %d: %zd (%s)", i, r, r < 0 ? strerror(errno) : "");
		close(idle[i]);
	}

	kill(pid, SIGTERM);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	free(body);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("deploy");
	TCase *tc = tcase_create("deploy");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, socket_activation_and_notify);
	tcase_add_test(tc, metrics_endpoint_http);
	tcase_add_test(tc, metrics_endpoint_limits);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
