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
extern const ap_emitter ap_emitter_gemm;           /* gemm.c: MatMul on tiles */
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

#endif
