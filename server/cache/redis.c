/* redis.c -- the shared cache in Redis (see redis.h).  The only file that
 * includes hiredis.h.
 *
 * Approach: blocking hiredis contexts with SO_RCVTIMEO / SO_SNDTIMEO (the
 * command timeout) in a pool, one per calling thread at a time, like the
 * SQLite pool of cache.c.  A context that failed is freed, never reused.
 * Replies are read by hand (redisBufferRead + redisGetReplyFromReader)
 * so that the announced length of a bulk reply, and the bytes buffered so
 * far, are checked against max_value_bytes before hiredis buffers more:
 * a reply over the limit ends the connection.  The whole command also has
 * one deadline, so a server that sends a byte at a time cannot stretch it.
 *
 * That bounds each bulk string, not the reply: an array of 2,000 bulk
 * strings of 1 MB each passes a 2 MB limit one string at a time, and
 * hiredis keeps every parsed string (issue 29, item 7: 1.9 GB).  So every
 * connection's reader builds replies through bounded_fns, which wrap
 * hiredis's own constructors and count, across the whole reply being
 * read, its elements (arrays' announced sizes, at every depth: at most
 * REPLY_MAX_ELEMENTS, checked before hiredis allocates the array) and its
 * bytes (strings' lengths plus REPLY_OBJECT_BYTES per object: at most
 * max_value_bytes + REPLY_SLACK_BYTES); a constructor that would pass
 * either refuses (returns NULL), hiredis abandons the reply and frees what
 * it built, and the connection is dropped -- its state is unknown.  Debian
 * 12's hiredis (0.14) has no maxelements / maxbulklen of its own.  No
 * command this file sends has an array for an answer; the bound still
 * allows small ones.  A refused reply is not tried again on a fresh
 * connection: the server answered, and would answer the same.
 *
 * A value (all integers little-endian):
 *   "APL2" | format u8 (FORMAT) | kind u8 | n u32 | n x (len u64, bytes) | mac[32]
 * mac = HMAC-SHA256(K, key string NUL value-without-mac), K =
 * HMAC-SHA256(secret, "apollod shared cache v1"): naming the key in the
 * MAC means an entry copied under another key does not verify either.
 *
 * The breaker (redis.h) is a small state machine under the mutex: every
 * call first asks allow() and ends with settle(ok), so a half-open probe
 * is always resolved.
 *
 * Leases (redis.h) go through the same pool, deadline and breaker: SET
 * NX PX to take, GET to see the holder, and a compare-and-act Lua script
 * (EVAL with one key; Redis keeps the compiled script, the text is about
 * 100 bytes) to renew or release, so that a token that no longer holds
 * the lease changes nothing.  A lease value is never verified nor served.
 */
#include "redis.h"

#include "../../common/trust.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "../../common/graph.h"
#include "../config.h"
#include "proto/apollo.pb-c.h"

#define FORMAT 1
#define MAGIC "APL2"
#define HEADER_BYTES 10          /* magic, format, kind, n */
#define MAC_BYTES 32
#define MAX_PARTS 65536
#define SECRET_MIN 16
#define SECRET_MAX 4096
#define KEY_CAP 160
#define REPLY_MAX_ELEMENTS 1024          /* elements of one reply, every depth together */
#define REPLY_OBJECT_BYTES 64            /* a redisReply and its slot in its array */
#define REPLY_SLACK_BYTES (64 << 10)     /* a reply may hold max_value_bytes + this */
#define STR_(x) #x
#define STR(x) STR_(x)

struct rconn {
	redisContext *ctx;
	/* the reply being read (bounded_fns) */
	redisReplyObjectFunctions *made_by;  /* hiredis's own constructors */
	size_t reply_max_bytes;              /* max_value_bytes + REPLY_SLACK_BYTES */
	size_t reply_bytes;
	unsigned reply_elements;
	const char *refused;                 /* why a constructor refused; NULL: none did */
	struct rconn *next;
};

struct ap_redis {
	char host[256];
	int port;                    /* 0: Unix socket at `host` */
	char label[300];             /* for the log: HOST:PORT or unix:PATH */
	char ns[64];
	char *password;
	uint8_t mac_key[32];
	unsigned ttl_s, connect_ms, timeout_ms, breaker_failures, breaker_open_ms;
	size_t max_value;
	pthread_mutex_t mu;
	struct rconn *pool;          /* idle connections */
	/* breaker, under mu */
	ap_redis_state state;
	unsigned fails;              /* failures in a row */
	double open_until;           /* ap_now_ms() */
	ap_redis_counts n;           /* under mu, state aside */
};

