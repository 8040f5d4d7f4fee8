/* net.c -- the libuv loop of apollod (see net.h).  The only file that
 * includes uv.h.
 *
 * Ownership: every libuv handle lives inside its owning struct (the server
 * or a connection) and `handle->data` points back at it.  A connection is
 * reference-counted: one reference for its open handle, dropped in the
 * close callback, and one per compile job that will answer on it, dropped
 * when the job's reply has been written or discarded.  Its memory is freed
 * only when both kinds are gone, so a worker finishing for a client that
 * already left finds a closed connection, not freed memory.
 *
 * Reading: a connection is a small state machine: 4 header bytes, then the
 * payload.  The length is checked with ap_frame_check_len before the
 * payload buffer is allocated (against max_unauth_frame_bytes until a TCP
 * client has authenticated, max_frame_bytes after); a bad length is
 * answered with an Error (ERR_BAD_FRAME / ERR_TOO_LARGE) and the
 * connection is shut down after the reply has been flushed.  A payload
 * that does not decode as an Envelope is answered with ERR_BAD_MESSAGE;
 * the connection stays open (the framing is still intact) unless it is an
 * unauthenticated TCP one.  Every connection reads into the server's one
 * read buffer (the loop reads one socket at a time and consume() copies
 * what it keeps), so an idle connection costs its struct, not 64 KiB.
 *
 * Decode memory: an Envelope is unpacked through an ap_pb_budget of
 * decode_memory_ratio x its length + 4 MiB (common/pb_budget.h): a frame
 * whose decoded form would need more is answered ERR_TOO_LARGE as soon as
 * the budget runs out, not after gigabytes.  After a request over 1 MiB is
 * done, and after a connection that queued over 1 MiB of replies closes,
 * malloc_trim gives the freed memory back to the system.
 *
 * Pending memory (issue 29, item 5): decoding is budgeted, compiling is
 * estimated.  A compile request's cost is its decoded size (what the
 * decode budget counted) plus ap_compile_estimate (compile.h), judged
 * before it is queued: above max_compile_memory it is refused
 * ERR_TOO_LARGE.  Every request queued or running holds its cost against
 * max_pending_memory and against its holder's share of it (half, or
 * max_compile_memory if more; the holder as for slots: uid, TCP), and a
 * large frame waiting for its decode job holds FRAME_FACTOR x its length
 * until it is decoded; a request or frame that would pass either limit is
 * refused ERR_BUSY naming it.  The cost goes back when the reply has been
 * made.  So memory of requests waiting for a worker is bounded by the
 * configuration, not by how many clients send.
 *
 * Known requests (issue 26, item 2): a compile request whose bytes the
 * compiler has answered before (its digest in the request memo, with the
 * decoded size and estimate it was admitted by) is decoded without its
 * graph or model -- the warm path reads only target, output, options and
 * device -- and admitted by those remembered numbers, which are functions
 * of the same bytes; its worker answers it warm from L1
 * (ap_compile_warm_frame: the stored bundle's bytes spliced), or, when the
 * bundle is gone, decodes the kept payload whole and runs it as any other.
 * The reply's frame comes packed from the compiler (ap_compile_run_frame).
 *
 * Writing: each queued reply is counted at what it really costs (payload,
 * header, write request, allocator overhead), not by its payload alone (a
 * ping reply is 23 bytes of payload and about 240 of memory).  Above
 * max_reply_queue_bytes the connection's reading stops until the queue is
 * down to a quarter; a queue past twice that, or one that makes no
 * progress for send_timeout_ms, drops the client.
 *
 * Admission and time limits (issue 11): Unix connections count against
 * max_clients and max_clients_per_user (by the peer's uid,
 * SO_PEERCRED); a TCP connection first counts against max_unauth_clients
 * only, and against max_clients once it has authenticated, so that
 * unauthenticated clients cannot lock anybody out.  Slots (issue 29): one
 * uid holds at most max_clients_per_user (default a quarter of
 * max_clients); when the daemon is full, the least recently active idle
 * connection of the holder with the most connections is closed for a
 * newcomer (make_room), and root and admin_uid have admin_clients slots
 * beyond max_clients for when nothing is idle.  A sweep timer closes
 * connections that have not authenticated within auth_timeout_ms, that
 * leave a frame incomplete for frame_timeout_ms (while the daemon is
 * reading), that leave replies unread for send_timeout_ms, that have done
 * nothing for idle_timeout_ms, or that were shut down and still have not
 * gone after GRACE_MS.
 *
 * TCP authentication (common/frame.h): Hello with the client's nonce ->
 * HelloReply with the daemon's nonce and proof -> Hello with the client's
 * proof -> the full HelloReply.  Nothing else is served before; proofs are
 * compared in constant time; a wrong one closes the connection.
 *
 * Decoding: a payload of at most DECODE_INLINE_MAX bytes is unpacked on
 * the loop thread (microseconds).  A larger one (up to max_frame_bytes,
 * 64 MiB by default: a big Graph takes tens of milliseconds to unpack) is
 * unpacked by a decode job on the worker pool, so that one client's big
 * compile request does not delay every other client's ping.  While that
 * job runs the connection reads nothing more: the bytes already received
 * after the frame wait in `backlog`, and reading resumes once the decoded
 * Envelope has been dispatched.  So the frames of one connection are still
 * dispatched one at a time in arrival order, exactly as when everything
 * was decoded inline: ping / hello / stats replies keep their order, a TCP
 * client's Hello is checked before its next frame, and compile jobs are
 * queued in arrival order (their replies, as before, come when they are
 * done).  A decode job holds a connection reference like a compile job.
 * A compile job frees its Envelope on the worker too.
 *
 * Progress (issue 26, item 4): a CompileRequest with `progress` set gets
 * Progress envelopes with its id ahead of its answer.  The worker never
 * touches the socket: job_progress packs each event (the compiler bounds
 * their rate, compile.h) and queues it under a mutex, and a uv_async wakes
 * the loop thread to send them; after_compile sends whatever is still
 * queued before the answer, so no event comes after it.  A request without
 * the flag gets none; a warm answer sends none.
 *
 * Shutdown: the first SIGTERM / SIGINT closes the listeners and removes the
 * socket file; requests already running finish and are answered, new
 * compile requests get ERR_BUSY (frames are decoded inline from then on,
 * and the decode jobs already running finish and are answered first, so a
 * client cannot stretch the drain); when none is left, every connection is
 * shut down (pending writes flushed first, at most GRACE_MS), the signal
 * handles close, and uv_run returns.
 */
#include "net.h"

#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "../../common/frame.h"
#include "../../common/graph.h"
#include "../../common/pb_budget.h"
#include "../../common/pb_wire.h"
#include "../backend/backend.h"
#include "../notify.h"
#include "http.h"
#include "metrics.h"
#include "proto/apollo.pb-c.h"

#define READ_CHUNK (64 * 1024)
#define GRACE_MS 5000
/* What a queued reply costs beside its frame and its write_req: the two
 * blocks' allocator headers and alignment. */
#define REPLY_OVERHEAD 32
/* Requests and reply queues above this size are followed by malloc_trim. */
#define TRIM_BYTES ((size_t)1 << 20)
/* Added to decode_memory_ratio x frame length: small frames always decode. */
#define DECODE_FLOOR ((size_t)4 << 20)
/* Frames with a payload above this many bytes are decoded on the worker
 * pool (see "Decoding" above); smaller ones on the loop thread. */
#define DECODE_INLINE_MAX ((uint32_t)64 * 1024)
/* What a frame waiting for its decode job counts against
 * max_pending_memory, per byte: the payload and its decoded form (real
 * graphs decode to 2-10x, so this is a guess that decoding corrects). */
#define FRAME_FACTOR 4
#define SERVER_NAME "apollod " AP_VERSION

typedef struct conn conn;

struct ap_server {
	uv_loop_t loop;
	uv_pipe_t pipe;
	uv_tcp_t tcp;
	uv_signal_t sigterm, sigint;
	uv_timer_t grace;
	bool loop_ready, pipe_open, tcp_open, signals_open, grace_open;
	bool draining, closing_all;
	uv_timer_t sweep;             /* the time limits of every connection */
	bool sweep_open;
	char socket_path[108];
	bool own_socket_file;         /* we bound it: remove it at the end */
	uint32_t max_frame, max_unauth_frame;
	unsigned max_clients, max_per_user, max_unauth, max_pending;
	unsigned admin_reserve;       /* admin_clients */
	long long admin_uid;          /* -1: root only */
	uint64_t auth_timeout, idle_timeout, frame_timeout, send_timeout;   /* ms */
	size_t max_queue;             /* max_reply_queue_bytes */
	uint64_t max_compile_mem;     /* max_compile_memory */
	uint64_t max_pending_mem;     /* max_pending_memory */
	uint64_t user_share;          /* what one holder may hold of it */
	uint64_t pending_mem;         /* held now by requests and frames */
	unsigned decode_ratio;
	char tcp_token[256];
	ap_compiler *compiler;
	ap_cache *cache;
	conn *conns;                  /* every open connection */
	unsigned n_clients, in_flight;
	unsigned n_served;            /* counted against max_clients */
	unsigned n_unauth;            /* TCP, not authenticated yet */
	uint64_t evicted;             /* idle connections closed to make room */
	unsigned decoding;            /* decode jobs running (not in in_flight) */
	uint64_t requests, errors;    /* frames answered outside the compiler */
	uint64_t by_kind[AP_KINDS][2];     /* frames by kind, ok / error (metrics.h) */
	uint64_t errors_by_code[16];  /* errors answered here, by -code */
	atomic_uint queued;           /* compile jobs not started by a worker yet */
	ap_http *metrics;             /* the metrics endpoint; NULL: none */
	uv_timer_t watchdog;          /* systemd's watchdog pings; see notify.h */
	bool watchdog_open;
	bool activated;               /* the listeners came from systemd */
	double start_ms;
	size_t n_targets;
	char **targets;               /* for HelloReply */
	/* Progress (issue 26, item 4): frames the workers made, handed to the
	 * loop thread (on_progress, or after_compile before the answer) */
	uv_async_t progress_async;
	bool progress_open;
	uv_mutex_t progress_mu;       /* guards the list; initialised with the async */
	struct progress_item *progress_head, *progress_tail;
	uint8_t rbuf[READ_CHUNK];     /* every connection reads into this one */
};

/* One Progress frame on its way from a worker to the loop thread.  `c` is
 * valid: the job that made it holds a reference to c until after_compile,
 * which sends every queued item first. */
struct progress_item {
	struct progress_item *next;
	conn *c;
	uint8_t *frame;
	size_t len;
};

