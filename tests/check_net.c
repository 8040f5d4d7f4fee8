/* check_net.c -- apollod's network front with frames big enough to be
 * decoded on the worker pool (over 64 KiB), driven through the real
 * $APOLLO_BUILD/apollod (default build/apollod) by a small blocking client
 * written here.
 *
 * Big frames are made by appending an unknown field (number 1000, a few
 * hundred KiB of bytes) to a packed Envelope: protobuf decoders skip it, so
 * the request means what it meant without the padding.  Covered: replies
 * to big and small frames pipelined on one connection keep their order
 * (compile replies aside, which come when done), a big undecodable frame
 * gets ERR_BAD_MESSAGE and the connection stays open, request ids are
 * echoed, a client that leaves while its big frame is decoded, a
 * half-closed client, and SIGTERM with big frames arriving; a request
 * answered before decoded without its graph and answered warm, or decoded
 * whole when the cache lost its bundle; a compile's Progress events
 * (issue 26, item 4), in order, with its id, before its answer, and only
 * when asked for.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "common/frame.h"
#include "proto/apollo.pb-c.h"

#define PAD_BYTES (300 * 1024)

typedef struct daemon {
	pid_t pid;
	char dir[64];
	char sock[128];
} daemon_t;

static void nap_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

static int open_unix(const char *path)
{
	struct sockaddr_un addr;
	struct timeval tv = { 120, 0 };
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);

	ck_assert_int_ge(fd, 0);
	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
		close(fd);
		return -1;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return fd;
}

static void start(daemon_t *d)
{
	const char *build = getenv("APOLLO_BUILD");
	char bin[4096], cache[160], log[160];
	struct stat st;

	snprintf(bin, sizeof(bin), "%s/apollod", build && *build ? build : "build");
	ck_assert_msg(stat(bin, &st) == 0, "%s not found: build it, or set APOLLO_BUILD", bin);
	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "/tmp/apollo-net-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(d->dir));
	snprintf(d->sock, sizeof(d->sock), "%s/apollod.sock", d->dir);
	snprintf(cache, sizeof(cache), "%s/cache.db", d->dir);
	snprintf(log, sizeof(log), "%s/apollod.log", d->dir);
	d->pid = fork();
	ck_assert_int_ge(d->pid, 0);
	if (d->pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execl(bin, bin, "--socket", d->sock, "--cache", cache, "--log-level", "debug",
		      "--workers", "2", "--foreground", (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 1000; i++) {
		int status, fd;
		if (waitpid(d->pid, &status, WNOHANG) == d->pid)
			ck_abort_msg("apollod exited during start-up; see %s", log);
		fd = open_unix(d->sock);
		if (fd >= 0) {
			close(fd);
			return;
		}
		nap_ms(10);
	}
	ck_abort_msg("apollod did not start listening on %s", d->sock);
}

/* Waits for the exit after SIGTERM (sent by the caller); returns the exit
 * status, 128+signal when killed, -1 after 60 s. */
static int wait_exit(daemon_t *d)
{
	int status = 0;

	for (int i = 0; i < 6000; i++) {
		if (waitpid(d->pid, &status, WNOHANG) == d->pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		nap_ms(10);
	}
	kill(d->pid, SIGKILL);
	waitpid(d->pid, &status, 0);
	return -1;
}

static void stop(daemon_t *d)
{
	char cmd[160];

	kill(d->pid, SIGTERM);
	ck_assert_int_eq(wait_exit(d), 0);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
	ck_assert_int_eq(system(cmd), 0);
}

/* ---- frames -------------------------------------------------------------- */

typedef struct buf {
	uint8_t *p;
	size_t n, cap;
} buf_t;

static void put(buf_t *b, const void *p, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2;
		b->p = realloc(b->p, b->cap);
		ck_assert_ptr_nonnull(b->p);
	}
	memcpy(b->p + b->n, p, n);
	b->n += n;
}

