/* apollo.h -- libapollo-client: the public C API a training job or the
 * apollo-client command uses to talk to apollod and to read the bundle it
 * answers with.
 *
 * Approach: one blocking socket per ap_client (Unix socket by default, TCP
 * when asked), no event loop.  Each call sends one framed apollo.Envelope
 * (4-byte big-endian length + message, common/frame.h) and reads exactly one
 * reply frame whose length is checked against the client's maximum before
 * anything is allocated, and whose `id` must echo the request's.  A client
 * is not thread-safe: use one per thread.  A compile answer is kept as an
 * opaque ap_bundle; accessors hand out borrowed views into it (valid until
 * ap_bundle_free), so no protobuf type is needed to use the API.
 *
 * Keeping a connection.  An ap_client is a kept connection: connect once
 * (socket, handshake, peer check), submit every graph of the job through
 * it, free it at the end.  A warm submit through a kept connection costs
 * the daemon a cache lookup and one round trip, about 0.1 ms of CPU
 * (bench/warm.sh); a new process and connection per submit costs
 * milliseconds.  If the daemon closes the connection while it is idle
 * (its idle_timeout_ms) or restarts, the next call connects again once
 * and repeats its request (every request is idempotent), so a job may
 * keep one client for its whole life:
 *
 *     ap_client *c = ap_client_connect(NULL, &err);      // once per job
 *     for (int i = 0; i < n_graphs; i++) {
 *             ap_bundle *b = ap_client_submit_onnx_file(c, path[i], NULL, 0,
 *                                                       &opt, &err);
 *             ... run it, or keep it ...
 *             ap_bundle_free(b);
 *     }
 *     ap_client_free(c);
 *
 * ap_client_submit_onnx_file reads only the model's structure (the file
 * is mapped; the weights' pages are never touched), which is the fast
 * warm path; ap_client_submit_graph / _graph_pb send a graph already in
 * memory.
 *
 * Errors: every function that can fail returns a negative AP_E* code (or
 * NULL) and fills the caller's ap_error (which may be NULL) with what went
 * wrong and, for an error the daemon sent, the node/tensor it names.
 */
#ifndef AP_CLIENT_APOLLO_H
#define AP_CLIENT_APOLLO_H

#include <stdio.h>

#include "../common/base.h"
#include "../common/graph.h"

/* Largest reply a client accepts by default (bytes of one frame payload).
 * Bundles of host .so or cubin blobs for a large model run to tens of MiB;
 * ap_client_set_max_frame() changes it. */
#define AP_CLIENT_DEFAULT_MAX_FRAME ((uint32_t)256 << 20)

/* Output kinds, numbered as apollo.OutputKind. */
typedef enum ap_output_kind {
	AP_OUTPUT_DEFAULT = 0, /* ptx for compute_XX, cubin for sm_XX, so for cpu */
	AP_OUTPUT_PTX = 1,
	AP_OUTPUT_CUBIN = 2,
	AP_OUTPUT_SO = 3,
} ap_output_kind;

typedef struct ap_client ap_client;
typedef struct ap_bundle ap_bundle;

/* ---- connection ---------------------------------------------------------- */

/* How to reach and whom to trust (ap_client_connect_opts). */
typedef struct ap_connect_options {
	const char *token;        /* TCP: the daemon's tcp_token (required there);
				     never sent: both sides prove they know it */
	const char *daemon_user;  /* Unix: also accept a daemon running as this
				     user (name or uid); NULL = $APOLLO_DAEMON_USER */
} ap_connect_options;