/* ---- set-up ------------------------------------------------------------------ */

static int parse_addr(ap_redis *r, const char *a, ap_error *err)
{
	const char *colon;
	char *end;
	long port;

	if (!strncmp(a, "unix:", 5) || a[0] == '/') {
		const char *path = a[0] == '/' ? a : a + 5;

		if (!*path || strlen(path) >= sizeof(r->host))
			goto bad;
		snprintf(r->host, sizeof(r->host), "%s", path);
		r->port = 0;
		snprintf(r->label, sizeof(r->label), "unix:%s", r->host);
		return 0;
	}
	if (a[0] == '[') {
		const char *rb = strchr(a, ']');

		if (!rb || rb[1] != ':' || (size_t)(rb - a - 1) >= sizeof(r->host) || rb == a + 1)
			goto bad;
		memcpy(r->host, a + 1, (size_t)(rb - a - 1));
		r->host[rb - a - 1] = '\0';
		colon = rb + 1;
	} else {
		colon = strrchr(a, ':');
		if (!colon || colon == a || (size_t)(colon - a) >= sizeof(r->host))
			goto bad;
		memcpy(r->host, a, (size_t)(colon - a));
		r->host[colon - a] = '\0';
	}
	port = strtol(colon + 1, &end, 10);
	if (end == colon + 1 || *end || port < 1 || port > 65535)
		goto bad;
	r->port = (int)port;
	snprintf(r->label, sizeof(r->label), "%s", a);
	return 0;
bad:
	return ap_error_set(err, AP_EINVAL, NULL, NULL,
			    "redis: '%.200s' is not HOST:PORT, [IPv6]:PORT or unix:PATH", a);
}

int ap_redis_new(const ap_redis_options *o, ap_redis **out, ap_error *err)
{
	static const char label[] = "apollod shared cache v1";
	const char *ns = o->ns && *o->ns ? o->ns : "apollo";
	const void *parts[1] = { label };
	size_t lens[1] = { sizeof(label) - 1 };
	ap_redis *r;
	int rc;

	*out = NULL;
	if (!o->secret || o->secret_len < SECRET_MIN)
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "redis: the cluster secret must be at least %d bytes", SECRET_MIN);
	if (strlen(ns) >= sizeof(r->ns) || strpbrk(ns, ": \t\r\n"))
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "redis_namespace '%.80s' must be under %zu bytes, without ':' or "
				    "spaces", ns, sizeof(r->ns));
	r = calloc(1, sizeof(*r));
	if (!r)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	if ((rc = parse_addr(r, o->addr ? o->addr : "", err))) {
		free(r);
		return rc;
	}
	snprintf(r->ns, sizeof(r->ns), "%s", ns);
	if (o->password && *o->password && !(r->password = strdup(o->password))) {
		free(r);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	if (ap_hmac_sha256(o->secret, o->secret_len, parts, lens, 1, r->mac_key)) {
		free(r->password);
		free(r);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	r->ttl_s = o->ttl_s;
	r->connect_ms = o->connect_timeout_ms ? o->connect_timeout_ms : 200;
	r->timeout_ms = o->timeout_ms ? o->timeout_ms : 500;
	r->breaker_failures = o->breaker_failures ? o->breaker_failures : 3;
	r->breaker_open_ms = o->breaker_open_ms ? o->breaker_open_ms : 5000;
	r->max_value = o->max_value_bytes ? o->max_value_bytes : (size_t)64 << 20;
	pthread_mutex_init(&r->mu, NULL);
	*out = r;
	return 0;
}

ap_redis *ap_redis_free(ap_redis *r)
{
	if (!r)
		return NULL;
	while (r->pool) {
		struct rconn *c = r->pool;

		r->pool = c->next;
		redisFree(c->ctx);
		free(c);
	}
	if (r->password) {
		memset(r->password, 0, strlen(r->password));
		free(r->password);
	}
	memset(r->mac_key, 0, sizeof(r->mac_key));
	pthread_mutex_destroy(&r->mu);
	free(r);
	return NULL;
}

int ap_redis_read_secret_file(const char *path, bool private_only, uint8_t **out, size_t *len,
			      ap_error *err)
{
	struct stat st;
	uint8_t *buf;
	ssize_t n;
	int fd;

	*out = NULL;
	*len = 0;
	/* private_only: the file's owner and mode, and its directories, by
	 * common/trust.h's rule for secrets */
	fd = private_only ? ap_trust_open(path, "secret file", AP_TRUST_SECRET, err)
			  : open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return private_only ? fd : ap_error_set(err, AP_EIO, NULL, NULL, "cannot open %s: %s",
							 path, strerror(errno));
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size > SECRET_MAX) {
		close(fd);
		return ap_error_set(err, AP_EIO, NULL, NULL, "%s is not a regular file of at most %d "
				    "bytes", path, SECRET_MAX);
	}
	buf = malloc(SECRET_MAX + 1);
	if (!buf) {
		close(fd);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	n = read(fd, buf, SECRET_MAX + 1);
	close(fd);
	if (n < 0 || n > SECRET_MAX) {
		free(buf);
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot read %s", path);
	}
	if (n > 0 && buf[n - 1] == '\n')
		n--;
	if (n > 0 && buf[n - 1] == '\r')
		n--;
	if (n == 0) {
		free(buf);
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "%s is empty", path);
	}
	*out = buf;
	*len = (size_t)n;
	return 0;
}

