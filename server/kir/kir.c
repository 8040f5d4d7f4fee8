/* kir.c -- building kernel IR (see kir.h).
 *
 * Every node of a kernel comes from the kernel's arena: a list of chunks
 * that is released at once by ap_kir_kernel_free, so builders can share
 * subexpressions freely (the IR is a DAG of expressions under a tree of
 * statements).  A failed allocation sets k->failed and yields NULL, which
 * every builder propagates; callers check ap_kir_failed() once.
 *
 * Integer index arithmetic is folded as it is built (constants, x+0, x*1,
 * x*0, x/1, x%1, (x+c1)+c2, x|0, x^0, x<<0, x>>0, floordiv(x, 1)), because
 * lowering produces a lot of it and the printed kernels should stay
 * readable.  Floating expressions are never rewritten (x*0 is not 0 for
 * NaN or infinity); float16 / bfloat16 constants are rounded to their type
 * when built (half.c).
 *
 * Statement builders check what a statement needs to be printable (a
 * positive step, a shuffle width, a vector width); the rules that depend
 * on context (scopes, uniform control flow) are ap_kir_verify's.
 */
#include "kir_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A kernel's first chunk is small and each next one twice the last, up
 * to CHUNK_BYTES: the partitioner lowers thousands of candidate kernels of
 * a few hundred bytes each at once (a fan-out of 10^4 nodes held 64 KiB
 * apiece, 655 MB), while a big kernel still allocates in 64 KiB steps. */
#define FIRST_CHUNK_BYTES 1024
#define CHUNK_BYTES 65536

typedef struct chunk {
	struct chunk *next;
	size_t used, cap;
	_Alignas(16) unsigned char mem[];
} chunk;

struct ap_kir_arena {
	chunk *head;
};

void *ap__kir_alloc(ap_kir_kernel *k, size_t n)
{
	chunk *c;

	if (!k || k->failed)
		return NULL;
	n = (n + 15) & ~(size_t)15;
	c = k->arena->head;
	if (!c || c->cap - c->used < n) {
		size_t cap = c ? 2 * c->cap : FIRST_CHUNK_BYTES;
		chunk *nc;

		if (cap > CHUNK_BYTES)
			cap = CHUNK_BYTES;
		if (cap < n)
			cap = n;
		nc = malloc(sizeof(chunk) + cap);
		if (!nc) {
			k->failed = true;
			return NULL;
		}
		nc->next = c;
		nc->used = 0;
		nc->cap = cap;
		k->arena->head = nc;
		c = nc;
	}
	void *p = c->mem + c->used;
	c->used += n;
	memset(p, 0, n);
	return p;
}

char *ap__kir_strdup(ap_kir_kernel *k, const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = ap__kir_alloc(k, n);

	if (d)
		memcpy(d, s, n);
	return d;
}

__ap_give ap_kir_kernel *ap_kir_kernel_new(const char *name)
{
	ap_kir_kernel *k = calloc(1, sizeof(*k));

	if (!k)
		return NULL;
	k->arena = calloc(1, sizeof(*k->arena));
	if (!k->arena) {
		free(k);
		return NULL;
	}
	for (int i = 0; i < 3; i++)
		k->grid[i] = k->block[i] = 1;
	k->index_type = AP_DT_I64;
	k->cluster = 1;
	k->name = ap__kir_strdup(k, name);
	if (!k->name)
		return ap_kir_kernel_free(k);
	return k;
}

ap_kir_kernel *ap_kir_kernel_free(__ap_take ap_kir_kernel *k)
{
	if (!k)
		return NULL;
	if (k->arena) {
		chunk *c = k->arena->head;

		while (c) {
			chunk *n = c->next;
			free(c);
			c = n;
		}
		free(k->arena);
	}
	free(k->arrays);
	free(k->library);
	free(k);
	return NULL;
}

bool ap_kir_failed(const ap_kir_kernel *k)
{
	return !k || k->failed;
}

int ap_kir_kernel_rename(ap_kir_kernel *k, const char *name)
{
	char *n = ap__kir_strdup(k, name);

	if (!n)
		return AP_ENOMEM;
	k->name = n;
	return 0;
}

uint64_t ap_kir_shared_bytes(const ap_kir_kernel *k)
{
	uint64_t off = 0;

	for (int i = 0; i < k->n_arrays; i++) {
		const ap_kir_array *a = k->arrays[i];

		if (a->space != AP_KIR_SHARED)
			continue;
		off = (off + 15) & ~(uint64_t)15;
		off += (uint64_t)(a->size > 0 ? a->size : 1) * ap_dtype_size(a->type);
	}
	if (k->smem_bytes)
		off = ((off + 15) & ~(uint64_t)15) + k->smem_bytes;
	return off;
}

unsigned ap_kir_block_threads(const ap_kir_kernel *k)
{
	return k->block[0] * k->block[1] * k->block[2];
}

/* ---- arrays and variables ------------------------------------------------ */

static ap_kir_array *array_new(ap_kir_kernel *k, const char *name, ap_dtype type,
			       ap_kir_space space, int64_t size)
{
	ap_kir_array *a;

	if (!k || k->failed)
		return NULL;
	if (k->n_arrays == k->cap_arrays) {
		int ncap = k->cap_arrays ? 2 * k->cap_arrays : 8;
		ap_kir_array **p = realloc(k->arrays, (size_t)ncap * sizeof(*p));

		if (!p) {
			k->failed = true;
			return NULL;
		}
		k->arrays = p;
		k->cap_arrays = ncap;
	}
	a = ap__kir_alloc(k, sizeof(*a));
	if (!a)
		return NULL;
	a->name = ap__kir_strdup(k, name);
	if (!a->name)
		return NULL;
	a->id = k->n_arrays;
	a->type = type;
	a->space = space;
	a->size = size;
	a->param = -1;
	a->tensor = -1;
	k->arrays[k->n_arrays++] = a;
	return a;
}