/* Connects to apollod and performs the version handshake (Hello ->
 * HelloReply, schema version 1).  `addr`:
 *   NULL or ""          the default socket (ap_default_socket_path:
 *                       $APOLLO_SOCKET, else $XDG_RUNTIME_DIR/apollod.sock,
 *                       else /tmp/apollod-<uid>/apollod.sock);
 *   "unix:PATH" or any string holding a '/': a Unix socket path;
 *   "tcp:HOST:PORT" or "HOST:PORT": TCP (the daemon must have TCP enabled,
 *                       and opt->token is required).
 * On a Unix socket the daemon must run as this user, as root or as
 * opt->daemon_user (SO_PEERCRED): a socket someone else created is
 * refused before anything is sent.  Over TCP the token handshake
 * (common/frame.h) authenticates both sides.  `opt` may be NULL.
 * If the daemon later closes the connection while it is idle, the next
 * call opens it again (once) and repeats its request.
 * Returns NULL with `err`: AP_ETOOLARGE (path longer than a Unix socket
 * holds), AP_EIO (cannot connect, with the address and errno text; a
 * daemon of another user), AP_EINVAL (TCP without a token, unknown
 * daemon_user), AP_EVERSION (the daemon speaks another schema, or fails or
 * refuses the token handshake), AP_EBUSY (it serves too many clients),
 * AP_EFRAME/AP_EMESSAGE (a reply that is not a HelloReply), AP_ENOMEM. */
__ap_give ap_client *ap_client_connect_opts(const char *addr, const ap_connect_options *opt,
					    ap_error *err);
/* ap_client_connect_opts with no options. */
__ap_give ap_client *ap_client_connect(const char *addr, ap_error *err);
/* ap_client_connect_opts with opt->token = token (may be NULL). */
__ap_give ap_client *ap_client_connect_token(const char *addr, const char *token, ap_error *err);

/* Wraps an already connected stream socket `fd` (consumed: closed by
 * ap_client_free, and on failure); no peer check, no reconnection.  With
 * `handshake` false no Hello is sent (for tests with a fake server).
 * Errors as ap_client_connect. */
__ap_give ap_client *ap_client_from_fd(__ap_take int fd, bool handshake, ap_error *err);
/* As ap_client_from_fd; with a token the handshake is the authenticating
 * one (the peer must prove it knows the token). */
__ap_give ap_client *ap_client_from_fd_token(__ap_take int fd, bool handshake, const char *token,
					     ap_error *err);

/* Closes the socket and frees the client; accepts NULL, returns NULL. */
ap_client *ap_client_free(__ap_take ap_client *c);

/* Largest reply payload accepted, bytes (default AP_CLIENT_DEFAULT_MAX_FRAME). */
void ap_client_set_max_frame(ap_client *c, uint32_t max_bytes);
/* Send/receive timeout in milliseconds; 0 (the default) waits forever.
 * A timed-out call fails with AP_EIO and the connection is unusable.
 * Returns 0 or AP_EIO. */
int ap_client_set_timeout_ms(ap_client *c, unsigned ms);

/* A compile's progress as the daemon streams it (issue 26, item 4):
 * `stage` one of "import", "partition", "layer I", "layer II", "tuning",
 * "layer III", "codegen", "plan", "backend", "cache" (borrowed for the
 * call only), `done` of `total` units ("backend": kernels compiled or
 * found; 0 of 0 for a stage not counted), `elapsed_ms` since the daemon
 * received the request.  Called on the submitting thread, inside the
 * ap_client_submit_* call, before it returns; at most one event per stage
 * change and per ~100 ms within a stage.  A warm (cached) answer may come
 * with none. */
typedef void (*ap_progress_fn)(void *user, const char *stage, unsigned done, unsigned total,
			       double elapsed_ms);
/* Asks for progress on this client's later submits: `fn` (NULL: stop
 * asking) is called with `user` (borrowed) for each event.  A daemon that
 * predates progress sends none.  Never fails. */
void ap_client_set_progress(ap_client *c, ap_progress_fn fn, void *user);

/* What the daemon said in its HelloReply ("" before a handshake).  Borrowed. */
const char *ap_client_server(const ap_client *c);        /* "apollod 0.1.0" */
const char *ap_client_nvrtc_version(const ap_client *c); /* "" when NVRTC is not loaded */
int ap_client_n_targets(const ap_client *c);
const char *ap_client_target(const ap_client *c, int i); /* NULL when out of range */

/* Round trip with a PingRequest.  `server` (may be NULL) receives the
 * PingReply's server string, truncated to `cap` bytes with a NUL.  Returns
 * 0 or AP_EIO / AP_EFRAME / AP_EMESSAGE / AP_ETOOLARGE, or the error the
 * daemon answered with. */
