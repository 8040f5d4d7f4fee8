/* warm.c -- the warm path, measured (built by the Makefile as
 * build/bench_warm, run by bench/warm.sh).
 *
 *   bench_warm SOCKET GRAPH.pb DAEMON_PID [--target T] [-n N] [--clients K...]
 *             [--seconds S]
 *   bench_warm process RUNS OUT.json PROGRAM [ARG...]
 *
 * GRAPH.pb is an apollo.Graph (`apollo-client convert` makes one from an
 * ONNX model), already in the daemon's cache.  Two measurements:
 *
 *   cpu: one client, one connection kept open, N submits one after the
 *        other; the daemon's CPU time (user + system of all its threads,
 *        the sum of the first field of /proc/PID/task/T/schedstat, in
 *        nanoseconds) before and after, divided by N: what a warm submit
 *        costs the daemon.  Also the client's mean round trip.
 *   rps: for each K of --clients (default 1 4 16), K threads each with its
 *        own kept connection submit for S seconds (default 2); prints the
 *        warm submits answered per second.
 *
 * `process` runs PROGRAM (an absolute path) RUNS times one after the
 * other, its stdout appended to OUT.json, and times each run from fork to
 * exit (wall clock, milliseconds): a submit as a whole apollo-client
 * process, cold or warm.  Any run that does not exit 0 is an error.
 *
 * One JSON object per line on stdout, for bench/warm.sh to print.  Every
 * answer must be a cache hit; anything else is an error (exit 1).
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/apollo.h"
#include "client/tool.h"

static const char *g_socket, *g_target = "cpu";
static const uint8_t *g_graph;
static size_t g_graph_len;
static double g_seconds = 2;
static atomic_int g_failed;

/* CPU time of every thread of `pid` so far, nanoseconds; -1 when unknown. */
static long long process_cpu_ns(long pid)
{
	char path[64];
	DIR *d;
	struct dirent *e;
	long long sum = 0;

	snprintf(path, sizeof(path), "/proc/%ld/task", pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		char p[384];
		FILE *f;
		long long ns;

		if (e->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "/proc/%ld/task/%s/schedstat", pid, e->d_name);
		f = fopen(p, "r");
		if (!f)
			continue;
		if (fscanf(f, "%lld", &ns) == 1)
			sum += ns;
		fclose(f);
	}
	closedir(d);
	return sum;
}

/* One warm submit on `c`; false (and a message) unless a cache hit. */
static bool submit_once(ap_client *c)
{
	ap_submit_options opt = { .target = g_target };
	ap_bundle_stats st;
	ap_error err;
	ap_bundle *b = ap_client_submit_graph_pb(c, g_graph, g_graph_len, &opt, &err);

	if (!b) {
		fprintf(stderr, "bench_warm: submit: %s\n", err.msg);
		return false;
	}
	ap_bundle_stats_get(b, &st);
	ap_bundle_free(b);
	if (!st.cache_hit) {
		fprintf(stderr, "bench_warm: a submit was not a cache hit (is the graph warm?)\n");
		return false;
	}
	return true;
}

static ap_client *connect_or_die(void)
{
	ap_error err;
	ap_client *c = ap_client_connect(g_socket, &err);

	if (!c) {
		fprintf(stderr, "bench_warm: connect %s: %s\n", g_socket, err.msg);
		exit(1);
	}
	return c;
}

struct worker {
	pthread_t th;
	ap_client *c;
	double stop_at;
	long n;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	while (ap_now_ms() < w->stop_at && !atomic_load(&g_failed)) {
		if (!submit_once(w->c)) {
			atomic_store(&g_failed, 1);
			break;
		}
		w->n++;
	}
	return NULL;
}

