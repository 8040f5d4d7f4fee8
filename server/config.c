/* config.c -- the configuration table and everything it drives (see
 * config.h): defaults, the `key = value` file parser, command-line flags,
 * --help, --print-config; and the stderr log.
 *
 * Approach: one static, read-only table of options.  A value is always set
 * through ap_config_set() from text, whether it comes from the table's
 * default, a file line or a flag, so the three can never disagree about
 * syntax or limits.  --print-config writes the defaults as a commented
 * file; deploy/apollod.conf is that output, and tests/check_config.c checks
 * that the two match.
 */
#include "config.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/trust.h"

static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };

#define STR(field) AP_CFG_STRING, offsetof(ap_config, field), sizeof(((ap_config *)0)->field)
#define NUM(type, field) type, offsetof(ap_config, field), 0

static const ap_config_option options[] = {
	{ "socket", STR(socket), "", 0, 0, NULL,
	  "Unix socket the daemon listens on.  Empty: $APOLLO_SOCKET when set, "
	  "else $XDG_RUNTIME_DIR/apollod.sock, else /tmp/apollod-<uid>/apollod.sock "
	  "(a private directory, created mode 0700).  The socket's directory must "
	  "belong to this user or root and not be writable by others unless sticky; "
	  "apollod refuses to start otherwise.  A stale socket file is removed at "
	  "start; when a live daemon answers on it, apollod refuses to start." },
	{ "socket_mode", NUM(AP_CFG_INT, socket_mode), "0600", 0, 0777, NULL,
	  "Permission bits of the socket file (octal with a leading 0).  0660 lets "
	  "the socket's group connect." },
	{ "tcp", STR(tcp), "", 0, 0, NULL,
	  "Also listen on TCP at HOST:PORT, e.g. 0.0.0.0:7070 or [::1]:7070.  Empty: "
	  "no TCP listener.  Needs tcp_token." },
	{ "tcp_token", STR(tcp_token), "", 0, 0, NULL,
	  "Secret shared with TCP clients.  Client and daemon each prove they know "
	  "it (HMAC-SHA256 over fresh nonces) before anything else is served; it is "
	  "never sent.  Use a long random value (openssl rand -hex 32): a recorded "
	  "handshake allows guessing a short one offline.  Prefer tcp_token_file: "
	  "a value given as --tcp-token is visible to every local user until apollod "
	  "scrubs it from its command line (it warns), and a config file that sets it "
	  "must not be readable by others." },
	{ "tcp_token_file", STR(tcp_token_file), "", 0, 0, NULL,
	  "File holding tcp_token (one line; a final newline is dropped).  It must "
	  "belong to this user or root, be readable by nobody else (chmod 600) and sit "
	  "in directories only they can write; apollod refuses to start otherwise.  "
	  "Not together with tcp_token." },
	{ "cache", STR(cache), "", 0, 0, NULL,
	  "SQLite cache file (created with its directories).  Empty: "
	  "$XDG_CACHE_HOME/apollo/cache.db, else ~/.cache/apollo/cache.db.  \"off\": "
	  "no cache.  A cache that cannot be opened only disables caching; a file that "
	  "is not a database (garbage, truncated, corrupt) is moved aside as "
	  "PATH.corrupt-TIME and replaced by a new cache." },
	{ "workers", NUM(AP_CFG_INT, workers), "0", 0, 256, NULL,
	  "Worker threads that run compile jobs (also the NVRTC / cc processes one "
	  "request runs in parallel).  0: one per CPU." },
	{ "max_frame_bytes", NUM(AP_CFG_SIZE, max_frame_bytes), "64M", 1024, 1LL << 30, NULL,
	  "Largest frame payload accepted, bytes.  A longer length prefix is "
	  "answered with ERR_TOO_LARGE and the connection is closed, before "
	  "anything is allocated." },
	{ "max_clients", NUM(AP_CFG_INT, max_clients), "256", 1, 65536, NULL,
	  "Connections served at once (Unix, and TCP once authenticated); one more "
	  "is answered ERR_BUSY and closed." },
	{ "max_clients_per_user", NUM(AP_CFG_INT, max_clients_per_user), "0", 0, 65536, NULL,
	  "Unix connections of one user (the peer's uid) at once, so that one user "
	  "cannot take every slot; one more is answered ERR_BUSY and closed.  0: a "
	  "quarter of max_clients (at least 1).  When the daemon is full and "
	  "another user connects, the least recently active idle connection (no "
	  "request running, nothing queued, no frame half read) of the user holding "
	  "the most connections is closed to make room, if that user holds at least "
	  "two more than the newcomer; authenticated TCP clients count as one user "
	  "here." },
	{ "admin_uid", NUM(AP_CFG_INT, admin_uid), "-1", -1, 4294967294LL, NULL,
	  "A uid that, like root, always finds a connection: when max_clients are "
	  "taken and none of them is idle, root and this uid may still open "
	  "admin_clients more (within max_clients_per_user).  -1: root only." },
	{ "admin_clients", NUM(AP_CFG_INT, admin_clients), "8", 0, 1024, NULL,
	  "Connections reserved for root and admin_uid beyond max_clients: they are "
	  "admitted while fewer than max_clients + admin_clients are open, so that "
	  "other users keeping every slot busy cannot lock the administrator out." },
	{ "max_pending", NUM(AP_CFG_INT, max_pending), "1024", 1, 1000000, NULL,
	  "Compile requests queued or running at once; more are answered ERR_BUSY." },
	{ "max_unauth_clients", NUM(AP_CFG_INT, max_unauth_clients), "16", 1, 65536, NULL,
	  "TCP connections that have not authenticated yet, at once: a budget of "
	  "their own, apart from max_clients, so that unauthenticated clients cannot "
	  "lock anyone out.  One more is answered ERR_BUSY and closed." },
	{ "max_unauth_frame_bytes", NUM(AP_CFG_SIZE, max_unauth_frame_bytes), "4K", 256,
	  1LL << 20, NULL,
	  "Largest frame payload accepted from a TCP client before it has "
	  "authenticated (a Hello is about 100 bytes).  A longer length prefix is "
	  "answered ERR_TOO_LARGE and the connection is closed." },
	{ "auth_timeout_ms", NUM(AP_CFG_INT, auth_timeout_ms), "10000", 10, 3600000, NULL,
	  "Milliseconds a TCP client has, from connecting, to complete the token "
	  "handshake; then it is disconnected.  A frame that does not decode also "
	  "ends an unauthenticated connection." },
	{ "idle_timeout_ms", NUM(AP_CFG_INT, idle_timeout_ms), "600000", 0, 86400000LL, NULL,
	  "Milliseconds a connection may stay open with nothing to do (no frame "
	  "arriving, no request running, no reply queued) before it is closed.  "
	  "libapollo-client reconnects by itself.  0: never." },
	{ "frame_timeout_ms", NUM(AP_CFG_INT, frame_timeout_ms), "60000", 10, 3600000, NULL,
	  "Milliseconds from the first byte of a frame to its last (slow-loris "
	  "clients); a frame not complete by then is answered ERR_BAD_FRAME and "
	  "the connection is closed.  64 MiB in 60 s needs about 1.1 MB/s." },
	{ "send_timeout_ms", NUM(AP_CFG_INT, send_timeout_ms), "60000", 10, 3600000, NULL,
	  "Milliseconds a client may leave its replies unread (no write progress) "
	  "before it is disconnected." },
	{ "max_reply_queue_bytes", NUM(AP_CFG_SIZE, max_reply_queue_bytes), "64M", 64LL << 10,
	  4LL << 30, NULL,
	  "Memory one client's unread replies may take, counting what each queued "
	  "reply really costs (payload, header, bookkeeping).  Above it the daemon "
	  "stops reading that client's requests until the queue is down to a "
	  "quarter; a client whose queue grows past twice this is disconnected." },
	{ "decode_memory_ratio", NUM(AP_CFG_INT, decode_memory_ratio), "16", 1, 1024, NULL,
	  "A request may take at most this many times its frame size, plus 4 MiB, "
	  "once decoded (a Graph's tensors and nodes cost more in memory than on "
	  "the wire: real graphs 2-10x, crafted ones 50x and more).  Decoding "
	  "stops and the request is answered ERR_TOO_LARGE when it would need "
	  "more." },
	{ "max_compile_memory", NUM(AP_CFG_SIZE, max_compile_memory), "1G", 1LL << 20, 1LL << 40,
	  NULL,
	  "Largest memory one compile request may be estimated to take, bytes.  The "
	  "estimate is made from the graph before it is queued (per node 16 KiB, "
	  "64 KiB for MatMul / Gemm / Conv, 192 KiB for compound ops such as "
	  "LayerNormalization; 1 KiB per tensor; twice the constant data: the "
	  "compiler's measured peak at its worst shape), and a request above it is "
	  "answered ERR_TOO_LARGE naming the estimate and this limit.  1G admits "
	  "about 60,000 elementwise nodes." },
	{ "max_pending_memory", NUM(AP_CFG_SIZE, max_pending_memory), "2G", 1LL << 20, 1LL << 42,
	  NULL,
	  "Memory all requests queued or running may hold together, bytes: each "
	  "counts its decoded size plus its compile estimate (a large frame waiting "
	  "to be decoded counts 4x its length until then).  One user (uid; TCP "
	  "clients together) may hold half of it, or max_compile_memory if that is "
	  "more.  A request that would pass either is answered ERR_BUSY naming the "
	  "limit, and the client may try again later." },
	{ "log_level", NUM(AP_CFG_ENUM, log_level), "info", 0, 0, log_levels,
	  "Least severe messages written to stderr." },
	{ "foreground", NUM(AP_CFG_BOOL, foreground), "true", 0, 0, NULL,
	  "Stay in the foreground.  false (--no-foreground): detach once the "
	  "socket is listening, so that the starting command returns when the "
	  "daemon is ready." },
	{ "cache_max_bytes", NUM(AP_CFG_SIZE, cache_max_bytes), "8G", 0, 1LL << 40, NULL,
	  "Largest size of the blobs (bundles and kernels) in the cache file, bytes.  "
	  "Past it the least recently used blobs are deleted, with the entries that "
	  "name them, down to 90% of it.  0: no limit." },
	{ "cache_memory_bytes", NUM(AP_CFG_SIZE, cache_memory_bytes), "64M", 0, 1LL << 36, NULL,
	  "Blobs read from the cache file and verified are kept in memory up to this "
	  "many bytes (least recently used out), so that a warm request neither reads "
	  "nor hashes them again.  0: none." },
	{ "flight_wait_ms", NUM(AP_CFG_INT, flight_wait_ms), "600000", 0, 86400000LL, NULL,
	  "Single-flight: a request identical to one being compiled (same cache key) "
	  "waits for that compile and is answered from it, for at most this many "
	  "milliseconds from its own arrival; then it compiles by itself.  The same "
	  "holds for one kernel needed by two requests.  0: never wait." },
	{ "tune_budget_evals", NUM(AP_CFG_INT, tune_budget_evals), "65536", 0, 1LL << 30, NULL,
	  "Tuning: the cost-model evaluations one compile request may spend searching "
	  "its kernels' configurations (tiles, stages, block sizes), all its kernels "
	  "together: each micro-graph gets an equal share (at most 2048), so that a "
	  "graph gives the same bundle on a loaded machine as on an idle one.  Results "
	  "are kept as tuning records in the cache and reused by every graph holding "
	  "the same kernel; measured records win over modelled ones.  0: no search "
	  "(records are still used)." },
	{ "tune_budget_ms", NUM(AP_CFG_INT, tune_budget_ms), "5000", 0, 600000LL, NULL,
	  "Tuning: a safety limit on the time one compile request spends searching, "
	  "all its kernels together.  Only an overloaded machine should reach it: a "
	  "search it cuts short is logged, counted (Stats.tune_capped) and not kept "
	  "as a record, and the bundle is not cached.  0: no limit." },
	{ "tune_refine", NUM(AP_CFG_BOOL, tune_refine), "true", 0, 0, NULL,
	  "Background tuning: after a compile for a GPU target that searched kernels, "
	  "a thread at the lowest priority compiles each such kernel's candidates "
	  "with ptxas -v and prices them again with the registers, shared memory "
	  "and spills ptxas reports (occupancy from the real register count); a "
	  "kernel's record moves to a candidate that is 3% faster or does not spill "
	  "where the choice does, and later compiles build it.  false: records stay "
	  "as the search left them." },
	{ "tune_measure", NUM(AP_CFG_BOOL, tune_measure), "true", 0, 0, NULL,
	  "Background tuning on this host's GPU: when a CUDA driver (libcuda.so.1, "
	  "or $APOLLO_LIBCUDA) and device tune_device load, the candidates of the "
	  "kernels a compile searched are also timed there (3 warm-up runs, median "
	  "of 20) and the fastest of each kernel stored as a measured record for "
	  "this device, as apollo-client tune does from a client.  Without a driver "
	  "or device nothing is timed." },
	{ "tune_device", NUM(AP_CFG_INT, tune_device), "0", 0, 1023, NULL,
	  "CUDA device ordinal tune_measure times on." },
	{ "tune_nice", NUM(AP_CFG_INT, tune_nice), "19", 0, 19, NULL,
	  "Background tuning: the nice value of the tuner's thread and of the ptxas "
	  "it runs.  19 (the lowest priority) keeps it out of the way of requests "
	  "and of other work on the host; a node that exists to compile may give it "
	  "more (0: the same priority as the requests' threads).  On a host kept "
	  "busy at normal priority a tuner at 19 makes almost no progress." },
	{ "tune_reporters", STR(tune_reporters), "any", 0, 0, NULL,
	  "Who may send tuning reports (apollo-client tune): \"any\", \"none\", or a "
	  "comma-separated list of uids and the word tcp (every authenticated TCP "
	  "client).  Whoever reports, a measured record applies only to the device "
	  "reported, and only once two clients (or the daemon's own tuner) agree." },
	{ "redis", STR(redis), "", 0, 0, NULL,
	  "Shared cache (L2) in Redis, looked up after the local cache and before "
	  "compiling, and written with every new entry: HOST:PORT, [IPv6]:PORT, or "
	  "unix:PATH.  Several daemons pointed at one Redis share what each compiles "
	  "(Redis Cluster: through a proxy that routes single-key commands).  Needs "
	  "redis_secret_file.  Empty: no shared cache." },
	{ "redis_secret_file", STR(redis_secret_file), "", 0, 0, NULL,
	  "File holding the cluster secret (at least 16 bytes, the same on every "
	  "daemon of the cluster; a trailing newline is ignored).  Every entry "
	  "written to Redis is signed with HMAC-SHA256 under it and verified on every "
	  "read: an entry that fails is a miss, logged, never served.  The file must "
	  "not be readable by others (chmod 600)." },
	{ "redis_password_file", STR(redis_password_file), "", 0, 0, NULL,
	  "File holding the password sent with AUTH after connecting (Redis "
	  "requirepass); a trailing newline is ignored.  Empty: no AUTH." },
	{ "redis_namespace", STR(redis_namespace), "apollo", 0, 0, NULL,
	  "First part of every Redis key (NAMESPACE:s<schema>.<format>:K:<key>, K "
	  "a for answers, k kernels, b blobs, t tuning records; leases "
	  "NAMESPACE:s<schema>.<format>:lease:a:<key>): "
	  "daemons share entries only within one namespace; a new one starts an "
	  "empty shared cache." },
	{ "redis_ttl_s", NUM(AP_CFG_INT, redis_ttl_s), "604800", 0, 315360000LL, NULL,
	  "Seconds an entry written to Redis lives (SET ... EX).  0: no expiry (let "
	  "Redis's maxmemory policy evict)." },
	{ "redis_connect_timeout_ms", NUM(AP_CFG_INT, redis_connect_timeout_ms), "200", 1, 60000,
	  NULL, "Milliseconds to connect to Redis before the attempt counts as a failure." },
	{ "redis_timeout_ms", NUM(AP_CFG_INT, redis_timeout_ms), "500", 1, 60000, NULL,
	  "Milliseconds one Redis command may take (sending the request, reading the "
	  "reply) before it counts as a failure and the connection is dropped." },
	{ "redis_breaker_failures", NUM(AP_CFG_INT, redis_breaker_failures), "3", 1, 1000, NULL,
	  "Redis failures in a row that open the circuit breaker: while it is open "
	  "nothing is sent to Redis (requests go on from the local cache or by "
	  "compiling, with no Redis delay)." },
	{ "redis_breaker_open_ms", NUM(AP_CFG_INT, redis_breaker_open_ms), "5000", 10, 3600000,
	  NULL, "Milliseconds the breaker stays open; then one request tries Redis again "
	  "(half-open): success closes the breaker, failure opens it again." },
	{ "redis_max_value_bytes", NUM(AP_CFG_SIZE, redis_max_value_bytes), "64M", 1024,
	  1LL << 30, NULL,
	  "Largest entry written to or read from Redis, bytes.  A larger reply is "
	  "refused as it arrives (before it is all buffered) and counts as a miss; so "
	  "is any reply whose parts together pass this + 64 KiB, or 1024 elements." },
	{ "redis_lease_ms", NUM(AP_CFG_INT, redis_lease_ms), "5000", 0, 3600000, NULL,
	  "One compile per cold graph across the cluster: before compiling a request "
	  "that missed both caches, a daemon takes the graph's lease in Redis for this "
	  "many milliseconds, renewed every third of it while it compiles and "
	  "released once its entry is stored.  A daemon finding the lease held waits "
	  "for that entry instead (at most flight_wait_ms from the request's arrival), "
	  "and takes the lease over if its holder dies and the lease lapses.  Without "
	  "Redis each daemon compiles alone.  0: no leases (every daemon compiles what "
	  "it misses)." },
	{ "metrics", STR(metrics), "", 0, 0, NULL,
	  "Prometheus metrics over HTTP at [HOST:]PORT (GET /metrics); a bare PORT "
	  "or :PORT listens on 127.0.0.1 only.  Empty: no metrics endpoint.  The "
	  "numbers are also in `apollo-client stats --json`." },
};

