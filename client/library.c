/* library.c -- library launches (library.h): checking a bundle's
 * LibraryCall, and running it through a dlopen'ed cuBLASLt.
 *
 * cuBLASLt's API is declared here, not included: its prototypes and the
 * enum values used are facts from NVIDIA's cuBLASLt documentation (cuBLAS
 * Library User Guide, "Using the cuBLASLt API"; CUDA 12/13):
 *   cublasStatus_t: SUCCESS 0, NOT_INITIALIZED 1, ALLOC_FAILED 3,
 *     INVALID_VALUE 7, ARCH_MISMATCH 8, EXECUTION_FAILED 13,
 *     INTERNAL_ERROR 14, NOT_SUPPORTED 15;
 *   cudaDataType_t: CUDA_R_32F 0, CUDA_R_16F 2, CUDA_R_16BF 14;
 *   cublasComputeType_t: CUBLAS_COMPUTE_32F 68, CUBLAS_COMPUTE_32F_FAST_TF32 77;
 *   cublasOperation_t: CUBLAS_OP_N 0, CUBLAS_OP_T 1;
 *   cublasLtMatmulDescAttributes_t: TRANSA 3, TRANSB 4, EPILOGUE 7,
 *     BIAS_POINTER 8, BIAS_DATA_TYPE 26;
 *   cublasLtMatrixLayoutAttribute_t: BATCH_COUNT 5 (int32),
 *     STRIDED_BATCH_OFFSET 6 (int64, elements);
 *   cublasLtMatmulPreferenceAttributes_t: MAX_WORKSPACE_BYTES 1 (uint64);
 *   cublasLtEpilogue_t: the numbers apollo.LibraryEpilogue carries;
 *   cublasLtMatmulAlgo_t: 8 uint64; cublasLtMatmulHeuristicResult_t: the
 *     algo, size_t workspaceSize, cublasStatus_t state, float wavesCount,
 *     int reserved[4].
 * Matrices are column-major (CUBLASLT_ORDER_COL, the layout default).
 */
#include "library.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/graph.h"

/* ---- checking ------------------------------------------------------------------- */

static bool lib_float_type(int t)
{
	return t == APOLLO__DATA_TYPE__DT_FLOAT || t == APOLLO__DATA_TYPE__DT_FLOAT16 ||
	       t == APOLLO__DATA_TYPE__DT_BFLOAT16;
}

static bool epi_known(int e)
{
	switch (e) {
	case APOLLO__LIBRARY_EPILOGUE__LIB_EPI_UNSET:
	case APOLLO__LIBRARY_EPILOGUE__LIB_EPI_NONE:
	case APOLLO__LIBRARY_EPILOGUE__LIB_EPI_RELU:
	case APOLLO__LIBRARY_EPILOGUE__LIB_EPI_BIAS:
	case APOLLO__LIBRARY_EPILOGUE__LIB_EPI_BIAS_RELU:
	case APOLLO__LIBRARY_EPILOGUE__LIB_EPI_GELU:
	case APOLLO__LIBRARY_EPILOGUE__LIB_EPI_BIAS_GELU:
		return true;
	default:
		return false;
	}
}

static bool epi_bias(int e) { return epi_known(e) && (e & 4); }

uint64_t ap_library_workspace_end(const Apollo__Launch *la)
{
	const Apollo__LibraryCall *lc = la ? la->library : NULL;

	if (!lc || !lc->workspace_bytes)
		return 0;
	if (lc->workspace_offset > UINT64_MAX - lc->workspace_bytes)
		return UINT64_MAX;
	return lc->workspace_offset + lc->workspace_bytes;
}

/* One operand: rows x cols row-major with leading dimension ld, `batch`
 * copies stride elements apart, in arg `arg` of dtype `type`. */
