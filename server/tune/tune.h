/* tune.h -- the tuner: a search over an emitter's parameter space under
 * the cost model, for one micro-graph (APOLLO section 5: every fused
 * kernel is tuned by a search guided by a cost model, made affordable by
 * compiling micro-graphs apart).
 *
 * The space is the emitter's cross product of knob values (lower.h:
 * tiles, stages, block size, vector width, rows or elements per thread);
 * a point is a candidate when the emitter's `valid` accepts it.  Spaces of
 * up to `exhaustive_max` points are enumerated (the GEMM's space is a few
 * hundred points; evaluating one costs microseconds); larger ones are
 * searched by simulated annealing from the default configuration (TVM's
 * and APOLLO's choice for spaces too large to enumerate): a move changes
 * one knob to a neighbouring value, a worse point is accepted with
 * probability exp(-relative loss / temperature), the temperature cools
 * geometrically, and the walk restarts from the best point seen every
 * 64 moves.  The default rule's configuration is always evaluated first
 * and is kept unless a candidate is at least `min_gain` faster under the
 * cost model: a tuned kernel is never worse than the default under the
 * model, and the model's noise does not churn kernels.  On GPUs, under
 * the real model, points that keep more values live than the default
 * (ap_traffic.regs: a bigger unrolled register tile, which NVRTC compiles
 * slower and the model does not charge for) are left out.
 *
 * Records of tuning results (the chosen configuration, its modelled and
 * measured time, how it was found) live in the cache tiers, keyed by
 * ap_tune_signature: read and written by records.h (L1: cache.h's
 * ap_cache_tuning_*; L2: the shared cache).
 */
#ifndef AP_TUNE_H
#define AP_TUNE_H

#include "../backend/backend.h"
#include "../cache/cache.h"
#include "../lower/lower.h"

/* Evaluations one search makes at most (ap_tune_options.max_points 0). */
#define AP_TUNE_MAX_POINTS 2048

/* Configurations a search keeps, best first: the candidates a client may
 * time on its GPU (apollo-client tune). */
#define AP_TUNE_TOP 4   /* = AP_TUNE_CANDIDATES of client/apollo.h (check_tune asserts it) */

/* Modelled microseconds of configuration s of the emitter b is bound to,
 * for its micro-graph on its target; INFINITY for a point the target
 * cannot hold; a negative AP_E* code on failure. */
typedef double (*ap_tune_cost_fn)(const ap_bound *b, const ap_sched *s, void *user);

typedef struct ap_tune_options {
	unsigned max_points;       /* evaluations at most (the search's budget:
				      the same points whatever the machine's
				      load); 0 = AP_TUNE_MAX_POINTS */
	unsigned exhaustive_max;   /* enumerate spaces of at most this many
				      points; 0 = 1024 */
	double budget_ms;          /* wall-time safety limit of one search
				      (ap_tune_result.capped when it ends the
				      search); 0 = none */
	double min_gain;           /* relative gain needed to leave the default
				      configuration; 0 = 0.03, < 0 = none */
	uint64_t seed;             /* annealing's random stream (0 = fixed) */
	ap_tune_cost_fn cost;      /* NULL = ap_tune_model_us */
	void *user;                /* passed to cost */
} ap_tune_options;

typedef struct ap_tune_result {
	ap_sched best;             /* the chosen configuration */
	double best_us;            /* its modelled time */
	ap_sched dflt;             /* the default rule's */
	double default_us;
	int n_top;                 /* candidates, best first (the default among them) */
	ap_sched top[AP_TUNE_TOP];
	double top_us[AP_TUNE_TOP];
	unsigned tried;            /* configurations evaluated */
	double space;              /* points in the cross product */
	double ms;                 /* wall time of the search */
	bool capped;               /* budget_ms ended it before max_points: what
				      it found depends on the machine's load */
	const char *method;        /* "exhaustive" or "annealing" (static) */
} ap_tune_result;

/* The cost model's time for configuration s (em->traffic, then
 * ap_cost_schedule_us, which weighs tile re-reads, shared-memory traffic,
 * occupancy and waves); INFINITY when em->valid refuses s; AP_ENOMEM. */
double ap_tune_model_us(const ap_bound *b, const ap_sched *s, void *user);

/* The cost model's time of a compiled configuration: `t` (the emitter's
 * ap_traffic for it, ap_launch_part.traffic) with ptxas's figures in
 * place of the emitter's estimates -- registers per thread (occupancy
 * against the register file), static shared memory when larger than the
 * modelled (occupancy), and spill stores plus loads, moved once per
 * thread of every block through the caches (tile_bytes; a lower bound:
 * ptxas counts spill instructions, not their trips round a loop) -- then
 * ap_cost_schedule_us.  Microseconds; INFINITY when the block no longer
 * fits an SM.  This is issue 9's "model refined by what NVRTC reports for
 * each candidate" (the background tuner, server/compile/autotune.h).  A
 * library call's traffic (t->library, issue 25) is priced as it is: the
 * ptxas figures are of the kernel beside it, which the library replaces. */
double ap_tune_refined_us(const ap_traffic *t, const ap_ptxas_stats *ps, const ap_target_info *ti);

