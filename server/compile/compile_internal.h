/* compile_internal.h -- what the parts of the compile job share: the
 * compiler's state (struct ap_compiler), a kernel's blob on its way into a
 * bundle, one request's kernel batch, and the functions one part calls in
 * another.  The job itself is compile.c's; its parts are keys.c (cache keys,
 * targets), kernels.c (the kernels' parallel compile, backend refusals),
 * bundle.c (the reply's protobuf), tuning.c (the tuning hooks over
 * server/tune/records.h, reports).  The cache tiers: server/cache/tiers.h.
 * Private to server/compile/.  Every function's contract is at its
 * definition. */
#ifndef AP_COMPILE_INTERNAL_H
#define AP_COMPILE_INTERNAL_H

#include "compile.h"
#include "autotune.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../common/graph.h"
#include "../backend/backend.h"
#include "../cache/redis.h"
#include "../cache/tiers.h"
#include "../config.h"
#include "../plan/program.h"
#include "../tune/records.h"
#include "../tune/tune.h"
#include "flight.h"
#include "lease.h"
#include "proto/apollo.pb-c.h"

struct task_batch;

#define MEMO_SLOTS 4096
#define DEVICES_SEEN 256     /* (device, client) pairs remembered for reports */
#define TRUSTED_REPORTER "apollod"   /* the background tuner's reports */

/* A device a client named in a CompileRequest (DeviceInfo): only such a
 * device can be the subject of that client's tuning reports. */
struct device_seen {
	char device[160];        /* "NAME|SMS" */
	char client[64];         /* "uid:N", "tcp:ADDR" */
	double last_ms;          /* 0: unused */
};
#define DEFAULT_FLIGHT_WAIT_MS 600000

/* Request digest -> graph key (see the file comment). */
struct memo_slot {
	bool used, has_admit;
	uint8_t digest[32], key[32];
	ap_compile_admit admit;   /* has_admit: how net.c admitted it */
};

struct ap_compiler {
	ap_cache *cache;
	unsigned threads;
	/* Helper threads for the kernels of a request (see compile_kernels). */
	pthread_mutex_t mu;
	pthread_cond_t work;
	struct task_batch *queue;     /* batches with tasks not yet taken */
	bool stop;
	unsigned n_helpers;
	pthread_t *helpers;
	unsigned delay_ms;       /* $APOLLO_TEST_COMPILE_DELAY_MS: tests only */
	bool stop_before_backend;   /* tests and fuzzing only (compile.h) */
	unsigned refuse_nodes;   /* $APOLLO_TEST_REFUSE_KERNEL_NODES: tests only */
	char cc_id[256];
	char nvrtc_id[64];
	char build_id[64];       /* "apollod 0.1.0 exe <sha256 prefix>" */
	ap_redis *redis;         /* L2; NULL: none */
	ap_tiers *tiers;         /* cache and redis read and written through (tiers.h) */
	ap_flights *flights;     /* requests by graph key; NULL: no single-flight */
	ap_flights *kflights;    /* kernels by kernel key */
	ap_leases *leases;       /* cluster leases of cold requests and kernels
				    (lease.h); NULL: none */
	unsigned lease_hold_ms;  /* $APOLLO_TEST_LEASE_HOLD_MS: tests only */
	unsigned klease_hold_ms; /* $APOLLO_TEST_KERNEL_LEASE_HOLD_MS: tests only */
	unsigned flight_wait_ms;
	unsigned tune_budget_evals;   /* per request; 0: no search */
	double tune_budget_ms;   /* per request, the safety limit; 0: none */
	ap_autotune *autotune;   /* the background tuner; NULL: none */
	pthread_mutex_t memo_mu;
	struct memo_slot *memo;  /* MEMO_SLOTS */
	atomic_uint_fast64_t requests, errors, hits, misses, kernels_compiled, memo_hits;
	atomic_uint_fast64_t tier[4], kernel_tier[4], errors_by_code[16];
	atomic_uint_fast64_t tune_hits, tune_measured, tune_searched, tune_tried, tune_us;
	atomic_uint_fast64_t tune_capped;
	atomic_uint_fast64_t tune_reports, tune_measurements, tune_records, tune_pending;
	char tune_reporters[256];   /* who may send tuning reports (compile.h) */
	pthread_mutex_t devices_mu;
	struct device_seen *devices;   /* DEVICES_SEEN: GPUs clients named, newest kept */
	pthread_mutex_t hist_mu;
	uint64_t hist[AP_COMPILE_BUCKETS + 1];
	double hist_sum;
	uint64_t stage_hist[AP_STAGES][AP_STAGE_BUCKETS + 1];   /* hist_mu, too */
	double stage_sum[AP_STAGES];
};

/* A compiled kernel blob, before it goes into the bundle. */
struct kblob {
	uint8_t *data;
	size_t len;
	uint8_t digest[32];
	bool compiled;        /* by the backend (else from a cache or a flight) */
	int tier;             /* where it came from: apollo.CacheTier */
	int rc;
	ap_error err;
};

/* A blob a bundle borrows from the cache's memory tier (issue 26, item 2):
 * kernel `kernel`'s blob.data points into `blob`, a reference its holder
 * gives back once the bundle is freed (ap__compile_bundle_release). */
struct blob_ref {
	size_t kernel;
	ap_blob *blob;
};

/* One request's progress (ap_compile_progress, progress.c): what was sent
 * last, under `mu`, so that the worker and its helper threads may report
 * and the rate bound holds.  Zeroed with `to` NULL: reports nothing. */
