/* gemm_internal.h -- what the GEMM emitter's files share (gemm.c's file
 * comment describes the emitter): the analysed product (gemm_plan), a
 * configuration (gemm_cfg, the schedule's knobs in K_* order), how an
 * operand reaches shared memory (stage_mode), the kernel under
 * construction (gctx), and the functions one file calls in another.
 *
 *   gemm.c         analysis of the micro-graph, the configuration space,
 *                  the default rule, validity, the library candidate,
 *                  traffic, the emitter record;
 *   gemm_stage.c   operand indexing and staging: element offsets (plain,
 *                  convolution gather), shared-tile addresses, cp.async
 *                  copies, pair and compute staging, register-staged loads;
 *   gemm_kernel.c  the arithmetic (SIMT and mma.sync over a K tile),
 *                  split-K's cluster reduction, the epilogue and the
 *                  kernel's skeleton (ap__gemm_emit);
 *   gemm_tma.c     wgmma's tiles filled by TMA (tma=1): the operands'
 *                  tensor maps, the mbarrier ring, the persistent loop;
 *                  the warp-specialised forms (tma=2: TMA, tma=3: a
 *                  producer warpgroup copying by cp.async / registers).
 *
 * Each function's comment is at its definition.
 */
#ifndef AP_LOWER_GEMM_INTERNAL_H
#define AP_LOWER_GEMM_INTERNAL_H

#include "emitters.h"
#include "library.h"

/* What a GEMM keeps of one batch dim of a plain operand: its factors. */
#define BATCH_FACTORS 4

typedef struct bdim {
	int n;                          /* 0: broadcast (stride 0) */
	int64_t e[BATCH_FACTORS], s[BATCH_FACTORS];
} bdim;

typedef struct gemm_opnd {
	int t;                          /* the MatMul input */
	bool plain;                     /* a buffer read through views / transposes */
	int leaf;                       /* plain: the buffer's tensor */
	int64_t s_outer, s_k;           /* plain: strides of the outer (M or N) and K coordinates */
	bool composite;                 /* plain: the outer or K dim is mixed-radix (fo, fk) */
	bool cvec;                      /* composite, yet copied `vec` elements at a time
					   along the innermost factor of its contiguous
					   coordinate (composite_vector) */
	bdim fo, fk;                    /* plain, composite: their factors */
	int64_t s_base;                 /* plain: element of index 0 (a slice's start) */
	bdim batch[AP_MAX_RANK];        /* plain: per output batch dim */
	bool k_fast;                    /* K is the contiguous coordinate (plain), or assumed so */
	int vec;                        /* plain: elements per cp.async along the contiguous
					   coordinate (0: none possible) */
	bool gather;                    /* convolution, not plain: the im2col element (or a
					   weight through transposes) is one element of `leaf`
					   at `gv`, copied one by one (4- and 8-byte types; a
					   16-bit element by the 4-byte pair around it:
					   ap__gemm_copy_mode) */
	ap_sview gv;                       /* gather: the convolution input as a view of leaf */
	bool staged;                    /* plain or gather: the operand is computed element
					   for element from the view of `leaf` by unary ops
					   (ap_sview_of_unary: a Cast of the float32 inputs a
					   converted graph keeps, a scale): cp.async copies
					   leaf's elements, the operand is computed from them
					   into the tile (ap__gemm_copy_mode); vec, k_fast and the
					   strides are leaf's */
	bool casts_only;                /* staged: those ops are all Casts (0 stays 0) */
	int src_es;                     /* staged: bytes of leaf's elements */
} gemm_opnd;

