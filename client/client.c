/* client.c -- libapollo-client: blocking-socket client of apollod and the
 * bundle accessors (see apollo.h).
 *
 * A call is one request frame and one reply frame: the Envelope is packed
 * into a buffer, framed (common/frame.h) and written in full; then the 4-byte
 * reply header is read, its length checked against the client's maximum
 * *before* the payload buffer is allocated, the payload read in full and
 * decoded.  A reply whose id does not echo the request's, or whose message
 * is not the expected one, is an error: the client never guesses.  An
 * Envelope.error or CompileResponse.error from the daemon becomes the
 * caller's ap_error with the daemon's code, message, node and tensor.
 *
 * Whom the client talks to (issue 11): on a Unix socket the daemon's uid
 * (SO_PEERCRED) must be this user's, root's, or the one the caller trusts
 * (ap_connect_options.daemon_user, $APOLLO_DAEMON_USER) -- anybody else
 * could have created the socket first and would be handed native code to
 * run.  Over TCP with a token both sides prove they know it (the
 * handshake in common/frame.h), so a server that does not is refused
 * before anything is sent.  A reply is decoded within a memory budget
 * (common/pb_budget.h), and the runtime verifies every blob's digest.
 *
 * When a request cannot be sent because the daemon closed the connection,
 * the reason it left in the socket (ERR_BUSY when it refused us) is read
 * and reported; a connection the daemon closed while idle (idle_timeout_ms)
 * is opened again, once, and the request re-sent (every request is
 * idempotent).
 */
#include "apollo.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <pwd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "../common/frame.h"
#include "../common/pb_budget.h"
#include "proto/apollo.pb-c.h"

/* A reply may take this many times its size once decoded, plus 4 MiB. */
#define REPLY_DECODE_RATIO 16
#define REPLY_DECODE_FLOOR ((size_t)4 << 20)

struct ap_client {
	int fd;
	uint64_t next_id;
	uint32_t max_frame;
	unsigned timeout_ms;
	char server[128];
	char nvrtc[64];
	int n_targets;
	char **targets;
	/* to open the connection again (ap_client_connect* only) */
	bool can_reconnect;
	bool in_handshake;
	unsigned calls;          /* requests answered on this connection */
	char *addr;
	char *token;
	long trust_uid;          /* -1: none beyond this user and root */
	ap_progress_fn progress; /* compile progress wanted: its callback; NULL: not */
	void *progress_user;
};

struct ap_bundle {
	Apollo__Envelope *env;   /* owner when the bundle came from a reply */
	Apollo__Bundle *pb;      /* borrowed from env, or owned when env is NULL */
};

/* ---- frames ---------------------------------------------------------------- */

/* ap_client_write_frame, also giving the errno of a failed send. */
static int write_frame(int fd, const uint8_t *buf, size_t len, ap_error *err, int *sys_err)
{
	uint8_t hdr[AP_FRAME_HEADER_BYTES];
	struct iovec iov[2];
	struct msghdr msg;
	size_t total, sent = 0;

	if (len == 0 || len > UINT32_MAX)
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
				    "cannot frame a message of %zu bytes", len);
	ap_frame_put_len(hdr, (uint32_t)len);
	total = len + sizeof(hdr);
	while (sent < total) {
		ssize_t n;
		memset(&msg, 0, sizeof(msg));
		if (sent < sizeof(hdr)) {
			iov[0].iov_base = hdr + sent;
			iov[0].iov_len = sizeof(hdr) - sent;
			iov[1].iov_base = (void *)buf;
			iov[1].iov_len = len;
			msg.msg_iovlen = 2;
		} else {
			iov[0].iov_base = (void *)(buf + (sent - sizeof(hdr)));
			iov[0].iov_len = total - sent;
			msg.msg_iovlen = 1;
		}
		msg.msg_iov = iov;
		n = sendmsg(fd, &msg, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			*sys_err = errno;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return ap_error_set(err, AP_EIO, NULL, NULL,
						    "timed out sending a request to apollod");
			return ap_error_set(err, AP_EIO, NULL, NULL,
					    "sending to apollod failed: %s", strerror(*sys_err));
		}
		sent += (size_t)n;
	}
	return 0;
}

int ap_client_write_frame(int fd, const uint8_t *buf, size_t len, ap_error *err)
{
	int sys_err = 0;

	return write_frame(fd, buf, len, err, &sys_err);
}

/* Reads exactly `len` bytes.  Returns bytes read before EOF (< len) or -1
 * with errno set. */
static ssize_t read_full(int fd, uint8_t *buf, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, buf + got, len - got);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

static int read_error(ap_error *err, const char *what)
{
	if (errno == EAGAIN || errno == EWOULDBLOCK)
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "timed out waiting for apollod's %s", what);
	return ap_error_set(err, AP_EIO, NULL, NULL, "reading apollod's %s failed: %s",
			    what, strerror(errno));
}

/* ap_client_read_frame; *closed when the connection ended (EOF or reset)
 * before the first byte of the reply. */
static int read_frame(int fd, uint32_t max, uint8_t **out, uint32_t *len, ap_error *err,
		      bool *closed)
{
	uint8_t hdr[AP_FRAME_HEADER_BYTES];
	uint8_t *buf;
	uint32_t n;
	ssize_t got;
	int rc;

	*out = NULL;
	*len = 0;
	*closed = false;
	got = read_full(fd, hdr, sizeof(hdr));
	if (got < 0) {
		*closed = errno == ECONNRESET;
		return read_error(err, "reply header");
	}
	if (got == 0) {
		*closed = true;
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "apollod closed the connection without a reply");
	}
	if ((size_t)got < sizeof(hdr))
		return ap_error_set(err, AP_EFRAME, NULL, NULL,
				    "truncated reply: connection closed after %zd of 4 header bytes",
				    got);
	n = ap_frame_get_len(hdr);
	rc = ap_frame_check_len(n, max, err);
	if (rc < 0)
		return rc;
	buf = malloc(n);
	if (!buf)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL,
				    "out of memory for a %u-byte reply", n);
	got = read_full(fd, buf, n);
	if (got < 0) {
		free(buf);
		return read_error(err, "reply");
	}
	if ((size_t)got < n) {
		free(buf);
		return ap_error_set(err, AP_EFRAME, NULL, NULL,
				    "truncated reply: connection closed after %zd of %u bytes",
				    got, n);
	}
	*out = buf;
	*len = n;
	return 0;
}

int ap_client_read_frame(int fd, uint32_t max, uint8_t **out, uint32_t *len, ap_error *err)
{
	bool closed;

	return read_frame(fd, max, out, len, err, &closed);
}

int ap_client_error_from_wire(int wire_code)
{
	/* apollo.ErrorCode k (1..10) is AP_E* -k by construction (base.h). */
	if (wire_code >= 1 && wire_code <= 10)
		return -wire_code;
	return AP_EINTERNAL;
}

static int wire_error(ap_error *err, const Apollo__Error *e)
{
	int code = ap_client_error_from_wire(e ? (int)e->code : 0);

	return ap_error_set(err, code, e && e->node && *e->node ? e->node : NULL,
			    e && e->tensor && *e->tensor ? e->tensor : NULL, "%s",
			    e && e->message && *e->message ? e->message : ap_error_name(code));
}

