/* check_gemm.c -- the GEMM and attention kernels the compiler makes for the
 * real models, checked statically (no GPU needed):
 *   - with allow_tf32 on sm_90, every kernel the GEMM emitter built (every
 *     MatMul, Gemm and convolution with at least 8 output channels per
 *     group) holds mma.sync and ldmatrix in its PTX for compute_80 and
 *     compute_90, and cp.async where the kernel says an operand is copied
 *     so (an operand computed on the way goes through registers); in the
 *     float16 / bfloat16 graphs every such kernel has cp.async (im2col
 *     gathers included: pair-staged, see server/lower/gemm.c);
 *   - ptxas (through NVRTC, --ptxas-options=-v) reports no spill stores or
 *     loads for any GEMM or attention kernel of the default configurations,
 *     tensor-core (allow_tf32) and SIMT alike, on sm_90;
 *   - the depthwise emitter builds the convolutions of ppocr_mobile_v2_cls
 *     that the default fusion level leaves on their own (those followed by
 *     a global pooling are Layer I's), for the host and sm_90 alike, and
 *     ptxas reports no spills for any depthwise kernel of the models on
 *     sm_80 and sm_90.
 * With directories as arguments (tests/precision.sh passes the float16 and
 * bfloat16 versions of the models), those are checked instead, tensor
 * cores expected without --allow-tf32, and built for sm_90a too: every
 * GEMM kernel (products, convolutions) and tensor-core attention kernel
 * holds wgmma in its PTX and ptxas reports no spills for it (the float16 graphs; the bfloat16 ones too
 * under APOLLO_SWEEP=full).  Skipped (with a message) when
 * NVRTC cannot be loaded.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/tool.h"
#include "common/graph.h"
#include "server/backend/backend.h"
#include "server/plan/program.h"
#include "tests/lib/require.h"
#include "tests/lib/sweep.h"

#define TESTDATA "../shared/testdata"

static const char *const dirs[] = {
	"models/bert_like_2l", "models/mlp_gelu_ln", "models/ppocr_mobile_v2_cls",
	"models/silero_vad_op18_ifless", "models/squeezenet1_1", "training/mlp_residual_train",
	"training/prenorm_layer_train", "training/small_convnet_train",
};

/* argv's directories, when given (absolute or relative paths) */
static char **arg_dirs;
static int n_arg_dirs;

static ap_graph *import_dir(const char *dir)
{
	char path[1024], set[1024];
	uint8_t *buf = NULL;
	size_t len = 0;
	ap_host_tensor **ins = NULL;
	int n_in = 0;
	ap_params *params = NULL;
	ap_graph *g;
	ap_error err;

	snprintf(path, sizeof(path), "%s/model.onnx", dir);
	snprintf(set, sizeof(set), "%s/test_data_set_0", dir);
	if (ap_file_read(path, (size_t)1 << 30, &buf, &len, &err) < 0 ||
	    ap_testdata_load(set, "input", &ins, &n_in, &err) < 0)
		return NULL;
	g = ap_onnx_import(buf, len, (const ap_host_tensor *const *)ins, n_in, &params, &err);
	for (int i = 0; i < n_in; i++)
		ap_host_tensor_free(ins[i]);
	free(ins);
	ap_params_free(params);
	free(buf);
	return g;
}

/* Whether the kernel's header says an operand is copied by cp.async. */
static bool says_async(const ap_kernel_src *k)
{
	static const char *const said[] = {"operand A: cp.async", "operand B: cp.async", "operand Q: cp.async",
					   "operand K: cp.async", "operand V: cp.async"};

	for (size_t i = 0; i < sizeof(said) / sizeof(said[0]); i++)
		if (strstr(k->src, said[i]))
			return true;
	return false;
}

static bool emitter_is(const ap_kernel_src *k, const char *name)
{
	char key[64];

	snprintf(key, sizeof(key), "emitter %s:", name);
	return strstr(k->src, key) != NULL;
}

