/* check_kir.c -- the kernel IR, its two printers and its utilities.
 *
 * Small kernels are built by hand: an elementwise grid-stride loop with a
 * baked constant array and special float constants, a block-level tree
 * reduction in static shared memory with barriers inside a uniform loop
 * (the host printer must split it into phases), the same reduction in
 * dynamic shared memory over a 2-D block, and a kernel with per-thread
 * registers that live across a barrier.  The host C of each is compiled
 * with ap_hostcc_compile, loaded with dlopen and run over every block; the
 * results are compared with values computed here.  The CUDA C is checked
 * for what it must contain and, where nvcc is installed, compiled to PTX.
 *
 * The newer constructs the same way, against references written here:
 *   - float16 / bfloat16: a table of rounding cases (ties, overflow at
 *     65520, subnormals, NaN), every 16-bit pattern widened, f32 patterns
 *     narrowed against an independent nearest-even search; arithmetic,
 *     calls, comparisons, casts and constant data convert-compute-round;
 *   - warp shuffles: every kind, width and several lanes for blocks of 32,
 *     64 (2-D), 96 and 8 threads against CUDA's rules as the Programming
 *     Guide words them, and a 256-thread tree sum;
 *   - vector loads / stores of every vector type, through global, shared
 *     and constant memory; unroll hints;
 *   - integer operators folded and run; the visitor's order; two kernels
 *     stitched into one launch by ap_kir_clone_into, equal bit for bit to
 *     the two run apart; the verifier, one good and one bad kernel a rule.
 *   - wgmma (sm_90a): two warpgroups' m64nNk16 products from shared
 *     operands laid out K- and MN-major with gaps between core matrices,
 *     and with A from registers, vs float64;
 * CUDA text is compiled with NVRTC for compute_80 (wgmma: sm_90a) where it loads (PTX
 * checked for shfl.sync, ld/st .v4.f32), else the test says it skipped.
 */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/tmap.h"
#include "server/backend/backend.h"
#include "server/kir/kir.h"
#include "tests/lib/require.h"

typedef void (*host_fn)(void *const *args, unsigned block_begin, unsigned block_end);

/* Compiles host C and returns the entry point; *handle for dlclose. */
static host_fn load_host(const char *src, const char *name, void **handle)
{
	uint8_t *so = NULL;
	size_t len = 0;
	ap_error err;
	char path[] = "/tmp/check_kir_XXXXXX";
	int fd;
	void *h;
	host_fn f;

	ap_error_clear(&err);
	if (ap_hostcc_compile(src, &so, &len, &err) != 0) {
		fprintf(stderr, "%s\n---\n%s\n", err.msg, src);
		return NULL;
	}
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, so, len), (ssize_t)len);
	close(fd);
	free(so);
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	unlink(path);
	ck_assert_msg(h != NULL, "dlopen: %s", dlerror());
	f = (host_fn)dlsym(h, name);
	ck_assert_ptr_nonnull(f);
	*handle = h;
	return f;
}

static void run_all_blocks(host_fn f, const ap_kir_kernel *k, void *const *args)
{
	unsigned n = k->grid[0] * k->grid[1] * k->grid[2];

	/* split the range as a runtime would, to check block independence */
	f(args, 0, n / 2);
	f(args, n / 2, n);
}

static void check_cuda_compiles(const char *src, const char *name)
{
	char cpath[] = "/tmp/check_kir_cu_XXXXXX";
	char cmd[512], cu[64];
	int fd;
	FILE *f;

	if (access("/usr/local/cuda/bin/nvcc", X_OK) != 0) {
		printf("check_kir: no nvcc, CUDA text not compiled (%s)\n", name);
		return;
	}
	fd = mkstemp(cpath);
	ck_assert_int_ge(fd, 0);
	close(fd);
	snprintf(cu, sizeof(cu), "%s.cu", cpath);
	f = fopen(cu, "w");
	ck_assert_ptr_nonnull(f);
	fputs(src, f);
	fclose(f);
	snprintf(cmd, sizeof(cmd),
		 "/usr/local/cuda/bin/nvcc -std=c++17 -arch=compute_80 -ptx -o %s.ptx %s > %s.log 2>&1",
		 cpath, cu, cpath);
	int rc = system(cmd);
	if (rc != 0) {
		char log[4096] = "";
		snprintf(cmd, sizeof(cmd), "%s.log", cpath);
		f = fopen(cmd, "r");
		if (f) {
			size_t n = fread(log, 1, sizeof(log) - 1, f);
			log[n] = 0;
			fclose(f);
		}
		fprintf(stderr, "nvcc failed on %s:\n%s\n%s\n", name, log, src);
	}
	snprintf(cmd, sizeof(cmd), "rm -f %s %s %s.ptx %s.log", cpath, cu, cpath, cpath);
	(void)system(cmd);
	ck_assert_int_eq(rc, 0);
}

/* out[i] = exp(x[i]) * 2 + c[i % 4] (+inf where x is NaN), grid-stride. */
START_TEST(elementwise_grid_stride)
{
	enum { N = 1000 };
	const float cdata[4] = {0.5f, -1.25f, 3.0f, 1e-3f};
	ap_kir_kernel *k = ap_kir_kernel_new("ew_test");
	ap_kir_array *out, *x, *c;
	ap_kir_var *i;
	ap_kir_stmt *loop, *guard;
	ap_kir_expr *xv, *v;
	ap_error err;
	char *host, *cuda;
	void *h = NULL;
	static float xs[N], ys[N];

	ck_assert_ptr_nonnull(k);
	k->grid[0] = 3;
	k->block[0] = 128;
	out = ap_kir_param(k, "p0", AP_DT_F32, true, -1);
	x = ap_kir_param(k, "p1", AP_DT_F32, false, -1);
	c = ap_kir_const_array(k, "c0", AP_DT_F32, 4, cdata);
	i = ap_kir_var_new(k, AP_DT_I64, "i");
	loop = ap_kir_for(k, &k->body, i,
			  ap_kir_add(k, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_BLOCK_X), 128),
				     ap_kir_index_of(k, AP_KIR_THREAD_X)),
			  ap_kir_i64(k, N), 3 * 128);
	ck_assert_ptr_nonnull(loop);
	xv = ap_kir_bind(k, &loop->body, AP_DT_F32, "v",
			 ap_kir_load(k, x, ap_kir_ref(k, i)));
	v = ap_kir_binary(k, AP_KIR_MUL, ap_kir_call(k, AP_KIR_EXP, xv, NULL),
			  ap_kir_float(k, AP_DT_F32, 2.0));
	v = ap_kir_binary(k, AP_KIR_ADD, v,
			  ap_kir_load(k, c, ap_kir_binary(k, AP_KIR_REM, ap_kir_ref(k, i),
							  ap_kir_i64(k, 4))));
	v = ap_kir_select(k, ap_kir_binary(k, AP_KIR_NE, xv, xv), ap_kir_float(k, AP_DT_F32, INFINITY), v);
	ap_kir_store(k, &loop->body, out, ap_kir_ref(k, i), v);
	/* a guard that never fires, to print an if with -inf */
	guard = ap_kir_if(k, &loop->body, ap_kir_binary(k, AP_KIR_LT, xv,
							ap_kir_float(k, AP_DT_F32, -INFINITY)));
	ap_kir_store(k, &guard->body, out, ap_kir_ref(k, i), ap_kir_float(k, AP_DT_F32, NAN));
	ck_assert(!ap_kir_failed(k));

	host = ap_kir_print(k, AP_KIR_HOST, &err);
	cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
	ck_assert_ptr_nonnull(host);
	ck_assert_ptr_nonnull(cuda);
	ck_assert_ptr_nonnull(strstr(cuda, "extern \"C\" __global__"));
	ck_assert_ptr_nonnull(strstr(cuda, "blockIdx.x"));
	ck_assert_ptr_nonnull(strstr(cuda, "__device__ const float ew_test_c0[4]"));
	ck_assert_ptr_nonnull(strstr(host, "void ew_test(void *const *args, unsigned block_begin"));

	for (int j = 0; j < N; j++)
		xs[j] = (float)(j % 37) * 0.1f - 1.5f;
	xs[17] = NAN;
	host_fn f = load_host(host, "ew_test", &h);
	ck_assert_ptr_nonnull(f);
	void *args[2] = {ys, xs};
	run_all_blocks(f, k, args);
	for (int j = 0; j < N; j++) {
		float ref = j == 17 ? INFINITY : expf(xs[j]) * 2.0f + cdata[j % 4];
		ck_assert_msg(ys[j] == ref || fabsf(ys[j] - ref) <= 1e-5f * fabsf(ref), "at %d: %g vs %g", j, ys[j], ref);
	}
	dlclose(h);
	check_cuda_compiles(cuda, "ew_test");
	free(host);
	free(cuda);
	ap_kir_kernel_free(k);
}
END_TEST

/* Row sums of x[M][R] with a shared-memory tree reduction: a uniform loop
 * over rows (grid-stride over blocks) whose body holds the barriers.  With
 * `dynamic`, the shared array lives in dynamic shared memory and the block
 * is 2-D (bx x by threads). */
static ap_kir_kernel *build_rowsum(int64_t M, int64_t R, unsigned grid, unsigned bx, unsigned by,
				   bool dynamic)
{
	unsigned nt = bx * by;
	ap_kir_kernel *k = ap_kir_kernel_new(dynamic ? "rowsum_dyn" : "rowsum");
	ap_kir_array *out, *x, *sh;
	ap_kir_var *row, *r, *acc;
	ap_kir_stmt *rows, *inner, *st;
	ap_kir_expr *tid;
	ap_kir_block *body;

	k->grid[0] = grid;
	k->block[0] = bx;
	k->block[1] = by;
	out = ap_kir_param(k, "p0", AP_DT_F32, true, -1);
	x = ap_kir_param(k, "p1", AP_DT_F32, false, -1);
	sh = dynamic ? ap_kir_shared_dyn(k, "sh", AP_DT_F32, nt) : ap_kir_shared(k, "sh", AP_DT_F32, nt);
	row = ap_kir_var_new(k, AP_DT_I64, "row");
	rows = ap_kir_for(k, &k->body, row, ap_kir_index_of(k, AP_KIR_BLOCK_X), ap_kir_i64(k, M), grid);
	body = &rows->body;
	tid = ap_kir_bind(k, body, AP_DT_I64, "t",
			  ap_kir_add(k, ap_kir_index_of(k, AP_KIR_THREAD_X),
				     ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_THREAD_Y), bx)));
	acc = ap_kir_var_new(k, AP_DT_F32, "acc");
	ap_kir_let(k, body, acc, ap_kir_float(k, AP_DT_F32, 0));
	r = ap_kir_var_new(k, AP_DT_I64, "r");
	inner = ap_kir_for(k, body, r, tid, ap_kir_i64(k, R), nt);
	ap_kir_assign(k, &inner->body, acc,
		      ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc),
				    ap_kir_load(k, x, ap_kir_add(k, ap_kir_muli(k, ap_kir_ref(k, row), R),
								 ap_kir_ref(k, r)))));
	ap_kir_store(k, body, sh, tid, ap_kir_ref(k, acc));
	ap_kir_barrier(k, body);
	for (unsigned s = nt / 2; s > 0; s /= 2) {
		st = ap_kir_if(k, body, ap_kir_binary(k, AP_KIR_LT, tid, ap_kir_i64(k, s)));
		ap_kir_store(k, &st->body, sh, tid,
			     ap_kir_binary(k, AP_KIR_ADD, ap_kir_load(k, sh, tid),
					   ap_kir_load(k, sh, ap_kir_addi(k, tid, s))));
		ap_kir_barrier(k, body);
	}
	st = ap_kir_if(k, body, ap_kir_binary(k, AP_KIR_EQ, tid, ap_kir_i64(k, 0)));
	ap_kir_store(k, &st->body, out, ap_kir_ref(k, row), ap_kir_load(k, sh, ap_kir_i64(k, 0)));
	ap_kir_barrier(k, body);
	return k;
}

static void run_rowsum(bool dynamic, unsigned bx, unsigned by)
{
	enum { M = 37, R = 301 };
	static float x[M * R], y[M];
	ap_kir_kernel *k = build_rowsum(M, R, 8, bx, by, dynamic);
	ap_error err;
	char *host, *cuda;
	void *h = NULL;

	ck_assert(!ap_kir_failed(k));
	host = ap_kir_print(k, AP_KIR_HOST, &err);
	ck_assert_msg(host != NULL, "%s", err.msg);
	cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
	if (getenv("CHECK_KIR_DUMP"))
		printf("%s\n%s\n", host, cuda);
	ck_assert_ptr_nonnull(cuda);
	ck_assert_ptr_nonnull(strstr(cuda, "__syncthreads();"));
	if (dynamic) {
		ck_assert_ptr_nonnull(strstr(cuda, "extern __shared__"));
		ck_assert_uint_eq(k->smem_bytes, bx * by * 4);
	} else {
		ck_assert_ptr_nonnull(strstr(cuda, "__shared__ float sh["));
	}
	/* phases: the host text has no barrier call, one thread loop per phase */
	ck_assert_ptr_null(strstr(host, "__syncthreads"));
	ck_assert_ptr_nonnull(strstr(host, "ap_t++"));

	for (int i = 0; i < M * R; i++)
		x[i] = (float)((i * 7) % 13) - 6.0f + 0.25f;
	host_fn f = load_host(host, k->name, &h);
	ck_assert_ptr_nonnull(f);
	void *args[2] = {y, x};
	run_all_blocks(f, k, args);
	for (int m = 0; m < M; m++) {
		double ref = 0;
		for (int r = 0; r < R; r++)
			ref += x[m * R + r];
		ck_assert_msg(fabs(y[m] - ref) <= 1e-4 * (1 + fabs(ref)), "row %d: %g vs %g", m, y[m], ref);
	}
	dlclose(h);
	check_cuda_compiles(cuda, k->name);
	free(host);
	free(cuda);
	ap_kir_kernel_free(k);
}

START_TEST(block_reduction_static_shared)
{
	run_rowsum(false, 64, 1);
}
END_TEST

START_TEST(block_reduction_dynamic_shared_2d)
{
	run_rowsum(true, 16, 4);
}
END_TEST

/* A register set before a barrier and read after it needs a slot per
 * thread on the host: out[t] = x[(t + 1) % n] + 10 * x[t], reading a
 * neighbour's value through shared memory. */
START_TEST(registers_across_barrier)
{
	enum { NT = 32 };
	ap_kir_kernel *k = ap_kir_kernel_new("rotate");
	ap_kir_array *out, *x, *sh;
	ap_kir_expr *tid, *mine, *next;
	float xs[NT], ys[NT];
	ap_error err;
	char *host, *cuda;
	void *h = NULL;

	k->block[0] = NT;
	out = ap_kir_param(k, "p0", AP_DT_F32, true, -1);
	x = ap_kir_param(k, "p1", AP_DT_F32, false, -1);
	sh = ap_kir_shared(k, "sh", AP_DT_F32, NT);
	tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	mine = ap_kir_bind(k, &k->body, AP_DT_F32, "mine", ap_kir_load(k, x, tid));
	ap_kir_store(k, &k->body, sh, tid, mine);
	ap_kir_barrier(k, &k->body);
	next = ap_kir_load(k, sh, ap_kir_binary(k, AP_KIR_REM, ap_kir_addi(k, tid, 1), ap_kir_i64(k, NT)));
	ap_kir_store(k, &k->body, out, tid,
		     ap_kir_binary(k, AP_KIR_ADD, next,
				   ap_kir_binary(k, AP_KIR_MUL, ap_kir_float(k, AP_DT_F32, 10), mine)));
	host = ap_kir_print(k, AP_KIR_HOST, &err);
	cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
	ck_assert_ptr_nonnull(host);
	ck_assert_ptr_nonnull(cuda);
	ck_assert_ptr_nonnull(strstr(host, "mine0[32]"));
	for (int i = 0; i < NT; i++)
		xs[i] = (float)i;
	host_fn f = load_host(host, "rotate", &h);
	ck_assert_ptr_nonnull(f);
	void *args[2] = {ys, xs};
	f(args, 0, 1);
	for (int i = 0; i < NT; i++)
		ck_assert_float_eq(ys[i], (float)((i + 1) % NT) + 10.0f * i);
	dlclose(h);
	check_cuda_compiles(cuda, "rotate");
	free(host);
	free(cuda);
	ap_kir_kernel_free(k);
}
END_TEST

/* Integer folding, casts and literals. */
START_TEST(folding_and_literals)
{
	ap_kir_kernel *k = ap_kir_kernel_new("lits");
	ap_kir_var *v = ap_kir_var_new(k, AP_DT_I64, "v");
	ap_kir_expr *e;
	int64_t c;

	e = ap_kir_addi(k, ap_kir_muli(k, ap_kir_i64(k, 3), 4), 5);
	ck_assert(ap_kir_is_int(e, &c));
	ck_assert_int_eq(c, 17);
	e = ap_kir_addi(k, ap_kir_addi(k, ap_kir_ref(k, v), 2), 3);
	ck_assert(e->kind == AP_KIR_E_BINARY && ap_kir_is_int(e->b, &c) && c == 5);
	ck_assert_ptr_eq(ap_kir_muli(k, ap_kir_ref(k, v), 1)->var, v);
	ck_assert(ap_kir_is_int(ap_kir_muli(k, ap_kir_ref(k, v), 0), &c) && c == 0);
	ck_assert(ap_kir_expr_equal(ap_kir_addi(k, ap_kir_ref(k, v), 5), e));
	ck_assert(!ap_kir_expr_equal(ap_kir_addi(k, ap_kir_ref(k, v), 6), e));
	e = ap_kir_cast(k, AP_DT_BOOL, ap_kir_float(k, AP_DT_F32, 0.5));
	ck_assert(ap_kir_is_int(e, &c) && c == 1 && e->type == AP_DT_BOOL);
	e = ap_kir_float(k, AP_DT_F32, 0.1);
	ck_assert(e->fval == (double)0.1f);
	ck_assert(!ap_kir_failed(k));
	/* NULL propagates */
	ck_assert_ptr_null(ap_kir_add(k, NULL, ap_kir_i64(k, 1)));
	ck_assert_ptr_null(ap_kir_print(NULL, AP_KIR_HOST, NULL));
	ap_kir_kernel_free(k);
	ck_assert_ptr_null(ap_kir_kernel_free(NULL));
}
END_TEST

START_TEST(hostcc_reports_errors)
{
	uint8_t *so = (uint8_t *)1;
	size_t len = 1;
	ap_error err;

	ap_error_clear(&err);
	ck_assert_int_eq(ap_hostcc_compile("int f(void) { return undeclared_thing; }", &so, &len, &err),
			 AP_ECOMPILE);
	ck_assert_ptr_null(so);
	ck_assert_ptr_nonnull(strstr(err.msg, "undeclared_thing"));
}
END_TEST

/* A barrier under a condition on the thread index cannot be split into
 * phases: the host printer refuses it (CUDA would deadlock or misbehave). */
START_TEST(host_printer_refuses_divergent_barrier)
{
	ap_kir_kernel *k = ap_kir_kernel_new("bad");
	ap_kir_stmt *st;
	ap_error err;
	char *host, *cuda;

	k->block[0] = 32;
	st = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_LT, ap_kir_index_of(k, AP_KIR_THREAD_X),
						  ap_kir_i64(k, 5)));
	ap_kir_barrier(k, &st->body);
	ap_error_clear(&err);
	host = ap_kir_print(k, AP_KIR_HOST, &err);
	ck_assert_ptr_null(host);
	ck_assert_int_eq(err.code, AP_EINTERNAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "thread index"));
	cuda = ap_kir_print(k, AP_KIR_CUDA, &err);   /* CUDA prints what it is given */
	ck_assert_ptr_nonnull(cuda);
	free(cuda);
	ap_kir_kernel_free(k);
}
END_TEST

#include <pthread.h>

static void *compile_worker(void *arg)
{
	int id = (int)(intptr_t)arg;
	char src[256];
	uint8_t *so = NULL;
	size_t len = 0;
	ap_error err;
	int rc;

	snprintf(src, sizeof(src), "int worker_%d(int x) { return x * %d; }\n", id, id + 1);
	rc = ap_hostcc_compile(src, &so, &len, &err);
	free(so);
	return (void *)(intptr_t)(rc == 0 && len > 0 ? 0 : 1);
}

/* Several compiles at once: private directories, no shared state. */
START_TEST(hostcc_concurrent)
{
	pthread_t t[6];
	void *r;

	for (int i = 0; i < 6; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, compile_worker, (void *)(intptr_t)i), 0);
	for (int i = 0; i < 6; i++) {
		pthread_join(t[i], &r);
		ck_assert_int_eq((int)(intptr_t)r, 0);
	}
}
END_TEST

/* ---- shared helpers for the new constructs ------------------------------------ */

/* PTX of `src` for compute_80 through NVRTC (caller frees), or NULL with the
 * reason printed when NVRTC -- or, for float16 / bfloat16 kernels, its
 * cuda_fp16.h -- is missing.  A compile error fails the test. */
static char *nvrtc_ptx(const char *src, const char *name, bool needs_fp16)
{
	uint8_t *out = NULL;
	size_t len = 0;
	ap_error err;

	if (ap_nvrtc_load(&err) != 0) {
		AP_SKIP("nvrtc", "SKIP NVRTC compile of %s: NVRTC cannot be loaded: %s", name, err.msg);
		return NULL;
	}
	if (needs_fp16 && !ap_nvrtc_include_dir()) {
		AP_SKIP("nvrtc", "SKIP NVRTC compile of %s: no cuda_fp16.h for NVRTC", name);
		return NULL;
	}
	if (ap_nvrtc_compile(src, name, "compute_80", false, &out, &len, &err) != 0)
		fprintf(stderr, "NVRTC failed on %s: %s\n%s\n", name, err.msg, src);
	ck_assert_ptr_nonnull(out);
	return (char *)out;
}

/* Prints both targets, checking they print; host compiled and loaded. */
static host_fn print_and_load(const ap_kir_kernel *k, char **host, char **cuda, void **h)
{
	ap_error err;
	host_fn f;

	ck_assert_msg(!ap_kir_failed(k), "kernel %s failed to build", k->name);
	ck_assert_msg(ap_kir_verify(k, NULL, &err) == 0, "%s", err.msg);
	*host = ap_kir_print(k, AP_KIR_HOST, &err);
	ck_assert_msg(*host != NULL, "%s", err.msg);
	*cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
	ck_assert_msg(*cuda != NULL, "%s", err.msg);
	if (getenv("CHECK_KIR_DUMP"))
		printf("%s\n%s\n", *host, *cuda);
	f = load_host(*host, k->name, h);
	ck_assert_ptr_nonnull(f);
	return f;
}

