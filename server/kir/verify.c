/* verify.c -- the kernel IR's rules, checked on a whole kernel (see
 * ap_kir_verify in kir.h for the list).
 *
 * Builders check what they can see locally (a step, a width); the rules
 * here need context: which variables are in scope, and which values are
 * the same in every thread of a block.  Three steps:
 *   1. the launch shape and the shared memory size;
 *   2. uniformity, a fixed point: a register is thread-dependent when some
 *      declaration or assignment gives it a thread-dependent value, or
 *      happens under thread-dependent control flow; repeat until nothing
 *      changes (the set only grows, so this ends after at most one round
 *      per register);
 *   3. one walk in program order with a scope (the registers declared so
 *      far in the enclosing lists), checking every statement and
 *      expression, each barrier and shuffle against the uniformity of
 *      its control flow.
 *   4. the registers of wgmma in flight (rule wgmma_regs): a walk that
 *      keeps, per commit group still pending, the register arrays its
 *      wgmmas write or read, and reports any other statement touching one
 *      (a loop that commits or waits walked twice, others once).
 * The first violation is reported, as "kernel NAME: rule RULE: what".
 */
#include "kir_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct vctx {
	const ap_kir_kernel *k;
	ap_kir_limits lim;
	ap_error *err;
	int rc;                      /* first violation (AP_EINTERNAL) */
	unsigned char *in_scope;     /* per var id */
	unsigned char *declared;     /* per var id: declared once already */
	unsigned char *varying;      /* per var id: may differ between threads */
	bool changed;
	const ap_kir_stmt *arm;      /* the ARM being checked (rule role); NULL outside */
	int n_roles;                 /* ROLES statements so far */
} vctx;

