/* kir.h -- Apollo's kernel IR: one small structured IR for every kernel,
 * with two printers (CUDA C for NVRTC, plain C11 for the host).
 *
 * A kernel is
 *   - arrays: global parameters (buffers bound by the launch plan), static
 *     and dynamic shared memory, per-thread register arrays, and constant
 *     data baked into the source (small CONST tensors);
 *   - a fixed launch shape: grid[3] blocks of block[3] threads, plus the
 *     dynamic shared memory it needs (bytes);
 *   - a body: a list of statements every thread runs (SPMD, as in CUDA).
 *
 * Statements: `for` (lower bound, exclusive upper bound, positive constant
 * step; bounds are expressions of enclosing loop variables, block and
 * thread indices and constants), `if`/`else`, `let` (declares a scalar
 * register, optionally with a value), `assign` (to a register), `store`
 * (to an array element), `barrier` (__syncthreads) and comments.  This is
 * the shape of isl's AST (for / if / block / user nodes), so a polyhedral
 * schedule can later be printed into it one node for one statement.
 *
 * Expressions are trees of typed nodes: integer and floating constants,
 * variables, block/thread indices, unary and binary operators, select,
 * math calls, casts and loads.  Scalar types are ap_dtype values (bool is
 * one byte in memory, 0 or 1).  Builders fold integer constants (x+0, x*1,
 * 2*3) so that index arithmetic stays readable.
 *
 * Memory: every node of a kernel lives in the kernel's arena and is freed
 * with it.  Builders never fail loudly: an allocation failure returns NULL,
 * every builder given a NULL operand returns NULL, statement builders
 * ignore NULL, and the kernel remembers the failure (ap_kir_failed), which
 * the caller checks once at the end -- isl's convention of propagating
 * NULL.
 *
 * The host printer follows the ABI of server/plan/program.h: the blocks in
 * [block_begin, block_end) become a loop, threads become a loop, and each
 * barrier splits the thread loop into phases.  Statements that contain a
 * barrier must be uniform over the threads of a block (loop bounds and
 * conditions may use block indices, but not thread indices or registers),
 * as CUDA itself requires.  Registers declared directly in a statement list
 * that contains a barrier live across phases and get one slot per thread.
 */
#ifndef AP_KIR_H
#define AP_KIR_H

#include "../../common/graph.h"

typedef enum ap_kir_space {
	AP_KIR_GLOBAL = 0,     /* kernel parameter: a buffer in global memory */
	AP_KIR_SHARED = 1,     /* static __shared__ array, one per block */
	AP_KIR_SHARED_DYN = 2, /* slice of the dynamic shared memory */
	AP_KIR_LOCAL = 3,      /* per-thread register array */
	AP_KIR_CONST = 4,      /* constant data baked into the source */
} ap_kir_space;

typedef struct ap_kir_array {
	int id;
	char *name;
	ap_dtype type;
	ap_kir_space space;
	int64_t size;          /* elements (all spaces but GLOBAL) */
	int param;             /* GLOBAL: position in the parameter list; else -1 */
	bool written;          /* GLOBAL: the kernel stores to it */
	int tensor;            /* GLOBAL: graph tensor bound to it (-1 if none) */
	uint64_t offset;       /* SHARED_DYN: byte offset in dynamic shared memory */
	void *data;            /* CONST: `size` elements, row-major, owned by the arena */
} ap_kir_array;

typedef struct ap_kir_var {
	int id;
	ap_dtype type;
	char name[24];
} ap_kir_var;

typedef enum ap_kir_expr_kind {
	AP_KIR_E_INT,      /* ival */
	AP_KIR_E_FLOAT,    /* fval */
	AP_KIR_E_VAR,      /* var */
	AP_KIR_E_INDEX,    /* op: an ap_kir_index */
	AP_KIR_E_UNARY,    /* op: an ap_kir_unop; a */
	AP_KIR_E_BINARY,   /* op: an ap_kir_binop; a, b */
	AP_KIR_E_SELECT,   /* a ? b : c */
	AP_KIR_E_CALL,     /* op: an ap_kir_fn; a (, b) */
	AP_KIR_E_CAST,     /* (type)a */
	AP_KIR_E_LOAD,     /* arr[a] */
} ap_kir_expr_kind;