#define N_OPTIONS ((int)(sizeof(options) / sizeof(options[0])))

const ap_config_option *ap_config_table(int *n)
{
	if (n)
		*n = N_OPTIONS;
	return options;
}

/* Compares a key with an option name, treating '-' as '_'. */
static bool key_equal(const char *key, const char *name)
{
	for (; *key && *name; key++, name++) {
		char k = *key == '-' ? '_' : *key;
		if (k != *name)
			return false;
	}
	return *key == '\0' && *name == '\0';
}

const ap_config_option *ap_config_find(const char *name)
{
	for (int i = 0; i < N_OPTIONS; i++)
		if (key_equal(name, options[i].name))
			return &options[i];
	return NULL;
}

void ap_config_defaults(ap_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	for (int i = 0; i < N_OPTIONS; i++) {
		int rc = ap_config_set(cfg, options[i].name, options[i].dflt, NULL);
		(void)rc;
	}
}

static int parse_int(const ap_config_option *o, const char *v, long long *out, ap_error *err)
{
	char *end;
	long long x;

	errno = 0;
	x = strtoll(v, &end, o->type == AP_CFG_SIZE ? 10 : 0);
	if (end == v || errno)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "%s: '%s' is not %s",
				    o->name, v, o->type == AP_CFG_SIZE ? "a size" : "an integer");
	if (o->type == AP_CFG_SIZE && *end) {
		long long mul = 0;
		switch (toupper((unsigned char)*end)) {
		case 'K': mul = 1LL << 10; break;
		case 'M': mul = 1LL << 20; break;
		case 'G': mul = 1LL << 30; break;
		}
		if (mul) {
			end++;
			if (toupper((unsigned char)*end) == 'I')
				end++;
			if (toupper((unsigned char)*end) == 'B')
				end++;
			if (x > LLONG_MAX / mul || x < LLONG_MIN / mul)
				return ap_error_set(err, AP_EINVAL, NULL, NULL, "%s: '%s' is too large",
						    o->name, v);
			x *= mul;
		}
	}
	if (*end)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "%s: '%s' is not %s", o->name, v,
				    o->type == AP_CFG_SIZE ? "a size (digits, then K, M or G)"
							   : "an integer");
	if (x < o->min || x > o->max)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "%s: %s is out of range %lld..%lld",
				    o->name, v, o->min, o->max);
	*out = x;
	return 0;
}

