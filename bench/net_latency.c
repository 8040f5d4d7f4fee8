/* net_latency.c -- ping round trips of apollod while another client sends
 * big compile requests (built and run by bench/net_latency.sh).
 *
 *   net_latency SOCKET NODES PINGS
 *
 * Phase 1 ("idle"): one client sends PINGS pings, one at a time, and
 * records each round trip.  Phase 2 ("loaded"): a second client (a thread)
 * sends, one after another, a CompileRequest whose Graph is a chain of
 * NODES Relu nodes (tens of MiB, slow to unpack) with target "bogus", so
 * that the daemon's work after decoding is short and the cost that matters
 * is the unpacking; meanwhile the first client pings again.  Prints p50 and
 * p99 (microseconds) of each phase, their ratios, the frame size and how
 * many big frames were answered during phase 2.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/frame.h"
#include "proto/apollo.pb-c.h"

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int connect_unix(const char *path)
{
	struct sockaddr_un addr;
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);

	if (fd < 0)
		return -1;
	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
		close(fd);
		return -1;
	}
	return fd;
}

static int send_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n > 0) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

static int recv_all(int fd, void *p, size_t n)
{
	uint8_t *b = p;

	while (n > 0) {
		ssize_t r = recv(fd, b, n, 0);
		if (r <= 0)
			return -1;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

/* Packs `env` into a malloc'd frame. */
static uint8_t *pack(const Apollo__Envelope *env, size_t *len)
{
	size_t n = apollo__envelope__get_packed_size(env);
	uint8_t *f = malloc(n + AP_FRAME_HEADER_BYTES);

	if (!f)
		return NULL;
	ap_frame_put_len(f, (uint32_t)n);
	apollo__envelope__pack(env, f + AP_FRAME_HEADER_BYTES);
	*len = n + AP_FRAME_HEADER_BYTES;
	return f;
}

/* Reads one reply; returns its id, or -1. */
static long long recv_reply(int fd, int *msg_case)
{
	uint8_t hdr[AP_FRAME_HEADER_BYTES], *buf;
	uint32_t n;
	Apollo__Envelope *env;
	long long id;

	if (recv_all(fd, hdr, sizeof(hdr)))
		return -1;
	n = ap_frame_get_len(hdr);
	buf = malloc(n ? n : 1);
	if (!buf || recv_all(fd, buf, n)) {
		free(buf);
		return -1;
	}
	env = apollo__envelope__unpack(NULL, n, buf);
	free(buf);
	if (!env)
		return -1;
	id = (long long)env->id;
	*msg_case = (int)env->msg_case;
	apollo__envelope__free_unpacked(env, NULL);
	return id;
}

/* The big request: a chain of `nodes` Relu nodes over [4, 4] tensors. */
static uint8_t *big_frame(int nodes, size_t *len)
{
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;
	Apollo__Graph g = APOLLO__GRAPH__INIT;
	Apollo__Tensor *t = calloc((size_t)nodes + 1, sizeof(*t));
	Apollo__Tensor **tp = calloc((size_t)nodes + 1, sizeof(*tp));
	Apollo__Node *nd = calloc((size_t)nodes, sizeof(*nd));
	Apollo__Node **np = calloc((size_t)nodes, sizeof(*np));
	int32_t *idx = calloc((size_t)nodes + 1, sizeof(*idx));
	char *names = calloc((size_t)nodes + 1, 16);
	int64_t dims[2] = { 4, 4 };
	int32_t in0 = 0, out = nodes;
	uint8_t *f;

	if (!t || !tp || !nd || !np || !idx || !names)
		return NULL;
	for (int i = 0; i <= nodes; i++) {
		idx[i] = i;
		snprintf(names + 16 * (size_t)i, 16, "t%d", i);
		apollo__tensor__init(&t[i]);
		t[i].name = names + 16 * (size_t)i;
		t[i].dtype = APOLLO__DATA_TYPE__DT_FLOAT;
		t[i].kind = i ? APOLLO__TENSOR_KIND__TENSOR_VALUE : APOLLO__TENSOR_KIND__TENSOR_INPUT;
		t[i].n_dims = 2;
		t[i].dims = dims;
		tp[i] = &t[i];
	}
	for (int i = 0; i < nodes; i++) {
		apollo__node__init(&nd[i]);
		nd[i].name = names + 16 * (size_t)(i + 1);
		nd[i].op_type = "Relu";
		nd[i].n_inputs = 1;
		nd[i].inputs = &idx[i];
		nd[i].n_outputs = 1;
		nd[i].outputs = &idx[i + 1];
		np[i] = &nd[i];
	}
	g.name = "chain";
	g.n_tensors = (size_t)nodes + 1;
	g.tensors = tp;
	g.n_nodes = (size_t)nodes;
	g.nodes = np;
	g.n_inputs = 1;
	g.inputs = &in0;
	g.n_outputs = 1;
	g.outputs = &out;
	req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
	req.graph = &g;
	req.target = "bogus";
	env.msg_case = APOLLO__ENVELOPE__MSG_COMPILE;
	env.compile = &req;
	env.id = 1;
	f = pack(&env, len);
	free(t);
	free(tp);
	free(nd);
	free(np);
	free(idx);
	free(names);
	return f;
}

