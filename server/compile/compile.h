/* compile.h -- the compile job: one apollo.CompileRequest in, one
 * apollo.CompileResponse out (a Bundle or an Error).
 *
 * The job, in order (compile.c):
 *   target + output kind checked  -> ERR_UNSUPPORTED for anything else
 *   graph: ap_graph_from_pb + ap_graph_validate
 *   onnx_model: ap_onnx_import with the request's bindings
 *   graph key (inputs only, names included, see ap_compile_graph_key;
 *     a request whose bytes were seen before skips decoding, validating
 *     and hashing its graph: the request digest names its key)
 *     -> local cache L1, then the shared cache L2 (Redis, redis.h; a hit
 *        is copied into L1); neither is read nor written with
 *        options.no_cache:
 *     hit: the stored bundle, kernel blobs fetched by digest and verified
 *          (each distinct blob once, lent by the memory tier by reference;
 *          later kernels of the same blob get blob_of), stats.cache_hit =
 *          true, cache_tier L1 or L2, nothing compiled
 *     single-flight (flight.h): an identical request already compiling
 *          is waited for (flight_wait_ms from arrival) and its bundle
 *          answers, cache_tier SHARED
 *     cluster lease (lease.h; with L2): the flight's leader takes the
 *          graph key's lease in Redis, or waits (the same bound) for the
 *          daemon holding it to store its entry, answered from L2
 *   ap_program_build (partition, fuse, lower, print, plan)
 *   per kernel: kernel key -> L1 kernel cache, L2, a flight for the same
 *     kernel, else the backend (NVRTC for sm_XX / compute_XX, the host C
 *     compiler for cpu), run on up to `threads` threads at once, then
 *     stored in L1 and L2
 *   a kernel the backend rejects: the program is built again with the
 *     backend as ap_build_options.accept_kernel, which splits the fused
 *     group it came from (boundary reason "refused"); only a single-node
 *     kernel that does not compile is an error (ERR_COMPILE)
 *   apollo.Bundle assembled, stored in L1 (kernel blobs replaced by their
 *     digests) and in L2 (with the blobs), handed to the requests that
 *     waited for it, returned.
 * Every failure becomes CompileResponse.error with the code, message, node
 * and tensor of the ap_error that stopped it.
 *
 * Runs on worker threads: an ap_compiler is shared by all of them and keeps
 * no per-request state; its counters are atomic.
 */
#ifndef AP_COMPILE_H
#define AP_COMPILE_H

#include <stdatomic.h>

#include "../../common/base.h"
#include "../cache/cache.h"
#include "autotune.h"
#include "lease.h"

struct Apollo__CompileRequest;
struct Apollo__CompileResponse;
struct Apollo__TuneReport;

typedef struct ap_compiler ap_compiler;

struct ap_redis;
struct ap_tiers;

/* The default search budget of one request, in cost-model evaluations,
 * its kernels together (the daemon's tune_budget_evals; each micro-graph
 * gets an equal share, at most AP_TUNE_MAX_POINTS: tune.h). */
#define AP_TUNE_BUDGET_EVALS 65536
/* The default safety limit on one request's search time, milliseconds
 * (the daemon's tune_budget_ms): far above what the budget takes on an
 * idle machine, so that only an overloaded one reaches it. */
#define AP_TUNE_BUDGET_MS 5000