static int parse_bool(const char *v, int *out)
{
	static const char *const yes[] = { "true", "yes", "on", "1" };
	static const char *const no[] = { "false", "no", "off", "0" };

	for (int i = 0; i < 4; i++) {
		if (!strcasecmp(v, yes[i])) {
			*out = 1;
			return 0;
		}
		if (!strcasecmp(v, no[i])) {
			*out = 0;
			return 0;
		}
	}
	return -1;
}

int ap_config_set(ap_config *cfg, const char *key, const char *value, ap_error *err)
{
	const ap_config_option *o = ap_config_find(key);
	char *field;

	if (!o)
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "unknown setting '%s'", key);
	field = (char *)cfg + o->offset;
	switch (o->type) {
	case AP_CFG_STRING: {
		size_t n = strlen(value);
		if (n >= 2 && value[0] == '"' && value[n - 1] == '"') {
			value++;
			n -= 2;
		}
		if (n >= o->size)
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "%s: value is %zu bytes, at most %zu allowed",
					    o->name, n, o->size - 1);
		memcpy(field, value, n);
		field[n] = '\0';
		return 0;
	}
	case AP_CFG_INT:
	case AP_CFG_SIZE: {
		long long x = 0;
		int rc = parse_int(o, value, &x, err);
		if (rc)
			return rc;
		memcpy(field, &x, sizeof(x));
		return 0;
	}
	case AP_CFG_BOOL: {
		int b;
		if (parse_bool(value, &b))
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "%s: '%s' is not a boolean (true or false)", o->name, value);
		memcpy(field, &b, sizeof(b));
		return 0;
	}
	case AP_CFG_ENUM:
		for (long long i = 0; o->choices[i]; i++) {
			if (!strcasecmp(value, o->choices[i])) {
				memcpy(field, &i, sizeof(i));
				return 0;
			}
		}
		return ap_error_set(err, AP_EINVAL, NULL, NULL, "%s: '%s' is not one of the choices",
				    o->name, value);
	}
	return ap_error_set(err, AP_EINTERNAL, NULL, NULL, "%s: bad option type", o->name);
}

