/* check_redis.c -- the shared cache client (server/cache/redis.c) against a
 * real redis-server (Debian's, started by the fixture on a private Unix
 * socket, no persistence): entries round-trip with their parts, key and
 * TTL; an entry altered in Redis, moved to another key or written under
 * another secret is a miss and counted, never served; a reply whose
 * announced length is over the limit is refused before it is buffered (a
 * fake server); so is a reply whose parts together are too large or too
 * many (a fake server answering GET with 2,000 or 1,000 x 1 MiB, or
 * 100,000 integers), with the process's peak memory bounded; the breaker
 * opens after the configured failures, sends nothing while open, and
 * closes again once Redis is back; secret files
 * are checked; tuning records travel between two compilers with their own
 * local caches (a searched record, then a measured one, each found by the
 * other compiler's build; a malformed record is ignored).  The tiered
 * read-through (cache/tiers.h) of kernels, blobs, bundles and tuning
 * records: an L1 miss served from Redis is copied into L1 and counted as
 * an L2 hit; an altered or refused entry is a miss, counted, L1 untouched.
 * Cluster leases
 * (issue 26, item 1): a lease is taken by one token and refused to
 * another, renewed and released only by its own token, lapses after its
 * ttl and is then taken over, and lives under a key no entry lookup
 * reads; a claim (server/compile/lease.h) holds it with renewals past its
 * ttl, waits for the holder's entry, takes over a holder that stopped
 * renewing, gives up at its deadline, and compiles alone at once without
 * Redis; two compilers asked for one cold graph compile it once, the
 * second answered from L2.  Kernel leases: two compilers given two
 * different cold graphs that share a kernel compile it once, the second
 * waiting for the first's entry; a kernel lease whose holder died is taken
 * over after its ttl; without Redis both compile; two compilers each
 * holding a kernel the other needs both finish, each kernel compiled
 * once. */
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/graph.h"
#include "proto/apollo.pb-c.h"
#include "server/cache/cache.h"
#include "server/cache/redis.h"
#include "server/cache/tiers.h"
#include "server/compile/compile.h"
#include "server/compile/lease.h"
#include "server/plan/program.h"
#include "server/tune/records.h"
#include "server/config.h"

static char dir[64], sock[96];
static pid_t redis_pid;
static const uint8_t secret[] = "a cluster secret of some length";

/* Starts redis-server on `sock`; waits until it answers. */
static void redis_start(void)
{
	char sockopt[200];

	redis_pid = fork();
	ck_assert_int_ge(redis_pid, 0);
	if (redis_pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		dup2(null, 1);
		dup2(null, 2);
		execlp("redis-server", "redis-server", "--port", "0", "--unixsocket", sock,
		       "--save", "", "--appendonly", "no", (char *)NULL);
		_exit(127);
	}
	snprintf(sockopt, sizeof(sockopt), "redis-cli -s %s ping >/dev/null 2>&1", sock);
	for (int i = 0; i < 200; i++) {
		int st;

		if (access(sock, F_OK) == 0 && system(sockopt) == 0)
			return;
		ck_assert_msg(waitpid(redis_pid, &st, WNOHANG) == 0,
			      "redis-server did not start (is it installed? make deps)");
		usleep(20000);
	}
	ck_abort_msg("redis-server did not answer on %s", sock);
}

static void redis_stop(void)
{
	if (redis_pid > 0) {
		kill(redis_pid, SIGKILL);
		waitpid(redis_pid, NULL, 0);
		redis_pid = 0;
		unlink(sock);
	}
}

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/apollo-redis-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(sock, sizeof(sock), "%s/redis.sock", dir);
	ap_log_set_level(AP_LOG_ERROR);
	signal(SIGPIPE, SIG_IGN);   /* as apollod: a write to a Redis gone is an error */
	redis_start();
}

static void teardown(void)
{
	char cmd[128];

	redis_stop();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
}

static ap_redis *client(const uint8_t *sec, size_t sec_len, size_t max_value, unsigned fails)
{
	char addr[160];
	ap_redis_options o = {
		.addr = addr, .secret = sec, .secret_len = sec_len, .ns = "t", .ttl_s = 100,
		.connect_timeout_ms = 200, .timeout_ms = 500, .breaker_failures = fails,
		.breaker_open_ms = 300, .max_value_bytes = max_value,
	};
	ap_redis *r = NULL;
	ap_error err;

	snprintf(addr, sizeof(addr), "unix:%s", sock);
	ck_assert_msg(ap_redis_new(&o, &r, &err) == 0, "%s", err.msg);
	return r;
}

static void key_of(const char *s, uint8_t key[32])
{
	ap_sha256(s, strlen(s), key);
}

/* redis-cli's one-line answer to `args`. */
static void cli(char *out, size_t cap, const char *args)
{
	char cmd[512];
	FILE *p;

	snprintf(cmd, sizeof(cmd), "redis-cli -s %s %s", sock, args);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	if (!fgets(out, (int)cap, p))
		out[0] = '\0';
	out[strcspn(out, "\n")] = '\0';
	pclose(p);
}

START_TEST(round_trip)
{
	ap_redis *r = client(secret, sizeof(secret) - 1, 1 << 20, 3);
	const uint8_t *parts[3] = { (const uint8_t *)"bundle", (const uint8_t *)"",
				    (const uint8_t *)"kernel blob" };
	size_t lens[3] = { 6, 0, 11 };
	uint8_t k[32];
	char ks[200], out[200], cmd[300];
	ap_redis_entry e;
	ap_redis_counts n;

	key_of("graph", k);
	ck_assert_int_eq(ap_redis_get(r, AP_REDIS_ACTION, k, &e), 0);
	ck_assert_int_eq(ap_redis_put(r, AP_REDIS_ACTION, k, 3, parts, lens), 0);
	ck_assert_int_eq(ap_redis_get(r, AP_REDIS_ACTION, k, &e), 1);
	ck_assert_int_eq(e.n, 3);
	for (int i = 0; i < 3; i++) {
		ck_assert_uint_eq(e.part_len[i], lens[i]);
		ck_assert_int_eq(memcmp(e.part[i], parts[i], lens[i]), 0);
	}
	ap_redis_entry_clear(&e);
	/* a kernel entry under the same 32 bytes is another key */
	ck_assert_int_eq(ap_redis_get(r, AP_REDIS_KERNEL, k, &e), 0);

	ap_redis_key_string(r, AP_REDIS_ACTION, k, ks, sizeof(ks));
	ck_assert_int_eq(strncmp(ks, "t:s5.1:a:", 9), 0);
	ck_assert_uint_eq(strlen(ks), 9 + 64);
	snprintf(cmd, sizeof(cmd), "TTL %s", ks);
	cli(out, sizeof(out), cmd);
	ck_assert_int_gt(atoi(out), 90);
	ck_assert_int_le(atoi(out), 100);

	ap_redis_get_counts(r, &n);
	ck_assert_uint_eq(n.gets, 3);
	ck_assert_uint_eq(n.hits, 1);
	ck_assert_uint_eq(n.misses, 2);
	ck_assert_uint_eq(n.puts, 1);
	ck_assert_uint_eq(n.failures, 0);
	ck_assert_uint_eq(n.verify_failures, 0);
	ck_assert_uint_eq(n.bytes_written, 10 + 3 * 8 + 17 + 32);
	ck_assert_uint_eq(n.bytes_read, n.bytes_written);
	ck_assert_int_eq(n.state, AP_REDIS_CLOSED);
	ap_redis_free(r);
}
END_TEST

/* Altered bytes, another key, another secret: misses, counted, logged. */
START_TEST(tampering_is_a_miss)
{
	static const uint8_t other[] = "another cluster's secret, as long";
	ap_redis *r = client(secret, sizeof(secret) - 1, 1 << 20, 3);
	ap_redis *stranger = client(other, sizeof(other) - 1, 1 << 20, 3);
	const uint8_t *parts[1] = { (const uint8_t *)"the kernel's bytes" };
	size_t lens[1] = { 18 };
	uint8_t k[32], k2[32];
	char ks[200], ks2[200], out[200], cmd[600];
	ap_redis_entry e;
	ap_redis_counts n;

	key_of("kernel", k);
	key_of("kernel two", k2);
	ck_assert_int_eq(ap_redis_put(r, AP_REDIS_KERNEL, k, 1, parts, lens), 0);
	ap_redis_key_string(r, AP_REDIS_KERNEL, k, ks, sizeof(ks));
	ap_redis_key_string(r, AP_REDIS_KERNEL, k2, ks2, sizeof(ks2));

	/* the same entry under another key does not verify */
	snprintf(cmd, sizeof(cmd), "COPY %s %s", ks, ks2);
	cli(out, sizeof(out), cmd);
	ck_assert_str_eq(out, "1");
	ck_assert_int_eq(ap_redis_get(r, AP_REDIS_KERNEL, k2, &e), 0);
	/* another secret does not verify */
	ck_assert_int_eq(ap_redis_get(stranger, AP_REDIS_KERNEL, k, &e), 0);
	/* one byte of the blob changed does not verify */
	snprintf(cmd, sizeof(cmd), "SETRANGE %s 22 X", ks);
	cli(out, sizeof(out), cmd);
	ck_assert_int_eq(ap_redis_get(r, AP_REDIS_KERNEL, k, &e), 0);
	ck_assert_ptr_null(e.buf);
	/* truncated: too short to be an entry */
	snprintf(cmd, sizeof(cmd), "SET %s short", ks);
	cli(out, sizeof(out), cmd);
	ck_assert_int_eq(ap_redis_get(r, AP_REDIS_KERNEL, k, &e), 0);
	ap_redis_get_counts(r, &n);
	ck_assert_uint_eq(n.verify_failures, 3);
	ck_assert_uint_eq(n.hits, 0);
	ck_assert_uint_eq(n.failures, 0);      /* Redis itself is fine */
	ap_redis_get_counts(stranger, &n);
	ck_assert_uint_eq(n.verify_failures, 1);
	/* writing it again repairs it */
	ck_assert_int_eq(ap_redis_put(r, AP_REDIS_KERNEL, k, 1, parts, lens), 0);
	ck_assert_int_eq(ap_redis_get(r, AP_REDIS_KERNEL, k, &e), 1);
	ap_redis_entry_clear(&e);
	ap_redis_free(stranger);
	ap_redis_free(r);
}
END_TEST