/* ---- one request, one reply ------------------------------------------------- */

static const char *msg_name(int c)
{
	switch (c) {
	case APOLLO__ENVELOPE__MSG_HELLO: return "Hello";
	case APOLLO__ENVELOPE__MSG_HELLO_REPLY: return "HelloReply";
	case APOLLO__ENVELOPE__MSG_PING: return "PingRequest";
	case APOLLO__ENVELOPE__MSG_PONG: return "PingReply";
	case APOLLO__ENVELOPE__MSG_STATS: return "StatsRequest";
	case APOLLO__ENVELOPE__MSG_STATS_REPLY: return "StatsReply";
	case APOLLO__ENVELOPE__MSG_COMPILE: return "CompileRequest";
	case APOLLO__ENVELOPE__MSG_COMPILED: return "CompileResponse";
	case APOLLO__ENVELOPE__MSG_ERROR: return "Error";
	case APOLLO__ENVELOPE__MSG_TUNE_REPORT: return "TuneReport";
	case APOLLO__ENVELOPE__MSG_TUNE_REPLY: return "TuneReply";
	default: return "an empty Envelope";
	}
}

/* Reads one reply frame and decodes it within the reply budget; *closed
 * as read_frame. */
static int read_envelope(ap_client *c, Apollo__Envelope **out, ap_error *err, bool *closed)
{
	ap_pb_budget budget;
	uint8_t *buf;
	uint32_t len;
	int rc;

	*out = NULL;
	rc = read_frame(c->fd, c->max_frame, &buf, &len, err, closed);
	if (rc < 0)
		return rc;
	ap_pb_budget_init(&budget, ap_pb_decode_limit(len, REPLY_DECODE_RATIO, REPLY_DECODE_FLOOR));
	*out = apollo__envelope__unpack(&budget.allocator, len, buf);
	free(buf);
	if (!*out && budget.exceeded)
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
				    "apollod's reply (%u bytes) would take more than %zu bytes to decode",
				    len, budget.limit);
	if (!*out && budget.out_of_memory)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL,
				    "out of memory decoding apollod's %u-byte reply", len);
	if (!*out)
		return ap_error_set(err, AP_EMESSAGE, NULL, NULL,
				    "apollod's reply (%u bytes) does not decode as an apollo.Envelope",
				    len);
	return 0;
}

/* After a send failed because the daemon had closed the connection: the
 * Error it wrote before closing (ERR_BUSY: too many clients) is still in
 * our receive buffer.  Returns its code with `err` set, or 0 when there is
 * none (the peer is gone, so reading does not block). */
static int pending_error(ap_client *c, ap_error *err)
{
	Apollo__Envelope *env = NULL;
	ap_error e;
	bool closed;
	int rc = 0;

	if (read_envelope(c, &env, &e, &closed) < 0)
		return 0;
	if (env->msg_case == APOLLO__ENVELOPE__MSG_ERROR)
		rc = wire_error(err, env->error);
	apollo__envelope__free_unpacked(env, NULL);
	return rc;
}

static int reconnect(ap_client *c, ap_error *err);

/* Hands one Progress to the client's callback, when it has one (a daemon
 * may send them only when asked; an unasked one is dropped). */
static void progress_event(ap_client *c, const Apollo__Progress *p)
{
	if (!c->progress || !p)
		return;
	c->progress(c->progress_user, p->stage ? p->stage : "", p->done, p->total, p->elapsed_ms);
}

void ap_client_set_progress(ap_client *c, ap_progress_fn fn, void *user)
{
	c->progress = fn;
	c->progress_user = user;
}

/* One attempt of call(); *retry when the daemon had closed the connection
 * before it could read the request (worth one new connection). */
static int call_once(ap_client *c, Apollo__Envelope *req, int want, Apollo__Envelope **reply,
		     ap_error *err, bool *retry)
{
	Apollo__Envelope *env;
	uint8_t *buf;
	size_t n;
	int rc, sys_err = 0;

	*reply = NULL;
	*retry = false;
	if (c->fd < 0)
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "connection to apollod is closed after an earlier error");
	req->id = c->next_id++;
	n = apollo__envelope__get_packed_size(req);
	if (n == 0 || n > UINT32_MAX)
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
				    "request of %zu bytes does not fit one frame", n);
	buf = malloc(n);
	if (!buf)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL,
				    "out of memory packing a %zu-byte request", n);
	apollo__envelope__pack(req, buf);
	rc = write_frame(c->fd, buf, n, err, &sys_err);
	free(buf);
	if (rc < 0) {
		if (sys_err == EPIPE || sys_err == ECONNRESET) {
			int why = pending_error(c, err);
			if (why < 0)
				rc = why;
			else
				*retry = true;
		}
		goto broken;
	}
	rc = read_envelope(c, &env, err, retry);
	/* a compile's Progress envelopes (its id) come before its answer */
	while (rc == 0 && env->msg_case == APOLLO__ENVELOPE__MSG_PROGRESS && env->id == req->id) {
		progress_event(c, env->progress);
		apollo__envelope__free_unpacked(env, NULL);
		rc = read_envelope(c, &env, err, retry);
	}
	if (rc < 0)
		goto broken;
	if (env->msg_case == APOLLO__ENVELOPE__MSG_ERROR) {
		rc = wire_error(err, env->error);
		/* An error for a frame the daemon could not read (bad frame,
		 * version) ends the conversation; others leave it usable. */
		apollo__envelope__free_unpacked(env, NULL);
		if (rc == AP_EFRAME || rc == AP_EMESSAGE || rc == AP_EVERSION)
			goto broken;
		return rc;
	}
	if (env->id != req->id) {
		rc = ap_error_set(err, AP_EMESSAGE, NULL, NULL,
				  "apollod answered request %llu with id %llu",
				  (unsigned long long)req->id, (unsigned long long)env->id);
		apollo__envelope__free_unpacked(env, NULL);
		goto broken;
	}
	if ((int)env->msg_case != want) {
		rc = ap_error_set(err, AP_EMESSAGE, NULL, NULL,
				  "apollod answered a %s with %s, expected %s",
				  msg_name(req->msg_case), msg_name(env->msg_case), msg_name(want));
		apollo__envelope__free_unpacked(env, NULL);
		goto broken;
	}
	*reply = env;
	c->calls++;
	return 0;
broken:
	/* The stream may be mid-frame: never read from it again. */
	close(c->fd);
	c->fd = -1;
	return rc;
}

/* Sends `req` (its id is set here) and reads the reply, which must carry
 * `want` (or an Error, returned as the daemon's error).  On success *reply
 * is the decoded Envelope (free with apollo__envelope__free_unpacked).
 * A connection the daemon closed while it was idle is opened again once. */
static int call(ap_client *c, Apollo__Envelope *req, int want, Apollo__Envelope **reply,
		ap_error *err)
{
	bool retry = false;
	int rc = call_once(c, req, want, reply, err, &retry);

	if (rc < 0 && retry && c->can_reconnect && !c->in_handshake && c->calls > 0 &&
	    reconnect(c, NULL) == 0)
		rc = call_once(c, req, want, reply, err, &retry);
	return rc;
}