static int check_operand(const Apollo__Bundle *b, size_t l, const Apollo__Launch *la,
			 const char *what, uint32_t arg, int type, uint64_t rows, uint64_t cols,
			 uint64_t ld, uint64_t stride, uint64_t batch, ap_error *err)
{
	const char *kn = b->kernels[la->kernel]->name;
	const Apollo__Buffer *bf;
	size_t es = ap_dtype_size((ap_dtype)type);
	/* every term below is < 2^32 * 2^32 at most: computed in long double
	 * where it could exceed 2^64, then compared */
	long double last;

	if (arg >= la->n_args)
		return ap_error_set(err, AP_EINVAL, kn, NULL,
				    "launch %zu (library call): %s is argument %u of %zu", l, what,
				    arg, la->n_args);
	bf = b->buffers[la->args[arg]];
	if ((int)bf->dtype != type)
		return ap_error_set(err, AP_EINVAL, kn, bf->name,
				    "launch %zu (library call): %s is %s but buffer '%s' is %s", l,
				    what, ap_dtype_name((ap_dtype)type), bf->name,
				    ap_dtype_name((ap_dtype)bf->dtype));
	if (ld < cols)
		return ap_error_set(err, AP_EINVAL, kn, bf->name,
				    "launch %zu (library call): %s has rows of %llu elements but a "
				    "leading dimension of %llu", l, what, (unsigned long long)cols,
				    (unsigned long long)ld);
	last = ((long double)batch - 1) * (long double)stride +
	       ((long double)rows - 1) * (long double)ld + (long double)cols;
	if (last * (long double)es > (long double)la->arg_bytes[arg])
		return ap_error_set(err, AP_EINVAL, kn, bf->name,
				    "launch %zu (library call): %s (%llu x %llu, ld %llu, %llu "
				    "batches %llu apart) reaches byte %.0Lf of buffer '%s', past the "
				    "%llu bytes the launch may touch", l, what,
				    (unsigned long long)rows, (unsigned long long)cols,
				    (unsigned long long)ld, (unsigned long long)batch,
				    (unsigned long long)stride, last * (long double)es, bf->name,
				    (unsigned long long)la->arg_bytes[arg]);
	return 0;
}