struct conn {
	union {
		uv_handle_t handle;
		uv_stream_t stream;
		uv_pipe_t pipe;
		uv_tcp_t tcp;
	} h;
	uv_shutdown_t shutdown_req;
	ap_server *srv;
	conn *prev, *next;
	int refs;             /* 1 while the handle is open + 1 per job */
	unsigned jobs;        /* compile jobs that will answer here */
	bool is_tcp, authed, closing, shutting, eof;
	bool paused;          /* reading stopped: too many unread replies */
	bool decoding;        /* reading stopped: a decode job runs for us */
	bool served;          /* counted in srv->n_served */
	bool unauth;          /* counted in srv->n_unauth */
	bool has_uid;         /* Unix: the peer's uid is known */
	bool challenged;      /* TCP: nonces exchanged, the client's proof is due */
	uid_t uid;
	uint8_t nonce_c[AP_AUTH_NONCE_BYTES], nonce_s[AP_AUTH_NONCE_BYTES];
	uint8_t *backlog;     /* bytes received after the frame being decoded */
	size_t backlog_len;
	uint8_t hdr[AP_FRAME_HEADER_BYTES];
	unsigned hdr_have;
	uint8_t *payload;     /* allocated once the length passed the check */
	uint32_t want, have;
	uint64_t mem;         /* held against max_pending_memory (jobs, decode) */
	uint64_t decode_mem;  /* of it, for the frame being decoded */
	size_t queued;        /* memory of the replies queued, REPLY_OVERHEAD in */
	size_t queued_peak;
	/* uv_now() times, ms: connected, first byte of the frame being read,
	 * last activity, last write progress (or the queue's start), shutdown */
	uint64_t t_accept, t_frame, t_active, t_write, t_shut;
};

struct write_req {
	uv_write_t req;
	uint8_t *data;
	size_t cost;          /* what it adds to c->queued */
	conn *c;
};

struct job {
	uv_work_t req;
	conn *c;
	ap_compiler *compiler;
	uint64_t id;             /* the request's id */
	uint32_t req_len;        /* its frame's payload bytes */
	uint64_t mem;            /* held against max_pending_memory */
	Apollo__Envelope *env;   /* the request, unpacked; the worker frees it */
	uint8_t *full;           /* env decoded without its graph: the payload, for the
				    worker to decode whole unless the warm answer serves
				    (decode_known); NULL: env is whole */
	unsigned ratio;          /* decode_memory_ratio, for that */
	ap_compile_admit admit;  /* how it was admitted (ap_compile_memo_admit) */
	bool has_admit;
	bool has_digest;
	uint8_t digest[32];      /* of the CompileRequest's bytes (compile.h) */
	char client[64];         /* who sent it: "uid:N", "tcp:ADDR" (ap_compile_run_as) */
	uint8_t *frame;          /* the reply, packed by the worker */
	size_t frame_len;
	bool ok;                 /* the reply is a bundle (a TuneReply) */
	int kind;                /* AP_KIND_COMPILE or AP_KIND_TUNE */
	int code;                /* a tuning report refused: its AP_E* code */
	bool progress;           /* CompileRequest.progress: stage events wanted */
	double t_arrived;        /* ap_now_ms() when it was queued: Progress.elapsed_ms's 0 */
};

/* Who a connection is, for tuning reports (compile.h): "uid:N" on the Unix
 * socket (SO_PEERCRED), "tcp:ADDR" on TCP (the peer's address, without
 * the port), "unix:unknown" when the kernel did not say. */
static void conn_client(conn *c, char *buf, size_t cap)
{
	struct sockaddr_storage ss;
	int len = sizeof(ss);
	char host[64] = "?";

	if (!c->is_tcp) {
		if (c->has_uid)
			snprintf(buf, cap, "uid:%u", (unsigned)c->uid);
		else
			snprintf(buf, cap, "unix:unknown");
		return;
	}
	if (uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&ss, &len) == 0) {
		if (ss.ss_family == AF_INET)
			uv_ip4_name((const struct sockaddr_in *)&ss, host, sizeof(host));
		else if (ss.ss_family == AF_INET6)
			uv_ip6_name((const struct sockaddr_in6 *)&ss, host, sizeof(host));
	}
	snprintf(buf, cap, "tcp:%s", host);
}

/* What decoding one frame found, beside the Envelope. */
struct frame_info {
	uint32_t len;            /* payload bytes */
	int why;                 /* no Envelope: why (decode_envelope) */
	size_t decoded;          /* memory the decoded Envelope holds */
	bool has_digest;         /* a CompileRequest: the digest of its bytes */
	uint8_t digest[32];
	bool has_cost;           /* a CompileRequest: its estimate */
	ap_compile_cost cost;
	uint8_t *full;           /* decoded without its graph (decode_known): the
				    payload, which its holder frees (NULL: none) */
};

/* A frame payload above DECODE_INLINE_MAX, unpacked on the worker pool. */
struct decode {
	uv_work_t req;
	conn *c;
	uint8_t *payload;        /* freed by the worker (or kept: info.full) */
	unsigned ratio;          /* decode_memory_ratio */
	ap_compiler *compiler;   /* whose request memo names known requests */
	Apollo__Envelope *env;   /* the result; NULL when it does not decode */
	struct frame_info info;
};

static void conn_close(conn *c);
static bool take_slot(conn *c, char *msg, size_t cap);
static bool wire_digest(const uint8_t *payload, uint32_t len, uint8_t digest[32]);
static bool mem_take(conn *c, uint64_t bytes, char *msg, size_t cap);
static void mem_give(conn *c, uint64_t bytes);
static void maybe_finish_drain(ap_server *s);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);
static void consume(conn *c, const uint8_t *p, size_t n);

/* ---- frames ------------------------------------------------------------- */

/* Packs `env` into a malloc'd frame (length prefix + payload). */
static uint8_t *pack_frame(const Apollo__Envelope *env, size_t *len)
{
	size_t n = apollo__envelope__get_packed_size(env);
	uint8_t *f;

	if (n > UINT32_MAX)
		return NULL;
	f = malloc(AP_FRAME_HEADER_BYTES + n);
	if (!f)
		return NULL;
	ap_frame_put_len(f, (uint32_t)n);
	apollo__envelope__pack(env, f + AP_FRAME_HEADER_BYTES);
	*len = AP_FRAME_HEADER_BYTES + n;
	return f;
}

/* Decodes an Envelope of `len` bytes within the daemon's decode budget;
 * NULL when it does not, with *why AP_ETOOLARGE (the budget ran out),
 * AP_ENOMEM or AP_EMESSAGE (bytes that do not decode).  *decoded: the
 * bytes the Envelope holds (allocator overhead included).  Called on the
 * loop or a worker thread. */
static Apollo__Envelope *decode_envelope(const uint8_t *payload, uint32_t len, unsigned ratio,
					 int *why, size_t *decoded)
{
	ap_pb_budget b;
	Apollo__Envelope *env;

	ap_pb_budget_init(&b, ap_pb_decode_limit(len, ratio, DECODE_FLOOR));
	env = apollo__envelope__unpack(&b.allocator, len, payload);
	*why = env ? 0 : b.exceeded ? AP_ETOOLARGE : b.out_of_memory ? AP_ENOMEM : AP_EMESSAGE;
	*decoded = env ? b.used : 0;
	return env;
}

/* The Envelope's bytes with its CompileRequest's source (the graph, field
 * 1, or the ONNX model, field 2) left out -- what the warm path reads of
 * a request (target, output, options, device, bindings) -- malloc'd,
 * *out_len bytes (at most len: fields only go).  NULL when the bytes do
 * not walk or memory runs out. */
static uint8_t *without_source(const uint8_t *payload, uint32_t len, size_t *out_len)
{
	uint8_t *out = malloc(len ? len : 1), *w = out;
	ap_pbw r, q;
	ap_pbw_field f, g;
	int rc = 0, rq = 0;

	if (!out)
		return NULL;
	ap_pbw_init(&r, payload, len);
	while (rq == 0 && (rc = ap_pbw_next(&r, &f)) == 1) {
		size_t n = 0;

		if (f.number != 8 || f.wire != 2) {
			memcpy(w, f.start, (size_t)(f.end - f.start));
			w += f.end - f.start;
			continue;
		}
		for (int pass = 0; pass < 2 && rq == 0; pass++) {
			if (pass) {
				*w++ = 8 << 3 | 2;
				w += ap_pbw_put_varint(w, n);
			}
			ap_pbw_init(&q, f.data, f.len);
			while ((rq = ap_pbw_next(&q, &g)) == 1) {
				if (g.number == 1 || g.number == 2)
					continue;
				if (pass) {
					memcpy(w, g.start, (size_t)(g.end - g.start));
					w += g.end - g.start;
				}
				n += (size_t)(g.end - g.start);
			}
		}
	}
	if (rc || rq) {
		free(out);
		return NULL;
	}
	*out_len = (size_t)(w - out);
	return out;
}

/* A compile request the compiler answered before (issue 26, item 2: its
 * digest is in the request memo with the numbers it was admitted by,
 * ap_compile_memo_admit), decoded without its graph or model: a warm
 * answer reads nothing else, and the worker decodes it whole only when it
 * is not warm after all (work_compile).  It is admitted by the numbers its
 * first decode gave -- functions of the same bytes -- and info->full takes
 * the payload (the holder frees it).  NULL, with nothing taken, for any
 * other frame. */
static Apollo__Envelope *decode_known(ap_compiler *compiler, uint8_t *payload, uint32_t len,
				      unsigned ratio, struct frame_info *info)
{
	ap_compile_admit a;
	Apollo__Envelope *env;
	uint8_t *shallow;
	size_t n = 0, decoded;
	int why;

	if (!compiler || !ap_compile_memo_admit(compiler, info->digest, &a) ||
	    !(shallow = without_source(payload, len, &n)))
		return NULL;
	env = decode_envelope(shallow, (uint32_t)n, ratio, &why, &decoded);
	free(shallow);
	if (!env || env->msg_case != APOLLO__ENVELOPE__MSG_COMPILE || !env->compile) {
		if (env)
			apollo__envelope__free_unpacked(env, NULL);
		return NULL;
	}
	info->has_digest = true;
	info->decoded = (size_t)a.decoded;
	info->cost = a.cost;
	info->has_cost = true;
	info->full = payload;
	return env;
}

/* Decodes one frame payload into *info (and the Envelope): digest and
 * compile estimate of a CompileRequest; a request the compiler knows is
 * decoded without its graph (decode_known: info->full then holds the
 * payload, else the caller keeps it).  Loop or worker thread. */
static Apollo__Envelope *decode_frame(ap_compiler *compiler, uint8_t *payload, uint32_t len,
				      unsigned ratio, struct frame_info *info)
{
	Apollo__Envelope *env;
	bool raw;

	memset(info, 0, sizeof(*info));
	info->len = len;
	raw = wire_digest(payload, len, info->digest);
	if (raw && (env = decode_known(compiler, payload, len, ratio, info)))
		return env;
	env = decode_envelope(payload, len, ratio, &info->why, &info->decoded);
	info->has_digest = raw && env && env->msg_case == APOLLO__ENVELOPE__MSG_COMPILE;
	if (env && env->msg_case == APOLLO__ENVELOPE__MSG_COMPILE && env->compile) {
		ap_compile_estimate(env->compile, &info->cost);
		info->has_cost = true;
	}
	return env;
}