ap_kir_array *ap_kir_param(ap_kir_kernel *k, const char *name, ap_dtype type,
			   bool written, int tensor)
{
	ap_kir_array *a = array_new(k, name, type, AP_KIR_GLOBAL, 0);

	if (!a)
		return NULL;
	a->param = k->n_params++;
	a->written = written;
	a->tensor = tensor;
	return a;
}

ap_kir_array *ap_kir_shared(ap_kir_kernel *k, const char *name, ap_dtype type, int64_t size)
{
	return array_new(k, name, type, AP_KIR_SHARED, size);
}

/* Bytes of slack the run-time alignment of the dynamic shared memory
 * takes (ap_kir_shared_dyn_aligned). */
static unsigned smem_slack(const ap_kir_kernel *k)
{
	return k->smem_align > 16 ? k->smem_align - 16 : 0;
}

ap_kir_array *ap_kir_shared_dyn_aligned(ap_kir_kernel *k, const char *name, ap_dtype type, int64_t size,
					unsigned align)
{
	ap_kir_array *a;
	uint64_t off, end;

	if (k && (align < 16 || align > 1024 || (align & (align - 1)))) {
		k->failed = true;
		return NULL;
	}
	a = array_new(k, name, type, AP_KIR_SHARED_DYN, size);
	if (!a)
		return NULL;
	end = k->smem_bytes - smem_slack(k);   /* the arrays' end, before the slack */
	off = (end + align - 1) & ~(uint64_t)(align - 1);
	a->offset = off;
	a->align = align;
	if (align > k->smem_align)
		k->smem_align = align;
	k->smem_bytes = (unsigned)(off + (uint64_t)size * ap_dtype_size(type) + smem_slack(k));
	return a;
}

size_t ap_kir_shared_dyn_bytes(int n, const size_t *bytes, const unsigned *align)
{
	size_t end = 0, most = 16;

	for (int i = 0; i < n; i++) {
		size_t al = align[i] ? align[i] : 16;

		end = (end + al - 1) / al * al + bytes[i];
		if (al > most)
			most = al;
	}
	return end + most - 16;
}

int ap_kir_wg_swizzle_fit(int64_t extent, int64_t start)
{
	for (int w = 128; w >= 32; w /= 2)
		if (extent % w == 0 && start % w == 0)
			return w;
	return 0;
}

ap_kir_array *ap_kir_shared_dyn(ap_kir_kernel *k, const char *name, ap_dtype type, int64_t size)
{
	return ap_kir_shared_dyn_aligned(k, name, type, size, 16);
}

ap_kir_array *ap_kir_local(ap_kir_kernel *k, const char *name, ap_dtype type, int64_t size)
{
	return array_new(k, name, type, AP_KIR_LOCAL, size);
}

ap_kir_array *ap_kir_local_scratch(ap_kir_kernel *k, const char *name, ap_dtype type, int64_t size)
{
	ap_kir_array *a = array_new(k, name, type, AP_KIR_LOCAL, size);

	if (a)
		a->scratch = true;
	return a;
}

ap_kir_array *ap_kir_const_array(ap_kir_kernel *k, const char *name, ap_dtype type,
				 int64_t size, const void *data)
{
	ap_kir_array *a;
	size_t nbytes;

	if (size < 1 || !data)
		return NULL;
	a = array_new(k, name, type, AP_KIR_CONST, size);
	if (!a)
		return NULL;
	nbytes = (size_t)size * ap_dtype_size(type);
	a->data = ap__kir_alloc(k, nbytes);
	if (!a->data)
		return NULL;
	memcpy(a->data, data, nbytes);
	return a;
}

ap_kir_var *ap_kir_var_new(ap_kir_kernel *k, ap_dtype type, const char *prefix)
{
	ap_kir_var *v = ap__kir_alloc(k, sizeof(*v));

	if (!v)
		return NULL;
	v->id = k->n_vars++;
	v->type = type;
	snprintf(v->name, sizeof(v->name), "%.12s%d", prefix, v->id);
	return v;
}

/* ---- expressions --------------------------------------------------------- */

ap_kir_expr *ap__kir_expr_new(ap_kir_kernel *k, ap_kir_expr_kind kind, ap_dtype type)
{
	ap_kir_expr *e = ap__kir_alloc(k, sizeof(*e));

	if (!e)
		return NULL;
	e->kind = kind;
	e->type = type;
	return e;
}

static bool is_float(ap_dtype t)
{
	return ap_kir_is_float_type(t);
}

/* Wraps an integer value to the width of `type`. */
static int64_t wrap_int(ap_dtype type, int64_t v)
{
	switch (type) {
	case AP_DT_I32: return (int32_t)v;
	case AP_DT_I8: return (int8_t)v;
	case AP_DT_U8: return (uint8_t)v;
	case AP_DT_BOOL: return v != 0;
	default: return v;
	}
}

ap_kir_expr *ap_kir_int(ap_kir_kernel *k, ap_dtype type, int64_t v)
{
	ap_kir_expr *e;

	if (is_float(type))
		return ap_kir_float(k, type, (double)v);
	e = ap__kir_expr_new(k, AP_KIR_E_INT, type);
	if (e)
		e->ival = wrap_int(type, v);
	return e;
}

ap_kir_expr *ap_kir_i64(ap_kir_kernel *k, int64_t v)
{
	return ap_kir_int(k, AP_DT_I64, v);
}

ap_kir_expr *ap_kir_idx(ap_kir_kernel *k, int64_t v)
{
	return k ? ap_kir_int(k, k->index_type, v) : NULL;
}

ap_kir_expr *ap_kir_float(ap_kir_kernel *k, ap_dtype type, double v)
{
	ap_kir_expr *e;

	if (!is_float(type))
		return ap_kir_const(k, type, v);
	e = ap__kir_expr_new(k, AP_KIR_E_FLOAT, type);
	if (!e)
		return NULL;
	if (type == AP_DT_F32)
		e->fval = (double)(float)v;
	else if (type == AP_DT_F16)
		e->fval = ap_kir_f16_to_f32(ap_kir_f32_to_f16((float)v));
	else if (type == AP_DT_BF16)
		e->fval = ap_kir_bf16_to_f32(ap_kir_f32_to_bf16((float)v));
	else
		e->fval = v;
	return e;
}

