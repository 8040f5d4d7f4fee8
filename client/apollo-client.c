/* apollo-client -- the command line of libapollo-client.
 *
 *   apollo-client submit GRAPH.pb|MODEL.onnx [--target T] [--format ptx|cubin|so]
 *                 [-o BUNDLE.pb] [--json] [--input NAME=FILE.pb ...] [--data DIR]
 *                 [--shape NAME=DIMS ...] [--dump DIR] [--dump-schedules DIR] [--allow-tf32]
 *                 [--tma] [--unvalidated] [--no-layer1] [--no-tune] [--no-cache] [--namespace NS] [--daemon-import]
 *                 [--explain] [--explain-html FILE] [--progress]
 *                 [--fusion none|rules|apollo] [--fusion-barrier NODE ...]
 *                 [--keep-whole OP ...]
 *   apollo-client run MODEL.onnx [--input NAME=FILE.npy|FILE.pb ...] [--shape NAME=DIMS ...]
 *                 [--seed N] [--compare onnxruntime] [--rtol R] [--atol A] [--save DIR]
 *                 [--target T] [--format ptx|cubin|so] [--threads N] [compile options]
 *   apollo-client check DIR...|MODEL.onnx [--target T] [--rtol R] [--atol A] [--jobs N]
 *                 [--threads N] [--timeout S] [--no-fork] [--no-cache] [--allow-tf32] [--tma] [--unvalidated] [--no-tune]
 *                 [--fusion none|rules|apollo] [--fusion-barrier NODE ...]
 *                 [--keep-whole OP ...] [--save-outputs DIR] [--repeat N [--profile]]
 *                 [--mismatch FRACTION] [--shape NAME=DIMS ...] [--input NAME=FILE ...]
 *                 [--seed N] [--compare onnxruntime]
 *   apollo-client convert MODEL.onnx GRAPH.pb [--input NAME=FILE.pb ...] [--data DIR]
 *                 [--shape NAME=DIMS ...]
 *   apollo-client tune GRAPH.pb|MODEL.onnx [--target T] [--format ptx|cubin] [--runs N]
 *                 [--warmup N] [--device I] [--dry-run] [--input NAME=FILE.pb ...] [--data DIR]
 *                 [--shape NAME=DIMS ...] [--allow-tf32] [--tma] [--unvalidated] [--no-layer1]
 *                 [--fusion none|rules|apollo] [--fusion-barrier NODE ...] [--keep-whole OP ...]
 *                 [--namespace NS]
 *   apollo-client ping
 *   apollo-client stats
 * Every subcommand takes --socket PATH (else $APOLLO_SOCKET, else the
 * default socket; "HOST:PORT" for TCP, with --token SECRET or
 * $APOLLO_TOKEN, which TCP requires) and --daemon-user USER (else
 * $APOLLO_DAEMON_USER): on a Unix socket the daemon must run as you, as
 * root, or as that user, or the client refuses it (issue 11).
 *
 * An ONNX model is imported here, on the client (ap_onnx_import_dir, the
 * model file's folder holding the files of its external data): its
 * weights stay in this process and only the Graph travels.  --shape
 * NAME=DIMS gives a graph input's shape without data (its symbolic
 * dimensions bound).  `check` runs the
 * answer with the runtime (client/runtime.h) and compares every output with
 * the folder's reference data; with --save-outputs DIR it also writes each
 * folder's inputs and computed outputs as a backend-test folder
 * DIR/<folder name>/ (model.onnx a link to the model), the reference data
 * for a run at another fusion level.  `run` (client/run.c, which this file
 * only parses for) runs a model once on inputs from .npy / TensorProto
 * files or random ones, and with --compare onnxruntime checks every output
 * against onnxruntime's; `check MODEL.onnx` is that run.  `submit --explain` lists every
 * launch with its ONNX nodes and category, and every boundary between
 * launches with the reason they were not fused; `--explain-html FILE`
 * draws the same as one self-contained HTML page (explain_html.h).  Errors go to stderr as "apollo-client: ..."
 * and make the command exit 1 (2 for a usage error).
 *
 * `tune` measures the candidates of a graph's tuned kernels on this
 * machine's GPU: it compiles the graph once per candidate rank
 * (CompileOptions.tune_variant 1..AP_TUNE_CANDIDATES: every tuned kernel on
 * its record's i-th candidate, alone in its launch), runs each bundle with
 * zeroed inputs (--warmup runs, then --runs timed with CUDA events), takes
 * every tuned launch's median, prints the table (the fastest of each kernel
 * starred) and sends the times to the daemon (TuneReport), which keeps the
 * fastest of each kernel as a measured record for later builds.  With
 * --dry-run nothing is sent.  The compile options that change the kernels
 * (--allow-tf32, --tma, --unvalidated, the fusion options) are submit's:
 * they are part of each kernel's tuning signature, so a build is served
 * the records measured under the same options; --no-tune and --host-check
 * are refused (no tuned kernel; the host).
 */
#include <errno.h>
#include <signal.h>
#include <time.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "apollo.h"
#include "explain_html.h"
#include "proto/apollo.pb-c.h"
#include "runtime.h"
#include "tool.h"
#include "../common/trust.h"

#define MAX_MODEL_BYTES ((size_t)2 << 30)

static const char *g_socket;   /* --socket; NULL = default */
static const char *g_token;    /* --token-file, --token, else $APOLLO_TOKEN (TCP) */
static char g_token_buf[256];  /* the token read from --token-file or copied from --token */
static const char *g_daemon_user; /* --daemon-user; NULL = $APOLLO_DAEMON_USER */

/* Each subcommand's synopsis (its lines of the usage) and what its
 * --help adds; the options a synopsis names are the ones "did you mean"
 * suggests from. */
typedef struct subcommand_help {
	const char *name, *synopsis, *about;
} subcommand_help;

static const subcommand_help g_help[] = {
	{ "submit",
	  "apollo-client submit GRAPH.pb|MODEL.onnx [--target T] [--format ptx|cubin|so]\n"
	  "              [-o BUNDLE.pb] [--json] [--input NAME=FILE.pb ...] [--data DIR]\n"
	  "              [--shape NAME=DIMS ...] [--dump DIR] [--dump-schedules DIR] [--allow-tf32] [--tma] [--unvalidated] [--no-layer1] [--no-tune]\n"
	  "              [--host-check] [--no-cache] [--namespace NS] [--daemon-import] [--explain]\n"
	  "              [--explain-html FILE] [--fusion none|rules|apollo] [--fusion-barrier NODE ...]\n"
	  "              [--keep-whole OP ...] [--progress]\n",
	  "Compiles a model (its structure; the weights stay here) and prints the bundle's\n"
	  "launches and statistics; -o writes the bundle, --explain why launches were not fused,\n"
	  "--explain-html FILE the fused graph as an HTML page (open it in a browser),\n"
	  "--progress the daemon's stages on stderr as it compiles (a live line on a terminal),\n"
	  "--dump the kernels' blobs.  Target cpu (host C, for checking), sm_XX or compute_XX\n"
	  "(CUDA), host:sm_XX (a GPU's kernels emulated on the host).\n" },
	{ "run",
	  "apollo-client run MODEL.onnx [--input NAME=FILE.npy|FILE.pb ...] [--shape NAME=DIMS ...]\n"
	  "              [--seed N] [--compare onnxruntime] [--rtol R] [--atol A] [--save DIR]\n"
	  "              [--target T] [--format ptx|cubin|so] [--threads N] [--fusion none|rules|apollo]\n"
	  "              [--no-cache] [--allow-tf32] [--tma] [--unvalidated] [--no-layer1] [--no-tune] [--host-check]\n"
	  "              [--namespace NS] [--fusion-barrier NODE ...] [--keep-whole OP ...]\n",
	  "Runs a model once: each input from its .npy or TensorProto file, else random (--seed N,\n"
	  "default 0: floats in [-1, 1), integers valid as indices), compiled by the daemon and run\n"
	  "here (target cpu, or a GPU through the CUDA driver); prints each output's dtype, shape\n"
	  "and values.  --compare onnxruntime runs the same inputs in onnxruntime and compares\n"
	  "every output (exit 1 on a mismatch, 3 when onnxruntime cannot be used); --save DIR\n"
	  "keeps the run as a backend-test folder for check.\n" },
	{ "check",
	  "apollo-client check DIR...|MODEL.onnx [--target T] [--rtol R] [--atol A] [--jobs N]\n"
	  "              [--threads N] [--timeout S] [--no-fork] [--no-cache] [--allow-tf32] [--tma] [--unvalidated] [--no-tune]\n"
	  "              [--fusion none|rules|apollo] [--host-check] [--repeat N [--profile]]\n"
	  "              [--mismatch FRACTION] [--fusion-barrier NODE ...] [--keep-whole OP ...]\n"
	  "              [--save-outputs DIR] [--shape NAME=DIMS ...] [--input NAME=FILE ...]\n"
	  "              [--seed N] [--compare onnxruntime]\n",
	  "Compiles each ONNX backend-test folder (model.onnx, test_data_set_*), runs it on the\n"
	  "host and compares with the saved outputs; PASS/FAIL per folder.  A model file is run as\n"
	  "`run --compare onnxruntime` runs it (--input, --seed: its inputs).  --host-check (cpu,\n"
	  "host:sm_XX) also checks races, cp.async groups and bounds.\n" },
	{ "convert", "apollo-client convert MODEL.onnx GRAPH.pb [--input NAME=FILE.pb ...] [--data DIR]\n"
	  "              [--shape NAME=DIMS ...]\n",
	  "Imports an ONNX model and writes Apollo's graph (apollo.Graph protobuf).\n" },
	{ "tune",
	  "apollo-client tune GRAPH.pb|MODEL.onnx [--target T] [--format ptx|cubin] [--runs N]\n"
	  "              [--warmup N] [--device I] [--dry-run] [--input NAME=FILE.pb ...] [--data DIR]\n"
	  "              [--shape NAME=DIMS ...] [--allow-tf32] [--tma] [--unvalidated] [--no-layer1]\n"
	  "              [--fusion none|rules|apollo] [--fusion-barrier NODE ...] [--keep-whole OP ...]\n"
	  "              [--namespace NS]\n",
	  "Times each tuned kernel's candidates on this machine's GPU and reports the\n"
	  "measurements to the daemon (two clients must agree before a record changes).\n"
	  "Give the compile options the job builds with: records are kept per options.\n" },
	{ "ping", "apollo-client ping\n", "Asks the daemon for its name and version.\n" },
	{ "stats", "apollo-client stats [--json]\n", "The daemon's counters and metrics.\n" },
};

#define N_SUBCOMMANDS ((int)(sizeof(g_help) / sizeof(g_help[0])))
static const char *g_cmd;      /* the subcommand running; NULL before one is known */

static const char g_common_help[] =
	"every subcommand takes --socket PATH (default $APOLLO_SOCKET, else\n"
	"$XDG_RUNTIME_DIR/apollod.sock, else /tmp/apollod-<uid>/apollod.sock; HOST:PORT for TCP,\n"
	"with --token-file FILE (a private file), --token SECRET or $APOLLO_TOKEN) and --daemon-user\n"
	"USER (default $APOLLO_DAEMON_USER: a daemon on a Unix socket must run as you, as root or\n"
	"as USER); GPU targets name the device and driver found (--driver-version X.Y: the CUDA\n"
	"version a bundle's driver supports).  Every option: docs/reference/apollo-client.md\n";

static const subcommand_help *help_of(const char *name)
{
	for (int i = 0; name && i < N_SUBCOMMANDS; i++)
		if (!strcmp(g_help[i].name, name))
			return &g_help[i];
	return NULL;
}

static void usage(FILE *f)
{
	fputs("usage:\n", f);
	for (int i = 0; i < N_SUBCOMMANDS; i++)
		fprintf(f, "  %s", g_help[i].synopsis);
	fputs(g_common_help, f);
	fputs("apollo-client SUBCOMMAND --help: what it does\n", f);
}