static void bad(vctx *v, const char *rule, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void bad(vctx *v, const char *rule, const char *fmt, ...)
{
	char what[384];
	va_list ap;

	if (v->rc)
		return;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	v->rc = ap_error_set(v->err, AP_EINTERNAL, NULL, NULL, "kernel %s: rule %s: %s",
			     v->k->name, rule, what);
}

static bool is_int(ap_dtype t)
{
	return t == AP_DT_I64 || t == AP_DT_I32 || t == AP_DT_I8 || t == AP_DT_U8;
}

static bool var_ok(const vctx *v, const ap_kir_var *var)
{
	return var && var->id >= 0 && var->id < v->k->n_vars;
}

/* ---- 1. launch shape and shared memory --------------------------------------- */

static void check_launch(vctx *v)
{
	const ap_kir_kernel *k = v->k;
	uint64_t threads = 1, bytes = ap_kir_shared_bytes(k);

	for (int i = 0; i < 3; i++) {
		if (k->grid[i] < 1 || k->block[i] < 1) {
			bad(v, "launch", "grid %ux%ux%u, block %ux%ux%u: every extent must be >= 1",
			    k->grid[0], k->grid[1], k->grid[2], k->block[0], k->block[1], k->block[2]);
			return;
		}
		threads *= k->block[i];
	}
	if (k->cluster < 1 || k->cluster > 8 || k->grid[0] % k->cluster ||
	    (k->cluster > 1 && (k->grid[1] > 1 || k->grid[2] > 1))) {
		bad(v, "launch", "cluster of %u blocks over a grid %ux%ux%u (1..8 along x, a divisor of grid x)",
		    k->cluster, k->grid[0], k->grid[1], k->grid[2]);
		return;
	}
	if (threads > v->lim.max_threads)
		bad(v, "launch", "%llu threads per block, more than %u", (unsigned long long)threads,
		    v->lim.max_threads);
	if (bytes > v->lim.max_shared_bytes)
		bad(v, "shared", "%llu bytes of shared memory (static and dynamic, each array "
		    "16-byte aligned), more than %u",
		    (unsigned long long)bytes, v->lim.max_shared_bytes);
}

/* ---- 2. uniformity ------------------------------------------------------------- */

static bool uniform_space(ap_kir_space s)
{
	return s == AP_KIR_SHARED || s == AP_KIR_SHARED_DYN || s == AP_KIR_CONST;
}

/* The same value in every thread of a block (under uniform control flow). */
static bool uniform(const vctx *v, const ap_kir_expr *e)
{
	if (!e)
		return true;
	switch (e->kind) {
	case AP_KIR_E_INT:
	case AP_KIR_E_FLOAT:
		return true;
	case AP_KIR_E_INDEX:
		/* a thread index of extent 1 is printed as 0; a cluster rank is
		 * the same in a block, but not in the host's wide block */
		if (e->op == AP_KIR_CLUSTER_RANK)
			return v->k->cluster == 1;
		return e->op < AP_KIR_THREAD_X || e->op > AP_KIR_THREAD_Z ||
		       v->k->block[e->op - AP_KIR_THREAD_X] == 1;
	case AP_KIR_E_VAR:
		return var_ok(v, e->var) && !v->varying[e->var->id];
	case AP_KIR_E_LOAD:
		return uniform_space(e->arr->space) && uniform(v, e->a) && uniform(v, e->c);
	default:
		return uniform(v, e->a) && uniform(v, e->b) && uniform(v, e->c);
	}
}

static void mark_varying(vctx *v, const ap_kir_var *var)
{
	if (var_ok(v, var) && !v->varying[var->id]) {
		v->varying[var->id] = 1;
		v->changed = true;
	}
}

static void find_varying(vctx *v, const ap_kir_block *b, bool ctx)
{
	for (const ap_kir_stmt *s = b->first; s; s = s->next) {
		bool inner;

		switch (s->kind) {
		case AP_KIR_S_FOR:
			inner = ctx && uniform(v, s->lo) && uniform(v, s->hi);
			if (!inner)
				mark_varying(v, s->var);
			find_varying(v, &s->body, inner);
			break;
		case AP_KIR_S_IF:
			inner = ctx && uniform(v, s->cond);
			find_varying(v, &s->body, inner);
			find_varying(v, &s->orelse, inner);
			break;
		case AP_KIR_S_ROLES:   /* an arm's body: uniform over the arm's threads */
		case AP_KIR_S_ARM:
			find_varying(v, &s->body, ctx);
			break;
		case AP_KIR_S_LET:
		case AP_KIR_S_ASSIGN:
			if (!ctx || !uniform(v, s->value))
				mark_varying(v, s->var);
			break;
		case AP_KIR_S_SHFL:
			mark_varying(v, s->var);
			break;
		case AP_KIR_S_VLOAD:
			inner = ctx && uniform_space(s->arr->space) && uniform(v, s->index);
			for (int i = 0; !inner && s->vars && i < s->width; i++)
				mark_varying(v, s->vars[i]);
			break;
		default:
			break;
		}
	}
}

/* ---- 3. scopes, types and the rest ----------------------------------------------- */

static void check_bounds(vctx *v, const ap_kir_array *a, const ap_kir_expr *index, int n)
{
	int64_t i;

	if (a->space == AP_KIR_GLOBAL || !ap_kir_is_int(index, &i))
		return;
	if (i < 0 || i + n > a->size)
		bad(v, "bounds", "constant index %lld%s outside %s[%lld]", (long long)i,
		    n > 1 ? " (vector)" : "", a->name, (long long)a->size);
}

static void use_var(vctx *v, const ap_kir_var *var, const char *how)
{
	if (!var_ok(v, var) || !v->in_scope[var->id])
		bad(v, "scope", "variable %s %s outside the scope of its declaration",
		    var ? var->name : "(null)", how);
}

static void declare(vctx *v, const ap_kir_var *var)
{
	if (!var_ok(v, var)) {
		bad(v, "scope", "variable %s does not belong to the kernel", var ? var->name : "(null)");
		return;
	}
	if (v->declared[var->id])
		bad(v, "scope", "variable %s declared twice", var->name);
	v->declared[var->id] = 1;
	v->in_scope[var->id] = 1;
}

static bool result_bool(int op)
{
	return op >= AP_KIR_LT && op <= AP_KIR_LOR;
}

static bool needs_int(int op)
{
	return op == AP_KIR_REM || op >= AP_KIR_AND;
}

static void check_expr(vctx *v, const ap_kir_expr *e)
{
	if (!e || v->rc)
		return;
	check_expr(v, e->a);
	check_expr(v, e->b);
	check_expr(v, e->c);
	switch (e->kind) {
	case AP_KIR_E_VAR:
		use_var(v, e->var, "used");
		break;
	case AP_KIR_E_UNARY:
		if (e->type != (e->op == AP_KIR_LNOT ? AP_DT_BOOL : e->a->type))
			bad(v, "types", "unary operator %d of %s gives %s", e->op,
			    ap_dtype_name(e->a->type), ap_dtype_name(e->type));
		break;
	case AP_KIR_E_BINARY:
		if (e->a->type != e->b->type)
			bad(v, "types", "binary operator %d on %s and %s", e->op,
			    ap_dtype_name(e->a->type), ap_dtype_name(e->b->type));
		else if (needs_int(e->op) && ap_kir_is_float_type(e->a->type))
			bad(v, "types", "integer operator %d on %s", e->op, ap_dtype_name(e->a->type));
		else if (e->type != (result_bool(e->op) ? AP_DT_BOOL : e->a->type))
			bad(v, "types", "binary operator %d on %s gives %s", e->op,
			    ap_dtype_name(e->a->type), ap_dtype_name(e->type));
		break;
	case AP_KIR_E_SELECT:
		if (e->a->type != AP_DT_BOOL)
			bad(v, "select", "condition of type %s, not bool", ap_dtype_name(e->a->type));
		else if (e->b->type != e->c->type || e->type != e->b->type)
			bad(v, "types", "select between %s and %s", ap_dtype_name(e->b->type),
			    ap_dtype_name(e->c->type));
		break;
	case AP_KIR_E_CALL:
		if (!ap_kir_is_float_type(e->a->type) || e->type != e->a->type ||
		    (e->b && e->b->type != e->a->type))
			bad(v, "types", "math function %d on %s", e->op, ap_dtype_name(e->a->type));
		break;
	case AP_KIR_E_INDEX:
		if (v->k->cluster > 1 && e->op == AP_KIR_BLOCK_X)
			bad(v, "cluster", "blockIdx.x in a cluster kernel (use the cluster index and rank)");
		if (v->k->cluster < 2 && e->op >= AP_KIR_CLUSTER_X)
			bad(v, "cluster", "a cluster index in a kernel without clusters");
		break;
	case AP_KIR_E_LOAD:
		if (e->arr->mbar)
			bad(v, "mbarrier", "load of mbarrier array %s", e->arr->name);
		if (e->c && (v->k->cluster < 2 || !is_int(e->c->type) ||
			     (e->arr->space != AP_KIR_SHARED && e->arr->space != AP_KIR_SHARED_DYN)))
			bad(v, "cluster", "load of %s from another block's shared memory", e->arr->name);
		if (!is_int(e->a->type))
			bad(v, "types", "index of %s of type %s", e->arr->name, ap_dtype_name(e->a->type));
		else if (e->type != e->arr->type)
			bad(v, "types", "load of %s gives %s", e->arr->name, ap_dtype_name(e->type));
		check_bounds(v, e->arr, e->a, 1);
		break;
	default:
		break;
	}
}

static void check_value(vctx *v, ap_dtype want, const ap_kir_expr *e, const char *what)
{
	check_expr(v, e);
	if (e && e->type != want)
		bad(v, "types", "%s of type %s gets a value of type %s", what, ap_dtype_name(want),
		    ap_dtype_name(e->type));
}

static void check_vector(vctx *v, const ap_kir_stmt *s)
{
	int64_t i;

	check_expr(v, s->index);
	if (!is_int(s->index->type))
		bad(v, "types", "vector index of type %s", ap_dtype_name(s->index->type));
	if (!ap_kir_vector_ok(s->arr->type, s->width))
		bad(v, "vector", "%d elements of %s are not a 4, 8 or 16-byte vector", s->width,
		    ap_dtype_name(s->arr->type));
	else if (ap_kir_is_int(s->index, &i) && i % s->width)
		bad(v, "vector", "index %lld of %s is not a multiple of the width %d", (long long)i,
		    s->arr->name, s->width);
	else
		check_bounds(v, s->arr, s->index, s->width);
}

static bool uses_var(const ap_kir_expr *e, const ap_kir_var *var)
{
	if (!e)
		return false;
	if (e->kind == AP_KIR_E_VAR)
		return e->var == var;
	return uses_var(e->a, var) || uses_var(e->b, var) || uses_var(e->c, var);
}

static void check_shfl(vctx *v, const ap_kir_stmt *s, bool ctx)
{
	unsigned nt = ap_kir_block_threads(v->k);

	if (!ctx)
		bad(v, "uniform", "shuffle under thread-dependent control flow");
	use_var(v, s->var, "shuffled into");
	check_value(v, s->var->type, s->value, "shuffle destination");
	check_expr(v, s->lane);
	if (s->width < 1 || s->width > 32 || (s->width & (s->width - 1)))
		bad(v, "shuffle", "width %d is not a power of 2 in [1, 32]", s->width);
	else if (!is_int(s->lane->type))
		bad(v, "shuffle", "lane operand of type %s", ap_dtype_name(s->lane->type));
	else if (uses_var(s->value, s->var))
		bad(v, "shuffle", "destination %s used in the shuffled value", s->var->name);
	else if (nt > 32 && nt % 32)
		bad(v, "shuffle", "a block of %u threads: more than 32 and not whole warps", nt);
}

/* A warp-collective matrix statement (ldmatrix, mma): block-uniform
 * control flow, whole warps. */
static void check_warp_collective(vctx *v, const char *what, bool ctx)
{
	unsigned nt = ap_kir_block_threads(v->k);

	if (!ctx)
		bad(v, "uniform", "%s under thread-dependent control flow", what);
	else if (nt % 32)
		bad(v, "warp", "%s in a block of %u threads, not whole warps", what, nt);
}

static void check_index(vctx *v, const ap_kir_array *a, const ap_kir_expr *index, int n)
{
	check_expr(v, index);
	if (!is_int(index->type))
		bad(v, "types", "index of %s of type %s", a->name, ap_dtype_name(index->type));
	else
		check_bounds(v, a, index, n);
}

static void check_cp_async(vctx *v, const ap_kir_stmt *s)
{
	size_t bytes = ap_dtype_size(s->arr->type) * (size_t)s->width;
	int64_t i;

	if (s->arr->space != AP_KIR_SHARED && s->arr->space != AP_KIR_SHARED_DYN)
		bad(v, "async", "cp.async into %s, not a shared array", s->arr->name);
	else if (s->src->space != AP_KIR_GLOBAL)
		bad(v, "async", "cp.async from %s, not a global buffer", s->src->name);
	else if (s->src->type != s->arr->type)
		bad(v, "types", "cp.async from %s into %s of another type", s->src->name, s->arr->name);
	else if (bytes != 4 && bytes != 8 && bytes != 16)
		bad(v, "async", "cp.async of %zu bytes", bytes);
	else if ((ap_kir_is_int(s->index, &i) && i % s->width) ||
		 (ap_kir_is_int(s->src_index, &i) && i % s->width))
		bad(v, "async", "cp.async index not a multiple of its %d elements", s->width);
	if (s->cond) {
		check_expr(v, s->cond);
		if (s->cond->type != AP_DT_BOOL)
			bad(v, "types", "cp.async predicate of type %s", ap_dtype_name(s->cond->type));
	}
	check_index(v, s->arr, s->index, s->width);
	check_index(v, s->src, s->src_index, s->width);
}

static void check_ldmatrix(vctx *v, const ap_kir_stmt *s, bool ctx)
{
	size_t es = ap_dtype_size(s->src->type);
	int per = es == 2 ? 2 : 1;

	check_warp_collective(v, "ldmatrix", ctx);
	if (s->arr->space != AP_KIR_LOCAL || s->arr->scratch ||
	    (s->src->space != AP_KIR_SHARED && s->src->space != AP_KIR_SHARED_DYN))
		bad(v, "matrix", "ldmatrix from %s into %s: needs a shared source and a register array",
		    s->src->name, s->arr->name);
	else if (s->arr->type != s->src->type || (es != 2 && es != 4) || (s->trans && es != 2))
		bad(v, "types", "ldmatrix of %s into %s", ap_dtype_name(s->src->type),
		    ap_dtype_name(s->arr->type));
	else if (s->width != 1 && s->width != 2 && s->width != 4)
		bad(v, "matrix", "ldmatrix of %d matrices", s->width);
	check_index(v, s->arr, s->index, s->width * per);
	check_index(v, s->src, s->src_index, (int)(16 / es));
}

static void check_mma(vctx *v, const ap_kir_stmt *s, bool ctx)
{
	static const char *const role[4] = {"D", "A", "B", "C"};
	int n[4];

	check_warp_collective(v, "mma", ctx);
	if ((unsigned)s->mma > AP_KIR_MMA_TF32_1688) {
		bad(v, "matrix", "mma kind %d", s->mma);
		return;
	}
	ap_kir_mma_frag_sizes((ap_kir_mma_kind)s->mma, &n[1], &n[2], &n[0]);
	n[3] = n[0];
	for (int i = 0; i < 4; i++) {
		ap_dtype want = i == 1 || i == 2 ? ap__kir_mma_in_type(s->mma) : AP_DT_F32;

		if (s->frag[i]->space != AP_KIR_LOCAL || s->frag[i]->scratch)
			bad(v, "matrix", "mma %s fragment %s is not a (non-scratch) register array", role[i],
			    s->frag[i]->name);
		else if (s->frag[i]->type != want)
			bad(v, "types", "mma %s fragment %s of type %s, not %s", role[i], s->frag[i]->name,
			    ap_dtype_name(s->frag[i]->type), ap_dtype_name(want));
		check_index(v, s->frag[i], s->frag_off[i], n[i]);
	}
}

/* wgmma and its fence, commit and wait: block-uniform control flow,
 * whole warpgroups; the product's accumulators a (non-scratch) float32
 * register array holding N / 2 from the offset, A and B shared arrays of
 * the kind's type (the builder checks N and the layouts; a clone or a
 * hand-built statement is checked again here), a swizzled one a dynamic
 * shared array aligned to its pattern's repeat (rule swizzle). */
static void check_wgmma(vctx *v, const ap_kir_stmt *s, bool ctx)
{
	unsigned nt = ap_kir_block_threads(v->k);
	const ap_kir_array *d = s->frag[0];

	if (!ctx)
		bad(v, "uniform", "wgmma under thread-dependent control flow");
	else if (nt % 128)
		bad(v, "warpgroup", "wgmma in a block of %u threads, not whole warpgroups", nt);
	if (s->kind == AP_KIR_S_WGMMA_COMMIT || s->kind == AP_KIR_S_FENCE_ASYNC)
		return;
	if (d->space != AP_KIR_LOCAL || d->scratch || d->type != AP_DT_F32) {
		bad(v, "matrix", "wgmma accumulators %s are not a float32 (non-scratch) register array",
		    d->name);
		return;
	}
	if (s->kind != AP_KIR_S_WGMMA)
		return;
	if (s->width < 8 || s->width > 256 || s->width % 8 || (unsigned)s->mma > AP_KIR_WGMMA_TF32)
		bad(v, "warpgroup", "wgmma m64n%d kind %d", s->width, s->mma);
	else if (s->mma == AP_KIR_WGMMA_TF32 &&
		 (s->frag[1]->space == AP_KIR_LOCAL || s->wg[0].mn_major || s->wg[1].mn_major))
		bad(v, "warpgroup", "wgmma .tf32 takes both operands K-major from shared memory");
	for (int i = 1; i <= 2 && !v->rc; i++) {
		const ap_kir_wg_layout *l = &s->wg[i - 1];

		if (i == 1 && s->frag[1]->space == AP_KIR_LOCAL) {   /* A from registers */
			if (s->frag[1]->scratch || s->frag[1]->type != ap_kir_wgmma_type(s->mma))
				bad(v, "matrix", "wgmma A fragment %s: a (non-scratch) register array of the kind's type",
				    s->frag[1]->name);
			else
				check_index(v, s->frag[1], s->frag_off[1], 8);
			continue;
		}
		if (s->frag[i]->space != AP_KIR_SHARED && s->frag[i]->space != AP_KIR_SHARED_DYN)
			bad(v, "matrix", "wgmma operand %s is not a shared array", s->frag[i]->name);
		else if (s->frag[i]->type != ap_kir_wgmma_type(s->mma))
			bad(v, "types", "wgmma operand %s of type %s", s->frag[i]->name,
			    ap_dtype_name(s->frag[i]->type));
		else if (l->lbo < 16 || l->sbo < 16 || l->lbo % 16 || l->sbo % 16 || l->lbo >= (1 << 18) ||
			 l->sbo >= (1 << 18))
			bad(v, "warpgroup", "wgmma operand %s: byte offsets %d, %d", s->frag[i]->name, l->lbo,
			    l->sbo);
		else if (l->swizzle != 0 && l->swizzle != 32 && l->swizzle != 64 && l->swizzle != 128)
			bad(v, "swizzle", "wgmma operand %s: a swizzle of %d bytes (none, 32, 64 or 128)",
			    s->frag[i]->name, l->swizzle);
		else if (l->swizzle && (s->frag[i]->space != AP_KIR_SHARED_DYN ||
					s->frag[i]->align < 8u * (unsigned)l->swizzle))
			bad(v, "swizzle",
			    "wgmma operand %s swizzled by %d bytes does not start on the pattern's repeat "
			    "(a dynamic shared array aligned to %d bytes: ap_kir_shared_dyn_aligned)",
			    s->frag[i]->name, l->swizzle, 8 * l->swizzle);
		else
			check_index(v, s->frag[i], s->frag_off[i], 1);
	}
	check_index(v, d, s->frag_off[0], s->width / 2);
}

/* An integer expression (may be NULL when `need` is false). */
static void check_int_value(vctx *v, const ap_kir_expr *e, bool need, const char *what)
{
	if (!e) {
		if (need)
			bad(v, "mbarrier", "%s missing", what);
		return;
	}
	check_expr(v, e);
	if (!is_int(e->type))
		bad(v, "types", "%s of type %s, not an integer", what, ap_dtype_name(e->type));
}

static void check_tma(vctx *v, const ap_kir_stmt *s);

/* Rule mbarrier: mbarrier statements on arrays from ap_kir_mbarriers at
 * valid indices; a wait under block-uniform control flow (the host runs
 * it between phases); a bulk copy from global to a shared array of its
 * type, a positive multiple of 16 bytes, completing on an mbarrier; no
 * other statement touching an mbarrier array. */
static void check_mbar(vctx *v, const ap_kir_stmt *s, bool ctx)
{
	bool copy = s->kind == AP_KIR_S_BULK_COPY || s->kind == AP_KIR_S_TMA_LOAD;
	const ap_kir_array *bar = copy ? s->bar : s->arr;
	const ap_kir_expr *bi = copy ? s->bar_index : s->index;

	if (!bar || !bar->mbar) {
		bad(v, "mbarrier", "%s is not an mbarrier array (ap_kir_mbarriers)", bar ? bar->name : "(none)");
		return;
	}
	check_index(v, bar, bi, 1);
	switch (s->kind) {
	case AP_KIR_S_MBAR_INIT:
		check_int_value(v, s->value, true, "mbarrier.init's count");
		if (s->value && s->value->kind == AP_KIR_E_INT && (s->value->ival < 1 || s->value->ival >= 1 << 20))
			bad(v, "mbarrier", "mbarrier.init of %s with count %lld (1 to 2^20 - 1)", bar->name,
			    (long long)s->value->ival);
		break;
	case AP_KIR_S_MBAR_ARRIVE:
		check_int_value(v, s->value, false, "mbarrier.arrive's tx bytes");
		break;
	case AP_KIR_S_MBAR_WAIT:
		check_int_value(v, s->value, true, "mbarrier wait's parity");
		if (!ctx)
			bad(v, "uniform", "mbarrier wait on %s under thread-dependent control flow", bar->name);
		break;
	case AP_KIR_S_TMA_LOAD:
		check_tma(v, s);
		break;
	default:   /* AP_KIR_S_BULK_COPY */
		if ((s->arr->space != AP_KIR_SHARED && s->arr->space != AP_KIR_SHARED_DYN) || s->arr->mbar ||
		    s->src->space != AP_KIR_GLOBAL || s->src->type != s->arr->type)
			bad(v, "mbarrier", "bulk copy from %s into %s: global to a shared array of its type",
			    s->src->name, s->arr->name);
		else if (s->width <= 0 || s->width % 16 || (size_t)s->width % ap_dtype_size(s->arr->type))
			bad(v, "mbarrier", "bulk copy of %d bytes (a positive multiple of 16)", s->width);
		else {
			check_index(v, s->arr, s->index, (int)((size_t)s->width / ap_dtype_size(s->arr->type)));
			check_index(v, s->src, s->src_index, 1);
		}
		break;
	}
}

/* Rule tma: a TMA load from an array with a tensor map into a dynamic
 * shared array of its type, aligned to the swizzle's repeat (the
 * hardware swizzles address bits; 128 bytes without swizzle), holding the
 * box from its index; integer coordinates; an mbarrier to complete on. */
static void check_tma(vctx *v, const ap_kir_stmt *s)
{
	const ap_tmap_desc *d = s->src->tmap;
	unsigned span, align;
	size_t es, box;
	int64_t i;

	if (!d) {
		bad(v, "tma", "TMA load from %s, which has no tensor map (ap_kir_tensor_map)", s->src->name);
		return;
	}
	span = ap_tmap_swizzle_span(d->swizzle);
	align = span ? 8 * span : 128;
	es = ap_dtype_size(s->arr->type);
	box = ap_tmap_box_bytes(d);
	if (s->arr->space != AP_KIR_SHARED_DYN || s->arr->type != s->src->type || s->arr->mbar)
		bad(v, "tma", "TMA load into %s: a dynamic shared array of %s's type", s->arr->name, s->src->name);
	else if (s->arr->align < align)
		bad(v, "tma", "TMA load into %s (aligned to %u bytes): the map's swizzle needs %u",
		    s->arr->name, s->arr->align, align);
	else if (s->width != d->rank)
		bad(v, "tma", "TMA load with %d coordinates for a map of rank %d", s->width, d->rank);
	else if (ap_kir_is_int(s->index, &i) && (uint64_t)i * es % align)
		bad(v, "tma", "TMA load into %s at element %lld: not on a %u-byte boundary", s->arr->name,
		    (long long)i, align);
	else {
		check_index(v, s->arr, s->index, (int)(box / es));
		for (int c = 0; c < s->width; c++)
			check_int_value(v, s->values[c], true, "a TMA coordinate");
	}
}

/* Rule role: a ROLES statement under block-uniform control flow, outside
 * any arm, in a 1-D block, holding only arms whose thread ranges are
 * disjoint and inside the block; an arm's setmaxnreg a multiple of 8 in
 * [24, 256] on whole warpgroups (PTX ISA "setmaxnreg"). */
static void check_roles(vctx *v, const ap_kir_stmt *s, bool ctx)
{
	const ap_kir_kernel *k = v->k;
	unsigned nt = ap_kir_block_threads(k);

	if (!ctx || v->arm) {
		bad(v, "role", "%s", v->arm ? "ROLES inside an arm" : "ROLES under thread-dependent control flow");
		return;
	}
	if (k->block[1] != 1 || k->block[2] != 1 || !s->body.first) {
		bad(v, "role", "%s", s->body.first ? "ROLES in a block that is not 1-D" : "ROLES without arms");
		return;
	}
	if (++v->n_roles > 1 || k->cluster > 1) {
		bad(v, "role", "%s", k->cluster > 1 ? "ROLES in a kernel with clusters" : "a second ROLES in a kernel");
		return;
	}
	for (const ap_kir_stmt *a = s->body.first; a; a = a->next) {
		int n = a->maxnreg < 0 ? -a->maxnreg : a->maxnreg;

		if (a->kind != AP_KIR_S_ARM) {
			bad(v, "role", "a statement other than an arm directly in ROLES");
			return;
		}
		if (a->arm_hi > nt || a->arm_lo >= a->arm_hi || !a->arm_grain || a->arm_grain % 32 ||
		    a->arm_lo % a->arm_grain || a->arm_hi % a->arm_grain) {
			bad(v, "role", "arm of threads [%u, %u) in groups of %u in a block of %u threads", a->arm_lo,
			    a->arm_hi, a->arm_grain, nt);
			return;
		}
		for (const ap_kir_stmt *b = s->body.first; b != a; b = b->next)
			if (b->arm_lo < a->arm_hi && a->arm_lo < b->arm_hi) {
				bad(v, "role", "arms [%u, %u) and [%u, %u) overlap", b->arm_lo, b->arm_hi, a->arm_lo,
				    a->arm_hi);
				return;
			}
		if (n && (n % 8 || n < 24 || n > 256 || a->arm_grain % 128)) {
			bad(v, "role", "setmaxnreg %d on an arm of groups of %u threads", a->maxnreg, a->arm_grain);
			return;
		}
	}
}

static bool is_mbar_stmt(const ap_kir_stmt *s)
{
	return s->kind == AP_KIR_S_MBAR_INIT || s->kind == AP_KIR_S_MBAR_ARRIVE ||
	       s->kind == AP_KIR_S_MBAR_WAIT || s->kind == AP_KIR_S_BULK_COPY || s->kind == AP_KIR_S_TMA_LOAD;
}

static void check_block(vctx *v, const ap_kir_block *b, bool ctx);

static void check_stmt(vctx *v, const ap_kir_stmt *s, bool ctx)
{
	bool inner;

	if (!is_mbar_stmt(s) && ((s->arr && s->arr->mbar) || (s->src && s->src->mbar) ||
				 (s->frag[1] && s->frag[1]->mbar) || (s->frag[2] && s->frag[2]->mbar))) {
		bad(v, "mbarrier", "mbarrier array %s used by an ordinary statement",
		    s->arr && s->arr->mbar ? s->arr->name : s->src && s->src->mbar ? s->src->name : "(operand)");
		return;
	}
	switch (s->kind) {
	case AP_KIR_S_MBAR_INIT:
	case AP_KIR_S_MBAR_ARRIVE:
	case AP_KIR_S_MBAR_WAIT:
	case AP_KIR_S_BULK_COPY:
	case AP_KIR_S_TMA_LOAD:
		check_mbar(v, s, ctx);
		break;
	case AP_KIR_S_FOR:
		check_expr(v, s->lo);
		check_expr(v, s->hi);
		if (!is_int(s->var->type))
			bad(v, "loop", "loop variable %s of type %s", s->var->name,
			    ap_dtype_name(s->var->type));
		else if (s->lo->type != s->var->type || s->hi->type != s->var->type)
			bad(v, "loop", "bounds of %s are %s and %s, not %s", s->var->name,
			    ap_dtype_name(s->lo->type), ap_dtype_name(s->hi->type),
			    ap_dtype_name(s->var->type));
		else if (s->step <= 0)
			bad(v, "loop", "step %lld of %s", (long long)s->step, s->var->name);
		else if (s->unroll < -1)
			bad(v, "loop", "unroll %d of %s", s->unroll, s->var->name);
		inner = ctx && uniform(v, s->lo) && uniform(v, s->hi);
		declare(v, s->var);
		check_block(v, &s->body, inner);
		if (var_ok(v, s->var))
			v->in_scope[s->var->id] = 0;
		break;
	case AP_KIR_S_IF:
		check_expr(v, s->cond);
		inner = ctx && uniform(v, s->cond);
		check_block(v, &s->body, inner);
		check_block(v, &s->orelse, inner);
		break;
	case AP_KIR_S_LET:
		if (s->value)
			check_value(v, s->var->type, s->value, s->var->name);
		declare(v, s->var);
		break;
	case AP_KIR_S_ASSIGN:
		use_var(v, s->var, "assigned");
		check_value(v, s->var->type, s->value, s->var->name);
		break;
	case AP_KIR_S_STORE:
		check_expr(v, s->index);
		if (s->arr->space == AP_KIR_CONST)
			bad(v, "const", "store into constant array %s", s->arr->name);
		else if (!is_int(s->index->type))
			bad(v, "types", "index of %s of type %s", s->arr->name,
			    ap_dtype_name(s->index->type));
		check_value(v, s->arr->type, s->value, s->arr->name);
		check_bounds(v, s->arr, s->index, 1);
		break;
	case AP_KIR_S_ROLES:
		check_roles(v, s, ctx);
		for (const ap_kir_stmt *a = s->body.first; a && !v->rc; a = a->next) {
			v->arm = a;
			check_block(v, &a->body, ctx);
		}
		v->arm = NULL;
		break;
	case AP_KIR_S_ARM:   /* checked with its ROLES */
		break;
	case AP_KIR_S_BARRIER:
		if (v->arm)
			bad(v, "role", "__syncthreads inside an arm (its threads meet only on mbarriers)");
		if (!ctx)
			bad(v, "uniform", "barrier under thread-dependent control flow");
		break;
	case AP_KIR_S_CLUSTER_BARRIER:
		if (v->arm)
			bad(v, "role", "cluster barrier inside an arm");
		if (!ctx)
			bad(v, "uniform", "cluster barrier under thread-dependent control flow");
		if (v->k->cluster < 2)
			bad(v, "cluster", "cluster barrier in a kernel without clusters");
		break;
	case AP_KIR_S_SHFL:
		check_shfl(v, s, ctx);
		break;
	case AP_KIR_S_VLOAD:
		check_vector(v, s);
		for (int i = 0; i < s->width; i++) {
			if (s->vars[i]->type != s->arr->type)
				bad(v, "types", "vector load of %s into %s of type %s", s->arr->name,
				    s->vars[i]->name, ap_dtype_name(s->vars[i]->type));
			declare(v, s->vars[i]);
		}
		break;
	case AP_KIR_S_VSTORE:
		if (s->arr->space == AP_KIR_CONST)
			bad(v, "const", "vector store into constant array %s", s->arr->name);
		check_vector(v, s);
		for (int i = 0; i < s->width; i++)
			check_value(v, s->arr->type, s->values[i], s->arr->name);
		break;
	case AP_KIR_S_CP_ASYNC:
		check_cp_async(v, s);
		break;
	case AP_KIR_S_LDMATRIX:
		check_ldmatrix(v, s, ctx);
		break;
	case AP_KIR_S_MMA:
		check_mma(v, s, ctx);
		break;
	case AP_KIR_S_WGMMA:
	case AP_KIR_S_WGMMA_FENCE:
	case AP_KIR_S_WGMMA_COMMIT:
	case AP_KIR_S_WGMMA_WAIT:
		if (v->arm && v->arm->arm_grain % 128)
			bad(v, "role", "wgmma in an arm of groups of %u threads (whole warpgroups only)", v->arm->arm_grain);
		check_wgmma(v, s, ctx);
		break;
	case AP_KIR_S_FENCE_ASYNC:
		break;
	case AP_KIR_S_CP_WAIT:
		if (s->step < 0)
			bad(v, "async", "cp.async.wait_group %lld", (long long)s->step);
		break;
	case AP_KIR_S_CP_COMMIT:
	case AP_KIR_S_COMMENT:
		break;
	}
}

/* A statement list: its declarations go out of scope at its end. */
static void check_block(vctx *v, const ap_kir_block *b, bool ctx)
{
	for (const ap_kir_stmt *s = b->first; s && !v->rc; s = s->next)
		check_stmt(v, s, ctx);
	for (const ap_kir_stmt *s = b->first; s; s = s->next) {
		if (s->kind == AP_KIR_S_LET && var_ok(v, s->var))
			v->in_scope[s->var->id] = 0;
		for (int i = 0; s->kind == AP_KIR_S_VLOAD && i < s->width; i++)
			if (var_ok(v, s->vars[i]))
				v->in_scope[s->vars[i]->id] = 0;
	}
}

/* ---- 4. registers of wgmma in flight ----------------------------------------------- */

#define WG_GROUPS 8   /* commit groups tracked (older ones merge into the oldest) */
#define WG_ARRAYS 8   /* register arrays per group */

/* What is in flight: the wgmmas not yet committed (open) and the commit
 * groups not yet waited for, newest first (grp[0]). */
typedef struct wg_group {
	int n;
	const ap_kir_array *arr[WG_ARRAYS];
} wg_group;

typedef struct wg_state {
	wg_group open;
	int ng;
	wg_group grp[WG_GROUPS];
} wg_state;

static void wg_add(vctx *v, wg_group *g, const ap_kir_array *a)
{
	for (int i = 0; i < g->n; i++)
		if (g->arr[i] == a)
			return;
	if (g->n == WG_ARRAYS) {
		bad(v, "wgmma_regs", "more than %d register arrays in one wgmma commit group", WG_ARRAYS);
		return;
	}
	g->arr[g->n++] = a;
}

static void wg_union(vctx *v, wg_group *into, const wg_group *from)
{
	for (int i = 0; i < from->n; i++)
		wg_add(v, into, from->arr[i]);
}

/* Either state may hold: each group the union of both at its distance
 * from the newest. */
static void wg_join(vctx *v, wg_state *a, const wg_state *b)
{
	for (int i = a->ng; i < b->ng; i++)   /* groups a has not: empty there */
		a->grp[i].n = 0;
	wg_union(v, &a->open, &b->open);
	for (int i = 0; i < b->ng; i++)
		wg_union(v, &a->grp[i], &b->grp[i]);
	if (b->ng > a->ng)
		a->ng = b->ng;
}

static bool wg_in_flight(const wg_state *st, const ap_kir_array *a)
{
	for (int i = -1; i < st->ng; i++) {
		const wg_group *g = i < 0 ? &st->open : &st->grp[i];

		for (int j = 0; j < g->n; j++)
			if (g->arr[j] == a)
				return true;
	}
	return false;
}

static void wg_touch(vctx *v, const wg_state *st, const ap_kir_array *a, const char *what)
{
	if (a && a->space == AP_KIR_LOCAL && wg_in_flight(st, a))
		bad(v, "wgmma_regs", "%s %s while a wgmma on it is in flight (no wgmma.wait_group covers "
		    "its commit group)", what, a->name);
}

static void wg_expr(vctx *v, const wg_state *st, const ap_kir_expr *e)
{
	if (!e)
		return;
	if (e->kind == AP_KIR_E_LOAD)
		wg_touch(v, st, e->arr, "register array");
	wg_expr(v, st, e->a);
	wg_expr(v, st, e->b);
	wg_expr(v, st, e->c);
}

static void wg_block(vctx *v, wg_state *st, const ap_kir_block *b);

/* Whether b holds a statement that changes what is in flight (a wgmma,
 * commit or wait); a loop without one leaves the state as it found it,
 * so one walk of its body is enough (two would make nests 2^depth). */
static bool wg_changes(const ap_kir_block *b)
{
	for (const ap_kir_stmt *s = b->first; s; s = s->next)
		if (s->kind == AP_KIR_S_WGMMA || s->kind == AP_KIR_S_WGMMA_COMMIT || s->kind == AP_KIR_S_WGMMA_WAIT ||
		    ((s->kind == AP_KIR_S_FOR || s->kind == AP_KIR_S_IF || s->kind == AP_KIR_S_ROLES ||
		      s->kind == AP_KIR_S_ARM) &&
		     (wg_changes(&s->body) || wg_changes(&s->orelse))))
			return true;
	return false;
}

static void wg_stmt(vctx *v, wg_state *st, const ap_kir_stmt *s)
{
	wg_state in, body;

	switch (s->kind) {
	case AP_KIR_S_WGMMA:
		wg_expr(v, st, s->frag_off[0]);
		wg_expr(v, st, s->frag_off[1]);
		wg_expr(v, st, s->frag_off[2]);
		wg_add(v, &st->open, s->frag[0]);
		if (s->frag[1] && s->frag[1]->space == AP_KIR_LOCAL)
			wg_add(v, &st->open, s->frag[1]);
		return;
	case AP_KIR_S_WGMMA_COMMIT:
		if (st->ng == WG_GROUPS) {   /* the oldest two become one (conservative) */
			wg_union(v, &st->grp[WG_GROUPS - 2], &st->grp[WG_GROUPS - 1]);
			st->ng--;
		}
		memmove(&st->grp[1], &st->grp[0], (size_t)st->ng * sizeof(st->grp[0]));
		st->grp[0] = st->open;
		st->open.n = 0;
		st->ng++;
		return;
	case AP_KIR_S_WGMMA_WAIT:
		for (; s->step >= 0 && s->step < st->ng; st->ng--)
			st->grp[st->ng - 1].n = 0;   /* the oldest complete first */
		return;
	case AP_KIR_S_WGMMA_FENCE:
	case AP_KIR_S_COMMENT:
		return;
	case AP_KIR_S_FOR:
		wg_expr(v, st, s->lo);
		wg_expr(v, st, s->hi);
		if (!wg_changes(&s->body)) {
			wg_block(v, st, &s->body);
			return;
		}
		in = *st;
		wg_block(v, st, &s->body);       /* the first pass */
		body = *st;
		wg_join(v, &body, &in);          /* a later pass starts from either */
		wg_block(v, &body, &s->body);
		wg_join(v, st, &in);             /* none, one or more passes */
		wg_join(v, st, &body);
		return;
	case AP_KIR_S_IF:
		wg_expr(v, st, s->cond);
		in = *st;
		wg_block(v, st, &s->body);
		wg_block(v, &in, &s->orelse);
		wg_join(v, st, &in);
		return;
	case AP_KIR_S_ROLES:   /* each arm from the state before; after: any of them */
		in = *st;
		for (const ap_kir_stmt *a = s->body.first; a && !v->rc; a = a->next) {
			body = in;
			wg_block(v, &body, &a->body);
			wg_join(v, st, &body);
		}
		return;
	default:
		break;
	}
	wg_touch(v, st, s->arr, "register array");
	wg_touch(v, st, s->src, "register array");
	for (int i = 0; i < 4; i++) {
		wg_touch(v, st, s->frag[i], "fragment");
		wg_expr(v, st, s->frag_off[i]);
	}
	wg_expr(v, st, s->index);
	wg_expr(v, st, s->value);
	wg_expr(v, st, s->lane);
	wg_expr(v, st, s->src_index);
	wg_expr(v, st, s->bar_index);
	for (int i = 0; s->values && i < s->width; i++)   /* VSTORE, TMA coordinates */
		wg_expr(v, st, s->values[i]);
}

static void wg_block(vctx *v, wg_state *st, const ap_kir_block *b)
{
	for (const ap_kir_stmt *s = b->first; s && !v->rc; s = s->next)
		wg_stmt(v, st, s);
}

int ap_kir_verify(const ap_kir_kernel *k, const ap_kir_limits *lim, ap_error *err)
{
	vctx v = { 0 };
	size_t n;

	if (!k || k->failed)
		return ap_error_set(err, AP_EINTERNAL, NULL, NULL,
				    "kernel IR incomplete (its construction failed)");
	v.k = k;
	v.err = err;
	v.lim.max_threads = lim ? lim->max_threads : 1024;
	v.lim.max_shared_bytes = lim ? lim->max_shared_bytes : 48 * 1024;
	n = (size_t)k->n_vars + 1;
	v.in_scope = calloc(n, 1);
	v.declared = calloc(n, 1);
	v.varying = calloc(n, 1);
	if (!v.in_scope || !v.declared || !v.varying) {
		v.rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory verifying %s", k->name);
		goto done;
	}
	check_launch(&v);
	do {
		v.changed = false;
		find_varying(&v, &k->body, true);
	} while (v.changed);
	if (!v.rc)
		check_block(&v, &k->body, true);
	if (!v.rc && wg_changes(&k->body)) {   /* kernels without wgmma: nothing in flight */
		wg_state st;

		memset(&st, 0, sizeof(st));
		wg_block(&v, &st, &k->body);
	}
done:
	free(v.in_scope);
	free(v.declared);
	free(v.varying);
	return v.rc;
}