static void put_varint(buf_t *b, uint64_t v)
{
	uint8_t x[10];
	size_t n = 0;

	do {
		x[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
		v >>= 7;
	} while (v);
	put(b, x, n);
}

/* Appends the frame of `env`, padded with an unknown field of `pad` bytes
 * (none when 0). */
static void put_env(buf_t *b, const Apollo__Envelope *env, size_t pad)
{
	size_t n = apollo__envelope__get_packed_size(env);
	uint8_t hdr[AP_FRAME_HEADER_BYTES], *msg = malloc(n + 1);
	buf_t padding = { 0 };

	ck_assert_ptr_nonnull(msg);
	apollo__envelope__pack(env, msg);
	if (pad) {
		uint8_t *zeros = calloc(1, pad);
		put_varint(&padding, (1000u << 3) | 2);   /* field 1000, bytes */
		put_varint(&padding, pad);
		put(&padding, zeros, pad);
		free(zeros);
	}
	ap_frame_put_len(hdr, (uint32_t)(n + padding.n));
	put(b, hdr, sizeof(hdr));
	put(b, msg, n);
	if (padding.n)
		put(b, padding.p, padding.n);
	free(padding.p);
	free(msg);
}

static void put_ping(buf_t *b, uint64_t id, size_t pad)
{
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__PingRequest ping = APOLLO__PING_REQUEST__INIT;

	env.id = id;
	env.msg_case = APOLLO__ENVELOPE__MSG_PING;
	env.ping = &ping;
	put_env(b, &env, pad);
}

static void put_stats(buf_t *b, uint64_t id, size_t pad)
{
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__StatsRequest st = APOLLO__STATS_REQUEST__INIT;

	env.id = id;
	env.msg_case = APOLLO__ENVELOPE__MSG_STATS;
	env.stats = &st;
	put_env(b, &env, pad);
}

/* out = Relu(x) on [2, cols] for the cpu target; `progress`: with
 * CompileRequest.progress set. */
static void put_compile_progress(buf_t *b, uint64_t id, int64_t cols, size_t pad, bool progress)
{
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__CompileRequest req = APOLLO__COMPILE_REQUEST__INIT;
	Apollo__Graph g = APOLLO__GRAPH__INIT;
	Apollo__Tensor t[2] = { APOLLO__TENSOR__INIT, APOLLO__TENSOR__INIT };
	Apollo__Tensor *tp[2] = { &t[0], &t[1] };
	Apollo__Node n = APOLLO__NODE__INIT;
	Apollo__Node *np[1] = { &n };
	int64_t dims[2] = { 2, cols };
	int32_t in = 0, out = 1;

	t[0].name = "x";
	t[1].name = "y";
	for (int i = 0; i < 2; i++) {
		t[i].dtype = APOLLO__DATA_TYPE__DT_FLOAT;
		t[i].n_dims = 2;
		t[i].dims = dims;
	}
	t[0].kind = APOLLO__TENSOR_KIND__TENSOR_INPUT;
	t[1].kind = APOLLO__TENSOR_KIND__TENSOR_VALUE;
	n.name = "relu";
	n.op_type = "Relu";
	n.n_inputs = 1;
	n.inputs = &in;
	n.n_outputs = 1;
	n.outputs = &out;
	g.name = "relu";
	g.n_tensors = 2;
	g.tensors = tp;
	g.n_nodes = 1;
	g.nodes = np;
	g.n_inputs = 1;
	g.inputs = &in;
	g.n_outputs = 1;
	g.outputs = &out;
	req.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
	req.graph = &g;
	req.target = "cpu";
	req.progress = progress;
	env.id = id;
	env.msg_case = APOLLO__ENVELOPE__MSG_COMPILE;
	env.compile = &req;
	put_env(b, &env, pad);
}

static void put_compile(buf_t *b, uint64_t id, int64_t cols, size_t pad)
{
	put_compile_progress(b, id, cols, pad, false);
}

/* A frame of `n` bytes that is no Envelope: 0xff bytes are a varint that
 * never ends. */
static void put_garbage(buf_t *b, size_t n)
{
	uint8_t hdr[AP_FRAME_HEADER_BYTES], *g = malloc(n);

	ck_assert_ptr_nonnull(g);
	memset(g, 0xff, n);
	ap_frame_put_len(hdr, (uint32_t)n);
	put(b, hdr, sizeof(hdr));
	put(b, g, n);
	free(g);
}

static void send_buf(int fd, buf_t *b)
{
	for (size_t off = 0; off < b->n;) {
		ssize_t w = send(fd, b->p + off, b->n - off, MSG_NOSIGNAL);
		ck_assert_msg(w > 0, "send: %s", strerror(errno));
		off += (size_t)w;
	}
	free(b->p);
	memset(b, 0, sizeof(*b));
}

static bool recv_exact(int fd, void *p, size_t n)
{
	uint8_t *q = p;

	while (n > 0) {
		ssize_t r = recv(fd, q, n, 0);
		if (r <= 0)
			return false;
		q += r;
		n -= (size_t)r;
	}
	return true;
}

/* The next reply, or NULL when the daemon closed the connection. */
static Apollo__Envelope *next_reply(int fd)
{
	uint8_t hdr[AP_FRAME_HEADER_BYTES], *p;
	Apollo__Envelope *env;
	uint32_t n;

	if (!recv_exact(fd, hdr, sizeof(hdr)))
		return NULL;
	n = ap_frame_get_len(hdr);
	ck_assert_uint_gt(n, 0);
	ck_assert_uint_lt(n, 1u << 28);
	p = malloc(n);
	ck_assert_ptr_nonnull(p);
	ck_assert_msg(recv_exact(fd, p, n), "reply truncated");
	env = apollo__envelope__unpack(NULL, n, p);
	free(p);
	ck_assert_msg(env != NULL, "reply does not decode");
	return env;
}

static void expect_pong(int fd, uint64_t id)
{
	Apollo__Envelope *r = next_reply(fd);

	ck_assert_ptr_nonnull(r);
	ck_assert_uint_eq(r->id, id);
	ck_assert_int_eq(r->msg_case, APOLLO__ENVELOPE__MSG_PONG);
	apollo__envelope__free_unpacked(r, NULL);
}

static void expect_bundle(Apollo__Envelope *r, uint64_t id)
{
	ck_assert_uint_eq(r->id, id);
	ck_assert_int_eq(r->msg_case, APOLLO__ENVELOPE__MSG_COMPILED);
	ck_assert_int_eq(r->compiled->result_case, APOLLO__COMPILE_RESPONSE__RESULT_BUNDLE);
	ck_assert_ptr_nonnull(r->compiled->bundle);
}

static bool peer_closed(int fd)
{
	char c;
	ssize_t r = recv(fd, &c, 1, 0);

	return r == 0 || (r < 0 && errno == ECONNRESET);
}

/* ---- tests ------------------------------------------------------------------ */

/* Big and small frames sent in one burst: the ping / stats / error replies
 * come in request order, each id echoed, and the compiles are answered. */
START_TEST(big_frames_keep_order)
{
	daemon_t d;
	buf_t b = { 0 };
	bool compiled[2] = { false, false };
	int fd;

	start(&d);
	fd = open_unix(d.sock);
	ck_assert_int_ge(fd, 0);
	put_ping(&b, 1, PAD_BYTES);
	put_ping(&b, 2, 0);
	put_garbage(&b, PAD_BYTES);
	put_compile(&b, 3, 17, PAD_BYTES);
	put_ping(&b, 4, PAD_BYTES);
	put_compile(&b, 5, 19, 0);
	put_ping(&b, 6, 0);
	put_stats(&b, 7, 2 * PAD_BYTES);
	put_ping(&b, 8, 0);
	send_buf(fd, &b);

	expect_pong(fd, 1);
	expect_pong(fd, 2);
	/* Then error(0), pong 4, pong 6, stats 7, pong 8 in this order, and
	 * the compiles 3 and 5 anywhere among them. */
	for (int k = 0, got = 0; got < 7; got++) {
		static const uint64_t order[] = { 0, 4, 6, 7, 8 };
		Apollo__Envelope *r = next_reply(fd);

		ck_assert_ptr_nonnull(r);
		if (r->msg_case == APOLLO__ENVELOPE__MSG_COMPILED) {
			ck_assert(r->id == 3 || r->id == 5);
			ck_assert(!compiled[r->id == 5]);
			compiled[r->id == 5] = true;
			expect_bundle(r, r->id);
		} else {
			ck_assert_int_lt(k, 5);
			ck_assert_uint_eq(r->id, order[k]);
			k++;
			if (r->id == 0) {
				ck_assert_int_eq(r->msg_case, APOLLO__ENVELOPE__MSG_ERROR);
				ck_assert_int_eq(r->error->code, APOLLO__ERROR_CODE__ERR_BAD_MESSAGE);
			} else if (r->id == 7) {
				ck_assert_int_eq(r->msg_case, APOLLO__ENVELOPE__MSG_STATS_REPLY);
				ck_assert_uint_ge(r->stats_reply->clients, 1);
			} else {
				ck_assert_int_eq(r->msg_case, APOLLO__ENVELOPE__MSG_PONG);
			}
		}
		apollo__envelope__free_unpacked(r, NULL);
	}
	ck_assert(compiled[0] && compiled[1]);
	/* The connection is still open and serves small frames. */
	b = (buf_t){ 0 };
	put_ping(&b, 9, 0);
	send_buf(fd, &b);
	expect_pong(fd, 9);
	close(fd);
	stop(&d);
}
END_TEST

/* Clients that leave while their big frame is decoded, or right after
 * sending it, do not disturb the daemon; a half-closed client still gets
 * the reply to its big frame, then the daemon closes. */
START_TEST(big_frame_client_leaves)
{
	daemon_t d;
	buf_t b = { 0 };
	int fd;

	start(&d);
	for (int i = 0; i < 8; i++) {
		fd = open_unix(d.sock);
		ck_assert_int_ge(fd, 0);
		put_compile(&b, 10 + (uint64_t)i, 23, 4 * PAD_BYTES);
		put_ping(&b, 20 + (uint64_t)i, 4 * PAD_BYTES);
		put_ping(&b, 30 + (uint64_t)i, 0);
		send_buf(fd, &b);
		close(fd);
	}
	fd = open_unix(d.sock);
	ck_assert_int_ge(fd, 0);
	put_ping(&b, 40, 2 * PAD_BYTES);
	put_compile(&b, 41, 29, 2 * PAD_BYTES);
	send_buf(fd, &b);
	ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
	expect_pong(fd, 40);
	{
		Apollo__Envelope *r = next_reply(fd);
		ck_assert_ptr_nonnull(r);
		expect_bundle(r, 41);
		apollo__envelope__free_unpacked(r, NULL);
	}
	ck_assert(peer_closed(fd));
	close(fd);
	fd = open_unix(d.sock);
	put_ping(&b, 42, 0);
	send_buf(fd, &b);
	expect_pong(fd, 42);
	close(fd);
	stop(&d);
}
END_TEST

/* SIGTERM while big compile requests arrive: every request is answered,
 * a bundle or ERR_BUSY, with its id; then the daemon exits 0. */
START_TEST(big_frames_sigterm)
{
	daemon_t d;
	buf_t b = { 0 };
	int fd, n = 0;

	start(&d);
	fd = open_unix(d.sock);
	ck_assert_int_ge(fd, 0);
	for (int i = 0; i < 6; i++)
		put_compile(&b, 100 + (uint64_t)i, 31 + i, 2 * PAD_BYTES);
	send_buf(fd, &b);
	kill(d.pid, SIGTERM);
	for (Apollo__Envelope *r; (r = next_reply(fd)); n++) {
		ck_assert_int_eq(r->msg_case, APOLLO__ENVELOPE__MSG_COMPILED);
		ck_assert_uint_ge(r->id, 100);
		ck_assert_uint_lt(r->id, 106);
		if (r->compiled->result_case == APOLLO__COMPILE_RESPONSE__RESULT_ERROR)
			ck_assert_int_eq(r->compiled->error->code, APOLLO__ERROR_CODE__ERR_BUSY);
		else
			expect_bundle(r, r->id);
		apollo__envelope__free_unpacked(r, NULL);
	}
	/* Frames still unread when the drain ended may go unanswered; those
	 * read were answered, and at least the first was read. */
	ck_assert_int_ge(n, 1);
	ck_assert_int_le(n, 6);
	close(fd);
	ck_assert_int_eq(wait_exit(&d), 0);
	{
		char cmd[160];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d.dir);
		ck_assert_int_eq(system(cmd), 0);
	}
}
END_TEST

