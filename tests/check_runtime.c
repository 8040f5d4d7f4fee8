/* check_runtime.c -- the bundle runtime (client/runtime.c) on hand-made
 * bundles whose kernels are compiled here with `cc` from small C sources
 * that follow the host kernel ABI of server/plan/program.h, so the suite
 * depends on neither the compiler core nor the daemon.
 *
 * The plan under test: y = relu(x + w) then z = sum over rows of y, through
 * an intermediate in the workspace, with many blocks so the thread pool
 * splits launches.  Then binding errors (dtype, byte size, unknown names,
 * unbound inputs), malformed bundles (indices, counts, workspace bounds),
 * and the GPU path, tagged gpu: it runs only where libcuda.so.1 and a
 * device exist and otherwise prints why it was skipped.
 */
#include <check.h>
#include <dlfcn.h>
#include <elf.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/tmap.h"
#include "client/library.h"
#include "client/runtime.h"
#include "client/tool.h"
#include "proto/apollo.pb-c.h"
#include "server/backend/backend.h"
#include "tests/lib/require.h"
#include "tests/lib/tma_box.h"

#define ROWS 300
#define COLS 64

/* add_relu: one block per row, out = max(x + w, 0) (w broadcast over rows).
 * rowsum: one block per row, z[r] = sum_c y[r, c]. */
static const char *kernel_src =
	"#include <math.h>\n"
	"void add_relu(void *const *args, unsigned b0, unsigned b1) {\n"
	"  const float *x = args[0], *w = args[1]; float *y = args[2];\n"
	"  for (unsigned b = b0; b < b1; b++)\n"
	"    for (unsigned c = 0; c < 64; c++) {\n"
	"      float v = x[b * 64 + c] + w[c]; y[b * 64 + c] = v > 0 ? v : 0; }\n"
	"}\n"
	"void rowsum(void *const *args, unsigned b0, unsigned b1) {\n"
	"  const float *y = args[0]; float *z = args[1];\n"
	"  for (unsigned b = b0; b < b1; b++) {\n"
	"    float s = 0; for (unsigned c = 0; c < 64; c++) s += y[b * 64 + c];\n"
	"    z[b] = s; }\n"
	"}\n";

static uint8_t *so_blob;
static size_t so_len;
static char so_why[1024];

/* Compiles kernel_src once into a shared object and keeps its bytes. */
static void build_so(void)
{
	char dir[] = "/tmp/apollo-check-runtime-XXXXXX", src[128], so[128], cmd[512];
	FILE *f;
	ap_error err;

	if (so_blob || so_why[0])
		return;
	if (!mkdtemp(dir)) {
		snprintf(so_why, sizeof(so_why), "mkdtemp failed");
		return;
	}
	snprintf(src, sizeof(src), "%s/k.c", dir);
	snprintf(so, sizeof(so), "%s/k.so", dir);
	f = fopen(src, "w");
	fputs(kernel_src, f);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "%s -O2 -shared -fPIC -o %s %s -lm",
		 getenv("CC") && *getenv("CC") ? getenv("CC") : "cc", so, src);
	if (system(cmd) != 0)
		snprintf(so_why, sizeof(so_why), "'%s' failed", cmd);
	else if (ap_file_read(so, (size_t)1 << 26, &so_blob, &so_len, &err) < 0)
		snprintf(so_why, sizeof(so_why), "%s", err.msg);
	unlink(src);
	unlink(so);
	rmdir(dir);
}

/* ---- a hand-made bundle ----------------------------------------------------------- */

typedef struct hb {
	Apollo__Bundle b;
	Apollo__Kernel k[2], *kp[2];
	Apollo__KernelParam p[5], *pp0[3], *pp1[2];
	uint32_t grid[2][3], block[2][3];
	Apollo__Launch l[2], *lp[2];
	uint32_t args0[3], args1[2];
	Apollo__Buffer buf[4], *bp[4];
	int64_t d_x[2], d_w[1], d_z[1];
} hb;

/* Buffers: 0 x INPUT [ROWS, COLS], 1 w PARAM [COLS], 2 y INTERMEDIATE
 * [ROWS, COLS] at offset 256, 3 z OUTPUT [ROWS]. */
static void hb_init(hb *h, const char *target, const uint8_t *blob, size_t blob_len)
{
	static const char *pnames[5] = { "x", "w", "y", "y", "z" };
	Apollo__Bundle bi = APOLLO__BUNDLE__INIT;
	Apollo__Kernel ki = APOLLO__KERNEL__INIT;
	Apollo__KernelParam pi = APOLLO__KERNEL_PARAM__INIT;
	Apollo__Launch li = APOLLO__LAUNCH__INIT;
	Apollo__Buffer bfi = APOLLO__BUFFER__INIT;

	memset(h, 0, sizeof(*h));
	h->b = bi;
	for (int i = 0; i < 5; i++) {
		h->p[i] = pi;
		h->p[i].name = (char *)pnames[i];
		h->p[i].dtype = APOLLO__DATA_TYPE__DT_FLOAT;
	}
	h->p[2].written = 1;
	h->p[4].written = 1;
	h->pp0[0] = &h->p[0]; h->pp0[1] = &h->p[1]; h->pp0[2] = &h->p[2];
	h->pp1[0] = &h->p[3]; h->pp1[1] = &h->p[4];
	for (int k = 0; k < 2; k++) {
		h->k[k] = ki;
		h->k[k].name = k == 0 ? "add_relu" : "rowsum";
		h->k[k].target = (char *)target;
		h->k[k].format = APOLLO__OUTPUT_KIND__OUTPUT_SO;
		h->k[k].blob.data = (uint8_t *)blob;
		h->k[k].blob.len = blob_len;
		h->grid[k][0] = ROWS; h->grid[k][1] = 1; h->grid[k][2] = 1;
		h->block[k][0] = 1; h->block[k][1] = 1; h->block[k][2] = 1;
		h->k[k].n_grid = 3; h->k[k].grid = h->grid[k];
		h->k[k].n_block = 3; h->k[k].block = h->block[k];
		h->kp[k] = &h->k[k];
	}
	h->k[0].n_params = 3; h->k[0].params = h->pp0;
	h->k[1].n_params = 2; h->k[1].params = h->pp1;
	h->args0[0] = 0; h->args0[1] = 1; h->args0[2] = 2;
	h->args1[0] = 2; h->args1[1] = 3;
	for (int l = 0; l < 2; l++) {
		h->l[l] = li;
		h->l[l].kernel = (uint32_t)l;
		h->lp[l] = &h->l[l];
	}
	h->l[0].n_args = 3; h->l[0].args = h->args0;
	h->l[1].n_args = 2; h->l[1].args = h->args1;
	h->d_x[0] = ROWS; h->d_x[1] = COLS;
	h->d_w[0] = COLS;
	h->d_z[0] = ROWS;
	for (int i = 0; i < 4; i++) {
		h->buf[i] = bfi;
		h->buf[i].dtype = APOLLO__DATA_TYPE__DT_FLOAT;
		h->bp[i] = &h->buf[i];
	}
	h->buf[0].name = "x"; h->buf[0].kind = APOLLO__BUFFER_KIND__BUF_INPUT;
	h->buf[0].n_dims = 2; h->buf[0].dims = h->d_x; h->buf[0].bytes = ROWS * COLS * 4;
	h->buf[0].index = 0;
	h->buf[1].name = "w"; h->buf[1].kind = APOLLO__BUFFER_KIND__BUF_PARAM;
	h->buf[1].n_dims = 1; h->buf[1].dims = h->d_w; h->buf[1].bytes = COLS * 4;
	h->buf[1].index = -1;
	h->buf[2].name = "y"; h->buf[2].kind = APOLLO__BUFFER_KIND__BUF_INTERMEDIATE;
	h->buf[2].n_dims = 2; h->buf[2].dims = h->d_x; h->buf[2].bytes = ROWS * COLS * 4;
	h->buf[2].offset = 256; h->buf[2].index = -1;
	h->buf[3].name = "z"; h->buf[3].kind = APOLLO__BUFFER_KIND__BUF_OUTPUT;
	h->buf[3].n_dims = 1; h->buf[3].dims = h->d_z; h->buf[3].bytes = ROWS * 4;
	h->buf[3].index = 0;
	h->b.target = (char *)target;
	h->b.format = APOLLO__OUTPUT_KIND__OUTPUT_SO;
	h->b.n_kernels = 2; h->b.kernels = h->kp;
	h->b.n_plan = 2; h->b.plan = h->lp;
	h->b.n_buffers = 4; h->b.buffers = h->bp;
	h->b.workspace_bytes = 256 + ROWS * COLS * 4;
}

/* Packs the hand-made bundle and unpacks it as a client would receive it. */
/* Gives every kernel without a digest the SHA-256 of its blob, as the
 * daemon does (the runtime loads nothing else). */
/* Finishes a hand-built bundle as the daemon would: each kernel's digest,
 * and each launch's per-argument bytes (its buffers' sizes, unless the test
 * set them). */
static void sign(const Apollo__Bundle *bb)
{
	static uint8_t digests[16][32];
	static uint64_t arg_bytes[16][8];

	ck_assert_uint_le(bb->n_kernels, 16);
	ck_assert_uint_le(bb->n_plan, 16);
	for (size_t k = 0; k < bb->n_kernels; k++) {
		Apollo__Kernel *kk = bb->kernels[k];
		if (kk->digest.len)
			continue;
		ap_sha256(kk->blob.data, kk->blob.len, digests[k]);
		kk->digest.data = digests[k];
		kk->digest.len = 32;
	}
	for (size_t l = 0; l < bb->n_plan; l++) {
		Apollo__Launch *la = bb->plan[l];

		if (la->n_arg_bytes || la->n_args > 8)
			continue;
		for (size_t a = 0; a < la->n_args; a++)
			arg_bytes[l][a] = la->args[a] < bb->n_buffers ? bb->buffers[la->args[a]]->bytes : 0;
		la->arg_bytes = arg_bytes[l];
		la->n_arg_bytes = la->n_args;
	}
}

static ap_bundle *hb_bundle(const hb *h)
{
	size_t n;
	ap_bundle *b;
	ap_error err;
	uint8_t *buf;

	sign(&h->b);
	n = apollo__bundle__get_packed_size(&h->b);
	buf = malloc(n);
	apollo__bundle__pack(&h->b, buf);
	b = ap_bundle_unpack(buf, n, &err);
	free(buf);
	ck_assert_ptr_nonnull(b);
	return b;
}

static ap_host_tensor *make_f32(const char *name, int rank, int64_t d0, int64_t d1, float seed)
{
	ap_host_tensor *t = calloc(1, sizeof(*t));
	int64_t n = rank == 1 ? d0 : d0 * d1;

	t->name = strdup(name);
	t->dtype = AP_DT_F32;
	t->rank = rank;
	t->dims[0] = d0;
	t->dims[1] = d1;
	t->nbytes = (size_t)n * 4;
	t->data = malloc(t->nbytes);
	for (int64_t i = 0; i < n; i++)
		((float *)t->data)[i] = (float)((i * 37 % 101) - 50) * 0.01f * seed;
	return t;
}

static ap_params *make_params(ap_host_tensor *w)
{
	ap_params *p = calloc(1, sizeof(*p));

	p->n = 1;
	p->items = calloc(1, sizeof(ap_host_tensor *));
	p->items[0] = w;
	return p;
}

static void expect_rowsum(const ap_host_tensor *x, const ap_host_tensor *w, const ap_host_tensor *z)
{
	const float *xv = x->data, *wv = w->data, *zv = z->data;

	ck_assert_int_eq(z->dtype, AP_DT_F32);
	ck_assert_int_eq(z->rank, 1);
	ck_assert_int_eq(z->dims[0], ROWS);
	ck_assert_str_eq(z->name, "z");
	for (int r = 0; r < ROWS; r++) {
		float s = 0;
		for (int c = 0; c < COLS; c++) {
			float v = xv[r * COLS + c] + wv[c];
			s += v > 0 ? v : 0;
		}
		ck_assert_msg(ap_compare_close(zv[r], s, 1e-5, 1e-6), "row %d: %g vs %g", r,
			      (double)zv[r], (double)s);
	}
}

START_TEST(host_runs_plan)
{
	hb h;
	ap_bundle *b;
	ap_runtime *rt;
	ap_error err;
	ap_host_tensor *x, *w, *z;
	ap_params *params;
	static const int threads[] = { 1, 2, 3, 7 };

	build_so();
	if (!so_blob) {
		AP_SKIP("cc", "host_runs_plan: SKIPPED: cannot build the test kernel: %s", so_why);
		return;
	}
	hb_init(&h, "cpu", so_blob, so_len);
	b = hb_bundle(&h);
	x = make_f32("x", 2, ROWS, COLS, 1.0f);
	w = make_f32("w", 1, COLS, 0, 0.5f);
	params = make_params(w);
	for (size_t i = 0; i < sizeof(threads) / sizeof(threads[0]); i++) {
		ap_runtime_options opt = { .threads = threads[i] };
		rt = ap_runtime_new(b, &opt, &err);
		ck_assert_msg(rt != NULL, "%s", err.msg);
		ck_assert(ap_runtime_is_host(rt));
		ck_assert_int_eq(ap_runtime_n_inputs(rt), 1);
		ck_assert_int_eq(ap_runtime_n_outputs(rt), 1);
		ck_assert_int_eq(ap_runtime_bind_input(rt, 0, x, &err), 0);
		ck_assert_int_eq(ap_runtime_bind_params(rt, params, &err), 0);
		ck_assert_int_eq(ap_runtime_run(rt, &err), 0);
		z = ap_runtime_output(rt, 0, &err);
		ck_assert_ptr_nonnull(z);
		expect_rowsum(x, w, z);
		ap_host_tensor_free(z);
		/* Rebinding and running again gives the new answer. */
		for (int j = 0; j < ROWS * COLS; j++)
			((float *)x->data)[j] *= -1;
		ck_assert_int_eq(ap_runtime_bind_name(rt, "x", x, &err), 0);
		ck_assert_int_eq(ap_runtime_run(rt, &err), 0);
		z = ap_runtime_output(rt, 0, &err);
		expect_rowsum(x, w, z);
		ap_host_tensor_free(z);
		ck_assert_ptr_null(ap_runtime_output(rt, 1, &err));
		ck_assert_int_eq(err.code, AP_EINVAL);
		ap_runtime_free(rt);
	}
	ap_params_free(params);
	ap_host_tensor_free(x);
	ap_bundle_free(b);
	ck_assert_ptr_null(ap_runtime_free(NULL));
}
END_TEST

START_TEST(binding_errors)
{
	hb h;
	ap_bundle *b;
	ap_runtime *rt;
	ap_error err;
	ap_host_tensor *x, *w_short, *w_int, *w;
	ap_params *empty = calloc(1, sizeof(ap_params));

	build_so();
	if (!so_blob) {
		AP_SKIP("cc", "binding_errors: SKIPPED: cannot build the test kernel: %s", so_why);
		free(empty);
		return;
	}
	hb_init(&h, "cpu", so_blob, so_len);
	b = hb_bundle(&h);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_ptr_nonnull(rt);
	x = make_f32("x", 2, ROWS, COLS, 1.0f);
	w = make_f32("w", 1, COLS, 0, 1.0f);
	w_short = make_f32("w", 1, COLS - 1, 0, 1.0f);
	w_int = make_f32("w", 1, COLS, 0, 1.0f);
	w_int->dtype = AP_DT_I32;

	/* Nothing bound: the run names the input. */
	ck_assert_int_eq(ap_runtime_run(rt, &err), AP_EINVAL);
	ck_assert_str_eq(err.tensor, "x");
	ck_assert_int_eq(ap_runtime_bind_input(rt, 0, x, &err), 0);
	/* Input bound, param not. */
	ck_assert_int_eq(ap_runtime_run(rt, &err), AP_EINVAL);
	ck_assert_str_eq(err.tensor, "w");
	/* Wrong byte size, wrong dtype: AP_ESHAPE with both numbers. */
	ck_assert_int_eq(ap_runtime_bind_name(rt, "w", w_short, &err), AP_ESHAPE);
	ck_assert_ptr_nonnull(strstr(err.msg, "256"));
	ck_assert_ptr_nonnull(strstr(err.msg, "252"));
	ck_assert_int_eq(ap_runtime_bind_name(rt, "w", w_int, &err), AP_ESHAPE);
	ck_assert_ptr_nonnull(strstr(err.msg, "float32"));
	ck_assert_int_eq(ap_runtime_bind_input(rt, 0, w, &err), AP_ESHAPE);
	/* Unknown names and positions. */
	ck_assert_int_eq(ap_runtime_bind_name(rt, "nope", w, &err), AP_EINVAL);
	ck_assert_int_eq(ap_runtime_bind_name(rt, "z", w, &err), AP_EINVAL);
	ck_assert_int_eq(ap_runtime_bind_input(rt, 1, x, &err), AP_EINVAL);
	/* A store without the param. */
	ck_assert_int_eq(ap_runtime_bind_params(rt, empty, &err), AP_EINVAL);
	ck_assert_str_eq(err.tensor, "w");
	ck_assert_int_eq(ap_runtime_bind_params(rt, NULL, &err), AP_EINVAL);
	/* Still not runnable after the failed binds. */
	ck_assert_int_eq(ap_runtime_run(rt, &err), AP_EINVAL);
	ck_assert_int_eq(ap_runtime_bind_name(rt, "w", w, &err), 0);
	ck_assert_int_eq(ap_runtime_run(rt, &err), 0);

	ap_runtime_free(rt);
	ap_host_tensor_free(x);
	ap_host_tensor_free(w);
	ap_host_tensor_free(w_short);
	ap_host_tensor_free(w_int);
	free(empty);
	ap_bundle_free(b);
}
END_TEST