int ap_library_check(const Apollo__Bundle *b, size_t l, ap_error *err)
{
	const Apollo__Launch *la = b->plan[l];
	const Apollo__LibraryCall *lc = la->library;
	const char *kn = b->kernels[la->kernel]->name;
	uint64_t batch;
	bool bias, beta;
	int rc;

	if (!lc)
		return 0;
	if (lc->op != APOLLO__LIBRARY_OP__LIB_MATMUL)
		return ap_error_set(err, AP_EINVAL, kn, NULL,
				    "launch %zu: library call of unknown op %d", l, (int)lc->op);
	if (!lib_float_type(lc->a_type) || lc->b_type != lc->a_type ||
	    (lc->d_type != lc->a_type && lc->d_type != APOLLO__DATA_TYPE__DT_FLOAT))
		return ap_error_set(err, AP_EINVAL, kn, NULL,
				    "launch %zu: library matmul of %s x %s -> %s (A and B: one of "
				    "float16, bfloat16, float; D: theirs or float)", l,
				    ap_dtype_name((ap_dtype)lc->a_type), ap_dtype_name((ap_dtype)lc->b_type),
				    ap_dtype_name((ap_dtype)lc->d_type));
	if (lc->compute != APOLLO__LIBRARY_COMPUTE__LIB_COMPUTE_F32 &&
	    lc->compute != APOLLO__LIBRARY_COMPUTE__LIB_COMPUTE_F32_FAST_TF32)
		return ap_error_set(err, AP_EINVAL, kn, NULL,
				    "launch %zu: library matmul with unknown compute type %d", l,
				    (int)lc->compute);
	if (!epi_known(lc->epilogue))
		return ap_error_set(err, AP_EINVAL, kn, NULL,
				    "launch %zu: library matmul with unknown epilogue %d", l,
				    (int)lc->epilogue);
	if (!lc->m || !lc->n || !lc->k)
		return ap_error_set(err, AP_EINVAL, kn, NULL,
				    "launch %zu: library matmul of %u x %u x %u (m, n, k >= 1)", l,
				    lc->m, lc->n, lc->k);
	batch = lc->batch ? lc->batch : 1;
	if (batch > INT32_MAX)   /* cuBLASLt's BATCH_COUNT is an int32 */
		return ap_error_set(err, AP_EINVAL, kn, NULL,
				    "launch %zu: library matmul of %llu batches (at most 2^31 - 1)", l,
				    (unsigned long long)batch);
	bias = epi_bias(lc->epilogue);
	beta = lc->beta != 0;
	if ((rc = check_operand(b, l, la, "A", lc->a_arg, lc->a_type, lc->trans_a ? lc->k : lc->m,
				lc->trans_a ? lc->m : lc->k, lc->lda, lc->stride_a, batch, err)) < 0 ||
	    (rc = check_operand(b, l, la, "B", lc->b_arg, lc->b_type, lc->trans_b ? lc->n : lc->k,
				lc->trans_b ? lc->k : lc->n, lc->ldb, lc->stride_b, batch, err)) < 0 ||
	    (rc = check_operand(b, l, la, "D", lc->d_arg, lc->d_type, lc->m, lc->n, lc->ldd,
				lc->stride_d, batch, err)) < 0 ||
	    (beta && (rc = check_operand(b, l, la, "C", lc->c_arg, lc->c_type, lc->m, lc->n,
					 lc->ldc, lc->stride_c, batch, err)) < 0) ||
	    (bias && (rc = check_operand(b, l, la, "the bias", lc->bias_arg, lc->bias_type, 1,
					 lc->n, lc->n, 0, 1, err)) < 0))
		return rc;
	if (beta && lc->c_type != lc->d_type)
		return ap_error_set(err, AP_EINVAL, kn, NULL,
				    "launch %zu: library matmul with C of %s and D of %s", l,
				    ap_dtype_name((ap_dtype)lc->c_type), ap_dtype_name((ap_dtype)lc->d_type));
	if (bias && lc->bias_type != lc->d_type)
		return ap_error_set(err, AP_EINVAL, kn, NULL,
				    "launch %zu: library matmul with a bias of %s and D of %s", l,
				    ap_dtype_name((ap_dtype)lc->bias_type),
				    ap_dtype_name((ap_dtype)lc->d_type));
	{
		const Apollo__Buffer *d = b->buffers[la->args[lc->d_arg]];

		if (d->kind == APOLLO__BUFFER_KIND__BUF_INPUT || d->kind == APOLLO__BUFFER_KIND__BUF_PARAM ||
		    d->kind == APOLLO__BUFFER_KIND__BUF_CONST)
			return ap_error_set(err, AP_EINVAL, kn, d->name,
					    "launch %zu: library matmul writes D into read-only buffer '%s'",
					    l, d->name);
		if (la->args[lc->d_arg] == la->args[lc->a_arg] ||
		    la->args[lc->d_arg] == la->args[lc->b_arg] ||
		    (bias && la->args[lc->d_arg] == la->args[lc->bias_arg]))
			return ap_error_set(err, AP_EINVAL, kn, d->name,
					    "launch %zu: library matmul writes D into buffer '%s', which "
					    "it also reads as A, B or the bias", l, d->name);
	}
	if (batch > 1 && (long double)lc->stride_d < (long double)lc->m * lc->ldd)
		return ap_error_set(err, AP_EINVAL, kn, NULL,
				    "launch %zu: library matmul writes %llu batches of D %llu elements "
				    "apart, which overlap (%u rows of %u)", l, (unsigned long long)batch,
				    (unsigned long long)lc->stride_d, lc->m, lc->ldd);
	if (lc->workspace_bytes &&
	    (lc->workspace_offset > b->workspace_bytes ||
	     lc->workspace_bytes > b->workspace_bytes - lc->workspace_offset))
		return ap_error_set(err, AP_EINVAL, kn, NULL,
				    "launch %zu: library workspace [%llu, +%llu) lies outside the "
				    "%llu-byte workspace", l, (unsigned long long)lc->workspace_offset,
				    (unsigned long long)lc->workspace_bytes,
				    (unsigned long long)b->workspace_bytes);
	if (lc->workspace_bytes && lc->workspace_offset % 256)
		return ap_error_set(err, AP_EINVAL, kn, NULL,
				    "launch %zu: library workspace at byte %llu, not 256-byte aligned",
				    l, (unsigned long long)lc->workspace_offset);
	/* the workspace slice is scratch: no intermediate the launch binds may lie in it */
	for (size_t a = 0; lc->workspace_bytes && a < la->n_args; a++) {
		const Apollo__Buffer *bf = b->buffers[la->args[a]];

		if (bf->kind == APOLLO__BUFFER_KIND__BUF_INTERMEDIATE && bf->bytes &&
		    bf->offset < lc->workspace_offset + lc->workspace_bytes &&
		    lc->workspace_offset < bf->offset + bf->bytes)
			return ap_error_set(err, AP_EINVAL, kn, bf->name,
					    "launch %zu: library workspace [%llu, +%llu) overlaps "
					    "intermediate '%s'", l, (unsigned long long)lc->workspace_offset,
					    (unsigned long long)lc->workspace_bytes, bf->name);
	}
	return 0;
}