typedef struct gemm_plan {
	int node, y;
	ap_dtype in_t, acc_t;
	int nb;                         /* Y's batch dims */
	int64_t bdims[AP_MAX_RANK], batch, M, N, K;
	bool fold;                      /* B has no batch dims: the batch dims are
					   folded into the rows, Mr = batch * M */
	int64_t Mr, tb;                 /* rows of the product; batches of tiles */
	bool a_linear;                  /* folded, and A's rows are one stride apart
					   across batches too: offset row * s_outer */
	gemm_opnd a, b;                 /* b is described as [N][K] */
	bool tc;                        /* tensor cores */
	bool wg;                        /* ... by wgmma (sm_90a; TF32 too): tm / tn
					   count warpgroups, the shared tiles are laid out
					   in core matrices (ap__gemm_smem_lin) */
	ap_kir_mma_kind mma;
	ap_emap *maps;                  /* per tensor of m->g */
	/* convolution as an implicit GEMM: rows (n, output position), columns
	 * the output channels of a group, K (input channel of the group,
	 * kernel position); tile batches are the groups */
	bool conv, convt;               /* Conv / ConvTranspose */
	int ns;                         /* spatial dims */
	int x, w, bias;                 /* the node's inputs (bias -1 when none) */
	int64_t C, groups, Cg, Mg, ohw, kk;
	int64_t D[3], O[3], KS[3], st[3], pd[3], dl[3];
	bool a_1x1;                     /* Conv 1x1, stride 1, no padding: A is
					   X itself, rows contiguous per image */
} gemm_plan;

/* SIMT order; tensor cores: tm = wm, tn = wn.  The space has K_SPLITK
 * only where split-K can be built and has more than one value (see
 * splitk_values), so other schedules read as they always did. */
enum { K_BM, K_BN, K_BK, K_TM, K_TN, K_STAGES, K_SPLITK, K_LIB, K_TMA };

typedef struct gemm_cfg {
	int bm, bn, bk, tm, tn, stages;   /* tensor cores: tm, tn = warps along M, N */
	int splitk;                       /* blocks (a thread-block cluster) sharing a tile's K */
	int tma;                          /* 1: wgmma's tiles filled by TMA on an mbarrier ring,
					     persistent blocks (gemm_tma.c); 2: the same with
					     warp specialisation -- a producer warpgroup issues
					     the loads, the others compute; 3: warp specialised,
					     the producer copying by cp.async and its registers
					     (any operands); 0: cp.async by every thread */
} gemm_cfg;

/* How an operand copied by cp.async reaches its tile (ap__gemm_copy_mode). */
typedef enum stage_mode {
	STAGE_TILE,                     /* straight into the tile's stages (or registers) */
	STAGE_PAIRS,                    /* pair-staged: 4-byte pairs, then extracted */
	STAGE_COMPUTE,                  /* the source's elements, then the operand computed */
} stage_mode;

/* A configuration resolved (the gemm emitter's ap_plan.x): the tile,
 * how each operand reaches shared memory, the block's threads and shared
 * bytes, whether it fits the target -- what gm_traffic models and
 * ap__gemm_emit builds. */
typedef struct gemm_res {
	gemm_cfg c;
	stage_mode mode[2];               /* A, B (ap__gemm_copy_mode) */
	int w[2];                         /* elements a cp.async; 0: through registers */
	int sw[2];                        /* wgmma: the tile's swizzle in bytes (ap__gemm_wg_swizzle) */
	unsigned threads;
	size_t smem;                      /* ap__gemm_smem_bytes */
	bool fits;                        /* ap__gemm_cfg_valid */
	bool lib;                         /* lib=1: cuBLASLt's call computes the product */
} gemm_res;

