/* print.c -- the two printers of the kernel IR: CUDA C (for NVRTC) and
 * plain C11 (for the host C compiler).  They share every function here
 * and differ only in syntax: the prelude, the signature, how a block or
 * thread index and a shared array are spelled, and how the host walks the
 * threads of a block.
 *
 * CUDA: the body is printed once; every thread runs it.
 *
 * Host (ABI in server/plan/program.h):
 *   void NAME(void *const *args, unsigned block_begin, unsigned block_end)
 * The blocks of [block_begin, block_end) become a loop.  Inside a block the
 * body is printed in "block mode": a statement that contains no collective
 * (barrier or shuffle) is collected into a run, and each maximal run
 * becomes one loop over the block's threads (a phase); a statement that
 * contains a collective (a uniform `for` or `if`, or the collective
 * itself) is printed at block level and its body again in block mode.  So
 * a barrier ends one phase and the next statement starts another, which is
 * exactly __syncthreads' meaning when all threads of a block reach it.  A
 * shuffle is two thread loops of its own: the first stores every thread's
 * value in a per-thread temporary (`ap_shfl_float[ap_t]`), the second
 * gives each thread the temporary of its source lane, found by CUDA's
 * rules (PTX shfl.sync's pseudocode, width segments included).  Registers
 * declared directly in a statement list that contains a collective may be
 * read in a later phase: they become arrays with one slot per thread
 * (`v3[ap_t]`); so do register arrays of kernels with collectives.  Shared
 * arrays are plain arrays reused block after block.
 *
 * float16 / bfloat16 are printed convert-compute-round: an operation on
 * them converts its operands to float (__half2float / ap_f16_to_f32),
 * computes in float and rounds the result back (__float2half_rn /
 * ap_f32_to_f16); constants are their bit patterns.  CUDA includes
 * <cuda_fp16.h> / <cuda_bf16.h>, the host prelude defines the conversion
 * functions of half.c, each only when the kernel uses the type.
 *
 * Vector loads and stores are one access through a CUDA vector type on
 * the GPU and scalar accesses on the host.
 *
 * On x86-64 with GCC (11 and later) a host kernel with a register tile
 * (has_register_tile) is built twice through GCC's target_clones
 * (AP_HOST_ISA): for x86-64-v3 (AVX2, FMA) and for the baseline, the
 * clone picked when the shared object is loaded (an ifunc that dlsym
 * resolves).  A kernel cached on one node thus runs at the vector width
 * of whatever x86-64 node loads it; hostcc.c turns FMA contraction off so
 * that both clones round alike.
 */
#include "kir_internal.h"

#include "../../common/hostcheck.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a growable string ----------------------------------------------------- */

typedef struct sbuf {
	char *s;
	size_t len, cap;
	bool failed;
} sbuf;

static void sb_vprintf(sbuf *b, const char *fmt, va_list ap)
{
	va_list ap2;
	int n;

	if (b->failed)
		return;
	va_copy(ap2, ap);
	n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap2);
	va_end(ap2);
	if (n < 0) {
		b->failed = true;
		return;
	}
	if (!b->s || b->len + (size_t)n + 1 > b->cap) {
		size_t ncap = b->cap ? b->cap : 4096;
		char *p;

		while (ncap < b->len + (size_t)n + 1)
			ncap *= 2;
		p = realloc(b->s, ncap);
		if (!p) {
			b->failed = true;
			return;
		}
		b->s = p;
		b->cap = ncap;
		vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
	}
	b->len += (size_t)n;
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	sb_vprintf(b, fmt, ap);
	va_end(ap);
}

static void sb_indent(sbuf *b, int depth)
{
	for (int i = 0; i < depth; i++)
		sb_printf(b, "\t");
}

/* ---- printer state ---------------------------------------------------------- */

typedef struct printer {
	const ap_kir_kernel *k;
	ap_kir_target target;
	sbuf out;
	unsigned char *per_thread;   /* host: per var id */
	bool has_collective;         /* host: a barrier or shuffle anywhere */
	bool block_mode;             /* host: printing at block level */
	unsigned nt;                 /* threads per block (host, cluster kernels: per
					cluster, the blocks of one run as one) */
	unsigned bt;                 /* threads per block */
	bool uses_dsmem;             /* a load from another block's shared memory */
	bool uses_tma;               /* a TMA load (the host: ap_tmap_host_load) */
	bool uses_f16, uses_bf16;    /* a value, register or array of the type */
	unsigned char *vec_array;    /* per array id: a vector access uses it */
	uint32_t shfl_types;         /* host: 1 << dtype of every shuffled type */
	bool uses_tf32;              /* the TF32 rounding function */
	bool uses_ldmatrix, uses_mma;
	bool uses_wgmma_tf32;        /* the host reads TF32 wgmma operands truncated */
	bool uses_ex2;               /* ap_ex2f (AP_KIR_EX2_APPROX) */
	int wgmma_n;                 /* the widest wgmma's N (0: none) */
	unsigned char *promoted;     /* host, per array id: inside the current thread loop,
					the thread's slice of this register array is a
					local copy (see print_phase) */
	bool bad;                    /* a collective in non-uniform control flow */
	bool const_init;             /* printing a constant array's initializer */
	bool check;                  /* host: the checking mode (AP_KIR_HOST_CHECK) */
	bool baseline;               /* host: no x86-64-v3 clone (AP_KIR_PRINT_BASELINE) */
	/* host, warp specialisation (print_roles_host) */
	bool roles;                  /* the kernel has ROLES: plain mbarrier state, the fault exit */
	unsigned lo, hi;             /* the threads the block-level code runs (an arm's group
					inside ROLES; 0 and nt outside) */
	int co;                      /* the coroutine being printed (-1: none) */
	int resume;                  /* ... and its resume points so far */
	unsigned char *arm_for;      /* per var id: a loop at an arm's block level, its
					variable kept per group (NAME[lo]) */
	char bad_msg[160];
} printer;

const char *ap_kir_ctype(ap_dtype t)
{
	switch (t) {
	case AP_DT_F32: return "float";
	case AP_DT_F64: return "double";
	case AP_DT_I64: return "long long";
	case AP_DT_I32: return "int";
	case AP_DT_I8: return "signed char";
	case AP_DT_U8: return "unsigned char";
	case AP_DT_BOOL: return "unsigned char";
	case AP_DT_F16: return "unsigned short";
	case AP_DT_BF16: return "unsigned short";
	default: return "int";
	}
}

/* The C type of `t` in the printed target: CUDA's own 16-bit float types,
 * bit patterns on the host. */
static const char *ctype(const printer *p, ap_dtype t)
{
	if (p->target == AP_KIR_CUDA && t == AP_DT_F16)
		return "__half";
	if (p->target == AP_KIR_CUDA && t == AP_DT_BF16)
		return "__nv_bfloat16";
	return ap_kir_ctype(t);
}

static bool is_half(ap_dtype t)
{
	return ap__kir_is_half(t);
}

/* 16-bit float -> float, and float -> 16-bit float rounding to nearest even. */
static const char *half_to_f32(const printer *p, ap_dtype t)
{
	if (p->target == AP_KIR_CUDA)
		return t == AP_DT_BF16 ? "__bfloat162float" : "__half2float";
	return t == AP_DT_BF16 ? "ap_bf16_to_f32" : "ap_f16_to_f32";
}

static const char *f32_to_half(const printer *p, ap_dtype t)
{
	if (p->target == AP_KIR_CUDA)
		return t == AP_DT_BF16 ? "__float2bfloat16_rn" : "__float2half_rn";
	return t == AP_DT_BF16 ? "ap_f32_to_bf16" : "ap_f32_to_f16";
}

/* CUDA: a 16-bit pattern (unsigned short) as the type, and back. */
static const char *ushort_as_half(ap_dtype t)
{
	return t == AP_DT_BF16 ? "__ushort_as_bfloat16" : "__ushort_as_half";
}

static const char *half_as_ushort(ap_dtype t)
{
	return t == AP_DT_BF16 ? "__bfloat16_as_ushort" : "__half_as_ushort";
}

static const char *fn_name(int fn, ap_dtype t, char *buf, size_t cap)
{
	static const char *const names[AP_KIR_FN_COUNT] = {
		[AP_KIR_EXP] = "exp", [AP_KIR_LOG] = "log", [AP_KIR_SQRT] = "sqrt",
		[AP_KIR_TANH] = "tanh", [AP_KIR_ERF] = "erf", [AP_KIR_FLOOR] = "floor",
		[AP_KIR_CEIL] = "ceil", [AP_KIR_FABS] = "fabs", [AP_KIR_LOG1P] = "log1p",
		[AP_KIR_EXPM1] = "expm1", [AP_KIR_ROUND] = "rint", [AP_KIR_TF32] = "ap_tf32",
		[AP_KIR_POW] = "pow",
		[AP_KIR_FMAX] = "fmax", [AP_KIR_FMIN] = "fmin", [AP_KIR_FMOD] = "fmod",
		[AP_KIR_SIN] = "sin", [AP_KIR_COS] = "cos",
		[AP_KIR_EX2_APPROX] = "ap_ex2",
	};
	const char *n = fn >= 0 && fn < AP_KIR_FN_COUNT && names[fn] ? names[fn] : "exp";

	snprintf(buf, cap, "%s%s", n, t == AP_DT_F64 ? "" : "f");
	return buf;
}

static const char *binop_text(int op)
{
	switch (op) {
	case AP_KIR_ADD: return "+";
	case AP_KIR_SUB: return "-";
	case AP_KIR_MUL: return "*";
	case AP_KIR_DIV: return "/";
	case AP_KIR_REM: return "%";
	case AP_KIR_LT: return "<";
	case AP_KIR_LE: return "<=";
	case AP_KIR_GT: return ">";
	case AP_KIR_GE: return ">=";
	case AP_KIR_EQ: return "==";
	case AP_KIR_NE: return "!=";
	case AP_KIR_LAND: return "&&";
	case AP_KIR_LOR: return "||";
	case AP_KIR_AND: return "&";
	case AP_KIR_OR: return "|";
	case AP_KIR_XOR: return "^";
	case AP_KIR_SHR: return ">>";
	}
	return "?";
}

static void print_float(printer *p, ap_dtype t, double v)
{
	sbuf *b = &p->out;
	bool f32 = t != AP_DT_F64;

	if (!isfinite(v) && p->target == AP_KIR_CUDA && p->const_init) {
		/* a __device__ array needs constant initializers: NVRTC folds
		 * these, not __int_as_float */
		sb_printf(b, "(%s%s/0.0%s)", isnan(v) ? "0.0" : v < 0 ? "-1.0" : "1.0", f32 ? "f" : "",
			  f32 ? "f" : "");
	} else if (isnan(v)) {
		sb_printf(b, f32 ? "AP_NANF" : "AP_NAN");
	} else if (isinf(v)) {
		sb_printf(b, "%s%s", v < 0 ? "(-" : "", f32 ? "AP_INFF" : "AP_INF");
		if (v < 0)
			sb_printf(b, ")");
	} else if (signbit(v)) {
		sb_printf(b, "(-%a%s)", -v, f32 ? "f" : "");
	} else {
		sb_printf(b, "%a%s", v, f32 ? "f" : "");
	}
}

/* A 16-bit float constant: its bit pattern, as the type. */
static void print_half_const(printer *p, ap_dtype t, double v)
{
	unsigned bits = ap__kir_half_bits(t, v);

	if (p->target == AP_KIR_CUDA)
		sb_printf(&p->out, "%s((unsigned short)0x%04xu)", ushort_as_half(t), bits);
	else
		sb_printf(&p->out, "((unsigned short)0x%04xu)", bits);
}

static void print_int(printer *p, ap_dtype t, int64_t v)
{
	sbuf *b = &p->out;

	switch (t) {
	case AP_DT_I64:
		if (v == INT64_MIN)
			sb_printf(b, "(-9223372036854775807LL-1)");
		else if (v < 0)
			sb_printf(b, "(%lldLL)", (long long)v);
		else
			sb_printf(b, "%lldLL", (long long)v);
		break;
	case AP_DT_I32:
		if (v == INT32_MIN)
			sb_printf(b, "(-2147483647-1)");
		else if (v < 0)
			sb_printf(b, "(%d)", (int)v);
		else
			sb_printf(b, "%d", (int)v);
		break;
	default:
		sb_printf(b, "((%s)%lld)", ap_kir_ctype(t), (long long)v);
		break;
	}
}

static void print_var(printer *p, const ap_kir_var *v)
{
	if (p->target == AP_KIR_HOST && p->arm_for && p->arm_for[v->id])
		sb_printf(&p->out, "%s[%u]", v->name, p->lo);
	else if (p->target == AP_KIR_HOST && p->per_thread[v->id] && p->block_mode && p->lo)
		sb_printf(&p->out, "%s[%u]", v->name, p->lo);   /* an arm's first thread */
	else if (p->target == AP_KIR_HOST && p->per_thread[v->id])
		sb_printf(&p->out, "%s[%s]", v->name, p->block_mode ? "0" : "ap_t");
	else
		sb_printf(&p->out, "%s", v->name);
}

static void print_index(printer *p, int which, ap_dtype type)
{
	static const char *const cuda[] = {
		"blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z",
	};
	static const char *const host[] = {"ap_bx", "ap_by", "ap_bz", "ap_tx", "ap_ty", "ap_tz"};
	const ap_kir_kernel *k = p->k;
	unsigned extent;

	if (which == AP_KIR_CLUSTER_X || which == AP_KIR_CLUSTER_RANK) {
		bool rank = which == AP_KIR_CLUSTER_RANK;

		if (rank && p->block_mode && p->target == AP_KIR_HOST) {
			p->bad = true;
			snprintf(p->bad_msg, sizeof(p->bad_msg),
				 "cluster rank in block-level control flow around a barrier or shuffle");
		}
		if (p->target == AP_KIR_CUDA)
			sb_printf(&p->out, "((%s)(blockIdx.x %s %uu))", ap_kir_ctype(type), rank ? "%" : "/",
				  k->cluster);
		else
			sb_printf(&p->out, "((%s)%s)", ap_kir_ctype(type), rank ? "ap_cr" : "ap_cx");
		return;
	}
	if (which < 0 || which > AP_KIR_THREAD_Z) {
		print_int(p, type, 0);
		return;
	}
	extent = which < AP_KIR_THREAD_X ? k->grid[which] : k->block[which - AP_KIR_THREAD_X];
	if (extent == 1) {
		print_int(p, type, 0);
		return;
	}
	if (which >= AP_KIR_THREAD_X && p->block_mode && p->target == AP_KIR_HOST) {
		p->bad = true;
		snprintf(p->bad_msg, sizeof(p->bad_msg),
			 "thread index in block-level control flow around a barrier or shuffle");
	}
	sb_printf(&p->out, "((%s)%s)", ap_kir_ctype(type),
		  p->target == AP_KIR_CUDA ? cuda[which] : host[which]);
}

/* Host checking mode: accesses to this array go through the checker when
 * printed inside a thread loop (block-level control flow reads nothing
 * that a thread could race on: the printer keeps those uniform). */
static bool checked(const printer *p, const ap_kir_array *a)
{
	return p->check && !p->block_mode &&
	       (a->space == AP_KIR_GLOBAL || a->space == AP_KIR_SHARED ||
		a->space == AP_KIR_SHARED_DYN);
}

static void print_array_ref(printer *p, const ap_kir_array *a)
{
	if (a->space == AP_KIR_CONST)
		sb_printf(&p->out, "%s_%s", p->k->name, a->name);
	else
		sb_printf(&p->out, "%s", a->name);
}

static void print_expr(printer *p, const ap_kir_expr *e);

/* `[index]`, or `[index + off]` for off > 0, where index is `idx` or, when
 * idx is NULL, the text `idx_text`.  Host register arrays of kernels with
 * collectives hold one slice per thread. */
static void print_elem_index(printer *p, const ap_kir_array *a, const ap_kir_expr *idx,
			     const char *idx_text, int off)
{
	if (p->target == AP_KIR_HOST && a->space == AP_KIR_LOCAL && p->has_collective && !a->scratch &&
	    !(p->promoted && p->promoted[a->id]))
		sb_printf(&p->out, "[%s * %lldLL + ", p->block_mode ? "0" : "ap_t",
			  (long long)a->size);
	else
		sb_printf(&p->out, "[");
	if (idx)
		print_expr(p, idx);
	else
		sb_printf(&p->out, "%s", idx_text);
	if (off > 0)
		sb_printf(&p->out, " + %d", off);
	sb_printf(&p->out, "]");
}

static void print_load_index(printer *p, const ap_kir_array *a, const ap_kir_expr *idx)
{
	print_elem_index(p, a, idx, NULL, 0);
}

/* The value of a 16-bit float expression as a float (constants as float
 * literals: every 16-bit float value is one exactly). */
static void print_half_as_f32(printer *p, const ap_kir_expr *e)
{
	if (e->kind == AP_KIR_E_FLOAT) {
		print_float(p, AP_DT_F32, e->fval);
		return;
	}
	sb_printf(&p->out, "%s(", half_to_f32(p, e->type));
	print_expr(p, e);
	sb_printf(&p->out, ")");
}

/* e converted to `to` where one of the two is a 16-bit float type: through
 * float, rounding to nearest even into a 16-bit type. */
