/* hostcc.c -- the host backend: one C11 translation unit in, the bytes of a
 * shared object out (target "cpu").
 *
 * Each call works in its own directory made by mkdtemp under $TMPDIR (or
 * /tmp): it writes k.c, runs `$APOLLO_CC -O3 -shared -fPIC -o k.so k.c -lm`
 * with posix_spawnp (safe in a multi-threaded daemon: no fork of a big
 * address space, no shell), its stderr going to cc.log, reads k.so back
 * and removes the three files and the directory whatever happened.
 * $APOLLO_CC may hold a command with arguments ("clang -march=native"),
 * split at blanks; it defaults to "cc".  Nothing is shared between calls,
 * so any number of workers may compile at once.
 *
 * -O3: with the host printer's per-phase copies of register tiles
 * (print.c, print_phase), GCC 12 vectorises the GEMM emitter's register
 * tile updates at -O3 and not at -O2 (squeezenet1_1, one thread: 117 ms
 * at -O2, 80 ms at -O3; bert_like_2l 53 -> 35 ms).  No -march: kernels
 * are cached and shared between nodes, so they stay baseline x86-64; the
 * host printer asks GCC for an x86-64-v3 (AVX2, FMA) clone of each kernel
 * beside the baseline one, chosen at load time (print.c, AP_HOST_ISA).
 * -ffp-contract=off: no a * b + c fused into one FMA in that clone, so a
 * kernel rounds the same on every node, with or without AVX2.
 * APOLLO_HOST_CLONES=0 leaves the clone out (-DAP_HOST_ISA=): GCC builds
 * a cloned function twice, so compiles take about half as long and the
 * kernels run the baseline code -- the same values (check_lower's
 * host_isa_clones compares the two bit for bit).  The test runners set it
 * (tools/run-suites.sh, run-scripts.sh); compile.c puts it in the cache key.
 */
#include "backend.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define MAX_CC_ARGS 32
#define MAX_SO_BYTES ((size_t)1 << 30)

static int write_file(const char *path, const char *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	size_t off = 0;

	if (fd < 0)
		return -1;
	while (off < len) {
		ssize_t n = write(fd, data + off, len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			close(fd);
			return -1;
		}
		off += (size_t)n;
	}
	return close(fd);
}

/* Reads a whole file; *out is malloc'd and NUL-terminated (not counted in
 * *len).  Returns 0, AP_EIO or AP_ENOMEM. */
static int read_file(const char *path, uint8_t **out, size_t *len, size_t max)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	size_t n = 0, cap = 0;

	*out = NULL;
	*len = 0;
	if (!f)
		return AP_EIO;
	for (;;) {
		if (cap - n < 65536) {
			size_t ncap = cap ? cap * 2 : 65536;
			uint8_t *p;

			if (ncap > max + 65536) {
				free(buf);
				fclose(f);
				return AP_EIO;
			}
			p = realloc(buf, ncap + 1);
			if (!p) {
				free(buf);
				fclose(f);
				return AP_ENOMEM;
			}
			buf = p;
			cap = ncap;
		}
		size_t r = fread(buf + n, 1, cap - n, f);

		n += r;
		if (r == 0)
			break;
	}
	if (ferror(f)) {
		free(buf);
		fclose(f);
		return AP_EIO;
	}
	fclose(f);
	buf[n] = 0;
	*out = buf;
	*len = n;
	return 0;
}

bool ap_hostcc_clones(void)
{
	const char *v = getenv("APOLLO_HOST_CLONES");

	return !v || strcmp(v, "0") != 0;
}

int ap_hostcc_compile(const char *src, __ap_give uint8_t **out, size_t *out_len,
		      ap_error *err)
{
	const char *tmp = getenv("TMPDIR");
	const char *cc = getenv("APOLLO_CC");
	char dir[512], cpath[600], sopath[600], logpath[600];
	char ccbuf[512];
	char *argv[MAX_CC_ARGS + 12];
	int argc = 0, rc, status = 0;
	pid_t pid;
	posix_spawn_file_actions_t fa;

	*out = NULL;
	*out_len = 0;
	if (!tmp || !*tmp)
		tmp = "/tmp";
	if (!cc || !*cc)
		cc = "cc";
	if (snprintf(dir, sizeof(dir), "%s/apollo-cc-XXXXXX", tmp) >= (int)sizeof(dir))
		return ap_error_set(err, AP_EIO, NULL, NULL, "TMPDIR too long");
	if (!mkdtemp(dir))
		return ap_error_set(err, AP_EIO, NULL, NULL, "mkdtemp %s: %s", dir, strerror(errno));
	snprintf(cpath, sizeof(cpath), "%s/k.c", dir);
	snprintf(sopath, sizeof(sopath), "%s/k.so", dir);
	snprintf(logpath, sizeof(logpath), "%s/cc.log", dir);

	if (write_file(cpath, src, strlen(src)) != 0) {
		rc = ap_error_set(err, AP_EIO, NULL, NULL, "writing %s: %s", cpath, strerror(errno));
		goto done;
	}

	/* the compiler, our default flags, then the user's own flags (which
	 * may override them) */
	snprintf(ccbuf, sizeof(ccbuf), "%s", cc);
	{
		static char *const defaults[] = {"-O3", "-ffp-contract=off"};
		char *save = NULL, *tok = strtok_r(ccbuf, " \t", &save);

		argv[argc++] = tok ? tok : "cc";
		for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
			argv[argc++] = defaults[i];
		if (!ap_hostcc_clones())
			argv[argc++] = "-DAP_HOST_ISA=";
		for (tok = tok ? strtok_r(NULL, " \t", &save) : NULL; tok && argc < MAX_CC_ARGS;
		     tok = strtok_r(NULL, " \t", &save))
			argv[argc++] = tok;
	}
	argv[argc++] = "-shared";
	argv[argc++] = "-fPIC";
	argv[argc++] = "-o";
	argv[argc++] = sopath;
	argv[argc++] = cpath;
	argv[argc++] = "-lm";
	argv[argc] = NULL;

	if (posix_spawn_file_actions_init(&fa) != 0) {
		rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "posix_spawn_file_actions_init failed");
		goto done;
	}
	posix_spawn_file_actions_addopen(&fa, 1, logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	posix_spawn_file_actions_adddup2(&fa, 1, 2);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc != 0) {
		rc = ap_error_set(err, AP_ECOMPILE, NULL, NULL, "cannot run %s: %s", argv[0],
				  strerror(rc));
		goto done;
	}
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR) {
			rc = ap_error_set(err, AP_EIO, NULL, NULL, "waitpid: %s", strerror(errno));
			goto done;
		}
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		uint8_t *log = NULL;
		size_t loglen = 0;

		read_file(logpath, &log, &loglen, 1 << 20);
		rc = ap_error_set(err, AP_ECOMPILE, NULL, NULL, "%s failed (%s %d): %s", argv[0],
				  WIFEXITED(status) ? "exit" : "signal",
				  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
				  log ? (char *)log : "(no log)");
		free(log);
		goto done;
	}
	rc = read_file(sopath, out, out_len, MAX_SO_BYTES);
	if (rc == AP_ENOMEM)
		ap_error_set(err, rc, NULL, NULL, "out of memory reading the shared object");
	else if (rc < 0)
		ap_error_set(err, rc, NULL, NULL, "reading %s failed", sopath);
done:
	unlink(cpath);
	unlink(sopath);
	unlink(logpath);
	rmdir(dir);
	return rc;
}
