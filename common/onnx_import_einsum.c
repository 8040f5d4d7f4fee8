/* onnx_import_einsum.c -- the importer of ONNX Einsum
 * (https://onnx.ai/onnx/operators/onnx__Einsum.html; numpy.einsum's
 * rules) as a plain contraction: one or two operands, no label repeated
 * within an operand (no diagonals), "..." allowed, explicit or implicit
 * output.  Labels only one operand has and the output lacks are summed
 * first (ReduceSum); then the operands are transposed to [batch, free,
 * contracted] / [batch, contracted, free], reshaped to 3 groups,
 * multiplied (MatMul) and the result reshaped and transposed to the
 * output's order.
 */
#include "onnx_import_internal.h"

#include <stdio.h>
#include <string.h>

/* Einsum as a plain contraction (ONNX Einsum; numpy.einsum's rules): one or
 * two operands, no label repeated within an operand, "..." allowed.  Labels
 * only one operand has and the output lacks are summed first; then the
 * operands are transposed to [batch, free, contracted] / [batch,
 * contracted, free], reshaped to 3 groups, multiplied (MatMul) and the
 * result reshaped and transposed to the output's order. */
#define EIN_MAX (2 * AP_MAX_RANK)
typedef struct ein_op {
	char lab[EIN_MAX];
	int n;
} ein_op;

/* Parses one operand's labels (letters; "..." becomes the ellipsis labels
 * '0'.. right-aligned over `ell` dims) for an operand of rank `rank`. */
static int ein_parse(imp *im, const char *s, size_t len, int rank, int ell, ein_op *o)
{
	int explicit_n = 0, total;
	bool has_ell = false;

	o->n = 0;
	for (size_t i = 0; i < len; i++) {
		if (s[i] == '.') {
			if (i + 2 >= len || s[i + 1] != '.' || s[i + 2] != '.' || has_ell)
				return ap__onnx_fail(im, AP_EINVAL, NULL, "Einsum: bad ellipsis");
			has_ell = true;
			i += 2;
			continue;
		}
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
			return ap__onnx_fail(im, AP_EINVAL, NULL, "Einsum: bad label '%c'", s[i]);
		explicit_n++;
	}
	if (rank >= 0 && (has_ell ? explicit_n > rank : explicit_n != rank))
		return ap__onnx_fail(im, AP_ESHAPE, NULL,
				     "Einsum: %d labels for an operand of rank %d", explicit_n,
				     rank);
	/* the labels this term will hold: o->lab has room for EIN_MAX */
	total = explicit_n + (has_ell ? (rank >= 0 ? rank - explicit_n : ell) : 0);
	if (total > AP_MAX_RANK)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL,
				     "Einsum: %d labels in one term (at most %d)", total,
				     AP_MAX_RANK);
	for (size_t i = 0; i < len; i++) {
		if (s[i] == '.') {
			int e = rank >= 0 ? rank - explicit_n : ell;

			for (int k = 0; k < e; k++)
				o->lab[o->n++] = (char)('0' + (ell - e) + k);
			i += 2;
			continue;
		}
		for (int k = 0; k < o->n; k++)
			if (o->lab[k] == s[i])
				return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL,
						     "Einsum: label '%c' repeated in one operand (a diagonal)",
						     s[i]);
		o->lab[o->n++] = s[i];
	}
	return 0;
}

static int ein_find(const ein_op *o, char c)
{
	for (int k = 0; k < o->n; k++)
		if (o->lab[k] == c)
			return k;
	return -1;
}

/* Sums x (labels o) over the labels that `keep` does not mark. */
static int ein_sum_out(imp *im, ival **x, ein_op *o, const bool *keep, const char *base)
{
	ival *s;
	int64_t axes[EIN_MAX];
	int na = 0, m = 0;
	char nm[NAME_CAP];
	abuf A;

	for (int k = 0; k < o->n; k++)
		if (!keep[k])
			axes[na++] = k;
	if (!na)
		return 0;
	A.n = 0;
	ab_ints(&A, "axes", axes, na);
	ab_int(&A, "keepdims", 0);
	snprintf(nm, sizeof(nm), "%.200s_sum", base);
	TRY(ap__onnx_emit1(im, AP_OP_REDUCE_SUM, &A, 1, x, nm, NULL, &s));
	*x = s;
	for (int k = 0; k < o->n; k++)
		if (keep[k])
			o->lab[m++] = o->lab[k];
	o->n = m;
	return 0;
}

