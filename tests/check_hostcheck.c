/* check_hostcheck.c -- the host target's checking mode (AP_KIR_HOST_CHECK,
 * client/hostcheck.c): what it finds on small access sequences driven
 * through its table, and that it finds the synchronisation bugs a GPU
 * would turn into wrong answers in real lowered kernels while today's
 * kernels run clean.
 *
 * The injected bugs, each into a kernel lowered for sm_90 and run on the
 * host with its tensor cores, cp.async pipeline and clusters emulated:
 *   wait    every cp.async.wait_group waits for one group fewer (S-1 for
 *           S-2 in the GEMM pipeline): a stage is read before it arrived;
 *   barrier the __syncthreads after each cp.async.wait_group removed: a
 *           thread reads bytes another thread's copy delivered with no
 *           barrier between;
 *   cluster split-K's barrier.cluster replaced by __syncthreads: a block
 *           reads a peer's partial sums with no cluster barrier between;
 * and into a float16 GEMM lowered for sm_90a (wgmma from shared tiles):
 *   fence   every fence.proxy.async removed: a wgmma reads tile bytes whose
 *           writers never made them visible to the async proxy;
 *   wgwait  wgmma.wait_group 1 for 0: the next K tile's copies overwrite a
 *           stage the previous tile's wgmma may still be reading.
 * Without the checker each buggy kernel still computes the right numbers
 * on the host (copies land at once, phases run in order), which is why the
 * checking mode exists.
 */
#include <check.h>
#include <dlfcn.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/hostcheck.h"
#include "common/tmap.h"
#include "tests/lib/sched.h"
#include "tests/lib/tma_box.h"
#include "server/backend/backend.h"
#include "server/kir/kir.h"
#include "server/lower/lower.h"

typedef void (*host_fn)(void *const *args, unsigned block_begin, unsigned block_end);

/* ---- the checker alone -------------------------------------------------------------- */

/* A context over one shared array of `bytes` and one global buffer, with
 * `threads` threads in blocks of `bt`, at block 0. */
static void *ctx_new(const ap_hcheck_ops *o, void *shared, unsigned bytes, const void *global,
		     unsigned long long gbytes, unsigned threads, unsigned bt)
{
	unsigned long long ext[1] = { gbytes };
	void *c;

	ap_hostcheck_begin(ext, 1);
	c = o->begin("unit", threads, bt, 1);
	o->region(c, global, 0, "g", AP_HCHECK_GLOBAL, 0, 0);
	o->region(c, shared, bytes, "s", AP_HCHECK_SHARED, 0, -1);
	o->block(c, 0);
	return c;
}

static unsigned ctx_done(const ap_hcheck_ops *o, void *c, char *msg, size_t cap)
{
	o->end(c);
	return ap_hostcheck_end(msg, cap);
}

START_TEST(unit_races_and_barriers)
{
	const ap_hcheck_ops *o = ap_hostcheck_ops();
	_Alignas(16) float s[64];
	float g[16];
	char msg[2048];
	void *c;

	/* a write then another thread's read: a race without a barrier,
	 * none with one; the writer's own read is fine */
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 64, 64);
	*(float *)o->wr(c, &s[3], 4, 0, 1) = 1;
	(void)*(const float *)o->rd(c, &s[3], 4, 0, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 0);
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 64, 64);
	o->wr(c, &s[3], 4, 0, 1);
	o->rd(c, &s[3], 4, 5, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_ptr_nonnull(strstr(msg, "data race on shared s[byte 12]"));
	ck_assert_ptr_nonnull(strstr(msg, "thread 5"));
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 64, 64);
	o->wr(c, &s[3], 4, 0, 1);
	o->barrier(c, 0);
	o->rd(c, &s[3], 4, 5, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 0);
	/* reads by two threads, then a write by a third: write-after-read */
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 64, 64);
	o->rd(c, &s[0], 4, 1, 1);
	o->rd(c, &s[0], 4, 2, 1);
	o->wr(c, &s[0], 4, 1, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_ptr_nonnull(strstr(msg, "(and others) read it"));
	/* a new block starts clean */
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 64, 64);
	o->wr(c, &s[9], 4, 0, 1);
	o->block(c, 1);
	o->rd(c, &s[9], 4, 7, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 0);
}
END_TEST

START_TEST(unit_cp_async)
{
	const ap_hcheck_ops *o = ap_hostcheck_ops();
	_Alignas(16) float s[64], g[64];
	char msg[2048];
	void *c;

	/* read before the issuing thread's wait covers the group */
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 32, 32);
	o->async(c, &s[0], &g[0], 16, 0, 1);
	o->commit(c, 0);
	o->rd(c, &s[1], 4, 0, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_ptr_nonnull(strstr(msg, "before the cp.async of thread 0"));
	/* wait_group 1 with two groups committed: the older arrived, the newer not */
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 32, 32);
	o->async(c, &s[0], &g[0], 16, 0, 1);
	o->commit(c, 0);
	o->async(c, &s[4], &g[4], 16, 0, 1);
	o->commit(c, 0);
	o->wait(c, 0, 1);
	o->rd(c, &s[0], 4, 0, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 0);
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 32, 32);
	o->async(c, &s[0], &g[0], 16, 0, 1);
	o->commit(c, 0);
	o->async(c, &s[4], &g[4], 16, 0, 1);
	o->commit(c, 0);
	o->wait(c, 0, 1);
	o->rd(c, &s[4], 4, 0, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	/* completion is per thread: another thread needs a barrier after the wait */
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 32, 32);
	o->async(c, &s[0], &g[0], 16, 3, 1);
	o->commit(c, 3);
	o->wait(c, 3, 0);
	o->rd(c, &s[0], 4, 4, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_ptr_nonnull(strstr(msg, "data race"));
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 32, 32);
	o->async(c, &s[0], &g[0], 16, 3, 1);
	o->commit(c, 3);
	o->wait(c, 3, 0);
	o->barrier(c, 0);
	o->rd(c, &s[0], 4, 4, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 0);
	/* a copy not committed is not waited for */
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 32, 32);
	o->async(c, &s[0], &g[0], 16, 0, 1);
	o->wait(c, 0, 0);
	o->rd(c, &s[0], 4, 0, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	/* a copy that is 8 bytes off its 16-byte alignment; a source past the buffer */
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 32, 32);
	o->async(c, &s[2], &g[0], 16, 0, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_ptr_nonnull(strstr(msg, "not 16-byte aligned"));
	c = ctx_new(o, s, sizeof(s), g, 30 * sizeof(float), 32, 32);
	o->async(c, &s[0], &g[28], 16, 0, 1);   /* bytes 112..127 of a 120-byte buffer */
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_ptr_nonnull(strstr(msg, "out of bounds"));
	/* a predicated-off copy reads nothing (zero-fill) */
	c = ctx_new(o, s, sizeof(s), g, 32 * sizeof(float), 32, 32);
	o->async(c, &s[0], &g[40], 16, 0, 0);
	o->commit(c, 0);
	o->wait(c, 0, 0);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 0);
}
END_TEST

/* The bank model (hostcheck.h, ap_hostcheck_banks_of) on hand-placed
 * copies of one warp, each figure worked out from the model by hand:
 *   16 bytes a lane, lane l at 16 l: every quarter-warp covers 128
 *     consecutive bytes, one wavefront each -- 4, needing 4;
 *   16 bytes at 128 l: a quarter-warp's 8 lanes all in banks 0-3, each
 *     bank 8 distinct words -- 8 a quarter, 32, needing 4;
 *   4 bytes at 8 l: 32 lanes at once, banks 0, 2, .., 30 twice each --
 *     2, needing 1;
 *   4 bytes, every lane the same word: one word, broadcast -- 1, needing 1;
 *   8 bytes at 8 l: two half-warps of 128 bytes -- 2, needing 2;
 *   16 bytes at 128 (l % 8) + 16 (l / 8): quarter-warp q holds 8 rows of
 *     banks 4q..4q+3 -- 8 each, 32, needing 4 (served all at once, the
 *     warp would take 8: the quarter-warp split shows).
 * Copies between barriers pair up by their number in each thread; a
 * barrier starts the count again.  Not counting: -1. */
START_TEST(unit_banks)
{
	const ap_hcheck_ops *o = ap_hostcheck_ops();
	_Alignas(16) static char sh[4096], g[4096];
	static const struct { unsigned bytes, stride, wave, ideal; } cases[] = {
		{16, 16, 4, 4}, {16, 128, 32, 4}, {4, 8, 2, 1}, {4, 0, 1, 1}, {8, 8, 2, 2},
		{16, 1, 32, 4},   /* stride 1: the quarter-warp layout above */
	};
	unsigned long long wave, ideal;
	char msg[2048];
	void *c;

	ap_hostcheck_count(1);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		c = ctx_new(o, sh, sizeof(sh), g, sizeof(g), 32, 32);
		for (unsigned l = 0; l < 32; l++)
			o->async(c, sh + (cases[i].stride == 1 ? 128 * (l % 8) + 16 * (l / 8) : l * cases[i].stride), g,
				 cases[i].bytes, l, 1);
		o->end(c);
		ck_assert_int_eq(ap_hostcheck_banks_of(AP_HOSTCHECK_BANKS_COPY, &wave, &ideal), 0);
		ck_assert_msg(wave == cases[i].wave && ideal == cases[i].ideal,
			      "case %zu: %llu wavefronts for %llu, want %u for %u", i, wave, ideal, cases[i].wave,
			      cases[i].ideal);
		/* 32 copies into one word race (reported); the others do not */
		ck_assert_uint_eq(ap_hostcheck_end(msg, sizeof(msg)) == 0, cases[i].stride != 0);
	}
	/* two copies a lane (16 l, then 2048 + 128 l): grouped by number, 4 + 32;
	 * across a barrier the same: 4 + 32 */
	for (int bar = 0; bar < 2; bar++) {
		c = ctx_new(o, sh, sizeof(sh), g, sizeof(g), 32, 32);
		for (unsigned l = 0; l < 32; l++)
			o->async(c, sh + 16 * l, g, 16, l, 1);
		if (bar)
			o->barrier(c, 0);
		for (unsigned l = 0; l < 32; l++)
			o->async(c, sh + 2048 + 128 * (l % 16), g, 16, l, 0);
		o->end(c);
		ck_assert_int_eq(ap_hostcheck_banks_of(AP_HOSTCHECK_BANKS_COPY, &wave, &ideal), 0);
		/* the second copy: 16 lanes distinct, the others repeat them (same
		 * words): each quarter 8 distinct rows in banks 0-3 -- 32 */
		ck_assert_msg(wave == 36 && ideal == 8, "barrier %d: %llu wavefronts for %llu", bar, wave, ideal);
		ap_hostcheck_end(msg, sizeof(msg));
	}
	ap_hostcheck_count(0);
	c = ctx_new(o, sh, sizeof(sh), g, sizeof(g), 32, 32);
	o->async(c, sh, g, 16, 0, 1);
	o->end(c);
	ck_assert_int_eq(ap_hostcheck_banks_of(AP_HOSTCHECK_BANKS_COPY, &wave, &ideal), -1);
	ck_assert(wave == 0 && ideal == 0);
	ap_hostcheck_end(msg, sizeof(msg));
}
END_TEST

START_TEST(unit_clusters)
{
	const ap_hcheck_ops *o = ap_hostcheck_ops();
	_Alignas(16) float s0[16], s1[16], g[4];
	unsigned long long ext[1] = { sizeof(g) };
	char msg[2048];
	void *c;

	for (int bug = 0; bug < 2; bug++) {
		ap_hostcheck_begin(ext, 1);
		/* two blocks of 32 threads: rank 0 is threads 0-31, rank 1 32-63 */
		c = o->begin("cluster", 64, 32, 1);
		o->region(c, s0, sizeof(s0), "part", AP_HCHECK_SHARED, 0, -1);
		o->region(c, s1, sizeof(s1), "part", AP_HCHECK_SHARED, 1, -1);
		o->block(c, 0);
		o->wr(c, &s1[2], 4, 40, 1);       /* rank 1 writes its partial */
		o->barrier(c, bug ? 0 : 1);       /* __syncthreads is not enough */
		o->rd(c, &s1[2], 4, 7, 1);        /* rank 0 reads it (DSMEM) */
		o->wr(c, &s0[2], 4, 8, 1);
		o->barrier(c, 0);                 /* same rank: a block barrier orders */
		o->rd(c, &s0[2], 4, 9, 1);
		o->end(c);
		ck_assert_uint_eq(ap_hostcheck_end(msg, sizeof(msg)), (unsigned)bug);
		if (bug)
			ck_assert_ptr_nonnull(strstr(msg, "no cluster barrier between"));
	}
	/* out of bounds in a global buffer (one element past it: on the heap,
	 * where no other region can follow it); a misaligned vector */
	{
		float *h = malloc(64 * sizeof(float));

		c = ctx_new(o, s0, sizeof(s0), h, 4 * sizeof(float), 32, 32);
		o->rd(c, &h[4], 4, 0, 1);
		o->rd(c, &s0[1], 8, 0, 8);
		ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 2);
		free(h);
	}
	ck_assert_ptr_nonnull(strstr(msg, "out of bounds"));
	ck_assert_ptr_nonnull(strstr(msg, "not 8-byte aligned"));
}
END_TEST