typedef enum ap_kir_index {
	AP_KIR_BLOCK_X, AP_KIR_BLOCK_Y, AP_KIR_BLOCK_Z,
	AP_KIR_THREAD_X, AP_KIR_THREAD_Y, AP_KIR_THREAD_Z,
} ap_kir_index;

typedef enum ap_kir_unop {
	AP_KIR_NEG,        /* -a */
	AP_KIR_LNOT,       /* !a (bool result) */
} ap_kir_unop;

typedef enum ap_kir_binop {
	AP_KIR_ADD, AP_KIR_SUB, AP_KIR_MUL, AP_KIR_DIV,
	AP_KIR_REM,        /* C %, integers only */
	AP_KIR_LT, AP_KIR_LE, AP_KIR_GT, AP_KIR_GE, AP_KIR_EQ, AP_KIR_NE,  /* bool */
	AP_KIR_LAND, AP_KIR_LOR,                                           /* bool */
	AP_KIR_MIN, AP_KIR_MAX,  /* integers: a < b ? a : b (no NaN rules) */
} ap_kir_binop;

typedef enum ap_kir_fn {
	/* float (f32 spells expf, f64 exp): one argument */
	AP_KIR_EXP, AP_KIR_LOG, AP_KIR_SQRT, AP_KIR_TANH, AP_KIR_ERF,
	AP_KIR_FLOOR, AP_KIR_CEIL, AP_KIR_FABS, AP_KIR_LOG1P, AP_KIR_EXPM1,
	AP_KIR_ROUND,      /* rint: round half to even */
	/* two arguments */
	AP_KIR_POW, AP_KIR_FMAX, AP_KIR_FMIN, AP_KIR_FMOD,
	AP_KIR_FN_COUNT
} ap_kir_fn;

typedef struct ap_kir_expr ap_kir_expr;
struct ap_kir_expr {
	ap_kir_expr_kind kind;
	ap_dtype type;
	int op;
	int64_t ival;
	double fval;
	ap_kir_var *var;
	ap_kir_array *arr;
	ap_kir_expr *a, *b, *c;
};

typedef enum ap_kir_stmt_kind {
	AP_KIR_S_FOR,      /* for (var = lo; var < hi; var += step) body */
	AP_KIR_S_IF,       /* if (cond) body else orelse */
	AP_KIR_S_LET,      /* declare var (= value, may be NULL) */
	AP_KIR_S_ASSIGN,   /* var = value */
	AP_KIR_S_STORE,    /* arr[index] = value */
	AP_KIR_S_BARRIER,  /* __syncthreads() */
	AP_KIR_S_COMMENT,  /* text */
} ap_kir_stmt_kind;

typedef struct ap_kir_stmt ap_kir_stmt;

/* A statement list. */
typedef struct ap_kir_block {
	ap_kir_stmt *first, *last;
} ap_kir_block;

struct ap_kir_stmt {
	ap_kir_stmt_kind kind;
	ap_kir_stmt *next;
	ap_kir_var *var;          /* FOR, LET, ASSIGN */
	ap_kir_expr *lo, *hi;     /* FOR */
	int64_t step;             /* FOR, > 0 */
	ap_kir_expr *cond;        /* IF */
	ap_kir_array *arr;        /* STORE */
	ap_kir_expr *index;       /* STORE */
	ap_kir_expr *value;       /* LET, ASSIGN, STORE */
	ap_kir_block body;        /* FOR, IF (then) */
	ap_kir_block orelse;      /* IF */
	char *text;               /* COMMENT */
};

typedef struct ap_kir_arena ap_kir_arena;