/* `apollo-client NAME --help`: synopsis, what it does, the common options. */
static int subcommand_usage(const subcommand_help *h)
{
	printf("usage: %s\n%s\n%s", h->synopsis, h->about, g_common_help);
	return 0;
}

/* Levenshtein distance of a and b (each at most 63 bytes counted), the
 * published dynamic programme over one row. */
static int edit_distance(const char *a, const char *b)
{
	int la = (int)strnlen(a, 63), lb = (int)strnlen(b, 63), row[64];

	for (int j = 0; j <= lb; j++)
		row[j] = j;
	for (int i = 1; i <= la; i++) {
		int diag = row[0];

		row[0] = i;
		for (int j = 1; j <= lb; j++) {
			int up = row[j], best = diag + (a[i - 1] != b[j - 1]);

			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			diag = up;
			row[j] = best;
		}
	}
	return row[lb];
}

/* The word of `text` nearest to `word` among those starting with
 * `prefix` ("--" for options, "" for words of a list separated by spaces
 * or newlines): copied to out (cap bytes) when close enough to be a typo
 * (at most a third of its length, at least 2, edits away).  False when
 * none is. */
static bool nearest(const char *word, const char *text, const char *prefix, char *out, size_t cap)
{
	int best = (int)strlen(word) / 3 < 2 ? 2 : (int)strlen(word) / 3;
	bool found = false;

	for (const char *p = text; *p;) {
		char cand[64];
		size_t n = strcspn(p, " []|.,;:()\n");

		if (n && n < sizeof(cand) && !strncmp(p, prefix, strlen(prefix))) {
			int d;

			memcpy(cand, p, n);
			cand[n] = '\0';
			d = edit_distance(word, cand);
			if (d <= best && strcmp(word, cand)) {
				best = d;
				snprintf(out, cap, "%s", cand);
				found = true;
			}
		}
		p += n ? n : 1;
	}
	return found;
}

static int usage_error(const char *fmt, ...);

/* An option the running subcommand does not know (or one that wants a
 * value and has none): the usage error, with the nearest known option. */
static int unknown_option(const char *a)
{
	const subcommand_help *h = help_of(g_cmd);
	const char *at = h && a[0] == '-' ? strstr(h->synopsis, a) : NULL;
	char near[64];

	if (at && strchr(" ]\n", at[strlen(a)]))   /* named whole in the synopsis */
		return usage_error("%s wants a value", a);
	if ((h && nearest(a, h->synopsis, "-", near, sizeof(near))) ||
	    nearest(a, g_common_help, "--", near, sizeof(near)))
		return usage_error("unknown option '%s' (did you mean %s?)", a, near);
	return usage_error("unknown option '%s'", a);
}

/* Reads the TCP token from `path`: a private file by common/trust.h's rule
 * for secrets, one line (a final newline dropped), into g_token_buf.
 * 0, or AP_EIO / AP_EINVAL with `e`. */
static int read_token_file(const char *path, ap_error *e)
{
	char buf[sizeof(g_token_buf) + 1];
	int fd = ap_trust_open(path, "token file", AP_TRUST_SECRET, e);
	ssize_t n;

	if (fd < 0)
		return fd;
	n = read(fd, buf, sizeof(buf));
	close(fd);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		n--;
	if (n <= 0 || (size_t)n >= sizeof(g_token_buf) || memchr(buf, '\n', (size_t)n) ||
	    memchr(buf, '\0', (size_t)n))
		return ap_error_set(e, AP_EINVAL, NULL, NULL,
				    "%s must hold one line of 1 to %zu bytes", path,
				    sizeof(g_token_buf) - 1);
	memcpy(g_token_buf, buf, (size_t)n);
	g_token_buf[n] = '\0';
	return 0;
}

/* GPU targets: names the GPU the bundle will run on (device 0 as the CUDA
 * driver reports it; nothing when no driver loads), so that the daemon
 * applies that device's measured tuning records (apollo.DeviceInfo). */
static unsigned g_driver;      /* --driver-version, 1000 * major + 10 * minor; 0: the driver's */

/* ap_device_probe in a child process: the probe's cuInit must not happen
 * in this one, whose `check` forks a child per model that initialises
 * CUDA itself (a driver initialised before fork() is unusable in the
 * child: cuInit there fails with CUDA_ERROR_NOT_INITIALIZED, which the
 * device kit met on an H200).  *dev zeroed when the probe fails. */
static void probe_in_child(ap_device_info *dev)
{
	int fd[2], st;
	pid_t pid;

	memset(dev, 0, sizeof(*dev));
	if (pipe(fd) != 0)
		return;
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		ap_device_info d;
		ap_error e;

		close(fd[0]);
		if (ap_device_probe(0, &d, &e) == 0 && write(fd[1], &d, sizeof(d)) != (ssize_t)sizeof(d))
			_exit(1);
		_exit(0);
	}
	close(fd[1]);
	if (pid > 0) {
		ap_device_info d;
		size_t got = 0;
		ssize_t r;

		while (got < sizeof(d) && (r = read(fd[0], (char *)&d + got, sizeof(d) - got)) > 0)
			got += (size_t)r;
		waitpid(pid, &st, 0);
		if (got == sizeof(d)) {
			d.name[sizeof(d.name) - 1] = '\0';
			*dev = d;
		}
	}
	close(fd[0]);
}

static void gpu_device(ap_submit_options *opt, ap_device_info *dev)
{
	if (!opt->target || !strcmp(opt->target, "cpu") || !strncmp(opt->target, "host:", 5))
		return;
	probe_in_child(dev);
	if (g_driver)   /* the driver the bundle is for, said outright */
		dev->driver_version = g_driver;
	if (dev->name[0] || dev->driver_version)
		opt->device = dev;
}

/* "12.4" -> 12040 (cuDriverGetVersion's form); 0 when malformed. */
static unsigned parse_driver(const char *v)
{
	unsigned major = 0, minor = 0;
	char extra;

	if (sscanf(v, "%u.%u%c", &major, &minor, &extra) != 2 || major < 9 || major > 99 || minor > 99)
		return 0;
	return major * 1000 + minor * 10;
}

static int fail(const char *what, const ap_error *e)
{
	fprintf(stderr, "apollo-client: %s: %s", what, e->msg[0] ? e->msg : ap_error_name(e->code));
	if (e->node[0] && !strstr(e->msg, e->node))
		fprintf(stderr, " (node '%s')", e->node);
	if (e->tensor[0] && !strstr(e->msg, e->tensor))
		fprintf(stderr, " (tensor '%s')", e->tensor);
	fputc('\n', stderr);
	return 1;
}

static int usage_error(const char *fmt, ...)
{
	va_list ap;

	const subcommand_help *h = help_of(g_cmd);

	fprintf(stderr, "apollo-client: %s%s", g_cmd ? g_cmd : "", g_cmd ? ": " : "");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\n", stderr);
	/* three lines: the error, the synopsis's first line, where help is */
	if (h)
		fprintf(stderr, "usage: %.*s\n", (int)strcspn(h->synopsis, "\n"), h->synopsis);
	fprintf(stderr, "more: apollo-client %s%s--help\n", h ? h->name : "", h ? " " : "");
	return 2;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);

	return a >= b && !strcmp(s + a - b, suffix);
}

static bool parse_double(const char *s, double *out)
{
	char *end;

	errno = 0;
	*out = strtod(s, &end);
	return s[0] && !*end && !errno && *out >= 0;
}

static bool parse_int(const char *s, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (!s[0] || *end || errno || v < 0 || v > 1024)
		return false;
	*out = (int)v;
	return true;
}

static bool parse_fusion(const char *v, ap_fusion_level *out)
{
	if (!strcmp(v, "none"))
		*out = AP_FUSION_NONE;
	else if (!strcmp(v, "rules"))
		*out = AP_FUSION_RULES;
	else if (!strcmp(v, "apollo"))
		*out = AP_FUSION_APOLLO;
	else if (!strcmp(v, "default"))
		*out = AP_FUSION_DEFAULT;
	else
		return false;
	return true;
}

static bool parse_format(const char *v, ap_output_kind *out)
{
	if (!strcmp(v, "ptx"))
		*out = AP_OUTPUT_PTX;
	else if (!strcmp(v, "cubin"))
		*out = AP_OUTPUT_CUBIN;
	else if (!strcmp(v, "so"))
		*out = AP_OUTPUT_SO;
	else
		return false;
	return true;
}

/* A --seed: a decimal integer in [0, 2^64). */
static bool parse_seed(const char *s, uint64_t *out)
{
	char *end;

	errno = 0;
	*out = strtoull(s, &end, 10);
	return s[0] >= '0' && s[0] <= '9' && !*end && !errno;
}

/* Appends `v` to a growing array of borrowed strings; false on ENOMEM. */
static bool strv_push(const char ***v, int *n, const char *s)
{
	const char **nv = realloc((void *)*v, sizeof(char *) * (size_t)(*n + 1));

	if (!nv)
		return false;
	nv[(*n)++] = s;
	*v = nv;
	return true;
}

static void error_message(ap_error *e, const char *prefix)
{
	char tmp[sizeof(e->msg)];
	size_t pl = strlen(prefix), tl;

	memcpy(tmp, e->msg, sizeof(tmp));
	tmp[sizeof(tmp) - 1] = 0;
	if (pl > sizeof(e->msg) - 3)
		pl = sizeof(e->msg) - 3;
	memcpy(e->msg, prefix, pl);
	memcpy(e->msg + pl, ": ", 2);
	tl = strnlen(tmp, sizeof(e->msg) - pl - 3);
	memcpy(e->msg + pl + 2, tmp, tl);
	e->msg[pl + 2 + tl] = 0;
}

/* ---- bindings -------------------------------------------------------------------- */

typedef struct bindings {
	int n;
	ap_host_tensor **t;
	const char **files;   /* the file each came from (borrowed from argv), or NULL */
} bindings;

static void bindings_clear(bindings *b)
{
	ap_host_tensors_free(b->t, b->n);
	free((void *)b->files);
	b->t = NULL;
	b->files = NULL;
	b->n = 0;
}