static void print_convert(printer *p, ap_dtype to, const ap_kir_expr *e)
{
	sbuf *b = &p->out;

	if (is_half(to)) {
		sb_printf(b, "%s(", f32_to_half(p, to));
		if (is_half(e->type)) {
			print_half_as_f32(p, e);
		} else {
			if (e->type != AP_DT_F32)
				sb_printf(b, "(float)");
			print_expr(p, e);
		}
		sb_printf(b, ")");
		return;
	}
	if (to == AP_DT_F32) {
		print_half_as_f32(p, e);
		return;
	}
	sb_printf(b, "((%s)", ctype(p, to));
	print_half_as_f32(p, e);
	sb_printf(b, ")");
}

/* An operation on 16-bit floats: operands as float, the float result
 * rounded back unless it is bool. */
static void print_half_op(printer *p, const ap_kir_expr *e)
{
	sbuf *b = &p->out;
	bool round = is_half(e->type);
	char fbuf[16];

	if (round)
		sb_printf(b, "%s(", f32_to_half(p, e->type));
	switch (e->kind) {
	case AP_KIR_E_UNARY:
		sb_printf(b, "(%s", e->op == AP_KIR_NEG ? "-" : "!");
		print_half_as_f32(p, e->a);
		sb_printf(b, ")");
		break;
	case AP_KIR_E_BINARY:
		sb_printf(b, "(");
		print_half_as_f32(p, e->a);
		sb_printf(b, " %s ", binop_text(e->op));
		print_half_as_f32(p, e->b);
		sb_printf(b, ")");
		break;
	case AP_KIR_E_CALL:
		sb_printf(b, "%s(", fn_name(e->op, AP_DT_F32, fbuf, sizeof(fbuf)));
		print_half_as_f32(p, e->a);
		if (e->b) {
			sb_printf(b, ", ");
			print_half_as_f32(p, e->b);
		}
		sb_printf(b, ")");
		break;
	default:
		break;
	}
	if (round)
		sb_printf(b, ")");
}

static void print_binary(printer *p, const ap_kir_expr *e)
{
	sbuf *b = &p->out;

	if (e->op == AP_KIR_MIN || e->op == AP_KIR_MAX) {
		sb_printf(b, "(");
		if (is_half(e->a->type)) {
			print_half_as_f32(p, e->a);
			sb_printf(b, " %s ", e->op == AP_KIR_MIN ? "<" : ">");
			print_half_as_f32(p, e->b);
		} else {
			print_expr(p, e->a);
			sb_printf(b, " %s ", e->op == AP_KIR_MIN ? "<" : ">");
			print_expr(p, e->b);
		}
		sb_printf(b, " ? ");
		print_expr(p, e->a);
		sb_printf(b, " : ");
		print_expr(p, e->b);
		sb_printf(b, ")");
		return;
	}
	if (is_half(e->a->type)) {
		print_half_op(p, e);
		return;
	}
	if (e->op == AP_KIR_SHL) {
		/* shift the unsigned bits: no undefined behaviour for negative
		 * values or bits shifted into the sign */
		sb_printf(b, "((%s)((%s)", ap_kir_ctype(e->type),
			  e->type == AP_DT_I64 ? "unsigned long long" : "unsigned");
		print_expr(p, e->a);
		sb_printf(b, " << ");
		print_expr(p, e->b);
		sb_printf(b, "))");
		return;
	}
	if (e->op == AP_KIR_FLOORDIV) {
		/* truncating quotient, minus one when the remainder is non-zero
		 * and the signs differ */
		sb_printf(b, "(");
		print_expr(p, e->a);
		sb_printf(b, " / ");
		print_expr(p, e->b);
		sb_printf(b, " - ((");
		print_expr(p, e->a);
		sb_printf(b, " %% ");
		print_expr(p, e->b);
		sb_printf(b, " != 0) && ((");
		print_expr(p, e->a);
		sb_printf(b, " < 0) != (");
		print_expr(p, e->b);
		sb_printf(b, " < 0))))");
		return;
	}
	sb_printf(b, "(");
	print_expr(p, e->a);
	sb_printf(b, " %s ", binop_text(e->op));
	print_expr(p, e->b);
	sb_printf(b, ")");
}

static void print_expr(printer *p, const ap_kir_expr *e)
{
	sbuf *b = &p->out;
	char fbuf[16];

	switch (e->kind) {
	case AP_KIR_E_INT:
		print_int(p, e->type, e->ival);
		break;
	case AP_KIR_E_FLOAT:
		if (is_half(e->type))
			print_half_const(p, e->type, e->fval);
		else
			print_float(p, e->type, e->fval);
		break;
	case AP_KIR_E_VAR:
		print_var(p, e->var);
		break;
	case AP_KIR_E_INDEX:
		print_index(p, e->op, e->type);
		break;
	case AP_KIR_E_UNARY:
		if (is_half(e->a->type)) {
			print_half_op(p, e);
			break;
		}
		sb_printf(b, "(%s", e->op == AP_KIR_NEG ? "-" : "!");
		print_expr(p, e->a);
		sb_printf(b, ")");
		break;
	case AP_KIR_E_BINARY:
		print_binary(p, e);
		break;
	case AP_KIR_E_SELECT:
		sb_printf(b, "(");
		print_expr(p, e->a);
		sb_printf(b, " ? ");
		print_expr(p, e->b);
		sb_printf(b, " : ");
		print_expr(p, e->c);
		sb_printf(b, ")");
		break;
	case AP_KIR_E_CALL:
		if (is_half(e->type)) {
			print_half_op(p, e);
			break;
		}
		sb_printf(b, "%s(", fn_name(e->op, e->type, fbuf, sizeof(fbuf)));
		print_expr(p, e->a);
		if (e->b) {
			sb_printf(b, ", ");
			print_expr(p, e->b);
		}
		sb_printf(b, ")");
		break;
	case AP_KIR_E_CAST:
		if (is_half(e->type) || is_half(e->a->type)) {
			print_convert(p, e->type, e->a);
			break;
		}
		sb_printf(b, "((%s)", ap_kir_ctype(e->type));
		print_expr(p, e->a);
		sb_printf(b, ")");
		break;
	case AP_KIR_E_LOAD:
		/* CUDA keeps 16-bit float constant data as unsigned short */
		if (p->target == AP_KIR_CUDA && e->arr->space == AP_KIR_CONST && is_half(e->type))
			sb_printf(b, "%s(", ushort_as_half(e->type));
		if (e->c && p->target == AP_KIR_CUDA) {
			/* distributed shared memory: the element's address mapped
			 * into the other block's window */
			sb_printf(b, "ap_dsmem_%s(&", e->type == AP_DT_F64 ? "f64" : "f32");
			print_array_ref(p, e->arr);
			print_load_index(p, e->arr, e->a);
			sb_printf(b, ", (unsigned)(");
			print_expr(p, e->c);
			sb_printf(b, "))");
			break;
		}
		if (checked(p, e->arr))   /* *(T *)rd(&ref, bytes, thread, 1) */
			sb_printf(b, "(*(const %s *)AP_CK_RD(&", ctype(p, e->arr->type));
		if (e->c) {   /* host: the rank's copy of the array */
			if (e->arr->space == AP_KIR_SHARED)
				sb_printf(b, "%s_cl[", e->arr->name);
			else
				sb_printf(b, "((%s *)(ap_smem_cl[", ctype(p, e->arr->type));
			print_expr(p, e->c);
			if (e->arr->space == AP_KIR_SHARED)
				sb_printf(b, "]");
			else
				sb_printf(b, "] + %lluu))", (unsigned long long)e->arr->offset);
			print_load_index(p, e->arr, e->a);
			if (checked(p, e->arr))
				sb_printf(b, ", %zuu, ap_t, 1u))", ap_dtype_size(e->arr->type));
			break;
		}
		print_array_ref(p, e->arr);
		print_load_index(p, e->arr, e->a);
		if (checked(p, e->arr))
			sb_printf(b, ", %zuu, ap_t, 1u))", ap_dtype_size(e->arr->type));
		if (p->target == AP_KIR_CUDA && e->arr->space == AP_KIR_CONST && is_half(e->type))
			sb_printf(b, ")");
		break;
	}
}

/* ---- statements ---------------------------------------------------------------- */

static bool stmt_has_collective(const ap_kir_stmt *s);

static bool block_has_collective(const ap_kir_block *b)
{
	for (const ap_kir_stmt *s = b->first; s; s = s->next)
		if (stmt_has_collective(s))
			return true;
	return false;
}

/* Barriers, shuffles, ldmatrix and mma: every thread of the block (or of
 * each warp) takes part. */
static bool stmt_has_collective(const ap_kir_stmt *s)
{
	switch (s->kind) {
	case AP_KIR_S_BARRIER:
	case AP_KIR_S_CLUSTER_BARRIER:
	case AP_KIR_S_SHFL:
	case AP_KIR_S_LDMATRIX:
	case AP_KIR_S_MMA:
	case AP_KIR_S_WGMMA:
	case AP_KIR_S_MBAR_WAIT:   /* the host: between phases (every arrival made) */
	case AP_KIR_S_ROLES:       /* the host: coroutines at block level */
		return true;
	case AP_KIR_S_ARM:
		return block_has_collective(&s->body);
	case AP_KIR_S_FOR:
		return block_has_collective(&s->body);
	case AP_KIR_S_IF:
		return block_has_collective(&s->body) || block_has_collective(&s->orelse);
	default:
		return false;
	}
}

/* Host: registers declared directly in a list that contains a collective
 * get a slot per thread.  Inside an arm (in_arm), a loop at block level
 * keeps its variable in the slot of the group's first thread (arm_for):
 * a coroutine leaves and re-enters the loop at its waits, so the variable
 * cannot be a C local of the loop. */
static void mark_per_thread_in(printer *p, const ap_kir_block *b, bool in_arm)
{
	if (!block_has_collective(b))
		return;
	for (const ap_kir_stmt *s = b->first; s; s = s->next) {
		if (s->kind == AP_KIR_S_LET)
			p->per_thread[s->var->id] = 1;
		if (s->kind == AP_KIR_S_VLOAD)
			for (int i = 0; i < s->width; i++)
				p->per_thread[s->vars[i]->id] = 1;
		if (s->kind == AP_KIR_S_FOR && in_arm && block_has_collective(&s->body) && p->arm_for)
			p->per_thread[s->var->id] = p->arm_for[s->var->id] = 1;
		if (s->kind == AP_KIR_S_FOR || s->kind == AP_KIR_S_IF || s->kind == AP_KIR_S_ROLES ||
		    s->kind == AP_KIR_S_ARM) {
			mark_per_thread_in(p, &s->body, in_arm || s->kind == AP_KIR_S_ARM);
			mark_per_thread_in(p, &s->orelse, in_arm);
		}
	}
}

static void mark_per_thread(printer *p, const ap_kir_block *b)
{
	mark_per_thread_in(p, b, false);
}

static void print_block_thread(printer *p, const ap_kir_block *b, int depth);

static void print_value_as(printer *p, ap_dtype t, const ap_kir_expr *v)
{
	if (v->type != t && (is_half(t) || is_half(v->type))) {
		print_convert(p, t, v);
		return;
	}
	if (v->type != t && !(t == AP_DT_BOOL && v->type == AP_DT_BOOL)) {
		sb_printf(&p->out, "(%s)", ap_kir_ctype(t));
		print_expr(p, v);
		return;
	}
	print_expr(p, v);
}

static void print_for_head(printer *p, const ap_kir_stmt *s)
{
	sbuf *b = &p->out;
	const char *ty = ap_kir_ctype(s->var->type);

	if (p->target == AP_KIR_HOST && p->arm_for && p->arm_for[s->var->id]) {
		/* an arm's loop: its variable outlives the coroutine's yields */
		sb_printf(b, "for (%s[%u] = ", s->var->name, p->lo);
		print_expr(p, s->lo);
		sb_printf(b, "; %s[%u] < ", s->var->name, p->lo);
		print_expr(p, s->hi);
		sb_printf(b, "; %s[%u] += %lld) {\n", s->var->name, p->lo, (long long)s->step);
		return;
	}
	sb_printf(b, "for (%s %s = ", ty, s->var->name);
	print_expr(p, s->lo);
	sb_printf(b, "; %s < ", s->var->name);
	print_expr(p, s->hi);
	sb_printf(b, "; %s += %lld) {\n", s->var->name, (long long)s->step);
}

/* A FOR or IF statement at `depth`: its head, its body (and else branch)
 * printed by `block` at depth + 1 -- print_block_thread in thread mode,
 * print_block_host in block mode -- and the closing brace.  CUDA prints a
 * loop's unroll hint as a pragma; the host compiler is left to itself. */
static void print_control(printer *p, const ap_kir_stmt *s, int depth,
			  void (*block)(printer *, const ap_kir_block *, int))
{
	sbuf *b = &p->out;

	if (s->kind == AP_KIR_S_FOR && s->unroll && p->target == AP_KIR_CUDA) {
		sb_indent(b, depth);
		if (s->unroll > 0)
			sb_printf(b, "#pragma unroll %d\n", s->unroll);
		else
			sb_printf(b, "#pragma unroll\n");
	}
	sb_indent(b, depth);
	if (s->kind == AP_KIR_S_FOR) {
		print_for_head(p, s);
		block(p, &s->body, depth + 1);
	} else {
		sb_printf(b, "if (");
		print_expr(p, s->cond);
		sb_printf(b, ") {\n");
		block(p, &s->body, depth + 1);
		if (s->orelse.first) {
			sb_indent(b, depth);
			sb_printf(b, "} else {\n");
			block(p, &s->orelse, depth + 1);
		}
	}
	sb_indent(b, depth);
	sb_printf(b, "}\n");
}

/* The CUDA vector type that holds `width` elements of `t` (checked by
 * ap_kir_vector_ok): a native one, or for 4 and 8 16-bit elements words
 * holding two each. */
static const char *vec_type(ap_dtype t, int width)
{
	switch (t) {
	case AP_DT_F32: return width == 2 ? "float2" : "float4";
	case AP_DT_F64: return "double2";
	case AP_DT_I32: return width == 2 ? "int2" : "int4";
	case AP_DT_I64: return "longlong2";
	case AP_DT_I8: return "char4";
	case AP_DT_F16: return width == 2 ? "__half2" : width == 4 ? "uint2" : "uint4";
	case AP_DT_BF16: return width == 2 ? "__nv_bfloat162" : width == 4 ? "uint2" : "uint4";
	default: return "uchar4";   /* U8, BOOL */
	}
}

static bool vec_packed(ap_dtype t, int width)
{
	return is_half(t) && width > 2;
}

static const char *const vec_comp[] = {"x", "y", "z", "w"};

/* CUDA: one vector load into the registers the statement declares. */
static void print_vload_cuda(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;
	const ap_kir_array *a = s->arr;
	const char *vt = vec_type(a->type, s->width);

	sb_indent(b, depth);
	sb_printf(b, "%s", ctype(p, a->type));
	for (int i = 0; i < s->width; i++)
		sb_printf(b, "%s %s", i ? "," : "", s->vars[i]->name);
	sb_printf(b, ";\n");
	sb_indent(b, depth);
	sb_printf(b, "{ const %s ap_vec = *(const %s *)(", vt, vt);
	print_array_ref(p, a);
	sb_printf(b, " + ");
	print_expr(p, s->index);
	sb_printf(b, ");");
	for (int i = 0; i < s->width; i++) {
		if (vec_packed(a->type, s->width))
			sb_printf(b, " %s = %s((unsigned short)(ap_vec.%s%s));", s->vars[i]->name,
				  ushort_as_half(a->type), vec_comp[i / 2], i % 2 ? " >> 16" : "");
		else
			sb_printf(b, " %s = ap_vec.%s;", s->vars[i]->name, vec_comp[i]);
	}
	sb_printf(b, " }\n");
}

/* CUDA: the values into a vector, then one vector store. */
static void print_vstore_cuda(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;
	const ap_kir_array *a = s->arr;
	const char *vt = vec_type(a->type, s->width);

	sb_indent(b, depth);
	sb_printf(b, "{ %s ap_vec;", vt);
	for (int i = 0; i < s->width; i++) {
		if (!vec_packed(a->type, s->width)) {
			sb_printf(b, " ap_vec.%s = ", vec_comp[i]);
			print_value_as(p, a->type, s->values[i]);
			sb_printf(b, ";");
		} else if (i % 2 == 0) {
			sb_printf(b, " ap_vec.%s = (unsigned int)%s(", vec_comp[i / 2],
				  half_as_ushort(a->type));
			print_value_as(p, a->type, s->values[i]);
			sb_printf(b, ") | ((unsigned int)%s(", half_as_ushort(a->type));
			print_value_as(p, a->type, s->values[i + 1]);
			sb_printf(b, ") << 16);");
		}
	}
	sb_printf(b, " *(%s *)(", vt);
	print_array_ref(p, a);
	sb_printf(b, " + ");
	print_expr(p, s->index);
	sb_printf(b, ") = ap_vec; }\n");
}

/* Host: a vector load is `width` scalar loads (nothing is stored between
 * them, so the index may be evaluated each time). */
static void print_vload_host(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;

	if (checked(p, s->arr)) {   /* one access of the whole vector, aligned to its size */
		size_t n = ap_dtype_size(s->arr->type) * (size_t)s->width;

		sb_indent(b, depth);
		sb_printf(b, "(void)AP_CK_RD(&");
		print_array_ref(p, s->arr);
		print_elem_index(p, s->arr, s->index, NULL, 0);
		sb_printf(b, ", %zuu, ap_t, %zuu);\n", n, n);
	}
	for (int i = 0; i < s->width; i++) {
		sb_indent(b, depth);
		if (p->per_thread[s->vars[i]->id])
			print_var(p, s->vars[i]);
		else
			sb_printf(b, "%s %s", ctype(p, s->arr->type), s->vars[i]->name);
		sb_printf(b, " = ");
		print_array_ref(p, s->arr);
		print_elem_index(p, s->arr, s->index, NULL, i);
		sb_printf(b, ";\n");
	}
}