ap_kir_expr *ap_kir_const(ap_kir_kernel *k, ap_dtype type, double v)
{
	if (is_float(type))
		return ap_kir_float(k, type, v);
	if (type == AP_DT_BOOL)
		return ap_kir_int(k, type, v != 0);
	if (v != v)
		v = 0;
	if (v >= 9.2233720368547758e18)
		return ap_kir_int(k, type, INT64_MAX);
	if (v <= -9.2233720368547758e18)
		return ap_kir_int(k, type, INT64_MIN);
	return ap_kir_int(k, type, (int64_t)v);
}

ap_kir_expr *ap_kir_ref(ap_kir_kernel *k, ap_kir_var *v)
{
	ap_kir_expr *e;

	if (!v)
		return NULL;
	e = ap__kir_expr_new(k, AP_KIR_E_VAR, v->type);
	if (e)
		e->var = v;
	return e;
}

ap_kir_expr *ap_kir_index_of(ap_kir_kernel *k, ap_kir_index which)
{
	ap_kir_expr *e = k ? ap__kir_expr_new(k, AP_KIR_E_INDEX, k->index_type) : NULL;

	if (e)
		e->op = which;
	return e;
}

bool ap_kir_is_int(const ap_kir_expr *e, int64_t *v)
{
	if (!e || e->kind != AP_KIR_E_INT)
		return false;
	if (v)
		*v = e->ival;
	return true;
}

ap_kir_expr *ap_kir_unary(ap_kir_kernel *k, ap_kir_unop op, ap_kir_expr *a)
{
	ap_kir_expr *e;
	int64_t v;

	if (!a)
		return NULL;
	if (ap_kir_is_int(a, &v)) {
		if (op == AP_KIR_NEG)
			return ap_kir_int(k, a->type, -(uint64_t)v);
		if (op == AP_KIR_LNOT)
			return ap_kir_int(k, AP_DT_BOOL, !v);
	}
	e = ap__kir_expr_new(k, AP_KIR_E_UNARY, op == AP_KIR_LNOT ? AP_DT_BOOL : a->type);
	if (e) {
		e->op = op;
		e->a = a;
	}
	return e;
}

static bool result_is_bool(ap_kir_binop op)
{
	return op >= AP_KIR_LT && op <= AP_KIR_LOR;
}

/* Bits of an integer type (shift counts must stay below it). */
static int int_bits(ap_dtype t)
{
	switch (t) {
	case AP_DT_I64: return 64;
	case AP_DT_I32: return 32;
	default: return 8;
	}
}

/* Folds two integer constants of `type`; false when it does not apply
 * (division by zero, shifts out of range; overflow-prone cases are left to
 * the compiler).  The caller wraps the result to the type. */
static bool fold_ints(ap_kir_binop op, ap_dtype type, int64_t x, int64_t y, int64_t *r)
{
	switch (op) {
	case AP_KIR_ADD: *r = (int64_t)((uint64_t)x + (uint64_t)y); return true;
	case AP_KIR_SUB: *r = (int64_t)((uint64_t)x - (uint64_t)y); return true;
	case AP_KIR_MUL: *r = (int64_t)((uint64_t)x * (uint64_t)y); return true;
	case AP_KIR_DIV:
		if (y == 0 || (x == INT64_MIN && y == -1))
			return false;
		*r = x / y;
		return true;
	case AP_KIR_REM:
		if (y == 0 || y == -1)
			return false;
		*r = x % y;
		return true;
	case AP_KIR_LT: *r = x < y; return true;
	case AP_KIR_LE: *r = x <= y; return true;
	case AP_KIR_GT: *r = x > y; return true;
	case AP_KIR_GE: *r = x >= y; return true;
	case AP_KIR_EQ: *r = x == y; return true;
	case AP_KIR_NE: *r = x != y; return true;
	case AP_KIR_LAND: *r = x && y; return true;
	case AP_KIR_LOR: *r = x || y; return true;
	case AP_KIR_MIN: *r = x < y ? x : y; return true;
	case AP_KIR_MAX: *r = x > y ? x : y; return true;
	case AP_KIR_AND: *r = x & y; return true;
	case AP_KIR_OR: *r = x | y; return true;
	case AP_KIR_XOR: *r = x ^ y; return true;
	case AP_KIR_SHL:
		if (y < 0 || y >= int_bits(type))
			return false;
		*r = (int64_t)((uint64_t)x << y);
		return true;
	case AP_KIR_SHR:
		if (y < 0 || y >= int_bits(type))
			return false;
		/* arithmetic, as C compilers do for signed types (U8 and
		 * BOOL values are never negative) */
		*r = x < 0 ? ~(~x >> y) : x >> y;
		return true;
	case AP_KIR_FLOORDIV:
		if (y == 0 || (x == INT64_MIN && y == -1))
			return false;
		*r = x / y - ((x % y != 0) && ((x < 0) != (y < 0)));
		return true;
	}
	return false;
}