typedef struct ap_compiler_options {
	unsigned threads;    /* backend compiles one request runs at once; 0 = 1 */
	struct ap_redis *redis;    /* the shared cache (borrowed; must outlive the
				      compiler); NULL = none */
	bool no_flight;            /* no single-flight: identical requests each
				      compile (and kernels alike) */
	unsigned flight_wait_ms;   /* how long a request waits for an identical
				      one in flight, from its arrival; 0 = 10 min */
	unsigned lease_ms;         /* with redis and single-flight: a cold
				      request's cluster lease lives this many ms,
				      renewed every third of it, and the other
				      daemons wait for its entry (lease.h);
				      0 = no leases */
	long long tune_budget_evals;   /* search budget per request, cost-model
				      evaluations (server/tune/tune.h);
				      0 = AP_TUNE_BUDGET_EVALS, < 0 = no search
				      (records are still used) */
	double tune_budget_ms;     /* safety limit on a request's search time,
				      ms; 0 = AP_TUNE_BUDGET_MS, < 0 = none */
	ap_autotune_options autotune;  /* the background tuner (autotune.h): runs
				      when refine or measure is set; off by
				      default */
	const char *tune_reporters; /* who may send tuning reports: "any" (NULL or
				      ""), or comma-separated uids and "tcp" */
	bool stop_before_backend;  /* tests and fuzzing: end each request after
				      ap_program_build (kernel IR and sources
				      made, nothing compiled or stored) with
				      ERR_INTERNAL "stopped before the backend" */
} ap_compiler_options;

/* Creates the compiler over `cache` (borrowed; must outlive the compiler;
 * NULL = no caching).  Finds the host C compiler's identity ($APOLLO_CC or
 * cc, `--version`) for the cpu keys.  Returns NULL only when out of memory. */
__ap_give ap_compiler *ap_compiler_new(__ap_keep ap_cache *cache, const ap_compiler_options *opt);
ap_compiler *ap_compiler_free(__ap_take ap_compiler *c);   /* accepts NULL */

/* Runs one request (see the file comment).  Never returns NULL unless out
 * of memory; free the result with ap_compile_response_free. */
__ap_give struct Apollo__CompileResponse *ap_compile_run(ap_compiler *c,
							 __ap_keep const struct Apollo__CompileRequest *req);
/* As ap_compile_run, with `digest` (may be NULL) the SHA-256 of the
 * request's serialized bytes, exactly as they decoded to `req` (net.c
 * takes it from the Envelope's one CompileRequest field).  A request whose
 * digest the compiler has seen before, and whose graph key is remembered
 * for it (in memory, at most 4096, newest first), is looked up by that key
 * without decoding, validating or hashing its graph. */
__ap_give struct Apollo__CompileResponse *ap_compile_run_digest(
	ap_compiler *c, __ap_keep const struct Apollo__CompileRequest *req,
	const uint8_t *digest);
/* As ap_compile_run_digest for a request from `client` ("uid:N" on the Unix
 * socket, "tcp:ADDR" on TCP; NULL: in-process).  A GPU request's
 * DeviceInfo is remembered for that client (at most 256 device and client
 * pairs, the oldest forgotten), so that its tuning reports may name that
 * device (ap_compiler_tune_report). */
__ap_give struct Apollo__CompileResponse *ap_compile_run_as(
	ap_compiler *c, __ap_keep const struct Apollo__CompileRequest *req,
	const uint8_t *digest, const char *client);
/* Frees a response of ap_compile_run* (only those: its bundle may borrow
 * blobs from the cache's memory tier, given back here).  Accepts NULL. */
void ap_compile_response_free(__ap_take struct Apollo__CompileResponse *r);
/* As ap_compile_run_as, the answer serialized as the daemon sends it: a
 * frame (common/frame.h: the 4-byte big-endian length, then an Envelope
 * with `id` and `compiled`, the CompileResponse), malloc'd, *len bytes;
 * *bundle: whether it holds a bundle (else an Error).  A request the memo
 * knows whose bundle is in L1 is answered from the stored bundle's bytes
 * without decoding them (issue 26, item 2): each distinct blob is fetched
 * from the memory tier by reference once and copied once, into the frame,
 * and the bytes are those ap_compile_run_as's response packs to, byte for
 * byte (its stats' times aside).  NULL only when out of memory (or a
 * reply over 4 GiB). */