/* ---- cuBLASLt, declared here ------------------------------------------------------ */

typedef int lt_status;
typedef void *lt_handle, *lt_desc, *lt_layout, *lt_pref;
typedef struct { uint64_t data[8]; } lt_algo;
typedef struct {
	lt_algo algo;
	size_t workspace_size;
	lt_status state;
	float waves;
	int reserved[4];
} lt_heuristic;

enum {
	LT_R_32F = 0, LT_R_16F = 2, LT_R_16BF = 14,
	LT_COMPUTE_32F = 68, LT_COMPUTE_32F_FAST_TF32 = 77,
	LT_OP_N = 0, LT_OP_T = 1,
	LT_DESC_TRANSA = 3, LT_DESC_TRANSB = 4, LT_DESC_EPILOGUE = 7, LT_DESC_BIAS_POINTER = 8,
	LT_DESC_BIAS_DATA_TYPE = 26,
	LT_LAYOUT_BATCH_COUNT = 5, LT_LAYOUT_STRIDED_BATCH_OFFSET = 6,
	LT_PREF_MAX_WORKSPACE_BYTES = 1,
};

struct ap_lib_plan {
	lt_desc desc;
	lt_layout la, lb, lc, ld;   /* cuBLASLt's A (Apollo's B), B (Apollo's A), C, D */
	lt_algo algo;
	bool failed;                /* set up once and refused: the caller's kernel runs */
	ap_lib_plan *next;
};

struct ap_cublaslt {
	void *so;
	lt_handle h;
	ap_lib_plan *plans;
	lt_status (*create)(lt_handle *);
	lt_status (*destroy)(lt_handle);
	lt_status (*desc_create)(lt_desc *, int, int);
	lt_status (*desc_destroy)(lt_desc);
	lt_status (*desc_set)(lt_desc, int, const void *, size_t);
	lt_status (*layout_create)(lt_layout *, int, uint64_t, uint64_t, int64_t);
	lt_status (*layout_destroy)(lt_layout);
	lt_status (*layout_set)(lt_layout, int, const void *, size_t);
	lt_status (*pref_create)(lt_pref *);
	lt_status (*pref_destroy)(lt_pref);
	lt_status (*pref_set)(lt_pref, int, const void *, size_t);
	lt_status (*heuristic)(lt_handle, lt_desc, lt_layout, lt_layout, lt_layout, lt_layout, lt_pref,
			       int, lt_heuristic *, int *);
	lt_status (*matmul)(lt_handle, lt_desc, const void *, const void *, lt_layout, const void *,
			    lt_layout, const void *, const void *, lt_layout, void *, lt_layout,
			    const lt_algo *, void *, size_t, void *);
};

static unsigned long lt_calls;

unsigned long ap_cublaslt_calls(void) { return __atomic_load_n(&lt_calls, __ATOMIC_RELAXED); }