int ap_client_ping(ap_client *c, char *server, size_t cap, ap_error *err);

/* The daemon's counters (apollo.StatsReply). */
typedef struct ap_server_stats {
	uint64_t requests, errors, cache_hits, cache_misses, kernels_compiled;
	uint64_t cache_entries, cache_blob_bytes;
	unsigned clients, in_flight;
	double uptime_s;
} ap_server_stats;
/* Fills `out`.  Errors as ap_client_ping. */
int ap_client_stats(ap_client *c, ap_server_stats *out, ap_error *err);

/* Every metric of the daemon (StatsReply.metrics): the same families and
 * numbers its Prometheus endpoint (apollod --metrics) shows. */
typedef struct ap_metrics ap_metrics;
/* As ap_client_stats, also giving the metrics in *metrics (free with
 * ap_metrics_free).  Errors as ap_client_ping. */
int ap_client_stats_metrics(ap_client *c, ap_server_stats *out, __ap_give ap_metrics **metrics,
			    ap_error *err);
ap_metrics *ap_metrics_free(__ap_take ap_metrics *m);   /* accepts NULL, returns NULL */
/* The value of one sample: `name` is the family's name with a histogram
 * sample's suffix ("apollo_compile_duration_seconds_count"), `labels` its
 * labels as "k=v,k=v" in the daemon's order (NULL or "" for none).  0 and
 * *value, or AP_EINVAL when there is no such sample. */
int ap_metrics_value(const ap_metrics *m, const char *name, const char *labels, double *value);
/* The underlying apollo.StatsReply (for code that links protobuf-c). */
const struct Apollo__StatsReply *ap_metrics_pb(const ap_metrics *m);

/* ---- tuning measurements (apollo-client tune) --------------------------- */

/* Candidates a tuning record offers per kernel (apollod's AP_TUNE_TOP):
 * the values of ap_submit_options.tune_variant are 1 to this. */
#define AP_TUNE_CANDIDATES 4

/* One timed candidate: a launch part's tuning signature and schedule
 * (ap_bundle_launch_part of a bundle compiled with tune_variant), and the
 * median time of its launch on the local GPU. */
typedef struct ap_tune_measurement {
	uint8_t signature[32];
	const char *schedule;        /* borrowed */
	double time_us;              /* median of `runs` timed launches, microseconds */
	unsigned runs;
} ap_tune_measurement;

/* Sends measurements taken on the device named `device` (sm_count SMs)
 * for bundles compiled for `target` (apollo.TuneReport); the daemon checks
 * every one before storing any, then keeps the fastest schedule of each
 * signature as a measured tuning record that later builds for `target`
 * use.  *records (may be NULL) gets the records stored.  0, or the
 * daemon's error (AP_EINVAL naming the refused measurement and why,
 * AP_ETOOLARGE, AP_EUNSUPPORTED), or a transport error as ap_client_ping. */
int ap_client_tune_report(ap_client *c, const char *target, const char *device,
			  unsigned sm_count, const ap_tune_measurement *m, int n,
			  unsigned *records, ap_error *err);

/* sizeof the struct named `name` (ap_error, ap_tensor, ap_graph,
 * ap_submit_options, ap_server_stats, ap_bundle_stats, ap_bundle_buffer,
 * ap_runtime_options), 0 for any other name: language bindings that
 * mirror these structs check their copies against it at load time
 * (client/abi.c). */
size_t ap_abi_sizeof(const char *name);

/* Field i (0-based, declaration order) of the struct named `type` (one
 * of ap_abi_sizeof's): its name (static storage), and its byte offset in
 * *offset when offset is not NULL; NULL past the last field or for
 * another type.  Bindings compare their field lists with it, name and
 * offset, at load time: a field one side lacks fails the import even
 * where it fits in padding and the sizes agree. */
const char *ap_abi_field(const char *type, int i, size_t *offset);

/* ---- compiling ------------------------------------------------------------ */

