/* tool.h -- the pieces of the apollo-client command that deserve their own
 * tests, kept in libapollo-client so that tests/check_client.c reaches them:
 * comparing a computed tensor with a reference (compare.c), reading the
 * input/output lists of an ONNX model (onnx_io.c), reading ONNX backend-test
 * folders (testdata.c), and printing a bundle as text or JSON (report.c).
 */
#ifndef AP_CLIENT_TOOL_H
#define AP_CLIENT_TOOL_H

#include <stdio.h>

#include "apollo.h"
#include "runtime.h"

/* ---- comparison (compare.c) ----------------------------------------------- */

/* Tolerances of ONNX's backend-test runner (numpy.testing.assert_allclose). */
#define AP_COMPARE_RTOL 1e-3
#define AP_COMPARE_ATOL 1e-7

/* The rule of numpy's assert_allclose: |a - b| <= atol + rtol * |b|, with
 * `b` the reference; NaN equals NaN; an infinity equals only the same-signed
 * infinity. */
bool ap_compare_close(double a, double b, double rtol, double atol);

typedef struct ap_compare_result {
	bool ok;
	char why[256];       /* a structural mismatch (dtype, shape), else "" */
	double max_abs_err;  /* largest |got - want| over the elements (inf for a
				NaN/inf mismatch); 0 for an empty tensor */
	int64_t max_at;      /* flat index of it, -1 when there is none */
	int64_t n_bad;       /* elements outside the tolerance */
	int64_t first_bad;   /* flat index of the first one, -1 when none */
	double max_rel_err;  /* largest |got - want| / |want| over the elements
				whose reference is finite and non-zero; 0 if none */
	int64_t worst_at;    /* flat index of the element furthest outside (or
				nearest the edge of) the tolerance: the largest
				|got - want| / (atol + rtol |want|) (a NaN/inf
				mismatch counts as infinite); -1 for an empty tensor */
} ap_compare_result;

/* Compares `got` with the reference `want` element by element.  Shapes
 * (rank and every dim) and dtypes must be equal; integer and bool tensors
 * must match exactly; float32/float64 by ap_compare_close.  Fills `r` and
 * returns r->ok. */
bool ap_compare_tensors(__ap_keep const ap_host_tensor *got, __ap_keep const ap_host_tensor *want,
			double rtol, double atol, ap_compare_result *r);

/* Writes the multi-index of flat element `flat` of a tensor with `rank`
 * `dims` ("[0,3,1]"; "[]" for a scalar) into `buf`. */
void ap_compare_format_index(int rank, const int64_t *dims, int64_t flat, char *buf, size_t cap);

/* ---- ONNX model inputs and outputs (onnx_io.c) --------------------------- */

/* A graph input's shape as the model declares it. */
typedef struct ap_onnx_shape {
	int rank;                 /* -1: no shape declared (or over AP_MAX_RANK) */
	int64_t dims[AP_MAX_RANK];  /* -1: a symbolic (or unknown) dimension */
	char *sym[AP_MAX_RANK];   /* a symbolic dimension's dim_param (owned); NULL
				     for a fixed or an unnamed one */
	int64_t index_bound;      /* an integer input read as the indices of a
				     Gather whose data's dimension along its axis
				     the model states: the smallest such dimension
				     (indices in [0, bound) are valid); 0 unknown */
} ap_onnx_shape;

typedef struct ap_onnx_io {
	int n_inputs;         /* graph inputs that are not initializers, in order */
	char **inputs;
	ap_dtype *input_dtype;  /* AP_DT_UNDEF when not one Apollo knows */
	char **input_symbolic;  /* NULL when the shape is static; else the first
				   symbolic dim's name ("?" when unnamed or no shape) */
	ap_onnx_shape *input_shape;  /* the declared shapes, one per input */
	int n_outputs;
	char **outputs;
} ap_onnx_io;

/* Reads the input and output lists of a serialized ONNX ModelProto from
 * its structure alone (ap_onnx_skeleton: the weights' bytes are never
 * read), decoded with protobuf-c from proto/onnx.proto (the importer's
 * decoder).  Returns 0 with *out, or AP_EMESSAGE (not a ModelProto /
 * truncated), ap_onnx_skeleton's AP_EINVAL / AP_EUNSUPPORTED naming a
 * tensor, AP_ENOMEM. */
int ap_onnx_io_read(const uint8_t *buf, size_t len, __ap_give ap_onnx_io **out, ap_error *err);
ap_onnx_io *ap_onnx_io_free(__ap_take ap_onnx_io *io);
/* Position of input `name` among io's inputs, or -1. */
int ap_onnx_io_input(const ap_onnx_io *io, const char *name);