/* ---- thread-block clusters ------------------------------------------------------ */

/* A cluster of 4 blocks of 32 threads, 3 clusters: each block writes
 * 100 * rank + tid into its shared array; after a cluster barrier each
 * thread reads the value of the same thread in the next block of its
 * cluster (distributed shared memory) and stores it with the cluster
 * index.  On the host the blocks of a cluster run as one wide block,
 * whatever range of blocks a call is given (a cluster runs in the call
 * holding its first block). */
static ap_kir_kernel *cluster_kernel(void)
{
	ap_kir_kernel *k = ap_kir_kernel_new("k_cluster");
	ap_kir_array *out = ap_kir_param(k, "out", AP_DT_F32, true, -1);
	ap_kir_array *sh = ap_kir_shared(k, "sh", AP_DT_F32, 32);
	ap_kir_expr *tid = ap_kir_index_of(k, AP_KIR_THREAD_X), *rank = ap_kir_index_of(k, AP_KIR_CLUSTER_RANK);
	ap_kir_expr *next = ap_kir_binary(k, AP_KIR_REM, ap_kir_addi(k, rank, 1), ap_kir_idx(k, 4));
	ap_kir_expr *blk = ap_kir_add(k, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_CLUSTER_X), 4), rank);

	k->grid[0] = 12;
	k->block[0] = 32;
	k->cluster = 4;
	ap_kir_store(k, &k->body, sh, tid,
		     ap_kir_cast(k, AP_DT_F32, ap_kir_add(k, ap_kir_muli(k, rank, 100), tid)));
	ap_kir_cluster_barrier(k, &k->body);
	ap_kir_store(k, &k->body, out, ap_kir_add(k, ap_kir_muli(k, blk, 32), tid),
		     ap_kir_binary(k, AP_KIR_ADD, ap_kir_load_remote(k, sh, tid, next),
				   ap_kir_cast(k, AP_DT_F32, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_CLUSTER_X), 1000))));
	ap_kir_cluster_barrier(k, &k->body);
	return k;
}

START_TEST(cluster_distributed_shared_memory)
{
	ap_kir_kernel *k = cluster_kernel();
	char *host, *cuda, *ptx;
	void *h;
	host_fn f = print_and_load(k, &host, &cuda, &h);
	float out[12 * 32];
	void *args[] = {out};

	/* ranges that cut clusters in two: each cluster still runs once */
	memset(out, 0, sizeof(out));
	f(args, 0, 5);
	f(args, 5, 7);
	f(args, 7, 12);
	for (int b = 0; b < 12; b++)
		for (int t = 0; t < 32; t++)
			ck_assert_msg(out[b * 32 + t] == (float)(1000 * (b / 4) + 100 * ((b % 4 + 1) % 4) + t),
				      "block %d thread %d: %g", b, t, (double)out[b * 32 + t]);
	ck_assert_ptr_nonnull(strstr(cuda, "__cluster_dims__(4, 1, 1)"));
	ck_assert_ptr_nonnull(strstr(cuda, "barrier.cluster.arrive.release.aligned"));
	{
		uint8_t *out_ptx = NULL;
		size_t len = 0;
		ap_error err;

		if (ap_nvrtc_load(&err) == 0) {
			ck_assert_msg(ap_nvrtc_compile(cuda, k->name, "compute_90", false, &out_ptx, &len, &err) == 0,
				      "%s", err.msg);
			ptx = (char *)out_ptx;
			ck_assert_ptr_nonnull(strstr(ptx, "mapa.shared::cluster"));
			ck_assert_ptr_nonnull(strstr(ptx, "ld.shared::cluster.f32"));
			ck_assert_ptr_nonnull(strstr(ptx, "barrier.cluster.wait"));
			free(ptx);
		} else {
			AP_SKIP("nvrtc", "SKIP NVRTC compile of %s: NVRTC cannot be loaded: %s", k->name, err.msg);
		}
	}
	dlclose(h);
	free(host);
	free(cuda);
	ap_kir_kernel_free(k);
}
END_TEST

/* The verifier's cluster rules. */
START_TEST(cluster_rules)
{
	ap_error err;
	ap_kir_kernel *k;

	/* a cluster barrier or a remote load without clusters */
	k = cluster_kernel();
	k->cluster = 1;
	ck_assert_int_ne(ap_kir_verify(k, NULL, &err), 0);
	ck_assert_ptr_nonnull(strstr(err.msg, "cluster"));
	ap_kir_kernel_free(k);
	/* a grid that is not a multiple of the cluster */
	k = cluster_kernel();
	k->grid[0] = 10;
	ck_assert_int_ne(ap_kir_verify(k, NULL, &err), 0);
	ap_kir_kernel_free(k);
	/* blockIdx.x in a cluster kernel */
	k = cluster_kernel();
	ap_kir_store(k, &k->body, k->arrays[0], ap_kir_index_of(k, AP_KIR_BLOCK_X), ap_kir_float(k, AP_DT_F32, 1));
	ck_assert_int_ne(ap_kir_verify(k, NULL, &err), 0);
	ap_kir_kernel_free(k);
	/* a cluster barrier under the rank (not uniform on the host) */
	k = cluster_kernel();
	{
		ap_kir_stmt *s = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_EQ, ap_kir_index_of(k, AP_KIR_CLUSTER_RANK),
								     ap_kir_idx(k, 0)));

		ck_assert_ptr_nonnull(s);
		ap_kir_cluster_barrier(k, &s->body);
	}
	ck_assert_int_ne(ap_kir_verify(k, NULL, &err), 0);
	ap_kir_kernel_free(k);
	/* remote loads only from float shared arrays */
	k = cluster_kernel();
	ck_assert_ptr_null(ap_kir_load_remote(k, k->arrays[0], ap_kir_idx(k, 0), ap_kir_idx(k, 1)));
	ck_assert(ap_kir_failed(k));
	ap_kir_kernel_free(k);
}
END_TEST

/* ---- float16 / bfloat16 ------------------------------------------------------- */

static uint32_t fbits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float bitsf(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* Independent references (not the bit tricks of half.c): a binary16's value
 * from its fields, and round-to-nearest-even by search and distances. */
static double ref_f16_value(unsigned h)
{
	int e = (h >> 10) & 31, m = h & 1023;
	double v;

	if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
	return (h & 0x8000) ? -v : v;
}

static uint16_t ref_f32_to_f16(float x)
{
	unsigned sign = signbit(x) ? 0x8000u : 0, lo = 0, hi = 0x7bff, r;
	double a = fabs((double)x), vlo, vhi, dl, dh;

	if (isnan(x))
		return (uint16_t)(sign | 0x7e00u);
	if (a >= 65520.0)
		return (uint16_t)(sign | 0x7c00u);
	while (lo < hi) {     /* largest finite h with value(h) <= a */
		unsigned mid = (lo + hi + 1) / 2;

		if (ref_f16_value(mid) <= a)
			lo = mid;
		else
			hi = mid - 1;
	}
	vlo = ref_f16_value(lo);
	vhi = lo == 0x7bff ? 65536.0 : ref_f16_value(lo + 1);
	dl = a - vlo;
	dh = vhi - a;
	r = dl < dh ? lo : dh < dl ? lo + 1 : (lo & 1) ? lo + 1 : lo;
	return (uint16_t)(sign | r);
}

static uint16_t ref_f32_to_bf16(float x)
{
	uint32_t u = fbits(x);
	unsigned lo = u >> 16;
	double vlo, vhi, dl, dh;

	if (isnan(x))
		return (uint16_t)(lo | 0x40u);
	if ((u & 0xffffu) == 0)
		return (uint16_t)lo;
	vlo = bitsf(lo << 16);
	vhi = (lo & 0x7fffu) == 0x7f7fu ? copysign(ldexp(1, 128), x) : bitsf((lo + 1) << 16);
	dl = fabs((double)x - vlo);
	dh = fabs(vhi - (double)x);
	return (uint16_t)(dl < dh ? lo : dh < dl ? lo + 1 : (lo & 1) ? lo + 1 : lo);
}

static bool f16_is_nan(unsigned h)
{
	return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
}

static bool bf16_is_nan(unsigned h)
{
	return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
}

#define NAN16 0xffffu   /* expected: some quiet NaN (sign as the input's) */

static const struct { uint32_t in; unsigned f16, bf16; } cvt_table[] = {
	{ 0x3f800000u, 0x3c00u, 0x3f80u },       /* 1.0 */
	{ 0x00000000u, 0x0000u, 0x0000u },       /* +0 */
	{ 0x80000000u, 0x8000u, 0x8000u },       /* -0 */
	{ 0xc0000000u, 0xc000u, 0xc000u },       /* -2 */
	{ 0x477fe000u, 0x7bffu, 0x4780u },       /* 65504, the largest binary16; bf16: 65536 (tie -> even) */
	{ 0x477fefffu, 0x7bffu, 0x4780u },       /* just below 65520: 65504 */
	{ 0x477ff000u, 0x7c00u, 0x4780u },       /* 65520: tie -> even -> infinity */
	{ 0xc77ff000u, 0xfc00u, 0xc780u },       /* -65520 */
	{ 0x501502f9u, 0x7c00u, 0x5015u },       /* 1e10 */
	{ 0x7f800000u, 0x7c00u, 0x7f80u },       /* +inf */
	{ 0xff800000u, 0xfc00u, 0xff80u },       /* -inf */
	{ 0x33800000u, 0x0001u, 0x3380u },       /* 2^-24, smallest subnormal */
	{ 0x33000000u, 0x0000u, 0x3300u },       /* 2^-25: tie -> even 0 */
	{ 0xb3000000u, 0x8000u, 0xb300u },       /* -2^-25: -0 */
	{ 0x33000001u, 0x0001u, 0x3300u },       /* just above 2^-25: 2^-24 */
	{ 0x33c00000u, 0x0002u, 0x33c0u },       /* 3 * 2^-25: tie -> even 2 * 2^-24 = 2^-23 */
	{ 0x38800000u, 0x0400u, 0x3880u },       /* 2^-14, smallest normal */
	{ 0x387fe000u, 0x0400u, 0x3880u },       /* 2047 * 2^-25: tie 0x3ff / 0x400 -> 0x400 */
	{ 0x387fa000u, 0x03feu, 0x3880u },       /* 2045 * 2^-25: tie 0x3fe / 0x3ff -> 0x3fe */
	{ 0x3f801000u, 0x3c00u, 0x3f80u },       /* 1 + 2^-11: tie -> 1 */
	{ 0x3f803000u, 0x3c02u, 0x3f80u },       /* 1 + 3 * 2^-11: tie -> 1 + 2^-9 */
	{ 0x3dcccccdu, 0x2e66u, 0x3dcdu },       /* 0.1 */
	{ 0x3f808000u, 0x3c04u, 0x3f80u },       /* 1 + 2^-8: bf16 tie -> even 1 */
	{ 0x3f818000u, 0x3c0cu, 0x3f82u },       /* 1 + 3 * 2^-8: bf16 tie -> 0x3f82 */
	{ 0x3f808008u, 0x3c04u, 0x3f81u },       /* 1 + 2^-8 + 2^-20: bf16 above the tie */
	{ 0x7f7fffffu, 0x7c00u, 0x7f80u },       /* FLT_MAX: bf16 rounds to infinity */
	{ 0x7f7f7fffu, 0x7c00u, 0x7f7fu },       /* bf16 just below the tie: the largest bf16 */
	{ 0x00000001u, 0x0000u, 0x0000u },       /* smallest float32 subnormal */
	{ 0x00018000u, 0x0000u, 0x0002u },       /* bf16 subnormal tie -> even 2 */
	{ 0x7fc00000u, NAN16, NAN16 },           /* quiet NaN */
	{ 0x7f800001u, NAN16, NAN16 },           /* signalling NaN: quiet after */
	{ 0xffc00001u, NAN16, NAN16 },           /* negative NaN */
};
#define N_TABLE ((int)(sizeof(cvt_table) / sizeof(cvt_table[0])))

static void check_table_row(int i, unsigned got16, unsigned gotb16, const char *who)
{
	unsigned in = cvt_table[i].in;

	if (cvt_table[i].f16 == NAN16) {
		ck_assert_msg(f16_is_nan(got16) && (got16 & 0x200u) && (got16 & 0x8000u) == ((in >> 16) & 0x8000u),
			      "%s: f16 of NaN 0x%08x: 0x%04x", who, in, got16);
		ck_assert_msg(bf16_is_nan(gotb16) && (gotb16 & 0x40u) && (gotb16 & 0x8000u) == ((in >> 16) & 0x8000u),
			      "%s: bf16 of NaN 0x%08x: 0x%04x", who, in, gotb16);
		return;
	}
	ck_assert_msg(got16 == cvt_table[i].f16, "%s: f16 of 0x%08x (%a): 0x%04x, want 0x%04x", who, in,
		      bitsf(in), got16, cvt_table[i].f16);
	ck_assert_msg(gotb16 == cvt_table[i].bf16, "%s: bf16 of 0x%08x (%a): 0x%04x, want 0x%04x", who,
		      in, bitsf(in), gotb16, cvt_table[i].bf16);
}

/* The table through half.c's C functions and through the independent
 * references (which checks the table itself). */
START_TEST(half_table_c_functions)
{
	for (int i = 0; i < N_TABLE; i++) {
		float x = bitsf(cvt_table[i].in);

		check_table_row(i, ap_kir_f32_to_f16(x), ap_kir_f32_to_bf16(x), "half.c");
		check_table_row(i, ref_f32_to_f16(x), ref_f32_to_bf16(x), "reference");
	}
	/* constants of the types hold the rounded value */
	ap_kir_kernel *k = ap_kir_kernel_new("consts");
	ck_assert(ap_kir_float(k, AP_DT_F16, 0.1)->fval == ref_f16_value(0x2e66));
	ck_assert(ap_kir_float(k, AP_DT_F16, 65520.0)->fval == INFINITY);
	ck_assert(ap_kir_float(k, AP_DT_BF16, 1.0 + 3.0 / 256)->fval == 1.0 + 2.0 / 128);
	ck_assert(ap_kir_int(k, AP_DT_F16, 2049)->fval == 2048.0);
	ck_assert(ap_kir_const(k, AP_DT_BF16, 257)->fval == 256.0);
	ck_assert(ap_kir_cast(k, AP_DT_F16, ap_kir_float(k, AP_DT_F64, 1e-8))->fval == 0.0);
	ck_assert(ap_kir_is_float_type(AP_DT_F16) && ap_kir_is_float_type(AP_DT_BF16));
	ck_assert_str_eq(ap_kir_ctype(AP_DT_F16), "unsigned short");
	ck_assert_uint_eq(ap_dtype_size(AP_DT_F16), 2);
	ck_assert_uint_eq(ap_dtype_size(AP_DT_BF16), 2);
	ck_assert_str_eq(ap_dtype_name(AP_DT_F16), "float16");
	ck_assert_str_eq(ap_dtype_name(AP_DT_BF16), "bfloat16");
	ck_assert(ap_dtype_in_graphs(AP_DT_F16) && ap_dtype_in_graphs(AP_DT_BF16));
	ck_assert(ap_dtype_in_graphs(AP_DT_F32) && !ap_dtype_in_graphs(AP_DT_UNDEF));
	ap_kir_kernel_free(k);
}
END_TEST

/* Conversions in a host kernel: f32 -> f16 / bf16 over the table, random
 * patterns and a dense sweep of binary16's range, against half.c and the
 * independent references; f16 / bf16 -> f32 over all 65536 patterns. */
START_TEST(half_conversions_host)
{
	enum { N = 65536, NT = 256 };
	static float in_f[N], back_h[N], back_b[N];
	static uint16_t in_h[N], in_b[N], out_h[N], out_b[N];
	ap_kir_kernel *k = ap_kir_kernel_new("cvt16");
	ap_kir_array *oh, *ob, *fi, *hi, *bi, *bh, *bb;
	ap_kir_expr *i;
	char *host, *cuda, *ptx;
	void *h = NULL;
	uint32_t seed = 12345;

	k->grid[0] = N / NT;
	k->block[0] = NT;
	oh = ap_kir_param(k, "p0", AP_DT_F16, true, -1);
	ob = ap_kir_param(k, "p1", AP_DT_BF16, true, -1);
	fi = ap_kir_param(k, "p2", AP_DT_F32, false, -1);
	hi = ap_kir_param(k, "p3", AP_DT_F16, false, -1);
	bi = ap_kir_param(k, "p4", AP_DT_BF16, false, -1);
	bh = ap_kir_param(k, "p5", AP_DT_F32, true, -1);
	bb = ap_kir_param(k, "p6", AP_DT_F32, true, -1);
	i = ap_kir_bind(k, &k->body, AP_DT_I64, "i",
			ap_kir_add(k, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_BLOCK_X), NT),
				   ap_kir_index_of(k, AP_KIR_THREAD_X)));
	ap_kir_store(k, &k->body, oh, i, ap_kir_cast(k, AP_DT_F16, ap_kir_load(k, fi, i)));
	ap_kir_store(k, &k->body, ob, i, ap_kir_cast(k, AP_DT_BF16, ap_kir_load(k, fi, i)));
	ap_kir_store(k, &k->body, bh, i, ap_kir_cast(k, AP_DT_F32, ap_kir_load(k, hi, i)));
	ap_kir_store(k, &k->body, bb, i, ap_kir_cast(k, AP_DT_F32, ap_kir_load(k, bi, i)));
	host_fn f = print_and_load(k, &host, &cuda, &h);
	ck_assert_ptr_nonnull(strstr(host, "static inline unsigned short ap_f32_to_f16(float f)"));
	ck_assert_ptr_nonnull(strstr(host, "static inline float ap_bf16_to_f32(unsigned short h)"));
	ck_assert_ptr_nonnull(strstr(cuda, "#include <cuda_fp16.h>\n"));
	ck_assert_ptr_nonnull(strstr(cuda, "#include <cuda_bf16.h>\n"));
	ck_assert_ptr_nonnull(strstr(cuda, "__half *__restrict__ p0"));
	ck_assert_ptr_nonnull(strstr(cuda, "__nv_bfloat16 *__restrict__ p1"));
	ck_assert_ptr_nonnull(strstr(cuda, "__float2half_rn("));
	ck_assert_ptr_nonnull(strstr(cuda, "__bfloat162float("));

	for (int j = 0; j < N; j++) {
		uint32_t r;

		seed = seed * 1664525u + 1013904223u;
		r = seed;
		if (j < N_TABLE)
			r = cvt_table[j].in;
		else if (j % 2)   /* binary16's range, either sign */
			r = (r & 0x80000000u) | (0x33000000u + (r >> 1) % (0x47800000u - 0x33000000u));
		in_f[j] = bitsf(r);
		in_h[j] = in_b[j] = (uint16_t)j;
	}
	void *args[7] = {out_h, out_b, in_f, in_h, in_b, back_h, back_b};
	run_all_blocks(f, k, args);
	for (int j = 0; j < N_TABLE; j++)
		check_table_row(j, out_h[j], out_b[j], "host kernel");
	for (int j = 0; j < N; j++) {
		float x = in_f[j];

		ck_assert_msg(out_h[j] == ap_kir_f32_to_f16(x), "f16 of %a: 0x%04x vs 0x%04x", x, out_h[j],
			      ap_kir_f32_to_f16(x));
		ck_assert_msg(out_b[j] == ap_kir_f32_to_bf16(x), "bf16 of %a", x);
		if (!isnan(x)) {
			ck_assert_msg(out_h[j] == ref_f32_to_f16(x), "f16 of %a: 0x%04x, reference 0x%04x", x,
				      out_h[j], ref_f32_to_f16(x));
			ck_assert_msg(out_b[j] == ref_f32_to_bf16(x), "bf16 of %a: 0x%04x, reference 0x%04x",
				      x, out_b[j], ref_f32_to_bf16(x));
		}
		/* widening is exact; NaN payloads are kept */
		ck_assert_uint_eq(fbits(back_h[j]), fbits(ap_kir_f16_to_f32((uint16_t)j)));
		ck_assert_uint_eq(fbits(back_b[j]), (uint32_t)j << 16);
		if (f16_is_nan((unsigned)j)) {
			ck_assert(isnan(back_h[j]));
		} else {
			ck_assert_msg((double)back_h[j] == ref_f16_value((unsigned)j), "0x%04x", j);
			ck_assert_uint_eq(ap_kir_f32_to_f16(back_h[j]), (unsigned)j);    /* round trip */
		}
		if (!bf16_is_nan((unsigned)j))
			ck_assert_uint_eq(ap_kir_f32_to_bf16(back_b[j]), (unsigned)j);
	}
	dlclose(h);
	ptx = nvrtc_ptx(cuda, "cvt16", true);
	if (ptx)
		ck_assert_ptr_nonnull(strstr(ptx, "cvt.rn.f16.f32"));
	free(ptx);
	free(host);
	free(cuda);
	ap_kir_kernel_free(k);
}
END_TEST

/* Arithmetic, a math call, a comparison, casts and constant data on
 * float16 / bfloat16: every operation in float32, rounded to the type. */