/* How much the partitioner may fuse, numbered as apollo.FusionLevel. */
typedef enum ap_fusion_level {
	AP_FUSION_DEFAULT = 0,       /* the daemon's default (apollo) */
	AP_FUSION_NONE = 1,          /* one kernel per primitive */
	AP_FUSION_RULES = 2,         /* elementwise/broadcast/reduction rules only */
	AP_FUSION_APOLLO = 3,        /* every rule and what later layers add */
} ap_fusion_level;

/* The GPU a bundle will run on, as its CUDA driver reports it
 * (apollo.DeviceInfo).  Named in a request, it selects that device's
 * measured tuning records (apollo-client tune) and is part of the cache
 * key; a tuning report may only name a device its client named so. */
typedef struct ap_device_info {
	char name[128];              /* cuDeviceGetName */
	unsigned sm_count;           /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
	unsigned cc_major, cc_minor; /* compute capability */
	unsigned driver_version;     /* cuDriverGetVersion: 1000 * major + 10 * minor */
} ap_device_info;

/* Asks the CUDA driver ($APOLLO_LIBCUDA, else libcuda.so.1, loaded for the
 * call only) about device `ordinal`: name, multiprocessor count, compute
 * capability and the driver's version (0 when the driver lacks
 * cuDriverGetVersion).  0 with *out filled; AP_EUNSUPPORTED (no driver, or
 * one without those calls) or AP_EIO (no such device, a driver error),
 * with *out zeroed and `err` saying which.  Source: the CUDA driver API
 * (cuDeviceGetName, cuDeviceGetAttribute, cuDriverGetVersion). */
int ap_device_probe(int ordinal, ap_device_info *out, ap_error *err);

typedef struct ap_submit_options {
	const char *target;          /* "cpu", "sm_90", "sm_90a", "compute_80", or
					"host:sm_90" (that GPU's kernels emulated on
					the host); NULL = "cpu" */
	ap_output_kind output;       /* AP_OUTPUT_DEFAULT picks per target */
	bool no_cache;               /* compile even when the cache holds an answer */
	const char *cache_namespace; /* NULL = "" */
	unsigned max_block_threads;  /* 0 = the compiler's default */
	ap_fusion_level fusion;
	int n_fusion_barriers;       /* node names that must start a new kernel */
	const char *const *fusion_barriers;
	int n_keep_whole;            /* op types never to open into primitives */
	const char *const *keep_whole;
	bool allow_tf32;             /* float32 products may run on TF32 tensor cores
					(10-bit mantissa operands); off by default */
	bool no_layer1;              /* Layer I off: pooling windows stay kernels of
					their own (to compare with it on) */
	bool no_tune;                /* every kernel on its emitter's default rule
					(no tuning record, no search) */
	bool tma;                    /* sm_90a: GEMM tiles filled by TMA where the
					operands allow (CompileOptions.tma; not yet
					run on a GPU) */
	unsigned tune_variant;       /* 1..4: every tuned kernel on the i-th candidate
					of its tuning record, each in a launch of its
					own, for timing (apollo-client tune); 0 = the
					chosen configurations */
	const ap_device_info *device; /* GPU targets: where the bundle will run
					(borrowed); NULL = not said; a name without a
					driver version, or a driver version alone
					(--driver-version), is sent as it is */
	bool host_check;             /* host targets (cpu, host:sm_XX): kernels in the
					checking mode; the runtime fails a run on a
					race, a cp.async read before arrival, an
					out-of-bounds or misaligned access */
	bool unvalidated;            /* the forms not yet run on a GPU wherever they
					fit (sm_90a: the GEMMs' TMA form, as tma, and
					the attention forward's overlap), for the
					device kit to validate them
					(CompileOptions.unvalidated) */
} ap_submit_options;

/* Sends graph `g` (its structure: PARAM tensors travel as shape and dtype
 * only) for compilation and waits for the answer.  `opt` may be NULL
 * (target cpu, defaults).  Returns the bundle, or NULL with `err`: the
 * daemon's error (its code mapped to AP_E*, message, node and tensor), or a
 * transport error as ap_client_ping, or AP_ENOMEM. */
__ap_give ap_bundle *ap_client_submit_graph(ap_client *c, __ap_keep const ap_graph *g,
					    const ap_submit_options *opt, ap_error *err);