/* Values over max_value_bytes: not written; a longer reply is refused as
 * it arrives (its announced length), the connection dropped. */
START_TEST(value_limit)
{
	ap_redis *big = client(secret, sizeof(secret) - 1, 1 << 20, 100);
	ap_redis *small = client(secret, sizeof(secret) - 1, 4096, 100);
	uint8_t *blob = calloc(1, 65536), k[32];
	const uint8_t *parts[1] = { blob };
	size_t lens[1] = { 65536 };
	ap_redis_entry e;
	ap_redis_counts n;

	key_of("big", k);
	ck_assert_int_eq(ap_redis_put(small, AP_REDIS_KERNEL, k, 1, parts, lens), AP_ETOOLARGE);
	ck_assert_int_eq(ap_redis_put(big, AP_REDIS_KERNEL, k, 1, parts, lens), 0);
	ck_assert_int_eq(ap_redis_get(big, AP_REDIS_KERNEL, k, &e), 1);
	ap_redis_entry_clear(&e);
	ck_assert_int_eq(ap_redis_get(small, AP_REDIS_KERNEL, k, &e), 0);
	ap_redis_get_counts(small, &n);
	ck_assert_uint_eq(n.failures, 1);   /* the connection was dropped */
	ck_assert_uint_eq(n.bytes_read, 0);
	free(blob);
	ap_redis_free(small);
	ap_redis_free(big);
}
END_TEST

/* A server that announces a 1 GiB reply and then sends bytes forever. */
static void *liar_main(void *arg)
{
	int lfd = *(int *)arg, fd = accept(lfd, NULL, NULL);
	char buf[4096], chunk[65536];

	if (fd < 0)
		return NULL;
	memset(chunk, 'x', sizeof(chunk));
	if (read(fd, buf, sizeof(buf)) > 0 && write(fd, "$1073741824\r\n", 13) == 13)
		for (int i = 0; i < 64 && send(fd, chunk, sizeof(chunk), MSG_NOSIGNAL) > 0; i++)
			;
	close(fd);
	return NULL;
}

START_TEST(announced_length_checked_first)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	ap_redis *r;
	pthread_t th;
	uint8_t k[32];
	ap_redis_entry e;
	ap_redis_counts n;

	redis_stop();   /* the liar takes the socket */
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(listen(lfd, 4), 0);
	pthread_create(&th, NULL, liar_main, &lfd);
	r = client(secret, sizeof(secret) - 1, 1 << 20, 100);
	key_of("anything", k);
	ck_assert_int_eq(ap_redis_get(r, AP_REDIS_KERNEL, k, &e), 0);
	ap_redis_get_counts(r, &n);
	ck_assert_uint_eq(n.failures, 1);
	ck_assert_uint_eq(n.bytes_read, 0);
	ap_redis_free(r);
	pthread_join(th, NULL);
	close(lfd);
	unlink(sock);
}
END_TEST

/* Memory figures cannot be asserted under AddressSanitizer (shadow
 * memory, quarantine, its own allocator). */
#if defined(__SANITIZE_ADDRESS__)
#define MEMORY_FIGURES 0
#else
#define MEMORY_FIGURES 1
#endif

/* This process's peak resident memory (VmHWM), KiB. */
static long long peak_kb(void)
{
	char line[256];
	long long v = -1;
	FILE *f = fopen("/proc/self/status", "r");

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmHWM:", 6))
			v = atoll(line + 6);
	fclose(f);
	ck_assert_int_ge(v, 0);
	return v;
}

/* A server standing in for a Redis someone else controls: answers the
 * first command with an array of `n` items, each the RESP bytes `item`
 * (`len` of them), sent until the client goes away. */
struct flood {
	int lfd;
	unsigned n;
	const char *item;
	size_t len;
};

static void *flood_main(void *arg)
{
	const struct flood *f = arg;
	int fd = accept(f->lfd, NULL, NULL);
	char buf[4096], head[32];
	int hl;

	if (fd < 0)
		return NULL;
	hl = snprintf(head, sizeof(head), "*%u\r\n", f->n);
	if (read(fd, buf, sizeof(buf)) > 0 && send(fd, head, (size_t)hl, MSG_NOSIGNAL) == hl)
		for (unsigned i = 0; i < f->n; i++) {
			size_t off = 0;
			ssize_t w = 0;

			while (off < f->len && (w = send(fd, f->item + off, f->len - off,
							 MSG_NOSIGNAL)) > 0)
				off += (size_t)w;
			if (w <= 0)
				break;
		}
	close(fd);
	return NULL;
}

/* Issue 29, item 7: redis_max_value_bytes bounded each bulk string, not
 * the reply: an array of 2,000 x 1 MiB strings took apollod to 1.9 GB
 * with a 2 MiB limit.  A reply is now refused as soon as its parts pass
 * max_value_bytes + 64 KiB, or 1,024 elements, in all: a miss, a failure
 * for the breaker (here it opens at one), the connection dropped, the
 * peak memory bounded; afterwards a real Redis serves entries as large as
 * the limit allows through the same client. */
START_TEST(reply_bounded_in_all)
{
	const size_t max_value = 2 << 20, mib = 1 << 20;
	char *big = malloc(16 + mib + 2);
	int hl = snprintf(big, 16, "$%zu\r\n", mib);
	struct {
		const char *what;
		struct flood f;
	} cases[] = {
		{ "2,000 strings of 1 MiB", { -1, 2000, big, (size_t)hl + mib + 2 } },
		{ "1,000 strings of 1 MiB", { -1, 1000, big, (size_t)hl + mib + 2 } },
		{ "100,000 integers", { -1, 100000, ":1\r\n", 4 } },
	};
	ap_redis *r = NULL;
	uint8_t k[32], *blob;
	const uint8_t *parts[1];
	size_t lens[1];
	ap_redis_entry e;
	ap_redis_counts n;

	memset(big + hl, 'x', mib);
	memcpy(big + hl + mib, "\r\n", 2);
	key_of("anything", k);
	redis_stop();   /* the flood takes the socket */
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		pthread_t th;
		long long hwm0, hwm1;

		cases[c].f.lfd = socket(AF_UNIX, SOCK_STREAM, 0);
		snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
		ck_assert_int_eq(bind(cases[c].f.lfd, (struct sockaddr *)&a, sizeof(a)), 0);
		ck_assert_int_eq(listen(cases[c].f.lfd, 4), 0);
		pthread_create(&th, NULL, flood_main, &cases[c].f);
		ap_redis_free(r);
		r = client(secret, sizeof(secret) - 1, max_value, 1);
		hwm0 = peak_kb();
		ck_assert_int_eq(ap_redis_get(r, AP_REDIS_ACTION, k, &e), 0);
		hwm1 = peak_kb();
		pthread_join(th, NULL);
		close(cases[c].f.lfd);
		unlink(sock);
		printf("reply_bounded_in_all: %s: refused, VmHWM +%lld KiB\n", cases[c].what,
		       hwm1 - hwm0);
		fflush(stdout);
		ap_redis_get_counts(r, &n);
		ck_assert_uint_eq(n.gets, 1);
		ck_assert_uint_eq(n.misses, 1);
		ck_assert_uint_eq(n.refused, 1);
		ck_assert_uint_eq(n.failures, 1);       /* once: not asked again */
		ck_assert_uint_eq(n.bytes_read, 0);
		ck_assert_int_eq(n.state, AP_REDIS_OPEN);
		ck_assert_uint_eq(n.opens, 1);
		ck_assert_ptr_null(e.buf);
		if (MEMORY_FIGURES)
			ck_assert_msg(hwm1 - hwm0 < 16 * 1024, "%s: the reply took %lld MiB",
				      cases[c].what, (hwm1 - hwm0) >> 10);
	}
	free(big);

	/* a real Redis again: once the breaker's time is up, entries up to the
	 * limit travel through the same client */
	redis_start();
	usleep(350 * 1000);
	blob = malloc(max_value - 1024);
	memset(blob, 'b', max_value - 1024);
	parts[0] = blob;
	lens[0] = max_value - 1024;
	ck_assert_int_eq(ap_redis_put(r, AP_REDIS_ACTION, k, 1, parts, lens), 0);
	ck_assert_int_eq(ap_redis_get(r, AP_REDIS_ACTION, k, &e), 1);
	ck_assert_int_eq(e.n, 1);
	ck_assert_uint_eq(e.part_len[0], max_value - 1024);
	ck_assert_int_eq(memcmp(e.part[0], blob, max_value - 1024), 0);
	ap_redis_entry_clear(&e);
	ap_redis_get_counts(r, &n);
	ck_assert_int_eq(n.state, AP_REDIS_CLOSED);
	ck_assert_uint_eq(n.refused, 1);
	ck_assert_uint_eq(n.hits, 1);
	free(blob);
	ap_redis_free(r);
}
END_TEST