/* The SHA-256 of the bytes of the one CompileRequest field (8) of an
 * Envelope: what names the request in the compiler's memo (compile.h),
 * when the Envelope decodes as a compile request.  False (no digest) when
 * the field is not there exactly once. */
static bool wire_digest(const uint8_t *payload, uint32_t len, uint8_t digest[32])
{
	const uint8_t *v;
	size_t n;

	if (ap_pbw_single_field(payload, len, 8, &v, &n) != 1)
		return false;
	ap_sha256(v, n, digest);
	return true;
}

/* Gives freed heap memory back to the system (glibc keeps it otherwise:
 * a big request's thousands of small blocks would stay with the process). */
static void trim_heap(void)
{
#ifdef __GLIBC__
	malloc_trim(0);
#endif
}

static void on_write(uv_write_t *req, int status)
{
	struct write_req *w = req->data;
	conn *c = w->c;

	c->queued -= w->cost;
	c->t_write = c->t_active = uv_now(c->h.handle.loop);
	free(w->data);
	free(w);
	if (status < 0 && status != UV_ECANCELED) {
		ap_log(AP_LOG_DEBUG, "write failed: %s", uv_strerror(status));
		conn_close(c);
		return;
	}
	if (c->paused && !c->closing && !c->shutting && !c->eof && !c->decoding &&
	    c->queued < c->srv->max_queue / 4) {
		c->paused = false;
		c->t_frame = c->t_write;   /* the frame clock stood still */
		if (uv_read_start(&c->h.stream, on_alloc, on_read))
			conn_close(c);
	}
}

/* Queues `frame` (consumed) for writing; drops it when the connection is
 * going away. */
static void send_frame(conn *c, uint8_t *frame, size_t len)
{
	struct write_req *w;
	uv_buf_t buf;
	int r;

	if (!frame)
		return;
	if (c->closing || c->shutting) {
		free(frame);
		return;
	}
	w = malloc(sizeof(*w));
	if (!w) {
		free(frame);
		conn_close(c);
		return;
	}
	w->data = frame;
	w->c = c;
	w->cost = len + sizeof(*w) + REPLY_OVERHEAD;
	w->req.data = w;
	buf = uv_buf_init((char *)frame, (unsigned)len);
	r = uv_write(&w->req, &c->h.stream, &buf, 1, on_write);
	if (r) {
		ap_log(AP_LOG_DEBUG, "write: %s", uv_strerror(r));
		free(frame);
		free(w);
		conn_close(c);
		return;
	}
	if (!c->queued)
		c->t_write = uv_now(c->h.handle.loop);
	c->queued += w->cost;
	if (c->queued > c->queued_peak)
		c->queued_peak = c->queued;
	/* A queue that was already full and still grows: the client is not
	 * reading.  (One big reply alone may exceed the limit: it goes.) */
	if (c->queued - w->cost > c->srv->max_queue && c->queued > 2 * c->srv->max_queue) {
		ap_log(AP_LOG_WARN, "a client left %zu bytes of replies unread: disconnecting it",
		       c->queued);
		conn_close(c);
		return;
	}
	if (!c->paused && c->queued > c->srv->max_queue) {
		ap_log(AP_LOG_DEBUG, "client does not read its replies: pausing its requests");
		c->paused = true;
		uv_read_stop(&c->h.stream);
	}
}

/* Packs and queues `env`. */
static void send_packed(conn *c, const Apollo__Envelope *env)
{
	size_t len = 0;
	uint8_t *frame = pack_frame(env, &len);

	send_frame(c, frame, len);
}

/* Counts an error answered by the front (not by a compile job). */
static void count_error(ap_server *s, int code)
{
	s->errors++;
	if (code < 0 && code > -16)
		s->errors_by_code[-code]++;
}

/* Replies with Envelope.error. */
static void send_error(conn *c, uint64_t id, int code, const char *msg)
{
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__Error e = APOLLO__ERROR__INIT;

	e.code = (Apollo__ErrorCode)ap_error_wire_code(code);
	e.message = (char *)msg;
	env.id = id;
	env.msg_case = APOLLO__ENVELOPE__MSG_ERROR;
	env.error = &e;
	count_error(c->srv, code);
	ap_log(AP_LOG_DEBUG, "error reply (%s): %s", ap_error_name(code), msg);
	send_packed(c, &env);
}

/* ---- connections ------------------------------------------------------- */

static void conn_unref(conn *c)
{
	if (--c->refs == 0) {
		free(c->payload);
		free(c->backlog);
		free(c);
	}
}

static void on_conn_close(uv_handle_t *h)
{
	conn *c = h->data;
	ap_server *s = c->srv;
	bool trim = c->queued_peak > TRIM_BYTES;

	if (c->prev)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	s->n_clients--;
	if (c->served)
		s->n_served--;
	if (c->unauth)
		s->n_unauth--;
	c->served = c->unauth = false;
	conn_unref(c);
	if (trim)
		trim_heap();
	if (s->closing_all && !s->conns && s->grace_open && !uv_is_closing((uv_handle_t *)&s->grace))
		uv_close((uv_handle_t *)&s->grace, NULL);
}

static void conn_close(conn *c)
{
	if (c->closing)
		return;
	c->closing = true;
	uv_read_stop(&c->h.stream);
	uv_close(&c->h.handle, on_conn_close);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
	conn_close(req->data);
}

/* Closes the connection once the writes queued before it are flushed. */
static void conn_shutdown(conn *c)
{
	if (c->closing || c->shutting)
		return;
	c->shutting = true;
	c->t_shut = uv_now(c->h.handle.loop);
	uv_read_stop(&c->h.stream);
	c->shutdown_req.data = c;
	if (uv_shutdown(&c->shutdown_req, &c->h.stream, on_shutdown))
		conn_close(c);
}

/* ---- progress (issue 26, item 4) ------------------------------------------ */

/* Sends every Progress frame the workers queued, in the order they were
 * queued (loop thread).  A connection going away drops its frames
 * (send_frame). */
static void progress_flush(ap_server *s)
{
	struct progress_item *it, *next;

	if (!s->progress_open)
		return;
	uv_mutex_lock(&s->progress_mu);
	it = s->progress_head;
	s->progress_head = s->progress_tail = NULL;
	uv_mutex_unlock(&s->progress_mu);
	for (; it; it = next) {
		next = it->next;
		send_frame(it->c, it->frame, it->len);
		free(it);
	}
}

static void on_progress(uv_async_t *h)
{
	progress_flush(h->data);
}

/* The compiler's ap_compile_progress for a job (`user`), on its worker or
 * a helper thread: a Progress Envelope with the request's id, packed here
 * and queued for the loop thread.  Out of memory drops the event (the
 * answer still comes). */
static void job_progress(void *user, const char *stage, uint32_t done, uint32_t total,
			 double elapsed_ms)
{
	struct job *j = user;
	ap_server *s = j->c->srv;
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__Progress pg = APOLLO__PROGRESS__INIT;
	struct progress_item *it = malloc(sizeof(*it));

	if (!it)
		return;
	pg.stage = (char *)stage;
	pg.done = done;
	pg.total = total;
	pg.elapsed_ms = elapsed_ms;
	env.id = j->id;
	env.msg_case = APOLLO__ENVELOPE__MSG_PROGRESS;
	env.progress = &pg;
	it->next = NULL;
	it->c = j->c;
	it->frame = pack_frame(&env, &it->len);
	if (!it->frame) {
		free(it);
		return;
	}
	uv_mutex_lock(&s->progress_mu);
	if (s->progress_tail)
		s->progress_tail->next = it;
	else
		s->progress_head = it;
	s->progress_tail = it;
	uv_mutex_unlock(&s->progress_mu);
	uv_async_send(&s->progress_async);
}

/* Opens the progress hand-over (unreferenced: it keeps no loop alive).
 * 0 or a libuv error. */
static int progress_start(ap_server *s)
{
	int r = uv_mutex_init(&s->progress_mu);

	if (r)
		return r;
	r = uv_async_init(&s->loop, &s->progress_async, on_progress);
	if (r) {
		uv_mutex_destroy(&s->progress_mu);
		return r;
	}
	s->progress_async.data = s;
	s->progress_open = true;
	uv_unref((uv_handle_t *)&s->progress_async);
	return 0;
}

/* ---- requests ------------------------------------------------------------ */

/* A job decoded without its graph (j->full) that the warm path did not
 * answer: its Envelope decoded whole from the payload, in place of the
 * shallow one.  False when it does not decode now (out of memory). */
static bool decode_whole(struct job *j)
{
	size_t decoded;
	int why;
	Apollo__Envelope *env = decode_envelope(j->full, j->req_len, j->ratio, &why, &decoded);

	if (!env || env->msg_case != APOLLO__ENVELOPE__MSG_COMPILE || !env->compile) {
		if (env)
			apollo__envelope__free_unpacked(env, NULL);
		return false;
	}
	apollo__envelope__free_unpacked(j->env, NULL);
	j->env = env;
	return true;
}

static void work_compile(uv_work_t *req)
{
	struct job *j = req->data;
	bool bundle = false;

	atomic_fetch_sub(&j->c->srv->queued, 1);
	if (j->full) {
		/* decoded without its graph (decode_known): the warm answer, or
		 * the request decoded whole for the rest of the path */
		j->frame = ap_compile_warm_frame(j->compiler, j->env->compile, j->digest, j->client,
						 j->id, &j->frame_len);
		bundle = j->frame != NULL;
		ap_log(AP_LOG_DEBUG, "request %llu: a known request, %s", (unsigned long long)j->id,
		       j->frame ? "answered warm without decoding its graph" : "decoded whole");
		if (!j->frame && !decode_whole(j)) {
			free(j->full);
			j->full = NULL;
			return;   /* out of memory: after_compile answers */
		}
		free(j->full);
		j->full = NULL;
	}
	/* the reply's frame (a warm one spliced from the cache's bytes);
	 * NULL when out of memory: after_compile answers.  Stage events, when
	 * asked for, go to the loop through job_progress. */
	if (!j->frame) {
		ap_compile_progress pg = { job_progress, j, j->t_arrived };

		j->frame = ap_compile_run_frame_progress(j->compiler, j->env->compile,
							 j->has_digest ? j->digest : NULL, j->client,
							 j->has_admit ? &j->admit : NULL,
							 j->progress && j->c->srv->progress_open ? &pg : NULL,
							 j->id, &j->frame_len, &bundle);
	}
	j->ok = j->frame && bundle;

	/* Freeing a big request is slow too: done here, not on the loop. */
	apollo__envelope__free_unpacked(j->env, NULL);
	j->env = NULL;
	if (j->req_len > TRIM_BYTES)
		trim_heap();
}