__ap_give uint8_t *ap_compile_run_frame(ap_compiler *c,
					__ap_keep const struct Apollo__CompileRequest *req,
					const uint8_t *digest, const char *client, uint64_t id,
					size_t *len, bool *bundle);

/* What compiling a request will take in memory, judged before anything is
 * built (issue 29, item 5): `bytes`, beside the decoded request itself,
 * and what it was counted from. */
typedef struct ap_compile_cost {
	uint64_t bytes;        /* the estimate */
	uint64_t nodes;        /* graph nodes (ONNX: the top-level graph's) */
	uint64_t tensors;      /* graph tensors (ONNX: node outputs and graph inputs) */
	uint64_t data_bytes;   /* constant data (ONNX: the model's bytes) */
} ap_compile_cost;

/* Estimates what compiling `req` (borrowed) will take, in bytes:
 * 16 KiB per node (64 KiB for MatMul / Gemm / Conv, 192 KiB for compound
 * ops such as LayerNormalization), 1 KiB per tensor, twice the constant
 * data, 16 bytes per attribute element -- the compiler's measured peak
 * per node at its worst shape (estimate.c), so an upper bound for real
 * graphs.  An ONNX model is counted from its wire bytes, not decoded.
 * Never fails (a request with neither source costs 0); allocates nothing;
 * any thread.  The daemon refuses a request above max_compile_memory
 * with ERR_TOO_LARGE before queueing it (net.c). */
void ap_compile_estimate(__ap_keep const struct Apollo__CompileRequest *req, ap_compile_cost *out);

/* What admitting a compile request took (net.c: the bytes its decoded
 * Envelope held, and ap_compile_estimate's estimate): functions of the
 * request's bytes, remembered with its key in the request memo, so that a
 * repeat is admitted alike without its graph being decoded. */
typedef struct ap_compile_admit {
	uint64_t decoded;
	ap_compile_cost cost;
} ap_compile_admit;

/* As ap_compile_run_frame, `admit` (may be NULL) remembered with the
 * request's key in the memo (ap_compile_memo_admit). */
__ap_give uint8_t *ap_compile_run_frame_admitted(ap_compiler *c,
						 __ap_keep const struct Apollo__CompileRequest *req,
						 const uint8_t *digest, const char *client,
						 const ap_compile_admit *admit, uint64_t id,
						 size_t *len, bool *bundle);
/* Where a request's progress goes (issue 26, item 4): `fn` is called with
 * the stage reached ("import", "partition", "layer I", "layer II",
 * "tuning", "layer III", "codegen", "plan", "backend", "cache"), `done` of
 * `total` units (kernels for "backend"; 0 of 0 for stages not counted) and
 * the milliseconds since the request arrived (t0).  Rate-bounded before the call:
 * once per stage change, and within one stage at most every
 * AP_PROGRESS_MIN_MS unless done reaches total; a stage reported before
 * (a round the refusals repeat), again no sooner than AP_PROGRESS_MIN_MS
 * after the last event.  Called on the request's
 * worker or its helper threads, never two at once for one request, never
 * after ap_compile_run_frame_progress returned; `stage` is a static
 * string.  A warm answer calls it not at all.  After the backend refused
 * a kernel the program is built again (kernels.c): the pipeline's stages
 * are reported again from "partition". */
#define AP_PROGRESS_MIN_MS 100.0
typedef struct ap_compile_progress {
	void (*fn)(void *user, const char *stage, uint32_t done, uint32_t total,
		   double elapsed_ms);
	void *user;                  /* passed to fn, borrowed */
	double t0;                   /* when the request arrived (ap_now_ms()), what
					elapsed_ms counts from; 0: the compile's start */
} ap_compile_progress;

/* As ap_compile_run_frame_admitted, the request's stages reported to
 * `progress` (borrowed; NULL: none) while it runs. */