/* Trims spaces at both ends in place; returns the new start. */
static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

/* Cuts a comment: '#' at the start or after whitespace, outside quotes. */
static void cut_comment(char *s)
{
	bool quoted = false;

	for (char *p = s; *p; p++) {
		if (*p == '"')
			quoted = !quoted;
		else if (*p == '#' && !quoted && (p == s || isspace((unsigned char)p[-1]))) {
			*p = '\0';
			return;
		}
	}
}

int ap_config_parse_text(ap_config *cfg, const char *text, const char *origin, ap_error *err)
{
	char line[2048];
	const char *p = text;
	int lineno = 0;

	while (*p) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) : strlen(p);
		char *s, *eq, *key, *val;
		ap_error e;
		int rc;

		lineno++;
		if (n >= sizeof(line))
			return ap_error_set(err, AP_EINVAL, NULL, NULL, "%s:%d: line longer than %zu bytes",
					    origin, lineno, sizeof(line) - 1);
		memcpy(line, p, n);
		line[n] = '\0';
		p += n + (nl ? 1 : 0);
		cut_comment(line);
		s = trim(line);
		if (!*s)
			continue;
		eq = strchr(s, '=');
		if (!eq)
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "%s:%d: expected `key = value`, got '%s'", origin, lineno, s);
		*eq = '\0';
		key = trim(s);
		val = trim(eq + 1);
		if (!*key)
			return ap_error_set(err, AP_EINVAL, NULL, NULL, "%s:%d: missing key before '='",
					    origin, lineno);
		rc = ap_config_set(cfg, key, val, &e);
		if (rc)
			return ap_error_set(err, rc, NULL, NULL, "%s:%d: %s", origin, lineno, e.msg);
	}
	return 0;
}

