/* apollo-kernels -- a developer's view of what the compiler makes of a
 * model, without a daemon: imports MODEL.onnx (binding inputs from a
 * backend-test data folder when given), builds the program for a target
 * in this process, and prints every distinct kernel: its name, launch
 * shape, dynamic shared memory, the nodes it computes, and its source
 * (CUDA C or host C, as NVRTC or the host compiler would get it).
 *
 *   apollo-kernels MODEL.onnx [--target T] [--data DIR] [--shape NAME=DIMS ...]
 *                  [--fusion none|rules|apollo]
 *                  [--allow-tf32] [--only NAME] [--ptxas] [--floor [WORKERS]]
 *                  [--dump-after STAGE]
 *
 * --ptxas (CUDA targets): instead of the source, one line per kernel with
 * what ptxas reports for it through NVRTC (-Xptxas -v): registers per
 * thread, spill stores / loads (bytes), static shared memory (bytes), and
 * the emitter's schedule line.
 *
 * --floor (CUDA targets): instead of the source, the NVRTC floor of these
 * kernels on this machine, one line: their CUDA C compiled to cubin on
 * WORKERS threads (default: the online CPUs, as many as the daemon's
 * compile workers) as one NVRTC program per kernel, and as one program per
 * worker (the kernels dealt round-robin, their sources concatenated), wall
 * milliseconds of each.  bench/compile.sh sets the daemon's cold compile
 * beside it.
 *
 * --shape NAME=DIMS (repeatable): graph input NAME's shape without data
 * (e.g. input=1x3x224x224: its symbolic dimensions bound; ap_shape_binding_parse).
 * A model's external data is read from the model file's folder.
 *
 * --dump-after STAGE: after that stage of the pipeline (server/driver/
 * pipeline.c), each round writes what it left to stderr, one line per item
 * (nodes, groups, micro-graphs with their kernels, launches, buffers).
 *
 * Output goes to stdout; errors to stderr with exit status 1.  This is
 * the same build the daemon runs (ap_program_build), so what it prints is
 * what a submit compiles.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/tool.h"
#include "common/graph.h"
#include "server/backend/backend.h"
#include "server/plan/program.h"

static int usage(void)
{
	fprintf(stderr, "usage: apollo-kernels MODEL.onnx [--target T] [--data DIR] "
			"[--shape NAME=DIMS ...] [--fusion none|rules|apollo] [--allow-tf32] [--only NAME] [--ptxas] "
			"[--floor [WORKERS]] [--dump-after STAGE]\n"
			"  STAGE: expand, partition, micro-graphs, \"layer I\", \"layer II\", emit,\n"
			"         \"layer III\", print, plan (what it left, each round, on stderr)\n");
	return 1;
}

/* Appends the --shape binding `spec` to *ins (n entries).  0, or 1 after
 * printing the error. */
static int add_shape(const char *spec, ap_host_tensor ***ins, int *n)
{
	ap_host_tensor *t, **nv;
	ap_error err;

	ap_error_clear(&err);
	if (ap_shape_binding_parse(spec, &t, &err) < 0) {
		fprintf(stderr, "apollo-kernels: --shape: %s\n", err.msg);
		return 1;
	}
	nv = realloc(*ins, (size_t)(*n + 1) * sizeof(*nv));
	if (!nv) {
		ap_host_tensor_free(t);
		fprintf(stderr, "apollo-kernels: out of memory\n");
		return 1;
	}
	nv[(*n)++] = t;
	*ins = nv;
	return 0;
}

/* The folder of the file at `path` (external data's), into dir. */
static const char *model_folder(const char *path, char *dir, size_t cap)
{
	const char *slash = strrchr(path, '/');

	if (!slash)
		return ".";
	if (slash == path)
		return "/";
	snprintf(dir, cap, "%.*s", (int)(slash - path), path);
	return dir;
}

/* One line: the kernel's name, ptxas's figures for `arch`, its schedule. */
static void print_ptxas(const ap_kernel_src *k, const char *arch)
{
	char sched[160] = "";
	const char *e = strstr(k->src, "emitter ");
	ap_ptxas_stats st;
	ap_error err;

	if (e) {
		size_t n = strcspn(e, "*\n");

		snprintf(sched, sizeof(sched), "%.*s", (int)(n > 0 && e[n - 1] == ' ' ? n - 1 : n), e);
	}
	if (ap_nvrtc_ptxas_stats(k->src, k->name, arch, &st, &err) != 0)
		printf("%s: %s\n", k->name, err.msg);
	else
		printf("%s: %d registers, spills %d / %d bytes, shared %d bytes; %s\n", k->name, st.registers,
		       st.spill_store_bytes, st.spill_load_bytes, st.shared_bytes, sched[0] ? sched : "-");
}

