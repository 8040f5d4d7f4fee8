/* run.c -- `apollo-client run MODEL.onnx`: the user's own model in one
 * command (issue 27, item 2), and `apollo-client check MODEL.onnx`, which
 * is the same run compared with onnxruntime.
 *
 * In: a model file (with its external data beside it), data for some of
 * its inputs (.npy or TensorProto files, read by the command), shapes for
 * others (--shape).  The steps, one function each, over one run_state:
 *   inputs   every graph input gets a tensor: the data given, else random
 *            values (ap_run_random_tensor) of its declared shape, whose
 *            symbolic dimensions are bound by --shape or by another input
 *            that names the same dim_param (batch, sequence);
 *   import   ap_onnx_import_dir with every input bound to its data (integer
 *            inputs become constants, as in `check`), the weights read into
 *            a parameter store;
 *   compile  the graph through the daemon, as `submit` sends it;
 *   execute  the bundle on the runtime (host threads, or the CUDA driver
 *            API for a GPU target), bound as `check` binds it (ap_run_bind);
 *   report   inputs, the plan's launch count, each output's summary;
 *   compare  (--compare) onnxruntime on the same inputs (run_ort.c), every
 *            output through ap_compare_tensors;
 *   save     (--save) a backend-test folder (run_save.c).
 * Out: the report on o->out and an ap_run_result; the outputs' match is
 * a result, not an error.
 */
#include "tool.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MODEL_BYTES ((size_t)2 << 30)
#define INT_RANGE_DEFAULT 4   /* integers drawn in [0, 4) when nothing bounds them */

/* ---- random inputs ------------------------------------------------------------------- */

/* splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
 * generators", OOPSLA 2014): the next 64 bits of the stream at *s. */
static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* The largest value of an integer dtype + 1, capped at 2^62. */
static int64_t int_limit(ap_dtype dt)
{
	switch (dt) {
	case AP_DT_I8: return 128;
	case AP_DT_U8: return 256;
	case AP_DT_I32: return (int64_t)1 << 31;
	default: return (int64_t)1 << 62;
	}
}

int ap_run_random_tensor(const char *name, ap_dtype dt, int rank, const int64_t *dims,
			 uint64_t seed, int position, int64_t index_bound, ap_host_tensor **out,
			 ap_error *err)
{
	size_t es = ap_dtype_size(dt);
	uint64_t s = seed ^ ((uint64_t)(position + 1) * 0xD1B54A32D192ED03ull);
	int64_t numel = 1, range = index_bound > 0 ? index_bound : INT_RANGE_DEFAULT;
	ap_host_tensor *t;

	*out = NULL;
	if (!es)
		return ap_error_set(err, AP_EUNSUPPORTED, NULL, name,
				    "input '%s' has dtype %s, which Apollo does not take", name,
				    ap_dtype_name(dt));
	if (rank < 0 || rank > AP_MAX_RANK)
		return ap_error_set(err, AP_EINVAL, NULL, name, "input '%s': rank %d", name, rank);
	for (int d = 0; d < rank; d++) {
		if (dims[d] < 0)
			return ap_error_set(err, AP_EINVAL, NULL, name,
					    "input '%s': dimension %d is %lld", name, d,
					    (long long)dims[d]);
		if (dims[d] && numel > AP_MAX_ELEMENTS / dims[d])
			return ap_error_set(err, AP_ETOOLARGE, NULL, name,
					    "input '%s': more than %lld elements", name,
					    (long long)AP_MAX_ELEMENTS);
		numel *= dims[d];
	}
	if (range > int_limit(dt))
		range = int_limit(dt);
	t = calloc(1, sizeof(*t));
	if (t) {
		t->name = ap_strdup(name);
		t->data = malloc(numel ? (size_t)numel * es : 1);
	}
	if (!t || !t->name || !t->data) {
		ap_host_tensor_free(t);
		return ap_error_set(err, AP_ENOMEM, NULL, name, "out of memory");
	}
	t->dtype = dt;
	t->rank = rank;
	memcpy(t->dims, dims, (size_t)rank * sizeof(int64_t));
	t->nbytes = (size_t)numel * es;
	(void)splitmix64(&s);
	for (int64_t i = 0; i < numel; i++) {
		uint64_t x = splitmix64(&s);
		double v;

		if (ap_dtype_is_floating(dt))
			v = (double)(x >> 11) * 0x1.0p-52 - 1.0;   /* [0, 2) - 1 */
		else if (dt == AP_DT_BOOL)
			v = (double)(x >> 63);
		else
			v = (double)(x % (uint64_t)range);
		ap_elem_set(t->data, dt, i, v);
	}
	*out = t;
	return 0;
}

