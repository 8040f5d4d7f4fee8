/* cublaslt_standin.c -- a stand-in cuBLASLt (libcublasLt) for machines
 * without a GPU, built as build/tests/libcublaslt-standin.so and loaded by
 * the runtime through $APOLLO_LIBCUBLASLT, beside the stand-in CUDA driver
 * (tests/cuda_standin.c), whose device memory is host memory: so this one
 * really computes the product, from the descriptors the caller set, as
 * cuBLASLt defines it (cuBLAS Library User Guide, "cublasLtMatmul"):
 *
 *   D = epilogue(alpha * op(A) op(B) + beta * C (+ bias)),
 *
 * every matrix column-major (element (i, j) at i + j * ld), op(X) X or its
 * transpose (CUBLASLT_MATMUL_DESC_TRANSA/B), op(A) m x k, op(B) k x n, C
 * and D m x n, batches STRIDED_BATCH_OFFSET elements apart, the bias one
 * per row of D (m elements) added before the activation; RELU max(x, 0);
 * GELU the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
 * Accumulation in double; float16/bfloat16 rounded to nearest even when
 * stored.
 *
 * It refuses what cuBLASLt refuses that can be known from the
 * descriptors, with CUBLAS_STATUS_INVALID_VALUE (7): a leading dimension
 * smaller than its layout's rows, dims that do not chain (op(A) m x k,
 * op(B) k x n, C and D m x n), batch counts that differ, a bias epilogue
 * without a bias pointer at the matmul, a NULL handle or descriptor; and
 * with CUBLAS_STATUS_NOT_SUPPORTED (15): data types other than
 * {16F,16F -> 16F or 32F}, {16BF,16BF -> 16BF or 32F}, {32F,32F -> 32F},
 * a compute type other than 32F / 32F_FAST_TF32 (the latter only for 32F
 * data), an epilogue outside DEFAULT 1, RELU 2, BIAS 4, RELU_BIAS 6,
 * GELU 32, GELU_BIAS 36, a workspace smaller than the one it asked for.
 *
 * Environment: APOLLO_STANDIN_LT_WORKSPACE=N: bytes of workspace its
 * heuristic says an algorithm needs (default 0; more than the preference's
 * MAX_WORKSPACE_BYTES: no algorithm).
 *
 * Counters for tests (dlsym): lt_matmuls, lt_heuristics, lt_handles,
 * lt_descs, lt_layouts, lt_prefs (live objects), lt_last_status,
 * lt_last_stream, lt_last_workspace, lt_last_workspace_bytes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { ST_OK = 0, ST_INVALID = 7, ST_NOT_SUPPORTED = 15 };
enum { R_32F = 0, R_16F = 2, R_16BF = 14 };
enum { C_32F = 68, C_32F_TF32 = 77 };

typedef struct { int magic; } lt_handle;
typedef struct {
	int compute, scale;
	int32_t transa, transb, epilogue, bias_type;
	const void *bias;
} lt_desc;
typedef struct {
	int type;
	uint64_t rows, cols;
	int64_t ld;
	int32_t batch;
	int64_t stride;
} lt_layout;
typedef struct { uint64_t max_ws; } lt_pref;
typedef struct { uint64_t data[8]; } lt_algo;
typedef struct {
	lt_algo algo;
	size_t workspace_size;
	int state;
	float waves;
	int reserved[4];
} lt_heuristic;

int lt_matmuls, lt_heuristics, lt_handles, lt_descs, lt_layouts, lt_prefs, lt_last_status;
void *lt_last_stream, *lt_last_workspace;
size_t lt_last_workspace_bytes;

#define ALGO_MAGIC 0x5ea1ab1eULL

int cublasLtCreate(lt_handle **h)
{
	if (!h)
		return ST_INVALID;
	*h = calloc(1, sizeof(**h));
	(*h)->magic = 1;
	lt_handles++;
	return ST_OK;
}

int cublasLtDestroy(lt_handle *h)
{
	if (!h)
		return ST_INVALID;
	free(h);
	lt_handles--;
	return ST_OK;
}

int cublasLtMatmulDescCreate(lt_desc **d, int compute, int scale)
{
	if (!d)
		return ST_INVALID;
	*d = calloc(1, sizeof(**d));
	(*d)->compute = compute;
	(*d)->scale = scale;
	(*d)->epilogue = 1;
	(*d)->bias_type = -1;
	lt_descs++;
	return ST_OK;
}

int cublasLtMatmulDescDestroy(lt_desc *d)
{
	free(d);
	lt_descs--;
	return ST_OK;
}

static int set32(int32_t *out, const void *buf, size_t n)
{
	if (n != sizeof(int32_t))
		return ST_INVALID;
	memcpy(out, buf, n);
	return ST_OK;
}

int cublasLtMatmulDescSetAttribute(lt_desc *d, int attr, const void *buf, size_t n)
{
	if (!d || !buf)
		return ST_INVALID;
	switch (attr) {
	case 3: return set32(&d->transa, buf, n);
	case 4: return set32(&d->transb, buf, n);
	case 7: return set32(&d->epilogue, buf, n);
	case 26: return set32(&d->bias_type, buf, n);
	case 8:
		if (n != sizeof(void *))
			return ST_INVALID;
		memcpy(&d->bias, buf, n);
		return ST_OK;
	default:
		return ST_INVALID;   /* nothing else is set by the runtime */
	}
}