static int bindings_add(bindings *b, ap_host_tensor *t, ap_error *err)
{
	ap_host_tensor **nv = realloc(b->t, sizeof(*nv) * (size_t)(b->n + 1));
	const char **nf = nv ? realloc((void *)b->files, sizeof(*nf) * (size_t)(b->n + 1)) : NULL;

	if (nv)
		b->t = nv;
	if (nf)
		b->files = nf;
	if (!nv || !nf) {
		ap_host_tensor_free(t);
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	b->files[b->n] = NULL;
	b->t[b->n++] = t;
	return 0;
}

static const ap_host_tensor *bindings_find(const bindings *b, const char *name)
{
	for (int i = 0; i < b->n; i++)
		if (b->t[i]->name && !strcmp(b->t[i]->name, name))
			return b->t[i];
	return NULL;
}

/* --input NAME=FILE: a .npy file, else a TensorProto (ap_tensor_file_read). */
static int add_input_file(bindings *b, const char *spec, ap_error *err)
{
	const char *eq = strchr(spec, '=');
	char name[512];
	ap_host_tensor *t;
	int rc;

	if (!eq || eq == spec || (size_t)(eq - spec) >= sizeof(name))
		return ap_error_set(err, AP_EINVAL, NULL, NULL,
				    "--input wants NAME=FILE.npy or NAME=FILE.pb, got '%s'", spec);
	memcpy(name, spec, (size_t)(eq - spec));
	name[eq - spec] = 0;
	if ((rc = ap_tensor_file_read(eq + 1, name, &t, err)) < 0 ||
	    (rc = bindings_add(b, t, err)) < 0)
		return rc;
	b->files[b->n - 1] = eq + 1;
	return 0;
}

/* Adds the inputs of one data-set folder, renamed positionally after the
 * model's non-initializer inputs (the .pb names may be empty or stale). */
static int add_inputs_from_set(bindings *b, const char *setdir, const ap_onnx_io *io,
			       ap_error *err)
{
	ap_host_tensor **ts;
	int n, rc;

	rc = ap_testdata_load(setdir, "input", &ts, &n, err);
	if (rc < 0)
		return rc;
	for (int k = 0; k < n && rc == 0; k++) {
		const char *name = io && k < io->n_inputs ? io->inputs[k] : NULL;
		ap_host_tensor *c = ap_host_tensor_copy(ts[k], name);
		rc = c ? bindings_add(b, c, err)
		       : ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	}
	ap_host_tensors_free(ts, n);
	return rc;
}

/* --data DIR: DIR/test_data_set_0 if there is one, else DIR itself. */
static int add_inputs_from_dir(bindings *b, const char *dir, const ap_onnx_io *io, ap_error *err)
{
	char **sets;
	int n, rc;

	rc = ap_testdata_sets(dir, &sets, &n, err);
	if (rc < 0)
		return rc;
	rc = add_inputs_from_set(b, n > 0 ? sets[0] : dir, io, err);
	ap_strv_free(sets, n);
	return rc;
}

/* --shape NAME=DIMS: a binding of the shape alone (ap_shape_binding_parse),
 * into `shapes`; one per name. */
static int add_shape(bindings *shapes, const char *spec, ap_error *err)
{
	ap_host_tensor *t;
	int rc = ap_shape_binding_parse(spec, &t, err);

	if (rc < 0)
		return rc;
	if (bindings_find(shapes, t->name)) {
		rc = ap_error_set(err, AP_EINVAL, NULL, t->name, "--shape %s is given twice",
				  t->name);
		ap_host_tensor_free(t);
		return rc;
	}
	return bindings_add(shapes, t, err);
}

/* Adds a copy of each --shape binding to b, unless b binds that input
 * with data already: then the data's shape must be the one --shape
 * gives.  0, AP_ESHAPE (they disagree) or AP_ENOMEM. */
static int merge_shapes(bindings *b, const bindings *shapes, ap_error *err)
{
	for (int i = 0; i < shapes->n; i++) {
		const ap_host_tensor *s = shapes->t[i], *d = bindings_find(b, s->name);
		ap_host_tensor *c;
		bool same;

		if (d) {
			same = d->rank == s->rank &&
			       !memcmp(d->dims, s->dims, (size_t)s->rank * sizeof(s->dims[0]));
			if (!same)
				return ap_error_set(err, AP_ESHAPE, NULL, s->name,
						    "--shape %s disagrees with the shape of the data "
						    "given for it", s->name);
			continue;
		}
		c = ap_host_tensor_copy(s, NULL);
		if (!c)
			return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
		if (bindings_add(b, c, err) < 0)
			return AP_ENOMEM;
	}
	return 0;
}

/* Every input with symbolic dims needs a binding. */
static int check_symbolic(const ap_onnx_io *io, const bindings *b, ap_error *err)
{
	for (int i = 0; i < io->n_inputs; i++)
		if (io->input_symbolic[i] && !bindings_find(b, io->inputs[i]))
			return ap_error_set(err, AP_ESHAPE, NULL, io->inputs[i],
					    "input '%s' has symbolic dimension '%s': give its shape "
					    "with --shape %s=DIMS (e.g. 1x3x224x224), --input "
					    "%s=FILE.pb or --data DIR", io->inputs[i],
					    io->input_symbolic[i], io->inputs[i], io->inputs[i]);
	return 0;
}

/* Imports the ONNX model read from the file `path` with bindings; the
 * data of tensors kept in external files is read from the file's folder
 * (ap_onnx_import_dir). */
static ap_graph *import_model(const uint8_t *buf, size_t len, const char *path,
			      const bindings *b, ap_params **params, double *ms, ap_error *err)
{
	double t0 = ap_now_ms();
	char dir[4096];
	ap_graph *g = ap_onnx_import_dir(buf, len, ap_path_folder(path, dir, sizeof(dir)),
					 (const ap_host_tensor *const *)b->t, b->n, params, err);

	*ms = ap_now_ms() - t0;
	if (!g && err)
		error_message(err, "import");
	return g;
}

static ap_client *connect_daemon(ap_error *err)
{
	ap_connect_options o = { .token = g_token, .daemon_user = g_daemon_user };

	return ap_client_connect_opts(g_socket, &o, err);
}

/* ---- submit / convert ---------------------------------------------------------------- */

typedef struct model_args {
	const char *model;
	bindings b;
	bindings shapes;   /* --shape */
	const char *data_dir;
} model_args;

static void model_args_clear(model_args *m)
{
	bindings_clear(&m->b);
	bindings_clear(&m->shapes);
}

/* Maps the model file (ap_file_map: the pages of weights that only their
 * structure is needed of are never read) and loads the bindings; for ONNX
 * also its io lists.  A file is ONNX when it ends in .onnx or walks as a
 * ModelProto with a graph; anything else is sent as an apollo.Graph. */
static int load_model(model_args *m, const uint8_t **buf, size_t *len, ap_onnx_io **io,
		      bool *is_onnx, ap_error *err)
{
	int rc;

	*io = NULL;
	*is_onnx = false;
	rc = ap_file_map(m->model, MAX_MODEL_BYTES, buf, len, err);
	if (rc < 0)
		return rc;
	if (ends_with(m->model, ".onnx")) {
		rc = ap_onnx_io_read(*buf, *len, io, err);
		if (rc < 0) {
			error_message(err, m->model);
			return rc;
		}
	} else if (ap_onnx_io_read(*buf, *len, io, NULL) < 0) {
		*io = NULL;
		if (m->data_dir || m->b.n)
			fprintf(stderr, "apollo-client: note: %s is an apollo.Graph: "
					"--input/--data are not used\n", m->model);
		return 0;
	}
	*is_onnx = true;
	if (m->data_dir && (rc = add_inputs_from_dir(&m->b, m->data_dir, *io, err)) < 0)
		return rc;
	if ((rc = merge_shapes(&m->b, &m->shapes, err)) < 0)
		return rc;
	return check_symbolic(*io, &m->b, err);
}

/* Writes every kernel blob of the bundle to DIR/NAME.ptx, .cubin or .so
 * (creating DIR).  0, or AP_EIO / AP_ENOMEM with `err`. */
static int dump_kernels(const ap_bundle *b, const char *dir, ap_error *err)
{
	char path[4096];

	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		return ap_error_set(err, AP_EIO, NULL, NULL, "--dump: cannot create %s: %s", dir,
				    strerror(errno));
	for (int i = 0; i < ap_bundle_n_kernels(b); i++) {
		ap_bundle_kernel k;
		const char *ext;

		if (ap_bundle_kernel_get(b, i, &k) < 0)
			continue;
		ext = k.format == AP_OUTPUT_PTX ? "ptx" : k.format == AP_OUTPUT_CUBIN ? "cubin" : "so";
		/* kernel names are C identifiers: safe as file names */
		if ((size_t)snprintf(path, sizeof(path), "%s/%s.%s", dir, k.name, ext) >= sizeof(path))
			return ap_error_set(err, AP_EIO, NULL, NULL, "--dump: path too long");
		if (ap_file_write(path, k.blob, k.blob_bytes, err) < 0)
			return err->code;
	}
	return 0;
}

/* Writes Layer I's plan of every micro-graph it scheduled to
 * DIR/launch<L>_part<P>.isl (creating DIR): tile and threads, then isl's
 * text forms of the domain, the read and write accesses and the schedule
 * tree, one "key: value" per line (what ap_fuse_layer1_load replays).
 * Prints how many it wrote to stderr.  0, or AP_EIO with `err`. */
static int dump_schedules(const ap_bundle *b, const char *dir, ap_error *err)
{
	char path[4096];
	int n = 0;

	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		return ap_error_set(err, AP_EIO, NULL, NULL, "--dump-schedules: cannot create %s: %s",
				    dir, strerror(errno));
	for (int i = 0; i < ap_bundle_n_launches(b); i++)
		for (int j = 0; j < ap_bundle_launch_n_parts(b, i); j++) {
			ap_bundle_launch_part pt;

			if (ap_bundle_launch_part_get(b, i, j, &pt) < 0 || !pt.layer1[0])
				continue;
			if ((size_t)snprintf(path, sizeof(path), "%s/launch%d_part%d.isl", dir, i, j) >=
			    sizeof(path))
				return ap_error_set(err, AP_EIO, NULL, NULL, "--dump-schedules: path too long");
			if (ap_file_write(path, (const uint8_t *)pt.layer1, strlen(pt.layer1), err) < 0)
				return err->code;
			n++;
		}
	fprintf(stderr, "apollo-client: %d Layer I schedules written to %s\n", n, dir);
	return 0;
}

/* One of the compile options submit and check share, at a (its value v,
 * NULL when it is the last argument): --no-cache, --allow-tf32,
 * --no-layer1, --no-tune, --host-check, --fusion LEVEL, --fusion-barrier
 * NODE, --keep-whole OP, --target T, --namespace NS, into o (barrier and
 * keep-whole names collected in *barriers and *whole, malloc'd arrays of
 * borrowed argv strings).  Returns the arguments it took (1 or 2), 0 when
 * a is not one of them, or minus the exit status after printing the
 * error: -2 a usage error, -1 out of memory. */
static int compile_option(const char *a, const char *v, ap_submit_options *o,
			  const char ***barriers, const char ***whole)
{
	static const struct {
		const char *name;
		size_t at;               /* offset of its bool in ap_submit_options */
	} flags[] = {
		{ "--no-cache", offsetof(ap_submit_options, no_cache) },
		{ "--allow-tf32", offsetof(ap_submit_options, allow_tf32) },
		{ "--no-layer1", offsetof(ap_submit_options, no_layer1) },
		{ "--no-tune", offsetof(ap_submit_options, no_tune) },
		{ "--host-check", offsetof(ap_submit_options, host_check) },
		{ "--tma", offsetof(ap_submit_options, tma) },
		{ "--unvalidated", offsetof(ap_submit_options, unvalidated) },
	};

	for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
		if (!strcmp(a, flags[i].name)) {
			*(bool *)((char *)o + flags[i].at) = true;
			return 1;
		}
	if (!v)
		return 0;
	if (!strcmp(a, "--target"))
		o->target = v;
	else if (!strcmp(a, "--namespace"))
		o->cache_namespace = v;
	else if (!strcmp(a, "--fusion")) {
		if (!parse_fusion(v, &o->fusion))
			return -usage_error("--fusion is none, rules or apollo, not '%s'", v);
	} else if (!strcmp(a, "--fusion-barrier")) {
		if (!strv_push(barriers, &o->n_fusion_barriers, v))
			return -1;
	} else if (!strcmp(a, "--keep-whole")) {
		if (!strv_push(whole, &o->n_keep_whole, v))
			return -1;
	} else {
		return 0;
	}
	return 2;
}

/* What `apollo-client submit` was asked for (beyond the compile options). */
typedef struct submit_args {
	model_args m;
	ap_submit_options opt;
	const char *out, *dump, *dump_sched, *explain_html;
	bool json, daemon_import;
	bool progress;                    /* --progress: stage events on stderr */
	const char **barriers, **whole;   /* malloc'd, of borrowed argv strings */
	ap_report_info info;
} submit_args;

static void submit_args_clear(submit_args *s)
{
	model_args_clear(&s->m);
	free((void *)s->barriers);
	free((void *)s->whole);
	s->barriers = s->whole = NULL;
}

/* submit's arguments into s: 0, or the exit status of a usage error
 * (printed; s cleared). */
static int submit_parse(int argc, char **argv, submit_args *s)
{
	ap_error err;

	s->opt.target = "cpu";
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		int took = compile_option(a, v, &s->opt, &s->barriers, &s->whole);

		if (took < 0) {
			submit_args_clear(s);
			return -took;
		}
		if (took) {
			i += took - 1;
		} else if (!strcmp(a, "--json")) {
			s->json = true;
		} else if (!strcmp(a, "--daemon-import")) {
			s->daemon_import = true;
		} else if (!strcmp(a, "--progress")) {
			s->progress = true;
		} else if (!strcmp(a, "--explain")) {
			s->info.explain = true;
		} else if (!strcmp(a, "--explain-html") && v) {
			s->explain_html = v;
			i++;
		} else if (!strcmp(a, "--format") && v) {
			if (!parse_format(v, &s->opt.output)) {
				submit_args_clear(s);
				return usage_error("--format is ptx, cubin or so, not '%s'", v);
			}
			i++;
		} else if ((!strcmp(a, "-o") || !strcmp(a, "--dump") || !strcmp(a, "--dump-schedules") ||
			    !strcmp(a, "--data")) && v) {
			*(!strcmp(a, "-o") ? &s->out : !strcmp(a, "--dump") ? &s->dump
			  : !strcmp(a, "--data") ? &s->m.data_dir : &s->dump_sched) = v;
			i++;
		} else if (!strcmp(a, "--input") && v) {
			ap_error_clear(&err);
			if (add_input_file(&s->m.b, v, &err) < 0) {
				submit_args_clear(s);
				return fail("submit", &err);
			}
			i++;
		} else if (!strcmp(a, "--shape") && v) {
			ap_error_clear(&err);
			if (add_shape(&s->m.shapes, v, &err) < 0) {
				submit_args_clear(s);
				return fail("submit", &err);
			}
			i++;
		} else if (a[0] == '-' && a[1]) {
			submit_args_clear(s);
			return unknown_option(a);
		} else if (!s->m.model) {
			s->m.model = a;
		} else {
			submit_args_clear(s);
			return usage_error("one model, not '%s' too", a);
		}
	}
	s->opt.fusion_barriers = s->barriers;
	s->opt.keep_whole = s->whole;
	if (!s->m.model) {
		submit_args_clear(s);
		return usage_error("which model?");
	}
	return 0;
}