ap_kir_expr *ap_kir_binary(ap_kir_kernel *k, ap_kir_binop op, ap_kir_expr *a, ap_kir_expr *b)
{
	ap_kir_expr *e;
	int64_t x = 0, y = 0, r = 0;
	bool ca, cb;

	if (!a || !b)
		return NULL;
	ca = ap_kir_is_int(a, &x);
	cb = ap_kir_is_int(b, &y);
	if (ca && cb && fold_ints(op, a->type, x, y, &r))
		return ap_kir_int(k, result_is_bool(op) ? AP_DT_BOOL : a->type, r);
	if (!is_float(a->type)) {
		switch (op) {
		case AP_KIR_ADD:
			if (cb && y == 0)
				return a;
			if (ca && x == 0)
				return b;
			/* (e + c1) + c2 -> e + (c1 + c2) */
			if (cb && a->kind == AP_KIR_E_BINARY && a->op == AP_KIR_ADD &&
			    ap_kir_is_int(a->b, &x))
				return ap_kir_binary(k, AP_KIR_ADD, a->a,
						     ap_kir_int(k, a->type, x + y));
			break;
		case AP_KIR_SUB:
			if (cb && y == 0)
				return a;
			if (cb)
				return ap_kir_binary(k, AP_KIR_ADD, a,
						     ap_kir_int(k, a->type, -(uint64_t)y));
			break;
		case AP_KIR_MUL:
			if ((cb && y == 0) || (ca && x == 0))
				return ap_kir_int(k, a->type, 0);
			if (cb && y == 1)
				return a;
			if (ca && x == 1)
				return b;
			break;
		case AP_KIR_DIV:
			if (cb && y == 1)
				return a;
			if (ca && x == 0)
				return a;
			break;
		case AP_KIR_REM:
			if (cb && (y == 1 || y == -1))
				return ap_kir_int(k, a->type, 0);
			if (ca && x == 0)
				return a;
			break;
		case AP_KIR_LAND:
			if (ca)
				return x ? b : a;
			if (cb)
				return y ? a : b;
			break;
		case AP_KIR_LOR:
			if (ca)
				return x ? a : b;
			if (cb)
				return y ? b : a;
			break;
		case AP_KIR_OR:
		case AP_KIR_XOR:
		case AP_KIR_SHL:
		case AP_KIR_SHR:
			if (cb && y == 0)
				return a;
			break;
		case AP_KIR_FLOORDIV:
			if (cb && y == 1)
				return a;
			break;
		default:
			break;
		}
	}
	e = ap__kir_expr_new(k, AP_KIR_E_BINARY, result_is_bool(op) ? AP_DT_BOOL : a->type);
	if (e) {
		e->op = op;
		e->a = a;
		e->b = b;
	}
	return e;
}

ap_kir_expr *ap_kir_select(ap_kir_kernel *k, ap_kir_expr *c, ap_kir_expr *a, ap_kir_expr *b)
{
	ap_kir_expr *e;
	int64_t v;

	if (!c || !a || !b)
		return NULL;
	if (ap_kir_is_int(c, &v))
		return v ? a : b;
	e = ap__kir_expr_new(k, AP_KIR_E_SELECT, a->type);
	if (e) {
		e->a = c;
		e->b = a;
		e->c = b;
	}
	return e;
}

ap_kir_expr *ap_kir_call(ap_kir_kernel *k, ap_kir_fn fn, ap_kir_expr *a, ap_kir_expr *b)
{
	ap_kir_expr *e;

	if (!a || (fn >= AP_KIR_POW && !b))
		return NULL;
	if ((fn == AP_KIR_TF32 || fn == AP_KIR_EX2_APPROX) && a->type != AP_DT_F32) {
		k->failed = true;
		return NULL;
	}
	e = ap__kir_expr_new(k, AP_KIR_E_CALL, a->type);
	if (e) {
		e->op = fn;
		e->a = a;
		e->b = fn >= AP_KIR_POW ? b : NULL;
	}
	return e;
}

ap_kir_expr *ap_kir_cast(ap_kir_kernel *k, ap_dtype type, ap_kir_expr *a)
{
	ap_kir_expr *e;
	int64_t v;

	if (!a)
		return NULL;
	if (a->type == type)
		return a;
	if (type == AP_DT_BOOL) {
		if (ap_kir_is_int(a, &v))
			return ap_kir_int(k, AP_DT_BOOL, v != 0);
		if (a->kind == AP_KIR_E_FLOAT)
			return ap_kir_int(k, AP_DT_BOOL, a->fval != 0);
		return ap_kir_binary(k, AP_KIR_NE, a,
				     is_float(a->type) ? ap_kir_float(k, a->type, 0)
						       : ap_kir_int(k, a->type, 0));
	}
	if (ap_kir_is_int(a, &v))
		return ap_kir_int(k, type, v);
	if (a->kind == AP_KIR_E_FLOAT && is_float(type))
		return ap_kir_float(k, type, a->fval);
	e = ap__kir_expr_new(k, AP_KIR_E_CAST, type);
	if (e)
		e->a = a;
	return e;
}

ap_kir_expr *ap_kir_load(ap_kir_kernel *k, ap_kir_array *arr, ap_kir_expr *index)
{
	ap_kir_expr *e;

	if (!arr || !index)
		return NULL;
	e = ap__kir_expr_new(k, AP_KIR_E_LOAD, arr->type);
	if (e) {
		e->arr = arr;
		e->a = index;
	}
	return e;
}

ap_kir_expr *ap_kir_load_remote(ap_kir_kernel *k, ap_kir_array *arr, ap_kir_expr *index, ap_kir_expr *rank)
{
	ap_kir_expr *e;

	if (!rank)
		return NULL;
	if (!arr || (arr->space != AP_KIR_SHARED && arr->space != AP_KIR_SHARED_DYN) ||
	    (arr->type != AP_DT_F32 && arr->type != AP_DT_F64)) {
		if (k)
			k->failed = true;
		return NULL;
	}
	e = ap_kir_load(k, arr, index);
	if (e)
		e->c = rank;
	return e;
}

ap_kir_expr *ap_kir_add(ap_kir_kernel *k, ap_kir_expr *a, ap_kir_expr *b)
{
	return ap_kir_binary(k, AP_KIR_ADD, a, b);
}

ap_kir_expr *ap_kir_mul(ap_kir_kernel *k, ap_kir_expr *a, ap_kir_expr *b)
{
	return ap_kir_binary(k, AP_KIR_MUL, a, b);
}

ap_kir_expr *ap_kir_addi(ap_kir_kernel *k, ap_kir_expr *a, int64_t b)
{
	return a ? ap_kir_binary(k, AP_KIR_ADD, a, ap_kir_int(k, a->type, b)) : NULL;
}

ap_kir_expr *ap_kir_muli(ap_kir_kernel *k, ap_kir_expr *a, int64_t b)
{
	return a ? ap_kir_binary(k, AP_KIR_MUL, a, ap_kir_int(k, a->type, b)) : NULL;
}