/* The bundle of a compile reply packed without its stats (times, tiers). */
static uint8_t *bundle_sans_stats(Apollo__Envelope *r, size_t *len)
{
	Apollo__Bundle *b = r->compiled->bundle;
	Apollo__Stats *st = b->stats;
	uint8_t *p;

	b->stats = NULL;
	*len = apollo__bundle__get_packed_size(b);
	p = malloc(*len + 1);
	ck_assert_ptr_nonnull(p);
	apollo__bundle__pack(b, p);
	b->stats = st;
	return p;
}

/* Compile request `id` (pad: a big frame, decoded by a job) sent on fd;
 * its reply a bundle equal to `ref` (len bytes; NULL: the first, kept in
 * *ref) but for its stats, a cache hit or not as `hit` says. */
static void compile_expect(int fd, uint64_t id, size_t pad, bool hit, uint8_t **ref, size_t *len)
{
	buf_t b = { 0 };
	Apollo__Envelope *r;
	uint8_t *p;
	size_t n;

	put_compile(&b, id, 64, pad);
	send_buf(fd, &b);
	r = next_reply(fd);
	ck_assert_ptr_nonnull(r);
	expect_bundle(r, id);
	ck_assert_int_eq(r->compiled->bundle->stats->cache_hit, hit);
	if (hit)
		ck_assert_int_eq(r->compiled->bundle->stats->cache_tier,
				 APOLLO__CACHE_TIER__CACHE_L1);
	p = bundle_sans_stats(r, &n);
	if (!*ref) {
		*ref = p;
		*len = n;
	} else {
		ck_assert_uint_eq(n, *len);
		ck_assert_int_eq(memcmp(p, *ref, n), 0);
		free(p);
	}
	apollo__envelope__free_unpacked(r, NULL);
}