/* Redis gone: failures open the breaker, which then sends nothing; once
 * Redis is back the half-open probe closes it. */
START_TEST(breaker)
{
	ap_redis *r = client(secret, sizeof(secret) - 1, 1 << 20, 2);
	const uint8_t *parts[1] = { (const uint8_t *)"blob" };
	size_t lens[1] = { 4 };
	uint8_t k[32];
	ap_redis_entry e;
	ap_redis_counts n;
	double t;

	key_of("k", k);
	ck_assert_int_eq(ap_redis_put(r, AP_REDIS_KERNEL, k, 1, parts, lens), 0);
	redis_stop();
	ck_assert_int_eq(ap_redis_get(r, AP_REDIS_KERNEL, k, &e), 0);   /* pooled: dropped */
	ap_redis_get_counts(r, &n);
	ck_assert_int_eq(n.state, AP_REDIS_CLOSED);
	ck_assert_int_eq(ap_redis_get(r, AP_REDIS_KERNEL, k, &e), 0);   /* cannot connect */
	ap_redis_get_counts(r, &n);
	ck_assert_int_eq(n.state, AP_REDIS_OPEN);
	ck_assert_uint_eq(n.failures, 2);
	ck_assert_uint_eq(n.opens, 1);
	t = ap_now_ms();
	for (int i = 0; i < 100; i++)
		ck_assert_int_eq(ap_redis_get(r, AP_REDIS_KERNEL, k, &e), 0);
	ck_assert_int_eq(ap_redis_put(r, AP_REDIS_KERNEL, k, 1, parts, lens), AP_EBUSY);
	ck_assert_double_lt(ap_now_ms() - t, 250);   /* nothing was tried */
	ap_redis_get_counts(r, &n);
	ck_assert_uint_eq(n.skipped, 101);
	ck_assert_uint_eq(n.failures, 2);

	usleep(350 * 1000);   /* open_ms 300: the next call probes, fails, opens again */
	ck_assert_int_eq(ap_redis_get(r, AP_REDIS_KERNEL, k, &e), 0);
	ap_redis_get_counts(r, &n);
	ck_assert_int_eq(n.state, AP_REDIS_OPEN);
	ck_assert_uint_eq(n.opens, 2);

	redis_start();   /* empty: the entry is gone with the process */
	usleep(350 * 1000);
	ck_assert_int_eq(ap_redis_put(r, AP_REDIS_KERNEL, k, 1, parts, lens), 0);
	ap_redis_get_counts(r, &n);
	ck_assert_int_eq(n.state, AP_REDIS_CLOSED);
	ck_assert_int_eq(ap_redis_get(r, AP_REDIS_KERNEL, k, &e), 1);
	ap_redis_entry_clear(&e);
	ap_redis_free(r);
}
END_TEST

START_TEST(secret_files)
{
	char path[128];
	uint8_t *s = NULL;
	size_t len = 0;
	ap_error err;
	FILE *f;
	ap_redis *r = NULL;
	ap_redis_options o = { .addr = "127.0.0.1:6379", .secret = (const uint8_t *)"short",
			       .secret_len = 5 };

	snprintf(path, sizeof(path), "%s/secret", dir);
	f = fopen(path, "w");
	fputs("0123456789abcdef0123\n", f);
	fclose(f);
	chmod(path, 0644);
	ck_assert_int_eq(ap_redis_read_secret_file(path, true, &s, &len, &err), AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "chmod 600"));
	chmod(path, 0600);
	ck_assert_int_eq(ap_redis_read_secret_file(path, true, &s, &len, &err), 0);
	ck_assert_uint_eq(len, 20);   /* without the newline */
	ck_assert_int_eq(memcmp(s, "0123456789abcdef0123", 20), 0);
	free(s);
	ck_assert_int_eq(ap_redis_read_secret_file("/nonexistent/x", true, &s, &len, &err), AP_EIO);
	/* a short secret, a bad address, a bad namespace */
	ck_assert_int_eq(ap_redis_new(&o, &r, &err), AP_EINVAL);
	o.secret = secret;
	o.secret_len = sizeof(secret) - 1;
	o.addr = "nohostport";
	ck_assert_int_eq(ap_redis_new(&o, &r, &err), AP_EINVAL);
	o.addr = "[::1]:6379";
	o.ns = "a:b";
	ck_assert_int_eq(ap_redis_new(&o, &r, &err), AP_EINVAL);
	o.ns = "ok";
	ck_assert_int_eq(ap_redis_new(&o, &r, &err), 0);
	ap_redis_free(r);
}
END_TEST


/* relu(A[256,128] x B[128,512]): one GEMM kernel the tuner searches
 * (which 0); beside it a second
 * output exp(C[64,64]) (which 1; which 2: the same, but the output tensor
 * named otherwise): three graphs (three graph keys, three request leases)
 * that share the GEMM kernel, the last two the exp one too. */
static Apollo__Graph *kernels_pb(int which)
{
	ap_graph *g = ap_graph_new(which ? "mm_and_more" : "mm");
	int a = ap_graph_add_tensor(g, "a", AP_DT_F32, 2, (const int64_t[]){256, 128},
				    AP_TENSOR_INPUT, NULL, 0);
	int b = ap_graph_add_tensor(g, "b", AP_DT_F32, 2, (const int64_t[]){128, 512},
				    AP_TENSOR_INPUT, NULL, 0);
	int y = ap_graph_add_tensor(g, "y", AP_DT_F32, 2, (const int64_t[]){256, 512},
				    AP_TENSOR_VALUE, NULL, 0);
	int r = ap_graph_add_tensor(g, "r", AP_DT_F32, 2, (const int64_t[]){256, 512},
				    AP_TENSOR_VALUE, NULL, 0);
	Apollo__Graph *pb;
	ap_error err;

	ap_graph_add_input(g, a);
	ap_graph_add_input(g, b);
	ap_graph_add_node(g, "mm", AP_OP_MATMUL, 2, (int[]){a, b}, 1, &y);
	ap_graph_add_node(g, "relu", AP_OP_RELU, 1, (int[]){y}, 1, &r);
	ap_graph_add_output(g, r);
	if (which) {
		int c = ap_graph_add_tensor(g, "c", AP_DT_F32, 2, (const int64_t[]){64, 64},
					    AP_TENSOR_INPUT, NULL, 0);
		int e = ap_graph_add_tensor(g, which == 1 ? "e" : "e2", AP_DT_F32, 2,
					    (const int64_t[]){64, 64}, AP_TENSOR_VALUE, NULL, 0);

		ap_graph_add_input(g, c);
		ap_graph_add_node(g, "exp", AP_OP_EXP, 1, (int[]){c}, 1, &e);
		ap_graph_add_output(g, e);
	}
	ck_assert_msg(ap_graph_validate(g, &err) == 0, "%s", err.msg);
	pb = ap_graph_to_pb(g);
	ck_assert_ptr_nonnull(pb);
	ap_graph_free(g);
	return pb;
}

/* Builds pb for sm_90 on c (no backend): the program's tuning counts and
 * its GEMM part's signature and schedule. */
