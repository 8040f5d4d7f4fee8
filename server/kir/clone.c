/* clone.c -- copying kernel IR from one kernel into another, with block /
 * thread indices and arrays substituted (see ap_kir_clone_into in kir.h).
 *
 * This is what parallelism stitching needs: several kernels become one
 * launch whose blocks are split by block index ranges, each original body
 * under an `if` on blockIdx and with its own blockIdx rebuilt from the
 * merged one (blockIdx.x - 3, say).
 *
 * Approach: arrays first (every src array gets its dst array, given or
 * created, GLOBAL ones in parameter order so the merged parameter list is
 * predictable), then the statements in order, each variable getting a
 * fresh dst variable at its declaration (LET, FOR, VLOAD), each expression
 * node copied once: a map from src node to dst node keeps the DAG's
 * sharing, so cloning costs what the IR weighs, not what its trees would.
 * Nodes are copied raw (no folding), except block / thread indices, which
 * become the substitute, a constant 0 (extent 1 in src, as the printers
 * print it) or a dst index.
 */
#include "kir_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a pointer map (open addressing, linear probing) ------------------------- */

typedef struct pmap {
	const void **keys;
	void **vals;
	size_t cap, n;
} pmap;

static size_t slot_of(const pmap *m, const void *key)
{
	uintptr_t h = (uintptr_t)key;

	h ^= h >> 17;
	h *= (uintptr_t)0x9e3779b97f4a7c15ull;
	return (size_t)(h ^ (h >> 29)) & (m->cap - 1);
}

static void *pmap_get(const pmap *m, const void *key)
{
	if (!m->cap)
		return NULL;
	for (size_t i = slot_of(m, key);; i = (i + 1) & (m->cap - 1)) {
		if (m->keys[i] == key)
			return m->vals[i];
		if (!m->keys[i])
			return NULL;
	}
}

static bool pmap_put(pmap *m, const void *key, void *val)
{
	size_t i;

	if (2 * (m->n + 1) > m->cap) {
		pmap g = { NULL, NULL, m->cap ? 2 * m->cap : 64, 0 };

		g.keys = calloc(g.cap, sizeof(*g.keys));
		g.vals = calloc(g.cap, sizeof(*g.vals));
		if (!g.keys || !g.vals) {
			free(g.keys);
			free(g.vals);
			return false;
		}
		for (size_t j = 0; j < m->cap; j++)
			if (m->keys[j])
				pmap_put(&g, m->keys[j], m->vals[j]);
		free(m->keys);
		free(m->vals);
		*m = g;
	}
	for (i = slot_of(m, key); m->keys[i] && m->keys[i] != key; i = (i + 1) & (m->cap - 1))
		;
	if (!m->keys[i])
		m->n++;
	m->keys[i] = key;
	m->vals[i] = val;
	return true;
}

static void pmap_free(pmap *m)
{
	free(m->keys);
	free(m->vals);
}

/* ---- the copy ---------------------------------------------------------------- */

typedef struct cloner {
	ap_kir_kernel *dst;
	const ap_kir_kernel *src;    /* NULL: ap_kir_expr_clone (no extents) */
	const ap_kir_subst *s;       /* may be NULL */
	ap_kir_array **arrays;       /* per src array id; NULL: s->arrays or keep */
	ap_kir_var **vars;           /* per src var id; NULL: keep variables */
	pmap memo;                   /* src expr -> dst expr */
	bool failed;
} cloner;

static const char *prefix_of(const cloner *c)
{
	return c->s && c->s->prefix ? c->s->prefix : "";
}

/* A fresh dst variable for src variable v: prefix + v's name without its
 * number. */
static ap_kir_var *fresh_var(cloner *c, const ap_kir_var *v)
{
	char base[sizeof(v->name)], name[64];
	size_t n = strlen(v->name), len;
	ap_kir_var *nv;

	while (n > 0 && v->name[n - 1] >= '0' && v->name[n - 1] <= '9')
		n--;
	memcpy(base, v->name, n);
	base[n] = '\0';
	snprintf(name, sizeof(name), "%s%s", prefix_of(c), base);
	/* the number that follows must not merge with digits before it */
	len = strlen(name);
	if (len == 0 || (name[len - 1] >= '0' && name[len - 1] <= '9'))
		snprintf(name + len, sizeof(name) - len, "v");
	nv = ap_kir_var_new(c->dst, v->type, name);
	if (!nv)
		c->failed = true;
	else if (c->vars)
		c->vars[v->id] = nv;
	return nv;
}