/* ---- real kernels with injected bugs ------------------------------------------------ */

typedef enum {
	BUG_NONE, BUG_WAIT, BUG_BARRIER, BUG_CLUSTER, BUG_FENCE, BUG_WGWAIT,
	BUG_MBWAIT,     /* TMA: the wait on a stage's mbarrier removed */
	BUG_PARITY,     /* TMA: that wait's parity flipped (the waits on `full`) */
	BUG_TMASYNC,    /* TMA: the barrier before a refill removed (a stage reused while read) */
	/* warp specialised (tma=2) */
	BUG_NOARRIVE,   /* the consumers' releases (arrivals on `empty`) removed */
	BUG_NOEMPTYWAIT,/* the producer's wait for a released stage removed */
	BUG_TXSHORT,    /* the producer's expect_tx 16 bytes short */
} sync_bug;

/* Whether block b holds an mbarrier wait (not nested). */
static bool holds_mbar_wait(const ap_kir_block *b)
{
	for (const ap_kir_stmt *s = b->first; s; s = s->next)
		if (s->kind == AP_KIR_S_MBAR_WAIT)
			return true;
	return false;
}

/* Injects `bug` into every place of block b of kernel k it applies to;
 * returns how many. */
static int inject(ap_kir_kernel *k, ap_kir_block *b, sync_bug bug)
{
	int n = 0;
	ap_kir_stmt *prev = NULL;

	for (ap_kir_stmt *s = b->first; s; prev = s, s = s->next) {
		if (s->kind == AP_KIR_S_FOR || s->kind == AP_KIR_S_IF || s->kind == AP_KIR_S_ROLES ||
		    s->kind == AP_KIR_S_ARM) {
			n += inject(k, &s->body, bug);
			n += inject(k, &s->orelse, bug);
		}
		if ((bug == BUG_NOARRIVE && s->kind == AP_KIR_S_MBAR_ARRIVE && !strcmp(s->arr->name, "empty")) ||
		    (bug == BUG_NOEMPTYWAIT && s->kind == AP_KIR_S_MBAR_WAIT && !strcmp(s->arr->name, "empty"))) {
			s->kind = AP_KIR_S_COMMENT;
			s->text = (char *)(bug == BUG_NOARRIVE ? "release removed" : "empty wait removed");
			n++;
		}
		if (bug == BUG_TXSHORT && s->kind == AP_KIR_S_MBAR_ARRIVE && s->value) {
			s->value = ap_kir_binary(k, AP_KIR_SUB, s->value, ap_kir_int(k, s->value->type, 16));
			n++;
		}
		if (bug == BUG_MBWAIT && s->kind == AP_KIR_S_MBAR_WAIT) {
			s->kind = AP_KIR_S_COMMENT;
			s->text = (char *)"mbarrier wait removed";
			n++;
		}
		if (bug == BUG_PARITY && s->kind == AP_KIR_S_MBAR_WAIT && !strcmp(s->arr->name, "full")) {
			s->value = ap_kir_binary(k, AP_KIR_XOR, s->value, ap_kir_idx(k, 1));
			n++;
		}
		if (bug == BUG_TMASYNC && s->kind == AP_KIR_S_BARRIER && holds_mbar_wait(b)) {
			s->kind = AP_KIR_S_COMMENT;
			s->text = (char *)"barrier removed";
			n++;
		}
		if ((bug == BUG_WAIT && s->kind == AP_KIR_S_CP_WAIT) ||
		    (bug == BUG_WGWAIT && s->kind == AP_KIR_S_WGMMA_WAIT)) {
			s->step++;
			n++;
		}
		if (bug == BUG_FENCE && s->kind == AP_KIR_S_FENCE_ASYNC) {
			s->kind = AP_KIR_S_COMMENT;
			s->text = (char *)"fence removed";
			n++;
		}
		if (bug == BUG_CLUSTER && s->kind == AP_KIR_S_CLUSTER_BARRIER) {
			s->kind = AP_KIR_S_BARRIER;
			n++;
		}
		if (bug == BUG_BARRIER && s->kind == AP_KIR_S_CP_WAIT) {
			ap_kir_stmt *q = s->next, *qprev = s;

			while (q && q->kind == AP_KIR_S_COMMENT)
				qprev = q, q = q->next;
			if (q && q->kind == AP_KIR_S_BARRIER) {
				qprev->next = q->next;
				if (b->last == q)
					b->last = qprev;
				n++;
			}
		}
	}
	(void)prev;
	return n;
}

static void *load(const char *src)
{
	char path[] = "/tmp/check_hostcheck_XXXXXX";
	uint8_t *so = NULL;
	size_t len = 0;
	ap_error err;
	void *h;
	int fd;

	ck_assert_msg(ap_hostcc_compile(src, &so, &len, &err) == 0, "cc: %.600s", err.msg);
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, so, len), (ssize_t)len);
	close(fd);
	free(so);
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	unlink(path);
	ck_assert_msg(h != NULL, "dlopen: %s", dlerror());
	return h;
}

/* y = x w (+ b) for an m x k by k x n product; inputs in float, stored as
 * `dt` (float32, or float16 bits). */
typedef struct product {
	int64_t m, k, n;
	ap_dtype dt;
	bool bias;
	bool wt;                        /* w stored n x k, read through a Transpose (a linear layer) */
	float *x, *w, *b;
	double *want;
} product;

static ap_graph *product_graph(const product *p)
{
	ap_graph *g = ap_graph_new("checked");
	int64_t dx[2] = { p->m, p->k }, dw[2] = { p->k, p->n }, dwt[2] = { p->n, p->k }, dy[2] = { p->m, p->n };
	int64_t db[1] = { p->n };
	int x = ap_graph_add_tensor(g, "x", p->dt, 2, dx, AP_TENSOR_INPUT, NULL, 0);
	int w = ap_graph_add_tensor(g, "w", p->dt, 2, p->wt ? dwt : dw, AP_TENSOR_INPUT, NULL, 0);
	int mm = ap_graph_add_tensor(g, "mm", p->dt, 2, dy, AP_TENSOR_VALUE, NULL, 0);
	int out = mm, win = w;

	g->inputs = malloc(3 * sizeof(int));
	g->inputs[g->n_inputs++] = x;
	g->inputs[g->n_inputs++] = win;
	if (p->wt) {
		int n;

		w = ap_graph_add_tensor(g, "wT", p->dt, 2, dw, AP_TENSOR_VALUE, NULL, 0);
		n = ap_graph_add_node(g, "tr", AP_OP_TRANSPOSE, 1, &win, 1, &w);
		ck_assert_int_ge(n, 0);
		ap_node_set_ints(g, n, "perm", (const int64_t[]){ 1, 0 }, 2);
	}
	ck_assert_int_ge(ap_graph_add_node(g, "mm", AP_OP_MATMUL, 2, (int[]){ x, w }, 1, &mm), 0);
	if (p->bias) {
		int b = ap_graph_add_tensor(g, "b", p->dt, 1, db, AP_TENSOR_INPUT, NULL, 0);
		int y = ap_graph_add_tensor(g, "y", p->dt, 2, dy, AP_TENSOR_VALUE, NULL, 0);

		g->inputs[g->n_inputs++] = b;
		ck_assert_int_ge(ap_graph_add_node(g, "bias", AP_OP_ADD, 2, (int[]){ mm, b }, 1, &y), 0);
		out = y;
	}
	g->tensors[out].is_output = true;
	g->outputs = malloc(sizeof(int));
	g->outputs[g->n_outputs++] = out;
	return g;
}

/* The reference in float64 over the operands the tensor cores read (TF32
 * keeps 10 mantissa bits; float16 inputs are exact): tf 1 rounds to
 * nearest (mma.sync's operands, cvt.rna), 2 drops the 13 low bits (what
 * wgmma reads from shared memory), 0 keeps float32. */
static double tf32(double v, int tf)
{
	float f = (float)v;
	uint32_t u;

	memcpy(&u, &f, 4);
	u = (tf == 2 ? u : u + 0x1000u) & ~0x1fffu;
	memcpy(&f, &u, 4);
	return f;
}

static void product_data(product *p, int tf)
{
	unsigned long long seed = 0x2545f4914f6cdd1dull;

	p->x = malloc((size_t)(p->m * p->k) * sizeof(float));
	p->w = malloc((size_t)(p->k * p->n) * sizeof(float));
	p->b = malloc((size_t)p->n * sizeof(float));
	p->want = malloc((size_t)(p->m * p->n) * sizeof(double));
	for (int64_t i = 0; i < p->m * p->k + p->k * p->n + p->n; i++) {
		float v;

		seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
		v = (float)((seed >> 11) % 2001) / 1000.0f - 1.0f;
		if (p->dt == AP_DT_F16)
			v = ap_kir_f16_to_f32(ap_kir_f32_to_f16(v));
		if (i < p->m * p->k)
			p->x[i] = v;
		else if (i < p->m * p->k + p->k * p->n)
			p->w[i - p->m * p->k] = v;
		else
			p->b[i - p->m * p->k - p->k * p->n] = v;
	}
	for (int64_t i = 0; i < p->m; i++)
		for (int64_t j = 0; j < p->n; j++) {
			double acc = 0;

			for (int64_t k = 0; k < p->k; k++)
				acc += (tf ? tf32(p->x[i * p->k + k], tf) * tf32(p->w[k * p->n + j], tf)
					   : (double)p->x[i * p->k + k] * p->w[k * p->n + j]);
			p->want[i * p->n + j] = acc + (p->bias ? p->b[j] : 0);
		}
}

/* One buffer of the kernel: its bytes, as the kernel's type. */
static void *as_type(ap_dtype dt, const float *v, int64_t n)
{
	void *out = malloc((size_t)(n ? n : 1) * (dt == AP_DT_F16 ? 2 : 4));

	for (int64_t i = 0; i < n; i++) {
		if (dt == AP_DT_F16)
			((uint16_t *)out)[i] = ap_kir_f32_to_f16(v[i]);
		else
			((float *)out)[i] = v[i];
	}
	return out;
}

/* The target run_checked lowers for; with g_tma the default rule's
 * schedule with tma=1 or 2 (TMA fills on an mbarrier ring, gemm_tma.c), and
 * with g_sms > 0 the target's SMs cut to that many (persistent blocks then
 * walk several tiles each). */
static const char *g_target = "sm_90";
static int g_tma;                    /* the GEMM's tma knob (0: the default rule's) */
static bool g_other_order;           /* a run under another coroutine order: the CUDA
					checks of tma_cuda_checks were made already */
static unsigned g_sms;
static int g_bn;                     /* > 0: the GEMM's bn knob set to it too */
static const char *g_cuda_has;       /* set: the kernel's CUDA holds it, compiles for
					sm_90a without spills, HGMMA in its SASS */

/* The SASS of cubin bin (nvdisasm from PyPI's wheel in .venv), malloc'd;
 * NULL when there is no nvdisasm. */
static char *sass_of(const uint8_t *bin, size_t len)
{
	char path[] = "/tmp/check_hostcheck_cubin_XXXXXX", cmd[1024];
	glob_t gl;
	FILE *f;
	char *out = NULL;
	size_t n = 0, cap = 0;
	int fd;

	if (glob(".venv/lib/python3*/site-packages/nvidia/cu*/bin/nvdisasm", 0, NULL, &gl) != 0 || gl.gl_pathc == 0)
		return NULL;
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, bin, len), (ssize_t)len);
	close(fd);
	snprintf(cmd, sizeof(cmd), "'%s' -c '%s'", gl.gl_pathv[0], path);
	globfree(&gl);
	f = popen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	for (;;) {
		if (n + 4096 + 1 > cap) {
			cap = 2 * cap + 8192;
			out = realloc(out, cap);
			ck_assert_ptr_nonnull(out);
		}
		size_t got = fread(out + n, 1, 4096, f);

		if (got == 0)
			break;
		n += got;
	}
	out[n] = 0;
	ck_assert_int_eq(pclose(f), 0);
	unlink(path);
	return out;
}

/* k's CUDA text for sm_90a through ptxas without spills (*regs: its
 * registers) and NVRTC to a cubin whose SASS holds HGMMA; returns that
 * SASS (the caller frees it), or NULL where NVRTC or nvdisasm is missing
 * (said so).  `what` names the kernel in the messages. */
static char *sm90a_sass(ap_kir_kernel *k, const char *cuda, const char *what, int *regs)
{
	ap_error err;
	ap_ptxas_stats st;
	uint8_t *bin = NULL;
	size_t len = 0;
	char *sass;

	if (ap_nvrtc_load(&err) != 0) {
		printf("SKIP NVRTC compile of %s: %s\n", what, err.msg);
		return NULL;
	}
	ck_assert_msg(ap_nvrtc_ptxas_stats(cuda, k->name, "sm_90a", &st, &err) == 0, "%s", err.msg);
	ck_assert_msg(st.spill_store_bytes == 0 && st.spill_load_bytes == 0, "%s spills %d / %d bytes", what,
		      st.spill_store_bytes, st.spill_load_bytes);
	ck_assert_msg(ap_nvrtc_compile(cuda, k->name, "sm_90a", true, &bin, &len, &err) == 0, "%s", err.msg);
	sass = sass_of(bin, len);
	free(bin);
	if (!sass) {
		printf("SKIP the SASS of %s: no nvdisasm in .venv\n", what);
		return NULL;
	}
	ck_assert_msg(strstr(sass, "HGMMA"), "no HGMMA in the SASS of %s", what);
	*regs = st.registers;
	return sass;
}