static const char *lt_status_name(lt_status s)
{
	switch (s) {
	case 0: return "CUBLAS_STATUS_SUCCESS";
	case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
	case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
	case 7: return "CUBLAS_STATUS_INVALID_VALUE";
	case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
	case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
	case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
	case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
	default: return "a cuBLAS status";
	}
}

ap_cublaslt *ap_cublaslt_open(char *why, size_t cap)
{
	static const char *const names[] = { "libcublasLt.so.13", "libcublasLt.so.12",
					      "libcublasLt.so.11" };
	const char *env = getenv("APOLLO_LIBCUBLASLT");
	ap_cublaslt *lt = calloc(1, sizeof(*lt));
	const char *path = NULL, *missing = NULL;
	char tried[512] = "";

	if (!lt) {
		snprintf(why, cap, "out of memory");
		return NULL;
	}
	/* RTLD_NODELETE, as server/backend/nvrtc.c: the library stays mapped
	 * after dlclose -- once cublasLtCreate has run it holds process state
	 * of its own (the CUDA runtime it initialised, allocations it keeps)
	 * that unloading would orphan (tools/lsan.supp: not ours) */
	if (env && strcmp(env, "off") == 0) {
		snprintf(why, cap, "no cuBLASLt: $APOLLO_LIBCUBLASLT=off");
		free(lt);
		return NULL;
	}
	if (env && *env) {
		path = env;
		lt->so = dlopen(env, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
		if (!lt->so)
			snprintf(tried, sizeof(tried), "%s", dlerror());
	} else {
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !lt->so; i++) {
			path = names[i];
			lt->so = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
		}
		if (!lt->so)
			snprintf(tried, sizeof(tried), "none of libcublasLt.so.13, .12, .11 loads");
	}
	if (!lt->so) {
		snprintf(why, cap, "no cuBLASLt: %s", tried);
		free(lt);
		return NULL;
	}
#define LT_SYM(field, sym)                                                        \
	do {                                                                      \
		void *s_ = dlsym(lt->so, sym);                                    \
		if (!s_) {                                                        \
			missing = sym;                                            \
			goto fail;                                                \
		}                                                                 \
		memcpy(&lt->field, &s_, sizeof(s_));                              \
	} while (0)
	LT_SYM(create, "cublasLtCreate");
	LT_SYM(destroy, "cublasLtDestroy");
	LT_SYM(desc_create, "cublasLtMatmulDescCreate");
	LT_SYM(desc_destroy, "cublasLtMatmulDescDestroy");
	LT_SYM(desc_set, "cublasLtMatmulDescSetAttribute");
	LT_SYM(layout_create, "cublasLtMatrixLayoutCreate");
	LT_SYM(layout_destroy, "cublasLtMatrixLayoutDestroy");
	LT_SYM(layout_set, "cublasLtMatrixLayoutSetAttribute");
	LT_SYM(pref_create, "cublasLtMatmulPreferenceCreate");
	LT_SYM(pref_destroy, "cublasLtMatmulPreferenceDestroy");
	LT_SYM(pref_set, "cublasLtMatmulPreferenceSetAttribute");
	LT_SYM(heuristic, "cublasLtMatmulAlgoGetHeuristic");
	LT_SYM(matmul, "cublasLtMatmul");
#undef LT_SYM
	{
		lt_status s = lt->create(&lt->h);

		if (s != 0) {
			snprintf(why, cap, "cublasLtCreate (%s): %s", path, lt_status_name(s));
			dlclose(lt->so);
			free(lt);
			return NULL;
		}
	}
	return lt;
fail:
	snprintf(why, cap, "%s lacks %s", path, missing);
	dlclose(lt->so);
	free(lt);
	return NULL;
}

static void plan_free(ap_cublaslt *lt, ap_lib_plan *p)
{
	if (p->la) lt->layout_destroy(p->la);
	if (p->lb) lt->layout_destroy(p->lb);
	if (p->lc) lt->layout_destroy(p->lc);
	if (p->ld) lt->layout_destroy(p->ld);
	if (p->desc) lt->desc_destroy(p->desc);
	free(p);
}