/* Buffers bound to the caller's memory (ap_runtime_bind_ptr) with no
 * allocation up front (options.external): the plan reads and writes the
 * caller's arrays; the errors name the buffer. */
START_TEST(zero_copy_binding)
{
	hb h;
	ap_bundle *b;
	ap_runtime *rt;
	ap_error err;
	ap_runtime_options opt = { .threads = 2, .external = true };
	ap_host_tensor *x, *w, *z;
	float *xs, *ws, *zs;

	build_so();
	if (!so_blob) {
		AP_SKIP("cc", "zero_copy_binding: SKIPPED: cannot build the test kernel: %s", so_why);
		return;
	}
	hb_init(&h, "cpu", so_blob, so_len);
	b = hb_bundle(&h);
	rt = ap_runtime_new(b, &opt, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	x = make_f32("x", 2, ROWS, COLS, 1.0f);
	w = make_f32("w", 1, COLS, 0, 0.5f);
	z = make_f32("z", 1, ROWS, 0, 0.0f);
	ck_assert_int_eq(posix_memalign((void **)&xs, 64, x->nbytes), 0);
	ck_assert_int_eq(posix_memalign((void **)&ws, 64, w->nbytes + 4), 0);
	ck_assert_int_eq(posix_memalign((void **)&zs, 64, z->nbytes), 0);
	memcpy(xs, x->data, x->nbytes);
	memcpy(ws, w->data, w->nbytes);
	/* buffers: 0 x, 1 w, 2 y (intermediate), 3 z */
	ck_assert_int_eq(ap_runtime_bind_ptr(rt, 0, xs, x->nbytes, &err), 0);
	ck_assert_int_eq(ap_runtime_run(rt, &err), AP_EINVAL);
	ck_assert_str_eq(err.tensor, "w");
	ck_assert_int_eq(ap_runtime_bind_ptr(rt, 1, ws, w->nbytes - 4, &err), AP_ESHAPE);
	ck_assert_str_eq(err.tensor, "w");
	ck_assert_int_eq(ap_runtime_bind_ptr(rt, 1, (char *)ws + 4, w->nbytes, &err), AP_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "aligned"));
	ck_assert_int_eq(ap_runtime_bind_ptr(rt, 1, NULL, w->nbytes, &err), AP_EINVAL);
	ck_assert_int_eq(ap_runtime_bind_ptr(rt, 2, xs, x->nbytes, &err), AP_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "intermediate"));
	ck_assert_int_eq(ap_runtime_bind_ptr(rt, 9, xs, x->nbytes, &err), AP_EINVAL);
	ck_assert_int_eq(ap_runtime_bind_ptr(rt, 1, ws, w->nbytes, &err), 0);
	ck_assert_int_eq(ap_runtime_bind_ptr(rt, 3, zs, z->nbytes, &err), 0);
	ck_assert_int_eq(ap_runtime_run_stream(rt, NULL, &err), 0);
	memcpy(z->data, zs, z->nbytes);
	expect_rowsum(x, w, z);
	/* The caller's arrays are read afresh on every run. */
	for (int j = 0; j < ROWS * COLS; j++)
		xs[j] = -xs[j];
	memcpy(x->data, xs, x->nbytes);
	ck_assert_int_eq(ap_runtime_run(rt, &err), 0);
	memcpy(z->data, zs, z->nbytes);
	expect_rowsum(x, w, z);
	/* A copy-bind after a pointer bind gives the buffer its own memory
	 * again; an output never bound gets its own at the run. */
	ck_assert_int_eq(ap_runtime_bind_input(rt, 0, x, &err), 0);
	xs[0] = 12345.0f;
	ap_runtime_free(rt);
	rt = ap_runtime_new(b, &opt, &err);
	ck_assert_int_eq(ap_runtime_bind_input(rt, 0, x, &err), 0);
	ck_assert_int_eq(ap_runtime_bind_ptr(rt, 1, ws, w->nbytes, &err), 0);
	ck_assert_int_eq(ap_runtime_run(rt, &err), 0);
	ap_host_tensor_free(z);
	z = ap_runtime_output(rt, 0, &err);
	ck_assert_ptr_nonnull(z);
	expect_rowsum(x, w, z);
	ap_runtime_free(rt);
	free(xs);
	free(ws);
	free(zs);
	ap_host_tensor_free(x);
	ap_host_tensor_free(w);
	ap_host_tensor_free(z);
	ap_bundle_free(b);
}
END_TEST

/* A PARAM buffer that names a CONST tensor of the compiled graph is bound
 * from the graph's bytes. */
START_TEST(params_from_graph_consts)
{
	hb h;
	ap_bundle *b;
	ap_runtime *rt;
	ap_error err;
	ap_host_tensor *x, *w, *z;
	ap_graph *g;
	int64_t dims[1] = { COLS };

	build_so();
	if (!so_blob) {
		AP_SKIP("cc", "params_from_graph_consts: SKIPPED: %s", so_why);
		return;
	}
	hb_init(&h, "cpu", so_blob, so_len);
	b = hb_bundle(&h);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_ptr_nonnull(rt);
	x = make_f32("x", 2, ROWS, COLS, 1.0f);
	w = make_f32("w", 1, COLS, 0, 2.0f);
	g = ap_graph_new("consts");
	ck_assert_int_ge(ap_graph_add_tensor(g, "w", AP_DT_F32, 1, dims, AP_TENSOR_CONST, w->data,
					     w->nbytes), 0);
	ck_assert_int_eq(ap_runtime_bind_input(rt, 0, x, &err), 0);
	ck_assert_int_eq(ap_runtime_bind_consts(rt, g, &err), 0);
	/* Already bound: an empty store is no longer an error. */
	ck_assert_int_eq(ap_runtime_bind_params(rt, NULL, &err), 0);
	ck_assert_int_eq(ap_runtime_run(rt, &err), 0);
	z = ap_runtime_output(rt, 0, &err);
	expect_rowsum(x, w, z);
	ap_host_tensor_free(z);
	ap_host_tensor_free(x);
	ap_host_tensor_free(w);
	ap_graph_free(g);
	ap_runtime_free(rt);
	ap_bundle_free(b);
}
END_TEST

/* A constant the kernels read from memory travels in the bundle
 * (BUF_CONST, its bytes in Buffer.data): the runtime binds it itself, no
 * client binding, and refuses to have it rebound. */
START_TEST(consts_from_the_bundle)
{
	hb h;
	ap_bundle *b;
	ap_runtime *rt;
	ap_error err;
	ap_host_tensor *x, *w, *z;
	int dummy = 0;

	build_so();
	if (!so_blob) {
		AP_SKIP("cc", "consts_from_the_bundle: SKIPPED: %s", so_why);
		return;
	}
	x = make_f32("x", 2, ROWS, COLS, 1.0f);
	w = make_f32("w", 1, COLS, 0, 3.0f);
	hb_init(&h, "cpu", so_blob, so_len);
	h.buf[1].kind = APOLLO__BUFFER_KIND__BUF_CONST;
	h.buf[1].data.data = w->data;
	h.buf[1].data.len = w->nbytes;
	b = hb_bundle(&h);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_runtime_bind_input(rt, 0, x, &err), 0);
	ck_assert_int_eq(ap_runtime_bind_params(rt, NULL, &err), 0);   /* nothing to bind */
	ck_assert_int_eq(ap_runtime_bind_ptr(rt, 1, &dummy, COLS * 4, &err), AP_EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "constant"));
	ck_assert_int_eq(ap_runtime_run(rt, &err), 0);
	z = ap_runtime_output(rt, 0, &err);
	expect_rowsum(x, w, z);
	ap_host_tensor_free(z);
	ap_host_tensor_free(x);
	ap_host_tensor_free(w);
	ap_runtime_free(rt);
	ap_bundle_free(b);
}
END_TEST

/* Kernels compiled as one program share one blob: the second kernel
 * names the first's (Kernel.blob_of), carries no bytes and the same
 * digest, and runs from the one loaded object. */
START_TEST(shared_blob)
{
	hb h;
	ap_bundle *b;
	ap_runtime *rt;
	ap_error err;
	ap_host_tensor *x, *w, *z;
	ap_params *params;
	static uint8_t d[32];
	ap_bundle_kernel k;

	build_so();
	if (!so_blob) {
		AP_SKIP("cc", "shared_blob: SKIPPED: %s", so_why);
		return;
	}
	hb_init(&h, "cpu", so_blob, so_len);
	ap_sha256(so_blob, so_len, d);
	h.k[1].blob_of = 1;
	h.k[1].blob.data = NULL;
	h.k[1].blob.len = 0;
	h.k[1].digest.data = d;
	h.k[1].digest.len = 32;
	b = hb_bundle(&h);
	ck_assert_int_eq(ap_bundle_kernel_get(b, 1, &k), 0);
	ck_assert_uint_eq(k.blob_bytes, so_len);   /* the shared blob */
	x = make_f32("x", 2, ROWS, COLS, 1.0f);
	w = make_f32("w", 1, COLS, 0, 0.5f);
	params = make_params(w);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_runtime_bind_input(rt, 0, x, &err), 0);
	ck_assert_int_eq(ap_runtime_bind_params(rt, params, &err), 0);
	ck_assert_int_eq(ap_runtime_run(rt, &err), 0);
	z = ap_runtime_output(rt, 0, &err);
	expect_rowsum(x, w, z);
	ap_host_tensor_free(z);
	ap_runtime_free(rt);
	ap_params_free(params);   /* frees w */
	ap_host_tensor_free(x);
	ap_bundle_free(b);
}
END_TEST

/* Each case breaks the hand-made bundle in one way. */
enum breakage {
	BR_KERNEL_INDEX, BR_ARG_INDEX, BR_ARG_COUNT, BR_GRID_ZERO, BR_GRID_VALUES,
	BR_WORKSPACE, BR_BYTES, BR_DTYPE, BR_DUP_OUTPUT, BR_WRITES_INPUT, BR_TARGET,
	BR_NO_SYMBOL, BR_BAD_BLOB, BR_EMPTY_BLOB, BR_DIGEST, BR_NO_DIGEST,
	BR_CONST_SHORT, BR_DATA_NOT_CONST, BR_WRITES_CONST, BR_KIND,
	BR_SHARE_FORWARD, BR_SHARE_AND_OWN, BR_SHARE_DIGEST,
	BR_SHRUNK, BR_HUGE_DIMS, BR_ARG_BYTES_COUNT, BR_ALIAS,
};

START_TEST(malformed_bundles)
{
	static const struct {
		enum breakage what;
		int code;
	} cases[] = {
		{ BR_KERNEL_INDEX, AP_EINVAL }, { BR_ARG_INDEX, AP_EINVAL },
		{ BR_ARG_COUNT, AP_EINVAL },    { BR_GRID_ZERO, AP_EINVAL },
		{ BR_GRID_VALUES, AP_EINVAL },  { BR_WORKSPACE, AP_EINVAL },
		{ BR_BYTES, AP_EINVAL },        { BR_DTYPE, AP_EINVAL },
		{ BR_DUP_OUTPUT, AP_EINVAL },   { BR_WRITES_INPUT, AP_EINVAL },
		{ BR_TARGET, AP_EUNSUPPORTED }, { BR_NO_SYMBOL, AP_ECOMPILE },
		{ BR_BAD_BLOB, AP_ECOMPILE },   { BR_EMPTY_BLOB, AP_EINVAL },
		{ BR_DIGEST, AP_EINVAL },       { BR_NO_DIGEST, AP_EINVAL },
		{ BR_CONST_SHORT, AP_EINVAL },  { BR_DATA_NOT_CONST, AP_EINVAL },
		{ BR_WRITES_CONST, AP_EINVAL }, { BR_KIND, AP_EINVAL },
		{ BR_SHARE_FORWARD, AP_EINVAL }, { BR_SHARE_AND_OWN, AP_EINVAL },
		{ BR_SHARE_DIGEST, AP_EINVAL },
		/* issue 29, item 4: a buffer shrunk (shape and bytes agreeing) under
		 * a launch that may touch more; dims whose product wraps to 0; a
		 * launch without its per-argument bytes */
		{ BR_SHRUNK, AP_EINVAL }, { BR_HUGE_DIMS, AP_ETOOLARGE },
		{ BR_ARG_BYTES_COUNT, AP_EINVAL },
		/* two intermediates one launch binds sharing workspace bytes
		 * (fuzz_runtime's finding: an input turned intermediate at a
		 * live one's offset) */
		{ BR_ALIAS, AP_EINVAL },
	};
	static uint64_t touched[2];
	static int64_t half_z[1] = { ROWS / 2 }, huge[2] = { 1LL << 35, 1LL << 35 };
	static const uint8_t junk[16] = "not an ELF file";
	static uint8_t zero32[32];
	static uint8_t wbytes[COLS * 4];

	build_so();
	if (!so_blob) {
		AP_SKIP("cc", "malformed_bundles: SKIPPED: cannot build the test kernel: %s", so_why);
		return;
	}
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		hb h;
		ap_bundle *b;
		ap_error err;
		ap_runtime *rt;
		hb_init(&h, "cpu", so_blob, so_len);
		switch (cases[i].what) {
		case BR_KERNEL_INDEX: h.l[1].kernel = 2; break;
		case BR_ARG_INDEX: h.args1[1] = 4; break;
		case BR_ARG_COUNT: h.l[1].n_args = 1; break;
		case BR_GRID_ZERO: h.grid[0][1] = 0; break;
		case BR_GRID_VALUES: h.k[0].n_grid = 2; break;
		case BR_WORKSPACE: h.buf[2].offset = 512; break;
		case BR_BYTES: h.buf[3].bytes = 4; break;
		case BR_DTYPE: h.p[4].dtype = APOLLO__DATA_TYPE__DT_INT64; break;
		case BR_DUP_OUTPUT: h.buf[1].kind = APOLLO__BUFFER_KIND__BUF_OUTPUT;
			h.buf[1].index = 0; break;
		case BR_WRITES_INPUT: h.p[0].written = 1; break;
		case BR_TARGET: h.b.target = "tpu"; break;
		case BR_NO_SYMBOL: h.k[1].name = "missing_kernel"; break;
		case BR_BAD_BLOB: h.k[1].blob.data = (uint8_t *)junk; h.k[1].blob.len = sizeof(junk); break;
		case BR_EMPTY_BLOB: h.k[0].blob.len = 0; break;
		/* issue 11, item 2: a blob that is not the one its digest names
		 * (another shared object) is never loaded */
		case BR_DIGEST: h.k[1].digest.data = zero32; h.k[1].digest.len = 32; break;
		case BR_NO_DIGEST: h.k[1].digest.data = zero32; h.k[1].digest.len = 31; break;
		/* a constant whose bytes do not fill it; bytes on a buffer that is
		 * not a constant; a kernel writing a constant; an unknown kind */
		case BR_CONST_SHORT: h.buf[1].kind = APOLLO__BUFFER_KIND__BUF_CONST;
			h.buf[1].data.data = wbytes; h.buf[1].data.len = sizeof(wbytes) - 4; break;
		case BR_DATA_NOT_CONST: h.buf[1].data.data = wbytes; h.buf[1].data.len = sizeof(wbytes); break;
		case BR_WRITES_CONST: h.buf[1].kind = APOLLO__BUFFER_KIND__BUF_CONST;
			h.buf[1].data.data = wbytes; h.buf[1].data.len = sizeof(wbytes);
			h.p[1].written = 1; break;
		case BR_KIND: h.buf[1].kind = (Apollo__BufferKind)5; break;
		/* Kernel.blob_of: naming itself or a later kernel; beside a blob
		 * of its own; with a digest other than the blob's */
		case BR_SHARE_FORWARD: h.k[0].blob_of = 2; h.k[0].blob.len = 0; break;
		case BR_SHARE_AND_OWN: h.k[1].blob_of = 1; break;
		case BR_SHARE_DIGEST: h.k[1].blob_of = 1; h.k[1].blob.len = 0;
			h.k[1].digest.data = zero32; h.k[1].digest.len = 32; break;
		case BR_SHRUNK:
			touched[0] = h.buf[2].bytes;
			touched[1] = h.buf[3].bytes;
			h.l[1].arg_bytes = touched;
			h.l[1].n_arg_bytes = 2;
			h.buf[3].dims = half_z;
			h.buf[3].bytes = ROWS / 2 * 4;
			break;
		case BR_HUGE_DIMS: h.buf[0].dims = huge; h.buf[0].bytes = 0; break;
		case BR_ARG_BYTES_COUNT:
			h.l[1].arg_bytes = touched;
			h.l[1].n_arg_bytes = 1;
			break;
		case BR_ALIAS:
			h.buf[0].kind = APOLLO__BUFFER_KIND__BUF_INTERMEDIATE;
			h.buf[0].offset = h.buf[2].offset;
			h.buf[0].index = -1;
			break;
		}
		b = hb_bundle(&h);
		rt = ap_runtime_new(b, NULL, &err);
		ck_assert_msg(rt == NULL, "case %zu was accepted", i);
		ck_assert_msg(err.code == cases[i].code, "case %zu: code %d (%s), want %d", i,
			      err.code, err.msg, cases[i].code);
		ck_assert(err.msg[0] != 0);
		ck_assert_msg(cases[i].what != BR_ALIAS || strstr(err.msg, "overlap"), "alias: %s", err.msg);
		ap_bundle_free(b);
	}
}
END_TEST