/* As ap_client_submit_graph, for a serialized apollo.Graph (`buf`, `len`
 * bytes), sent as it decodes.  AP_EMESSAGE when the bytes are not a Graph. */
__ap_give ap_bundle *ap_client_submit_graph_pb(ap_client *c, const uint8_t *buf, size_t len,
					       const ap_submit_options *opt, ap_error *err);

/* Sends a serialized ONNX ModelProto for the daemon to import (its
 * initializers are dropped there, so prefer importing locally with
 * ap_onnx_import and submitting the graph).  `bindings` (n_bindings, may be
 * 0) give shapes of inputs with symbolic dims and values of integer inputs,
 * as for ap_onnx_import; their data travels only when a binding is an
 * integer tensor of at most AP_CONST_MAX_BYTES.  Errors as
 * ap_client_submit_graph. */
__ap_give ap_bundle *ap_client_submit_onnx(ap_client *c, const uint8_t *buf, size_t len,
					   const ap_host_tensor *const *bindings, int n_bindings,
					   const ap_submit_options *opt, ap_error *err);

/* Imports the ONNX model in the file at `path` here, from its structure
 * alone (the file is mapped, not read: ap_file_map; the weights' bytes are
 * never read, decoded nor copied -- ap_onnx_import without a parameter
 * store), and submits the graph as ap_client_submit_graph.  Bindings as
 * for ap_onnx_import; tensors with external data are looked for in the
 * file's folder (ap_onnx_import_dir; weights are never read).  The warm path of a training job: with one ap_client
 * kept for the job's life and used for each of its graphs, a warm submit
 * costs the import of the structure (about 0.1 ms for a 6 MB model) and
 * one round trip.  Errors: the file's (AP_EIO, AP_ETOOLARGE over 4 GiB),
 * the importer's, or as ap_client_submit_graph. */
__ap_give ap_bundle *ap_client_submit_onnx_file(ap_client *c, const char *path,
						const ap_host_tensor *const *bindings,
						int n_bindings, const ap_submit_options *opt,
						ap_error *err);

/* Maps a whole file of at most `max` bytes read-only into memory (pages
 * are read only when touched).  0 with *buf and *len (an empty file: a
 * valid empty buffer), or AP_EIO (cannot open or map it, not a regular
 * file), AP_ETOOLARGE (over `max`).  Release with ap_file_unmap.  As with
 * any mapping, a file truncated by someone else while mapped makes a read
 * past its new end fault (SIGBUS): map files that are not being rewritten. */
int ap_file_map(const char *path, size_t max, const uint8_t **buf, size_t *len, ap_error *err);
void ap_file_unmap(const uint8_t *buf, size_t len);

/* ---- bundles ---------------------------------------------------------------- */

/* A kernel of a bundle (borrowed views, valid until ap_bundle_free). */
typedef struct ap_bundle_kernel {
	const char *name;        /* entry point (extern "C" symbol) */
	const char *target;
	ap_output_kind format;
	const uint8_t *blob;     /* PTX text, cubin or host .so */
	size_t blob_bytes;
	unsigned grid[3], block[3]; /* 1 where the bundle gave fewer than 3 values */
	unsigned smem_bytes;     /* dynamic shared memory, bytes */
	int n_params;
	int n_nodes;
	const char *const *nodes; /* graph nodes fused into this kernel */
} ap_bundle_kernel;

typedef struct ap_bundle_param {
	const char *name;
	ap_dtype dtype;
	bool written;
} ap_bundle_param;

typedef enum ap_bundle_buffer_kind {
	AP_BUNDLE_BUF_INPUT = 0,
	AP_BUNDLE_BUF_OUTPUT = 1,
	AP_BUNDLE_BUF_PARAM = 2,
	AP_BUNDLE_BUF_INTERMEDIATE = 3,
	AP_BUNDLE_BUF_CONST = 4,   /* a graph constant whose bytes the bundle carries;
				      the runtime binds it itself */
} ap_bundle_buffer_kind;  /* numbered as apollo.BufferKind */

