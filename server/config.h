/* config.h -- apollod's configuration and its log.
 *
 * The configuration is one table (config.c: name, type, default, limits,
 * help) and everything else is driven by it: the `key = value` file parser,
 * the command-line flags (`--max-frame-bytes N` for key max_frame_bytes),
 * `--help`, and `--print-config`, whose output is committed as
 * deploy/apollod.conf.  Precedence, lowest first: the table's defaults, the
 * file named by --config, the environment (APOLLO_SOCKET for `socket`), the
 * other flags.
 *
 * The log goes to stderr, one line per event, with a level
 * (error < warn < info < debug) set once at start-up from `log_level`.
 */
#ifndef AP_CONFIG_H
#define AP_CONFIG_H

#include <stdio.h>

#include "../common/base.h"

typedef enum ap_log_level {
	AP_LOG_ERROR = 0,
	AP_LOG_WARN = 1,
	AP_LOG_INFO = 2,
	AP_LOG_DEBUG = 3,
} ap_log_level;

/* Every setting of apollod.  Strings are fixed-size so a config needs no
 * freeing; the table gives each one's meaning and limits. */
typedef struct ap_config {
	char socket[108];          /* Unix socket path; "" = ap_default_socket_path() */
	char cache[1024];          /* SQLite file; "" = default path, "off" = no cache */
	char tcp[256];             /* "HOST:PORT" or "" (no TCP listener) */
	char tcp_token[256];       /* required from TCP clients in Hello */
	char tcp_token_file[1024]; /* where tcp_token is read from (a private file) */
	long long socket_mode;     /* permission bits of the Unix socket file */
	long long workers;         /* worker threads; 0 = one per CPU */
	long long max_frame_bytes; /* largest accepted frame payload, bytes */
	long long max_clients;     /* simultaneous connections */
	long long max_clients_per_user; /* Unix connections of one peer uid; 0 = max_clients / 4 */
	long long admin_uid;       /* besides root, may use admin_clients; -1 = none */
	long long admin_clients;   /* connections root / admin_uid may open beyond max_clients */
	long long max_pending;     /* compile requests queued or running */
	long long max_unauth_clients;   /* TCP connections not yet authenticated */
	long long max_unauth_frame_bytes; /* largest frame before authentication */
	long long auth_timeout_ms; /* TCP: time to authenticate */
	long long idle_timeout_ms; /* a connection with nothing to do; 0 = never */
	long long frame_timeout_ms;/* a frame from its first byte to its last */
	long long send_timeout_ms; /* queued replies without progress */
	long long max_reply_queue_bytes; /* memory of one client's unread replies */
	long long decode_memory_ratio;   /* decoded request <= ratio x frame + 4 MiB */
	long long max_compile_memory;    /* one request's compile estimate, bytes */
	long long max_pending_memory;    /* requests queued or running, all together */
	long long log_level;       /* ap_log_level */
	int foreground;            /* 0: detach (fork, setsid) once listening */
	/* issue 10: the local cache's limits, single-flight, the shared
	 * cache in Redis, metrics */
	long long cache_max_bytes; /* blob bytes in the SQLite file; 0 = no limit */
	long long cache_memory_bytes; /* verified blobs kept in memory */
	long long flight_wait_ms;  /* wait for an identical request's compile */
	long long tune_budget_evals;  /* issue 26: search budget per request, in
				      cost-model evaluations; 0 = no search */
	long long tune_budget_ms;  /* safety limit on a request's search time; 0 = none */
	int tune_refine;           /* background tuner: ptxas -v refinement */
	int tune_measure;          /* background tuner: timing on this host's GPU */
	long long tune_device;     /* its CUDA ordinal */
	long long tune_nice;       /* the tuner thread's nice value, 0..19 */
	char tune_reporters[256];  /* "any", "none", or uids and "tcp" (compile.h) */
	char redis[256];           /* "HOST:PORT", "unix:PATH" or ""; see redis.h */
	char redis_secret_file[1024];   /* the cluster secret (HMAC key) */
	char redis_password_file[1024]; /* Redis AUTH password, "" = none */
	char redis_namespace[64];  /* first part of every key */
	long long redis_ttl_s;     /* expiry of written entries; 0 = none */
	long long redis_connect_timeout_ms;
	long long redis_timeout_ms;     /* one command */
	long long redis_breaker_failures; /* failures in a row that open the breaker */
	long long redis_breaker_open_ms;  /* how long it stays open */
	long long redis_max_value_bytes;  /* largest entry read or written */
	long long redis_lease_ms;  /* a cold request's cluster lease; 0 = none */
	char metrics[256];         /* Prometheus endpoint "[HOST:]PORT" or "" */
} ap_config;