static void run_half_arith(ap_dtype T)
{
	enum { N = 1024, NT = 128 };
	const bool bf = T == AP_DT_BF16;
	const ap_dtype other = bf ? AP_DT_F16 : AP_DT_BF16;
	static uint16_t a[N], bv[N], c[N], o1[N], o2[N], o5[N], o6[N], o7[N], o8[N];
	static unsigned char o3[N];
	static int32_t o4[N];
	uint16_t tab[4];
	const float tabf[4] = {1.0f, 0.5f, -2.0f, 65504.0f};
	ap_kir_kernel *k = ap_kir_kernel_new(bf ? "arith_bf16" : "arith_f16");
	ap_kir_array *A, *B, *C, *O[8], *ct;
	ap_kir_expr *i, *x, *y, *z;
	char *host, *cuda, *ptx;
	void *h = NULL;
	uint32_t seed = 99;
	uint16_t (*rnd)(float) = bf ? ap_kir_f32_to_bf16 : ap_kir_f32_to_f16;
	uint16_t (*rnd_o)(float) = bf ? ap_kir_f32_to_f16 : ap_kir_f32_to_bf16;
	float (*wid)(uint16_t) = bf ? ap_kir_bf16_to_f32 : ap_kir_f16_to_f32;
	static const ap_dtype otype[8] = {0, 0, 0, AP_DT_BOOL, AP_DT_I32, 0, 0, 0};

	for (int j = 0; j < 4; j++)
		tab[j] = rnd(tabf[j]);
	k->grid[0] = N / NT;
	k->block[0] = NT;
	for (int j = 1; j < 8; j++) {
		char name[32];

		snprintf(name, sizeof(name), "o%d", j);
		O[j] = ap_kir_param(k, name, otype[j] ? otype[j] : j == 6 ? other : T, true, -1);
	}
	O[0] = ap_kir_param(k, "o8", T, true, -1);
	A = ap_kir_param(k, "a", T, false, -1);
	B = ap_kir_param(k, "b", T, false, -1);
	C = ap_kir_param(k, "c", T, false, -1);
	ct = ap_kir_const_array(k, "tab", T, 4, tab);
	i = ap_kir_bind(k, &k->body, AP_DT_I64, "i",
			ap_kir_add(k, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_BLOCK_X), NT),
				   ap_kir_index_of(k, AP_KIR_THREAD_X)));
	x = ap_kir_bind(k, &k->body, T, "x", ap_kir_load(k, A, i));
	y = ap_kir_bind(k, &k->body, T, "y", ap_kir_load(k, B, i));
	z = ap_kir_load(k, C, i);
	/* o1 = (x + y) * z - x / y */
	ap_kir_store(k, &k->body, O[1], i,
		     ap_kir_binary(k, AP_KIR_SUB,
				   ap_kir_binary(k, AP_KIR_MUL, ap_kir_binary(k, AP_KIR_ADD, x, y), z),
				   ap_kir_binary(k, AP_KIR_DIV, x, y)));
	ap_kir_store(k, &k->body, O[2], i, ap_kir_call(k, AP_KIR_EXP, ap_kir_unary(k, AP_KIR_NEG, x), NULL));
	ap_kir_store(k, &k->body, O[3], i, ap_kir_binary(k, AP_KIR_LT, x, y));
	ap_kir_store(k, &k->body, O[4], i, ap_kir_cast(k, AP_DT_I32, z));
	ap_kir_store(k, &k->body, O[5], i, ap_kir_binary(k, AP_KIR_MUL, x, ap_kir_float(k, T, 0.1)));
	ap_kir_store(k, &k->body, O[6], i, ap_kir_cast(k, other, x));   /* via float32 */
	/* o7 = (T)((double)x * 3) */
	ap_kir_store(k, &k->body, O[7], i,
		     ap_kir_cast(k, T, ap_kir_binary(k, AP_KIR_MUL, ap_kir_cast(k, AP_DT_F64, x),
						     ap_kir_float(k, AP_DT_F64, 3.0))));
	ap_kir_store(k, &k->body, O[0], i,
		     ap_kir_binary(k, AP_KIR_ADD, x,
				   ap_kir_load(k, ct, ap_kir_binary(k, AP_KIR_AND, i, ap_kir_i64(k, 3)))));
	host_fn f = print_and_load(k, &host, &cuda, &h);
	ck_assert_ptr_nonnull(strstr(cuda, bf ? "__float2bfloat16_rn(" : "__float2half_rn("));
	ck_assert_ptr_nonnull(strstr(cuda, bf ? "__ushort_as_bfloat16(arith_bf16_tab[" : "__ushort_as_half(arith_f16_tab["));
	ck_assert_ptr_nonnull(strstr(cuda, bf ? "__device__ const unsigned short arith_bf16_tab[4]"
					       : "__device__ const unsigned short arith_f16_tab[4]"));
	ck_assert_ptr_nonnull(strstr(host, "static const unsigned short arith_"));

	{   /* special operands first, then values spread over many binades */
		const float sa[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 5.96e-8f, 1.0f, 3.0f, 2048.0f};
		const float sb[] = {0.0f, 1.0f, -INFINITY, 2.0f, 1.0f, 65504.0f, 0.5f, 3.0f, 0.0f, 1.0f};
		int ns = (int)(sizeof(sa) / sizeof(sa[0]));

		for (int j = 0; j < N; j++) {
			float va, vb;

			seed = seed * 1664525u + 1013904223u;
			va = ldexpf((float)((seed >> 8) % 2048) / 1024.0f - 1.0f, (int)(seed % 24) - 12);
			seed = seed * 1664525u + 1013904223u;
			vb = ldexpf((float)((seed >> 8) % 2048) / 1024.0f - 1.0f, (int)(seed % 24) - 12);
			if (j < ns) {
				va = sa[j];
				vb = sb[j];
			}
			a[j] = rnd(va);
			bv[j] = rnd(vb);
			c[j] = rnd((float)((int)(seed % 101) - 50) + 0.25f);
		}
	}
	void *args[11] = {o1, o2, o3, o4, o5, o6, o7, o8, a, bv, c};
	run_all_blocks(f, k, args);
	for (int j = 0; j < N; j++) {
		float fa = wid(a[j]), fb = wid(bv[j]), fc = wid(c[j]);
		uint16_t want[8];

		want[1] = rnd(wid(rnd(wid(rnd(fa + fb)) * fc)) - wid(rnd(fa / fb)));
		want[2] = rnd(expf(wid(rnd(-fa))));
		want[5] = rnd(fa * wid(rnd(0.1f)));
		want[6] = rnd_o(fa);
		want[7] = rnd((float)((double)fa * 3.0));
		want[0] = rnd(fa + wid(tab[j & 3]));
		const uint16_t got[8] = {o8[j], o1[j], o2[j], 0, 0, o5[j], o6[j], o7[j]};
		for (int m = 0; m < 8; m++) {
			bool nan_w, nan_g;

			if (m == 3 || m == 4)
				continue;
			nan_w = (m == 6 ? !bf : bf) ? bf16_is_nan(want[m]) : f16_is_nan(want[m]);
			nan_g = (m == 6 ? !bf : bf) ? bf16_is_nan(got[m]) : f16_is_nan(got[m]);
			ck_assert_msg(nan_w == nan_g && (nan_w || got[m] == want[m]),
				      "%s o%d at %d (a %a, b %a): 0x%04x, want 0x%04x", k->name, m ? m : 8, j,
				      fa, fb, got[m], want[m]);
		}
		ck_assert_int_eq(o3[j], fa < fb);
		ck_assert_int_eq(o4[j], (int32_t)fc);
	}
	dlclose(h);
	ptx = nvrtc_ptx(cuda, k->name, true);
	free(ptx);
	free(host);
	free(cuda);
	ap_kir_kernel_free(k);
}

START_TEST(half_arith_f16)
{
	run_half_arith(AP_DT_F16);
}
END_TEST

START_TEST(half_arith_bf16)
{
	run_half_arith(AP_DT_BF16);
}
END_TEST
/* ---- warp shuffles ---------------------------------------------------------------- */

/* CUDA's shuffles as the CUDA C Programming Guide words them ("Warp Shuffle
 * Functions"), for lane operands in [0, 31]; a source lane beyond the
 * block gives the caller's own value. */
static int ref_shfl(int kind, const int *vals, unsigned nt, unsigned t, int lane, int width)
{
	int l = (int)(t % 32), base = (int)t - l, src;

	switch (kind) {
	case AP_KIR_SHFL_XOR:    /* later segment: own value */
		src = l ^ lane;
		if (src / width > l / width)
			src = l;
		break;
	case AP_KIR_SHFL_DOWN:
		src = l % width + lane >= width ? l : l + lane;
		break;
	case AP_KIR_SHFL_UP:
		src = l % width < lane ? l : l - lane;
		break;
	default:
		src = l / width * width + lane % width;
		break;
	}
	if (base + src >= (int)nt)
		src = l;
	return vals[base + src];
}

static const int shfl_lanes[] = {0, 1, 2, 3, 5, 8, 16, 31};
#define N_LANES ((int)(sizeof(shfl_lanes) / sizeof(shfl_lanes[0])))

/* One kernel per block shape: for every kind, width and lane, each thread
 * shuffles its value and writes what it got; plus an IDX shuffle whose
 * srcLane depends on the thread (lin * 3 + 1), and float / float16
 * shuffles (other temporaries on the host). */
static void run_shfl(unsigned bx, unsigned by, const int *widths, int nw)
{
	enum { GRID = 2 };
	const unsigned nt = bx * by;
	const int nshfl = 4 * nw * N_LANES + 1;
	ap_kir_kernel *k = ap_kir_kernel_new("shfl");
	ap_kir_array *out, *x, *outf, *outh;
	ap_kir_expr *lin, *gid, *v, *slot;
	ap_kir_var *d, *df, *dh;
	int *vals, *got;
	float *gotf;
	uint16_t *goth;
	char *host, *cuda, *ptx, mask[32];
	void *h = NULL;
	int j = 0;

	k->grid[0] = GRID;
	k->block[0] = bx;
	k->block[1] = by;
	out = ap_kir_param(k, "out", AP_DT_I32, true, -1);
	outf = ap_kir_param(k, "outf", AP_DT_F32, true, -1);
	outh = ap_kir_param(k, "outh", AP_DT_F16, true, -1);
	x = ap_kir_param(k, "x", AP_DT_I32, false, -1);
	lin = ap_kir_bind(k, &k->body, AP_DT_I64, "lin",
			  ap_kir_add(k, ap_kir_index_of(k, AP_KIR_THREAD_X),
				     ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_THREAD_Y), bx)));
	gid = ap_kir_add(k, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_BLOCK_X), nt), lin);
	v = ap_kir_bind(k, &k->body, AP_DT_I32, "v", ap_kir_load(k, x, gid));
	for (int kind = 0; kind < 4; kind++)
		for (int w = 0; w < nw; w++)
			for (int l = 0; l < N_LANES; l++, j++) {
				d = ap_kir_var_new(k, AP_DT_I32, "d");
				ap_kir_let(k, &k->body, d, NULL);
				ck_assert_ptr_nonnull(ap_kir_shfl(k, &k->body, d, kind, v,
								  ap_kir_int(k, AP_DT_I32, shfl_lanes[l]),
								  (unsigned)widths[w]));
				slot = ap_kir_add(k, ap_kir_i64(k, (int64_t)j * GRID * nt), gid);
				ap_kir_store(k, &k->body, out, slot, ap_kir_ref(k, d));
			}
	d = ap_kir_var_new(k, AP_DT_I32, "d");
	ap_kir_let(k, &k->body, d, NULL);
	ap_kir_shfl(k, &k->body, d, AP_KIR_SHFL_IDX, v, ap_kir_addi(k, ap_kir_muli(k, lin, 3), 1),
		    (unsigned)widths[nw - 1]);
	ap_kir_store(k, &k->body, out, ap_kir_add(k, ap_kir_i64(k, (int64_t)j * GRID * nt), gid),
		     ap_kir_ref(k, d));
	df = ap_kir_var_new(k, AP_DT_F32, "df");
	ap_kir_let(k, &k->body, df, NULL);
	ap_kir_shfl(k, &k->body, df, AP_KIR_SHFL_DOWN, ap_kir_cast(k, AP_DT_F32, v), ap_kir_i64(k, 1),
		    (unsigned)widths[0]);
	ap_kir_store(k, &k->body, outf, gid, ap_kir_ref(k, df));
	dh = ap_kir_var_new(k, AP_DT_F16, "dh");
	ap_kir_let(k, &k->body, dh, NULL);
	ap_kir_shfl(k, &k->body, dh, AP_KIR_SHFL_XOR, ap_kir_cast(k, AP_DT_F16, v), ap_kir_i64(k, 2),
		    (unsigned)widths[0]);
	ap_kir_store(k, &k->body, outh, gid, ap_kir_ref(k, dh));

	host_fn f = print_and_load(k, &host, &cuda, &h);
	snprintf(mask, sizeof(mask), "__shfl_xor_sync(0x%xu, ", nt % 32 ? (1u << nt) - 1 : 0xffffffffu);
	ck_assert_msg(strstr(cuda, mask) != NULL, "no '%s'", mask);
	ck_assert_ptr_nonnull(strstr(cuda, "__shfl_sync("));
	ck_assert_ptr_nonnull(strstr(cuda, "__shfl_up_sync("));
	ck_assert_ptr_nonnull(strstr(cuda, "__shfl_down_sync("));
	ck_assert_ptr_nonnull(strstr(host, "ap_shfl_int[ap_t] = "));
	ck_assert_ptr_nonnull(strstr(host, "ap_shfl_half["));
	ck_assert_ptr_null(strstr(host, "_sync("));   /* named in comments only */

	vals = malloc(GRID * nt * sizeof(int));
	got = calloc((size_t)nshfl * GRID * nt, sizeof(int));
	gotf = calloc(GRID * nt, sizeof(float));
	goth = calloc(GRID * nt, sizeof(uint16_t));
	for (unsigned t = 0; t < GRID * nt; t++)
		vals[t] = (int)(t * 7919u % 1000u) - 500;
	void *args[4] = {got, gotf, goth, vals};
	run_all_blocks(f, k, args);
	for (unsigned b = 0; b < GRID; b++) {
		const int *bv = vals + b * nt;

		j = 0;
		for (int kind = 0; kind < 4; kind++)
			for (int w = 0; w < nw; w++)
				for (int l = 0; l < N_LANES; l++, j++)
					for (unsigned t = 0; t < nt; t++)
						ck_assert_msg(got[(size_t)j * GRID * nt + b * nt + t] ==
							      ref_shfl(kind, bv, nt, t, shfl_lanes[l], widths[w]),
							      "block %ux%u kind %d width %d lane %d thread %u: %d, want %d",
							      bx, by, kind, widths[w], shfl_lanes[l], t,
							      got[(size_t)j * GRID * nt + b * nt + t],
							      ref_shfl(kind, bv, nt, t, shfl_lanes[l], widths[w]));
		for (unsigned t = 0; t < nt; t++) {
			int want = ref_shfl(AP_KIR_SHFL_IDX, bv, nt, t, (int)((t * 3 + 1) % 32),
					    widths[nw - 1]);

			ck_assert_int_eq(got[(size_t)j * GRID * nt + b * nt + t], want);
			ck_assert_float_eq(gotf[b * nt + t],
					   (float)ref_shfl(AP_KIR_SHFL_DOWN, bv, nt, t, 1, widths[0]));
			ck_assert_uint_eq(goth[b * nt + t],
					  ap_kir_f32_to_f16((float)ref_shfl(AP_KIR_SHFL_XOR, bv, nt, t, 2, widths[0])));
		}
	}
	dlclose(h);
	ptx = nvrtc_ptx(cuda, "shfl", true);
	if (ptx) {
		ck_assert_ptr_nonnull(strstr(ptx, "shfl.sync.bfly"));
		ck_assert_ptr_nonnull(strstr(ptx, "shfl.sync.idx"));
	}
	free(ptx);
	free(vals);
	free(got);
	free(gotf);
	free(goth);
	free(host);
	free(cuda);
	ap_kir_kernel_free(k);
}

START_TEST(shfl_block_32)
{
	static const int w[] = {32, 16, 8, 4};

	run_shfl(32, 1, w, 4);
}
END_TEST

START_TEST(shfl_block_64_2d)
{
	static const int w[] = {32, 16, 8, 4};

	run_shfl(16, 4, w, 4);   /* warps of linear ids x + 16 y */
}
END_TEST

START_TEST(shfl_block_96)
{
	static const int w[] = {32, 16, 8, 4};

	run_shfl(32, 3, w, 4);
}
END_TEST

START_TEST(shfl_block_8)
{
	static const int w[] = {8, 4};

	run_shfl(8, 1, w, 2);   /* one partial warp: mask 0xff */
}
END_TEST

/* Sum of 256 values per block: butterflies of xor shuffles (width 32)
 * inside a uniform, fully unrolled loop (lane 16 >> i), per-warp sums
 * through shared memory, then xor shuffles of width 8 over them. */
START_TEST(shfl_tree_sum_256)
{
	enum { NT = 256, GRID = 4, NW = NT / 32 };
	static float xs[GRID * NT], sums[GRID];
	ap_kir_kernel *k = ap_kir_kernel_new("warp_sum");
	ap_kir_array *out, *x, *sh;
	ap_kir_expr *t, *zero;
	ap_kir_var *v, *i, *tmp, *w, *tmp2;
	ap_kir_stmt *loop, *st;
	char *host, *cuda, *ptx;
	void *h = NULL;

	k->grid[0] = GRID;
	k->block[0] = NT;
	out = ap_kir_param(k, "out", AP_DT_F32, true, -1);
	x = ap_kir_param(k, "x", AP_DT_F32, false, -1);
	sh = ap_kir_shared(k, "sh", AP_DT_F32, NW);
	t = ap_kir_index_of(k, AP_KIR_THREAD_X);
	zero = ap_kir_float(k, AP_DT_F32, 0);
	v = ap_kir_var_new(k, AP_DT_F32, "v");
	ap_kir_let(k, &k->body, v,
		   ap_kir_load(k, x, ap_kir_add(k, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_BLOCK_X), NT), t)));
	i = ap_kir_var_new(k, AP_DT_I64, "i");
	loop = ap_kir_for_unroll(k, &k->body, i, ap_kir_i64(k, 0), ap_kir_i64(k, 5), 1, -1);
	tmp = ap_kir_var_new(k, AP_DT_F32, "tmp");
	ap_kir_let(k, &loop->body, tmp, NULL);
	ap_kir_shfl(k, &loop->body, tmp, AP_KIR_SHFL_XOR, ap_kir_ref(k, v),
		    ap_kir_binary(k, AP_KIR_SHR, ap_kir_i64(k, 16), ap_kir_ref(k, i)), 32);
	ap_kir_assign(k, &loop->body, v, ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, v), ap_kir_ref(k, tmp)));
	st = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_EQ, ap_kir_binary(k, AP_KIR_AND, t, ap_kir_i64(k, 31)),
						  ap_kir_i64(k, 0)));
	ap_kir_store(k, &st->body, sh, ap_kir_binary(k, AP_KIR_SHR, t, ap_kir_i64(k, 5)), ap_kir_ref(k, v));
	ap_kir_barrier(k, &k->body);
	w = ap_kir_var_new(k, AP_DT_F32, "w");
	ap_kir_let(k, &k->body, w,
		   ap_kir_select(k, ap_kir_binary(k, AP_KIR_LT, t, ap_kir_i64(k, NW)),
				 ap_kir_load(k, sh, ap_kir_binary(k, AP_KIR_AND, t, ap_kir_i64(k, NW - 1))), zero));
	for (int m = NW / 2; m > 0; m /= 2) {
		tmp2 = ap_kir_var_new(k, AP_DT_F32, "tmp");
		ap_kir_let(k, &k->body, tmp2, NULL);
		ap_kir_shfl(k, &k->body, tmp2, AP_KIR_SHFL_XOR, ap_kir_ref(k, w), ap_kir_i64(k, m), NW);
		ap_kir_assign(k, &k->body, w, ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, w), ap_kir_ref(k, tmp2)));
	}
	st = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_EQ, t, ap_kir_i64(k, 0)));
	ap_kir_store(k, &st->body, out, ap_kir_index_of(k, AP_KIR_BLOCK_X), ap_kir_ref(k, w));

	host_fn f = print_and_load(k, &host, &cuda, &h);
	ck_assert_ptr_nonnull(strstr(cuda, "#pragma unroll\n"));
	ck_assert_ptr_nonnull(strstr(cuda, "__shfl_xor_sync(0xffffffffu, v"));
	ck_assert_ptr_null(strstr(host, "pragma"));
	ck_assert_ptr_null(strstr(cuda, "#include"));
	for (int j = 0; j < GRID * NT; j++)
		xs[j] = (float)((j * 37) % 201 - 100);
	void *args[2] = {sums, xs};
	run_all_blocks(f, k, args);
	for (int b = 0; b < GRID; b++) {
		double ref = 0;

		for (int j = 0; j < NT; j++)
			ref += xs[b * NT + j];
		ck_assert_msg(sums[b] == (float)ref, "block %d: %g, want %g", b, sums[b], ref);
	}
	dlclose(h);
	ptx = nvrtc_ptx(cuda, "warp_sum", false);
	if (ptx)
		ck_assert_ptr_nonnull(strstr(ptx, "shfl.sync.bfly.b32"));
	free(ptx);
	free(host);
	free(cuda);
	ap_kir_kernel_free(k);
}
END_TEST

/* The builder's refusals, and the host printer's: a shuffle under a
 * thread-dependent condition. */
START_TEST(shfl_refused)
{
	ap_kir_kernel *k = ap_kir_kernel_new("bad_shfl");
	ap_kir_var *d = ap_kir_var_new(k, AP_DT_F32, "d"), *e = ap_kir_var_new(k, AP_DT_I32, "e");
	ap_kir_expr *one = ap_kir_float(k, AP_DT_F32, 1), *lane = ap_kir_i64(k, 1);
	ap_kir_stmt *st;
	ap_error err;

	k->block[0] = 32;
	ck_assert_ptr_null(ap_kir_shfl(k, &k->body, NULL, AP_KIR_SHFL_XOR, one, lane, 32));
	ck_assert(ap_kir_failed(k));
	ap_kir_kernel_free(k);

	static const struct { int kind; int width; bool float_lane, wrong_type, self; } bad[] = {
		{ AP_KIR_SHFL_XOR, 0, false, false, false }, { AP_KIR_SHFL_XOR, 12, false, false, false },
		{ AP_KIR_SHFL_XOR, 64, false, false, false }, { 4, 32, false, false, false },
		{ AP_KIR_SHFL_UP, 32, true, false, false }, { AP_KIR_SHFL_UP, 32, false, true, false },
		{ AP_KIR_SHFL_UP, 32, false, false, true },
	};
	for (size_t r = 0; r < sizeof(bad) / sizeof(bad[0]); r++) {
		k = ap_kir_kernel_new("bad_shfl");
		d = ap_kir_var_new(k, AP_DT_F32, "d");
		e = ap_kir_var_new(k, AP_DT_I32, "e");
		one = ap_kir_float(k, AP_DT_F32, 1);
		ck_assert_ptr_null(ap_kir_shfl(k, &k->body, bad[r].wrong_type ? e : d, bad[r].kind,
					       bad[r].self ? ap_kir_ref(k, d) : one,
					       bad[r].float_lane ? one : ap_kir_i64(k, 1),
					       (unsigned)bad[r].width));
		ck_assert_msg(ap_kir_failed(k), "row %zu", r);
		ap_kir_kernel_free(k);
	}

	k = ap_kir_kernel_new("bad_shfl");
	k->block[0] = 32;
	d = ap_kir_var_new(k, AP_DT_F32, "d");
	ap_kir_let(k, &k->body, d, ap_kir_float(k, AP_DT_F32, 0));
	st = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_LT, ap_kir_index_of(k, AP_KIR_THREAD_X),
						  ap_kir_i64(k, 16)));
	ap_kir_shfl(k, &st->body, d, AP_KIR_SHFL_XOR, ap_kir_float(k, AP_DT_F32, 2), ap_kir_i64(k, 1), 32);
	ck_assert(!ap_kir_failed(k));
	ap_error_clear(&err);
	ck_assert_ptr_null(ap_kir_print(k, AP_KIR_HOST, &err));
	ck_assert_ptr_nonnull(strstr(err.msg, "thread index"));
	ck_assert_int_eq(ap_kir_verify(k, NULL, &err), AP_EINTERNAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "rule uniform"));
	ap_kir_kernel_free(k);
}
END_TEST
/* ---- vector loads and stores ----------------------------------------------------- */