/* Launches of p whose kernel the emitter `name` built. */
static int count_launches(const ap_program *p, const char *name)
{
	int n = 0;

	for (int l = 0; l < p->n_launches; l++)
		n += emitter_is(&p->kernels[p->launches[l].kernel], name);
	return n;
}

/* One model at one setting: counts GEMM kernels, checks what it should. */
static void check_model(const char *dir, bool tf32, bool all_async, int *n_gemm, int *n_async,
			int *n_prologue, int *n_splitk, int *n_spill_checked, int *n_att)
{
	ap_build_options o = {.target = "sm_90", .allow_tf32 = tf32};
	ap_error err;
	ap_graph *g = import_dir(dir);
	ap_program *p;

	ck_assert_msg(g != NULL, "%s: import failed", dir);
	p = ap_program_build(g, &o, &err);
	ck_assert_msg(p != NULL, "%s: build: %s", dir, err.msg);
	for (int i = 0; i < p->n_kernels; i++) {
		const ap_kernel_src *k = &p->kernels[i];
		bool gemm = emitter_is(k, "gemm"), att = emitter_is(k, "attention");
		bool dw = emitter_is(k, "depthwise");
		uint8_t *out = NULL;
		size_t len = 0;
		ap_ptxas_stats st;

		if (dw) {
			/* its kernel text is the same at both settings: sm_80 here */
			ck_assert_msg(ap_nvrtc_ptxas_stats(k->src, k->name, "sm_80", &st, &err) == 0, "%s %s: %s",
				      dir, k->name, err.msg);
			ck_assert_msg(st.spill_store_bytes == 0 && st.spill_load_bytes == 0,
				      "%s: depthwise kernel %s spills %d / %d bytes on sm_80 (%d registers)", dir,
				      k->name, st.spill_store_bytes, st.spill_load_bytes, st.registers);
			(*n_spill_checked)++;
		}
		if (!gemm && !att && !dw)
			continue;
		if (gemm && tf32) {
			static const char *const archs[] = {"compute_80", "compute_90"};

			/* split-K kernels are thread-block clusters: sm_90 and later */
			for (int a = strstr(k->src, "__cluster_dims__") ? 1 : 0; a < 2; a++) {
				ck_assert_msg(ap_nvrtc_compile(k->src, k->name, archs[a], false, &out, &len, &err) == 0,
					      "%s %s: %s", dir, k->name, err.msg);
				ck_assert_msg(strstr((char *)out, "mma.sync.aligned") && strstr((char *)out, "ldmatrix") &&
					      (!says_async(k) || strstr((char *)out, "cp.async")),
					      "%s: kernel %s (%s) lacks mma.sync, ldmatrix or cp.async in its PTX", dir,
					      k->name, archs[a]);
				/* 16-bit (and TF32): every operand read from memory as it
				 * is, or as a Cast of a float32 buffer, is copied (other
				 * prologues are computed on the way); every kernel
				 * copies one operand at least (the "every launch
				 * contains cp.async") */
				ck_assert_msg(!all_async || !strstr(k->src, "(no cp.async here)"),
					      "%s: kernel %s stages an operand through registers", dir, k->name);
				ck_assert_msg(!all_async || says_async(k),
					      "%s: kernel %s copies no operand by cp.async", dir, k->name);
				free(out);
			}
			(*n_gemm)++;
			*n_splitk += strstr(k->src, "__cluster_dims__") != NULL;
			*n_async += says_async(k);
			*n_prologue += !says_async(k);
		}
		if (att && all_async) {
			/* 16-bit graphs, and float32 ones with allow_tf32: the
			 * tensor-core form, K and V copied by cp.async */
			static const char *const archs[] = {"compute_80", "compute_90"};

			for (int a = 0; a < 2; a++) {
				ck_assert_msg(ap_nvrtc_compile(k->src, k->name, archs[a], false, &out, &len, &err) == 0,
					      "%s %s: %s", dir, k->name, err.msg);
				ck_assert_msg(strstr((char *)out, "mma.sync.aligned.m16n8k") &&
					      strstr((char *)out, "ldmatrix") && strstr((char *)out, "cp.async"),
					      "%s: attention kernel %s (%s) lacks mma.sync, ldmatrix or cp.async", dir,
					      k->name, archs[a]);
				free(out);
			}
			ck_assert_msg(strstr(k->src, "operand K: cp.async") && strstr(k->src, "operand V: cp.async"),
				      "%s: attention kernel %s stages K or V through registers", dir, k->name);
			(*n_att)++;
		}
		ck_assert_msg(ap_nvrtc_ptxas_stats(k->src, k->name, "sm_90", &st, &err) == 0, "%s %s: %s", dir,
			      k->name, err.msg);
		ck_assert_msg(st.spill_store_bytes == 0 && st.spill_load_bytes == 0,
			      "%s: kernel %s (%s) spills %d / %d bytes (%d registers)", dir, k->name,
			      tf32 ? "tensor cores" : "SIMT", st.spill_store_bytes, st.spill_load_bytes, st.registers);
		(*n_spill_checked)++;
	}
	ap_program_free(p);
	ap_graph_free(g);
}

