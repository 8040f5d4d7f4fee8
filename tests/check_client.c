/* check_client.c -- libapollo-client without a daemon: framing over a
 * socketpair (oversized, zero, truncated replies), the request/reply
 * protocol against a scripted fake server thread (handshake, ping, stats,
 * submit, error replies, id and type mismatches, garbage), the JSON
 * and text reports (with --explain: launches, buffers read and written,
 * boundaries, escaping), writing test data back (encode, save, model
 * link), the output comparison (tolerance, NaN, inf, shapes), and the ONNX
 * input/output walker.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/apollo.h"
#include "client/explain_html.h"
#include "client/tool.h"
#include "common/frame.h"
#include "proto/apollo.pb-c.h"
#include "tests/lib/require.h"

/* ---- helpers -------------------------------------------------------------------- */

static void pair(int fds[2])
{
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
}

static void write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);
		ck_assert_int_gt(n, 0);
		p += n;
		len -= (size_t)n;
	}
}

static void send_env(int fd, const Apollo__Envelope *env)
{
	size_t n = apollo__envelope__get_packed_size(env);
	uint8_t *buf = malloc(n ? n : 1);

	apollo__envelope__pack(env, buf);
	ck_assert_int_eq(ap_client_write_frame(fd, buf, n, NULL), 0);
	free(buf);
}

/* ---- framing ------------------------------------------------------------------------ */

START_TEST(frame_round_trip)
{
	int fds[2];
	uint8_t msg[300], *got;
	uint32_t len;
	ap_error err;

	pair(fds);
	for (size_t i = 0; i < sizeof(msg); i++)
		msg[i] = (uint8_t)(i * 7);
	ck_assert_int_eq(ap_client_write_frame(fds[0], msg, sizeof(msg), &err), 0);
	ck_assert_int_eq(ap_client_read_frame(fds[1], 1000, &got, &len, &err), 0);
	ck_assert_uint_eq(len, sizeof(msg));
	ck_assert_mem_eq(got, msg, sizeof(msg));
	free(got);
	/* A zero-length message cannot be framed. */
	ck_assert_int_eq(ap_client_write_frame(fds[0], msg, 0, &err), AP_ETOOLARGE);
	close(fds[0]);
	close(fds[1]);
}
END_TEST

