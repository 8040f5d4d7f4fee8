/* emitters.h -- the emitters of the registry (emitter.c) and what they
 * share: launch-shape helpers.  Internal to server/lower/.
 */
#ifndef AP_LOWER_EMITTERS_H
#define AP_LOWER_EMITTERS_H

#include "lower.h"
#include "value.h"

/* Largest grid.x an emitter uses; larger iteration spaces are covered by
 * grid-stride loops. */
#define AP_MAX_GRID 65535u

extern const ap_emitter ap_emitter_stitched;       /* rows.c: Layer II */
extern const ap_emitter ap_emitter_row_reduce;     /* rows.c */
extern const ap_emitter ap_emitter_column_reduce;  /* rows.c */
extern const ap_emitter ap_emitter_transpose;      /* transpose.c */
extern const ap_emitter ap_emitter_movement;       /* movement.c */
extern const ap_emitter ap_emitter_attention;      /* attention.c: QK^T, softmax, PV */
extern const ap_emitter ap_emitter_attention_grad; /* attention_grad.c: AttentionGrad */
extern const ap_emitter ap_emitter_gemm;           /* gemm.c: MatMul on tiles */
extern const ap_emitter ap_emitter_depthwise;      /* depthwise.c: convolutions of < 8 channels per group */
extern const ap_emitter ap_emitter_pointwise;      /* pointwise.c */

/* Smallest power of two >= n within [lo, hi]. */
unsigned ap_pow2_at_least(int64_t n, unsigned lo, unsigned hi);
/* Fills a knob with the powers of two in [lo, hi]. */
void ap_knob_pow2(ap_knob *kb, const char *name, unsigned lo, unsigned hi);
/* The threads-per-block cap of a target for the default rules (the
 * request's max_block_threads when smaller). */
unsigned ap_block_cap(const ap_target_info *t);
/* Grid size covering `work` items with `per_block` items per block,
 * clamped to [1, AP_MAX_GRID]. */
unsigned ap_grid_for(int64_t work, int64_t per_block);

/* Traffic of a micro-graph whose producers are inlined (pointwise.c):
 * bytes of every input and output once, arithmetic from the cost model's
 * evaluation counts.  Adds to *out.  0 or AP_ENOMEM. */
int ap__lower_inline_traffic(const ap_mgraph *m, ap_traffic *out);
/* Arithmetic of node n of g evaluated `evals` times: its inputs' reads per
 * element (a reduction's reduced count, K for a product), averaged over
 * its inputs, twice for a product's multiply-adds; 0 for a view. */
double ap__lower_node_flops(const ap_graph *g, const ap_node *n, double evals);

/* ---- epilogues of products (epilogue.c) ------------------------------------- */

#define AP_EMAP_STEPS 12

/* One view, transpose, split part or concatenation on the way from a
 * product Y to an output. */
typedef struct ap_emap_step {
	unsigned char perm;             /* AP_EMAP_VIEW, AP_EMAP_TRANSPOSE, AP_EMAP_PART,
					   AP_EMAP_CONCAT */
	int rank;
	int64_t dims[AP_MAX_RANK];      /* the resulting tensor's */
	int p[AP_MAX_RANK];             /* transpose: output dim d = input dim p[d] */
	int axis;                       /* part, concat: the split / concatenation axis */
	int64_t start;                  /* part: where the part starts along it */
	int node;                       /* concat: the Concat node (of the micro-graph) */
} ap_emap_step;

#define AP_EMAP_VIEW 0              /* a relinearisation (Reshape, ...) */
#define AP_EMAP_TRANSPOSE 1         /* a permutation of the coordinates */
#define AP_EMAP_PART 2              /* one output of a Split: the elements of [start,
				       start + dims[axis]) along axis, shifted to 0 (the
				       others go to the other parts) */
#define AP_EMAP_CONCAT 3            /* a Concat of the derived tensor and inputs of its
				       shape that do not depend on Y (the other branch of
				       a SqueezeNet fire module): Y's element stores each
				       input's element at that index to its place in the
				       output; the last step, the output read by nothing
				       of the micro-graph */