void ap_redis_key_string(const ap_redis *r, int kind, const uint8_t key[32], char *buf,
			 size_t cap)
{
	char hex[65];

	ap_hex(key, 32, hex);
	snprintf(buf, cap, "%s:s%d.%d:%c:%s", r->ns, APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT,
		 FORMAT, kind, hex);
}

/* ---- the breaker --------------------------------------------------------------- */

const char *ap_redis_state_name(ap_redis_state s)
{
	return s == AP_REDIS_OPEN ? "open" : s == AP_REDIS_HALF_OPEN ? "half-open" : "closed";
}

/* May a call go to Redis now?  (An open breaker whose time is up lets
 * this one call through as the half-open probe.) */
static bool allow(ap_redis *r)
{
	bool ok = false;

	pthread_mutex_lock(&r->mu);
	if (r->state == AP_REDIS_CLOSED) {
		ok = true;
	} else if (r->state == AP_REDIS_OPEN && ap_now_ms() >= r->open_until) {
		r->state = AP_REDIS_HALF_OPEN;
		ok = true;
		ap_log(AP_LOG_INFO, "redis %s: breaker half-open, trying again", r->label);
	}
	if (!ok)
		r->n.skipped++;
	pthread_mutex_unlock(&r->mu);
	return ok;
}

/* The outcome of an allowed call; `why` says what failed. */
static void settle(ap_redis *r, bool ok, const char *why)
{
	pthread_mutex_lock(&r->mu);
	if (ok) {
		if (r->state != AP_REDIS_CLOSED)
			ap_log(AP_LOG_WARN, "redis %s: reachable again, breaker closed", r->label);
		r->state = AP_REDIS_CLOSED;
		r->fails = 0;
	} else {
		r->n.failures++;
		r->fails++;
		ap_log(AP_LOG_DEBUG, "redis: %s", why);
		if (r->state == AP_REDIS_HALF_OPEN || (r->state == AP_REDIS_CLOSED &&
						       r->fails >= r->breaker_failures)) {
			ap_log(AP_LOG_WARN, "redis %s: %s; breaker open for %u ms (requests go on "
			       "without the shared cache)", r->label, why, r->breaker_open_ms);
			r->state = AP_REDIS_OPEN;
			r->open_until = ap_now_ms() + r->breaker_open_ms;
			r->n.opens++;
			/* the pooled connections are as dead as this one */
			while (r->pool) {
				struct rconn *c = r->pool;

				r->pool = c->next;
				redisFree(c->ctx);
				free(c);
			}
		}
	}
	pthread_mutex_unlock(&r->mu);
}

/* ---- connections and commands ----------------------------------------------------- */

static struct timeval tv_ms(unsigned ms)
{
	struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000 };

	return tv;
}

static void discard(struct rconn *c)
{
	if (c) {
		redisFree(c->ctx);
		free(c);
	}
}

/* ---- bounded replies (see the top of the file) ------------------------------------ */