static void build_on(ap_compiler *c, Apollo__Graph *pb, unsigned *hits, unsigned *measured,
		     unsigned *searched, uint8_t sig[32], char *sched, size_t cap)
{
	Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;
	ap_graph *g;
	ap_program *p;
	ap_error err;

	Apollo__DeviceInfo dev = APOLLO__DEVICE_INFO__INIT;

	dev.name = "Some GPU";
	dev.sm_count = 132;
	req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
	req.graph = pb;
	req.target = "sm_90";
	req.device = &dev;
	ck_assert_msg(ap_compiler_build_program(c, &req, &g, &p, &err) == 0, "%s", err.msg);
	*hits = p->tune_hits;
	*measured = p->tune_measured;
	*searched = p->tune_searched;
	sched[0] = '\0';
	for (int l = 0; l < p->n_launches; l++)
		if (p->launches[l].parts[0].tuned) {
			memcpy(sig, p->launches[l].parts[0].tune_sig, 32);
			snprintf(sched, cap, "%s", p->launches[l].parts[0].schedule);
		}
	ck_assert_msg(sched[0], "no tuned launch");
	ap_program_free(p);
	ap_graph_free(g);
}

static ap_cache *cache_at(const char *name)
{
	char path[160];
	ap_cache *c;
	ap_error err;

	snprintf(path, sizeof(path), "%s/%s.db", dir, name);
	ck_assert_msg(ap_cache_open(path, &c, &err) == 0, "%s", err.msg);
	return c;
}

START_TEST(tuning_records_shared)
{
	ap_redis *r = client(secret, sizeof(secret) - 1, 1 << 20, 3);
	ap_cache *ca = cache_at("a"), *cb = cache_at("b"), *cc = cache_at("c");
	ap_compiler_options o = { .threads = 1, .redis = r };
	ap_compiler *a = ap_compiler_new(ca, &o), *b = ap_compiler_new(cb, &o);
	ap_compiler *c = ap_compiler_new(cc, &o);
	Apollo__Graph *pb = kernels_pb(0);
	unsigned hits, meas, searched, records = 0, pending = 0;
	uint8_t sig[32], sig_b[32];
	char sched[256], sched_b[256], other[256] = "", *tok, *save = NULL;
	ap_tune_record rec;
	uint64_t gen = 0;
	ap_error err;

	/* node a searches the kernel and publishes the record */
	build_on(a, pb, &hits, &meas, &searched, sig, sched, sizeof(sched));
	ck_assert_uint_eq(searched, 1);
	/* node b has no record of its own: it takes a's, searching nothing */
	ck_assert_int_eq(ap_cache_tuning_get(cb, sig, "sm_90", NULL, &rec), 0);
	build_on(b, pb, &hits, &meas, &searched, sig_b, sched_b, sizeof(sched_b));
	ck_assert_uint_eq(searched, 0);
	ck_assert_uint_eq(hits, 1);
	ck_assert_mem_eq(sig, sig_b, 32);
	ck_assert_str_eq(sched, sched_b);
	ck_assert_int_eq(ap_cache_tuning_get(cb, sig, "sm_90", "", &rec), 1);   /* copied into L1 */
	{
		ap_tiers_counts tc;

		ap_tiers_get_counts(ap_compiler_tiers(b), AP_TIER_TUNING, &tc);
		ck_assert_uint_eq(tc.l2_hits, 1);
		ck_assert_uint_eq(tc.copied, 1);
	}

	/* a client measures another candidate on node a; node b builds it */
	ck_assert_int_eq(ap_cache_tuning_get(ca, sig, "sm_90", "", &rec), 1);
	for (tok = strtok_r(rec.candidates, ";", &save); tok; tok = strtok_r(NULL, ";", &save))
		if (strcmp(tok, rec.config)) {
			snprintf(other, sizeof(other), "%s", tok);
			break;
		}
	ck_assert_msg(other[0], "one candidate only: %s", rec.candidates);
	{
		Apollo__TuneReport rep = APOLLO__TUNE_REPORT__INIT;
		Apollo__TuneMeasurement m = APOLLO__TUNE_MEASUREMENT__INIT, *pm = &m;

		m.signature.data = sig;
		m.signature.len = 32;
		m.schedule = other;
		m.time_us = 12.5;
		m.runs = 20;
		rep.target = "sm_90";
		rep.device = "Some GPU";
		rep.sm_count = 132;
		rep.n_measurements = 1;
		rep.measurements = &pm;
		/* a client's report alone is pending until a second client
		 * agrees; the daemon's own tuner is trusted alone */
		ck_assert_int_eq(ap_compiler_tune_report(a, "uid:1000", &rep, &records, &pending, &gen,
							 &err), AP_EINVAL);   /* never named the device */
		ck_assert_msg(ap_compiler_tune_report(a, "apollod", &rep, &records, &pending, &gen,
						      &err) == 0, "%s", err.msg);
		ck_assert_uint_eq(records, 1);
		ck_assert_uint_eq(pending, 0);
	}
	build_on(b, pb, &hits, &meas, &searched, sig_b, sched_b, sizeof(sched_b));
	ck_assert_uint_eq(meas, 1);
	ck_assert_str_eq(sched_b, other);
	ck_assert_int_eq(ap_cache_tuning_get(cb, sig, "sm_90", "Some GPU|132", &rec), 1);
	ck_assert_double_eq(rec.measured_us, 12.5);
	ck_assert_uint_eq(rec.sms, 132);
	ck_assert_uint_gt(ap_cache_tuning_generation(cb), 0);   /* b's bundles of before retire */

	/* a signed but malformed record (its numbers part missing) is ignored:
	 * node c searches for itself */
	{
		uint8_t k2[32];
		const uint8_t *parts[1] = { (const uint8_t *)"gemm" };
		size_t lens[1] = { 4 };
		ap_sha256_ctx *h;
		static const char tag[] = "apollo tuning record v2";

		for (int m = 0; m < 2; m++) {
			h = ap_sha256_new();
			ap_sha256_update(h, tag, sizeof(tag));
			ap_sha256_update(h, sig, 32);
			ap_sha256_update(h, "sm_90", 6);
			ap_sha256_update(h, m ? "m" : "c", 1);
			if (m)
				ap_sha256_update(h, "Some GPU|132", 13);
			ap_sha256_final(h, k2);
			ck_assert_int_eq(ap_redis_put(r, AP_REDIS_TUNING, k2, 1, parts, lens), 0);
		}
	}
	build_on(c, pb, &hits, &meas, &searched, sig_b, sched_b, sizeof(sched_b));
	ck_assert_uint_eq(hits, 0);
	ck_assert_uint_eq(searched, 1);
	{
		ap_tiers_counts tc;

		ap_tiers_get_counts(ap_compiler_tiers(c), AP_TIER_TUNING, &tc);
		ck_assert_uint_ge(tc.refused, 1);
		ck_assert_uint_eq(tc.l2_hits, 0);
	}

	ap_graph_pb_free(pb);
	ap_compiler_free(a);
	ap_compiler_free(b);
	ap_compiler_free(c);
	ap_cache_free(ca);
	ap_cache_free(cb);
	ap_cache_free(cc);
	ap_redis_free(r);
}
END_TEST

/* A check of ap_tiers_action_get that takes a bundle and keeps its first
 * blob (user: bool, whether to take it). */
static bool take_first(void *user, int tier, const ap_tier_action *a)
{
	(void)tier;
	if (!*(bool *)user)
		return false;
	if (a->n_blobs > 0)
		a->keep[0] = true;
	return true;
}

/* The tiered read-through itself (cache/tiers.h), each kind: node b writes
 * through (its L1 and L2); node a, whose L1 is empty, reads through: a miss
 * in L1 served from L2 is copied into L1 and counted as an L2 hit, the
 * next read an L1 hit; an entry whose signature fails (redis.c counts it)
 * and a signed entry its kind refuses (a blob not matching its digest, a
 * bundle its check turns down) are misses, counted, and leave L1 as it
 * was. */
