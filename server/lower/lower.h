/* lower.h -- the schedule layer: one micro-graph to one kernel of the
 * kernel IR, through emitters.
 *
 * An emitter is one kernel shape (XLA's fusion emitters, TVM's schedule
 * templates): pointwise loops, row and column reductions with warp
 * shuffles, stitched reductions (Layer II), shared-memory transposes.
 * Each one has
 *   - bind:    its analysis of one micro-graph on one target, made once
 *              (operands, layouts, which fragments, what it cannot build);
 *              declining is "it does not build this micro-graph"
 *              (ap_bind; the registry's order picks the first that binds);
 *   - space:   its parameter space, the knobs a tuner searches (block
 *              size, elements per thread, vector width, rows per block...),
 *              each with its allowed values for this micro-graph;
 *   - choose:  the default configuration, by a rule from the shapes and
 *              the target (what runs when nothing was tuned);
 *   - emit:    the kernel for one configuration;
 *   - traffic: what that configuration moves and computes, for the cost
 *              model (server/cost/cost.h);
 *   - resolve: a configuration's plan (ap_plan), and whether it can be
 *              built (the space is a cross product; a tile may not fit
 *              the target).
 * Every callback after bind reads the one analysis of the bound
 * micro-graph (ap_bound; XLA's fusion emitters analyse a fusion once the
 * same way), and a configuration is resolved once into a plan (ap_plan:
 * the tile, each operand's staging, the launch) that decides whether it
 * is valid and that traffic and emit both read: what the cost model is
 * told is what the kernel is built from (check_traffic compares the two
 * for every emitter).
 * Every emitter builds values with the shared value builder (value.h), so
 * the per-op scalar semantics and index maps are the same everywhere.
 * The registry is ordered: the first emitter that binds a
 * micro-graph is its emitter; the last one (pointwise) accepts every
 * micro-graph.
 */
#ifndef AP_LOWER_H
#define AP_LOWER_H

#include <stddef.h>

#include "../cost/cost.h"
#include "../kir/kir.h"
#include "../partition/mgraph.h"

#define AP_SPACE_MAX_KNOBS 9
#define AP_KNOB_MAX_VALUES 12

