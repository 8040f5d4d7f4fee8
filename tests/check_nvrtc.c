/* check_nvrtc.c -- the NVRTC backend (server/backend/nvrtc.c): CUDA C to
 * PTX (compute_80, sm_90 asked for PTX) and cubin (sm_80, sm_90), compile
 * errors with the log, architectures refused, the thread's locale kept,
 * concurrent compiles, the toolkit's <cuda_fp16.h> / <cuda_bf16.h> found.  No GPU is needed, only libnvrtc; where it cannot be
 * loaded every test prints why and is skipped. */
#include <check.h>
#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/backend/backend.h"
#include "tests/lib/require.h"

static const char add_relu[] =
	"extern \"C\" __global__ void add_relu(const float *x, const float *y, float *out)\n"
	"{\n"
	"	unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
	"	if (i < 32) {\n"
	"		float v = x[i] + y[i];\n"
	"		out[i] = v > 0.0f ? v : 0.0f;\n"
	"	}\n"
	"}\n";

/* True when NVRTC is there; otherwise prints why the test is skipped. */
static bool have_nvrtc(const char *test)
{
	ap_error err;

	if (ap_nvrtc_load(&err) == 0)
		return true;
	AP_SKIP("nvrtc", "SKIP %s: NVRTC cannot be loaded: %s", test, err.msg);
	return false;
}

START_TEST(load_and_version)
{
	const char *v;
	int major = 0, minor = -1;

	if (!have_nvrtc("load_and_version"))
		return;
	ck_assert_int_eq(ap_nvrtc_load(NULL), 0);   /* idempotent */
	v = ap_nvrtc_version();
	ck_assert_ptr_nonnull(v);
	ck_assert_int_eq(sscanf(v, "%d.%d", &major, &minor), 2);
	ck_assert_int_ge(major, 11);
	ck_assert_int_ge(minor, 0);
}
END_TEST

START_TEST(ptx_compute_80)
{
	uint8_t *out = NULL;
	size_t len = 0;
	ap_error err;

	if (!have_nvrtc("ptx_compute_80"))
		return;
	ck_assert_msg(ap_nvrtc_compile(add_relu, "add_relu.cu", "compute_80", false, &out, &len,
				       &err) == 0, "%s", err.msg);
	ck_assert_uint_gt(len, 100);
	ck_assert_uint_eq(out[len - 1], 0);              /* NUL-terminated, inside the blob */
	ck_assert_uint_eq(strlen((char *)out), len - 1);
	ck_assert_ptr_nonnull(strstr((char *)out, ".target sm_80"));
	ck_assert_ptr_nonnull(strstr((char *)out, ".entry add_relu"));
	free(out);
}
END_TEST

START_TEST(ptx_for_sm_90)
{
	uint8_t *out = NULL;
	size_t len = 0;
	ap_error err;

	if (!have_nvrtc("ptx_for_sm_90"))
		return;
	ck_assert_msg(ap_nvrtc_compile(add_relu, "k.cu", "sm_90", false, &out, &len, &err) == 0,
		      "%s", err.msg);
	ck_assert_ptr_nonnull(strstr((char *)out, ".target sm_90"));
	free(out);
}
END_TEST

/* The include directory holds cuda_fp16.h and a kernel using __half and
 * __nv_bfloat16 compiles. */