/* The bundle's outputs: kernels and schedules dumped, the report (text or
 * JSON) on stdout, the packed bundle written to s->out.  0, or 1 after
 * printing the error. */
static int submit_write(const submit_args *s, const ap_bundle *bundle)
{
	ap_error err;
	uint8_t *pk;
	size_t pl;

	ap_error_clear(&err);
	if ((s->dump && dump_kernels(bundle, s->dump, &err) < 0) ||
	    (s->dump_sched && dump_schedules(bundle, s->dump_sched, &err) < 0))
		return fail("submit", &err);
	if (s->json)
		ap_report_json(stdout, bundle, &s->info);
	else
		ap_report_text(stdout, bundle, &s->info);
	if (!s->out)
		return 0;
	if (ap_bundle_pack(bundle, &pk, &pl) < 0) {
		fprintf(stderr, "apollo-client: submit: out of memory\n");
		return 1;
	}
	if (ap_file_write(s->out, pk, pl, &err) < 0) {
		free(pk);
		return fail("submit", &err);
	}
	free(pk);
	if (!s->json)
		printf("bundle written to %s (%zu bytes)\n", s->out, pl);
	return 0;
}

static int cmd_submit(int argc, char **argv)
{
	submit_args s = {0};
	ap_device_info dev;
	const uint8_t *buf = NULL;
	size_t len = 0;
	ap_onnx_io *io = NULL;
	ap_graph *g = NULL;
	ap_client *c = NULL;
	ap_bundle *bundle = NULL;
	ap_progress_line line = { .f = stderr };
	ap_error err;
	bool is_onnx = false;
	double t0;
	int rc = 1;

	ap_error_clear(&err);
	if ((rc = submit_parse(argc, argv, &s)))
		return rc;
	rc = 1;
	s.info.model = s.m.model;
	if (load_model(&s.m, &buf, &len, &io, &is_onnx, &err) < 0) {
		fail("submit", &err);
		goto out;
	}
	if (is_onnx && !s.daemon_import) {
		/* the structure only: a submit never sends the weights */
		g = import_model(buf, len, s.m.model, &s.m.b, NULL, &s.info.import_ms, &err);
		if (!g) {
			fail("submit", &err);
			goto out;
		}
	}
	c = connect_daemon(&err);
	if (!c) {
		fail("submit", &err);
		goto out;
	}
	gpu_device(&s.opt, &dev);
	if (s.progress) {
		line.tty = isatty(fileno(stderr));
		ap_client_set_progress(c, ap_progress_print, &line);
	}
	t0 = ap_now_ms();
	if (g)
		bundle = ap_client_submit_graph(c, g, &s.opt, &err);
	else if (is_onnx)
		bundle = ap_client_submit_onnx(c, buf, len, (const ap_host_tensor *const *)s.m.b.t,
					       s.m.b.n, &s.opt, &err);
	else
		bundle = ap_client_submit_graph_pb(c, buf, len, &s.opt, &err);
	s.info.round_trip_ms = ap_now_ms() - t0;
	ap_progress_done(&line);
	if (!bundle) {
		fail("submit", &err);
		goto out;
	}
	rc = submit_write(&s, bundle);
	if (!rc && s.explain_html && ap_report_html_file(s.explain_html, bundle, s.m.model, &err) < 0)
		rc = fail("submit", &err);
out:
	fflush(stdout);
	ap_bundle_free(bundle);
	ap_client_free(c);
	ap_graph_free(g);
	ap_onnx_io_free(io);
	submit_args_clear(&s);
	ap_file_unmap(buf, len);
	return rc;
}

static int cmd_convert(int argc, char **argv)
{
	model_args m = {0};
	const char *out = NULL;
	const uint8_t *buf = NULL;
	uint8_t *pk = NULL;
	size_t len = 0;
	ap_onnx_io *io = NULL;
	ap_graph *g = NULL;
	struct Apollo__Graph *pb = NULL;
	ap_error err;
	bool is_onnx;
	double ms;
	int rc = 1;

	ap_error_clear(&err);
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--input") && v) {
			if (add_input_file(&m.b, v, &err) < 0) {
				model_args_clear(&m);
				return fail("convert", &err);
			}
			i++;
		} else if (!strcmp(a, "--shape") && v) {
			if (add_shape(&m.shapes, v, &err) < 0) {
				model_args_clear(&m);
				return fail("convert", &err);
			}
			i++;
		} else if (!strcmp(a, "--data") && v) {
			m.data_dir = v;
			i++;
		} else if (a[0] == '-' && a[1]) {
			model_args_clear(&m);
			return unknown_option(a);
		} else if (!m.model) {
			m.model = a;
		} else if (!out) {
			out = a;
		} else {
			model_args_clear(&m);
			return usage_error("convert takes MODEL.onnx GRAPH.pb");
		}
	}
	if (!m.model || !out) {
		model_args_clear(&m);
		return usage_error("convert takes MODEL.onnx GRAPH.pb");
	}
	if (load_model(&m, &buf, &len, &io, &is_onnx, &err) < 0) {
		fail("convert", &err);
		goto out;
	}
	if (!is_onnx) {
		fprintf(stderr, "apollo-client: convert: %s is not an ONNX model\n", m.model);
		goto out;
	}
	g = import_model(buf, len, m.model, &m.b, NULL, &ms, &err);
	if (!g) {
		fail("convert", &err);
		goto out;
	}
	pb = ap_graph_to_pb(g);
	if (!pb) {
		fprintf(stderr, "apollo-client: convert: out of memory\n");
		goto out;
	}
	{
		size_t n = apollo__graph__get_packed_size(pb);
		pk = malloc(n ? n : 1);
		if (!pk) {
			fprintf(stderr, "apollo-client: convert: out of memory\n");
			goto out;
		}
		apollo__graph__pack(pb, pk);
		if (ap_file_write(out, pk, n, &err) < 0) {
			fail("convert", &err);
			goto out;
		}
		printf("%s: %d nodes, %d tensors, %d inputs, %d outputs -> %s (%zu bytes, "
		       "import %.1f ms)\n",
		       m.model, g->n_nodes, g->n_tensors, g->n_inputs, g->n_outputs, out, n, ms);
	}
	rc = 0;
out:
	free(pk);
	if (pb)
		ap_graph_pb_free(pb);
	ap_graph_free(g);
	ap_onnx_io_free(io);
	model_args_clear(&m);
	ap_file_unmap(buf, len);
	return rc;
}

/* ---- run ------------------------------------------------------------------------------ */

/* The options run and `check MODEL.onnx` share, at a (its value v, NULL
 * when a is the last argument): --input NAME=FILE (into inputs), --seed N,
 * --compare onnxruntime (into r).  Returns the arguments it took (2), 0
 * when a is none of them, or minus the exit status after printing the
 * error: -2 a usage error, -1 a file that cannot be read. */
static int run_option(const char *a, const char *v, ap_run_options *r, bindings *inputs)
{
	ap_error err;

	if (!v)
		return 0;
	if (!strcmp(a, "--input")) {
		ap_error_clear(&err);
		if (add_input_file(inputs, v, &err) < 0)
			return -fail(g_cmd, &err);
	} else if (!strcmp(a, "--seed")) {
		if (!parse_seed(v, &r->seed))
			return -usage_error("--seed wants a non-negative integer, not '%s'", v);
	} else if (!strcmp(a, "--compare")) {
		if (strcmp(v, "onnxruntime"))
			return -usage_error("--compare takes onnxruntime (the one reference runtime), "
					    "not '%s'", v);
		r->compare = true;
	} else {
		return 0;
	}
	return 2;
}

/* The daemon's address and the connection's options, from the command line. */
static void run_connection(ap_run_options *r)
{
	r->socket = g_socket;
	r->connect.token = g_token;
	r->connect.daemon_user = g_daemon_user;
}

/* What `apollo-client run` was asked for. */
typedef struct run_args {
	bindings inputs, shapes;          /* --input, --shape */
	ap_submit_options opt;
	ap_run_options r;
	const char **barriers, **whole;   /* malloc'd, of borrowed argv strings */
} run_args;

static void run_args_clear(run_args *a)
{
	bindings_clear(&a->inputs);
	bindings_clear(&a->shapes);
	free((void *)a->barriers);
	free((void *)a->whole);
	a->barriers = a->whole = NULL;
}

/* One option of run's own at a (value v): 2 taken, 0 not one, or minus the
 * exit status after printing the error. */
static int run_own_option(const char *a, const char *v, run_args *ra)
{
	ap_error err;

	if (!v)
		return 0;
	if (!strcmp(a, "--shape")) {
		ap_error_clear(&err);
		if (add_shape(&ra->shapes, v, &err) < 0)
			return -fail("run", &err);
	} else if (!strcmp(a, "--rtol") || !strcmp(a, "--atol")) {
		if (!parse_double(v, !strcmp(a, "--rtol") ? &ra->r.rtol : &ra->r.atol))
			return -usage_error("%s wants a number >= 0, not '%s'", a, v);
	} else if (!strcmp(a, "--threads")) {
		if (!parse_int(v, &ra->r.threads))
			return -usage_error("--threads wants a count, not '%s'", v);
	} else if (!strcmp(a, "--format")) {
		if (!parse_format(v, &ra->opt.output))
			return -usage_error("--format is ptx, cubin or so, not '%s'", v);
	} else if (!strcmp(a, "--save")) {
		ra->r.save_dir = v;
	} else {
		return 0;
	}
	return 2;
}

/* run's arguments into ra: 0, or the exit status of an error (printed;
 * ra cleared). */