/* ---- connection ------------------------------------------------------------- */

static void copy_str(char *dst, size_t cap, const char *src)
{
	snprintf(dst, cap, "%s", src ? src : "");
}

/* The token handshake (common/frame.h), up to and including sending the
 * client's proof; *rep is then the daemon's full HelloReply. */
static int authenticate(ap_client *c, Apollo__Envelope *req, Apollo__Hello *hello,
			const char *token, Apollo__Envelope **rep, ap_error *err)
{
	uint8_t nc[AP_AUTH_NONCE_BYTES], ns[AP_AUTH_NONCE_BYTES], proof[AP_AUTH_PROOF_BYTES];
	Apollo__HelloReply *hr;
	int rc;

	if (ap_random_bytes(nc, sizeof(nc)))
		return ap_error_set(err, AP_EIO, NULL, NULL, "no random bytes for the handshake");
	hello->auth_nonce.data = nc;
	hello->auth_nonce.len = sizeof(nc);
	rc = call(c, req, APOLLO__ENVELOPE__MSG_HELLO_REPLY, rep, err);
	if (rc < 0)
		return rc;
	hr = (*rep)->hello_reply;
	if (!hr || hr->auth_nonce.len != AP_AUTH_NONCE_BYTES ||
	    !ap_auth_check(token, AP_AUTH_SERVER, nc, hr->auth_nonce.data, hr->auth_proof.data,
			   hr->auth_proof.len)) {
		apollo__envelope__free_unpacked(*rep, NULL);
		*rep = NULL;
		close(c->fd);
		c->fd = -1;
		return ap_error_set(err, AP_EVERSION, NULL, NULL,
				    "the server did not prove that it knows the token: it is not the "
				    "apollod you meant (or the token differs); refusing it");
	}
	memcpy(ns, hr->auth_nonce.data, sizeof(ns));
	apollo__envelope__free_unpacked(*rep, NULL);
	*rep = NULL;
	if (ap_auth_proof(token, AP_AUTH_CLIENT, nc, ns, proof))
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	hello->auth_nonce.data = NULL;
	hello->auth_nonce.len = 0;
	hello->auth_proof.data = proof;
	hello->auth_proof.len = sizeof(proof);
	return call(c, req, APOLLO__ENVELOPE__MSG_HELLO_REPLY, rep, err);
}

static void free_targets(ap_client *c)
{
	for (int i = 0; i < c->n_targets; i++)
		free(c->targets[i]);
	free(c->targets);
	c->targets = NULL;
	c->n_targets = 0;
}

/* Hello -> HelloReply; with a token (TCP) the authenticating handshake. */
static int handshake(ap_client *c, const char *token, ap_error *err)
{
	Apollo__Envelope req = APOLLO__ENVELOPE__INIT, *rep;
	Apollo__Hello hello = APOLLO__HELLO__INIT;
	Apollo__HelloReply *hr;
	char who[64];
	int rc;

	hello.schema_version = APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT;
	snprintf(who, sizeof(who), "libapollo-client %s", AP_VERSION);
	hello.client = who;
	req.msg_case = APOLLO__ENVELOPE__MSG_HELLO;
	req.hello = &hello;
	c->in_handshake = true;
	if (token && *token)
		rc = authenticate(c, &req, &hello, token, &rep, err);
	else
		rc = call(c, &req, APOLLO__ENVELOPE__MSG_HELLO_REPLY, &rep, err);
	c->in_handshake = false;
	if (rc < 0)
		return rc;
	hr = rep->hello_reply;
	if (!hr || hr->schema_version != APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT) {
		rc = ap_error_set(err, AP_EVERSION, NULL, NULL,
				  "apollod speaks schema version %u, this client %u",
				  hr ? hr->schema_version : 0,
				  (unsigned)APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT);
		apollo__envelope__free_unpacked(rep, NULL);
		return rc;
	}
	copy_str(c->server, sizeof(c->server), hr->server);
	copy_str(c->nvrtc, sizeof(c->nvrtc), hr->nvrtc_version);
	free_targets(c);
	if (hr->n_targets > 0 && hr->n_targets < 1024) {
		c->targets = calloc(hr->n_targets, sizeof(char *));
		if (!c->targets) {
			apollo__envelope__free_unpacked(rep, NULL);
			return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		}
		for (size_t i = 0; i < hr->n_targets; i++) {
			c->targets[i] = ap_strdup(hr->targets[i]);
			if (!c->targets[i]) {
				apollo__envelope__free_unpacked(rep, NULL);
				return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
			}
			c->n_targets++;
		}
	}
	apollo__envelope__free_unpacked(rep, NULL);
	return 0;
}

ap_client *ap_client_from_fd(int fd, bool do_handshake, ap_error *err)
{
	return ap_client_from_fd_token(fd, do_handshake, NULL, err);
}

ap_client *ap_client_from_fd_token(int fd, bool do_handshake, const char *token, ap_error *err)
{
	ap_client *c = calloc(1, sizeof(*c));

	if (!c) {
		close(fd);
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		return NULL;
	}
	c->fd = fd;
	c->next_id = 1;
	c->max_frame = AP_CLIENT_DEFAULT_MAX_FRAME;
	c->trust_uid = -1;
	if (do_handshake && handshake(c, token, err) < 0)
		return ap_client_free(c);
	return c;
}

/* A user name or decimal uid as a uid; -1 when there is no such user. */
static long parse_user(const char *s)
{
	struct passwd pw, *res = NULL;
	char buf[2048], *end;
	long v;

	if (!s || !*s)
		return -1;
	v = strtol(s, &end, 10);
	if (!*end && v >= 0)
		return v;
	if (getpwnam_r(s, &pw, buf, sizeof(buf), &res) || !res)
		return -1;
	return (long)res->pw_uid;
}

/* The uid a daemon on a Unix socket runs as must be ours, root's, or the
 * one we were told to trust: anyone else may have put a socket there. */
static int check_peer(int fd, const char *path, long trust_uid, ap_error *err)
{
	struct ucred cr;
	socklen_t n = sizeof(cr);
	uid_t me = geteuid();

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &n) < 0)
		return ap_error_set(err, AP_EIO, NULL, NULL,
				    "cannot tell who runs the daemon at %s: %s", path, strerror(errno));
	if (cr.uid == me || cr.uid == 0 || (trust_uid >= 0 && cr.uid == (uid_t)trust_uid))
		return 0;
	return ap_error_set(err, AP_EIO, NULL, NULL,
			    "refusing the daemon at %s: it runs as uid %u, not as you (uid %u) or "
			    "root, and it would hand you native code to run; if that is your "
			    "apollod's account, say so with --daemon-user %u (APOLLO_DAEMON_USER)",
			    path, (unsigned)cr.uid, (unsigned)me, (unsigned)cr.uid);
}