/* Host: the index and every value first, then the scalar stores, as one
 * vector store would. */
static void print_vstore_host(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;
	const char *ty = ctype(p, s->arr->type);

	sb_indent(b, depth);
	sb_printf(b, "{\n");
	sb_indent(b, depth + 1);
	sb_printf(b, "const long long ap_vidx = ");
	print_expr(p, s->index);
	sb_printf(b, ";\n");
	for (int i = 0; i < s->width; i++) {
		sb_indent(b, depth + 1);
		sb_printf(b, "const %s ap_vs%c = ", ty, 'a' + i);
		print_value_as(p, s->arr->type, s->values[i]);
		sb_printf(b, ";\n");
	}
	if (checked(p, s->arr)) {
		size_t n = ap_dtype_size(s->arr->type) * (size_t)s->width;

		sb_indent(b, depth + 1);
		sb_printf(b, "(void)AP_CK_WR(&");
		print_array_ref(p, s->arr);
		print_elem_index(p, s->arr, NULL, "ap_vidx", 0);
		sb_printf(b, ", %zuu, ap_t, %zuu);\n", n, n);
	}
	for (int i = 0; i < s->width; i++) {
		sb_indent(b, depth + 1);
		print_array_ref(p, s->arr);
		print_elem_index(p, s->arr, NULL, "ap_vidx", i);
		sb_printf(b, " = ap_vs%c;\n", 'a' + i);
	}
	sb_indent(b, depth);
	sb_printf(b, "}\n");
}

static const char *shfl_fn(int kind)
{
	switch (kind) {
	case AP_KIR_SHFL_XOR: return "__shfl_xor_sync";
	case AP_KIR_SHFL_DOWN: return "__shfl_down_sync";
	case AP_KIR_SHFL_UP: return "__shfl_up_sync";
	default: return "__shfl_sync";
	}
}

/* CUDA: dst = __shfl_*_sync(mask, value, lane, width).  One-byte values
 * travel as int (the intrinsics have no char overloads). */
static void print_shfl_cuda(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;
	bool narrow = ap_dtype_size(s->var->type) == 1;
	unsigned mask = p->nt % 32 == 0 || p->nt > 32 ? 0xffffffffu : (1u << p->nt) - 1u;

	sb_indent(b, depth);
	print_var(p, s->var);
	sb_printf(b, " = ");
	if (narrow)
		sb_printf(b, "(%s)", ctype(p, s->var->type));
	sb_printf(b, "%s(0x%xu, ", shfl_fn(s->shfl), mask);
	if (narrow)
		sb_printf(b, "(int)");
	print_value_as(p, s->var->type, s->value);
	sb_printf(b, ", (int)");
	print_expr(p, s->lane);
	sb_printf(b, ", %d);\n", s->width);
}

/* `&arr[index]` (host register arrays of kernels with collectives: this
 * thread's slice). */
static void print_elem_addr(printer *p, const ap_kir_array *a, const ap_kir_expr *idx, int off)
{
	sb_printf(&p->out, "&");
	print_array_ref(p, a);
	print_elem_index(p, a, idx, NULL, off);
}

/* The shared-window address of element idx of shared array a, for an
 * instruction's address operand: the array's start converted once,
 * then 32-bit arithmetic (PTX ISA, state spaces: a .shared address is
 * 32 bits) -- so the compiler keeps one base register for a tile's
 * accesses and folds their constant parts into the instructions'
 * immediate offsets ([Ra+imm]), where converting each element's generic
 * pointer cost integer instructions per access (issue 25: the GEMM's K
 * loop). */
static void print_shared_addr(printer *p, const ap_kir_array *a, const ap_kir_expr *idx)
{
	sb_printf(&p->out, "(unsigned)__cvta_generic_to_shared(");
	print_array_ref(p, a);
	sb_printf(&p->out, ") + (unsigned)(");
	print_expr(p, idx);
	sb_printf(&p->out, ") * %zuu", ap_dtype_size(a->type));
}

/* cp.async: CUDA, one asynchronous copy of 4, 8 or 16 bytes (.cg, which
 * bypasses L1, needs 16), zero-filled when the predicate fails (src-size
 * 0, the source pointer then the buffer's start); host, a copy now. */
static void print_cp_async(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;
	size_t bytes = ap_dtype_size(s->arr->type) * (size_t)s->width;

	sb_indent(b, depth);
	if (p->target == AP_KIR_CUDA) {
		sb_printf(b, "{ const unsigned ap_sa = ");
		print_shared_addr(p, s->arr, s->index);
		sb_printf(b, "; asm volatile(\"cp.async.%s.shared.global [%%0], [%%1], %zu, %%2;\\n\" :: "
			  "\"r\"(ap_sa), \"l\"(", bytes == 16 ? "cg" : "ca", bytes);
		if (s->cond) {
			sb_printf(b, "(");
			print_expr(p, s->cond);
			sb_printf(b, ") ? ");
			print_elem_addr(p, s->src, s->src_index, 0);
			sb_printf(b, " : ");
			print_array_ref(p, s->src);
			sb_printf(b, "), \"r\"((");
			print_expr(p, s->cond);
			sb_printf(b, ") ? %zu : 0) : \"memory\"); }\n", bytes);
		} else {
			print_elem_addr(p, s->src, s->src_index, 0);
			sb_printf(b, "), \"r\"(%zu) : \"memory\"); }\n", bytes);
		}
		return;
	}
	sb_printf(b, "{ /* cp.async */ const long long ap_ci = ");
	print_expr(p, s->index);
	sb_printf(b, ", ap_cs = ");
	print_expr(p, s->src_index);
	sb_printf(b, "; const int ap_cp = ");
	if (s->cond)
		print_expr(p, s->cond);
	else
		sb_printf(b, "1");
	sb_printf(b, ";");
	if (p->check) {
		/* the destination pending until this thread's wait_group covers
		 * it; the source read only when the predicate holds */
		sb_printf(b, " AP_CK(async(ap_ck, &");
		print_array_ref(p, s->arr);
		print_elem_index(p, s->arr, NULL, "ap_ci", 0);
		sb_printf(b, ", ap_cp ? (const void *)&");
		print_array_ref(p, s->src);
		sb_printf(b, "[ap_cs] : (const void *)");
		print_array_ref(p, s->src);
		sb_printf(b, ", %zuu, ap_t, ap_cp));", bytes);
	}
	sb_printf(b, " for (int ap_e = 0; ap_e < %d; ap_e++) ", s->width);
	print_array_ref(p, s->arr);
	print_elem_index(p, s->arr, NULL, "ap_ci + ap_e", 0);
	sb_printf(b, " = ap_cp ? ");
	print_array_ref(p, s->src);
	sb_printf(b, "[ap_cs + ap_e] : (%s)0; }\n", ctype(p, s->arr->type));
}

static void open_thread_loop(printer *p, int depth);
static void close_thread_loop(printer *p, int depth);

/* &bar[index] as the host sees it: the checker's key of an mbarrier. */
static void print_host_elem_ptr(printer *p, const ap_kir_array *a, const ap_kir_expr *idx)
{
	sb_printf(&p->out, "(void *)&");
	print_array_ref(p, a);
	sb_printf(&p->out, "[");
	print_expr(p, idx);
	sb_printf(&p->out, "]");
}

/* Whether an array of k is also passed as a tensor map. */
static bool kernel_has_tmap(const ap_kir_kernel *k)
{
	for (int i = 0; i < k->n_arrays; i++)
		if (k->arrays[i]->tmap)
			return true;
	return false;
}

/* A TMA tile load, after print_mbar_thread's opening (CUDA: `{ const
 * unsigned ap_mb = BAR; `; the host: the indent).  CUDA: the PTX with the
 * map parameter's generic address (PTX ISA, "cp.async.bulk.tensor":
 * the tensor map operand may be a .param address -- __grid_constant__
 * keeps it there).  The host: ap_tmap_host_load (half.c's
 * ap__kir_host_tmap_src, common/tmap.c's load as text) with the map's
 * description compiled in; checking, the checker marks the box in
 * flight on the barrier (tma) and sees every element read (rd). */
static void print_tma_load(printer *p, const ap_kir_stmt *s, bool cuda)
{
	sbuf *b = &p->out;
	const ap_tmap_desc *d = s->src->tmap;

	if (cuda) {
		sb_printf(b, "const unsigned ap_sa = ");
		print_shared_addr(p, s->arr, s->index);
		sb_printf(b, "; asm volatile(\"cp.async.bulk.tensor.%dd.shared::cluster.global.tile.mbarrier::"
			  "complete_tx::bytes [%%0], [%%1, {", d->rank);
		for (int i = 0; i < d->rank; i++)
			sb_printf(b, "%s%%%d", i ? ", " : "", 3 + i);
		sb_printf(b, "}], [%%2];\\n\" :: \"r\"(ap_sa), \"l\"((unsigned long long)&%s_tmap), \"r\"(ap_mb)",
			  s->src->name);
		for (int i = 0; i < d->rank; i++) {
			sb_printf(b, ", \"r\"((int)(");
			print_expr(p, s->values[i]);
			sb_printf(b, "))");
		}
		sb_printf(b, " : \"memory\"); }\n");
		return;
	}
	sb_printf(b, "{ /* cp.async.bulk.tensor */ static const ap_tmap_h ap_td = { %zuu, %d, %uu, %d, {",
		  ap_tmap_elem_bytes(d->dtype), d->rank, ap_tmap_swizzle_span(d->swizzle), d->oob == AP_TMAP_OOB_NAN);
	for (int i = 0; i < AP_TMAP_MAX_RANK; i++)
		sb_printf(b, "%s%lluull", i ? ", " : "", (unsigned long long)(i < d->rank ? d->dims[i] : 1));
	sb_printf(b, "}, {");
	for (int i = 0; i < AP_TMAP_MAX_RANK - 1; i++)
		sb_printf(b, "%s%lluull", i ? ", " : "", (unsigned long long)(i + 1 < d->rank ? d->strides[i] : 0));
	sb_printf(b, "}, {");
	for (int i = 0; i < AP_TMAP_MAX_RANK; i++)
		sb_printf(b, "%s%uu", i ? ", " : "", i < d->rank ? d->box[i] : 1);
	sb_printf(b, "}, {");
	for (int i = 0; i < AP_TMAP_MAX_RANK; i++)
		sb_printf(b, "%s%uu", i ? ", " : "", i < d->rank ? d->estrides[i] : 1);
	sb_printf(b, "} }; const long long ap_tc[%d] = { ", AP_TMAP_MAX_RANK);
	for (int i = 0; i < d->rank; i++) {
		sb_printf(b, "%s(long long)(", i ? ", " : "");
		print_expr(p, s->values[i]);
		sb_printf(b, ")");
	}
	sb_printf(b, " }; void *const ap_dst = (void *)&");
	print_array_ref(p, s->arr);
	sb_printf(b, "[");
	print_expr(p, s->index);
	sb_printf(b, "];");
	if (p->check) {
		sb_printf(b, " AP_CK(tma(ap_ck, ap_dst, %zuu, ", ap_tmap_box_bytes(d));
		print_host_elem_ptr(p, s->bar, s->bar_index);
		sb_printf(b, ", ap_t));");
	}
	sb_printf(b, " ap_tmap_host_load(&ap_td, ");
	print_array_ref(p, s->src);
	sb_printf(b, ", ap_tc, ap_dst, %s, ap_t);",
		  p->check ? "ap_ckb ? ap_check_rt->rd : 0, ap_ck" : "0, 0");
	if (p->roles) {   /* the plain state: the box landed */
		sb_printf(b, " ap_mbh_land(&ap_mbh_%s[", s->bar->name);
		print_expr(p, s->bar_index);
		sb_printf(b, "], %zu);", ap_tmap_box_bytes(d));
	}
	sb_printf(b, " }\n");
}

/* mbarrier.init / arrive and cp.async.bulk (thread mode): PTX on CUDA
 * (PTX ISA 8.0, sm_90); the host copies at once and, checking, tells the
 * checker each step (common/hostcheck.h: mbar_init, mbar_arrive, bulk). */
static void print_mbar_thread(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;
	bool cuda = p->target == AP_KIR_CUDA;
	bool copy = s->kind == AP_KIR_S_BULK_COPY || s->kind == AP_KIR_S_TMA_LOAD;
	const ap_kir_array *bar = copy ? s->bar : s->arr;
	const ap_kir_expr *bi = copy ? s->bar_index : s->index;

	sb_indent(b, depth);
	if (cuda) {
		sb_printf(b, "{ const unsigned ap_mb = ");
		print_shared_addr(p, bar, bi);
		sb_printf(b, "; ");
	} else if (!copy) {
		if (p->roles) {   /* the plain state the coroutines wait on */
			sb_printf(b, "%s(&ap_mbh_%s[", s->kind == AP_KIR_S_MBAR_INIT ? "ap_mbh_init" : "ap_mbh_arrive",
				  bar->name);
			print_expr(p, bi);
			sb_printf(b, "], (long long)(");
			if (s->value)
				print_expr(p, s->value);
			else
				sb_printf(b, "0");
			sb_printf(b, "));%s", p->check ? " " : "\n");
		}
		if (!p->check) {
			if (!p->roles)
				sb_printf(b, "/* %s: the host's copies land at once */\n",
					  s->kind == AP_KIR_S_MBAR_INIT ? "mbarrier.init" : "mbarrier.arrive");
			return;
		}
		sb_printf(b, "AP_CK(%s(ap_ck, ", s->kind == AP_KIR_S_MBAR_INIT ? "mbar_init" : "mbar_arrive");
		print_host_elem_ptr(p, bar, bi);
		sb_printf(b, ", (unsigned)(");
		if (s->value)
			print_expr(p, s->value);
		else
			sb_printf(b, "0");
		sb_printf(b, "), ap_t));\n");
		return;
	}
	switch (s->kind) {
	case AP_KIR_S_MBAR_INIT:
		sb_printf(b, "asm volatile(\"mbarrier.init.shared::cta.b64 [%%0], %%1;\\n\" :: \"r\"(ap_mb), \"r\"((unsigned)(");
		print_expr(p, s->value);
		sb_printf(b, ")) : \"memory\"); }\n");
		break;
	case AP_KIR_S_MBAR_ARRIVE:
		if (s->value) {
			sb_printf(b, "asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%%0], %%1;\\n\" :: "
				  "\"r\"(ap_mb), \"r\"((unsigned)(");
			print_expr(p, s->value);
			sb_printf(b, ")) : \"memory\"); }\n");
		} else {
			sb_printf(b, "asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%%0];\\n\" :: \"r\"(ap_mb) : "
				  "\"memory\"); }\n");
		}
		break;
	case AP_KIR_S_TMA_LOAD:
		print_tma_load(p, s, cuda);
		break;
	default:   /* AP_KIR_S_BULK_COPY */
		if (cuda) {
			sb_printf(b, "const unsigned ap_sa = ");
			print_shared_addr(p, s->arr, s->index);
			sb_printf(b, "; asm volatile(\"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
				  "[%%0], [%%1], %d, [%%2];\\n\" :: \"r\"(ap_sa), \"l\"(", s->width);
			print_elem_addr(p, s->src, s->src_index, 0);
			sb_printf(b, "), \"r\"(ap_mb) : \"memory\"); }\n");
			break;
		}
		sb_printf(b, "{ /* cp.async.bulk */ const long long ap_ci = ");
		print_expr(p, s->index);
		sb_printf(b, ", ap_cs = ");
		print_expr(p, s->src_index);
		sb_printf(b, ";");
		if (p->check) {
			sb_printf(b, " AP_CK(bulk(ap_ck, &");
			print_array_ref(p, s->arr);
			print_elem_index(p, s->arr, NULL, "ap_ci", 0);
			sb_printf(b, ", &");
			print_array_ref(p, s->src);
			sb_printf(b, "[ap_cs], %du, ", s->width);
			print_host_elem_ptr(p, bar, bi);
			sb_printf(b, ", ap_t));");
		}
		sb_printf(b, " for (int ap_e = 0; ap_e < %d; ap_e++) ",
			  (int)((size_t)s->width / ap_dtype_size(s->arr->type)));
		print_array_ref(p, s->arr);
		print_elem_index(p, s->arr, NULL, "ap_ci + ap_e", 0);
		sb_printf(b, " = ");
		print_array_ref(p, s->src);
		sb_printf(b, "[ap_cs + ap_e];");
		if (p->roles) {
			sb_printf(b, " ap_mbh_land(&ap_mbh_%s[", bar->name);
			print_expr(p, bi);
			sb_printf(b, "], %d);", s->width);
		}
		sb_printf(b, " }\n");
		break;
	}
}

/* The wait on an mbarrier phase: CUDA, try_wait.parity until it succeeds
 * (thread mode); the host, block mode between phases -- every arrival
 * and copy of the phases before has been made -- telling the checker
 * each thread's wait (which reports a phase nothing can complete). */