static int run_parse(int argc, char **argv, run_args *ra)
{
	ra->opt.target = "cpu";
	ra->r.rtol = ra->r.atol = -1;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int took = compile_option(a, v, &ra->opt, &ra->barriers, &ra->whole);

		if (!took)
			took = run_option(a, v, &ra->r, &ra->inputs);
		if (!took)
			took = run_own_option(a, v, ra);
		if (took < 0) {
			run_args_clear(ra);
			return -took;
		}
		if (took) {
			i += took - 1;
		} else if (a[0] == '-' && a[1]) {
			run_args_clear(ra);
			return unknown_option(a);
		} else if (!ra->r.model) {
			ra->r.model = a;
		} else {
			run_args_clear(ra);
			return usage_error("one model, not '%s' too", a);
		}
	}
	if (!ra->r.model) {
		run_args_clear(ra);
		return usage_error("which model?");
	}
	return 0;
}

/* `apollo-client run`: exit 0 (ran; the outputs matched when compared),
 * 1 (an error, or a mismatch), 2 (usage), 3 (onnxruntime unavailable). */
static int cmd_run(int argc, char **argv)
{
	run_args ra = {0};
	ap_run_result res;
	ap_device_info dev;
	ap_error err;
	int rc;

	if ((rc = run_parse(argc, argv, &ra)))
		return rc;
	ra.opt.fusion_barriers = ra.barriers;
	ra.opt.keep_whole = ra.whole;
	gpu_device(&ra.opt, &dev);
	ra.r.submit = &ra.opt;
	ra.r.inputs = ra.inputs.t;
	ra.r.input_files = ra.inputs.files;
	ra.r.n_inputs = ra.inputs.n;
	ra.r.shapes = ra.shapes.t;
	ra.r.n_shapes = ra.shapes.n;
	run_connection(&ra.r);
	ap_error_clear(&err);
	rc = ap_run_model(&ra.r, &res, &err);
	fflush(stdout);
	if (rc < 0) {
		fail("run", &err);
		rc = res.no_reference ? 3 : 1;
	} else {
		rc = res.mismatched ? 1 : 0;
	}
	run_args_clear(&ra);
	return rc;
}

/* ---- check -------------------------------------------------------------------------- */

typedef struct check_opts {
	ap_submit_options submit;
	double rtol, atol;
	int threads;
	int jobs;
	int timeout_s;     /* per test folder; 0 = none */
	bool no_fork;      /* run in this process (for a debugger) */
	const char *save_dir;  /* --save-outputs: write each folder's inputs and
				  computed outputs as SAVE_DIR/<folder name>/ */
	int repeat;        /* --repeat: runs timed after the checked one */
	double mismatch;   /* --mismatch: fraction of an output's elements that may
			      be outside the tolerance (low-precision graphs) */
	bool profile;      /* --profile: per launch times of those runs */
	bindings shapes;   /* --shape: checked against the data's shapes */
	bindings inputs;   /* --input: a model file's inputs */
	ap_run_options run;  /* a model file: --seed, --compare */
} check_opts;

/* The worst output seen so far in one test folder. */
typedef struct worst {
	double err;
	char where[256];
} worst;

static bool is_transport_error(int code)
{
	return code == AP_EIO || code == AP_EFRAME || code == AP_EMESSAGE;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Runs the plan `n` more times; *median_ms gets the median time of one
 * run (the plan alone: inputs stay bound, outputs are not read). */
static int time_runs(ap_runtime *rt, int n, double *median_ms, ap_error *err)
{
	double *t = calloc((size_t)n, sizeof(double));
	int rc = 0;

	if (!t)
		return ap_error_set(err, AP_ENOMEM, NULL, NULL, "out of memory");
	for (int i = 0; i < n && rc == 0; i++) {
		double t0 = ap_now_ms();

		rc = ap_runtime_run(rt, err);
		t[i] = ap_now_ms() - t0;
	}
	qsort(t, (size_t)n, sizeof(double), cmp_double);
	*median_ms = t[n / 2];
	free(t);
	return rc;
}

/* The launches of the plan by time per run (the timed runs, not the
 * checked first one), with their kernels and nodes; then, where the plan
 * has library launches, how many ran on cuBLASLt and why the others did
 * not ("library: K of N launches on cuBLASLt[; F ran Apollo's kernel: WHY]"). */
static void print_profile(const ap_bundle *b, const ap_runtime *rt, int runs)
{
	int n = ap_bundle_n_launches(b), fallbacks = 0, n_lib;
	double total = 0;
	char why[512];

	for (int i = 0; i < n; i++)
		total += ap_runtime_launch_ms(rt, i);
	printf("profile: %d launches, %.3f ms per run\n", n, total / runs);
	n_lib = ap_runtime_library(rt, &fallbacks, why, sizeof(why));
	if (n_lib > 0 && fallbacks == 0)
		printf("library: %d of %d launches on cuBLASLt\n", n_lib, n_lib);
	else if (n_lib > 0)
		printf("library: %d of %d launches on cuBLASLt; %d ran Apollo's kernel: %s\n",
		       n_lib - fallbacks, n_lib, fallbacks, why[0] ? why : "the library refused them");
	for (int i = 0; i < n; i++) {
		unsigned kern = 0;
		int n_args = 0, n_nodes = 0;
		const uint32_t *args;
		const char *const *nodes = NULL;
		const char *cat = "";
		ap_bundle_kernel kk = {0};
		double ms = ap_runtime_launch_ms(rt, i) / runs;

		ap_bundle_launch(b, i, &kern, &n_args, &args);
		ap_bundle_launch_nodes(b, i, &n_nodes, &nodes, &cat);
		ap_bundle_kernel_get(b, (int)kern, &kk);
		printf("  launch %3d %9.3f ms %5.1f%%  %-32s %-11s %s%s\n", i, ms,
		       total > 0 ? 100 * ms * runs / total : 0, kk.name ? kk.name : "?", cat,
		       n_nodes > 0 ? nodes[n_nodes - 1] : "", n_nodes > 1 ? " ..." : "");
	}
}

/* Compares output k (`got`) with the test set's `want` under o's
 * tolerances (rtol, atol, the mismatch fraction), keeping the largest
 * error seen in w.  0 when it passes; else AP_ESHAPE with `err` naming
 * the output and either why the shapes differ or the first element off,
 * with both values. */
static int compare_output(int k, const ap_host_tensor *got, const ap_host_tensor *want,
			  const check_opts *o, worst *w, ap_error *err)
{
	ap_compare_result r;
	char at[160];
	ap_host_tensor one_g = *got, one_w = *want;
	double vg, vw;
	size_t es = ap_dtype_size(got->dtype);

	ap_compare_tensors(got, want, o->rtol, o->atol, &r);
	if (!r.ok && !r.why[0] && o->mismatch > 0 &&
	    (double)r.n_bad <= o->mismatch * (double)(want->nbytes / ap_dtype_size(want->dtype)))
		r.ok = true;
	if (r.max_at >= 0 && (r.max_abs_err > w->err || !w->where[0])) {
		ap_compare_format_index(want->rank, want->dims, r.max_at, at, sizeof(at));
		w->err = r.max_abs_err;
		snprintf(w->where, sizeof(w->where), "output %d '%s'%s", k, got->name, at);
	}
	if (r.ok)
		return 0;
	if (r.why[0])
		return ap_error_set(err, AP_ESHAPE, NULL, got->name, "output %d '%s': %s", k,
				    got->name, r.why);
	/* Say where the first bad element is, and its values. */
	ap_compare_format_index(want->rank, want->dims, r.first_bad, at, sizeof(at));
	one_g.rank = one_w.rank = 0;
	one_g.nbytes = one_w.nbytes = es;
	one_g.data = (uint8_t *)got->data + (size_t)r.first_bad * es;
	one_w.data = (uint8_t *)want->data + (size_t)r.first_bad * es;
	vg = ap_elem_get(one_g.data, got->dtype, 0);
	vw = ap_elem_get(one_w.data, want->dtype, 0);
	return ap_error_set(err, AP_ESHAPE, NULL, got->name,
			    "output %d '%s': %lld of %lld elements off, first at %s: got %.8g, "
			    "want %.8g", k, got->name, (long long)r.n_bad,
			    (long long)(want->nbytes / (es ? es : 1)), at, vg, vw);
}

/* The outputs of a run (rt) against the test set's want[0..n_want): their
 * count, then each within o's tolerances (the worst kept in w); with
 * save_set each is written there first (the next run checks against it).
 * 0, or AP_ESHAPE / a comparison's or the runtime's error with `err`. */
static int check_outputs(ap_runtime *rt, ap_host_tensor *const *want, int n_want, const check_opts *o,
			 const char *save_set, worst *w, ap_error *err)
{
	int rc = 0;

	if (ap_runtime_n_outputs(rt) != n_want)
		return ap_error_set(err, AP_ESHAPE, NULL, NULL, "the bundle has %d outputs, the test data %d",
				    ap_runtime_n_outputs(rt), n_want);
	for (int k = 0; k < n_want && rc == 0; k++) {
		ap_host_tensor *got = ap_runtime_output(rt, k, err);

		if (!got)
			return err->code;
		if (save_set)
			rc = ap_testdata_save(save_set, "output", k, got, NULL, err);
		if (rc == 0)
			rc = compare_output(k, got, want[k], o, w, err);
		ap_host_tensor_free(got);
	}
	return rc < 0 ? rc : 0;
}

/* Runs one data set of a test folder.  Returns 0 when every output is
 * within tolerance, else a negative code with `msg` saying what. */
static int check_set(ap_client **cp, const char *setdir, const char *model_path,
		     const uint8_t *model, size_t model_len, const ap_onnx_io *io, const check_opts *o, const char *save_set, worst *w,
		     int *n_kernels, unsigned *n_eager, bool *hit, double *run_ms, char *msg, size_t cap)
{
	ap_host_tensor **in = NULL, **want = NULL;
	int n_in = 0, n_want = 0, rc;
	bindings b = {0};
	ap_graph *g = NULL;
	ap_params *params = NULL;
	ap_bundle *bundle = NULL;
	ap_runtime *rt = NULL;
	ap_runtime_options ro = {0};
	ap_bundle_stats st;
	ap_error err;
	double ms;

	ap_error_clear(&err);
	msg[0] = 0;
	if ((rc = ap_testdata_load(setdir, "input", &in, &n_in, &err)) < 0 ||
	    (rc = ap_testdata_load(setdir, "output", &want, &n_want, &err)) < 0)
		goto error;
	for (int k = 0; save_set && k < n_in; k++)
		if ((rc = ap_testdata_save(save_set, "input", k, in[k], NULL, &err)) < 0)
			goto error;
	for (int k = 0; k < n_in; k++) {
		ap_host_tensor *c = ap_host_tensor_copy(in[k], k < io->n_inputs ? io->inputs[k] : NULL);
		if (!c || bindings_add(&b, c, &err) < 0) {
			rc = ap_error_set(&err, AP_ENOMEM, NULL, NULL, "out of memory");
			goto error;
		}
	}
	if ((rc = merge_shapes(&b, &o->shapes, &err)) < 0)
		goto error;
	g = import_model(model, model_len, model_path, &b, &params, &ms, &err);
	if (!g) {
		rc = err.code;
		goto error;
	}
	if (!*cp && !(*cp = connect_daemon(&err))) {
		rc = err.code;
		goto error;
	}
	bundle = ap_client_submit_graph(*cp, g, &o->submit, &err);
	if (!bundle) {
		rc = err.code;
		if (is_transport_error(rc))
			*cp = ap_client_free(*cp);
		error_message(&err, "compile");
		goto error;
	}
	ap_bundle_stats_get(bundle, &st);
	*n_kernels = ap_bundle_n_launches(bundle);
	*n_eager = st.eager_kernels;
	*hit = st.cache_hit;
	ro.threads = o->threads;
	ro.profile = o->profile && o->repeat > 0;
	rt = ap_runtime_new(bundle, &ro, &err);
	if (!rt) {
		rc = err.code;
		error_message(&err, "load");
		goto error;
	}
	if ((rc = ap_run_bind(rt, bundle, g, params, io, in, n_in, &err)) < 0)
		goto error;
	if ((rc = ap_runtime_run(rt, &err)) < 0) {
		error_message(&err, "run");
		goto error;
	}
	/* the timed runs only: the first loaded the kernels and the library */
	ap_runtime_profile_reset(rt);
	if (o->repeat > 0 && (rc = time_runs(rt, o->repeat, run_ms, &err)) < 0) {
		error_message(&err, "run");
		goto error;
	}
	if (ro.profile)
		print_profile(bundle, rt, o->repeat);
	if ((rc = check_outputs(rt, want, n_want, o, save_set, w, &err)) < 0)
		goto error;
	rc = 0;
	goto out;
error:
	snprintf(msg, cap, "%s%s%s%s%s%s", err.msg[0] ? err.msg : ap_error_name(rc),
		 err.node[0] ? " (node '" : "", err.node, err.node[0] ? "')" : "",
		 err.tensor[0] && !strstr(err.msg, err.tensor) ? " tensor " : "",
		 err.tensor[0] && !strstr(err.msg, err.tensor) ? err.tensor : "");
	if (rc >= 0)
		rc = AP_EINTERNAL;
out:
	ap_runtime_free(rt);
	ap_bundle_free(bundle);
	ap_params_free(params);
	ap_graph_free(g);
	bindings_clear(&b);
	ap_host_tensors_free(in, n_in);
	ap_host_tensors_free(want, n_want);
	return rc;
}

static bool check_dir(ap_client **cp, const char *dir_arg, const check_opts *o)
{
	char dir[4096], path[4200], save[4200], msg[1024] = "";
	uint8_t *model = NULL;
	size_t model_len = 0;
	ap_onnx_io *io = NULL;
	char **sets = NULL;
	int n_sets = 0, n_kernels = 0, failed_set = -1;
	unsigned n_eager = 0;
	bool hit = false, ok = false;
	double run_ms = 0;
	worst w = {0};
	ap_error err;
	double t0 = ap_now_ms();
	size_t dl;

	ap_error_clear(&err);
	snprintf(dir, sizeof(dir), "%s", dir_arg);
	dl = strlen(dir);
	while (dl > 1 && dir[dl - 1] == '/')
		dir[--dl] = 0;
	snprintf(path, sizeof(path), "%s/model.onnx", dir);
	if (ap_file_read(path, MAX_MODEL_BYTES, &model, &model_len, &err) < 0 ||
	    ap_onnx_io_read(model, model_len, &io, &err) < 0 ||
	    ap_testdata_sets(dir, &sets, &n_sets, &err) < 0) {
		snprintf(msg, sizeof(msg), "%s", err.msg);
		goto done;
	}
	if (n_sets == 0) {
		snprintf(msg, sizeof(msg), "no test_data_set_* folder");
		goto done;
	}
	if (o->save_dir) {
		const char *base = strrchr(dir, '/');
		if ((size_t)snprintf(save, sizeof(save), "%s/%s", o->save_dir, base ? base + 1 : dir) >=
			    sizeof(save) - 32 ||
		    ap_testdata_save_model(save, path, &err) < 0) {
			snprintf(msg, sizeof(msg), "--save-outputs: %s",
				 err.msg[0] ? err.msg : "path too long");
			goto done;
		}
	}
	for (int s = 0; s < n_sets; s++) {
		char save_set[4400];
		const char *sb = strrchr(sets[s], '/');
		if (o->save_dir)
			snprintf(save_set, sizeof(save_set), "%s/%s", save, sb ? sb + 1 : sets[s]);
		if (check_set(cp, sets[s], path, model, model_len, io, o, o->save_dir ? save_set : NULL, &w,
			      &n_kernels, &n_eager, &hit, &run_ms, msg, sizeof(msg)) < 0) {
			failed_set = s;
			goto done;
		}
	}
	ok = true;
done:
	if (ok) {
		char runs[64] = "";

		if (o->repeat > 0)
			snprintf(runs, sizeof(runs), ", run %.3f ms median of %d", run_ms, o->repeat);
		printf("PASS %s  (%d set%s, %d kernels / %u eager, cache %s, %.0f ms%s) max abs err %.3g%s%s\n",
		       dir, n_sets, n_sets == 1 ? "" : "s", n_kernels, n_eager, hit ? "hit" : "miss",
		       ap_now_ms() - t0, runs, w.err, w.where[0] ? " at " : "", w.where);
	} else {
		const char *sn = failed_set >= 0 ? strrchr(sets[failed_set], '/') : NULL;
		if (w.where[0])
			printf("FAIL %s  %s%s%s  (max abs err %.3g at %s)\n", dir, sn ? sn + 1 : "",
			       sn ? ": " : "", msg, w.err, w.where);
		else
			printf("FAIL %s  %s%s%s\n", dir, sn ? sn + 1 : "", sn ? ": " : "", msg);
	}
	fflush(stdout);
	ap_strv_free(sets, n_sets);
	ap_onnx_io_free(io);
	free(model);
	return ok;
}

/* Each test folder runs in a child process of its own, up to `jobs` at a
 * time, so that a crashing or hanging kernel fails that test only (with
 * the signal, or after `timeout_s`) and the others go on.  Children print
 * their own result line; the exit status says pass (0) or fail. */
typedef struct slot {
	pid_t pid;
	int idx;
	double start;
} slot;

static pid_t spawn_check(const char *dir, const check_opts *o)
{
	pid_t pid;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid == 0) {
		ap_client *c = NULL;
		bool ok = check_dir(&c, dir, o);
		ap_client_free(c);
		fflush(stdout);
		_exit(ok ? 0 : 1);
	}
	return pid;
}

