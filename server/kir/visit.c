/* visit.c -- a read-only walk over a kernel's statements and expressions
 * (see ap_kir_visit in kir.h).
 *
 * Statements are visited in program order, each before the statements
 * nested in it; a statement's expressions right after the statement
 * itself, each tree children first.  The walk recurses as deep as the IR
 * nests, as the printers do.
 */
#include "kir.h"

static int visit_expr(const ap_kir_expr *e, const ap_kir_stmt *s, const ap_kir_visitor *v,
		      void *user)
{
	int rc;

	if (!e)
		return 0;
	if ((rc = visit_expr(e->a, s, v, user)) || (rc = visit_expr(e->b, s, v, user)) ||
	    (rc = visit_expr(e->c, s, v, user)))
		return rc;
	return v->expr(e, s, user);
}

/* The expressions of one statement, in field order. */
static int visit_stmt_exprs(const ap_kir_stmt *s, const ap_kir_visitor *v, void *user)
{
	int rc = 0;

	switch (s->kind) {
	case AP_KIR_S_FOR:
		if (!(rc = visit_expr(s->lo, s, v, user)))
			rc = visit_expr(s->hi, s, v, user);
		break;
	case AP_KIR_S_IF:
		rc = visit_expr(s->cond, s, v, user);
		break;
	case AP_KIR_S_LET:
	case AP_KIR_S_ASSIGN:
		rc = visit_expr(s->value, s, v, user);
		break;
	case AP_KIR_S_STORE:
		if (!(rc = visit_expr(s->index, s, v, user)))
			rc = visit_expr(s->value, s, v, user);
		break;
	case AP_KIR_S_SHFL:
		if (!(rc = visit_expr(s->value, s, v, user)))
			rc = visit_expr(s->lane, s, v, user);
		break;
	case AP_KIR_S_VLOAD:
		rc = visit_expr(s->index, s, v, user);
		break;
	case AP_KIR_S_VSTORE:
		rc = visit_expr(s->index, s, v, user);
		for (int i = 0; !rc && s->values && i < s->width; i++)
			rc = visit_expr(s->values[i], s, v, user);
		break;
	case AP_KIR_S_CP_ASYNC:
		if (!(rc = visit_expr(s->index, s, v, user)) && !(rc = visit_expr(s->src_index, s, v, user)))
			rc = visit_expr(s->cond, s, v, user);
		break;
	case AP_KIR_S_LDMATRIX:
		if (!(rc = visit_expr(s->index, s, v, user)))
			rc = visit_expr(s->src_index, s, v, user);
		break;
	case AP_KIR_S_MMA:
		for (int i = 0; !rc && i < 4; i++)
			rc = visit_expr(s->frag_off[i], s, v, user);
		break;
	case AP_KIR_S_WGMMA:
		for (int i = 0; !rc && i < 3; i++)
			rc = visit_expr(s->frag_off[i], s, v, user);
		break;
	case AP_KIR_S_MBAR_INIT:
	case AP_KIR_S_MBAR_ARRIVE:
	case AP_KIR_S_MBAR_WAIT:
		if (!(rc = visit_expr(s->index, s, v, user)))
			rc = visit_expr(s->value, s, v, user);
		break;
	case AP_KIR_S_TMA_LOAD:
		rc = visit_expr(s->index, s, v, user);
		for (int i = 0; !rc && s->values && i < s->width; i++)
			rc = visit_expr(s->values[i], s, v, user);
		if (!rc)
			rc = visit_expr(s->bar_index, s, v, user);
		break;
	case AP_KIR_S_BULK_COPY:
		if (!(rc = visit_expr(s->index, s, v, user)) && !(rc = visit_expr(s->src_index, s, v, user)))
			rc = visit_expr(s->bar_index, s, v, user);
		break;
	case AP_KIR_S_WGMMA_FENCE:
	case AP_KIR_S_WGMMA_COMMIT:
	case AP_KIR_S_WGMMA_WAIT:
	case AP_KIR_S_FENCE_ASYNC:
		break;
	case AP_KIR_S_BARRIER:
	case AP_KIR_S_CLUSTER_BARRIER:
	case AP_KIR_S_COMMENT:
	case AP_KIR_S_CP_COMMIT:
	case AP_KIR_S_CP_WAIT:
	case AP_KIR_S_ROLES:
	case AP_KIR_S_ARM:
		break;
	}
	return rc;
}

static int visit_block(const ap_kir_block *b, int depth, const ap_kir_visitor *v, void *user)
{
	int rc;

	for (const ap_kir_stmt *s = b->first; s; s = s->next) {
		if (v->stmt && (rc = v->stmt(s, depth, user)))
			return rc;
		if (v->expr && (rc = visit_stmt_exprs(s, v, user)))
			return rc;
		if (s->kind == AP_KIR_S_FOR || s->kind == AP_KIR_S_IF || s->kind == AP_KIR_S_ROLES ||
		    s->kind == AP_KIR_S_ARM) {
			if ((rc = visit_block(&s->body, depth + 1, v, user)) ||
			    (rc = visit_block(&s->orelse, depth + 1, v, user)))
				return rc;
		}
	}
	return 0;
}

int ap_kir_visit_range(const ap_kir_stmt *first, const ap_kir_stmt *end, const ap_kir_visitor *v, void *user)
{
	int rc;

	for (const ap_kir_stmt *s = first; s && s != end; s = s->next) {
		if (v->stmt && (rc = v->stmt(s, 0, user)))
			return rc;
		if (v->expr && (rc = visit_stmt_exprs(s, v, user)))
			return rc;
		if (s->kind == AP_KIR_S_FOR || s->kind == AP_KIR_S_IF || s->kind == AP_KIR_S_ROLES ||
		    s->kind == AP_KIR_S_ARM) {
			if ((rc = visit_block(&s->body, 1, v, user)) || (rc = visit_block(&s->orelse, 1, v, user)))
				return rc;
		}
	}
	return 0;
}

int ap_kir_visit(const ap_kir_kernel *k, const ap_kir_visitor *v, void *user)
{
	if (!k || !v)
		return 0;
	return visit_block(&k->body, 0, v, user);
}