void ap_cublaslt_close(ap_cublaslt *lt)
{
	if (!lt)
		return;
	while (lt->plans) {
		ap_lib_plan *p = lt->plans;

		lt->plans = p->next;
		plan_free(lt, p);
	}
	if (lt->h)
		lt->destroy(lt->h);
	dlclose(lt->so);
	free(lt);
}

static int lt_type(int dt)
{
	return dt == APOLLO__DATA_TYPE__DT_FLOAT16 ? LT_R_16F
	       : dt == APOLLO__DATA_TYPE__DT_BFLOAT16 ? LT_R_16BF : LT_R_32F;
}

/* A column-major layout of rows x cols, ld, with the batch facts. */
static lt_status layout(ap_cublaslt *lt, lt_layout *out, int dt, uint64_t rows, uint64_t cols,
			uint64_t ld, uint32_t batch, uint64_t stride)
{
	lt_status s = lt->layout_create(out, lt_type(dt), rows, cols, (int64_t)ld);
	int32_t bc = (int32_t)batch;
	int64_t st = (int64_t)stride;

	if (s != 0) {
		*out = NULL;
		return s;
	}
	if (batch > 1 &&
	    ((s = lt->layout_set(*out, LT_LAYOUT_BATCH_COUNT, &bc, sizeof(bc))) != 0 ||
	     (s = lt->layout_set(*out, LT_LAYOUT_STRIDED_BATCH_OFFSET, &st, sizeof(st))) != 0))
		return s;
	return 0;
}

/* Descriptors and the heuristic's algorithm for lc; 0 or the status of
 * the call that refused (what in *what). */
static lt_status plan_make(ap_cublaslt *lt, ap_lib_plan *p, const Apollo__LibraryCall *lc,
			   const char **what)
{
	uint32_t batch = lc->batch ? lc->batch : 1;
	int32_t ta = lc->trans_b ? LT_OP_T : LT_OP_N;   /* cuBLASLt's A is Apollo's B */
	int32_t tb = lc->trans_a ? LT_OP_T : LT_OP_N;
	int32_t epi = lc->epilogue ? (int32_t)lc->epilogue : 1;
	int32_t bias_t = lt_type(lc->bias_type);
	uint64_t wsb = lc->workspace_bytes;
	lt_heuristic res[1];
	int found = 0;
	lt_pref pref = NULL;
	lt_status s;

	memset(res, 0, sizeof(res));
	*what = "cublasLtMatmulDescCreate";
	if ((s = lt->desc_create(&p->desc, lc->compute == APOLLO__LIBRARY_COMPUTE__LIB_COMPUTE_F32_FAST_TF32
						   ? LT_COMPUTE_32F_FAST_TF32 : LT_COMPUTE_32F,
				 LT_R_32F)) != 0) {
		p->desc = NULL;
		return s;
	}
	*what = "cublasLtMatmulDescSetAttribute";
	if ((s = lt->desc_set(p->desc, LT_DESC_TRANSA, &ta, sizeof(ta))) != 0 ||
	    (s = lt->desc_set(p->desc, LT_DESC_TRANSB, &tb, sizeof(tb))) != 0 ||
	    (s = lt->desc_set(p->desc, LT_DESC_EPILOGUE, &epi, sizeof(epi))) != 0 ||
	    (epi_bias(lc->epilogue) &&
	     (s = lt->desc_set(p->desc, LT_DESC_BIAS_DATA_TYPE, &bias_t, sizeof(bias_t))) != 0))
		return s;
	/* cuBLASLt's matrices, column-major: Apollo's B (k x n row-major) is
	 * n x k column-major, its A (m x k) is k x m, its D (m x n) is n x m */
	*what = "cublasLtMatrixLayoutCreate";
	if ((s = layout(lt, &p->la, lc->b_type, lc->trans_b ? lc->k : lc->n,
			lc->trans_b ? lc->n : lc->k, lc->ldb, batch, lc->stride_b)) != 0 ||
	    (s = layout(lt, &p->lb, lc->a_type, lc->trans_a ? lc->m : lc->k,
			lc->trans_a ? lc->k : lc->m, lc->lda, batch, lc->stride_a)) != 0 ||
	    (s = layout(lt, &p->ld, lc->d_type, lc->n, lc->m, lc->ldd, batch, lc->stride_d)) != 0 ||
	    (s = layout(lt, &p->lc, lc->beta != 0 ? lc->c_type : lc->d_type, lc->n, lc->m,
			lc->beta != 0 ? lc->ldc : lc->ldd, batch,
			lc->beta != 0 ? lc->stride_c : lc->stride_d)) != 0)
		return s;
	*what = "cublasLtMatmulPreferenceCreate";
	if ((s = lt->pref_create(&pref)) != 0)
		return s;
	*what = "cublasLtMatmulAlgoGetHeuristic";
	if ((s = lt->pref_set(pref, LT_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb))) == 0 &&
	    (s = lt->heuristic(lt->h, p->desc, p->la, p->lb, p->lc, p->ld, pref, 1, res, &found)) == 0 &&
	    (found < 1 || res[0].state != 0))
		s = found < 1 ? 15 : res[0].state;   /* NOT_SUPPORTED: no algorithm */
	lt->pref_destroy(pref);
	if (s == 0)
		p->algo = res[0].algo;
	return s;
}