__ap_give uint8_t *ap_compile_run_frame_progress(ap_compiler *c,
						 __ap_keep const struct Apollo__CompileRequest *req,
						 const uint8_t *digest, const char *client,
						 const ap_compile_admit *admit,
						 const ap_compile_progress *progress, uint64_t id,
						 size_t *len, bool *bundle);
/* Whether the request memo knows the request whose bytes have SHA-256
 * `digest` together with how it was admitted: true with *out (the numbers
 * ap_compile_run_frame_admitted was given), false when it does not (a
 * request not seen, forgotten, or run without them). */
bool ap_compile_memo_admit(ap_compiler *c, const uint8_t digest[32], ap_compile_admit *out);
/* The warm answer alone (issue 26, item 2): for a request the memo knows
 * whose bundle is in L1, the frame ap_compile_run_frame would give (its
 * spliced warm answer), counted as a hit; NULL, with nothing counted,
 * whenever it would take anything else (the memo or L1 missing it, a
 * target refused, no cache, out of memory).  Reads only req's target,
 * output, options and device: net.c hands it a request decoded without its
 * graph (or model) and decodes the rest only when this gives NULL. */
__ap_give uint8_t *ap_compile_warm_frame(ap_compiler *c,
					 __ap_keep const struct Apollo__CompileRequest *req,
					 const uint8_t digest[32], const char *client, uint64_t id,
					 size_t *len);

/* Measurements one tuning report may carry. */
#define AP_TUNE_REPORT_MAX 4096

/* Takes a client's measurements (apollo.TuneReport from apollo-client
 * tune: median microseconds of the candidates of tuned kernels, timed on
 * the client's GPU).  `client` names the reporter: "uid:N" (Unix socket),
 * "tcp:ADDR", or "apollod" (the daemon's own background tuner, trusted).
 * Checked before anything is stored: the client is allowed by the
 * tune_reporters option; a GPU target (cpu is refused: the host is tuned
 * by the cost model); the device (rep->device printable ASCII of 1-127
 * bytes, sm_count 1..1024) named by this same client in a compile request
 * (CompileRequest.device; the background tuner excepted), so that device
 * names cannot be invented; 1..AP_TUNE_REPORT_MAX measurements, each a
 * 32-byte signature with a cost-model tuning record for rep->target whose
 * candidates (or choice) list the schedule exactly, a time in (0, 1e7) us,
 * runs >= 1.  Then the client's times are stored (cache.h,
 * ap_cache_report_put: one row per client, device, kernel and schedule,
 * bounded), and per kernel the schedule the reports agree on
 * (ap_cache_report_agreed: timed by two distinct clients, or by the
 * daemon's own tuner; the smallest median) becomes the measured record of
 * (signature, target, device) when it differs from the one there, which
 * retires only the cached bundles holding that kernel for that device and
 * applies only to requests naming that device.  A kernel without agreement
 * yet counts in *pending.  0 with *records (measured records stored),
 * *pending and *generation set; else nothing is stored and `err` names the
 * measurement and the reason: AP_EINVAL (a malformed or unknown
 * measurement; a device the client did not name), AP_ETOOLARGE (too many),
 * AP_EUNSUPPORTED (unknown or host target; no cache; client not allowed),
 * AP_EIO (SQLite), AP_ENOMEM.  Thread-safe.  Method: measurements as
 * TVM's meta_schedule keeps them (records per workload and target), with
 * agreement across reporters as the defence against one client's numbers. */
int ap_compiler_tune_report(ap_compiler *c, const char *client,
			    __ap_keep const struct Apollo__TuneReport *rep, unsigned *records,
			    unsigned *pending, uint64_t *generation, ap_error *err);

/* The id of a GPU in tuning records and cache keys: "NAME|SMS" in `id`
 * (cap bytes).  0, or AP_EINVAL when the name is not 1-127 printable ASCII
 * characters or sms is not in 1..1024. */
int ap_compile_device_id(const char *name, unsigned sms, char *id, size_t cap, ap_error *err);