/* ---- files and backend-test folders (testdata.c) ------------------------- */

/* Reads a whole file of at most `max` bytes.  0 with *buf (malloc'd) and
 * *len, or AP_EIO (with the path and errno text), AP_ETOOLARGE, AP_ENOMEM. */
int ap_file_read(const char *path, size_t max, __ap_give uint8_t **buf, size_t *len,
		 ap_error *err);
/* Writes `len` bytes to `path` (created or truncated).  0 or AP_EIO. */
int ap_file_write(const char *path, const uint8_t *buf, size_t len, ap_error *err);

/* The test_data_set_* folders of a backend-test folder, sorted by their
 * number.  0 with *names (each "DIR/test_data_set_N"; free with
 * ap_strv_free) and *n (may be 0), or AP_EIO. */
int ap_testdata_sets(const char *dir, __ap_give char ***names, int *n, ap_error *err);
/* Decodes SETDIR/PREFIX_0.pb, PREFIX_1.pb, ... up to the first missing one
 * (ap_onnx_tensor_decode).  0 with *ts (free with ap_host_tensors_free) and
 * *n, or the decoder's error naming the file, AP_EIO, AP_ENOMEM. */
int ap_testdata_load(const char *setdir, const char *prefix, __ap_give ap_host_tensor ***ts,
		     int *n, ap_error *err);
void ap_host_tensors_free(__ap_take ap_host_tensor **ts, int n);
void ap_strv_free(__ap_take char **v, int n);
/* A deep copy of `t`, renamed to `name` (NULL keeps the name). NULL on ENOMEM. */
__ap_give ap_host_tensor *ap_host_tensor_copy(const ap_host_tensor *t, const char *name);

/* Serializes `t` as one onnx.TensorProto (dims, data_type, raw_data; name
 * `name`, or t->name when NULL).  0 with *out (malloc'd) and *len, or
 * AP_EINVAL (a dtype without a size, negative dims, or nbytes that do not
 * match the shape), AP_ENOMEM. */
int ap_testdata_encode(const ap_host_tensor *t, const char *name, __ap_give uint8_t **out,
		       size_t *len, ap_error *err);
/* Writes SETDIR/PREFIX_K.pb (ap_testdata_encode), creating SETDIR (one
 * level) when missing.  0, or AP_EIO, AP_ETOOLARGE (path), the encoder's
 * errors. */
int ap_testdata_save(const char *setdir, const char *prefix, int k, const ap_host_tensor *t,
		     const char *name, ap_error *err);
/* Creates DIR (one level) and makes DIR/model.onnx a symbolic link to the
 * absolute path of `model` (replacing one that is there), so that DIR is a
 * backend-test folder for that model.  0 or AP_EIO, AP_ETOOLARGE. */
int ap_testdata_save_model(const char *dir, const char *model, ap_error *err);

/* ---- .npy files (npy.c) --------------------------------------------------- */

/* numpy's .npy format (numpy.lib.format), versions 1.0 and 2.0, read
 * strictly: little-endian float32 '<f4', float64 '<f8', float16 '<f2',
 * int64 '<i8', int32 '<i4', and uint8 '|u1', int8 '|i1', bool '|b1'; C
 * order (a Fortran-order array of rank >= 2 is refused); rank at most
 * AP_MAX_RANK and at most AP_MAX_ELEMENTS elements; a header of at most
 * 64 KiB holding exactly the keys descr, fortran_order and shape; data of
 * exactly shape x element size bytes; bool bytes 0 or 1.  Everything is
 * checked before the data is allocated.  Errors name the file (`what` for
 * bytes in memory) and what is wrong: AP_EINVAL (not a .npy file, a
 * malformed header, the data's size differs from the header's: truncated
 * or trailing bytes, a bool byte other than 0/1), AP_EUNSUPPORTED (another
 * format version, a dtype Apollo has no type for, big-endian, structured,
 * Fortran order, rank over AP_MAX_RANK), AP_ETOOLARGE (a header over 64
 * KiB, too many elements), AP_EIO (open/read), AP_ENOMEM. */

/* Decodes the .npy bytes buf[0..len) into *out (the caller's; its name
 * NULL). */
int ap_npy_decode(const uint8_t *buf, size_t len, const char *what,
		  __ap_give ap_host_tensor **out, ap_error *err);
/* Reads the .npy file at `path` into *out (the caller's), named `name`
 * (copied; may be NULL).  The header is read and checked first, then the
 * data is allocated and read (pread). */