START_TEST(tiers_read_through)
{
	ap_redis *r = client(secret, sizeof(secret) - 1, 1 << 20, 3);
	ap_cache *ca = cache_at("ta"), *cb = cache_at("tb");
	ap_tiers *a = ap_tiers_new(ca, r), *b = ap_tiers_new(cb, r);
	static const uint8_t blob[] = "a kernel's compiled bytes", other[] = "other bytes";
	uint8_t k[32], k2[32], k3[32], d[32], d3[32], ak[32], ak2[32], *data = NULL, dg[32];
	const uint8_t *blobs[1] = { blob };
	size_t blens[1] = { sizeof(blob) }, len = 0;
	char ks[200], out[200], cmd[400];
	ap_tiers_counts n;
	ap_cache_counts cc0, cc1;
	ap_redis_counts rn0, rn1;
	ap_tune_record rec = { .emitter = "gemm", .config = "bm=64 bn=64", .method = "exhaustive",
			       .modelled_us = 3.5, .measured_us = -1, .tried = 12 }, got;
	bool take = true, copied = false;

	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_str_eq(ap_tiers_policy(AP_TIER_KERNEL)->name, "kernel");
	ck_assert(!ap_tiers_policy(AP_TIER_BLOB)->put_l1);
	key_of("tiered kernel", k);
	ap_sha256(blob, sizeof(blob), d);

	/* kernels: written through by b, read through by a */
	ck_assert_int_eq(ap_tiers_blob_put(b, blob, sizeof(blob), d), 0);
	ck_assert_int_eq(ap_tiers_kernel_put(b, k, 0, blob, sizeof(blob), d), 0);
	ck_assert_int_eq(ap_cache_kernel_get(ca, k, &data, &len, dg), 0);
	ck_assert_int_eq(ap_tiers_kernel_get(a, k, AP_TIERS_L1_ONLY, &data, &len, dg), AP_TIER_MISS);
	ck_assert_int_eq(ap_tiers_kernel_get(a, k, 0, &data, &len, dg), AP_TIER_L2);
	ck_assert_uint_eq(len, sizeof(blob));
	ck_assert_mem_eq(data, blob, len);
	ck_assert_mem_eq(dg, d, 32);
	free(data);
	data = NULL;
	ap_tiers_get_counts(a, AP_TIER_KERNEL, &n);
	ck_assert_uint_eq(n.l2_hits, 1);
	ck_assert_uint_eq(n.copied, 1);
	ck_assert_uint_eq(n.l1_hits, 0);
	ck_assert_uint_eq(n.misses, 1);
	ck_assert_int_eq(ap_cache_kernel_get(ca, k, &data, &len, dg), 1);   /* copied into L1 */
	free(data);
	data = NULL;
	ck_assert_int_eq(ap_tiers_kernel_get(a, k, 0, &data, &len, dg), AP_TIER_L1);
	free(data);
	data = NULL;
	ap_tiers_get_counts(a, AP_TIER_KERNEL, &n);
	ck_assert_uint_eq(n.l1_hits, 1);

	/* an entry altered in Redis: its signature fails, a miss, L1 untouched */
	key_of("tiered kernel two", k2);
	ck_assert_int_eq(ap_tiers_kernel_put(b, k2, 0, blob, sizeof(blob), d), 0);
	ap_redis_key_string(r, AP_REDIS_KERNEL, k2, ks, sizeof(ks));
	snprintf(cmd, sizeof(cmd), "SETRANGE %s 40 X", ks);
	cli(out, sizeof(out), cmd);
	ap_redis_get_counts(r, &rn0);
	ap_cache_get_counts(ca, &cc0);
	ck_assert_int_eq(ap_tiers_kernel_get(a, k2, 0, &data, &len, dg), AP_TIER_MISS);
	ck_assert_ptr_null(data);
	ap_redis_get_counts(r, &rn1);
	ck_assert_uint_eq(rn1.verify_failures, rn0.verify_failures + 1);
	ap_cache_get_counts(ca, &cc1);
	ck_assert_uint_eq(cc1.kernels, cc0.kernels);
	ck_assert_uint_eq(cc1.blobs, cc0.blobs);
	ck_assert_int_eq(ap_cache_kernel_get(ca, k2, &data, &len, dg), 0);

	/* a signed entry naming a blob whose bytes do not match its digest:
	 * refused by the blob's codec, counted, nothing copied */
	key_of("tiered kernel three", k3);
	key_of("not the digest of other", d3);
	{
		const uint8_t *p[1] = { d3 }, *q[1] = { other };
		size_t pl[1] = { 32 }, ql[1] = { sizeof(other) };

		ck_assert_int_eq(ap_redis_put(r, AP_REDIS_KERNEL, k3, 1, p, pl), 0);
		ck_assert_int_eq(ap_redis_put(r, AP_REDIS_BLOB, d3, 1, q, ql), 0);
	}
	ck_assert_int_eq(ap_tiers_kernel_get(a, k3, 0, &data, &len, dg), AP_TIER_MISS);
	ck_assert_ptr_null(data);
	ap_tiers_get_counts(a, AP_TIER_BLOB, &n);
	ck_assert_uint_eq(n.refused, 1);
	ap_tiers_get_counts(a, AP_TIER_KERNEL, &n);
	ck_assert_uint_eq(n.refused, 1);
	ck_assert_uint_eq(n.l2_hits, 1);
	ap_cache_get_counts(ca, &cc1);
	ck_assert_uint_eq(cc1.kernels, cc0.kernels);
	ck_assert_uint_eq(cc1.blobs, cc0.blobs);
	ck_assert_int_eq(ap_cache_blob_get(ca, d3, &data, &len), 0);

	/* actions: the bundle and its blob, copied into L1 once taken */
	key_of("tiered action", ak);
	ck_assert_int_eq(ap_tiers_action_put(b, ak, 0, (const uint8_t *)"bundle", 6, 1, blobs, blens),
			 0);
	take = false;   /* refused by its check: nothing copied */
	ck_assert_int_eq(ap_tiers_action_get(a, ak, 0, take_first, &take, &copied), AP_TIER_MISS);
	ck_assert(!copied);
	ck_assert_int_eq(ap_cache_get(ca, ak, &data, &len), 0);
	ap_tiers_get_counts(a, AP_TIER_ACTION, &n);
	ck_assert_uint_eq(n.refused, 1);
	take = true;
	ck_assert_int_eq(ap_tiers_action_get(a, ak, AP_TIERS_L1_ONLY, take_first, &take, &copied),
			 AP_TIER_MISS);
	ck_assert_int_eq(ap_tiers_action_get(a, ak, 0, take_first, &take, &copied), AP_TIER_L2);
	ck_assert(copied);
	ck_assert_int_eq(ap_cache_get(ca, ak, &data, &len), 1);
	ck_assert_uint_eq(len, 6);
	ck_assert_mem_eq(data, "bundle", 6);
	free(data);
	data = NULL;
	ck_assert_int_eq(ap_cache_blob_get(ca, d, &data, &len), 1);
	free(data);
	data = NULL;
	ck_assert_int_eq(ap_tiers_action_get(a, ak, 0, take_first, &take, &copied), AP_TIER_L1);
	ap_tiers_get_counts(a, AP_TIER_ACTION, &n);
	ck_assert_uint_eq(n.l2_hits, 1);
	ck_assert_uint_eq(n.l1_hits, 1);
	/* L1 only: written to L1, not to L2 */
	key_of("tiered action two", ak2);
	ck_assert_int_eq(ap_tiers_action_put(b, ak2, AP_TIERS_L1_ONLY, (const uint8_t *)"b2", 2, 0,
					     NULL, NULL), 0);
	ck_assert_int_eq(ap_tiers_action_get(a, ak2, 0, take_first, &take, &copied), AP_TIER_MISS);

	/* tuning records (server/tune/records.h): b's model record reaches a */
	key_of("a kernel signature", k);
	ck_assert_int_eq(ap_tune_records_put(b, k, "sm_90", &rec), 0);
	ck_assert_int_eq(ap_cache_tuning_get(ca, k, "sm_90", "", &got), 0);
	ck_assert_int_eq(ap_tune_records_get(a, k, "sm_90", "Some GPU|132", false, &got), 1);
	ck_assert_str_eq(got.config, rec.config);
	ck_assert_double_eq(got.modelled_us, 3.5);
	ap_tiers_get_counts(a, AP_TIER_TUNING, &n);
	ck_assert_uint_eq(n.l2_hits, 1);   /* the model's; the device's measured one missed */
	ck_assert_uint_eq(n.misses, 1);
	ck_assert_uint_eq(n.copied, 1);
	ck_assert_int_eq(ap_cache_tuning_get(ca, k, "sm_90", "", &got), 1);
	ck_assert_int_eq(ap_tune_records_get(a, k, "sm_90", NULL, false, &got), 1);
	ap_tiers_get_counts(a, AP_TIER_TUNING, &n);
	ck_assert_uint_eq(n.l1_hits, 1);

	/* no L2: reads stop at L1, writes go to L1 alone */
	{
		ap_tiers *solo = ap_tiers_new(ca, NULL);

		key_of("tiered action", ak);
		ck_assert_int_eq(ap_tiers_action_get(solo, ak, 0, take_first, &take, &copied),
				 AP_TIER_L1);
		ck_assert_int_eq(ap_tiers_kernel_get(solo, k3, 0, &data, &len, dg), AP_TIER_MISS);
		ap_tiers_free(solo);
	}

	ap_tiers_free(a);
	ap_tiers_free(b);
	ap_cache_free(ca);
	ap_cache_free(cb);
	ap_redis_free(r);
}
END_TEST

/* ---- cluster leases ------------------------------------------------------------ */

/* The lease's remaining lifetime, ms (redis-cli PTTL). */
static long pttl(ap_redis *r, const uint8_t k[32])
{
	char ks[200], cmd[300], out[64];

	ap_redis_lease_key_string(r, AP_REDIS_ACTION, k, ks, sizeof(ks));
	snprintf(cmd, sizeof(cmd), "PTTL %s", ks);
	cli(out, sizeof(out), cmd);
	return atol(out);
}