typedef struct ap_knob {
	const char *name;                 /* "block", "vector", "rows", ... (static) */
	int n;                            /* allowed values, >= 1 */
	int values[AP_KNOB_MAX_VALUES];
	bool late;                        /* added to the space after tuning records were
					     written (the GEMM's lib and tma, attention's
					     overlap): a record without it means values[0],
					     which such a knob lists first as the form the
					     kernels had before it (ap_sched_parse) */
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

/* A micro-graph bound to an emitter on a target: the emitter's analysis
 * of it, made once by ap_bind and read by every later callback.  m and t
 * are kept, not owned: they must outlive the binding; `an` is owned by
 * the binding (ap_unbind frees it). */
typedef struct ap_bound {
	const struct ap_emitter *em;
	const ap_mgraph *m;
	const ap_target_info *t;
	void *an;             /* the emitter's analysis (NULL: it keeps none) */
} ap_bound;

/* A configuration resolved against a binding: the emitter's decisions
 * for it (tile, staging of each operand, launch, shared memory), made
 * once by its `resolve` and read by `traffic` and `emit`, so that the cost
 * model is told what the kernel is built from.  Plain data, copyable. */
#define AP_PLAN_BYTES 256
typedef struct ap_plan {
	ap_sched s;                                  /* the configuration */
	_Alignas(max_align_t) unsigned char x[AP_PLAN_BYTES];   /* the emitter's decisions */
} ap_plan;

typedef struct ap_emitter {
	const char *name;     /* "pointwise", "row_reduce", ... (static) */
	/* Analyses m on t: 1 when it builds a kernel for m, with *an its
	 * analysis (malloc'd, or NULL when it keeps none), 0 when not (*an
	 * NULL; why, cap bytes, never NULL, says why where the emitter can
	 * tell, else stays empty), AP_ENOMEM (an allocation failure never
	 * reads as "no").  Every function below gets the binding of a 1, and
	 * also gives AP_ENOMEM where it allocates. */
	int (*bind)(const ap_mgraph *m, const ap_target_info *t, void **an, char *why, size_t cap);
	/* Frees an analysis bind made (not NULL); NULL: free(). */
	void (*unbind)(void *an);
	/* 0 or AP_ENOMEM */
	int (*space)(const ap_bound *b, ap_space *out);
	/* Fills s->v (s->em and s->n are set by the caller).  0 or AP_ENOMEM. */
	int (*choose)(const ap_bound *b, const ap_space *sp, ap_sched *s);
	/* Builds the body, launch shape and parameters of `k` (a fresh kernel
	 * with its name set) from plan p.  0, or AP_EUNSUPPORTED (an op or
	 * dtype it cannot handle, naming the node; a plan that does not fit
	 * the target) / AP_ENOMEM with `err` set. */
	int (*emit)(const ap_bound *b, const ap_plan *p, ap_kir_kernel *k, ap_error *err);
	/* What plan p's kernel moves and computes.  0 or AP_ENOMEM. */
	int (*traffic)(const ap_bound *b, const ap_plan *p, ap_traffic *out);
	/* Resolves configuration s into *out (out->s = *s, out->x the
	 * emitter's decisions, filled whether or not s fits): 1 when s can be
	 * built for m on t (threads, shared memory, tile divisibility), 0
	 * when not, AP_ENOMEM.  NULL: every point of the space can, and the
	 * configuration is the whole plan. */
	int (*resolve)(const ap_bound *b, const ap_sched *s, ap_plan *out);
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
	double (*recompute)(const ap_bound *b);
} ap_emitter;

/* Binds m on t to em (em->bind): 1 with *b filled (release it with
 * ap_unbind), 0 when em does not build m (*b holds no analysis;
 * ap_unbind is harmless; why, when not NULL, gets the emitter's reason,
 * or that em does not build the micro-graph, in cap bytes), AP_ENOMEM.
 * m and t must outlive *b. */
int ap_bind(const ap_emitter *em, __ap_keep const ap_mgraph *m, __ap_keep const ap_target_info *t,
	    ap_bound *b, char *why, size_t cap);
/* Frees b's analysis (b may be zeroed or unbound: nothing to free). */
void ap_unbind(ap_bound *b);
/* Resolves configuration s of b's emitter (em->resolve; see there) into
 * *p: 1 buildable, 0 not (p still holds its decisions), AP_ENOMEM. */
int ap_resolve(const ap_bound *b, const ap_sched *s, ap_plan *p);
/* Whether s can be built: ap_resolve's answer, the plan dropped. */
int ap_sched_valid(const ap_bound *b, const ap_sched *s);
/* The traffic of configuration s (ap_resolve, then em->traffic on the
 * plan, whether or not s fits: the tuner prices what it then refuses).
 * 0 or AP_ENOMEM. */
int ap_traffic_of(const ap_bound *b, const ap_sched *s, ap_traffic *out);

/* The registry, in binding order; *n gets its length. */
const ap_emitter *const *ap_emitters(int *n);
/* Binds m on t to the first emitter of the registry that builds it
 * (pointwise builds every micro-graph): 0 with *b filled (ap_unbind
 * releases it), or AP_ENOMEM with `err` set. */
int ap_bind_first(__ap_keep const ap_mgraph *m, __ap_keep const ap_target_info *t, ap_bound *b,
		  ap_error *err);
/* The space of b's emitter for its micro-graph, and its default
 * configuration in *s.  0, or AP_ENOMEM with `err` set. */
int ap_emitter_default(const ap_bound *b, ap_space *sp, ap_sched *s, ap_error *err);
/* "knob=value knob=value ..." for configuration s of b's emitter (a
 * malloc'd string), or NULL on ENOMEM. */
__ap_give char *ap_sched_describe(const ap_bound *b, const ap_sched *s);
/* Parses "knob=value knob=value ..." (ap_sched_describe's text: every knob
 * of the bound emitter's space once, in any order, each value one of the
 * knob's allowed values) into *s, then asks em->valid.  A knob marked
 * `late` may be missing -- a record written before the knob existed --
 * and then takes its first value (the form before it), so a measured
 * record survives the space gaining a knob.  1 with *s set, 0 when the
 * text is not a buildable configuration (unknown or repeated knob, a
 * value outside the space, a knob other than a late one missing, a point
 * the emitter refuses), AP_ENOMEM.  Text from a client or a record is
 * untrusted: this is its check. */
int ap_sched_parse(const ap_bound *b, const char *text, ap_sched *s);
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
	const ap_sched *sched;       /* a configuration to use (of the bound
					emitter); NULL = the default rule */
	bool verify;                 /* run ap_kir_verify on the result */
} ap_lower_options;

/* Lowers the micro-graph b binds to a kernel named `name` (a C
 * identifier) for b's target: the default configuration of b's emitter
 * unless opt->sched gives one (of b's emitter; written to *used when not
 * NULL), the emitter's kernel, and a header of comments listing the fused
 * ops and what each parameter holds (no graph names, so that the same
 * kernel in two graphs prints the same).  Every GLOBAL array of the
 * result carries in ->tensor the tensor of m->g it is bound to: the
 * outputs first (written, in m->g->outputs order), then each tensor it
 * reads, in order of first use; CONST tensors are baked in.  Returns NULL
 * with `err` set: AP_EUNSUPPORTED (an op or dtype this lowering cannot
 * handle, naming the node), AP_ENOMEM, AP_EINTERNAL (the verifier
 * rejected the kernel: a bug, the message says which rule; opt->sched of
 * another emitter than b's). */
__ap_give ap_kir_kernel *ap_lower(const ap_bound *b, const char *name, const ap_lower_options *opt,
				  ap_sched *used, ap_error *err);
/* ap_lower of m on t through a binding made for the call and released
 * before it returns: opt->sched's emitter when it names one, else the
 * registry's first (ap_bind_first).  For one kernel of a micro-graph (a
 * test, a tool); a caller lowering several configurations binds once.
 * NULL with `err`: ap_lower's errors, and AP_EUNSUPPORTED when
 * opt->sched's emitter does not build m. */
__ap_give ap_kir_kernel *ap_lower_mgraph(__ap_keep const ap_mgraph *m, const ap_target_info *t,
					 const char *name, const ap_lower_options *opt, ap_sched *used,
					 ap_error *err);

#endif