int ap_npy_read(const char *path, const char *name, __ap_give ap_host_tensor **out,
		ap_error *err);
/* Encodes `t` as a version 1.0 .npy file (C order, the dtypes above; the
 * header padded so that the data starts at a multiple of 64 bytes):
 * *out (malloc'd) and *len.  AP_EUNSUPPORTED (bfloat16 and other dtypes
 * without a .npy type), AP_EINVAL (rank, dims, or nbytes not dims x
 * element size), AP_ENOMEM. */
int ap_npy_encode(const ap_host_tensor *t, __ap_give uint8_t **out, size_t *len, ap_error *err);
/* ap_npy_encode written to `path` (created or truncated).  Its errors,
 * AP_EIO. */
int ap_npy_write(const char *path, const ap_host_tensor *t, ap_error *err);
/* A tensor file given on the command line (--input NAME=FILE): a path
 * ending in ".npy" is read by ap_npy_read, anything else as one serialized
 * onnx.TensorProto (ap_onnx_tensor_decode, at most 4 GiB; no external
 * data).  *out is the caller's, named `name` (NULL keeps the file's own
 * name).  The readers' errors, each naming the file. */
int ap_tensor_file_read(const char *path, const char *name, __ap_give ap_host_tensor **out,
			ap_error *err);

/* ---- running a model (run.c, run_ort.c, run_save.c) ----------------------------- */

/* The tolerances of a comparison with another runtime's outputs on the
 * same random inputs (run --compare, check MODEL.onnx), by dtype: float32
 * rtol 1e-3, atol 1e-4 (as tests/differential.sh); float64 1e-5, 1e-8;
 * float16 1e-2, 1e-2; bfloat16 5e-2, 5e-2 (as tests/precision.sh);
 * integers and bool must match exactly (0, 0). */
void ap_compare_tolerance(ap_dtype dt, double *rtol, double *atol);

/* The folder of the file at `path` (for its external data): "." for a
 * bare file name, "/" for a file in the root, else the path up to its last
 * '/' copied into dir (cap bytes).  NULL when it does not fit. */
const char *ap_path_folder(const char *path, char *dir, size_t cap);

/* A tensor of random values for a graph input that no data was given for,
 * from a deterministic generator (splitmix64, Steele et al. 2014) seeded
 * by `seed` and the input's `position` among the model's inputs (so one
 * input's values do not change when another is given): floats uniform in
 * [-1, 1) (rounded to float16 / bfloat16 for those); bool 0 or 1; integers
 * (token ids, indices) in [0, index_bound) when the model says how far
 * they may go (ap_onnx_shape.index_bound: a Gather's data dimension), else
 * in [0, 4): small non-negative values, valid as indices of any axis of 4
 * or more.  dims: rank non-negative sizes, at most AP_MAX_ELEMENTS
 * elements.  0 with *out (the caller's, named `name`), or AP_EUNSUPPORTED
 * (a dtype without a size), AP_ETOOLARGE, AP_ENOMEM. */
int ap_run_random_tensor(const char *name, ap_dtype dt, int rank, const int64_t *dims,
			 uint64_t seed, int position, int64_t index_bound,
			 __ap_give ap_host_tensor **out, ap_error *err);

/* Binds a runtime for one run of a model: each INPUT buffer from `in`
 * (n_in tensors: the one at the position of the buffer's name among io's
 * inputs, else the one of that name, else the index-th that is not an
 * integer tensor, integer inputs having become constants at import), the
 * graph's constants (ap_runtime_bind_consts) and the weights `params`
 * (ap_runtime_bind_params).  All borrowed.  0, or AP_EINVAL (no data for
 * an input, naming it) or the runtime's binding errors, the message
 * prefixed "bind: ". */
int ap_run_bind(ap_runtime *rt, const ap_bundle *bundle, const ap_graph *g,
		const ap_params *params, const ap_onnx_io *io, ap_host_tensor *const *in, int n_in,
		ap_error *err);

/* What `apollo-client run` (and `check MODEL.onnx`) was asked for.  Every
 * pointer is borrowed for the call. */