static const struct { ap_dtype type; int width; const char *cuda; } vec_rows[] = {
	{ AP_DT_F32, 4, "float4" },  { AP_DT_F32, 2, "float2" },
	{ AP_DT_F64, 2, "double2" }, { AP_DT_I32, 4, "int4" },
	{ AP_DT_I32, 2, "int2" },    { AP_DT_I64, 2, "longlong2" },
	{ AP_DT_I8, 4, "char4" },    { AP_DT_U8, 4, "uchar4" },
	{ AP_DT_BOOL, 4, "uchar4" }, { AP_DT_F16, 2, "__half2" },
	{ AP_DT_F16, 4, "uint2" },   { AP_DT_F16, 8, "uint4" },
	{ AP_DT_BF16, 2, "__nv_bfloat162" }, { AP_DT_BF16, 8, "uint4" },
};
#define N_VEC ((int)(sizeof(vec_rows) / sizeof(vec_rows[0])))

START_TEST(vector_width_rules)
{
	static const struct { ap_dtype t; int w; bool ok; } rows[] = {
		{ AP_DT_F32, 2, true }, { AP_DT_F32, 4, true }, { AP_DT_F32, 8, false },
		{ AP_DT_F32, 3, false }, { AP_DT_F32, 1, false }, { AP_DT_F64, 2, true },
		{ AP_DT_F64, 4, false }, { AP_DT_I64, 2, true }, { AP_DT_I8, 4, true },
		{ AP_DT_I8, 2, false }, { AP_DT_U8, 8, false }, { AP_DT_BOOL, 4, true },
		{ AP_DT_F16, 2, true }, { AP_DT_F16, 4, true }, { AP_DT_F16, 8, true },
		{ AP_DT_BF16, 8, true }, { AP_DT_F16, 16, false }, { AP_DT_UNDEF, 4, false },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		ck_assert_msg(ap_kir_vector_ok(rows[i].t, rows[i].w) == rows[i].ok, "%s x %d",
			      ap_dtype_name(rows[i].t), rows[i].w);
	for (int i = 0; i < N_VEC; i++)
		ck_assert(ap_kir_vector_ok(vec_rows[i].type, vec_rows[i].width));
}
END_TEST

/* Every vector type: out[g*w + j] = in[g*w + w-1-j] through a vector load
 * and a vector store; float4 also through shared memory (to the next
 * thread's slot, across a barrier, so the host keeps the registers per
 * thread) and from constant data, inside a loop unrolled by 2. */
START_TEST(vector_loads_stores)
{
	enum { NT = 64, GRID = 2, NG = NT * GRID };
	const float cdata[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	ap_kir_kernel *k = ap_kir_kernel_new("vec");
	ap_kir_array *in[N_VEC], *out[N_VEC], *sh, *o2, *o3, *cst;
	ap_kir_expr *lin, *g, *vals[8];
	ap_kir_var *dst[8], *r;
	ap_kir_stmt *loop;
	unsigned char *bin[N_VEC], *bout[N_VEC];
	static float got2[NG * 4], got3[NG * 8];
	void *args[2 * N_VEC + 2];
	char *host, *cuda, *ptx;
	void *h = NULL;

	k->grid[0] = GRID;
	k->block[0] = NT;
	lin = ap_kir_index_of(k, AP_KIR_THREAD_X);
	g = ap_kir_bind(k, &k->body, AP_DT_I64, "g",
			ap_kir_add(k, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_BLOCK_X), NT), lin));
	for (int i = 0; i < N_VEC; i++) {
		char name[32];
		int w = vec_rows[i].width;

		snprintf(name, sizeof(name), "o%d", i);
		out[i] = ap_kir_param(k, name, vec_rows[i].type, true, -1);
		snprintf(name, sizeof(name), "in%d", i);
		in[i] = ap_kir_param(k, name, vec_rows[i].type, false, -1);
		for (int j = 0; j < w; j++)
			dst[j] = ap_kir_var_new(k, vec_rows[i].type, "e");
		ck_assert_ptr_nonnull(ap_kir_vload(k, &k->body, in[i], ap_kir_muli(k, g, w), w, dst));
		for (int j = 0; j < w; j++)
			vals[j] = ap_kir_ref(k, dst[w - 1 - j]);
		ck_assert_ptr_nonnull(ap_kir_vstore(k, &k->body, out[i], ap_kir_muli(k, g, w), w, vals));
	}
	/* float4 through shared memory: thread t stores its 4 at t, reads t+1's */
	o2 = ap_kir_param(k, "o2s", AP_DT_F32, true, -1);
	o3 = ap_kir_param(k, "o3c", AP_DT_F32, true, -1);
	sh = ap_kir_shared(k, "sh", AP_DT_F32, NT * 4);
	cst = ap_kir_const_array(k, "c", AP_DT_F32, 8, cdata);
	for (int j = 0; j < 4; j++)
		dst[j] = ap_kir_var_new(k, AP_DT_F32, "s");
	ap_kir_vload(k, &k->body, in[0], ap_kir_muli(k, g, 4), 4, dst);
	for (int j = 0; j < 4; j++)
		vals[j] = ap_kir_binary(k, AP_KIR_MUL, ap_kir_ref(k, dst[j]), ap_kir_float(k, AP_DT_F32, 2));
	ap_kir_vstore(k, &k->body, sh, ap_kir_muli(k, lin, 4), 4, vals);
	ap_kir_barrier(k, &k->body);
	for (int j = 0; j < 4; j++)
		dst[j] = ap_kir_var_new(k, AP_DT_F32, "n");
	ap_kir_vload(k, &k->body, sh,
		     ap_kir_muli(k, ap_kir_binary(k, AP_KIR_REM, ap_kir_addi(k, lin, 1), ap_kir_i64(k, NT)), 4),
		     4, dst);
	for (int j = 0; j < 4; j++)
		vals[j] = ap_kir_ref(k, dst[j]);
	ap_kir_vstore(k, &k->body, o2, ap_kir_muli(k, g, 4), 4, vals);
	r = ap_kir_var_new(k, AP_DT_I64, "r");
	loop = ap_kir_for_unroll(k, &k->body, r, ap_kir_i64(k, 0), ap_kir_i64(k, 2), 1, 2);
	for (int j = 0; j < 4; j++)
		dst[j] = ap_kir_var_new(k, AP_DT_F32, "c");
	ap_kir_vload(k, &loop->body, cst, ap_kir_muli(k, ap_kir_ref(k, r), 4), 4, dst);
	for (int j = 0; j < 4; j++)
		vals[j] = ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, dst[j]),
					ap_kir_cast(k, AP_DT_F32, ap_kir_ref(k, r)));
	ap_kir_vstore(k, &loop->body, o3, ap_kir_add(k, ap_kir_muli(k, g, 8), ap_kir_muli(k, ap_kir_ref(k, r), 4)),
		      4, vals);

	host_fn f = print_and_load(k, &host, &cuda, &h);
	for (int i = 0; i < N_VEC; i++) {
		char want[64];

		snprintf(want, sizeof(want), "const %s ap_vec = *(const %s *)(in%d + ", vec_rows[i].cuda,
			 vec_rows[i].cuda, i);
		ck_assert_msg(strstr(cuda, want) != NULL, "no '%s'", want);
		snprintf(want, sizeof(want), "*(%s *)(o%d + ", vec_rows[i].cuda, i);
		ck_assert_msg(strstr(cuda, want) != NULL, "no '%s'", want);
	}
	ck_assert_ptr_nonnull(strstr(cuda, "__shared__ __align__(16) float sh[256];"));
	ck_assert_ptr_nonnull(strstr(cuda, "__device__ __align__(16) const float vec_c[8]"));
	ck_assert_ptr_nonnull(strstr(cuda, "#pragma unroll 2\n"));
	ck_assert_ptr_null(strstr(host, "float4"));

	for (int i = 0; i < N_VEC; i++) {
		size_t n = (size_t)NG * vec_rows[i].width * ap_dtype_size(vec_rows[i].type);

		bin[i] = malloc(n);
		bout[i] = calloc(1, n);
		for (size_t b = 0; b < n; b++)
			bin[i][b] = (unsigned char)(b * 131 + i);
		if (vec_rows[i].type == AP_DT_BOOL)
			for (size_t b = 0; b < n; b++)
				bin[i][b] &= 1;
		args[2 * i] = bout[i];
		args[2 * i + 1] = bin[i];
	}
	args[2 * N_VEC] = got2;
	args[2 * N_VEC + 1] = got3;
	run_all_blocks(f, k, args);
	for (int i = 0; i < N_VEC; i++) {
		size_t es = ap_dtype_size(vec_rows[i].type);
		int w = vec_rows[i].width;

		for (int e = 0; e < NG * w; e++) {
			int src = e / w * w + (w - 1 - e % w);

			ck_assert_msg(!memcmp(bout[i] + (size_t)e * es, bin[i] + (size_t)src * es, es),
				      "%s x %d: element %d", ap_dtype_name(vec_rows[i].type), w, e);
		}
	}
	for (int gi = 0; gi < NG; gi++) {
		int b = gi / NT, t = gi % NT, nb = b * NT + (t + 1) % NT;
		const float *x = (const float *)bin[0];

		for (int j = 0; j < 4; j++) {
			ck_assert_float_eq(got2[gi * 4 + j], 2 * x[nb * 4 + j]);
			ck_assert_float_eq(got3[gi * 8 + j], cdata[j]);
			ck_assert_float_eq(got3[gi * 8 + 4 + j], cdata[4 + j] + 1);
		}
	}
	dlclose(h);
	ptx = nvrtc_ptx(cuda, "vec", true);
	if (ptx) {
		ck_assert(strstr(ptx, "ld.global.nc.v4.f32") || strstr(ptx, "ld.global.v4.f32"));
		ck_assert_ptr_nonnull(strstr(ptx, "st.global.v4.f32"));
		ck_assert_ptr_nonnull(strstr(ptx, "st.shared.v4.f32"));
		ck_assert_ptr_nonnull(strstr(ptx, "ld.shared.v4.f32"));
		ck_assert_ptr_nonnull(strstr(ptx, "v2.f64"));
	}
	free(ptx);
	for (int i = 0; i < N_VEC; i++) {
		free(bin[i]);
		free(bout[i]);
	}
	free(host);
	free(cuda);
	ap_kir_kernel_free(k);
}
END_TEST
/* ---- integer operators -------------------------------------------------------------- */

static int64_t ref_floordiv(int64_t a, int64_t b)
{
	int64_t q = a / b;

	return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

START_TEST(int_ops_fold)
{
	ap_kir_kernel *k = ap_kir_kernel_new("iops");
	ap_kir_var *v = ap_kir_var_new(k, AP_DT_I64, "v");
	ap_kir_expr *x = ap_kir_ref(k, v);
	static const struct { ap_kir_binop op; int64_t a, b, r; } rows[] = {
		{ AP_KIR_AND, 12, 10, 8 }, { AP_KIR_OR, 12, 10, 14 }, { AP_KIR_XOR, 12, 10, 6 },
		{ AP_KIR_SHL, 3, 4, 48 }, { AP_KIR_SHR, 48, 4, 3 }, { AP_KIR_SHR, -17, 2, -5 },
		{ AP_KIR_SHL, -1, 63, INT64_MIN },
		{ AP_KIR_FLOORDIV, 7, 2, 3 }, { AP_KIR_FLOORDIV, -7, 2, -4 },
		{ AP_KIR_FLOORDIV, 7, -2, -4 }, { AP_KIR_FLOORDIV, -7, -2, 3 },
		{ AP_KIR_FLOORDIV, -8, 2, -4 }, { AP_KIR_FLOORDIV, 0, -3, 0 },
		{ AP_KIR_AND, -1, 255, 255 },
	};
	int64_t c;

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		ap_kir_expr *e = ap_kir_binary(k, rows[i].op, ap_kir_i64(k, rows[i].a), ap_kir_i64(k, rows[i].b));

		ck_assert_msg(ap_kir_is_int(e, &c) && c == rows[i].r, "row %zu: %lld", i, (long long)c);
	}
	/* wraps to the type; shifts out of range and division by zero stay */
	ck_assert(ap_kir_is_int(ap_kir_binary(k, AP_KIR_SHL, ap_kir_int(k, AP_DT_I32, 0x40000000),
					      ap_kir_int(k, AP_DT_I32, 1)), &c) && c == INT32_MIN);
	ck_assert(!ap_kir_is_int(ap_kir_binary(k, AP_KIR_SHL, ap_kir_int(k, AP_DT_I32, 1),
					       ap_kir_int(k, AP_DT_I32, 32)), NULL));
	ck_assert(!ap_kir_is_int(ap_kir_binary(k, AP_KIR_SHR, ap_kir_i64(k, 1), ap_kir_i64(k, -1)), NULL));
	ck_assert(!ap_kir_is_int(ap_kir_binary(k, AP_KIR_FLOORDIV, ap_kir_i64(k, 1), ap_kir_i64(k, 0)), NULL));
	/* identities */
	ck_assert_ptr_eq(ap_kir_binary(k, AP_KIR_OR, x, ap_kir_i64(k, 0)), x);
	ck_assert_ptr_eq(ap_kir_binary(k, AP_KIR_XOR, x, ap_kir_i64(k, 0)), x);
	ck_assert_ptr_eq(ap_kir_binary(k, AP_KIR_SHL, x, ap_kir_i64(k, 0)), x);
	ck_assert_ptr_eq(ap_kir_binary(k, AP_KIR_SHR, x, ap_kir_i64(k, 0)), x);
	ck_assert_ptr_eq(ap_kir_binary(k, AP_KIR_FLOORDIV, x, ap_kir_i64(k, 1)), x);
	ck_assert_int_eq(ap_kir_binary(k, AP_KIR_AND, x, ap_kir_i64(k, 7))->type, AP_DT_I64);
	/* the enum was appended to, not renumbered */
	ck_assert_int_eq(AP_KIR_MAX, 14);
	ck_assert_int_eq(AP_KIR_AND, 15);
	ck_assert_int_eq(AP_KIR_FLOORDIV, 20);
	ck_assert_int_eq(AP_KIR_S_COMMENT, 6);
	ck_assert(!ap_kir_failed(k));
	ap_kir_kernel_free(k);
}
END_TEST

/* The operators at run time on the host, I64 and I32, against C: every
 * (a, b) of a grid with negative values, floor division by every sign. */
START_TEST(int_ops_host)
{
	enum { NA = 41, NB = 10, N = NA * NB };
	static const ap_kir_binop ops[] = { AP_KIR_AND, AP_KIR_OR, AP_KIR_XOR, AP_KIR_SHL, AP_KIR_SHR,
					    AP_KIR_FLOORDIV };
	enum { NOPS = 6 };
	static int64_t a64[N], b64[N], o64[NOPS][N];
	static int32_t a32[N], b32[N], o32[NOPS][N];
	ap_kir_kernel *k = ap_kir_kernel_new("iops_host");
	ap_kir_array *A[2], *B[2], *O[2][NOPS];
	ap_kir_expr *i;
	char *host, *cuda, *ptx;
	void *h = NULL, *args[2 * NOPS + 4];

	k->grid[0] = 5;
	k->block[0] = 82;
	for (int t = 0; t < 2; t++)
		for (int o = 0; o < NOPS; o++) {
			char name[32];

			snprintf(name, sizeof(name), "o%d_%d", t, o);
			O[t][o] = ap_kir_param(k, name, t ? AP_DT_I32 : AP_DT_I64, true, -1);
		}
	A[0] = ap_kir_param(k, "a64", AP_DT_I64, false, -1);
	B[0] = ap_kir_param(k, "b64", AP_DT_I64, false, -1);
	A[1] = ap_kir_param(k, "a32", AP_DT_I32, false, -1);
	B[1] = ap_kir_param(k, "b32", AP_DT_I32, false, -1);
	i = ap_kir_bind(k, &k->body, AP_DT_I64, "i",
			ap_kir_add(k, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_BLOCK_X), 82),
				   ap_kir_index_of(k, AP_KIR_THREAD_X)));
	for (int t = 0; t < 2; t++)
		for (int o = 0; o < NOPS; o++) {
			ap_kir_expr *b = ap_kir_load(k, B[t], i);

			if (ops[o] == AP_KIR_SHL || ops[o] == AP_KIR_SHR)  /* counts 0..9 */
				b = ap_kir_binary(k, AP_KIR_AND, b, ap_kir_int(k, b->type, 7));
			ap_kir_store(k, &k->body, O[t][o], i, ap_kir_binary(k, ops[o], ap_kir_load(k, A[t], i), b));
		}
	host_fn f = print_and_load(k, &host, &cuda, &h);
	ck_assert_ptr_nonnull(strstr(cuda, "((long long)((unsigned long long)"));
	ck_assert_ptr_nonnull(strstr(cuda, " != 0) && (("));
	for (int j = 0; j < N; j++) {
		int64_t a = j / NB - 20, b = (j % NB) - 5;

		if (b >= 0)
			b++;   /* -5..-1, 1..5 */
		if (j % 7 == 0)
			a *= 1000003;
		a64[j] = a;
		b64[j] = b;
		a32[j] = (int32_t)a;
		b32[j] = (int32_t)b;
	}
	for (int t = 0; t < 2; t++)
		for (int o = 0; o < NOPS; o++)
			args[t * NOPS + o] = t ? (void *)o32[o] : (void *)o64[o];
	args[2 * NOPS] = a64;
	args[2 * NOPS + 1] = b64;
	args[2 * NOPS + 2] = a32;
	args[2 * NOPS + 3] = b32;
	run_all_blocks(f, k, args);
	for (int j = 0; j < N; j++) {
		int64_t a = a64[j], b = b64[j], s = b & 7;
		int64_t want[NOPS] = { a & b, a | b, a ^ b, (int64_t)((uint64_t)a << s),
				       a < 0 ? ~(~a >> s) : a >> s, ref_floordiv(a, b) };

		for (int o = 0; o < NOPS; o++) {
			ck_assert_msg(o64[o][j] == want[o], "i64 op %d (%lld, %lld): %lld, want %lld", o,
				      (long long)a, (long long)b, (long long)o64[o][j], (long long)want[o]);
			ck_assert_msg(o32[o][j] == (int32_t)(o == 3 ? (int64_t)(int32_t)((uint32_t)a << s)
								    : want[o]),
				      "i32 op %d (%lld, %lld): %d", o, (long long)a, (long long)b, o32[o][j]);
		}
	}
	dlclose(h);
	ptx = nvrtc_ptx(cuda, "iops_host", false);
	free(ptx);
	free(host);
	free(cuda);
	ap_kir_kernel_free(k);
}
END_TEST

/* ---- visitor ---------------------------------------------------------------------------- */

typedef struct visit_log {
	int n_stmt, n_expr, max_depth, stop_at;
	char kinds[64];
	const ap_kir_stmt *last;
	bool expr_of_last_ok;
} visit_log;

static int on_stmt(const ap_kir_stmt *s, int depth, void *user)
{
	visit_log *l = user;

	if (l->n_stmt < 63)
		l->kinds[l->n_stmt] = (char)('0' + s->kind);
	l->n_stmt++;
	if (depth > l->max_depth)
		l->max_depth = depth;
	l->last = s;
	return l->stop_at && l->n_stmt == l->stop_at ? 42 : 0;
}

static int on_expr(const ap_kir_expr *e, const ap_kir_stmt *s, void *user)
{
	visit_log *l = user;

	l->n_expr++;
	if (s != l->last)
		l->expr_of_last_ok = false;
	return 0;
}

START_TEST(visitor_order)
{
	ap_kir_kernel *k = build_rowsum(4, 8, 2, 8, 1, false);
	ap_kir_visitor v = { on_stmt, on_expr };
	visit_log l = { .expr_of_last_ok = true };
	ap_kir_kernel *e = ap_kir_kernel_new("empty");

	ck_assert_int_eq(ap_kir_visit(k, &v, &l), 0);
	/* for row { let t; let acc; for r { assign }; store; barrier;
	 * (if { store }; barrier) x3; if { store }; barrier } */
	ck_assert_str_eq(l.kinds, "0220345145145145145");
	ck_assert_int_eq(l.max_depth, 2);
	ck_assert(l.expr_of_last_ok);   /* a statement's expressions right after it */
	ck_assert_int_gt(l.n_expr, 40);
	memset(&l, 0, sizeof(l));
	l.stop_at = 5;
	ck_assert_int_eq(ap_kir_visit(k, &v, &l), 42);
	ck_assert_int_eq(l.n_stmt, 5);
	ck_assert_int_eq(ap_kir_visit(e, &v, &l), 0);
	ck_assert_int_eq(ap_kir_visit(NULL, &v, &l), 0);
	ap_kir_visitor only_stmt = { on_stmt, NULL };
	memset(&l, 0, sizeof(l));
	ck_assert_int_eq(ap_kir_visit(k, &only_stmt, &l), 0);
	ck_assert_int_eq(l.n_expr, 0);
	ck_assert_int_eq(l.n_stmt, 19);
	ap_kir_kernel_free(e);
	ap_kir_kernel_free(k);
}
END_TEST

static int first_expr(const ap_kir_expr *e, const ap_kir_stmt *s, void *user)
{
	const ap_kir_expr **out = user;

	if (!*out)
		*out = e;
	return 0;
}

START_TEST(visitor_post_order)
{
	ap_kir_kernel *k = ap_kir_kernel_new("post");
	ap_kir_array *o = ap_kir_param(k, "o", AP_DT_I64, true, -1);
	ap_kir_expr *a = ap_kir_index_of(k, AP_KIR_THREAD_X);
	const ap_kir_expr *first = NULL;
	ap_kir_visitor v = { NULL, first_expr };

	k->block[0] = 4;
	ap_kir_store(k, &k->body, o, a, ap_kir_binary(k, AP_KIR_MUL, ap_kir_addi(k, a, 1), a));
	ck_assert_int_eq(ap_kir_visit(k, &v, &first), 0);
	ck_assert_ptr_eq(first, a);   /* the index (first field), before anything else */
	ap_kir_kernel_free(k);
}
END_TEST
/* ---- clone: stitching two kernels into one launch ----------------------------------- */