static void print_mbar_wait(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;

	if (p->target == AP_KIR_CUDA) {
		sb_indent(b, depth);
		sb_printf(b, "{ const unsigned ap_mb = ");
		print_shared_addr(p, s->arr, s->index);
		sb_printf(b, ", ap_par = (unsigned)(");
		print_expr(p, s->value);
		sb_printf(b, "); unsigned ap_ok; do asm volatile(\"{ .reg .pred ap_p; mbarrier.try_wait.parity.shared::cta.b64 "
			  "ap_p, [%%1], %%2; selp.u32 %%0, 1, 0, ap_p; }\\n\" : \"=r\"(ap_ok) : \"r\"(ap_mb), "
			  "\"r\"(ap_par) : \"memory\"); while (!ap_ok); }\n");
		return;
	}
	if (p->co >= 0) {
		/* a resume point of the arm's coroutine (print_roles_host): the
		 * barrier and parity kept for the retry and a deadlock report;
		 * not ready -> yield */
		int j = ++p->resume;

		sb_indent(b, depth);
		sb_printf(b, "ap_pc[%d] = %d; ap_wb[%d] = (void *)&", p->co, j, p->co);
		print_array_ref(p, s->arr);
		sb_printf(b, "[");
		print_expr(p, s->index);
		sb_printf(b, "]; ap_wh[%d] = &ap_mbh_%s[", p->co, s->arr->name);
		print_expr(p, s->index);
		sb_printf(b, "]; ap_wp[%d] = (unsigned)(", p->co);
		print_expr(p, s->value);
		sb_printf(b, ");\n");
		sb_printf(b, "ap_r%d_%d:\n", p->co, j);
		sb_indent(b, depth);
		if (p->check)
			sb_printf(b, "if (!(ap_ckb ? ap_check_rt->mbar_ready(ap_ck, ap_wb[%d], ap_wp[%d]) : "
				  "ap_mbh_ready(ap_wh[%d], ap_wp[%d])))\n", p->co, p->co, p->co, p->co);
		else
			sb_printf(b, "if (!ap_mbh_ready(ap_wh[%d], ap_wp[%d]))\n", p->co, p->co);
		sb_indent(b, depth + 1);
		sb_printf(b, "goto ap_r%d_out;   /* yield */\n", p->co);
		sb_indent(b, depth);
		sb_printf(b, "ap_moved = 1;\n");
		if (!p->check)
			return;
		open_thread_loop(p, depth);
		sb_indent(b, depth + 1);
		sb_printf(b, "AP_CK(mbar_wait(ap_ck, ap_wb[%d], ap_wp[%d], ap_t));\n", p->co, p->co);
		close_thread_loop(p, depth);
		return;
	}
	if (!p->check) {
		sb_indent(b, depth);
		sb_printf(b, "/* mbarrier wait: the host's copies landed at once */\n");
		return;
	}
	open_thread_loop(p, depth);
	sb_indent(b, depth + 1);
	sb_printf(b, "AP_CK(mbar_wait(ap_ck, ");
	print_host_elem_ptr(p, s->arr, s->index);
	sb_printf(b, ", (unsigned)(");
	print_expr(p, s->value);
	sb_printf(b, "), ap_t));\n");
	close_thread_loop(p, depth);
}

/* `arr[off + i]` (thread mode). */
static void print_frag_elem_cuda(printer *p, const ap_kir_array *a, const ap_kir_expr *off, int i)
{
	print_array_ref(p, a);
	print_elem_index(p, a, off, NULL, i);
}

/* The 32-bit register of fragment elements off + i (and off + i + 1 for
 * 16-bit types), as a value: no address of the register array is taken,
 * so that it stays in registers. */
static void print_reg32_value(printer *p, const ap_kir_array *a, const ap_kir_expr *off, int i)
{
	sbuf *b = &p->out;

	if (ap_dtype_size(a->type) == 4) {
		sb_printf(b, "__float_as_uint(");
		print_frag_elem_cuda(p, a, off, i);
		sb_printf(b, ")");
		return;
	}
	sb_printf(b, "((unsigned)%s(", half_as_ushort(a->type));
	print_frag_elem_cuda(p, a, off, i);
	sb_printf(b, ") | ((unsigned)%s(", half_as_ushort(a->type));
	print_frag_elem_cuda(p, a, off, i + 1);
	sb_printf(b, ") << 16))");
}

/* ldmatrix into 32-bit temporaries ap_r0.., then into the fragment's
 * elements by value. */
static void print_ldmatrix_cuda(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;
	bool wide = ap_dtype_size(s->src->type) == 4;

	sb_indent(b, depth);
	sb_printf(b, "{ unsigned ap_r0, ap_r1, ap_r2, ap_r3; const unsigned ap_sa = ");
	print_shared_addr(p, s->src, s->src_index);
	sb_printf(b, "; asm volatile(\"ldmatrix.sync.aligned.m8n8.x%d%s.shared.b16 {", s->width,
		  s->trans ? ".trans" : "");
	for (int j = 0; j < s->width; j++)
		sb_printf(b, "%s%%%d", j ? ", " : "", j);
	sb_printf(b, "}, [%%%d];\\n\" : ", s->width);
	for (int j = 0; j < s->width; j++)
		sb_printf(b, "%s\"=r\"(ap_r%d)", j ? ", " : "", j);
	sb_printf(b, " : \"r\"(ap_sa));");
	for (int j = 0; j < s->width; j++) {
		if (wide) {
			sb_printf(b, " ");
			print_frag_elem_cuda(p, s->arr, s->index, j);
			sb_printf(b, " = __uint_as_float(ap_r%d);", j);
		} else {
			sb_printf(b, " ");
			print_frag_elem_cuda(p, s->arr, s->index, 2 * j);
			sb_printf(b, " = %s((unsigned short)(ap_r%d & 0xffffu));", ushort_as_half(s->arr->type), j);
			sb_printf(b, " ");
			print_frag_elem_cuda(p, s->arr, s->index, 2 * j + 1);
			sb_printf(b, " = %s((unsigned short)(ap_r%d >> 16));", ushort_as_half(s->arr->type), j);
		}
	}
	sb_printf(b, " }\n");
}

static void print_mma_cuda(printer *p, const ap_kir_stmt *s, int depth)
{
	static const char *const ty[] = {"f16", "bf16", "tf32"};
	sbuf *b = &p->out;
	int na, nb, nc, r = 0;
	bool tf32 = s->mma == AP_KIR_MMA_TF32_1688;
	int step = tf32 ? 1 : 2;

	ap_kir_mma_frag_sizes((ap_kir_mma_kind)s->mma, &na, &nb, &nc);
	sb_indent(b, depth);
	sb_printf(b, "asm volatile(\"mma.sync.aligned.%s.row.col.f32.%s.%s.f32 {", tf32 ? "m16n8k8" : "m16n8k16",
		  ty[s->mma], ty[s->mma]);
	for (int i = 0; i < 4; i++)
		sb_printf(b, "%s%%%d", i ? ", " : "", r++);
	sb_printf(b, "}, {");
	for (int i = 0; i < na / step; i++)
		sb_printf(b, "%s%%%d", i ? ", " : "", r++);
	sb_printf(b, "}, {");
	for (int i = 0; i < nb / step; i++)
		sb_printf(b, "%s%%%d", i ? ", " : "", r++);
	sb_printf(b, "}, {");
	for (int i = 0; i < 4; i++)
		sb_printf(b, "%s%%%d", i ? ", " : "", r++);
	sb_printf(b, "};\\n\" : ");
	for (int i = 0; i < 4; i++) {
		sb_printf(b, "%s\"=f\"(", i ? ", " : "");
		print_frag_elem_cuda(p, s->frag[0], s->frag_off[0], i);
		sb_printf(b, ")");
	}
	sb_printf(b, " : ");
	for (int f = 1; f <= 2; f++)
		for (int i = 0; i < (f == 1 ? na : nb); i += step) {
			sb_printf(b, "\"r\"(");
			print_reg32_value(p, s->frag[f], s->frag_off[f], i);
			sb_printf(b, "), ");
		}
	for (int i = 0; i < 4; i++) {
		sb_printf(b, "%s\"f\"(", i ? ", " : "");
		print_frag_elem_cuda(p, s->frag[3], s->frag_off[3], i);
		sb_printf(b, ")");
	}
	sb_printf(b, ");\n");
}

/* The accumulators' registers fenced (CUTLASS's idea): an empty asm that
 * reads and writes each, so no access moves across the wgmma fence or
 * wait beside it. */
static void print_wg_operand_fence(printer *p, const ap_kir_array *acc, int depth)
{
	sbuf *b = &p->out;

	for (int64_t i = 0; i < acc->size; i++) {
		sb_indent(b, depth);
		sb_printf(b, "asm volatile(\"\" : \"+f\"(%s[%lld]) :: \"memory\");\n", acc->name, (long long)i);
	}
}

/* wgmma.mma_async (ap_kir_wgmma): the two descriptors, then D's N / 2
 * registers in and out, scale-d 1 (D accumulates), A and B unscaled and
 * transposed as their layouts are MN-major. */
static void print_wgmma_cuda(printer *p, const ap_kir_stmt *s, int depth)
{
	static const char *const ty[] = {"f16", "bf16", "tf32"};
	sbuf *b = &p->out;
	int nd = s->width / 2, kk = ap_kir_wgmma_k(s->mma);
	bool tf32 = s->mma == AP_KIR_WGMMA_TF32;   /* no transpose immediates (K-major only) */

	bool rs = s->frag[1]->space == AP_KIR_LOCAL;   /* A from registers: 4 32-bit registers */

	sb_indent(b, depth);
	sb_printf(b, "{\n");
	for (int i = rs ? 2 : 1; i <= 2; i++) {
		sb_indent(b, depth + 1);
		sb_printf(b, "const unsigned long long ap_d%c = ap_wg_desc(", i == 1 ? 'a' : 'b');
		print_shared_addr(p, s->frag[i], s->frag_off[i]);
		sb_printf(b, ", %du, %du, %du);\n", s->wg[i - 1].lbo, s->wg[i - 1].sbo, s->wg[i - 1].swizzle);
	}
	sb_indent(b, depth + 1);
	sb_printf(b, "asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%d, 0;\\n"
		  "wgmma.mma_async.sync.aligned.m64n%dk%d.f32.%s.%s {", nd + (rs ? 5 : 2), s->width, kk, ty[s->mma],
		  ty[s->mma]);
	for (int i = 0; i < nd; i++)
		sb_printf(b, "%s%%%d", i ? ", " : "", i);
	if (rs)
		sb_printf(b, "}, {%%%d, %%%d, %%%d, %%%d}, %%%d, p, 1, 1, %d;\\n}\\n\"\n", nd, nd + 1, nd + 2, nd + 3,
			  nd + 4, s->wg[1].mn_major);
	else if (tf32)
		sb_printf(b, "}, %%%d, %%%d, p, 1, 1;\\n}\\n\"\n", nd, nd + 1);
	else
		sb_printf(b, "}, %%%d, %%%d, p, 1, 1, %d, %d;\\n}\\n\"\n", nd, nd + 1, s->wg[0].mn_major,
			  s->wg[1].mn_major);
	sb_indent(b, depth + 2);
	sb_printf(b, ": ");
	for (int i = 0; i < nd; i++) {
		sb_printf(b, "%s\"+f\"(", i ? ", " : "");
		print_frag_elem_cuda(p, s->frag[0], s->frag_off[0], i);
		sb_printf(b, ")");
	}
	sb_printf(b, "\n");
	sb_indent(b, depth + 2);
	sb_printf(b, ": ");
	for (int i = 0; rs && i < 8; i += 2) {
		sb_printf(b, "\"r\"(");
		print_reg32_value(p, s->frag[1], s->frag_off[1], i);
		sb_printf(b, "), ");
	}
	sb_printf(b, "%s\"l\"(ap_db), \"r\"(1) : \"memory\");\n", rs ? "" : "\"l\"(ap_da), ");
	sb_indent(b, depth);
	sb_printf(b, "}\n");
}

/* The wgmma fence, commit and wait, and the async-proxy fence: PTX on
 * CUDA; the host computes each wgmma at once (nothing to wait for). */
static void print_wg_sync(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;
	bool cuda = p->target == AP_KIR_CUDA;

	switch (s->kind) {
	case AP_KIR_S_WGMMA_FENCE:
		if (cuda)
			print_wg_operand_fence(p, s->frag[0], depth);
		sb_indent(b, depth);
		sb_printf(b, cuda ? "asm volatile(\"wgmma.fence.sync.aligned;\\n\" ::: \"memory\");\n"
				  : "/* wgmma.fence */\n");
		break;
	case AP_KIR_S_WGMMA_COMMIT:
		sb_indent(b, depth);
		sb_printf(b, cuda ? "asm volatile(\"wgmma.commit_group.sync.aligned;\\n\" ::: \"memory\");\n"
			     : p->check ? "AP_CK(wg_commit(ap_ck, ap_t));   /* wgmma.commit_group */\n"
					: "/* wgmma.commit_group */\n");
		break;
	case AP_KIR_S_WGMMA_WAIT:
		sb_indent(b, depth);
		if (cuda)
			sb_printf(b, "asm volatile(\"wgmma.wait_group.sync.aligned %lld;\\n\" ::: \"memory\");\n",
				  (long long)s->step);
		else if (p->check)
			sb_printf(b, "AP_CK(wg_wait(ap_ck, ap_t, %lld));   /* wgmma.wait_group */\n",
				  (long long)s->step);
		else
			sb_printf(b, "/* wgmma.wait_group %lld: the host computed each wgmma at once */\n",
				  (long long)s->step);
		if (cuda)
			print_wg_operand_fence(p, s->frag[0], depth);
		break;
	default:   /* AP_KIR_S_FENCE_ASYNC */
		sb_indent(b, depth);
		sb_printf(b, cuda ? "asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\");\n"
			     : p->check ? "AP_CK(fence_async(ap_ck, ap_t));   /* fence.proxy.async.shared::cta */\n"
					: "/* fence.proxy.async.shared::cta */\n");
		break;
	}
}

/* One statement in thread mode (CUDA, or inside a host phase). */
/* CUDA: ROLES as an if / else if chain on the thread index of the
 * warp's first lane, broadcast by a shuffle (arms are whole warps: the
 * branch is then warp-uniform to the compiler too -- ptxas serialises
 * every wgmma of an arm it takes for a divergent path, C7520), each arm's
 * warpgroups first asking for their registers (setmaxnreg). */
static void print_roles_cuda(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;

	sb_indent(b, depth);
	sb_printf(b, "{\n");
	sb_indent(b, depth);
	sb_printf(b, "const unsigned ap_role_t = __shfl_sync(0xffffffffu, threadIdx.x, 0);   /* the warp's arm */\n");
	for (const ap_kir_stmt *a = s->body.first; a; a = a->next) {
		sb_indent(b, depth);
		sb_printf(b, "%sif (ap_role_t >= %uu && ap_role_t < %uu) {   /* arm: groups of %u threads */\n",
			  a == s->body.first ? "" : "} else ", a->arm_lo, a->arm_hi, a->arm_grain);
		if (a->maxnreg) {
			sb_indent(b, depth + 1);
			sb_printf(b, "asm volatile(\"setmaxnreg.%s.sync.aligned.u32 %d;\\n\" ::: \"memory\");\n",
				  a->maxnreg > 0 ? "inc" : "dec", a->maxnreg > 0 ? a->maxnreg : -a->maxnreg);
		}
		print_block_thread(p, &a->body, depth + 1);
	}
	sb_indent(b, depth);
	sb_printf(b, "}\n");
	sb_indent(b, depth);
	sb_printf(b, "}\n");
}