/* Zero-size buffers and an empty plan still load, run and give outputs. */
START_TEST(empty_shapes)
{
	hb h;
	ap_bundle *b;
	ap_runtime *rt;
	ap_error err;
	ap_host_tensor *z;

	build_so();
	if (!so_blob) {
		AP_SKIP("cc", "empty_shapes: SKIPPED: cannot build the test kernel: %s", so_why);
		return;
	}
	hb_init(&h, "cpu", so_blob, so_len);
	h.b.n_plan = 0;
	h.buf[1].kind = APOLLO__BUFFER_KIND__BUF_OUTPUT;
	h.buf[1].index = 1;
	h.d_w[0] = 0;
	h.buf[1].bytes = 0;
	b = hb_bundle(&h);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	{
		ap_host_tensor *x = make_f32("x", 2, ROWS, COLS, 1.0f);
		ck_assert_int_eq(ap_runtime_bind_input(rt, 0, x, &err), 0);
		ap_host_tensor_free(x);
	}
	ck_assert_int_eq(ap_runtime_run(rt, &err), 0);
	z = ap_runtime_output(rt, 1, &err);
	ck_assert_ptr_nonnull(z);
	ck_assert_uint_eq(z->nbytes, 0);
	ck_assert_int_eq(z->dims[0], 0);
	ap_host_tensor_free(z);
	/* Outputs start zeroed. */
	z = ap_runtime_output(rt, 0, &err);
	for (int r = 0; r < ROWS; r++)
		ck_assert(((float *)z->data)[r] == 0.0f);
	ap_host_tensor_free(z);
	ap_runtime_free(rt);
	ap_bundle_free(b);
}
END_TEST

/* ---- gpu ------------------------------------------------------------------------------ */

/* A PTX kernel doing y = x + 1 over 256 floats, written by hand for sm_50+. */
static const char *ptx_add_one =
	".version 6.0\n"
	".target sm_50\n"
	".address_size 64\n"
	".visible .entry add_one(.param .u64 px, .param .u64 py)\n"
	"{\n"
	"  .reg .b32 r<4>; .reg .b64 rd<8>; .reg .f32 f<3>;\n"
	"  ld.param.u64 rd1, [px]; ld.param.u64 rd2, [py];\n"
	"  cvta.to.global.u64 rd3, rd1; cvta.to.global.u64 rd4, rd2;\n"
	"  mov.u32 r1, %ctaid.x; mov.u32 r2, %ntid.x; mov.u32 r3, %tid.x;\n"
	"  mad.lo.s32 r1, r1, r2, r3;\n"
	"  mul.wide.s32 rd5, r1, 4;\n"
	"  add.s64 rd6, rd3, rd5; add.s64 rd7, rd4, rd5;\n"
	"  ld.global.f32 f1, [rd6]; add.f32 f2, f1, 0f3F800000; st.global.f32 [rd7], f2;\n"
	"  ret;\n"
	"}\n";

START_TEST(gpu_runs_ptx)
{
	char why[256];
	Apollo__Bundle bb = APOLLO__BUNDLE__INIT;
	Apollo__Kernel k = APOLLO__KERNEL__INIT, *kp[1] = { &k };
	Apollo__KernelParam p0 = APOLLO__KERNEL_PARAM__INIT, p1 = APOLLO__KERNEL_PARAM__INIT;
	Apollo__KernelParam *pp[2] = { &p0, &p1 };
	Apollo__Launch l = APOLLO__LAUNCH__INIT, *lp[1] = { &l };
	Apollo__Buffer b0 = APOLLO__BUFFER__INIT, b1 = APOLLO__BUFFER__INIT, *bp[2] = { &b0, &b1 };
	uint32_t grid[3] = { 2, 1, 1 }, block[3] = { 128, 1, 1 }, args[2] = { 0, 1 };
	int64_t dims[1] = { 256 };
	size_t n;
	uint8_t *buf;
	ap_bundle *b;
	ap_runtime *rt;
	ap_error err;
	ap_host_tensor *x, *y;

	if (!ap_runtime_cuda_available(why, sizeof(why))) {
		AP_SKIP("gpu", "gpu_runs_ptx [gpu]: SKIPPED: %s", why);
		return;
	}
	p0.name = "x"; p0.dtype = APOLLO__DATA_TYPE__DT_FLOAT;
	p1.name = "y"; p1.dtype = APOLLO__DATA_TYPE__DT_FLOAT; p1.written = 1;
	k.name = "add_one"; k.target = "compute_50"; k.format = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
	k.blob.data = (uint8_t *)ptx_add_one; k.blob.len = strlen(ptx_add_one);
	k.n_grid = 3; k.grid = grid; k.n_block = 3; k.block = block;
	k.n_params = 2; k.params = pp;
	l.n_args = 2; l.args = args;
	b0.name = "x"; b0.kind = APOLLO__BUFFER_KIND__BUF_INPUT; b0.dtype = APOLLO__DATA_TYPE__DT_FLOAT;
	b0.n_dims = 1; b0.dims = dims; b0.bytes = 1024;
	b1 = b0;
	b1.name = "y"; b1.kind = APOLLO__BUFFER_KIND__BUF_OUTPUT;
	bb.target = "compute_50"; bb.format = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
	bb.n_kernels = 1; bb.kernels = kp; bb.n_plan = 1; bb.plan = lp;
	bb.n_buffers = 2; bb.buffers = bp;
	sign(&bb);
	n = apollo__bundle__get_packed_size(&bb);
	buf = malloc(n);
	apollo__bundle__pack(&bb, buf);
	b = ap_bundle_unpack(buf, n, &err);
	free(buf);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	ck_assert(!ap_runtime_is_host(rt));
	x = make_f32("x", 1, 256, 0, 1.0f);
	ck_assert_int_eq(ap_runtime_bind_input(rt, 0, x, &err), 0);
	ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
	y = ap_runtime_output(rt, 0, &err);
	ck_assert_ptr_nonnull(y);
	for (int i = 0; i < 256; i++)
		ck_assert(((float *)y->data)[i] == ((float *)x->data)[i] + 1.0f);
	ap_host_tensor_free(y);
	ap_host_tensor_free(x);
	ap_runtime_free(rt);
	ap_bundle_free(b);
}
END_TEST

/* The stand-in CUDA driver (tests/cuda_standin.c, built as
 * $APOLLO_BUILD/tests/libcuda-standin.so): device memory is host memory, a
 * "module" is a text image naming its kernels, and launching add_one adds
 * 1 to every element of its first argument into its second.  It records
 * what the runtime asked for, so the GPU path's plumbing (context, module
 * image NUL-terminated, allocation, copies, launch dimensions, dynamic
 * shared memory attribute, parameters in order, the stream, clean-up) is
 * checked where no GPU exists. */
static const char *standin_path(char *buf, size_t cap)
{
	const char *b = getenv("APOLLO_BUILD");

	snprintf(buf, cap, "%s/tests/libcuda-standin.so", b && *b ? b : "build");
	return access(buf, R_OK) == 0 ? buf : NULL;
}

static ap_bundle *pack_bundle(const Apollo__Bundle *bb)
{
	size_t n;
	uint8_t *buf;
	ap_bundle *b;

	sign(bb);
	n = apollo__bundle__get_packed_size(bb);
	buf = malloc(n);
	apollo__bundle__pack(bb, buf);
	b = ap_bundle_unpack(buf, n, NULL);
	free(buf);
	ck_assert_ptr_nonnull(b);
	return b;
}

START_TEST(gpu_path_with_fake_driver)
{
	char so_buf[600];
	const char *so = standin_path(so_buf, sizeof(so_buf));
	static const char image[] = "FAKEPTX kernels: add_one";
	Apollo__Bundle bb = APOLLO__BUNDLE__INIT;
	Apollo__Kernel k = APOLLO__KERNEL__INIT, *kp[1] = { &k };
	Apollo__KernelParam p0 = APOLLO__KERNEL_PARAM__INIT, p1 = APOLLO__KERNEL_PARAM__INIT;
	Apollo__KernelParam *pp[2] = { &p0, &p1 };
	Apollo__Launch l = APOLLO__LAUNCH__INIT, *lp[1] = { &l };
	Apollo__Buffer b0 = APOLLO__BUFFER__INIT, b1 = APOLLO__BUFFER__INIT, *bp[2] = { &b0, &b1 };
	uint32_t grid[3] = { 2, 1, 1 }, block[3] = { 128, 1, 1 }, args[2] = { 0, 1 };
	int64_t dims[1] = { 256 };
	char why[256];
	ap_bundle *b;
	ap_runtime *rt;
	ap_error err;
	ap_host_tensor *x, *y;
	void *drv, **last_stream;
	int *launches, *allocs, *smem_attr, *ctx;
	unsigned *fgrid, *fblock, *fsmem;
	size_t *image_len;

	if (!so) {
		AP_SKIP("standin", "gpu_path_with_fake_driver: SKIPPED: no stand-in driver at %s (make all)", so_buf);
		return;
	}
	/* Our own handle keeps the driver loaded so its counters can be read. */
	drv = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	ck_assert_ptr_nonnull(drv);
	launches = dlsym(drv, "fake_launches");
	allocs = dlsym(drv, "fake_allocs");
	smem_attr = dlsym(drv, "fake_smem_attr");
	ctx = dlsym(drv, "fake_ctx");
	fgrid = dlsym(drv, "fake_grid");
	fblock = dlsym(drv, "fake_block");
	fsmem = dlsym(drv, "fake_smem");
	image_len = dlsym(drv, "fake_image_len");
	last_stream = dlsym(drv, "fake_last_stream");
	setenv("APOLLO_LIBCUDA", so, 1);
	ck_assert_msg(ap_runtime_cuda_available(why, sizeof(why)), "%s", why);

	p0.name = "x"; p0.dtype = APOLLO__DATA_TYPE__DT_FLOAT;
	p1.name = "y"; p1.dtype = APOLLO__DATA_TYPE__DT_FLOAT; p1.written = 1;
	k.name = "add_one"; k.target = "sm_90"; k.format = APOLLO__OUTPUT_KIND__OUTPUT_CUBIN;
	k.blob.data = (uint8_t *)image; k.blob.len = strlen(image);   /* no NUL in the blob */
	k.n_grid = 3; k.grid = grid; k.n_block = 3; k.block = block;
	k.dynamic_shared_bytes = 64 * 1024;
	k.n_params = 2; k.params = pp;
	l.n_args = 2; l.args = args;
	b0.name = "x"; b0.kind = APOLLO__BUFFER_KIND__BUF_INPUT; b0.dtype = APOLLO__DATA_TYPE__DT_FLOAT;
	b0.n_dims = 1; b0.dims = dims; b0.bytes = 1024;
	b1 = b0;
	b1.name = "y"; b1.kind = APOLLO__BUFFER_KIND__BUF_OUTPUT;
	bb.target = "sm_90"; bb.format = APOLLO__OUTPUT_KIND__OUTPUT_CUBIN;
	bb.n_kernels = 1; bb.kernels = kp; bb.n_plan = 1; bb.plan = lp;
	bb.n_buffers = 2; bb.buffers = bp;
	b = pack_bundle(&bb);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	ck_assert(!ap_runtime_is_host(rt));
	ck_assert_uint_eq(*image_len, strlen(image));   /* the runtime added the NUL */
	ck_assert_int_eq(*smem_attr, 64 * 1024);        /* > 48 KiB asked for explicitly */
	ck_assert_int_eq(*ctx, 1);
	ck_assert_int_eq(*allocs, 3);                    /* workspace, x, y */
	x = make_f32("x", 1, 256, 0, 1.0f);
	ck_assert_int_eq(ap_runtime_run(rt, &err), AP_EINVAL);   /* x not bound */
	ck_assert_int_eq(ap_runtime_bind_input(rt, 0, x, &err), 0);
	ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(*launches, 1);
	ck_assert_uint_eq(fgrid[0], 2);
	ck_assert_uint_eq(fblock[0], 128);
	ck_assert_uint_eq(fblock[2], 1);
	ck_assert_uint_eq(*fsmem, 64 * 1024);
	y = ap_runtime_output(rt, 0, &err);
	ck_assert_ptr_nonnull(y);
	for (int i = 0; i < 256; i++)
		ck_assert(((float *)y->data)[i] == ((float *)x->data)[i] + 1.0f);
	ck_assert_ptr_null(*last_stream);               /* ap_runtime_run: the null stream */
	ap_host_tensor_free(y);
	/* The caller's device memory and stream: no copy, no allocation. */
	{
		float *dx, *dy;

		ck_assert_int_eq(posix_memalign((void **)&dx, 256, 1024), 0);
		ck_assert_int_eq(posix_memalign((void **)&dy, 256, 1024), 0);
		for (int i = 0; i < 256; i++)
			dx[i] = (float)i;
		ck_assert_int_eq(ap_runtime_bind_ptr(rt, 0, dx, 1024, &err), 0);
		ck_assert_int_eq(ap_runtime_bind_ptr(rt, 1, dy, 1024, &err), 0);
		ck_assert_int_eq(*allocs, 1);           /* only the workspace is left */
		ck_assert_int_eq(ap_runtime_run_stream(rt, (void *)0x5a5a, &err), 0);
		ck_assert_ptr_eq(*last_stream, (void *)0x5a5a);
		for (int i = 0; i < 256; i++)
			ck_assert(dy[i] == (float)i + 1.0f);
		ap_runtime_free(rt);
		free(dx);
		free(dy);
	}
	ck_assert_int_eq(*allocs, 0);   /* everything freed */
	ck_assert_int_eq(*ctx, 0);      /* context released */

	/* Profiling times each launch between events on the device's clock
	 * (the stand-in's: 2 us + 1 us per 1024 threads + 1 us per 4 KiB of
	 * dynamic shared memory); zeros bind what nobody gave; the device
	 * names itself. */
	{
		ap_runtime_options po = { .profile = true };
		int *events = dlsym(drv, "fake_events");
		char name[64];
		unsigned sms = 0;

		rt = ap_runtime_new(b, &po, &err);
		ck_assert_msg(rt != NULL, "%s", err.msg);
		ck_assert_int_eq(ap_runtime_device(rt, name, sizeof(name), &sms, &err), 0);
		ck_assert_str_eq(name, "Apollo stand-in GPU");
		ck_assert_uint_eq(sms, 132);
		ck_assert_int_eq(ap_runtime_bind_zeros(rt, &err), 0);
		ck_assert_int_eq(ap_runtime_run(rt, &err), 0);
		ck_assert_int_eq(ap_runtime_run(rt, &err), 0);
		ck_assert_int_eq(*events, 2);
		ck_assert_msg(fabs(ap_runtime_launch_ms(rt, 0) - 2 * (2.0 + 256 / 1024.0 + 16) / 1000) < 1e-6,
			      "launch time %g ms", ap_runtime_launch_ms(rt, 0));
		/* reset leaves out the runs before (the first run's loading) */
		ap_runtime_profile_reset(rt);
		ck_assert(ap_runtime_launch_ms(rt, 0) == 0);
		ck_assert_int_eq(ap_runtime_run(rt, &err), 0);
		ck_assert_msg(fabs(ap_runtime_launch_ms(rt, 0) - (2.0 + 256 / 1024.0 + 16) / 1000) < 1e-6,
			      "launch time after reset %g ms", ap_runtime_launch_ms(rt, 0));
		y = ap_runtime_output(rt, 0, &err);   /* zeros in, ones out */
		ck_assert_ptr_nonnull(y);
		ck_assert(((float *)y->data)[0] == 1.0f && ((float *)y->data)[255] == 1.0f);
		ap_host_tensor_free(y);
		ap_runtime_free(rt);
		ck_assert_int_eq(*events, 0);
		ck_assert_int_eq(*allocs, 0);
	}
	/* A kernel the module does not hold: AP_ECOMPILE naming it. */
	ap_bundle_free(b);
	k.blob.data = (uint8_t *)"FAKEPTX other";
	k.blob.len = 13;
	k.digest.len = 0;
	b = pack_bundle(&bb);
	ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
	ck_assert_int_eq(err.code, AP_ECOMPILE);
	ck_assert_str_eq(err.node, "add_one");
	/* An image the driver refuses. */
	ap_bundle_free(b);
	k.blob.data = (uint8_t *)"garbage";
	k.blob.len = 7;
	k.digest.len = 0;
	b = pack_bundle(&bb);
	ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
	ck_assert_int_eq(err.code, AP_ECOMPILE);
	ck_assert_ptr_nonnull(strstr(err.msg, "CUDA_ERROR_INVALID_IMAGE"));
	ck_assert_int_eq(*allocs, 0);
	/* No such device. */
	{
		ap_runtime_options o = { .device = 3 };
		ck_assert_ptr_null(ap_runtime_new(b, &o, &err));
		ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	}
	ck_assert_int_eq(*ctx, 0);
	unsetenv("APOLLO_LIBCUDA");
	ap_host_tensor_free(x);
	ap_bundle_free(b);
	dlclose(drv);
}
END_TEST

