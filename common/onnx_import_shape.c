/* onnx_import_shape.c -- importers of the ONNX ops that move data without
 * computing on it: Reshape, Flatten, Squeeze and Unsqueeze (all made a
 * Reshape), Transpose, Expand, Tile, Slice, Concat, Split, Gather, Pad,
 * GatherElements, ScatterElements (and opset 9-10 Scatter), ScatterND,
 * DepthToSpace and SpaceToDepth (a reshape, a transpose, a reshape).
 * Shapes, axes, starts/ends and pads must be compile-time constants; the
 * importer resolves them (numpy rules, negative values, clamping) into the
 * normalised attributes and the given output shape.  Semantics: the ONNX
 * operator specification (https://onnx.ai/onnx/operators/).
 */
#include "onnx_import_internal.h"

#include <stdio.h>
#include <string.h>

int ap__onnx_imp_reshape(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *s = NULL, *y;
	int64_t shape[AP_MAX_RANK + 1], dims[AP_MAX_RANK];
	int cnt, infer = -1;
	int64_t known_prod = 1, total;
	bool allowzero = ap__onnx_aint(n, "allowzero", 0) != 0;

	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	if (im->opset < 5) {
		TRY(ap__onnx_aints(im, n, "shape", shape, AP_MAX_RANK, &cnt));
	} else {
		TRY(ap__onnx_get_in(im, n, 1, true, &s));
		TRY(ap__onnx_get_ints(im, s, "Reshape shape", shape, AP_MAX_RANK, &cnt));
	}
	total = sh_numel(&x->sh);
	for (int i = 0; i < cnt; i++) {
		if (shape[i] == 0 && !allowzero) {
			if (i >= x->sh.rank)
				return ap__onnx_fail(im, AP_ESHAPE, NULL,
						     "Reshape: 0 at position %d copies a dimension "
						     "the input (rank %d) does not have", i,
						     x->sh.rank);
			dims[i] = x->sh.dims[i];
		} else if (shape[i] == -1) {
			if (infer >= 0)
				return ap__onnx_fail(im, AP_EINVAL, NULL,
						     "Reshape: more than one -1");
			infer = i;
			dims[i] = 1;
			continue;
		} else if (shape[i] < -1) {
			return ap__onnx_fail(im, AP_EINVAL, NULL, "Reshape: dimension %lld",
					     (long long)shape[i]);
		} else {
			dims[i] = shape[i];
		}
		if (dims[i] && known_prod > AP_MAX_ELEMENTS / dims[i])
			return ap__onnx_fail(im, AP_ETOOLARGE, NULL,
					     "Reshape: target shape too large");
		known_prod *= dims[i];
	}
	if (infer >= 0) {
		if (known_prod == 0 || total % known_prod)
			return ap__onnx_fail(im, AP_ESHAPE, x->name,
					     "Reshape: cannot infer -1 for %lld elements",
					     (long long)total);
		dims[infer] = total / known_prod;
	}
	if (ap__shape_numel(cnt, dims) != total)
		return ap__onnx_fail(im, AP_ESHAPE, x->name,
				     "Reshape: %lld elements do not fit the target shape",
				     (long long)total);
	TRY(ap__onnx_reshape_to(im, x, cnt, dims, out_name(n, 0), &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_flatten(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *y;
	int64_t axis = ap__onnx_aint(n, "axis", 1), dims[2] = { 1, 1 };

	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	if (axis < 0)
		axis += x->sh.rank;
	if (axis < 0 || axis > x->sh.rank)
		return ap__onnx_fail(im, AP_EINVAL, NULL, "Flatten: axis %lld for rank %d",
				     (long long)ap__onnx_aint(n, "axis", 1), x->sh.rank);
	for (int d = 0; d < x->sh.rank; d++)
		dims[d < axis ? 0 : 1] *= x->sh.dims[d];
	TRY(ap__onnx_reshape_to(im, x, 2, dims, out_name(n, 0), &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

static int squeeze_axes(imp *im, const Onnx__NodeProto *n, int64_t *axes, int *cnt)
{
	ival *a = NULL;

	*cnt = 0;
	if (im->opset >= 13) {
		TRY(ap__onnx_get_in(im, n, 1, false, &a));
		if (a)
			TRY(ap__onnx_get_ints(im, a, "axes", axes, AP_MAX_RANK, cnt));
		return 0;
	}
	return ap__onnx_aints(im, n, "axes", axes, AP_MAX_RANK, cnt) < 0 ? AP_EUNSUPPORTED : 0;
}

int ap__onnx_imp_squeeze(imp *im, const Onnx__NodeProto *n, bool un)
{
	ival *x, *y;
	int64_t axes[AP_MAX_RANK], dims[AP_MAX_RANK];
	int cnt, r = 0;
	bool mark[AP_MAX_RANK + 1] = { false };

	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	TRY(squeeze_axes(im, n, axes, &cnt));
	if (un) {
		int orank = x->sh.rank + cnt, src = 0;

		if (orank > AP_MAX_RANK)
			return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "Unsqueeze: result rank %d",
					     orank);
		for (int i = 0; i < cnt; i++) {
			int64_t a;

			TRY(ap__onnx_norm_axis(im, axes[i], orank, &a));
			if (mark[a])
				return ap__onnx_fail(im, AP_EINVAL, NULL,
						     "Unsqueeze: axis %lld repeated",
						     (long long)axes[i]);
			mark[a] = true;
		}
		for (int d = 0; d < orank; d++)
			dims[r++] = mark[d] ? 1 : x->sh.dims[src++];
	} else {
		for (int i = 0; i < cnt; i++) {
			int64_t a;

			TRY(ap__onnx_norm_axis(im, axes[i], x->sh.rank, &a));
			if (x->sh.dims[a] != 1)
				return ap__onnx_fail(im, AP_ESHAPE, x->name,
						     "Squeeze: dimension %lld is %lld, not 1",
						     (long long)a, (long long)x->sh.dims[a]);
			mark[a] = true;
		}
		for (int d = 0; d < x->sh.rank; d++)
			if (!(cnt ? mark[d] : x->sh.dims[d] == 1))
				dims[r++] = x->sh.dims[d];
	}
	TRY(ap__onnx_reshape_to(im, x, r, dims, out_name(n, 0), &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_transpose(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *y;
	int64_t perm[AP_MAX_RANK];
	int cnt;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	TRY(ap__onnx_aints(im, n, "perm", perm, AP_MAX_RANK, &cnt));
	if (!cnt) {
		for (int d = 0; d < x->sh.rank; d++)
			perm[d] = x->sh.rank - 1 - d;
		cnt = x->sh.rank;
	}
	if (cnt != x->sh.rank)
		return ap__onnx_fail(im, AP_EINVAL, NULL,
				     "Transpose: perm has %d values for rank %d", cnt, x->sh.rank);
	for (int d = 0; d < cnt; d++)
		if (perm[d] < 0)
			perm[d] += cnt;
	ab_ints(&A, "perm", perm, cnt);
	TRY(ap__onnx_emit1(im, AP_OP_TRANSPOSE, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_expand(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *s, *y;
	int64_t shape[AP_MAX_RANK];
	int cnt;
	ap_shape t, r;

	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	TRY(ap__onnx_get_in(im, n, 1, true, &s));
	TRY(ap__onnx_get_ints(im, s, "Expand shape", shape, AP_MAX_RANK, &cnt));
	t = x->sh;
	t.rank = cnt;
	memcpy(t.dims, shape, (size_t)cnt * sizeof(int64_t));
	if (ap__broadcast(&x->sh, &t, &r) < 0)
		return ap__onnx_fail(im, AP_ESHAPE, x->name,
				     "Expand: input does not broadcast to the shape");
	if (r.rank == x->sh.rank && memcmp(r.dims, x->sh.dims, (size_t)r.rank * sizeof(int64_t)) == 0)
		return ap__onnx_bind(im, out_name(n, 0), x);
	TRY(ap__onnx_emit1(im, AP_OP_EXPAND, NULL, 1, &x, out_name(n, 0), &r, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_tile(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *rp, *y;
	int64_t rep[AP_MAX_RANK];
	int cnt;
	ap_shape r;

	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	TRY(ap__onnx_get_in(im, n, 1, true, &rp));
	TRY(ap__onnx_get_ints(im, rp, "Tile repeats", rep, AP_MAX_RANK, &cnt));
	if (cnt != x->sh.rank)
		return ap__onnx_fail(im, AP_EINVAL, rp->name, "Tile: %d repeats for rank %d", cnt,
				     x->sh.rank);
	r = x->sh;
	for (int d = 0; d < cnt; d++) {
		if (rep[d] < 0)
			return ap__onnx_fail(im, AP_EINVAL, rp->name, "Tile: negative repeat");
		if (rep[d] && x->sh.dims[d] > AP_MAX_ELEMENTS / rep[d])
			return ap__onnx_fail(im, AP_ETOOLARGE, out_name(n, 0),
					     "Tile: result too large");
		r.dims[d] = x->sh.dims[d] * rep[d];
	}
	if (sh_numel(&r) < 0)
		return ap__onnx_fail(im, AP_ETOOLARGE, out_name(n, 0),
				     "Tile: result of more than %lld elements",
				     (long long)AP_MAX_ELEMENTS);
	TRY(ap__onnx_emit1(im, AP_OP_TILE, NULL, 1, &x, out_name(n, 0), &r, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_slice(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *y, *v;
	int64_t st[AP_MAX_RANK], en[AP_MAX_RANK], ax[AP_MAX_RANK], sp[AP_MAX_RANK];
	int64_t starts[AP_MAX_RANK], steps[AP_MAX_RANK];
	int ns, ne, na = 0, nsp = 0, r;
	ap_shape out;
	bool identity = true;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	r = x->sh.rank;
	if (im->opset < 10) {
		TRY(ap__onnx_aints(im, n, "starts", st, AP_MAX_RANK, &ns));
		TRY(ap__onnx_aints(im, n, "ends", en, AP_MAX_RANK, &ne));
		TRY(ap__onnx_aints(im, n, "axes", ax, AP_MAX_RANK, &na));
	} else {
		TRY(ap__onnx_get_in(im, n, 1, true, &v));
		TRY(ap__onnx_get_ints(im, v, "Slice starts", st, AP_MAX_RANK, &ns));
		TRY(ap__onnx_get_in(im, n, 2, true, &v));
		TRY(ap__onnx_get_ints(im, v, "Slice ends", en, AP_MAX_RANK, &ne));
		TRY(ap__onnx_get_in(im, n, 3, false, &v));
		if (v)
			TRY(ap__onnx_get_ints(im, v, "Slice axes", ax, AP_MAX_RANK, &na));
		TRY(ap__onnx_get_in(im, n, 4, false, &v));
		if (v)
			TRY(ap__onnx_get_ints(im, v, "Slice steps", sp, AP_MAX_RANK, &nsp));
	}
	if (ns != ne || (na && na != ns) || (nsp && nsp != ns))
		return ap__onnx_fail(im, AP_EINVAL, NULL,
				     "Slice: starts/ends/axes/steps lengths differ");
	out = x->sh;
	for (int d = 0; d < r; d++) {
		starts[d] = 0;
		steps[d] = 1;
	}
	for (int i = 0; i < ns; i++) {
		int64_t a = na ? ax[i] : i, dim, s, e, step = nsp ? sp[i] : 1, cnt;

		TRY(ap__onnx_norm_axis(im, a, r, &a));
		if (step == 0)
			return ap__onnx_fail(im, AP_EINVAL, NULL, "Slice: step 0");
		dim = x->sh.dims[a];
		s = st[i];
		e = en[i];
		if (s < 0)
			s += dim;
		if (e < 0)
			e = e < INT64_MIN + dim ? -1 : e + dim;
		if (step > 0) {
			s = s < 0 ? 0 : s > dim ? dim : s;
			e = e < 0 ? 0 : e > dim ? dim : e;
			cnt = e > s ? (e - s + step - 1) / step : 0;
		} else {
			s = s < 0 ? -1 : s > dim - 1 ? dim - 1 : s;
			e = e < -1 ? -1 : e > dim - 1 ? dim - 1 : e;
			cnt = s > e ? (s - e + (-step) - 1) / (-step) : 0;
		}
		starts[a] = cnt ? s : 0;
		steps[a] = step;
		out.dims[a] = cnt;
	}
	for (int d = 0; d < r; d++)
		if (starts[d] != 0 || steps[d] != 1 || out.dims[d] != x->sh.dims[d])
			identity = false;
	if (identity)
		return ap__onnx_bind(im, out_name(n, 0), x);
	ab_ints(&A, "starts", starts, r);
	ab_ints(&A, "steps", steps, r);
	TRY(ap__onnx_emit1(im, AP_OP_SLICE, &A, 1, &x, out_name(n, 0), &out, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_concat(imp *im, const Onnx__NodeProto *n)
{
	ival *ins[64], *y;
	int64_t axis;
	int m = 0;
	abuf A;

	A.n = 0;
	if (n->n_input == 0 || n->n_input > 64)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "Concat of %zu inputs", n->n_input);
	for (size_t i = 0; i < n->n_input; i++)
		TRY(ap__onnx_get_in(im, n, i, true, &ins[m++]));
	TRY(ap__onnx_norm_axis(im, ap__onnx_aint(n, "axis", 1), ins[0]->sh.rank, &axis));
	if (m == 1)
		return ap__onnx_bind(im, out_name(n, 0), ins[0]);
	ab_int(&A, "axis", axis);
	TRY(ap__onnx_emit1(im, AP_OP_CONCAT, &A, m, ins, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_split(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *sv = NULL, *outs[64];
	int64_t axis, sizes[64];
	int cnt = 0, k = (int)n->n_output;
	ap_shape given[64];
	const char *names[64];
	abuf A;

	A.n = 0;
	if (k < 1 || k > 64)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "Split into %d outputs", k);
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	TRY(ap__onnx_norm_axis(im, ap__onnx_aint(n, "axis", 0), x->sh.rank, &axis));
	if (im->opset >= 13) {
		TRY(ap__onnx_get_in(im, n, 1, false, &sv));
		if (sv)
			TRY(ap__onnx_get_ints(im, sv, "Split sizes", sizes, 64, &cnt));
	} else {
		TRY(ap__onnx_aints(im, n, "split", sizes, 64, &cnt));
	}
	if (cnt && cnt != k)
		return ap__onnx_fail(im, AP_EINVAL, NULL, "Split: %d sizes for %d outputs", cnt, k);
	if (!cnt) {
		int64_t dim = x->sh.dims[axis];

		if (im->opset >= 18 && ap__onnx_attr(n, "num_outputs")) {
			int64_t chunk = (dim + k - 1) / k;

			for (int i = 0; i < k; i++) {
				int64_t left = dim - i * chunk;

				sizes[i] = left < 0 ? 0 : left < chunk ? left : chunk;
			}
		} else {
			if (dim % k)
				return ap__onnx_fail(im, AP_ESHAPE, x->name,
						     "Split: %lld does not split into %d equal parts",
						     (long long)dim, k);
			for (int i = 0; i < k; i++)
				sizes[i] = dim / k;
		}
	}
	for (int i = 0; i < k; i++) {
		if (sizes[i] < 0)
			return ap__onnx_fail(im, AP_EINVAL, NULL, "Split: negative size");
		given[i] = x->sh;
		given[i].dims[axis] = sizes[i];
		names[i] = out_name(n, (size_t)i);
		if (!names[i][0])
			return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL,
					     "Split with an unnamed output");
	}
	ab_int(&A, "axis", axis);
	TRY(ap__onnx_emit(im, AP_OP_SPLIT, &A, 1, &x, k, names, given, outs));
	for (int i = 0; i < k; i++)
		TRY(ap__onnx_bind(im, names[i], outs[i]));
	return 0;
}

int ap__onnx_imp_gather(imp *im, const Onnx__NodeProto *n)
{
	ival *in[2], *y;
	int64_t axis;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &in[0]));
	TRY(ap__onnx_get_in(im, n, 1, true, &in[1]));
	TRY(ap__onnx_norm_axis(im, ap__onnx_aint(n, "axis", 0), in[0]->sh.rank, &axis));
	ab_int(&A, "axis", axis);
	TRY(ap__onnx_emit1(im, AP_OP_GATHER, &A, 2, in, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

int ap__onnx_imp_pad(imp *im, const Onnx__NodeProto *n)
{
	ival *x, *v, *y;
	int64_t pads[2 * AP_MAX_RANK], raw[2 * AP_MAX_RANK], axes[AP_MAX_RANK];
	int cnt, na = 0, r;
	double value = 0;
	char buf[32];
	const char *mode = ap__onnx_astr(n, "mode", "constant", buf, sizeof(buf));
	bool zero = true;
	abuf A;

	A.n = 0;
	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	r = x->sh.rank;
	if (im->opset < 11) {
		if (!ap__onnx_attr(n, "pads") && ap__onnx_attr(n, "paddings"))
			TRY(ap__onnx_aints(im, n, "paddings", raw, 2 * AP_MAX_RANK, &cnt));
		else
			TRY(ap__onnx_aints(im, n, "pads", raw, 2 * AP_MAX_RANK, &cnt));
		value = ap__onnx_afloat(n, "value", 0);
	} else {
		TRY(ap__onnx_get_in(im, n, 1, true, &v));
		TRY(ap__onnx_get_ints(im, v, "Pad pads", raw, 2 * AP_MAX_RANK, &cnt));
		TRY(ap__onnx_get_in(im, n, 2, false, &v));
		if (v)
			TRY(ap__onnx_get_scalar(im, v, "Pad constant_value", &value));
		TRY(ap__onnx_get_in(im, n, 3, false, &v));
		if (v)
			TRY(ap__onnx_get_ints(im, v, "Pad axes", axes, AP_MAX_RANK, &na));
	}
	if (strcmp(mode, "constant") && strcmp(mode, "reflect") && strcmp(mode, "edge"))
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "Pad: mode '%s'", mode);
	for (int i = 0; i < 2 * r; i++)
		pads[i] = 0;
	if (na) {
		if (cnt != 2 * na)
			return ap__onnx_fail(im, AP_EINVAL, NULL, "Pad: %d pads for %d axes", cnt,
					     na);
		for (int i = 0; i < na; i++) {
			int64_t a;

			TRY(ap__onnx_norm_axis(im, axes[i], r, &a));
			pads[a] = raw[i];
			pads[r + a] = raw[na + i];
		}
	} else {
		if (cnt != 2 * r)
			return ap__onnx_fail(im, AP_EINVAL, NULL, "Pad: %d pads for rank %d", cnt,
					     r);
		memcpy(pads, raw, (size_t)cnt * sizeof(int64_t));
	}
	for (int i = 0; i < 2 * r; i++)
		if (pads[i])
			zero = false;
	if (zero)
		return ap__onnx_bind(im, out_name(n, 0), x);
	ab_ints(&A, "pads", pads, 2 * r);
	ab_str(&A, "mode", strcmp(mode, "reflect") == 0 ? "reflect" :
			   strcmp(mode, "edge") == 0 ? "edge" : "constant");
	ab_float(&A, "value", value);
	TRY(ap__onnx_emit1(im, AP_OP_PAD, &A, 1, &x, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

/* GatherElements, ScatterElements (and opset 9-10 Scatter), ScatterND. */
int ap__onnx_imp_elements(imp *im, const Onnx__NodeProto *n, ap_op op)
{
	ival *in[3], *y;
	int n_in = op == AP_OP_GATHER_ELEMENTS ? 2 : 3;
	char buf[16];
	const char *red = ap__onnx_astr(n, "reduction", "none", buf, sizeof(buf));
	int64_t axis;
	abuf A;

	A.n = 0;
	for (int i = 0; i < n_in; i++)
		TRY(ap__onnx_get_in(im, n, (size_t)i, true, &in[i]));
	if (op != AP_OP_SCATTER_ND) {
		TRY(ap__onnx_norm_axis(im, ap__onnx_aint(n, "axis", 0), in[0]->sh.rank, &axis));
		ab_int(&A, "axis", axis);
	}
	if (op != AP_OP_GATHER_ELEMENTS)
		ab_str(&A, "reduction", red);
	TRY(ap__onnx_emit1(im, op, &A, n_in, in, out_name(n, 0), NULL, &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}

/* DepthToSpace (DCR or CRD) and SpaceToDepth on [N, C, H, W]: a reshape to
 * rank 6, a transpose, a reshape back (ONNX operator specification). */
int ap__onnx_imp_depth_space(imp *im, const Onnx__NodeProto *n, bool to_space)
{
	ival *x, *a, *b, *y;
	int64_t bs = ap__onnx_aint(n, "blocksize", 0), d6[6], perm[6], d4[4], N, C, H, W;
	char buf[8], nm[NAME_CAP];
	bool crd = strcmp(ap__onnx_astr(n, "mode", "DCR", buf, sizeof(buf)), "CRD") == 0;

	TRY(ap__onnx_get_in(im, n, 0, true, &x));
	if (x->sh.rank != 4 || bs < 1)
		return ap__onnx_fail(im, AP_EINVAL, x->name,
				     "%s needs a rank-4 input and blocksize >= 1 (%lld)",
				     n->op_type, (long long)bs);
	N = x->sh.dims[0];
	C = x->sh.dims[1];
	H = x->sh.dims[2];
	W = x->sh.dims[3];
	if (to_space) {
		if (C % (bs * bs))
			return ap__onnx_fail(im, AP_ESHAPE, x->name,
					     "DepthToSpace: %lld channels for blocksize %lld",
					     (long long)C, (long long)bs);
		if (crd) {
			int64_t s[6] = { N, C / (bs * bs), bs, bs, H, W }, p[6] = { 0, 1, 4, 2, 5, 3 };
			memcpy(d6, s, sizeof(s));
			memcpy(perm, p, sizeof(p));
		} else {
			int64_t s[6] = { N, bs, bs, C / (bs * bs), H, W }, p[6] = { 0, 3, 4, 1, 5, 2 };
			memcpy(d6, s, sizeof(s));
			memcpy(perm, p, sizeof(p));
		}
		d4[0] = N; d4[1] = C / (bs * bs); d4[2] = H * bs; d4[3] = W * bs;
	} else {
		int64_t s[6] = { N, C, H / bs, bs, W / bs, bs }, p[6] = { 0, 3, 5, 1, 2, 4 };

		if (crd) {
			/* channel, then row and column offsets within the block */
			p[1] = 1; p[2] = 3; p[3] = 5; p[4] = 2; p[5] = 4;
		}
		if (H % bs || W % bs)
			return ap__onnx_fail(im, AP_ESHAPE, x->name,
					     "SpaceToDepth: %lldx%lld for blocksize %lld",
					     (long long)H, (long long)W, (long long)bs);
		memcpy(d6, s, sizeof(s));
		memcpy(perm, p, sizeof(p));
		d4[0] = N; d4[1] = C * bs * bs; d4[2] = H / bs; d4[3] = W / bs;
	}
	snprintf(nm, sizeof(nm), "%.200s_split", out_name(n, 0));
	TRY(ap__onnx_reshape_to(im, x, 6, d6, nm, &a));
	snprintf(nm, sizeof(nm), "%.200s_perm", out_name(n, 0));
	TRY(ap__onnx_transpose_to(im, a, perm, nm, &b));
	TRY(ap__onnx_reshape_to(im, b, 4, d4, out_name(n, 0), &y));
	return ap__onnx_bind(im, out_name(n, 0), y);
}