static void print_dir_failure(const char *dir, const char *why)
{
	char d[4096];
	size_t dl;

	snprintf(d, sizeof(d), "%s", dir);
	dl = strlen(d);
	while (dl > 1 && d[dl - 1] == '/')
		d[--dl] = 0;
	printf("FAIL %s  %s\n", d, why);
	fflush(stdout);
}

static void check_all(char **dirs, int n, const check_opts *o, int *pass, int *failed)
{
	slot *slots;
	int next = 0, running = 0;

	if (o->no_fork) {
		ap_client *c = NULL;
		for (int i = 0; i < n; i++) {
			if (check_dir(&c, dirs[i], o))
				(*pass)++;
			else
				(*failed)++;
		}
		ap_client_free(c);
		return;
	}
	slots = calloc((size_t)o->jobs, sizeof(slot));
	if (!slots) {
		*failed += n;
		return;
	}
	while (next < n || running > 0) {
		pid_t pid;
		int st;
		while (running < o->jobs && next < n) {
			int s = 0;
			while (slots[s].pid > 0)
				s++;
			slots[s].pid = spawn_check(dirs[next], o);
			if (slots[s].pid < 0) {
				char why[128];
				slots[s].pid = 0;
				snprintf(why, sizeof(why), "cannot fork: %s", strerror(errno));
				print_dir_failure(dirs[next++], why);
				(*failed)++;
				continue;
			}
			slots[s].idx = next++;
			slots[s].start = ap_now_ms();
			running++;
		}
		if (running == 0)
			break;
		pid = waitpid(-1, &st, WNOHANG);
		if (pid < 0 && errno != EINTR)
			break;
		if (pid <= 0) {
			/* Nothing finished: enforce the time limit, then nap. */
			struct timespec ts = { 0, 5 * 1000 * 1000 };
			for (int s = 0; s < o->jobs && o->timeout_s > 0; s++)
				if (slots[s].pid > 0 &&
				    ap_now_ms() - slots[s].start > o->timeout_s * 1000.0)
					kill(slots[s].pid, SIGKILL);
			nanosleep(&ts, NULL);
			continue;
		}
		for (int s = 0; s < o->jobs; s++) {
			char why[160];
			if (slots[s].pid != pid)
				continue;
			slots[s].pid = 0;
			running--;
			if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
				(*pass)++;
				break;
			}
			(*failed)++;
			if (WIFSIGNALED(st)) {
				if (WTERMSIG(st) == SIGKILL && o->timeout_s > 0 &&
				    ap_now_ms() - slots[s].start > o->timeout_s * 1000.0)
					snprintf(why, sizeof(why), "timed out after %d s", o->timeout_s);
				else
					snprintf(why, sizeof(why), "crashed: %s", strsignal(WTERMSIG(st)));
				print_dir_failure(dirs[slots[s].idx], why);
			} else if (!WIFEXITED(st) || WEXITSTATUS(st) != 1) {
				snprintf(why, sizeof(why), "exited with status %d",
					 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
				print_dir_failure(dirs[slots[s].idx], why);
			}
			break;
		}
	}
	free(slots);
}

/* `check MODEL.onnx`: the model run as `run --compare onnxruntime` runs
 * it, with check's options; prints its report and a PASS or FAIL line.
 * 0 (pass), 1 (fail), 3 (onnxruntime unavailable). */
static int check_model(const char *model, const check_opts *o)
{
	ap_run_options r = o->run;
	ap_run_result res;
	ap_error err;
	double t0 = ap_now_ms();

	r.model = model;
	r.compare = true;
	r.submit = &o->submit;
	r.inputs = o->inputs.t;
	r.input_files = o->inputs.files;
	r.n_inputs = o->inputs.n;
	r.shapes = o->shapes.t;
	r.n_shapes = o->shapes.n;
	r.threads = o->threads;
	r.rtol = o->rtol;   /* < 0 when not given: the dtype's */
	r.atol = o->atol;
	run_connection(&r);
	ap_error_clear(&err);
	if (ap_run_model(&r, &res, &err) < 0) {
		printf("FAIL %s  %s%s%s%s\n", model, err.msg[0] ? err.msg : ap_error_name(err.code),
		       err.tensor[0] && !strstr(err.msg, err.tensor) ? " (tensor '" : "",
		       err.tensor[0] && !strstr(err.msg, err.tensor) ? err.tensor : "",
		       err.tensor[0] && !strstr(err.msg, err.tensor) ? "')" : "");
		fflush(stdout);
		return res.no_reference ? 3 : 1;
	}
	printf("%s %s  (%d output%s against onnxruntime, %d kernels, %.0f ms)\n",
	       res.mismatched ? "FAIL" : "PASS", model, res.compared, res.compared == 1 ? "" : "s",
	       res.launches, ap_now_ms() - t0);
	fflush(stdout);
	return res.mismatched ? 1 : 0;
}

/* Runs each model file of paths[0..n) (check_model); the others, test
 * folders, are moved to the front of paths, their count in *n_dirs.
 * The worst outcome: 0, 1, or 3. */
static int check_models(char **paths, int n, int *n_dirs, const check_opts *o, int *pass,
			int *failed)
{
	int worst = 0;

	*n_dirs = 0;
	for (int i = 0; i < n; i++) {
		struct stat st;
		int r;

		if (stat(paths[i], &st) < 0 || !S_ISREG(st.st_mode)) {
			paths[(*n_dirs)++] = paths[i];
			continue;
		}
		r = check_model(paths[i], o);
		*pass += r == 0;
		*failed += r != 0;
		worst = r > worst ? r : worst;
	}
	return worst;
}

/* One of check's own options at a (its value v, NULL when it is the last
 * argument), into o: 1 or 2 arguments taken, 0 when a is none of them, or
 * minus the exit status after printing the error. */