START_TEST(lease_by_token)
{
	ap_redis *a = client(secret, sizeof(secret) - 1, 1 << 20, 3);
	ap_redis *b = client(secret, sizeof(secret) - 1, 1 << 20, 3);
	ap_redis_lease la, lb;
	char ks[200], es[200], tok[AP_REDIS_TOKEN_CHARS + 1];
	uint8_t k[32];
	ap_redis_entry e;

	key_of("cold graph", k);
	ap_redis_lease_key_string(a, AP_REDIS_ACTION, k, ks, sizeof(ks));
	ap_redis_key_string(a, AP_REDIS_ACTION, k, es, sizeof(es));
	ck_assert_int_eq(strncmp(ks, "t:s5.1:lease:a:", 15), 0);
	ck_assert_str_eq(ks + 15, es + 9);   /* the entry's key hex, under another kind */
	ck_assert_int_eq(ap_redis_lease_holder(a, AP_REDIS_ACTION, k, tok), 0);
	ck_assert_int_eq(ap_redis_lease_take(a, AP_REDIS_ACTION, k, 0, &la), AP_EINVAL);

	/* taken by a, refused to b */
	ck_assert_int_eq(ap_redis_lease_take(a, AP_REDIS_ACTION, k, 2000, &la), 1);
	ck_assert_uint_eq(strlen(la.token), AP_REDIS_TOKEN_CHARS);
	ck_assert_int_gt(pttl(a, k), 1000);
	ck_assert_int_le(pttl(a, k), 2000);
	ck_assert_int_eq(ap_redis_lease_take(b, AP_REDIS_ACTION, k, 2000, &lb), 0);
	ck_assert_str_ne(la.token, lb.token);
	ck_assert_int_eq(ap_redis_lease_holder(b, AP_REDIS_ACTION, k, tok), 1);
	ck_assert_str_eq(tok, la.token);
	/* a lease is not an entry: the lookup of the same key misses */
	ck_assert_int_eq(ap_redis_get(a, AP_REDIS_ACTION, k, &e), 0);

	/* renewed only by its token */
	ck_assert_int_eq(ap_redis_lease_renew(b, &lb, 60000), 0);
	ck_assert_int_le(pttl(a, k), 2000);
	ck_assert_int_eq(ap_redis_lease_renew(a, &la, 60000), 1);
	ck_assert_int_gt(pttl(a, k), 50000);

	/* released only by its token */
	ck_assert_int_eq(ap_redis_lease_release(b, &lb), 0);
	ck_assert_int_eq(ap_redis_lease_holder(b, AP_REDIS_ACTION, k, tok), 1);
	ck_assert_str_eq(tok, la.token);
	ck_assert_int_eq(ap_redis_lease_release(a, &la), 1);
	ck_assert_int_eq(ap_redis_lease_holder(b, AP_REDIS_ACTION, k, tok), 0);
	ck_assert_int_eq(ap_redis_lease_release(a, &la), 0);
	/* free again: b takes it */
	ck_assert_int_eq(ap_redis_lease_take(b, AP_REDIS_ACTION, k, 2000, &lb), 1);
	ap_redis_free(a);
	ap_redis_free(b);
}
END_TEST

/* A holder that stops renewing (killed) lets its lease lapse after the
 * ttl; another takes it; the old token then neither renews nor releases
 * the new holder's lease. */
START_TEST(lease_lapse_take_over)
{
	ap_redis *a = client(secret, sizeof(secret) - 1, 1 << 20, 3);
	ap_redis *b = client(secret, sizeof(secret) - 1, 1 << 20, 3);
	ap_redis_lease la, lb;
	char tok[AP_REDIS_TOKEN_CHARS + 1];
	uint8_t k[32];

	key_of("lapsing", k);
	ck_assert_int_eq(ap_redis_lease_take(a, AP_REDIS_ACTION, k, 200, &la), 1);
	ck_assert_int_eq(ap_redis_lease_take(b, AP_REDIS_ACTION, k, 200, &lb), 0);
	usleep(300 * 1000);
	ck_assert_int_eq(ap_redis_lease_holder(b, AP_REDIS_ACTION, k, tok), 0);
	ck_assert_int_eq(ap_redis_lease_take(b, AP_REDIS_ACTION, k, 5000, &lb), 1);
	ck_assert_int_eq(ap_redis_lease_renew(a, &la, 5000), 0);
	ck_assert_int_eq(ap_redis_lease_release(a, &la), 0);
	ck_assert_int_eq(ap_redis_lease_holder(a, AP_REDIS_ACTION, k, tok), 1);
	ck_assert_str_eq(tok, lb.token);
	ap_redis_free(a);
	ap_redis_free(b);
}
END_TEST

/* A claim in a thread of its own, as a second daemon's worker would. */
struct claimer {
	ap_leases *ls;
	ap_redis *r;              /* found(): the action entry of key in r */
	uint8_t key[32];
	double deadline_ms;
	int st;
	ap_lease *held;
	double ms;                /* the claim's duration */
	pthread_t t;
};

static bool entry_found(void *user)
{
	struct claimer *c = user;
	ap_redis_entry e;

	if (ap_redis_get(c->r, AP_REDIS_ACTION, c->key, &e) != 1)
		return false;
	ap_redis_entry_clear(&e);
	return true;
}

static void *claim_main(void *arg)
{
	struct claimer *c = arg;
	double t = ap_now_ms();

	c->st = ap_lease_claim(c->ls, AP_REDIS_ACTION, c->key, c->deadline_ms, NULL, entry_found, c, &c->held);
	c->ms = ap_now_ms() - t;
	return NULL;
}

static void claim_start(struct claimer *c, ap_leases *ls, ap_redis *r, const uint8_t k[32],
			double wait_ms)
{
	memset(c, 0, sizeof(*c));
	c->ls = ls;
	c->r = r;
	memcpy(c->key, k, 32);
	c->deadline_ms = ap_now_ms() + wait_ms;
	ck_assert_int_eq(pthread_create(&c->t, NULL, claim_main, c), 0);
}

/* Daemon A holds (renewed past its ttl); B waits and is answered by A's
 * entry; A releases. */
START_TEST(lease_claim_waits_for_entry)
{
	ap_redis *r = client(secret, sizeof(secret) - 1, 1 << 20, 3);
	ap_leases *la = ap_leases_new(r, 900), *lb = ap_leases_new(r, 900);
	const uint8_t *parts[1] = { (const uint8_t *)"the bundle" };
	size_t lens[1] = { 10 };
	struct claimer a, b;
	ap_lease_counts n;
	char tok[AP_REDIS_TOKEN_CHARS + 1];
	ap_redis_lease probe;
	uint8_t k[32];

	key_of("one compile", k);
	claim_start(&a, la, r, k, 5000);
	pthread_join(a.t, NULL);
	ck_assert_int_eq(a.st, AP_LEASE_HOLD);
	claim_start(&b, lb, r, k, 5000);
	usleep(1500 * 1000);   /* past the ttl: the renewals keep it */
	ck_assert_int_eq(ap_redis_lease_take(r, AP_REDIS_ACTION, k, 300, &probe), 0);
	ck_assert_int_eq(ap_redis_lease_holder(r, AP_REDIS_ACTION, k, tok), 1);
	ap_leases_get_counts(lb, AP_REDIS_ACTION, &n);
	ck_assert_uint_eq(n.waiting, 1);
	ck_assert_int_eq(ap_redis_put(r, AP_REDIS_ACTION, k, 1, parts, lens), 0);
	ap_lease_release(la, a.held);   /* as compile.c: after the entry is stored */
	pthread_join(b.t, NULL);
	ck_assert_int_eq(b.st, AP_LEASE_FOUND);
	ck_assert_ptr_null(b.held);
	ck_assert_int_eq(ap_redis_lease_holder(r, AP_REDIS_ACTION, k, tok), 0);
	ap_leases_get_counts(la, AP_REDIS_ACTION, &n);
	ck_assert_uint_eq(n.taken, 1);
	ck_assert_uint_eq(n.waited, 0);
	ck_assert_uint_eq(n.lost, 0);
	ap_leases_get_counts(lb, AP_REDIS_ACTION, &n);
	ck_assert_uint_eq(n.taken, 0);
	ck_assert_uint_eq(n.waited, 1);
	ck_assert_uint_eq(n.lapsed, 0);
	ck_assert_uint_eq(n.waiting, 0);
	ap_leases_free(la);
	ap_leases_free(lb);
	ap_redis_free(r);
}
END_TEST

/* A holder that stops renewing (a SIGKILLed daemon: its lease taken by
 * hand, never renewed): the waiter notices the lapse soon after the ttl
 * and takes the lease over, rather than waiting out its bound. */