typedef struct ap_kir_kernel {
	char *name;               /* entry point */
	unsigned grid[3], block[3];
	unsigned smem_bytes;      /* dynamic shared memory (bytes), grows with ap_kir_shared_dyn */
	ap_dtype index_type;      /* AP_DT_I64 (default) or AP_DT_I32: the type of
				     block/thread indices and ap_kir_idx constants */
	int n_arrays, cap_arrays;
	ap_kir_array **arrays;    /* in creation order */
	int n_params;             /* GLOBAL arrays; their `param` is 0..n_params-1 */
	int n_vars;
	ap_kir_block body;
	ap_kir_arena *arena;
	bool failed;              /* an allocation failed somewhere */
} ap_kir_kernel;

typedef enum ap_kir_target {
	AP_KIR_CUDA = 0,
	AP_KIR_HOST = 1,
} ap_kir_target;

/* ---- kernels (kir.c) ----------------------------------------------------- */

/* New empty kernel named `name` (a C identifier) with grid and block 1x1x1.
 * NULL on ENOMEM. */
__ap_give ap_kir_kernel *ap_kir_kernel_new(const char *name);
ap_kir_kernel *ap_kir_kernel_free(__ap_take ap_kir_kernel *k);  /* accepts NULL */
/* True once any allocation of `k` failed (the IR is then incomplete). */
bool ap_kir_failed(const ap_kir_kernel *k);
/* Renames the kernel (a C identifier); constant arrays are printed
 * prefixed by the kernel's name, so they follow.  0 or AP_ENOMEM. */
int ap_kir_kernel_rename(ap_kir_kernel *k, const char *name);
/* Total threads per block (block[0]*block[1]*block[2]). */
unsigned ap_kir_block_threads(const ap_kir_kernel *k);

/* Arrays.  `name` must be a C identifier unique in the kernel. */
/* Next global parameter (param index = number of params so far). */
ap_kir_array *ap_kir_param(ap_kir_kernel *k, const char *name, ap_dtype type,
			   bool written, int tensor);
ap_kir_array *ap_kir_shared(ap_kir_kernel *k, const char *name, ap_dtype type, int64_t size);
/* Places the array at the next 16-byte aligned offset of the dynamic shared
 * memory and grows k->smem_bytes. */
ap_kir_array *ap_kir_shared_dyn(ap_kir_kernel *k, const char *name, ap_dtype type, int64_t size);
ap_kir_array *ap_kir_local(ap_kir_kernel *k, const char *name, ap_dtype type, int64_t size);
/* `data`: size elements of `type` (copied).  size must be >= 1.  Printed
 * as NAME_<name>, NAME being the kernel's, so kernels can share a
 * translation unit. */
ap_kir_array *ap_kir_const_array(ap_kir_kernel *k, const char *name, ap_dtype type,
				 int64_t size, const void *data);
/* A fresh scalar variable named `prefix` followed by a number. */
ap_kir_var *ap_kir_var_new(ap_kir_kernel *k, ap_dtype type, const char *prefix);

/* Expressions (NULL operands give NULL). */
ap_kir_expr *ap_kir_int(ap_kir_kernel *k, ap_dtype type, int64_t v);
ap_kir_expr *ap_kir_i64(ap_kir_kernel *k, int64_t v);
/* An integer constant of the kernel's index type. */
ap_kir_expr *ap_kir_idx(ap_kir_kernel *k, int64_t v);
ap_kir_expr *ap_kir_float(ap_kir_kernel *k, ap_dtype type, double v);
/* A constant of `type` holding v (float types exact, integer types
 * truncated, bool v != 0). */
ap_kir_expr *ap_kir_const(ap_kir_kernel *k, ap_dtype type, double v);
ap_kir_expr *ap_kir_ref(ap_kir_kernel *k, ap_kir_var *v);
/* blockIdx / threadIdx component, of the kernel's index type. */
ap_kir_expr *ap_kir_index_of(ap_kir_kernel *k, ap_kir_index which);
ap_kir_expr *ap_kir_unary(ap_kir_kernel *k, ap_kir_unop op, ap_kir_expr *a);
/* Operands must have the same type (the result's, or bool for
 * comparisons and logic). Integer constants are folded. */