/* A 16-bit model built for sm_90a: every GEMM kernel (products and
 * convolutions) and every tensor-core attention kernel holds wgmma in
 * its PTX, and ptxas reports no spills for it; *n_wg counts the GEMM
 * kernels, *n_att the attention ones.  With `unvalidated` the forms not
 * yet run on a GPU (--unvalidated: the warp-specialised ones) are built
 * and checked alike, and *n_ws counts the kernels with a producer arm. */
static void check_model_wgmma(const char *dir, bool unvalidated, int *n_wg, int *n_att, int *n_ws)
{
	ap_build_options o = {.target = "sm_90a", .unvalidated = unvalidated};
	ap_error err;
	ap_graph *g = import_dir(dir);
	ap_program *p;

	ck_assert_msg(g != NULL, "%s: import failed", dir);
	p = ap_program_build(g, &o, &err);
	ck_assert_msg(p != NULL, "%s: build for sm_90a: %s", dir, err.msg);
	for (int i = 0; i < p->n_kernels; i++) {
		const ap_kernel_src *k = &p->kernels[i];
		uint8_t *out = NULL;
		size_t len = 0;
		ap_ptxas_stats st;

		bool att = emitter_is(k, "attention");

		if (!emitter_is(k, "gemm") && !att)
			continue;
		ck_assert_msg(ap_nvrtc_compile(k->src, k->name, "sm_90a", false, &out, &len, &err) == 0, "%s %s: %s",
			      dir, k->name, err.msg);
		ck_assert_msg(strstr((char *)out, "wgmma.mma_async.sync.aligned"), "%s: kernel %s lacks wgmma on sm_90a",
			      dir, k->name);
		free(out);
		ck_assert_msg(ap_nvrtc_ptxas_stats(k->src, k->name, "sm_90a", &st, &err) == 0, "%s %s: %s", dir,
			      k->name, err.msg);
		ck_assert_msg(st.spill_store_bytes == 0 && st.spill_load_bytes == 0,
			      "%s: wgmma kernel %s%s spills %d / %d bytes (%d registers)", dir, k->name,
			      unvalidated ? " (--unvalidated)" : "", st.spill_store_bytes, st.spill_load_bytes, st.registers);
		if (n_ws && strstr(k->src, "/* arm: groups of 128 threads */"))
			(*n_ws)++;
		if (att)
			(*n_att)++;
		else
			(*n_wg)++;
	}
	ap_program_free(p);
	ap_graph_free(g);
}