static void print_stmt_thread(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;

	switch (s->kind) {
	case AP_KIR_S_ROLES:
		if (p->target == AP_KIR_CUDA) {
			print_roles_cuda(p, s, depth);
		} else {
			p->bad = true;
			snprintf(p->bad_msg, sizeof(p->bad_msg), "ROLES inside a thread phase");
		}
		break;
	case AP_KIR_S_ARM:
		break;   /* printed by its ROLES */
	case AP_KIR_S_FOR:
	case AP_KIR_S_IF:
		print_control(p, s, depth, print_block_thread);
		break;
	case AP_KIR_S_LET:
		if (p->target == AP_KIR_HOST && p->per_thread[s->var->id]) {
			if (!s->value)
				break;
			sb_indent(b, depth);
			print_var(p, s->var);
			sb_printf(b, " = ");
		} else {
			sb_indent(b, depth);
			sb_printf(b, "%s %s", ctype(p, s->var->type), s->var->name);
			if (!s->value) {
				sb_printf(b, ";\n");
				break;
			}
			sb_printf(b, " = ");
		}
		print_value_as(p, s->var->type, s->value);
		sb_printf(b, ";\n");
		break;
	case AP_KIR_S_ASSIGN:
		sb_indent(b, depth);
		print_var(p, s->var);
		sb_printf(b, " = ");
		print_value_as(p, s->var->type, s->value);
		sb_printf(b, ";\n");
		break;
	case AP_KIR_S_STORE:
		sb_indent(b, depth);
		if (checked(p, s->arr))
			sb_printf(b, "*(%s *)AP_CK_WR(&", ctype(p, s->arr->type));
		print_array_ref(p, s->arr);
		print_load_index(p, s->arr, s->index);
		if (checked(p, s->arr))
			sb_printf(b, ", %zuu, ap_t, 1u)", ap_dtype_size(s->arr->type));
		sb_printf(b, " = ");
		print_value_as(p, s->arr->type, s->value);
		sb_printf(b, ";\n");
		break;
	case AP_KIR_S_VLOAD:
		if (p->target == AP_KIR_CUDA)
			print_vload_cuda(p, s, depth);
		else
			print_vload_host(p, s, depth);
		break;
	case AP_KIR_S_VSTORE:
		if (p->target == AP_KIR_CUDA)
			print_vstore_cuda(p, s, depth);
		else
			print_vstore_host(p, s, depth);
		break;
	case AP_KIR_S_CLUSTER_BARRIER:
		sb_indent(b, depth);
		if (p->target == AP_KIR_CUDA) {
			sb_printf(b, "asm volatile(\"barrier.cluster.arrive.release.aligned;\\n\\t"
				  "barrier.cluster.wait.acquire.aligned;\" ::: \"memory\");\n");
		} else {
			p->bad = true;
			snprintf(p->bad_msg, sizeof(p->bad_msg), "cluster barrier inside a thread phase");
		}
		break;
	case AP_KIR_S_BARRIER:
		sb_indent(b, depth);
		if (p->target == AP_KIR_CUDA) {
			sb_printf(b, "__syncthreads();\n");
		} else {
			p->bad = true;
			snprintf(p->bad_msg, sizeof(p->bad_msg), "barrier inside a thread phase");
		}
		break;
	case AP_KIR_S_SHFL:
		if (p->target == AP_KIR_CUDA) {
			print_shfl_cuda(p, s, depth);
		} else {
			p->bad = true;
			snprintf(p->bad_msg, sizeof(p->bad_msg), "shuffle inside a thread phase");
		}
		break;
	case AP_KIR_S_COMMENT:
		sb_indent(b, depth);
		sb_printf(b, "/* %s */\n", s->text ? s->text : "");
		break;
	case AP_KIR_S_CP_ASYNC:
		print_cp_async(p, s, depth);
		break;
	case AP_KIR_S_CP_COMMIT:
		sb_indent(b, depth);
		sb_printf(b, p->target == AP_KIR_CUDA ? "asm volatile(\"cp.async.commit_group;\\n\" ::: \"memory\");\n"
			     : p->check ? "AP_CK(commit(ap_ck, ap_t));   /* cp.async.commit_group */\n"
					: "/* cp.async.commit_group: the host copied at once */\n");
		break;
	case AP_KIR_S_CP_WAIT:
		sb_indent(b, depth);
		if (p->target == AP_KIR_CUDA)
			sb_printf(b, "asm volatile(\"cp.async.wait_group %lld;\\n\" ::: \"memory\");\n",
				  (long long)s->step);
		else if (p->check)
			sb_printf(b, "AP_CK(wait(ap_ck, ap_t, %lld));   /* cp.async.wait_group */\n",
				  (long long)s->step);
		else
			sb_printf(b, "/* cp.async.wait_group %lld */\n", (long long)s->step);
		break;
	case AP_KIR_S_WGMMA_FENCE:
	case AP_KIR_S_WGMMA_COMMIT:
	case AP_KIR_S_WGMMA_WAIT:
	case AP_KIR_S_FENCE_ASYNC:
		print_wg_sync(p, s, depth);
		break;
	case AP_KIR_S_MBAR_INIT:
	case AP_KIR_S_MBAR_ARRIVE:
	case AP_KIR_S_BULK_COPY:
	case AP_KIR_S_TMA_LOAD:
		print_mbar_thread(p, s, depth);
		break;
	case AP_KIR_S_MBAR_WAIT:
		if (p->target == AP_KIR_CUDA) {
			print_mbar_wait(p, s, depth);
		} else {
			p->bad = true;
			snprintf(p->bad_msg, sizeof(p->bad_msg), "mbarrier wait inside a thread phase");
		}
		break;
	case AP_KIR_S_LDMATRIX:
	case AP_KIR_S_MMA:
	case AP_KIR_S_WGMMA:
		if (p->target == AP_KIR_CUDA) {
			if (s->kind == AP_KIR_S_LDMATRIX)
				print_ldmatrix_cuda(p, s, depth);
			else if (s->kind == AP_KIR_S_MMA)
				print_mma_cuda(p, s, depth);
			else
				print_wgmma_cuda(p, s, depth);
		} else {
			p->bad = true;
			snprintf(p->bad_msg, sizeof(p->bad_msg), "warp matrix statement inside a thread phase");
		}
		break;
	}
}

static void print_block_thread(printer *p, const ap_kir_block *blk, int depth)
{
	for (const ap_kir_stmt *s = blk->first; s; s = s->next)
		print_stmt_thread(p, s, depth);
}

/* ---- host: block mode ------------------------------------------------------------ */

/* Register arrays: all of them (LD_ALL), the per-thread slots of the
 * non-scratch ones in a host kernel with collectives (LD_SLOTS), or only
 * the scratch ones, inside one host thread loop (LD_SCRATCH). */
enum { LD_ALL, LD_SLOTS, LD_SCRATCH };

static void print_local_decls(printer *p, int depth, int mode)
{
	const ap_kir_kernel *k = p->k;
	bool per_thread = mode == LD_SLOTS;

	for (int i = 0; i < k->n_arrays; i++) {
		const ap_kir_array *a = k->arrays[i];

		if (a->space != AP_KIR_LOCAL || (mode == LD_SLOTS && a->scratch) ||
		    (mode == LD_SCRATCH && !a->scratch))
			continue;
		sb_indent(&p->out, depth);
		sb_printf(&p->out, "%s%s %s[%lld];\n",
			  p->target == AP_KIR_CUDA && p->vec_array[a->id] ? "__align__(16) " : "",
			  ctype(p, a->type), a->name,
			  (long long)(per_thread ? a->size * p->nt : a->size));
	}
}

/* Host: `for (ap_t ...) {` and the thread indices; then thread mode. */
static void open_thread_loop(printer *p, int depth)
{
	const ap_kir_kernel *k = p->k;
	sbuf *b = &p->out;

	sb_indent(b, depth);
	if (p->lo)
		sb_printf(b, "for (unsigned ap_t = %uu; ap_t < %uu; ap_t++) {\n", p->lo, p->hi);
	else
		sb_printf(b, "for (unsigned ap_t = 0; ap_t < %uu; ap_t++) {\n", p->hi);
	if (k->block[0] > 1) {
		sb_indent(b, depth + 1);
		sb_printf(b, "const long long ap_tx = (long long)(ap_t %% %uu);\n", k->block[0]);
	}
	if (k->block[1] > 1) {
		sb_indent(b, depth + 1);
		sb_printf(b, "const long long ap_ty = (long long)((ap_t / %uu) %% %uu);\n",
			  k->block[0], k->block[1]);
	}
	if (k->block[2] > 1) {
		sb_indent(b, depth + 1);
		sb_printf(b, "const long long ap_tz = (long long)((ap_t / %uu) %% %uu);\n",
			  k->block[0] * k->block[1], k->block[2]);
	}
	if (k->cluster > 1) {
		/* this thread's block in the cluster, and that block's shared memory */
		sb_indent(b, depth + 1);
		sb_printf(b, "const long long ap_cr = (long long)(ap_t / %uu);\n", p->bt);
		for (int i = 0; i < k->n_arrays; i++) {
			const ap_kir_array *a = k->arrays[i];

			if (a->space != AP_KIR_SHARED && a->space != AP_KIR_SHARED_DYN)
				continue;
			sb_indent(b, depth + 1);
			if (a->space == AP_KIR_SHARED)
				sb_printf(b, "%s *const %s = %s_cl[ap_cr];\n", ctype(p, a->type), a->name, a->name);
			else
				sb_printf(b, "%s *const %s = (%s *)(ap_smem_cl[ap_cr] + %lluu);\n", ctype(p, a->type),
					  a->name, ctype(p, a->type), (unsigned long long)a->offset);
		}
	}
	print_local_decls(p, depth + 1, p->has_collective ? LD_SCRATCH : LD_ALL);
	p->block_mode = false;
}

static void close_thread_loop(printer *p, int depth)
{
	p->block_mode = true;
	sb_indent(&p->out, depth);
	sb_printf(&p->out, "}\n");
}

/* Host: the register arrays a phase uses (bit 1) and writes (bit 2),
 * in use[] per array id. */
static void note_array(unsigned char *use, const ap_kir_array *a, bool write)
{
	if (a && a->space == AP_KIR_LOCAL && !a->scratch)
		use[a->id] |= write ? 3 : 1;
}

static int use_stmt(const ap_kir_stmt *s, int depth, void *user)
{
	unsigned char *u = user;

	switch (s->kind) {
	case AP_KIR_S_STORE:
	case AP_KIR_S_VSTORE:
	case AP_KIR_S_LDMATRIX:
		note_array(u, s->arr, true);
		break;
	case AP_KIR_S_VLOAD:
		note_array(u, s->arr, false);
		break;
	case AP_KIR_S_MMA:
		note_array(u, s->frag[0], true);
		for (int i = 1; i < 4; i++)
			note_array(u, s->frag[i], false);
		break;
	case AP_KIR_S_WGMMA:
		note_array(u, s->frag[0], true);
		note_array(u, s->frag[1], false);
		break;
	default:
		break;
	}
	return 0;
}

static int use_expr(const ap_kir_expr *e, const ap_kir_stmt *s, void *user)
{
	if (e->kind == AP_KIR_E_LOAD)
		note_array(user, e->arr, false);
	return 0;
}

/* Host, kernels with collectives: per-thread register arrays live in
 * slots (NAME[ap_t * size + i]) because their values cross phases.
 * Inside one phase a thread touches only its own slice, so the phase
 * copies the slice of each array it uses into a local array of the same
 * name (shadowing the slots) and back if it writes it: the C compiler
 * then sees a small array of its own -- a register tile it can keep in
 * registers and vectorise -- instead of a stride into a large one.
 * Arrays above PROMOTE_MAX elements stay in their slots. */
#define PROMOTE_MAX 256

static void promote_open(printer *p, const unsigned char *use, int depth)
{
	for (int i = 0; i < p->k->n_arrays; i++) {
		const ap_kir_array *a = p->k->arrays[i];

		if (!use[a->id] || a->size > PROMOTE_MAX)
			continue;
		sb_indent(&p->out, depth);
		sb_printf(&p->out, "%s *const ap_slot_%s = %s + ap_t * %lldLL; %s %s[%lld]; "
			  "memcpy(%s, ap_slot_%s, sizeof %s);\n", ap_kir_ctype(a->type), a->name, a->name,
			  (long long)a->size, ap_kir_ctype(a->type), a->name, (long long)a->size, a->name, a->name,
			  a->name);
		p->promoted[a->id] = 1;
	}
}

static void promote_close(printer *p, const unsigned char *use, int depth)
{
	for (int i = 0; i < p->k->n_arrays; i++) {
		const ap_kir_array *a = p->k->arrays[i];

		if (!p->promoted[a->id])
			continue;
		if (use[a->id] & 2) {
			sb_indent(&p->out, depth);
			sb_printf(&p->out, "memcpy(ap_slot_%s, %s, sizeof %s);\n", a->name, a->name, a->name);
		}
		p->promoted[a->id] = 0;
	}
}

/* A phase: the statements [first, end) run by every thread of the block.
 * Comments and declarations of per-thread registers without a value (the
 * slots are declared at function level) need no thread loop. */
static void print_phase(printer *p, const ap_kir_stmt *first, const ap_kir_stmt *end, int depth)
{
	bool only_comments = true;
	unsigned char *use = NULL;

	for (const ap_kir_stmt *s = first; s != end; s = s->next)
		if (s->kind != AP_KIR_S_COMMENT &&
		    !(s->kind == AP_KIR_S_LET && !s->value && p->per_thread[s->var->id]))
			only_comments = false;
	if (only_comments) {
		for (const ap_kir_stmt *s = first; s != end; s = s->next)
			print_stmt_thread(p, s, depth);
		return;
	}
	if (p->target == AP_KIR_HOST && p->has_collective && p->promoted && p->k->n_arrays > 0) {
		ap_kir_visitor vis = {use_stmt, use_expr};

		use = calloc((size_t)p->k->n_arrays, 1);
		if (!use) {
			p->out.failed = true;
			return;
		}
		ap_kir_visit_range(first, end, &vis, use);
	}
	open_thread_loop(p, depth);
	if (use)
		promote_open(p, use, depth + 1);
	for (const ap_kir_stmt *s = first; s != end; s = s->next)
		print_stmt_thread(p, s, depth + 1);
	if (use)
		promote_close(p, use, depth + 1);
	close_thread_loop(p, depth);
	free(use);
}

/* Host: the per-thread temporary a shuffle of type t goes through. */
static const char *shfl_tmp(ap_dtype t)
{
	switch (t) {
	case AP_DT_F32: return "ap_shfl_float";
	case AP_DT_F64: return "ap_shfl_double";
	case AP_DT_I64: return "ap_shfl_llong";
	case AP_DT_I32: return "ap_shfl_int";
	case AP_DT_I8: return "ap_shfl_schar";
	case AP_DT_U8: return "ap_shfl_uchar";
	case AP_DT_BOOL: return "ap_shfl_bool";
	case AP_DT_F16: return "ap_shfl_half";
	case AP_DT_BF16: return "ap_shfl_bfloat";
	default: return "ap_shfl_other";
	}
}

/* Host: a shuffle at block level.  First loop: every thread's value into
 * the temporary.  Second loop: each thread's source lane by PTX
 * shfl.sync's rules (lane = ap_t % 32 within the warp ap_t / 32; only the
 * low 5 bits of the lane operand count; segments of `width` lanes; a
 * source outside the segment's rule -- or beyond the block -- gives the
 * caller's own value). */
static void print_shfl_host(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;
	const char *tmp = shfl_tmp(s->var->type);
	int w = s->width;

	sb_indent(b, depth);
	sb_printf(b, "/* %s, width %d: values, then each thread's source lane */\n",
		  shfl_fn(s->shfl), w);
	open_thread_loop(p, depth);
	sb_indent(b, depth + 1);
	sb_printf(b, "%s[ap_t] = ", tmp);
	print_value_as(p, s->var->type, s->value);
	sb_printf(b, ";\n");
	close_thread_loop(p, depth);

	open_thread_loop(p, depth);
	sb_indent(b, depth + 1);
	sb_printf(b, "const int ap_l = (int)(ap_t & 31u), ap_c = (int)");
	print_expr(p, s->lane);
	sb_printf(b, " & 31;\n");
	sb_indent(b, depth + 1);
	switch (s->shfl) {
	case AP_KIR_SHFL_XOR:
		sb_printf(b, "int ap_j = ap_l ^ ap_c;\n");
		sb_indent(b, depth + 1);
		sb_printf(b, "if (ap_j > (ap_l | %d))\n", w - 1);
		break;
	case AP_KIR_SHFL_DOWN:
		sb_printf(b, "int ap_j = ap_l + ap_c;\n");
		sb_indent(b, depth + 1);
		sb_printf(b, "if (ap_j > (ap_l | %d))\n", w - 1);
		break;
	case AP_KIR_SHFL_UP:
		sb_printf(b, "int ap_j = ap_l - ap_c;\n");
		sb_indent(b, depth + 1);
		sb_printf(b, "if (ap_j < (ap_l & ~%d))\n", w - 1);
		break;
	default:
		sb_printf(b, "int ap_j = (ap_l & ~%d) | (ap_c & %d);\n", w - 1, w - 1);
		sb_indent(b, depth + 1);
		sb_printf(b, "if (0)\n");
		break;
	}
	sb_indent(b, depth + 2);
	sb_printf(b, "ap_j = ap_l;\n");
	sb_indent(b, depth + 1);
	sb_printf(b, "ap_j += (int)(ap_t & ~31u);\n");
	sb_indent(b, depth + 1);
	print_var(p, s->var);
	sb_printf(b, " = ap_j < %d ? %s[ap_j] : %s[ap_t];\n", (int)p->nt, tmp, tmp);
	close_thread_loop(p, depth);
}

/* Host: an element of this thread's slice of register array `a` (in a
 * kernel with collectives), at `idx` + off. */
static void print_slot(printer *p, const ap_kir_array *a, const ap_kir_expr *idx, const char *plus)
{
	sb_printf(&p->out, "%s[ap_t * %lldLL + (", a->name, (long long)a->size);
	print_expr(p, idx);
	sb_printf(&p->out, ")%s]", plus);
}

/* Host ldmatrix: every lane's row index into ap_lm_row, then each lane
 * takes its elements from the rows of the lanes of its warp that the PTX
 * ISA names (see ap_kir_ldmatrix). */
static void print_ldmatrix_host(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;
	bool wide = ap_dtype_size(s->src->type) == 4;

	sb_indent(b, depth);
	sb_printf(b, "/* ldmatrix x%d%s: rows of every lane, then each lane's elements */\n", s->width,
		  s->trans ? ".trans" : "");
	open_thread_loop(p, depth);
	sb_indent(b, depth + 1);
	sb_printf(b, "ap_lm_row[ap_t] = (long long)(");
	print_expr(p, s->src_index);
	sb_printf(b, ");\n");
	if (checked(p, s->src)) {
		/* each of the first 8 x width lanes reads the 16-byte row it names */
		sb_indent(b, depth + 1);
		sb_printf(b, "if ((ap_t & 31u) < %du)\n", 8 * s->width);
		sb_indent(b, depth + 2);
		sb_printf(b, "(void)AP_CK_LM(&");
		print_array_ref(p, s->src);
		sb_printf(b, "[ap_lm_row[ap_t]], ap_t);\n");
	}
	close_thread_loop(p, depth);
	open_thread_loop(p, depth);
	sb_indent(b, depth + 1);
	sb_printf(b, "const unsigned ap_l = ap_t & 31u, ap_w = ap_t & ~31u;\n");
	sb_indent(b, depth + 1);
	sb_printf(b, "for (unsigned ap_j = 0; ap_j < %du; ap_j++) {\n", s->width);
	if (wide) {
		sb_indent(b, depth + 2);
		print_slot(p, s->arr, s->index, " + ap_j");
		sb_printf(b, " = ");
		print_array_ref(p, s->src);
		sb_printf(b, "[ap_lm_row[ap_w + ap_j * 8u + (ap_l >> 2)] + (ap_l & 3u)];\n");
	} else {
		sb_indent(b, depth + 2);
		sb_printf(b, "for (unsigned ap_e = 0; ap_e < 2u; ap_e++)\n");
		sb_indent(b, depth + 3);
		print_slot(p, s->arr, s->index, " + 2 * ap_j + ap_e");
		sb_printf(b, " = ");
		print_array_ref(p, s->src);
		if (s->trans)
			sb_printf(b, "[ap_lm_row[ap_w + ap_j * 8u + 2u * (ap_l & 3u) + ap_e] + (ap_l >> 2)];\n");
		else
			sb_printf(b, "[ap_lm_row[ap_w + ap_j * 8u + (ap_l >> 2)] + 2u * (ap_l & 3u) + ap_e];\n");
	}
	sb_indent(b, depth + 1);
	sb_printf(b, "}\n");
	close_thread_loop(p, depth);
}