bool ap_config_is_secret(const ap_config_option *o)
{
	return !strcmp(o->name, "tcp_token");
}

/* Whether a secret option of `cfg` differs from `before` (set by a file). */
static bool secret_changed(const ap_config *before, const ap_config *cfg)
{
	for (int i = 0; i < N_OPTIONS; i++) {
		const ap_config_option *o = &options[i];

		if (ap_config_is_secret(o) && memcmp((const char *)before + o->offset,
					(const char *)cfg + o->offset, o->size))
			return true;
	}
	return false;
}

int ap_config_parse_file(ap_config *cfg, const char *path, ap_error *err)
{
	ap_config *before = malloc(sizeof(*before));
	struct stat st;
	FILE *f;
	char *buf;
	size_t n;
	int rc, fd;

	if (!before)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory reading %s", path);
	fd = ap_trust_open(path, "config file", 0, err);
	if (fd < 0) {
		free(before);
		return fd;
	}
	if (fstat(fd, &st) || !(f = fdopen(fd, "rb"))) {
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "cannot read config file %s: %s", path,
				  strerror(errno));
		close(fd);
		free(before);
		return rc;
	}
	buf = malloc((1 << 20) + 1);
	if (!buf) {
		fclose(f);
		free(before);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory reading %s", path);
	}
	n = fread(buf, 1, 1 << 20, f);
	if (ferror(f) || (n == (1 << 20) && fgetc(f) != EOF)) {
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "cannot read config file %s (%s)", path,
				  ferror(f) ? strerror(errno) : "larger than 1 MiB");
		fclose(f);
		free(buf);
		free(before);
		return rc;
	}
	fclose(f);
	buf[n] = '\0';
	memcpy(before, cfg, sizeof(*cfg));
	if (memchr(buf, '\0', n))
		rc = ap_error_set(err, AP_EINVAL, NULL, NULL, "%s: not a text file (NUL byte)", path);
	else
		rc = ap_config_parse_text(cfg, buf, path, err);
	if (!rc && (st.st_mode & S_IROTH) && secret_changed(before, cfg))
		rc = ap_error_set(err, AP_EIO, NULL, NULL,
				  "config file %s (mode %04o) sets tcp_token and is readable by "
				  "others: make it private (chmod 600), or use tcp_token_file", path,
				  (unsigned)(st.st_mode & 07777));
	free(buf);
	free(before);
	return rc;
}