/* ---- binding a runtime (shared with check) ---------------------------------------------- */

/* The data for the bundle's INPUT buffer `name` (graph input `index`):
 * the tensor at the model's position of that name, else one of that name,
 * else the index-th that is not an integer tensor (integer inputs become
 * constants at import). */
static const ap_host_tensor *input_data(const char *name, int index, const ap_onnx_io *io,
					ap_host_tensor *const *in, int n_in)
{
	int k = io ? ap_onnx_io_input(io, name) : -1, seen = 0;

	if (k >= 0 && k < n_in)
		return in[k];
	for (int i = 0; i < n_in; i++)
		if (in[i]->name && !strcmp(in[i]->name, name))
			return in[i];
	for (int i = 0; i < n_in; i++) {
		if (in[i]->dtype == AP_DT_I64 || in[i]->dtype == AP_DT_I32)
			continue;
		if (seen++ == index)
			return in[i];
	}
	return NULL;
}

/* Prefixes err's message with "prefix: " (cut to fit). */
static void error_prefix(ap_error *err, const char *prefix)
{
	char tmp[sizeof(err->msg)];
	size_t pl, tl;

	if (!err)
		return;
	memcpy(tmp, err->msg, sizeof(tmp));
	tmp[sizeof(tmp) - 1] = 0;
	pl = strnlen(prefix, sizeof(err->msg) - 3);
	tl = strnlen(tmp, sizeof(err->msg) - pl - 3);
	memcpy(err->msg, prefix, pl);
	memcpy(err->msg + pl, ": ", 2);
	memcpy(err->msg + pl + 2, tmp, tl);
	err->msg[pl + 2 + tl] = 0;
}

int ap_run_bind(ap_runtime *rt, const ap_bundle *bundle, const ap_graph *g,
		const ap_params *params, const ap_onnx_io *io, ap_host_tensor *const *in, int n_in,
		ap_error *err)
{
	int rc;

	for (int i = 0; i < ap_bundle_n_buffers(bundle); i++) {
		ap_bundle_buffer bf;
		const ap_host_tensor *t;

		ap_bundle_buffer_get(bundle, i, &bf);
		if (bf.kind != AP_BUNDLE_BUF_INPUT)
			continue;
		t = input_data(bf.name, bf.index, io, in, n_in);
		if (!t)
			return ap_error_set(err, AP_EINVAL, NULL, bf.name,
					    "no test data for graph input %d '%s'", bf.index, bf.name);
		if ((rc = ap_runtime_bind_input(rt, bf.index, t, err)) < 0) {
			error_prefix(err, "bind");
			return rc;
		}
	}
	if ((rc = ap_runtime_bind_consts(rt, g, err)) < 0 ||
	    (rc = ap_runtime_bind_params(rt, params, err)) < 0) {
		error_prefix(err, "bind");
		return rc;
	}
	return 0;
}

/* ---- the run ---------------------------------------------------------------------------- */

typedef struct run_state {
	const ap_run_options *o;
	FILE *out;
	const uint8_t *buf;        /* the mapped model */
	size_t len;
	ap_onnx_io *io;
	ap_host_tensor **in;       /* one per model input, in io's order */
	bool *random;              /* in[k] was drawn, not given */
	ap_graph *g;
	ap_params *params;
	ap_client *c;
	ap_bundle *bundle;
	ap_runtime *rt;
	ap_host_tensor **got;      /* Apollo's outputs */
	int n_got;
	ap_host_tensor **want;     /* onnxruntime's */
	int n_want;
	double compile_ms, run_ms;
} run_state;