bool ap_kir_expr_equal(const ap_kir_expr *a, const ap_kir_expr *b)
{
	if (a == b)
		return true;
	if (!a || !b || a->kind != b->kind || a->type != b->type || a->op != b->op)
		return false;
	switch (a->kind) {
	case AP_KIR_E_INT:
		return a->ival == b->ival;
	case AP_KIR_E_FLOAT:
		return memcmp(&a->fval, &b->fval, sizeof(double)) == 0;
	case AP_KIR_E_VAR:
		return a->var == b->var;
	case AP_KIR_E_INDEX:
		return true;
	case AP_KIR_E_LOAD:
		return a->arr == b->arr && ap_kir_expr_equal(a->a, b->a) && ap_kir_expr_equal(a->c, b->c);
	default:
		return ap_kir_expr_equal(a->a, b->a) && ap_kir_expr_equal(a->b, b->b) &&
		       ap_kir_expr_equal(a->c, b->c);
	}
}

/* ---- statements ---------------------------------------------------------- */

ap_kir_stmt *ap__kir_stmt_append(ap_kir_kernel *k, ap_kir_block *b, ap_kir_stmt_kind kind)
{
	ap_kir_stmt *s;

	if (!b)
		return NULL;
	s = ap__kir_alloc(k, sizeof(*s));
	if (!s)
		return NULL;
	s->kind = kind;
	if (b->last)
		b->last->next = s;
	else
		b->first = s;
	b->last = s;
	return s;
}

/* A statement that could not be built marks the kernel failed, so that a
 * half-built body is never printed. */
static ap_kir_stmt *fail(ap_kir_kernel *k)
{
	if (k)
		k->failed = true;
	return NULL;
}

ap_kir_stmt *ap_kir_for(ap_kir_kernel *k, ap_kir_block *b, ap_kir_var *var,
			ap_kir_expr *lo, ap_kir_expr *hi, int64_t step)
{
	return ap_kir_for_unroll(k, b, var, lo, hi, step, 0);
}

ap_kir_stmt *ap_kir_for_unroll(ap_kir_kernel *k, ap_kir_block *b, ap_kir_var *var,
			       ap_kir_expr *lo, ap_kir_expr *hi, int64_t step, int unroll)
{
	ap_kir_stmt *s;

	if (!var || !lo || !hi || step <= 0 || unroll < -1)
		return fail(k);
	s = ap__kir_stmt_append(k, b, AP_KIR_S_FOR);
	if (s) {
		s->var = var;
		s->lo = lo;
		s->hi = hi;
		s->step = step;
		s->unroll = unroll;
	}
	return s;
}

ap_kir_stmt *ap_kir_if(ap_kir_kernel *k, ap_kir_block *b, ap_kir_expr *cond)
{
	ap_kir_stmt *s;

	if (!cond)
		return fail(k);
	s = ap__kir_stmt_append(k, b, AP_KIR_S_IF);
	if (s)
		s->cond = cond;
	return s;
}

ap_kir_stmt *ap_kir_let(ap_kir_kernel *k, ap_kir_block *b, ap_kir_var *var, ap_kir_expr *value)
{
	ap_kir_stmt *s;

	if (!var)
		return fail(k);
	s = ap__kir_stmt_append(k, b, AP_KIR_S_LET);
	if (s) {
		s->var = var;
		s->value = value;
	}
	return s;
}

ap_kir_stmt *ap_kir_assign(ap_kir_kernel *k, ap_kir_block *b, ap_kir_var *var, ap_kir_expr *value)
{
	ap_kir_stmt *s;

	if (!var || !value)
		return fail(k);
	s = ap__kir_stmt_append(k, b, AP_KIR_S_ASSIGN);
	if (s) {
		s->var = var;
		s->value = value;
	}
	return s;
}

ap_kir_stmt *ap_kir_store(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *arr,
			  ap_kir_expr *index, ap_kir_expr *value)
{
	ap_kir_stmt *s;

	if (!arr || !index || !value)
		return fail(k);
	s = ap__kir_stmt_append(k, b, AP_KIR_S_STORE);
	if (s) {
		s->arr = arr;
		s->index = index;
		s->value = value;
	}
	return s;
}

ap_kir_stmt *ap_kir_barrier(ap_kir_kernel *k, ap_kir_block *b)
{
	return ap__kir_stmt_append(k, b, AP_KIR_S_BARRIER);
}

ap_kir_stmt *ap_kir_cluster_barrier(ap_kir_kernel *k, ap_kir_block *b)
{
	return ap__kir_stmt_append(k, b, AP_KIR_S_CLUSTER_BARRIER);
}

/* True when variable v occurs in e. */
static bool expr_uses_var(const ap_kir_expr *e, const ap_kir_var *v)
{
	if (!e)
		return false;
	if (e->kind == AP_KIR_E_VAR)
		return e->var == v;
	return expr_uses_var(e->a, v) || expr_uses_var(e->b, v) || expr_uses_var(e->c, v);
}

static bool is_int_type(ap_dtype t)
{
	return t == AP_DT_I64 || t == AP_DT_I32 || t == AP_DT_I8 || t == AP_DT_U8;
}

ap_kir_stmt *ap_kir_shfl(ap_kir_kernel *k, ap_kir_block *b, ap_kir_var *dst,
			 ap_kir_shfl_kind kind, ap_kir_expr *value, ap_kir_expr *lane,
			 unsigned width)
{
	ap_kir_stmt *s;

	if (!dst || !value || !lane || width < 1 || width > 32 || (width & (width - 1)) ||
	    (unsigned)kind > AP_KIR_SHFL_IDX || !is_int_type(lane->type) ||
	    value->type != dst->type || expr_uses_var(value, dst))
		return fail(k);
	s = ap__kir_stmt_append(k, b, AP_KIR_S_SHFL);
	if (s) {
		s->var = dst;
		s->shfl = kind;
		s->value = value;
		s->lane = lane;
		s->width = (int)width;
	}
	return s;
}

bool ap_kir_vector_ok(ap_dtype type, int width)
{
	size_t es = ap_dtype_size(type), bytes = es * (size_t)(width > 0 ? width : 0);

	if (width != 2 && width != 4 && width != 8)
		return false;
	if (width == 8 && es != 2)
		return false;
	return bytes == 4 || bytes == 8 || bytes == 16;
}