START_TEST(frame_oversized_rejected_before_reading)
{
	int fds[2];
	uint8_t hdr[4], *got = (uint8_t *)1;
	uint32_t len = 7;
	ap_error err;
	struct timeval tv = { 5, 0 };

	pair(fds);
	/* The header announces 3 GiB and nothing follows; the socket stays
	 * open.  A reader that allocated and waited for the payload would
	 * block (and time out with AP_EIO); the limit must fire first. */
	setsockopt(fds[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	ap_frame_put_len(hdr, 3u << 30);
	write_all(fds[0], hdr, 4);
	ck_assert_int_eq(ap_client_read_frame(fds[1], 1 << 20, &got, &len, &err), AP_ETOOLARGE);
	ck_assert_ptr_null(got);
	ck_assert_uint_eq(len, 0);
	ck_assert_int_eq(err.code, AP_ETOOLARGE);
	ck_assert_ptr_nonnull(strstr(err.msg, "3221225472"));
	close(fds[0]);
	close(fds[1]);
}
END_TEST

START_TEST(frame_zero_length)
{
	int fds[2];
	uint8_t hdr[4] = { 0, 0, 0, 0 }, *got;
	uint32_t len;
	ap_error err;

	pair(fds);
	write_all(fds[0], hdr, 4);
	ck_assert_int_eq(ap_client_read_frame(fds[1], 100, &got, &len, &err), AP_EFRAME);
	close(fds[0]);
	close(fds[1]);
}
END_TEST

START_TEST(frame_truncated_payload)
{
	int fds[2];
	uint8_t hdr[4], body[10] = { 1 }, *got;
	uint32_t len;
	ap_error err;

	pair(fds);
	ap_frame_put_len(hdr, 100);
	write_all(fds[0], hdr, 4);
	write_all(fds[0], body, sizeof(body));
	close(fds[0]);
	ck_assert_int_eq(ap_client_read_frame(fds[1], 1000, &got, &len, &err), AP_EFRAME);
	ck_assert_ptr_nonnull(strstr(err.msg, "10 of 100"));
	close(fds[1]);
}
END_TEST

START_TEST(frame_truncated_header)
{
	int fds[2];
	uint8_t hdr[2] = { 0, 0 }, *got;
	uint32_t len;
	ap_error err;

	pair(fds);
	write_all(fds[0], hdr, 2);
	close(fds[0]);
	ck_assert_int_eq(ap_client_read_frame(fds[1], 1000, &got, &len, &err), AP_EFRAME);
	close(fds[1]);
}
END_TEST

START_TEST(frame_closed_without_reply)
{
	int fds[2];
	uint8_t *got;
	uint32_t len;
	ap_error err;

	pair(fds);
	close(fds[0]);
	ck_assert_int_eq(ap_client_read_frame(fds[1], 1000, &got, &len, &err), AP_EIO);
	close(fds[1]);
}
END_TEST

/* A family as the daemon sends one: two samples, labels in its order. */
static Apollo__MetricLabel lab_a = { PROTOBUF_C_MESSAGE_INIT(&apollo__metric_label__descriptor),
				     "tier", "l1" };
static Apollo__MetricLabel lab_b = { PROTOBUF_C_MESSAGE_INIT(&apollo__metric_label__descriptor),
				     "tier", "l2" };
static Apollo__MetricLabel *labs_a[1] = { &lab_a }, *labs_b[1] = { &lab_b };
static Apollo__MetricSample smp[2] = {
	{ PROTOBUF_C_MESSAGE_INIT(&apollo__metric_sample__descriptor), 1, labs_a, 7, "" },
	{ PROTOBUF_C_MESSAGE_INIT(&apollo__metric_sample__descriptor), 1, labs_b, 3, "" },
};
static Apollo__MetricSample *smps[2] = { &smp[0], &smp[1] };
static Apollo__MetricFamily fam = { PROTOBUF_C_MESSAGE_INIT(&apollo__metric_family__descriptor),
				    "apollo_compile_answers_total", "counter", "answers", 2, smps };
static Apollo__MetricFamily *fams[1] = { &fam };

/* ---- a scripted fake daemon ---------------------------------------------------------- */

enum fake_mode {
	FAKE_OK,            /* answers everything properly */
	FAKE_WRONG_ID,      /* echoes id + 1 */
	FAKE_WRONG_TYPE,    /* answers a ping with a StatsReply */
	FAKE_GARBAGE,       /* answers with bytes that are not an Envelope */
	FAKE_COMPILE_ERROR, /* CompileResponse.error */
	FAKE_ENVELOPE_ERROR,/* Envelope.error */
	FAKE_OLD_SCHEMA,    /* HelloReply with schema 7 */
	FAKE_HUGE,          /* a reply header over the client's limit */
	FAKE_HANGUP,        /* closes after reading the request */
	FAKE_AUTH,          /* the token handshake, knowing "s3cret" */
	FAKE_AUTH_WRONG,    /* the token handshake, knowing another token */
	FAKE_BUSY,          /* writes ERR_BUSY and closes, reading nothing */
};

typedef struct fake {
	int fd;
	enum fake_mode mode;
	int served;
	char last_target[32];
	int last_graph_tensors;
	uint8_t last_graph_hash[32];   /* ap_graph_hash_named of the graph sent */
	size_t last_graph_data;        /* bytes of tensor data the graph carried */
	int last_source;
	int last_bindings;
	bool last_no_cache;
	char hello_client[128];
	int last_fusion;
	char last_barrier[32];
	char last_keep_whole[32];
	uint8_t nc[AP_AUTH_NONCE_BYTES], ns[AP_AUTH_NONCE_BYTES], proof[AP_AUTH_PROOF_BYTES];
	int auth_ok;        /* client proofs that passed */
} fake;

static Apollo__Bundle *fake_bundle(void)
{
	static uint32_t grid[3] = { 4, 1, 1 }, block[3] = { 128, 1, 1 }, args[2] = { 0, 1 };
	static char *nodes[2] = { "add_0", "relu\"1\n" };
	static Apollo__KernelParam p0 = APOLLO__KERNEL_PARAM__INIT, p1 = APOLLO__KERNEL_PARAM__INIT;
	static Apollo__KernelParam *params[2];
	static Apollo__Kernel k = APOLLO__KERNEL__INIT;
	static Apollo__Kernel *kernels[1];
	static Apollo__Launch l = APOLLO__LAUNCH__INIT;
	static Apollo__Launch *plan[1];
	static int64_t dims[1] = { 512 };
	static Apollo__Buffer b0 = APOLLO__BUFFER__INIT, b1 = APOLLO__BUFFER__INIT;
	static Apollo__Buffer *bufs[2];
	static Apollo__Stats st = APOLLO__STATS__INIT;
	static Apollo__Bundle b = APOLLO__BUNDLE__INIT;
	static uint8_t blob[5] = "abcd";
	static char *onnx_nodes[2] = { "Add_0", "Relu_1" };
	static Apollo__Boundary bd = APOLLO__BOUNDARY__INIT;
	static Apollo__Boundary *bds[1];

	p0.name = "x"; p0.dtype = APOLLO__DATA_TYPE__DT_FLOAT;
	p1.name = "y"; p1.dtype = APOLLO__DATA_TYPE__DT_FLOAT; p1.written = 1;
	params[0] = &p0; params[1] = &p1;
	k.name = "fused_add_relu";
	k.target = "cpu";
	k.format = APOLLO__OUTPUT_KIND__OUTPUT_SO;
	k.blob.data = blob; k.blob.len = 4;
	k.n_grid = 3; k.grid = grid; k.n_block = 3; k.block = block;
	k.n_params = 2; k.params = params;
	k.n_nodes = 2; k.nodes = nodes;
	kernels[0] = &k;
	l.kernel = 0; l.n_args = 2; l.args = args;
	l.n_nodes = 2; l.nodes = onnx_nodes; l.category = "elementwise";
	plan[0] = &l;
	bd.producer = 0; bd.consumer = 0; bd.tensor = "t1"; bd.reason = "opaque";
	bd.detail = "MatMul keeps its own kernel";
	bds[0] = &bd;
	b0.name = "x"; b0.kind = APOLLO__BUFFER_KIND__BUF_INPUT; b0.dtype = APOLLO__DATA_TYPE__DT_FLOAT;
	b0.n_dims = 1; b0.dims = dims; b0.bytes = 2048; b0.index = 0;
	b1.name = "y"; b1.kind = APOLLO__BUFFER_KIND__BUF_OUTPUT; b1.dtype = APOLLO__DATA_TYPE__DT_FLOAT;
	b1.n_dims = 1; b1.dims = dims; b1.bytes = 2048; b1.index = 0;
	bufs[0] = &b0; bufs[1] = &b1;
	st.kernels = 1; st.eager_kernels = 2; st.nodes = 2;
	st.compile_ms = 12.5; st.codegen_ms = 1.25; st.backend_ms = 10; st.cache_hit = 0;
	st.global_bytes = 4096; st.eager_bytes = 8192;
	b.target = "cpu";
	b.format = APOLLO__OUTPUT_KIND__OUTPUT_SO;
	b.n_kernels = 1; b.kernels = kernels;
	b.n_plan = 1; b.plan = plan;
	b.n_buffers = 2; b.buffers = bufs;
	b.stats = &st;
	b.n_boundaries = 1; b.boundaries = bds;
	return &b;
}

static void *fake_main(void *arg)
{
	fake *f = arg;

	if (f->mode == FAKE_BUSY) {
		Apollo__Envelope rep = APOLLO__ENVELOPE__INIT;
		Apollo__Error e = APOLLO__ERROR__INIT;

		e.code = APOLLO__ERROR_CODE__ERR_BUSY;
		e.message = "apollod serves at most 1 clients at once";
		rep.msg_case = APOLLO__ENVELOPE__MSG_ERROR;
		rep.error = &e;
		send_env(f->fd, &rep);
		close(f->fd);
		return NULL;
	}
	for (;;) {
		uint8_t *buf;
		uint32_t len;
		Apollo__Envelope *req, rep = APOLLO__ENVELOPE__INIT;
		Apollo__HelloReply hr = APOLLO__HELLO_REPLY__INIT;
		Apollo__PingReply pr = APOLLO__PING_REPLY__INIT;
		Apollo__StatsReply sr = APOLLO__STATS_REPLY__INIT;
		Apollo__CompileResponse cr = APOLLO__COMPILE_RESPONSE__INIT;
		Apollo__Error e = APOLLO__ERROR__INIT;
		static char *targets[2] = { "cpu", "sm_90" };

		if (ap_client_read_frame(f->fd, 1 << 24, &buf, &len, NULL) < 0)
			break;
		req = apollo__envelope__unpack(NULL, len, buf);
		free(buf);
		if (!req)
			break;
		f->served++;
		rep.id = req->id;
		if (f->mode == FAKE_HANGUP) {
			apollo__envelope__free_unpacked(req, NULL);
			break;
		}
		switch (req->msg_case) {
		case APOLLO__ENVELOPE__MSG_HELLO:
			snprintf(f->hello_client, sizeof(f->hello_client), "%s", req->hello->client);
			if ((f->mode == FAKE_AUTH || f->mode == FAKE_AUTH_WRONG) &&
			    req->hello->auth_nonce.len == AP_AUTH_NONCE_BYTES) {
				const char *tok = f->mode == FAKE_AUTH ? "s3cret" : "guess";
				memcpy(f->nc, req->hello->auth_nonce.data, AP_AUTH_NONCE_BYTES);
				ck_assert_int_eq(ap_random_bytes(f->ns, AP_AUTH_NONCE_BYTES), 0);
				ck_assert_int_eq(ap_auth_proof(tok, AP_AUTH_SERVER, f->nc, f->ns, f->proof), 0);
				hr.schema_version = APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT;
				hr.server = "fake 1.0";
				hr.auth_nonce.data = f->ns;
				hr.auth_nonce.len = AP_AUTH_NONCE_BYTES;
				hr.auth_proof.data = f->proof;
				hr.auth_proof.len = AP_AUTH_PROOF_BYTES;
				rep.msg_case = APOLLO__ENVELOPE__MSG_HELLO_REPLY;
				rep.hello_reply = &hr;
				break;
			}
			if (f->mode == FAKE_AUTH &&
			    ap_auth_check("s3cret", AP_AUTH_CLIENT, f->nc, f->ns,
					  req->hello->auth_proof.data, req->hello->auth_proof.len))
				f->auth_ok++;
			hr.schema_version = f->mode == FAKE_OLD_SCHEMA ? 7 : APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT;
			hr.server = "fake 1.0";
			hr.nvrtc_version = "12.4";
			hr.n_targets = 2;
			hr.targets = targets;
			rep.msg_case = APOLLO__ENVELOPE__MSG_HELLO_REPLY;
			rep.hello_reply = &hr;
			break;
		case APOLLO__ENVELOPE__MSG_PING:
			if (f->mode == FAKE_WRONG_TYPE) {
				rep.msg_case = APOLLO__ENVELOPE__MSG_STATS_REPLY;
				rep.stats_reply = &sr;
			} else {
				pr.server = "fake 1.0";
				rep.msg_case = APOLLO__ENVELOPE__MSG_PONG;
				rep.pong = &pr;
			}
			break;
		case APOLLO__ENVELOPE__MSG_STATS:
			sr.n_metrics = 1;
			sr.metrics = fams;
			sr.requests = 42;
			sr.cache_hits = 40;
			sr.cache_misses = 2;
			sr.clients = 3;
			sr.uptime_s = 1.5;
			rep.msg_case = APOLLO__ENVELOPE__MSG_STATS_REPLY;
			rep.stats_reply = &sr;
			break;
		case APOLLO__ENVELOPE__MSG_COMPILE:
			snprintf(f->last_target, sizeof(f->last_target), "%s", req->compile->target);
			f->last_source = req->compile->source_case;
			f->last_graph_tensors = req->compile->source_case ==
							APOLLO__COMPILE_REQUEST__SOURCE_GRAPH
						? (int)req->compile->graph->n_tensors
						: -1;
			memset(f->last_graph_hash, 0, sizeof(f->last_graph_hash));
			f->last_graph_data = 0;
			if (req->compile->source_case == APOLLO__COMPILE_REQUEST__SOURCE_GRAPH) {
				ap_graph *sent = ap_graph_from_pb(req->compile->graph, NULL);

				if (sent)
					ap_graph_hash_named(sent, f->last_graph_hash);
				ap_graph_free(sent);
				for (size_t t = 0; t < req->compile->graph->n_tensors; t++)
					f->last_graph_data += req->compile->graph->tensors[t]->data.len;
			}
			f->last_bindings = (int)req->compile->n_bindings;
			f->last_no_cache = req->compile->options && req->compile->options->no_cache;
			if (req->compile->options) {
				const Apollo__CompileOptions *o = req->compile->options;
				f->last_fusion = o->fusion;
				snprintf(f->last_barrier, sizeof(f->last_barrier), "%s",
					 o->n_fusion_barriers ? o->fusion_barriers[o->n_fusion_barriers - 1] : "");
				snprintf(f->last_keep_whole, sizeof(f->last_keep_whole), "%s",
					 o->n_keep_whole ? o->keep_whole[0] : "");
			}
			rep.msg_case = APOLLO__ENVELOPE__MSG_COMPILED;
			rep.compiled = &cr;
			if (f->mode == FAKE_COMPILE_ERROR) {
				e.code = APOLLO__ERROR_CODE__ERR_UNSUPPORTED;
				e.message = "unknown op 'Frobnicate'";
				e.node = "frob_3";
				cr.result_case = APOLLO__COMPILE_RESPONSE__RESULT_ERROR;
				cr.error = &e;
			} else {
				cr.result_case = APOLLO__COMPILE_RESPONSE__RESULT_BUNDLE;
				cr.bundle = fake_bundle();
			}
			break;
		default:
			break;
		}
		if (f->mode == FAKE_ENVELOPE_ERROR && req->msg_case != APOLLO__ENVELOPE__MSG_HELLO) {
			e.code = APOLLO__ERROR_CODE__ERR_SHAPE;
			e.message = "mismatched shapes";
			e.tensor = "t7";
			rep.msg_case = APOLLO__ENVELOPE__MSG_ERROR;
			rep.error = &e;
		}
		if (f->mode == FAKE_WRONG_ID && req->msg_case != APOLLO__ENVELOPE__MSG_HELLO)
			rep.id = req->id + 1;
		apollo__envelope__free_unpacked(req, NULL);
		if (f->mode == FAKE_GARBAGE && rep.msg_case != APOLLO__ENVELOPE__MSG_HELLO_REPLY) {
			uint8_t junk[7] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
			ap_client_write_frame(f->fd, junk, sizeof(junk), NULL);
			continue;
		}
		if (f->mode == FAKE_HUGE && rep.msg_case != APOLLO__ENVELOPE__MSG_HELLO_REPLY) {
			uint8_t hdr[4];
			ap_frame_put_len(hdr, 0x7fffffff);
			write_all(f->fd, hdr, 4);
			continue;
		}
		send_env(f->fd, &rep);
	}
	close(f->fd);
	return NULL;
}

typedef struct fake_run {
	fake f;
	pthread_t tid;
	ap_client *c;
} fake_run;

/* Starts a fake daemon; with `hello` the client performs the handshake. */
static void fake_start(fake_run *r, enum fake_mode mode, bool hello, ap_error *err)
{
	int fds[2];

	memset(r, 0, sizeof(*r));
	pair(fds);
	r->f.fd = fds[1];
	r->f.mode = mode;
	ck_assert_int_eq(pthread_create(&r->tid, NULL, fake_main, &r->f), 0);
	r->c = ap_client_from_fd(fds[0], hello, err);
}

static void fake_stop(fake_run *r)
{
	r->c = ap_client_free(r->c);
	pthread_join(r->tid, NULL);
}

START_TEST(handshake_ping_stats)
{
	fake_run r;
	ap_error err;
	char server[64];
	ap_server_stats st;

	fake_start(&r, FAKE_OK, true, &err);
	ck_assert_ptr_nonnull(r.c);
	ck_assert_str_eq(ap_client_server(r.c), "fake 1.0");
	ck_assert_str_eq(ap_client_nvrtc_version(r.c), "12.4");
	ck_assert_int_eq(ap_client_n_targets(r.c), 2);
	ck_assert_str_eq(ap_client_target(r.c, 1), "sm_90");
	ck_assert_ptr_null(ap_client_target(r.c, 2));
	ck_assert_int_eq(ap_client_ping(r.c, server, sizeof(server), &err), 0);
	ck_assert_str_eq(server, "fake 1.0");
	ck_assert_int_eq(ap_client_stats(r.c, &st, &err), 0);
	ck_assert_uint_eq(st.requests, 42);
	ck_assert_uint_eq(st.cache_hits, 40);
	ck_assert_uint_eq(st.clients, 3);
	ck_assert_double_eq_tol(st.uptime_s, 1.5, 1e-12);
	/* The metrics, by family, suffix and labels. */
	{
		ap_metrics *m = NULL;
		double v = 0;

		ck_assert_int_eq(ap_client_stats_metrics(r.c, &st, &m, &err), 0);
		ck_assert_uint_eq(st.requests, 42);
		ck_assert_int_eq(ap_metrics_value(m, "apollo_compile_answers_total", "tier=l2", &v), 0);
		ck_assert_double_eq(v, 3);
		ck_assert_int_eq(ap_metrics_value(m, "apollo_compile_answers_total", "tier=l1", &v), 0);
		ck_assert_double_eq(v, 7);
		ck_assert_int_eq(ap_metrics_value(m, "apollo_compile_answers_total", "tier=l3", &v),
				 AP_EINVAL);
		ck_assert_int_eq(ap_metrics_value(m, "apollo_compile_answers_total", NULL, &v),
				 AP_EINVAL);
		ck_assert_int_eq(ap_metrics_value(m, "apollo_compile_answers_total_count", "tier=l1",
						  &v), AP_EINVAL);
		ck_assert_int_eq(ap_metrics_value(m, "apollo_compile", "tier=l1", &v), AP_EINVAL);
		ap_metrics_free(m);
	}
	/* Several calls on one connection. */
	for (int i = 0; i < 5; i++)
		ck_assert_int_eq(ap_client_ping(r.c, NULL, 0, &err), 0);
	fake_stop(&r);
	ck_assert_int_eq(r.f.served, 9);
}
END_TEST

/* Issue 11, item 2: with a token the client and the daemon prove to each
 * other that they know it; the token itself never travels. */
START_TEST(token_handshake)
{
	fake_run r;
	ap_error err;
	int fds[2];

	/* the fake knows the token: connected, and it saw a valid proof */
	memset(&r, 0, sizeof(r));
	pair(fds);
	r.f.fd = fds[1];
	r.f.mode = FAKE_AUTH;
	ck_assert_int_eq(pthread_create(&r.tid, NULL, fake_main, &r.f), 0);
	r.c = ap_client_from_fd_token(fds[0], true, "s3cret", &err);
	ck_assert_msg(r.c != NULL, "%s", err.msg);
	ck_assert_ptr_null(strstr(r.f.hello_client, "s3cret"));
	ck_assert_int_eq(ap_client_ping(r.c, NULL, 0, &err), 0);
	fake_stop(&r);
	ck_assert_int_eq(r.f.auth_ok, 1);
	ck_assert_int_eq(r.f.served, 3);   /* Hello, Hello with the proof, ping */

	/* a server that does not know the token is refused before anything
	 * else is sent to it */
	memset(&r, 0, sizeof(r));
	pair(fds);
	r.f.fd = fds[1];
	r.f.mode = FAKE_AUTH_WRONG;
	ck_assert_int_eq(pthread_create(&r.tid, NULL, fake_main, &r.f), 0);
	r.c = ap_client_from_fd_token(fds[0], true, "s3cret", &err);
	ck_assert_ptr_null(r.c);
	ck_assert_int_eq(err.code, AP_EVERSION);
	ck_assert_ptr_nonnull(strstr(err.msg, "did not prove"));
	fake_stop(&r);
	ck_assert_int_eq(r.f.served, 1);

	/* ... and so is a plain daemon that answers without a proof */
	memset(&r, 0, sizeof(r));
	pair(fds);
	r.f.fd = fds[1];
	ck_assert_int_eq(pthread_create(&r.tid, NULL, fake_main, &r.f), 0);
	r.c = ap_client_from_fd_token(fds[0], true, "s3cret", &err);
	ck_assert_ptr_null(r.c);
	ck_assert_int_eq(err.code, AP_EVERSION);
	fake_stop(&r);

	/* without a token: a plain Hello */
	fake_start(&r, FAKE_OK, true, &err);
	ck_assert_ptr_nonnull(r.c);
	fake_stop(&r);
}
END_TEST

/* Issue 11, item 10: a daemon that refuses a client (too many clients)
 * writes ERR_BUSY and closes before reading anything; the client's next
 * write fails with EPIPE, and it printed "Broken pipe" instead of the
 * daemon's reason, which is waiting in its receive buffer. */
START_TEST(busy_reason_after_broken_pipe)
{
	fake_run r;
	ap_error err;

	fake_start(&r, FAKE_BUSY, false, &err);
	ck_assert_ptr_nonnull(r.c);
	pthread_join(r.tid, NULL);   /* it has written and closed */
	ck_assert_int_eq(ap_client_ping(r.c, NULL, 0, &err), AP_EBUSY);
	ck_assert_str_eq(err.msg, "apollod serves at most 1 clients at once");
	r.c = ap_client_free(r.c);
}
END_TEST

/* A listener that serves each connection one Hello and one more request,
 * then closes it, as apollod does with a connection idle for too long. */
struct idle_server {
	int listener, accepted;
};

static void *idle_server_main(void *arg)
{
	struct idle_server *sv = arg;

	for (int k = 0; k < 2; k++) {
		int c = accept(sv->listener, NULL, NULL);

		if (c < 0)
			break;
		sv->accepted++;
		for (int i = 0; i < 2; i++) {
			uint8_t *buf;
			uint32_t len;
			Apollo__Envelope *req, rep = APOLLO__ENVELOPE__INIT;
			Apollo__HelloReply hr = APOLLO__HELLO_REPLY__INIT;
			Apollo__PingReply pr = APOLLO__PING_REPLY__INIT;

			if (ap_client_read_frame(c, 1 << 20, &buf, &len, NULL) < 0)
				break;
			req = apollo__envelope__unpack(NULL, len, buf);
			free(buf);
			rep.id = req->id;
			if (req->msg_case == APOLLO__ENVELOPE__MSG_HELLO) {
				hr.schema_version = APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT;
				hr.server = "idle";
				rep.msg_case = APOLLO__ENVELOPE__MSG_HELLO_REPLY;
				rep.hello_reply = &hr;
			} else {
				pr.server = "idle";
				rep.msg_case = APOLLO__ENVELOPE__MSG_PONG;
				rep.pong = &pr;
			}
			apollo__envelope__free_unpacked(req, NULL);
			send_env(c, &rep);
		}
		close(c);
	}
	return NULL;
}

/* The daemon closes a connection idle for idle_timeout_ms; the next call
 * opens a new one by itself and repeats its request. */
START_TEST(reconnects_after_idle_close)
{
	char dir[] = "/tmp/apollo-client-XXXXXX", path[96];
	struct sockaddr_un a;
	struct idle_server sv = { 0 };
	pthread_t tid;
	ap_client *c;
	ap_error err;
	char server[32];

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/s", dir);
	memset(&a, 0, sizeof(a));
	a.sun_family = AF_UNIX;
	memcpy(a.sun_path, path, strlen(path) + 1);
	sv.listener = socket(AF_UNIX, SOCK_STREAM, 0);
	ck_assert_int_eq(bind(sv.listener, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(listen(sv.listener, 4), 0);
	ck_assert_int_eq(pthread_create(&tid, NULL, idle_server_main, &sv), 0);
	c = ap_client_connect(path, &err);
	ck_assert_msg(c != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_client_ping(c, server, sizeof(server), &err), 0);
	/* the server has closed the connection now; the next ping reconnects */
	ck_assert_msg(ap_client_ping(c, server, sizeof(server), &err) == 0, "%s", err.msg);
	ck_assert_str_eq(server, "idle");
	ap_client_free(c);
	pthread_join(tid, NULL);
	ck_assert_int_eq(sv.accepted, 2);
	close(sv.listener);
	unlink(path);
	rmdir(dir);
}
END_TEST

START_TEST(version_mismatch)
{
	fake_run r;
	ap_error err;

	fake_start(&r, FAKE_OLD_SCHEMA, true, &err);
	ck_assert_ptr_null(r.c);
	ck_assert_int_eq(err.code, AP_EVERSION);
	ck_assert_ptr_nonnull(strstr(err.msg, "7"));
	fake_stop(&r);
}
END_TEST

static ap_graph *tiny_graph(void)
{
	ap_graph *g = ap_graph_new("tiny");
	int64_t dims[1] = { 512 };
	int x, y;

	x = ap_graph_add_tensor(g, "x", AP_DT_F32, 1, dims, AP_TENSOR_INPUT, NULL, 0);
	y = ap_graph_add_tensor(g, "y", AP_DT_F32, 1, dims, AP_TENSOR_VALUE, NULL, 0);
	ck_assert_int_ge(ap_graph_add_node(g, "relu", AP_OP_RELU, 1, &x, 1, &y), 0);
	g->inputs = malloc(sizeof(int));
	g->inputs[0] = x;
	g->n_inputs = 1;
	g->outputs = malloc(sizeof(int));
	g->outputs[0] = y;
	g->n_outputs = 1;
	g->tensors[y].is_output = true;
	return g;
}

START_TEST(submit_graph_and_accessors)
{
	fake_run r;
	ap_error err;
	ap_graph *g = tiny_graph();
	static const char *barriers[2] = { "n1", "n2" }, *whole[1] = { "Softmax" };
	ap_submit_options opt = { .target = "sm_90", .output = AP_OUTPUT_CUBIN, .no_cache = true,
				  .fusion = AP_FUSION_RULES, .n_fusion_barriers = 2,
				  .fusion_barriers = barriers, .n_keep_whole = 1,
				  .keep_whole = whole };
	ap_bundle *b, *b2;
	ap_bundle_kernel k;
	ap_bundle_param p;
	ap_bundle_buffer bf;
	ap_bundle_stats st;
	unsigned kernel;
	int n_args;
	const uint32_t *args;
	uint8_t *packed;
	size_t plen;

	fake_start(&r, FAKE_OK, true, &err);
	b = ap_client_submit_graph(r.c, g, &opt, &err);
	ck_assert_ptr_nonnull(b);
	ck_assert_str_eq(r.f.last_target, "sm_90");
	ck_assert_int_eq(r.f.last_source, APOLLO__COMPILE_REQUEST__SOURCE_GRAPH);
	ck_assert_int_eq(r.f.last_graph_tensors, 2);
	ck_assert(r.f.last_no_cache);
	ck_assert_int_eq(r.f.last_fusion, AP_FUSION_RULES);
	ck_assert_str_eq(r.f.last_barrier, "n2");
	ck_assert_str_eq(r.f.last_keep_whole, "Softmax");
	ck_assert_str_eq(ap_bundle_target(b), "cpu");
	ck_assert_int_eq(ap_bundle_n_kernels(b), 1);
	ck_assert_int_eq(ap_bundle_kernel_get(b, 0, &k), 0);
	ck_assert_str_eq(k.name, "fused_add_relu");
	ck_assert_uint_eq(k.grid[0], 4);
	ck_assert_uint_eq(k.block[0], 128);
	ck_assert_uint_eq(k.blob_bytes, 4);
	ck_assert_int_eq(k.n_nodes, 2);
	ck_assert_str_eq(k.nodes[0], "add_0");
	ck_assert_int_eq(ap_bundle_kernel_get(b, 1, &k), AP_EINVAL);
	ck_assert_int_eq(ap_bundle_kernel_param(b, 0, 1, &p), 0);
	ck_assert_str_eq(p.name, "y");
	ck_assert(p.written);
	ck_assert_int_eq(ap_bundle_kernel_param(b, 0, 2, &p), AP_EINVAL);
	ck_assert_int_eq(ap_bundle_n_launches(b), 1);
	ck_assert_int_eq(ap_bundle_launch(b, 0, &kernel, &n_args, &args), 0);
	ck_assert_uint_eq(kernel, 0);
	ck_assert_int_eq(n_args, 2);
	ck_assert_uint_eq(args[1], 1);
	{
		int nn;
		const char *const *nodes;
		const char *cat;
		ap_bundle_boundary bd;
		ck_assert_int_eq(ap_bundle_launch_nodes(b, 0, &nn, &nodes, &cat), 0);
		ck_assert_int_eq(nn, 2);
		ck_assert_str_eq(nodes[1], "Relu_1");
		ck_assert_str_eq(cat, "elementwise");
		ck_assert_int_eq(ap_bundle_launch_nodes(b, 1, &nn, &nodes, &cat), AP_EINVAL);
		ck_assert_int_eq(ap_bundle_n_boundaries(b), 1);
		ck_assert_int_eq(ap_bundle_boundary_get(b, 0, &bd), 0);
		ck_assert_str_eq(bd.reason, "opaque");
		ck_assert_str_eq(bd.tensor, "t1");
		ck_assert_int_eq(ap_bundle_boundary_get(b, 1, &bd), AP_EINVAL);
	}
	ck_assert_int_eq(ap_bundle_n_buffers(b), 2);
	ck_assert_int_eq(ap_bundle_buffer_get(b, 1, &bf), 0);
	ck_assert_str_eq(bf.name, "y");
	ck_assert_int_eq(bf.kind, AP_BUNDLE_BUF_OUTPUT);
	ck_assert_int_eq(bf.rank, 1);
	ck_assert_int_eq(bf.dims[0], 512);
	ck_assert_uint_eq(bf.bytes, 2048);
	ap_bundle_stats_get(b, &st);
	ck_assert_uint_eq(st.eager_kernels, 2);
	ck_assert_double_eq_tol(st.compile_ms, 12.5, 1e-9);
	ck_assert(!st.cache_hit);
	/* Pack and unpack give the same bundle. */
	ck_assert_int_eq(ap_bundle_pack(b, &packed, &plen), 0);
	b2 = ap_bundle_unpack(packed, plen, &err);
	ck_assert_ptr_nonnull(b2);
	ck_assert_int_eq(ap_bundle_kernel_get(b2, 0, &k), 0);
	ck_assert_str_eq(k.name, "fused_add_relu");
	free(packed);
	ap_bundle_free(b2);
	ck_assert_ptr_null(ap_bundle_unpack((const uint8_t *)"\xff\xff\xff", 3, &err));
	ck_assert_int_eq(err.code, AP_EMESSAGE);
	ap_bundle_free(b);
	ap_bundle_free(NULL);

	/* ONNX bytes with bindings: an int64 binding travels as a CONST. */
	{
		int64_t shape[2] = { 2, 256 };
		ap_host_tensor t = { .name = "shape", .dtype = AP_DT_I64, .rank = 1, .dims = { 2 },
				     .data = shape, .nbytes = sizeof(shape) };
		const ap_host_tensor *bind[1] = { &t };
		static const uint8_t model[] = { 0x08, 0x07 };
		b = ap_client_submit_onnx(r.c, model, sizeof(model), bind, 1, NULL, &err);
		ck_assert_ptr_nonnull(b);
		ck_assert_int_eq(r.f.last_source, APOLLO__COMPILE_REQUEST__SOURCE_ONNX_MODEL);
		ck_assert_int_eq(r.f.last_bindings, 1);
		ck_assert_str_eq(r.f.last_target, "cpu");
		ap_bundle_free(b);
	}
	fake_stop(&r);
	ap_graph_free(g);
}
END_TEST

/* A model file submitted from its structure alone (mapped, weights never
 * read): the graph sent is the one a full import makes. */
START_TEST(submit_onnx_file)
{
	const char *td = getenv("APOLLO_TESTDATA");
	char path[1024], empty[64];
	const uint8_t *buf;
	size_t len;
	fake_run r;
	ap_error err;
	ap_bundle *b;
	ap_graph *g;
	ap_params *params = NULL;
	uint8_t want[32];
	size_t weights = 0;
	int fd;

	snprintf(path, sizeof(path), "%s/models/mlp_gelu_ln/model.onnx",
		 td && *td ? td : "../shared/testdata");
	ck_assert_int_eq(ap_file_map(path, 1 << 30, &buf, &len, &err), 0);
	ck_assert_uint_gt(len, 6000000);
	g = ap_onnx_import(buf, len, NULL, 0, &params, &err);
	ck_assert_ptr_nonnull(g);
	ck_assert_int_gt(params->n, 0);
	ap_file_unmap(buf, len);
	ck_assert_int_eq(ap_file_map(path, 1000, &buf, &len, &err), AP_ETOOLARGE);
	ck_assert_int_eq(ap_file_map("/nonexistent/model.onnx", 1000, &buf, &len, &err), AP_EIO);
	snprintf(empty, sizeof(empty), "/tmp/apollo-empty-XXXXXX");
	fd = mkstemp(empty);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(ap_file_map(empty, 1000, &buf, &len, &err), 0);
	ck_assert_uint_eq(len, 0);
	ap_file_unmap(buf, len);
	unlink(empty);

	/* The graph sent is the full import's, hash for hash, and carries
	 * only the small constants by value: none of the weights' 6 MB. */
	ck_assert_int_eq(ap_graph_hash_named(g, want), 0);
	for (int i = 0; i < params->n; i++)
		weights += params->items[i]->nbytes;
	ck_assert_uint_gt(weights, 6000000);
	fake_start(&r, FAKE_OK, true, &err);
	for (int k = 0; k < 3; k++) {   /* one kept connection, several submits */
		b = ap_client_submit_onnx_file(r.c, path, NULL, 0, NULL, &err);
		ck_assert_msg(b != NULL, "%s", err.msg);
		ck_assert_int_eq(r.f.last_source, APOLLO__COMPILE_REQUEST__SOURCE_GRAPH);
		ck_assert_int_eq(r.f.last_graph_tensors, g->n_tensors);
		ck_assert(!memcmp(r.f.last_graph_hash, want, sizeof(want)));
		ck_assert_uint_le(r.f.last_graph_data, 64 * AP_CONST_MAX_BYTES);
		ap_bundle_free(b);
	}
	ck_assert_ptr_null(ap_client_submit_onnx_file(r.c, "/nonexistent.onnx", NULL, 0, NULL, &err));
	ck_assert_int_eq(err.code, AP_EIO);
	fake_stop(&r);
	ck_assert_int_eq(r.f.served, 1 + 3);   /* one hello, three submits on it */
	ap_params_free(params);
	ap_graph_free(g);
}
END_TEST

START_TEST(submit_error_reply)
{
	fake_run r;
	ap_error err;
	ap_graph *g = tiny_graph();

	fake_start(&r, FAKE_COMPILE_ERROR, true, &err);
	ck_assert_ptr_null(ap_client_submit_graph(r.c, g, NULL, &err));
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	ck_assert_str_eq(err.msg, "unknown op 'Frobnicate'");
	ck_assert_str_eq(err.node, "frob_3");
	ck_assert_str_eq(err.tensor, "");
	/* The connection stays usable after an error reply. */
	ck_assert_int_eq(ap_client_ping(r.c, NULL, 0, &err), 0);
	fake_stop(&r);

	fake_start(&r, FAKE_ENVELOPE_ERROR, true, &err);
	ck_assert_ptr_null(ap_client_submit_graph(r.c, g, NULL, &err));
	ck_assert_int_eq(err.code, AP_ESHAPE);
	ck_assert_str_eq(err.tensor, "t7");
	fake_stop(&r);
	ap_graph_free(g);
}
END_TEST

START_TEST(bad_replies)
{
	static const struct {
		enum fake_mode mode;
		int code;
	} cases[] = {
		{ FAKE_WRONG_ID, AP_EMESSAGE },
		{ FAKE_WRONG_TYPE, AP_EMESSAGE },
		{ FAKE_GARBAGE, AP_EMESSAGE },
		{ FAKE_HUGE, AP_ETOOLARGE },
		{ FAKE_HANGUP, AP_EIO },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		fake_run r;
		ap_error err;
		fake_start(&r, cases[i].mode, cases[i].mode != FAKE_HANGUP, &err);
		ck_assert_ptr_nonnull(r.c);
		ap_client_set_max_frame(r.c, 1 << 20);
		ck_assert_int_eq(ap_client_ping(r.c, NULL, 0, &err), cases[i].code);
		ck_assert_int_eq(err.code, cases[i].code);
		/* After a broken exchange the connection is closed for good. */
		ck_assert_int_eq(ap_client_ping(r.c, NULL, 0, &err), AP_EIO);
		fake_stop(&r);
	}
}
END_TEST

START_TEST(connect_errors)
{
	ap_error err;
	char longpath[300];

	ck_assert_ptr_null(ap_client_connect("/nonexistent/dir/apollod.sock", &err));
	ck_assert_int_eq(err.code, AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/dir/apollod.sock"));
	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[0] = '/';
	longpath[sizeof(longpath) - 1] = 0;
	ck_assert_ptr_null(ap_client_connect(longpath, &err));
	ck_assert_int_eq(err.code, AP_ETOOLARGE);
	ck_assert_ptr_null(ap_client_connect("tcp:127.0.0.1:1", &err));
	ck_assert_int_eq(err.code, AP_EIO);
	ck_assert_int_eq(ap_client_error_from_wire(APOLLO__ERROR_CODE__ERR_TOO_LARGE), AP_ETOOLARGE);
	ck_assert_int_eq(ap_client_error_from_wire(99), AP_EINTERNAL);
	ck_assert_ptr_null(ap_client_free(NULL));
}
END_TEST

/* ---- JSON report ------------------------------------------------------------------------ */

START_TEST(json_report)
{
	Apollo__Bundle *pb = fake_bundle();
	size_t n = apollo__bundle__get_packed_size(pb);
	uint8_t *buf = malloc(n);
	ap_bundle *b;
	char *text = NULL;
	size_t tlen = 0;
	FILE *f;
	ap_report_info info = { .model = "dir/m\\odel.onnx", .import_ms = 1.5, .round_trip_ms = 20 };
	int depth = 0;

	apollo__bundle__pack(pb, buf);
	b = ap_bundle_unpack(buf, n, NULL);
	free(buf);
	ck_assert_ptr_nonnull(b);
	f = open_memstream(&text, &tlen);
	ap_report_json(f, b, &info);
	fclose(f);
	/* One line, one object. */
	ck_assert_int_eq(text[0], '{');
	ck_assert_int_eq(text[tlen - 1], '\n');
	ck_assert_ptr_null(memchr(text, '\n', tlen - 1));
	ck_assert_ptr_nonnull(strstr(text, "\"kernels\":1,\"distinct_kernels\":1,"));
	ck_assert_ptr_nonnull(strstr(text, "\"launch_list\":[{\"kernel\":0,\"name\":\"fused_add_relu\",\"category\":\"elementwise\",\"nodes\":[\"Add_0\",\"Relu_1\"],\"layers\":[],\"global_bytes\":0,\"recompute_ratio\":1.000}]"));
	ck_assert_ptr_null(strstr(text, "buffer_list"));
	ck_assert_ptr_nonnull(strstr(text, "\"boundaries\":1,"));
	ck_assert_ptr_null(strstr(text, "boundary_list"));
	ck_assert_ptr_nonnull(strstr(text, "\"eager_kernels\":2,"));
	ck_assert_ptr_nonnull(strstr(text, "\"cache\":\"miss\""));
	ck_assert_ptr_nonnull(strstr(text, "\"compile_ms\":12.500"));
	ck_assert_ptr_nonnull(strstr(text, "\"codegen_ms\":1.250"));
	ck_assert_ptr_nonnull(strstr(text, "\"backend_ms\":10.000"));
	ck_assert_ptr_nonnull(strstr(text, "\"client_import_ms\":1.500"));
	ck_assert_ptr_nonnull(strstr(text, "\"model\":\"dir/m\\\\odel.onnx\""));
	ck_assert_ptr_nonnull(strstr(text, "\"nodes\":[\"add_0\",\"relu\\\"1\\n\"]"));
	ck_assert_ptr_nonnull(strstr(text, "\"grid\":[4,1,1],\"block\":[128,1,1]"));
	ck_assert_ptr_nonnull(strstr(text, "\"blob_bytes\":4,"));
	/* Braces and brackets balance outside strings. */
	for (size_t i = 0; i < tlen; i++) {
		if (text[i] == '"') {
			for (i++; i < tlen && text[i] != '"'; i++)
				if (text[i] == '\\')
					i++;
			continue;
		}
		if (text[i] == '{' || text[i] == '[')
			depth++;
		if (text[i] == '}' || text[i] == ']')
			depth--;
		ck_assert_int_ge(depth, 0);
	}
	ck_assert_int_eq(depth, 0);
	free(text);

	/* Control characters become \u escapes; a hit says "hit". */
	text = NULL;
	f = open_memstream(&text, &tlen);
	ap_json_string(f, "a\x01z");
	fclose(f);
	ck_assert_str_eq(text, "\"a\\u0001z\"");
	free(text);
	((Apollo__Bundle *)ap_bundle_pb(b))->stats->cache_hit = 1;
	text = NULL;
	f = open_memstream(&text, &tlen);
	info.explain = true;
	ap_report_json(f, b, &info);
	fclose(f);
	ck_assert_ptr_nonnull(strstr(text, "\"cache\":\"hit\",\"cache_tier\":\"l1\""));
	ck_assert_ptr_nonnull(strstr(text, "\"boundary_list\":[{\"producer\":0,\"consumer\":0,\"tensor\":\"t1\",\"reason\":\"opaque\""));
	ck_assert_ptr_nonnull(strstr(text, "\"nodes\":[\"Add_0\",\"Relu_1\"],\"layers\":[],\"global_bytes\":0,"
				   "\"recompute_ratio\":1.000,\"reads\":[0],\"writes\":[1],\"parts\":[]}"));
	ck_assert_ptr_nonnull(strstr(text, "\"buffer_list\":[{\"name\":\"x\",\"kind\":\"input\",\"bytes\":2048},{\"name\":\"y\",\"kind\":\"output\",\"bytes\":2048}]"));
	free(text);
	/* A hit from the shared cache is a remote hit. */
	((Apollo__Bundle *)ap_bundle_pb(b))->stats->cache_tier = APOLLO__CACHE_TIER__CACHE_L2;
	text = NULL;
	f = open_memstream(&text, &tlen);
	ap_report_json(f, b, &info);
	fclose(f);
	ck_assert_ptr_nonnull(strstr(text, "\"cache\":\"remote-hit\",\"cache_tier\":\"l2\""));
	free(text);
	/* The text summary names the kernel and the cache state. */
	text = NULL;
	f = open_memstream(&text, &tlen);
	ap_report_text(f, b, &info);
	fclose(f);
	ck_assert_ptr_nonnull(strstr(text, "fused_add_relu"));
	ck_assert_ptr_nonnull(strstr(text, "Add_0 Relu_1"));
	ck_assert_ptr_nonnull(strstr(text, "cache remote-hit;"));
	ck_assert_ptr_nonnull(strstr(text, "  launch 0 -> launch 0 via t1: opaque (MatMul keeps its own kernel)\n"));
	ck_assert_ptr_nonnull(strstr(text, "1 boundaries between launches (opaque 1):\n"));
	free(text);
	ap_bundle_free(b);
}
END_TEST

/* ---- comparison ------------------------------------------------------------------------- */

START_TEST(compare_scalars)
{
	static const struct {
		double a, b;
		bool ok;
	} cases[] = {
		{ 1.0, 1.0, true },
		{ 1.0 + 0.99e-3, 1.0, true },    /* inside rtol */
		{ 1.0 + 1.01e-3 + 1e-7, 1.0, false },
		{ -1.0 - 0.99e-3, -1.0, true },
		{ 0.9e-7, 0.0, true },            /* inside atol */
		{ 1.1e-7, 0.0, false },
		{ NAN, NAN, true },
		{ NAN, 1.0, false },
		{ 1.0, NAN, false },
		{ INFINITY, INFINITY, true },
		{ -INFINITY, -INFINITY, true },
		{ INFINITY, -INFINITY, false },
		{ 1e30, INFINITY, false },
		{ INFINITY, 1e30, false },
		{ NAN, INFINITY, false },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		ck_assert_msg(ap_compare_close(cases[i].a, cases[i].b, AP_COMPARE_RTOL,
					       AP_COMPARE_ATOL) == cases[i].ok,
			      "case %zu: %g vs %g", i, cases[i].a, cases[i].b);
	/* Relative to the reference (b), not to the computed value. */
	ck_assert(ap_compare_close(0.0, 1e-7, 0.5, 0.0) == false);
	ck_assert(ap_compare_close(1e-7, 2e-7, 0.5, 0.0) == true);
}
END_TEST

static ap_host_tensor tensor_f32(float *v, int rank, int64_t d0, int64_t d1)
{
	ap_host_tensor t = { .name = "t", .dtype = AP_DT_F32, .rank = rank, .data = v };

	t.dims[0] = d0;
	t.dims[1] = d1;
	t.nbytes = (size_t)(rank == 0 ? 1 : rank == 1 ? d0 : d0 * d1) * 4;
	return t;
}

START_TEST(compare_tensors)
{
	float want[6] = { 1, 2, 3, NAN, INFINITY, -5 };
	float got[6] = { 1, 2.001f, 3.5f, NAN, INFINITY, -5 };
	ap_host_tensor w = tensor_f32(want, 2, 2, 3), g = tensor_f32(got, 2, 2, 3);
	ap_compare_result r;
	char at[64];
	int64_t iw[2] = { 5, 6 }, ig[2] = { 5, 7 };
	ap_host_tensor ti = { .dtype = AP_DT_I64, .rank = 1, .dims = { 2 }, .nbytes = 16 };
	ap_host_tensor tg = ti;

	ck_assert(!ap_compare_tensors(&g, &w, AP_COMPARE_RTOL, AP_COMPARE_ATOL, &r));
	ck_assert_str_eq(r.why, "");
	ck_assert_int_eq(r.n_bad, 1);
	ck_assert_int_eq(r.first_bad, 2);
	ck_assert_int_eq(r.max_at, 2);
	ck_assert_double_eq_tol(r.max_abs_err, 0.5, 1e-6);
	ap_compare_format_index(w.rank, w.dims, r.first_bad, at, sizeof(at));
	ck_assert_str_eq(at, "[0,2]");
	ap_compare_format_index(w.rank, w.dims, 5, at, sizeof(at));
	ck_assert_str_eq(at, "[1,2]");
	ap_compare_format_index(0, w.dims, 0, at, sizeof(at));
	ck_assert_str_eq(at, "[]");

	got[2] = 3.002f;
	ck_assert(ap_compare_tensors(&g, &w, AP_COMPARE_RTOL, AP_COMPARE_ATOL, &r));
	ck_assert_int_eq(r.n_bad, 0);
	ck_assert_int_eq(r.first_bad, -1);
	/* Looser tolerances from the command line. */
	got[2] = 3.5f;
	ck_assert(ap_compare_tensors(&g, &w, 0.2, 0, &r));

	/* Shapes must match exactly, even with the same element count. */
	g = tensor_f32(got, 2, 3, 2);
	ck_assert(!ap_compare_tensors(&g, &w, AP_COMPARE_RTOL, AP_COMPARE_ATOL, &r));
	ck_assert_str_eq(r.why, "shape [3,2], expected [2,3]");
	g = tensor_f32(got, 1, 6, 0);
	ck_assert(!ap_compare_tensors(&g, &w, AP_COMPARE_RTOL, AP_COMPARE_ATOL, &r));
	/* Dtypes too. */
	g = tensor_f32(got, 2, 2, 3);
	g.dtype = AP_DT_I32;
	g.nbytes = 24;
	ck_assert(!ap_compare_tensors(&g, &w, AP_COMPARE_RTOL, AP_COMPARE_ATOL, &r));
	ck_assert_ptr_nonnull(strstr(r.why, "dtype"));
	/* Integers compare exactly, whatever the tolerance. */
	ti.data = iw;
	tg.data = ig;
	ck_assert(!ap_compare_tensors(&tg, &ti, 1.0, 10.0, &r));
	ck_assert_int_eq(r.first_bad, 1);
	ig[1] = 6;
	ck_assert(ap_compare_tensors(&tg, &ti, 0, 0, &r));
	/* An empty tensor matches an empty tensor. */
	g = tensor_f32(got, 1, 0, 0);
	w = tensor_f32(want, 1, 0, 0);
	ck_assert(ap_compare_tensors(&g, &w, 0, 0, &r));
	ck_assert_int_eq(r.max_at, -1);
}
END_TEST

/* ---- ONNX input/output walker ------------------------------------------------------------ */

typedef struct pbuf {
	uint8_t b[4096];
	size_t n;
} pbuf;

static void pb_varint(pbuf *p, uint64_t v)
{
	do {
		uint8_t c = v & 0x7f;
		v >>= 7;
		p->b[p->n++] = c | (v ? 0x80 : 0);
	} while (v);
}

static void pb_bytes(pbuf *p, int field, const void *data, size_t len)
{
	pb_varint(p, (uint64_t)field << 3 | 2);
	pb_varint(p, len);
	memcpy(p->b + p->n, data, len);
	p->n += len;
}

static void pb_int(pbuf *p, int field, uint64_t v)
{
	pb_varint(p, (uint64_t)field << 3);
	pb_varint(p, v);
}

/* ValueInfoProto named `name`, float, dims given (a negative value is a
 * dim_param "batch"). */
static void value_info(pbuf *out, int field, const char *name, const int *dims, int rank)
{
	pbuf shape = { .n = 0 }, tt = { .n = 0 }, type = { .n = 0 }, vi = { .n = 0 };

	for (int i = 0; i < rank; i++) {
		pbuf d = { .n = 0 };
		if (dims[i] < 0)
			pb_bytes(&d, 2, "batch", 5);
		else
			pb_int(&d, 1, (uint64_t)dims[i]);
		pb_bytes(&shape, 1, d.b, d.n);
	}
	pb_int(&tt, 1, 1);
	pb_bytes(&tt, 2, shape.b, shape.n);
	pb_bytes(&type, 1, tt.b, tt.n);
	pb_bytes(&vi, 1, name, strlen(name));
	pb_bytes(&vi, 2, type.b, type.n);
	pb_bytes(out, field, vi.b, vi.n);
}

START_TEST(onnx_io_walk)
{
	pbuf graph = { .n = 0 }, model = { .n = 0 }, init = { .n = 0 };
	int d_static[2] = { 2, 3 }, d_sym[2] = { -1, 3 };
	ap_onnx_io *io;
	ap_error err;

	/* Old style: the initializer W is listed among the inputs too. */
	pb_int(&init, 1, 3);
	pb_int(&init, 2, 1);
	pb_bytes(&init, 8, "W", 1);
	pb_bytes(&graph, 5, init.b, init.n);
	value_info(&graph, 11, "x", d_static, 2);
	value_info(&graph, 11, "W", d_static, 2);
	value_info(&graph, 11, "seq", d_sym, 2);
	value_info(&graph, 12, "y", d_static, 2);
	value_info(&graph, 12, "z", d_static, 2);
	pb_int(&model, 1, 3);
	pb_bytes(&model, 2, "test", 4);
	pb_bytes(&model, 7, graph.b, graph.n);

	ck_assert_int_eq(ap_onnx_io_read(model.b, model.n, &io, &err), 0);
	ck_assert_int_eq(io->n_inputs, 2);
	ck_assert_str_eq(io->inputs[0], "x");
	ck_assert_str_eq(io->inputs[1], "seq");
	ck_assert_ptr_null(io->input_symbolic[0]);
	ck_assert_str_eq(io->input_symbolic[1], "batch");
	ck_assert_int_eq(io->input_dtype[0], AP_DT_F32);
	ck_assert_int_eq(io->n_outputs, 2);
	ck_assert_str_eq(io->outputs[1], "z");
	ck_assert_int_eq(ap_onnx_io_input(io, "seq"), 1);
	ck_assert_int_eq(ap_onnx_io_input(io, "W"), -1);
	/* the declared shapes: fixed dims, symbolic ones by name */
	ck_assert_int_eq(io->input_shape[0].rank, 2);
	ck_assert_int_eq(io->input_shape[0].dims[1], 3);
	ck_assert_ptr_null(io->input_shape[0].sym[0]);
	ck_assert_int_eq(io->input_shape[1].dims[0], -1);
	ck_assert_str_eq(io->input_shape[1].sym[0], "batch");
	ck_assert_int_eq(io->input_shape[1].dims[1], 3);
	ck_assert_int_eq(io->input_shape[1].index_bound, 0);
	ap_onnx_io_free(io);

	/* Truncated bytes and non-ONNX bytes are errors, not crashes. */
	for (size_t cut = 1; cut < model.n; cut += 7) {
		int rc = ap_onnx_io_read(model.b, cut, &io, &err);
		if (rc == 0)
			ap_onnx_io_free(io);
		else
			ck_assert_int_eq(rc, AP_EMESSAGE);
	}
	ck_assert_int_eq(ap_onnx_io_read((const uint8_t *)"\xff\xff", 2, &io, &err), AP_EMESSAGE);
	ck_assert_ptr_null(ap_onnx_io_free(NULL));
}
END_TEST

/* A token input read by a Gather of an embedding table: its valid range is
 * the table's first dimension (the smallest, over two Gathers). */
START_TEST(onnx_io_index_bound)
{
	pbuf graph = { .n = 0 }, model = { .n = 0 }, emb = { .n = 0 }, small = { .n = 0 };
	pbuf gather = { .n = 0 }, gather2 = { .n = 0 }, axis = { .n = 0 };
	int d_ids[2] = { -1, 7 }, d_out[3] = { -1, 7, 16 };
	ap_onnx_io *io;
	ap_error err;

	pb_int(&emb, 1, 50);       /* dims [50, 16], no data: the skeleton keeps the dims */
	pb_int(&emb, 1, 16);
	pb_int(&emb, 2, 1);
	pb_bytes(&emb, 8, "E", 1);
	pb_int(&small, 1, 16);     /* dims [16, 30], gathered along axis -1 */
	pb_int(&small, 1, 30);
	pb_int(&small, 2, 1);
	pb_bytes(&small, 8, "S", 1);
	pb_bytes(&graph, 5, emb.b, emb.n);
	pb_bytes(&graph, 5, small.b, small.n);
	pb_bytes(&gather, 1, "E", 1);
	pb_bytes(&gather, 1, "ids", 3);
	pb_bytes(&gather, 2, "y", 1);
	pb_bytes(&gather, 4, "Gather", 6);
	pb_bytes(&graph, 1, gather.b, gather.n);
	pb_bytes(&axis, 1, "axis", 4);
	pb_int(&axis, 3, (uint64_t)-1);
	pb_int(&axis, 20, 2);      /* AttributeProto.type INT */
	pb_bytes(&gather2, 1, "S", 1);
	pb_bytes(&gather2, 1, "ids", 3);
	pb_bytes(&gather2, 2, "z", 1);
	pb_bytes(&gather2, 4, "Gather", 6);
	pb_bytes(&gather2, 5, axis.b, axis.n);
	pb_bytes(&graph, 1, gather2.b, gather2.n);
	value_info(&graph, 11, "ids", d_ids, 2);
	value_info(&graph, 11, "other", d_ids, 2);
	value_info(&graph, 12, "y", d_out, 3);
	pb_int(&model, 1, 8);
	pb_bytes(&model, 7, graph.b, graph.n);
	ck_assert_int_eq(ap_onnx_io_read(model.b, model.n, &io, &err), 0);
	ck_assert_int_eq(io->n_inputs, 2);
	ck_assert_int_eq(io->input_shape[0].index_bound, 30);
	ck_assert_int_eq(io->input_shape[1].index_bound, 0);
	ap_onnx_io_free(io);
}
END_TEST

/* Random inputs: deterministic per (seed, position), in their ranges. */
START_TEST(run_random_inputs)
{
	int64_t dims[2] = { 64, 33 };
	ap_host_tensor *a, *b, *c, *t;
	ap_error err;
	bool neg = false;

	ck_assert_int_eq(ap_run_random_tensor("x", AP_DT_F32, 2, dims, 5, 0, 0, &a, &err), 0);
	ck_assert_int_eq(ap_run_random_tensor("x", AP_DT_F32, 2, dims, 5, 0, 0, &b, &err), 0);
	ck_assert_int_eq(ap_run_random_tensor("x", AP_DT_F32, 2, dims, 5, 1, 0, &c, &err), 0);
	ck_assert_str_eq(a->name, "x");
	ck_assert_uint_eq(a->nbytes, 64 * 33 * 4);
	ck_assert_mem_eq(a->data, b->data, a->nbytes);
	ck_assert(memcmp(a->data, c->data, a->nbytes));   /* another position, other values */
	for (int i = 0; i < 64 * 33; i++) {
		float v = ((float *)a->data)[i];

		ck_assert(v >= -1 && v < 1);
		neg |= v < -0.5f;
	}
	ck_assert(neg);
	ap_host_tensor_free(b);
	ap_host_tensor_free(c);
	ck_assert_int_eq(ap_run_random_tensor("x", AP_DT_F32, 2, dims, 6, 0, 0, &b, &err), 0);
	ck_assert(memcmp(a->data, b->data, a->nbytes));   /* another seed */
	ap_host_tensor_free(a);
	ap_host_tensor_free(b);
	/* integers: [0, bound), else [0, 4); bool 0 or 1; int8 capped to its type */
	{
		static const struct { ap_dtype dt; int64_t bound, lo, hi; } c_[] = {
			{ AP_DT_I64, 1000, 0, 999 }, { AP_DT_I32, 0, 0, 3 }, { AP_DT_BOOL, 0, 0, 1 },
			{ AP_DT_I8, 100000, 0, 127 }, { AP_DT_U8, 0, 0, 3 },
		};

		for (size_t k = 0; k < sizeof(c_) / sizeof(c_[0]); k++) {
			double lo = 1e18, hi = -1e18;

			ck_assert_int_eq(ap_run_random_tensor("i", c_[k].dt, 2, dims, 0, 2, c_[k].bound,
							      &t, &err), 0);
			for (int i = 0; i < 64 * 33; i++) {
				double v = ap_elem_get(t->data, t->dtype, i);

				lo = v < lo ? v : lo;
				hi = v > hi ? v : hi;
			}
			ck_assert_msg(lo == c_[k].lo && hi == c_[k].hi, "dtype %d: [%g, %g]",
				      c_[k].dt, lo, hi);
			ap_host_tensor_free(t);
		}
	}
	/* a scalar; errors */
	ck_assert_int_eq(ap_run_random_tensor("s", AP_DT_F16, 0, dims, 0, 0, 0, &t, &err), 0);
	ck_assert_uint_eq(t->nbytes, 2);
	ap_host_tensor_free(t);
	ck_assert_int_eq(ap_run_random_tensor("u", AP_DT_UNDEF, 1, dims, 0, 0, 0, &t, &err),
			 AP_EUNSUPPORTED);
	dims[0] = (int64_t)1 << 30;
	dims[1] = (int64_t)1 << 30;
	ck_assert_int_eq(ap_run_random_tensor("big", AP_DT_F32, 2, dims, 0, 0, 0, &t, &err),
			 AP_ETOOLARGE);
	ck_assert_ptr_null(t);
}
END_TEST

/* The worst element (furthest outside the tolerance) and the largest
 * relative error, which run --compare prints. */
START_TEST(compare_worst_and_relative)
{
	float want[4] = { 100, 1, 0, -2 }, got[4] = { 100.05f, 1.01f, 0, -2 };
	ap_host_tensor w = tensor_f32(want, 1, 4, 1), g = tensor_f32(got, 1, 4, 1);
	ap_compare_result r;
	double rtol, atol;

	ck_assert(!ap_compare_tensors(&g, &w, 1e-3, 1e-4, &r));
	ck_assert_int_eq(r.n_bad, 1);
	ck_assert_int_eq(r.max_at, 0);        /* the largest absolute error passes ... */
	ck_assert_int_eq(r.worst_at, 1);      /* ... the worst element is the failing one */
	ck_assert_double_eq_tol(r.max_rel_err, 0.01, 1e-5);
	got[1] = 1.0f;
	ck_assert(ap_compare_tensors(&g, &w, 1e-3, 1e-4, &r));
	ck_assert_int_eq(r.worst_at, 0);
	ap_compare_tolerance(AP_DT_F32, &rtol, &atol);
	ck_assert(rtol == 1e-3 && atol == 1e-4);
	ap_compare_tolerance(AP_DT_I64, &rtol, &atol);
	ck_assert(rtol == 0 && atol == 0);
	ap_compare_tolerance(AP_DT_BF16, &rtol, &atol);
	ck_assert(rtol == 5e-2);
}
END_TEST

START_TEST(path_folder)
{
	char buf[8];

	ck_assert_str_eq(ap_path_folder("m.onnx", buf, sizeof(buf)), ".");
	ck_assert_str_eq(ap_path_folder("/m.onnx", buf, sizeof(buf)), "/");
	ck_assert_str_eq(ap_path_folder("a/b/m.onnx", buf, sizeof(buf)), "a/b");
	ck_assert_ptr_null(ap_path_folder("abcdefghij/m.onnx", buf, sizeof(buf)));
}
END_TEST

START_TEST(onnx_io_real_model)
{
	const char *path = "../shared/testdata/models/silero_vad_op18_ifless/model.onnx";
	uint8_t *buf;
	size_t len;
	ap_onnx_io *io;
	ap_error err;

	if (ap_file_read(path, (size_t)1 << 30, &buf, &len, &err) < 0) {
		AP_SKIP("testdata", "onnx_io_real_model: SKIPPED: %s", err.msg);
		return;
	}
	ck_assert_int_eq(ap_onnx_io_read(buf, len, &io, &err), 0);
	ck_assert_int_eq(io->n_inputs, 3);
	ck_assert_str_eq(io->inputs[0], "input");
	ck_assert_str_eq(io->inputs[1], "sr");
	ck_assert_int_eq(io->input_dtype[1], AP_DT_I64);
	ck_assert_ptr_null(io->input_symbolic[1]);
	ck_assert_str_eq(io->input_symbolic[0], "batch");
	ck_assert_int_eq(io->n_outputs, 2);
	ck_assert_str_eq(io->outputs[1], "stateN");
	ap_onnx_io_free(io);
	free(buf);
}
END_TEST

/* ---- explain report -------------------------------------------------------------------- */

/* Balanced {} and [] outside strings, one line ended by '\n', no control
 * characters anywhere. */
static void assert_json_line(const char *text, size_t tlen)
{
	int depth = 0;

	ck_assert_uint_gt(tlen, 1);
	ck_assert_int_eq(text[0], '{');
	ck_assert_int_eq(text[tlen - 1], '\n');
	for (size_t i = 0; i + 1 < tlen; i++) {
		ck_assert_msg((unsigned char)text[i] >= 0x20, "control character at %zu", i);
		if (text[i] == '"') {
			for (i++; i < tlen && text[i] != '"'; i++)
				if (text[i] == '\\')
					i++;
			continue;
		}
		if (text[i] == '{' || text[i] == '[')
			depth++;
		if (text[i] == '}' || text[i] == ']')
			depth--;
		ck_assert_int_ge(depth, 0);
	}
	ck_assert_int_eq(depth, 0);
}

/* Three launches of two kernels over five buffers, three boundaries (one
 * with quotes, a backslash and a newline to escape, one without detail). */
static ap_bundle *explain_bundle(void)
{
	static char *n0[8] = { "n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7" };
	static char *n1[1] = { "r\"1" }, *n2[1] = { "z" };
	static uint32_t a0[2] = { 0, 2 }, a1[2] = { 2, 3 }, a2[3] = { 3, 3, 1 };
	static const char *bnames[5] = { "x", "y", "t", "u", "w" };
	static const int bkinds[5] = { APOLLO__BUFFER_KIND__BUF_INPUT, APOLLO__BUFFER_KIND__BUF_OUTPUT,
				       APOLLO__BUFFER_KIND__BUF_INTERMEDIATE,
				       APOLLO__BUFFER_KIND__BUF_INTERMEDIATE, APOLLO__BUFFER_KIND__BUF_PARAM };
	Apollo__KernelParam kp[5], *ka_p[2], *kb_p[3];
	Apollo__Kernel ka = APOLLO__KERNEL__INIT, kb = APOLLO__KERNEL__INIT, *ks[2];
	Apollo__Launch l[3], *plan[3];
	static char *l2[1] = { "II" }, *l3[1] = { "III" }, *pn2a[1] = { "z" }, *pn2b[1] = { "w0" };
	static Apollo__LaunchPart pt[3], *pts1[1], *pts2[2];
	Apollo__Buffer bf[5], *bufs[5];
	Apollo__Boundary bd[3], *bds[3];
	Apollo__Stats st = APOLLO__STATS__INIT;
	Apollo__Bundle b = APOLLO__BUNDLE__INIT;
	uint8_t *buf;
	size_t n;
	ap_bundle *out;

	for (int i = 0; i < 5; i++) {
		apollo__kernel_param__init(&kp[i]);
		kp[i].name = "p";
		kp[i].dtype = APOLLO__DATA_TYPE__DT_FLOAT;
		apollo__buffer__init(&bf[i]);
		bf[i].name = (char *)bnames[i];
		bf[i].kind = bkinds[i];
		bf[i].bytes = 16 + (uint64_t)i;
		bufs[i] = &bf[i];
	}
	kp[1].written = 1;   /* kA (in, out) */
	kp[4].written = 1;   /* kB (in, in, out) */
	ka_p[0] = &kp[0]; ka_p[1] = &kp[1];
	kb_p[0] = &kp[2]; kb_p[1] = &kp[3]; kb_p[2] = &kp[4];
	ka.name = "kA"; ka.n_params = 2; ka.params = ka_p;
	kb.name = "kB"; kb.n_params = 3; kb.params = kb_p;
	ks[0] = &ka; ks[1] = &kb;
	for (int i = 0; i < 3; i++) {
		apollo__launch__init(&l[i]);
		plan[i] = &l[i];
		apollo__boundary__init(&bd[i]);
		bds[i] = &bd[i];
	}
	l[0].kernel = 0; l[0].n_args = 2; l[0].args = a0; l[0].n_nodes = 8; l[0].nodes = n0;
	l[0].category = "elementwise";
	l[1].kernel = 0; l[1].n_args = 2; l[1].args = a1; l[1].n_nodes = 1; l[1].nodes = n1;
	l[1].category = "reduction";
	l[2].kernel = 1; l[2].n_args = 3; l[2].args = a2; l[2].n_nodes = 1; l[2].nodes = n2;
	/* launch 1 stitched by Layer II; launch 2 two micro-graphs (Layer III) */
	for (int i = 0; i < 3; i++)
		apollo__launch_part__init(&pt[i]);
	pt[0].category = "stitched"; pt[0].n_nodes = 1; pt[0].nodes = n1; pt[0].blocks = 4;
	pt[0].n_layers = 1; pt[0].layers = l2; pt[0].detail = "stitched by Layer II: one row";
	pt[0].emitter = "stitched"; pt[0].schedule = "rows=1 cache=registers";
	pt[1].category = "elementwise"; pt[1].n_nodes = 1; pt[1].nodes = pn2a; pt[1].blocks = 3;
	pt[2].category = "reduction"; pt[2].n_nodes = 1; pt[2].nodes = pn2b; pt[2].block_begin = 3;
	pt[2].blocks = 5;
	pts1[0] = &pt[0]; pts2[0] = &pt[1]; pts2[1] = &pt[2];
	l[1].n_parts = 1; l[1].parts = pts1; l[1].n_layers = 1; l[1].layers = l2; l[1].global_bytes = 64;
	l[2].n_parts = 2; l[2].parts = pts2; l[2].n_layers = 1; l[2].layers = l3;
	st.layer2_stitched = 1; st.layer3_merged = 2;
	bd[0].producer = 0; bd[0].consumer = 1; bd[0].tensor = "t"; bd[0].reason = "rule";
	bd[0].detail = "rule: a reduction ends its micro-graph";   /* repeats its key */
	bd[1].producer = 1; bd[1].consumer = 2; bd[1].tensor = "u\"q"; bd[1].reason = "hint";
	bd[1].detail = "line1\nline2 \\ back";
	bd[2].producer = 1; bd[2].consumer = 2; bd[2].tensor = "u"; bd[2].reason = "rule";
	st.kernels = 3; st.eager_kernels = 10; st.nodes = 10;
	st.global_bytes = 300; st.eager_bytes = 900; st.min_bytes = 100;
	b.target = "cpu";
	b.n_kernels = 2; b.kernels = ks;
	b.n_plan = 3; b.plan = plan;
	b.n_buffers = 5; b.buffers = bufs;
	b.n_boundaries = 3; b.boundaries = bds;
	b.stats = &st;
	n = apollo__bundle__get_packed_size(&b);
	buf = malloc(n);
	ck_assert_ptr_nonnull(buf);
	apollo__bundle__pack(&b, buf);
	out = ap_bundle_unpack(buf, n, NULL);
	free(buf);
	ck_assert_ptr_nonnull(out);
	return out;
}

static char *report(const ap_bundle *b, bool json, bool explain, size_t *tlen)
{
	ap_report_info info = { .model = "m.onnx", .explain = explain };
	char *text = NULL;
	FILE *f = open_memstream(&text, tlen);

	ck_assert_ptr_nonnull(f);
	if (json)
		ap_report_json(f, b, &info);
	else
		ap_report_text(f, b, &info);
	fclose(f);
	return text;
}

/* A bundle of five buffers (input 100 B, output 200 B, a 24-byte
 * constant, a 50-byte intermediate in a 256-byte workspace, a 1000-byte
 * parameter) and no launch, with `st` as its stats (NULL: none). */
static ap_bundle *memory_bundle(Apollo__Stats *st, uint64_t input_bytes)
{
	static const char *names[5] = { "x", "y", "c", "t", "w" };
	static const int kinds[5] = { APOLLO__BUFFER_KIND__BUF_INPUT, APOLLO__BUFFER_KIND__BUF_OUTPUT,
				      APOLLO__BUFFER_KIND__BUF_CONST, APOLLO__BUFFER_KIND__BUF_INTERMEDIATE,
				      APOLLO__BUFFER_KIND__BUF_PARAM };
	const uint64_t bytes[5] = { input_bytes, 200, 24, 50, 1000 };
	Apollo__Buffer bf[5], *bufs[5];
	Apollo__Bundle b = APOLLO__BUNDLE__INIT;
	uint8_t *buf;
	size_t n;
	ap_bundle *out;

	for (int i = 0; i < 5; i++) {
		apollo__buffer__init(&bf[i]);
		bf[i].name = (char *)names[i];
		bf[i].kind = kinds[i];
		bf[i].bytes = bytes[i];
		bufs[i] = &bf[i];
	}
	b.target = "cpu";
	b.n_buffers = 5;
	b.buffers = bufs;
	b.workspace_bytes = 256;
	b.stats = st;
	n = apollo__bundle__get_packed_size(&b);
	buf = malloc(n);
	ck_assert_ptr_nonnull(buf);
	apollo__bundle__pack(&b, buf);
	out = ap_bundle_unpack(buf, n, NULL);
	free(buf);
	ck_assert_ptr_nonnull(out);
	return out;
}

/* Memory figures (issue 24, item 2): the daemon's when its Stats carry
 * them, else computed from the buffers (a daemon before them): peak =
 * inputs + outputs + constants + workspace, parameters not counted; sums
 * stop at UINT64_MAX; ap_bundle_stats_get and both reports show them. */
START_TEST(memory_figures)
{
	Apollo__Stats st = APOLLO__STATS__INIT;
	ap_bundle_stats s;
	ap_bundle *b = memory_bundle(NULL, 100);
	size_t tlen;
	char *text;

	ck_assert_uint_eq(ap_bundle_workspace_bytes(b), 256);
	ck_assert_uint_eq(ap_bundle_input_bytes(b), 100);
	ck_assert_uint_eq(ap_bundle_output_bytes(b), 200);
	ck_assert_uint_eq(ap_bundle_const_bytes(b), 24);
	ck_assert_uint_eq(ap_bundle_peak_bytes(b), 100 + 200 + 24 + 256);
	ap_bundle_stats_get(b, &s);
	ck_assert_uint_eq(s.kernels, 0);   /* no Stats: zeros but for memory */
	ck_assert_uint_eq(s.peak_bytes, 580);
	ck_assert_uint_eq(s.input_bytes, 100);
	ck_assert_uint_eq(s.output_bytes, 200);
	ck_assert_uint_eq(s.const_bytes, 24);
	ck_assert_uint_eq(ap_abi_sizeof("ap_bundle_stats"), sizeof(ap_bundle_stats));
	text = report(b, true, false, &tlen);
	assert_json_line(text, tlen);
	ck_assert_ptr_nonnull(strstr(text, ",\"workspace_bytes\":256,\"peak_bytes\":580,\"input_bytes\":100,"
				   "\"output_bytes\":200,\"const_bytes\":24,\"buffers\":5,"));
	free(text);
	text = report(b, false, false, &tlen);
	ck_assert_ptr_nonnull(strstr(text, "\ndevice memory: peak 580 B = inputs 100 B + outputs 200 B + "
				   "constants 24 B + workspace 256 B (parameters not counted)\n"));
	free(text);
	ap_bundle_free(b);
	/* a Stats without the figures (a daemon before them): computed too */
	st.kernels = 3;
	b = memory_bundle(&st, 100);
	ck_assert_uint_eq(ap_bundle_peak_bytes(b), 580);
	ap_bundle_stats_get(b, &s);
	ck_assert_uint_eq(s.kernels, 3);
	ck_assert_uint_eq(s.output_bytes, 200);
	ap_bundle_free(b);
	/* the daemon's figures are taken as sent */
	st.peak_bytes = 4096;
	st.input_bytes = 1;
	st.output_bytes = 2;
	st.const_bytes = 3;
	b = memory_bundle(&st, 100);
	ck_assert_uint_eq(ap_bundle_peak_bytes(b), 4096);
	ck_assert_uint_eq(ap_bundle_input_bytes(b), 1);
	ck_assert_uint_eq(ap_bundle_output_bytes(b), 2);
	ck_assert_uint_eq(ap_bundle_const_bytes(b), 3);
	ap_bundle_stats_get(b, &s);
	ck_assert_uint_eq(s.peak_bytes, 4096);
	ck_assert_uint_eq(s.const_bytes, 3);
	ap_bundle_free(b);
	/* sizes no runtime accepts: the sums stop at UINT64_MAX */
	b = memory_bundle(NULL, UINT64_MAX - 10);
	ck_assert_uint_eq(ap_bundle_input_bytes(b), UINT64_MAX - 10);
	ck_assert_uint_eq(ap_bundle_peak_bytes(b), UINT64_MAX);
	ap_bundle_free(b);
}
END_TEST

START_TEST(explain_text)
{
	ap_bundle *b = explain_bundle();
	size_t tlen;
	char *text = report(b, false, true, &tlen);

	/* Every launch with every ONNX node; "-" for no category. */
	ck_assert_ptr_nonnull(strstr(text, "\n  launch 0 kA elementwise: n0 n1 n2 n3 n4 n5 n6 n7\n"));
	ck_assert_ptr_nonnull(strstr(text, "\n  launch 1 kA reduction: r\"1\n"));
	ck_assert_ptr_nonnull(strstr(text, "\n  launch 2 kB -: z\n"));
	/* the layer that stitched each launch */
	ck_assert_ptr_nonnull(strstr(text, "\n  launch 1 kA reduction: r\"1\n    stitched by Layer II: one row\n"
				   "    emitter stitched: rows=1 cache=registers\n"));
	ck_assert_ptr_nonnull(strstr(text, "\n    stitched: Layer III launches 2 independent micro-graphs together, "
				   "split by blockIdx ranges:\n      blocks [0, 3) elementwise: z\n"
				   "      blocks [3, 8) reduction: w0\n"));
	ck_assert_ptr_nonnull(strstr(text, "fusion layers: I scheduled 0 micro-graphs (0.0 ms), II stitched 1 micro-graphs, "
				   "III launched 2 micro-graphs together\n"));
	/* Boundaries counted by reason, then one a line (a detail that repeats
	 * its reason key is shown without it; the JSON keeps it as sent). */
	ck_assert_ptr_nonnull(strstr(text, "\n3 boundaries between launches (rule 2, hint 1):\n"));
	ck_assert_ptr_nonnull(strstr(text, "\n  launch 0 -> launch 1 via t: rule (a reduction ends its micro-graph)\n"));
	ck_assert_ptr_nonnull(strstr(text, "\n  launch 1 -> launch 2 via u\"q: hint (line1\nline2 \\ back)\n"));
	ck_assert_ptr_nonnull(strstr(text, "\n  launch 1 -> launch 2 via u: rule\n"));
	ck_assert_ptr_nonnull(strstr(text, "300 B fused, 900 B eager, 100 B minimum"));
	free(text);
	/* Without --explain: six names then a count, no boundary rows. */
	text = report(b, false, false, &tlen);
	ck_assert_ptr_nonnull(strstr(text, "[n0 n1 n2 n3 n4 n5 ... +2]\n"));
	ck_assert_ptr_null(strstr(text, "boundaries"));
	ck_assert_ptr_null(strstr(text, "launch 0 -> launch 1"));
	free(text);
	ap_bundle_free(b);
}
END_TEST

START_TEST(explain_json)
{
	ap_bundle *b = explain_bundle();
	size_t tlen;
	char *text = report(b, true, true, &tlen);

	assert_json_line(text, tlen);
	ck_assert_ptr_nonnull(strstr(text, "\"kernels\":3,\"distinct_kernels\":2,\"eager_kernels\":10,"));
	ck_assert_ptr_nonnull(strstr(text, "\"global_bytes\":300,\"eager_bytes\":900,\"min_bytes\":100,"));
	ck_assert_ptr_nonnull(strstr(text, "\"boundaries\":3,"));
	/* Launches: kernel, name, category, nodes, and the buffers read and
	 * written (by the written flag; a buffer bound twice listed once). */
	ck_assert_ptr_nonnull(strstr(text,
		"\"launch_list\":[{\"kernel\":0,\"name\":\"kA\",\"category\":\"elementwise\","
		"\"nodes\":[\"n0\",\"n1\",\"n2\",\"n3\",\"n4\",\"n5\",\"n6\",\"n7\"],\"layers\":[],"
		"\"global_bytes\":0,\"recompute_ratio\":1.000,\"reads\":[0],\"writes\":[2],\"parts\":[]},"
		"{\"kernel\":0,\"name\":\"kA\",\"category\":\"reduction\",\"nodes\":[\"r\\\"1\"],"
		"\"layers\":[\"II\"],\"global_bytes\":64,\"recompute_ratio\":1.000,\"reads\":[2],\"writes\":[3],"
		"\"parts\":[{\"category\":\"stitched\",\"block_begin\":0,\"blocks\":4,\"nodes\":[\"r\\\"1\"],"
		"\"layers\":[\"II\"],\"detail\":\"stitched by Layer II: one row\",\"emitter\":\"stitched\","
		"\"schedule\":\"rows=1 cache=registers\",\"recompute_ratio\":0.000,\"layer1\":false}]},"
		"{\"kernel\":1,\"name\":\"kB\",\"category\":\"\",\"nodes\":[\"z\"],\"layers\":[\"III\"],"
		"\"global_bytes\":0,\"recompute_ratio\":1.000,\"reads\":[3],\"writes\":[1],\"parts\":[{\"category\":\"elementwise\","
		"\"block_begin\":0,\"blocks\":3,\"nodes\":[\"z\"],\"layers\":[],\"detail\":\"\",\"emitter\":\"\","
		"\"schedule\":\"\",\"recompute_ratio\":0.000,\"layer1\":false},"
		"{\"category\":\"reduction\",\"block_begin\":3,\"blocks\":5,\"nodes\":[\"w0\"],"
		"\"layers\":[],\"detail\":\"\",\"emitter\":\"\",\"schedule\":\"\",\"recompute_ratio\":0.000,\"layer1\":false}]}]"));
	ck_assert_ptr_nonnull(strstr(text, "\"layers\":{\"I\":0,\"II\":1,\"III\":2}"));
	ck_assert_ptr_nonnull(strstr(text,
		"\"buffer_list\":[{\"name\":\"x\",\"kind\":\"input\",\"bytes\":16},"
		"{\"name\":\"y\",\"kind\":\"output\",\"bytes\":17},"
		"{\"name\":\"t\",\"kind\":\"intermediate\",\"bytes\":18},"
		"{\"name\":\"u\",\"kind\":\"intermediate\",\"bytes\":19},"
		"{\"name\":\"w\",\"kind\":\"param\",\"bytes\":20}]"));
	/* One row per boundary, strings escaped. */
	ck_assert_ptr_nonnull(strstr(text,
		"\"boundary_list\":[{\"producer\":0,\"consumer\":1,\"tensor\":\"t\",\"reason\":\"rule\","
		"\"detail\":\"rule: a reduction ends its micro-graph\"},"
		"{\"producer\":1,\"consumer\":2,\"tensor\":\"u\\\"q\",\"reason\":\"hint\","
		"\"detail\":\"line1\\nline2 \\\\ back\"},"
		"{\"producer\":1,\"consumer\":2,\"tensor\":\"u\",\"reason\":\"rule\",\"detail\":\"\"}]"));
	free(text);
	/* Without --explain: the launches, but no buffers, reads or boundaries. */
	text = report(b, true, false, &tlen);
	assert_json_line(text, tlen);
	ck_assert_ptr_nonnull(strstr(text, "{\"kernel\":1,\"name\":\"kB\",\"category\":\"\",\"nodes\":[\"z\"],"
				   "\"layers\":[\"III\"],\"global_bytes\":0,\"recompute_ratio\":1.000}]"));
	ck_assert_ptr_null(strstr(text, "\"reads\""));
	ck_assert_ptr_null(strstr(text, "buffer_list"));
	ck_assert_ptr_null(strstr(text, "boundary_list"));
	free(text);
	ap_bundle_free(b);
}
END_TEST

/* Occurrences of `needle` in `hay`. */
static int count_of(const char *hay, const char *needle)
{
	int n = 0;

	for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
		n++;
	return n;
}

/* The --explain-html page: one box per launch, one edge per boundary, the
 * counts on the <svg>, every string from the bundle escaped, nothing
 * fetched; a file that cannot be written is AP_EIO and leaves nothing. */
START_TEST(explain_html)
{
	ap_bundle *b = explain_bundle();
	Apollo__Bundle *pb = (Apollo__Bundle *)ap_bundle_pb(b);
	ap_report_info info = { .model = "m<i>&.onnx" };
	char *text = NULL, path[64];
	size_t tlen = 0;
	FILE *f;
	ap_error err;
	char *keep_node = pb->plan[0]->nodes[1], *keep_kernel = pb->kernels[1]->name;

	/* (put back before ap_bundle_free, which frees the unpacked strings) */
	pb->plan[0]->nodes[1] = "<b>&\"x'";
	pb->kernels[1]->name = "k</title><script>";
	f = open_memstream(&text, &tlen);
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(ap_report_html(f, b, &info, &err), 0);
	fclose(f);
	ck_assert_ptr_nonnull(strstr(text, "<!DOCTYPE html>"));
	ck_assert_ptr_nonnull(strstr(text, "data-launches=\"3\" data-boundaries=\"3\""));
	ck_assert_int_eq(count_of(text, "<g class=\"launch "), 3);
	ck_assert_int_eq(count_of(text, "<g class=\"boundary "), 3);
	ck_assert_ptr_nonnull(strstr(text, "<g class=\"launch kind-stitched layer-II\" id=\"launch-1\""));
	ck_assert_ptr_nonnull(strstr(text, "<g class=\"boundary reason-hint\" id=\"boundary-1\" "
				   "data-producer=\"1\" data-consumer=\"2\" data-tensor=\"u&quot;q\""));
	ck_assert_ptr_nonnull(strstr(text, "data-schedule=\"rows=1 cache=registers\""));
	/* escaped as text and as attributes; no markup from the bundle */
	ck_assert_ptr_nonnull(strstr(text, ">&lt;b&gt;&amp;&quot;x&#39;</text>"));
	ck_assert_ptr_nonnull(strstr(text, "<title>Apollo: m&lt;i&gt;&amp;.onnx</title>"));
	ck_assert_ptr_nonnull(strstr(text, "data-kernel=\"k&lt;/title&gt;&lt;script&gt;\""));
	ck_assert_ptr_null(strstr(text, "<b>"));
	ck_assert_ptr_null(strstr(text, "m<i>"));
	ck_assert_int_eq(count_of(text, "<script>"), 1);
	ck_assert_ptr_null(strstr(text, "u\"q"));
	/* self-contained: no URL but the SVG namespace */
	ck_assert_int_eq(count_of(text, "http"), 2);   /* Content-Security-Policy's http-equiv, xmlns */
	ck_assert_ptr_null(strstr(text, "src="));
	ck_assert_ptr_null(strstr(text, "href="));
	free(text);

	/* to a file; an unwritable path is AP_EIO naming it */
	snprintf(path, sizeof(path), "/tmp/ap-html-%d.html", (int)getpid());
	ck_assert_int_eq(ap_report_html_file(path, b, "m", &err), 0);
	ck_assert_int_eq(access(path, R_OK), 0);
	unlink(path);
	ck_assert_int_eq(ap_report_html_file("/nonexistent/dir/x.html", b, "m", &err), AP_EIO);
	ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/dir/x.html"));
	ck_assert_int_eq(ap_report_html_file(NULL, b, "m", &err), AP_EINVAL);
	pb->plan[0]->nodes[1] = keep_node;
	pb->kernels[1]->name = keep_kernel;
	ap_bundle_free(b);
}
END_TEST

/* ---- writing test data --------------------------------------------------------------- */

START_TEST(testdata_encode_round_trip)
{
	float fv[6] = { 1.5f, -2.0f, 0.0f, 3.25f, -0.125f, 1e30f };
	int64_t iv = -7;
	uint8_t bv[3] = { 1, 0, 1 };
	ap_host_tensor tf = { .name = "f", .dtype = AP_DT_F32, .rank = 2, .dims = { 2, 3 },
			      .data = fv, .nbytes = sizeof(fv) };
	ap_host_tensor ti = { .name = "i", .dtype = AP_DT_I64, .rank = 0, .data = &iv,
			      .nbytes = sizeof(iv) };
	ap_host_tensor tb = { .name = "b", .dtype = AP_DT_BOOL, .rank = 1, .dims = { 3 },
			      .data = bv, .nbytes = sizeof(bv) };
	const ap_host_tensor *src[3] = { &tf, &ti, &tb };
	char dir[] = "/tmp/check_client.XXXXXX", set[64], path[128], link[4096];
	ap_host_tensor **back;
	ap_compare_result r;
	ap_error err;
	uint8_t *buf;
	size_t len;
	ssize_t ll;
	int n;

	/* Encode -> decode keeps name, dtype, shape and every byte. */
	for (int i = 0; i < 3; i++) {
		ap_host_tensor *t;
		ck_assert_int_eq(ap_testdata_encode(src[i], i == 0 ? "renamed" : NULL, &buf, &len, &err), 0);
		t = ap_onnx_tensor_decode(buf, len, &err);
		free(buf);
		ck_assert_ptr_nonnull(t);
		ck_assert_str_eq(t->name, i == 0 ? "renamed" : src[i]->name);
		ck_assert(ap_compare_tensors(t, src[i], 0, 0, &r));
		ap_host_tensor_free(t);
	}
	/* Data that does not fit the shape is refused. */
	tf.nbytes = 20;
	ck_assert_int_eq(ap_testdata_encode(&tf, NULL, &buf, &len, &err), AP_EINVAL);
	ck_assert_ptr_null(buf);
	tf.nbytes = sizeof(fv);
	tf.dims[0] = -1;
	ck_assert_int_eq(ap_testdata_encode(&tf, NULL, &buf, &len, &err), AP_EINVAL);
	tf.dims[0] = 2;
	/* A saved folder reads back as a backend-test folder. */
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(set, sizeof(set), "%s/test_data_set_0", dir);
	ck_assert_int_eq(ap_testdata_save(set, "input", 0, &tf, NULL, &err), 0);
	ck_assert_int_eq(ap_testdata_save(set, "input", 1, &ti, NULL, &err), 0);
	ck_assert_int_eq(ap_testdata_save(set, "output", 0, &tb, "out", &err), 0);
	ck_assert_int_eq(ap_testdata_load(set, "input", &back, &n, &err), 0);
	ck_assert_int_eq(n, 2);
	ck_assert(ap_compare_tensors(back[0], &tf, 0, 0, &r));
	ck_assert(ap_compare_tensors(back[1], &ti, 0, 0, &r));
	ap_host_tensors_free(back, n);
	ck_assert_int_eq(ap_testdata_load(set, "output", &back, &n, &err), 0);
	ck_assert_int_eq(n, 1);
	ck_assert_str_eq(back[0]->name, "out");
	ap_host_tensors_free(back, n);
	/* model.onnx becomes a link to the absolute path, replaced on a rerun. */
	snprintf(path, sizeof(path), "%s/input_0.pb", set);
	ck_assert_int_eq(ap_testdata_save_model(dir, path, &err), 0);
	ck_assert_int_eq(ap_testdata_save_model(dir, path, &err), 0);
	snprintf(path, sizeof(path), "%s/model.onnx", dir);
	ll = readlink(path, link, sizeof(link) - 1);
	ck_assert_int_gt(ll, 0);
	link[ll] = 0;
	ck_assert_int_eq(link[0], '/');
	ck_assert_ptr_nonnull(strstr(link, "/test_data_set_0/input_0.pb"));
	ck_assert_int_eq(ap_testdata_save_model(dir, "/nonexistent/model.onnx", &err), AP_EIO);
	/* A folder that cannot be created is an I/O error. */
	ck_assert_int_eq(ap_testdata_save("/nonexistent/dir/set", "input", 0, &tf, NULL, &err), AP_EIO);
	unlink(path);
	for (int k = 0; k < 2; k++) {
		snprintf(path, sizeof(path), "%s/input_%d.pb", set, k);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/output_0.pb", set);
	unlink(path);
	rmdir(set);
	ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* ap_abi_field: every mirrored struct's fields in declaration order at
 * their offsets -- increasing, inside the struct -- and a bool in padding
 * (ap_submit_options.tma, once missing from the Python binding) listed. */
START_TEST(abi_fields)
{
	static const char *const types[] = { "ap_error", "ap_tensor", "ap_graph", "ap_submit_options",
					     "ap_device_info", "ap_server_stats", "ap_bundle_stats",
					     "ap_bundle_buffer", "ap_runtime_options", "ap_host_tensor" };
	size_t off = 0;

	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
		size_t prev = 0;
		int n = 0;

		ck_assert_uint_gt(ap_abi_sizeof(types[t]), 0);
		for (const char *f; (f = ap_abi_field(types[t], n, &off)) != NULL; n++) {
			ck_assert_msg(n == 0 ? off == 0 : off > prev, "%s.%s at %zu after %zu", types[t], f, off,
				      prev);
			ck_assert_uint_lt(off, ap_abi_sizeof(types[t]));
			prev = off;
		}
		ck_assert_msg(n >= 4, "%s: %d fields", types[t], n);
	}
	ck_assert_str_eq(ap_abi_field("ap_submit_options", 13, &off), "tma");
	ck_assert_uint_eq(off, offsetof(ap_submit_options, tma));
	ck_assert_str_eq(ap_abi_field("ap_submit_options", 14, &off), "tune_variant");
	ck_assert_uint_eq(off, offsetof(ap_submit_options, tune_variant));
	ck_assert_str_eq(ap_abi_field("ap_submit_options", 17, &off), "unvalidated");
	ck_assert_uint_eq(off, offsetof(ap_submit_options, unvalidated));
	ck_assert_ptr_null(ap_abi_field("ap_submit_options", 18, NULL));
	ck_assert_ptr_null(ap_abi_field("ap_submit_options", -1, NULL));
	ck_assert_ptr_null(ap_abi_field("ap_nothing", 0, NULL));
	ck_assert_ptr_null(ap_abi_field(NULL, 0, NULL));
}
END_TEST

static Suite *client_suite(void)
{
	Suite *s = suite_create("client");
	TCase *tc = tcase_create("frame");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, frame_round_trip);
	tcase_add_test(tc, abi_fields);
	tcase_add_test(tc, frame_oversized_rejected_before_reading);
	tcase_add_test(tc, frame_zero_length);
	tcase_add_test(tc, frame_truncated_payload);
	tcase_add_test(tc, frame_truncated_header);
	tcase_add_test(tc, frame_closed_without_reply);
	suite_add_tcase(s, tc);
	tc = tcase_create("protocol");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, handshake_ping_stats);
	tcase_add_test(tc, version_mismatch);
	tcase_add_test(tc, token_handshake);
	tcase_add_test(tc, busy_reason_after_broken_pipe);
	tcase_add_test(tc, reconnects_after_idle_close);
	tcase_add_test(tc, submit_graph_and_accessors);
	tcase_add_test(tc, submit_onnx_file);
	tcase_add_test(tc, submit_error_reply);
	tcase_add_test(tc, bad_replies);
	tcase_add_test(tc, connect_errors);
	suite_add_tcase(s, tc);
	tc = tcase_create("tool");
	tcase_add_test(tc, json_report);
	tcase_add_test(tc, memory_figures);
	tcase_add_test(tc, explain_text);
	tcase_add_test(tc, explain_json);
	tcase_add_test(tc, explain_html);
	tcase_add_test(tc, testdata_encode_round_trip);
	tcase_add_test(tc, compare_scalars);
	tcase_add_test(tc, compare_tensors);
	tcase_add_test(tc, onnx_io_walk);
	tcase_add_test(tc, onnx_io_real_model);
	tcase_add_test(tc, onnx_io_index_bound);
	tcase_add_test(tc, run_random_inputs);
	tcase_add_test(tc, compare_worst_and_relative);
	tcase_add_test(tc, path_folder);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(client_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