/* A tuning report (apollo-client tune), on a worker: the measurements are
 * checked and stored by the compiler (ap_compiler_tune_report). */
static void work_tune(uv_work_t *req)
{
	struct job *j = req->data;
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__TuneReply r = APOLLO__TUNE_REPLY__INIT;
	Apollo__Error e = APOLLO__ERROR__INIT;
	ap_error err;
	uint64_t gen = 0;
	unsigned records = 0, pending = 0;

	atomic_fetch_sub(&j->c->srv->queued, 1);
	ap_error_clear(&err);
	j->code = ap_compiler_tune_report(j->compiler, j->client, j->env->tune_report, &records,
					  &pending, &gen, &err);
	j->ok = j->code == 0;
	env.id = j->id;
	if (j->ok) {
		r.accepted = (uint32_t)j->env->tune_report->n_measurements;
		r.records = records;
		r.pending = pending;
		r.generation = gen;
		env.msg_case = APOLLO__ENVELOPE__MSG_TUNE_REPLY;
		env.tune_reply = &r;
		ap_log(AP_LOG_INFO, "tuning report: %u measurements from %s on '%s': %u measured "
		       "records, %u kernels awaiting agreement", r.accepted, j->client,
		       j->env->tune_report->device, records, pending);
	} else {
		e.code = (Apollo__ErrorCode)ap_error_wire_code(j->code);
		e.message = err.msg;
		env.msg_case = APOLLO__ENVELOPE__MSG_ERROR;
		env.error = &e;
		ap_log(AP_LOG_DEBUG, "tuning report refused: %s", err.msg);
	}
	j->frame = pack_frame(&env, &j->frame_len);
	apollo__envelope__free_unpacked(j->env, NULL);
	j->env = NULL;
}

static void after_compile(uv_work_t *req, int status)
{
	struct job *j = req->data;
	conn *c = j->c;
	ap_server *s = c->srv;

	progress_flush(s);   /* this job's events before its answer */
	s->in_flight--;
	c->jobs--;
	mem_give(c, j->mem);
	c->t_active = uv_now(&s->loop);
	if (status == UV_ECANCELED)
		atomic_fetch_sub(&s->queued, 1);
	if (j->code)
		count_error(s, j->code);
	s->by_kind[j->kind][!j->ok || !j->frame]++;
	if (c->closing || c->shutting) {
		ap_log(AP_LOG_DEBUG, "request %llu: the client left before its reply",
		       (unsigned long long)j->id);
		free(j->frame);
	} else if (!j->frame) {
		send_error(c, j->id, AP_ENOMEM, "out of memory building the reply");
	} else {
		send_frame(c, j->frame, j->frame_len);
	}
	if (c->eof && !c->jobs)
		conn_shutdown(c);
	apollo__envelope__free_unpacked(j->env, NULL);   /* NULL unless cancelled */
	free(j->full);
	free(j);
	conn_unref(c);
	maybe_finish_drain(s);
}

/* A compile request that cannot be queued gets a CompileResponse error. */
static void send_compile_error(conn *c, uint64_t id, int code, const char *msg)
{
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__CompileResponse r = APOLLO__COMPILE_RESPONSE__INIT;
	Apollo__Error e = APOLLO__ERROR__INIT;

	e.code = (Apollo__ErrorCode)ap_error_wire_code(code);
	e.message = (char *)msg;
	r.result_case = APOLLO__COMPILE_RESPONSE__RESULT_ERROR;
	r.error = &e;
	env.id = id;
	env.msg_case = APOLLO__ENVELOPE__MSG_COMPILED;
	env.compiled = &r;
	count_error(c->srv, code);
	send_packed(c, &env);
}

/* Queues a compile request or a tuning report (env, consumed) on the
 * worker pool, its cost (decoded size + compile estimate) held against
 * max_pending_memory until it is answered; refusals are answered as its
 * reply kind says (a CompileResponse error, or an Envelope error for a
 * report): ERR_BUSY (draining, max_pending, max_pending_memory or the
 * holder's share of it), ERR_TOO_LARGE (max_compile_memory, or more than
 * max_pending_memory alone), ERR_NOMEM, ERR_INTERNAL. */
static void handle_compile(conn *c, Apollo__Envelope *env, struct frame_info *info)
{
	ap_server *s = c->srv;
	bool tune = env->msg_case == APOLLO__ENVELOPE__MSG_TUNE_REPORT;
	void (*refuse)(conn *, uint64_t, int, const char *) = tune ? send_error : send_compile_error;
	uint64_t cost = info->decoded + (info->has_cost ? info->cost.bytes : 0);
	char msg[400];
	struct job *j;
	int r, code = AP_EBUSY;

	msg[0] = '\0';
	if (s->draining) {
		snprintf(msg, sizeof(msg), "apollod is shutting down");
	} else if (s->in_flight >= s->max_pending) {
		snprintf(msg, sizeof(msg), "%u compile requests are pending (max_pending)",
			 s->in_flight);
	} else if (info->has_cost && info->cost.bytes > s->max_compile_mem) {
		code = AP_ETOOLARGE;
		snprintf(msg, sizeof(msg),
			 "compiling this graph is estimated to take %.1f MiB (%llu nodes, %llu "
			 "tensors, %llu bytes of constants), above max_compile_memory (%.1f MiB)",
			 info->cost.bytes / 1048576.0, (unsigned long long)info->cost.nodes,
			 (unsigned long long)info->cost.tensors,
			 (unsigned long long)info->cost.data_bytes, s->max_compile_mem / 1048576.0);
	} else if (cost > s->max_pending_mem) {
		code = AP_ETOOLARGE;
		snprintf(msg, sizeof(msg),
			 "this request would hold %.1f MiB (decoded %.1f MiB, compile estimate "
			 "%.1f MiB), above max_pending_memory (%.1f MiB) on its own",
			 cost / 1048576.0, info->decoded / 1048576.0,
			 (cost - info->decoded) / 1048576.0, s->max_pending_mem / 1048576.0);
	} else {
		mem_take(c, cost, msg, sizeof(msg));
	}
	if (msg[0]) {
		ap_log(AP_LOG_DEBUG, "request %llu refused: %s", (unsigned long long)env->id, msg);
		refuse(c, env->id, code, msg);
		apollo__envelope__free_unpacked(env, NULL);
		return;
	}
	j = calloc(1, sizeof(*j));
	if (!j) {
		mem_give(c, cost);
		refuse(c, env->id, AP_ENOMEM, "out of memory queueing the request");
		apollo__envelope__free_unpacked(env, NULL);
		return;
	}
	j->c = c;
	j->compiler = s->compiler;
	j->id = env->id;
	j->req_len = info->len;
	j->mem = cost;
	j->env = env;
	j->full = info->full;   /* taken */
	info->full = NULL;
	j->ratio = s->decode_ratio;
	j->admit.decoded = info->decoded;
	j->admit.cost = info->cost;
	j->has_admit = info->has_cost && !tune;
	j->kind = tune ? AP_KIND_TUNE : AP_KIND_COMPILE;
	j->progress = !tune && env->compile && env->compile->progress;
	j->t_arrived = ap_now_ms();
	conn_client(c, j->client, sizeof(j->client));
	if (info->has_digest) {
		j->has_digest = true;
		memcpy(j->digest, info->digest, 32);
	}
	j->req.data = j;
	r = uv_queue_work(&s->loop, &j->req, tune ? work_tune : work_compile, after_compile);
	if (r) {
		mem_give(c, cost);
		refuse(c, env->id, AP_EINTERNAL, uv_strerror(r));
		apollo__envelope__free_unpacked(env, NULL);
		free(j);
		return;
	}
	c->refs++;
	c->jobs++;
	s->in_flight++;
	atomic_fetch_add(&s->queued, 1);
}

/* Refuses an unauthenticated TCP client (AP_EVERSION) and closes. */
static void auth_fail(conn *c, uint64_t id, const char *why)
{
	send_error(c, id, AP_EVERSION, why);
	conn_shutdown(c);
}

/* TCP: one step of the token handshake (common/frame.h).  True when the
 * client has now proved it knows the token (the full HelloReply is due);
 * false when a challenge was sent or the connection is being closed. */
static bool tcp_auth_step(conn *c, const Apollo__Hello *h, uint64_t id)
{
	ap_server *s = c->srv;
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__HelloReply r = APOLLO__HELLO_REPLY__INIT;
	uint8_t proof[AP_AUTH_PROOF_BYTES];
	char msg[160];

	if (!c->challenged) {
		if (h->auth_nonce.len != AP_AUTH_NONCE_BYTES) {
			auth_fail(c, id, "TCP clients must authenticate with the token: send a Hello "
				  "with a 32-byte auth_nonce (libapollo-client with a token does)");
			return false;
		}
		memcpy(c->nonce_c, h->auth_nonce.data, AP_AUTH_NONCE_BYTES);
		if (ap_random_bytes(c->nonce_s, AP_AUTH_NONCE_BYTES) ||
		    ap_auth_proof(s->tcp_token, AP_AUTH_SERVER, c->nonce_c, c->nonce_s, proof)) {
			send_error(c, id, AP_EINTERNAL, "cannot compute the handshake");
			conn_shutdown(c);
			return false;
		}
		c->challenged = true;
		r.schema_version = APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT;
		r.server = SERVER_NAME;
		r.nvrtc_version = "";
		r.auth_nonce.data = c->nonce_s;
		r.auth_nonce.len = AP_AUTH_NONCE_BYTES;
		r.auth_proof.data = proof;
		r.auth_proof.len = AP_AUTH_PROOF_BYTES;
		env.id = id;
		env.msg_case = APOLLO__ENVELOPE__MSG_HELLO_REPLY;
		env.hello_reply = &r;
		send_packed(c, &env);
		return false;
	}
	if (!ap_auth_check(s->tcp_token, AP_AUTH_CLIENT, c->nonce_c, c->nonce_s,
			   h->auth_proof.data, h->auth_proof.len)) {
		ap_log(AP_LOG_WARN, "a TCP client failed the token handshake");
		auth_fail(c, id, "authentication failed: the client does not know the token");
		return false;
	}
	c->authed = true;
	if (c->unauth) {
		c->unauth = false;
		s->n_unauth--;
	}
	if (!take_slot(c, msg, sizeof(msg))) {
		send_error(c, id, AP_EBUSY, msg);
		conn_shutdown(c);
		return false;
	}
	return true;
}