START_TEST(models_tensor_cores_and_spills)
{
	ap_error err;
	int n_gemm = 0, n_async = 0, n_prologue = 0, n_splitk = 0, n_spill = 0, n_att = 0, n_wg = 0, n_att_wg = 0;
	int n_ws = 0, n_ws_models = 0;
	char dir[512];

	if (ap_nvrtc_load(&err) != 0) {
		AP_SKIP("nvrtc", "check_gemm: NVRTC not loaded, skipped (%s)", err.msg);
		return;
	}
	for (int d = 0; d < n_arg_dirs; d++) {
		/* 16-bit graphs: tensor cores whatever allow_tf32 says; on
		 * sm_90a by wgmma */
		check_model(arg_dirs[d], true, true, &n_gemm, &n_async, &n_prologue, &n_splitk, &n_spill, &n_att);
		/* sm_90a: the float16 graphs (about a minute of NVRTC and ptxas);
		 * the bfloat16 ones, the same kernels in another type, under
		 * APOLLO_SWEEP=full */
		if (!strstr(arg_dirs[d], "bfloat16__") || ap_sweep_stride() == 1)
			check_model_wgmma(arg_dirs[d], false, &n_wg, &n_att_wg, NULL);
		/* and with --unvalidated: the warp-specialised forms (tma=2 and
		 * 3, the attention's tma=2) of the float16 graphs */
		if (strstr(arg_dirs[d], "float16__") && !strstr(arg_dirs[d], "bfloat16__")) {
			int w = 0, a = 0;

			check_model_wgmma(arg_dirs[d], true, &w, &a, &n_ws);
			n_ws_models++;
		}
	}
	for (size_t d = 0; d < sizeof(dirs) / sizeof(dirs[0]) && n_arg_dirs == 0; d++) {
		snprintf(dir, sizeof(dir), "%s/%s", TESTDATA, dirs[d]);
		if (access(dir, R_OK) != 0) {
			AP_SKIP("testdata", "check_gemm: %s not found, skipped", dir);
			continue;
		}
		check_model(dir, true, true, &n_gemm, &n_async, &n_prologue, &n_splitk, &n_spill, &n_att);
		check_model(dir, false, false, &n_gemm, &n_async, &n_prologue, &n_splitk, &n_spill, &n_att);
	}
	printf("check_gemm: %d tensor-core GEMM kernels with mma.sync and ldmatrix, %d of them with cp.async, "
	       "%d with both operands computed on the way (prologues), %d split-K (clusters); "
	       "%d kernels without spills; %d tensor-core attention kernels\n", n_gemm, n_async, n_prologue, n_splitk,
	       n_spill, n_att);
	if (n_arg_dirs)
		printf("check_gemm: %d GEMM and %d attention kernels built for sm_90a, each with wgmma and without "
		       "spills; with --unvalidated, %d warp-specialised kernels in %d float16 models, without spills\n",
		       n_wg, n_att_wg, n_ws, n_ws_models);
	/* every float16 model's GEMMs: warp specialised where --unvalidated */
	ck_assert_int_ge(n_ws, n_ws_models);
	ck_assert_int_gt(n_gemm, n_arg_dirs ? 2 * n_arg_dirs : 20);
	ck_assert_int_ge(n_wg, n_arg_dirs ? n_arg_dirs : 0);
	ck_assert_int_gt(n_async, n_gemm / 2);
	/* the 16-bit models with attention patterns (bert_like_2l, the prenorm
	 * training step's forward): one tensor-core kernel each at least */
	{
		int want = 0;

		int want_wg = 0;

		for (int d = 0; d < n_arg_dirs; d++) {
			bool has = strstr(arg_dirs[d], "bert_like_2l") || strstr(arg_dirs[d], "prenorm_layer_train");

			want += has;
			want_wg += has && (!strstr(arg_dirs[d], "bfloat16__") || ap_sweep_stride() == 1);
		}
		ck_assert_msg(n_att >= want, "%d tensor-core attention kernels in %d models with attention", n_att,
			      want);
		ck_assert_msg(n_att_wg >= want_wg, "%d wgmma attention kernels in %d models with attention (sm_90a)",
			      n_att_wg, want_wg);
	}
}
END_TEST

/* ppocr_mobile_v2_cls at the default fusion level: its depthwise
 * convolutions that Layer I does not stage into a global pooling (one
 * with stride (2, 1), one with stride 1, both with their BatchNorm and
 * activation epilogue) are the depthwise emitter's -- on the host and on
 * sm_90.  No NVRTC needed. */