static ap_kir_var *map_var(cloner *c, ap_kir_var *v)
{
	if (!c->vars)
		return v;
	if (v->id >= 0 && v->id < c->src->n_vars && c->vars[v->id])
		return c->vars[v->id];
	/* not declared in src (verify would say so): give it one anyway */
	return fresh_var(c, v);
}

static ap_kir_array *map_array(cloner *c, ap_kir_array *a)
{
	if (c->arrays)
		return c->arrays[a->id];
	if (c->s && c->s->arrays && c->s->arrays[a->id])
		return c->s->arrays[a->id];
	return a;
}

static ap_kir_expr *clone_index(cloner *c, const ap_kir_expr *e)
{
	ap_kir_expr *r = NULL;
	int which = e->op;

	if (which < 0 || which > AP_KIR_CLUSTER_RANK)
		return ap_kir_int(c->dst, e->type, 0);
	if (which > AP_KIR_THREAD_Z) {   /* cluster kernels are not merged: kept as they are */
		r = ap__kir_expr_new(c->dst, AP_KIR_E_INDEX, c->dst->index_type);
		if (r)
			r->op = which;
		return ap_kir_cast(c->dst, e->type, r);
	}
	if (c->s && c->s->index[which]) {
		r = c->s->index[which];
	} else if (c->src && (which < AP_KIR_THREAD_X ? c->src->grid[which]
						       : c->src->block[which - AP_KIR_THREAD_X]) == 1) {
		return ap_kir_int(c->dst, e->type, 0);
	} else {
		r = ap__kir_expr_new(c->dst, AP_KIR_E_INDEX, c->dst->index_type);
		if (r)
			r->op = which;
	}
	return ap_kir_cast(c->dst, e->type, r);
}

static ap_kir_expr *clone_expr(cloner *c, const ap_kir_expr *e)
{
	ap_kir_expr *r;

	if (!e || c->failed)
		return NULL;
	r = pmap_get(&c->memo, e);
	if (r)
		return r;
	if (e->kind == AP_KIR_E_INDEX) {
		r = clone_index(c, e);
	} else {
		r = ap__kir_expr_new(c->dst, e->kind, e->type);
		if (r) {
			*r = *e;
			if (e->var)
				r->var = map_var(c, e->var);
			if (e->arr)
				r->arr = map_array(c, e->arr);
			r->a = e->a ? clone_expr(c, e->a) : NULL;
			r->b = e->b ? clone_expr(c, e->b) : NULL;
			r->c = e->c ? clone_expr(c, e->c) : NULL;
			if ((e->a && !r->a) || (e->b && !r->b) || (e->c && !r->c) ||
			    (e->var && !r->var) || (e->arr && !r->arr))
				r = NULL;
		}
	}
	if (!r || !pmap_put(&c->memo, e, r)) {
		c->failed = true;
		return NULL;
	}
	return r;
}

/* A copy of an optional operand: NULL stays NULL, a failure sets c->failed. */
static ap_kir_expr *opt_expr(cloner *c, const ap_kir_expr *e)
{
	return e ? clone_expr(c, e) : NULL;
}

/* The tensor-core statements' fragments, layouts and shapes. */
static void clone_matrix(cloner *c, ap_kir_stmt *n, const ap_kir_stmt *s)
{
	if (s->kind == AP_KIR_S_WGMMA_FENCE || s->kind == AP_KIR_S_WGMMA_WAIT) {
		n->frag[0] = map_array(c, s->frag[0]);
		return;
	}
	n->mma = s->mma;
	n->width = s->width;
	n->wg[0] = s->wg[0];
	n->wg[1] = s->wg[1];
	for (int i = 0; i < 4; i++) {
		n->frag[i] = s->frag[i] ? map_array(c, s->frag[i]) : NULL;
		n->frag_off[i] = s->frag_off[i] ? clone_expr(c, s->frag_off[i]) : NULL;
	}
}