/* A tma=1 or 2 kernel's CUDA for sm_90a: the TMA and mbarrier PTX, a cubin
 * without spills whose SASS holds HGMMA and UTMALDG (the TMA load); tma=3
 * (the copying producer): cp.async and mbarriers, LDGSTS and HGMMA in the
 * SASS, no TMA. */
static void tma_cuda_checks(ap_kir_kernel *k)
{
	ap_error err;
	char *cuda = ap_kir_print(k, AP_KIR_CUDA, &err), *sass, what[32];
	bool maps = g_tma != 3;
	int regs = 0;

	ck_assert_msg(cuda != NULL, "%s", err.msg);
	ck_assert_ptr_nonnull(strstr(cuda, "mbarrier.try_wait.parity"));
	if (g_bn)   /* a consumer warpgroup's 64 rows by bn columns a wgmma */
		ck_assert_msg(strstr(cuda, g_bn == 256 ? ".m64n256k16." : ".m64n128k16."), "no m64n%dk16 wgmma", g_bn);
	if (maps) {
		ck_assert_ptr_nonnull(strstr(cuda, "cp.async.bulk.tensor.2d"));
		ck_assert_ptr_nonnull(strstr(cuda, "__grid_constant__"));
	} else {
		ck_assert_ptr_null(strstr(cuda, "cp.async.bulk"));
		ck_assert_ptr_nonnull(strstr(cuda, "cp.async.cg.shared.global") ? "" : strstr(cuda, "cp.async.ca.shared.global"));
		ck_assert_ptr_nonnull(strstr(cuda, "mbarrier.arrive.shared::cta.b64 _, [%0];"));
	}
	snprintf(what, sizeof(what), "the tma=%d GEMM", g_tma);
	sass = sm90a_sass(k, cuda, what, &regs);
	if (sass) {
		ck_assert_msg(!strstr(sass, "UTMALDG") == !maps, "UTMALDG %s the tma=%d GEMM's SASS",
			      maps ? "not in" : "in", g_tma);
		ck_assert_msg(!strstr(sass, "LDGSTS") == maps, "cp.async (LDGSTS) %s the tma=%d GEMM's SASS",
			      maps ? "left in" : "not in", g_tma);
		printf("check_hostcheck: tma=%d GEMM for sm_90a: %d registers, no spills, %s and HGMMA in its SASS\n",
		       g_tma, regs, maps ? "UTMALDG" : "LDGSTS");
		free(sass);
	}
	free(cuda);
}

/* The kernel's CUDA holds `needle`, compiles for sm_90a without spills,
 * and (where nvdisasm is in .venv) its SASS has HGMMA. */
static void wgmma_cuda_checks(ap_kir_kernel *k, const char *needle)
{
	ap_error err;
	char *cuda = ap_kir_print(k, AP_KIR_CUDA, &err), *sass;
	int regs = 0;

	ck_assert_msg(cuda != NULL, "%s", err.msg);
	ck_assert_msg(strstr(cuda, needle), "no %s in the kernel's CUDA", needle);
	sass = sm90a_sass(k, cuda, "the wgmma GEMM", &regs);
	if (sass) {
		printf("check_hostcheck: %s GEMM for sm_90a (tma=%d): %d registers, no spills, HGMMA in its SASS\n",
		       needle, g_tma, regs);
		free(sass);
	}
	free(cuda);
}

/* Lowers the product for g_target (TF32 allowed when `tf`), injects `bug`,
 * prints it in the checking mode, runs it over every block and returns the
 * checker's count (its messages in `msg`).  With no bug, the result must
 * match the float64 reference within `tol` (relative to the row's scale);
 * *sites is where the bug went in.  `cluster`: the kernel must be a
 * cluster kernel (split-K). */
static unsigned run_checked(product *p, bool tf, sync_bug bug, bool cluster, double tol,
			    int *sites, char *msg, size_t cap)
{
	ap_graph *g = product_graph(p);
	int *nodes = malloc((size_t)g->n_nodes * sizeof(int));
	bool *member = malloc((size_t)g->n_nodes * sizeof(bool));
	ap_target_info ti;
	ap_lower_options lo = { 0, NULL, true };
	ap_sched tma_s;
	ap_kir_kernel *k;
	ap_mgraph *m;
	ap_error err;
	char *src;
	void *h, *args[4] = { 0 };
	unsigned long long ext[4] = { 0 };
	const ap_hcheck_ops **rt;
	unsigned n;
	int gi = 0;

	for (int i = 0; i < g->n_nodes; i++)
		nodes[i] = i, member[i] = true;
	ck_assert_int_eq(ap_graph_validate(g, &err), 0);
	m = ap_mgraph_extract(g, nodes, member, g->n_nodes, g->outputs, g->n_outputs,
			      AP_GROUP_MATMUL, 0, &gi, 1, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	ck_assert_int_eq(ap_cost_target(g_target, &ti), 0);
	ti.allow_tf32 = tf;
	if (g_sms)
		ti.sm_count = g_sms;
	if (g_tma) {
		ap_test_default_with(m, &ti, "tma", 0, g_tma, &tma_s);   /* the default keeps cp.async */
		if (g_bn)
			ap_test_set_knob(m, &ti, "bn", g_bn, &tma_s);
		lo.sched = &tma_s;
	}
	k = ap_lower_mgraph(m, &ti, "checked_gemm", &lo, NULL, &err);
	ck_assert_msg(k != NULL, "%s", err.msg);
	ck_assert_msg(!cluster || k->cluster > 1, "the default rule does not split K here");
	if (g_tma && bug == BUG_NONE && !g_other_order)
		tma_cuda_checks(k);
	if (g_cuda_has && bug == BUG_NONE && !g_other_order)
		wgmma_cuda_checks(k, g_cuda_has);
	*sites = inject(k, &k->body, bug);
	src = ap_kir_print(k, AP_KIR_HOST_CHECK, &err);
	ck_assert_msg(src != NULL, "%s", err.msg);
	/* a cp.async pipeline, or TMA's */
	ck_assert_ptr_nonnull(strstr(src, g_tma && g_tma != 3 ? "AP_CK(tma(" : "AP_CK(async("));
	h = load(src);
	rt = dlsym(h, "ap_check_rt");
	ck_assert_ptr_nonnull(rt);
	*rt = ap_hostcheck_ops();
	for (int a = 0; a < k->n_arrays; a++) {
		const ap_kir_array *arr = k->arrays[a];
		int64_t numel;

		if (arr->space != AP_KIR_GLOBAL)
			continue;
		numel = ap_tensor_numel(&m->g->tensors[arr->tensor]);
		if (arr->written) {
			args[arr->param] = calloc((size_t)numel, p->dt == AP_DT_F16 ? 2 : 4);
		} else if (p->wt && !strcmp(m->g->tensors[arr->tensor].name, "w")) {   /* w as n x k */
			float *t = malloc((size_t)numel * sizeof(float));

			for (int64_t i = 0; i < p->k; i++)
				for (int64_t j = 0; j < p->n; j++)
					t[j * p->k + i] = p->w[i * p->n + j];
			args[arr->param] = as_type(p->dt, t, numel);
			free(t);
		} else
			args[arr->param] = as_type(p->dt, !strcmp(m->g->tensors[arr->tensor].name, "x") ? p->x
							  : !strcmp(m->g->tensors[arr->tensor].name, "w") ? p->w
							  : p->b, numel);
		ext[arr->param] = (unsigned long long)numel * (p->dt == AP_DT_F16 ? 2 : 4);
	}
	ap_hostcheck_begin(ext, k->n_params);
	{
		host_fn f;
		void *sym = dlsym(h, k->name);

		memcpy(&f, &sym, sizeof(f));
		f(args, 0, k->grid[0] * k->grid[1] * k->grid[2]);
	}
	n = ap_hostcheck_end(msg, cap);
	if (bug == BUG_NONE) {
		for (int a = 0; a < k->n_arrays; a++) {
			const ap_kir_array *arr = k->arrays[a];

			if (arr->space != AP_KIR_GLOBAL || !arr->written)
				continue;
			for (int64_t i = 0; i < p->m * p->n; i++) {
				double got = p->dt == AP_DT_F16
						     ? ap_kir_f16_to_f32(((uint16_t *)args[arr->param])[i])
						     : ((float *)args[arr->param])[i];

				ck_assert_msg(fabs(got - p->want[i]) <= tol * (1 + fabs(p->want[i])),
					      "element %lld: got %.9g, want %.9g", (long long)i, got,
					      p->want[i]);
			}
		}
	}
	for (int i = 0; i < 4; i++)
		free(args[i]);
	dlclose(h);
	free(src);
	ap_kir_kernel_free(k);
	ap_mgraph_free(m);
	ap_graph_free(g);
	free(nodes);
	free(member);
	return n;
}

static void product_free(product *p)
{
	free(p->x);
	free(p->w);
	free(p->b);
	free(p->want);
}

/* A float16 GEMM on sm_90's tensor cores (mma.sync, ldmatrix, a
 * multi-stage cp.async pipeline): clean, then each pipeline bug. */
START_TEST(gemm_pipeline_bugs_found)
{
	product p = { .m = 64, .k = 256, .n = 64, .dt = AP_DT_F16 };
	char msg[2048];
	int sites;

	product_data(&p, false);
	ck_assert_uint_eq(run_checked(&p, false, BUG_NONE, false, 1e-2, &sites, msg, sizeof(msg)), 0);
	ck_assert_msg(run_checked(&p, false, BUG_WAIT, false, 0, &sites, msg, sizeof(msg)) > 0,
		      "wait_group S-1 not found");
	ck_assert_int_gt(sites, 0);
	ck_assert_msg(strstr(msg, "before the cp.async"), "%s", msg);
	printf("check_hostcheck: wait_group S-1 (%d sites): %.200s\n", sites, msg);
	ck_assert_msg(run_checked(&p, false, BUG_BARRIER, false, 0, &sites, msg, sizeof(msg)) > 0,
		      "the missing barrier after the wait not found");
	ck_assert_int_gt(sites, 0);
	printf("check_hostcheck: no barrier after the wait (%d sites): %.200s\n", sites, msg);
	product_free(&p);
}
END_TEST

/* Split-K on thread-block clusters (TF32, K = 512 over a 24 x 20 output:
 * the default rule splits K): clean, then with __syncthreads for the
 * cluster barrier. */
START_TEST(splitk_cluster_bug_found)
{
	product p = { .m = 24, .k = 512, .n = 20, .dt = AP_DT_F32, .bias = true };
	char msg[2048];
	int sites;

	product_data(&p, true);
	ck_assert_uint_eq(run_checked(&p, true, BUG_NONE, true, 1e-4, &sites, msg, sizeof(msg)), 0);
	ck_assert_msg(run_checked(&p, true, BUG_CLUSTER, true, 0, &sites, msg, sizeof(msg)) > 0,
		      "__syncthreads for barrier.cluster not found");
	ck_assert_int_gt(sites, 0);
	ck_assert_msg(strstr(msg, "no cluster barrier between"), "%s", msg);
	printf("check_hostcheck: __syncthreads for barrier.cluster (%d sites): %.200s\n", sites, msg);
	product_free(&p);
}
END_TEST

/* The checker alone on sm_90a's async proxy: a wgmma read of bytes
 * written without fence.proxy.async; a write to bytes a wgmma still reads
 * (no wgmma.wait_group covering its group); the clean sequences beside
 * each. */
START_TEST(unit_wgmma)
{
	const ap_hcheck_ops *o = ap_hostcheck_ops();
	_Alignas(16) uint16_t s[64];
	_Alignas(16) float g[4];
	char msg[2048];
	void *c;

	/* written, barrier, read by the wgmma of warpgroup 0: the fence is missing */
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 256, 256);
	o->wr(c, &s[0], 2, 5, 2);
	o->barrier(c, 0);
	o->wg_rd(c, &s[0], 2, 0);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_ptr_nonnull(strstr(msg, "no fence.proxy.async"));
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 256, 256);
	o->wr(c, &s[0], 2, 5, 2);
	o->fence_async(c, 5);
	o->barrier(c, 0);
	o->wg_rd(c, &s[0], 2, 0);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 0);
	/* a wgmma of warpgroup 1 reads, a barrier, another thread overwrites: the
	 * group is still pending without the warpgroup's wait */
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 256, 256);
	o->wg_rd(c, &s[8], 2, 128);
	for (unsigned t = 128; t < 256; t++)
		o->wg_commit(c, t);
	o->barrier(c, 0);
	o->wr(c, &s[8], 2, 3, 2);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_ptr_nonnull(strstr(msg, "while a wgmma of warpgroup 1 still reads it"));
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 256, 256);
	o->wg_rd(c, &s[8], 2, 128);
	for (unsigned t = 128; t < 256; t++)
		o->wg_commit(c, t);
	for (unsigned t = 128; t < 256; t++)
		o->wg_wait(c, t, 0);
	o->barrier(c, 0);
	o->wr(c, &s[8], 2, 3, 2);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 0);
	/* wait_group 1 with two groups committed: the older group's bytes are
	 * free, the newer's not */
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 128, 128);
	o->wg_rd(c, &s[0], 2, 0);
	o->wg_commit(c, 0);
	o->wg_rd(c, &s[16], 2, 0);
	o->wg_commit(c, 0);
	o->wg_wait(c, 0, 1);
	o->barrier(c, 0);
	o->wr(c, &s[0], 2, 7, 2);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 0);
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 128, 128);
	o->wg_rd(c, &s[0], 2, 0);
	o->wg_commit(c, 0);
	o->wg_rd(c, &s[16], 2, 0);
	o->wg_commit(c, 0);
	o->wg_wait(c, 0, 1);
	o->barrier(c, 0);
	o->wr(c, &s[16], 2, 7, 2);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
}
END_TEST