/* Counts one more object of `bytes` (beyond its own REPLY_OBJECT_BYTES)
 * and `elements` into the reply of the connection `task` reads for; false
 * (and c->refused set) when the reply would pass a bound. */
static bool reply_room(const redisReadTask *task, size_t bytes, long long elements)
{
	struct rconn *c = task->privdata;

	if (elements < 0)
		elements = 0;
	if (elements > REPLY_MAX_ELEMENTS - (long long)c->reply_elements) {
		c->refused = "a reply of more than " STR(REPLY_MAX_ELEMENTS) " elements";
		return false;
	}
	c->reply_elements += (unsigned)elements;
	bytes += REPLY_OBJECT_BYTES + (size_t)elements * sizeof(void *);
	if (bytes > c->reply_max_bytes - c->reply_bytes) {
		c->refused = "a reply larger than redis_max_value_bytes + 64 KiB in all";
		return false;
	}
	c->reply_bytes += bytes;
	return true;
}

static void *bounded_string(const redisReadTask *task, char *str, size_t len)
{
	struct rconn *c = task->privdata;

	return reply_room(task, len + 1, 0) ? c->made_by->createString(task, str, len) : NULL;
}

static void *bounded_array(const redisReadTask *task, int elements)
{
	struct rconn *c = task->privdata;

	return reply_room(task, 0, elements) ? c->made_by->createArray(task, elements) : NULL;
}

static void *bounded_integer(const redisReadTask *task, long long value)
{
	struct rconn *c = task->privdata;

	return reply_room(task, 0, 0) ? c->made_by->createInteger(task, value) : NULL;
}

static void *bounded_nil(const redisReadTask *task)
{
	struct rconn *c = task->privdata;

	return reply_room(task, 0, 0) ? c->made_by->createNil(task) : NULL;
}

/* The objects are hiredis's own: freeReplyObject frees them. */
static redisReplyObjectFunctions bounded_fns = {
	bounded_string, bounded_array, bounded_integer, bounded_nil, freeReplyObject,
};

/* Runs one command on `c` and reads its reply within the deadline and the
 * size limits: the reply, or NULL with `why` filled (the connection is
 * then unusable) and *refused true when the reply itself was over a bound
 * (and asking again would only fetch it again). */
static redisReply *command(ap_redis *r, struct rconn *c, int argc, const char **argv,
			   const size_t *lens, char *why, size_t cap, bool *refused)
{
	redisContext *ctx = c->ctx;
	double deadline = ap_now_ms() + r->timeout_ms;
	int done = 0;

	*refused = false;
	c->reply_bytes = 0;
	c->reply_elements = 0;
	c->refused = NULL;
	if (redisAppendCommandArgv(ctx, argc, argv, lens) != REDIS_OK) {
		snprintf(why, cap, "cannot queue a command: %s", ctx->errstr);
		return NULL;
	}
	while (!done) {
		if (redisBufferWrite(ctx, &done) != REDIS_OK) {
			snprintf(why, cap, "sending: %s", ctx->errstr[0] ? ctx->errstr : "failed");
			return NULL;
		}
		if (!done && ap_now_ms() > deadline) {
			snprintf(why, cap, "sending took over %u ms", r->timeout_ms);
			return NULL;
		}
	}
	for (;;) {
		void *reply = NULL;
		redisReader *rd = ctx->reader;
		size_t buffered;

		if (redisGetReplyFromReader(ctx, &reply) != REDIS_OK) {
			*refused = c->refused != NULL;
			snprintf(why, cap, "%s%s", c->refused ? "refused " : "bad reply: ",
				 c->refused ? c->refused : ctx->errstr);
			return NULL;
		}
		if (reply)
			return reply;
		/* Not complete: check what is announced and buffered first. */
		buffered = rd->len - rd->pos;
		if (buffered > 0 && rd->buf[rd->pos] == '$') {
			unsigned long long announced = strtoull(rd->buf + rd->pos + 1, NULL, 10);

			if (announced > r->max_value) {
				snprintf(why, cap, "a reply of %llu bytes is over redis_max_value_bytes",
					 announced);
				*refused = true;
				return NULL;
			}
		}
		if (buffered > r->max_value + 64) {
			snprintf(why, cap, "a reply over redis_max_value_bytes");
			*refused = true;
			return NULL;
		}
		if (ap_now_ms() > deadline) {
			snprintf(why, cap, "no complete reply within %u ms", r->timeout_ms);
			return NULL;
		}
		if (redisBufferRead(ctx) != REDIS_OK) {
			snprintf(why, cap, "reading: %s", ctx->errstr[0] ? ctx->errstr : "failed");
			return NULL;
		}
	}
}