/* A symbolic dimension's size, bound by an input that names it. */
typedef struct sym_size {
	const char *name, *input;
	int64_t size;
} sym_size;

static int find_index(ap_host_tensor *const *t, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (t[i]->name && !strcmp(t[i]->name, name))
			return i;
	return -1;
}

static const ap_host_tensor *find_named(ap_host_tensor *const *t, int n, const char *name)
{
	int i = find_index(t, n, name);

	return i < 0 ? NULL : t[i];
}

/* Where the data given for input `name` came from, for messages: its file,
 * else "--input NAME". */
static const char *data_source(const ap_run_options *o, const char *name, char *buf, size_t cap)
{
	int i = find_index(o->inputs, o->n_inputs, name);

	if (i >= 0 && o->input_files && o->input_files[i])
		return o->input_files[i];
	snprintf(buf, cap, "--input %s", name);
	return buf;
}

/* The model's inputs as one string ("'a', 'b'") into buf. */
static const char *input_list(const ap_onnx_io *io, char *buf, size_t cap)
{
	size_t n = 0;

	buf[0] = 0;
	for (int i = 0; i < io->n_inputs && n < cap; i++)
		n += (size_t)snprintf(buf + n, cap - n, "%s'%s'", i ? ", " : "", io->inputs[i]);
	return buf;
}

/* Every --input and --shape names one of the model's inputs, once. */
static int check_names(const run_state *st, ap_error *err)
{
	const ap_run_options *o = st->o;
	char list[256];

	for (int pass = 0; pass < 2; pass++) {
		ap_host_tensor *const *t = pass ? o->shapes : o->inputs;
		int n = pass ? o->n_shapes : o->n_inputs;

		for (int i = 0; i < n; i++) {
			const char *name = t[i]->name ? t[i]->name : "";

			if (ap_onnx_io_input(st->io, name) < 0)
				return ap_error_set(err, AP_EINVAL, NULL, name,
						    "%s %s: the model has no input '%s' (its inputs: %s)",
						    pass ? "--shape" : "--input", name, name,
						    input_list(st->io, list, sizeof(list)));
			if (find_named(t, i, name))
				return ap_error_set(err, AP_EINVAL, NULL, name, "%s %s is given twice",
						    pass ? "--shape" : "--input", name);
		}
	}
	return 0;
}

/* Checks the shape (rank, dims) of a binding from `src` (its file, or
 * "--shape NAME") against input k's declared one and records the sizes of
 * the symbolic dimensions it names in syms. */
static int bind_symbols(const run_state *st, int k, const ap_host_tensor *b, const char *src,
			sym_size *syms, int *n_syms, ap_error *err)
{
	const ap_onnx_shape *sh = &st->io->input_shape[k];
	const char *name = st->io->inputs[k];

	if (sh->rank < 0)
		return 0;
	if (b->rank != sh->rank)
		return ap_error_set(err, AP_ESHAPE, NULL, name,
				    "%s: input '%s' has %d dimensions in the model, %d here", src,
				    name, sh->rank, b->rank);
	for (int d = 0; d < sh->rank; d++) {
		int s;

		if (sh->dims[d] >= 0 && sh->dims[d] != b->dims[d])
			return ap_error_set(err, AP_ESHAPE, NULL, name,
					    "%s: input '%s': dimension %d is %lld in the model, %lld "
					    "here", src, name, d, (long long)sh->dims[d],
					    (long long)b->dims[d]);
		if (!sh->sym[d])
			continue;
		for (s = 0; s < *n_syms && strcmp(syms[s].name, sh->sym[d]); s++)
			;
		if (s < *n_syms && syms[s].size != b->dims[d])
			return ap_error_set(err, AP_ESHAPE, NULL, name,
					    "%s: input '%s': dimension '%s' is %lld here, %lld in "
					    "input '%s'", src, name, sh->sym[d], (long long)b->dims[d],
					    (long long)syms[s].size, syms[s].input);
		if (s == *n_syms)
			syms[(*n_syms)++] = (sym_size){ sh->sym[d], name, b->dims[d] };
	}
	return 0;
}

/* The dims of input k, which has no data: its --shape, else the declared
 * dims with their symbols' sizes from syms. */