/* The mbarrier statements and the asynchronous copies' operands. */
static void clone_async(cloner *c, ap_kir_stmt *n, const ap_kir_stmt *s)
{
	n->arr = map_array(c, s->arr);
	n->index = clone_expr(c, s->index);
	switch (s->kind) {
	case AP_KIR_S_TMA_LOAD:
		n->src = map_array(c, s->src);
		n->width = s->width;
		n->values = ap__kir_alloc(c->dst, (size_t)s->width * sizeof(*n->values));
		for (int i = 0; n->values && i < s->width; i++)
			n->values[i] = clone_expr(c, s->values[i]);
		if (!n->values)
			c->failed = true;
		break;
	case AP_KIR_S_BULK_COPY:
		n->src = map_array(c, s->src);
		n->src_index = clone_expr(c, s->src_index);
		n->width = s->width;
		break;
	default:   /* MBAR_INIT, MBAR_ARRIVE, MBAR_WAIT */
		n->value = opt_expr(c, s->value);
		return;
	}
	n->bar = map_array(c, s->bar);
	n->bar_index = clone_expr(c, s->bar_index);
}

static void clone_block(cloner *c, ap_kir_block *into, const ap_kir_block *from);

static void clone_stmt(cloner *c, ap_kir_block *into, const ap_kir_stmt *s)
{
	ap_kir_stmt *n = ap__kir_stmt_append(c->dst, into, s->kind);

	if (!n) {
		c->failed = true;
		return;
	}
	n->step = s->step;
	n->unroll = s->unroll;
	n->shfl = s->shfl;
	n->width = s->width;
	switch (s->kind) {
	case AP_KIR_S_FOR:
		n->lo = clone_expr(c, s->lo);
		n->hi = clone_expr(c, s->hi);
		n->var = fresh_var(c, s->var);
		clone_block(c, &n->body, &s->body);
		break;
	case AP_KIR_S_IF:
		n->cond = clone_expr(c, s->cond);
		clone_block(c, &n->body, &s->body);
		clone_block(c, &n->orelse, &s->orelse);
		break;
	case AP_KIR_S_LET:
		n->value = opt_expr(c, s->value);   /* before the variable exists */
		n->var = fresh_var(c, s->var);
		break;
	case AP_KIR_S_ASSIGN:
	case AP_KIR_S_SHFL:
		n->var = map_var(c, s->var);
		n->value = clone_expr(c, s->value);
		n->lane = opt_expr(c, s->lane);
		break;
	case AP_KIR_S_STORE:
		n->arr = map_array(c, s->arr);
		n->index = clone_expr(c, s->index);
		n->value = clone_expr(c, s->value);
		break;
	case AP_KIR_S_VLOAD:
		n->arr = map_array(c, s->arr);
		n->index = clone_expr(c, s->index);
		n->vars = ap__kir_alloc(c->dst, (size_t)s->width * sizeof(*n->vars));
		for (int i = 0; n->vars && i < s->width; i++)
			n->vars[i] = fresh_var(c, s->vars[i]);
		if (!n->vars)
			c->failed = true;
		break;
	case AP_KIR_S_VSTORE:
		n->arr = map_array(c, s->arr);
		n->index = clone_expr(c, s->index);
		n->values = ap__kir_alloc(c->dst, (size_t)s->width * sizeof(*n->values));
		for (int i = 0; n->values && i < s->width; i++)
			n->values[i] = clone_expr(c, s->values[i]);
		if (!n->values)
			c->failed = true;
		break;
	case AP_KIR_S_COMMENT:
		n->text = ap__kir_strdup(c->dst, s->text ? s->text : "");
		if (!n->text)
			c->failed = true;
		break;
	case AP_KIR_S_CP_ASYNC:
	case AP_KIR_S_LDMATRIX:
		n->arr = map_array(c, s->arr);
		n->index = clone_expr(c, s->index);
		n->src = map_array(c, s->src);
		n->src_index = clone_expr(c, s->src_index);
		n->cond = opt_expr(c, s->cond);
		n->trans = s->trans;
		break;
	case AP_KIR_S_MMA:
	case AP_KIR_S_WGMMA:
	case AP_KIR_S_WGMMA_FENCE:
	case AP_KIR_S_WGMMA_WAIT:
		clone_matrix(c, n, s);
		break;
	case AP_KIR_S_MBAR_INIT:
	case AP_KIR_S_MBAR_ARRIVE:
	case AP_KIR_S_MBAR_WAIT:
	case AP_KIR_S_TMA_LOAD:
	case AP_KIR_S_BULK_COPY:
		clone_async(c, n, s);
		break;
	case AP_KIR_S_ROLES:
	case AP_KIR_S_ARM:   /* thread ranges are the block's: the merge keeps block[0] */
		n->arm_lo = s->arm_lo;
		n->arm_hi = s->arm_hi;
		n->arm_grain = s->arm_grain;
		n->maxnreg = s->maxnreg;
		clone_block(c, &n->body, &s->body);
		break;
	case AP_KIR_S_BARRIER:
	case AP_KIR_S_CLUSTER_BARRIER:
	case AP_KIR_S_CP_COMMIT:
	case AP_KIR_S_CP_WAIT:
	case AP_KIR_S_WGMMA_COMMIT:
	case AP_KIR_S_FENCE_ASYNC:
		break;
	}
}