static void handle_hello(conn *c, Apollo__Envelope *req)
{
	ap_server *s = c->srv;
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__HelloReply r = APOLLO__HELLO_REPLY__INIT;
	const char *nv = ap_nvrtc_version();

	if (req->hello->schema_version != APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT) {
		char msg[160];
		snprintf(msg, sizeof(msg), "schema version %u is not supported; apollod speaks %d",
			 req->hello->schema_version, APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT);
		send_error(c, req->id, AP_EVERSION, msg);
		if (c->is_tcp && !c->authed)
			conn_shutdown(c);
		return;
	}
	if (c->is_tcp && !c->authed && !tcp_auth_step(c, req->hello, req->id))
		return;
	r.schema_version = APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT;
	r.server = SERVER_NAME;
	r.nvrtc_version = (char *)(nv ? nv : "");
	r.n_targets = s->n_targets;
	r.targets = s->targets;
	env.id = req->id;
	env.msg_case = APOLLO__ENVELOPE__MSG_HELLO_REPLY;
	env.hello_reply = &r;
	send_packed(c, &env);
}

/* A snapshot of every metric (metrics.h); NULL when out of memory. */
static ap_metrics_snapshot *snapshot(ap_server *s, ap_compile_counters *cc, ap_cache_counts *kc)
{
	ap_metrics_input in;
	ap_redis_counts rc;
	ap_redis *redis = ap_compiler_redis(s->compiler);

	memset(&in, 0, sizeof(in));
	ap_compiler_get_counters(s->compiler, cc);
	ap_cache_get_counts(s->cache, kc);
	if (redis)
		ap_redis_get_counts(redis, &rc);
	in.compile = cc;
	in.cache = kc;
	in.redis = redis ? &rc : NULL;
	memcpy(in.requests, s->by_kind, sizeof(in.requests));
	memcpy(in.net_errors_by_code, s->errors_by_code, sizeof(in.net_errors_by_code));
	in.clients = s->n_clients;
	in.in_flight = s->in_flight;
	in.queued = atomic_load(&s->queued);
	in.decoding = s->decoding;
	in.evicted = s->evicted;
	in.pending_memory = s->pending_mem;
	in.uptime_s = (ap_now_ms() - s->start_ms) / 1e3;
	return ap_metrics_build(&in);
}

/* The metrics endpoint's body (http.h): the snapshot as Prometheus text. */
static char *render_metrics(void *arg, size_t *len)
{
	ap_compile_counters cc;
	ap_cache_counts kc;
	ap_metrics_snapshot *m = snapshot(arg, &cc, &kc);
	Apollo__MetricFamily **f;
	size_t n;
	char *text;

	if (!m)
		return NULL;
	f = ap_metrics_families(m, &n);
	text = ap_metrics_text(f, n, len);
	ap_metrics_snapshot_free(m);
	return text;
}

static void handle_stats(conn *c, uint64_t id)
{
	ap_server *s = c->srv;
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__StatsReply r = APOLLO__STATS_REPLY__INIT;
	ap_compile_counters cc;
	ap_cache_counts kc;
	ap_metrics_snapshot *m = snapshot(s, &cc, &kc);

	if (m)
		r.metrics = ap_metrics_families(m, &r.n_metrics);
	r.requests = s->requests;
	r.errors = s->errors + cc.errors;
	r.cache_hits = cc.cache_hits;
	r.cache_misses = cc.cache_misses;
	r.kernels_compiled = cc.kernels_compiled;
	r.cache_entries = kc.actions + kc.kernels;
	r.cache_blob_bytes = kc.blob_bytes;
	r.clients = s->n_clients;
	r.in_flight = s->in_flight;
	r.uptime_s = (ap_now_ms() - s->start_ms) / 1e3;
	env.id = id;
	env.msg_case = APOLLO__ENVELOPE__MSG_STATS_REPLY;
	env.stats_reply = &r;
	send_packed(c, &env);
	ap_metrics_snapshot_free(m);
}

static void handle_ping(conn *c, uint64_t id)
{
	Apollo__Envelope env = APOLLO__ENVELOPE__INIT;
	Apollo__PingReply r = APOLLO__PING_REPLY__INIT;

	r.server = SERVER_NAME;
	env.id = id;
	env.msg_case = APOLLO__ENVELOPE__MSG_PONG;
	env.pong = &r;
	send_packed(c, &env);
}

/* One decoded frame: `env` (consumed), NULL when the payload did not
 * decode as an Envelope, for the reason info->why (decode_frame). */
static void dispatch(conn *c, Apollo__Envelope *env, struct frame_info *info)
{
	ap_server *s = c->srv;
	uint64_t errors = s->errors;
	int kind = AP_KIND_OTHER, why = info->why;
	uint32_t len = info->len;
	char msg[200];

	s->requests++;
	c->t_active = uv_now(&s->loop);
	if (env) {
		switch (env->msg_case) {
		case APOLLO__ENVELOPE__MSG_COMPILE: kind = AP_KIND_COMPILE; break;
		case APOLLO__ENVELOPE__MSG_PING: kind = AP_KIND_PING; break;
		case APOLLO__ENVELOPE__MSG_HELLO: kind = AP_KIND_HELLO; break;
		case APOLLO__ENVELOPE__MSG_STATS: kind = AP_KIND_STATS; break;
		case APOLLO__ENVELOPE__MSG_TUNE_REPORT: kind = AP_KIND_TUNE; break;
		default: break;
		}
	}
	if (!env) {
		if (why == AP_ETOOLARGE)
			snprintf(msg, sizeof(msg),
				 "a frame of %u bytes would take more than %zu bytes of memory once "
				 "decoded (decode_memory_ratio %u)", len,
				 ap_pb_decode_limit(len, s->decode_ratio, DECODE_FLOOR), s->decode_ratio);
		else if (why == AP_ENOMEM)
			snprintf(msg, sizeof(msg), "out of memory decoding a frame of %u bytes", len);
		else
			snprintf(msg, sizeof(msg),
				 "a frame of %u bytes does not decode as an apollo.Envelope", len);
		send_error(c, 0, why, msg);
		s->by_kind[kind][1]++;
		if (why != AP_EMESSAGE)
			trim_heap();
		if (c->is_tcp && !c->authed)
			conn_shutdown(c);
		return;
	}
	if (c->is_tcp && !c->authed && env->msg_case != APOLLO__ENVELOPE__MSG_HELLO) {
		send_error(c, env->id, AP_EVERSION,
			   "a TCP client's first message must be a Hello carrying the token");
		s->by_kind[kind][1]++;
		apollo__envelope__free_unpacked(env, NULL);
		conn_shutdown(c);
		return;
	}
	switch (env->msg_case) {
	case APOLLO__ENVELOPE__MSG_PING:
		handle_ping(c, env->id);
		break;
	case APOLLO__ENVELOPE__MSG_HELLO:
		handle_hello(c, env);
		break;
	case APOLLO__ENVELOPE__MSG_STATS:
		handle_stats(c, env->id);
		break;
	case APOLLO__ENVELOPE__MSG_COMPILE:
	case APOLLO__ENVELOPE__MSG_TUNE_REPORT:
		handle_compile(c, env, info);   /* takes env */
		if (s->errors != errors)   /* refused; else counted when answered */
			s->by_kind[kind][1]++;
		return;
	case APOLLO__ENVELOPE__MSG__NOT_SET:
		send_error(c, env->id, AP_EMESSAGE, "the Envelope carries no message");
		break;
	default:
		snprintf(msg, sizeof(msg), "Envelope field %d is a reply, not a request",
			 (int)env->msg_case);
		send_error(c, env->id, AP_EMESSAGE, msg);
		break;
	}
	s->by_kind[kind][s->errors != errors]++;
	apollo__envelope__free_unpacked(env, NULL);
}

static void work_decode(uv_work_t *req)
{
	struct decode *d = req->data;
	uint32_t len = d->info.len;

	d->env = decode_frame(d->compiler, d->payload, len, d->ratio, &d->info);
	if (!d->info.full)
		free(d->payload);
	d->payload = NULL;
}

/* Starts reading again after a decode job: first the bytes that arrived
 * behind the decoded frame, then the socket. */
static void conn_resume(conn *c)
{
	uint8_t *b = c->backlog;

	c->backlog = NULL;
	if (b) {
		consume(c, b, c->backlog_len);   /* may start the next decode job */
		free(b);
	}
	if (c->decoding || c->closing || c->shutting || c->eof || c->paused)
		return;
	c->t_frame = uv_now(c->h.handle.loop);   /* the frame clock stood still */
	if (uv_read_start(&c->h.stream, on_alloc, on_read))
		conn_close(c);
}

static void after_decode(uv_work_t *req, int status)
{
	struct decode *d = req->data;
	conn *c = d->c;
	ap_server *s = c->srv;

	s->decoding--;
	c->decoding = false;
	mem_give(c, c->decode_mem);
	c->decode_mem = 0;
	free(d->payload);   /* NULL unless the job was cancelled */
	if (c->closing || c->shutting) {
		ap_log(AP_LOG_DEBUG, "a frame of %u bytes: the client left while it was decoded",
		       d->info.len);
		apollo__envelope__free_unpacked(d->env, NULL);
	} else {
		dispatch(c, d->env, &d->info);   /* a compile job takes info.full */
	}
	free(d->info.full);
	free(d);
	/* Before resuming: once draining, frames are decoded inline, so the
	 * last decode job ends the wait. */
	maybe_finish_drain(s);
	if (!c->closing && !c->shutting)
		conn_resume(c);
	conn_unref(c);
}

/* A large frame that max_pending_memory has no room for: answered
 * ERR_BUSY undecoded, as its kind would be (the Envelope's id and which
 * request it carries read from the wire), the connection kept. */
static void refuse_frame(conn *c, const uint8_t *payload, uint32_t len, const char *msg)
{
	ap_server *s = c->srv;
	int kind = AP_KIND_OTHER;
	uint64_t id = 0;
	ap_pbw r;
	ap_pbw_field f;

	ap_pbw_init(&r, payload, len);
	while (ap_pbw_next(&r, &f) == 1) {
		if (f.number == 1 && f.wire == 0)
			id = f.varint;
		else if (f.number == 8)
			kind = AP_KIND_COMPILE;
		else if (f.number == 11)
			kind = AP_KIND_TUNE;
	}
	s->requests++;
	s->by_kind[kind][1]++;
	ap_log(AP_LOG_DEBUG, "a frame of %u bytes refused: %s", len, msg);
	if (kind == AP_KIND_COMPILE)
		send_compile_error(c, id, AP_EBUSY, msg);
	else
		send_error(c, id, AP_EBUSY, msg);
}

/* One complete frame payload (consumed): decoded here when small or when
 * the daemon is draining, else by a decode job, the frame holding
 * FRAME_FACTOR x its length against max_pending_memory meanwhile (true
 * also when it is refused for that; false when no job could be queued:
 * the caller then decodes inline). */