/* Reads n's equation into eq (at most 255 bytes) and, without spaces, into
 * cleaned; *arrow and *comma point into cleaned ("->" and ',', NULL when
 * absent).  AP_EINVAL when the attribute is missing or the equation's
 * operand count is not n_ops. */
static int ein_equation(imp *im, const Onnx__NodeProto *n, int n_ops, char *eq, char *cleaned,
			const char **arrow, const char **comma)
{
	*arrow = *comma = NULL;
	/* a missing equation leaves eq unwritten: refused, never read */
	if (ap__onnx_astr(n, "equation", NULL, eq, 256) == NULL)
		return ap__onnx_fail(im, AP_EINVAL, NULL, "Einsum: no 'equation' attribute");
	for (size_t i = 0, j = 0; i <= strlen(eq); i++)
		if (eq[i] != ' ')
			cleaned[j++] = eq[i];
	*arrow = strstr(cleaned, "->");
	*comma = strchr(cleaned, ',');
	if ((n_ops == 2) != (*comma != NULL && (!*arrow || *comma < *arrow)))
		return ap__onnx_fail(im, AP_EINVAL, NULL, "Einsum: equation '%s' for %d operands",
				     eq, n_ops);
	return 0;
}

/* Where operand i's term ends in the cleaned equation. */
static const char *ein_term_end(const char *cleaned, const char *arrow, const char *comma,
				int n_ops, int i)
{
	return i == 0 && n_ops == 2 ? comma : arrow ? arrow : cleaned + strlen(cleaned);
}

/* Parses the operands' terms of the cleaned equation into op[] for the
 * operands x[]; *ell receives the ellipsis rank (the most dims "..."
 * stands for in any operand).  Errors as ein_parse. */
static int ein_terms(imp *im, const char *cleaned, const char *arrow, const char *comma,
		     int n_ops, ival *const *x, ein_op *op, int *ell)
{
	const char *s = cleaned;
	int maxe = 0;

	for (int i = 0; i < n_ops; i++) {
		const char *e = ein_term_end(cleaned, arrow, comma, n_ops, i);
		int cnt = 0;
		bool has = false;

		for (const char *p = s; p < e; p++) {
			if (*p == '.') {
				has = true;
				p += 2;
			} else {
				cnt++;
			}
		}
		if (has && x[i]->sh.rank - cnt > maxe)
			maxe = x[i]->sh.rank - cnt;
		s = e + 1;
	}
	*ell = maxe;
	s = cleaned;
	for (int i = 0; i < n_ops; i++) {
		const char *e = ein_term_end(cleaned, arrow, comma, n_ops, i);

		TRY(ein_parse(im, s, (size_t)(e - s), x[i]->sh.rank, maxe, &op[i]));
		s = e + 1;
	}
	return 0;
}

/* The output's labels: after "->" when explicit, else the ellipsis then
 * the labels seen once, sorted.  Errors as ein_parse; AP_EINVAL for an
 * output label in no operand. */
static int ein_output(imp *im, const char *arrow, int ell, int n_ops, const ein_op *op,
		      ein_op *out)
{
	if (arrow) {
		TRY(ein_parse(im, arrow + 2, strlen(arrow + 2), -1, ell, out));
	} else {
		/* implicit: the ellipsis, then the labels seen once, sorted */
		out->n = 0;
		for (int k = 0; k < ell; k++)
			out->lab[out->n++] = (char)('0' + k);
		for (char c = 'A'; c <= 'z'; c++) {
			int seen = 0;

			if (c > 'Z' && c < 'a')
				continue;
			for (int i = 0; i < n_ops; i++)
				seen += ein_find(&op[i], c) >= 0;
			if (seen == 1)
				out->lab[out->n++] = c;
		}
	}
	for (int k = 0; k < out->n; k++) {
		bool found = false;

		for (int i = 0; i < n_ops; i++)
			found |= ein_find(&op[i], out->lab[k]) >= 0;
		if (!found)
			return ap__onnx_fail(im, AP_EINVAL, NULL,
					     "Einsum: output label '%c' is in no operand",
					     out->lab[k]);
	}
	return 0;
}

/* Checks that a label both operands have has one size (AP_ESHAPE), then
 * sums each operand over the labels only it has and the output lacks
 * (x[i] and op[i] replaced). */