ap_kir_expr *ap_kir_binary(ap_kir_kernel *k, ap_kir_binop op, ap_kir_expr *a, ap_kir_expr *b);
ap_kir_expr *ap_kir_select(ap_kir_kernel *k, ap_kir_expr *c, ap_kir_expr *a, ap_kir_expr *b);
/* Math call; b is NULL for one-argument functions.  Type is a's. */
ap_kir_expr *ap_kir_call(ap_kir_kernel *k, ap_kir_fn fn, ap_kir_expr *a, ap_kir_expr *b);
/* Conversion; identity when a already has `type`.  To bool: a != 0. */
ap_kir_expr *ap_kir_cast(ap_kir_kernel *k, ap_dtype type, ap_kir_expr *a);
ap_kir_expr *ap_kir_load(ap_kir_kernel *k, ap_kir_array *arr, ap_kir_expr *index);

/* Shorthands for index arithmetic (constants take a's type). */
ap_kir_expr *ap_kir_add(ap_kir_kernel *k, ap_kir_expr *a, ap_kir_expr *b);
ap_kir_expr *ap_kir_mul(ap_kir_kernel *k, ap_kir_expr *a, ap_kir_expr *b);
ap_kir_expr *ap_kir_addi(ap_kir_kernel *k, ap_kir_expr *a, int64_t b);
ap_kir_expr *ap_kir_muli(ap_kir_kernel *k, ap_kir_expr *a, int64_t b);

/* True when `e` is an integer constant (its value in *v when v != NULL). */
bool ap_kir_is_int(const ap_kir_expr *e, int64_t *v);
/* Structural equality (same variables, arrays, constants, operators). */
bool ap_kir_expr_equal(const ap_kir_expr *a, const ap_kir_expr *b);

/* Statements, appended to `b`.  Each returns the new statement (NULL on
 * failure). */
/* for (var = lo; var < hi; var += step): fill ->body. */
ap_kir_stmt *ap_kir_for(ap_kir_kernel *k, ap_kir_block *b, ap_kir_var *var,
			ap_kir_expr *lo, ap_kir_expr *hi, int64_t step);
/* if (cond): fill ->body and ->orelse. */
ap_kir_stmt *ap_kir_if(ap_kir_kernel *k, ap_kir_block *b, ap_kir_expr *cond);
/* Declares var, with an initial value unless `value` is NULL. */
ap_kir_stmt *ap_kir_let(ap_kir_kernel *k, ap_kir_block *b, ap_kir_var *var, ap_kir_expr *value);
ap_kir_stmt *ap_kir_assign(ap_kir_kernel *k, ap_kir_block *b, ap_kir_var *var, ap_kir_expr *value);
ap_kir_stmt *ap_kir_store(ap_kir_kernel *k, ap_kir_block *b, ap_kir_array *arr,
			  ap_kir_expr *index, ap_kir_expr *value);
ap_kir_stmt *ap_kir_barrier(ap_kir_kernel *k, ap_kir_block *b);
ap_kir_stmt *ap_kir_comment(ap_kir_kernel *k, ap_kir_block *b, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Declares a fresh register of `type` initialised to `value` and returns a
 * reference to it (a LET plus a REF): how lowering names a value once. */
ap_kir_expr *ap_kir_bind(ap_kir_kernel *k, ap_kir_block *b, ap_dtype type,
			 const char *prefix, ap_kir_expr *value);

/* ---- printers (print.c) -------------------------------------------------- */

/* Prints `k` as one complete translation unit for `target`:
 *   AP_KIR_CUDA: extern "C" __global__ void NAME(T0 *__restrict__ p0, ...)
 *     for NVRTC (no #include; C++17 hex float literals);
 *   AP_KIR_HOST: void NAME(void *const *args, unsigned block_begin,
 *     unsigned block_end), C11 with <math.h>, as program.h specifies.
 * Returns a malloc'd string, or NULL on ENOMEM, on a kernel whose
 * construction failed, or when a barrier sits in non-uniform control flow
 * the host printer cannot split (err says which). */
__ap_give char *ap_kir_print(const ap_kir_kernel *k, ap_kir_target target, ap_error *err);

/* C type name of a scalar type ("float", "long long", "unsigned char"). */
const char *ap_kir_ctype(ap_dtype t);

#endif
