/* check_roles.c -- warp-specialised kernels (ROLES, kir.h) on the host:
 * the coroutine printer (print.c, print_roles_host), its plain mbarrier
 * state, the deadlock exit (ap_host_fault) and the checker's arms
 * (client/hostcheck.c: clocks across arms, copies landing as late as
 * they may, stuck arms reported), on a hand-built producer / consumer
 * pipeline; the verifier's rule role; the CUDA text through NVRTC and
 * ptxas.
 *
 * The kernel (roles_kernel): 2 blocks of 96 threads; arm [64, 96) is the
 * producer warp, arm [0, 64) two consumer warps (groups of 32, each a
 * coroutine of its own on the host).  A ring of two stages of 64 floats,
 * full[2] (count 1: the producer's expect_tx arrival) and empty[2]
 * (count 64: every consumer thread after its read).  The producer copies
 * chunk i of its block's 4 (cp.async.bulk, 256 bytes) into stage i % 2
 * after waiting for the stage's release; each consumer thread t adds
 * element (t + 1) % 64 of every chunk: out[b][t] = sum_i x[b][i][(t + 1)
 * % 64], exact in float32 (small integers).
 *
 * Injected bugs (roles_bug): NOARRIVE the consumers' empty arrivals
 * removed -- the producer waits forever: a deadlock, ap_host_fault on the
 * plain host, the stuck arm named by the checker; PARITY the consumers'
 * full wait with the parity flipped -- they read a stage before its copy
 * landed; NOEMPTYWAIT the producer's empty wait removed -- it refills a
 * stage the consumers still read; TXSHORT an expect_tx 16 bytes short --
 * the phase never completes.
 */
#include <check.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/hostcheck.h"
#include "server/backend/backend.h"
#include "server/kir/kir.h"

typedef void (*host_fn)(void *const *args, unsigned block_begin, unsigned block_end);

typedef enum roles_bug { ROLES_OK, ROLES_NOARRIVE, ROLES_PARITY, ROLES_NOEMPTYWAIT, ROLES_TXSHORT } roles_bug;

#define CHUNKS 4
#define W 64   /* elements per chunk, consumer threads */

static ap_kir_expr *I(ap_kir_kernel *k, int64_t v)
{
	return ap_kir_idx(k, v);
}

/* i % 2 and (i / 2) % 2 (the stage and the parity of its use number). */
static ap_kir_expr *stage_of(ap_kir_kernel *k, ap_kir_var *i)
{
	return ap_kir_binary(k, AP_KIR_AND, ap_kir_ref(k, i), I(k, 1));
}

static ap_kir_expr *parity_of(ap_kir_kernel *k, ap_kir_var *i)
{
	return ap_kir_binary(k, AP_KIR_AND, ap_kir_binary(k, AP_KIR_SHR, ap_kir_ref(k, i), I(k, 1)), I(k, 1));
}