START_TEST(lease_claim_takes_over)
{
	ap_redis *r = client(secret, sizeof(secret) - 1, 1 << 20, 3);
	ap_leases *lb = ap_leases_new(r, 1000);
	ap_redis_lease dead;
	struct claimer b;
	ap_lease_counts n;
	char tok[AP_REDIS_TOKEN_CHARS + 1];
	uint8_t k[32];

	key_of("holder killed", k);
	ck_assert_int_eq(ap_redis_lease_take(r, AP_REDIS_ACTION, k, 400, &dead), 1);
	claim_start(&b, lb, r, k, 20000);
	pthread_join(b.t, NULL);
	ck_assert_int_eq(b.st, AP_LEASE_HOLD);
	ck_assert_double_ge(b.ms, 300);
	ck_assert_double_lt(b.ms, 10000);   /* about the ttl, not the 20 s bound */
	ck_assert_int_eq(ap_redis_lease_holder(r, AP_REDIS_ACTION, k, tok), 1);
	ck_assert_str_ne(tok, dead.token);
	ck_assert_int_eq(ap_redis_lease_renew(r, &dead, 1000), 0);
	ap_leases_get_counts(lb, AP_REDIS_ACTION, &n);
	ck_assert_uint_eq(n.waited, 1);
	ck_assert_uint_eq(n.lapsed, 1);
	ck_assert_uint_eq(n.taken, 1);
	ck_assert_uint_eq(n.taken_over, 1);
	ck_assert_uint_eq(n.timeouts, 0);
	ap_lease_release(lb, b.held);
	ck_assert_int_eq(ap_redis_lease_holder(r, AP_REDIS_ACTION, k, tok), 0);
	ap_leases_free(lb);
	ap_redis_free(r);
}
END_TEST

/* A lease held past the waiter's bound: it compiles alone at the bound;
 * without Redis a claim compiles alone at once. */
START_TEST(lease_claim_bounded)
{
	ap_redis *r = client(secret, sizeof(secret) - 1, 1 << 20, 3);
	ap_leases *la = ap_leases_new(r, 3000), *lb = ap_leases_new(r, 3000);
	struct claimer a, b;
	ap_lease_counts n;
	uint8_t k[32];

	key_of("slow compile", k);
	claim_start(&a, la, r, k, 5000);
	pthread_join(a.t, NULL);
	ck_assert_int_eq(a.st, AP_LEASE_HOLD);
	claim_start(&b, lb, r, k, 700);
	pthread_join(b.t, NULL);
	ck_assert_int_eq(b.st, AP_LEASE_ALONE);
	ck_assert_double_ge(b.ms, 650);   /* at the bound (700 ms), not before */
	ap_leases_get_counts(lb, AP_REDIS_ACTION, &n);
	ck_assert_uint_eq(n.waited, 1);
	ck_assert_uint_eq(n.timeouts, 1);
	ck_assert_uint_eq(n.lapsed, 0);

	redis_stop();
	key_of("no redis", k);
	claim_start(&b, lb, r, k, 20000);
	pthread_join(b.t, NULL);
	ck_assert_int_eq(b.st, AP_LEASE_ALONE);
	ck_assert_double_lt(b.ms, 5000);   /* at once, not at the 20 s bound */
	ap_leases_get_counts(lb, AP_REDIS_ACTION, &n);
	ck_assert_uint_eq(n.waited, 1);
	ap_lease_release(la, a.held);   /* fails quietly: nothing to release */
	ap_leases_free(la);
	ap_leases_free(lb);
	ap_redis_free(r);
}
END_TEST

/* A compile of graph kernels_pb(which) for cpu on c, in a thread. */
struct kjob {
	ap_compiler *c;
	Apollo__Graph *pb;
	Apollo__CompileRequest req;
	Apollo__CompileResponse *resp;
	double ms;
	pthread_t t;
};

static void *kjob_main(void *arg)
{
	struct kjob *j = arg;
	double t = ap_now_ms();

	j->resp = ap_compile_run(j->c, &j->req);
	j->ms = ap_now_ms() - t;
	return NULL;
}

static void kjob_start(struct kjob *j, ap_compiler *c, int which)
{
	Apollo__CompileRequest init = APOLLO__COMPILE_REQUEST__INIT;

	memset(j, 0, sizeof(*j));
	j->c = c;
	j->pb = kernels_pb(which);
	j->req = init;
	j->req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
	j->req.graph = j->pb;
	j->req.target = "cpu";
	ck_assert_int_eq(pthread_create(&j->t, NULL, kjob_main, j), 0);
}

/* Joins j: its bundle answered; returns the kernels compiled by c. */
static uint64_t kjob_join(struct kjob *j)
{
	ap_compile_counters n;

	pthread_join(j->t, NULL);
	ck_assert_msg(j->resp->result_case == APOLLO__COMPILE_RESPONSE__RESULT_BUNDLE, "%s",
		      j->resp->error ? j->resp->error->message : "?");
	ap_compiler_get_counters(j->c, &n);
	return n.kernels_compiled;
}

static void kjob_free(struct kjob *j)
{
	ap_compile_response_free(j->resp);
	ap_graph_pb_free(j->pb);
}

/* Kernel `name`'s blob digest in j's bundle (fails when it has none). */
static const uint8_t *kernel_digest(const struct kjob *j, const char *prefix)
{
	const Apollo__Bundle *b = j->resp->bundle;

	for (size_t i = 0; i < b->n_kernels; i++)
		if (!strncmp(b->kernels[i]->name, prefix, strlen(prefix)))
			return b->kernels[i]->digest.data;
	for (size_t i = 0; i < b->n_kernels; i++)
		fprintf(stderr, "kernel %s\n", b->kernels[i]->name);
	ck_abort_msg("no kernel %s", prefix);
	return NULL;
}

/* Compiler `name` (its own L1, *cache) on r, leases of lease_ms; with
 * the test hook `hook` (APOLLO_TEST_LEASE_HOLD_MS, a request's lease;
 * APOLLO_TEST_KERNEL_LEASE_HOLD_MS, its kernels') set to hold_ms when
 * that is nonzero. */
#define KHOLD "APOLLO_TEST_KERNEL_LEASE_HOLD_MS"

static ap_compiler *lease_compiler(ap_redis *r, const char *name, unsigned lease_ms,
				   const char *hook, unsigned hold_ms, ap_cache **cache)
{
	ap_compiler_options o = { .threads = 1, .redis = r, .lease_ms = lease_ms,
				  .flight_wait_ms = 20000 };
	char ms[16];
	ap_compiler *c;

	*cache = cache_at(name);
	snprintf(ms, sizeof(ms), "%u", hold_ms);
	if (hold_ms)
		setenv(hook, ms, 1);
	c = ap_compiler_new(*cache, &o);
	unsetenv(hook);
	ck_assert_ptr_nonnull(c);
	return c;
}

/* Two daemons on one Redis: compilers a and b with their own L1, and a
 * compile job for each. */
struct pair {
	ap_redis *r;
	ap_cache *ca, *cb;
	ap_compiler *a, *b;
	struct kjob ja, jb;
	ap_compile_counters na, nb;   /* pair_counts */
};

/* Opens p: leases of lease_ms, a's test hook `hook` set to hold_a ms and
 * b's to hold_b (0: none). */
static void pair_open(struct pair *p, unsigned lease_ms, const char *hook, unsigned hold_a,
		      unsigned hold_b)
{
	memset(p, 0, sizeof(*p));
	p->r = client(secret, sizeof(secret) - 1, 1 << 20, 3);
	p->a = lease_compiler(p->r, "pa", lease_ms, hook, hold_a, &p->ca);
	p->b = lease_compiler(p->r, "pb", lease_ms, hook, hold_b, &p->cb);
}

static void pair_counts(struct pair *p)
{
	ap_compiler_get_counters(p->a, &p->na);
	ap_compiler_get_counters(p->b, &p->nb);
}

/* Waits until a has taken a lease (its request's, or with `kernel` one
 * of its kernels'); fails after 3 s. */
static void pair_a_holds(struct pair *p, bool kernel)
{
	for (int i = 0; i < 300; i++) {
		pair_counts(p);
		if ((kernel ? p->na.kernel_lease : p->na.lease).taken)
			return;
		usleep(10 * 1000);
	}
	ck_abort_msg("compiler a took no lease");
}

/* Frees p's jobs (those started), compilers, caches and client. */
static void pair_close(struct pair *p)
{
	if (p->ja.resp)
		kjob_free(&p->ja);
	if (p->jb.resp)
		kjob_free(&p->jb);
	ap_compiler_free(p->a);
	ap_compiler_free(p->b);
	ap_cache_free(p->ca);
	ap_cache_free(p->cb);
	ap_redis_free(p->r);
}

/* Two compilers (two daemons, their own L1) asked for one cold graph at
 * once: the first takes the lease (and, by the test hook, holds it a
 * while before compiling), the second waits and is answered from L2
 * without compiling. */
START_TEST(compilers_compile_once)
{
	struct pair p;

	pair_open(&p, 3000, "APOLLO_TEST_LEASE_HOLD_MS", 900, 0);
	kjob_start(&p.ja, p.a, 0);
	pair_a_holds(&p, false);
	kjob_start(&p.jb, p.b, 0);
	ck_assert_uint_gt(kjob_join(&p.ja), 0);
	ck_assert_uint_eq(kjob_join(&p.jb), 0);
	ck_assert_int_eq(p.ja.resp->bundle->stats->cache_hit, 0);
	ck_assert_int_eq(p.jb.resp->bundle->stats->cache_tier, APOLLO__CACHE_TIER__CACHE_L2);
	ck_assert_uint_eq(p.jb.resp->bundle->n_kernels, p.ja.resp->bundle->n_kernels);
	pair_counts(&p);
	ck_assert_uint_eq(p.nb.lease.waited, 1);
	ck_assert_uint_eq(p.nb.lease.taken, 0);
	ck_assert_uint_eq(p.nb.tier[APOLLO__CACHE_TIER__CACHE_L2], 1);
	pair_close(&p);
}
END_TEST

