/* autotune.h -- the daemon's background tuner: after a compile for a GPU
 * target whose kernels were searched (server/tune/tune.h), their
 * candidates are compiled and, where this host has a GPU, timed, off the
 * request's path (issue 9; APOLLO section 5 tunes every fused kernel by a
 * search guided by a cost model, then by measurement).
 *
 * One job per such request, on one thread of its own at the lowest
 * scheduling priority, queued (at most `queue_max`, more are dropped and
 * counted).  A job builds the request's graph once per candidate rank
 * (CompileOptions.tune_variant 1..AP_TUNE_TOP: every tuned kernel on its
 * i-th candidate, alone in its launch), then:
 *   refine:  compiles each tuned kernel's source to a cubin with ptxas -v
 *            (ap_nvrtc_ptxas_stats) and prices the candidate again with
 *            ptxas's registers, shared memory and spills
 *            (ap_tune_refined_us: occupancy from the real register
 *            count).  Per kernel, the candidates are re-ranked (one that
 *            spills after one that does not, then by the refined time),
 *            and the record's choice moves to the best only when that one
 *            does not spill while the choice does, or is at least 3%
 *            faster (the search's min_gain): the record is stored again
 *            with method "ptxas", the refined time, the re-ranked
 *            candidates; the tuning generation advances when a choice
 *            moved, so bundles compiled before are not served again.
 *   measure: when a CUDA driver (libcuda, or $APOLLO_LIBCUDA) and device
 *            `device` load, compiles each variant to a bundle, times it
 *            through the kernel timer of its options (common/kernel_timer.h;
 *            apollod's is the client runtime's: warm-up, then the median
 *            of `runs` CUDA-event timings per launch) and stores
 *            the fastest candidate of each kernel as a measured record
 *            for this device, exactly as a client's apollo-client tune
 *            report would be (ap_compiler_tune_report); kernels that
 *            have a measured record for this device already are left
 *            out (no new tuning generation for them).  A driver or
 *            device that does not load turns measuring off for the
 *            tuner's life (logged once).
 * A kernel whose candidates did not all compile keeps its record; one whose
 * record was refined before (method "ptxas") is not compiled again.
 */
#ifndef AP_AUTOTUNE_H
#define AP_AUTOTUNE_H

#include "../../common/base.h"
#include "../../common/kernel_timer.h"

struct Apollo__CompileRequest;
typedef struct ap_compiler ap_compiler;
typedef struct ap_autotune ap_autotune;

typedef struct ap_autotune_options {
	bool refine;          /* ptxas -v refinement of the model's records */
	bool measure;         /* timing on this host's GPU, when one loads */
	const ap_kernel_timer *timer; /* how: borrowed, lives as long as the
				       tuner (apollod: the client runtime's,
				       ap_runtime_kernel_timer); NULL turns
				       measuring off */
	int device;           /* its CUDA ordinal */
	int nice;             /* the tuner thread's nice value, 0..19 (apollod:
				 tune_nice, 19); ptxas inherits it */
	unsigned queue_max;   /* jobs waiting at most; 0 = 8 */
	int warmup, runs;     /* timing: 0 = 3 warm-up runs, 20 timed */
} ap_autotune_options;

/* What the tuner did since it started. */
typedef struct ap_autotune_counters {
	uint64_t jobs;            /* requests tuned (finished) */
	uint64_t dropped;         /* requests not queued: the queue was full */
	uint64_t failed;          /* jobs stopped by an error (logged) */
	uint64_t compiled;        /* candidates compiled with ptxas -v */
	uint64_t refined;         /* kernels whose record was refined */
	uint64_t moved;           /* of those, records whose choice moved */
	uint64_t timed;           /* candidates timed on this host's GPU */
	uint64_t measured;        /* measured records stored */
} ap_autotune_counters;

/* Starts the tuner for compiler c (borrowed; the compiler owns the tuner
 * and frees it first).  NULL when out of memory or when no thread starts
 * (logged). */
__ap_give ap_autotune *ap_autotune_new(ap_compiler *c, const ap_autotune_options *o);
/* Stops the tuner and joins its thread: the job running is abandoned at
 * its next step -- between candidates and kernels, between ptxas compiles
 * and between the backend compiles of its bundles (one kernel each), and
 * before its timings -- so the wait is at most one such step; nothing of
 * an abandoned job is stored (its records are written at its end, each
 * set in one transaction).  Queued jobs are dropped.  Accepts NULL;
 * returns NULL. */
ap_autotune *ap_autotune_free(__ap_take ap_autotune *a);

/* Queues a copy of `req` (the request as the client sent it; its
 * tune_variant is set per rank by the job).  False when the queue is full
 * (counted as dropped) or out of memory. */
bool ap_autotune_submit(ap_autotune *a, __ap_keep const struct Apollo__CompileRequest *req);

/* Waits until no job is queued or running, at most timeout_ms
 * milliseconds; true when idle (tests). */
bool ap_autotune_wait_idle(ap_autotune *a, unsigned timeout_ms);

void ap_autotune_get_counters(const ap_autotune *a, ap_autotune_counters *out);

#endif
