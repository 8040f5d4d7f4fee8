/* compare.c -- computed output against reference output, as ONNX's backend
 * test runner does it (numpy.testing.assert_allclose: |a-b| <= atol +
 * rtol*|b|, NaN equal to NaN), element by element, remembering the largest
 * absolute error and where it is so that a failure can say where to look.
 */
#include "tool.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

bool ap_compare_close(double a, double b, double rtol, double atol)
{
	if (isnan(a) || isnan(b))
		return isnan(a) && isnan(b);
	if (isinf(a) || isinf(b))
		return a == b;
	return fabs(a - b) <= atol + rtol * fabs(b);
}

/* Element `i` of a tensor as a double (NaN for a type without a size). */
static double elem(const ap_host_tensor *t, int64_t i)
{
	return ap_dtype_size(t->dtype) ? ap_elem_get(t->data, t->dtype, i) : NAN;
}

static bool exact_i64(const ap_host_tensor *t, int64_t i, int64_t *out)
{
	if (t->dtype == AP_DT_I64) {
		memcpy(out, (const uint8_t *)t->data + i * 8, 8);
		return true;
	}
	return false;
}

static int64_t numel(int rank, const int64_t *dims)
{
	int64_t n = 1;

	for (int d = 0; d < rank; d++)
		n *= dims[d];
	return n;
}

/* How far an element is towards the edge of the tolerance (1) or past it:
 * its error e over atol + rtol |b| for floats (infinite for a mismatch
 * that no number measures: NaN, inf, a zero tolerance); the error itself
 * for integers, which must match exactly. */
static double tolerance_ratio(bool ok, double e, double b, bool floating, double rtol,
			      double atol)
{
	double tol = atol + rtol * fabs(b);

	if (!floating)
		return e;
	if (ok)
		return e > 0 && tol > 0 ? e / tol : 0;
	return tol > 0 && isfinite(e) ? e / tol : INFINITY;
}

bool ap_compare_tensors(const ap_host_tensor *got, const ap_host_tensor *want, double rtol,
			double atol, ap_compare_result *r)
{
	bool floating = ap_dtype_is_floating(want->dtype);
	size_t es = ap_dtype_size(want->dtype);
	int64_t n;

	double worst = -1;

	memset(r, 0, sizeof(*r));
	r->max_at = -1;
	r->first_bad = -1;
	r->worst_at = -1;
	if (got->dtype != want->dtype || es == 0) {
		snprintf(r->why, sizeof(r->why), "dtype %s, expected %s", ap_dtype_name(got->dtype),
			 ap_dtype_name(want->dtype));
		return r->ok = false;
	}
	if (got->rank != want->rank || memcmp(got->dims, want->dims, sizeof(int64_t) * (size_t)(want->rank > 0 ? want->rank : 0))) {
		char a[100], b[100];
		int la = 0, lb = 0;
		la += snprintf(a, sizeof(a), "[");
		for (int d = 0; d < got->rank && la < (int)sizeof(a) - 24; d++)
			la += snprintf(a + la, sizeof(a) - la, "%s%lld", d ? "," : "", (long long)got->dims[d]);
		snprintf(a + la, sizeof(a) - la, "]");
		lb += snprintf(b, sizeof(b), "[");
		for (int d = 0; d < want->rank && lb < (int)sizeof(b) - 24; d++)
			lb += snprintf(b + lb, sizeof(b) - lb, "%s%lld", d ? "," : "", (long long)want->dims[d]);
		snprintf(b + lb, sizeof(b) - lb, "]");
		snprintf(r->why, sizeof(r->why), "shape %s, expected %s", a, b);
		return r->ok = false;
	}
	n = numel(want->rank, want->dims);
	if ((uint64_t)n * es != want->nbytes || got->nbytes != want->nbytes) {
		snprintf(r->why, sizeof(r->why), "%zu data bytes, expected %zu for the shape",
			 got->nbytes, (size_t)((uint64_t)n * es));
		return r->ok = false;
	}
	for (int64_t i = 0; i < n; i++) {
		double a = elem(got, i), b = elem(want, i), e;
		bool ok;
		int64_t ia, ib;
		if (!floating) {
			if (exact_i64(got, i, &ia) && exact_i64(want, i, &ib))
				ok = ia == ib;
			else
				ok = a == b;
			e = fabs(a - b);
			if (!ok && e == 0)
				e = 1;  /* int64 values beyond 2^53 that differ */
		} else {
			ok = ap_compare_close(a, b, rtol, atol);
			if (isnan(a) || isnan(b) || isinf(a) || isinf(b))
				e = ok ? 0 : INFINITY;
			else
				e = fabs(a - b);
		}
		if (e > r->max_abs_err || (r->max_at < 0 && e == r->max_abs_err)) {
			r->max_abs_err = e;
			r->max_at = i;
		}
		if (floating && isfinite(b) && b != 0 && isfinite(e) && e / fabs(b) > r->max_rel_err)
			r->max_rel_err = e / fabs(b);
		if (tolerance_ratio(ok, e, b, floating, rtol, atol) > worst) {
			worst = tolerance_ratio(ok, e, b, floating, rtol, atol);
			r->worst_at = i;
		}
		if (!ok) {
			if (r->first_bad < 0)
				r->first_bad = i;
			r->n_bad++;
		}
	}
	return r->ok = r->n_bad == 0;
}

void ap_compare_format_index(int rank, const int64_t *dims, int64_t flat, char *buf, size_t cap)
{
	int64_t idx[AP_MAX_RANK];
	size_t len = 0;

	if (cap == 0)
		return;
	if (rank < 0 || rank > AP_MAX_RANK)
		rank = 0;
	for (int d = rank - 1; d >= 0; d--) {
		int64_t dim = dims[d] > 0 ? dims[d] : 1;
		idx[d] = flat % dim;
		flat /= dim;
	}
	len += (size_t)snprintf(buf, cap, "[");
	for (int d = 0; d < rank && len < cap; d++)
		len += (size_t)snprintf(buf + len, cap - len, "%s%lld", d ? "," : "",
					(long long)idx[d]);
	if (len < cap)
		snprintf(buf + len, cap - len, "]");
}

void ap_compare_tolerance(ap_dtype dt, double *rtol, double *atol)
{
	switch (dt) {
	case AP_DT_F32:
		*rtol = 1e-3;
		*atol = 1e-4;
		break;
	case AP_DT_F64:
		*rtol = 1e-5;
		*atol = 1e-8;
		break;
	case AP_DT_F16:
		*rtol = 1e-2;
		*atol = 1e-2;
		break;
	case AP_DT_BF16:
		*rtol = 5e-2;
		*atol = 5e-2;
		break;
	default:        /* integers and bool: exactly */
		*rtol = 0;
		*atol = 0;
	}
}