START_TEST(fp16_headers_found)
{
	static const char src[] =
		"#include <cuda_fp16.h>\n"
		"#include <cuda_bf16.h>\n"
		"extern \"C\" __global__ void h(__half *x, __nv_bfloat16 *y)\n"
		"{\n"
		"	x[threadIdx.x] = __float2half_rn(__half2float(x[threadIdx.x]) * 2.0f);\n"
		"	y[threadIdx.x] = __float2bfloat16_rn(__bfloat162float(y[threadIdx.x]) + 1.0f);\n"
		"}\n";
	const char *dir, *home = getenv("CUDA_HOME");
	char probe[4096];
	uint8_t *out = NULL;
	size_t len = 0;
	ap_error err;

	if (!have_nvrtc("fp16_headers_found"))
		return;
	dir = ap_nvrtc_include_dir();
	snprintf(probe, sizeof(probe), "%s/include/cuda_fp16.h", home && *home ? home : "/usr/local/cuda");
	if (!dir) {
		/* only acceptable when no toolkit header is there to find */
		ck_assert_msg(access(probe, R_OK) != 0, "%s exists but was not found", probe);
		AP_SKIP("nvrtc", "SKIP fp16_headers_found: no cuda_fp16.h next to NVRTC, in $CUDA_HOME/include "
			"or in .venv");
		return;
	}
	snprintf(probe, sizeof(probe), "%s/cuda_bf16.h", dir);
	ck_assert_msg(access(probe, R_OK) == 0, "%s", probe);
	ck_assert_msg(ap_nvrtc_compile(src, "h.cu", "compute_80", false, &out, &len, &err) == 0, "%s",
		      err.msg);
	ck_assert_ptr_nonnull(strstr((char *)out, ".entry h"));
	free(out);
}
END_TEST

static void check_cubin(const char *arch)
{
	uint8_t *out = NULL;
	size_t len = 0;
	ap_error err;

	ck_assert_msg(ap_nvrtc_compile(add_relu, "add_relu.cu", arch, true, &out, &len, &err) == 0,
		      "%s: %s", arch, err.msg);
	ck_assert_uint_gt(len, 64);
	ck_assert_int_eq(memcmp(out, "\x7f" "ELF", 4), 0);
	/* The entry point's name is in the ELF string table. */
	ck_assert_ptr_nonnull(memmem(out, len, "add_relu", 8));
	free(out);
}

START_TEST(cubin_sm_80_and_sm_90)
{
	if (!have_nvrtc("cubin_sm_80_and_sm_90"))
		return;
	check_cubin("sm_80");
	check_cubin("sm_90");
	check_cubin("sm_90a");
}
END_TEST

START_TEST(syntax_error_gives_log)
{
	const char bad[] = "extern \"C\" __global__ void broken(float *x) { x[0] = ; }\n";
	uint8_t *out = (uint8_t *)"sentinel";
	size_t len = 99;
	ap_error err;

	if (!have_nvrtc("syntax_error_gives_log"))
		return;
	ck_assert_int_eq(ap_nvrtc_compile(bad, "broken.cu", "sm_80", true, &out, &len, &err),
			 AP_ECOMPILE);
	ck_assert_int_eq(err.code, AP_ECOMPILE);
	ck_assert_ptr_null(out);
	ck_assert_uint_eq(len, 0);
	ck_assert_msg(strstr(err.msg, "error") != NULL, "no log in '%s'", err.msg);
	ck_assert_msg(strstr(err.msg, "broken.cu") != NULL, "log does not name the file: '%s'",
		      err.msg);
}
END_TEST

START_TEST(architectures_refused)
{
	static const struct {
		const char *arch;
		bool cubin;
	} rows[] = {
		{ "compute_80", true },  /* cubin needs a real architecture */
		{ "sm_9", true },
		{ "sm_90ab", true },
		{ "gfx90a", false },
		{ "", false },
		{ "sm_12", true },       /* well formed, but no NVRTC knows it */
	};

	if (!have_nvrtc("architectures_refused"))
		return;
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		uint8_t *out = NULL;
		size_t len = 0;
		ap_error err;
		int rc = ap_nvrtc_compile(add_relu, "k.cu", rows[i].arch, rows[i].cubin, &out, &len,
					  &err);
		ck_assert_msg(rc == AP_EUNSUPPORTED, "arch '%s': rc %d (%s)", rows[i].arch, rc,
			      rc ? err.msg : "");
		ck_assert_ptr_null(out);
	}
}
END_TEST

/* The calling thread's locale object and the global locale are the same
 * after a compile as before, and "%f" still prints a point. */