static int check_option(const char *a, const char *v, check_opts *o)
{
	ap_error err;
	char *end;
	long t;

	if (!strcmp(a, "--no-fork") || !strcmp(a, "--profile")) {
		*(!strcmp(a, "--no-fork") ? &o->no_fork : &o->profile) = true;
		return 1;
	}
	if (!v)
		return 0;
	if (!strcmp(a, "--rtol") || !strcmp(a, "--atol")) {
		if (!parse_double(v, !strcmp(a, "--rtol") ? &o->rtol : &o->atol))
			return -usage_error("%s wants a number >= 0, not '%s'", a, v);
	} else if (!strcmp(a, "--jobs") || !strcmp(a, "-j")) {
		if (!parse_int(v, &o->jobs) || o->jobs < 1)
			return -usage_error("--jobs wants a count >= 1, not '%s'", v);
	} else if (!strcmp(a, "--threads")) {
		if (!parse_int(v, &o->threads))
			return -usage_error("--threads wants a count, not '%s'", v);
	} else if (!strcmp(a, "--timeout")) {
		t = strtol(v, &end, 10);
		if (!*v || *end || t < 0 || t > 86400)
			return -usage_error("--timeout wants seconds (0 = none), not '%s'", v);
		o->timeout_s = (int)t;
	} else if (!strcmp(a, "--save-outputs")) {
		o->save_dir = v;
	} else if (!strcmp(a, "--shape")) {
		ap_error_clear(&err);
		if (add_shape(&o->shapes, v, &err) < 0)
			return -fail("check", &err);
	} else if (!strcmp(a, "--mismatch")) {
		if (!parse_double(v, &o->mismatch) || o->mismatch > 1)
			return -usage_error("--mismatch wants a fraction in [0, 1], not '%s'", v);
	} else if (!strcmp(a, "--repeat")) {
		if (!parse_int(v, &o->repeat) || o->repeat < 1)
			return -usage_error("--repeat wants a count >= 1, not '%s'", v);
	} else {
		return 0;
	}
	return 2;
}

static int cmd_check(int argc, char **argv)
{
	check_opts o = {0};
	char **dirs = calloc((size_t)argc + 1, sizeof(char *));
	const char **barriers = NULL, **whole = NULL;
	ap_device_info dev;
	int n = 0, pass = 0, failed = 0, rc = 1, worst;

	if (!dirs)
		return 1;
	o.submit.target = "cpu";
	o.rtol = o.atol = -1;   /* given, or the defaults of folders / of a model's dtypes */
	o.jobs = 1;
	o.timeout_s = 900;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int took = compile_option(a, v, &o.submit, &barriers, &whole);

		if (!took)
			took = run_option(a, v, &o.run, &o.inputs);
		if (!took)
			took = check_option(a, v, &o);
		if (took < 0) {
			rc = -took;
			goto out;
		}
		if (took) {
			i += took - 1;
		} else if (a[0] == '-' && a[1]) {
			rc = unknown_option(a);
			goto out;
		} else {
			dirs[n++] = argv[i];
		}
	}
	o.submit.fusion_barriers = barriers;
	o.submit.keep_whole = whole;
	if (n == 0) {
		rc = usage_error("which test folders or model?");
		goto out;
	}
	if (o.save_dir && mkdir(o.save_dir, 0777) < 0 && errno != EEXIST) {
		fprintf(stderr, "apollo-client: check: cannot create %s: %s\n", o.save_dir,
			strerror(errno));
		goto out;
	}
	gpu_device(&o.submit, &dev);
	worst = check_models(dirs, n, &n, &o, &pass, &failed);
	if (pass + failed == 0 && (o.inputs.n || o.run.compare)) {
		rc = usage_error("--input and --compare are for a model file (check MODEL.onnx), "
				 "not a test folder");
		goto out;
	}
	o.rtol = o.rtol < 0 ? AP_COMPARE_RTOL : o.rtol;
	o.atol = o.atol < 0 ? AP_COMPARE_ATOL : o.atol;
	check_all(dirs, n, &o, &pass, &failed);
	printf("%d passed, %d failed\n", pass, failed);
	rc = worst == 3 ? 3 : failed ? 1 : 0;
out:
	bindings_clear(&o.shapes);
	bindings_clear(&o.inputs);
	free((void *)barriers);
	free((void *)whole);
	free(dirs);
	return rc;
}

/* ---- tune ----------------------------------------------------------------------------- */

/* One candidate timed by `tune`: a tuned kernel's signature and schedule. */
typedef struct tune_row {
	ap_tune_measurement m;
	char *schedule;          /* owned (m.schedule points here) */
	char emitter[32];
	char node[96];           /* its last imported node, for people */
} tune_row;

typedef struct tune_rows {
	tune_row *r;
	int n, cap;
} tune_rows;

static void tune_rows_clear(tune_rows *t)
{
	for (int i = 0; i < t->n; i++)
		free(t->r[i].schedule);
	free(t->r);
	memset(t, 0, sizeof(*t));
}

/* Adds a timing of (signature, schedule), keeping the smaller of two
 * medians of the same candidate (timed in two variants). */
static int tune_rows_add(tune_rows *t, const ap_bundle_launch_part *pt, double us, unsigned runs)
{
	tune_row *r;

	for (int i = 0; i < t->n; i++)
		if (!memcmp(t->r[i].m.signature, pt->tune_signature, 32) &&
		    !strcmp(t->r[i].schedule, pt->schedule)) {
			if (us < t->r[i].m.time_us)
				t->r[i].m.time_us = us;
			return 0;
		}
	if (t->n == t->cap) {
		int cap = t->cap ? 2 * t->cap : 16;
		tune_row *nr = realloc(t->r, (size_t)cap * sizeof(*nr));
		if (!nr)
			return AP_ENOMEM;
		t->r = nr;
		t->cap = cap;
	}
	r = &t->r[t->n];
	memset(r, 0, sizeof(*r));
	if (!(r->schedule = strdup(pt->schedule)))
		return AP_ENOMEM;
	memcpy(r->m.signature, pt->tune_signature, 32);
	r->m.schedule = r->schedule;
	r->m.time_us = us;
	r->m.runs = runs;
	snprintf(r->emitter, sizeof(r->emitter), "%s", pt->emitter);
	snprintf(r->node, sizeof(r->node), "%s", pt->n_nodes ? pt->nodes[pt->n_nodes - 1] : "");
	t->n++;
	return 0;
}

typedef struct tune_opts {
	ap_submit_options submit;
	int runs, warmup, device;
	const char **barriers, **whole;   /* malloc'd, of borrowed argv strings */
} tune_opts;

/* ap_runtime_timing_fn of tune: one row per timed candidate. */
static int tune_row_timed(void *user, const ap_bundle_launch_part *pt, double us, unsigned runs)
{
	return tune_rows_add(user, pt, us, runs);
}

/* Rows grouped by kernel (in the order kernels were first timed), each
 * kernel's fastest first. */
static int cmp_tune_row(const void *a, const void *b, void *arg)
{
	const tune_row *x = a, *y = b;
	const tune_rows *rows = arg;
	int fx = 0, fy = 0;

	while (memcmp(rows->r[fx].m.signature, x->m.signature, 32))
		fx++;
	while (memcmp(rows->r[fy].m.signature, y->m.signature, 32))
		fy++;
	if (fx != fy)
		return fx < fy ? -1 : 1;
	return (x->m.time_us > y->m.time_us) - (x->m.time_us < y->m.time_us);
}

static void tune_print(tune_rows *rows, const char *device, unsigned sms)
{
	tune_rows copy = *rows;

	/* sorted on a copy: the comparison reads the first-seen order */
	copy.r = malloc((size_t)(unsigned)rows->n * sizeof(tune_row) + 1);
	if (copy.r) {
		memcpy(copy.r, rows->r, (size_t)(unsigned)rows->n * sizeof(tune_row));
		qsort_r(rows->r, (size_t)rows->n, sizeof(tune_row), cmp_tune_row, &copy);
		free(copy.r);
	}
	printf("device: %s (%u SMs)\n", device, sms);
	printf("  %-16s %-10s %10s  %-24s %s\n", "kernel", "emitter", "us", "node", "schedule");
	for (int i = 0; i < rows->n; i++) {
		const tune_row *r = &rows->r[i];
		/* sorted: a kernel's first row is its fastest */
		bool fastest = i == 0 || memcmp(rows->r[i - 1].m.signature, r->m.signature, 32);
		char hex[17];

		ap_hex(r->m.signature, 8, hex);
		printf("%c %-16s %-10s %10.3f  %-24.24s %s\n", fastest ? '*' : ' ', hex, r->emitter,
		       r->m.time_us, r->node, r->schedule);
	}
}

/* tune's arguments into m, o and *dry: 0, or the exit status of a usage
 * error (printed; m cleared; o's lists are the caller's to free). */
static int tune_parse(int argc, char **argv, model_args *m, tune_opts *o, bool *dry)
{
	ap_error err;

	ap_error_clear(&err);
	o->submit.target = "sm_90";
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int took = compile_option(a, v, &o->submit, &o->barriers, &o->whole);   /* --target too */

		if (took < 0) {
			model_args_clear(m);
			return -took;
		}
		if (took) {
			i += took - 1;
		} else if (!strcmp(a, "--format") && v) {
			if (strcmp(v, "ptx") && strcmp(v, "cubin")) {
				model_args_clear(m);
				return usage_error("--format is ptx or cubin, not '%s'", v);
			}
			o->submit.output = !strcmp(v, "ptx") ? AP_OUTPUT_PTX : AP_OUTPUT_CUBIN;
			i++;
		} else if ((!strcmp(a, "--runs") || !strcmp(a, "--warmup") || !strcmp(a, "--device")) &&
			   v) {
			int *dst = !strcmp(a, "--runs") ? &o->runs : !strcmp(a, "--warmup") ? &o->warmup
											 : &o->device;
			if (!parse_int(v, dst) || *dst < (dst == &o->runs) || *dst > 100000) {
				model_args_clear(m);
				return usage_error("%s wants a count, not '%s'", a, v);
			}
			i++;
		} else if (!strcmp(a, "--dry-run")) {
			*dry = true;
		} else if (!strcmp(a, "--data") && v) {
			m->data_dir = v;
			i++;
		} else if (!strcmp(a, "--input") && v) {
			if (add_input_file(&m->b, v, &err) < 0) {
				model_args_clear(m);
				return fail("tune", &err);
			}
			i++;
		} else if (!strcmp(a, "--shape") && v) {
			if (add_shape(&m->shapes, v, &err) < 0) {
				model_args_clear(m);
				return fail("tune", &err);
			}
			i++;
		} else if (a[0] == '-' && a[1]) {
			model_args_clear(m);
			return unknown_option(a);
		} else if (!m->model) {
			m->model = a;
		} else {
			model_args_clear(m);
			return usage_error("one model, not '%s' too", a);
		}
	}
	if (!m->model) {
		model_args_clear(m);
		return usage_error("which model?");
	}
	if (o->submit.no_tune || o->submit.host_check) {
		model_args_clear(m);
		return usage_error("%s: tune measures the tuned kernels of a GPU target",
				   o->submit.no_tune ? "--no-tune leaves none" : "--host-check is the host's");
	}
	o->submit.fusion_barriers = o->barriers;
	o->submit.keep_whole = o->whole;
	return 0;
}

/* Sends the timed candidates of `rows` to the daemon as one tune report
 * for `target` on `device` (sms SMs) and prints how many measured records
 * it stored.  0, or 1 with the error printed. */
static int tune_send(ap_client *c, const tune_rows *rows, const char *target, const char *device,
		     unsigned sms)
{
	ap_tune_measurement *ms = calloc((size_t)(unsigned)rows->n + 1, sizeof(*ms));
	unsigned records = 0;
	ap_error err;
	int rc;

	ap_error_clear(&err);
	if (!ms) {
		fprintf(stderr, "apollo-client: tune: out of memory\n");
		return 1;
	}
	for (int i = 0; i < rows->n; i++)
		ms[i] = rows->r[i].m;
	rc = ap_client_tune_report(c, target, device, sms, ms, rows->n, &records, &err);
	free(ms);
	if (rc < 0) {
		fail("tune: report", &err);
		return 1;
	}
	printf("%d measurements sent: %u measured records stored for %s on %s (a record "
	       "needs the measurements of two clients, or of the daemon's own tuner)\n",
	       rows->n, records, target, device);
	return 0;
}