/* Reads tcp_token from tcp_token_file (a private file, ap_trust_open's
 * rule with AP_TRUST_SECRET).  0, or AP_EINVAL / AP_EIO with `err`. */
static int read_token_file(ap_config *cfg, ap_error *err)
{
	char buf[sizeof(cfg->tcp_token) + 1];
	ssize_t n;
	int fd;

	if (!cfg->tcp_token_file[0])
		return 0;
	if (cfg->tcp_token[0])
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "tcp_token and tcp_token_file are both set: keep only the file");
	fd = ap_trust_open(cfg->tcp_token_file, "token file", AP_TRUST_SECRET, err);
	if (fd < 0)
		return fd;
	n = read(fd, buf, sizeof(buf));
	close(fd);
	if (n < 0)
		return ap_error_set(err, AP_EIO, NULL, NULL, "cannot read token file %s: %s",
				    cfg->tcp_token_file, strerror(errno));
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		n--;
	if (n == 0 || (size_t)n >= sizeof(cfg->tcp_token) || memchr(buf, '\0', (size_t)n) ||
	    memchr(buf, '\n', (size_t)n))
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "token file %s must hold one line of 1 to %zu bytes",
				    cfg->tcp_token_file, sizeof(cfg->tcp_token) - 1);
	memcpy(cfg->tcp_token, buf, (size_t)n);
	cfg->tcp_token[n] = '\0';
	memset(buf, 0, sizeof(buf));
	return 0;
}