START_TEST(locale_preserved)
{
	const char *names[] = { "C.UTF-8", "C.utf8", "POSIX", "C" };
	locale_t mine = (locale_t)0;
	char global_before[256], num[32];
	uint8_t *out = NULL;
	size_t len = 0;
	ap_error err;

	if (!have_nvrtc("locale_preserved"))
		return;
	for (size_t i = 0; i < 4 && !mine; i++)
		mine = newlocale(LC_ALL_MASK, names[i], (locale_t)0);
	ck_assert(mine != (locale_t)0);
	snprintf(global_before, sizeof(global_before), "%s", setlocale(LC_ALL, NULL));
	uselocale(mine);
	ck_assert_int_eq(ap_nvrtc_compile(add_relu, "k.cu", "compute_80", false, &out, &len, &err), 0);
	free(out);
	ck_assert(uselocale((locale_t)0) == mine);
	ck_assert_str_eq(setlocale(LC_ALL, NULL), global_before);
	snprintf(num, sizeof(num), "%.2f", 1.25);
	ck_assert_str_eq(num, "1.25");
	uselocale(LC_GLOBAL_LOCALE);
	freelocale(mine);

	/* A thread on the global locale stays on it. */
	ck_assert_int_eq(ap_nvrtc_compile(add_relu, "k.cu", "compute_80", false, &out, &len, &err), 0);
	free(out);
	ck_assert(uselocale((locale_t)0) == LC_GLOBAL_LOCALE);
}
END_TEST

struct compile_job {
	const char *arch;
	int rc;
	size_t len;
};

static void *compile_thread(void *arg)
{
	struct compile_job *j = arg;
	uint8_t *out = NULL;
	ap_error err;

	j->rc = ap_nvrtc_compile(add_relu, "k.cu", j->arch, j->arch[0] == 's', &out, &j->len, &err);
	free(out);
	return NULL;
}

START_TEST(concurrent_compiles)
{
	struct compile_job jobs[4] = { { "sm_80", -1, 0 }, { "sm_90", -1, 0 },
				       { "compute_80", -1, 0 }, { "sm_80", -1, 0 } };
	pthread_t t[4];

	if (!have_nvrtc("concurrent_compiles"))
		return;
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, compile_thread, &jobs[i]), 0);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(jobs[i].rc, 0);
		ck_assert_uint_gt(jobs[i].len, 64);
	}
	ck_assert_uint_eq(jobs[0].len, jobs[3].len);
}
END_TEST

/* $APOLLO_NVRTC names the only library tried; one that cannot be loaded
 * leaves GPU compiles refused with a message naming it.  (The load happens
 * once per process: this needs check's default fork mode.) */
START_TEST(explicit_path_not_loadable)
{
	const char *fork_mode = getenv("CK_FORK");
	uint8_t *out = NULL;
	size_t len = 0;
	ap_error err;

	if (fork_mode && !strcmp(fork_mode, "no")) {
		printf("SKIP explicit_path_not_loadable: needs CK_FORK=yes\n");
		return;
	}
	setenv("APOLLO_NVRTC", "/nonexistent/libnvrtc.so.13", 1);
	ck_assert_int_eq(ap_nvrtc_load(&err), AP_EUNSUPPORTED);
	ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/libnvrtc.so.13"));
	ck_assert_ptr_null(ap_nvrtc_version());
	ck_assert_int_eq(ap_nvrtc_compile(add_relu, "k.cu", "sm_80", true, &out, &len, &err),
			 AP_EUNSUPPORTED);
	ck_assert_ptr_null(out);
	ck_assert_ptr_nonnull(strstr(err.msg, "NVRTC"));
}
END_TEST

static Suite *nvrtc_suite(void)
{
	Suite *s = suite_create("nvrtc");
	TCase *tc = tcase_create("nvrtc");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, load_and_version);
	tcase_add_test(tc, ptx_compute_80);
	tcase_add_test(tc, ptx_for_sm_90);
	tcase_add_test(tc, fp16_headers_found);
	tcase_add_test(tc, cubin_sm_80_and_sm_90);
	tcase_add_test(tc, syntax_error_gives_log);
	tcase_add_test(tc, architectures_refused);
	tcase_add_test(tc, locale_preserved);
	tcase_add_test(tc, concurrent_compiles);
	tcase_add_test(tc, explicit_path_not_loadable);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(nvrtc_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