/* How a tensor computed from Y is indexed by Y's element. */
typedef struct ap_emap {
	bool derived;                   /* computed from Y, element for element, or
					   beside it (an output of Y's shape that does not
					   depend on Y: n = 0) */
	int n;
	ap_emap_step s[AP_EMAP_STEPS];
} ap_emap;

/* Fills maps[] (one per tensor of g, zeroed by the caller) for the tensors
 * computed from tensor y of g.  False with *why when a tensor depends on y
 * otherwise than element for element (a broadcast of it, an op that is not
 * elementwise, a view, a transpose, a Split or a Concat of the form
 * AP_EMAP_CONCAT describes, two different elements of y in one node), or,
 * with all_outputs, when an output of g is neither
 * computed from y so nor of y's shape and independent of y (such an
 * output is stored beside Y's element, at the same index). */
int ap__epilogue_maps(const ap_graph *g, int y, ap_emap *maps, bool all_outputs, char *why,
		       size_t cap);
/* Stores every output of v->g that maps[] derives from y, for the element
 * of y at y_ix (the caller's leaf hook gives y's value there): each at the
 * index its views and transposes lead to, its value built by v. */
void ap__epilogue_store(ap_vctx *v, const ap_emap *maps, ap_lidx y_ix);

/* ---- convolution operands (conv.c) ------------------------------------------------ */

typedef struct ap_conv_ops {
	int x, w, bias, y;              /* tensors: input, weights, bias (-1: none), output */
	int ns;                         /* spatial dims */
	ap_dtype in_t, acc_t;           /* operand type; float32 (float64 for float64) */
	int64_t C, M, groups, Cg, Mg;   /* channels in and out, groups, per group */
} ap_conv_ops;

/* The operands of convolution node `node` of g (x [N, C, spatial...], w,
 * optional bias, y [N, M, spatial...]) and the checks both convolution
 * emitters make: all present, one rank with 1 to max_ns spatial dims, one
 * float type (float32, float64, float16, bfloat16), the group count
 * dividing C and M.  1 with *c filled, 0 with *why (ONNX Conv's
 * definition). */
int ap__conv_ops(const ap_graph *g, int node, int max_ns, ap_conv_ops *c, char *why, size_t cap);
/* ---- operands as strided views of buffers (view.c) ---------------------------- */

/* A mixed-radix strided view of a buffer: each dim d is a run of factors
 * (extent, stride), outer to inner, factors [first[d], first[d + 1]); a
 * coordinate c of it is at sum_i ((c / inner_i) % extent_i) * stride_i,
 * inner_i the product of the extents after factor i.  Every chain of
 * reshapes and transposes of a buffer is such a view (a reshape regroups
 * the factors, splitting one where a new dim ends inside it); slices and
 * splits of a dim of one factor are too (an offset and a scaled stride).
 * A dim of size 1 has no factor. */
#define AP_SV_FACTORS 16

typedef struct ap_sview {
	int rank, nf;
	int first[AP_MAX_RANK + 1];
	int64_t fe[AP_SV_FACTORS], fs[AP_SV_FACTORS];
	int64_t off;                    /* element of index 0 */
} ap_sview;

/* Tensor t of g as a strided view of a buffer, when it is one: views,
 * transposes, slices and splits back to a leaf of the micro-graph (not a
 * constant small enough to be baked into the kernel).  *out gets the view
 * (of t's rank), *leaf the buffer's tensor.  False when t is computed, or
 * its chain is no strided view (or longer than 32 ops). */
bool ap_sview_of(const ap_graph *g, int t, ap_sview *out, int *leaf);
/* Tensor t of g as unary elementwise ops of a strided view of a buffer,
 * in any order with the views (Cast(view(x)), view(x) / 8: an elementwise
 * op whose other inputs are constants baked into the kernel is element for
 * element, so it commutes with the views): as ap_sview_of, *leaf the
 * buffer (of its own type), *casts_only whether every such op is a Cast.
 * False when t is not of that form, or has no such op (ap_sview_of's
 * case). */
bool ap_sview_of_unary(const ap_graph *g, int t, ap_sview *out, int *leaf, bool *casts_only);
/* A thread's place in the mma.sync fragment layouts (kir.h): its warp
 * (tid / 32) and lane (tid % 32), bound in block b; the m16n8 C layout's
 * g = lane / 4 and tq = lane % 4 (bound); ldmatrix's addressing parts
 * lane % 8, lane % 16, lane / 16 and (lane / 8) % 2 (expressions).  The
 * attention emitters' tensor-core forms share it (attention.c). */