/* Host: fragment element `i` of a lane as a float (16-bit types
 * converted; TF32 operands with the 13 low bits dropped, as the tensor
 * core reads them). */
static void print_frag_elem(printer *p, const ap_kir_stmt *s, int f, int i)
{
	sbuf *b = &p->out;
	char plus[16];
	ap_dtype t = s->frag[f]->type;

	snprintf(plus, sizeof(plus), " + %d", i);
	if (is_half(t))
		sb_printf(b, "%s(", half_to_f32(p, t));
	else if (s->mma == AP_KIR_MMA_TF32_1688 && (f == 1 || f == 2))
		sb_printf(b, "ap_tf32_trunc(");
	else
		sb_printf(b, "(");
	print_slot(p, s->frag[f], s->frag_off[f], plus);
	sb_printf(b, ")");
}

/* Host mma: each lane's fragments into the warp's matrices by the PTX
 * ISA's layouts, D = A * B + C per warp (products exact in float, summed
 * in order of k), then each lane's part of D. */
static void print_mma_host(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;
	bool tf32 = s->mma == AP_KIR_MMA_TF32_1688;
	int K = tf32 ? 8 : 16;
	/* (row, column) of each fragment element, in terms of g and t */
	static const char *const a16[8][2] = {
		{"ap_g", "2*ap_q"}, {"ap_g", "2*ap_q+1"}, {"ap_g+8", "2*ap_q"}, {"ap_g+8", "2*ap_q+1"},
		{"ap_g", "2*ap_q+8"}, {"ap_g", "2*ap_q+9"}, {"ap_g+8", "2*ap_q+8"}, {"ap_g+8", "2*ap_q+9"}};
	static const char *const b16[4][2] = {
		{"2*ap_q", "ap_g"}, {"2*ap_q+1", "ap_g"}, {"2*ap_q+8", "ap_g"}, {"2*ap_q+9", "ap_g"}};
	static const char *const a8[4][2] = {{"ap_g", "ap_q"}, {"ap_g+8", "ap_q"}, {"ap_g", "ap_q+4"},
					     {"ap_g+8", "ap_q+4"}};
	static const char *const b8[2][2] = {{"ap_q", "ap_g"}, {"ap_q+4", "ap_g"}};
	static const char *const c4[4][2] = {{"ap_g", "2*ap_q"}, {"ap_g", "2*ap_q+1"}, {"ap_g+8", "2*ap_q"},
					     {"ap_g+8", "2*ap_q+1"}};
	int na, nb, nc;

	ap_kir_mma_frag_sizes((ap_kir_mma_kind)s->mma, &na, &nb, &nc);
	sb_indent(b, depth);
	sb_printf(b, "/* mma %s: fragments in, D = A * B + C per warp, fragments out */\n",
		  tf32 ? "m16n8k8 tf32" : "m16n8k16");
	open_thread_loop(p, depth);
	sb_indent(b, depth + 1);
	sb_printf(b, "const unsigned ap_g = (ap_t & 31u) >> 2, ap_q = ap_t & 3u, ap_wi = ap_t >> 5;\n");
	for (int i = 0; i < na; i++) {
		sb_indent(b, depth + 1);
		sb_printf(b, "ap_mma_a[ap_wi][%s][%s] = ", tf32 ? a8[i][0] : a16[i][0], tf32 ? a8[i][1] : a16[i][1]);
		print_frag_elem(p, s, 1, i);
		sb_printf(b, ";\n");
	}
	for (int i = 0; i < nb; i++) {
		sb_indent(b, depth + 1);
		sb_printf(b, "ap_mma_b[ap_wi][%s][%s] = ", tf32 ? b8[i][0] : b16[i][0], tf32 ? b8[i][1] : b16[i][1]);
		print_frag_elem(p, s, 2, i);
		sb_printf(b, ";\n");
	}
	for (int i = 0; i < nc; i++) {
		sb_indent(b, depth + 1);
		sb_printf(b, "ap_mma_c[ap_wi][%s][%s] = ", c4[i][0], c4[i][1]);
		print_frag_elem(p, s, 3, i);
		sb_printf(b, ";\n");
	}
	close_thread_loop(p, depth);
	sb_indent(b, depth);
	if (p->lo)   /* an arm's warps */
		sb_printf(b, "for (unsigned ap_wi = %uu; ap_wi < %uu; ap_wi++)\n", p->lo / 32, p->hi / 32);
	else
		sb_printf(b, "for (unsigned ap_wi = 0; ap_wi < %uu; ap_wi++)\n", p->hi / 32);
	sb_indent(b, depth + 1);
	sb_printf(b, "for (int ap_i = 0; ap_i < 16; ap_i++)\n");
	sb_indent(b, depth + 2);
	sb_printf(b, "for (int ap_n = 0; ap_n < 8; ap_n++) {\n");
	sb_indent(b, depth + 3);
	sb_printf(b, "float ap_s = ap_mma_c[ap_wi][ap_i][ap_n];\n");
	sb_indent(b, depth + 3);
	sb_printf(b, "for (int ap_k = 0; ap_k < %d; ap_k++)\n", K);
	sb_indent(b, depth + 4);
	sb_printf(b, "ap_s += ap_mma_a[ap_wi][ap_i][ap_k] * ap_mma_b[ap_wi][ap_k][ap_n];\n");
	sb_indent(b, depth + 3);
	sb_printf(b, "ap_mma_c[ap_wi][ap_i][ap_n] = ap_s;\n");
	sb_indent(b, depth + 2);
	sb_printf(b, "}\n");
	open_thread_loop(p, depth);
	sb_indent(b, depth + 1);
	sb_printf(b, "const unsigned ap_g = (ap_t & 31u) >> 2, ap_q = ap_t & 3u, ap_wi = ap_t >> 5;\n");
	for (int i = 0; i < nc; i++) {
		char plus[16];

		snprintf(plus, sizeof(plus), " + %d", i);
		sb_indent(b, depth + 1);
		print_slot(p, s->frag[0], s->frag_off[0], plus);
		sb_printf(b, " = ap_mma_c[ap_wi][%s][%s];\n", c4[i][0], c4[i][1]);
	}
	close_thread_loop(p, depth);
}

/* Host wgmma (ap_kir_wgmma), in three steps: each thread's N / 2
 * accumulators into its warpgroup's D (the ISA's fragment layout), the
 * warpgroup's first thread reading A (64 x 16) and B (16 x N) through the
 * descriptors its start addresses make (ap_wg_desc: the start a byte
 * offset into the shared array) and decodes (ap_wg_addr: the ISA's
 * canonical layouts); then D += A B per warpgroup, summed in order of k;
 * then each thread's accumulators back. */
static void print_wgmma_host(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;
	bool tf32 = s->mma == AP_KIR_WGMMA_TF32;
	int nd = s->width / 2, es = tf32 ? 4 : 2, kk = ap_kir_wgmma_k(s->mma);
	/* an element's bits as read: 16-bit floats widened, float32 truncated to TF32 */
	const char *cv = tf32 ? "ap_tf32_trunc" : half_to_f32(p, s->frag[1]->type), *et = tf32 ? "float" : "unsigned short";

	sb_indent(b, depth);
	sb_printf(b, "/* wgmma m64n%dk%d: accumulators in, A and B through their descriptors, "
		  "D += A * B per warpgroup, accumulators out */\n", s->width, kk);
	open_thread_loop(p, depth);
	sb_indent(b, depth + 1);
	sb_printf(b, "const unsigned ap_wi = ap_t >> 7, ap_g = ((ap_t >> 5) & 3u) * 16u + ((ap_t & 31u) >> 2), "
		  "ap_q = 2u * (ap_t & 3u);\n");
	sb_indent(b, depth + 1);
	sb_printf(b, "for (unsigned ap_i = 0; ap_i < %du; ap_i++)\n", nd);
	sb_indent(b, depth + 2);
	sb_printf(b, "ap_wg_d[ap_wi][ap_g + 8u * ((ap_i >> 1) & 1u)][8u * (ap_i >> 2) + ap_q + (ap_i & 1u)] = ");
	print_slot(p, s->frag[0], s->frag_off[0], " + ap_i");
	sb_printf(b, ";\n");
	if (s->frag[1]->space == AP_KIR_LOCAL) {
		/* A from registers: element i at row 16 w + g (+ 8), column 2 t + i % 2 (+ 8) */
		sb_indent(b, depth + 1);
		sb_printf(b, "for (unsigned ap_i = 0; ap_i < 8u; ap_i++)\n");
		sb_indent(b, depth + 2);
		sb_printf(b, "ap_wg_a[ap_wi][ap_g + 8u * ((ap_i >> 1) & 1u)][8u * (ap_i >> 2) + ap_q + (ap_i & 1u)] = "
			  "%s(", cv);
		print_slot(p, s->frag[1], s->frag_off[1], " + ap_i");
		sb_printf(b, ");\n");
	}
	sb_indent(b, depth + 1);
	sb_printf(b, "if ((ap_t & 127u) == 0) {\n");
	for (int i = s->frag[1]->space == AP_KIR_LOCAL ? 2 : 1; i <= 2; i++) {
		const ap_kir_array *a = s->frag[i];
		const ap_kir_wg_layout *l = &s->wg[i - 1];

		sb_indent(b, depth + 2);
		sb_printf(b, "{\n");
		sb_indent(b, depth + 2);
		sb_printf(b, "const unsigned long long ap_d = ap_wg_desc((unsigned long long)(");
		print_expr(p, s->frag_off[i]);
		sb_printf(b, ") * %du, %du, %du, %du);\n", es, l->lbo, l->sbo, l->swizzle);
		sb_indent(b, depth + 2);
		sb_printf(b, "for (unsigned ap_r = 0; ap_r < %du; ap_r++)\n", i == 1 ? 64 : s->width);
		sb_indent(b, depth + 3);
		sb_printf(b, "for (unsigned ap_k = 0; ap_k < %du; ap_k++) {\n", kk);
		sb_indent(b, depth + 4);
		sb_printf(b, "const %s *ap_e = (const %s *)((const char *)", et, et);
		print_array_ref(p, a);
		sb_printf(b, " + ap_wg_addr(ap_d, %d, ap_r, ap_k, %du));\n", l->mn_major, es);
		sb_indent(b, depth + 4);
		if (i == 1)
			sb_printf(b, "ap_wg_a[ap_wi][ap_r][ap_k] = ");
		else
			sb_printf(b, "ap_wg_b[ap_wi][ap_k][ap_r] = ");
		if (checked(p, a))
			sb_printf(b, "%s(*(const %s *)AP_CK_WGRD(ap_e, %du, ap_t));\n", cv, et, es);
		else
			sb_printf(b, "%s(*ap_e);\n", cv);
		sb_indent(b, depth + 3);
		sb_printf(b, "}\n");
		sb_indent(b, depth + 2);
		sb_printf(b, "}\n");
	}
	sb_indent(b, depth + 1);
	sb_printf(b, "}\n");
	close_thread_loop(p, depth);
	sb_indent(b, depth);
	if (p->lo)   /* an arm's warpgroups */
		sb_printf(b, "for (unsigned ap_wi = %uu; ap_wi < %uu; ap_wi++)\n", p->lo / 128, p->hi / 128);
	else
		sb_printf(b, "for (unsigned ap_wi = 0; ap_wi < %uu; ap_wi++)\n", p->hi / 128);
	sb_indent(b, depth + 1);
	sb_printf(b, "for (int ap_i = 0; ap_i < 64; ap_i++)\n");
	sb_indent(b, depth + 2);
	sb_printf(b, "for (int ap_n = 0; ap_n < %d; ap_n++) {\n", s->width);
	sb_indent(b, depth + 3);
	sb_printf(b, "float ap_s = ap_wg_d[ap_wi][ap_i][ap_n];\n");
	sb_indent(b, depth + 3);
	sb_printf(b, "for (int ap_k = 0; ap_k < %d; ap_k++)\n", kk);
	sb_indent(b, depth + 4);
	sb_printf(b, "ap_s += ap_wg_a[ap_wi][ap_i][ap_k] * ap_wg_b[ap_wi][ap_k][ap_n];\n");
	sb_indent(b, depth + 3);
	sb_printf(b, "ap_wg_d[ap_wi][ap_i][ap_n] = ap_s;\n");
	sb_indent(b, depth + 2);
	sb_printf(b, "}\n");
	open_thread_loop(p, depth);
	sb_indent(b, depth + 1);
	sb_printf(b, "const unsigned ap_wi = ap_t >> 7, ap_g = ((ap_t >> 5) & 3u) * 16u + ((ap_t & 31u) >> 2), "
		  "ap_q = 2u * (ap_t & 3u);\n");
	sb_indent(b, depth + 1);
	sb_printf(b, "for (unsigned ap_i = 0; ap_i < %du; ap_i++)\n", nd);
	sb_indent(b, depth + 2);
	print_slot(p, s->frag[0], s->frag_off[0], " + ap_i");
	sb_printf(b, " = ap_wg_d[ap_wi][ap_g + 8u * ((ap_i >> 1) & 1u)][8u * (ap_i >> 2) + ap_q + (ap_i & 1u)];\n");
	close_thread_loop(p, depth);
}

static void print_block_host(printer *p, const ap_kir_block *blk, int depth);

/* The mbarrier waits of an arm's body: its coroutine's resume points. */
static int count_waits(const ap_kir_block *b)
{
	int n = 0;

	for (const ap_kir_stmt *s = b->first; s; s = s->next) {
		if (s->kind == AP_KIR_S_MBAR_WAIT)
			n++;
		n += count_waits(&s->body) + count_waits(&s->orelse);
	}
	return n;
}

/* Host: ROLES as stackless coroutines (docs/hopper-pipeline.md, section
 * 1.2).  Each group of arm_grain threads of each arm is one coroutine:
 * its body in block mode over its own threads (p->lo, p->hi), each
 * mbarrier wait a resume point (print_mbar_wait: the point saved in
 * ap_pc, a wait not ready jumps to the coroutine's end -- a yield).  The
 * block's scheduler runs the live coroutines round-robin, each until it
 * yields or ends; when none moved, the checking mode lands the oldest
 * copy in flight (the checker's deliver: copies land as late as the ISA
 * allows) and retries, and otherwise it is a deadlock: the checker hears
 * of every blocked coroutine (stuck), the kernel sets ap_host_fault and
 * leaves (the runtime fails the launch).  Registers live across a wait
 * are per-thread slots (mark_per_thread), loop variables at the arm's
 * block level slots of the group's first thread (arm_for): nothing a
 * resumed coroutine needs lives in a C local the goto skipped. */
