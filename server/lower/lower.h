/* lower.h -- the schedule layer: one micro-graph to one kernel of the
 * kernel IR, through emitters.
 *
 * An emitter is one kernel shape (XLA's fusion emitters, TVM's schedule
 * templates): pointwise loops, row and column reductions with warp
 * shuffles, stitched reductions (Layer II), shared-memory transposes.
 * Each one has
 *   - match:   whether it can build a kernel for a micro-graph;
 *   - space:   its parameter space, the knobs a tuner searches (block
 *              size, elements per thread, vector width, rows per block...),
 *              each with its allowed values for this micro-graph;
 *   - choose:  the default configuration, by a rule from the shapes and
 *              the target (what runs when nothing was tuned);
 *   - emit:    the kernel for one configuration;
 *   - traffic: what that configuration moves and computes, for the cost
 *              model (server/cost/cost.h);
 *   - valid:   which points of the space can be built (the space is a
 *              cross product; a tile may not fit the target).
 * Every emitter builds values with the shared value builder (value.h), so
 * the per-op scalar semantics and index maps are the same everywhere.
 * The registry is ordered: the first emitter whose match accepts a
 * micro-graph is its emitter; the last one (pointwise) accepts every
 * micro-graph.
 */
#ifndef AP_LOWER_H
#define AP_LOWER_H

#include "../cost/cost.h"
#include "../kir/kir.h"
#include "../partition/mgraph.h"

#define AP_SPACE_MAX_KNOBS 8
#define AP_KNOB_MAX_VALUES 12

typedef struct ap_knob {
	const char *name;                 /* "block", "vector", "rows", ... (static) */
	int n;                            /* allowed values, >= 1 */
	int values[AP_KNOB_MAX_VALUES];
} ap_knob;

/* An emitter's parameter space for one micro-graph: the cross product of
 * its knobs' values. */
typedef struct ap_space {
	int n;
	ap_knob knobs[AP_SPACE_MAX_KNOBS];
} ap_space;

struct ap_emitter;

/* One configuration: a value for every knob of the emitter's space, in
 * the space's order. */
typedef struct ap_sched {
	const struct ap_emitter *em;
	int n;
	int v[AP_SPACE_MAX_KNOBS];
} ap_sched;

typedef struct ap_emitter {
	const char *name;     /* "pointwise", "row_reduce", ... (static) */
	/* 1 when it builds a kernel for m, 0 when not, AP_ENOMEM (every
	 * function below also gives AP_ENOMEM when its analysis could not
	 * allocate: an allocation failure never reads as "no") */
	int (*match)(const ap_mgraph *m, const ap_target_info *t);
	/* 0 or AP_ENOMEM */
	int (*space)(const ap_mgraph *m, const ap_target_info *t, ap_space *out);
	/* Fills s->v (s->em and s->n are set by the caller).  0 or AP_ENOMEM. */
	int (*choose)(const ap_mgraph *m, const ap_target_info *t, const ap_space *sp, ap_sched *s);
	/* Builds the body, launch shape and parameters of `k` (a fresh kernel
	 * with its name set).  0, or AP_EUNSUPPORTED (an op or dtype it cannot
	 * handle, naming the node) / AP_ENOMEM with `err` set. */
	int (*emit)(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t, ap_kir_kernel *k,
		    ap_error *err);
	/* 0 or AP_ENOMEM */
	int (*traffic)(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t,
		       ap_traffic *out);
	/* Whether configuration s can be built for m on t (threads, shared
	 * memory, tile divisibility): 1, 0 or AP_ENOMEM; NULL: every point of
	 * the space can. */
	int (*valid)(const ap_mgraph *m, const ap_sched *s, const ap_target_info *t);
	/* The cost model cannot rank its configurations on the host (the C
	 * compiler's vectorisation of a register tile decides, and the
	 * model's guesses ran slower than the default rule there): the
	 * tuner's search keeps the default rule for the host target, where
	 * only a measured record changes it. */
	bool host_rule_only;
	/* Evaluations per element of the most recomputed tensor its kernel
	 * for m computes (1: each once; ap_launch_part.recompute), as this
	 * emitter evaluates them; 0 on ENOMEM.  NULL: the inline model
	 * (ap_lower_recompute). */
	double (*recompute)(const ap_mgraph *m);
} ap_emitter;