static int connect_unix(const char *path, long trust_uid, ap_error *err)
{
	struct sockaddr_un sa;
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
			     "socket path '%s' is longer than %zu bytes", path,
			     sizeof(sa.sun_path) - 1);
		return -1;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		ap_error_set(err, AP_EIO, NULL, NULL, "socket: %s", strerror(errno));
		return -1;
	}
	while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (errno == EINTR)
			continue;
		ap_error_set(err, AP_EIO, NULL, NULL,
			     "cannot connect to apollod at %s: %s (is the daemon running? "
			     "--socket PATH or APOLLO_SOCKET select another)",
			     path, strerror(errno));
		close(fd);
		return -1;
	}
	if (check_peer(fd, path, trust_uid, err) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static int connect_tcp(const char *hostport, ap_error *err)
{
	char host[256];
	const char *colon = strrchr(hostport, ':');
	struct addrinfo hints, *res = NULL, *ai;
	size_t hl;
	int fd = -1, rc, one = 1, saved = 0;

	if (!colon || colon == hostport || !colon[1]) {
		ap_error_set(err, AP_EINVAL, NULL, NULL,
			     "TCP address '%s' is not HOST:PORT", hostport);
		return -1;
	}
	hl = (size_t)(colon - hostport);
	if (hl >= sizeof(host)) {
		ap_error_set(err, AP_ETOOLARGE, NULL, NULL, "host name too long");
		return -1;
	}
	memcpy(host, hostport, hl);
	host[hl] = 0;
	/* [::1]:port */
	if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
		memmove(host, host + 1, hl - 2);
		host[hl - 2] = 0;
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	rc = getaddrinfo(host, colon + 1, &hints, &res);
	if (rc != 0) {
		ap_error_set(err, AP_EIO, NULL, NULL, "cannot resolve %s: %s", hostport,
			     gai_strerror(rc));
		return -1;
	}
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			saved = errno;
			continue;
		}
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
			break;
		saved = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0) {
		ap_error_set(err, AP_EIO, NULL, NULL, "cannot connect to apollod at %s: %s",
			     hostport, strerror(saved));
		return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

ap_client *ap_client_connect(const char *addr, ap_error *err)
{
	return ap_client_connect_opts(addr, NULL, err);
}

ap_client *ap_client_connect_token(const char *addr, const char *token, ap_error *err)
{
	ap_connect_options o = { .token = token };

	return ap_client_connect_opts(addr, &o, err);
}

/* Opens the socket of `addr` (see ap_client_connect); *is_tcp says which
 * kind.  The fd, or -1 with `err`. */
static int open_socket(const char *addr, long trust_uid, bool *is_tcp, ap_error *err)
{
	char path[128];

	*is_tcp = false;
	if (!addr || !*addr) {
		if (ap_default_socket_path(path, sizeof(path)) < 0) {
			ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
				     "default socket path ($APOLLO_SOCKET) is too long");
			return -1;
		}
		return connect_unix(path, trust_uid, err);
	}
	if (!strncmp(addr, "unix:", 5))
		return connect_unix(addr + 5, trust_uid, err);
	if (strchr(addr, '/') || (!strchr(addr, ':') && strncmp(addr, "tcp:", 4)))
		return connect_unix(addr, trust_uid, err);
	*is_tcp = true;
	return connect_tcp(!strncmp(addr, "tcp:", 4) ? addr + 4 : addr, err);
}

ap_client *ap_client_connect_opts(const char *addr, const ap_connect_options *opt,
				  ap_error *err)
{
	const char *token = opt ? opt->token : NULL;
	const char *user = opt && opt->daemon_user ? opt->daemon_user : getenv("APOLLO_DAEMON_USER");
	long trust_uid = parse_user(user);
	bool is_tcp;
	ap_client *c;
	int fd;

	if (user && *user && trust_uid < 0) {
		ap_error_set(err, AP_EINVAL, NULL, NULL, "daemon user '%s' does not exist", user);
		return NULL;
	}
	if (token && strlen(token) > 256) {
		ap_error_set(err, AP_EINVAL, NULL, NULL, "a token is at most 256 bytes");
		return NULL;
	}
	fd = open_socket(addr, trust_uid, &is_tcp, err);
	if (fd < 0)
		return NULL;
	if (is_tcp && !(token && *token)) {
		close(fd);
		ap_error_set(err, AP_EINVAL, NULL, NULL,
			     "a TCP connection to apollod needs the daemon's token (--token, "
			     "APOLLO_TOKEN)");
		return NULL;
	}
	c = ap_client_from_fd_token(fd, true, is_tcp ? token : NULL, err);
	if (!c)
		return NULL;
	c->trust_uid = trust_uid;
	c->addr = addr ? strdup(addr) : NULL;
	c->token = is_tcp ? strdup(token) : NULL;
	c->can_reconnect = (!addr || c->addr) && (!is_tcp || c->token);
	return c;
}

/* Opens the connection again after the daemon closed it (idle). */
static int reconnect(ap_client *c, ap_error *err)
{
	bool is_tcp;
	int fd = open_socket(c->addr, c->trust_uid, &is_tcp, err);

	if (fd < 0)
		return AP_EIO;
	if (c->fd >= 0)
		close(c->fd);
	c->fd = fd;
	c->calls = 0;
	if (c->timeout_ms && ap_client_set_timeout_ms(c, c->timeout_ms) < 0)
		return AP_EIO;
	return handshake(c, c->token, err);
}

ap_client *ap_client_free(ap_client *c)
{
	if (!c)
		return NULL;
	if (c->fd >= 0)
		close(c->fd);
	free_targets(c);
	free(c->addr);
	free(c->token);
	free(c);
	return NULL;
}

void ap_client_set_max_frame(ap_client *c, uint32_t max_bytes)
{
	c->max_frame = max_bytes;
}