static void clone_block(cloner *c, ap_kir_block *into, const ap_kir_block *from)
{
	for (const ap_kir_stmt *s = from->first; s && !c->failed; s = s->next)
		clone_stmt(c, into, s);
}

/* dst's copy of src array a, named prefix + a's name. */
static ap_kir_array *clone_array(cloner *c, const ap_kir_array *a)
{
	size_t n = strlen(prefix_of(c)) + strlen(a->name) + 1;
	char *name = malloc(n);
	ap_kir_array *r = NULL;

	if (!name)
		return NULL;
	snprintf(name, n, "%s%s", prefix_of(c), a->name);
	switch (a->space) {
	case AP_KIR_GLOBAL:
		r = ap_kir_param(c->dst, name, a->type, a->written, a->tensor);
		if (r)
			r->size = a->size;
		if (r && a->tmap && ap_kir_tensor_map(c->dst, r, a->tmap))
			r = NULL;
		break;
	case AP_KIR_SHARED:
		r = a->mbar ? ap_kir_mbarriers(c->dst, name, (int)a->size)
			    : ap_kir_shared(c->dst, name, a->type, a->size);
		break;
	case AP_KIR_SHARED_DYN:
		r = ap_kir_shared_dyn_aligned(c->dst, name, a->type, a->size, a->align);
		break;
	case AP_KIR_LOCAL:
		r = a->scratch ? ap_kir_local_scratch(c->dst, name, a->type, a->size)
			       : ap_kir_local(c->dst, name, a->type, a->size);
		break;
	case AP_KIR_CONST:
		r = ap_kir_const_array(c->dst, name, a->type, a->size, a->data);
		break;
	}
	free(name);
	return r;
}

static int map_arrays(cloner *c)
{
	const ap_kir_kernel *src = c->src;

	/* parameters in src's parameter order, then the rest in creation order */
	for (int p = 0; p < src->n_params; p++)
		for (int i = 0; i < src->n_arrays; i++) {
			const ap_kir_array *a = src->arrays[i];

			if (a->space != AP_KIR_GLOBAL || a->param != p || c->arrays[i])
				continue;
			if (!(c->arrays[i] = clone_array(c, a)))
				return AP_ENOMEM;
		}
	for (int i = 0; i < src->n_arrays; i++) {
		if (c->arrays[i])
			continue;
		if (!(c->arrays[i] = clone_array(c, src->arrays[i])))
			return AP_ENOMEM;
	}
	return 0;
}

int ap_kir_clone_into(ap_kir_kernel *dst, ap_kir_block *into, const ap_kir_kernel *src,
		      ap_kir_subst *s)
{
	cloner c;
	ap_kir_array **own = NULL;

	if (!dst || !into || !src || dst->failed || src->failed) {
		if (dst)
			dst->failed = true;
		return AP_ENOMEM;
	}
	memset(&c, 0, sizeof(c));
	c.dst = dst;
	c.src = src;
	c.s = s;
	if (s && s->arrays) {
		c.arrays = s->arrays;
	} else {
		own = calloc((size_t)src->n_arrays + 1, sizeof(*own));
		c.arrays = own;
	}
	c.vars = calloc((size_t)src->n_vars + 1, sizeof(*c.vars));
	if (!c.arrays || !c.vars || map_arrays(&c))
		c.failed = true;
	if (!c.failed)
		clone_block(&c, into, &src->body);
	pmap_free(&c.memo);
	free(c.vars);
	free(own);
	if (c.failed || dst->failed) {
		dst->failed = true;
		return AP_ENOMEM;
	}
	return 0;
}

ap_kir_expr *ap_kir_expr_clone(ap_kir_kernel *dst, const ap_kir_expr *e, const ap_kir_subst *s)
{
	cloner c;
	ap_kir_expr *r;

	if (!dst || !e)
		return NULL;
	memset(&c, 0, sizeof(c));
	c.dst = dst;
	c.s = s;
	r = clone_expr(&c, e);
	pmap_free(&c.memo);
	if (c.failed)
		dst->failed = true;
	return c.failed ? NULL : r;
}