/* Searches the space of the emitter b is bound to, for its micro-graph on
 * its target (see the file comment), every point read from the one
 * binding; `o` may be NULL.  Fills *r.  0, or AP_ENOMEM / the cost
 * function's error with `err` set.  A space with one valid point returns
 * it without search. */
int ap_tune_search(const ap_bound *b, const ap_tune_options *o, ap_tune_result *r, ap_error *err);

/* The canonical signature of a tunable kernel: SHA-256 over the
 * micro-graph's canonical hash (ap_graph_hash_kernel: structure, shapes,
 * dtypes, the values of constants baked into the source only -- a bias
 * read from a buffer counts by shape, so identical layers share a
 * signature; no names), its kind and member count, the emitter's
 * name, the target name `target` ("sm_90", "cpu"), the block-size cap,
 * the TF32 option and the TMA option (only when set).  Two graphs holding the same micro-graph share it.
 * 0 or AP_ENOMEM. */
int ap_tune_signature(const ap_emitter *em, const ap_mgraph *m, const char *target,
		      const ap_target_info *t, unsigned max_block_threads, uint8_t sig[32]);

/* ---- tuning inside a build (server/driver/pipeline.c) ------------------------ */

/* How a build tunes its kernels (ap_build_options.tune).  The records'
 * storage is the caller's: the daemon's cache, or a test's table.
 *
 * The search budget is counted in cost-model evaluations, not in time, so
 * that a graph, a target and the tuning records give the same bundle on a
 * loaded machine as on an idle one (issue 26, item 3): a build's
 * `budget_evals` is dealt in equal shares to the micro-graphs of the
 * partition (ap_tune_share), whatever order its tasks run in.  budget_ms
 * is only a safety limit on wall time; a search it cuts short (or a
 * kernel left unsearched because the build's time was spent) is counted
 * (ap_tune_outcome.capped, ap_program.tune_capped) and not stored as a
 * record. */
typedef struct ap_tune_hooks {
	const char *target;        /* the records' target name ("sm_90", "cpu") */
	unsigned budget_evals;     /* cost-model evaluations of one build, its
				      kernels together; 0 = no search (records
				      and default rules only) */
	double budget_ms;          /* safety limit: search time of one build, its
				      kernels together (summed over the tasks);
				      0 = none */
	unsigned variant;          /* 0: the chosen configuration; i in 1..AP_TUNE_TOP:
				      the i-th candidate of the cost model's record
				      (the record's choice when it has fewer), for
				      timing on a GPU (apollo-client tune) */
	ap_tune_options search;    /* each search's options (its max_points is
				      the kernel's share, at most search.max_points;
				      its budget_ms what is left of the build's) */
	/* The record of `sig`: 1 with *rec set, 0 none; negative = none.  May
	 * be NULL (no records).  With `variant`, the cost model's record (the
	 * one listing candidates), else a measured one first. */
	int (*lookup)(void *user, const uint8_t sig[32], ap_tune_record *rec);
	/* Stores the cost model's record of a search; may be NULL. */
	void (*store)(void *user, const uint8_t sig[32], const ap_tune_record *rec);
	void *user;
} ap_tune_hooks;

/* What tuning did for one kernel. */
typedef enum ap_tune_kind {
	AP_TUNE_DEFAULT = 0,       /* the default rule (no record, no budget left) */
	AP_TUNE_SEARCHED,          /* searched now, under the cost model */
	AP_TUNE_RECORD,            /* a record of the cost model's */
	AP_TUNE_MEASURED,          /* a measured record */
} ap_tune_kind;

typedef struct ap_tune_outcome {
	ap_tune_kind kind;
	unsigned tried;            /* configurations evaluated (searched) */
	double ms;                 /* time spent searching */
	bool capped;               /* the safety limit cut its search short or
				      left it unsearched */
	uint8_t sig[32];
	ap_tune_result result;     /* AP_TUNE_SEARCHED: the search's result */
} ap_tune_outcome;

/* A micro-graph's share of h->budget_evals when the partition has
 * n_units of them: budget_evals / n_units evaluations, at most
 * h->search.max_points (0: AP_TUNE_MAX_POINTS); 0 with no budget.  A
 * function of the graph's partition only, so each kernel's search is the
 * same whatever its tasks' order and timing. */
unsigned ap_tune_share(const ap_tune_hooks *h, int n_units);

/* The configuration for the micro-graph b binds, on b's emitter: the
 * record of its signature when h has one whose config parses
 * (ap_sched_parse) for this emitter (with h->variant, its variant-th candidate), else a search of
 * at most max_evals evaluations (none below 2: the default and one more
 * point) and at most left_ms milliseconds (0: no limit; < 0: the build's
 * safety limit is spent, the default rule and out->capped), stored
 * through h->store with its best AP_TUNE_TOP candidates unless the time
 * limit cut it short (not for an emitter marked host_rule_only on the
 * host), else the default rule.  *s always gets a buildable
 * configuration.  0, or AP_ENOMEM / a cost function's error with `err`. */
int ap_tune_unit(const ap_tune_hooks *h, const ap_bound *b, unsigned max_block_threads,
		 unsigned max_evals, double left_ms, ap_sched *s, ap_tune_outcome *out, ap_error *err);

/* Whether `config` is one of rec's candidates or its chosen
 * configuration (exact text): what a client may report a time for. */
bool ap_tune_is_candidate(const ap_tune_record *rec, const char *config);

#endif