ap_kir_stmt *ap_kir_vload(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *arr,
			  ap_kir_expr *index, int width, ap_kir_var *const *dst)
{
	ap_kir_stmt *s;

	if (!arr || !index || !dst || !ap_kir_vector_ok(arr->type, width))
		return fail(k);
	for (int i = 0; i < width; i++)
		if (!dst[i] || dst[i]->type != arr->type)
			return fail(k);
	s = ap__kir_stmt_append(k, b, AP_KIR_S_VLOAD);
	if (!s)
		return NULL;
	s->vars = ap__kir_alloc(k, (size_t)width * sizeof(*s->vars));
	if (!s->vars)
		return NULL;
	memcpy(s->vars, dst, (size_t)width * sizeof(*s->vars));
	s->arr = arr;
	s->index = index;
	s->width = width;
	return s;
}

ap_kir_stmt *ap_kir_vstore(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *arr,
			   ap_kir_expr *index, int width, ap_kir_expr *const *values)
{
	ap_kir_stmt *s;

	if (!arr || !index || !values || !ap_kir_vector_ok(arr->type, width))
		return fail(k);
	for (int i = 0; i < width; i++)
		if (!values[i] || values[i]->type != arr->type)
			return fail(k);
	s = ap__kir_stmt_append(k, b, AP_KIR_S_VSTORE);
	if (!s)
		return NULL;
	s->values = ap__kir_alloc(k, (size_t)width * sizeof(*s->values));
	if (!s->values)
		return NULL;
	memcpy(s->values, values, (size_t)width * sizeof(*s->values));
	s->arr = arr;
	s->index = index;
	s->width = width;
	return s;
}

static bool is_shared_space(ap_kir_space sp)
{
	return sp == AP_KIR_SHARED || sp == AP_KIR_SHARED_DYN;
}

ap_kir_stmt *ap_kir_cp_async(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *arr,
			     ap_kir_expr *index, ap_kir_array *src, ap_kir_expr *src_index,
			     int width, ap_kir_expr *cond)
{
	size_t bytes;
	ap_kir_stmt *s;

	if (!arr || !index || !src || !src_index || !is_shared_space(arr->space) ||
	    src->space != AP_KIR_GLOBAL || src->type != arr->type || !is_int_type(index->type) ||
	    !is_int_type(src_index->type) || (cond && cond->type != AP_DT_BOOL) || width < 1)
		return fail(k);
	bytes = ap_dtype_size(arr->type) * (size_t)width;
	if (bytes != 4 && bytes != 8 && bytes != 16)
		return fail(k);
	s = ap__kir_stmt_append(k, b, AP_KIR_S_CP_ASYNC);
	if (s) {
		s->arr = arr;
		s->index = index;
		s->src = src;
		s->src_index = src_index;
		s->width = width;
		s->cond = cond;
	}
	return s;
}

ap_kir_stmt *ap_kir_cp_commit(ap_kir_kernel *k, ap_kir_block *b)
{
	return ap__kir_stmt_append(k, b, AP_KIR_S_CP_COMMIT);
}

ap_kir_stmt *ap_kir_cp_wait(ap_kir_kernel *k, ap_kir_block *b, int n)
{
	ap_kir_stmt *s;

	if (n < 0)
		return fail(k);
	s = ap__kir_stmt_append(k, b, AP_KIR_S_CP_WAIT);
	if (s)
		s->step = n;
	return s;
}

ap_kir_stmt *ap_kir_ldmatrix(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *dst,
			     ap_kir_expr *off, ap_kir_array *src, ap_kir_expr *row, int num,
			     bool trans)
{
	size_t es;
	ap_kir_stmt *s;

	if (!dst || !off || !src || !row || dst->space != AP_KIR_LOCAL || !is_shared_space(src->space) ||
	    dst->type != src->type || !is_int_type(off->type) || !is_int_type(row->type) ||
	    (num != 1 && num != 2 && num != 4))
		return fail(k);
	es = ap_dtype_size(src->type);
	if ((es != 2 && es != 4) || (trans && es != 2))
		return fail(k);
	s = ap__kir_stmt_append(k, b, AP_KIR_S_LDMATRIX);
	if (s) {
		s->arr = dst;
		s->index = off;
		s->src = src;
		s->src_index = row;
		s->width = num;
		s->trans = trans;
	}
	return s;
}

void ap_kir_mma_frag_sizes(ap_kir_mma_kind kind, int *a, int *b, int *c)
{
	bool tf32 = kind == AP_KIR_MMA_TF32_1688;

	*a = tf32 ? 4 : 8;
	*b = tf32 ? 2 : 4;
	*c = 4;
}

/* The input type of an mma kind's A and B fragments. */
ap_dtype ap__kir_mma_in_type(int kind)
{
	switch (kind) {
	case AP_KIR_MMA_F16_16816: return AP_DT_F16;
	case AP_KIR_MMA_BF16_16816: return AP_DT_BF16;
	default: return AP_DT_F32;
	}
}

ap_kir_stmt *ap_kir_mma(ap_kir_kernel *k, ap_kir_block *b, ap_kir_mma_kind kind,
			ap_kir_array *d, ap_kir_expr *d_off, ap_kir_array *a, ap_kir_expr *a_off,
			ap_kir_array *bb, ap_kir_expr *b_off, ap_kir_array *c, ap_kir_expr *c_off)
{
	ap_kir_array *fr[4] = {d, a, bb, c};
	ap_kir_expr *off[4] = {d_off, a_off, b_off, c_off};
	ap_kir_stmt *s;

	if ((unsigned)kind > AP_KIR_MMA_TF32_1688)
		return fail(k);
	for (int i = 0; i < 4; i++) {
		ap_dtype want = i == 1 || i == 2 ? ap__kir_mma_in_type(kind) : AP_DT_F32;

		if (!fr[i] || !off[i] || fr[i]->space != AP_KIR_LOCAL || fr[i]->type != want ||
		    !is_int_type(off[i]->type))
			return fail(k);
	}
	s = ap__kir_stmt_append(k, b, AP_KIR_S_MMA);
	if (s) {
		s->mma = kind;
		memcpy(s->frag, fr, sizeof(fr));
		memcpy(s->frag_off, off, sizeof(off));
	}
	return s;
}

