/* main.c -- apollod: configuration, cache, NVRTC, the server loop.
 *
 * Start-up order: the configuration (defaults, --config file,
 * $APOLLO_SOCKET, flags); detaching when foreground is false (the parent
 * waits on a pipe until the child listens, so `apollod --no-foreground`
 * returns once the daemon is ready, with the child's status); the cache's
 * files by common/trust.h's ownership rule (another user's database stops
 * the start: it would be a way to plant code); NVRTC (its
 * absence is a warning: target cpu is still served); the cache (its failure
 * is a warning: requests are then compiled every time; a file that is not a
 * database is moved aside and replaced, see cache.h) with its limits; the
 * shared cache when `redis` is set (a missing or unsafe secret file stops
 * the start; an unreachable Redis is only a warning: it is fail-open); the
 * server (its listeners from systemd when socket-activated, notify.h);
 * READY=1 to systemd once it listens (Type=notify).  Exit
 * status: 0 after a clean SIGTERM / SIGINT, 1 when start-up failed, 2 for a
 * bad command line or config file.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/runtime.h"
#include "common/base.h"
#include "server/backend/backend.h"
#include "server/cache/cache.h"
#include "server/cache/redis.h"
#include "server/compile/compile.h"
#include "server/config.h"
#include "server/net/net.h"
#include "server/notify.h"

/* Forks; the parent waits for one status byte from the child on a pipe and
 * exits with it.  Returns the write end of the pipe in the child, -1 when
 * forking failed. */
static int detach(void)
{
	int fds[2];
	pid_t pid;

	if (pipe(fds))
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid > 0) {
		unsigned char status = 1;
		close(fds[1]);
		if (read(fds[0], &status, 1) != 1)
			status = 1;
		_exit(status);
	}
	close(fds[0]);
	setsid();
	return fds[1];
}

/* The shared cache of `cfg` (NULL in *out when `redis` is empty): reads
 * the secret and password files, creates the client and tries it once
 * (its absence is only a warning: it is optional and fail-open).  0, or
 * AP_EINVAL / AP_EIO / AP_ENOMEM with `err` (start-up must stop). */
static int open_redis(const ap_config *cfg, ap_redis **out, ap_error *err)
{
	ap_redis_options o = { 0 };
	uint8_t *secret = NULL, *password = NULL;
	char *pw = NULL;
	size_t secret_len = 0, password_len = 0;
	ap_error why;
	int rc;

	*out = NULL;
	if (!cfg->redis[0])
		return 0;
	if (!cfg->redis_secret_file[0])
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "redis is set but redis_secret_file is not: entries in the shared "
				    "cache must be signed");
	rc = ap_redis_read_secret_file(cfg->redis_secret_file, true, &secret, &secret_len, err);
	if (!rc && cfg->redis_password_file[0])
		rc = ap_redis_read_secret_file(cfg->redis_password_file, true, &password,
					       &password_len, err);
	if (!rc && password && memchr(password, 0, password_len))
		rc = ap_error_set(err, AP_EINVAL, NULL, NULL, "%s holds a NUL byte",
				  cfg->redis_password_file);
	if (!rc && password && !(pw = calloc(1, password_len + 1)))
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	if (!rc) {
		if (pw)
			memcpy(pw, password, password_len);
		o.addr = cfg->redis;
		o.secret = secret;
		o.secret_len = secret_len;
		o.password = pw;
		o.ns = cfg->redis_namespace;
		o.ttl_s = (unsigned)cfg->redis_ttl_s;
		o.connect_timeout_ms = (unsigned)cfg->redis_connect_timeout_ms;
		o.timeout_ms = (unsigned)cfg->redis_timeout_ms;
		o.breaker_failures = (unsigned)cfg->redis_breaker_failures;
		o.breaker_open_ms = (unsigned)cfg->redis_breaker_open_ms;
		o.max_value_bytes = (size_t)cfg->redis_max_value_bytes;
		rc = ap_redis_new(&o, out, err);
	}
	if (pw) {
		memset(pw, 0, password_len);
		free(pw);
	}
	if (secret) {
		memset(secret, 0, secret_len);
		free(secret);
	}
	if (password) {
		memset(password, 0, password_len);
		free(password);
	}
	if (rc)
		return rc;
	if (ap_redis_ping(*out, &why))
		ap_log(AP_LOG_WARN, "%s; serving without it until it answers", why.msg);
	else
		ap_log(AP_LOG_INFO, "shared cache: redis %s, namespace %s", cfg->redis,
		       cfg->redis_namespace);
	return 0;
}

static void report_ready(int fd, unsigned char status)
{
	if (fd < 0)
		return;
	if (write(fd, &status, 1) != 1)
		ap_log(AP_LOG_WARN, "cannot tell the starting process the status");
	close(fd);
	if (status == 0) {
		int null = open("/dev/null", O_RDWR);
		if (null >= 0) {
			dup2(null, STDIN_FILENO);
			dup2(null, STDOUT_FILENO);
			close(null);
		}
	}
}