int ap_config_parse_args(ap_config *cfg, int argc, char **argv,
			 ap_config_action *action, ap_error *err)
{
	const char *config_path = NULL;
	const char *env;
	int rc;

	*action = AP_CONFIG_RUN;
	/* Pass 1: actions and --config. */
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			*action = AP_CONFIG_HELP;
			return 0;
		}
		if (!strcmp(a, "--version")) {
			*action = AP_CONFIG_VERSION;
			return 0;
		}
		if (!strcmp(a, "--print-config")) {
			*action = AP_CONFIG_PRINT;
			return 0;
		}
		if (!strcmp(a, "--config")) {
			if (i + 1 >= argc)
				return ap_error_set(err, AP_EINVAL, NULL, NULL, "--config needs a PATH");
			config_path = argv[++i];
		} else if (!strncmp(a, "--config=", 9)) {
			config_path = a + 9;
		}
	}
	if (config_path && (rc = ap_config_parse_file(cfg, config_path, err)))
		return rc;
	env = getenv("APOLLO_SOCKET");
	if (env && *env && (rc = ap_config_set(cfg, "socket", env, err)))
		return rc;
	/* Pass 2: every other flag, in order. */
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		char name[64];
		const char *value = NULL, *eq;
		const ap_config_option *o;
		bool negated = false;
		size_t n;
		ap_error e;

		if (!strcmp(a, "--config")) {
			i++;
			continue;
		}
		if (!strncmp(a, "--config=", 9))
			continue;
		if (strncmp(a, "--", 2))
			return ap_error_set(err, AP_EINVAL, NULL, NULL,
					    "unexpected argument '%s' (try --help)", a);
		a += 2;
		eq = strchr(a, '=');
		n = eq ? (size_t)(eq - a) : strlen(a);
		if (n >= sizeof(name))
			return ap_error_set(err, AP_EINVAL, NULL, NULL, "unknown flag '%s'", argv[i]);
		memcpy(name, a, n);
		name[n] = '\0';
		o = ap_config_find(name);
		if (!o && !strncmp(name, "no-", 3)) {
			o = ap_config_find(name + 3);
			if (o && o->type == AP_CFG_BOOL && !eq)
				negated = true;
			else
				o = NULL;
		}
		if (!o)
			return ap_error_set(err, AP_EINVAL, NULL, NULL, "unknown flag '%s' (try --help)",
					    argv[i]);
		if (eq)
			value = eq + 1;
		else if (o->type == AP_CFG_BOOL)
			value = negated ? "false" : "true";
		else if (i + 1 < argc)
			value = argv[++i];
		else
			return ap_error_set(err, AP_EINVAL, NULL, NULL, "flag '%s' needs a value",
					    argv[i]);
		if ((rc = ap_config_set(cfg, o->name, value, &e)))
			return ap_error_set(err, rc, NULL, NULL, "--%s: %s", name, e.msg);
		if (ap_config_is_secret(o) && *value) {
			/* the command line is world-readable: say so, and scrub it */
			ap_log(AP_LOG_WARN, "--%s on the command line is visible to every local user "
			       "until now; use %s_file (a private file) instead", name, o->name);
			memset((char *)value, '*', strlen(value));
		}
	}
	return read_token_file(cfg, err);
}

/* Writes `text` as comment lines "# ..." wrapped before column 78. */
static void print_wrapped(FILE *f, const char *prefix, const char *text)
{
	const size_t width = 78 - strlen(prefix);
	const char *p = text;

	while (*p) {
		const char *end = p, *brk = NULL;
		size_t n;

		while (*end && (size_t)(end - p) < width) {
			if (*end == ' ')
				brk = end;
			end++;
		}
		if (!*end || !brk)
			brk = end;
		n = (size_t)(brk - p);
		while (n > 0 && p[n - 1] == ' ')
			n--;
		fprintf(f, "%s%.*s\n", prefix, (int)n, p);
		p = brk;
		while (*p == ' ')
			p++;
	}
}

/* "64M" for 64 MiB: the largest unit that divides `x`. */
static void format_size(long long x, char *buf, size_t cap)
{
	static const char units[] = "GMK";

	for (int i = 0; i < 3; i++) {
		long long u = 1LL << (10 * (3 - i));
		if (x >= u && x % u == 0) {
			snprintf(buf, cap, "%lld%c", x / u, units[i]);
			return;
		}
	}
	snprintf(buf, cap, "%lld", x);
}

static void describe_type(const ap_config_option *o, char *buf, size_t cap)
{
	char lo[32], hi[32];

	switch (o->type) {
	case AP_CFG_STRING:
		snprintf(buf, cap, "text");
		break;
	case AP_CFG_INT:
		if (o->max == 0777)
			snprintf(buf, cap, "octal permission bits");
		else
			snprintf(buf, cap, "integer, %lld to %lld", o->min, o->max);
		break;
	case AP_CFG_SIZE:
		format_size(o->min, lo, sizeof(lo));
		format_size(o->max, hi, sizeof(hi));
		snprintf(buf, cap, "bytes, suffix K, M or G allowed, %s to %s", lo, hi);
		break;
	case AP_CFG_BOOL:
		snprintf(buf, cap, "true or false");
		break;
	case AP_CFG_ENUM: {
		size_t used = (size_t)snprintf(buf, cap, "one of");
		for (int i = 0; o->choices[i] && used < cap; i++)
			used += (size_t)snprintf(buf + used, cap - used, "%s %s", i ? "," : "",
						 o->choices[i]);
		break;
	}
	}
}