/* A float16 GEMM on sm_90a (wgmma, its tiles in core-matrix layouts, the
 * same cp.async pipeline): clean, then without the async-proxy fences and
 * with wgmma.wait_group 1 for 0. */
START_TEST(wgmma_bugs_found)
{
	product p = { .m = 64, .k = 256, .n = 64, .dt = AP_DT_F16 };
	char msg[2048];
	int sites;

	product_data(&p, false);
	g_target = "sm_90a";
	ck_assert_uint_eq(run_checked(&p, false, BUG_NONE, false, 1e-2, &sites, msg, sizeof(msg)), 0);
	ck_assert_msg(run_checked(&p, false, BUG_FENCE, false, 0, &sites, msg, sizeof(msg)) > 0,
		      "the missing fence.proxy.async not found");
	ck_assert_int_gt(sites, 0);
	ck_assert_msg(strstr(msg, "no fence.proxy.async"), "%s", msg);
	printf("check_hostcheck: no fence.proxy.async (%d sites): %.200s\n", sites, msg);
	ck_assert_msg(run_checked(&p, false, BUG_WGWAIT, false, 0, &sites, msg, sizeof(msg)) > 0,
		      "wgmma.wait_group 1 not found");
	ck_assert_int_gt(sites, 0);
	ck_assert_msg(strstr(msg, "still reads it"), "%s", msg);
	printf("check_hostcheck: wgmma.wait_group 1 (%d sites): %.200s\n", sites, msg);
	ck_assert_msg(run_checked(&p, false, BUG_WAIT, false, 0, &sites, msg, sizeof(msg)) > 0,
		      "wait_group S-1 not found on sm_90a");
	g_target = "sm_90";
	product_free(&p);
}
END_TEST

/* A float16 GEMM on sm_90a with tma=1 (gemm_tma.c): M, N and K not
 * multiples of the tile (TMA's zero fill), K tiles not a multiple of the
 * stages, one SM so that the block walks every tile and carries its ring's
 * stages and parities across them; clean and equal to the float64
 * reference, then each of a missing mbarrier wait, a flipped parity and a
 * refill without the barrier reported. */
START_TEST(tma_gemm_bugs_found)
{
	product p = { .m = 150, .k = 296, .n = 136, .dt = AP_DT_F16, .bias = true };
	char msg[2048];
	int sites;
	static const struct { sync_bug bug; const char *what, *want; } bugs[] = {
		{ BUG_MBWAIT, "no mbarrier wait", "before the bulk copy or TMA load on mbarrier" },
		{ BUG_PARITY, "a flipped parity", "before the bulk copy or TMA load on mbarrier" },
		{ BUG_TMASYNC, "no barrier before a refill", "copies into (an asynchronous copy) it with no barrier" },
	};

	product_data(&p, false);
	g_target = "sm_90a";
	g_tma = 1;
	g_sms = 1;
	ck_assert_uint_eq(run_checked(&p, false, BUG_NONE, false, 1e-2, &sites, msg, sizeof(msg)), 0);
	for (size_t i = 0; i < sizeof(bugs) / sizeof(bugs[0]); i++) {
		ck_assert_msg(run_checked(&p, false, bugs[i].bug, false, 0, &sites, msg, sizeof(msg)) > 0, "%s not found",
			      bugs[i].what);
		ck_assert_int_gt(sites, 0);
		ck_assert_msg(strstr(msg, bugs[i].want), "%s", msg);
		printf("check_hostcheck: tma, %s (%d sites): %.300s\n", bugs[i].what, sites, msg);
	}
	product_free(&p);
	/* a linear layer's weight (n x k, read transposed): B's tile K-major,
	 * both operands boxes of span x rows */
	{
		product q = { .m = 200, .k = 120, .n = 72, .dt = AP_DT_F16, .wt = true };

		product_data(&q, false);
		ck_assert_uint_eq(run_checked(&q, false, BUG_NONE, false, 1e-2, &sites, msg, sizeof(msg)), 0);
		ck_assert_msg(run_checked(&q, false, BUG_PARITY, false, 0, &sites, msg, sizeof(msg)) > 0,
			      "a flipped parity not found (B K-major)");
		product_free(&q);
	}
	g_tma = 0;
	g_sms = 0;
	g_target = "sm_90";
}
END_TEST

/* A bug injected into a warp-specialised GEMM, and what the report says
 * (under the listed order). */
typedef struct ws_bug {
	sync_bug bug;
	const char *what, *want;
} ws_bug;

/* The orders of the coroutines the warp-specialised tests run in
 * (APOLLO_HOSTCHECK_SCHEDULE, hostcheck.c ck_order): the producer first,
 * the consumers first, a random one per pass. */
static const char *const ws_orders[] = { "listed", "reverse", "random:3" };

/* The GEMM p lowered with knob tma=`tma` on one SM (four tiles, five K
 * tiles on three stages) under each of ws_orders: clean and equal to
 * float64, and each of the n bugs reported at a site it was put in; the
 * report's text is bugs[i].want under the listed order (another order
 * may meet the bug elsewhere first: a flipped parity, say, as a deadlock
 * rather than a read before the landing).  The CUDA and SASS checks
 * (tma_cuda_checks) once, in the listed order. */
static void ws_bugs_found(product *p, int tma, const ws_bug *bugs, size_t n, const char *label)
{
	char msg[2048];
	int sites;

	g_target = "sm_90a";
	g_tma = tma;
	g_sms = 1;
	for (size_t o = 0; o < sizeof(ws_orders) / sizeof(ws_orders[0]); o++) {
		setenv("APOLLO_HOSTCHECK_SCHEDULE", ws_orders[o], 1);
		g_other_order = o > 0;
		ck_assert_msg(run_checked(p, false, BUG_NONE, false, 1e-2, &sites, msg, sizeof(msg)) == 0,
			      "%s, %s order: %s", label, ws_orders[o], msg);
		for (size_t i = 0; i < n; i++) {
			ck_assert_msg(run_checked(p, false, bugs[i].bug, false, 0, &sites, msg, sizeof(msg)) > 0,
				      "%s, %s order: %s not found", label, ws_orders[o], bugs[i].what);
			ck_assert_int_gt(sites, 0);
			if (o == 0) {
				ck_assert_msg(strstr(msg, bugs[i].want), "%s: %s", bugs[i].what, msg);
				printf("check_hostcheck: %s, %s (%d sites): %.300s\n", label, bugs[i].what, sites, msg);
			}
		}
		printf("check_hostcheck: %s, %s order: clean, exact, %zu bugs reported\n", label, ws_orders[o], n);
	}
	unsetenv("APOLLO_HOSTCHECK_SCHEDULE");
	g_other_order = false;
	g_tma = 0;
	g_sms = 0;
	g_target = "sm_90";
}

/* The warp-specialised GEMM (tma=2, docs/hopper-pipeline.md section 5's
 * table): clean and equal to float64 on one SM (four output tiles, five K
 * tiles on three stages, the ring's phases carried across tiles); each
 * injected bug reported -- the consumers' releases removed (a deadlock
 * naming the producer warpgroup), the consumers' full-wait parity flipped
 * (a read before the TMA load landed), the producer's empty wait removed
 * (a stage refilled while it is read or still landing), a short expect_tx
 * (a deadlock with tx bytes pending), a wgmma.wait_group that leaves the
 * released stage's products in flight (its refill while the wgmma reads
 * it) -- under each of ws_bugs_found's orders. */
START_TEST(ws_gemm_bugs_found)
{
	product p = { .m = 150, .k = 296, .n = 136, .dt = AP_DT_F16, .bias = true };
	static const ws_bug bugs[] = {
		{ BUG_NOARRIVE, "no release", "deadlock: the arm of threads 256..383 waits on mbarrier" },
		{ BUG_PARITY, "a flipped full parity", "before the bulk copy or TMA load on mbarrier" },
		{ BUG_NOEMPTYWAIT, "no empty wait", "copies into (an asynchronous copy)" },
		{ BUG_TXSHORT, "a short expect_tx", "-16 tx byte" },
		{ BUG_WGWAIT, "a release before its wgmma completed", "while a wgmma of warpgroup" },
	};

	product_data(&p, false);
	ws_bugs_found(&p, 2, bugs, sizeof(bugs) / sizeof(bugs[0]), "ws");
	product_free(&p);
}
END_TEST

/* The large tile of the warp-specialised forms (gemm.c gm_choose: 128 x
 * 256, two consumer warpgroups of 64 x 256 -- an m64n256k16 a K step, 128
 * accumulators a thread -- the default of a request for them where such
 * tiles fill a wave): tma=2 and tma=3 clean and equal to float64 on one SM
 * (M 150, N 520, K 136: two row tiles, three column tiles, the last
 * partial), under the listed and reverse orders; their CUDA for sm_90a
 * compiles without spills (tma_cuda_checks: 384 threads, so ptxas keeps
 * within 168 registers). */
START_TEST(ws_gemm_large_tile)
{
	product p = { .m = 150, .k = 136, .n = 520, .dt = AP_DT_F16, .bias = true };
	static const char *const orders[] = { "listed", "reverse" };
	char msg[2048];
	int sites;

	product_data(&p, false);
	g_target = "sm_90a";
	g_sms = 1;
	g_bn = 256;
	for (int tma = 2; tma <= 3; tma++)
		for (int o = 0; o < 2; o++) {
			g_tma = tma;
			g_other_order = o > 0;
			setenv("APOLLO_HOSTCHECK_SCHEDULE", orders[o], 1);
			ck_assert_msg(run_checked(&p, false, BUG_NONE, false, 1e-2, &sites, msg, sizeof(msg)) == 0,
				      "tma=%d, bn=256, %s order: %s", tma, orders[o], msg);
			printf("check_hostcheck: tma=%d GEMM, 128 x 256 tile, %s order: clean, equal to float64\n", tma,
			       orders[o]);
		}
	unsetenv("APOLLO_HOSTCHECK_SCHEDULE");
	g_other_order = false;
	g_bn = g_tma = 0;
	g_sms = 0;
	g_target = "sm_90";
	product_free(&p);
}
END_TEST

/* TF32 on wgmma (sm_90a: m64nNk8 .tf32, both operands K-major in shared
 * memory): a linear layer's weight (n x k, K contiguous) and a plain one
 * (k x n: N contiguous, copied element by element into a K-major tile),
 * under the default rule (cp.async by every thread), the warp-specialised
 * TMA form where both operands are tensor maps (the linear layer), and
 * the copying producer; listed and reverse orders.  Clean, and equal to
 * the float64 product of the operands truncated to TF32 (what wgmma
 * reads; rounding them instead is off by more than the tolerance). */
START_TEST(tf32_wgmma_gemm)
{
	static const char *const orders[] = { "listed", "reverse" };
	char msg[2048];
	int sites;

	g_target = "sm_90a";
	g_sms = 1;
	g_cuda_has = "k8.f32.tf32.tf32";
	for (int wt = 0; wt < 2; wt++) {
		product p = { .m = 150, .k = 136, .n = 200, .dt = AP_DT_F32, .bias = true, .wt = wt };

		product_data(&p, 2);
		for (int tma = 0; tma <= 3; tma++) {
			if (tma == 1 || (tma == 2 && !wt))   /* maps: K-major operands only */
				continue;
			for (int o = 0; o < 2; o++) {
				g_tma = tma;
				g_other_order = o > 0;
				setenv("APOLLO_HOSTCHECK_SCHEDULE", orders[o], 1);
				ck_assert_msg(run_checked(&p, true, BUG_NONE, false, 1e-4, &sites, msg, sizeof(msg)) == 0,
					      "TF32 wgmma, w %s, tma=%d, %s order: %s", wt ? "n x k" : "k x n", tma,
					      orders[o], msg);
				printf("check_hostcheck: TF32 wgmma GEMM, w %s, tma=%d, %s order: clean, equal to float64\n",
				       wt ? "n x k" : "k x n", tma, orders[o]);
			}
		}
		product_free(&p);
	}
	unsetenv("APOLLO_HOSTCHECK_SCHEDULE");
	g_cuda_has = NULL;
	g_other_order = false;
	g_tma = 0;
	g_sms = 0;
	g_target = "sm_90";
}
END_TEST