/* A pooled connection (*pooled set), or a new one (connected, timeouts
 * set, AUTH sent): NULL with `why` filled. */
static struct rconn *acquire(ap_redis *r, bool fresh, bool *pooled, char *why, size_t cap)
{
	struct rconn *c = NULL;
	redisContext *ctx;

	if (!fresh) {
		pthread_mutex_lock(&r->mu);
		c = r->pool;
		if (c)
			r->pool = c->next;
		pthread_mutex_unlock(&r->mu);
	}
	*pooled = c != NULL;
	if (c)
		return c;
	ctx = r->port ? redisConnectWithTimeout(r->host, r->port, tv_ms(r->connect_ms))
		      : redisConnectUnixWithTimeout(r->host, tv_ms(r->connect_ms));
	if (!ctx || ctx->err) {
		snprintf(why, cap, "cannot connect: %s", ctx ? ctx->errstr : "out of memory");
		redisFree(ctx);
		return NULL;
	}
	if (redisSetTimeout(ctx, tv_ms(r->timeout_ms)) != REDIS_OK) {
		snprintf(why, cap, "cannot set the timeout: %s", ctx->errstr);
		redisFree(ctx);
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		snprintf(why, cap, "out of memory");
		redisFree(ctx);
		return NULL;
	}
	c->ctx = ctx;
	c->made_by = ctx->reader->fn;
	c->reply_max_bytes = r->max_value + REPLY_SLACK_BYTES;
	ctx->reader->fn = &bounded_fns;
	ctx->reader->privdata = c;
	if (r->password) {
		const char *argv[2] = { "AUTH", r->password };
		size_t lens[2] = { 4, strlen(r->password) };
		bool refused;
		redisReply *rep = command(r, c, 2, argv, lens, why, cap, &refused);
		bool ok = rep && rep->type == REDIS_REPLY_STATUS;

		if (rep && !ok)
			snprintf(why, cap, "AUTH refused: %.200s",
				 rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
		freeReplyObject(rep);
		if (!ok) {
			discard(c);
			return NULL;
		}
	}
	return c;
}

static void release(ap_redis *r, struct rconn *c)
{
	pthread_mutex_lock(&r->mu);
	c->next = r->pool;
	r->pool = c;
	pthread_mutex_unlock(&r->mu);
}

/* An allowed call: one command on a pooled connection.  A pooled
 * connection that fails (Redis restarted since it was opened) is dropped
 * and the command tried once more on a new one (GET and SET may be
 * repeated; so may the lease scripts; a lease's SET NX repeated after a
 * lost reply finds its own token, which lease.c recognises).  The reply (caller frees), or NULL after settling the
 * failure. */
static redisReply *call(ap_redis *r, int argc, const char **argv, const size_t *lens)
{
	char why[300];
	bool pooled, refused = false;
	struct rconn *c = acquire(r, false, &pooled, why, sizeof(why));
	redisReply *rep = NULL;

	if (c)
		rep = command(r, c, argc, argv, lens, why, sizeof(why), &refused);
	if (c && !rep && pooled && !refused) {
		discard(c);
		c = acquire(r, true, &pooled, why, sizeof(why));
		if (c)
			rep = command(r, c, argc, argv, lens, why, sizeof(why), &refused);
	}
	if (!c) {
		settle(r, false, why);
		return NULL;
	}
	if (!rep) {
		discard(c);
		if (refused) {
			ap_log(AP_LOG_WARN, "redis %s: %s %s; connection dropped", r->label,
			       argc > 0 ? argv[0] : "", why);
			pthread_mutex_lock(&r->mu);
			r->n.refused++;
			pthread_mutex_unlock(&r->mu);
		}
		settle(r, false, why);
		return NULL;
	}
	if (rep->type == REDIS_REPLY_ERROR) {
		snprintf(why, sizeof(why), "error reply: %.200s", rep->str);
		freeReplyObject(rep);
		release(r, c);
		settle(r, false, why);
		return NULL;
	}
	release(r, c);
	settle(r, true, NULL);
	return rep;
}

int ap_redis_ping(ap_redis *r, ap_error *err)
{
	const char *argv[1] = { "PING" };
	size_t lens[1] = { 4 };
	redisReply *rep;

	if (!allow(r))
		return ap_error_set(err, AP_EIO, NULL, NULL, "redis: the breaker is open");
	rep = call(r, 1, argv, lens);
	if (!rep)
		return ap_error_set(err, AP_EIO, NULL, NULL, "redis %s does not answer", r->label);
	freeReplyObject(rep);
	return 0;
}

/* ---- values ------------------------------------------------------------------------- */

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
	uint64_t v = 0;