static int cmd_tune(int argc, char **argv)
{
	model_args m = {0};
	tune_opts o = { .runs = 20, .warmup = 3 };
	const uint8_t *buf = NULL;
	size_t len = 0;
	ap_onnx_io *io = NULL;
	ap_graph *g = NULL;
	ap_client *c = NULL;
	tune_rows rows = {0};
	ap_device_info dev;
	char device[128] = "";
	unsigned sms = 0;
	bool is_onnx = false, dry = false;
	ap_error err;
	double ms;
	int rc = 1;

	ap_error_clear(&err);
	if ((rc = tune_parse(argc, argv, &m, &o, &dry)) == 0 && !strcmp(o.submit.target, "cpu"))
		rc = usage_error("the host target is tuned by the cost model alone; give a GPU "
				 "target (--target sm_90)");
	if (rc)
		goto out;
	rc = 1;
	if (load_model(&m, &buf, &len, &io, &is_onnx, &err) < 0) {
		fail("tune", &err);
		goto out;
	}
	if (is_onnx && !(g = import_model(buf, len, m.model, &m.b, NULL, &ms, &err))) {
		fail("tune", &err);
		goto out;
	}
	if (!(c = connect_daemon(&err))) {
		fail("tune", &err);
		goto out;
	}
	/* the device the candidates will run on, named in every request (a
	 * report may only name a device its client compiled for) */
	if (ap_device_probe(o.device, &dev, &err) < 0) {
		fail("tune: device", &err);
		goto out;
	}
	o.submit.device = &dev;
	/* one bundle per candidate rank: every tuned kernel on its i-th candidate */
	for (unsigned v = 1; v <= AP_TUNE_CANDIDATES; v++) {
		ap_bundle *bundle;
		int r;

		o.submit.tune_variant = v;
		bundle = g ? ap_client_submit_graph(c, g, &o.submit, &err)
			   : ap_client_submit_graph_pb(c, buf, len, &o.submit, &err);
		if (!bundle) {
			fail("tune: compile", &err);
			goto out;
		}
		r = ap_runtime_time_tuned(bundle, g, o.device, o.warmup, o.runs,
					  device[0] ? NULL : device, sizeof(device), &sms, tune_row_timed,
					  &rows, &err);
		ap_bundle_free(bundle);
		if (r < 0) {
			fail("tune: run", &err);
			goto out;
		}
	}
	if (rows.n == 0) {
		printf("no tuned kernel runs in a launch of its own: nothing to measure\n");
		rc = 0;
		goto out;
	}
	tune_print(&rows, device, sms);
	rc = dry ? 0 : tune_send(c, &rows, o.submit.target, device, sms);
out:
	fflush(stdout);
	tune_rows_clear(&rows);
	ap_client_free(c);
	ap_graph_free(g);
	ap_onnx_io_free(io);
	model_args_clear(&m);
	ap_file_unmap(buf, len);
	free((void *)o.barriers);
	free((void *)o.whole);
	return rc;
}

/* ---- ping / stats ----------------------------------------------------------------------- */

static int cmd_ping(int argc, char **argv)
{
	ap_client *c;
	ap_error err;
	char server[128];
	double t0;

	if (argc > 0)
		return argv[0][0] == '-' ? unknown_option(argv[0]) : usage_error("no arguments");
	ap_error_clear(&err);
	t0 = ap_now_ms();
	c = connect_daemon(&err);
	if (!c)
		return fail("ping", &err);
	if (ap_client_ping(c, server, sizeof(server), &err) < 0) {
		ap_client_free(c);
		return fail("ping", &err);
	}
	printf("pong from %s in %.2f ms; NVRTC %s; targets:", server[0] ? server : ap_client_server(c),
	       ap_now_ms() - t0, ap_client_nvrtc_version(c)[0] ? ap_client_nvrtc_version(c) : "none");
	for (int i = 0; i < ap_client_n_targets(c); i++)
		printf(" %s", ap_client_target(c, i));
	printf("\n");
	ap_client_free(c);
	return 0;
}

static int cmd_stats(int argc, char **argv)
{
	ap_client *c;
	ap_server_stats s;
	ap_metrics *m = NULL;
	ap_error err;
	bool json = false;
	double v;

	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = true;
		else
			return unknown_option(argv[i]);
	}
	ap_error_clear(&err);
	c = connect_daemon(&err);
	if (!c)
		return fail("stats", &err);
	if (ap_client_stats_metrics(c, &s, &m, &err) < 0) {
		ap_client_free(c);
		return fail("stats", &err);
	}
	if (json) {
		ap_report_stats_json(stdout, ap_client_server(c), &s, m);
		ap_metrics_free(m);
		ap_client_free(c);
		return 0;
	}
	printf("server:           %s\n", ap_client_server(c));
	printf("uptime_s:         %.1f\n", s.uptime_s);
	printf("requests:         %llu\n", (unsigned long long)s.requests);
	printf("errors:           %llu\n", (unsigned long long)s.errors);
	printf("cache_hits:       %llu\n", (unsigned long long)s.cache_hits);
	printf("cache_misses:     %llu\n", (unsigned long long)s.cache_misses);
	printf("kernels_compiled: %llu\n", (unsigned long long)s.kernels_compiled);
	printf("cache_entries:    %llu\n", (unsigned long long)s.cache_entries);
	printf("cache_blob_bytes: %llu\n", (unsigned long long)s.cache_blob_bytes);
	printf("clients:          %u\n", s.clients);
	printf("in_flight:        %u\n", s.in_flight);
	{
		static const char *const tiers[] = { "compiled", "l1", "l2", "shared" };

		printf("answers:         ");
		for (int t = 0; t < 4; t++) {
			char l[32];

			snprintf(l, sizeof(l), "tier=%s", tiers[t]);
			if (!ap_metrics_value(m, "apollo_compile_answers_total", l, &v))
				printf(" %s %.0f", tiers[t], v);
		}
		printf("\n");
	}
	if (!ap_metrics_value(m, "apollo_redis_circuit_state", NULL, &v))
		printf("redis breaker:    %s\n", v == 0 ? "closed" : v == 1 ? "open" : "half-open");
	{
		double rec = 0, meas = 0, srch = 0, tried = 0, secs = 0, reps = 0, nm = 0, mrec = 0,
		       held = 0;

		if (!ap_metrics_value(m, "apollo_tuning_kernels_total", "source=record", &rec) &&
		    !ap_metrics_value(m, "apollo_tuning_kernels_total", "source=measured", &meas) &&
		    !ap_metrics_value(m, "apollo_tuning_kernels_total", "source=searched", &srch) &&
		    !ap_metrics_value(m, "apollo_tuning_configurations_total", NULL, &tried) &&
		    !ap_metrics_value(m, "apollo_tuning_seconds_total", NULL, &secs) &&
		    !ap_metrics_value(m, "apollo_tuning_reports_total", NULL, &reps) &&
		    !ap_metrics_value(m, "apollo_tuning_measurements_total", NULL, &nm) &&
		    !ap_metrics_value(m, "apollo_tuning_measured_records_total", NULL, &mrec) &&
		    !ap_metrics_value(m, "apollo_cache_entries", "kind=tuning", &held))
			printf("tuning:           hits %.0f (measured %.0f), searched %.0f (%.0f "
			       "configurations, %.1f ms); reports %.0f (%.0f measurements, %.0f "
			       "records); %.0f records held\n",
			       rec + meas, meas, srch, tried, secs * 1e3, reps, nm, mrec, held);
	}
	{
		static const char *const ev[] = { "job", "compiled", "refined", "moved", "timed",
						  "measured", "dropped", "failed" };
		double v8[8];
		int i = 0;

		for (; i < 8; i++) {
			char l[32];

			snprintf(l, sizeof(l), "event=%s", ev[i]);
			if (ap_metrics_value(m, "apollo_tuning_background_total", l, &v8[i]))
				break;
		}
		if (i == 8)
			printf("background tuner: %.0f requests, %.0f candidates compiled, %.0f records "
			       "refined (%.0f moved), %.0f candidates timed, %.0f measured records; "
			       "%.0f dropped, %.0f failed\n",
			       v8[0], v8[1], v8[2], v8[3], v8[4], v8[5], v8[6], v8[7]);
	}
	printf("(every metric: apollo-client stats --json)\n");
	ap_metrics_free(m);
	ap_client_free(c);
	return 0;
}

int main(int argc, char **argv)
{
	char **rest;
	int n = 0;
	const char *cmd = NULL;

	rest = calloc((size_t)argc + 1, sizeof(char *));
	if (!rest)
		return 1;
	g_token = getenv("APOLLO_TOKEN");
	/* --socket PATH anywhere; the first other word is the subcommand. */
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--socket")) {
			if (i + 1 >= argc) {
				free(rest);
				return usage_error("--socket wants a path");
			}
			g_socket = argv[++i];
		} else if (!strncmp(argv[i], "--socket=", 9)) {
			g_socket = argv[i] + 9;
		} else if (!strcmp(argv[i], "--token")) {
			if (i + 1 >= argc) {
				free(rest);
				return usage_error("--token wants a value");
			}
			/* the command line is world-readable: keep a copy, scrub it */
			snprintf(g_token_buf, sizeof(g_token_buf), "%s", argv[++i]);
			memset(argv[i], '*', strlen(argv[i]));
			g_token = g_token_buf;
			fprintf(stderr, "apollo-client: warning: --token is visible to other local "
				"users; use --token-file FILE or $APOLLO_TOKEN\n");
		} else if (!strcmp(argv[i], "--driver-version")) {
			if (i + 1 >= argc || !(g_driver = parse_driver(argv[i + 1]))) {
				free(rest);
				return usage_error("--driver-version wants the CUDA version the driver "
						   "supports, e.g. 12.4");
			}
			i++;
		} else if (!strcmp(argv[i], "--token-file")) {
			ap_error e;

			if (i + 1 >= argc) {
				free(rest);
				return usage_error("--token-file wants a path");
			}
			if (read_token_file(argv[++i], &e)) {
				free(rest);
				return fail("token file", &e);
			}
			g_token = g_token_buf;
		} else if (!strcmp(argv[i], "--daemon-user")) {
			if (i + 1 >= argc) {
				free(rest);
				return usage_error("--daemon-user wants a user name or uid");
			}
			g_daemon_user = argv[++i];
		} else if (!cmd && (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))) {
			usage(stdout);
			free(rest);
			return 0;
		} else if (!cmd) {
			cmd = argv[i];
		} else {
			rest[n++] = argv[i];
		}
	}
	{
		int rc;
		char near[64];

		g_cmd = help_of(cmd) ? cmd : NULL;
		for (int i = 0; g_cmd && i < n; i++)
			if (!strcmp(rest[i], "--help") || !strcmp(rest[i], "-h")) {
				free(rest);
				return subcommand_usage(help_of(cmd));
			}
		if (!cmd)
			rc = usage_error("which subcommand? (submit, run, check, convert, tune, ping, stats)");
		else if (!strcmp(cmd, "submit"))
			rc = cmd_submit(n, rest);
		else if (!strcmp(cmd, "run"))
			rc = cmd_run(n, rest);
		else if (!strcmp(cmd, "check"))
			rc = cmd_check(n, rest);
		else if (!strcmp(cmd, "convert"))
			rc = cmd_convert(n, rest);
		else if (!strcmp(cmd, "ping"))
			rc = cmd_ping(n, rest);
		else if (!strcmp(cmd, "stats"))
			rc = cmd_stats(n, rest);
		else if (!strcmp(cmd, "tune"))
			rc = cmd_tune(n, rest);
		else if (nearest(cmd, "submit run check convert tune ping stats", "", near, sizeof(near)))
			rc = usage_error("unknown subcommand '%s' (did you mean %s?)", cmd, near);
		else
			rc = usage_error("unknown subcommand '%s' (submit, run, check, convert, tune, ping, stats)",
					 cmd);
		free(rest);
		return rc;
	}
}
