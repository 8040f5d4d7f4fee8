/* check_kir.c -- the kernel IR and its two printers.
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
 */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/backend/backend.h"
#include "server/kir/kir.h"

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