typedef struct ap_bundle_buffer {
	const char *name;
	ap_bundle_buffer_kind kind;
	ap_dtype dtype;
	int rank;                /* -1 when the bundle gives more than AP_MAX_RANK dims */
	int64_t dims[AP_MAX_RANK];
	uint64_t bytes;
	uint64_t offset;         /* INTERMEDIATE: byte offset in the workspace */
	int index;               /* INPUT/OUTPUT: position among graph inputs/outputs */
} ap_bundle_buffer;

/* Where an answer came from, numbered as apollo.CacheTier. */
typedef enum ap_cache_tier {
	AP_TIER_COMPILED = 0,   /* compiled for this request */
	AP_TIER_L1 = 1,         /* the daemon's local cache */
	AP_TIER_L2 = 2,         /* the shared cache (Redis): a remote hit */
	AP_TIER_SHARED = 3,     /* an identical request in flight compiled it */
} ap_cache_tier;

/* apollo.Stats: sizes in bytes, times in milliseconds (daemon wall time).
 * `kernels` counts launches in the plan (compare with eager_kernels);
 * `distinct_kernels` the entries of Bundle.kernels (identical kernels are
 * shared between launches). */
typedef struct ap_bundle_stats {
	unsigned kernels, eager_kernels, nodes, kernels_compiled, distinct_kernels;
	/* micro-graphs changed by the fusion layers: I (polyhedral loop
	 * fusion), II (memory stitching: stitched micro-graphs made), III
	 * (parallelism stitching: micro-graphs put in shared launches) */
	unsigned layer1, layer2, layer3;
	uint64_t global_bytes, eager_bytes, min_bytes;
	double import_ms, partition_ms, codegen_ms, backend_ms, cache_ms, compile_ms;
	bool cache_hit;              /* answered from a cache tier or a flight */
	ap_cache_tier cache_tier;    /* where the answer came from */
	unsigned kernels_remote;     /* a compiled answer's kernels taken from L2 */
	unsigned kernels_shared;     /* ... compiled for another request in flight */
	double layer1_ms;            /* Layer I (isl), part of codegen_ms */
	/* tuning (server/tune): kernels configured from a tuning record
	 * (measured ones among them), kernels searched, configurations
	 * evaluated, search time (part of codegen_ms) */
	unsigned tune_hits, tune_measured, tune_searched, tune_tried;
	double tune_ms;
	unsigned tune_capped;        /* searches the daemon's time limit cut short
					(a loaded machine's bundle, not cached) */
	/* device memory of one run of the plan, bytes: what
	 * ap_bundle_peak_bytes, ap_bundle_input_bytes, ap_bundle_output_bytes
	 * and ap_bundle_const_bytes return (set even when the bundle carries
	 * no Stats) */
	uint64_t peak_bytes, input_bytes, output_bytes, const_bytes;
} ap_bundle_stats;

/* The name of a tier: "compiled", "l1", "l2", "shared". */
const char *ap_cache_tier_name(ap_cache_tier t);

ap_bundle *ap_bundle_free(__ap_take ap_bundle *b);   /* accepts NULL, returns NULL */

/* Decodes a serialized apollo.Bundle (e.g. written by `apollo-client submit
 * -o`).  NULL with AP_EMESSAGE / AP_ENOMEM. */
__ap_give ap_bundle *ap_bundle_unpack(const uint8_t *buf, size_t len, ap_error *err);
/* Serializes the bundle into a malloc'd buffer (*out, *len).  0 or AP_ENOMEM. */
int ap_bundle_pack(const ap_bundle *b, __ap_give uint8_t **out, size_t *len);

const char *ap_bundle_target(const ap_bundle *b);
ap_output_kind ap_bundle_format(const ap_bundle *b);