/* ---- the launch contract, the stand-in's refusals, streams ------------------------- */

/* add_one over 256 floats, as one launch x -> y, or two through an
 * intermediate, x -> t -> y (y = x + 2 with the stand-in's FAKEPTX). */
typedef struct gb {
	Apollo__Bundle b;
	Apollo__Kernel k, *kp[1];
	Apollo__KernelParam p0, p1, *pp[2];
	Apollo__Launch l[2], *lp[2];
	Apollo__Buffer buf[3], *bp[3];
	uint32_t grid[3], block[3], args[2][2];
	int64_t dims[1];
} gb;

static void gb_init(gb *g, const char *target, const void *blob, size_t len, bool two)
{
	Apollo__Bundle bi = APOLLO__BUNDLE__INIT;
	Apollo__Kernel ki = APOLLO__KERNEL__INIT;
	Apollo__KernelParam pi = APOLLO__KERNEL_PARAM__INIT;
	Apollo__Launch li = APOLLO__LAUNCH__INIT;
	Apollo__Buffer bfi = APOLLO__BUFFER__INIT;

	memset(g, 0, sizeof(*g));
	g->p0 = pi; g->p1 = pi;
	g->p0.name = "x"; g->p0.dtype = APOLLO__DATA_TYPE__DT_FLOAT;
	g->p1.name = "y"; g->p1.dtype = APOLLO__DATA_TYPE__DT_FLOAT; g->p1.written = 1;
	g->pp[0] = &g->p0; g->pp[1] = &g->p1;
	g->grid[0] = 2; g->grid[1] = g->grid[2] = 1;
	g->block[0] = 128; g->block[1] = g->block[2] = 1;
	g->k = ki;
	g->k.name = "add_one"; g->k.target = (char *)target;
	g->k.format = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
	g->k.blob.data = (uint8_t *)blob; g->k.blob.len = len;
	g->k.n_grid = 3; g->k.grid = g->grid; g->k.n_block = 3; g->k.block = g->block;
	g->k.n_params = 2; g->k.params = g->pp;
	g->kp[0] = &g->k;
	g->dims[0] = 256;
	for (int i = 0; i < 3; i++) {
		g->buf[i] = bfi;
		g->buf[i].dtype = APOLLO__DATA_TYPE__DT_FLOAT;
		g->buf[i].n_dims = 1; g->buf[i].dims = g->dims; g->buf[i].bytes = 1024;
		g->buf[i].index = -1;
		g->bp[i] = &g->buf[i];
	}
	g->buf[0].name = "x"; g->buf[0].kind = APOLLO__BUFFER_KIND__BUF_INPUT; g->buf[0].index = 0;
	g->buf[1].name = "y"; g->buf[1].kind = APOLLO__BUFFER_KIND__BUF_OUTPUT; g->buf[1].index = 0;
	g->buf[2].name = "t"; g->buf[2].kind = APOLLO__BUFFER_KIND__BUF_INTERMEDIATE;
	g->buf[2].offset = 256;
	for (int l = 0; l < 2; l++) {
		g->l[l] = li;
		g->l[l].n_args = 2; g->l[l].args = g->args[l];
		g->lp[l] = &g->l[l];
	}
	g->args[0][0] = 0; g->args[0][1] = two ? 2 : 1;
	g->args[1][0] = 2; g->args[1][1] = 1;
	g->b = bi;
	g->b.target = (char *)target; g->b.format = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
	g->b.n_kernels = 1; g->b.kernels = g->kp;
	g->b.n_plan = two ? 2 : 1; g->b.plan = g->lp;
	g->b.n_buffers = two ? 3 : 2; g->b.buffers = g->bp;
	g->b.workspace_bytes = two ? 256 + 1024 : 0;
}

/* The stand-in, loaded by this test and named by $APOLLO_LIBCUDA; NULL
 * (the test prints why and returns) when it was not built. */
static void *standin_open(const char *test, const char *device)
{
	char buf[600];
	const char *so = standin_path(buf, sizeof(buf));
	void *drv;

	if (!so) {
		printf("%s: SKIPPED: no stand-in driver at %s (make all)\n", test, buf);
		return NULL;
	}
	drv = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	ck_assert_ptr_nonnull(drv);
	setenv("APOLLO_LIBCUDA", so, 1);
	setenv("APOLLO_STANDIN_DEVICE", device, 1);
	unsetenv("APOLLO_STANDIN_FAULT");
	return drv;
}

static void standin_close(void *drv)
{
	unsetenv("APOLLO_LIBCUDA");
	unsetenv("APOLLO_STANDIN_DEVICE");
	unsetenv("APOLLO_STANDIN_FAULT");
	dlclose(drv);
}

static void *sym(void *drv, const char *name)
{
	void *p = dlsym(drv, name);

	ck_assert_msg(p != NULL, "the stand-in lacks %s", name);
	return p;
}

/* A small cubin laid out as NVRTC lays one out (only what a driver reads
 * before running it): the ELF header -- e_machine EM_CUDA, the e_flags
 * layout named by e_ident[EI_ABIVERSION], e_flags -- and the sections of
 * kernel add_one: .text.add_one, .nv.shared.add_one (its static shared
 * memory) and .nv.info.add_one (EIATTR_MAX_THREADS 0x05: .maxntid;
 * EIATTR_PARAM_CBANK 0x0a: 16 bytes of parameters).  The e_flags values
 * are those of NVRTC's own cubins: CUDA 12.9 writes sm_80 as 0x00500550
 * and sm_90 as 0x005a055a (EI_ABIVERSION 7), CUDA 13.0 writes them as
 * 0x06005004 and 0x06005a04 (EI_ABIVERSION 8). */
static size_t make_cubin(uint8_t *out, size_t cap, int abi, uint32_t flags, uint32_t smem,
			 uint32_t maxntid)
{
	static const char names[] = "\0.shstrtab\0.text.add_one\0.nv.shared.add_one\0.nv.info.add_one";
	const uint32_t info[] = { 0x000c0504, maxntid, 1, 1, 0x00080a04, 0, 0x00100210 };
	const size_t strs = 64, infos = (strs + sizeof(names) + 3) & ~(size_t)3,
		     shoff = (infos + sizeof(info) + 7) & ~(size_t)7;
	Elf64_Ehdr h;
	Elf64_Shdr s[5];

	ck_assert_uint_ge(cap, shoff + sizeof(s));
	memset(out, 0, cap);
	memset(&h, 0, sizeof(h));
	memcpy(h.e_ident, ELFMAG, SELFMAG);
	h.e_ident[EI_CLASS] = ELFCLASS64;
	h.e_ident[EI_DATA] = ELFDATA2LSB;
	h.e_ident[EI_VERSION] = EV_CURRENT;
	h.e_ident[EI_OSABI] = abi == 7 ? 0x33 : 0x41;
	h.e_ident[EI_ABIVERSION] = (unsigned char)abi;
	h.e_type = ET_EXEC;
	h.e_machine = 190;
	h.e_version = EV_CURRENT;
	h.e_flags = flags;
	h.e_ehsize = sizeof(h);
	h.e_shoff = shoff;
	h.e_shentsize = sizeof(Elf64_Shdr);
	h.e_shnum = 5;
	h.e_shstrndx = 1;
	memcpy(out, &h, sizeof(h));
	memcpy(out + strs, names, sizeof(names));
	memcpy(out + infos, info, sizeof(info));
	memset(s, 0, sizeof(s));
	s[1].sh_name = 1; s[1].sh_type = SHT_STRTAB; s[1].sh_offset = strs; s[1].sh_size = sizeof(names);
	s[2].sh_name = 11; s[2].sh_type = SHT_PROGBITS; s[2].sh_offset = infos;
	s[3].sh_name = 25; s[3].sh_type = SHT_NOBITS; s[3].sh_offset = infos; s[3].sh_size = smem;
	s[4].sh_name = 44; s[4].sh_type = SHT_LOPROC; s[4].sh_offset = infos; s[4].sh_size = sizeof(info);
	memcpy(out + shoff, s, sizeof(s));
	return shoff + sizeof(s);
}

/* The architecture check: a cubin runs on its own major architecture at
 * the same or a later minor, so an sm_90 cubin is refused on the A100
 * profile (sm_80) and an sm_80 one on the H100 profile (sm_90), before
 * anything is loaded or launched, in both e_flags layouts; the stand-in
 * refuses the same with CUDA_ERROR_NO_BINARY_FOR_GPU when asked itself. */
START_TEST(contract_cubin_architecture)
{
	static const struct { int abi; uint32_t sm80, sm90; } layouts[] = {
		{ 7, 0x00500550, 0x005a055a },   /* NVRTC 12.9 */
		{ 8, 0x06005004, 0x06005a04 },   /* NVRTC 13.0 */
	};
	uint8_t cubin[1024];
	void *drv = standin_open("contract_cubin_architecture", "a100");
	int *modules, *launches, *allocs;
	int (*init)(unsigned), (*load)(void **, const void *);
	ap_runtime *rt;
	ap_bundle *b;
	ap_error err;
	size_t n;
	gb g;

	if (!drv)
		return;
	modules = sym(drv, "fake_modules");
	launches = sym(drv, "fake_launches");
	allocs = sym(drv, "fake_allocs");
	*(void **)&init = sym(drv, "cuInit");
	*(void **)&load = sym(drv, "cuModuleLoadData");
	for (int i = 0; i < 2; i++) {
		/* sm_90 on the A100: refused naming both, nothing loaded */
		n = make_cubin(cubin, sizeof(cubin), layouts[i].abi, layouts[i].sm90, 0, 1024);
		gb_init(&g, "sm_90", cubin, n, false);
		b = pack_bundle(&g.b);
		setenv("APOLLO_STANDIN_DEVICE", "a100", 1);
		ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
		ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
		ck_assert_str_eq(err.node, "add_one");
		ck_assert_msg(strstr(err.msg, "cubin for sm_90") && strstr(err.msg, "is sm_80"), "%s",
			      err.msg);
		ck_assert_int_eq(*modules, 0);
		ck_assert_int_eq(*launches, i);
		ck_assert_int_eq(*allocs, 0);
		/* the stand-in alone refuses it as libcuda does */
		{
			void *m = NULL;

			ck_assert_int_eq(init(0), 0);
			ck_assert_int_eq(load(&m, cubin), 209);   /* CUDA_ERROR_NO_BINARY_FOR_GPU */
		}
		/* ... and runs it on the H100 */
		setenv("APOLLO_STANDIN_DEVICE", "h100", 1);
		rt = ap_runtime_new(b, NULL, &err);
		ck_assert_msg(rt != NULL, "%s", err.msg);
		ck_assert_int_eq(*modules, 1);
		ap_runtime_free(rt);
		ap_bundle_free(b);

		/* sm_80 on the H100: another major, refused; on the A100 it runs */
		n = make_cubin(cubin, sizeof(cubin), layouts[i].abi, layouts[i].sm80, 0, 1024);
		gb_init(&g, "sm_80", cubin, n, false);
		b = pack_bundle(&g.b);
		ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
		ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
		ck_assert_msg(strstr(err.msg, "cubin for sm_80") && strstr(err.msg, "is sm_90"), "%s",
			      err.msg);
		setenv("APOLLO_STANDIN_DEVICE", "a100", 1);
		rt = ap_runtime_new(b, NULL, &err);
		ck_assert_msg(rt != NULL, "%s", err.msg);
		ck_assert_int_eq(ap_runtime_bind_zeros(rt, &err), 0);
		ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
		ck_assert_int_eq(*launches, i + 1);
		ap_runtime_free(rt);
		ap_bundle_free(b);
	}
	/* the kernel's target string marks an 'a' cubin that e_flags do not
	 * (CUDA 13.0 writes sm_90a as sm_90): runs on sm_90 only */
	n = make_cubin(cubin, sizeof(cubin), 8, 0x06005a04, 0, 1024);
	gb_init(&g, "sm_90a", cubin, n, false);
	b = pack_bundle(&g.b);
	setenv("APOLLO_STANDIN_DEVICE", "h100", 1);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	ap_runtime_free(rt);
	ap_bundle_free(b);
	/* a truncated ELF is no cubin */
	gb_init(&g, "sm_90", "\177ELF\2\1\1", 7, false);
	b = pack_bundle(&g.b);
	ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
	ck_assert_int_eq(err.code, AP_EINVAL);
	ap_bundle_free(b);
	ck_assert_int_eq(*allocs, 0);
	standin_close(drv);
}
END_TEST

/* Real cubins from NVRTC (skipped without it): the architecture the
 * installed CUDA writes into e_flags is the one the runtime reads, and the
 * stand-in finds the kernel, its .maxntid (launch bounds) and its static
 * shared memory in them. */