/* The warp-specialised GEMM with a copying producer (tma=3): the producer
 * warpgroup copies both operands by cp.async (dealt over its 128
 * threads), announces a stage one step late (wait_group, fence.proxy.async,
 * an arrival each on full), the consumers as in tma=2.  Clean and equal to
 * float64 on one SM; each injected bug reported -- the consumers' releases
 * removed (a deadlock naming the producer warpgroup), the consumers'
 * full-wait parity flipped (a wait for a phase no one completes: the
 * producer, run first, completed phase 0 already), the producer's empty
 * wait removed (its waits fall phases behind: parity aliasing), the
 * producer's cp.async.wait_group one group short (a stage announced
 * while its copies are in flight: the consumers' reads race the
 * landing), its fence removed (the async proxy may not see the copies),
 * a consumer's wgmma.wait_group leaving the released stage's products in
 * flight -- under each of ws_bugs_found's orders. */
START_TEST(ws_copy_gemm_bugs_found)
{
	product p = { .m = 150, .k = 296, .n = 136, .dt = AP_DT_F16, .bias = true };
	static const ws_bug bugs[] = {
		{ BUG_NOARRIVE, "no release", "deadlock: the arm of threads 256..383 waits on mbarrier" },
		{ BUG_PARITY, "a flipped full parity", "waits on mbarrier 1 for the phase of parity" },
		{ BUG_NOEMPTYWAIT, "no empty wait", "phases completed since its last wait" },
		{ BUG_WAIT, "a stage announced before its copies landed", "data race on shared sa" },
		{ BUG_FENCE, "no fence.proxy.async", "with no fence.proxy.async after it" },
		{ BUG_WGWAIT, "a release before its wgmma completed", "while a wgmma of warpgroup" },
	};

	product_data(&p, false);
	ws_bugs_found(&p, 3, bugs, sizeof(bugs) / sizeof(bugs[0]), "ws copies");
	product_free(&p);
}
END_TEST

/* mbarriers and bulk copies through the table (docs/hopper-pipeline.md,
 * section 2, one row each): a copy's bytes readable after a wait on the
 * phase it completes, not before and not after a wait that returned for
 * the wrong parity; a short expect_tx or a missing arrival a deadlock
 * naming the phase; more arrivals than expected; use before init; a copy
 * still in flight at the block's end; a copy over bytes still landing;
 * a wait that skipped a phase (parity aliasing). */
START_TEST(unit_mbarrier)
{
	const ap_hcheck_ops *o = ap_hostcheck_ops();
	_Alignas(16) float s[64];
	_Alignas(16) float g[64];
	_Alignas(8) long long bar[2];
	char msg[2048];
	void *c;

#define MB_START(nt)                                                    \
	do {                                                            \
		c = ctx_new(o, s, sizeof(s), g, sizeof(g), (nt), (nt)); \
		o->region(c, bar, sizeof(bar), "bar", AP_HCHECK_SHARED, 0, -1); \
	} while (0)
	/* clean: init, arrive.expect_tx, copy; every thread waits, reads */
	MB_START(4);
	o->mbar_init(c, &bar[0], 1, 0);
	o->mbar_arrive(c, &bar[0], 64, 0);
	o->bulk(c, &s[0], &g[0], 64, &bar[0], 0);
	for (unsigned t = 0; t < 4; t++)
		o->mbar_wait(c, &bar[0], 0, t);
	o->rd(c, &s[5], 4, 2, 4);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 0);
	/* the same read before any wait: the copy has not landed */
	MB_START(4);
	o->mbar_init(c, &bar[0], 1, 0);
	o->mbar_arrive(c, &bar[0], 64, 0);
	o->bulk(c, &s[0], &g[0], 64, &bar[0], 0);
	o->rd(c, &s[5], 4, 2, 4);
	for (unsigned t = 0; t < 4; t++)
		o->mbar_wait(c, &bar[0], 0, t);
	ck_assert_uint_ge(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "before the bulk copy"), "%s", msg);
	/* a wait for parity 1 in phase 0 returns at once: still in flight,
	 * reported at the read and at the block's end */
	MB_START(4);
	o->mbar_init(c, &bar[0], 1, 0);
	o->mbar_arrive(c, &bar[0], 64, 0);
	o->bulk(c, &s[0], &g[0], 64, &bar[0], 0);
	for (unsigned t = 0; t < 4; t++)
		o->mbar_wait(c, &bar[0], 1, t);
	o->rd(c, &s[5], 4, 2, 4);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 2);
	ck_assert_msg(strstr(msg, "before the bulk copy") && strstr(msg, "still in flight when the block ends"),
		      "%s", msg);
	/* expect_tx 16 bytes short: the phase never completes */
	MB_START(4);
	o->mbar_init(c, &bar[0], 1, 0);
	o->mbar_arrive(c, &bar[0], 48, 0);
	o->bulk(c, &s[0], &g[0], 64, &bar[0], 0);
	for (unsigned t = 0; t < 4; t++)
		o->mbar_wait(c, &bar[0], 0, t);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "deadlock") && strstr(msg, "-16 tx byte"), "%s", msg);
	/* two arrivals expected, one made */
	MB_START(4);
	o->mbar_init(c, &bar[1], 2, 0);
	o->mbar_arrive(c, &bar[1], 0, 3);
	for (unsigned t = 0; t < 4; t++)
		o->mbar_wait(c, &bar[1], 0, t);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "expects 1 arrival(s) of 2"), "%s", msg);
	/* one expected, two made in the phase (the first completes it, the
	 * second counts in phase 1: fine); then a third and fourth in phase 1
	 * with one expected: the fourth is one too many */
	MB_START(4);
	o->mbar_init(c, &bar[0], 2, 0);
	for (unsigned t = 0; t < 3; t++)
		o->mbar_arrive(c, &bar[0], 0, t);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 0);
	MB_START(4);
	o->mbar_init(c, &bar[0], 1, 0);
	o->mbar_arrive(c, &bar[0], 64, 0);
	o->mbar_arrive(c, &bar[0], 0, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "more arrivals in phase 0 than the 1"), "%s", msg);
	/* no init; a bad count */
	MB_START(4);
	o->mbar_arrive(c, &bar[1], 0, 1);
	o->mbar_init(c, &bar[0], 0, 0);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 2);
	ck_assert_msg(strstr(msg, "no mbarrier.init") && strstr(msg, "with 0 expected arrivals"), "%s", msg);
	/* the next copy into the stage while the last still lands */
	MB_START(4);
	o->mbar_init(c, &bar[0], 1, 0);
	o->mbar_arrive(c, &bar[0], 128, 0);
	o->bulk(c, &s[0], &g[0], 64, &bar[0], 0);
	o->bulk(c, &s[0], &g[16], 64, &bar[0], 0);
	for (unsigned t = 0; t < 4; t++)
		o->mbar_wait(c, &bar[0], 0, t);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "still delivering it"), "%s", msg);
	/* two phases pass between thread 1's waits: parity aliasing; thread 0
	 * waited on each */
	MB_START(2);
	o->mbar_init(c, &bar[0], 1, 0);
	o->mbar_arrive(c, &bar[0], 0, 0);
	o->mbar_wait(c, &bar[0], 0, 0);
	o->mbar_arrive(c, &bar[0], 0, 0);
	o->mbar_wait(c, &bar[0], 1, 0);
	o->mbar_wait(c, &bar[0], 1, 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "thread 1 waits on mbarrier 0 (parity 1) after 2 phases"), "%s", msg);
#undef MB_START
}
END_TEST

/* ---- warp-specialised kernels: arms ordered by mbarriers (roles()) ------------------ */

/* A context of `threads` threads in blocks of `bt` (one block of a
 * launch of `blocks`), split into n arms by bounds (roles() right after
 * begin(), as the printed kernel calls it; n = 0: no call), over the
 * shared array s, the mbarriers bar (two, shared) and one global buffer,
 * at block `block`; *checked: block()'s answer. */
static void *ctx_arms_at(const ap_hcheck_ops *o, void *shared, unsigned bytes, void *bar, const void *global,
			 unsigned long long gbytes, unsigned threads, unsigned bt, unsigned n,
			 const unsigned *bounds, unsigned long long blocks, unsigned long long block, int *checked)
{
	unsigned long long ext[1] = { gbytes };
	void *c;
	int k;

	ap_hostcheck_begin(ext, 1);
	c = o->begin("unit", threads, bt, blocks);
	if (n)
		o->roles(c, n, bounds);
	o->region(c, global, 0, "g", AP_HCHECK_GLOBAL, 0, 0);
	o->region(c, shared, bytes, "s", AP_HCHECK_SHARED, 0, -1);
	o->region(c, bar, 16, "bar", AP_HCHECK_SHARED, 0, -1);
	k = o->block(c, block);
	if (checked)
		*checked = k;
	return c;
}

static void *ctx_arms(const ap_hcheck_ops *o, void *shared, unsigned bytes, void *bar, const void *global,
		      unsigned long long gbytes, unsigned threads, unsigned n, const unsigned *bounds)
{
	return ctx_arms_at(o, shared, bytes, bar, global, gbytes, threads, threads, n, bounds, 1, 0, NULL);
}

/* Stores and loads between arms ordered by mbarriers (the coroutines'
 * calls: mbar_ready before a wait, mbar_wait for each thread of the arm,
 * one elected thread's arrive): 8 threads, consumers 0-3 (arm 0), the
 * producer 4-7 (arm 1); `full` (bar[0]) and `empty` (bar[1]), one arrival
 * each, initialised before the arms start (a block barrier). */
START_TEST(unit_arms)
{
	static const unsigned two[4] = { 0, 4, 4, 8 };
	const ap_hcheck_ops *o = ap_hostcheck_ops();
	_Alignas(16) float s[64];
	float g[64];
	_Alignas(8) long long bar[2];
	void *full = &bar[0], *empty = &bar[1];
	char msg[2048];
	void *c;

#define ARMS_START(threads, n, bounds)                                                  \
	do {                                                                            \
		c = ctx_arms(o, s, sizeof(s), bar, g, sizeof(g), (threads), (n), (bounds)); \
		o->mbar_init(c, full, 1, 0);                                            \
		o->mbar_init(c, empty, 1, 0);                                           \
		o->barrier(c, 0);                                                       \
	} while (0)
	/* a. the producer's stores, released by its arrive on full, acquired
	 * by each consumer thread's wait: clean; not ready before the arrive */
	ARMS_START(8, 2, two);
	o->wr(c, &s[0], 16, 4, 16);
	ck_assert_int_eq(o->mbar_ready(c, full, 0), 0);
	o->mbar_arrive(c, full, 0, 4);
	ck_assert_int_eq(o->mbar_ready(c, full, 0), 1);
	for (unsigned t = 0; t < 4; t++)
		o->mbar_wait(c, full, 0, t);
	for (unsigned t = 0; t < 4; t++)
		o->rd(c, &s[t], 4, t, 4);
	ck_assert_msg(ctx_done(o, c, msg, sizeof(msg)) == 0, "%s", msg);
	/* the same read with no wait: a race naming both threads and arms */
	ARMS_START(8, 2, two);
	o->wr(c, &s[0], 16, 4, 16);
	o->mbar_arrive(c, full, 0, 4);
	o->rd(c, &s[0], 16, 1, 16);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "data race on shared s[byte 0]") &&
		      strstr(msg, "thread 4 (arm 1) wrote it after barrier 1, thread 1 (arm 0) reads it with no "
				  "barrier or mbarrier between"), "%s", msg);
	/* a store after the arrive is not released by it: the consumers'
	 * wait orders the first stores, not the second */
	ARMS_START(8, 2, two);
	o->wr(c, &s[0], 16, 4, 16);
	o->mbar_arrive(c, full, 0, 4);
	o->wr(c, &s[4], 16, 5, 16);
	for (unsigned t = 0; t < 4; t++)
		o->mbar_wait(c, full, 0, t);
	o->rd(c, &s[0], 16, 2, 16);
	o->rd(c, &s[4], 16, 2, 16);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "s[byte 16]") && strstr(msg, "thread 5 (arm 1) wrote"), "%s", msg);
	/* within one arm, threads are ordered by barriers only, as without
	 * arms: a store and a load of two producer threads, a load and a
	 * store of two consumer threads, each race; an arrive between (the
	 * arm's own epoch) orders neither */
	ARMS_START(8, 2, two);
	o->wr(c, &s[0], 4, 4, 4);
	o->mbar_arrive(c, full, 0, 4);
	o->rd(c, &s[0], 4, 5, 4);
	o->rd(c, &s[8], 4, 0, 4);
	o->mbar_arrive(c, empty, 0, 0);
	o->wr(c, &s[8], 4, 1, 4);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 2);
	ck_assert_msg(strstr(msg, "thread 4 (arm 1) wrote it after barrier 1, thread 5 (arm 1) reads") &&
		      strstr(msg, "thread 0 (arm 0) read it after barrier 1, thread 1 (arm 0) writes"), "%s", msg);
	/* the threads outside roles()' arms are one more arm: [4, 8) is arm
	 * 0, the consumers 0-3 arm 1 */
	{
		static const unsigned one[2] = { 4, 8 };

		ARMS_START(8, 1, one);
		o->wr(c, &s[0], 16, 4, 16);
		o->rd(c, &s[0], 16, 1, 16);
		ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
		ck_assert_msg(strstr(msg, "thread 4 (arm 0) wrote") && strstr(msg, "thread 1 (arm 1) reads"), "%s",
			      msg);
	}

	/* b. write after read through empty: the consumers read the stage,
	 * consumer thread 0 arrives on empty, the producer waits (ready
	 * first) and overwrites it: clean */
	ARMS_START(8, 2, two);
	for (unsigned t = 0; t < 4; t++)
		o->rd(c, &s[0], 16, t, 16);
	ck_assert_int_eq(o->mbar_ready(c, empty, 0), 0);
	o->mbar_arrive(c, empty, 0, 0);
	ck_assert_int_eq(o->mbar_ready(c, empty, 0), 1);
	for (unsigned t = 4; t < 8; t++)
		o->mbar_wait(c, empty, 0, t);
	o->wr(c, &s[0], 16, 4, 16);
	ck_assert_msg(ctx_done(o, c, msg, sizeof(msg)) == 0, "%s", msg);
	/* the producer's store with no wait: the consumers' reads race it */
	ARMS_START(8, 2, two);
	for (unsigned t = 0; t < 4; t++)
		o->rd(c, &s[0], 16, t, 16);
	o->mbar_arrive(c, empty, 0, 0);
	o->wr(c, &s[0], 16, 4, 16);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "thread 0 (arm 0) (and others) read it after barrier 1, thread 4 (arm 1) writes "
				  "it with no barrier or mbarrier between"), "%s", msg);
	/* a wait for the wrong parity: in phase 0 a wait for parity 1 is
	 * ready at once, with nothing completed to acquire -- the store
	 * races the reads the consumers release only later; once they did,
	 * that parity is the one that blocks */
	ARMS_START(8, 2, two);
	for (unsigned t = 0; t < 4; t++)
		o->rd(c, &s[0], 16, t, 16);
	ck_assert_int_eq(o->mbar_ready(c, empty, 1), 1);
	for (unsigned t = 4; t < 8; t++)
		o->mbar_wait(c, empty, 1, t);
	o->wr(c, &s[0], 16, 4, 16);
	o->mbar_arrive(c, empty, 0, 0);
	ck_assert_int_eq(o->mbar_ready(c, empty, 1), 0);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "(arm 0) (and others) read it") && strstr(msg, "thread 4 (arm 1) writes"), "%s",
		      msg);
	/* a read after the release, by the thread that read before it: the
	 * later read is not released, the store races it */
	ARMS_START(8, 2, two);
	o->rd(c, &s[0], 16, 0, 16);
	o->mbar_arrive(c, empty, 0, 0);
	o->rd(c, &s[0], 16, 0, 16);
	for (unsigned t = 4; t < 8; t++)
		o->mbar_wait(c, empty, 0, t);
	o->wr(c, &s[0], 16, 4, 16);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "thread 0 (arm 0) read it after barrier 1, thread 4 (arm 1) writes"), "%s", msg);