static int run_rps(int k)
{
	struct worker *w = calloc((size_t)k, sizeof(*w));
	double t0, t1;
	long total = 0;

	if (!w)
		return 1;
	for (int i = 0; i < k; i++)
		w[i].c = connect_or_die();
	t0 = ap_now_ms();
	for (int i = 0; i < k; i++) {
		w[i].stop_at = t0 + g_seconds * 1e3;
		pthread_create(&w[i].th, NULL, worker_main, &w[i]);
	}
	for (int i = 0; i < k; i++)
		pthread_join(w[i].th, NULL);
	t1 = ap_now_ms();
	for (int i = 0; i < k; i++) {
		total += w[i].n;
		ap_client_free(w[i].c);
	}
	free(w);
	printf("{\"bench\":\"rps\",\"clients\":%d,\"submits\":%ld,\"seconds\":%.3f,"
	       "\"per_second\":%.1f}\n", k, total, (t1 - t0) / 1e3, total / ((t1 - t0) / 1e3));
	return atomic_load(&g_failed);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* bench_warm process RUNS OUT PROGRAM [ARG...] */
static int run_process(int argc, char **argv)
{
	long runs;
	double *ms, *sorted;

	if (argc < 5) {
		fprintf(stderr, "usage: bench_warm process RUNS OUT.json PROGRAM [ARG...]\n");
		return 2;
	}
	runs = strtol(argv[2], NULL, 10);
	if (runs < 1 || runs > 10000) {
		fprintf(stderr, "bench_warm: RUNS is 1 ... 10000, not '%s'\n", argv[2]);
		return 2;
	}
	ms = calloc((size_t)runs, sizeof(*ms));
	sorted = calloc((size_t)runs, sizeof(*sorted));
	if (!ms || !sorted)
		return 1;
	for (long i = 0; i < runs; i++) {
		double t0 = ap_now_ms();
		pid_t pid = fork();
		int st;

		if (pid < 0) {
			perror("bench_warm: fork");
			return 1;
		}
		if (pid == 0) {
			int fd = open(argv[3], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

			if (fd < 0 || dup2(fd, 1) < 0)
				_exit(126);
			execv(argv[4], argv + 4);
			_exit(127);
		}
		if (waitpid(pid, &st, 0) < 0) {
			perror("bench_warm: waitpid");
			return 1;
		}
		ms[i] = ap_now_ms() - t0;
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, "bench_warm: %s exited with status %d\n", argv[4],
				WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
			return 1;
		}
	}
	memcpy(sorted, ms, (size_t)runs * sizeof(*ms));
	qsort(sorted, (size_t)runs, sizeof(*sorted), cmp_double);
	printf("{\"bench\":\"process\",\"runs\":%ld,\"min_ms\":%.3f,\"median_ms\":%.3f,"
	       "\"max_ms\":%.3f,\"ms\":[", runs, sorted[0], sorted[runs / 2], sorted[runs - 1]);
	for (long i = 0; i < runs; i++)
		printf("%s%.3f", i ? "," : "", ms[i]);
	printf("]}\n");
	free(ms);
	free(sorted);
	return 0;
}

int main(int argc, char **argv)
{
	int clients[16], n_clients = 0;
	long n = 2000, pid;
	uint8_t *buf = NULL;
	ap_client *c;
	ap_error err;
	long long cpu0, cpu1;
	double t0, t1;

	if (argc > 1 && !strcmp(argv[1], "process"))
		return run_process(argc, argv);
	if (argc < 4) {
		fprintf(stderr, "usage: bench_warm SOCKET GRAPH.pb DAEMON_PID [--target T] [-n N] "
				"[--clients K...] [--seconds S]\n"
				"       bench_warm process RUNS OUT.json PROGRAM [ARG...]\n");
		return 2;
	}
	g_socket = argv[1];
	pid = strtol(argv[3], NULL, 10);
	for (int i = 4; i < argc; i++) {
		if (!strcmp(argv[i], "--target") && i + 1 < argc) {
			g_target = argv[++i];
		} else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
			n = strtol(argv[++i], NULL, 10);
		} else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
			g_seconds = strtod(argv[++i], NULL);
		} else if (!strcmp(argv[i], "--clients")) {
			while (i + 1 < argc && argv[i + 1][0] != '-' && n_clients < 16)
				clients[n_clients++] = atoi(argv[++i]);
		} else {
			fprintf(stderr, "bench_warm: unknown argument '%s'\n", argv[i]);
			return 2;
		}
	}
	if (!n_clients) {
		clients[n_clients++] = 1;
		clients[n_clients++] = 4;
		clients[n_clients++] = 16;
	}
	if (ap_file_read(argv[2], (size_t)1 << 30, &buf, &g_graph_len, &err)) {
		fprintf(stderr, "bench_warm: %s\n", err.msg);
		return 1;
	}
	g_graph = buf;

	c = connect_or_die();
	for (int i = 0; i < 50; i++)   /* warm up: connection, caches, allocator */
		if (!submit_once(c))
			return 1;
	cpu0 = process_cpu_ns(pid);
	t0 = ap_now_ms();
	for (long i = 0; i < n; i++)
		if (!submit_once(c))
			return 1;
	t1 = ap_now_ms();
	cpu1 = process_cpu_ns(pid);
	ap_client_free(c);
	if (cpu0 < 0 || cpu1 < 0) {
		fprintf(stderr, "bench_warm: cannot read the CPU time of pid %ld\n", pid);
		return 1;
	}
	printf("{\"bench\":\"cpu\",\"submits\":%ld,\"daemon_cpu_ms_per_submit\":%.4f,"
	       "\"round_trip_ms\":%.4f,\"graph_bytes\":%zu}\n", n, (cpu1 - cpu0) / 1e6 / n,
	       (t1 - t0) / n, g_graph_len);
	for (int i = 0; i < n_clients; i++)
		if (run_rps(clients[i]))
			return 1;
	free(buf);
	return 0;
}