START_TEST(contract_nvrtc_cubins)
{
	static const char src[] =
		"extern \"C\" __global__ void __launch_bounds__(128) add_one(const float *x, float *y)\n"
		"{\n"
		"	__shared__ float s[128];\n"
		"	unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
		"	s[threadIdx.x] = x[i];\n"
		"	__syncthreads();\n"
		"	y[i] = s[127 - threadIdx.x] + 1.0f;\n"
		"}\n";
	void *drv;
	uint8_t *c80 = NULL, *c90 = NULL;
	size_t n80 = 0, n90 = 0;
	int *launches;
	ap_runtime *rt;
	ap_bundle *b;
	ap_error err;
	gb g;

	if (ap_nvrtc_load(&err) != 0) {
		printf("contract_nvrtc_cubins: SKIPPED: NVRTC cannot be loaded: %s\n", err.msg);
		return;
	}
	if (!(drv = standin_open("contract_nvrtc_cubins", "a100")))
		return;
	launches = sym(drv, "fake_launches");
	ck_assert_msg(ap_nvrtc_compile(src, "add_one", "sm_80", true, &c80, &n80, &err) == 0, "%s",
		      err.msg);
	ck_assert_msg(ap_nvrtc_compile(src, "add_one", "sm_90", true, &c90, &n90, &err) == 0, "%s",
		      err.msg);
	printf("contract_nvrtc_cubins: NVRTC %s: sm_80 e_flags 0x%08x (EI_ABIVERSION %d), "
	       "sm_90 e_flags 0x%08x (EI_ABIVERSION %d)\n", ap_nvrtc_version(),
	       *(uint32_t *)(c80 + 48), c80[8], *(uint32_t *)(c90 + 48), c90[8]);
	gb_init(&g, "sm_90", c90, n90, false);
	b = pack_bundle(&g.b);
	ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	ck_assert_msg(strstr(err.msg, "cubin for sm_90") && strstr(err.msg, "is sm_80"), "%s", err.msg);
	ap_bundle_free(b);

	gb_init(&g, "sm_80", c80, n80, false);
	b = pack_bundle(&g.b);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_runtime_bind_zeros(rt, &err), 0);
	ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(*launches, 1);
	ap_runtime_free(rt);
	ap_bundle_free(b);
	/* 256 threads against __launch_bounds__(128): refused, nothing launched */
	g.block[0] = 256;
	g.grid[0] = 1;
	b = pack_bundle(&g.b);
	ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	ck_assert_msg(strstr(err.msg, "256 threads") && strstr(err.msg, "limit of 128"), "%s", err.msg);
	ck_assert_int_eq(*launches, 1);
	ap_bundle_free(b);
	free(c80);
	free(c90);
	standin_close(drv);
}
END_TEST

/* PTX for the contract's cases: add_one's parameters, then `dirs` (the
 * entry's directives) and `decl` (a declaration in its body). */
static char *ptx_kernel(const char *target, const char *dirs, const char *decl)
{
	char *s = NULL;

	ck_assert_int_ge(asprintf(&s,
				  ".version 8.0\n.target %s\n.address_size 64\n\n"
				  ".visible .entry add_one(\n"
				  "	.param .u64 add_one_param_0,\n"
				  "	.param .u64 add_one_param_1\n"
				  ")\n%s{\n%s	ret;\n}\n",
				  target, dirs, decl), 0);
	return s;
}

/* Shared memory: static + dynamic beyond the device's opt-in limit is
 * refused naming the kernel, the limit and both sizes; within it the
 * runtime opts in; the stand-in refuses the attribute beyond the limit. */
START_TEST(contract_shared_memory)
{
	void *drv = standin_open("contract_shared_memory", "a100");
	char *ptx = ptx_kernel("sm_80", "", "	.shared .align 16 .b8 tile[4096];\n");
	int *smem_attr, *launches;
	int (*get_fn)(void **, void *, const char *), (*load)(void **, const void *);
	int (*set_attr)(void *, int, int), (*get_attr)(int *, int, void *), (*init)(unsigned), (*unload)(void *);
	ap_runtime *rt;
	ap_bundle *b;
	ap_error err;
	gb g;

	if (!drv)
		goto out;
	smem_attr = sym(drv, "fake_smem_attr");
	launches = sym(drv, "fake_launches");
	gb_init(&g, "sm_80", ptx, strlen(ptx), false);
	g.k.dynamic_shared_bytes = 160 * 1024;   /* + 4096 static > 163 KiB */
	b = pack_bundle(&g.b);
	ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	ck_assert_str_eq(err.node, "add_one");
	ck_assert_msg(strstr(err.msg, "163840 bytes of dynamic + 4096 of static") &&
		      strstr(err.msg, "opt-in limit of 166912 bytes"), "%s", err.msg);
	ck_assert_int_eq(*launches, 0);
	ap_bundle_free(b);
	/* within it: opted in to exactly what the launch asks */
	g.k.dynamic_shared_bytes = 160 * 1024 - 4096;
	g.k.digest.len = 0;
	b = pack_bundle(&g.b);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	ck_assert_int_eq(*smem_attr, 160 * 1024 - 4096);
	ck_assert_int_eq(ap_runtime_bind_zeros(rt, &err), 0);
	ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
	ap_runtime_free(rt);
	ap_bundle_free(b);
	/* the H100 has 227 KiB */
	setenv("APOLLO_STANDIN_DEVICE", "h100", 1);
	g.k.dynamic_shared_bytes = 200 * 1024;
	g.k.digest.len = 0;
	g.k.blob.data = (uint8_t *)ptx_kernel("sm_90", "", "	.shared .align 16 .b8 tile[4096];\n");
	g.k.blob.len = strlen((char *)g.k.blob.data);
	b = pack_bundle(&g.b);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	ap_runtime_free(rt);
	ap_bundle_free(b);
	/* the stand-in itself: the attribute beyond 232448 - 4096 fails, and a
	 * launch beyond the function's limit is CUDA_ERROR_INVALID_VALUE */
	*(void **)&init = sym(drv, "cuInit");
	*(void **)&load = sym(drv, "cuModuleLoadData");
	*(void **)&get_fn = sym(drv, "cuModuleGetFunction");
	*(void **)&set_attr = sym(drv, "cuFuncSetAttribute");
	*(void **)&get_attr = sym(drv, "cuFuncGetAttribute");
	*(void **)&unload = sym(drv, "cuModuleUnload");
	{
		void *m, *f;
		int v = 0;
		int (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			      unsigned, void *, void **, void **);
		unsigned long long a = 0, c = 0;
		void *params[2] = { &a, &c };

		*(void **)&launch = sym(drv, "cuLaunchKernel");
		ck_assert_int_eq(init(0), 0);
		ck_assert_int_eq(load(&m, g.k.blob.data), 0);
		ck_assert_int_eq(get_fn(&f, m, "add_one"), 0);
		ck_assert_int_eq(get_attr(&v, 1, f), 0);   /* SHARED_SIZE_BYTES */
		ck_assert_int_eq(v, 4096);
		ck_assert_int_eq(get_attr(&v, 8, f), 0);   /* MAX_DYNAMIC_SHARED_SIZE_BYTES */
		ck_assert_int_eq(v, 48 * 1024 - 4096);
		ck_assert_int_eq(launch(f, 1, 1, 1, 32, 1, 1, 48 * 1024, NULL, params, NULL), 1);
		ck_assert_int_eq(set_attr(f, 8, 232448 - 4096 + 1), 1);   /* CUDA_ERROR_INVALID_VALUE */
		ck_assert_int_eq(set_attr(f, 8, 232448 - 4096), 0);
		ck_assert_int_eq(launch(f, 1, 1, 1, 32, 1, 1, 48 * 1024, NULL, params, NULL), 0);
		ck_assert_int_eq(unload(m), 0);
	}
	free(g.k.blob.data);
out:
	free(ptx);
	if (drv)
		standin_close(drv);
}
END_TEST

/* Threads per block beyond the function's .maxntid, and the grid beyond the
 * device's: refused before anything runs; the stand-in's launch fails with
 * CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES / CUDA_ERROR_INVALID_VALUE. */
START_TEST(contract_block_and_grid)
{
	void *drv = standin_open("contract_block_and_grid", "h100");
	char *ptx = ptx_kernel("sm_90", ".maxntid 128, 1, 1\n", "");
	int *launches;
	ap_runtime *rt;
	ap_bundle *b;
	ap_error err;
	gb g;

	if (!drv)
		goto out;
	launches = sym(drv, "fake_launches");
	gb_init(&g, "sm_90", ptx, strlen(ptx), false);
	g.block[0] = 256;
	g.grid[0] = 1;
	b = pack_bundle(&g.b);
	ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	ck_assert_str_eq(err.node, "add_one");
	ck_assert_msg(strstr(err.msg, "block 256x1x1 = 256 threads") &&
		      strstr(err.msg, "limit of 128 threads per block"), "%s", err.msg);
	ap_bundle_free(b);
	/* 128 x 2 fits */
	g.block[0] = 128;
	g.grid[0] = 2;
	g.k.digest.len = 0;
	b = pack_bundle(&g.b);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_runtime_bind_zeros(rt, &err), 0);
	ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(*launches, 1);
	ap_runtime_free(rt);
	ap_bundle_free(b);
	/* a grid y of 65536: beyond the device's 65535 */
	g.grid[1] = 65536;
	g.k.digest.len = 0;
	b = pack_bundle(&g.b);
	ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	ck_assert_msg(strstr(err.msg, "grid 2x65536x1") && strstr(err.msg, "2147483647x65535x65535"),
		      "%s", err.msg);
	ap_bundle_free(b);
	/* what the stand-in does when asked anyway */
	{
		int (*init)(unsigned), (*load)(void **, const void *), (*unload)(void *);
		int (*get_fn)(void **, void *, const char *), (*get_attr)(int *, int, void *);
		int (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			      unsigned, void *, void **, void **);
		unsigned long long a = 0, c = 0;
		void *params[2] = { &a, &c }, *m, *f;
		int v = 0;

		*(void **)&unload = sym(drv, "cuModuleUnload");
		*(void **)&init = sym(drv, "cuInit");
		*(void **)&load = sym(drv, "cuModuleLoadData");
		*(void **)&get_fn = sym(drv, "cuModuleGetFunction");
		*(void **)&get_attr = sym(drv, "cuFuncGetAttribute");
		*(void **)&launch = sym(drv, "cuLaunchKernel");
		ck_assert_int_eq(init(0), 0);
		ck_assert_int_eq(load(&m, ptx), 0);
		ck_assert_int_eq(get_fn(&f, m, "add_one"), 0);
		ck_assert_int_eq(get_attr(&v, 0, f), 0);
		ck_assert_int_eq(v, 128);
		ck_assert_int_eq(launch(f, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL), 701);
		ck_assert_int_eq(launch(f, 1, 1, 1, 2048, 1, 1, 0, NULL, params, NULL), 1);
		ck_assert_int_eq(launch(f, 1, 65536, 1, 32, 1, 1, 0, NULL, params, NULL), 1);
		ck_assert_int_eq(launch(f, 1, 1, 1, 128, 1, 1, 0, NULL, params, NULL), 0);
		ck_assert_int_eq(unload(m), 0);
	}
	/* PTX for a newer target than the device: refused naming both, and by
	 * the stand-in with CUDA_ERROR_INVALID_PTX */
	setenv("APOLLO_STANDIN_DEVICE", "a100", 1);
	g.grid[1] = 1;
	g.k.digest.len = 0;
	b = pack_bundle(&g.b);
	ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	ck_assert_msg(strstr(err.msg, "PTX for .target sm_90") && strstr(err.msg, "is sm_80"), "%s",
		      err.msg);
	ap_bundle_free(b);
	{
		int (*init)(unsigned), (*load)(void **, const void *);
		void *m;

		*(void **)&init = sym(drv, "cuInit");
		*(void **)&load = sym(drv, "cuModuleLoadData");
		ck_assert_int_eq(init(0), 0);
		ck_assert_int_eq(load(&m, ptx), 218);
	}
out:
	free(ptx);
	if (drv)
		standin_close(drv);
}
END_TEST

/* Thread-block clusters (sm_90): a grid that the kernel's required
 * cluster does not divide, a cluster beyond 8 blocks, a device without
 * clusters: refused; the stand-in's launch: CUDA_ERROR_INVALID_CLUSTER_SIZE. */
START_TEST(contract_clusters)
{
	void *drv = standin_open("contract_clusters", "h100");
	char *ptx = ptx_kernel("sm_90", ".maxntid 128, 1, 1\n.explicitcluster\n.reqnctapercluster 2, 1, 1\n", "");
	char *big = ptx_kernel("sm_90", ".explicitcluster\n.reqnctapercluster 16, 1, 1\n", "");
	int *launches;
	ap_runtime *rt;
	ap_bundle *b;
	ap_error err;
	gb g;

	if (!drv)
		goto out;
	launches = sym(drv, "fake_launches");
	gb_init(&g, "sm_90", ptx, strlen(ptx), false);
	g.grid[0] = 3;
	b = pack_bundle(&g.b);
	ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	ck_assert_str_eq(err.node, "add_one");
	ck_assert_msg(strstr(err.msg, "grid 3x1x1 is not a multiple of its required cluster 2x1x1"),
		      "%s", err.msg);
	ap_bundle_free(b);
	g.grid[0] = 4;
	g.k.digest.len = 0;
	b = pack_bundle(&g.b);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_runtime_bind_zeros(rt, &err), 0);
	ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(*launches, 1);
	ap_runtime_free(rt);
	ap_bundle_free(b);
	/* 16 blocks: beyond the portable 8 */
	g.grid[0] = 16;
	g.k.blob.data = (uint8_t *)big;
	g.k.blob.len = strlen(big);
	g.k.digest.len = 0;
	b = pack_bundle(&g.b);
	ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
	ck_assert_msg(strstr(err.msg, "cluster 16x1x1 of 16 blocks exceeds the limit of 8"), "%s",
		      err.msg);
	ap_bundle_free(b);
	{
		int (*init)(unsigned), (*load)(void **, const void *), (*unload)(void *);
		int (*get_fn)(void **, void *, const char *), (*set_attr)(void *, int, int);
		int (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			      unsigned, void *, void **, void **);
		unsigned long long a = 0, c = 0;
		void *params[2] = { &a, &c }, *m, *f;

		*(void **)&init = sym(drv, "cuInit");
		*(void **)&unload = sym(drv, "cuModuleUnload");
		*(void **)&load = sym(drv, "cuModuleLoadData");
		*(void **)&get_fn = sym(drv, "cuModuleGetFunction");
		*(void **)&set_attr = sym(drv, "cuFuncSetAttribute");
		*(void **)&launch = sym(drv, "cuLaunchKernel");
		ck_assert_int_eq(init(0), 0);
		ck_assert_int_eq(load(&m, ptx), 0);
		ck_assert_int_eq(get_fn(&f, m, "add_one"), 0);
		ck_assert_int_eq(launch(f, 3, 1, 1, 128, 1, 1, 0, NULL, params, NULL), 912);
		ck_assert_int_eq(launch(f, 4, 1, 1, 128, 1, 1, 0, NULL, params, NULL), 0);
		ck_assert_int_eq(unload(m), 0);
		ck_assert_int_eq(load(&m, big), 0);
		ck_assert_int_eq(get_fn(&f, m, "add_one"), 0);
		ck_assert_int_eq(launch(f, 16, 1, 1, 32, 1, 1, 0, NULL, params, NULL), 912);
		ck_assert_int_eq(set_attr(f, 14, 1), 0);   /* NON_PORTABLE_CLUSTER_SIZE_ALLOWED */
		ck_assert_int_eq(launch(f, 16, 1, 1, 32, 1, 1, 0, NULL, params, NULL), 0);
		ck_assert_int_eq(unload(m), 0);
	}
out:
	free(ptx);
	free(big);
	if (drv)
		standin_close(drv);
}
END_TEST

/* An error a kernel raises on the device (asynchronous: the launch itself
 * succeeds) is reported by the run that launched it -- ap_runtime_run
 * waits -- and, with profiling, names its launch; a run on the caller's
 * stream returns at once, and the caller's wait on that stream reports it. */