/* --floor: n CUDA C programs compiled to cubin for `arch` by `workers`
 * threads, each taking the next program. */
typedef struct floor_job {
	char **src;
	int n;
	const char *arch;
	atomic_int next, failed;
} floor_job;

static void *floor_worker(void *arg)
{
	floor_job *j = arg;
	int i;

	while ((i = atomic_fetch_add(&j->next, 1)) < j->n) {
		uint8_t *out = NULL;
		size_t len = 0;
		ap_error err;
		char name[32];

		snprintf(name, sizeof(name), "floor%d.cu", i);
		ap_error_clear(&err);
		if (ap_nvrtc_compile(j->src[i], name, j->arch, true, &out, &len, &err) != 0) {
			fprintf(stderr, "apollo-kernels: --floor: %s\n", err.msg);
			atomic_store(&j->failed, 1);
		}
		free(out);
	}
	return NULL;
}

/* Wall milliseconds of compiling src[0..n) on `workers` threads; < 0 on a
 * failure. */
static double floor_run(char **src, int n, const char *arch, int workers)
{
	floor_job j = {.src = src, .n = n, .arch = arch};
	pthread_t th[64];
	int started = 0;
	double t0 = ap_now_ms();

	atomic_init(&j.next, 0);
	atomic_init(&j.failed, 0);
	for (int w = 0; w < workers && w < 64; w++)
		if (pthread_create(&th[w], NULL, floor_worker, &j) == 0)
			started++;
	if (started == 0)
		floor_worker(&j);
	for (int w = 0; w < started; w++)
		pthread_join(th[w], NULL);
	return atomic_load(&j.failed) ? -1 : ap_now_ms() - t0;
}

static int print_floor(const ap_program *p, const char *arch, int workers)
{
	int n = p->n_kernels, w = workers < n ? workers : n;
	char **one = calloc((size_t)n + 1, sizeof(char *));
	char **merged = calloc((size_t)(w > 0 ? w : 1), sizeof(char *));
	size_t *len = calloc((size_t)(w > 0 ? w : 1), sizeof(size_t));
	double t_one, t_merged;
	int rc = 1;

	if (!one || !merged || !len)
		goto out;
	for (int i = 0; i < n; i++)
		one[i] = p->kernels[i].src;
	/* round-robin: worker i % w gets kernel i */
	for (int i = 0; i < n; i++)
		len[i % w] += strlen(p->kernels[i].src) + 1;
	for (int q = 0; q < w; q++) {
		if (!(merged[q] = malloc(len[q] + 1)))
			goto out;
		merged[q][0] = 0;
	}
	for (int i = 0; i < n; i++) {
		strcat(merged[i % w], p->kernels[i].src);
		strcat(merged[i % w], "\n");
	}
	t_one = floor_run(one, n, arch, workers);
	t_merged = floor_run(merged, w, arch, workers);
	if (t_one < 0 || t_merged < 0)
		goto out;
	printf("floor: %d kernels, %d workers: one program per kernel %.1f ms, one program per worker "
	       "%.1f ms\n", n, workers, t_one, t_merged);
	rc = 0;
out:
	for (int q = 0; merged && q < w; q++)
		free(merged[q]);
	free(merged);
	free(one);
	free(len);
	return rc;
}