#undef ARMS_START
}
END_TEST

/* Bulk copies and TMA loads between arms: copies land only at deliver()
 * (the coroutines call it when no arm can move), the producer's refill
 * of a stage is checked at its issue against the consumer arms' reads,
 * and a deadlock names the arm. */
/* A consumer warpgroup's wgmma reading a stage, then its release of the
 * stage to the producer warpgroup's refill (a TMA load): clean when the
 * release (arrive on empty) follows the wgmma.wait_group that completes
 * the reads; a race when it precedes it -- the async proxy's reads count
 * as done at the wait, so a release before it orders nothing, whatever
 * order the host ran the arms in. */
START_TEST(unit_arms_wgmma)
{
	static const unsigned two[4] = { 0, 128, 128, 256 };
	const ap_hcheck_ops *o = ap_hostcheck_ops();
	_Alignas(64) unsigned short s[256];
	_Alignas(16) float g[64];
	_Alignas(8) long long bar[2];
	void *full = &bar[0], *empty = &bar[1];
	char msg[2048];

	for (int early = 0; early < 2; early++) {
		void *c = ctx_arms(o, s, sizeof(s), bar, g, sizeof(g), 256, 2, two);
		unsigned n;

		o->mbar_init(c, full, 1, 0);
		o->mbar_init(c, empty, 1, 0);
		o->barrier(c, 0);
		o->wg_rd(c, &s[0], 64, 0);   /* the warpgroup's wgmma reads the stage */
		o->wg_commit(c, 0);
		if (early)
			o->mbar_arrive(c, empty, 0, 0);
		o->wg_wait(c, 0, 0);
		if (!early)
			o->mbar_arrive(c, empty, 0, 0);
		ck_assert_int_eq(o->mbar_ready(c, empty, 0), 1);
		for (unsigned t = 128; t < 256; t++)
			o->mbar_wait(c, empty, 0, t);
		o->mbar_arrive(c, full, 64, 128);
		o->tma(c, &s[0], 64, full, 128);   /* the producer's refill */
		ck_assert_int_eq(o->deliver(c), 1);
		n = ctx_done(o, c, msg, sizeof(msg));
		if (early) {
			ck_assert_uint_eq(n, 1);
			ck_assert_msg(strstr(msg, "data race on shared s[byte 0]") && strstr(msg, "thread 0 (arm 0)") &&
				      strstr(msg, "thread 128 (arm 1)"), "%s", msg);
		} else {
			ck_assert_msg(n == 0, "%s", msg);
		}
	}
}
END_TEST

START_TEST(unit_arms_copies)
{
	static const unsigned two[4] = { 0, 4, 4, 8 };
	static const unsigned three[6] = { 0, 4, 4, 8, 8, 12 };
	const ap_hcheck_ops *o = ap_hostcheck_ops();
	_Alignas(16) float s[64];
	_Alignas(16) float g[64];
	_Alignas(8) long long bar[2];
	void *full = &bar[0], *empty = &bar[1];
	char msg[2048];
	void *c;

#define ARMS_START(threads, n, bounds, empties)                                         \
	do {                                                                            \
		c = ctx_arms(o, s, sizeof(s), bar, g, sizeof(g), (threads), (n), (bounds)); \
		o->mbar_init(c, full, 1, 0);                                            \
		o->mbar_init(c, empty, (empties), 0);                                   \
		o->barrier(c, 0);                                                       \
	} while (0)
	/* c. arrive.expect_tx 64 and a bulk copy of 64 bytes on full: not
	 * ready until deliver() lands it; a second deliver() finds nothing;
	 * the consumers wait and read: clean.  The same with a TMA load. */
	for (int tma = 0; tma < 2; tma++) {
		ARMS_START(8, 2, two, 1);
		o->mbar_arrive(c, full, 64, 4);
		if (tma)
			o->tma(c, &s[0], 64, full, 4);
		else
			o->bulk(c, &s[0], &g[0], 64, full, 4);
		ck_assert_int_eq(o->mbar_ready(c, full, 0), 0);
		ck_assert_int_eq(o->deliver(c), 1);
		ck_assert_int_eq(o->mbar_ready(c, full, 0), 1);
		ck_assert_int_eq(o->deliver(c), 0);
		for (unsigned t = 0; t < 4; t++)
			o->mbar_wait(c, full, 0, t);
		for (unsigned t = 0; t < 4; t++)
			o->rd(c, &s[4 * t], 16, t, 16);
		ck_assert_msg(ctx_done(o, c, msg, sizeof(msg)) == 0, "%s", msg);
	}
	/* a consumer reading before the copy landed */
	ARMS_START(8, 2, two, 1);
	o->mbar_arrive(c, full, 64, 4);
	o->bulk(c, &s[0], &g[0], 64, full, 4);
	o->rd(c, &s[8], 4, 2, 4);
	ck_assert_int_eq(o->deliver(c), 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "thread 2 reads shared s[byte 32] (rank 0) before the bulk copy"), "%s", msg);
	/* deliver() lands the oldest copy first, whichever its barrier */
	ARMS_START(8, 2, two, 1);
	o->mbar_arrive(c, empty, 16, 5);
	o->bulk(c, &s[16], &g[0], 16, empty, 5);
	o->mbar_arrive(c, full, 64, 4);
	o->bulk(c, &s[0], &g[0], 64, full, 4);
	ck_assert_int_eq(o->deliver(c), 1);
	ck_assert_int_eq(o->mbar_ready(c, empty, 0), 1);
	ck_assert_int_eq(o->mbar_ready(c, full, 0), 0);
	ck_assert_int_eq(o->deliver(c), 1);
	ck_assert_int_eq(o->mbar_ready(c, full, 0), 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 0);

	/* a two-stage-in-time pipeline as the coroutines run it: the
	 * producer's first empty-wait (parity 1 in phase 0) passes, it fills
	 * the stage; both arms block, the copy lands; the consumers wait,
	 * read, release the stage; the producer waits on empty and refills it
	 * with a copy -- the bytes the first copy landed are the producer's
	 * to overwrite only through the consumers' release, since it never
	 * waited on full itself; the consumers read the second fill */
	ARMS_START(8, 2, two, 1);
	ck_assert_int_eq(o->mbar_ready(c, empty, 1), 1);
	for (unsigned t = 4; t < 8; t++)
		o->mbar_wait(c, empty, 1, t);
	o->mbar_arrive(c, full, 64, 4);
	o->tma(c, &s[0], 64, full, 4);
	ck_assert_int_eq(o->mbar_ready(c, empty, 0), 0);
	ck_assert_int_eq(o->mbar_ready(c, full, 0), 0);
	ck_assert_int_eq(o->deliver(c), 1);
	ck_assert_int_eq(o->mbar_ready(c, full, 0), 1);
	for (unsigned t = 0; t < 4; t++)
		o->mbar_wait(c, full, 0, t);
	for (unsigned t = 0; t < 4; t++)
		o->rd(c, &s[0], 64, t, 16);
	o->mbar_arrive(c, empty, 0, 0);
	ck_assert_int_eq(o->mbar_ready(c, empty, 0), 1);
	for (unsigned t = 4; t < 8; t++)
		o->mbar_wait(c, empty, 0, t);
	o->mbar_arrive(c, full, 64, 4);
	o->tma(c, &s[0], 64, full, 4);
	ck_assert_int_eq(o->deliver(c), 1);
	ck_assert_int_eq(o->mbar_ready(c, full, 1), 1);
	for (unsigned t = 0; t < 4; t++)
		o->mbar_wait(c, full, 1, t);
	for (unsigned t = 0; t < 4; t++)
		o->rd(c, &s[0], 64, t, 16);
	o->mbar_arrive(c, empty, 0, 0);
	ck_assert_msg(ctx_done(o, c, msg, sizeof(msg)) == 0, "%s", msg);

	/* d. a deadlock: the consumers wait on full, which still expects its
	 * arrival, nothing in flight -- one report for the phase however
	 * often stuck() is called; the producer on empty, another; a stuck()
	 * for a wait that could go on reports nothing */
	ARMS_START(8, 2, two, 1);
	ck_assert_int_eq(o->mbar_ready(c, full, 0), 0);
	ck_assert_int_eq(o->deliver(c), 0);
	o->stuck(c, full, 0, 0, 4);
	o->stuck(c, full, 0, 0, 4);
	o->stuck(c, empty, 1, 4, 8);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "deadlock: the arm of threads 0..3 waits on mbarrier 0 for the phase of parity 0: "
				  "phase 0 still expects 1 arrival(s) of 1 and 0 tx byte(s)"), "%s", msg);
	ARMS_START(8, 2, two, 1);
	o->stuck(c, full, 0, 0, 4);
	o->stuck(c, empty, 0, 4, 8);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 2);
	ck_assert_msg(strstr(msg, "threads 0..3 waits on mbarrier 0") && strstr(msg, "threads 4..7 waits on mbarrier 1"),
		      "%s", msg);

	/* e. a refill by a bulk copy with two consumer arms (0-3, 4-7) and the
	 * producer (8-11): only arm 0 arrives on empty, which expects one
	 * arrival -- its phase completes, but arm 1's reads were never
	 * released: the copy races them, checked at its issue */
	ARMS_START(12, 3, three, 1);
	for (unsigned t = 0; t < 8; t++)
		o->rd(c, &s[0], 16, t, 16);
	o->mbar_arrive(c, empty, 0, 0);
	ck_assert_int_eq(o->mbar_ready(c, empty, 0), 1);
	for (unsigned t = 8; t < 12; t++)
		o->mbar_wait(c, empty, 0, t);
	o->mbar_arrive(c, full, 64, 8);
	o->bulk(c, &s[0], &g[0], 64, full, 8);
	ck_assert_int_eq(o->deliver(c), 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_msg(strstr(msg, "thread 4 (arm 1) (and others) read it") && strstr(msg, "thread 8 (arm 2) copies into"),
		      "%s", msg);
	/* two arrivals expected, one from each consumer arm: clean; both
	 * from arm 0: the phase completes all the same, arm 1 still races */
	for (int both = 1; both >= 0; both--) {
		ARMS_START(12, 3, three, 2);
		for (unsigned t = 0; t < 8; t++)
			o->rd(c, &s[0], 16, t, 16);
		o->mbar_arrive(c, empty, 0, 0);
		o->mbar_arrive(c, empty, 0, both ? 4 : 1);
		ck_assert_int_eq(o->mbar_ready(c, empty, 0), 1);
		for (unsigned t = 8; t < 12; t++)
			o->mbar_wait(c, empty, 0, t);
		o->mbar_arrive(c, full, 64, 8);
		o->bulk(c, &s[0], &g[0], 64, full, 8);
		ck_assert_int_eq(o->deliver(c), 1);
		ck_assert_msg(ctx_done(o, c, msg, sizeof(msg)) == (unsigned)!both, "%s", msg);
		if (!both)
			ck_assert_msg(strstr(msg, "thread 4 (arm 1) (and others) read it"), "%s", msg);
	}
#undef ARMS_START
}
END_TEST