static int input_dims(const run_state *st, int k, const sym_size *syms, int n_syms,
		      int64_t *dims, int *rank, ap_error *err)
{
	const ap_onnx_shape *sh = &st->io->input_shape[k];
	const char *name = st->io->inputs[k];
	const ap_host_tensor *s = find_named(st->o->shapes, st->o->n_shapes, name);

	if (s) {
		*rank = s->rank;
		memcpy(dims, s->dims, sizeof(s->dims));
		return 0;
	}
	if (sh->rank < 0)
		return ap_error_set(err, AP_ESHAPE, NULL, name,
				    "input '%s' has no shape in the model: give it with --shape "
				    "%s=DIMS or --input %s=FILE", name, name, name);
	*rank = sh->rank;
	for (int d = 0; d < sh->rank; d++) {
		int j = 0;

		dims[d] = sh->dims[d];
		while (dims[d] < 0 && sh->sym[d] && j < n_syms && strcmp(syms[j].name, sh->sym[d]))
			j++;
		if (dims[d] < 0 && sh->sym[d] && j < n_syms)
			dims[d] = syms[j].size;
		if (dims[d] < 0)
			return ap_error_set(err, AP_ESHAPE, NULL, name,
					    "input '%s' has symbolic dimension '%s': give its shape "
					    "with --shape %s=DIMS (e.g. 1x3x224x224) or its data with "
					    "--input %s=FILE.npy", name, sh->sym[d] ? sh->sym[d] : "?",
					    name, name);
	}
	return 0;
}