int main(int argc, char **argv)
{
	ap_config cfg;
	ap_config_action action;
	ap_compiler_options copt = { 0 };
	ap_cache *cache = NULL;
	ap_redis *redis = NULL;
	ap_compiler *compiler = NULL;
	ap_server *server = NULL;
	ap_error err;
	int ready_fd = -1, rc;
	long cpus;

	ap_config_defaults(&cfg);
	if (ap_config_parse_args(&cfg, argc, argv, &action, &err)) {
		fprintf(stderr, "apollod: %s\n", err.msg);
		return 2;
	}
	switch (action) {
	case AP_CONFIG_HELP:
		ap_config_print_usage(stdout, "apollod");
		return 0;
	case AP_CONFIG_VERSION:
		printf("apollod %s\n", AP_VERSION);
		return 0;
	case AP_CONFIG_PRINT:
		ap_config_print_defaults(stdout);
		return 0;
	case AP_CONFIG_RUN:
		break;
	}
	ap_log_set_level((ap_log_level)cfg.log_level);
	signal(SIGPIPE, SIG_IGN);   /* a peer gone (client, Redis) is an error, not the end */
	/* a write past the file-size limit (ulimit -f) is EFBIG, not the end:
	 * the cache is then degraded, not the daemon killed (cache.h) */
	signal(SIGXFSZ, SIG_IGN);
	if (!cfg.foreground) {
		ready_fd = detach();
		if (ready_fd < 0) {
			ap_log(AP_LOG_ERROR, "cannot detach; staying in the foreground");
		}
	}

	if (ap_nvrtc_load(&err))
		ap_log(AP_LOG_WARN, "%s", err.msg);
	else
		ap_log(AP_LOG_INFO, "NVRTC %s loaded", ap_nvrtc_version());

	if (ap_cache_check_path(cfg.cache, &err)) {
		ap_log(AP_LOG_ERROR, "%s", err.msg);
		report_ready(ready_fd, 1);
		return 1;
	}
	rc = ap_cache_open(cfg.cache, &cache, &err);
	if (rc == AP_ENOMEM || !cache) {
		ap_log(AP_LOG_ERROR, "%s", err.msg);
		report_ready(ready_fd, 1);
		return 1;
	}
	if (rc)
		ap_log(AP_LOG_WARN, "%s; running without a cache", err.msg);
	else if (ap_cache_enabled(cache))
		ap_log(AP_LOG_INFO, "cache %s", ap_cache_path(cache));
	else
		ap_log(AP_LOG_INFO, "cache off");
	ap_cache_set_limits(cache, (uint64_t)cfg.cache_max_bytes, (uint64_t)cfg.cache_memory_bytes);
	if (open_redis(&cfg, &redis, &err)) {
		ap_log(AP_LOG_ERROR, "%s", err.msg);
		ap_cache_free(cache);
		report_ready(ready_fd, 1);
		return 1;
	}

	cpus = sysconf(_SC_NPROCESSORS_ONLN);
	copt.threads = cfg.workers ? (unsigned)cfg.workers : (unsigned)(cpus > 0 ? cpus : 1);
	copt.redis = redis;
	copt.no_flight = cfg.flight_wait_ms == 0;
	copt.flight_wait_ms = (unsigned)cfg.flight_wait_ms;
	copt.lease_ms = (unsigned)cfg.redis_lease_ms;
	copt.tune_budget_evals = cfg.tune_budget_evals > 0 ? cfg.tune_budget_evals : -1;
	copt.tune_budget_ms = cfg.tune_budget_ms > 0 ? (double)cfg.tune_budget_ms : -1;
	copt.tune_reporters = cfg.tune_reporters;
	copt.autotune = (ap_autotune_options){
		.refine = cfg.tune_refine,
		.measure = cfg.tune_measure,
		.timer = &ap_runtime_kernel_timer,
		.device = (int)cfg.tune_device,
		.nice = (int)cfg.tune_nice,
	};
	compiler = ap_compiler_new(cache, &copt);
	if (!compiler) {
		ap_log(AP_LOG_ERROR, "out of memory");
		ap_redis_free(redis);
		ap_cache_free(cache);
		report_ready(ready_fd, 1);
		return 1;
	}
	rc = ap_server_new(&cfg, compiler, cache, &server, &err);
	if (rc) {
		ap_log(AP_LOG_ERROR, "%s", err.msg);
		ap_compiler_free(compiler);
		ap_redis_free(redis);
		ap_cache_free(cache);
		report_ready(ready_fd, 1);
		return 1;
	}
	report_ready(ready_fd, 0);
	{
		char status[200];

		snprintf(status, sizeof(status), "READY=1\nSTATUS=listening on %s",
			 ap_server_socket_path(server));
		if (ap_notify(status) < 0)
			ap_log(AP_LOG_WARN, "cannot tell the service manager that apollod is ready "
			       "($NOTIFY_SOCKET)");
	}
	rc = ap_server_run(server);
	ap_server_free(server);
	ap_compiler_free(compiler);
	ap_redis_free(redis);
	ap_cache_free(cache);
	return rc ? 1 : 0;
}