/* out[g] = x[g] * 2 + c[g % 4] + blockIdx.y, g over a grid of 3 blocks of
 * 16x4 threads (blockIdx.y has extent 1: it reads 0). */
static ap_kir_kernel *build_scale(void)
{
	const float cdata[4] = {0.5f, -1.0f, 2.0f, 0.25f};
	ap_kir_kernel *k = ap_kir_kernel_new("scale");
	ap_kir_array *out, *x, *c;
	ap_kir_expr *g, *v;

	k->grid[0] = 3;
	k->block[0] = 16;
	k->block[1] = 4;
	out = ap_kir_param(k, "p0", AP_DT_F32, true, 7);
	x = ap_kir_param(k, "p1", AP_DT_F32, false, 8);
	c = ap_kir_const_array(k, "c0", AP_DT_F32, 4, cdata);
	g = ap_kir_bind(k, &k->body, AP_DT_I64, "g",
			ap_kir_add(k, ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_BLOCK_X), 64),
				   ap_kir_add(k, ap_kir_index_of(k, AP_KIR_THREAD_X),
					      ap_kir_muli(k, ap_kir_index_of(k, AP_KIR_THREAD_Y), 16))));
	v = ap_kir_binary(k, AP_KIR_ADD,
			  ap_kir_binary(k, AP_KIR_MUL, ap_kir_load(k, x, g), ap_kir_float(k, AP_DT_F32, 2)),
			  ap_kir_load(k, c, ap_kir_binary(k, AP_KIR_REM, g, ap_kir_i64(k, 4))));
	v = ap_kir_binary(k, AP_KIR_ADD, v,
			  ap_kir_cast(k, AP_DT_F32, ap_kir_index_of(k, AP_KIR_BLOCK_Y)));
	ap_kir_store(k, &k->body, out, g, v);
	return k;
}

static int count_block_y(const ap_kir_expr *e, const ap_kir_stmt *s, void *user)
{
	if (e->kind == AP_KIR_E_INDEX && e->op == AP_KIR_BLOCK_Y)
		++*(int *)user;
	return 0;
}

/* A (grid 3) and B (a row-sum with dynamic shared memory and barriers,
 * grid 5) merged into one kernel of grid 8:
 *   if (blockIdx.x < 3) { A } else { B with blockIdx.x - 3 }
 * sharing A's input buffer; on the host it computes what the two compute
 * separately, bit for bit. */
START_TEST(clone_stitch_two_kernels)
{
	enum { M = 13, R = 50 };
	ap_kir_kernel *a = build_scale(), *b = build_rowsum(M, R, 5, 16, 4, true);
	ap_kir_kernel *m = ap_kir_kernel_new("merged");
	ap_kir_array *arr_a[8] = {0}, *arr_b[8] = {0};
	ap_kir_subst sa = { .arrays = arr_a, .prefix = "a_" }, sb = { .arrays = arr_b, .prefix = "b_" };
	ap_kir_stmt *split;
	ap_kir_expr *bx;
	static float x[M * R], oa1[192], oa2[192], ob1[M], ob2[M];
	char *host, *cuda, *ptx, *ha, *ca, *hb, *cb;
	void *h = NULL, *h1 = NULL, *h2 = NULL;
	const ap_kir_visitor by = { NULL, count_block_y };
	int n_by = 0;

	ck_assert(!ap_kir_failed(a) && !ap_kir_failed(b));
	m->grid[0] = 8;
	m->block[0] = 16;
	m->block[1] = 4;
	bx = ap_kir_index_of(m, AP_KIR_BLOCK_X);
	split = ap_kir_if(m, &m->body, ap_kir_binary(m, AP_KIR_LT, bx, ap_kir_i64(m, 3)));
	sa.index[AP_KIR_BLOCK_X] = bx;
	ck_assert_int_eq(ap_kir_clone_into(m, &split->body, a, &sa), 0);
	arr_b[1] = arr_a[1];    /* B's input is A's input buffer */
	sb.index[AP_KIR_BLOCK_X] = ap_kir_addi(m, bx, -3);
	ck_assert_int_eq(ap_kir_clone_into(m, &split->orelse, b, &sb), 0);
	ck_assert(!ap_kir_failed(m));

	/* the mapping: A's params first, then B's new one; dynamic shared placed */
	ck_assert_int_eq(m->n_params, 3);
	ck_assert_str_eq(arr_a[0]->name, "a_p0");
	ck_assert_int_eq(arr_a[0]->param, 0);
	ck_assert(arr_a[0]->written && arr_a[0]->tensor == 7);
	ck_assert_int_eq(arr_a[1]->param, 1);
	ck_assert(!arr_a[1]->written && arr_a[1]->tensor == 8);
	ck_assert_int_eq(arr_a[2]->space, AP_KIR_CONST);
	ck_assert_str_eq(arr_a[2]->name, "a_c0");
	ck_assert_int_eq(memcmp(arr_a[2]->data, a->arrays[2]->data, 16), 0);
	ck_assert_str_eq(arr_b[0]->name, "b_p0");
	ck_assert_int_eq(arr_b[0]->param, 2);
	ck_assert_ptr_eq(arr_b[1], arr_a[1]);
	ck_assert_int_eq(arr_b[2]->space, AP_KIR_SHARED_DYN);
	ck_assert_uint_eq(m->smem_bytes, b->smem_bytes);
	/* blockIdx.y (extent 1 in A) became 0 */
	ap_kir_visit(m, &by, &n_by);
	ck_assert_int_eq(n_by, 0);
	/* the sources are untouched */
	ck_assert_int_eq(a->n_params, 2);
	ck_assert_int_eq(b->n_arrays, 3);

	host_fn f = print_and_load(m, &host, &cuda, &h);
	host_fn fa = print_and_load(a, &ha, &ca, &h1);
	host_fn fb = print_and_load(b, &hb, &cb, &h2);
	ck_assert_ptr_nonnull(strstr(cuda, "merged_a_c0"));
	for (int i = 0; i < M * R; i++)
		x[i] = (float)((i * 13) % 29) * 0.375f - 5.0f;
	void *args_a[2] = {oa1, x}, *args_b[2] = {ob1, x}, *args_m[3] = {oa2, x, ob2};
	run_all_blocks(fa, a, args_a);
	run_all_blocks(fb, b, args_b);
	run_all_blocks(f, m, args_m);
	ck_assert_int_eq(memcmp(oa1, oa2, sizeof(oa1)), 0);
	ck_assert_int_eq(memcmp(ob1, ob2, sizeof(ob1)), 0);
	ck_assert_float_eq(oa1[5], x[5] * 2 + (-1.0f));
	dlclose(h);
	dlclose(h1);
	dlclose(h2);
	ptx = nvrtc_ptx(cuda, "merged", false);
	free(ptx);

	/* no arrays given: all cloned, nothing written back; a failed dst */
	ap_kir_kernel *m2 = ap_kir_kernel_new("m2");
	ap_kir_subst none = { .prefix = NULL };
	ck_assert_int_eq(ap_kir_clone_into(m2, &m2->body, b, &none), 0);
	ck_assert_int_eq(m2->n_arrays, 3);
	ck_assert_str_eq(m2->arrays[0]->name, "p0");
	ck_assert_int_eq(m2->n_params, 2);
	ap_kir_kernel_free(m2);
	m2 = ap_kir_kernel_new("m3");
	m2->failed = true;
	ck_assert_int_eq(ap_kir_clone_into(m2, &m2->body, b, NULL), AP_ENOMEM);
	ap_kir_kernel_free(m2);

	/* one expression, within one kernel: blockIdx.x -> 2, the array kept */
	ap_kir_expr *e = ap_kir_load(a, a->arrays[1],
				     ap_kir_add(a, ap_kir_muli(a, ap_kir_index_of(a, AP_KIR_BLOCK_X), 64),
						ap_kir_index_of(a, AP_KIR_THREAD_X)));
	ap_kir_subst two = { .prefix = NULL };
	two.index[AP_KIR_BLOCK_X] = ap_kir_i64(a, 2);
	ap_kir_expr *r = ap_kir_expr_clone(a, e, &two);
	ck_assert_ptr_nonnull(r);
	ck_assert_ptr_ne(r, e);
	ck_assert_ptr_eq(r->arr, a->arrays[1]);
	ck_assert_ptr_eq(r->a->a->a, two.index[AP_KIR_BLOCK_X]);
	ck_assert_int_eq(r->a->b->kind, AP_KIR_E_INDEX);
	ck_assert(ap_kir_expr_equal(ap_kir_expr_clone(a, e, NULL), e));

	free(host);
	free(cuda);
	free(ha);
	free(ca);
	free(hb);
	free(cb);
	ap_kir_kernel_free(m);
	ap_kir_kernel_free(a);
	ap_kir_kernel_free(b);
}
END_TEST
/* ---- verifier: one good and one bad kernel per rule ------------------------------------ */

typedef void (*vbuild)(ap_kir_kernel *k, ap_kir_array *o, bool bad);

static void v_scope(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_var *v = ap_kir_var_new(k, AP_DT_F32, "v");
	ap_kir_stmt *st = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_LT, ap_kir_index_of(k, AP_KIR_THREAD_X),
							       ap_kir_i64(k, 3)));

	ap_kir_let(k, bad ? &st->body : &k->body, v, ap_kir_float(k, AP_DT_F32, 1));
	ap_kir_store(k, &k->body, o, ap_kir_i64(k, 0), ap_kir_ref(k, v));
}

static void v_scope_twice(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_var *v = ap_kir_var_new(k, AP_DT_F32, "v");

	ap_kir_let(k, &k->body, v, ap_kir_float(k, AP_DT_F32, 1));
	if (bad)
		ap_kir_let(k, &k->body, v, ap_kir_float(k, AP_DT_F32, 2));
	else
		ap_kir_assign(k, &k->body, v, ap_kir_float(k, AP_DT_F32, 2));
	ap_kir_store(k, &k->body, o, ap_kir_i64(k, 0), ap_kir_ref(k, v));
}

static void v_types(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_expr *one = ap_kir_float(k, AP_DT_F32, 1);

	ap_kir_store(k, &k->body, o, ap_kir_i64(k, 0),
		     ap_kir_binary(k, AP_KIR_ADD, one, bad ? ap_kir_float(k, AP_DT_F64, 1) : one));
}

static void v_types_bitwise(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_var *v = ap_kir_var_new(k, bad ? AP_DT_F32 : AP_DT_I32, "v");

	ap_kir_let(k, &k->body, v, ap_kir_const(k, v->type, 3));
	ap_kir_store(k, &k->body, o, ap_kir_i64(k, 0),
		     ap_kir_cast(k, AP_DT_F32, ap_kir_binary(k, AP_KIR_XOR, ap_kir_ref(k, v), ap_kir_ref(k, v))));
}

static void v_select(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_expr *t = ap_kir_index_of(k, AP_KIR_THREAD_X);
	ap_kir_expr *c = bad ? t : ap_kir_binary(k, AP_KIR_NE, t, ap_kir_i64(k, 0));

	ap_kir_store(k, &k->body, o, t,
		     ap_kir_select(k, c, ap_kir_float(k, AP_DT_F32, 1), ap_kir_float(k, AP_DT_F32, 2)));
}

static void v_loop(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_dtype t = bad ? AP_DT_F32 : AP_DT_I64;
	ap_kir_var *i = ap_kir_var_new(k, t, "i");
	ap_kir_stmt *loop = ap_kir_for(k, &k->body, i, ap_kir_const(k, t, 0), ap_kir_const(k, t, 4), 1);

	ap_kir_store(k, &loop->body, o, ap_kir_i64(k, 0), ap_kir_float(k, AP_DT_F32, 1));
}

static void v_loop_step(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_var *i = ap_kir_var_new(k, AP_DT_I64, "i");
	ap_kir_stmt *loop = ap_kir_for(k, &k->body, i, ap_kir_i64(k, 0), ap_kir_i64(k, 4), 1);

	if (bad)
		loop->step = 0;   /* the builder refuses it; IR edited by hand */
	ap_kir_store(k, &loop->body, o, ap_kir_ref(k, i), ap_kir_float(k, AP_DT_F32, 1));
}

static void v_const(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	const float d[2] = {1, 2};
	ap_kir_array *c = ap_kir_const_array(k, "c", AP_DT_F32, 2, d);

	if (bad)
		ap_kir_store(k, &k->body, c, ap_kir_i64(k, 0), ap_kir_float(k, AP_DT_F32, 3));
	ap_kir_store(k, &k->body, o, ap_kir_i64(k, 0), ap_kir_load(k, c, ap_kir_i64(k, 1)));
}

static void v_bounds(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_array *l = ap_kir_local(k, "l", AP_DT_F32, 4);

	ap_kir_store(k, &k->body, l, ap_kir_i64(k, bad ? 4 : 3), ap_kir_float(k, AP_DT_F32, 3));
	ap_kir_store(k, &k->body, o, ap_kir_i64(k, 0), ap_kir_load(k, l, ap_kir_i64(k, 3)));
}

static void v_bounds_shared(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_array *s = ap_kir_shared(k, "s", AP_DT_F32, 32);

	ap_kir_store(k, &k->body, o, ap_kir_i64(k, 0), ap_kir_load(k, s, ap_kir_i64(k, bad ? -1 : 31)));
}

static void v_uniform(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_stmt *st = ap_kir_if(k, &k->body,
				    ap_kir_binary(k, AP_KIR_LT,
						  ap_kir_index_of(k, bad ? AP_KIR_THREAD_X : AP_KIR_BLOCK_X),
						  ap_kir_i64(k, 5)));

	ap_kir_barrier(k, &st->body);
}

/* A register read from shared memory in uniform context is uniform; one
 * assigned under a thread-dependent condition is not. */
static void v_uniform_register(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_array *s = ap_kir_shared(k, "s", AP_DT_I64, 1);
	ap_kir_var *u = ap_kir_var_new(k, AP_DT_I64, "u"), *i = ap_kir_var_new(k, AP_DT_I64, "i");
	ap_kir_stmt *st, *loop;

	ap_kir_let(k, &k->body, u, ap_kir_load(k, s, ap_kir_i64(k, 0)));
	st = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_EQ, ap_kir_index_of(k, AP_KIR_THREAD_X),
						  ap_kir_i64(k, 0)));
	if (bad)
		ap_kir_assign(k, &st->body, u, ap_kir_i64(k, 1));
	loop = ap_kir_for(k, &k->body, i, ap_kir_i64(k, 0), ap_kir_ref(k, u), 1);
	ap_kir_barrier(k, &loop->body);
}

static void v_launch(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	if (bad)
		k->block[1] = 64;   /* 32 x 64 = 2048 threads */
}

static void v_launch_zero(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	if (bad)
		k->grid[2] = 0;
}

static void v_shared(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_shared(k, "s", AP_DT_F32, 8192);
	ap_kir_shared_dyn(k, "d", AP_DT_F32, bad ? 4097 : 4096);   /* 48 KiB in all */
}

static void v_vector(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_var *d[4];

	for (int j = 0; j < 4; j++)
		d[j] = ap_kir_var_new(k, AP_DT_F32, "d");
	ap_kir_vload(k, &k->body, o, ap_kir_i64(k, bad ? 6 : 8), 4, d);
}

static void v_vector_width(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_expr *v[4];
	ap_kir_stmt *s;

	for (int j = 0; j < 4; j++)
		v[j] = ap_kir_float(k, AP_DT_F32, j);
	s = ap_kir_vstore(k, &k->body, o, ap_kir_i64(k, 0), 4, v);
	if (bad)
		s->width = 3;
}

static void v_vector_bounds(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_array *s = ap_kir_shared(k, "s", AP_DT_F32, 16);
	ap_kir_expr *v[4];

	for (int j = 0; j < 4; j++)
		v[j] = ap_kir_float(k, AP_DT_F32, j);
	ap_kir_vstore(k, &k->body, s, ap_kir_i64(k, bad ? 16 : 12), 4, v);
}

static void v_shuffle(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_var *d = ap_kir_var_new(k, AP_DT_F32, "d");

	if (bad)
		k->block[0] = 48;
	ap_kir_let(k, &k->body, d, NULL);
	ap_kir_shfl(k, &k->body, d, AP_KIR_SHFL_DOWN, ap_kir_load(k, o, ap_kir_index_of(k, AP_KIR_THREAD_X)),
		    ap_kir_i64(k, 1), 32);
}

static void v_shuffle_width(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_var *d = ap_kir_var_new(k, AP_DT_F32, "d");
	ap_kir_stmt *s;

	ap_kir_let(k, &k->body, d, NULL);
	s = ap_kir_shfl(k, &k->body, d, AP_KIR_SHFL_XOR, ap_kir_float(k, AP_DT_F32, 1), ap_kir_i64(k, 1), 16);
	if (bad)
		s->width = 12;
}

static void v_shuffle_self(ap_kir_kernel *k, ap_kir_array *o, bool bad)
{
	ap_kir_var *d = ap_kir_var_new(k, AP_DT_F32, "d"), *e = ap_kir_var_new(k, AP_DT_F32, "e");
	ap_kir_stmt *s;

	ap_kir_let(k, &k->body, d, ap_kir_float(k, AP_DT_F32, 1));
	ap_kir_let(k, &k->body, e, ap_kir_float(k, AP_DT_F32, 1));
	s = ap_kir_shfl(k, &k->body, d, AP_KIR_SHFL_XOR, ap_kir_ref(k, e), ap_kir_i64(k, 1), 32);
	if (bad)
		s->value = ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, d), ap_kir_ref(k, e));
}

START_TEST(verify_rules)
{
	static const struct { const char *rule; vbuild build; } rows[] = {
		{ "scope", v_scope },           { "scope", v_scope_twice },
		{ "types", v_types },           { "types", v_types_bitwise },
		{ "select", v_select },         { "loop", v_loop },
		{ "loop", v_loop_step },        { "const", v_const },
		{ "bounds", v_bounds },         { "bounds", v_bounds_shared },
		{ "uniform", v_uniform },       { "uniform", v_uniform_register },
		{ "launch", v_launch },         { "launch", v_launch_zero },
		{ "shared", v_shared },         { "vector", v_vector },
		{ "vector", v_vector_width },   { "bounds", v_vector_bounds },
		{ "shuffle", v_shuffle },       { "shuffle", v_shuffle_width },
		{ "shuffle", v_shuffle_self },
	};

	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
		for (int bad = 0; bad < 2; bad++) {
			ap_kir_kernel *k = ap_kir_kernel_new("vk");
			ap_kir_array *o;
			char want[32];
			ap_error err;
			int rc;

			k->block[0] = 32;
			o = ap_kir_param(k, "o", AP_DT_F32, true, -1);
			rows[r].build(k, o, bad);
			ck_assert_msg(!ap_kir_failed(k), "row %zu (%s) bad=%d: build failed", r, rows[r].rule, bad);
			ap_error_clear(&err);
			rc = ap_kir_verify(k, NULL, &err);
			snprintf(want, sizeof(want), "rule %s:", rows[r].rule);
			if (!bad)
				ck_assert_msg(rc == 0, "row %zu (%s), good kernel: %s", r, rows[r].rule, err.msg);
			else
				ck_assert_msg(rc == AP_EINTERNAL && strstr(err.msg, want) &&
					      !strncmp(err.msg, "kernel vk: ", 11),
					      "row %zu (%s), bad kernel: rc %d, '%s'", r, rows[r].rule, rc, err.msg);
			ap_kir_kernel_free(k);
		}
	}
	/* limits other than the defaults; a failed kernel; NULL */
	ap_kir_kernel *k = ap_kir_kernel_new("lim");
	ap_kir_limits small = { 64, 1024 };
	ap_error err;

	k->block[0] = 128;
	ck_assert_int_eq(ap_kir_verify(k, NULL, &err), 0);
	ck_assert_int_eq(ap_kir_verify(k, &small, &err), AP_EINTERNAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "rule launch: 128 threads per block, more than 64"));
	k->block[0] = 64;
	ap_kir_shared(k, "s", AP_DT_F64, 129);
	ck_assert_int_eq(ap_kir_verify(k, &small, &err), AP_EINTERNAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "rule shared: 1032 bytes"));
	k->failed = true;
	ck_assert_int_eq(ap_kir_verify(k, NULL, &err), AP_EINTERNAL);
	ck_assert_int_eq(ap_kir_verify(NULL, NULL, NULL), AP_EINTERNAL);
	ap_kir_kernel_free(k);
	/* the kernels of this suite's older tests pass */
	k = build_rowsum(37, 301, 8, 16, 4, true);
	ck_assert_int_eq(ap_kir_verify(k, NULL, &err), 0);
	ap_kir_kernel_free(k);
}
END_TEST

/* ---- tensor cores: cp.async, ldmatrix, mma ------------------------------------- */

/* Each of two warps multiplies its own tiles: D = A * B + C, A [16][K]
 * row-major, B given as [8][K] (n rows, k contiguous) or, with btrans, as
 * [K][8] (k rows); C, D [16][8] float32.  The tiles go through shared
 * memory by cp.async (16-byte chunks, rows padded by 16 bytes), into
 * fragments by ldmatrix (A x4; B x2, .trans for a [K][8] tile), C and D
 * by the accumulator layout of the PTX ISA; TF32 operands are rounded
 * with AP_KIR_TF32 first.  The host's emulation must give A * B + C
 * (products exact in float, only the order of the float sum may differ). */