struct loader {
	const char *sock;
	uint8_t *frame;
	size_t len;
	atomic_int stop;
	atomic_int answered;
	double decode_us;   /* the first request's round trip */
};

static void *loader_main(void *arg)
{
	struct loader *l = arg;
	int fd = connect_unix(l->sock);

	if (fd < 0)
		return NULL;
	while (!atomic_load(&l->stop)) {
		int mc;
		double t0 = now_us();
		if (send_all(fd, l->frame, l->len) || recv_reply(fd, &mc) != 1)
			break;
		if (!atomic_load(&l->answered))
			l->decode_us = now_us() - t0;
		atomic_fetch_add(&l->answered, 1);
	}
	close(fd);
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Sends `n` pings on `fd`, one at a time, 200 us apart; fills rtt[] (us). */
static int pings(int fd, int n, double *rtt)
{
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__PingRequest ping = APOLLO__PING_REQUEST__INIT;
	struct timespec gap = { 0, 200 * 1000 };

	env.msg_case = APOLLO__ENVELOPE__MSG_PING;
	env.ping = &ping;
	for (int i = 0; i < n; i++) {
		size_t len;
		uint8_t *f;
		double t0;
		int mc;

		env.id = 1000 + (uint64_t)i;
		f = pack(&env, &len);
		t0 = now_us();
		if (!f || send_all(fd, f, len) || recv_reply(fd, &mc) != (long long)env.id ||
		    mc != APOLLO__ENVELOPE__MSG_PONG) {
			free(f);
			return -1;
		}
		rtt[i] = now_us() - t0;
		free(f);
		nanosleep(&gap, NULL);
	}
	qsort(rtt, (size_t)n, sizeof(*rtt), cmp_double);
	return 0;
}

int main(int argc, char **argv)
{
	struct loader l = { 0 };
	pthread_t th;
	double *idle, *busy, p50i, p99i, p50b, p99b, maxb;
	int fd, n;

	if (argc != 4) {
		fprintf(stderr, "usage: net_latency SOCKET NODES PINGS\n");
		return 2;
	}
	n = atoi(argv[3]);
	idle = calloc((size_t)n, sizeof(double));
	busy = calloc((size_t)n, sizeof(double));
	l.sock = argv[1];
	l.frame = big_frame(atoi(argv[2]), &l.len);
	fd = connect_unix(argv[1]);
	if (!idle || !busy || !l.frame || fd < 0) {
		fprintf(stderr, "net_latency: set-up failed (daemon on %s?)\n", argv[1]);
		return 1;
	}
	if (pings(fd, n, idle)) {
		fprintf(stderr, "net_latency: ping failed\n");
		return 1;
	}
	pthread_create(&th, NULL, loader_main, &l);
	while (!atomic_load(&l.answered))   /* the first big frame went through */
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	if (pings(fd, n, busy)) {
		fprintf(stderr, "net_latency: ping failed under load\n");
		return 1;
	}
	atomic_store(&l.stop, 1);
	pthread_join(th, NULL);
	p50i = idle[n / 2];
	p99i = idle[(n * 99) / 100];
	p50b = busy[n / 2];
	p99b = busy[(n * 99) / 100];
	maxb = busy[n - 1];
	printf("big frame: %.1f MiB, one request's round trip %.1f ms, %d answered while pinging\n",
	       l.len / 1048576.0, l.decode_us / 1e3, atomic_load(&l.answered));
	printf("ping idle:   p50 %8.1f us  p99 %8.1f us\n", p50i, p99i);
	printf("ping loaded: p50 %8.1f us  p99 %8.1f us  max %8.1f us\n", p50b, p99b, maxb);
	printf("ratio loaded/idle: p50 %.2fx  p99 %.2fx\n", p50b / p50i, p99b / p99i);
	close(fd);
	free(idle);
	free(busy);
	free(l.frame);
	return 0;
}