int ap_client_set_timeout_ms(ap_client *c, unsigned ms)
{
	struct timeval tv;

	c->timeout_ms = ms;
	tv.tv_sec = ms / 1000;
	tv.tv_usec = (ms % 1000) * 1000;
	if (c->fd < 0 ||
	    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
		return AP_EIO;
	return 0;
}

const char *ap_client_server(const ap_client *c) { return c->server; }
const char *ap_client_nvrtc_version(const ap_client *c) { return c->nvrtc; }
int ap_client_n_targets(const ap_client *c) { return c->n_targets; }
const char *ap_client_target(const ap_client *c, int i)
{
	return i >= 0 && i < c->n_targets ? c->targets[i] : NULL;
}

int ap_client_ping(ap_client *c, char *server, size_t cap, ap_error *err)
{
	Apollo__Envelope req = APOLLO__ENVELOPE__INIT, *rep;
	Apollo__PingRequest ping = APOLLO__PING_REQUEST__INIT;
	int rc;

	req.msg_case = APOLLO__ENVELOPE__MSG_PING;
	req.ping = &ping;
	rc = call(c, &req, APOLLO__ENVELOPE__MSG_PONG, &rep, err);
	if (rc < 0)
		return rc;
	if (server && cap)
		copy_str(server, cap, rep->pong ? rep->pong->server : "");
	apollo__envelope__free_unpacked(rep, NULL);
	return 0;
}

int ap_client_tune_report(ap_client *c, const char *target, const char *device,
			  unsigned sm_count, const ap_tune_measurement *m, int n,
			  unsigned *records, ap_error *err)
{
	Apollo__Envelope req = APOLLO__ENVELOPE__INIT, *rep;
	Apollo__TuneReport tr = APOLLO__TUNE_REPORT__INIT;
	Apollo__TuneMeasurement *ms, **mp;
	int rc;

	if (n < 0)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "a negative count of measurements");
	ms = calloc((size_t)n + 1, sizeof(*ms));
	mp = calloc((size_t)n + 1, sizeof(*mp));
	if (!ms || !mp) {
		free(ms);
		free(mp);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	for (int i = 0; i < n; i++) {
		apollo__tune_measurement__init(&ms[i]);
		ms[i].signature.data = (uint8_t *)m[i].signature;
		ms[i].signature.len = 32;
		ms[i].schedule = (char *)(m[i].schedule ? m[i].schedule : "");
		ms[i].time_us = m[i].time_us;
		ms[i].runs = m[i].runs;
		mp[i] = &ms[i];
	}
	tr.target = (char *)(target ? target : "");
	tr.device = (char *)(device ? device : "");
	tr.sm_count = sm_count;
	tr.n_measurements = (size_t)n;
	tr.measurements = mp;
	req.msg_case = APOLLO__ENVELOPE__MSG_TUNE_REPORT;
	req.tune_report = &tr;
	rc = call(c, &req, APOLLO__ENVELOPE__MSG_TUNE_REPLY, &rep, err);
	free(ms);
	free(mp);
	if (rc < 0)
		return rc;
	if (records)
		*records = rep->tune_reply ? rep->tune_reply->records : 0;
	apollo__envelope__free_unpacked(rep, NULL);
	return 0;
}

struct ap_metrics {
	Apollo__Envelope *env;   /* owns the StatsReply */
};

int ap_client_stats_metrics(ap_client *c, ap_server_stats *out, ap_metrics **metrics,
			    ap_error *err)
{
	Apollo__Envelope req = APOLLO__ENVELOPE__INIT, *rep;
	Apollo__StatsRequest st = APOLLO__STATS_REQUEST__INIT;
	const Apollo__StatsReply *r;
	int rc;

	memset(out, 0, sizeof(*out));
	if (metrics)
		*metrics = NULL;
	req.msg_case = APOLLO__ENVELOPE__MSG_STATS;
	req.stats = &st;
	rc = call(c, &req, APOLLO__ENVELOPE__MSG_STATS_REPLY, &rep, err);
	if (rc < 0)
		return rc;
	r = rep->stats_reply;
	if (r) {
		out->requests = r->requests;
		out->errors = r->errors;
		out->cache_hits = r->cache_hits;
		out->cache_misses = r->cache_misses;
		out->kernels_compiled = r->kernels_compiled;
		out->cache_entries = r->cache_entries;
		out->cache_blob_bytes = r->cache_blob_bytes;
		out->clients = r->clients;
		out->in_flight = r->in_flight;
		out->uptime_s = r->uptime_s;
	}
	if (metrics && r) {
		*metrics = malloc(sizeof(**metrics));
		if (!*metrics) {
			apollo__envelope__free_unpacked(rep, NULL);
			return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		}
		(*metrics)->env = rep;
		return 0;
	}
	apollo__envelope__free_unpacked(rep, NULL);
	return 0;
}

int ap_client_stats(ap_client *c, ap_server_stats *out, ap_error *err)
{
	return ap_client_stats_metrics(c, out, NULL, err);
}

ap_metrics *ap_metrics_free(ap_metrics *m)
{
	if (m) {
		apollo__envelope__free_unpacked(m->env, NULL);
		free(m);
	}
	return NULL;
}

const struct Apollo__StatsReply *ap_metrics_pb(const ap_metrics *m)
{
	return m->env->stats_reply;
}

/* True when a sample's labels, written "k=v,k=v", are `want`. */
static bool labels_are(const Apollo__MetricSample *s, const char *want)
{
	const char *p = want ? want : "";

	for (size_t k = 0; k < s->n_labels; k++) {
		const char *n = s->labels[k]->name ? s->labels[k]->name : "";
		const char *v = s->labels[k]->value ? s->labels[k]->value : "";
		size_t nl = strlen(n), vl = strlen(v);

		if (k && *p++ != ',')
			return false;
		if (strncmp(p, n, nl) || p[nl] != '=' || strncmp(p + nl + 1, v, vl))
			return false;
		p += nl + 1 + vl;
	}
	return *p == '\0';
}

int ap_metrics_value(const ap_metrics *m, const char *name, const char *labels, double *value)
{
	const Apollo__StatsReply *r = m ? m->env->stats_reply : NULL;

	for (size_t i = 0; r && i < r->n_metrics; i++) {
		const Apollo__MetricFamily *f = r->metrics[i];
		size_t fl = f->name ? strlen(f->name) : 0;

		if (!f->name || strncmp(name, f->name, fl))
			continue;
		for (size_t j = 0; j < f->n_samples; j++) {
			const Apollo__MetricSample *s = f->samples[j];

			if (!strcmp(name + fl, s->suffix ? s->suffix : "") && labels_are(s, labels)) {
				*value = s->value;
				return 0;
			}
		}
	}
	return AP_EINVAL;
}

/* ---- submit ---------------------------------------------------------------- */

/* Sends a CompileRequest whose source is already set in `cr`. */
static ap_bundle *submit(ap_client *c, Apollo__CompileRequest *cr, const ap_submit_options *opt,
			 ap_error *err)
{
	Apollo__Envelope req = APOLLO__ENVELOPE__INIT, *rep;
	Apollo__CompileOptions co = APOLLO__COMPILE_OPTIONS__INIT;
	Apollo__DeviceInfo dev = APOLLO__DEVICE_INFO__INIT;
	Apollo__CompileResponse *resp;
	ap_bundle *b;

	cr->target = (char *)(opt && opt->target && *opt->target ? opt->target : "cpu");
	if (opt && opt->device && (opt->device->name[0] || opt->device->driver_version)) {
		dev.name = opt->device->name[0] ? (char *)opt->device->name : "";
		dev.sm_count = opt->device->sm_count;
		dev.cc_major = opt->device->cc_major;
		dev.cc_minor = opt->device->cc_minor;
		dev.driver_version = opt->device->driver_version;
		cr->device = &dev;
	}
	cr->output = opt ? (Apollo__OutputKind)opt->output : APOLLO__OUTPUT_KIND__OUTPUT_DEFAULT;
	if (opt) {
		co.no_cache = opt->no_cache;
		co.cache_namespace = (char *)(opt->cache_namespace ? opt->cache_namespace : "");
		co.max_block_threads = opt->max_block_threads;
		co.fusion = (Apollo__FusionLevel)opt->fusion;
		co.n_fusion_barriers = opt->n_fusion_barriers > 0 ? (size_t)opt->n_fusion_barriers : 0;
		co.fusion_barriers = (char **)opt->fusion_barriers;
		co.n_keep_whole = opt->n_keep_whole > 0 ? (size_t)opt->n_keep_whole : 0;
		co.keep_whole = (char **)opt->keep_whole;
		co.allow_tf32 = opt->allow_tf32;
		co.no_layer1 = opt->no_layer1;
		co.no_tune = opt->no_tune;
		co.tma = opt->tma;
		co.tune_variant = opt->tune_variant;
		co.host_check = opt->host_check;
		co.unvalidated = opt->unvalidated;
	}
	cr->options = &co;
	cr->progress = c->progress != NULL;
	req.msg_case = APOLLO__ENVELOPE__MSG_COMPILE;
	req.compile = cr;
	if (call(c, &req, APOLLO__ENVELOPE__MSG_COMPILED, &rep, err) < 0)
		return NULL;
	resp = rep->compiled;
	if (!resp || resp->result_case != APOLLO__COMPILE_RESPONSE__RESULT_BUNDLE || !resp->bundle) {
		if (resp && resp->result_case == APOLLO__COMPILE_RESPONSE__RESULT_ERROR)
			wire_error(err, resp->error);
		else
			ap_error_set(err, AP_EMESSAGE, NULL, NULL,
				     "apollod's CompileResponse holds neither a bundle nor an error");
		apollo__envelope__free_unpacked(rep, NULL);
		return NULL;
	}
	b = calloc(1, sizeof(*b));
	if (!b) {
		apollo__envelope__free_unpacked(rep, NULL);
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		return NULL;
	}
	b->env = rep;
	b->pb = resp->bundle;
	return b;
}

ap_bundle *ap_client_submit_graph(ap_client *c, const ap_graph *g, const ap_submit_options *opt,
				  ap_error *err)
{
	Apollo__CompileRequest cr = APOLLO__COMPILE_REQUEST__INIT;
	Apollo__Graph *pb = ap_graph_to_pb(g);
	ap_bundle *b;

	if (!pb) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory converting the graph");
		return NULL;
	}
	cr.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
	cr.graph = pb;
	b = submit(c, &cr, opt, err);
	ap_graph_pb_free(pb);
	return b;
}

