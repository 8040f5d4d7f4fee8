/* main.c -- apollod: configuration, cache, NVRTC, the server loop.
 *
 * Start-up order: the configuration (defaults, --config file,
 * $APOLLO_SOCKET, flags); detaching when foreground is false (the parent
 * waits on a pipe until the child listens, so `apollod --no-foreground`
 * returns once the daemon is ready, with the child's status); NVRTC (its
 * absence is a warning: target cpu is still served); the cache (its failure
 * is a warning: requests are then compiled every time; a file that is not a
 * database is moved aside and replaced, see cache.h); the server.  Exit
 * status: 0 after a clean SIGTERM / SIGINT, 1 when start-up failed, 2 for a
 * bad command line or config file.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base.h"
#include "server/backend/backend.h"
#include "server/cache/cache.h"
#include "server/compile/compile.h"
#include "server/config.h"
#include "server/net/net.h"

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

	cpus = sysconf(_SC_NPROCESSORS_ONLN);
	copt.threads = cfg.workers ? (unsigned)cfg.workers : (unsigned)(cpus > 0 ? cpus : 1);
	compiler = ap_compiler_new(cache, &copt);
	if (!compiler) {
		ap_log(AP_LOG_ERROR, "out of memory");
		ap_cache_free(cache);
		report_ready(ready_fd, 1);
		return 1;
	}
	rc = ap_server_new(&cfg, compiler, cache, &server, &err);
	if (rc) {
		ap_log(AP_LOG_ERROR, "%s", err.msg);
		ap_compiler_free(compiler);
		ap_cache_free(cache);
		report_ready(ready_fd, 1);
		return 1;
	}
	report_ready(ready_fd, 0);
	rc = ap_server_run(server);
	ap_server_free(server);
	ap_compiler_free(compiler);
	ap_cache_free(cache);
	return rc ? 1 : 0;
}