typedef struct gctx {
	const ap_mgraph *m;
	const ap_graph *g;
	const gemm_plan *p;
	const gemm_res *r;              /* the configuration's plan (gm_resolve) */
	gemm_cfg c;                     /* r->c */
	const ap_target_info *t;
	ap_vctx *v;
	ap_kir_kernel *k;
	unsigned nt;
	bool a_rowk, b_rowk;            /* shared tiles with K contiguous */
	bool a_async, b_async;          /* loaded by cp.async */
	stage_mode a_mode, b_mode;      /* ap__gemm_copy_mode; pair- or compute-staged: a single tile
					   stage, filled from pa / pb by ap__gemm_extract_tile */
	ap_kir_array *pa, *pb;          /* per stage: two elements a tile element (pairs), or
					   one float32 element (convert) */
	ap_kir_array *qa, *qb;          /* pair-staged: per stage, the element's place in its pair */
	int hook_leaf;                  /* compute-staged, while a tile element is computed: the
					   source buffer, whose element is hook_val */
	ap_kir_expr *hook_val;
	ap_kir_array *red;              /* split-K: the block's partial accumulators, for the cluster */
	int a_w, b_w;                   /* elements per cp.async */
	int lda, ldb;                   /* shared row lengths (elements) */
	int64_t a_stage, b_stage;       /* elements per stage */
	ap_kir_array *sa, *sb;
	ap_kir_expr *bcoord[AP_MAX_RANK]; /* Y's batch coordinates of the tile */
	ap_kir_expr *tb_index;          /* the tile's linear batch (not folded) */
	ap_kir_expr *m0, *n0;           /* the tile's first row and column */
	ap_kir_expr *tile;              /* the tile's index (open_tile) */
	ap_kir_expr *tid;
	/* register-staged loads: per operand, the registers of one tile */
	int a_regs, b_regs;
	ap_kir_var **a_reg, **b_reg;
	/* the accumulator the epilogue hands out as Y */
	ap_kir_array *acc;
	ap_kir_expr *acc_index;
	/* split-K: this block's rank in its cluster, its first K tile */
	ap_kir_expr *rank, *kofs;
	bool kpred;                     /* loads check k < K (a K tile may pass the end) */
	/* the launch (set_launch): output tiles, tiles_m x tiles_n per tile
	 * batch, walked by `grid` blocks (clusters with split-K); K tiles per
	 * block */
	int tiles_m, tiles_n, ktl;
	int64_t tiles;
	unsigned grid;
	/* the thread's place (declare_threads): SIMT (ty, tx); tensor cores
	 * its lane and its warp's first row and column of the tile */
	ap_kir_expr *ty, *tx, *lane, *wm0, *wn0;
	ap_kir_expr *wg0;               /* wgmma: the warpgroup's first row (wm0 is its warp's) */
	bool wg_overlap;                /* wgmma: a K tile's products stay in flight while the
					   next is issued (wait_group 1; copies run S - 2 tiles
					   ahead: mainloop_pipelined) */
	ap_kir_array *fa, *fb;          /* operand fragments / values of one k (registers) */
	/* ap__gemm_hoist_copies: per operand, its copies' source element and tile
	 * place for copy 0 of K tile 0, bound before the K loop (NULL: not
	 * hoisted), and what each further copy of a thread adds */
	ap_kir_expr *cp_src[2], *cp_dst[2];
	int64_t cp_dsrc[2], cp_ddst[2];
	/* tma=1 (gemm_tma.c): the ring's mbarriers, one a stage; the stage the
	 * next fill goes to, the stage and parity the next K tile is read
	 * from (carried across the block's tiles) */
	ap_kir_array *full;
	ap_kir_var *pst, *cst, *cph;
	/* tma=2 (warp specialised): the stages' release barriers, and the
	 * stage a consumer warpgroup releases next (its wgmma in flight) */
	ap_kir_array *empty;
	ap_kir_var *rst;
} gctx;

/* An index constant of the kernel's index type. */
static inline ap_kir_expr *I(gctx *c, int64_t v)
{
	return ap_kir_idx(c->k, v);
}

/* gemm.c: analysis and configuration */
bool ap__gemm_tma_operands(const gemm_plan *p);
bool ap__gemm_tma_fits(const gemm_plan *p, const gemm_cfg *c);
void ap__gemm_tma_box(const gemm_plan *p, const gemm_cfg *c, int role, int *ja, int *rows, int *nbox);
void ap__gemm_plan_clear(gemm_plan *p);
int ap__gemm_analyze(const ap_mgraph *m, const ap_target_info *t, gemm_plan *p, char *why,
		     size_t cap);