static bool start_decode(conn *c, uint8_t *payload, uint32_t len)
{
	ap_server *s = c->srv;
	uint64_t hold = (uint64_t)len * FRAME_FACTOR;
	struct decode *d;
	char msg[400];

	if (len <= DECODE_INLINE_MAX || s->draining)
		return false;
	if (!mem_take(c, hold, msg, sizeof(msg))) {
		refuse_frame(c, payload, len, msg);
		free(payload);
		return true;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		mem_give(c, hold);
		return false;
	}
	d->c = c;
	d->payload = payload;
	d->info.len = len;
	d->ratio = s->decode_ratio;
	d->compiler = s->compiler;
	d->req.data = d;
	if (uv_queue_work(&s->loop, &d->req, work_decode, after_decode)) {
		mem_give(c, hold);
		free(d);
		return false;
	}
	uv_read_stop(&c->h.stream);
	c->decoding = true;
	c->decode_mem = hold;
	c->refs++;
	s->decoding++;
	return true;
}

static void handle_frame(conn *c, uint8_t *payload, uint32_t len)
{
	struct frame_info info;
	Apollo__Envelope *env;

	if (start_decode(c, payload, len))
		return;
	env = decode_frame(c->srv->compiler, payload, len, c->srv->decode_ratio, &info);
	if (!info.full)
		free(payload);
	dispatch(c, env, &info);   /* a compile job takes info.full */
	free(info.full);
}

/* Feeds `n` received bytes through the frame state machine.  When a frame
 * goes to a decode job, the bytes after it are kept in c->backlog. */
static void consume(conn *c, const uint8_t *p, size_t n)
{
	ap_server *s = c->srv;

	while (n > 0 && !c->closing && !c->shutting) {
		if (c->decoding) {
			c->backlog = malloc(n);
			if (!c->backlog) {
				ap_log(AP_LOG_ERROR, "out of memory holding a client's requests");
				conn_close(c);
				return;
			}
			memcpy(c->backlog, p, n);
			c->backlog_len = n;
			return;
		}
		if (c->hdr_have < AP_FRAME_HEADER_BYTES) {
			size_t take = AP_FRAME_HEADER_BYTES - c->hdr_have;
			ap_error err;
			int rc;

			if (take > n)
				take = n;
			if (c->hdr_have == 0)
				c->t_frame = uv_now(&s->loop);
			memcpy(c->hdr + c->hdr_have, p, take);
			c->hdr_have += (unsigned)take;
			p += take;
			n -= take;
			if (c->hdr_have < AP_FRAME_HEADER_BYTES)
				return;
			c->want = ap_frame_get_len(c->hdr);
			rc = ap_frame_check_len(c->want,
						c->is_tcp && !c->authed ? s->max_unauth_frame : s->max_frame,
						&err);
			if (rc) {
				s->requests++;
				send_error(c, 0, rc, err.msg);
				conn_shutdown(c);
				return;
			}
			c->payload = malloc(c->want);
			if (!c->payload) {
				s->requests++;
				send_error(c, 0, AP_ENOMEM, "out of memory for the frame");
				conn_shutdown(c);
				return;
			}
			c->have = 0;
			continue;
		}
		size_t take = c->want - c->have;
		if (take > n)
			take = n;
		memcpy(c->payload + c->have, p, take);
		c->have += (uint32_t)take;
		p += take;
		n -= take;
		if (c->have == c->want) {
			uint8_t *payload = c->payload;
			c->payload = NULL;
			c->hdr_have = 0;
			handle_frame(c, payload, c->want);
		}
	}
}

/* Every connection reads into the server's buffer: libuv reads one
 * stream at a time and on_read's consume() copies whatever it keeps. */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	conn *c = h->data;

	buf->base = (char *)c->srv->rbuf;
	buf->len = sizeof(c->srv->rbuf);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
	conn *c = stream->data;

	if (nread > 0) {
		consume(c, (const uint8_t *)buf->base, (size_t)nread);
		return;
	}
	if (nread == 0)
		return;
	if (c->hdr_have > 0)
		ap_log(AP_LOG_DEBUG, "client disconnected in the middle of a frame (%u of %u bytes)",
		       c->hdr_have < AP_FRAME_HEADER_BYTES ? c->hdr_have : c->have,
		       c->hdr_have < AP_FRAME_HEADER_BYTES ? AP_FRAME_HEADER_BYTES : c->want);
	free(c->payload);
	c->payload = NULL;
	c->hdr_have = 0;
	if (nread == UV_EOF && c->jobs) {
		/* Half-closed: answer what is running, then close. */
		c->eof = true;
		uv_read_stop(stream);
		return;
	}
	if (nread == UV_EOF)
		conn_shutdown(c);
	else
		conn_close(c);
}

/* ---- slots (issue 29, item 8) ---------------------------------------------- */

/* Who holds a connection, for max_clients_per_user, making room and the
 * memory share: its uid on the Unix socket; every authenticated TCP client
 * is one holder (they share the token), and so are Unix peers whose uid
 * the kernel did not say. */
#define OWNER_TCP ((uint64_t)1 << 32)
#define OWNER_UNKNOWN (OWNER_TCP + 1)

static uint64_t conn_owner(const conn *c)
{
	return c->is_tcp ? OWNER_TCP : c->has_uid ? (uint64_t)c->uid : OWNER_UNKNOWN;
}

/* Root and admin_uid: admin_clients slots beyond every limit. */
static bool conn_admin(const conn *c)
{
	const ap_server *s = c->srv;

	return !c->is_tcp && c->has_uid &&
	       (c->uid == 0 || (s->admin_uid >= 0 && (long long)c->uid == s->admin_uid));
}

/* A served connection with nothing going on: no request running or being
 * decoded, no reply queued, no frame half read. */
static bool conn_idle(const conn *c)
{
	return c->served && !c->closing && !c->shutting && !c->hdr_have && !c->jobs &&
	       !c->decoding && !c->queued && !c->paused;
}

/* Served connections held by `owner`. */
static unsigned owner_count(const ap_server *s, uint64_t owner)
{
	unsigned n = 0;

	for (const conn *o = s->conns; o; o = o->next)
		n += o->served && conn_owner(o) == owner;
	return n;
}

struct held {
	uint64_t owner;
	conn *c;
};

static int cmp_held(const void *a, const void *b)
{
	const struct held *x = a, *y = b;

	return x->owner < y->owner ? -1 : x->owner > y->owner;
}

/* The daemon is full and a holder of `have` connections wants one more:
 * closes the least recently active idle connection of the holder with the
 * most connections, when it holds at least have + 2 (so that two users
 * never take turns closing each other's).  True when a slot was freed. */
static bool make_room(ap_server *s, uint64_t owner, unsigned have)
{
	struct held *h = malloc((s->n_served + 1) * sizeof(*h));
	unsigned n = 0, best_count = 0;
	conn *victim = NULL;

	if (!h)
		return false;
	for (conn *o = s->conns; o && n < s->n_served; o = o->next)
		if (o->served)
			h[n++] = (struct held){ conn_owner(o), o };
	qsort(h, n, sizeof(*h), cmp_held);
	for (unsigned i = 0, j; i < n; i = j) {
		conn *idle = NULL;

		for (j = i; j < n && h[j].owner == h[i].owner; j++)
			if (conn_idle(h[j].c) && (!idle || h[j].c->t_active < idle->t_active))
				idle = h[j].c;
		if (h[i].owner != owner && idle && j - i >= have + 2 && j - i > best_count) {
			best_count = j - i;
			victim = idle;
		}
	}
	free(h);
	if (!victim)
		return false;
	ap_log(AP_LOG_INFO, "apollod is full (%u clients): closing an idle connection of %s%u, "
	       "which holds %u, for a client holding %u", s->n_served,
	       victim->is_tcp ? "TCP clients" : "uid ", victim->is_tcp ? 0 : (unsigned)victim->uid,
	       best_count, have);
	victim->served = false;
	s->n_served--;
	s->evicted++;
	conn_close(victim);
	return true;
}

/* ---- pending memory (issue 29, item 5) --------------------------------------- */

static void owner_name(const conn *c, char *buf, size_t cap)
{
	if (c->is_tcp)
		snprintf(buf, cap, "TCP clients");
	else if (c->has_uid)
		snprintf(buf, cap, "uid %u", (unsigned)c->uid);
	else
		snprintf(buf, cap, "clients of unknown uid");
}

/* Counts `bytes` for a request or frame of `c` against max_pending_memory
 * and its holder's share of it: true, or false with `msg` naming the
 * limit it would pass (nothing counted). */
static bool mem_take(conn *c, uint64_t bytes, char *msg, size_t cap)
{
	ap_server *s = c->srv;
	uint64_t owner = conn_owner(c), mine = 0;
	char who[32];

	if (s->pending_mem + bytes > s->max_pending_mem) {
		snprintf(msg, cap, "requests queued or running hold %.1f MiB; this one (%.1f MiB) "
			 "would pass max_pending_memory (%.1f MiB): try again later",
			 s->pending_mem / 1048576.0, bytes / 1048576.0,
			 s->max_pending_mem / 1048576.0);
		return false;
	}
	for (const conn *o = s->conns; o; o = o->next)
		if (conn_owner(o) == owner)
			mine += o->mem;
	if (mine + bytes > s->user_share) {
		owner_name(c, who, sizeof(who));
		snprintf(msg, cap, "the requests of %s queued or running hold %.1f MiB; this one "
			 "(%.1f MiB) would pass their share of max_pending_memory (%.1f MiB): "
			 "try again later", who, mine / 1048576.0, bytes / 1048576.0,
			 s->user_share / 1048576.0);
		return false;
	}
	c->mem += bytes;
	s->pending_mem += bytes;
	return true;
}

/* Gives back what mem_take counted. */
static void mem_give(conn *c, uint64_t bytes)
{
	c->mem -= bytes;
	c->srv->pending_mem -= bytes;
}

/* Gives `c` one of the max_clients slots (Unix: on accepting it; TCP: once
 * it has authenticated): within max_clients_per_user (Unix; root's too),
 * and when the daemon is full by closing another holder's idle connection
 * (make_room) or, for root and admin_uid, from the admin_clients slots
 * beyond max_clients.  False with `msg` saying why not. */
static bool take_slot(conn *c, char *msg, size_t cap)
{
	ap_server *s = c->srv;
	uint64_t owner = conn_owner(c);
	unsigned have = owner_count(s, owner);
	unsigned reserve = conn_admin(c) ? s->admin_reserve : 0;

	if (!c->is_tcp && c->has_uid && have >= s->max_per_user) {
		snprintf(msg, cap, "uid %u already has %u connections to apollod (max_clients_per_user)",
			 (unsigned)c->uid, have);
		return false;
	}
	if (s->n_served >= s->max_clients && !make_room(s, owner, have) &&
	    s->n_served >= s->max_clients + reserve) {
		snprintf(msg, cap, "apollod serves at most %u clients at once (max_clients), "
			 "none of them idle", s->max_clients);
		return false;
	}
	c->served = true;
	s->n_served++;
	return true;
}