void ap_config_print_defaults(FILE *f)
{
	fprintf(f,
		"# apollod.conf -- configuration of apollod, the Apollo compilation daemon.\n"
		"#\n"
		"# This file is the output of `apollod --print-config`: every setting at its\n"
		"# default.  Syntax: one `key = value` per line; `#` starts a comment.  Use it\n"
		"# with `apollod --config /etc/apollo/apollod.conf`.  A flag on the command\n"
		"# line (`--max-frame-bytes 16M` for max_frame_bytes) overrides the file, and\n"
		"# $APOLLO_SOCKET overrides `socket` from the file.\n");
	for (int i = 0; i < N_OPTIONS; i++) {
		const ap_config_option *o = &options[i];
		char type[128];

		describe_type(o, type, sizeof(type));
		fprintf(f, "\n");
		print_wrapped(f, "# ", o->help);
		fprintf(f, "# (%s)\n", type);
		if (o->type == AP_CFG_STRING)
			fprintf(f, "%s = \"%s\"\n", o->name, o->dflt);
		else
			fprintf(f, "%s = %s\n", o->name, o->dflt);
	}
}

void ap_config_print_usage(FILE *f, const char *argv0)
{
	fprintf(f,
		"usage: %s [--config PATH] [--OPTION VALUE]...\n"
		"\n"
		"apollod, the Apollo compilation daemon: receives graphs on a socket, fuses\n"
		"their operators, compiles the kernels (NVRTC for sm_XX / compute_XX, the\n"
		"host C compiler for cpu) and answers with a bundle.  SIGTERM or SIGINT\n"
		"finishes the requests in flight and exits.\n"
		"\n"
		"  --config PATH         read settings from PATH (`key = value` lines)\n"
		"  --print-config        print the commented default configuration and exit\n"
		"  --help, --version     print this text / the version and exit\n"
		"\n"
		"Options (each is also a config-file key with '_' for '-'):\n",
		argv0);
	for (int i = 0; i < N_OPTIONS; i++) {
		const ap_config_option *o = &options[i];
		char flag[160], dashed[64], type[128];

		snprintf(dashed, sizeof(dashed), "%s", o->name);
		for (char *k = dashed; *k; k++)
			if (*k == '_')
				*k = '-';
		if (o->type == AP_CFG_BOOL)
			snprintf(flag, sizeof(flag), "  --%s, --no-%s", dashed, dashed);
		else
			snprintf(flag, sizeof(flag), "  --%s %s", dashed,
				 o->type == AP_CFG_STRING ? "TEXT" : o->type == AP_CFG_ENUM ? "NAME" : "N");
		describe_type(o, type, sizeof(type));
		fprintf(f, "%s\n", flag);
		print_wrapped(f, "        ", o->help);
		fprintf(f, "        (%s; default %s)\n", type, *o->dflt ? o->dflt : "empty");
	}
}

void ap_config_print(FILE *f, const ap_config *cfg)
{
	for (int i = 0; i < N_OPTIONS; i++) {
		const ap_config_option *o = &options[i];
		const char *field = (const char *)cfg + o->offset;
		long long x;
		int b;

		switch (o->type) {
		case AP_CFG_STRING:
			fprintf(f, "%s = \"%s\"\n", o->name, field);
			break;
		case AP_CFG_INT:
		case AP_CFG_SIZE:
			memcpy(&x, field, sizeof(x));
			fprintf(f, o->max == 0777 ? "%s = 0%llo\n" : "%s = %lld\n", o->name, x);
			break;
		case AP_CFG_BOOL:
			memcpy(&b, field, sizeof(b));
			fprintf(f, "%s = %s\n", o->name, b ? "true" : "false");
			break;
		case AP_CFG_ENUM:
			memcpy(&x, field, sizeof(x));
			fprintf(f, "%s = %s\n", o->name, o->choices[x]);
			break;
		}
	}
}

/* ---- log --------------------------------------------------------------- */

/* The one process-wide setting: written once at start-up, read by every
 * thread, hence atomic. */
static _Atomic int log_level = AP_LOG_INFO;

void ap_log_set_level(ap_log_level level)
{
	atomic_store(&log_level, (int)level);
}

ap_log_level ap_log_get_level(void)
{
	return (ap_log_level)atomic_load(&log_level);
}

void ap_log(ap_log_level level, const char *fmt, ...)
{
	char buf[2048];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	int n, m;

	if ((int)level > atomic_load(&log_level))
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	localtime_r(&ts.tv_sec, &tm);
	n = snprintf(buf, sizeof(buf), "apollod[%d] %04d-%02d-%02d %02d:%02d:%02d.%03ld %s: ",
		     (int)getpid(), tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
		     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
		     log_levels[level <= AP_LOG_DEBUG ? level : AP_LOG_DEBUG]);
	if (n < 0)
		return;
	va_start(ap, fmt);
	m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	n += m;
	if ((size_t)n > sizeof(buf) - 2)
		n = sizeof(buf) - 2;
	buf[n++] = '\n';
	if (write(STDERR_FILENO, buf, (size_t)n) < 0)
		return;
}
