/* value.h -- the value builder every emitter shares: the value of any
 * tensor of a micro-graph at any index, as kernel IR.
 *
 * ap_val(v, t, ix) builds the value of tensor t at index ix:
 *   - the emitter's leaf hook is asked first (a value it holds itself: a
 *     tile staged in shared memory, a row statistic in a register, a
 *     vector-loaded element);
 *   - CONST tensors are literals (one element, all elements equal, or an
 *     element at a constant index), loads from a constant array baked into
 *     the source (at most AP_CONST_BAKE_MAX elements), or loads from a
 *     buffer (larger ones: a BUF_CONST buffer whose bytes travel in the
 *     bundle, so kernels of identical layers with different constants are
 *     one kernel);
 *   - views (Reshape, Identity) relinearise ix onto their input;
 *   - a tensor made by a node of the micro-graph is computed from its
 *     inputs' values at the indices its op maps ix to (per-op scalar
 *     semantics in scalar.c; matmul, convolution, pooling, LRN and serial
 *     reductions as loops in compute.c; data movement as index maps here);
 *   - anything else is a load from a kernel parameter (a buffer).
 * An index (ap_lidx) is a set of coordinates and/or a linear row-major
 * index, each derived from the other on demand as pure expressions (no
 * registers), so an index made in one scope is valid in every scope nested
 * in it.  Values are bound to registers and remembered per (tensor, index)
 * in a memo with scopes: a value computed inside a loop body or a branch is
 * forgotten when that scope closes, so it is never used outside it.
 *
 * Errors: the first failure is kept in v->rc / *v->err (AP_EUNSUPPORTED
 * naming the node, AP_ENOMEM) and every later call returns NULL, the kir
 * convention of propagating NULL.
 *
 * Numerics follow the ONNX reference semantics (see scalar.c).
 */
#ifndef AP_LOWER_VALUE_H
#define AP_LOWER_VALUE_H

#include "../kir/kir.h"
#include "../partition/mgraph.h"

/* Constants of at most this many elements (not all equal) are baked into
 * a kernel's source; larger ones are read from a buffer. */
#define AP_CONST_BAKE_MAX 16

typedef struct ap_lidx {
	int rank;
	int64_t dims[AP_MAX_RANK];
	ap_kir_expr *c[AP_MAX_RANK];   /* coordinates, NULL = derive from lin */
	ap_kir_expr *lin;              /* linear row-major index, NULL = derive */
} ap_lidx;

typedef struct ap_vctx ap_vctx;

/* An emitter's leaf hook: the value of tensor t at ix when the emitter
 * holds it, else NULL (the builder then computes or loads it).  It may
 * emit statements into v->cur and must not fail silently: on error set
 * v->rc through ap_v_fail. */
typedef ap_kir_expr *(*ap_leaf_fn)(ap_vctx *v, int t, ap_lidx *ix, void *user);

struct memo_ent;

struct ap_vctx {
	const ap_mgraph *m;
	const ap_graph *g;             /* m->g */
	ap_kir_kernel *k;
	ap_kir_block *cur;             /* where statements go */
	int depth;
	struct memo_ent *memo;
	int n_memo, cap_memo;
	ap_kir_array **arr_of;         /* per tensor of g: parameter or constant array */
	int n_consts;
	int rc;                        /* first failure, 0 while none */
	ap_error *err;
	ap_leaf_fn leaf;               /* may be NULL */
	void *leaf_user;
};

/* Prepares v for building kernel k (whose body receives the statements)
 * from micro-graph m.  Creates one written GLOBAL parameter per output of
 * m, in m->g->outputs order (p0, p1, ...).  0 or AP_ENOMEM (err set). */
int ap_vctx_init(ap_vctx *v, __ap_keep const ap_mgraph *m, __ap_keep ap_kir_kernel *k,
		 ap_error *err);