/* Unix: the peer's uid (SO_PEERCRED), for max_clients_per_user. */
static void peer_uid(conn *c)
{
	struct ucred cr;
	socklen_t n = sizeof(cr);
	uv_os_fd_t fd;

	if (uv_fileno(&c->h.handle, &fd) == 0 &&
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &n) == 0) {
		c->uid = cr.uid;
		c->has_uid = true;
	}
}

/* Admission: counts a new connection against its budget, or answers
 * ERR_BUSY and shuts it down (false).  Unix connections take a slot
 * (take_slot) at once; TCP ones count against max_unauth_clients until
 * they authenticate, and take their slot then (tcp_auth_step), so that an
 * unauthenticated client can neither hold a slot nor make room. */
static bool admit(conn *c)
{
	ap_server *s = c->srv;
	char msg[160];

	if (c->is_tcp) {
		if (s->n_unauth < s->max_unauth) {
			c->unauth = true;
			s->n_unauth++;
			return true;
		}
		snprintf(msg, sizeof(msg),
			 "apollod has %u TCP connections waiting to authenticate (max_unauth_clients)",
			 s->n_unauth);
	} else if (take_slot(c, msg, sizeof(msg))) {
		return true;
	}
	ap_log(AP_LOG_DEBUG, "refusing a client: %s", msg);
	send_error(c, 0, AP_EBUSY, msg);
	conn_shutdown(c);
	return false;
}

static void on_connection(uv_stream_t *listener, int status)
{
	ap_server *s = listener->data;
	bool is_tcp = listener == (uv_stream_t *)&s->tcp;
	conn *c;
	int r;

	if (status < 0) {
		ap_log(AP_LOG_WARN, "accept: %s", uv_strerror(status));
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		ap_log(AP_LOG_ERROR, "out of memory accepting a connection");
		return;
	}
	c->srv = s;
	c->is_tcp = is_tcp;
	c->refs = 1;
	r = is_tcp ? uv_tcp_init(&s->loop, &c->h.tcp) : uv_pipe_init(&s->loop, &c->h.pipe, 0);
	if (r) {
		free(c);
		return;
	}
	c->h.handle.data = c;
	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	s->conns = c;
	s->n_clients++;
	c->t_accept = c->t_active = c->t_frame = uv_now(&s->loop);
	r = uv_accept(listener, &c->h.stream);
	if (r) {
		ap_log(AP_LOG_WARN, "accept: %s", uv_strerror(r));
		conn_close(c);
		return;
	}
	if (!is_tcp)
		peer_uid(c);
	if (!admit(c))
		return;
	r = uv_read_start(&c->h.stream, on_alloc, on_read);
	if (r)
		conn_close(c);
	ap_log(AP_LOG_DEBUG, "client connected (%u open)", s->n_clients);
}

/* ---- time limits ----------------------------------------------------------- */

/* Applies every connection's time limits (see the file comment). */
static void on_sweep(uv_timer_t *t)
{
	ap_server *s = t->data;
	uint64_t now = uv_now(&s->loop);

	for (conn *c = s->conns, *next; c; c = next) {
		char msg[160];

		next = c->next;
		if (c->closing)
			continue;
		if (c->shutting) {
			if (now - c->t_shut > GRACE_MS)
				conn_close(c);   /* it does not take its last reply */
			continue;
		}
		if (c->queued && now - c->t_write > s->send_timeout) {
			ap_log(AP_LOG_INFO, "a client left its replies unread for %llu ms: "
			       "disconnecting it", (unsigned long long)(now - c->t_write));
			conn_close(c);
		} else if (c->is_tcp && !c->authed && now - c->t_accept > s->auth_timeout) {
			snprintf(msg, sizeof(msg), "not authenticated within %llu ms (auth_timeout_ms)",
				 (unsigned long long)s->auth_timeout);
			auth_fail(c, 0, msg);
		} else if (c->hdr_have && !c->paused && !c->decoding &&
			   now - c->t_frame > s->frame_timeout) {
			snprintf(msg, sizeof(msg),
				 "a frame was not complete %llu ms after its first byte (frame_timeout_ms)",
				 (unsigned long long)s->frame_timeout);
			send_error(c, 0, AP_EFRAME, msg);
			conn_shutdown(c);
		} else if (s->idle_timeout && !c->hdr_have && !c->jobs && !c->decoding &&
			   !c->queued && now - c->t_active > s->idle_timeout) {
			ap_log(AP_LOG_DEBUG, "closing a connection idle for %llu ms",
			       (unsigned long long)(now - c->t_active));
			conn_close(c);
		}
	}
}

/* The sweep's period: a quarter of the shortest limit, 10 ms to 1 s. */
static uint64_t sweep_period(const ap_server *s)
{
	uint64_t p = s->auth_timeout;

	if (s->frame_timeout < p)
		p = s->frame_timeout;
	if (s->send_timeout < p)
		p = s->send_timeout;
	if (s->idle_timeout && s->idle_timeout < p)
		p = s->idle_timeout;
	p /= 4;
	return p < 10 ? 10 : p > 1000 ? 1000 : p;
}

/* ---- shutdown ------------------------------------------------------------ */

static void on_grace(uv_timer_t *t)
{
	ap_server *s = t->data;

	ap_log(AP_LOG_WARN, "closing %u connections that did not take their replies", s->n_clients);
	for (conn *c = s->conns; c; c = c->next)
		conn_close(c);
	uv_close((uv_handle_t *)&s->grace, NULL);
}

static void maybe_finish_drain(ap_server *s)
{
	if (!s->draining || s->in_flight > 0 || s->decoding > 0 || s->closing_all)
		return;
	s->closing_all = true;
	ap_log(AP_LOG_INFO, "no request in flight: closing %u connections", s->n_clients);
	for (conn *c = s->conns, *next; c; c = next) {
		next = c->next;
		conn_shutdown(c);
	}
	if (s->signals_open) {
		uv_close((uv_handle_t *)&s->sigterm, NULL);
		uv_close((uv_handle_t *)&s->sigint, NULL);
		s->signals_open = false;
	}
	if (s->sweep_open) {
		uv_close((uv_handle_t *)&s->sweep, NULL);
		s->sweep_open = false;
	}
	if (s->watchdog_open) {
		uv_close((uv_handle_t *)&s->watchdog, NULL);
		s->watchdog_open = false;
	}
	ap_http_close(s->metrics);
	s->metrics = NULL;
	if (s->conns && uv_timer_init(&s->loop, &s->grace) == 0) {
		s->grace.data = s;
		s->grace_open = true;
		uv_timer_start(&s->grace, on_grace, GRACE_MS, 0);
		uv_unref((uv_handle_t *)&s->grace);
	}
}

static void remove_socket_file(ap_server *s)
{
	if (s->own_socket_file) {
		unlink(s->socket_path);
		s->own_socket_file = false;
	}
}

static void on_signal(uv_signal_t *h, int signum)
{
	ap_server *s = h->data;

	if (s->draining) {
		ap_log(AP_LOG_WARN, "%s again: still finishing %u requests", strsignal(signum),
		       s->in_flight);
		return;
	}
	s->draining = true;
	ap_notify("STOPPING=1\nSTATUS=finishing the requests in flight");
	ap_log(AP_LOG_INFO, "%s: no new connections; finishing %u requests in flight",
	       strsignal(signum), s->in_flight);
	if (s->pipe_open) {
		uv_close((uv_handle_t *)&s->pipe, NULL);
		s->pipe_open = false;
	}
	if (s->tcp_open) {
		uv_close((uv_handle_t *)&s->tcp, NULL);
		s->tcp_open = false;
	}
	remove_socket_file(s);
	maybe_finish_drain(s);
}

/* ---- set-up -------------------------------------------------------------- */

/* Refuses a live daemon's socket; removes a stale one.  0 or AP_E*. */
static int claim_socket_path(const char *path, ap_error *err)
{
	struct sockaddr_un addr;
	struct stat st;
	int fd, r;

	if (lstat(path, &st)) {
		if (errno == ENOENT)
			return 0;
		return ap_error_set(err, AP_EIO, NULL, NULL, "socket %s: %s", path, strerror(errno));
	}
	if (!S_ISSOCK(st.st_mode))
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "%s exists and is not a socket; not removing it", path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return ap_error_set(err, AP_EIO, NULL, NULL, "socket: %s", strerror(errno));
	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
	r = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
	if (r == 0) {
		close(fd);
		return ap_error_set(err, AP_EBUSY, NULL, NULL,
				    "another apollod is already listening on %s", path);
	}
	r = errno;
	close(fd);
	if (r != ECONNREFUSED && r != ENOENT)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot probe socket %s: %s", path,
				    strerror(r));
	ap_log(AP_LOG_INFO, "removing stale socket %s", path);
	if (unlink(path) && errno != ENOENT)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot remove stale socket %s: %s", path,
				    strerror(errno));
	return 0;
}

static int make_targets(ap_server *s)
{
	int archs[64];
	int n = ap__nvrtc_archs(archs, 64);
	size_t k = 0;

	s->targets = calloc((size_t)(1 + 3 * n), sizeof(char *));
	if (!s->targets)
		return AP_ENOMEM;
	s->targets[k++] = strdup("cpu");
	for (int i = 0; i < n; i++) {
		char t[32];
		snprintf(t, sizeof(t), "sm_%d", archs[i]);
		s->targets[k++] = strdup(t);
		if (archs[i] >= 90) {
			snprintf(t, sizeof(t), "sm_%da", archs[i]);
			s->targets[k++] = strdup(t);
		}
		snprintf(t, sizeof(t), "compute_%d", archs[i]);
		s->targets[k++] = strdup(t);
	}
	s->n_targets = k;
	for (size_t i = 0; i < k; i++)
		if (!s->targets[i])
			return AP_ENOMEM;
	return 0;
}

/* Binds and listens on the Unix socket of `cfg` (s->socket_path): its
 * directory checked, a stale socket removed, mode socket_mode. */
static int bind_unix(ap_server *s, const ap_config *cfg, ap_error *err)
{
	mode_t old_mask;
	int r, rc;

	rc = ap_socket_dir_check(s->socket_path, err);
	if (rc)
		return rc;
	rc = claim_socket_path(s->socket_path, err);
	if (rc)
		return rc;
	uv_pipe_init(&s->loop, &s->pipe, 0);
	s->pipe.data = s;
	s->pipe_open = true;
	old_mask = umask(~(mode_t)cfg->socket_mode & 0777);
	r = uv_pipe_bind(&s->pipe, s->socket_path);
	umask(old_mask);
	if (r)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot bind %s: %s", s->socket_path,
				    uv_strerror(r));
	s->own_socket_file = true;
	chmod(s->socket_path, (mode_t)cfg->socket_mode);
	r = uv_listen((uv_stream_t *)&s->pipe, 128, on_connection);
	if (r)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot listen on %s: %s",
				    s->socket_path, uv_strerror(r));
	return 0;
}