ap_bundle *ap_client_submit_graph_pb(ap_client *c, const uint8_t *buf, size_t len,
				     const ap_submit_options *opt, ap_error *err)
{
	Apollo__CompileRequest cr = APOLLO__COMPILE_REQUEST__INIT;
	Apollo__Graph *pb = apollo__graph__unpack(NULL, len, buf);
	ap_bundle *b;

	if (!pb) {
		ap_error_set(err, AP_EMESSAGE, NULL, NULL,
			     "%zu bytes do not decode as an apollo.Graph", len);
		return NULL;
	}
	cr.source_case = APOLLO__COMPILE_REQUEST__SOURCE_GRAPH;
	cr.graph = pb;
	b = submit(c, &cr, opt, err);
	apollo__graph__free_unpacked(pb, NULL);
	return b;
}

ap_bundle *ap_client_submit_onnx(ap_client *c, const uint8_t *buf, size_t len,
				 const ap_host_tensor *const *bindings, int n_bindings,
				 const ap_submit_options *opt, ap_error *err)
{
	Apollo__CompileRequest cr = APOLLO__COMPILE_REQUEST__INIT;
	Apollo__Tensor *ts = NULL, **tp = NULL;
	ap_bundle *b = NULL;

	if (n_bindings > 0) {
		ts = calloc((size_t)n_bindings, sizeof(*ts));
		tp = calloc((size_t)n_bindings, sizeof(*tp));
		if (!ts || !tp) {
			ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
			goto out;
		}
	}
	for (int i = 0; i < n_bindings; i++) {
		const ap_host_tensor *h = bindings[i];
		Apollo__Tensor init = APOLLO__TENSOR__INIT;
		bool integer = h->dtype == AP_DT_I64 || h->dtype == AP_DT_I32;

		ts[i] = init;
		ts[i].name = h->name ? h->name : "";
		ts[i].dtype = (Apollo__DataType)h->dtype;
		ts[i].n_dims = (size_t)h->rank;
		ts[i].dims = (int64_t *)h->dims;
		if (integer && h->nbytes <= AP_CONST_MAX_BYTES) {
			ts[i].kind = APOLLO__TENSOR_KIND__TENSOR_CONST;
			ts[i].data.len = h->nbytes;
			ts[i].data.data = h->data;
		} else {
			ts[i].kind = APOLLO__TENSOR_KIND__TENSOR_INPUT;
		}
		tp[i] = &ts[i];
	}
	cr.source_case = APOLLO__COMPILE_REQUEST__SOURCE_ONNX_MODEL;
	cr.onnx_model.data = (uint8_t *)buf;
	cr.onnx_model.len = len;
	cr.n_bindings = (size_t)(n_bindings > 0 ? n_bindings : 0);
	cr.bindings = tp;
	b = submit(c, &cr, opt, err);
out:
	free(ts);
	free(tp);
	return b;
}

/* ---- bundles ------------------------------------------------------------------ */

/* ---- models from files ------------------------------------------------------- */

int ap_file_map(const char *path, size_t max, const uint8_t **buf, size_t *len, ap_error *err)
{
	struct stat st;
	void *p;
	int fd;

	*buf = NULL;
	*len = 0;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot open %s: %s", path,
				    strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s is not a regular file", path);
	}
	if ((uint64_t)st.st_size > max) {
		close(fd);
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL,
				    "%s has %lld bytes, more than the limit of %zu", path,
				    (long long)st.st_size, max);
	}
	if (st.st_size == 0) {   /* nothing to map; an empty buffer */
		close(fd);
		*buf = (const uint8_t *)"";
		return 0;
	}
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot map %s: %s", path,
				    strerror(errno));
	*buf = p;
	*len = (size_t)st.st_size;
	return 0;
}

void ap_file_unmap(const uint8_t *buf, size_t len)
{
	if (buf && len)
		munmap((void *)buf, len);
}

ap_bundle *ap_client_submit_onnx_file(ap_client *c, const char *path,
				      const ap_host_tensor *const *bindings, int n_bindings,
				      const ap_submit_options *opt, ap_error *err)
{
	const uint8_t *buf = NULL;
	size_t len = 0;
	ap_graph *g;
	ap_bundle *b = NULL;
	const char *slash = strrchr(path, '/');
	char dir[4096];

	if (ap_file_map(path, (size_t)4 << 30, &buf, &len, err) < 0)
		return NULL;
	/* external data is read from the model's folder */
	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
	g = ap_onnx_import_dir(buf, len, slash == path ? "/" : dir, bindings, n_bindings, NULL,
			       err);
	ap_file_unmap(buf, len);
	if (g)
		b = ap_client_submit_graph(c, g, opt, err);
	ap_graph_free(g);
	return b;
}

ap_bundle *ap_bundle_free(ap_bundle *b)
{
	if (!b)
		return NULL;
	if (b->env)
		apollo__envelope__free_unpacked(b->env, NULL);
	else if (b->pb)
		apollo__bundle__free_unpacked(b->pb, NULL);
	free(b);
	return NULL;
}