START_TEST(async_fault_reported_by_its_run)
{
	static const char image[] = "FAKEPTX kernels: add_one";
	void *drv = standin_open("async_fault_reported_by_its_run", "h100");
	int *launches, *faults;
	void (*reset)(void);
	int (*stream_sync)(void *);
	char at[16];
	ap_host_tensor *x, *y;
	ap_runtime *rt;
	ap_bundle *b;
	ap_error err;
	gb g;

	if (!drv)
		return;
	launches = sym(drv, "fake_launches");
	faults = sym(drv, "fake_faults");
	*(void **)&reset = sym(drv, "fake_reset_fault");
	*(void **)&stream_sync = sym(drv, "cuStreamSynchronize");
	gb_init(&g, "sm_90", image, strlen(image), true);
	b = pack_bundle(&g.b);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	x = make_f32("x", 1, 256, 0, 1.0f);
	ck_assert_int_eq(ap_runtime_bind_input(rt, 0, x, &err), 0);
	ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);   /* run 1: fine */
	ck_assert_int_eq(*launches, 2);
	/* run 2: its second launch faults */
	snprintf(at, sizeof(at), "%d", *launches + 2);
	setenv("APOLLO_STANDIN_FAULT", at, 1);
	ck_assert_int_eq(ap_runtime_run(rt, &err), AP_EIO);
	ck_assert_int_eq(*faults, 1);
	ck_assert_int_eq(*launches, 4);
	ck_assert_msg(strstr(err.msg, "CUDA_ERROR_ILLEGAL_ADDRESS") &&
		      strstr(err.msg, "running the plan failed"), "%s", err.msg);
	unsetenv("APOLLO_STANDIN_FAULT");
	reset();
	/* run 3, after the fault is gone: fine again, right values */
	ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
	y = ap_runtime_output(rt, 0, &err);
	ck_assert_ptr_nonnull(y);
	for (int i = 0; i < 256; i++)
		ck_assert(fabsf(((float *)y->data)[i] - (((float *)x->data)[i] + 2.0f)) < 1e-5f);
	ap_host_tensor_free(y);
	/* on the caller's stream: the run cannot know; the stream's wait does */
	snprintf(at, sizeof(at), "%d", *launches + 1);
	setenv("APOLLO_STANDIN_FAULT", at, 1);
	ck_assert_int_eq(ap_runtime_run_stream(rt, (void *)0x42, &err), 0);
	ck_assert_int_eq(stream_sync((void *)0x42), 700);
	unsetenv("APOLLO_STANDIN_FAULT");
	reset();
	ap_runtime_free(rt);
	/* with profiling every launch is waited for: the error names launch 1 */
	{
		ap_runtime_options po = { .profile = true };

		rt = ap_runtime_new(b, &po, &err);
		ck_assert_msg(rt != NULL, "%s", err.msg);
		ck_assert_int_eq(ap_runtime_bind_input(rt, 0, x, &err), 0);
		snprintf(at, sizeof(at), "%d", *launches + 2);
		setenv("APOLLO_STANDIN_FAULT", at, 1);
		ck_assert_int_eq(ap_runtime_run(rt, &err), AP_EIO);
		ck_assert_msg(strstr(err.msg, "launch 1 of kernel 'add_one' failed") &&
			      strstr(err.msg, "CUDA_ERROR_ILLEGAL_ADDRESS"), "%s", err.msg);
		unsetenv("APOLLO_STANDIN_FAULT");
		reset();
		ap_runtime_free(rt);
	}
	ap_host_tensor_free(x);
	ap_bundle_free(b);
	standin_close(drv);
}
END_TEST

typedef struct fake_launch_view {   /* tests/cuda_standin.c's fake_launch */
	char kernel[128];
	unsigned grid[3], block[3], smem;
	void *stream;
	int n_params;
	unsigned long long params[64];
} fake_launch_view;

/* Tensor maps (TMA kernels): a PTX kernel whose first param also passes as
 * a tiled map (apollo.TensorMap) gets the map, encoded by the driver from
 * the buffer's device address, as its third parameter, at every launch
 * (the stand-in's encoding keeps the address in its first 8 bytes, which
 * the launch log records) -- encoded once while that address stays, again
 * after the buffer is bound elsewhere; maps the driver's rules or the
 * buffer refuse, or whose fields do not match their rank, stop the bundle
 * at load. */
static const char ptx_tma[] =
	".version 8.0\n.target sm_90\n.address_size 64\n\n"
	".visible .entry tma_copy(\n"
	"	.param .u64 p0,\n	.param .u64 p1,\n	.param .align 64 .b8 p0_tmap[128]\n"
	")\n{\n	ret;\n}\n";

START_TEST(gpu_tensor_maps)
{
	void *drv = standin_open("gpu_tensor_maps", "h100");
	Apollo__Bundle bb = APOLLO__BUNDLE__INIT;
	Apollo__Kernel k = APOLLO__KERNEL__INIT, *kp[1] = { &k };
	Apollo__KernelParam p0 = APOLLO__KERNEL_PARAM__INIT, p1 = APOLLO__KERNEL_PARAM__INIT;
	Apollo__KernelParam *pp[2] = { &p0, &p1 };
	Apollo__TensorMap tm = APOLLO__TENSOR_MAP__INIT;
	Apollo__Launch l = APOLLO__LAUNCH__INIT, *lp[1] = { &l };
	Apollo__Buffer b0 = APOLLO__BUFFER__INIT, b1 = APOLLO__BUFFER__INIT, *bp[2] = { &b0, &b1 };
	uint32_t grid[3] = { 2, 1, 1 }, block[3] = { 128, 1, 1 }, args[2] = { 0, 1 };
	uint64_t tdims[2] = { 64, 32 }, tstrides[1] = { 128 };
	uint32_t tbox[2] = { 64, 16 }, testr[2] = { 1, 1 };
	int64_t dims[2] = { 32, 64 };
	ap_bundle *b;
	ap_runtime *rt;
	ap_error err;
	fake_launch_view *log;
	int *log_n, *encodes;
	unsigned long long *last_addr;
	ap_tmap_desc *last;

	if (!drv)
		return;
	log = sym(drv, "fake_log");
	log_n = sym(drv, "fake_log_n");
	encodes = sym(drv, "fake_tmap_encodes");
	last_addr = sym(drv, "fake_tmap_last_addr");
	last = sym(drv, "fake_tmap_last");
	tm.dtype = AP_TMAP_FLOAT16; tm.rank = 2;
	tm.n_dims = 2; tm.dims = tdims; tm.n_strides = 1; tm.strides = tstrides;
	tm.n_box = 2; tm.box = tbox; tm.n_element_strides = 2; tm.element_strides = testr;
	tm.swizzle = AP_TMAP_SWIZZLE_128B;
	p0.name = "x"; p0.dtype = APOLLO__DATA_TYPE__DT_FLOAT16; p0.tmap = &tm;
	p1.name = "y"; p1.dtype = APOLLO__DATA_TYPE__DT_FLOAT16; p1.written = 1;
	k.name = "tma_copy"; k.target = "sm_90"; k.format = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
	k.blob.data = (uint8_t *)ptx_tma; k.blob.len = strlen(ptx_tma);
	k.n_grid = 3; k.grid = grid; k.n_block = 3; k.block = block;
	k.n_params = 2; k.params = pp;
	l.n_args = 2; l.args = args;
	b0.name = "x"; b0.kind = APOLLO__BUFFER_KIND__BUF_INPUT; b0.dtype = APOLLO__DATA_TYPE__DT_FLOAT16;
	b0.n_dims = 2; b0.dims = dims; b0.bytes = 4096;
	b1 = b0;
	b1.name = "y"; b1.kind = APOLLO__BUFFER_KIND__BUF_OUTPUT;
	bb.target = "sm_90"; bb.format = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
	bb.n_kernels = 1; bb.kernels = kp; bb.n_plan = 1; bb.plan = lp;
	bb.n_buffers = 2; bb.buffers = bp;
	b = pack_bundle(&bb);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_runtime_bind_zeros(rt, &err), 0);
	*log_n = 0;
	*encodes = 0;
	ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
	ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(*encodes, 1);                 /* once: x's address did not change */
	ck_assert_int_eq(*log_n, 2);
	ck_assert_int_eq(log[1].n_params, 3);
	ck_assert_uint_eq(log[1].params[2], log[1].params[0]);   /* the map of x's address */
	ck_assert_uint_eq(*last_addr, log[1].params[0]);
	ck_assert_int_eq(last->rank, 2);
	ck_assert_uint_eq(last->dims[0], 64);
	ck_assert_uint_eq(last->strides[0], 128);
	ck_assert_uint_eq(last->box[1], 16);
	ck_assert_int_eq(last->swizzle, AP_TMAP_SWIZZLE_128B);
	/* x bound to other memory (the stand-in's device memory is the
	 * host's): encoded again, for that address, and then kept */
	{
		void *x2 = aligned_alloc(64, 4096);

		ck_assert_ptr_nonnull(x2);
		memset(x2, 0, 4096);
		ck_assert_int_eq(ap_runtime_bind_ptr(rt, 0, x2, 4096, &err), 0);
		ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
		ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
		ck_assert_int_eq(*encodes, 2);
		ck_assert_int_eq(*log_n, 4);
		ck_assert_uint_eq(*last_addr, (uintptr_t)x2);
		ck_assert_uint_eq(log[3].params[2], (uintptr_t)x2);
		ap_runtime_free(rt);
		free(x2);
	}
	ap_bundle_free(b);
	/* refused at load: a box row the driver refuses, a map reaching past
	 * the buffer, a missing stride, a map of another type than the param */
	for (int c = 0; c < 5; c++) {
		const char *says[] = { "multiple of 16 bytes", "reaches byte 8192", "rank 2 with 2 dims, 0 strides",
				       "does not hold the param's", "reaches byte 18446744073709551615" };

		tbox[0] = c == 0 ? 12 : 64;
		tdims[1] = c == 1 ? 64 : c == 4 ? 1ull << 32 : 32;
		tstrides[0] = c == 4 ? 1ull << 39 : 128;   /* 4: the extent overflows 64 bits */
		tm.n_strides = c == 2 ? 0 : 1;
		tm.dtype = c == 3 ? AP_TMAP_BFLOAT16 : AP_TMAP_FLOAT16;
		b = pack_bundle(&bb);
		rt = ap_runtime_new(b, NULL, &err);
		ck_assert_msg(rt == NULL, "case %d loaded", c);
		ck_assert_msg(strstr(err.msg, says[c]), "case %d: %s", c, err.msg);
		ap_bundle_free(b);
	}
	standin_close(drv);
}
END_TEST

/* On a Hopper GPU (a real driver; skipped elsewhere): the hand-built TMA
 * kernel of tests/lib/tma_box.h, its PTX from NVRTC, run through the
 * runtime with its tensor map encoded by the driver -- each block's box,
 * across the tensor's edges, must hold exactly the bytes the host's
 * emulation (ap_tmap_load) gives: the swizzle, the zero fill and the
 * complete-tx count of a box with filled elements (a wrong count would
 * never complete the phase: the device kit's time limit ends it). */
START_TEST(gpu_tma_box)
{
	char why[256];
	ap_error err;
	ap_kir_kernel *k;
	char *cuda;
	uint8_t *ptx = NULL;
	size_t len = 0;

	if (!ap_runtime_cuda_available(why, sizeof(why))) {
		AP_SKIP("gpu", "gpu_tma_box [gpu]: SKIPPED: %s", why);
		return;
	}
	if (ap_nvrtc_load(&err) != 0) {
		AP_SKIP("nvrtc", "gpu_tma_box [gpu]: SKIPPED: no NVRTC: %s", err.msg);
		return;
	}
	k = tma_box_kernel(true);
	ck_assert_msg(ap_kir_verify(k, NULL, &err) == 0, "%s", err.msg);
	cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
	ck_assert_msg(cuda != NULL, "%s", err.msg);
	ck_assert_msg(ap_nvrtc_compile(cuda, k->name, "compute_90", false, &ptx, &len, &err) == 0, "%s", err.msg);
	{
		const ap_tmap_desc *d = k->arrays[0]->tmap;
		Apollo__Bundle bb = APOLLO__BUNDLE__INIT;
		Apollo__Kernel kk = APOLLO__KERNEL__INIT, *kp[1] = { &kk };
		Apollo__KernelParam p0 = APOLLO__KERNEL_PARAM__INIT, p1 = APOLLO__KERNEL_PARAM__INIT;
		Apollo__KernelParam *pp[2] = { &p0, &p1 };
		Apollo__TensorMap tm = APOLLO__TENSOR_MAP__INIT;
		Apollo__Launch l = APOLLO__LAUNCH__INIT, *lp[1] = { &l };
		Apollo__Buffer b0 = APOLLO__BUFFER__INIT, b1 = APOLLO__BUFFER__INIT, *bp[2] = { &b0, &b1 };
		uint32_t grid[3] = { 4, 1, 1 }, block[3] = { 128, 1, 1 }, args[2] = { 0, 1 };
		uint64_t tdims[2] = { d->dims[0], d->dims[1] }, tstr[1] = { d->strides[0] };
		uint32_t tbox[2] = { d->box[0], d->box[1] }, test[2] = { 1, 1 };
		int64_t gdims[2] = { 70, 104 }, odims[1] = { TMA_BOX_OUT_ELEMS };
		_Alignas(1024) static uint8_t ref[2048];
		ap_host_tensor x = { 0 }, *y;
		uint16_t *g = malloc(TMA_BOX_G_ELEMS * 2);
		ap_bundle *b;
		ap_runtime *rt;

		tm.dtype = d->dtype; tm.rank = 2; tm.swizzle = d->swizzle;
		tm.n_dims = 2; tm.dims = tdims; tm.n_strides = 1; tm.strides = tstr;
		tm.n_box = 2; tm.box = tbox; tm.n_element_strides = 2; tm.element_strides = test;
		p0.name = "g"; p0.dtype = APOLLO__DATA_TYPE__DT_FLOAT16; p0.tmap = &tm;
		p1.name = "out"; p1.dtype = APOLLO__DATA_TYPE__DT_FLOAT16; p1.written = 1;
		kk.name = k->name; kk.target = "compute_90"; kk.format = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
		kk.blob.data = ptx; kk.blob.len = strlen((char *)ptx);
		kk.n_grid = 3; kk.grid = grid; kk.n_block = 3; kk.block = block;
		kk.dynamic_shared_bytes = k->smem_bytes;
		kk.n_params = 2; kk.params = pp;
		l.n_args = 2; l.args = args;
		b0.name = "g"; b0.kind = APOLLO__BUFFER_KIND__BUF_INPUT; b0.dtype = APOLLO__DATA_TYPE__DT_FLOAT16;
		b0.n_dims = 2; b0.dims = gdims; b0.bytes = TMA_BOX_G_ELEMS * 2;
		b1.name = "out"; b1.kind = APOLLO__BUFFER_KIND__BUF_OUTPUT; b1.dtype = APOLLO__DATA_TYPE__DT_FLOAT16;
		b1.n_dims = 1; b1.dims = odims; b1.bytes = TMA_BOX_OUT_ELEMS * 2;
		bb.target = "compute_90"; bb.format = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
		bb.n_kernels = 1; bb.kernels = kp; bb.n_plan = 1; bb.plan = lp;
		bb.n_buffers = 2; bb.buffers = bp;
		b = pack_bundle(&bb);
		rt = ap_runtime_new(b, NULL, &err);
		if (!rt && (err.code == AP_ECOMPILE || err.code == AP_EUNSUPPORTED)) {
			AP_SKIP("gpu", "gpu_tma_box [gpu]: SKIPPED: the device does not run it: %s", err.msg);
		} else {
			ck_assert_msg(rt != NULL, "%s", err.msg);
			for (int i = 0; i < TMA_BOX_G_ELEMS; i++)
				g[i] = (uint16_t)(0x3c00 + i);
			x.name = "g";
			x.dtype = AP_DT_F16;
			x.rank = 2;
			x.dims[0] = 70;
			x.dims[1] = 104;
			x.nbytes = TMA_BOX_G_ELEMS * 2;
			x.data = g;
			ck_assert_int_eq(ap_runtime_bind_input(rt, 0, &x, &err), 0);
			ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
			y = ap_runtime_output(rt, 0, &err);
			ck_assert_ptr_nonnull(y);
			for (int bl = 0; bl < 4; bl++) {
				const int32_t co[2] = { TMA_BOX_X0(bl), TMA_BOX_Y0(bl) };

				ck_assert_int_eq(ap_tmap_load(d, g, co, ref, sizeof(ref), why, sizeof(why)), 2048);
				ck_assert_msg(!memcmp((uint8_t *)y->data + bl * 2048, ref, 2048),
					      "block %d's box differs from the host's emulation", bl);
			}
			printf("gpu_tma_box [gpu]: 4 boxes equal to the host's emulation\n");
			ap_host_tensor_free(y);
			ap_runtime_free(rt);
		}
		ap_bundle_free(b);
		free(g);
	}
	free(ptx);
	free(cuda);
	ap_kir_kernel_free(k);
}
END_TEST