void ap_vctx_clear(ap_vctx *v);
/* Records a failure (the first one wins) and returns NULL. */
ap_kir_expr *ap_v_fail(ap_vctx *v, int code, const ap_node *n, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* ---- indices -------------------------------------------------------------- */

ap_lidx ap_lidx_shape(const ap_tensor *t);       /* no coordinates yet */
bool ap_lidx_same_dims(const ap_lidx *a, const ap_tensor *t);
int64_t ap_lidx_stride(const ap_lidx *ix, int d); /* elements */
/* Coordinate d (derived from the linear index when not set; 0 for a
 * dimension of size 1). */
ap_kir_expr *ap_lidx_coord(ap_vctx *v, ap_lidx *ix, int d);
ap_kir_expr *ap_lidx_linear(ap_vctx *v, ap_lidx *ix);
/* Index into tensor t, numpy-broadcast to ix's shape, for element ix. */
ap_lidx ap_lidx_bcast(ap_vctx *v, ap_lidx *ix, int t);
/* The same element seen with tensor t's shape (same element count). */
ap_lidx ap_lidx_relin(ap_vctx *v, ap_lidx *ix, int t);
bool ap_lidx_equal(const ap_lidx *a, const ap_lidx *b);

/* ---- scopes ------------------------------------------------------------------ */

/* Opens the body of `for (var = lo; var < hi; var += step)` in v->cur;
 * returns var; *saved receives the block to return to (ap_v_close). */
ap_kir_var *ap_v_loop(ap_vctx *v, const char *prefix, ap_kir_expr *lo, ap_kir_expr *hi,
		      int64_t step, ap_kir_block **saved);
/* ap_v_loop over [0, n) with step 1, marked to unroll fully (register
 * arrays indexed by its variable must see constants, or they leave the
 * registers for local memory). */
ap_kir_var *ap_v_loop_unrolled(ap_vctx *v, const char *prefix, int64_t n, ap_kir_block **saved);
/* Opens the then-branch of `if (cond)`; *stmt gets the statement (for an
 * else branch: ap_v_else). */
void ap_v_if(ap_vctx *v, ap_kir_expr *cond, ap_kir_block **saved, ap_kir_stmt **stmt);
/* Closes the current scope and opens the else branch of `stmt`. */
void ap_v_else(ap_vctx *v, ap_kir_stmt *stmt);
/* Closes a scope: memo entries made inside it are dropped. */
void ap_v_close(ap_vctx *v, ap_kir_block *saved);

/* ---- values ------------------------------------------------------------------ */

/* The value of tensor t (of m->g) at ix, of t's dtype, bound to a register
 * unless trivial.  NULL after a failure. */
ap_kir_expr *ap_val(ap_vctx *v, int t, ap_lidx *ix);
/* The parameter for tensor t: its written parameter when t is an output,
 * else a read-only parameter created on first use. */
ap_kir_array *ap_v_buffer(ap_vctx *v, int t);
/* Remembers `val` as the value of t at ix in the current scope, so that
 * ap_val finds it (vector loads, values computed by the emitter). */
void ap_v_remember(ap_vctx *v, int t, const ap_lidx *ix, ap_kir_expr *val);
/* Binds an intermediate so it is evaluated once. */
ap_kir_expr *ap_v_once(ap_vctx *v, ap_kir_expr *e);
/* An index value q (any integer dtype) as int64, a negative one counted
 * from the end of a dimension of size D (q + D), bound once; not clamped. */
ap_kir_expr *ap_v_wrap_index(ap_vctx *v, ap_kir_expr *q, int64_t D);

/* ---- per-op scalar semantics (scalar.c) -------------------------------------- */

bool ap_dtype_is_float(ap_dtype t);
/* The type a reduction or a product over values of type t accumulates in:
 * float32 for float16 / bfloat16 (as frameworks do), t otherwise. */
ap_dtype ap_acc_type(ap_dtype t);
ap_kir_expr *ap_v_const(ap_vctx *v, ap_dtype t, double x);
/* NaN-propagating maximum / minimum for floats, plain for integers. */
ap_kir_expr *ap_v_max(ap_vctx *v, ap_kir_expr *a, ap_kir_expr *b);
ap_kir_expr *ap_v_min(ap_vctx *v, ap_kir_expr *a, ap_kir_expr *b);
/* The value of elementwise op `node` applied to x (result dtype out). */
ap_kir_expr *ap_v_unary(ap_vctx *v, const ap_node *node, ap_kir_expr *x, ap_dtype out);
/* The value of binary broadcast op `node` (Add, Div, Pow, Mod, Equal, ...). */
ap_kir_expr *ap_v_binary(ap_vctx *v, const ap_node *node, ap_kir_expr *a, ap_kir_expr *b);
/* Reductions: identity element and combining step of ReduceSum / Max /
 * Min / Prod (ReduceMean & co. are opened into these by expand.c). */
ap_kir_expr *ap_v_reduce_identity(ap_vctx *v, ap_op op, ap_dtype t);
ap_kir_expr *ap_v_reduce_combine(ap_vctx *v, ap_op op, ap_kir_expr *acc, ap_kir_expr *x);
double ap_dtype_lowest(ap_dtype t);
double ap_dtype_highest(ap_dtype t);

/* ---- loops: reductions, matmul, convolution, pooling (compute.c) -------------- */

/* Elements a reduction node reduces per output element (product of the
 * reduced dims). */
int64_t ap_reduced_count(const ap_graph *g, const ap_node *node);
/* Index into the reduction input x for output element `out` and reduced
 * element `r` (linear over the reduced axes, innermost fastest). */
ap_lidx ap_reduce_in_idx(ap_vctx *v, const ap_node *node, int x, ap_lidx *out, ap_kir_expr *r);
/* Value of tensor t made by node n (of a loop-shaped op: reduction
 * computed serially, MatMul, Conv, ConvTranspose, MaxPool, AveragePool,
 * LRN, ScatterElements, ScatterND, CumSum, ArgMax, ArgMin) at ix. */
ap_kir_expr *ap_v_loop_op(ap_vctx *v, const ap_node *node, int t, ap_lidx *ix);

/* Marks, starting from tensor t read at "the current element" (the index
 * the kernel iterates), every tensor the value builder reads at that very
 * element through elementwise ops, same-shape broadcasts and views:
 * cur[x] = 1 while every read of x seen is there, 2 once x is read at
 * another index too (a reduction's input, an index map, a broadcast from
 * another shape) -- and so, then, is everything it is computed from.
 * With `rows` (a kernel holding each reduction's result per row, whose
 * caller marks the reductions' inputs itself) nothing is marked through a
 * reduction.  `seen` (per tensor, zeroed by the caller) stops revisits.
 * Call once per tensor the kernel iterates. */
void ap_v_mark_current(const ap_graph *g, int t, bool rows, unsigned char *cur,
		       unsigned char *seen);

/* 32-bit index arithmetic (much cheaper on a GPU) when every tensor of g
 * has fewer than 2^30 elements: linear indices, coordinates and a
 * grid-stride step (< 2^26) then stay below 2^31; else 64-bit. */
ap_dtype ap_index_type_for(const ap_graph *g);

#endif