/* The coroutines' order per pass (APOLLO_HOSTCHECK_SCHEDULE, ck_order):
 * listed 0, 1, 2; reverse 2, 1, 0; random:SEED a permutation of 0..n-1
 * every pass, the same passes again for the same seed, others for
 * another seed within ten passes; out-of-range i returned as it is; an
 * unknown value reported (the listed order kept). */
static void order_passes(const ap_hcheck_ops *o, const char *sched, unsigned n, int passes, unsigned *out)
{
	_Alignas(16) float s[64];
	float g[16];
	char msg[256];
	void *c;

	setenv("APOLLO_HOSTCHECK_SCHEDULE", sched, 1);
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 64, 64);
	for (int p = 0; p < passes; p++)
		for (unsigned i = 0; i < n; i++)
			out[p * n + i] = o->order(c, i, n);
	ck_assert_uint_eq(o->order(c, n, n), n);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 0);
	unsetenv("APOLLO_HOSTCHECK_SCHEDULE");
}

START_TEST(unit_schedule)
{
	const ap_hcheck_ops *o = ap_hostcheck_ops();
	unsigned a[40], b[40], d[40];
	_Alignas(16) float s[64];
	float g[16];
	char msg[512];
	void *c;
	bool differs = false;

	order_passes(o, "listed", 3, 1, a);
	ck_assert(a[0] == 0 && a[1] == 1 && a[2] == 2);
	order_passes(o, "reverse", 3, 1, a);
	ck_assert(a[0] == 2 && a[1] == 1 && a[2] == 0);
	order_passes(o, "random:5", 4, 10, a);
	order_passes(o, "random:5", 4, 10, b);
	order_passes(o, "random:6", 4, 10, d);
	for (int p = 0; p < 10; p++) {
		unsigned seen = 0;

		for (int i = 0; i < 4; i++)
			seen |= 1u << a[p * 4 + i];
		ck_assert_uint_eq(seen, 0xfu);
	}
	ck_assert_int_eq(memcmp(a, b, sizeof(unsigned) * 40), 0);
	for (int i = 0; i < 40; i++)
		differs |= a[i] != d[i];
	ck_assert(differs);
	setenv("APOLLO_HOSTCHECK_SCHEDULE", "random:x", 1);
	c = ctx_new(o, s, sizeof(s), g, sizeof(g), 64, 64);
	ck_assert_uint_eq(o->order(c, 1, 3), 1);
	ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
	ck_assert_ptr_nonnull(strstr(msg, "APOLLO_HOSTCHECK_SCHEDULE=random:x: not listed, reverse or random:SEED"));
	unsetenv("APOLLO_HOSTCHECK_SCHEDULE");
}
END_TEST

/* f. Without roles(), or with one arm in all, the checker is as before
 * (the messages' old wording, no arm named); roles() checks what the
 * kernel gives it; block barriers order arms of one block rank only; the
 * mbarriers keep their state in a block whose shared memory is not
 * tracked, and with no shared memory at all. */
START_TEST(unit_arms_edges)
{
	static const unsigned all[2] = { 0, 8 };
	const ap_hcheck_ops *o = ap_hostcheck_ops();
	_Alignas(16) float s[64];
	_Alignas(16) float g[64];
	_Alignas(8) long long bar[2];
	void *full = &bar[0];
	char msg[2048];
	void *c;
	int checked;

	for (int n = 0; n < 2; n++) {   /* no roles(); roles() of one arm */
		c = ctx_arms(o, s, sizeof(s), bar, g, sizeof(g), 8, (unsigned)n, all);
		o->wr(c, &s[3], 4, 0, 1);
		o->rd(c, &s[3], 4, 1, 1);
		ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 1);
		ck_assert_msg(strstr(msg, "data race on shared s[byte 12] (rank 0): thread 0 (rank 0) wrote it after "
					  "barrier 0, thread 1 (rank 0) reads it with no block barrier between") &&
			      !strstr(msg, "arm"), "%s", msg);
		c = ctx_arms(o, s, sizeof(s), bar, g, sizeof(g), 8, (unsigned)n, all);
		o->wr(c, &s[3], 4, 0, 1);
		o->barrier(c, 0);
		o->rd(c, &s[3], 4, 1, 1);
		ck_assert_msg(ctx_done(o, c, msg, sizeof(msg)) == 0, "%s", msg);
	}
	/* roles() with too many arms, overlapping arms, an arm beyond the
	 * block: reported, ignored (one arm: no arm named) */
	{
		static const unsigned nine[18] = { 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8 };
		static const unsigned overlap[4] = { 0, 4, 3, 8 };
		static const unsigned beyond[4] = { 0, 4, 4, 9 };

		c = ctx_arms(o, s, sizeof(s), bar, g, sizeof(g), 8, 9, nine);
		o->roles(c, 2, overlap);
		o->roles(c, 2, beyond);
		o->block(c, 1);
		o->wr(c, &s[0], 4, 4, 1);
		o->rd(c, &s[0], 4, 0, 1);
		ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 4);
		ck_assert_msg(strstr(msg, "more than 8 arms (9)") && strstr(msg, "arms 0 and 1 overlap") &&
			      strstr(msg, "threads [4, 9), is not a range of the block's 8 threads") &&
			      strstr(msg, "with no block barrier between"), "%s", msg);
	}
	/* a cluster of two blocks of 8: arms 0 (0-3) and 1 (4-7) in rank 0,
	 * arm 2 (8-15) in rank 1.  Arm 0's store, a block barrier, then arm
	 * 1's arrive: arm 2's wait acquires the store through arm 1's clock;
	 * without the arrive and wait, a block barrier does not order rank 1
	 * after rank 0 */
	for (int sync = 1; sync >= 0; sync--) {
		static const unsigned ranks[6] = { 0, 4, 4, 8, 8, 16 };

		c = ctx_arms_at(o, s, sizeof(s), bar, g, sizeof(g), 16, 8, 3, ranks, 1, 0, NULL);
		o->mbar_init(c, full, 1, 0);
		o->barrier(c, 1);
		o->wr(c, &s[0], 4, 1, 1);
		o->barrier(c, 0);
		if (sync) {
			o->mbar_arrive(c, full, 0, 5);
			ck_assert_int_eq(o->mbar_ready(c, full, 0), 1);
			for (unsigned t = 8; t < 16; t++)
				o->mbar_wait(c, full, 0, t);
		}
		o->rd(c, &s[0], 4, 9, 1);
		ck_assert_msg(ctx_done(o, c, msg, sizeof(msg)) == (unsigned)!sync, "%s", msg);
		if (!sync)
			ck_assert_msg(strstr(msg, "thread 1 (arm 0, rank 0) wrote it after barrier 1, thread 9 (arm 2, "
						  "rank 1) reads it"), "%s", msg);
	}
	/* block 5 of 100 is not tracked (unless every block is): the
	 * barrier's phases and the copies in flight still are */
	{
		static const unsigned two[4] = { 0, 4, 4, 8 };

		c = ctx_arms_at(o, s, sizeof(s), bar, g, sizeof(g), 8, 8, 2, two, 100, 5, &checked);
		if (!getenv("APOLLO_HOSTCHECK_ALL_BLOCKS"))
			ck_assert_int_eq(checked, 0);
		o->mbar_init(c, full, 1, 0);
		o->mbar_arrive(c, full, 64, 4);
		o->tma(c, &s[0], 64, full, 4);
		ck_assert_int_eq(o->mbar_ready(c, full, 0), 0);
		ck_assert_int_eq(o->deliver(c), 1);
		ck_assert_int_eq(o->mbar_ready(c, full, 0), 1);
		ck_assert_int_eq(o->deliver(c), 0);
		for (unsigned t = 0; t < 4; t++)
			o->mbar_wait(c, full, 0, t);
		o->mbar_arrive(c, full, 32, 4);
		o->bulk(c, &s[16], &g[0], 32, full, 4);
		ck_assert_int_eq(o->mbar_ready(c, full, 1), 0);
		ck_assert_int_eq(o->deliver(c), 1);
		ck_assert_int_eq(o->mbar_ready(c, full, 1), 1);
		ck_assert_msg(ctx_done(o, c, msg, sizeof(msg)) == 0, "%s", msg);
	}
	/* no shared array registered (no shadow cells at all), arms on: the
	 * barrier works, accesses go unchecked; a barrier never initialised
	 * is reported and ready (the kernel moves on) */
	{
		static const unsigned two[4] = { 0, 4, 4, 8 };
		unsigned long long ext[1] = { sizeof(g) };

		ap_hostcheck_begin(ext, 1);
		c = o->begin("unit", 8, 8, 1);
		o->roles(c, 2, two);
		o->region(c, g, 0, "g", AP_HCHECK_GLOBAL, 0, 0);
		o->block(c, 0);
		o->mbar_init(c, full, 1, 0);
		o->mbar_arrive(c, full, 64, 4);
		o->tma(c, &s[0], 64, full, 4);
		o->wr(c, &s[0], 4, 5, 4);
		o->rd(c, &s[0], 4, 0, 4);
		ck_assert_int_eq(o->mbar_ready(c, full, 0), 0);
		ck_assert_int_eq(o->deliver(c), 1);
		ck_assert_int_eq(o->mbar_ready(c, full, 0), 1);
		o->mbar_wait(c, full, 0, 0);
		ck_assert_int_eq(o->mbar_ready(c, &bar[1], 0), 1);
		o->stuck(c, &bar[1], 0, 0, 4);
		ck_assert_uint_eq(ctx_done(o, c, msg, sizeof(msg)), 2);
		ck_assert_msg(strstr(msg, "mbarrier.try_wait on the mbarrier at") &&
			      strstr(msg, "a deadlocked wait on the mbarrier at"), "%s", msg);
	}
}
END_TEST

typedef enum bulk_bug { BULK_OK, BULK_NOWAIT, BULK_PARITY, BULK_TXSHORT, BULK_NOSYNC } bulk_bug;

/* A hand-built two-stage bulk-copy pipeline (sm_90; the structure a TMA
 * pipeline without warp specialisation has): 2 blocks of 128 threads,
 * each summing 4 chunks of 128 floats of x, chunk i in stage i % 2 with
 * mbarrier i % 2, parity (i / 2) % 2; thread 0 initialises the barriers
 * (fence.proxy.async, barrier), then issues each chunk's arrive.expect_tx
 * and copy, the next into a stage once every thread has read it (a
 * barrier); thread t adds element (t + 1) % 128 of each chunk (another
 * thread's, so only the wait makes it safe). */