/* How many lines of the daemon's log hold `what`. */
static int log_count(const daemon_t *d, const char *what)
{
	char path[160], line[4096];
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "%s/apollod.log", d->dir);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, what) != NULL;
	fclose(f);
	return n;
}

/* Issue 26, item 2: a compile request the daemon answered before is
 * decoded without its graph, small frame (on the loop) or big (a decode
 * job), and answered warm from L1 with the same bundle; when L1 has lost
 * its bundle, the worker decodes it whole and compiles it again (its
 * kernels from the kernel cache): the same bundle once more. */
START_TEST(known_request_without_graph)
{
	daemon_t d;
	char db[160];
	sqlite3 *h;
	uint8_t *ref = NULL;
	size_t len = 0;
	int fd;

	start(&d);
	fd = open_unix(d.sock);
	ck_assert_int_ge(fd, 0);
	compile_expect(fd, 1, PAD_BYTES, false, &ref, &len);   /* compiled */
	compile_expect(fd, 2, 0, true, &ref, &len);            /* known: on the loop */
	compile_expect(fd, 3, PAD_BYTES, true, &ref, &len);    /* known: a decode job */
	snprintf(db, sizeof(db), "%s/cache.db", d.dir);
	ck_assert_int_eq(sqlite3_open(db, &h), SQLITE_OK);
	ck_assert_int_eq(sqlite3_exec(h, "DELETE FROM actions", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(h);
	compile_expect(fd, 4, 0, false, &ref, &len);           /* known, not warm: whole */
	compile_expect(fd, 5, PAD_BYTES, true, &ref, &len);    /* stored again: warm */
	close(fd);
	ck_assert_int_eq(log_count(&d, "answered warm without decoding its graph"), 3);
	ck_assert_int_eq(log_count(&d, "a known request, decoded whole"), 1);
	stop(&d);
	free(ref);
}
END_TEST

/* ---- progress (issue 26, item 4) -------------------------------------------- */

/* The wire's stages in the order a cold compile reaches them. */
static int stage_rank(const char *stage)
{
	static const char *const order[] = {
		"import", "partition", "layer I", "layer II", "tuning",
		"layer III", "codegen", "plan", "backend", "cache",
	};

	for (int i = 0; i < (int)(sizeof(order) / sizeof(order[0])); i++)
		if (!strcmp(stage, order[i]))
			return i;
	ck_abort_msg("unknown progress stage '%s'", stage);
	return -1;
}

/* Reads the replies to compile request `id` up to its answer, checking
 * every Progress on the way: the request's id, stages in order (a stage
 * may repeat, never go back), backend's done counting up to its total,
 * elapsed_ms never decreasing.  Returns the answer (a bundle, checked);
 * *events: how many came, *seen: a bit per stage rank. */
static Apollo__Envelope *progress_until_answer(int fd, uint64_t id, int *events, unsigned *seen)
{
	Apollo__Envelope *r;
	int rank = -1;
	uint32_t done = 0, total = 0;
	double ms = 0;

	*events = 0;
	*seen = 0;
	while ((r = next_reply(fd)) && r->msg_case == APOLLO__ENVELOPE__MSG_PROGRESS) {
		const Apollo__Progress *p = r->progress;
		int k = stage_rank(p->stage);

		ck_assert_uint_eq(r->id, id);
		ck_assert_int_ge(k, rank);
		ck_assert(p->elapsed_ms >= ms);
		if (!strcmp(p->stage, "backend")) {
			ck_assert_uint_gt(p->total, 0);
			ck_assert_uint_le(p->done, p->total);
			ck_assert_uint_ge(p->done, done);
			done = p->done;
			total = p->total;
		} else {
			ck_assert_uint_eq(p->total, 0);
		}
		rank = k;
		ms = p->elapsed_ms;
		*seen |= 1u << k;
		(*events)++;
		apollo__envelope__free_unpacked(r, NULL);
	}
	ck_assert_msg(r != NULL, "the daemon closed the connection before its answer");
	expect_bundle(r, id);
	ck_assert_uint_eq(done, total);   /* the backend's last event: all kernels */
	return r;
}

/* Issue 26, item 4: a cold compile asking for progress gets its stages
 * (import before partition before the fusion layers, codegen, backend 0..n
 * of n kernels, the cache write), all with its id and before its answer; a
 * request that does not ask gets none, even cold; a warm answer may come
 * with none; an Envelope a client sends with a Progress in it, and a frame
 * that is no Envelope, are answered ERR_BAD_MESSAGE as before, the
 * connection still serving. */
START_TEST(progress_events)
{
	daemon_t d;
	buf_t b = { 0 };
	Apollo__Envelope *r, env = APOLLO__ENVELOPE__INIT;
	Apollo__Progress pg = APOLLO__PROGRESS__INIT;
	unsigned seen;
	int fd, events;

	start(&d);
	fd = open_unix(d.sock);
	ck_assert_int_ge(fd, 0);
	put_compile_progress(&b, 7, 64, 0, true);   /* cold, small frame */
	send_buf(fd, &b);
	r = progress_until_answer(fd, 7, &events, &seen);
	ck_assert_int_eq(r->compiled->bundle->stats->cache_hit, 0);
	apollo__envelope__free_unpacked(r, NULL);
	ck_assert_int_ge(events, 5);
	/* import, partition, layer I, codegen, backend, cache */
	ck_assert_uint_eq(seen & 0x3c3, 0x3c3);

	put_compile_progress(&b, 8, 96, PAD_BYTES, true);   /* cold, a decode job */
	send_buf(fd, &b);
	r = progress_until_answer(fd, 8, &events, &seen);
	apollo__envelope__free_unpacked(r, NULL);
	ck_assert_uint_eq(seen & 0x3c3, 0x3c3);

	put_compile(&b, 9, 128, 0);                 /* cold, not asked: none */
	send_buf(fd, &b);
	r = next_reply(fd);
	ck_assert_ptr_nonnull(r);
	expect_bundle(r, 9);
	ck_assert_int_eq(r->compiled->bundle->stats->cache_hit, 0);
	apollo__envelope__free_unpacked(r, NULL);

	put_compile_progress(&b, 10, 64, 0, true);  /* warm: events optional */
	send_buf(fd, &b);
	r = progress_until_answer(fd, 10, &events, &seen);
	ck_assert_int_eq(r->compiled->bundle->stats->cache_hit, 1);
	apollo__envelope__free_unpacked(r, NULL);

	env.id = 11;                                /* a client's Progress: refused */
	env.msg_case = APOLLO__ENVELOPE__MSG_PROGRESS;
	env.progress = &pg;
	pg.stage = "import";
	put_env(&b, &env, 0);
	put_garbage(&b, 100);
	put_ping(&b, 12, 0);
	send_buf(fd, &b);
	r = next_reply(fd);
	ck_assert_ptr_nonnull(r);
	ck_assert_uint_eq(r->id, 11);
	ck_assert_int_eq(r->msg_case, APOLLO__ENVELOPE__MSG_ERROR);
	ck_assert_int_eq(r->error->code, APOLLO__ERROR_CODE__ERR_BAD_MESSAGE);
	apollo__envelope__free_unpacked(r, NULL);
	r = next_reply(fd);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(r->msg_case, APOLLO__ENVELOPE__MSG_ERROR);
	ck_assert_int_eq(r->error->code, APOLLO__ERROR_CODE__ERR_BAD_MESSAGE);
	apollo__envelope__free_unpacked(r, NULL);
	expect_pong(fd, 12);
	close(fd);
	stop(&d);
}
END_TEST

static Suite *net_suite(void)
{
	Suite *s = suite_create("net");
	TCase *tc = tcase_create("big_frames");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, big_frames_keep_order);
	tcase_add_test(tc, big_frame_client_leaves);
	tcase_add_test(tc, big_frames_sigterm);
	tcase_add_test(tc, known_request_without_graph);
	tcase_add_test(tc, progress_events);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(net_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