static ap_kir_kernel *roles_kernel(roles_bug bug)
{
	ap_kir_kernel *k = ap_kir_kernel_new("roles_ring");
	ap_kir_array *x, *out, *tile, *full, *empty;
	ap_kir_expr *tid, *blk;
	ap_kir_stmt *s, *roles, *arm, *loop;
	ap_kir_var *i, *acc;

	ck_assert_ptr_nonnull(k);
	k->grid[0] = 2;
	k->block[0] = 96;
	x = ap_kir_param(k, "x", AP_DT_F32, false, -1);
	out = ap_kir_param(k, "out", AP_DT_F32, true, -1);
	x->size = 2 * CHUNKS * W;
	out->size = 2 * W;
	tile = ap_kir_shared_dyn(k, "tile", AP_DT_F32, 2 * W);
	full = ap_kir_mbarriers(k, "full", 2);
	empty = ap_kir_mbarriers(k, "empty", 2);
	tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	blk = ap_kir_index_of(k, AP_KIR_BLOCK_X);
	s = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_EQ, tid, I(k, 0)));
	for (int st = 0; st < 2; st++) {
		ap_kir_mbar_init(k, &s->body, full, I(k, st), ap_kir_int(k, AP_DT_I32, 1));
		ap_kir_mbar_init(k, &s->body, empty, I(k, st), ap_kir_int(k, AP_DT_I32, W));
	}
	ap_kir_fence_proxy_async(k, &s->body);
	ap_kir_barrier(k, &k->body);
	roles = ap_kir_roles(k, &k->body);
	/* the producer warp */
	arm = ap_kir_arm(k, roles, W, W + 32, 32, 0);
	ck_assert_ptr_nonnull(arm);
	i = ap_kir_var_new(k, AP_DT_I64, "i");
	loop = ap_kir_for(k, &arm->body, i, I(k, 0), I(k, CHUNKS), 1);
	if (bug != ROLES_NOEMPTYWAIT)
		ap_kir_mbar_wait(k, &loop->body, empty, stage_of(k, i),
				 ap_kir_binary(k, AP_KIR_XOR, parity_of(k, i), I(k, 1)));
	s = ap_kir_if(k, &loop->body, ap_kir_binary(k, AP_KIR_EQ, tid, I(k, W)));
	ap_kir_mbar_arrive(k, &s->body, full, stage_of(k, i),
			   ap_kir_int(k, AP_DT_I32, bug == ROLES_TXSHORT ? 4 * W - 16 : 4 * W));
	ap_kir_bulk_copy(k, &s->body, tile, ap_kir_muli(k, stage_of(k, i), W), x,
			 ap_kir_muli(k, ap_kir_add(k, ap_kir_muli(k, blk, CHUNKS), ap_kir_ref(k, i)), W), 4 * W, full,
			 stage_of(k, i));
	/* the consumer warps */
	arm = ap_kir_arm(k, roles, 0, W, 32, 0);
	ck_assert_ptr_nonnull(arm);
	acc = ap_kir_var_new(k, AP_DT_F32, "acc");
	ap_kir_let(k, &arm->body, acc, ap_kir_float(k, AP_DT_F32, 0));
	i = ap_kir_var_new(k, AP_DT_I64, "j");
	loop = ap_kir_for(k, &arm->body, i, I(k, 0), I(k, CHUNKS), 1);
	ap_kir_mbar_wait(k, &loop->body, full, stage_of(k, i),
			 bug == ROLES_PARITY ? ap_kir_binary(k, AP_KIR_XOR, parity_of(k, i), I(k, 1)) : parity_of(k, i));
	ap_kir_assign(k, &loop->body, acc,
		      ap_kir_binary(k, AP_KIR_ADD, ap_kir_ref(k, acc),
				    ap_kir_load(k, tile, ap_kir_add(k, ap_kir_muli(k, stage_of(k, i), W),
								   ap_kir_binary(k, AP_KIR_REM, ap_kir_addi(k, tid, 1),
										 I(k, W))))));
	if (bug != ROLES_NOARRIVE)
		ap_kir_mbar_arrive(k, &loop->body, empty, stage_of(k, i), NULL);
	ap_kir_store(k, &arm->body, out, ap_kir_add(k, ap_kir_muli(k, blk, W), tid), ap_kir_ref(k, acc));
	ck_assert_msg(!ap_kir_failed(k), "roles_ring failed to build");
	return k;
}