static int ein_presum(imp *im, ival **x, ein_op *op, const ein_op *out, int n_ops,
		      const char *base)
{
	char nm[NAME_CAP];

	for (int k = 0; n_ops == 2 && k < op[0].n; k++) {
		int j = ein_find(&op[1], op[0].lab[k]);

		if (j >= 0 && x[0]->sh.dims[k] != x[1]->sh.dims[j])
			return ap__onnx_fail(im, AP_ESHAPE, x[1]->name,
					     "Einsum: label '%c' is %lld and %lld", op[0].lab[k],
					     (long long)x[0]->sh.dims[k],
					     (long long)x[1]->sh.dims[j]);
	}
	for (int i = 0; i < n_ops; i++) {
		bool keep[EIN_MAX];

		for (int k = 0; k < op[i].n; k++)
			keep[k] = ein_find(out, op[i].lab[k]) >= 0 ||
				  (n_ops == 2 && ein_find(&op[1 - i], op[i].lab[k]) >= 0);
		snprintf(nm, sizeof(nm), "%.200s_%d", base, i);
		TRY(ein_sum_out(im, &x[i], &op[i], keep, nm));
	}
	return 0;
}

/* One operand x (labels op, every one in the output after ein_presum):
 * a transpose to the output's order, an Identity when that is x itself. */
static int ein_one(imp *im, ival *x, const ein_op *op, const ein_op *out, const char *base,
		   ival **y)
{
	int64_t perm[EIN_MAX];

	for (int k = 0; k < out->n; k++)
		perm[k] = ein_find(op, out->lab[k]);
	if (out->n != op->n)
		return ap__onnx_fail(im, AP_EINTERNAL, NULL, "Einsum: labels lost");
	TRY(ap__onnx_transpose_to(im, x, perm, base, y));
	if (*y == x)
		TRY(ap__onnx_emit1(im, AP_OP_IDENTITY, NULL, 1, &x, base, NULL, y));
	return 0;
}

/* The labels of a two-operand contraction by role: batch (in both
 * operands and the output), free (in one operand and the output: fa of
 * operand 0, fb of operand 1), contracted (in both operands, not the
 * output). */
typedef struct ein_groups {
	char bat[EIN_MAX], fa[EIN_MAX], fb[EIN_MAX], con[EIN_MAX];
	int nb, nfa, nfb, nc;
} ein_groups;

/* Sorts the labels of op[0], op[1] into g by role (each group in the
 * order of the output, or of the operand for fa, fb and con).
 * AP_EUNSUPPORTED when the MatMul or the result would exceed
 * AP_MAX_RANK. */
static int ein_classify(imp *im, const ein_op *op, const ein_op *out, ein_groups *g)
{
	g->nb = g->nfa = g->nfb = g->nc = 0;
	for (int k = 0; k < out->n; k++) {
		if (ein_find(&op[0], out->lab[k]) >= 0 && ein_find(&op[1], out->lab[k]) >= 0)
			g->bat[g->nb++] = out->lab[k];
	}
	for (int k = 0; k < op[0].n; k++) {
		char l = op[0].lab[k];

		if (ein_find(&op[1], l) < 0)
			g->fa[g->nfa++] = l;
		else if (ein_find(out, l) < 0)
			g->con[g->nc++] = l;
	}
	for (int k = 0; k < op[1].n; k++)
		if (ein_find(&op[0], op[1].lab[k]) < 0)
			g->fb[g->nfb++] = op[1].lab[k];
	if (g->nb + 2 > AP_MAX_RANK || g->nb + g->nfa + g->nfb > AP_MAX_RANK)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL, "Einsum: too many dimensions");
	return 0;
}

/* The MatMul of the two operands x[] (labels op[], roles g): operand 0
 * transposed to [batch, fa, con] and reshaped to [batch, M, K], operand 1
 * to [batch, con, fb] and [batch, K, N]; *c is [batch, M, N]. */