static void run_mma(ap_kir_mma_kind kind, bool btrans)
{
	enum { NW = 2, NT = 64 };
	ap_dtype T = kind == AP_KIR_MMA_F16_16816 ? AP_DT_F16 : kind == AP_KIR_MMA_BF16_16816 ? AP_DT_BF16 : AP_DT_F32;
	int es = (int)ap_dtype_size(T), E = 16 / es, K = kind == AP_KIR_MMA_TF32_1688 ? 8 : 16;
	int LDA = K + E, LDB = btrans ? 8 + E : K + E, brows = btrans ? K : 8, bcols = btrans ? 8 : K;
	int na, nb, nc;
	ap_kir_kernel *k = ap_kir_kernel_new(btrans ? "mma_bt" : "mma_b");
	ap_kir_array *gA, *gB, *gC, *gD, *sA, *sB, *fa, *fb, *fc;
	ap_kir_expr *t, *w, *l, *g, *q, *c;
	ap_kir_var *i;
	ap_kir_stmt *loop;
	static uint16_t a16[NW * 16 * 16], b16[NW * 16 * 16];
	static float a32[NW * 16 * 16], b32[NW * 16 * 16], cv[NW * 128], dv[NW * 128];
	double ref;
	void *args[4];
	char *host, *cuda, *ptx;
	void *h = NULL;
	host_fn f;

	ap_kir_mma_frag_sizes(kind, &na, &nb, &nc);
	k->block[0] = NT;
	k->index_type = AP_DT_I32;
	gD = ap_kir_param(k, "d", AP_DT_F32, true, -1);
	gA = ap_kir_param(k, "a", T, false, -1);
	gB = ap_kir_param(k, "b", T, false, -1);
	gC = ap_kir_param(k, "c", AP_DT_F32, false, -1);
	sA = ap_kir_shared(k, "sa", T, NW * 16 * LDA);
	sB = ap_kir_shared(k, "sb", T, NW * brows * LDB);
	fa = ap_kir_local(k, "fa", T, na);
	fb = ap_kir_local(k, "fb", T, nb);
	fc = ap_kir_local(k, "fc", AP_DT_F32, nc);
	t = ap_kir_index_of(k, AP_KIR_THREAD_X);
	w = ap_kir_bind(k, &k->body, AP_DT_I32, "w", ap_kir_binary(k, AP_KIR_SHR, t, ap_kir_idx(k, 5)));
	l = ap_kir_bind(k, &k->body, AP_DT_I32, "l", ap_kir_binary(k, AP_KIR_AND, t, ap_kir_idx(k, 31)));
	g = ap_kir_bind(k, &k->body, AP_DT_I32, "g", ap_kir_binary(k, AP_KIR_SHR, l, ap_kir_idx(k, 2)));
	q = ap_kir_bind(k, &k->body, AP_DT_I32, "q", ap_kir_binary(k, AP_KIR_AND, l, ap_kir_idx(k, 3)));
	/* A: NW*16 rows of K/E chunks; B: NW*brows rows of bcols/E chunks */
	for (int op = 0; op < 2; op++) {
		int rows = op ? NW * brows : NW * 16, cols = op ? bcols : K, ld = op ? LDB : LDA;
		int chunks = rows * (cols / E);
		ap_kir_expr *row, *ch;

		i = ap_kir_var_new(k, AP_DT_I32, "i");
		loop = ap_kir_for(k, &k->body, i, t, ap_kir_idx(k, chunks), NT);
		row = ap_kir_binary(k, AP_KIR_DIV, ap_kir_ref(k, i), ap_kir_idx(k, cols / E));
		ch = ap_kir_binary(k, AP_KIR_REM, ap_kir_ref(k, i), ap_kir_idx(k, cols / E));
		ap_kir_cp_async(k, &loop->body, op ? sB : sA,
				ap_kir_add(k, ap_kir_muli(k, row, ld), ap_kir_muli(k, ch, E)), op ? gB : gA,
				ap_kir_add(k, ap_kir_muli(k, row, cols), ap_kir_muli(k, ch, E)), E, NULL);
	}
	ap_kir_cp_commit(k, &k->body);
	ap_kir_cp_wait(k, &k->body, 0);
	ap_kir_barrier(k, &k->body);
	/* A: matrix j = l / 8 has rows (j % 2) * 8 + l % 8 and columns from (j / 2) * E */
	ap_kir_ldmatrix(k, &k->body, fa, ap_kir_idx(k, 0), sA,
			ap_kir_add(k, ap_kir_muli(k, w, 16 * LDA),
				   ap_kir_add(k, ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, ap_kir_binary(k, AP_KIR_AND,
						ap_kir_binary(k, AP_KIR_SHR, l, ap_kir_idx(k, 3)), ap_kir_idx(k, 1)), 8),
						ap_kir_binary(k, AP_KIR_AND, l, ap_kir_idx(k, 7))), LDA),
					      ap_kir_muli(k, ap_kir_binary(k, AP_KIR_SHR, l, ap_kir_idx(k, 4)), E))),
			4, false);
	/* B, two matrices: j = (l / 8) % 2, row l % 8 of [n][k] (columns from j * E), or
	 * row j * 8 + l % 8 of [k][n] */
	{
		ap_kir_expr *j = ap_kir_binary(k, AP_KIR_AND, ap_kir_binary(k, AP_KIR_SHR, l, ap_kir_idx(k, 3)),
					       ap_kir_idx(k, 1));
		ap_kir_expr *r = ap_kir_binary(k, AP_KIR_AND, l, ap_kir_idx(k, 7));
		ap_kir_expr *row = btrans ? ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, j, 8), r), LDB)
					  : ap_kir_add(k, ap_kir_muli(k, r, LDB), ap_kir_muli(k, j, E));

		ap_kir_ldmatrix(k, &k->body, fb, ap_kir_idx(k, 0), sB,
				ap_kir_add(k, ap_kir_muli(k, w, brows * LDB), row), 2, btrans);
	}
	if (kind == AP_KIR_MMA_TF32_1688) {
		for (int e = 0; e < na; e++)
			ap_kir_store(k, &k->body, fa, ap_kir_idx(k, e),
				     ap_kir_call(k, AP_KIR_TF32, ap_kir_load(k, fa, ap_kir_idx(k, e)), NULL));
		for (int e = 0; e < nb; e++)
			ap_kir_store(k, &k->body, fb, ap_kir_idx(k, e),
				     ap_kir_call(k, AP_KIR_TF32, ap_kir_load(k, fb, ap_kir_idx(k, e)), NULL));
	}
	/* C / D element e: row g + 8 (e / 2), column 2 q + e % 2 */
	for (int e = 0; e < 4; e++) {
		c = ap_kir_add(k, ap_kir_muli(k, w, 128),
			       ap_kir_add(k, ap_kir_muli(k, ap_kir_addi(k, g, 8 * (e / 2)), 8),
					  ap_kir_addi(k, ap_kir_muli(k, q, 2), e % 2)));
		ap_kir_store(k, &k->body, fc, ap_kir_idx(k, e), ap_kir_load(k, gC, c));
	}
	ap_kir_mma(k, &k->body, kind, fc, ap_kir_idx(k, 0), fa, ap_kir_idx(k, 0), fb, ap_kir_idx(k, 0), fc,
		   ap_kir_idx(k, 0));
	for (int e = 0; e < 4; e++) {
		c = ap_kir_add(k, ap_kir_muli(k, w, 128),
			       ap_kir_add(k, ap_kir_muli(k, ap_kir_addi(k, g, 8 * (e / 2)), 8),
					  ap_kir_addi(k, ap_kir_muli(k, q, 2), e % 2)));
		ap_kir_store(k, &k->body, gD, c, ap_kir_load(k, fc, ap_kir_idx(k, e)));
	}
	f = print_and_load(k, &host, &cuda, &h);
	ck_assert_ptr_nonnull(strstr(cuda, "mma.sync.aligned"));
	ck_assert_ptr_nonnull(strstr(cuda, "ldmatrix.sync.aligned"));
	ck_assert_ptr_nonnull(strstr(cuda, "cp.async.cg.shared.global"));
	/* data: small integers and halves, so that each value is exact in every type */
	srand(7 + kind * 2 + btrans);
	for (int x = 0; x < NW * 16 * K; x++) {
		float v = (float)(rand() % 17 - 8) / 4 + (kind == AP_KIR_MMA_TF32_1688 ? 1e-4f * (rand() % 7) : 0);

		a32[x] = v;
		a16[x] = T == AP_DT_BF16 ? ap_kir_f32_to_bf16(v) : ap_kir_f32_to_f16(v);
	}
	for (int x = 0; x < NW * K * 8; x++) {
		float v = (float)(rand() % 13 - 6) / 8 + (kind == AP_KIR_MMA_TF32_1688 ? 1e-4f * (rand() % 5) : 0);

		b32[x] = v;
		b16[x] = T == AP_DT_BF16 ? ap_kir_f32_to_bf16(v) : ap_kir_f32_to_f16(v);
	}
	for (int x = 0; x < NW * 128; x++)
		cv[x] = (float)(rand() % 9 - 4) / 2;
	memset(dv, 0, sizeof(dv));
	args[0] = dv;
	args[1] = T == AP_DT_F32 ? (void *)a32 : (void *)a16;
	args[2] = T == AP_DT_F32 ? (void *)b32 : (void *)b16;
	args[3] = cv;
	f(args, 0, 1);
	for (int ww = 0; ww < NW; ww++)
		for (int r = 0; r < 16; r++)
			for (int n = 0; n < 8; n++) {
				ref = cv[ww * 128 + r * 8 + n];
				for (int kk = 0; kk < K; kk++) {
					/* B element (k, n): [n][k] or [k][n] per warp */
					int bi = ww * K * 8 + (btrans ? kk * 8 + n : n * K + kk);
					float av = a32[ww * 16 * K + r * K + kk], bv = b32[bi];

					if (T == AP_DT_F32) {
						uint32_t ua = ap_kir_tf32_bits(fbits(av)), ub = ap_kir_tf32_bits(fbits(bv));

						av = bitsf(ua);
						bv = bitsf(ub);
					}
					ref += (double)av * bv;
				}
				ck_assert_msg(fabs(dv[ww * 128 + r * 8 + n] - ref) <= 1e-5 * (fabs(ref) + 1),
					      "kind %d trans %d warp %d D[%d][%d] = %.9g, want %.9g", kind, btrans,
					      ww, r, n, (double)dv[ww * 128 + r * 8 + n], ref);
			}
	ptx = nvrtc_ptx(cuda, k->name, T != AP_DT_F32);
	if (ptx) {
		ck_assert_ptr_nonnull(strstr(ptx, "mma.sync.aligned"));
		ck_assert_ptr_nonnull(strstr(ptx, "ldmatrix.sync.aligned"));
		ck_assert_ptr_nonnull(strstr(ptx, "cp.async"));
		if (T == AP_DT_F32)
			ck_assert_ptr_nonnull(strstr(ptx, "cvt.rna.tf32.f32"));
		free(ptx);
	}
	free(host);
	free(cuda);
	dlclose(h);
	ap_kir_kernel_free(k);
}

START_TEST(mma_f16) { run_mma(AP_KIR_MMA_F16_16816, false); run_mma(AP_KIR_MMA_F16_16816, true); }
END_TEST

START_TEST(mma_bf16) { run_mma(AP_KIR_MMA_BF16_16816, false); run_mma(AP_KIR_MMA_BF16_16816, true); }
END_TEST

START_TEST(mma_tf32) { run_mma(AP_KIR_MMA_TF32_1688, false); }
END_TEST

/* ---- wgmma (sm_90a) ---------------------------------------------------- */

/* Byte offset of element (r, k) -- r along M or N, k along K -- of a
 * wgmma operand of es-byte elements (E = 16 / es of them in 16 bytes),
 * written as the test's own walk over its pieces rather than the
 * descriptor's address arithmetic.  Without swizzling (sw 0): core
 * matrices of 8 rows of 16 bytes -- K-major, 8 values of r each holding
 * E consecutive k; MN-major, 8 values of k each holding E consecutive r
 * -- each core matrix's place from its coordinates and the two byte
 * offsets, then the element's place inside it.  With a swizzle of sw
 * bytes: atoms of 8 rows of sw bytes (rows along M or N for K-major,
 * along K for MN-major), each row sw / 16 chunks of 16 bytes; the
 * element's chunk c in its row is stored at chunk c ^ x, x the row's
 * index within the atom scaled to the chunks the pattern permutes --
 * (row * sw / 128) -- the PTX ISA's swizzle-atom figures read as a
 * table.  Atoms lie SBO apart across 8-row groups and (MN-major) LBO
 * apart along M or N, both multiples of 8 sw here. */
static size_t wg_test_place(bool mn, int lbo, int sbo, int sw, int es, int r, int k)
{
	int E = 16 / es, in_r, in_k, chunks, row, c, x;
	size_t atom;

	if (!sw) {
		if (mn) {   /* core (r / E, k / 8): 8 rows of k, each E consecutive r */
			size_t core = (size_t)(r / E) * sbo + (size_t)(k / 8) * lbo;

			return core + (size_t)(k % 8) * 16 + (size_t)(r % E) * es;
		}
		/* core (r / 8, k / E): 8 rows of r, each E consecutive k */
		in_r = r % 8;
		in_k = k % E;
		return (size_t)(r / 8) * sbo + (size_t)(k / E) * lbo + (size_t)in_r * 16 + (size_t)in_k * es;
	}
	chunks = sw / 16;
	if (!mn) {   /* atom rows: 8 values of r; a row's chunks along k */
		row = r % 8;
		c = k / E;
		atom = (size_t)(r / 8) * sbo;
		in_k = k % E;
		x = row * sw / 128;
		return atom + (size_t)row * sw + (size_t)(c ^ x) * 16 + (size_t)in_k * es;
	}
	row = k % 8;   /* atom rows: 8 values of k; a row's chunks along r */
	c = (r / E) % chunks;
	atom = (size_t)(r / (E * chunks)) * lbo + (size_t)(k / 8) * sbo;
	x = row * sw / 128;
	return atom + (size_t)row * sw + (size_t)(c ^ x) * 16 + (size_t)(r % E) * es;
}

/* The value the tensor cores read from a float32 operand of a TF32 wgmma:
 * its 13 low mantissa bits dropped (the test's own mask, not the
 * emitter's helper). */
static float tf32_read(float v)
{
	uint32_t u;

	memcpy(&u, &v, 4);
	u &= 0xffffe000u;
	memcpy(&v, &u, 4);
	return v;
}

/* Element x (of es bytes) of a byte buffer set to v in the kind's type. */
static void wg_test_put(unsigned char *buf, size_t at, ap_kir_wgmma_kind kind, float v)
{
	uint16_t h;

	if (kind == AP_KIR_WGMMA_TF32) {
		memcpy(buf + at, &v, 4);
		return;
	}
	h = kind == AP_KIR_WGMMA_BF16 ? ap_kir_f32_to_bf16(v) : ap_kir_f32_to_f16(v);
	memcpy(buf + at, &h, 2);
}

/* Two warpgroups (256 threads), each D(64 x N) = C + A_w B with its own 64
 * rows of A (128 x K) and one B (K x N), in float16, bfloat16 (K 16) or
 * TF32 (K 8; values with bits below TF32's mantissa, the reference
 * reading them truncated): the operands' bytes placed in global memory
 * as the test lays them out (gaps between core matrices filled with
 * NaN), copied as they are into shared memory, fenced for the async
 * proxy, then one wgmma per warpgroup; each thread stores its
 * accumulators at the (row, column) of the ISA's fragment figure;
 * compared with a float64 reference.  The CUDA text is compiled for
 * sm_90a by NVRTC (PTX checked for the instruction's shape and types). */
static void run_wgmma(ap_kir_wgmma_kind kind, bool a_mn, bool b_mn, int N, bool a_reg, int sw)
{
	ap_dtype T = ap_kir_wgmma_type(kind);
	int es = (int)ap_dtype_size(T), K = ap_kir_wgmma_k(kind);
	bool tf32 = kind == AP_KIR_WGMMA_TF32;
	ap_kir_wg_layout la = {a_mn, a_mn ? 16 * 128 + 64 : 128, a_mn ? 128 : 384, 0};
	ap_kir_wg_layout lb = {b_mn, b_mn ? (N / 8) * 128 + 32 : 128, b_mn ? 128 : 256 + 16 * (N / 8), 0};
	int rep = 8 * sw, along = sw / es;   /* the pattern's repeat (bytes); elements an atom row */
	size_t a_bytes = 0, b_bytes = 0;
	ap_kir_kernel *k = ap_kir_kernel_new("k_wgmma");

	if (sw) {
		/* atoms a repeat each; a gap of one repeat between 8-row groups
		 * (SBO) and, MN-major, between atoms along M or N (LBO) */
		la = a_mn ? (ap_kir_wg_layout){true, 2 * rep, ((128 + along - 1) / along * 2 + 1) * rep, sw}
			  : (ap_kir_wg_layout){false, 16, 2 * rep, sw};
		lb = b_mn ? (ap_kir_wg_layout){true, 2 * rep, ((N + along - 1) / along * 2 + 1) * rep, sw}
			  : (ap_kir_wg_layout){false, 16, 2 * rep, sw};
	}
	ap_kir_array *gD, *gA, *gB, *gC, *sA, *sB, *acc, *fa, *gAr;
	ap_kir_expr *t, *w, *l, *g, *q, *idx;
	ap_kir_var *i;
	ap_kir_stmt *loop;
	unsigned char *ha, *hb, har[128 * 16 * 4];
	float *cv, *dv, a32[128][16], b32[16][256];
	void *args[5], *h;
	char *host, *cuda, *ptx, shape[64];
	host_fn f;

	for (int r = 0; r < 128; r++)
		for (int kk = 0; kk < K; kk++) {
			size_t e = wg_test_place(a_mn, la.lbo, la.sbo, sw, es, r, kk) + (size_t)es;

			a_bytes = e > a_bytes ? e : a_bytes;
		}
	for (int n = 0; n < N; n++)
		for (int kk = 0; kk < K; kk++) {
			size_t e = wg_test_place(b_mn, lb.lbo, lb.sbo, sw, es, n, kk) + (size_t)es;

			b_bytes = e > b_bytes ? e : b_bytes;
		}
	a_bytes = (a_bytes + 15) / 16 * 16;
	b_bytes = (b_bytes + 15) / 16 * 16;
	ha = malloc(a_bytes);
	hb = malloc(b_bytes);
	cv = malloc(sizeof(float) * 128 * N);
	dv = calloc(128 * (size_t)N, sizeof(float));
	ck_assert(ha && hb && cv && dv);
	/* NaN in every type's top bits: a read of a gap shows */
	for (size_t x = 0; x < a_bytes / (size_t)es; x++)
		wg_test_put(ha, x * es, kind, NAN);
	for (size_t x = 0; x < b_bytes / (size_t)es; x++)
		wg_test_put(hb, x * es, kind, NAN);
	srand(11 + N + 2 * a_mn + b_mn);
	for (int r = 0; r < 128; r++)
		for (int kk = 0; kk < K; kk++) {
			float v = (float)(rand() % 17 - 8) / 4;

			if (tf32)   /* bits below TF32's mantissa, which the tensor cores drop */
				v *= 1.0f + (float)(rand() % 8192) / 8388608.0f;
			a32[r][kk] = tf32 ? tf32_read(v) : v;
			wg_test_put(ha, wg_test_place(a_mn, la.lbo, la.sbo, sw, es, r, kk), kind, v);
			memcpy(har + ((size_t)r * 16 + kk) * es, ha + wg_test_place(a_mn, la.lbo, la.sbo, sw, es, r, kk),
			       (size_t)es);
		}
	for (int kk = 0; kk < K; kk++)
		for (int n = 0; n < N; n++) {
			float v = (float)(rand() % 13 - 6) / 8;

			if (tf32)
				v *= 1.0f + (float)(rand() % 8192) / 8388608.0f;
			b32[kk][n] = tf32 ? tf32_read(v) : v;
			wg_test_put(hb, wg_test_place(b_mn, lb.lbo, lb.sbo, sw, es, n, kk), kind, v);
		}
	for (int x = 0; x < 128 * N; x++)
		cv[x] = (float)(rand() % 9 - 4) / 2;

	k->block[0] = 256;
	gD = ap_kir_param(k, "D", AP_DT_F32, true, -1);
	gA = ap_kir_param(k, "A", T, false, -1);
	gB = ap_kir_param(k, "B", T, false, -1);
	gC = ap_kir_param(k, "C", AP_DT_F32, false, -1);
	gAr = ap_kir_param(k, "Ar", T, false, -1);   /* A row-major 128 x 16, for the register form */
	fa = ap_kir_local(k, "fa", T, 8);
	sA = ap_kir_shared_dyn_aligned(k, "sA", T, (int64_t)a_bytes / es, sw ? (unsigned)rep : 16);
	sB = ap_kir_shared_dyn_aligned(k, "sB", T, (int64_t)b_bytes / es, sw ? (unsigned)rep : 16);
	acc = ap_kir_local(k, "acc", AP_DT_F32, N / 2);
	t = ap_kir_index_of(k, AP_KIR_THREAD_X);
	for (int op = 0; op < 2; op++) {
		i = ap_kir_var_new(k, k->index_type, "i");
		loop = ap_kir_for(k, &k->body, i, t, ap_kir_idx(k, (int64_t)(op ? b_bytes : a_bytes) / es), 256);
		ap_kir_store(k, &loop->body, op ? sB : sA, ap_kir_ref(k, i),
			     ap_kir_load(k, op ? gB : gA, ap_kir_ref(k, i)));
	}
	ap_kir_fence_proxy_async(k, &k->body);
	ap_kir_barrier(k, &k->body);
	/* the ISA's D figure: warp w of the warpgroup, lane l: element e at row
	 * 16 (w % 4) + l / 4 (+ 8 for e % 4 >= 2), column 8 (e / 4) + 2 (l % 4) + e % 2 */
	w = ap_kir_binary(k, AP_KIR_SHR, t, ap_kir_idx(k, 5));
	l = ap_kir_binary(k, AP_KIR_AND, t, ap_kir_idx(k, 31));
	g = ap_kir_add(k, ap_kir_muli(k, w, 16), ap_kir_binary(k, AP_KIR_SHR, l, ap_kir_idx(k, 2)));
	q = ap_kir_muli(k, ap_kir_binary(k, AP_KIR_AND, l, ap_kir_idx(k, 3)), 2);
	for (int e = 0; e < N / 2; e++) {
		idx = ap_kir_add(k, ap_kir_muli(k, ap_kir_addi(k, g, e % 4 >= 2 ? 8 : 0), N),
				 ap_kir_addi(k, q, 8 * (e / 4) + e % 2));
		ap_kir_store(k, &k->body, acc, ap_kir_idx(k, e), ap_kir_load(k, gC, idx));
	}
	ap_kir_wgmma_fence(k, &k->body, acc);
	/* warpgroup v = t / 128: A's rows 64 v .. (a core-matrix row group's start) */
	{
		ap_kir_expr *v = ap_kir_binary(k, AP_KIR_SHR, t, ap_kir_idx(k, 7));
		/* 64 rows on: 8 groups of 8 rows (SBO), or MN-major swizzled 64 / along atoms (LBO) */
		ap_kir_expr *a0 = ap_kir_muli(k, v, (sw && a_mn ? (int64_t)(64 / along) * la.lbo : 8 * (int64_t)la.sbo) / es);

		if (a_reg) {
			/* A's fragment from registers: element e at row g (+ 8 for e % 4 >= 2),
			 * column q + e % 2 (+ 8 from e = 4), as mma.sync's m16n8k16 A */
			for (int e = 0; e < 8; e++)
				ap_kir_store(k, &k->body, fa, ap_kir_idx(k, e),
					     ap_kir_load(k, gAr, ap_kir_add(k, ap_kir_muli(k, ap_kir_addi(k, g, e % 4 >= 2 ? 8 : 0), 16),
									  ap_kir_addi(k, q, e % 2 + (e >= 4 ? 8 : 0)))));
			ap_kir_wgmma(k, &k->body, kind, N, acc, ap_kir_idx(k, 0), fa, ap_kir_idx(k, 0), la, sB,
				     ap_kir_idx(k, 0), lb);
		} else {
			ap_kir_wgmma(k, &k->body, kind, N, acc, ap_kir_idx(k, 0), sA, a0, la, sB, ap_kir_idx(k, 0), lb);
		}
	}
	ap_kir_wgmma_commit(k, &k->body);
	ap_kir_wgmma_wait(k, &k->body, 0, acc);
	for (int e = 0; e < N / 2; e++) {
		idx = ap_kir_add(k, ap_kir_muli(k, ap_kir_addi(k, g, e % 4 >= 2 ? 8 : 0), N),
				 ap_kir_addi(k, q, 8 * (e / 4) + e % 2));
		ap_kir_store(k, &k->body, gD, idx, ap_kir_load(k, acc, ap_kir_idx(k, e)));
	}
	f = print_and_load(k, &host, &cuda, &h);
	ck_assert_ptr_nonnull(strstr(cuda, "wgmma.mma_async.sync.aligned"));
	ck_assert_ptr_nonnull(strstr(cuda, "fence.proxy.async.shared::cta"));
	if (sw)   /* the arrays' start aligned at run time to the repeat */
		ck_assert_ptr_nonnull(strstr(cuda, "ap_smem_raw"));
	args[0] = dv;
	args[1] = ha;
	args[2] = hb;
	args[3] = cv;
	args[4] = har;
	f(args, 0, 1);
	for (int r = 0; r < 128; r++)
		for (int n = 0; n < N; n++) {
			double ref = cv[r * N + n];

			for (int kk = 0; kk < K; kk++)
				ref += (double)a32[r][kk] * b32[kk][n];
			ck_assert_msg(fabs(dv[r * N + n] - ref) <= 1e-5 * (fabs(ref) + 1),
				      "wgmma %s n%d swizzle %d A %s B %s: D[%d][%d] = %.9g, want %.9g", ap_dtype_name(T), N,
				      sw, a_reg ? "registers" : a_mn ? "MN" : "K", b_mn ? "MN" : "K", r, n,
				      (double)dv[r * N + n], ref);
		}
	snprintf(shape, sizeof(shape), "wgmma.mma_async.sync.aligned.m64n%dk%d.f32.%s", N, K,
		 tf32 ? "tf32.tf32" : T == AP_DT_BF16 ? "bf16.bf16" : "f16.f16");
	ck_assert_ptr_nonnull(strstr(cuda, shape));
	{
		uint8_t *out = NULL;
		size_t len = 0;
		ap_error err;

		if (ap_nvrtc_load(&err) != 0 || !ap_nvrtc_include_dir()) {
			AP_SKIP("nvrtc", "SKIP NVRTC compile of k_wgmma: NVRTC or cuda_fp16.h missing");
		} else {
			if (ap_nvrtc_compile(cuda, k->name, "sm_90a", false, &out, &len, &err) != 0)
				fprintf(stderr, "NVRTC failed on k_wgmma: %s\n%s\n", err.msg, cuda);
			ck_assert_ptr_nonnull(out);
			ptx = (char *)out;
			ck_assert_ptr_nonnull(strstr(ptx, shape));
			ck_assert_ptr_nonnull(strstr(ptx, "wgmma.wait_group.sync.aligned"));
			free(ptx);
		}
	}
	free(host);
	free(cuda);
	free(ha);
	free(hb);
	free(cv);
	free(dv);
	dlclose(h);
	ap_kir_kernel_free(k);
}