int cublasLtMatrixLayoutCreate(lt_layout **l, int type, uint64_t rows, uint64_t cols, int64_t ld)
{
	if (!l)
		return ST_INVALID;
	if (ld < (int64_t)rows || ld < 1)
		return ST_INVALID;   /* column-major: ld >= rows */
	*l = calloc(1, sizeof(**l));
	(*l)->type = type;
	(*l)->rows = rows;
	(*l)->cols = cols;
	(*l)->ld = ld;
	(*l)->batch = 1;
	lt_layouts++;
	return ST_OK;
}

int cublasLtMatrixLayoutDestroy(lt_layout *l)
{
	free(l);
	lt_layouts--;
	return ST_OK;
}

int cublasLtMatrixLayoutSetAttribute(lt_layout *l, int attr, const void *buf, size_t n)
{
	if (!l || !buf)
		return ST_INVALID;
	if (attr == 5)
		return set32(&l->batch, buf, n);
	if (attr == 6) {
		if (n != sizeof(int64_t))
			return ST_INVALID;
		memcpy(&l->stride, buf, n);
		return ST_OK;
	}
	return ST_INVALID;
}

int cublasLtMatmulPreferenceCreate(lt_pref **p)
{
	if (!p)
		return ST_INVALID;
	*p = calloc(1, sizeof(**p));
	lt_prefs++;
	return ST_OK;
}

int cublasLtMatmulPreferenceDestroy(lt_pref *p)
{
	free(p);
	lt_prefs--;
	return ST_OK;
}

int cublasLtMatmulPreferenceSetAttribute(lt_pref *p, int attr, const void *buf, size_t n)
{
	if (!p || !buf || attr != 1 || n != sizeof(uint64_t))
		return ST_INVALID;
	memcpy(&p->max_ws, buf, n);
	return ST_OK;
}

static uint64_t ws_needed(void)
{
	const char *e = getenv("APOLLO_STANDIN_LT_WORKSPACE");

	return e && *e ? strtoull(e, NULL, 10) : 0;
}

/* What cuBLASLt would refuse of this product, from its descriptors. */
static int validate(const lt_desc *d, const lt_layout *a, const lt_layout *b, const lt_layout *c,
		    const lt_layout *dd)
{
	uint64_t m, n, k, kb;

	if (!d || !a || !b || !c || !dd)
		return ST_INVALID;
	if (a->type != b->type)
		return ST_NOT_SUPPORTED;
	if (a->type == R_32F ? dd->type != R_32F
	    : (a->type != R_16F && a->type != R_16BF) || (dd->type != a->type && dd->type != R_32F))
		return ST_NOT_SUPPORTED;
	if (c->type != dd->type)
		return ST_NOT_SUPPORTED;
	if (d->scale != R_32F || (d->compute != C_32F && d->compute != C_32F_TF32) ||
	    (d->compute == C_32F_TF32 && a->type != R_32F))
		return ST_NOT_SUPPORTED;
	switch (d->epilogue) {
	case 1: case 2: case 4: case 6: case 32: case 36: break;
	default: return ST_NOT_SUPPORTED;
	}
	if ((d->epilogue & 4) && d->bias_type != -1 && d->bias_type != dd->type)
		return ST_NOT_SUPPORTED;
	if ((d->transa != 0 && d->transa != 1) || (d->transb != 0 && d->transb != 1))
		return ST_INVALID;
	m = d->transa ? a->cols : a->rows;
	k = d->transa ? a->rows : a->cols;
	kb = d->transb ? b->cols : b->rows;
	n = d->transb ? b->rows : b->cols;
	if (k != kb || c->rows != m || c->cols != n || dd->rows != m || dd->cols != n)
		return ST_INVALID;
	if (a->batch != dd->batch || b->batch != dd->batch || c->batch != dd->batch || dd->batch < 1)
		return ST_INVALID;
	return ST_OK;
}