typedef struct ap_run_options {
	const char *model;                /* the ONNX file; its external data beside it */
	ap_host_tensor *const *inputs;    /* data for graph inputs, by name (--input) */
	const char *const *input_files;   /* the file each came from, for messages (the
					     array and its entries may be NULL) */
	int n_inputs;
	ap_host_tensor *const *shapes;    /* shapes alone (ap_shape_binding_parse: --shape) */
	int n_shapes;
	uint64_t seed;                    /* of the random inputs (ap_run_random_tensor) */
	const ap_submit_options *submit;  /* target and compile options; NULL: cpu, defaults */
	const char *socket;               /* the daemon's address; NULL: the default */
	ap_connect_options connect;
	int threads;                      /* host threads per launch; 0: the runtime's */
	int device;                       /* CUDA device for GPU targets */
	bool compare;                     /* run onnxruntime on the same inputs and compare */
	double rtol, atol;                /* < 0: ap_compare_tolerance's for the dtype */
	const char *save_dir;             /* write a backend-test folder there (ap_run_save) */
	FILE *out;                        /* the report (NULL: stdout) */
} ap_run_options;

/* What a run found. */
typedef struct ap_run_result {
	int launches;         /* launches in the bundle's plan */
	int outputs;          /* outputs computed */
	int compared;         /* outputs compared with onnxruntime's */
	int mismatched;       /* of those, outputs outside the tolerance (or of another
				 shape or dtype) */
	bool no_reference;    /* --compare: onnxruntime (numpy, the script, Python)
				 could not be used: the error says how to get it */
} ap_run_result;

/* Runs the ONNX model o->model once, end to end: imports it with its
 * external data (ap_onnx_import_dir: the weights read into a parameter
 * store), each graph input bound to the data given for it (o->inputs) or
 * to random values (ap_run_random_tensor) of its declared shape, whose
 * symbolic dimensions come from o->shapes and from the shapes of the
 * other inputs that name the same dim_param; compiles the graph through
 * the daemon (o->submit's target, default cpu); runs the bundle with the
 * runtime (host threads, or the CUDA driver API for a GPU target); prints
 * to o->out the inputs, the plan's launch count and each output's name,
 * dtype, shape, min / max / mean and first values.  With o->compare it
 * runs the same model on the same inputs in onnxruntime (ap_ort_run) and
 * compares every output (ap_compare_tensors, ap_compare_tolerance unless
 * o->rtol / o->atol are set), printing the largest absolute and relative
 * errors and, for an output outside the tolerance, where its worst element
 * is and both values.  With o->save_dir it writes a backend-test folder
 * (ap_run_save) with onnxruntime's outputs when compared, else Apollo's.
 * Returns 0 when it ran (res->mismatched says whether the outputs
 * matched), or an error with `err`: AP_EINVAL / AP_ESHAPE (an input named
 * that the model lacks, a shape the model contradicts, a symbolic
 * dimension nothing binds, a dtype Apollo cannot take), the importer's,
 * the client's, the runtime's, ap_ort_run's (res->no_reference when
 * onnxruntime cannot be used), ap_run_save's, AP_ENOMEM. */
int ap_run_model(const ap_run_options *o, ap_run_result *res, ap_error *err);

/* Runs the ONNX model at `model` (its external data beside it) in
 * onnxruntime on the inputs `in` (n_in, in the order of io's inputs, each
 * named), by a Python script shipped with Apollo (tools/ort_reference.py,
 * or $APOLLO_ORT_REFERENCE) run with $APOLLO_PYTHON, else the .venv of
 * the source tree found from the executable (its ../.venv/bin/python) or
 * the current folder, else python3 on $PATH.  The inputs go as .npy files
 * in a private temporary folder (mkdtemp under $TMPDIR, else /tmp; mode
 * 0700; removed after), the outputs come back the same way, one per
 * model output in io's order.  0 with *out (n_out = io->n_outputs tensors,
 * each named after its output; free with ap_host_tensors_free), or
 * AP_EUNSUPPORTED with *unavailable set (no interpreter, no script,
 * onnxruntime or numpy cannot be imported: the message says how to
 * install it), AP_EINVAL (onnxruntime failed on the model: its message is
 * on stderr), ap_npy_write's and ap_npy_read's errors, AP_EIO (temporary
 * files, the process), AP_ENOMEM. */
int ap_ort_run(const char *model, const ap_onnx_io *io, ap_host_tensor *const *in, int n_in,
	       __ap_give ap_host_tensor ***out, int *n_out, bool *unavailable, ap_error *err);

/* Writes the run of a model as an ONNX backend-test folder that
 * `apollo-client check DIR` runs again: DIR/model.onnx (a copy of the
 * model's `len` bytes at `buf`, read from `model_path`), a copy of each
 * file of its external data at the same relative location
 * (ap_onnx_external_files), and DIR/test_data_set_0/input_K.pb (in[k],
 * the model's inputs in order) and output_K.pb (out[k]) as TensorProto
 * files (ap_testdata_encode).  DIR is created (its parent must exist), or
 * must be an empty folder: no file is overwritten (each is created with
 * O_EXCL).  0, or AP_EINVAL (DIR is not an empty folder), AP_EIO,
 * ap_onnx_external_files's and ap_testdata_save's errors, AP_ENOMEM. */