static int ein_matmul(imp *im, ival *const *x, const ein_op *op, const ein_groups *g,
		      const char *base, ival **c)
{
	int64_t pa[EIN_MAX], pb[EIN_MAX], da[AP_MAX_RANK], db[AP_MAX_RANK];
	int64_t M = 1, N = 1, K = 1;
	int nb = g->nb;
	ival *a, *b, *pair[2];
	char nm[NAME_CAP];

	for (int k = 0; k < nb; k++) {
		pa[k] = ein_find(&op[0], g->bat[k]);
		pb[k] = ein_find(&op[1], g->bat[k]);
		da[k] = db[k] = x[0]->sh.dims[pa[k]];
	}
	for (int k = 0; k < g->nfa; k++) {
		pa[nb + k] = ein_find(&op[0], g->fa[k]);
		M *= x[0]->sh.dims[pa[nb + k]];
	}
	for (int k = 0; k < g->nc; k++) {
		pa[nb + g->nfa + k] = ein_find(&op[0], g->con[k]);
		pb[nb + k] = ein_find(&op[1], g->con[k]);
		K *= x[0]->sh.dims[pa[nb + g->nfa + k]];
	}
	for (int k = 0; k < g->nfb; k++) {
		pb[nb + g->nc + k] = ein_find(&op[1], g->fb[k]);
		N *= x[1]->sh.dims[pb[nb + g->nc + k]];
	}
	snprintf(nm, sizeof(nm), "%.200s_a", base);
	TRY(ap__onnx_transpose_to(im, x[0], pa, nm, &a));
	da[nb] = M;
	da[nb + 1] = K;
	snprintf(nm, sizeof(nm), "%.200s_a2", base);
	TRY(ap__onnx_reshape_to(im, a, nb + 2, da, nm, &a));
	snprintf(nm, sizeof(nm), "%.200s_b", base);
	TRY(ap__onnx_transpose_to(im, x[1], pb, nm, &b));
	db[nb] = K;
	db[nb + 1] = N;
	snprintf(nm, sizeof(nm), "%.200s_b2", base);
	TRY(ap__onnx_reshape_to(im, b, nb + 2, db, nm, &b));
	pair[0] = a;
	pair[1] = b;
	snprintf(nm, sizeof(nm), "%.200s_mm", base);
	return ap__onnx_emit1(im, AP_OP_MATMUL, NULL, 2, pair, nm, NULL, c);
}

/* The MatMul's result c ([batch, M, N]) reshaped to [batch, fa, fb] and
 * transposed to the output's order (*y, named base). */
static int ein_result(imp *im, ival *c, ival *const *x, const ein_op *op, const ein_op *out,
		      const ein_groups *g, const char *base, ival **y)
{
	int64_t dc[EIN_MAX], pc[EIN_MAX];
	ein_op res;
	char nm[NAME_CAP];

	res.n = 0;
	for (int k = 0; k < g->nb; k++) {
		dc[res.n] = x[0]->sh.dims[ein_find(&op[0], g->bat[k])];
		res.lab[res.n++] = g->bat[k];
	}
	for (int k = 0; k < g->nfa; k++) {
		dc[res.n] = x[0]->sh.dims[ein_find(&op[0], g->fa[k])];
		res.lab[res.n++] = g->fa[k];
	}
	for (int k = 0; k < g->nfb; k++) {
		dc[res.n] = x[1]->sh.dims[ein_find(&op[1], g->fb[k])];
		res.lab[res.n++] = g->fb[k];
	}
	snprintf(nm, sizeof(nm), "%.200s_c", base);
	TRY(ap__onnx_reshape_to(im, c, res.n, dc, nm, &c));
	for (int k = 0; k < out->n; k++)
		pc[k] = ein_find(&res, out->lab[k]);
	return ap__onnx_transpose_to(im, c, pc, base, y);
}

int ap__onnx_imp_einsum(imp *im, const Onnx__NodeProto *n)
{
	char eq[256], cleaned[256];
	const char *arrow, *comma;
	ein_op op[2], out;
	ival *x[2], *y, *c;
	int n_ops = (int)n->n_input, ell;
	const char *base = out_name(n, 0);
	ein_groups g;

	if (n_ops < 1 || n_ops > 2)
		return ap__onnx_fail(im, AP_EUNSUPPORTED, NULL,
				     "Einsum of %d operands (1 or 2 supported)", n_ops);
	TRY(ein_equation(im, n, n_ops, eq, cleaned, &arrow, &comma));
	for (int i = 0; i < n_ops; i++)
		TRY(ap__onnx_get_in(im, n, (size_t)i, true, &x[i]));
	TRY(ein_terms(im, cleaned, arrow, comma, n_ops, x, op, &ell));
	TRY(ein_output(im, arrow, ell, n_ops, op, &out));
	TRY(ein_presum(im, x, op, &out, n_ops, base));
	if (n_ops == 1) {
		TRY(ein_one(im, x[0], &op[0], &out, base, &y));
		return ap__onnx_bind(im, base, y);
	}
	TRY(ein_classify(im, op, &out, &g));
	TRY(ein_matmul(im, x, op, &g, base, &c));
	TRY(ein_result(im, c, x, op, &out, &g, base, &y));
	return ap__onnx_bind(im, base, y);
}