ap_bundle *ap_bundle_from_pb(Apollo__Bundle *pb)
{
	ap_bundle *b;

	if (!pb)
		return NULL;
	b = calloc(1, sizeof(*b));
	if (!b) {
		apollo__bundle__free_unpacked(pb, NULL);
		return NULL;
	}
	b->pb = pb;
	return b;
}

ap_bundle *ap_bundle_unpack(const uint8_t *buf, size_t len, ap_error *err)
{
	Apollo__Bundle *pb = apollo__bundle__unpack(NULL, len, buf);
	ap_bundle *b;

	if (!pb) {
		ap_error_set(err, AP_EMESSAGE, NULL, NULL,
			     "%zu bytes do not decode as an apollo.Bundle", len);
		return NULL;
	}
	b = ap_bundle_from_pb(pb);
	if (!b)
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	return b;
}

int ap_bundle_pack(const ap_bundle *b, uint8_t **out, size_t *len)
{
	size_t n = apollo__bundle__get_packed_size(b->pb);
	uint8_t *buf = malloc(n ? n : 1);

	*out = NULL;
	*len = 0;
	if (!buf)
		return AP_ENOMEM;
	apollo__bundle__pack(b->pb, buf);
	*out = buf;
	*len = n;
	return 0;
}

const struct Apollo__Bundle *ap_bundle_pb(const ap_bundle *b) { return b->pb; }
const char *ap_bundle_target(const ap_bundle *b) { return b->pb->target ? b->pb->target : ""; }
ap_output_kind ap_bundle_format(const ap_bundle *b) { return (ap_output_kind)b->pb->format; }
uint64_t ap_bundle_workspace_bytes(const ap_bundle *b) { return b->pb->workspace_bytes; }

/* The memory figures of one run of the plan (apollo.h). */
typedef struct bundle_memory {
	uint64_t peak, input, output, constant;
} bundle_memory;

static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* The daemon's figures when its Stats carry them, else the same computed
 * from the buffers as server/plan/plan.c does: a daemon before them sent
 * all four 0 (a bundle whose figures are truly 0 computes to 0 too). */
static bundle_memory memory_of(const ap_bundle *b)
{
	const Apollo__Stats *s = b->pb->stats;
	bundle_memory m = { 0, 0, 0, 0 };

	if (s && (s->peak_bytes || s->input_bytes || s->output_bytes || s->const_bytes)) {
		m.peak = s->peak_bytes;
		m.input = s->input_bytes;
		m.output = s->output_bytes;
		m.constant = s->const_bytes;
		return m;
	}
	for (size_t i = 0; i < b->pb->n_buffers; i++) {
		const Apollo__Buffer *bf = b->pb->buffers[i];

		if (!bf)
			continue;
		if (bf->kind == APOLLO__BUFFER_KIND__BUF_INPUT)
			m.input = add_sat(m.input, bf->bytes);
		else if (bf->kind == APOLLO__BUFFER_KIND__BUF_OUTPUT)
			m.output = add_sat(m.output, bf->bytes);
		else if (bf->kind == APOLLO__BUFFER_KIND__BUF_CONST)
			m.constant = add_sat(m.constant, bf->bytes);
	}
	m.peak = add_sat(add_sat(m.input, m.output), add_sat(m.constant, b->pb->workspace_bytes));
	return m;
}

uint64_t ap_bundle_peak_bytes(const ap_bundle *b) { return memory_of(b).peak; }
uint64_t ap_bundle_input_bytes(const ap_bundle *b) { return memory_of(b).input; }
uint64_t ap_bundle_output_bytes(const ap_bundle *b) { return memory_of(b).output; }
uint64_t ap_bundle_const_bytes(const ap_bundle *b) { return memory_of(b).constant; }

const uint8_t *ap_bundle_graph_hash(const ap_bundle *b, size_t *len)
{
	*len = b->pb->graph_hash.len;
	return b->pb->graph_hash.data;
}

int ap_bundle_n_kernels(const ap_bundle *b)
{
	return b->pb->n_kernels > INT32_MAX ? INT32_MAX : (int)b->pb->n_kernels;
}

const ProtobufCBinaryData *ap_bundle_pb_kernel_blob(const Apollo__Bundle *pb, size_t k)
{
	const Apollo__Kernel *kk, *o;

	if (k >= pb->n_kernels || !(kk = pb->kernels[k]))
		return NULL;
	if (!kk->blob_of)
		return &kk->blob;
	if (kk->blob_of > k || !(o = pb->kernels[kk->blob_of - 1]) || o->blob_of)
		return NULL;
	return &o->blob;
}

int ap_bundle_kernel_get(const ap_bundle *b, int i, ap_bundle_kernel *out)
{
	const Apollo__Kernel *k;
	const ProtobufCBinaryData *blob;

	memset(out, 0, sizeof(*out));
	if (i < 0 || (size_t)i >= b->pb->n_kernels || !b->pb->kernels[i])
		return AP_EINVAL;
	k = b->pb->kernels[i];
	out->name = k->name ? k->name : "";
	out->target = k->target ? k->target : "";
	out->format = (ap_output_kind)k->format;
	blob = ap_bundle_pb_kernel_blob(b->pb, (size_t)i);
	out->blob = blob ? blob->data : NULL;
	out->blob_bytes = blob ? blob->len : 0;
	for (int d = 0; d < 3; d++) {
		out->grid[d] = (size_t)d < k->n_grid ? k->grid[d] : 1;
		out->block[d] = (size_t)d < k->n_block ? k->block[d] : 1;
	}
	out->smem_bytes = k->dynamic_shared_bytes;
	out->n_params = k->n_params > INT32_MAX ? INT32_MAX : (int)k->n_params;
	out->n_nodes = k->n_nodes > INT32_MAX ? INT32_MAX : (int)k->n_nodes;
	out->nodes = (const char *const *)k->nodes;
	return 0;
}

int ap_bundle_kernel_param(const ap_bundle *b, int k, int p, ap_bundle_param *out)
{
	const Apollo__Kernel *kk;
	const Apollo__KernelParam *pp;

	memset(out, 0, sizeof(*out));
	if (k < 0 || (size_t)k >= b->pb->n_kernels || !(kk = b->pb->kernels[k]))
		return AP_EINVAL;
	if (p < 0 || (size_t)p >= kk->n_params || !(pp = kk->params[p]))
		return AP_EINVAL;
	out->name = pp->name ? pp->name : "";
	out->dtype = (ap_dtype)pp->dtype;
	out->written = pp->written;
	return 0;
}

int ap_bundle_n_launches(const ap_bundle *b)
{
	return b->pb->n_plan > INT32_MAX ? INT32_MAX : (int)b->pb->n_plan;
}

int ap_bundle_launch(const ap_bundle *b, int i, unsigned *kernel, int *n_args,
		     const uint32_t **args)
{
	const Apollo__Launch *l;

	if (i < 0 || (size_t)i >= b->pb->n_plan || !(l = b->pb->plan[i]) || l->n_args > INT32_MAX)
		return AP_EINVAL;
	*kernel = l->kernel;
	*n_args = (int)l->n_args;
	*args = l->args;
	return 0;
}