typedef enum ap_config_type {
	AP_CFG_STRING,   /* any text; surrounding double quotes are removed */
	AP_CFG_INT,      /* decimal, 0x hex or 0 octal integer within [min, max] */
	AP_CFG_SIZE,     /* integer with an optional K/M/G suffix (powers of 1024) */
	AP_CFG_BOOL,     /* true/false, yes/no, on/off, 1/0 */
	AP_CFG_ENUM,     /* one of `choices`; stored as its index */
} ap_config_type;

typedef struct ap_config_option {
	const char *name;          /* file key; the flag is --name with '_' -> '-' */
	ap_config_type type;
	size_t offset;             /* into ap_config */
	size_t size;               /* AP_CFG_STRING: capacity including the NUL */
	const char *dflt;          /* default, as text (parsed like any value) */
	long long min, max;        /* AP_CFG_INT / AP_CFG_SIZE limits */
	const char *const *choices;/* AP_CFG_ENUM: NULL-terminated names */
	const char *help;
} ap_config_option;

/* Whether option `o` holds a secret (tcp_token): its value given as a flag
 * is scrubbed from argv, and a config file that sets it must not be
 * readable by others. */
bool ap_config_is_secret(const ap_config_option *o);

/* The table, `*n` entries, in the order --help and --print-config list them. */
const ap_config_option *ap_config_table(int *n);
/* The option named `name` (file spelling, or flag spelling with dashes). */
const ap_config_option *ap_config_find(const char *name);

/* Fills `cfg` with every option's default. */
void ap_config_defaults(ap_config *cfg);

/* Sets one option from its textual value.  Returns 0, or AP_EINVAL with
 * `err` saying what is wrong (unknown key, not a number, out of range,
 * too long, not one of the choices). */
int ap_config_set(ap_config *cfg, const char *key, const char *value, ap_error *err);

/* Parses config-file text: `key = value` lines, blank lines, and `#`
 * comments (a whole line, or after whitespace at the end of a line).
 * `origin` names the text in messages ("apollod.conf").  Stops at the
 * first bad line: AP_EINVAL with err->msg "ORIGIN:LINE: what".  */
int ap_config_parse_text(ap_config *cfg, const char *text, const char *origin, ap_error *err);
/* Reads and parses the file at `path` (at most 1 MiB) after checking it by
 * ap_trust_fd's rule (common/trust.h); a file that sets a secret option
 * (tcp_token) must also be unreadable by others.  AP_EIO when it cannot be
 * read or is not trusted (the message names the path and why), else as
 * ap_config_parse_text. */
int ap_config_parse_file(ap_config *cfg, const char *path, ap_error *err);

typedef enum ap_config_action {
	AP_CONFIG_RUN,          /* start the daemon */
	AP_CONFIG_HELP,         /* --help / -h */
	AP_CONFIG_VERSION,      /* --version */
	AP_CONFIG_PRINT,        /* --print-config */
} ap_config_action;

/* Applies the command line to `cfg` (which should hold the defaults):
 * first the file of --config PATH (if any), then $APOLLO_SOCKET, then every
 * other flag in order, then the secrets read from files (tcp_token_file).
 * Flags: --KEY VALUE, --KEY=VALUE, and for booleans --KEY / --no-KEY.
 * The value of a secret given as a flag (--tcp-token) is accepted with a
 * warning and overwritten in `argv` with '*' so that /proc/PID/cmdline and
 * ps no longer show it (the file form is the safe one).  The config file
 * and the token file must pass ap_trust_path's rule (common/trust.h: owned
 * by this user or root, not writable by others, in directories only they
 * control; the token file, and a config file that sets tcp_token, not
 * readable by others).  Returns 0 with *action set, or AP_EINVAL / AP_EIO
 * with `err` naming the bad argument, file line or untrusted file. */
int ap_config_parse_args(ap_config *cfg, int argc, char **argv,
			 ap_config_action *action, ap_error *err);

/* Writes the commented default configuration (deploy/apollod.conf). */
void ap_config_print_defaults(FILE *f);
/* Writes the --help text. */
void ap_config_print_usage(FILE *f, const char *argv0);
/* Writes the effective value of every option as `key = value` lines. */
void ap_config_print(FILE *f, const ap_config *cfg);

/* ---- log --------------------------------------------------------------- */

/* Sets the level below which ap_log drops messages (default AP_LOG_INFO). */
void ap_log_set_level(ap_log_level level);
ap_log_level ap_log_get_level(void);
/* Writes "apollod[PID] LEVEL: message\n" to stderr in one write, when
 * `level` is at or above the set level.  Safe from any thread. */
void ap_log(ap_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