	for (int i = 0; i < n; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

/* The MAC of `len` value bytes stored under `key_str`. */
static int value_mac(const ap_redis *r, const char *key_str, const uint8_t *v, size_t len,
		     uint8_t mac[32])
{
	const void *parts[2] = { key_str, v };
	size_t lens[2] = { strlen(key_str) + 1, len };

	return ap_hmac_sha256(r->mac_key, sizeof(r->mac_key), parts, lens, 2, mac);
}

void ap_redis_entry_clear(ap_redis_entry *e)
{
	free(e->buf);
	free(e->part);
	free(e->part_len);
	memset(e, 0, sizeof(*e));
}

/* Checks a value read under `key_str` and fills *e (taking `v`): 0, or a
 * reason it does not verify (`v` freed). */
static const char *verify(const ap_redis *r, const char *key_str, int kind, uint8_t *v,
			  size_t len, ap_redis_entry *e)
{
	uint8_t mac[32];
	const uint8_t *p, *end;
	uint64_t n;

	memset(e, 0, sizeof(*e));
	if (len < HEADER_BYTES + MAC_BYTES) {
		free(v);
		return "too short to be an entry";
	}
	if (value_mac(r, key_str, v, len - MAC_BYTES, mac)) {
		free(v);
		return "cannot compute the signature";
	}
	if (!ap_mem_equal_ct(mac, v + len - MAC_BYTES, MAC_BYTES)) {
		free(v);
		return "the signature does not match (altered, or another cluster secret)";
	}
	/* Signed by a daemon with our secret: still check every length. */
	if (memcmp(v, MAGIC, 4) || v[4] != FORMAT || v[5] != kind) {
		free(v);
		return "signed, but not an entry of this kind and format";
	}
	n = get_le(v + 6, 4);
	end = v + len - MAC_BYTES;
	if (n > MAX_PARTS || n > (uint64_t)(end - (v + HEADER_BYTES)) / 8) {
		free(v);
		return "signed, but its part count does not fit";
	}
	e->part = calloc((size_t)n + 1, sizeof(*e->part));
	e->part_len = calloc((size_t)n + 1, sizeof(*e->part_len));
	if (!e->part || !e->part_len) {
		ap_redis_entry_clear(e);
		free(v);
		return "out of memory";
	}
	p = v + HEADER_BYTES;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t l;

		if ((size_t)(end - p) < 8) {
			ap_redis_entry_clear(e);
			free(v);
			return "signed, but truncated";
		}
		l = get_le(p, 8);
		p += 8;
		if (l > (uint64_t)(end - p)) {
			ap_redis_entry_clear(e);
			free(v);
			return "signed, but a part runs past its end";
		}
		e->part[i] = p;
		e->part_len[i] = (size_t)l;
		p += l;
	}
	if (p != end) {
		ap_redis_entry_clear(e);
		free(v);
		return "signed, but with bytes after its parts";
	}
	e->buf = v;
	e->buf_len = len;
	e->n = (int)n;
	return NULL;
}

int ap_redis_get(ap_redis *r, int kind, const uint8_t key[32], ap_redis_entry *e)
{
	char key_str[KEY_CAP];
	const char *argv[2] = { "GET", key_str };
	size_t lens[2] = { 3, 0 };
	redisReply *rep;
	const char *bad;
	uint8_t *v;
	size_t len;

	memset(e, 0, sizeof(*e));
	ap_redis_key_string(r, kind, key, key_str, sizeof(key_str));
	lens[1] = strlen(key_str);
	pthread_mutex_lock(&r->mu);
	r->n.gets++;
	pthread_mutex_unlock(&r->mu);
	rep = allow(r) ? call(r, 2, argv, lens) : NULL;
	if (!rep || rep->type != REDIS_REPLY_STRING) {
		if (rep && rep->type != REDIS_REPLY_NIL)
			ap_log(AP_LOG_WARN, "redis: GET %s answered a reply of type %d; a miss", key_str,
			       rep->type);
		freeReplyObject(rep);
		pthread_mutex_lock(&r->mu);
		r->n.misses++;
		pthread_mutex_unlock(&r->mu);
		return 0;
	}
	len = (size_t)rep->len;
	v = len <= r->max_value ? malloc(len ? len : 1) : NULL;
	if (v)
		memcpy(v, rep->str, len);
	freeReplyObject(rep);
	bad = v ? verify(r, key_str, kind, v, len, e) : "too large or out of memory";
	pthread_mutex_lock(&r->mu);
	r->n.bytes_read += len;
	if (bad) {
		r->n.misses++;
		r->n.verify_failures += v != NULL;
	} else {
		r->n.hits++;
	}
	pthread_mutex_unlock(&r->mu);
	if (bad) {
		ap_log(AP_LOG_WARN, "redis: entry %s not served: %s", key_str, bad);
		return 0;
	}
	return 1;
}

int ap_redis_put(ap_redis *r, int kind, const uint8_t key[32], int n, const uint8_t *const *parts,
		 const size_t *lens)
{
	char key_str[KEY_CAP], ttl[24];
	const char *argv[5] = { "SET", key_str, NULL, "EX", ttl };
	size_t alens[5] = { 3, 0, 0, 2, 0 };
	uint64_t total = HEADER_BYTES + MAC_BYTES;
	redisReply *rep;
	uint8_t *v, *p;
	int rc = 0;

	for (int i = 0; i < n; i++)
		total += 8 + (uint64_t)lens[i];
	if (n < 0 || n > MAX_PARTS || total > r->max_value)
		return AP_ETOOLARGE;
	v = malloc((size_t)total);
	if (!v)
		return AP_ENOMEM;
	memcpy(v, MAGIC, 4);
	v[4] = FORMAT;
	v[5] = (uint8_t)kind;
	put_le(v + 6, (uint64_t)n, 4);
	p = v + HEADER_BYTES;
	for (int i = 0; i < n; i++) {
		put_le(p, lens[i], 8);
		p += 8;
		if (lens[i])
			memcpy(p, parts[i], lens[i]);
		p += lens[i];
	}
	ap_redis_key_string(r, kind, key, key_str, sizeof(key_str));
	if (value_mac(r, key_str, v, (size_t)(p - v), p)) {
		free(v);
		return AP_ENOMEM;
	}
	argv[2] = (const char *)v;
	alens[1] = strlen(key_str);
	alens[2] = (size_t)total;
	snprintf(ttl, sizeof(ttl), "%u", r->ttl_s);
	alens[4] = strlen(ttl);
	if (!allow(r)) {
		rc = AP_EBUSY;
	} else {
		rep = call(r, r->ttl_s ? 5 : 3, argv, alens);
		rc = rep ? 0 : AP_EIO;
		freeReplyObject(rep);
	}
	pthread_mutex_lock(&r->mu);
	r->n.puts++;
	if (rc)
		r->n.put_failures++;
	else
		r->n.bytes_written += total;
	pthread_mutex_unlock(&r->mu);
	free(v);
	return rc;
}

/* ---- leases (redis.h) --------------------------------------------------------- */

/* Lua, one key: extend / delete KEYS[1] only while it holds ARGV[1]. */
static const char renew_script[] =
	"if redis.call('get', KEYS[1]) == ARGV[1] then "
	"return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0";
static const char release_script[] =
	"if redis.call('get', KEYS[1]) == ARGV[1] then "
	"return redis.call('del', KEYS[1]) end return 0";

void ap_redis_lease_key_string(const ap_redis *r, int kind, const uint8_t key[32], char *buf,
			       size_t cap)
{
	char hex[65];

	ap_hex(key, 32, hex);
	snprintf(buf, cap, "%s:s%d.%d:lease:%c:%s", r->ns,
		 APOLLO__SCHEMA_VERSION__SCHEMA_VERSION_CURRENT, FORMAT, kind, hex);
}

/* One lease command: argv[at] is filled with the lease key of (kind,
 * key), every other length taken with strlen.  Its reply (caller frees),
 * or NULL with *rc AP_EBUSY (breaker open, nothing sent) or AP_EIO
 * (failed; call() settled it). */
static redisReply *lease_call(ap_redis *r, int kind, const uint8_t key[32], int argc,
			      const char **argv, int at, int *rc)
{
	char key_str[KEY_CAP];
	size_t lens[8];
	redisReply *rep;

	ap_redis_lease_key_string(r, kind, key, key_str, sizeof(key_str));
	argv[at] = key_str;
	for (int i = 0; i < argc && i < 8; i++)
		lens[i] = strlen(argv[i]);
	if (!allow(r)) {
		*rc = AP_EBUSY;
		return NULL;
	}
	rep = call(r, argc, argv, lens);
	*rc = rep ? 0 : AP_EIO;
	return rep;
}

int ap_redis_lease_take(ap_redis *r, int kind, const uint8_t key[32], unsigned ttl_ms,
			ap_redis_lease *l)
{
	char ttl[24];
	const char *argv[6] = { "SET", NULL, l->token, "NX", "PX", ttl };
	uint8_t raw[AP_REDIS_TOKEN_CHARS / 2];
	redisReply *rep;
	int rc;

	memmove(l->key, key, 32);   /* key may be l->key itself */
	memset(l->token, 0, sizeof(l->token));
	l->kind = kind;
	if (!ttl_ms)
		return AP_EINVAL;
	if (ap_random_bytes(raw, sizeof(raw)))
		return AP_EIO;
	ap_hex(raw, sizeof(raw), l->token);
	snprintf(ttl, sizeof(ttl), "%u", ttl_ms);
	rep = lease_call(r, kind, l->key, 6, argv, 1, &rc);
	if (!rep)
		return rc;
	rc = rep->type == REDIS_REPLY_STATUS ? 1 : 0;   /* +OK, or nil: held */
	freeReplyObject(rep);
	return rc;
}

int ap_redis_lease_holder(ap_redis *r, int kind, const uint8_t key[32],
			  char token[AP_REDIS_TOKEN_CHARS + 1])
{
	const char *argv[2] = { "GET", NULL };
	redisReply *rep;
	int rc;

	token[0] = '\0';
	rep = lease_call(r, kind, key, 2, argv, 1, &rc);
	if (!rep)
		return rc;
	rc = rep->type == REDIS_REPLY_STRING ? 1 : 0;
	if (rc && rep->len == AP_REDIS_TOKEN_CHARS &&
	    strspn(rep->str, "0123456789abcdef") == AP_REDIS_TOKEN_CHARS) {
		memcpy(token, rep->str, AP_REDIS_TOKEN_CHARS);
		token[AP_REDIS_TOKEN_CHARS] = '\0';
	}
	freeReplyObject(rep);
	return rc;
}

/* Runs a compare-and-act script on lease l (with `arg` as ARGV[2], or
 * none): 1 when it acted, 0 when l's token no longer holds the lease, or
 * the failure. */
static int lease_script(ap_redis *r, const ap_redis_lease *l, const char *script,
			const char *arg)
{
	const char *argv[6] = { "EVAL", script, "1", NULL, l->token, arg };
	redisReply *rep;
	int rc;

	rep = lease_call(r, l->kind, l->key, arg ? 6 : 5, argv, 3, &rc);
	if (!rep)
		return rc;
	rc = rep->type == REDIS_REPLY_INTEGER && rep->integer > 0 ? 1 : 0;
	freeReplyObject(rep);
	return rc;
}

int ap_redis_lease_renew(ap_redis *r, const ap_redis_lease *l, unsigned ttl_ms)
{
	char ttl[24];

	if (!ttl_ms)
		return AP_EINVAL;
	snprintf(ttl, sizeof(ttl), "%u", ttl_ms);
	return lease_script(r, l, renew_script, ttl);
}

int ap_redis_lease_release(ap_redis *r, const ap_redis_lease *l)
{
	return lease_script(r, l, release_script, NULL);
}

void ap_redis_get_counts(ap_redis *r, ap_redis_counts *out)
{
	memset(out, 0, sizeof(*out));
	if (!r)
		return;
	pthread_mutex_lock(&r->mu);
	*out = r->n;
	out->state = r->state;
	pthread_mutex_unlock(&r->mu);
}