typedef struct fake_memop {
	char op;
	unsigned long long ptr;
	size_t bytes;
	void *stream;
	int seq;
} fake_memop;

/* Every piece of work a run issues is queued on its stream, in order with
 * its launches: the workspace and the unbound output are zeroed with
 * cuMemsetD8Async on the caller's stream before the first launch (nothing
 * with cuMemsetD8 on the legacy stream, nothing at ap_runtime_new), and
 * the copy that bound x (legacy stream) is waited for on that stream. */
START_TEST(memsets_on_the_launch_stream)
{
	static const char image[] = "FAKEPTX kernels: add_one";
	void *drv = standin_open("memsets_on_the_launch_stream", "h100");
	int *mem_n, *sync_memsets, *log_n, *launch_seq;
	fake_memop *mem;
	ap_host_tensor *x, *y;
	ap_runtime *rt;
	ap_bundle *b;
	ap_error err;
	void *const st = (void *)0x77;
	int first_launch, m0, async = 0;
	gb g;

	if (!drv)
		return;
	mem_n = sym(drv, "fake_mem_n");
	mem = sym(drv, "fake_mem_log");
	sync_memsets = sym(drv, "fake_sync_memsets");
	log_n = sym(drv, "fake_log_n");
	launch_seq = sym(drv, "fake_launch_seq");
	gb_init(&g, "sm_90", image, strlen(image), true);
	b = pack_bundle(&g.b);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	ck_assert_int_eq(*mem_n, 0);                    /* nothing queued yet */
	x = make_f32("x", 1, 256, 0, 1.0f);
	ck_assert_int_eq(ap_runtime_bind_input(rt, 0, x, &err), 0);   /* a copy: 'H' */
	m0 = *mem_n;
	ck_assert_int_eq(m0, 1);
	ck_assert_int_eq(ap_runtime_run_stream(rt, st, &err), 0);
	ck_assert_int_eq(*log_n, 2);
	first_launch = launch_seq[0];
	/* the copy marked on the legacy stream ('R'), waited for on st ('W'),
	 * then the workspace and y zeroed on st ('A'), all before launch 0 */
	ck_assert_int_eq(*mem_n - m0, 4);
	ck_assert_int_eq(mem[m0].op, 'R');
	ck_assert_ptr_null(mem[m0].stream);
	ck_assert_int_eq(mem[m0 + 1].op, 'W');
	for (int i = m0 + 1; i < *mem_n; i++) {
		const fake_memop *o = &mem[i];

		ck_assert_msg(o->stream == st, "memory operation '%c' on stream %p", o->op, o->stream);
		ck_assert_msg(o->seq < first_launch, "'%c' after the first launch", o->op);
		async += o->op == 'A';
	}
	ck_assert_int_eq(async, 2);                     /* the workspace and y */
	ck_assert_int_eq(*sync_memsets, 0);
	y = ap_runtime_output(rt, 0, &err);
	ck_assert_ptr_nonnull(y);
	ck_assert(fabsf(((float *)y->data)[7] - (((float *)x->data)[7] + 2.0f)) < 1e-5f);
	ap_host_tensor_free(y);
	/* a second run: zeroed once, nothing more queued before its launches */
	m0 = *mem_n;
	ck_assert_int_eq(ap_runtime_run_stream(rt, st, &err), 0);
	for (int i = m0; i < *mem_n; i++)
		ck_assert_int_ne(mem[i].op, 'A');
	ck_assert_int_eq(*sync_memsets, 0);
	ap_runtime_free(rt);
	ap_host_tensor_free(x);
	ap_bundle_free(b);
	standin_close(drv);
}
END_TEST

/* One workspace per stream: runs on two streams get two workspaces (the
 * second zeroed on its own stream), a stream keeps its own across runs,
 * and a ninth stream is refused with AP_EBUSY. */
START_TEST(workspace_per_stream)
{
	static const char image[] = "FAKEPTX kernels: add_one";
	void *drv = standin_open("workspace_per_stream", "h100");
	int *allocs, *log_n, *mem_n;
	fake_launch_view *log;
	fake_memop *mem;
	ap_runtime *rt;
	ap_bundle *b;
	ap_error err;
	unsigned long long t_a, t_b;
	gb g;

	if (!drv)
		return;
	allocs = sym(drv, "fake_allocs");
	log_n = sym(drv, "fake_log_n");
	log = sym(drv, "fake_log");
	mem_n = sym(drv, "fake_mem_n");
	mem = sym(drv, "fake_mem_log");
	gb_init(&g, "sm_90", image, strlen(image), true);
	b = pack_bundle(&g.b);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_runtime_bind_zeros(rt, &err), 0);
	ck_assert_int_eq(*allocs, 3);                   /* one workspace, x, y */
	ck_assert_int_eq(ap_runtime_run_stream(rt, (void *)0xA, &err), 0);
	ck_assert_int_eq(*allocs, 3);                   /* stream A took it */
	t_a = log[0].params[1];                         /* t, written by launch 0 */
	ck_assert_int_eq(ap_runtime_run_stream(rt, (void *)0xB, &err), 0);
	ck_assert_int_eq(*allocs, 4);                   /* stream B: its own */
	t_b = log[2].params[1];
	ck_assert(t_a != t_b);
	ck_assert_ptr_eq(log[2].stream, (void *)0xB);
	ck_assert_int_eq(mem[*mem_n - 1].op, 'A');      /* B's workspace zeroed on B */
	ck_assert_ptr_eq(mem[*mem_n - 1].stream, (void *)0xB);
	ck_assert_uint_eq(mem[*mem_n - 1].bytes, 256 + 1024);
	ck_assert_int_eq(ap_runtime_run_stream(rt, (void *)0xA, &err), 0);
	ck_assert_int_eq(*log_n, 6);
	ck_assert(log[4].params[1] == t_a);             /* A keeps its own */
	ck_assert_int_eq(*allocs, 4);
	for (int s = 0; s < 6; s++)                     /* 8 streams in all */
		ck_assert_int_eq(ap_runtime_run_stream(rt, (void *)(uintptr_t)(0x100 + s), &err), 0);
	ck_assert_int_eq(*allocs, 10);
	ck_assert_int_eq(ap_runtime_run_stream(rt, (void *)0x999, &err), AP_EBUSY);
	ck_assert_msg(strstr(err.msg, "each of 8 streams"), "%s", err.msg);
	ck_assert_int_eq(ap_runtime_run_stream(rt, (void *)0xB, &err), 0);   /* the old ones run on */
	ap_runtime_free(rt);
	ck_assert_int_eq(*allocs, 0);
	ap_bundle_free(b);
	standin_close(drv);
}
END_TEST

START_TEST(gpu_absent_is_an_error)
{
	char why[256];
	hb h;
	ap_bundle *b;
	ap_error err;

	if (ap_runtime_cuda_available(why, sizeof(why))) {
		printf("gpu_absent_is_an_error [gpu]: SKIPPED: a CUDA device is present\n");
		return;
	}
	/* Without a driver or device a GPU bundle is refused with the reason. */
	hb_init(&h, "sm_90", (const uint8_t *)"x", 1);
	b = hb_bundle(&h);
	ck_assert_ptr_null(ap_runtime_new(b, NULL, &err));
	ck_assert_int_eq(err.code, AP_EUNSUPPORTED);
	ck_assert_ptr_nonnull(strstr(err.msg, "sm_90"));
	ap_bundle_free(b);
}
END_TEST

/* ---- library launches (issue 25): cuBLASLt, and its stand-in ------------------------- */

/* A bundle of one launch that is a library matmul: buffers A, B, bias, C
 * (inputs 0-3) and D (output 0), each 1-D, sized for the call's dims,
 * leading dimensions and batch strides; Apollo's own kernel for it is a
 * PTX entry gemm_own of five pointers (the stand-in driver records its
 * launches); the call's workspace is the bundle's first 4096 bytes. */
typedef struct lb {
	Apollo__Bundle b;
	Apollo__Kernel k, *kp[1];
	Apollo__KernelParam p[5], *pp[5];
	Apollo__Launch l, *lp[1];
	Apollo__LibraryCall lc;
	Apollo__Buffer buf[5], *bp[5];
	uint32_t grid[3], block[3], args[5];
	uint64_t arg_bytes[5];
	int64_t dims[5];
} lb;

static const char lb_ptx[] =
	".version 8.0\n.target sm_90\n.address_size 64\n\n"
	".visible .entry gemm_own(\n"
	"	.param .u64 p0,\n	.param .u64 p1,\n	.param .u64 p2,\n"
	"	.param .u64 p3,\n	.param .u64 p4\n"
	")\n{\n	ret;\n}\n";

typedef struct lb_case {
	int in, out;            /* Apollo dtypes: A/B, and C/D/bias */
	int compute;
	uint32_t m, n, k, batch, pad;
	bool ta, tb;
	int epi;
	float alpha, beta;
} lb_case;

/* elements of a rows x cols operand with leading dimension cols + pad,
 * batch copies (the stride, out) one after the other */
static uint64_t lb_elems(uint32_t rows, uint32_t cols, uint32_t pad, uint32_t batch, uint64_t *stride)
{
	*stride = (uint64_t)rows * (cols + pad);
	return *stride * batch;
}

static void lb_init(lb *g, const lb_case *c)
{
	static const char *names[5] = { "A", "B", "bias", "C", "D" };
	Apollo__Bundle bi = APOLLO__BUNDLE__INIT;
	Apollo__Kernel ki = APOLLO__KERNEL__INIT;
	Apollo__KernelParam pi = APOLLO__KERNEL_PARAM__INIT;
	Apollo__Launch li = APOLLO__LAUNCH__INIT;
	Apollo__LibraryCall lci = APOLLO__LIBRARY_CALL__INIT;
	Apollo__Buffer bfi = APOLLO__BUFFER__INIT;
	uint32_t batch = c->batch ? c->batch : 1;
	uint64_t sa, sb, sc, sd;
	uint64_t n[5];

	memset(g, 0, sizeof(*g));
	n[0] = c->ta ? lb_elems(c->k, c->m, c->pad, batch, &sa) : lb_elems(c->m, c->k, c->pad, batch, &sa);
	n[1] = c->tb ? lb_elems(c->n, c->k, c->pad, batch, &sb) : lb_elems(c->k, c->n, c->pad, batch, &sb);
	n[2] = c->n;
	n[3] = lb_elems(c->m, c->n, c->pad, batch, &sc);
	n[4] = lb_elems(c->m, c->n, c->pad, batch, &sd);
	for (int i = 0; i < 5; i++) {
		int dt = i < 2 ? c->in : c->out;

		g->p[i] = pi;
		g->p[i].name = (char *)names[i];
		g->p[i].dtype = dt;
		g->p[i].written = i == 4;
		g->pp[i] = &g->p[i];
		g->dims[i] = (int64_t)n[i];
		g->buf[i] = bfi;
		g->buf[i].name = (char *)names[i];
		g->buf[i].dtype = dt;
		g->buf[i].n_dims = 1;
		g->buf[i].dims = &g->dims[i];
		g->buf[i].bytes = n[i] * ap_dtype_size((ap_dtype)dt);
		g->buf[i].kind = i == 4 ? APOLLO__BUFFER_KIND__BUF_OUTPUT : APOLLO__BUFFER_KIND__BUF_INPUT;
		g->buf[i].index = i == 4 ? 0 : i;
		g->bp[i] = &g->buf[i];
		g->args[i] = (uint32_t)i;
		g->arg_bytes[i] = g->buf[i].bytes;
	}
	g->grid[0] = g->grid[1] = g->grid[2] = 1;
	g->block[0] = 128; g->block[1] = g->block[2] = 1;
	g->k = ki;
	g->k.name = "gemm_own"; g->k.target = "sm_90";
	g->k.format = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
	g->k.blob.data = (uint8_t *)lb_ptx; g->k.blob.len = strlen(lb_ptx);
	g->k.n_grid = 3; g->k.grid = g->grid; g->k.n_block = 3; g->k.block = g->block;
	g->k.n_params = 5; g->k.params = g->pp;
	g->kp[0] = &g->k;
	g->lc = lci;
	g->lc.op = APOLLO__LIBRARY_OP__LIB_MATMUL;
	g->lc.a_type = g->lc.b_type = c->in;
	g->lc.c_type = g->lc.d_type = g->lc.bias_type = c->out;
	g->lc.compute = c->compute;
	g->lc.m = c->m; g->lc.n = c->n; g->lc.k = c->k; g->lc.batch = c->batch;
	g->lc.stride_a = batch > 1 ? sa : 0; g->lc.stride_b = batch > 1 ? sb : 0;
	g->lc.stride_c = batch > 1 ? sc : 0; g->lc.stride_d = batch > 1 ? sd : 0;
	g->lc.lda = (c->ta ? c->m : c->k) + c->pad;
	g->lc.ldb = (c->tb ? c->k : c->n) + c->pad;
	g->lc.ldc = g->lc.ldd = c->n + c->pad;
	g->lc.trans_a = c->ta; g->lc.trans_b = c->tb;
	g->lc.epilogue = c->epi;
	g->lc.alpha = c->alpha; g->lc.beta = c->beta;
	g->lc.a_arg = 0; g->lc.b_arg = 1; g->lc.bias_arg = 2; g->lc.c_arg = 3; g->lc.d_arg = 4;
	g->lc.workspace_offset = 0; g->lc.workspace_bytes = 4096;
	g->l = li;
	g->l.n_args = 5; g->l.args = g->args;
	g->l.n_arg_bytes = 5; g->l.arg_bytes = g->arg_bytes;
	g->l.library = &g->lc;
	g->lp[0] = &g->l;
	g->b = bi;
	g->b.target = "sm_90"; g->b.format = APOLLO__OUTPUT_KIND__OUTPUT_PTX;
	g->b.n_kernels = 1; g->b.kernels = g->kp;
	g->b.n_plan = 1; g->b.plan = g->lp;
	g->b.n_buffers = 5; g->b.buffers = g->bp;
	g->b.workspace_bytes = 4096;
}

/* binary16 and bfloat16 of the test's values (multiples of 1/8 of
 * magnitude < 2: exact in both), and back */
static uint16_t lb_f16(double v)
{
	uint16_t s = v < 0 ? 0x8000 : 0;
	int e;

	v = fabs(v);
	if (v == 0)
		return s;
	e = ilogb(v);
	return s | (uint16_t)((e + 15) << 10) | (uint16_t)(ldexp(v, 10 - e) - 1024);
}

static double lb_from(int dt, const void *p, uint64_t i)
{
	if (dt == AP_DT_F32)
		return ((const float *)p)[i];
	if (dt == AP_DT_BF16) {
		uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
		float f;

		memcpy(&f, &u, 4);
		return f;
	}
	{
		uint16_t h = ((const uint16_t *)p)[i];
		int e = (h >> 10) & 31, f = h & 1023;
		double v = e ? ldexp(f + 1024, e - 25) : ldexp(f, -24);

		return h & 0x8000 ? -v : v;
	}
}

static ap_host_tensor *lb_tensor(const Apollo__Buffer *bf, int salt)
{
	ap_host_tensor *t = calloc(1, sizeof(*t));
	uint64_t n = (uint64_t)bf->dims[0];

	t->name = strdup(bf->name);
	t->dtype = (ap_dtype)bf->dtype;
	t->rank = 1;
	t->dims[0] = (int64_t)n;
	t->nbytes = bf->bytes;
	t->data = malloc(t->nbytes);
	for (uint64_t i = 0; i < n; i++) {
		double v = (double)((int)((i * 37 + (uint64_t)salt * 11) % 13) - 6) / 8;

		if (t->dtype == AP_DT_F32) {
			((float *)t->data)[i] = (float)v;
		} else if (t->dtype == AP_DT_F16) {
			((uint16_t *)t->data)[i] = lb_f16(v);
		} else {
			float f = (float)v;
			uint32_t u;

			memcpy(&u, &f, 4);
			((uint16_t *)t->data)[i] = (uint16_t)(u >> 16);
		}
	}
	return t;
}