static void *load(const char *src)
{
	char path[] = "/tmp/check_roles_XXXXXX";
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

/* Runs roles_kernel(bug) on the host (checking mode when check), x[e] = e
 * mod 97.  Returns the checker's count of violations (0 plain); *fault the
 * object's ap_host_fault after the run; the sums compared with a float64
 * reference when ok_values. */
static unsigned run_roles(roles_bug bug, bool check, bool ok_values, int *fault, char *msg, size_t cap)
{
	ap_kir_kernel *k = roles_kernel(bug);
	ap_error err;
	char *src;
	void *h, *args[2], *sym;
	float x[2 * CHUNKS * W], out[2 * W];
	unsigned long long ext[2] = { sizeof(x), sizeof(out) };
	unsigned n = 0;
	int *fp;
	host_fn f;

	ck_assert_msg(ap_kir_verify(k, NULL, &err) == 0, "%s", err.msg);
	src = ap_kir_print(k, check ? AP_KIR_HOST_CHECK : AP_KIR_HOST, &err);
	ck_assert_msg(src != NULL, "%s", err.msg);
	if (getenv("CHECK_ROLES_DUMP"))   /* the printed host kernel, for reading */
		fputs(src, stdout);
	h = load(src);
	if (check) {
		const ap_hcheck_ops **rt = dlsym(h, "ap_check_rt");

		ck_assert_ptr_nonnull(rt);
		*rt = ap_hostcheck_ops();
	}
	fp = dlsym(h, "ap_host_fault");
	ck_assert_ptr_nonnull(fp);
	for (int e = 0; e < 2 * CHUNKS * W; e++)
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
	*fault = *fp;
	for (int b = 0; ok_values && b < 2; b++)
		for (int t = 0; t < W; t++) {
			double want = 0;

			for (int c = 0; c < CHUNKS; c++)
				want += (double)x[(b * CHUNKS + c) * W + (t + 1) % W];
			ck_assert_msg(out[b * W + t] == (float)want, "block %d thread %d: %g, want %g", b, t,
				      out[b * W + t], want);
		}
	dlclose(h);
	free(src);
	ap_kir_kernel_free(k);
	return n;
}

/* The plain host: the ring gives the sums; a missing release or a short
 * expect_tx deadlocks, which the kernel reports through ap_host_fault
 * instead of hanging. */
START_TEST(ring_plain)
{
	char msg[2048];
	int fault = -1;

	ck_assert_uint_eq(run_roles(ROLES_OK, false, true, &fault, msg, sizeof(msg)), 0);
	ck_assert_int_eq(fault, 0);
	run_roles(ROLES_NOARRIVE, false, false, &fault, msg, sizeof(msg));
	ck_assert_int_eq(fault, 1);
	run_roles(ROLES_TXSHORT, false, false, &fault, msg, sizeof(msg));
	ck_assert_int_eq(fault, 1);
}
END_TEST

/* The checking mode: the ring clean and exact; each bug named. */
START_TEST(ring_checked)
{
	char msg[2048];
	int fault = -1;

	ck_assert_msg(run_roles(ROLES_OK, true, true, &fault, msg, sizeof(msg)) == 0, "%s", msg);
	ck_assert_int_eq(fault, 0);
	ck_assert_uint_gt(run_roles(ROLES_NOARRIVE, true, false, &fault, msg, sizeof(msg)), 0);
	ck_assert_msg(strstr(msg, "deadlock") && strstr(msg, "threads 64..95"), "no release: %s", msg);
	ck_assert_int_eq(fault, 1);
	ck_assert_uint_gt(run_roles(ROLES_TXSHORT, true, false, &fault, msg, sizeof(msg)), 0);
	ck_assert_msg(strstr(msg, "deadlock") && strstr(msg, "-16 tx byte"), "short expect_tx: %s", msg);
	ck_assert_uint_gt(run_roles(ROLES_PARITY, true, false, &fault, msg, sizeof(msg)), 0);
	ck_assert_msg(strstr(msg, "before the bulk copy"), "wrong parity: %s", msg);
	ck_assert_uint_gt(run_roles(ROLES_NOEMPTYWAIT, true, false, &fault, msg, sizeof(msg)), 0);
	ck_assert_msg(strstr(msg, "data race") || strstr(msg, "while a bulk copy"), "stage reused: %s", msg);
	printf("check_roles: stage refilled without the empty wait: %.300s\n", msg);
}
END_TEST

/* CUDA: the arms as an if / else if chain, setmaxnreg where asked;
 * NVRTC and ptxas take it for sm_90a. */
START_TEST(ring_cuda)
{
	ap_kir_kernel *k = roles_kernel(ROLES_OK);
	ap_error err;
	char *cuda = ap_kir_print(k, AP_KIR_CUDA, &err);

	ck_assert_msg(cuda != NULL, "%s", err.msg);
	ck_assert_ptr_nonnull(strstr(cuda, "if (ap_role_t >= 64u && ap_role_t < 96u)"));
	ck_assert_ptr_nonnull(strstr(cuda, "} else if (ap_role_t >= 0u && ap_role_t < 64u)"));
	ck_assert_ptr_nonnull(strstr(cuda, "mbarrier.try_wait.parity"));
	if (ap_nvrtc_load(&err) == 0) {
		uint8_t *bin = NULL;
		size_t len = 0;

		ck_assert_msg(ap_nvrtc_compile(cuda, k->name, "sm_90a", true, &bin, &len, &err) == 0, "ptxas: %s",
			      err.msg);
		ck_assert_uint_gt(len, 0);
		free(bin);
	} else {
		printf("SKIP NVRTC compile of roles_ring: %s\n", err.msg);
	}
	free(cuda);
	ap_kir_kernel_free(k);
}
END_TEST

/* Rule role: each refusal by its reason. */
START_TEST(rule_role)
{
	ap_kir_kernel *k;
	ap_kir_stmt *roles, *arm;
	ap_error err;

#define REFUSED(what)                                                                                        \
	do {                                                                                                 \
		ck_assert_int_ne(ap_kir_verify(k, NULL, &err), 0);                                           \
		ck_assert_msg(strstr(err.msg, "rule role") && strstr(err.msg, what), "%s", err.msg);        \
		ap_kir_kernel_free(k);                                                                       \
	} while (0)
	/* overlapping arms */
	k = ap_kir_kernel_new("r1");
	k->block[0] = 128;
	roles = ap_kir_roles(k, &k->body);
	ap_kir_arm(k, roles, 0, 64, 32, 0);
	ap_kir_arm(k, roles, 32, 128, 32, 0);
	REFUSED("overlap");
	/* an arm past the block */
	k = ap_kir_kernel_new("r2");
	k->block[0] = 64;
	roles = ap_kir_roles(k, &k->body);
	ap_kir_arm(k, roles, 0, 128, 32, 0);
	REFUSED("block of 64 threads");
	/* __syncthreads in an arm */
	k = ap_kir_kernel_new("r3");
	k->block[0] = 64;
	roles = ap_kir_roles(k, &k->body);
	arm = ap_kir_arm(k, roles, 0, 64, 32, 0);
	ap_kir_barrier(k, &arm->body);
	REFUSED("__syncthreads inside an arm");
	/* ROLES under thread-dependent control flow */
	k = ap_kir_kernel_new("r4");
	k->block[0] = 64;
	roles = ap_kir_if(k, &k->body, ap_kir_binary(k, AP_KIR_LT, ap_kir_index_of(k, AP_KIR_THREAD_X), I(k, 32)));
	roles = ap_kir_roles(k, &roles->body);
	ap_kir_arm(k, roles, 0, 64, 32, 0);
	REFUSED("thread-dependent");
	/* setmaxnreg on warps, and a count off the grid of 8 */
	k = ap_kir_kernel_new("r5");
	k->block[0] = 256;
	roles = ap_kir_roles(k, &k->body);
	ap_kir_arm(k, roles, 0, 128, 32, 40);
	REFUSED("setmaxnreg 40");
	k = ap_kir_kernel_new("r6");
	k->block[0] = 256;
	roles = ap_kir_roles(k, &k->body);
	ap_kir_arm(k, roles, 0, 128, 128, -44);
	REFUSED("setmaxnreg -44");
	/* two ROLES */
	k = ap_kir_kernel_new("r7");
	k->block[0] = 64;
	for (int r = 0; r < 2; r++) {
		roles = ap_kir_roles(k, &k->body);
		ap_kir_arm(k, roles, 0, 64, 32, 0);
	}
	REFUSED("second ROLES");
	/* the builder refuses bounds off the grain */
	k = ap_kir_kernel_new("r8");
	k->block[0] = 64;
	roles = ap_kir_roles(k, &k->body);
	ck_assert_ptr_null(ap_kir_arm(k, roles, 16, 64, 32, 0));
	ck_assert(ap_kir_failed(k));
	ap_kir_kernel_free(k);
	/* a good one passes */
	k = ap_kir_kernel_new("r9");
	k->block[0] = 384;
	roles = ap_kir_roles(k, &k->body);
	ap_kir_arm(k, roles, 256, 384, 128, -40);
	ap_kir_arm(k, roles, 0, 256, 128, 232);
	ck_assert_msg(ap_kir_verify(k, NULL, &err) == 0, "%s", err.msg);
	ap_kir_kernel_free(k);
#undef REFUSED
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("roles");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, rule_role);
	tcase_add_test(tc, ring_cuda);
	tcase_add_test(tc, ring_plain);
	tcase_add_test(tc, ring_checked);
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