static void print_roles_host(printer *p, const ap_kir_stmt *s, int depth)
{
	sbuf *b = &p->out;
	int n = 0, co = 0;

	for (const ap_kir_stmt *a = s->body.first; a; a = a->next)
		n += (int)((a->arm_hi - a->arm_lo) / a->arm_grain);
	if (n > 8) {
		p->bad = true;
		snprintf(p->bad_msg, sizeof(p->bad_msg), "more than 8 groups in the arms of ROLES");
		return;
	}
	sb_indent(b, depth);
	sb_printf(b, "{ /* warp specialisation: %d coroutines, one per group of an arm */\n", n);
	sb_indent(b, depth + 1);
	sb_printf(b, "int ap_pc[%d] = {0}; void *ap_wb[%d] = {0}; ap_mbh *ap_wh[%d] = {0}; unsigned ap_wp[%d] = {0}, "
		  "ap_live = 0x%xu;\n", n, n, n, n, (unsigned)((1ull << n) - 1));
	sb_indent(b, depth + 1);
	sb_printf(b, "for (;;) {\n");
	sb_indent(b, depth + 2);
	sb_printf(b, "int ap_moved = 0;\n");
	if (p->check) {
		/* the checking mode: each pass in the checker's order
		 * (APOLLO_HOSTCHECK_SCHEDULE, hostcheck.c ck_order) */
		sb_indent(b, depth + 2);
		sb_printf(b, "unsigned ap_i = 0;\n");
		sb_printf(b, "ap_sched:\n");
		sb_indent(b, depth + 2);
		sb_printf(b, "if (ap_i == %du)\n", n);
		sb_indent(b, depth + 3);
		sb_printf(b, "goto ap_pass;\n");
		sb_indent(b, depth + 2);
		sb_printf(b, "switch (ap_check_rt->order(ap_ck, ap_i++, %du)) {", n);
		for (int j = 0; j < n; j++)
			sb_printf(b, " case %d: goto ap_c%d;", j, j);
		sb_printf(b, " default: goto ap_pass; }\n");
	}
	for (const ap_kir_stmt *a = s->body.first; a; a = a->next)
		for (unsigned g = a->arm_lo; g < a->arm_hi; g += a->arm_grain, co++) {
			int waits = count_waits(&a->body);

			if (p->check)
				sb_printf(b, "ap_c%d:\n", co);
			sb_indent(b, depth + 2);
			sb_printf(b, "/* arm %u..%u: threads %u..%u */\n", a->arm_lo, a->arm_hi - 1, g,
				  g + a->arm_grain - 1);
			sb_indent(b, depth + 2);
			sb_printf(b, "if (ap_live & 0x%xu) {\n", 1u << co);
			if (waits) {
				sb_indent(b, depth + 3);
				sb_printf(b, "switch (ap_pc[%d]) {", co);
				for (int j = 1; j <= waits; j++)
					sb_printf(b, " case %d: goto ap_r%d_%d;", j, co, j);
				sb_printf(b, " default: break; }\n");
			}
			sb_indent(b, depth + 3);
			sb_printf(b, "ap_moved = 1;\n");
			p->lo = g;
			p->hi = g + a->arm_grain;
			p->co = co;
			p->resume = 0;
			print_block_host(p, &a->body, depth + 3);
			p->lo = 0;
			p->hi = p->nt;
			p->co = -1;
			sb_indent(b, depth + 3);
			sb_printf(b, "ap_live &= ~0x%xu;\n", 1u << co);
			sb_indent(b, depth + 2);
			sb_printf(b, "}\n");
			if (waits)
				sb_printf(b, "ap_r%d_out:;\n", co);
			if (p->check) {
				sb_indent(b, depth + 2);
				sb_printf(b, "goto ap_sched;\n");
			}
		}
	if (p->check)
		sb_printf(b, "ap_pass:\n");
	sb_indent(b, depth + 2);
	sb_printf(b, "if (!ap_live)\n");
	sb_indent(b, depth + 3);
	sb_printf(b, "break;\n");
	sb_indent(b, depth + 2);
	sb_printf(b, "if (ap_moved)\n");
	sb_indent(b, depth + 3);
	sb_printf(b, "continue;\n");
	if (p->check) {
		sb_indent(b, depth + 2);
		sb_printf(b, "if (ap_ckb && ap_check_rt->deliver(ap_ck))   /* the oldest copy in flight lands */\n");
		sb_indent(b, depth + 3);
		sb_printf(b, "continue;\n");
	}
	sb_indent(b, depth + 2);
	sb_printf(b, "/* deadlock: no coroutine can move, nothing is in flight */\n");
	co = 0;
	for (const ap_kir_stmt *a = s->body.first; a && p->check; a = a->next)
		for (unsigned g = a->arm_lo; g < a->arm_hi; g += a->arm_grain, co++) {
			sb_indent(b, depth + 2);
			sb_printf(b, "if (ap_live & 0x%xu) AP_CK(stuck(ap_ck, ap_wb[%d], ap_wp[%d], %uu, %uu));\n", 1u << co,
				  co, co, g, g + a->arm_grain);
		}
	sb_indent(b, depth + 2);
	sb_printf(b, "__atomic_store_n(&ap_host_fault, 1, __ATOMIC_RELAXED);\n");
	sb_indent(b, depth + 2);
	sb_printf(b, "goto ap_fault;\n");
	sb_indent(b, depth + 1);
	sb_printf(b, "}\n");
	sb_indent(b, depth);
	sb_printf(b, "}\n");
}

static void print_block_host(printer *p, const ap_kir_block *blk, int depth)
{
	sbuf *b = &p->out;
	const ap_kir_stmt *run = NULL;

	for (const ap_kir_stmt *s = blk->first; s; s = s->next) {
		if (!stmt_has_collective(s)) {
			if (!run)
				run = s;
			continue;
		}
		if (run)
			print_phase(p, run, s, depth);
		run = NULL;
		switch (s->kind) {
		case AP_KIR_S_BARRIER:
			sb_indent(b, depth);
			sb_printf(b, p->check ? "AP_CK(barrier(ap_ck, 0));   /* barrier: next phase */\n"
					      : "/* barrier: next phase */\n");
			break;
		case AP_KIR_S_CLUSTER_BARRIER:   /* the cluster's threads are this loop's */
			sb_indent(b, depth);
			sb_printf(b, p->check ? "AP_CK(barrier(ap_ck, 1));   /* cluster barrier */\n"
					      : "/* cluster barrier: next phase */\n");
			break;
		case AP_KIR_S_SHFL:
			print_shfl_host(p, s, depth);
			break;
		case AP_KIR_S_LDMATRIX:
			print_ldmatrix_host(p, s, depth);
			break;
		case AP_KIR_S_MMA:
			print_mma_host(p, s, depth);
			break;
		case AP_KIR_S_WGMMA:
			print_wgmma_host(p, s, depth);
			break;
		case AP_KIR_S_MBAR_WAIT:
			print_mbar_wait(p, s, depth);
			break;
		case AP_KIR_S_ROLES:
			print_roles_host(p, s, depth);
			break;
		case AP_KIR_S_FOR:
		case AP_KIR_S_IF:
			print_control(p, s, depth, print_block_host);
			break;
		default:
			break;
		}
	}
	if (run)
		print_phase(p, run, NULL, depth);
}

/* CUDA: the device functions and types the kernel's statements use
 * (TF32 rounding, distributed shared memory loads, the wgmma matrix
 * descriptor, the tensor-map parameter type), each guarded: several
 * kernels may share one translation unit. */
static void print_cuda_helpers(printer *p)
{
	const ap_kir_kernel *k = p->k;
	sbuf *b = &p->out;

	if (p->uses_tf32)
		sb_printf(b, "#ifndef AP_TF32_DEFINED\n#define AP_TF32_DEFINED\n"
			  "static __device__ __forceinline__ float ap_tf32f(float x)\n"
			  "{ unsigned r; asm(\"cvt.rna.tf32.f32 %%0, %%1;\" : \"=r\"(r) : \"f\"(x)); "
			  "return __uint_as_float(r); }\n#endif\n");
	if (p->uses_ex2)   /* PTX ISA: ex2.approx.ftz.f32 */
		sb_printf(b, "#ifndef AP_EX2_DEFINED\n#define AP_EX2_DEFINED\n"
			  "static __device__ __forceinline__ float ap_ex2f(float x)\n"
			  "{ float r; asm(\"ex2.approx.ftz.f32 %%0, %%1;\" : \"=f\"(r) : \"f\"(x)); return r; }\n#endif\n");
	if (p->uses_dsmem)   /* PTX ISA: mapa, ld.shared::cluster (sm_90) */
		sb_printf(b, "#ifndef AP_DSMEM_DEFINED\n#define AP_DSMEM_DEFINED\n"
			  "static __device__ __forceinline__ float ap_dsmem_f32(const float *p, unsigned r)\n"
			  "{ unsigned a = (unsigned)__cvta_generic_to_shared(p), m; float v;\n"
			  "  asm volatile(\"mapa.shared::cluster.u32 %%0, %%1, %%2;\" : \"=r\"(m) : \"r\"(a), \"r\"(r));\n"
			  "  asm volatile(\"ld.shared::cluster.f32 %%0, [%%1];\" : \"=f\"(v) : \"r\"(m) : \"memory\");\n"
			  "  return v; }\n"
			  "static __device__ __forceinline__ double ap_dsmem_f64(const double *p, unsigned r)\n"
			  "{ unsigned a = (unsigned)__cvta_generic_to_shared(p), m; double v;\n"
			  "  asm volatile(\"mapa.shared::cluster.u32 %%0, %%1, %%2;\" : \"=r\"(m) : \"r\"(a), \"r\"(r));\n"
			  "  asm volatile(\"ld.shared::cluster.f64 %%0, [%%1];\" : \"=d\"(v) : \"r\"(m) : \"memory\");\n"
			  "  return v; }\n#endif\n");
	if (kernel_has_tmap(k))   /* CUtensorMap: 128 opaque bytes, 64-byte aligned */
		sb_printf(b, "#ifndef AP_TMAP_DEFINED\n#define AP_TMAP_DEFINED\n"
			  "typedef struct __align__(64) { unsigned long long w[16]; } ap_tmap;\n#endif\n");
	if (p->wgmma_n)   /* PTX ISA: the wgmma matrix descriptor (half.c, ap__kir_host_wgmma_src) */
		sb_printf(b, "#ifndef AP_WGMMA_DEFINED\n#define AP_WGMMA_DEFINED\n"
			  "static __device__ __forceinline__ unsigned long long ap_wg_desc(unsigned a, "
			  "unsigned lbo, unsigned sbo, unsigned sw)\n"
			  "{ return (unsigned long long)((a & 0x3FFFFu) >> 4) | "
			  "((unsigned long long)((lbo & 0x3FFFFu) >> 4) << 16) | "
			  "((unsigned long long)((sbo & 0x3FFFFu) >> 4) << 32) | "
			  "((unsigned long long)(sw == 128u ? 1u : sw == 64u ? 2u : sw == 32u ? 3u : 0u) << 62); }\n"
			  "#endif\n");
}

/* ---- translation units ------------------------------------------------------------- */

static void print_const_data(printer *p, const ap_kir_array *a)
{
	sbuf *b = &p->out;
	size_t es = ap_dtype_size(a->type);

	for (int64_t i = 0; i < a->size; i++) {
		const unsigned char *src = (const unsigned char *)a->data + (size_t)i * es;

		if (i % 8 == 0)
			sb_printf(b, "\n\t");
		switch (a->type) {
		case AP_DT_F32: {
			float f;
			memcpy(&f, src, 4);
			print_float(p, AP_DT_F32, f);
			break;
		}
		case AP_DT_F64: {
			double d;
			memcpy(&d, src, 8);
			print_float(p, AP_DT_F64, d);
			break;
		}
		case AP_DT_I64: {
			int64_t v;
			memcpy(&v, src, 8);
			print_int(p, AP_DT_I64, v);
			break;
		}
		case AP_DT_I32: {
			int32_t v;
			memcpy(&v, src, 4);
			print_int(p, AP_DT_I32, v);
			break;
		}
		case AP_DT_I8:
			sb_printf(b, "%d", (int)(int8_t)src[0]);
			break;
		case AP_DT_F16:
		case AP_DT_BF16: {
			uint16_t v;
			memcpy(&v, src, 2);
			sb_printf(b, "0x%04x", (unsigned)v);
			break;
		}
		default:
			sb_printf(b, "%d", (int)src[0]);
			break;
		}
		sb_printf(b, ",");
	}
}

static void print_prelude(printer *p)
{
	sbuf *b = &p->out;
	const ap_kir_kernel *k = p->k;

	sb_printf(b, "/* %s: generated by Apollo %s (%s target); grid %ux%ux%u, block %ux%ux%u, "
		  "dynamic shared %u bytes */\n", k->name, AP_VERSION,
		  p->target == AP_KIR_CUDA ? "CUDA" : "host", k->grid[0], k->grid[1], k->grid[2],
		  k->block[0], k->block[1], k->block[2], k->smem_bytes);
	if (p->target == AP_KIR_CUDA) {
		if (p->uses_f16)
			sb_printf(b, "#include <cuda_fp16.h>\n");
		if (p->uses_bf16)
			sb_printf(b, "#include <cuda_bf16.h>\n");
		sb_printf(b, "#define AP_INFF __int_as_float(0x7f800000)\n"
			  "#define AP_NANF __int_as_float(0x7fffffff)\n"
			  "#define AP_INF __longlong_as_double(0x7ff0000000000000LL)\n"
			  "#define AP_NAN __longlong_as_double(0x7fffffffffffffffLL)\n");
		print_cuda_helpers(p);
	} else {
		sb_printf(b, "#include <math.h>\n#include <string.h>\n"
			  "#define AP_INFF __builtin_inff()\n"
			  "#define AP_NANF __builtin_nanf(\"\")\n"
			  "#define AP_INF __builtin_inf()\n"
			  "#define AP_NAN __builtin_nan(\"\")\n"
			  "#ifndef AP_HOST_ISA\n"
			  "#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11\n"
			  "#define AP_HOST_ISA __attribute__((target_clones(\"arch=x86-64-v3\", \"default\")))\n"
			  "#else\n#define AP_HOST_ISA\n#endif\n#endif\n");
		/* guarded: several kernels may share one translation unit */
		if (p->uses_f16)
			sb_printf(b, "#ifndef AP_F16_DEFINED\n#define AP_F16_DEFINED\n%s#endif\n",
				  ap__kir_host_f16_src);
		if (p->uses_bf16)
			sb_printf(b, "#ifndef AP_BF16_DEFINED\n#define AP_BF16_DEFINED\n%s#endif\n",
				  ap__kir_host_bf16_src);
		if (p->uses_tf32 || p->uses_mma || p->uses_wgmma_tf32)
			sb_printf(b, "#ifndef AP_TF32_DEFINED\n#define AP_TF32_DEFINED\n%s#endif\n",
				  ap__kir_host_tf32_src);
		if (p->uses_ex2)
			sb_printf(b, "#ifndef AP_EX2_DEFINED\n#define AP_EX2_DEFINED\n%s#endif\n", ap__kir_host_ex2_src);
		if (p->wgmma_n)
			sb_printf(b, "#ifndef AP_WGMMA_DEFINED\n#define AP_WGMMA_DEFINED\n%s#endif\n",
				  ap__kir_host_wgmma_src);
		if (p->uses_tma)
			sb_printf(b, "#ifndef AP_TMAP_DEFINED\n#define AP_TMAP_DEFINED\n%s#endif\n",
				  ap__kir_host_tmap_src);
		if (p->roles)
			sb_printf(b, "#ifndef AP_MBH_DEFINED\n#define AP_MBH_DEFINED\n%s#endif\n",
				  ap__kir_host_mbar_src);
		if (p->check)   /* the checker's table, set by the runtime (hostcheck.h) */
			sb_printf(b, "#ifndef AP_CHECK_DEFINED\n#define AP_CHECK_DEFINED\n%s"
				  "const ap_hcheck_ops *ap_check_rt;\n"
				  /* a block the checker samples (ap_ckb) goes through it */
				  "#define AP_CK_RD(p, n, t, a) (ap_ckb ? ap_check_rt->rd(ap_ck, (p), (n), (t), "
				  "(a)) : (const void *)(p))\n"
				  "#define AP_CK_WR(p, n, t, a) (ap_ckb ? ap_check_rt->wr(ap_ck, (p), (n), (t), "
				  "(a)) : (void *)(p))\n"
				  "#define AP_CK_WGRD(p, n, t) (ap_ckb ? ap_check_rt->wg_rd(ap_ck, (p), (n), (t)) "
				  ": (const void *)(p))\n"
				  "#define AP_CK_LM(p, t) (ap_ckb ? ap_check_rt->lm_rd(ap_ck, (p), (t)) "
				  ": (const void *)(p))\n"
				  "#define AP_CK(call) do { if (ap_ckb) ap_check_rt->call; } while (0)\n"
				  "#endif\n", AP_HCHECK_DECL);
	}
	for (int i = 0; i < k->n_arrays; i++) {
		const ap_kir_array *a = k->arrays[i];

		if (a->space != AP_KIR_CONST)
			continue;
		sb_printf(b, "%s%s const %s %s_%s[%lld] = {",
			  p->target == AP_KIR_CUDA ? "__device__" : "static",
			  p->target == AP_KIR_CUDA && p->vec_array[a->id] ? " __align__(16)" : "",
			  ap_kir_ctype(a->type), k->name, a->name, (long long)a->size);
		p->const_init = true;
		print_const_data(p, a);
		p->const_init = false;
		sb_printf(b, "\n};\n");
	}
}

/* Global parameters in param order. */
static const ap_kir_array *param_at(const ap_kir_kernel *k, int i)
{
	for (int j = 0; j < k->n_arrays; j++)
		if (k->arrays[j]->space == AP_KIR_GLOBAL && k->arrays[j]->param == i)
			return k->arrays[j];
	return NULL;
}

static void print_shared_decls(printer *p, int depth)
{
	const ap_kir_kernel *k = p->k;
	sbuf *b = &p->out;
	bool cuda = p->target == AP_KIR_CUDA;

	for (int i = 0; i < k->n_arrays; i++) {
		const ap_kir_array *a = k->arrays[i];

		if (a->space == AP_KIR_SHARED && !cuda && k->cluster > 1) {
			/* host: one copy per block of the cluster (open_thread_loop) */
			sb_indent(b, depth);
			sb_printf(b, "%s %s_cl[%u][%lld];\n", ctype(p, a->type), a->name, k->cluster,
				  (long long)(a->size > 0 ? a->size : 1));
		} else if (a->space == AP_KIR_SHARED) {
			sb_indent(b, depth);
			sb_printf(b, "%s%s%s %s[%lld];\n", cuda ? "__shared__ " : "",
				  cuda && p->vec_array[a->id] ? "__align__(16) " : "",
				  ctype(p, a->type), a->name, (long long)(a->size > 0 ? a->size : 1));
		}
	}
	if (k->smem_bytes > 0 && !cuda && k->cluster > 1) {
		sb_indent(b, depth);
		sb_printf(b, "_Alignas(16) unsigned char ap_smem_cl[%u][%u];\n", k->cluster,
			  (k->smem_bytes + 15u) / 16u * 16u);
	} else if (k->smem_bytes > 0) {
		sb_indent(b, depth);
		if (cuda && k->smem_align > 16) {
			/* the driver aligns dynamic shared memory to 16 bytes: the
			 * arrays' offsets (ap_kir_shared_dyn_aligned) count from a
			 * start aligned here, within the slack smem_bytes holds */
			sb_printf(b, "extern __shared__ __align__(16) unsigned char ap_smem_raw[];\n");
			sb_indent(b, depth);
			sb_printf(b, "unsigned char *const ap_smem = ap_smem_raw + ((0u - (unsigned)"
				  "__cvta_generic_to_shared(ap_smem_raw)) & %uu);\n", k->smem_align - 1);
		} else if (cuda)
			sb_printf(b, "extern __shared__ __align__(16) unsigned char ap_smem[];\n");
		else
			sb_printf(b, "_Alignas(16) unsigned char ap_smem[%u];\n",
				  k->smem_bytes);
		for (int i = 0; i < k->n_arrays; i++) {
			const ap_kir_array *a = k->arrays[i];

			if (a->space != AP_KIR_SHARED_DYN)
				continue;
			sb_indent(b, depth);
			sb_printf(b, "%s *%s = (%s *)(ap_smem + %llu);\n", ctype(p, a->type), a->name,
				  ctype(p, a->type), (unsigned long long)a->offset);
		}
	}
}