gemm_cfg ap__gemm_cfg_of(const ap_sched *s);
int ap__gemm_pad_of(const gemm_plan *p);
ap_kir_wgmma_kind ap__gemm_wgmma_kind(const gemm_plan *p);
void ap__gemm_tile_layouts(const gemm_plan *p, bool *a_rowk, bool *b_rowk);
int ap__gemm_copy_mode(const gemm_plan *p, int role, const gemm_cfg *c, const ap_target_info *t,
		       stage_mode *mode);
int ap__gemm_wg_swizzle(const gemm_plan *p, const gemm_cfg *c, int role);
size_t ap__gemm_smem_bytes(const gemm_plan *p, const gemm_cfg *c, const ap_target_info *t);
unsigned ap__gemm_threads_of(const gemm_plan *p, const gemm_cfg *c);
bool ap__gemm_cfg_valid(const gemm_plan *p, const gemm_cfg *c, const ap_target_info *t);
int ap__gemm_attach_library(const ap_bound *b, const ap_sched *s, ap_kir_kernel *k);

/* gemm_stage.c: operand indexing and staging */
ap_kir_expr *ap__gemm_row_split(gctx *c, ap_kir_expr *row, ap_kir_expr **bc);
void ap__gemm_split_linear(gctx *c, ap_kir_expr *lin, const int64_t *dims, int n,
			   ap_kir_expr **out);
ap_kir_expr *ap__gemm_smem_lin(gctx *c, int role, ap_kir_expr *o, ap_kir_expr *kk);
ap_kir_expr *ap__gemm_smem_index(gctx *c, int role, ap_kir_expr *st, ap_kir_expr *o,
				  ap_kir_expr *kk);
void ap__gemm_issue_async(gctx *c, int role, ap_kir_expr *st, ap_kir_expr *kt);
void ap__gemm_hoist_copies(gctx *c);
void ap__gemm_extract_tile(gctx *c, ap_kir_expr *st, ap_kir_expr *ktile);
int ap__gemm_reg_count(gctx *c, int role);
void ap__gemm_declare_regs(gctx *c);
void ap__gemm_issue_tile(gctx *c, ap_kir_expr *st, ap_kir_expr *kt);
void ap__gemm_complete_tile(gctx *c, ap_kir_expr *st);

/* gemm_tma.c: the TMA main loop (tma=1) */
int ap__gemm_tma_setup(gctx *c);
void ap__gemm_tma_prefetch(gctx *c, ap_kir_expr *tile);
void ap__gemm_mainloop_tma(gctx *c, ap_kir_expr *tile);
/* gemm_tma.c: the warp-specialised forms (tma=2: TMA, tma=3: a copying producer) */
bool ap__gemm_ws_copies_fit(const gemm_plan *p, const gemm_cfg *c, const ap_target_info *t);
int ap__gemm_ws_setup(gctx *c, ap_kir_block **consumer);
void ap__gemm_mainloop_ws(gctx *c);

/* gemm_kernel.c: the kernel (the emitter's `emit`) */
void ap__gemm_compute_tile(gctx *c, ap_kir_expr *st);
void ap__gemm_tile_origin(gctx *c, ap_kir_block *b, ap_kir_expr *rest, const char *mname,
			  const char *nname, ap_kir_expr **m0, ap_kir_expr **n0);
/* Y's batch coordinates bc[0 .. nb) of linear batch bi (row-major over
 * Y's batch dims; not folded), each bound in b as `name` (a dim of extent
 * 1: the constant 0). */
void ap__gemm_batch_coords(gctx *c, ap_kir_block *b, ap_kir_expr *bi, const char *name, ap_kir_expr **bc);
/* gemm_stage.c: the coordinate of factor q of f for coordinate x of its
 * dim: (x / inner) % e[q], inner the product of the factors inside q (the
 * outermost, q = 0, without the remainder). */
ap_kir_expr *ap__gemm_factor_coord(gctx *c, ap_kir_expr *x, const bdim *f, int q);
int ap__gemm_emit(const ap_bound *b, const ap_plan *pl, ap_kir_kernel *k, ap_error *err);

#endif
