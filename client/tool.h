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

typedef struct ap_onnx_io {
	int n_inputs;         /* graph inputs that are not initializers, in order */
	char **inputs;
	ap_dtype *input_dtype;  /* AP_DT_UNDEF when not one Apollo knows */
	char **input_symbolic;  /* NULL when the shape is static; else the first
				   symbolic dim's name ("?" when unnamed or no shape) */
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
 * eager_bytes, min_bytes (bytes), workspace_bytes, buffers, blob_bytes,
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

#endif