static void print_cuda(printer *p)
{
	const ap_kir_kernel *k = p->k;
	sbuf *b = &p->out;

	print_prelude(p);
	if (k->cluster > 1)
		sb_printf(b, "extern \"C\" __global__ void __cluster_dims__(%u, 1, 1) __launch_bounds__(%u, 1) %s(",
			  k->cluster, p->nt, k->name);
	else
		sb_printf(b, "extern \"C\" __global__ void __launch_bounds__(%u, 1) %s(", p->nt, k->name);
	for (int i = 0; i < k->n_params; i++) {
		const ap_kir_array *a = param_at(k, i);

		if (!a)
			continue;
		sb_printf(b, "%s%s%s *__restrict__ %s", i ? ", " : "", a->written ? "" : "const ",
			  ctype(p, a->type), a->name);
	}
	/* tensor maps after the arrays, in parameter order (ap_kir_tensor_map) */
	for (int i = 0; i < k->n_params; i++) {
		const ap_kir_array *a = param_at(k, i);

		if (a && a->tmap)
			sb_printf(b, ", const __grid_constant__ ap_tmap %s_tmap", a->name);
	}
	sb_printf(b, ")\n{\n");
	print_shared_decls(p, 1);
	print_local_decls(p, 1, LD_ALL);
	print_block_thread(p, &k->body, 1);
	sb_printf(b, "}\n");
}

/* Host: one array of per-thread slots for each register marked by
 * mark_per_thread, declared once at function level. */
static void declare_per_thread(printer *p, const ap_kir_block *blk)
{
	for (const ap_kir_stmt *s = blk->first; s; s = s->next) {
		if (s->kind == AP_KIR_S_LET && p->per_thread[s->var->id])
			sb_printf(&p->out, "\t%s %s[%u];\n", ctype(p, s->var->type),
				  s->var->name, p->nt);
		if (s->kind == AP_KIR_S_VLOAD)
			for (int i = 0; i < s->width; i++)
				if (p->per_thread[s->vars[i]->id])
					sb_printf(&p->out, "\t%s %s[%u];\n", ctype(p, s->arr->type),
						  s->vars[i]->name, p->nt);
		if (s->kind == AP_KIR_S_FOR && p->arm_for && p->arm_for[s->var->id])
			sb_printf(&p->out, "\t%s %s[%u];\n", ctype(p, s->var->type), s->var->name, p->nt);
		if (s->kind == AP_KIR_S_FOR || s->kind == AP_KIR_S_IF || s->kind == AP_KIR_S_ROLES ||
		    s->kind == AP_KIR_S_ARM) {
			declare_per_thread(p, &s->body);
			declare_per_thread(p, &s->orelse);
		}
	}
}

/* Host: whether the kernel keeps a register tile -- a per-thread array of
 * at least REG_TILE_MIN elements in a kernel with barriers (the GEMM,
 * convolution and attention emitters' accumulators and fragments, down to
 * a 2x2 thread tile): the kernels whose arithmetic the vector width
 * decides, built with an x86-64-v3 clone (AP_HOST_ISA).  The others
 * (element-wise, reductions) mostly wait on memory; one baseline build
 * keeps their compile time (a clone doubles it).  squeezenet1_1, one
 * thread: 72 ms baseline, 50-57 ms with clones of its 16 tiled kernels
 * (the same with all 22 cloned); bert_like_2l 35 -> 29 ms. */
#define REG_TILE_MIN 4

static bool has_register_tile(const printer *p)
{
	if (!p->has_collective)
		return false;
	for (int i = 0; i < p->k->n_arrays; i++)
		if (p->k->arrays[i]->space == AP_KIR_LOCAL && p->k->arrays[i]->size >= REG_TILE_MIN)
			return true;
	return false;
}

/* Checking mode: the checker's context for this call, and every region an
 * access may touch -- each global parameter (its extent is the runtime's to
 * say: param index) and each shared array, per block of a cluster. */
static void print_check_regions(printer *p)
{
	const ap_kir_kernel *k = p->k;
	sbuf *b = &p->out;
	unsigned ranks = k->cluster > 1 ? k->cluster : 1;

	sb_printf(b, "\tvoid *const ap_ck = ap_check_rt->begin(\"%s\", %uu, %uu, %lluull);\n", k->name,
		  p->nt, p->bt, (unsigned long long)k->grid[0] * k->grid[1] * k->grid[2]);
	for (int i = 0; i < k->n_params; i++) {
		const ap_kir_array *a = param_at(k, i);

		if (a)
			sb_printf(b, "\tap_check_rt->region(ap_ck, %s, 0, \"%s\", %d, 0, %d);\n", a->name,
				  a->name, AP_HCHECK_GLOBAL, i);
	}
	for (int i = 0; i < k->n_arrays; i++) {
		const ap_kir_array *a = k->arrays[i];
		unsigned long long bytes = (unsigned long long)a->size * ap_dtype_size(a->type);

		if (a->space != AP_KIR_SHARED && a->space != AP_KIR_SHARED_DYN)
			continue;
		for (unsigned r = 0; r < ranks; r++) {
			sb_printf(b, "\tap_check_rt->region(ap_ck, ");
			if (a->space == AP_KIR_SHARED)
				sb_printf(b, ranks > 1 ? "%s_cl[%u]" : "%s", a->name, r);
			else if (ranks > 1)
				sb_printf(b, "ap_smem_cl[%u] + %lluu", r, (unsigned long long)a->offset);
			else
				sb_printf(b, "%s", a->name);
			sb_printf(b, ", %lluu, \"%s\", %d, %u, -1);\n", bytes, a->name, AP_HCHECK_SHARED, r);
		}
	}
}

/* Checking mode, ROLES: every group of every arm is one arm for the
 * checker (its clocks; roles in common/hostcheck.h), in print_roles_host's
 * order. */
static int roles_bounds(const ap_kir_block *b, unsigned *out, int n)
{
	for (const ap_kir_stmt *s = b->first; s; s = s->next) {
		if (s->kind == AP_KIR_S_ROLES)
			for (const ap_kir_stmt *a = s->body.first; a; a = a->next)
				for (unsigned g = a->arm_lo; g < a->arm_hi; g += a->arm_grain, n++)
					if (n < 8) {
						out[2 * n] = g;
						out[2 * n + 1] = g + a->arm_grain;
					}
		n = roles_bounds(&s->body, out, n);
		n = roles_bounds(&s->orelse, out, n);
	}
	return n;
}

static void print_check_roles(printer *p)
{
	unsigned bounds[16];
	int n = roles_bounds(&p->k->body, bounds, 0);

	if (n > 8)
		return;   /* print_roles_host refuses it */
	sb_printf(&p->out, "\t{\n\t\tstatic const unsigned ap_rb[%d] = {", 2 * n);
	for (int i = 0; i < 2 * n; i++)
		sb_printf(&p->out, "%s%uu", i ? ", " : "", bounds[i]);
	sb_printf(&p->out, "};\n\t\tap_check_rt->roles(ap_ck, %du, ap_rb);\n\t}\n", n);
}

static void print_host(printer *p)
{
	const ap_kir_kernel *k = p->k;
	sbuf *b = &p->out;

	print_prelude(p);
	sb_printf(b, "void %s(void *const *args, unsigned block_begin, unsigned block_end);\n",
		  k->name);
	if (k->n_params > 0) {
		/* what each parameter may touch, bytes (0: not known): the
		 * runtime refuses a launch that binds a smaller buffer */
		sb_printf(b, "const unsigned long long %s_ap_extents[%d] = {", k->name, k->n_params);
		for (int i = 0; i < k->n_params; i++) {
			const ap_kir_array *a = param_at(k, i);

			sb_printf(b, "%s%lluull", i ? ", " : "",
				  a ? (unsigned long long)a->size * ap_dtype_size(a->type) : 0ull);
		}
		sb_printf(b, "};\n");
	}
	sb_printf(b, "%svoid %s(void *const *args, unsigned block_begin, unsigned block_end)\n{\n",
		  !p->baseline && has_register_tile(p) ? "AP_HOST_ISA " : "", k->name);
	for (int i = 0; i < k->n_params; i++) {
		const ap_kir_array *a = param_at(k, i);

		if (!a)
			continue;
		sb_printf(b, "\t%s%s *restrict %s = (%s%s *)args[%d];\n", a->written ? "" : "const ",
			  ap_kir_ctype(a->type), a->name, a->written ? "" : "const ",
			  ap_kir_ctype(a->type), i);
	}
	declare_per_thread(p, &k->body);
	for (int t = 0; t < 32; t++)
		if (p->shfl_types & (1u << t))
			sb_printf(b, "\t%s %s[%u];\n", ap_kir_ctype((ap_dtype)t),
				  shfl_tmp((ap_dtype)t), p->nt);
	if (p->uses_ldmatrix)
		sb_printf(b, "\tlong long ap_lm_row[%u];\n", p->nt);
	if (p->uses_mma)
		sb_printf(b, "\tfloat ap_mma_a[%u][16][16], ap_mma_b[%u][16][8], ap_mma_c[%u][16][8];\n",
			  p->nt / 32 ? p->nt / 32 : 1, p->nt / 32 ? p->nt / 32 : 1, p->nt / 32 ? p->nt / 32 : 1);
	if (p->wgmma_n) {
		unsigned w = p->nt / 128 ? p->nt / 128 : 1;

		sb_printf(b, "\tfloat ap_wg_a[%u][64][16], ap_wg_b[%u][16][%d], ap_wg_d[%u][64][%d];\n", w, w,
			  p->wgmma_n, w, p->wgmma_n);
	}
	if (p->has_collective)
		print_local_decls(p, 1, LD_SLOTS);
	print_shared_decls(p, 1);
	if (p->roles)
		for (int i = 0; i < k->n_arrays; i++)
			if (k->arrays[i]->mbar)   /* each mbarrier's plain state (ap_mbh) */
				sb_printf(b, "\tap_mbh ap_mbh_%s[%lld];\n", k->arrays[i]->name, (long long)k->arrays[i]->size);
	if (p->check)
		print_check_regions(p);
	if (p->check && p->roles)
		print_check_roles(p);
	sb_printf(b, "\tfor (unsigned ap_b = block_begin; ap_b < block_end; ap_b++) {\n");
	if (k->cluster > 1) {
		/* the cluster whose first block this is, all its blocks at once */
		sb_printf(b, "\t\tif (ap_b %% %uu)\n\t\t\tcontinue;\n", k->cluster);
		sb_printf(b, "\t\tconst long long ap_cx = (long long)(ap_b / %uu);\n", k->cluster);
	}
	if (p->check)
		sb_printf(b, "\t\tconst int ap_ckb = ap_check_rt->block(ap_ck, ap_b);\n");
	if (k->cluster <= 1 && k->grid[0] > 1)
		sb_printf(b, "\t\tconst long long ap_bx = (long long)(ap_b %% %uu);\n", k->grid[0]);
	if (k->grid[1] > 1)
		sb_printf(b, "\t\tconst long long ap_by = (long long)((ap_b / %uu) %% %uu);\n",
			  k->grid[0], k->grid[1]);
	if (k->grid[2] > 1)
		sb_printf(b, "\t\tconst long long ap_bz = (long long)(ap_b / %uu);\n",
			  k->grid[0] * k->grid[1]);
	p->block_mode = true;
	print_block_host(p, &k->body, 2);
	sb_printf(b, "\t}\n");
	if (p->roles)   /* a deadlock leaves the kernel here */
		sb_printf(b, "ap_fault:;\n");
	if (p->check)
		sb_printf(b, "\tap_check_rt->end(ap_ck);\n");
	sb_printf(b, "}\n");
}

/* ---- what the kernel uses (one walk before printing) --------------------------------- */

static void note_type(printer *p, ap_dtype t)
{
	if (t == AP_DT_F16)
		p->uses_f16 = true;
	if (t == AP_DT_BF16)
		p->uses_bf16 = true;
}

static int scan_stmt(const ap_kir_stmt *s, int depth, void *user)
{
	printer *p = user;

	if (s->var)
		note_type(p, s->var->type);
	if (s->kind == AP_KIR_S_SHFL && (unsigned)s->var->type < 32)
		p->shfl_types |= 1u << s->var->type;
	if (s->kind == AP_KIR_S_VLOAD || s->kind == AP_KIR_S_VSTORE)
		p->vec_array[s->arr->id] = 1;
	if (s->kind == AP_KIR_S_LDMATRIX) {
		p->uses_ldmatrix = true;
		p->vec_array[s->arr->id] = 1;
		p->vec_array[s->src->id] = 1;
		note_type(p, s->arr->type);
	}
	if (s->kind == AP_KIR_S_MMA) {
		p->uses_mma = true;
		for (int i = 0; i < 4; i++) {
			p->vec_array[s->frag[i]->id] = 1;
			note_type(p, s->frag[i]->type);
		}
	}
	if (s->kind == AP_KIR_S_WGMMA) {
		if (s->width > p->wgmma_n)
			p->wgmma_n = s->width;
		if (s->mma == AP_KIR_WGMMA_TF32)
			p->uses_wgmma_tf32 = true;
		for (int i = 0; i < 3; i++)
			note_type(p, s->frag[i]->type);
	}
	if (s->kind == AP_KIR_S_CP_ASYNC)
		p->vec_array[s->arr->id] = 1;
	if (s->kind == AP_KIR_S_TMA_LOAD)
		p->uses_tma = true;
	if (s->kind == AP_KIR_S_ROLES)
		p->roles = true;
	return 0;
}

static int scan_expr(const ap_kir_expr *e, const ap_kir_stmt *s, void *user)
{
	printer *p = user;

	note_type(p, e->type);
	if (e->kind == AP_KIR_E_CALL && e->op == AP_KIR_TF32)
		p->uses_tf32 = true;
	if (e->kind == AP_KIR_E_CALL && e->op == AP_KIR_EX2_APPROX)
		p->uses_ex2 = true;
	if (e->kind == AP_KIR_E_LOAD && e->c)
		p->uses_dsmem = true;
	return 0;
}

static void scan_kernel(printer *p)
{
	const ap_kir_visitor v = { scan_stmt, scan_expr };

	for (int i = 0; i < p->k->n_arrays; i++)
		note_type(p, p->k->arrays[i]->type);
	ap_kir_visit(p->k, &v, p);
}

__ap_give char *ap_kir_print(const ap_kir_kernel *k, ap_kir_target target, ap_error *err)
{
	return ap_kir_print_with(k, target, 0, err);
}

__ap_give char *ap_kir_print_with(const ap_kir_kernel *k, ap_kir_target target, unsigned flags,
				  ap_error *err)
{
	printer p;

	if (!k || k->failed) {
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "kernel IR incomplete (allocation failed)");
		return NULL;
	}
	memset(&p, 0, sizeof(p));
	p.k = k;
	p.check = target == AP_KIR_HOST_CHECK;
	p.baseline = (flags & AP_KIR_PRINT_BASELINE) != 0;
	p.target = p.check ? AP_KIR_HOST : target;
	p.bt = ap_kir_block_threads(k);
	p.nt = p.bt * (p.target == AP_KIR_HOST && k->cluster > 1 ? k->cluster : 1);
	p.lo = 0;
	p.hi = p.nt;
	p.co = -1;
	p.per_thread = calloc((size_t)k->n_vars + 1, 1);
	p.vec_array = calloc((size_t)k->n_arrays + 1, 1);
	p.promoted = calloc((size_t)k->n_arrays + 1, 1);
	if (!p.per_thread || !p.vec_array || !p.promoted) {
		free(p.per_thread);
		free(p.vec_array);
		free(p.promoted);
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory printing %s", k->name);
		return NULL;
	}
	p.has_collective = block_has_collective(&k->body);
	scan_kernel(&p);
	if (p.roles && p.target == AP_KIR_HOST && !(p.arm_for = calloc((size_t)k->n_vars + 1, 1))) {
		free(p.per_thread);
		free(p.vec_array);
		free(p.promoted);
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory printing %s", k->name);
		return NULL;
	}
	if (p.target == AP_KIR_HOST) {
		mark_per_thread(&p, &k->body);
		print_host(&p);
	} else {
		print_cuda(&p);
	}
	free(p.per_thread);
	free(p.vec_array);
	free(p.promoted);
	free(p.arm_for);
	if (p.bad) {
		free(p.out.s);
		ap_error_set(err, AP_EINTERNAL, NULL, NULL, "kernel %s: %s", k->name,
			     p.bad_msg[0] ? p.bad_msg : "unprintable control flow");
		return NULL;
	}
	if (p.out.failed || !p.out.s) {
		free(p.out.s);
		ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory printing %s", k->name);
		return NULL;
	}
	return p.out.s;
}