/* Upper bounds (seconds) of the compile time histogram's buckets; the last
 * bucket is +Inf. */
#define AP_COMPILE_BUCKETS 12
extern const double ap_compile_bucket_s[AP_COMPILE_BUCKETS];

/* The stages timed per compiled request (apollo.Stats: import_ms,
 * partition_ms, layer1_ms, tune_ms, codegen_ms -- layer I and tuning are
 * parts of codegen --, backend_ms, cache_ms), by name, and the upper
 * bounds (seconds) of their latency histograms' buckets; the last bucket
 * is +Inf (issue 26, item 4). */
#define AP_STAGES 7
#define AP_STAGE_BUCKETS 5
extern const char *const ap_stage_names[AP_STAGES];
extern const double ap_stage_bucket_s[AP_STAGE_BUCKETS];

/* Totals since the compiler was created. */
typedef struct ap_compile_counters {
	uint64_t requests;          /* compile requests run */
	uint64_t errors;            /* of those, answered with an error */
	uint64_t cache_hits, cache_misses;   /* hits: tiers L1 + L2 + SHARED */
	uint64_t kernels_compiled;  /* backend compiles (kernel-cache misses) */
	/* answers by tier (apollo.CacheTier): compiled, L1, L2, SHARED */
	uint64_t tier[4];
	/* kernels needed by compiled requests, by where they came from:
	 * compiled, L1, L2, SHARED (another request's compile in flight) */
	uint64_t kernel_tier[4];
	uint64_t memo_hits;         /* requests that skipped decoding their graph */
	uint64_t flight_timeouts;   /* waits (requests and kernels) that gave up */
	uint64_t flight_waiting;    /* requests and kernels waiting now */
	/* cluster leases (lease.h, ap_lease_counts) of cold requests and of
	 * cold kernels: taken (take-overs included), waits, lapses seen while
	 * waiting, take-overs, waits that reached flight_wait_ms, leases lost
	 * while held, waiting now */
	ap_lease_counts lease, kernel_lease;
	/* compile time (request wall time, seconds) of requests answered by
	 * compiling: count per bucket (not cumulative; the last is +Inf), sum */
	uint64_t compile_hist[AP_COMPILE_BUCKETS + 1];
	double compile_sum_s;
	/* the same per stage (ap_stage_names), seconds, of the same requests */
	uint64_t stage_hist[AP_STAGES][AP_STAGE_BUCKETS + 1];
	double stage_sum_s[AP_STAGES];
	/* tuning (server/tune/tune.h) in compiled requests: kernels whose
	 * configuration came from a record (of those measured), kernels
	 * searched, configurations evaluated, search time; client reports
	 * (apollo-client tune) accepted, their measurements, records stored */
	uint64_t tune_hits, tune_measured, tune_searched, tune_tried;
	uint64_t tune_capped;       /* searches the time limit (tune_budget_ms) cut
				       short or left undone (issue 26, item 3) */
	double tune_s;
	uint64_t tune_reports, tune_measurements, tune_records;
	uint64_t tune_pending;      /* reported kernels still waiting for agreement */
	/* errors answered, by -code (AP_E*: 1 .. 12) */
	uint64_t errors_by_code[16];
	ap_autotune_counters autotune;   /* the background tuner's (zero: none) */
} ap_compile_counters;
void ap_compiler_get_counters(const ap_compiler *c, ap_compile_counters *out);
/* The shared cache the compiler was created with (NULL: none). */
struct ap_redis *ap_compiler_redis(const ap_compiler *c);

/* ---- for the background tuner (autotune.c) ---------------------------------- */

struct Apollo__Bundle;
struct ap_program;
struct ap_graph;

/* The cache the compiler was created with (may be NULL) and its
 * background tuner (NULL: none). */
ap_cache *ap_compiler_cache(const ap_compiler *c);
ap_autotune *ap_compiler_autotune(const ap_compiler *c);