int main(int argc, char **argv)
{
	const char *model = NULL, *target = "cpu", *data = NULL, *only = NULL;
	ap_build_options opt;
	uint8_t *buf = NULL;
	size_t len = 0;
	ap_host_tensor **ins = NULL;
	int n_in = 0;
	ap_params *params = NULL;
	ap_graph *g;
	ap_program *p;
	ap_error err;
	bool ptxas = false;
	int floor_workers = 0;
	const char *shapes[64];
	int n_shapes = 0;
	char dir[4096];

	memset(&opt, 0, sizeof(opt));
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--target") && i + 1 < argc)
			target = argv[++i];
		else if (!strcmp(argv[i], "--data") && i + 1 < argc)
			data = argv[++i];
		else if (!strcmp(argv[i], "--shape") && i + 1 < argc && n_shapes < 64)
			shapes[n_shapes++] = argv[++i];
		else if (!strcmp(argv[i], "--only") && i + 1 < argc)
			only = argv[++i];
		else if (!strcmp(argv[i], "--ptxas"))
			ptxas = true;
		else if (!strcmp(argv[i], "--dump-after") && i + 1 < argc)
			opt.dump_after = argv[++i];
		else if (!strcmp(argv[i], "--floor")) {
			long n = sysconf(_SC_NPROCESSORS_ONLN);

			floor_workers = n > 0 ? (int)n : 1;
			if (i + 1 < argc && argv[i + 1][0] >= '1' && argv[i + 1][0] <= '9')
				floor_workers = atoi(argv[++i]);
			if (floor_workers > 64)
				floor_workers = 64;
		}
		else if (!strcmp(argv[i], "--allow-tf32"))
			opt.allow_tf32 = true;
		else if (!strcmp(argv[i], "--fusion") && i + 1 < argc) {
			const char *f = argv[++i];

			if (!strcmp(f, "none"))
				opt.fusion = AP_FUSE_NONE;
			else if (!strcmp(f, "rules"))
				opt.fusion = AP_FUSE_RULES;
			else if (!strcmp(f, "apollo"))
				opt.fusion = AP_FUSE_APOLLO;
			else
				return usage();
		} else if (argv[i][0] != '-' && !model)
			model = argv[i];
		else
			return usage();
	}
	if (!model)
		return usage();
	ap_error_clear(&err);
	if (ap_file_read(model, (size_t)4 << 30, &buf, &len, &err) < 0 ||
	    (data && ap_testdata_load(data, "input", &ins, &n_in, &err) < 0)) {
		fprintf(stderr, "apollo-kernels: %s\n", err.msg);
		return 1;
	}
	for (int i = 0; i < n_shapes; i++)
		if (add_shape(shapes[i], &ins, &n_in))
			return 1;
	g = ap_onnx_import_dir(buf, len, model_folder(model, dir, sizeof(dir)),
			       (const ap_host_tensor *const *)ins, n_in, &params, &err);
	if (!g) {
		fprintf(stderr, "apollo-kernels: import: %s\n", err.msg);
		return 1;
	}
	opt.target = target;
	if ((ptxas || floor_workers) && (!strcmp(target, "cpu") || ap_nvrtc_load(&err) != 0)) {
		fprintf(stderr, "apollo-kernels: --ptxas and --floor need a CUDA target and NVRTC%s%s\n",
			err.msg[0] ? ": " : "", err.msg);
		return 1;
	}
	p = ap_program_build(g, &opt, &err);
	if (!p) {
		fprintf(stderr, "apollo-kernels: build: %s\n", err.msg);
		return 1;
	}
	if (floor_workers) {
		int rc = print_floor(p, target, floor_workers);

		ap_program_free(p);
		ap_graph_free(g);
		ap_params_free(params);
		for (int i = 0; i < n_in; i++)
			ap_host_tensor_free(ins[i]);
		free(ins);
		free(buf);
		return rc;
	}
	printf("/* %s for %s: %d launches, %d distinct kernels */\n", model, target, p->n_launches,
	       p->n_kernels);
	for (int i = 0; i < p->n_kernels; i++) {
		const ap_kernel_src *k = &p->kernels[i];

		if (only && strcmp(only, k->name))
			continue;
		if (ptxas) {
			print_ptxas(k, target);
			continue;
		}
		printf("\n/* ==== %s: grid %u x %u x %u, block %u x %u x %u, dynamic shared %u bytes; nodes:",
		       k->name, k->grid[0], k->grid[1], k->grid[2], k->block[0], k->block[1], k->block[2],
		       k->smem_bytes);
		for (int j = 0; j < k->n_nodes; j++)
			printf(" %s", k->nodes[j]);
		printf(" */\n%s", k->src);
	}
	ap_program_free(p);
	ap_graph_free(g);
	ap_params_free(params);
	for (int i = 0; i < n_in; i++)
		ap_host_tensor_free(ins[i]);
	free(ins);
	free(buf);
	return 0;
}