/* ---- cluster leases per kernel -------------------------------------------------- */

/* Two daemons, two different cold graphs that share the GEMM kernel: A
 * takes the kernel's lease (and holds it a while); B, compiling its other
 * kernel, finds the GEMM's held, waits, and takes A's entry from L2: the
 * GEMM is compiled once in the cluster. */
START_TEST(kernel_lease_shared)
{
	struct pair p;
	char line[256];

	pair_open(&p, 3000, KHOLD, 900, 0);
	kjob_start(&p.ja, p.a, 0);
	pair_a_holds(&p, true);
	kjob_start(&p.jb, p.b, 1);
	ck_assert_uint_eq(kjob_join(&p.ja) + kjob_join(&p.jb), 2);   /* GEMM and exp, once each */
	pair_counts(&p);
	ck_assert_uint_eq(p.na.kernels_compiled, 1);
	ck_assert_uint_eq(p.nb.kernels_compiled, 1);
	ck_assert_uint_eq(p.nb.kernel_lease.waited, 1);
	ck_assert_uint_eq(p.nb.kernel_lease.taken, 1);   /* exp's */
	ck_assert_uint_eq(p.nb.kernel_lease.lapsed, 0);
	ck_assert_uint_eq(p.nb.kernel_lease.timeouts, 0);
	ck_assert_uint_eq(p.nb.kernel_lease.waiting, 0);
	ck_assert_uint_eq(p.nb.kernel_tier[APOLLO__CACHE_TIER__CACHE_L2], 1);
	ck_assert_uint_eq(p.nb.lease.taken, 1);          /* its request's, another graph */
	ck_assert_uint_eq(p.nb.lease.waited, 0);
	ck_assert_mem_eq(kernel_digest(&p.ja, "ap_MatMul_"), kernel_digest(&p.jb, "ap_MatMul_"),
			 32);
	cli(line, sizeof(line), "--scan --pattern 't:*:lease:*'");
	ck_assert_str_eq(line, "");   /* every lease released */
	pair_close(&p);
}
END_TEST

/* The key of the one kernel entry in Redis (redis-cli SCAN). */
static void only_kernel_key(uint8_t key[32])
{
	char line[256];
	const char *hex;

	cli(line, sizeof(line), "--scan --pattern 't:*:k:*'");
	hex = strrchr(line, ':');
	ck_assert_msg(hex && strlen(hex + 1) == 64, "no kernel entry: %s", line);
	for (int i = 0; i < 32; i++)
		ck_assert_int_eq(sscanf(hex + 1 + 2 * i, "%2hhx", &key[i]), 1);
}

/* A kernel lease whose holder died (taken by hand with a short ttl, never
 * renewed nor released) is taken over after the ttl and compiled here. */
START_TEST(kernel_lease_taken_over)
{
	struct pair p;
	ap_redis_lease dead;
	char tok[AP_REDIS_TOKEN_CHARS + 1], out[64];
	uint8_t gemm[32];

	/* the GEMM kernel's key, from a's compile; then Redis emptied */
	pair_open(&p, 1000, KHOLD, 0, 0);
	kjob_start(&p.ja, p.a, 0);
	ck_assert_uint_eq(kjob_join(&p.ja), 1);
	only_kernel_key(gemm);
	cli(out, sizeof(out), "flushall");

	ck_assert_int_eq(ap_redis_lease_take(p.r, AP_REDIS_KERNEL, gemm, 400, &dead), 1);
	kjob_start(&p.jb, p.b, 1);
	ck_assert_uint_eq(kjob_join(&p.jb), 2);
	ck_assert_double_ge(p.jb.ms, 300);      /* after the dead holder's ttl ... */
	ck_assert_double_lt(p.jb.ms, 10000);    /* ... not at the 20 s bound */
	pair_counts(&p);
	ck_assert_uint_eq(p.nb.kernels_compiled, 2);
	ck_assert_uint_eq(p.nb.kernel_lease.waited, 1);
	ck_assert_uint_eq(p.nb.kernel_lease.lapsed, 1);
	ck_assert_uint_eq(p.nb.kernel_lease.taken_over, 1);
	ck_assert_uint_eq(p.nb.kernel_lease.taken, 2);
	ck_assert_uint_eq(p.nb.kernel_lease.timeouts, 0);
	ck_assert_int_eq(ap_redis_lease_holder(p.r, AP_REDIS_KERNEL, gemm, tok), 0);   /* released */
	pair_close(&p);
}
END_TEST

/* Redis unreachable: two daemons compile the shared kernel each, at once,
 * taking and waiting on no lease. */
START_TEST(kernel_lease_without_redis)
{
	struct pair p;

	pair_open(&p, 1000, KHOLD, 0, 0);
	redis_stop();
	kjob_start(&p.ja, p.a, 0);
	kjob_start(&p.jb, p.b, 1);
	ck_assert_uint_eq(kjob_join(&p.ja), 1);
	ck_assert_uint_eq(kjob_join(&p.jb), 2);
	ck_assert_double_lt(p.jb.ms, 10000);
	pair_counts(&p);
	ck_assert_uint_eq(p.na.kernel_lease.taken + p.nb.kernel_lease.taken, 0);
	ck_assert_uint_eq(p.na.kernel_lease.waited + p.nb.kernel_lease.waited, 0);
	pair_close(&p);
}
END_TEST

/* Two daemons that may each hold a kernel lease the other needs (two
 * graphs of the same GEMM and exp kernels, their exp outputs named apart,
 * started together, each holding what it took a while): each compiles and
 * releases its own before waiting for the other's, so both finish long
 * before their bound, and the two kernels are compiled once in the
 * cluster. */
START_TEST(kernel_lease_no_deadlock)
{
	struct pair p;

	pair_open(&p, 3000, KHOLD, 500, 500);
	kjob_start(&p.ja, p.a, 1);
	kjob_start(&p.jb, p.b, 2);
	ck_assert_uint_eq(kjob_join(&p.ja) + kjob_join(&p.jb), 2);
	ck_assert_double_lt(p.ja.ms, 10000);
	ck_assert_double_lt(p.jb.ms, 10000);
	pair_counts(&p);
	fprintf(stderr, "no_deadlock: a took %u waited %u, b took %u waited %u; %.0f, %.0f ms\n",
		(unsigned)p.na.kernel_lease.taken, (unsigned)p.na.kernel_lease.waited,
		(unsigned)p.nb.kernel_lease.taken, (unsigned)p.nb.kernel_lease.waited, p.ja.ms,
		p.jb.ms);
	ck_assert_uint_eq(p.na.kernel_lease.timeouts + p.nb.kernel_lease.timeouts, 0);
	ck_assert_uint_eq(p.na.lease.taken + p.nb.lease.taken, 2);   /* two graph keys */
	ck_assert_uint_eq(p.na.kernel_lease.taken + p.nb.kernel_lease.taken, 2);
	ck_assert_uint_ge(p.na.kernel_lease.waited + p.nb.kernel_lease.waited, 1);
	ck_assert_mem_eq(kernel_digest(&p.ja, "ap_MatMul_"), kernel_digest(&p.jb, "ap_MatMul_"),
			 32);
	ck_assert_mem_eq(kernel_digest(&p.ja, "ap_Exp_"), kernel_digest(&p.jb, "ap_Exp_"), 32);
	pair_close(&p);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("redis");
	TCase *tc = tcase_create("redis");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, round_trip);
	tcase_add_test(tc, tampering_is_a_miss);
	tcase_add_test(tc, value_limit);
	tcase_add_test(tc, announced_length_checked_first);
	tcase_add_test(tc, reply_bounded_in_all);
	tcase_add_test(tc, breaker);
	tcase_add_test(tc, secret_files);
	tcase_add_test(tc, tuning_records_shared);
	tcase_add_test(tc, tiers_read_through);
	tcase_add_test(tc, lease_by_token);
	tcase_add_test(tc, lease_lapse_take_over);
	tcase_add_test(tc, lease_claim_waits_for_entry);
	tcase_add_test(tc, lease_claim_takes_over);
	tcase_add_test(tc, lease_claim_bounded);
	tcase_add_test(tc, compilers_compile_once);
	tcase_add_test(tc, kernel_lease_shared);
	tcase_add_test(tc, kernel_lease_taken_over);
	tcase_add_test(tc, kernel_lease_without_redis);
	tcase_add_test(tc, kernel_lease_no_deadlock);
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