/* D of the case, row-major in float64, from the bound data */
static double lb_ref(const lb *g, const lb_case *c, ap_host_tensor *const *t, uint32_t bt,
		     uint32_t i, uint32_t j)
{
	const Apollo__LibraryCall *lc = &g->lc;
	double acc = 0, v;

	for (uint32_t p = 0; p < c->k; p++) {
		uint64_t ai = bt * lc->stride_a + (c->ta ? (uint64_t)p * lc->lda + i : (uint64_t)i * lc->lda + p);
		uint64_t bi = bt * lc->stride_b + (c->tb ? (uint64_t)j * lc->ldb + p : (uint64_t)p * lc->ldb + j);

		acc += lb_from(c->in, t[0]->data, ai) * lb_from(c->in, t[1]->data, bi);
	}
	v = c->alpha * acc;
	if (c->beta != 0)
		v += c->beta * lb_from(c->out, t[3]->data, bt * lc->stride_c + (uint64_t)i * lc->ldc + j);
	if (c->epi & 4)
		v += lb_from(c->out, t[2]->data, j);
	if (c->epi & 2)
		v = v > 0 ? v : 0;
	if (c->epi & 32)
		v = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
	return v;
}

/* The stand-in cuBLASLt, named by $APOLLO_LIBCUBLASLT; NULL when not built. */
static void *lt_open(const char *test)
{
	const char *b = getenv("APOLLO_BUILD");
	char buf[600];
	void *lt;

	snprintf(buf, sizeof(buf), "%s/tests/libcublaslt-standin.so", b && *b ? b : "build");
	if (access(buf, R_OK) != 0) {
		AP_SKIP("standin", "%s: SKIPPED: no stand-in cuBLASLt at %s (make all)", test, buf);
		return NULL;
	}
	lt = dlopen(buf, RTLD_NOW | RTLD_LOCAL);
	ck_assert_ptr_nonnull(lt);
	setenv("APOLLO_LIBCUBLASLT", buf, 1);
	return lt;
}

/* Runs case c through the runtime; returns D (the caller frees it) and
 * the driver's launches of gemm_own the run made in *own. */
static ap_host_tensor *lb_run(lb *g, const lb_case *c, void *drv, ap_host_tensor **t, int *own,
			      int *fallbacks, char *why, size_t cap)
{
	int *log_n = sym(drv, "fake_log_n");
	ap_host_tensor *d;
	ap_runtime *rt;
	ap_bundle *b;
	ap_error err;
	int n0;

	lb_init(g, c);
	b = pack_bundle(&g->b);
	rt = ap_runtime_new(b, NULL, &err);
	ck_assert_msg(rt != NULL, "%s", err.msg);
	for (int i = 0; i < 4; i++) {
		t[i] = lb_tensor(&g->buf[i], i + 1);
		ck_assert_msg(ap_runtime_bind_input(rt, i, t[i], &err) == 0, "%s", err.msg);
	}
	n0 = *log_n;
	ck_assert_msg(ap_runtime_run(rt, &err) == 0, "%s", err.msg);
	*own = *log_n - n0;
	ck_assert_int_eq(ap_runtime_library(rt, fallbacks, why, cap), 1);
	d = ap_runtime_output(rt, 0, &err);
	ck_assert_msg(d != NULL, "%s", err.msg);
	ap_runtime_free(rt);
	ap_bundle_free(b);
	return d;
}

static const lb_case lb_cases[] = {
	/* float, one product, no epilogue */
	{ AP_DT_F32, AP_DT_F32, 0, 7, 5, 3, 0, 0, false, false, 1, 1.0f, 0.0f },
	/* float16, A transposed, padded rows, ReLU */
	{ AP_DT_F16, AP_DT_F16, 0, 33, 17, 40, 0, 3, true, false, 2, 1.0f, 0.0f },
	/* bfloat16 into float, B transposed, bias + GELU, a residual (beta) */
	{ AP_DT_BF16, AP_DT_F32, 0, 16, 24, 8, 0, 1, false, true, 36, 0.75f, 0.5f },
	/* float16 into float, 3 batches, both transposed, bias, beta 1 */
	{ AP_DT_F16, AP_DT_F32, 0, 9, 11, 13, 3, 2, true, true, 4, 1.0f, 1.0f },
	/* float with TF32 compute, bias + ReLU */
	{ AP_DT_F32, AP_DT_F32, 1, 4, 6, 5, 0, 0, false, false, 6, 1.0f, 0.0f },
};

/* Each case through the stand-in driver and the stand-in cuBLASLt: one
 * cublasLtMatmul per run and no launch of Apollo's kernel; D matches the
 * float64 reference (float 1e-5, float16 within its rounding, bfloat16
 * inputs exact so a float D within 1e-5); the workspace slice and stream
 * passed through. */
START_TEST(library_matmul_standin)
{
	void *drv = standin_open("library_matmul_standin", "h100");
	void *lt = drv ? lt_open("library_matmul_standin") : NULL;

	if (!lt) {
		if (drv)
			standin_close(drv);
		return;
	}
	int *matmuls = sym(lt, "lt_matmuls"), *handles = sym(lt, "lt_handles");
	int *descs = sym(lt, "lt_descs"), *layouts = sym(lt, "lt_layouts");
	size_t *ws_bytes = sym(lt, "lt_last_workspace_bytes");

	for (size_t ci = 0; ci < sizeof(lb_cases) / sizeof(lb_cases[0]); ci++) {
		const lb_case *c = &lb_cases[ci];
		ap_host_tensor *t[4], *d;
		char why[512];
		int own, fb, m0 = *matmuls;
		double worst = 0;
		lb g;

		d = lb_run(&g, c, drv, t, &own, &fb, why, sizeof(why));
		ck_assert_int_eq(*matmuls - m0, 1);
		ck_assert_int_eq(own, 0);
		ck_assert_int_eq(fb, 0);
		ck_assert_int_eq(*ws_bytes, 4096);
		ck_assert_int_eq(*handles, 0);               /* freed with the runtime */
		ck_assert_int_eq(*descs, 0);
		ck_assert_int_eq(*layouts, 0);
		for (uint32_t bt = 0; bt < (c->batch ? c->batch : 1); bt++)
			for (uint32_t i = 0; i < c->m; i++)
				for (uint32_t j = 0; j < c->n; j++) {
					double want = lb_ref(&g, c, t, bt, i, j);
					double got = lb_from(c->out, d->data,
							     bt * g.lc.stride_d + (uint64_t)i * g.lc.ldd + j);
					double tol = c->out == AP_DT_F16 ? 1e-3 * fabs(want) + 1e-3 : 1e-5 * fabs(want) + 1e-5;

					ck_assert_msg(fabs(got - want) <= tol,
						      "case %zu: D[%u][%u][%u] = %g, want %g", ci, bt, i, j, got, want);
					if (fabs(want) > worst)
						worst = fabs(want);
				}
		ck_assert_msg(worst > 0.5, "case %zu: the products are all near 0", ci);
		for (int i = 0; i < 4; i++)
			ap_host_tensor_free(t[i]);
		ap_host_tensor_free(d);
	}
	unsetenv("APOLLO_LIBCUBLASLT");
	dlclose(lt);
	standin_close(drv);
}
END_TEST

/* Without libcublasLt the runtime runs Apollo's kernel for the launch (the
 * stand-in driver records gemm_own with the five buffers) and says why;
 * so it does where the library refuses the product (the stand-in's
 * heuristic wants more workspace than the call has). */
START_TEST(library_fallback)
{
	void *drv = standin_open("library_fallback", "h100");
	void *lt = drv ? lt_open("library_fallback") : NULL;

	if (!lt) {
		if (drv)
			standin_close(drv);
		return;
	}
	fake_launch_view *log = sym(drv, "fake_log");
	int *log_n = sym(drv, "fake_log_n");
	int *matmuls = sym(lt, "lt_matmuls");
	ap_host_tensor *t[4], *d;
	char why[512];
	int own, fb, m0;
	lb g;

	setenv("APOLLO_LIBCUBLASLT", "/nonexistent/libcublasLt.so.13", 1);
	m0 = *matmuls;
	d = lb_run(&g, &lb_cases[1], drv, t, &own, &fb, why, sizeof(why));
	ck_assert_int_eq(own, 1);
	ck_assert_int_eq(fb, 1);
	ck_assert_int_eq(*matmuls, m0);
	ck_assert_msg(strstr(why, "no cuBLASLt") != NULL, "%s", why);
	ck_assert_str_eq(log[*log_n - 1].kernel, "gemm_own");
	ck_assert_int_eq(log[*log_n - 1].n_params, 5);
	ck_assert(log[*log_n - 1].params[4] != 0);
	for (int i = 0; i < 4; i++)
		ap_host_tensor_free(t[i]);
	ap_host_tensor_free(d);

	/* "off": no library loaded, Apollo's kernel (how bench/ times ours) */
	setenv("APOLLO_LIBCUBLASLT", "off", 1);
	d = lb_run(&g, &lb_cases[1], drv, t, &own, &fb, why, sizeof(why));
	ck_assert_int_eq(own, 1);
	ck_assert_int_eq(fb, 1);
	ck_assert_int_eq(*matmuls, m0);
	ck_assert_msg(strstr(why, "APOLLO_LIBCUBLASLT=off") != NULL, "%s", why);
	ck_assert_str_eq(log[*log_n - 1].kernel, "gemm_own");
	for (int i = 0; i < 4; i++)
		ap_host_tensor_free(t[i]);
	ap_host_tensor_free(d);

	lt_open("library_fallback");
	setenv("APOLLO_STANDIN_LT_WORKSPACE", "1000000", 1);
	d = lb_run(&g, &lb_cases[1], drv, t, &own, &fb, why, sizeof(why));
	unsetenv("APOLLO_STANDIN_LT_WORKSPACE");
	ck_assert_int_eq(own, 1);
	ck_assert_int_eq(fb, 1);
	ck_assert_int_eq(*matmuls, m0);
	ck_assert_msg(strstr(why, "cublasLtMatmulAlgoGetHeuristic") != NULL, "%s", why);
	for (int i = 0; i < 4; i++)
		ap_host_tensor_free(t[i]);
	ap_host_tensor_free(d);
	unsetenv("APOLLO_LIBCUBLASLT");
	dlclose(lt);
	standin_close(drv);
}
END_TEST

/* --explain names the library call and why it was chosen (the daemon's
 * modelled times and what chose it). */
START_TEST(library_explained)
{
	ap_report_info info = {.model = "lb", .explain = true};
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	ap_bundle *b;
	lb g;

	lb_init(&g, &lb_cases[3]);
	g.lc.library_us = 12.5;
	g.lc.kernel_us = 20.25;
	g.lc.chosen_by = "measured tuning record";
	b = pack_bundle(&g.b);
	ap_report_text(f, b, &info);
	fclose(f);
	ck_assert_msg(strstr(text, "library: cuBLASLt matmul 9 x 11 x 13 (3 batches) float16, epilogue bias, plus 1 x C, 4 KiB workspace; "
			      "chosen by the measured tuning record (schedule lib=1): 12.5 us modelled vs "
			      "20.2 us for Apollo's kernel") != NULL, "%s", text);
	free(text);
	ap_bundle_free(b);
}
END_TEST

/* A real libcublasLt, where one is installed (CUDA 13's here, no GPU):
 * every entry point client/library.c declares resolves by its name (only
 * cublasLtCreate may fail, without a device: CUBLAS_STATUS_NOT_INITIALIZED).
 * (Under AddressSanitizer the allocations the vendor library keeps past a
 * failed cublasLtCreate are suppressed by name: tools/lsan.supp.) */
START_TEST(library_real_entry_points)
{
	char why[512] = "";
	ap_cublaslt *lt;
	void *so = NULL;

	unsetenv("APOLLO_LIBCUBLASLT");
	for (int v = 13; v >= 11 && !so; v--) {
		char name[32];

		snprintf(name, sizeof(name), "libcublasLt.so.%d", v);
		so = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	}
	if (!so) {
		AP_SKIP("cublaslt", "library_real_entry_points: SKIPPED: no libcublasLt.so.13/.12/.11");
		return;
	}
	lt = ap_cublaslt_open(why, sizeof(why));
	printf("library_real_entry_points: %s\n", lt ? "cuBLASLt loaded, a handle made" : why);
	ck_assert_msg(lt || (strstr(why, "lacks") == NULL && strstr(why, "cublasLtCreate") != NULL), "%s", why);
	ap_cublaslt_close(lt);
	dlclose(so);
}
END_TEST

/* Malformed library calls are refused by the bundle check, before
 * anything loads, with a message naming what is wrong. */
START_TEST(library_malformed)
{
	static const struct {
		const char *what, *says;
	} cases[] = {
		{ "k past A", "past the" },
		{ "arg index", "argument 9 of 5" },
		{ "workspace past", "outside the 4096-byte workspace" },
		{ "ld short", "leading dimension" },
		{ "D into an input", "read-only" },
		{ "dtype", "is float16 but buffer" },
		{ "op", "unknown op" },
		{ "epilogue", "unknown epilogue" },
		{ "batch overlap", "overlap" },
		{ "zero m", "m, n, k >= 1" },
		{ "bias arg", "argument 7 of 5" },
		{ "batch count", "at most 2^31 - 1" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ap_bundle *b;
		ap_error err;
		lb g;

		lb_init(&g, &lb_cases[3]);
		switch (i) {
		case 0: g.lc.k += 1; break;
		case 1: g.lc.a_arg = 9; break;
		case 2: g.lc.workspace_offset = 256; break;
		case 3: g.lc.ldd = g.lc.n - 1; break;
		case 4: g.lc.d_arg = 3; g.lc.c_arg = 4; g.p[3].written = false; break;
		case 5: g.lc.d_type = g.lc.c_type = g.lc.bias_type = APOLLO__DATA_TYPE__DT_FLOAT16; break;
		case 6: g.lc.op = 7; break;
		case 7: g.lc.epilogue = 5; break;
		case 8: g.lc.stride_d = 1; break;
		case 9: g.lc.m = 0; break;
		case 10: g.lc.bias_arg = 7; break;
		case 11: g.lc.batch = 0x80000000u; break;
		}
		b = pack_bundle(&g.b);
		ck_assert_int_eq(ap_runtime_check(b, &err), AP_EINVAL);
		ck_assert_msg(strstr(err.msg, cases[i].says) != NULL, "%s: '%s' does not say '%s'",
			      cases[i].what, err.msg, cases[i].says);
		ck_assert_msg(strstr(err.msg, "launch 0") != NULL, "%s: %s", cases[i].what, err.msg);
		ap_bundle_free(b);
	}
}
END_TEST

static Suite *runtime_suite(void)
{
	Suite *s = suite_create("runtime");
	TCase *tc = tcase_create("host");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, host_runs_plan);
	tcase_add_test(tc, binding_errors);
	tcase_add_test(tc, params_from_graph_consts);
	tcase_add_test(tc, consts_from_the_bundle);
	tcase_add_test(tc, shared_blob);
	tcase_add_test(tc, malformed_bundles);
	tcase_add_test(tc, empty_shapes);
	tcase_add_test(tc, zero_copy_binding);
	tcase_add_test(tc, gpu_path_with_fake_driver);
	tcase_add_test(tc, gpu_tensor_maps);
	tcase_add_test(tc, contract_cubin_architecture);
	tcase_add_test(tc, contract_nvrtc_cubins);
	tcase_add_test(tc, contract_shared_memory);
	tcase_add_test(tc, contract_block_and_grid);
	tcase_add_test(tc, contract_clusters);
	tcase_add_test(tc, async_fault_reported_by_its_run);
	tcase_add_test(tc, memsets_on_the_launch_stream);
	tcase_add_test(tc, workspace_per_stream);
	tcase_add_test(tc, library_matmul_standin);
	tcase_add_test(tc, library_fallback);
	tcase_add_test(tc, library_malformed);
	tcase_add_test(tc, library_explained);
	tcase_add_test(tc, library_real_entry_points);
	suite_add_tcase(s, tc);
	tc = tcase_create("gpu");
	tcase_set_tags(tc, "gpu");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, gpu_runs_ptx);
	tcase_add_test(tc, gpu_absent_is_an_error);
	tcase_add_test(tc, gpu_tma_box);   /* last: a hang ends the device kit's step */
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(runtime_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	free(so_blob);
	return failed ? 1 : 0;
}