/* Device memory of one run of the bundle's plan, in bytes (issue 24,
 * item 2: "memory no worse than eager").  `b` is borrowed and must not be
 * NULL; nothing is allocated; these never fail.
 *
 * ap_bundle_workspace_bytes: the one workspace holding every
 *   intermediate (BUF_INTERMEDIATE) at its offset.  The daemon lays it
 *   out by liveness: an intermediate occupies its 256-byte aligned range
 *   from the launch that writes it to the last launch that reads it, and
 *   later intermediates reuse that range (first fit).  The runtime
 *   allocates it whole, once per stream it runs the bundle on (a GPU
 *   runtime takes 256 bytes when it is 0).
 * ap_bundle_peak_bytes: the most device bytes held at once while the plan
 *   runs: inputs + outputs + constants + the workspace.  The workspace is
 *   held whole for the run, so the figure is the same at every launch;
 *   it is the intermediates' live maximum plus first fit's gaps, which a
 *   per-launch sum of live intermediates would leave out.  Not counted:
 *   parameters (the caller binds its weights where they already are, as
 *   an eager run holds them), kernel code and the workspaces of other
 *   streams.
 * ap_bundle_input_bytes: the graph inputs' buffers (BUF_INPUT).
 * ap_bundle_output_bytes: the graph outputs' buffers (BUF_OUTPUT; an
 *   output that is also an input is counted with the inputs).  A training
 *   forward's outputs include the tensors it saves for its backward, so
 *   this is the state a forward bundle hands on.
 * ap_bundle_const_bytes: the constants the bundle carries (BUF_CONST),
 *   which the runtime allocates and fills itself.
 *
 * Peak, inputs, outputs and constants are the daemon's figures
 * (apollo.Stats) when it sent them; for a bundle from a daemon before
 * them (all four 0), the same computed here from the bundle's buffers and
 * workspace_bytes.  Sums stop at UINT64_MAX (sizes no runtime accepts). */
uint64_t ap_bundle_workspace_bytes(const ap_bundle *b);
uint64_t ap_bundle_peak_bytes(const ap_bundle *b);
uint64_t ap_bundle_input_bytes(const ap_bundle *b);
uint64_t ap_bundle_output_bytes(const ap_bundle *b);
uint64_t ap_bundle_const_bytes(const ap_bundle *b);
/* 32 bytes of canonical graph hash; *len receives its length (0 when absent). */
const uint8_t *ap_bundle_graph_hash(const ap_bundle *b, size_t *len);

int ap_bundle_n_kernels(const ap_bundle *b);
/* Fills `out` for kernel `i`; 0 or AP_EINVAL when `i` is out of range. */
int ap_bundle_kernel_get(const ap_bundle *b, int i, ap_bundle_kernel *out);
/* Parameter `p` of kernel `k`; 0 or AP_EINVAL. */
int ap_bundle_kernel_param(const ap_bundle *b, int k, int p, ap_bundle_param *out);

int ap_bundle_n_launches(const ap_bundle *b);
/* Launch `i` of the plan: its kernel index and `*n_args` buffer indices
 * (borrowed).  0 or AP_EINVAL when `i` is out of range. */
int ap_bundle_launch(const ap_bundle *b, int i, unsigned *kernel, int *n_args,
		     const uint32_t **args);
/* The imported (ONNX) node names fused into launch `i` (borrowed; *n may be
 * 0) and its micro-graph's category ("elementwise", "reduction", ...; ""
 * when the daemon gave none).  0 or AP_EINVAL. */
int ap_bundle_launch_nodes(const ap_bundle *b, int i, int *n, const char *const **nodes,
			   const char **category);

/* Fusion layers as bits of ap_bundle_launch_part.layers and
 * ap_bundle_launch_layers(). */
#define AP_BUNDLE_LAYER_I 1u
#define AP_BUNDLE_LAYER_II 2u
#define AP_BUNDLE_LAYER_III 4u

/* One micro-graph of a launch (apollo.LaunchPart; borrowed strings): a
 * launch covers one, or several when Layer III launched independent ones
 * together, each on its range of blocks. */