int ap_run_save(const char *dir, const char *model_path, const uint8_t *buf, size_t len,
		ap_host_tensor *const *in, int n_in, ap_host_tensor *const *out, int n_out,
		ap_error *err);

/* ---- reports (report.c) ----------------------------------------------------- */

typedef struct ap_report_info {
	const char *model;      /* what was submitted (a path), may be NULL */
	double import_ms;       /* client-side ONNX import, ms (0 when none) */
	double round_trip_ms;   /* submit call as the client saw it, ms */
	bool explain;           /* also report why launches were not fused */
} ap_report_info;

/* Writes `s` as a JSON string literal (quotes, escapes per RFC 8259). */
void ap_json_string(FILE *f, const char *s);
/* One JSON object on one line, ended by a newline: model, target, format,
 * kernels (launches in the plan), distinct_kernels (entries of
 * Bundle.kernels), eager_kernels, nodes, cache ("miss", "hit",
 * "remote-hit" from the shared cache, "shared-hit" from an identical
 * request in flight), cache_tier ("compiled", "l1", "l2", "shared"),
 * compile_ms, import_ms, partition_ms, codegen_ms, backend_ms, cache_ms
 * (daemon side), client_import_ms, round_trip_ms, kernels_compiled,
 * kernels_remote, kernels_shared, global_bytes,
 * eager_bytes, min_bytes (bytes), workspace_bytes, peak_bytes,
 * input_bytes, output_bytes, const_bytes (bytes of device memory of one
 * run: ap_bundle_peak_bytes and its kin), buffers, blob_bytes,
 * boundaries, graph_hash, kernel_list (name, nodes, grid, block,
 * smem_bytes, blob_bytes, params), launch_list (kernel index, name,
 * category, nodes: one entry per launch, in plan order).  With
 * info->explain also: per launch "reads" and "writes" (buffer indices, by
 * the kernel parameters' written flag), buffer_list (name, kind
 * input/output/param/intermediate, bytes) and boundary_list (producer,
 * consumer: launch indices; tensor, reason, detail). */
void ap_report_json(FILE *f, const ap_bundle *b, const ap_report_info *info);
/* `apollo-client stats --json`: one JSON object on one line, ended by a
 * newline: server, uptime_s, the counters of `s` (requests, errors,
 * cache_hits, cache_misses, kernels_compiled, cache_entries,
 * cache_blob_bytes, clients, in_flight), and "metrics": one entry per
 * family, keyed by its name, {"type", "help", "samples": [{"name" (with a
 * histogram sample's suffix), "labels": {k: v}, "value"}]} -- the numbers
 * of the daemon's Prometheus endpoint. */
void ap_report_stats_json(FILE *f, const char *server, const ap_server_stats *s,
			  const ap_metrics *m);
/* A human-readable summary: one line per launch (kernel, category, grid,
 * block, blob size, up to 6 fused nodes), then the stats.  With
 * info->explain the launches are listed as
 *   launch I KERNEL CATEGORY: NODE NODE ...   (every ONNX node)
 * and after the stats the boundaries, counted by reason, then one a line:
 *   launch P -> launch C via TENSOR: REASON (DETAIL) */
void ap_report_text(FILE *f, const ap_bundle *b, const ap_report_info *info);

/* ---- progress (progress.c) ------------------------------------------------- */

/* `apollo-client submit --progress`'s display of a compile's stages on
 * `f` (stderr): on a terminal one line redrawn in place ("\r", the line
 * cleared), else one plain line per event, "progress: STAGE[ DONE/TOTAL]
 * (MS ms)".  Zero it, set f and tty, pass it as the user of
 * ap_progress_print (an ap_progress_fn), and end with ap_progress_done. */
typedef struct ap_progress_line {
	FILE *f;
	bool tty;            /* redraw one line (isatty) */
	bool drawn;          /* a line is showing that ap_progress_done ends */
	unsigned events;     /* events printed */
} ap_progress_line;

/* An ap_progress_fn: prints one event as `user` (an ap_progress_line) says. */
void ap_progress_print(void *user, const char *stage, unsigned done, unsigned total,
		       double elapsed_ms);
/* Ends a redrawn line with a newline (nothing when none is showing). */
void ap_progress_done(ap_progress_line *p);

#endif