int cublasLtMatmulAlgoGetHeuristic(lt_handle *h, lt_desc *d, lt_layout *a, lt_layout *b,
				   lt_layout *c, lt_layout *dd, lt_pref *p, int want,
				   lt_heuristic *res, int *found)
{
	int s;

	lt_heuristics++;
	if (!h || !p || !res || !found || want < 1)
		return lt_last_status = ST_INVALID;
	*found = 0;
	if ((s = validate(d, a, b, c, dd)) != ST_OK)
		return lt_last_status = s;
	if (ws_needed() > p->max_ws)
		return lt_last_status = ST_NOT_SUPPORTED;   /* no algorithm fits */
	memset(&res[0], 0, sizeof(res[0]));
	res[0].algo.data[0] = ALGO_MAGIC;
	res[0].workspace_size = ws_needed();
	res[0].state = ST_OK;
	res[0].waves = 1;
	*found = 1;
	return lt_last_status = ST_OK;
}

static double half_to_double(uint16_t h)
{
	int e = (h >> 10) & 31, f = h & 1023;
	double v = e == 0 ? ldexp(f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexp(f + 1024, e - 25);

	return h & 0x8000 ? -v : v;
}

static uint16_t float_to_half(float x)
{
	/* through the exact double: round to nearest even at 11 significant bits */
	double a = fabs((double)x), q;
	uint16_t sign = signbit(x) ? 0x8000 : 0;
	int e;

	if (isnan(x))
		return 0x7e00;
	if (a >= 65520.0)
		return sign | 0x7c00;
	if (a < ldexp(1, -14)) {
		q = nearbyint(ldexp(a, 24));   /* subnormal: units of 2^-24 */
		return sign | (uint16_t)q;
	}
	e = ilogb(a);
	q = nearbyint(ldexp(a, 10 - e));   /* 1024..2048 */
	if (q == 2048) {
		q = 1024;
		e++;
	}
	if (e > 15)
		return sign | 0x7c00;
	return sign | (uint16_t)((e + 15) << 10) | (uint16_t)((int)q - 1024);
}

static double load(int type, const void *p, uint64_t i)
{
	if (type == R_32F)
		return ((const float *)p)[i];
	if (type == R_16F)
		return half_to_double(((const uint16_t *)p)[i]);
	{
		uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
		float f;

		memcpy(&f, &u, 4);
		return f;
	}
}

static void store(int type, void *p, uint64_t i, double v)
{
	float f = (float)v;

	if (type == R_32F) {
		((float *)p)[i] = f;
	} else if (type == R_16F) {
		((uint16_t *)p)[i] = float_to_half(f);
	} else {
		uint32_t u;

		memcpy(&u, &f, 4);
		if ((u & 0x7fffffff) > 0x7f800000)
			u = 0x7fc00000;
		else
			u += 0x7fff + ((u >> 16) & 1);
		((uint16_t *)p)[i] = (uint16_t)(u >> 16);
	}
}

int cublasLtMatmul(lt_handle *h, lt_desc *d, const void *alpha, const void *A, lt_layout *a,
		   const void *B, lt_layout *b, const void *beta, const void *C, lt_layout *c,
		   void *D, lt_layout *dd, const lt_algo *algo, void *ws, size_t ws_bytes,
		   void *stream)
{
	double al, be;
	uint64_t m, n, k;
	int s;

	lt_last_stream = stream;
	lt_last_workspace = ws;
	lt_last_workspace_bytes = ws_bytes;
	if (!h || !alpha || !beta || !A || !B || !D)
		return lt_last_status = ST_INVALID;
	if ((s = validate(d, a, b, c, dd)) != ST_OK)
		return lt_last_status = s;
	if (algo && algo->data[0] != ALGO_MAGIC)
		return lt_last_status = ST_INVALID;
	if (ws_bytes < ws_needed() || (ws_bytes && !ws))
		return lt_last_status = ST_NOT_SUPPORTED;
	if ((d->epilogue & 4) && !d->bias)
		return lt_last_status = ST_INVALID;
	al = *(const float *)alpha;   /* scale type 32F */
	be = *(const float *)beta;
	if (be != 0 && !C)
		return lt_last_status = ST_INVALID;
	m = dd->rows;
	n = dd->cols;
	k = d->transa ? a->rows : a->cols;
	for (int32_t bt = 0; bt < dd->batch; bt++)
		for (uint64_t j = 0; j < n; j++)
			for (uint64_t i = 0; i < m; i++) {
				double acc = 0, v;

				for (uint64_t p = 0; p < k; p++) {
					uint64_t ai = d->transa ? p + i * a->ld : i + p * a->ld;
					uint64_t bi = d->transb ? j + p * b->ld : p + j * b->ld;

					acc += load(a->type, A, bt * a->stride + ai) *
					       load(b->type, B, bt * b->stride + bi);
				}
				v = al * acc;
				if (be != 0)
					v += be * load(c->type, C, bt * c->stride + i + j * c->ld);
				if (d->epilogue & 4)
					v += load(dd->type, d->bias, i);
				if (d->epilogue & 2)
					v = v > 0 ? v : 0;
				if (d->epilogue & 32)
					v = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
				store(dd->type, D, bt * dd->stride + i + j * dd->ld, v);
			}
	lt_matmuls++;
	return lt_last_status = ST_OK;
}