static int bind_tcp(ap_server *s, const ap_config *cfg, ap_error *err)
{
	struct sockaddr_storage addr;
	int r, rc;

	if ((rc = ap__net_parse_host_port(cfg->tcp, "0.0.0.0", false, "tcp", &addr, err)))
		return rc;
	uv_tcp_init(&s->loop, &s->tcp);
	s->tcp.data = s;
	s->tcp_open = true;
	r = uv_tcp_bind(&s->tcp, (const struct sockaddr *)&addr, 0);
	if (!r)
		r = uv_listen((uv_stream_t *)&s->tcp, 128, on_connection);
	if (r)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot listen on TCP %s: %s", cfg->tcp,
				    uv_strerror(r));
	return 0;
}

/* Socket activation (notify.h): takes the listening sockets systemd
 * passed as descriptors 3 .. 3+n-1 -- at most one Unix and one TCP
 * socket, both stream sockets already listening.  The Unix socket's file
 * belongs to systemd: apollod does not check its directory and never
 * removes it.  A TCP socket needs tcp_token like a configured one. */
static int adopt_listeners(ap_server *s, const ap_config *cfg, int n, ap_error *err)
{
	for (int fd = 3; fd < 3 + n; fd++) {
		struct sockaddr_storage addr;
		socklen_t alen = sizeof(addr);
		int type = 0, listening = 0, r;
		socklen_t olen = sizeof(int);

		memset(&addr, 0, sizeof(addr));
		if (getsockname(fd, (struct sockaddr *)&addr, &alen) ||
		    getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &olen) ||
		    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &olen) ||
		    type != SOCK_STREAM || !listening)
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "socket activation: descriptor %d is not a listening stream "
					    "socket (ListenStream= in the .socket unit)", fd);
		if (addr.ss_family == AF_UNIX && !s->pipe_open) {
			const struct sockaddr_un *un = (const struct sockaddr_un *)&addr;

			uv_pipe_init(&s->loop, &s->pipe, 0);
			s->pipe.data = s;
			s->pipe_open = true;
			snprintf(s->socket_path, sizeof(s->socket_path), "%.*s",
				 (int)sizeof(s->socket_path) - 1,
				 un->sun_path[0] ? un->sun_path : "(abstract)");
			r = uv_pipe_open(&s->pipe, fd);
		} else if ((addr.ss_family == AF_INET || addr.ss_family == AF_INET6) && !s->tcp_open) {
			if (!cfg->tcp_token[0])
				return ap_error_set(err, AP_EINVAL, NULL, NULL,
						    "socket activation passed a TCP socket but tcp_token "
						    "is empty: TCP clients must authenticate");
			uv_tcp_init(&s->loop, &s->tcp);
			s->tcp.data = s;
			s->tcp_open = true;
			r = uv_tcp_open(&s->tcp, fd);
		} else {
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "socket activation: descriptor %d is a second socket of "
					    "its kind or neither Unix nor TCP", fd);
		}
		if (!r)
			r = uv_listen(addr.ss_family == AF_UNIX ? (uv_stream_t *)&s->pipe
								: (uv_stream_t *)&s->tcp, 128, on_connection);
		if (r)
			return ap_error_set(err, AP_EIO, NULL, NULL,
					    "socket activation: cannot listen on descriptor %d: %s", fd,
					    uv_strerror(r));
	}
	s->activated = true;
	ap_log(AP_LOG_INFO, "socket activation: %d listening sockets from systemd", n);
	return 0;
}

/* systemd's watchdog: the loop is alive. */
static void on_watchdog(uv_timer_t *t)
{
	ap_notify("WATCHDOG=1");
}

/* systemd's watchdog pings, at half the interval it asks for, as
 * sd_watchdog_enabled(3) advises; none when it asks for none. */
static void start_watchdog(ap_server *s)
{
	uint64_t watchdog_usec = ap_notify_watchdog_usec();
	uint64_t ms = watchdog_usec / 2000 ? watchdog_usec / 2000 : 1;

	if (!watchdog_usec)
		return;
	uv_timer_init(&s->loop, &s->watchdog);
	s->watchdog.data = s;
	s->watchdog_open = true;
	uv_timer_start(&s->watchdog, on_watchdog, ms, ms);
	uv_unref((uv_handle_t *)&s->watchdog);
}

int ap_server_new(const ap_config *cfg, ap_compiler *compiler, ap_cache *cache,
		  ap_server **out, ap_error *err)
{
	ap_server *s;
	char threads[16];
	int r, rc, n_fds;

	*out = NULL;
	if (cfg->tcp[0] && !cfg->tcp_token[0])
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "tcp is set but tcp_token is empty: TCP clients must authenticate");
	s = calloc(1, sizeof(*s));
	if (!s)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	s->compiler = compiler;
	s->cache = cache;
	s->max_frame = (uint32_t)cfg->max_frame_bytes;
	s->max_unauth_frame = (uint32_t)cfg->max_unauth_frame_bytes;
	s->max_clients = (unsigned)cfg->max_clients;
	s->max_per_user = cfg->max_clients_per_user ? (unsigned)cfg->max_clients_per_user
						     : s->max_clients / 4 ? s->max_clients / 4 : 1;
	s->admin_uid = cfg->admin_uid;
	s->admin_reserve = (unsigned)cfg->admin_clients;
	s->max_unauth = (unsigned)cfg->max_unauth_clients;
	s->max_pending = (unsigned)cfg->max_pending;
	s->auth_timeout = (uint64_t)cfg->auth_timeout_ms;
	s->idle_timeout = (uint64_t)cfg->idle_timeout_ms;
	s->frame_timeout = (uint64_t)cfg->frame_timeout_ms;
	s->send_timeout = (uint64_t)cfg->send_timeout_ms;
	s->max_queue = (size_t)cfg->max_reply_queue_bytes;
	s->decode_ratio = (unsigned)cfg->decode_memory_ratio;
	s->max_compile_mem = (uint64_t)cfg->max_compile_memory;
	s->max_pending_mem = (uint64_t)cfg->max_pending_memory;
	s->user_share = s->max_pending_mem / 2 > s->max_compile_mem ? s->max_pending_mem / 2
		      : s->max_compile_mem < s->max_pending_mem ? s->max_compile_mem
		      : s->max_pending_mem;
	snprintf(s->tcp_token, sizeof(s->tcp_token), "%s", cfg->tcp_token);
	s->start_ms = ap_now_ms();
	if (cfg->socket[0])
		snprintf(s->socket_path, sizeof(s->socket_path), "%s", cfg->socket);
	else if (ap_default_socket_path(s->socket_path, sizeof(s->socket_path))) {
		free(s);
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "socket path is too long");
	}
	if (make_targets(s)) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		goto error;
	}

	/* libuv reads the pool size when the pool first starts. */
	snprintf(threads, sizeof(threads), "%u",
		 cfg->workers ? (unsigned)cfg->workers : uv_available_parallelism());
	setenv("UV_THREADPOOL_SIZE", threads, 1);
	signal(SIGPIPE, SIG_IGN);

	r = uv_loop_init(&s->loop);
	if (r) {
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "uv_loop_init: %s", uv_strerror(r));
		goto error;
	}
	s->loop_ready = true;

	n_fds = ap_listen_fds();
	if (n_fds > 0 && (rc = adopt_listeners(s, cfg, n_fds, err)))
		goto error;
	if (!s->pipe_open && (rc = bind_unix(s, cfg, err)))
		goto error;
	if (cfg->tcp[0] && !s->tcp_open && (rc = bind_tcp(s, cfg, err)))
		goto error;
	if (cfg->metrics[0] &&
	    (rc = ap_http_start(&s->loop, cfg->metrics, render_metrics, s, &s->metrics, err)))
		goto error;
	if (s->metrics)
		ap_log(AP_LOG_INFO, "metrics on port %d (%s)", ap_http_port(s->metrics), cfg->metrics);
	start_watchdog(s);
	if ((r = progress_start(s))) {
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "uv_async_init: %s", uv_strerror(r));
		goto error;
	}

	uv_signal_init(&s->loop, &s->sigterm);
	uv_signal_init(&s->loop, &s->sigint);
	s->sigterm.data = s->sigint.data = s;
	s->signals_open = true;
	uv_signal_start(&s->sigterm, on_signal, SIGTERM);
	uv_signal_start(&s->sigint, on_signal, SIGINT);
	uv_timer_init(&s->loop, &s->sweep);
	s->sweep.data = s;
	s->sweep_open = true;
	uv_timer_start(&s->sweep, on_sweep, sweep_period(s), sweep_period(s));
	uv_unref((uv_handle_t *)&s->sweep);
	*out = s;
	return 0;
error:
	ap_server_free(s);
	return rc;
}

int ap_server_run(ap_server *s)
{
	int r;

	ap_log(AP_LOG_INFO, "listening on %s%s", s->socket_path, s->tcp_open ? " and TCP" : "");
	r = uv_run(&s->loop, UV_RUN_DEFAULT);
	remove_socket_file(s);
	ap_log(AP_LOG_INFO, "stopped (%llu requests served)", (unsigned long long)s->requests);
	return r < 0 ? AP_EIO : 0;
}

const char *ap_server_socket_path(const ap_server *s)
{
	return s->socket_path;
}

/* uv_walk callback: closes a handle left open (the loop's own internal
 * handles are not listed by uv_walk). */
static void close_any(uv_handle_t *h, void *arg)
{
	ap_server *s = arg;
	bool server_handle = h == (uv_handle_t *)&s->pipe || h == (uv_handle_t *)&s->tcp ||
			     h == (uv_handle_t *)&s->sigterm || h == (uv_handle_t *)&s->sigint ||
			     h == (uv_handle_t *)&s->grace || h == (uv_handle_t *)&s->sweep ||
			     h == (uv_handle_t *)&s->watchdog ||
			     h == (uv_handle_t *)&s->progress_async;

	if (uv_is_closing(h))
		return;
	if (server_handle)
		uv_close(h, NULL);
	else
		conn_close(h->data);
}

ap_server *ap_server_free(ap_server *s)
{
	if (!s)
		return NULL;
	if (s->loop_ready) {
		ap_http_close(s->metrics);   /* its handles are not connections */
		s->metrics = NULL;
		uv_walk(&s->loop, close_any, s);
		uv_run(&s->loop, UV_RUN_DEFAULT);
		if (uv_loop_close(&s->loop))
			ap_log(AP_LOG_WARN, "the event loop still had open handles at exit");
	}
	if (s->progress_open) {
		struct progress_item *it = s->progress_head, *next;

		for (; it; it = next) {   /* none unless a job was cancelled mid-run */
			next = it->next;
			free(it->frame);
			free(it);
		}
		uv_mutex_destroy(&s->progress_mu);
	}
	remove_socket_file(s);
	for (size_t i = 0; i < s->n_targets; i++)
		free(s->targets[i]);
	free(s->targets);
	free(s);
	return NULL;
}