/* The compiler's cache tiers (cache/tiers.h: its cache as L1, its Redis as
 * L2), owned by the compiler: valid while it lives.  Tuning records are
 * read and written through them (server/tune/records.h). */
struct ap_tiers *ap_compiler_tiers(const ap_compiler *c);

/* Builds req's graph as a compile would (target, graph or ONNX import,
 * options, req->device's tuning records and search), without the backend: *g and *prog
 * (the kernels' sources, launches and parts) are the caller's to free.
 * Counts nothing.  0, or the error a compile would answer. */
int ap_compiler_build_program(ap_compiler *c, __ap_keep const struct Apollo__CompileRequest *req,
			      __ap_give struct ap_graph **g, __ap_give struct ap_program **prog,
			      ap_error *err);

/* Compiles req as ap_compile_run would (caches, single-flight, backend),
 * without counting it among the daemon's requests: 0 with *out (free with
 * apollo__bundle__free_unpacked), or the error.  `cancel` (may be NULL;
 * the background tuner's stop): its kernels are then compiled one per
 * backend program, and once *cancel is set no further backend run starts
 * -- the call returns AP_EBUSY ("cancelled") after the runs in progress
 * (a kernel each) end; what was compiled before stays in the cache (each
 * store a transaction of its own), the bundle is neither stored nor
 * returned. */
int ap_compiler_compile_bundle(ap_compiler *c, __ap_keep const struct Apollo__CompileRequest *req,
			       const atomic_bool *cancel,
			       __ap_give struct Apollo__Bundle **out, ap_error *err);

/* ---- cache keys: SHA-256 over the inputs of a compilation only ---------- */

/* What identifies the backend in keys: "nvrtc <version>" for GPU targets,
 * "cc <first line of cc --version>" for cpu.  Graph and request keys add
 * the daemon's build ("apollod <AP_VERSION> exe <hash of the executable>"),
 * so a rebuilt daemon never answers with an older build's bundles; kernel
 * keys hash the kernel source itself and are shared across builds. */
const char *ap_compiler_backend_id(const ap_compiler *c, bool gpu);

/* Graph key: the graph's named canonical hash (ap_graph_hash_named: a
 * bundle binds params by name), target ("sm_90a"), output kind
 * (resolved: never OUTPUT_DEFAULT), backend id, AP_VERSION, the schema
 * version and every option that can change the answer (cache_namespace,
 * max_block_threads, fusion level, fusion_barriers and keep_whole as
 * sets; not no_cache), each length-prefixed.  `opt` may be NULL.
 * 0, or AP_ENOMEM (no key: it must not be used). */
struct Apollo__CompileOptions;
int ap_compile_graph_key(const uint8_t graph_hash[32], const char *target, int output,
			 const struct Apollo__CompileOptions *opt, const char *backend_id,
			 uint8_t key[32]);
/* Kernel key: kernel source, entry name, target, output kind, backend id
 * and AP_VERSION, each length-prefixed.  0 or AP_ENOMEM. */
int ap_compile_kernel_key(const char *src, const char *entry, const char *target, int output,
			  const char *backend_id, uint8_t key[32]);

/* Parses a target: 0 and *gpu / *output_resolved set, or AP_EUNSUPPORTED
 * with `err` saying why ("cpu"; "sm_NN[a-z]" cubin or ptx; "compute_NN[a-z]"
 * ptx only).  `output` is the requested apollo.OutputKind. */
int ap_compile_parse_target(const char *target, int output, bool *gpu, int *output_resolved,
			    ap_error *err);

/* Internal, defined in server/backend/nvrtc.c (to move into backend.h):
 * the architectures NVRTC compiles for (75, 80, 90, ...), at most `cap`;
 * returns how many, 0 without NVRTC. */
int ap__nvrtc_archs(int *out, int cap);

#endif