/* The registry, in match order; *n gets its length. */
const ap_emitter *const *ap_emitters(int *n);
/* The first emitter of the registry that matches m, in *out (pointwise
 * matches every micro-graph).  0, or AP_ENOMEM with `err` set. */
int ap_emitter_for(const ap_mgraph *m, const ap_target_info *t, const ap_emitter **out,
		   ap_error *err);
/* The space of `em` for m, and its default configuration in *s.  0, or
 * AP_ENOMEM with `err` set. */
int ap_emitter_default(const ap_emitter *em, const ap_mgraph *m, const ap_target_info *t,
		       ap_space *sp, ap_sched *s, ap_error *err);
/* "knob=value knob=value ..." for configuration s of em on m (a malloc'd
 * string), or NULL on ENOMEM. */
__ap_give char *ap_sched_describe(const ap_emitter *em, const ap_mgraph *m, const ap_target_info *t,
				  const ap_sched *s);
/* Parses "knob=value knob=value ..." (ap_sched_describe's text: every knob
 * of em's space for m on t once, in any order, each value one of the
 * knob's allowed values) into *s, then asks em->valid.  1 with *s set, 0
 * when the text is not a buildable configuration (unknown or repeated
 * knob, a value outside the space, a knob missing, a point the emitter
 * refuses), AP_ENOMEM.  Text from a client or a record is untrusted: this
 * is its check. */
int ap_sched_parse(const ap_emitter *em, const ap_mgraph *m, const ap_target_info *t,
		   const char *text, ap_sched *s);
/* Value of knob `name` in s, or `dflt` when the space has no such knob. */
int ap_sched_get(const ap_sched *s, const ap_space *sp, const char *name, int dflt);

/* Can the stitched-reduction emitter build one kernel for m on target t,
 * holding each row on chip?  1 yes, 0 no, AP_ENOMEM.  (Layer II asks before it stitches; *why, of
 * `cap` bytes, gets the reason when not: reductions over different rows,
 * an op after a reduction it cannot place, a row that fits neither in
 * registers nor in shared memory.) */
int ap_lower_stitchable(const ap_mgraph *m, const ap_target_info *t, char *why, size_t cap);

/* Can the attention emitter build m (the union of a QK^T product, the
 * softmax over its last axis and the product of the probabilities with V,
 * server/lower/attention.c) as one kernel on t?  1 yes, 0 no (*why says
 * why), AP_ENOMEM. */
int ap_lower_attention_ok(const ap_mgraph *m, const ap_target_info *t, char *why, size_t cap);

/* Modelled evaluations per element of the most recomputed tensor that a
 * kernel built by inlining (producers evaluated in their consumers' index
 * expressions) computes without writing it, among those at least as large
 * as its largest output (smaller ones are broadcast operands): the cost
 * model's evaluation counts (ap_cost_evals) over m, E(t) / elements(t); 1
 * when nothing is recomputed (or there is no such tensor), 0 on ENOMEM. */
double ap_lower_recompute(__ap_keep const ap_mgraph *m);

typedef struct ap_lower_options {
	unsigned max_block_threads;  /* 0 = 256; a power of two in [32, 1024] */
	const ap_sched *sched;       /* a configuration to use (its emitter must
					match); NULL = the default rule */
	bool verify;                 /* run ap_kir_verify on the result */
} ap_lower_options;

/* Lowers micro-graph m to a kernel named `name` (a C identifier) for
 * target t: its emitter (ap_emitter_for, or opt->sched's), the default
 * configuration unless opt->sched gives one (written to *used when not
 * NULL), the emitter's kernel, and a header of comments listing the fused
 * ops and what each parameter holds (no graph names, so that the same
 * kernel in two graphs prints the same).  Every GLOBAL array of the
 * result carries in ->tensor the tensor of m->g it is bound to: the
 * outputs first (written, in m->g->outputs order), then each tensor it
 * reads, in order of first use; CONST tensors are baked in.  Returns NULL
 * with `err` set: AP_EUNSUPPORTED (an op or dtype this lowering cannot
 * handle, naming the node), AP_ENOMEM, AP_EINTERNAL (the verifier
 * rejected the kernel: a bug, the message says which rule). */
__ap_give ap_kir_kernel *ap_lower(__ap_keep const ap_mgraph *m, const ap_target_info *t,
				  const char *name, const ap_lower_options *opt, ap_sched *used,
				  ap_error *err);

#endif