/* A wgmma layout the ISA allows: 16-byte multiples below 2^18, a swizzle
 * of none, 32, 64 or 128 bytes. */
static bool wg_layout_ok(ap_kir_wg_layout l)
{
	return (l.swizzle == 0 || l.swizzle == 32 || l.swizzle == 64 || l.swizzle == 128) && l.lbo >= 16 && l.sbo >= 16 && l.lbo % 16 == 0 && l.sbo % 16 == 0 && l.lbo < (1 << 18) &&
	       l.sbo < (1 << 18);
}

ap_dtype ap_kir_wgmma_type(ap_kir_wgmma_kind kind)
{
	return kind == AP_KIR_WGMMA_F16 ? AP_DT_F16 : kind == AP_KIR_WGMMA_BF16 ? AP_DT_BF16 : AP_DT_F32;
}

int ap_kir_wgmma_k(ap_kir_wgmma_kind kind)
{
	return kind == AP_KIR_WGMMA_TF32 ? 8 : 16;
}

ap_kir_stmt *ap_kir_wgmma(ap_kir_kernel *k, ap_kir_block *b, ap_kir_wgmma_kind kind, int n,
			  ap_kir_array *d, ap_kir_expr *d_off, ap_kir_array *a, ap_kir_expr *a_start,
			  ap_kir_wg_layout la, ap_kir_array *bb, ap_kir_expr *b_start,
			  ap_kir_wg_layout lb)
{
	ap_dtype in = ap_kir_wgmma_type(kind);
	ap_kir_stmt *s;

	bool rs = a && a->space == AP_KIR_LOCAL;   /* A from registers */

	if ((unsigned)kind > AP_KIR_WGMMA_TF32 || (kind == AP_KIR_WGMMA_TF32 && (rs || la.mn_major || lb.mn_major)) ||
	    n < 8 || n > 256 || n % 8 || !d || !d_off || !a || !a_start || !bb || !b_start || d->space != AP_KIR_LOCAL || d->type != AP_DT_F32 ||
	    (!rs && !is_shared_space(a->space)) || !is_shared_space(bb->space) || a->type != in || bb->type != in ||
	    !is_int_type(d_off->type) || !is_int_type(a_start->type) || !is_int_type(b_start->type) ||
	    (!rs && !wg_layout_ok(la)) || !wg_layout_ok(lb))
		return fail(k);
	if (rs)
		la = (ap_kir_wg_layout){false, 16, 16, 0};
	s = ap__kir_stmt_append(k, b, AP_KIR_S_WGMMA);
	if (s) {
		s->mma = kind;
		s->width = n;
		s->frag[0] = d;
		s->frag[1] = a;
		s->frag[2] = bb;
		s->frag_off[0] = d_off;
		s->frag_off[1] = a_start;
		s->frag_off[2] = b_start;
		s->wg[0] = la;
		s->wg[1] = lb;
	}
	return s;
}

/* wgmma.fence / wait_group: acc a float32 register array (or NULL for
 * the commit). */
static ap_kir_stmt *wg_sync(ap_kir_kernel *k, ap_kir_block *b, ap_kir_stmt_kind kind, int n,
			    ap_kir_array *acc)
{
	ap_kir_stmt *s;

	if (n < 0 || (kind != AP_KIR_S_WGMMA_COMMIT && (!acc || acc->space != AP_KIR_LOCAL ||
							 acc->type != AP_DT_F32)))
		return fail(k);
	s = ap__kir_stmt_append(k, b, kind);
	if (s) {
		s->step = n;
		s->frag[0] = acc;
	}
	return s;
}

ap_kir_stmt *ap_kir_wgmma_fence(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *acc)
{
	return wg_sync(k, b, AP_KIR_S_WGMMA_FENCE, 0, acc);
}

ap_kir_stmt *ap_kir_wgmma_commit(ap_kir_kernel *k, ap_kir_block *b)
{
	return wg_sync(k, b, AP_KIR_S_WGMMA_COMMIT, 0, NULL);
}

ap_kir_stmt *ap_kir_wgmma_wait(ap_kir_kernel *k, ap_kir_block *b, int n, ap_kir_array *acc)
{
	return wg_sync(k, b, AP_KIR_S_WGMMA_WAIT, n, acc);
}

ap_kir_stmt *ap_kir_fence_proxy_async(ap_kir_kernel *k, ap_kir_block *b)
{
	return ap__kir_stmt_append(k, b, AP_KIR_S_FENCE_ASYNC);
}

ap_kir_array *ap_kir_mbarriers(ap_kir_kernel *k, const char *name, int n)
{
	ap_kir_array *a;

	if (k && (n < 1 || n > 64)) {
		k->failed = true;
		return NULL;
	}
	a = ap_kir_shared(k, name, AP_DT_I64, n);
	if (a)
		a->mbar = true;
	return a;
}

/* An mbarrier statement on bar[index] with value v. */
static ap_kir_stmt *mbar_stmt(ap_kir_kernel *k, ap_kir_block *b, ap_kir_stmt_kind kind, ap_kir_array *bar,
			      ap_kir_expr *index, ap_kir_expr *v, bool need_v)
{
	ap_kir_stmt *s;

	if (!bar || !bar->mbar || !index || (need_v && !v))
		return fail(k);
	s = ap__kir_stmt_append(k, b, kind);
	if (s) {
		s->arr = bar;
		s->index = index;
		s->value = v;
	}
	return s;
}

ap_kir_stmt *ap_kir_mbar_init(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *bar, ap_kir_expr *index,
			      ap_kir_expr *count)
{
	if (count && count->kind == AP_KIR_E_INT && (count->ival < 1 || count->ival > (1 << 20) - 1))
		return fail(k);
	return mbar_stmt(k, b, AP_KIR_S_MBAR_INIT, bar, index, count, true);
}