START_TEST(ppocr_depthwise_launches)
{
	static const char *const targets[] = {"cpu", "sm_90"};
	char dir[512];
	ap_graph *g;

	snprintf(dir, sizeof(dir), "%s/models/ppocr_mobile_v2_cls", TESTDATA);
	if (access(dir, R_OK) != 0) {
		AP_SKIP("testdata", "check_gemm: %s not found, skipped", dir);
		return;
	}
	g = import_dir(dir);
	ck_assert_msg(g != NULL, "%s: import failed", dir);
	for (int i = 0; i < 2; i++) {
		ap_build_options o = {.target = targets[i]};
		ap_error err;
		ap_program *p = ap_program_build(g, &o, &err);
		int n;

		ck_assert_msg(p != NULL, "%s: build: %s", dir, err.msg);
		n = count_launches(p, "depthwise");
		printf("check_gemm: ppocr_mobile_v2_cls for %s: %d depthwise launches of %d\n", targets[i], n,
		       p->n_launches);
		ck_assert_int_ge(n, 2);
		ap_program_free(p);
	}
	ap_graph_free(g);
}
END_TEST

/* The ptxas report parser on a log as NVRTC gives it (the wgmma
 * serialisation notes come before the entries' reports). */
START_TEST(ptxas_parse)
{
	static const char log[] =
		"ptxas info    : (C7519) warpgroup.arrive is injected in around line 90 by compiler to allow use of "
		"registers in GMMA in function 'kb'\n"
		"ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
		"program dependence on compiler-inserted WG.AR in divergent path in the function 'kb'\n"
		"ptxas info    : 0 bytes gmem\n"
		"ptxas info    : Compiling entry function 'ka' for 'sm_90'\n"
		"ptxas info    : Function properties for ka\n"
		"    0 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
		"ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0]\n"
		"ptxas info    : Compiling entry function 'kb' for 'sm_90'\n"
		"ptxas info    : Function properties for kb\n"
		"    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
		"ptxas info    : Used 255 registers, used 0 barriers, 384 bytes cmem[0]\n"
		/* a name holding the words the numbers are found by */
		"ptxas info    : Compiling entry function 'k_registers_smem' for 'sm_90'\n"
		"ptxas info    : Function properties for k_registers_smem\n"
		"    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
		"ptxas info    : Used 64 registers, used 1 barriers, 8448 bytes smem, 384 bytes cmem[0]\n";
	ap_ptxas_stats s;

	ck_assert(ap_ptxas_parse(log, "ka", &s));
	ck_assert_int_eq(s.registers, 40);
	ck_assert_int_eq(s.spill_store_bytes, 8);
	ck_assert_int_eq(s.spill_load_bytes, 12);
	ck_assert_int_eq(s.shared_bytes, 2048);
	ck_assert(!s.wgmma_serialized);
	ck_assert(ap_ptxas_parse(log, "kb", &s));
	ck_assert(s.wgmma_serialized);   /* C7520 names it */
	ck_assert_int_eq(s.registers, 255);
	ck_assert_int_eq(s.spill_store_bytes, 0);
	ck_assert_int_eq(s.shared_bytes, 0);
	ck_assert(ap_ptxas_parse(log, "k_registers_smem", &s));
	ck_assert_int_eq(s.registers, 64);
	ck_assert_int_eq(s.shared_bytes, 8448);
	ck_assert(!ap_ptxas_parse(log, "kc", &s));
}
END_TEST

int main(int argc, char **argv)
{
	Suite *s = suite_create("gemm");
	TCase *tc = tcase_create("static");
	SRunner *sr;
	int failed;

	arg_dirs = argv + 1;
	n_arg_dirs = argc - 1;
	tcase_set_timeout(tc, 1800);
	tcase_add_test(tc, ptxas_parse);
	tcase_add_test(tc, ppocr_depthwise_launches);
	tcase_add_test(tc, models_tensor_cores_and_spills);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