int ap_cublaslt_matmul(ap_cublaslt *lt, ap_lib_plan **plan, const Apollo__LibraryCall *lc,
		       const unsigned long long *dev, unsigned long long ws, void *stream,
		       const char *kname, ap_error *err)
{
	ap_lib_plan *p = *plan;
	float alpha = lc->alpha, beta = lc->beta;
	const void *c;
	void *bias;
	lt_status s;

	if (!p) {
		const char *what = "";

		p = calloc(1, sizeof(*p));
		if (!p)
			return ap_error_set(err, AP_ENOMEM, kname, NULL, "out of memory");
		p->next = lt->plans;
		lt->plans = p;
		*plan = p;
		if ((s = plan_make(lt, p, lc, &what)) != 0) {
			p->failed = true;
			return ap_error_set(err, AP_EUNSUPPORTED, kname, NULL,
					    "cuBLASLt refused the product of kernel '%s' (%u x %u x %u): "
					    "%s: %s", kname, lc->m, lc->n, lc->k, what,
					    lt_status_name(s));
		}
	}
	if (p->failed)
		return ap_error_set(err, AP_EUNSUPPORTED, kname, NULL,
				    "cuBLASLt refused the product of kernel '%s'", kname);
	if (epi_bias(lc->epilogue)) {
		bias = (void *)(uintptr_t)dev[lc->bias_arg];
		if ((s = lt->desc_set(p->desc, LT_DESC_BIAS_POINTER, &bias, sizeof(bias))) != 0)
			return ap_error_set(err, AP_EIO, kname, NULL,
					    "cublasLtMatmulDescSetAttribute(BIAS_POINTER) for kernel "
					    "'%s': %s", kname, lt_status_name(s));
	}
	c = (const void *)(uintptr_t)dev[lc->beta != 0 ? lc->c_arg : lc->d_arg];
	s = lt->matmul(lt->h, p->desc, &alpha, (const void *)(uintptr_t)dev[lc->b_arg], p->la,
		       (const void *)(uintptr_t)dev[lc->a_arg], p->lb, &beta, c, p->lc,
		       (void *)(uintptr_t)dev[lc->d_arg], p->ld, &p->algo,
		       lc->workspace_bytes ? (void *)(uintptr_t)(ws + lc->workspace_offset) : NULL,
		       (size_t)lc->workspace_bytes, stream);
	__atomic_add_fetch(&lt_calls, 1, __ATOMIC_RELAXED);
	if (s != 0)
		return ap_error_set(err, AP_EIO, kname, NULL,
				    "cublasLtMatmul for kernel '%s' (%u x %u x %u): %s", kname,
				    lc->m, lc->n, lc->k, lt_status_name(s));
	return 0;
}