int ap_bundle_launch_nodes(const ap_bundle *b, int i, int *n, const char *const **nodes,
			   const char **category)
{
	const Apollo__Launch *l;

	*n = 0;
	*nodes = NULL;
	*category = "";
	if (i < 0 || (size_t)i >= b->pb->n_plan || !(l = b->pb->plan[i]) || l->n_nodes > INT32_MAX)
		return AP_EINVAL;
	*n = (int)l->n_nodes;
	*nodes = (const char *const *)l->nodes;
	*category = l->category ? l->category : "";
	return 0;
}

static unsigned layer_bits(char *const *names, size_t n)
{
	unsigned bits = 0;

	for (size_t i = 0; i < n; i++) {
		if (!names[i])
			continue;
		if (!strcmp(names[i], "I"))
			bits |= AP_BUNDLE_LAYER_I;
		else if (!strcmp(names[i], "II"))
			bits |= AP_BUNDLE_LAYER_II;
		else if (!strcmp(names[i], "III"))
			bits |= AP_BUNDLE_LAYER_III;
	}
	return bits;
}

int ap_bundle_launch_n_parts(const ap_bundle *b, int i)
{
	const Apollo__Launch *l;

	if (i < 0 || (size_t)i >= b->pb->n_plan || !(l = b->pb->plan[i]) || l->n_parts > INT32_MAX)
		return 0;
	return (int)l->n_parts;
}

int ap_bundle_launch_part_get(const ap_bundle *b, int i, int j, ap_bundle_launch_part *out)
{
	const Apollo__Launch *l;
	const Apollo__LaunchPart *p;

	memset(out, 0, sizeof(*out));
	out->category = out->detail = out->emitter = out->schedule = out->layer1 = "";
	if (i < 0 || (size_t)i >= b->pb->n_plan || !(l = b->pb->plan[i]) || j < 0 ||
	    (size_t)j >= l->n_parts || !(p = l->parts[j]) || p->n_nodes > INT32_MAX)
		return AP_EINVAL;
	out->category = p->category ? p->category : "";
	out->n_nodes = (int)p->n_nodes;
	out->nodes = (const char *const *)p->nodes;
	out->block_begin = p->block_begin;
	out->blocks = p->blocks;
	out->layers = layer_bits(p->layers, p->n_layers);
	out->detail = p->detail ? p->detail : "";
	out->emitter = p->emitter ? p->emitter : "";
	out->schedule = p->schedule ? p->schedule : "";
	out->recompute = p->recompute_ratio;
	out->layer1 = p->layer1_schedule ? p->layer1_schedule : "";
	out->tune_signature = p->tune_signature.len == 32 ? p->tune_signature.data : NULL;
	return 0;
}

unsigned ap_bundle_launch_layers(const ap_bundle *b, int i, uint64_t *bytes)
{
	const Apollo__Launch *l;

	if (bytes)
		*bytes = 0;
	if (i < 0 || (size_t)i >= b->pb->n_plan || !(l = b->pb->plan[i]))
		return 0;
	if (bytes)
		*bytes = l->global_bytes;
	return layer_bits(l->layers, l->n_layers);
}

int ap_bundle_n_boundaries(const ap_bundle *b)
{
	return b->pb->n_boundaries > INT32_MAX ? INT32_MAX : (int)b->pb->n_boundaries;
}

int ap_bundle_boundary_get(const ap_bundle *b, int i, ap_bundle_boundary *out)
{
	const Apollo__Boundary *x;

	memset(out, 0, sizeof(*out));
	if (i < 0 || (size_t)i >= b->pb->n_boundaries || !(x = b->pb->boundaries[i]))
		return AP_EINVAL;
	out->producer = x->producer;
	out->consumer = x->consumer;
	out->tensor = x->tensor ? x->tensor : "";
	out->reason = x->reason ? x->reason : "";
	out->detail = x->detail ? x->detail : "";
	return 0;
}

int ap_bundle_n_buffers(const ap_bundle *b)
{
	return b->pb->n_buffers > INT32_MAX ? INT32_MAX : (int)b->pb->n_buffers;
}

int ap_bundle_buffer_get(const ap_bundle *b, int i, ap_bundle_buffer *out)
{
	const Apollo__Buffer *bf;

	memset(out, 0, sizeof(*out));
	if (i < 0 || (size_t)i >= b->pb->n_buffers || !(bf = b->pb->buffers[i]))
		return AP_EINVAL;
	out->name = bf->name ? bf->name : "";
	out->kind = (ap_bundle_buffer_kind)bf->kind;
	out->dtype = (ap_dtype)bf->dtype;
	if (bf->n_dims > AP_MAX_RANK) {
		out->rank = -1;
	} else {
		out->rank = (int)bf->n_dims;
		for (size_t d = 0; d < bf->n_dims; d++)
			out->dims[d] = bf->dims[d];
	}
	out->bytes = bf->bytes;
	out->offset = bf->offset;
	out->index = bf->index;
	return 0;
}

void ap_bundle_stats_get(const ap_bundle *b, ap_bundle_stats *out)
{
	const Apollo__Stats *s = b->pb->stats;
	bundle_memory m = memory_of(b);

	memset(out, 0, sizeof(*out));
	out->peak_bytes = m.peak;
	out->input_bytes = m.input;
	out->output_bytes = m.output;
	out->const_bytes = m.constant;
	if (!s)
		return;
	out->kernels = s->kernels;
	out->eager_kernels = s->eager_kernels;
	out->nodes = s->nodes;
	out->kernels_compiled = s->kernels_compiled;
	out->distinct_kernels = s->distinct_kernels;
	out->layer1 = s->layer1_changed;
	out->layer2 = s->layer2_stitched;
	out->layer3 = s->layer3_merged;
	out->global_bytes = s->global_bytes;
	out->eager_bytes = s->eager_bytes;
	out->min_bytes = s->min_bytes;
	out->import_ms = s->import_ms;
	out->partition_ms = s->partition_ms;
	out->codegen_ms = s->codegen_ms;
	out->backend_ms = s->backend_ms;
	out->cache_ms = s->cache_ms;
	out->compile_ms = s->compile_ms;
	out->cache_hit = s->cache_hit;
	/* a hit names its tier; a daemon before issue 10 named none: its own cache */
	out->cache_tier = !s->cache_hit ? AP_TIER_COMPILED
		: s->cache_tier ? (ap_cache_tier)(s->cache_tier & 3) : AP_TIER_L1;
	out->kernels_remote = s->kernels_remote;
	out->kernels_shared = s->kernels_shared;
	out->layer1_ms = s->layer1_ms;
	out->tune_hits = s->tune_hits;
	out->tune_measured = s->tune_measured;
	out->tune_searched = s->tune_searched;
	out->tune_tried = s->tune_tried;
	out->tune_ms = s->tune_ms;
	out->tune_capped = s->tune_capped;
}

const char *ap_cache_tier_name(ap_cache_tier t)
{
	static const char *const names[] = { "compiled", "l1", "l2", "shared" };

	return names[(unsigned)t & 3];
}