static ap_kir_kernel *bulk_kernel(bulk_bug bug)
{
	ap_kir_kernel *k = ap_kir_kernel_new("bulk_stages");
	ap_kir_array *x, *out, *tile, *bars;
	ap_kir_expr *tid, *blk, *zero;
	ap_kir_var *acc, *i;
	ap_kir_stmt *s, *loop;
	ap_kir_block *body;
	int tx = bug == BULK_TXSHORT ? 496 : 512;

	ck_assert_ptr_nonnull(k);
	k->grid[0] = 2;
	k->block[0] = 128;
	x = ap_kir_param(k, "x", AP_DT_F32, false, -1);
	out = ap_kir_param(k, "out", AP_DT_F32, true, -1);
	x->size = 2 * 4 * 128;
	out->size = 2 * 128;
	tile = ap_kir_shared_dyn(k, "tile", AP_DT_F32, 2 * 128);
	bars = ap_kir_mbarriers(k, "bars", 2);
	tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	blk = ap_kir_index_of(k, AP_KIR_BLOCK_X);
	zero = ap_kir_idx(k, 0);
	s = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_EQ, tid, zero));
	ap_kir_mbar_init(k, &s->body, bars, ap_kir_idx(k, 0), ap_kir_int(k, AP_DT_I32, 1));
	ap_kir_mbar_init(k, &s->body, bars, ap_kir_idx(k, 1), ap_kir_int(k, AP_DT_I32, 1));
	ap_kir_fence_proxy_async(k, &s->body);
	ap_kir_barrier(k, &k->body);
	s = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_EQ, tid, zero));
	for (int st = 0; st < 2; st++) {
		ap_kir_mbar_arrive(k, &s->body, bars, ap_kir_idx(k, st), ap_kir_int(k, AP_DT_I32, tx));
		ap_kir_bulk_copy(k, &s->body, tile, ap_kir_idx(k, 128 * st), x,
				 ap_kir_addi(k, ap_kir_muli(k, blk, 512), 128 * st), 512, bars, ap_kir_idx(k, st));
	}
	acc = ap_kir_var_new(k, AP_DT_F32, "acc");
	ap_kir_let(k, &k->body, acc, ap_kir_float(k, AP_DT_F32, 0));
	i = ap_kir_var_new(k, ap_kir_idx(k, 0)->type, "i");
	loop = ap_kir_for(k, &k->body, i, ap_kir_idx(k, 0), ap_kir_idx(k, 4), 1);
	body = &loop->body;
	{
		ap_kir_expr *st = ap_kir_binary(k, AP_KIR_REM, ap_kir_ref(k, i), ap_kir_idx(k, 2));
		ap_kir_expr *ph = ap_kir_binary(k, AP_KIR_REM, ap_kir_binary(k, AP_KIR_DIV, ap_kir_ref(k, i),
									       ap_kir_idx(k, 2)), ap_kir_idx(k, 2));

		if (bug == BULK_PARITY)
			ph = ap_kir_binary(k, AP_KIR_XOR, ph, ap_kir_idx(k, 1));
		if (bug != BULK_NOWAIT)
			ap_kir_mbar_wait(k, body, bars, st, ph);
		ap_kir_assign(k, body, acc, ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc),
				ap_kir_load(k, tile, ap_kir_add(k, ap_kir_muli(k, st, 128),
					ap_kir_binary(k, AP_KIR_REM, ap_kir_addi(k, tid, 1), ap_kir_idx(k, 128))))));
		if (bug != BULK_NOSYNC)
			ap_kir_barrier(k, body);
		s = ap_kir_if(k, body, ap_kir_binary(k, AP_KIR_LAND, ap_kir_binary(k, AP_KIR_EQ, tid, zero),
				ap_kir_binary(k, AP_KIR_LT, ap_kir_addi(k, ap_kir_ref(k, i), 2), ap_kir_idx(k, 4))));
		ap_kir_mbar_arrive(k, &s->body, bars, st, ap_kir_int(k, AP_DT_I32, tx));
		ap_kir_bulk_copy(k, &s->body, tile, ap_kir_muli(k, st, 128), x,
				 ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, blk, 4), ap_kir_addi(k, ap_kir_ref(k, i), 2)),
					     128), 512, bars, st);
	}
	ap_kir_store(k, &k->body, out, ap_kir_add(k, ap_kir_muli(k, blk, 128), tid), ap_kir_ref(k, acc));
	ck_assert_msg(!ap_kir_failed(k), "bulk_stages failed to build");
	return k;
}

/* Runs bulk_kernel(bug) on the host (checking mode when check), x[i] = i
 * mod 97; the messages' count (checking) or 0; the sums compared with a
 * float64 reference when ok_values. */
static unsigned run_bulk(bulk_bug bug, bool check, bool ok_values, char *msg, size_t cap)
{
	ap_kir_kernel *k = bulk_kernel(bug);
	ap_error err;
	char *src;
	void *h, *args[2];
	float x[1024], out[256];
	unsigned long long ext[2] = { sizeof(x), sizeof(out) };
	unsigned n = 0;
	host_fn f;
	void *sym;

	ck_assert_msg(ap_kir_verify(k, NULL, &err) == 0, "%s", err.msg);
	src = ap_kir_print(k, check ? AP_KIR_HOST_CHECK : AP_KIR_HOST, &err);
	ck_assert_msg(src != NULL, "%s", err.msg);
	h = load(src);
	if (check) {
		const ap_hcheck_ops **rt = dlsym(h, "ap_check_rt");

		ck_assert_ptr_nonnull(rt);
		*rt = ap_hostcheck_ops();
	}
	for (int e = 0; e < 1024; e++)
		x[e] = (float)(e % 97);
	memset(out, 0, sizeof(out));
	args[0] = x;
	args[1] = out;
	sym = dlsym(h, k->name);
	memcpy(&f, &sym, sizeof(f));
	if (check)
		ap_hostcheck_begin(ext, 2);
	f(args, 0, 2);
	if (check)
		n = ap_hostcheck_end(msg, cap);
	for (int b = 0; ok_values && b < 2; b++)
		for (int t = 0; t < 128; t++) {
			double want = 0;

			for (int c = 0; c < 4; c++)
				want += (double)x[(b * 4 + c) * 128 + (t + 1) % 128];
			ck_assert_msg(out[b * 128 + t] == (float)want, "block %d thread %d: %g, want %g", b, t,
				      out[b * 128 + t], want);
		}
	dlclose(h);
	free(src);
	ap_kir_kernel_free(k);
	return n;
}

START_TEST(bulk_pipeline_bugs_found)
{
	ap_kir_kernel *k = bulk_kernel(BULK_OK);
	char msg[2048], *cuda;
	ap_error err;

	/* CUDA: the PTX of each step; NVRTC compiles it for sm_90 where it loads */
	cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
	ck_assert_msg(cuda != NULL, "%s", err.msg);
	ck_assert_ptr_nonnull(strstr(cuda, "mbarrier.init.shared::cta.b64"));
	ck_assert_ptr_nonnull(strstr(cuda, "mbarrier.arrive.expect_tx.shared::cta.b64"));
	ck_assert_ptr_nonnull(strstr(cuda, "mbarrier.try_wait.parity.shared::cta.b64"));
	ck_assert_ptr_nonnull(strstr(cuda, "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"));
	if (ap_nvrtc_load(&err) == 0) {
		uint8_t *ptx = NULL;
		size_t len = 0;

		ck_assert_msg(ap_nvrtc_compile(cuda, k->name, "compute_90", false, &ptx, &len, &err) == 0, "%s",
			      err.msg);
		ck_assert_ptr_nonnull(strstr((char *)ptx, "cp.async.bulk.shared::cluster.global"));
		ck_assert_ptr_nonnull(strstr((char *)ptx, "mbarrier.try_wait.parity"));
		free(ptx);
		/* NVRTC copies inline PTX as it is: a cubin has ptxas read it */
		ptx = NULL;
		ck_assert_msg(ap_nvrtc_compile(cuda, k->name, "sm_90", true, &ptx, &len, &err) == 0, "ptxas: %s",
			      err.msg);
		ck_assert_uint_gt(len, 0);
		free(ptx);
	} else {
		printf("SKIP NVRTC compile of bulk_stages: %s\n", err.msg);
	}
	free(cuda);
	ap_kir_kernel_free(k);
	/* the host: right sums plain and checked, clean */
	ck_assert_uint_eq(run_bulk(BULK_OK, false, true, msg, sizeof(msg)), 0);
	ck_assert_msg(run_bulk(BULK_OK, true, true, msg, sizeof(msg)) == 0, "%s", msg);
	/* each bug: the plain host still gets the sums (copies land at once),
	 * the checker names it */
	ck_assert_uint_eq(run_bulk(BULK_NOWAIT, false, true, msg, sizeof(msg)), 0);
	ck_assert_uint_gt(run_bulk(BULK_NOWAIT, true, false, msg, sizeof(msg)), 0);
	ck_assert_msg(strstr(msg, "before the bulk copy"), "no wait: %s", msg);
	ck_assert_uint_gt(run_bulk(BULK_PARITY, true, false, msg, sizeof(msg)), 0);
	ck_assert_msg(strstr(msg, "before the bulk copy"), "wrong parity: %s", msg);
	ck_assert_uint_gt(run_bulk(BULK_TXSHORT, true, false, msg, sizeof(msg)), 0);
	ck_assert_msg(strstr(msg, "deadlock") && strstr(msg, "-16 tx byte"), "short expect_tx: %s", msg);
	ck_assert_uint_gt(run_bulk(BULK_NOSYNC, true, false, msg, sizeof(msg)), 0);
	/* the host runs thread 0 (which reads, then copies the next chunk
	 * into the stage) before the others read it */
	ck_assert_msg(strstr(msg, "before the bulk copy"), "stage reused unsynced: %s", msg);
	printf("check_hostcheck: bulk pipeline, stage reused without a barrier: %.200s\n", msg);
}
END_TEST

/* The hand-built TMA kernel of tests/lib/tma_box.h: the host's load (the
 * printed ap_tmap_host_load) must give the bytes common/tmap.c's
 * ap_tmap_load gives, plain and checked; the checker must find nothing,
 * and a read before the wait; NVRTC and ptxas take the CUDA for sm_90. */
static unsigned run_tma(bool wait, bool check, char *msg, size_t cap)
{
	ap_kir_kernel *k = tma_box_kernel(wait);
	const ap_tmap_desc *d = k->arrays[0]->tmap;
	_Alignas(1024) static uint8_t ref[2048];
	static uint16_t g[104 * 70], out[4 * 1024];
	unsigned long long ext[2] = { sizeof(g), sizeof(out) };
	void *h, *args[2] = { g, out }, *sym;
	ap_error err;
	char *src, why[160];
	unsigned n = 0;
	host_fn f;

	ck_assert_msg(ap_kir_verify(k, NULL, &err) == 0, "%s", err.msg);
	src = ap_kir_print(k, check ? AP_KIR_HOST_CHECK : AP_KIR_HOST, &err);
	ck_assert_msg(src != NULL, "%s", err.msg);
	h = load(src);
	if (check) {
		const ap_hcheck_ops **rt = dlsym(h, "ap_check_rt");

		*rt = ap_hostcheck_ops();
		ap_hostcheck_begin(ext, 2);
	}
	for (int i = 0; i < 104 * 70; i++)
		g[i] = (uint16_t)(0x3c00 + i);
	memset(out, 0xff, sizeof(out));
	sym = dlsym(h, k->name);
	memcpy(&f, &sym, sizeof(f));
	f(args, 0, 4);
	if (check)
		n = ap_hostcheck_end(msg, cap);
	for (int b = 0; wait && b < 4; b++) {
		const int32_t co[2] = { TMA_BOX_X0(b), TMA_BOX_Y0(b) };

		ck_assert_int_eq(ap_tmap_load(d, g, co, ref, sizeof(ref), why, sizeof(why)), 2048);
		for (int e = 0; e < 1024; e++) {
			uint16_t want;

			memcpy(&want, ref + 2 * e, 2);
			ck_assert_msg(out[b * 1024 + e] == want, "block %d element %d: %#x, want %#x", b, e,
				      out[b * 1024 + e], want);
		}
	}
	dlclose(h);
	free(src);
	ap_kir_kernel_free(k);
	return n;
}

START_TEST(tma_load_kernel)
{
	ap_kir_kernel *k = tma_box_kernel(true);
	char msg[2048], *cuda;
	ap_error err;

	cuda = ap_kir_print(k, AP_KIR_CUDA, &err);
	ck_assert_msg(cuda != NULL, "%s", err.msg);
	ck_assert_ptr_nonnull(strstr(cuda, "const __grid_constant__ ap_tmap g_tmap"));
	ck_assert_ptr_nonnull(strstr(cuda, "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::"
					   "complete_tx::bytes"));
	if (ap_nvrtc_load(&err) == 0) {
		uint8_t *bin = NULL;
		size_t len = 0;

		ck_assert_msg(ap_nvrtc_compile(cuda, k->name, "sm_90", true, &bin, &len, &err) == 0, "ptxas: %s",
			      err.msg);
		free(bin);
	} else {
		printf("SKIP NVRTC compile of tma_box: %s\n", err.msg);
	}
	free(cuda);
	ap_kir_kernel_free(k);
	ck_assert_uint_eq(run_tma(true, false, msg, sizeof(msg)), 0);
	ck_assert_msg(run_tma(true, true, msg, sizeof(msg)) == 0, "%s", msg);
	ck_assert_uint_gt(run_tma(false, true, msg, sizeof(msg)), 0);
	ck_assert_msg(strstr(msg, "before the bulk copy or TMA load"), "%s", msg);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("hostcheck");
	TCase *tc = tcase_create("hostcheck");

	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, unit_races_and_barriers);
	tcase_add_test(tc, unit_cp_async);
	tcase_add_test(tc, unit_banks);
	tcase_add_test(tc, unit_clusters);
	tcase_add_test(tc, gemm_pipeline_bugs_found);
	tcase_add_test(tc, splitk_cluster_bug_found);
	tcase_add_test(tc, unit_wgmma);
	tcase_add_test(tc, wgmma_bugs_found);
	tcase_add_test(tc, tma_gemm_bugs_found);
	tcase_add_test(tc, ws_gemm_bugs_found);
	tcase_add_test(tc, ws_gemm_large_tile);
	tcase_add_test(tc, tf32_wgmma_gemm);
	tcase_add_test(tc, ws_copy_gemm_bugs_found);
	tcase_add_test(tc, unit_mbarrier);
	tcase_add_test(tc, unit_arms_wgmma);
	tcase_add_test(tc, unit_arms);
	tcase_add_test(tc, unit_arms_copies);
	tcase_add_test(tc, unit_arms_edges);
	tcase_add_test(tc, unit_schedule);
	tcase_add_test(tc, bulk_pipeline_bugs_found);
	tcase_add_test(tc, tma_load_kernel);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