typedef struct ap_mma_lanes {
	ap_kir_expr *warp, *lane, *g, *tq, *l8, *l16, *hi, *j2;
} ap_mma_lanes;
void ap__mma_lanes(ap_kir_kernel *k, ap_kir_block *b, ap_mma_lanes *l);
/* wgmma's shared tiles (sm_90a): element (r, j) of a tile of `cols`
 * columns of es-byte elements in the canonical core-matrix layout without
 * swizzling (kir.h, ap_kir_wg_layout) -- 8 rows of E = 16 / es elements
 * (16 bytes) a core matrix, the cols / E core matrices of 8 rows side by
 * side.  Read as K-major (rows along M or N, columns along K: LBO 128
 * bytes, SBO 8 cols elements) or as MN-major (rows along K, columns along
 * M or N: SBO 128 bytes, LBO 8 cols elements).  An element offset
 * (attention.c, gemm_stage.c). */
ap_kir_expr *ap__wg_place(ap_kir_kernel *k, ap_kir_expr *r, ap_kir_expr *j, int64_t cols, int es);
/* The same in a swizzled layout (kir.h, ap_kir_wg_layout): element (r, j)
 * of a tile of `rows` rows (a multiple of 8) of es-byte elements, in
 * atoms of 8 rows of ja columns (W = ja es bytes: 32, 64 or 128) -- the
 * 16-byte chunk c of row r stored at chunk c ^ ((r % 8) W / 128) of the
 * atom's row -- atoms of 8 rows 8 W bytes apart (SBO), the rows / 8 atoms
 * of the next ja columns rows W bytes on (K-major: the start address
 * reaches them; MN-major: LBO).  A shift of r by a multiple of 8 and of
 * j by a multiple of ja moves the place linearly; within an atom it is
 * not linear.  An element offset (attention_kernel.c). */
ap_kir_expr *ap__wg_swizzled_place(ap_kir_kernel *k, ap_kir_expr *r, ap_kir_expr *j, int64_t rows, int64_t ja,
				   int es);
/* Elements per cp.async (16, 8 or 4 bytes: 8, 4 or 2 16-bit elements, 4,
 * 2 or 1 float32 ones) when rows of x are copied along its last dim
 * (with `trans`, its second last) into shared memory: x must be a
 * strided view of a buffer (*sv, *leaf; not a constant, of x's type)
 * whose copied dim is one factor of stride 1, every other stride and the
 * view's offset multiples of the width, so that each copy is aligned
 * (buffers are at least 16-byte aligned).  0 when not (copy through
 * registers).  Used by the attention emitters' staging. */
int ap_sview_copy_width(const ap_graph *g, int x, bool trans, ap_sview *sv, int *leaf);
/* Regroups v as `rank` x `dims` (a reshape): adjacent contiguous factors
 * merge, then each new dim takes factors from the outside, splitting one
 * whose extent the remainder divides.  False (v unchanged) when it cannot:
 * a reshape that is no view, or more than AP_SV_FACTORS factors. */
bool ap_sview_reshape(ap_sview *v, int rank, const int64_t *dims);
/* The stride (elements) of dim d when it has at most one factor (0 for
 * none); false for a composite dim. */
bool ap_sview_stride(const ap_sview *v, int d, int64_t *s);
/* The coordinate of factor q (of dim d) of view sv for index x along d:
 * (x / inner) % fe[q], inner the product of the dim's factors inside q,
 * the dim's outermost factor without the remainder (an index past the
 * dim stays past it).  An expression of k. */
ap_kir_expr *ap_sview_factor_coord(ap_kir_kernel *k, const ap_sview *sv, int d, int q, ap_kir_expr *x);
/* Offset (elements) in the leaf buffer of element ix of view sv: per dim,
 * its factors' coordinates (outermost without a remainder) times their
 * strides, plus sv->off.  Expressions of k. */
ap_kir_expr *ap_sview_offset(ap_kir_kernel *k, const ap_sview *sv, const ap_lidx *ix);

#endif