START_TEST(wgmma_f16)
{
	run_wgmma(AP_KIR_WGMMA_F16, false, true, 64, false, 0);
	run_wgmma(AP_KIR_WGMMA_F16, false, false, 8, false, 0);
	run_wgmma(AP_KIR_WGMMA_F16, true, true, 256, false, 0);
	run_wgmma(AP_KIR_WGMMA_F16, false, true, 32, true, 0);
}
END_TEST

START_TEST(wgmma_bf16)
{
	run_wgmma(AP_KIR_WGMMA_BF16, true, false, 128, false, 0);
	run_wgmma(AP_KIR_WGMMA_BF16, false, true, 24, false, 0);
	run_wgmma(AP_KIR_WGMMA_BF16, false, false, 16, true, 0);
}
END_TEST

/* Swizzled operands, each mode with both major-nesses and both types;
 * N below, at and above an atom row's elements along N. */
START_TEST(wgmma_swizzled)
{
	run_wgmma(AP_KIR_WGMMA_F16, false, true, 128, false, 128);
	run_wgmma(AP_KIR_WGMMA_F16, true, false, 64, false, 128);
	run_wgmma(AP_KIR_WGMMA_BF16, true, true, 256, false, 128);
	run_wgmma(AP_KIR_WGMMA_F16, false, false, 24, false, 64);
	run_wgmma(AP_KIR_WGMMA_BF16, true, true, 40, false, 64);
	run_wgmma(AP_KIR_WGMMA_F16, true, true, 8, false, 32);
	run_wgmma(AP_KIR_WGMMA_BF16, false, true, 48, true, 32);
	run_wgmma(AP_KIR_WGMMA_F16, false, false, 16, false, 32);
}
END_TEST

/* TF32 (K-major operands only: the ISA has no transpose for .tf32),
 * unswizzled and in each swizzle mode, N from 8 to 256; the MN-major and
 * register forms refused by the builder. */
START_TEST(wgmma_tf32)
{
	ap_kir_wg_layout kl = {false, 128, 256, 0}, ml = {true, 128, 256, 0};

	run_wgmma(AP_KIR_WGMMA_TF32, false, false, 256, false, 0);
	run_wgmma(AP_KIR_WGMMA_TF32, false, false, 8, false, 0);
	run_wgmma(AP_KIR_WGMMA_TF32, false, false, 32, false, 128);
	run_wgmma(AP_KIR_WGMMA_TF32, false, false, 40, false, 64);
	run_wgmma(AP_KIR_WGMMA_TF32, false, false, 24, false, 32);
	/* refused: A MN-major, B MN-major, A from registers */
	for (int c = 0; c < 3; c++) {
		ap_kir_kernel *k = ap_kir_kernel_new("k_bad");
		ap_kir_array *acc = ap_kir_local(k, "acc", AP_DT_F32, 8), *sa = ap_kir_shared(k, "sa", AP_DT_F32, 512);
		ap_kir_array *fa = ap_kir_local(k, "fa", AP_DT_F32, 8);

		k->block[0] = 128;
		ck_assert_ptr_null(ap_kir_wgmma(k, &k->body, AP_KIR_WGMMA_TF32, 16, acc, ap_kir_idx(k, 0), c == 2 ? fa : sa,
						ap_kir_idx(k, 0), c == 0 ? ml : kl, sa, ap_kir_idx(k, 0), c == 1 ? ml : kl));
		ap_kir_kernel_free(k);
	}
}
END_TEST

/* TF32 rounding against a reference written from the definition: the
 * value of the 10-bit mantissa nearest to x, ties away from zero. */
START_TEST(tf32_rounding)
{
	static const float cases[] = {1.0f, 1.00048828125f /* 1 + 2^-11: a tie */, 1.0004883f, 1.0004882f,
				      -1.00048828125f, 3.14159265f, 1e-40f, -2.5e-38f, 3.4028235e38f, 65504.0f,
				      0.1f, -0.3f, 1.99951171875f};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		double x = cases[i], m, ref;
		int e;

		m = frexp(fabs(x), &e);   /* x = m 2^e, m in [0.5, 1) */
		if (e < -125)
			e = -125;         /* subnormals: the same absolute step as the smallest normal */
		ref = floor(ldexp(fabs(x), 11 - e) + 0.5);   /* 11 bits: 1 + 10 */
		ref = ldexp(ref, e - 11);
		if (ref > 3.4028234663852886e38)
			ref = INFINITY;
		ref = x < 0 ? -ref : ref;
		(void)m;
		ck_assert_msg(bitsf(ap_kir_tf32_bits(fbits(cases[i]))) == (float)ref,
			      "tf32(%.9g) = %.9g, want %.9g", x, (double)bitsf(ap_kir_tf32_bits(fbits(cases[i]))), ref);
	}
	ck_assert_uint_eq(ap_kir_tf32_bits(0x7f800000u), 0x7f800000u);
	ck_assert_uint_eq(ap_kir_tf32_bits(0xff800000u), 0xff800000u);
	ck_assert_uint_eq(ap_kir_tf32_bits(0x7f800001u), 0x7fffffffu);
}
END_TEST

/* AP_KIR_EX2_APPROX: ex2.approx.ftz.f32 in the CUDA (and its PTX), and
 * the host's reading of it -- within 2^-22 of 2^x (float64's exp2), a
 * subnormal input taken as 0 (result 1), a result below 2^-126 flushed
 * to 0, -inf to 0, +inf kept; a float64 argument refused. */
START_TEST(ex2_approx)
{
	static const float xs[] = {0.0f, 1.0f, -1.0f, 3.5f, -0.7213475f, 10.25f, -20.125f, 100.5f, -125.5f,
				   -126.0f, -127.5f, -149.0f, 1e-40f, -1e-40f, -INFINITY, INFINITY, 0.3333333f};
	enum { N = sizeof(xs) / sizeof(xs[0]) };
	ap_kir_kernel *k = ap_kir_kernel_new("ex2k");
	ap_kir_array *in, *out;
	ap_kir_expr *t;
	float y[N];
	void *args[2], *h = NULL;
	char *host, *cuda, *ptx;
	host_fn f;

	k->block[0] = N;
	out = ap_kir_param(k, "y", AP_DT_F32, true, -1);
	in = ap_kir_param(k, "x", AP_DT_F32, false, -1);
	t = ap_kir_index_of(k, AP_KIR_THREAD_X);
	ap_kir_store(k, &k->body, out, t, ap_kir_call(k, AP_KIR_EX2_APPROX, ap_kir_load(k, in, t), NULL));
	f = print_and_load(k, &host, &cuda, &h);
	args[0] = y;
	args[1] = (void *)xs;
	f(args, 0, 1);
	for (int i = 0; i < N; i++) {
		double want = fabs((double)xs[i]) < 0x1p-126 ? 1.0 : exp2((double)xs[i]);

		if (want < 0x1p-126)
			want = 0;
		ck_assert_msg(y[i] == want || fabs(y[i] - want) <= 0x1p-22 * want, "ex2(%.9g) = %.9g, want %.9g",
			      (double)xs[i], (double)y[i], want);
	}
	ck_assert_ptr_nonnull(strstr(cuda, "ex2.approx.ftz.f32"));
	ptx = nvrtc_ptx(cuda, k->name, false);
	if (ptx) {
		ck_assert_ptr_nonnull(strstr(ptx, "ex2.approx.ftz.f32"));
		free(ptx);
	}
	free(host);
	free(cuda);
	dlclose(h);
	ap_kir_kernel_free(k);
	k = ap_kir_kernel_new("ex2d");
	ck_assert_ptr_null(ap_kir_call(k, AP_KIR_EX2_APPROX, ap_kir_float(k, AP_DT_F64, 1.0), NULL));
	ap_kir_kernel_free(k);
}
END_TEST

/* A predicated cp.async fills zeros; 4- and 8-byte copies of float32. */
START_TEST(cp_async_zero_fill)
{
	enum { NT = 32 };
	ap_kir_kernel *k = ap_kir_kernel_new("cpz");
	ap_kir_array *in, *out, *sh;
	ap_kir_expr *t;
	static float x[2 * NT], y[2 * NT];
	void *args[2];
	char *host, *cuda, *ptx;
	void *h = NULL;
	host_fn f;

	k->block[0] = NT;
	out = ap_kir_param(k, "y", AP_DT_F32, true, -1);
	in = ap_kir_param(k, "x", AP_DT_F32, false, -1);
	sh = ap_kir_shared(k, "s", AP_DT_F32, 2 * NT);
	t = ap_kir_index_of(k, AP_KIR_THREAD_X);
	/* thread t copies x[2t..2t+1] (8 bytes) when t is even, else zeros */
	ap_kir_cp_async(k, &k->body, sh, ap_kir_muli(k, t, 2), in, ap_kir_muli(k, t, 2), 2,
			ap_kir_binary(k, AP_KIR_EQ, ap_kir_binary(k, AP_KIR_REM, t, ap_kir_idx(k, 2)),
				      ap_kir_idx(k, 0)));
	ap_kir_cp_commit(k, &k->body);
	ap_kir_cp_wait(k, &k->body, 0);
	ap_kir_barrier(k, &k->body);
	ap_kir_store(k, &k->body, out, t, ap_kir_load(k, sh, ap_kir_binary(k, AP_KIR_SUB, ap_kir_idx(k, 2 * NT - 1), t)));
	ap_kir_store(k, &k->body, out, ap_kir_addi(k, t, NT), ap_kir_load(k, sh, ap_kir_binary(k, AP_KIR_SUB, ap_kir_idx(k, NT - 1), t)));
	f = print_and_load(k, &host, &cuda, &h);
	for (int i = 0; i < 2 * NT; i++) {
		x[i] = (float)i + 0.5f;
		y[i] = -1;
	}
	args[0] = y;
	args[1] = x;
	f(args, 0, 1);
	for (int i = 0; i < 2 * NT; i++) {
		int src = i < NT ? 2 * NT - 1 - i : NT - 1 - (i - NT);   /* the shared element read */
		float want = (src / 2) % 2 == 0 ? x[src] : 0.0f;

		ck_assert_msg(y[i] == want, "y[%d] = %g, want %g", i, (double)y[i], (double)want);
	}
	ck_assert_ptr_nonnull(strstr(cuda, "cp.async.ca.shared.global"));
	ptx = nvrtc_ptx(cuda, k->name, false);
	if (ptx) {
		ck_assert_ptr_nonnull(strstr(ptx, "cp.async.ca.shared.global"));
		ck_assert_ptr_nonnull(strstr(ptx, "cp.async.wait_group"));
		free(ptx);
	}
	free(host);
	free(cuda);
	dlclose(h);
	ap_kir_kernel_free(k);
}
END_TEST

/* The verifier's rules for the tensor-core statements. */
START_TEST(matrix_rules)
{
	ap_error err;

	for (int c = 0; c < 4; c++) {
		ap_kir_kernel *k = ap_kir_kernel_new("bad");
		ap_kir_array *sh, *fa, *fb, *fc, *out;
		const char *rule;

		k->block[0] = c == 0 ? 48 : 64;
		out = ap_kir_param(k, "y", AP_DT_F32, true, -1);
		sh = ap_kir_shared(k, "s", AP_DT_F16, 512);
		fa = ap_kir_local(k, "fa", AP_DT_F16, 8);
		fb = ap_kir_local(k, "fb", AP_DT_F16, 4);
		fc = ap_kir_local(k, "fc", AP_DT_F32, 4);
		switch (c) {
		case 0:   /* 48 threads: not whole warps */
			ap_kir_ldmatrix(k, &k->body, fa, ap_kir_idx(k, 0), sh, ap_kir_idx(k, 0), 4, false);
			rule = "rule warp";
			break;
		case 1: { /* under a thread-dependent branch */
			ap_kir_stmt *s = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_LT,
						ap_kir_index_of(k, AP_KIR_THREAD_X), ap_kir_idx(k, 32)));
			ap_kir_mma(k, &s->body, AP_KIR_MMA_F16_16816, fc, ap_kir_idx(k, 0), fa, ap_kir_idx(k, 0), fb,
				   ap_kir_idx(k, 0), fc, ap_kir_idx(k, 0));
			rule = "rule uniform";
			break;
		}
		case 2:   /* a constant fragment offset past the register array */
			ap_kir_mma(k, &k->body, AP_KIR_MMA_F16_16816, fc, ap_kir_idx(k, 2), fa, ap_kir_idx(k, 0), fb,
				   ap_kir_idx(k, 0), fc, ap_kir_idx(k, 0));
			rule = "rule bounds";
			break;
		default:  /* cp.async at an index that is not a multiple of its width */
			ap_kir_cp_async(k, &k->body, sh, ap_kir_idx(k, 3), ap_kir_param(k, "x", AP_DT_F16, false, -1),
					ap_kir_idx(k, 0), 8, NULL);
			rule = "rule async";
			break;
		}
		ap_kir_store(k, &k->body, out, ap_kir_idx(k, 0), ap_kir_float(k, AP_DT_F32, 1));
		ck_assert(!ap_kir_failed(k));
		ck_assert_int_eq(ap_kir_verify(k, NULL, &err), AP_EINTERNAL);
		ck_assert_msg(strstr(err.msg, rule) != NULL, "case %d: %s (want %s)", c, err.msg, rule);
		ap_kir_kernel_free(k);
	}
	/* builders refuse what no kernel could mean */
	{
		ap_kir_kernel *k = ap_kir_kernel_new("refused");
		ap_kir_array *sh32 = ap_kir_shared(k, "s", AP_DT_F32, 64), *f32 = ap_kir_local(k, "f", AP_DT_F32, 4);

		ck_assert_ptr_null(ap_kir_ldmatrix(k, &k->body, f32, ap_kir_idx(k, 0), sh32, ap_kir_idx(k, 0), 2, true));
		ck_assert(ap_kir_failed(k));
		ap_kir_kernel_free(k);
	}
}
END_TEST

/* Shared-memory budgets count each static array's 16-byte alignment (the
 * CUDA printer's __align__(16)): three arrays of 9 + 9 + 49128 bytes sum
 * to 49146, under 48 KiB, but take 16 + 16 + 49128 = 49160 laid out, over
 * it -- the verifier refuses the kernel rather than ptxas. */
START_TEST(shared_budget_counts_alignment)
{
	ap_kir_kernel *k = ap_kir_kernel_new("aligned_smem");
	ap_error err;

	ck_assert_ptr_nonnull(k);
	ck_assert_ptr_nonnull(ap_kir_shared(k, "flags", AP_DT_U8, 9));
	ck_assert_ptr_nonnull(ap_kir_shared(k, "more", AP_DT_U8, 9));
	ck_assert_ptr_nonnull(ap_kir_shared(k, "tile", AP_DT_F32, 12282));
	ck_assert_uint_eq(ap_kir_shared_bytes(k), 49160);
	ck_assert_int_eq(ap_kir_verify(k, NULL, &err), AP_EINTERNAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "rule shared"));
	ck_assert_ptr_nonnull(strstr(err.msg, "49160 bytes"));
	ap_kir_kernel_free(k);
}
END_TEST

/* Aligned dynamic shared arrays: offsets rounded up to each array's
 * alignment, the run-time alignment's slack (the largest alignment less
 * 16) counted once in smem_bytes and printed as a re-aligned start; a bad
 * alignment refused.  A swizzled wgmma operand in an array that does not
 * start on its pattern's repeat fails rule swizzle. */
/* ---- tensor maps (common/tmap.h) -------------------------------------------------- */

/* A 2-D float16 tensor map: `cols` x `rows` elements, rows `pitch` bytes
 * apart, a box of bx x by, swizzle mode sw. */
static ap_tmap_desc tmap_2d(uint64_t cols, uint64_t rows, uint64_t pitch, uint32_t bx, uint32_t by, int sw)
{
	ap_tmap_desc d = { .dtype = AP_TMAP_FLOAT16, .rank = 2, .dims = { cols, rows },
			   .strides = { pitch }, .box = { bx, by }, .estrides = { 1, 1 }, .swizzle = sw };

	return d;
}

/* cuTensorMapEncodeTiled's rules: a good map passes; each broken rule is
 * refused, naming what broke. */
START_TEST(tmap_rules)
{
	static const struct {
		const char *what, *says;
	} bad[] = {
		{ "dtype", "data type" }, { "rank", "rank 6" }, { "interleave rank", "with interleave" },
		{ "dim", "dims[1]" }, { "box", "box[1] = 257" }, { "box row", "multiple of 16 bytes" },
		{ "estride", "element strides[1] = 9" }, { "stride", "strides[0] = 200" },
		{ "span", "at most the 64-byte swizzle" }, { "nan", "floating-point" },
		{ "i32", "32-byte interleave needs" }, { "address", "aligned to 16" },
	};
	char why[160];
	_Alignas(16) static uint8_t buf[64];

	ap_tmap_desc ok = tmap_2d(100, 70, 208, 64, 16, AP_TMAP_SWIZZLE_128B);
	ck_assert_int_eq(ap_tmap_check(&ok, buf, why, sizeof(why)), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ap_tmap_desc d = ok;
		const void *g = buf;

		switch (i) {
		case 0: d.dtype = 13; break;
		case 1: d.rank = 6; break;
		case 2: d.interleave = AP_TMAP_INTERLEAVE_16B; break;
		case 3: d.dims[1] = 0; break;
		case 4: d.box[1] = 257; break;
		case 5: d.box[0] = 12; break;
		case 6: d.estrides[1] = 9; break;
		case 7: d.strides[0] = 200; break;
		case 8: d.swizzle = AP_TMAP_SWIZZLE_64B; break;
		case 9: d.dtype = AP_TMAP_UINT16; d.oob = AP_TMAP_OOB_NAN; break;
		case 10: d.rank = 3; d.dims[2] = 1; d.strides[1] = 208 * 70; d.box[2] = 1; d.estrides[2] = 1;
			 d.box[0] = 16; d.interleave = AP_TMAP_INTERLEAVE_32B; d.strides[0] = 224; break;
		default: g = buf + 8; break;
		}
		ck_assert_msg(ap_tmap_check(&d, g, why, sizeof(why)) == -1, "%s accepted", bad[i].what);
		ck_assert_msg(strstr(why, bad[i].says), "%s: '%s' lacks '%s'", bad[i].what, why, bad[i].says);
	}
	/* bytes of a box: dimension 0's whole box, ceil(box / stride) of the others */
	ok.box[1] = 8;
	ok.estrides[1] = 3;
	ck_assert_uint_eq(ap_tmap_box_bytes(&ok), 64 * 3 * 2);
}
END_TEST

/* The host tile load places a swizzled box where a wgmma descriptor of the
 * same swizzle reads it: every element of 16 rows x (128, 64, 32 bytes)
 * boxes, at coordinates inside, across and before the tensor's edges, is
 * found at the place the test's own walk of the PTX ISA's atom figures
 * (wg_test_place) gives -- read K-major (a row of the box is a row of A,
 * its columns k) and MN-major (a row of the box is one k, its columns
 * M) -- holding the tensor's value, or 0 outside the tensor. */