/* Step "inputs": st->in, one tensor per model input. */
static int run_inputs(run_state *st, ap_error *err)
{
	const ap_run_options *o = st->o;
	int n = st->io->n_inputs, n_syms = 0, rc;
	sym_size *syms = calloc((size_t)n * AP_MAX_RANK + 1, sizeof(*syms));

	st->in = calloc((size_t)n + 1, sizeof(*st->in));
	st->random = calloc((size_t)n + 1, sizeof(bool));
	if (!syms || !st->in || !st->random) {
		free(syms);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	rc = check_names(st, err);
	for (int k = 0; k < n && !rc; k++) {
		const char *name = st->io->inputs[k];
		const ap_host_tensor *d = find_named(o->inputs, o->n_inputs, name);
		const ap_host_tensor *s = find_named(o->shapes, o->n_shapes, name);
		ap_dtype want = st->io->input_dtype[k];
		char buf[600];
		const char *src = d ? data_source(o, name, buf, sizeof(buf)) : buf;

		if (!d)
			snprintf(buf, sizeof(buf), "--shape %s", name);
		if (d && s && !ap_dims_equal(d->rank, d->dims, s->rank, s->dims))
			rc = ap_error_set(err, AP_ESHAPE, NULL, name, "%s: --shape %s disagrees with "
					  "the shape of the data given for it", src, name);
		if (!rc && d && want != AP_DT_UNDEF && d->dtype != want)
			rc = ap_error_set(err, AP_ESHAPE, NULL, name, "%s: input '%s' is %s in the "
					  "model, the data %s", src, name, ap_dtype_name(want),
					  ap_dtype_name(d->dtype));
		if (!rc && (d || s))
			rc = bind_symbols(st, k, d ? d : s, src, syms, &n_syms, err);
	}
	for (int k = 0; k < n && !rc; k++) {
		const char *name = st->io->inputs[k];
		const ap_host_tensor *d = find_named(o->inputs, o->n_inputs, name);
		int64_t dims[AP_MAX_RANK];
		int rank = 0;

		if (d) {
			if (!(st->in[k] = ap_host_tensor_copy(d, name)))
				rc = ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
			continue;
		}
		if (st->io->input_dtype[k] == AP_DT_UNDEF)
			rc = ap_error_set(err, AP_EUNSUPPORTED, NULL, name,
					  "input '%s' has a dtype Apollo does not take", name);
		if (!rc)
			rc = input_dims(st, k, syms, n_syms, dims, &rank, err);
		if (!rc)
			rc = ap_run_random_tensor(name, st->io->input_dtype[k], rank, dims, o->seed, k,
						  st->io->input_shape[k].index_bound, &st->in[k], err);
		st->random[k] = true;
	}
	free(syms);
	return rc;
}

/* Appends "; " and a note to err's message, as far as it fits. */
static void error_note(ap_error *err, const char *fmt, ...)
{
	size_t n = strlen(err->msg);
	va_list ap;

	if (n + 3 >= sizeof(err->msg))
		return;
	memcpy(err->msg + n, "; ", 3);
	va_start(ap, fmt);
	vsnprintf(err->msg + n + 2, sizeof(err->msg) - n - 2, fmt, ap);
	va_end(ap);
}

/* Step "import": the graph and its weights. */
static int run_import(run_state *st, ap_error *err)
{
	char dir[4096];
	const char *folder = ap_path_folder(st->o->model, dir, sizeof(dir));

	if (!folder)
		return ap_error_set(err, AP_ETOOLARGE, NULL, NULL, "path too long: %s", st->o->model);
	st->g = ap_onnx_import_dir(st->buf, st->len, folder,
				   (const ap_host_tensor *const *)st->in, st->io->n_inputs,
				   &st->params, err);
	if (st->g)
		return 0;
	error_prefix(err, "import");
	for (int k = 0; k < st->io->n_inputs; k++)
		if (st->random[k] && !ap_dtype_is_floating(st->in[k]->dtype) &&
		    st->in[k]->dtype != AP_DT_BOOL) {
			error_note(err, "integer input '%s' got random values below %lld: give its "
				   "values with --input %s=FILE.npy", st->io->inputs[k],
				   (long long)(st->io->input_shape[k].index_bound > 0
					       ? st->io->input_shape[k].index_bound
					       : INT_RANGE_DEFAULT), st->io->inputs[k]);
			break;
		}
	return err ? err->code : AP_EINVAL;
}

/* Step "compile": the bundle, through the daemon. */
static int run_compile(run_state *st, ap_error *err)
{
	ap_submit_options dflt = { .target = "cpu" };
	const ap_submit_options *opt = st->o->submit ? st->o->submit : &dflt;
	double t0 = ap_now_ms();

	st->c = ap_client_connect_opts(st->o->socket, &st->o->connect, err);
	if (!st->c)
		return err ? err->code : AP_EIO;
	st->bundle = ap_client_submit_graph(st->c, st->g, opt, err);
	st->compile_ms = ap_now_ms() - t0;
	if (!st->bundle) {
		error_prefix(err, "compile");
		return err ? err->code : AP_EINTERNAL;
	}
	return 0;
}

/* Step "execute": one run of the bundle, its outputs read back. */
static int run_execute(run_state *st, ap_error *err)
{
	ap_runtime_options ro = { .threads = st->o->threads, .device = st->o->device };
	double t0;
	int rc;

	st->rt = ap_runtime_new(st->bundle, &ro, err);
	if (!st->rt) {
		error_prefix(err, "load");
		return err ? err->code : AP_EINTERNAL;
	}
	if ((rc = ap_run_bind(st->rt, st->bundle, st->g, st->params, st->io, st->in,
			      st->io->n_inputs, err)) < 0)
		return rc;
	t0 = ap_now_ms();
	if ((rc = ap_runtime_run(st->rt, err)) < 0) {
		error_prefix(err, "run");
		return rc;
	}
	st->run_ms = ap_now_ms() - t0;
	st->n_got = ap_runtime_n_outputs(st->rt);
	st->got = calloc((size_t)st->n_got + 1, sizeof(*st->got));
	if (!st->got)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	for (int k = 0; k < st->n_got; k++)
		if (!(st->got[k] = ap_runtime_output(st->rt, k, err)))
			return err ? err->code : AP_ENOMEM;
	return 0;
}

/* ---- the report --------------------------------------------------------------------------- */

static void print_dims(FILE *f, const ap_host_tensor *t)
{
	fputc('[', f);
	for (int d = 0; d < t->rank; d++)
		fprintf(f, "%s%lld", d ? "," : "", (long long)t->dims[d]);
	fputc(']', f);
}

static void print_value(FILE *f, ap_dtype dt, double v)
{
	if (ap_dtype_is_floating(dt))
		fprintf(f, "%.6g", v);
	else
		fprintf(f, "%.0f", v);
}

/* "WHAT K 'NAME' DTYPE [DIMS] NOTE: min .. max .. mean ..; first: v v v ..." */
static void print_tensor(FILE *f, const char *what, int k, const ap_host_tensor *t,
			 const char *note)
{
	size_t es = ap_dtype_size(t->dtype);
	int64_t n = es ? (int64_t)(t->nbytes / es) : 0, finite = 0, nonfinite = 0;
	double lo = INFINITY, hi = -INFINITY, sum = 0;

	for (int64_t i = 0; i < n; i++) {
		double v = ap_elem_get(t->data, t->dtype, i);

		if (!isfinite(v)) {
			nonfinite++;
			continue;
		}
		lo = v < lo ? v : lo;
		hi = v > hi ? v : hi;
		sum += v;
		finite++;
	}
	fprintf(f, "%s %d '%s' %s ", what, k, t->name ? t->name : "", ap_dtype_name(t->dtype));
	print_dims(f, t);
	fprintf(f, "%s%s", note[0] ? " " : "", note);
	if (finite) {
		fputs(": min ", f);
		print_value(f, t->dtype, lo);
		fputs(" max ", f);
		print_value(f, t->dtype, hi);
		fprintf(f, " mean %.6g", sum / (double)finite);
	}
	if (nonfinite)
		fprintf(f, "%s%lld NaN/inf", finite ? ", " : ": ", (long long)nonfinite);
	fputs(n ? "; first:" : ": no elements", f);
	for (int64_t i = 0; i < n && i < 6; i++) {
		fputc(' ', f);
		print_value(f, t->dtype, ap_elem_get(t->data, t->dtype, i));
	}
	fputs(n > 6 ? " ...\n" : "\n", f);
}

/* Step "report": the inputs, the bundle, the outputs. */
static void run_report(const run_state *st)
{
	FILE *f = st->out;
	ap_bundle_stats bs;
	char note[64];

	for (int k = 0; k < st->io->n_inputs; k++) {
		snprintf(note, sizeof(note), st->random[k] ? "random (seed %llu)" : "given",
			 (unsigned long long)st->o->seed);
		print_tensor(f, "input", k, st->in[k], note);
	}
	ap_bundle_stats_get(st->bundle, &bs);
	fprintf(f, "bundle: %d launches (%u eager kernels), target %s, cache %s, compile %.0f ms, "
		"run %.1f ms\n", ap_bundle_n_launches(st->bundle), bs.eager_kernels,
		ap_bundle_target(st->bundle), bs.cache_hit ? "hit" : "miss", st->compile_ms,
		st->run_ms);
	for (int k = 0; k < st->n_got; k++)
		print_tensor(f, "output", k, st->got[k], "");
}

/* ---- the comparison ------------------------------------------------------------------------ */

/* Compares Apollo's output k with onnxruntime's and prints the line.
 * True when it matches. */
static bool compare_one(const run_state *st, int k)
{
	const ap_host_tensor *got = st->got[k], *want = st->want[k];
	FILE *f = st->out;
	ap_compare_result r;
	double rtol, atol;
	char at[160];

	ap_compare_tolerance(want->dtype, &rtol, &atol);
	if (st->o->rtol >= 0 && ap_dtype_is_floating(want->dtype))
		rtol = st->o->rtol;
	if (st->o->atol >= 0 && ap_dtype_is_floating(want->dtype))
		atol = st->o->atol;
	ap_compare_tensors(got, want, rtol, atol, &r);
	fprintf(f, "onnxruntime: output %d '%s': ", k, got->name ? got->name : "");
	if (r.why[0]) {
		fprintf(f, "MISMATCH: %s\n", r.why);
		return false;
	}
	if (r.ok) {
		fprintf(f, "match (max abs err %.3g, max rel err %.3g; rtol %g, atol %g)\n",
			r.max_abs_err, r.max_rel_err, rtol, atol);
		return true;
	}
	ap_compare_format_index(want->rank, want->dims, r.worst_at, at, sizeof(at));
	{
		double a = ap_elem_get(got->data, got->dtype, r.worst_at);
		double b = ap_elem_get(want->data, want->dtype, r.worst_at);

		fprintf(f, "MISMATCH: %lld of %lld elements outside rtol %g, atol %g; worst at %s: "
			"apollo %.9g, onnxruntime %.9g (abs err %.3g, rel err %.3g); max abs err "
			"%.3g, max rel err %.3g\n", (long long)r.n_bad,
			(long long)(want->nbytes / ap_dtype_size(want->dtype)), rtol, atol, at, a, b,
			fabs(a - b), b != 0 ? fabs(a - b) / fabs(b) : INFINITY, r.max_abs_err,
			r.max_rel_err);
	}
	return false;
}

/* Step "compare": onnxruntime's outputs for the same inputs, each output
 * compared. */
static int run_compare(run_state *st, ap_run_result *res, ap_error *err)
{
	int rc = ap_ort_run(st->o->model, st->io, st->in, st->io->n_inputs, &st->want, &st->n_want,
			    &res->no_reference, err);

	if (rc < 0)
		return rc;
	if (st->n_want != st->n_got)
		return ap_error_set(err, AP_ESHAPE, NULL, NULL,
				    "onnxruntime gave %d outputs, Apollo's bundle %d", st->n_want,
				    st->n_got);
	for (int k = 0; k < st->n_got; k++) {
		res->compared++;
		if (!compare_one(st, k))
			res->mismatched++;
	}
	if (res->mismatched)
		fprintf(st->out, "onnxruntime: %d of %d outputs do not match\n", res->mismatched,
			res->compared);
	else
		fprintf(st->out, "onnxruntime: all %d outputs match\n", res->compared);
	return 0;
}

/* ---- the whole run ---------------------------------------------------------------------- */

static void run_state_clear(run_state *st)
{
	ap_host_tensors_free(st->want, st->n_want);
	ap_host_tensors_free(st->got, st->n_got);
	ap_runtime_free(st->rt);
	ap_bundle_free(st->bundle);
	ap_client_free(st->c);
	ap_params_free(st->params);
	ap_graph_free(st->g);
	ap_host_tensors_free(st->in, st->io ? st->io->n_inputs : 0);
	free(st->random);
	ap_onnx_io_free(st->io);
	if (st->buf)
		ap_file_unmap(st->buf, st->len);
}

int ap_run_model(const ap_run_options *o, ap_run_result *res, ap_error *err)
{
	run_state st = { .o = o, .out = o->out ? o->out : stdout };
	int rc;

	memset(res, 0, sizeof(*res));
	if ((rc = ap_file_map(o->model, MAX_MODEL_BYTES, &st.buf, &st.len, err)) < 0) {
		st.buf = NULL;
		return rc;
	}
	if ((rc = ap_onnx_io_read(st.buf, st.len, &st.io, err)) < 0) {
		error_prefix(err, o->model);
		goto out;
	}
	if ((rc = run_inputs(&st, err)) < 0 || (rc = run_import(&st, err)) < 0 ||
	    (rc = run_compile(&st, err)) < 0 || (rc = run_execute(&st, err)) < 0)
		goto out;
	res->launches = ap_bundle_n_launches(st.bundle);
	res->outputs = st.n_got;
	run_report(&st);
	fflush(st.out);
	if (o->compare && (rc = run_compare(&st, res, err)) < 0)
		goto out;
	if (o->save_dir) {
		bool theirs = st.want != NULL;

		rc = ap_run_save(o->save_dir, o->model, st.buf, st.len, st.in, st.io->n_inputs,
				 theirs ? st.want : st.got, st.n_got, err);
		if (rc < 0)
			goto out;
		fprintf(st.out, "saved: %s (model.onnx; test_data_set_0: the inputs, %s's outputs): "
			"apollo-client check %s runs it again\n", o->save_dir,
			theirs ? "onnxruntime" : "Apollo", o->save_dir);
	}
	rc = 0;
out:
	fflush(st.out);
	run_state_clear(&st);
	return rc;
}