typedef struct ap_bundle_launch_part {
	const char *category;            /* its kind ("reduction", "stitched", ...) */
	int n_nodes;
	const char *const *nodes;        /* imported node names it computes */
	unsigned block_begin, blocks;    /* its blocks: [block_begin, block_begin + blocks) */
	unsigned layers;                 /* AP_BUNDLE_LAYER_* bits */
	const char *detail;              /* what those layers did ("" if nothing) */
	const char *emitter;             /* the kernel shape that built it ("gemm",
					    "attention", "stitched", ...; "" if none) */
	const char *schedule;            /* its configuration, "knob=value ..." */
	double recompute;                /* modelled evaluations per element of its most
					    recomputed intermediate (0: not modelled) */
	const char *layer1;              /* Layer I's plan as text ("" when Layer I did
					    not schedule it): tile, threads, and isl's
					    domain, reads, writes, schedule tree */
	const uint8_t *tune_signature;   /* 32 bytes: its tuning signature when a tuning
					    record or search chose `schedule`; NULL if not */
} ap_bundle_launch_part;
/* Parts of launch `i` (0 when the daemon gave none, or i is out of range). */
int ap_bundle_launch_n_parts(const ap_bundle *b, int i);
/* Part `j` of launch `i`; 0 or AP_EINVAL. */
int ap_bundle_launch_part_get(const ap_bundle *b, int i, int j, ap_bundle_launch_part *out);
/* The fusion layers that built launch `i` (AP_BUNDLE_LAYER_* bits), and
 * its modelled global-memory bytes in *bytes when not NULL; 0 when i is out
 * of range. */
unsigned ap_bundle_launch_layers(const ap_bundle *b, int i, uint64_t *bytes);

/* Why two launches were not fused: one row per producer/consumer edge
 * between launches (borrowed strings). */
typedef struct ap_bundle_boundary {
	unsigned producer, consumer;   /* launch indices */
	const char *tensor;            /* the tensor crossing the boundary */
	const char *reason;            /* short key: "opaque", "cycle", "rule", ... */
	const char *detail;            /* one sentence */
} ap_bundle_boundary;
int ap_bundle_n_boundaries(const ap_bundle *b);
int ap_bundle_boundary_get(const ap_bundle *b, int i, ap_bundle_boundary *out);

int ap_bundle_n_buffers(const ap_bundle *b);
int ap_bundle_buffer_get(const ap_bundle *b, int i, ap_bundle_buffer *out);

/* Fills `out` from the bundle's apollo.Stats: zeros when it carries none,
 * but for the memory figures (peak_bytes, input_bytes, output_bytes,
 * const_bytes), which are always those of the accessors above. */
void ap_bundle_stats_get(const ap_bundle *b, ap_bundle_stats *out);

/* The underlying apollo.Bundle message (for code that links protobuf-c). */
const struct Apollo__Bundle *ap_bundle_pb(const ap_bundle *b);
/* The blob kernel k of `pb` runs from: its own, or, when its blob_of is
 * set, that of the earlier kernel it names (kernels compiled as one
 * program share one blob).  NULL when k is out of range or blob_of does
 * not name an earlier kernel with a blob of its own. */
const struct ProtobufCBinaryData *ap_bundle_pb_kernel_blob(const struct Apollo__Bundle *pb, size_t k);
/* Wraps a decoded apollo.Bundle; `pb` is consumed (freed with
 * apollo__bundle__free_unpacked, so it must come from apollo__bundle__unpack). */
__ap_give ap_bundle *ap_bundle_from_pb(__ap_take struct Apollo__Bundle *pb);

/* ---- low level: frames on a blocking socket ---------------------------------- */

/* Writes one frame (header + `len` payload bytes), retrying short writes and
 * EINTR, without SIGPIPE.  0, AP_ETOOLARGE (len 0 or over 4 GiB - 1), AP_EIO. */
int ap_client_write_frame(int fd, const uint8_t *buf, size_t len, ap_error *err);
/* Reads one frame.  The length is checked against `max` before the payload
 * buffer is allocated.  On success *out (malloc'd, caller frees) and *len.
 * Errors: AP_EIO (connection closed before a header, read error, timeout),
 * AP_EFRAME (zero length, connection closed mid-frame), AP_ETOOLARGE (length
 * over `max`), AP_ENOMEM. */
int ap_client_read_frame(int fd, uint32_t max, __ap_give uint8_t **out, uint32_t *len,
			 ap_error *err);

/* The AP_E* code for an apollo.ErrorCode value (AP_EINTERNAL for unknown). */
int ap_client_error_from_wire(int wire_code);

#endif