START_TEST(tmap_load_swizzled)
{
	enum { COLS = 100, ROWS = 70, PITCH = 208 };
	static const int32_t at[][2] = { { 0, 0 }, { 64, 60 }, { -8, -3 }, { 36, 5 } };
	static uint16_t g[ROWS * PITCH / 2];
	_Alignas(1024) static uint8_t box[4096];
	char why[160];

	for (int r = 0; r < ROWS; r++)
		for (int c = 0; c < PITCH / 2; c++)
			g[r * PITCH / 2 + c] = c < COLS ? (uint16_t)(1 + r * 128 + c) : 0xdead;
	for (int sw = 32; sw <= 128; sw *= 2) {
		int mode = sw == 32 ? AP_TMAP_SWIZZLE_32B : sw == 64 ? AP_TMAP_SWIZZLE_64B : AP_TMAP_SWIZZLE_128B;
		uint32_t bx = (uint32_t)sw / 2;
		ap_tmap_desc d = tmap_2d(COLS, ROWS, PITCH, bx, 16, mode);

		for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
			memset(box, 0xee, sizeof(box));
			ck_assert_int_eq(ap_tmap_load(&d, g, at[i], box, sizeof(box), why, sizeof(why)), 16 * sw);
			for (int r = 0; r < 16; r++)
				for (int c = 0; c < (int)bx; c++) {
					int64_t gx = at[i][0] + c, gy = at[i][1] + r;
					uint16_t want = gx >= 0 && gx < COLS && gy >= 0 && gy < ROWS
							? g[gy * PITCH / 2 + gx] : 0, kv, mv;

					memcpy(&kv, box + wg_test_place(false, 16, 8 * sw, sw, 2, r, c), 2);
					memcpy(&mv, box + wg_test_place(true, 16 * sw, 8 * sw, sw, 2, c, r), 2);
					ck_assert_msg(kv == want && mv == want,
						      "swizzle %d at (%d, %d): box (%d, %d) K-major %#x MN-major %#x, want %#x",
						      sw, at[i][0], at[i][1], r, c, kv, mv, want);
				}
		}
	}
}
END_TEST

/* Unswizzled loads are dense; element strides take every n-th row; the
 * NaN fill; and the loads refused: a destination too small or misaligned,
 * an interleaved map. */
START_TEST(tmap_load_strides_fill_refusals)
{
	static float g[12 * 20];
	_Alignas(1024) static uint8_t box[2048];
	ap_tmap_desc d = { .dtype = AP_TMAP_FLOAT32, .rank = 2, .dims = { 20, 12 }, .strides = { 80 },
			   .box = { 8, 8 }, .estrides = { 1, 3 }, .oob = AP_TMAP_OOB_NAN };
	const int32_t c0[2] = { 16, 4 };
	char why[160];
	float *f = (float *)box;

	for (int i = 0; i < 12 * 20; i++)
		g[i] = (float)i;
	ck_assert_int_eq(ap_tmap_load(&d, g, c0, box, sizeof(box), why, sizeof(why)), 8 * 3 * 4);
	for (int r = 0; r < 3; r++)
		for (int c = 0; c < 8; c++) {
			int gx = 16 + c, gy = 4 + 3 * r;
			uint32_t bits;

			memcpy(&bits, &f[r * 8 + c], 4);
			if (gx < 20 && gy < 12)
				ck_assert_msg(f[r * 8 + c] == g[gy * 20 + gx], "(%d, %d): %g", r, c, f[r * 8 + c]);
			else
				ck_assert_msg(bits == 0x7fffffffu, "(%d, %d) outside: %#x", r, c, bits);
		}
	ck_assert_int_eq(ap_tmap_load(&d, g, c0, box, 95, why, sizeof(why)), -1);
	ck_assert_ptr_nonnull(strstr(why, "do not fit"));
	ck_assert_int_eq(ap_tmap_load(&d, g, c0, box + 16, 1024, why, sizeof(why)), -1);
	ck_assert_ptr_nonnull(strstr(why, "aligned to 128"));
	d.swizzle = AP_TMAP_SWIZZLE_32B;
	ck_assert_int_eq(ap_tmap_load(&d, g, c0, box + 128, 1024, why, sizeof(why)), -1);
	ck_assert_ptr_nonnull(strstr(why, "aligned to 256"));
	d.swizzle = AP_TMAP_SWIZZLE_NONE;
	d.rank = 3;
	d.dims[2] = 1;
	d.strides[1] = 960;
	d.box[2] = 1;
	d.estrides[2] = 1;
	d.interleave = AP_TMAP_INTERLEAVE_16B;
	ck_assert_int_eq(ap_tmap_check(&d, g, why, sizeof(why)), 0);
	ck_assert_int_eq(ap_tmap_load(&d, g, (const int32_t[3]){ 0, 0, 0 }, box, sizeof(box), why, sizeof(why)), -1);
	ck_assert_ptr_nonnull(strstr(why, "not emulated"));
}
END_TEST

/* Rule mbarrier and the builders' refusals: an ordinary store or load on
 * an mbarrier array, a wait under thread-dependent control flow, a bulk
 * copy of a size that is not a multiple of 16, an mbarrier statement on
 * an ordinary array, a constant count out of range; a good kernel
 * passes. */
START_TEST(mbarrier_rules)
{
	static const char *says[] = { "mbarrier array bars used by an ordinary statement",
				      "load of mbarrier array bars", "rule uniform: mbarrier wait" };
	ap_error err;

	for (int i = 0; i < 4; i++) {
		ap_kir_kernel *k = ap_kir_kernel_new("mbar_rules");
		ap_kir_array *g = ap_kir_param(k, "g", AP_DT_F32, true, -1);
		ap_kir_array *t = ap_kir_shared(k, "t", AP_DT_F32, 64);
		ap_kir_array *bars = ap_kir_mbarriers(k, "bars", 2);
		ap_kir_expr *tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
		ap_kir_stmt *s;

		k->block[0] = 64;
		g->size = 64;
		ap_kir_mbar_init(k, &k->body, bars, ap_kir_idx(k, 1), ap_kir_int(k, AP_DT_I32, 64));
		ap_kir_bulk_copy(k, &k->body, t, ap_kir_idx(k, 0), g, ap_kir_idx(k, 0), 256, bars, ap_kir_idx(k, 1));
		if (i == 0)
			ap_kir_store(k, &k->body, bars, ap_kir_idx(k, 0), ap_kir_i64(k, 0));
		if (i == 1)
			ap_kir_store(k, &k->body, g, tid, ap_kir_cast(k, AP_DT_F32, ap_kir_load(k, bars, ap_kir_idx(k, 0))));
		s = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_LT, tid, ap_kir_idx(k, i == 2 ? 32 : 64)));
		if (i == 2)
			ap_kir_mbar_wait(k, &s->body, bars, ap_kir_idx(k, 1), ap_kir_idx(k, 0));
		else
			ap_kir_mbar_wait(k, &k->body, bars, ap_kir_idx(k, 1), ap_kir_idx(k, 0));
		ck_assert(!ap_kir_failed(k));
		if (i == 3) {
			ck_assert_msg(ap_kir_verify(k, NULL, &err) == 0, "%s", err.msg);
		} else {
			ck_assert_int_ne(ap_kir_verify(k, NULL, &err), 0);
			ck_assert_msg(strstr(err.msg, says[i]), "case %d: %s", i, err.msg);
		}
		/* the builders refuse */
		ck_assert_ptr_null(ap_kir_bulk_copy(k, &k->body, t, ap_kir_idx(k, 0), g, ap_kir_idx(k, 0), 24, bars,
						    ap_kir_idx(k, 0)));
		ap_kir_kernel_free(k);
	}
	{
		ap_kir_kernel *k = ap_kir_kernel_new("mbar_build");
		ap_kir_array *t = ap_kir_shared(k, "t", AP_DT_I64, 2);

		ck_assert_ptr_null(ap_kir_mbar_init(k, &k->body, t, ap_kir_idx(k, 0), ap_kir_int(k, AP_DT_I32, 1)));
		ap_kir_kernel_free(k);
		k = ap_kir_kernel_new("mbar_build");
		t = ap_kir_mbarriers(k, "bars", 1);
		ck_assert_ptr_null(ap_kir_mbar_init(k, &k->body, t, ap_kir_idx(k, 0), ap_kir_int(k, AP_DT_I32, 1 << 20)));
		ap_kir_kernel_free(k);
		k = ap_kir_kernel_new("mbar_build");
		ck_assert_ptr_null(ap_kir_mbarriers(k, "bars", 65));
		ap_kir_kernel_free(k);
	}
	/* rule tma and its builders: a 128-byte-swizzled box into an array
	 * aligned to 16 only; a map of another type; a load from an array
	 * without a map */
	{
		ap_tmap_desc d = { .dtype = AP_TMAP_FLOAT16, .rank = 2, .dims = { 64, 64 }, .strides = { 128 },
				   .box = { 64, 8 }, .estrides = { 1, 1 }, .swizzle = AP_TMAP_SWIZZLE_128B };
		ap_kir_kernel *k = ap_kir_kernel_new("tma_rules");
		ap_kir_array *g = ap_kir_param(k, "g", AP_DT_F16, false, -1);
		ap_kir_array *h = ap_kir_param(k, "h", AP_DT_F32, false, -1);
		ap_kir_array *t = ap_kir_shared_dyn(k, "t", AP_DT_F16, 512);
		ap_kir_array *bars = ap_kir_mbarriers(k, "bars", 1);
		ap_kir_expr *co[2] = { ap_kir_idx(k, 0), ap_kir_idx(k, 8) };

		k->block[0] = 32;
		g->size = h->size = 64 * 64;
		ck_assert_int_eq(ap_kir_tensor_map(k, g, &d), 0);
		ck_assert_ptr_nonnull(ap_kir_tma_load(k, &k->body, t, ap_kir_idx(k, 0), g, co, bars, ap_kir_idx(k, 0)));
		ck_assert_int_ne(ap_kir_verify(k, NULL, &err), 0);
		ck_assert_msg(strstr(err.msg, "rule tma") && strstr(err.msg, "swizzle needs 1024"), "%s", err.msg);
		ap_kir_kernel_free(k);
		k = ap_kir_kernel_new("tma_rules");
		h = ap_kir_param(k, "h", AP_DT_F32, false, -1);
		ck_assert_int_eq(ap_kir_tensor_map(k, h, &d), -1);
		ck_assert(ap_kir_failed(k));
		ap_kir_kernel_free(k);
		k = ap_kir_kernel_new("tma_rules");
		g = ap_kir_param(k, "g", AP_DT_F16, false, -1);
		t = ap_kir_shared_dyn_aligned(k, "t", AP_DT_F16, 512, 1024);
		bars = ap_kir_mbarriers(k, "bars", 1);
		co[0] = ap_kir_idx(k, 0);
		co[1] = ap_kir_idx(k, 0);
		ck_assert_ptr_null(ap_kir_tma_load(k, &k->body, t, ap_kir_idx(k, 0), g, co, bars, ap_kir_idx(k, 0)));
		ap_kir_kernel_free(k);
	}
}
END_TEST

START_TEST(shared_dyn_aligned_and_swizzle_rule)
{
	ap_kir_kernel *k = ap_kir_kernel_new("aligned_dyn");
	ap_kir_array *a, *b, *c, *bad, *acc;
	ap_kir_wg_layout lk = {false, 16, 1024, 128};
	ap_error err;
	char *cuda = NULL;

	ck_assert_ptr_nonnull(k);
	a = ap_kir_shared_dyn(k, "a", AP_DT_F16, 24);                 /* 48 bytes at 0 */
	b = ap_kir_shared_dyn_aligned(k, "b", AP_DT_F16, 512, 1024);   /* 1024 bytes at 1024 */
	c = ap_kir_shared_dyn_aligned(k, "c", AP_DT_F16, 8, 256);      /* at 2048 */
	ck_assert(a && b && c);
	ck_assert_uint_eq(a->offset, 0);
	ck_assert_uint_eq(b->offset, 1024);
	ck_assert_uint_eq(c->offset, 2048);
	ck_assert_uint_eq(k->smem_align, 1024);
	ck_assert_uint_eq(k->smem_bytes, 2048 + 16 + 1008);
	/* the emitters' sizing before they build: the same bytes */
	ck_assert_uint_eq(ap_kir_shared_dyn_bytes(3, (const size_t[]){ 48, 1024, 16 },
						  (const unsigned[]){ 0, 1024, 256 }), 2048 + 16 + 1008);
	ck_assert_uint_eq(ap_kir_shared_dyn_bytes(2, (const size_t[]){ 48, 16 }, (const unsigned[]){ 16, 0 }), 64);
	/* the widest atom row dividing the extent and the starts */
	ck_assert_int_eq(ap_kir_wg_swizzle_fit(256, 128), 128);
	ck_assert_int_eq(ap_kir_wg_swizzle_fit(192, 192), 64);
	ck_assert_int_eq(ap_kir_wg_swizzle_fit(256, 96), 32);
	ck_assert_int_eq(ap_kir_wg_swizzle_fit(80, 80), 0);
	bad = ap_kir_shared_dyn_aligned(k, "bad", AP_DT_F16, 8, 48);
	ck_assert_ptr_null(bad);
	ck_assert(ap_kir_failed(k));
	ap_kir_kernel_free(k);

	k = ap_kir_kernel_new("swizzle_rule");
	k->block[0] = 128;
	a = ap_kir_shared_dyn(k, "a", AP_DT_F16, 4096);                /* 16-byte aligned only */
	b = ap_kir_shared_dyn_aligned(k, "b", AP_DT_F16, 4096, 1024);
	acc = ap_kir_local(k, "acc", AP_DT_F32, 32);
	ck_assert_ptr_nonnull(ap_kir_wgmma(k, &k->body, AP_KIR_WGMMA_F16, 64, acc, ap_kir_idx(k, 0), b,
					   ap_kir_idx(k, 0), lk, b, ap_kir_idx(k, 0), lk));
	ck_assert_int_eq(ap_kir_verify(k, NULL, &err), 0);
	cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
	ck_assert_ptr_nonnull(cuda);
	ck_assert_ptr_nonnull(strstr(cuda, "__cvta_generic_to_shared(ap_smem_raw)) & 1023u"));
	free(cuda);
	ck_assert_ptr_nonnull(ap_kir_wgmma(k, &k->body, AP_KIR_WGMMA_F16, 64, acc, ap_kir_idx(k, 0), a,
					   ap_kir_idx(k, 0), lk, b, ap_kir_idx(k, 0), lk));
	ck_assert_int_eq(ap_kir_verify(k, NULL, &err), AP_EINTERNAL);
	ck_assert_msg(strstr(err.msg, "rule swizzle") != NULL, "%s", err.msg);
	/* a swizzle the ISA has not: the builder refuses it */
	lk.swizzle = 16;
	ck_assert_ptr_null(ap_kir_wgmma(k, &k->body, AP_KIR_WGMMA_F16, 64, acc, ap_kir_idx(k, 0), b,
					ap_kir_idx(k, 0), lk, b, ap_kir_idx(k, 0), lk));
	ap_kir_kernel_free(k);
}
END_TEST

/* Rule wgmma_regs: a wgmma's registers (accumulators, an A fragment in
 * registers) touched by another statement before a wait_group covers its
 * commit group -- straight-line, across a loop whose wait leaves one
 * group in flight (the GEMM's overlap), in one arm of an if -- reported;
 * the same kernels with the wait in place pass. */
static ap_kir_kernel *wg_regs_kernel(int variant)
{
	ap_kir_kernel *k = ap_kir_kernel_new("wg_regs");
	ap_kir_wg_layout lk = {false, 16, 1024, 128};
	ap_kir_array *out, *b, *acc, *fa;
	ap_kir_expr *tid;
	ap_kir_block *body = &k->body;
	ap_kir_var *kt = NULL;

	k->block[0] = 128;
	out = ap_kir_param(k, "p0", AP_DT_F32, true, -1);
	b = ap_kir_shared_dyn_aligned(k, "b", AP_DT_F16, 4096, 1024);
	acc = ap_kir_local(k, "acc", AP_DT_F32, 32);
	fa = ap_kir_local(k, "fa", AP_DT_F16, 8);
	tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	if (variant == 2 || variant == 3) {   /* K tiles with one group left in flight */
		ap_kir_stmt *l;

		kt = ap_kir_var_new(k, AP_DT_I64, "kt");
		l = ap_kir_for(k, body, kt, ap_kir_idx(k, 0), ap_kir_idx(k, 4), 1);
		body = &l->body;
	}
	ap_kir_wgmma_fence(k, body, acc);
	if (variant == 4) {
		ap_kir_wgmma(k, body, AP_KIR_WGMMA_F16, 64, acc, ap_kir_idx(k, 0), fa, ap_kir_idx(k, 0), lk, b,
			     ap_kir_idx(k, 0), lk);
	} else {
		ap_kir_wgmma(k, body, AP_KIR_WGMMA_F16, 64, acc, ap_kir_idx(k, 0), b, ap_kir_idx(k, 0), lk, b,
			     ap_kir_idx(k, 0), lk);
	}
	ap_kir_wgmma_commit(k, body);
	if (variant == 2 || variant == 3)
		ap_kir_wgmma_wait(k, body, 1, acc);
	if (variant == 0 || variant == 3)
		ap_kir_wgmma_wait(k, &k->body, 0, acc);
	if (variant == 5) {   /* waited for in one arm only */
		ap_kir_stmt *c = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_LT, ap_kir_index_of(k, AP_KIR_BLOCK_X),
								       ap_kir_idx(k, 1)));
		ap_kir_wgmma_wait(k, &c->body, 0, acc);
	}
	if (variant == 6) {   /* acc complete; another accumulator in flight from one arm only */
		ap_kir_array *acc2 = ap_kir_local(k, "acc2", AP_DT_F32, 32);
		ap_kir_stmt *c;

		ap_kir_wgmma_wait(k, &k->body, 0, acc);
		c = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_LT, ap_kir_index_of(k, AP_KIR_BLOCK_X),
							 ap_kir_idx(k, 1)));
		ap_kir_wgmma_fence(k, &c->orelse, acc2);
		ap_kir_wgmma(k, &c->orelse, AP_KIR_WGMMA_F16, 64, acc2, ap_kir_idx(k, 0), b, ap_kir_idx(k, 0), lk, b,
			     ap_kir_idx(k, 0), lk);
		ap_kir_wgmma_commit(k, &c->orelse);
	}
	if (variant == 4)   /* the A fragment rewritten under the wgmma reading it */
		ap_kir_store(k, &k->body, fa, ap_kir_idx(k, 0), ap_kir_const(k, AP_DT_F16, 0));
	ap_kir_store(k, &k->body, out, tid, ap_kir_load(k, acc, ap_kir_idx(k, 0)));
	return k;
}

START_TEST(wgmma_regs_in_flight)
{
	/* variant: 0 waited, 1 no wait, 2 loop's wait 1 only, 3 and a wait 0 after,
	 * 4 A fragment stored to in flight, 5 a wait in one arm, 6 waited, then
	 * another accumulator in flight from one arm (acc itself is complete) */
	static const bool ok[7] = { true, false, false, true, false, false, true };
	static const char *const what[7] = { NULL, "register array acc", "register array acc", NULL,
					     "register array fa", "register array acc", NULL };

	for (int variant = 0; variant < 7; variant++) {
		ap_kir_kernel *k = wg_regs_kernel(variant);
		ap_error err;
		int rc;

		ck_assert_ptr_nonnull(k);
		ck_assert(!ap_kir_failed(k));
		ap_error_clear(&err);
		rc = ap_kir_verify(k, NULL, &err);
		if (ok[variant]) {
			ck_assert_msg(rc == 0, "variant %d: %s", variant, err.msg);
		} else {
			ck_assert_msg(rc == AP_EINTERNAL && strstr(err.msg, "rule wgmma_regs") &&
				      strstr(err.msg, what[variant]), "variant %d: %d %s", variant, rc, err.msg);
		}
		ap_kir_kernel_free(k);
	}
}
END_TEST

static Suite *kir_suite(void)
{
	Suite *s = suite_create("kir");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, elementwise_grid_stride);
	tcase_add_test(tc, block_reduction_static_shared);
	tcase_add_test(tc, block_reduction_dynamic_shared_2d);
	tcase_add_test(tc, registers_across_barrier);
	tcase_add_test(tc, folding_and_literals);
	tcase_add_test(tc, hostcc_reports_errors);
	tcase_add_test(tc, host_printer_refuses_divergent_barrier);
	tcase_add_test(tc, hostcc_concurrent);
	suite_add_tcase(s, tc);

	tc = tcase_create("half");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, half_table_c_functions);
	tcase_add_test(tc, half_conversions_host);
	tcase_add_test(tc, half_arith_f16);
	tcase_add_test(tc, half_arith_bf16);
	suite_add_tcase(s, tc);

	tc = tcase_create("shfl");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, shfl_block_32);
	tcase_add_test(tc, shfl_block_64_2d);
	tcase_add_test(tc, shfl_block_96);
	tcase_add_test(tc, shfl_block_8);
	tcase_add_test(tc, shfl_tree_sum_256);
	tcase_add_test(tc, shfl_refused);
	suite_add_tcase(s, tc);

	tc = tcase_create("vector");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, vector_width_rules);
	tcase_add_test(tc, vector_loads_stores);
	suite_add_tcase(s, tc);

	tc = tcase_create("tensor_cores");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, mma_f16);
	tcase_add_test(tc, mma_bf16);
	tcase_add_test(tc, mma_tf32);
	tcase_add_test(tc, wgmma_f16);
	tcase_add_test(tc, wgmma_bf16);
	tcase_add_test(tc, wgmma_swizzled);
	tcase_add_test(tc, wgmma_tf32);
	tcase_add_test(tc, ex2_approx);
	tcase_add_test(tc, wgmma_regs_in_flight);
	tcase_add_test(tc, shared_dyn_aligned_and_swizzle_rule);
	tcase_add_test(tc, tmap_rules);
	tcase_add_test(tc, tmap_load_swizzled);
	tcase_add_test(tc, tmap_load_strides_fill_refusals);
	tcase_add_test(tc, mbarrier_rules);
	tcase_add_test(tc, tf32_rounding);
	tcase_add_test(tc, cp_async_zero_fill);
	tcase_add_test(tc, matrix_rules);
	suite_add_tcase(s, tc);

	tc = tcase_create("utilities");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, int_ops_fold);
	tcase_add_test(tc, int_ops_host);
	tcase_add_test(tc, visitor_order);
	tcase_add_test(tc, visitor_post_order);
	tcase_add_test(tc, clone_stitch_two_kernels);
	tcase_add_test(tc, verify_rules);
	tcase_add_test(tc, cluster_distributed_shared_memory);
	tcase_add_test(tc, cluster_rules);
	tcase_add_test(tc, shared_budget_counts_alignment);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(kir_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