struct ap__progress {
	const ap_compile_progress *to;   /* NULL: none */
	double t0;                   /* the request's start, ap_now_ms() */
	pthread_mutex_t mu;          /* initialised by ap__progress_init only */
	bool ready;                  /* mu initialised */
	const char *stage;           /* the last stage sent; NULL: none yet */
	double last_ms;              /* when it was sent */
	uint32_t last_done;          /* its `done` */
#define AP__PROGRESS_STAGES 16
	const char *seen[AP__PROGRESS_STAGES];   /* the stages reported so far */
	unsigned n_seen;
	uint32_t backend_done;       /* kernels the backend stage has finished (mu) */
	uint32_t backend_total;      /* of how many (set before the stage) */
};

/* Sets p up to report to `to` (NULL: nothing) for a request begun at t0. */
void ap__progress_init(struct ap__progress *p, const ap_compile_progress *to, double t0);
/* Releases what ap__progress_init took (nothing when `to` was NULL). */
void ap__progress_fini(struct ap__progress *p);
/* Reports `stage` at done of total, unless the rate bound drops it (the
 * stage is the one sent last, less than AP_PROGRESS_MIN_MS ago, and done
 * < total).  p may be NULL; any thread. */
void ap__progress(struct ap__progress *p, const char *stage, uint32_t done, uint32_t total);
/* ap_build_options.stage_begin for a request's struct ap__progress
 * (`user`): the pipeline's stage reported under its wire name (expand,
 * partition and micro-graphs as "partition", emit as "tuning", print as
 * "codegen"). */
void ap__progress_stage(void *user, const char *stage);
/* The backend stage: `n` more of its backend_total kernels are done. */
void ap__progress_kernels(struct ap__progress *p, unsigned n);

/* One request's kernel compiles: target and blobs, shared by the worker
 * that owns the request and the helper threads (through a task_batch);
 * each blobs[i] is written only by the thread that runs task i. */
struct kernel_batch {
	ap_compiler *c;
	const ap_program *p;
	const char *target;
	bool gpu, use_cache;
	int nvrtc;                   /* GPU: the NVRTC compiling it (ap_nvrtc_pick) */
	char backend[64];            /* its identity in kernel keys ("nvrtc 12.9", "cc ...") */
	int output;
	double deadline;             /* ap_now_ms(): a kernel flight's wait ends */
	const atomic_bool *cancel;   /* set: compile no more kernels (the background
					tuner stopping); NULL: never */
	struct kblob *blobs;
	struct ap__progress *progress;   /* the request's; NULL: not reported */
	/* grouped compiles (ap__compile_kernels): per kernel its key, what the
	 * probe found, its flight and cluster lease; the groups of misses, one
	 * program each */
	uint8_t (*keys)[32];
	enum { K_DONE, K_COMPILE, K_FOLLOW, K_LEASED } *state;
	ap_flight **flight;
	ap_lease **lease;            /* the kernel's cluster lease, held while compiling */
	ap_lease_wait **lwait;       /* K_LEASED: the wait for another daemon's */
	int *group_of, n_groups;
};

/* Every kernel one request has offered the backend, by name (a kernel's
 * name hashes its sources, so one name is one source), with its result:
 * the blob, or the backend's error.  Owned by the request's worker. */
struct kmemo {
	struct kernel_batch *kb;     /* target, output, cache use; kb->p unused */
	int n, cap;
	char **names;
	struct kblob *blobs;
	double ms;                   /* time spent compiling in accept_kernel */
};

/* n independent tasks fn(0..n-1, arg) of one request.  `next`, `done` and
 * the queue links are under the compiler's mutex. */
struct task_batch {
	int n, next, done;
	void (*fn)(int i, void *arg);
	void *arg;
	struct task_batch *queue_next;
	pthread_cond_t finished;
};

/* ap_tune_hooks.user of one request. */
struct tune_user {
	ap_compiler *c;
	const char *target;
	const char *device;      /* the request's device id ("NAME|SMS"), "" for none */
	bool variant;            /* the model's record (its candidates) */
};

/* tuning.c */
int ap__compile_tune_lookup(void *user, const uint8_t sig[32], ap_tune_record *rec);
void ap__compile_tune_store(void *user, const uint8_t sig[32], const ap_tune_record *rec);
void ap__compile_device_note(ap_compiler *c, const char *device, const char *client);

/* keys.c */
int ap__compile_onnx_request_key(const Apollo__CompileRequest *req, const char *target, int output,
			    const char *backend_id, uint8_t key[32]);

/* bundle.c */
Apollo__Bundle *ap__compile_build_bundle(const ap_program *p, struct kblob *blobs, const char *target,
				    int output, const uint8_t graph_hash[32], bool *oom);
Apollo__Bundle *ap__compile_bundle_free(Apollo__Bundle *b);
Apollo__Bundle *ap__compile_bundle_release(Apollo__Bundle *b, struct blob_ref *refs, size_t n);
uint32_t ap__compile_blob_owner(const Apollo__Bundle *b, size_t i);
uint8_t *ap__compile_warm_frame(ap_cache *cache, const uint8_t *val, size_t n, uint64_t id,
				void (*set)(Apollo__Stats *, void *), void *user, size_t *len);
uint8_t *ap__compile_pack_stripped(Apollo__Bundle *b, size_t *len);

/* kernels.c */
int ap__compile_kernels(ap_compiler *c, struct kernel_batch *kb, const ap_program *p,
			   struct kblob *blobs, ap_error *err);
int ap__compile_rebuild_refused(ap_compiler *c, const ap_graph *g, ap_build_options *bo,
			   struct kernel_batch *kb, ap_program **progp, struct kblob **blobsp,
			   unsigned *compiled, double *backend_ms, ap_error *err);
void *ap__compile_helper_main(void *arg);
void ap__compile_run_tasks(void *pool, int n, void (*fn)(int i, void *arg), void *arg);

#endif