ap_kir_stmt *ap_kir_mbar_arrive(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *bar, ap_kir_expr *index,
				ap_kir_expr *tx)
{
	return mbar_stmt(k, b, AP_KIR_S_MBAR_ARRIVE, bar, index, tx, false);
}

ap_kir_stmt *ap_kir_mbar_wait(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *bar, ap_kir_expr *index,
			      ap_kir_expr *parity)
{
	return mbar_stmt(k, b, AP_KIR_S_MBAR_WAIT, bar, index, parity, true);
}

ap_kir_stmt *ap_kir_mbar_arrive_each(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *bar, ap_kir_expr *index,
				     int64_t group)
{
	ap_kir_expr *tid = ap_kir_index_of(k, AP_KIR_THREAD_X);
	ap_kir_stmt *one = ap_kir_if(k, b, ap_kir_binary(k, AP_KIR_EQ, ap_kir_binary(k, AP_KIR_AND, tid,
								       ap_kir_idx(k, group - 1)), ap_kir_idx(k, 0)));

	return one ? ap_kir_mbar_arrive(k, &one->body, bar, index, NULL) : NULL;
}

ap_kir_stmt *ap_kir_roles(ap_kir_kernel *k, ap_kir_block *b)
{
	return ap__kir_stmt_append(k, b, AP_KIR_S_ROLES);
}

ap_kir_stmt *ap_kir_arm(ap_kir_kernel *k, ap_kir_stmt *roles, unsigned lo, unsigned hi, unsigned grain,
			int maxnreg)
{
	ap_kir_stmt *s;

	if (!roles || roles->kind != AP_KIR_S_ROLES || grain == 0 || grain % 32 || lo >= hi || lo % grain ||
	    hi % grain)
		return fail(k);
	s = ap__kir_stmt_append(k, &roles->body, AP_KIR_S_ARM);
	if (s) {
		s->arm_lo = lo;
		s->arm_hi = hi;
		s->arm_grain = grain;
		s->maxnreg = maxnreg;
	}
	return s;
}

ap_kir_stmt *ap_kir_bulk_copy(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *dst, ap_kir_expr *index,
			      ap_kir_array *src, ap_kir_expr *src_index, int bytes, ap_kir_array *bar,
			      ap_kir_expr *bar_index)
{
	ap_kir_stmt *s;

	if (!dst || !index || !src || !src_index || !bar || !bar->mbar || !bar_index || bytes <= 0 ||
	    bytes % 16 || (dst->space != AP_KIR_SHARED && dst->space != AP_KIR_SHARED_DYN) || dst->mbar ||
	    src->space != AP_KIR_GLOBAL || src->type != dst->type ||
	    (size_t)bytes % ap_dtype_size(dst->type))
		return fail(k);
	s = ap__kir_stmt_append(k, b, AP_KIR_S_BULK_COPY);
	if (s) {
		s->arr = dst;
		s->index = index;
		s->src = src;
		s->src_index = src_index;
		s->width = bytes;
		s->bar = bar;
		s->bar_index = bar_index;
	}
	return s;
}

int ap_kir_tensor_map(ap_kir_kernel *k, ap_kir_array *buf, const ap_tmap_desc *d)
{
	ap_tmap_desc *c;

	if (!k || k->failed)
		return -1;
	if (!buf || !d || buf->space != AP_KIR_GLOBAL || buf->tmap || ap_tmap_dtype_of((int)buf->type) != d->dtype ||
	    ap_tmap_check(d, NULL, NULL, 0)) {
		k->failed = true;
		return -1;
	}
	if (!(c = ap__kir_alloc(k, sizeof(*c))))
		return -1;
	*c = *d;
	buf->tmap = c;
	return 0;
}

ap_kir_stmt *ap_kir_tma_load(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *dst, ap_kir_expr *index,
			     ap_kir_array *buf, ap_kir_expr *const *coords, ap_kir_array *bar,
			     ap_kir_expr *bar_index)
{
	ap_kir_stmt *s;
	ap_kir_expr **v;

	if (!dst || !index || !buf || !buf->tmap || !coords || !bar || !bar->mbar || !bar_index ||
	    dst->space != AP_KIR_SHARED_DYN || dst->type != buf->type)
		return fail(k);
	for (int i = 0; i < buf->tmap->rank; i++)
		if (!coords[i])
			return fail(k);
	if (!(v = ap__kir_alloc(k, (size_t)buf->tmap->rank * sizeof(*v))))
		return fail(k);
	s = ap__kir_stmt_append(k, b, AP_KIR_S_TMA_LOAD);
	if (s) {
		s->arr = dst;
		s->index = index;
		s->src = buf;
		s->width = buf->tmap->rank;
		s->values = v;
		for (int i = 0; i < s->width; i++)
			v[i] = coords[i];
		s->bar = bar;
		s->bar_index = bar_index;
	}
	return s;
}

ap_kir_stmt *ap_kir_comment(ap_kir_kernel *k, ap_kir_block *b, const char *fmt, ...)
{
	char buf[256];
	va_list ap;
	ap_kir_stmt *s;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	/* comments must not close themselves */
	for (char *p = buf; *p; p++) {
		if (p[0] == '*' && p[1] == '/')
			p[1] = '_';
		if ((unsigned char)*p < ' ')
			*p = ' ';
	}
	s = ap__kir_stmt_append(k, b, AP_KIR_S_COMMENT);
	if (s) {
		s->text = ap__kir_strdup(k, buf);
		if (!s->text)
			return NULL;
	}
	return s;
}

ap_kir_expr *ap_kir_bind(ap_kir_kernel *k, ap_kir_block *b, ap_dtype type,
			 const char *prefix, ap_kir_expr *value)
{
	ap_kir_var *v;

	if (!value)
		return NULL;
	/* constants and plain references need no register */
	if (value->kind == AP_KIR_E_INT || value->kind == AP_KIR_E_FLOAT ||
	    value->kind == AP_KIR_E_VAR)
		return value;
	v = ap_kir_var_new(k, type, prefix);
	if (!ap_kir_let(k, b, v, value))
		return NULL;
	return ap_kir_ref(k, v);
}
